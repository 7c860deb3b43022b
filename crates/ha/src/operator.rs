//! `stratum-server operator`: the housekeeping one controller does for the cluster.
//!
//! Each pass drops the grant entries whose bootstrap token expired or is gone
//! ([`crate::grants::prune_expired_grants`], which writes nothing when nothing expired)
//! and reads how old the shared certificate-key is
//! ([`crate::grants::shared_certs_key_set_at`]). The command runs a pass on an interval
//! while it holds the `kube-system/stratum-operator` Lease, so one controller at a time
//! writes.

use chrono::{DateTime, Utc};

use crate::grants::{self, GrantError};

/// The Lease the operator holds while it works.
pub const LEASE_NAME: &str = "stratum-operator";
/// The Lease's namespace.
pub const LEASE_NAMESPACE: &str = "kube-system";

/// What one pass did and saw.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PassReport {
    /// Grant entries dropped (their tokens expired or are gone).
    pub pruned: Vec<String>,
    /// When the shared certificate-key was last set; `None` without a grant Secret.
    pub key_set_at: Option<DateTime<Utc>>,
    /// Its age in seconds at the pass, when known.
    pub key_age_seconds: Option<i64>,
}

/// One operator pass at `now`.
pub async fn pass(client: &kube::Client, now: DateTime<Utc>) -> Result<PassReport, GrantError> {
    let pruned = grants::prune_expired_grants_at(client, || now).await?;
    let key_set_at = grants::shared_certs_key_set_at(client).await?;
    Ok(PassReport {
        pruned,
        key_set_at,
        key_age_seconds: key_set_at.map(|t| (now - t).num_seconds().max(0)),
    })
}

/// The operator's metrics (prefix them with the registry the caller hands in).
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    /// Passes run (as leader).
    pub passes: prometheus_client::metrics::counter::Counter,
    /// Passes that failed.
    pub pass_errors: prometheus_client::metrics::counter::Counter,
    /// Grant entries pruned.
    pub grants_pruned: prometheus_client::metrics::counter::Counter,
    /// The shared certificate-key's age at the last pass (-1: no grant Secret).
    pub certificate_key_age_seconds: prometheus_client::metrics::gauge::Gauge,
}

impl Metrics {
    /// Registers every metric in `registry`.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "operator_passes",
            "Operator passes run as leader",
            self.passes.clone(),
        );
        registry.register(
            "operator_pass_errors",
            "Operator passes that failed",
            self.pass_errors.clone(),
        );
        registry.register(
            "grants_pruned",
            "Grant entries dropped because their bootstrap token expired or is gone",
            self.grants_pruned.clone(),
        );
        registry.register(
            "certificate_key_age_seconds",
            "Age of the shared certificate-key at the last pass (-1 without a grant Secret)",
            self.certificate_key_age_seconds.clone(),
        );
    }

    fn observe(&self, report: &PassReport) {
        self.passes.inc();
        self.grants_pruned.inc_by(report.pruned.len() as u64);
        self.certificate_key_age_seconds
            .set(report.key_age_seconds.unwrap_or(-1));
    }
}

/// Runs a pass every `interval` while `is_leader()` says this replica may write (asked
/// right before each pass), until `shutdown`.
pub async fn run(
    client: &kube::Client,
    interval: std::time::Duration,
    is_leader: impl Fn() -> bool,
    metrics: &Metrics,
    shutdown: &tokio_util::sync::CancellationToken,
) {
    loop {
        if is_leader() {
            match pass(client, Utc::now()).await {
                Ok(r) => {
                    metrics.observe(&r);
                    tracing::info!(pruned = ?r.pruned, key_age_seconds = ?r.key_age_seconds, "operator pass");
                }
                Err(e) => {
                    metrics.pass_errors.inc();
                    tracing::warn!("operator pass failed: {e}");
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}
