//! `Status` error bodies, shaped as kube-apiserver sends them
//! (`staging/src/k8s.io/apimachinery/pkg/api/errors/errors.go`).

use http::{Response, StatusCode, header};
use serde_json::{Value, json};

use crate::body::{Body, full};

/// A `Status` failure response: `code` is the HTTP status, `reason` the machine-readable
/// reason (`NotFound`, `Conflict`, ...), `details` the optional `details` object (whose
/// `kind` names the resource, e.g. "pods").
pub fn failure(code: u16, reason: &str, message: &str, details: Option<Value>) -> Response<Body> {
    let mut status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    });
    if let Some(details) = details {
        status["details"] = details;
    }
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(status.to_string()))
        .expect("static response parts are valid")
}
