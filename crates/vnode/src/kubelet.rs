//! The kubelet API of the virtual nodes: one HTTPS listener serving `kubectl logs`,
//! `exec`, `attach`, `port-forward` and the node proxy's stats for every provider's node.
//!
//! The API server proxies `pods/log`, `pods/exec`, `pods/attach`, `pods/portforward` and
//! `nodes/proxy` to the kubelet at the Node's address and daemon-endpoint port. A virtual
//! node has no kubelet, so the manager serves those routes itself. The routes carry only
//! namespace, pod and container, so a request is resolved by asking each registered
//! [`Handler`] whether it tracks the pod (at most one does).
//!
//! Routes:
//! - `GET /containerLogs/{ns}/{pod}/{container}`: the provider's [`LogStreamer`](crate::LogStreamer)
//!   with `follow`, `tailLines` (or `tail`), `limitBytes`, `timestamps`, `sinceSeconds`,
//!   `sinceTime`, checked as the kubelet checks `PodLogOptions` (400 when a value does not
//!   decode, 422 when it is out of range); `previous` is 400 (an instance has no earlier run);
//! - `GET|POST /exec/{ns}/{pod}[/{uid}]/{container}?command=..`: the provider's
//!   [`Executor`](crate::Executor), over SPDY/3.1 or WebSocket (the `kubestream` crate),
//!   with a terminal and its resize events for `tty=1`;
//! - `GET|POST /attach/{ns}/{pod}[/{uid}]/{container}`: the provider's
//!   [`Attacher`](crate::Attacher): the instance's own process's output from now on, its
//!   stdin, its terminal's size; Success when the process's output ends;
//! - `GET|POST /portForward/{ns}/{pod}`: the provider's
//!   [`PortForwarder`](crate::PortForwarder), over SPDY/3.1, SPDY tunnelled in WebSocket,
//!   or the WebSocket channel form;
//! - `GET /stats/summary` (the `stats/v1alpha1` Summary) and `GET /metrics/resource` (the
//!   kubelet's resource metrics in Prometheus text) from the providers'
//!   [`StatsSource`](crate::StatsSource);
//! - `GET /pods`: the pods the handlers know, as a `PodList` of names;
//! - `GET /healthz`: `ok`.
//!
//! A pod no handler tracks, one without an instance yet, or one whose provider lacks the
//! capability is a 404 whose text says which.
//!
//! TLS: a self-signed certificate made in memory at start, with the node IP in its
//! subject alternative names (the API server does not verify a kubelet's serving
//! certificate unless it is given `--kubelet-certificate-authority`). Client certificates
//! are required and verified only when a client CA is given. Without one, anything that
//! can reach the port can read logs and RUN COMMANDS in the pods' instances without the
//! API server's RBAC: give the CA that signs the API server's kubelet client
//! certificate, or close the port to everything but the API server (NetworkPolicy,
//! firewall).
//!
//! Optional webhook authorization ([`KubeletServer::with_webhook_authorization`]) asks the
//! API server with a SubjectAccessReview whether the caller (the subject of its client
//! certificate) may do the request: `nodes/proxy` on the pod's node for the pod routes,
//! `nodes/stats` and `nodes/metrics` on every node served for `/stats` and `/metrics`.
//!
//! Not built: bearer-token callers (no TokenReview); the stats routes cannot tell which
//! virtual node a request is for (they share one address), so they answer for all.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use kubestream::exec::{Outcome, ProcessIo, Streams, WS_EXEC_PROTOCOLS};
use kubestream::upgrade;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::handler::{Handler, PodInstance};
use crate::provider::{ByteStream, ExecIo, ExecOutput, InstanceStats, LogOptions, Provider};

/// Where the kubelet API listens by default (a real kubelet's port, so existing
/// NetworkPolicies and habits carry over; the API server dials whatever the Node says).
pub const DEFAULT_KUBELET_ADDR: &str = "0.0.0.0:10250";

type Body = UnsyncBoxBody<Bytes, std::io::Error>;

/// Answers the current handler of a node (a runner replaces its handler each time it
/// starts leading).
pub type HandlerSource = Arc<dyn Fn() -> Arc<Handler> + Send + Sync>;

/// Why the kubelet API cannot start.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// The node IP is not an IP address.
    #[error("node IP {value:?} is not an IP address: set POD_IP to the manager's pod IP")]
    NodeIp {
        /// What was given.
        value: String,
        /// Why it does not parse.
        #[source]
        source: std::net::AddrParseError,
    },
    /// The listen address is not `IP:PORT`.
    #[error("kubelet listen address {value:?} is not IP:PORT (or :PORT)")]
    Addr {
        /// What was given.
        value: String,
        /// Why it does not parse.
        #[source]
        source: std::net::AddrParseError,
    },
    /// The client CA file cannot be read.
    #[error("reading the kubelet client CA {}", path.display())]
    ClientCa {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The client CA file holds no usable certificate.
    #[error("the kubelet client CA {} holds no usable PEM certificate", path.display())]
    ClientCaEmpty {
        /// The file.
        path: PathBuf,
    },
    /// The serving certificate could not be made.
    #[error("making the kubelet serving certificate")]
    Cert(#[source] rcgen::Error),
    /// The TLS configuration was refused.
    #[error("configuring TLS for the kubelet API")]
    Tls(#[source] rustls::Error),
    /// The client certificate verifier could not be built.
    #[error("configuring client certificate verification")]
    Verifier(#[source] rustls::server::VerifierBuilderError),
    /// The listener could not bind.
    #[error("binding the kubelet API on {addr}")]
    Bind {
        /// Where.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The shared kubelet endpoint of every virtual node.
pub struct KubeletServer {
    node_ip: IpAddr,
    addr: SocketAddr,
    cert_pem: String,
    tls: Arc<rustls::ServerConfig>,
    client_ca: bool,
    handlers: RwLock<Vec<(String, HandlerSource)>>,
    authorizer: Option<kube::Client>,
    /// The last CPU reading of each instance, `(time, cpu)` in nanoseconds, for the CPU
    /// rate (`usageNanoCores`) of the next summary.
    cpu_samples: std::sync::Mutex<std::collections::HashMap<String, (u64, u64)>>,
}

/// Who is calling: the subject of the verified client certificate (common name is the
/// user, organizations are the groups, as the API server reads them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The user name.
    pub user: String,
    /// The groups.
    pub groups: Vec<String>,
}

/// The caller named by a client certificate (DER).
pub fn caller_of(cert_der: &[u8]) -> Option<Caller> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der).ok()?;
    let subject = cert.subject();
    let user = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())?
        .to_string();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Some(Caller { user, groups })
}

impl std::fmt::Debug for KubeletServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletServer")
            .field("node_ip", &self.node_ip)
            .field("addr", &self.addr)
            .field("client_ca", &self.client_ca)
            .finish_non_exhaustive()
    }
}

/// ring's suites, AES-128-GCM first. The server picks by its own order
/// (`ignore_client_order`), as a Go TLS server does on hardware with AES instructions:
/// AES-128 is as safe here and cheaper per byte than AES-256 (10 rounds instead of 14),
/// which counts for `exec` and `logs` streams.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites.sort_by_key(|suite| {
        use rustls::CipherSuite as S;
        match suite.suite() {
            S::TLS13_AES_128_GCM_SHA256 => 0,
            S::TLS13_AES_256_GCM_SHA384 => 1,
            S::TLS13_CHACHA20_POLY1305_SHA256 => 2,
            S::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
            | S::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => 3,
            _ => 4,
        }
    });
    Arc::new(provider)
}

/// The encrypted bytes a connection may queue for the socket before a write waits: a
/// large exec or log frame is sealed and handed to the kernel in one `writev` of up to
/// this much, instead of rustls's default 64 KiB at a time.
const TLS_SEND_BUFFER: usize = 256 * 1024;

impl KubeletServer {
    /// Builds the endpoint: `node_ip` is the address the nodes advertise (the manager's
    /// pod IP), `addr` where to listen (`IP:PORT`, or `:PORT` for every address; empty
    /// means [`DEFAULT_KUBELET_ADDR`]), `client_ca` a PEM bundle that client certificates
    /// must chain to. A bad IP, address or CA fails here, at start-up.
    pub fn new(
        node_ip: &str,
        addr: &str,
        client_ca: Option<&Path>,
    ) -> Result<KubeletServer, KubeletError> {
        let ip: IpAddr = node_ip
            .trim()
            .parse()
            .map_err(|source| KubeletError::NodeIp {
                value: node_ip.to_string(),
                source,
            })?;
        let addr_text = match addr.trim() {
            "" => DEFAULT_KUBELET_ADDR.to_string(),
            a if a.starts_with(':') => format!("0.0.0.0{a}"),
            a => a.to_string(),
        };
        let addr: SocketAddr = addr_text.parse().map_err(|source| KubeletError::Addr {
            value: addr.to_string(),
            source,
        })?;
        let key = rcgen::KeyPair::generate().map_err(KubeletError::Cert)?;
        let mut params =
            rcgen::CertificateParams::new(vec![ip.to_string()]).map_err(KubeletError::Cert)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("nebula-kubelet@{ip}"));
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.self_signed(&key).map_err(KubeletError::Cert)?;
        let cert_pem = cert.pem();
        let certs = vec![CertificateDer::from(cert.der().to_vec())];
        let key_der = PrivateKeyDer::try_from(key.serialize_der())
            .map_err(|e| KubeletError::Tls(rustls::Error::General(e.to_string())))?;
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(KubeletError::Tls)?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let pem = std::fs::read(path).map_err(|source| KubeletError::ClientCa {
                    path: path.to_path_buf(),
                    source,
                })?;
                let mut roots = rustls::RootCertStore::empty();
                for c in rustls_pemfile::certs(&mut pem.as_slice()).flatten() {
                    let _ = roots.add(c);
                }
                if roots.is_empty() {
                    return Err(KubeletError::ClientCaEmpty {
                        path: path.to_path_buf(),
                    });
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    roots.into(),
                    provider(),
                )
                .build()
                .map_err(KubeletError::Verifier)?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut tls = builder
            .with_single_cert(certs, key_der)
            .map_err(KubeletError::Tls)?;
        tls.ignore_client_order = true;
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(KubeletServer {
            node_ip: ip,
            addr,
            cert_pem,
            tls: Arc::new(tls),
            client_ca: client_ca.is_some(),
            handlers: RwLock::default(),
            authorizer: None,
            cpu_samples: std::sync::Mutex::default(),
        })
    }

    /// Asks the API server (SubjectAccessReview) whether the caller may do what it asks,
    /// as a kubelet with `--authorization-mode=Webhook` does: `nodes/proxy` for logs,
    /// exec, port-forward and `/pods`, on the pod's node, with the verb of the HTTP
    /// method. Needs a client CA: the caller is the subject of its certificate.
    pub fn with_webhook_authorization(mut self, client: kube::Client) -> KubeletServer {
        self.authorizer = Some(client);
        self
    }

    /// Wires one node's handler in. The node name is only a label (lookup is by pod).
    pub fn register(&self, node: impl Into<String>, handler: HandlerSource) {
        self.handlers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push((node.into(), handler));
    }

    /// The listen address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The serving certificate (PEM), for a client that pins it.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Binds the listen address.
    pub async fn bind(&self) -> Result<TcpListener, KubeletError> {
        TcpListener::bind(self.addr)
            .await
            .map_err(|source| KubeletError::Bind {
                addr: self.addr,
                source,
            })
    }

    /// Serves on `listener` until `cancel` fires; open sessions end with it.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, cancel: CancellationToken) {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.tls.clone());
        if !self.client_ca {
            warn!(
                "kubelet API without a client CA: anything that reaches its port can read logs and run commands in these pods; set --kubelet-client-ca or restrict the port"
            );
        }
        info!(addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(), node_ip = %self.node_ip, "kubelet API listening");
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                accepted = listener.accept() => {
                    let Ok((tcp, peer)) = accepted else { continue };
                    let acceptor = acceptor.clone();
                    let server = self.clone();
                    let cancel = cancel.clone();
                    conns.spawn(async move {
                        let mut tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                            Ok(Ok(tls)) => tls,
                            Ok(Err(e)) => {
                                debug!(%peer, error = %e, "kubelet API: TLS handshake failed");
                                return;
                            }
                            Err(_) => return,
                        };
                        tls.get_mut().1.set_buffer_limit(Some(TLS_SEND_BUFFER));
                        let caller = tls
                            .get_ref()
                            .1
                            .peer_certificates()
                            .and_then(|c| c.first())
                            .and_then(|c| caller_of(c.as_ref()))
                            .map(Arc::new);
                        let svc_cancel = cancel.clone();
                        let svc = hyper::service::service_fn(move |req| {
                            let server = server.clone();
                            let cancel = svc_cancel.clone();
                            let caller = caller.clone();
                            async move { Ok::<_, Infallible>(server.handle(req, caller, cancel).await) }
                        });
                        let conn = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(tls), svc)
                            .with_upgrades();
                        tokio::select! {
                            _ = conn => {}
                            _ = cancel.cancelled() => {}
                        }
                    });
                }
            }
        }
        conns.shutdown().await;
    }

    fn handlers(&self) -> Vec<(String, Arc<Handler>)> {
        self.handlers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(n, h)| (n.clone(), h()))
            .collect()
    }

    /// The node, provider and instance of pod `ns/name`, or the 404 saying why not.
    fn resolve(&self, ns: &str, pod: &str) -> Result<(String, Arc<dyn Provider>, String), Refusal> {
        for (node, handler) in self.handlers() {
            match handler.pod_instance(ns, pod) {
                PodInstance::NotTracked => continue,
                PodInstance::NoInstance => {
                    return Err((
                        StatusCode::NOT_FOUND,
                        format!(
                            "pod {ns}/{pod} on node {node} has no instance yet (still being provisioned)\n"
                        ),
                    ));
                }
                PodInstance::Instance(id) => return Ok((node, handler.provider().clone(), id)),
            }
        }
        Err((
            StatusCode::NOT_FOUND,
            format!("pod {ns}/{pod} is not tracked by any virtual node of this manager\n"),
        ))
    }

    async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        caller: Option<Arc<Caller>>,
        cancel: CancellationToken,
    ) -> Response<Body> {
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or("").to_string();
        let pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let segs: Vec<String> = path
            .trim_start_matches('/')
            .split('/')
            .map(|s| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8_lossy()
                    .into_owned()
            })
            .collect();
        let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
        let method = req.method().clone();
        if let Some(client) = &self.authorizer
            && segs.as_slice() != ["healthz"]
            && let Err((code, msg)) = self
                .authorize(client, caller.as_deref(), &method, &segs)
                .await
        {
            return text(code, msg);
        }
        match (segs.as_slice(), &method) {
            (["healthz"], &Method::GET) => text(StatusCode::OK, "ok"),
            (["pods"], &Method::GET) => self.pods(),
            (["containerLogs", ns, pod, container], &Method::GET) => {
                self.logs(ns, pod, container, &pairs).await
            }
            (["exec", ns, pod, rest @ ..], &Method::GET | &Method::POST)
                if matches!(rest.len(), 1 | 2) =>
            {
                self.exec(req, ns, pod, &pairs, cancel, Session::Exec)
            }
            (["attach", ns, pod, rest @ ..], &Method::GET | &Method::POST)
                if matches!(rest.len(), 1 | 2) =>
            {
                self.exec(req, ns, pod, &pairs, cancel, Session::Attach)
            }
            (["stats", "summary"], &Method::GET) => self.stats_summary().await,
            (["metrics", "resource"], &Method::GET) => self.metrics_resource().await,
            (["portForward", ns, pod], &Method::GET | &Method::POST) => {
                self.port_forward(req, ns, pod, &pairs, cancel)
            }
            (
                [
                    "stats" | "metrics" | "run" | "spec" | "checkpoint" | "configz",
                    ..,
                ],
                _,
            ) => text(
                StatusCode::NOT_FOUND,
                format!(
                    "{path} is not built in this kubelet API (nebula-manager serves /stats/summary and /metrics/resource)\n"
                ),
            ),
            _ => text(StatusCode::NOT_FOUND, "404 page not found\n"),
        }
    }

    /// The webhook decision for one request: the nodes it touches, each asked about.
    async fn authorize(
        &self,
        client: &kube::Client,
        caller: Option<&Caller>,
        method: &Method,
        segs: &[&str],
    ) -> Result<(), Refusal> {
        let Some(caller) = caller else {
            return Err((
                StatusCode::UNAUTHORIZED,
                "Unauthorized: webhook authorization needs a client certificate\n".into(),
            ));
        };
        let nodes: Vec<String> = match segs {
            [_, ns, pod, ..] if !ns.is_empty() && segs[0] != "stats" && segs[0] != "metrics" => {
                match self.resolve(ns, pod) {
                    Ok((node, _, _)) => vec![node],
                    Err(refusal) => return Err(refusal),
                }
            }
            _ => self.handlers().into_iter().map(|(n, _)| n).collect(),
        };
        let subresource = match segs.first() {
            Some(&"stats") => "stats",
            Some(&"metrics") => "metrics",
            Some(&"logs") => "log",
            _ => "proxy",
        };
        let verb = match *method {
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "get",
        };
        use k8s_openapi::api::authorization::v1::{
            ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
        };
        let api: kube::Api<SubjectAccessReview> = kube::Api::all(client.clone());
        for node in nodes {
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(caller.user.clone()),
                    groups: Some(caller.groups.clone()),
                    resource_attributes: Some(ResourceAttributes {
                        verb: Some(verb.into()),
                        resource: Some("nodes".into()),
                        subresource: Some(subresource.into()),
                        name: Some(node.clone()),
                        ..ResourceAttributes::default()
                    }),
                    ..SubjectAccessReviewSpec::default()
                },
                ..SubjectAccessReview::default()
            };
            let answer = api
                .create(&kube::api::PostParams::default(), &review)
                .await
                .map_err(|e| {
                    warn!(error = %crate::chain(&e), "kubelet API: SubjectAccessReview failed");
                    (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "Authorization error: the API server could not be asked\n".to_string(),
                    )
                })?;
            if !answer.status.is_some_and(|s| s.allowed) {
                return Err((
                    StatusCode::FORBIDDEN,
                    format!(
                        "Forbidden (user={}, verb={verb}, resource=nodes, subresource={subresource}, name={node})\n",
                        caller.user
                    ),
                ));
            }
        }
        Ok(())
    }

    fn pods(&self) -> Response<Body> {
        let mut items = Vec::new();
        for (node, handler) in self.handlers() {
            for (ns, name) in handler.pod_names() {
                items.push(serde_json::json!({
                    "metadata": {"name": name, "namespace": ns},
                    "spec": {"nodeName": node},
                }));
            }
        }
        let list = serde_json::json!({
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {},
            "items": items,
        });
        respond(StatusCode::OK, "application/json", full(list.to_string()))
    }

    async fn logs(
        &self,
        ns: &str,
        pod: &str,
        _container: &str,
        pairs: &[(String, String)],
    ) -> Response<Body> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX));
        let opts = match log_options(pairs, now) {
            Ok(o) => o,
            Err((code, msg)) => return text(code, msg),
        };
        let (node, provider, id) = match self.resolve(ns, pod) {
            Ok(r) => r,
            Err((code, msg)) => return text(code, msg),
        };
        let Some(streamer) = provider.log_streamer() else {
            return text(
                StatusCode::NOT_FOUND,
                format!(
                    "provider {} of node {node} does not support logs\n",
                    provider.name()
                ),
            );
        };
        if flag(pairs, "previous") {
            return text(
                StatusCode::BAD_REQUEST,
                format!(
                    "previous terminated container of pod {ns}/{pod} not found: an instance has no earlier run\n"
                ),
            );
        }
        let stream = match streamer.logs(&id, &opts).await {
            Ok(s) => s,
            Err(crate::ProviderError::NotFound(_)) => {
                return text(
                    StatusCode::NOT_FOUND,
                    format!(
                        "pod {ns}/{pod}: instance {id} no longer exists at provider {}\n",
                        provider.name()
                    ),
                );
            }
            Err(e) => {
                return text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("reading the log of pod {ns}/{pod}: {}\n", crate::chain(&e)),
                );
            }
        };
        let s = tokio_util::io::ReaderStream::new(stream).map(|r| r.map(Frame::data));
        respond(
            StatusCode::OK,
            "text/plain",
            StreamBody::new(s).boxed_unsync(),
        )
    }

    fn exec(
        &self,
        mut req: Request<Incoming>,
        ns: &str,
        pod: &str,
        pairs: &[(String, String)],
        cancel: CancellationToken,
        kind: Session,
    ) -> Response<Body> {
        let streams = Streams {
            stdin: flag(pairs, "input") || flag(pairs, "stdin"),
            stdout: flag(pairs, "output") || flag(pairs, "stdout"),
            stderr: flag(pairs, "error") || flag(pairs, "stderr"),
            tty: flag(pairs, "tty"),
        };
        if !streams.stdin && !streams.stdout && !streams.stderr {
            return text(
                StatusCode::BAD_REQUEST,
                "you must specify at least 1 of stdin, stdout, stderr\n",
            );
        }
        let command: Vec<String> = pairs
            .iter()
            .filter(|(k, _)| k == "command")
            .map(|(_, v)| v.clone())
            .collect();
        if kind == Session::Exec && command.is_empty() {
            return text(
                StatusCode::BAD_REQUEST,
                "query parameter command is required\n",
            );
        }
        let (node, provider, id) = match self.resolve(ns, pod) {
            Ok(r) => r,
            Err((code, msg)) => return text(code, msg),
        };
        let missing = match kind {
            Session::Exec => provider.executor().is_none(),
            Session::Attach => provider.attacher().is_none(),
        };
        if missing {
            return text(
                StatusCode::NOT_FOUND,
                format!(
                    "provider {} of node {node} does not support {}\n",
                    provider.name(),
                    kind.as_str()
                ),
            );
        }
        let accepted = match upgrade::exec(
            req.headers(),
            kubestream::channel::EXEC_PROTOCOLS,
            WS_EXEC_PROTOCOLS,
        ) {
            Ok(a) => a,
            Err(r) => return text(r.status, r.message),
        };
        let on_upgrade = hyper::upgrade::on(&mut req);
        let transport = accepted.transport;
        let protocol = accepted.protocol.clone();
        let pod_key = format!("{ns}/{pod}");
        debug!(pod = %pod_key, transport = transport.as_str(), %protocol, kind = kind.as_str(), "streaming session");
        tokio::spawn(async move {
            let session = async {
                let io = TokioIo::new(on_upgrade.await.map_err(|e| e.to_string())?);
                let cmd = command.clone();
                kubestream::exec::serve(io, transport, &protocol, streams, &command, |pio| {
                    run_session(kind, provider, id, cmd, pio)
                })
                .await
                .map_err(|e| crate::chain(&e))
            };
            tokio::select! {
                res = session => {
                    if let Err(e) = res {
                        debug!(pod = %pod_key, error = %e, "exec session ended with an error");
                    }
                }
                _ = cancel.cancelled() => {}
            }
        });
        accepted.response().map(|()| empty())
    }
}

/// What a streaming session runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Session {
    /// A new command (`/exec`).
    Exec,
    /// The instance's own process (`/attach`).
    Attach,
}

impl Session {
    fn as_str(self) -> &'static str {
        match self {
            Session::Exec => "exec",
            Session::Attach => "attach",
        }
    }
}

async fn run_session(
    kind: Session,
    provider: Arc<dyn Provider>,
    id: String,
    command: Vec<String>,
    pio: ProcessIo,
) -> Outcome {
    let (resize_tx, resize_rx) = tokio::sync::mpsc::channel(8);
    let mut sizes = pio.resize;
    if pio.tty {
        tokio::spawn(async move {
            while let Some(size) = sizes.recv().await {
                if resize_tx.send((size.width, size.height)).await.is_err() {
                    break;
                }
            }
        });
    }
    let io = ExecIo {
        stdin: pio.stdin.map(|s| Box::pin(s) as ByteStream),
        stdout: pio.stdout.map(ExecOutput::session),
        stderr: pio.stderr.map(ExecOutput::session),
        tty: pio.tty,
        resize: pio.tty.then_some(resize_rx),
    };
    let result = match kind {
        Session::Exec => match provider.executor() {
            Some(executor) => executor.exec(&id, command, io).await,
            None => Err(crate::ProviderError::Unsupported("exec")),
        },
        // An attach that ends (the process's output ended, or the client's did) is a
        // success, as the kubelet reports it: the process's exit code is not the client's.
        Session::Attach => match provider.attacher() {
            Some(attacher) => attacher.attach(&id, io).await.map(|()| 0),
            None => Err(crate::ProviderError::Unsupported("attach")),
        },
    };
    match result {
        Ok(code) => Outcome::Exited(code),
        Err(e) => Outcome::Failed(crate::chain(&e)),
    }
}

impl KubeletServer {
    fn port_forward(
        &self,
        mut req: Request<Incoming>,
        ns: &str,
        pod: &str,
        pairs: &[(String, String)],
        cancel: CancellationToken,
    ) -> Response<Body> {
        let has_ports = pairs.iter().any(|(k, _)| k == "port" || k == "ports");
        let (node, provider, id) = match self.resolve(ns, pod) {
            Ok(r) => r,
            Err((code, msg)) => return text(code, msg),
        };
        if provider.port_forwarder().is_none() {
            return text(
                StatusCode::NOT_FOUND,
                format!(
                    "provider {} of node {node} does not support port-forward\n",
                    provider.name()
                ),
            );
        }
        let accepted = match upgrade::port_forward(req.headers(), has_ports) {
            Ok(a) => a,
            Err(r) => return text(r.status, r.message),
        };
        let tunnelled = accepted.protocol == kubestream::channel::TUNNELED_PORT_FORWARD_PROTOCOL;
        let ports: Vec<u16> = pairs
            .iter()
            .filter(|(k, _)| k == "port" || k == "ports")
            .flat_map(|(_, v)| v.split(',').map(str::to_string).collect::<Vec<_>>())
            .filter_map(|p| p.trim().parse().ok())
            .collect();
        if accepted.transport == upgrade::Transport::WebSocket && !tunnelled && ports.is_empty() {
            return text(
                StatusCode::BAD_REQUEST,
                "query parameter \"port\" must name ports 1-65535\n",
            );
        }
        let on_upgrade = hyper::upgrade::on(&mut req);
        let transport = accepted.transport;
        let pod_key = format!("{ns}/{pod}");
        debug!(pod = %pod_key, transport = transport.as_str(), protocol = %accepted.protocol, ?ports, "port-forward session");
        let connect = move |port: u16| {
            let provider = provider.clone();
            let id = id.clone();
            async move {
                let Some(pf) = provider.port_forwarder() else {
                    return Err(format!(
                        "provider {} does not support port-forward",
                        provider.name()
                    ));
                };
                pf.connect(&id, port).await.map_err(|e| crate::chain(&e))
            }
        };
        tokio::spawn(async move {
            let session = async {
                let io = TokioIo::new(on_upgrade.await.map_err(|e| e.to_string())?);
                match transport {
                    upgrade::Transport::Spdy => kubestream::portforward::serve_spdy(io, connect)
                        .await
                        .map_err(|e| crate::chain(&e)),
                    upgrade::Transport::WebSocket => {
                        let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
                            io,
                            tokio_tungstenite::tungstenite::protocol::Role::Server,
                            None,
                        )
                        .await;
                        if tunnelled {
                            kubestream::portforward::serve_tunnelled(ws, connect)
                                .await
                                .map_err(|e| crate::chain(&e))
                        } else {
                            kubestream::portforward::serve_channels(ws, ports, connect)
                                .await
                                .map_err(|e| crate::chain(&e))
                        }
                    }
                }
            };
            tokio::select! {
                res = session => {
                    if let Err(e) = res {
                        debug!(pod = %pod_key, error = %e, "port-forward session ended with an error");
                    }
                }
                _ = cancel.cancelled() => {}
            }
        });
        accepted.response().map(|()| empty())
    }
}

/// One pod's figures, as the stats routes report them.
struct PodStats {
    namespace: String,
    pod: String,
    stats: InstanceStats,
    /// CPU rate since the previous reading, nanocores (none on the first).
    nano_cores: Option<u64>,
}

impl KubeletServer {
    /// The stats of every pod whose provider reports them; the nodes that have a stats
    /// capability; whether any reading failed. `None` when no provider has one.
    async fn collect_stats(&self) -> Option<(Vec<PodStats>, Vec<String>, bool)> {
        let mut pods = Vec::new();
        let mut nodes = Vec::new();
        let mut failed = false;
        let mut seen = std::collections::HashSet::new();
        for (node, handler) in self.handlers() {
            let provider = handler.provider().clone();
            let Some(source) = provider.stats() else {
                continue;
            };
            nodes.push(node.clone());
            for (ns, name) in handler.pod_names() {
                let PodInstance::Instance(id) = handler.pod_instance(&ns, &name) else {
                    continue;
                };
                match source.stats(&id).await {
                    Ok(stats) => {
                        seen.insert(id.clone());
                        let nano_cores = {
                            let mut samples =
                                self.cpu_samples.lock().unwrap_or_else(|p| p.into_inner());
                            let now = (stats.timestamp_unix_nanos, stats.cpu_nanos);
                            let rate = samples.get(&id).and_then(|&(t0, c0)| {
                                let dt = now.0.checked_sub(t0).filter(|d| *d > 0)?;
                                let dc = now.1.checked_sub(c0)?;
                                u64::try_from(u128::from(dc) * 1_000_000_000 / u128::from(dt)).ok()
                            });
                            samples.insert(id.clone(), now);
                            rate
                        };
                        pods.push(PodStats {
                            namespace: ns,
                            pod: name,
                            stats,
                            nano_cores,
                        });
                    }
                    Err(crate::ProviderError::NotFound(_)) => {}
                    Err(e) => {
                        failed = true;
                        debug!(pod = %format!("{ns}/{name}"), error = %crate::chain(&e), "reading pod stats");
                    }
                }
            }
        }
        self.cpu_samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, _| seen.contains(id));
        (!nodes.is_empty()).then_some((pods, nodes, failed))
    }

    /// `/stats/summary`: the kubelet's `stats/v1alpha1` Summary. A virtual node has no
    /// machine of its own: its figures are the sums of its pods'. All virtual nodes share
    /// this listener and a request does not say which node it is for, so `node` names the
    /// first node with stats and `pods` holds every node's pods.
    async fn stats_summary(&self) -> Response<Body> {
        let Some((pods, nodes, _)) = self.collect_stats().await else {
            return text(
                StatusCode::NOT_FOUND,
                "no provider of this manager reports stats\n",
            );
        };
        let now = now_nanos();
        let cpu = |t: u64, total: u64, rate: Option<u64>| {
            let mut v =
                serde_json::json!({"time": rfc3339_seconds(t), "usageCoreNanoSeconds": total});
            if let Some(r) = rate {
                v["usageNanoCores"] = r.into();
            }
            v
        };
        let memory = |t: u64, ws: u64, rss: u64| serde_json::json!({"time": rfc3339_seconds(t), "usageBytes": rss, "workingSetBytes": ws, "rssBytes": rss});
        let node_name = nodes.first().cloned().unwrap_or_default();
        let (mut cpu_total, mut ws_total, mut rss_total) = (0u64, 0u64, 0u64);
        let mut rate_total = Some(0u64);
        let mut items = Vec::new();
        for p in &pods {
            let st = &p.stats;
            cpu_total = cpu_total.saturating_add(st.cpu_nanos);
            ws_total = ws_total.saturating_add(st.working_set_bytes);
            rss_total = rss_total.saturating_add(st.memory_bytes);
            rate_total = rate_total
                .zip(p.nano_cores)
                .map(|(a, b)| a.saturating_add(b));
            let t = st.timestamp_unix_nanos;
            let start = st
                .start_time_unix
                .map(|s| rfc3339_seconds(s.saturating_mul(1_000_000_000)));
            let container = st.container.clone().unwrap_or_else(|| p.pod.clone());
            let mut c = serde_json::json!({
                "name": container,
                "cpu": cpu(t, st.cpu_nanos, p.nano_cores),
                "memory": memory(t, st.working_set_bytes, st.memory_bytes),
            });
            let mut item = serde_json::json!({
                "podRef": {"name": p.pod, "namespace": p.namespace, "uid": st.pod_uid.clone().unwrap_or_default()},
                "cpu": cpu(t, st.cpu_nanos, p.nano_cores),
                "memory": memory(t, st.working_set_bytes, st.memory_bytes),
            });
            if let Some(start) = start {
                c["startTime"] = start.clone().into();
                item["startTime"] = start.into();
            }
            item["containers"] = serde_json::json!([c]);
            items.push(item);
        }
        let summary = serde_json::json!({
            "node": {
                "nodeName": node_name,
                "cpu": cpu(now, cpu_total, rate_total.filter(|_| !pods.is_empty())),
                "memory": memory(now, ws_total, rss_total),
            },
            "pods": items,
        });
        respond(
            StatusCode::OK,
            "application/json",
            full(summary.to_string()),
        )
    }

    /// `/metrics/resource`: the kubelet's resource metrics in Prometheus text, what
    /// metrics-server scrapes.
    async fn metrics_resource(&self) -> Response<Body> {
        let Some((pods, _, failed)) = self.collect_stats().await else {
            return text(
                StatusCode::NOT_FOUND,
                "no provider of this manager reports stats\n",
            );
        };
        respond(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            full(resource_metrics(&pods, failed, now_nanos())),
        )
    }
}

fn now_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// `metav1.Time` text: RFC 3339 to the second, UTC.
fn rfc3339_seconds(nanos: u64) -> String {
    let full = crate::providers::rfc3339_nanos(nanos - nanos % 1_000_000_000);
    format!("{}Z", &full[..19])
}

fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn seconds(nanos: u64) -> String {
    format!("{}.{:09}", nanos / 1_000_000_000, nanos % 1_000_000_000)
}

/// The Prometheus text of `/metrics/resource` (the kubelet's metric names and labels).
fn resource_metrics(pods: &[PodStats], failed: bool, now: u64) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let mut family = |name: &str,
                      kind: &str,
                      help: &str,
                      rows: &mut dyn Iterator<Item = (String, String, u64)>| {
        let _ = writeln!(out, "# HELP {name} [STABLE] {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value, t) in rows {
            let _ = writeln!(out, "{name}{labels} {value} {}", t / 1_000_000);
        }
    };
    let cl = |p: &PodStats| {
        format!(
            "{{container=\"{}\",namespace=\"{}\",pod=\"{}\"}}",
            label(p.stats.container.as_deref().unwrap_or(&p.pod)),
            label(&p.namespace),
            label(&p.pod)
        )
    };
    let pl = |p: &PodStats| {
        format!(
            "{{namespace=\"{}\",pod=\"{}\"}}",
            label(&p.namespace),
            label(&p.pod)
        )
    };
    family(
        "container_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the container in core-seconds",
        &mut pods.iter().map(|p| {
            (
                cl(p),
                seconds(p.stats.cpu_nanos),
                p.stats.timestamp_unix_nanos,
            )
        }),
    );
    family(
        "container_memory_working_set_bytes",
        "gauge",
        "Current working set of the container in bytes",
        &mut pods.iter().map(|p| {
            (
                cl(p),
                p.stats.working_set_bytes.to_string(),
                p.stats.timestamp_unix_nanos,
            )
        }),
    );
    family(
        "container_start_time_seconds",
        "gauge",
        "Start time of the container since unix epoch in seconds",
        &mut pods.iter().filter_map(|p| {
            p.stats
                .start_time_unix
                .map(|s| (cl(p), s.to_string(), p.stats.timestamp_unix_nanos))
        }),
    );
    let node_cpu: u64 = pods
        .iter()
        .map(|p| p.stats.cpu_nanos)
        .fold(0, u64::saturating_add);
    let node_ws: u64 = pods
        .iter()
        .map(|p| p.stats.working_set_bytes)
        .fold(0, u64::saturating_add);
    family(
        "node_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the node in core-seconds",
        &mut std::iter::once((String::new(), seconds(node_cpu), now)),
    );
    family(
        "node_memory_working_set_bytes",
        "gauge",
        "Current working set of the node in bytes",
        &mut std::iter::once((String::new(), node_ws.to_string(), now)),
    );
    family(
        "pod_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the pod in core-seconds",
        &mut pods.iter().map(|p| {
            (
                pl(p),
                seconds(p.stats.cpu_nanos),
                p.stats.timestamp_unix_nanos,
            )
        }),
    );
    family(
        "pod_memory_working_set_bytes",
        "gauge",
        "Current working set of the pod in bytes",
        &mut pods.iter().map(|p| {
            (
                pl(p),
                p.stats.working_set_bytes.to_string(),
                p.stats.timestamp_unix_nanos,
            )
        }),
    );
    let _ = writeln!(
        out,
        "# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise"
    );
    let _ = writeln!(out, "# TYPE resource_scrape_error gauge");
    let _ = writeln!(out, "resource_scrape_error {}", u8::from(failed));
    out
}

/// A refusal: the status and the text to answer with.
type Refusal = (StatusCode, String);

fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn empty() -> Body {
    full(Bytes::new())
}

fn text(code: StatusCode, body: impl Into<String>) -> Response<Body> {
    respond(code, "text/plain; charset=utf-8", full(body.into()))
}

/// A response with a status and a content type (no builder: nothing here can fail).
fn respond(code: StatusCode, content_type: &'static str, body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    response
}

fn flag(pairs: &[(String, String)], key: &str) -> bool {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .is_some_and(|(_, v)| v == "1" || v.eq_ignore_ascii_case("true"))
}

/// The options of a `containerLogs` request, checked as the kubelet checks
/// `PodLogOptions`: a value that does not decode is a 400, one that decodes but is out of
/// range (negative `tailLines`, `limitBytes` or `sinceSeconds` below 1, both `sinceSeconds`
/// and `sinceTime`) a 422. `tail` is the old name of `tailLines` (`all` means every line).
/// `now` (nanoseconds since the epoch) anchors `sinceSeconds`.
fn log_options(pairs: &[(String, String)], now: i128) -> Result<LogOptions, Refusal> {
    let bad = |key: &str, v: &str, what: &str| {
        (
            StatusCode::BAD_REQUEST,
            format!("Unable to decode query: {key}={v:?} {what}\n"),
        )
    };
    let invalid = |msg: String| {
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("Invalid request: {msg}\n"),
        )
    };
    let int = |key: &str| -> Result<Option<i64>, Refusal> {
        match value(pairs, key) {
            None => Ok(None),
            Some(v) => v
                .parse::<i64>()
                .map(Some)
                .map_err(|_| bad(key, v, "is not an integer")),
        }
    };
    let tail = match value(pairs, "tail") {
        Some("all") => None,
        Some(v) => Some(
            v.parse::<i64>()
                .map_err(|_| bad("tail", v, "is not an integer"))?,
        ),
        None => int("tailLines")?,
    };
    let limit = int("limitBytes")?;
    let since_seconds = int("sinceSeconds")?;
    let since_time = match value(pairs, "sinceTime") {
        None => None,
        Some(v) => {
            let t = v
                .parse::<k8s_openapi::jiff::Timestamp>()
                .map_err(|_| bad("sinceTime", v, "is not an RFC 3339 time"))?;
            Some(t.as_nanosecond())
        }
    };
    if let Some(t) = tail
        && t < 0
    {
        return Err(invalid(format!(
            "tailLines {t} must be greater than or equal to 0"
        )));
    }
    if let Some(l) = limit
        && l < 1
    {
        return Err(invalid(format!("limitBytes {l} must be greater than 0")));
    }
    if let Some(s) = since_seconds
        && s < 1
    {
        return Err(invalid(format!("sinceSeconds {s} must be greater than 0")));
    }
    if since_seconds.is_some() && since_time.is_some() {
        return Err(invalid(
            "at most one of sinceTime or sinceSeconds may be specified".into(),
        ));
    }
    let since = since_time.or_else(|| since_seconds.map(|s| now - i128::from(s) * 1_000_000_000));
    Ok(LogOptions {
        follow: flag(pairs, "follow"),
        tail_lines: tail.and_then(|t| u64::try_from(t).ok()),
        limit_bytes: limit.and_then(|l| u64::try_from(l).ok()),
        since_unix_nanos: since,
        timestamps: flag(pairs, "timestamps"),
    })
}

fn value<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_ip_and_address_fail_at_start() {
        assert!(matches!(
            KubeletServer::new("not-an-ip", ":10250", None),
            Err(KubeletError::NodeIp { .. })
        ));
        assert!(matches!(
            KubeletServer::new("10.0.0.1", "nowhere:x", None),
            Err(KubeletError::Addr { .. })
        ));
        let s = KubeletServer::new("10.0.0.1", ":0", None).unwrap();
        assert_eq!(s.addr().ip().to_string(), "0.0.0.0");
    }

    #[test]
    fn a_missing_or_empty_client_ca_fails_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("ca.pem");
        assert!(matches!(
            KubeletServer::new("10.0.0.1", ":0", Some(&missing)),
            Err(KubeletError::ClientCa { .. })
        ));
        std::fs::write(&missing, "no pem here").unwrap();
        assert!(matches!(
            KubeletServer::new("10.0.0.1", ":0", Some(&missing)),
            Err(KubeletError::ClientCaEmpty { .. })
        ));
    }

    #[test]
    fn the_serving_certificate_names_the_node_ip() {
        let s = KubeletServer::new("10.1.2.3", ":0", None).unwrap();
        let der = rustls_pemfile::certs(&mut s.cert_pem().as_bytes())
            .next()
            .unwrap()
            .unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let san = cert.subject_alternative_name().unwrap().unwrap();
        let text = format!("{:?}", san.value.general_names);
        assert!(
            text.contains("10.1.2.3") || text.contains("[10, 1, 2, 3]"),
            "{text}"
        );
    }

    #[test]
    fn log_options_are_checked_as_the_kubelet_does() {
        let q = |s: &str| -> Vec<(String, String)> {
            form_urlencoded::parse(s.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        };
        let now = 1_000_000_000_000_000_000i128;
        let ok = log_options(
            &q("tailLines=3&limitBytes=10&sinceSeconds=5&timestamps=true&follow=1"),
            now,
        )
        .unwrap();
        assert_eq!(ok.tail_lines, Some(3));
        assert_eq!(ok.limit_bytes, Some(10));
        assert_eq!(ok.since_unix_nanos, Some(now - 5_000_000_000));
        assert!(ok.timestamps && ok.follow);
        let t = log_options(&q("sinceTime=2023-11-14T22:13:20Z"), now).unwrap();
        assert_eq!(t.since_unix_nanos, Some(1_700_000_000_000_000_000));
        assert_eq!(log_options(&q("tail=all"), now).unwrap().tail_lines, None);
        assert_eq!(log_options(&q("tail=2"), now).unwrap().tail_lines, Some(2));
        for (bad, code) in [
            ("tailLines=x", StatusCode::BAD_REQUEST),
            ("sinceTime=yesterday", StatusCode::BAD_REQUEST),
            ("tailLines=-1", StatusCode::UNPROCESSABLE_ENTITY),
            ("limitBytes=0", StatusCode::UNPROCESSABLE_ENTITY),
            ("sinceSeconds=0", StatusCode::UNPROCESSABLE_ENTITY),
            (
                "sinceSeconds=5&sinceTime=2023-11-14T22:13:20Z",
                StatusCode::UNPROCESSABLE_ENTITY,
            ),
        ] {
            assert_eq!(log_options(&q(bad), now).unwrap_err().0, code, "{bad}");
        }
    }
}
