//! `outpost-agent run --config F`: the worker daemon (`agent::run`), until SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;

/// Flags of `outpost-agent run`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The agent configuration file (the one agent.yaml; see docs/examples/agent.yaml):
    /// `nodeName`, `kubeconfig`, `health`, `admin`, `dataPlane`, `tunnel`.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    // Installed first, so a signal during start-up is already a clean shutdown.
    let shutdown = cmdline::shutdown_token();
    let config = agent::AgentConfig::load(&args.config)?;
    agent::run::run(config, agent::run::RunOptions::default(), shutdown).await?;
    Ok(ExitCode::SUCCESS)
}
