//! Test helpers the project's test suites share: polling with a deadline, nodes shaped
//! the way a kubelet registers them, tool-on-PATH checks that fail naming the package,
//! and the rustls crypto provider install. For tests only; nothing here is used by the
//! double itself at runtime.

use std::future::Future;
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    Taint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// How long [`eventually`] waits by default: generous, for a loaded 2-core machine.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Installs ring as the process-wide rustls crypto provider (idempotent; a second
/// install is ignored).
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Polls `check` every 50 ms until it holds; panics naming `what` after `timeout`.
pub async fn eventually_within<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// [`eventually_within`] with [`PATIENCE`].
pub async fn eventually<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_within(what, PATIENCE, check).await;
}

/// Panics unless `tool` is on PATH, naming the Debian `package` that provides it.
pub fn require_tool(tool: &str, package: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v '{tool}'")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(found, "{tool} not found on PATH: apt-get install {package}");
}

/// What a kubelet reports as its addresses: a TEST-NET-1 InternalIP (never routed)
/// `192.0.2.<lan_octet>` and its hostname.
pub fn kubelet_addresses(name: &str, lan_octet: u8) -> Vec<NodeAddress> {
    vec![
        NodeAddress {
            type_: "InternalIP".into(),
            address: format!("192.0.2.{lan_octet}"),
        },
        NodeAddress {
            type_: "Hostname".into(),
            address: name.into(),
        },
    ]
}

/// A Ready node as its kubelet registers it: [`kubelet_addresses`] and port 10250.
pub fn kubelet_node(name: &str, lan_octet: u8) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            addresses: Some(kubelet_addresses(name, lan_octet)),
            daemon_endpoints: Some(NodeDaemonEndpoints {
                kubelet_endpoint: Some(DaemonEndpoint { port: 10250 }),
            }),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: Some("KubeletReady".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

/// [`kubelet_node`] with labels and taints.
pub fn kubelet_node_with(
    name: &str,
    lan_octet: u8,
    labels: &[(&str, &str)],
    taints: &[(&str, &str, &str)],
) -> Node {
    let mut n = kubelet_node(name, lan_octet);
    if !labels.is_empty() {
        n.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
    }
    if !taints.is_empty() {
        n.spec.get_or_insert_default().taints = Some(
            taints
                .iter()
                .map(|(k, v, e)| Taint {
                    key: k.to_string(),
                    value: (!v.is_empty()).then(|| v.to_string()),
                    effect: e.to_string(),
                    time_added: None,
                })
                .collect(),
        );
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn eventually_returns_once_the_condition_holds() {
        let mut n = 0;
        eventually("the third poll", || {
            n += 1;
            let done = n >= 3;
            async move { done }
        })
        .await;
        assert_eq!(n, 3);
    }

    #[test]
    #[should_panic(expected = "apt-get install no-such-package")]
    fn a_missing_tool_names_its_package() {
        require_tool("no-such-tool-testkube", "no-such-package");
    }

    #[test]
    fn kubelet_nodes_are_ready_and_carry_taints() {
        let n = kubelet_node_with("n", 7, &[("zone", "a")], &[("k", "", "NoSchedule")]);
        let st = n.status.unwrap();
        assert_eq!(st.conditions.unwrap()[0].status, "True");
        assert_eq!(st.addresses.unwrap()[0].address, "192.0.2.7");
        assert_eq!(n.spec.unwrap().taints.unwrap()[0].value, None);
        assert_eq!(n.metadata.labels.unwrap()["zone"], "a");
    }
}
