//! Routing: which status and which constant body a request gets.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{ALLOW, CONNECTION, HeaderValue};
use hyper::{Method, Response, StatusCode};

// The kubelet ignores probe bodies; a person running curl is the only reader. Constants,
// never a status document: a fixed body is what guarantees the unauthenticated endpoint
// says nothing about the node or the control plane.
const BODY_OK: &[u8] = b"ok";
const BODY_NOT_READY: &[u8] = b"not ready";
const BODY_NOT_FOUND: &[u8] = b"not found";
const BODY_METHOD_NOT_ALLOWED: &[u8] = b"method not allowed";
const BODY_TOO_LARGE: &[u8] = b"request body not accepted";

/// The request facts routing depends on.
pub(crate) struct Probe<'a> {
    pub(crate) method: &'a Method,
    pub(crate) path: &'a str,
    /// The request announces a body (a non-zero Content-Length or chunked encoding).
    pub(crate) has_body: bool,
}

/// Decides the response. Pure: readiness is passed in, computed in the background.
pub(crate) fn respond(probe: &Probe<'_>, ready: bool) -> Response<Full<Bytes>> {
    // Probes never carry a body. Refusing before reading it means a client cannot make the
    // agent buffer anything, whatever it claims to send.
    if probe.has_body {
        let mut resp = plain(StatusCode::PAYLOAD_TOO_LARGE, BODY_TOO_LARGE);
        // The unread body is still in flight: the connection cannot be reused.
        resp.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        return resp;
    }
    let ok_when = match probe.path {
        "/healthz" => true,
        "/readyz" => ready,
        _ => return plain(StatusCode::NOT_FOUND, BODY_NOT_FOUND),
    };
    if probe.method != Method::GET && probe.method != Method::HEAD {
        let mut resp = plain(StatusCode::METHOD_NOT_ALLOWED, BODY_METHOD_NOT_ALLOWED);
        resp.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return resp;
    }
    if ok_when {
        plain(StatusCode::OK, BODY_OK)
    } else {
        plain(StatusCode::SERVICE_UNAVAILABLE, BODY_NOT_READY)
    }
}

/// A response with only the headers hyper adds (length, date). No Content-Type: the bodies
/// are short fixed ASCII words nothing could mistake for markup, the kubelet ignores them,
/// and the header would cost a header-map allocation on every probe (about 5% of the
/// listener's CPU per request, see docs/benchmarks/health.md).
fn plain(status: StatusCode, body: &'static [u8]) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from_static(body)));
    *resp.status_mut() = status;
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn call(method: &Method, path: &str, has_body: bool, ready: bool) -> (u16, Vec<u8>) {
        let resp = respond(
            &Probe {
                method,
                path,
                has_body,
            },
            ready,
        );
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, body.to_vec())
    }

    #[tokio::test]
    async fn routes() {
        let get = Method::GET;
        assert_eq!(
            call(&get, "/healthz", false, false).await,
            (200, b"ok".to_vec())
        );
        assert_eq!(
            call(&get, "/readyz", false, true).await,
            (200, b"ok".to_vec())
        );
        assert_eq!(
            call(&get, "/readyz", false, false).await,
            (503, b"not ready".to_vec())
        );
        assert_eq!(call(&Method::HEAD, "/readyz", false, true).await.0, 200);
        for path in ["/", "/healthz/", "/livez", "/readyz/verbose", "healthz"] {
            assert_eq!(call(&get, path, false, true).await.0, 404, "{path}");
        }
        for method in [Method::POST, Method::PUT, Method::DELETE, Method::OPTIONS] {
            let resp = respond(
                &Probe {
                    method: &method,
                    path: "/healthz",
                    has_body: false,
                },
                true,
            );
            assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
            assert_eq!(resp.headers()[ALLOW], "GET, HEAD");
        }
        assert_eq!(call(&get, "/healthz", true, true).await.0, 413);
        assert_eq!(call(&Method::POST, "/nope", true, true).await.0, 413);
    }
}
