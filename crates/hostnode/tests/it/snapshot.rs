//! Snapshots on a real filesystem: bytes, modes and owners survive a round trip, and a
//! restore cut short is finished by `restore_snapshot`.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use hostnode::HostRoot;
use hostnode::snapshot::{restore_snapshot, take_snapshot_of};

use crate::support::require_root;

fn write(root: &HostRoot, path: &str, bytes: &[u8], mode: u32, owner: (u32, u32)) {
    let live = root.resolve(path);
    std::fs::create_dir_all(live.parent().unwrap()).unwrap();
    std::fs::write(&live, bytes).unwrap();
    std::os::unix::fs::chown(&live, Some(owner.0), Some(owner.1)).unwrap();
    std::fs::set_permissions(&live, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn state(root: &HostRoot, path: &str) -> Option<(Vec<u8>, u32, u32, u32)> {
    let live = root.resolve(path);
    let meta = std::fs::symlink_metadata(&live).ok()?;
    Some((
        std::fs::read(&live).unwrap(),
        meta.mode() & 0o7777,
        meta.uid(),
        meta.gid(),
    ))
}

const PATHS: [&str; 4] = [
    "/etc/kubernetes/kubelet/config.yaml",
    "/etc/kubernetes/bootstrap-kubelet.conf",
    "/etc/containerd/config.toml",
    "/etc/systemd/system/kubelet.service.d/10-outpost.conf",
];

fn populate(root: &HostRoot) {
    write(
        root,
        PATHS[0],
        b"kind: KubeletConfiguration\n",
        0o644,
        (0, 0),
    );
    write(
        root,
        PATHS[1],
        b"token: abcdef.0123456789abcdef\n",
        0o600,
        (1234, 5678),
    );
    write(root, PATHS[2], b"version = 2\n", 0o640, (0, 42));
    // PATHS[3] is absent before the upgrade.
}

#[tokio::test]
async fn take_corrupt_restore_compares_bytes_modes_and_owners() {
    require_root("restoring file owners");
    let tmp = tempfile::tempdir().unwrap();
    let root = HostRoot::new(tmp.path().join("root"));
    populate(&root);
    let before: Vec<_> = PATHS.iter().map(|p| state(&root, p)).collect();
    assert!(before[3].is_none());

    let paths: Vec<String> = PATHS.iter().map(|p| p.to_string()).collect();
    let dir = tmp.path().join("snap");
    let mut snap = take_snapshot_of(&dir, &root, &paths).unwrap();

    // What a half-applied upgrade leaves: new bytes, other modes and owners, a file
    // removed, a file created.
    write(&root, PATHS[0], b"garbage", 0o666, (7, 7));
    std::fs::remove_file(root.resolve(PATHS[1])).unwrap();
    write(&root, PATHS[2], b"version = 3\n", 0o600, (0, 0));
    write(&root, PATHS[3], b"[Service]\n", 0o644, (0, 0));

    snap.restore().await.unwrap();
    assert!(snap.restored());
    let after: Vec<_> = PATHS.iter().map(|p| state(&root, p)).collect();
    assert_eq!(after, before);
    snap.discard();
    assert!(!dir.exists());
}

#[tokio::test]
async fn interrupted_restore_is_finished_by_restore_snapshot() {
    require_root("restoring file owners");
    let tmp = tempfile::tempdir().unwrap();
    let root = HostRoot::new(tmp.path().join("root"));
    populate(&root);
    let before: Vec<_> = PATHS.iter().map(|p| state(&root, p)).collect();
    let paths: Vec<String> = PATHS.iter().map(|p| p.to_string()).collect();
    let dir = tmp.path().join("snap");
    let mut snap = take_snapshot_of(&dir, &root, &paths).unwrap();

    for p in &PATHS[..3] {
        write(&root, p, b"upgraded", 0o644, (0, 0));
    }
    write(&root, PATHS[3], b"[Service]\n", 0o644, (0, 0));
    // Make the restore stop half way: /etc/containerd is replaced by a plain file, so
    // the third file cannot be written after the first two were.
    let containerd_dir = root.resolve("/etc/containerd");
    std::fs::remove_dir_all(&containerd_dir).unwrap();
    std::fs::write(&containerd_dir, b"in the way").unwrap();

    let err = snap.restore().await.unwrap_err();
    assert!(err.to_string().contains("etc/containerd"), "{err}");
    assert!(!snap.restored());
    assert_eq!(
        state(&root, PATHS[0]),
        before[0],
        "restored before the failure"
    );
    assert_eq!(
        state(&root, PATHS[1]),
        before[1],
        "restored before the failure"
    );
    assert_eq!(
        state(&root, PATHS[3]).unwrap().0,
        b"[Service]\n",
        "not reached yet"
    );
    // The process "dies" here, snapshot kept. The obstacle goes away (as the crash
    // point does), and a leftover temporary file from a torn write is lying around.
    drop(snap);
    assert!(dir.join("manifest.json").exists());
    std::fs::remove_file(&containerd_dir).unwrap();
    std::fs::create_dir_all(&containerd_dir).unwrap();
    // Named as common::fsutil names a temporary, for a process that no longer exists
    // (pid_max is at most 4194304).
    let torn = containerd_dir.join(".config.toml.4242424.0.tmp");
    std::fs::write(&torn, b"torn").unwrap();

    // The next process finds the snapshot and finishes the restore.
    assert!(restore_snapshot(&dir, &root).await.unwrap());
    let after: Vec<_> = PATHS.iter().map(|p| state(&root, p)).collect();
    assert_eq!(after, before);
    assert!(!torn.exists());
    assert!(!dir.exists(), "a finished restore discards the snapshot");
    // Nothing left to restore.
    assert!(!restore_snapshot(&dir, &root).await.unwrap());
    assert!(!Path::new(&dir).exists());
}

/// Issue 19: a snapshot that fails half way (its directory fills up) must leave nothing
/// `load` accepts, and a restore afterwards must change nothing. Catches a take that
/// writes the manifest before the saved copies.
#[test]
fn a_snapshot_that_runs_out_of_space_leaves_nothing_to_restore() {
    if !crate::support::in_private_mount_ns(
        module_path!(),
        "a_snapshot_that_runs_out_of_space_leaves_nothing_to_restore",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = HostRoot::new(tmp.path().join("root"));
    let paths: Vec<String> = (0..3)
        .map(|i| format!("/etc/outpost/big-{i}.conf"))
        .collect();
    for (i, p) in paths.iter().enumerate() {
        write(&root, p, &vec![b'a' + i as u8; 30_000], 0o644, (0, 0));
    }
    let before: Vec<_> = paths.iter().map(|p| state(&root, p)).collect();
    let inodes: Vec<u64> = paths
        .iter()
        .map(|p| std::fs::metadata(root.resolve(p)).unwrap().ino())
        .collect();
    // Room for one saved copy, not three.
    let small = tmp.path().join("small");
    std::fs::create_dir(&small).unwrap();
    crate::support::sh(
        "mount",
        &[
            "-t",
            "tmpfs",
            "-o",
            "size=48k",
            "tmpfs",
            small.to_str().unwrap(),
        ],
    );
    let dir = small.join("snap");

    let err = take_snapshot_of(&dir, &root, &paths).unwrap_err();
    assert!(
        hostnode::error_chain(&err).contains("No space left"),
        "{}",
        hostnode::error_chain(&err)
    );
    assert!(
        hostnode::snapshot::load(&dir, &root).unwrap().is_none(),
        "a half-written snapshot is accepted"
    );
    assert!(!hostnode::snapshot::exists(&dir));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    assert!(!rt.block_on(restore_snapshot(&dir, &root)).unwrap());
    let after: Vec<_> = paths.iter().map(|p| state(&root, p)).collect();
    assert_eq!(after, before, "the restore changed the live files");
    let inodes_after: Vec<u64> = paths
        .iter()
        .map(|p| std::fs::metadata(root.resolve(p)).unwrap().ino())
        .collect();
    assert_eq!(inodes_after, inodes, "the restore rewrote the live files");
}

/// Issue 19: a restore replaces each file by renaming a complete copy over it; it never
/// rewrites the live file in place (a reader would see it torn, and a crash would leave
/// it half written). A hard link taken before the restore keeps what it held.
#[tokio::test]
async fn restore_replaces_files_by_rename_not_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let root = HostRoot::new(tmp.path().join("root"));
    let path = "/etc/kubernetes/kubelet/config.yaml";
    let live = root.resolve(path);
    std::fs::create_dir_all(live.parent().unwrap()).unwrap();
    std::fs::write(&live, b"kind: KubeletConfiguration\nmaxPods: 110\n").unwrap();
    let dir = tmp.path().join("snap");
    let mut snap = take_snapshot_of(&dir, &root, &[path.to_string()]).unwrap();

    std::fs::write(&live, b"upgraded\n").unwrap();
    let link = tmp.path().join("held-by-a-reader");
    std::fs::hard_link(&live, &link).unwrap();
    let inode = std::fs::metadata(&live).unwrap().ino();

    snap.restore().await.unwrap();
    assert_eq!(
        std::fs::read(&live).unwrap(),
        b"kind: KubeletConfiguration\nmaxPods: 110\n"
    );
    assert_ne!(
        std::fs::metadata(&live).unwrap().ino(),
        inode,
        "the live file was rewritten in place"
    );
    assert_eq!(std::fs::read(&link).unwrap(), b"upgraded\n");
    snap.discard();
}
