//! The cluster PKI: CAs, leaf certificates and kubeconfigs, written safely.
//!
//! A control plane stands on a small set of shared secrets (the cluster CA, the
//! front-proxy CA, the etcd CA and the service-account signing key pair: see
//! [`SHARED_FILES`]) and on per-node leaves issued from them. This crate creates that
//! material, loads an existing CA back from disk to issue more leaves ([`Ca::load`]),
//! writes every file atomically with the right mode ([`write_atomic`]: keys 0600,
//! certificates 0644), refuses to replace an existing key unless asked, and reports
//! expiry ([`check`]).
//!
//! Main entry points:
//! - [`plan_pki`]: the whole PKI of a node (shared CAs or, with `leaves_only`, the CAs on
//!   disk; this node's leaves; the kubeconfigs) generated in memory as a [`PkiPlan`],
//!   refused with [`PkiError::WouldOverwrite`] before anything is generated or written
//!   when a key it would replace exists; [`PkiPlan::apply`] writes it. `certs generate`
//!   is this call.
//! - [`generate_shared`]: the CAs and service-account key pair of a new cluster.
//! - [`issue_node_leaves`]: this node's apiserver, etcd and front-proxy leaves
//!   ([`NodeIdentity`] carries its name, addresses and the VIP).
//! - [`write_kubeconfigs`]: admin, super-admin, controller-manager and scheduler
//!   kubeconfigs with embedded client certificates. `admin.conf` is in
//!   [`CLUSTER_ADMINS_GROUP`] (bound to `cluster-admin` by RBAC, revocable);
//!   `super-admin.conf` is the break-glass credential in `system:masters`. They are
//!   typed ([`Kubeconfig`]) and serialized with serde, never assembled from strings.
//!
//! Certificates carry random 158-bit serials; CAs are `pathlen:0` and, like every leaf,
//! have no `keyEncipherment` (ECDSA keys sign, they do not encipher); a leaf never
//! outlives its CA.
//! - [`ca_cert_hash`]: the `sha256:<hex>` pin a joining node checks the CA against.
//! - [`Ca`] and [`LeafSpec`]: issue arbitrary leaves in memory (test harnesses use this).
//!
//! Every key is ECDSA P-256. kubeadm uses RSA-2048; rcgen can only generate RSA keys with
//! the aws-lc backend, and this workspace builds on ring. Kubernetes accepts ECDSA for
//! every role here, including the service-account key (tokens are then ES256).

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
mod ca;
mod check;
pub mod kubeconfig;
mod node;
mod plan;

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

pub use ca::{Ca, IssuedCert, LeafSpec, Usage};
pub use check::{CertStatus, CheckReport, Verdict, check, short_duration};
pub use kubeconfig::{
    CLUSTER_ADMINS_GROUP, KUBECONFIG_FILES, Kubeconfig, SUPER_ADMIN_KUBECONFIG, write_kubeconfigs,
};
pub use node::{NodeIdentity, issue_node_leaves, node_leaf_files};
pub use plan::{PkiPlan, PkiRequest, default_kubeconfig_dir, default_server, plan_pki};

/// Where the PKI lives when no directory is given (kubeadm's layout).
pub const DEFAULT_PKI_DIR: &str = "/etc/kubernetes/pki";

/// The shared control-plane material, as paths relative to the PKI directory. Every
/// control plane of a cluster holds the same bytes for these files; a joining control
/// plane downloads them and issues its own leaves from them.
pub const SHARED_FILES: &[&str] = &[
    "ca.crt",
    "ca.key",
    "front-proxy-ca.crt",
    "front-proxy-ca.key",
    "etcd/ca.crt",
    "etcd/ca.key",
    "sa.key",
    "sa.pub",
];

/// Mode of a private key file.
pub const KEY_MODE: u32 = 0o600;
/// Mode of a certificate or public key file.
pub const CERT_MODE: u32 = 0o644;

/// The mode a PKI file is written with: 0600 for private keys (`*.key`), 0644 otherwise.
pub fn file_mode(rel: &str) -> u32 {
    if is_private(rel) { KEY_MODE } else { CERT_MODE }
}

/// Whether a PKI file (by relative path or name) holds a private key.
pub fn is_private(rel: &str) -> bool {
    rel.ends_with(".key")
}

/// What went wrong, naming the file or certificate involved.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// A file could not be read, written, synced or renamed.
    #[error("{op} {path}")]
    Io {
        /// What was being done ("write", "read", "rename", ...).
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A key already exists and overwriting was not asked for.
    #[error(
        "refusing to overwrite existing key {path}: pass --force (overwrite = true) to replace it, \
         or move it away first; nothing was written"
    )]
    KeyExists {
        /// The existing key file.
        path: PathBuf,
    },
    /// A planned write would replace an existing key, kubeconfig or leaf key, and
    /// overwriting was not asked for ([`plan_pki`] refuses before writing anything).
    #[error(
        "refusing to overwrite existing key {path}: pass --force to replace it{}; nothing was written",
        if *shared { ", or --leaves-only to keep the shared CAs and issue only this node's leaves" } else { "" }
    )]
    WouldOverwrite {
        /// The existing file.
        path: PathBuf,
        /// Whether the plan also created the shared CAs (so keeping them is an option).
        shared: bool,
    },
    /// A file that must exist does not.
    #[error("{path} not found: {hint}")]
    Missing {
        /// The missing file.
        path: PathBuf,
        /// What to do about it.
        hint: &'static str,
    },
    /// A certificate or key could not be parsed.
    #[error("cannot parse {what}: {reason}")]
    Parse {
        /// The file or object (e.g. a path, "PEM input").
        what: String,
        /// Why.
        reason: String,
    },
    /// Key or certificate generation failed.
    #[error("cannot generate {what}")]
    Generate {
        /// The certificate or key being generated.
        what: String,
        /// rcgen's error.
        #[source]
        source: rcgen::Error,
    },
    /// Input that cannot become a certificate (a bad name, an empty SAN list, ...).
    #[error("invalid input for {what}: {reason}")]
    Invalid {
        /// The certificate or field.
        what: String,
        /// Why.
        reason: String,
    },
}

impl PkiError {
    pub(crate) fn io(op: &'static str, path: &Path, source: std::io::Error) -> Self {
        PkiError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The CA hash pin of a PEM certificate, in kubeadm's `--discovery-token-ca-cert-hash`
/// form: `sha256:` and the lowercase hex SHA-256 of the certificate's DER-encoded
/// SubjectPublicKeyInfo. Pinning the public key (not the whole certificate) keeps the pin
/// valid across a CA renewal that keeps its key.
pub fn ca_cert_hash(cert_pem: &[u8]) -> Result<String, PkiError> {
    let der = pem_to_der(cert_pem, "PEM input")?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).map_err(|e| PkiError::Parse {
        what: "certificate".into(),
        reason: e.to_string(),
    })?;
    let spki = cert.tbs_certificate.subject_pki.raw;
    Ok(format!("sha256:{}", hex::encode(Sha256::digest(spki))))
}

/// The DER of the first CERTIFICATE block in `pem`.
pub(crate) fn pem_to_der(pem: &[u8], what: &str) -> Result<Vec<u8>, PkiError> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem).map_err(|e| PkiError::Parse {
        what: what.to_string(),
        reason: format!("not a PEM certificate: {e}"),
    })?;
    if block.label != "CERTIFICATE" {
        return Err(PkiError::Parse {
            what: what.to_string(),
            reason: format!("PEM block is {:?}, not CERTIFICATE", block.label),
        });
    }
    Ok(block.contents)
}

/// Writes `bytes` to `path` so that a reader sees either the old file or the whole new
/// one, never a torn write, and the new one survives a power cut: a temporary file in the
/// same directory (created with `mode`, so a key is never readable by others even
/// briefly), fsync, rename over `path`, fsync of the directory. Missing parent
/// directories are created (0755). The writer is `common::fsutil::write_atomic`.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), PkiError> {
    common::fsutil::write_atomic(path, bytes, mode, None)
        .map_err(|e| PkiError::io(e.op, &e.path, e.source))
}

/// Refuses, before anything is written, when any of `rels` under `dir` is an existing
/// private key and `overwrite` is false.
pub(crate) fn refuse_existing_keys(
    dir: &Path,
    rels: &[&str],
    overwrite: bool,
) -> Result<(), PkiError> {
    if overwrite {
        return Ok(());
    }
    for rel in rels.iter().filter(|r| is_private(r)) {
        let path = dir.join(rel);
        if path.exists() {
            return Err(PkiError::KeyExists { path });
        }
    }
    Ok(())
}

/// Writes `files` (relative path, bytes) under `dir` with [`file_mode`], returning the
/// paths written.
pub(crate) fn write_files(
    dir: &Path,
    files: &[(String, Vec<u8>)],
) -> Result<Vec<PathBuf>, PkiError> {
    let mut written = Vec::with_capacity(files.len());
    for (rel, bytes) in files {
        let path = dir.join(rel);
        write_atomic(&path, bytes, file_mode(rel))?;
        written.push(path);
    }
    Ok(written)
}

/// Creates the shared control-plane material in `dir` (every path of [`SHARED_FILES`]):
/// the cluster CA, the front-proxy CA, the etcd CA and the service-account key pair.
///
/// With `overwrite` false it refuses, before writing anything, when any of those keys
/// already exists ([`PkiError::KeyExists`] names the file). Returns the paths written.
pub fn generate_shared(dir: &Path, overwrite: bool) -> Result<Vec<PathBuf>, PkiError> {
    refuse_existing_keys(dir, SHARED_FILES, overwrite)?;
    let shared = Shared::generate()?;
    write_files(dir, &shared.files)
}

/// A new cluster's shared material, in memory: the three CAs and every file of
/// [`SHARED_FILES`].
pub(crate) struct Shared {
    /// (relative path, bytes), in [`SHARED_FILES`] order.
    pub(crate) files: Vec<(String, Vec<u8>)>,
    /// The CAs by prefix: `ca`, `front-proxy-ca`, `etcd/ca`.
    pub(crate) cas: Vec<(&'static str, Ca)>,
}

impl Shared {
    pub(crate) fn generate() -> Result<Shared, PkiError> {
        let mut files = Vec::new();
        let mut cas = Vec::new();
        for (prefix, cn) in [
            ("ca", "kubernetes"),
            ("front-proxy-ca", "front-proxy-ca"),
            ("etcd/ca", "etcd-ca"),
        ] {
            let ca = Ca::generate(cn)?;
            files.push((format!("{prefix}.crt"), ca.cert_pem().as_bytes().to_vec()));
            files.push((format!("{prefix}.key"), ca.key_pem().into_bytes()));
            cas.push((prefix, ca));
        }
        let sa = rcgen::KeyPair::generate().map_err(|source| PkiError::Generate {
            what: "service-account key pair".into(),
            source,
        })?;
        files.push(("sa.key".into(), sa.serialize_pem().into_bytes()));
        files.push(("sa.pub".into(), sa.public_key_pem().into_bytes()));
        Ok(Shared { files, cas })
    }
}

/// Reads the shared material from `dir` as (relative path, bytes), in [`SHARED_FILES`]
/// order. A missing file is [`PkiError::Missing`].
pub fn read_shared(dir: &Path) -> Result<Vec<(String, Vec<u8>)>, PkiError> {
    SHARED_FILES
        .iter()
        .map(|rel| {
            let path = dir.join(rel);
            match std::fs::read(&path) {
                Ok(b) => Ok((rel.to_string(), b)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(PkiError::Missing {
                    path,
                    hint: "the shared control-plane material is incomplete: run `stratum-server certs generate` on the first control plane, or download it on a joining one",
                }),
                Err(e) => Err(PkiError::io("read", &path, e)),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_follow_the_file_kind() {
        assert_eq!(file_mode("ca.key"), 0o600);
        assert_eq!(file_mode("etcd/ca.key"), 0o600);
        assert_eq!(file_mode("sa.pub"), 0o644);
        assert_eq!(file_mode("etcd/ca.crt"), 0o644);
    }

    #[test]
    fn shared_files_hold_every_ca_and_the_sa_pair() {
        let keys = SHARED_FILES.iter().filter(|f| is_private(f)).count();
        assert_eq!(keys, 4, "three CA keys and sa.key");
        assert_eq!(SHARED_FILES.len(), 8);
    }

    #[test]
    fn ca_cert_hash_rejects_garbage() {
        assert!(matches!(
            ca_cert_hash(b"not a certificate"),
            Err(PkiError::Parse { .. })
        ));
    }
}
