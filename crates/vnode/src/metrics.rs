//! Counters of what the runners did. Plain atomics here; the binary exports them on its
//! admin listener.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// What one manager did, across its providers.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Instances provisioned (a provision call that answered an instance).
    pub provisions: AtomicU64,
    /// Instances terminated.
    pub terminations: AtomicU64,
    /// Pods re-adopted from the provider's list after a restart or failover.
    pub readoptions: AtomicU64,
    /// Provider calls that failed (refusals, unreachable, failures).
    pub provider_errors: AtomicU64,
    /// Pods placed on a provider (gate removed).
    pub placements: AtomicU64,
    /// Pod status writes (the steady-state goal is none).
    pub status_writes: AtomicU64,
    /// Pod metadata writes (instance id, endpoint).
    pub metadata_writes: AtomicU64,
    /// Pods tracked by phase: Pending, Running, Succeeded, Failed.
    pub pods_pending: AtomicI64,
    /// See [`Metrics::pods_pending`].
    pub pods_running: AtomicI64,
    /// See [`Metrics::pods_pending`].
    pub pods_succeeded: AtomicI64,
    /// See [`Metrics::pods_pending`].
    pub pods_failed: AtomicI64,
    /// Number of provider runners currently holding their lease (leading).
    pub leases_held: AtomicI64,
}

impl Metrics {
    pub(crate) fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
