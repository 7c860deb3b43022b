//! Start, upgrade, roll back and reset a node stack (kubelet + containerd) that runs
//! straight on a host rather than inside a machine of its own.
//!
//! Whatever isolation mode runs the stack, the same steps are needed, and they live here:
//!
//! - [`HostRoot`] and the host path constants ([`KUBELET_DIR`], [`KUBELET_CLIENT_PKI_DIR`],
//!   [`CNI_STATE_DIR`], [`CNI_CONFIG_DIR`]): every host location is resolved below a prefix,
//!   so tests run against a temporary tree. The empty prefix is the real host.
//! - [`phases`]: a node is started, stopped or upgraded as a list of named [`phases::Task`]s
//!   run in order; a failure carries the name of the task that failed.
//! - [`goalstate`]: the [`goalstate::MachineGoalState`] / [`goalstate::NodeStart`] model
//!   resolved from the agent's YAML configuration, and [`goalstate::GoalStateSource`].
//! - [`configure`]: renders the kubelet and containerd configuration a goal state asks for
//!   and writes only what differs.
//! - [`restart_changed`], [`reset_kubelet_identity`], [`reset_cni_state`].
//! - [`snapshot`]: the saved copy of the shared configuration an upgrade rolls back to.
//! - [`mountinfo`] and [`unmount`]: reading the mount table and lazily unmounting pod
//!   volumes deepest first; [`remove`]: deleting what is no longer mounted, never through a
//!   mount.
//! - [`localdns`]: the LocalDNS interface and the readiness wait that sends real queries.
//! - [`backend`]: whether a slot's stack is running, behind an isolation backend trait;
//!   [`backend::HostBackend`] is the host (`none`) mode over systemd units.
//! - [`runner`]: every host command goes through the [`runner::Runner`] trait, with a
//!   recording double for unit tests.
//! - [`settle`]: after an upgrade's restart, the kubelet must stay active and answer its
//!   healthz, else the upgrade rolls back.
//! - [`lock`]: one `node` command at a time, the holder named.
//! - [`Hooks`]: the seams a node exposes to tests; the zero value is the real host.
//! - [`lifecycle`]: `up`, `down`, `reset`, `upgrade` and `status` of a node stack
//!   ([`lifecycle::Node`]), composed from the steps above, with typed phase results and
//!   progress reported to a [`lifecycle::Report`]. `outpost-agent node` only prints it.
//!
//! Features: `host` (default) builds everything that runs commands or touches the host
//! (`backend`, `lifecycle`, `phases`, `runner`, `settle`, `snapshot`, `unmount`, `remove`,
//! the resets, `localdns`, `lock`, `Hooks`). Without it the crate is its pure core
//! ([`HostRoot`], [`goalstate`], [`configure`], [`restart_changed`], [`mountinfo`]) with
//! no tokio, nix or kube in its tree, and `nodeaddr` comes without its client
//! (`docs/architecture.md`).

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
use std::path::{Path, PathBuf};

// The pure core (always built).
pub mod configure;
pub mod fsutil;
pub mod goalstate;
pub mod mountinfo;
mod restart;
// Host I/O, behind the default `host` feature.
#[cfg(feature = "host")]
pub mod backend;
#[cfg(feature = "host")]
mod hooks;
#[cfg(feature = "host")]
pub mod lifecycle;
#[cfg(feature = "host")]
pub mod localdns;
#[cfg(feature = "host")]
pub mod lock;
#[cfg(feature = "host")]
pub mod phases;
#[cfg(feature = "host")]
pub mod remove;
#[cfg(feature = "host")]
mod reset;
#[cfg(feature = "host")]
pub mod runner;
#[cfg(feature = "host")]
pub mod settle;
#[cfg(feature = "host")]
pub mod snapshot;
#[cfg(feature = "host")]
pub mod unmount;

#[cfg(feature = "host")]
pub use hooks::{HookError, Hooks, NetworkHook, SNAPSHOT_NAME, WaitHook};
#[cfg(feature = "host")]
pub use reset::{
    ClearReport, ResetError, clear_kubelet_dir, remove_kubelet_state, reset_cni_state,
    reset_kubelet_identity, resolve_kubelet_dir, unmount_kubelet_dir,
};
pub use restart::{ChangedUnit, RestartError, restart_changed};

/// The kubelet state directory. Pod volume mounts (secrets, projected volumes, CSI) are
/// made below it and propagate to it, which is why a reset unmounts before it removes.
pub const KUBELET_DIR: &str = "/var/lib/kubelet";

/// Where the kubelet keeps the client certificates it rotates (`kubelet-client-*.pem`).
/// This is not the cluster CA directory: resetting it only forces a new TLS bootstrap.
pub const KUBELET_CLIENT_PKI_DIR: &str = "/var/lib/kubelet/pki";

/// Where CNI plugins keep per-node state, host-local IPAM's address reservations among it.
pub const CNI_STATE_DIR: &str = "/var/lib/cni";

/// The CNI network configuration directory containerd reads.
pub const CNI_CONFIG_DIR: &str = "/etc/cni/net.d";

/// The agent's own configuration directory (the default home of the upgrade snapshot).
pub const AGENT_CONFIG_DIR: &str = "/etc/outpost-agent";

/// The default mount table.
pub const PROC_MOUNTINFO: &str = "/proc/self/mountinfo";

/// A prefix below which every host path is resolved. The empty prefix (the
/// [`Default`]) is the real host; tests use a temporary directory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct HostRoot(PathBuf);

impl HostRoot {
    /// The real host: paths resolve to themselves.
    pub fn real() -> Self {
        Self::default()
    }

    /// A prefix directory. An empty path is the real host.
    pub fn new(prefix: impl Into<PathBuf>) -> Self {
        Self(prefix.into())
    }

    /// Whether this is the real host (the empty prefix or `/`).
    pub fn is_real(&self) -> bool {
        self.0.as_os_str().is_empty() || self.0 == Path::new("/")
    }

    /// The prefix itself (empty for the real host).
    pub fn prefix(&self) -> &Path {
        &self.0
    }

    /// Resolves an absolute host path below the prefix:
    /// `/var/lib/kubelet` becomes `<prefix>/var/lib/kubelet`.
    pub fn resolve(&self, host_path: impl AsRef<Path>) -> PathBuf {
        let host_path = host_path.as_ref();
        if self.is_real() {
            return host_path.to_path_buf();
        }
        let relative = host_path.strip_prefix("/").unwrap_or(host_path);
        self.0.join(relative)
    }

    /// [`KUBELET_DIR`] below the prefix.
    pub fn kubelet_dir(&self) -> PathBuf {
        self.resolve(KUBELET_DIR)
    }

    /// [`KUBELET_CLIENT_PKI_DIR`] below the prefix.
    pub fn kubelet_client_pki_dir(&self) -> PathBuf {
        self.resolve(KUBELET_CLIENT_PKI_DIR)
    }

    /// [`CNI_STATE_DIR`] below the prefix.
    pub fn cni_state_dir(&self) -> PathBuf {
        self.resolve(CNI_STATE_DIR)
    }

    /// [`CNI_CONFIG_DIR`] below the prefix.
    pub fn cni_config_dir(&self) -> PathBuf {
        self.resolve(CNI_CONFIG_DIR)
    }
}

/// Returns `value`, or `default` when `value` is empty. Teardowns use it for the
/// directories whose zero value means the real host.
pub fn or_default<'a>(value: &'a str, default: &'a str) -> &'a str {
    if value.is_empty() { default } else { value }
}

/// Renders an error with its chain of sources, `: `-separated (errors in this crate
/// keep their cause out of their own message, as `anyhow`'s `{:#}` expects).
pub use common::error_chain;

/// A boxed, sendable future: the return type of the async trait methods in this crate.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_root_resolves_paths_to_themselves() {
        assert_eq!(
            HostRoot::real().kubelet_dir(),
            Path::new("/var/lib/kubelet")
        );
        assert_eq!(
            HostRoot::new("/").cni_state_dir(),
            Path::new("/var/lib/cni")
        );
    }

    #[test]
    fn prefix_is_prepended() {
        let root = HostRoot::new("/tmp/x");
        assert_eq!(
            root.kubelet_client_pki_dir(),
            Path::new("/tmp/x/var/lib/kubelet/pki")
        );
        assert_eq!(root.cni_config_dir(), Path::new("/tmp/x/etc/cni/net.d"));
        assert!(!root.is_real());
    }

    #[test]
    fn or_default_prefers_the_value() {
        assert_eq!(or_default("", "/var/lib/kubelet"), "/var/lib/kubelet");
        assert_eq!(or_default("/x", "/var/lib/kubelet"), "/x");
    }
}
