//! The leaf crate: what several crates share and none of them owns.
//!
//! It depends on no I/O framework (no kube, no tokio, no etcd client), so pure cores,
//! fuzz targets and their tests can use it without building the I/O stack.
//!
//! - [`keys`]: every label, annotation, taint, scheduling gate and well-known object name
//!   the project writes into Kubernetes objects, under the one domain `outpost.dhnt.io/`.
//! - [`token`]: the bootstrap-token format, one type for every crate that parses tokens.
//! - [`fsutil`]: the one atomic file writer (unique temporary, `O_NOFOLLOW`, mode set at
//!   creation, fsync of the file and its directory).
//! - [`lockfile`]: the lock file that names its holder (`flock`, `O_NOFOLLOW`), behind
//!   the node command lock and the control plane's maintenance and etcd data locks.
//! - [`errors`]: the error-chain formatter for errors whose `Display` leaves the source out.

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
pub mod errors;
pub mod fsutil;
pub mod keys;
pub mod lockfile;
pub mod token;

pub use errors::error_chain;
