//! List and watch throughput of the API double over HTTPS with a real kube::Client,
//! against a baseline measured in the same run: serializing the same objects with
//! serde_json in-process and parsing them back into k8s-openapi types (the floor any
//! JSON API server and client pair pays). Prints figures and ratios; asserts nothing.
//!
//! `cargo xtask bench testkube` (or `cargo bench -p testkube --bench testkube`).

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

const NODES: usize = 5000;
const ROUNDS: u32 = 5;

fn node(i: usize) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": format!("node-{i:05}"), "labels": {"kubernetes.io/hostname": format!("node-{i:05}"),
            "node-role.kubernetes.io/worker": ""}},
        "spec": {"podCIDR": "10.244.0.0/24"},
        "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": format!("node-{i:05}")}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}],
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"kubeletVersion": "v1.33.0", "osImage": "Debian", "architecture": "amd64",
                "bootID": "", "containerRuntimeVersion": "containerd://1.7", "kernelVersion": "6.1",
                "kubeProxyVersion": "", "machineID": "", "operatingSystem": "linux", "systemUUID": ""}}
    }))
    .unwrap()
}

fn per_sec(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let server = testkube::ApiServer::start()
        .await
        .expect("start the API double");
    let nodes: Api<Node> = Api::all(server.client());

    let t = Instant::now();
    for i in 0..NODES {
        nodes
            .create(&PostParams::default(), &node(i))
            .await
            .unwrap();
    }
    let create = t.elapsed();

    // Baseline: the same list body serialized and parsed in-process.
    let list = nodes.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), NODES);
    let t = Instant::now();
    for _ in 0..ROUNDS {
        let body = serde_json::to_vec(&list).unwrap();
        let back: kube::core::ObjectList<Node> = serde_json::from_slice(&body).unwrap();
        assert_eq!(back.items.len(), NODES);
    }
    let baseline = t.elapsed() / ROUNDS;

    let t = Instant::now();
    for _ in 0..ROUNDS {
        let l = nodes.list(&ListParams::default()).await.unwrap();
        assert_eq!(l.items.len(), NODES);
    }
    let list_time = t.elapsed() / ROUNDS;

    let t = Instant::now();
    for _ in 0..ROUNDS {
        let mut stream = nodes
            .watch(&WatchParams::default(), "0")
            .await
            .unwrap()
            .boxed();
        let mut n = 0;
        while n < NODES {
            if let WatchEvent::Added(_) = stream.try_next().await.unwrap().unwrap() {
                n += 1;
            }
        }
    }
    let watch_time = t.elapsed() / ROUNDS;

    println!("testkube list/watch of {NODES} nodes over HTTPS with kube::Client ({ROUNDS} rounds)");
    println!(
        "  create (sequential)   {:>10.0} objects/s",
        per_sec(NODES, create)
    );
    println!(
        "  baseline serde only   {:>10.0} objects/s  ({:?} per {NODES})",
        per_sec(NODES, baseline),
        baseline
    );
    println!(
        "  list                  {:>10.0} objects/s  ({:?} per list)  {:.2}x the baseline's time",
        per_sec(NODES, list_time),
        list_time,
        list_time.as_secs_f64() / baseline.as_secs_f64()
    );
    println!(
        "  watch (initial state) {:>10.0} events/s   ({:?} per watch) {:.2}x the baseline's time",
        per_sec(NODES, watch_time),
        watch_time,
        watch_time.as_secs_f64() / baseline.as_secs_f64()
    );
    server.shutdown().await;
}
