//! Grows a control plane from one controller to several without risking etcd quorum or
//! leaking the cluster's CA keys.
//!
//! Part 1 (library): [`tokens`], [`grants`], [`etcd`] membership and health, the
//! [`journal`], [`mint`] (`token create`'s protocol). Part 2 (the commands that use it): [`discovery`] (pinned token
//! discovery), [`assembly`] (the shared node steps in their pinned order), [`join`]
//! (a control plane joining as an etcd learner), [`node`] (`up`: bootstrap or start, then
//! supervise), [`supervisor`] (children with restart backoff), [`bootstrap`] (the objects
//! the first controller publishes), [`nodestate`] (what a node persists) and
//! [`operator`] (grant pruning and certificate-key age). Part 3 (maintenance): the node
//! [`maintenance`] locks, the cluster's maintenance [`fence`], [`snapshot`] save and restore,
//! [`rejoin`] of a restored cluster, and the shared-cert [`rekey`]; [`front`] (the per-node
//! HAProxy over every API server, checked with `haproxy -c` before it replaces a running
//! one, reloaded under the supervisor; the kube-vip static pod), [`repoint`] (a node's
//! kubeconfigs and Cilium moved onto the VIP once it provably serves this cluster), and
//! [`etcd::downgrade_cluster`]. Design: `docs/front.md`.

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
pub mod admins;
pub mod assembly;
pub mod bootstrap;
pub mod discovery;
pub mod etcd;
pub mod fence;
pub mod front;
pub mod grants;
pub mod join;
pub mod journal;
pub mod maintenance;
pub mod mint;
pub mod node;
pub mod nodestate;
pub mod operator;
pub mod rejoin;
pub mod rekey;
pub mod repoint;
pub mod snapshot;
pub mod supervisor;
pub mod tokens;

/// An error and its causes, `: `-joined (a cause whose text the message already holds is
/// not repeated), for logs and reports that print one line.
pub use common::error_chain;
