//! `testkube kubelet`: the stub kubelet as a process that also plays the kubelet's part
//! towards the API server, for the sandbox's workers (which have no real kubelet).
//!
//! It registers its Node (InternalIP, the kubelet port as daemon endpoint, `Ready=True`),
//! serves the [`StubKubelet`](crate::kubelet::StubKubelet) routes on its listen address,
//! and renews the Ready condition's heartbeat like a kubelet's node status update. It
//! writes only the Ready condition after registering: the addresses belong to whoever
//! reconciles them (the node-address reconciler). On shutdown it marks the node
//! `Ready=Unknown`, as the node lifecycle controller would once the heartbeats stop.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::kubelet::StubKubelet;

/// How often the Ready condition's heartbeat is renewed (the kubelet's
/// `nodeStatusReportFrequency` floor is of this order).
pub const HEARTBEAT: Duration = Duration::from_secs(10);

/// What `testkube kubelet` runs.
#[derive(Debug, Clone)]
pub struct KubeletOptions {
    /// The Node this stub plays the kubelet of.
    pub node: String,
    /// Where the kubelet API listens; its port is the Node's daemon endpoint.
    pub listen: SocketAddr,
    /// The Node's InternalIP (default: the listen address's IP).
    pub internal_ip: Option<IpAddr>,
}

fn ready_condition(status: &str, reason: &str, message: &str) -> serde_json::Value {
    let now = crate::times::format_secs(jiff::Timestamp::now());
    json!({
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    })
}

async fn set_ready(nodes: &Api<Node>, name: &str, status: &str, reason: &str) -> kube::Result<()> {
    let patch =
        json!({"status": {"conditions": [ready_condition(status, reason, "stub kubelet")]}});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .map(|_| ())
}

/// Registers the Node (or takes over an existing one), serves the stub kubelet, and keeps
/// the heartbeat until `stop` is cancelled.
pub async fn serve_kubelet(
    client: kube::Client,
    opts: KubeletOptions,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let kubelet = StubKubelet::builder()
        .name(opts.node.clone())
        .start(opts.listen)
        .await?;
    let port = kubelet.addr().port();
    let ip = opts.internal_ip.unwrap_or(opts.listen.ip());
    let nodes: Api<Node> = Api::all(client);
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": opts.node, "labels": {"kubernetes.io/hostname": opts.node}},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": ip.to_string()},
                {"type": "Hostname", "address": opts.node},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
            "conditions": [ready_condition("True", "KubeletReady", "stub kubelet")],
        },
    }))?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => eprintln!("testkube kubelet: registered node {}", opts.node),
        Err(kube::Error::Api(e)) if e.code == 409 => eprintln!(
            "testkube kubelet: node {} exists: taking over its heartbeat",
            opts.node
        ),
        Err(e) => return Err(e).with_context(|| format!("registering node {}", opts.node)),
    }
    println!(
        "testkube kubelet: node {} served on {}; Ctrl-C stops it",
        opts.node,
        kubelet.addr()
    );
    loop {
        if let Err(e) = set_ready(&nodes, &opts.node, "True", "KubeletReady").await {
            eprintln!(
                "testkube kubelet: heartbeat of {} failed ({e}); retrying",
                opts.node
            );
        }
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(HEARTBEAT) => {}
        }
    }
    if let Err(e) = set_ready(&nodes, &opts.node, "Unknown", "KubeletStopped").await {
        eprintln!(
            "testkube kubelet: could not mark {} stopped: {e}",
            opts.node
        );
    }
    kubelet.shutdown().await;
    Ok(())
}
