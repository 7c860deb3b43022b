//! Kubeconfigs with embedded client certificates.

use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

use crate::{Ca, LeafSpec, PkiError, Usage, write_atomic};

/// The group of `admin.conf`'s user (kubeadm's since 1.29). It has no rights by itself: a
/// ClusterRoleBinding to `cluster-admin`, which bootstrap creates, grants them, so revoking
/// that binding revokes every admin.conf at once, which `system:masters` never allows.
pub const CLUSTER_ADMINS_GROUP: &str = "kubeadm:cluster-admins";
/// The break-glass kubeconfig: its user is in `system:masters`, which no RBAC change can
/// revoke. Used to create the cluster-admins binding at bootstrap and when RBAC is broken;
/// keep it off every machine that does not need it.
pub const SUPER_ADMIN_KUBECONFIG: &str = "super-admin.conf";

/// The kubeconfigs [`write_kubeconfigs`] writes: (file name, user CN, groups).
pub const KUBECONFIG_FILES: &[(&str, &str, &[&str])] = &[
    ("admin.conf", "kubernetes-admin", &[CLUSTER_ADMINS_GROUP]),
    (
        SUPER_ADMIN_KUBECONFIG,
        "kubernetes-super-admin",
        &["system:masters"],
    ),
    (
        "controller-manager.conf",
        "system:kube-controller-manager",
        &[],
    ),
    ("scheduler.conf", "system:kube-scheduler", &[]),
];

/// A kubeconfig as this crate writes it (`clientcmd/api/v1`'s `Config`, the fields used
/// here), serialized with serde so that no value can break the document.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Kubeconfig {
    /// Always `v1`.
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    /// Always `Config`.
    pub kind: String,
    /// The clusters (one: `kubernetes`).
    pub clusters: Vec<NamedCluster>,
    /// The users (one).
    pub users: Vec<NamedUser>,
    /// The contexts (one).
    pub contexts: Vec<NamedContext>,
    /// The context in use.
    #[serde(rename = "current-context")]
    pub current_context: String,
}

/// A named cluster entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NamedCluster {
    /// Its name.
    pub name: String,
    /// The cluster.
    pub cluster: Cluster,
}

/// Where the API server is and which CA it is trusted with.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Cluster {
    /// `https://HOST:PORT`.
    pub server: String,
    /// The CA certificate (PEM), base64.
    #[serde(rename = "certificate-authority-data")]
    pub certificate_authority_data: String,
}

/// A named user entry.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NamedUser {
    /// Its name.
    pub name: String,
    /// Its credentials.
    pub user: User,
}

impl std::fmt::Debug for NamedUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The user holds a private key: never in Debug.
        f.debug_struct("NamedUser")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A client certificate and its key, both PEM, base64.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct User {
    /// The client certificate.
    #[serde(rename = "client-certificate-data")]
    pub client_certificate_data: String,
    /// The client key.
    #[serde(rename = "client-key-data")]
    pub client_key_data: String,
}

/// A named context entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NamedContext {
    /// Its name.
    pub name: String,
    /// The context.
    pub context: Context,
}

/// A cluster and a user.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Context {
    /// The cluster's name.
    pub cluster: String,
    /// The user's name.
    pub user: String,
}

impl Kubeconfig {
    /// A kubeconfig for `user` at `server`, trusting `ca_pem`, authenticating with the
    /// client certificate `cert_pem` and its key `key_pem`.
    pub fn with_client_cert(
        server: &str,
        user: &str,
        ca_pem: &str,
        cert_pem: &str,
        key_pem: &str,
    ) -> Kubeconfig {
        let b = |s: &str| STANDARD.encode(s.as_bytes());
        let context = format!("{user}@kubernetes");
        Kubeconfig {
            api_version: "v1".into(),
            kind: "Config".into(),
            clusters: vec![NamedCluster {
                name: "kubernetes".into(),
                cluster: Cluster {
                    server: server.into(),
                    certificate_authority_data: b(ca_pem),
                },
            }],
            users: vec![NamedUser {
                name: user.into(),
                user: User {
                    client_certificate_data: b(cert_pem),
                    client_key_data: b(key_pem),
                },
            }],
            contexts: vec![NamedContext {
                name: context.clone(),
                context: Context {
                    cluster: "kubernetes".into(),
                    user: user.into(),
                },
            }],
            current_context: context,
        }
    }

    /// The YAML document.
    pub fn to_yaml(&self) -> Result<String, PkiError> {
        serde_yaml::to_string(self).map_err(|e| PkiError::Invalid {
            what: "kubeconfig".into(),
            reason: format!("cannot serialize it: {e}"),
        })
    }
}

/// Every kubeconfig of [`KUBECONFIG_FILES`], rendered in memory with client certificates
/// issued by `ca`: (file name, YAML).
pub(crate) fn render_all(ca: &Ca, server: &str) -> Result<Vec<(&'static str, String)>, PkiError> {
    if !server.starts_with("https://") {
        return Err(PkiError::Invalid {
            what: "kubeconfig server".into(),
            reason: format!("{server:?} is not an https:// URL"),
        });
    }
    let mut rendered = Vec::new();
    for (file, cn, groups) in KUBECONFIG_FILES {
        let mut spec = LeafSpec::new(*cn, &[Usage::ClientAuth]);
        spec.organizations = groups.iter().map(|g| g.to_string()).collect();
        let issued = ca.issue(&spec)?;
        let kc = Kubeconfig::with_client_cert(
            server,
            cn,
            ca.cert_pem(),
            &issued.cert_pem,
            &issued.key_pem,
        );
        rendered.push((*file, kc.to_yaml()?));
    }
    Ok(rendered)
}

/// Writes admin, super-admin, controller-manager and scheduler kubeconfigs into `out_dir`
/// ([`KUBECONFIG_FILES`]), each with
/// a client certificate issued by the cluster CA in `pki_dir`, pointing at `server`
/// (e.g. `https://10.0.0.100:6443`). They embed private keys: written 0600, and with
/// `overwrite` false an existing one is refused before anything is written.
pub fn write_kubeconfigs(
    pki_dir: &Path,
    out_dir: &Path,
    server: &str,
    overwrite: bool,
) -> Result<Vec<PathBuf>, PkiError> {
    if !overwrite {
        for (file, _, _) in KUBECONFIG_FILES {
            let path = out_dir.join(file);
            if path.exists() {
                return Err(PkiError::KeyExists { path });
            }
        }
    }
    let ca = Ca::load(pki_dir, "ca")?;
    let rendered: Vec<(PathBuf, String)> = render_all(&ca, server)?
        .into_iter()
        .map(|(file, text)| (out_dir.join(file), text))
        .collect();
    let mut written = Vec::new();
    for (path, text) in rendered {
        write_atomic(&path, text.as_bytes(), crate::KEY_MODE)?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_values_stay_values() {
        let kc = Kubeconfig::with_client_cert(
            "https://h:6443\"\n- evil: x",
            "u: \"x\"\n",
            "ca",
            "cert",
            "key",
        );
        let text = kc.to_yaml().unwrap();
        let back: Kubeconfig = serde_yaml::from_str(&text).unwrap();
        assert_eq!(back, kc);
        assert!(
            !format!("{:?}", kc.users[0]).contains("a2V5"),
            "no key in Debug"
        );
    }
}
