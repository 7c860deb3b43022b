//! Unmounting real tmpfs and bind mounts in a private mount namespace.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hostnode::unmount::{self, Mounter, SyscallMounter};
use hostnode::{BoxFuture, HostRoot};

use crate::support::{block_on, in_private_mount_ns, mount_bind, mount_tmpfs, mounts_below};

/// Records the order of unmounts and can refuse some, around the real syscall.
#[derive(Clone, Default)]
struct Observed {
    order: Arc<Mutex<Vec<PathBuf>>>,
    refuse: Vec<PathBuf>,
}

impl Mounter for Observed {
    fn unmount_lazy<'a>(&'a self, path: &'a Path) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            self.order.lock().unwrap().push(path.to_path_buf());
            if self.refuse.iter().any(|p| p == path) {
                return Err("refused by the test (stands in for a mount that will not go)".into());
            }
            SyscallMounter.unmount_lazy(path).await
        })
    }

    fn unmount_mount<'a>(&'a self, path: &'a Path, id: u32) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            self.order.lock().unwrap().push(path.to_path_buf());
            if self.refuse.iter().any(|p| p == path) {
                return Err("refused by the test (stands in for a mount that will not go)".into());
            }
            SyscallMounter.unmount_mount(path, id).await
        })
    }
}

#[test]
fn unmount_below_takes_nested_mounts_deepest_first() {
    if !in_private_mount_ns(
        module_path!(),
        "unmount_below_takes_nested_mounts_deepest_first",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = HostRoot::new(tmp.path());
    let k = root.kubelet_dir();
    let sibling = root.resolve("/var/lib/kubelet-x");
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("precious"), b"keep me").unwrap();

    mount_tmpfs(&k);
    let secret = k.join("pods/p1/volumes/kubernetes.io~secret/token");
    mount_tmpfs(&secret);
    mount_tmpfs(&secret.join("nested"));
    // Names the kernel escapes in mountinfo: space (\040), tab (\011), newline (\012),
    // backslash (\134).
    let odd = k.join("pods/p2/volumes/my vol\twith\nodd\\name");
    mount_tmpfs(&odd);
    let bind = k.join("pods/p3/volumes/kubernetes.io~csi/pv/mount");
    mount_bind(&data, &bind);
    // Two mounts stacked on one directory.
    let stacked = k.join("pods/p4");
    mount_tmpfs(&stacked);
    mount_tmpfs(&stacked);
    mount_tmpfs(&sibling);
    std::fs::write(sibling.join("state"), b"sibling").unwrap();

    let before = mounts_below(&k);
    // The parser decoded the kernel's escapes back to the real names.
    assert!(before.contains(&odd), "{before:?}");
    assert_eq!(before.len(), 7, "{before:?}");

    let mounter = Observed::default();
    block_on(unmount::unmount_below(
        &mounter,
        None,
        std::slice::from_ref(&k),
    ))
    .unwrap();

    let order = mounter.order.lock().unwrap().clone();
    assert_eq!(order.len(), 7, "{order:?}");
    // No mount is unmounted after a mount it is below.
    for (i, earlier) in order.iter().enumerate() {
        for later in &order[i + 1..] {
            assert!(
                later == earlier || !later.starts_with(earlier),
                "{later:?} unmounted after {earlier:?}, a mount above it: {order:?}"
            );
        }
    }
    let deepest = order.iter().map(|p| p.components().count()).max().unwrap();
    assert_eq!(order[0].components().count(), deepest, "{order:?}");
    assert_eq!(order.last().unwrap(), &k);
    assert_eq!(mounts_below(&k), Vec::<PathBuf>::new());
    // kubelet-x is not below kubelet: still mounted, contents intact.
    assert_eq!(mounts_below(&sibling), vec![sibling.clone()]);
    assert_eq!(std::fs::read(sibling.join("state")).unwrap(), b"sibling");
    assert_eq!(std::fs::read(data.join("precious")).unwrap(), b"keep me");
    block_on(unmount::unmount_below(
        &SyscallMounter,
        None,
        std::slice::from_ref(&sibling),
    ))
    .unwrap();
}

#[test]
fn strictly_below_keeps_the_prefix_mount() {
    if !in_private_mount_ns(module_path!(), "strictly_below_keeps_the_prefix_mount") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let k = HostRoot::new(tmp.path()).kubelet_dir();
    mount_tmpfs(&k);
    std::fs::write(k.join("marker"), b"on the prefix mount").unwrap();
    mount_tmpfs(&k.join("pods/a/volumes/v"));
    mount_tmpfs(&k.join("pods/b"));

    block_on(unmount::unmount_strictly_below(
        &SyscallMounter,
        None,
        std::slice::from_ref(&k),
    ))
    .unwrap();

    assert_eq!(mounts_below(&k), vec![k.clone()]);
    assert_eq!(
        std::fs::read(k.join("marker")).unwrap(),
        b"on the prefix mount"
    );
    block_on(unmount::unmount_below(
        &SyscallMounter,
        None,
        std::slice::from_ref(&k),
    ))
    .unwrap();
    assert!(mounts_below(&k).is_empty());
}

#[test]
fn reset_never_deletes_through_a_mount() {
    if !in_private_mount_ns(module_path!(), "reset_never_deletes_through_a_mount") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = HostRoot::new(tmp.path().join("root"));
    let k = root.kubelet_dir();
    std::fs::create_dir_all(k.join("pki")).unwrap();
    std::fs::write(k.join("pki/kubelet-client-current.pem"), b"cert").unwrap();
    std::fs::write(k.join("cpu_manager_state"), b"{}").unwrap();
    // A bind mount of a directory on the same filesystem (same st_dev: only the mount
    // table tells it apart) and a tmpfs (another device).
    let data = tmp.path().join("data");
    std::fs::create_dir_all(data.join("db")).unwrap();
    std::fs::write(data.join("db/rows"), b"must survive").unwrap();
    let bind = k.join("pods/p1/volumes/kubernetes.io~local-volume/pv");
    mount_bind(&data, &bind);
    let stuck = k.join("pods/p2/volumes/kubernetes.io~secret/s");
    mount_tmpfs(&stuck);
    std::fs::write(stuck.join("token"), b"secret").unwrap();
    let stuck_bind = k.join("pods/p3/volumes/kubernetes.io~local-volume/pv2");
    mount_bind(&data, &stuck_bind);

    // First: the two "stuck" mounts refuse to go, as a busy mount would.
    let mounter = Observed {
        refuse: vec![stuck.clone(), stuck_bind.clone()],
        ..Observed::default()
    };
    let report = block_on(hostnode::clear_kubelet_dir(&root, &mounter, None)).unwrap();
    let failures = report
        .unmount_failures
        .expect("the refused mounts are reported");
    assert_eq!(failures.failures.len(), 2, "{failures}");
    // The kubelet dir itself was not a mount; the refused ones and their contents stay.
    let mut kept = report.removed.kept.clone();
    kept.sort();
    assert_eq!(kept, [stuck.clone(), stuck_bind.clone()]);
    assert_eq!(std::fs::read(stuck.join("token")).unwrap(), b"secret");
    assert_eq!(
        std::fs::read(data.join("db/rows")).unwrap(),
        b"must survive"
    );
    assert_eq!(
        std::fs::read(stuck_bind.join("db/rows")).unwrap(),
        b"must survive"
    );
    assert!(!k.join("cpu_manager_state").exists());
    assert!(
        !k.join("pods/p1").exists(),
        "the unmounted volume's directory is removed"
    );
    assert!(k.is_dir());

    // Then: nothing refuses; everything goes, the data behind the bind mounts stays.
    let report = block_on(hostnode::clear_kubelet_dir(&root, &SyscallMounter, None)).unwrap();
    assert!(report.unmount_failures.is_none());
    assert!(report.removed.kept.is_empty());
    assert!(mounts_below(&k).is_empty());
    assert_eq!(std::fs::read_dir(&k).unwrap().count(), 0);
    assert_eq!(
        std::fs::read(data.join("db/rows")).unwrap(),
        b"must survive"
    );
}

#[test]
fn cni_reset_refuses_to_delete_through_a_mount() {
    if !in_private_mount_ns(
        module_path!(),
        "cni_reset_refuses_to_delete_through_a_mount",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = HostRoot::new(tmp.path());
    let networks = root.cni_state_dir().join("networks");
    std::fs::create_dir_all(networks.join("cbr0")).unwrap();
    std::fs::write(networks.join("cbr0/10.244.0.9"), b"id").unwrap();
    let mounted = root.cni_state_dir().join("results");
    mount_tmpfs(&mounted);
    std::fs::write(mounted.join("keep"), b"on a mount").unwrap();

    let err = hostnode::reset_cni_state(&root, None).unwrap_err();
    assert!(
        matches!(err, hostnode::ResetError::StillMounted { ref path } if *path == mounted),
        "{err}"
    );
    assert!(err.to_string().contains("still mounted"), "{err}");
    assert_eq!(std::fs::read(mounted.join("keep")).unwrap(), b"on a mount");
    // What was not behind the mount is gone.
    assert!(!networks.exists());
}

/// Issue 19: a mount the table does not list (it appeared after the table was read, or
/// the table is empty) is still recognised, by its mount identity, and kept with the
/// file behind it. A bind mount of the same filesystem has the same device number, so
/// only the mount id tells it apart.
#[test]
fn removal_keeps_mounts_missing_from_the_table() {
    if !in_private_mount_ns(
        module_path!(),
        "removal_keeps_mounts_missing_from_the_table",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let k = HostRoot::new(tmp.path().join("root")).kubelet_dir();
    std::fs::create_dir_all(k.join("pods/p0")).unwrap();
    std::fs::write(k.join("pods/p0/f"), b"x").unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("rows"), b"must survive").unwrap();
    let bind = k.join("pods/p1/volumes/kubernetes.io~local-volume/pv");
    mount_bind(&data, &bind);
    let tmpfs = k.join("pods/p2/volumes/kubernetes.io~secret/s");
    mount_tmpfs(&tmpfs);
    std::fs::write(tmpfs.join("token"), b"secret").unwrap();

    // The table handed over is empty: as if both mounts came after it was read.
    let report = hostnode::remove::remove_contents(&k, &[]).unwrap();
    let mut kept = report.kept.clone();
    kept.sort();
    assert_eq!(kept, [bind.clone(), tmpfs.clone()]);
    assert_eq!(std::fs::read(data.join("rows")).unwrap(), b"must survive");
    assert_eq!(std::fs::read(bind.join("rows")).unwrap(), b"must survive");
    assert_eq!(std::fs::read(tmpfs.join("token")).unwrap(), b"secret");
    assert!(!k.join("pods/p0").exists());
    assert_eq!(mounts_below(&k).len(), 2);
}

/// Issue 17: with `<root>/var` a symlink, the mount table names the real path. The
/// kubelet directory is resolved first, so the bind mount below `pods/` is unmounted
/// (not deleted through) and the data behind it survives.
#[test]
fn reset_resolves_a_symlinked_parent_before_matching_mounts() {
    if !in_private_mount_ns(
        module_path!(),
        "reset_resolves_a_symlinked_parent_before_matching_mounts",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = HostRoot::new(tmp.path().join("root"));
    std::fs::create_dir_all(tmp.path().join("real-var/lib/kubelet/pods/p1")).unwrap();
    std::fs::create_dir_all(root.prefix()).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("real-var"), root.resolve("/var")).unwrap();
    let k = root.kubelet_dir();
    std::fs::write(k.join("cpu_manager_state"), b"{}").unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("rows"), b"must survive").unwrap();
    // Mounted through the symlinked path; the table shows real-var.
    let bind = k.join("pods/p1/volumes/kubernetes.io~local-volume/pv");
    mount_bind(&data, &bind);

    let report = block_on(hostnode::clear_kubelet_dir(&root, &SyscallMounter, None)).unwrap();
    assert!(report.unmount_failures.is_none());
    assert!(report.removed.kept.is_empty(), "{:?}", report.removed.kept);
    assert_eq!(std::fs::read(data.join("rows")).unwrap(), b"must survive");
    assert!(mounts_below(&tmp.path().join("real-var")).is_empty());
    assert_eq!(std::fs::read_dir(&k).unwrap().count(), 0);
}

/// Issue 17: a kubelet directory that is itself a symlink is refused, naming it; nothing
/// is unmounted or removed where it points.
#[test]
fn reset_refuses_a_kubelet_dir_that_is_a_symlink() {
    if !in_private_mount_ns(
        module_path!(),
        "reset_refuses_a_kubelet_dir_that_is_a_symlink",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = HostRoot::new(tmp.path().join("root"));
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir_all(elsewhere.join("pods/p1")).unwrap();
    std::fs::write(elsewhere.join("pods/p1/f"), b"keep").unwrap();
    mount_tmpfs(&elsewhere.join("pods/p2"));
    let k = root.kubelet_dir();
    std::fs::create_dir_all(k.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &k).unwrap();

    let err = block_on(hostnode::clear_kubelet_dir(&root, &SyscallMounter, None)).unwrap_err();
    let msg = hostnode::error_chain(&err);
    assert!(
        msg.contains(k.to_str().unwrap()) && msg.contains("symlink"),
        "{msg}"
    );
    assert_eq!(std::fs::read(elsewhere.join("pods/p1/f")).unwrap(), b"keep");
    assert_eq!(mounts_below(&elsewhere), [elsewhere.join("pods/p2")]);
}

/// Issue 17: a dedicated disk mounted AT the kubelet directory stays mounted (nothing
/// would mount it again); what is on it is removed and the pod volumes below it are
/// unmounted.
#[test]
fn reset_keeps_a_disk_mounted_at_the_kubelet_dir() {
    if !in_private_mount_ns(
        module_path!(),
        "reset_keeps_a_disk_mounted_at_the_kubelet_dir",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = HostRoot::new(tmp.path().join("root"));
    let k = root.kubelet_dir();
    mount_tmpfs(&k);
    std::fs::create_dir_all(k.join("pods/p1")).unwrap();
    std::fs::write(k.join("pods/p1/f"), b"x").unwrap();
    mount_tmpfs(&k.join("pods/p2/volumes/kubernetes.io~secret/s"));

    let report = block_on(hostnode::clear_kubelet_dir(&root, &SyscallMounter, None)).unwrap();
    assert!(report.unmount_failures.is_none());
    assert!(report.removed.kept.is_empty(), "{:?}", report.removed.kept);
    assert_eq!(
        mounts_below(&k),
        vec![k.clone()],
        "the disk at the kubelet dir stays"
    );
    assert_eq!(std::fs::read_dir(&k).unwrap().count(), 0);
}

/// The real unmount checks mount identity: a path that leads through a symlink, or to a
/// mount other than the one the table named, is not detached.
#[test]
fn unmount_checks_the_mount_identity_and_never_follows_a_symlink() {
    if !in_private_mount_ns(
        module_path!(),
        "unmount_checks_the_mount_identity_and_never_follows_a_symlink",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let elsewhere = tmp.path().join("elsewhere/vol");
    mount_tmpfs(&elsewhere);
    let id = hostnode::mountinfo::read(None)
        .unwrap()
        .into_iter()
        .find(|m| m.mount_point == elsewhere)
        .unwrap()
        .id;
    // A pod directory swapped for a symlink to where the mount really is.
    let pod = tmp.path().join("k/pods/p");
    std::fs::create_dir_all(pod.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("elsewhere"), &pod).unwrap();
    let err = block_on(SyscallMounter.unmount_mount(&pod.join("vol"), id)).unwrap_err();
    assert!(err.contains("symlink"), "{err}");
    assert_eq!(mounts_below(&elsewhere), vec![elsewhere.clone()]);
    // The right path with another mount's id: left alone.
    block_on(SyscallMounter.unmount_mount(&elsewhere, id + 100_000)).unwrap();
    assert_eq!(mounts_below(&elsewhere), vec![elsewhere.clone()]);
    // The right path and id: detached.
    block_on(SyscallMounter.unmount_mount(&elsewhere, id)).unwrap();
    assert!(mounts_below(&elsewhere).is_empty());
}
