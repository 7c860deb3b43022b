//! HTTP probes, ports, and the agent's configuration for tests.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub use testkube::fixtures::{eventually_within, install_crypto, kubelet_node, require_tool};

/// A port free at the time of the call.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` over a fresh connection: (status, body).
pub async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let mut s = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
        .await??;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await??;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let code: u16 = text
        .split_whitespace()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("no status line in {text:?}"))?
        .parse()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

/// The readiness code, or 0 when the listener does not answer.
pub async fn readyz(addr: SocketAddr) -> (u16, String) {
    get(addr, "/readyz").await.unwrap_or((0, String::new()))
}

/// Agent options with a fast data-plane check.
pub fn fast_options() -> agent::run::RunOptions {
    agent::run::RunOptions {
        health: health::Tuning {
            check_period: Duration::from_millis(200),
            drain_timeout: Duration::from_millis(500),
            ..health::Tuning::default()
        },
    }
}

/// Sets the Ready condition of a Node as its kubelet would.
pub async fn set_ready(
    api: &kube::Api<k8s_openapi::api::core::v1::Node>,
    name: &str,
    status: &str,
) {
    for _ in 0..10 {
        let mut n = api.get(name).await.unwrap();
        for c in n.status.as_mut().unwrap().conditions.as_mut().unwrap() {
            if c.type_ == "Ready" {
                c.status = status.into();
                c.reason = Some(
                    if status == "True" {
                        "KubeletReady"
                    } else {
                        "KubeletNotReady"
                    }
                    .into(),
                );
            }
        }
        match api.replace_status(name, &Default::default(), &n).await {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => panic!("status write for {name}: {e}"),
        }
    }
    panic!("status write for {name} kept conflicting");
}
