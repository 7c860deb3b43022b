//! `cargo xtask bench nodeaddr`: the address reconciler against the API double with 5,000
//! nodes.
//!
//! Prints the first pass (patches every node) and the second (must write nothing), and the
//! event-to-repair latency under `run` (a kubelet-style status write drops a node's
//! ExternalIP; time until the reconciler's write restoring it is visible on a watch). The
//! baseline, measured in the same run against the same server, is a plain LIST of the
//! 5,000 nodes: a pass can hardly be cheaper than the list it starts with.

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeDaemonEndpoints, NodeStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher;
use nodeaddr::{Reconciler, first_external_ip, plan};
use testkube::ApiServer;
use tokio_util::sync::CancellationToken;

const NODES: usize = 5_000;
const REPAIRS: usize = 40;
const BASELINE_LISTS: usize = 5;

fn node(i: usize) -> Node {
    let name = format!("bench-node-{i:05}");
    Node {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        status: Some(NodeStatus {
            addresses: Some(kubelet_addresses(&name, i)),
            daemon_endpoints: Some(NodeDaemonEndpoints {
                kubelet_endpoint: Some(DaemonEndpoint { port: 10250 }),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn kubelet_addresses(name: &str, i: usize) -> Vec<NodeAddress> {
    vec![
        NodeAddress {
            type_: "InternalIP".into(),
            address: format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256),
        },
        NodeAddress {
            type_: "Hostname".into(),
            address: name.into(),
        },
    ]
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let server = ApiServer::start().await?;
    let api: Api<Node> = Api::all(server.client());

    let t = Instant::now();
    futures::stream::iter(0..NODES)
        .map(|i| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &node(i)).await }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    println!("setup: created {NODES} nodes in {:.0} ms", ms(t.elapsed()));

    // Baseline: a plain list, median of a few.
    let mut lists = Vec::new();
    for _ in 0..BASELINE_LISTS {
        let t = Instant::now();
        let l = api.list(&ListParams::default()).await?;
        lists.push(t.elapsed());
        assert_eq!(l.items.len(), NODES);
    }
    lists.sort();
    let list = lists[lists.len() / 2];
    // The pure part alone, over the listed nodes.
    let items = api.list(&ListParams::default()).await?.items;
    let t = Instant::now();
    let rows = plan(&items, &nodeaddr::derived_kubelet_port);
    let plan_time = t.elapsed();
    let colliding = rows
        .iter()
        .filter(|r| !r.port_collides_with.is_empty())
        .count();

    let r = Reconciler::new(server.client());
    server.clear_requests();
    let t = Instant::now();
    let first = r.once().await?;
    let first_time = t.elapsed();
    let first_writes = server.requests().iter().filter(|q| q.is_write()).count();
    assert_eq!(first.writes, NODES);
    assert_eq!(first_writes, NODES);

    server.clear_requests();
    let t = Instant::now();
    let second = r.once().await?;
    let second_time = t.elapsed();
    let second_writes = server.requests().iter().filter(|q| q.is_write()).count();
    assert_eq!((second.writes, second_writes), (0, 0), "steady state wrote");

    // Event-to-repair latency under run(): no resync, only the watch.
    let mut rr = r.clone();
    rr.interval = Duration::from_secs(3600);
    let cancel = CancellationToken::new();
    let runner = tokio::spawn({
        let cancel = cancel.clone();
        async move { rr.run(cancel, nodeaddr::always_leader()).await }
    });
    // Let run's initial pass (nothing to write) and its watcher's initial list settle.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let expected: std::collections::HashMap<String, String> = rows
        .iter()
        .map(|r| {
            (
                r.node_name.clone(),
                r.expected_external_ip.unwrap().to_string(),
            )
        })
        .collect();
    let mut observer = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
    // Drain the observer's own initial list.
    while let Some(ev) = observer.try_next().await? {
        if matches!(ev, watcher::Event::InitDone) {
            break;
        }
    }
    let mut latencies = Vec::new();
    for k in 0..REPAIRS {
        let i = (k * 127) % NODES;
        let name = format!("bench-node-{i:05}");
        let mut n = api.get(&name).await?;
        n.status.as_mut().unwrap().addresses = Some(kubelet_addresses(&name, i));
        let t = Instant::now();
        api.replace_status(&name, &PostParams::default(), &n)
            .await?;
        loop {
            let ev = tokio::time::timeout(Duration::from_secs(30), observer.try_next())
                .await
                .map_err(|_| anyhow::anyhow!("no repair of {name} within 30 s"))??;
            if let Some(watcher::Event::Apply(n)) = ev
                && n.metadata.name.as_deref() == Some(name.as_str())
                && first_external_ip(&n) == Some(expected[&name].as_str())
            {
                latencies.push(t.elapsed());
                break;
            }
        }
        // Let the echo pass (our repair's own event) finish before the next drop.
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    cancel.cancel();
    runner.await?;
    latencies.sort();
    let p50 = percentile(&latencies, 0.50);
    let p99 = percentile(&latencies, 0.99);

    println!("nodeaddr reconciler, {NODES} nodes, API double over HTTPS on loopback");
    println!(
        "  baseline: plain LIST of {NODES} nodes      {:>9.1} ms (median of {BASELINE_LISTS})",
        ms(list)
    );
    println!(
        "  plan (pure, {NODES} nodes)                 {:>9.1} ms   {:>6.2}x list   ({colliding} nodes in port collisions)",
        ms(plan_time),
        ms(plan_time) / ms(list)
    );
    println!(
        "  first pass: {:>5} writes                 {:>9.1} ms   {:>6.2}x list",
        first_writes,
        ms(first_time),
        ms(first_time) / ms(list)
    );
    println!(
        "  second pass: {:>4} writes                 {:>9.1} ms   {:>6.2}x list",
        second_writes,
        ms(second_time),
        ms(second_time) / ms(list)
    );
    println!(
        "  event-to-repair ({REPAIRS} drops, watch only): p50 {:.1} ms ({:.2}x list), p99 {:.1} ms ({:.2}x list), of which debounce {} ms",
        ms(p50),
        ms(p50) / ms(list),
        ms(p99),
        ms(p99) / ms(list),
        nodeaddr::DEBOUNCE.as_millis()
    );
    server.shutdown().await;
    Ok(())
}
