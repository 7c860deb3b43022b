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

/// Applies a strategic merge patch (`strategicpatch.StrategicMergeMapPatch` in
/// `staging/src/k8s.io/apimachinery/pkg/util/strategicpatch/patch.go`) to an object of a
/// served kind: `$patch: replace|delete` on maps and `$patch: replace|delete` elements in
/// lists merged by key, `$setElementOrder/<list>`, `$retainKeys`,
/// `$deleteFromPrimitiveList/<list>`, null to delete, merge keys per field, and the
/// element order `normalizeElementOrder` gives.
///
/// Where `strategicpatch` fails with a plain Go error, kube-apiserver answers 500 with
/// that message; the double answers 422 ([`PatchError::Failed`]) with the same message
/// (a refusal either way). Where kube-apiserver would keep a `$patch` directive as list
/// data, the double refuses with 422 naming it.
fn strategic_object(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let kind = target
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    strategic_merge(target, patch, root_type(&kind))
}

const SET_ORDER: &str = "$setElementOrder";
const DELETE_PRIMITIVE: &str = "$deleteFromPrimitiveList";

/// `extractKey`: the field a `$setElementOrder/<field>` or
/// `$deleteFromPrimitiveList/<field>` key names (400 when the form is wrong).
fn directive_field<'a>(key: &'a str, prefix: &str) -> Result<&'a str, PatchError> {
    match key.split_once('/') {
        Some((p, field)) if p == prefix => Ok(field),
        _ if prefix == SET_ORDER => Err(PatchError::Malformed(
            "invalid patch format of setElementOrder list".into(),
        )),
        _ => Err(PatchError::Malformed(
            "invalid patch format of primitive list".into(),
        )),
    }
}

/// A stored list as `strategicpatch` sees it: a missing, null or empty list is absent
/// (`ToUnstructured` omits empty `omitempty` slices).
fn present_list(v: Option<&Value>) -> Option<&Vec<Value>> {
    v.and_then(Value::as_array).filter(|a| !a.is_empty())
}

/// `mergeMap`.
fn strategic_merge(target: &mut Value, patch: &Value, ty: Ty) -> Result<(), PatchError> {
    let Some(pm) = patch.as_object() else {
        *target = patch.clone();
        return Ok(());
    };
    // `handleDirectiveInMergeMap`: replace takes the rest of the map as it is (nested
    // directives included, not merged); delete leaves an empty map; anything else,
    // `merge` too, is an error.
    if let Some(d) = pm.get("$patch") {
        return match d.as_str() {
            Some("replace") => {
                let mut rest = pm.clone();
                rest.remove("$patch");
                *target = Value::Object(rest);
                Ok(())
            }
            Some("delete") => {
                *target = Value::Object(Map::new());
                Ok(())
            }
            _ => Err(failed(format!("unknown patch type: {d} in map: {patch}"))),
        };
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let tm = target.as_object_mut().expect("made an object above");
    // `applyRetainKeysDirective`: every key the patch sets must be retained; the stored
    // keys not retained go before the merge.
    if let Some(rk) = pm.get("$retainKeys") {
        let bad = || PatchError::Malformed("invalid patch format of retainKeys".into());
        let keep: Vec<&str> = rk
            .as_array()
            .ok_or_else(bad)?
            .iter()
            .map(|k| k.as_str().ok_or_else(bad))
            .collect::<Result<_, _>>()?;
        for (k, v) in pm {
            if v.is_null()
                || k == "$retainKeys"
                || k.starts_with(DELETE_PRIMITIVE)
                || k.starts_with(SET_ORDER)
            {
                continue;
            }
            if !keep.contains(&k.as_str()) {
                return Err(bad());
            }
        }
        tm.retain(|k, _| keep.contains(&k.as_str()));
    }
    // `mergePatchIntoOriginal`: each list with a `$setElementOrder` is merged and ordered
    // first, then left out of the loop below.
    let mut done: Vec<&str> = Vec::new();
    for (k, v) in pm.iter().filter(|(k, _)| k.starts_with(SET_ORDER)) {
        let field = directive_field(k, SET_ORDER)?;
        let order = v
            .as_array()
            .ok_or_else(|| failed(format!("{k}: the value must be a list, got {v}")))?;
        let strategy = list_strategy(ty, field);
        let key = strategy.key();
        let patch_list = match pm.get(field) {
            None => None,
            Some(Value::Array(a)) => Some(a),
            Some(other) => return Err(failed(format!("{field}: expected a list, got {other}"))),
        };
        check_order_list(patch_list.map_or(&[][..], |l| l), order, key)?;
        let original = present_list(tm.get(field)).cloned();
        let merged = match (&original, patch_list) {
            (Some(o), None) => o.clone(),
            (None, Some(p)) => match remove_directives(Value::Array(p.clone())) {
                Some(Value::Array(a)) => a,
                _ => Vec::new(),
            },
            (Some(o), Some(p)) => merge_list(o, p, strategy, field)?,
            (None, None) => continue,
        };
        let (in_order, rest) = partition(merged, order, key);
        let all = normalize_order(
            in_order,
            rest,
            order,
            original.as_deref().unwrap_or(&[]),
            key,
        );
        tm.insert(field.to_string(), Value::Array(all));
        done.push(field);
    }
    for (k, v) in pm {
        if k == "$retainKeys" || k.starts_with(SET_ORDER) || done.contains(&k.as_str()) {
            continue;
        }
        if k.starts_with(DELETE_PRIMITIVE) {
            let field = directive_field(k, DELETE_PRIMITIVE)?;
            delete_from_list(tm, field, v)?;
            continue;
        }
        if k.starts_with('$') {
            return Err(failed(format!(
                "unknown patch directive {k} (this API double supports $patch, $retainKeys, $setElementOrder/<list> and $deleteFromPrimitiveList/<list>)"
            )));
        }
        if v.is_null() {
            tm.remove(k);
            continue;
        }
        let same_type = tm.get(k).is_some_and(|cur| {
            json_kind(cur) == json_kind(v) && present_list(Some(cur)).is_some() == v.is_array()
        });
        if !same_type {
            // Not in the stored object (or of another type): the patch's value without
            // nulls and without any map that carries a `$patch` directive.
            let mut fresh = v.clone();
            discard_nulls(&mut fresh);
            match remove_directives(fresh) {
                Some(x) => tm.insert(k.clone(), x),
                None => tm.remove(k),
            };
            continue;
        }
        match v {
            Value::Object(_) => {
                let slot = tm.get_mut(k).expect("checked above");
                strategic_merge(slot, v, field_type(ty, k))?;
            }
            Value::Array(items) => {
                let cur = tm.get(k).and_then(Value::as_array).expect("checked above");
                let merged = merge_list(cur, items, list_strategy(ty, k), k)?;
                tm.insert(k.clone(), Value::Array(merged));
            }
            _ => {
                tm.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(())
}

/// The JSON kind of a value, standing in for the Go type `strategicpatch` compares.
fn json_kind(v: &Value) -> u8 {
    match v {
        Value::Null => 0,
        Value::Bool(_) => 1,
        Value::Number(n) if n.is_f64() => 2,
        Value::Number(_) => 3,
        Value::String(_) => 4,
        Value::Array(_) => 5,
        Value::Object(_) => 6,
    }
}

/// `discardNullValuesFromPatch`: nulls in maps carry no meaning for a new value.
fn discard_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            m.values_mut().for_each(discard_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(discard_nulls),
        _ => {}
    }
}

/// `removeDirectives`: drops every map that carries `$patch` (None when `v` is one).
fn remove_directives(v: Value) -> Option<Value> {
    match v {
        Value::Object(m) if m.contains_key("$patch") => None,
        Value::Object(m) => Some(Value::Object(
            m.into_iter()
                .filter_map(|(k, x)| remove_directives(x).map(|x| (k, x)))
                .collect(),
        )),
        Value::Array(a) => Some(Value::Array(
            a.into_iter().filter_map(remove_directives).collect(),
        )),
        other => Some(other),
    }
}

/// `$deleteFromPrimitiveList/<field>` (any list of primitives, with or without a merge
/// strategy, as `mergeSliceHandler` treats delete lists since Kubernetes 1.25).
fn delete_from_list(tm: &mut Map<String, Value>, field: &str, v: &Value) -> Result<(), PatchError> {
    if v.is_null() {
        tm.remove(field);
        return Ok(());
    }
    let Some(cur) = tm.get(field).and_then(Value::as_array) else {
        return Ok(());
    };
    let remove = v.as_array().ok_or_else(|| {
        failed(format!(
            "{DELETE_PRIMITIVE}/{field}: the value must be a list, got {v}"
        ))
    })?;
    if cur.is_empty() && remove.is_empty() {
        return Ok(());
    }
    let kind = element_kind(cur, remove, field)?;
    if kind == json_kind(&Value::Object(Map::new())) {
        return Err(failed(format!(
            "{DELETE_PRIMITIVE}/{field}: {field} is a list of objects; delete its elements with {{\"$patch\": \"delete\"}} and the merge key"
        )));
    }
    let kept: Vec<Value> = cur
        .iter()
        .filter(|x| !remove.contains(x))
        .cloned()
        .collect();
    tm.insert(field.to_string(), Value::Array(kept));
    Ok(())
}

/// `sliceElementType`: all elements of both lists have one type, not a list.
fn element_kind(original: &[Value], patch: &[Value], field: &str) -> Result<u8, PatchError> {
    let mut kinds = original.iter().chain(patch).map(json_kind);
    let Some(first) = kinds.next() else {
        return Err(failed("no elements in any of the given slices"));
    };
    if first == 5 {
        return Err(failed("lists of lists are not supported"));
    }
    if kinds.all(|k| k == first) {
        return Ok(first);
    }
    let directive = patch
        .iter()
        .find(|i| i.get("$patch").is_some())
        .map(|d| {
            format!(
                "; {d} in {field}, a list of primitives, is not a directive kube-apiserver knows there (it answers 500 with this message): to replace the list send it whole in a JSON merge patch, to remove values use {DELETE_PRIMITIVE}/{field}"
            )
        })
        .unwrap_or_default();
    Err(failed(format!(
        "list element types are not identical: {} and {} (list {field}){directive}",
        Value::Array(original.to_vec()),
        Value::Array(patch.to_vec()),
    )))
}

/// `validatePatchWithSetOrderList`: the patch list's elements (deletions aside) appear
/// in the `$setElementOrder` list, in its relative order.
fn check_order_list(patch: &[Value], order: &[Value], key: Option<&str>) -> Result<(), PatchError> {
    if patch.is_empty() || order.is_empty() {
        return Ok(());
    }
    let live: Vec<&Value> = patch
        .iter()
        .filter(|i| key.is_none() || i.get("$patch").and_then(Value::as_str) != Some("delete"))
        .collect();
    let (mut p, mut o) = (0, 0);
    while p < live.len() && o < order.len() {
        if live[p].get("$patch").is_some() {
            p += 1;
            continue;
        }
        let equal = match key {
            None => live[p] == &order[o],
            Some(k) => {
                let (a, b) = (live[p].get(k), order[o].get(k));
                if a.is_none() || b.is_none() {
                    return Err(no_merge_key(
                        if a.is_none() { live[p] } else { &order[o] },
                        k,
                    ));
                }
                a == b
            }
        };
        if equal {
            p += 1;
        }
        o += 1;
    }
    if p < live.len() {
        return Err(failed(format!(
            "the order in patch list:\n{}\n doesn't match {SET_ORDER} list:\n{}",
            Value::Array(patch.to_vec()),
            Value::Array(order.to_vec())
        )));
    }
    Ok(())
}

fn no_merge_key(item: &Value, key: &str) -> PatchError {
    failed(format!(
        "map: {item} does not contain declared merge key: {key}"
    ))
}

/// `mergeSliceHandler` for a list present in both the object and the patch.
fn merge_list(
    original: &[Value],
    patch: &[Value],
    strategy: ListStrategy,
    field: &str,
) -> Result<Vec<Value>, PatchError> {
    let (key, elem) = match strategy {
        ListStrategy::Replace => {
            // The patch's list as it is: kube-apiserver keeps a `$patch` element as data,
            // which fails to decode (a list of strings: 422) or decodes as an empty
            // element (a list of objects). The double refuses it instead.
            if let Some(d) = patch.iter().find(|i| i.get("$patch").is_some()) {
                return Err(failed(format!(
                    "{field} has no merge strategy, so {d} in it is not a directive but list data; this API double refuses it: send the whole list, without the $patch element"
                )));
            }
            return Ok(patch.to_vec());
        }
        ListStrategy::PrimitiveMerge => (None, Ty::Other),
        ListStrategy::MergeBy(key, elem) => (Some(key), elem),
    };
    if original.is_empty() && patch.is_empty() {
        return Ok(Vec::new());
    }
    let kind = element_kind(original, patch, field)?;
    if kind != json_kind(&Value::Object(Map::new())) {
        // `mergeSlice` of scalars: a set union, then ordered.
        let mut merged: Vec<Value> = Vec::new();
        for v in original.iter().chain(patch) {
            if !merged.contains(v) {
                merged.push(v.clone());
            }
        }
        let (in_patch, rest) = partition(merged, patch, None);
        return Ok(normalize_order(in_patch, rest, patch, original, None));
    }
    let Some(key) = key else {
        return Err(failed(format!(
            "cannot merge lists without merge key for {field}"
        )));
    };
    // `mergeSliceWithSpecialElements`.
    let mut base = original.to_vec();
    let mut plain: Vec<Value> = Vec::new();
    let mut replace = false;
    for item in patch {
        match item.get("$patch") {
            None => plain.push(item.clone()),
            Some(d) => match d.as_str() {
                Some("delete") => {
                    let kv = item.get(key).ok_or_else(|| no_merge_key(item, key))?;
                    base.retain(|x| x.get(key) != Some(kv));
                }
                Some("replace") => replace = true,
                Some("merge") => {
                    return Err(failed("merging lists cannot yet be specified in the patch"));
                }
                _ => return Err(failed(format!("unknown patch type: {d} in map: {item}"))),
            },
        }
    }
    if replace {
        // The other elements, as they are, are the list.
        base = std::mem::take(&mut plain);
    }
    // `mergeSliceWithoutSpecialElements`: merge into the element with the same key, or
    // append the patch's element as it is.
    let mut merged = base.clone();
    for item in &plain {
        let kv = item.get(key).ok_or_else(|| no_merge_key(item, key))?;
        match merged.iter().position(|x| x.get(key) == Some(kv)) {
            Some(i) => strategic_merge(&mut merged[i], item, elem)?,
            None => merged.push(item.clone()),
        }
    }
    for v in merged.iter().chain(&plain) {
        if v.get(key).is_none() {
            return Err(no_merge_key(v, key));
        }
    }
    let (in_patch, rest) = partition(merged, &plain, Some(key));
    Ok(normalize_order(in_patch, rest, &plain, &base, Some(key)))
}

/// What identifies a list element: its merge key's value, or itself for primitives.
fn ident<'a>(v: &'a Value, key: Option<&str>) -> Option<&'a Value> {
    match key {
        Some(k) => v.get(k),
        None => Some(v),
    }
}

/// `index`: where an element with the same identity is in `list`.
fn index_of(list: &[Value], v: &Value, key: Option<&str>) -> Option<usize> {
    let id = ident(v, key);
    list.iter().position(|x| ident(x, key) == id)
}

/// `partitionPrimitivesByPresentInList` / `partitionMapsByPresentInList`: the elements
/// named in `by`, and the others, each in their current order.
fn partition(list: Vec<Value>, by: &[Value], key: Option<&str>) -> (Vec<Value>, Vec<Value>) {
    list.into_iter()
        .partition(|v| index_of(by, v, key).is_some())
}

/// `normalizeElementOrder`: the patch's elements in the patch's order, the stored-only
/// elements in the stored order, then `mergeSortedSlice`: a stored-only element goes
/// before a patch element only when both are in the stored list and it came first
/// there. So elements new to the list come before the stored-only ones that follow.
fn normalize_order(
    mut in_patch: Vec<Value>,
    mut rest: Vec<Value>,
    patch_order: &[Value],
    server_order: &[Value],
    key: Option<&str>,
) -> Vec<Value> {
    let by = |order: &[Value]| {
        let order = order.to_vec();
        move |v: &Value| index_of(&order, v, key).unwrap_or(usize::MAX)
    };
    in_patch.sort_by_key(by(patch_order));
    rest.sort_by_key(by(server_order));
    let mut out = Vec::with_capacity(in_patch.len() + rest.len());
    let (mut left, mut right) = (rest.into_iter().peekable(), in_patch.into_iter().peekable());
    loop {
        match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => out.extend(left.next()),
            (None, Some(_)) => out.extend(right.next()),
            (Some(l), Some(r)) => {
                let li = index_of(server_order, l, key);
                let ri = index_of(server_order, r, key);
                let left_first = matches!((li, ri), (Some(a), Some(b)) if a < b);
                if left_first {
                    out.extend(left.next());
                } else {
                    out.extend(right.next());
                }
            }
        }
    }
    out
}

impl ListStrategy {
    /// The merge key of a list merged by key.
    fn key(self) -> Option<&'static str> {
        match self {
            ListStrategy::MergeBy(key, _) => Some(key),
            _ => None,
        }
    }
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
        // The new finalizer goes first (`normalizeElementOrder`, see below).
        assert_eq!(out["metadata"]["finalizers"], json!(["b", "a"]));
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
        // New elements come before the stored ones (`mergeSortedSlice`).
        assert_eq!(
            out["status"]["podIPs"],
            json!([{"ip": "fd00::1"}, {"ip": "10.0.0.1"}])
        );
        assert_eq!(out["status"]["hostIPs"], json!([]));
        let node = json!({"kind": "Node", "spec": {"podCIDRs": ["10.1.0.0/24"], "taints": [{"key": "a", "effect": "NoSchedule"}]}});
        let out = smp(node, json!({"spec": {"podCIDRs": ["fd00:1::/64"], "taints": [{"key": "b", "effect": "NoSchedule"}]}})).unwrap();
        assert_eq!(
            out["spec"]["podCIDRs"],
            json!(["fd00:1::/64", "10.1.0.0/24"])
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
        // `handleDirectiveInMergeMap`: `$patch: delete` leaves an empty map.
        assert_eq!(out["spec"]["affinity"], json!({}));
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

    // --- `$patch` and primitive lists (`strategicpatch/patch.go`) ---

    fn failed_msg(r: Result<Value, PatchError>) -> String {
        match r {
            Err(PatchError::Failed(m)) => m,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    // `mergeSlice` -> `sliceElementType`: a `$patch` map inside a stored list of strings
    // with `patchStrategy:"merge"` (finalizers, podCIDRs) is an element of another type,
    // which kube-apiserver refuses ("list element types are not identical", a plain
    // error: 500). The double refuses too, naming the alternatives.
    #[test]
    fn a_patch_directive_in_a_merged_primitive_list_is_refused() {
        let pod = json!({"kind": "Pod", "metadata": {"finalizers": ["a/a"]}});
        for d in ["replace", "delete", "merge"] {
            let p = json!({"metadata": {"finalizers": ["b/b", {"$patch": d}]}});
            let m = failed_msg(smp(pod.clone(), p));
            assert!(m.starts_with("list element types are not identical"), "{m}");
            assert!(m.contains("$deleteFromPrimitiveList/finalizers"), "{m}");
        }
        let node = json!({"kind": "Node", "spec": {"podCIDRs": ["10.0.0.0/24"]}});
        let m = failed_msg(smp(
            node,
            json!({"spec": {"podCIDRs": [{"$patch": "replace"}]}}),
        ));
        assert!(m.contains("podCIDRs"), "{m}");
        // Numbers among strings are another type as well.
        let m = failed_msg(smp(pod, json!({"metadata": {"finalizers": [1]}})));
        assert!(m.starts_with("list element types are not identical"), "{m}");
    }

    // `mergeMap` -> `removeDirectives`: a list the object does not have yet is the
    // patch's list without the maps that carry `$patch`.
    #[test]
    fn a_patch_directive_in_a_list_the_object_lacks_is_dropped() {
        let pod = json!({"kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c"}]}});
        let out = smp(
            pod.clone(),
            json!({"metadata": {"finalizers": ["x/x", {"$patch": "replace"}]},
                "spec": {"containers": [{"name": "c", "args": ["-v", {"$patch": "replace"}]}]}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["x/x"]));
        assert_eq!(out["spec"]["containers"][0]["args"], json!(["-v"]));
        // A map that is itself a directive is not added at all.
        let out = smp(pod, json!({"spec": {"affinity": {"$patch": "delete"}}})).unwrap();
        assert!(out["spec"].get("affinity").is_none());
    }

    // `mergeSliceHandler`: a list without a patch strategy (`args`, `command`,
    // tolerations, taints) is the patch's list as it is. A `$patch` map in it is list
    // data to kube-apiserver (a list of strings then fails to decode: 422); the double
    // refuses it with 422 naming the field.
    #[test]
    fn lists_without_a_strategy_are_replaced_and_refuse_patch_directives() {
        let pod = json!({"kind": "Pod", "spec": {
            "containers": [{"name": "c", "args": ["a", "b", "c"]}],
            "tolerations": [{"key": "k"}]}});
        let out = smp(
            pod.clone(),
            json!({"spec": {"containers": [{"name": "c", "args": ["x", "y"]}]}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["containers"][0]["args"], json!(["x", "y"]));
        for d in ["replace", "delete"] {
            let m = failed_msg(smp(
                pod.clone(),
                json!({"spec": {"containers": [{"name": "c", "args": ["x", {"$patch": d}]}]}}),
            ));
            assert!(m.starts_with("args has no merge strategy"), "{m}");
        }
        let m = failed_msg(smp(
            pod,
            json!({"spec": {"tolerations": [{"key": "j"}, {"$patch": "replace"}]}}),
        ));
        assert!(m.starts_with("tolerations has no merge strategy"), "{m}");
    }

    // `mergeSlice` -> `normalizeElementOrder` -> `mergeSortedSlice`: the patch's
    // elements keep the patch's order, the stored-only ones the stored order, and a
    // stored-only element goes first only when it came before the patch element in the
    // stored list. Values new to the list therefore lead.
    #[test]
    fn merged_lists_put_new_elements_before_the_stored_ones() {
        let with = |f: Value| json!({"kind": "Pod", "metadata": {"finalizers": f}});
        let fin = |t: Value, p: Value| {
            smp(with(t), json!({"metadata": {"finalizers": p}})).unwrap()["metadata"]["finalizers"]
                .clone()
        };
        assert_eq!(fin(json!(["a", "b"]), json!(["c"])), json!(["c", "a", "b"]));
        assert_eq!(
            fin(json!(["a", "b"]), json!(["b", "c"])),
            json!(["a", "b", "c"])
        );
        assert_eq!(
            fin(json!(["a", "b"]), json!(["c", "a"])),
            json!(["c", "a", "b"])
        );
        assert_eq!(fin(json!(["a", "b"]), json!(["b", "b"])), json!(["a", "b"]));
        // The same for lists merged by key: z is new, so it leads; a came before b in
        // the stored list, so it stays before b.
        let pod = json!({"kind": "Pod", "spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        let out = smp(
            pod,
            json!({"spec": {"containers": [{"name": "z", "image": "i"}, {"name": "b", "image": "j"}]}}),
        )
        .unwrap();
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "z", "image": "i"}, {"name": "a"}, {"name": "b", "image": "j"}])
        );
    }

    // `mergePatchIntoOriginal` with `$setElementOrder/<list>`, then the
    // `$deleteFromPrimitiveList/<list>` of the same patch (the form kubectl sends).
    #[test]
    fn set_element_order_and_delete_from_primitive_list_together() {
        let pod = json!({"kind": "Pod", "metadata": {"finalizers": ["a", "b", "c"]}});
        let out = smp(
            pod.clone(),
            json!({"metadata": {"$setElementOrder/finalizers": ["c", "a", "b"]}}),
        )
        .unwrap();
        assert_eq!(
            crate::gc::finalizers(&out)
                .into_iter()
                .collect::<std::collections::BTreeSet<_>>(),
            ["a", "b", "c"].map(String::from).into()
        );
        // An element the order list does not name keeps its stored place against the
        // others (`mergeSortedSlice`).
        let out = smp(
            pod.clone(),
            json!({"metadata": {"$setElementOrder/finalizers": ["c", "a"]}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["b", "c", "a"]));
        let out = smp(
            pod.clone(),
            json!({"metadata": {"$setElementOrder/finalizers": ["c", "a"],
                "$deleteFromPrimitiveList/finalizers": ["b"]}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["c", "a"]));
        // `validatePatchWithSetOrderList`: the patch list must follow the order list.
        let m = failed_msg(smp(
            pod.clone(),
            json!({"metadata": {"$setElementOrder/finalizers": ["y", "x"], "finalizers": ["x", "y"]}}),
        ));
        assert!(m.contains("doesn't match $setElementOrder list"), "{m}");
        // `extractKey`: a directive key without `/<field>` is a 400.
        assert!(matches!(
            smp(
                pod,
                json!({"metadata": {"$deleteFromPrimitiveList": ["a"]}})
            ),
            Err(PatchError::Malformed(_))
        ));
        // `mergeSliceHandler` treats delete lists alike with or without a merge strategy.
        let args =
            json!({"kind": "Pod", "spec": {"containers": [{"name": "c", "args": ["a", "b"]}]}});
        let out = smp(
            args,
            json!({"spec": {"containers": [{"name": "c", "$deleteFromPrimitiveList/args": ["a"]}]}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["containers"][0]["args"], json!(["b"]));
    }

    // `mergeSliceWithSpecialElements`: `{"$patch": "replace"}` makes the other elements
    // the list as they are (not merged); `merge` and unknown values are errors.
    #[test]
    fn replace_in_a_keyed_list_takes_the_other_elements_as_they_are() {
        let pod = json!({"kind": "Pod", "spec": {"containers": [
            {"name": "a", "image": "1"}, {"name": "b"}]}});
        let out = smp(
            pod.clone(),
            json!({"spec": {"containers": [{"name": "a", "args": ["x"]}, {"$patch": "replace"}]}}),
        )
        .unwrap();
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "a", "args": ["x"]}])
        );
        let m = failed_msg(smp(
            pod.clone(),
            json!({"spec": {"containers": [{"name": "a", "$patch": "merge"}]}}),
        ));
        assert_eq!(m, "merging lists cannot yet be specified in the patch");
        let m = failed_msg(smp(
            pod,
            json!({"spec": {"containers": [{"name": "a", "$patch": "explode"}]}}),
        ));
        assert!(m.starts_with("unknown patch type: \"explode\""), "{m}");
    }

    // `handleDirectiveInMergeMap`: `$patch: replace` takes the map as it is (a nested
    // directive is not applied), `merge` is not a map directive.
    #[test]
    fn map_directives_follow_handle_directive_in_merge_map() {
        let pod = json!({"kind": "Pod", "metadata": {"labels": {"a": "1"}},
            "spec": {"nodeSelector": {"x": "1"}}});
        let out = smp(
            pod.clone(),
            json!({"spec": {"nodeSelector": {"$patch": "replace", "y": "2"}}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["nodeSelector"], json!({"y": "2"}));
        let m = failed_msg(smp(
            pod.clone(),
            json!({"metadata": {"labels": {"$patch": "merge", "b": "2"}}}),
        ));
        assert!(m.starts_with("unknown patch type: \"merge\""), "{m}");
        // `applyRetainKeysDirective`: a key the patch sets must be retained (400).
        assert_eq!(
            smp(
                pod,
                json!({"spec": {"$retainKeys": ["nodeSelector"], "hostname": "h"}})
            ),
            Err(PatchError::Malformed(
                "invalid patch format of retainKeys".into()
            ))
        );
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

    fn smp_err(t: Value, p: Value) -> String {
        match smp(t, p) {
            Err(e) => e.to_string(),
            Ok(out) => panic!("accepted: {out}"),
        }
    }

    /// `extractKey`: a directive key whose prefix is not exactly the directive's, or that
    /// names no list, is malformed, with the wording of the directive it resembles.
    #[test]
    fn directive_keys_must_name_their_list_exactly() {
        let t = json!({"kind": "Pod", "metadata": {"finalizers": ["a"]}});
        for (key, want) in [
            (
                "$setElementOrderX/finalizers",
                "invalid patch format of setElementOrder list",
            ),
            (
                "$setElementOrder",
                "invalid patch format of setElementOrder list",
            ),
            (
                "$deleteFromPrimitiveListX/finalizers",
                "invalid patch format of primitive list",
            ),
            (
                "$deleteFromPrimitiveList",
                "invalid patch format of primitive list",
            ),
        ] {
            let mut patch = json!({"metadata": {}});
            patch["metadata"][key] = json!(["a"]);
            match smp(t.clone(), patch) {
                Err(PatchError::Malformed(m)) => assert_eq!(m, want, "{key}"),
                other => panic!("{key}: {other:?}"),
            }
        }
    }

    /// `applyRetainKeysDirective` leaves the other directives alone: a
    /// `$setElementOrder/<list>` beside `$retainKeys` is not a key to retain.
    #[test]
    fn retain_keys_ignores_order_and_delete_directives() {
        let t = json!({"kind": "Pod", "spec": {"containers": [{"name": "a", "image": "1"}],
            "hostname": "h", "args": ["x", "y"]}});
        let out = smp(
            t,
            json!({"spec": {"$retainKeys": ["containers", "args"],
                "$setElementOrder/containers": [{"name": "a"}],
                "$deleteFromPrimitiveList/args": ["y"],
                "containers": [{"name": "a", "image": "2"}]}}),
        )
        .unwrap();
        assert_eq!(
            out["spec"],
            json!({"containers": [{"name": "a", "image": "2"}], "args": ["x"]})
        );
    }

    /// `mergePatchIntoOriginal` with `$setElementOrder` for a list the object lacks: the
    /// patch's list, ordered.
    #[test]
    fn an_ordered_list_the_object_lacks_is_the_patchs_list() {
        let out = smp(
            json!({"kind": "Pod", "metadata": {"name": "p"}}),
            json!({"metadata": {"$setElementOrder/finalizers": ["b", "a"], "finalizers": ["b", "a"]}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["b", "a"]));
    }

    /// A value stored with another type is replaced by the patch's value as a new one:
    /// without its nulls (`discardNullValuesFromPatch`, into maps and lists alike) and
    /// without maps carrying `$patch` (`removeDirectives`).
    #[test]
    fn a_value_of_another_type_is_replaced_without_nulls_or_directives() {
        let t = json!({"kind": "ConfigMap", "spec": {"x": "a string", "n": 1}});
        let out = smp(
            t.clone(),
            json!({"spec": {"x": {"keep": 1, "drop": null, "deep": {"gone": null, "here": 2},
                "list": [{"gone": null, "here": 3}]}}}),
        )
        .unwrap();
        assert_eq!(
            out["spec"]["x"],
            json!({"keep": 1, "deep": {"here": 2}, "list": [{"here": 3}]})
        );
        let out = smp(t.clone(), json!({"spec": {"x": {"$patch": "delete"}}})).unwrap();
        assert!(out["spec"].get("x").is_none(), "{out}");
        // An integer and a fraction are two types, as apimachinery's JSON decoding makes
        // them (int64 and float64): a list mixing them is refused.
        let nums = json!({"kind": "ConfigMap", "spec": {"nums": [1, 2]}});
        let e = smp_err(
            nums.clone(),
            json!({"spec": {"$deleteFromPrimitiveList/nums": [2.5]}}),
        );
        assert!(e.contains("list element types are not identical"), "{e}");
        let out = smp(
            nums,
            json!({"spec": {"$deleteFromPrimitiveList/nums": [2]}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["nums"], json!([1]));
    }

    /// `mergeSlice`: an empty patch list merges nothing into a list with a merge
    /// strategy (removing takes `$deleteFromPrimitiveList` or `$patch: delete`).
    #[test]
    fn an_empty_patch_list_leaves_a_merged_list_as_it_is() {
        let out = smp(
            json!({"kind": "Pod", "metadata": {"finalizers": ["a"]},
                "spec": {"containers": [{"name": "c", "image": "1"}]}}),
            json!({"metadata": {"finalizers": []}, "spec": {"containers": []}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["a"]));
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "c", "image": "1"}])
        );
    }

    /// `$deleteFromPrimitiveList` on a stored empty list still checks the values' types
    /// (`sliceElementType`): objects are not primitives.
    #[test]
    fn deleting_objects_from_an_empty_primitive_list_is_refused() {
        let t = json!({"kind": "ConfigMap", "spec": {"xs": []}});
        let e = smp_err(
            t.clone(),
            json!({"spec": {"$deleteFromPrimitiveList/xs": [{"a": 1}]}}),
        );
        assert!(e.contains("is a list of objects"), "{e}");
        let out = smp(t, json!({"spec": {"$deleteFromPrimitiveList/xs": []}})).unwrap();
        assert_eq!(out["spec"]["xs"], json!([]));
    }

    /// `validatePatchWithSetOrderList`: the patch list must follow the order list (for
    /// primitives and for keyed lists), deletions are not part of the order, an empty
    /// order list checks nothing, and every item must carry the merge key.
    #[test]
    fn the_patch_list_must_follow_the_set_element_order() {
        let fin = json!({"kind": "Pod", "metadata": {"finalizers": ["a", "b"]}});
        let e = smp_err(
            fin.clone(),
            json!({"metadata": {"$setElementOrder/finalizers": ["a", "b"], "finalizers": ["b", "a"]}}),
        );
        assert!(e.contains("doesn't match $setElementOrder list"), "{e}");
        let out = smp(
            fin,
            json!({"metadata": {"$setElementOrder/finalizers": [], "finalizers": ["c"]}}),
        )
        .unwrap();
        assert_eq!(
            crate::gc::finalizers(&out)
                .into_iter()
                .collect::<std::collections::BTreeSet<_>>(),
            ["a", "b", "c"].map(String::from).into()
        );

        let pod = json!({"kind": "Pod", "spec": {"containers": [
            {"name": "a", "image": "1"}, {"name": "b", "image": "1"}, {"name": "c", "image": "1"}]}});
        let e = smp_err(
            pod.clone(),
            json!({"spec": {"$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
                "containers": [{"name": "b", "image": "2"}, {"name": "a", "image": "2"}]}}),
        );
        assert!(e.contains("doesn't match $setElementOrder list"), "{e}");
        let out = smp(
            pod.clone(),
            json!({"spec": {"$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
                "containers": [{"name": "b", "image": "2"}, {"name": "c", "$patch": "delete"}]}}),
        )
        .unwrap();
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "b", "image": "2"}, {"name": "a", "image": "1"}])
        );
        // A `$patch: replace` item is no element to order.
        let out = smp(
            pod.clone(),
            json!({"spec": {"$setElementOrder/containers": [{"name": "b"}],
                "containers": [{"$patch": "replace"}, {"name": "b", "image": "2"}]}}),
        )
        .unwrap();
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "b", "image": "2"}])
        );
        for patch in [
            json!({"spec": {"$setElementOrder/containers": [{"name": "a"}],
                "containers": [{"image": "2"}]}}),
            json!({"spec": {"$setElementOrder/containers": [{"image": "x"}],
                "containers": [{"name": "a", "image": "2"}]}}),
        ] {
            let e = smp_err(pod.clone(), patch);
            assert!(
                e.contains("does not contain declared merge key: name"),
                "{e}"
            );
        }
    }
}
