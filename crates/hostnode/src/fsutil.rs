//! Crash-safe file writes.
//!
//! A configuration file is replaced by writing a temporary file beside it, syncing it,
//! renaming it over the target and syncing the directory: after a crash the target holds
//! either the old bytes or the new ones, never a torn mix.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A file operation failed.
#[derive(Debug, thiserror::Error)]
#[error("{op} {}", path.display())]
pub struct FsError {
    /// What was being done (`write`, `rename to`, `sync directory`, ...).
    pub op: &'static str,
    /// The path it was done to.
    pub path: PathBuf,
    /// Why it failed.
    #[source]
    pub source: std::io::Error,
}

pub(crate) fn fs_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> FsError {
    let path = path.to_path_buf();
    move |source| FsError { op, path, source }
}

/// The temporary name used while replacing `path` (same directory, so the rename is
/// atomic; a fixed name, so a crashed write's leftover is overwritten next time).
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.outpost-tmp"))
}

/// Replaces `path` with `contents` atomically, with permission bits `mode` and, when
/// given, owner `(uid, gid)`. Missing parent directories are created (mode 0755).
///
/// The directory is opened once; the temporary file is created (`O_EXCL | O_NOFOLLOW`),
/// renamed over the target and the directory synced, all relative to that descriptor, so
/// nothing planted at either name, and no directory swapped on the way between the steps,
/// redirects the write.
pub fn write_atomic(
    path: &Path,
    contents: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
) -> Result<(), FsError> {
    use rustix::fs::{AtFlags, Mode, OFlags};
    let errno = |op: &'static str, p: &Path| {
        let p = p.to_path_buf();
        move |e: rustix::io::Errno| FsError {
            op,
            path: p,
            source: std::io::Error::from(e),
        }
    };
    let dir = path.parent().unwrap_or(Path::new("/"));
    let Some(name) = path.file_name() else {
        return Err(FsError {
            op: "write",
            path: path.to_path_buf(),
            source: std::io::Error::other("not a file name"),
        });
    };
    std::fs::create_dir_all(dir).map_err(fs_err("create directory", dir))?;
    let dir_fd = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(errno("open directory", dir))?;
    let tmp = temp_path(path);
    let tmp_name = tmp.file_name().unwrap_or(name);
    match rustix::fs::unlinkat(&dir_fd, tmp_name, AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(errno("remove stale temporary file", &tmp)(e)),
    }
    {
        // O_EXCL + O_NOFOLLOW: never write through something planted at the temp name.
        let fd = rustix::fs::openat(
            &dir_fd,
            tmp_name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(errno("create", &tmp))?;
        let mut file = File::from(fd);
        file.write_all(contents).map_err(fs_err("write", &tmp))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid))
                .map_err(fs_err("chown", &tmp))?;
        }
        // After chown: changing the owner clears set-id bits.
        file.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(fs_err("chmod", &tmp))?;
        file.sync_all().map_err(fs_err("sync", &tmp))?;
    }
    rustix::fs::renameat(&dir_fd, tmp_name, &dir_fd, name)
        .map_err(errno("rename into place", path))?;
    rustix::fs::fsync(&dir_fd).map_err(errno("sync directory", dir))
}

/// Removes `path` if it exists (not a directory) and syncs its directory.
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

    #[test]
    fn writes_mode_and_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/b/config.yaml");
        write_atomic(&path, b"one", 0o640, None).unwrap();
        std::fs::write(temp_path(&path), b"stale leftover").unwrap();
        write_atomic(&path, b"two", 0o600, None).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o7777, 0o600);
        assert!(!temp_path(&path).exists());
    }
}
