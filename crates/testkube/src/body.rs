//! The response body type every handler returns.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};

/// Errors a streamed body may end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A boxed, possibly streamed, response body.
pub type Body = BoxBody<Bytes, BoxError>;

/// A body holding `bytes` whole.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// An empty body.
pub fn empty() -> Body {
    full(Bytes::new())
}
