//! Pods become instances and go away with them: in-memory and process providers.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use tokio::io::AsyncReadExt;
use vnode::pods::PodControllerConfig;
use vnode::providers::memory::MemoryProvider;
use vnode::providers::process::ProcessProvider;
use vnode::{InstanceState, LogOptions, Provider};

use crate::common::*;

#[tokio::test]
async fn memory_pod_is_provisioned_running_annotated_and_terminated_on_delete() -> anyhow::Result<()>
{
    init_logs();
    let server = testkube::ApiServer::start().await?;
    let client = server.client();
    let provider = MemoryProvider::new("mem", Duration::from_millis(200));
    let running = start_runner(
        client.clone(),
        Arc::new(provider.clone()),
        None,
        PodControllerConfig::default(),
    );

    // The node is registered with the names from the keys crate, and its lease renewed.
    let nodes: Api<Node> = Api::all(client.clone());
    let node = wait_for("node", || async { Ok(nodes.get_opt("nebula-mem").await?) }).await?;
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get(::common::keys::RUNTIME_LABEL)
            .map(String::as_str),
        Some(::common::keys::RUNTIME_VIRTUAL)
    );
    assert_eq!(
        labels
            .get(::common::keys::PROVIDER_LABEL)
            .map(String::as_str),
        Some("mem")
    );
    let taint = &node
        .spec
        .clone()
        .unwrap_or_default()
        .taints
        .unwrap_or_default()[0];
    assert_eq!(
        (taint.key.as_str(), taint.effect.as_str()),
        (::common::keys::PROVIDER_TAINT, "NoSchedule")
    );
    let status = node.status.clone().unwrap_or_default();
    assert_eq!(status.addresses.unwrap_or_default()[0].address, "127.0.0.1");
    assert_eq!(
        status
            .daemon_endpoints
            .unwrap()
            .kubelet_endpoint
            .unwrap()
            .port,
        10250
    );
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = wait_for("node lease", || async {
        Ok(leases.get_opt("nebula-mem").await?)
    })
    .await?;
    // Owned by the Node, as the kubelet's Lease is: deleting the Node collects it.
    let owner = &lease.metadata.owner_references.unwrap_or_default()[..];
    assert_eq!(owner.len(), 1, "{owner:?}");
    assert_eq!(
        (owner[0].kind.as_str(), owner[0].name.as_str()),
        ("Node", "nebula-mem")
    );
    assert_eq!(Some(&owner[0].uid), node.metadata.uid.as_ref());

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    create(&pods, &pod("web", "nebula-mem", &["serve"])).await?;
    let p = wait_running(&pods, "web").await?;
    let instances = provider.instances();
    assert_eq!(instances.len(), 1);
    assert_eq!(
        annotation(&p, ::common::keys::INSTANCE_ID_ANNOTATION),
        Some(instances[0].id.as_str())
    );
    assert_eq!(
        annotation(&p, ::common::keys::ENDPOINT_ANNOTATION),
        instances[0].endpoint.as_deref()
    );
    assert_eq!(Some(instances[0].claim.clone()), vnode::claim_name(&p));
    // What the manager did is on record as an Event about the pod.
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), "default");
    wait_for("the Provisioned event", || async {
        let list = events.list(&Default::default()).await?;
        Ok(list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("Provisioned")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web")
        }))
    })
    .await?;

    delete(&pods, "web", None).await?;
    wait_gone(&pods, "web").await?;
    assert!(
        provider.instances().is_empty(),
        "the instance is terminated with its pod"
    );
    assert_eq!(
        provider
            .calls
            .created
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    running.stop().await;
    Ok(())
}

#[tokio::test]
async fn instance_exit_and_vanishing_are_reported_on_the_pod() -> anyhow::Result<()> {
    let MemoryRig {
        server: _server,
        client: _,
        provider,
        running: _running,
        pods,
    } = memory_rig().await?;
    for name in ["done", "lost"] {
        create(&pods, &pod(name, "nebula-mem", &["x"])).await?;
        wait_running(&pods, name).await?;
    }
    let claim = |p: &Pod| vnode::claim_name(p).unwrap();
    let done = pods.get("done").await?;
    provider.set_state(&claim(&done), InstanceState::Exited { code: 0 });
    let lost = pods.get("lost").await?;
    assert!(provider.vanish(&claim(&lost)));
    wait_for("done Succeeded", || async {
        Ok(pods
            .get("done")
            .await
            .ok()
            .filter(|p| phase(p) == Some("Succeeded")))
    })
    .await?;
    let lost = wait_for("lost Failed", || async {
        Ok(pods
            .get("lost")
            .await
            .ok()
            .filter(|p| phase(p) == Some("Failed")))
    })
    .await?;
    assert_eq!(
        lost.status.unwrap().reason.as_deref(),
        Some(vnode::status::REASON_VANISHED)
    );
    // Terminal pods are left alone: no new instance for either.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        provider
            .calls
            .created
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    Ok(())
}

#[tokio::test]
async fn steady_state_writes_nothing() -> anyhow::Result<()> {
    init_logs();
    let server = testkube::ApiServer::start().await?;
    let client = server.client();
    let provider = MemoryProvider::new("mem", Duration::from_millis(100));
    let _running = start_runner(
        client.clone(),
        Arc::new(provider.clone()),
        None,
        PodControllerConfig::default(),
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for i in 0..5 {
        create(&pods, &pod(&format!("p{i}"), "nebula-mem", &["x"])).await?;
    }
    for i in 0..5 {
        wait_running(&pods, &format!("p{i}")).await?;
    }
    // Let every write in flight land, then watch ten notify rounds.
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.clear_requests();
    let lists = provider
        .calls
        .lists
        .load(std::sync::atomic::Ordering::Relaxed);
    wait_for("ten notify rounds", || async {
        Ok((provider
            .calls
            .lists
            .load(std::sync::atomic::Ordering::Relaxed)
            >= lists + 10)
            .then_some(()))
    })
    .await?;
    let pod_writes: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.is_write() && r.resource == "pods")
        .collect();
    assert!(
        pod_writes.is_empty(),
        "steady state wrote pods: {pod_writes:?}"
    );
    Ok(())
}

#[tokio::test]
async fn process_pod_runs_a_real_process_with_logs_and_is_killed_on_delete() -> anyhow::Result<()> {
    init_logs();
    let server = testkube::ApiServer::start().await?;
    let client = server.client();
    let state = tempfile::tempdir()?;
    let provider =
        ProcessProvider::new("proc", state.path())?.with_poll_interval(Duration::from_millis(200));
    let _running = start_runner(
        client.clone(),
        Arc::new(provider.clone()),
        None,
        PodControllerConfig::default(),
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut p = pod("job", "nebula-proc", &["/bin/sh", "-c"]);
    let c = &mut p.spec.as_mut().unwrap().containers[0];
    c.args = Some(vec![
        "echo \"hello $GREETING from $(pwd)\"; exec sleep 1000".into(),
    ]);
    c.env = Some(vec![k8s_openapi::api::core::v1::EnvVar {
        name: "GREETING".into(),
        value: Some("world".into()),
        value_from: None,
    }]);
    c.working_dir = Some("/app".into());
    create(&pods, &p).await?;
    let p = wait_running(&pods, "job").await?;
    let id = annotation(&p, ::common::keys::INSTANCE_ID_ANNOTATION)
        .unwrap()
        .to_string();
    let pid: i32 = id.split('-').next().unwrap().parse()?;
    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the process runs"
    );

    // Its output, through the log-streaming capability the kubelet API will use.
    let logs = provider
        .log_streamer()
        .expect("the process provider streams logs");
    let text = wait_for("the greeting in the log", || async {
        let mut s = String::new();
        logs.logs(&id, &LogOptions::default())
            .await?
            .read_to_string(&mut s)
            .await?;
        Ok(s.contains("hello").then_some(s))
    })
    .await?;
    let claim = vnode::claim_name(&p).unwrap();
    assert_eq!(
        text.trim(),
        format!(
            "hello world from {}",
            state
                .path()
                .join("proc")
                .join(&claim)
                .join("root/app")
                .display()
        )
    );

    delete(&pods, "job", None).await?;
    wait_gone(&pods, "job").await?;
    wait_for("the process gone", || async {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        Ok((stat.is_empty() || stat.contains(") Z")).then_some(()))
    })
    .await?;
    assert!(
        !state.path().join("proc").join(&claim).exists(),
        "the pod's directory is removed"
    );
    Ok(())
}

#[tokio::test]
async fn process_exit_code_becomes_the_pod_phase() -> anyhow::Result<()> {
    init_logs();
    let server = testkube::ApiServer::start().await?;
    let client = server.client();
    let state = tempfile::tempdir()?;
    let provider =
        ProcessProvider::new("proc", state.path())?.with_poll_interval(Duration::from_millis(200));
    let _running = start_runner(
        client.clone(),
        Arc::new(provider),
        None,
        PodControllerConfig::default(),
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    create(
        &pods,
        &pod("ok", "nebula-proc", &["/bin/sh", "-c", "sleep 1; exit 0"]),
    )
    .await?;
    create(
        &pods,
        &pod("bad", "nebula-proc", &["/bin/sh", "-c", "sleep 1; exit 3"]),
    )
    .await?;
    for (name, want) in [("ok", "Succeeded"), ("bad", "Failed")] {
        let p = wait_for(&format!("{name} {want}"), || async {
            Ok(pods.get(name).await.ok().filter(|p| phase(p) == Some(want)))
        })
        .await?;
        let code = p.status.unwrap().container_statuses.unwrap()[0]
            .state
            .clone()
            .unwrap()
            .terminated
            .unwrap()
            .exit_code;
        assert_eq!(code, if want == "Succeeded" { 0 } else { 3 });
    }
    Ok(())
}

#[tokio::test]
async fn node_ready_and_lease_are_withheld_while_the_provider_is_unhealthy() -> anyhow::Result<()> {
    init_logs();
    let server = testkube::ApiServer::start().await?;
    let client = server.client();
    let provider = MemoryProvider::new("mem", Duration::from_millis(200));
    provider.faults().unhealthy = true;
    let _running = start_runner(
        client.clone(),
        Arc::new(provider.clone()),
        None,
        PodControllerConfig::default(),
    );
    let nodes: Api<Node> = Api::all(client.clone());
    let ready = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
    };
    let node = wait_for("the node", || async {
        Ok(nodes.get_opt("nebula-mem").await?)
    })
    .await?;
    assert_eq!(
        ready(&node),
        Some(("False".into(), "ProviderUnhealthy".into()))
    );
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    assert!(
        leases.get_opt("nebula-mem").await?.is_none(),
        "no lease while unhealthy"
    );

    provider.faults().unhealthy = false;
    wait_for("Ready True", || async {
        let n = nodes.get("nebula-mem").await?;
        Ok((ready(&n).map(|r| r.0).as_deref() == Some("True")).then_some(()))
    })
    .await?;
    wait_for("the node lease", || async {
        Ok(leases.get_opt("nebula-mem").await?)
    })
    .await?;
    Ok(())
}
