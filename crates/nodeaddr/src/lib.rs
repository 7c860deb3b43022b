//! Derived kubelet tunnel routes and the Node address reconciler.
//!
//! A control plane on a user's own machine reaches each worker's kubelet only through a
//! tunnel. The API server dials a kubelet at the node's preferred address and
//! `status.daemonEndpoints.kubeletEndpoint.Port`; left alone, those are the worker's own
//! LAN address and 10250, which mean nothing on the control-plane host. Nodes then look
//! healthy while `kubectl logs`, `exec`, `port-forward` and metrics scrapes all fail.
//!
//! This crate holds both halves of the fix:
//!
//! - **The worker half** ([`kubelet_port_for_node`], [`PortRange`]): a port derived from
//!   the node name, on which the worker's tunnel publishes its kubelet on the control-plane
//!   host. Both ends compute it, so nothing has to distribute it. The derivation is a
//!   specification, not an implementation detail:
//!
//!   ```text
//!   h    = FNV-1a-32(UTF-8 bytes of the routing name)
//!          (h = 2166136261; for each byte b: h = ((h XOR b) * 16777619) mod 2^32)
//!   port = base + (h mod slots)            default base 20000, slots 10000
//!   ```
//!
//!   e.g. `"worker-1"` → 21149, `"a"` → 22220 (pinned by unit tests).
//!
//! - **The control-plane half** ([`Reconciler`]): for every Node that is not virtual
//!   ([`is_virtual_node`]) and whose port is known ([`KubeletPortFunc`]), it makes the
//!   first `ExternalIP` a node-unique loopback address ([`loopback_for_node`]:
//!   `127.0.0.2 + (h mod 16777213)`, linear probe on collision, probing in sorted
//!   routing-name order) and the kubelet port the derived port. With the API server
//!   preferring `ExternalIP`, each kubelet dial lands on `127.a.b.c:port`, where that
//!   node's tunnel listens. The pure part ([`plan()`], [`wanted_status`]) decides; the
//!   reconciler only writes what differs, with the resourceVersion it read, so a pass over
//!   unchanged Nodes writes nothing.
//!
//! A worker behind `ssh -R` binds its node's loopback address on the control-plane host;
//! [`bind_address`] finds the one the reconciler assigns (the ExternalIP published on the
//! worker's own Node, or the reconciler's plan before it is published), so no two nodes
//! can share an (address, port) pair. [`Tunnel`] says which collisions break a node.
//!
//! Under k3s `--with-node-id` the registered name carries a random suffix the worker does
//! not know; [`routing_name`] recovers the configured name from the `k3s.io/node-args`
//! (`--node-name`) or `k3s.io/node-env` (`K3S_NODE_NAME`) annotation when it is
//! structurally consistent with the registered name.
//!
//! [`Reconciler::diagnostics`] reports per node what is expected and observed, and flags
//! port collisions: with 10,000 slots two of n names share a port with probability
//! `1 - prod(1 - i/10000, i < n)`, about 10% at 47 nodes and 50% at 118.
//! [`Reconciler::run`] watches Nodes into a reflector store and plans from it: after
//! start it lists nothing (the watcher re-lists only after a watch failure), and it writes
//! one status per node that differs, only while it holds the Lease
//! `kube-system/nodeaddr-reconciler` ([`Leadership`], the `daemon` crate's election). Its
//! liveness and counters live in its [`Monitor`]; [`serve`] runs the whole daemon (the
//! election, the admin listener mirroring the monitor on `/status` and `/metrics`, and
//! [`Reconciler::run`]) until cancelled.
//!
//! Features: `client` (default) builds the reconciler, [`serve`], the monitor and
//! [`bind_address`]: everything that talks to the API server. Without it the crate is its
//! pure core (the derivations, routing names and [`plan()`]), with no kube client or tokio
//! in its tree; `hostnode` and the fuzz targets use it so (`docs/architecture.md`).
//!
//! Operations: `docs/nodeaddr.md`.

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
// The pure core (always built): derivations, routing names, the address plan.
mod derive;
mod plan;
mod routing;
// The I/O modules, behind the default `client` feature.
#[cfg(feature = "client")]
mod reconciler;
#[cfg(feature = "client")]
mod serve;
#[cfg(feature = "client")]
mod status;
#[cfg(feature = "client")]
mod worker;
// Tunnel client configurations: pure rendering.
pub mod tunnel;

pub use derive::{
    KubeletPortFunc, PortRange, PortRangeError, derived_kubelet_port, fnv1a32,
    kubelet_port_for_node, loopback_candidate, loopback_for_node, port_func,
};
pub use plan::{
    EXTERNAL_IP, PlannedNode, SkipReason, StatusChange, Tunnel, apply_change, first_external_ip,
    observed_kubelet_port, plan, unroute_status, wanted_status,
};
#[cfg(feature = "client")]
pub use reconciler::{
    DEBOUNCE, DEFAULT_INTERVAL, EVENT_CONTROLLER, Error, LEASE_NAME, LEASE_NAMESPACE, Leadership,
    NodeAddressDiagnostic, PassReport, Reconciler, TUNNEL_PROBE_TIMEOUT, always_leader,
    error_chain, tunnel_answers,
};
pub use routing::{
    NODE_ARGS_ANNOTATION, NODE_ENV_ANNOTATION, NODE_NAME_ENV, RUNTIME_LABEL, RUNTIME_VIRTUAL,
    configured_node_name, configured_node_name_env, is_virtual_node, routing_name,
    routing_name_from,
};
#[cfg(feature = "client")]
pub use serve::{ServeError, ServeOptions, serve, serve_on};
#[cfg(feature = "client")]
pub use status::{ErrorKind, Monitor, NodeState, Status};
#[cfg(feature = "client")]
pub use worker::{BindAddress, BindError, BindSource, bind_address, bind_address_from};
