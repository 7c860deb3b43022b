//! `stratum-server up`: run a control-plane node until shutdown.
//!
//! - A node with state starts what the state says ([`run_node`]).
//! - A node without state whose join intent survives refuses: bootstrapping would start a
//!   second cluster over the membership the journal records. The refusal says what
//!   happened (from the [`JoinOutcome`] a rolled-back join left) and how to recover.
//! - Otherwise it bootstraps the first controller through [`assemble_node`]: the shared
//!   PKI (kept when present), leaves, kubeconfigs, a single-member etcd on the node IP, and
//!   then, once etcd answers, the bootstrap objects through the API
//!   ([`crate::bootstrap::ensure_cluster_objects`]).
//!
//! [`run_node`] supervises etcd (and configured components), waits for the local member,
//! promotes a learner once it has caught up, clears the join intent once the member's data
//! is confirmed, records a joined member's etcd URL and an Event, and stops the children
//! in order on shutdown. A first start after a join that does not answer within the start
//! timeout is rolled back ([`crate::join::rollback`]).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::assembly::{AssemblyError, NodeAssembly, Step, assemble_node};
use crate::bootstrap;
use crate::etcd::{self, learner};
use crate::join::{self, ETCD_DATA_DIR, JoinOutcome, etcd_options, intent_advice};
use crate::journal::{JoinIntentJournal, JournalError};
use crate::nodestate::{
    ClusterState, EtcdMember, NODE_STATE_VERSION, NodeConfig, NodeState, NodeStateError, Origin,
    https_url,
};
use crate::supervisor::{self, Backoff, Supervisor};

/// What `up` was given.
#[derive(Debug, Clone)]
pub struct UpOptions {
    /// This node's name.
    pub node_name: String,
    /// This node's address.
    pub node_ip: IpAddr,
    /// Node state, journal, etcd data, logs.
    pub data_dir: PathBuf,
    /// The PKI directory.
    pub pki_dir: PathBuf,
    /// Where kubeconfigs are written.
    pub kubeconfig_dir: PathBuf,
    /// The kubeconfig for API writes (cluster-info, RBAC, Events); default
    /// `<kubeconfig_dir>/admin.conf`.
    pub kubeconfig: Option<PathBuf>,
    /// Ports, binaries, timeouts.
    pub config: NodeConfig,
}

impl UpOptions {
    fn api_kubeconfig(&self) -> PathBuf {
        self.kubeconfig
            .clone()
            .unwrap_or_else(|| self.kubeconfig_dir.join("admin.conf"))
    }
}

/// Why `up` stopped.
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    /// A join intent survives on a node without state.
    #[error(
        "refusing to bootstrap: a join intent survives in {} (member {member}, {peer_url}). {advice}",
        path.display()
    )]
    IntentSurvives {
        /// The journal.
        path: PathBuf,
        /// The member name.
        member: String,
        /// Its peer URL.
        peer_url: String,
        /// What happened and what to do.
        advice: String,
    },
    /// The journal could not be read.
    #[error("cannot tell whether a join is half done")]
    Journal(#[source] JournalError),
    /// The node state could not be read or written.
    #[error(transparent)]
    State(#[from] NodeStateError),
    /// The state names another node or address.
    #[error(
        "the node state in {} is for {recorded}, not {given}: pass the flags it was brought up \
         with, or move the data directory away",
        data_dir.display()
    )]
    Mismatch {
        /// The data dir.
        data_dir: PathBuf,
        /// What the state records.
        recorded: String,
        /// What was given.
        given: String,
    },
    /// etcd data exists without node state: something else's, or a lost state.
    #[error(
        "{} exists but this node has no state: refusing to bootstrap over etcd data it did \
         not record; move it away if it is not needed",
        path.display()
    )]
    StrayEtcdData {
        /// The etcd data directory.
        path: PathBuf,
    },
    /// The shared PKI is partly present.
    #[error("the shared PKI in {} is incomplete", dir.display())]
    Pki {
        /// The PKI dir.
        dir: PathBuf,
        /// What is wrong.
        #[source]
        source: pki::PkiError,
    },
    /// A file could not be written.
    #[error("cannot {op} {}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The supervisor could not start.
    #[error(transparent)]
    Supervisor(#[from] supervisor::SupervisorError),
    /// The API kubeconfig is unusable.
    #[error("cannot use the API kubeconfig {}: {reason}", path.display())]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A first start after a join did not come up and was rolled back.
    #[error(
        "the joined etcd member did not start ({reason}); {rollback}. `stratum-server up` will explain until the journal is removed"
    )]
    RolledBack {
        /// Why.
        reason: String,
        /// What the rollback did.
        rollback: String,
    },
    /// The admin listener could not bind.
    #[error("admin listener: {0}")]
    Admin(String),
    /// Interrupted during bootstrap preparation.
    #[error("interrupted before the step \"{next}\"")]
    Cancelled {
        /// The step that did not start.
        next: Step,
    },
    /// Another command holds this node's maintenance or etcd data lock.
    #[error(transparent)]
    Lock(#[from] crate::maintenance::MaintenanceError),
}

/// What [`up`] did before shutdown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpOutcome {
    /// Ran until shutdown.
    Stopped,
}

/// Runs `up` until `shutdown`.
pub async fn up(opts: &UpOptions, shutdown: &CancellationToken) -> Result<UpOutcome, UpError> {
    let state = match NodeState::load(&opts.data_dir)? {
        Some(state) => {
            check_identity(opts, &state)?;
            info!(node = %state.node_name, origin = ?state.origin, learner = state.etcd.learner, "starting from the node state");
            state
        }
        None => {
            // Bootstrapping writes the PKI, kubeconfigs and node state: no other
            // maintenance command may run meanwhile.
            let _maintenance = crate::maintenance::NodeLock::acquire(&opts.data_dir, "up")?;
            refuse_surviving_intent(&opts.data_dir)?;
            bootstrap_node(opts, shutdown).await?
        }
    };
    run_node(
        state,
        RunOptions {
            data_dir: opts.data_dir.clone(),
            config: opts.config.clone(),
            api_kubeconfig: Some(opts.api_kubeconfig()),
            first_join_start: false,
        },
        shutdown,
    )
    .await
}

fn check_identity(opts: &UpOptions, state: &NodeState) -> Result<(), UpError> {
    if state.node_name != opts.node_name || state.node_ip != opts.node_ip {
        return Err(UpError::Mismatch {
            data_dir: opts.data_dir.clone(),
            recorded: format!("{} at {}", state.node_name, state.node_ip),
            given: format!("{} at {}", opts.node_name, opts.node_ip),
        });
    }
    Ok(())
}

/// Refuses when a join intent survives in `data_dir`, saying what happened.
pub fn refuse_surviving_intent(data_dir: &Path) -> Result<(), UpError> {
    let journal = JoinIntentJournal::new(data_dir);
    if !journal.survives().map_err(UpError::Journal)? {
        return Ok(());
    }
    let outcome = JoinOutcome::load(data_dir);
    let (member, peer_url, advice) = match journal.read().map_err(UpError::Journal)? {
        Some(i) => (
            i.member_name.clone(),
            i.peer_url.clone(),
            intent_advice(&i, outcome.as_ref()),
        ),
        None => (
            "?".into(),
            "?".into(),
            "Inspect it before removing it".into(),
        ),
    };
    Err(UpError::IntentSurvives {
        path: journal.path().to_path_buf(),
        member,
        peer_url,
        advice,
    })
}

struct BootstrapAssembly<'a> {
    opts: &'a UpOptions,
    api_server: String,
    state: Option<NodeState>,
}

impl NodeAssembly for BootstrapAssembly<'_> {
    type Error = UpError;

    async fn run(&mut self, step: Step) -> Result<(), UpError> {
        let o = self.opts;
        match step {
            Step::ResolveCluster => {
                let present = pki::SHARED_FILES
                    .iter()
                    .filter(|f| o.pki_dir.join(f).exists())
                    .count();
                if present == 0 {
                    info!(pki_dir = %o.pki_dir.display(), "generating the shared PKI");
                    pki::generate_shared(&o.pki_dir, false).map_err(|source| UpError::Pki {
                        dir: o.pki_dir.clone(),
                        source,
                    })?;
                } else {
                    pki::read_shared(&o.pki_dir).map_err(|source| UpError::Pki {
                        dir: o.pki_dir.clone(),
                        source,
                    })?;
                    info!(pki_dir = %o.pki_dir.display(), "using the shared PKI present");
                }
                Ok(())
            }
            Step::HostDirs => {
                std::fs::create_dir_all(&o.data_dir).map_err(|source| UpError::Io {
                    op: "create",
                    path: o.data_dir.clone(),
                    source,
                })?;
                use std::os::unix::fs::PermissionsExt as _;
                std::fs::set_permissions(&o.data_dir, std::fs::Permissions::from_mode(0o700))
                    .map_err(|source| UpError::Io {
                        op: "chmod",
                        path: o.data_dir.clone(),
                        source,
                    })
            }
            Step::NodeIp => Ok(()),
            Step::BeforeCerts => {
                let etcd_dir = o.data_dir.join(ETCD_DATA_DIR);
                if etcd_dir.exists() {
                    return Err(UpError::StrayEtcdData { path: etcd_dir });
                }
                Ok(())
            }
            Step::IssueCerts => {
                let mut id = pki::NodeIdentity::new(o.node_name.clone());
                id.node_ip = Some(o.node_ip);
                pki::issue_node_leaves(&o.pki_dir, &id, true).map_err(|source| UpError::Pki {
                    dir: o.pki_dir.clone(),
                    source,
                })?;
                Ok(())
            }
            Step::WriteKubeconfigs => {
                if !o.kubeconfig_dir.join("admin.conf").exists() {
                    pki::write_kubeconfigs(&o.pki_dir, &o.kubeconfig_dir, &self.api_server, false)
                        .map_err(|source| UpError::Pki {
                            dir: o.pki_dir.clone(),
                            source,
                        })?;
                }
                Ok(())
            }
            Step::BeforeRun => {
                let peer_url = https_url(o.node_ip, o.config.etcd.peer_port);
                let state = NodeState {
                    version: NODE_STATE_VERSION,
                    origin: Origin::Bootstrap,
                    node_name: o.node_name.clone(),
                    node_ip: o.node_ip,
                    pki_dir: o.pki_dir.clone(),
                    api_server: self.api_server.clone(),
                    etcd: EtcdMember {
                        name: o.node_name.clone(),
                        client_url: https_url(o.node_ip, o.config.etcd.client_port),
                        peer_url: peer_url.clone(),
                        data_dir: o.data_dir.join(ETCD_DATA_DIR),
                        initial_cluster: format!("{}={peer_url}", o.node_name),
                        initial_cluster_state: ClusterState::New,
                        member_id: None,
                        learner: false,
                    },
                    cluster_endpoints: Vec::new(),
                };
                state.save(&o.data_dir)?;
                self.state = Some(state);
                Ok(())
            }
        }
    }
}

async fn bootstrap_node(
    opts: &UpOptions,
    shutdown: &CancellationToken,
) -> Result<NodeState, UpError> {
    // The API server URL: the one the API kubeconfig reaches when it exists (the API
    // double, an API server run elsewhere), else this node's own.
    let api_server = match api_target(&opts.api_kubeconfig()).await {
        Ok((server, _)) => server,
        Err(_) => https_url(opts.node_ip, 6443),
    };
    info!(node = %opts.node_name, ip = %opts.node_ip, %api_server, "bootstrapping the first controller");
    let mut a = BootstrapAssembly {
        opts,
        api_server,
        state: None,
    };
    match assemble_node(shutdown, &mut a).await {
        Ok(()) => {}
        Err(AssemblyError::Step(e)) => return Err(e),
        Err(AssemblyError::Cancelled { next }) => return Err(UpError::Cancelled { next }),
    }
    a.state.ok_or_else(|| UpError::Io {
        op: "assemble",
        path: opts.data_dir.clone(),
        source: std::io::Error::other("the assembly produced no node state"),
    })
}

/// The server URL and CA (PEM) a kubeconfig targets.
pub async fn api_target(path: &Path) -> Result<(String, Vec<u8>), UpError> {
    let bad = |reason: String| UpError::Kubeconfig {
        path: path.to_path_buf(),
        reason,
    };
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| bad(e.to_string()))?;
    let server = config
        .cluster_url
        .to_string()
        .trim_end_matches('/')
        .to_string();
    let der = config
        .root_cert
        .as_ref()
        .and_then(|c| c.first())
        .ok_or_else(|| bad("it names no CA (certificate-authority-data)".into()))?;
    Ok((server, der_to_pem(der)))
}

fn der_to_pem(der: &[u8]) -> Vec<u8> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out.into_bytes()
}

/// How [`run_node`] runs.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The data directory.
    pub data_dir: PathBuf,
    /// Ports, binaries, timeouts.
    pub config: NodeConfig,
    /// The kubeconfig for API writes; `None` writes nothing through the API.
    pub api_kubeconfig: Option<PathBuf>,
    /// The first start right after a join: a member that does not answer within the
    /// start timeout is rolled back.
    pub first_join_start: bool,
}

/// Supervises the node in `state` until `shutdown`; see the module docs.
pub async fn run_node(
    state: NodeState,
    run: RunOptions,
    shutdown: &CancellationToken,
) -> Result<UpOutcome, UpError> {
    // Held while this process supervises etcd: a snapshot restore or rejoin refuses,
    // naming this process, instead of rewriting the data under a running member.
    let command = if run.first_join_start { "join" } else { "up" };
    let data_lock = crate::maintenance::EtcdDataLock::acquire(&run.data_dir, command)?;
    run_node_holding(state, run, data_lock, shutdown).await
}

/// [`run_node`] with the etcd data lock already held by this process (a rejoin hands over
/// the one it took, so no other command can take it between the rejoin and the run); it
/// is relabelled as this run's and held until the node stops.
pub async fn run_node_holding(
    mut state: NodeState,
    run: RunOptions,
    mut data_lock: crate::maintenance::EtcdDataLock,
    shutdown: &CancellationToken,
) -> Result<UpOutcome, UpError> {
    let command = if run.first_join_start { "join" } else { "up" };
    data_lock.hand_over(command)?;
    let _data_lock = data_lock;
    let sup = Supervisor::start(
        supervisor::components(&state, &run.config),
        &run.data_dir.join("logs"),
        Backoff::default(),
    )?;
    let etcd_opts = etcd_options(&state.pki_dir);
    let front_status = crate::front::FrontStatusHandle::default();
    let admin_stop = shutdown.child_token();
    let admin_task = match &run.config.admin_listen {
        Some(addr) => {
            let listener = daemon::AdminServer::bind(addr)
                .await
                .map_err(|e| UpError::Admin(e.to_string()))?;
            Some(tokio::spawn(
                admin_server(&sup, &state, front_status.clone())
                    .serve(listener, admin_stop.clone()),
            ))
        }
        None => None,
    };
    // Wait for the local member.
    let deadline = tokio::time::Instant::now() + run.config.etcd.start_timeout;
    loop {
        let answer = etcd::etcd_member_status(&etcd_opts, &state.etcd.client_url).await;
        if answer.error.is_none() && answer.leader.is_some() {
            info!(member = %state.etcd.name, learner = answer.is_learner, "local etcd member answers");
            break;
        }
        if shutdown.is_cancelled() {
            sup.stop().await;
            return Ok(UpOutcome::Stopped);
        }
        if run.first_join_start && tokio::time::Instant::now() >= deadline {
            let reason = format!(
                "it did not answer within {:?} (last: {}; log: {})",
                run.config.etcd.start_timeout,
                answer.error.unwrap_or_else(|| "no leader".into()),
                run.data_dir.join("logs/etcd.log").display()
            );
            sup.stop().await;
            let rollback = join::rollback(&run.data_dir, &state, &reason).await;
            return Err(UpError::RolledBack { reason, rollback });
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = shutdown.cancelled() => {}
        }
    }
    // The member runs on its own data now: the intent has done its work.
    let journal = JoinIntentJournal::new(&run.data_dir);
    if matches!(journal.survives(), Ok(true)) {
        if let Err(e) = journal.clear() {
            warn!("{}", crate::error_chain(&e));
        } else {
            info!("join intent cleared: the local member's data is confirmed");
        }
    }
    // The per-node HAProxy, when configured: it follows the member list until shutdown.
    let front_task = run.config.front.as_ref().map(|fc| {
        let stop = shutdown.child_token();
        crate::front::spawn_for_node(&state, &run.data_dir, fc, stop, front_status.clone())
    });
    let mut promoted_now = None;
    if state.etcd.learner {
        let id = state.etcd.member_id.unwrap_or(0);
        let endpoints = state.endpoints();
        // Keep trying until promoted or shut down: a learner that cannot catch up within
        // one deadline (a slow disk, a busy leader) may well catch up in the next.
        loop {
            let promote = learner::promote_when_caught_up(
                &etcd_opts,
                &endpoints,
                id,
                &state.etcd.peer_url,
                run.config.etcd.promote_timeout,
            );
            let result = tokio::select! {
                r = promote => r,
                _ = shutdown.cancelled() => break,
            };
            match result {
                Ok(attempts) => {
                    state.etcd.learner = false;
                    state.save(&run.data_dir)?;
                    promoted_now = Some(attempts);
                    break;
                }
                Err(e) => {
                    warn!("{e}; trying again");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                        _ = shutdown.cancelled() => break,
                    }
                }
            }
        }
    }
    if let Some(kubeconfig) = &run.api_kubeconfig
        && !shutdown.is_cancelled()
    {
        publish(&state, kubeconfig, promoted_now, shutdown).await;
    }
    shutdown.cancelled().await;
    info!("shutting down: stopping components in reverse start order");
    if let Some(task) = front_task {
        let _ = task.await;
    }
    sup.stop().await;
    admin_stop.cancel();
    if let Some(task) = admin_task {
        let _ = task.await;
    }
    Ok(UpOutcome::Stopped)
}

/// The front's counters as metrics: `stratum_front_reloads`, `stratum_front_failures`,
/// `stratum_front_backends` (zero, and never started, on a node without a front).
#[derive(Debug)]
struct FrontMetrics(crate::front::FrontStatusHandle);

impl prometheus_client::collector::Collector for FrontMetrics {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric as _;
        use prometheus_client::metrics::{counter::ConstCounter, gauge::ConstGauge};
        let f = self.0.lock().map(|f| f.clone()).unwrap_or_default();
        let reloads = ConstCounter::new(f.reloads);
        reloads.encode(encoder.encode_descriptor(
            "front_reloads",
            "HAProxy reloads after a member-list change",
            None,
            reloads.metric_type(),
        )?)?;
        let failures = ConstCounter::new(f.failures);
        failures.encode(encoder.encode_descriptor(
            "front_failures",
            "Front configurations not installed (refused by haproxy -c, or no member list)",
            None,
            failures.metric_type(),
        )?)?;
        let backends = ConstGauge::new(i64::try_from(f.backends).unwrap_or(i64::MAX));
        backends.encode(encoder.encode_descriptor(
            "front_backends",
            "API servers in the installed front configuration",
            None,
            backends.metric_type(),
        )?)?;
        Ok(())
    }
}

/// `/metrics` (`stratum_component_starts{component}`, `stratum_component_running{component}`)
/// and `/status` (node, member, learner, every child) for a running node.
fn admin_server(
    sup: &Supervisor,
    state: &NodeState,
    front: crate::front::FrontStatusHandle,
) -> daemon::AdminServer {
    use prometheus_client::collector::Collector;
    use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
    use prometheus_client::metrics::gauge::ConstGauge;

    struct Children<F>(F);
    impl<F> std::fmt::Debug for Children<F> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Children")
        }
    }
    impl<F: Fn() -> Vec<supervisor::ComponentStatus> + Send + Sync + 'static> Collector
        for Children<F>
    {
        fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            let status = (self.0)();
            for (name, help, value) in [
                (
                    "component_starts",
                    "Times each supervised component was started",
                    0usize,
                ),
                (
                    "component_running",
                    "1 while the supervised component runs",
                    1usize,
                ),
            ] {
                let mut metric = encoder.encode_descriptor(
                    name,
                    help,
                    None,
                    prometheus_client::metrics::MetricType::Gauge,
                )?;
                for c in &status {
                    let v = if value == 0 {
                        i64::from(c.starts)
                    } else {
                        i64::from(c.pid.is_some())
                    };
                    let labels = [("component".to_string(), c.name.clone())];
                    ConstGauge::new(v).encode(metric.encode_family(&labels)?)?;
                }
            }
            Ok(())
        }
    }

    let mut registry = prometheus_client::registry::Registry::with_prefix("stratum");
    registry.register_collector(Box::new(Children(sup.status_reader())));
    registry.register_collector(Box::new(FrontMetrics(front.clone())));
    let read = sup.status_reader();
    let (node, member, learner) = (
        state.node_name.clone(),
        state.etcd.client_url.clone(),
        state.etcd.learner,
    );
    daemon::AdminServer::new(registry).with_status(move || {
        let front = front.lock().map(|f| f.clone()).unwrap_or_default();
        serde_json::json!({"node": node, "etcdClientURL": member, "learnerAtStart": learner, "components": read(), "front": front})
    })
}

/// API-side effects after the member runs, best effort (logged, retried a few times): the
/// first controller's bootstrap objects, a joined member's endpoint and Event.
async fn publish(
    state: &NodeState,
    kubeconfig: &Path,
    promoted_now: Option<u32>,
    shutdown: &CancellationToken,
) {
    let client = match crate::grants::client_from_kubeconfig(kubeconfig).await {
        Ok(c) => c,
        Err(e) => {
            warn!("no API writes: {}", crate::error_chain(&e));
            return;
        }
    };
    let mut pause = Duration::from_millis(500);
    for attempt in 1..=8 {
        let result = match state.origin {
            Origin::Bootstrap => match api_target(kubeconfig).await {
                Ok((server, ca)) => {
                    bootstrap::ensure_cluster_objects(&client, &server, &ca, &state.etcd.client_url)
                        .await
                        .map(|n| info!(written = n, "bootstrap objects in place"))
                        .map_err(|e| crate::error_chain(&e))
                }
                Err(e) => Err(crate::error_chain(&e)),
            },
            Origin::Join => bootstrap::add_etcd_endpoint(&client, &state.etcd.client_url)
                .await
                .map(|_| ())
                .map_err(|e| crate::error_chain(&e)),
        };
        match result {
            Ok(()) => break,
            Err(e) if attempt < 8 => {
                warn!("API write failed ({e}); retrying in {pause:?}");
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = shutdown.cancelled() => return,
                }
                pause = (pause * 2).min(Duration::from_secs(10));
            }
            Err(e) => warn!("API write failed, giving up: {e}"),
        }
    }
    if let Some(attempts) = promoted_now {
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: "stratum-server".into(),
                instance: Some(state.node_name.clone()),
            },
        );
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(state.node_name.clone()),
            ..Default::default()
        };
        let event = Event {
            type_: EventType::Normal,
            reason: "ControlPlaneJoined".into(),
            note: Some(format!(
                "etcd member {} ({}) joined as a learner and was promoted to a voting member \
                 ({attempts} promote attempt(s))",
                state.etcd.name, state.etcd.peer_url
            )),
            action: "JoinControlPlane".into(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&event, &reference).await {
            warn!("cannot record the join Event: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_metrics_follow_the_front_status() {
        let status = crate::front::FrontStatusHandle::default();
        if let Ok(mut s) = status.lock() {
            s.reloads = 2;
            s.failures = 1;
            s.backends = 3;
        }
        let mut registry = prometheus_client::registry::Registry::with_prefix("stratum");
        registry.register_collector(Box::new(FrontMetrics(status)));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for want in [
            "stratum_front_reloads_total 2",
            "stratum_front_failures_total 1",
            "stratum_front_backends 3",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }
}
