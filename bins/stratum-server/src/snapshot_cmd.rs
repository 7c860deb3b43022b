//! `stratum-server snapshot save|restore`: an etcd snapshot over etcd's snapshot API, and
//! the seed node's restore from one (`ha::snapshot`).

use std::path::PathBuf;
use std::process::ExitCode;

use ha::etcd::EtcdOptions;
use ha::snapshot::{self, RestoreOptions};

/// `stratum-server snapshot` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Stream a snapshot of the etcd database from the first endpoint that serves one and
    /// write it to FILE (0600), which must not exist. `etcdctl snapshot status FILE` reads
    /// it.
    Save(SaveArgs),
    /// Reset this node's etcd to a new single-member cluster holding FILE's data (the
    /// seed of a restore; the other control planes then run `stratum-server rejoin`).
    /// Refuses while `stratum-server up` runs this node: stop it first.
    Restore(RestoreArgs),
}

/// `stratum-server snapshot save`.
#[derive(Debug, clap::Args)]
pub struct SaveArgs {
    /// etcd client URLs, comma-separated; the first that serves a snapshot is used.
    #[arg(
        long,
        value_delimiter = ',',
        required = true,
        env = "STRATUM_ETCD_ENDPOINTS"
    )]
    pub endpoints: Vec<String>,
    #[command(flatten)]
    pub tls: crate::etcd_cmd::TlsArgs,
    /// The snapshot file to write.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
}

/// `stratum-server snapshot restore`.
#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    /// This node's data directory (node state, etcd data), as given to `up`.
    #[arg(long, value_name = "D")]
    pub data_dir: PathBuf,
    /// The etcdctl (3.4) that restores the snapshot.
    #[arg(long, value_name = "PATH", default_value = "etcdctl")]
    pub etcdctl: PathBuf,
    /// The snapshot file.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
}

pub async fn run(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Save(args) => save(args).await,
        Command::Restore(args) => restore(args),
    }
}

async fn save(args: SaveArgs) -> anyhow::Result<ExitCode> {
    let endpoints = crate::etcd_cmd::clean_endpoints(&args.endpoints);
    let mut reported = 0u64;
    let saved = snapshot::save_snapshot(
        &EtcdOptions::with_tls(args.tls.tls()),
        &endpoints,
        &args.file,
        |endpoint, bytes| {
            // One line per 16 MiB received.
            if bytes >= reported + (16 << 20) {
                reported = bytes;
                eprintln!("received {bytes} bytes from {endpoint}");
            }
        },
    )
    .await?;
    println!(
        "snapshot saved to {} ({} bytes, from {})",
        saved.path.display(),
        saved.bytes,
        saved.endpoint
    );
    Ok(ExitCode::SUCCESS)
}

fn restore(args: RestoreArgs) -> anyhow::Result<ExitCode> {
    let restored = snapshot::restore_snapshot(
        &RestoreOptions {
            data_dir: args.data_dir,
            snapshot: args.file,
            etcdctl: args.etcdctl,
        },
        |line| println!("{line}"),
    )?;
    println!(
        "restored: member {} is a new single-member cluster at {}; start this node with \
         `stratum-server up`, then run `stratum-server rejoin --server {}` on every other \
         control plane",
        restored.member, restored.client_url, restored.client_url
    );
    Ok(ExitCode::SUCCESS)
}
