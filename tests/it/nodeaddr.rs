//! End to end: kubelets reachable only through real `ssh -R` tunnels, made reachable by
//! the nodeaddr reconciler, proven with real `kubectl logs`.
//!
//! A real `sshd` on loopback (`GatewayPorts clientspecified`); for each of 20 nodes a stub
//! kubelet on 127.0.0.1 at the node's derived port and, as its tunnel, exactly the command
//! the real `outpost-agent tunnel-config --format ssh --kubeconfig ...` prints, run with
//! `sh -c`. The API double proxies `kubectl logs` with ExternalIP preferred. The real
//! `stratum-server nodes reconcile` patches the Nodes; `nodes diagnostics` reports, and
//! reads the reconciler's liveness from its admin listener. Two of the names derive one
//! port: all the nodes share this one host, so only one of the pair can have a kubelet on
//! 127.0.0.1 at that port; the other has no tunnel, and its logs must fail without its
//! pair's kubelet ever seeing its request.

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec};
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

pub(crate) fn require(bin: &str, package: &str) -> PathBuf {
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
    let octet = u8::try_from(i + 1).expect("fewer than 255 nodes");
    testkube::fixtures::kubelet_node(name, octet)
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

/// Waits for a listener (sshd, or a forward an ssh session opened) with a deadline generous
/// enough for 20 ssh logins on a loaded 2-core machine.
async fn wait_listening(addr: SocketAddr) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::time::Instant::now() < deadline {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("listener {addr} did not come up within 60 s");
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

/// A real sshd on 127.0.0.1 with a generated host key and one authorized client key,
/// killed on drop.
struct Sshd {
    _dir: tempfile::TempDir,
    port: u16,
    client_key: PathBuf,
    known_hosts: PathBuf,
    _process: Reaped,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn keygen(path: &Path) {
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .output()
        .expect("ssh-keygen runs (apt-get install openssh-client)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Sshd {
    async fn start() -> Sshd {
        let sshd = require("sshd", "openssh-server");
        require("ssh", "openssh-client");
        require("ssh-keygen", "openssh-client");
        // sshd refuses to start without its privilege-separation directory, which the
        // package's service unit normally creates.
        std::fs::create_dir_all("/run/sshd").expect("create /run/sshd for sshd");
        let dir = tempfile::tempdir().unwrap();
        let host_key = dir.path().join("host_key");
        let client_key = dir.path().join("client_key");
        keygen(&host_key);
        keygen(&client_key);
        let authorized = dir.path().join("authorized_keys");
        std::fs::copy(client_key.with_extension("pub"), &authorized).unwrap();
        let port = free_port();
        let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
        let cfg = dir.path().join("sshd_config");
        std::fs::write(
            &cfg,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {hk}\nPidFile none\n\
                 AuthorizedKeysFile {ak}\nStrictModes no\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nPubkeyAuthentication yes\n\
                 PermitRootLogin prohibit-password\nAllowUsers {user}\nUsePAM no\n\
                 AllowTcpForwarding remote\nGatewayPorts clientspecified\nX11Forwarding no\n\
                 PermitTTY no\nMaxStartups 100:30:200\nMaxSessions 100\n",
                hk = host_key.display(),
                ak = authorized.display(),
            ),
        )
        .unwrap();
        let process = Reaped(
            Command::new(&sshd)
                .arg("-D")
                .arg("-e")
                .arg("-f")
                .arg(&cfg)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn sshd"),
        );
        let known_hosts = dir.path().join("known_hosts");
        let host_pub = std::fs::read_to_string(host_key.with_extension("pub")).unwrap();
        std::fs::write(&known_hosts, format!("[127.0.0.1]:{port} {host_pub}")).unwrap();
        wait_listening(SocketAddr::from(([127, 0, 0, 1], port))).await;
        Sshd {
            _dir: dir,
            port,
            client_key,
            known_hosts,
            _process: process,
        }
    }
}

/// The real `outpost-agent tunnel-config --format ssh` for `node`, reading the Nodes.
fn tunnel_command(outpost: &Path, sshd: &Sshd, kubeconfig: &Path, node: &str) -> (String, String) {
    let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
    let out = Command::new(outpost)
        .args([
            "tunnel-config",
            "--format",
            "ssh",
            "--node-name",
            node,
            "--ssh-user",
            &user,
        ])
        .arg("--server")
        .arg(format!("127.0.0.1:{}", sshd.port))
        .arg("--identity-file")
        .arg(&sshd.client_key)
        .arg("--known-hosts")
        .arg(&sshd.known_hosts)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn run_stratum(stratum: &Path, args: &[&str], kubeconfig: &Path) -> std::process::Output {
    Command::new(stratum)
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .unwrap()
}

fn collisions(row: &serde_json::Value) -> Vec<String> {
    row["collides_with"]
        .as_array()
        .map(|v| v.iter().map(|x| x.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_logs_reach_every_kubelet_through_its_ssh_tunnel() {
    testkube::fixtures::install_crypto();
    let started = std::time::Instant::now();
    let phase = |what: &str| eprintln!("[{:>6.1}s] {what}", started.elapsed().as_secs_f64());
    require("kubectl", "kubectl (1.32 ships with the machine image)");
    let bins = binaries();
    let stratum = bins["stratum-server"].clone();
    let outpost = bins["outpost-agent"].clone();
    let sshd = Sshd::start().await;
    phase("sshd up");

    let (a, b) = colliding_pair();
    let mut names: Vec<String> = (1..=NODES - 2).map(|i| format!("worker-{i:02}")).collect();
    names.push(a.clone());
    names.push(b.clone());

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

    // The worker half, with the real binary: the exact ssh command per node. The nodes are
    // registered but not patched yet, so the address is the reconciler's plan.
    let mut commands: BTreeMap<String, String> = BTreeMap::new();
    let mut routes: BTreeMap<String, (Ipv4Addr, u16)> = BTreeMap::new();
    for n in &names {
        let (cmd, note) = tunnel_command(&outpost, &sshd, &kubeconfig, n);
        assert!(
            note.contains("not published on the node yet"),
            "{n}: {note}"
        );
        let route = parse_ssh_forward(&cmd).unwrap();
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
        commands.insert(n.clone(), cmd);
    }
    assert_eq!(routes[&a].1, routes[&b].1, "the pair shares a port");
    let distinct: std::collections::HashSet<_> = routes.values().map(|r| r.0).collect();
    assert_eq!(
        distinct.len(),
        NODES,
        "every node has its own loopback address"
    );

    // A stub kubelet per node on 127.0.0.1 at its derived port (the pair's second member
    // has none: this host has one 127.0.0.1), and the printed ssh command as its tunnel.
    let mut kubelets: BTreeMap<String, StubKubelet> = BTreeMap::new();
    let mut tunnels: BTreeMap<String, Reaped> = BTreeMap::new();
    for n in names.iter().filter(|n| **n != b) {
        let (ip, port) = routes[n];
        let k = StubKubelet::builder()
            .name(n.clone())
            .start(SocketAddr::from(([127, 0, 0, 1], port)))
            .await
            .unwrap_or_else(|e| panic!("stub kubelet for {n} on 127.0.0.1:{port}: {e:#}"));
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!("exec {}", commands[n].trim()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ssh");
        tunnels.insert(n.clone(), Reaped(child));
        kubelets.insert(n.clone(), k);
        let _ = ip;
    }
    for n in tunnels.keys() {
        let (ip, port) = routes[n];
        wait_listening(SocketAddr::from((ip, port))).await;
    }
    phase("kubelets and ssh tunnels up");

    // Before the reconciler: the API server dials what the kubelets report (192.0.2.x),
    // which the double refuses to dial at all, and every `kubectl logs` fails.
    for (p, r) in pods.iter().zip(kubectl_logs_all(&kubeconfig, &pods).await) {
        assert!(!r.ok, "{p}: logs before reconciling: {}", r.stdout);
        assert!(r.stderr.contains("192.0.2."), "{p}: {}", r.stderr);
    }
    for (n, k) in &kubelets {
        assert!(
            k.requests().is_empty(),
            "{n} was reached before reconciling"
        );
    }
    phase("logs failed before reconciling");

    // The real reconciler, with its admin listener.
    let admin_port = free_port();
    let admin = format!("http://127.0.0.1:{admin_port}");
    let reconcile = Reaped(
        Command::new(&stratum)
            .args(["nodes", "reconcile", "--interval", "30s", "--tunnel", "ssh"])
            .arg("--admin-listen")
            .arg(format!("127.0.0.1:{admin_port}"))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    wait_until("every node patched", Duration::from_secs(60), || async {
        let Ok(list) = nodes.list(&Default::default()).await else {
            return false;
        };
        list.items.iter().all(|n| {
            let name = n.metadata.name.as_deref().unwrap_or_default();
            nodeaddr::first_external_ip(n) == Some(routes[name].0.to_string().as_str())
                && nodeaddr::observed_kubelet_port(n) == Some(routes[name].1)
        })
    })
    .await;
    phase("every node patched");

    // After: every tunnelled node's logs come from that node's kubelet. The pair's second
    // member has no tunnel: its logs fail, and its pair's kubelet (same port, other
    // address) never sees its request.
    let results = kubectl_logs_all(&kubeconfig, &pods).await;
    for ((p, n), r) in pods.iter().zip(&names).zip(&results) {
        if *n == b {
            assert!(!r.ok, "{p} on {n} has no tunnel: {}", r.stdout);
            continue;
        }
        assert!(r.ok, "{p} on {n}: {}", r.stderr);
        assert_eq!(
            r.stdout,
            kubelets[n].default_log(NAMESPACE, p, "app"),
            "{p} on {n}"
        );
    }
    for (n, k) in &kubelets {
        let own = format!("/containerLogs/{NAMESPACE}/app-{n}/app");
        let reqs = k.requests();
        assert!(!reqs.is_empty(), "{n} never reached");
        assert!(
            reqs.iter().all(|r| r.starts_with(&own)),
            "{n}'s kubelet served another node's request: {reqs:?}"
        );
    }
    phase("logs through ssh tunnels");

    // The worker now reads the address the reconciler published on its own Node.
    for n in &names {
        let (cmd, note) = tunnel_command(&outpost, &sshd, &kubeconfig, n);
        assert!(note.contains("published on the node"), "{n}: {note}");
        assert_eq!(
            cmd, commands[n],
            "{n}: the published address is the planned one"
        );
    }

    // Stop one node's tunnel: its logs fail, and no other kubelet ever serves them.
    let stopped = names[4].clone();
    drop(tunnels.remove(&stopped));
    let (ip, port) = routes[&stopped];
    wait_until(
        "the stopped tunnel's listener is gone",
        Duration::from_secs(15),
        || async move { tokio::net::TcpStream::connect((ip, port)).await.is_err() },
    )
    .await;
    let before: BTreeMap<String, usize> = kubelets
        .iter()
        .map(|(n, k)| (n.clone(), k.requests().len()))
        .collect();
    let pod = format!("app-{stopped}");
    let r = kubectl_logs_all(&kubeconfig, std::slice::from_ref(&pod)).await;
    assert!(
        !r[0].ok,
        "logs of {stopped} with its tunnel stopped: {}",
        r[0].stdout
    );
    for (n, k) in &kubelets {
        assert_eq!(
            k.requests().len(),
            before[n],
            "{n} served a request for {stopped}"
        );
    }
    phase("a stopped tunnel fails only its own logs");

    // A kubelet status write drops node 1's ExternalIP; the running reconciler restores
    // it from its watch, and its logs work again.
    let victim = &names[0];
    let mut n = nodes.get(victim).await.unwrap();
    n.status.as_mut().unwrap().addresses = kubelet_node(victim, 0).status.unwrap().addresses;
    nodes
        .replace_status(victim, &PostParams::default(), &n)
        .await
        .unwrap();
    let want = routes[victim].0.to_string();
    wait_until("victim repaired", Duration::from_secs(15), || async {
        let n = nodes.get(victim).await.unwrap();
        nodeaddr::first_external_ip(&n) == Some(want.as_str())
    })
    .await;
    let again = kubectl_logs_all(&kubeconfig, std::slice::from_ref(&pods[0])).await;
    assert!(again[0].ok, "{}", again[0].stderr);
    phase("repair after a kubelet status write");

    // Diagnostics, from the real binary. Behind frpc the pair collides (exit 3); behind
    // ssh nothing collides and every node is patched (exit 0) ...
    let out = run_stratum(
        &stratum,
        &[
            "nodes",
            "diagnostics",
            "-o",
            "json",
            "--tunnel",
            "frpc",
            "--admin",
            &admin,
        ],
        &kubeconfig,
    );
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
        if name == a {
            assert_eq!(collisions(r), [b.as_str()]);
        } else if name == b {
            assert_eq!(collisions(r), [a.as_str()]);
        } else {
            assert!(collisions(r).is_empty(), "{r}");
        }
    }
    // ... and the liveness comes from the reconciler's admin listener.
    assert_eq!(doc["reconciler"]["started"], true, "{doc}");
    assert_eq!(doc["reconciler"]["leader"], true, "{doc}");
    assert_eq!(doc["reconciler"]["consecutive_failures"], 0, "{doc}");
    assert_eq!(doc["reconciler"]["nodes"]["ok"], NODES, "{doc}");

    let out = run_stratum(
        &stratum,
        &["nodes", "diagnostics", "--tunnel", "ssh"],
        &kubeconfig,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(!text.contains("COLLIDES"), "{text}");
    let out = run_stratum(
        &stratum,
        &["nodes", "diagnostics", "--tunnel", "frpc"],
        &kubeconfig,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(text.contains(&format!("COLLIDES with {b}")), "{text}");

    // --require-tunnel: the node without a tunnel and the stopped one are "tunnel down".
    let out = run_stratum(
        &stratum,
        &[
            "nodes",
            "diagnostics",
            "-o",
            "json",
            "--tunnel",
            "ssh",
            "--require-tunnel",
        ],
        &kubeconfig,
    );
    assert_eq!(out.status.code(), Some(3));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let down: Vec<&str> = doc["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["state"] == "tunnel-down")
        .map(|r| r["node_name"].as_str().unwrap())
        .collect();
    let mut want_down = vec![b.as_str(), stopped.as_str()];
    want_down.sort();
    assert_eq!(down, want_down);

    // Prometheus text on the admin listener.
    let metrics = http_get(&format!("{admin}/metrics")).await;
    for needle in [
        "nodeaddr_passes_total",
        "nodeaddr_writes_total",
        "nodeaddr_nodes{state=\"ok\"} 20",
        "nodeaddr_leader 1",
    ] {
        assert!(metrics.contains(needle), "{needle} missing:\n{metrics}");
    }
    phase("diagnostics");

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

    // --once: one pass over a settled cluster, nothing to write; exit 0 behind ssh, 3 when
    // a tunnel is required and two are down.
    let out = run_stratum(
        &stratum,
        &["nodes", "reconcile", "--once", "--tunnel", "ssh"],
        &kubeconfig,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("writes=0"), "{text}");
    let out = run_stratum(
        &stratum,
        &[
            "nodes",
            "reconcile",
            "--once",
            "--tunnel",
            "ssh",
            "--require-tunnel",
        ],
        &kubeconfig,
    );
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("tunnel-down=2"));

    drop(tunnels);
    for (_, k) in kubelets {
        k.shutdown().await;
    }
    // Keep the kubeconfig: the server's copy goes with it.
    let kept = tempfile_path("nodeaddr-kubeconfig");
    std::fs::copy(&kubeconfig, &kept).unwrap();
    server.shutdown().await;

    // With the API server gone, neither command can ask: exit 1, saying so.
    let gone = run_stratum(&stratum, &["nodes", "diagnostics"], &kept);
    assert_eq!(gone.status.code(), Some(1));
    let err = String::from_utf8_lossy(&gone.stderr);
    assert!(err.contains("cannot read Nodes"), "{err}");
    let gone = run_stratum(&stratum, &["nodes", "reconcile", "--once"], &kept);
    assert_eq!(gone.status.code(), Some(1));
    let err = String::from_utf8_lossy(&gone.stderr);
    assert!(err.contains("could not list nodes"), "{err}");
    let _ = std::fs::remove_file(&kept);
}

/// GET over plain HTTP/1.0 on loopback (the admin listener), the body as text; panics on
/// a connection failure or a non-200 answer.
async fn http_get(url: &str) -> String {
    match try_http_get(url).await {
        Ok(body) => body,
        Err(e) => panic!("GET {url}: {e:#}"),
    }
}

async fn try_http_get(url: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let rest = url.strip_prefix("http://").context("an http:// URL")?;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut stream = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect(authority),
    )
    .await??;
    stream
        .write_all(format!("GET /{path} HTTP/1.0\r\nHost: {authority}\r\n\r\n").as_bytes())
        .await?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut raw)).await??;
    let text = String::from_utf8(raw)?;
    let (head, body) = text.split_once("\r\n\r\n").context("no end of headers")?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        bail!("answered {}", head.lines().next().unwrap_or_default());
    }
    Ok(body.to_string())
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

use testkube::fixtures::eventually_within as wait_until;

fn spawn_reconciler(stratum: &Path, kubeconfig: &Path, identity: &str, admin_port: u16) -> Reaped {
    Reaped(
        Command::new(stratum)
            .args([
                "nodes",
                "reconcile",
                "--interval",
                "1s",
                "--identity",
                identity,
            ])
            .args([
                "--lease-duration",
                "4s",
                "--lease-renew-deadline",
                "3s",
                "--lease-retry",
                "500ms",
            ])
            .arg("--admin-listen")
            .arg(format!("127.0.0.1:{admin_port}"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    )
}

async fn admin_status(port: u16) -> Option<serde_json::Value> {
    let body = try_http_get(&format!("http://127.0.0.1:{port}/status"))
        .await
        .ok()?;
    serde_json::from_str(&body).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_reconciler_writes_and_a_standby_takes_over_from_a_killed_holder() {
    testkube::fixtures::install_crypto();
    let stratum = e2e::binary("stratum-server");
    let server = ApiServer::start().await.unwrap();
    let kubeconfig = server.kubeconfig_path().to_path_buf();
    let nodes: Api<Node> = Api::all(server.client());
    let names: Vec<String> = (1..=5).map(|i| format!("worker-{i}")).collect();
    for (i, n) in names.iter().enumerate() {
        nodes
            .create(&PostParams::default(), &kubelet_node(n, i))
            .await
            .unwrap();
    }
    let ports = [free_port(), free_port()];
    let mut procs: BTreeMap<&str, Reaped> = BTreeMap::new();
    procs.insert(
        "one",
        spawn_reconciler(&stratum, &kubeconfig, "one", ports[0]),
    );
    procs.insert(
        "two",
        spawn_reconciler(&stratum, &kubeconfig, "two", ports[1]),
    );
    let port_of = |id: &str| if id == "one" { ports[0] } else { ports[1] };

    let patched = |names: Vec<String>| {
        let nodes = nodes.clone();
        async move {
            let Ok(list) = nodes.list(&Default::default()).await else {
                return false;
            };
            list.items.len() == names.len()
                && list.items.iter().all(|n| {
                    let name = n.metadata.name.as_deref().unwrap_or_default();
                    nodeaddr::first_external_ip(n)
                        == Some(nodeaddr::loopback_candidate(name).to_string().as_str())
                })
        }
    };
    wait_until("every node patched", Duration::from_secs(60), || {
        patched(names.clone())
    })
    .await;

    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(server.client(), "kube-system");
    let holder = || async {
        leases
            .get("nodeaddr-reconciler")
            .await
            .ok()
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty())
    };
    let first = holder().await.expect("the lease has a holder");
    let standby = if first == "one" { "two" } else { "one" };
    // Exactly one leader, and it is the Lease's holder; the standby wrote nothing.
    wait_until(
        "both report their role",
        Duration::from_secs(30),
        || async {
            let a = admin_status(port_of(&first)).await;
            let b = admin_status(port_of(standby)).await;
            matches!((a, b), (Some(a), Some(b)) if a["leader"] == true && b["leader"] == false
            && b["nodes"]["ok"] == 5)
        },
    )
    .await;
    let metrics = http_get(&format!("http://127.0.0.1:{}/metrics", port_of(standby))).await;
    assert!(metrics.contains("nodeaddr_writes_total 0"), "{metrics}");
    assert!(metrics.contains("nodeaddr_lease_leader 0"), "{metrics}");

    // SIGKILL the holder: no release, the standby must wait the Lease out.
    drop(procs.remove(first.as_str()));
    wait_until(
        "the standby took the lease",
        Duration::from_secs(60),
        || async {
            holder().await.as_deref() == Some(standby)
                && admin_status(port_of(standby))
                    .await
                    .is_some_and(|s| s["leader"] == true)
        },
    )
    .await;
    // It writes now: a kubelet status write is repaired.
    let victim = &names[0];
    let mut n = nodes.get(victim).await.unwrap();
    n.status.as_mut().unwrap().addresses = kubelet_node(victim, 0).status.unwrap().addresses;
    nodes
        .replace_status(victim, &PostParams::default(), &n)
        .await
        .unwrap();
    wait_until(
        "repaired by the new leader",
        Duration::from_secs(30),
        || patched(names.clone()),
    )
    .await;
    let metrics = http_get(&format!("http://127.0.0.1:{}/metrics", port_of(standby))).await;
    assert!(!metrics.contains("nodeaddr_writes_total 0"), "{metrics}");
    assert!(metrics.contains("nodeaddr_lease_leader 1"), "{metrics}");

    // A clean stop releases the Lease.
    let mut last = procs.remove(standby).unwrap();
    let pid = last.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = wait_exit(&mut last.0, Duration::from_secs(15));
    assert!(status.success(), "reconcile exited with {status}");
    assert_eq!(holder().await, None, "the lease was released");
    server.shutdown().await;
}
