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
