//! The saved copy of the shared configuration, taken before an upgrade rewrites it so a
//! rollback can put it back.
//!
//! On disk a snapshot is a directory:
//!
//! ```text
//! <dir>/files/000000 ...   copies of the files, one per entry that existed
//! <dir>/manifest.json      what to restore where, written LAST
//! ```
//!
//! The manifest names each host path with its state when the snapshot was taken: a
//! regular file (blob name, SHA-256 of its bytes, mode, owner) or absent (the upgrade may
//! create it; a rollback removes it). It is written atomically after every blob is synced,
//! so a directory without a manifest is an interrupted snapshot, never mistaken for a
//! complete one. Restoring replaces each file atomically and skips files that already
//! match, so a restore cut short (a crash, a full disk) is finished by running it again:
//! [`restore_snapshot`] does that for a snapshot an earlier process left.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::HostRoot;
use crate::fsutil::{self, FsError, fs_err};
use crate::runner::{Cmd, HostRunner, RunError, Runner};

const MANIFEST: &str = "manifest.json";
const FILES: &str = "files";
const FORMAT_VERSION: u32 = 1;

/// A snapshot could not be taken, read or restored.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// A file operation failed.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// A complete snapshot is already in the directory: an earlier upgrade neither
    /// finished nor rolled back. Taking a new one would lose the only copy of the
    /// configuration from before it.
    #[error(
        "a snapshot from an earlier upgrade is still in {}: restore it (outpost-agent node upgrade does so first) or remove the directory if its configuration is not wanted",
        dir.display()
    )]
    Exists {
        /// The snapshot directory.
        dir: PathBuf,
    },
    /// A path to save is neither a regular file nor absent.
    #[error("cannot snapshot {}: it is a {kind}, only regular files are saved", path.display())]
    Unsupported {
        /// The host path.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// The manifest cannot be understood.
    #[error("snapshot manifest {}: {reason}", path.display())]
    BadManifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A saved copy does not match the checksum recorded when it was taken.
    #[error("saved copy {} of {} is corrupt (checksum mismatch); it was not restored", blob.display(), path.display())]
    Corrupt {
        /// The blob.
        blob: PathBuf,
        /// The host path it belongs to.
        path: PathBuf,
    },
    /// `systemctl daemon-reload` after restoring unit files failed.
    #[error("files restored, but systemd did not reload them")]
    Reload(#[source] RunError),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Manifest {
    version: u32,
    entries: Vec<Entry>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state", deny_unknown_fields)]
enum Entry {
    /// A regular file.
    File {
        /// Host path, absolute, without the host-root prefix.
        path: String,
        blob: String,
        sha256: String,
        mode: u32,
        uid: u32,
        gid: u32,
    },
    /// Nothing was there.
    Absent { path: String },
}

/// A saved copy of some host files. See the module docs for the format.
pub struct Snapshot {
    dir: PathBuf,
    root: HostRoot,
    manifest: Manifest,
    restored: bool,
    runner: Arc<dyn Runner>,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("dir", &self.dir)
            .field("root", &self.root)
            .field("entries", &self.manifest.entries.len())
            .field("restored", &self.restored)
            .finish()
    }
}

/// Saves the shared configuration files (those of the default units, see
/// [`crate::configure::default_shared_paths`]) below `root` into `dir`.
pub fn take_snapshot(dir: &Path, root: &HostRoot) -> Result<Snapshot, SnapshotError> {
    take_snapshot_of(dir, root, &crate::configure::default_shared_paths())
}

/// Saves the given host paths (absolute, resolved below `root`) into `dir`.
pub fn take_snapshot_of(
    dir: &Path,
    root: &HostRoot,
    paths: &[String],
) -> Result<Snapshot, SnapshotError> {
    let manifest_path = dir.join(MANIFEST);
    if manifest_path.exists() {
        return Err(SnapshotError::Exists {
            dir: dir.to_path_buf(),
        });
    }
    if dir.exists() {
        // No manifest: an interrupted take. The live files were not touched after it
        // (an upgrade writes only once the snapshot is complete), so it is worthless.
        tracing::info!(dir = %dir.display(), "removing an incomplete snapshot");
        std::fs::remove_dir_all(dir).map_err(fs_err("remove incomplete snapshot", dir))?;
    }
    let files = dir.join(FILES);
    std::fs::create_dir_all(&files).map_err(fs_err("create directory", &files))?;
    let mut entries = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for (index, host_path) in paths.iter().enumerate() {
        if !seen.insert(host_path.clone()) {
            continue;
        }
        let live = root.resolve(host_path);
        let meta = match std::fs::symlink_metadata(&live) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                entries.push(Entry::Absent {
                    path: host_path.clone(),
                });
                continue;
            }
            Err(e) => return Err(fs_err("inspect", &live)(e).into()),
        };
        if !meta.is_file() {
            let kind = if meta.is_dir() {
                "directory"
            } else if meta.file_type().is_symlink() {
                "symlink"
            } else {
                "special file"
            };
            return Err(SnapshotError::Unsupported { path: live, kind });
        }
        let bytes = std::fs::read(&live).map_err(fs_err("read", &live))?;
        let blob = format!("{index:06}");
        fsutil::write_atomic(&files.join(&blob), &bytes, 0o600, None)?;
        entries.push(Entry::File {
            path: host_path.clone(),
            blob,
            sha256: hex::encode(Sha256::digest(&bytes)),
            mode: meta.mode() & 0o7777,
            uid: meta.uid(),
            gid: meta.gid(),
        });
    }
    let manifest = Manifest {
        version: FORMAT_VERSION,
        entries,
    };
    let text = serde_json::to_vec_pretty(&manifest).map_err(|e| SnapshotError::BadManifest {
        path: manifest_path.clone(),
        reason: e.to_string(),
    })?;
    // Last: only now is the snapshot complete.
    fsutil::write_atomic(&manifest_path, &text, 0o600, None)?;
    if let Some(parent) = dir.parent() {
        fsutil::sync_dir(parent)?;
    }
    tracing::info!(dir = %dir.display(), files = manifest.entries.len(), "configuration snapshot taken");
    Ok(Snapshot {
        dir: dir.to_path_buf(),
        root: root.clone(),
        manifest,
        restored: false,
        runner: Arc::new(HostRunner::new()),
    })
}

/// Loads the complete snapshot in `dir`; `Ok(None)` when there is none (no directory, or
/// one without a manifest).
pub fn load(dir: &Path, root: &HostRoot) -> Result<Option<Snapshot>, SnapshotError> {
    let manifest_path = dir.join(MANIFEST);
    let text = match std::fs::read(&manifest_path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(fs_err("read", &manifest_path)(e).into()),
    };
    let manifest: Manifest =
        serde_json::from_slice(&text).map_err(|e| SnapshotError::BadManifest {
            path: manifest_path.clone(),
            reason: e.to_string(),
        })?;
    if manifest.version != FORMAT_VERSION {
        return Err(SnapshotError::BadManifest {
            path: manifest_path,
            reason: format!(
                "format version {} (this agent reads {FORMAT_VERSION})",
                manifest.version
            ),
        });
    }
    Ok(Some(Snapshot {
        dir: dir.to_path_buf(),
        root: root.clone(),
        manifest,
        restored: false,
        runner: Arc::new(HostRunner::new()),
    }))
}

/// Whether `dir` holds a complete snapshot (its manifest is there).
pub fn exists(dir: &Path) -> bool {
    dir.join(MANIFEST).is_file()
}

/// Restores a snapshot an earlier process left in `dir` (one a crash interrupted, before
/// or during its restore), then discards it. Returns whether there was one. An incomplete
/// snapshot (no manifest) is removed: the live files were never changed after it.
pub async fn restore_snapshot(dir: &Path, root: &HostRoot) -> Result<bool, SnapshotError> {
    restore_snapshot_with(dir, root, Arc::new(HostRunner::new())).await
}

/// [`restore_snapshot`] with the runner used for `systemctl daemon-reload`.
pub async fn restore_snapshot_with(
    dir: &Path,
    root: &HostRoot,
    runner: Arc<dyn Runner>,
) -> Result<bool, SnapshotError> {
    match load(dir, root)? {
        Some(snapshot) => {
            let mut snapshot = snapshot.with_runner(runner);
            snapshot.restore().await?;
            snapshot.discard();
            Ok(true)
        }
        None => {
            if dir.exists() {
                tracing::info!(dir = %dir.display(), "removing an incomplete snapshot");
                std::fs::remove_dir_all(dir).map_err(fs_err("remove incomplete snapshot", dir))?;
            }
            Ok(false)
        }
    }
}

impl Snapshot {
    /// Uses `runner` for `systemctl daemon-reload` after a restore on the real root.
    pub fn with_runner(mut self, runner: Arc<dyn Runner>) -> Self {
        self.runner = runner;
        self
    }

    /// The snapshot directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The host paths saved (present or absent).
    pub fn paths(&self) -> Vec<&str> {
        self.manifest
            .entries
            .iter()
            .map(|e| match e {
                Entry::File { path, .. } | Entry::Absent { path } => path.as_str(),
            })
            .collect()
    }

    /// Puts every saved file back (atomically, with its mode and owner) and removes files
    /// that did not exist when the snapshot was taken. On the real root, systemd then
    /// rereads unit files. A failure keeps the snapshot so the restore can be retried;
    /// files already restored are skipped next time.
    pub async fn restore(&mut self) -> Result<(), SnapshotError> {
        for entry in &self.manifest.entries {
            match entry {
                Entry::File {
                    path,
                    blob,
                    sha256,
                    mode,
                    uid,
                    gid,
                } => {
                    let live = self.root.resolve(path);
                    let blob_path = self.dir.join(FILES).join(blob);
                    let bytes =
                        std::fs::read(&blob_path).map_err(fs_err("read saved copy", &blob_path))?;
                    if hex::encode(Sha256::digest(&bytes)) != *sha256 {
                        return Err(SnapshotError::Corrupt {
                            blob: blob_path,
                            path: live,
                        });
                    }
                    if matches_live(&live, &bytes, *mode, *uid, *gid) {
                        continue;
                    }
                    fsutil::write_atomic(&live, &bytes, *mode, Some((*uid, *gid)))?;
                    tracing::info!(path = %live.display(), "restored");
                }
                Entry::Absent { path } => {
                    let live = self.root.resolve(path);
                    if fsutil::remove_file_synced(&live)? {
                        tracing::info!(path = %live.display(), "removed: absent before the upgrade");
                    }
                }
            }
        }
        if self.root.is_real() {
            let reload = Cmd::new("systemctl", ["daemon-reload"]);
            self.runner
                .run(&reload)
                .await
                .map_err(SnapshotError::Reload)?;
        }
        self.restored = true;
        Ok(())
    }

    /// Whether [`Snapshot::restore`] has succeeded.
    pub fn restored(&self) -> bool {
        self.restored
    }

    /// Removes the saved copy. A failure is logged, not returned: the configuration is
    /// already where it should be, and a leftover is only disk space.
    pub fn discard(self) {
        // The manifest first: whatever else survives a failure below is then an
        // incomplete snapshot, which nothing will restore.
        let manifest = self.dir.join(MANIFEST);
        if let Err(e) = fsutil::remove_file_synced(&manifest) {
            tracing::warn!(error = %e, "cannot discard the configuration snapshot");
            return;
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot remove the configuration snapshot directory");
        }
    }
}

fn matches_live(live: &Path, bytes: &[u8], mode: u32, uid: u32, gid: u32) -> bool {
    let Ok(meta) = std::fs::symlink_metadata(live) else {
        return false;
    };
    meta.is_file()
        && meta.mode() & 0o7777 == mode
        && meta.uid() == uid
        && meta.gid() == gid
        && meta.len() == bytes.len() as u64
        && std::fs::read(live).is_ok_and(|b| b == bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, HostRoot, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path().join("root"));
        let snap = dir.path().join("snap");
        (dir, root, snap)
    }

    #[tokio::test]
    async fn absent_files_are_removed_on_restore() {
        let (_d, root, snap) = setup();
        let mut s = take_snapshot_of(&snap, &root, &["/etc/new.conf".into()]).unwrap();
        fsutil::write_atomic(&root.resolve("/etc/new.conf"), b"x", 0o644, None).unwrap();
        s.restore().await.unwrap();
        assert!(s.restored());
        assert!(!root.resolve("/etc/new.conf").exists());
        s.discard();
        assert!(!snap.exists());
    }

    #[test]
    fn a_complete_snapshot_is_never_overwritten() {
        let (_d, root, snap) = setup();
        take_snapshot_of(&snap, &root, &["/etc/a".into()]).unwrap();
        let err = take_snapshot_of(&snap, &root, &["/etc/a".into()]).unwrap_err();
        assert!(matches!(err, SnapshotError::Exists { .. }), "{err}");
    }

    #[tokio::test]
    async fn an_incomplete_snapshot_is_not_restored() {
        let (_d, root, snap) = setup();
        std::fs::create_dir_all(snap.join(FILES)).unwrap();
        std::fs::write(snap.join(FILES).join("000000"), b"half").unwrap();
        assert!(load(&snap, &root).unwrap().is_none());
        assert!(!restore_snapshot(&snap, &root).await.unwrap());
        assert!(!snap.exists());
    }

    #[tokio::test]
    async fn a_corrupt_copy_is_refused_and_kept() {
        let (_d, root, snap) = setup();
        fsutil::write_atomic(&root.resolve("/etc/a"), b"good", 0o640, None).unwrap();
        let mut s = take_snapshot_of(&snap, &root, &["/etc/a".into()]).unwrap();
        std::fs::write(snap.join(FILES).join("000000"), b"evil").unwrap();
        std::fs::write(root.resolve("/etc/a"), b"new").unwrap();
        let err = s.restore().await.unwrap_err();
        assert!(matches!(err, SnapshotError::Corrupt { .. }), "{err}");
        assert!(!s.restored());
        assert_eq!(std::fs::read(root.resolve("/etc/a")).unwrap(), b"new");
        assert!(snap.join(MANIFEST).exists());
    }

    #[test]
    fn directories_are_refused() {
        let (_d, root, snap) = setup();
        std::fs::create_dir_all(root.resolve("/etc/a")).unwrap();
        let err = take_snapshot_of(&snap, &root, &["/etc/a".into()]).unwrap_err();
        assert!(err.to_string().contains("directory"), "{err}");
    }
}
