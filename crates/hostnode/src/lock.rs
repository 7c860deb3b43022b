//! One `node` command at a time: an exclusive `flock` on a lock file below the host root,
//! holding the holder's pid and command so a second command can say who is in the way.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rustix::fs::FlockOperation;
use rustix::io::Errno;

use crate::HostRoot;
use crate::fsutil::{FsError, fs_err};

/// The lock file (below the host root). `/run` is cleared at boot, and the lock is the
/// `flock`, not the file's existence: a crashed holder's lock is released by the kernel.
pub const NODE_LOCK: &str = "/run/outpost-agent/node.lock";

/// The lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another command holds it.
    #[error(
        "another node command is running ({holder}; lock {}): wait for it to finish, then run this one again",
        path.display()
    )]
    Busy {
        /// The lock file.
        path: PathBuf,
        /// Who holds it, as it wrote itself down.
        holder: String,
    },
    /// The lock file could not be opened or locked.
    #[error(transparent)]
    Fs(#[from] FsError),
}

/// The held lock; released when dropped (or when the process dies).
#[derive(Debug)]
pub struct NodeLock {
    _file: File,
    path: PathBuf,
}

impl NodeLock {
    /// Takes the node lock below `root` for `command` (for example `node upgrade`),
    /// without waiting: when another process holds it, [`LockError::Busy`] names it.
    pub fn acquire(root: &HostRoot, command: &str) -> Result<NodeLock, LockError> {
        let path = root.resolve(NODE_LOCK);
        let dir = path.parent().unwrap_or(Path::new("/"));
        std::fs::create_dir_all(dir).map_err(fs_err("create directory", dir))?;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            // Never lock (or write the holder into) something planted at the name.
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(&path)
            .map_err(fs_err("open lock file", &path))?;
        match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(LockError::Busy {
                    holder: if holder.is_empty() {
                        "a holder that has not written its name yet".into()
                    } else {
                        holder.chars().take(200).collect()
                    },
                    path,
                });
            }
            Err(e) => {
                return Err(fs_err("lock", &path)(std::io::Error::from(e)).into());
            }
        }
        let me = format!("pid {}: outpost-agent {command}", std::process::id());
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(me.as_bytes()))
            .map_err(fs_err("write lock holder", &path))?;
        Ok(NodeLock { _file: file, path })
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
    fn a_second_holder_is_refused_naming_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        let first = NodeLock::acquire(&root, "node upgrade").unwrap();
        // flock locks belong to the open file description: a second open in this
        // process conflicts just as another process would.
        let err = NodeLock::acquire(&root, "node reset").unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(&format!(
                "pid {}: outpost-agent node upgrade",
                std::process::id()
            )),
            "{msg}"
        );
        drop(first);
        let again = NodeLock::acquire(&root, "node reset").unwrap();
        assert!(again.path().ends_with("run/outpost-agent/node.lock"));
    }
}
