//! The `run` daemon: the probe listener with readiness driven by real signals, the tunnel
//! supervisor, and the admin listener.
//!
//! Readiness (`/readyz` 200) needs all of:
//!
//! - **registered**: this node's Node object exists and its `Ready` condition is `True`,
//!   watched with the agent's kubeconfig (a watch on `metadata.name=<nodeName>`, so the
//!   agent reads one object, never the fleet);
//! - **data plane**: the configured check ([`crate::dataplane`]) passed on its last
//!   periodic run (`none` needs nothing);
//! - **delivery**: the Node watch is streaming (a failing watch withholds readiness until
//!   it recovers, since the agent then cannot tell whether the Node is Ready).
//!
//! The admin listener (`admin.listen`, default 127.0.0.1:9103) serves `/metrics` and
//! `/status`; the probe listener stays `/healthz` and `/readyz` with constant bodies.
//! Cancelling the token stops everything, the tunnel included, within a few seconds.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use common::error_chain;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event as WatchEvent};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{AgentConfig, DataPlaneCheck};
use crate::tunnel::TunnelHandle;

/// Knobs tests shrink; production uses the defaults.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The probe listener's timing (data-plane check period, drain time).
    pub health: health::Tuning,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            health: health::Tuning {
                // A shutdown must end within the kubelet's grace; a probe needs far less.
                drain_timeout: Duration::from_secs(1),
                ..health::Tuning::default()
            },
        }
    }
}

/// The daemon could not start. Once running it only stops on cancellation.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The probe listener could not bind.
    #[error("cannot start the probe listener")]
    Health(#[source] health::Error),
    /// The admin listener could not bind.
    #[error("cannot start the admin listener")]
    Admin(#[source] daemon::admin::Error),
    /// The kubeconfig could not be read.
    #[error(
        "cannot read the agent's kubeconfig {} (set `kubeconfig:` in the agent configuration)",
        path.display()
    )]
    Kubeconfig {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The client could not be built from it.
    #[error("cannot build a Kubernetes client from {}", path.display())]
    Client {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// What `/status` and the metrics read.
#[derive(Debug, Default)]
struct Shared {
    registered: AtomicBool,
    /// -1 no result yet, 0 failed, 1 passed (or no check).
    data_plane: AtomicI64,
}

/// A Kubernetes client from a kubeconfig file.
pub async fn client_from(path: &std::path::Path) -> Result<kube::Client, RunError> {
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|source| RunError::Kubeconfig {
        path: path.to_path_buf(),
        source,
    })?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|source| RunError::Kubeconfig {
            path: path.to_path_buf(),
            source,
        })?;
    kube::Client::try_from(config).map_err(|e| RunError::Client {
        path: path.to_path_buf(),
        source: Box::new(e),
    })
}

/// How often `run` retries a kubeconfig it cannot use yet.
const KUBECONFIG_RETRY: Duration = Duration::from_secs(2);

/// Where the daemon gets its Kubernetes client.
#[derive(Clone)]
pub enum ClientSource {
    /// Read `kubeconfig` from the configuration, retrying until it is usable: on a fresh
    /// worker the kubelet writes its kubeconfig only after its TLS bootstrap, and the agent
    /// may start first. Meanwhile the probes answer (not ready).
    Kubeconfig,
    /// A client already built (tests point it at the API double).
    Client(kube::Client),
}

/// Runs the daemon until `cancel`, reading the client from the configured kubeconfig.
pub async fn run(
    config: AgentConfig,
    options: RunOptions,
    cancel: CancellationToken,
) -> Result<(), RunError> {
    run_with(config, ClientSource::Kubeconfig, options, cancel).await
}

/// [`run`] with a client already built.
pub async fn run_with_client(
    config: AgentConfig,
    client: kube::Client,
    options: RunOptions,
    cancel: CancellationToken,
) -> Result<(), RunError> {
    run_with(config, ClientSource::Client(client), options, cancel).await
}

/// Waits for a usable client; `None` when cancelled first.
async fn wait_for_client(
    path: &std::path::Path,
    cancel: &CancellationToken,
) -> Option<kube::Client> {
    let mut logged = false;
    loop {
        match client_from(path).await {
            Ok(c) => {
                if logged {
                    info!(kubeconfig = %path.display(), "kubeconfig is usable now");
                }
                return Some(c);
            }
            Err(e) => {
                if !logged {
                    warn!(
                        error = %error_chain(&e),
                        "waiting for the kubeconfig (the kubelet writes it after its TLS bootstrap); not ready meanwhile"
                    );
                    logged = true;
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(KUBECONFIG_RETRY) => {}
            () = cancel.cancelled() => return None,
        }
    }
}

/// Runs the daemon until `cancel`. Binds both listeners first, so a taken port fails
/// before anything starts.
pub async fn run_with(
    config: AgentConfig,
    source: ClientSource,
    options: RunOptions,
    cancel: CancellationToken,
) -> Result<(), RunError> {
    let health = health::Server::with_tuning(config.health.clone(), options.health.clone());
    let probe_listener = if config.health.is_enabled() {
        Some(health.listen().await.map_err(RunError::Health)?)
    } else {
        info!("health listener is disabled (health.enabled: false)");
        None
    };
    let admin_listener = daemon::AdminServer::bind(&config.admin.listen)
        .await
        .map_err(RunError::Admin)?;

    let shared = Arc::new(Shared {
        registered: AtomicBool::new(false),
        // No check: the data plane is met by definition.
        data_plane: AtomicI64::new(match config.data_plane.check {
            DataPlaneCheck::None => 1,
            _ => -1,
        }),
    });
    let tunnel = TunnelHandle::default();
    let mut registry = Registry::with_prefix("outpost_agent");
    registry.register(
        "tunnel_up",
        "1 while the supervised tunnel process runs",
        tunnel.up.clone(),
    );
    registry.register(
        "tunnel_restarts",
        "Times the supervised tunnel exited and was restarted",
        tunnel.restarts.clone(),
    );
    let checks =
        prometheus_client::metrics::family::Family::<Vec<(String, String)>, Counter>::default();
    registry.register(
        "data_plane_checks",
        "Data-plane check runs by result",
        checks.clone(),
    );
    registry.register_collector(Box::new(Conditions {
        health: health.clone(),
        shared: shared.clone(),
    }));
    let admin = daemon::AdminServer::new(registry).with_status({
        let health = health.clone();
        let shared = shared.clone();
        let tunnel = tunnel.clone();
        let node = config.node_name.clone();
        let check = config.data_plane.check;
        let has_tunnel = config.tunnel.is_some();
        move || {
            serde_json::json!({
                "node": node,
                "ready": health.is_ready(),
                "registered": shared.registered.load(Ordering::Acquire),
                "dataPlane": {
                    "check": check.as_str(),
                    "passed": match shared.data_plane.load(Ordering::Acquire) {
                        -1 => serde_json::Value::Null,
                        v => serde_json::Value::Bool(v == 1),
                    },
                },
                "tunnel": if has_tunnel { serde_json::to_value(tunnel.status()).unwrap_or_default() } else { serde_json::Value::Null },
            })
        }
    });

    let inner = cancel.child_token();
    // The data plane: the latch is set at once (nothing to bring up here); the check, if
    // any, decides from then on.
    health.set_data_plane_ready();
    let record = {
        let shared = shared.clone();
        let checks = checks.clone();
        move |ok: bool| {
            shared.data_plane.store(i64::from(ok), Ordering::Release);
            let result = if ok { "pass" } else { "fail" };
            checks
                .get_or_create(&vec![("result".to_string(), result.to_string())])
                .inc();
        }
    };
    match config.data_plane.check {
        DataPlaneCheck::None => {}
        DataPlaneCheck::Wireguard => {
            let interface = config.data_plane.interface.clone().unwrap_or_default();
            let max = config.data_plane.max_handshake_age;
            health.set_data_plane_check_blocking(inner.clone(), move || {
                let r = crate::dataplane::wireguard_check(&interface, max);
                record(r.is_ok());
                r
            });
        }
        DataPlaneCheck::Tunnel => {
            let tunnel = tunnel.clone();
            health.set_data_plane_check(inner.clone(), move || {
                let tunnel = tunnel.clone();
                let record = record.clone();
                async move {
                    let r = tunnel.check().await;
                    record(r.is_ok());
                    r
                }
            });
        }
    }

    let mut tasks: JoinSet<&'static str> = JoinSet::new();
    if let Some(listener) = probe_listener {
        let health = health.clone();
        let c = inner.clone();
        tasks.spawn(async move {
            if let Err(e) = health.serve(c, listener).await {
                warn!(error = %e, "probe listener failed");
            }
            "probe listener"
        });
    }
    {
        let c = inner.clone();
        tasks.spawn(async move {
            admin.serve(admin_listener, c).await;
            "admin listener"
        });
    }
    let client = match source {
        ClientSource::Client(c) => Some(c),
        ClientSource::Kubeconfig => wait_for_client(&config.kubeconfig, &cancel).await,
    };
    if let Some(client) = &client {
        let c = inner.clone();
        let health = health.clone();
        let shared = shared.clone();
        let client = client.clone();
        let node = config.node_name.clone();
        tasks.spawn(async move {
            watch_node(client, node, health, shared, c).await;
            "node watch"
        });
    }
    if let (Some(t), Some(client)) = (config.tunnel.clone(), &client) {
        let c = inner.clone();
        let node = config.node_name.clone();
        let client = client.clone();
        let tunnel = tunnel.clone();
        tasks.spawn(async move {
            crate::tunnel::supervise(t, node, client, tunnel, c).await;
            "tunnel supervisor"
        });
    }
    info!(node = %config.node_name, check = config.data_plane.check.as_str(), "agent running");

    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            done = tasks.join_next() => match done {
                Some(Ok(name)) => {
                    warn!(subsystem = name, "subsystem stopped before shutdown");
                    health.set_subsystem_stopped(name);
                }
                Some(Err(e)) => {
                    warn!(error = %e, "subsystem panicked");
                    health.set_subsystem_stopped("a subsystem (panicked)");
                }
                None => { cancel.cancelled().await; break; }
            },
        }
    }
    inner.cancel();
    // Every subsystem bounds its own stop (tunnel: 2 s grace; listeners: drain time).
    if tokio::time::timeout(Duration::from_secs(4), async {
        while tasks.join_next().await.is_some() {}
    })
    .await
    .is_err()
    {
        warn!("subsystems outlived the shutdown time; aborting them");
        tasks.shutdown().await;
    }
    info!("agent stopped");
    Ok(())
}

/// Whether a Node's `Ready` condition is `True`, or why not.
pub fn node_ready(node: &Node) -> Result<(), String> {
    let cond = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    match cond {
        Some(c) if c.status == "True" => Ok(()),
        Some(c) => Err(format!(
            "Node Ready is {} ({})",
            c.status,
            c.reason.as_deref().unwrap_or("no reason given")
        )),
        None => Err("Node has no Ready condition yet".into()),
    }
}

async fn watch_node(
    client: kube::Client,
    name: String,
    health: health::Server,
    shared: Arc<Shared>,
    cancel: CancellationToken,
) {
    let api: Api<Node> = Api::all(client);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = watcher::watcher(api, cfg).default_backoff();
    futures::pin_mut!(stream);
    let mut seen_in_init = false;
    let mut state: Option<Result<(), String>> = None;
    let set = |verdict: Result<(), String>, state: &mut Option<Result<(), String>>| {
        if state.as_ref() == Some(&verdict) {
            return;
        }
        match &verdict {
            Ok(()) => {
                info!(node = %name, "Node exists and is Ready");
                health.set_registered();
            }
            Err(why) => {
                info!(node = %name, reason = %why, "not registered");
                health.set_unregistered();
            }
        }
        shared.registered.store(verdict.is_ok(), Ordering::Release);
        *state = Some(verdict);
    };
    loop {
        let next = tokio::select! {
            () = cancel.cancelled() => return,
            next = stream.next() => next,
        };
        let Some(event) = next else { return };
        match event {
            Ok(ev) => {
                health.set_delivery_mode(health::DeliveryMode::Streaming);
                match ev {
                    WatchEvent::Init => seen_in_init = false,
                    WatchEvent::InitApply(n) => {
                        seen_in_init = true;
                        set(node_ready(&n), &mut state);
                    }
                    WatchEvent::InitDone => {
                        if !seen_in_init {
                            set(Err("Node does not exist".into()), &mut state);
                        }
                    }
                    WatchEvent::Apply(n) => set(node_ready(&n), &mut state),
                    WatchEvent::Delete(_) => set(Err("Node was deleted".into()), &mut state),
                }
            }
            Err(e) => {
                warn!(node = %name, error = %e, "Node watch failed; retrying");
                health.set_delivery_mode(health::DeliveryMode::Unknown);
            }
        }
    }
}

/// `outpost_agent_condition{condition=...}`: 1 or 0 per readiness condition, read at
/// scrape time.
struct Conditions {
    health: health::Server,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Conditions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Conditions")
    }
}

impl Collector for Conditions {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut metric = encoder.encode_descriptor(
            "condition",
            "Readiness conditions: 1 when met (ready is all of them)",
            None,
            MetricType::Gauge,
        )?;
        let dp = self.shared.data_plane.load(Ordering::Acquire);
        for (name, value) in [
            ("ready", self.health.is_ready()),
            ("registered", self.shared.registered.load(Ordering::Acquire)),
            ("data_plane", dp == 1),
        ] {
            let labels = [("condition".to_string(), name.to_string())];
            ConstGauge::new(i64::from(value)).encode(metric.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};

    fn node(conditions: Option<Vec<(&str, &str)>>) -> Node {
        Node {
            status: Some(NodeStatus {
                conditions: conditions.map(|cs| {
                    cs.into_iter()
                        .map(|(t, s)| NodeCondition {
                            type_: t.into(),
                            status: s.into(),
                            ..Default::default()
                        })
                        .collect()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_ready_true_counts() {
        assert!(
            node_ready(&node(Some(vec![
                ("MemoryPressure", "False"),
                ("Ready", "True")
            ])))
            .is_ok()
        );
        for n in [
            node(Some(vec![("Ready", "False")])),
            node(Some(vec![("Ready", "Unknown")])),
            node(Some(vec![("MemoryPressure", "True")])),
            node(None),
            Node::default(),
        ] {
            assert!(node_ready(&n).is_err(), "{n:?}");
        }
        let why = node_ready(&node(Some(vec![("Ready", "Unknown")]))).unwrap_err();
        assert!(why.contains("Unknown"), "{why}");
    }
}
