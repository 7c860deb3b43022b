//! The leaf crate: what several crates share and none of them owns.
//!
//! It depends on no I/O framework (no kube, no tokio, no etcd client), so pure cores,
//! fuzz targets and their tests can use it without building the I/O stack.
//!
//! - [`keys`]: every label, annotation, taint, scheduling gate and well-known object name
//!   the project writes into Kubernetes objects, under the one domain `outpost.dhnt.io/`.

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
pub mod keys;
