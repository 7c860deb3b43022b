//! Token discovery: how a joining node learns which CA to trust from nothing but the
//! API address, a bootstrap token and a CA pin (kubeadm's `--discovery-token-ca-cert-hash`).
//!
//! The cluster publishes `kube-public/cluster-info`, readable anonymously: its `kubeconfig`
//! key carries the API server URL and CA, and the bootstrap signer adds one
//! `jws-kubeconfig-<token-id>` key per signing token: a detached JWS (HS256, keyed with the
//! token's secret) over that kubeconfig. The joiner
//!
//! 1. fetches cluster-info over TLS **without** verifying the server (it trusts nothing yet),
//! 2. checks the signature with its token ([`verify_detached_jws`]): only someone holding
//!    the token could have produced it, so the kubeconfig is the cluster's,
//! 3. checks the CA in it against the pin ([`CaPin`]: `sha256:` of the CA certificate's
//!    DER SubjectPublicKeyInfo, as `pki::ca_cert_hash` computes it),
//! 4. fetches cluster-info again, this time verifying the server against that CA, and
//!    requires the same kubeconfig.
//!
//! Only then is the CA trusted. Verification is pure ([`verify_cluster_info`]) and unit
//! tested with signatures computed in the tests; [`discover`] is the thin network layer.
//! Both the control-plane join and a worker join use it.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;

use crate::tokens::BootstrapToken;

/// Namespace of the cluster-info ConfigMap.
pub const CLUSTER_INFO_NAMESPACE: &str = "kube-public";
/// Name of the cluster-info ConfigMap.
pub const CLUSTER_INFO_NAME: &str = "cluster-info";
/// The data key holding the cluster's kubeconfig.
pub const KUBECONFIG_KEY: &str = "kubeconfig";
/// Prefix of the data keys holding one token's signature.
pub const JWS_KEY_PREFIX: &str = "jws-kubeconfig-";

/// The data key of `token_id`'s signature.
pub fn jws_key(token_id: &str) -> String {
    format!("{JWS_KEY_PREFIX}{token_id}")
}

/// What went wrong while discovering the cluster. Every variant means nothing was trusted
/// and nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The pin is not `sha256:<64 hex digits>`.
    #[error(
        "CA pin {text:?} is malformed: {reason} (expected sha256:<64 hex digits>, as \
         `stratum-server token create` prints)"
    )]
    BadPin {
        /// The text given.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The server address cannot become a URL.
    #[error("server address {server:?} is not HOST:PORT: {reason}")]
    BadServer {
        /// The address given.
        server: String,
        /// Why.
        reason: String,
    },
    /// cluster-info could not be fetched.
    #[error("cannot read {CLUSTER_INFO_NAMESPACE}/{CLUSTER_INFO_NAME} from {server} ({phase})")]
    Fetch {
        /// The API server asked.
        server: String,
        /// Which fetch: before or after the CA is trusted.
        phase: &'static str,
        /// The client's error.
        #[source]
        source: Box<kube::Error>,
    },
    /// cluster-info has no kubeconfig.
    #[error(
        "{CLUSTER_INFO_NAMESPACE}/{CLUSTER_INFO_NAME} has no {KUBECONFIG_KEY:?} key: the \
         cluster was not bootstrapped by `stratum-server up`, or the object was edited"
    )]
    NoKubeconfig,
    /// No signature for this token.
    #[error(
        "{CLUSTER_INFO_NAMESPACE}/{CLUSTER_INFO_NAME} carries no signature for token {token_id}: \
         the token is unknown, expired or deleted, or it was minted without \
         usage-bootstrap-signing; mint a new join command with `stratum-server token create`"
    )]
    NoSignature {
        /// The token's public id.
        token_id: String,
    },
    /// The signature does not verify: the kubeconfig was not signed with this token.
    #[error(
        "the cluster-info signature for token {token_id} does not verify ({reason}): the token \
         secret is wrong, or something between you and the server altered cluster-info; \
         nothing was trusted"
    )]
    BadSignature {
        /// The token's public id.
        token_id: String,
        /// Why.
        reason: String,
    },
    /// The signed kubeconfig cannot be used.
    #[error("the signed cluster-info kubeconfig is unusable: {reason}")]
    BadKubeconfig {
        /// Why.
        reason: String,
    },
    /// The CA does not match the pin.
    #[error(
        "the cluster CA's public key hash is {actual}, not the pinned {expected}: refusing to \
         trust this server; check the --discovery-token-ca-cert-hash you were given \
         (`stratum-server certs generate` and `token create` print it)"
    )]
    PinMismatch {
        /// The pin given.
        expected: String,
        /// The CA's hash.
        actual: String,
    },
    /// The verified server served a different cluster-info than the unverified fetch.
    #[error(
        "cluster-info changed between the unverified and the verified fetch from {server}; \
         retry, and if it persists suspect an interception"
    )]
    Changed {
        /// The server.
        server: String,
    },
    /// The client for a fetch could not be built.
    #[error("cannot build a client for {server}: {reason}")]
    Client {
        /// The server.
        server: String,
        /// Why.
        reason: String,
    },
    /// Discovery kept failing on a retryable error until its deadline.
    #[error("discovery gave up after {waited:?}: {last}")]
    Timeout {
        /// How long it tried.
        waited: Duration,
        /// The last error.
        last: Box<DiscoveryError>,
    },
}

impl DiscoveryError {
    /// Whether trying again later may succeed: the server was not reachable, or the
    /// bootstrap signer has not signed for this token yet. A bad pin or signature never
    /// gets better.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            DiscoveryError::Fetch { .. } | DiscoveryError::NoSignature { .. }
        )
    }
}

/// A CA pin: the SHA-256 of the CA certificate's DER SubjectPublicKeyInfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaPin {
    hex: String,
}

impl CaPin {
    /// Parses `sha256:<64 hex digits>` (kubeadm's format; case-insensitive hex).
    pub fn parse(text: &str) -> Result<CaPin, DiscoveryError> {
        let bad = |reason: &str| DiscoveryError::BadPin {
            text: text.to_string(),
            reason: reason.to_string(),
        };
        let trimmed = text.trim();
        let Some((algo, hex)) = trimmed.split_once(':') else {
            return Err(bad("it has no \"sha256:\" prefix"));
        };
        if !algo.eq_ignore_ascii_case("sha256") {
            return Err(bad("only sha256 pins are supported"));
        }
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("the hash must be 64 hex digits"));
        }
        Ok(CaPin {
            hex: hex.to_ascii_lowercase(),
        })
    }

    /// The pin as `sha256:<hex>`.
    pub fn as_text(&self) -> String {
        format!("sha256:{}", self.hex)
    }

    /// Whether the PEM certificate's public key matches this pin.
    pub fn check(&self, ca_pem: &[u8]) -> Result<(), DiscoveryError> {
        let actual = pki::ca_cert_hash(ca_pem).map_err(|e| DiscoveryError::BadKubeconfig {
            reason: format!("its CA is not a certificate: {e}"),
        })?;
        let ours = self.as_text();
        // The pin is public (it is printed beside the join command): no need for a
        // constant-time compare.
        if actual == ours {
            Ok(())
        } else {
            Err(DiscoveryError::PinMismatch {
                expected: ours,
                actual,
            })
        }
    }
}

impl std::fmt::Display for CaPin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct JwsHeader {
    alg: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kid: Option<String>,
}

/// The detached JWS (`<header>..<signature>`, HS256 keyed with the token secret) over
/// `payload`, with the token id as `kid`: what the bootstrap signer publishes as
/// `jws-kubeconfig-<token-id>`.
pub fn sign_detached(payload: &[u8], token: &BootstrapToken) -> String {
    let header = serde_json::json!({"alg": "HS256", "kid": token.id()}).to_string();
    let header = URL_SAFE_NO_PAD.encode(header.as_bytes());
    let input = format!("{header}.{}", URL_SAFE_NO_PAD.encode(payload));
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, token.secret().as_bytes());
    let tag = ring::hmac::sign(&key, input.as_bytes());
    format!("{header}..{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
}

/// Verifies a detached JWS over `payload` with `token`: the header must say HS256 (any
/// other algorithm, `none` included, is refused), its `kid`, when present, must be the
/// token id, and the HMAC must match (compared in constant time).
pub fn verify_detached_jws(
    jws: &str,
    payload: &[u8],
    token: &BootstrapToken,
) -> Result<(), DiscoveryError> {
    let bad = |reason: &str| DiscoveryError::BadSignature {
        token_id: token.id().to_string(),
        reason: reason.to_string(),
    };
    let mut parts = jws.trim().split('.');
    let (Some(header_b64), Some(body), Some(sig_b64), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("not a compact JWS of three parts"));
    };
    if !body.is_empty() {
        return Err(bad("the JWS is not detached (it carries its own payload)"));
    }
    let header_json = URL_SAFE_NO_PAD
        .decode(header_b64)
        .map_err(|_| bad("its header is not base64url"))?;
    let header: JwsHeader =
        serde_json::from_slice(&header_json).map_err(|_| bad("its header is not JSON"))?;
    if header.alg != "HS256" {
        return Err(bad("its algorithm is not HS256"));
    }
    if header.kid.as_deref().is_some_and(|kid| kid != token.id()) {
        return Err(bad("it was signed for another token id"));
    }
    let signature = URL_SAFE_NO_PAD
        .decode(sig_b64)
        .map_err(|_| bad("its signature is not base64url"))?;
    let input = format!("{header_b64}.{}", URL_SAFE_NO_PAD.encode(payload));
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, token.secret().as_bytes());
    ring::hmac::verify(&key, input.as_bytes(), &signature)
        .map_err(|_| bad("the HMAC does not match"))
}

/// The cluster as a verified cluster-info describes it.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterInfo {
    /// The API server URL the cluster publishes.
    pub server: String,
    /// The cluster CA (PEM), checked against the pin.
    pub ca_pem: Vec<u8>,
    /// The signed kubeconfig, as published.
    pub kubeconfig: String,
}

impl std::fmt::Debug for ClusterInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterInfo")
            .field("server", &self.server)
            .field("ca_pem_bytes", &self.ca_pem.len())
            .finish_non_exhaustive()
    }
}

/// Verifies cluster-info's data (pure): this token's signature over the kubeconfig, then
/// the CA against the pin. Returns the cluster it describes.
pub fn verify_cluster_info(
    data: &BTreeMap<String, String>,
    token: &BootstrapToken,
    pin: &CaPin,
) -> Result<ClusterInfo, DiscoveryError> {
    let kubeconfig = data
        .get(KUBECONFIG_KEY)
        .ok_or(DiscoveryError::NoKubeconfig)?;
    let jws = data
        .get(&jws_key(token.id()))
        .ok_or_else(|| DiscoveryError::NoSignature {
            token_id: token.id().to_string(),
        })?;
    verify_detached_jws(jws, kubeconfig.as_bytes(), token)?;
    let bad = |reason: String| DiscoveryError::BadKubeconfig { reason };
    let parsed = kube::config::Kubeconfig::from_yaml(kubeconfig)
        .map_err(|e| bad(format!("not a kubeconfig: {e}")))?;
    let [cluster] = parsed.clusters.as_slice() else {
        return Err(bad(format!(
            "it must name exactly one cluster, it names {}",
            parsed.clusters.len()
        )));
    };
    let cluster = cluster
        .cluster
        .as_ref()
        .ok_or_else(|| bad("its cluster entry is empty".into()))?;
    let server = cluster
        .server
        .clone()
        .ok_or_else(|| bad("its cluster has no server".into()))?;
    let ca_b64 = cluster
        .certificate_authority_data
        .as_deref()
        .ok_or_else(|| bad("its cluster has no certificate-authority-data".into()))?;
    let ca_pem = STANDARD
        .decode(ca_b64.trim())
        .map_err(|_| bad("its certificate-authority-data is not base64".into()))?;
    pin.check(&ca_pem)?;
    if !server.starts_with("https://") {
        return Err(bad(format!("its server {server:?} is not an https:// URL")));
    }
    Ok(ClusterInfo {
        server,
        ca_pem,
        kubeconfig: kubeconfig.clone(),
    })
}

/// The kubeconfig `cluster-info` publishes for `server` and `ca_pem` (no user: it is
/// public).
pub fn cluster_info_kubeconfig(server: &str, ca_pem: &[u8]) -> String {
    let value = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "", "cluster": {
            "server": server,
            "certificate-authority-data": STANDARD.encode(ca_pem),
        }}],
        "contexts": [],
        "users": [],
        "current-context": "",
        "preferences": {},
    });
    // JSON is YAML; serde_yaml renders it in block style, which is what kubectl shows.
    serde_yaml::to_string(&value).unwrap_or_else(|_| value.to_string())
}

/// A bootstrap kubeconfig: `server`, trusting `ca_pem`, authenticating with `token`. It
/// holds the token secret: write it 0600.
pub fn bootstrap_kubeconfig(server: &str, ca_pem: &[u8], token: &BootstrapToken) -> String {
    let value = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kubernetes", "cluster": {
            "server": server,
            "certificate-authority-data": STANDARD.encode(ca_pem),
        }}],
        "users": [{"name": "tls-bootstrap-token-user", "user": {"token": token.to_string()}}],
        "contexts": [{"name": "tls-bootstrap-token-user@kubernetes", "context": {
            "cluster": "kubernetes", "user": "tls-bootstrap-token-user",
        }}],
        "current-context": "tls-bootstrap-token-user@kubernetes",
    });
    serde_yaml::to_string(&value).unwrap_or_else(|_| value.to_string())
}

/// `https://HOST:PORT` of a `--server` value (`HOST:PORT`, `[v6]:PORT`, or a URL).
pub fn server_url(server: &str) -> Result<String, DiscoveryError> {
    let bad = |reason: &str| DiscoveryError::BadServer {
        server: server.to_string(),
        reason: reason.to_string(),
    };
    let trimmed = server.trim().trim_end_matches('/');
    let rest = match trimmed.split_once("://") {
        Some(("https", rest)) => rest,
        Some(_) => return Err(bad("only https:// is supported")),
        None => trimmed,
    };
    if rest.is_empty() || rest.contains('/') {
        return Err(bad("expected HOST:PORT"));
    }
    let url = format!("https://{rest}");
    url.parse::<http::Uri>()
        .map_err(|e| bad(&e.to_string()))?
        .host()
        .ok_or_else(|| bad("it has no host"))?;
    Ok(url)
}

/// A client for `url` that trusts `ca_pem`, or, with `None`, trusts any server (the first,
/// unverified fetch), authenticating with `token` or as anonymous.
pub fn client_for(
    url: &str,
    ca_pem: Option<&[u8]>,
    token: Option<&BootstrapToken>,
    timeout: Duration,
) -> Result<kube::Client, DiscoveryError> {
    let bad = |reason: String| DiscoveryError::Client {
        server: url.to_string(),
        reason,
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| bad(e.to_string()))?;
    let mut config = kube::Config::new(uri);
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    match ca_pem {
        Some(pem) => {
            let der = pem_certs_der(pem).map_err(bad)?;
            config.root_cert = Some(der);
        }
        None => config.accept_invalid_certs = true,
    }
    if let Some(token) = token {
        config.auth_info.token = Some(token.to_string().into());
    }
    kube::Client::try_from(config).map_err(|e| bad(e.to_string()))
}

fn pem_certs_der(pem: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let mut reader = std::io::BufReader::new(pem);
    let certs: Vec<Vec<u8>> = rustls_pemfile::certs(&mut reader)
        .map(|c| c.map(|c| c.as_ref().to_vec()))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the CA is not PEM: {e}"))?;
    if certs.is_empty() {
        return Err("the CA holds no certificate".into());
    }
    Ok(certs)
}

async fn fetch(
    client: kube::Client,
    server: &str,
    phase: &'static str,
) -> Result<BTreeMap<String, String>, DiscoveryError> {
    let api: Api<ConfigMap> = Api::namespaced(client, CLUSTER_INFO_NAMESPACE);
    let cm = api
        .get(CLUSTER_INFO_NAME)
        .await
        .map_err(|e| DiscoveryError::Fetch {
            server: server.to_string(),
            phase,
            source: Box::new(e),
        })?;
    Ok(cm.data.unwrap_or_default())
}

/// A discovered cluster: the verified cluster-info, and the URL it was fetched from.
#[derive(Debug, Clone)]
pub struct Discovered {
    /// What cluster-info says, verified.
    pub info: ClusterInfo,
    /// The `--server` URL, now verified against the CA.
    pub server_url: String,
}

impl Discovered {
    /// A client for the discovered cluster, authenticating with `token`.
    pub fn bootstrap_client(
        &self,
        token: &BootstrapToken,
        timeout: Duration,
    ) -> Result<kube::Client, DiscoveryError> {
        client_for(
            &self.server_url,
            Some(&self.info.ca_pem),
            Some(token),
            timeout,
        )
    }
}

/// How long discovery keeps trying, and how long one request may take.
#[derive(Debug, Clone, Copy)]
pub struct DiscoveryTimeouts {
    /// Total time to keep retrying an unreachable server or a missing signature.
    pub total: Duration,
    /// One request.
    pub request: Duration,
}

impl Default for DiscoveryTimeouts {
    fn default() -> Self {
        DiscoveryTimeouts {
            total: Duration::from_secs(60),
            request: Duration::from_secs(10),
        }
    }
}

/// Discovers the cluster at `server` (HOST:PORT): an unverified fetch, signature and pin
/// checks, then a verified fetch that must match. An unreachable server or a signature
/// not published yet is retried until `timeouts.total`; a bad signature or pin is refused
/// at once.
pub async fn discover(
    server: &str,
    token: &BootstrapToken,
    pin: &CaPin,
    timeouts: DiscoveryTimeouts,
) -> Result<Discovered, DiscoveryError> {
    let url = server_url(server)?;
    let start = tokio::time::Instant::now();
    let mut pause = Duration::from_millis(200);
    loop {
        match discover_once(&url, token, pin, timeouts.request).await {
            Ok(d) => return Ok(d),
            Err(e) if e.is_retryable() => {
                if start.elapsed() + pause > timeouts.total {
                    return Err(DiscoveryError::Timeout {
                        waited: start.elapsed(),
                        last: Box::new(e),
                    });
                }
                tracing::info!(server = %url, error = %e, "discovery not ready; retrying in {pause:?}");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e),
        }
    }
}

async fn discover_once(
    url: &str,
    token: &BootstrapToken,
    pin: &CaPin,
    timeout: Duration,
) -> Result<Discovered, DiscoveryError> {
    let insecure = client_for(url, None, None, timeout)?;
    let data = fetch(insecure, url, "unverified fetch").await?;
    let info = verify_cluster_info(&data, token, pin)?;
    let secure = client_for(url, Some(&info.ca_pem), None, timeout)?;
    let again = fetch(secure, url, "fetch verified against the pinned CA").await?;
    if again.get(KUBECONFIG_KEY) != Some(&info.kubeconfig) {
        return Err(DiscoveryError::Changed {
            server: url.to_string(),
        });
    }
    tracing::info!(server = %url, cluster = %info.server, pin = %pin, "cluster-info verified");
    Ok(Discovered {
        info,
        server_url: url.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> BootstrapToken {
        BootstrapToken::parse("abcdef.0123456789abcdef").unwrap()
    }

    fn ca() -> (String, CaPin) {
        let ca = pki::Ca::generate("kubernetes").unwrap();
        let pem = ca.cert_pem().to_string();
        let pin = CaPin::parse(&pki::ca_cert_hash(pem.as_bytes()).unwrap()).unwrap();
        (pem, pin)
    }

    fn signed(kubeconfig: &str, t: &BootstrapToken) -> BTreeMap<String, String> {
        let mut data = BTreeMap::new();
        data.insert(KUBECONFIG_KEY.to_string(), kubeconfig.to_string());
        data.insert(jws_key(t.id()), sign_detached(kubeconfig.as_bytes(), t));
        data
    }

    #[test]
    fn signed_cluster_info_with_the_right_pin_verifies() {
        let (pem, pin) = ca();
        let kc = cluster_info_kubeconfig("https://10.0.0.1:6443", pem.as_bytes());
        let info = verify_cluster_info(&signed(&kc, &token()), &token(), &pin).unwrap();
        assert_eq!(info.server, "https://10.0.0.1:6443");
        assert_eq!(info.ca_pem, pem.as_bytes());
    }

    #[test]
    fn a_wrong_pin_is_refused_naming_both_hashes() {
        let (pem, _) = ca();
        let (_, other_pin) = ca();
        let kc = cluster_info_kubeconfig("https://10.0.0.1:6443", pem.as_bytes());
        let err = verify_cluster_info(&signed(&kc, &token()), &token(), &other_pin).unwrap_err();
        assert!(matches!(err, DiscoveryError::PinMismatch { .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains(&other_pin.as_text()), "{text}");
        assert!(!err.is_retryable());
    }

    #[test]
    fn a_signature_by_another_secret_or_over_other_bytes_is_refused() {
        let (pem, pin) = ca();
        let kc = cluster_info_kubeconfig("https://10.0.0.1:6443", pem.as_bytes());
        let impostor = BootstrapToken::parse("abcdef.zzzzzzzzzzzzzzzz").unwrap();
        let mut data = signed(&kc, &impostor);
        let err = verify_cluster_info(&data, &token(), &pin).unwrap_err();
        assert!(matches!(err, DiscoveryError::BadSignature { .. }), "{err}");

        // The kubeconfig swapped for another server after signing.
        data = signed(&kc, &token());
        let swapped = cluster_info_kubeconfig("https://6.6.6.6:6443", pem.as_bytes());
        data.insert(KUBECONFIG_KEY.into(), swapped);
        let err = verify_cluster_info(&data, &token(), &pin).unwrap_err();
        assert!(err.to_string().contains("HMAC does not match"), "{err}");
    }

    #[test]
    fn alg_none_attached_payloads_and_foreign_kids_are_refused() {
        let t = token();
        let payload = b"x";
        let none = format!(
            "{}..",
            URL_SAFE_NO_PAD.encode(br#"{"alg":"none","kid":"abcdef"}"#)
        );
        assert!(verify_detached_jws(&none, payload, &t).is_err());
        let good = sign_detached(payload, &t);
        let (h, s) = good.split_once("..").unwrap();
        let attached = format!("{h}.{}.{s}", URL_SAFE_NO_PAD.encode(payload));
        let err = verify_detached_jws(&attached, payload, &t).unwrap_err();
        assert!(err.to_string().contains("not detached"), "{err}");
        let other_kid = BootstrapToken::parse("zzzzzz.0123456789abcdef").unwrap();
        let err =
            verify_detached_jws(&sign_detached(payload, &other_kid), payload, &t).unwrap_err();
        assert!(err.to_string().contains("another token id"), "{err}");
        verify_detached_jws(&good, payload, &t).unwrap();
    }

    #[test]
    fn missing_signature_is_retryable_missing_kubeconfig_is_not() {
        let (pem, pin) = ca();
        let kc = cluster_info_kubeconfig("https://10.0.0.1:6443", pem.as_bytes());
        let mut data = BTreeMap::new();
        data.insert(KUBECONFIG_KEY.to_string(), kc);
        let err = verify_cluster_info(&data, &token(), &pin).unwrap_err();
        assert!(err.is_retryable(), "{err}");
        let err = verify_cluster_info(&BTreeMap::new(), &token(), &pin).unwrap_err();
        assert!(matches!(err, DiscoveryError::NoKubeconfig));
    }

    #[test]
    fn pins_parse_like_kubeadm() {
        let hex = "a".repeat(64);
        assert_eq!(
            CaPin::parse(&format!("SHA256:{}", hex.to_uppercase()))
                .unwrap()
                .as_text(),
            format!("sha256:{hex}")
        );
        for bad in [
            "",
            "abc",
            "md5:00",
            "sha256:xyz",
            &format!("sha256:{}", "a".repeat(63)),
        ] {
            assert!(CaPin::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn pin_matches_what_pki_prints() {
        let (pem, pin) = ca();
        pin.check(pem.as_bytes()).unwrap();
    }

    #[test]
    fn server_urls() {
        assert_eq!(
            server_url("10.0.0.1:6443").unwrap(),
            "https://10.0.0.1:6443"
        );
        assert_eq!(
            server_url("[fd00::1]:6443").unwrap(),
            "https://[fd00::1]:6443"
        );
        assert_eq!(
            server_url("https://cp.example:6443/").unwrap(),
            "https://cp.example:6443"
        );
        assert!(server_url("http://10.0.0.1:6443").is_err());
        assert!(server_url("10.0.0.1:6443/api").is_err());
    }
}
