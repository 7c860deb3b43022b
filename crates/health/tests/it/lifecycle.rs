//! Binding and shutting down.

use std::time::Duration;

use health::{Config, Error, Server, Tuning};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::{PATIENCE, get, read_response, start};

#[tokio::test]
async fn a_taken_address_fails_fast_naming_it() {
    let r = start(Tuning::default()).await;
    let addr = r.addr.to_string();
    let second = Server::new(Config {
        enabled: Some(true),
        listen: addr.clone(),
    });
    let err = tokio::time::timeout(PATIENCE, second.listen())
        .await
        .expect("listen must not wait for the address to free up")
        .expect_err("the address is taken");
    assert!(matches!(err, Error::AddressInUse { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains(&addr), "{message}");
    assert!(message.contains("already in use"), "{message}");
    // The first listener is unaffected.
    assert_eq!(get(r.addr, "/healthz").await.status, 200);
    r.stop().await;
}

#[tokio::test]
async fn bad_addresses_and_disabled_config_are_clear_errors() {
    let bad = Server::new(Config {
        enabled: None,
        listen: "not-an-address".into(),
    });
    let err = bad.listen().await.unwrap_err();
    assert!(matches!(err, Error::Bind { .. }), "{err:?}");
    assert!(err.to_string().contains("not-an-address"), "{err}");

    let off = Server::new(Config {
        enabled: Some(false),
        listen: "127.0.0.1:0".into(),
    });
    let err = off.listen().await.unwrap_err();
    assert!(matches!(err, Error::Disabled { .. }), "{err:?}");
}

#[test]
fn default_config_listens_on_loopback() {
    let server = Server::new(Config::default());
    assert_eq!(server.config().listen, "127.0.0.1:9101");
    assert_eq!(server.config().enabled, Some(true));
}

#[test]
fn config_reads_the_yaml_field_names() {
    let c: Config = serde_yaml::from_str("enabled: false\nlisten: 0.0.0.0:9200\n").unwrap();
    assert_eq!(c.enabled, Some(false));
    assert_eq!(c.listen, "0.0.0.0:9200");
    let c: Config = serde_yaml::from_str("listen: 127.0.0.1:9300\n").unwrap();
    assert_eq!(c.enabled, None);
    // A typo is an error, not a silently ignored setting.
    let err = serde_yaml::from_str::<Config>("listne: 1.2.3.4:1\n").unwrap_err();
    assert!(err.to_string().contains("listne"), "{err}");
}

#[tokio::test]
async fn shutdown_finishes_in_flight_requests_and_frees_the_port() {
    let r = start(Tuning::default()).await;
    let addr = r.addr;

    // An idle keep-alive connection, and one whose request is half sent.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_response(&mut idle).await.unwrap().status, 200);
    let mut in_flight = TcpStream::connect(addr).await.unwrap();
    in_flight
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // Let the server read the partial head before it is told to stop.
    tokio::time::sleep(Duration::from_millis(200)).await;

    r.cancel.cancel();
    // The idle connection is closed promptly...
    let mut rest = Vec::new();
    tokio::time::timeout(PATIENCE, idle.read_to_end(&mut rest))
        .await
        .expect("idle connection closed on shutdown")
        .unwrap();
    assert!(rest.is_empty());
    // ...while the request in flight still gets its answer, with Connection: close.
    in_flight.write_all(b"\r\n").await.unwrap();
    let reply = read_response(&mut in_flight).await.unwrap();
    assert_eq!(
        (reply.status, reply.body.as_slice()),
        (503, &b"not ready"[..])
    );
    assert_eq!(reply.header("connection"), Some("close"));

    let result = tokio::time::timeout(PATIENCE, r.serving)
        .await
        .expect("serve returns after cancel")
        .unwrap();
    assert!(result.is_ok(), "{result:?}");
    // The port is released: it can be bound again at once, and nothing answers there.
    let again = TcpListener::bind(addr).await.expect("port released");
    drop(again);
    assert!(TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn shutdown_with_no_connections_is_immediate_and_clean() {
    let r = start(Tuning::default()).await;
    assert_eq!(get(r.addr, "/healthz").await.status, 200);
    r.stop().await;
}
