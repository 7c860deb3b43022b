//! What kube-apiserver's registry strategies do to objects on create, update, status
//! update and delete (`pkg/registry/core/{node,pod,namespace}/strategy.go`,
//! `staging/src/k8s.io/apiserver/pkg/registry/rest/{create,update,delete}.go`).
//! Pure functions over JSON; the handlers apply their results.

use serde_json::{Map, Value, json};

use crate::resources::{NameRule, Resource};
use crate::status::Cause;

/// RFC 1123 label check.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 subdomain check.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && !s.is_empty()
        && s.split('.').all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !p.starts_with('-')
                && !p.ends_with('-')
        })
}

/// Why a name is not valid for a rule, if it is not.
pub fn name_problem(rule: NameRule, name: &str) -> Option<&'static str> {
    match rule {
        NameRule::Subdomain if !is_dns_subdomain(name) => Some(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
        ),
        NameRule::Label if !is_dns_label(name) => Some(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
        ),
        NameRule::PathSegment if name == "." || name == ".." => Some("may not be '.' or '..'"),
        NameRule::PathSegment if name.contains('/') || name.contains('%') => {
            Some("may not contain '/' or '%'")
        }
        _ => None,
    }
}

fn str_at<'a>(v: &'a Value, ptr: &str) -> Option<&'a str> {
    v.pointer(ptr).and_then(Value::as_str)
}

/// Validation on create and update: the causes of a 422, empty when valid.
pub fn validate(res: &Resource, obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let name = str_at(obj, "/metadata/name").unwrap_or("");
    if name.is_empty() {
        causes.push(Cause::required(
            "metadata.name",
            "name or generateName is required",
        ));
    } else if let Some(problem) = name_problem(res.name_rule, name) {
        causes.push(Cause::invalid("metadata.name", &json!(name), problem));
    }
    if let Some(labels) = obj.pointer("/metadata/labels") {
        match labels.as_object() {
            Some(map) => {
                for (k, v) in map {
                    let ok = v.as_str().is_some_and(|v| {
                        v.len() <= 63
                            && v.bytes()
                                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
                            && (v.is_empty()
                                || (v.as_bytes()[0].is_ascii_alphanumeric()
                                    && v.as_bytes()[v.len() - 1].is_ascii_alphanumeric()))
                    });
                    if !ok {
                        causes.push(Cause::invalid(
                            "metadata.labels",
                            v,
                            &format!("a valid label value for key {k:?} must be 63 characters or less, empty or begin and end with an alphanumeric character"),
                        ));
                    }
                }
            }
            None if !labels.is_null() => {
                causes.push(Cause::invalid("metadata.labels", labels, "must be a map"))
            }
            None => {}
        }
    }
    match res.plural {
        "pods" => validate_pod(obj, &mut causes),
        "leases" => {
            if let Some(d) = obj.pointer("/spec/leaseDurationSeconds")
                && d.as_i64().is_none_or(|d| d <= 0)
            {
                causes.push(Cause::invalid(
                    "spec.leaseDurationSeconds",
                    d,
                    "must be greater than 0",
                ));
            }
        }
        "secrets" => validate_secret(obj, &mut causes),
        "nodes" => validate_node(obj, &mut causes),
        "configmaps" => validate_configmap(obj, &mut causes),
        crate::admission::POLICIES => crate::admission::validate_policy(obj, &mut causes),
        crate::admission::BINDINGS => crate::admission::validate_binding(obj, &mut causes),
        _ => {}
    }
    causes
}

/// The size limit of Secret and ConfigMap data (`MaxSecretSize`, `MaxConfigMapSize`).
pub const MAX_DATA_SIZE: usize = 1024 * 1024;

/// `IsConfigMapKey`: what is wrong with a data key, if anything.
pub fn config_key_problem(k: &str) -> Option<String> {
    if k.is_empty() || k.len() > 253 {
        return Some("must be no more than 253 characters".into());
    }
    if !k
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
    {
        return Some("a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')".into());
    }
    if k == "." {
        return Some("must not be '.'".into());
    }
    if k == ".." {
        return Some("must not be '..'".into());
    }
    if k.starts_with("..") {
        return Some("must not start with '..'".into());
    }
    None
}

fn too_long(field: &str, max: usize) -> Cause {
    Cause {
        reason: "FieldValueTooLong",
        field: field.into(),
        message: format!("Too long: must have at most {max} bytes"),
    }
}

fn decoded_len(v: &Value) -> usize {
    use base64::Engine;
    v.as_str()
        .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
        .map_or(0, |b| b.len())
}

/// `ValidateSecret` (`pkg/apis/core/validation/validation.go`).
fn validate_secret(obj: &Value, causes: &mut Vec<Cause>) {
    let empty = serde_json::Map::new();
    let data = obj.get("data").and_then(Value::as_object).unwrap_or(&empty);
    let mut total = 0;
    for (k, v) in data {
        if let Some(problem) = config_key_problem(k) {
            causes.push(Cause::invalid(&format!("data[{k}]"), &json!(k), &problem));
        }
        total += decoded_len(v);
    }
    if total > MAX_DATA_SIZE {
        causes.push(too_long("data", MAX_DATA_SIZE));
    }
    let has = |k: &str| data.contains_key(k);
    let ty = str_at(obj, "/type").unwrap_or("Opaque");
    match ty {
        "kubernetes.io/service-account-token"
            if str_at(
                obj,
                "/metadata/annotations/kubernetes.io~1service-account.name",
            )
            .is_none_or(str::is_empty) =>
        {
            causes.push(Cause::required(
                "metadata.annotations[kubernetes.io/service-account.name]",
                "",
            ));
        }
        "kubernetes.io/dockercfg" if !has(".dockercfg") => {
            causes.push(Cause::required("data[.dockercfg]", ""));
        }
        "kubernetes.io/dockerconfigjson" if !has(".dockerconfigjson") => {
            causes.push(Cause::required("data[.dockerconfigjson]", ""));
        }
        "kubernetes.io/basic-auth" if !has("username") && !has("password") => {
            causes.push(Cause::required("data[username]", ""));
            causes.push(Cause::required("data[password]", ""));
        }
        "kubernetes.io/ssh-auth" if !has("ssh-privatekey") => {
            causes.push(Cause::required("data[ssh-privatekey]", ""));
        }
        "kubernetes.io/tls" => {
            for k in ["tls.crt", "tls.key"] {
                if !has(k) {
                    causes.push(Cause::required(&format!("data[{k}]"), ""));
                }
            }
        }
        _ => {}
    }
}

/// `ValidateConfigMap`.
fn validate_configmap(obj: &Value, causes: &mut Vec<Cause>) {
    let mut total = 0;
    let mut seen = std::collections::BTreeSet::new();
    for field in ["data", "binaryData"] {
        let Some(m) = obj.get(field).and_then(Value::as_object) else {
            continue;
        };
        for (k, v) in m {
            if let Some(problem) = config_key_problem(k) {
                causes.push(Cause::invalid(
                    &format!("{field}[{k}]"),
                    &json!(k),
                    &problem,
                ));
            }
            if !seen.insert(k.clone()) {
                causes.push(Cause::invalid(
                    &format!("{field}[{k}]"),
                    &json!(k),
                    "duplicate of key present in data",
                ));
            }
            total += if field == "data" {
                v.as_str().map_or(0, str::len)
            } else {
                decoded_len(v)
            };
        }
    }
    if total > MAX_DATA_SIZE {
        causes.push(too_long("", MAX_DATA_SIZE));
    }
}

/// Kind-specific update rules (`ValidateSecretUpdate`, `ValidateConfigMapUpdate`,
/// `ValidateNodeUpdate`, `ValidateRoleBindingUpdate`).
pub fn validate_kind_update(res: &Resource, new: &Value, old: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let immutable_set = old.get("immutable") == Some(&json!(true));
    match res.plural {
        "secrets" | "configmaps" => {
            if res.plural == "secrets" && new.get("type") != old.get("type") {
                causes.push(Cause::invalid(
                    "type",
                    new.get("type").unwrap_or(&Value::Null),
                    "field is immutable",
                ));
            }
            if immutable_set {
                if new.get("immutable") != old.get("immutable") {
                    causes.push(Cause::forbidden(
                        "immutable",
                        "field is immutable when `immutable` is set",
                    ));
                }
                let fields: &[&str] = if res.plural == "secrets" {
                    &["data"]
                } else {
                    &["data", "binaryData"]
                };
                for f in fields {
                    let norm = |v: Option<&Value>| {
                        v.filter(|v| v.as_object().is_some_and(|m| !m.is_empty()))
                            .cloned()
                    };
                    if norm(new.get(*f)) != norm(old.get(*f)) {
                        causes.push(Cause::forbidden(
                            f,
                            "field is immutable when `immutable` is set",
                        ));
                    }
                }
            }
        }
        "nodes" => validate_node_update(new, old, &mut causes),
        "rolebindings" | "clusterrolebindings" if new.get("roleRef") != old.get("roleRef") => {
            causes.push(Cause::invalid(
                "roleRef",
                new.get("roleRef").unwrap_or(&Value::Null),
                "cannot change roleRef",
            ));
        }
        _ => {}
    }
    causes
}

/// `ValidateNodeUpdate` and `ValidateNode`: no duplicate addresses, `podCIDRs` and
/// `providerID` fixed once set, taints well-formed and unique by key and effect.
fn validate_node_update(new: &Value, old: &Value, causes: &mut Vec<Cause>) {
    let old_cidrs = old.pointer("/spec/podCIDRs").and_then(Value::as_array);
    if let Some(oc) = old_cidrs.filter(|c| !c.is_empty())
        && new.pointer("/spec/podCIDRs").and_then(Value::as_array) != Some(oc)
    {
        causes.push(Cause::forbidden(
            "spec.podCIDRs",
            "node updates may not change podCIDR except from \"\" to valid",
        ));
    }
    if let Some(op) = str_at(old, "/spec/providerID").filter(|p| !p.is_empty())
        && str_at(new, "/spec/providerID") != Some(op)
    {
        causes.push(Cause::forbidden(
            "spec.providerID",
            "node updates may not change providerID except from \"\" to valid",
        ));
    }
}

/// `ValidateNode` parts that apply to every write: unique addresses, taints.
fn validate_node(obj: &Value, causes: &mut Vec<Cause>) {
    if let Some(addrs) = obj.pointer("/status/addresses").and_then(Value::as_array) {
        let mut seen = Vec::new();
        for (i, a) in addrs.iter().enumerate() {
            let key = (a.get("type").cloned(), a.get("address").cloned());
            if seen.contains(&key) {
                causes.push(Cause {
                    reason: "FieldValueDuplicate",
                    field: format!("status.addresses[{i}]"),
                    message: format!(
                        "Duplicate value: {}",
                        json!({"type": key.0, "address": key.1})
                    ),
                });
            }
            seen.push(key);
        }
    }
    if let Some(taints) = obj.pointer("/spec/taints").and_then(Value::as_array) {
        let mut seen = Vec::new();
        for (i, t) in taints.iter().enumerate() {
            let key = str_at(t, "/key").unwrap_or("");
            let effect = str_at(t, "/effect").unwrap_or("");
            if key.is_empty() {
                causes.push(Cause::required(&format!("spec.taints[{i}].key"), ""));
            } else if !is_qualified_name(key) {
                causes.push(Cause::invalid(
                    &format!("spec.taints[{i}].key"),
                    &json!(key),
                    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                ));
            }
            if let Some(v) = str_at(t, "/value").filter(|v| !v.is_empty())
                && !is_label_value(v)
            {
                causes.push(Cause::invalid(
                    &format!("spec.taints[{i}].value"),
                    &json!(v),
                    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                ));
            }
            match effect {
                "NoSchedule" | "PreferNoSchedule" | "NoExecute" => {}
                "" => causes.push(Cause::required(&format!("spec.taints[{i}].effect"), "")),
                other => causes.push(Cause {
                    reason: "FieldValueNotSupported",
                    field: format!("spec.taints[{i}].effect"),
                    message: format!("Unsupported value: \"{other}\": supported values: \"NoSchedule\", \"PreferNoSchedule\", \"NoExecute\""),
                }),
            }
            if seen.contains(&(key, effect)) {
                causes.push(Cause {
                    reason: "FieldValueDuplicate",
                    field: format!("spec.taints[{i}]"),
                    message: "Duplicate value: taints must be unique by key and effect pair".into(),
                });
            }
            seen.push((key, effect));
        }
    }
}

fn is_label_value(v: &str) -> bool {
    v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && v.as_bytes().first().is_some_and(u8::is_ascii_alphanumeric)
        && v.as_bytes().last().is_some_and(u8::is_ascii_alphanumeric)
}

/// A qualified name (`prefix/name` with a DNS subdomain prefix).
fn is_qualified_name(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    prefix.is_none_or(is_dns_subdomain) && !name.is_empty() && is_label_value(name)
}

fn validate_pod(obj: &Value, causes: &mut Vec<Cause>) {
    let containers = obj.pointer("/spec/containers").and_then(Value::as_array);
    match containers {
        None => causes.push(Cause::required("spec.containers", "")),
        Some(cs) if cs.is_empty() => causes.push(Cause::required("spec.containers", "")),
        Some(cs) => {
            for (i, c) in cs.iter().enumerate() {
                if str_at(c, "/name").is_none_or(str::is_empty) {
                    causes.push(Cause::required(&format!("spec.containers[{i}].name"), ""));
                }
                if str_at(c, "/image").is_none_or(str::is_empty) {
                    causes.push(Cause::required(&format!("spec.containers[{i}].image"), ""));
                }
            }
        }
    }
}

/// Extra checks on a pod update (`ValidatePodUpdate`, scheduling gates).
pub fn validate_pod_update(new: &Value, old: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let gates = |v: &Value| -> Vec<String> {
        v.pointer("/spec/schedulingGates")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|g| g.get("name").and_then(Value::as_str).map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (ng, og) = (gates(new), gates(old));
    if ng.iter().any(|g| !og.contains(g)) {
        causes.push(Cause::forbidden(
            "spec.schedulingGates",
            "only deletion is allowed, but found new scheduling gate",
        ));
    }
    if mutable_pod_spec_stripped(new, !og.is_empty())
        != mutable_pod_spec_stripped(old, !og.is_empty())
    {
        causes.push(Cause::forbidden(
            "spec",
            "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
        ));
    }
    let tolerations = |v: &Value| {
        v.pointer("/spec/tolerations")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let new_tol = tolerations(new);
    if tolerations(old).iter().any(|t| !new_tol.contains(t)) {
        causes.push(Cause::forbidden(
            "spec.tolerations",
            "existing toleration can not be modified except its tolerationSeconds",
        ));
    }
    causes
}

/// A pod spec without the fields an update may change (`ValidatePodUpdate`): container
/// images, activeDeadlineSeconds, tolerations, schedulingGates (checked separately),
/// terminationGracePeriodSeconds, and while the pod is gated its nodeSelector and
/// affinity (which may be set or tightened then; the double does not judge tightening).
fn mutable_pod_spec_stripped(pod: &Value, gated: bool) -> Value {
    let mut spec = pod.get("spec").cloned().unwrap_or(Value::Null);
    if let Some(m) = spec.as_object_mut() {
        for f in [
            "activeDeadlineSeconds",
            "tolerations",
            "schedulingGates",
            "terminationGracePeriodSeconds",
        ] {
            m.remove(f);
        }
        if gated {
            m.remove("nodeSelector");
            m.remove("affinity");
        }
        for list in ["containers", "initContainers"] {
            if let Some(cs) = m.get_mut(list).and_then(Value::as_array_mut) {
                for c in cs.iter_mut().filter_map(Value::as_object_mut) {
                    c.remove("image");
                }
            }
        }
    }
    spec
}

/// The pod QoS class (`pkg/apis/core/helper/qos`): BestEffort without any requests or
/// limits, Guaranteed when every container limits cpu and memory with requests equal
/// to limits, Burstable otherwise.
pub fn qos_class(pod: &Value) -> &'static str {
    let mut containers: Vec<&Value> = Vec::new();
    for key in ["/spec/containers", "/spec/initContainers"] {
        if let Some(a) = pod.pointer(key).and_then(Value::as_array) {
            containers.extend(a.iter());
        }
    }
    let mut any = false;
    let mut guaranteed = true;
    for c in &containers {
        let req = c.pointer("/resources/requests").and_then(Value::as_object);
        let lim = c.pointer("/resources/limits").and_then(Value::as_object);
        let relevant = |m: Option<&Map<String, Value>>| {
            m.map(|m| {
                m.iter()
                    .filter(|(k, _)| *k == "cpu" || *k == "memory")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<Map<String, Value>>()
            })
            .unwrap_or_default()
        };
        let (req, lim) = (relevant(req), relevant(lim));
        if !req.is_empty() || !lim.is_empty() {
            any = true;
        }
        if lim.len() < 2 {
            guaranteed = false;
        }
        for (k, v) in &req {
            if lim.get(k) != Some(v) {
                guaranteed = false;
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// Defaulting kube-apiserver applies to pods that callers here read back.
fn default_pod(pod: &mut Value) {
    let spec = &mut pod["spec"];
    if !spec.is_object() {
        return;
    }
    for (k, v) in [
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("dnsPolicy", json!("ClusterFirst")),
        ("schedulerName", json!("default-scheduler")),
        ("securityContext", json!({})),
        ("enableServiceLinks", json!(true)),
        ("preemptionPolicy", json!("PreemptLowerPriority")),
        ("priority", json!(0)),
    ] {
        if spec.get(k).is_none() {
            spec[k] = v;
        }
    }
    if let Some(cs) = spec.get_mut("containers").and_then(Value::as_array_mut) {
        for c in cs {
            if !c.is_object() {
                continue;
            }
            if c.get("terminationMessagePath").is_none() {
                c["terminationMessagePath"] = json!("/dev/termination-log");
            }
            if c.get("terminationMessagePolicy").is_none() {
                c["terminationMessagePolicy"] = json!("File");
            }
            if c.get("imagePullPolicy").is_none() {
                let image = c.get("image").and_then(Value::as_str).unwrap_or("");
                let latest = image.ends_with(":latest")
                    || !image.rsplit('/').next().unwrap_or("").contains(':');
                c["imagePullPolicy"] = json!(if latest { "Always" } else { "IfNotPresent" });
            }
            if c.get("resources").is_none() {
                c["resources"] = json!({});
            }
        }
    }
}

/// `PrepareForCreate` of the kind's strategy.
pub fn prepare_create(res: &Resource, obj: &mut Value) {
    if !res.tracks_generation {
        if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("generation");
        }
    } else {
        obj["metadata"]["generation"] = json!(1);
    }
    if res.plural == crate::admission::POLICIES {
        crate::admission::default_policy(obj);
    }
    match res.plural {
        "pods" => {
            default_pod(obj);
            let mut status = json!({"phase": "Pending", "qosClass": qos_class(obj)});
            let gated = obj
                .pointer("/spec/schedulingGates")
                .and_then(Value::as_array)
                .is_some_and(|g| !g.is_empty());
            if gated {
                status["conditions"] = json!([{
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "SchedulingGated",
                    "message": "Scheduling is blocked due to non-empty scheduling gates",
                    "lastProbeTime": null,
                    "lastTransitionTime": null,
                }]);
            }
            obj["status"] = status;
        }
        "nodes" => {
            if let Some(s) = obj.get_mut("status").and_then(Value::as_object_mut) {
                s.remove("config");
            }
            if let Some(s) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                s.remove("configSource");
            }
        }
        "namespaces" => {
            obj["status"] = json!({"phase": "Active"});
            if obj.pointer("/spec/finalizers").is_none() {
                obj["spec"] = json!({"finalizers": ["kubernetes"]});
            }
            let name = obj["metadata"]["name"].clone();
            obj["metadata"]["labels"]["kubernetes.io/metadata.name"] = name;
        }
        "secrets"
            if obj
                .get("type")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty) =>
        {
            obj["type"] = json!("Opaque");
        }
        "deployments" | "daemonsets" | "services" => {
            obj["status"] = json!({});
        }
        _ => {}
    }
}

/// Metadata rules of every update (`rest.BeforeUpdate`): the uid when the request has
/// none, the creationTimestamp, the generation and an existing deletionTimestamp always
/// come from the stored object (a request changing them is silently overridden, not
/// refused), and an existing deletionGracePeriodSeconds when the request has none.
pub fn carry_system_meta(new: &mut Value, old: &Value) {
    let old_meta = |f: &str| {
        old.pointer(&format!("/metadata/{f}"))
            .filter(|v| !v.is_null())
    };
    let new_has = |n: &Value, f: &str| {
        n.pointer(&format!("/metadata/{f}"))
            .is_some_and(|v| !v.is_null() && v != "")
    };
    if !new_has(new, "uid")
        && let Some(v) = old_meta("uid")
    {
        new["metadata"]["uid"] = v.clone();
    }
    for field in ["creationTimestamp", "deletionTimestamp"] {
        if let Some(v) = old_meta(field) {
            new["metadata"][field] = v.clone();
        }
    }
    if !new_has(new, "deletionGracePeriodSeconds")
        && let Some(v) = old_meta("deletionGracePeriodSeconds")
    {
        new["metadata"]["deletionGracePeriodSeconds"] = v.clone();
    }
    match old.pointer("/metadata/generation") {
        Some(g) => new["metadata"]["generation"] = g.clone(),
        None => {
            if let Some(m) = new.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("generation");
            }
        }
    }
}

/// `metav1.Time` fields (second precision) of the served kinds, by field name.
const TIME_FIELDS: &[&str] = &[
    "creationTimestamp",
    "deletionTimestamp",
    "lastTransitionTime",
    "lastProbeTime",
    "lastHeartbeatTime",
    "lastUpdateTime",
    "startTime",
    "startedAt",
    "finishedAt",
    "timeAdded",
    "firstTimestamp",
    "lastTimestamp",
    "deprecatedFirstTimestamp",
    "deprecatedLastTimestamp",
    "expirationTimestamp",
];

/// `metav1.MicroTime` fields (microsecond precision).
const MICRO_TIME_FIELDS: &[&str] = &["acquireTime", "renewTime", "eventTime", "lastObservedTime"];

/// Parses every time field as RFC 3339 (any offset, fractional seconds allowed, as Go's
/// `time.Parse(time.RFC3339, ...)`) and writes it back the way `metav1.Time` and
/// `metav1.MicroTime` marshal: UTC `Z`, seconds or microseconds. A value that does not
/// parse is an error naming the field (kube-apiserver cannot decode such a body: 400).
pub fn normalize_times(v: &mut Value) -> Result<(), String> {
    normalize_at(v, "")
}

fn normalize_at(v: &mut Value, path: &str) -> Result<(), String> {
    match v {
        Value::Object(m) => {
            for (k, val) in m.iter_mut() {
                let here = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                let micro = MICRO_TIME_FIELDS.contains(&k.as_str());
                if TIME_FIELDS.contains(&k.as_str()) || micro {
                    match val {
                        Value::Null => {}
                        Value::String(s) if s.is_empty() => *val = Value::Null,
                        Value::String(s) => {
                            let t = crate::times::parse_rfc3339(s.trim()).map_err(|e| {
                                format!("{here}: cannot parse {s:?} as an RFC 3339 time: {e}")
                            })?;
                            *val = Value::String(if micro {
                                crate::times::format_micros(t)
                            } else {
                                crate::times::format_secs(t)
                            });
                        }
                        other => {
                            return Err(format!(
                                "{here}: expected an RFC 3339 time string, got {other}"
                            ));
                        }
                    }
                } else {
                    normalize_at(val, &here)?;
                }
            }
        }
        Value::Array(a) => {
            for item in a {
                normalize_at(item, path)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Metadata rules of every update (`ValidateObjectMetaAccessorUpdate` in
/// `staging/src/k8s.io/apimachinery/pkg/api/validation/objectmeta.go`), in its order:
/// no new finalizers on an object being deleted, then the immutable fields.
pub fn validate_meta_update(new: &Value, old: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    if old
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
    {
        causes.extend(no_new_finalizers(new, old));
    }
    // creationTimestamp and an existing deletionTimestamp were carried over; what is left
    // to refuse is setting a deletionTimestamp or grace period the object does not have.
    for field in ["deletionTimestamp", "deletionGracePeriodSeconds"] {
        let p = format!("/metadata/{field}");
        let (n, o) = (new.pointer(&p), old.pointer(&p));
        if n.filter(|v| !v.is_null()) != o.filter(|v| !v.is_null()) {
            causes.push(Cause::invalid(
                &format!("metadata.{field}"),
                n.unwrap_or(&Value::Null),
                "field is immutable",
            ));
        }
    }
    causes
}

/// `ValidateNoNewFinalizers`: one Forbidden cause on `metadata.finalizers` listing the
/// finalizers the update adds (a sorted set, printed as Go's `%#v` of a `[]string`).
/// Removing finalizers, reordering them or keeping the same set is allowed.
fn no_new_finalizers(new: &Value, old: &Value) -> Option<Cause> {
    let fins = |v: &Value| -> std::collections::BTreeSet<String> {
        crate::gc::finalizers(v).into_iter().collect()
    };
    let old_f = fins(old);
    let extra: Vec<String> = fins(new)
        .into_iter()
        .filter(|f| !old_f.contains(f))
        .map(|f| Value::String(f).to_string())
        .collect();
    if extra.is_empty() {
        return None;
    }
    Some(Cause::forbidden(
        "metadata.finalizers",
        &format!(
            "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
            extra.join(", ")
        ),
    ))
}

/// `PrepareForUpdate` of a main (non-status) update: the stored status is kept and the
/// generation moves when the spec changes.
pub fn prepare_update(res: &Resource, new: &mut Value, old: &Value) {
    if res.plural == crate::admission::POLICIES {
        crate::admission::default_policy(new);
    }
    if res.plural == "pods" {
        // Defaulting runs on every decoded body, so a PUT without the defaulted fields
        // does not read as a spec change.
        default_pod(new);
    }
    if res.has_status {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Some(o) = new.as_object_mut() {
                    o.remove("status");
                }
            }
        }
    }
    if res.tracks_generation && new.get("spec") != old.get("spec") {
        let g = old
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        new["metadata"]["generation"] = json!(g + 1);
    }
    if res.plural == "nodes"
        && let Some(s) = new.get_mut("spec").and_then(Value::as_object_mut)
    {
        // configSource is dropped unless the (long removed) DynamicKubeletConfig gate is on.
        s.remove("configSource");
    }
}

/// `PrepareForUpdate` of a status update: the stored spec is kept; for pods also no new
/// deletionTimestamp and the stored ownerReferences. Label and annotation changes stay.
pub fn prepare_status_update(res: &Resource, new: &mut Value, old: &Value) {
    match old.get("spec") {
        Some(s) => new["spec"] = s.clone(),
        None => {
            if let Some(o) = new.as_object_mut() {
                o.remove("spec");
            }
        }
    }
    if res.plural == "pods" {
        if old.pointer("/metadata/deletionTimestamp").is_none()
            && let Some(m) = new.get_mut("metadata").and_then(Value::as_object_mut)
        {
            m.remove("deletionTimestamp");
        }
        match old.pointer("/metadata/ownerReferences") {
            Some(o) => new["metadata"]["ownerReferences"] = o.clone(),
            None => {
                if let Some(m) = new.get_mut("metadata").and_then(Value::as_object_mut) {
                    m.remove("ownerReferences");
                }
            }
        }
    }
    if res.plural == "nodes"
        && let Some(s) = new.get_mut("status").and_then(Value::as_object_mut)
    {
        s.remove("config");
    }
}

/// The grace period of a pod deletion (`podStrategy.CheckGracefulDelete`): the
/// request's, else the pod's terminationGracePeriodSeconds (30 when unset); 0 for an
/// unscheduled or finished pod; negative becomes 1.
pub fn pod_grace_period(pod: &Value, requested: Option<i64>) -> i64 {
    let unscheduled = str_at(pod, "/spec/nodeName").is_none_or(str::is_empty);
    let finished = matches!(
        str_at(pod, "/status/phase"),
        Some("Failed") | Some("Succeeded")
    );
    if unscheduled || finished {
        return 0;
    }
    let grace = requested.unwrap_or_else(|| {
        pod.pointer("/spec/terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(30)
    });
    if grace < 0 { 1 } else { grace }
}

/// What a delete request does to an object.
#[derive(Debug, Clone, PartialEq)]
pub enum DeleteOutcome {
    /// Remove it now.
    Remove,
    /// Keep it, updated (deletionTimestamp/grace set or shortened, finalizers waiting).
    Update(Value),
    /// Nothing changes (a graceful deletion already pending with a shorter period).
    Unchanged,
}

/// Decides a delete (`rest.BeforeDelete` and the store's finalizer handling).
/// `now` is seconds since the epoch; `requested_grace` comes from DeleteOptions.
pub fn decide_delete(
    res: &Resource,
    obj: &Value,
    requested_grace: Option<i64>,
    extra_finalizer: Option<&str>,
    now: i64,
) -> DeleteOutcome {
    let grace = if res.plural == "pods" {
        pod_grace_period(obj, requested_grace)
    } else {
        0
    };
    let mut finalizers: Vec<String> = obj
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let already = obj.pointer("/metadata/deletionTimestamp").is_some();
    let current_grace = obj
        .pointer("/metadata/deletionGracePeriodSeconds")
        .and_then(Value::as_i64);
    if let Some(f) = extra_finalizer
        && !already
        && !finalizers.iter().any(|x| x == f)
    {
        finalizers.push(f.to_string());
    }
    if grace == 0 && finalizers.is_empty() {
        return DeleteOutcome::Remove;
    }
    // A pending graceful deletion can only be shortened.
    if already && current_grace.is_some_and(|c| grace >= c) {
        return DeleteOutcome::Unchanged;
    }
    let mut out = obj.clone();
    out["metadata"]["deletionTimestamp"] = json!(rfc3339(now + grace));
    out["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
    if !finalizers.is_empty() {
        out["metadata"]["finalizers"] = json!(finalizers);
    }
    // `rest.BeforeDelete`: setting (or shortening) the deletion bumps a tracked generation.
    if let Some(g) = obj
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .filter(|g| *g > 0)
    {
        out["metadata"]["generation"] = json!(g + 1);
    }
    DeleteOutcome::Update(out)
}

/// Whether an updated object that is being deleted should now go: no finalizers left and
/// no grace period pending (`shouldDeleteDuringUpdate`).
pub fn should_remove_after_update(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp").is_some()
        && obj
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
        && obj
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(0)
            == 0
}

/// RFC 3339 in UTC with second precision, as metav1.Time marshals.
pub fn rfc3339(secs: i64) -> String {
    crate::times::rfc3339(secs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::find;

    fn pods() -> &'static Resource {
        find("", "v1", "pods").unwrap()
    }

    fn pod(node: Option<&str>) -> Value {
        let mut p = json!({"metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
        if let Some(n) = node {
            p["spec"]["nodeName"] = json!(n);
        }
        p
    }

    #[test]
    fn names_follow_their_rules() {
        assert!(is_dns_subdomain("a.b-c"));
        assert!(!is_dns_subdomain("A"));
        assert!(!is_dns_subdomain("a..b"));
        assert!(!is_dns_label("a.b"));
        assert!(name_problem(NameRule::PathSegment, "system:node").is_none());
        assert!(name_problem(NameRule::PathSegment, "a/b").is_some());
    }

    #[test]
    fn pod_validation_lists_every_cause() {
        let causes = validate(
            pods(),
            &json!({"metadata": {"name": "Bad_Name"}, "spec": {"containers": [{}]}}),
        );
        let fields: Vec<_> = causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "metadata.name",
                "spec.containers[0].name",
                "spec.containers[0].image"
            ]
        );
    }

    #[test]
    fn pod_create_resets_status_and_gates() {
        let mut p = pod(None);
        p["status"] = json!({"phase": "Running"});
        p["spec"]["schedulingGates"] = json!([{"name": "g"}]);
        prepare_create(pods(), &mut p);
        assert_eq!(p["status"]["phase"], "Pending");
        assert_eq!(p["status"]["qosClass"], "BestEffort");
        assert_eq!(p["status"]["conditions"][0]["reason"], "SchedulingGated");
        assert_eq!(p["metadata"]["generation"], 1);
    }

    #[test]
    fn pod_spec_updates_are_limited() {
        let old = pod(Some("n"));
        let mut image = old.clone();
        image["spec"]["containers"][0]["image"] = json!("busybox:2");
        image["spec"]["tolerations"] = json!([{"key": "k", "operator": "Exists"}]);
        assert!(validate_pod_update(&image, &old).is_empty());
        let mut moved = old.clone();
        moved["spec"]["nodeName"] = json!("other");
        assert_eq!(validate_pod_update(&moved, &old)[0].field, "spec");
        let mut env = old.clone();
        env["spec"]["containers"][0]["env"] = json!([{"name": "A", "value": "1"}]);
        assert_eq!(validate_pod_update(&env, &old).len(), 1);
        // While gated, a nodeSelector may be set.
        let mut gated = pod(None);
        gated["spec"]["schedulingGates"] = json!([{"name": "g"}]);
        let mut selected = gated.clone();
        selected["spec"]["nodeSelector"] = json!({"zone": "a"});
        assert!(validate_pod_update(&selected, &gated).is_empty());
        let mut ungated_select = pod(None);
        ungated_select["spec"]["nodeSelector"] = json!({"zone": "a"});
        assert!(!validate_pod_update(&ungated_select, &pod(None)).is_empty());
    }

    #[test]
    fn qos_classes() {
        let mut p = pod(None);
        assert_eq!(qos_class(&p), "BestEffort");
        p["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "1"}});
        assert_eq!(qos_class(&p), "Burstable");
        p["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}});
        assert_eq!(qos_class(&p), "Guaranteed");
    }

    #[test]
    fn status_updates_keep_spec_and_owners() {
        let old = json!({"metadata": {"name": "p", "ownerReferences": [{"uid": "1"}]}, "spec": {"nodeName": "a"}});
        let mut new = json!({"metadata": {"name": "p", "labels": {"x": "y"}, "deletionTimestamp": "2030-01-01T00:00:00Z"},
            "spec": {"nodeName": "b"}, "status": {"phase": "Running"}});
        prepare_status_update(pods(), &mut new, &old);
        assert_eq!(new["spec"]["nodeName"], "a");
        assert_eq!(new["metadata"]["ownerReferences"][0]["uid"], "1");
        assert!(new["metadata"].get("deletionTimestamp").is_none());
        assert_eq!(new["metadata"]["labels"]["x"], "y");
    }

    #[test]
    fn main_updates_keep_status() {
        let nodes = find("", "v1", "nodes").unwrap();
        let old = json!({"metadata": {"name": "n"}, "status": {"addresses": [1]}});
        let mut new = json!({"metadata": {"name": "n"}, "status": {"addresses": [2]}});
        prepare_update(nodes, &mut new, &old);
        assert_eq!(new["status"]["addresses"][0], 1);
    }

    #[test]
    fn grace_periods() {
        assert_eq!(pod_grace_period(&pod(None), Some(30)), 0);
        assert_eq!(pod_grace_period(&pod(Some("n")), None), 30);
        assert_eq!(pod_grace_period(&pod(Some("n")), Some(-5)), 1);
        let mut done = pod(Some("n"));
        done["status"] = json!({"phase": "Succeeded"});
        assert_eq!(pod_grace_period(&done, Some(10)), 0);
    }

    #[test]
    fn graceful_delete_only_shortens() {
        let p = pod(Some("n"));
        let DeleteOutcome::Update(first) = decide_delete(pods(), &p, None, None, 1000) else {
            panic!("a scheduled pod is deleted gracefully")
        };
        assert_eq!(first["metadata"]["deletionGracePeriodSeconds"], 30);
        assert_eq!(
            decide_delete(pods(), &first, Some(60), None, 1001),
            DeleteOutcome::Unchanged
        );
        let DeleteOutcome::Update(second) = decide_delete(pods(), &first, Some(5), None, 1001)
        else {
            panic!("a shorter grace applies")
        };
        assert_eq!(second["metadata"]["deletionTimestamp"], rfc3339(1006));
        assert_eq!(
            decide_delete(pods(), &second, Some(0), None, 1002),
            DeleteOutcome::Remove
        );
    }

    #[test]
    fn finalizers_hold_objects() {
        let cms = find("", "v1", "configmaps").unwrap();
        let cm = json!({"metadata": {"name": "c", "finalizers": ["x"]}});
        let DeleteOutcome::Update(held) = decide_delete(cms, &cm, None, None, 5) else {
            panic!("finalizers hold")
        };
        assert!(!should_remove_after_update(&held));
        let mut released = held.clone();
        released["metadata"]["finalizers"] = json!([]);
        assert!(should_remove_after_update(&released));
    }
}

#[cfg(test)]
mod apiserver_rules;

/// Event validation (`ValidateEventCreate` / `ValidateEventUpdate` and
/// `legacyValidateEvent` in `pkg/apis/core/validation/events.go`), on the stored (core
/// v1) form of `new` and `old`. Every Event passes the legacy rules; a write through
/// events.k8s.io/v1 (`res`) also the strict ones. Field paths name the internal fields
/// (`involvedObject`, `message`, `reportingController`, `count`, ...), whichever group
/// was written through, as kube-apiserver's do. Empty for other kinds.
pub fn validate_event(res: &Resource, new: &Value, old: Option<&Value>) -> Vec<Cause> {
    if !crate::convert::is_event(res) {
        return Vec::new();
    }
    let mut causes = legacy_event_causes(new);
    if !crate::convert::is_events_v1(res) {
        return causes;
    }
    match old {
        None => {
            causes.extend(event_series_causes(new));
            if is_unset(new.get("eventTime")) {
                causes.push(Cause::required("eventTime", ""));
            }
            let ty = str_at(new, "/type").unwrap_or("");
            if ty != "Normal" && ty != "Warning" {
                causes.push(Cause::invalid(
                    "type",
                    &json!(""),
                    &format!("has invalid value: {ty}"),
                ));
            }
            for f in ["firstTimestamp", "lastTimestamp", "count", "source"] {
                if !is_unset(new.get(f)) {
                    causes.push(Cause::invalid(f, &json!(""), "needs to be unset"));
                }
            }
        }
        Some(old) => {
            if !same_event_field(new.get("series"), old.get("series")) {
                causes.extend(event_series_causes(new));
            }
            // In ValidateEventUpdate's order (it checks `reason` twice).
            for (stored, path) in [
                ("involvedObject", "involvedObject"),
                ("reason", "reason"),
                ("message", "message"),
                ("source", "source"),
                ("firstTimestamp", "firstTimestamp"),
                ("lastTimestamp", "lastTimestamp"),
                ("count", "count"),
                ("reason", "reason"),
                ("type", "type"),
                ("eventTime", "eventTime"),
                ("action", "action"),
                ("related", "related"),
                ("reportingComponent", "reportingController"),
                ("reportingInstance", "reportingInstance"),
            ] {
                if !same_event_field(new.get(stored), old.get(stored)) {
                    causes.push(Cause::invalid(
                        path,
                        new.get(stored).unwrap_or(&Value::Null),
                        "field is immutable",
                    ));
                }
            }
        }
    }
    causes
}

/// A Go zero value: absent, null, "", 0, false, or an object of zero values.
fn is_unset(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Number(n)) => n.as_f64() == Some(0.0),
        Some(Value::Bool(b)) => !b,
        Some(Value::Object(m)) => m.values().all(|v| is_unset(Some(v))),
        Some(Value::Array(a)) => a.is_empty(),
    }
}

/// Equal as Go structs: zero values and absent fields compare equal.
fn same_event_field(a: Option<&Value>, b: Option<&Value>) -> bool {
    without_zero(a) == without_zero(b)
}

/// A value with its zero-valued fields dropped (null when it is all zero).
fn without_zero(v: Option<&Value>) -> Value {
    match v {
        _ if is_unset(v) => Value::Null,
        Some(Value::Object(m)) => Value::Object(
            m.iter()
                .filter(|(_, x)| !is_unset(Some(x)))
                .map(|(k, x)| (k.clone(), without_zero(Some(x))))
                .collect(),
        ),
        Some(other) => other.clone(),
        None => Value::Null,
    }
}

fn event_series_causes(ev: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    if let Some(series) = ev.get("series").filter(|s| !s.is_null()) {
        if series.get("count").and_then(Value::as_i64).unwrap_or(0) < 2 {
            causes.push(Cause::invalid(
                "series.count",
                &json!(""),
                "should be at least 2",
            ));
        }
        if is_unset(series.get("lastObservedTime")) {
            causes.push(Cause::required("series.lastObservedTime", ""));
        }
    }
    causes
}

/// `legacyValidateEvent`: namespaces agree; an Event with an `eventTime` names its
/// reporter, action and reason within their limits.
fn legacy_event_causes(ev: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let ns = str_at(ev, "/metadata/namespace").unwrap_or("");
    let inv_ns = str_at(ev, "/involvedObject/namespace").unwrap_or("");
    let mismatch = || {
        Cause::invalid(
            "involvedObject.namespace",
            &json!(inv_ns),
            "does not match event.namespace",
        )
    };
    let len = |f: &str| str_at(ev, f).map_or(0, str::len);
    if is_unset(ev.get("eventTime")) {
        if (inv_ns.is_empty() && !ns.is_empty() && ns != "default")
            || (!inv_ns.is_empty() && ns != inv_ns)
        {
            causes.push(mismatch());
        }
        return causes;
    }
    if inv_ns.is_empty() && ns != "default" && ns != "kube-system" {
        causes.push(mismatch());
    }
    let controller = str_at(ev, "/reportingComponent").unwrap_or("");
    if controller.is_empty() {
        causes.push(Cause::required("reportingController", ""));
    }
    if !is_qualified_name(controller) {
        causes.push(Cause::invalid(
            "reportingController",
            &json!(controller),
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
        ));
    }
    for (field, path, limit) in [
        ("/reportingInstance", "reportingInstance", 128),
        ("/action", "action", 128),
        ("/reason", "reason", 128),
    ] {
        if len(field) == 0 {
            causes.push(Cause::required(path, ""));
        }
        if len(field) > limit {
            causes.push(Cause::invalid(
                path,
                &json!(""),
                &format!("can have at most {limit} characters"),
            ));
        }
    }
    if len("/message") > 1024 {
        causes.push(Cause::invalid(
            "message",
            &json!(""),
            "can have at most 1024 characters",
        ));
    }
    causes
}
