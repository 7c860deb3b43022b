//! The node-stack lifecycle on a host: `up`, `down`, `reset`, `upgrade` and `status` of
//! the stack a configuration describes, composed from the steps of this crate.
//!
//! Each command takes the node lock (`status` only reads and takes none), then runs named
//! phases in order. A phase's result is a typed value handed to the phases after it (the
//! goal state, whether the stack was running, what the configuration step changed, the
//! resolved kubelet directory), so no phase can run without what it needs. Progress (a
//! phase starts, ends or fails) and what a phase found or did ([`Event`]) go to a
//! [`Report`] the caller supplies; `outpost-agent node` prints them.
//!
//! The rules the order encodes:
//!
//! - the kubelet stops before containerd, so it never sees its runtime vanish and starts
//!   evicting;
//! - an `up` of a stack that is not running first unmounts what a previous stack left
//!   below the kubelet directory; one that is running restarts only what changed (a
//!   `start` would not reread the configuration);
//! - an `upgrade` first restores the snapshot an interrupted upgrade left, saves the
//!   configuration it is about to change, and puts it back on any failure after that,
//!   restarting onto it what it had restarted;
//! - a `reset` keeps going when mounts stay (what did unmount is still removed) and fails
//!   at its last phase, naming them.
//!
//! ```no_run
//! # async fn f() -> Result<(), hostnode::lifecycle::LifecycleError> {
//! use hostnode::lifecycle::{Node, Silent};
//! let node = Node::from_file("/etc/outpost-agent/node.yaml", "", hostnode::Hooks::default());
//! let up = node.up(&Silent).await?;
//! println!("{} was running: {}", up.goal.node_start.node_name, up.was_running);
//! # Ok(()) }
//! ```

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::backend::{HostBackend, IsolationBackend, SlotRef, stack_running};
use crate::configure::{self, Applied};
use crate::goalstate::{AgentConfig, MachineGoalState};
use crate::lock::{LockError, NodeLock};
use crate::phases::{BoxError, PhaseError, Progress};
use crate::runner::{Cmd, RunError, Runner};
use crate::snapshot::{self, Snapshot, SnapshotError};
use crate::unmount::PrefixError;
use crate::{Hooks, SNAPSHOT_NAME};

/// A lifecycle command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    /// Configure and start the stack.
    Up,
    /// Stop the stack.
    Down,
    /// Stop the stack and forget what it left.
    Reset,
    /// Change the configuration of a stack, rolling back on failure.
    Upgrade,
    /// Report the goal state and the units' states.
    Status,
}

impl Command {
    /// `up`, `down`, `reset`, `upgrade` or `status`.
    pub fn name(self) -> &'static str {
        match self {
            Command::Up => "up",
            Command::Down => "down",
            Command::Reset => "reset",
            Command::Upgrade => "upgrade",
            Command::Status => "status",
        }
    }

    /// The phases the command runs, in order (`status` runs its two without reporting
    /// progress).
    pub fn phases(self) -> &'static [&'static str] {
        match self {
            Command::Up => UP_PHASES,
            Command::Down => DOWN_PHASES,
            Command::Reset => RESET_PHASES,
            Command::Upgrade => UPGRADE_PHASES,
            Command::Status => STATUS_PHASES,
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The phases of [`Node::up`].
pub const UP_PHASES: &[&str] = &[
    "resolve-goal-state",
    "check-running",
    "configure",
    "daemon-reload",
    "unmount-stale-pod-volumes",
    "local-dns-network",
    "start",
    "await-local-dns",
];

/// The phases of [`Node::down`].
pub const DOWN_PHASES: &[&str] = &["resolve-goal-state", "stop", "cleanup-network"];

/// The phases of [`Node::reset`].
pub const RESET_PHASES: &[&str] = &[
    "resolve-goal-state",
    "stop",
    "unmount-kubelet-dir",
    "remove-kubelet-state",
    "reset-cni-state",
    "reset-kubelet-identity",
    "cleanup-network",
    "verify-unmounted",
];

/// The phases of [`Node::upgrade`].
pub const UPGRADE_PHASES: &[&str] = &[
    "recover",
    "resolve-goal-state",
    "check-running",
    "snapshot",
    "configure",
    "daemon-reload",
    "restart",
    "await-local-dns",
    "settle",
];

/// The phases of [`Node::status`].
pub const STATUS_PHASES: &[&str] = &["resolve-goal-state", "unit-states"];

/// What a phase found or did, for the caller to show.
#[derive(Debug)]
#[non_exhaustive]
pub enum Event<'a> {
    /// The goal state was resolved.
    Resolved(&'a MachineGoalState),
    /// Whether the stack was running before the command changed anything.
    StackRunning(bool),
    /// A configuration file was written or removed.
    Wrote(&'a Path),
    /// The snapshot an interrupted upgrade left in this directory was restored.
    RecoveredInterrupted(&'a Path),
    /// There is no kubelet directory to clear.
    NoKubeletDir,
    /// Mounts below the kubelet directory stayed; they and their contents are kept, and
    /// the reset fails at its last phase.
    MountsKept(&'a PrefixError),
    /// What the reset removed below the kubelet directory.
    KubeletStateRemoved {
        /// The resolved kubelet directory.
        dir: &'a Path,
        /// Entries removed.
        removed: usize,
        /// Mount points kept.
        kept: usize,
    },
    /// A kubelet client credential was removed.
    IdentityRemoved(&'a Path),
    /// These units were restarted onto the new configuration.
    Restarted(&'a [String]),
    /// The kubelet came up and stayed up after the restart.
    Settled {
        /// The kubelet unit.
        unit: &'a str,
        /// The healthz endpoint checked, if any.
        healthz: Option<SocketAddr>,
    },
    /// A failed upgrade is being rolled back from this snapshot.
    RollingBack(&'a Path),
    /// The rollback could not restore the configuration.
    RollbackFailed(&'a SnapshotError),
    /// The previous configuration is restored and runs.
    RolledBack,
    /// The previous configuration is restored, but reloading or restarting onto it failed.
    RolledBackRestartFailed(&'a [BoxError]),
}

/// Receives progress and events as a command runs. Both default to doing nothing.
pub trait Report: Send + Sync {
    /// A phase started, ended or failed.
    fn progress(&self, command: Command, progress: &Progress<'_>) {
        let _ = (command, progress);
    }

    /// A phase found or did something worth showing.
    fn event(&self, command: Command, event: &Event<'_>) {
        let _ = (command, event);
    }
}

/// A [`Report`] that shows nothing (the phases still log through `tracing`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Silent;

impl Report for Silent {}

/// What was done about a failed command, beyond stopping at the failed phase.
#[derive(Debug)]
pub enum Aftermath {
    /// The upgrade failed before it changed anything.
    NothingChanged,
    /// Restoring an interrupted upgrade's snapshot failed; it stays in `dir` and the next
    /// upgrade tries again first.
    SnapshotKept {
        /// The snapshot directory.
        dir: PathBuf,
    },
    /// The saved configuration is back, and what was restarted runs on it again.
    RolledBack,
    /// The saved configuration is back, but reloading or restarting onto it failed.
    RestoredRestartFailed {
        /// What failed.
        problems: Vec<BoxError>,
    },
    /// The rollback could not put the saved configuration back; it stays in `dir` and
    /// the next upgrade restores it first.
    RollbackFailed {
        /// The snapshot directory.
        dir: PathBuf,
        /// Why the restore failed.
        error: Box<SnapshotError>,
    },
}

impl fmt::Display for Aftermath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Aftermath::NothingChanged => f.write_str("nothing was changed"),
            Aftermath::SnapshotKept { dir } => write!(
                f,
                "the interrupted upgrade's snapshot stays in {} and is restored by the next `node upgrade`",
                dir.display()
            ),
            Aftermath::RolledBack => f.write_str("the previous configuration was restored"),
            Aftermath::RestoredRestartFailed { problems } => write!(
                f,
                "the previous configuration was restored, but restarting onto it failed: {}",
                problems
                    .iter()
                    .map(|p| crate::error_chain(&**p))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            Aftermath::RollbackFailed { dir, error } => write!(
                f,
                "the rollback failed too ({}); the saved configuration is kept in {} and the next `node upgrade` restores it first",
                crate::error_chain(&**error),
                dir.display()
            ),
        }
    }
}

/// A lifecycle command failed.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    /// Another node command holds the lock; nothing ran.
    #[error("node {command}")]
    Locked {
        /// The command refused.
        command: Command,
        /// The lock error (names the holder).
        #[source]
        source: LockError,
    },
    /// A phase failed; no later phase ran.
    #[error("node {command}")]
    Phase {
        /// The command.
        command: Command,
        /// The failed phase and its cause.
        #[source]
        source: PhaseError,
        /// What was done about it (an upgrade's rollback), if anything.
        aftermath: Option<Aftermath>,
    },
}

impl LifecycleError {
    /// The failed phase, if a phase failed.
    pub fn phase(&self) -> Option<&PhaseError> {
        match self {
            LifecycleError::Phase { source, .. } => Some(source),
            LifecycleError::Locked { .. } => None,
        }
    }

    /// What was done about the failure, if anything.
    pub fn aftermath(&self) -> Option<&Aftermath> {
        match self {
            LifecycleError::Phase { aftermath, .. } => aftermath.as_ref(),
            LifecycleError::Locked { .. } => None,
        }
    }

    fn phase_failed(command: Command, source: PhaseError, aftermath: Option<Aftermath>) -> Self {
        LifecycleError::Phase {
            command,
            source,
            aftermath,
        }
    }
}

/// Mounts stayed below the kubelet directory during a reset.
#[derive(Debug, thiserror::Error)]
#[error(
    "mounts stayed below the kubelet directory (find what holds them with fuser -vm PATH, stop it and run node reset again)"
)]
pub struct MountsRemain {
    /// Which mounts, and why they would not go.
    #[source]
    pub source: PrefixError,
}

/// How an upgrade waits for the restarted kubelet (see [`crate::settle`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settle {
    /// How long the kubelet has to become active and answer its healthz.
    pub timeout: Duration,
    /// How long it must then stay so.
    pub hold: Duration,
}

impl Default for Settle {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(60),
            hold: Duration::from_secs(10),
        }
    }
}

/// What [`Node::up`] did.
#[derive(Clone, Debug)]
pub struct UpOutcome {
    /// The goal state applied.
    pub goal: MachineGoalState,
    /// Whether the stack was running before (then only changed units were restarted).
    pub was_running: bool,
    /// What the configuration step changed.
    pub applied: Applied,
}

/// What [`Node::down`] did.
#[derive(Clone, Debug)]
pub struct DownOutcome {
    /// The goal state whose units were stopped.
    pub goal: MachineGoalState,
}

/// What [`Node::reset`] did.
#[derive(Clone, Debug)]
pub struct ResetOutcome {
    /// The goal state whose stack was reset.
    pub goal: MachineGoalState,
    /// The resolved kubelet directory (`None`: there was none).
    pub kubelet_dir: Option<PathBuf>,
    /// What was removed below it.
    pub removed: crate::remove::RemoveReport,
    /// The kubelet client credentials removed.
    pub identity_removed: Vec<PathBuf>,
}

/// What [`Node::upgrade`] did.
#[derive(Clone, Debug)]
pub struct UpgradeOutcome {
    /// The goal state applied.
    pub goal: MachineGoalState,
    /// Whether an interrupted upgrade's snapshot was restored first.
    pub recovered: bool,
    /// Whether the stack was running (only then is anything restarted).
    pub was_running: bool,
    /// What the configuration step changed.
    pub applied: Applied,
    /// The units restarted.
    pub restarted: Vec<String>,
}

/// What [`Node::status`] found.
#[derive(Clone, Debug)]
pub struct NodeStatus {
    /// The goal state.
    pub goal: MachineGoalState,
    /// The isolation backend's name (`none`).
    pub backend: &'static str,
    /// Each unit of the stack with its state word, in start order.
    pub units: Vec<(String, String)>,
    /// Whether every unit is active.
    pub running: bool,
    /// A snapshot an interrupted upgrade left (the next upgrade restores it).
    pub leftover_snapshot: Option<PathBuf>,
    /// The kubelet's port and where its unit's command line comes from.
    pub kubelet: KubeletStatus,
}

/// The kubelet's serving port and the origin of its command line, as `node status`
/// shows them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletStatus {
    /// The kubelet unit.
    pub unit: String,
    /// The port the kubelet serves on: derived from the node name (the control plane
    /// derives the same number; nothing distributes it).
    pub port: u16,
    /// The range it was derived in, `first-last`.
    pub port_range: String,
    /// The `port` in the kubelet configuration file on disk (`None`: no file, or no port
    /// in it). Differs from `port` until `node up` or `node upgrade` writes it.
    pub configured_port: Option<u16>,
    /// The drop-in that sets the unit's command line (host path, below the host root).
    pub drop_in: PathBuf,
    /// Whether the drop-in on disk is the one the configuration renders.
    pub drop_in_state: DropInState,
    /// What systemd says about the unit (`None`: it could not be asked).
    pub systemd: Option<SystemdUnit>,
}

/// Whether the kubelet drop-in on disk is the rendered one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DropInState {
    /// It is.
    Current,
    /// It differs (an older configuration, or an edit): `node up` rewrites it.
    Stale,
    /// There is none: the unit runs its own command line.
    Missing,
}

/// The kubelet unit as systemd loaded it (`systemctl show`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SystemdUnit {
    /// The unit file (`FragmentPath`).
    pub fragment_path: Option<String>,
    /// Its drop-ins, in the order systemd applies them (`DropInPaths`).
    pub drop_in_paths: Vec<String>,
    /// The command line systemd runs (`ExecStart`'s `argv[]`), as it prints it.
    pub exec_start: Option<String>,
    /// Whether that command line is the drop-in's (another drop-in sorting after it, or
    /// a unit systemd has not reloaded, can run something else).
    pub exec_start_from_drop_in: bool,
}

/// Loads the node-stack configuration. Called by the `resolve-goal-state` phase, so a bad
/// file fails that phase, naming the field.
pub type LoadConfig = Arc<dyn Fn() -> Result<AgentConfig, BoxError> + Send + Sync>;

/// A node stack on this host: where its configuration comes from, which slot, and the
/// seams ([`Hooks`]; the zero value is the real host).
#[derive(Clone)]
pub struct Node {
    load: LoadConfig,
    slot: String,
    hooks: Hooks,
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("slot", &self.slot)
            .field("hooks", &self.hooks)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// A node whose configuration `load` returns, acting on `slot` (empty: the base).
    pub fn new<F, E>(load: F, slot: impl Into<String>, hooks: Hooks) -> Self
    where
        F: Fn() -> Result<AgentConfig, E> + Send + Sync + 'static,
        E: Into<BoxError>,
    {
        Self {
            load: Arc::new(move || load().map_err(Into::into)),
            slot: slot.into(),
            hooks,
        }
    }

    /// A node configured by the YAML file at `path` ([`AgentConfig::load`]).
    pub fn from_file(path: impl Into<PathBuf>, slot: impl Into<String>, hooks: Hooks) -> Self {
        let path = path.into();
        Self::new(move || AgentConfig::load(&path), slot, hooks)
    }

    /// The seams.
    pub fn hooks(&self) -> &Hooks {
        &self.hooks
    }

    /// Where an upgrade keeps its snapshot.
    pub fn snapshot_dir(&self) -> PathBuf {
        self.hooks.snapshot_dir(SNAPSHOT_NAME)
    }

    fn lock(&self, command: Command) -> Result<NodeLock, LifecycleError> {
        NodeLock::acquire(&self.hooks.host_root, &format!("node {command}"))
            .map_err(|source| LifecycleError::Locked { command, source })
    }

    fn resolve(&self) -> Result<MachineGoalState, BoxError> {
        let config = (self.load)()?;
        Ok(self.hooks.goal_state_source(config).for_slot(&self.slot)?)
    }

    fn backend(&self) -> HostBackend<Arc<dyn Runner>> {
        HostBackend::new(self.hooks.runner())
    }

    async fn systemctl(&self, args: &[&str]) -> Result<(), RunError> {
        self.hooks
            .runner()
            .run(&Cmd::new("systemctl", args.iter().copied()))
            .await?;
        Ok(())
    }

    async fn restart(&self, unit: String) -> Result<(), RunError> {
        self.systemctl(&["restart", "--", &unit]).await
    }

    async fn running(&self, goal: &MachineGoalState) -> Result<bool, BoxError> {
        Ok(crate::backend::running(&self.backend(), &slot_ref(goal)).await?)
    }

    /// Resolves the goal state, writes the configuration, clears stale pod volumes, sets
    /// up LocalDNS, starts containerd and the kubelet (or restarts what changed when the
    /// stack runs), and waits for LocalDNS to answer.
    pub async fn up(&self, report: &dyn Report) -> Result<UpOutcome, LifecycleError> {
        let command = Command::Up;
        let _lock = self.lock(command)?;
        let s = Steps::new(command, report);
        let run = async {
            let goal = s.step("resolve-goal-state", self.resolve_step(&s)).await?;
            let was_running = s
                .step("check-running", self.check_running(&s, &goal))
                .await?;
            let applied = s.step("configure", self.configure(&s, &goal)).await?;
            s.step("daemon-reload", self.daemon_reload(&applied))
                .await?;
            s.step(
                "unmount-stale-pod-volumes",
                self.unmount_stale_pod_volumes(was_running),
            )
            .await?;
            s.step(
                "local-dns-network",
                self.hooks.setup_local_dns_network(&goal.node_start),
            )
            .await?;
            s.step("start", self.start(&goal, &applied, was_running))
                .await?;
            s.step(
                "await-local-dns",
                self.hooks.await_local_dns(&goal.node_start),
            )
            .await?;
            Ok(UpOutcome {
                goal,
                was_running,
                applied,
            })
        };
        run.await
            .map_err(|e| LifecycleError::phase_failed(command, e, None))
    }

    /// Stops the kubelet, then containerd, and removes the LocalDNS interface.
    pub async fn down(&self, report: &dyn Report) -> Result<DownOutcome, LifecycleError> {
        let command = Command::Down;
        let _lock = self.lock(command)?;
        let s = Steps::new(command, report);
        let run = async {
            let goal = s.step("resolve-goal-state", self.resolve_step(&s)).await?;
            s.step("stop", self.stop(&goal)).await?;
            s.step(
                "cleanup-network",
                self.hooks.cleanup_host_network(&goal.node_start),
            )
            .await?;
            Ok(DownOutcome { goal })
        };
        run.await
            .map_err(|e| LifecycleError::phase_failed(command, e, None))
    }

    /// Stops the stack, unmounts everything strictly below the kubelet directory, removes
    /// what is no longer mounted, resets CNI state and the kubelet identity, removes the
    /// LocalDNS interface, and fails at the end if a mount stayed.
    pub async fn reset(&self, report: &dyn Report) -> Result<ResetOutcome, LifecycleError> {
        let command = Command::Reset;
        let _lock = self.lock(command)?;
        let s = Steps::new(command, report);
        let run = async {
            let goal = s.step("resolve-goal-state", self.resolve_step(&s)).await?;
            s.step("stop", self.stop(&goal)).await?;
            let cleared = s
                .step("unmount-kubelet-dir", self.unmount_kubelet_dir(&s))
                .await?;
            let removed = s
                .step(
                    "remove-kubelet-state",
                    self.remove_kubelet_state(&s, &cleared),
                )
                .await?;
            s.step("reset-cni-state", async {
                crate::reset_cni_state(&self.hooks.host_root, self.hooks.mount_info.as_deref())
            })
            .await?;
            let identity_removed = s
                .step("reset-kubelet-identity", async {
                    let removed =
                        crate::reset_kubelet_identity(&self.hooks.host_root, &goal.node_start)?;
                    for path in &removed {
                        s.event(Event::IdentityRemoved(path));
                    }
                    Ok::<_, crate::ResetError>(removed)
                })
                .await?;
            s.step(
                "cleanup-network",
                self.hooks.cleanup_host_network(&goal.node_start),
            )
            .await?;
            let (kubelet_dir, stuck) = match cleared {
                Cleared::NoDir => (None, None),
                Cleared::Dir { dir, stuck } => (Some(dir), stuck),
            };
            s.step("verify-unmounted", async move {
                match stuck {
                    None => Ok(()),
                    Some(source) => Err(MountsRemain { source }),
                }
            })
            .await?;
            Ok(ResetOutcome {
                goal,
                kubelet_dir,
                removed,
                identity_removed,
            })
        };
        run.await
            .map_err(|e| LifecycleError::phase_failed(command, e, None))
    }

    /// Saves the shared configuration, writes the one the configuration asks for,
    /// restarts what changed, waits for LocalDNS and for the kubelet to settle; on any
    /// failure after the snapshot, puts the saved configuration back and restarts onto
    /// it. A snapshot an interrupted upgrade left is restored first.
    pub async fn upgrade(
        &self,
        settle: Settle,
        report: &dyn Report,
    ) -> Result<UpgradeOutcome, LifecycleError> {
        let command = Command::Upgrade;
        let _lock = self.lock(command)?;
        let snapshot_dir = self.snapshot_dir();
        let runner = self.hooks.runner();
        let s = Steps::new(command, report);
        let fail = |e: PhaseError, aftermath: Aftermath| {
            LifecycleError::phase_failed(command, e, Some(aftermath))
        };

        // A complete snapshot here means an earlier upgrade died before finishing or
        // rolling back: its configuration may be half written. Put it back first.
        let recovered = s
            .step(
                "recover",
                snapshot::restore_snapshot_with(
                    &snapshot_dir,
                    &self.hooks.host_root,
                    runner.clone(),
                ),
            )
            .await
            .map_err(|e| {
                fail(
                    e,
                    Aftermath::SnapshotKept {
                        dir: snapshot_dir.clone(),
                    },
                )
            })?;
        if recovered {
            s.event(Event::RecoveredInterrupted(&snapshot_dir));
        }
        let before = async {
            let goal = s.step("resolve-goal-state", self.resolve_step(&s)).await?;
            let was_running = s
                .step("check-running", self.check_running(&s, &goal))
                .await?;
            let snap = s
                .step("snapshot", async {
                    let mut paths = configure::default_shared_paths();
                    paths.extend(configure::managed_paths(&goal.node_start));
                    snapshot::take_snapshot_of(&snapshot_dir, &self.hooks.host_root, &paths)
                })
                .await?
                .with_runner(runner.clone());
            Ok::<_, PhaseError>((goal, was_running, snap))
        };
        let (goal, was_running, snap) = before
            .await
            .map_err(|e| fail(e, Aftermath::NothingChanged))?;

        // From here on a failure rolls back. `applied` is what the configure step
        // changed, once it ran: the rollback restarts onto the old configuration only
        // what the upgrade changed.
        let mut applied: Option<Applied> = None;
        let after = async {
            let a = s.step("configure", self.configure(&s, &goal)).await?;
            let a = &*applied.insert(a);
            s.step("daemon-reload", self.daemon_reload(a)).await?;
            let restarted = s
                .step("restart", async {
                    let restarted =
                        crate::restart_changed(&a.units, was_running, |u| self.restart(u)).await?;
                    if !restarted.is_empty() {
                        s.event(Event::Restarted(&restarted));
                    }
                    Ok::<_, crate::RestartError<RunError>>(restarted)
                })
                .await?;
            s.step("await-local-dns", async {
                if was_running {
                    self.hooks.await_local_dns(&goal.node_start).await?;
                }
                Ok::<_, crate::HookError>(())
            })
            .await?;
            s.step("settle", async {
                // `systemctl restart` exiting 0 only says systemd started the process:
                // the kubelet must come up on the new configuration and stay up.
                if restarted.is_empty() {
                    return Ok(());
                }
                let unit = &goal.node_start.kubelet.unit;
                let healthz = crate::settle::healthz_addr(&goal.node_start.kubelet.config);
                crate::settle::settle_kubelet(&*runner, unit, healthz, settle.timeout, settle.hold)
                    .await?;
                s.event(Event::Settled { unit, healthz });
                Ok::<_, crate::settle::SettleError>(())
            })
            .await?;
            Ok::<_, PhaseError>((a.clone(), restarted))
        };
        match after.await {
            Ok((applied, restarted)) => {
                snap.discard();
                Ok(UpgradeOutcome {
                    goal,
                    recovered,
                    was_running,
                    applied,
                    restarted,
                })
            }
            Err(e) => {
                let aftermath = self.rollback(&s, snap, applied.as_ref(), was_running).await;
                Err(fail(e, aftermath))
            }
        }
    }

    /// Puts the snapshot back and, when the stack was running, restarts what the upgrade
    /// changed so the old configuration is what runs.
    async fn rollback(
        &self,
        s: &Steps<'_>,
        mut snap: Snapshot,
        applied: Option<&Applied>,
        was_running: bool,
    ) -> Aftermath {
        s.event(Event::RollingBack(snap.dir()));
        if let Err(error) = snap.restore().await {
            s.event(Event::RollbackFailed(&error));
            return Aftermath::RollbackFailed {
                dir: snap.dir().to_path_buf(),
                error: Box::new(error),
            };
        }
        let mut problems: Vec<BoxError> = Vec::new();
        if let Some(a) = applied {
            // On the real root the restore reloaded systemd itself; under a host root it
            // does not, but the unit files changed all the same.
            if a.unit_files_changed
                && !self.hooks.host_root.is_real()
                && let Err(e) = self.systemctl(&["daemon-reload"]).await
            {
                problems.push(e.into());
            }
            if let Err(e) = crate::restart_changed(&a.units, was_running, |u| self.restart(u)).await
            {
                problems.push(e.into());
            }
        }
        snap.discard();
        if problems.is_empty() {
            s.event(Event::RolledBack);
            Aftermath::RolledBack
        } else {
            s.event(Event::RolledBackRestartFailed(&problems));
            Aftermath::RestoredRestartFailed { problems }
        }
    }

    /// The goal state, each unit's state, and a leftover upgrade snapshot. A stack whose
    /// units cannot be asked about is an error (phase `unit-states`), not "not running".
    pub async fn status(&self) -> Result<NodeStatus, LifecycleError> {
        let command = Command::Status;
        let silent = Silent;
        let s = Steps::new(command, &silent);
        let run = async {
            let goal = s
                .step("resolve-goal-state", async { self.resolve() })
                .await?;
            let backend = self.backend();
            let units = s
                .step("unit-states", backend.unit_states(&slot_ref(&goal)))
                .await?;
            Ok(NodeStatus {
                running: stack_running(&units),
                backend: backend.name(),
                units,
                leftover_snapshot: Some(self.snapshot_dir()).filter(|d| snapshot::exists(d)),
                kubelet: self.kubelet_status(&goal).await,
                goal,
            })
        };
        run.await
            .map_err(|e| LifecycleError::phase_failed(command, e, None))
    }

    async fn kubelet_status(&self, goal: &MachineGoalState) -> KubeletStatus {
        let ns = &goal.node_start;
        let root = &self.hooks.host_root;
        let range = ns.kubelet.port_range.range().unwrap_or_default();
        let configured_port = std::fs::read(root.resolve(configure::KUBELET_CONFIG))
            .ok()
            .and_then(|bytes| serde_yaml::from_slice::<serde_yaml::Value>(&bytes).ok())
            .and_then(|config| config.get("port").and_then(serde_yaml::Value::as_u64))
            .and_then(|port| u16::try_from(port).ok());
        let drop_in = root.resolve(configure::drop_in_path(&ns.kubelet.unit));
        let drop_in_state = match std::fs::read(&drop_in) {
            Ok(bytes) if bytes == configure::render_drop_in(ns).as_bytes() => DropInState::Current,
            Ok(_) => DropInState::Stale,
            Err(_) => DropInState::Missing,
        };
        KubeletStatus {
            unit: ns.kubelet.unit.clone(),
            port: ns.kubelet_port,
            port_range: format!("{}-{}", range.base(), range.last()),
            configured_port,
            drop_in,
            drop_in_state,
            systemd: self.systemd_unit(ns).await,
        }
    }

    /// `systemctl show` of the kubelet unit; `None` when systemd does not answer (a
    /// status still reports the rest).
    async fn systemd_unit(&self, ns: &crate::goalstate::NodeStart) -> Option<SystemdUnit> {
        let cmd = Cmd::new(
            "systemctl",
            [
                "show",
                "--property=FragmentPath",
                "--property=DropInPaths",
                "--property=ExecStart",
                "--",
                ns.kubelet.unit.as_str(),
            ],
        );
        let out = match self.hooks.runner().run(&cmd).await {
            Ok(out) => out,
            Err(e) => {
                tracing::debug!(error = %crate::error_chain(&e), "systemctl show did not answer");
                return None;
            }
        };
        parse_systemctl_show(&out.stdout, &configure::kubelet_argv(ns))
    }

    async fn resolve_step(&self, s: &Steps<'_>) -> Result<MachineGoalState, BoxError> {
        let goal = self.resolve()?;
        s.event(Event::Resolved(&goal));
        Ok(goal)
    }

    async fn check_running(
        &self,
        s: &Steps<'_>,
        goal: &MachineGoalState,
    ) -> Result<bool, BoxError> {
        let running = self.running(goal).await?;
        s.event(Event::StackRunning(running));
        Ok(running)
    }

    async fn configure(
        &self,
        s: &Steps<'_>,
        goal: &MachineGoalState,
    ) -> Result<Applied, crate::fsutil::FsError> {
        let applied = configure::apply(&self.hooks.host_root, &goal.node_start)?;
        for path in &applied.changed_files {
            s.event(Event::Wrote(path));
        }
        Ok(applied)
    }

    async fn daemon_reload(&self, applied: &Applied) -> Result<(), RunError> {
        if applied.unit_files_changed {
            self.systemctl(&["daemon-reload"]).await?;
        }
        Ok(())
    }

    async fn unmount_stale_pod_volumes(&self, was_running: bool) -> Result<(), BoxError> {
        if was_running {
            // Those are the running pods' volumes, not stale ones.
            return Ok(());
        }
        // What a previous stack left below the kubelet directory (resolved first, as the
        // mount table names real paths); the directory's own mount stays, since the new
        // pods' mounts propagate through it.
        let Some(dir) = crate::resolve_kubelet_dir(&self.hooks.host_root)? else {
            return Ok(());
        };
        let mounter = self.hooks.mounter();
        match crate::unmount_kubelet_dir(&dir, &*mounter, self.hooks.mount_info.as_deref()).await? {
            Some(stuck) => Err(stuck.into()),
            None => Ok(()),
        }
    }

    async fn start(
        &self,
        goal: &MachineGoalState,
        applied: &Applied,
        was_running: bool,
    ) -> Result<(), BoxError> {
        if was_running {
            // Already up: a start would not reread the configuration.
            crate::restart_changed(&applied.units, true, |u| self.restart(u)).await?;
        } else {
            for unit in goal.node_start.units() {
                self.systemctl(&["start", "--", &unit]).await?;
            }
        }
        Ok(())
    }

    async fn stop(&self, goal: &MachineGoalState) -> Result<(), RunError> {
        // Kubelet first: it must not see its runtime vanish and start evicting.
        for unit in goal.node_start.units().iter().rev() {
            self.systemctl(&["stop", "--", unit]).await?;
        }
        Ok(())
    }

    async fn unmount_kubelet_dir(&self, s: &Steps<'_>) -> Result<Cleared, crate::ResetError> {
        // Resolved first: the mount table names real paths, and a kubelet directory that
        // is itself a symlink is refused here, naming it.
        let Some(dir) = crate::resolve_kubelet_dir(&self.hooks.host_root)? else {
            s.event(Event::NoKubeletDir);
            return Ok(Cleared::NoDir);
        };
        let mounter = self.hooks.mounter();
        let stuck =
            crate::unmount_kubelet_dir(&dir, &*mounter, self.hooks.mount_info.as_deref()).await?;
        if let Some(err) = &stuck {
            // Keep going: what did unmount can still be removed; the last phase fails
            // the reset.
            s.event(Event::MountsKept(err));
        }
        Ok(Cleared::Dir { dir, stuck })
    }

    async fn remove_kubelet_state(
        &self,
        s: &Steps<'_>,
        cleared: &Cleared,
    ) -> Result<crate::remove::RemoveReport, crate::ResetError> {
        let Cleared::Dir { dir, .. } = cleared else {
            return Ok(crate::remove::RemoveReport::default());
        };
        let report = crate::remove_kubelet_state(dir, self.hooks.mount_info.as_deref())?;
        s.event(Event::KubeletStateRemoved {
            dir,
            removed: report.removed,
            kept: report.kept.len(),
        });
        Ok(report)
    }
}

/// The kubelet directory as the reset's unmount phase left it.
enum Cleared {
    /// There is none.
    NoDir,
    /// The resolved directory and the mounts that would not go.
    Dir {
        dir: PathBuf,
        stuck: Option<PrefixError>,
    },
}

/// Reads `systemctl show`'s `FragmentPath`, `DropInPaths` and `ExecStart` lines, and
/// whether the one command line it runs is `argv`. `None` when it printed none of them.
pub fn parse_systemctl_show(stdout: &str, argv: &[String]) -> Option<SystemdUnit> {
    let mut fragment_path = None;
    let mut drop_in_paths = Vec::new();
    let mut exec_starts = Vec::new();
    let mut seen = false;
    for line in stdout.lines() {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        match key {
            "FragmentPath" => {
                seen = true;
                fragment_path = Some(value.to_string()).filter(|v| !v.is_empty());
            }
            "DropInPaths" => {
                seen = true;
                drop_in_paths = value.split_whitespace().map(str::to_string).collect();
            }
            "ExecStart" => {
                seen = true;
                // `{ path=... ; argv[]=ARGS ; ignore_errors=no ; ... }`
                if let Some((_, rest)) = value.split_once("argv[]=") {
                    let args = rest.split(" ; ").next().unwrap_or(rest).trim();
                    exec_starts.push(args.to_string());
                }
            }
            _ => {}
        }
    }
    if !seen {
        return None;
    }
    // systemctl may quote and escape words it prints; the flags hold no whitespace,
    // quotes or backslashes, so dropping those and undoing `$$` compares the words.
    let normal = |word: &str| word.replace(['"', '\\'], "").replace("$$", "$");
    let ours: Vec<String> = argv.iter().map(|a| normal(a)).collect();
    let exec_start_from_drop_in = exec_starts.len() == 1
        && exec_starts[0]
            .split_whitespace()
            .map(normal)
            .eq(ours.iter().cloned());
    Some(SystemdUnit {
        fragment_path,
        drop_in_paths,
        exec_start: exec_starts.into_iter().next(),
        exec_start_from_drop_in,
    })
}

fn slot_ref(goal: &MachineGoalState) -> SlotRef {
    SlotRef {
        slot: goal.slot.clone(),
        units: goal.node_start.units(),
    }
}

/// Runs one command's phases, numbering them and reporting each.
struct Steps<'r> {
    command: Command,
    total: usize,
    next: std::sync::atomic::AtomicUsize,
    report: &'r dyn Report,
}

impl<'r> Steps<'r> {
    fn new(command: Command, report: &'r dyn Report) -> Self {
        Self {
            command,
            total: command.phases().len(),
            next: std::sync::atomic::AtomicUsize::new(0),
            report,
        }
    }

    fn event(&self, event: Event<'_>) {
        self.report.event(self.command, &event);
    }

    /// Runs `work` as the next phase, `name`; its result goes to the caller, a failure
    /// carries the name.
    async fn step<T, E, F>(&self, name: &'static str, work: F) -> Result<T, PhaseError>
    where
        F: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        let index = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        debug_assert_eq!(self.command.phases().get(index), Some(&name), "phase table");
        let total = self.total;
        self.report
            .progress(self.command, &Progress::Started { index, total, name });
        let start = tokio::time::Instant::now();
        let span = tracing::info_span!("phase", command = %self.command, phase = name);
        match work.instrument(span).await {
            Ok(value) => {
                self.report.progress(
                    self.command,
                    &Progress::Done {
                        index,
                        total,
                        name,
                        elapsed: start.elapsed(),
                    },
                );
                Ok(value)
            }
            Err(source) => {
                let error = PhaseError {
                    task: name.into(),
                    source: source.into(),
                };
                self.report.progress(
                    self.command,
                    &Progress::Failed {
                        index,
                        total,
                        error: &error,
                    },
                );
                Err(error)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv() -> Vec<String> {
        [
            "/usr/bin/kubelet",
            "--config=/c.yaml",
            "--x=$HOME",
            "--e=5%",
        ]
        .map(String::from)
        .to_vec()
    }

    #[test]
    fn systemctl_show_says_whether_systemd_runs_our_command_line() {
        let ours = "ExecStart={ path=/usr/bin/kubelet ; argv[]=/usr/bin/kubelet --config=/c.yaml \"--x=\\$\\$HOME\" --e=5% ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }\nFragmentPath=/lib/systemd/system/kubelet.service\nDropInPaths=/etc/systemd/system/kubelet.service.d/10-kubeadm.conf /etc/systemd/system/kubelet.service.d/10-outpost.conf\n";
        let unit = parse_systemctl_show(ours, &argv()).unwrap();
        assert!(unit.exec_start_from_drop_in, "{unit:?}");
        assert_eq!(
            unit.fragment_path.as_deref(),
            Some("/lib/systemd/system/kubelet.service")
        );
        assert_eq!(unit.drop_in_paths.len(), 2);

        let theirs = ours.replace("\"--x=\\$\\$HOME\" ", "$KUBELET_ARGS ");
        let unit = parse_systemctl_show(&theirs, &argv()).unwrap();
        assert!(!unit.exec_start_from_drop_in);
        // Two command lines (a unit systemd would refuse) are not ours either.
        let two = format!("{ours}{}", ours.lines().next().unwrap());
        assert!(
            !parse_systemctl_show(&two, &argv())
                .unwrap()
                .exec_start_from_drop_in
        );
        assert_eq!(parse_systemctl_show("", &argv()), None);
    }

    #[test]
    fn every_command_names_its_phases_once() {
        for command in [
            Command::Up,
            Command::Down,
            Command::Reset,
            Command::Upgrade,
            Command::Status,
        ] {
            let phases = command.phases();
            let mut unique = phases.to_vec();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(unique.len(), phases.len(), "{command}");
        }
        assert_eq!(Command::Upgrade.phases()[6], "restart");
    }
}
