//! Component tests of the ha crate: grants and Cilium's repoint against the API double, etcd
//! membership against real etcd members, the front against real HAProxy, repoint against
//! live TLS servers.

mod downgrade;
mod etcd;
mod etcd_harness;
mod front;
mod grants;
mod learner;
mod maintenance;
mod mint;
mod repoint;
mod snapshot;
mod tls_backends;
