//! The HTTPS listener: TLS configuration, connections, and the per-request check of
//! client certificates (an unknown CA is an HTTP 401, not a TLS failure).

use super::*;

type ClientVerifier = Arc<dyn rustls::server::danger::ClientCertVerifier>;

pub(super) fn server_tls(
    serving: &CertPair,
    ca_pem: &str,
    extra_client_cas: &[String],
) -> Result<(Arc<rustls::ServerConfig>, ClientVerifier), StartError> {
    let tls_err = |e: &dyn std::fmt::Display| StartError::Tls(e.to_string());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for pem in std::iter::once(ca_pem).chain(extra_client_cas.iter().map(String::as_str)) {
        for cert in rustls_pemfile::certs(&mut pem.as_bytes()) {
            roots
                .add(cert.map_err(|e| tls_err(&e))?)
                .map_err(|e| tls_err(&e))?;
        }
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| tls_err(&e))?;
    let certs: Vec<CertificateDer<'static>> =
        rustls_pemfile::certs(&mut serving.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| tls_err(&e))?;
    let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut serving.key_pem.as_bytes())
        .map_err(|e| tls_err(&e))?
        .ok_or_else(|| StartError::Tls("the serving key PEM holds no key".into()))?;
    // The handshake accepts any client certificate whose key the client proves it holds;
    // the chain is checked per request, so an unknown CA is an HTTP 401 (kube-apiserver's
    // x509 authenticator), not a TLS failure.
    let lenient = Arc::new(crate::tls::DeferredClientVerifier::new(verifier.clone()));
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err(&e))?
        .with_client_cert_verifier(lenient)
        .with_single_cert(certs, key)
        .map_err(|e| tls_err(&e))?;
    // HTTP/1.1 only: upgrades (exec, attach, port-forward) and chunked watches need it,
    // and Go clients fall back to it without ALPN h2.
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((Arc::new(cfg), verifier))
}

/// What the client certificate of a connection says.
#[derive(Clone, Debug)]
pub(super) enum PeerAuth {
    /// No certificate.
    None,
    /// A certificate that verified: its user.
    User(UserInfo),
    /// A certificate that did not verify (unknown CA, expired, wrong usage).
    Invalid,
}

pub(super) async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    client_verifier: ClientVerifier,
    state: Arc<State>,
    cancel: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => break,
            a = listener.accept() => a,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        let Ok((tcp, _peer)) = accepted else {
            // Out of file descriptors or similar: back off instead of spinning.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let acceptor = acceptor.clone();
        let state = state.clone();
        let cancel = cancel.clone();
        let client_verifier = client_verifier.clone();
        conns.spawn(async move {
            let Ok(Ok(stream)) =
                tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
            else {
                return;
            };
            let peer_user = match stream.get_ref().1.peer_certificates() {
                None | Some([]) => PeerAuth::None,
                Some([ee, intermediates @ ..]) => {
                    let verified = client_verifier.verify_client_cert(
                        ee,
                        intermediates,
                        rustls::pki_types::UnixTime::now(),
                    );
                    match (verified, crate::tls::identity_from_der(ee)) {
                        (Ok(_), Some((name, groups))) => PeerAuth::User(UserInfo {
                            username: name,
                            uid: String::new(),
                            groups,
                        }),
                        _ => PeerAuth::Invalid,
                    }
                }
            };
            let svc = service_fn(move |req| {
                let state = state.clone();
                let peer_user = peer_user.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(state, peer_user, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .with_upgrades();
            tokio::select! {
                _ = conn => {}
                _ = cancel.cancelled() => {}
            }
        });
    }
}
