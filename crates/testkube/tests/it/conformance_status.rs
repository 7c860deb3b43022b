//! The status subresource strategies (`pkg/registry/core/{node,pod}/strategy.go`).

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use testkube::ApiServer;

use crate::conformance::{node, pod};

#[tokio::test]
async fn node_create_keeps_the_status_it_is_given() {
    let s = ApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(s.client());
    let n: Node = serde_json::from_value(json!({"metadata": {"name": "n1"},
        "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.9"}],
                   "config": {"active": {}}, "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}}}))
    .unwrap();
    let got = nodes.create(&PostParams::default(), &n).await.unwrap();
    let st = got.status.unwrap();
    assert_eq!(st.addresses.unwrap()[0].address, "127.0.0.9");
    assert_eq!(
        st.daemon_endpoints.unwrap().kubelet_endpoint.unwrap().port,
        10250
    );
    assert!(st.config.is_none(), "status.config is dropped on create");
}

#[tokio::test]
async fn main_update_keeps_the_stored_status() {
    let s = ApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(s.client());
    let mut n = nodes
        .create(&PostParams::default(), &node("n1"))
        .await
        .unwrap();
    n.status.as_mut().unwrap().addresses.as_mut().unwrap()[0].address = "10.9.9.9".into();
    n.metadata.labels = Some([("role".to_string(), "edge".to_string())].into());
    let got = nodes
        .replace("n1", &PostParams::default(), &n)
        .await
        .unwrap();
    assert_eq!(
        got.status.unwrap().addresses.unwrap()[0].address,
        "127.0.0.1"
    );
    assert_eq!(got.metadata.labels.unwrap()["role"], "edge");
    // A merge patch on the main resource cannot change the status either.
    let got = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"addresses": []}})),
        )
        .await
        .unwrap();
    assert_eq!(got.status.unwrap().addresses.unwrap().len(), 1);
}

#[tokio::test]
async fn status_update_keeps_the_spec_but_persists_labels() {
    let s = ApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(s.client());
    let mut n = nodes
        .create(&PostParams::default(), &node("n1"))
        .await
        .unwrap();
    n.spec.as_mut().unwrap().unschedulable = Some(true);
    n.metadata.labels = Some([("seen".to_string(), "yes".to_string())].into());
    n.metadata.annotations = Some([("a".to_string(), "b".to_string())].into());
    n.status.as_mut().unwrap().addresses.as_mut().unwrap()[0].address = "127.0.0.2".into();
    let got = nodes
        .replace_status("n1", &PostParams::default(), &n)
        .await
        .unwrap();
    assert_eq!(got.spec.unwrap().unschedulable, None);
    assert_eq!(got.metadata.labels.unwrap()["seen"], "yes");
    assert_eq!(got.metadata.annotations.unwrap()["a"], "b");
    assert_eq!(
        got.status.unwrap().addresses.unwrap()[0].address,
        "127.0.0.2"
    );
}

#[tokio::test]
async fn pod_create_resets_status_and_marks_gated_pods() {
    let s = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(s.client(), "default");
    let mut p = serde_json::to_value(pod("p", None)).unwrap();
    p["status"] = json!({"phase": "Running", "podIP": "1.2.3.4"});
    p["spec"]["schedulingGates"] = json!([{"name": "example.com/wait"}]);
    p["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "100m"}});
    let got = pods
        .create(&PostParams::default(), &serde_json::from_value(p).unwrap())
        .await
        .unwrap();
    assert_eq!(got.metadata.generation, Some(1));
    let st = got.status.unwrap();
    assert_eq!(st.phase.as_deref(), Some("Pending"));
    assert_eq!(st.qos_class.as_deref(), Some("Burstable"));
    assert!(st.pod_ip.is_none());
    let c = &st.conditions.unwrap()[0];
    assert_eq!(
        (c.type_.as_str(), c.status.as_str(), c.reason.as_deref()),
        ("PodScheduled", "False", Some("SchedulingGated"))
    );
    // An ungated pod has no condition.
    let plain = pods
        .create(&PostParams::default(), &pod("q", None))
        .await
        .unwrap();
    assert!(plain.status.unwrap().conditions.is_none());
}

#[tokio::test]
async fn pods_status_drops_a_new_deletion_timestamp_and_keeps_owner_references() {
    let s = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(s.client(), "default");
    // A real owner: the collector deletes dependents of owners that do not exist.
    let owner = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(s.client(), "default")
        .create(&PostParams::default(), &crate::conformance::cm("owner"))
        .await
        .unwrap();
    let owner_uid = owner.metadata.uid.unwrap();
    let mut p = serde_json::to_value(pod("p", Some("n1"))).unwrap();
    p["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner_uid}]);
    pods.create(&PostParams::default(), &serde_json::from_value(p).unwrap())
        .await
        .unwrap();
    let got = pods
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"deletionTimestamp": "2030-01-01T00:00:00Z",
                "ownerReferences": null, "labels": {"l": "v"}},
                "spec": {"nodeName": "elsewhere"}, "status": {"phase": "Running"}}),
            ),
        )
        .await
        .unwrap();
    assert!(got.metadata.deletion_timestamp.is_none());
    assert_eq!(got.metadata.owner_references.unwrap()[0].uid, owner_uid);
    assert_eq!(got.metadata.labels.unwrap()["l"], "v");
    assert_eq!(got.spec.unwrap().node_name.as_deref(), Some("n1"));
    assert_eq!(got.status.unwrap().phase.as_deref(), Some("Running"));
}

#[tokio::test]
async fn scheduling_gates_can_only_be_removed() {
    let s = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(s.client(), "default");
    let mut p = serde_json::to_value(pod("p", None)).unwrap();
    p["spec"]["schedulingGates"] = json!([{"name": "a"}]);
    pods.create(&PostParams::default(), &serde_json::from_value(p).unwrap())
        .await
        .unwrap();
    let add = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"schedulingGates": [{"name": "a"}, {"name": "b"}]}})),
        )
        .await;
    match add {
        Err(kube::Error::Api(st)) => assert_eq!(st.code, 422),
        other => panic!("adding a gate must be refused, got {other:?}"),
    }
    let removed = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"schedulingGates": null}})),
        )
        .await
        .unwrap();
    assert!(removed.spec.unwrap().scheduling_gates.is_none());
    assert_eq!(removed.metadata.generation, Some(2));
}

#[tokio::test]
async fn pod_spec_is_immutable_except_images_tolerations_and_gates() {
    let s = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(s.client(), "default");
    pods.create(&PostParams::default(), &pod("p", Some("n1")))
        .await
        .unwrap();
    let image = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"spec": {"containers": [{"name": "c", "image": "busybox:2"}]}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        image.spec.unwrap().containers[0].image.as_deref(),
        Some("busybox:2")
    );
    let moved = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nodeName": "n2"}})),
        )
        .await;
    assert!(
        matches!(moved, Err(kube::Error::Api(ref st)) if st.code == 422),
        "{moved:?}"
    );
    // A PUT of a freshly built spec (no defaulted fields) is not a change.
    let mut fresh = pod("p", Some("n1"));
    fresh.spec.as_mut().unwrap().containers[0].image = Some("busybox:2".into());
    pods.replace("p", &PostParams::default(), &fresh)
        .await
        .unwrap();
}
