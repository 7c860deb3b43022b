//! `stratum-server up`: bootstrap the first controller, or start this node from its state,
//! and supervise etcd until SIGTERM (`ha::node`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ha::node::{self, UpOptions};
use ha::nodestate::NodeConfig;

/// Flags of `stratum-server up`.
#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// This node's name: the etcd member name and a certificate SAN.
    #[arg(long, value_name = "N")]
    pub node_name: String,
    /// This node's address: etcd listens and advertises here.
    #[arg(long, value_name = "IP")]
    pub node_ip: IpAddr,
    /// Node state, the join journal, etcd's data and the component logs.
    #[arg(long, value_name = "D")]
    pub data_dir: PathBuf,
    /// The PKI directory; kubeconfigs go to its parent.
    #[arg(long, value_name = "P", default_value = pki::DEFAULT_PKI_DIR)]
    pub pki_dir: PathBuf,
    /// Kubeconfig for the API writes (cluster-info, RBAC, Events); default: admin.conf
    /// beside the PKI directory.
    #[arg(long, value_name = "K")]
    pub kubeconfig: Option<PathBuf>,
    /// Node config (YAML): etcd ports, binary and timeouts, extra components.
    #[arg(long, value_name = "F")]
    pub config: Option<PathBuf>,
}

/// The kubeconfig directory of a PKI directory (kubeadm's layout: its parent).
pub fn kubeconfig_dir(pki_dir: &Path) -> PathBuf {
    pki::default_kubeconfig_dir(pki_dir)
}

pub async fn run(args: UpArgs) -> anyhow::Result<ExitCode> {
    let config = NodeConfig::load(args.config.as_deref())?;
    let opts = UpOptions {
        node_name: args.node_name,
        node_ip: args.node_ip,
        kubeconfig_dir: kubeconfig_dir(&args.pki_dir),
        data_dir: args.data_dir,
        pki_dir: args.pki_dir,
        kubeconfig: args.kubeconfig,
        config,
    };
    let shutdown = cmdline::shutdown_token();
    node::up(&opts, &shutdown).await?;
    Ok(ExitCode::SUCCESS)
}
