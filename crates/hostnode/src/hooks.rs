//! The seams a node exposes so tests can run it against a temporary tree and a fake host.
//! The zero value ([`Hooks::default`]) is the real host and the real phases.

use std::path::PathBuf;
use std::sync::Arc;

use crate::goalstate::{AgentConfig, GoalStateSource, NodeStart, ResolveFn};
use crate::localdns::{self, LocalDnsError};
use crate::phases::BoxError;
use crate::runner::{HostRunner, Runner};
use crate::unmount::{Mounter, SyscallMounter};
use crate::{AGENT_CONFIG_DIR, BoxFuture, HostRoot};

/// The directory name [`Hooks::snapshot_dir`] gives an upgrade's snapshot.
pub const SNAPSHOT_NAME: &str = "upgrade-snapshot";

/// Replaces a network phase.
pub type NetworkHook = Arc<dyn Fn() -> BoxFuture<'static, Result<(), BoxError>> + Send + Sync>;
/// Replaces the LocalDNS readiness wait; given the node start whose listeners to wait on.
pub type WaitHook =
    Arc<dyn Fn(NodeStart) -> BoxFuture<'static, Result<(), BoxError>> + Send + Sync>;

/// A hooked step failed.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// The real LocalDNS step failed.
    #[error(transparent)]
    LocalDns(#[from] LocalDnsError),
    /// A replacement hook failed.
    #[error("{0}")]
    Hook(BoxError),
}

/// Seams of a node. Every `None` is the real host.
#[derive(Clone, Default)]
pub struct Hooks {
    /// Overrides goal state resolution (the default is
    /// [`crate::goalstate::resolve_machine`]).
    pub resolve: Option<ResolveFn>,
    /// Prefix of every host path the node writes; empty is the real host.
    pub host_root: HostRoot,
    /// Where an upgrade saves the shared configuration; `None` is
    /// `<host root>/etc/outpost-agent/<name>`.
    pub config_snapshot_dir: Option<PathBuf>,
    /// Replaces the LocalDNS network setup.
    pub setup_network: Option<NetworkHook>,
    /// Replaces the LocalDNS network cleanup.
    pub cleanup_network: Option<NetworkHook>,
    /// Replaces the LocalDNS readiness wait.
    pub wait_local_dns: Option<WaitHook>,
    /// Runs host commands; `None` is [`HostRunner`].
    pub runner: Option<Arc<dyn Runner>>,
    /// The mount table file; `None` is `/proc/self/mountinfo`.
    pub mount_info: Option<PathBuf>,
    /// Detaches mounts; `None` is [`SyscallMounter`].
    pub mounter: Option<Arc<dyn Mounter>>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |b: bool| if b { "custom" } else { "default" };
        f.debug_struct("Hooks")
            .field("resolve", &set(self.resolve.is_some()))
            .field("host_root", &self.host_root)
            .field("config_snapshot_dir", &self.config_snapshot_dir)
            .field("setup_network", &set(self.setup_network.is_some()))
            .field("cleanup_network", &set(self.cleanup_network.is_some()))
            .field("wait_local_dns", &set(self.wait_local_dns.is_some()))
            .field("runner", &set(self.runner.is_some()))
            .field("mount_info", &self.mount_info)
            .field("mounter", &set(self.mounter.is_some()))
            .finish()
    }
}

impl Hooks {
    /// The command runner.
    pub fn runner(&self) -> Arc<dyn Runner> {
        self.runner
            .clone()
            .unwrap_or_else(|| Arc::new(HostRunner::new()))
    }

    /// The mounter.
    pub fn mounter(&self) -> Arc<dyn Mounter> {
        self.mounter
            .clone()
            .unwrap_or_else(|| Arc::new(SyscallMounter))
    }

    /// A goal state source over `config` with this resolve override.
    pub fn goal_state_source(&self, config: AgentConfig) -> GoalStateSource {
        GoalStateSource {
            config,
            goal_state: None,
            resolve: self.resolve.clone(),
        }
    }

    /// Where an upgrade saves the shared configuration: the override when set, otherwise
    /// `name` in the agent configuration directory below the host root.
    pub fn snapshot_dir(&self, name: &str) -> PathBuf {
        match &self.config_snapshot_dir {
            Some(dir) => dir.clone(),
            None => self.host_root.resolve(AGENT_CONFIG_DIR).join(name),
        }
    }

    /// Prepares the LocalDNS network (nothing when the node has no LocalDNS).
    pub async fn setup_local_dns_network(&self, ns: &NodeStart) -> Result<(), HookError> {
        if let Some(hook) = &self.setup_network {
            return hook().await.map_err(HookError::Hook);
        }
        match &ns.local_dns {
            Some(dns) => Ok(localdns::setup_network(&*self.runner(), dns).await?),
            None => Ok(()),
        }
    }

    /// Removes the host networking a stopped node left behind, as a repave does.
    pub async fn cleanup_host_network(&self, ns: &NodeStart) -> Result<(), HookError> {
        if let Some(hook) = &self.cleanup_network {
            return hook().await.map_err(HookError::Hook);
        }
        let ifname = ns
            .local_dns
            .as_ref()
            .map(|d| d.interface.as_str())
            .unwrap_or_default();
        let ifname = crate::or_default(ifname, "outpost-dns");
        Ok(localdns::cleanup_network(&*self.runner(), ifname).await?)
    }

    /// Waits for LocalDNS to answer on every listener (nothing when the node has none).
    pub async fn await_local_dns(&self, ns: &NodeStart) -> Result<(), HookError> {
        if let Some(hook) = &self.wait_local_dns {
            return hook(ns.clone()).await.map_err(HookError::Hook);
        }
        if let Some(dns) = &ns.local_dns {
            localdns::await_local_dns(&dns.listener_addrs(), &dns.probe_name, dns.ready_timeout())
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::goalstate::{resolve_machine, tests::config};
    use crate::runner::RecordingRunner;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn snapshot_dir_defaults_below_the_host_root() {
        let hooks = Hooks {
            host_root: HostRoot::new("/tmp/r"),
            ..Hooks::default()
        };
        assert_eq!(
            hooks.snapshot_dir(SNAPSHOT_NAME),
            PathBuf::from("/tmp/r/etc/outpost-agent/upgrade-snapshot")
        );
        let hooks = Hooks {
            config_snapshot_dir: Some("/x".into()),
            ..hooks
        };
        assert_eq!(hooks.snapshot_dir(SNAPSHOT_NAME), PathBuf::from("/x"));
    }

    #[tokio::test]
    async fn hooks_replace_the_real_steps() {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let runner = RecordingRunner::new();
        let hooks = Hooks {
            setup_network: Some(Arc::new(move || {
                c.fetch_add(1, Ordering::SeqCst);
                Box::pin(async { Ok(()) })
            })),
            wait_local_dns: Some(Arc::new(|ns| {
                Box::pin(async move { Err(format!("{} not ready", ns.node_name).into()) })
            })),
            runner: Some(Arc::new(runner.clone())),
            ..Hooks::default()
        };
        let ns = resolve_machine(&config(), "").unwrap().node_start;
        hooks.setup_local_dns_network(&ns).await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let err = hooks.await_local_dns(&ns).await.unwrap_err();
        assert_eq!(err.to_string(), "worker-1 not ready");
        // The cleanup is not hooked here, so it goes through the runner.
        hooks.cleanup_host_network(&ns).await.unwrap();
        assert_eq!(runner.commands()[0], "ip -d -o link show dev outpost-dns");
    }
}
