//! `cargo xtask bench join`: time from a control-plane join's start to a healthy voting
//! member, against etcd's own floor measured in the same run (a learner added, started,
//! caught up and promoted directly with etcd-client on the test harness), and three
//! concurrent joins against three sequential ones.
//!
//! The join runs in-process through the library the `join` command calls
//! (`prepare_control_plane_join`, then `run_node`), against the API double over HTTPS and
//! real etcd 3.4 members the node supervisor starts.

#[path = "../tests/it/etcd_harness.rs"]
mod etcd_harness;

use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use etcd_client::MemberAddOptions;
use ha::discovery::{self, CaPin, DiscoveryTimeouts};
use ha::etcd::learner::{Queueing, linearizable_member_list};
use ha::grants::{self, CertKey, GrantOwner, UploadProfile};
use ha::join::{JoinOptions, prepare_control_plane_join};
use ha::node::{RunOptions, UpOptions, run_node, up};
use ha::nodestate::NodeConfig;
use ha::tokens::{self, TokenRole};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use tokio_util::sync::CancellationToken;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn free_port(ip: Ipv4Addr) -> anyhow::Result<u16> {
    Ok(TcpListener::bind((ip, 0))?.local_addr()?.port())
}

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run())
}

/// etcd's floor: learner add + start + catch-up + promote, straight through etcd-client.
async fn floor(rounds: usize) -> anyhow::Result<Vec<Duration>> {
    let mut cluster = etcd_harness::EtcdCluster::start(1).await?;
    let opts = cluster.options();
    let files = cluster.client_tls().context("tls")?.clone();
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(std::fs::read(
            &files.ca,
        )?))
        .identity(etcd_client::Identity::from_pem(
            std::fs::read(&files.cert)?,
            std::fs::read(&files.key)?,
        ));
    let mut client = etcd_client::Client::connect(
        cluster.endpoints(),
        Some(etcd_client::ConnectOptions::new().with_tls(tls)),
    )
    .await?;
    let mut out = Vec::new();
    for _ in 0..rounds {
        // Past the strict reconfiguration window of the last start, as a join would be.
        tokio::time::sleep(Duration::from_secs(6)).await;
        let slot = cluster.plan_member()?;
        let start = Instant::now();
        let resp = client
            .member_add(
                vec![slot.peer_url()],
                Some(MemberAddOptions::new().with_is_learner()),
            )
            .await?;
        let id = resp.member().context("no member")?.id();
        let members: Vec<ha::etcd::MemberInfo> = resp
            .member_list()
            .iter()
            .map(|m| ha::etcd::MemberInfo {
                id: m.id(),
                name: m.name().to_string(),
                peer_urls: m.peer_urls().to_vec(),
                client_urls: m.client_urls().to_vec(),
                is_learner: m.is_learner(),
            })
            .collect();
        let initial = ha::etcd::rules::initial_cluster(&members, id, &slot.name);
        cluster.start_added(&slot, &initial).await?;
        while client.member_promote(id).await.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        ha::etcd::etcd_cluster_healthy(&opts, &cluster.endpoints()).await?;
        out.push(start.elapsed());
    }
    Ok(out)
}

struct Env {
    api: testkube::ApiServer,
    dir: tempfile::TempDir,
    octet: u8,
    next: u8,
    etcd: PathBuf,
    nodes: Vec<(CancellationToken, tokio::task::JoinHandle<()>)>,
    endpoints: Vec<String>,
    pki0: PathBuf,
    join: Option<(String, String)>,
}

impl Env {
    async fn new(octet: u8) -> anyhow::Result<Env> {
        Ok(Env {
            api: testkube::ApiServer::start().await?,
            dir: tempfile::tempdir()?,
            octet,
            next: 11,
            etcd: etcd_harness::etcd_binary()?,
            nodes: Vec::new(),
            endpoints: Vec::new(),
            pki0: PathBuf::new(),
            join: None,
        })
    }

    fn node(&mut self) -> anyhow::Result<(String, IpAddr, PathBuf, NodeConfig)> {
        let ip = Ipv4Addr::new(127, 0, self.octet, self.next);
        self.next += 1;
        let name = format!("cp{}", self.next - 11);
        let mut config = NodeConfig::default();
        config.etcd.binary = self.etcd.clone();
        config.etcd.client_port = free_port(ip)?;
        config.etcd.peer_port = free_port(ip)?;
        self.endpoints
            .push(format!("https://{ip}:{}", config.etcd.client_port));
        let root = self.dir.path().join(&name);
        Ok((name, IpAddr::V4(ip), root, config))
    }

    async fn bootstrap(&mut self) -> anyhow::Result<()> {
        let (name, ip, root, config) = self.node()?;
        let opts = UpOptions {
            node_name: name,
            node_ip: ip,
            data_dir: root.join("data"),
            pki_dir: root.join("kubernetes/pki"),
            kubeconfig_dir: root.join("kubernetes"),
            kubeconfig: Some(self.api.kubeconfig_path().to_path_buf()),
            config,
        };
        self.pki0 = opts.pki_dir.clone();
        let token = CancellationToken::new();
        let t = token.clone();
        let handle = tokio::spawn(async move {
            if let Err(e) = up(&opts, &t).await {
                eprintln!("bootstrap node: {e}");
            }
        });
        self.nodes.push((token, handle));
        // cluster-info appears once etcd runs.
        let api: Api<ConfigMap> = Api::namespaced(self.api.client(), "kube-public");
        let start = Instant::now();
        while api.get_opt("cluster-info").await?.is_none() {
            anyhow::ensure!(start.elapsed() < Duration::from_secs(60), "no cluster-info");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Mint the join: token, grant with the first member's endpoint, signature.
        let client = self.api.client();
        let minted = tokens::create_token(
            &client,
            TokenRole::ControlPlane,
            Duration::from_secs(3600),
            None,
            jiff::Timestamp::now(),
        )
        .await?;
        let key = CertKey::generate();
        grants::upload_certs(
            &client,
            &key,
            &GrantOwner::from(&minted),
            &grants::read_bundle_files(&self.pki0)?,
            &UploadProfile {
                vip: None,
                etcd_endpoints: vec![self.endpoints[0].clone()],
            },
            grants::no_confirm,
        )
        .await?;
        let cm = api.get("cluster-info").await?;
        let kc = cm
            .data
            .as_ref()
            .and_then(|d| d.get("kubeconfig"))
            .context("no kubeconfig")?
            .clone();
        let patch = serde_json::json!({"data": {
            discovery::jws_key(minted.token.id()): discovery::sign_detached(kc.as_bytes(), &minted.token),
        }});
        api.patch(
            "cluster-info",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
        self.join = Some((minted.token.to_string(), key.to_hex()));
        Ok(())
    }

    /// Starts one join; returns its node name and the instant it started.
    fn join(&mut self) -> anyhow::Result<(String, Instant)> {
        let (name, ip, root, config) = self.node()?;
        let (token, key) = self.join.clone().context("not bootstrapped")?;
        let opts = JoinOptions {
            server: format!("127.0.0.1:{}", self.api.addr().port()),
            token: tokens::BootstrapToken::parse(&token)?,
            ca_pin: CaPin::parse(&pki::ca_cert_hash(self.api.ca_pem().as_bytes())?)?,
            cert_key: CertKey::from_hex(&key)?,
            node_name: name.clone(),
            node_ip: ip,
            data_dir: root.join("data"),
            pki_dir: root.join("kubernetes/pki"),
            kubeconfig_dir: root.join("kubernetes"),
            config: config.clone(),
            discovery: DiscoveryTimeouts::default(),
            queueing: Queueing::default(),
        };
        let kubeconfig = self.api.kubeconfig_path().to_path_buf();
        let cancel = CancellationToken::new();
        let c = cancel.clone();
        let start = Instant::now();
        let handle = tokio::spawn(async move {
            let state = match prepare_control_plane_join(&opts, &c).await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("join {}: {e}", opts.node_name);
                    return;
                }
            };
            let run = RunOptions {
                data_dir: opts.data_dir.clone(),
                config: opts.config.clone(),
                api_kubeconfig: Some(kubeconfig),
                first_join_start: true,
            };
            if let Err(e) = run_node(state, run, &c).await {
                eprintln!("join {}: {e}", opts.node_name);
            }
        });
        self.nodes.push((cancel, handle));
        Ok((name, start))
    }

    /// Waits until every name is a started voter and the cluster is healthy.
    async fn wait_voters(&self, names: &[String]) -> anyhow::Result<()> {
        let opts = ha::join::etcd_options(&self.pki0);
        let start = Instant::now();
        loop {
            if let Ok((_, members)) = linearizable_member_list(&opts, &self.endpoints[..1]).await
                && names.iter().all(|n| {
                    members
                        .iter()
                        .any(|m| &m.name == n && !m.is_learner && !m.client_urls.is_empty())
                })
                && ha::etcd::etcd_cluster_healthy(&opts, &self.endpoints)
                    .await
                    .is_ok()
            {
                return Ok(());
            }
            anyhow::ensure!(
                start.elapsed() < Duration::from_secs(300),
                "{names:?} never became healthy voters"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(self) {
        for (token, handle) in self.nodes.into_iter().rev() {
            token.cancel();
            let _ = handle.await;
        }
    }
}

fn octet(n: u8) -> u8 {
    ((std::process::id() % 200) as u8).wrapping_add(n * 17) % 250 + 1
}

async fn run() -> anyhow::Result<()> {
    const ROUNDS: usize = 3;
    println!("join bench: etcd 3.4 with mTLS on loopback, API double over HTTPS, 2 cores");

    let floor = floor(ROUNDS).await?;

    // Single joins into a settled cluster, one at a time, past the reconfiguration window.
    let mut env = Env::new(octet(1)).await?;
    env.bootstrap().await?;
    let mut single = Vec::new();
    for _ in 0..ROUNDS {
        tokio::time::sleep(Duration::from_secs(6)).await;
        let (name, start) = env.join()?;
        env.wait_voters(&[name]).await?;
        single.push(start.elapsed());
    }
    env.stop().await;

    println!("\njoin start to healthy voting member ({ROUNDS} rounds each)");
    println!(
        "  floor: etcd-client learner add + start + promote   median {:8.0} ms  (min {:.0}, max {:.0})",
        ms(median(floor.clone())),
        ms(*floor.iter().min().context("rounds")?),
        ms(*floor.iter().max().context("rounds")?)
    );
    println!(
        "  stratum join (discovery, grant, leaves, add, start, promote) median {:8.0} ms  (min {:.0}, max {:.0})  {:.2}x floor",
        ms(median(single.clone())),
        ms(*single.iter().min().context("rounds")?),
        ms(*single.iter().max().context("rounds")?),
        ms(median(single)) / ms(median(floor))
    );

    // Three joins: sequential (each waits for the previous voter) vs all at once.
    let mut env = Env::new(octet(2)).await?;
    env.bootstrap().await?;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let start = Instant::now();
    let mut names = Vec::new();
    for _ in 0..3 {
        let (name, _) = env.join()?;
        env.wait_voters(std::slice::from_ref(&name)).await?;
        names.push(name);
    }
    let sequential = start.elapsed();
    env.stop().await;

    let mut env = Env::new(octet(3)).await?;
    env.bootstrap().await?;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let start = Instant::now();
    let mut names = Vec::new();
    for _ in 0..3 {
        names.push(env.join()?.0);
    }
    env.wait_voters(&names).await?;
    let concurrent = start.elapsed();
    env.stop().await;

    println!("\nthree joins into a 1-member cluster, to all three healthy voters");
    println!(
        "  sequential (each after the previous is a voter) {:8.0} ms",
        ms(sequential)
    );
    println!(
        "  concurrent (started together, queued by etcd)    {:8.0} ms  {:.2}x sequential",
        ms(concurrent),
        ms(concurrent) / ms(sequential)
    );
    Ok(())
}
