//! End to end: kubelets reachable only through tunnels, made reachable by the nodeaddr
//! reconciler, proven with real `kubectl logs`.
//!
//! 20 nodes, each with a stub kubelet on its own port and a real socat tunnel listening
//! where the worker's tunnel would publish it: the node's loopback address and derived
//! port, both as printed by the real `outpost-agent tunnel-config --format ssh`. The API
//! double proxies `kubectl logs` with ExternalIP preferred. The real
//! `stratum-server nodes reconcile` patches the Nodes; `nodes diagnostics` reports.
//! Two of the names deliberately derive one port.

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::{
    Container, DaemonEndpoint, Node, NodeAddress, NodeDaemonEndpoints, NodeStatus, Pod, PodSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use testkube::ApiServer;
use testkube::kubelet::StubKubelet;

const NODES: usize = 20;
const NAMESPACE: &str = "default";

/// A child process killed when the test ends, however it ends.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn require(bin: &str, package: &str) -> PathBuf {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {bin}"))
        .output()
        .expect("sh");
    if !out.status.success() {
        panic!("{bin} not found on PATH: apt-get install {package}");
    }
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// The workspace binaries this test runs, located by `e2e::binary`.
fn binaries() -> HashMap<String, PathBuf> {
    ["stratum-server", "outpost-agent"]
        .into_iter()
        .map(|name| (name.to_string(), e2e::binary(name)))
        .collect()
}

/// `127.a.b.c` and the port from `ssh ... -R 127.a.b.c:P:127.0.0.1:P ...`.
fn parse_ssh_forward(cmd: &str) -> anyhow::Result<(Ipv4Addr, u16)> {
    let spec = cmd
        .split_whitespace()
        .skip_while(|w| *w != "-R")
        .nth(1)
        .with_context(|| format!("no -R in {cmd:?}"))?;
    let parts: Vec<&str> = spec.split(':').collect();
    if parts.len() != 4 || parts[1] != parts[3] || parts[2] != "127.0.0.1" {
        bail!("unexpected forward spec {spec:?}");
    }
    Ok((parts[0].parse()?, parts[1].parse()?))
}

fn kubelet_node(name: &str, i: usize) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        status: Some(NodeStatus {
            addresses: Some(vec![
                NodeAddress {
                    type_: "InternalIP".into(),
                    // TEST-NET-1: what the worker sees of itself, unreachable from here.
                    address: format!("192.0.2.{}", i + 1),
                },
                NodeAddress {
                    type_: "Hostname".into(),
                    address: name.into(),
                },
            ]),
            daemon_endpoints: Some(NodeDaemonEndpoints {
                kubelet_endpoint: Some(DaemonEndpoint { port: 10250 }),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn pod(name: &str, node: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NAMESPACE.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            containers: vec![Container {
                name: "app".into(),
                image: Some("registry.example/app:1".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

struct LogResult {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Runs `kubectl logs` for every pod at once (each is a separate real kubectl).
async fn kubectl_logs_all(kubeconfig: &Path, pods: &[String]) -> Vec<LogResult> {
    let tasks: Vec<_> = pods
        .iter()
        .map(|p| {
            let mut cmd = tokio::process::Command::new("kubectl");
            cmd.arg("--kubeconfig")
                .arg(kubeconfig)
                .args([
                    "--request-timeout=20s",
                    "logs",
                    "-n",
                    NAMESPACE,
                    p,
                    "-c",
                    "app",
                ])
                .stdin(Stdio::null());
            tokio::spawn(async move { cmd.output().await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        let o = t.await.unwrap().expect("kubectl runs");
        out.push(LogResult {
            ok: o.status.success(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        });
    }
    out
}

async fn wait_listening(addr: SocketAddr) {
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("tunnel listener {addr} did not come up");
}

/// Two names, in the style of the others, that derive the same kubelet port.
fn colliding_pair() -> (String, String) {
    let mut seen: HashMap<u16, String> = HashMap::new();
    for i in 0.. {
        let name = format!("edge-{i}");
        if let Some(other) = seen.insert(nodeaddr::kubelet_port_for_node(&name), name.clone()) {
            return (other, name);
        }
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_logs_reach_every_kubelet_through_its_tunnel() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let started = std::time::Instant::now();
    let phase = |what: &str| eprintln!("[{:>6.1}s] {what}", started.elapsed().as_secs_f64());
    require("socat", "socat");
    require("kubectl", "kubectl (1.32 ships with the machine image)");
    let bins = binaries();
    let stratum = bins["stratum-server"].clone();
    let outpost = bins["outpost-agent"].clone();

    phase("binaries built");
    let (a, b) = colliding_pair();
    let mut names: Vec<String> = (1..=NODES - 2).map(|i| format!("worker-{i:02}")).collect();
    names.push(a.clone());
    names.push(b.clone());

    // The worker half, with the real binary: port and loopback per node.
    let mut routes: BTreeMap<String, (Ipv4Addr, u16)> = BTreeMap::new();
    for n in &names {
        let out = Command::new(&outpost)
            .args([
                "tunnel-config",
                "--node-name",
                n,
                "--server",
                "127.0.0.1:22",
                "--format",
                "ssh",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let route = parse_ssh_forward(&String::from_utf8(out.stdout).unwrap()).unwrap();
        let port = Command::new(&outpost)
            .args(["kubelet-port", "--node-name", n])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8(port.stdout).unwrap().trim(),
            route.1.to_string(),
            "kubelet-port and tunnel-config agree for {n}"
        );
        routes.insert(n.clone(), route);
    }
    assert_eq!(routes[&a].1, routes[&b].1, "the pair shares a port");
    let distinct: std::collections::HashSet<_> = routes.values().map(|r| r.0).collect();
    assert_eq!(
        distinct.len(),
        NODES,
        "every node has its own loopback address"
    );

    phase("routes derived by outpost-agent");
    // A stub kubelet per node on its own port, and a tunnel on the node's route.
    let mut kubelets: BTreeMap<String, StubKubelet> = BTreeMap::new();
    let mut tunnels = Vec::new();
    for n in &names {
        let k = StubKubelet::builder()
            .name(n.clone())
            .start("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let (ip, port) = routes[n];
        let child = Command::new("socat")
            .arg(format!("TCP-LISTEN:{port},bind={ip},fork,reuseaddr"))
            .arg(format!("TCP:127.0.0.1:{}", k.addr().port()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn socat");
        tunnels.push(Reaped(child));
        wait_listening(SocketAddr::from((ip, port))).await;
        kubelets.insert(n.clone(), k);
    }

    phase("kubelets and tunnels up");
    let server = ApiServer::builder()
        .preferred_address_types(vec![
            "ExternalIP".into(),
            "InternalIP".into(),
            "Hostname".into(),
        ])
        .start()
        .await
        .unwrap();
    let kubeconfig = server.kubeconfig_path().to_path_buf();
    let nodes: Api<Node> = Api::all(server.client());
    let pods_api: Api<Pod> = Api::namespaced(server.client(), NAMESPACE);
    let mut pods = Vec::new();
    for (i, n) in names.iter().enumerate() {
        nodes
            .create(&PostParams::default(), &kubelet_node(n, i))
            .await
            .unwrap();
        let p = format!("app-{n}");
        pods_api
            .create(&PostParams::default(), &pod(&p, n))
            .await
            .unwrap();
        pods.push(p);
    }

    phase("nodes and pods created");
    // Before the reconciler: the API server dials what the kubelets report (192.0.2.x),
    // which the double refuses to dial at all, and every `kubectl logs` fails.
    for (p, r) in pods.iter().zip(kubectl_logs_all(&kubeconfig, &pods).await) {
        assert!(!r.ok, "{p}: logs before reconciling: {}", r.stdout);
        assert!(r.stderr.contains("192.0.2."), "{p}: {}", r.stderr);
        assert!(r.stderr.contains("not dialed"), "{p}: {}", r.stderr);
    }
    for (n, k) in &kubelets {
        assert!(
            k.requests().is_empty(),
            "{n} was reached before reconciling"
        );
    }

    phase("logs failed before reconciling");
    // The real reconciler.
    let status_file = tempfile_path("nodeaddr-status.json");
    let reconcile = Reaped(
        Command::new(&stratum)
            .args(["nodes", "reconcile", "--interval", "30s", "--kubeconfig"])
            .arg(&kubeconfig)
            .arg("--status-file")
            .arg(&status_file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let expected: HashMap<String, String> = routes
        .iter()
        .map(|(n, (ip, _))| (n.clone(), ip.to_string()))
        .collect();
    wait_until("every node patched", Duration::from_secs(30), || async {
        let Ok(list) = nodes.list(&Default::default()).await else {
            return false;
        };
        list.items.iter().all(|n| {
            let name = n.metadata.name.as_deref().unwrap_or_default();
            nodeaddr::first_external_ip(n) == expected.get(name).map(String::as_str)
                && nodeaddr::observed_kubelet_port(n) == Some(routes[name].1)
        })
    })
    .await;

    phase("every node patched");
    // After: every node's logs come from that node's kubelet, the colliding pair included.
    for ((p, n), r) in pods
        .iter()
        .zip(&names)
        .zip(kubectl_logs_all(&kubeconfig, &pods).await)
    {
        assert!(r.ok, "{p} on {n}: {}", r.stderr);
        assert_eq!(
            r.stdout,
            kubelets[n].default_log(NAMESPACE, p, "app"),
            "{p} on {n}"
        );
    }
    for (n, k) in &kubelets {
        let reqs = k.requests();
        let own = format!("/containerLogs/{NAMESPACE}/app-{n}/app");
        assert!(
            !reqs.is_empty(),
            "{n} never reached ({} connections); all: {:?}",
            k.connections(),
            kubelets
                .iter()
                .map(|(n, k)| (n.as_str(), k.requests()))
                .collect::<Vec<_>>()
        );
        assert!(
            reqs.iter().all(|r| r.starts_with(&own)),
            "{n}'s kubelet served another node's request: {reqs:?}"
        );
    }

    phase("logs through tunnels");
    // A kubelet status write drops node 1's ExternalIP; the running reconciler restores
    // it from the watch and its logs work again.
    let victim = &names[0];
    let mut n = nodes.get(victim).await.unwrap();
    n.status.as_mut().unwrap().addresses = kubelet_node(victim, 0).status.unwrap().addresses;
    nodes
        .replace_status(victim, &PostParams::default(), &n)
        .await
        .unwrap();
    wait_until("victim repaired", Duration::from_secs(15), || async {
        let n = nodes.get(victim).await.unwrap();
        nodeaddr::first_external_ip(&n) == Some(expected[victim].as_str())
    })
    .await;
    let again = kubectl_logs_all(&kubeconfig, std::slice::from_ref(&pods[0])).await;
    assert!(again[0].ok, "{}", again[0].stderr);

    phase("repair after a kubelet status write");
    // Diagnostics, from the real binary: the pair is flagged, exit 3.
    let out = Command::new(&stratum)
        .args(["nodes", "diagnostics", "-o", "json", "--kubeconfig"])
        .arg(&kubeconfig)
        .arg("--status-file")
        .arg(&status_file)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = doc["nodes"].as_array().unwrap();
    assert_eq!(rows.len(), NODES);
    let listed: Vec<&str> = rows
        .iter()
        .map(|r| r["node_name"].as_str().unwrap())
        .collect();
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(listed, sorted, "rows sorted by node name");
    for r in rows {
        let name = r["node_name"].as_str().unwrap();
        assert_eq!(r["patched"], true, "{r}");
        let coll: Vec<&str> = r["port_collides_with"]
            .as_array()
            .map(|v| v.iter().map(|x| x.as_str().unwrap()).collect())
            .unwrap_or_default();
        if name == a {
            assert_eq!(coll, [b.as_str()]);
        } else if name == b {
            assert_eq!(coll, [a.as_str()]);
        } else {
            assert!(coll.is_empty(), "{r}");
        }
    }
    assert_eq!(doc["reconciler"]["started"], true, "{doc}");
    assert_eq!(doc["reconciler"]["consecutive_failures"], 0, "{doc}");
    let table = Command::new(&stratum)
        .args(["nodes", "diagnostics", "--kubeconfig"])
        .arg(&kubeconfig)
        .output()
        .unwrap();
    assert_eq!(table.status.code(), Some(3));
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(text.contains(&format!("PORT COLLIDES with {b}")), "{text}");

    // The reconciler stops cleanly on SIGTERM and said it had started.
    let mut reconcile = reconcile;
    let pid = reconcile.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = wait_exit(&mut reconcile.0, Duration::from_secs(10));
    assert!(status.success(), "reconcile exited with {status}");
    let mut stderr = String::new();
    std::io::Read::read_to_string(reconcile.0.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(
        stderr.contains("node address reconciler started"),
        "{stderr}"
    );

    drop(tunnels);
    for (_, k) in kubelets {
        k.shutdown().await;
    }
    // Keep the kubeconfig: the server's copy goes with it.
    let kept = tempfile_path("nodeaddr-kubeconfig");
    std::fs::copy(&kubeconfig, &kept).unwrap();
    server.shutdown().await;

    // With the API server gone, diagnostics cannot ask: exit 1, saying so.
    let gone = Command::new(&stratum)
        .args(["nodes", "diagnostics", "--kubeconfig"])
        .arg(&kept)
        .output()
        .unwrap();
    assert_eq!(gone.status.code(), Some(1));
    let err = String::from_utf8_lossy(&gone.stderr);
    assert!(err.contains("cannot read Nodes"), "{err}");
    let _ = std::fs::remove_file(&kept);
    let _ = std::fs::remove_file(&status_file);
}

fn tempfile_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("{}-{name}", std::process::id()))
}

fn wait_exit(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "process did not exit within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
