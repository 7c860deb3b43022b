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

use crate::resources::Resource;

/// An API error, rendered as a `Status` body by [`ApiError::into_response`].
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// Machine-readable reason (`NotFound`, `Conflict`, ...).
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// `details`, when the error concerns one object.
    pub details: Option<Value>,
    /// A `Retry-After` header value in seconds.
    pub retry_after: Option<u64>,
}

/// One `details.causes` entry of a 422 Invalid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    /// `FieldValueRequired`, `FieldValueInvalid`, ...
    pub reason: &'static str,
    /// The field path (`metadata.name`).
    pub field: String,
    /// What is wrong ("Required value: ...").
    pub message: String,
}

impl Cause {
    /// A required field is missing.
    pub fn required(field: &str, detail: &str) -> Self {
        let message = if detail.is_empty() {
            "Required value".to_string()
        } else {
            format!("Required value: {detail}")
        };
        Cause {
            reason: "FieldValueRequired",
            field: field.into(),
            message,
        }
    }
    /// A field holds a value that is not allowed.
    pub fn invalid(field: &str, value: &Value, detail: &str) -> Self {
        Cause {
            reason: "FieldValueInvalid",
            field: field.into(),
            message: format!("Invalid value: {value}: {detail}"),
        }
    }
    /// A change that is not permitted.
    pub fn forbidden(field: &str, detail: &str) -> Self {
        Cause {
            reason: "FieldValueForbidden",
            field: field.into(),
            message: format!("Forbidden: {detail}"),
        }
    }
    /// The `field: message` form used in the aggregate message.
    pub fn render(&self) -> String {
        format!("{}: {}", self.field, self.message)
    }
}

fn object_details(res: &Resource, name: &str) -> Value {
    let mut d = json!({"name": name, "kind": res.plural});
    if !res.group.is_empty() {
        d["group"] = json!(res.group);
    }
    d
}

impl ApiError {
    /// A bare error without details.
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }
    /// 404 NotFound for an object: `pods "x" not found`.
    pub fn not_found(res: &Resource, name: &str) -> Self {
        ApiError {
            details: Some(object_details(res, name)),
            ..Self::new(
                404,
                "NotFound",
                format!("{} \"{name}\" not found", res.qualified()),
            )
        }
    }
    /// 404 for a path that names no served resource.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource (path {path})"),
        )
    }
    /// 409 AlreadyExists.
    pub fn already_exists(res: &Resource, name: &str) -> Self {
        ApiError {
            details: Some(object_details(res, name)),
            ..Self::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", res.qualified()),
            )
        }
    }
    /// 409 Conflict: `Operation cannot be fulfilled on pods "x": <why>`.
    pub fn conflict(res: &Resource, name: &str, why: &str) -> Self {
        ApiError {
            details: Some(object_details(res, name)),
            ..Self::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": {why}",
                    res.qualified()
                ),
            )
        }
    }
    /// 422 Invalid with causes. `details.kind` is the Kind here, as kube-apiserver's
    /// `NewInvalid` reports the qualified kind rather than the resource.
    pub fn invalid(res: &Resource, name: &str, causes: &[Cause]) -> Self {
        let agg = if causes.len() == 1 {
            causes[0].render()
        } else {
            format!(
                "[{}]",
                causes
                    .iter()
                    .map(Cause::render)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let kind = if res.group.is_empty() {
            res.kind.to_string()
        } else {
            format!("{}.{}", res.kind, res.group)
        };
        let mut details = json!({
            "name": name,
            "kind": res.kind,
            "causes": causes.iter().map(|c| json!({
                "reason": c.reason, "message": c.message, "field": c.field,
            })).collect::<Vec<_>>(),
        });
        if !res.group.is_empty() {
            details["group"] = json!(res.group);
        }
        ApiError {
            details: Some(details),
            ..Self::new(
                422,
                "Invalid",
                format!("{kind} \"{name}\" is invalid: {agg}"),
            )
        }
    }
    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    /// 410 Expired (a resourceVersion older than the retained window).
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }
    /// 401 Unauthorized.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }
    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!(
                "the server does not allow this method on the requested resource ({method} {path})"
            ),
        )
    }
    /// 413 RequestEntityTooLarge.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {limit}"),
        )
    }
    /// 415 UnsupportedMediaType.
    pub fn unsupported_media_type(content_type: &str, accepted: &[&str]) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}; got {content_type:?}",
                accepted.join(", ")
            ),
        )
    }
    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }
    /// A generic error for an injected status code, with the reason kube-apiserver uses
    /// for that code.
    pub fn for_code(code: u16) -> Self {
        let reason = match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            405 => "MethodNotAllowed",
            409 => "Conflict",
            410 => "Expired",
            422 => "Invalid",
            429 => "TooManyRequests",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "InternalError",
        };
        Self::new(code, reason, format!("injected fault: {reason} ({code})"))
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            status["details"] = d.clone();
        }
        if let Some(secs) = self.retry_after {
            if status.get("details").is_none() {
                status["details"] = json!({});
            }
            status["details"]["retryAfterSeconds"] = json!(secs);
        }
        status
    }

    /// The HTTP response.
    pub fn into_response(self) -> Response<Body> {
        let mut resp = failure(self.code, self.reason, &self.message, None);
        *resp.body_mut() = full(self.to_status().to_string());
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, http::HeaderValue::from(secs));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::find;

    #[test]
    fn not_found_names_the_resource() {
        let e = ApiError::not_found(find("apps", "v1", "deployments").unwrap(), "web");
        let s = e.to_status();
        assert_eq!(s["details"]["kind"], "deployments");
        assert_eq!(s["details"]["group"], "apps");
        assert_eq!(s["message"], "deployments.apps \"web\" not found");
        assert_eq!(s["code"], 404);
    }

    #[test]
    fn invalid_aggregates_causes() {
        let pods = find("", "v1", "pods").unwrap();
        let one = ApiError::invalid(pods, "p", &[Cause::required("metadata.name", "")]);
        assert_eq!(
            one.message,
            "Pod \"p\" is invalid: metadata.name: Required value"
        );
        let two = ApiError::invalid(
            pods,
            "p",
            &[Cause::required("a", ""), Cause::required("b", "x")],
        );
        assert_eq!(
            two.message,
            "Pod \"p\" is invalid: [a: Required value, b: Required value: x]"
        );
        assert_eq!(two.to_status()["details"]["causes"][1]["field"], "b");
    }
}
