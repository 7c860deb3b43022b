//! The admin listener: `/metrics` and `/status`, apart from the probe listener.
//!
//! Probes stay two routes with constant bodies (the `health` crate); everything an operator
//! or Prometheus reads lives here. Routes:
//!
//! - `GET /metrics`: the registry in the OpenMetrics text format (Prometheus scrapes it);
//! - `GET /status`: the daemon's JSON status snapshot, where it has one (404 otherwise);
//! - anything else: 404, and a method other than GET or HEAD: 405 with `Allow`.
//!
//! The listener defaults to loopback in every daemon; it carries no secrets, but counters
//! and node names are still nobody else's business.

use std::convert::Infallible;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode, header};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::encoding::text::encode;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Builds the JSON body of `/status` at each request.
pub type StatusFn = Arc<dyn Fn() -> serde_json::Value + Send + Sync>;

/// The admin listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Another process holds the address.
    #[error(
        "admin listen address {addr} is already in use: stop the other process or choose another address with --admin-listen"
    )]
    AddressInUse {
        /// The address asked for.
        addr: String,
        /// The bind error.
        #[source]
        source: io::Error,
    },
    /// The address could not be bound for another reason (malformed, not local, ...).
    #[error("cannot listen on admin address {addr}")]
    Bind {
        /// The address asked for.
        addr: String,
        /// The bind error.
        #[source]
        source: io::Error,
    },
}

/// Reading another daemon's `/status` failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The admin address is not an `http://` URL.
    #[error(
        "{given:?} is not an admin URL: give the plain http address of the admin listener, e.g. http://127.0.0.1:9102"
    )]
    BadUrl {
        /// What was given.
        given: String,
    },
    /// Nothing answered in time.
    #[error("{url} did not answer within {seconds} s")]
    Timeout {
        /// The URL asked.
        url: String,
        /// The time allowed.
        seconds: u64,
    },
    /// The connection or the request failed.
    #[error("cannot reach {url}: is the daemon running there?")]
    Unreachable {
        /// The URL asked.
        url: String,
        /// The client error.
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    /// The answer's body could not be read.
    #[error("cannot read the answer of {url}")]
    Read {
        /// The URL asked.
        url: String,
        /// The body error.
        #[source]
        source: hyper::Error,
    },
    /// The daemon answered with an error status.
    #[error("{url} answered {code}")]
    Status {
        /// The URL asked.
        url: String,
        /// The HTTP status.
        code: StatusCode,
    },
    /// The answer is not the expected JSON snapshot.
    #[error("{url} did not answer a status snapshot")]
    Decode {
        /// The URL asked.
        url: String,
        /// The decoding error.
        #[source]
        source: serde_json::Error,
    },
}

/// GETs `{admin}/status` from a running daemon's admin listener and decodes it.
pub async fn fetch_status<T: serde::de::DeserializeOwned>(
    admin: &str,
    timeout: Duration,
) -> Result<T, FetchError> {
    let base = admin.trim_end_matches('/');
    let url: hyper::Uri = format!("{base}/status")
        .parse()
        .ok()
        .filter(|u: &hyper::Uri| u.scheme_str() == Some("http"))
        .ok_or_else(|| FetchError::BadUrl {
            given: admin.to_string(),
        })?;
    let shown = url.to_string();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<Bytes>>();
    let resp = tokio::time::timeout(timeout, client.get(url))
        .await
        .map_err(|_| FetchError::Timeout {
            url: shown.clone(),
            seconds: timeout.as_secs(),
        })?
        .map_err(|source| FetchError::Unreachable {
            url: shown.clone(),
            source,
        })?;
    let code = resp.status();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .map_err(|source| FetchError::Read {
            url: shown.clone(),
            source,
        })?
        .to_bytes();
    if !code.is_success() {
        return Err(FetchError::Status { url: shown, code });
    }
    serde_json::from_slice(&body).map_err(|source| FetchError::Decode { url: shown, source })
}

/// Most connections served at once; more are closed at accept.
const MAX_CONNECTIONS: usize = 64;
/// A client must send its request head within this time.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request head accepted.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// The content type of the OpenMetrics text format.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The admin listener of one daemon.
#[derive(Clone)]
pub struct AdminServer {
    registry: Arc<Registry>,
    status: Option<StatusFn>,
}

impl std::fmt::Debug for AdminServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminServer")
            .field("status", &self.status.is_some())
            .finish_non_exhaustive()
    }
}

impl AdminServer {
    /// An admin listener serving `registry`. Register every metric before this call; the
    /// metrics themselves keep changing through their own handles.
    pub fn new(registry: Registry) -> AdminServer {
        AdminServer {
            registry: Arc::new(registry),
            status: None,
        }
    }

    /// Serves `status()` as JSON on `/status`.
    pub fn with_status(
        mut self,
        status: impl Fn() -> serde_json::Value + Send + Sync + 'static,
    ) -> AdminServer {
        self.status = Some(Arc::new(status));
        self
    }

    /// The metrics as `/metrics` renders them.
    pub fn render_metrics(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }

    /// Binds `addr`, failing with an error that names it. Separate from
    /// [`AdminServer::serve`] so a daemon fails fast on a taken port before it starts work.
    pub async fn bind(addr: &str) -> Result<TcpListener, Error> {
        match TcpListener::bind(addr).await {
            Ok(listener) => Ok(listener),
            Err(source) if source.kind() == io::ErrorKind::AddrInUse => Err(Error::AddressInUse {
                addr: addr.to_string(),
                source,
            }),
            Err(source) => Err(Error::Bind {
                addr: addr.to_string(),
                source,
            }),
        }
    }

    /// Serves on `listener` until `cancel` is cancelled; in-flight requests get a second to
    /// finish.
    pub async fn serve(self, listener: TcpListener, cancel: CancellationToken) {
        let local = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        info!(addr = %local, "admin listener serving /metrics and /status on http://{local}");
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .max_buf_size(MAX_HEAD_BYTES);
        let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let mut connections = JoinSet::new();
        let this = Arc::new(self);
        loop {
            tokio::select! {
                biased;
                () = cancel.cancelled() => break,
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                accepted = listener.accept() => {
                    let stream = match accepted {
                        Ok((stream, _)) => stream,
                        Err(err) => {
                            warn!(error = %err, "admin listener could not accept a connection; retrying");
                            tokio::select! {
                                () = cancel.cancelled() => break,
                                () = tokio::time::sleep(Duration::from_millis(100)) => continue,
                            }
                        }
                    };
                    let Ok(permit) = permits.clone().try_acquire_owned() else {
                        continue;
                    };
                    let this = this.clone();
                    let conn_cancel = cancel.clone();
                    let builder = builder.clone();
                    connections.spawn(async move {
                        let service = service_fn(move |req| {
                            let this = this.clone();
                            async move { Ok::<_, Infallible>(this.route(&req)) }
                        });
                        let conn = builder.serve_connection(TokioIo::new(stream), service);
                        tokio::pin!(conn);
                        tokio::select! {
                            _ = conn.as_mut() => {}
                            () = conn_cancel.cancelled() => {
                                conn.as_mut().graceful_shutdown();
                                let _ = tokio::time::timeout(Duration::from_secs(1), conn).await;
                            }
                        }
                        drop(permit);
                    });
                }
            }
        }
        drop(listener);
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while connections.join_next().await.is_some() {}
        })
        .await;
        connections.shutdown().await;
        info!(addr = %local, "admin listener stopped");
    }

    fn route(&self, req: &Request<Incoming>) -> Response<Full<Bytes>> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            let mut response = respond(
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                "method not allowed\n",
            );
            response
                .headers_mut()
                .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
            return response;
        }
        match req.uri().path() {
            "/metrics" => respond(StatusCode::OK, METRICS_CONTENT_TYPE, self.render_metrics()),
            "/status" => match &self.status {
                Some(status) => respond(
                    StatusCode::OK,
                    "application/json",
                    serde_json::to_string(&status()).unwrap_or_else(|_| "{}".into()),
                ),
                None => respond(StatusCode::NOT_FOUND, "text/plain", "no status here\n"),
            },
            _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
        }
    }
}

fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    response
}
