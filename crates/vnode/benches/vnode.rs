//! `cargo xtask bench vnode`: the in-memory provider against the API double, 1,000 and
//! 10,000 pods on one virtual node.
//!
//! - Time until every pod is Running, against the API double's own write throughput
//!   measured in the same run (how long the same number of writes takes when a plain
//!   client issues them with the same concurrency): the ratio is the manager's overhead.
//! - Pod writes during a steady state after that (goal: zero).
//! - Resident memory per tracked pod (goal: under 4 KiB): the manager runs in a child
//!   process (this binary re-executed), so the API double's memory is not counted; the
//!   child's figure includes the in-memory provider's own instance records.
//!
//! `VNODE_BENCH_STEADY_SECS` shortens the 60-second steady state for a quick look;
//! `VNODE_BENCH_SIZES` (comma-separated) changes the sizes; `VNODE_BENCH_EVENTS=0` runs
//! the manager without Kubernetes Events; `VNODE_BENCH_SECRETS=0` with a provider that
//! issues no connect credentials (no connect Secrets).

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use vnode::node::NodeAdvert;
use vnode::pods::PodControllerConfig;
use vnode::providers::memory::MemoryProvider;
use vnode::{Metrics, Runner};

const CHILD_ENV: &str = "VNODE_BENCH_CHILD_KUBECONFIG";
const CONCURRENCY: usize = 32;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The manager side: a runner with the in-memory provider; answers `rss` on stdin.
fn child(kubeconfig: &str) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
        let client = Client::try_from(config)?;
        let mut provider = MemoryProvider::new("mem", Duration::from_secs(1));
        // VNODE_BENCH_SECRETS=0: no connect credentials, so no connect Secrets (one
        // read and one write less per pod).
        if std::env::var("VNODE_BENCH_SECRETS").is_ok_and(|v| v == "0") {
            provider = provider.without_credentials();
        }
        let runner = Runner::new(
            client,
            Arc::new(provider),
            NodeAdvert {
                pod_ip: Some("127.0.0.1".into()),
                kubelet_port: 10250,
            },
            Arc::new(Metrics::default()),
            PodControllerConfig {
                // VNODE_BENCH_EVENTS=0 measures without the Events recorder (its cache of
                // recent events is part of the per-pod memory).
                events: std::env::var("VNODE_BENCH_EVENTS").map_or(true, |v| v != "0"),
                ..PodControllerConfig::default()
            },
            None,
        );
        let cancel = CancellationToken::new();
        let c = cancel.clone();
        let task = tokio::spawn(async move { runner.run(c).await });
        println!("ready");
        let mut lines =
            tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(tokio::io::stdin()));
        while let Some(line) = lines.next_line().await? {
            match line.trim() {
                "rss" => println!("{}", rss_kib()),
                _ => break,
            }
        }
        cancel.cancel();
        let _ = task.await;
        Ok(())
    })
}

fn pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "x", "command": ["x"]}]},
    }))
    .expect("a valid pod")
}

async fn namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    Ok(())
}

/// The double's own write throughput: `n` pod creates and `n` status patches by a plain
/// client with the manager's concurrency. Writes per second.
async fn baseline(client: &Client, n: usize) -> anyhow::Result<f64> {
    namespace(client, "baseline").await?;
    let api: Api<Pod> = Api::namespaced(client.clone(), "baseline");
    let start = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let name = format!("b{i}");
                api.create(&PostParams::default(), &pod(&name, "elsewhere"))
                    .await?;
                let patch = json!({"status": {"phase": "Running"}});
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                Ok::<(), kube::Error>(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok((2 * n) as f64 / start.elapsed().as_secs_f64())
}

struct Child {
    proc: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Child {
    fn ask_rss(&mut self) -> anyhow::Result<u64> {
        let stdin = self.proc.stdin.as_mut().context("child stdin")?;
        writeln!(stdin, "rss")?;
        let mut line = String::new();
        self.out.read_line(&mut line)?;
        Ok(line.trim().parse()?)
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.proc.kill();
        let _ = self.proc.wait();
    }
}

async fn run(n: usize, steady: Duration) -> anyhow::Result<()> {
    let server = testkube::ApiServer::builder()
        .event_window(8 * n + 10_000)
        .start()
        .await?;
    let client = server.client();
    let write_rate = baseline(&client, n).await?;

    let mut proc = Command::new(std::env::current_exe()?)
        .env(CHILD_ENV, server.kubeconfig_path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut out = BufReader::new(proc.stdout.take().context("child stdout")?);
    let mut line = String::new();
    out.read_line(&mut line)?;
    if line.trim() != "ready" {
        bail!("the manager child did not start: {line:?}");
    }
    let mut child = Child { proc, out };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss0 = child.ask_rss()?;

    namespace(&client, "bench").await?;
    let api: Api<Pod> = Api::namespaced(client.clone(), "bench");
    // Watch for Running before creating anything, so no transition is missed.
    let running = Arc::new(tokio::sync::Mutex::new(HashSet::new()));
    let (done_tx, mut done_rx) = tokio::sync::watch::channel(false);
    {
        let api = api.clone();
        let running = running.clone();
        tokio::spawn(async move {
            let mut s =
                std::pin::pin!(watcher::watcher(api, watcher::Config::default()).default_backoff());
            while let Some(Ok(ev)) = s.next().await {
                if let watcher::Event::Apply(p) | watcher::Event::InitApply(p) = ev
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                {
                    let mut r = running.lock().await;
                    r.insert(p.metadata.name.clone().unwrap_or_default());
                    if r.len() >= n {
                        let _ = done_tx.send(true);
                    }
                }
            }
        });
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.clear_requests();
    let start = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &pod(&format!("p{i}"), "nebula-mem"))
                    .await
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<_>>()
        .await?;
    tokio::time::timeout(Duration::from_secs(1800), done_rx.wait_for(|d| *d)).await??;
    let to_running = start.elapsed();
    let writes = server.requests().iter().filter(|r| r.is_write()).count();
    let lower_bound = writes as f64 / write_rate;

    tokio::time::sleep(Duration::from_secs(3)).await;
    server.clear_requests();
    tokio::time::sleep(steady).await;
    let steady_pod_writes = server
        .requests()
        .iter()
        .filter(|r| r.is_write() && r.resource == "pods")
        .count();
    let rss1 = child.ask_rss()?;
    let per_pod = (rss1.saturating_sub(rss0)) as f64 * 1024.0 / n as f64;
    println!(
        "vnode n={n}: all Running in {:.2}s; {writes} writes (creates included); the double absorbs them in {:.2}s at {:.0} writes/s -> ratio {:.2}x",
        to_running.as_secs_f64(),
        lower_bound,
        write_rate,
        to_running.as_secs_f64() / lower_bound
    );
    println!(
        "vnode n={n}: pod writes in a {}s steady state: {steady_pod_writes} (goal 0); RSS {rss0} KiB -> {rss1} KiB = {per_pod:.0} bytes per tracked pod (goal < 4096)",
        steady.as_secs()
    );
    drop(child);
    server.shutdown().await;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    if let Ok(kc) = std::env::var(CHILD_ENV) {
        return child(&kc);
    }
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let steady = Duration::from_secs(
        std::env::var("VNODE_BENCH_STEADY_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(60),
    );
    let sizes: Vec<usize> = std::env::var("VNODE_BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|v| v.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1_000, 10_000]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    for n in sizes {
        rt.block_on(run(n, steady))?;
    }
    Ok(())
}
