//! `outpost-agent health` as an operator runs it: a real process on loopback.

use std::net::SocketAddr;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_outpost-agent");
/// Bound on every wait, so a hang fails the test instead of stalling CI.
const PATIENCE: Duration = Duration::from_secs(20);

/// A running `outpost-agent` whose stderr is collected line by line.
struct Agent {
    child: Child,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Agent {
    fn spawn(args: &[&str]) -> Agent {
        let mut child = Command::new(BIN)
            .args(args)
            .args(["--log-level", "info"])
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn outpost-agent");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let sink = stderr.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                sink.lock().unwrap().push(strip_ansi(&line));
            }
        });
        Agent { child, stderr }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    /// Waits for the "serving on http://ADDR" log line and returns ADDR.
    async fn serving_addr(&mut self) -> SocketAddr {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Some(addr) = self.stderr().split_whitespace().find_map(|word| {
                word.strip_prefix("http://")
                    .map(|a| a.trim_end_matches([';', ',']))
                    .and_then(|a| a.parse().ok())
            }) {
                return addr;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "outpost-agent exited ({status}) before serving:\n{}",
                    self.stderr()
                );
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "outpost-agent never logged its address:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn exit(&mut self) -> ExitStatus {
        let status = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("outpost-agent did not exit:\n{}", self.stderr()))
            .unwrap();
        // Let the reader drain the last lines.
        tokio::time::sleep(Duration::from_millis(50)).await;
        status
    }

    fn signal(&self, signal: Signal) {
        let pid = self.child.id().expect("still running") as i32;
        kill(Pid::from_raw(pid), signal).unwrap();
    }
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// GET with `Connection: close`; returns (status, body).
async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, Vec<u8>)> {
    let mut stream = TcpStream::connect(addr).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut bytes = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut bytes)).await??;
    let end = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no response head")?;
    let head = String::from_utf8_lossy(&bytes[..end]);
    let Some(status) = head.split(' ').nth(1).and_then(|s| s.parse().ok()) else {
        bail!("bad status line in {head:?}");
    };
    Ok((status, bytes[end + 4..].to_vec()))
}

#[tokio::test]
async fn serves_probes_refuses_a_taken_address_and_exits_zero_on_sigterm() {
    let mut agent = Agent::spawn(&["health", "--listen", "127.0.0.1:0"]);
    let addr = agent.serving_addr().await;
    assert_eq!(get(addr, "/healthz").await.unwrap(), (200, b"ok".to_vec()));
    // Standalone, nothing registers the node: readiness stays honest.
    assert_eq!(
        get(addr, "/readyz").await.unwrap(),
        (503, b"not ready".to_vec())
    );
    assert_eq!(get(addr, "/metrics").await.unwrap().0, 404);

    let mut second = Agent::spawn(&["health", "--listen", &addr.to_string()]);
    let status = second.exit().await;
    assert!(!status.success(), "a second listener on {addr} must fail");
    let err = second.stderr();
    assert!(
        err.contains(&addr.to_string()),
        "stderr names the address:\n{err}"
    );
    assert!(err.contains("already in use"), "{err}");
    // The first one never noticed.
    assert_eq!(get(addr, "/healthz").await.unwrap().0, 200);

    agent.signal(Signal::SIGTERM);
    let status = agent.exit().await;
    assert_eq!(
        status.code(),
        Some(0),
        "SIGTERM is a clean shutdown:\n{}",
        agent.stderr()
    );
    assert!(
        agent.stderr().contains("health listener stopped"),
        "{}",
        agent.stderr()
    );
    TcpListener::bind(addr)
        .await
        .expect("the port is released on exit");
}

#[tokio::test]
async fn config_file_sets_the_listener_and_the_flag_overrides_it() {
    let dir = tempfile::tempdir().unwrap();
    // An address some other process holds, written into the config file.
    let holder = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let taken = holder.local_addr().unwrap().to_string();
    let path = dir.path().join("agent.yaml");
    std::fs::write(
        &path,
        format!("nodeName: worker-1\nhealth:\n  listen: {taken}\n"),
    )
    .unwrap();
    let config = path.to_str().unwrap();

    let mut from_file = Agent::spawn(&["health", "--config", config]);
    assert!(!from_file.exit().await.success());
    assert!(
        from_file.stderr().contains(&taken),
        "{}",
        from_file.stderr()
    );

    let mut overridden = Agent::spawn(&["health", "--config", config, "--listen", "127.0.0.1:0"]);
    let addr = overridden.serving_addr().await;
    assert_ne!(addr.to_string(), taken);
    assert_eq!(get(addr, "/healthz").await.unwrap().0, 200);
    overridden.signal(Signal::SIGINT);
    assert_eq!(overridden.exit().await.code(), Some(0));
    drop(holder);
}

#[tokio::test]
async fn disabled_listener_exits_zero_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.yaml");
    std::fs::write(&path, "nodeName: worker-1\nhealth:\n  enabled: false\n").unwrap();
    let mut agent = Agent::spawn(&["health", "--config", path.to_str().unwrap()]);
    let status = agent.exit().await;
    assert_eq!(status.code(), Some(0), "{}", agent.stderr());
    assert!(agent.stderr().contains("disabled"), "{}", agent.stderr());
}

#[tokio::test]
async fn bad_config_files_fail_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, "health:\n  enabled: maybe\n").unwrap();
    let missing = dir.path().join("missing.yaml");
    for path in [&broken, &missing] {
        let mut agent = Agent::spawn(&["health", "--config", path.to_str().unwrap()]);
        let status = agent.exit().await;
        assert_eq!(status.code(), Some(1), "{}", agent.stderr());
        assert!(
            agent.stderr().contains(path.to_str().unwrap()),
            "stderr names {}:\n{}",
            path.display(),
            agent.stderr()
        );
    }
}
