//! Changes of a pod's mutable fields reach its instance through `Provider::update`: once
//! per change, never for an unchanged pod, and a provider that cannot apply one gets a
//! condition and an Event on the pod instead of a retry loop.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;
use vnode::pods::{PodControllerConfig, SPEC_APPLIED_CONDITION};
use vnode::providers::memory::MemoryProvider;
use vnode::providers::process::ProcessProvider;

use crate::common::*;

async fn patch(pods: &Api<Pod>, name: &str, body: serde_json::Value) -> anyhow::Result<()> {
    pods.patch(name, &PatchParams::default(), &Patch::Strategic(&body))
        .await?;
    Ok(())
}

/// Pod writes (pods and pods/status) the double recorded.
fn pod_writes(server: &testkube::ApiServer) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.is_write() && r.resource == "pods")
        .count()
}

fn restart_count(p: &Pod) -> Option<i32> {
    Some(
        p.status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .first()?
            .restart_count,
    )
}

fn applied(p: &Pod) -> Option<String> {
    annotation(p, ::common::keys::APPLIED_SPEC_ANNOTATION).map(str::to_string)
}

/// A metadata write that fails right after provisioning (a conflict here, as the API
/// server answers when the pod changed meanwhile) leaves the pod without its applied-spec
/// annotation; the retry must record what was provisioned, not push that same spec to
/// the provider again as an update.
#[tokio::test]
async fn a_failed_first_metadata_write_does_not_turn_into_an_update() -> anyhow::Result<()> {
    let MemoryRig {
        server,
        provider,
        running: _running,
        pods,
        ..
    } = memory_rig().await?;
    server.inject(
        testkube::Fault::new(testkube::FaultKind::Status(409))
            .verb("patch")
            .resource("pods")
            .times(1),
    );
    create(&pods, &pod("web", "nebula-mem", &["serve"])).await?;
    let p = wait_for("the applied-spec annotation after the retry", || async {
        let p = pods.get("web").await?;
        Ok((applied(&p).is_some()).then_some(p))
    })
    .await?;
    assert_eq!(applied(&p), vnode::pod_spec_fingerprint(&p));
    wait_running(&pods, "web").await?;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(provider.calls.created.load(Ordering::Relaxed), 1);
    assert_eq!(
        provider.calls.updates.load(Ordering::Relaxed),
        0,
        "the provisioned spec was pushed again as an update"
    );
    Ok(())
}

#[tokio::test]
async fn a_label_and_an_image_change_reach_the_provider_once_each() -> anyhow::Result<()> {
    let MemoryRig {
        server,
        client,
        provider,
        running: _running,
        pods,
    } = memory_rig().await?;
    let mut p = pod("web", "nebula-mem", &["serve"]);
    p.metadata.labels = Some([("tier".to_string(), "a".to_string())].into());
    create(&pods, &p).await?;
    let p = wait_running(&pods, "web").await?;
    // What was provisioned is recorded with the instance id: no update for it.
    assert_eq!(applied(&p), vnode::pod_spec_fingerprint(&p));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(provider.calls.updates.load(Ordering::Relaxed), 0);

    patch(&pods, "web", json!({"metadata": {"labels": {"tier": "b"}}})).await?;
    let updates = wait_for("the label change at the provider", || async {
        let u = provider.updates();
        Ok((!u.is_empty()).then_some(u))
    })
    .await?;
    assert_eq!(updates.len(), 1);
    assert_eq!(
        updates[0].1.labels.get("tier").map(String::as_str),
        Some("b")
    );
    assert_eq!(updates[0].1.image, "busybox");
    let p = wait_for("the applied-spec annotation", || async {
        let p = pods.get("web").await?;
        Ok((applied(&p) == vnode::pod_spec_fingerprint(&p)).then_some(p))
    })
    .await?;
    assert!(applied(&p).is_some());

    // Steady state after the change: several notify rounds, no provider update, no write.
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.clear_requests();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(pod_writes(&server), 0, "{:?}", server.requests());
    assert_eq!(provider.calls.updates.load(Ordering::Relaxed), 1);

    // The image may change on a running pod (kube-apiserver allows it): pushed too.
    patch(
        &pods,
        "web",
        json!({"spec": {"containers": [{"name": "main", "image": "busybox:2"}]}}),
    )
    .await?;
    wait_for("the image change at the provider", || async {
        let u = provider.updates();
        Ok((u.len() == 2 && u[1].1.image == "busybox:2").then_some(()))
    })
    .await?;
    // The annotation records it, and the Event says it was applied.
    wait_for("the second applied-spec annotation", || async {
        let p = pods.get("web").await?;
        Ok((applied(&p) == vnode::pod_spec_fingerprint(&p)).then_some(()))
    })
    .await?;
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let updated = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Updated"))
        .count();
    assert_eq!(updated, 2);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(provider.calls.updates.load(Ordering::Relaxed), 2);
    Ok(())
}

#[tokio::test]
async fn a_change_the_provider_cannot_apply_gets_a_condition_and_an_event_once()
-> anyhow::Result<()> {
    init_logs();
    let server = testkube::ApiServer::start().await?;
    let client = server.client();
    let provider = MemoryProvider::new("mem", Duration::from_millis(200));
    provider.faults().update_unsupported = true;
    let _running = start_runner(
        client.clone(),
        Arc::new(provider.clone()),
        None,
        PodControllerConfig::default(),
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    create(&pods, &pod("web", "nebula-mem", &["serve"])).await?;
    wait_running(&pods, "web").await?;
    patch(&pods, "web", json!({"metadata": {"labels": {"tier": "b"}}})).await?;
    let cond = wait_for("the SpecApplied condition", || async {
        let p = pods.get("web").await?;
        Ok(p.status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == SPEC_APPLIED_CONDITION))
    })
    .await?;
    assert_eq!(cond.status, "False");
    assert_eq!(cond.reason.as_deref(), Some("UpdateUnsupported"));
    assert!(
        cond.message
            .as_deref()
            .unwrap_or_default()
            .contains("delete and re-create the pod"),
        "{cond:?}"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let warned = wait_for("the UpdateUnsupported Event", || async {
        let list = events.list(&ListParams::default()).await?.items;
        let w: Vec<Event> = list
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("UpdateUnsupported"))
            .collect();
        Ok((!w.is_empty()).then_some(w))
    })
    .await?;
    assert_eq!(warned[0].type_.as_deref(), Some("Warning"));
    // No retry loop: one attempt, and nothing written while the pod stays as it is. The
    // pod keeps running, and the condition survives the notify loop's comparisons.
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.clear_requests();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(provider.calls.updates.load(Ordering::Relaxed), 1);
    assert_eq!(pod_writes(&server), 0, "{:?}", server.requests());
    let p = pods.get("web").await?;
    assert_eq!(phase(&p), Some("Running"));

    // Once the provider can apply changes, the next change goes through and the condition
    // says so.
    provider.faults().update_unsupported = false;
    patch(&pods, "web", json!({"metadata": {"labels": {"tier": "c"}}})).await?;
    wait_for("SpecApplied=True", || async {
        let p = pods.get("web").await?;
        Ok(p.status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == SPEC_APPLIED_CONDITION && c.status == "True"))
    })
    .await?;
    assert_eq!(provider.updates().len(), 1);
    Ok(())
}

#[tokio::test]
async fn an_unreachable_provider_gets_the_change_once_it_answers() -> anyhow::Result<()> {
    let MemoryRig {
        server: _server,
        client: _,
        provider,
        running: _running,
        pods,
    } = memory_rig().await?;
    create(&pods, &pod("web", "nebula-mem", &["serve"])).await?;
    wait_running(&pods, "web").await?;
    provider.faults().unreachable = true;
    patch(
        &pods,
        "web",
        json!({"metadata": {"annotations": {"note": "x"}}}),
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(provider.updates().is_empty());
    provider.faults().unreachable = false;
    let u = wait_for("the change after the provider answers", || async {
        let u = provider.updates();
        Ok((!u.is_empty()).then_some(u))
    })
    .await?;
    assert_eq!(u.len(), 1);
    assert_eq!(
        u[0].1.annotations.get("note").map(String::as_str),
        Some("x")
    );
    // Own bookkeeping annotations are not part of what the provider is given.
    assert!(
        u[0].1
            .annotations
            .keys()
            .all(|k| !k.starts_with("outpost.dhnt.io/"))
    );
    Ok(())
}

#[tokio::test]
async fn process_provider_restarts_the_process_on_an_image_change_and_records_labels()
-> anyhow::Result<()> {
    init_logs();
    let server = testkube::ApiServer::start().await?;
    let client = server.client();
    let state = tempfile::tempdir()?;
    let provider =
        ProcessProvider::new("proc", state.path())?.with_poll_interval(Duration::from_millis(300));
    let _running = start_runner(
        client.clone(),
        Arc::new(provider),
        None,
        PodControllerConfig::default(),
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created = create(
        &pods,
        &pod(
            "job",
            "nebula-proc",
            &["/bin/sh", "-c", "echo started; exec sleep 1000"],
        ),
    )
    .await?;
    let claim = vnode::claim_name(&created).unwrap();
    let dir = state.path().join("proc").join(&claim);
    let first = wait_running(&pods, "job").await?;
    let first_id = annotation(&first, ::common::keys::INSTANCE_ID_ANNOTATION)
        .unwrap()
        .to_string();

    // A label change is recorded, the process keeps running.
    patch(&pods, "job", json!({"metadata": {"labels": {"tier": "b"}}})).await?;
    let spec = wait_for("spec.json with the label", || async {
        let Ok(bytes) = std::fs::read(dir.join("spec.json")) else {
            return Ok(None);
        };
        let v: serde_json::Value = serde_json::from_slice(&bytes)?;
        Ok((v["labels"]["tier"] == "b").then_some(v))
    })
    .await?;
    assert_eq!(spec["image"], "busybox");
    let p = pods.get("job").await?;
    assert_eq!(
        annotation(&p, ::common::keys::INSTANCE_ID_ANNOTATION),
        Some(first_id.as_str())
    );

    // An image change restarts the process group: a new instance id, the log continues.
    patch(
        &pods,
        "job",
        json!({"spec": {"containers": [{"name": "main", "image": "busybox:2"}]}}),
    )
    .await?;
    let restarted = wait_for("a new instance id after the image change", || async {
        let p = pods.get("job").await?;
        let id = annotation(&p, ::common::keys::INSTANCE_ID_ANNOTATION).map(str::to_string);
        Ok(id.filter(|id| *id != first_id && phase(&p) == Some("Running")))
    })
    .await?;
    let log = wait_for("two starts in the log", || async {
        let log = std::fs::read_to_string(dir.join("output.log"))?;
        Ok((log.matches("started").count() == 2).then_some(log))
    })
    .await?;
    assert_eq!(log, "started\nstarted\n");
    // The restart is counted as a kubelet counts a container's.
    wait_for("restartCount 1", || async {
        let p = pods.get("job").await?;
        Ok((restart_count(&p) == Some(1)).then_some(()))
    })
    .await?;
    let old_pid: i32 = first_id.split('-').next().unwrap().parse()?;
    let new_pid: i32 = restarted.split('-').next().unwrap().parse()?;
    assert!(
        !std::path::Path::new(&format!("/proc/{old_pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{old_pid}/stat"))?.contains(" Z "),
        "the old process is gone"
    );
    assert!(std::path::Path::new(&format!("/proc/{new_pid}")).exists());
    pods.delete("job", &Default::default()).await?;
    wait_gone(&pods, "job").await?;
    assert!(!dir.exists(), "the pod's directory is removed with it");
    Ok(())
}

#[tokio::test]
async fn the_process_restart_count_survives_a_manager_restart() -> anyhow::Result<()> {
    init_logs();
    let server = testkube::ApiServer::start().await?;
    let client = server.client();
    let state = tempfile::tempdir()?;
    let provider = || {
        ProcessProvider::new("proc", state.path())
            .map(|p| p.with_poll_interval(Duration::from_millis(300)))
    };
    let first = start_runner(
        client.clone(),
        Arc::new(provider()?),
        None,
        PodControllerConfig::default(),
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created = create(
        &pods,
        &pod("job", "nebula-proc", &["/bin/sh", "-c", "exec sleep 1000"]),
    )
    .await?;
    let claim = vnode::claim_name(&created).unwrap();
    let p = wait_running(&pods, "job").await?;
    assert_eq!(restart_count(&p), Some(0));
    let image =
        |image: &'static str| json!({"spec": {"containers": [{"name": "main", "image": image}]}});
    patch(&pods, "job", image("busybox:2")).await?;
    wait_for("restartCount 1 while Running", || async {
        let p = pods.get("job").await?;
        Ok((restart_count(&p) == Some(1) && phase(&p) == Some("Running")).then_some(()))
    })
    .await?;
    first.crash().await;

    // A restarted manager reads the count back from the provider's state.
    let again = provider()?;
    let listed = vnode::Provider::list(&again).await?;
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].claim.as_str(), listed[0].restart_count),
        (claim.as_str(), 1)
    );
    let second = start_runner(
        client.clone(),
        Arc::new(again),
        None,
        PodControllerConfig::default(),
    );
    // The next restart counts on from there.
    patch(&pods, "job", image("busybox:3")).await?;
    wait_for("restartCount 2 while Running", || async {
        let p = pods.get("job").await?;
        Ok((restart_count(&p) == Some(2) && phase(&p) == Some("Running")).then_some(()))
    })
    .await?;
    pods.delete("job", &Default::default()).await?;
    wait_gone(&pods, "job").await?;
    second.stop().await;
    Ok(())
}
