//! A lock file that says who holds it: an exclusive, non-blocking `flock` on a named file
//! whose content is the holder's own description, so the one refused can name who is in
//! the way.
//!
//! The lock is the `flock`, not the file: a holder that dies (even by SIGKILL) releases it
//! with its last descriptor, so a stale file never blocks anything. `flock` locks belong
//! to the open file description, so two acquisitions in one process conflict exactly as
//! two processes do. The file is opened `O_NOFOLLOW`: a link planted at the name is
//! refused, never followed, so nothing else is locked or overwritten with the holder.

use std::fs::File;
use std::io::{Read as _, Seek as _, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, OFlags};
use rustix::io::Errno;

use crate::fsutil::{FsError, fs_err};

/// The most of a holder's text a refusal quotes.
const HOLDER_MAX_CHARS: usize = 300;

/// What a refusal says of a holder that has locked the file but not written itself yet.
pub const UNNAMED_HOLDER: &str = "a process that has not written its name yet";

/// The lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockFileError {
    /// Someone holds it.
    #[error("{} is held by {holder}", path.display())]
    Held {
        /// The lock file.
        path: PathBuf,
        /// The holder, as it wrote itself down (at most 300 characters), or
        /// [`UNNAMED_HOLDER`].
        holder: String,
    },
    /// The lock file could not be opened, locked or written.
    #[error(transparent)]
    Fs(#[from] FsError),
}

/// A held lock file; the lock goes with the descriptor, when this is dropped or the
/// process dies. The file stays (its content is only read when someone is refused).
#[derive(Debug)]
pub struct HolderLock {
    file: File,
    path: PathBuf,
}

impl HolderLock {
    /// Opens `path` (created 0600 when missing; its directory must exist), takes the lock
    /// without waiting, and writes `holder` as the file's whole content. When another
    /// holds it: [`LockFileError::Held`] quoting what that holder wrote.
    pub fn try_acquire(path: &Path, holder: &str) -> Result<HolderLock, LockFileError> {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            // Never lock, or write the holder into, whatever a link at the name points to.
            .custom_flags((OFlags::NOFOLLOW | OFlags::CLOEXEC).bits() as i32)
            .open(path)
            .map_err(fs_err("open the lock file", path))?;
        match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let text = text.trim();
                return Err(LockFileError::Held {
                    path: path.to_path_buf(),
                    holder: if text.is_empty() {
                        UNNAMED_HOLDER.to_string()
                    } else {
                        text.chars().take(HOLDER_MAX_CHARS).collect()
                    },
                });
            }
            Err(e) => return Err(fs_err("lock", path)(std::io::Error::from(e)).into()),
        }
        let mut held = HolderLock {
            file,
            path: path.to_path_buf(),
        };
        held.write_holder(holder)?;
        Ok(held)
    }

    /// Replaces the holder's description, keeping the lock (a command handing its lock to
    /// the one it starts).
    pub fn write_holder(&mut self, holder: &str) -> Result<(), FsError> {
        let file = &mut self.file;
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(holder.as_bytes()))
            .and_then(|()| file.sync_data())
            .map_err(fs_err("write the holder into", &self.path))
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_acquisition_is_refused_quoting_the_holder_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        let first = HolderLock::try_acquire(&path, "first (pid 1)").unwrap();
        match HolderLock::try_acquire(&path, "second").unwrap_err() {
            LockFileError::Held { path: p, holder } => {
                assert_eq!(p, path);
                assert_eq!(holder, "first (pid 1)");
            }
            other => panic!("{other:?}"),
        }
        drop(first);
        let second = HolderLock::try_acquire(&path, "second").unwrap();
        assert_eq!(std::fs::read_to_string(second.path()).unwrap(), "second");
    }

    #[test]
    fn a_new_holder_replaces_the_whole_text_and_keeps_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        let mut lock = HolderLock::try_acquire(&path, "a long first holder text").unwrap();
        lock.write_holder("short").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "short");
        assert!(matches!(
            HolderLock::try_acquire(&path, "other"),
            Err(LockFileError::Held { holder, .. }) if holder == "short"
        ));
    }

    #[test]
    fn a_holder_without_a_name_and_a_long_name_are_quoted_sensibly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        let mut lock = HolderLock::try_acquire(&path, "").unwrap();
        assert!(matches!(
            HolderLock::try_acquire(&path, "other"),
            Err(LockFileError::Held { holder, .. }) if holder == UNNAMED_HOLDER
        ));
        lock.write_holder(&"h".repeat(1000)).unwrap();
        assert!(matches!(
            HolderLock::try_acquire(&path, "other"),
            Err(LockFileError::Held { holder, .. }) if holder.len() == HOLDER_MAX_CHARS
        ));
    }

    #[test]
    fn a_link_planted_at_the_name_is_refused_and_its_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("victim");
        std::fs::write(&target, b"keep me").unwrap();
        let path = dir.path().join("x.lock");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        match HolderLock::try_acquire(&path, "me").unwrap_err() {
            LockFileError::Fs(e) => assert_eq!(e.op, "open the lock file"),
            other => panic!("{other:?}"),
        }
        assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
    }
}
