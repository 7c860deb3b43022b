//! Snapshot save against a real etcd 3.4 member over mTLS, read back by the real etcdctl.

use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use ha::snapshot::{self, SnapshotError};

use crate::etcd_harness::EtcdCluster;

/// `etcdctl` on PATH, or a failure naming the package.
pub fn etcdctl_binary() -> anyhow::Result<PathBuf> {
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        let candidate = dir.join("etcdctl");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!("etcdctl not found on PATH: apt-get install etcd-client")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_saved_snapshot_is_read_by_etcdctl_and_never_replaces_a_file() -> anyhow::Result<()> {
    let etcdctl = etcdctl_binary()?;
    let cluster = EtcdCluster::start(1).await?;
    let tls = cluster.client_tls().context("mTLS cluster")?;
    let mut raw = etcd_client::Client::connect(
        [cluster.endpoint(0)],
        Some(
            etcd_client::ConnectOptions::new().with_tls(
                etcd_client::TlsOptions::new()
                    .ca_certificate(etcd_client::Certificate::from_pem(std::fs::read(&tls.ca)?))
                    .identity(etcd_client::Identity::from_pem(
                        std::fs::read(&tls.cert)?,
                        std::fs::read(&tls.key)?,
                    )),
            ),
        ),
    )
    .await?;
    for i in 0..40 {
        raw.put(format!("/registry/test/key-{i:02}"), vec![b'v'; 1024], None)
            .await?;
    }

    let dir = tempfile::tempdir()?;
    let file = dir.path().join("etcd.snap");
    // The first endpoint answers nothing: the save moves on to the next.
    let endpoints = vec!["https://127.0.0.1:1".to_string(), cluster.endpoint(0)];
    let mut chunks = 0u32;
    let saved =
        snapshot::save_snapshot(&cluster.options(), &endpoints, &file, |_, _| chunks += 1).await?;
    assert_eq!(saved.endpoint, cluster.endpoint(0));
    assert!(chunks >= 1);
    let meta = std::fs::metadata(&file)?;
    assert_eq!(meta.len(), saved.bytes);
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);

    // The real etcdctl 3.4 reads it: every key written is in it.
    let status = snapshot::snapshot_status(&etcdctl, &file)?;
    assert!(status.total_key >= 40, "{status:?}");
    assert!(status.revision >= 41, "{status:?}");
    // And restores it, checking etcd's appended hash.
    let restored = dir.path().join("restored");
    let out = std::process::Command::new(&etcdctl)
        .env("ETCDCTL_API", "3")
        .args(["snapshot", "restore"])
        .arg(&file)
        .arg(format!("--data-dir={}", restored.display()))
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(restored.join("member/snap/db").is_file());

    // A second save never replaces the file.
    let before = std::fs::read(&file)?;
    let err = snapshot::save_snapshot(&cluster.options(), &endpoints, &file, |_, _| {})
        .await
        .unwrap_err();
    assert!(matches!(err, SnapshotError::Exists { .. }), "{err}");
    assert!(err.to_string().contains("never replaces"), "{err}");
    assert_eq!(std::fs::read(&file)?, before);

    // No member serving: every one is named, nothing is written.
    let other = dir.path().join("none.snap");
    let err = snapshot::save_snapshot(
        &cluster.options(),
        &["https://127.0.0.1:1".to_string()],
        &other,
        |_, _| {},
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("https://127.0.0.1:1"), "{err}");
    assert!(!other.exists());
    // Chunks go to a temporary beside the file: no attempt, failed or refused, left one.
    let mut left: Vec<String> = std::fs::read_dir(dir.path())?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()?;
    left.sort();
    assert_eq!(left, ["etcd.snap", "restored"]);
    Ok(())
}
