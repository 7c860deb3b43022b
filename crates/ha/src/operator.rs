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
