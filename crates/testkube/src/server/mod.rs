//! The API double's server, by job: `builder` (settings and start), `listener` (TLS and
//! connections, client-certificate checks), `routing` (paths, authentication,
//! authorization, faults, HTTP plumbing), `controllers` (the garbage collector and token
//! cleaner loops), and here the shared [`State`] and the [`ApiServer`] handle tests hold.

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

mod builder;
mod controllers;
mod listener;
mod routing;

pub use builder::{Builder, StartError};
use controllers::{gc_loop, token_cleaner};
use listener::{PeerAuth, serve, server_tls};
use routing::handle;

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
        crate::bootstrap::authenticate(&s, id, secret, crate::times::now_secs())
            .map(auth::with_authenticated_group)
    }

    fn log(&self, rec: RequestRecord) {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).push(rec);
    }
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
