//! `nebula-manager`: the in-cluster manager. It runs one virtual kubelet per provider
//! (`vnode`) and placement.
//!
//! Operations: `docs/nebula-manager.md`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use vnode::manager::{
    self, CRASH_ENV, DEFAULT_ADMIN_LISTEN, DEFAULT_HEALTH_LISTEN, DEFAULT_KUBELET_LISTEN,
    ManagerConfig, ProviderSpec,
};

/// The in-cluster manager.
#[derive(Debug, Parser)]
#[command(name = "nebula-manager", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    log: cmdline::LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Register one virtual node per provider and turn their pods into instances.
    Run(RunArgs),
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Kubeconfig to use; else $KUBECONFIG, the in-cluster service account, ~/.kube/config.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// A provider: `process` or `process:NAME` (node `nebula-NAME`). Repeat for several.
    #[arg(long = "provider", required = true)]
    providers: Vec<ProviderSpec>,
    /// Directory for the process provider's per-pod directories (logs, working dirs,
    /// instance records); keep it across restarts so instances are found again.
    #[arg(long)]
    state_dir: PathBuf,
    /// Kubelet API address (logs and exec of the virtual nodes' pods); its port is
    /// advertised as the nodes' daemon endpoint.
    #[arg(long, default_value = DEFAULT_KUBELET_LISTEN)]
    kubelet_listen: SocketAddr,
    /// PEM bundle the kubelet API requires client certificates from (the CA that signs
    /// the API server's kubelet client certificate). Without it anything that reaches
    /// the kubelet port can read logs and run commands in the pods.
    #[arg(long)]
    kubelet_client_ca: Option<PathBuf>,
    /// Ask the API server (SubjectAccessReview on nodes/proxy) before serving each
    /// kubelet API request, so exec cannot bypass RBAC. Needs --kubelet-client-ca.
    #[arg(long)]
    kubelet_authorization_webhook: bool,
    /// Admin listener: /metrics.
    #[arg(long, default_value = DEFAULT_ADMIN_LISTEN)]
    admin_listen: SocketAddr,
    /// Probe listener: /healthz and /readyz.
    #[arg(long, default_value = DEFAULT_HEALTH_LISTEN)]
    health_listen: SocketAddr,
    /// Run each provider only while holding its Lease, so replicas can stand by.
    #[arg(long)]
    leader_elect: bool,
}

fn main() -> ExitCode {
    cmdline::install_crypto_provider();
    let cli = Cli::parse();
    cli.log.init();
    match cli.command {
        Command::Run(args) => cmdline::block_on(run(args)),
    }
}

async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let crash_at = match std::env::var(CRASH_ENV) {
        Ok(v) => Some(vnode::CrashPoint::parse(&v).with_context(|| {
            format!("{CRASH_ENV}={v:?} names no crash point; unset it (it is for tests)")
        })?),
        Err(_) => None,
    };
    let client = cmdline::kube_client(args.kubeconfig.as_deref()).await?;
    let cfg = ManagerConfig {
        providers: args.providers,
        state_dir: args.state_dir,
        kubelet_listen: args.kubelet_listen,
        kubelet_client_ca: args.kubelet_client_ca,
        kubelet_webhook_authorization: args.kubelet_authorization_webhook,
        health_listen: args.health_listen,
        admin_listen: args.admin_listen,
        pod_ip: std::env::var("POD_IP").ok().filter(|s| !s.is_empty()),
        leader_elect: args.leader_elect,
        identity: daemon::default_identity(),
        lease_timings: None,
        crash_at,
    };
    manager::run(client, cfg, cmdline::shutdown_token()).await?;
    Ok(ExitCode::SUCCESS)
}
