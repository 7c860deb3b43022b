//! Forwarding of `pods/log`, `pods/exec`, `pods/attach`, `pods/portforward` to the kubelet.
//!
//! This follows kube-apiserver (`pkg/registry/core/pod/strategy.go` for the locations,
//! `pkg/kubelet/client/kubelet_client.go` for the connection, the upgrade-aware proxy in
//! `apimachinery/pkg/util/proxy` for exec/attach/port-forward, and the generic location
//! streamer for logs):
//! - the kubelet is the node's first address in the preferred address-type order, on
//!   `status.daemonEndpoints.kubeletEndpoint.Port` (10250 when unset), over HTTPS with a
//!   client certificate, its serving certificate checked only when a CA is configured;
//! - logs are a fresh `GET /containerLogs/...` whose body is streamed back;
//! - exec, attach and port-forward pass the client's upgrade request to the kubelet and,
//!   once it answers 101, splice the two connections byte for byte (SPDY or WebSocket:
//!   whatever the client speaks reaches the kubelet unchanged).
//!
//! Unlike kube-apiserver, the double dials only loopback addresses unless
//! [`ProxyConfig::allow_non_loopback`] is set: a node address elsewhere fails exactly like
//! an unreachable kubelet (500, `dial tcp ...`), and no packet leaves the machine.
//!
//! The pure parts ([`kubelet_target`], [`choose_container`], [`log_location`],
//! [`exec_location`], [`port_forward_location`]) decide; [`forward`] applies.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::body::{Body, BoxError, empty};
use crate::status::failure;

/// The kubelet port when a node does not report one.
pub const DEFAULT_KUBELET_PORT: u16 = 10250;
/// kube-apiserver's default `--kubelet-preferred-address-types`.
pub const DEFAULT_ADDRESS_TYPES: &[&str] = &[
    "Hostname",
    "InternalDNS",
    "InternalIP",
    "ExternalDNS",
    "ExternalIP",
];
/// How long a dial (TCP and TLS) may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// How much of a kubelet error body is read into the Status message (kube-apiserver's
/// `maxReadLength`).
const MAX_ERROR_BODY: usize = 50_000;

/// How the double reaches kubelets.
#[derive(Clone)]
pub struct ProxyConfig {
    /// Node address types in order of preference.
    pub preferred_address_types: Vec<String>,
    /// CA bundle (PEM) that kubelet serving certificates must chain to; `None` skips
    /// verification, as kube-apiserver does without `--kubelet-certificate-authority`.
    pub kubelet_ca: Option<Vec<u8>>,
    /// The client certificate (PEM) presented to kubelets.
    pub client_cert_pem: String,
    /// Its private key (PEM).
    pub client_key_pem: String,
    /// Dial node addresses outside 127.0.0.0/8 and ::1 (and resolve host names).
    pub allow_non_loopback: bool,
}

impl std::fmt::Debug for ProxyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyConfig")
            .field("preferred_address_types", &self.preferred_address_types)
            .field("kubelet_ca", &self.kubelet_ca.as_ref().map(|_| "<pem>"))
            .field("allow_non_loopback", &self.allow_non_loopback)
            .finish_non_exhaustive()
    }
}

impl Default for ProxyConfig {
    fn default() -> Self {
        let (client_cert_pem, client_key_pem) =
            client_certificate().expect("generating a client certificate with rcgen");
        ProxyConfig {
            preferred_address_types: DEFAULT_ADDRESS_TYPES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            kubelet_ca: None,
            client_cert_pem,
            client_key_pem,
            allow_non_loopback: false,
        }
    }
}

/// A self-signed client certificate as kube-apiserver's kubelet client has
/// (`CN=kube-apiserver-kubelet-client, O=system:masters`): `(cert_pem, key_pem)`.
pub fn client_certificate() -> Result<(String, String), rcgen::Error> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kube-apiserver-kubelet-client");
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:masters");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Why a proxied request failed; each maps to the `Status` kube-apiserver would send.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProxyError {
    /// 400 BadRequest (no host assigned, no such container, bad option, not an upgrade).
    #[error("{0}")]
    BadRequest(String),
    /// 422 Invalid `PodLogOptions`.
    #[error("PodLogOptions {pod:?} is invalid: {message}")]
    InvalidLogOptions {
        /// The pod.
        pod: String,
        /// The aggregated field errors.
        message: String,
        /// `(field, message)` causes.
        causes: Vec<(String, String, &'static str)>,
    },
    /// 404: the pod's node does not exist.
    #[error("nodes {0:?} not found")]
    NodeNotFound(String),
    /// 404: the subresource is not one the proxy serves.
    #[error("the server could not find the requested resource")]
    UnknownSubresource(String),
    /// 500 with no reason: the node has none of the preferred address types.
    #[error("no preferred addresses found; known addresses: {0}")]
    NoPreferredAddress(String),
    /// 500 with no reason: the kubelet could not be reached (dial, TLS, send), or it
    /// answered an upgrade with something that is neither 101 nor an error.
    #[error("{0}")]
    Backend(String),
    /// The kubelet answered a log request with an error status.
    #[error("kubelet answered {code}: {body}")]
    KubeletStatus {
        /// Its HTTP status.
        code: u16,
        /// Its body (at most 50,000 bytes).
        body: String,
        /// The pod, for the message.
        pod: String,
    },
}

impl ProxyError {
    /// The `Status` response kube-apiserver sends for this error.
    pub fn into_response(self) -> Response<Body> {
        match self {
            ProxyError::BadRequest(m) => failure(400, "BadRequest", &m, None),
            ProxyError::InvalidLogOptions {
                ref pod,
                ref causes,
                ..
            } => {
                let details = json!({
                    "name": pod,
                    "kind": "PodLogOptions",
                    "causes": causes.iter().map(|(field, message, reason)| json!({
                        "reason": reason, "message": message, "field": field,
                    })).collect::<Vec<_>>(),
                });
                failure(422, "Invalid", &self.to_string(), Some(details))
            }
            ProxyError::NodeNotFound(ref name) => failure(
                404,
                "NotFound",
                &self.to_string(),
                Some(json!({"name": name, "kind": "nodes"})),
            ),
            ProxyError::UnknownSubresource(ref path) => failure(
                404,
                "NotFound",
                &format!("the server could not find the requested resource (path {path})"),
                None,
            ),
            // kube-apiserver reports errors that are not API statuses with an empty
            // (Unknown) reason, which kubectl prints as "Error from server: <message>".
            ProxyError::NoPreferredAddress(_) | ProxyError::Backend(_) => {
                failure(500, "", &self.to_string(), None)
            }
            ProxyError::KubeletStatus { code, body, pod } => kubelet_status(code, &body, &pod),
        }
    }
}

/// kube-apiserver's `GenericHttpResponseChecker` for `pods/log`: a kubelet error body
/// becomes a Status with the kubelet's code.
fn kubelet_status(code: u16, body: &str, pod: &str) -> Response<Body> {
    match code {
        500 => failure(
            500,
            "InternalError",
            &format!("Internal error occurred: {body}"),
            Some(json!({"causes": [{"message": body}]})),
        ),
        400 => failure(400, "BadRequest", body, None),
        _ => {
            let (reason, message) = match code {
                409 => ("Conflict", "the server reported a conflict".to_string()),
                404 => (
                    "NotFound",
                    "the server could not find the requested resource".to_string(),
                ),
                401 => (
                    "Unauthorized",
                    "the server has asked for the client to provide credentials".to_string(),
                ),
                403 => ("Forbidden", body.to_string()),
                405 => (
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource".to_string(),
                ),
                422 => (
                    "Invalid",
                    "the server rejected our request due to an error in our request".to_string(),
                ),
                504 => (
                    "Timeout",
                    "the server was unable to return a response in the time allotted, but may still be processing the request".to_string(),
                ),
                429 => (
                    "TooManyRequests",
                    "the server has received too many requests and has asked us to try again later".to_string(),
                ),
                c if c >= 500 => (
                    "InternalError",
                    format!(
                        "an error on the server ({body:?}) has prevented the request from succeeding"
                    ),
                ),
                c => (
                    "",
                    format!(
                        "the server responded with the status code {c} but did not return more information"
                    ),
                ),
            };
            failure(
                code,
                reason,
                &format!("{message} ( pods/log {pod})"),
                Some(json!({"name": pod, "kind": "pods/log"})),
            )
        }
    }
}

fn first<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The API machinery's query-to-bool conversion: absent, `0` and `false` are false,
/// anything else (even empty) is true.
fn query_bool(pairs: &[(String, String)], key: &str) -> bool {
    match first(pairs, key) {
        None => false,
        Some(v) => !(v == "0" || v.eq_ignore_ascii_case("false")),
    }
}

fn query_i64(pairs: &[(String, String)], key: &str) -> Result<Option<i64>, ProxyError> {
    match first(pairs, key) {
        None => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| {
            ProxyError::BadRequest(format!("strconv.ParseInt: parsing {v:?}: invalid syntax"))
        }),
    }
}

// ---------------------------------------------------------------------------------------
// Pure decisions.

fn meta<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj["metadata"][field].as_str().unwrap_or("")
}

/// The kubelet's host and port for a node: the first address in `preferred` type order,
/// and `status.daemonEndpoints.kubeletEndpoint.Port` when positive, else 10250.
pub fn kubelet_target(node: &Value, preferred: &[String]) -> Result<(String, u16), ProxyError> {
    let addresses = node["status"]["addresses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let host = preferred
        .iter()
        .find_map(|t| {
            addresses
                .iter()
                .find(|a| a["type"].as_str() == Some(t.as_str()))
                .and_then(|a| a["address"].as_str())
        })
        .ok_or_else(|| {
            // Go prints the []NodeAddress with %v: [{InternalIP 10.0.0.1} ...]
            let known = addresses
                .iter()
                .map(|a| {
                    format!(
                        "{{{} {}}}",
                        a["type"].as_str().unwrap_or(""),
                        a["address"].as_str().unwrap_or("")
                    )
                })
                .collect::<Vec<_>>()
                .join(" ");
            ProxyError::NoPreferredAddress(format!("[{known}]"))
        })?;
    let port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        .as_i64()
        .filter(|p| *p > 0 && *p <= u16::MAX as i64)
        .map(|p| p as u16)
        .unwrap_or(DEFAULT_KUBELET_PORT);
    Ok((host.to_string(), port))
}

/// kube-apiserver's `validateContainer`: the requested container must exist (among
/// init, regular and ephemeral containers); without one, a pod with exactly one
/// container uses it.
pub fn choose_container(pod: &Value, requested: Option<&str>) -> Result<String, ProxyError> {
    let name = meta(pod, "name");
    let names = |field: &str| -> Vec<String> {
        pod["spec"][field]
            .as_array()
            .map(|cs| {
                cs.iter()
                    .filter_map(|c| c["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let containers = names("containers");
    let all: Vec<String> = names("initContainers")
        .into_iter()
        .chain(containers.iter().cloned())
        .chain(names("ephemeralContainers"))
        .collect();
    match requested.filter(|c| !c.is_empty()) {
        Some(c) if all.iter().any(|n| n == c) => Ok(c.to_string()),
        Some(c) => Err(ProxyError::BadRequest(format!(
            "container {c} is not valid for pod {name}"
        ))),
        None => match containers.len() {
            1 => Ok(containers[0].clone()),
            0 => Err(ProxyError::BadRequest(format!(
                "a container name must be specified for pod {name}"
            ))),
            _ => Err(ProxyError::BadRequest(format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                all.join(" ")
            ))),
        },
    }
}

/// What a `pods/log` request turns into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLocation {
    /// `/containerLogs/{ns}/{pod}/{container}?...`, or `None` when the pod has no node
    /// (kube-apiserver then answers 204 No Content).
    pub path_and_query: Option<String>,
    /// `insecureSkipTLSVerifyBackend=true`: skip verifying the kubelet even with a CA.
    pub insecure_skip_verify: bool,
}

/// Maps `pods/{name}/log?...` to the kubelet's `containerLogs` location
/// (`LogLocation` and `ValidatePodLogOptions`).
pub fn log_location(pod: &Value, query: &str) -> Result<LogLocation, ProxyError> {
    let q = crate::query::pairs(query);
    let name = meta(pod, "name");
    let tail = query_i64(&q, "tailLines")?;
    let limit = query_i64(&q, "limitBytes")?;
    let since_seconds = query_i64(&q, "sinceSeconds")?;
    let since_time = match first(&q, "sinceTime") {
        None => None,
        Some(v) => Some(
            chrono::DateTime::parse_from_rfc3339(v)
                .map_err(|e| {
                    ProxyError::BadRequest(format!(
                        "parsing time {v:?} as \"2006-01-02T15:04:05Z07:00\": {e}"
                    ))
                })?
                .with_timezone(&chrono::Utc)
                .format("%Y-%m-%dT%H:%M:%SZ")
                .to_string(),
        ),
    };
    let mut causes: Vec<(String, String, &'static str)> = Vec::new();
    if let Some(t) = tail.filter(|t| *t < 0) {
        causes.push((
            "tailLines".into(),
            format!("Invalid value: {t}: must be greater than or equal to 0"),
            "FieldValueInvalid",
        ));
    }
    if let Some(l) = limit.filter(|l| *l < 1) {
        causes.push((
            "limitBytes".into(),
            format!("Invalid value: {l}: must be greater than 0"),
            "FieldValueInvalid",
        ));
    }
    if since_seconds.is_some() && since_time.is_some() {
        causes.push((
            "".into(),
            "Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified".into(),
            "FieldValueForbidden",
        ));
    } else if let Some(s) = since_seconds.filter(|s| *s < 1) {
        causes.push((
            "sinceSeconds".into(),
            format!("Invalid value: {s}: must be greater than 0"),
            "FieldValueInvalid",
        ));
    }
    if !causes.is_empty() {
        let render = |(f, m, _): &(String, String, &str)| {
            if f.is_empty() {
                m.clone()
            } else {
                format!("{f}: {m}")
            }
        };
        let message = if causes.len() == 1 {
            render(&causes[0])
        } else {
            format!(
                "[{}]",
                causes.iter().map(render).collect::<Vec<_>>().join(", ")
            )
        };
        return Err(ProxyError::InvalidLogOptions {
            pod: name.to_string(),
            message,
            causes,
        });
    }
    let container = choose_container(pod, first(&q, "container"))?;
    let insecure_skip_verify = query_bool(&q, "insecureSkipTLSVerifyBackend");
    if pod["spec"]["nodeName"].as_str().unwrap_or("").is_empty() {
        return Ok(LogLocation {
            path_and_query: None,
            insecure_skip_verify,
        });
    }
    let mut params: Vec<(&str, String)> = Vec::new();
    for key in ["follow", "previous", "timestamps"] {
        if query_bool(&q, key) {
            params.push((key, "true".into()));
        }
    }
    if let Some(s) = since_seconds {
        params.push(("sinceSeconds", s.to_string()));
    }
    if let Some(t) = since_time {
        params.push(("sinceTime", t));
    }
    if let Some(t) = tail {
        params.push(("tailLines", t.to_string()));
    }
    if let Some(l) = limit {
        params.push(("limitBytes", l.to_string()));
    }
    Ok(LogLocation {
        path_and_query: Some(with_query(
            format!(
                "/containerLogs/{}/{}/{container}",
                meta(pod, "namespace"),
                name
            ),
            &params,
        )),
        insecure_skip_verify,
    })
}

fn with_query(path: String, params: &[(&str, String)]) -> String {
    if params.is_empty() {
        path
    } else {
        format!("{path}?{}", crate::query::encode(params))
    }
}

fn require_node(pod: &Value) -> Result<(), ProxyError> {
    if pod["spec"]["nodeName"].as_str().unwrap_or("").is_empty() {
        return Err(ProxyError::BadRequest(format!(
            "pod {} does not have a host assigned",
            meta(pod, "name")
        )));
    }
    Ok(())
}

/// Maps `pods/{name}/exec` or `attach` (`kind`) to `/{kind}/{ns}/{pod}/{container}?...`
/// (`streamLocation`): stdin/stdout/stderr/tty become input/output/error/tty=1 when true,
/// `command` values are kept in order.
pub fn exec_location(pod: &Value, kind: &str, query: &str) -> Result<String, ProxyError> {
    let q = crate::query::pairs(query);
    let container = choose_container(pod, first(&q, "container"))?;
    require_node(pod)?;
    let mut params: Vec<(&str, String)> = Vec::new();
    for (from, to) in [
        ("stdin", "input"),
        ("stdout", "output"),
        ("stderr", "error"),
        ("tty", "tty"),
    ] {
        if query_bool(&q, from) {
            params.push((to, "1".into()));
        }
    }
    if kind == "exec" {
        for (k, v) in &q {
            if k == "command" {
                params.push(("command", v.clone()));
            }
        }
    }
    Ok(with_query(
        format!(
            "/{kind}/{}/{}/{container}",
            meta(pod, "namespace"),
            meta(pod, "name")
        ),
        &params,
    ))
}

/// Maps `pods/{name}/portforward?ports=...` to `/portForward/{ns}/{pod}?port=a,b`.
pub fn port_forward_location(pod: &Value, query: &str) -> Result<String, ProxyError> {
    let q = crate::query::pairs(query);
    require_node(pod)?;
    let mut ports = Vec::new();
    for (k, v) in &q {
        if k != "ports" {
            continue;
        }
        for p in v.split(',') {
            let port: u16 = p.parse().map_err(|_| {
                ProxyError::BadRequest(format!(
                    "cannot convert to []int32: strconv.ParseUint: parsing {p:?}: invalid syntax"
                ))
            })?;
            ports.push(port.to_string());
        }
    }
    let params: Vec<(&str, String)> = if ports.is_empty() {
        vec![]
    } else {
        vec![("port", ports.join(","))]
    };
    Ok(with_query(
        format!(
            "/portForward/{}/{}",
            meta(pod, "namespace"),
            meta(pod, "name")
        ),
        &params,
    ))
}

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

fn join_host_port(host: &str, port: u16) -> String {
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
struct AcceptAnyKubelet(Arc<rustls::crypto::CryptoProvider>);

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

fn client_tls(cfg: &ProxyConfig, verify: bool) -> Result<rustls::ClientConfig, String> {
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
type KubeletStream = tokio_rustls::client::TlsStream<TcpStream>;

/// Dials the kubelet; the error text is Go-shaped (`dial tcp ...`, `tls: ...`).
async fn dial(
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

fn go_errno(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connection refused".into(),
        std::io::ErrorKind::ConnectionReset => "connection reset by peer".into(),
        std::io::ErrorKind::TimedOut => "connection timed out".into(),
        _ => e.to_string(),
    }
}

fn go_tls_error(e: &std::io::Error) -> String {
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

async fn handshake<IO>(
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

/// Forwards one `pods/{log,exec,attach,portforward}` request to the pod's kubelet, as
/// kube-apiserver does. The caller has authenticated the request and found the pod; `node`
/// is the pod's node, `None` when it does not exist.
pub async fn forward(
    cfg: &ProxyConfig,
    pod: &Value,
    node: Option<&Value>,
    subresource: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    let result = match subresource {
        "log" => forward_log(cfg, pod, node, req).await,
        "exec" | "attach" => match exec_location(pod, subresource, req.uri().query().unwrap_or(""))
        {
            Ok(path) => forward_upgrade(cfg, pod, node, path, req).await,
            Err(e) => Err(e),
        },
        "portforward" => match port_forward_location(pod, req.uri().query().unwrap_or("")) {
            Ok(path) => forward_upgrade(cfg, pod, node, path, req).await,
            Err(e) => Err(e),
        },
        other => Err(ProxyError::UnknownSubresource(format!(
            "{}/{other}",
            req.uri().path()
        ))),
    };
    result.unwrap_or_else(ProxyError::into_response)
}

fn node_target(
    cfg: &ProxyConfig,
    pod: &Value,
    node: Option<&Value>,
) -> Result<(String, u16), ProxyError> {
    let node_name = pod["spec"]["nodeName"].as_str().unwrap_or("");
    let node = node.ok_or_else(|| ProxyError::NodeNotFound(node_name.to_string()))?;
    kubelet_target(node, &cfg.preferred_address_types)
}

async fn forward_log(
    cfg: &ProxyConfig,
    pod: &Value,
    node: Option<&Value>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ProxyError> {
    let loc = log_location(pod, req.uri().query().unwrap_or(""))?;
    let Some(path) = loc.path_and_query else {
        // kube-apiserver's stream writer answers a location-less stream with 204.
        return Ok(Response::builder()
            .status(StatusCode::NO_CONTENT)
            .body(empty())
            .expect("static response parts are valid"));
    };
    let (host, port) = node_target(cfg, pod, node)?;
    let host_port = join_host_port(&host, port);
    let url = format!("https://{host_port}{path}");
    let backend = |e: String| ProxyError::Backend(format!("Get {url:?}: {e}"));
    let verify = cfg.kubelet_ca.is_some() && !loc.insecure_skip_verify;
    let stream = dial(cfg, &host, port, verify).await.map_err(backend)?;
    let mut send = handshake(stream)
        .await
        .map_err(|e| backend(e.to_string()))?;
    let out = Request::get(path.as_str())
        .header(header::HOST, host_port.as_str())
        .header(header::USER_AGENT, "testkube-apiserver")
        .body(empty())
        .map_err(|e| backend(e.to_string()))?;
    let resp = send
        .send_request(out)
        .await
        .map_err(|e| backend(e.to_string()))?;
    let code = resp.status().as_u16();
    if (300..400).contains(&code) && resp.headers().contains_key(header::LOCATION) {
        // The kubelet client refuses to follow redirects.
        return Err(backend("redirects forbidden".into()));
    }
    if !(200..=206).contains(&code) {
        let body = Limited::new(resp.into_body(), MAX_ERROR_BODY)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        return Err(ProxyError::KubeletStatus {
            code,
            body: String::from_utf8_lossy(&body).into_owned(),
            pod: meta(pod, "name").to_string(),
        });
    }
    // Streamed frame by frame: `logs -f` must see lines as the kubelet writes them.
    let body = resp
        .into_body()
        .map_err(|e| Box::new(e) as BoxError)
        .boxed();
    Ok(plain_ok(body))
}

fn plain_ok(body: Body) -> Response<Body> {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/plain")
        .body(body)
        .expect("static response parts are valid")
}

/// Whether a request asks for a protocol upgrade (`Connection: Upgrade` and an `Upgrade`).
pub fn is_upgrade_request(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Headers of the client's request that must not reach the kubelet: the API server's own
/// credentials stay with it (kube-apiserver's authentication filter removes them).
fn forwardable(name: &header::HeaderName) -> bool {
    let n = name.as_str();
    // Framing headers describe the client's body, which is not forwarded (the upgraded
    // connection carries the data); hyper frames the empty body itself.
    !(n == "authorization"
        || n == "proxy-authorization"
        || n == "host"
        || n == "content-length"
        || n == "transfer-encoding"
        || n.starts_with("impersonate-"))
}

async fn forward_upgrade(
    cfg: &ProxyConfig,
    pod: &Value,
    node: Option<&Value>,
    path: String,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, ProxyError> {
    let (host, port) = node_target(cfg, pod, node)?;
    if !is_upgrade_request(req.headers()) {
        return Err(ProxyError::BadRequest("Upgrade request required".into()));
    }
    let host_port = join_host_port(&host, port);
    let client_upgrade = hyper::upgrade::on(&mut req);
    let stream = dial(cfg, &host, port, cfg.kubelet_ca.is_some())
        .await
        .map_err(|e| ProxyError::Backend(format!("error dialing backend: {e}")))?;
    let mut send = handshake(stream)
        .await
        .map_err(|e| ProxyError::Backend(format!("error sending request: {e}")))?;
    let mut out = Request::builder()
        .method(req.method().clone())
        .uri(path.as_str());
    for (name, value) in req.headers() {
        if forwardable(name) {
            out = out.header(name, value);
        }
    }
    let out = out
        .header(header::HOST, host_port.as_str())
        .body(empty())
        .map_err(|e| ProxyError::Backend(format!("error sending request: {e}")))?;
    let mut resp = send
        .send_request(out)
        .await
        .map_err(|e| ProxyError::Backend(format!("error sending request: {e}")))?;
    let status = resp.status();
    if status == StatusCode::SWITCHING_PROTOCOLS {
        let kubelet_upgrade = hyper::upgrade::on(&mut resp);
        let mut back = Response::builder().status(status);
        for (name, value) in resp.headers() {
            back = back.header(name, value);
        }
        tokio::spawn(async move {
            match tokio::try_join!(client_upgrade, kubelet_upgrade) {
                Ok((client, kubelet)) => splice(TokioIo::new(client), TokioIo::new(kubelet)).await,
                Err(e) => tracing::debug!(error = %e, "upgrade did not complete"),
            }
        });
        return back
            .body(empty())
            .map_err(|e| ProxyError::Backend(e.to_string()));
    }
    if status.as_u16() < 400 {
        return Err(ProxyError::Backend(format!(
            "invalid upgrade response: status code {}",
            status.as_u16()
        )));
    }
    // An error from the kubelet goes back to the client as it is.
    let headers = resp.headers().clone();
    let body = Limited::new(resp.into_body(), MAX_ERROR_BODY)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_else(|_| Bytes::new());
    let mut back = Response::builder().status(status);
    for (name, value) in &headers {
        if name != header::TRANSFER_ENCODING && name != header::CONTENT_LENGTH {
            back = back.header(name, value);
        }
    }
    back.header(header::CONNECTION, HeaderValue::from_static("close"))
        .body(crate::body::full(body))
        .map_err(|e| ProxyError::Backend(e.to_string()))
}

/// Copies both ways until the kubelet side ends (nothing more can reach the client) or
/// both have. A client half-close is passed on, so a kubelet may still answer it.
async fn splice<A, B>(client: A, kubelet: B)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut kr, mut kw) = tokio::io::split(kubelet);
    let up = async {
        let _ = tokio::io::copy(&mut cr, &mut kw).await;
        let _ = kw.shutdown().await;
    };
    let down = async {
        let _ = tokio::io::copy(&mut kr, &mut cw).await;
        let _ = cw.shutdown().await;
    };
    tokio::pin!(up, down);
    tokio::select! {
        _ = &mut down => {}
        _ = &mut up => down.await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(node: &str, containers: &[&str], init: &[&str]) -> Value {
        let c = |names: &[&str]| names.iter().map(|n| json!({"name": n})).collect::<Vec<_>>();
        json!({
            "metadata": {"name": "web", "namespace": "team-a"},
            "spec": {"nodeName": node, "containers": c(containers), "initContainers": c(init)},
        })
    }

    fn node(addresses: &[(&str, &str)], port: i64) -> Value {
        json!({
            "metadata": {"name": "n1"},
            "status": {
                "addresses": addresses.iter().map(|(t, a)| json!({"type": t, "address": a})).collect::<Vec<_>>(),
                "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
            }
        })
    }

    fn prefs() -> Vec<String> {
        DEFAULT_ADDRESS_TYPES
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    #[test]
    fn address_follows_preference_order_not_list_order() {
        let n = node(
            &[
                ("ExternalIP", "203.0.113.9"),
                ("InternalIP", "127.0.0.9"),
                ("Hostname", "n1"),
            ],
            0,
        );
        assert_eq!(kubelet_target(&n, &prefs()).unwrap(), ("n1".into(), 10250));
        let ip_first = vec!["InternalIP".to_string(), "Hostname".to_string()];
        assert_eq!(
            kubelet_target(&n, &ip_first).unwrap(),
            ("127.0.0.9".into(), 10250)
        );
    }

    #[test]
    fn port_comes_from_daemon_endpoints_when_positive() {
        let n = node(&[("InternalIP", "127.0.0.9")], 31250);
        assert_eq!(kubelet_target(&n, &prefs()).unwrap().1, 31250);
        let n = node(&[("InternalIP", "127.0.0.9")], -1);
        assert_eq!(kubelet_target(&n, &prefs()).unwrap().1, 10250);
    }

    #[test]
    fn no_preferred_address_lists_known_ones() {
        let n = node(&[("InternalIP", "127.0.0.9")], 0);
        let err = kubelet_target(&n, &["Hostname".to_string()]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no preferred addresses found; known addresses: [{InternalIP 127.0.0.9}]"
        );
    }

    #[test]
    fn container_choice_matches_kube_apiserver() {
        assert_eq!(choose_container(&pod("n", &["a"], &[]), None).unwrap(), "a");
        assert_eq!(
            choose_container(&pod("n", &["a", "b"], &["i"]), Some("i")).unwrap(),
            "i"
        );
        assert_eq!(
            choose_container(&pod("n", &["a", "b"], &["i"]), None)
                .unwrap_err()
                .to_string(),
            "a container name must be specified for pod web, choose one of: [i a b]"
        );
        assert_eq!(
            choose_container(&pod("n", &["a"], &[]), Some("c"))
                .unwrap_err()
                .to_string(),
            "container c is not valid for pod web"
        );
        assert_eq!(
            choose_container(&pod("n", &[], &[]), None)
                .unwrap_err()
                .to_string(),
            "a container name must be specified for pod web"
        );
    }

    #[test]
    fn log_query_maps_only_true_flags_and_passes_numbers() {
        let loc = log_location(
            &pod("n", &["app"], &[]),
            "follow=true&previous=false&timestamps=1&tailLines=5&limitBytes=100&sinceSeconds=60&container=app",
        )
        .unwrap();
        assert_eq!(
            loc.path_and_query.unwrap(),
            "/containerLogs/team-a/web/app?follow=true&limitBytes=100&sinceSeconds=60&tailLines=5&timestamps=true"
        );
        let loc = log_location(
            &pod("n", &["app"], &[]),
            "sinceTime=2024-05-01T10:00:00%2B02:00",
        )
        .unwrap();
        assert_eq!(
            loc.path_and_query.unwrap(),
            "/containerLogs/team-a/web/app?sinceTime=2024-05-01T08%3A00%3A00Z"
        );
    }

    #[test]
    fn log_options_are_validated() {
        let p = pod("n", &["app"], &[]);
        let e = log_location(&p, "tailLines=-1").unwrap_err();
        assert_eq!(
            e.to_string(),
            "PodLogOptions \"web\" is invalid: tailLines: Invalid value: -1: must be greater than or equal to 0"
        );
        assert!(matches!(
            log_location(&p, "sinceSeconds=5&sinceTime=2024-05-01T10:00:00Z"),
            Err(ProxyError::InvalidLogOptions { .. })
        ));
        assert!(matches!(
            log_location(&p, "tailLines=abc"),
            Err(ProxyError::BadRequest(_))
        ));
    }

    #[test]
    fn unscheduled_pod_logs_are_empty_but_exec_is_refused() {
        let p = pod("", &["app"], &[]);
        assert_eq!(log_location(&p, "").unwrap().path_and_query, None);
        assert_eq!(
            exec_location(&p, "exec", "command=ls")
                .unwrap_err()
                .to_string(),
            "pod web does not have a host assigned"
        );
        assert_eq!(
            port_forward_location(&p, "ports=80")
                .unwrap_err()
                .to_string(),
            "pod web does not have a host assigned"
        );
    }

    #[test]
    fn exec_query_maps_to_kubelet_flags() {
        let p = pod("n", &["app"], &[]);
        assert_eq!(
            exec_location(
                &p,
                "exec",
                "command=sh&command=-c&command=echo+a%26b&stdin=true&stdout=true&stderr=true&tty=false"
            )
            .unwrap(),
            "/exec/team-a/web/app?command=sh&command=-c&command=echo+a%26b&error=1&input=1&output=1"
        );
        assert_eq!(
            exec_location(&p, "attach", "stdin=1&tty=true&command=ignored").unwrap(),
            "/attach/team-a/web/app?input=1&tty=1"
        );
    }

    #[test]
    fn port_forward_ports_are_joined() {
        let p = pod("n", &["app"], &[]);
        assert_eq!(
            port_forward_location(&p, "ports=80&ports=443").unwrap(),
            "/portForward/team-a/web?port=80%2C443"
        );
        assert!(port_forward_location(&p, "ports=http").is_err());
    }

    #[test]
    fn only_loopback_is_dialed() {
        assert!(loopback_target("127.0.0.7", 1).is_ok());
        assert!(loopback_target("::1", 1).is_ok());
        assert!(loopback_target("::ffff:127.0.0.1", 1).is_ok());
        assert!(loopback_target("localhost", 1).is_ok());
        for bad in [
            "10.0.0.5",
            "0.0.0.0",
            "::",
            "192.168.1.1",
            "::ffff:10.0.0.1",
            "node-1",
        ] {
            let e = loopback_target(bad, 10250).unwrap_err();
            assert!(e.starts_with("dial tcp"), "{e}");
            assert!(
                e.contains("not dialed") || e.contains("not resolved"),
                "{e}"
            );
        }
    }

    #[test]
    fn kubelet_errors_become_statuses() {
        let r = kubelet_status(404, "pod \"x\" does not exist", "web");
        assert_eq!(r.status(), 404);
        let r = kubelet_status(400, "bad", "web");
        assert_eq!(r.status(), 400);
    }
}
