//! The pki dir side of a grant: which files a bundle may carry, reading them for an
//! upload, and writing a downloaded set so that either every file lands or none does.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use super::GrantError;

/// The at-rest encryption config, relative to the pki dir. Optional: carried when present,
/// and then the bundle "carries the key".
pub const ENCRYPTION_CONFIG_FILE: &str = "encryption-config.yaml";

/// Whether a bundle may carry `rel`: the shared set and the encryption config, nothing
/// else. A bundle naming `../../etc/passwd` is refused before anything is written.
pub fn is_allowed_path(rel: &str) -> bool {
    rel == ENCRYPTION_CONFIG_FILE || pki::SHARED_FILES.contains(&rel)
}

/// The mode a downloaded file is written with. The encryption config holds a key though
/// its name does not end in `.key`.
pub fn mode_for(rel: &str) -> u32 {
    if rel == ENCRYPTION_CONFIG_FILE {
        pki::KEY_MODE
    } else {
        pki::file_mode(rel)
    }
}

/// Checks a bundle's file set: every path allowed, every shared file present.
pub fn validate_files(entry: &str, files: &BTreeMap<String, Vec<u8>>) -> Result<(), GrantError> {
    if let Some(path) = files.keys().find(|p| !is_allowed_path(p)) {
        return Err(GrantError::UnexpectedFile {
            entry: entry.to_string(),
            path: path.clone(),
        });
    }
    if let Some(path) = pki::SHARED_FILES.iter().find(|p| !files.contains_key(**p)) {
        return Err(GrantError::IncompleteBundle {
            entry: entry.to_string(),
            path: path.to_string(),
        });
    }
    Ok(())
}

/// Reads what an upload publishes from `pki_dir`: every shared file (all required) and the
/// encryption config when present.
pub fn read_bundle_files(pki_dir: &Path) -> Result<BTreeMap<String, Vec<u8>>, GrantError> {
    let mut files: BTreeMap<String, Vec<u8>> = pki::read_shared(pki_dir)?.into_iter().collect();
    let path = pki_dir.join(ENCRYPTION_CONFIG_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            files.insert(ENCRYPTION_CONFIG_FILE.to_string(), bytes);
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(GrantError::Io {
                op: "read",
                path,
                source,
            });
        }
    }
    Ok(files)
}

/// Writes `files` under `pki_dir`: first every file to a temporary sibling (with its final
/// mode, synced), and only when all of them are staged, renames each into place and syncs
/// the directories. A failure while staging removes the temporaries and leaves every
/// existing file as it was.
pub fn write_bundle_files(
    pki_dir: &Path,
    files: &BTreeMap<String, Vec<u8>>,
) -> Result<Vec<PathBuf>, GrantError> {
    let mut staged: Vec<(PathBuf, PathBuf)> = Vec::with_capacity(files.len());
    let result = (|| {
        for (rel, bytes) in files {
            let target = pki_dir.join(rel);
            let dir = target.parent().unwrap_or(pki_dir).to_path_buf();
            std::fs::create_dir_all(&dir).map_err(|source| GrantError::Io {
                op: "create directory",
                path: dir.clone(),
                source,
            })?;
            let name = target
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let tmp = dir.join(format!(".{name}.stratum-download.{}", std::process::id()));
            let mode = mode_for(rel);
            let io = |op: &'static str| {
                let tmp = tmp.clone();
                move |source| GrantError::Io {
                    op,
                    path: tmp,
                    source,
                }
            };
            // A leftover from a killed run would make create_new fail; it is ours to remove.
            let _ = std::fs::remove_file(&tmp);
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(mode)
                .open(&tmp)
                .map_err(io("create"))?;
            staged.push((tmp.clone(), target));
            file.set_permissions(std::fs::Permissions::from_mode(mode))
                .map_err(io("chmod"))?;
            file.write_all(bytes).map_err(io("write"))?;
            file.sync_all().map_err(io("fsync"))?;
        }
        Ok(())
    })();
    if let Err(err) = result {
        for (tmp, _) in &staged {
            let _ = std::fs::remove_file(tmp);
        }
        return Err(err);
    }
    let mut written = Vec::with_capacity(staged.len());
    let mut dirs = std::collections::BTreeSet::new();
    for (tmp, target) in &staged {
        std::fs::rename(tmp, target).map_err(|source| GrantError::Io {
            op: "rename into place",
            path: target.clone(),
            source,
        })?;
        if let Some(dir) = target.parent() {
            dirs.insert(dir.to_path_buf());
        }
        written.push(target.clone());
    }
    for dir in dirs {
        let sync = std::fs::File::open(&dir).and_then(|d| d.sync_all());
        sync.map_err(|source| GrantError::Io {
            op: "fsync directory",
            path: dir,
            source,
        })?;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_shared_set_and_the_encryption_config_are_allowed() {
        for rel in pki::SHARED_FILES {
            assert!(is_allowed_path(rel), "{rel}");
        }
        assert!(is_allowed_path(ENCRYPTION_CONFIG_FILE));
        for bad in [
            "../ca.key",
            "/etc/passwd",
            "apiserver.key",
            "etcd/../ca.key",
            "",
        ] {
            assert!(!is_allowed_path(bad), "{bad}");
        }
    }

    #[test]
    fn modes_protect_keys_and_the_encryption_config() {
        assert_eq!(mode_for("ca.key"), 0o600);
        assert_eq!(mode_for(ENCRYPTION_CONFIG_FILE), 0o600);
        assert_eq!(mode_for("ca.crt"), 0o644);
    }

    #[test]
    fn validation_names_the_entry_and_the_file() {
        let mut files: BTreeMap<String, Vec<u8>> = pki::SHARED_FILES
            .iter()
            .map(|p| (p.to_string(), b"x".to_vec()))
            .collect();
        validate_files("certs-abcdef", &files).unwrap();
        files.insert("../escape".into(), vec![]);
        let err = validate_files("certs-abcdef", &files)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("certs-abcdef") && err.contains("../escape"),
            "{err}"
        );
        files.remove("../escape");
        files.remove("sa.key");
        let err = validate_files("certs-abcdef", &files)
            .unwrap_err()
            .to_string();
        assert!(err.contains("sa.key"), "{err}");
    }

    #[test]
    fn staged_write_lands_every_file_with_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let files = BTreeMap::from([
            ("ca.crt".to_string(), b"cert".to_vec()),
            ("etcd/ca.key".to_string(), b"key".to_vec()),
        ]);
        let written = write_bundle_files(dir.path(), &files).unwrap();
        assert_eq!(written.len(), 2);
        assert_eq!(std::fs::read(dir.path().join("ca.crt")).unwrap(), b"cert");
        let meta = std::fs::metadata(dir.path().join("etcd/ca.key")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn a_staging_failure_leaves_existing_files_alone() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.crt"), b"old").unwrap();
        // "etcd" is a file, so staging etcd/ca.key fails after ca.crt was staged.
        std::fs::write(dir.path().join("etcd"), b"not a directory").unwrap();
        let files = BTreeMap::from([
            ("ca.crt".to_string(), b"new".to_vec()),
            ("etcd/ca.key".to_string(), b"key".to_vec()),
        ]);
        assert!(write_bundle_files(dir.path(), &files).is_err());
        assert_eq!(std::fs::read(dir.path().join("ca.crt")).unwrap(), b"old");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "no temporaries left: {names:?}");
    }
}
