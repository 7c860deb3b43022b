//! `cargo xtask sandbox --kubeconfig F`: the workers, the node-address reconciler and
//! nebula-manager against a real cluster's API server instead of the API double.
//!
//! The workers live in network namespaces, so they reach the API server through a relay:
//! inside each namespace a `socat` listens on the API server's own address and port (so
//! the server certificate's names still match), and forwards to a `socat` on the sandbox
//! bridge that dials the real address from the host. Everything the sandbox creates in
//! the cluster (its Nodes and their Leases, its bootstrap tokens, discovery objects and
//! the reconciler's Lease when they were not there before) is deleted when it stops.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail, ensure};

use super::net::{HOST_IP, Net};
use super::procs::Procs;
use super::{kubectl, output, write};

/// The host end of the workers' relay to the API server, on the sandbox bridge.
const RELAY_PORT: u16 = 16443;

/// Objects the sandbox's parts create when absent, outside its Nodes: the discovery
/// objects `stratum-server token create` ensures and the reconciler's leader Lease
/// (namespace, kind, name). Those absent at the start are removed at the end.
const ENSURED: [(&str, &str, &str); 4] = [
    ("kube-public", "configmap", "cluster-info"),
    (
        "kube-public",
        "role",
        "kubeadm:bootstrap-signer-clusterinfo",
    ),
    (
        "kube-public",
        "rolebinding",
        "kubeadm:bootstrap-signer-clusterinfo",
    ),
    ("kube-system", "lease", "nodeaddr-reconciler"),
];

/// The cluster the sandbox was pointed at.
pub struct Cluster {
    pub kubeconfig: PathBuf,
    /// The API server's address, as its kubeconfig names it.
    pub server: SocketAddrV4,
    /// A directory holding the cluster's CA as `ca.crt`: the `--pki-dir` of worker
    /// `token create` (the CA pin is its hash).
    pub ca_dir: PathBuf,
    /// [`ENSURED`] objects absent before the sandbox started: removed when it stops.
    created: Vec<(&'static str, &'static str, &'static str)>,
    /// Bootstrap token ids the sandbox created.
    pub token_ids: Vec<String>,
}

fn exists(kubeconfig: &Path, ns: Option<&str>, kind: &str, name: &str) -> anyhow::Result<bool> {
    let mut cmd = kubectl(kubeconfig);
    if let Some(ns) = ns {
        cmd.args(["-n", ns]);
    }
    cmd.args(["get", kind, name, "--ignore-not-found", "-o", "name"]);
    Ok(!output(cmd)?.trim().is_empty())
}

/// Reads the current context's server and CA, and refuses a cluster the sandbox could
/// harm: one that already has a Node named like the sandbox's.
pub fn inspect(kubeconfig: &Path, dir: &Path, nodes: &[String]) -> anyhow::Result<Cluster> {
    let kubeconfig = std::fs::canonicalize(kubeconfig)
        .with_context(|| format!("--kubeconfig {}", kubeconfig.display()))?;
    let mut view = kubectl(&kubeconfig);
    view.args([
        "config",
        "view",
        "--raw",
        "--minify",
        "--flatten",
        "-o",
        "json",
    ]);
    let v: serde_json::Value =
        serde_json::from_str(&output(view)?).context("kubectl config view printed no JSON")?;
    let cluster = &v["clusters"][0]["cluster"];
    let url = cluster["server"]
        .as_str()
        .context("the kubeconfig's current context names no server")?;
    let hostport = url
        .strip_prefix("https://")
        .with_context(|| format!("the server {url} is not https://"))?
        .trim_end_matches('/');
    let server: SocketAddrV4 = match hostport.parse() {
        Ok(a) => a,
        Err(_) => match hostport.parse::<Ipv4Addr>() {
            Ok(ip) => SocketAddrV4::new(ip, 443),
            Err(_) => bail!(
                "the server {url} is not an IPv4 address: the workers reach it through an \
                 address relay; use a kubeconfig whose server is https://IPv4:PORT"
            ),
        },
    };
    use base64::Engine as _;
    let ca = cluster["certificate-authority-data"].as_str().context(
        "the kubeconfig carries no certificate-authority-data (the workers pin the cluster CA)",
    )?;
    let ca = base64::engine::general_purpose::STANDARD
        .decode(ca)
        .context("certificate-authority-data is not base64")?;
    let ca_dir = dir.join("cluster-ca");
    std::fs::create_dir_all(&ca_dir)?;
    write(&ca_dir.join("ca.crt"), &String::from_utf8_lossy(&ca))?;
    for n in nodes {
        ensure!(
            !exists(&kubeconfig, None, "node", n)?,
            "the cluster already has a node named {n}: the sandbox would take it over; \
             use a cluster without it"
        );
    }
    let mut created = Vec::new();
    for (ns, kind, name) in ENSURED {
        if !exists(&kubeconfig, Some(ns), kind, name)? {
            created.push((ns, kind, name));
        }
    }
    Ok(Cluster {
        kubeconfig,
        server,
        ca_dir,
        created,
        token_ids: Vec::new(),
    })
}

fn socat() -> anyhow::Result<PathBuf> {
    let out = Command::new("sh")
        .args(["-c", "command -v socat"])
        .output()
        .context("running sh")?;
    ensure!(
        out.status.success(),
        "socat is not on PATH: apt-get install socat"
    );
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Starts the relay: the host end on the bridge, and in each worker namespace a listener
/// on the server's own address.
pub fn relay(cluster: &Cluster, workers: u8, procs: &mut Procs) -> anyhow::Result<()> {
    let socat = socat()?;
    let mut host = Command::new(&socat);
    host.arg(format!(
        "TCP-LISTEN:{RELAY_PORT},bind={HOST_IP},reuseaddr,fork"
    ))
    .arg(format!("TCP:{}", cluster.server));
    procs.spawn("relay-host", host)?;
    let ip = *cluster.server.ip();
    for i in 1..=workers {
        let ns = super::net::netns(i);
        // 127.0.0.0/8 is local on the namespace's lo already.
        if !ip.is_loopback() {
            let mut add = Command::new("ip");
            add.args(["-n", &ns, "addr", "add", &format!("{ip}/32"), "dev", "lo"]);
            output(add)?;
        }
        let mut inner = Net::exec(i, &socat);
        inner
            .arg(format!(
                "TCP-LISTEN:{},bind={ip},reuseaddr,fork",
                cluster.server.port()
            ))
            .arg(format!("TCP:{HOST_IP}:{RELAY_PORT}"));
        procs.spawn(&format!("relay-w{i}"), inner)?;
    }
    // Both ends listen before a worker dials.
    std::thread::sleep(Duration::from_millis(300));
    procs.check_all()
}

/// Deletes what the sandbox made in the cluster; failures are printed, not fatal, so the
/// rest is still removed.
pub fn cleanup(cluster: &Cluster, nodes: &[String]) {
    let run = |what: String, mut cmd: Command| {
        if let Err(e) = output({
            cmd.arg("--ignore-not-found");
            cmd
        }) {
            eprintln!("sandbox: removing {what} from the cluster: {e:#}");
        }
    };
    let mut del = kubectl(&cluster.kubeconfig);
    del.args(["delete", "node"]).args(nodes);
    run(format!("the nodes {}", nodes.join(" ")), del);
    // Their heartbeat Leases.
    let mut del = kubectl(&cluster.kubeconfig);
    del.args(["-n", "kube-node-lease", "delete", "lease"])
        .args(nodes);
    run("the nodes' Leases".into(), del);
    for id in &cluster.token_ids {
        let mut del = kubectl(&cluster.kubeconfig);
        del.args(["-n", "kube-system", "delete", "secret"])
            .arg(format!("bootstrap-token-{id}"));
        run(format!("bootstrap token {id}"), del);
    }
    for (ns, kind, name) in &cluster.created {
        let mut del = kubectl(&cluster.kubeconfig);
        del.args(["-n", ns, "delete", kind, name]);
        run(format!("{kind} {ns}/{name}"), del);
    }
}
