//! The call site of the kubelet proxy (`crate::proxy`), kept apart from routing so the
//! proxy's configuration type appears in one place.
//!
//! TEMPORARY: until `crate::proxy::forward` exists this answers 503 ServiceUnavailable.

use http::{Request, Response};
use hyper::body::Incoming;
use serde_json::Value;

use crate::body::Body;
use crate::server::{KubeletSettings, State};
use crate::status::ApiError;

/// The proxy configuration built once at start.
pub(crate) struct ProxyHolder {
    #[allow(dead_code)] // becomes the ProxyConfig once the proxy lands
    settings: KubeletSettings,
}

impl ProxyHolder {
    pub(crate) fn new(settings: &KubeletSettings) -> Self {
        ProxyHolder {
            settings: settings.clone(),
        }
    }
}

/// Forwards a streaming pods subresource request to the pod's kubelet.
pub(crate) async fn forward(
    _state: &State,
    _pod: &Value,
    _node: Option<&Value>,
    sub: &str,
    _req: Request<Incoming>,
) -> Response<Body> {
    ApiError::new(
        503,
        "ServiceUnavailable",
        format!("the kubelet proxy for pods/{sub} is not built into this testkube yet"),
    )
    .into_response()
}
