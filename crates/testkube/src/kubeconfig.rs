//! The kubeconfig the server writes for kubectl, kube::Config and the python client.

use std::path::Path;

use base64::Engine;

/// Credentials a kubeconfig carries.
#[derive(Clone, Debug)]
pub enum Credentials {
    /// A client certificate and key (PEM).
    ClientCert {
        /// Certificate PEM.
        cert_pem: String,
        /// Private key PEM.
        key_pem: String,
    },
    /// A bearer token.
    Token(String),
}

/// Renders a kubeconfig for `server` trusting `ca_pem`, with one user and one context
/// named `testkube`.
pub fn render(server: &str, ca_pem: &str, creds: &Credentials) -> String {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let user = match creds {
        Credentials::ClientCert { cert_pem, key_pem } => format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(cert_pem),
            b64(key_pem)
        ),
        Credentials::Token(t) => format!("    token: {t}\n"),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: testkube\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\ncontexts:\n- name: testkube\n  context:\n    cluster: testkube\n    user: testkube\n    namespace: default\ncurrent-context: testkube\nusers:\n- name: testkube\n  user:\n{user}preferences: {{}}\n",
        b64(ca_pem)
    )
}

/// Writes a kubeconfig readable only by its owner (it holds a private key or token).
pub fn write(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(contents.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_rs_parses_the_rendered_config() {
        let text = render(
            "https://127.0.0.1:6443",
            "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n",
            &Credentials::Token("abc".into()),
        );
        let kc = kube::config::Kubeconfig::from_yaml(&text).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("testkube"));
        assert_eq!(
            kc.clusters[0].cluster.as_ref().unwrap().server.as_deref(),
            Some("https://127.0.0.1:6443")
        );
    }
}
