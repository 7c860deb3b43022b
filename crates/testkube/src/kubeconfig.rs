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

static TEMP_COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Writes a kubeconfig readable only by its owner (it holds a private key or token), the
/// way every secret file of the project is written: a new temporary file in the same
/// directory (`O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0600 set exactly), fsync, then a rename
/// over `path`. An existing file of any mode ends up 0600, and a symlink planted at `path`
/// is replaced, never followed.
pub fn write(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir)?;
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} names no file", path.display()),
        )
    })?;
    let tmp = dir.join(format!(
        ".{}.tmp.{}.{}",
        name.to_string_lossy(),
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
            .mode(0o600)
            .open(&tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        f.write_all(contents.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
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

    #[test]
    fn kubeconfig_write_is_0600_over_an_existing_0644_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        write(&path, "new").unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary file is left behind");
    }

    #[test]
    fn kubeconfig_write_never_follows_a_planted_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "precious").unwrap();
        let path = dir.path().join("kubeconfig");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        write(&path, "secret").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious");
        assert!(
            !std::fs::symlink_metadata(&path)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "secret");
    }
}
