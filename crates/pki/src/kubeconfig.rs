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

/// Renders one kubeconfig. JSON-quoted strings are valid YAML scalars, so no YAML
/// library is needed and no value can break the document.
fn render(server: &str, user: &str, ca_pem: &str, cert: &str, key: &str) -> String {
    let q = |s: &str| serde_json_quote(s);
    let b = |s: &str| STANDARD.encode(s.as_bytes());
    // Lines joined explicitly: a `\` line continuation in a literal would eat the
    // indentation YAML depends on.
    let ctx = q(&format!("{user}@kubernetes"));
    let user = q(user);
    [
        "apiVersion: v1".to_string(),
        "kind: Config".to_string(),
        "clusters:".to_string(),
        "- name: kubernetes".to_string(),
        "  cluster:".to_string(),
        format!("    server: {}", q(server)),
        format!("    certificate-authority-data: {}", b(ca_pem)),
        "users:".to_string(),
        format!("- name: {user}"),
        "  user:".to_string(),
        format!("    client-certificate-data: {}", b(cert)),
        format!("    client-key-data: {}", b(key)),
        "contexts:".to_string(),
        format!("- name: {ctx}"),
        "  context:".to_string(),
        "    cluster: kubernetes".to_string(),
        format!("    user: {user}"),
        format!("current-context: {ctx}"),
        String::new(),
    ]
    .join("\n")
}

fn serde_json_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
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
    if !server.starts_with("https://") {
        return Err(PkiError::Invalid {
            what: "kubeconfig server".into(),
            reason: format!("{server:?} is not an https:// URL"),
        });
    }
    if !overwrite {
        for (file, _, _) in KUBECONFIG_FILES {
            let path = out_dir.join(file);
            if path.exists() {
                return Err(PkiError::KeyExists { path });
            }
        }
    }
    let ca = Ca::load(pki_dir, "ca")?;
    let mut rendered = Vec::new();
    for (file, cn, groups) in KUBECONFIG_FILES {
        let mut spec = LeafSpec::new(*cn, &[Usage::ClientAuth]);
        spec.organizations = groups.iter().map(|g| g.to_string()).collect();
        let issued = ca.issue(&spec)?;
        rendered.push((
            out_dir.join(file),
            render(server, cn, ca.cert_pem(), &issued.cert_pem, &issued.key_pem),
        ));
    }
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
    fn quoting_survives_hostile_values() {
        assert_eq!(serde_json_quote("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}
