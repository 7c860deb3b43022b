//! Exec stream throughput and round-trip latency through the API double's kubelet proxy
//! (client → API server TLS → upgrade splice → kubelet TLS → stub kubelet echo), against
//! a baseline measured in the same run: the same SPDY exec stream straight to the stub
//! kubelet. The ratio is what the proxy hop costs. Prints figures and ratios; asserts
//! nothing.
//!
//! `cargo xtask bench kubelet-proxy` (or `cargo bench -p testkube --bench kubelet_proxy`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use serde_json::json;
use testkube::ApiServer;
use testkube::kubelet::StubKubelet;
use testkube::kubelet::spdy::{Codec, FLAG_FIN, Frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

const TOTAL: usize = 64 << 20;
const CHUNK: usize = 16 << 10;
const PINGS: usize = 2000;
const ROUNDS: usize = 3;

type Conn = Framed<tokio_rustls::client::TlsStream<TcpStream>, Codec>;

/// Benchmarks talk to servers with throwaway certificates: verify signatures only.
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCert {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn tls_config(client: Option<&testkube::CertPair>) -> anyhow::Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(provider)));
    let mut cfg = match client {
        None => builder.with_no_client_auth(),
        Some(pair) => {
            let certs = rustls_pemfile::certs(&mut pair.cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()?;
            let key = rustls_pemfile::private_key(&mut pair.key_pem.as_bytes())?
                .context("no key in the admin PEM")?;
            builder.with_client_auth_cert(certs, key)?
        }
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// Opens a SPDY exec session running `cat` and returns it with its stdin and stdout
/// stream ids.
async fn open(addr: SocketAddr, path: &str, tls: rustls::ClientConfig) -> anyhow::Result<Conn> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from(addr.ip().to_string())?;
    let mut io = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(name, tcp)
        .await?;
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
         X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n"
    );
    io.write_all(req.as_bytes()).await?;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(io.read_u8().await?);
    }
    if !head.starts_with(b"HTTP/1.1 101") {
        bail!("upgrade refused: {}", String::from_utf8_lossy(&head));
    }
    let mut conn = Framed::new(io, Codec::new());
    for (id, t) in [(1, "error"), (3, "stdin"), (5, "stdout")] {
        conn.send(Frame::SynStream {
            stream_id: id,
            associated_to: 0,
            priority: 0,
            flags: 0,
            headers: vec![("streamtype".into(), t.into())],
        })
        .await?;
    }
    let mut replies = 0;
    while replies < 3 {
        if let Some(Frame::SynReply { .. }) = conn.next().await.transpose()? {
            replies += 1;
        }
    }
    Ok(conn)
}

/// Pushes TOTAL bytes through the echo; returns MiB/s.
async fn throughput(conn: Conn) -> anyhow::Result<f64> {
    let (mut tx, mut rx) = conn.split();
    let chunk = Bytes::from(vec![0x5a; CHUNK]);
    let start = Instant::now();
    let writer = tokio::spawn(async move {
        let mut sent = 0;
        while sent < TOTAL {
            tx.feed(Frame::Data {
                stream_id: 3,
                flags: 0,
                data: chunk.clone(),
            })
            .await?;
            sent += CHUNK;
        }
        tx.send(Frame::Data {
            stream_id: 3,
            flags: FLAG_FIN,
            data: Bytes::new(),
        })
        .await?;
        Ok::<_, anyhow::Error>(tx)
    });
    let mut got = 0;
    while got < TOTAL {
        match rx.next().await.transpose()? {
            Some(Frame::Data {
                stream_id: 5, data, ..
            }) => got += data.len(),
            Some(_) => {}
            None => bail!("stream ended after {got} bytes"),
        }
    }
    let secs = start.elapsed().as_secs_f64();
    drop(writer.await??);
    Ok(TOTAL as f64 / secs / (1 << 20) as f64)
}

/// One-byte round trips; returns (p50, p99).
async fn latency(mut conn: Conn) -> anyhow::Result<(Duration, Duration)> {
    let mut times = Vec::with_capacity(PINGS);
    for _ in 0..PINGS {
        let start = Instant::now();
        conn.send(Frame::Data {
            stream_id: 3,
            flags: 0,
            data: Bytes::from_static(b"x"),
        })
        .await?;
        loop {
            match conn.next().await.transpose()? {
                Some(Frame::Data { stream_id: 5, .. }) => break,
                Some(_) => {}
                None => bail!("stream ended"),
            }
        }
        times.push(start.elapsed());
    }
    times.sort();
    Ok((times[PINGS / 2], times[PINGS * 99 / 100]))
}

fn main() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let stub = StubKubelet::start("127.0.0.1:0".parse()?).await?;
    let server = ApiServer::start().await?;
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "bench"},
        "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                   "daemonEndpoints": {"kubeletEndpoint": {"Port": stub.addr().port()}}},
    }))?;
    Api::<Node>::all(server.client())
        .create(&PostParams::default(), &node)
        .await?;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"nodeName": "bench", "containers": [{"name": "app", "image": "x"}]},
    }))?;
    Api::<Pod>::namespaced(server.client(), "default")
        .create(&PostParams::default(), &pod)
        .await?;

    let direct_path = "/exec/default/web/app?command=cat&input=1&output=1";
    let proxy_path = "/api/v1/namespaces/default/pods/web/exec?command=cat&stdin=true&stdout=true";
    let admin = server.admin_cert();
    let direct = || open(stub.addr(), direct_path, tls_config(None).unwrap());
    let proxied = || open(server.addr(), proxy_path, tls_config(Some(&admin)).unwrap());

    println!(
        "exec stream echo (SPDY/3.1, `cat` in the stub kubelet), {} MiB in {} KiB DATA frames, best of {ROUNDS}; {PINGS} one-byte round trips",
        TOTAL >> 20,
        CHUNK >> 10
    );
    let (mut d_tp, mut p_tp) = (0f64, 0f64);
    for _ in 0..ROUNDS {
        d_tp = d_tp.max(throughput(direct().await?).await?);
        p_tp = p_tp.max(throughput(proxied().await?).await?);
    }
    let (d50, d99) = latency(direct().await?).await?;
    let (p50, p99) = latency(proxied().await?).await?;
    println!(
        "  {:<38} {:>10} {:>12} {:>12}",
        "path", "MiB/s", "RTT p50 µs", "RTT p99 µs"
    );
    println!(
        "  {:<38} {:>10.1} {:>12} {:>12}",
        "baseline: straight to the stub kubelet",
        d_tp,
        d50.as_micros(),
        d99.as_micros()
    );
    println!(
        "  {:<38} {:>10.1} {:>12} {:>12}",
        "through the API double's proxy",
        p_tp,
        p50.as_micros(),
        p99.as_micros()
    );
    println!(
        "  ratios (proxy / baseline): throughput {:.2}x, RTT p50 {:.2}x, RTT p99 {:.2}x",
        p_tp / d_tp,
        p50.as_secs_f64() / d50.as_secs_f64(),
        p99.as_secs_f64() / d99.as_secs_f64()
    );
    stub.shutdown().await;
    server.shutdown().await;
    Ok(())
}
