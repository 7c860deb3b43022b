//! The admin listener: `/metrics` in the Prometheus text format (the `vnode_` metrics).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// Renders the metrics in the Prometheus text exposition format.
pub fn render(m: &Metrics) -> String {
    let mut out = String::new();
    let mut counter = |name: &str, help: &str, v: u64| {
        out.push_str(&format!(
            "# HELP vnode_{name} {help}\n# TYPE vnode_{name} counter\nvnode_{name}_total {v}\n"
        ));
    };
    counter(
        "provisions",
        "Instances provisioned.",
        Metrics::get(&m.provisions),
    );
    counter(
        "terminations",
        "Instances terminated.",
        Metrics::get(&m.terminations),
    );
    counter(
        "readoptions",
        "Pods re-adopted from a provider's list.",
        Metrics::get(&m.readoptions),
    );
    counter(
        "provider_errors",
        "Provider calls that failed.",
        Metrics::get(&m.provider_errors),
    );
    counter(
        "placements",
        "Pods placed on a provider.",
        Metrics::get(&m.placements),
    );
    counter(
        "pod_status_writes",
        "Pod status writes.",
        Metrics::get(&m.status_writes),
    );
    out.push_str(
        "# HELP vnode_pods Pods on the virtual nodes, by phase.\n# TYPE vnode_pods gauge\n",
    );
    for (phase, g) in [
        ("Pending", &m.pods_pending),
        ("Running", &m.pods_running),
        ("Succeeded", &m.pods_succeeded),
        ("Failed", &m.pods_failed),
    ] {
        out.push_str(&format!(
            "vnode_pods{{phase=\"{phase}\"}} {}\n",
            g.load(Ordering::Relaxed)
        ));
    }
    out.push_str(&format!(
        "# HELP vnode_leases_held Provider runners holding their lease.\n# TYPE vnode_leases_held gauge\nvnode_leases_held {}\n",
        m.leases_held.load(Ordering::Relaxed)
    ));
    out.push_str("# EOF\n");
    out
}

/// Serves `/metrics` until `cancel` fires. Each connection gets one request and a 5 s
/// budget; request heads over 8 KiB are refused.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, cancel: CancellationToken) {
    loop {
        let (mut conn, _) = tokio::select! {
            _ = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(_) => continue,
            },
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = conn.read(&mut buf).await?;
                    if n == 0 || head.len() > 8192 {
                        return Ok::<(), std::io::Error>(());
                    }
                    head.extend_from_slice(&buf[..n]);
                }
                let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
                let (status, ctype, body) = if line.starts_with(b"GET /metrics ") {
                    ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", render(&metrics))
                } else {
                    ("404 Not Found", "text/plain", "not found\n".to_string())
                };
                let resp = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                conn.write_all(resp.as_bytes()).await?;
                conn.shutdown().await
            })
            .await;
        });
    }
}
