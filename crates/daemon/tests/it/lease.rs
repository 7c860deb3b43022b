use std::time::Duration;

use daemon::{LeaderElection, LeaseConfig};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio_util::sync::CancellationToken;

use crate::{api_server, eventually};

fn config(identity: &str) -> LeaseConfig {
    LeaseConfig::new("kube-system", "test-lease", identity).with_timings(
        Duration::from_secs(3),
        Duration::from_secs(2),
        Duration::from_millis(300),
    )
}

async fn holder(api: &Api<Lease>) -> Option<String> {
    api.get_opt("test-lease")
        .await
        .expect("lease read")
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

#[tokio::test]
async fn one_leader_and_a_standby_takes_over_after_the_holder_dies() {
    let server = api_server().await;
    let api: Api<Lease> = Api::namespaced(server.client(), "kube-system");

    let stop_a = CancellationToken::new();
    let (a, task_a) = LeaderElection::new(server.client(), config("a"))
        .unwrap()
        .spawn(stop_a.clone());
    eventually("a leads", Duration::from_secs(20), || a.is_leader()).await;

    let stop_b = CancellationToken::new();
    let (b, task_b) = LeaderElection::new(server.client(), config("b"))
        .unwrap()
        .spawn(stop_b.clone());
    // b sees the lease held and stays a follower while a keeps renewing.
    eventually("b reads the lease", Duration::from_secs(20), || {
        b.status().holder.as_deref() == Some("a")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(a.is_leader(), "a renews and keeps the lease");
    assert!(!b.is_leader(), "two leaders at once");
    assert_eq!(holder(&api).await.as_deref(), Some("a"));

    // a dies without releasing (its task aborted, like a SIGKILL): it stops counting itself
    // leader at its renew deadline, before b's takeover after the lease duration.
    task_a.abort();
    let died = tokio::time::Instant::now();
    eventually("b takes over", Duration::from_secs(30), || b.is_leader()).await;
    let took = died.elapsed();
    assert!(!a.is_leader(), "a dead holder still claims to lead");
    assert!(
        took >= Duration::from_secs(2),
        "b took over after {took:?}, before a's lease could have run out"
    );
    assert_eq!(holder(&api).await.as_deref(), Some("b"));
    let transitions = api
        .get("test-lease")
        .await
        .unwrap()
        .spec
        .unwrap()
        .lease_transitions;
    assert_eq!(transitions, Some(1));

    stop_b.cancel();
    task_b.await.unwrap();
    assert_eq!(holder(&api).await, None, "b released the lease on shutdown");
    stop_a.cancel();
}

#[tokio::test]
async fn a_released_lease_is_taken_at_the_next_retry() {
    let server = api_server().await;
    let stop_a = CancellationToken::new();
    let (a, task_a) = LeaderElection::new(server.client(), config("a"))
        .unwrap()
        .spawn(stop_a.clone());
    eventually("a leads", Duration::from_secs(20), || a.is_leader()).await;
    let stop_b = CancellationToken::new();
    let (b, _task_b) = LeaderElection::new(server.client(), config("b"))
        .unwrap()
        .spawn(stop_b.clone());
    eventually("b reads the lease", Duration::from_secs(20), || {
        b.status().holder.as_deref() == Some("a")
    })
    .await;
    stop_a.cancel();
    task_a.await.unwrap();
    assert!(!a.is_leader());
    // Released: b need not wait out the 3 s duration of a's last renewal.
    eventually("b takes over", Duration::from_secs(20), || b.is_leader()).await;
    stop_b.cancel();
}

#[tokio::test]
async fn a_holder_that_cannot_renew_stops_leading() {
    let server = api_server().await;
    let stop = CancellationToken::new();
    let (a, _task) = LeaderElection::new(server.client(), config("a"))
        .unwrap()
        .spawn(stop.clone());
    eventually("a leads", Duration::from_secs(20), || a.is_leader()).await;
    // Every renewal now fails; the handle must turn false at the renew deadline, while the
    // lease object still names a.
    server.inject(testkube::Fault::new(testkube::FaultKind::Status(500)).resource("leases"));
    eventually("a stops leading", Duration::from_secs(20), || {
        !a.is_leader()
    })
    .await;
    server.clear_faults();
    eventually("a leads again", Duration::from_secs(20), || a.is_leader()).await;
    stop.cancel();
}
