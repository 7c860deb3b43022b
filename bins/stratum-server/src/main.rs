//! `stratum-server`: the control-plane host daemon. It grows a control plane from one
//! controller to several (PKI, bootstrap tokens and encrypted cert grants, etcd membership
//! and health) and keeps Node addresses patched so the API server reaches kubelets through
//! their tunnels.
//!
//! Operations: `docs/stratum-server.md`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod certs_cmd;
mod etcd_cmd;
mod front_cmd;
mod join_cmd;
mod nodes_cmd;
mod operator_cmd;
mod rejoin_cmd;
mod repoint_cmd;
mod snapshot_cmd;
mod token_cmd;
mod up_cmd;

/// The control-plane host daemon.
#[derive(Debug, Parser)]
#[command(name = "stratum-server", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    log: cmdline::LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Node address reconciliation: run it, or print what it sees.
    #[command(subcommand)]
    Nodes(nodes_cmd::Command),
    /// Generate or check the cluster PKI.
    #[command(subcommand)]
    Certs(certs_cmd::Command),
    /// Bootstrap tokens and control-plane cert grants.
    #[command(subcommand)]
    Token(token_cmd::Command),
    /// etcd cluster health and membership.
    #[command(subcommand)]
    Etcd(etcd_cmd::Command),
    /// Bootstrap the first controller, or start this node from its state; supervise etcd
    /// until SIGTERM.
    Up(up_cmd::UpArgs),
    /// Join this node to a cluster as an additional control plane, then run it as `up`.
    Join(join_cmd::JoinArgs),
    /// Prune expired cert grants and report the certificate-key's age, on an interval.
    Operator(operator_cmd::OperatorArgs),
    /// Save an etcd snapshot, or restore one on the seed node.
    #[command(subcommand)]
    Snapshot(snapshot_cmd::Command),
    /// Re-add this control plane's etcd to a cluster restored on the seed.
    Rejoin(rejoin_cmd::RejoinArgs),
    /// The per-node HAProxy front of the API servers, and the kube-vip static pod.
    #[command(subcommand)]
    Front(front_cmd::Command),
    /// Move this node's kubeconfigs onto the cluster VIP, once it serves this cluster.
    Repoint(repoint_cmd::RepointArgs),
}

fn main() -> ExitCode {
    cmdline::install_crypto_provider();
    let cli = Cli::parse();
    cli.log.init();
    cmdline::block_on(async move {
        match cli.command {
            Command::Nodes(cmd) => nodes_cmd::run(cmd).await,
            Command::Certs(cmd) => certs_cmd::run(cmd).await,
            Command::Token(cmd) => token_cmd::run(cmd).await,
            Command::Etcd(cmd) => etcd_cmd::run(cmd).await,
            Command::Up(args) => up_cmd::run(args).await,
            Command::Join(args) => join_cmd::run(args).await,
            Command::Operator(args) => operator_cmd::run(args).await,
            Command::Snapshot(cmd) => snapshot_cmd::run(cmd).await,
            Command::Rejoin(args) => rejoin_cmd::run(args).await,
            Command::Front(cmd) => front_cmd::run(cmd).await,
            Command::Repoint(args) => repoint_cmd::run(args).await,
        }
    })
}
