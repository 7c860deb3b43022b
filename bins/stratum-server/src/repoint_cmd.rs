//! `stratum-server repoint --vip IP`: move this node's kubeconfigs onto the cluster VIP
//! (`ha::repoint`), and optionally Cilium's API endpoint.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use ha::repoint::{self, RepointFailure, RepointRequest};

/// Flags of `stratum-server repoint`.
#[derive(Debug, clap::Args)]
pub struct RepointArgs {
    /// The cluster VIP. Nothing changes unless https://VIP:PORT serves this cluster's API
    /// with a certificate, issued by the cluster CA, that covers the VIP.
    #[arg(long)]
    pub vip: IpAddr,
    /// The API port on the VIP.
    #[arg(long, default_value_t = 6443)]
    pub port: u16,
    /// The PKI directory: the VIP's certificate must chain to its ca.crt.
    #[arg(long, default_value = pki::DEFAULT_PKI_DIR)]
    pub pki_dir: PathBuf,
    /// Where the node's kubeconfigs are (default: the parent of --pki-dir).
    #[arg(long)]
    pub kubeconfig_dir: Option<PathBuf>,
    /// The node's data directory: its node state records the new endpoint, so the next
    /// `stratum-server up` keeps it. Without it no state is recorded (a worker).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// A systemd unit restarted after the rewrite (repeatable). A unit that fails to
    /// restart is a warning, not a failure.
    #[arg(long = "restart", value_name = "UNIT", default_values_t = vec!["kubelet".to_string()])]
    pub restart: Vec<String>,
    /// Restart nothing.
    #[arg(long, conflicts_with = "restart")]
    pub no_restart: bool,
    /// How long each step of the VIP check may take.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Also patch Cilium's agent DaemonSet and operator Deployment (kube-system) to reach
    /// the API server at the VIP, through the repointed admin.conf.
    #[arg(long)]
    pub cilium: bool,
    /// How long to wait for Cilium's rollouts before reporting them unfinished.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub rollout_wait: Duration,
}

pub async fn run(args: RepointArgs) -> anyhow::Result<ExitCode> {
    let kubeconfig_dir = args
        .kubeconfig_dir
        .clone()
        .unwrap_or_else(|| pki::default_kubeconfig_dir(&args.pki_dir));
    let req = RepointRequest {
        vip: args.vip,
        port: args.port,
        ca_file: args.pki_dir.join("ca.crt"),
        kubeconfig_dir: kubeconfig_dir.clone(),
        data_dir: args.data_dir.clone(),
        restart: if args.no_restart {
            Vec::new()
        } else {
            args.restart.clone()
        },
        timeout: args.timeout,
    };
    let mut out = std::io::stdout();
    let report = match repoint::node_repoint(&mut out, &req, &repoint::Systemctl).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {}", ha::error_chain(&e));
            return Ok(match e {
                RepointFailure::VipDoesNotServe { .. } => ExitCode::from(3),
                _ => ExitCode::FAILURE,
            });
        }
    };
    // The restart warnings were printed as progress; Cilium's are printed below.
    let mut warnings = Vec::new();
    if args.cilium {
        let client = cmdline::kube_client(Some(&kubeconfig_dir.join("admin.conf"))).await?;
        let host = args.vip.to_string();
        match repoint::repoint_cilium_with(&mut out, &client, &host, args.port, args.rollout_wait)
            .await
        {
            Ok(c) => warnings.extend(c.warnings),
            Err(e) => {
                eprintln!(
                    "error: the kubeconfigs are repointed, but Cilium is not: {}",
                    ha::error_chain(&e)
                );
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    println!("repointed to {}", report.server);
    Ok(ExitCode::SUCCESS)
}
