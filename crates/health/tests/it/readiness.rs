//! Every readiness transition, observed as a kubelet would: GET /readyz over TCP.

use health::{DeliveryMode, NotReady, Server, Tuning};

use crate::support::{Running, get, start};

async fn readyz(r: &Running) -> u16 {
    get(r.addr, "/readyz").await.status
}

/// Asserts both the wire answer and the logged reason agree.
async fn assert_not_ready(r: &Running, want: NotReady) {
    assert_eq!(readyz(r).await, 503, "expected not ready ({want})");
    assert_eq!(r.server.readiness(), Err(want));
    assert_eq!(
        get(r.addr, "/healthz").await.status,
        200,
        "liveness is constant"
    );
}

async fn assert_ready(r: &Running) {
    assert_eq!(readyz(r).await, 200);
    assert_eq!(r.server.readiness(), Ok(()));
    assert!(r.server.is_ready());
}

fn make_ready(server: &Server) {
    server.set_registered();
    server.set_data_plane_ready();
}

#[tokio::test]
async fn starts_not_ready_and_each_condition_alone_is_not_enough() {
    let r = start(Tuning::default()).await;
    assert_not_ready(&r, NotReady::NotRegistered).await;
    // The delivery mode is seeded, so setting it changes nothing on its own.
    r.server.set_delivery_mode(DeliveryMode::Streaming);
    assert_not_ready(&r, NotReady::NotRegistered).await;
    r.stop().await;

    let r = start(Tuning::default()).await;
    r.server.set_registered();
    assert_not_ready(&r, NotReady::DataPlaneNotEstablished).await;
    r.stop().await;

    let r = start(Tuning::default()).await;
    r.server.set_data_plane_ready();
    r.server.set_delivery_mode(DeliveryMode::Polling);
    assert_not_ready(&r, NotReady::NotRegistered).await;
    // All conditions: ready, in either known mode.
    r.server.set_registered();
    assert_ready(&r).await;
    r.server.set_delivery_mode(DeliveryMode::Streaming);
    assert_ready(&r).await;
    r.stop().await;
}

#[tokio::test]
async fn unknown_delivery_mode_withholds_readiness_until_known_again() {
    let r = start(Tuning::default()).await;
    make_ready(&r.server);
    assert_ready(&r).await;
    r.server.set_delivery_mode(DeliveryMode::Unknown);
    assert_not_ready(&r, NotReady::DeliveryModeUnknown).await;
    r.server.set_delivery_mode(DeliveryMode::Polling);
    assert_ready(&r).await;
    r.stop().await;

    // Unknown before registration: registration alone does not make it ready.
    let r = start(Tuning::default()).await;
    r.server.set_delivery_mode(DeliveryMode::Unknown);
    make_ready(&r.server);
    assert_not_ready(&r, NotReady::DeliveryModeUnknown).await;
    r.stop().await;
}

#[tokio::test]
async fn delivery_stopped_is_permanent() {
    let r = start(Tuning::default()).await;
    make_ready(&r.server);
    assert_ready(&r).await;
    r.server.set_delivery_stopped();
    assert_not_ready(&r, NotReady::DeliveryStopped).await;
    // A later mode change (the engine's last callback) does not bring it back.
    r.server.set_delivery_mode(DeliveryMode::Streaming);
    make_ready(&r.server);
    assert_not_ready(&r, NotReady::DeliveryStopped).await;
    r.stop().await;
}

#[tokio::test]
async fn stopped_subsystem_is_not_ready_forever() {
    let r = start(Tuning::default()).await;
    make_ready(&r.server);
    assert_ready(&r).await;
    r.server.set_subsystem_stopped("firewall");
    let firewall = NotReady::SubsystemStopped {
        names: vec!["firewall".into()],
    };
    assert_not_ready(&r, firewall.clone()).await;
    // Nothing the other subsystems report afterwards revives it.
    make_ready(&r.server);
    r.server.set_delivery_mode(DeliveryMode::Polling);
    r.server.set_subsystem_stopped("firewall");
    assert_not_ready(&r, firewall).await;
    r.server.set_subsystem_stopped("delivery");
    assert_not_ready(
        &r,
        NotReady::SubsystemStopped {
            names: vec!["firewall".into(), "delivery".into()],
        },
    )
    .await;
    r.stop().await;
}

#[tokio::test]
async fn subsystem_stopped_before_registration_wins() {
    let r = start(Tuning::default()).await;
    r.server.set_subsystem_stopped("wireguard");
    make_ready(&r.server);
    assert_not_ready(
        &r,
        NotReady::SubsystemStopped {
            names: vec!["wireguard".into()],
        },
    )
    .await;
    r.stop().await;
}

#[tokio::test]
async fn clones_share_one_state() {
    let r = start(Tuning::default()).await;
    let registration = r.server.clone();
    let data_plane = r.server.clone();
    tokio::spawn(async move { registration.set_registered() })
        .await
        .unwrap();
    assert_eq!(readyz(&r).await, 503);
    tokio::spawn(async move { data_plane.set_data_plane_ready() })
        .await
        .unwrap();
    assert_ready(&r).await;
    r.stop().await;
}

#[tokio::test]
async fn losing_registration_withholds_readiness_until_registered_again() {
    let r = start(Tuning::default()).await;
    make_ready(&r.server);
    assert_ready(&r).await;
    r.server.set_unregistered();
    assert_not_ready(&r, NotReady::NotRegistered).await;
    r.server.set_registered();
    assert_ready(&r).await;
    r.stop().await;
}
