//! The whole PKI of a node, planned in memory and refused before anything is written.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::kubeconfig::render_all;
use crate::node::leaves_from;
use crate::{
    Ca, KEY_MODE, KUBECONFIG_FILES, NodeIdentity, PkiError, SHARED_FILES, Shared, ca_cert_hash,
    file_mode, is_private, node_leaf_files, write_atomic,
};

/// What `certs generate` asks for.
#[derive(Debug, Clone)]
pub struct PkiRequest {
    /// The PKI directory (kubeadm's layout).
    pub pki_dir: PathBuf,
    /// Where the kubeconfigs go.
    pub kubeconfig_dir: PathBuf,
    /// This node.
    pub node: NodeIdentity,
    /// The API server URL the kubeconfigs point at (`https://...`).
    pub server: String,
    /// Keep the shared CAs in `pki_dir` and issue only this node's leaves and kubeconfigs
    /// from them (a joining control plane).
    pub leaves_only: bool,
    /// Replace existing keys and kubeconfigs.
    pub overwrite: bool,
}

impl PkiRequest {
    /// A request with kubeadm's defaults: kubeconfigs in the parent of `pki_dir`, the
    /// server `https://<vip, else node IP, else 127.0.0.1>:6443`.
    pub fn new(pki_dir: impl Into<PathBuf>, node: NodeIdentity) -> PkiRequest {
        let pki_dir = pki_dir.into();
        let kubeconfig_dir = default_kubeconfig_dir(&pki_dir);
        let server = default_server(node.vip.or(node.node_ip));
        PkiRequest {
            pki_dir,
            kubeconfig_dir,
            node,
            server,
            leaves_only: false,
            overwrite: false,
        }
    }
}

/// The kubeconfig directory of a PKI directory: its parent (`.` when it has none).
pub fn default_kubeconfig_dir(pki_dir: &Path) -> PathBuf {
    pki_dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// `https://<ip>:6443` (IPv6 bracketed), `https://127.0.0.1:6443` without an address.
pub fn default_server(ip: Option<IpAddr>) -> String {
    let host = match ip {
        Some(IpAddr::V6(v6)) => format!("[{v6}]"),
        Some(v4) => v4.to_string(),
        None => "127.0.0.1".into(),
    };
    format!("https://{host}:6443")
}

/// One file of a plan.
struct Planned {
    path: PathBuf,
    bytes: Vec<u8>,
    mode: u32,
}

/// Every file a request writes, generated in memory and not written yet. Its Debug names
/// the paths only (it holds private keys).
pub struct PkiPlan {
    files: Vec<Planned>,
    ca_pem: String,
}

impl std::fmt::Debug for PkiPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PkiPlan")
            .field("paths", &self.paths().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl PkiPlan {
    /// The paths [`PkiPlan::apply`] writes, in order.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|f| f.path.as_path())
    }

    /// The cluster CA's hash pin (`sha256:<hex>`), for the join command.
    pub fn ca_cert_hash(&self) -> Result<String, PkiError> {
        ca_cert_hash(self.ca_pem.as_bytes())
    }

    /// Writes every file atomically with its mode (keys and kubeconfigs 0600, certificates
    /// 0644). Returns the paths written.
    pub fn apply(self) -> Result<Vec<PathBuf>, PkiError> {
        let mut written = Vec::with_capacity(self.files.len());
        for f in self.files {
            write_atomic(&f.path, &f.bytes, f.mode)?;
            written.push(f.path);
        }
        Ok(written)
    }
}

/// The keys a request would replace: the shared private keys (unless `leaves_only`), this
/// node's leaf keys and the kubeconfigs (which embed keys).
fn guarded_paths(req: &PkiRequest) -> Vec<PathBuf> {
    let mut keys: Vec<PathBuf> = Vec::new();
    if !req.leaves_only {
        keys.extend(
            SHARED_FILES
                .iter()
                .filter(|f| is_private(f))
                .map(|f| req.pki_dir.join(f)),
        );
    }
    keys.extend(
        node_leaf_files()
            .iter()
            .filter(|f| is_private(f))
            .map(|f| req.pki_dir.join(f)),
    );
    keys.extend(
        KUBECONFIG_FILES
            .iter()
            .map(|(f, _, _)| req.kubeconfig_dir.join(f)),
    );
    keys
}

/// Plans the whole PKI of `req`: the shared CAs and service-account pair (or, with
/// `leaves_only`, the CAs loaded from `pki_dir`), this node's leaves and the kubeconfigs.
///
/// Without `overwrite` it refuses, before generating or writing anything, when any key
/// the plan would replace exists ([`PkiError::WouldOverwrite`] names the first one). A
/// plan that is refused half way therefore never leaves a PKI nobody asked for.
pub fn plan_pki(req: &PkiRequest) -> Result<PkiPlan, PkiError> {
    if req.node.node_name.is_empty() {
        return Err(PkiError::Invalid {
            what: "node name".into(),
            reason: "empty: pass --node-name".into(),
        });
    }
    if !req.server.starts_with("https://") {
        return Err(PkiError::Invalid {
            what: "kubeconfig server".into(),
            reason: format!("{:?} is not an https:// URL", req.server),
        });
    }
    if !req.overwrite
        && let Some(path) = guarded_paths(req).into_iter().find(|p| p.exists())
    {
        return Err(PkiError::WouldOverwrite {
            path,
            shared: !req.leaves_only,
        });
    }
    let mut files = Vec::new();
    let cas: Vec<(&'static str, Ca)> = if req.leaves_only {
        vec![
            ("ca", Ca::load(&req.pki_dir, "ca")?),
            ("front-proxy-ca", Ca::load(&req.pki_dir, "front-proxy-ca")?),
            ("etcd/ca", Ca::load(&req.pki_dir, "etcd/ca")?),
        ]
    } else {
        let shared = Shared::generate()?;
        files.extend(shared.files.into_iter().map(|(rel, bytes)| Planned {
            mode: file_mode(&rel),
            path: req.pki_dir.join(rel),
            bytes,
        }));
        shared.cas
    };
    let refs: Vec<(&str, &Ca)> = cas.iter().map(|(p, c)| (*p, c)).collect();
    files.extend(
        leaves_from(&refs, &req.node)?
            .into_iter()
            .map(|(rel, bytes)| Planned {
                mode: file_mode(&rel),
                path: req.pki_dir.join(rel),
                bytes,
            }),
    );
    let cluster_ca = refs
        .iter()
        .find(|(p, _)| *p == "ca")
        .map(|(_, c)| *c)
        .ok_or_else(|| PkiError::Invalid {
            what: "ca.crt".into(),
            reason: "no cluster CA in the plan".into(),
        })?;
    files.extend(
        render_all(cluster_ca, &req.server)?
            .into_iter()
            .map(|(file, text)| Planned {
                path: req.kubeconfig_dir.join(file),
                bytes: text.into_bytes(),
                mode: KEY_MODE,
            }),
    );
    Ok(PkiPlan {
        files,
        ca_pem: cluster_ca.cert_pem().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_server_brackets_v6_and_falls_back_to_loopback() {
        assert_eq!(default_server(None), "https://127.0.0.1:6443");
        assert_eq!(
            default_server(Some("fd00::1".parse().unwrap())),
            "https://[fd00::1]:6443"
        );
        assert_eq!(default_kubeconfig_dir(Path::new("pki")), PathBuf::from("."));
        assert_eq!(
            default_kubeconfig_dir(Path::new("/etc/kubernetes/pki")),
            PathBuf::from("/etc/kubernetes")
        );
    }
}
