//! The worker agent, as a library: `outpost-agent` only parses flags, calls into this
//! crate and prints.
//!
//! - [`config`]: the one `agent.yaml` every command reads ([`AgentConfig`]), embedding the
//!   `health` crate's block and `hostnode`'s node-stack keys; [`load_node_stack`] is what
//!   the `node` commands call.
//! - [`run`]: the `run` daemon. The probe listener's readiness follows real signals (this
//!   node's Node exists and is Ready, the configured data-plane check passes), the
//!   [`tunnel`] supervisor keeps the `ssh -R` that publishes the kubelet running, and an
//!   admin listener serves `/metrics` and `/status`.
//! - [`dataplane`]: the data-plane checks (`none`, `wireguard`, `tunnel`).
//! - [`join`]: a worker join by token discovery (pinned CA), writing the bootstrap
//!   kubeconfig and the agent configuration below a host root.
//!
//! Operations: `docs/outpost-agent.md`.

// Library code reports failures as values; tests may unwrap.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod config;

pub use config::{AgentConfig, ConfigError, load_node_stack};
pub mod dataplane;
pub mod join;
pub mod run;
pub mod tunnel;
