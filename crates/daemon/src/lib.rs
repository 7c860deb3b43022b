//! What every long-running command of the project shares, so each daemon behaves the same
//! way for an operator:
//!
//! - [`lease`]: leader election on a `coordination.k8s.io/v1` Lease with resourceVersion
//!   preconditions, so only one replica of a controller writes at a time, and a holder that
//!   cannot renew stops writing before a standby may take over;
//! - [`admin`]: the admin listener, kept apart from the probe listener, serving `/metrics`
//!   (Prometheus text from a `prometheus-client` registry) and, where a daemon has one, a
//!   JSON `/status` snapshot.
//!
//! kubert's `lease` and `admin` modules are the model; kubert itself is pinned to an older
//! kube, and its lease uses server-side apply, which the project does not rely on.

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
pub mod admin;
pub mod lease;

pub use admin::{AdminServer, StatusFn};
pub use lease::{LeaderElection, LeaderHandle, LeaseConfig, LeaseStatus, default_identity};
