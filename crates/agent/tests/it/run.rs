//! The run daemon against the API double: readiness follows the Node's Ready condition,
//! the probe bodies stay constant, the admin listener reports the conditions.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use testkube::ApiServer;
use tokio_util::sync::CancellationToken;

use super::common::{
    eventually_within, fast_options, free_port, get, install_crypto, kubelet_node, readyz,
    set_ready,
};

const PATIENCE: Duration = Duration::from_secs(20);

pub struct Running {
    pub probe: SocketAddr,
    pub admin: SocketAddr,
    pub cancel: CancellationToken,
    pub task: tokio::task::JoinHandle<Result<(), agent::run::RunError>>,
}

impl Running {
    /// Cancels and requires the daemon to return within 5 s.
    pub async fn stop(self) {
        self.cancel.cancel();
        tokio::time::timeout(Duration::from_secs(5), self.task)
            .await
            .expect("the agent stops within 5 s of cancellation")
            .unwrap()
            .unwrap();
    }
}

/// Starts the daemon in-process with `extra` YAML appended to a minimal config.
pub async fn start(server: &ApiServer, node: &str, extra: &str) -> Running {
    let probe = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let text = format!(
        "nodeName: {node}\nhealth: {{listen: '{probe}'}}\nadmin: {{listen: '{admin}'}}\n{extra}"
    );
    let config = agent::AgentConfig::parse(&text, Path::new("test.yaml")).unwrap();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(agent::run::run_with_client(
        config,
        server.client(),
        fast_options(),
        cancel.clone(),
    ));
    eventually_within("the probe listener answers", PATIENCE, async || {
        get(probe, "/healthz").await.is_ok()
    })
    .await;
    Running {
        probe,
        admin,
        cancel,
        task,
    }
}

pub async fn wait_ready(addr: SocketAddr, code: u16, what: &str) -> String {
    let mut body = String::new();
    eventually_within(what, PATIENCE, async || {
        let (c, b) = readyz(addr).await;
        body = b;
        c == code
    })
    .await;
    body
}

#[tokio::test]
async fn readiness_follows_the_node_ready_condition() {
    install_crypto();
    let server = ApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(server.client());
    let agent = start(&server, "worker-7", "dataPlane: {check: none}\n").await;

    // No Node yet: not ready, and the liveness answer is constant.
    let (code, not_ready_body) = readyz(agent.probe).await;
    assert_eq!(code, 503);
    let (hc, healthz_body) = get(agent.probe, "/healthz").await.unwrap();
    assert_eq!(hc, 200);

    // The Node registers NotReady: still 503.
    let mut node = kubelet_node("worker-7", 7);
    node.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "False".into();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(readyz(agent.probe).await, (503, not_ready_body.clone()));

    // Ready=True: 200.
    set_ready(&nodes, "worker-7", "True").await;
    let ready_body = wait_ready(agent.probe, 200, "ready once the Node is Ready").await;

    let (mc, metrics) = get(agent.admin, "/metrics").await.unwrap();
    assert_eq!(mc, 200);
    assert!(
        metrics.contains("outpost_agent_condition{condition=\"registered\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("outpost_agent_condition{condition=\"ready\"} 1"),
        "{metrics}"
    );
    let (_, status) = get(agent.admin, "/status").await.unwrap();
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["registered"], true);
    assert_eq!(status["node"], "worker-7");

    // NotReady again: 503 with the same body as before.
    set_ready(&nodes, "worker-7", "False").await;
    assert_eq!(
        wait_ready(agent.probe, 503, "not ready once the Node is NotReady").await,
        not_ready_body
    );
    set_ready(&nodes, "worker-7", "True").await;
    assert_eq!(
        wait_ready(agent.probe, 200, "ready again").await,
        ready_body
    );
    // Deleted: 503.
    nodes.delete("worker-7", &Default::default()).await.unwrap();
    assert_eq!(
        wait_ready(agent.probe, 503, "not ready once the Node is gone").await,
        not_ready_body
    );
    assert_eq!(
        get(agent.probe, "/healthz").await.unwrap(),
        (200, healthz_body)
    );
    // The probe listener serves its two routes and nothing else.
    assert_eq!(get(agent.probe, "/metrics").await.unwrap().0, 404);

    agent.stop().await;
}
