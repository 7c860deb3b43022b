//! Placement: a pod carrying the placement gate gets the first candidate provider the
//! blocklist does not hold — a nodeSelector on the provider label, a toleration for the
//! provider taint and the capacity-type annotation — and loses the gate, all in one patch.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::blocklist::Blocklist;
use crate::claim::pod_key;
use crate::metrics::Metrics;
use crate::provider::BlockScope;

/// Pod condition reason when no candidate provider is left.
pub const REASON_NO_PROVIDER: &str = "NoProviderAvailable";

/// A provider placement may choose, with its capacity types in order of preference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Provider name.
    pub name: String,
    /// Capacity types it sells.
    pub capacity_types: Vec<String>,
}

/// The decision for one gated pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Place on this provider with this capacity type.
    Place {
        /// Provider.
        provider: String,
        /// Capacity type.
        capacity_type: String,
    },
    /// Every candidate is blocked or unknown.
    NoCandidate {
        /// Why, for the pod condition.
        message: String,
    },
}

/// The candidate list of a pod: its `providers` annotation in order, else every provider
/// this manager runs.
pub fn candidates_of(pod: &Pod, known: &[Candidate]) -> Vec<String> {
    match pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(common::keys::PROVIDERS_ANNOTATION))
    {
        Some(list) => list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect(),
        None => known.iter().map(|c| c.name.clone()).collect(),
    }
}

/// Chooses a provider for a gated pod (pure).
pub fn decide(pod: &Pod, known: &[Candidate], blocklist: &Blocklist) -> Decision {
    let wanted = candidates_of(pod, known);
    let mut skipped = Vec::new();
    for name in &wanted {
        let Some(c) = known.iter().find(|c| &c.name == name) else {
            skipped.push(format!("{name} (not run by this manager)"));
            continue;
        };
        let ct = c
            .capacity_types
            .iter()
            .find(|ct| !blocklist.is_blocked(name, &BlockScope::CapacityType((*ct).clone())));
        match ct {
            Some(ct) => {
                return Decision::Place {
                    provider: name.clone(),
                    capacity_type: ct.clone(),
                };
            }
            None => skipped.push(format!("{name} (refused recently)")),
        }
    }
    Decision::NoCandidate {
        message: if wanted.is_empty() {
            "the pod names no candidate provider".to_string()
        } else {
            format!("no candidate provider is available: {}", skipped.join(", "))
        },
    }
}

/// The one patch that places a gated pod (pure): gate removed, nodeSelector and toleration
/// for the provider, capacity-type annotation; carries the resourceVersion it read.
pub fn placement_patch(pod: &Pod, provider: &str, capacity_type: &str) -> Value {
    let spec = pod.spec.clone().unwrap_or_default();
    let gates: Vec<Value> = spec
        .scheduling_gates
        .iter()
        .flatten()
        .filter(|g| g.name != common::keys::PLACEMENT_GATE)
        .map(|g| json!({"name": g.name}))
        .collect();
    let mut tolerations: Vec<Value> = spec
        .tolerations
        .iter()
        .flatten()
        .filter_map(|t| serde_json::to_value(t).ok())
        .collect();
    tolerations.push(json!({
        "key": common::keys::PROVIDER_TAINT, "operator": "Equal", "value": provider, "effect": "NoSchedule",
    }));
    json!({
        "metadata": {
            "resourceVersion": pod.metadata.resource_version,
            "annotations": {common::keys::CAPACITY_TYPE_ANNOTATION: capacity_type},
        },
        "spec": {
            "schedulingGates": gates,
            "nodeSelector": {common::keys::PROVIDER_LABEL: provider},
            "tolerations": tolerations,
        },
    })
}

fn has_gate(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.name == common::keys::PLACEMENT_GATE))
}

fn no_candidate_condition_set(pod: &Pod, message: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.type_ == "PodScheduled"
                    && c.reason.as_deref() == Some(REASON_NO_PROVIDER)
                    && c.message.as_deref() == Some(message)
            })
        })
}

/// Runs placement for the pods of every namespace until `cancel` fires.
pub async fn run_placement(
    client: Client,
    known: Vec<Candidate>,
    blocklist: Arc<Blocklist>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let api: Api<Pod> = Api::all(client.clone());
    let mut stream =
        std::pin::pin!(watcher::watcher(api, watcher::Config::default()).default_backoff());
    let (retry_tx, mut retry_rx) = tokio::sync::mpsc::unbounded_channel::<Pod>();
    loop {
        let pod = tokio::select! {
            _ = cancel.cancelled() => return,
            Some(pod) = retry_rx.recv() => pod,
            ev = stream.next() => match ev {
                Some(Ok(Event::Apply(pod) | Event::InitApply(pod))) => pod,
                Some(Ok(_)) => continue,
                Some(Err(e)) => { warn!(error = %e, "placement watch failed; retrying"); continue }
                None => return,
            },
        };
        if !has_gate(&pod) || pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let pods: Api<Pod> = Api::namespaced(
            client.clone(),
            pod.metadata.namespace.as_deref().unwrap_or("default"),
        );
        let name = pod.metadata.name.clone().unwrap_or_default();
        match decide(&pod, &known, &blocklist) {
            Decision::Place {
                provider,
                capacity_type,
            } => {
                let patch = placement_patch(&pod, &provider, &capacity_type);
                match pods
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {
                        Metrics::inc(&metrics.placements);
                        info!(pod = %pod_key(&pod), %provider, %capacity_type, "pod placed");
                    }
                    // A newer version is on its way through the watch.
                    Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
                    Err(e) => {
                        warn!(pod = %pod_key(&pod), error = %e, "placing the pod failed; retrying")
                    }
                }
            }
            Decision::NoCandidate { message } => {
                if !no_candidate_condition_set(&pod, &message) {
                    let patch = json!({
                        "metadata": {"resourceVersion": pod.metadata.resource_version},
                        "status": {"conditions": [{
                            "type": "PodScheduled", "status": "False",
                            "reason": REASON_NO_PROVIDER, "message": message,
                            "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
                        }]},
                    });
                    if let Err(e) = pods
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        warn!(pod = %pod_key(&pod), error = %e, "writing the no-candidate condition failed");
                    } else {
                        info!(pod = %pod_key(&pod), %message, "no candidate provider left");
                    }
                }
                // Try again when the earliest block ends, not in a loop.
                if let Some(at) = blocklist.next_expiry() {
                    let tx = retry_tx.clone();
                    let cancel = cancel.clone();
                    tokio::spawn(async move {
                        tokio::select! {
                            _ = cancel.cancelled() => {}
                            _ = tokio::time::sleep_until(at + Duration::from_millis(10)) => {
                                let _ = tx.send(pod);
                            }
                        }
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSchedulingGate, PodSpec};

    fn gated(candidates: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.resource_version = Some("5".into());
        if let Some(c) = candidates {
            p.metadata.annotations = Some(
                [(
                    common::keys::PROVIDERS_ANNOTATION.to_string(),
                    c.to_string(),
                )]
                .into(),
            );
        }
        p.spec = Some(PodSpec {
            scheduling_gates: Some(vec![
                PodSchedulingGate {
                    name: common::keys::PLACEMENT_GATE.into(),
                },
                PodSchedulingGate {
                    name: "other".into(),
                },
            ]),
            ..PodSpec::default()
        });
        p
    }

    fn known() -> Vec<Candidate> {
        ["a", "b"]
            .iter()
            .map(|n| Candidate {
                name: n.to_string(),
                capacity_types: vec!["spot".into(), "on-demand".into()],
            })
            .collect()
    }

    #[test]
    fn first_unblocked_candidate_and_capacity_type() {
        let b = Blocklist::new();
        let p = gated(Some("zz, b ,a"));
        assert_eq!(
            decide(&p, &known(), &b),
            Decision::Place {
                provider: "b".into(),
                capacity_type: "spot".into()
            }
        );
        b.record(
            "b",
            BlockScope::CapacityType("spot".into()),
            Duration::from_secs(60),
        );
        assert_eq!(
            decide(&p, &known(), &b),
            Decision::Place {
                provider: "b".into(),
                capacity_type: "on-demand".into()
            }
        );
        b.record("b", BlockScope::Provider, Duration::from_secs(60));
        assert_eq!(
            decide(&p, &known(), &b),
            Decision::Place {
                provider: "a".into(),
                capacity_type: "spot".into()
            }
        );
        b.record("a", BlockScope::Provider, Duration::from_secs(60));
        assert!(matches!(
            decide(&p, &known(), &b),
            Decision::NoCandidate { .. }
        ));
    }

    #[test]
    fn the_patch_removes_only_our_gate() {
        let p = gated(None);
        let patch = placement_patch(&p, "a", "spot");
        assert_eq!(patch["spec"]["schedulingGates"], json!([{"name": "other"}]));
        assert_eq!(
            patch["spec"]["nodeSelector"][common::keys::PROVIDER_LABEL],
            "a"
        );
        assert_eq!(patch["spec"]["tolerations"][0]["value"], "a");
        assert_eq!(
            patch["metadata"]["annotations"][common::keys::CAPACITY_TYPE_ANNOTATION],
            "spot"
        );
        assert_eq!(patch["metadata"]["resourceVersion"], "5");
    }
}
