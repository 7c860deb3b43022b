//! Deletion: graceful pods, preconditions, finalizers, garbage collection, token cleaner.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::json;
use testkube::ApiServer;

use crate::conformance::{cm, pod};

async fn wait_gone<K>(api: &Api<K>, name: &str) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    for _ in 0..200 {
        if api.get_opt(name).await.unwrap().is_none() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}

fn owned_cm(name: &str, owners: &[&ConfigMap]) -> ConfigMap {
    let refs: Vec<_> = owners
        .iter()
        .map(|o| {
            json!({"apiVersion": "v1", "kind": "ConfigMap",
            "name": o.metadata.name, "uid": o.metadata.uid})
        })
        .collect();
    serde_json::from_value(json!({"metadata": {"name": name, "ownerReferences": refs}})).unwrap()
}

#[tokio::test]
async fn scheduled_pods_are_deleted_gracefully_until_the_kubelets_final_delete() {
    let s = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(s.client(), "default");
    let p = pods
        .create(&PostParams::default(), &pod("p", Some("n1")))
        .await
        .unwrap();
    let uid = p.metadata.uid.clone().unwrap();
    let first = pods.delete("p", &DeleteParams::default()).await.unwrap();
    let pending = first.left().expect("a graceful delete returns the pod");
    assert_eq!(pending.metadata.deletion_grace_period_seconds, Some(30));
    let ts = pending.metadata.deletion_timestamp.clone().unwrap().0;
    let until = ts.as_second() - jiff::Timestamp::now().as_second();
    assert!(
        (25..=31).contains(&until),
        "deletionTimestamp is now + 30s, got {until}s"
    );
    assert!(
        pods.get_opt("p").await.unwrap().is_some(),
        "the pod waits for its kubelet"
    );
    // The kubelet's final delete: grace 0 with a uid precondition. A wrong uid conflicts,
    // in the words of `staging/src/k8s.io/apiserver/pkg/registry/rest/delete.go`
    // (`BeforeDelete`), which names the Kind.
    let wrong = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some("other".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match pods.delete("p", &wrong).await {
        Err(kube::Error::Api(st)) => {
            assert_eq!(st.code, 409);
            assert!(
                st.message.starts_with(
                    "Operation cannot be fulfilled on Pod \"p\": the UID in the precondition (other) does not match the UID in record ("
                ) && st.message.ends_with(
                    "). The object might have been deleted and then recreated"
                ),
                "{}",
                st.message
            );
        }
        other => panic!("expected a precondition conflict, got {other:?}"),
    }
    let kubelet = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    };
    pods.delete("p", &kubelet).await.unwrap();
    assert!(pods.get_opt("p").await.unwrap().is_none());
}

/// `staging/src/k8s.io/apiserver/pkg/endpoints/handlers/delete.go`: a DELETE that does
/// not remove the object answers 200 with it (202 only for `orphanDependents: false`),
/// and `rest.BeforeDelete` bumps a tracked generation when it sets the deletion.
#[tokio::test]
async fn delete_that_keeps_the_object_answers_200_and_bumps_generation() {
    let s = ApiServer::start().await.unwrap();
    let created = crate::conformance::json_req(
        &s,
        "POST",
        "/api/v1/namespaces/default/pods",
        serde_json::to_value(pod("p", Some("n1"))).unwrap(),
    )
    .await
    .1;
    assert_eq!(created["metadata"]["generation"], 1);
    let (code, got) = crate::conformance::json_req(
        &s,
        "DELETE",
        "/api/v1/namespaces/default/pods/p",
        json!(null),
    )
    .await;
    assert_eq!(code, 200, "{got}");
    assert_eq!(got["kind"], "Pod");
    assert_eq!(got["metadata"]["generation"], 2);
    assert!(got["metadata"]["deletionTimestamp"].is_string());
    // A finalizer-held ConfigMap: 200 with the object.
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let mut held = crate::conformance::cm("held");
    held.metadata.finalizers = Some(vec!["example.com/x".into()]);
    cms.create(&PostParams::default(), &held).await.unwrap();
    let (code, got) = crate::conformance::json_req(
        &s,
        "DELETE",
        "/api/v1/namespaces/default/configmaps/held",
        json!({"orphanDependents": false}),
    )
    .await;
    assert_eq!(code, 202, "orphanDependents=false is the one 202: {got}");
    let (code, got) = crate::conformance::json_req(
        &s,
        "DELETE",
        "/api/v1/namespaces/default/configmaps/held",
        json!(null),
    )
    .await;
    assert_eq!(code, 200, "{got}");
    assert_eq!(got["kind"], "ConfigMap");
}

#[tokio::test]
async fn a_later_delete_can_only_shorten_the_grace_period() {
    let s = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(s.client(), "default");
    pods.create(&PostParams::default(), &pod("p", Some("n1")))
        .await
        .unwrap();
    let dp = |g: u32| DeleteParams {
        grace_period_seconds: Some(g),
        ..Default::default()
    };
    pods.delete("p", &dp(60)).await.unwrap();
    let longer = pods.delete("p", &dp(120)).await.unwrap().left().unwrap();
    assert_eq!(longer.metadata.deletion_grace_period_seconds, Some(60));
    let shorter = pods.delete("p", &dp(5)).await.unwrap().left().unwrap();
    assert_eq!(shorter.metadata.deletion_grace_period_seconds, Some(5));
}

#[tokio::test]
async fn unscheduled_and_finished_pods_go_at_once() {
    let s = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(s.client(), "default");
    pods.create(&PostParams::default(), &pod("free", None))
        .await
        .unwrap();
    let out = pods.delete("free", &DeleteParams::default()).await.unwrap();
    assert!(out.is_left(), "pods come back as the deleted object");
    assert!(pods.get_opt("free").await.unwrap().is_none());
    pods.create(&PostParams::default(), &pod("done", Some("n1")))
        .await
        .unwrap();
    pods.patch_status(
        "done",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
    )
    .await
    .unwrap();
    pods.delete("done", &DeleteParams::default()).await.unwrap();
    assert!(pods.get_opt("done").await.unwrap().is_none());
}

#[tokio::test]
async fn finalizers_keep_an_object_until_removed() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let mut c = cm("held");
    c.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    api.create(&PostParams::default(), &c).await.unwrap();
    let out = api.delete("held", &DeleteParams::default()).await.unwrap();
    let held = out.left().expect("a held object comes back, not a Status");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert!(api.get_opt("held").await.unwrap().is_some());
    // No new finalizers once deletion started.
    let add = api
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold", "x/y"]}})),
        )
        .await;
    assert!(
        matches!(add, Err(kube::Error::Api(ref st)) if st.code == 422),
        "{add:?}"
    );
    api.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(api.get_opt("held").await.unwrap().is_none());
    // Without finalizers a config map's delete answers a Success Status.
    api.create(&PostParams::default(), &cm("plain"))
        .await
        .unwrap();
    let st = api
        .delete("plain", &DeleteParams::default())
        .await
        .unwrap()
        .right()
        .unwrap();
    assert_eq!(
        st.status,
        Some(kube::core::response::StatusSummary::Success)
    );
}

#[tokio::test]
async fn garbage_collection_deletes_dependents_whose_owners_are_all_gone() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let o1 = api
        .create(&PostParams::default(), &cm("owner1"))
        .await
        .unwrap();
    let o2 = api
        .create(&PostParams::default(), &cm("owner2"))
        .await
        .unwrap();
    api.create(&PostParams::default(), &owned_cm("single", &[&o1]))
        .await
        .unwrap();
    api.create(&PostParams::default(), &owned_cm("shared", &[&o1, &o2]))
        .await
        .unwrap();
    api.delete("owner1", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        wait_gone(&api, "single").await,
        "a dependent of a deleted owner goes"
    );
    let shared = api.get("shared").await.unwrap();
    let refs = shared.metadata.owner_references.unwrap();
    assert_eq!(
        refs.len(),
        1,
        "the reference to the deleted owner is dropped"
    );
    assert_eq!(refs[0].uid, o2.metadata.uid.clone().unwrap());
    api.delete("owner2", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        wait_gone(&api, "shared").await,
        "with no owner left the dependent goes"
    );
}

#[tokio::test]
async fn garbage_collection_compares_owner_uids_not_names() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let old = api
        .create(&PostParams::default(), &cm("owner"))
        .await
        .unwrap();
    api.delete("owner", &DeleteParams::default()).await.unwrap();
    // Recreated under the same name: a different owner.
    api.create(&PostParams::default(), &cm("owner"))
        .await
        .unwrap();
    api.create(&PostParams::default(), &owned_cm("dep", &[&old]))
        .await
        .unwrap();
    // The dependent's owner (old uid) does not exist: it is collected on its own, without
    // waiting for an unrelated delete (`pkg/controller/garbagecollector/garbagecollector.go`,
    // `attemptToDeleteItem` finds the reference dangling).
    assert!(wait_gone(&api, "dep").await);
    // Orphan propagation keeps dependents and drops the reference.
    let o = api
        .create(&PostParams::default(), &cm("parent"))
        .await
        .unwrap();
    api.create(&PostParams::default(), &owned_cm("child", &[&o]))
        .await
        .unwrap();
    api.delete("parent", &DeleteParams::orphan()).await.unwrap();
    assert!(wait_gone(&api, "parent").await);
    let child = api.get("child").await.unwrap();
    assert!(
        child
            .metadata
            .owner_references
            .unwrap_or_default()
            .is_empty()
    );
}

/// `pkg/controller/garbagecollector/garbagecollector.go` (`processDeletingDependentsItem`):
/// a foreground deletion waits only for dependents whose reference sets
/// `blockOwnerDeletion`; every dependent is still deleted.
#[tokio::test]
async fn foreground_deletion_waits_only_for_block_owner_deletion_dependents() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let owner = api
        .create(&PostParams::default(), &cm("owner"))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(s.client(), "default");
    let dep = |name: &str, block: bool| -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name, "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
            "uid": owner.metadata.uid, "blockOwnerDeletion": block}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox:1.36"}]}}))
        .unwrap()
    };
    // Scheduled pods terminate gracefully: they stay until their kubelet deletes them.
    pods.create(&PostParams::default(), &dep("loose", false))
        .await
        .unwrap();
    api.delete("owner", &DeleteParams::foreground())
        .await
        .unwrap();
    assert!(
        wait_gone(&api, "owner").await,
        "a non-blocking dependent does not hold the owner"
    );
    let loose = pods.get("loose").await.unwrap();
    assert!(
        loose.metadata.deletion_timestamp.is_some(),
        "it is still deleted"
    );

    let owner = api
        .create(&PostParams::default(), &cm("owner2"))
        .await
        .unwrap();
    let mut blocking = dep("blocking", true);
    blocking.metadata.owner_references.as_mut().unwrap()[0].name = "owner2".into();
    blocking.metadata.owner_references.as_mut().unwrap()[0].uid =
        owner.metadata.uid.clone().unwrap();
    pods.create(&PostParams::default(), &blocking)
        .await
        .unwrap();
    api.delete("owner2", &DeleteParams::foreground())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        api.get("owner2")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some(),
        "a blocking dependent holds the owner"
    );
    pods.delete(
        "blocking",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(wait_gone(&api, "owner2").await);
}

/// `pkg/controller/namespace/deletion/namespaced_resources_deleter.go`: contents are
/// deleted with default options, so scheduled pods terminate gracefully and the
/// namespace stays Terminating until their kubelet removes them.
#[tokio::test]
async fn namespace_deletion_terminates_scheduled_pods_gracefully() {
    use k8s_openapi::api::core::v1::Namespace;
    let s = ApiServer::start().await.unwrap();
    let nss: Api<Namespace> = Api::all(s.client());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "work"}})).unwrap();
    nss.create(&PostParams::default(), &ns).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(s.client(), "work");
    pods.create(&PostParams::default(), &pod("running", Some("n1")))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("pending", None))
        .await
        .unwrap();
    nss.delete("work", &DeleteParams::default()).await.unwrap();
    let mut terminating = false;
    for _ in 0..400 {
        let gone = pods.get_opt("pending").await.unwrap().is_none();
        let running = pods.get_opt("running").await.unwrap();
        if gone
            && running
                .as_ref()
                .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
        {
            terminating = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        terminating,
        "the unscheduled pod goes, the scheduled one terminates gracefully"
    );
    let running = pods.get("running").await.unwrap();
    assert_eq!(running.metadata.deletion_grace_period_seconds, Some(30));
    let n = nss.get("work").await.unwrap();
    assert_eq!(n.status.unwrap().phase.as_deref(), Some("Terminating"));
    // The kubelet's final delete empties it; then the namespace goes.
    pods.delete(
        "running",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let mut gone = false;
    for _ in 0..400 {
        if nss.get_opt("work").await.unwrap().is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(gone, "the namespace goes once empty");
}

#[tokio::test]
async fn expired_bootstrap_tokens_are_removed_by_the_token_cleaner() {
    use base64::Engine;
    let s = ApiServer::builder()
        .token_cleaner_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(s.client(), "kube-system");
    let b64 = |v: &str| base64::engine::general_purpose::STANDARD.encode(v);
    let token = |id: &str, exp: &str| -> Secret {
        serde_json::from_value(
            json!({"metadata": {"name": format!("bootstrap-token-{id}")},
            "type": "bootstrap.kubernetes.io/token",
            "data": {"token-id": b64(id), "token-secret": b64("0123456789abcdef"),
                     "expiration": b64(exp), "usage-bootstrap-authentication": b64("true")}}),
        )
        .unwrap()
    };
    secrets
        .create(
            &PostParams::default(),
            &token("aaaaaa", "2000-01-01T00:00:00Z"),
        )
        .await
        .unwrap();
    secrets
        .create(
            &PostParams::default(),
            &token("bbbbbb", "2099-01-01T00:00:00Z"),
        )
        .await
        .unwrap();
    assert!(wait_gone(&secrets, "bootstrap-token-aaaaaa").await);
    assert!(
        secrets
            .get_opt("bootstrap-token-bbbbbb")
            .await
            .unwrap()
            .is_some()
    );
    // The live token authenticates through TokenReview.
    let reviews: Api<k8s_openapi::api::authentication::v1::TokenReview> = Api::all(s.client());
    let tr: k8s_openapi::api::authentication::v1::TokenReview =
        serde_json::from_value(json!({"spec": {"token": "bbbbbb.0123456789abcdef"}})).unwrap();
    let got = reviews.create(&PostParams::default(), &tr).await.unwrap();
    let st = got.status.unwrap();
    assert_eq!(st.authenticated, Some(true));
    assert_eq!(
        st.user.unwrap().username.as_deref(),
        Some("system:bootstrap:bbbbbb")
    );
}

#[tokio::test]
async fn namespace_deletion_removes_its_contents() {
    let s = ApiServer::start().await.unwrap();
    let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(s.client());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "team"}})).unwrap(),
    )
    .await
    .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "team");
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    nss.delete("team", &DeleteParams::default()).await.unwrap();
    assert!(wait_gone(&nss, "team").await);
    assert!(api.get_opt("a").await.unwrap().is_none());
}

/// `pkg/registry/core/pod/storage/eviction.go` without PodDisruptionBudgets: an
/// eviction is the delete its `deleteOptions` describe, 201 Success; a terminating pod is
/// a success; a missing pod 404; a body naming another pod 400.
#[tokio::test]
async fn pod_eviction_deletes_through_its_delete_options() {
    use crate::conformance::json_req;
    let s = ApiServer::start().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(s.client(), "default");
    pods.create(&PostParams::default(), &pod("p", Some("n1")))
        .await
        .unwrap();
    let eviction = |name: &str, grace: Option<i64>| {
        let mut e = json!({"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": "default"}});
        if let Some(g) = grace {
            e["deleteOptions"] = json!({"gracePeriodSeconds": g});
        }
        e
    };
    let path = "/api/v1/namespaces/default/pods/p/eviction";
    let (code, got) = json_req(&s, "POST", path, eviction("p", Some(5))).await;
    assert_eq!(
        (code, got["status"].as_str()),
        (201, Some("Success")),
        "{got}"
    );
    let p = pods.get("p").await.unwrap();
    assert_eq!(
        p.metadata.deletion_grace_period_seconds,
        Some(5),
        "graceful: scheduled pod"
    );
    let (code, _) = json_req(&s, "POST", path, eviction("p", None)).await;
    assert_eq!(code, 201, "evicting a terminating pod succeeds");
    let (code, got) = json_req(&s, "POST", path, eviction("other", None)).await;
    assert_eq!(code, 400, "{got}");
    let (code, _) = json_req(
        &s,
        "POST",
        "/api/v1/namespaces/default/pods/missing/eviction",
        eviction("missing", None),
    )
    .await;
    assert_eq!(code, 404);
    pods.create(&PostParams::default(), &pod("q", None))
        .await
        .unwrap();
    let (code, _) = json_req(
        &s,
        "POST",
        "/api/v1/namespaces/default/pods/q/eviction",
        eviction("q", None),
    )
    .await;
    assert_eq!(code, 201);
    assert!(
        pods.get_opt("q").await.unwrap().is_none(),
        "an unscheduled pod goes at once"
    );
}
