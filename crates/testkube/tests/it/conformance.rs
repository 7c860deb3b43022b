//! Conformance of the API double: each test checks one documented kube-apiserver
//! behaviour (`/work/shared/API-SEMANTICS.md`) with a real kube::Client over HTTPS.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testkube::ApiServer;

pub(crate) fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap()
}

pub(crate) fn pod(name: &str, node: Option<&str>) -> Pod {
    let mut p = json!({"metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}});
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
    }
    serde_json::from_value(p).unwrap()
}

pub(crate) fn node(name: &str) -> Node {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": {},
        "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}}))
    .unwrap()
}

fn rv<K: kube::Resource>(o: &K) -> u64 {
    o.meta().resource_version.as_ref().unwrap().parse().unwrap()
}

fn api_err(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error Status, got {other:?}"),
    }
}

/// A JSON request over the admin client, without retries: (status, body).
pub(crate) async fn json_req(
    s: &ApiServer,
    method: &str,
    path: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let (code, _, v) = raw(
        s,
        method,
        path,
        "application/json",
        serde_json::to_vec(&body).unwrap(),
    )
    .await;
    (code, v)
}

#[tokio::test]
async fn resource_version_changes_on_every_write() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let a = api.create(&PostParams::default(), &cm("a")).await.unwrap();
    assert!(a.metadata.uid.as_ref().is_some_and(|u| u.len() == 36));
    assert!(a.metadata.creation_timestamp.is_some());
    let mut b = a.clone();
    b.data = Some([("k".to_string(), "w".to_string())].into());
    let b = api.replace("a", &PostParams::default(), &b).await.unwrap();
    assert!(rv(&b) > rv(&a));
    let c = api
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"x": "y"}})),
        )
        .await
        .unwrap();
    assert!(rv(&c) > rv(&b));
    // An update that changes nothing is not a write.
    let d = api.replace("a", &PostParams::default(), &c).await.unwrap();
    assert_eq!(rv(&d), rv(&c));
    api.delete("a", &DeleteParams::default()).await.unwrap();
    let st = api_err(api.get("a").await.unwrap_err());
    assert_eq!(st.code, 404);
    s.shutdown().await;
}

#[tokio::test]
async fn stale_update_is_a_409_conflict_with_the_kubernetes_message() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let a = api.create(&PostParams::default(), &cm("a")).await.unwrap();
    api.replace("a", &PostParams::default(), &a).await.unwrap();
    let mut changed = a.clone();
    changed.data = Some([("k".to_string(), "other".to_string())].into());
    api.replace("a", &PostParams::default(), &changed)
        .await
        .unwrap();
    let st = api_err(
        api.replace("a", &PostParams::default(), &changed)
            .await
            .unwrap_err(),
    );
    assert_eq!(st.code, 409);
    assert_eq!(st.reason, "Conflict");
    assert_eq!(
        st.message,
        "Operation cannot be fulfilled on configmaps \"a\": the object has been modified; please apply your changes to the latest version and try again"
    );
    assert_eq!(st.details.unwrap().kind, "configmaps");
}

#[tokio::test]
async fn create_of_an_existing_name_is_already_exists() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<Secret> = Api::namespaced(s.client(), "kube-system");
    let sec: Secret = serde_json::from_value(json!({"metadata": {"name": "s"}})).unwrap();
    api.create(&PostParams::default(), &sec).await.unwrap();
    let st = api_err(api.create(&PostParams::default(), &sec).await.unwrap_err());
    assert_eq!((st.code, st.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(st.message, "secrets \"s\" already exists");
}

#[tokio::test]
async fn namespaced_create_needs_the_namespace() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "nope");
    let st = api_err(
        api.create(&PostParams::default(), &cm("a"))
            .await
            .unwrap_err(),
    );
    assert_eq!(st.code, 404);
    assert_eq!(st.message, "namespaces \"nope\" not found");
    assert_eq!(st.details.unwrap().kind, "namespaces");
    let nss: Api<Namespace> = Api::all(s.client());
    let names: Vec<String> = nss
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|n| n.metadata.name.unwrap())
        .collect();
    assert_eq!(
        names,
        ["default", "kube-node-lease", "kube-public", "kube-system"]
    );
}

#[tokio::test]
async fn nodes_and_pods_basic_round_trip() {
    let s = ApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(s.client());
    let n = nodes
        .create(&PostParams::default(), &node("n1"))
        .await
        .unwrap();
    assert_eq!(n.status.unwrap().addresses.unwrap()[0].address, "127.0.0.1");
    let pods: Api<Pod> = Api::namespaced(s.client(), "default");
    let p = pods
        .create(&PostParams::default(), &pod("p", None))
        .await
        .unwrap();
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Pending"));
    let recs = s.requests();
    let writes: Vec<_> = recs.iter().filter(|r| r.is_write()).collect();
    assert_eq!(writes.len(), 2);
    assert_eq!(writes[1].resource, "pods");
    assert_eq!(writes[1].namespace.as_deref(), Some("default"));
    assert_eq!(writes[1].code, 201);
}

/// A raw request through a kube::Client's HTTPS stack, with kube's own retries of
/// 429/503/504 turned off so the first answer is seen: (status, headers, JSON body).
pub(crate) async fn raw(
    s: &ApiServer,
    method: &str,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> (u16, http::HeaderMap, serde_json::Value) {
    use http_body_util::BodyExt;
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(kube::client::Body::from(body))
        .unwrap();
    let mut cfg = s.config();
    cfg.default_retry = false;
    let client = kube::Client::try_from(cfg).unwrap();
    let resp = client.send(req).await.unwrap();
    let code = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (code, headers, v)
}

#[tokio::test]
async fn generate_name_appends_a_five_character_suffix() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let c: ConfigMap =
        serde_json::from_value(json!({"metadata": {"generateName": "web-"}})).unwrap();
    let a = api.create(&PostParams::default(), &c).await.unwrap();
    let b = api.create(&PostParams::default(), &c).await.unwrap();
    let (na, nb) = (a.metadata.name.unwrap(), b.metadata.name.unwrap());
    assert!(na.starts_with("web-") && na.len() == 9, "{na}");
    assert_ne!(na, nb);
}

#[tokio::test]
async fn invalid_objects_are_422_with_causes() {
    let s = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(s.client(), "default");
    let bad: Pod = serde_json::from_value(
        json!({"metadata": {"name": "Bad_Name"}, "spec": {"containers": [{"name": "c"}]}}),
    )
    .unwrap();
    let st = api_err(pods.create(&PostParams::default(), &bad).await.unwrap_err());
    assert_eq!((st.code, st.reason.as_str()), (422, "Invalid"));
    let details = st.details.unwrap();
    let fields: Vec<String> = details.causes.iter().map(|c| c.field.clone()).collect();
    assert_eq!(fields, ["metadata.name", "spec.containers[0].image"]);
    assert_eq!(details.causes[0].reason, "FieldValueInvalid");
    // No name and no generateName.
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let st = api_err(
        cms.create(&PostParams::default(), &ConfigMap::default())
            .await
            .unwrap_err(),
    );
    assert_eq!(st.code, 422);
    assert_eq!(
        st.details.unwrap().causes[0].message,
        "Required value: name or generateName is required"
    );
}

#[tokio::test]
async fn missing_objects_are_404_status_naming_the_resource() {
    let s = ApiServer::start().await.unwrap();
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(s.client(), "kube-node-lease");
    let st = api_err(leases.get("n1").await.unwrap_err());
    assert_eq!((st.code, st.reason.as_str()), (404, "NotFound"));
    assert_eq!(st.message, "leases.coordination.k8s.io \"n1\" not found");
    let d = st.details.unwrap();
    assert_eq!(
        (d.kind.as_str(), d.group.as_str(), d.name.as_str()),
        ("leases", "coordination.k8s.io", "n1")
    );
}

#[tokio::test]
async fn name_mismatch_with_the_url_is_a_bad_request() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let st = api_err(
        api.replace("a", &PostParams::default(), &cm("b"))
            .await
            .unwrap_err(),
    );
    assert_eq!(st.code, 400);
    assert_eq!(
        st.message,
        "the name of the object (b) does not match the name on the URL (a)"
    );
}

#[tokio::test]
async fn bad_input_gets_status_codes_not_panics() {
    let s = ApiServer::start().await.unwrap();
    let base = "/api/v1/namespaces/default/configmaps";
    let (code, _, body) = raw(&s, "POST", base, "application/json", b"{not json".to_vec()).await;
    assert_eq!(code, 400);
    assert_eq!(body["kind"], "Status");
    let (code, _, _) = raw(&s, "POST", base, "application/json", b"[1,2]".to_vec()).await;
    assert_eq!(code, 400);
    let (code, _, body) = raw(&s, "GET", "/api/v1/widgets", "", vec![]).await;
    assert_eq!((code, body["reason"].as_str()), (404, Some("NotFound")));
    let (code, _, _) = raw(&s, "GET", "/nonsense/path", "", vec![]).await;
    assert_eq!(code, 404);
    let (code, _, body) = raw(&s, "PUT", base, "application/json", b"{}".to_vec()).await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (405, Some("MethodNotAllowed"))
    );
    let huge = format!(
        "{{\"metadata\":{{\"name\":\"big\"}},\"data\":{{\"k\":\"{}\"}}}}",
        "x".repeat(4 * 1024 * 1024)
    );
    let (code, _, body) = raw(&s, "POST", base, "application/json", huge.into_bytes()).await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (413, Some("RequestEntityTooLarge"))
    );
    let (code, _, _) = raw(
        &s,
        "GET",
        "/api/v1/pods?labelSelector=a%20in%20b",
        "",
        vec![],
    )
    .await;
    assert_eq!(code, 400);
    // The server still answers after all that.
    let (code, _, _) = raw(&s, "GET", base, "", vec![]).await;
    assert_eq!(code, 200);
}

#[tokio::test]
async fn list_pages_with_limit_and_continue() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    for i in 0..7 {
        api.create(&PostParams::default(), &cm(&format!("c{i}")))
            .await
            .unwrap();
    }
    let mut names = Vec::new();
    let mut lp = ListParams::default().limit(3);
    let mut pages = 0;
    loop {
        let page = api.list(&lp).await.unwrap();
        pages += 1;
        names.extend(page.items.into_iter().map(|c| c.metadata.name.unwrap()));
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = ListParams::default().limit(3).continue_token(&c),
            _ => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(names, ["c0", "c1", "c2", "c3", "c4", "c5", "c6"]);
}

#[tokio::test]
async fn delete_collection_removes_the_selected_objects() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    for (name, app) in [("a", "web"), ("b", "web"), ("c", "db")] {
        let mut c = cm(name);
        c.metadata.labels = Some([("app".to_string(), app.to_string())].into());
        api.create(&PostParams::default(), &c).await.unwrap();
    }
    api.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("app=web"),
    )
    .await
    .unwrap();
    let left: Vec<String> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| c.metadata.name.unwrap())
        .collect();
    assert_eq!(left, ["c"]);
    let rec = s
        .requests()
        .into_iter()
        .find(|r| r.verb == "deletecollection")
        .unwrap();
    assert!(rec.is_write());
}

/// `staging/src/k8s.io/apiserver/pkg/registry/rest/update.go` (`BeforeUpdate`): uid,
/// creationTimestamp, generation and an existing deletionTimestamp are kept from the
/// stored object, silently.
#[tokio::test]
async fn update_keeps_system_metadata_silently() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let mut held = cm("a");
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    let created = api.create(&PostParams::default(), &held).await.unwrap();
    api.delete("a", &DeleteParams::default()).await.unwrap();
    let deleting = api.get("a").await.unwrap();
    let ts = deleting.metadata.deletion_timestamp.clone().unwrap();
    let mut body = serde_json::to_value(&deleting).unwrap();
    body["metadata"]["creationTimestamp"] = json!("2001-01-01T00:00:00Z");
    body["metadata"]["deletionTimestamp"] = json!("2002-02-02T00:00:00Z");
    body["metadata"]["generation"] = json!(42);
    body["metadata"]["uid"] = json!(null);
    body["data"] = json!({"k": "changed"});
    let got: ConfigMap = api
        .replace(
            "a",
            &PostParams::default(),
            &serde_json::from_value(body).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        got.metadata.creation_timestamp,
        created.metadata.creation_timestamp
    );
    assert_eq!(got.metadata.deletion_timestamp, Some(ts));
    assert_eq!(got.metadata.uid, created.metadata.uid);
    assert_eq!(got.metadata.generation, created.metadata.generation);
    assert_eq!(got.data.unwrap()["k"], "changed");
}

/// `staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/time.go`: any RFC 3339 value
/// parses (python clients send `+00:00`), and it comes back in UTC `Z` at second
/// precision; `micro_time.go` keeps microseconds. A value that is not a time is 400.
#[tokio::test]
async fn times_parse_as_rfc3339_and_come_back_normalized() {
    let s = ApiServer::start().await.unwrap();
    let body = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
        "status": {"conditions": [{"type": "Ready", "status": "True",
            "lastHeartbeatTime": "2024-05-01T12:00:00.123456+02:00",
            "lastTransitionTime": "2024-05-01T10:00:00+00:00"}]}});
    let (code, got) = json_req(&s, "POST", "/api/v1/nodes", body).await;
    assert_eq!(code, 201, "{got}");
    let c = &got["status"]["conditions"][0];
    assert_eq!(c["lastHeartbeatTime"], "2024-05-01T10:00:00Z");
    assert_eq!(c["lastTransitionTime"], "2024-05-01T10:00:00Z");
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "l"}, "spec": {"renewTime": "2024-05-01T12:00:00.5+02:00"}});
    let (code, got) = json_req(
        &s,
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases",
        lease,
    )
    .await;
    assert_eq!(code, 201, "{got}");
    assert_eq!(got["spec"]["renewTime"], "2024-05-01T10:00:00.500000Z");
    let bad = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "m"},
        "status": {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "yesterday"}]}});
    let (code, got) = json_req(&s, "POST", "/api/v1/nodes", bad).await;
    assert_eq!(code, 400, "{got}");
}
