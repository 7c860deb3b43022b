//! The election and the admin listener against the API double over real HTTPS.

mod admin;
mod lease;

use std::time::Duration;

/// Polls `check` until it holds or `timeout` passes, then fails naming `what`.
pub async fn eventually(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts the API double with rustls' provider installed.
pub async fn api_server() -> testkube::ApiServer {
    let _ = rustls::crypto::ring::default_provider().install_default();
    testkube::ApiServer::start()
        .await
        .expect("API double starts")
}
