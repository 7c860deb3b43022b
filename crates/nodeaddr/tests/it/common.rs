//! Shared helpers: nodes shaped like a kubelet registers them, and polling.

use std::time::Duration;

use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use nodeaddr::{RUNTIME_LABEL, RUNTIME_VIRTUAL};

pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A node as its kubelet registers it: a LAN InternalIP, its hostname, port 10250.
pub fn kubelet_node(name: &str, lan_octet: u8) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        status: Some(NodeStatus {
            addresses: Some(kubelet_addresses(name, lan_octet)),
            daemon_endpoints: Some(NodeDaemonEndpoints {
                kubelet_endpoint: Some(DaemonEndpoint { port: 10250 }),
            }),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// What a kubelet status write carries: its own view, no ExternalIP.
pub fn kubelet_addresses(name: &str, lan_octet: u8) -> Vec<NodeAddress> {
    vec![
        NodeAddress {
            type_: "InternalIP".into(),
            // TEST-NET-1: never routed, and the API double refuses to dial it anyway.
            address: format!("192.0.2.{lan_octet}"),
        },
        NodeAddress {
            type_: "Hostname".into(),
            address: name.into(),
        },
    ]
}

pub fn virtual_node(name: &str) -> Node {
    let mut n = kubelet_node(name, 250);
    n.metadata.labels = Some([(RUNTIME_LABEL.to_string(), RUNTIME_VIRTUAL.to_string())].into());
    n
}

pub async fn create_nodes(api: &Api<Node>, nodes: impl IntoIterator<Item = Node>) {
    for n in nodes {
        api.create(&PostParams::default(), &n).await.unwrap();
    }
}

/// Plays a kubelet status write: re-reads the node and stores its self-reported
/// addresses, which drops the ExternalIP the reconciler set.
pub async fn kubelet_status_write(api: &Api<Node>, name: &str, lan_octet: u8) {
    for _ in 0..10 {
        let mut n = api.get(name).await.unwrap();
        n.status.as_mut().unwrap().addresses = Some(kubelet_addresses(name, lan_octet));
        match api.replace_status(name, &PostParams::default(), &n).await {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => panic!("kubelet status write for {name}: {e}"),
        }
    }
    panic!("kubelet status write for {name} kept conflicting");
}

/// Polls `check` every 50 ms until it holds or `timeout` passes.
pub async fn eventually<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether every routed node of the cluster carries what diagnostics expects.
pub async fn all_patched(r: &nodeaddr::Reconciler) -> bool {
    match r.diagnostics().await {
        Ok(rows) => rows.iter().all(|d| d.skipped.is_some() || d.patched),
        Err(_) => false,
    }
}
