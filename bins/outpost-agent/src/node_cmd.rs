//! `outpost-agent node ...`: the node-stack lifecycle.

use std::process::ExitCode;

/// `outpost-agent node` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Resolve the goal state and run the start phases.
    Status,
}

pub async fn run(_cmd: Command) -> anyhow::Result<ExitCode> {
    anyhow::bail!("outpost-agent node is not built yet")
}
