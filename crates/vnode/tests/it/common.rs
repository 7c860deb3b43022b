//! Helpers shared by the vnode tests.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use vnode::node::NodeAdvert;
use vnode::pods::PodControllerConfig;
use vnode::{CrashHook, Metrics, Provider, Runner};

/// Generous: the machine is shared and loaded.
pub const DEADLINE: Duration = Duration::from_secs(60);

pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// A runner in a task; dropping (or [`Running::crash`]) aborts it at once, like kill -9.
pub struct Running {
    pub metrics: Arc<Metrics>,
    pub cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    pub async fn crash(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }

    pub async fn stop(mut self) {
        self.cancel.cancel();
        let _ = tokio::time::timeout(DEADLINE, &mut self.task).await;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub fn start_runner(
    client: kube::Client,
    provider: Arc<dyn Provider>,
    crash: Option<CrashHook>,
    cfg: PodControllerConfig,
) -> Running {
    let metrics = Arc::new(Metrics::default());
    let runner = Runner::new(
        client,
        provider,
        NodeAdvert {
            pod_ip: Some("127.0.0.1".into()),
            kubelet_port: 10250,
        },
        metrics.clone(),
        cfg,
        crash,
    );
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    let task = tokio::spawn(async move {
        let _ = runner.run(c).await;
    });
    Running {
        metrics,
        cancel,
        task,
    }
}

/// The API double, a memory provider `mem` polled every 200 ms, its runner with the
/// default pod controller, and the pods of `default`: the setup most tests share.
pub struct MemoryRig {
    pub server: testkube::ApiServer,
    pub client: kube::Client,
    pub provider: vnode::providers::memory::MemoryProvider,
    pub running: Running,
    pub pods: Api<Pod>,
}

pub async fn memory_rig() -> anyhow::Result<MemoryRig> {
    init_logs();
    let server = testkube::ApiServer::start().await?;
    let client = server.client();
    let provider = vnode::providers::memory::MemoryProvider::new("mem", Duration::from_millis(200));
    let running = start_runner(
        client.clone(),
        Arc::new(provider.clone()),
        None,
        PodControllerConfig::default(),
    );
    let pods = Api::namespaced(client.clone(), "default");
    Ok(MemoryRig {
        server,
        client,
        provider,
        running,
        pods,
    })
}

/// A pod bound to `node` running `command`.
pub fn pod(name: &str, node: &str, command: &[&str]) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "main", "image": "busybox", "command": command}],
        },
    }))
    .expect("a valid pod")
}

pub async fn create(api: &Api<Pod>, pod: &Pod) -> anyhow::Result<Pod> {
    api.create(&PostParams::default(), pod)
        .await
        .context("creating the pod")
}

pub async fn delete(api: &Api<Pod>, name: &str, grace: Option<u32>) -> anyhow::Result<()> {
    let dp = DeleteParams {
        grace_period_seconds: grace,
        ..DeleteParams::default()
    };
    api.delete(name, &dp).await.context("deleting the pod")?;
    Ok(())
}

/// Polls `check` until it answers `Some`, or fails naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut last_err = None;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if tokio::time::Instant::now() > deadline {
            bail!("timed out waiting for {what} (last error: {last_err:?})");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn phase(p: &Pod) -> Option<&str> {
    p.status.as_ref()?.phase.as_deref()
}

pub fn annotation<'a>(p: &'a Pod, key: &str) -> Option<&'a str> {
    p.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// Waits until pod `name` is Running with its instance-id annotation; returns the pod.
pub async fn wait_running(api: &Api<Pod>, name: &str) -> anyhow::Result<Pod> {
    wait_for(&format!("pod {name} Running"), || async {
        let p = api.get_opt(name).await?;
        Ok(p.filter(|p| {
            phase(p) == Some("Running")
                && annotation(p, ::common::keys::INSTANCE_ID_ANNOTATION).is_some()
        }))
    })
    .await
}

/// Waits until pod `name` is gone.
pub async fn wait_gone(api: &Api<Pod>, name: &str) -> anyhow::Result<()> {
    wait_for(&format!("pod {name} gone"), || async {
        Ok(api.get_opt(name).await?.is_none().then_some(()))
    })
    .await
}

/// A crash hook that, the first time `point` is reached, reports it and never returns.
pub fn crash_once_at(point: vnode::CrashPoint) -> (CrashHook, tokio::sync::watch::Receiver<bool>) {
    let (tx, rx) = tokio::sync::watch::channel(false);
    let tx = Arc::new(tx);
    let hook: CrashHook = Arc::new(move |p| {
        let tx = tx.clone();
        Box::pin(async move {
            if p == point && !*tx.borrow() {
                let _ = tx.send(true);
                std::future::pending::<()>().await;
            }
        })
    });
    (hook, rx)
}
