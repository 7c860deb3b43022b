//! `outpost-agent node ...`: the node-stack lifecycle on this host (the `none` isolation
//! mode: kubelet and containerd as systemd units).
//!
//! The lifecycle itself (phase order, the lock, rollback) is `hostnode::lifecycle`; this
//! module parses the flags, prints each phase's progress and what it did on stdout, and
//! picks the exit code. Operations: `docs/hostnode.md`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use hostnode::lifecycle::{self, Event, LifecycleError, Node, NodeStatus, Report};
use hostnode::phases::Progress;
use hostnode::runner::{HostRunner, Runner};
use hostnode::{Hooks, HostRoot};

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
    let result = match cmd {
        Command::Up(args) => node(&args)?.up(&Print).await.map(drop),
        Command::Down(args) => node(&args)?.down(&Print).await.map(drop),
        Command::Reset(args) => node(&args)?.reset(&Print).await.map(drop),
        Command::Upgrade(args) => {
            let settle = lifecycle::Settle {
                timeout: Duration::from_secs(args.settle_seconds),
                hold: Duration::from_secs(args.settle_hold_seconds),
            };
            node(&args.common)?.upgrade(settle, &Print).await.map(drop)
        }
        Command::Status(args) => {
            return match node(&args.common)?.status().await {
                Ok(status) => print_status(&status, args.output),
                Err(err) => Err(failed(err)),
            };
        }
    };
    result.map_err(failed)?;
    Ok(ExitCode::SUCCESS)
}

/// The node the flags describe.
fn node(args: &Args) -> anyhow::Result<Node> {
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
    let hooks = Hooks {
        host_root,
        runner: Some(runner),
        mount_info: args.mountinfo.clone(),
        ..Hooks::default()
    };
    let config = args.config.clone();
    Ok(Node::new(
        move || agent::load_node_stack(&config),
        args.slot.clone(),
        hooks,
    ))
}

/// The error `main` prints: the failed phase and its causes, then what was done about it.
fn failed(err: LifecycleError) -> anyhow::Error {
    let note = err.aftermath().map_or(String::new(), |a| format!("; {a}"));
    anyhow::anyhow!("{}{note}", hostnode::error_chain(&err))
}

/// Prints a line as each phase starts and ends, and what the phases did.
struct Print;

impl Report for Print {
    fn progress(&self, command: lifecycle::Command, progress: &Progress<'_>) {
        match progress {
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
            } => println!(
                "node {command}: [{}/{total}] {} FAILED: {}",
                index + 1,
                error.task,
                hostnode::error_chain(&*error.source)
            ),
        }
    }

    fn event(&self, command: lifecycle::Command, event: &Event<'_>) {
        match event {
            Event::Resolved(g) => println!(
                "node: {} slot {:?}, auth {}, units {}",
                g.node_start.node_name,
                g.slot,
                g.node_start.auth.name(),
                g.node_start.units().join(", ")
            ),
            Event::StackRunning(running) => println!(
                "node: stack {}",
                if *running { "running" } else { "not running" }
            ),
            Event::Wrote(path) => println!("node: wrote {}", path.display()),
            Event::RecoveredInterrupted(dir) => println!(
                "node {command}: restored the configuration an interrupted upgrade saved in {}",
                dir.display()
            ),
            Event::NoKubeletDir => println!("node {command}: no kubelet directory"),
            Event::MountsKept(err) => {
                println!("node {command}: {err}; those mounts and their contents are kept")
            }
            Event::KubeletStateRemoved { dir, removed, kept } => println!(
                "node {command}: removed {removed} entries below {}, kept {kept} mount(s)",
                dir.display()
            ),
            Event::IdentityRemoved(path) => println!("node {command}: removed {}", path.display()),
            Event::Restarted(units) => println!("node {command}: restarted {}", units.join(", ")),
            Event::Settled { unit, healthz } => println!(
                "node {command}: {unit} settled{}",
                healthz.map_or(String::new(), |a| format!(" (healthz on {a})"))
            ),
            Event::RollingBack(dir) => {
                println!("node {command}: rolling back from {}", dir.display())
            }
            Event::RollbackFailed(err) => println!(
                "node {command}: rollback FAILED: {}",
                hostnode::error_chain(*err)
            ),
            Event::RolledBack => {
                println!("node {command}: rolled back: the previous configuration is restored")
            }
            Event::RolledBackRestartFailed(problems) => println!(
                "node {command}: configuration restored, but: {}",
                problems
                    .iter()
                    .map(|p| hostnode::error_chain(&**p))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            other => println!("node {command}: {other:?}"),
        }
    }
}

/// Prints `node status`; exit 0 when the stack runs, 3 when it does not.
fn print_status(status: &NodeStatus, output: Output) -> anyhow::Result<ExitCode> {
    let goal = &status.goal;
    let ns = &goal.node_start;
    match output {
        Output::Json => {
            let value = serde_json::json!({
                "node": ns.node_name,
                "slot": goal.slot,
                "backend": status.backend,
                "auth": ns.auth.name(),
                "running": status.running,
                "units": status.units.iter().map(|(u, s)| serde_json::json!({"unit": u, "state": s})).collect::<Vec<_>>(),
                "localDNS": ns.local_dns.as_ref().map(|d| d.listener_addrs().iter().map(ToString::to_string).collect::<Vec<_>>()),
                "leftoverSnapshot": status.leftover_snapshot.as_ref().map(|p| p.display().to_string()),
                "kubelet": status.kubelet,
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
            println!("backend:  {}", status.backend);
            println!("auth:     {}", ns.auth.name());
            for (unit, state) in &status.units {
                println!("unit:     {unit} {state}");
            }
            let k = &status.kubelet;
            println!(
                "kubelet:  port {} (derived from the node name in {}; configuration file: {})",
                k.port,
                k.port_range,
                k.configured_port
                    .map_or("no port yet".into(), |p| p.to_string())
            );
            println!(
                "command:  {} drop-in {} ({}){}",
                k.unit,
                k.drop_in.display(),
                match k.drop_in_state {
                    lifecycle::DropInState::Current => "current",
                    lifecycle::DropInState::Stale => "stale: `node up` rewrites it",
                    lifecycle::DropInState::Missing =>
                        "missing: the unit runs its own command line",
                },
                match &k.systemd {
                    None => "; systemd did not say what it runs".to_string(),
                    Some(u) if u.exec_start_from_drop_in => format!(
                        "; systemd runs it (unit {})",
                        u.fragment_path.as_deref().unwrap_or("?")
                    ),
                    Some(u) => format!(
                        "; systemd runs something else: {} (unit {}, drop-ins {})",
                        u.exec_start.as_deref().unwrap_or("no ExecStart"),
                        u.fragment_path.as_deref().unwrap_or("?"),
                        u.drop_in_paths.join(" ")
                    ),
                }
            );
            if let Some(dns) = &ns.local_dns {
                let addrs: Vec<String> = dns
                    .listener_addrs()
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                println!("localDNS: {} on {}", addrs.join(", "), dns.interface);
            }
            if let Some(dir) = &status.leftover_snapshot {
                println!(
                    "snapshot: {} (an upgrade did not finish; the next `node upgrade` restores it)",
                    dir.display()
                );
            }
            println!("running:  {}", if status.running { "yes" } else { "no" });
        }
    }
    Ok(if status.running {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(3)
    })
}
