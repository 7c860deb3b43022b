//! Crash safety in process: the runner is dropped mid-step at every crash point (all its
//! tasks abort, as under kill -9), a new runner starts on the same provider, and exactly
//! one instance exists per live pod and none for deleted ones. The same with the real
//! binary and `kill -9` is in nebula-manager's tests.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use vnode::pods::PodControllerConfig;
use vnode::providers::memory::MemoryProvider;
use vnode::{CrashPoint, claim_name};

use crate::common::*;

async fn crash_at(point: CrashPoint) -> anyhow::Result<()> {
    let server = testkube::ApiServer::start().await?;
    let client = server.client();
    let provider = MemoryProvider::new("mem", Duration::from_millis(200));
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let (hook, mut crashed) = crash_once_at(point);
    let first = if point == CrashPoint::ProviderCreated {
        provider.set_crash_hook(Some(hook));
        start_runner(
            client.clone(),
            Arc::new(provider.clone()),
            None,
            PodControllerConfig::default(),
        )
    } else {
        start_runner(
            client.clone(),
            Arc::new(provider.clone()),
            Some(hook),
            PodControllerConfig::default(),
        )
    };
    // A pod that is Running before the crash, and one to delete while the manager is down.
    if point == CrashPoint::AfterTerminate {
        create(&pods, &pod("victim", "nebula-mem", &["x"])).await?;
        wait_running(&pods, "victim").await?;
        delete(&pods, "victim", None).await?;
    } else {
        create(&pods, &pod("a", "nebula-mem", &["x"])).await?;
    }
    tokio::time::timeout(DEADLINE, crashed.wait_for(|c| *c)).await??;
    first.crash().await;
    provider.set_crash_hook(None);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    if point == CrashPoint::AfterSecret {
        // The Secret comes before the Running status.
        let a = pods.get("a").await?;
        assert_ne!(phase(&a), Some("Running"));
        assert!(secrets.get_opt("a-connect").await?.is_some());
    }

    // While no manager runs: one more pod arrives, and one that ran is force-deleted.
    create(&pods, &pod("late", "nebula-mem", &["x"])).await?;
    let second = start_runner(
        client.clone(),
        Arc::new(provider.clone()),
        None,
        PodControllerConfig::default(),
    );
    wait_running(&pods, "late").await?;
    if point != CrashPoint::AfterTerminate {
        wait_running(&pods, "a").await?;
    } else {
        wait_gone(&pods, "victim").await?;
    }
    let live: BTreeSet<String> = pods
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter_map(claim_name)
        .collect();
    let instances = wait_for("instances to match the live pods", || async {
        let claims: Vec<String> = provider.instances().into_iter().map(|i| i.claim).collect();
        let set: BTreeSet<String> = claims.iter().cloned().collect();
        Ok((set == live && claims.len() == live.len()).then_some(claims))
    })
    .await?;
    assert_eq!(
        instances.len(),
        live.len(),
        "{point:?}: exactly one instance per live pod"
    );
    // Nothing was created twice: every create is accounted for by a live pod or the
    // deleted victim.
    let created = provider.calls.created.load(Ordering::Relaxed);
    let expected = live.len() as u64 + u64::from(point == CrashPoint::AfterTerminate);
    assert_eq!(created, expected, "{point:?}: instances created");
    // Every live pod has its connect Secret, owned by it, and each was created once: a
    // crash between provisioning and the Secret write re-creates it exactly once.
    for p in pods.list(&Default::default()).await?.items {
        let name = p.metadata.name.clone().unwrap();
        let s = secrets.get(&format!("{name}-connect")).await?;
        crate::secret::assert_owned(&s, &p);
    }
    let secret_creates = server
        .requests()
        .iter()
        .filter(|r| r.resource == "secrets" && r.verb == "create" && r.code == 201)
        .count();
    assert_eq!(
        secret_creates as u64, expected,
        "{point:?}: connect Secrets created"
    );
    second.stop().await;
    Ok(())
}

#[tokio::test]
async fn crash_at_every_point_leaves_one_instance_per_live_pod() -> anyhow::Result<()> {
    init_logs();
    for point in CrashPoint::ALL {
        crash_at(point)
            .await
            .map_err(|e| e.context(format!("crash point {point:?}")))?;
    }
    Ok(())
}

#[tokio::test]
async fn force_deleted_pod_while_down_leaves_no_instance() -> anyhow::Result<()> {
    init_logs();
    let server = testkube::ApiServer::start().await?;
    let client = server.client();
    let provider = MemoryProvider::new("mem", Duration::from_millis(200));
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let first = start_runner(
        client.clone(),
        Arc::new(provider.clone()),
        None,
        PodControllerConfig::default(),
    );
    create(&pods, &pod("keep", "nebula-mem", &["x"])).await?;
    create(&pods, &pod("gone", "nebula-mem", &["x"])).await?;
    wait_running(&pods, "keep").await?;
    wait_running(&pods, "gone").await?;
    first.crash().await;
    delete(&pods, "gone", Some(0)).await?;
    let _second = start_runner(
        client.clone(),
        Arc::new(provider.clone()),
        None,
        PodControllerConfig::default(),
    );
    let keep = claim_name(&pods.get("keep").await?).unwrap();
    wait_for("only keep's instance left", || async {
        let claims: Vec<String> = provider.instances().into_iter().map(|i| i.claim).collect();
        Ok((claims == vec![keep.clone()]).then_some(()))
    })
    .await?;
    assert_eq!(provider.calls.created.load(Ordering::Relaxed), 2);
    Ok(())
}
