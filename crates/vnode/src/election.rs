//! Running a piece of the manager only while this replica leads its Lease.

use std::future::Future;
use std::time::Duration;

use daemon::LeaderElection;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::metrics::Metrics;

/// Runs `work` with a token cancelled when leadership ends; again on each new term.
/// Without an election (`None`), runs `work` once for the life of `cancel`.
///
/// A new term calls `work` afresh: whatever the previous term held in memory is dropped,
/// and the new term re-adopts from the provider (nothing is created or terminated for
/// pods whose instances exist).
pub async fn while_leading<F, Fut>(
    election: Option<LeaderElection>,
    what: &str,
    metrics: &Metrics,
    cancel: CancellationToken,
    mut work: F,
) where
    F: FnMut(CancellationToken) -> Fut,
    Fut: Future<Output = ()>,
{
    let Some(election) = election else {
        metrics.leases_held.inc();
        work(cancel).await;
        metrics.leases_held.dec();
        return;
    };
    let (mut handle, elector) = election.spawn(cancel.clone());
    while !cancel.is_cancelled() {
        if !handle.wait_leader().await || cancel.is_cancelled() {
            break;
        }
        info!(%what, "leading: starting");
        metrics.leases_held.inc();
        let term = cancel.child_token();
        let run = work(term.clone());
        tokio::pin!(run);
        let mut check = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                _ = &mut run => break,
                _ = handle.changed() => {}
                _ = check.tick() => {}
            }
            if !handle.is_leader() {
                // Stop writing before a standby may take over: cancel, then wait.
                info!(%what, "leadership lost: stopping");
                term.cancel();
                run.as_mut().await;
                break;
            }
        }
        term.cancel();
        metrics.leases_held.dec();
    }
    let _ = elector.await;
}
