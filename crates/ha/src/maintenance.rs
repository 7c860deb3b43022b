//! One maintenance operation per node at a time, and nothing touching etcd's data while the
//! node runs it.
//!
//! Two locks, both an exclusive non-blocking `flock` on a file in the node's data directory
//! (the state dir), opened with `O_NOFOLLOW` so a link planted at the name is refused
//! rather than followed, and holding the holder's own description (command, pid, start
//! time) so the one refused can say who is in the way:
//!
//! | lock | file | held by |
//! |---|---|---|
//! | [`NodeLock`] (maintenance) | `<state-dir>/maintenance.lock` | every command that stops or rewrites the local control plane: `snapshot restore`, `rejoin`, `certs rekey`, `repoint`, and `up`/`join` while they prepare the node (PKI, kubeconfigs, node state) |
//! | [`EtcdDataLock`] | `<state-dir>/etcd.lock` | whoever runs or rewrites the local etcd member: `up`/`join` for as long as they supervise it, `snapshot restore` and `rejoin` for their whole run |
//!
//! A maintenance command takes the maintenance lock first, then the data lock. Both are
//! [`common::lockfile::HolderLock`]s: the lock is the `flock`, not the file, so a holder
//! that dies (even by SIGKILL) releases it, and two acquisitions in one process conflict
//! exactly as two processes do.

use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use common::fsutil::FsError;
use common::lockfile::{HolderLock, LockFileError};

/// The maintenance lock's file name in the state dir.
pub const MAINTENANCE_LOCK_FILE: &str = "maintenance.lock";
/// The etcd data lock's file name in the state dir.
pub const ETCD_DATA_LOCK_FILE: &str = "etcd.lock";

/// Which of the two locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    /// The node maintenance lock.
    Maintenance,
    /// The etcd data lock.
    EtcdData,
}

impl std::fmt::Display for LockKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LockKind::Maintenance => "the node maintenance lock",
            LockKind::EtcdData => "the etcd data lock",
        })
    }
}

/// A lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum MaintenanceError {
    /// Another command holds it.
    #[error(
        "{kind} ({}) is held by {holder}; nothing was changed. Wait for it to finish (or stop \
         it), then run this command again",
        lock.display()
    )]
    Held {
        /// Which lock.
        kind: LockKind,
        /// The lock file.
        lock: PathBuf,
        /// Who holds it, as the holder wrote itself down.
        holder: String,
    },
    /// The lock file could not be created, opened, locked or written.
    #[error("cannot {op} {}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl MaintenanceError {
    /// The holder named by a [`MaintenanceError::Held`].
    pub fn holder(&self) -> Option<&str> {
        match self {
            MaintenanceError::Held { holder, .. } => Some(holder),
            MaintenanceError::Io { .. } => None,
        }
    }
}

impl From<FsError> for MaintenanceError {
    fn from(e: FsError) -> MaintenanceError {
        MaintenanceError::Io {
            op: e.op,
            path: e.path,
            source: e.source,
        }
    }
}

/// The text a holder writes into its lock file (pure).
pub fn holder_text(command: &str, pid: u32, started: SystemTime) -> String {
    format!(
        "`stratum-server {command}` (pid {pid}, started {})",
        humantime::format_rfc3339_seconds(started)
    )
}

/// This process, as running `command`, in a lock file.
fn me(command: &str) -> String {
    holder_text(command, std::process::id(), SystemTime::now())
}

fn acquire(
    state_dir: &Path,
    file_name: &str,
    kind: LockKind,
    command: &str,
) -> Result<HolderLock, MaintenanceError> {
    if !state_dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(state_dir)
            .map_err(|source| MaintenanceError::Io {
                op: "create the state directory",
                path: state_dir.to_path_buf(),
                source,
            })?;
    }
    match HolderLock::try_acquire(&state_dir.join(file_name), &me(command)) {
        Ok(lock) => Ok(lock),
        Err(LockFileError::Held { path, holder }) => Err(MaintenanceError::Held {
            kind,
            lock: path,
            holder,
        }),
        Err(LockFileError::Fs(e)) => Err(e.into()),
    }
}

/// The node maintenance lock, held until dropped (or the process dies).
#[derive(Debug)]
pub struct NodeLock(HolderLock);

impl NodeLock {
    /// Takes the maintenance lock of the node whose state dir is `state_dir` for `command`
    /// (for example `snapshot restore`), without waiting: when another process, or another
    /// acquisition in this one, holds it, [`MaintenanceError::Held`] names the holder.
    /// Creates `state_dir` (0700) when it does not exist yet.
    pub fn acquire(state_dir: &Path, command: &str) -> Result<NodeLock, MaintenanceError> {
        acquire(
            state_dir,
            MAINTENANCE_LOCK_FILE,
            LockKind::Maintenance,
            command,
        )
        .map(NodeLock)
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

/// The etcd data lock, held until dropped (or the process dies).
#[derive(Debug)]
pub struct EtcdDataLock(HolderLock);

impl EtcdDataLock {
    /// Takes the etcd data lock of the node whose state dir is `state_dir` for `command`,
    /// without waiting; a held lock is [`MaintenanceError::Held`] naming the holder (a
    /// running `stratum-server up` holds it for as long as it supervises etcd).
    pub fn acquire(state_dir: &Path, command: &str) -> Result<EtcdDataLock, MaintenanceError> {
        acquire(state_dir, ETCD_DATA_LOCK_FILE, LockKind::EtcdData, command).map(EtcdDataLock)
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// Names `command` as the holder from now on, keeping the lock: a rejoin hands its
    /// lock to the node it starts, so nothing can take it in between.
    pub fn hand_over(&mut self, command: &str) -> Result<(), MaintenanceError> {
        Ok(self.0.write_holder(&me(command))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_acquisition_is_refused_naming_the_first_until_it_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let first = NodeLock::acquire(&state, "snapshot restore").unwrap();
        let err = NodeLock::acquire(&state, "rejoin").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&format!(
                "`stratum-server snapshot restore` (pid {}",
                std::process::id()
            )),
            "{text}"
        );
        assert!(text.contains("the node maintenance lock"), "{text}");
        assert!(text.contains("nothing was changed"), "{text}");
        // The data lock is another file: held independently.
        let data = EtcdDataLock::acquire(&state, "rejoin").unwrap();
        let err = EtcdDataLock::acquire(&state, "up").unwrap_err();
        assert!(err.to_string().contains("the etcd data lock"), "{err}");
        assert!(err.holder().unwrap().contains("`stratum-server rejoin`"));
        drop(first);
        drop(data);
        let again = NodeLock::acquire(&state, "rejoin").unwrap();
        assert!(again.path().ends_with(MAINTENANCE_LOCK_FILE));
        let on_disk = std::fs::read_to_string(again.path()).unwrap();
        assert!(on_disk.starts_with("`stratum-server rejoin`"), "{on_disk}");
    }

    #[test]
    fn a_handed_over_data_lock_stays_held_and_names_its_new_holder() {
        let dir = tempfile::tempdir().unwrap();
        let mut lock = EtcdDataLock::acquire(dir.path(), "rejoin").unwrap();
        lock.hand_over("up").unwrap();
        let err = EtcdDataLock::acquire(dir.path(), "snapshot restore").unwrap_err();
        let holder = err.holder().unwrap().to_string();
        assert!(holder.starts_with("`stratum-server up` (pid"), "{holder}");
        let on_disk = std::fs::read_to_string(lock.path()).unwrap();
        assert_eq!(
            on_disk, holder,
            "the whole file is the new holder, nothing of the old"
        );
        drop(lock);
        assert!(EtcdDataLock::acquire(dir.path(), "snapshot restore").is_ok());
    }

    #[test]
    fn a_link_planted_at_the_lock_name_is_refused_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("victim");
        std::fs::write(&target, b"keep me").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join(MAINTENANCE_LOCK_FILE)).unwrap();
        let err = NodeLock::acquire(dir.path(), "rejoin").unwrap_err();
        assert!(
            matches!(
                err,
                MaintenanceError::Io {
                    op: "open the lock file",
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
    }

    #[test]
    fn the_holder_names_command_pid_and_start() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_790_000_000);
        assert_eq!(
            holder_text("certs rekey", 42, t),
            "`stratum-server certs rekey` (pid 42, started 2026-09-21T14:13:20Z)"
        );
    }
}
