//! Removing a directory tree without ever deleting through a mount.
//!
//! The caller unmounts first and passes a freshly read mount table. Removal then stays on
//! the filesystem the tree starts on: a directory on another device, or one the table
//! lists as a mount point (a bind mount of the same filesystem has the same device), is
//! kept and never descended into. Symlinks are removed, never followed.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::fsutil::{FsError, fs_err};
use crate::mountinfo::MountEntry;

/// What a removal did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RemoveReport {
    /// Entries removed (files, symlinks, directories).
    pub removed: usize,
    /// Mount points (or directories on another filesystem) left in place, with their
    /// contents.
    pub kept: Vec<PathBuf>,
}

/// Removes the contents of `dir`, keeping `dir` itself, except mounts. A missing `dir` is
/// nothing to do.
pub fn remove_contents(dir: &Path, table: &[MountEntry]) -> Result<RemoveReport, FsError> {
    remove(dir, table, true)
}

/// Removes `path` and everything below it, except mounts (and the directories that lead
/// to them). A missing `path` is nothing to do.
pub fn remove_tree(path: &Path, table: &[MountEntry]) -> Result<RemoveReport, FsError> {
    remove(path, table, false)
}

fn remove(path: &Path, table: &[MountEntry], keep_top: bool) -> Result<RemoveReport, FsError> {
    let mut report = RemoveReport::default();
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(report),
        Err(e) => return Err(fs_err("inspect", path)(e)),
    };
    let mounts: HashSet<&Path> = table.iter().map(|m| m.mount_point.as_path()).collect();
    if !meta.is_dir() {
        if !keep_top {
            std::fs::remove_file(path).map_err(fs_err("remove", path))?;
            report.removed += 1;
        }
        return Ok(report);
    }
    if mounts.contains(path) {
        // Still a mount: its contents belong to whatever is mounted there.
        report.kept.push(path.to_path_buf());
        return Ok(report);
    }
    let walker = Walker {
        dev: meta.dev(),
        mounts,
    };
    let emptied = walker.empty_dir(path, &mut report)?;
    if !keep_top && emptied {
        std::fs::remove_dir(path).map_err(fs_err("remove directory", path))?;
        report.removed += 1;
    }
    Ok(report)
}

struct Walker<'t> {
    dev: u64,
    mounts: HashSet<&'t Path>,
}

impl Walker<'_> {
    /// Removes what it can below `dir`; returns whether `dir` is now empty.
    fn empty_dir(&self, dir: &Path, report: &mut RemoveReport) -> Result<bool, FsError> {
        let mut empty = true;
        for entry in std::fs::read_dir(dir).map_err(fs_err("read directory", dir))? {
            let entry = entry.map_err(fs_err("read directory", dir))?;
            let path = entry.path();
            // symlink_metadata: a symlink is an entry to remove, not a way out of the tree.
            let meta = std::fs::symlink_metadata(&path).map_err(fs_err("inspect", &path))?;
            if meta.is_dir() {
                if meta.dev() != self.dev || self.mounts.contains(path.as_path()) {
                    tracing::info!(path = %path.display(), "still a mount: kept");
                    report.kept.push(path);
                    empty = false;
                    continue;
                }
                if self.empty_dir(&path, report)? {
                    std::fs::remove_dir(&path).map_err(fs_err("remove directory", &path))?;
                    report.removed += 1;
                } else {
                    empty = false;
                }
            } else {
                std::fs::remove_file(&path).map_err(fs_err("remove", &path))?;
                report.removed += 1;
            }
        }
        Ok(empty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_contents_keeps_dir_and_table_mounts() {
        let root = tempfile::tempdir().unwrap();
        let k = root.path().join("kubelet");
        std::fs::create_dir_all(k.join("pods/a/volumes/v")).unwrap();
        std::fs::create_dir_all(k.join("pods/b")).unwrap();
        std::fs::write(k.join("pods/a/volumes/v/data"), b"keep").unwrap();
        std::fs::write(k.join("pods/b/f"), b"x").unwrap();
        let outside = root.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("precious"), b"p").unwrap();
        std::os::unix::fs::symlink(&outside, k.join("pods/b/link")).unwrap();
        // The table says pods/a/volumes/v is (still) a mount.
        let table = vec![MountEntry {
            id: 1,
            parent: 0,
            dev: "0:1".into(),
            root: "/".into(),
            mount_point: k.join("pods/a/volumes/v"),
            fs_type: "tmpfs".into(),
            source: "tmpfs".into(),
        }];
        let report = remove_contents(&k, &table).unwrap();
        assert_eq!(report.kept, [k.join("pods/a/volumes/v")]);
        assert!(k.join("pods/a/volumes/v/data").exists());
        assert!(!k.join("pods/b").exists());
        assert!(k.is_dir());
        assert!(outside.join("precious").exists(), "followed a symlink");
    }

    #[test]
    fn missing_is_nothing_to_do() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(
            remove_tree(&root.path().join("nope"), &[]).unwrap(),
            RemoveReport::default()
        );
        remove_tree(root.path(), &[]).unwrap();
        assert!(!root.path().exists());
    }
}
