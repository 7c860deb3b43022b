//! Runs a control plane's components as children: etcd first, then each configured
//! component, with flags rendered from the node state. A child that exits is restarted
//! with exponential backoff (reset once it has run for a while); on shutdown the children
//! are stopped in reverse start order, each with SIGTERM and, after a grace period,
//! SIGKILL, so the API server never outlives the etcd it writes to.
//!
//! Each child's output goes to `<data-dir>/logs/<name>.log` (appended).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::nodestate::{NodeConfig, NodeState};

/// One child to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Component {
    /// Its name (logs, status, stop order).
    pub name: String,
    /// The binary.
    pub binary: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
}

/// etcd's flags for `state` (pure): the member's name, data directory, URLs, the cluster
/// it boots into, and mTLS for clients and peers from the node's PKI.
pub fn etcd_args(state: &NodeState) -> Vec<String> {
    let e = &state.etcd;
    let pki = &state.pki_dir;
    let p = |rel: &str| pki.join(rel).display().to_string();
    vec![
        format!("--name={}", e.name),
        format!("--data-dir={}", e.data_dir.display()),
        format!("--listen-client-urls={}", e.client_url),
        format!("--advertise-client-urls={}", e.client_url),
        format!("--listen-peer-urls={}", e.peer_url),
        format!("--initial-advertise-peer-urls={}", e.peer_url),
        format!("--initial-cluster={}", e.initial_cluster),
        format!(
            "--initial-cluster-state={}",
            e.initial_cluster_state.as_flag()
        ),
        "--initial-cluster-token=stratum".into(),
        format!("--cert-file={}", p("etcd/server.crt")),
        format!("--key-file={}", p("etcd/server.key")),
        format!("--trusted-ca-file={}", p("etcd/ca.crt")),
        "--client-cert-auth=true".into(),
        format!("--peer-cert-file={}", p("etcd/peer.crt")),
        format!("--peer-key-file={}", p("etcd/peer.key")),
        format!("--peer-trusted-ca-file={}", p("etcd/ca.crt")),
        "--peer-client-cert-auth=true".into(),
        "--strict-reconfig-check=true".into(),
        "--logger=zap".into(),
        "--log-outputs=stderr".into(),
    ]
}

/// Every component of `state` under `config`, in start order: etcd, then the configured
/// components with their placeholders filled in.
pub fn components(state: &NodeState, config: &NodeConfig) -> Vec<Component> {
    let mut out = vec![Component {
        name: "etcd".into(),
        binary: config.etcd.binary.clone(),
        args: etcd_args(state),
    }];
    for c in &config.components {
        let args = c
            .args
            .iter()
            .map(|a| {
                a.replace("{nodeIP}", &state.node_ip.to_string())
                    .replace("{nodeName}", &state.node_name)
                    .replace("{pkiDir}", &state.pki_dir.display().to_string())
                    .replace("{etcdClientURL}", &state.etcd.client_url)
            })
            .collect();
        out.push(Component {
            name: c.name.clone(),
            binary: c.binary.clone(),
            args,
        });
    }
    out
}

/// How restarts back off.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// First pause after an exit.
    pub initial: Duration,
    /// Longest pause.
    pub max: Duration,
    /// A child that ran this long resets the pause.
    pub reset_after: Duration,
    /// How long a child has after SIGTERM before SIGKILL.
    pub grace: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(30),
            reset_after: Duration::from_secs(60),
            grace: Duration::from_secs(10),
        }
    }
}

/// One child's state, for `/status` and logs.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ComponentStatus {
    /// The component.
    pub name: String,
    /// Its process ID while it runs.
    pub pid: Option<u32>,
    /// How many times it was (re)started.
    pub starts: u32,
    /// How the last run ended, if one did.
    pub last_exit: Option<String>,
}

/// A supervisor that could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot create the log directory {path}")]
pub struct SupervisorError {
    /// The directory.
    pub path: PathBuf,
    /// The OS error.
    #[source]
    pub source: std::io::Error,
}

/// A signal that could not be sent to a child.
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    /// No child has that name.
    #[error("no supervised component is named {name}")]
    Unknown {
        /// The name asked for.
        name: String,
    },
    /// The child is between runs (exited, waiting to restart).
    #[error("component {name} is not running (it is being restarted)")]
    NotRunning {
        /// The component.
        name: String,
    },
    /// kill(2) failed.
    #[error("cannot signal component {name} (pid {pid})")]
    Send {
        /// The component.
        name: String,
        /// Its process ID.
        pid: u32,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Running children. Drop without [`Supervisor::stop`] kills them (kill-on-drop).
#[derive(Debug)]
pub struct Supervisor {
    tasks: Vec<(String, watch::Sender<bool>, JoinHandle<()>)>,
    status: Arc<Mutex<Vec<ComponentStatus>>>,
}

impl Supervisor {
    /// Starts `components` in order, logging to `<log_dir>/<name>.log`.
    pub fn start(
        components: Vec<Component>,
        log_dir: &Path,
        backoff: Backoff,
    ) -> Result<Supervisor, SupervisorError> {
        std::fs::create_dir_all(log_dir).map_err(|source| SupervisorError {
            path: log_dir.to_path_buf(),
            source,
        })?;
        let status = Arc::new(Mutex::new(
            components
                .iter()
                .map(|c| ComponentStatus {
                    name: c.name.clone(),
                    ..Default::default()
                })
                .collect::<Vec<_>>(),
        ));
        let mut tasks = Vec::new();
        for (i, c) in components.into_iter().enumerate() {
            let (stop_tx, stop_rx) = watch::channel(false);
            let log = log_dir.join(format!("{}.log", c.name));
            let name = c.name.clone();
            let status = status.clone();
            let handle = tokio::spawn(run_component(c, log, backoff, stop_rx, status, i));
            tasks.push((name, stop_tx, handle));
        }
        Ok(Supervisor { tasks, status })
    }

    /// Every child's current state.
    pub fn status(&self) -> Vec<ComponentStatus> {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// A cloneable reader of [`Supervisor::status`], for an admin listener.
    pub fn status_reader(&self) -> impl Fn() -> Vec<ComponentStatus> + Send + Sync + 'static {
        let status = self.status.clone();
        move || status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Sends `signal` to the running child `name` (a reload: HAProxy's master re-reads its
    /// configuration on SIGUSR2 and keeps serving). Returns the process ID signalled.
    pub fn signal(&self, name: &str, signal: nix::sys::signal::Signal) -> Result<u32, SignalError> {
        let pid = self
            .status()
            .into_iter()
            .find(|c| c.name == name)
            .ok_or_else(|| SignalError::Unknown {
                name: name.to_string(),
            })?
            .pid
            .ok_or_else(|| SignalError::NotRunning {
                name: name.to_string(),
            })?;
        let raw = i32::try_from(pid).map_err(|_| SignalError::NotRunning {
            name: name.to_string(),
        })?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), signal).map_err(|e| {
            SignalError::Send {
                name: name.to_string(),
                pid,
                source: std::io::Error::from(e),
            }
        })?;
        Ok(pid)
    }

    /// Stops the children in reverse start order, waiting for each before the next.
    pub async fn stop(self) {
        for (name, stop, handle) in self.tasks.into_iter().rev() {
            let _ = stop.send(true);
            if let Err(e) = handle.await {
                warn!(component = %name, "supervision task failed: {e}");
            }
            info!(component = %name, "stopped");
        }
    }
}

fn set_status(
    status: &Mutex<Vec<ComponentStatus>>,
    i: usize,
    f: impl FnOnce(&mut ComponentStatus),
) {
    if let Ok(mut s) = status.lock()
        && let Some(entry) = s.get_mut(i)
    {
        f(entry);
    }
}

fn spawn(c: &Component, log: &Path) -> std::io::Result<Child> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    let err = out.try_clone()?;
    Command::new(&c.binary)
        .args(&c.args)
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true)
        .spawn()
}

async fn run_component(
    c: Component,
    log: PathBuf,
    backoff: Backoff,
    mut stop: watch::Receiver<bool>,
    status: Arc<Mutex<Vec<ComponentStatus>>>,
    index: usize,
) {
    let mut pause = backoff.initial;
    loop {
        if *stop.borrow() {
            return;
        }
        let started = tokio::time::Instant::now();
        let exit = match spawn(&c, &log) {
            Ok(mut child) => {
                let pid = child.id();
                set_status(&status, index, |s| {
                    s.pid = pid;
                    s.starts += 1;
                });
                info!(component = %c.name, pid = ?pid, binary = %c.binary.display(), log = %log.display(), "started");
                tokio::select! {
                    r = child.wait() => match r {
                        Ok(st) => format!("exited ({st})"),
                        Err(e) => format!("wait failed: {e}"),
                    },
                    _ = stop.changed() => {
                        terminate(&c.name, &mut child, backoff.grace).await;
                        set_status(&status, index, |s| {
                            s.pid = None;
                            s.last_exit = Some("stopped".into());
                        });
                        return;
                    }
                }
            }
            Err(e) => format!("cannot start {}: {e}", c.binary.display()),
        };
        set_status(&status, index, |s| {
            s.pid = None;
            s.last_exit = Some(exit.clone());
        });
        if started.elapsed() >= backoff.reset_after {
            pause = backoff.initial;
        }
        warn!(component = %c.name, "{exit}; restarting in {pause:?} (log: {})", log.display());
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stop.changed() => return,
        }
        pause = (pause * 2).min(backoff.max);
    }
}

/// SIGTERM, then SIGKILL after `grace`.
async fn terminate(name: &str, child: &mut Child, grace: Duration) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(_) => {}
        Err(_) => {
            warn!(component = %name, "did not stop within {grace:?} of SIGTERM; killing it");
            let _ = child.kill().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodestate::{ClusterState, EtcdMember, NODE_STATE_VERSION, Origin};

    fn state() -> NodeState {
        NodeState {
            version: NODE_STATE_VERSION,
            origin: Origin::Bootstrap,
            node_name: "cp1".into(),
            node_ip: "10.0.0.1".parse().unwrap(),
            pki_dir: "/pki".into(),
            api_server: "https://10.0.0.1:6443".into(),
            etcd: EtcdMember {
                name: "cp1".into(),
                client_url: "https://10.0.0.1:2379".into(),
                peer_url: "https://10.0.0.1:2380".into(),
                data_dir: "/data/etcd".into(),
                initial_cluster: "cp1=https://10.0.0.1:2380".into(),
                initial_cluster_state: ClusterState::New,
                member_id: None,
                learner: false,
            },
            cluster_endpoints: vec![],
        }
    }

    #[test]
    fn etcd_flags_come_from_the_state() {
        let args = etcd_args(&state());
        for want in [
            "--name=cp1",
            "--listen-client-urls=https://10.0.0.1:2379",
            "--initial-cluster-state=new",
            "--initial-cluster=cp1=https://10.0.0.1:2380",
            "--peer-trusted-ca-file=/pki/etcd/ca.crt",
            "--client-cert-auth=true",
        ] {
            assert!(args.iter().any(|a| a == want), "missing {want}: {args:?}");
        }
    }

    #[test]
    fn configured_components_follow_etcd_with_placeholders_filled() {
        let config = NodeConfig {
            components: vec![crate::nodestate::ComponentConfig {
                name: "kube-apiserver".into(),
                binary: "/usr/bin/kube-apiserver".into(),
                args: vec![
                    "--etcd-servers={etcdClientURL}".into(),
                    "--advertise-address={nodeIP}".into(),
                ],
            }],
            ..Default::default()
        };
        let cs = components(&state(), &config);
        assert_eq!(cs[0].name, "etcd");
        assert_eq!(
            cs[1].args,
            vec![
                "--etcd-servers=https://10.0.0.1:2379",
                "--advertise-address=10.0.0.1"
            ]
        );
    }

    #[tokio::test]
    async fn a_child_that_exits_is_restarted_and_stop_ends_it() {
        let dir = tempfile::tempdir().unwrap();
        let c = Component {
            name: "flaky".into(),
            binary: "/bin/sh".into(),
            args: vec!["-c".into(), "exit 3".into()],
        };
        let backoff = Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(20),
            ..Default::default()
        };
        let sup = Supervisor::start(vec![c], dir.path(), backoff).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while sup.status()[0].starts < 3 {
            assert!(tokio::time::Instant::now() < deadline, "{:?}", sup.status());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            sup.status()[0]
                .last_exit
                .as_deref()
                .unwrap_or("")
                .contains("exit status: 3")
        );
        sup.stop().await;
    }

    #[tokio::test]
    async fn stop_terminates_in_reverse_order() {
        let dir = tempfile::tempdir().unwrap();
        let order = dir.path().join("order");
        let mk = |name: &str| Component {
            name: name.into(),
            binary: "/bin/sh".into(),
            args: vec![
                "-c".into(),
                format!(
                    "trap 'echo {name} >> {}; exit 0' TERM; touch {}/{name}.ready; while :; do sleep 0.05; done",
                    order.display(),
                    dir.path().display()
                ),
            ],
        };
        let sup = Supervisor::start(
            vec![mk("etcd"), mk("apiserver")],
            dir.path(),
            Backoff::default(),
        )
        .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        // Each shell marks itself ready once its trap is installed.
        while !(dir.path().join("etcd.ready").exists()
            && dir.path().join("apiserver.ready").exists())
        {
            assert!(tokio::time::Instant::now() < deadline, "{:?}", sup.status());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        sup.stop().await;
        assert_eq!(
            std::fs::read_to_string(&order).unwrap(),
            "apiserver\netcd\n"
        );
    }
}
