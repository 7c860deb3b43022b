//! Moving a node's clients onto the cluster VIP, once a control plane that started alone
//! (clients on one API server) has grown into several behind kube-vip's one address.
//!
//! - [`node_repoint`] (`stratum-server repoint --vip IP`): first proves that the VIP serves
//!   THIS cluster's API ([`check_vip_serves`]: a TLS handshake verified against the
//!   cluster CA with the VIP itself as the name the certificate must cover, then an HTTP
//!   answer over it). Anything else is an error naming what was wrong, and nothing is
//!   written. Then [`repoint_kubeconfigs`] rewrites the server of every kubeconfig on the
//!   node, keeping every other byte (credentials included; [`hacore::repoint`]), each
//!   file replaced atomically, and records the endpoint in the node state, so the next
//!   `stratum-server up` writes kubeconfigs for the VIP too. Last, the local consumers of
//!   those kubeconfigs are restarted; one that fails to restart is a warning beside a
//!   successful repoint (the files are rewritten; a later restart picks them up).
//! - [`repoint_cilium_with`]: Cilium's agent DaemonSet and operator Deployment reach the
//!   API server through `KUBERNETES_SERVICE_HOST`/`PORT`, not through a kubeconfig: a
//!   strategic merge patch sets both on each container (merged by container name, then by
//!   env name, so nothing else in the pod template changes). A rollout that has not
//!   finished within the wait is a warning: the patch landed, the pods are rolling.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::PodSpec;
use kube::Resource as _;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::{info, warn};

use crate::nodestate::{NodeState, NodeStateError};
pub use hacore::repoint::{RepointError, Rewritten, rewrite_server, server_url};

/// The kubeconfigs a node may hold, by file name in its kubeconfig directory: the ones
/// `stratum-server` writes ([`pki::KUBECONFIG_FILES`]) and the kubelet's.
pub const NODE_KUBECONFIGS: &[&str] = &[
    "admin.conf",
    "super-admin.conf",
    "controller-manager.conf",
    "scheduler.conf",
    "kubelet.conf",
    "bootstrap-kubelet.conf",
    // Never deleted: a kubelet that has to bootstrap again reads it, and would otherwise
    // dial the old server.
    "bootstrap.conf",
];

/// How the VIP failed the check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VipFault {
    /// Nothing answered at the address.
    Unreachable(String),
    /// The certificate was not issued by this cluster's CA: another cluster, or
    /// something else, holds the VIP.
    OtherCa,
    /// The certificate does not verify against this cluster's CA for another reason
    /// (webpki's detail: a CA certificate served as a leaf, a bad encoding, ...).
    Untrusted(String),
    /// The certificate is this cluster's but does not name the VIP in its SANs: reissue
    /// the API server certificates with the VIP (`stratum-server certs generate --vip`).
    NotForVip,
    /// The certificate is expired or not yet valid.
    Expired,
    /// Another TLS failure.
    Tls(String),
    /// The TLS peer does not answer HTTP.
    NotHttp(String),
}

impl std::fmt::Display for VipFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VipFault::Unreachable(why) => write!(f, "nothing answers there ({why})"),
            VipFault::OtherCa => f.write_str(
                "its certificate is not issued by this cluster's CA: another cluster (or \
                 something else) holds the VIP",
            ),
            VipFault::Untrusted(detail) => write!(
                f,
                "its certificate does not verify against this cluster's CA ({detail}): another \
                 cluster (or something else) holds the VIP"
            ),
            VipFault::NotForVip => f.write_str(
                "its certificate is this cluster's but does not cover the VIP in its SANs: \
                 reissue the API server certificates with the VIP \
                 (stratum-server certs generate --vip)",
            ),
            VipFault::Expired => f.write_str("its certificate is expired or not yet valid"),
            VipFault::Tls(why) => write!(f, "TLS failed: {why}"),
            VipFault::NotHttp(why) => write!(f, "it does not answer HTTP over TLS ({why})"),
        }
    }
}

/// A repoint that did not happen, or happened only in part.
#[derive(Debug, thiserror::Error)]
pub enum RepointFailure {
    /// The VIP does not serve this cluster's API: nothing was written.
    #[error("refusing to repoint to {addr}: {fault}; nothing was changed")]
    VipDoesNotServe {
        /// `VIP:PORT`.
        addr: String,
        /// What was wrong.
        fault: VipFault,
    },
    /// The cluster CA could not be read or used.
    #[error("cannot use the cluster CA {}: {reason}; nothing was changed", path.display())]
    Ca {
        /// The CA file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A kubeconfig could not be read or rewritten: nothing was written.
    #[error("cannot repoint {}; nothing was changed", path.display())]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: RepointError,
    },
    /// A file could not be read.
    #[error("cannot read {}; nothing was changed", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// No kubeconfig was found.
    #[error(
        "no kubeconfig in {} (looked for {}); nothing was changed",
        dir.display(),
        NODE_KUBECONFIGS.join(", ")
    )]
    NoKubeconfigs {
        /// The directory.
        dir: PathBuf,
    },
    /// The node state could not be read: nothing was written.
    #[error(transparent)]
    State(#[from] NodeStateError),
    /// Another maintenance command holds the node: nothing was written.
    #[error(transparent)]
    Locked(#[from] crate::maintenance::MaintenanceError),
    /// A write failed part way: the files listed were already replaced.
    #[error("writing the repointed kubeconfigs failed (already rewritten: {})", done.join(", "))]
    Write {
        /// Files already rewritten.
        done: Vec<String>,
        /// The failed write.
        #[source]
        source: common::fsutil::FsError,
    },
}

/// Proof that the VIP serves this cluster's API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VipServes {
    /// `VIP:PORT`.
    pub addr: String,
    /// The HTTP status `/readyz` answered with (any answer proves an HTTP server behind the
    /// verified certificate; 200 is a ready API server, 401/403 one that refuses anonymous
    /// requests).
    pub readyz_status: u16,
}

fn classify_tls(e: &std::io::Error) -> VipFault {
    use rustls::CertificateError as C;
    let inner = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
    match inner {
        Some(rustls::Error::InvalidCertificate(c)) => match c {
            C::UnknownIssuer | C::BadSignature | C::InvalidPurpose => VipFault::OtherCa,
            C::NotValidForName | C::NotValidForNameContext { .. } => VipFault::NotForVip,
            C::Expired
            | C::ExpiredContext { .. }
            | C::NotValidYet
            | C::NotValidYetContext { .. } => VipFault::Expired,
            C::Other(detail) => VipFault::Untrusted(format!("{detail:?}")),
            other => VipFault::Tls(format!("{other:?}")),
        },
        Some(other) => VipFault::Tls(other.to_string()),
        None => VipFault::Tls(e.to_string()),
    }
}

/// Checks that `vip:port` serves this cluster's API: the TLS chain verifies against
/// `ca_pem` (the cluster CA) with the VIP as the name the certificate must cover, and an
/// HTTP `GET /readyz` over that connection gets an answer. Each step is bounded by
/// `timeout`.
pub async fn check_vip_serves(
    vip: IpAddr,
    port: u16,
    ca_pem: &[u8],
    timeout: Duration,
) -> Result<VipServes, RepointFailure> {
    let addr = SocketAddr::new(vip, port);
    let addr_text = addr.to_string();
    let fail = |fault| RepointFailure::VipDoesNotServe {
        addr: addr_text.clone(),
        fault,
    };
    let ca_err = |reason: String| RepointFailure::Ca {
        path: PathBuf::from("(cluster CA)"),
        reason,
    };
    let mut roots = rustls::RootCertStore::empty();
    let mut found = 0;
    for cert in rustls_pemfile::certs(&mut &ca_pem[..]) {
        let cert = cert.map_err(|e| ca_err(format!("not PEM: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| ca_err(format!("not a usable CA certificate: {e}")))?;
        found += 1;
    }
    if found == 0 {
        return Err(ca_err("it holds no certificate".into()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ca_err(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(fail(VipFault::Unreachable(e.to_string()))),
        Err(_) => {
            return Err(fail(VipFault::Unreachable(format!(
                "no connection within {timeout:?}"
            ))));
        }
    };
    let name = ServerName::IpAddress(vip.into());
    let mut tls = match tokio::time::timeout(timeout, connector.connect(name, tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(fail(classify_tls(&e))),
        Err(_) => {
            return Err(fail(VipFault::Tls(format!(
                "no handshake within {timeout:?}"
            ))));
        }
    };
    let host = match vip {
        IpAddr::V4(v4) => format!("{v4}:{port}"),
        IpAddr::V6(v6) => format!("[{v6}]:{port}"),
    };
    let request = format!(
        "GET /readyz HTTP/1.1\r\nHost: {host}\r\nUser-Agent: stratum-server-repoint\r\nConnection: close\r\n\r\n"
    );
    let exchange = async {
        tls.write_all(request.as_bytes()).await?;
        let mut buf = vec![0u8; 512];
        let mut got = 0;
        while got < 12 {
            let n = tls.read(&mut buf[got..]).await?;
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&buf[..got]).into_owned())
    };
    let head = match tokio::time::timeout(timeout, exchange).await {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => return Err(fail(VipFault::NotHttp(e.to_string()))),
        Err(_) => {
            return Err(fail(VipFault::NotHttp(format!(
                "no answer within {timeout:?}"
            ))));
        }
    };
    let status = head
        .strip_prefix("HTTP/1.")
        .and_then(|r| r.get(2..5))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| {
            fail(VipFault::NotHttp(
                "the answer is not an HTTP status line".into(),
            ))
        })?;
    Ok(VipServes {
        addr: addr_text.clone(),
        readyz_status: status,
    })
}

/// One kubeconfig rewritten in memory, not yet written.
#[derive(Debug, Clone)]
struct Planned {
    path: PathBuf,
    rewritten: Rewritten,
    mode: u32,
    owner: (u32, u32),
}

/// What [`repoint_kubeconfigs`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubeconfigsRepointed {
    /// Files rewritten.
    pub rewritten: Vec<PathBuf>,
    /// Files that already named the server.
    pub unchanged: Vec<PathBuf>,
    /// Whether the node state's endpoint was changed.
    pub state_recorded: bool,
}

fn plan_kubeconfigs(dir: &Path, server: &str) -> Result<Vec<Planned>, RepointFailure> {
    use std::os::unix::fs::MetadataExt as _;
    let mut plans = Vec::new();
    for name in NODE_KUBECONFIGS {
        let path = dir.join(name);
        // symlink_metadata: a symlink planted at a kubeconfig's name is not followed.
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(RepointFailure::Read { path, source }),
        };
        if !meta.file_type().is_file() {
            return Err(RepointFailure::Read {
                path,
                source: std::io::Error::other("not a regular file (a symlink is not followed)"),
            });
        }
        let text = std::fs::read_to_string(&path).map_err(|source| RepointFailure::Read {
            path: path.clone(),
            source,
        })?;
        let rewritten =
            rewrite_server(&text, server).map_err(|source| RepointFailure::Kubeconfig {
                path: path.clone(),
                source,
            })?;
        plans.push(Planned {
            path,
            rewritten,
            mode: meta.mode() & 0o7777,
            owner: (meta.uid(), meta.gid()),
        });
    }
    if plans.is_empty() {
        return Err(RepointFailure::NoKubeconfigs {
            dir: dir.to_path_buf(),
        });
    }
    Ok(plans)
}

/// Rewrites every kubeconfig of [`NODE_KUBECONFIGS`] in `dir` to `server`, keeping every
/// other byte, mode and owner, and records `server` as the node state's endpoint in
/// `data_dir` (a node without state, a worker, has nothing to record). Every file is read
/// and rewritten in memory, and the state read, before the first write: a kubeconfig that
/// cannot be rewritten, or a state that cannot be read, changes nothing.
pub fn repoint_kubeconfigs(
    dir: &Path,
    data_dir: Option<&Path>,
    server: &str,
) -> Result<KubeconfigsRepointed, RepointFailure> {
    hacore::repoint::check_server(server).map_err(|source| RepointFailure::Kubeconfig {
        path: dir.to_path_buf(),
        source,
    })?;
    let plans = plan_kubeconfigs(dir, server)?;
    let state = match data_dir {
        Some(d) => NodeState::load(d)?.map(|s| (d, s)),
        None => None,
    };
    let mut out = KubeconfigsRepointed::default();
    let mut done = Vec::new();
    for p in plans {
        if !p.rewritten.changed {
            out.unchanged.push(p.path);
            continue;
        }
        common::fsutil::write_atomic(&p.path, p.rewritten.text.as_bytes(), p.mode, Some(p.owner))
            .map_err(|source| RepointFailure::Write {
            done: done.clone(),
            source,
        })?;
        info!(file = %p.path.display(), from = %p.rewritten.old_servers.join(","), to = server, "kubeconfig repointed");
        done.push(p.path.display().to_string());
        out.rewritten.push(p.path);
    }
    if let Some((d, mut st)) = state
        && st.api_server != server
    {
        st.api_server = server.to_string();
        st.save(d)?;
        out.state_recorded = true;
    }
    Ok(out)
}

/// Restarts the local consumers of the kubeconfigs.
pub trait Restarter: Send + Sync {
    /// Restarts `unit`; the error says why it did not.
    fn restart(&self, unit: &str) -> Result<(), String>;
}

/// `systemctl restart <unit>`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Systemctl;

impl Restarter for Systemctl {
    fn restart(&self, unit: &str) -> Result<(), String> {
        let out = std::process::Command::new("systemctl")
            .arg("restart")
            .arg("--")
            .arg(unit)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("cannot run systemctl: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "systemctl restart {unit} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
                    .trim()
                    .replace('\n', "; ")
            ))
        }
    }
}

/// What `repoint --vip` works on.
#[derive(Debug, Clone)]
pub struct RepointRequest {
    /// The VIP.
    pub vip: IpAddr,
    /// The API port on the VIP.
    pub port: u16,
    /// The cluster CA (PEM file) the VIP's certificate must chain to.
    pub ca_file: PathBuf,
    /// The node's kubeconfig directory.
    pub kubeconfig_dir: PathBuf,
    /// The node's data directory (node state); `None` on a node without one.
    pub data_dir: Option<PathBuf>,
    /// Units restarted after the rewrite (e.g. `kubelet`).
    pub restart: Vec<String>,
    /// How long each step of the VIP check may take.
    pub timeout: Duration,
}

/// What a repoint did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepointReport {
    /// The new server URL.
    pub server: String,
    /// The VIP check's answer.
    pub vip: VipServes,
    /// The kubeconfigs and the node state.
    pub kubeconfigs: KubeconfigsRepointed,
    /// Units restarted.
    pub restarted: Vec<String>,
    /// Warnings (a unit that did not restart).
    pub warnings: Vec<String>,
}

/// `stratum-server repoint --vip IP`: checks the VIP, rewrites the kubeconfigs and the
/// node state, restarts the consumers. Progress goes to `w`, one line per step.
///
/// With a data dir it holds the node maintenance lock ([`crate::maintenance::NodeLock`])
/// throughout, since it rewrites what the local control plane reads: a repoint while a
/// rejoin, a restore or a rekey runs on the node refuses, naming that command.
pub async fn node_repoint(
    w: &mut dyn Write,
    req: &RepointRequest,
    restarter: &dyn Restarter,
) -> Result<RepointReport, RepointFailure> {
    let _lock = match &req.data_dir {
        Some(dir) => Some(crate::maintenance::NodeLock::acquire(dir, "repoint")?),
        None => None,
    };
    repoint_under_lock(w, req, restarter).await
}

/// The body of [`node_repoint`], to run while the node maintenance lock is held.
pub async fn repoint_under_lock(
    w: &mut dyn Write,
    req: &RepointRequest,
    restarter: &dyn Restarter,
) -> Result<RepointReport, RepointFailure> {
    let ca_pem = std::fs::read(&req.ca_file).map_err(|e| RepointFailure::Ca {
        path: req.ca_file.clone(),
        reason: e.to_string(),
    })?;
    let server = server_url(req.vip, req.port);
    let _ = writeln!(
        w,
        "checking that {server} serves this cluster's API (CA {})",
        req.ca_file.display()
    );
    let vip = check_vip_serves(req.vip, req.port, &ca_pem, req.timeout)
        .await
        .map_err(|e| match e {
            RepointFailure::Ca { reason, .. } => RepointFailure::Ca {
                path: req.ca_file.clone(),
                reason,
            },
            other => other,
        })?;
    let _ = writeln!(
        w,
        "  ok: certificate chains to the cluster CA and covers {}; /readyz answered {}",
        req.vip, vip.readyz_status
    );
    let _ = writeln!(
        w,
        "rewriting kubeconfigs in {}",
        req.kubeconfig_dir.display()
    );
    let kubeconfigs = repoint_kubeconfigs(&req.kubeconfig_dir, req.data_dir.as_deref(), &server)?;
    for p in &kubeconfigs.rewritten {
        let _ = writeln!(w, "  rewritten: {}", p.display());
    }
    for p in &kubeconfigs.unchanged {
        let _ = writeln!(w, "  already on {server}: {}", p.display());
    }
    if kubeconfigs.state_recorded {
        let _ = writeln!(w, "  node state records {server}");
    }
    let mut restarted = Vec::new();
    let mut warnings = Vec::new();
    for unit in &req.restart {
        let _ = writeln!(w, "restarting {unit}");
        match restarter.restart(unit) {
            Ok(()) => restarted.push(unit.clone()),
            Err(why) => {
                let text = format!(
                    "{unit} did not restart ({why}); it reads the repointed kubeconfig on its next start"
                );
                warn!("{text}");
                let _ = writeln!(w, "  warning: {text}");
                warnings.push(text);
            }
        }
    }
    Ok(RepointReport {
        server,
        vip,
        kubeconfigs,
        restarted,
        warnings,
    })
}

/// A Cilium repoint that failed.
#[derive(Debug, thiserror::Error)]
pub enum CiliumError {
    /// The API answered an error, or could not be reached.
    #[error("cannot {op} {object}")]
    Api {
        /// What was being done.
        op: &'static str,
        /// Which object.
        object: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// The Cilium objects repointed: the agent DaemonSet and the operator Deployment.
pub const CILIUM_AGENT: &str = "cilium";
/// The operator Deployment.
pub const CILIUM_OPERATOR: &str = "cilium-operator";

/// What [`repoint_cilium_with`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CiliumReport {
    /// Objects patched.
    pub patched: Vec<String>,
    /// Objects that already pointed at the VIP.
    pub unchanged: Vec<String>,
    /// Warnings: an absent object, a rollout that has not finished.
    pub warnings: Vec<String>,
}

/// The strategic merge patch that sets `KUBERNETES_SERVICE_HOST`/`PORT` on every container
/// of `spec` (and every init container that already sets them), or `None` when all
/// already carry these values (steady state writes nothing). Pure.
pub fn cilium_env_patch(spec: &PodSpec, host: &str, port: u16) -> Option<serde_json::Value> {
    let port = port.to_string();
    let has = |env: &Option<Vec<k8s_openapi::api::core::v1::EnvVar>>, name: &str, value: &str| {
        env.iter()
            .flatten()
            .any(|e| e.name == name && e.value.as_deref() == Some(value) && e.value_from.is_none())
    };
    let sets_host = |env: &Option<Vec<k8s_openapi::api::core::v1::EnvVar>>| {
        env.iter()
            .flatten()
            .any(|e| e.name == "KUBERNETES_SERVICE_HOST")
    };
    let entry = |name: &str| {
        serde_json::json!({
            "name": name,
            "env": [
                {"name": "KUBERNETES_SERVICE_HOST", "value": host},
                {"name": "KUBERNETES_SERVICE_PORT", "value": port},
            ]
        })
    };
    let mut containers = Vec::new();
    let mut changed = false;
    for c in &spec.containers {
        changed |= !(has(&c.env, "KUBERNETES_SERVICE_HOST", host)
            && has(&c.env, "KUBERNETES_SERVICE_PORT", &port));
        containers.push(entry(&c.name));
    }
    let mut inits = Vec::new();
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| sets_host(&c.env))
    {
        changed |= !(has(&c.env, "KUBERNETES_SERVICE_HOST", host)
            && has(&c.env, "KUBERNETES_SERVICE_PORT", &port));
        inits.push(entry(&c.name));
    }
    if !changed {
        return None;
    }
    let mut pod = serde_json::json!({ "containers": containers });
    if !inits.is_empty() {
        pod["initContainers"] = serde_json::Value::Array(inits);
    }
    Some(serde_json::json!({"spec": {"template": {"spec": pod}}}))
}

/// Whether a DaemonSet's rollout is complete: the controller saw this generation and every
/// scheduled pod is updated and available.
fn daemonset_rolled_out(ds: &DaemonSet) -> bool {
    let generation = ds.metadata.generation.unwrap_or(0);
    ds.status.as_ref().is_some_and(|s| {
        s.observed_generation.unwrap_or(0) >= generation
            && s.updated_number_scheduled.unwrap_or(0) == s.desired_number_scheduled
            && s.number_available.unwrap_or(0) == s.desired_number_scheduled
    })
}

/// Whether a Deployment's rollout is complete.
fn deployment_rolled_out(d: &Deployment) -> bool {
    let generation = d.metadata.generation.unwrap_or(0);
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    d.status.as_ref().is_some_and(|s| {
        s.observed_generation.unwrap_or(0) >= generation
            && s.updated_replicas.unwrap_or(0) == want
            && s.available_replicas.unwrap_or(0) == want
    })
}

/// Records a `Repointed` Event on a patched Cilium object; a failure to record it is a
/// warning in the report, not an error (the patch is done).
async fn record_repointed(
    client: &kube::Client,
    reference: k8s_openapi::api::core::v1::ObjectReference,
    host: &str,
    port: u16,
    report: &mut CiliumReport,
) {
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "stratum-server".into(),
            instance: None,
        },
    );
    let event = Event {
        type_: EventType::Normal,
        reason: "Repointed".into(),
        note: Some(format!(
            "KUBERNETES_SERVICE_HOST={host} KUBERNETES_SERVICE_PORT={port}: the control-plane VIP"
        )),
        action: "RepointAPIServer".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &reference).await {
        report.warnings.push(format!(
            "cannot record the Repointed Event: {}",
            crate::error_chain(&e)
        ));
    }
}

/// Patches Cilium's agent DaemonSet and operator Deployment in kube-system to reach the API
/// server at `host:port`, then waits up to `rollout_wait` for each rollout. An absent
/// object and an unfinished rollout are warnings; an API error is an error.
pub async fn repoint_cilium_with(
    w: &mut dyn Write,
    client: &kube::Client,
    host: &str,
    port: u16,
    rollout_wait: Duration,
) -> Result<CiliumReport, CiliumError> {
    let mut report = CiliumReport::default();
    let ds_api: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    let dep_api: Api<Deployment> = Api::namespaced(client.clone(), "kube-system");
    let pp = PatchParams::default();
    let api_err = |op, object: &str| {
        let object = object.to_string();
        move |source| CiliumError::Api { op, object, source }
    };

    let ds_name = format!("daemonset/{CILIUM_AGENT}");
    let mut ds_patched = false;
    match ds_api
        .get_opt(CILIUM_AGENT)
        .await
        .map_err(api_err("read", &ds_name))?
    {
        None => report.warnings.push(format!(
            "kube-system/{ds_name} does not exist: nothing to repoint there"
        )),
        Some(ds) => {
            let spec = ds.spec.as_ref().and_then(|s| s.template.spec.as_ref());
            match spec.and_then(|s| cilium_env_patch(s, host, port)) {
                None => report.unchanged.push(ds_name.clone()),
                Some(patch) => {
                    let _ = writeln!(
                        w,
                        "patching kube-system/{ds_name}: KUBERNETES_SERVICE_HOST={host} KUBERNETES_SERVICE_PORT={port}"
                    );
                    ds_api
                        .patch(CILIUM_AGENT, &pp, &Patch::Strategic(patch))
                        .await
                        .map_err(api_err("patch", &ds_name))?;
                    report.patched.push(ds_name.clone());
                    ds_patched = true;
                    record_repointed(client, ds.object_ref(&()), host, port, &mut report).await;
                }
            }
        }
    }
    let dep_name = format!("deployment/{CILIUM_OPERATOR}");
    let mut dep_patched = false;
    match dep_api
        .get_opt(CILIUM_OPERATOR)
        .await
        .map_err(api_err("read", &dep_name))?
    {
        None => report.warnings.push(format!(
            "kube-system/{dep_name} does not exist: nothing to repoint there"
        )),
        Some(d) => {
            let spec = d.spec.as_ref().and_then(|s| s.template.spec.as_ref());
            match spec.and_then(|s| cilium_env_patch(s, host, port)) {
                None => report.unchanged.push(dep_name.clone()),
                Some(patch) => {
                    let _ = writeln!(
                        w,
                        "patching kube-system/{dep_name}: KUBERNETES_SERVICE_HOST={host} KUBERNETES_SERVICE_PORT={port}"
                    );
                    dep_api
                        .patch(CILIUM_OPERATOR, &pp, &Patch::Strategic(patch))
                        .await
                        .map_err(api_err("patch", &dep_name))?;
                    report.patched.push(dep_name.clone());
                    dep_patched = true;
                    record_repointed(client, d.object_ref(&()), host, port, &mut report).await;
                }
            }
        }
    }
    if !(ds_patched || dep_patched) {
        return Ok(report);
    }
    let _ = writeln!(w, "waiting up to {rollout_wait:?} for the rollouts");
    let deadline = tokio::time::Instant::now() + rollout_wait;
    let (mut ds_done, mut dep_done) = (!ds_patched, !dep_patched);
    loop {
        if !ds_done {
            ds_done = ds_api
                .get_opt(CILIUM_AGENT)
                .await
                .map_err(api_err("read", &ds_name))?
                .is_some_and(|d| daemonset_rolled_out(&d));
        }
        if !dep_done {
            dep_done = dep_api
                .get_opt(CILIUM_OPERATOR)
                .await
                .map_err(api_err("read", &dep_name))?
                .is_some_and(|d| deployment_rolled_out(&d));
        }
        if (ds_done && dep_done) || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2).min(rollout_wait)).await;
    }
    for (done, name) in [(ds_done, &ds_name), (dep_done, &dep_name)] {
        if !done {
            report.warnings.push(format!(
                "kube-system/{name} has not finished rolling out within {rollout_wait:?}: the patch is in place; \
                 check `kubectl -n kube-system rollout status {name}`"
            ));
        } else if report.patched.contains(name) {
            let _ = writeln!(w, "  kube-system/{name} rolled out");
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, EnvVar};

    fn container(name: &str, env: &[(&str, &str)]) -> Container {
        Container {
            name: name.into(),
            env: Some(
                env.iter()
                    .map(|(n, v)| EnvVar {
                        name: n.to_string(),
                        value: Some(v.to_string()),
                        value_from: None,
                    })
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn cilium_patch_names_each_container_and_is_empty_in_steady_state() {
        let spec = PodSpec {
            containers: vec![container(
                "cilium-agent",
                &[("KUBERNETES_SERVICE_HOST", "127.0.0.1")],
            )],
            init_containers: Some(vec![
                container("config", &[("KUBERNETES_SERVICE_HOST", "127.0.0.1")]),
                container("mount-bpf-fs", &[]),
            ]),
            ..Default::default()
        };
        let p = cilium_env_patch(&spec, "10.0.0.100", 6443).unwrap();
        let pod = &p["spec"]["template"]["spec"];
        assert_eq!(pod["containers"][0]["name"], "cilium-agent");
        assert_eq!(pod["containers"][0]["env"][0]["value"], "10.0.0.100");
        assert_eq!(pod["containers"][0]["env"][1]["value"], "6443");
        assert_eq!(pod["initContainers"].as_array().unwrap().len(), 1);
        assert_eq!(pod["initContainers"][0]["name"], "config");
        let done = PodSpec {
            containers: vec![container(
                "cilium-agent",
                &[
                    ("KUBERNETES_SERVICE_HOST", "10.0.0.100"),
                    ("KUBERNETES_SERVICE_PORT", "6443"),
                ],
            )],
            ..Default::default()
        };
        assert_eq!(cilium_env_patch(&done, "10.0.0.100", 6443), None);
    }

    #[test]
    fn vip_faults_say_what_to_do() {
        assert!(
            VipFault::OtherCa
                .to_string()
                .contains("not issued by this cluster's CA")
        );
        assert!(VipFault::NotForVip.to_string().contains("--vip"));
    }
}
