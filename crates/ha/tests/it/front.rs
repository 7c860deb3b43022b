//! The per-node front against real HAProxy (Debian `haproxy`) and three live HTTPS
//! backends on loopback: traffic reaches every backend, a killed backend costs clients
//! nothing, a changed member list reloads HAProxy without dropping an open connection,
//! and a configuration HAProxy refuses never replaces the running one.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use ha::front::{self, Backend, Front, FrontIoError, FrontSpec, Installed, SyncOutcome};
use ha::supervisor::{self, Supervisor};

use crate::tls_backends::{self as tb, Subnet};

/// `haproxy` on PATH, or a failure naming the package.
fn haproxy_binary() -> anyhow::Result<PathBuf> {
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .chain([PathBuf::from("/usr/sbin")])
    {
        let p = dir.join("haproxy");
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!("haproxy not found on PATH or in /usr/sbin: apt-get install haproxy")
}

fn free_port(ip: std::net::IpAddr) -> anyhow::Result<u16> {
    // On this test's own 127.1.N.x address nobody else binds, so the port stays free
    // between this probe and HAProxy's bind.
    Ok(std::net::TcpListener::bind((ip, 0))?.local_addr()?.port())
}

async fn wait_for<F, Fut>(what: &str, mut f: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !f().await {
        if tokio::time::Instant::now() >= deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_spreads_survives_a_dead_backend_and_reloads_safely() -> anyhow::Result<()> {
    let haproxy = haproxy_binary()?;
    let net = Subnet::next();
    let front_ip = net.ip(20);
    let dir = tempfile::tempdir()?;
    let ca = pki::Ca::generate("cluster-ca")?;
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, ca.cert_pem())?;

    // Three API servers. Each certificate covers its own address (the health check) and
    // the front's (clients verify through the TCP pass-through).
    let mut backends = Vec::new();
    for i in 0..3u8 {
        let ip = net.ip(11 + i);
        let cert = tb::serving_cert(&ca, &format!("api{i}"), &[ip, front_ip])?;
        backends.push(tb::Backend::start(ip, &cert, &format!("api{i}")).await?);
    }
    let listen = std::net::SocketAddr::new(front_ip, free_port(front_ip)?);
    let spec_for = |bs: &[&tb::Backend]| -> anyhow::Result<FrontSpec> {
        let list = bs
            .iter()
            .map(|b| Backend::new(&b.addr.ip().to_string(), b.addr.port()))
            .collect::<Result<Vec<_>, _>>()?;
        let mut spec = FrontSpec::new(list, &ca_file);
        spec.listen = listen;
        spec.check_interval = Duration::from_millis(500);
        Ok(spec)
    };
    let f = Front {
        haproxy: haproxy.clone(),
        config: dir.path().join("haproxy.cfg"),
    };
    let spec = spec_for(&backends.iter().collect::<Vec<_>>())?;
    assert_eq!(f.prepare(&spec).await?, Installed::Replaced);
    // The file installed is the one `haproxy -c` accepts.
    front::check_config(&haproxy, &f.config).await?;

    let sup = Supervisor::start(
        vec![front::haproxy_component(&haproxy, &f.config)],
        &dir.path().join("logs"),
        supervisor::Backoff::default(),
    )?;
    let client = tb::connector(ca.cert_pem())?;
    wait_for("HAProxy to answer", || async {
        tb::get(&client, listen, "/who").await.is_ok()
    })
    .await
    .with_context(|| {
        std::fs::read_to_string(dir.path().join("logs/haproxy.log")).unwrap_or_default()
    })?;

    // Traffic reaches all three (leastconn among idle servers goes round).
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    for _ in 0..30 {
        *seen
            .entry(tb::get(&client, listen, "/who").await?)
            .or_default() += 1;
    }
    assert_eq!(
        seen.keys().cloned().collect::<Vec<_>>(),
        vec!["api0", "api1", "api2"],
        "{seen:?}"
    );

    // One backend dies. Clients keep working at once: a refused connection is retried on
    // another server, and the dead one is marked down.
    backends[0].kill().await;
    let mut after: BTreeMap<String, u32> = BTreeMap::new();
    for i in 0..30 {
        let who = tb::get(&client, listen, "/who")
            .await
            .with_context(|| format!("request {i} after api0 died"))?;
        *after.entry(who).or_default() += 1;
    }
    assert!(!after.contains_key("api0"), "{after:?}");
    assert_eq!(after.values().sum::<u32>(), 30);
    assert!(
        after.contains_key("api1") && after.contains_key("api2"),
        "{after:?}"
    );

    // A member list without the dead one: an open connection survives the reload.
    let mut open = tb::connect(&client, listen).await?;
    let master = sup.status()[0].pid.context("haproxy runs")?;
    let live = spec_for(&[&backends[1], &backends[2]])?;
    let outcome = f.sync(&sup, &live).await?;
    assert_eq!(outcome, SyncOutcome::Reloaded { pid: master });
    let body = tb::request_on(&mut open, "/who").await?;
    assert!(body == "api1" || body == "api2", "{body}");
    // Same list again: nothing written, nothing reloaded.
    assert_eq!(f.sync(&sup, &live).await?, SyncOutcome::Unchanged);
    let installed = std::fs::read_to_string(&f.config)?;
    assert!(
        !installed.contains(&backends[0].addr.to_string()),
        "{installed}"
    );

    // A configuration HAProxy refuses (its CA file does not exist) is not installed: the
    // live file keeps its bytes, the master is not signalled, clients keep working.
    let mut bad = live.clone();
    bad.ca_file = dir.path().join("missing-ca.crt");
    let err = f.sync(&sup, &bad).await.unwrap_err();
    assert!(matches!(err, FrontIoError::Invalid { .. }), "{err}");
    assert!(err.to_string().contains("missing-ca.crt"), "{err}");
    assert_eq!(std::fs::read_to_string(&f.config)?, installed);
    assert!(!dir.path().join("haproxy.cfg.candidate").exists());
    assert_eq!(sup.status()[0].pid, Some(master));
    for _ in 0..5 {
        let who = tb::get(&client, listen, "/who").await?;
        assert!(who == "api1" || who == "api2", "{who}");
    }
    sup.stop().await;
    Ok(())
}

/// The kube-vip static pod decodes strictly as a v1 Pod (no unknown field, every value of
/// its type), as `kubectl apply --validate=strict` would have the API server check it.
#[test]
fn kube_vip_manifest_is_a_strictly_valid_pod() -> anyhow::Result<()> {
    let text = front::kube_vip_manifest(&front::KubeVipSpec {
        vip: "10.0.0.100".parse()?,
        interface: "eth0".into(),
        port: 6443,
        image: front::render::KUBE_VIP_IMAGE.into(),
        kubeconfig: "/etc/kubernetes/admin.conf".into(),
    })?;
    let doc: serde_json::Value = serde_yaml::from_str(&text)?;
    testkube::typed::validate_strict(&doc).map_err(|e| anyhow::anyhow!("kube-vip pod: {e}"))?;
    assert_eq!(doc["spec"]["hostNetwork"], true);
    let env = doc["spec"]["containers"][0]["env"]
        .as_array()
        .context("env")?
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap_or(""),
                e["value"].as_str().unwrap_or(""),
            )
        })
        .collect::<BTreeMap<_, _>>();
    assert_eq!(env["address"], "10.0.0.100");
    assert_eq!(env["vip_arp"], "true");
    assert_eq!(env["vip_interface"], "eth0");
    assert_eq!(env["vip_leaderelection"], "true");
    assert_eq!(env["cp_namespace"], "kube-system");
    // The check can fail: a field the Pod type does not have is refused.
    let mut typo = doc.clone();
    typo["spec"]["hostNetwrok"] = serde_json::json!(true);
    assert!(testkube::typed::validate_strict(&typo).is_err());
    Ok(())
}

/// `up`'s front (`spawn_for_node`): the member list of a real etcd cluster (mTLS with the
/// node's etcd client certificate, as a node state names it) becomes a running HAProxy in
/// front of an API server on each member's host; cancelling stops HAProxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_front_follows_the_member_list_and_stops_with_the_node() -> anyhow::Result<()> {
    use crate::etcd_harness::EtcdCluster;
    use ha::nodestate::{
        ClusterState, EtcdMember, FrontConfig, NODE_STATE_VERSION, NodeState, Origin,
    };

    let haproxy = haproxy_binary()?;
    let cluster = EtcdCluster::start(1).await?;
    let member_url = cluster.endpoint(0);
    let host: std::net::IpAddr = ha::etcd::rules::url_host(&member_url)
        .context("member host")?
        .parse()?;
    let dir = tempfile::tempdir()?;
    // The node's PKI as `join::etcd_options` reads it: the etcd CA and the API server's
    // etcd client certificate; and the cluster CA the health checks verify with.
    let pki_dir = dir.path().join("pki");
    std::fs::create_dir_all(pki_dir.join("etcd"))?;
    let files = cluster.client_tls().context("a TLS cluster")?;
    std::fs::copy(&files.ca, pki_dir.join("etcd/ca.crt"))?;
    std::fs::copy(&files.cert, pki_dir.join("apiserver-etcd-client.crt"))?;
    std::fs::copy(&files.key, pki_dir.join("apiserver-etcd-client.key"))?;
    let ca = pki::Ca::generate("cluster-ca")?;
    std::fs::write(pki_dir.join("ca.crt"), ca.cert_pem())?;

    let net = Subnet::next();
    let front_ip = net.ip(21);
    let api = tb::Backend::start(
        host,
        &tb::serving_cert(&ca, "api", &[host, front_ip])?,
        "member-api",
    )
    .await?;
    let listen = std::net::SocketAddr::new(front_ip, free_port(front_ip)?);
    let state = NodeState {
        version: NODE_STATE_VERSION,
        origin: Origin::Bootstrap,
        node_name: "m1".into(),
        node_ip: host,
        pki_dir: pki_dir.clone(),
        api_server: format!("https://{host}:{}", api.addr.port()),
        etcd: EtcdMember {
            name: "m1".into(),
            client_url: member_url.clone(),
            peer_url: String::new(),
            data_dir: dir.path().join("etcd"),
            initial_cluster: String::new(),
            initial_cluster_state: ClusterState::New,
            member_id: None,
            learner: false,
        },
        cluster_endpoints: vec![],
    };
    let fc = FrontConfig {
        haproxy,
        listen: listen.to_string(),
        api_port: api.addr.port(),
        interval: Duration::from_millis(500),
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let status = front::FrontStatusHandle::default();
    let task = front::spawn_for_node(&state, dir.path(), &fc, stop.clone(), status.clone());
    let client = tb::connector(ca.cert_pem())?;
    wait_for("the node's front to answer", || async {
        tb::get(&client, listen, "/who").await.is_ok()
    })
    .await
    .with_context(|| {
        std::fs::read_to_string(dir.path().join("logs/haproxy.log")).unwrap_or_default()
    })?;
    assert_eq!(tb::get(&client, listen, "/who").await?, "member-api");
    let cfg = std::fs::read_to_string(dir.path().join("haproxy.cfg"))?;
    assert!(
        cfg.contains(&format!("server apiserver-{host} {}", api.addr)),
        "{cfg}"
    );

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(30), task).await??;
    assert!(
        tokio::net::TcpStream::connect(listen).await.is_err(),
        "HAProxy still listens after the node stopped"
    );
    Ok(())
}
