//! The node controller: registers one provider's virtual node and keeps its Ready
//! condition and node Lease current while the provider is healthy.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::provider::Provider;

/// Namespace of node Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// Node Lease duration.
pub const NODE_LEASE_SECONDS: i32 = 40;
/// How often the lease is renewed and the provider's health checked.
pub const NODE_RENEW_PERIOD: Duration = Duration::from_secs(10);

/// How the node is advertised.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeAdvert {
    /// The manager's Pod IP (`POD_IP`); `None` = no address, so `kubectl logs` reports
    /// the kubelet unreachable at once instead of timing out against a wrong one.
    pub pod_ip: Option<String>,
    /// The kubelet API listener's port (daemon endpoint).
    pub kubelet_port: u16,
}

/// Errors of the node controller.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// An API call failed.
    #[error("{what} of node {node}")]
    Api {
        /// What was attempted.
        what: &'static str,
        /// The node.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

fn ready_condition(healthy: bool, reason_msg: &str, now: &Time) -> NodeCondition {
    NodeCondition {
        type_: "Ready".into(),
        status: if healthy { "True" } else { "False" }.into(),
        reason: Some(
            if healthy {
                "ProviderReady"
            } else {
                "ProviderUnhealthy"
            }
            .into(),
        ),
        message: Some(reason_msg.to_string()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    }
}

/// The Node object for `provider` (pure).
pub fn desired_node(provider: &dyn Provider, advert: &NodeAdvert, healthy: bool) -> Node {
    let name = common::keys::virtual_node_name(provider.name());
    let caps = provider.capabilities();
    let capacity: BTreeMap<String, Quantity> = caps
        .capacity
        .iter()
        .map(|(k, v)| (k.clone(), Quantity(v.clone())))
        .collect();
    let labels: BTreeMap<String, String> = [
        (
            common::keys::RUNTIME_LABEL,
            common::keys::RUNTIME_VIRTUAL.to_string(),
        ),
        (common::keys::PROVIDER_LABEL, provider.name().to_string()),
        ("kubernetes.io/role", "agent".to_string()),
        ("kubernetes.io/hostname", name.clone()),
        ("type", "virtual-kubelet".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let now = Time(Timestamp::now());
    Node {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            taints: Some(vec![Taint {
                key: common::keys::PROVIDER_TAINT.into(),
                value: Some(provider.name().to_string()),
                effect: "NoSchedule".into(),
                time_added: None,
            }]),
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            allocatable: Some(capacity.clone()),
            capacity: Some(capacity),
            // Only the IP: the node's name resolves nowhere, and kube-apiserver's default
            // address preference puts Hostname first, so advertising it would send the
            // kubelet proxy (logs, exec) to a name no DNS knows.
            addresses: advert.pod_ip.as_ref().map(|ip| {
                vec![NodeAddress {
                    type_: "InternalIP".into(),
                    address: ip.clone(),
                }]
            }),
            daemon_endpoints: Some(NodeDaemonEndpoints {
                kubelet_endpoint: Some(DaemonEndpoint {
                    port: i32::from(advert.kubelet_port),
                }),
            }),
            conditions: Some(vec![ready_condition(
                healthy,
                if healthy {
                    "the provider answers"
                } else {
                    "the provider's health check fails"
                },
                &now,
            )]),
            node_info: Some(NodeSystemInfo {
                architecture: std::env::consts::ARCH.into(),
                operating_system: "linux".into(),
                kubelet_version: concat!("v1.33.0-nebula-", env!("CARGO_PKG_VERSION")).into(),
                kernel_version: String::new(),
                os_image: String::new(),
                container_runtime_version: format!("nebula://{}", provider.name()),
                kube_proxy_version: String::new(),
                machine_id: String::new(),
                system_uuid: String::new(),
                boot_id: String::new(),
                ..NodeSystemInfo::default()
            }),
            ..NodeStatus::default()
        }),
    }
}

fn ready_of(node: &Node) -> Option<bool> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status == "True")
}

/// What of the stored node differs from the wanted one (labels, taints, addresses,
/// capacity, daemon endpoint, Ready): `(spec_or_labels, status)`.
fn drift(have: &Node, want: &Node) -> (bool, bool) {
    let labels_ok = want
        .metadata
        .labels
        .iter()
        .flatten()
        .all(|(k, v)| have.metadata.labels.as_ref().and_then(|l| l.get(k)) == Some(v));
    let taints_ok = have.spec.as_ref().and_then(|s| s.taints.clone())
        == want.spec.as_ref().and_then(|s| s.taints.clone());
    let (hs, ws) = (
        have.status.clone().unwrap_or_default(),
        want.status.clone().unwrap_or_default(),
    );
    let status_ok = hs.addresses == ws.addresses
        && hs.capacity == ws.capacity
        && hs.daemon_endpoints == ws.daemon_endpoints
        && ready_of(have) == ready_of(want);
    (!(labels_ok && taints_ok), !status_ok)
}

/// Keeps one provider's node registered: creates it, corrects drift, writes Ready on each
/// health transition, renews the node Lease every [`NODE_RENEW_PERIOD`] while healthy.
/// Returns when `cancel` fires.
pub async fn run_node(
    client: Client,
    provider: Arc<dyn Provider>,
    advert: NodeAdvert,
    cancel: CancellationToken,
) -> Result<(), NodeError> {
    let name = common::keys::virtual_node_name(provider.name());
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client, NODE_LEASE_NAMESPACE);
    let mut tick = tokio::time::interval(NODE_RENEW_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            _ = tick.tick() => {}
        }
        let health = provider.health().await;
        let healthy = health.is_ok();
        if let Err(e) = &health {
            warn!(node = %name, error = %e, "provider health check fails: Ready and the node lease are withheld");
        }
        if let Err(e) = sync_node(&nodes, provider.as_ref(), &advert, healthy).await {
            warn!(node = %name, error = %crate::chain(&e), "node sync failed; retrying");
            continue;
        }
        if healthy && let Err(e) = renew_lease(&leases, &nodes, &name).await {
            warn!(node = %name, error = %crate::chain(&e), "node lease renewal failed; retrying");
        }
    }
}

/// Creates or corrects the node; writes nothing when it already matches.
pub async fn sync_node(
    nodes: &Api<Node>,
    provider: &dyn Provider,
    advert: &NodeAdvert,
    healthy: bool,
) -> Result<(), NodeError> {
    let want = desired_node(provider, advert, healthy);
    let name = want.metadata.name.clone().unwrap_or_default();
    let api = |what: &'static str| {
        let node = name.clone();
        move |source| NodeError::Api { what, node, source }
    };
    let Some(have) = nodes.get_opt(&name).await.map_err(api("read"))? else {
        nodes
            .create(&PostParams::default(), &want)
            .await
            .map_err(api("create"))?;
        info!(node = %name, "virtual node registered");
        return Ok(());
    };
    let (meta_drift, status_drift) = drift(&have, &want);
    if meta_drift {
        let patch = json!({
            "metadata": {"resourceVersion": have.metadata.resource_version, "labels": want.metadata.labels},
            "spec": {"taints": want.spec.as_ref().and_then(|s| s.taints.clone())},
        });
        nodes
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(api("update"))?;
    }
    if status_drift {
        let fresh = nodes.get(&name).await.map_err(api("read"))?;
        let mut status = want.status.clone().unwrap_or_default();
        // Keep the Ready transition time when Ready did not change.
        if ready_of(&fresh) == ready_of(&want)
            && let Some(old) = fresh
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            && let Some(c) = status.conditions.as_mut().and_then(|cs| cs.first_mut())
        {
            c.last_transition_time = old.last_transition_time.clone();
        }
        let patch = json!({
            "metadata": {"resourceVersion": fresh.metadata.resource_version},
            "status": {
                "addresses": status.addresses,
                "capacity": status.capacity,
                "allocatable": status.allocatable,
                "daemonEndpoints": status.daemon_endpoints,
                "conditions": status.conditions,
                "nodeInfo": status.node_info,
            },
        });
        nodes
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(api("status update"))?;
        info!(node = %name, ready = healthy, "virtual node status written");
    }
    Ok(())
}

/// Renews (or creates) the node's Lease in kube-node-lease, with the resourceVersion read.
/// A created Lease is owned by its Node (as the kubelet's is), so deleting the Node lets
/// garbage collection remove the Lease.
pub async fn renew_lease(
    leases: &Api<Lease>,
    nodes: &Api<Node>,
    node: &str,
) -> Result<(), NodeError> {
    let api = |what: &'static str| {
        let node = node.to_string();
        move |source| NodeError::Api { what, node, source }
    };
    let now = MicroTime(Timestamp::now());
    match leases.get_opt(node).await.map_err(api("lease read"))? {
        Some(mut lease) => {
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            spec.holder_identity = Some(node.to_string());
            spec.lease_duration_seconds = Some(NODE_LEASE_SECONDS);
            spec.renew_time = Some(now);
            leases
                .replace(node, &PostParams::default(), &lease)
                .await
                .map_err(api("lease renewal"))?;
        }
        None => {
            let owner = nodes
                .get_opt(node)
                .await
                .map_err(api("node read"))?
                .and_then(|n| n.metadata.uid)
                .map(|uid| {
                    vec![
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                            api_version: "v1".into(),
                            kind: "Node".into(),
                            name: node.to_string(),
                            uid,
                            ..Default::default()
                        },
                    ]
                });
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(node.to_string()),
                    namespace: Some(NODE_LEASE_NAMESPACE.to_string()),
                    owner_references: owner,
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(node.to_string()),
                    lease_duration_seconds: Some(NODE_LEASE_SECONDS),
                    renew_time: Some(now),
                    ..LeaseSpec::default()
                }),
            };
            leases
                .create(&PostParams::default(), &lease)
                .await
                .map_err(api("lease create"))?;
        }
    }
    Ok(())
}
