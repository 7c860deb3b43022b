//! Live HTTPS servers on loopback for the front and repoint tests: real TLS with
//! certificates from the project's PKI, each answering `/readyz` with 200 and any other
//! path with its own name, so a client can tell which server answered.
//!
//! Addresses: 127.1.N.x, N derived from the process ID and a counter, so parallel test
//! processes (and the etcd harness, which uses 127.0.N.x) never share an address; ports are
//! bound at 0 and the listener is kept, so no other process can take them.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A fresh 127.1.N.0/24 for one test: `ip(host)` is 127.1.N.host.
pub struct Subnet(u8);

impl Subnet {
    /// The next free subnet of this process.
    pub fn next() -> Subnet {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Subnet(
            ((std::process::id()
                .wrapping_mul(31)
                .wrapping_add(n.wrapping_mul(7)))
                % 250
                + 1) as u8,
        )
    }

    /// 127.1.N.host.
    pub fn ip(&self, host: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, 1, self.0, host))
    }
}

/// A serving certificate for `ips`, issued by `ca`.
pub fn serving_cert(ca: &pki::Ca, cn: &str, ips: &[IpAddr]) -> anyhow::Result<pki::IssuedCert> {
    let mut spec = pki::LeafSpec::new(cn, &[pki::Usage::ServerAuth]);
    spec.ips = ips.to_vec();
    Ok(ca.issue(&spec)?)
}

fn server_config(cert: &pki::IssuedCert) -> anyhow::Result<rustls::ServerConfig> {
    let certs: Vec<CertificateDer<'static>> =
        rustls_pemfile::certs(&mut cert.cert_pem.as_bytes()).collect::<Result<_, _>>()?;
    let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut cert.key_pem.as_bytes())?
        .context("no private key in the issued PEM")?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?)
}

/// One HTTPS server; aborted on drop (its listener closes, connections are refused).
pub struct Backend {
    /// Its address.
    pub addr: SocketAddr,
    task: Option<JoinHandle<()>>,
}

impl Backend {
    /// Serves on `ip:0` with `cert`, answering other paths with `name`.
    pub async fn start(ip: IpAddr, cert: &pki::IssuedCert, name: &str) -> anyhow::Result<Backend> {
        let listener = TcpListener::bind((ip, 0))
            .await
            .with_context(|| format!("bind {ip}:0"))?;
        let addr = listener.local_addr()?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config(cert)?));
        let name = name.to_string();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let name = name.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    // One request per connection (Connection: close).
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&buf);
                    let path = head.split_whitespace().nth(1).unwrap_or("/");
                    let body = if path == "/readyz" {
                        "ok".to_string()
                    } else {
                        name
                    };
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = tls.write_all(resp.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        Ok(Backend {
            addr,
            task: Some(task),
        })
    }

    /// Stops accepting: the listener closes, new connections are refused.
    pub async fn kill(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
            let _ = t.await;
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// A TLS client trusting `ca_pem` only.
pub fn connector(ca_pem: &str) -> anyhow::Result<tokio_rustls::TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(c?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// A TLS connection to `addr`, verified as `addr`'s IP.
pub async fn connect(
    tls: &tokio_rustls::TlsConnector,
    addr: SocketAddr,
) -> anyhow::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
        .await
        .context("connect timed out")??;
    let name = ServerName::IpAddress(addr.ip().into());
    Ok(
        tokio::time::timeout(Duration::from_secs(5), tls.connect(name, tcp))
            .await
            .context("handshake timed out")??,
    )
}

/// Sends `GET path` on an open connection and returns the body.
pub async fn request_on(
    stream: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    path: &str,
) -> anyhow::Result<String> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: front\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).await?;
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out)).await;
    // A server that closes without close_notify is an error for rustls; the bytes read
    // before it still count.
    match read {
        Err(_) => bail!("no answer within 10s"),
        Ok(Err(e)) if out.is_empty() => return Err(e.into()),
        Ok(_) => {}
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("not an HTTP answer: {text:?}");
    };
    if !head.starts_with("HTTP/1.1 200") {
        bail!("answer {head:?}");
    }
    Ok(body.to_string())
}

/// One request on a fresh connection.
pub async fn get(
    tls: &tokio_rustls::TlsConnector,
    addr: SocketAddr,
    path: &str,
) -> anyhow::Result<String> {
    let mut s = connect(tls, addr).await?;
    request_on(&mut s, path).await
}
