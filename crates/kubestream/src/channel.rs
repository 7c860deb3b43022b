//! The remotecommand ("channel") protocol shared by both transports: subprotocol names,
//! negotiation, channel numbers, the request shape, and the final status payload.

use serde_json::json;

/// The remotecommand subprotocols spoken over SPDY, newest first (what a kubelet answers).
pub const EXEC_PROTOCOLS: &[&str] = &[
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];
/// The SPDY port-forward subprotocol.
pub const PORT_FORWARD_PROTOCOL: &str = "portforward.k8s.io";

/// WebSocket channel numbers of the remotecommand protocol: standard input.
pub const CH_STDIN: u8 = 0;
/// Standard output.
pub const CH_STDOUT: u8 = 1;
/// Standard error.
pub const CH_STDERR: u8 = 2;
/// The error channel: the final `Status` (v4+) or an error text.
pub const CH_ERROR: u8 = 3;
/// Terminal resize events (`{"Width":..,"Height":..}`).
pub const CH_RESIZE: u8 = 4;
/// v5: `[255, channel]` says the client closed that channel.
pub const CH_CLOSE: u8 = 255;

/// An exec or attach request as the kubelet receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    /// `exec` or `attach`.
    pub kind: String,
    /// Namespace, pod, container from the path.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// `command` query values (empty for attach).
    pub command: Vec<String>,
    /// `input=1`.
    pub stdin: bool,
    /// `output=1`.
    pub stdout: bool,
    /// `error=1`.
    pub stderr: bool,
    /// `tty=1`.
    pub tty: bool,
}

/// The first protocol in the client's order that the server also speaks (how
/// `httpstream.Handshake` and `wsstream` choose).
pub fn negotiate<'a>(client: &[&'a str], server: &[&str]) -> Option<&'a str> {
    client.iter().find(|c| server.contains(c)).copied()
}

/// The error-stream payload for a v4/v5 client: a `Status` object.
pub fn v4_status(command: &[String], exit: i32) -> String {
    if exit == 0 {
        return json!({"metadata": {}, "status": "Success"}).to_string();
    }
    json!({
        "metadata": {},
        "status": "Failure",
        "message": failure_message(command, exit),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": exit.to_string()}]},
    })
    .to_string()
}

/// The message of a non-zero exit, as the kubelet words it.
pub fn failure_message(command: &[String], exit: i32) -> String {
    format!(
        "command terminated with non-zero exit code: error executing command [{}], exit code {exit}",
        command.join(" ")
    )
}

/// The error-stream payload for pre-v4 clients: plain text, nothing on success.
pub fn v1_status(command: &[String], exit: i32) -> String {
    if exit == 0 {
        String::new()
    } else {
        failure_message(command, exit)
    }
}

/// Whether `protocol` reports the exit code as a v4 `Status`.
pub fn is_v4_or_later(protocol: &str) -> bool {
    protocol.starts_with("v4.") || protocol.starts_with("v5.")
}

/// SPDY port-forward tunnelled in WebSocket, as kubectl 1.31+ offers first.
pub const TUNNELED_PORT_FORWARD_PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";

/// WebSocket subprotocols answered for port-forward, in preference order.
pub const WS_PORT_FORWARD_PROTOCOLS: &[&str] = &[
    TUNNELED_PORT_FORWARD_PROTOCOL,
    "v4.channel.k8s.io",
    PORT_FORWARD_PROTOCOL,
];
