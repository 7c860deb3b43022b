//! The HTTP upgrade handshake of a streaming request: which transport (SPDY/3.1 or
//! WebSocket) the client asks for, which subprotocol both sides speak, and the headers of
//! the `101 Switching Protocols` answer. What it refuses comes back as a [`Rejection`]
//! carrying the status and the text a kubelet answers with.

use http::{HeaderMap, StatusCode, header};

use crate::channel::{
    PORT_FORWARD_PROTOCOL, TUNNELED_PORT_FORWARD_PROTOCOL, WS_PORT_FORWARD_PROTOCOLS, negotiate,
};

/// The transport a client upgraded to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// `Upgrade: SPDY/3.1`.
    Spdy,
    /// `Upgrade: websocket`.
    WebSocket,
}

impl Transport {
    /// `SPDY/3.1` or `websocket`.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Spdy => "SPDY/3.1",
            Transport::WebSocket => "websocket",
        }
    }
}

/// An accepted upgrade.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// The transport.
    pub transport: Transport,
    /// The negotiated subprotocol ("" for the unversioned SPDY channel protocol, or a
    /// WebSocket client that offered none).
    pub protocol: String,
    /// Headers of the `101 Switching Protocols` response.
    pub headers: Vec<(&'static str, String)>,
}

impl Accepted {
    /// The `101` response (empty body).
    pub fn response(&self) -> http::Response<()> {
        let mut resp = http::Response::new(());
        *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        // Names are this module's constants and values are computed here (an accept
        // hash, a protocol from the known list): none is invalid, and none is skipped.
        for (k, v) in &self.headers {
            if let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(k.as_bytes()),
                http::HeaderValue::from_str(v),
            ) {
                resp.headers_mut().append(name, value);
            }
        }
        resp
    }
}

/// A refused upgrade: the status and plain-text body to answer with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Rejection {
    /// HTTP status.
    pub status: StatusCode,
    /// Body text.
    pub message: String,
}

fn reject(status: StatusCode, message: impl Into<String>) -> Rejection {
    Rejection {
        status,
        message: message.into(),
    }
}

/// Comma-separated values of every instance of a header.
pub fn header_list(headers: &HeaderMap, name: impl header::AsHeaderName + Clone) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect()
}

/// The transport a request asks to upgrade to, if any.
pub fn transport(headers: &HeaderMap) -> Option<Transport> {
    let connection = header_list(headers, header::CONNECTION);
    if !connection.iter().any(|c| c.eq_ignore_ascii_case("upgrade")) {
        return None;
    }
    let up = header_list(headers, header::UPGRADE);
    if up.iter().any(|u| u.eq_ignore_ascii_case("SPDY/3.1")) {
        Some(Transport::Spdy)
    } else if up.iter().any(|u| u.eq_ignore_ascii_case("websocket")) {
        Some(Transport::WebSocket)
    } else {
        None
    }
}

fn spdy_headers(protocol: &str) -> Vec<(&'static str, String)> {
    let mut h = vec![
        ("connection", "Upgrade".to_string()),
        ("upgrade", "SPDY/3.1".to_string()),
    ];
    if !protocol.is_empty() {
        h.push(("x-stream-protocol-version", protocol.to_string()));
    }
    h
}

fn ws_headers(
    headers: &HeaderMap,
    protocol: &str,
) -> Result<Vec<(&'static str, String)>, Rejection> {
    let key = headers
        .get(header::SEC_WEBSOCKET_KEY)
        .ok_or_else(|| reject(StatusCode::BAD_REQUEST, "missing Sec-WebSocket-Key"))?;
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let mut h = vec![
        ("connection", "Upgrade".to_string()),
        ("upgrade", "websocket".to_string()),
        ("sec-websocket-accept", accept),
    ];
    if !protocol.is_empty() {
        h.push(("sec-websocket-protocol", protocol.to_string()));
    }
    Ok(h)
}

/// Accepts an exec or attach upgrade: SPDY subprotocols from `spdy_protocols`
/// (`X-Stream-Protocol-Version`; none offered means the unversioned protocol), WebSocket
/// subprotocols from `ws_protocols` (`Sec-WebSocket-Protocol`), in the client's order.
pub fn exec(
    headers: &HeaderMap,
    spdy_protocols: &[&str],
    ws_protocols: &[&str],
) -> Result<Accepted, Rejection> {
    match transport(headers) {
        None => Err(reject(StatusCode::BAD_REQUEST, "Upgrade request required")),
        Some(Transport::Spdy) => {
            let offered = header_list(headers, "x-stream-protocol-version");
            let offered: Vec<&str> = offered.iter().map(String::as_str).collect();
            let protocol = if offered.is_empty() {
                ""
            } else {
                negotiate(&offered, spdy_protocols).ok_or_else(|| {
                    reject(
                        StatusCode::FORBIDDEN,
                        format!(
                            "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server supports {spdy_protocols:?}"
                        ),
                    )
                })?
            };
            Ok(Accepted {
                transport: Transport::Spdy,
                protocol: protocol.to_string(),
                headers: spdy_headers(protocol),
            })
        }
        Some(Transport::WebSocket) => {
            let offered = header_list(headers, header::SEC_WEBSOCKET_PROTOCOL);
            let offered: Vec<&str> = offered.iter().map(String::as_str).collect();
            let protocol = if offered.is_empty() {
                ""
            } else {
                negotiate(&offered, ws_protocols).ok_or_else(|| {
                    reject(
                        StatusCode::BAD_REQUEST,
                        format!(
                            "requested protocol(s) are not supported: {offered:?}; supports {ws_protocols:?}"
                        ),
                    )
                })?
            };
            Ok(Accepted {
                transport: Transport::WebSocket,
                protocol: protocol.to_string(),
                headers: ws_headers(headers, protocol)?,
            })
        }
    }
}

/// Accepts a port-forward upgrade. `has_ports`: whether the query names a port, which
/// the WebSocket channel protocol needs (the tunnelled SPDY one names ports per stream).
pub fn port_forward(headers: &HeaderMap, has_ports: bool) -> Result<Accepted, Rejection> {
    match transport(headers) {
        None => Err(reject(StatusCode::BAD_REQUEST, "Upgrade request required")),
        Some(Transport::Spdy) => {
            let offered = header_list(headers, "x-stream-protocol-version");
            if !offered.iter().any(|p| p == PORT_FORWARD_PROTOCOL) {
                return Err(reject(
                    StatusCode::FORBIDDEN,
                    format!(
                        "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server supports [\"{PORT_FORWARD_PROTOCOL}\"]"
                    ),
                ));
            }
            Ok(Accepted {
                transport: Transport::Spdy,
                protocol: PORT_FORWARD_PROTOCOL.to_string(),
                headers: spdy_headers(PORT_FORWARD_PROTOCOL),
            })
        }
        Some(Transport::WebSocket) => {
            let offered = header_list(headers, header::SEC_WEBSOCKET_PROTOCOL);
            let offered: Vec<&str> = offered.iter().map(String::as_str).collect();
            let protocol = negotiate(&offered, WS_PORT_FORWARD_PROTOCOLS).ok_or_else(|| {
                reject(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "requested protocol(s) are not supported: {offered:?}; supports {WS_PORT_FORWARD_PROTOCOLS:?}"
                    ),
                )
            })?;
            if !has_ports && protocol != TUNNELED_PORT_FORWARD_PROTOCOL {
                return Err(reject(
                    StatusCode::BAD_REQUEST,
                    "query parameter \"port\" is required",
                ));
            }
            Ok(Accepted {
                transport: Transport::WebSocket,
                protocol: protocol.to_string(),
                headers: ws_headers(headers, protocol)?,
            })
        }
    }
}
