//! One `node` command at a time: an exclusive `flock` on a lock file below the host root,
//! holding the holder's pid and command so a second command can say who is in the way.

use std::path::{Path, PathBuf};

use common::lockfile::{HolderLock, LockFileError};

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
pub struct NodeLock(HolderLock);

impl NodeLock {
    /// Takes the node lock below `root` for `command` (for example `node upgrade`),
    /// without waiting: when another process holds it, [`LockError::Busy`] names it.
    pub fn acquire(root: &HostRoot, command: &str) -> Result<NodeLock, LockError> {
        let path = root.resolve(NODE_LOCK);
        let dir = path.parent().unwrap_or(Path::new("/"));
        std::fs::create_dir_all(dir).map_err(fs_err("create directory", dir))?;
        let me = format!("pid {}: outpost-agent {command}", std::process::id());
        match HolderLock::try_acquire(&path, &me) {
            Ok(lock) => Ok(NodeLock(lock)),
            Err(LockFileError::Held { path, holder }) => Err(LockError::Busy { path, holder }),
            Err(LockFileError::Fs(e)) => Err(e.into()),
        }
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        self.0.path()
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
