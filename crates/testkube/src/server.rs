//! The listener (HTTPS on loopback, optional client certificates), routing, request
//! logging, authentication, fault injection, and the [`ApiServer`] handle tests hold.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::api;
use crate::auth::{self, Attributes, AuthMode, Authorizer, Policy, UserInfo};
use crate::body::{Body, full};
use crate::discovery;
use crate::faults::{Fault, FaultKind, Faults};
use crate::kubeconfig::{self, Credentials};
use crate::resources::{self, Resource};
use crate::status::ApiError;
use crate::store::{Store, res_index};
use crate::tls::{Ca, CertPair};

/// The body size limit: etcd's default request limit is about 1.5 MiB, kube-apiserver
/// allows 3 MiB for JSON; 3 MiB here.
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Binding the listener failed.
    #[error("binding the API double's listener on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Loading the cluster CA of `--pki-dir` failed.
    #[error("loading the cluster CA from {dir}: {message}")]
    Pki {
        /// The directory.
        dir: PathBuf,
        /// What the pki crate reported.
        message: String,
    },
    /// Generating certificates failed.
    #[error(transparent)]
    Cert(#[from] crate::tls::CertError),
    /// Building the TLS configuration failed.
    #[error("building the TLS configuration: {0}")]
    Tls(String),
    /// Writing the kubeconfig failed.
    #[error("writing the kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Loading the written kubeconfig into a kube::Config failed.
    #[error("loading the kubeconfig {path} into kube::Config: {message}")]
    Client {
        /// The path.
        path: PathBuf,
        /// What kube reported.
        message: String,
    },
}

/// One request, as the log records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRecord {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`
    /// (the lowercased method for non-resource requests).
    pub verb: String,
    /// HTTP method.
    pub method: String,
    /// URL path.
    pub path: String,
    /// Raw query string.
    pub query: String,
    /// Plural resource ("" for discovery and other non-resource paths).
    pub resource: String,
    /// Subresource.
    pub subresource: Option<String>,
    /// Namespace.
    pub namespace: Option<String>,
    /// Object name.
    pub name: Option<String>,
    /// HTTP status answered (200 for a watch that started).
    pub code: u16,
}

impl RequestRecord {
    /// Whether the request asked to change something.
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }
}

/// Settings for the kubelet proxy (fed into `proxy::ProxyConfig`).
#[derive(Clone, Debug, Default)]
pub(crate) struct KubeletSettings {
    pub preferred_address_types: Option<Vec<String>>,
    pub kubelet_ca: Option<Vec<u8>>,
    pub allow_non_loopback: bool,
}

/// State shared by every connection.
pub struct State {
    pub(crate) store: Arc<Store>,
    pub(crate) faults: Faults,
    pub(crate) log: Mutex<Vec<RequestRecord>>,
    pub(crate) policy: Policy,
    pub(crate) bookmark_interval: Duration,
    pub(crate) gc_kick: Notify,
    pub(crate) server_address: Mutex<String>,
    pub(crate) proxy_config: crate::proxy_seam::ProxyHolder,
    /// Whether anonymous callers may read `kube-public/cluster-info` (with the signer).
    pub(crate) cluster_info_public: bool,
}

impl State {
    pub(crate) fn notify(&self) {
        let rv = self.store.lock().rv();
        self.store.notify(rv);
    }

    pub(crate) fn kick_gc(&self) {
        self.gc_kick.notify_one();
    }

    /// The user a bearer token names: a configured token or a valid bootstrap token
    /// (looked up as `kube-system/bootstrap-token-<id>`), with `system:authenticated`.
    pub(crate) fn authenticate_token(&self, token: &str) -> Option<UserInfo> {
        if let Some(u) = self.policy.tokens.get(token) {
            return Some(auth::with_authenticated_group(u.clone()));
        }
        let (id, secret) = crate::bootstrap::parse_token(token)?;
        let s = self.store.lock().get(
            res_index(resources::find("", "v1", "secrets").expect("served")),
            "kube-system",
            &format!("bootstrap-token-{id}"),
        )?;
        crate::bootstrap::authenticate(&s, id, secret, chrono::Utc::now().timestamp())
            .map(auth::with_authenticated_group)
    }

    fn log(&self, rec: RequestRecord) {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).push(rec);
    }
}

/// Builds an [`ApiServer`].
#[derive(Default)]
pub struct Builder {
    listen: Option<SocketAddr>,
    kubeconfig_path: Option<PathBuf>,
    mode: AuthMode,
    tokens: HashMap<String, UserInfo>,
    authorizer: Option<Authorizer>,
    client_cas: Vec<String>,
    bookmark_interval: Option<Duration>,
    window: Option<usize>,
    token_cleaner: Option<Duration>,
    token_cleaner_off: bool,
    scheduler: bool,
    bootstrap_signer: bool,
    pki_dir: Option<PathBuf>,
    kubelet: KubeletSettings,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("listen", &self.listen)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl Builder {
    /// Listen here instead of 127.0.0.1 on a free port.
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = Some(addr);
        self
    }
    /// Write the kubeconfig here instead of into the server's tempdir.
    pub fn kubeconfig_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.kubeconfig_path = Some(path.into());
        self
    }
    /// Reject callers without known credentials with 401.
    pub fn strict_auth(mut self) -> Self {
        self.mode = AuthMode::Strict;
        self
    }
    /// Accept a bearer token as this user.
    pub fn token(mut self, token: &str, user: UserInfo) -> Self {
        self.tokens.insert(token.to_string(), user);
        self
    }
    /// Decide every request (and SubjectAccessReview) with this closure; members of
    /// `system:masters` (the kubeconfig's user) always pass.
    pub fn authorizer(
        mut self,
        f: impl Fn(&UserInfo, &Attributes) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.authorizer = Some(Arc::new(f));
        self
    }
    /// Also accept client certificates signed by this CA (PEM).
    pub fn client_ca(mut self, pem: &str) -> Self {
        self.client_cas.push(pem.to_string());
        self
    }
    /// Period of BOOKMARK events (default 60 s).
    pub fn bookmark_interval(mut self, d: Duration) -> Self {
        self.bookmark_interval = Some(d);
        self
    }
    /// How many change events are retained for watches to resume from (default 10,000).
    pub fn event_window(mut self, n: usize) -> Self {
        self.window = Some(n);
        self
    }
    /// Period of the bootstrap token cleaner (default 1 s).
    pub fn token_cleaner_interval(mut self, d: Duration) -> Self {
        self.token_cleaner = Some(d);
        self
    }
    /// Turn the bootstrap token cleaner on or off (on by default, as kubeadm enables it).
    pub fn token_cleaner(mut self, on: bool) -> Self {
        self.token_cleaner_off = !on;
        self
    }
    /// Run the scheduler stand-in ([`crate::scheduler`]): pending pods get bound to a
    /// fitting Ready node, or `PodScheduled=False` reason `Unschedulable`. Off by default
    /// (tests that bind pods themselves keep full control); `testkube serve` turns it on.
    pub fn scheduler(mut self, on: bool) -> Self {
        self.scheduler = on;
        self
    }
    /// Run the bootstrap signer ([`crate::bootstrap`]): `kube-public/cluster-info` gets a
    /// `jws-kubeconfig-<token-id>` signature per bootstrap token with
    /// `usage-bootstrap-signing`, and anonymous callers may read that ConfigMap even with
    /// [`Builder::strict_auth`]. Off by default; `testkube serve` turns it on.
    pub fn bootstrap_signer(mut self, on: bool) -> Self {
        self.bootstrap_signer = on;
        self
    }
    /// Serve as the API server of an existing cluster PKI: the CA is loaded from
    /// `<dir>/ca.crt` and `<dir>/ca.key` (the layout `stratum-server certs generate`
    /// writes), and the serving and admin certificates are issued from it, so clients
    /// pinning that CA (join discovery) trust this server.
    pub fn pki_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.pki_dir = Some(dir.into());
        self
    }
    /// The kubelet address-type order of the proxy.
    pub fn preferred_address_types(mut self, types: Vec<String>) -> Self {
        self.kubelet.preferred_address_types = Some(types);
        self
    }
    /// Verify kubelet serving certificates against this CA (PEM).
    pub fn kubelet_ca(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.kubelet.kubelet_ca = Some(pem.into());
        self
    }
    /// Let the proxy dial kubelets outside loopback.
    pub fn allow_non_loopback_kubelets(mut self, allow: bool) -> Self {
        self.kubelet.allow_non_loopback = allow;
        self
    }

    /// Starts the server.
    pub async fn start(self) -> Result<ApiServer, StartError> {
        let addr = self
            .listen
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Bind { addr, source })?;
        let local = listener
            .local_addr()
            .map_err(|source| StartError::Bind { addr, source })?;
        let ca = match &self.pki_dir {
            None => Ca::generate("testkube-ca")?,
            Some(dir) => {
                let loaded = pki::Ca::load(dir, "ca").map_err(|e| StartError::Pki {
                    dir: dir.clone(),
                    message: e.to_string(),
                })?;
                Ca::from_pem(loaded.cert_pem(), &loaded.key_pem())?
            }
        };
        let mut sans = vec!["127.0.0.1", "localhost", "::1"];
        let ip = local.ip().to_string();
        if !sans.contains(&ip.as_str()) && !local.ip().is_unspecified() {
            sans.push(&ip);
        }
        let serving = ca.issue("testkube-apiserver", &[], &sans, true, false)?;
        let admin = ca.issue("testkube-admin", &["system:masters"], &[], false, true)?;
        let kubelet_client = ca.issue(
            "kube-apiserver-kubelet-client",
            &["system:masters"],
            &[],
            false,
            true,
        )?;
        let (tls, client_verifier) = server_tls(&serving, ca.cert_pem(), &self.client_cas)?;

        let host = if local.ip().is_unspecified() {
            "127.0.0.1".to_string()
        } else if local.is_ipv6() {
            format!("[{}]", local.ip())
        } else {
            local.ip().to_string()
        };
        let url = format!("https://{host}:{}", local.port());
        let tempdir = tempfile::Builder::new()
            .prefix("testkube-")
            .tempdir()
            .map_err(|source| StartError::Kubeconfig {
                path: std::env::temp_dir(),
                source,
            })?;
        let kc_path = self
            .kubeconfig_path
            .clone()
            .unwrap_or_else(|| tempdir.path().join("kubeconfig"));
        let kc = kubeconfig::render(
            &url,
            ca.cert_pem(),
            &Credentials::ClientCert {
                cert_pem: admin.cert_pem.clone(),
                key_pem: admin.key_pem.clone(),
            },
        );
        kubeconfig::write(&kc_path, &kc).map_err(|source| StartError::Kubeconfig {
            path: kc_path.clone(),
            source,
        })?;
        let config = load_config(&kc_path).await?;

        let store = Arc::new(Store::new(self.window.unwrap_or(10_000)));
        {
            let mut g = store.lock();
            for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
                api::seed_namespace(&mut g, ns);
            }
        }
        let state = Arc::new(State {
            store,
            faults: Faults::default(),
            log: Mutex::new(Vec::new()),
            policy: Policy {
                mode: self.mode,
                tokens: self.tokens,
                authorizer: self.authorizer,
            },
            bookmark_interval: self.bookmark_interval.unwrap_or(Duration::from_secs(60)),
            gc_kick: Notify::new(),
            server_address: Mutex::new(format!("{host}:{}", local.port())),
            proxy_config: crate::proxy_seam::ProxyHolder::new(&self.kubelet, &kubelet_client),
            cluster_info_public: self.bootstrap_signer,
        });
        let cancel = CancellationToken::new();
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(serve(
            listener,
            tls,
            client_verifier,
            state.clone(),
            cancel.clone(),
        ));
        tasks.spawn(gc_loop(state.clone(), cancel.clone()));
        if self.scheduler {
            tasks.spawn(crate::scheduler::run(state.clone(), cancel.clone()));
        }
        if self.bootstrap_signer {
            tasks.spawn(crate::bootstrap::run(state.clone(), cancel.clone()));
        }
        if !self.token_cleaner_off {
            tasks.spawn(token_cleaner(
                state.clone(),
                self.token_cleaner.unwrap_or(Duration::from_secs(1)),
                cancel.clone(),
            ));
        }
        Ok(ApiServer {
            state,
            url,
            addr: local,
            kubeconfig_path: kc_path,
            config,
            ca,
            admin,
            cancel,
            tasks,
            _tempdir: tempdir,
        })
    }
}

async fn load_config(path: &Path) -> Result<kube::Config, StartError> {
    let err = |message: String| StartError::Client {
        path: path.to_path_buf(),
        message,
    };
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| err(e.to_string()))?;
    kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| err(e.to_string()))
}

type ClientVerifier = Arc<dyn rustls::server::danger::ClientCertVerifier>;

fn server_tls(
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
enum PeerAuth {
    /// No certificate.
    None,
    /// A certificate that verified: its user.
    User(UserInfo),
    /// A certificate that did not verify (unknown CA, expired, wrong usage).
    Invalid,
}

async fn serve(
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

async fn gc_loop(state: Arc<State>, cancel: CancellationToken) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = state.gc_kick.notified() => {}
        }
        let mut changed = false;
        {
            let mut g = state.store.lock();
            // Bounded: each pass removes or prunes something, and a chain of owners is finite.
            for _ in 0..1000 {
                if !crate::gc::pass(&mut g) {
                    break;
                }
                changed = true;
            }
        }
        if changed {
            state.notify();
        }
    }
}

async fn token_cleaner(state: Arc<State>, every: Duration, cancel: CancellationToken) {
    let secrets = res_index(resources::find("", "v1", "secrets").expect("served"));
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = chrono::Utc::now().timestamp();
        let removed = {
            let mut g = state.store.lock();
            let list = g.list(secrets, Some("kube-system"));
            let expired = crate::gc::expired_tokens(&list, now);
            for (ns, name, uid) in &expired {
                // The cleaner deletes with a uid precondition: a token recreated under
                // the same name in the meantime is a different object.
                if g.get(secrets, ns, name).is_some_and(|s| {
                    s.pointer("/metadata/uid").and_then(Value::as_str) == Some(uid)
                }) {
                    let _ = api::delete_locked(
                        &mut g,
                        resources::find("", "v1", "secrets").expect("served"),
                        ns,
                        name,
                        None,
                        None,
                        false,
                    );
                }
            }
            !expired.is_empty()
        };
        if removed {
            state.notify();
            state.kick_gc();
        }
    }
}

/// A parsed request path.
#[derive(Debug)]
enum Route {
    Version,
    CoreVersions,
    Groups,
    Group(String),
    ResourceList(String, String),
    Resource {
        res: &'static Resource,
        ns: Option<String>,
        name: Option<String>,
        sub: Option<String>,
        legacy_watch: bool,
    },
    Healthz,
    OpenApiV3Root,
    OpenApiV3(String, String),
    OpenApiV2,
    OpenApi,
    NotFound,
}

fn route(path: &str) -> Route {
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["version"] => return Route::Version,
        ["healthz" | "livez" | "readyz", ..] => return Route::Healthz,
        ["openapi", "v3"] => return Route::OpenApiV3Root,
        ["openapi", "v3", "api", v] => return Route::OpenApiV3(String::new(), v.to_string()),
        ["openapi", "v3", "apis", g, v] => return Route::OpenApiV3(g.to_string(), v.to_string()),
        ["openapi", "v2"] => return Route::OpenApiV2,
        ["openapi", ..] => return Route::OpenApi,
        ["api"] => return Route::CoreVersions,
        ["apis"] => return Route::Groups,
        ["apis", g] => return Route::Group(g.to_string()),
        ["api", v] => return Route::ResourceList(String::new(), v.to_string()),
        ["apis", g, v] => return Route::ResourceList(g.to_string(), v.to_string()),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Route::NotFound,
    };
    let (legacy_watch, rest) = match rest {
        ["watch", rest @ ..] => (true, rest),
        _ => (false, rest),
    };
    let owned = |s: &&str| s.to_string();
    // /namespaces/{ns}/{plural}[/{name}[/{sub}]] for namespaced kinds.
    if let ["namespaces", ns, plural, tail @ ..] = rest
        && let Some(res) = resources::find(group, version, plural)
        && res.namespaced
        && tail.len() <= 2
    {
        return Route::Resource {
            res,
            ns: Some(ns.to_string()),
            name: tail.first().map(owned),
            sub: tail.get(1).map(owned),
            legacy_watch,
        };
    }
    match rest {
        [plural, tail @ ..] if tail.len() <= 2 => match resources::find(group, version, plural) {
            Some(res) if !res.namespaced || tail.is_empty() => Route::Resource {
                res,
                ns: None,
                name: tail.first().map(owned),
                sub: tail.get(1).map(owned),
                legacy_watch,
            },
            _ => Route::NotFound,
        },
        _ => Route::NotFound,
    }
}

/// Reads a request body up to [`MAX_BODY`].
async fn read_body(req: Request<Incoming>) -> Result<bytes::Bytes, ApiError> {
    if let Some(len) = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        && len > MAX_BODY
    {
        return Err(ApiError::too_large(MAX_BODY));
    }
    match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                return Err(ApiError::too_large(MAX_BODY));
            }
            Err(ApiError::bad_request(format!(
                "reading the request body: {e}"
            )))
        }
    }
}

fn json_created(v: &Value) -> Response<Body> {
    Response::builder()
        .status(201)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(v.to_string()))
        .expect("static response parts are valid")
}

fn json_ok(v: &Value) -> Response<Body> {
    Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(v.to_string()))
        .expect("static response parts are valid")
}

/// `/openapi/v2` without definitions. kubectl 1.27 asks for it (as protobuf) to decide on
/// validation; with no schema for a kind it skips client-side validation, which is what
/// an empty document (the empty protobuf message) gives it.
fn openapi_v2(accept: &str) -> Response<Body> {
    if accept.contains("protobuf") {
        return Response::builder()
            .status(200)
            .header(
                header::CONTENT_TYPE,
                "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
            )
            .body(full(Vec::new()))
            .expect("static response parts are valid");
    }
    json_ok(&serde_json::json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": format!("v1.{}.0-testkube", discovery::MINOR)},
        "paths": {},
        "definitions": {},
    }))
}

fn parse_query(q: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for pair in q.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.insert(decode(k), decode(v));
    }
    out
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(
                    std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"),
                    16,
                ) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn bearer(req: &Request<Incoming>) -> Option<String> {
    let h = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = h.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_string())
}

fn verb_for(method: &Method, has_name: bool, watch: bool) -> Option<&'static str> {
    Some(match (method.as_str(), has_name) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", false) => "create",
        ("PUT", true) => "update",
        ("PATCH", true) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    })
}

async fn handle(state: Arc<State>, peer: PeerAuth, req: Request<Incoming>) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query_str = req.uri().query().unwrap_or("").to_string();
    let query = parse_query(&query_str);
    let mut rec = RequestRecord {
        verb: method.as_str().to_ascii_lowercase(),
        method: method.as_str().to_string(),
        path: path.clone(),
        query: query_str.clone(),
        resource: String::new(),
        subresource: None,
        namespace: None,
        name: None,
        code: 0,
    };

    // Authentication, in kube-apiserver's order: x509, then bearer tokens; a credential
    // that fails is 401 even where anonymous requests are allowed (the anonymous
    // authenticator sits behind FailOnError); no credential at all is anonymous.
    let token = bearer(&req);
    let by_token = token.as_deref().map(|t| state.authenticate_token(t));
    let mut anonymous_cluster_info = false;
    let user = match (&peer, by_token) {
        (PeerAuth::User(u), _) => Some(auth::with_authenticated_group(u.clone())),
        (_, Some(Some(u))) => Some(u),
        (PeerAuth::Invalid, _) | (_, Some(None)) => None,
        (PeerAuth::None, None) if state.policy.mode == AuthMode::AllowAll => {
            Some(UserInfo::anonymous())
        }
        (PeerAuth::None, None)
            if state.cluster_info_public
                && crate::bootstrap::is_cluster_info_read(&method, &path) =>
        {
            anonymous_cluster_info = true;
            Some(UserInfo::anonymous())
        }
        (PeerAuth::None, None) => None,
    };
    let route = route(&path);
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    if let Route::Resource {
        res, ns, name, sub, ..
    } = &route
    {
        rec.resource = res.plural.to_string();
        rec.namespace = ns.clone();
        rec.name = name.clone();
        rec.subresource = sub.clone();
    }
    let Some(user) = user else {
        return finish(&state, rec, ApiError::unauthorized().into_response());
    };
    let resp = match route {
        Route::Resource {
            res,
            ns,
            name,
            sub,
            legacy_watch,
        } => {
            let watch = legacy_watch || query.get("watch").is_some_and(|w| crate::api::go_bool(w));
            let connect = res.plural == "pods"
                && name.is_some()
                && matches!(
                    sub.as_deref(),
                    Some("log" | "exec" | "attach" | "portforward")
                );
            // Streaming subresources take any method (kubectl exec POSTs, WebSocket clients
            // GET); kube-apiserver names POST "create" and GET "get" for them.
            let verb = if connect {
                Some(match method.as_str() {
                    "POST" => "create",
                    "GET" => "get",
                    "PUT" => "update",
                    "DELETE" => "delete",
                    "PATCH" => "patch",
                    _ => "connect",
                })
            } else if res.plural == "pods"
                && name.is_some()
                && matches!(sub.as_deref(), Some("binding" | "eviction"))
                && method == Method::POST
            {
                Some("create")
            } else {
                verb_for(&method, name.is_some(), watch)
            };
            let Some(verb) = verb else {
                return finish(
                    &state,
                    rec,
                    ApiError::method_not_allowed(method.as_str(), &path).into_response(),
                );
            };
            rec.verb = verb.to_string();
            let attrs = Attributes {
                verb: verb.to_string(),
                group: res.group.to_string(),
                resource: res.plural.to_string(),
                subresource: sub.clone().unwrap_or_default(),
                namespace: ns.clone().unwrap_or_default(),
                name: name.clone().unwrap_or_default(),
                path: path.clone(),
            };
            // Asking about oneself is always allowed (kube's default system:basic-user role).
            let self_review = res.plural == "selfsubjectaccessreviews";
            // kubeadm binds `system:anonymous` to a Role that reads cluster-info.
            let public = crate::bootstrap::is_cluster_info_read(&method, &path)
                && state.cluster_info_public
                && user.username == "system:anonymous";
            if !self_review
                && !public
                && !anonymous_cluster_info
                && !state.policy.authorize(&user, &attrs)
            {
                let e = ApiError {
                    details: Some(
                        serde_json::json!({"name": attrs.name, "group": attrs.group, "kind": attrs.resource}),
                    ),
                    ..ApiError::new(403, "Forbidden", auth::forbidden_message(&user, &attrs))
                };
                return finish(&state, rec, e.into_response());
            }
            let mut drop_watch = false;
            for fault in state.faults.take(verb, res.plural, sub.as_deref()) {
                match fault {
                    FaultKind::Latency(d) => tokio::time::sleep(d).await,
                    FaultKind::Status(code) => {
                        return finish(&state, rec, ApiError::for_code(code).into_response());
                    }
                    FaultKind::TooManyRequests { retry_after_secs } => {
                        let e = ApiError {
                            retry_after: Some(retry_after_secs),
                            ..ApiError::new(
                                429,
                                "TooManyRequests",
                                "injected fault: too many requests, please try again later",
                            )
                        };
                        return finish(&state, rec, e.into_response());
                    }
                    FaultKind::DropWatch => drop_watch = true,
                    FaultKind::Compact => {
                        state.store.lock().compact();
                    }
                }
            }
            resource_request(
                &state, req, res, ns, name, sub, verb, query, user, drop_watch,
            )
            .await
        }
        other => {
            if method != Method::GET {
                ApiError::method_not_allowed(method.as_str(), &path).into_response()
            } else {
                match other {
                    Route::Version => json_ok(&discovery::version()),
                    Route::Healthz => Response::builder()
                        .status(200)
                        .header(header::CONTENT_TYPE, "text/plain")
                        .body(full("ok"))
                        .expect("static response parts are valid"),
                    Route::CoreVersions => {
                        let addr = state
                            .server_address
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .clone();
                        json_ok(&discovery::core_versions(&addr))
                    }
                    Route::Groups => json_ok(&discovery::group_list()),
                    Route::OpenApiV2 => openapi_v2(&accept),
                    Route::OpenApiV3Root => json_ok(&discovery::openapi_v3_root()),
                    Route::OpenApiV3(g, v) => match discovery::openapi_v3_gv(&g, &v) {
                        Some(d) => json_ok(&d),
                        None => ApiError::no_route(&path).into_response(),
                    },
                    Route::Group(g) => match discovery::group(&g) {
                        Some(v) => json_ok(&v),
                        None => ApiError::no_route(&path).into_response(),
                    },
                    Route::ResourceList(g, v) => match discovery::resource_list(&g, &v) {
                        Some(l) => json_ok(&l),
                        None => ApiError::no_route(&path).into_response(),
                    },
                    // No OpenAPI v2 (kubectl fetches it as protobuf); v3 above suffices.
                    Route::OpenApi | Route::NotFound | Route::Resource { .. } => {
                        ApiError::no_route(&path).into_response()
                    }
                }
            }
        }
    };
    finish(&state, rec, resp)
}

fn finish(state: &State, mut rec: RequestRecord, resp: Response<Body>) -> Response<Body> {
    rec.code = resp.status().as_u16();
    state.log(rec);
    resp
}

#[allow(clippy::too_many_arguments)] // one call site; a struct would only rename these
async fn resource_request(
    state: &Arc<State>,
    req: Request<Incoming>,
    res: &'static Resource,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
    verb: &'static str,
    query: HashMap<String, String>,
    user: UserInfo,
    drop_watch: bool,
) -> Response<Body> {
    // Streaming subresources go to the kubelet proxy with the request untouched.
    if let (Some(s), Some(n)) = (sub.as_deref(), name.as_deref())
        && res.plural == "pods"
        && matches!(s, "log" | "exec" | "attach" | "portforward")
    {
        let pod = state
            .store
            .lock()
            .get(res_index(res), ns.as_deref().unwrap_or(""), n);
        let Some(pod) = pod else {
            return ApiError::not_found(res, n).into_response();
        };
        let node = pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .and_then(|node| {
                state.store.lock().get(
                    res_index(resources::find("", "v1", "nodes").expect("served")),
                    "",
                    node,
                )
            });
        return crate::proxy_seam::forward(state, &pod, node.as_deref(), s, req).await;
    }
    if res.plural == "pods"
        && sub.as_deref() == Some("binding")
        && let Some(n) = name.as_deref()
    {
        if verb != "create" {
            return ApiError::method_not_allowed(verb, "pods/binding").into_response();
        }
        let body = match read_body(req).await {
            Ok(b) => b,
            Err(e) => return e.into_response(),
        };
        return match crate::scheduler::binding(state, ns.as_deref().unwrap_or(""), n, &body) {
            Ok(v) => json_created(&v),
            Err(e) => e.into_response(),
        };
    }
    if let Some(s) = sub.as_deref()
        && !(s == "status" && res.has_status)
    {
        return ApiError::no_route(&format!("{}/{s}", res.plural)).into_response();
    }
    if res.create_only && verb != "create" {
        return ApiError::method_not_allowed(verb, res.plural).into_response();
    }
    if sub.is_some() && !matches!(verb, "get" | "update" | "patch") {
        return ApiError::method_not_allowed(verb, &format!("{}/status", res.plural))
            .into_response();
    }
    if res.namespaced && ns.is_none() && matches!(verb, "create") {
        return ApiError::method_not_allowed("POST", res.plural).into_response();
    }
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = match read_body(req).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let (body, content_type) = if matches!(verb, "create" | "update")
        && content_type.starts_with("application/vnd.kubernetes.protobuf")
    {
        match crate::protobuf::decode(&body) {
            Ok(v) => (
                bytes::Bytes::from(serde_json::to_vec(&v).unwrap_or_default()),
                "application/json".to_string(),
            ),
            Err(crate::protobuf::ProtoError::Malformed(m)) => {
                return ApiError::bad_request(format!("malformed protobuf body: {m}"))
                    .into_response();
            }
            Err(e) => {
                let mut err =
                    ApiError::unsupported_media_type(&content_type, &["application/json"]);
                err.message = format!(
                    "{e} (for kubectl 1.32+ `kubectl create <kind>`, use `kubectl create -f` with YAML or JSON)"
                );
                return err.into_response();
            }
        }
    } else {
        (body, content_type)
    };
    if matches!(verb, "create" | "update")
        && !content_type.is_empty()
        && !content_type.starts_with("application/json")
        && !content_type.starts_with("*/*")
    {
        let mut e = ApiError::unsupported_media_type(&content_type, &["application/json"]);
        if content_type.contains("protobuf") {
            e.message.push_str(
                " (this API double speaks JSON only; kubectl 1.32+ sends the objects of `kubectl create namespace|configmap|secret|...` as protobuf: use `kubectl create -f` with YAML or JSON)",
            );
        }
        return e.into_response();
    }
    let areq = api::Request {
        res,
        sub,
        ns,
        name,
        query,
        body,
        content_type,
        user,
        accept,
    };
    let result = match verb {
        "get" => api::get(state, &areq),
        "list" => api::list(state, &areq),
        "watch" => api::watch(state, &areq, drop_watch),
        "create" => api::create(state, &areq),
        "update" => api::update(state, &areq),
        "patch" => api::patch(state, &areq),
        "delete" => api::delete(state, &areq),
        "deletecollection" => api::delete_collection(state, &areq),
        _ => Err(ApiError::method_not_allowed(verb, res.plural)),
    };
    result.unwrap_or_else(ApiError::into_response)
}

/// A running API double. Dropping it stops the server.
pub struct ApiServer {
    state: Arc<State>,
    url: String,
    addr: SocketAddr,
    kubeconfig_path: PathBuf,
    config: kube::Config,
    ca: Ca,
    admin: CertPair,
    cancel: CancellationToken,
    tasks: tokio::task::JoinSet<()>,
    _tempdir: tempfile::TempDir,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl ApiServer {
    /// Starts a server on 127.0.0.1 and a free port, with allow-all authentication.
    pub async fn start() -> anyhow::Result<ApiServer> {
        Ok(Self::builder().start().await?)
    }

    /// A builder for other settings.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// A kube::Client authenticated as the kubeconfig's user (a `system:masters` client
    /// certificate). Needs a tokio runtime.
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.config.clone())
            .expect("the kube::Config was built from the kubeconfig this server wrote")
    }

    /// The kube::Config behind [`ApiServer::client`].
    pub fn config(&self) -> kube::Config {
        self.config.clone()
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The kubeconfig written at start.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// The CA (PEM) that signed the serving certificate and accepted client certificates.
    pub fn ca_pem(&self) -> String {
        self.ca.cert_pem().to_string()
    }

    /// The admin client certificate the kubeconfig carries.
    pub fn admin_cert(&self) -> CertPair {
        self.admin.clone()
    }

    /// Issues a client certificate this server accepts, for `user` in `groups`.
    pub fn issue_client_cert(
        &self,
        user: &str,
        groups: &[&str],
    ) -> Result<CertPair, crate::tls::CertError> {
        self.ca.issue(user, groups, &[], false, true)
    }

    /// Writes a kubeconfig for a bearer token (for strict-mode tests and other users).
    pub fn write_token_kubeconfig(&self, path: &Path, token: &str) -> std::io::Result<()> {
        let text = kubeconfig::render(
            &self.url,
            self.ca.cert_pem(),
            &Credentials::Token(token.into()),
        );
        kubeconfig::write(path, &text)
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.state
            .log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Forgets the request log.
    pub fn clear_requests(&self) {
        self.state
            .log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Adds a fault.
    pub fn inject(&self, fault: Fault) {
        self.state.faults.add(fault);
    }

    /// Removes every fault.
    pub fn clear_faults(&self) {
        self.state.faults.clear();
    }

    /// Forgets the retained event window now: watches and Exact lists from older
    /// resourceVersions get 410.
    pub fn compact(&self) {
        self.state.store.lock().compact();
    }

    /// The latest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.state.store.lock().rv()
    }

    /// Stops serving: closes the listener and every connection (watches end).
    pub async fn shutdown(mut self) {
        self.cancel.cancel();
        while self.tasks.join_next().await.is_some() {}
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert!(matches!(route("/version"), Route::Version));
        assert!(matches!(route("/api/v1"), Route::ResourceList(g, v) if g.is_empty() && v == "v1"));
        match route("/api/v1/namespaces/default/pods/p/status") {
            Route::Resource {
                res, ns, name, sub, ..
            } => {
                assert_eq!(res.plural, "pods");
                assert_eq!(ns.as_deref(), Some("default"));
                assert_eq!(name.as_deref(), Some("p"));
                assert_eq!(sub.as_deref(), Some("status"));
            }
            other => panic!("{other:?}"),
        }
        match route("/api/v1/namespaces/kube-system") {
            Route::Resource { res, name, ns, .. } => {
                assert_eq!(res.plural, "namespaces");
                assert_eq!(name.as_deref(), Some("kube-system"));
                assert!(ns.is_none());
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            route("/api/v1/pods"),
            Route::Resource {
                ns: None,
                name: None,
                ..
            }
        ));
        assert!(matches!(route("/api/v1/pods/x"), Route::NotFound));
        assert!(matches!(
            route("/api/v1/watch/nodes"),
            Route::Resource {
                legacy_watch: true,
                ..
            }
        ));
        assert!(matches!(
            route("/apis/apps/v1/namespaces/a/deployments/d/status"),
            Route::Resource { .. }
        ));
        assert!(matches!(route("/apis/nope/v1/things"), Route::NotFound));
        assert!(matches!(
            route("/api/v1/namespaces/a/pods/p/status/extra"),
            Route::NotFound
        ));
    }

    #[test]
    fn query_decoding() {
        let q = parse_query("labelSelector=app%3Dweb%2Ctier+in+(a)&watch=1&bad=%zz%");
        assert_eq!(q["labelSelector"], "app=web,tier in (a)");
        assert_eq!(q["watch"], "1");
        assert_eq!(q["bad"], "%zz%");
    }
}
