//! The scheduler stand-in and `pods/binding`: kube-scheduler's NodeUnschedulable,
//! NodeAffinity and TaintToleration filters (`pkg/scheduler/framework/plugins/*`) and
//! `BindingREST` (`pkg/registry/core/pod/storage/storage.go`).

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testkube::ApiServer;
use testkube::fixtures::{eventually, kubelet_node, kubelet_node_with};

use crate::conformance::pod;

async fn scheduling() -> ApiServer {
    ApiServer::builder().scheduler(true).start().await.unwrap()
}

async fn node_of(api: &Api<Pod>, name: &str) -> Option<String> {
    api.get(name)
        .await
        .ok()
        .and_then(|p| p.spec.and_then(|s| s.node_name))
}

fn scheduled_condition(p: &Pod) -> Option<(String, String, String)> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled")
        .map(|c| {
            (
                c.status.clone(),
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
}

#[tokio::test]
async fn scheduler_binds_a_pending_pod_to_a_ready_matching_tolerated_node() {
    let s = scheduling().await;
    let nodes: Api<Node> = Api::all(s.client());
    let pp = PostParams::default();
    // Not Ready, tainted, wrong label: only "good" fits.
    let mut not_ready = kubelet_node_with("a-not-ready", 1, &[("zone", "a")], &[]);
    not_ready
        .status
        .as_mut()
        .unwrap()
        .conditions
        .as_mut()
        .unwrap()[0]
        .status = "False".into();
    nodes.create(&pp, &not_ready).await.unwrap();
    nodes
        .create(
            &pp,
            &kubelet_node_with(
                "b-tainted",
                2,
                &[("zone", "a")],
                &[("dedicated", "x", "NoSchedule")],
            ),
        )
        .await
        .unwrap();
    nodes
        .create(
            &pp,
            &kubelet_node_with("c-other-zone", 3, &[("zone", "b")], &[]),
        )
        .await
        .unwrap();
    nodes
        .create(
            &pp,
            &kubelet_node_with(
                "good",
                4,
                &[("zone", "a")],
                &[("soft", "", "PreferNoSchedule")],
            ),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(s.client(), "default");
    let mut p = pod("web", None);
    p.spec.as_mut().unwrap().node_selector = Some([("zone".to_string(), "a".to_string())].into());
    pods.create(&pp, &p).await.unwrap();
    eventually("web is bound", || async {
        node_of(&pods, "web").await.is_some()
    })
    .await;
    let got = pods.get("web").await.unwrap();
    assert_eq!(
        got.spec.as_ref().unwrap().node_name.as_deref(),
        Some("good")
    );
    assert_eq!(scheduled_condition(&got).unwrap().0, "True");
    let binds: Vec<_> = s
        .requests()
        .into_iter()
        .filter(|r| r.subresource.as_deref() == Some("binding"))
        .collect();
    assert!(
        binds.is_empty(),
        "the stand-in binds inside the double, not over HTTP"
    );

    // A toleration opens the tainted node; required affinity closes the others.
    let mut t: Pod = serde_json::from_value(json!({"metadata": {"name": "tol"}, "spec": {
        "containers": [{"name": "c", "image": "busybox:1.36"}],
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "x", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b-tainted"]}]}]}}}}}))
    .unwrap();
    pods.create(&pp, &t).await.unwrap();
    eventually("tol is bound", || async {
        node_of(&pods, "tol").await.is_some()
    })
    .await;
    assert_eq!(node_of(&pods, "tol").await.as_deref(), Some("b-tainted"));
    t.metadata.name = Some("tol-exec".into());
    t.spec.as_mut().unwrap().tolerations = None;
    pods.create(&pp, &t).await.unwrap();
    eventually("tol-exec is marked unschedulable", || async {
        pods.get("tol-exec")
            .await
            .ok()
            .and_then(|p| scheduled_condition(&p))
            .is_some_and(|c| c.1 == "Unschedulable")
    })
    .await;
}

#[tokio::test]
async fn scheduler_marks_an_unfit_pod_unschedulable_and_binds_it_once_a_node_fits() {
    let s = scheduling().await;
    let nodes: Api<Node> = Api::all(s.client());
    let pods: Api<Pod> = Api::namespaced(s.client(), "default");
    let pp = PostParams::default();
    nodes
        .create(
            &pp,
            &kubelet_node_with(
                "t",
                1,
                &[],
                &[("node-role.kubernetes.io/control-plane", "", "NoSchedule")],
            ),
        )
        .await
        .unwrap();
    pods.create(&pp, &pod("p", None)).await.unwrap();
    eventually("p is marked unschedulable", || async {
        pods.get("p")
            .await
            .ok()
            .and_then(|p| scheduled_condition(&p))
            .is_some_and(|c| c.0 == "False" && c.1 == "Unschedulable")
    })
    .await;
    let (_, _, msg) = scheduled_condition(&pods.get("p").await.unwrap()).unwrap();
    assert!(
        msg.starts_with("0/1 nodes are available: 1 node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }"),
        "{msg}"
    );
    // Steady state: the condition is written once, not on every pass.
    let rv = s.resource_version();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        s.resource_version(),
        rv,
        "an unchanged verdict rewrites nothing"
    );
    nodes.create(&pp, &kubelet_node("w", 2)).await.unwrap();
    eventually("p is bound to w", || async {
        node_of(&pods, "p").await.as_deref() == Some("w")
    })
    .await;
}

#[tokio::test]
async fn scheduler_leaves_gated_pods_and_other_schedulers_alone() {
    let s = scheduling().await;
    let nodes: Api<Node> = Api::all(s.client());
    let pods: Api<Pod> = Api::namespaced(s.client(), "default");
    let pp = PostParams::default();
    nodes.create(&pp, &kubelet_node("w", 1)).await.unwrap();
    let gated: Pod = serde_json::from_value(json!({"metadata": {"name": "gated"}, "spec": {
        "containers": [{"name": "c", "image": "busybox:1.36"}],
        "schedulingGates": [{"name": "example.com/wait"}]}}))
    .unwrap();
    pods.create(&pp, &gated).await.unwrap();
    let mut other = pod("other", None);
    other.spec.as_mut().unwrap().scheduler_name = Some("my-scheduler".into());
    pods.create(&pp, &other).await.unwrap();
    pods.create(&pp, &pod("plain", None)).await.unwrap();
    eventually("plain is bound", || async {
        node_of(&pods, "plain").await.is_some()
    })
    .await;
    assert_eq!(node_of(&pods, "gated").await, None);
    assert_eq!(node_of(&pods, "other").await, None);
    // Removing the gate lets the scheduler bind it.
    pods.patch(
        "gated",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"schedulingGates": null}})),
    )
    .await
    .unwrap();
    eventually("gated is bound after its gate goes", || async {
        node_of(&pods, "gated").await.as_deref() == Some("w")
    })
    .await;
}

async fn post_binding(s: &ApiServer, pod: &str, body: Value) -> (u16, Value) {
    let req = http::Request::post(format!("/api/v1/namespaces/default/pods/{pod}/binding"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).unwrap())
        .unwrap();
    match s.client().request_text(req).await {
        Ok(text) => (201, serde_json::from_str(&text).unwrap()),
        Err(kube::Error::Api(st)) => (st.code, json!({"message": st.message, "reason": st.reason})),
        Err(e) => panic!("binding {pod}: {e}"),
    }
}

#[tokio::test]
async fn pods_binding_subresource_binds_once_and_refuses_rebinding() {
    // The scheduler is off by default: a client (a test's own scheduler) binds.
    let s = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(s.client(), "default");
    pods.create(&PostParams::default(), &pod("p", None))
        .await
        .unwrap();
    let (code, body) = post_binding(
        &s,
        "p",
        json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p",
            "annotations": {"example.com/by": "test"}}, "target": {"kind": "Node", "name": "n1"}}),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["status"], "Success");
    let got = pods.get("p").await.unwrap();
    assert_eq!(got.spec.as_ref().unwrap().node_name.as_deref(), Some("n1"));
    assert_eq!(
        got.metadata.annotations.as_ref().unwrap()["example.com/by"],
        "test"
    );
    assert_eq!(scheduled_condition(&got).unwrap().0, "True");
    let (code, body) = post_binding(
        &s,
        "p",
        json!({"metadata": {"name": "p"}, "target": {"name": "n2"}}),
    )
    .await;
    assert_eq!(code, 409, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("is already assigned to node \"n1\""),
        "{body}"
    );
    let (code, _) = post_binding(&s, "missing", json!({"target": {"name": "n1"}})).await;
    assert_eq!(code, 404);
    pods.create(&PostParams::default(), &pod("q", None))
        .await
        .unwrap();
    let (code, body) =
        post_binding(&s, "q", json!({"target": {"kind": "Pod", "name": "n1"}})).await;
    assert_eq!(code, 422, "{body}");
    let rec = s
        .requests()
        .into_iter()
        .find(|r| r.subresource.as_deref() == Some("binding"))
        .unwrap();
    assert_eq!(rec.verb, "create");
}
