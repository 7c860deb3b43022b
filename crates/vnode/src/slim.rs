//! The pod controller's forms of a pod.
//!
//! - [`SlimPod`]: what the watch decodes, only the fields the controller reads (serde
//!   skips every other one, so no whole `k8s_openapi` `Pod` is ever built from the watch).
//! - [`PodRecord`]: what the controller keeps per tracked pod in its [`PodStore`], built
//!   from a `SlimPod` and a few hundred bytes: the identity and version, this crate's
//!   annotations, the first container's name and image (and, until the pod has an
//!   instance, what provisioning needs), and a [`SlimStatus`] holding exactly what the
//!   status comparison reads and what a status write carries over.
//!
//! A `Pod` is built from a record only where a function written against `Pod` needs one
//! (a reconcile, a write): never per pod per notify tick.

use std::borrow::{Borrow, Cow};
use std::collections::{BTreeMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, EnvVar, Pod, PodCondition, PodSpec, PodStatus,
    Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::core::NamespaceResourceScope;
use serde::Deserialize;

use crate::compact::{ClaimKey, SmallStr, Uid};
use crate::status::OWNED_CONDITIONS;

/// A pod as the watch decodes it.
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct SlimPod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<SlimSpec>,
    #[serde(default)]
    pub status: Option<PodStatus>,
}

/// The parts of a pod's spec the controller reads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SlimSpec {
    #[serde(default)]
    pub containers: Vec<SlimContainer>,
    /// Read for the mutable-fields fingerprint, and enforced by the pod controller.
    #[serde(default)]
    pub active_deadline_seconds: Option<i64>,
    /// Read for the mutable-fields fingerprint only.
    #[serde(default)]
    pub tolerations: Option<Vec<Toleration>>,
}

/// The first container's shape (what a provision request carries).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SlimContainer {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub command: Option<Vec<String>>,
    #[serde(default)]
    pub args: Option<Vec<String>>,
    #[serde(default)]
    pub env: Option<Vec<EnvVar>>,
    #[serde(default)]
    pub working_dir: Option<String>,
    /// The provider keeps a stdin open for these (attach -i).
    #[serde(default)]
    pub stdin: Option<bool>,
    /// The provider runs these on a terminal (attach -t, exec resize).
    #[serde(default)]
    pub tty: Option<bool>,
}

impl kube::Resource for SlimPod {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("Pod")
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("")
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("pods")
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// What the controller keeps of a tracked pod.
#[derive(Clone, Debug)]
pub(crate) struct PodRecord {
    /// `namespace/name` ([`crate::claim::pod_key`]): the store's and the work queue's key.
    key: Box<str>,
    uid: Option<Uid>,
    /// The claim, computed once (`None` without a UID).
    claim: Option<ClaimKey>,
    resource_version: Option<SmallStr>,
    deletion_timestamp: Option<Time>,
    instance_id: Option<SmallStr>,
    endpoint: Option<SmallStr>,
    capacity_type: Option<SmallStr>,
    applied_spec: Option<SmallStr>,
    /// The fingerprint of the pod's mutable fields ([`crate::claim::pod_spec_fingerprint`]),
    /// computed while decoding, before the labels and annotations it covers are dropped.
    desired_spec: Option<SmallStr>,
    /// The first container's name and image; `None` without a container.
    container: Option<(SmallStr, Option<SmallStr>)>,
    /// `spec.activeDeadlineSeconds`.
    active_deadline_seconds: Option<i64>,
    /// The rest of the first container's shape, kept only while the pod has no instance
    /// (nothing is provisioned for a pod that names one).
    shape: Option<Box<Shape>>,
    status: Option<Box<SlimStatus>>,
}

/// What provisioning reads of the first container besides its name and image.
#[derive(Clone, Debug, Default)]
struct Shape {
    command: Option<Vec<String>>,
    args: Option<Vec<String>>,
    env: Option<Vec<EnvVar>>,
    working_dir: Option<String>,
    stdin: Option<bool>,
    tty: Option<bool>,
}

impl PodRecord {
    /// The record of a decoded pod.
    pub fn new(pod: SlimPod) -> PodRecord {
        let SlimPod {
            metadata: meta,
            spec,
            status,
        } = pod;
        let namespace = meta.namespace.as_deref().unwrap_or("default");
        let name = meta.name.as_deref().unwrap_or("");
        let claim = meta
            .uid
            .as_deref()
            .filter(|u| !u.is_empty())
            .map(|uid| ClaimKey::Hash(crate::claim::claim_hash(namespace, name, uid)));
        let first = spec.as_ref().and_then(|s| s.containers.first());
        let desired_spec = match (&claim, &spec, first) {
            (Some(claim), Some(spec), Some(c)) => {
                let req = crate::claim::update_request_of(
                    claim.to_string(),
                    &meta,
                    c.image.as_deref(),
                    spec.active_deadline_seconds,
                    spec.tolerations.as_deref(),
                );
                Some(SmallStr::from(crate::claim::spec_fingerprint(&req)))
            }
            _ => None,
        };
        let ann = |k: &str| {
            meta.annotations
                .as_ref()
                .and_then(|a| a.get(k))
                .map(|v| SmallStr::new(v))
        };
        let instance_id = ann(common::keys::INSTANCE_ID_ANNOTATION);
        let container = first.map(|c| {
            (
                SmallStr::new(&c.name),
                c.image.as_deref().map(SmallStr::new),
            )
        });
        let active_deadline_seconds = spec.as_ref().and_then(|s| s.active_deadline_seconds);
        let shape = match spec.and_then(|s| s.containers.into_iter().next()) {
            Some(c) if instance_id.is_none() => Some(Box::new(Shape {
                command: c.command,
                args: c.args,
                env: c.env,
                working_dir: c.working_dir,
                stdin: c.stdin,
                tty: c.tty,
            })),
            _ => None,
        };
        PodRecord {
            key: format!("{namespace}/{name}").into_boxed_str(),
            uid: meta.uid.as_deref().map(Uid::new),
            claim,
            resource_version: meta.resource_version.as_deref().map(SmallStr::new),
            deletion_timestamp: meta.deletion_timestamp.clone(),
            endpoint: ann(common::keys::ENDPOINT_ANNOTATION),
            capacity_type: ann(common::keys::CAPACITY_TYPE_ANNOTATION),
            applied_spec: ann(common::keys::APPLIED_SPEC_ANNOTATION),
            instance_id,
            desired_spec,
            container,
            active_deadline_seconds,
            shape,
            status: status.map(|s| Box::new(SlimStatus::new(s))),
        }
    }

    /// `namespace/name`.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The pod's claim; `None` without a UID.
    pub fn claim(&self) -> Option<&ClaimKey> {
        self.claim.as_ref()
    }

    /// `status.phase`.
    pub fn phase(&self) -> Option<&str> {
        self.status.as_ref().and_then(|s| s.phase.as_deref())
    }

    /// Whether the pod is being deleted.
    pub fn deleting(&self) -> bool {
        self.deletion_timestamp.is_some()
    }

    /// Whether the pod has finished ([`crate::status::is_terminal`]).
    pub fn is_terminal(&self) -> bool {
        matches!(self.phase(), Some("Succeeded" | "Failed"))
    }

    /// The first container's name ("" without one).
    pub fn container_name(&self) -> &str {
        self.container.as_ref().map_or("", |c| c.0.as_str())
    }

    /// The status as stored (`None` when the pod has none).
    pub fn status(&self) -> Option<&SlimStatus> {
        self.status.as_deref()
    }

    /// Whether the pod's annotations differ from what `instance` should show:
    /// exactly when [`crate::status::metadata_patch`] of [`PodRecord::to_pod`] is `Some`.
    pub fn metadata_stale(&self, instance: &crate::provider::Instance) -> bool {
        let id_ok = self.instance_id.as_deref() == Some(instance.id.as_str());
        let endpoint_ok = self.endpoint.as_deref() == instance.endpoint.as_deref();
        !(id_ok && endpoint_ok)
    }

    /// A `Pod` holding what this record holds (the stored annotations, with the
    /// fingerprint of the mutable fields under [`crate::pods::DESIRED_SPEC_KEY`]), for the
    /// functions written against `Pod`. Built per use, dropped after.
    pub fn to_pod(&self) -> Pod {
        let (namespace, name) = self.key.split_once('/').unwrap_or(("default", ""));
        let mut annotations = BTreeMap::new();
        for (k, v) in [
            (common::keys::INSTANCE_ID_ANNOTATION, &self.instance_id),
            (common::keys::ENDPOINT_ANNOTATION, &self.endpoint),
            (common::keys::CAPACITY_TYPE_ANNOTATION, &self.capacity_type),
            (common::keys::APPLIED_SPEC_ANNOTATION, &self.applied_spec),
            (crate::pods::DESIRED_SPEC_KEY, &self.desired_spec),
        ] {
            if let Some(v) = v {
                annotations.insert(k.to_string(), v.to_string());
            }
        }
        let shape = self.shape.as_deref().cloned().unwrap_or_default();
        Pod {
            metadata: ObjectMeta {
                namespace: Some(namespace.to_string()),
                name: Some(name.to_string()),
                uid: self.uid.as_ref().map(Uid::to_string),
                resource_version: self.resource_version.as_ref().map(SmallStr::to_string),
                deletion_timestamp: self.deletion_timestamp.clone(),
                annotations: (!annotations.is_empty()).then_some(annotations),
                ..ObjectMeta::default()
            },
            spec: self.container.as_ref().map(|(name, image)| PodSpec {
                containers: vec![Container {
                    name: name.to_string(),
                    image: image.as_ref().map(SmallStr::to_string),
                    command: shape.command,
                    args: shape.args,
                    env: shape.env,
                    working_dir: shape.working_dir,
                    stdin: shape.stdin,
                    tty: shape.tty,
                    ..Container::default()
                }],
                active_deadline_seconds: self.active_deadline_seconds,
                ..PodSpec::default()
            }),
            status: self.status.as_ref().map(|s| s.to_pod_status()),
        }
    }
}

/// A pod condition status as the comparisons see it: `True`, `False`, or anything else
/// (which matches neither, so it is kept as `Unknown`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CondStatus {
    True,
    False,
    Other,
}

impl CondStatus {
    fn new(s: &str) -> CondStatus {
        match s {
            "True" => CondStatus::True,
            "False" => CondStatus::False,
            _ => CondStatus::Other,
        }
    }

    pub fn of(ok: bool) -> CondStatus {
        if ok {
            CondStatus::True
        } else {
            CondStatus::False
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            CondStatus::True => "True",
            CondStatus::False => "False",
            CondStatus::Other => "Unknown",
        }
    }
}

/// One of the conditions this crate computes ([`OWNED_CONDITIONS`]).
#[derive(Clone, Debug)]
pub(crate) struct OwnedCondition {
    /// Index into [`OWNED_CONDITIONS`].
    pub kind: u8,
    pub status: CondStatus,
    pub last_transition_time: Option<Time>,
}

/// The first container's status as the comparisons see it.
#[derive(Clone, Debug)]
pub(crate) struct SlimContainerStatus {
    pub name: SmallStr,
    pub ready: bool,
    pub restart_count: i32,
    /// `state.waiting`, with its reason.
    pub waiting: Option<Option<SmallStr>>,
    /// `state.running`, with its start.
    pub running: Option<Option<Time>>,
    pub terminated: Option<SlimTerminated>,
}

/// `state.terminated` as the comparisons see it.
#[derive(Clone, Debug)]
pub(crate) struct SlimTerminated {
    pub exit_code: i32,
    pub reason: Option<SmallStr>,
    pub finished_at: Option<Time>,
}

/// What the controller keeps of a pod's status: everything
/// [`crate::status::signature`] reads, and everything [`crate::status::desired_status`]
/// carries over from the old status (transition times, start times, other writers'
/// conditions whole, the QoS class).
#[derive(Clone, Debug, Default)]
pub(crate) struct SlimStatus {
    pub phase: Option<SmallStr>,
    pub reason: Option<SmallStr>,
    pub message: Option<Box<str>>,
    pub pod_ip: Option<SmallStr>,
    pub start_time: Option<Time>,
    pub qos_class: Option<SmallStr>,
    /// This crate's conditions, in their order.
    pub conditions: Box<[OwnedCondition]>,
    /// Other writers' conditions, whole, in their order.
    pub foreign: Box<[PodCondition]>,
    pub containers: Box<[SlimContainerStatus]>,
}

impl SlimStatus {
    pub fn new(s: PodStatus) -> SlimStatus {
        let mut conditions = Vec::new();
        let mut foreign = Vec::new();
        for c in s.conditions.into_iter().flatten() {
            match OWNED_CONDITIONS.iter().position(|t| *t == c.type_) {
                Some(kind) => conditions.push(OwnedCondition {
                    kind: kind as u8,
                    status: CondStatus::new(&c.status),
                    last_transition_time: c.last_transition_time,
                }),
                None => foreign.push(c),
            }
        }
        let containers = s
            .container_statuses
            .into_iter()
            .flatten()
            .map(|c| {
                let state = c.state.unwrap_or_default();
                SlimContainerStatus {
                    name: c.name.into(),
                    ready: c.ready,
                    restart_count: c.restart_count,
                    waiting: state.waiting.map(|w| w.reason.map(SmallStr::from)),
                    running: state.running.map(|r| r.started_at),
                    terminated: state.terminated.map(|t| SlimTerminated {
                        exit_code: t.exit_code,
                        reason: t.reason.map(SmallStr::from),
                        finished_at: t.finished_at,
                    }),
                }
            })
            .collect();
        SlimStatus {
            phase: s.phase.map(SmallStr::from),
            reason: s.reason.map(SmallStr::from),
            message: s.message.map(String::into_boxed_str),
            pod_ip: s.pod_ip.map(SmallStr::from),
            start_time: s.start_time,
            qos_class: s.qos_class.map(SmallStr::from),
            conditions: conditions.into_boxed_slice(),
            foreign: foreign.into_boxed_slice(),
            containers,
        }
    }

    /// A `PodStatus` with what this one holds (owned conditions first, then the others).
    pub fn to_pod_status(&self) -> PodStatus {
        let owned = self.conditions.iter().map(|c| PodCondition {
            type_: OWNED_CONDITIONS[usize::from(c.kind)].to_string(),
            status: c.status.as_str().to_string(),
            last_transition_time: c.last_transition_time.clone(),
            ..PodCondition::default()
        });
        let conditions: Vec<PodCondition> = owned.chain(self.foreign.iter().cloned()).collect();
        let containers: Vec<ContainerStatus> = self
            .containers
            .iter()
            .map(|c| ContainerStatus {
                name: c.name.to_string(),
                ready: c.ready,
                restart_count: c.restart_count,
                state: Some(ContainerState {
                    waiting: c.waiting.as_ref().map(|r| ContainerStateWaiting {
                        reason: r.as_ref().map(SmallStr::to_string),
                        message: None,
                    }),
                    running: c.running.as_ref().map(|s| ContainerStateRunning {
                        started_at: s.clone(),
                    }),
                    terminated: c.terminated.as_ref().map(|t| ContainerStateTerminated {
                        exit_code: t.exit_code,
                        reason: t.reason.as_ref().map(SmallStr::to_string),
                        finished_at: t.finished_at.clone(),
                        ..ContainerStateTerminated::default()
                    }),
                }),
                ..ContainerStatus::default()
            })
            .collect();
        PodStatus {
            phase: self.phase.as_ref().map(SmallStr::to_string),
            reason: self.reason.as_ref().map(SmallStr::to_string),
            message: self.message.as_deref().map(str::to_string),
            pod_ip: self.pod_ip.as_ref().map(SmallStr::to_string),
            start_time: self.start_time.clone(),
            qos_class: self.qos_class.as_ref().map(SmallStr::to_string),
            conditions: (!conditions.is_empty()).then_some(conditions),
            container_statuses: (!containers.is_empty()).then_some(containers),
            ..PodStatus::default()
        }
    }
}

/// A stored record, hashed and compared by its key so the set can be asked with a `&str`.
#[derive(Clone)]
struct Stored(Arc<PodRecord>);

impl PartialEq for Stored {
    fn eq(&self, other: &Stored) -> bool {
        self.0.key == other.0.key
    }
}

impl Eq for Stored {}

impl Hash for Stored {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0.key.hash(h);
    }
}

impl Borrow<str> for Stored {
    fn borrow(&self) -> &str {
        &self.0.key
    }
}

/// The pods the watch has delivered, by `namespace/name`, as the reflector's store keeps
/// them: an initial listing (or a re-listing) replaces the whole content at once when it
/// is complete; from then on each event applies.
pub(crate) struct PodStore {
    pods: RwLock<HashSet<Stored>>,
    /// A listing in progress.
    listing: std::sync::Mutex<Option<HashSet<Stored>>>,
    ready: tokio::sync::watch::Sender<bool>,
}

impl PodStore {
    pub fn new() -> PodStore {
        PodStore {
            pods: RwLock::default(),
            listing: std::sync::Mutex::default(),
            ready: tokio::sync::watch::Sender::new(false),
        }
    }

    fn pods(&self) -> std::sync::RwLockReadGuard<'_, HashSet<Stored>> {
        self.pods.read().unwrap_or_else(|p| p.into_inner())
    }

    fn pods_mut(&self) -> std::sync::RwLockWriteGuard<'_, HashSet<Stored>> {
        self.pods.write().unwrap_or_else(|p| p.into_inner())
    }

    fn listing(&self) -> std::sync::MutexGuard<'_, Option<HashSet<Stored>>> {
        self.listing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The record of `namespace/name`.
    pub fn get(&self, key: &str) -> Option<Arc<PodRecord>> {
        self.pods().get(key).map(|s| s.0.clone())
    }

    /// Every record.
    pub fn snapshot(&self) -> Vec<Arc<PodRecord>> {
        self.pods().iter().map(|s| s.0.clone()).collect()
    }

    /// A listing starts.
    pub fn list_start(&self) {
        *self.listing() = Some(HashSet::new());
    }

    /// One pod of the listing in progress.
    pub fn list_item(&self, rec: Arc<PodRecord>) {
        self.listing()
            .get_or_insert_with(HashSet::new)
            .replace(Stored(rec));
    }

    /// The listing is complete: it becomes the content, and the store is ready.
    pub fn list_done(&self) {
        let listed = self.listing().take().unwrap_or_default();
        *self.pods_mut() = listed;
        self.ready.send_replace(true);
    }

    /// A pod was added or changed.
    pub fn apply(&self, rec: Arc<PodRecord>) {
        self.pods_mut().replace(Stored(rec));
    }

    /// A pod was deleted.
    pub fn remove(&self, key: &str) {
        self.pods_mut().remove(key);
    }

    /// Waits until the first listing is complete.
    pub async fn ready(&self) {
        let mut rx = self.ready.subscribe();
        // The sender lives in `self`, so this only ends when ready.
        let _ = rx.wait_for(|r| *r).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{Instance, InstanceState};
    use crate::status::{Observed, metadata_patch, status_patch};
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    const DESIRED: &str = crate::pods::DESIRED_SPEC_KEY;

    fn slim(v: serde_json::Value) -> SlimPod {
        serde_json::from_value(v).unwrap()
    }

    fn base() -> serde_json::Value {
        json!({
            "metadata": {
                "name": "web", "namespace": "ns", "uid": "0f1e2d3c-4b5a-4697-8877-665544332211",
                "resourceVersion": "42", "labels": {"tier": "a"},
                "annotations": {"example.com/x": "y"},
            },
            "spec": {"nodeName": "n", "containers": [
                {"name": "main", "image": "img:1", "command": ["run"], "env": [{"name": "A", "value": "1"}], "tty": true},
                {"name": "side", "image": "other"},
            ]},
        })
    }

    #[test]
    fn a_record_keeps_what_the_controller_reads() {
        let full: Pod = serde_json::from_value(base()).unwrap();
        let rec = PodRecord::new(slim(base()));
        assert_eq!(rec.key(), "ns/web");
        assert_eq!(
            rec.claim().map(ClaimKey::to_string),
            crate::claim::claim_name(&full)
        );
        let pod = rec.to_pod();
        assert_eq!(crate::claim::pod_key(&pod), "ns/web");
        assert_eq!(pod.metadata.uid, full.metadata.uid);
        assert_eq!(pod.metadata.resource_version.as_deref(), Some("42"));
        // The provision request is the full pod's, and the fingerprint is the full pod's.
        assert_eq!(
            crate::claim::provision_request(&pod),
            crate::claim::provision_request(&full)
        );
        let ann = pod.metadata.annotations.unwrap();
        assert_eq!(
            ann.get(DESIRED),
            crate::claim::pod_spec_fingerprint(&full).as_ref()
        );
        assert_eq!(ann.len(), 1, "{ann:?}");
        // The deadline the controller enforces is kept.
        assert_eq!(pod.spec.unwrap().active_deadline_seconds, None);
        let mut v = base();
        v["spec"]["activeDeadlineSeconds"] = json!(30);
        let pod = PodRecord::new(slim(v)).to_pod();
        assert_eq!(pod.spec.unwrap().active_deadline_seconds, Some(30));
    }

    #[test]
    fn a_provisioned_pod_keeps_no_provisioning_shape() {
        let mut v = base();
        v["metadata"]["annotations"][common::keys::INSTANCE_ID_ANNOTATION] = json!("i-1");
        let rec = PodRecord::new(slim(v));
        assert!(rec.shape.is_none());
        let pod = rec.to_pod();
        let c = &pod.spec.unwrap().containers[0];
        assert_eq!(
            (c.name.as_str(), c.image.as_deref()),
            ("main", Some("img:1"))
        );
        assert_eq!(c.command, None);
    }

    fn inst(state: InstanceState, endpoint: Option<&str>, ip: Option<&str>) -> Instance {
        Instance {
            id: "i-1".into(),
            claim: "c".into(),
            state,
            endpoint: endpoint.map(str::to_string),
            ip: ip.map(str::to_string),
            started_at: Some("2026-01-01T00:00:00Z".into()),
            restart_count: 0,
        }
    }

    fn states() -> Vec<Instance> {
        let mut out = Vec::new();
        for state in [
            InstanceState::Pending,
            InstanceState::Running,
            InstanceState::Exited { code: 0 },
            InstanceState::Exited { code: 2 },
            InstanceState::Failed {
                reason: "boom".into(),
            },
        ] {
            out.push(inst(state.clone(), Some("h:22"), Some("10.0.0.1")));
            // Restarted in place once.
            out.push(Instance {
                restart_count: 1,
                ..inst(state.clone(), Some("h:22"), Some("10.0.0.1"))
            });
            out.push(inst(state, None, None));
        }
        out
    }

    /// Statuses a pod may carry: each one this crate writes, and odd ones.
    fn statuses(now: Timestamp) -> Vec<Option<serde_json::Value>> {
        let pod: Pod = serde_json::from_value(base()).unwrap();
        let mut out = vec![None, Some(json!({})), Some(json!({"phase": "Pending"}))];
        for i in states() {
            let st = crate::status::desired_status(&pod, &Observed::Instance(&i), now);
            let mut v = serde_json::to_value(&st).unwrap();
            out.push(Some(v.clone()));
            // Another writer's condition, kept whole.
            v["conditions"]
                .as_array_mut()
                .unwrap()
                .push(json!({"type": "example.com/gate", "status": "False", "message": "m"}));
            out.push(Some(v.clone()));
            // An owned condition twice (the last one counts for the comparison).
            let mut dup = v.clone();
            dup["conditions"]
                .as_array_mut()
                .unwrap()
                .push(json!({"type": "Ready", "status": "Maybe"}));
            out.push(Some(dup));
            // One owned condition missing.
            let mut missing = v.clone();
            missing["conditions"].as_array_mut().unwrap().remove(3);
            out.push(Some(missing));
            // Two container statuses, or a waiting state without a reason.
            let mut two = v.clone();
            let c = two["containerStatuses"][0].clone();
            two["containerStatuses"].as_array_mut().unwrap().push(c);
            out.push(Some(two));
            // The pod's phase, message or reason alone differs.
            let mut phase = v.clone();
            phase["phase"] = json!("Unknown");
            out.push(Some(phase));
            let mut message = v.clone();
            message["message"] = json!("said by someone else");
            out.push(Some(message));
            let mut reason = v.clone();
            reason["reason"] = json!("SomeoneElses");
            out.push(Some(reason));
            // The container's readiness or name alone differs.
            let mut unready = v.clone();
            let ready = unready["containerStatuses"][0]["ready"].as_bool().unwrap();
            unready["containerStatuses"][0]["ready"] = json!(!ready);
            out.push(Some(unready));
            let mut renamed = v.clone();
            renamed["containerStatuses"][0]["name"] = json!("other");
            out.push(Some(renamed));
            let mut noreason = v.clone();
            noreason["containerStatuses"][0]["state"] = json!({"waiting": {}});
            out.push(Some(noreason));
            let mut nostart = v;
            nostart["startTime"] = serde_json::Value::Null;
            out.push(Some(nostart));
        }
        out.push(Some(
            json!({"phase": "Running", "containerStatuses": [{"name": "main", "ready": true, "image": "", "imageID": "", "restartCount": 0}]}),
        ));
        // Another restart count than the instance's.
        let i = inst(InstanceState::Running, Some("h:22"), Some("10.0.0.1"));
        let mut v = serde_json::to_value(crate::status::desired_status(
            &pod,
            &Observed::Instance(&i),
            now,
        ))
        .unwrap();
        v["containerStatuses"][0]["restartCount"] = json!(3);
        out.push(Some(v));
        out
    }

    #[test]
    fn the_compact_comparisons_decide_as_the_full_ones_and_writes_are_the_same() {
        let now = Timestamp::now();
        let (mut stale, mut fresh) = (0, 0);
        for status in statuses(now) {
            let mut v = base();
            if let Some(s) = &status {
                v["status"] = s.clone();
            }
            for annotated in [false, true] {
                if annotated {
                    v["metadata"]["annotations"][common::keys::INSTANCE_ID_ANNOTATION] =
                        json!("i-1");
                    v["metadata"]["annotations"][common::keys::ENDPOINT_ANNOTATION] = json!("h:22");
                }
                let full: Pod = serde_json::from_value(v.clone()).unwrap();
                let rec = PodRecord::new(slim(v.clone()));
                let rebuilt = rec.to_pod();
                for i in states() {
                    let obs = Observed::Instance(&i);
                    let want = status_patch(&full, &obs, now);
                    assert_eq!(
                        crate::status::status_stale(&rec, &obs),
                        want.is_some(),
                        "status {status:?} for {i:?}"
                    );
                    if want.is_some() {
                        stale += 1;
                    } else {
                        fresh += 1;
                    }
                    assert_eq!(status_patch(&rebuilt, &obs, now), want, "{status:?} {i:?}");
                    assert_eq!(rec.metadata_stale(&i), metadata_patch(&full, &i).is_some());
                    assert_eq!(metadata_patch(&rebuilt, &i), metadata_patch(&full, &i));
                }
                for obs in [
                    Observed::Vanished,
                    Observed::ProvisionFailed("no"),
                    Observed::DeadlineExceeded,
                ] {
                    let want = status_patch(&full, &obs, now);
                    assert_eq!(crate::status::status_stale(&rec, &obs), want.is_some());
                    assert_eq!(status_patch(&rebuilt, &obs, now), want);
                }
            }
        }
        // Both answers were exercised.
        assert!(stale > 100 && fresh > 10, "{stale} stale, {fresh} fresh");
    }

    #[test]
    fn a_listing_replaces_the_content_when_complete() {
        let store = PodStore::new();
        let rec = |name: &str| {
            let mut v = base();
            v["metadata"]["name"] = json!(name);
            Arc::new(PodRecord::new(slim(v)))
        };
        store.apply(rec("a"));
        store.list_start();
        store.list_item(rec("b"));
        assert!(store.get("ns/a").is_some() && store.get("ns/b").is_none());
        store.list_done();
        assert!(store.get("ns/a").is_none() && store.get("ns/b").is_some());
        store.apply(rec("c"));
        store.remove("ns/b");
        let keys: Vec<String> = store
            .snapshot()
            .iter()
            .map(|r| r.key().to_string())
            .collect();
        assert_eq!(keys, ["ns/c"]);
    }
}
