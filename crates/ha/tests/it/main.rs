//! Component tests of the ha crate: grants against the API double, etcd membership against
//! real etcd members.

mod etcd;
mod etcd_harness;
mod grants;
mod learner;
mod maintenance;
mod mint;
mod snapshot;
