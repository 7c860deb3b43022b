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

/// The staging directory of a download into `pki_dir`: a hidden sibling
/// (`/etc/kubernetes/.pki.stratum-staging`), on the same filesystem so the switch is one
/// rename.
pub fn staging_dir(pki_dir: &Path) -> PathBuf {
    let name = pki_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "pki".into());
    pki_dir
        .parent()
        .unwrap_or(Path::new("."))
        .join(format!(".{name}.stratum-staging"))
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> GrantError {
    let path = path.to_path_buf();
    move |source| GrantError::Io { op, path, source }
}

/// Removes what a killed or failed earlier download left behind: the staging directory
/// (new keys not switched in, or old ones not yet removed) and the per-file temporaries
/// (`.<name>.stratum-download.<pid>`) earlier releases staged inside the pki dir. Does not
/// follow symlinks.
pub fn clean_stale_staging(pki_dir: &Path) -> Result<(), GrantError> {
    for dir in [pki_dir.to_path_buf(), pki_dir.join("etcd")] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') && name.contains(".stratum-download.") {
                let path = entry.path();
                std::fs::remove_file(&path).map_err(io_err("remove stale temporary", &path))?;
            }
        }
    }
    let staging = staging_dir(pki_dir);
    match std::fs::symlink_metadata(&staging) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("inspect stale staging", &staging)(e)),
        Ok(meta) if meta.is_dir() => {
            tracing::warn!(staging = %staging.display(), "removing the staging directory an earlier download left behind");
            std::fs::remove_dir_all(&staging).map_err(io_err("remove stale staging", &staging))
        }
        Ok(_) => std::fs::remove_file(&staging).map_err(io_err("remove stale staging", &staging)),
    }
}

/// Copies the tree at `from` into `to` (which exists) by hard links, keeping directories'
/// modes and symlinks as symlinks, except the paths in `skip` (relative).
fn link_tree(
    from: &Path,
    to: &Path,
    rel: &Path,
    skip: &std::collections::BTreeSet<PathBuf>,
) -> Result<(), GrantError> {
    let dir = from.join(rel);
    for entry in std::fs::read_dir(&dir).map_err(io_err("read directory", &dir))? {
        let entry = entry.map_err(io_err("read directory", &dir))?;
        let rel = rel.join(entry.file_name());
        if skip.contains(&rel) {
            continue;
        }
        let src = from.join(&rel);
        let dst = to.join(&rel);
        let meta = std::fs::symlink_metadata(&src).map_err(io_err("inspect", &src))?;
        let kind = meta.file_type();
        if kind.is_symlink() {
            let target = std::fs::read_link(&src).map_err(io_err("read symlink", &src))?;
            std::os::unix::fs::symlink(target, &dst).map_err(io_err("copy symlink", &dst))?;
        } else if kind.is_dir() {
            std::fs::create_dir(&dst).map_err(io_err("create directory", &dst))?;
            std::fs::set_permissions(&dst, meta.permissions()).map_err(io_err("chmod", &dst))?;
            link_tree(from, to, &rel, skip)?;
        } else if kind.is_file() {
            std::fs::hard_link(&src, &dst).map_err(io_err("hard-link", &dst))?;
        }
        // Sockets, FIFOs and devices have no place in a pki dir and are not carried over.
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), GrantError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync directory", dir))
}

/// Swaps `staging` and `pki_dir` (siblings) in one `renameat2(RENAME_EXCHANGE)` through
/// their parent directory's descriptor; a `pki_dir` that does not exist yet is a plain
/// rename that refuses to replace anything created meanwhile.
fn switch_in(staging: &Path, pki_dir: &Path, exists: bool) -> Result<(), GrantError> {
    use nix::fcntl::{RenameFlags, renameat2};
    let parent = pki_dir.parent().unwrap_or(Path::new("."));
    let parent_fd = std::fs::File::open(parent).map_err(io_err("open directory", parent))?;
    let (Some(staged_name), Some(pki_name)) = (staging.file_name(), pki_dir.file_name()) else {
        return Err(GrantError::Io {
            op: "name",
            path: pki_dir.to_path_buf(),
            source: std::io::Error::other("the pki dir has no file name"),
        });
    };
    let flags = if exists {
        RenameFlags::RENAME_EXCHANGE
    } else {
        RenameFlags::RENAME_NOREPLACE
    };
    renameat2(&parent_fd, staged_name, &parent_fd, pki_name, flags)
        .map_err(|e| io_err("switch the staged download into place", pki_dir)(e.into()))?;
    parent_fd
        .sync_all()
        .map_err(io_err("fsync directory", parent))
}

/// Writes `files` into `pki_dir` so that either every file lands or none does, with no
/// file holding a key left anywhere else after a failure or a crash. The new pki dir is
/// staged whole in [`staging_dir`] (the files already in `pki_dir` hard-linked, the
/// downloaded ones written with their final modes and synced), then switched in with one
/// rename that exchanges the two directories; the old tree, now at the staging path, is
/// removed. A staging directory left by a killed run is removed first
/// ([`clean_stale_staging`]). A `pki_dir` that is a symlink is refused: the swap would
/// replace the link, not the directory it names.
pub fn write_bundle_files(
    pki_dir: &Path,
    files: &BTreeMap<String, Vec<u8>>,
) -> Result<Vec<PathBuf>, GrantError> {
    let exists = match std::fs::symlink_metadata(pki_dir) {
        Ok(meta) if meta.file_type().is_symlink() => {
            return Err(GrantError::Io {
                op: "refuse to download into",
                path: pki_dir.to_path_buf(),
                source: std::io::Error::other(
                    "it is a symlink: pass the directory it points to as the pki dir",
                ),
            });
        }
        Ok(meta) if meta.is_dir() => true,
        Ok(_) => {
            return Err(GrantError::Io {
                op: "refuse to download into",
                path: pki_dir.to_path_buf(),
                source: std::io::Error::other("it is not a directory"),
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(io_err("inspect", pki_dir)(e)),
    };
    if let Some(parent) = pki_dir.parent() {
        std::fs::create_dir_all(parent).map_err(io_err("create directory", parent))?;
    }
    clean_stale_staging(pki_dir)?;
    let staging = staging_dir(pki_dir);
    let staged = stage(pki_dir, &staging, exists, files)
        .and_then(|written| switch_in(&staging, pki_dir, exists).map(|()| written));
    match staged {
        Ok(written) => {
            if exists && let Err(e) = std::fs::remove_dir_all(&staging) {
                // The old tree's keys stay until the next download removes them.
                tracing::warn!(staging = %staging.display(), error = %e, "cannot remove the replaced pki tree; the next download removes it");
            }
            Ok(written)
        }
        Err(err) => {
            let _ = std::fs::remove_dir_all(&staging);
            Err(err)
        }
    }
}

/// Builds the new tree in `staging`: the current pki dir's entries hard-linked, then the
/// downloaded files. Returns their final paths.
fn stage(
    pki_dir: &Path,
    staging: &Path,
    exists: bool,
    files: &BTreeMap<String, Vec<u8>>,
) -> Result<Vec<PathBuf>, GrantError> {
    let mode = if exists {
        std::fs::metadata(pki_dir)
            .map_err(io_err("inspect", pki_dir))?
            .permissions()
            .mode()
            & 0o7777
    } else {
        0o755
    };
    std::fs::create_dir(staging).map_err(io_err("create directory", staging))?;
    std::fs::set_permissions(staging, std::fs::Permissions::from_mode(mode))
        .map_err(io_err("chmod", staging))?;
    let replaced: std::collections::BTreeSet<PathBuf> = files.keys().map(PathBuf::from).collect();
    if exists {
        link_tree(pki_dir, staging, Path::new(""), &replaced)?;
    }
    let mut dirs = std::collections::BTreeSet::from([staging.to_path_buf()]);
    let mut written = Vec::with_capacity(files.len());
    for (rel, bytes) in files {
        let target = staging.join(rel);
        let dir = target.parent().unwrap_or(staging).to_path_buf();
        std::fs::create_dir_all(&dir).map_err(io_err("create directory", &dir))?;
        let mode = mode_for(rel);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&target)
            .map_err(io_err("create", &target))?;
        file.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(io_err("chmod", &target))?;
        file.write_all(bytes).map_err(io_err("write", &target))?;
        file.sync_all().map_err(io_err("fsync", &target))?;
        dirs.insert(dir);
        written.push(pki_dir.join(rel));
    }
    for dir in &dirs {
        sync_dir(dir)?;
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

    fn bundle(tag: &str) -> BTreeMap<String, Vec<u8>> {
        BTreeMap::from([
            ("ca.crt".to_string(), format!("{tag} cert").into_bytes()),
            ("ca.key".to_string(), format!("{tag} KEY").into_bytes()),
            (
                "etcd/ca.key".to_string(),
                format!("{tag} etcd KEY").into_bytes(),
            ),
        ])
    }

    /// Every file under `root` (recursively, symlinks not followed) whose content
    /// mentions `needle`.
    fn files_mentioning(root: &Path, needle: &str) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap().flatten() {
                let ft = e.file_type().unwrap();
                if ft.is_dir() {
                    stack.push(e.path());
                } else if ft.is_file()
                    && String::from_utf8_lossy(&std::fs::read(e.path()).unwrap()).contains(needle)
                {
                    out.push(e.path());
                }
            }
        }
        out.sort();
        out
    }

    #[test]
    fn a_download_failing_at_the_switch_leaves_no_mix_and_no_key_copies() {
        let root = tempfile::tempdir().unwrap();
        let pki = root.path().join("pki");
        std::fs::create_dir_all(pki.join("etcd")).unwrap();
        write_bundle_files(&pki, &bundle("old")).unwrap();
        std::fs::write(pki.join("apiserver.crt"), b"leaf").unwrap();
        // The last file's place is taken by a non-empty directory: moving files one by one
        // fails half way there; the whole tree either switches or stays.
        std::fs::remove_file(pki.join("etcd/ca.key")).unwrap();
        std::fs::create_dir_all(pki.join("etcd/ca.key/inner")).unwrap();
        let result = write_bundle_files(&pki, &bundle("new"));
        let old = files_mentioning(root.path(), "old");
        let new = files_mentioning(root.path(), "new");
        match result {
            Ok(_) => {
                assert!(old.is_empty(), "old material left: {old:?}");
                assert_eq!(new.len(), 3, "{new:?}");
            }
            Err(_) => {
                assert!(new.is_empty(), "new material left after a failure: {new:?}");
            }
        }
        assert_eq!(std::fs::read(pki.join("apiserver.crt")).unwrap(), b"leaf");
        for path in old.iter().chain(&new) {
            assert!(
                path.starts_with(&pki),
                "a key outside the pki dir: {}",
                path.display()
            );
            let name = path.file_name().unwrap().to_string_lossy();
            assert!(
                !name.starts_with('.'),
                "a temporary holding a key: {}",
                path.display()
            );
        }
    }

    #[test]
    fn staging_a_killed_download_left_is_cleaned_at_the_next_run() {
        let root = tempfile::tempdir().unwrap();
        let pki = root.path().join("pki");
        write_bundle_files(&pki, &bundle("old")).unwrap();
        // What a download killed before or after its switch leaves: a staging tree with
        // keys, and (older releases) per-file temporaries inside the pki dir.
        let staging = staging_dir(&pki);
        std::fs::create_dir_all(staging.join("etcd")).unwrap();
        std::fs::write(staging.join("etcd/ca.key"), b"stale KEY").unwrap();
        std::fs::write(pki.join(".ca.key.stratum-download.4242"), b"stale KEY").unwrap();
        write_bundle_files(&pki, &bundle("new")).unwrap();
        assert!(!staging.exists(), "stale staging removed");
        assert!(files_mentioning(root.path(), "stale").is_empty());
        assert!(files_mentioning(root.path(), "old").is_empty());
        assert_eq!(std::fs::read(pki.join("ca.key")).unwrap(), b"new KEY");
    }

    #[test]
    fn a_symlinked_pki_dir_is_refused() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("real")).unwrap();
        std::os::unix::fs::symlink("real", root.path().join("pki")).unwrap();
        let err = write_bundle_files(&root.path().join("pki"), &bundle("new")).unwrap_err();
        let err = crate::error_chain(&err);
        assert!(err.contains("symlink"), "{err}");
        assert!(files_mentioning(root.path(), "new").is_empty());
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
