//! `outpost-agent node ...`: the node-stack lifecycle on this host (the `none` isolation
//! mode: kubelet and containerd as systemd units).
//!
//! Each command runs named phases in order, printing one progress line per phase on
//! stdout, and exits non-zero naming the phase that failed. Operations:
//! `docs/hostnode.md`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::Context;
use hostnode::backend::{HostBackend, IsolationBackend, SlotRef};
use hostnode::configure::{self, Applied};
use hostnode::goalstate::MachineGoalState;
use hostnode::lock::NodeLock;
use hostnode::phases::{self, BoxError, PhaseError, Progress, Task, func};
use hostnode::runner::{Cmd, HostRunner, RunError, Runner};
use hostnode::snapshot::{self, Snapshot};
use hostnode::unmount::PrefixError;
use hostnode::{Hooks, HostRoot, SNAPSHOT_NAME};

/// `outpost-agent node` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Resolve the goal state, write the configuration, clear stale pod volumes, set up
    /// LocalDNS, start containerd and the kubelet, wait for LocalDNS to answer.
    Up(Args),
    /// Stop the kubelet and containerd and remove the LocalDNS interface.
    Down(Args),
    /// Stop the stack, unmount everything below the kubelet directory, remove what is no
    /// longer mounted, reset CNI state and the kubelet identity, remove the LocalDNS
    /// interface.
    Reset(Args),
    /// Save the shared configuration, write the one --config asks for, restart what
    /// changed and wait for the kubelet to settle (active, answering its healthz); on any
    /// failure put the saved configuration back.
    Upgrade(UpgradeArgs),
    /// Print the goal state and whether each unit runs. Exit 0 when the stack runs, 3
    /// when it does not, 1 when it cannot be asked.
    Status(StatusArgs),
}

/// Flags every `node` subcommand takes.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The agent configuration file (YAML; see docs/hostnode.md).
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// Prefix under which every host path (/etc, /var/lib, ...) is read and written. Unset:
    /// the real host. For tests and for preparing a tree other than the running host's;
    /// systemctl, ip and the mount table still act on this host.
    #[arg(long, value_name = "DIR")]
    pub host_root: Option<PathBuf>,
    /// The slot to act on (a key of `slots:` in the configuration); empty: the base.
    #[arg(long, default_value = "")]
    pub slot: String,
    /// TEST/DEV HOOK: run this executable wherever `systemctl` would run. For machines
    /// whose PID 1 is not systemd (containers, CI), where the real systemctl cannot work;
    /// never needed on a real host.
    #[arg(long, env = "OUTPOST_SYSTEMCTL", value_name = "PATH")]
    pub systemctl: Option<PathBuf>,
    /// The mount table to read (default /proc/self/mountinfo).
    #[arg(long, value_name = "FILE")]
    pub mountinfo: Option<PathBuf>,
    /// How long one host command (systemctl, ip, umount) may run before it is killed and
    /// the phase fails.
    #[arg(long, value_name = "SECONDS", default_value_t = 120,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub command_timeout_seconds: u64,
}

/// Flags of `outpost-agent node upgrade`.
#[derive(Debug, clap::Args)]
pub struct UpgradeArgs {
    #[command(flatten)]
    common: Args,
    /// After a restart, how long the kubelet has to become active and answer its healthz
    /// endpoint (healthzBindAddress:healthzPort of its configuration) before the upgrade
    /// is rolled back.
    #[arg(long, value_name = "SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    settle_seconds: u64,
    /// How long the kubelet must then stay active and healthy (a kubelet that starts and
    /// crashes on the new configuration is caught here).
    #[arg(long, value_name = "SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(0..=600))]
    settle_hold_seconds: u64,
}

/// Flags of `outpost-agent node status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    common: Args,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    output: Output,
}

/// `node status` output format.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Output {
    /// Lines for people.
    Text,
    /// One JSON object, for scripts.
    Json,
}

pub async fn run(cmd: Command) -> anyhow::Result<ExitCode> {
    // Commands that change the host take the node lock for their whole run: two at once
    // (an upgrade and a reset) would undo each other's steps. Status only reads.
    let locked = |args: &Args, name: &str| -> anyhow::Result<(Node, NodeLock)> {
        let node = Node::new(args)?;
        let lock = NodeLock::acquire(node.root(), &format!("node {name}"))?;
        Ok((node, lock))
    };
    match cmd {
        Command::Up(args) => {
            let (node, _lock) = locked(&args, "up")?;
            up(&node).await
        }
        Command::Down(args) => {
            let (node, _lock) = locked(&args, "down")?;
            down(&node).await
        }
        Command::Reset(args) => {
            let (node, _lock) = locked(&args, "reset")?;
            reset(&node).await
        }
        Command::Upgrade(args) => {
            let (node, _lock) = locked(&args.common, "upgrade")?;
            let settle = Settle {
                timeout: Duration::from_secs(args.settle_seconds),
                hold: Duration::from_secs(args.settle_hold_seconds),
            };
            upgrade(&node, settle).await
        }
        Command::Status(args) => status(&Node::new(&args.common)?, args.output).await,
    }
}

/// What every command works with.
struct Node {
    config_path: PathBuf,
    slot: String,
    hooks: Hooks,
    runner: Arc<dyn Runner>,
}

impl Node {
    fn new(args: &Args) -> anyhow::Result<Self> {
        let host_root = match &args.host_root {
            Some(dir) => HostRoot::new(std::fs::canonicalize(dir).with_context(|| {
                format!("--host-root {}: create the directory first", dir.display())
            })?),
            None => HostRoot::real(),
        };
        let mut runner =
            HostRunner::new().with_timeout(Duration::from_secs(args.command_timeout_seconds));
        if let Some(systemctl) = &args.systemctl {
            tracing::warn!(systemctl = %systemctl.display(), "systemctl substituted (test/dev hook)");
            runner = runner.with_program("systemctl", systemctl);
        }
        let runner: Arc<dyn Runner> = Arc::new(runner);
        Ok(Self {
            config_path: args.config.clone(),
            slot: args.slot.clone(),
            hooks: Hooks {
                host_root,
                runner: Some(runner.clone()),
                mount_info: args.mountinfo.clone(),
                ..Hooks::default()
            },
            runner,
        })
    }

    fn root(&self) -> &HostRoot {
        &self.hooks.host_root
    }

    fn resolve(&self) -> anyhow::Result<MachineGoalState> {
        let config = agent::load_node_stack(&self.config_path)?;
        Ok(self.hooks.goal_state_source(config).for_slot(&self.slot)?)
    }

    fn backend(&self) -> HostBackend<Arc<dyn Runner>> {
        HostBackend::new(self.runner.clone())
    }

    async fn systemctl(&self, args: &[&str]) -> Result<(), RunError> {
        self.runner
            .run(&Cmd::new("systemctl", args.iter().copied()))
            .await?;
        Ok(())
    }

    async fn running(&self, goal: &MachineGoalState) -> Result<bool, BoxError> {
        let slot = slot_ref(goal);
        Ok(hostnode::backend::running(&self.backend(), &slot).await?)
    }
}

fn slot_ref(goal: &MachineGoalState) -> SlotRef {
    SlotRef {
        slot: goal.slot.clone(),
        units: goal.node_start.units(),
    }
}

/// Shared between phases: filled by one, read by later ones. A later phase only runs
/// when the earlier one succeeded, so an empty cell there is a bug, reported as an error.
fn get<'a, T>(cell: &'a OnceLock<T>, what: &str) -> Result<&'a T, BoxError> {
    cell.get()
        .ok_or_else(|| format!("internal: {what} was not computed by an earlier phase").into())
}

fn set<T>(cell: &OnceLock<T>, value: T) {
    let _ = cell.set(value);
}

/// Runs the phases, printing a line as each starts and ends.
async fn run_phases(command: &str, tasks: Vec<Task<'_>>) -> Result<(), PhaseError> {
    phases::run_with_progress(tasks, |p| match p {
        Progress::Started { index, total, name } => {
            println!("node {command}: [{}/{total}] {name} ...", index + 1)
        }
        Progress::Done {
            index,
            total,
            name,
            elapsed,
        } => println!(
            "node {command}: [{}/{total}] {name} ok ({} ms)",
            index + 1,
            elapsed.as_millis()
        ),
        Progress::Failed {
            index,
            total,
            error,
        } => {
            println!(
                "node {command}: [{}/{total}] {} FAILED: {}",
                index + 1,
                error.task,
                hostnode::error_chain(&*error.source)
            )
        }
    })
    .await
}

fn resolve_task<'a>(node: &'a Node, goal: &'a OnceLock<MachineGoalState>) -> Task<'a> {
    func("resolve-goal-state", move || async move {
        let g = node.resolve()?;
        println!(
            "node: {} slot {:?}, auth {}, units {}",
            g.node_start.node_name,
            g.slot,
            g.node_start.auth.name(),
            g.node_start.units().join(", ")
        );
        set(goal, g);
        Ok::<_, BoxError>(())
    })
}

fn configure_task<'a>(
    node: &'a Node,
    goal: &'a OnceLock<MachineGoalState>,
    applied: &'a OnceLock<Applied>,
) -> Task<'a> {
    func("configure", move || async move {
        let g = get(goal, "the goal state")?;
        let a = configure::apply(node.root(), &g.node_start)?;
        for path in &a.changed_files {
            println!("node: wrote {}", path.display());
        }
        set(applied, a);
        Ok::<_, BoxError>(())
    })
}

fn daemon_reload_task<'a>(node: &'a Node, applied: &'a OnceLock<Applied>) -> Task<'a> {
    func("daemon-reload", move || async move {
        if get(applied, "the configuration change")?.unit_files_changed {
            node.systemctl(&["daemon-reload"]).await?;
        }
        Ok::<_, BoxError>(())
    })
}

fn local_dns_network_task<'a>(node: &'a Node, goal: &'a OnceLock<MachineGoalState>) -> Task<'a> {
    func("local-dns-network", move || async move {
        let g = get(goal, "the goal state")?;
        node.hooks.setup_local_dns_network(&g.node_start).await?;
        Ok::<_, BoxError>(())
    })
}

fn await_local_dns_task<'a>(node: &'a Node, goal: &'a OnceLock<MachineGoalState>) -> Task<'a> {
    func("await-local-dns", move || async move {
        let g = get(goal, "the goal state")?;
        node.hooks.await_local_dns(&g.node_start).await?;
        Ok::<_, BoxError>(())
    })
}

fn stop_task<'a>(node: &'a Node, goal: &'a OnceLock<MachineGoalState>) -> Task<'a> {
    func("stop", move || async move {
        let g = get(goal, "the goal state")?;
        // Kubelet first: it must not see its runtime vanish and start evicting.
        for unit in g.node_start.units().iter().rev() {
            node.systemctl(&["stop", "--", unit]).await?;
        }
        Ok::<_, BoxError>(())
    })
}

fn cleanup_network_task<'a>(node: &'a Node, goal: &'a OnceLock<MachineGoalState>) -> Task<'a> {
    func("cleanup-network", move || async move {
        let g = get(goal, "the goal state")?;
        node.hooks.cleanup_host_network(&g.node_start).await?;
        Ok::<_, BoxError>(())
    })
}

/// The error `main` prints: the failed phase and its causes, then what was done about it.
fn exit_failed(command: &str, err: PhaseError, note: &str) -> anyhow::Result<ExitCode> {
    Err(anyhow::anyhow!(
        "node {command}: {}{note}",
        hostnode::error_chain(&err)
    ))
}

async fn up(node: &Node) -> anyhow::Result<ExitCode> {
    let goal = OnceLock::new();
    let applied = OnceLock::new();
    let was_running = OnceLock::new();
    let tasks = vec![
        resolve_task(node, &goal),
        check_running_task(node, &goal, &was_running),
        configure_task(node, &goal, &applied),
        daemon_reload_task(node, &applied),
        func("unmount-stale-pod-volumes", || async {
            if *get(&was_running, "whether the stack runs")? {
                // Those are the running pods' volumes, not stale ones.
                return Ok::<_, BoxError>(());
            }
            // What a previous stack left below the kubelet directory (resolved first, as
            // the mount table names real paths); the directory's own mount stays, since
            // the new pods' mounts propagate through it.
            let Some(dir) = hostnode::resolve_kubelet_dir(node.root())? else {
                return Ok::<_, BoxError>(());
            };
            if let Some(stuck) = hostnode::unmount_kubelet_dir(
                &dir,
                &*node.hooks.mounter(),
                node.hooks.mount_info.as_deref(),
            )
            .await?
            {
                return Err(stuck.into());
            }
            Ok::<_, BoxError>(())
        }),
        local_dns_network_task(node, &goal),
        func("start", || async {
            let g = get(&goal, "the goal state")?;
            let a = get(&applied, "the configuration change")?;
            if *get(&was_running, "whether the stack runs")? {
                // Already up: a start would not reread the configuration.
                hostnode::restart_changed(&a.units, true, |unit| async move {
                    node.systemctl(&["restart", "--", &unit]).await
                })
                .await
                .map_err(|e| hostnode::error_chain(&e))?;
            } else {
                for unit in g.node_start.units() {
                    node.systemctl(&["start", "--", &unit]).await?;
                }
            }
            Ok::<_, BoxError>(())
        }),
        await_local_dns_task(node, &goal),
    ];
    match run_phases("up", tasks).await {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => exit_failed("up", e, ""),
    }
}

fn check_running_task<'a>(
    node: &'a Node,
    goal: &'a OnceLock<MachineGoalState>,
    was_running: &'a OnceLock<bool>,
) -> Task<'a> {
    func("check-running", move || async move {
        let g = get(goal, "the goal state")?;
        let running = node.running(g).await?;
        println!(
            "node: stack {}",
            if running { "running" } else { "not running" }
        );
        set(was_running, running);
        Ok::<_, BoxError>(())
    })
}

async fn down(node: &Node) -> anyhow::Result<ExitCode> {
    let goal = OnceLock::new();
    let tasks = vec![
        resolve_task(node, &goal),
        stop_task(node, &goal),
        cleanup_network_task(node, &goal),
    ];
    match run_phases("down", tasks).await {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => exit_failed("down", e, ""),
    }
}

async fn reset(node: &Node) -> anyhow::Result<ExitCode> {
    let goal = OnceLock::new();
    let stuck: OnceLock<Option<PrefixError>> = OnceLock::new();
    let resolved: OnceLock<Option<PathBuf>> = OnceLock::new();
    let tasks = vec![
        resolve_task(node, &goal),
        stop_task(node, &goal),
        func("unmount-kubelet-dir", || async {
            // Resolved first: the mount table names real paths, and a kubelet directory
            // that is itself a symlink is refused here, naming it.
            let Some(dir) = hostnode::resolve_kubelet_dir(node.root())? else {
                println!("node reset: no kubelet directory");
                set(&resolved, None);
                set(&stuck, None);
                return Ok::<_, BoxError>(());
            };
            let failure = hostnode::unmount_kubelet_dir(
                &dir,
                &*node.hooks.mounter(),
                node.hooks.mount_info.as_deref(),
            )
            .await?;
            if let Some(err) = &failure {
                // Keep going: what did unmount can still be removed; the last phase
                // fails the reset.
                println!("node reset: {err}; those mounts and their contents are kept");
            }
            set(&resolved, Some(dir));
            set(&stuck, failure);
            Ok::<_, BoxError>(())
        }),
        func("remove-kubelet-state", || async {
            let Some(dir) = get(&resolved, "the kubelet directory")? else {
                return Ok::<_, BoxError>(());
            };
            let report = hostnode::remove_kubelet_state(dir, node.hooks.mount_info.as_deref())?;
            println!(
                "node reset: removed {} entries below {}, kept {} mount(s)",
                report.removed,
                dir.display(),
                report.kept.len()
            );
            Ok::<_, BoxError>(())
        }),
        func("reset-cni-state", || async {
            hostnode::reset_cni_state(node.root(), node.hooks.mount_info.as_deref())?;
            Ok::<_, BoxError>(())
        }),
        func("reset-kubelet-identity", || async {
            let g = get(&goal, "the goal state")?;
            for path in hostnode::reset_kubelet_identity(node.root(), &g.node_start)? {
                println!("node reset: removed {}", path.display());
            }
            Ok::<_, BoxError>(())
        }),
        cleanup_network_task(node, &goal),
        func("verify-unmounted", || async {
            match get(&stuck, "the unmount result")? {
                None => Ok::<_, BoxError>(()),
                Some(err) => Err(format!(
                    "{err}; find what holds them (fuser -vm PATH), stop it and run node reset again"
                )
                .into()),
            }
        }),
    ];
    match run_phases("reset", tasks).await {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => exit_failed("reset", e, ""),
    }
}

/// How an upgrade waits for the restarted kubelet.
#[derive(Clone, Copy, Debug)]
struct Settle {
    timeout: Duration,
    hold: Duration,
}

async fn upgrade(node: &Node, settle: Settle) -> anyhow::Result<ExitCode> {
    let snapshot_dir = node.hooks.snapshot_dir(SNAPSHOT_NAME);
    let goal = OnceLock::new();
    let applied = OnceLock::new();
    let was_running = OnceLock::new();
    let snap: Mutex<Option<Snapshot>> = Mutex::new(None);
    let any_restarted = OnceLock::new();
    let tasks = vec![
        func("recover", || async {
            // A complete snapshot here means an earlier upgrade died before finishing or
            // rolling back: its configuration may be half written. Put it back first.
            if snapshot::restore_snapshot_with(&snapshot_dir, node.root(), node.runner.clone())
                .await?
            {
                println!(
                    "node upgrade: restored the configuration an interrupted upgrade saved in {}",
                    snapshot_dir.display()
                );
            }
            Ok::<_, BoxError>(())
        }),
        resolve_task(node, &goal),
        check_running_task(node, &goal, &was_running),
        func("snapshot", || async {
            let g = get(&goal, "the goal state")?;
            let mut paths = configure::default_shared_paths();
            paths.extend(configure::managed_paths(&g.node_start));
            let s = snapshot::take_snapshot_of(&snapshot_dir, node.root(), &paths)?;
            *snap.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(s.with_runner(node.runner.clone()));
            Ok::<_, BoxError>(())
        }),
        configure_task(node, &goal, &applied),
        daemon_reload_task(node, &applied),
        func("restart", || async {
            let a = get(&applied, "the configuration change")?;
            let running = *get(&was_running, "whether the stack runs")?;
            let restarted = hostnode::restart_changed(&a.units, running, |unit| async move {
                node.systemctl(&["restart", "--", &unit]).await
            })
            .await
            .map_err(|e| hostnode::error_chain(&e))?;
            if !restarted.is_empty() {
                println!("node upgrade: restarted {}", restarted.join(", "));
            }
            set(&any_restarted, !restarted.is_empty());
            Ok::<_, BoxError>(())
        }),
        func("await-local-dns", || async {
            if *get(&was_running, "whether the stack runs")? {
                let g = get(&goal, "the goal state")?;
                node.hooks.await_local_dns(&g.node_start).await?;
            }
            Ok::<_, BoxError>(())
        }),
        func("settle", || async {
            // `systemctl restart` exiting 0 only says systemd started the process: the
            // kubelet must come up on the new configuration and stay up.
            if !*get(&any_restarted, "whether anything was restarted")? {
                return Ok::<_, BoxError>(());
            }
            let g = get(&goal, "the goal state")?;
            let healthz = hostnode::settle::healthz_addr(&g.node_start.kubelet.config);
            hostnode::settle::settle_kubelet(
                &*node.runner,
                &g.node_start.kubelet.unit,
                healthz,
                settle.timeout,
                settle.hold,
            )
            .await?;
            println!(
                "node upgrade: {} settled{}",
                g.node_start.kubelet.unit,
                healthz.map_or(String::new(), |a| format!(" (healthz on {a})"))
            );
            Ok::<_, BoxError>(())
        }),
    ];
    let result = run_phases("upgrade", tasks).await;
    let taken = snap.lock().unwrap_or_else(|e| e.into_inner()).take();
    match (result, taken) {
        (Ok(()), Some(s)) => {
            s.discard();
            Ok(ExitCode::SUCCESS)
        }
        (Ok(()), None) => Ok(ExitCode::SUCCESS),
        (Err(e), None) if e.task == "recover" => {
            let note = format!(
                "; the interrupted upgrade's snapshot stays in {} and is restored by the next `node upgrade`",
                snapshot_dir.display()
            );
            exit_failed("upgrade", e, &note)
        }
        (Err(e), None) => exit_failed("upgrade", e, "; nothing was changed"),
        (Err(e), Some(s)) => {
            let note = rollback(
                node,
                s,
                applied.get(),
                was_running.get().copied().unwrap_or(false),
            )
            .await;
            exit_failed("upgrade", e, &note)
        }
    }
}

/// Puts the snapshot back and, when the stack was running, restarts what the upgrade
/// changed so the old configuration is what runs. Returns a note for the error message.
async fn rollback(
    node: &Node,
    mut snap: Snapshot,
    applied: Option<&Applied>,
    was_running: bool,
) -> String {
    println!("node upgrade: rolling back from {}", snap.dir().display());
    if let Err(err) = snap.restore().await {
        let err = hostnode::error_chain(&err);
        println!("node upgrade: rollback FAILED: {err}");
        return format!(
            "; the rollback failed too ({err}); the saved configuration is kept in {} and the next `node upgrade` restores it first",
            snap.dir().display()
        );
    }
    let mut problems = Vec::new();
    if let Some(a) = applied {
        // On the real root the restore reloaded systemd itself; under --host-root it
        // does not, but the unit files changed all the same.
        if a.unit_files_changed
            && !node.root().is_real()
            && let Err(e) = node.systemctl(&["daemon-reload"]).await
        {
            problems.push(hostnode::error_chain(&e));
        }
        if let Err(e) = hostnode::restart_changed(&a.units, was_running, |unit| async move {
            node.systemctl(&["restart", "--", &unit]).await
        })
        .await
        {
            problems.push(hostnode::error_chain(&e));
        }
    }
    snap.discard();
    if problems.is_empty() {
        println!("node upgrade: rolled back: the previous configuration is restored");
        "; the previous configuration was restored".into()
    } else {
        println!(
            "node upgrade: configuration restored, but: {}",
            problems.join("; ")
        );
        format!(
            "; the previous configuration was restored, but restarting onto it failed: {}",
            problems.join("; ")
        )
    }
}

async fn status(node: &Node, output: Output) -> anyhow::Result<ExitCode> {
    let goal = node
        .resolve()
        .context("phase \"resolve-goal-state\" failed")?;
    let states = node
        .backend()
        .unit_states(&slot_ref(&goal))
        .await
        .context("phase \"unit-states\" failed")?;
    let running = !states.is_empty()
        && states
            .iter()
            .all(|(_, s)| s == "active" || s == "reloading");
    let leftover = leftover_snapshot(&node.hooks.snapshot_dir(SNAPSHOT_NAME));
    let ns = &goal.node_start;
    match output {
        Output::Json => {
            let value = serde_json::json!({
                "node": ns.node_name,
                "slot": goal.slot,
                "backend": node.backend().name(),
                "auth": ns.auth.name(),
                "running": running,
                "units": states.iter().map(|(u, s)| serde_json::json!({"unit": u, "state": s})).collect::<Vec<_>>(),
                "localDNS": ns.local_dns.as_ref().map(|d| d.listener_addrs().iter().map(ToString::to_string).collect::<Vec<_>>()),
                "leftoverSnapshot": leftover.as_ref().map(|p| p.display().to_string()),
            });
            println!("{}", serde_json::to_string_pretty(&value)?);
        }
        Output::Text => {
            println!("node:     {}", ns.node_name);
            println!(
                "slot:     {}",
                if goal.slot.is_empty() {
                    "(base)"
                } else {
                    &goal.slot
                }
            );
            println!("backend:  {}", node.backend().name());
            println!("auth:     {}", ns.auth.name());
            for (unit, state) in &states {
                println!("unit:     {unit} {state}");
            }
            if let Some(dns) = &ns.local_dns {
                let addrs: Vec<String> = dns
                    .listener_addrs()
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                println!("localDNS: {} on {}", addrs.join(", "), dns.interface);
            }
            if let Some(dir) = &leftover {
                println!(
                    "snapshot: {} (an upgrade did not finish; the next `node upgrade` restores it)",
                    dir.display()
                );
            }
            println!("running:  {}", if running { "yes" } else { "no" });
        }
    }
    Ok(if running {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(3)
    })
}

fn leftover_snapshot(dir: &Path) -> Option<PathBuf> {
    snapshot::exists(dir).then(|| dir.to_path_buf())
}
