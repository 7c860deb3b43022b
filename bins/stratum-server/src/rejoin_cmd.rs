//! `stratum-server rejoin --server SEED`: re-add this control plane's etcd to a cluster a
//! snapshot restore reset on the seed (`ha::rejoin`).

use std::path::PathBuf;
use std::process::ExitCode;

use ha::etcd::learner::Queueing;
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
}

pub async fn run(args: RejoinArgs) -> anyhow::Result<ExitCode> {
    let config = NodeConfig::load(args.config.as_deref())?;
    let cancel = cmdline::shutdown_token();
    let done = rejoin::rejoin_etcd(
        &RejoinOptions {
            data_dir: args.data_dir.clone(),
            server: args.server,
            force: args.force,
            config,
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
        "rejoined the cluster at {}{}; start this node with `stratum-server up --data-dir {} ...`",
        done.seed,
        done.member_id
            .map(|id| format!(" as member {id:x}"))
            .unwrap_or_default(),
        args.data_dir.display()
    );
    Ok(ExitCode::SUCCESS)
}
