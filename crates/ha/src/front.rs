//! The front of the control plane on one node: a per-node HAProxy spreading API clients
//! over every API server of the member list, and the kube-vip static pod that holds the
//! cluster VIP. The rendering is pure ([`hacore::front`], re-exported as [`render`]); this
//! module reads the member list, checks a configuration with `haproxy -c`, installs it,
//! and reloads the HAProxy the [`crate::supervisor`] runs.
//!
//! Safety rule: a configuration that `haproxy -c` refuses never replaces the file a running
//! HAProxy reads. A candidate is written beside the live file, checked, and only then
//! renamed over it ([`install`]); a refused one is removed and the live file is untouched.
//! HAProxy runs in master-worker mode (`-W`): on SIGUSR2 the master re-reads the file and
//! starts new workers, and the old workers keep serving their open connections (a watch
//! stays up) until they end or `hard-stop-after` passes ([`Front::sync`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::{info, warn};

use crate::etcd::{self, EtcdError, EtcdOptions};
use crate::supervisor::{Component, SignalError, Supervisor};

/// The pure rendering: specs, backends, the HAProxy and kube-vip renderers.
pub use hacore::front as render;
pub use hacore::front::{Backend, FrontError, FrontSpec, KubeVipSpec};

/// The supervised component's name.
pub const HAPROXY_COMPONENT: &str = "haproxy";
/// The HAProxy binary used unless told otherwise (looked up on PATH).
pub const HAPROXY_BINARY: &str = "haproxy";

/// A front operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum FrontIoError {
    /// A value the renderer refused.
    #[error(transparent)]
    Render(#[from] FrontError),
    /// The member list could not be read.
    #[error("cannot read the member list to render the front from")]
    Members(#[source] EtcdError),
    /// `haproxy -c` could not be run at all.
    #[error("cannot run {} -c (install the haproxy package, or pass its path)", binary.display())]
    NoHaproxy {
        /// The binary tried.
        binary: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `haproxy -c` refused the configuration.
    #[error("haproxy -c refused {}: {output}", path.display())]
    Invalid {
        /// The file checked.
        path: PathBuf,
        /// What HAProxy printed (its alerts).
        output: String,
    },
    /// A file could not be written or read.
    #[error(transparent)]
    Fs(#[from] common::fsutil::FsError),
    /// The kube-vip manifest could not be serialized.
    #[error("cannot serialize the kube-vip manifest: {0}")]
    Manifest(String),
    /// The running HAProxy could not be told to reload.
    #[error("the new configuration is installed but HAProxy was not reloaded")]
    Reload(#[source] SignalError),
}

/// What `haproxy -c` said about a valid file: its warnings, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckOutput {
    /// HAProxy's output (notices and warnings).
    pub output: String,
}

/// Runs `haproxy -c -f path`: `Ok` when HAProxy accepts the file, [`FrontIoError::Invalid`]
/// with its alerts otherwise.
pub async fn check_config(haproxy: &Path, path: &Path) -> Result<CheckOutput, FrontIoError> {
    let out = tokio::process::Command::new(haproxy)
        .arg("-c")
        .arg("-f")
        .arg(path)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|source| FrontIoError::NoHaproxy {
            binary: haproxy.to_path_buf(),
            source,
        })?;
    let mut output = String::from_utf8_lossy(&out.stdout).into_owned();
    output.push_str(&String::from_utf8_lossy(&out.stderr));
    // The notices name HAProxy's version and path on every run: keep what matters.
    let output = output
        .lines()
        .filter(|l| !l.contains("haproxy version is") && !l.contains("path to executable"))
        .collect::<Vec<_>>()
        .join("\n");
    if out.status.success() {
        Ok(CheckOutput { output })
    } else {
        Err(FrontIoError::Invalid {
            path: path.to_path_buf(),
            output,
        })
    }
}

/// Writes a rendered file (a configuration, a manifest) atomically, 0644.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), FrontIoError> {
    Ok(common::fsutil::write_atomic(path, bytes, 0o644, None)?)
}

/// Checks `text` with `haproxy -c` from a private temporary file (removed afterwards).
pub async fn check_text(haproxy: &Path, text: &str) -> Result<CheckOutput, FrontIoError> {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!(
        "stratum-front-check.{}.{}.cfg",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    common::fsutil::write_atomic(&path, text.as_bytes(), 0o600, None)?;
    let result = check_config(haproxy, &path).await;
    let _ = common::fsutil::remove_file_synced(&path);
    result
}

/// What [`install`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    /// The live file already held these bytes: nothing was written.
    Unchanged,
    /// The checked configuration replaced the live file.
    Replaced,
}

fn candidate_path(live: &Path) -> PathBuf {
    let mut name = live
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".candidate");
    live.with_file_name(name)
}

/// Installs `text` at `live` only if `haproxy -c` accepts it: written to a candidate file
/// beside it first, checked, then atomically renamed into place. A refused candidate is
/// removed and the live file keeps its bytes. An unchanged text writes nothing.
pub async fn install(haproxy: &Path, live: &Path, text: &str) -> Result<Installed, FrontIoError> {
    if let Ok(current) = std::fs::read(live)
        && current == text.as_bytes()
    {
        return Ok(Installed::Unchanged);
    }
    let candidate = candidate_path(live);
    common::fsutil::write_atomic(&candidate, text.as_bytes(), 0o644, None)?;
    if let Err(e) = check_config(haproxy, &candidate).await {
        let _ = common::fsutil::remove_file_synced(&candidate);
        return Err(e);
    }
    common::fsutil::write_atomic(live, text.as_bytes(), 0o644, None)?;
    let _ = common::fsutil::remove_file_synced(&candidate);
    Ok(Installed::Replaced)
}

/// The member hosts, one per member ([`etcd::member_hosts_via`]: the first non-loopback
/// client URL's host, else the peer URL's), as API server backends on `api_port`.
pub async fn backends_from_members(
    opts: &EtcdOptions,
    endpoints: &[String],
    api_port: u16,
) -> Result<Vec<Backend>, FrontIoError> {
    let hosts = etcd::member_hosts_via(opts, endpoints)
        .await
        .map_err(FrontIoError::Members)?;
    Ok(render::backends_for_hosts(&hosts, api_port)?)
}

/// The supervised HAProxy: master-worker mode (`-W`, reload on SIGUSR2), in the foreground
/// (`-db`), reading `config`.
pub fn haproxy_component(haproxy: &Path, config: &Path) -> Component {
    Component {
        name: HAPROXY_COMPONENT.into(),
        binary: haproxy.to_path_buf(),
        args: vec![
            "-W".into(),
            "-db".into(),
            "-f".into(),
            config.display().to_string(),
        ],
    }
}

/// What one [`Front::sync`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncOutcome {
    /// The member list renders the configuration already installed: nothing was done.
    Unchanged,
    /// A new configuration was installed and the running HAProxy told to reload.
    Reloaded {
        /// The master's process ID.
        pid: u32,
    },
}

/// A node's front: where its configuration lives and which HAProxy runs it.
#[derive(Debug, Clone)]
pub struct Front {
    /// The HAProxy binary.
    pub haproxy: PathBuf,
    /// The live configuration file.
    pub config: PathBuf,
}

impl Front {
    /// Renders `spec`, installs it if HAProxy accepts it and it changed, and reloads the
    /// HAProxy `sup` runs. A refused configuration changes nothing: the running HAProxy
    /// keeps its last good one, and the error names what HAProxy said.
    pub async fn sync(
        &self,
        sup: &Supervisor,
        spec: &FrontSpec,
    ) -> Result<SyncOutcome, FrontIoError> {
        let text = render::render_haproxy(spec)?;
        match install(&self.haproxy, &self.config, &text).await? {
            Installed::Unchanged => Ok(SyncOutcome::Unchanged),
            Installed::Replaced => {
                let pid = sup
                    .signal(HAPROXY_COMPONENT, nix::sys::signal::Signal::SIGUSR2)
                    .map_err(FrontIoError::Reload)?;
                info!(config = %self.config.display(), pid, servers = spec.backends.len(), "front configuration changed; HAProxy reloading");
                Ok(SyncOutcome::Reloaded { pid })
            }
        }
    }

    /// Installs the first configuration before HAProxy starts (a missing or refused one
    /// is an error: there is nothing good to run).
    pub async fn prepare(&self, spec: &FrontSpec) -> Result<Installed, FrontIoError> {
        let text = render::render_haproxy(spec)?;
        install(&self.haproxy, &self.config, &text).await
    }
}

/// What a node's front has done, for the admin listener (`/metrics`, `/status`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct FrontStatus {
    /// Whether HAProxy was started.
    pub started: bool,
    /// API servers in the configuration installed last.
    pub backends: usize,
    /// Reloads after a member-list change.
    pub reloads: u64,
    /// Configurations not installed (HAProxy refused them, or the member list could not
    /// be read or rendered).
    pub failures: u64,
    /// The last failure, if any.
    pub last_error: Option<String>,
}

/// A shared [`FrontStatus`].
pub type FrontStatusHandle = std::sync::Arc<std::sync::Mutex<FrontStatus>>;

fn record(status: Option<&FrontStatusHandle>, f: impl FnOnce(&mut FrontStatus)) {
    if let Some(s) = status
        && let Ok(mut s) = s.lock()
    {
        f(&mut s);
    }
}

/// How [`run_front`] follows the member list.
#[derive(Debug, Clone)]
pub struct FrontLoop {
    /// Where to read the member list.
    pub endpoints: Vec<String>,
    /// How to reach etcd.
    pub etcd: EtcdOptions,
    /// The API servers' port.
    pub api_port: u16,
    /// Where HAProxy listens.
    pub listen: SocketAddr,
    /// The cluster CA file the health checks verify with.
    pub ca_file: PathBuf,
    /// How often the member list is read.
    pub interval: Duration,
}

/// Follows the member list until `stop`: every interval, renders the front from the
/// members and [`Front::sync`]s it. A member list that cannot be read, or a configuration
/// HAProxy refuses, is logged and the running configuration kept.
pub async fn run_front(
    front: &Front,
    sup: &Supervisor,
    l: &FrontLoop,
    stop: &tokio_util::sync::CancellationToken,
    status: Option<&FrontStatusHandle>,
) {
    loop {
        let result = match backends_from_members(&l.etcd, &l.endpoints, l.api_port).await {
            Ok(backends) => {
                let mut spec = FrontSpec::new(backends, &l.ca_file);
                spec.listen = l.listen;
                front
                    .sync(sup, &spec)
                    .await
                    .map(|o| (o, spec.backends.len()))
            }
            Err(e) => Err(e),
        };
        match result {
            Ok((outcome, n)) => record(status, |s| {
                s.backends = n;
                if matches!(outcome, SyncOutcome::Reloaded { .. }) {
                    s.reloads += 1;
                }
            }),
            Err(e) => {
                let text = crate::error_chain(&e);
                warn!("front not updated, the running configuration is kept: {text}");
                record(status, |s| {
                    s.failures += 1;
                    s.last_error = Some(text);
                });
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(l.interval) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// The front of a running node (`up` with a `front` section): waits until the member list
/// renders a configuration HAProxy accepts (`<data-dir>/haproxy.cfg`), starts HAProxy
/// under its own supervisor (logs in `<data-dir>/logs/haproxy.log`), follows the member
/// list, and stops HAProxy when `stop` is cancelled.
pub fn spawn_for_node(
    state: &crate::nodestate::NodeState,
    data_dir: &Path,
    fc: &crate::nodestate::FrontConfig,
    stop: tokio_util::sync::CancellationToken,
    status: FrontStatusHandle,
) -> tokio::task::JoinHandle<()> {
    let front = Front {
        haproxy: fc.haproxy.clone(),
        config: data_dir.join("haproxy.cfg"),
    };
    let logs = data_dir.join("logs");
    let listen = fc.listen.parse::<SocketAddr>();
    let l = listen.as_ref().ok().map(|listen| FrontLoop {
        endpoints: state.endpoints(),
        etcd: crate::join::etcd_options(&state.pki_dir),
        api_port: fc.api_port,
        listen: *listen,
        ca_file: state.pki_dir.join("ca.crt"),
        interval: fc.interval,
    });
    let listen_text = fc.listen.clone();
    tokio::spawn(async move {
        let Some(l) = l else {
            warn!("front not started: listen address {listen_text:?} is not IP:PORT");
            return;
        };
        loop {
            let ready = match backends_from_members(&l.etcd, &l.endpoints, l.api_port).await {
                Ok(backends) => {
                    let mut spec = FrontSpec::new(backends, &l.ca_file);
                    spec.listen = l.listen;
                    let n = spec.backends.len();
                    front.prepare(&spec).await.map(|_| n)
                }
                Err(e) => Err(e),
            };
            match ready {
                Ok(n) => {
                    record(Some(&status), |s| s.backends = n);
                    break;
                }
                Err(e) => {
                    let text = crate::error_chain(&e);
                    warn!("front not started yet: {text}");
                    record(Some(&status), |s| {
                        s.failures += 1;
                        s.last_error = Some(text);
                    });
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(l.interval) => {}
                _ = stop.cancelled() => return,
            }
        }
        let sup = match Supervisor::start(
            vec![haproxy_component(&front.haproxy, &front.config)],
            &logs,
            crate::supervisor::Backoff::default(),
        ) {
            Ok(s) => s,
            Err(e) => {
                warn!("front not started: {}", crate::error_chain(&e));
                return;
            }
        };
        info!(listen = %l.listen, config = %front.config.display(), "front (HAProxy) started");
        record(Some(&status), |s| s.started = true);
        run_front(&front, &sup, &l, &stop, Some(&status)).await;
        sup.stop().await;
        wait_released(l.listen).await;
    })
}

/// After HAProxy's master exited: its worker, no child of ours, may still hold the listening
/// socket for a moment. Waits (up to 5 s) until nothing accepts on `listen`, so a stopped
/// node has stopped serving when this returns; warns if something still does.
async fn wait_released(listen: SocketAddr) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let open = matches!(
            tokio::time::timeout(
                Duration::from_millis(200),
                tokio::net::TcpStream::connect(listen)
            )
            .await,
            Ok(Ok(_))
        );
        if !open {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            warn!(%listen, "the front's listen address still accepts connections 5 s after HAProxy stopped");
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The kube-vip static pod manifest (YAML) for `spec`: the typed Pod serialized (its
/// serde form carries `apiVersion: v1` and `kind: Pod`).
pub fn kube_vip_manifest(spec: &KubeVipSpec) -> Result<String, FrontIoError> {
    let pod = render::kube_vip_pod(spec)?;
    serde_yaml::to_string(&pod).map_err(|e| FrontIoError::Manifest(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidate_sits_beside_the_live_file() {
        assert_eq!(
            candidate_path(Path::new("/etc/stratum/haproxy.cfg")),
            PathBuf::from("/etc/stratum/haproxy.cfg.candidate")
        );
    }

    #[test]
    fn haproxy_runs_master_worker_in_the_foreground() {
        let c = haproxy_component(Path::new("/usr/sbin/haproxy"), Path::new("/x/h.cfg"));
        assert_eq!(c.args, vec!["-W", "-db", "-f", "/x/h.cfg"]);
    }

    #[test]
    fn kube_vip_manifest_is_a_pod_document() {
        let text = kube_vip_manifest(&KubeVipSpec {
            vip: "10.0.0.100".parse().unwrap(),
            interface: "eth0".into(),
            port: 6443,
            image: render::KUBE_VIP_IMAGE.into(),
            kubeconfig: "/etc/kubernetes/admin.conf".into(),
        })
        .unwrap();
        let v: serde_json::Value = serde_yaml::from_str(&text).unwrap();
        assert_eq!(v["kind"], "Pod");
        assert_eq!(v["apiVersion"], "v1");
        assert_eq!(v["metadata"]["namespace"], "kube-system");
    }
}
