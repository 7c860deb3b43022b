//! `stratum-server operator`: the housekeeping one controller does for the cluster.
//!
//! Each pass drops the grant entries whose bootstrap token expired or is gone
//! ([`crate::grants::prune_expired_grants`], which writes nothing when nothing expired)
//! and reads how old the shared certificate-key is
//! ([`crate::grants::shared_certs_key_set_at`]). The command runs a pass on an interval
//! while it holds the `kube-system/stratum-operator` Lease, so one controller at a time
//! writes.

use jiff::Timestamp;

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
    pub key_set_at: Option<Timestamp>,
    /// Its age in seconds at the pass, when known.
    pub key_age_seconds: Option<i64>,
}

/// One operator pass at `now`.
pub async fn pass(client: &kube::Client, now: Timestamp) -> Result<PassReport, GrantError> {
    let pruned = grants::prune_expired_grants_at(client, || now).await?;
    let key_set_at = grants::shared_certs_key_set_at(client).await?;
    Ok(PassReport {
        pruned,
        key_set_at,
        key_age_seconds: key_set_at.map(|t| now.duration_since(t).as_secs().max(0)),
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
            match pass(client, Timestamp::now()).await {
                Ok(r) => {
                    metrics.observe(&r);
                    tracing::info!(pruned = ?r.pruned, key_age_seconds = ?r.key_age_seconds, "operator pass");
                }
                Err(e) => {
                    metrics.pass_errors.inc();
                    tracing::warn!("operator pass failed: {}", crate::error_chain(&e));
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// The shared certificate-key's state, as `certs check` reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum KeyAge {
    /// Not asked (no kubeconfig given).
    NotChecked,
    /// No grant Secret: nothing published.
    NotPublished,
    /// Set this long ago.
    Set {
        /// When, RFC 3339.
        set_at: String,
        /// Seconds since.
        age_secs: i64,
    },
    /// The API could not be asked.
    Error {
        /// Why, with its causes.
        error: String,
    },
}

/// `certs check`'s line for it (after `certificate-key: `).
impl std::fmt::Display for KeyAge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyAge::NotChecked => {
                f.write_str("not checked (pass --kubeconfig with admin rights to report its age)")
            }
            KeyAge::NotPublished => f.write_str("no grant Secret published"),
            KeyAge::Set { set_at, age_secs } => {
                write!(f, "set {set_at} ({} ago)", pki::short_duration(*age_secs))
            }
            KeyAge::Error { error } => write!(f, "could not ask the API server: {error}"),
        }
    }
}

impl KeyAge {
    /// Whether `certs check` fails on it: the API could not be asked, or the key is older
    /// than `max_age` (when given).
    pub fn fails(&self, max_age: Option<std::time::Duration>) -> bool {
        match self {
            KeyAge::Error { .. } => true,
            KeyAge::Set { age_secs, .. } => {
                max_age.is_some_and(|max| i64::try_from(max.as_secs()).is_ok_and(|m| *age_secs > m))
            }
            KeyAge::NotChecked | KeyAge::NotPublished => false,
        }
    }
}

/// The shared certificate-key's age at `now`, asked with the admin `kubeconfig` (none:
/// [`KeyAge::NotChecked`]). A failure to ask is a value ([`KeyAge::Error`]), so the
/// report still shows every certificate.
pub async fn certificate_key_age(kubeconfig: Option<&std::path::Path>, now: Timestamp) -> KeyAge {
    let Some(path) = kubeconfig else {
        return KeyAge::NotChecked;
    };
    let client = match crate::grants::client_from_kubeconfig(path).await {
        Ok(c) => c,
        Err(e) => {
            return KeyAge::Error {
                error: crate::error_chain(&e),
            };
        }
    };
    match crate::grants::shared_certs_key_set_at(&client).await {
        Ok(None) => KeyAge::NotPublished,
        Ok(Some(at)) => KeyAge::Set {
            set_at: at.to_string(),
            age_secs: now.duration_since(at).as_secs(),
        },
        Err(e) => KeyAge::Error {
            error: crate::error_chain(&e),
        },
    }
}

/// How the operator daemon runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The admin listener's address (`HOST:PORT`).
    pub admin_listen: String,
    /// This replica's identity in the Lease `kube-system/stratum-operator`.
    pub identity: String,
    /// Time between passes.
    pub interval: std::time::Duration,
}

/// The operator daemon could not start, or a task of it died.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The admin listener could not bind.
    #[error("cannot start the admin listener")]
    Admin(#[source] daemon::admin::Error),
    /// The Lease settings cannot work.
    #[error("invalid lease settings")]
    Lease(#[source] daemon::lease::ConfigError),
    /// A task panicked.
    #[error("the {task} task panicked")]
    Task {
        /// `lease election` or `admin listener`.
        task: &'static str,
        /// The join error.
        #[source]
        source: tokio::task::JoinError,
    },
}

/// Runs the operator until `shutdown`: binds the admin listener first (a taken port fails
/// the start), competes for the Lease `kube-system/stratum-operator`, passes every
/// `interval` while it holds it ([`run`]), and serves `/metrics` (prefix `stratum`: the
/// pass counters and the election's) and `/status` (leader, holder, transitions). On the
/// way out the election releases the Lease.
pub async fn serve(
    client: &kube::Client,
    opts: ServeOptions,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Result<(), ServeError> {
    let listener = daemon::AdminServer::bind(&opts.admin_listen)
        .await
        .map_err(ServeError::Admin)?;
    let election = daemon::LeaderElection::new(
        client.clone(),
        daemon::LeaseConfig::new(LEASE_NAMESPACE, LEASE_NAME, opts.identity),
    )
    .map_err(ServeError::Lease)?;
    let mut registry = prometheus_client::registry::Registry::with_prefix("stratum");
    let metrics = Metrics::default();
    metrics.register(&mut registry);
    election.register_metrics(registry.sub_registry_with_prefix("operator"));
    let (leader, election_task) = election.spawn(shutdown.clone());
    let status_leader = leader.clone();
    let admin = daemon::AdminServer::new(registry).with_status(move || {
        let s = status_leader.status();
        serde_json::json!({
            "leader": status_leader.is_leader(),
            "holder": s.holder,
            "transitions": s.transitions,
        })
    });
    let admin_task = tokio::spawn(admin.serve(listener, shutdown.clone()));
    run(
        client,
        opts.interval,
        move || leader.is_leader(),
        &metrics,
        shutdown,
    )
    .await;
    election_task.await.map_err(|source| ServeError::Task {
        task: "lease election",
        source,
    })?;
    admin_task.await.map_err(|source| ServeError::Task {
        task: "admin listener",
        source,
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_age_fails_on_errors_and_on_age_only_when_asked() {
        let set = KeyAge::Set {
            set_at: "2030-01-01T00:00:00+00:00".into(),
            age_secs: 7200,
        };
        assert!(!set.fails(None));
        assert!(!set.fails(Some(std::time::Duration::from_secs(7200))));
        assert!(set.fails(Some(std::time::Duration::from_secs(7199))));
        assert!(KeyAge::Error { error: "x".into() }.fails(None));
        assert!(!KeyAge::NotChecked.fails(Some(std::time::Duration::ZERO)));
        assert!(!KeyAge::NotPublished.fails(Some(std::time::Duration::ZERO)));
        assert_eq!(
            serde_json::to_value(&set).unwrap(),
            serde_json::json!({"state": "set", "set_at": "2030-01-01T00:00:00+00:00", "age_secs": 7200})
        );
        assert_eq!(
            serde_json::to_value(KeyAge::NotChecked).unwrap(),
            serde_json::json!({"state": "not_checked"})
        );
    }
}
