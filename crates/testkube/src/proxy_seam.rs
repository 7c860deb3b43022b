//! The call site of the kubelet proxy (`crate::proxy`), kept apart from routing so the
//! proxy's configuration appears in one place.

use http::{Request, Response};
use hyper::body::Incoming;
use serde_json::Value;

use crate::body::Body;
use crate::proxy::ProxyConfig;
use crate::server::{KubeletSettings, State};
use crate::tls::CertPair;

/// The proxy configuration built once at start.
pub(crate) struct ProxyHolder {
    pub(crate) config: ProxyConfig,
}

impl ProxyHolder {
    /// The proxy's settings over its defaults, presenting `client` (issued by the
    /// server's CA, as kube-apiserver's kubelet client certificate is) to kubelets.
    pub(crate) fn new(settings: &KubeletSettings, client: &CertPair) -> Self {
        let mut config = ProxyConfig {
            client_cert_pem: client.cert_pem.clone(),
            client_key_pem: client.key_pem.clone(),
            ..ProxyConfig::default()
        };
        if let Some(types) = &settings.preferred_address_types {
            config.preferred_address_types = types.clone();
        }
        config.kubelet_ca = settings.kubelet_ca.clone();
        config.allow_non_loopback = settings.allow_non_loopback;
        ProxyHolder { config }
    }
}

/// Forwards a streaming pods subresource request to the pod's kubelet, answering with
/// the proxy's response as is (including 101 Switching Protocols for upgrades).
pub(crate) async fn forward(
    state: &State,
    pod: &Value,
    node: Option<&Value>,
    sub: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    crate::proxy::forward(&state.proxy_config.config, pod, node, sub, req).await
}

/// Forwards a `nodes/{name}/proxy/{path}` request to the node's kubelet.
pub(crate) async fn forward_node(
    state: &State,
    node: &Value,
    path: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    crate::proxy::forward_node(&state.proxy_config.config, node, path, req).await
}
