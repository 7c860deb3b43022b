//! The reconciler as a daemon: the Lease election that decides who writes, the admin
//! listener that mirrors the reconciler's [`crate::Monitor`] (`/status`) and metrics
//! (`/metrics`), and [`Reconciler::run`] until cancelled. `stratum-server nodes
//! reconcile` is this call plus flags.

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{LEASE_NAME, LEASE_NAMESPACE, Reconciler};

/// How the daemon runs beside its reconciler.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The admin listener's address (`HOST:PORT`).
    pub admin_listen: String,
    /// The Lease `kube-system/nodeaddr-reconciler` this replica competes for.
    pub lease: daemon::LeaseConfig,
}

impl ServeOptions {
    /// The admin listener on `admin_listen`, the Lease with `identity` and client-go's
    /// default timings.
    pub fn new(admin_listen: impl Into<String>, identity: impl Into<String>) -> ServeOptions {
        ServeOptions {
            admin_listen: admin_listen.into(),
            lease: daemon::LeaseConfig::new(LEASE_NAMESPACE, LEASE_NAME, identity),
        }
    }
}

/// The daemon could not start, or a task of it died.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The Lease timings or identity cannot work.
    #[error("invalid lease settings")]
    Lease(#[source] daemon::lease::ConfigError),
    /// The admin listener could not bind.
    #[error("cannot start the admin listener")]
    Admin(#[source] daemon::admin::Error),
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

/// Binds the admin listener (so a taken port fails the start, before any work), then
/// runs [`serve_on`].
pub async fn serve(
    reconciler: &Reconciler,
    opts: ServeOptions,
    cancel: CancellationToken,
) -> Result<(), ServeError> {
    let listener = daemon::AdminServer::bind(&opts.admin_listen)
        .await
        .map_err(ServeError::Admin)?;
    serve_on(reconciler, listener, opts.lease, cancel).await
}

/// Runs the reconciler until `cancel`: it writes only while this replica holds `lease`;
/// `listener` serves `/status` (the [`crate::Monitor`]'s snapshot as JSON) and `/metrics`
/// (the reconciler's counters and the election's, prefixed `nodeaddr`). On the way out
/// the election releases the Lease, so a standby need not wait it out, and the admin
/// listener stops.
pub async fn serve_on(
    reconciler: &Reconciler,
    listener: TcpListener,
    lease: daemon::LeaseConfig,
    cancel: CancellationToken,
) -> Result<(), ServeError> {
    let election =
        daemon::LeaderElection::new(reconciler.client.clone(), lease).map_err(ServeError::Lease)?;
    let mut registry = prometheus_client::registry::Registry::default();
    let monitor = reconciler.monitor();
    monitor.register(&mut registry);
    election.register_metrics(registry.sub_registry_with_prefix("nodeaddr"));
    let admin = daemon::AdminServer::new(registry).with_status(move || {
        serde_json::to_value(monitor.status()).unwrap_or(serde_json::Value::Null)
    });
    let (leader, election_task) = election.spawn(cancel.clone());
    let admin_task = tokio::spawn(admin.serve(listener, cancel.clone()));
    reconciler.run(cancel.clone(), leader).await;
    cancel.cancel();
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
