//! `stratum-server etcd ...`.

use std::process::ExitCode;

/// `stratum-server etcd` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Not built yet.
    Todo,
}

pub async fn run(_cmd: Command) -> anyhow::Result<ExitCode> {
    anyhow::bail!("stratum-server etcd is not built yet")
}
