//! `stratum-server nodes ...`.

use std::process::ExitCode;

/// `stratum-server nodes` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Not built yet.
    Todo,
}

pub async fn run(_cmd: Command) -> anyhow::Result<ExitCode> {
    anyhow::bail!("stratum-server nodes is not built yet")
}
