//! The composition `nebula-manager run` calls: one [`Runner`] per provider, placement, the
//! probe listener (health crate) and the admin listener.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::blocklist::Blocklist;
use crate::crash::{CrashHook, CrashPoint};
use crate::kubelet::KubeletServer;
use crate::metrics::Metrics;
use crate::node::NodeAdvert;
use crate::placement::{Candidate, run_placement};
use crate::pods::{DEFAULT_BLOCK_TTL, PodControllerConfig};
use crate::provider::Provider;
use crate::providers::process::{ProcessProvider, StateDirError};
use crate::runner::Runner;

/// Environment switch for crash tests: the manager SIGKILLs itself at this crash point
/// (`before-provision`, `provider-created`, `after-provision`, `after-metadata`, `after-secret`,
/// `after-terminate`). Never set it in production.
pub const CRASH_ENV: &str = "NEBULA_MANAGER_CRASH_AT";
/// Default probe listener of `nebula-manager run`.
pub const DEFAULT_HEALTH_LISTEN: &str = "127.0.0.1:9104";
/// Default admin listener (`/metrics`) of `nebula-manager run`.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9105";
/// Default kubelet API address advertised as the nodes' daemon endpoint.
pub const DEFAULT_KUBELET_LISTEN: &str = "0.0.0.0:10250";

/// A `--provider` flag: `process` or `process:NAME`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderSpec {
    /// The kind (only `process` is built).
    pub kind: String,
    /// The provider's name (the node is `nebula-<name>`); defaults to the kind.
    pub name: String,
}

/// Why a `--provider` value is not usable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProviderSpecError {
    /// Unknown kind.
    #[error(
        "unknown provider kind {0:?}: the only kind built is \"process\" (process or process:NAME)"
    )]
    UnknownKind(String),
    /// The name cannot be part of a node name.
    #[error(
        "provider name {0:?} must be lowercase letters, digits and '-', starting and ending with a letter or digit, at most 40 characters"
    )]
    BadName(String),
}

impl std::str::FromStr for ProviderSpec {
    type Err = ProviderSpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, name) = s.split_once(':').unwrap_or((s, s));
        if kind != "process" {
            return Err(ProviderSpecError::UnknownKind(kind.to_string()));
        }
        let ok = !name.is_empty()
            && name.len() <= 40
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !name.starts_with('-')
            && !name.ends_with('-');
        if !ok {
            return Err(ProviderSpecError::BadName(name.to_string()));
        }
        Ok(ProviderSpec {
            kind: kind.to_string(),
            name: name.to_string(),
        })
    }
}

/// Settings of `nebula-manager run`.
#[derive(Clone, Debug)]
pub struct ManagerConfig {
    /// The providers, one virtual node each.
    pub providers: Vec<ProviderSpec>,
    /// Where the process provider keeps per-pod directories (`<dir>/<provider>/<claim>`).
    pub state_dir: PathBuf,
    /// The kubelet API address; the port it binds (port 0 picks a free one) is advertised
    /// as the nodes' daemon endpoint.
    pub kubelet_listen: SocketAddr,
    /// A PEM bundle the kubelet API's clients must present a certificate from (the CA
    /// of the API server's kubelet client certificate); `None` serves any client.
    pub kubelet_client_ca: Option<PathBuf>,
    /// Ask the API server (SubjectAccessReview) before serving a kubelet API request.
    /// Needs `kubelet_client_ca`.
    pub kubelet_webhook_authorization: bool,
    /// The probe listener.
    pub health_listen: SocketAddr,
    /// The admin listener.
    pub admin_listen: SocketAddr,
    /// The manager's Pod IP (`POD_IP`), advertised as the nodes' address.
    pub pod_ip: Option<String>,
    /// Run each provider (and placement) only while holding its Lease
    /// (`kube-system/nebula-manager-<provider>`, `kube-system/nebula-manager-placement`).
    pub leader_elect: bool,
    /// This replica's identity in those Leases (the pod name in a cluster).
    pub identity: String,
    /// Lease timings (duration, renew deadline, retry period); `None` = the daemon
    /// crate's defaults (15 s, 10 s, 2 s).
    pub lease_timings: Option<(
        std::time::Duration,
        std::time::Duration,
        std::time::Duration,
    )>,
    /// Crash point to SIGKILL at (tests only; see [`CRASH_ENV`]).
    pub crash_at: Option<CrashPoint>,
}

/// Why the manager stopped.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// A provider could not be set up.
    #[error("setting up provider {name}")]
    Provider {
        /// The provider.
        name: String,
        /// Why.
        #[source]
        source: StateDirError,
    },
    /// The probe listener could not start.
    #[error("starting the probe listener on {addr}")]
    Health {
        /// Where.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: health::Error,
    },
    /// The admin listener could not start.
    #[error("starting the admin listener")]
    Admin(#[source] daemon::admin::Error),
    /// A Lease configuration is unusable.
    #[error("configuring leader election")]
    Lease(#[source] daemon::lease::ConfigError),
    /// The kubelet API could not start.
    #[error("starting the kubelet API")]
    Kubelet(#[source] crate::kubelet::KubeletError),
    /// Webhook authorization without a client CA: there is no caller to ask about.
    #[error(
        "--kubelet-authorization-webhook needs --kubelet-client-ca: the caller asked about is the subject of its client certificate"
    )]
    WebhookWithoutClientCa,
    /// Two `--provider` flags name the same provider.
    #[error("provider {0} is given twice; give each a distinct name with process:NAME")]
    Duplicate(String),
}

/// A hook that SIGKILLs this process at `point`.
pub fn kill_at(point: CrashPoint) -> CrashHook {
    Arc::new(move |p| {
        Box::pin(async move {
            if p == point {
                error!(
                    point = p.as_str(),
                    "crash point reached: killing the manager (SIGKILL)"
                );
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::this(),
                    nix::sys::signal::Signal::SIGKILL,
                );
                std::future::pending::<()>().await;
            }
        })
    })
}

/// Runs the manager until `cancel` fires or a part of it stops.
pub async fn run(
    client: kube::Client,
    cfg: ManagerConfig,
    cancel: CancellationToken,
) -> Result<(), ManagerError> {
    let hook = cfg.crash_at.map(kill_at);
    let mut providers: Vec<Arc<dyn Provider>> = Vec::new();
    for spec in &cfg.providers {
        if providers.iter().any(|p| p.name() == spec.name) {
            return Err(ManagerError::Duplicate(spec.name.clone()));
        }
        let p = ProcessProvider::new(spec.name.clone(), &cfg.state_dir)
            .map_err(|source| ManagerError::Provider {
                name: spec.name.clone(),
                source,
            })?
            .with_crash_hook(hook.clone());
        providers.push(Arc::new(p));
    }
    let metrics = Arc::new(Metrics::default());
    let client = &client;
    let blocklist = Arc::new(Blocklist::new());

    let health = health::Server::new(health::Config {
        enabled: Some(true),
        listen: cfg.health_listen.to_string(),
    });
    let listener = health
        .listen()
        .await
        .map_err(|source| ManagerError::Health {
            addr: cfg.health_listen,
            source,
        })?;
    let admin = daemon::AdminServer::bind(&cfg.admin_listen.to_string())
        .await
        .map_err(ManagerError::Admin)?;
    // The kubelet API: bad addresses and CAs fail here, before anything runs.
    let node_ip = match (&cfg.pod_ip, cfg.kubelet_listen.ip()) {
        (Some(ip), _) => ip.clone(),
        (None, ip) if !ip.is_unspecified() => ip.to_string(),
        (None, _) => "127.0.0.1".to_string(),
    };
    if cfg.kubelet_webhook_authorization && cfg.kubelet_client_ca.is_none() {
        return Err(ManagerError::WebhookWithoutClientCa);
    }
    let mut kubelet = KubeletServer::new(
        &node_ip,
        &cfg.kubelet_listen.to_string(),
        cfg.kubelet_client_ca.as_deref(),
    )
    .map_err(ManagerError::Kubelet)?;
    if cfg.kubelet_webhook_authorization {
        kubelet = kubelet.with_webhook_authorization(client.clone());
    }
    let kubelet = Arc::new(kubelet);
    let kubelet_listener = kubelet.bind().await.map_err(ManagerError::Kubelet)?;
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    // One election per provider and one for placement, each registering its lease metrics
    // under its own label.
    let election = |lease: String, registry: &mut prometheus_client::registry::Registry| {
        if !cfg.leader_elect {
            return Ok(None);
        }
        let mut lc = daemon::LeaseConfig::new("kube-system", lease.clone(), cfg.identity.clone());
        if let Some((d, r, p)) = cfg.lease_timings {
            lc = lc.with_timings(d, r, p);
        }
        let e = daemon::LeaderElection::new(client.clone(), lc).map_err(ManagerError::Lease)?;
        e.register_metrics(registry.sub_registry_with_label(("lease".into(), lease.into())));
        Ok::<_, ManagerError>(Some(e))
    };
    let mut elections = Vec::new();
    for p in &providers {
        elections.push(election(
            format!("nebula-manager-{}", p.name()),
            &mut registry,
        )?);
    }
    let placement_election = election("nebula-manager-placement".to_string(), &mut registry)?;
    let bound =
        |l: &tokio::net::TcpListener| l.local_addr().map(|a| a.to_string()).unwrap_or_default();
    info!(health = %bound(&listener), admin = %bound(&admin), "listeners bound");

    let mut tasks: JoinSet<&'static str> = JoinSet::new();
    {
        let health = health.clone();
        let cancel = cancel.clone();
        tasks.spawn(async move {
            if let Err(e) = health.serve(cancel, listener).await {
                error!(error = %e, "probe listener failed");
            }
            "probe listener"
        });
    }
    {
        let status_metrics = metrics.clone();
        let names: Vec<String> = providers.iter().map(|p| p.name().to_string()).collect();
        let leader_elect = cfg.leader_elect;
        let server = daemon::AdminServer::new(registry).with_status(move || {
            let m = &status_metrics;
            serde_json::json!({
                "providers": names,
                "leaderElect": leader_elect,
                "leading": m.leases_held.get(),
                "provisions": m.provisions.get(),
                "terminations": m.terminations.get(),
                "readoptions": m.readoptions.get(),
                "providerErrors": m.provider_errors.get(),
                "placements": m.placements.get(),
            })
        });
        let cancel = cancel.clone();
        tasks.spawn(async move {
            server.serve(admin, cancel).await;
            "admin listener"
        });
    }
    // The port actually bound (port 0 picks one), so the nodes advertise where it serves.
    let kubelet_port = kubelet_listener
        .local_addr()
        .map(|a| a.port())
        .unwrap_or(cfg.kubelet_listen.port());
    let advert = NodeAdvert {
        pod_ip: cfg.pod_ip.clone(),
        kubelet_port,
    };
    let pod_cfg = PodControllerConfig {
        blocklist: blocklist.clone(),
        block_ttl: DEFAULT_BLOCK_TTL,
        events: true,
    };
    for (p, election) in providers.iter().zip(elections) {
        let runner = Arc::new(Runner::new(
            client.clone(),
            p.clone(),
            advert.clone(),
            metrics.clone(),
            pod_cfg.clone(),
            hook.clone(),
        ));
        {
            let runner = runner.clone();
            kubelet.register(
                common::keys::virtual_node_name(p.name()),
                Arc::new(move || runner.handler()),
            );
        }
        let cancel = cancel.clone();
        let metrics = metrics.clone();
        let what = format!("provider {}", p.name());
        tasks.spawn(async move {
            crate::election::while_leading(election, &what, &metrics, cancel, |term| {
                let runner = &runner;
                async move {
                    if let Err(e) = runner.run(term).await {
                        error!(error = %crate::chain(&e), "provider runner stopped");
                    }
                }
            })
            .await;
            "provider runner"
        });
    }
    {
        let kubelet = kubelet.clone();
        let cancel = cancel.clone();
        tasks.spawn(async move {
            kubelet.serve(kubelet_listener, cancel).await;
            "kubelet API"
        });
    }
    let known: Vec<Candidate> = providers
        .iter()
        .map(|p| Candidate {
            name: p.name().to_string(),
            capacity_types: p.capabilities().capacity_types,
        })
        .collect();
    {
        let client = client.clone();
        let metrics = metrics.clone();
        let cancel = cancel.clone();
        tasks.spawn(async move {
            let m = metrics.clone();
            crate::election::while_leading(placement_election, "placement", &m, cancel, |term| {
                run_placement(
                    client.clone(),
                    known.clone(),
                    blocklist.clone(),
                    metrics.clone(),
                    term,
                )
            })
            .await;
            "placement"
        });
    }
    // Ready once everything runs and while every provider answers its health check.
    health.set_registered();
    health.set_data_plane_ready();
    {
        let providers = providers.clone();
        health.set_data_plane_check(cancel.clone(), move || {
            let providers = providers.clone();
            async move {
                for p in &providers {
                    p.health().await?;
                }
                Ok::<(), crate::ProviderError>(())
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        if cancel.is_cancelled() {
            continue;
        }
        let name = done.unwrap_or("a task");
        error!(part = name, "a part of the manager stopped before shutdown");
        health.set_subsystem_stopped(name);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_flags() {
        assert_eq!(
            "process".parse::<ProviderSpec>(),
            Ok(ProviderSpec {
                kind: "process".into(),
                name: "process".into()
            })
        );
        assert_eq!(
            "process:gpu-1".parse::<ProviderSpec>().unwrap().name,
            "gpu-1"
        );
        assert!(matches!(
            "vm:x".parse::<ProviderSpec>(),
            Err(ProviderSpecError::UnknownKind(_))
        ));
        assert!(matches!(
            "process:Bad".parse::<ProviderSpec>(),
            Err(ProviderSpecError::BadName(_))
        ));
        assert!(matches!(
            "process:".parse::<ProviderSpec>(),
            Err(ProviderSpecError::BadName(_))
        ));
    }
}
