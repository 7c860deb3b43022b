//! A tiny HTTP/1.1 client over raw TCP, so tests see exactly the bytes the listener sends
//! and can misbehave (stall, flood, lie about bodies) the way an attacker would.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use health::{Config, Server, Tuning};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Upper bound for anything a test waits on, so a bug fails the test instead of hanging CI.
pub const PATIENCE: Duration = Duration::from_secs(10);

pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("health=debug")
        .with_test_writer()
        .try_init();
}

/// A server listening on a free loopback port, served in a task.
pub struct Running {
    pub server: Server,
    pub addr: SocketAddr,
    pub cancel: CancellationToken,
    pub serving: JoinHandle<Result<(), health::Error>>,
}

pub async fn start(tuning: Tuning) -> Running {
    init_logging();
    let server = Server::with_tuning(
        Config {
            enabled: None,
            listen: "127.0.0.1:0".into(),
        },
        tuning,
    );
    let listener = server.listen().await.expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    let serving = tokio::spawn({
        let server = server.clone();
        let cancel = cancel.clone();
        async move { server.serve(cancel, listener).await }
    });
    Running {
        server,
        addr,
        cancel,
        serving,
    }
}

impl Running {
    pub async fn stop(self) {
        self.cancel.cancel();
        let result = tokio::time::timeout(PATIENCE, self.serving)
            .await
            .expect("serve returns after cancel")
            .expect("serve task did not panic");
        result.expect("serve returns Ok on a clean shutdown");
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    /// Lower-cased names, in order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Headers without `date`, which legitimately changes between responses.
    pub fn stable_headers(&self) -> Vec<(String, String)> {
        self.headers
            .iter()
            .filter(|(n, _)| n != "date")
            .cloned()
            .collect()
    }
}

/// Sends `method path` with `Connection: close` and reads the whole reply.
pub async fn call(addr: SocketAddr, method: &str, path: &str) -> Reply {
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: probe\r\nUser-Agent: kube-probe/1.33\r\nConnection: close\r\n\r\n"
    );
    send_raw(addr, raw.as_bytes()).await.unwrap()
}

pub async fn get(addr: SocketAddr, path: &str) -> Reply {
    call(addr, "GET", path).await
}

/// Writes `raw` and reads until the server closes, then parses one response.
pub async fn send_raw(addr: SocketAddr, raw: &[u8]) -> anyhow::Result<Reply> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(raw).await?;
    let mut bytes = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut bytes))
        .await
        .context("server neither answered nor closed")??;
    // Everything after the head counts as body, so a HEAD reply with trailing bytes shows.
    parse(&bytes, true)
}

/// Reads exactly one response from a keep-alive connection.
pub async fn read_response(stream: &mut TcpStream) -> anyhow::Result<Reply> {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    let fut = async {
        loop {
            if let Some(end) = find_head_end(&bytes) {
                let head = parse(&bytes[..end], false)?;
                let len: usize = head
                    .header("content-length")
                    .context("no content-length")?
                    .parse()?;
                if bytes.len() >= end + len {
                    return parse(&bytes[..end + len], true);
                }
            }
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                bail!("connection closed after {} bytes", bytes.len());
            }
            bytes.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(PATIENCE, fut)
        .await
        .context("no response")?
}

fn find_head_end(bytes: &[u8]) -> Option<usize> {
    bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| p + 4)
}

fn parse(bytes: &[u8], with_body: bool) -> anyhow::Result<Reply> {
    let end = find_head_end(bytes).with_context(|| {
        format!(
            "no complete response head in {:?}",
            String::from_utf8_lossy(bytes)
        )
    })?;
    let head = std::str::from_utf8(&bytes[..end - 4])?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().context("empty response")?;
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    if version != "HTTP/1.1" {
        bail!("unexpected status line {status_line:?}");
    }
    let status = parts.next().context("no status code")?.parse()?;
    let headers = lines
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap_or((l, ""));
            (n.trim().to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    let body = if with_body {
        bytes[end..].to_vec()
    } else {
        Vec::new()
    };
    Ok(Reply {
        status,
        headers,
        body,
    })
}

/// Polls `cond` until it holds or PATIENCE runs out.
pub async fn eventually(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !cond().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
