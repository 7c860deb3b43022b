//! Reaching a kubelet: the loopback policy, TLS with the client certificate, and the
//! Go-shaped errors an unreachable kubelet gives.

use super::*;

/// Whether `ip` may be dialed without [`ProxyConfig::allow_non_loopback`].
pub fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.is_loopback(),
            None => v6.is_loopback(),
        },
    }
}

/// Where to dial `host:port`, or the Go-shaped error an unreachable kubelet gives. With
/// `allow_non_loopback` off this never resolves names through DNS (only `localhost`).
pub fn loopback_target(host: &str, port: u16) -> Result<SocketAddr, String> {
    let host_port = join_host_port(host, port);
    let ip = match host.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) if host == "localhost" || host.ends_with(".localhost") => {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        }
        Err(_) => {
            return Err(format!(
                "dial tcp: lookup {host}: not resolved: the API double dials only loopback kubelets, and {host} is a name (not dialed)"
            ));
        }
    };
    if !is_loopback(ip) {
        return Err(format!(
            "dial tcp {host_port}: connect: not dialed: {ip} is outside 127.0.0.0/8 and ::1, and the API double dials only loopback kubelets"
        ));
    }
    Ok(SocketAddr::new(ip, port))
}

pub(super) fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

// ---------------------------------------------------------------------------------------
// The connection.

/// Accepts any kubelet serving certificate (kube-apiserver without a kubelet CA), while
/// still checking the handshake signatures so the session keys are the peer's.
#[derive(Debug)]
pub(super) struct AcceptAnyKubelet(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAnyKubelet {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

pub(super) fn client_tls(cfg: &ProxyConfig, verify: bool) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("kubelet client TLS: {e}"))?;
    let builder = match (&cfg.kubelet_ca, verify) {
        (Some(ca), true) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in rustls_pemfile::certs(&mut ca.as_slice()) {
                let c = c.map_err(|e| format!("kubelet CA bundle: {e}"))?;
                roots
                    .add(c)
                    .map_err(|e| format!("kubelet CA bundle: {e}"))?;
            }
            if roots.is_empty() {
                return Err("kubelet CA bundle holds no certificate".into());
            }
            builder.with_root_certificates(roots)
        }
        _ => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyKubelet(provider))),
    };
    let certs: Vec<CertificateDer<'static>> =
        rustls_pemfile::certs(&mut cfg.client_cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("kubelet client certificate: {e}"))?;
    let key: PrivateKeyDer<'static> =
        rustls_pemfile::private_key(&mut cfg.client_key_pem.as_bytes())
            .map_err(|e| format!("kubelet client key: {e}"))?
            .ok_or("kubelet client key: no private key in PEM")?;
    let mut tls = builder
        .with_client_auth_cert(certs, key)
        .map_err(|e| format!("kubelet client certificate: {e}"))?;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tls)
}

/// An established TLS connection to a kubelet.
pub(super) type KubeletStream = tokio_rustls::client::TlsStream<TcpStream>;

/// Dials the kubelet; the error text is Go-shaped (`dial tcp ...`, `tls: ...`).
pub(super) async fn dial(
    cfg: &ProxyConfig,
    host: &str,
    port: u16,
    verify: bool,
) -> Result<KubeletStream, String> {
    let addr = if cfg.allow_non_loopback {
        match host.parse::<IpAddr>() {
            Ok(ip) => SocketAddr::new(ip, port),
            Err(_) => tokio::net::lookup_host(join_host_port(host, port))
                .await
                .map_err(|e| format!("dial tcp: lookup {host}: {e}"))?
                .next()
                .ok_or_else(|| format!("dial tcp: lookup {host}: no such host"))?,
        }
    } else {
        loopback_target(host, port)?
    };
    let tcp = match tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(addr)).await {
        Err(_) => return Err(format!("dial tcp {addr}: i/o timeout")),
        Ok(Err(e)) => return Err(format!("dial tcp {addr}: connect: {}", go_errno(&e))),
        Ok(Ok(s)) => s,
    };
    let tls = client_tls(cfg, verify)?;
    let name = ServerName::try_from(host.to_string())
        .map_err(|e| format!("tls: invalid server name {host:?}: {e}"))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls));
    match tokio::time::timeout(DIAL_TIMEOUT, connector.connect(name, tcp)).await {
        Err(_) => Err("net/http: TLS handshake timeout".into()),
        Ok(Err(e)) => Err(go_tls_error(&e)),
        Ok(Ok(s)) => Ok(s),
    }
}

pub(super) fn go_errno(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connection refused".into(),
        std::io::ErrorKind::ConnectionReset => "connection reset by peer".into(),
        std::io::ErrorKind::TimedOut => "connection timed out".into(),
        _ => e.to_string(),
    }
}

pub(super) fn go_tls_error(e: &std::io::Error) -> String {
    let inner = e
        .get_ref()
        .and_then(|i| i.downcast_ref::<rustls::Error>())
        .cloned();
    match inner {
        Some(rustls::Error::InvalidCertificate(c)) => {
            format!("tls: failed to verify certificate: {c:?}")
        }
        Some(other) => format!("remote error: tls: {other}"),
        None => format!("tls: {e}"),
    }
}

pub(super) async fn handshake<IO>(
    io: IO,
) -> Result<hyper::client::conn::http1::SendRequest<Body>, hyper::Error>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "kubelet connection ended");
        }
    });
    Ok(send)
}
