//! The node agent's Kubernetes probe listener: `/healthz` and `/readyz` over plain HTTP/1.1.
//!
//! The endpoints are unauthenticated, so they are built to tell the kubelet the truth while
//! telling everyone else nothing:
//!
//! - **Liveness** (`/healthz`) is a constant `200 ok`. Restarting the agent runs its drain
//!   path, so the kubelet must never restart it for anything a restart would not fix.
//! - **Readiness** (`/readyz`) is `200 ok` only when the node is registered, its mesh data
//!   plane is established (and, when a check is installed, still passes a periodic
//!   background check), control-plane event delivery is alive in a known mode, and no
//!   long-running subsystem has stopped. Otherwise it is `503 not ready`. The agent starts
//!   not ready.
//! - Every body is a fixed constant. Why a node is not ready goes to the log (`tracing`),
//!   never to the response.
//! - Slow, huge or numerous requests cannot pin the agent: a header-read timeout, a cap on
//!   header size, no request bodies, a bound on concurrent connections and on how long any
//!   connection lives.
//!
//! Main types: [`Config`] (the `health:` block of the agent's configuration), [`Server`]
//! (cheap to clone; the agent's subsystems report into it), [`DeliveryMode`], [`NotReady`]
//! (the reasons readiness is withheld, for logs and tests) and [`Error`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), health::Error> {
//! use tokio_util::sync::CancellationToken;
//!
//! let server = health::Server::new(health::Config::default());
//! let listener = server.listen().await?; // fails fast when the address is taken
//! let cancel = CancellationToken::new();
//! let serving = tokio::spawn({
//!     let server = server.clone();
//!     let cancel = cancel.clone();
//!     async move { server.serve(cancel, listener).await }
//! });
//! server.set_registered();
//! server.set_data_plane_ready();
//! // ... later, on shutdown:
//! cancel.cancel();
//! # let _ = serving.await;
//! # Ok(())
//! # }
//! ```

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
mod config;
mod error;
mod http;
mod readiness;
mod server;

pub use config::{Config, DEFAULT_LISTEN};
pub use error::Error;
pub use readiness::{DeliveryMode, NotReady};
pub use server::{DATA_PLANE_CHECK_PERIOD, Server, Tuning};
