//! `outpost-agent run --config F [--node-name NAME]`: the worker daemon (`agent::run`), until SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;

/// Flags of `outpost-agent run`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The agent configuration file (the one agent.yaml; see docs/examples/agent.yaml):
    /// `nodeName`, `kubeconfig`, `health`, `admin`, `dataPlane`, `tunnel`.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// This node's name, overriding the file's `nodeName`: one file for every node, as the
    /// DaemonSet in docs/deploy/outpost-agent.yaml passes `$(NODE_NAME)`.
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    // Installed first, so a signal during start-up is already a clean shutdown.
    let shutdown = cmdline::shutdown_token();
    let config = agent::AgentConfig::load_for_node(&args.config, args.node_name.as_deref())?;
    agent::run::run(config, agent::run::RunOptions::default(), shutdown).await?;
    Ok(ExitCode::SUCCESS)
}
