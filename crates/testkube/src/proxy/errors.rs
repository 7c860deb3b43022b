//! Proxy failures and the `Status` kube-apiserver would answer for each.

use super::*;

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
pub(super) fn kubelet_status(code: u16, body: &str, pod: &str) -> Response<Body> {
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
