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

/// What `certs check` says of one certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It could not be read or parsed (why).
    Unreadable(String),
    /// Its expiry has passed.
    Expired,
    /// It expires within the warning window.
    Expiring,
    /// Valid beyond the window.
    Ok,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Unreadable(e) => write!(f, "UNREADABLE: {e}"),
            Verdict::Expired => f.write_str("EXPIRED"),
            Verdict::Expiring => f.write_str("EXPIRING"),
            Verdict::Ok => f.write_str("ok"),
        }
    }
}

/// Seconds as `certs check` prints them: whole days, else hours, else minutes (`-` when
/// negative: an expired certificate's time left).
pub fn short_duration(secs: i64) -> String {
    let s = secs.unsigned_abs();
    let sign = if secs < 0 { "-" } else { "" };
    if s >= 86400 {
        format!("{sign}{}d", s / 86400)
    } else if s >= 3600 {
        format!("{sign}{}h", s / 3600)
    } else {
        format!("{sign}{}m", s / 60)
    }
}

impl CertStatus {
    /// This certificate's verdict with a warning window of `within`.
    pub fn verdict(&self, within: Duration) -> Verdict {
        match (&self.error, self.remaining_secs) {
            (Some(e), _) => Verdict::Unreadable(e.clone()),
            (None, None) => Verdict::Unreadable("no expiry".into()),
            (None, Some(left)) if left <= 0 => Verdict::Expired,
            (None, Some(_)) if self.needs_attention(within) => Verdict::Expiring,
            (None, Some(_)) => Verdict::Ok,
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(remaining_secs: Option<i64>, error: Option<&str>) -> CertStatus {
        CertStatus {
            path: "ca.crt".into(),
            subject: String::new(),
            not_after_unix: None,
            not_after: String::new(),
            remaining_secs,
            error: error.map(Into::into),
        }
    }

    #[test]
    fn verdicts_at_the_window_edges() {
        let day = Duration::from_secs(86400);
        assert_eq!(cert(Some(0), None).verdict(day), Verdict::Expired);
        assert_eq!(cert(Some(-5), None).verdict(day), Verdict::Expired);
        assert_eq!(cert(Some(86399), None).verdict(day), Verdict::Expiring);
        assert_eq!(cert(Some(86400), None).verdict(day), Verdict::Ok);
        assert_eq!(
            cert(None, Some("bad PEM")).verdict(day).to_string(),
            "UNREADABLE: bad PEM"
        );
        assert!(matches!(
            cert(None, None).verdict(day),
            Verdict::Unreadable(_)
        ));
        assert_eq!(Verdict::Expiring.to_string(), "EXPIRING");
    }

    #[test]
    fn short_durations() {
        assert_eq!(short_duration(3 * 86400 + 5), "3d");
        assert_eq!(short_duration(86399), "23h");
        assert_eq!(short_duration(3600), "1h");
        assert_eq!(short_duration(3599), "59m");
        assert_eq!(short_duration(-7200), "-2h");
    }
}
