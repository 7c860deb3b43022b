//! The pure core of `ha`: the decisions and formats that need no API server, etcd member or
//! async runtime, in a crate whose dependency tree holds none of kube, etcd-client or tokio.
//!
//! - [`grants::envelope`]: the sealed grant envelope and the certificate-key.
//! - [`grants::plan`]: which grant entries a Secret keeps, its size budget, its owners.
//! - [`etcd::rules`]: the classifier of etcd failures and the membership and health rules.
//! - [`tokens::TokenState`]: what a bootstrap token Secret's state is judged to be.
//! - [`fence`]: the maintenance fence Lease: who holds it, take, renew, release.
//! - [`rejoin`]: the rejoin journal, the steps a (re-)run still has to do, the old-cluster
//!   quorum verdict.
//! - [`front`]: the per-node HAProxy configuration and the kube-vip static pod.
//! - [`repoint`]: a kubeconfig's server rewritten with every other byte kept.
//! - [`etcd::downgrade`]: whether a cluster can be downgraded (etcd 3.5+, one minor down).
//!
//! `ha` re-exports each at its old path (`ha::grants::envelope`, `ha::grants::plan`,
//! `ha::etcd::rules`, `ha::tokens::TokenState`), so callers keep using those; the fuzz
//! targets and anything that must build without the I/O stack use this crate directly.
//! The split and its check (`cargo xtask ci`) are described in `docs/architecture.md`.

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

/// Encrypted shared-cert grants: the pure parts (`ha::grants` is the I/O layer).
pub mod grants {
    pub mod envelope;
    pub mod plan;
}

/// etcd membership and health: the pure rules (`ha::etcd` talks to the members).
pub mod etcd {
    pub mod downgrade;
    pub mod rules;
}

pub mod fence;
pub mod front;
pub mod rejoin;
pub mod repoint;

pub mod tokens;
