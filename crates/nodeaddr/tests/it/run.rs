//! `Reconciler::run`: watch-driven repair, the liveness snapshot, the logging contract,
//! and recovery from API failures. Each test runs in its own process under nextest, so
//! the process-global snapshot and log capture are the test's own.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use nodeaddr::{Reconciler, first_external_ip, last_status, loopback_candidate, reset_status};
use testkube::{ApiServer, Fault, FaultKind};
use tokio_util::sync::CancellationToken;

use crate::common::*;

/// Generous: the assertion is that repair happens at all without the resync ticker, not
/// how fast (that is the benchmark's job).
const REPAIR_TIMEOUT: Duration = Duration::from_secs(10);

fn spawn_run(r: &Reconciler) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let r = r.clone();
        let cancel = cancel.clone();
        async move { r.run(cancel).await }
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
    reset_status();
    assert_eq!(last_status(), None, "never ran in this process");
    let server = ApiServer::start().await.unwrap();
    let api: Api<Node> = Api::all(server.client());
    create_nodes(&api, (1..=5).map(|i| kubelet_node(&format!("w{i}"), i))).await;
    let mut r = Reconciler::new(server.client());
    // Only the initial tick resyncs; every later repair must come from the watch.
    r.interval = Duration::from_secs(3600);
    let (cancel, task) = spawn_run(&r);

    eventually("initial pass patched every node", REPAIR_TIMEOUT, || {
        all_patched(&r)
    })
    .await;
    let st = last_status().expect("run records a snapshot");
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
    reset_status();
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
    assert_eq!(last_status().unwrap().consecutive_failures, 0);
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
    reset_status();
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

    eventually("three failed passes counted", REPAIR_TIMEOUT, || async {
        last_status().is_some_and(|s| s.consecutive_failures >= 3)
    })
    .await;
    let st = last_status().unwrap();
    assert!(st.started);
    let err = st.last_error.unwrap();
    assert!(err.contains("could not list nodes"), "{err}");
    assert_eq!(
        external_ip(&api, "w1").await,
        None,
        "nothing written while failing"
    );

    server.clear_faults();
    eventually("recovered and patched", REPAIR_TIMEOUT, || async {
        last_status().is_some_and(|s| s.consecutive_failures == 0) && all_patched(&r).await
    })
    .await;
    assert_eq!(last_status().unwrap().last_error, None);

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
    assert_eq!(last_status().unwrap().consecutive_failures, 0);

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
        last_status().is_some_and(|s| s.consecutive_failures == 0)
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
