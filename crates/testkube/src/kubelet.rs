//! A stub kubelet serving the streaming endpoints, for tests.
//!
//! [`StubKubelet`] listens with HTTPS on a loopback address and answers what the API
//! server's kubelet proxy forwards:
//! - `GET /containerLogs/{ns}/{pod}/{container}`: fixed lines per container (configured
//!   with [`StubKubeletBuilder::logs`], or by default three lines naming the kubelet, so
//!   a test knows which kubelet answered), honouring `tailLines`, `limitBytes`,
//!   `timestamps`, and `follow` (more lines at an interval until the client goes);
//!   `previous=true` fails with 400 like a kubelet with no terminated container;
//! - `/exec/...`, `/attach/...`: an echo process over SPDY/3.1 (`channel.k8s.io` v1-v5)
//!   or WebSocket (`v5.channel.k8s.io`, `v4.channel.k8s.io`, ...), see [`kubestream::echo`];
//! - `/portForward/{ns}/{pod}`: every forwarded connection is echoed (SPDY, or the
//!   WebSocket port-forward protocol).
//!
//! It records every request path and query ([`StubKubelet::requests`]) and counts TCP
//! connections, so tests can assert what reached it and that something did not.

/// The SPDY/3.1 codec (moved to the `kubestream` crate; re-exported for tests).
pub use kubestream::spdy;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_util::sync::CancellationToken;

use crate::body::{Body, full};
use kubestream::channel::{EXEC_PROTOCOLS, ExecRequest, TUNNELED_PORT_FORWARD_PROTOCOL};
use kubestream::echo;
use kubestream::upgrade::{self, Accepted, Transport};

/// Configuration for a [`StubKubelet`].
#[derive(Debug, Clone, Default)]
pub struct StubKubeletBuilder {
    name: Option<String>,
    logs: HashMap<(String, String, String), String>,
    only_configured: bool,
    serving_ca: Option<(String, String)>,
    client_ca: Option<String>,
    follow_interval: Option<Duration>,
}

impl StubKubeletBuilder {
    /// The name the default log lines carry (default `stub-kubelet@ADDR`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The log text of one container (lines separated by `\n`).
    pub fn logs(
        mut self,
        namespace: &str,
        pod: &str,
        container: &str,
        text: impl Into<String>,
    ) -> Self {
        self.logs.insert(
            (namespace.into(), pod.into(), container.into()),
            text.into(),
        );
        self
    }

    /// Answer 404 (as a kubelet does for a pod it does not run) for containers not
    /// configured with [`Self::logs`], instead of the default lines.
    pub fn only_configured_logs(mut self) -> Self {
        self.only_configured = true;
        self
    }

    /// Serve a certificate signed by this CA (PEM cert and key) instead of a
    /// self-signed one, so a client that verifies against the CA accepts it.
    pub fn serving_ca(mut self, ca_cert_pem: &str, ca_key_pem: &str) -> Self {
        self.serving_ca = Some((ca_cert_pem.into(), ca_key_pem.into()));
        self
    }

    /// Require a client certificate that chains to this CA (PEM), as a kubelet with
    /// `--client-ca-file` does.
    pub fn require_client_cert(mut self, ca_pem: &str) -> Self {
        self.client_ca = Some(ca_pem.into());
        self
    }

    /// Interval between lines of a `follow=true` log stream (default 100 ms).
    pub fn follow_interval(mut self, interval: Duration) -> Self {
        self.follow_interval = Some(interval);
        self
    }

    /// Binds `bind` (e.g. `127.0.0.7:0`) and starts serving.
    pub async fn start(self, bind: SocketAddr) -> anyhow::Result<StubKubelet> {
        let listener = TcpListener::bind(bind)
            .await
            .with_context(|| format!("stub kubelet: binding {bind}"))?;
        let addr = listener.local_addr()?;
        let (cert_pem, key_pem) = serving_cert(addr, self.serving_ca.as_ref())?;
        let tls = server_tls(&cert_pem, &key_pem, self.client_ca.as_deref())?;
        let state = Arc::new(State {
            name: self
                .name
                .clone()
                .unwrap_or_else(|| format!("stub-kubelet@{addr}")),
            logs: self.logs,
            only_configured: self.only_configured,
            follow_interval: self.follow_interval.unwrap_or(Duration::from_millis(100)),
            requests: Mutex::new(Vec::new()),
            sessions: Mutex::new(Vec::new()),
            connections: AtomicUsize::new(0),
            open_log_streams: AtomicUsize::new(0),
            open_sessions: AtomicUsize::new(0),
            cancel: CancellationToken::new(),
        });
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let task = tokio::spawn(accept_loop(listener, acceptor, state.clone()));
        Ok(StubKubelet {
            addr,
            cert_pem,
            state,
            task: Some(task),
        })
    }
}

struct State {
    name: String,
    logs: HashMap<(String, String, String), String>,
    only_configured: bool,
    follow_interval: Duration,
    requests: Mutex<Vec<String>>,
    sessions: Mutex<Vec<String>>,
    connections: AtomicUsize,
    open_log_streams: AtomicUsize,
    open_sessions: AtomicUsize,
    cancel: CancellationToken,
}

impl State {
    fn record_session(&self, kind: &str, transport: &str, protocol: &str) {
        self.sessions
            .lock()
            .unwrap()
            .push(format!("{kind} {transport} {protocol}"));
    }
}

/// A running stub kubelet. Dropping it without [`StubKubelet::shutdown`] also stops it.
pub struct StubKubelet {
    addr: SocketAddr,
    cert_pem: String,
    state: Arc<State>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for StubKubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StubKubelet")
            .field("addr", &self.addr)
            .field("name", &self.state.name)
            .finish()
    }
}

impl StubKubelet {
    /// Starts a stub with default settings on `bind`.
    pub async fn start(bind: SocketAddr) -> anyhow::Result<StubKubelet> {
        Self::builder().start(bind).await
    }

    /// A builder for a configured stub.
    pub fn builder() -> StubKubeletBuilder {
        StubKubeletBuilder::default()
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its name, as the default log lines carry it.
    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// The serving certificate (PEM), for a client that wants to pin it.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Path and query of every request it received, in order
    /// (e.g. `/containerLogs/default/web/app?follow=true`).
    pub fn requests(&self) -> Vec<String> {
        self.state.requests.lock().unwrap().clone()
    }

    /// Every upgraded session it accepted, as `"{exec|attach|portForward} {SPDY/3.1|websocket}
    /// {subprotocol}"` (e.g. `exec websocket v5.channel.k8s.io`), so a test can tell which
    /// protocol a client ended up speaking.
    pub fn sessions(&self) -> Vec<String> {
        self.state.sessions.lock().unwrap().clone()
    }

    /// How many TCP connections it accepted (a TLS failure still counts).
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// `follow=true` log streams still open.
    pub fn open_log_streams(&self) -> usize {
        self.state.open_log_streams.load(Ordering::SeqCst)
    }

    /// Upgraded exec/attach/port-forward sessions still running.
    pub fn open_sessions(&self) -> usize {
        self.state.open_sessions.load(Ordering::SeqCst)
    }

    /// The default log text for a container: three lines naming this kubelet.
    pub fn default_log(&self, namespace: &str, pod: &str, container: &str) -> String {
        default_log(&self.state.name, namespace, pod, container)
    }

    /// Stops listening and ends every connection and stream.
    pub async fn shutdown(mut self) {
        self.state.cancel.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for StubKubelet {
    fn drop(&mut self) {
        self.state.cancel.cancel();
    }
}

fn default_log(name: &str, ns: &str, pod: &str, container: &str) -> String {
    (1..=3)
        .map(|i| format!("{name} {ns}/{pod}/{container} line {i}\n"))
        .collect()
}

/// A throwaway CA for tests: `(cert_pem, key_pem)`.
pub fn generate_ca(common_name: &str) -> anyhow::Result<(String, String)> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, common_name);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn serving_cert(
    addr: SocketAddr,
    ca: Option<&(String, String)>,
) -> anyhow::Result<(String, String)> {
    let key = rcgen::KeyPair::generate()?;
    let mut params =
        rcgen::CertificateParams::new(vec![addr.ip().to_string(), "localhost".to_string()])?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("stub-kubelet@{addr}"));
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = match ca {
        None => params.self_signed(&key)?,
        Some((ca_cert, ca_key)) => {
            let ca_key = rcgen::KeyPair::from_pem(ca_key).context("stub kubelet: CA key")?;
            let issuer = rcgen::Issuer::from_ca_cert_pem(ca_cert, ca_key)
                .context("stub kubelet: CA certificate")?;
            params.signed_by(&key, &issuer)?
        }
    };
    Ok((cert.pem(), key.serialize_pem()))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn server_tls(
    cert_pem: &str,
    key_pem: &str,
    client_ca: Option<&str>,
) -> anyhow::Result<rustls::ServerConfig> {
    let certs: Vec<CertificateDer<'static>> =
        rustls_pemfile::certs(&mut cert_pem.as_bytes()).collect::<Result<_, _>>()?;
    let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut key_pem.as_bytes())?
        .context("stub kubelet: no private key in PEM")?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in rustls_pemfile::certs(&mut pem.as_bytes()) {
                roots.add(c?)?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                roots.into(),
                provider(),
            )
            .build()?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut cfg = builder.with_single_cert(certs, key)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    state: Arc<State>,
) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = state.cancel.cancelled() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => {
                let Ok((tcp, _peer)) = accepted else { continue };
                state.connections.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                let state = state.clone();
                conns.spawn(async move {
                    let Ok(Ok(tls)) =
                        tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
                    else {
                        return;
                    };
                    let svc_state = state.clone();
                    let svc = hyper::service::service_fn(move |req| {
                        let state = svc_state.clone();
                        async move { Ok::<_, std::convert::Infallible>(handle(state, req).await) }
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), svc)
                        .with_upgrades();
                    tokio::select! {
                        _ = conn => {}
                        _ = state.cancel.cancelled() => {}
                    }
                });
            }
        }
    }
    conns.shutdown().await;
}

fn text(code: StatusCode, body: impl Into<String>) -> Response<Body> {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(full(body.into()))
        .expect("static response parts are valid")
}

fn flag(pairs: &[(String, String)], key: &str) -> bool {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .is_some_and(|(_, v)| v == "1" || v.eq_ignore_ascii_case("true"))
}

fn value<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    state.requests.lock().unwrap().push(if query.is_empty() {
        path.clone()
    } else {
        format!("{path}?{query}")
    });
    let pairs = crate::query::pairs(&query);
    let segs: Vec<String> = path
        .trim_start_matches('/')
        .split('/')
        .map(crate::query::unescape_path)
        .collect();
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    match segs.as_slice() {
        ["containerLogs", ns, pod, container] => logs(&state, ns, pod, container, &pairs),
        [kind @ ("exec" | "attach"), ns, pod, container, ..] => {
            let exec = ExecRequest {
                kind: kind.to_string(),
                namespace: ns.to_string(),
                pod: pod.to_string(),
                container: container.to_string(),
                command: pairs
                    .iter()
                    .filter(|(k, _)| k == "command")
                    .map(|(_, v)| v.clone())
                    .collect(),
                stdin: flag(&pairs, "input"),
                stdout: flag(&pairs, "output"),
                stderr: flag(&pairs, "error"),
                tty: flag(&pairs, "tty"),
            };
            if !exec.stdin && !exec.stdout && !exec.stderr {
                return text(
                    StatusCode::BAD_REQUEST,
                    "you must specify at least 1 of stdin, stdout, stderr",
                );
            }
            upgrade_exec(state, req, exec)
        }
        ["portForward", _ns, _pod, ..] => {
            let ports: Vec<u16> = pairs
                .iter()
                .filter(|(k, _)| k == "port" || k == "ports")
                .flat_map(|(_, v)| v.split(',').map(str::to_string).collect::<Vec<_>>())
                .filter_map(|p| p.trim().parse().ok())
                .collect();
            upgrade_port_forward(state, req, ports)
        }
        _ => text(StatusCode::NOT_FOUND, "404 page not found\n"),
    }
}

fn logs(
    state: &Arc<State>,
    ns: &str,
    pod: &str,
    container: &str,
    pairs: &[(String, String)],
) -> Response<Body> {
    let key = (ns.to_string(), pod.to_string(), container.to_string());
    let text_body = match state.logs.get(&key) {
        Some(t) => t.clone(),
        None if state.only_configured => {
            if !state.logs.keys().any(|(n, p, _)| n == ns && p == pod) {
                return text(
                    StatusCode::NOT_FOUND,
                    format!("pod \"{pod}\" does not exist\n"),
                );
            }
            return text(
                StatusCode::NOT_FOUND,
                format!("container \"{container}\" not found in pod \"{pod}\"\n"),
            );
        }
        None => default_log(&state.name, ns, pod, container),
    };
    if flag(pairs, "previous") {
        return text(
            StatusCode::BAD_REQUEST,
            format!("previous terminated container \"{container}\" in pod \"{pod}\" not found"),
        );
    }
    let timestamps = flag(pairs, "timestamps");
    let stamp = move |line: &str| {
        if timestamps {
            format!("{:.9} {line}", jiff::Timestamp::now())
        } else {
            line.to_string()
        }
    };
    let mut lines: Vec<String> = text_body.split_inclusive('\n').map(stamp).collect();
    if let Some(n) = value(pairs, "tailLines").and_then(|v| v.parse::<i64>().ok())
        && n >= 0
        && (n as usize) < lines.len()
    {
        lines.drain(..lines.len() - n as usize);
    }
    let mut limit = value(pairs, "limitBytes")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(usize::MAX);
    let mut initial = lines.concat().into_bytes();
    if initial.len() > limit {
        initial.truncate(limit);
    }
    limit -= initial.len();
    let follow = flag(pairs, "follow");
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let state2 = state.clone();
    let label = format!("{} {ns}/{pod}/{container}", state.name);
    tokio::spawn(async move {
        if tx.send(initial.into()).await.is_err() || !follow || limit == 0 {
            return;
        }
        state2.open_log_streams.fetch_add(1, Ordering::SeqCst);
        let mut n = 0u64;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(state2.follow_interval) => {}
                _ = tx.closed() => break,
                _ = state2.cancel.cancelled() => break,
            }
            n += 1;
            let line = stamp(&format!("{label} follow {n}\n"));
            let mut bytes = line.into_bytes();
            if bytes.len() > limit {
                bytes.truncate(limit);
            }
            limit -= bytes.len();
            if tx.send(bytes.into()).await.is_err() || limit == 0 {
                break;
            }
        }
        state2.open_log_streams.fetch_sub(1, Ordering::SeqCst);
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, crate::body::BoxError>(Frame::data(b)), rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/plain")
        .body(StreamBody::new(stream).boxed())
        .expect("static response parts are valid")
}

fn switching(accepted: &Accepted) -> Response<Body> {
    accepted.response().map(|()| crate::body::empty())
}

fn upgrade_exec(
    state: Arc<State>,
    mut req: Request<Incoming>,
    exec: ExecRequest,
) -> Response<Body> {
    let on_upgrade = hyper::upgrade::on(&mut req);
    let accepted = match upgrade::exec(req.headers(), EXEC_PROTOCOLS, EXEC_PROTOCOLS) {
        Ok(a) => a,
        Err(r) => return text(r.status, r.message),
    };
    state.record_session(&exec.kind, accepted.transport.as_str(), &accepted.protocol);
    let protocol = accepted.protocol.clone();
    match accepted.transport {
        Transport::Spdy => spawn_session(&state, async move {
            let io = TokioIo::new(on_upgrade.await?);
            echo::spdy_exec(io, exec, protocol).await?;
            Ok(())
        }),
        Transport::WebSocket => spawn_session(&state, async move {
            let io = TokioIo::new(on_upgrade.await?);
            let ws = WebSocketStream::from_raw_socket(io, Role::Server, None).await;
            echo::ws_exec(ws, exec, protocol).await?;
            Ok(())
        }),
    }
    switching(&accepted)
}

fn upgrade_port_forward(
    state: Arc<State>,
    mut req: Request<Incoming>,
    ports: Vec<u16>,
) -> Response<Body> {
    let on_upgrade = hyper::upgrade::on(&mut req);
    let accepted = match upgrade::port_forward(req.headers(), !ports.is_empty()) {
        Ok(a) => a,
        Err(r) => return text(r.status, r.message),
    };
    state.record_session(
        "portForward",
        accepted.transport.as_str(),
        &accepted.protocol,
    );
    match accepted.transport {
        Transport::Spdy => spawn_session(&state, async move {
            let io = TokioIo::new(on_upgrade.await?);
            echo::spdy_port_forward(io).await?;
            Ok(())
        }),
        Transport::WebSocket => {
            let tunnelled = accepted.protocol == TUNNELED_PORT_FORWARD_PROTOCOL;
            spawn_session(&state, async move {
                let io = TokioIo::new(on_upgrade.await?);
                let ws = WebSocketStream::from_raw_socket(io, Role::Server, None).await;
                if tunnelled {
                    echo::ws_tunnelled_spdy_port_forward(ws).await?;
                } else {
                    echo::ws_port_forward(ws, ports).await?;
                }
                Ok(())
            })
        }
    }
    switching(&accepted)
}

fn spawn_session<F>(state: &Arc<State>, fut: F)
where
    F: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let state = state.clone();
    state.open_sessions.fetch_add(1, Ordering::SeqCst);
    tokio::spawn(async move {
        tokio::select! {
            res = fut => {
                if let Err(e) = res {
                    tracing::debug!(kubelet = %state.name, error = %e, "stub kubelet session ended with an error");
                }
            }
            _ = state.cancel.cancelled() => {}
        }
        state.open_sessions.fetch_sub(1, Ordering::SeqCst);
    });
}
