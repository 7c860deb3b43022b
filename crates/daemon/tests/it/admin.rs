use daemon::AdminServer;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

async fn get(addr: std::net::SocketAddr, request: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test]
async fn metrics_status_and_nothing_else() {
    let mut registry = Registry::with_prefix("demo");
    let passes = Counter::<u64>::default();
    registry.register("passes", "Reconcile passes", passes.clone());
    passes.inc();
    passes.inc();
    let server = AdminServer::new(registry).with_status(|| serde_json::json!({"ok": true}));
    let listener = AdminServer::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(server.serve(listener, cancel.clone()));

    let metrics = get(
        addr,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(metrics.contains("demo_passes_total 2"), "{metrics}");
    assert!(
        metrics.contains("application/openmetrics-text"),
        "{metrics}"
    );
    // A metric changed after the server started shows at the next scrape.
    passes.inc();
    let metrics = get(
        addr,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(metrics.contains("demo_passes_total 3"), "{metrics}");

    let status = get(
        addr,
        "GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert!(status.ends_with(r#"{"ok":true}"#), "{status}");

    let missing = get(
        addr,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    let post = get(
        addr,
        "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    assert!(
        post.to_ascii_lowercase().contains("allow: get, head"),
        "{post}"
    );

    cancel.cancel();
    task.await.unwrap();
    // The port is released on shutdown.
    AdminServer::bind(&addr.to_string()).await.unwrap();
}

#[tokio::test]
async fn a_taken_address_names_itself_and_the_flag() {
    let held = AdminServer::bind("127.0.0.1:0").await.unwrap();
    let addr = held.local_addr().unwrap().to_string();
    let err = AdminServer::bind(&addr).await.unwrap_err().to_string();
    assert!(
        err.contains(&addr) && err.contains("--admin-listen"),
        "{err}"
    );
}
