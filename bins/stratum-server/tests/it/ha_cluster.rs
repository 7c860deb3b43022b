//! A control plane that grows, as processes: `stratum-server up` bootstraps the first
//! controller against the API double, `token create --control-plane` mints joins, and
//! `stratum-server join` adds members as etcd learners that are promoted once caught up.
//! Real etcd 3.4 members (supervised by the binary), the API double over HTTPS, real
//! signals.

use std::io::{BufRead as _, BufReader};
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use ha::etcd::learner::linearizable_member_list;
use ha::etcd::{EtcdOptions, MemberInfo};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use testkube::ApiServer;

const DEADLINE: Duration = Duration::from_secs(120);

fn etcd_binary() -> anyhow::Result<PathBuf> {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("etcd"))
                .find(|p| p.is_file())
        })
        .context("etcd not found on PATH: apt-get install etcd-server")
}

/// A distinct 127.0.N.0/24 per test process and cluster, so parallel tests never share an
/// address.
fn cluster_octet() -> u8 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    ((std::process::id()
        .wrapping_mul(37)
        .wrapping_add(n.wrapping_mul(11)))
        % 250
        + 1) as u8
}

fn free_port(ip: Ipv4Addr) -> anyhow::Result<u16> {
    Ok(TcpListener::bind((ip, 0))?.local_addr()?.port())
}

/// One control-plane host: its own address, ports, data and PKI directories.
pub struct Node {
    pub name: String,
    pub ip: Ipv4Addr,
    pub root: PathBuf,
    pub client_url: String,
    /// The admin listener of its `up`/`join`.
    pub admin: String,
}

impl Node {
    pub fn data(&self) -> PathBuf {
        self.root.join("data")
    }
    pub fn pki(&self) -> PathBuf {
        self.root.join("kubernetes/pki")
    }
    pub fn config(&self) -> PathBuf {
        self.root.join("node.yaml")
    }
    fn flags(&self) -> Vec<String> {
        vec![
            "--node-name".into(),
            self.name.clone(),
            "--node-ip".into(),
            self.ip.to_string(),
            "--data-dir".into(),
            self.data().display().to_string(),
            "--pki-dir".into(),
            self.pki().display().to_string(),
            "--config".into(),
            self.config().display().to_string(),
        ]
    }
}

/// A running stratum-server; SIGTERM on drop (it stops its etcd in order), SIGKILL if it
/// does not exit.
pub struct Proc {
    pub child: Child,
    pub log: Arc<Mutex<String>>,
    pub what: String,
}

impl Proc {
    pub fn log(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig);
    }

    /// Waits for exit, failing after `DEADLINE` with the log.
    pub async fn wait(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        let start = tokio::time::Instant::now();
        loop {
            if let Some(st) = self.child.try_wait()? {
                return Ok(st);
            }
            if start.elapsed() > DEADLINE {
                bail!(
                    "{} did not exit within {DEADLINE:?}:\n{}",
                    self.what,
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the log contains `text`.
    pub async fn wait_log(&mut self, text: &str) -> anyhow::Result<()> {
        let start = tokio::time::Instant::now();
        loop {
            if self.log().contains(text) {
                return Ok(());
            }
            if let Some(st) = self.child.try_wait()? {
                bail!(
                    "{} exited ({st}) before logging {text:?}:\n{}",
                    self.what,
                    self.log()
                );
            }
            if start.elapsed() > DEADLINE {
                bail!("{} never logged {text:?}:\n{}", self.what, self.log());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        self.signal(nix::sys::signal::Signal::SIGTERM);
        for _ in 0..300 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn spawn(what: &str, args: &[String], env: &[(&str, &str)]) -> anyhow::Result<Proc> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stratum-server"));
    cmd.args(args)
        .env_remove("KUBECONFIG")
        .env_remove("STRATUM_CERTIFICATE_KEY")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().context("cannot run stratum-server")?;
    let log = Arc::new(Mutex::new(String::new()));
    for stream in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let log = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if let Ok(mut l) = log.lock() {
                    l.push_str(&line);
                    l.push('\n');
                }
            }
        });
    }
    Ok(Proc {
        child,
        log,
        what: what.to_string(),
    })
}

/// A test cluster: the API double, and the nodes planned so far.
pub struct Cluster {
    pub api: ApiServer,
    pub dir: tempfile::TempDir,
    pub octet: u8,
    pub nodes: Vec<Node>,
    etcd: PathBuf,
}

/// A minted control-plane join.
pub struct Join {
    pub token: String,
    pub key: String,
    pub pin: String,
}

impl Cluster {
    /// The first controller's shared PKI, and the API double serving as that cluster's API
    /// server (certificates from its CA, the bootstrap signer on).
    pub async fn new() -> anyhow::Result<Cluster> {
        let etcd = etcd_binary()?;
        let dir = tempfile::tempdir()?;
        let pki0 = dir.path().join("cp1/kubernetes/pki");
        pki::generate_shared(&pki0, false)?;
        let api = ApiServer::builder()
            .pki_dir(&pki0)
            .bootstrap_signer(true)
            .start()
            .await?;
        let mut c = Cluster {
            api,
            dir,
            octet: cluster_octet(),
            nodes: Vec::new(),
            etcd,
        };
        c.plan(None, "60s")?;
        Ok(c)
    }

    /// Plans node `cpN` with its own address and free ports; `etcd_binary` overrides the
    /// etcd binary (a join whose etcd never starts).
    pub fn plan(
        &mut self,
        etcd_binary: Option<&Path>,
        start_timeout: &str,
    ) -> anyhow::Result<usize> {
        let i = self.nodes.len();
        let ip = Ipv4Addr::new(127, 0, self.octet, 11 + i as u8);
        let (cp, pp) = (free_port(ip)?, free_port(ip)?);
        let name = format!("cp{}", i + 1);
        let root = self.dir.path().join(&name);
        std::fs::create_dir_all(&root)?;
        let admin = format!("127.0.0.1:{}", free_port(Ipv4Addr::LOCALHOST)?);
        let node = Node {
            name,
            ip,
            admin: admin.clone(),
            client_url: format!("https://{ip}:{cp}"),
            root,
        };
        let binary = etcd_binary.unwrap_or(&self.etcd);
        std::fs::write(
            node.config(),
            format!(
                "adminListen: {admin}\ndiscoveryTimeout: 10s\netcd:\n  binary: {}\n  clientPort: {cp}\n  peerPort: {pp}\n  startTimeout: {start_timeout}\n",
                binary.display()
            ),
        )?;
        self.nodes.push(node);
        Ok(i)
    }

    pub fn kubeconfig(&self) -> String {
        self.api.kubeconfig_path().display().to_string()
    }

    /// `up` on node `i`.
    pub fn up(&self, i: usize) -> anyhow::Result<Proc> {
        let mut args = vec!["up".to_string()];
        args.extend(self.nodes[i].flags());
        args.extend(["--kubeconfig".into(), self.kubeconfig()]);
        spawn(&format!("up {}", self.nodes[i].name), &args, &[])
    }

    /// Bootstraps node 0 and waits for its etcd and cluster-info.
    pub async fn bootstrap(&mut self) -> anyhow::Result<Proc> {
        let mut p = self.up(0)?;
        p.wait_log("bootstrap objects in place").await?;
        Ok(p)
    }

    /// `token create --control-plane` on node 0; the API double's bootstrap signer signs
    /// cluster-info for it.
    pub async fn mint(&self, ttl: &str) -> anyhow::Result<Join> {
        let n0 = &self.nodes[0];
        let out = Command::new(env!("CARGO_BIN_EXE_stratum-server"))
            .args([
                "token",
                "create",
                "--control-plane",
                "--ttl",
                ttl,
                "--kubeconfig",
                &self.kubeconfig(),
                "--pki-dir",
                &n0.pki().display().to_string(),
                "--etcd-endpoint",
                &n0.client_url,
                "-o",
                "json",
            ])
            .env_remove("KUBECONFIG")
            .output()?;
        ensure!(
            out.status.success(),
            "token create: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        Ok(Join {
            token: json["token"].as_str().context("token")?.to_string(),
            key: json["certificateKey"].as_str().context("key")?.to_string(),
            pin: json["caCertHash"].as_str().context("pin")?.to_string(),
        })
    }

    pub fn join_args(&self, i: usize, join: &Join, pin: &str) -> Vec<String> {
        let mut args = vec![
            "join".to_string(),
            "--server".into(),
            format!("127.0.0.1:{}", self.api.addr().port()),
            "--token".into(),
            join.token.clone(),
            "--discovery-token-ca-cert-hash".into(),
            pin.to_string(),
            "--control-plane".into(),
        ];
        // No --kubeconfig: after the join its own admin.conf (issued from the downloaded
        // CA) reaches the API double, which serves with that CA.
        args.extend(self.nodes[i].flags());
        args
    }

    /// `join` on node `i`, the certificate-key through the environment.
    pub fn join(&self, i: usize, join: &Join, extra: &[&str]) -> anyhow::Result<Proc> {
        let mut args = self.join_args(i, join, &join.pin);
        args.extend(extra.iter().map(|s| s.to_string()));
        spawn(
            &format!("join {}", self.nodes[i].name),
            &args,
            &[("STRATUM_CERTIFICATE_KEY", &join.key)],
        )
    }

    pub fn etcd_options(&self) -> EtcdOptions {
        let mut o = ha::join::etcd_options(&self.nodes[0].pki());
        o.connect_timeout = Duration::from_secs(2);
        o.request_timeout = Duration::from_secs(3);
        o
    }

    pub fn endpoints(&self, nodes: &[usize]) -> Vec<String> {
        nodes
            .iter()
            .map(|&i| self.nodes[i].client_url.clone())
            .collect()
    }

    pub async fn members(&self, via: &[usize]) -> anyhow::Result<Vec<MemberInfo>> {
        linearizable_member_list(&self.etcd_options(), &self.endpoints(via))
            .await
            .map(|(_, m)| m)
            .map_err(|e| anyhow::anyhow!(e))
    }

    /// Waits until every named node is a started, voting member.
    pub async fn wait_voters(
        &self,
        names: &[&str],
        via: &[usize],
        procs: &mut [&mut Proc],
    ) -> anyhow::Result<Vec<MemberInfo>> {
        let start = tokio::time::Instant::now();
        loop {
            if let Ok(members) = self.members(via).await {
                let ok = names.iter().all(|n| {
                    members
                        .iter()
                        .any(|m| m.name == *n && !m.is_learner && !m.client_urls.is_empty())
                });
                if ok {
                    return Ok(members);
                }
                if start.elapsed() > DEADLINE * 2 {
                    let logs: Vec<String> = procs
                        .iter()
                        .map(|p| format!("--- {}:\n{}", p.what, p.log()))
                        .collect();
                    bail!(
                        "members never became voters {names:?}: {members:?}\n{}",
                        logs.join("\n")
                    );
                }
            }
            for p in procs.iter_mut() {
                if let Some(st) = p.child.try_wait()? {
                    bail!("{} exited ({st}):\n{}", p.what, p.log());
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// `stratum-server etcd health` over `nodes`.
    pub fn health(&self, nodes: &[usize]) -> anyhow::Result<(bool, String)> {
        let pki = self.nodes[0].pki();
        let out = Command::new(env!("CARGO_BIN_EXE_stratum-server"))
            .args([
                "etcd",
                "health",
                "--endpoints",
                &self.endpoints(nodes).join(","),
                "--cacert",
                &pki.join("etcd/ca.crt").display().to_string(),
                "--cert",
                &pki.join("etcd/healthcheck-client.crt")
                    .display()
                    .to_string(),
                "--key",
                &pki.join("etcd/healthcheck-client.key")
                    .display()
                    .to_string(),
                "-o",
                "json",
            ])
            .output()?;
        Ok((
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ))
    }

    /// Polls `etcd health` over `nodes` until it passes.
    pub async fn wait_healthy(&self, nodes: &[usize]) -> anyhow::Result<serde_json::Value> {
        self.wait_healthy_with(nodes, None).await
    }

    /// Polls `etcd health` over `nodes` until it passes with a leader other than `not`.
    pub async fn wait_healthy_with(
        &self,
        nodes: &[usize],
        not: Option<&str>,
    ) -> anyhow::Result<serde_json::Value> {
        let start = tokio::time::Instant::now();
        loop {
            let (ok, out) = self.health(nodes)?;
            if ok {
                let json_end = out.rfind('}').map(|i| i + 1).unwrap_or(out.len());
                let json: serde_json::Value = serde_json::from_str(&out[..json_end])?;
                if not.is_none() || json["leader"].as_str() != not {
                    return Ok(json);
                }
            }
            if start.elapsed() > DEADLINE {
                bail!("etcd never healthy over {nodes:?}: {out}");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// Every file under `dir` (none when it does not exist).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(files_under(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn one_controller_grows_to_three_and_survives_losing_its_leader() -> anyhow::Result<()> {
    let mut c = Cluster::new().await?;
    let mut p1 = c.bootstrap().await?;
    let join = c.mint("1h").await?;

    c.plan(None, "60s")?;
    let mut p2 = c.join(1, &join, &[])?;
    c.wait_voters(&["cp1", "cp2"], &[0], &mut [&mut p1, &mut p2])
        .await?;
    c.plan(None, "60s")?;
    let mut p3 = c.join(2, &join, &[])?;
    let members = c
        .wait_voters(
            &["cp1", "cp2", "cp3"],
            &[0, 1],
            &mut [&mut p1, &mut p2, &mut p3],
        )
        .await?;
    assert_eq!(members.len(), 3, "{members:?}");

    // Each node's admin listener reports its supervised etcd.
    let metrics = http_get(&c.nodes[1].admin, "/metrics")?;
    assert!(
        metrics.contains("stratum_component_running{component=\"etcd\"} 1"),
        "{metrics}"
    );
    let status = http_get(&c.nodes[1].admin, "/status")?;
    assert!(status.contains("\"node\":\"cp2\""), "{status}");

    // Health over all three: one leader.
    let health = c.wait_healthy(&[0, 1, 2]).await?;
    let leader = health["leader"].as_str().context("leader")?.to_string();
    assert_eq!(health["members"].as_array().map(Vec::len), Some(3));

    // Each join recorded its member for the next joiner, and an Event.
    let cm: ConfigMap = Api::namespaced(c.api.client(), "kube-system")
        .get(ha::bootstrap::CONTROL_PLANE_CONFIGMAP)
        .await?;
    let recorded = ha::bootstrap::recorded_endpoints(Some(&cm));
    for n in &c.nodes {
        assert!(
            recorded.contains(&n.client_url),
            "{recorded:?} lacks {}",
            n.client_url
        );
    }
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(c.api.client());
    let start = tokio::time::Instant::now();
    loop {
        let joined: Vec<_> = events
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("ControlPlaneJoined"))
            .collect();
        if joined.len() >= 2 {
            break;
        }
        ensure!(start.elapsed() < DEADLINE, "no join Events: {joined:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // Kill the leader's node: the other two stay healthy.
    let leader_idx = members
        .iter()
        .find(|m| format!("{:x}", m.id) == leader)
        .and_then(|m| c.nodes.iter().position(|n| n.name == m.name))
        .context("leader not among the nodes")?;
    let mut procs = [p1, p2, p3];
    procs[leader_idx].signal(nix::sys::signal::Signal::SIGKILL);
    procs[leader_idx].wait().await?;
    // SIGKILL leaves the supervised etcd behind: kill it too, as a host crash would.
    kill_etcd_of(&c.nodes[leader_idx])?;
    let rest: Vec<usize> = (0..3).filter(|i| *i != leader_idx).collect();
    // `etcd health` checks every voting member of the member list, so it names the dead
    // one; the two survivors keep quorum and agree on a new, live leader.
    let dead = c.nodes[leader_idx].client_url.clone();
    let start = tokio::time::Instant::now();
    loop {
        let (ok, out) = c.health(&rest)?;
        assert!(!ok, "a dead voting member must fail health: {out}");
        let json_end = out.rfind('}').map(|i| i + 1).unwrap_or(out.len());
        let json: serde_json::Value = serde_json::from_str(&out[..json_end])?;
        let live: Vec<&serde_json::Value> = json["members"]
            .as_array()
            .context("members")?
            .iter()
            .filter(|m| m["endpoint"] != dead.as_str())
            .collect();
        let leaders: Vec<String> = live
            .iter()
            .map(|m| format!("{:x}", m["leader"].as_u64().unwrap_or(0)))
            .collect();
        let problems = json["problems"].as_array().context("problems")?;
        if live.len() == 2
            && leaders
                .iter()
                .all(|l| l != "0" && *l != leader && *l == leaders[0])
            && problems.iter().all(|p| p["endpoint"] == dead.as_str())
        {
            break;
        }
        ensure!(
            start.elapsed() < DEADLINE,
            "no new leader among the survivors: {out}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Once the dead member is removed, the two are a healthy cluster.
    let opts = ha::join::etcd_options(&c.nodes[rest[0]].pki());
    ha::etcd::member_remove(
        &opts,
        &c.endpoints(&rest),
        &members[leader_idx_member(&members, &c.nodes[leader_idx].name)?].peer_urls[0],
    )
    .await?;
    let health = c.wait_healthy(&rest).await?;
    assert_eq!(health["members"].as_array().map(Vec::len), Some(2));
    assert_ne!(health["leader"].as_str(), Some(leader.as_str()));
    Ok(())
}

fn leader_idx_member(members: &[MemberInfo], name: &str) -> anyhow::Result<usize> {
    members
        .iter()
        .position(|m| m.name == name)
        .context("member not listed")
}

/// SIGKILLs the etcd process serving `node` (found by its data directory in /proc).
pub(crate) fn kill_etcd_of(node: &Node) -> anyhow::Result<()> {
    let needle = format!("--data-dir={}", node.data().join("etcd").display());
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if cmdline.split(|b| *b == 0).any(|a| a == needle.as_bytes()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn three_controllers_joining_at_once_all_become_voters() -> anyhow::Result<()> {
    let mut c = Cluster::new().await?;
    let mut p1 = c.bootstrap().await?;
    let join = c.mint("1h").await?;
    for _ in 0..3 {
        c.plan(None, "60s")?;
    }
    let mut p2 = c.join(1, &join, &[])?;
    let mut p3 = c.join(2, &join, &[])?;
    let mut p4 = c.join(3, &join, &[])?;
    let members = c
        .wait_voters(
            &["cp1", "cp2", "cp3", "cp4"],
            &[0],
            &mut [&mut p1, &mut p2, &mut p3, &mut p4],
        )
        .await?;
    assert_eq!(members.len(), 4, "{members:?}");
    assert!(members.iter().all(|m| !m.is_learner));
    c.wait_healthy(&[0, 1, 2, 3]).await?;
    // At least one of them had to queue behind another learner or a reconfiguration:
    // refused with a typed refusal ("member add queued behind another join"), or, when
    // etcd was still applying the previous change, left unanswered and retried after the
    // member list was read again ("etcd add queued (... Timeout expired ...)").
    let queued = [&p2, &p3, &p4]
        .iter()
        .filter(|p| {
            let log = p.log();
            log.contains("member add queued") || log.contains("etcd add queued")
        })
        .count();
    assert!(
        queued >= 1,
        "no join queued:\n{}\n{}\n{}",
        p2.log(),
        p3.log(),
        p4.log()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_join_whose_etcd_never_starts_is_removed_and_up_explains() -> anyhow::Result<()> {
    let mut c = Cluster::new().await?;
    let p1 = c.bootstrap().await?;
    let join = c.mint("1h").await?;
    c.plan(Some(Path::new("/bin/false")), "10s")?;
    let mut p2 = c.join(1, &join, &[])?;
    let status = p2.wait().await?;
    let log = p2.log();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("did not start") && log.contains("was removed again"),
        "{log}"
    );
    // The member is gone; the first controller never lost quorum.
    let members = c.members(&[0]).await?;
    assert_eq!(members.len(), 1, "{members:?}");
    c.wait_healthy(&[0]).await?;
    // The journal survives and tells the next `up` what happened.
    let node = &c.nodes[1];
    assert!(ha::journal::join_intent_survives(&node.data())?);
    let mut up = c.up(1)?;
    let status = up.wait().await?;
    let log = up.log();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("refusing to bootstrap") && log.contains("was removed from etcd"),
        "{log}"
    );
    assert!(!ha::nodestate::node_state_path(&node.data()).exists());
    drop(p1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_pin_key_or_expired_token_is_refused_before_anything_is_written()
-> anyhow::Result<()> {
    let mut c = Cluster::new().await?;
    let _p1 = c.bootstrap().await?;
    let join = c.mint("1h").await?;
    let before = c.members(&[0]).await?;
    c.plan(None, "60s")?;
    let node_root = c.nodes[1].root.clone();
    let untouched = files_under(&node_root);

    // A pin of another CA.
    let other = pki::Ca::generate("other")?;
    let wrong_pin = pki::ca_cert_hash(other.cert_pem().as_bytes())?;
    let args = c.join_args(1, &join, &wrong_pin);
    let mut p = spawn(
        "join wrong pin",
        &args,
        &[("STRATUM_CERTIFICATE_KEY", &join.key)],
    )?;
    assert!(!p.wait().await?.success());
    assert!(p.log().contains("not the pinned"), "{}", p.log());

    // A certificate-key of another grant.
    let wrong_key = ha::grants::CertKey::generate().to_hex();
    let mut p = spawn(
        "join wrong key",
        &c.join_args(1, &join, &join.pin),
        &[("STRATUM_CERTIFICATE_KEY", &wrong_key)],
    )?;
    assert!(!p.wait().await?.success());
    assert!(p.log().contains("cannot be opened"), "{}", p.log());

    // A token that expired: the token cleaner deletes it and the bootstrap signer drops
    // its signature.
    let expired = c.mint("1s").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut p = spawn(
        "join expired token",
        &c.join_args(1, &expired, &expired.pin),
        &[("STRATUM_CERTIFICATE_KEY", &expired.key)],
    )?;
    assert!(!p.wait().await?.success());
    let log = p.log();
    assert!(
        log.contains("Unauthorized") || log.contains("401") || log.contains("no signature"),
        "{log}"
    );

    // A maintenance operation (a rekey) holds the fence: the join does not download under
    // it, and says who holds it.
    let admin = ha::grants::client_from_kubeconfig(Path::new(&c.kubeconfig())).await?;
    let fence = ha::fence::Fence::take(&admin, "rekey-in-progress").await?;
    let mut p = spawn(
        "join while fenced",
        &c.join_args(1, &join, &join.pin),
        &[("STRATUM_CERTIFICATE_KEY", &join.key)],
    )?;
    assert!(!p.wait().await?.success());
    let log = p.log();
    assert!(
        log.contains("maintenance fence") && log.contains("\"rekey-in-progress\""),
        "{log}"
    );
    fence.release().await?;

    // Nothing written, nothing added.
    assert_eq!(files_under(&node_root), untouched);
    assert_eq!(c.members(&[0]).await?, before);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_during_the_member_add_is_deferred_and_up_starts_the_member() -> anyhow::Result<()>
{
    let mut c = Cluster::new().await?;
    let mut p1 = c.bootstrap().await?;
    let join = c.mint("1h").await?;
    c.plan(None, "60s")?;
    // Another learner holds etcd's one learner slot, so the join's add queues.
    let blocker_url = format!(
        "https://127.0.{}.99:{}",
        c.octet,
        free_port(Ipv4Addr::new(127, 0, c.octet, 99))?
    );
    let blocker = add_blocking_learner(&c, &blocker_url).await?;
    let mut p2 = c.join(1, &join, &[])?;
    p2.wait_log("member add queued").await?;
    p2.signal(nix::sys::signal::Signal::SIGTERM);
    // Still running: the signal is deferred while the add is in flight.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(p2.child.try_wait()?.is_none(), "{}", p2.log());
    remove_member(&c, blocker).await?;
    let status = p2.wait().await?;
    assert_eq!(status.code(), Some(3), "{}", p2.log());
    assert!(p2.log().contains("node state is persisted"), "{}", p2.log());
    let state = ha::nodestate::NodeState::load(&c.nodes[1].data())?.context("no node state")?;
    assert!(state.etcd.learner);
    // `up` starts it: started, caught up, promoted.
    let mut up2 = c.up(1)?;
    c.wait_voters(&["cp1", "cp2"], &[0], &mut [&mut p1, &mut up2])
        .await?;
    assert!(!ha::journal::join_intent_survives(&c.nodes[1].data())?);
    Ok(())
}

async fn add_blocking_learner(c: &Cluster, peer_url: &str) -> anyhow::Result<u64> {
    // The first controller's etcd refuses adds for a few seconds after it starts.
    let start = tokio::time::Instant::now();
    loop {
        let client = connect(c).await?;
        let mut client = client;
        match client
            .member_add(
                vec![peer_url.to_string()],
                Some(etcd_client::MemberAddOptions::new().with_is_learner()),
            )
            .await
        {
            Ok(r) => return Ok(r.member().context("no member")?.id()),
            Err(e) if start.elapsed() < DEADLINE => {
                tracing::debug!("blocker add: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

async fn remove_member(c: &Cluster, id: u64) -> anyhow::Result<()> {
    let mut client = connect(c).await?;
    client.member_remove(id).await?;
    Ok(())
}

/// mTLS as the API server's etcd client, from the first node's PKI.
pub(crate) fn client_tls(c: &Cluster) -> anyhow::Result<etcd_client::TlsOptions> {
    let pki = c.nodes[0].pki();
    Ok(etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(std::fs::read(
            pki.join("etcd/ca.crt"),
        )?))
        .identity(etcd_client::Identity::from_pem(
            std::fs::read(pki.join("apiserver-etcd-client.crt"))?,
            std::fs::read(pki.join("apiserver-etcd-client.key"))?,
        )))
}

async fn connect(c: &Cluster) -> anyhow::Result<etcd_client::Client> {
    let tls = client_tls(c)?;
    Ok(etcd_client::Client::connect(
        [c.nodes[0].client_url.as_str()],
        Some(etcd_client::ConnectOptions::new().with_tls(tls)),
    )
    .await?)
}

#[tokio::test(flavor = "multi_thread")]
async fn operator_prunes_the_grants_of_expired_tokens_and_reports_the_key_age() -> anyhow::Result<()>
{
    let api = ApiServer::start().await?;
    let client = api.client();
    let pki = tempfile::tempdir()?;
    pki::generate_shared(pki.path(), false)?;
    let files = ha::grants::read_bundle_files(pki.path())?;
    // The live grant first: an upload drops the entries of expired tokens, so one made
    // after the short-lived token's (late, on a loaded machine) would prune it before the
    // operator. 3 s, not 1: its own upload must come before it expires.
    let mut entries = Vec::new();
    for ttl in [3600, 3] {
        let minted = ha::tokens::create_token(
            &client,
            ha::tokens::TokenRole::ControlPlane,
            Duration::from_secs(ttl),
            None,
            jiff::Timestamp::now(),
        )
        .await?;
        ha::grants::upload_certs(
            &client,
            &ha::grants::CertKey::generate(),
            &ha::grants::GrantOwner::from(&minted),
            &files,
            &ha::grants::UploadProfile::default(),
            ha::grants::no_confirm,
        )
        .await?;
        entries.push(ha::grants::grant_entry_name(minted.token.id()));
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let out = Command::new(env!("CARGO_BIN_EXE_stratum-server"))
        .args(["operator", "--once", "--kubeconfig"])
        .arg(api.kubeconfig_path())
        .env_remove("KUBECONFIG")
        .output()?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    // The expired token's grant, and the legacy entry its mint (the newest) sealed.
    let mut pruned: Vec<String> = serde_json::from_value(report["pruned"].clone())?;
    pruned.sort();
    assert_eq!(
        pruned,
        ["certs".to_string(), entries[1].clone()],
        "{report}"
    );
    assert!(
        report["key_age_seconds"].as_i64().is_some_and(|a| a >= 0),
        "{report}"
    );
    let secret: k8s_openapi::api::core::v1::Secret = Api::namespaced(client.clone(), "kube-system")
        .get(ha::grants::SECRET_NAME)
        .await?;
    let keys: Vec<String> = secret.data.unwrap_or_default().into_keys().collect();
    assert!(
        !keys.contains(&entries[1]) && keys.contains(&entries[0]),
        "{keys:?}"
    );

    // A second pass with nothing expired writes nothing.
    let rv = secret.metadata.resource_version;
    let out = Command::new(env!("CARGO_BIN_EXE_stratum-server"))
        .args(["operator", "--once", "--kubeconfig"])
        .arg(api.kubeconfig_path())
        .env_remove("KUBECONFIG")
        .output()?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again: k8s_openapi::api::core::v1::Secret = Api::namespaced(client, "kube-system")
        .get(ha::grants::SECRET_NAME)
        .await?;
    assert_eq!(again.metadata.resource_version, rv);
    Ok(())
}

fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_operator_holds_its_lease_prunes_as_leader_and_serves_metrics() -> anyhow::Result<()> {
    let api = ApiServer::start().await?;
    let client = api.client();
    let pki = tempfile::tempdir()?;
    pki::generate_shared(pki.path(), false)?;
    // A live grant keeps the Secret (garbage collection would remove it with its last
    // owning token otherwise). Published first: an upload drops the entries of expired
    // tokens, so one after the short-lived token's would race the operator to the prune.
    let live = ha::tokens::create_token(
        &client,
        ha::tokens::TokenRole::ControlPlane,
        Duration::from_secs(3600),
        None,
        jiff::Timestamp::now(),
    )
    .await?;
    ha::grants::upload_certs(
        &client,
        &ha::grants::CertKey::generate(),
        &ha::grants::GrantOwner::from(&live),
        &ha::grants::read_bundle_files(pki.path())?,
        &ha::grants::UploadProfile::default(),
        ha::grants::no_confirm,
    )
    .await?;
    // 3 s, not 1: its own upload must come before it expires, even on a loaded machine.
    let minted = ha::tokens::create_token(
        &client,
        ha::tokens::TokenRole::ControlPlane,
        Duration::from_secs(3),
        None,
        jiff::Timestamp::now(),
    )
    .await?;
    ha::grants::upload_certs(
        &client,
        &ha::grants::CertKey::generate(),
        &ha::grants::GrantOwner::from(&minted),
        &ha::grants::read_bundle_files(pki.path())?,
        &ha::grants::UploadProfile::default(),
        ha::grants::no_confirm,
    )
    .await?;
    let entry = ha::grants::grant_entry_name(minted.token.id());
    let kubeconfig = api.kubeconfig_path().display().to_string();
    let admin = |_: ()| -> anyhow::Result<String> {
        Ok(format!("127.0.0.1:{}", free_port(Ipv4Addr::LOCALHOST)?))
    };
    let (admin_a, admin_b) = (admin(())?, admin(())?);
    let op = |id: &str, addr: &str| {
        spawn(
            &format!("operator {id}"),
            &[
                "operator".into(),
                "--kubeconfig".into(),
                kubeconfig.clone(),
                "--interval".into(),
                "1s".into(),
                "--identity".into(),
                id.into(),
                "--admin-listen".into(),
                addr.into(),
            ],
            &[],
        )
    };
    let mut a = op("operator-a", &admin_a)?;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), "kube-system");
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), "kube-system");
    let start = tokio::time::Instant::now();
    loop {
        let holder = leases
            .get_opt(ha::operator::LEASE_NAME)
            .await?
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity);
        let pruned = secrets
            .get_opt(ha::grants::SECRET_NAME)
            .await?
            .is_some_and(|s| !s.data.unwrap_or_default().contains_key(&entry));
        if holder.as_deref() == Some("operator-a") && pruned {
            break;
        }
        if let Some(st) = a.child.try_wait()? {
            bail!("operator exited ({st}):\n{}", a.log());
        }
        ensure!(
            start.elapsed() < DEADLINE,
            "no lease or no prune:\n{}",
            a.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let start = tokio::time::Instant::now();
    loop {
        let metrics = http_get(&admin_a, "/metrics")?;
        // The expired token's grant and the legacy entry its mint (the newest) sealed.
        if metrics.contains("stratum_grants_pruned_total 2") {
            assert!(
                metrics.contains("stratum_certificate_key_age_seconds"),
                "{metrics}"
            );
            break;
        }
        ensure!(start.elapsed() < DEADLINE, "{metrics}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // A second replica stands by: the Lease stays with the first.
    let mut b = op("operator-b", &admin_b)?;
    b.wait_log("admin listener").await?;
    let status = http_get(&admin_b, "/status")?;
    assert!(status.contains("\"leader\":false"), "{status}");
    let lease = leases.get(ha::operator::LEASE_NAME).await?;
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("operator-a")
    );
    drop(a);
    drop(b);
    Ok(())
}
