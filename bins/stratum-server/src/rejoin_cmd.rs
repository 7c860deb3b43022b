//! `stratum-server rejoin --server SEED`: re-add this control plane's etcd to a cluster a
//! snapshot restore reset on the seed (`ha::rejoin`).

use std::path::PathBuf;
use std::process::ExitCode;

use ha::etcd::learner::Queueing;
use ha::node::{self, RunOptions};
use ha::nodestate::NodeConfig;
use ha::rejoin::{self, RejoinOptions};

/// Flags of `stratum-server rejoin`.
#[derive(Debug, clap::Args)]
pub struct RejoinArgs {
    /// The seed's address: an IP or HOST (this node's etcd client port is assumed),
    /// HOST:PORT, or its etcd client URL.
    #[arg(long, value_name = "IP")]
    pub server: String,
    /// Wipe this node's etcd data even when the old cluster still has quorum.
    #[arg(long)]
    pub force: bool,
    /// This node's data directory, as given to `up`.
    #[arg(long, value_name = "D")]
    pub data_dir: PathBuf,
    /// Node config (YAML): etcd ports, binary and timeouts, as given to `up`.
    #[arg(long, value_name = "F")]
    pub config: Option<PathBuf>,
    /// Kubeconfig for the API writes once the node runs (its etcd endpoint record);
    /// default: admin.conf beside the node's PKI directory.
    #[arg(long, value_name = "K")]
    pub kubeconfig: Option<PathBuf>,
}

pub async fn run(args: RejoinArgs) -> anyhow::Result<ExitCode> {
    let config = NodeConfig::load(args.config.as_deref())?;
    let cancel = cmdline::shutdown_token();
    let (done, data_lock) = rejoin::rejoin_etcd(
        &RejoinOptions {
            data_dir: args.data_dir.clone(),
            server: args.server,
            force: args.force,
            config: config.clone(),
            queueing: Queueing::default(),
        },
        |line| println!("{line}"),
        &cancel,
    )
    .await?;
    if let Some(old) = &done.old_data {
        println!(
            "the old cluster's data is kept in {}: remove it once the cluster is whole",
            old.display()
        );
    }
    println!(
        "rejoined the cluster at {}{}; running this node as `stratum-server up` would (SIGTERM \
         stops it; `up` starts it again)",
        done.seed,
        done.member_id
            .map(|id| format!(" as member {id:x}"))
            .unwrap_or_default(),
    );
    // Run it now: a voter left stopped costs a two-member cluster its quorum.
    let kubeconfig = args
        .kubeconfig
        .unwrap_or_else(|| pki::default_kubeconfig_dir(&done.state.pki_dir).join("admin.conf"));
    node::run_node_holding(
        done.state,
        RunOptions {
            data_dir: args.data_dir,
            config,
            api_kubeconfig: Some(kubeconfig),
            first_join_start: false,
        },
        data_lock,
        &cancel,
    )
    .await?;
    Ok(ExitCode::SUCCESS)
}
