//! `cargo xtask bench health`: throughput and tail latency of the probe listener, against a
//! bare hyper server answering a constant body, both driven by `wrk` on loopback in the
//! same run. The listener's limits (header timeout, body refusal, connection bound,
//! readiness lookup) should cost next to nothing: target ratio >= 0.9.
//!
//! Besides wrk's requests/s and p99 it reports the servers' CPU time per request (from
//! `/proc/self/stat`; wrk runs in its own process). On a machine shared with other work,
//! throughput and latency move with the neighbours' load while CPU per request barely does,
//! so that is the steadier measure of what the listener's protections cost. It is printed
//! for information; the target applies to throughput and p99.
//!
//! The servers alternate in short paired rounds and the ratio reported is the median of the
//! per-round ratios: on a shared machine, load from other processes drifts, and pairing
//! each health run with a baseline run seconds apart cancels most of that drift.
//!
//! Within a round the order alternates (bare first in odd rounds, health first in even
//! ones) so neither server always runs on the warmer or the quieter side of the pair.
//!
//! Knobs (environment): `HEALTH_BENCH_SECONDS` per run (default 3), `HEALTH_BENCH_CONNECTIONS`
//! (default 32), `HEALTH_BENCH_ROUNDS` (default 8).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::Command;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;

const TARGET: f64 = 0.9;

struct Figures {
    requests_per_sec: f64,
    p99_ms: f64,
    /// Server CPU time (user + system) per request, in microseconds.
    cpu_us: f64,
}

fn main() -> anyhow::Result<()> {
    let seconds = env_or("HEALTH_BENCH_SECONDS", 3)?;
    let connections = env_or("HEALTH_BENCH_CONNECTIONS", 32)?;
    let rounds = env_or("HEALTH_BENCH_ROUNDS", 8)?;
    match Command::new("wrk").arg("--version").output() {
        Ok(_) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            bail!("wrk not found on PATH: apt-get install wrk")
        }
        Err(err) => bail!("cannot run wrk: {err}"),
    }

    // One worker thread for the servers, one wrk thread: on a 2-core machine each gets a
    // core, and both servers run under exactly the same runtime.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let cancel = CancellationToken::new();
    let (baseline, probe) = runtime.block_on(async {
        let baseline = start_baseline(cancel.clone()).await?;
        let probe = start_health(cancel.clone()).await?;
        anyhow::Ok((baseline, probe))
    })?;

    println!(
        "health bench: wrk -t1 -c{connections} -d{seconds}s --latency, {rounds} round(s), servers on 1 tokio worker"
    );
    let mut base_runs = Vec::new();
    let mut health_runs = Vec::new();
    for round in 1..=rounds {
        let (b, h) = if round % 2 == 1 {
            let b = wrk(baseline, "/readyz", connections, seconds)?;
            (b, wrk(probe, "/readyz", connections, seconds)?)
        } else {
            let h = wrk(probe, "/readyz", connections, seconds)?;
            (wrk(baseline, "/readyz", connections, seconds)?, h)
        };
        println!(
            "round {round}: bare {:>7.0} req/s p99 {:>6.2} ms {:>5.2} us cpu/req | health {:>7.0} req/s p99 {:>6.2} ms {:>5.2} us cpu/req",
            b.requests_per_sec, b.p99_ms, b.cpu_us, h.requests_per_sec, h.p99_ms, h.cpu_us,
        );
        base_runs.push(b);
        health_runs.push(h);
    }
    cancel.cancel();
    drop(runtime);

    let (base_rps, base_p99) = (
        median(base_runs.iter().map(|f| f.requests_per_sec)),
        median(base_runs.iter().map(|f| f.p99_ms)),
    );
    let (health_rps, health_p99) = (
        median(health_runs.iter().map(|f| f.requests_per_sec)),
        median(health_runs.iter().map(|f| f.p99_ms)),
    );
    let (base_cpu, health_cpu) = (
        median(base_runs.iter().map(|f| f.cpu_us)),
        median(health_runs.iter().map(|f| f.cpu_us)),
    );
    let pairs = || base_runs.iter().zip(&health_runs);
    let throughput = median(pairs().map(|(b, h)| h.requests_per_sec / b.requests_per_sec));
    // Inverted so that for both ratios higher is better and the same target applies.
    let latency = median(pairs().map(|(b, h)| b.p99_ms / h.p99_ms));
    let cpu = median(pairs().map(|(b, h)| b.cpu_us / h.cpu_us));
    println!();
    println!("medians          req/s       p99 ms   cpu us/req");
    println!("bare hyper   {base_rps:>10.0}   {base_p99:>10.3}   {base_cpu:>10.2}");
    println!("health       {health_rps:>10.0}   {health_p99:>10.3}   {health_cpu:>10.2}");
    println!(
        "throughput ratio (health / bare, median of rounds): {throughput:.3}  target >= {TARGET}  {}",
        verdict(throughput)
    );
    println!(
        "p99 ratio        (bare / health, median of rounds): {latency:.3}  target >= {TARGET}  {}",
        verdict(latency)
    );
    // Informational: the target applies to what a probe sees (throughput and p99). The
    // protections cost CPU per request by design (a header-read timer armed for every
    // request, the content-type header); this line shows how much.
    println!("cpu ratio        (bare / health, median of rounds): {cpu:.3}  (informational)");
    Ok(())
}

fn verdict(ratio: f64) -> &'static str {
    if ratio >= TARGET {
        "MET"
    } else {
        "BELOW TARGET"
    }
}

fn env_or(name: &str, default: u64) -> anyhow::Result<u64> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .with_context(|| format!("{name}={v:?} is not a whole number")),
        Err(_) => Ok(default),
    }
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

async fn start_health(cancel: CancellationToken) -> anyhow::Result<SocketAddr> {
    let server = health::Server::new(health::Config {
        enabled: Some(true),
        listen: "127.0.0.1:0".into(),
    });
    server.set_registered();
    server.set_data_plane_ready();
    anyhow::ensure!(server.is_ready(), "the benchmark server must be ready");
    let listener = server.listen().await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { server.serve(cancel, listener).await });
    Ok(addr)
}

/// The baseline: hyper's HTTP/1 server with default settings and a constant body, nothing
/// else.
async fn start_baseline(cancel: CancellationToken) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                () = cancel.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(_) => continue,
                },
            };
            tokio::spawn(async move {
                let service = service_fn(|_req: Request<hyper::body::Incoming>| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

fn wrk(addr: SocketAddr, path: &str, connections: u64, seconds: u64) -> anyhow::Result<Figures> {
    let url = format!("http://{addr}{path}");
    let cpu_before = process_cpu_seconds()?;
    let output = Command::new("wrk")
        .args([
            "-t1",
            &format!("-c{connections}"),
            &format!("-d{seconds}s"),
            "--latency",
            &url,
        ])
        .output()
        .context("running wrk")?;
    let cpu = process_cpu_seconds()? - cpu_before;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "wrk against {url} failed ({}): {text}{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let (mut figures, requests) =
        parse_wrk(&text).with_context(|| format!("unexpected wrk output for {url}:\n{text}"))?;
    figures.cpu_us = cpu * 1e6 / requests;
    Ok(figures)
}

/// User + system CPU time of this process so far. Only the servers' runtime works while
/// wrk runs; this thread just waits for wrk to exit.
fn process_cpu_seconds() -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the parenthesised command name: state is the first, utime the 12th and
    // stime the 13th, in clock ticks (USER_HZ, 100 on Linux).
    let rest = stat
        .rsplit_once(')')
        .context("unexpected /proc/self/stat")?
        .1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    Ok(ticks / 100.0)
}

/// The figures wrk reports, and the number of requests it completed.
fn parse_wrk(text: &str) -> anyhow::Result<(Figures, f64)> {
    if let Some(line) = text.lines().find(|l| l.contains("Non-2xx")) {
        bail!("the server answered errors: {}", line.trim());
    }
    if let Some(line) = text.lines().find(|l| l.contains("Socket errors")) {
        bail!("wrk saw socket errors: {}", line.trim());
    }
    let requests_per_sec = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Requests/sec:"))
        .context("no Requests/sec line")?
        .trim()
        .parse()?;
    let p99 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("99%"))
        .context("no 99% latency line (was --latency passed?)")?
        .trim();
    let requests: f64 = text
        .lines()
        .find_map(|l| l.split_once(" requests in "))
        .context("no request count line")?
        .0
        .trim()
        .parse()?;
    Ok((
        Figures {
            requests_per_sec,
            p99_ms: duration_ms(p99)?,
            cpu_us: 0.0,
        },
        requests,
    ))
}

/// wrk prints durations as `812.00us`, `1.23ms`, `1.02s` or `2.00m`.
fn duration_ms(s: &str) -> anyhow::Result<f64> {
    let (number, scale) = if let Some(n) = s.strip_suffix("us") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000.0)
    } else {
        bail!("unknown duration {s:?}")
    };
    Ok(number.parse::<f64>()? * scale)
}
