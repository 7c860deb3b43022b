//! The supervised tunnel against a real sshd on loopback: readiness waits for the tunnel's
//! remote port to answer; a killed tunnel is back within the backoff and readiness follows.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, PostParams};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use testkube::ApiServer;

use super::common::{eventually_within, get, install_crypto, kubelet_node, readyz};
use super::run::{start, wait_ready};
use super::sshd::Sshd;

async fn tunnel_status(admin: SocketAddr) -> serde_json::Value {
    let (_, body) = get(admin, "/status").await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["tunnel"].clone()
}

fn alive(pid: i32) -> bool {
    kill(Pid::from_raw(pid), None).is_ok()
}

#[tokio::test]
async fn a_killed_tunnel_comes_back_within_the_backoff_and_readiness_follows() {
    install_crypto();
    let sshd = Sshd::start().await;
    let server = ApiServer::start().await.unwrap();
    let node = "edge-tunnel-1";
    Api::<Node>::all(server.client())
        .create(&PostParams::default(), &kubelet_node(node, 9))
        .await
        .unwrap();
    // A stand-in kubelet on the derived port, so the forwarded connection lands somewhere.
    let port = nodeaddr::kubelet_port_for_node(node);
    let kubelet = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = kubelet.accept().await {
            drop(s);
        }
    });
    let bind = Ipv4Addr::new(127, 45, 0, 9);
    let extra = format!(
        "dataPlane: {{check: tunnel}}\n{}",
        sshd.tunnel_yaml(bind, "2s")
    );
    let agent = start(&server, node, &extra).await;

    let ready_body = wait_ready(
        agent.probe,
        200,
        "ready once the tunnel's remote port answers",
    )
    .await;
    let st = tunnel_status(agent.admin).await;
    assert_eq!(st["running"], true, "{st}");
    assert_eq!(st["restarts"], 0, "{st}");
    let command = st["command"].as_str().unwrap().to_string();
    assert!(
        command.contains(&format!("-R {bind}:{port}:127.0.0.1:{port}")),
        "{command}"
    );
    let pid = i32::try_from(st["pid"].as_u64().unwrap()).unwrap();
    // The forward really is there on the "control-plane host".
    tokio::net::TcpStream::connect((bind, port))
        .await
        .expect("the forwarded port listens");

    // Kill the tunnel: readiness drops, the supervisor restarts it after the backoff (2 s).
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();
    let (code, not_ready_body) = {
        let mut seen = (0, String::new());
        eventually_within(
            "not ready while the tunnel is down",
            Duration::from_secs(10),
            async || {
                seen = readyz(agent.probe).await;
                seen.0 == 503
            },
        )
        .await;
        seen
    };
    assert_eq!(code, 503);
    let killed_at = tokio::time::Instant::now();
    let mut new_pid = 0;
    eventually_within(
        "the tunnel restarted",
        Duration::from_secs(15),
        async || {
            let st = tunnel_status(agent.admin).await;
            new_pid = st["pid"].as_u64().unwrap_or(0) as i32;
            st["running"] == true && st["restarts"] == 1
        },
    )
    .await;
    assert!(
        killed_at.elapsed() < Duration::from_secs(10),
        "restarted after {:?}",
        killed_at.elapsed()
    );
    assert_ne!(new_pid, pid);
    assert_eq!(
        wait_ready(agent.probe, 200, "ready again through the new tunnel").await,
        ready_body
    );
    assert!(!not_ready_body.is_empty());

    let (_, metrics) = get(agent.admin, "/metrics").await.unwrap();
    assert!(
        metrics.contains("outpost_agent_tunnel_restarts_total 1"),
        "{metrics}"
    );
    assert!(metrics.contains("outpost_agent_tunnel_up 1"), "{metrics}");
    assert!(
        metrics.contains("outpost_agent_data_plane_checks_total{result=\"fail\"}"),
        "{metrics}"
    );

    // The exit was recorded as an Event on the Node.
    let events: Api<Event> = Api::namespaced(server.client(), "default");
    let mut found = false;
    eventually_within(
        "a TunnelExited Event",
        Duration::from_secs(10),
        async || {
            found = events
                .list(&Default::default())
                .await
                .map(|l| {
                    l.items.iter().any(|e| {
                        e.reason.as_deref() == Some("TunnelExited")
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node)
                    })
                })
                .unwrap_or(false);
            found
        },
    )
    .await;

    // Shutdown stops the tunnel it started.
    agent.stop().await;
    assert!(!alive(new_pid), "the tunnel outlived the agent");
}
