//! Leader failover with two managers: the standby takes over after the leader is killed
//! and re-adopts its processes without creating or terminating anything.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};

use crate::crash::{gone, kill_claims, pod, running, start_with, tagged_processes, wait_for};

#[tokio::test]
async fn standby_takes_over_and_readopts_without_creating_or_terminating() -> anyhow::Result<()> {
    let server = testkube::ApiServer::start().await?;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let leases: Api<Lease> = Api::namespaced(server.client(), "kube-system");
    // Both replicas share the state directory, as two containers of one pod sharing a
    // volume would; in a cluster each provider's instances live wherever it provisions.
    let state = crate::state::state_dir();
    let kc = server.kubeconfig_path().to_path_buf();
    let mut claims = Vec::new();
    let result = async {
        let mut first = start_with(&kc, state.path(), None, &["--leader-elect"])?;
        let holder = |l: &Lease| {
            l.spec
                .as_ref()
                .and_then(|s| s.holder_identity.clone())
                .unwrap_or_default()
        };
        let lease = wait_for("the provider lease", || async {
            Ok(leases
                .get_opt("nebula-manager-process")
                .await?
                .filter(|l| !holder(l).is_empty()))
        })
        .await?;
        let leader = holder(&lease);
        let second = start_with(&kc, state.path(), None, &["--leader-elect"])?;

        let a = pods.create(&PostParams::default(), &pod("a")).await?;
        claims.push(vnode::claim_name(&a).unwrap());
        let a = running(&pods, "a").await?;
        let id = a.metadata.annotations.clone().unwrap_or_default()
            [::common::keys::INSTANCE_ID_ANNOTATION]
            .clone();
        assert_eq!(tagged_processes().get(&claims[0]).map(Vec::len), Some(1));

        // The leader dies without releasing its lease; the standby waits it out.
        first.0.kill()?;
        first.0.wait()?;
        wait_for("the standby to hold the lease", || async {
            Ok(leases
                .get_opt("nebula-manager-process")
                .await?
                .filter(|l| !holder(l).is_empty() && holder(l) != leader))
        })
        .await?;
        // It serves: a new pod runs, the old one keeps its process.
        let b = pods.create(&PostParams::default(), &pod("b")).await?;
        claims.push(vnode::claim_name(&b).unwrap());
        running(&pods, "b").await?;
        let a2 = pods.get("a").await?;
        assert_eq!(
            a2.metadata.annotations.unwrap_or_default()[::common::keys::INSTANCE_ID_ANNOTATION],
            id,
            "a kept its process across the failover"
        );
        let procs = tagged_processes();
        assert_eq!(
            procs.get(&claims[0]).map(Vec::len),
            Some(1),
            "nothing created for a"
        );
        assert_eq!(procs.get(&claims[1]).map(Vec::len), Some(1));
        // And deletion works through the new leader.
        pods.delete("a", &DeleteParams::default()).await?;
        gone(&pods, "a").await?;
        wait_for("a's process gone", || async {
            Ok((!tagged_processes().contains_key(&claims[0])).then_some(()))
        })
        .await?;
        drop(second);
        Ok::<(), anyhow::Error>(())
    }
    .await;
    kill_claims(&claims);
    result
}
