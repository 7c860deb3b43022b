//! Typed decoding of request bodies, as kube-apiserver decodes into Go structs: every
//! served kind goes through its `k8s-openapi` type, so a value of the wrong type (a number
//! where a string belongs, Secret data that is not base64) is a 400, and fields the type
//! does not have are dropped with a `Warning` (`fieldValidation=Warn`, the default),
//! dropped silently (`Ignore`) or refused with 400 (`Strict`), as
//! `staging/src/k8s.io/apiserver/pkg/endpoints/handlers/rest.go` does. The Secret
//! conversion merges `stringData` into `data` (`pkg/apis/core/v1/conversion.go`).

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::resources::Resource;
use crate::status::ApiError;

/// How unknown fields are treated (`fieldValidation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    /// Drop silently.
    Ignore,
    /// Drop with a Warning header (the default).
    Warn,
    /// Refuse with 400.
    Strict,
}

impl FieldValidation {
    /// From the query parameter; anything else is a 400 as in kube-apiserver.
    pub fn parse(v: Option<&str>) -> Result<Self, ApiError> {
        match v {
            None | Some("") | Some("Warn") => Ok(FieldValidation::Warn),
            Some("Ignore") => Ok(FieldValidation::Ignore),
            Some("Strict") => Ok(FieldValidation::Strict),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation parameter unsupported: {other}"
            ))),
        }
    }
}

fn roundtrip<T: DeserializeOwned + Serialize>(v: &Value) -> Result<Value, String> {
    let t: T = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(&t).map_err(|e| e.to_string())
}

/// The object as its Go type would hold it, or the decoding error.
fn through_type(res: &Resource, obj: &Value) -> Option<Result<Value, String>> {
    use k8s_openapi::api::{admissionregistration, apps, coordination, core, events, rbac};
    Some(match (res.group, res.plural) {
        ("", "namespaces") => roundtrip::<core::v1::Namespace>(obj),
        ("", "nodes") => roundtrip::<core::v1::Node>(obj),
        ("", "pods") => roundtrip::<core::v1::Pod>(obj),
        ("", "secrets") => roundtrip::<core::v1::Secret>(obj),
        ("", "configmaps") => roundtrip::<core::v1::ConfigMap>(obj),
        ("", "serviceaccounts") => roundtrip::<core::v1::ServiceAccount>(obj),
        ("", "events") => roundtrip::<core::v1::Event>(obj),
        ("", "services") => roundtrip::<core::v1::Service>(obj),
        ("", "endpoints") => roundtrip::<core::v1::Endpoints>(obj),
        ("coordination.k8s.io", "leases") => roundtrip::<coordination::v1::Lease>(obj),
        ("events.k8s.io", "events") => roundtrip::<events::v1::Event>(obj),
        ("rbac.authorization.k8s.io", "roles") => roundtrip::<rbac::v1::Role>(obj),
        ("rbac.authorization.k8s.io", "rolebindings") => roundtrip::<rbac::v1::RoleBinding>(obj),
        ("rbac.authorization.k8s.io", "clusterroles") => roundtrip::<rbac::v1::ClusterRole>(obj),
        ("rbac.authorization.k8s.io", "clusterrolebindings") => {
            roundtrip::<rbac::v1::ClusterRoleBinding>(obj)
        }
        ("admissionregistration.k8s.io", "validatingadmissionpolicies") => {
            roundtrip::<admissionregistration::v1::ValidatingAdmissionPolicy>(obj)
        }
        ("admissionregistration.k8s.io", "validatingadmissionpolicybindings") => {
            roundtrip::<admissionregistration::v1::ValidatingAdmissionPolicyBinding>(obj)
        }
        ("apps", "daemonsets") => roundtrip::<apps::v1::DaemonSet>(obj),
        ("apps", "deployments") => roundtrip::<apps::v1::Deployment>(obj),
        _ => return None,
    })
}

/// Paths (`spec.foo`, `spec.containers[0].bar`) present with a value in `input` and
/// absent from the typed round trip.
fn unknown_fields(input: &Value, typed: &Value, path: &str, out: &mut Vec<String>) {
    match (input, typed) {
        (Value::Object(i), Value::Object(t)) => {
            for (k, v) in i {
                let here = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match t.get(k) {
                    None if !v.is_null() => out.push(here),
                    None => {}
                    Some(tv) => unknown_fields(v, tv, &here, out),
                }
            }
        }
        (Value::Array(i), Value::Array(t)) => {
            for (n, (iv, tv)) in i.iter().zip(t).enumerate() {
                unknown_fields(iv, tv, &format!("{path}[{n}]"), out);
            }
        }
        _ => {}
    }
}

/// Checks a manifest document offline against the schema its `k8s-openapi` type carries,
/// as `kubectl apply --validate=strict` would have the server do: the kind must be one
/// this double decodes through a type (anything else is an error, never a pass), values
/// must have their types, and no field may be unknown.
pub fn validate_strict(obj: &Value) -> Result<(), String> {
    let api_version = obj["apiVersion"].as_str().unwrap_or_default();
    let kind = obj["kind"].as_str().unwrap_or_default();
    let res = crate::resources::find_kind(api_version, kind)
        .ok_or_else(|| format!("{api_version} {kind} is not a kind the API double serves"))?;
    if through_type(res, obj).is_none() {
        return Err(format!(
            "{api_version} {kind} has no typed decoder here: add it to typed::through_type"
        ));
    }
    decode(res, obj.clone(), FieldValidation::Strict)
        .map(|_| ())
        .map_err(|e| e.message)
}

/// Decodes `obj` as its kind's type. Returns the object as stored (unknown fields
/// dropped, Secret `stringData` merged into `data`) and the warnings to send.
pub fn decode(
    res: &Resource,
    obj: Value,
    fv: FieldValidation,
) -> Result<(Value, Vec<String>), ApiError> {
    let cannot = |why: &str| {
        ApiError::bad_request(format!(
            "{kind} in version \"{v}\" cannot be handled as a {kind}: {why}",
            kind = res.kind,
            v = res.version
        ))
    };
    let Some(typed) = through_type(res, &obj) else {
        return Ok((obj, Vec::new()));
    };
    let mut typed = typed.map_err(|e| cannot(&e))?;
    let mut unknown = Vec::new();
    unknown_fields(&obj, &typed, "", &mut unknown);
    if fv == FieldValidation::Strict && !unknown.is_empty() {
        let list: Vec<String> = unknown
            .iter()
            .map(|f| format!("unknown field \"{f}\""))
            .collect();
        return Err(cannot(&format!(
            "strict decoding error: {}",
            list.join(", ")
        )));
    }
    if res.plural == "secrets" {
        merge_string_data(&mut typed);
    }
    let warnings = if fv == FieldValidation::Warn {
        unknown
            .iter()
            .map(|f| format!("unknown field \"{f}\""))
            .collect()
    } else {
        Vec::new()
    };
    Ok((typed, warnings))
}

/// `stringData` entries overwrite `data` entries (base64-encoded) and are never stored.
fn merge_string_data(secret: &mut Value) {
    use base64::Engine;
    let Some(sd) = secret.as_object_mut().and_then(|m| m.remove("stringData")) else {
        return;
    };
    let Some(sd) = sd.as_object() else { return };
    if sd.is_empty() {
        return;
    }
    if !secret["data"].is_object() {
        secret["data"] = Value::Object(Default::default());
    }
    for (k, v) in sd {
        let s = v.as_str().unwrap_or("");
        secret["data"][k] =
            Value::String(base64::engine::general_purpose::STANDARD.encode(s.as_bytes()));
    }
}

/// The `Warning` header value for a message (RFC 7234 warn-code 299, agent `-`).
pub fn warning_header(message: &str) -> String {
    let escaped = message.replace('\\', "\\\\").replace('"', "\\\"");
    format!("299 - \"{escaped}\"")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::find;
    use serde_json::json;

    #[test]
    fn unknown_fields_are_found_and_dropped() {
        let pods = find("", "v1", "pods").unwrap();
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "bogus": 1},
            "spec": {"containers": [{"name": "c", "image": "i", "imag": "typo"}], "nope": null}});
        let (out, warnings) = decode(pods, pod.clone(), FieldValidation::Warn).unwrap();
        assert_eq!(
            warnings,
            [
                "unknown field \"metadata.bogus\"",
                "unknown field \"spec.containers[0].imag\""
            ]
        );
        assert!(out["metadata"].get("bogus").is_none());
        let e = decode(pods, pod.clone(), FieldValidation::Strict).unwrap_err();
        assert_eq!(e.code, 400);
        assert!(
            e.message
                .contains("strict decoding error: unknown field \"metadata.bogus\""),
            "{}",
            e.message
        );
        assert!(
            decode(pods, pod, FieldValidation::Ignore)
                .unwrap()
                .1
                .is_empty()
        );
    }

    #[test]
    fn wrong_types_and_bad_base64_are_400() {
        let cms = find("", "v1", "configmaps").unwrap();
        let e = decode(cms, json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": 1}}), FieldValidation::Warn).unwrap_err();
        assert_eq!(e.code, 400);
        let secrets = find("", "v1", "secrets").unwrap();
        let e = decode(secrets, json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "a"}, "data": {"k": "***"}}), FieldValidation::Warn).unwrap_err();
        assert_eq!(e.code, 400);
    }

    #[test]
    fn string_data_is_merged_into_data() {
        let secrets = find("", "v1", "secrets").unwrap();
        let (out, _) = decode(
            secrets,
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "a"},
            "data": {"a": "eA==", "b": "eQ=="}, "stringData": {"b": "over", "c": "new"}}),
            FieldValidation::Strict,
        )
        .unwrap();
        assert_eq!(
            out["data"],
            json!({"a": "eA==", "b": "b3Zlcg==", "c": "bmV3"})
        );
        assert!(out.get("stringData").is_none());
    }

    #[test]
    fn warning_headers_quote_the_message() {
        assert_eq!(
            warning_header("unknown field \"x\""),
            "299 - \"unknown field \\\"x\\\"\""
        );
    }
}
