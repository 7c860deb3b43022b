//! hostnode component tests: real mounts in a private mount namespace, a real dnsmasq in
//! a network namespace, snapshots and resets on a real filesystem. They need root; run
//! without it they fail and say so.

mod lifecycle;
mod localdns;
mod mounts;
mod reset;
mod snapshot;
mod support;
