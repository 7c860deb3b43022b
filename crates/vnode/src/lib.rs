//! A virtual kubelet: one virtual Node per provider, whose pods become external instances
//! (cloud VMs, GPU boxes, local processes) through a provider seam. The Pod is the single
//! source of truth: creating it provisions an instance, deleting it terminates the instance.
//!
//! Main pieces:
//! - [`Provider`] (provision / terminate / list / status / health, and with defaults
//!   `update` for a change of a pod's mutable fields and `connect_credential` for its
//!   connect Secret) and the optional capabilities the kubelet API asks for separately:
//!   [`LogStreamer`], [`Executor`], [`Attacher`], [`PortForwarder`], [`StatsSource`].
//! - [`claim_name`]: an instance's identity derived from its pod's namespace, name and UID,
//!   so a restarted manager finds its instances again instead of leaking or doubling them,
//!   and a pod re-created under the same name is another claim.
//! - [`Handler`]: create (records the instance id before answering), delete (idempotent),
//!   get (re-adopts from the provider's list on a cold map, keeping "absent" and "could not
//!   ask" apart).
//! - [`node`]: the virtual node (labels, taint, capacity, address, Ready, node Lease).
//! - [`pods`]: the pod controller and its notify loop (metadata first, then the connect
//!   Secret, then status, each with the resourceVersion read; nothing written in steady
//!   state). It stores each pod in a slim form decoded straight from the watch (identity,
//!   this crate's annotations, the first container, the status it compares), so a tracked
//!   pod costs little memory. A change of a pod's mutable fields ([`update_request`]:
//!   labels, annotations, image, activeDeadlineSeconds, tolerations) is pushed to the
//!   provider once; the `applied-spec` annotation records its [`spec_fingerprint`], and a
//!   provider that cannot apply it gets the `SpecApplied=False` condition and a Warning
//!   Event instead of a retry loop. `activeDeadlineSeconds` is also enforced there, as
//!   the kubelet does: counted from `status.startTime` (so across manager restarts), one
//!   timer per pod; when it passes the instance is terminated and the pod written Failed
//!   with reason `DeadlineExceeded` ([`status::active_deadline`]), once, with a Normal
//!   Event and the `vnode_deadlines_exceeded` counter. The container's `restartCount` is
//!   the provider's [`Instance::restart_count`].
//! - [`placement`]: the placement gate, candidates, [`Blocklist`].
//! - [`Runner`]: one provider's node and pod controllers together.
//! - Providers: [`providers::process`] (local process groups) and [`providers::memory`]
//!   (in-memory, with fault injection, for tests and benchmarks).
//!
//! - [`manager`]: what `nebula-manager run` composes: a runner per provider and placement,
//!   each under leader election on its own Lease (the `daemon` crate), the probe listener
//!   (`health` crate) and the admin listener (`/metrics`, `/status`).
//! - [`connect_secret_name`] / [`connect_secret`]: the Secret holding a pod's connect
//!   credential ([`ConnectCredential`], what [`Provider::connect_credential`] answers),
//!   owned by the pod (controller reference, blockOwnerDeletion) so garbage collection
//!   removes it; written before the pod is first reported Running, once per pod across
//!   crashes, never logged. The in-memory provider issues a random token per instance, the
//!   process provider a per-pod token it hands to the process in `NEBULA_CONNECT_TOKEN`.
//!
//! - [`kubelet`]: the kubelet API of the virtual nodes ([`KubeletServer`]): container
//!   logs, exec, attach and port-forward over SPDY and WebSocket, stats summary and
//!   resource metrics, for every provider's pods, on one TLS listener.

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
mod blocklist;
mod claim;
mod compact;
pub mod crash;
mod election;
mod events;
mod handler;
pub mod kubelet;
pub mod manager;
mod metrics;
pub mod node;
pub mod placement;
pub mod pods;
mod provider;
mod queue;
mod runner;
mod slim;
pub mod status;

/// The providers shipped with the crate.
pub mod providers {
    mod capture;
    pub mod memory;
    pub mod process;
    pub(crate) use capture::rfc3339_nanos;
}

pub use blocklist::Blocklist;
pub use claim::{
    CLAIM_PREFIX, claim_for, claim_name, connect_secret, connect_secret_name, pod_key,
    pod_spec_fingerprint, provision_request, spec_fingerprint, update_request,
};
pub use crash::{CrashHook, CrashPoint};
pub use handler::{DeleteError, Found, Handler, LookupError, PodInstance};
pub use kubelet::KubeletServer;
pub use metrics::Metrics;
pub use provider::{
    Attacher, BlockScope, ByteSink, ByteStream, Capabilities, ConnectCredential, Duplex, ExecIo,
    ExecOutput, Executor, Instance, InstanceState, InstanceStats, LogOptions, LogStreamer,
    PortForwarder, Provider, ProviderError, ProvisionRequest, StatsSource, UpdateRequest,
};
pub use runner::Runner;

/// A fresh random token: 32 lowercase hex digits (128 bits from rand's thread RNG, which
/// is seeded from the OS).
pub(crate) fn random_token() -> String {
    use rand::RngCore as _;
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// `err` and its sources, joined with ": " (for logs).
pub(crate) fn chain(err: &dyn std::error::Error) -> String {
    common::error_chain(err)
}
