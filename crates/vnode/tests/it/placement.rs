//! Placement with the API double's scheduler stand-in: gate removal, binding, and failover
//! past a provider that refuses.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use vnode::placement::{Candidate, REASON_NO_PROVIDER, run_placement};
use vnode::pods::PodControllerConfig;
use vnode::providers::memory::MemoryProvider;
use vnode::{BlockScope, Blocklist, Metrics, Provider};

use crate::common::*;

fn gated(name: &str, candidates: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default",
            "annotations": {::common::keys::PROVIDERS_ANNOTATION: candidates}},
        "spec": {
            "schedulingGates": [{"name": ::common::keys::PLACEMENT_GATE}],
            "containers": [{"name": "main", "image": "busybox", "command": ["x"]}],
        },
    }))
    .expect("a valid pod")
}

struct Setup {
    _server: testkube::ApiServer,
    pods: Api<Pod>,
    a: MemoryProvider,
    b: MemoryProvider,
    _runners: Vec<Running>,
    placement: CancellationToken,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.placement.cancel();
    }
}

async fn setup() -> anyhow::Result<Setup> {
    let server = testkube::ApiServer::builder()
        .scheduler(true)
        .start()
        .await?;
    let client = server.client();
    let blocklist = Arc::new(Blocklist::new());
    let cfg = PodControllerConfig {
        blocklist: blocklist.clone(),
        block_ttl: Duration::from_secs(600),
        events: true,
    };
    let a = MemoryProvider::new("a", Duration::from_millis(200));
    let b = MemoryProvider::new("b", Duration::from_millis(200));
    let runners = vec![
        start_runner(client.clone(), Arc::new(a.clone()), None, cfg.clone()),
        start_runner(client.clone(), Arc::new(b.clone()), None, cfg.clone()),
    ];
    let known = [&a, &b]
        .iter()
        .map(|p| Candidate {
            name: p.name().to_string(),
            capacity_types: p.capabilities().capacity_types,
        })
        .collect();
    let placement = CancellationToken::new();
    tokio::spawn(run_placement(
        client.clone(),
        known,
        blocklist,
        Arc::new(Metrics::default()),
        placement.clone(),
    ));
    Ok(Setup {
        pods: Api::namespaced(client, "default"),
        _server: server,
        a,
        b,
        _runners: runners,
        placement,
    })
}

#[tokio::test]
async fn gated_pod_is_placed_scheduled_and_provisioned_on_the_first_candidate() -> anyhow::Result<()>
{
    init_logs();
    let s = setup().await?;
    create(&s.pods, &gated("web", "b,a")).await?;
    let p = wait_running(&s.pods, "web").await?;
    let spec = p.spec.clone().unwrap();
    assert_eq!(spec.node_name.as_deref(), Some("nebula-b"));
    assert!(spec.scheduling_gates.unwrap_or_default().is_empty());
    assert_eq!(
        spec.node_selector
            .unwrap()
            .get(::common::keys::PROVIDER_LABEL)
            .map(String::as_str),
        Some("b")
    );
    assert_eq!(
        annotation(&p, ::common::keys::CAPACITY_TYPE_ANNOTATION),
        Some("on-demand")
    );
    assert_eq!(s.b.instances().len(), 1);
    assert!(s.a.instances().is_empty());
    delete(&s.pods, "web", None).await?;
    wait_gone(&s.pods, "web").await?;
    assert!(s.b.instances().is_empty());
    Ok(())
}

#[tokio::test]
async fn refused_pod_fails_over_to_the_next_candidate() -> anyhow::Result<()> {
    init_logs();
    let s = setup().await?;
    s.a.faults().refuse = Some(BlockScope::Provider);
    create(&s.pods, &gated("web", "a,b")).await?;
    let p = wait_for("web Running on nebula-b", || async {
        Ok(s.pods.get_opt("web").await?.filter(|p| {
            phase(p) == Some("Running")
                && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("nebula-b")
        }))
    })
    .await?;
    assert!(
        s.a.instances().is_empty(),
        "the refusing provider holds nothing"
    );
    assert_eq!(s.b.instances().len(), 1);
    assert_eq!(
        s.a.calls
            .provisions
            .load(std::sync::atomic::Ordering::Relaxed),
        1,
        "one refusal, then the blocklist keeps placement away"
    );
    assert!(annotation(&p, ::common::keys::INSTANCE_ID_ANNOTATION).is_some());
    Ok(())
}

#[tokio::test]
async fn no_candidate_left_is_a_pod_condition() -> anyhow::Result<()> {
    init_logs();
    let s = setup().await?;
    s.a.faults().refuse = Some(BlockScope::Provider);
    create(&s.pods, &gated("web", "a,nowhere")).await?;
    let p = wait_for("the no-candidate condition", || async {
        Ok(s.pods.get_opt("web").await?.filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.reason.as_deref() == Some(REASON_NO_PROVIDER))
                })
        }))
    })
    .await?;
    let cond = p
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "PodScheduled")
        .unwrap();
    assert_eq!(cond.status, "False");
    assert!(
        cond.message
            .unwrap_or_default()
            .contains("a (refused recently)")
    );
    // Not a hot loop: the pod is written once and then left alone.
    let rv = p.metadata.resource_version.clone();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(s.pods.get("web").await?.metadata.resource_version, rv);
    assert_eq!(
        s.a.calls
            .provisions
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    Ok(())
}
