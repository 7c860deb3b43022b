//! What kube-apiserver refuses: typed decoding
//! (`staging/src/k8s.io/apiserver/pkg/endpoints/handlers/rest.go`, `fieldValidation`),
//! and the kind validations of `pkg/apis/core/validation/validation.go` and
//! `pkg/apis/rbac/validation/validation.go`.

use base64::Engine;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testkube::ApiServer;

use crate::conformance::{json_req, node, raw};

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn status(r: Result<impl std::fmt::Debug, kube::Error>) -> (u16, String) {
    match r {
        Ok(_) => (200, String::new()),
        Err(kube::Error::Api(s)) => (s.code, s.message),
        Err(e) => panic!("expected an HTTP answer, got {e}"),
    }
}

/// `handlers/rest.go`: unknown fields are dropped with a Warning by default.
#[tokio::test]
async fn unknown_fields_are_dropped_with_a_warning_header() {
    let s = ApiServer::start().await.unwrap();
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "a"}, "data": {"k": "v"}, "dataa": {"typo": "x"}});
    let (code, headers, got) = raw(
        &s,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        "application/json",
        serde_json::to_vec(&body).unwrap(),
    )
    .await;
    assert_eq!(code, 201, "{got}");
    assert!(got.get("dataa").is_none(), "unknown fields are not stored");
    let warning = headers.get("warning").unwrap().to_str().unwrap();
    assert_eq!(warning, r#"299 - "unknown field \"dataa\"""#);
}

/// `fieldValidation=Strict` answers 400 naming the field.
#[tokio::test]
async fn strict_field_validation_refuses_unknown_fields_with_400() {
    let s = ApiServer::start().await.unwrap();
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "a", "labelz": {}}, "data": {"k": "v"}});
    let (code, got) = json_req(
        &s,
        "POST",
        "/api/v1/namespaces/default/configmaps?fieldValidation=Strict",
        body,
    )
    .await;
    assert_eq!(code, 400, "{got}");
    assert!(
        got["message"]
            .as_str()
            .unwrap()
            .contains("unknown field \"metadata.labelz\""),
        "{got}"
    );
    let (code, _) = json_req(
        &s,
        "POST",
        "/api/v1/namespaces/default/configmaps?fieldValidation=Sometimes",
        json!({"metadata": {"name": "b"}}),
    )
    .await;
    assert_eq!(code, 400);
}

/// A value of the wrong type cannot be decoded: 400, for a number where a string
/// belongs and for Secret data that is not base64.
#[tokio::test]
async fn wrong_types_are_400() {
    let s = ApiServer::start().await.unwrap();
    let (code, got) = json_req(
        &s,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        json!({"metadata": {"name": "a"}, "data": {"k": 1}}),
    )
    .await;
    assert_eq!(code, 400, "{got}");
    let (code, got) = json_req(
        &s,
        "POST",
        "/api/v1/namespaces/default/secrets",
        json!({"metadata": {"name": "a"}, "data": {"k": "not base64!"}}),
    )
    .await;
    assert_eq!(code, 400, "{got}");
}

/// `pkg/apis/core/v1/conversion.go`: stringData overwrites data and is never stored.
#[tokio::test]
async fn secret_string_data_is_merged_into_data_and_not_stored() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<Secret> = Api::namespaced(s.client(), "default");
    let sec: Secret = serde_json::from_value(json!({"metadata": {"name": "a"},
        "data": {"x": b64("old"), "y": b64("keep")}, "stringData": {"x": "new", "z": "added"}}))
    .unwrap();
    let got = api.create(&PostParams::default(), &sec).await.unwrap();
    assert!(got.string_data.is_none());
    let d = got.data.unwrap();
    assert_eq!(d["x"].0, b"new");
    assert_eq!(d["y"].0, b"keep");
    assert_eq!(d["z"].0, b"added");
    let got = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"y": "patched"}})),
        )
        .await
        .unwrap();
    assert_eq!(got.data.unwrap()["y"].0, b"patched");
    assert!(api.get("a").await.unwrap().string_data.is_none());
}

/// `ValidateSecret`: data over 1 MiB is 422 Too long; key names are config keys.
#[tokio::test]
async fn secret_size_and_key_names_are_validated() {
    let s = ApiServer::start().await.unwrap();
    let big = "x".repeat(1024 * 1024 + 1);
    let (code, got) = json_req(
        &s,
        "POST",
        "/api/v1/namespaces/default/secrets",
        json!({"metadata": {"name": "big"}, "data": {"k": b64(&big)}}),
    )
    .await;
    assert_eq!(code, 422, "{}", got["message"]);
    assert!(
        got["message"]
            .as_str()
            .unwrap()
            .contains("data: Too long: must have at most 1048576 bytes")
    );
    for bad in ["a/b", "..x", "."] {
        let (code, got) = json_req(
            &s,
            "POST",
            "/api/v1/namespaces/default/secrets",
            json!({"metadata": {"name": "k"}, "data": {bad: b64("v")}}),
        )
        .await;
        assert_eq!(code, 422, "{bad}: {got}");
        assert_eq!(got["details"]["causes"][0]["field"], format!("data[{bad}]"));
    }
    let (code, got) = json_req(
        &s,
        "POST",
        "/api/v1/namespaces/default/secrets",
        json!({"metadata": {"name": "t"}, "type": "kubernetes.io/tls", "data": {"tls.crt": b64("c")}}),
    )
    .await;
    assert_eq!(code, 422, "{got}");
    assert_eq!(got["details"]["causes"][0]["field"], "data[tls.key]");
}

/// `ValidateSecretUpdate` / `ValidateConfigMapUpdate`: type is immutable, and an
/// `immutable: true` object keeps its data.
#[tokio::test]
async fn secret_type_and_immutable_objects_cannot_change() {
    let s = ApiServer::start().await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(s.client(), "default");
    let sec: Secret =
        serde_json::from_value(json!({"metadata": {"name": "a"}, "data": {"k": b64("v")}}))
            .unwrap();
    secrets.create(&PostParams::default(), &sec).await.unwrap();
    let (code, msg) = status(
        secrets
            .patch(
                "a",
                &PatchParams::default(),
                &Patch::Merge(json!({"type": "example.com/other"})),
            )
            .await,
    );
    assert_eq!(code, 422);
    assert!(
        msg.contains("type: Invalid value: \"example.com/other\": field is immutable"),
        "{msg}"
    );
    secrets
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"immutable": true})),
        )
        .await
        .unwrap();
    let (code, msg) = status(
        secrets
            .patch(
                "a",
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"k": b64("w")}})),
            )
            .await,
    );
    assert_eq!(code, 422);
    assert!(
        msg.contains("data: Forbidden: field is immutable when `immutable` is set"),
        "{msg}"
    );
    let (code, _) = status(
        secrets
            .patch(
                "a",
                &PatchParams::default(),
                &Patch::Merge(json!({"immutable": false})),
            )
            .await,
    );
    assert_eq!(code, 422);
    // Labels may still change.
    secrets
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let cm: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "c"}, "immutable": true, "data": {"k": "v"}}),
    )
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let (code, _) = status(
        cms.patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "w"}})),
        )
        .await,
    );
    assert_eq!(code, 422);
}

/// `ValidateNodeUpdate`: duplicate addresses (main and status writes), podCIDRs and
/// providerID fixed once set, taints validated.
#[tokio::test]
async fn node_updates_are_validated() {
    let s = ApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(s.client());
    let mut n = node("n1");
    n.spec.as_mut().unwrap().pod_cidrs = Some(vec!["10.1.0.0/24".into()]);
    n.spec.as_mut().unwrap().pod_cidr = Some("10.1.0.0/24".into());
    n.spec.as_mut().unwrap().provider_id = Some("stratum://n1".into());
    nodes.create(&PostParams::default(), &n).await.unwrap();
    let dup = json!({"status": {"addresses": [
        {"type": "InternalIP", "address": "127.0.0.1"}, {"type": "InternalIP", "address": "127.0.0.1"}]}});
    let (code, msg) = status(
        nodes
            .patch_status("n1", &PatchParams::default(), &Patch::Merge(dup))
            .await,
    );
    assert_eq!(code, 422, "{msg}");
    assert!(
        msg.contains("status.addresses[1]: Duplicate value"),
        "{msg}"
    );
    for (field, patch) in [
        (
            "spec.podCIDRs",
            json!({"spec": {"podCIDRs": ["10.2.0.0/24"]}}),
        ),
        (
            "spec.providerID",
            json!({"spec": {"providerID": "other://n1"}}),
        ),
    ] {
        let (code, msg) = status(
            nodes
                .patch("n1", &PatchParams::default(), &Patch::Merge(patch))
                .await,
        );
        assert_eq!(code, 422, "{field}: {msg}");
        assert!(msg.contains(field), "{msg}");
    }
    for taint in [
        json!({"key": "", "effect": "NoSchedule"}),
        json!({"key": "k", "effect": "Sometimes"}),
        json!({"key": "bad key", "effect": "NoSchedule"}),
    ] {
        let (code, msg) = status(
            nodes
                .patch(
                    "n1",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"taints": [taint]}})),
                )
                .await,
        );
        assert_eq!(code, 422, "{taint}: {msg}");
    }
    let twice = json!({"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}, {"key": "k", "value": "v", "effect": "NoSchedule"}]}});
    let (code, _) = status(
        nodes
            .patch("n1", &PatchParams::default(), &Patch::Merge(twice))
            .await,
    );
    assert_eq!(code, 422);
}

/// `ValidateRoleBindingUpdate`: roleRef cannot change.
#[tokio::test]
async fn role_binding_role_ref_is_immutable() {
    let s = ApiServer::start().await.unwrap();
    let rbs: Api<RoleBinding> = Api::namespaced(s.client(), "default");
    let rb: RoleBinding = serde_json::from_value(json!({"metadata": {"name": "rb"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "a"},
        "subjects": [{"kind": "User", "name": "u", "apiGroup": "rbac.authorization.k8s.io"}]}))
    .unwrap();
    rbs.create(&PostParams::default(), &rb).await.unwrap();
    let (code, msg) = status(
        rbs.patch(
            "rb",
            &PatchParams::default(),
            &Patch::Merge(json!({"roleRef": {"name": "b"}})),
        )
        .await,
    );
    assert_eq!(code, 422);
    assert!(msg.contains("cannot change roleRef"), "{msg}");
    let v: Value = serde_json::to_value(rbs.get("rb").await.unwrap()).unwrap();
    assert_eq!(v["roleRef"]["name"], "a");
}

/// `pkg/registry/coordination/lease/strategy.go`: `AllowUnconditionalUpdate` is false,
/// so a Lease update without a resourceVersion is 422; `AllowCreateOnUpdate` is true
/// for Leases, Events and the RBAC kinds (`pkg/registry/rbac/*/strategy.go`).
#[tokio::test]
async fn lease_update_needs_a_resource_version_and_put_creates_leases_roles_bindings_events() {
    let s = ApiServer::start().await.unwrap();
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}});
    let path = "/apis/coordination.k8s.io/v1/namespaces/default/leases/l";
    let (code, got) = json_req(&s, "PUT", path, lease.clone()).await;
    assert_eq!(code, 201, "PUT of a missing Lease creates it: {got}");
    let (code, got) = json_req(&s, "PUT", path, lease.clone()).await;
    assert_eq!(code, 422, "{got}");
    assert_eq!(
        got["details"]["causes"][0]["field"],
        "metadata.resourceVersion"
    );
    let mut with_rv = lease.clone();
    with_rv["metadata"]["resourceVersion"] = got["metadata"]["resourceVersion"].clone();
    let (_, current) = json_req(&s, "GET", path, Value::Null).await;
    with_rv["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
    with_rv["spec"]["holderIdentity"] = json!("b");
    let (code, got) = json_req(&s, "PUT", path, with_rv).await;
    assert_eq!(code, 200, "{got}");
    for (path, body) in [
        (
            "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles/r",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "r"}, "rules": []}),
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings/rb",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "rb"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"}}),
        ),
        (
            "/api/v1/namespaces/default/events/e",
            json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"},
                "involvedObject": {"kind": "Pod", "name": "p"}, "reason": "R", "message": "m"}),
        ),
    ] {
        let (code, got) = json_req(&s, "PUT", path, body).await;
        assert_eq!(code, 201, "{path}: {got}");
    }
    // Kinds without AllowCreateOnUpdate stay 404.
    let (code, _) = json_req(
        &s,
        "PUT",
        "/api/v1/namespaces/default/configmaps/nope",
        json!({"metadata": {"name": "nope"}}),
    )
    .await;
    assert_eq!(code, 404);
}
