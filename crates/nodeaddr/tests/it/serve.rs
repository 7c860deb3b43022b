//! `nodeaddr::serve`: the reconciler as a daemon, with its Lease and its admin listener.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use nodeaddr::{LEASE_NAME, LEASE_NAMESPACE, Reconciler, ServeError, ServeOptions, Status};
use testkube::ApiServer;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_util::sync::CancellationToken;

use crate::common::*;

async fn get_metrics(addr: std::net::SocketAddr) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// The daemon takes the Lease, patches the node, mirrors the monitor on `/status` and the
/// counters on `/metrics`, and on cancel stops within seconds and releases the Lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_mirrors_the_monitor_and_releases_the_lease_on_the_way_out() {
    install_crypto();
    let server = ApiServer::start().await.unwrap();
    let api: Api<Node> = Api::all(server.client());
    create_nodes(&api, [kubelet_node("w1", 1)]).await;
    let r = Reconciler::new(server.client());
    let listener = daemon::AdminServer::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let admin = format!("http://{addr}");
    let lease = daemon::LeaseConfig::new(LEASE_NAMESPACE, LEASE_NAME, "replica-a").with_timings(
        Duration::from_secs(3),
        Duration::from_secs(2),
        Duration::from_millis(300),
    );
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let (r, cancel) = (r.clone(), cancel.clone());
        async move { nodeaddr::serve_on(&r, listener, lease, cancel).await }
    });

    eventually(
        "the leader patched w1 and /status says so",
        Duration::from_secs(20),
        || async {
            let status =
                daemon::admin::fetch_status::<Status>(&admin, Duration::from_secs(2)).await;
            matches!(status, Ok(s) if s.started && s.leader && s.last_success_at.is_some())
                && all_patched(&r).await
        },
    )
    .await;
    let metrics = get_metrics(addr).await;
    assert!(metrics.contains(" 200 "), "{metrics}");
    assert!(
        metrics.contains("nodeaddr_"),
        "the election's metrics: {metrics}"
    );
    let leases: Api<Lease> = Api::namespaced(server.client(), LEASE_NAMESPACE);
    let held = leases.get(LEASE_NAME).await.unwrap();
    assert_eq!(
        held.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("replica-a")
    );

    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("serve ends within 5 s of cancel")
        .unwrap()
        .unwrap();
    let released = leases.get(LEASE_NAME).await.unwrap();
    let holder = released.spec.and_then(|s| s.holder_identity);
    assert!(
        holder.as_deref().is_none_or(str::is_empty),
        "released: {holder:?}"
    );
    assert!(
        daemon::admin::fetch_status::<Status>(&admin, Duration::from_secs(1))
            .await
            .is_err(),
        "the admin listener stopped"
    );
}

/// A taken admin address fails the start with an error naming it, before any work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_admin_address_fails_the_start() {
    install_crypto();
    let server = ApiServer::start().await.unwrap();
    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let r = Reconciler::new(server.client());
    let err = nodeaddr::serve(
        &r,
        ServeOptions::new(addr.clone(), "replica-a"),
        CancellationToken::new(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ServeError::Admin(_)), "{err}");
    assert!(nodeaddr::error_chain(&err).contains(&addr), "{err}");
    assert!(
        server.requests().iter().all(|q| !q.is_write()),
        "nothing was written"
    );
}
