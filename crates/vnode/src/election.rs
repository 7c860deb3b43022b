//! Running a provider's runner only while leading.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::error;

use crate::metrics::Metrics;
use crate::runner::Runner;

/// Runs `runner`; with `leader_elect`, only while this manager holds the provider's Lease.
pub async fn run_elected(
    _client: kube::Client,
    runner: Runner,
    leader_elect: bool,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    if leader_elect {
        error!("leader election is not wired yet: the shared daemon lease is pending");
        cancel.cancelled().await;
        return;
    }
    metrics
        .leases_held
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if let Err(e) = runner.run(cancel).await {
        error!(error = %crate::chain(&e), "provider runner stopped");
    }
}
