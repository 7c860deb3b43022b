//! Lazily unmounting pod volumes deepest first.
//!
//! Pod volumes (tmpfs secrets, projected volumes, CSI bind mounts) are mounted below the
//! kubelet directory and can outlive the node stack. Left in place they make removing the
//! directory fail or, worse, delete the data behind a bind mount. The unmount is lazy
//! (`MNT_DETACH`): a volume still held open by a dying process is detached now and
//! released by the kernel when the last user goes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::BoxFuture;
use crate::mountinfo::{self, MountInfoError, Scope};
use crate::runner::{Cmd, Runner};

/// Detaches one mount.
pub trait Mounter: Send + Sync {
    /// Lazily unmounts the topmost mount at `path`. A path that is no longer a mount point
    /// (its parent was detached first, or another process got there) is not an error.
    fn unmount_lazy<'a>(&'a self, path: &'a Path) -> BoxFuture<'a, Result<(), String>>;

    /// Lazily unmounts the mount with id `mount_id` (the mount table's first field) at
    /// `path`. The default is [`Mounter::unmount_lazy`]; [`SyscallMounter`] checks that
    /// `path` still leads, without a symlink, to that very mount before detaching it.
    fn unmount_mount<'a>(
        &'a self,
        path: &'a Path,
        mount_id: u32,
    ) -> BoxFuture<'a, Result<(), String>> {
        let _ = mount_id;
        self.unmount_lazy(path)
    }
}

/// `umount2(path, MNT_DETACH | UMOUNT_NOFOLLOW)`: the real host, without a process per
/// mount.
#[derive(Clone, Copy, Debug, Default)]
pub struct SyscallMounter;

impl Mounter for SyscallMounter {
    fn unmount_lazy<'a>(&'a self, path: &'a Path) -> BoxFuture<'a, Result<(), String>> {
        use nix::errno::Errno;
        use nix::mount::{MntFlags, umount2};
        Box::pin(async move {
            // UMOUNT_NOFOLLOW: a symlink planted in a pod volume must not redirect the
            // unmount to somewhere else on the host.
            match umount2(path, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW) {
                Ok(()) => Ok(()),
                Err(Errno::EINVAL) | Err(Errno::ENOENT) => {
                    tracing::debug!(path = %path.display(), "already unmounted");
                    Ok(())
                }
                Err(errno) => Err(errno.desc().to_string()),
            }
        })
    }

    fn unmount_mount<'a>(
        &'a self,
        path: &'a Path,
        mount_id: u32,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move { unmount_by_identity(path, mount_id) })
    }
}

/// Opens `path` without following any symlink (`RESOLVE_NO_SYMLINKS`: a directory of a
/// pod volume swapped for a symlink cannot redirect it), checks that what is there is the
/// mount `mount_id`, and detaches exactly that mount through the descriptor
/// (`/proc/self/fd/N`). A path that no longer leads to that mount is left alone.
fn unmount_by_identity(path: &Path, mount_id: u32) -> Result<(), String> {
    use nix::mount::{MntFlags, umount2};
    use rustix::fs::{AtFlags, CWD, Mode, OFlags, ResolveFlags, StatxFlags};
    use rustix::io::Errno;
    let fd = match rustix::fs::openat2(
        CWD,
        path,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS,
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => {
            tracing::debug!(path = %path.display(), "already gone");
            return Ok(());
        }
        // Kernels before 5.6: the path-based unmount, final symlink not followed.
        Err(Errno::NOSYS) => {
            return match umount2(path, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW) {
                Ok(()) | Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => Ok(()),
                Err(errno) => Err(errno.desc().to_string()),
            };
        }
        Err(Errno::LOOP) => {
            return Err("the path leads through a symlink now; not unmounted".into());
        }
        Err(e) => return Err(format!("open: {e}")),
    };
    let st = rustix::fs::statx(&fd, c"", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID)
        .map_err(|e| format!("inspect: {e}"))?;
    if st.stx_mask & StatxFlags::MNT_ID.bits() != 0 && st.stx_mnt_id != u64::from(mount_id) {
        // Detached already (with a parent, or by someone else), or something else is
        // there now: either way not the mount the table named.
        tracing::debug!(path = %path.display(), mount_id, found = st.stx_mnt_id, "not that mount any more");
        return Ok(());
    }
    let through = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&fd)
    ));
    match umount2(&through, MntFlags::MNT_DETACH) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EINVAL) => {
            tracing::debug!(path = %path.display(), "already unmounted");
            Ok(())
        }
        Err(errno) => Err(errno.desc().to_string()),
    }
}

/// `umount -l PATH` through a [`Runner`], for hosts where the agent should not make the
/// syscall itself (and for tests that record the commands).
#[derive(Clone, Debug)]
pub struct RunnerMounter<R>(pub R);

impl<R: Runner> Mounter for RunnerMounter<R> {
    fn unmount_lazy<'a>(&'a self, path: &'a Path) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let cmd = Cmd::new(
                "umount",
                ["-l".to_string(), path.to_string_lossy().into_owned()],
            );
            match self.0.run(&cmd).await {
                Ok(_) => Ok(()),
                Err(err) if err.stderr().is_some_and(|e| e.contains("not mounted")) => Ok(()),
                Err(err) => Err(crate::error_chain(&err)),
            }
        })
    }
}

/// Some mounts below a prefix could not be unmounted.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{} mount(s) below {} could not be unmounted; first: {}: {}", failures.len(), prefix.display(), failures[0].0.display(), failures[0].1)]
pub struct PrefixError {
    /// The prefix.
    pub prefix: PathBuf,
    /// Each mount point that stayed, and why.
    pub failures: Vec<(PathBuf, String)>,
}

/// Unmounting below a set of prefixes failed.
#[derive(Debug, thiserror::Error)]
pub enum UnmountError {
    /// The mount table could not be read: no prefix can be trusted.
    #[error(transparent)]
    Table(#[from] MountInfoError),
    /// Mounts below one or more prefixes stayed.
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Prefixes(Vec<PrefixError>),
}

/// Lazily unmounts every mount at or below the prefixes, deepest first. `mount_info` is
/// the mount table file (`None` is `/proc/self/mountinfo`).
pub async fn unmount_below(
    mounter: &dyn Mounter,
    mount_info: Option<&Path>,
    prefixes: &[PathBuf],
) -> Result<(), UnmountError> {
    collect(unmount_scope(mounter, mount_info, prefixes, Scope::AtOrBelow).await?)
}

/// [`unmount_below`] for the mounts strictly below the prefixes: a mount at a prefix itself
/// stays. Used before a slot starts, to clear the pod volumes the previous slot left
/// without detaching the kubelet directory's own mount (a shared bind or a dedicated disk)
/// that the next slot's pod mounts propagate through.
pub async fn unmount_strictly_below(
    mounter: &dyn Mounter,
    mount_info: Option<&Path>,
    prefixes: &[PathBuf],
) -> Result<(), UnmountError> {
    collect(unmount_scope(mounter, mount_info, prefixes, Scope::StrictlyBelow).await?)
}

/// [`unmount_below`] in one deepest-first pass over all prefixes, with failures attributed
/// to each prefix a mount that stayed is below. Callers keep the directories that still
/// have mounts and remove the rest. The outer error is an unreadable mount table, after
/// which no prefix can be trusted.
pub async fn unmount_below_by_prefix(
    mounter: &dyn Mounter,
    mount_info: Option<&Path>,
    prefixes: &[PathBuf],
) -> Result<BTreeMap<PathBuf, PrefixError>, MountInfoError> {
    unmount_scope(mounter, mount_info, prefixes, Scope::AtOrBelow).await
}

async fn unmount_scope(
    mounter: &dyn Mounter,
    mount_info: Option<&Path>,
    prefixes: &[PathBuf],
    scope: Scope,
) -> Result<BTreeMap<PathBuf, PrefixError>, MountInfoError> {
    let table = mountinfo::read(mount_info)?;
    let plan = mountinfo::plan(&table, prefixes, scope);
    let mut failed: BTreeMap<PathBuf, PrefixError> = BTreeMap::new();
    for step in plan {
        match mounter
            .unmount_mount(&step.mount_point, step.mount_id)
            .await
        {
            Ok(()) => tracing::info!(mount = %step.mount_point.display(), "unmounted"),
            Err(why) => {
                tracing::warn!(mount = %step.mount_point.display(), error = %why, "cannot unmount");
                // Keep going: the other mounts are independent, and the caller decides
                // per prefix what it can still remove.
                for i in step.prefixes {
                    failed
                        .entry(prefixes[i].clone())
                        .or_insert_with(|| PrefixError {
                            prefix: prefixes[i].clone(),
                            failures: Vec::new(),
                        })
                        .failures
                        .push((step.mount_point.clone(), why.clone()));
                }
            }
        }
    }
    Ok(failed)
}

fn collect(failed: BTreeMap<PathBuf, PrefixError>) -> Result<(), UnmountError> {
    if failed.is_empty() {
        Ok(())
    } else {
        Err(UnmountError::Prefixes(failed.into_values().collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::{CmdOutput, RecordingRunner};

    fn table_file(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    const TABLE: &str = "\
1 0 0:1 / / rw - ext4 /dev/vda rw
2 1 0:2 / /k rw - tmpfs tmpfs rw
3 2 0:3 / /k/pods/a\\040b rw - tmpfs tmpfs rw
4 1 0:4 / /k-x rw - tmpfs tmpfs rw
5 1 0:5 / /c/d rw - tmpfs tmpfs rw
";

    #[tokio::test]
    async fn unmounts_deepest_first_through_the_runner() {
        let f = table_file(TABLE);
        let runner = RecordingRunner::new();
        unmount_below(
            &RunnerMounter(runner.clone()),
            Some(f.path()),
            &[PathBuf::from("/k")],
        )
        .await
        .unwrap();
        assert_eq!(
            runner.commands(),
            ["umount -l '/k/pods/a b'", "umount -l /k"]
        );
    }

    #[tokio::test]
    async fn strictly_below_leaves_the_prefix() {
        let f = table_file(TABLE);
        let runner = RecordingRunner::new();
        unmount_strictly_below(
            &RunnerMounter(runner.clone()),
            Some(f.path()),
            &[PathBuf::from("/k")],
        )
        .await
        .unwrap();
        assert_eq!(runner.commands(), ["umount -l '/k/pods/a b'"]);
    }

    #[tokio::test]
    async fn failures_are_attributed_per_prefix() {
        let f = table_file(TABLE);
        let runner = RecordingRunner::new();
        runner.respond(
            &["umount", "-l", "/k/pods/a b"],
            CmdOutput::failed(32, "umount: target is busy."),
        );
        let failed = unmount_below_by_prefix(
            &RunnerMounter(runner.clone()),
            Some(f.path()),
            &[PathBuf::from("/k"), PathBuf::from("/c")],
        )
        .await
        .unwrap();
        assert_eq!(failed.len(), 1);
        let err = &failed[Path::new("/k")];
        assert_eq!(err.failures.len(), 1);
        assert!(err.to_string().contains("target is busy"), "{err}");
        // The other mounts were still tried.
        assert_eq!(
            runner.commands(),
            ["umount -l '/k/pods/a b'", "umount -l /c/d", "umount -l /k"]
        );
    }

    #[tokio::test]
    async fn not_mounted_is_not_a_failure() {
        let f = table_file(TABLE);
        let runner = RecordingRunner::new();
        runner.respond(
            &["umount"],
            CmdOutput::failed(32, "umount: /k: not mounted."),
        );
        unmount_below(
            &RunnerMounter(runner),
            Some(f.path()),
            &[PathBuf::from("/k")],
        )
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn unreadable_table_is_an_error_for_all() {
        let runner = RecordingRunner::new();
        let err = unmount_below_by_prefix(
            &RunnerMounter(runner.clone()),
            Some(Path::new("/nonexistent/mountinfo")),
            &[PathBuf::from("/k")],
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("/nonexistent/mountinfo"));
        assert!(runner.commands().is_empty());
    }
}
