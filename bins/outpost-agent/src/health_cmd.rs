//! `outpost-agent health`: the probe listener, standalone.

use std::process::ExitCode;

/// Flags of `outpost-agent health`.
#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("outpost-agent health is not built yet")
}
