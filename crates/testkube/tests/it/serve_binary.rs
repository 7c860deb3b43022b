//! `testkube serve`: the binary writes a kubeconfig clients can use, serves until
//! SIGINT, and exits 0.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::ListParams;

#[tokio::test]
async fn serve_writes_a_usable_kubeconfig_and_stops_on_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("sandbox").join("kubeconfig");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_testkube"))
        .args(["serve", "--listen", "127.0.0.1:0", "--kubeconfig"])
        .arg(&kc)
        .kill_on_drop(true)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..400 {
        if kc.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(kc.exists(), "testkube serve did not write {}", kc.display());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&kc).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kc).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let names: Vec<String> = Api::<Namespace>::all(client)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|n| n.metadata.name.unwrap())
        .collect();
    assert!(names.contains(&"kube-system".to_string()), "{names:?}");
    let pid = child.id().unwrap().to_string();
    let sent = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("testkube serve stops within 20 s of SIGINT")
        .unwrap();
    assert!(status.success(), "{status:?}");
}

/// `testkube serve --pki-dir D` serves with the cluster CA of a
/// `stratum-server certs generate` directory: the kubeconfig pins that CA and works.
#[tokio::test]
async fn serve_with_pki_dir_uses_the_cluster_ca() {
    use base64::Engine;
    let dir = tempfile::tempdir().unwrap();
    let pki_dir = dir.path().join("pki");
    pki::generate_shared(&pki_dir, false).unwrap();
    let kc = dir.path().join("kubeconfig");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_testkube"))
        .args(["serve", "--listen", "127.0.0.1:0", "--pki-dir"])
        .arg(&pki_dir)
        .arg("--kubeconfig")
        .arg(&kc)
        .kill_on_drop(true)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    testkube::fixtures::eventually_within(
        "serve writes its kubeconfig",
        Duration::from_secs(20),
        async || kc.exists(),
    )
    .await;
    let parsed = kube::config::Kubeconfig::read_from(&kc).unwrap();
    let pinned = parsed.clusters[0]
        .cluster
        .as_ref()
        .unwrap()
        .certificate_authority_data
        .clone()
        .unwrap();
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(pinned)
            .unwrap(),
        std::fs::read(pki_dir.join("ca.crt")).unwrap()
    );
    let config = kube::Config::from_custom_kubeconfig(parsed, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    Api::<Namespace>::all(client)
        .list(&ListParams::default())
        .await
        .unwrap();
    child.kill().await.unwrap();
}
