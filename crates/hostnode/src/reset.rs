//! Forgetting what a stopped stack left: its kubelet client identity and its CNI state.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::HostRoot;
use crate::configure::KUBELET_KUBECONFIG;
use crate::fsutil::{FsError, fs_err};
use crate::goalstate::{AuthMode, NodeStart};
use crate::mountinfo::{self, MountInfoError};
use crate::remove;

/// A reset step failed.
#[derive(Debug, thiserror::Error)]
pub enum ResetError {
    /// A file operation failed.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// The mount table could not be read, so nothing below it was removed.
    #[error(transparent)]
    MountTable(#[from] MountInfoError),
    /// A removal failed, or was refused (a symlink where a directory belongs).
    #[error(transparent)]
    Remove(#[from] remove::RemoveError),
    /// The mount table could not be read before unmounting.
    #[error("cannot unmount below {}", dir.display())]
    Unmount {
        /// The directory.
        dir: PathBuf,
        /// Why.
        #[source]
        source: MountInfoError,
    },
    /// A mount is still in the way.
    #[error("{} is still mounted, so its contents were kept; unmount it (umount -l PATH) and reset again", path.display())]
    StillMounted {
        /// The mount point.
        path: PathBuf,
    },
}

/// Removes the kubelet's rotated client credentials when the node authenticates with a
/// bootstrap token, so that the next start bootstraps a new identity (a repaved node may
/// come back under a new Node object). Direct kubeconfig and exec-credential modes are
/// rewritten by the configure step instead, so nothing is removed for them. Returns the
/// paths removed.
pub fn reset_kubelet_identity(root: &HostRoot, ns: &NodeStart) -> Result<Vec<PathBuf>, ResetError> {
    let mut removed = Vec::new();
    if !matches!(ns.auth, AuthMode::BootstrapToken(_)) {
        return Ok(removed);
    }
    if let Some(kubelet_dir) = resolve_kubelet_dir(root)? {
        removed.extend(remove_client_certificates(&kubelet_dir)?);
    }
    // The kubeconfig the kubelet wrote after bootstrapping points at those certificates;
    // left behind, it would be used instead of bootstrapping again.
    let kubeconfig = root.resolve(KUBELET_KUBECONFIG);
    if crate::fsutil::remove_file_synced(&kubeconfig)? {
        removed.push(kubeconfig);
    }
    Ok(removed)
}

/// Removes the rotated client pairs (`kubelet-client-*`) from `pki/` of the resolved
/// kubelet directory, by file descriptor: `pki` is opened without following a symlink or
/// crossing a mount, and each file is unlinked relative to it. Only the rotated client
/// pairs: the serving certificate (kubelet.crt/key) is not an identity the API server
/// tracks.
fn remove_client_certificates(kubelet_dir: &Path) -> Result<Vec<PathBuf>, ResetError> {
    use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
    use rustix::io::Errno;
    let errno = |op: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |e: Errno| -> ResetError {
            crate::fsutil::FsError {
                op,
                path,
                source: std::io::Error::from(e),
            }
            .into()
        }
    };
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let top = rustix::fs::open(kubelet_dir, flags, Mode::empty())
        .map_err(errno("open directory", kubelet_dir))?;
    let pki_path = kubelet_dir.join("pki");
    let pki = match rustix::fs::openat2(
        &top,
        c"pki",
        flags,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_XDEV | ResolveFlags::BENEATH,
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(Vec::new()),
        Err(Errno::LOOP) | Err(Errno::NOTDIR) | Err(Errno::XDEV) => {
            tracing::warn!(path = %pki_path.display(), "not a plain directory (a symlink, a file or a mount): its client certificates are left alone");
            return Ok(Vec::new());
        }
        Err(e) => return Err(errno("open directory", &pki_path)(e)),
    };
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(&pki).map_err(errno("read directory", &pki_path))? {
        let entry = entry.map_err(errno("read directory", &pki_path))?;
        if entry.file_name().to_bytes().starts_with(b"kubelet-client-") {
            names.push(entry.file_name().to_owned());
        }
    }
    let mut removed = Vec::new();
    for name in names {
        let path = pki_path.join(std::ffi::OsStr::from_bytes(name.as_bytes()));
        match rustix::fs::unlinkat(&pki, name.as_c_str(), AtFlags::empty()) {
            Ok(()) => removed.push(path),
            Err(Errno::NOENT) => {}
            // A directory of that name is not a certificate: leave it.
            Err(Errno::ISDIR) | Err(Errno::PERM) => {}
            Err(e) => return Err(errno("remove", &path)(e)),
        }
    }
    Ok(removed)
}

/// Removes the CNI network configuration and the CNI state a stopped stack left below
/// `root`. The configuration directory stays, empty.
///
/// A repaved node can be given another pod CIDR. A configuration left in place makes
/// containerd report the network ready at once and start pods with addresses from the old
/// range until the CNI's own pod rewrites it; host-local IPAM keeps reservations for pods
/// that are gone. Add-on files go too: their DaemonSet pods write them again on start.
/// `mount_info` is the mount table consulted so nothing is deleted through a mount.
pub fn reset_cni_state(root: &HostRoot, mount_info: Option<&Path>) -> Result<(), ResetError> {
    let table = mountinfo::read(mount_info)?;
    for dir in [root.cni_config_dir(), root.cni_state_dir()] {
        let report = if dir == root.cni_config_dir() {
            remove::remove_contents(&dir, &table)?
        } else {
            remove::remove_tree(&dir, &table)?
        };
        if let Some(path) = report.kept.into_iter().next() {
            return Err(ResetError::StillMounted { path });
        }
    }
    Ok(())
}

/// What [`clear_kubelet_dir`] did.
#[derive(Debug, Default)]
pub struct ClearReport {
    /// The kubelet directory as resolved (`None`: it does not exist).
    pub dir: Option<PathBuf>,
    /// Mounts below the kubelet directory that could not be unmounted.
    pub unmount_failures: Option<crate::unmount::PrefixError>,
    /// What the removal did; mounts still in place are in `kept`.
    pub removed: remove::RemoveReport,
}

/// Resolves the kubelet directory below `root` before anything is unmounted or removed
/// in it, as kubeadm does: symlinks in the directories that lead to it are resolved (the
/// mount table names real paths), but the kubelet directory itself being a symlink is
/// refused, naming it, since what it points at is not the kubelet's to clear. `Ok(None)`:
/// there is no kubelet directory.
pub fn resolve_kubelet_dir(root: &HostRoot) -> Result<Option<PathBuf>, ResetError> {
    let dir = root.kubelet_dir();
    match std::fs::symlink_metadata(&dir) {
        Ok(meta) if meta.file_type().is_symlink() => Err(remove::RemoveError::Symlink {
            target: std::fs::read_link(&dir).unwrap_or_default(),
            path: dir,
        }
        .into()),
        Ok(meta) if !meta.is_dir() => Err(remove::RemoveError::NotADirectory { path: dir }.into()),
        Ok(_) => Ok(Some(
            std::fs::canonicalize(&dir).map_err(fs_err("resolve", &dir))?,
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(fs_err("inspect", &dir)(e).into()),
    }
}

/// Lazily unmounts every mount strictly below the resolved kubelet directory `dir`,
/// deepest first. A mount AT the directory (a dedicated disk, a bind of it) stays, as with
/// kubeadm: nothing would mount it again. Returns the mounts that would not go.
pub async fn unmount_kubelet_dir(
    dir: &Path,
    mounter: &dyn crate::unmount::Mounter,
    mount_info: Option<&Path>,
) -> Result<Option<crate::unmount::PrefixError>, ResetError> {
    match crate::unmount::unmount_strictly_below(mounter, mount_info, &[dir.to_path_buf()]).await {
        Ok(()) => Ok(None),
        Err(crate::unmount::UnmountError::Table(source)) => Err(ResetError::Unmount {
            dir: dir.to_path_buf(),
            source,
        }),
        Err(crate::unmount::UnmountError::Prefixes(mut failed)) => Ok(failed.pop()),
    }
}

/// Removes the contents of the resolved kubelet directory `dir` that are no longer
/// mounted, on its own filesystem, by file descriptor (see [`remove`]). The mount table
/// is read again here: only the one after the unmounts says what is still mounted (and a
/// mount that appears later is recognised by its mount identity anyway).
pub fn remove_kubelet_state(
    dir: &Path,
    mount_info: Option<&Path>,
) -> Result<remove::RemoveReport, ResetError> {
    let table = mountinfo::read(mount_info)?;
    Ok(remove::remove_contents(dir, &table)?)
}

/// [`resolve_kubelet_dir`], [`unmount_kubelet_dir`] and [`remove_kubelet_state`] in a
/// row: mounts that stayed are reported and left alone with their contents, nothing is
/// deleted through a mount or a symlink.
pub async fn clear_kubelet_dir(
    root: &HostRoot,
    mounter: &dyn crate::unmount::Mounter,
    mount_info: Option<&Path>,
) -> Result<ClearReport, ResetError> {
    let Some(dir) = resolve_kubelet_dir(root)? else {
        return Ok(ClearReport::default());
    };
    let unmount_failures = unmount_kubelet_dir(&dir, mounter, mount_info).await?;
    if let Some(err) = &unmount_failures {
        tracing::warn!(error = %err, "some pod volumes stay mounted; their contents are kept");
    }
    let removed = remove_kubelet_state(&dir, mount_info)?;
    Ok(ClearReport {
        dir: Some(dir),
        unmount_failures,
        removed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::goalstate::{KubeconfigAuth, resolve_machine, tests::config};

    #[test]
    fn identity_reset_only_for_bootstrap_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path());
        let pki = root.kubelet_client_pki_dir();
        std::fs::create_dir_all(&pki).unwrap();
        for f in [
            "kubelet-client-current.pem",
            "kubelet-client-2026-01-01.pem",
            "kubelet.crt",
        ] {
            std::fs::write(pki.join(f), f).unwrap();
        }
        std::fs::create_dir_all(root.resolve("/etc/kubernetes")).unwrap();
        std::fs::write(root.resolve(KUBELET_KUBECONFIG), "x").unwrap();

        let mut ns = resolve_machine(&config(), "").unwrap().node_start;
        let direct = NodeStart {
            auth: AuthMode::Kubeconfig(KubeconfigAuth {
                content: "x".into(),
            }),
            ..ns.clone()
        };
        assert!(reset_kubelet_identity(&root, &direct).unwrap().is_empty());
        assert!(pki.join("kubelet-client-current.pem").exists());

        let removed = reset_kubelet_identity(&root, &ns).unwrap();
        assert_eq!(removed.len(), 3);
        assert!(!pki.join("kubelet-client-current.pem").exists());
        assert!(pki.join("kubelet.crt").exists());
        assert!(!root.resolve(KUBELET_KUBECONFIG).exists());
        // Idempotent.
        ns.node_name = "again".into();
        assert!(reset_kubelet_identity(&root, &ns).unwrap().is_empty());
    }

    /// The identity reset never follows a `pki` symlink out of the kubelet directory.
    #[test]
    fn identity_reset_never_follows_a_pki_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path().join("root"));
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("kubelet-client-current.pem"), b"not ours").unwrap();
        std::fs::create_dir_all(root.kubelet_dir()).unwrap();
        std::os::unix::fs::symlink(&outside, root.kubelet_client_pki_dir()).unwrap();
        let ns = resolve_machine(&config(), "").unwrap().node_start;
        assert!(reset_kubelet_identity(&root, &ns).unwrap().is_empty());
        assert!(outside.join("kubelet-client-current.pem").exists());
    }
}
