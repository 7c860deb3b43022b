//! The one atomic file writer.
//!
//! A file is replaced by writing a temporary file beside it under a unique name, syncing
//! it, renaming it over the target and syncing the directory: after a crash the target
//! holds either the old bytes or the new ones, never a torn mix, and a reader never sees a
//! partial file. The directory is opened once and every step is relative to that
//! descriptor; the temporary file is created `O_EXCL | O_NOFOLLOW` with its final mode (a
//! key is never readable by others, not even briefly), so nothing planted at either name,
//! and no directory swapped between the steps, redirects the write.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, Mode, OFlags};

/// A file operation failed.
#[derive(Debug, thiserror::Error)]
#[error("{op} {}", path.display())]
pub struct FsError {
    /// What was being done (`write`, `rename into place`, `sync directory`, ...).
    pub op: &'static str,
    /// The path it was done to.
    pub path: PathBuf,
    /// Why it failed.
    #[source]
    pub source: std::io::Error,
}

/// A `map_err` adapter: `std::fs::read(p).map_err(fs_err("read", p))`.
pub fn fs_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> FsError {
    let path = path.to_path_buf();
    move |source| FsError { op, path, source }
}

fn errno(op: &'static str, path: &Path) -> impl FnOnce(rustix::io::Errno) -> FsError {
    let path = path.to_path_buf();
    move |e| FsError {
        op,
        path,
        source: std::io::Error::from(e),
    }
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A fresh temporary name for replacing `name`: hidden, in the same directory (so the
/// rename is atomic), unique per process and call (so two writers never share one).
fn temp_name(name: &std::ffi::OsStr) -> String {
    format!(
        ".{}.{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Removes what a writer of `name` that died mid-write left behind: temporaries named
/// for a process that no longer exists (and the fixed name older releases used). Best
/// effort: a leftover that cannot be removed is only untidy, never read.
fn remove_stale_temporaries(dir: &Path, dir_fd: &rustix::fd::OwnedFd, name: &std::ffi::OsStr) {
    let name = name.to_string_lossy();
    let prefix = format!(".{name}.");
    let legacy = format!(".{name}.outpost-tmp");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let entry_name = entry.file_name();
        let entry_name = entry_name.to_string_lossy();
        let stale = entry_name == legacy
            || entry_name
                .strip_prefix(&prefix)
                .and_then(|rest| rest.strip_suffix(".tmp"))
                .and_then(|rest| rest.split_once('.'))
                .and_then(|(pid, n)| Some((pid.parse::<u32>().ok()?, n.parse::<u64>().ok()?)))
                .is_some_and(|(pid, _)| {
                    pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists()
                });
        // unlinkat removes the entry itself: a symlink planted there is not followed.
        if stale && entry.file_type().is_ok_and(|t| !t.is_dir()) {
            let _ = rustix::fs::unlinkat(dir_fd, entry_name.as_ref(), AtFlags::empty());
        }
    }
}

/// Replaces `path` with `contents` atomically, with permission bits `mode` and, when
/// given, owner `(uid, gid)`. Missing parent directories are created (mode 0755). On
/// failure the temporary file is removed and the target is untouched.
pub fn write_atomic(
    path: &Path,
    contents: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
) -> Result<(), FsError> {
    write_into_place(path, contents, mode, owner, false).map(|_| ())
}

/// Like [`write_atomic`], but only when `path` does not exist yet: the temporary is
/// renamed into place with `RENAME_NOREPLACE`, so of two writers racing to create the
/// file exactly one wins and the other's bytes never replace it. Returns whether this
/// call created it (`false`: something was there; nothing was changed).
pub fn write_atomic_new(path: &Path, contents: &[u8], mode: u32) -> Result<bool, FsError> {
    write_into_place(path, contents, mode, None, true)
}

fn write_into_place(
    path: &Path,
    contents: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
    no_replace: bool,
) -> Result<bool, FsError> {
    let mut pending = PendingFile::create_owned(path, mode, owner)?;
    pending.write_all(contents)?;
    pending.commit(no_replace)
}

/// A file written under a temporary name beside its target and put in place only by
/// [`PendingFile::commit`], for contents too large to hold in memory (a streamed etcd
/// snapshot). The same guarantees as [`write_atomic`]: the temporary is created
/// `O_EXCL | O_NOFOLLOW` with its final mode, every step is relative to the directory's
/// descriptor, and a reader never sees a partial file. Dropped without a commit (an
/// error, a cancelled task), the temporary is removed and the target is untouched.
pub struct PendingFile {
    dir: PathBuf,
    dir_fd: rustix::fd::OwnedFd,
    name: std::ffi::OsString,
    tmp_name: String,
    path: PathBuf,
    file: File,
}

impl std::fmt::Debug for PendingFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl PendingFile {
    /// Starts a file for `path` with permission bits `mode`. Missing parent directories
    /// are created (mode 0755).
    pub fn create(path: &Path, mode: u32) -> Result<PendingFile, FsError> {
        PendingFile::create_owned(path, mode, None)
    }

    fn create_owned(
        path: &Path,
        mode: u32,
        owner: Option<(u32, u32)>,
    ) -> Result<PendingFile, FsError> {
        let Some(name) = path.file_name() else {
            return Err(FsError {
                op: "write",
                path: path.to_path_buf(),
                source: std::io::Error::other("not a file name"),
            });
        };
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        std::fs::create_dir_all(dir).map_err(fs_err("create directory", dir))?;
        let dir_fd = rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno("open directory", dir))?;
        remove_stale_temporaries(dir, &dir_fd, name);
        let tmp_name = temp_name(name);
        let tmp = dir.join(&tmp_name);
        let fd = rustix::fs::openat(
            &dir_fd,
            tmp_name.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode & 0o777),
        )
        .map_err(errno("create", &tmp))?;
        // From here on, dropping `pending` removes the temporary.
        let pending = PendingFile {
            dir: dir.to_path_buf(),
            dir_fd,
            name: name.to_os_string(),
            tmp_name,
            path: path.to_path_buf(),
            file: File::from(fd),
        };
        let file = &pending.file;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(file, Some(uid), Some(gid)).map_err(fs_err("chown", &tmp))?;
        }
        // Exactly `mode`: the umask may have narrowed it, and a chown clears set-id bits.
        file.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(fs_err("chmod", &tmp))?;
        Ok(pending)
    }

    fn tmp_path(&self) -> PathBuf {
        self.dir.join(&self.tmp_name)
    }

    /// Appends `bytes`.
    pub fn write_all(&mut self, bytes: &[u8]) -> Result<(), FsError> {
        let tmp = self.tmp_path();
        self.file.write_all(bytes).map_err(fs_err("write", &tmp))
    }

    /// Syncs the file and renames it into place, then syncs the directory. With
    /// `no_replace`, an existing target is left alone and `Ok(false)` returned (the
    /// temporary is removed).
    pub fn commit(mut self, no_replace: bool) -> Result<bool, FsError> {
        let tmp = self.tmp_path();
        self.file.sync_all().map_err(fs_err("sync", &tmp))?;
        let flags = if no_replace {
            rustix::fs::RenameFlags::NOREPLACE
        } else {
            rustix::fs::RenameFlags::empty()
        };
        match rustix::fs::renameat_with(
            &self.dir_fd,
            self.tmp_name.as_str(),
            &self.dir_fd,
            self.name.as_os_str(),
            flags,
        ) {
            Ok(()) => {}
            // Drop removes the temporary.
            Err(rustix::io::Errno::EXIST) if no_replace => return Ok(false),
            Err(e) => return Err(errno("rename into place", &self.path)(e)),
        }
        // In place: nothing left for Drop to remove.
        self.tmp_name.clear();
        rustix::fs::fsync(&self.dir_fd).map_err(errno("sync directory", &self.dir))?;
        Ok(true)
    }
}

impl Drop for PendingFile {
    fn drop(&mut self) {
        if !self.tmp_name.is_empty() {
            let _ = rustix::fs::unlinkat(&self.dir_fd, self.tmp_name.as_str(), AtFlags::empty());
        }
    }
}

/// Removes `path` if it exists (not a directory) and syncs its directory. Returns whether
/// there was something to remove.
pub fn remove_file_synced(path: &Path) -> Result<bool, FsError> {
    match std::fs::remove_file(path) {
        Ok(()) => {
            sync_dir(path.parent().unwrap_or(Path::new("/")))?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(fs_err("remove", path)(e)),
    }
}

/// fsyncs a directory so that renames and unlinks in it survive a crash.
pub fn sync_dir(dir: &Path) -> Result<(), FsError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(fs_err("sync directory", dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn leftovers(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect()
    }

    #[test]
    fn a_pending_file_streams_and_appears_only_when_committed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snap.db");
        let mut p = PendingFile::create(&path, 0o600).unwrap();
        for chunk in [&b"one "[..], b"two ", b"three"] {
            p.write_all(chunk).unwrap();
        }
        assert!(!path.exists(), "nothing at the target before the commit");
        assert_eq!(leftovers(dir.path()).len(), 1);
        assert!(p.commit(true).unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), b"one two three");
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o7777, 0o600);
        assert!(leftovers(dir.path()).is_empty());

        // Not replacing: the existing file stays, the temporary goes.
        let mut p = PendingFile::create(&path, 0o600).unwrap();
        p.write_all(b"other").unwrap();
        assert!(!p.commit(true).unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), b"one two three");
        assert!(leftovers(dir.path()).is_empty());

        // Dropped without a commit (an error, a cancelled task): nothing is left.
        let other = dir.path().join("other.db");
        let mut p = PendingFile::create(&other, 0o600).unwrap();
        p.write_all(b"half").unwrap();
        drop(p);
        assert!(!other.exists());
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn writes_with_the_mode_and_replaces_by_rename() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/config.yaml");
        write_atomic(&path, b"one", 0o640, None).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o7777, 0o640);
        let before = std::fs::metadata(&path).unwrap().ino();
        write_atomic(&path, b"two", 0o600, None).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let after = std::fs::metadata(&path).unwrap();
        assert_eq!(after.mode() & 0o7777, 0o600);
        // A new inode: the file was replaced, not rewritten in place.
        assert_ne!(after.ino(), before);
        assert!(leftovers(path.parent().unwrap()).is_empty());
    }

    #[test]
    fn never_writes_through_a_symlink_at_the_target_and_leaves_it_alone_on_failure() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let path = dir.path().join("link");
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        // The rename replaces the link itself; the file it pointed at is untouched.
        write_atomic(&path, b"new", 0o600, None).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert!(
            !std::fs::symlink_metadata(&path)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        // A target that cannot be replaced (a directory): an error, no temporary left.
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("f"), b"x").unwrap();
        assert!(write_atomic(&sub, b"y", 0o600, None).is_err());
        assert!(leftovers(dir.path()).is_empty());
        assert_eq!(std::fs::read(sub.join("f")).unwrap(), b"x");
    }

    #[test]
    fn concurrent_writers_use_distinct_temporaries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shared");
        std::thread::scope(|s| {
            for i in 0..8u8 {
                let path = &path;
                s.spawn(move || write_atomic(path, &[i; 4096], 0o600, None).unwrap());
            }
        });
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 4096);
        assert!(
            bytes.iter().all(|b| *b == bytes[0]),
            "a torn mix of writers"
        );
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn a_dead_writers_temporaries_are_removed_and_a_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("conf");
        // pid_max is at most 4194304: this pid never exists.
        let dead = dir.path().join(".conf.4242424.7.tmp");
        let legacy = dir.path().join(".conf.outpost-tmp");
        let live = dir
            .path()
            .join(format!(".conf.{}.999.tmp", std::process::id()));
        let other = dir.path().join(".other.4242424.7.tmp");
        for p in [&dead, &legacy, &live, &other] {
            std::fs::write(p, b"torn").unwrap();
        }
        write_atomic(&path, b"x", 0o600, None).unwrap();
        assert!(!dead.exists() && !legacy.exists());
        assert!(live.exists(), "a live writer's temporary is its own");
        assert!(
            other.exists(),
            "another file's temporary is not ours to remove"
        );
    }

    #[test]
    fn a_new_file_is_created_once_and_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("record");
        assert!(write_atomic_new(&path, b"first", 0o600).unwrap());
        assert!(!write_atomic_new(&path, b"second", 0o600).unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn removal_reports_whether_there_was_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"x").unwrap();
        assert!(remove_file_synced(&path).unwrap());
        assert!(!remove_file_synced(&path).unwrap());
    }
}
