//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902), and strategic merge
//! patch for the lists this project patches (`staging/src/k8s.io/apimachinery/pkg/util/strategicpatch`).

use serde_json::{Map, Value};

/// The patch content types accepted.
pub const ACCEPTED: &[&str] = &[
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
];

/// A patch that cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// The body is not valid for its content type (400).
    #[error("{0}")]
    Malformed(String),
    /// A JSON patch operation failed, e.g. a `test` op or a missing path (422 in
    /// kube-apiserver's wording: "the server rejected our request due to an error in our request").
    #[error("{0}")]
    Failed(String),
    /// The content type is not supported (415).
    #[error("unsupported patch type {0:?}")]
    Unsupported(String),
}

/// Which patch a content type names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/merge-patch+json`.
    Merge,
    /// `application/json-patch+json`.
    Json,
    /// `application/strategic-merge-patch+json`.
    Strategic,
}

impl PatchKind {
    /// From a Content-Type header value.
    pub fn from_content_type(ct: &str) -> Result<Self, PatchError> {
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/merge-patch+json" => Ok(PatchKind::Merge),
            "application/json-patch+json" => Ok(PatchKind::Json),
            "application/strategic-merge-patch+json" => Ok(PatchKind::Strategic),
            other => Err(PatchError::Unsupported(other.to_string())),
        }
    }
}

/// Applies a patch body to `target`.
pub fn apply(kind: PatchKind, target: &Value, body: &[u8]) -> Result<Value, PatchError> {
    let mut out = target.clone();
    match kind {
        PatchKind::Merge => {
            let p: Value = serde_json::from_slice(body)
                .map_err(|e| PatchError::Malformed(format!("error decoding patch: {e}")))?;
            if !p.is_object() {
                return Err(PatchError::Malformed(
                    "a merge patch must be a JSON object".into(),
                ));
            }
            json_patch::merge(&mut out, &p);
        }
        PatchKind::Json => {
            let p: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| PatchError::Malformed(format!("error decoding patch: {e}")))?;
            json_patch::patch(&mut out, &p).map_err(|e| PatchError::Failed(e.to_string()))?;
        }
        PatchKind::Strategic => {
            let p: Value = serde_json::from_slice(body)
                .map_err(|e| PatchError::Malformed(format!("error decoding patch: {e}")))?;
            if !p.is_object() {
                return Err(PatchError::Malformed(
                    "a strategic merge patch must be a JSON object".into(),
                ));
            }
            strategic_object(&mut out, &p)?;
        }
    }
    Ok(out)
}

/// The Kubernetes types whose fields carry patch strategies, as `k8s.io/api` declares
/// them (`patchStrategy`/`patchMergeKey` struct tags). Fields of other types merge as
/// maps, and their lists are replaced (atomic), as for any field without a strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    /// An object of a served kind (`metadata`, `spec`, `status` below it).
    Root(&'static str),
    ObjectMeta,
    PodTemplateSpec,
    PodSpec,
    Container,
    Volume,
    PodStatus,
    NodeSpec,
    NodeStatus,
    ServiceSpec,
    /// A status whose `conditions` merge by `type` (Service, Namespace, Deployment,
    /// DaemonSet).
    ConditionsStatus,
    /// A workload spec (Deployment, DaemonSet) holding a pod `template`.
    WorkloadSpec,
    /// Anything else: maps merge, lists are replaced.
    Other,
}

/// How a list merges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListStrategy {
    /// Atomic: the patch's list replaces the stored one.
    Replace,
    /// `patchStrategy:"merge"` with a `patchMergeKey`; the elements have type `Ty`.
    MergeBy(&'static str, Ty),
    /// `patchStrategy:"merge"` on a list of primitives: a set union.
    PrimitiveMerge,
}

fn root_type(kind: &str) -> Ty {
    match kind {
        "Pod" | "Node" | "Service" | "Namespace" | "Deployment" | "DaemonSet"
        | "ServiceAccount" => Ty::Root(match kind {
            "Pod" => "Pod",
            "Node" => "Node",
            "Service" => "Service",
            "Namespace" => "Namespace",
            "Deployment" => "Deployment",
            "DaemonSet" => "DaemonSet",
            _ => "ServiceAccount",
        }),
        _ => Ty::Root("Other"),
    }
}

/// The type of a map-valued field.
fn field_type(ty: Ty, field: &str) -> Ty {
    match (ty, field) {
        (Ty::Root(_), "metadata") | (Ty::PodTemplateSpec, "metadata") => Ty::ObjectMeta,
        (Ty::Root("Pod"), "spec") | (Ty::PodTemplateSpec, "spec") => Ty::PodSpec,
        (Ty::Root("Pod"), "status") => Ty::PodStatus,
        (Ty::Root("Node"), "spec") => Ty::NodeSpec,
        (Ty::Root("Node"), "status") => Ty::NodeStatus,
        (Ty::Root("Service"), "spec") => Ty::ServiceSpec,
        (Ty::Root("Service" | "Namespace" | "Deployment" | "DaemonSet"), "status") => {
            Ty::ConditionsStatus
        }
        (Ty::Root("Deployment" | "DaemonSet"), "spec") => Ty::WorkloadSpec,
        (Ty::WorkloadSpec, "template") => Ty::PodTemplateSpec,
        _ => Ty::Other,
    }
}

/// The strategy of a list-valued field (`k8s.io/api/core/v1/types.go` and friends).
fn list_strategy(ty: Ty, field: &str) -> ListStrategy {
    use ListStrategy::{MergeBy, PrimitiveMerge, Replace};
    match (ty, field) {
        (Ty::ObjectMeta, "finalizers") => PrimitiveMerge,
        (Ty::ObjectMeta, "ownerReferences") => MergeBy("uid", Ty::Other),
        (Ty::PodSpec, "containers" | "initContainers" | "ephemeralContainers") => {
            MergeBy("name", Ty::Container)
        }
        (Ty::PodSpec, "volumes") => MergeBy("name", Ty::Volume),
        (Ty::PodSpec, "imagePullSecrets" | "schedulingGates" | "resourceClaims") => {
            MergeBy("name", Ty::Other)
        }
        (Ty::PodSpec, "hostAliases") => MergeBy("ip", Ty::Other),
        (Ty::PodSpec, "topologySpreadConstraints") => MergeBy("topologyKey", Ty::Other),
        (Ty::Container, "ports") => MergeBy("containerPort", Ty::Other),
        (Ty::Container, "env") => MergeBy("name", Ty::Other),
        (Ty::Container, "volumeMounts") => MergeBy("mountPath", Ty::Other),
        (Ty::Container, "volumeDevices") => MergeBy("devicePath", Ty::Other),
        (Ty::PodStatus, "conditions") => MergeBy("type", Ty::Other),
        (Ty::PodStatus, "podIPs" | "hostIPs") => MergeBy("ip", Ty::Other),
        (Ty::PodStatus, "resourceClaimStatuses") => MergeBy("name", Ty::Other),
        (Ty::NodeSpec, "podCIDRs") => PrimitiveMerge,
        (Ty::NodeStatus, "conditions" | "addresses") => MergeBy("type", Ty::Other),
        (Ty::ServiceSpec, "ports") => MergeBy("port", Ty::Other),
        (Ty::ConditionsStatus, "conditions") => MergeBy("type", Ty::Other),
        (Ty::Root("ServiceAccount"), "secrets") => MergeBy("name", Ty::Other),
        _ => Replace,
    }
}

fn failed(msg: impl Into<String>) -> PatchError {
    PatchError::Failed(msg.into())
}

/// Applies a strategic merge patch (`strategicpatch.StrategicMergeMapPatch`) to an object
/// of a served kind: `$patch: replace|delete|merge` on maps and list elements,
/// `$setElementOrder/<list>`, `$retainKeys`, `$deleteFromPrimitiveList/<list>`, null to
/// delete, merge keys per field.
fn strategic_object(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let kind = target
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    strategic_merge(target, patch, root_type(&kind))
}

fn strategic_merge(target: &mut Value, patch: &Value, ty: Ty) -> Result<(), PatchError> {
    let Some(pm) = patch.as_object() else {
        *target = patch.clone();
        return Ok(());
    };
    match pm.get("$patch").map(|v| v.as_str()) {
        None | Some(Some("merge")) => {}
        Some(Some("replace")) => {
            let mut replaced = Value::Object(Map::new());
            let mut rest = pm.clone();
            rest.remove("$patch");
            strategic_merge(&mut replaced, &Value::Object(rest), ty)?;
            *target = replaced;
            return Ok(());
        }
        Some(Some("delete")) => {
            *target = Value::Null;
            return Ok(());
        }
        Some(other) => {
            return Err(failed(format!(
                "unknown patch type: {} in map: {}",
                other.unwrap_or("(not a string)"),
                patch
            )));
        }
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let retain: Option<Vec<String>> = match pm.get("$retainKeys") {
        None => None,
        Some(Value::Array(keys)) => Some(
            keys.iter()
                .map(|k| {
                    k.as_str()
                        .map(String::from)
                        .ok_or_else(|| failed("$retainKeys must be a list of strings"))
                })
                .collect::<Result<_, _>>()?,
        ),
        Some(_) => return Err(failed("$retainKeys must be a list of strings")),
    };
    let tm = target.as_object_mut().expect("made an object above");
    let mut orders: Vec<(&str, &Vec<Value>)> = Vec::new();
    for (k, v) in pm {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let remove = v
                .as_array()
                .ok_or_else(|| failed(format!("{k}: the value must be a list")))?;
            if let Some(list) = tm.get_mut(field).and_then(Value::as_array_mut) {
                list.retain(|x| !remove.contains(x));
            }
            continue;
        }
        if let Some(field) = k.strip_prefix("$setElementOrder/") {
            let order = v
                .as_array()
                .ok_or_else(|| failed(format!("{k}: the value must be a list")))?;
            orders.push((field, order));
            continue;
        }
        if matches!(k.as_str(), "$patch" | "$retainKeys") {
            continue;
        }
        if k.starts_with('$') {
            return Err(failed(format!("unknown patch directive {k}")));
        }
        if v.is_null() {
            tm.remove(k);
            continue;
        }
        match v {
            Value::Object(_) => {
                let slot = tm.entry(k.clone()).or_insert(Value::Null);
                strategic_merge(slot, v, field_type(ty, k))?;
                if slot.is_null() {
                    tm.remove(k);
                }
            }
            Value::Array(items) => {
                let slot = tm.entry(k.clone()).or_insert(Value::Array(Vec::new()));
                merge_list(slot, items, list_strategy(ty, k), k)?;
            }
            _ => {
                tm.insert(k.clone(), v.clone());
            }
        }
    }
    for (field, order) in orders {
        let key = match list_strategy(ty, field) {
            ListStrategy::MergeBy(key, _) => Some(key),
            _ => None,
        };
        if let Some(list) = tm.get_mut(field).and_then(Value::as_array_mut) {
            set_element_order(list, order, key);
        }
    }
    if let Some(keep) = retain {
        tm.retain(|k, _| keep.iter().any(|r| r == k));
    }
    Ok(())
}

/// Orders `list` by `order` (`$setElementOrder`): the elements it names first, in its
/// order, then the rest in their merged order.
fn set_element_order(list: &mut Vec<Value>, order: &[Value], key: Option<&str>) {
    let id = |v: &Value| -> Value {
        match key {
            Some(k) => v.get(k).cloned().unwrap_or(Value::Null),
            None => v.clone(),
        }
    };
    let mut rest = std::mem::take(list);
    for o in order {
        let want = id(o);
        if let Some(i) = rest.iter().position(|x| id(x) == want) {
            list.push(rest.remove(i));
        }
    }
    list.extend(rest);
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

fn merge_list(
    target: &mut Value,
    items: &[Value],
    strategy: ListStrategy,
    field: &str,
) -> Result<(), PatchError> {
    // `{"$patch": "replace"}` as an element replaces the whole list with the others.
    let replace_all = items
        .iter()
        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"));
    match strategy {
        ListStrategy::Replace => {
            *target = Value::Array(
                items
                    .iter()
                    .filter(|i| i.get("$patch").is_none())
                    .map(strip_directives)
                    .collect(),
            );
        }
        ListStrategy::PrimitiveMerge => {
            if replace_all || !target.is_array() {
                *target = Value::Array(Vec::new());
            }
            let list = target.as_array_mut().expect("made an array above");
            for i in items.iter().filter(|i| !i.is_object()) {
                if !list.contains(i) {
                    list.push(i.clone());
                }
            }
        }
        ListStrategy::MergeBy(key, elem) => {
            if replace_all || !target.is_array() {
                *target = Value::Array(Vec::new());
            }
            let list = target.as_array_mut().expect("made an array above");
            for item in items {
                if item.get("$patch").and_then(Value::as_str) == Some("replace")
                    && item.as_object().is_some_and(|m| m.len() == 1)
                {
                    continue;
                }
                let Some(kv) = item.get(key) else {
                    return Err(failed(format!(
                        "map: {item} does not contain declared merge key: {key} (list {field})"
                    )));
                };
                let pos = list.iter().position(|x| x.get(key) == Some(kv));
                let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
                match (pos, delete) {
                    (Some(i), true) => {
                        list.remove(i);
                    }
                    (None, true) => {}
                    (Some(i), false) => strategic_merge(&mut list[i], item, elem)?,
                    (None, false) => {
                        let mut fresh = Value::Object(Map::new());
                        strategic_merge(&mut fresh, item, elem)?;
                        list.push(fresh);
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every list kube-apiserver merges by key, as `patchMergeKey` tags it in
    /// `k8s.io/api`: a strategic patch naming one element by its key changes that one and
    /// keeps its sibling (a list treated as atomic would lose the sibling).
    #[test]
    fn every_keyed_list_merges_by_its_key() {
        type Wrap = fn(Value) -> Value;
        let cases: &[(&str, &str, Value, Value, Wrap)] = &[
            (
                "ownerReferences",
                "uid",
                json!("u1"),
                json!("u2"),
                |l| json!({"kind": "Pod", "metadata": {"ownerReferences": l}}),
            ),
            (
                "pod volumes",
                "name",
                json!("v1"),
                json!("v2"),
                |l| json!({"kind": "Pod", "spec": {"volumes": l}}),
            ),
            (
                "hostAliases",
                "ip",
                json!("10.0.0.1"),
                json!("10.0.0.2"),
                |l| json!({"kind": "Pod", "spec": {"hostAliases": l}}),
            ),
            (
                "topologySpreadConstraints",
                "topologyKey",
                json!("zone"),
                json!("host"),
                |l| json!({"kind": "Pod", "spec": {"topologySpreadConstraints": l}}),
            ),
            (
                "volumeMounts",
                "mountPath",
                json!("/a"),
                json!("/b"),
                |l| json!({"kind": "Pod", "spec": {"containers": [{"name": "c", "volumeMounts": l}]}}),
            ),
            (
                "volumeDevices",
                "devicePath",
                json!("/dev/a"),
                json!("/dev/b"),
                |l| json!({"kind": "Pod", "spec": {"containers": [{"name": "c", "volumeDevices": l}]}}),
            ),
            (
                "container ports",
                "containerPort",
                json!(80),
                json!(443),
                |l| json!({"kind": "Pod", "spec": {"containers": [{"name": "c", "ports": l}]}}),
            ),
            (
                "pod conditions",
                "type",
                json!("Ready"),
                json!("Initialized"),
                |l| json!({"kind": "Pod", "status": {"conditions": l}}),
            ),
            (
                "resourceClaimStatuses",
                "name",
                json!("r1"),
                json!("r2"),
                |l| json!({"kind": "Pod", "status": {"resourceClaimStatuses": l}}),
            ),
            (
                "node addresses",
                "type",
                json!("InternalIP"),
                json!("ExternalIP"),
                |l| json!({"kind": "Node", "status": {"addresses": l}}),
            ),
            (
                "service ports",
                "port",
                json!(80),
                json!(443),
                |l| json!({"kind": "Service", "spec": {"ports": l}}),
            ),
            (
                "service conditions",
                "type",
                json!("A"),
                json!("B"),
                |l| json!({"kind": "Service", "status": {"conditions": l}}),
            ),
            (
                "namespace conditions",
                "type",
                json!("A"),
                json!("B"),
                |l| json!({"kind": "Namespace", "status": {"conditions": l}}),
            ),
            (
                "deployment conditions",
                "type",
                json!("A"),
                json!("B"),
                |l| json!({"kind": "Deployment", "status": {"conditions": l}}),
            ),
            (
                "daemonset conditions",
                "type",
                json!("A"),
                json!("B"),
                |l| json!({"kind": "DaemonSet", "status": {"conditions": l}}),
            ),
            (
                "daemonset template containers",
                "name",
                json!("a"),
                json!("b"),
                |l| json!({"kind": "DaemonSet", "spec": {"template": {"spec": {"containers": l}}}}),
            ),
            (
                "serviceaccount secrets",
                "name",
                json!("s1"),
                json!("s2"),
                |l| json!({"kind": "ServiceAccount", "secrets": l}),
            ),
        ];
        for (what, key, first, second, wrap) in cases {
            let target = wrap(json!([
                {*key: first, "x": "old"},
                {*key: second, "x": "kept"},
            ]));
            let patch = wrap(json!([{*key: first, "x": "new"}]));
            let out = apply(PatchKind::Strategic, &target, patch.to_string().as_bytes())
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let want = wrap(json!([
                {*key: first, "x": "new"},
                {*key: second, "x": "kept"},
            ]));
            assert_eq!(out, want, "{what} must merge by {key}");
        }
    }

    #[test]
    fn primitive_lists_merge_as_a_union_and_start_when_missing() {
        // `mergeSlice` of scalars: the original's values, then the patch's new ones.
        let t = json!({"kind": "Pod", "metadata": {"finalizers": ["a", "b"]}});
        let out = smp(t, json!({"metadata": {"finalizers": ["b", "c"]}})).unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b", "c"]));
        // A list the object does not have yet is the patch's.
        let bare = json!({"kind": "Pod", "metadata": {"name": "p"}});
        let out = smp(bare, json!({"metadata": {"finalizers": ["x"]}})).unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["x"]));
        // So is one stored as null (`mergeMap`: a value of another type is replaced).
        let null = json!({"kind": "Pod", "metadata": {"name": "p", "finalizers": null}});
        let out = smp(null, json!({"metadata": {"finalizers": ["x"]}})).unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["x"]));
        let node = json!({"kind": "Node", "metadata": {"name": "n"}, "spec": {}});
        let out = smp(node, json!({"spec": {"podCIDRs": ["10.0.0.0/24"]}})).unwrap();
        assert_eq!(out["spec"]["podCIDRs"], json!(["10.0.0.0/24"]));
    }

    #[test]
    fn delete_from_primitive_list_removes_only_the_named_values() {
        let t = json!({"kind": "Pod", "metadata": {"finalizers": ["a", "b", "c"]}});
        let p = br#"{"metadata": {"$deleteFromPrimitiveList/finalizers": ["b"]}}"#;
        let out = apply(PatchKind::Strategic, &t, p).unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "c"]));
    }

    #[test]
    fn merge_patch_replaces_lists_and_deletes_nulls() {
        let t = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "status": {"addresses": [{"type": "A"}, {"type": "B"}]}});
        let p =
            br#"{"metadata": {"labels": {"a": null}}, "status": {"addresses": [{"type": "C"}]}}"#;
        let out = apply(PatchKind::Merge, &t, p).unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"b": "2"}));
        assert_eq!(out["status"]["addresses"], json!([{"type": "C"}]));
    }

    #[test]
    fn json_patch_ops_and_failures() {
        let t = json!({"spec": {"unschedulable": false}});
        let ok = br#"[{"op": "test", "path": "/spec/unschedulable", "value": false},
                      {"op": "replace", "path": "/spec/unschedulable", "value": true}]"#;
        assert_eq!(
            apply(PatchKind::Json, &t, ok).unwrap()["spec"]["unschedulable"],
            true
        );
        let bad = br#"[{"op": "test", "path": "/spec/unschedulable", "value": true}]"#;
        assert!(matches!(
            apply(PatchKind::Json, &t, bad),
            Err(PatchError::Failed(_))
        ));
        assert!(matches!(
            apply(PatchKind::Json, &t, b"{"),
            Err(PatchError::Malformed(_))
        ));
    }

    #[test]
    fn strategic_merge_keys_addresses_by_type() {
        let t = json!({"kind": "Node", "status": {"addresses": [
            {"type": "InternalIP", "address": "10.0.0.1"},
            {"type": "Hostname", "address": "n1"}]}});
        let p = br#"{"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.5"}]}}"#;
        let out = apply(PatchKind::Strategic, &t, p).unwrap();
        assert_eq!(
            out["status"]["addresses"],
            json!([
            {"type": "InternalIP", "address": "127.0.0.5"},
            {"type": "Hostname", "address": "n1"}])
        );
    }

    #[test]
    fn strategic_merge_containers_conditions_and_directives() {
        let t = json!({"kind": "Pod", "metadata": {"finalizers": ["a"]},
            "spec": {"containers": [{"name": "c", "image": "old"}, {"name": "d", "image": "x"}],
                     "tolerations": [{"key": "k"}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}});
        let p = json!({"metadata": {"finalizers": ["b"]},
            "spec": {"containers": [{"name": "c", "image": "new"}, {"name": "d", "$patch": "delete"}],
                     "tolerations": [{"key": "j"}], "$setElementOrder/containers": [{"name": "c"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let out = apply(PatchKind::Strategic, &t, p.to_string().as_bytes()).unwrap();
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "c", "image": "new"}])
        );
        assert_eq!(out["spec"]["tolerations"], json!([{"key": "j"}]));
        assert_eq!(out["status"]["conditions"][0]["status"], "True");
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b"]));
        assert!(out["spec"].get("$setElementOrder/containers").is_none());
    }

    fn smp(t: Value, p: Value) -> Result<Value, PatchError> {
        apply(PatchKind::Strategic, &t, p.to_string().as_bytes())
    }

    #[test]
    fn strategic_delete_of_one_scheduling_gate_removes_only_it() {
        let t = json!({"kind": "Pod", "spec": {"schedulingGates": [{"name": "a"}, {"name": "b"}]}});
        let out = smp(
            t,
            json!({"spec": {"schedulingGates": [{"name": "a", "$patch": "delete"}]}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["schedulingGates"], json!([{"name": "b"}]));
    }

    #[test]
    fn strategic_lists_follow_the_declared_merge_keys() {
        let pod = json!({"kind": "Pod", "spec": {
                "tolerations": [{"key": "a"}],
                "containers": [{"name": "c", "ports": [{"containerPort": 80, "name": "http"}],
                    "env": [{"name": "A", "value": "1"}]}]},
            "status": {"podIPs": [{"ip": "10.0.0.1"}], "hostIPs": [{"ip": "192.0.2.1"}]}});
        let out = smp(pod, json!({"spec": {"tolerations": [{"key": "b"}],
                "containers": [{"name": "c", "ports": [{"containerPort": 443}], "env": [{"name": "B", "value": "2"}]}]},
            "status": {"podIPs": [{"ip": "fd00::1"}], "hostIPs": [{"ip": "192.0.2.1", "$patch": "delete"}]}})).unwrap();
        // Tolerations carry no patch strategy in k8s.io/api: replaced.
        assert_eq!(out["spec"]["tolerations"], json!([{"key": "b"}]));
        let c = &out["spec"]["containers"][0];
        assert_eq!(c["ports"].as_array().unwrap().len(), 2);
        assert_eq!(c["env"].as_array().unwrap().len(), 2);
        assert_eq!(
            out["status"]["podIPs"],
            json!([{"ip": "10.0.0.1"}, {"ip": "fd00::1"}])
        );
        assert_eq!(out["status"]["hostIPs"], json!([]));
        let node = json!({"kind": "Node", "spec": {"podCIDRs": ["10.1.0.0/24"], "taints": [{"key": "a", "effect": "NoSchedule"}]}});
        let out = smp(node, json!({"spec": {"podCIDRs": ["fd00:1::/64"], "taints": [{"key": "b", "effect": "NoSchedule"}]}})).unwrap();
        assert_eq!(
            out["spec"]["podCIDRs"],
            json!(["10.1.0.0/24", "fd00:1::/64"])
        );
        assert_eq!(
            out["spec"]["taints"],
            json!([{"key": "b", "effect": "NoSchedule"}])
        );
        // The same field name under another kind has no strategy.
        let cm = json!({"kind": "ConfigMap", "data": {"containers": "x"}});
        assert!(smp(cm, json!({"data": {"y": "z"}})).is_ok());
        // Deployments merge their pod template's containers by name.
        let d = json!({"kind": "Deployment", "spec": {"template": {"spec": {"containers": [{"name": "a", "image": "1"}]}}}});
        let out = smp(
            d,
            json!({"spec": {"template": {"spec": {"containers": [{"name": "b", "image": "2"}]}}}}),
        )
        .unwrap();
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn strategic_directives_replace_retain_and_order() {
        let pod = json!({"kind": "Pod", "spec": {
            "containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
            "volumes": [{"name": "v", "hostPath": {"path": "/x"}}],
            "affinity": {"nodeAffinity": {"x": 1}},
            "nodeSelector": {"a": "1", "b": "2"}}});
        let out = smp(
            pod.clone(),
            json!({"spec": {
            "$setElementOrder/containers": [{"name": "c"}, {"name": "a"}, {"name": "b"}],
            "containers": [{"name": "a", "image": "i"}],
            "volumes": [{"name": "v", "$retainKeys": ["name", "emptyDir"], "emptyDir": {}}],
            "affinity": {"$patch": "delete"},
            "nodeSelector": {"$patch": "replace", "c": "3"}}}),
        )
        .unwrap();
        let names: Vec<&str> = out["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["c", "a", "b"]);
        assert_eq!(out["spec"]["containers"][1]["image"], "i");
        assert_eq!(
            out["spec"]["volumes"],
            json!([{"name": "v", "emptyDir": {}}])
        );
        assert!(out["spec"].get("affinity").is_none());
        assert_eq!(out["spec"]["nodeSelector"], json!({"c": "3"}));
        // `{"$patch": "replace"}` in a merging list replaces the whole list.
        let out = smp(
            pod.clone(),
            json!({"spec": {"containers": [{"name": "z"}, {"$patch": "replace"}]}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["containers"], json!([{"name": "z"}]));
        // An element without its merge key, or an unknown directive, is refused.
        assert!(matches!(
            smp(
                pod.clone(),
                json!({"spec": {"containers": [{"image": "x"}]}})
            ),
            Err(PatchError::Failed(_))
        ));
        assert!(matches!(
            smp(pod.clone(), json!({"spec": {"$nonsense": 1}})),
            Err(PatchError::Failed(_))
        ));
        assert!(matches!(
            smp(pod, json!({"spec": {"$patch": "explode"}})),
            Err(PatchError::Failed(_))
        ));
    }

    #[test]
    fn unsupported_types_are_named() {
        assert_eq!(
            PatchKind::from_content_type("application/apply-patch+yaml"),
            Err(PatchError::Unsupported(
                "application/apply-patch+yaml".into()
            ))
        );
        assert_eq!(
            PatchKind::from_content_type("application/merge-patch+json; charset=utf-8"),
            Ok(PatchKind::Merge)
        );
    }
}
