//! Abuse resistance: slow heads, huge requests, too many connections.

use std::time::Duration;

use health::Tuning;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{PATIENCE, get, read_response, send_raw, start};

/// Reads until the server closes the connection; errors (a reset) count as closed too.
/// Returns what was received.
async fn until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let result = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut got)).await;
    assert!(
        result.is_ok(),
        "the server kept the connection open for {PATIENCE:?}"
    );
    got
}

#[tokio::test]
async fn slow_header_clients_are_dropped() {
    let r = start(Tuning {
        header_read_timeout: Duration::from_millis(300),
        ..Tuning::default()
    })
    .await;

    // Part of a request line, then nothing: the classic slowloris.
    let mut slow = TcpStream::connect(r.addr).await.unwrap();
    slow.write_all(b"GET /heal").await.unwrap();
    let got = until_closed(&mut slow).await;
    assert!(
        !String::from_utf8_lossy(&got).contains("200 OK"),
        "a partial request must not be answered: {got:?}"
    );

    // Complete request line, headers trickling and never finished.
    let mut trickle = TcpStream::connect(r.addr).await.unwrap();
    trickle
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    until_closed(&mut trickle).await;

    // A connection that never sends a byte does not hold its slot either.
    let mut silent = TcpStream::connect(r.addr).await.unwrap();
    until_closed(&mut silent).await;

    // Control: a client that sends its head in time is served.
    assert_eq!(get(r.addr, "/healthz").await.body, b"ok");
    r.stop().await;
}

#[tokio::test]
async fn requests_with_bodies_are_refused_unread() {
    let r = start(Tuning::default()).await;
    // Claims a megabyte and sends none of it: answered at once, nothing buffered.
    let reply = send_raw(
        r.addr,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n",
    )
    .await
    .unwrap();
    assert_eq!(reply.status, 413);
    assert_eq!(reply.body, b"request body not accepted");
    assert_eq!(reply.header("connection"), Some("close"));

    let reply = send_raw(
        r.addr,
        b"POST /readyz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
    )
    .await
    .unwrap();
    assert_eq!(reply.status, 413);

    // An explicit empty body is still a probe.
    let reply = send_raw(
        r.addr,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    assert_eq!((reply.status, reply.body), (200, b"ok".to_vec()));
    r.stop().await;
}

#[tokio::test]
async fn oversized_heads_are_rejected() {
    let r = start(Tuning::default()).await;
    let mut raw = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: ".to_vec();
    raw.extend(std::iter::repeat_n(b'a', 64 * 1024));
    raw.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
    let mut stream = TcpStream::connect(r.addr).await.unwrap();
    // The server may hang up before reading all of it; that is the point.
    let _ = stream.write_all(&raw).await;
    let got = until_closed(&mut stream).await;
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 431"),
        "a 64 KiB head must be refused, got {text:?}"
    );

    let mut many = b"GET /healthz HTTP/1.1\r\nHost: x\r\n".to_vec();
    for i in 0..200 {
        many.extend_from_slice(format!("X-H{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"Connection: close\r\n\r\n");
    let mut stream = TcpStream::connect(r.addr).await.unwrap();
    let _ = stream.write_all(&many).await;
    let got = until_closed(&mut stream).await;
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 431"),
        "200 headers must be refused, got {text:?}"
    );
    // The listener is unharmed.
    assert_eq!(get(r.addr, "/healthz").await.status, 200);
    r.stop().await;
}

/// Issue 17: clients that hold every connection slot (idle keep-alives, heads never
/// sent) must not starve the kubelet's probes. A new connection evicts the oldest one, so
/// a probe always gets through, and the listener still never holds more than its limit.
#[tokio::test]
async fn probes_get_through_when_clients_hold_every_slot() {
    let r = start(Tuning {
        max_connections: 4,
        header_read_timeout: Duration::from_secs(30),
        ..Tuning::default()
    })
    .await;
    let probe = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";

    // Two keep-alive connections, proven served, and two that never send a byte: every
    // slot is held.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(r.addr).await.unwrap();
        stream.write_all(probe).await.unwrap();
        assert_eq!(read_response(&mut stream).await.unwrap().body, b"ok");
        held.push(stream);
    }
    for _ in 0..2 {
        held.push(TcpStream::connect(r.addr).await.unwrap());
    }

    // A probe, and then many more: each one is answered.
    for i in 0..10 {
        let reply = send_raw(
            r.addr,
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap_or_else(|e| panic!("probe {i} got no answer: {e}"));
        assert_eq!(
            (reply.status, reply.body),
            (200, b"ok".to_vec()),
            "probe {i}"
        );
    }

    // The oldest holders were closed to make room.
    let rest = until_closed(&mut held[0]).await;
    assert!(rest.is_empty(), "{rest:?}");
    r.stop().await;
}

#[tokio::test]
async fn a_flood_of_connections_is_bounded_and_the_newest_are_served() {
    let r = start(Tuning {
        max_connections: 4,
        header_read_timeout: Duration::from_secs(30),
        ..Tuning::default()
    })
    .await;
    let probe = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    // Twenty connections opened and kept: only the newest four can still be open.
    let mut flood = Vec::new();
    for _ in 0..20 {
        flood.push(TcpStream::connect(r.addr).await.unwrap());
    }
    // The newest is served.
    let mut newest = flood.pop().unwrap();
    newest.write_all(probe).await.unwrap();
    assert_eq!(read_response(&mut newest).await.unwrap().status, 200);
    // The first sixteen were closed by the server.
    for stream in &mut flood[..16] {
        let got = until_closed(stream).await;
        assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    }
    r.stop().await;
}

#[tokio::test]
async fn long_lived_connections_are_recycled() {
    let r = start(Tuning {
        connection_lifetime: Duration::from_millis(300),
        header_read_timeout: Duration::from_secs(30),
        ..Tuning::default()
    })
    .await;
    let mut stream = TcpStream::connect(r.addr).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_response(&mut stream).await.unwrap().status, 200);
    // Idle on keep-alive past its lifetime: the server hangs up.
    let rest = until_closed(&mut stream).await;
    assert!(rest.is_empty(), "{rest:?}");
    r.stop().await;
}
