//! Real etcd members for tests and benchmarks.
//!
//! Starts 1 to 5 members of etcd (the Debian `etcd-server` binary) on distinct loopback
//! addresses (127.0.N.11, .12, ...: all of 127/8 answers on loopback) and free ports,
//! data in a tempdir, with mTLS from the project's own PKI (or plain http), and waits
//! until every member knows a leader. Members are SIGKILLed on drop: a graceful stop of
//! the leader before its followers stalls for seconds, and nothing here needs the data.
//!
//! Shared by `tests/it/etcd.rs` and `benches/etcd.rs` (which `#[path]`-includes it).

#![allow(dead_code)] // each includer uses a different subset

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ha::etcd::{EtcdOptions, EtcdTls, etcd_member_status};

/// Member `i` (0-based) of a cluster is 127.0.N.(11+i). N differs per cluster (process ID
/// and a counter), so clusters of parallel test processes never share an address, and a
/// "free" port one process probed cannot be taken by another's member.
const FIRST_HOST: u8 = 11;

fn cluster_octet() -> u8 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    ((std::process::id()
        .wrapping_mul(31)
        .wrapping_add(n.wrapping_mul(7)))
        % 250
        + 1) as u8
}
/// Addresses handed out in all (initial members plus added ones).
const MAX_SLOTS: usize = 9;
/// How long a member may take to know a leader.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Finds the etcd binary: `$ETCD_BIN`, else `etcd` on PATH.
pub fn etcd_binary() -> anyhow::Result<PathBuf> {
    find_etcd(std::env::var_os("ETCD_BIN"), std::env::var_os("PATH"))
}

/// [`etcd_binary`] over explicit values, so the missing-binary message is testable.
pub fn find_etcd(
    etcd_bin: Option<std::ffi::OsString>,
    path: Option<std::ffi::OsString>,
) -> anyhow::Result<PathBuf> {
    if let Some(p) = etcd_bin {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!(
            "$ETCD_BIN={} is not a file: unset it, or apt-get install etcd-server",
            p.display()
        );
    }
    for dir in std::env::split_paths(&path.unwrap_or_default()) {
        let candidate = dir.join("etcd");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!("etcd not found on PATH (nor $ETCD_BIN): apt-get install etcd-server")
}

/// Where CI installs etcd 3.5 (Debian trixie's etcd-server, unpacked by `.ci/run`).
pub const ETCD35_DEFAULT: &str = "/opt/etcd-3.5/usr/bin/etcd";

/// Finds an etcd 3.5 binary: `$ETCD35_BIN`, else [`ETCD35_DEFAULT`]; fails naming how to
/// install it.
pub fn etcd35_binary() -> anyhow::Result<PathBuf> {
    find_etcd35(std::env::var_os("ETCD35_BIN"), Path::new(ETCD35_DEFAULT))
}

/// [`etcd35_binary`] over explicit values, so the missing-binary message is testable.
pub fn find_etcd35(
    etcd35_bin: Option<std::ffi::OsString>,
    default: &Path,
) -> anyhow::Result<PathBuf> {
    let how = "run the etcd 3.5 step of .ci/run (Debian trixie's etcd-server unpacked into \
               /opt/etcd-3.5, the system's etcd 3.4 untouched), or set $ETCD35_BIN to an etcd 3.5 binary";
    let p = match etcd35_bin {
        Some(p) => PathBuf::from(p),
        None => default.to_path_buf(),
    };
    if !p.is_file() {
        bail!("etcd 3.5 not found at {}: {how}", p.display());
    }
    let out = Command::new(&p)
        .arg("--version")
        .output()
        .with_context(|| format!("run {} --version", p.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !text.contains("etcd Version: 3.5.") {
        bail!(
            "{} is not etcd 3.5 ({}): {how}",
            p.display(),
            text.lines().next().unwrap_or("")
        );
    }
    Ok(p)
}

/// How a member restarted on another binary ended.
#[derive(Debug)]
pub enum Restarted {
    /// It knows a leader.
    Ready,
    /// It exited before that; its log's last lines.
    Exited(String),
}

/// A member's address and ports, allocated before it is added or started.
#[derive(Debug, Clone)]
pub struct Slot {
    /// Member name (`m1`, `m2`, ...).
    pub name: String,
    /// Its loopback address.
    pub ip: Ipv4Addr,
    /// Client port.
    pub client_port: u16,
    /// Peer port.
    pub peer_port: u16,
    scheme: &'static str,
}

impl Slot {
    /// `https://127.0.0.x:port` (or http).
    pub fn client_url(&self) -> String {
        format!("{}://{}:{}", self.scheme, self.ip, self.client_port)
    }

    /// The peer URL.
    pub fn peer_url(&self) -> String {
        format!("{}://{}:{}", self.scheme, self.ip, self.peer_port)
    }
}

struct Member {
    slot: Slot,
    child: Option<Child>,
    log: PathBuf,
}

/// Client TLS files of a harness cluster.
#[derive(Debug, Clone)]
pub struct ClientTlsFiles {
    /// The etcd CA.
    pub ca: PathBuf,
    /// A client certificate (clientAuth) issued by it.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
}

/// A running etcd cluster; members are killed on drop.
pub struct EtcdCluster {
    dir: tempfile::TempDir,
    ca: Option<pki::Ca>,
    client_tls: Option<ClientTlsFiles>,
    members: Vec<Member>,
    slots_used: usize,
    octet: u8,
    binary: PathBuf,
}

fn free_port(ip: Ipv4Addr) -> anyhow::Result<u16> {
    let l = TcpListener::bind((ip, 0)).with_context(|| format!("bind {ip}:0"))?;
    Ok(l.local_addr()?.port())
}

impl EtcdCluster {
    /// `n` members (1 to 5) with mTLS from the project's PKI.
    pub async fn start(n: usize) -> anyhow::Result<Self> {
        Self::start_with(n, true).await
    }

    /// `n` members over plain http.
    pub async fn start_plain(n: usize) -> anyhow::Result<Self> {
        Self::start_with(n, false).await
    }

    /// `n` members over plain http, of the etcd at `binary`.
    pub async fn start_plain_on(n: usize, binary: PathBuf) -> anyhow::Result<Self> {
        Self::start_on(n, false, binary).await
    }

    async fn start_with(n: usize, tls: bool) -> anyhow::Result<Self> {
        Self::start_on(n, tls, etcd_binary()?).await
    }

    async fn start_on(n: usize, tls: bool, binary: PathBuf) -> anyhow::Result<Self> {
        if !(1..=5).contains(&n) {
            bail!("the harness starts 1 to 5 members, not {n}");
        }
        let dir = tempfile::tempdir()?;
        let (ca, client_tls) = if tls {
            let ca = pki::Ca::generate("etcd-ca")?;
            let ca_path = dir.path().join("ca.crt");
            pki::write_atomic(&ca_path, ca.cert_pem().as_bytes(), 0o644)?;
            let client = ca.issue(&pki::LeafSpec::new(
                "harness-client",
                &[pki::Usage::ClientAuth],
            ))?;
            let cert = dir.path().join("client.crt");
            let key = dir.path().join("client.key");
            pki::write_atomic(&cert, client.cert_pem.as_bytes(), 0o644)?;
            pki::write_atomic(&key, client.key_pem.as_bytes(), 0o600)?;
            (
                Some(ca),
                Some(ClientTlsFiles {
                    ca: ca_path,
                    cert,
                    key,
                }),
            )
        } else {
            (None, None)
        };
        let mut cluster = EtcdCluster {
            dir,
            ca,
            client_tls,
            members: Vec::new(),
            slots_used: 0,
            octet: cluster_octet(),
            binary,
        };
        let slots: Vec<Slot> = (0..n)
            .map(|_| cluster.plan_member())
            .collect::<anyhow::Result<_>>()?;
        let initial: Vec<String> = slots
            .iter()
            .map(|s| format!("{}={}", s.name, s.peer_url()))
            .collect();
        let initial = initial.join(",");
        for s in &slots {
            cluster.spawn(s, &initial, "new")?;
        }
        for i in 0..n {
            cluster.wait_ready(i).await?;
        }
        cluster.wait_published(n).await?;
        Ok(cluster)
    }

    /// Waits until every member's view of the membership lists `n` members, each with its
    /// name and client URLs. A member publishes those through raft after it starts serving,
    /// so a member can know its leader while another's list still shows it unstarted.
    async fn wait_published(&self, n: usize) -> anyhow::Result<()> {
        let opts = self.options();
        let start = Instant::now();
        for ep in self.endpoints() {
            loop {
                let seen = ha::etcd::member_list_via(&opts, std::slice::from_ref(&ep)).await;
                let done = seen.as_ref().is_ok_and(|(_, members)| {
                    members.len() == n
                        && members
                            .iter()
                            .all(|m| !m.name.is_empty() && !m.client_urls.is_empty())
                });
                if done {
                    break;
                }
                if start.elapsed() > READY_TIMEOUT {
                    bail!(
                        "the membership seen at {ep} does not list {n} started members after {READY_TIMEOUT:?}: {seen:?}"
                    );
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// Allocates the next address and two free ports for a member to be added.
    pub fn plan_member(&mut self) -> anyhow::Result<Slot> {
        if self.slots_used >= MAX_SLOTS {
            bail!("the harness has no more than {MAX_SLOTS} member addresses");
        }
        let ip = Ipv4Addr::new(127, 0, self.octet, FIRST_HOST + self.slots_used as u8);
        self.slots_used += 1;
        Ok(Slot {
            name: format!("m{}", self.slots_used),
            ip,
            client_port: free_port(ip)?,
            peer_port: free_port(ip)?,
            scheme: if self.ca.is_some() { "https" } else { "http" },
        })
    }

    /// Starts a member that was added with `member_add` (state `existing`) and waits until
    /// it knows a leader. Returns its index.
    pub async fn start_added(
        &mut self,
        slot: &Slot,
        initial_cluster: &str,
    ) -> anyhow::Result<usize> {
        let i = self.spawn(slot, initial_cluster, "existing")?;
        self.wait_ready(i).await?;
        Ok(i)
    }

    fn member_tls(&self, slot: &Slot) -> anyhow::Result<Vec<String>> {
        let Some(ca) = &self.ca else {
            return Ok(Vec::new());
        };
        let mut id = pki::NodeIdentity::new(slot.name.clone());
        id.node_ip = Some(slot.ip.into());
        // One certificate serves clients and peers: etcd dials its peers with it too, so
        // it carries both serverAuth and clientAuth.
        let issued = ca.issue(&id.etcd_spec())?;
        let cert = self.dir.path().join(format!("{}.crt", slot.name));
        let key = self.dir.path().join(format!("{}.key", slot.name));
        pki::write_atomic(&cert, issued.cert_pem.as_bytes(), 0o644)?;
        pki::write_atomic(&key, issued.key_pem.as_bytes(), 0o600)?;
        let ca_path = &self.client_tls.as_ref().expect("TLS cluster").ca;
        let (c, k, t) = (
            cert.display().to_string(),
            key.display().to_string(),
            ca_path.display().to_string(),
        );
        Ok(vec![
            "--cert-file".into(),
            c.clone(),
            "--key-file".into(),
            k.clone(),
            "--trusted-ca-file".into(),
            t.clone(),
            "--client-cert-auth".into(),
            "--peer-cert-file".into(),
            c,
            "--peer-key-file".into(),
            k,
            "--peer-trusted-ca-file".into(),
            t,
            "--peer-client-cert-auth".into(),
        ])
    }

    /// Stops member `i` as an operator would (SIGTERM, then waits for it), and starts it
    /// again on the etcd at `binary` with the same name, addresses and data directory plus
    /// `extra` flags; waits until it knows a leader or exits.
    pub async fn restart_on(
        &mut self,
        i: usize,
        binary: &Path,
        extra: &[&str],
    ) -> anyhow::Result<Restarted> {
        if let Some(mut child) = self.members[i].child.take() {
            let pid = child.id().to_string();
            let _ = Command::new("kill").args(["-TERM", &pid]).status();
            child.wait()?;
        }
        let slot = self.members[i].slot.clone();
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}={}", m.slot.name, m.slot.peer_url()))
            .collect();
        let cmd = self.command(&slot, &initial.join(","), "existing", binary)?;
        let log = self.members[i].log.clone();
        self.members[i].child = Some(self.run(cmd, &slot, &log, binary, extra)?);
        match self.wait_ready(i).await {
            Ok(()) => Ok(Restarted::Ready),
            Err(_)
                if self.members[i]
                    .child
                    .as_mut()
                    .and_then(|c| c.try_wait().ok().flatten())
                    .is_some() =>
            {
                self.members[i].child = None;
                Ok(Restarted::Exited(self.log_tail(i)))
            }
            Err(e) => Err(e),
        }
    }

    fn run(
        &self,
        mut cmd: Command,
        slot: &Slot,
        log: &Path,
        binary: &Path,
        extra: &[&str],
    ) -> anyhow::Result<Child> {
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        cmd.args(extra)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file);
        cmd.spawn()
            .with_context(|| format!("spawn {} for member {}", binary.display(), slot.name))
    }

    fn command(
        &self,
        slot: &Slot,
        initial_cluster: &str,
        state: &str,
        binary: &Path,
    ) -> anyhow::Result<Command> {
        let data = self.dir.path().join(format!("{}.etcd", slot.name));
        let mut cmd = Command::new(binary);
        cmd.args(["--name", &slot.name])
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen-client-urls", &slot.client_url()])
            .args(["--advertise-client-urls", &slot.client_url()])
            .args(["--listen-peer-urls", &slot.peer_url()])
            .args(["--initial-advertise-peer-urls", &slot.peer_url()])
            .args(["--initial-cluster", initial_cluster])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", "stratum-harness"])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .args(self.member_tls(slot)?);
        Ok(cmd)
    }

    fn spawn(&mut self, slot: &Slot, initial_cluster: &str, state: &str) -> anyhow::Result<usize> {
        let log = self.dir.path().join(format!("{}.log", slot.name));
        let cmd = self.command(slot, initial_cluster, state, &self.binary)?;
        let child = self.run(cmd, slot, &log, &self.binary, &[])?;
        self.members.push(Member {
            slot: slot.clone(),
            child: Some(child),
            log,
        });
        Ok(self.members.len() - 1)
    }

    async fn wait_ready(&mut self, i: usize) -> anyhow::Result<()> {
        let opts = self.options();
        let endpoint = self.members[i].slot.client_url();
        let start = Instant::now();
        loop {
            if let Some(child) = self.members[i].child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!(
                    "etcd member {} exited ({status}) before it was ready:\n{}",
                    self.members[i].slot.name,
                    self.log_tail(i)
                );
            }
            let answer = etcd_member_status(&opts, &endpoint).await;
            if answer.error.is_none() && answer.leader.is_some() {
                return Ok(());
            }
            if start.elapsed() > READY_TIMEOUT {
                bail!(
                    "etcd member {} at {endpoint} not ready after {READY_TIMEOUT:?} (last answer: {answer:?}):\n{}",
                    self.members[i].slot.name,
                    self.log_tail(i)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Client options: the harness client certificate (mTLS) or none (plain), and short
    /// timeouts.
    pub fn options(&self) -> EtcdOptions {
        let mut o = EtcdOptions::with_tls(
            self.client_tls
                .as_ref()
                .map(|t| EtcdTls::from_paths(&t.ca, &t.cert, &t.key)),
        );
        o.connect_timeout = Duration::from_secs(2);
        o.request_timeout = Duration::from_secs(3);
        o
    }

    /// The client TLS files (None for a plain cluster).
    pub fn client_tls(&self) -> Option<&ClientTlsFiles> {
        self.client_tls.as_ref()
    }

    /// Client URL of member `i` (in start order), running or not.
    pub fn endpoint(&self, i: usize) -> String {
        self.members[i].slot.client_url()
    }

    /// Peer URL of member `i`.
    pub fn peer_url(&self, i: usize) -> String {
        self.members[i].slot.peer_url()
    }

    /// Client URLs of every running member.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|m| m.child.is_some())
            .map(|m| m.slot.client_url())
            .collect()
    }

    /// Members started so far (running or killed).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// SIGKILLs member `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The last lines of member `i`'s log.
    pub fn log_tail(&self, i: usize) -> String {
        let text = std::fs::read_to_string(&self.members[i].log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// The tempdir holding data, logs and certificates.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
