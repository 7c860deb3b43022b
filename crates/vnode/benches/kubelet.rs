//! `cargo bench -p vnode --bench kubelet`: exec stdout throughput through the kubelet API
//! (TLS, WebSocket `v5.channel.k8s.io`, the process provider running `dd` writing N zero
//! bytes in 1 MiB blocks) against a raw loopback TCP copy of the same bytes in the same run, and 100
//! concurrent exec sessions. Goal: throughput >= 0.5x the loopback copy. For scale, each
//! round also times the command alone (its stdout pipe read here, no session).
//!
//! `KUBELET_BENCH_BYTES` changes the payload (default 256 MiB), `KUBELET_BENCH_ROUNDS` the
//! number of interleaved exec / loopback rounds whose median ratio is reported (default 9).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use rustls::pki_types::ServerName;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_util::sync::CancellationToken;
use vnode::kubelet::KubeletServer;
use vnode::providers::process::ProcessProvider;
use vnode::{Handler, Metrics};

async fn loopback_copy(bytes: usize) -> Duration {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sender = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let buf = vec![0u8; 32 * 1024];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(buf.len());
            s.write_all(&buf[..n]).await.unwrap();
            left -= n;
        }
    });
    let start = Instant::now();
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0;
    while got < bytes {
        let n = c.read(&mut buf).await.unwrap();
        assert!(n > 0, "loopback copy ended early");
        got += n;
    }
    sender.await.unwrap();
    start.elapsed()
}

/// The exec client's connection, read through a buffer or not.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// The command exec'd for the throughput rounds: `dd` writing 1 MiB blocks of zeros
/// (`KUBELET_BENCH_PRODUCER=head` for `head -c`, which writes 8 KiB at a time and is then
/// itself the bottleneck: its pipe alone runs at about half the loopback copy).
fn producer(bytes: usize) -> Vec<String> {
    if std::env::var("KUBELET_BENCH_PRODUCER").as_deref() == Ok("head") {
        return vec![
            "head".into(),
            "-c".into(),
            bytes.to_string(),
            "/dev/zero".into(),
        ];
    }
    vec![
        "dd".into(),
        "if=/dev/zero".into(),
        "bs=1M".into(),
        format!("count={bytes}"),
        "iflag=count_bytes".into(),
        "status=none".into(),
    ]
}

/// The exec'd command alone, spawned here, its stdout pipe widened to 1 MiB as the process
/// provider widens an exec's and read in 1 MiB reads: what the exec path carries before
/// any session work.
async fn pipe_only(bytes: usize) -> Duration {
    let start = Instant::now();
    let producer = producer(bytes);
    let mut child = tokio::process::Command::new(&producer[0])
        .args(&producer[1..])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let _ = nix::fcntl::fcntl(&out, nix::fcntl::FcntlArg::F_SETPIPE_SZ(1 << 20));
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0;
    loop {
        let n = out.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        got += n;
    }
    assert!(child.wait().await.unwrap().success());
    assert_eq!(got, bytes, "the command wrote {got} of {bytes} bytes");
    start.elapsed()
}

/// One exec of `command` over WebSocket; answers (stdout bytes, error-channel text).
async fn exec(tls: &tokio_rustls::TlsConnector, port: u16, command: &[&str]) -> (usize, String) {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    // rustls reads TLS 4 KiB at a time: read the socket through a buffer, as a client of
    // a fast stream would (kubectl's Go TLS reads what is there), or the client's
    // syscalls, not the server, are what this measures.
    let tcp: Box<dyn Io> = match client_read_buffer() {
        0 => Box::new(tcp),
        n => Box::new(tokio::io::BufReader::with_capacity(n, tcp)),
    };
    let stream = tls
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    let query: String = command
        .iter()
        .map(|c| format!("command={c}&"))
        .collect::<String>();
    let mut req = format!("wss://127.0.0.1:{port}/exec/default/bench/main?{query}output=1")
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "sec-websocket-protocol",
        "v5.channel.k8s.io".parse().unwrap(),
    );
    // The client's read buffer: tungstenite zeroes it before every read, and its 128 KiB
    // default made this client (not the server under test) the largest cost of the run.
    let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .read_buffer_size(16 * 1024);
    let (mut ws, _) = tokio_tungstenite::client_async_with_config(req, stream, Some(config))
        .await
        .unwrap();
    let mut stdout = 0;
    let mut status = String::new();
    while let Some(msg) = ws.next().await {
        match msg {
            Ok(Message::Binary(b)) => match b.first() {
                Some(1) => stdout += b.len() - 1,
                Some(3) => status.push_str(&String::from_utf8_lossy(&b[1..])),
                _ => {}
            },
            Ok(Message::Close(_)) | Err(_) => break,
            _ => {}
        }
    }
    (stdout, status)
}

/// Sorts `v` and answers its median.
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// CPU time used so far by this process (all its threads) and its waited-for children
/// (the exec'd `head`), seconds, from `/proc/self/stat` (clock-tick resolution).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // The fields after the command name (which is in parentheses and may hold spaces):
    // utime, stime, cutime and cstime are the 14th to 17th fields of the whole line.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11..15]
        .iter()
        .map(|f| f.parse::<u64>().unwrap())
        .sum();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100);
    ticks as f64 / hz as f64
}

/// `KUBELET_BENCH_CLIENT_BUFFER`: the exec client's socket read buffer, bytes (default
/// 64 KiB; 0 reads the socket directly).
fn client_read_buffer() -> usize {
    std::env::var("KUBELET_BENCH_CLIENT_BUFFER")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64 * 1024)
}

#[tokio::main]
async fn main() {
    let bytes: usize = std::env::var("KUBELET_BENCH_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256 << 20);
    let state = tempfile::tempdir().unwrap();
    let provider = Arc::new(ProcessProvider::new("bench", state.path()).unwrap());
    let handler = Arc::new(Handler::new(provider, Arc::new(Metrics::default()), None));
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "bench", "namespace": "default", "uid": "bench-uid"},
        "spec": {"containers": [{"name": "main", "image": "none", "command": ["sleep", "600"]}]},
    }))
    .unwrap();
    let instance = handler.create(&pod).await.unwrap();
    let server = Arc::new(KubeletServer::new("127.0.0.1", "127.0.0.1:0", None).unwrap());
    {
        let h = handler.clone();
        server.register("nebula-bench", Arc::new(move || h.clone()));
    }
    let listener = server.bind().await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let cancel = CancellationToken::new();
    tokio::spawn(server.clone().serve(listener, cancel.clone()));
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut server.cert_pem().as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg));

    // Rounds of the two transfers, interleaved (and their order alternated), so the load
    // of this shared machine weighs on both sides of each ratio alike.
    let rounds: usize = std::env::var("KUBELET_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|r| *r > 0)
        .unwrap_or(9);
    let mib = bytes as f64 / (1 << 20) as f64;
    let mut ratios = Vec::with_capacity(rounds);
    let mut cpu_ratios = Vec::with_capacity(rounds);
    let mut pipe_ratios = Vec::with_capacity(rounds);
    let (mut best_exec, mut best_raw) = (0f64, 0f64);
    for round in 0..rounds {
        let exec_once = async {
            let cpu = cpu_seconds();
            let start = Instant::now();
            let argv = producer(bytes);
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            let (got, status) = exec(&tls, port, &argv).await;
            let through = start.elapsed();
            assert_eq!(
                got, bytes,
                "exec delivered {got} of {bytes} bytes; status {status}"
            );
            assert!(status.contains("Success"), "{status}");
            (through, cpu_seconds() - cpu)
        };
        let raw_once = async {
            let cpu = cpu_seconds();
            let took = loopback_copy(bytes).await;
            (took, cpu_seconds() - cpu)
        };
        let ((raw, raw_cpu), (through, exec_cpu)) = if round % 2 == 0 {
            let raw = raw_once.await;
            (raw, exec_once.await)
        } else {
            let through = exec_once.await;
            (raw_once.await, through)
        };
        let pipe = pipe_only(bytes).await;
        let pipe_rate = mib / pipe.as_secs_f64();
        pipe_ratios.push(pipe_rate / (mib / raw.as_secs_f64()));
        let raw_rate = mib / raw.as_secs_f64();
        let exec_rate = mib / through.as_secs_f64();
        let ratio = exec_rate / raw_rate;
        ratios.push(ratio);
        cpu_ratios.push(raw_cpu / exec_cpu);
        best_exec = best_exec.max(exec_rate);
        best_raw = best_raw.max(raw_rate);
        println!(
            "kubelet exec stdout, round {}/{rounds}: {mib:.0} MiB in {:.2}s = {exec_rate:.0} MiB/s (CPU {exec_cpu:.2}s); loopback TCP copy {raw_rate:.0} MiB/s (CPU {raw_cpu:.2}s) -> {ratio:.2}x; the command's pipe alone {pipe_rate:.0} MiB/s",
            round + 1,
            through.as_secs_f64(),
        );
    }
    println!(
        "kubelet exec stdout: the command's pipe alone (no session) against the loopback copy: median {:.2}x",
        median(&mut pipe_ratios)
    );
    println!(
        "kubelet exec stdout: median ratio {:.2}x over {rounds} rounds (min {:.2}x, max {:.2}x; goal >= 0.5x); best rates {best_exec:.0} / {best_raw:.0} MiB/s -> {:.2}x; CPU time, loopback / exec: median {:.2}x",
        median(&mut ratios),
        ratios[0],
        ratios[rounds - 1],
        best_exec / best_raw,
        median(&mut cpu_ratios),
    );

    let start = Instant::now();
    let mut sessions = tokio::task::JoinSet::new();
    for i in 0..100 {
        let tls = tls.clone();
        sessions.spawn(async move {
            let word = format!("s{i}");
            exec(&tls, port, &["echo", &word]).await
        });
    }
    let mut ok = 0;
    while let Some(r) = sessions.join_next().await {
        let (got, status) = r.unwrap();
        if got > 0 && status.contains("Success") {
            ok += 1;
        }
    }
    println!(
        "kubelet exec: 100 concurrent sessions, {ok} completed with output and Success in {:.2}s",
        start.elapsed().as_secs_f64()
    );
    logs_follow_latency(&handler, &tls, port).await;
    cancel.cancel();
    let _ = handler.delete(&pod).await;
    let _ = instance;
}

/// `logs -f` latency: a pod prints the wall-clock time (`date +%s%N`) every 10 ms; a
/// client following its log over TLS takes, for each line, its arrival time minus the
/// time in it (one clock: same machine).
async fn logs_follow_latency(handler: &Arc<Handler>, tls: &tokio_rustls::TlsConnector, port: u16) {
    let samples: usize = std::env::var("KUBELET_BENCH_LOG_LINES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "ticker", "namespace": "default", "uid": "ticker-uid"},
        "spec": {"containers": [{"name": "main", "image": "none",
            "command": ["sh", "-c", "while sleep 0.01; do date +%s%N; done"]}]},
    }))
    .unwrap();
    handler.create(&pod).await.unwrap();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut stream = tls
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    stream
        .write_all(
            b"GET /containerLogs/default/ticker/main?follow=true HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        )
        .await
        .unwrap();
    let mut lat = Vec::with_capacity(samples);
    let mut pending = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    // Lines already in the log when the follow starts are old: skip the first second.
    let start = Instant::now();
    while lat.len() < samples {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
            .await
            .expect("no log line within 10 s")
            .unwrap();
        assert!(n > 0, "the log stream ended");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        pending.extend_from_slice(&buf[..n]);
        while let Some(i) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=i).collect();
            let text = String::from_utf8_lossy(&line);
            // Chunked framing lines (hex sizes) are short; the times have 19 digits.
            if let Ok(t) = text.trim().parse::<u128>()
                && t > 1_000_000_000_000_000_000
                && start.elapsed() > Duration::from_secs(1)
            {
                lat.push(now.saturating_sub(t) as f64 / 1e6);
            }
        }
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize];
    println!(
        "kubelet logs -f: write in the process to the client, {} lines: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        lat.len(),
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
    let _ = handler.delete(&pod).await;
}
