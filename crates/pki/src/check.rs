//! Expiry of the certificates on disk.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{PkiError, pem_to_der};

/// One certificate file's state.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CertStatus {
    /// The file.
    pub path: PathBuf,
    /// Subject, as x509 prints it ("" when unreadable).
    pub subject: String,
    /// Expiry as seconds since the Unix epoch (None when unreadable).
    pub not_after_unix: Option<i64>,
    /// Expiry, human-readable ("" when unreadable).
    pub not_after: String,
    /// Seconds left until expiry at the time of the check (negative: expired).
    pub remaining_secs: Option<i64>,
    /// Why the file could not be read or parsed.
    pub error: Option<String>,
}

impl CertStatus {
    /// Whether this certificate is unreadable, expired, or expires within `within`.
    pub fn needs_attention(&self, within: Duration) -> bool {
        match self.remaining_secs {
            None => true,
            Some(left) => left < within.as_secs() as i64,
        }
    }
}

/// Every certificate under a PKI directory.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckReport {
    /// One entry per `*.crt` file, sorted by path.
    pub certs: Vec<CertStatus>,
}

impl CheckReport {
    /// The certificates that are unreadable or expire within `within`.
    pub fn attention(&self, within: Duration) -> Vec<&CertStatus> {
        self.certs
            .iter()
            .filter(|c| c.needs_attention(within))
            .collect()
    }
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), PkiError> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            PkiError::Missing {
                path: dir.to_path_buf(),
                hint: "no PKI directory here: pass --pki-dir, or run `stratum-server certs generate`",
            }
        } else {
            PkiError::io("read directory", dir, e)
        }
    })?;
    for entry in entries {
        let entry = entry.map_err(|e| PkiError::io("read directory", dir, e))?;
        let path = entry.path();
        let ty = entry
            .file_type()
            .map_err(|e| PkiError::io("stat", &path, e))?;
        if ty.is_dir() {
            collect(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "crt") {
            out.push(path);
        }
    }
    Ok(())
}

fn status(path: PathBuf, now: SystemTime) -> CertStatus {
    let unreadable = |path: PathBuf, error: String| CertStatus {
        path,
        subject: String::new(),
        not_after_unix: None,
        not_after: String::new(),
        remaining_secs: None,
        error: Some(error),
    };
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => return unreadable(path, format!("cannot read: {e}")),
    };
    let der = match pem_to_der(&bytes, &path.display().to_string()) {
        Ok(d) => d,
        Err(e) => return unreadable(path, e.to_string()),
    };
    let cert = match x509_parser::parse_x509_certificate(&der) {
        Ok((_, c)) => c,
        Err(e) => return unreadable(path, format!("not a certificate: {e}")),
    };
    let not_after = cert.validity().not_after;
    let now_unix = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    CertStatus {
        subject: cert.subject().to_string(),
        not_after_unix: Some(not_after.timestamp()),
        not_after: not_after.to_string(),
        remaining_secs: Some(not_after.timestamp() - now_unix),
        error: None,
        path,
    }
}

/// Reads every `*.crt` under `dir` (recursively) and reports its expiry relative to
/// `now`. An unreadable or unparsable certificate is reported, not skipped: it is as bad
/// as an expired one. A missing directory is an error.
pub fn check(dir: &Path, now: SystemTime) -> Result<CheckReport, PkiError> {
    let mut paths = Vec::new();
    collect(dir, &mut paths)?;
    paths.sort();
    Ok(CheckReport {
        certs: paths.into_iter().map(|p| status(p, now)).collect(),
    })
}
