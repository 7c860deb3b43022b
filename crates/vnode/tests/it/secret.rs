//! The connect Secret: the provider's credential for a pod's instance, written before the
//! pod is reported Running, owned by the pod so the garbage collector removes it with it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use tokio::io::AsyncReadExt;
use vnode::pods::PodControllerConfig;
use vnode::providers::memory::MemoryProvider;
use vnode::providers::process::ProcessProvider;
use vnode::{LogOptions, Provider};

use crate::common::*;

fn value(s: &Secret, key: &str) -> Option<String> {
    let b = s.data.as_ref()?.get(key)?;
    String::from_utf8(b.0.clone()).ok()
}

/// Checks `<pod>-connect` is owned by `pod` as a controller that blocks its deletion.
pub fn assert_owned(secret: &Secret, pod: &Pod) {
    let refs = secret.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(refs.len(), 1, "{refs:?}");
    let o = &refs[0];
    assert_eq!(
        (o.api_version.as_str(), o.kind.as_str(), Some(&o.name)),
        ("v1", "Pod", pod.metadata.name.as_ref())
    );
    assert_eq!(Some(&o.uid), pod.metadata.uid.as_ref());
    assert_eq!(o.controller, Some(true));
    assert_eq!(o.block_owner_deletion, Some(true));
}

#[tokio::test]
async fn the_connect_secret_is_owned_by_the_pod_and_collected_with_it() -> anyhow::Result<()> {
    let MemoryRig {
        server,
        client,
        provider,
        running: _running,
        pods,
    } = memory_rig().await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    create(&pods, &pod("web", "nebula-mem", &["serve"])).await?;
    let p = wait_running(&pods, "web").await?;
    // Written before Running was reported, so it is there as soon as the pod is Running.
    let s = secrets
        .get_opt("web-connect")
        .await?
        .expect("the connect Secret exists once the pod is Running");
    assert_owned(&s, &p);
    let claim = vnode::claim_name(&p).unwrap();
    let token = provider.token(&claim).unwrap();
    assert_eq!(value(&s, "token").as_deref(), Some(token.as_str()));
    assert_eq!(
        value(&s, "endpoint").as_deref(),
        annotation(&p, ::common::keys::ENDPOINT_ANNOTATION)
    );
    assert_eq!(s.type_.as_deref(), Some("Opaque"));

    // Steady state does not read or write it again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.clear_requests();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        !server.requests().iter().any(|r| r.resource == "secrets"),
        "{:?}",
        server.requests()
    );

    delete(&pods, "web", None).await?;
    wait_gone(&pods, "web").await?;
    wait_for("the Secret collected with its pod", || async {
        Ok(secrets
            .get_opt("web-connect")
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;

    // A pod re-created under the same name gets its own Secret with its own token.
    create(&pods, &pod("web", "nebula-mem", &["serve"])).await?;
    let p2 = wait_running(&pods, "web").await?;
    let s2 = secrets.get("web-connect").await?;
    assert_owned(&s2, &p2);
    assert_ne!(value(&s2, "token"), Some(token));
    Ok(())
}

#[tokio::test]
async fn a_provider_without_credentials_gets_no_secret() -> anyhow::Result<()> {
    // The trait's default: no credential, no Secret, the pod still runs.
    struct NoCreds(MemoryProvider);
    impl Provider for NoCreds {
        fn name(&self) -> &str {
            self.0.name()
        }
        fn capabilities(&self) -> vnode::Capabilities {
            self.0.capabilities()
        }
        fn provision<'a>(
            &'a self,
            req: &'a vnode::ProvisionRequest,
        ) -> futures::future::BoxFuture<'a, Result<vnode::Instance, vnode::ProviderError>> {
            self.0.provision(req)
        }
        fn terminate<'a>(
            &'a self,
            id: &'a str,
        ) -> futures::future::BoxFuture<'a, Result<(), vnode::ProviderError>> {
            self.0.terminate(id)
        }
        fn list(
            &self,
        ) -> futures::future::BoxFuture<'_, Result<Vec<vnode::Instance>, vnode::ProviderError>>
        {
            self.0.list()
        }
        fn status<'a>(
            &'a self,
            id: &'a str,
        ) -> futures::future::BoxFuture<'a, Result<Option<vnode::Instance>, vnode::ProviderError>>
        {
            self.0.status(id)
        }
        fn health(&self) -> futures::future::BoxFuture<'_, Result<(), vnode::ProviderError>> {
            self.0.health()
        }
    }
    init_logs();
    let server = testkube::ApiServer::start().await?;
    let client = server.client();
    let provider = MemoryProvider::new("mem", Duration::from_millis(200));
    let _running = start_runner(
        client.clone(),
        Arc::new(NoCreds(provider)),
        None,
        PodControllerConfig::default(),
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    create(&pods, &pod("web", "nebula-mem", &["serve"])).await?;
    wait_running(&pods, "web").await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    assert!(secrets.get_opt("web-connect").await?.is_none());
    Ok(())
}

#[tokio::test]
async fn process_pods_get_their_token_in_the_environment_and_the_secret() -> anyhow::Result<()> {
    init_logs();
    let server = testkube::ApiServer::start().await?;
    let client = server.client();
    let state = tempfile::tempdir()?;
    let provider = Arc::new(
        ProcessProvider::new("proc", state.path())?.with_poll_interval(Duration::from_millis(300)),
    );
    let _running = start_runner(
        client.clone(),
        provider.clone(),
        None,
        PodControllerConfig::default(),
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    create(
        &pods,
        &pod(
            "svc",
            "nebula-proc",
            &[
                "/bin/sh",
                "-c",
                "echo \"token=$NEBULA_CONNECT_TOKEN\"; exec sleep 1000",
            ],
        ),
    )
    .await?;
    let p = wait_running(&pods, "svc").await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let s = secrets.get("svc-connect").await?;
    assert_owned(&s, &p);
    let token = value(&s, "token").unwrap();
    assert_eq!(token.len(), 32);
    assert_eq!(value(&s, "endpoint").as_deref(), Some("127.0.0.1"));
    let id = annotation(&p, ::common::keys::INSTANCE_ID_ANNOTATION)
        .unwrap()
        .to_string();
    let logs = provider.log_streamer().unwrap();
    let want = format!("token={token}\n");
    let mut out = String::new();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while out != want && tokio::time::Instant::now() < deadline {
        out.clear();
        logs.logs(&id, &LogOptions::default())
            .await?
            .read_to_string(&mut out)
            .await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(out, want, "the process sees the token the Secret holds");
    delete(&pods, "svc", None).await?;
    wait_gone(&pods, "svc").await?;
    wait_for("the Secret collected with its pod", || async {
        Ok(secrets
            .get_opt("svc-connect")
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    Ok(())
}
