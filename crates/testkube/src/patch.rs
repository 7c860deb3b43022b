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
            strategic_merge(&mut out, &p, &mut Vec::new());
        }
    }
    Ok(out)
}

/// How a list at a path merges under a strategic merge patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListStrategy {
    Replace,
    MergeBy(&'static str),
    /// A list of primitives merged as a set (finalizers).
    PrimitiveUnion,
}

/// The `patchMergeKey`s of the Kubernetes types this project patches, by path suffix.
fn list_strategy(path: &[String]) -> ListStrategy {
    let last = path.last().map(String::as_str).unwrap_or("");
    let parent = path
        .len()
        .checked_sub(2)
        .map(|i| path[i].as_str())
        .unwrap_or("");
    match (parent, last) {
        ("status", "addresses") => ListStrategy::MergeBy("type"),
        (_, "conditions") => ListStrategy::MergeBy("type"),
        (_, "containers" | "initContainers" | "ephemeralContainers") => {
            ListStrategy::MergeBy("name")
        }
        (_, "env" | "volumes" | "imagePullSecrets") => ListStrategy::MergeBy("name"),
        (_, "volumeMounts") => ListStrategy::MergeBy("mountPath"),
        ("containers" | "initContainers", "ports") => ListStrategy::MergeBy("containerPort"),
        ("spec", "ports") => ListStrategy::MergeBy("port"),
        ("metadata", "ownerReferences") => ListStrategy::MergeBy("uid"),
        (_, "hostAliases") => ListStrategy::MergeBy("ip"),
        (_, "topologySpreadConstraints") => ListStrategy::MergeBy("topologyKey"),
        ("metadata", "finalizers") => ListStrategy::PrimitiveUnion,
        _ => ListStrategy::Replace,
    }
}

fn strategic_merge(target: &mut Value, patch: &Value, path: &mut Vec<String>) {
    let Some(pm) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if pm.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut replaced = pm.clone();
        replaced.remove("$patch");
        *target = Value::Object(strip_directives(replaced));
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let tm = target.as_object_mut().expect("made an object above");
    for (k, v) in pm {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(list), Some(remove)) = (
                tm.get_mut(field).and_then(Value::as_array_mut),
                v.as_array(),
            ) {
                list.retain(|x| !remove.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            // $setElementOrder and $retainKeys only order or prune; the result is the
            // same set of fields for the objects this double serves.
            continue;
        }
        if v.is_null() {
            tm.remove(k);
            continue;
        }
        path.push(k.clone());
        match v {
            Value::Object(_) => {
                let slot = tm.entry(k.clone()).or_insert(Value::Null);
                strategic_merge(slot, v, path);
            }
            Value::Array(items) => {
                let slot = tm.entry(k.clone()).or_insert(Value::Array(Vec::new()));
                merge_list(slot, items, list_strategy(path), path);
            }
            _ => {
                tm.insert(k.clone(), v.clone());
            }
        }
        path.pop();
    }
}

fn strip_directives(mut m: Map<String, Value>) -> Map<String, Value> {
    m.retain(|k, _| !k.starts_with('$'));
    m
}

fn merge_list(target: &mut Value, items: &[Value], strategy: ListStrategy, path: &mut Vec<String>) {
    match strategy {
        ListStrategy::Replace => {
            *target = Value::Array(
                items
                    .iter()
                    .map(|i| match i {
                        Value::Object(m) => Value::Object(strip_directives(m.clone())),
                        other => other.clone(),
                    })
                    .collect(),
            );
        }
        ListStrategy::PrimitiveUnion => {
            if !target.is_array() {
                *target = Value::Array(Vec::new());
            }
            let list = target.as_array_mut().expect("made an array above");
            for i in items {
                if !list.contains(i) {
                    list.push(i.clone());
                }
            }
        }
        ListStrategy::MergeBy(key) => {
            if !target.is_array() {
                *target = Value::Array(Vec::new());
            }
            let list = target.as_array_mut().expect("made an array above");
            for item in items {
                let Some(kv) = item.get(key) else {
                    list.push(item.clone());
                    continue;
                };
                let pos = list.iter().position(|x| x.get(key) == Some(kv));
                let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
                match (pos, delete) {
                    (Some(i), true) => {
                        list.remove(i);
                    }
                    (None, true) => {}
                    (Some(i), false) => strategic_merge(&mut list[i], item, path),
                    (None, false) => {
                        let mut fresh = Value::Object(Map::new());
                        strategic_merge(&mut fresh, item, path);
                        list.push(fresh);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
        let t = json!({"status": {"addresses": [
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
        let t = json!({"metadata": {"finalizers": ["a"]},
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
