//! PATCH content types and selectors.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testkube::ApiServer;

use crate::conformance::{cm, node, pod, raw};

#[tokio::test]
async fn merge_patch_sets_and_removes_fields() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let got = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"data": {"k": null, "n": "1"}, "metadata": {"labels": {"x": "y"}}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        got.data.unwrap(),
        [("n".to_string(), "1".to_string())].into()
    );
    assert_eq!(got.metadata.labels.unwrap()["x"], "y");
}

#[tokio::test]
async fn json_patch_applies_operations_and_test_failures_are_errors() {
    let s = ApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(s.client());
    nodes
        .create(&PostParams::default(), &node("n1"))
        .await
        .unwrap();
    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "add", "path": "/spec/unschedulable", "value": true},
        {"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}]))
    .unwrap();
    let got = nodes
        .patch("n1", &PatchParams::default(), &Patch::<()>::Json(ops))
        .await
        .unwrap();
    assert_eq!(got.spec.unwrap().unschedulable, Some(true));
    let failing: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/spec/unschedulable", "value": false}]))
    .unwrap();
    match nodes
        .patch("n1", &PatchParams::default(), &Patch::<()>::Json(failing))
        .await
    {
        Err(kube::Error::Api(st)) => assert_eq!(st.code, 422),
        other => panic!("a failed test op is an error, got {other:?}"),
    }
}

#[tokio::test]
async fn strategic_merge_patch_merges_node_addresses_by_type() {
    let s = ApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(s.client());
    let n: Node =
        serde_json::from_value(json!({"metadata": {"name": "n1"}, "status": {"addresses": [
        {"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "n1"}]}}))
        .unwrap();
    nodes.create(&PostParams::default(), &n).await.unwrap();
    let got = nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.5"}]}}),
            ),
        )
        .await
        .unwrap();
    let addrs: Vec<(String, String)> = got
        .status
        .unwrap()
        .addresses
        .unwrap()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert_eq!(
        addrs,
        [
            ("InternalIP".into(), "127.0.0.5".into()),
            ("Hostname".into(), "n1".into())
        ]
    );
    // A merge patch replaces the whole list instead.
    let got = nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.6"}]}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(got.status.unwrap().addresses.unwrap().len(), 1);
}

#[tokio::test]
async fn patch_with_a_stale_resource_version_conflicts() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let a = api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let rv = a.metadata.resource_version.unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    match api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"resourceVersion": rv}, "data": {"k": "3"}})),
        )
        .await
    {
        Err(kube::Error::Api(st)) => assert_eq!((st.code, st.reason.as_str()), (409, "Conflict")),
        other => panic!("expected a conflict, got {other:?}"),
    }
}

#[tokio::test]
async fn unsupported_patch_types_are_415() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let (code, _, body) = raw(
        &s,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/a",
        "application/apply-patch+yaml",
        b"data: {}".to_vec(),
    )
    .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (415, Some("UnsupportedMediaType"))
    );
    // The refusal names the gap rather than looking like a client mistake.
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("server-side apply is not implemented by this API double"),
        "{body}"
    );
}

#[tokio::test]
async fn label_selectors_filter_lists() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    for (name, app) in [("a", Some("web")), ("b", Some("db")), ("c", None)] {
        let mut c = cm(name);
        if let Some(app) = app {
            c.metadata.labels = Some([("app".to_string(), app.to_string())].into());
        }
        api.create(&PostParams::default(), &c).await.unwrap();
    }
    let names = |sel: &'static str| {
        let api = api.clone();
        async move {
            api.list(&ListParams::default().labels(sel))
                .await
                .unwrap()
                .items
                .into_iter()
                .map(|c| c.metadata.name.unwrap())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(names("app=web").await, ["a"]);
    assert_eq!(names("app==db").await, ["b"]);
    assert_eq!(names("app!=web").await, ["b", "c"]);
    assert_eq!(names("app in (web,db)").await, ["a", "b"]);
    assert_eq!(names("app notin (web)").await, ["b", "c"]);
    assert_eq!(names("app").await, ["a", "b"]);
    assert_eq!(names("!app").await, ["c"]);
}

#[tokio::test]
async fn field_selectors_on_node_name_and_metadata_name() {
    let s = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(s.client(), "default");
    pods.create(&PostParams::default(), &pod("a", Some("n1")))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("b", Some("n2")))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("c", None))
        .await
        .unwrap();
    let all: Api<Pod> = Api::all(s.client());
    let names = |sel: &'static str| {
        let all = all.clone();
        async move {
            all.list(&ListParams::default().fields(sel))
                .await
                .unwrap()
                .items
                .into_iter()
                .map(|c| c.metadata.name.unwrap())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(names("spec.nodeName=n1").await, ["a"]);
    assert_eq!(names("spec.nodeName=").await, ["c"]);
    assert_eq!(names("spec.nodeName!=n1").await, ["b", "c"]);
    assert_eq!(names("metadata.name=b").await, ["b"]);
    assert_eq!(
        names("status.phase=Pending,metadata.namespace=default").await,
        ["a", "b", "c"]
    );
    match all
        .list(&ListParams::default().fields("spec.bogus=x"))
        .await
    {
        Err(kube::Error::Api(st)) => {
            assert_eq!(st.code, 400);
            assert_eq!(st.message, "field label not supported: spec.bogus");
        }
        other => panic!("expected 400, got {other:?}"),
    }
}

#[tokio::test]
async fn tables_are_served_to_clients_that_ask_for_them() {
    use http_body_util::BodyExt;
    let s = ApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(s.client());
    let mut n = node("n1");
    n.metadata.labels = Some(
        [(
            "node-role.kubernetes.io/control-plane".to_string(),
            String::new(),
        )]
        .into(),
    );
    nodes.create(&PostParams::default(), &n).await.unwrap();
    let req = http::Request::builder()
        .uri("/api/v1/nodes")
        .header(
            "accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .body(kube::client::Body::empty())
        .unwrap();
    let resp = s.client().send(req).await.unwrap();
    let body: serde_json::Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["kind"], "Table");
    let cols: Vec<&str> = body["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["priority"] == 0)
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(cols, ["Name", "Status", "Roles", "Age", "Version"]);
    let cells = &body["rows"][0]["cells"];
    assert_eq!(
        (cells[0].as_str(), cells[1].as_str(), cells[2].as_str()),
        (Some("n1"), Some("Unknown"), Some("control-plane"))
    );
    assert_eq!(body["rows"][0]["object"]["metadata"]["name"], "n1");
}

/// `apimachinery/pkg/util/strategicpatch/patch.go` with the `patchMergeKey` of
/// `PodSpec.SchedulingGates` (`name`) in `k8s.io/api/core/v1/types.go`.
#[tokio::test]
async fn strategic_merge_patch_delete_directive_removes_only_the_named_scheduling_gate() {
    let s = ApiServer::start().await.unwrap();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(s.client(), "default");
    let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "g"}, "spec": {
            "containers": [{"name": "c", "image": "busybox:1.36"}],
            "schedulingGates": [{"name": "example.com/a"}, {"name": "example.com/b"}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
    let got = pods
        .patch(
            "g",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"schedulingGates": [
                {"name": "example.com/a", "$patch": "delete"}]}})),
        )
        .await
        .unwrap();
    let gates: Vec<String> = got
        .spec
        .unwrap()
        .scheduling_gates
        .unwrap_or_default()
        .into_iter()
        .map(|g| g.name)
        .collect();
    assert_eq!(gates, ["example.com/b"]);
    // A list element without its merge key is refused, not stored.
    let err = pods
        .patch(
            "g",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"schedulingGates": [{"$patch": "delete"}]}})),
        )
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(st) => assert_eq!(st.code, 422, "{st:?}"),
        other => panic!("{other}"),
    }
}

fn api_status(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error Status, got {other:?}"),
    }
}

/// `ValidateObjectMetaAccessorUpdate` -> `ValidateNoNewFinalizers`
/// (`staging/src/k8s.io/apimachinery/pkg/api/validation/objectmeta.go`): once an object
/// is being deleted, no write may add a finalizer, whether an update or a merge,
/// strategic or JSON patch (they all end in the same update validation); removing
/// finalizers or keeping the set still works.
#[tokio::test]
async fn an_object_being_deleted_takes_no_new_finalizers_from_any_write() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let mut c = cm("held");
    c.metadata.finalizers = Some(vec!["example.com/a".into(), "example.com/b".into()]);
    api.create(&PostParams::default(), &c).await.unwrap();
    api.delete("held", &Default::default()).await.unwrap();
    let want = r#"ConfigMap "held" is invalid: metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{"example.com/c"}"#;
    let check = |st: kube::core::Status| {
        assert_eq!((st.code, st.reason.as_str()), (422, "Invalid"), "{st:?}");
        assert_eq!(st.message, want);
        let causes = st.details.expect("details").causes;
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert_eq!(causes[0].field, "metadata.finalizers");
        assert_eq!(causes[0].reason, "FieldValueForbidden");
    };
    let pp = PatchParams::default();
    let merge =
        json!({"metadata": {"finalizers": ["example.com/a", "example.com/b", "example.com/c"]}});
    check(api_status(
        api.patch("held", &pp, &Patch::Merge(&merge))
            .await
            .unwrap_err(),
    ));
    let strategic = json!({"metadata": {"finalizers": ["example.com/c"]}});
    check(api_status(
        api.patch("held", &pp, &Patch::Strategic(&strategic))
            .await
            .unwrap_err(),
    ));
    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "add", "path": "/metadata/finalizers/-", "value": "example.com/c"}]))
    .unwrap();
    check(api_status(
        api.patch("held", &pp, &Patch::<()>::Json(ops))
            .await
            .unwrap_err(),
    ));
    let mut put = api.get("held").await.unwrap();
    put.metadata
        .finalizers
        .as_mut()
        .unwrap()
        .push("example.com/c".into());
    check(api_status(
        api.replace("held", &Default::default(), &put)
            .await
            .unwrap_err(),
    ));
    // The same set, reordered, and fewer finalizers are fine.
    let same = json!({"metadata": {"finalizers": ["example.com/b", "example.com/a"]}});
    api.patch("held", &pp, &Patch::Merge(&same)).await.unwrap();
    let fewer = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["example.com/b"]}});
    let got = api
        .patch("held", &pp, &Patch::Strategic(&fewer))
        .await
        .unwrap();
    assert_eq!(got.metadata.finalizers, Some(vec!["example.com/a".into()]));
    assert!(got.metadata.deletion_timestamp.is_some());
}

/// `strategicpatch.mergeSlice` (`staging/src/k8s.io/apimachinery/pkg/util/strategicpatch/patch.go`):
/// `finalizers` (`patchStrategy:"merge"`, strings) merge as a set with new values first
/// and take `$deleteFromPrimitiveList/finalizers`; a `{"$patch": ...}` map in it is an
/// element of another type, which kube-apiserver refuses, and so does the double. A list
/// without a strategy (`args`) is replaced; a `$patch` map in it is refused (422).
#[tokio::test]
async fn strategic_merge_patch_of_primitive_lists_and_patch_directives_in_them() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let mut c = cm("f");
    c.metadata.finalizers = Some(vec!["example.com/a".into()]);
    api.create(&PostParams::default(), &c).await.unwrap();
    let pp = PatchParams::default();
    let got = api
        .patch(
            "f",
            &pp,
            &Patch::Strategic(json!({"metadata": {"finalizers": ["example.com/b"]}})),
        )
        .await
        .unwrap();
    assert_eq!(
        got.metadata.finalizers,
        Some(vec!["example.com/b".into(), "example.com/a".into()])
    );
    for d in ["replace", "delete"] {
        let st = api_status(
            api.patch(
                "f",
                &pp,
                &Patch::Strategic(
                    json!({"metadata": {"finalizers": ["example.com/c", {"$patch": d}]}}),
                ),
            )
            .await
            .unwrap_err(),
        );
        assert_eq!(st.code, 422, "{st:?}");
        assert!(
            st.message
                .starts_with("list element types are not identical")
                && st.message.contains("$deleteFromPrimitiveList/finalizers"),
            "{}",
            st.message
        );
    }
    // Nothing was stored by the refused patches.
    let now = api.get("f").await.unwrap();
    assert_eq!(now.metadata.finalizers, got.metadata.finalizers);
    assert_eq!(now.metadata.resource_version, got.metadata.resource_version);

    // A pod's args are immutable; a Deployment's pod template takes the same patch.
    let deps: Api<Deployment> = Api::namespaced(s.client(), "default");
    let d: Deployment = serde_json::from_value(json!({"metadata": {"name": "argv"},
        "spec": {"selector": {"matchLabels": {"app": "a"}},
            "template": {"metadata": {"labels": {"app": "a"}},
                "spec": {"containers": [{"name": "c", "image": "busybox:1.36", "args": ["-a", "-b"]}]}}}}))
    .unwrap();
    deps.create(&PostParams::default(), &d).await.unwrap();
    let args = |a: serde_json::Value| {
        Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [
            {"name": "c", "args": a}]}}}}))
    };
    let st = api_status(
        deps.patch("argv", &pp, &args(json!(["-x", {"$patch": "replace"}])))
            .await
            .unwrap_err(),
    );
    assert_eq!(st.code, 422, "{st:?}");
    assert!(
        st.message.starts_with("args has no merge strategy"),
        "{}",
        st.message
    );
    let got = deps.patch("argv", &pp, &args(json!(["-x"]))).await.unwrap();
    let spec = got.spec.unwrap().template.spec.unwrap();
    assert_eq!(spec.containers[0].args, Some(vec!["-x".to_string()]));
}
