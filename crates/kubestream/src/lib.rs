//! The server side of the kubelet's streaming protocols, what `kubectl exec`, `attach` and
//! `port-forward` speak once the API server has passed the connection through:
//!
//! - SPDY/3.1 ([`spdy`]: the frame codec with its zlib header contexts) carrying the
//!   remotecommand subprotocols `channel.k8s.io` to `v5.channel.k8s.io` (one SPDY stream
//!   per standard stream, plus `error` and `resize`) and `portforward.k8s.io`;
//! - WebSocket carrying `v4.channel.k8s.io` / `v5.channel.k8s.io` (binary messages whose
//!   first byte is the channel) and their `base64.` text variants, and WebSocket
//!   port-forward: SPDY tunnelled in WebSocket (what kubectl 1.31+ tries first) and the
//!   channel form (`v4.channel.k8s.io`, the Python client's);
//! - [`upgrade`]: the HTTP upgrade handshake (transport, subprotocol negotiation, the
//!   `101` headers, and the kubelet's refusals);
//! - [`channel`]: protocol names, channel numbers, the request shape and the final
//!   status payload that carries the exit code (v4+);
//! - [`exec`]: exec and attach sessions with a real process behind them: pipes for the
//!   standard streams, resize events, the exit code reported back;
//! - [`portforward`]: port-forward sessions dialing real ports (SPDY, SPDY tunnelled in
//!   WebSocket, WebSocket channels);
//! - [`echo`]: sessions whose "process" is an echo, which the API double's stub kubelet
//!   serves and the fuzz targets drive.
//!
//! Not built: the stub kubelet of the API double still serves its own echo sessions
//! rather than [`exec`] with an echo process; flow control windows are not enforced (nor
//! are they by the Go client).
//!
//! WebSocket framing is `tokio-tungstenite`'s and zlib is `flate2`'s; everything that
//! reads client bytes returns errors instead of panicking (fuzzed: `fuzz/`).

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
pub mod channel;
pub mod echo;
pub mod exec;
pub mod portforward;
pub mod spdy;
pub mod upgrade;
