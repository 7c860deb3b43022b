//! The wireguard data-plane check against a real wireguard-go pair. Everything (the API
//! double, the agent, both interfaces) runs on one thread inside a network namespace of
//! its own, so nothing touches the host's interfaces.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use testkube::ApiServer;

use super::common::{install_crypto, kubelet_node, readyz, require_tool};
use super::run::{start, wait_ready};

struct Killed(Vec<Child>);
impl Drop for Killed {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn sh(cmd: &str) {
    let out = Command::new("sh").args(["-c", cmd]).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn key(dir: &std::path::Path, name: &str) -> (String, String) {
    let private = dir.join(name);
    let out = Command::new("wg").arg("genkey").output().unwrap();
    std::fs::write(&private, &out.stdout).unwrap();
    let public = Command::new("sh")
        .args(["-c", &format!("wg pubkey < {}", private.display())])
        .output()
        .unwrap();
    (
        private.display().to_string(),
        String::from_utf8(public.stdout).unwrap().trim().to_string(),
    )
}

#[test]
fn readiness_follows_a_real_wireguard_interface() {
    require_tool("wireguard-go", "wireguard-go");
    require_tool("wg", "wireguard-tools");
    require_tool("ip", "iproute2");
    std::thread::spawn(|| {
        // A network namespace for this thread and the processes it starts.
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
            .expect("unshare(CLONE_NEWNET) (the test needs root)");
        sh("ip link set lo up");
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(scenario());
    })
    .join()
    .unwrap();
}

async fn scenario() {
    install_crypto();
    let dir = tempfile::tempdir().unwrap();
    let suffix = std::process::id() % 10000;
    let (a, b) = (format!("owga{suffix}"), format!("owgb{suffix}"));
    let mut procs = Killed(Vec::new());
    for name in [&a, &b] {
        procs.0.push(
            Command::new("wireguard-go")
                .args(["-f", name])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("wireguard-go starts"),
        );
    }
    for name in [&a, &b] {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !Command::new("wg")
            .args(["show", name])
            .output()
            .unwrap()
            .status
            .success()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "wireguard-go did not create {name}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let (ka, pa) = key(dir.path(), "a.key");
    let (kb, pb) = key(dir.path(), "b.key");
    let port_a = super::common::free_port();
    let port_b = super::common::free_port();
    sh(&format!(
        "wg set {a} private-key {ka} listen-port {port_a} peer {pb} endpoint 127.0.0.1:{port_b} allowed-ips 10.99.0.2/32 persistent-keepalive 1"
    ));
    sh(&format!(
        "wg set {b} private-key {kb} listen-port {port_b} peer {pa} endpoint 127.0.0.1:{port_a} allowed-ips 10.99.0.1/32 persistent-keepalive 1"
    ));

    let server = ApiServer::start().await.unwrap();
    Api::<Node>::all(server.client())
        .create(&PostParams::default(), &kubelet_node("wg-worker", 3))
        .await
        .unwrap();
    let extra = format!("dataPlane: {{check: wireguard, interface: {a}, maxHandshakeAge: 30s}}\n");
    let agent = start(&server, "wg-worker", &extra).await;
    let probe: SocketAddr = agent.probe;

    // The interfaces exist but are down: the Node is Ready, the data plane is not.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (code, not_ready) = readyz(probe).await;
    assert_eq!(code, 503);

    sh(&format!("ip link set {a} up && ip link set {b} up"));
    let ready = wait_ready(
        probe,
        200,
        "ready once the interface is up and has shaken hands",
    )
    .await;

    sh(&format!("ip link set {a} down"));
    assert_eq!(
        wait_ready(probe, 503, "not ready once the interface is down").await,
        not_ready
    );
    sh(&format!("ip link set {a} up"));
    assert_eq!(wait_ready(probe, 200, "ready again").await, ready);

    agent.stop().await;
    drop(procs);
}
