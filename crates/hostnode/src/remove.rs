//! Removing a directory tree without ever deleting through a mount or a symlink.
//!
//! The walk goes by file descriptor: the top directory is opened once, and every entry
//! below is inspected (`statx`), opened (`openat2` with `RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_XDEV | RESOLVE_BENEATH`) or unlinked (`unlinkat`) relative to the descriptor
//! of the directory that holds it. No path is ever resolved again from the root, so a
//! directory swapped for a symlink while the walk runs (a container still running in its
//! `emptyDir` can `renameat2(RENAME_EXCHANGE)` one) cannot send a delete anywhere else:
//! the swapped-in symlink is an entry to unlink, and the directory already opened is
//! emptied wherever it now is, which is still inside the tree.
//!
//! Mount points are recognised by mount identity: an entry whose mount id (`statx`
//! `STATX_MNT_ID`) or device differs from the top directory's, one the kernel flags as a
//! mount root, one `openat2` refuses to cross into (`EXDEV`), and one the given mount
//! table lists, is kept with its contents and never descended into. A mount that appears
//! after the table was read is caught all the same. An entry that vanishes while the walk
//! runs counts as removed.

use std::collections::HashSet;
use std::ffi::{CString, OsStr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{
    AtFlags, FileType, Mode, OFlags, ResolveFlags, Statx, StatxAttributes, StatxFlags,
};
use rustix::io::Errno;

use crate::fsutil::FsError;
use crate::mountinfo::MountEntry;

/// How many times one entry is looked at again when it changes type between the look
/// and the act (a file becomes a directory, a directory a symlink) before giving up.
const ATTEMPTS: usize = 64;

/// A removal failed.
#[derive(Debug, thiserror::Error)]
pub enum RemoveError {
    /// A file operation failed.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// The directory to clear is a symlink. It is never followed: the contents of
    /// whatever it points at are not this tree's.
    #[error(
        "{} is a symlink (to {}); refusing to remove through it: point the configuration at the real directory, or replace the link with a directory",
        path.display(), target.display()
    )]
    Symlink {
        /// The symlink.
        path: PathBuf,
        /// Where it points.
        target: PathBuf,
    },
    /// The path to clear exists but is not a directory.
    #[error("{} is not a directory; refusing to clear it", path.display())]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// An entry kept changing type while it was being removed.
    #[error("{} kept changing while it was being removed (is something still writing there?); stop it and run again", path.display())]
    Unstable {
        /// The entry.
        path: PathBuf,
    },
}

/// What a removal did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RemoveReport {
    /// Entries removed (files, symlinks, directories), counting those that vanished
    /// while the walk ran.
    pub removed: usize,
    /// Mount points (or directories on another filesystem) left in place, with their
    /// contents.
    pub kept: Vec<PathBuf>,
}

/// Removes the contents of `dir`, keeping `dir` itself, except mounts. `dir` may itself
/// be a mount point (a dedicated disk): its contents are removed, mounts below it are
/// kept. A missing `dir` is nothing to do; a `dir` that is a symlink is refused
/// ([`RemoveError::Symlink`]).
pub fn remove_contents(dir: &Path, table: &[MountEntry]) -> Result<RemoveReport, RemoveError> {
    let mut report = RemoveReport::default();
    let top = match rustix::fs::open(dir, dir_flags(), Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(report),
        Err(Errno::LOOP) => return Err(symlink_error(dir)),
        Err(Errno::NOTDIR) => return Err(not_a_directory(dir)),
        Err(e) => return Err(fs("open directory", dir, e).into()),
    };
    let st = statx_fd(&top).map_err(|e| fs("inspect", dir, e))?;
    let walker = Walker::new(&st, table);
    walker.empty_dir(&top, dir, &mut report)?;
    Ok(report)
}

/// Removes `path` and everything below it, except mounts (and the directories that lead
/// to them). A missing `path` is nothing to do; a symlink or file at `path` is unlinked;
/// a `path` that is itself a mount point is kept with its contents.
pub fn remove_tree(path: &Path, table: &[MountEntry]) -> Result<RemoveReport, RemoveError> {
    let mut report = RemoveReport::default();
    let (parent, name) = match (path.parent(), path.file_name()) {
        (Some(p), Some(n)) => (
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            },
            n,
        ),
        _ => return Err(not_a_directory(path)),
    };
    // The parent is the host's own location (`/var/lib`): a symlink on the way to it is
    // the host's layout and followed; `path` itself never is.
    let parent_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let parent_fd = match rustix::fs::open(parent, parent_flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(report),
        Err(e) => return Err(fs("open directory", parent, e).into()),
    };
    let parent_st = statx_fd(&parent_fd).map_err(|e| fs("inspect", parent, e))?;
    // Judged against the parent's mount: `path` on another one is a mount point and kept;
    // otherwise everything below it is on that same mount.
    let walker = Walker::new(&parent_st, table);
    let cname = CString::new(name.as_bytes()).map_err(|_| not_a_directory(path))?;
    match statx_at(&parent_fd, &cname) {
        Err(Errno::NOENT) => return Ok(report),
        Err(e) => return Err(fs("inspect", path, e).into()),
        Ok(_) => {}
    }
    walker.remove_at(&parent_fd, &cname, path, &mut report)?;
    Ok(report)
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

fn fs(op: &'static str, path: &Path, errno: Errno) -> FsError {
    FsError {
        op,
        path: path.to_path_buf(),
        source: std::io::Error::from(errno),
    }
}

fn symlink_error(path: &Path) -> RemoveError {
    RemoveError::Symlink {
        path: path.to_path_buf(),
        target: std::fs::read_link(path).unwrap_or_else(|_| PathBuf::from("?")),
    }
}

fn not_a_directory(path: &Path) -> RemoveError {
    RemoveError::NotADirectory {
        path: path.to_path_buf(),
    }
}

fn statx_fd(fd: &OwnedFd) -> rustix::io::Result<Statx> {
    rustix::fs::statx(
        fd,
        c"",
        AtFlags::EMPTY_PATH,
        StatxFlags::TYPE | StatxFlags::MNT_ID,
    )
}

fn statx_at(dir: &OwnedFd, name: &CString) -> rustix::io::Result<Statx> {
    rustix::fs::statx(
        dir,
        name.as_c_str(),
        AtFlags::SYMLINK_NOFOLLOW | AtFlags::NO_AUTOMOUNT,
        StatxFlags::TYPE | StatxFlags::MNT_ID,
    )
}

/// The identity of the filesystem mount the walk stays on.
struct Walker<'t> {
    dev: (u32, u32),
    mnt_id: Option<u64>,
    mounts: HashSet<&'t Path>,
}

enum Outcome {
    Removed,
    Kept,
}

impl<'t> Walker<'t> {
    fn new(top: &Statx, table: &'t [MountEntry]) -> Self {
        Self {
            dev: (top.stx_dev_major, top.stx_dev_minor),
            mnt_id: (top.stx_mask & StatxFlags::MNT_ID.bits() != 0).then_some(top.stx_mnt_id),
            mounts: table.iter().map(|m| m.mount_point.as_path()).collect(),
        }
    }

    /// Whether `st` (of an entry at `path`) is on another mount than the walk's.
    fn is_mount(&self, st: &Statx, path: &Path) -> bool {
        let mount_root = st.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT)
            && st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT);
        let other_mount = self
            .mnt_id
            .is_some_and(|id| st.stx_mask & StatxFlags::MNT_ID.bits() != 0 && st.stx_mnt_id != id);
        mount_root
            || other_mount
            || (st.stx_dev_major, st.stx_dev_minor) != self.dev
            || self.mounts.contains(path)
    }

    /// Removes what it can below the open directory `dir` (at `path`, for reports);
    /// returns whether it is now empty.
    fn empty_dir(
        &self,
        dir: &OwnedFd,
        path: &Path,
        report: &mut RemoveReport,
    ) -> Result<bool, RemoveError> {
        let mut names = Vec::new();
        let entries = rustix::fs::Dir::read_from(dir).map_err(|e| fs("read directory", path, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| fs("read directory", path, e))?;
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            names.push(name.to_owned());
        }
        let mut empty = true;
        for name in names {
            let child = path.join(OsStr::from_bytes(name.as_bytes()));
            if let Outcome::Kept = self.remove_at(dir, &name, &child, report)? {
                empty = false;
            }
        }
        Ok(empty)
    }

    /// Removes the entry `name` of the open directory `dir`, and everything below it
    /// that is on the walk's mount.
    fn remove_at(
        &self,
        dir: &OwnedFd,
        name: &CString,
        path: &Path,
        report: &mut RemoveReport,
    ) -> Result<Outcome, RemoveError> {
        for _ in 0..ATTEMPTS {
            let st = match statx_at(dir, name) {
                Ok(st) => st,
                Err(Errno::NOENT) => return Ok(vanished(report)),
                Err(e) => return Err(fs("inspect", path, e).into()),
            };
            if FileType::from_raw_mode(u32::from(st.stx_mode)) != FileType::Directory {
                // A file, a symlink (removed, never followed), a socket...
                match rustix::fs::unlinkat(dir, name.as_c_str(), AtFlags::empty()) {
                    Ok(()) => {
                        report.removed += 1;
                        return Ok(Outcome::Removed);
                    }
                    Err(Errno::NOENT) => return Ok(vanished(report)),
                    // It became a directory since the look: look again.
                    Err(Errno::ISDIR) => continue,
                    // Some filesystems say EPERM for unlinking a directory; anything else
                    // with EPERM (an immutable file) is a real failure.
                    Err(Errno::PERM)
                        if statx_at(dir, name).is_ok_and(|st| {
                            FileType::from_raw_mode(u32::from(st.stx_mode)) == FileType::Directory
                        }) =>
                    {
                        continue;
                    }
                    Err(e) => return Err(fs("remove", path, e).into()),
                }
            }
            if self.is_mount(&st, path) {
                tracing::info!(path = %path.display(), "still a mount: kept");
                report.kept.push(path.to_path_buf());
                return Ok(Outcome::Kept);
            }
            let sub = match open_beneath(dir, name) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => return Ok(vanished(report)),
                // Swapped for a symlink or a file since the look: look again.
                Err(Errno::LOOP) | Err(Errno::NOTDIR) => continue,
                // A mount appeared on it since the look.
                Err(Errno::XDEV) => {
                    tracing::info!(path = %path.display(), "became a mount: kept");
                    report.kept.push(path.to_path_buf());
                    return Ok(Outcome::Kept);
                }
                Err(e) => return Err(fs("open directory", path, e).into()),
            };
            let opened = statx_fd(&sub).map_err(|e| fs("inspect", path, e))?;
            if self.is_mount(&opened, path) {
                tracing::info!(path = %path.display(), "still a mount: kept");
                report.kept.push(path.to_path_buf());
                return Ok(Outcome::Kept);
            }
            // Past the checks above, `sub` is on the walk's own mount.
            if !self.empty_dir(&sub, path, report)? {
                return Ok(Outcome::Kept);
            }
            match rustix::fs::unlinkat(dir, name.as_c_str(), AtFlags::REMOVEDIR) {
                Ok(()) => {
                    report.removed += 1;
                    return Ok(Outcome::Removed);
                }
                Err(Errno::NOENT) => return Ok(vanished(report)),
                // Swapped for something else, or written to again since it was emptied:
                // look again.
                Err(Errno::NOTDIR) | Err(Errno::NOTEMPTY) | Err(Errno::EXIST) => continue,
                Err(Errno::BUSY) => {
                    tracing::info!(path = %path.display(), "became a mount: kept");
                    report.kept.push(path.to_path_buf());
                    return Ok(Outcome::Kept);
                }
                Err(e) => return Err(fs("remove directory", path, e).into()),
            }
        }
        Err(RemoveError::Unstable {
            path: path.to_path_buf(),
        })
    }
}

fn vanished(report: &mut RemoveReport) -> Outcome {
    // Whoever removed it did the job.
    report.removed += 1;
    Outcome::Removed
}

/// Opens the directory `name` of `dir` without following a symlink and without crossing
/// into another mount. Kernels without `openat2` (before 5.6) get `openat` with
/// `O_NOFOLLOW`; the caller checks the opened directory's mount identity either way.
fn open_beneath(dir: &OwnedFd, name: &CString) -> rustix::io::Result<OwnedFd> {
    match rustix::fs::openat2(
        dir.as_fd(),
        name.as_c_str(),
        dir_flags(),
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_XDEV | ResolveFlags::BENEATH,
    ) {
        Err(Errno::NOSYS) => rustix::fs::openat(dir, name.as_c_str(), dir_flags(), Mode::empty()),
        other => other,
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
