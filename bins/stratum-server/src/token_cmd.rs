//! `stratum-server token ...`.

use std::process::ExitCode;

/// `stratum-server token` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Not built yet.
    Todo,
}

pub async fn run(_cmd: Command) -> anyhow::Result<ExitCode> {
    anyhow::bail!("stratum-server token is not built yet")
}
