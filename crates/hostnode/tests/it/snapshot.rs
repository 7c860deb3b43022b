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
    std::fs::write(containerd_dir.join(".config.toml.outpost-tmp"), b"torn").unwrap();

    // The next process finds the snapshot and finishes the restore.
    assert!(restore_snapshot(&dir, &root).await.unwrap());
    let after: Vec<_> = PATHS.iter().map(|p| state(&root, p)).collect();
    assert_eq!(after, before);
    assert!(!containerd_dir.join(".config.toml.outpost-tmp").exists());
    assert!(!dir.exists(), "a finished restore discards the snapshot");
    // Nothing left to restore.
    assert!(!restore_snapshot(&dir, &root).await.unwrap());
    assert!(!Path::new(&dir).exists());
}
