//! `Reconciler::run`: watch-driven repair from the store, the liveness snapshot, the
//! logging contract, and recovery from API failures. Each test runs in its own process
//! under nextest, so the log capture is the test's own.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use nodeaddr::{Reconciler, always_leader, first_external_ip, loopback_candidate};
use testkube::{ApiServer, Fault, FaultKind};
use tokio_util::sync::CancellationToken;

use crate::common::*;

/// Generous: the assertion is that repair happens at all without the resync ticker, not
/// how fast (that is the benchmark's job).
const REPAIR_TIMEOUT: Duration = Duration::from_secs(10);

/// Covers several rounds of the watcher's backoff after failed lists.
const BACKOFF_TIMEOUT: Duration = Duration::from_secs(40);

fn spawn_run(r: &Reconciler) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let r = r.clone();
        let cancel = cancel.clone();
        async move { r.run(cancel, always_leader()).await }
    });
    (cancel, task)
}

async fn external_ip(api: &Api<Node>, name: &str) -> Option<String> {
    let n = api.get(name).await.ok()?;
    first_external_ip(&n).map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_write_dropping_the_external_ip_is_repaired_from_the_watch() {
    install_crypto();
    let server = ApiServer::start().await.unwrap();
    let api: Api<Node> = Api::all(server.client());
    create_nodes(&api, (1..=5).map(|i| kubelet_node(&format!("w{i}"), i))).await;
    let mut r = Reconciler::new(server.client());
    // Only the initial tick resyncs; every later repair must come from the watch.
    r.interval = Duration::from_secs(3600);
    let monitor = r.monitor();
    assert!(!monitor.status().started, "not started yet");
    let (cancel, task) = spawn_run(&r);

    eventually("initial pass patched every node", REPAIR_TIMEOUT, || {
        all_patched(&r)
    })
    .await;
    let st = monitor.status();
    assert!(st.started);
    assert!(st.last_run_at.is_some());
    assert_eq!((st.consecutive_failures, st.last_error), (0, None));

    for round in 0..3 {
        kubelet_status_write(&api, "w3", 3).await;
        let want = loopback_candidate("w3").to_string();
        eventually(
            &format!("round {round}: ExternalIP of w3 restored"),
            REPAIR_TIMEOUT,
            || async { external_ip(&api, "w3").await.as_deref() == Some(want.as_str()) },
        )
        .await;
    }
    // Once repaired and settled, the watch echo of our own write writes nothing.
    tokio::time::sleep(Duration::from_millis(600)).await;
    server.clear_requests();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let writes: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|q| q.is_write())
        .collect();
    assert!(writes.is_empty(), "settled reconciler wrote: {writes:#?}");

    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("run stops on cancel")
        .unwrap();
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_watches_are_reestablished_and_still_drive_repairs() {
    install_crypto();
    let server = ApiServer::start().await.unwrap();
    let api: Api<Node> = Api::all(server.client());
    create_nodes(&api, (1..=3).map(|i| kubelet_node(&format!("w{i}"), i))).await;
    // A fault applies to watches opened after it: the reconciler's first three watches
    // are served, then cut, as a restarting API server would.
    server.inject(
        Fault::new(FaultKind::DropWatch)
            .verb("watch")
            .resource("nodes")
            .times(3),
    );
    let mut r = Reconciler::new(server.client());
    r.interval = Duration::from_secs(3600);
    let (cancel, task) = spawn_run(&r);
    eventually("initial pass", REPAIR_TIMEOUT, || all_patched(&r)).await;
    eventually("three watches cut", REPAIR_TIMEOUT, || async {
        server
            .requests()
            .iter()
            .filter(|q| q.verb == "watch")
            .count()
            >= 3
    })
    .await;
    // Repairs below can only come from a watch opened after the cuts (no resync for 1h).
    kubelet_status_write(&api, "w1", 1).await;
    let want = loopback_candidate("w1").to_string();
    eventually(
        "w1 repaired across dropped watches",
        REPAIR_TIMEOUT,
        || async { external_ip(&api, "w1").await.as_deref() == Some(want.as_str()) },
    )
    .await;
    kubelet_status_write(&api, "w2", 2).await;
    let want = loopback_candidate("w2").to_string();
    eventually(
        "w2 repaired on the re-established watch",
        REPAIR_TIMEOUT,
        || async { external_ip(&api, "w2").await.as_deref() == Some(want.as_str()) },
    )
    .await;
    assert_eq!(r.monitor().status().consecutive_failures, 0);
    cancel.cancel();
    task.await.unwrap();
    server.shutdown().await;
}

/// A tracing writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_string)
            .collect()
    }
    fn count(&self, level: &str, needle: &str) -> usize {
        self.lines()
            .iter()
            .filter(|l| l.contains(level) && l.contains(needle))
            .count()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_failures_are_counted_logged_once_and_recovered_from() {
    install_crypto();
    let logs = Captured::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("nodeaddr=debug"))
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();

    let server = ApiServer::start().await.unwrap();
    let api: Api<Node> = Api::all(server.client());
    create_nodes(&api, (1..=3).map(|i| kubelet_node(&format!("w{i}"), i))).await;
    // Every list fails: the pass cannot start, and neither can the watcher's initial list.
    server.inject(
        Fault::new(FaultKind::Status(500))
            .verb("list")
            .resource("nodes"),
    );
    let mut r = Reconciler::new(server.client());
    r.interval = Duration::from_millis(200);
    let (cancel, task) = spawn_run(&r);

    // The watcher retries a failed list with exponential backoff (0.8 s, 1.6 s, 3.2 s, ...).
    eventually("three failed passes counted", BACKOFF_TIMEOUT, || async {
        r.monitor().status().consecutive_failures >= 3
    })
    .await;
    let st = r.monitor().status();
    assert!(st.started);
    let err = st.last_error.unwrap();
    assert!(err.contains("could not list nodes"), "{err}");
    assert_eq!(
        external_ip(&api, "w1").await,
        None,
        "nothing written while failing"
    );

    server.clear_faults();
    eventually("recovered and patched", BACKOFF_TIMEOUT, || async {
        r.monitor().status().consecutive_failures == 0 && all_patched(&r).await
    })
    .await;
    assert_eq!(r.monitor().status().last_error, None);

    // Throttled writes: kube's client honours Retry-After and retries 429 itself, so a
    // short throttle costs time, not a failed pass. The fault goes in after the kubelet's
    // own write, which it would otherwise hit.
    kubelet_status_write(&api, "w2", 2).await;
    server.inject(
        Fault::new(FaultKind::TooManyRequests {
            retry_after_secs: 1,
        })
        .verb("update")
        .resource("nodes/status")
        .times(2),
    );
    let want = loopback_candidate("w2").to_string();
    eventually("w2 repaired through throttling", REPAIR_TIMEOUT, || async {
        external_ip(&api, "w2").await.as_deref() == Some(want.as_str())
    })
    .await;
    assert_eq!(
        server.requests().iter().filter(|q| q.code == 429).count(),
        2,
        "both throttled writes were attempted"
    );
    assert_eq!(r.monitor().status().consecutive_failures, 0);

    // Failing writes fail the pass (naming the node), and the next passes retry.
    kubelet_status_write(&api, "w3", 3).await;
    server.inject(
        Fault::new(FaultKind::Status(500))
            .verb("update")
            .resource("nodes/status")
            .times(2),
    );
    let want = loopback_candidate("w3").to_string();
    eventually(
        "w3 repaired after failed writes",
        REPAIR_TIMEOUT,
        || async { external_ip(&api, "w3").await.as_deref() == Some(want.as_str()) },
    )
    .await;
    eventually("snapshot clean again", REPAIR_TIMEOUT, || async {
        r.monitor().status().consecutive_failures == 0
    })
    .await;
    let failed_writes = server
        .requests()
        .iter()
        .filter(|q| q.code == 500 && q.verb == "update")
        .count();
    assert_eq!(failed_writes, 2);

    cancel.cancel();
    task.await.unwrap();
    server.shutdown().await;

    // The logging contract: one info line on start; one warning per transition into
    // failure and one per recovery, however many passes failed; repeats at debug.
    assert_eq!(
        logs.count("INFO", "node address reconciler started"),
        1,
        "{:#?}",
        logs.lines()
    );
    // Two outages (the failing lists, the failing writes): two of each. The throttle,
    // absorbed by the client, is not an outage.
    let failing = logs.count("WARN", "node address reconcile failing");
    let recovered = logs.count("WARN", "node address reconcile recovered");
    assert_eq!((failing, recovered), (2, 2), "{:#?}", logs.lines());
    assert!(
        logs.count("DEBUG", "still failing") >= 3,
        "{:#?}",
        logs.lines()
    );
    assert!(
        logs.count("WARN", "could not write the status of node w3") == 1,
        "the write outage names the node: {:#?}",
        logs.lines()
    );
}

fn node_writes(server: &ApiServer) -> Vec<testkube::RequestRecord> {
    server
        .requests()
        .into_iter()
        .filter(|q| q.is_write() && q.resource == "nodes")
        .collect()
}

/// Waits until the reconciler has finished a pass that started after this call.
async fn next_pass(r: &Reconciler) {
    let before = r.monitor().status().last_run_at;
    // Two passes: the one in flight may have planned before the caller's change.
    for _ in 0..2 {
        let seen = r.monitor().status().last_run_at;
        eventually("a reconcile pass", REPAIR_TIMEOUT, || async {
            r.monitor().status().last_run_at != seen
        })
        .await;
    }
    assert_ne!(r.monitor().status().last_run_at, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_start_nothing_is_listed_and_resyncs_plan_from_the_store() {
    install_crypto();
    let server = ApiServer::start().await.unwrap();
    let api: Api<Node> = Api::all(server.client());
    create_nodes(&api, (1..=4).map(|i| kubelet_node(&format!("w{i}"), i))).await;
    let mut r = Reconciler::new(server.client());
    r.interval = Duration::from_millis(100);
    let (cancel, task) = spawn_run(&r);
    eventually("initial pass", REPAIR_TIMEOUT, || all_patched(&r)).await;
    let lists_at_start = server
        .requests()
        .iter()
        .filter(|q| q.verb == "list" && q.resource == "nodes")
        .count();
    // The watcher's initial list and the test's own diagnostics lists.
    assert!(lists_at_start >= 1);

    server.clear_requests();
    // Many resyncs pass (every 100 ms); then a repair.
    let passes_before = r.monitor().status();
    for _ in 0..5 {
        next_pass(&r).await;
    }
    kubelet_status_write(&api, "w2", 2).await;
    let want = loopback_candidate("w2").to_string();
    eventually("w2 repaired", REPAIR_TIMEOUT, || async {
        external_ip(&api, "w2").await.as_deref() == Some(want.as_str())
    })
    .await;
    for _ in 0..3 {
        next_pass(&r).await;
    }
    let log = server.requests();
    let reconciler_requests: Vec<_> = log
        .iter()
        .filter(|q| q.resource == "nodes")
        // The test's own reads of w2 and its kubelet write.
        .filter(|q| {
            !(q.verb == "get"
                || (q.verb == "update" && q.code == 200 && q.name.as_deref() == Some("w2")))
        })
        .collect();
    assert!(
        reconciler_requests.iter().all(|q| q.verb != "list"),
        "a LIST after start: {reconciler_requests:#?}"
    );
    let writes = node_writes(&server);
    // The kubelet's write and the reconciler's repair: nothing else, however many resyncs.
    assert_eq!(writes.len(), 2, "{writes:#?}");
    assert!(passes_before.last_run_at < r.monitor().status().last_run_at);
    let st = r.monitor().status();
    assert_eq!(st.nodes[&nodeaddr::NodeState::Ok], 4, "{st:?}");

    cancel.cancel();
    task.await.unwrap();
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_turns_virtual_loses_its_route() {
    install_crypto();
    let server = ApiServer::start().await.unwrap();
    let api: Api<Node> = Api::all(server.client());
    create_nodes(&api, (1..=2).map(|i| kubelet_node(&format!("w{i}"), i))).await;
    let mut r = Reconciler::new(server.client());
    r.interval = Duration::from_secs(3600);
    let (cancel, task) = spawn_run(&r);
    eventually("initial pass", REPAIR_TIMEOUT, || all_patched(&r)).await;

    let mut n = api.get("w1").await.unwrap();
    n.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(
            nodeaddr::RUNTIME_LABEL.into(),
            nodeaddr::RUNTIME_VIRTUAL.into(),
        );
    api.replace("w1", &kube::api::PostParams::default(), &n)
        .await
        .unwrap();
    eventually("w1 unrouted", REPAIR_TIMEOUT, || async {
        let n = api.get("w1").await.unwrap();
        first_external_ip(&n).is_none() && nodeaddr::observed_kubelet_port(&n).is_none()
    })
    .await;
    let n = api.get("w1").await.unwrap();
    let addrs = n.status.unwrap().addresses.unwrap();
    assert_eq!(addrs, kubelet_addresses("w1", 1), "everything else kept");
    // The other node keeps its route.
    assert_eq!(
        external_ip(&api, "w2").await,
        Some(loopback_candidate("w2").to_string())
    );
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(server.client(), "default");
    eventually(
        "an Event says the route was removed",
        REPAIR_TIMEOUT,
        || async {
            events
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("KubeletRouteRemoved")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("w1")
                })
        },
    )
    .await;
    cancel.cancel();
    task.await.unwrap();
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_tunnel_leaves_a_node_whose_tunnel_is_down() {
    install_crypto();
    let server = ApiServer::start().await.unwrap();
    let api: Api<Node> = Api::all(server.client());
    create_nodes(&api, [kubelet_node("up", 1), kubelet_node("down", 2)]).await;
    // "up" has a listener on its loopback address; "down" gets a port nothing listens on.
    let up = tokio::net::TcpListener::bind((loopback_candidate("up"), 0))
        .await
        .unwrap();
    let up_port = up.local_addr().unwrap().port();
    // Bound on "up"'s address while "up" still holds its port, so the two ports differ
    // (the same port on both would be a collision, not a tunnel down); dropped at once.
    let down_port = {
        let l = std::net::TcpListener::bind((loopback_candidate("up"), 0)).unwrap();
        l.local_addr().unwrap().port()
    };
    let mut r = Reconciler::new(server.client());
    r.require_tunnel = true;
    r.port_for = std::sync::Arc::new(move |name: &str| match name {
        "up" => Some(up_port),
        "down" => Some(down_port),
        _ => None,
    });
    let report = r.once().await.unwrap();
    assert_eq!(report.writes, 1, "{report:?}");
    assert_eq!(report.states[&nodeaddr::NodeState::TunnelDown], 1);
    assert!(report.needs_attention());
    assert_eq!(external_ip(&api, "down").await, None, "left as it is");
    assert_eq!(
        external_ip(&api, "up").await,
        Some(loopback_candidate("up").to_string())
    );
    let rows = r.diagnostics().await.unwrap();
    let down = rows.iter().find(|d| d.node_name == "down").unwrap();
    assert_eq!(down.state, nodeaddr::NodeState::TunnelDown);
    assert!(down.needs_attention());
    let up_row = rows.iter().find(|d| d.node_name == "up").unwrap();
    assert_eq!(up_row.state, nodeaddr::NodeState::Ok);
    drop(up);
    server.shutdown().await;
}

/// A reconciler with its own election on the reconciler Lease, short timings.
fn elected(
    server: &ApiServer,
    identity: &str,
) -> (
    Reconciler,
    CancellationToken,
    tokio::task::JoinHandle<()>,
    tokio::task::JoinHandle<()>,
) {
    let mut r = Reconciler::new(server.client());
    r.interval = Duration::from_millis(200);
    let config =
        daemon::LeaseConfig::new(nodeaddr::LEASE_NAMESPACE, nodeaddr::LEASE_NAME, identity)
            .with_timings(
                Duration::from_secs(3),
                Duration::from_secs(2),
                Duration::from_millis(500),
            );
    let election = daemon::LeaderElection::new(server.client(), config).unwrap();
    let stop = CancellationToken::new();
    let (handle, election_task) = election.spawn(stop.clone());
    let task = tokio::spawn({
        let r = r.clone();
        let stop = stop.clone();
        async move { r.run(stop, handle).await }
    });
    (r, stop, election_task, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_lease_holder_writes_and_a_standby_takes_over() {
    install_crypto();
    let server = ApiServer::start().await.unwrap();
    let api: Api<Node> = Api::all(server.client());
    create_nodes(&api, (1..=3).map(|i| kubelet_node(&format!("w{i}"), i))).await;
    let (one, stop_one, election_one, task_one) = elected(&server, "one");
    let (two, stop_two, election_two, task_two) = elected(&server, "two");
    eventually("a leader patched every node", REPAIR_TIMEOUT, || {
        all_patched(&one)
    })
    .await;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(server.client(), nodeaddr::LEASE_NAMESPACE);
    let holder = || async {
        leases
            .get(nodeaddr::LEASE_NAME)
            .await
            .ok()
            .and_then(|l| l.spec?.holder_identity)
    };
    let first = holder().await.expect("the lease has a holder");
    let (leader, standby, stop_leader, election_leader, task_leader) = if first == "one" {
        (&one, &two, stop_one, election_one, task_one)
    } else {
        (&two, &one, stop_two, election_two, task_two)
    };
    // The standby plans (its counters say what it sees) but never wrote.
    eventually(
        "the standby saw three patched nodes",
        REPAIR_TIMEOUT,
        || async {
            standby
                .monitor()
                .status()
                .nodes
                .get(&nodeaddr::NodeState::Ok)
                == Some(&3)
        },
    )
    .await;
    assert!(leader.monitor().status().leader);
    assert!(!standby.monitor().status().leader);
    let mut registry = prometheus_client::registry::Registry::default();
    standby.monitor().register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.contains("nodeaddr_writes_total 0"), "{text}");

    // The leader stops (its election releases the lease); the standby takes over and
    // repairs what a kubelet write drops.
    stop_leader.cancel();
    election_leader.await.unwrap();
    task_leader.await.unwrap();
    eventually(
        "the standby holds the lease",
        Duration::from_secs(20),
        || async { standby.monitor().status().leader },
    )
    .await;
    assert_ne!(holder().await.as_deref(), Some(first.as_str()));
    kubelet_status_write(&api, "w1", 1).await;
    let want = loopback_candidate("w1").to_string();
    eventually("w1 repaired by the new leader", REPAIR_TIMEOUT, || async {
        external_ip(&api, "w1").await.as_deref() == Some(want.as_str())
    })
    .await;
    server.shutdown().await;
}
