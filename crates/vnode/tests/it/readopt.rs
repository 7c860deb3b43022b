//! Re-adoption after a restart, an unreachable provider, and re-created pods.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use vnode::pods::PodControllerConfig;
use vnode::providers::memory::MemoryProvider;
use vnode::{Metrics, claim_name};

use crate::common::*;

#[tokio::test]
async fn unreachable_provider_during_readoption_neither_creates_nor_terminates()
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
    create(&pods, &pod("a", "nebula-mem", &["x"])).await?;
    create(&pods, &pod("b", "nebula-mem", &["x"])).await?;
    let a = wait_running(&pods, "a").await?;
    wait_running(&pods, "b").await?;
    first.crash().await;

    provider.faults().unreachable = true;
    delete(&pods, "b", None).await?;
    let second = start_runner(
        client.clone(),
        Arc::new(provider.clone()),
        None,
        PodControllerConfig::default(),
    );
    // Let the new manager try many times against the unreachable provider.
    let lists = provider.calls.lists.load(Ordering::Relaxed);
    wait_for("repeated list attempts", || async {
        Ok((provider.calls.lists.load(Ordering::Relaxed) >= lists + 10).then_some(()))
    })
    .await?;
    assert_eq!(
        provider.calls.created.load(Ordering::Relaxed),
        2,
        "no create while unreachable"
    );
    assert_eq!(
        provider.calls.terminated.load(Ordering::Relaxed),
        0,
        "no terminate while unreachable"
    );
    assert_eq!(provider.instances().len(), 2);
    assert!(
        pods.get_opt("b").await?.is_some(),
        "b waits for its instance's termination"
    );
    let still = pods.get("a").await?;
    assert_eq!(
        phase(&still),
        Some("Running"),
        "a is not failed for an unreachable provider"
    );

    provider.faults().unreachable = false;
    wait_gone(&pods, "b").await?;
    let claim_a = claim_name(&a).unwrap();
    wait_for("only a's instance", || async {
        let claims: Vec<String> = provider.instances().into_iter().map(|i| i.claim).collect();
        Ok((claims == vec![claim_a.clone()]).then_some(()))
    })
    .await?;
    let a2 = pods.get("a").await?;
    assert_eq!(
        annotation(&a2, ::common::keys::INSTANCE_ID_ANNOTATION),
        annotation(&a, ::common::keys::INSTANCE_ID_ANNOTATION),
        "a kept its instance"
    );
    assert_eq!(provider.calls.created.load(Ordering::Relaxed), 2);
    assert_eq!(provider.calls.terminated.load(Ordering::Relaxed), 1);
    assert!(Metrics::get(&second.metrics.readoptions) >= 1);
    second.stop().await;
    Ok(())
}

#[tokio::test]
async fn recreated_pod_with_the_same_name_is_a_new_claim() -> anyhow::Result<()> {
    init_logs();
    let server = testkube::ApiServer::start().await?;
    let client = server.client();
    let provider = MemoryProvider::new("mem", Duration::from_millis(100));
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let _running = start_runner(
        client.clone(),
        Arc::new(provider.clone()),
        None,
        PodControllerConfig::default(),
    );
    create(&pods, &pod("web", "nebula-mem", &["x"])).await?;
    let old = wait_running(&pods, "web").await?;
    // Force-delete and re-create at once, the race virtual-kubelet keys by name lose.
    delete(&pods, "web", Some(0)).await?;
    create(&pods, &pod("web", "nebula-mem", &["x"])).await?;
    let new = wait_for("the new web Running", || async {
        Ok(pods.get_opt("web").await?.filter(|p| {
            p.metadata.uid != old.metadata.uid
                && phase(p) == Some("Running")
                && annotation(p, ::common::keys::INSTANCE_ID_ANNOTATION).is_some()
        }))
    })
    .await?;
    let (c_old, c_new) = (claim_name(&old).unwrap(), claim_name(&new).unwrap());
    assert_ne!(c_old, c_new, "two claims");
    wait_for("only the new claim's instance", || async {
        let claims: Vec<String> = provider.instances().into_iter().map(|i| i.claim).collect();
        Ok((claims == vec![c_new.clone()]).then_some(()))
    })
    .await?;
    assert_ne!(
        annotation(&new, ::common::keys::INSTANCE_ID_ANNOTATION),
        annotation(&old, ::common::keys::INSTANCE_ID_ANNOTATION)
    );
    assert_eq!(provider.calls.created.load(Ordering::Relaxed), 2);
    assert_eq!(provider.calls.terminated.load(Ordering::Relaxed), 1);
    Ok(())
}
