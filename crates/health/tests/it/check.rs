//! The background data-plane check: runs on a period, never per request, and a hung check
//! cannot freeze readiness or block probes.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use health::{Config, NotReady, Server, Tuning};
use tokio_util::sync::CancellationToken;

use crate::support::{eventually, get, init_logging, start};

const PERIOD: Duration = Duration::from_secs(10);
const TIMEOUT: Duration = Duration::from_secs(2);

fn ready_server() -> Server {
    init_logging();
    let server = Server::with_tuning(
        Config::default(),
        Tuning {
            check_period: PERIOD,
            check_timeout: TIMEOUT,
            ..Tuning::default()
        },
    );
    server.set_registered();
    server.set_data_plane_ready();
    assert_eq!(server.readiness(), Ok(()));
    server
}

/// Lets the poller run everything due at the current (paused) instant.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

#[tokio::test(start_paused = true)]
async fn check_flips_readiness_both_ways_on_its_period() {
    let server = ready_server();
    let healthy = Arc::new(AtomicBool::new(true));
    let runs = Arc::new(AtomicUsize::new(0));
    let cancel = CancellationToken::new();
    server.set_data_plane_check(cancel.clone(), {
        let healthy = healthy.clone();
        let runs = runs.clone();
        move || {
            runs.fetch_add(1, Ordering::SeqCst);
            let ok = healthy.load(Ordering::SeqCst);
            async move {
                if ok {
                    Ok(())
                } else {
                    Err("interface wg0 not found")
                }
            }
        }
    });
    // Installed but not yet run: not ready, rather than trusting the latch.
    assert_eq!(server.readiness(), Err(NotReady::DataPlaneCheckPending));
    settle().await;
    assert_eq!(server.readiness(), Ok(()));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "first run is immediate");

    healthy.store(false, Ordering::SeqCst);
    // Between runs the last verdict stands.
    tokio::time::sleep(PERIOD - Duration::from_secs(1)).await;
    assert_eq!(server.readiness(), Ok(()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    settle().await;
    assert_eq!(
        server.readiness(),
        Err(NotReady::DataPlaneCheckFailed {
            reason: "interface wg0 not found".into()
        })
    );
    assert!(!server.is_ready());
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    healthy.store(true, Ordering::SeqCst);
    tokio::time::sleep(PERIOD).await;
    settle().await;
    assert_eq!(server.readiness(), Ok(()));
    assert_eq!(runs.load(Ordering::SeqCst), 3);

    // Cancelled: no more runs, the last verdict stays.
    cancel.cancel();
    tokio::time::sleep(PERIOD * 5).await;
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!(server.readiness(), Ok(()));
}

#[tokio::test(start_paused = true)]
async fn a_hung_or_panicking_check_counts_as_failed() {
    let server = ready_server();
    let cancel = CancellationToken::new();
    server.set_data_plane_check(cancel.clone(), || {
        std::future::pending::<Result<(), String>>()
    });
    settle().await;
    assert_eq!(server.readiness(), Err(NotReady::DataPlaneCheckPending));
    tokio::time::sleep(TIMEOUT).await;
    settle().await;
    match server.readiness() {
        Err(NotReady::DataPlaneCheckFailed { reason }) => {
            assert!(reason.contains("did not finish within 2s"), "{reason}")
        }
        other => panic!("expected a timed-out check, got {other:?}"),
    }

    // Replacing the check replaces its verdict; a panic is a failure, not a dead poller.
    let calls = Arc::new(AtomicUsize::new(0));
    server.set_data_plane_check(cancel.clone(), {
        let calls = calls.clone();
        move || {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                assert!(n > 0, "first run panics");
                Ok::<(), String>(())
            }
        }
    });
    settle().await;
    match server.readiness() {
        Err(NotReady::DataPlaneCheckFailed { reason }) => {
            assert!(reason.contains("panicked"), "{reason}")
        }
        other => panic!("expected a panicked check, got {other:?}"),
    }
    tokio::time::sleep(PERIOD).await;
    settle().await;
    assert_eq!(server.readiness(), Ok(()));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    cancel.cancel();
}

#[tokio::test]
async fn probes_never_run_the_check() {
    let r = start(Tuning {
        check_period: Duration::from_secs(3600),
        ..Tuning::default()
    })
    .await;
    r.server.set_registered();
    r.server.set_data_plane_ready();
    let runs = Arc::new(AtomicUsize::new(0));
    let cancel = CancellationToken::new();
    r.server.set_data_plane_check(cancel.clone(), {
        let runs = runs.clone();
        move || {
            runs.fetch_add(1, Ordering::SeqCst);
            async { Ok::<(), String>(()) }
        }
    });
    eventually("the first check run", async || r.server.is_ready()).await;
    for _ in 0..50 {
        assert_eq!(get(r.addr, "/readyz").await.status, 200);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    cancel.cancel();
    r.stop().await;
}

#[tokio::test]
async fn a_stuck_blocking_check_neither_blocks_probes_nor_piles_up() {
    let r = start(Tuning {
        check_period: Duration::from_millis(100),
        check_timeout: Duration::from_millis(200),
        ..Tuning::default()
    })
    .await;
    r.server.set_registered();
    r.server.set_data_plane_ready();
    let (release, stuck) = std::sync::mpsc::channel::<()>();
    let stuck = Arc::new(Mutex::new(stuck));
    let started = Arc::new(AtomicUsize::new(0));
    let cancel = CancellationToken::new();
    r.server.set_data_plane_check_blocking(cancel.clone(), {
        let started = started.clone();
        move || {
            // The first run blocks until released; later runs pass.
            if started.fetch_add(1, Ordering::SeqCst) == 0 {
                stuck.lock().unwrap().recv().map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        }
    });
    // The stuck run times out, and every later run while it is stuck fails at once.
    eventually("later runs refuse to start a second stuck thread", async || {
        matches!(
            r.server.readiness(),
            Err(NotReady::DataPlaneCheckFailed { ref reason }) if reason.contains("still blocked")
        )
    })
    .await;
    // Probes answer while the check is stuck.
    assert_eq!(get(r.addr, "/readyz").await.status, 503);
    assert_eq!(started.load(Ordering::SeqCst), 1, "no second blocking run");

    release.send(()).unwrap();
    eventually("the check recovers once unblocked", async || {
        r.server.is_ready()
    })
    .await;
    assert_eq!(get(r.addr, "/readyz").await.status, 200);
    cancel.cancel();
    r.stop().await;
}
