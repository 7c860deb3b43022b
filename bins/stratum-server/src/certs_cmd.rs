//! `stratum-server certs ...`.

use std::process::ExitCode;

/// `stratum-server certs` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Not built yet.
    Todo,
}

pub async fn run(_cmd: Command) -> anyhow::Result<ExitCode> {
    anyhow::bail!("stratum-server certs is not built yet")
}
