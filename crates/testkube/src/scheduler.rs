//! The scheduler stand-in and the `pods/binding` subresource.
//!
//! kube-scheduler's filter plugins, reduced to the ones this project meets:
//! `NodeName`-less, ungated, undeleted pods of `default-scheduler` go to a node that is
//! Ready, not cordoned (`NodeUnschedulable`), matches `nodeSelector` and the required node
//! affinity (`NodeAffinity`), and whose `NoSchedule`/`NoExecute` taints the pod tolerates
//! (`TaintToleration`). Among feasible nodes the one with the fewest pods wins (ties by
//! name). A pod no node fits gets `PodScheduled=False` reason `Unschedulable` with a
//! message in kube-scheduler's `0/N nodes are available: ...` form.
//!
//! Binding goes through the same code as `POST pods/{name}/binding`
//! (`pkg/registry/core/pod/storage/storage.go`, `BindingREST`): the pod gets
//! `spec.nodeName`, the binding's annotations, and `PodScheduled=True`.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::resources::{self, Resource};
use crate::server::State;
use crate::status::ApiError;
use crate::store::{Inner, res_index};

fn pods() -> &'static Resource {
    resources::find("", "v1", "pods").expect("pods are served")
}

fn nodes() -> &'static Resource {
    resources::find("", "v1", "nodes").expect("nodes are served")
}

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn now() -> String {
    crate::strategy::rfc3339(crate::times::now_secs())
}

/// Whether the scheduler should place this pod.
pub fn wants_scheduling(pod: &Value) -> bool {
    let scheduler = s(pod, "/spec/schedulerName");
    s(pod, "/spec/nodeName").is_empty()
        && (scheduler.is_empty() || scheduler == "default-scheduler")
        && pod.pointer("/metadata/deletionTimestamp").is_none()
        && pod
            .pointer("/spec/schedulingGates")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
        && !matches!(s(pod, "/status/phase"), "Succeeded" | "Failed")
}

fn node_ready(node: &Value) -> bool {
    node.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// Whether a toleration tolerates a taint (`v1helper.TolerationsTolerateTaint`).
pub fn tolerates(toleration: &Value, taint: &Value) -> bool {
    let t_effect = s(toleration, "/effect");
    if !t_effect.is_empty() && t_effect != s(taint, "/effect") {
        return false;
    }
    let t_key = s(toleration, "/key");
    let op = s(toleration, "/operator");
    if t_key.is_empty() {
        // An empty key with Exists tolerates everything.
        return op == "Exists";
    }
    if t_key != s(taint, "/key") {
        return false;
    }
    match op {
        "Exists" => true,
        "" | "Equal" => s(toleration, "/value") == s(taint, "/value"),
        _ => false,
    }
}

fn labels(node: &Value) -> BTreeMap<String, String> {
    node.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// One `NodeSelectorRequirement` against a value (None: the key is absent).
fn requirement_matches(req: &Value, value: Option<&str>) -> bool {
    let values: Vec<&str> = req["values"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let int = |v: &str| v.parse::<i64>().ok();
    match s(req, "/operator") {
        "In" => value.is_some_and(|v| values.contains(&v)),
        "NotIn" => value.is_none_or(|v| !values.contains(&v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(int), values.first().and_then(|v| int(v))), (Some(a), Some(b)) if a > b)
        }
        "Lt" => {
            matches!((value.and_then(int), values.first().and_then(|v| int(v))), (Some(a), Some(b)) if a < b)
        }
        _ => false,
    }
}

/// Whether a node satisfies the pod's `nodeSelector` and required node affinity
/// (`component-helpers/scheduling/corev1/nodeaffinity`).
pub fn node_matches(pod: &Value, node: &Value) -> bool {
    let l = labels(node);
    if let Some(sel) = pod.pointer("/spec/nodeSelector").and_then(Value::as_object)
        && !sel
            .iter()
            .all(|(k, v)| l.get(k).map(String::as_str) == v.as_str())
    {
        return false;
    }
    let Some(terms) = pod
        .pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
        .and_then(Value::as_array)
    else {
        return true;
    };
    let name = s(node, "/metadata/name");
    // Terms are ORed; an empty term matches nothing; requirements in a term are ANDed.
    terms.iter().any(|term| {
        let exprs = term["matchExpressions"].as_array();
        let fields = term["matchFields"].as_array();
        if exprs.is_none_or(Vec::is_empty) && fields.is_none_or(Vec::is_empty) {
            return false;
        }
        exprs
            .into_iter()
            .flatten()
            .all(|r| requirement_matches(r, l.get(s(r, "/key")).map(String::as_str)))
            && fields
                .into_iter()
                .flatten()
                .all(|r| s(r, "/key") == "metadata.name" && requirement_matches(r, Some(name)))
    })
}

/// Why a node cannot take a pod (a kube-scheduler reason), or None when it can.
pub fn node_misfit(pod: &Value, node: &Value) -> Option<String> {
    if !node_ready(node) {
        return Some("node(s) were not Ready".into());
    }
    let tolerations: Vec<&Value> = pod
        .pointer("/spec/tolerations")
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    if node.pointer("/spec/unschedulable") == Some(&json!(true)) {
        let taint = json!({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"});
        if !tolerations.iter().any(|t| tolerates(t, &taint)) {
            return Some("node(s) were unschedulable".into());
        }
    }
    if !node_matches(pod, node) {
        return Some("node(s) didn't match Pod's node affinity/selector".into());
    }
    for taint in node
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if !matches!(s(taint, "/effect"), "NoSchedule" | "NoExecute") {
            continue;
        }
        if !tolerations.iter().any(|t| tolerates(t, taint)) {
            return Some(format!(
                "node(s) had untolerated taint {{{}: {}}}",
                s(taint, "/key"),
                s(taint, "/value")
            ));
        }
    }
    None
}

/// The node for a pod, or the `Unschedulable` message.
pub fn choose(
    pod: &Value,
    nodes: &[Arc<Value>],
    pods_per_node: &BTreeMap<String, usize>,
) -> Result<String, String> {
    if nodes.is_empty() {
        return Err("no nodes available to schedule pods".into());
    }
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut best: Option<(usize, &str)> = None;
    for n in nodes {
        let name = s(n, "/metadata/name");
        match node_misfit(pod, n) {
            Some(r) => *reasons.entry(r).or_default() += 1,
            None => {
                let load = pods_per_node.get(name).copied().unwrap_or(0);
                if best.is_none_or(|(l, _)| load < l) {
                    best = Some((load, name));
                }
            }
        }
    }
    if let Some((_, name)) = best {
        return Ok(name.to_string());
    }
    let parts: Vec<String> = reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
    Err(format!(
        "0/{} nodes are available: {}. preemption: 0/{} nodes are available: {} Preemption is not helpful for scheduling.",
        nodes.len(),
        parts.join(", "),
        nodes.len(),
        nodes.len()
    ))
}

fn set_condition(pod: &mut Value, cond: Value) {
    if !pod["status"].is_object() {
        pod["status"] = json!({});
    }
    let conds = pod["status"]
        .as_object_mut()
        .expect("made an object above")
        .entry("conditions")
        .or_insert_with(|| json!([]));
    if !conds.is_array() {
        *conds = json!([]);
    }
    let list = conds.as_array_mut().expect("made an array above");
    match list.iter_mut().find(|c| c["type"] == cond["type"]) {
        Some(c) => *c = cond,
        None => list.push(cond),
    }
}

/// Binds a pod to a node under the store lock, as `BindingREST.Create` does: 409 when the
/// pod is already bound, being deleted or gated. `annotations` come from the Binding.
pub(crate) fn bind_locked(
    g: &mut Inner,
    ns: &str,
    name: &str,
    node: &str,
    annotations: Option<&serde_json::Map<String, Value>>,
    uid: Option<&str>,
) -> Result<Arc<Value>, ApiError> {
    let res = pods();
    let idx = res_index(res);
    let Some(pod) = g.get(idx, ns, name) else {
        return Err(ApiError::not_found(res, name));
    };
    if let Some(uid) = uid.filter(|u| !u.is_empty())
        && s(&pod, "/metadata/uid") != uid
    {
        return Err(ApiError::conflict(
            res,
            name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                s(&pod, "/metadata/uid")
            ),
        ));
    }
    if pod.pointer("/metadata/deletionTimestamp").is_some() {
        return Err(ApiError::conflict(
            res,
            name,
            &format!("pod {name} is being deleted, cannot be assigned to a host"),
        ));
    }
    let bound = s(&pod, "/spec/nodeName");
    if !bound.is_empty() {
        return Err(ApiError::conflict(
            res,
            name,
            &format!("pod {name} is already assigned to node \"{bound}\""),
        ));
    }
    if pod
        .pointer("/spec/schedulingGates")
        .and_then(Value::as_array)
        .is_some_and(|g| !g.is_empty())
    {
        return Err(ApiError::conflict(
            res,
            name,
            &format!("pod {name} has non-empty .spec.schedulingGates"),
        ));
    }
    let mut p = (*pod).clone();
    p["spec"]["nodeName"] = json!(node);
    if let Some(a) = annotations {
        let m = &mut p["metadata"];
        if !m["annotations"].is_object() {
            m["annotations"] = json!({});
        }
        for (k, v) in a {
            m["annotations"][k] = v.clone();
        }
    }
    set_condition(
        &mut p,
        json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null,
            "lastTransitionTime": now()}),
    );
    Ok(g.put(idx, p))
}

/// `POST pods/{name}/binding`: the body is a `Binding` whose `target` names a Node.
pub(crate) fn binding(st: &State, ns: &str, name: &str, body: &[u8]) -> Result<Value, ApiError> {
    let b: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the Binding body could not be decoded as JSON: {e}"
        ))
    })?;
    if let Some(k) = b.get("kind").and_then(Value::as_str)
        && k != "Binding"
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind (Binding)"
        )));
    }
    let body_name = s(&b, "/metadata/name");
    if !body_name.is_empty() && body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let kind = s(&b, "/target/kind");
    let node = s(&b, "/target/name");
    if node.is_empty() {
        return Err(ApiError::invalid(
            &BINDING,
            name,
            &[crate::status::Cause::required("target.name", "")],
        ));
    }
    if !(kind.is_empty() || kind == "Node") {
        return Err(ApiError::invalid(
            &BINDING,
            name,
            &[crate::status::Cause::invalid(
                "target.kind",
                &json!(kind),
                "must be empty or 'Node'",
            )],
        ));
    }
    {
        let mut g = st.store.lock();
        bind_locked(
            &mut g,
            ns,
            name,
            node,
            b.pointer("/metadata/annotations")
                .and_then(Value::as_object),
            b.pointer("/metadata/uid").and_then(Value::as_str),
        )?;
    }
    st.notify();
    Ok(
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    )
}

/// A stand-in `Resource` naming the Binding kind in 422 details.
static BINDING: Resource = Resource {
    group: "",
    version: "v1",
    kind: "Binding",
    plural: "bindings",
    singular: "binding",
    namespaced: true,
    has_status: false,
    create_only: true,
    tracks_generation: false,
    short_names: &[],
    name_rule: resources::NameRule::Subdomain,
};

/// One scheduling pass over every pending pod. Returns whether anything was written.
pub fn pass(g: &mut Inner) -> bool {
    let pidx = res_index(pods());
    let all_pods = g.list(pidx, None);
    let pending: Vec<Arc<Value>> = all_pods
        .iter()
        .filter(|p| wants_scheduling(p))
        .cloned()
        .collect();
    if pending.is_empty() {
        return false;
    }
    let node_list = g.list(res_index(nodes()), None);
    let mut load: BTreeMap<String, usize> = BTreeMap::new();
    for p in &all_pods {
        let n = s(p, "/spec/nodeName");
        if !n.is_empty() {
            *load.entry(n.to_string()).or_default() += 1;
        }
    }
    let mut changed = false;
    for pod in pending {
        let (ns, name) = crate::store::obj_key(&pod);
        match choose(&pod, &node_list, &load) {
            Ok(node) => {
                if bind_locked(g, &ns, &name, &node, None, None).is_ok() {
                    *load.entry(node).or_default() += 1;
                    changed = true;
                }
            }
            Err(message) => {
                let current = pod
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .and_then(|cs| cs.iter().find(|c| c["type"] == "PodScheduled"));
                if current.is_some_and(|c| {
                    c["status"] == "False"
                        && c["reason"] == "Unschedulable"
                        && c["message"] == message.as_str()
                }) {
                    continue;
                }
                let mut p = (*pod).clone();
                set_condition(
                    &mut p,
                    json!({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                        "message": message, "lastProbeTime": null, "lastTransitionTime": now()}),
                );
                g.put(pidx, p);
                changed = true;
            }
        }
    }
    changed
}

/// Runs a pass on every change to the store until cancelled.
pub(crate) async fn run(state: Arc<State>, cancel: CancellationToken) {
    let mut rx = state.store.subscribe();
    loop {
        let changed = pass(&mut state.store.lock());
        if changed {
            state.notify();
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = rx.changed() => if r.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, labels: Value, taints: Value, ready: bool) -> Arc<Value> {
        Arc::new(json!({"metadata": {"name": name, "labels": labels},
            "spec": {"taints": taints},
            "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}}))
    }

    #[test]
    fn tolerations_follow_the_api_helper() {
        let taint = json!({"key": "k", "value": "v", "effect": "NoSchedule"});
        assert!(tolerates(&json!({"key": "k", "value": "v"}), &taint));
        assert!(tolerates(
            &json!({"key": "k", "operator": "Exists", "effect": "NoSchedule"}),
            &taint
        ));
        assert!(tolerates(&json!({"operator": "Exists"}), &taint));
        assert!(!tolerates(&json!({"key": "k", "value": "w"}), &taint));
        assert!(!tolerates(
            &json!({"key": "k", "operator": "Exists", "effect": "NoExecute"}),
            &taint
        ));
        assert!(!tolerates(&json!({"operator": "Equal"}), &taint));
    }

    #[test]
    fn affinity_terms_are_ored_and_requirements_anded() {
        let pod = json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}, {"key": "gpu", "operator": "DoesNotExist"}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["special"]}]}
        ]}}}}});
        assert!(node_matches(
            &pod,
            &node("n", json!({"zone": "a"}), json!([]), true)
        ));
        assert!(!node_matches(
            &pod,
            &node("n", json!({"zone": "a", "gpu": "1"}), json!([]), true)
        ));
        assert!(node_matches(
            &pod,
            &node("special", json!({}), json!([]), true)
        ));
        let gt = json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["4"]}]}]}}}}});
        assert!(node_matches(
            &gt,
            &node("n", json!({"cores": "8"}), json!([]), true)
        ));
        assert!(!node_matches(
            &gt,
            &node("n", json!({"cores": "2"}), json!([]), true)
        ));
    }

    #[test]
    fn the_least_loaded_feasible_node_wins_and_misfits_are_counted() {
        let nodes = vec![
            node(
                "a",
                json!({}),
                json!([{"key": "t", "effect": "NoSchedule"}]),
                true,
            ),
            node("b", json!({}), json!([]), false),
            node(
                "c",
                json!({}),
                json!([{"key": "soft", "effect": "PreferNoSchedule"}]),
                true,
            ),
            node("d", json!({}), json!([]), true),
        ];
        let pod = json!({"spec": {}});
        let load = BTreeMap::from([("c".to_string(), 3)]);
        assert_eq!(choose(&pod, &nodes, &load).unwrap(), "d");
        let picky = json!({"spec": {"nodeSelector": {"x": "y"}}});
        let msg = choose(&picky, &nodes, &load).unwrap_err();
        assert!(msg.starts_with("0/4 nodes are available: "), "{msg}");
        assert!(msg.contains("1 node(s) were not Ready"), "{msg}");
        assert!(
            msg.contains("3 node(s) didn't match Pod's node affinity/selector"),
            "{msg}"
        );
        assert_eq!(
            choose(&pod, &[], &load).unwrap_err(),
            "no nodes available to schedule pods"
        );
    }
}
