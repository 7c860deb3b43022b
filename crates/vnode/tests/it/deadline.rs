//! `spec.activeDeadlineSeconds`, enforced as the kubelet does: counted from the pod's
//! `status.startTime`, the instance is terminated and the pod reported Failed with reason
//! `DeadlineExceeded`, once; across a manager restart and after a lowering update too.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;
use vnode::pods::PodControllerConfig;
use vnode::providers::memory::MemoryProvider;
use vnode::providers::process::ProcessProvider;
use vnode::status::{DEADLINE_EXCEEDED_MESSAGE, REASON_DEADLINE_EXCEEDED};
use vnode::{Metrics, claim_name};

use crate::common::*;

fn with_deadline(mut p: Pod, seconds: i64) -> Pod {
    if let Some(spec) = p.spec.as_mut() {
        spec.active_deadline_seconds = Some(seconds);
    }
    p
}

fn reason(p: &Pod) -> Option<&str> {
    p.status.as_ref()?.reason.as_deref()
}

/// Waits until pod `name` is Failed for its deadline; returns it.
async fn wait_deadline_exceeded(pods: &Api<Pod>, name: &str) -> anyhow::Result<Pod> {
    wait_for(
        &format!("pod {name} Failed with DeadlineExceeded"),
        || async {
            let p = pods.get(name).await?;
            Ok(
                (phase(&p) == Some("Failed") && reason(&p) == Some(REASON_DEADLINE_EXCEEDED))
                    .then_some(p),
            )
        },
    )
    .await
}

/// The DeadlineExceeded Events about pod `name`.
async fn deadline_events(client: &kube::Client, name: &str) -> anyhow::Result<Vec<Event>> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(REASON_DEADLINE_EXCEEDED)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .collect())
}

/// Pod writes (pods and pods/status) the double recorded.
fn pod_writes(server: &testkube::ApiServer) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.is_write() && r.resource == "pods")
        .count()
}

fn assert_failed_for_the_deadline(p: &Pod) {
    let status = p.status.as_ref().expect("a status");
    assert_eq!(status.message.as_deref(), Some(DEADLINE_EXCEEDED_MESSAGE));
    assert_eq!(status.pod_ip, None);
    let c = &status
        .container_statuses
        .as_ref()
        .expect("container statuses")[0];
    assert!(!c.ready);
    let terminated = c
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .expect("the container is terminated");
    assert_eq!(terminated.reason.as_deref(), Some(REASON_DEADLINE_EXCEEDED));
}

#[tokio::test]
async fn a_pod_past_its_deadline_is_failed_once_and_its_instance_terminated() -> anyhow::Result<()>
{
    let MemoryRig {
        server,
        client,
        provider,
        running,
        pods,
    } = memory_rig().await?;
    // restartPolicy Always does not matter: the pod is failed all the same.
    let mut short = with_deadline(pod("short", "nebula-mem", &["serve"]), 2);
    short.spec.as_mut().unwrap().restart_policy = Some("Always".into());
    let short = create(&pods, &short).await?;
    let forever = create(&pods, &pod("forever", "nebula-mem", &["serve"])).await?;
    let long = create(
        &pods,
        &with_deadline(pod("long", "nebula-mem", &["serve"]), 3600),
    )
    .await?;
    wait_running(&pods, "forever").await?;
    wait_running(&pods, "long").await?;

    let failed = wait_deadline_exceeded(&pods, "short").await?;
    assert_failed_for_the_deadline(&failed);
    // Its instance is gone, and it was not provisioned again.
    let claims = |provider: &MemoryProvider| -> Vec<String> {
        let mut c: Vec<String> = provider.instances().into_iter().map(|i| i.claim).collect();
        c.sort();
        c
    };
    let mut others = vec![claim_name(&forever).unwrap(), claim_name(&long).unwrap()];
    others.sort();
    assert_eq!(claims(&provider), others);
    assert!(!claims(&provider).contains(&claim_name(&short).unwrap()));
    assert_eq!(provider.calls.created.load(Ordering::Relaxed), 3);
    assert_eq!(provider.calls.terminated.load(Ordering::Relaxed), 1);
    // No deadline, or one far away: untouched.
    for name in ["forever", "long"] {
        let p = pods.get(name).await?;
        assert_eq!(phase(&p), Some("Running"), "{name}");
        assert_eq!(reason(&p), None, "{name}");
    }
    // One Event, as the kubelet records it, and the counter.
    let events = wait_for("the DeadlineExceeded Event", || async {
        let e = deadline_events(&client, "short").await?;
        Ok((!e.is_empty()).then_some(e))
    })
    .await?;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].type_.as_deref(), Some("Normal"));
    assert_eq!(events[0].note.as_deref(), Some(DEADLINE_EXCEEDED_MESSAGE));
    assert_eq!(Metrics::get(&running.metrics.deadlines_exceeded), 1);

    // Steady state: several notify rounds write nothing and start nothing.
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.clear_requests();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(pod_writes(&server), 0, "{:?}", server.requests());
    assert_eq!(provider.calls.created.load(Ordering::Relaxed), 3);
    assert_eq!(deadline_events(&client, "short").await?.len(), 1);
    assert_eq!(Metrics::get(&running.metrics.deadlines_exceeded), 1);
    Ok(())
}

#[tokio::test]
async fn a_deadline_that_passed_while_no_manager_ran_fails_the_pod_at_readoption()
-> anyhow::Result<()> {
    init_logs();
    let server = testkube::ApiServer::start().await?;
    let client = server.client();
    let provider = MemoryProvider::new("mem", Duration::from_millis(100));
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let first = start_runner(
        client.clone(),
        Arc::new(provider.clone()),
        None,
        PodControllerConfig::default(),
    );
    let created = create(&pods, &pod("job", "nebula-mem", &["serve"])).await?;
    let running = wait_running(&pods, "job").await?;
    first.crash().await;

    // While no manager runs, a deadline is set (kube-apiserver allows setting one) and
    // passes.
    pods.patch(
        "job",
        &PatchParams::default(),
        &Patch::Strategic(&json!({"spec": {"activeDeadlineSeconds": 1}})),
    )
    .await?;
    let started = running
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .expect("a Running pod has a start time")
        .0;
    wait_for("the deadline to pass", || async {
        Ok((Timestamp::now().as_millisecond() > started.as_millisecond() + 1000).then_some(()))
    })
    .await?;
    assert_eq!(phase(&pods.get("job").await?), Some("Running"));
    assert_eq!(provider.instances().len(), 1);

    let second = start_runner(
        client.clone(),
        Arc::new(provider.clone()),
        None,
        PodControllerConfig::default(),
    );
    let failed = wait_deadline_exceeded(&pods, "job").await?;
    assert_failed_for_the_deadline(&failed);
    assert!(
        provider.instances().is_empty(),
        "the instance is terminated"
    );
    assert_eq!(provider.calls.created.load(Ordering::Relaxed), 1);
    assert_eq!(failed.metadata.uid, created.metadata.uid);
    wait_for("the DeadlineExceeded Event", || async {
        Ok((deadline_events(&client, "job").await?.len() == 1).then_some(()))
    })
    .await?;
    assert_eq!(Metrics::get(&second.metrics.deadlines_exceeded), 1);
    second.stop().await;
    Ok(())
}

#[tokio::test]
async fn a_lowered_deadline_takes_effect_and_stops_the_process() -> anyhow::Result<()> {
    init_logs();
    let server = testkube::ApiServer::start().await?;
    let client = server.client();
    let state = tempfile::tempdir()?;
    let provider =
        ProcessProvider::new("proc", state.path())?.with_poll_interval(Duration::from_millis(300));
    let running = start_runner(
        client.clone(),
        Arc::new(provider),
        None,
        PodControllerConfig::default(),
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created = create(
        &pods,
        &with_deadline(
            pod("job", "nebula-proc", &["/bin/sh", "-c", "exec sleep 1000"]),
            3600,
        ),
    )
    .await?;
    let dir = state
        .path()
        .join("proc")
        .join(claim_name(&created).unwrap());
    let p = wait_running(&pods, "job").await?;
    let id = annotation(&p, ::common::keys::INSTANCE_ID_ANNOTATION)
        .unwrap()
        .to_string();
    let pid: i32 = id.split('-').next().unwrap().parse()?;
    assert!(dir.exists());

    // kube-apiserver lets the deadline be lowered on a running pod.
    pods.patch(
        "job",
        &PatchParams::default(),
        &Patch::Strategic(&json!({"spec": {"activeDeadlineSeconds": 1}})),
    )
    .await?;
    let failed = wait_deadline_exceeded(&pods, "job").await?;
    assert_failed_for_the_deadline(&failed);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty() || stat.contains(") Z "),
        "the process is gone: {stat}"
    );
    assert!(
        !dir.exists(),
        "the pod's directory is removed with its instance"
    );
    assert_eq!(Metrics::get(&running.metrics.deadlines_exceeded), 1);
    Ok(())
}
