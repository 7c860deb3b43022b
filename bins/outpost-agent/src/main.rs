//! `outpost-agent`: the worker agent. It runs the worker daemon (`run`), joins a cluster
//! (`join`), serves the health probe listener standalone, runs the node-stack lifecycle steps (`node up|down|reset|upgrade|status`), and computes the
//! worker half of the tunnel route (`kubelet-port`, `tunnel-config`).
//!
//! Operations: `docs/outpost-agent.md`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod health_cmd;
mod join_cmd;
mod node_cmd;
mod run_cmd;
mod tunnel_cmd;

/// The worker agent.
#[derive(Debug, Parser)]
#[command(name = "outpost-agent", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    log: cmdline::LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the worker daemon until SIGTERM: probes with truthful readiness, the supervised
    /// tunnel, the admin listener.
    Run(run_cmd::Args),
    /// Join a cluster by token discovery (pinned CA), write the bootstrap kubeconfig and
    /// the agent configuration, then `node up` unless --no-start.
    Join(join_cmd::Args),
    /// Serve /healthz and /readyz standalone until SIGINT/SIGTERM.
    Health(health_cmd::Args),
    /// Print the kubelet port derived from a node name.
    KubeletPort(tunnel_cmd::KubeletPortArgs),
    /// Print the tunnel client configuration that publishes this node's kubelet.
    TunnelConfig(tunnel_cmd::TunnelConfigArgs),
    /// Start, stop, reset, upgrade or inspect the node stack on this host.
    #[command(subcommand)]
    Node(node_cmd::Command),
}

fn main() -> ExitCode {
    cmdline::install_crypto_provider();
    let cli = Cli::parse();
    cli.log.init();
    cmdline::block_on(async move {
        match cli.command {
            Command::Run(args) => run_cmd::run(args).await,
            Command::Join(args) => join_cmd::run(args).await,
            Command::Health(args) => health_cmd::run(args).await,
            Command::KubeletPort(args) => tunnel_cmd::kubelet_port(args),
            Command::TunnelConfig(args) => tunnel_cmd::tunnel_config(args).await,
            Command::Node(cmd) => node_cmd::run(cmd).await,
        }
    })
}
