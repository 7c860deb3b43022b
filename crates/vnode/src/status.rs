//! Pure functions: what a pod's status and annotations should say for an instance state,
//! and whether what the pod already says is the same (so steady state writes nothing).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::provider::{Instance, InstanceState};
use crate::slim::{CondStatus, PodRecord};

/// The pod condition types this crate computes; any other condition on a pod (a readiness
/// gate's, [`crate::pods::SPEC_APPLIED_CONDITION`]) is carried over as it is.
pub const OWNED_CONDITIONS: [&str; 4] = ["PodScheduled", "Initialized", "ContainersReady", "Ready"];

/// Pod `status.reason` when the instance behind a pod disappeared.
pub const REASON_VANISHED: &str = "InstanceVanished";
/// Pod `status.reason` when the provider reports the instance failed.
pub const REASON_PROVIDER_FAILED: &str = "ProviderFailed";
/// Pod `status.reason` when provisioning failed for good.
pub const REASON_PROVISION_FAILED: &str = "ProvisionFailed";
/// Pod `status.reason` when the pod outlived `spec.activeDeadlineSeconds` (the kubelet's).
pub const REASON_DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
/// Pod `status.message` with [`REASON_DEADLINE_EXCEEDED`], in the kubelet's words (clients
/// and dashboards match on them).
pub const DEADLINE_EXCEEDED_MESSAGE: &str =
    "Pod was active on the node longer than the specified deadline";

/// What the pod should report. `None` instance = the instance vanished.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observed<'a> {
    /// The provider reports this instance.
    Instance(&'a Instance),
    /// The instance is gone although the pod was provisioned.
    Vanished,
    /// Provisioning failed for a reason retrying will not fix.
    ProvisionFailed(&'a str),
    /// The pod outlived `spec.activeDeadlineSeconds`; its instance was terminated.
    DeadlineExceeded,
}

/// Where a pod stands against `spec.activeDeadlineSeconds`, measured as the kubelet
/// measures it: from `status.startTime`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deadline {
    /// No deadline applies (none set, or no start time recorded yet).
    None,
    /// The deadline has passed: the pod is to be failed now.
    Passed,
    /// The deadline passes after this long.
    In(std::time::Duration),
}

/// Where a pod that started at `start_time` with `active_deadline_seconds` stands at
/// `now`. As the kubelet decides: passed once the time since the start reaches the
/// deadline (so a start time in the future, a clock step, never passes it early).
pub fn active_deadline(
    start_time: Option<&Time>,
    active_deadline_seconds: Option<i64>,
    now: Timestamp,
) -> Deadline {
    let (Some(start), Some(seconds)) = (start_time, active_deadline_seconds) else {
        return Deadline::None;
    };
    let elapsed_ms = i128::from(now.as_millisecond()) - i128::from(start.0.as_millisecond());
    let allowed_ms = i128::from(seconds) * 1000;
    if elapsed_ms >= allowed_ms {
        return Deadline::Passed;
    }
    // Positive and below 1000 * i64::MAX here; anything beyond u64 milliseconds is
    // further than any timer needs to look.
    let left = u64::try_from(allowed_ms - elapsed_ms).unwrap_or(u64::MAX);
    Deadline::In(std::time::Duration::from_millis(left))
}

/// The annotations the pod should carry for `instance` (instance id, endpoint).
pub fn desired_annotations(instance: &Instance) -> BTreeMap<String, String> {
    let mut a = BTreeMap::new();
    a.insert(
        common::keys::INSTANCE_ID_ANNOTATION.to_string(),
        instance.id.clone(),
    );
    if let Some(ep) = &instance.endpoint {
        a.insert(common::keys::ENDPOINT_ANNOTATION.to_string(), ep.clone());
    }
    a
}

/// A JSON merge patch of the pod's metadata setting the annotations of `instance`, carrying
/// the resourceVersion it was computed from; `None` when the pod already has them.
pub fn metadata_patch(pod: &Pod, instance: &Instance) -> Option<Value> {
    metadata_patch_applied(pod, instance, None)
}

/// [`metadata_patch`], also recording `applied` (the fingerprint of the mutable fields the
/// instance was given) in the applied-spec annotation when set.
pub fn metadata_patch_applied(
    pod: &Pod,
    instance: &Instance,
    applied: Option<&str>,
) -> Option<Value> {
    let empty = BTreeMap::new();
    let have = pod.metadata.annotations.as_ref().unwrap_or(&empty);
    let mut want = desired_annotations(instance);
    if let Some(fp) = applied {
        want.insert(
            common::keys::APPLIED_SPEC_ANNOTATION.to_string(),
            fp.to_string(),
        );
    }
    let stale_endpoint =
        instance.endpoint.is_none() && have.contains_key(common::keys::ENDPOINT_ANNOTATION);
    if want.iter().all(|(k, v)| have.get(k) == Some(v)) && !stale_endpoint {
        return None;
    }
    let mut ann = serde_json::Map::new();
    for (k, v) in want {
        ann.insert(k, Value::String(v));
    }
    if stale_endpoint {
        ann.insert(common::keys::ENDPOINT_ANNOTATION.to_string(), Value::Null);
    }
    Some(json!({"metadata": {
        "resourceVersion": pod.metadata.resource_version,
        "annotations": ann,
    }}))
}

fn condition(type_: &str, ok: bool, now: &Time, old: Option<&PodStatus>) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    // Keep the transition time when the condition did not change.
    let last = old
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    PodCondition {
        type_: type_.to_string(),
        status: status.to_string(),
        last_transition_time: Some(last),
        ..PodCondition::default()
    }
}

/// What a status should say for an observation, apart from timestamps and what is carried
/// over from the old status: the one source of [`desired_status`] and [`status_stale`].
struct Want<'a> {
    phase: &'static str,
    reason: Option<&'static str>,
    /// The pod's message, also the container state's.
    message: Option<&'a str>,
    pod_ip: Option<&'a str>,
    /// The container is waiting, for this reason.
    waiting: Option<&'static str>,
    /// The container runs (and is ready).
    running: bool,
    /// The container ended with this exit code and reason.
    exit: Option<(i32, &'static str)>,
    /// The container's restart count as the provider reports it; `None`: the old status's
    /// count is carried over (the instance is gone, or never was).
    restarts: Option<i32>,
}

const VANISHED_MESSAGE: &str = "the instance behind this pod no longer exists at the provider";

fn want<'a>(observed: &Observed<'a>) -> Want<'a> {
    let none = Want {
        phase: "Failed",
        reason: None,
        message: None,
        pod_ip: None,
        waiting: None,
        running: false,
        exit: None,
        restarts: None,
    };
    match observed {
        Observed::Instance(i) => {
            let none = Want {
                restarts: Some(i.restart_count),
                ..none
            };
            match &i.state {
                InstanceState::Pending => Want {
                    phase: "Pending",
                    waiting: Some("Provisioning"),
                    ..none
                },
                InstanceState::Running => Want {
                    phase: "Running",
                    pod_ip: i.ip.as_deref(),
                    running: true,
                    ..none
                },
                InstanceState::Exited { code } => Want {
                    phase: if *code == 0 { "Succeeded" } else { "Failed" },
                    exit: Some((*code, if *code == 0 { "Completed" } else { "Error" })),
                    ..none
                },
                InstanceState::Failed { reason } => Want {
                    reason: Some(REASON_PROVIDER_FAILED),
                    message: Some(reason),
                    exit: Some((137, REASON_PROVIDER_FAILED)),
                    ..none
                },
            }
        }
        Observed::Vanished => Want {
            reason: Some(REASON_VANISHED),
            message: Some(VANISHED_MESSAGE),
            exit: Some((137, REASON_VANISHED)),
            ..none
        },
        Observed::ProvisionFailed(why) => Want {
            reason: Some(REASON_PROVISION_FAILED),
            message: Some(why),
            waiting: Some(REASON_PROVISION_FAILED),
            ..none
        },
        // The instance was killed (terminated through the provider), as the kubelet kills
        // the containers of a pod past its deadline.
        Observed::DeadlineExceeded => Want {
            reason: Some(REASON_DEADLINE_EXCEEDED),
            message: Some(DEADLINE_EXCEEDED_MESSAGE),
            exit: Some((137, REASON_DEADLINE_EXCEEDED)),
            ..none
        },
    }
}

/// The status the pod should have for what was observed.
pub fn desired_status(pod: &Pod, observed: &Observed<'_>, now: Timestamp) -> PodStatus {
    let now = Time(now);
    let old = pod.status.as_ref();
    let w = want(observed);
    let container = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
        .unwrap_or_default();
    let start_time = old
        .and_then(|s| s.start_time.clone())
        .unwrap_or_else(|| now.clone());
    let old_container = old
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.first());
    let old_restarts = old_container.map_or(0, |c| c.restart_count);
    let restart_count = w.restarts.unwrap_or(old_restarts);
    // A restarted container is another run: its start and end are not the old ones.
    let old_state = old_container
        .filter(|_| restart_count == old_restarts)
        .and_then(|c| c.state.as_ref());
    let message = w.message.map(str::to_string);
    let state = if let Some(reason) = w.waiting {
        ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.into()),
                message: message.clone(),
            }),
            ..ContainerState::default()
        }
    } else if w.running {
        let listed = match observed {
            Observed::Instance(i) => i.started_at.as_deref(),
            _ => None,
        };
        let started = old_state
            .and_then(|s| s.running.as_ref())
            .and_then(|r| r.started_at.clone())
            .or_else(|| listed.and_then(|s| s.parse::<Timestamp>().ok()).map(Time))
            .unwrap_or_else(|| now.clone());
        ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(started),
            }),
            ..ContainerState::default()
        }
    } else {
        let (code, reason) = w.exit.unwrap_or((137, REASON_VANISHED));
        let finished = old_state
            .and_then(|s| s.terminated.as_ref())
            .and_then(|t| t.finished_at.clone())
            .unwrap_or_else(|| now.clone());
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: code,
                reason: Some(reason.to_string()),
                message: message.clone(),
                finished_at: Some(finished),
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        }
    };
    let ip = w.pod_ip.map(str::to_string);
    let running = w.running;
    PodStatus {
        phase: Some(w.phase.to_string()),
        reason: w.reason.map(str::to_string),
        message,
        pod_ip: ip.clone(),
        pod_ips: ip.map(|ip| vec![PodIP { ip }]),
        start_time: Some(start_time),
        conditions: Some({
            let mut cs = vec![
                condition("PodScheduled", true, &now, old),
                condition("Initialized", true, &now, old),
                condition("ContainersReady", running, &now, old),
                condition("Ready", running, &now, old),
            ];
            // A merge patch replaces the whole list: keep what others wrote.
            cs.extend(
                old.and_then(|s| s.conditions.as_ref())
                    .into_iter()
                    .flatten()
                    .filter(|c| !OWNED_CONDITIONS.contains(&c.type_.as_str()))
                    .cloned(),
            );
            cs
        }),
        container_statuses: Some(vec![ContainerStatus {
            name: container.0,
            image: container.1,
            image_id: String::new(),
            ready: running,
            started: Some(running),
            restart_count,
            state: Some(state),
            ..ContainerStatus::default()
        }]),
        qos_class: old.and_then(|s| s.qos_class.clone()),
        ..PodStatus::default()
    }
}

/// Whether the stored pod's status differs from what `observed` says, ignoring
/// timestamps: exactly when [`status_patch`] of the pod would be `Some`, decided on the
/// stored form without building a `Pod`.
pub(crate) fn status_stale(pod: &PodRecord, observed: &Observed<'_>) -> bool {
    let w = want(observed);
    let Some(have) = pod.status() else {
        return true;
    };
    if have.phase.as_deref() != Some(w.phase)
        || have.reason.as_deref() != w.reason
        || have.message.as_deref() != w.message
        || have.pod_ip.as_deref() != w.pod_ip
        || have.start_time.is_none()
    {
        return true;
    }
    // The signature maps condition type to status, the last one of a type winning; the
    // other writers' conditions are carried over, so only this crate's can differ.
    let mut last = [None; OWNED_CONDITIONS.len()];
    for c in have.conditions.iter() {
        last[usize::from(c.kind)] = Some(c.status);
    }
    let wanted = [true, true, w.running, w.running].map(|ok| Some(CondStatus::of(ok)));
    if last != wanted {
        return true;
    }
    let [c] = &*have.containers else {
        return true;
    };
    c.name.as_str() != pod.container_name()
        || c.ready != w.running
        || c.waiting.as_ref().and_then(|r| r.as_deref()) != w.waiting
        || c.running.is_some() != w.running
        || c.terminated
            .as_ref()
            .map(|t| (t.exit_code, t.reason.as_deref()))
            != w.exit.map(|(code, reason)| (code, Some(reason)))
        || w.restarts.is_some_and(|n| n != c.restart_count)
}

/// The parts of a status this crate owns, without timestamps: equal signatures mean no
/// write is needed.
pub fn signature(s: &PodStatus) -> Value {
    let conds: BTreeMap<String, String> = s
        .conditions
        .iter()
        .flatten()
        .map(|c| (c.type_.clone(), c.status.clone()))
        .collect();
    let cs: Vec<Value> = s
        .container_statuses
        .iter()
        .flatten()
        .map(|c| {
            let st = c.state.as_ref();
            json!({
                "name": c.name,
                "ready": c.ready,
                "waiting": st.and_then(|s| s.waiting.as_ref()).map(|w| &w.reason),
                "running": st.is_some_and(|s| s.running.is_some()),
                "exit": st.and_then(|s| s.terminated.as_ref()).map(|t| (t.exit_code, &t.reason)),
                "restarts": c.restart_count,
            })
        })
        .collect();
    json!({
        "phase": s.phase, "reason": s.reason, "message": s.message, "podIP": s.pod_ip,
        "conditions": conds, "containers": cs, "hasStart": s.start_time.is_some(),
    })
}

/// A JSON merge patch for `pods/status` carrying the resourceVersion it was computed from;
/// `None` when the pod already reports what `observed` says.
pub fn status_patch(pod: &Pod, observed: &Observed<'_>, now: Timestamp) -> Option<Value> {
    let want = desired_status(pod, observed, now);
    let have = pod.status.clone().unwrap_or_default();
    if signature(&want) == signature(&have) {
        return None;
    }
    let mut status = serde_json::to_value(&want).ok()?;
    // A merge patch only sets what it names: clear what the old status had and the new
    // one does not.
    if let Some(obj) = status.as_object_mut() {
        for key in ["reason", "message", "podIP", "podIPs"] {
            obj.entry(key).or_insert(Value::Null);
        }
    }
    Some(json!({
        "metadata": {"resourceVersion": pod.metadata.resource_version},
        "status": status,
    }))
}

/// Whether the pod has finished (Succeeded or Failed): nothing more happens to it.
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    fn pod() -> Pod {
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                resource_version: Some("7".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "main".into(),
                    image: Some("img".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                ..Default::default()
            }),
        }
    }

    fn inst(state: InstanceState) -> Instance {
        Instance {
            id: "i-1".into(),
            claim: "c".into(),
            state,
            endpoint: Some("h:22".into()),
            ip: Some("10.0.0.9".into()),
            started_at: None,
            restart_count: 0,
        }
    }

    #[test]
    fn applying_the_patch_makes_the_next_one_empty() {
        let mut p = pod();
        let i = inst(InstanceState::Running);
        let now = Timestamp::now();
        let patch = status_patch(&p, &Observed::Instance(&i), now).unwrap();
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        assert_eq!(patch["status"]["phase"], "Running");
        assert_eq!(patch["status"]["podIP"], "10.0.0.9");
        p.status = Some(desired_status(&p, &Observed::Instance(&i), now));
        // Later, with a different clock: still nothing to write.
        assert_eq!(
            status_patch(&p, &Observed::Instance(&i), Timestamp::now()),
            None
        );
    }

    #[test]
    fn metadata_first_then_nothing() {
        let mut p = pod();
        let i = inst(InstanceState::Running);
        let patch = metadata_patch(&p, &i).unwrap();
        assert_eq!(
            patch["metadata"]["annotations"][common::keys::INSTANCE_ID_ANNOTATION],
            "i-1"
        );
        assert_eq!(
            patch["metadata"]["annotations"][common::keys::ENDPOINT_ANNOTATION],
            "h:22"
        );
        p.metadata.annotations = Some(desired_annotations(&i));
        assert_eq!(metadata_patch(&p, &i), None);
    }

    #[test]
    fn conditions_of_others_are_kept_and_compared() {
        let mut p = pod();
        let i = inst(InstanceState::Running);
        let now = Timestamp::now();
        let mut st = desired_status(&p, &Observed::Instance(&i), now);
        st.conditions
            .get_or_insert_with(Vec::new)
            .push(PodCondition {
                type_: "example.com/gate".into(),
                status: "False".into(),
                message: Some("kept".into()),
                ..PodCondition::default()
            });
        p.status = Some(st);
        assert_eq!(status_patch(&p, &Observed::Instance(&i), now), None);
        let exited = inst(InstanceState::Exited { code: 0 });
        let patch = status_patch(&p, &Observed::Instance(&exited), now).unwrap();
        let conds = patch["status"]["conditions"].as_array().unwrap();
        assert!(
            conds
                .iter()
                .any(|c| c["type"] == "example.com/gate" && c["message"] == "kept")
        );
    }

    #[test]
    fn applied_fingerprint_rides_on_the_metadata_patch() {
        let mut p = pod();
        let i = inst(InstanceState::Running);
        p.metadata.annotations = Some(desired_annotations(&i));
        assert_eq!(metadata_patch_applied(&p, &i, None), None);
        let patch = metadata_patch_applied(&p, &i, Some("abc")).unwrap();
        assert_eq!(
            patch["metadata"]["annotations"][common::keys::APPLIED_SPEC_ANNOTATION],
            "abc"
        );
    }

    #[test]
    fn the_deadline_counts_from_the_start_time() {
        let start: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let at = |secs: i64| Timestamp::from_second(start.as_second() + secs).unwrap();
        let st = Some(Time(start));
        assert_eq!(active_deadline(st.as_ref(), None, at(10)), Deadline::None);
        assert_eq!(active_deadline(None, Some(5), at(10)), Deadline::None);
        assert_eq!(
            active_deadline(st.as_ref(), Some(30), at(10)),
            Deadline::In(std::time::Duration::from_secs(20))
        );
        // Reached counts as passed, as the kubelet decides.
        assert_eq!(
            active_deadline(st.as_ref(), Some(30), at(30)),
            Deadline::Passed
        );
        assert_eq!(
            active_deadline(st.as_ref(), Some(30), at(99)),
            Deadline::Passed
        );
        // A start time ahead of the clock does not pass the deadline early.
        assert_eq!(
            active_deadline(st.as_ref(), Some(30), at(-10)),
            Deadline::In(std::time::Duration::from_secs(40))
        );
        // The largest deadline the API takes is far, not an overflow.
        assert!(matches!(
            active_deadline(st.as_ref(), Some(i64::MAX), at(10)),
            Deadline::In(_)
        ));
    }

    #[test]
    fn a_deadline_failure_is_written_once_and_keeps_the_restart_count() {
        let mut p = pod();
        let restarted = Instance {
            restart_count: 2,
            ..inst(InstanceState::Running)
        };
        let now = Timestamp::now();
        p.status = Some(desired_status(&p, &Observed::Instance(&restarted), now));
        let patch = status_patch(&p, &Observed::DeadlineExceeded, now).unwrap();
        assert_eq!(patch["status"]["phase"], "Failed");
        assert_eq!(patch["status"]["reason"], REASON_DEADLINE_EXCEEDED);
        assert_eq!(patch["status"]["message"], DEADLINE_EXCEEDED_MESSAGE);
        assert_eq!(patch["status"]["podIP"], Value::Null);
        let c = &patch["status"]["containerStatuses"][0];
        assert_eq!(c["restartCount"], 2);
        assert_eq!(c["state"]["terminated"]["reason"], REASON_DEADLINE_EXCEEDED);
        p.status = Some(desired_status(&p, &Observed::DeadlineExceeded, now));
        assert!(is_terminal(&p));
        assert_eq!(status_patch(&p, &Observed::DeadlineExceeded, now), None);
    }

    #[test]
    fn a_restart_in_place_is_counted_and_starts_the_container_again() {
        let mut p = pod();
        let first = Instance {
            started_at: Some("2026-01-01T00:00:00Z".into()),
            ..inst(InstanceState::Running)
        };
        let now = Timestamp::now();
        p.status = Some(desired_status(&p, &Observed::Instance(&first), now));
        let again = Instance {
            id: "i-2".into(),
            restart_count: 1,
            started_at: None,
            ..first.clone()
        };
        let patch = status_patch(&p, &Observed::Instance(&again), now).unwrap();
        let c = &patch["status"]["containerStatuses"][0];
        assert_eq!(c["restartCount"], 1);
        // Not the first run's start.
        assert_ne!(c["state"]["running"]["startedAt"], "2026-01-01T00:00:00Z");
        p.status = Some(desired_status(&p, &Observed::Instance(&again), now));
        assert_eq!(status_patch(&p, &Observed::Instance(&again), now), None);
    }

    #[test]
    fn exits_and_vanishing_are_terminal_phases() {
        let p = pod();
        let now = Timestamp::now();
        let ok = desired_status(
            &p,
            &Observed::Instance(&inst(InstanceState::Exited { code: 0 })),
            now,
        );
        assert_eq!(ok.phase.as_deref(), Some("Succeeded"));
        let bad = desired_status(
            &p,
            &Observed::Instance(&inst(InstanceState::Exited { code: 3 })),
            now,
        );
        assert_eq!(bad.phase.as_deref(), Some("Failed"));
        let gone = desired_status(&p, &Observed::Vanished, now);
        assert_eq!(gone.reason.as_deref(), Some(REASON_VANISHED));
        assert_eq!(gone.pod_ip, None);
    }
}
