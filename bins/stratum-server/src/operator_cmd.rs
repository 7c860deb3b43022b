//! `stratum-server operator`: prune expired grants and report the certificate-key's age on
//! an interval while holding the Lease `kube-system/stratum-operator` (`ha::operator`,
//! `daemon::lease`); `/metrics` and `/status` on the admin listener.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Flags of `stratum-server operator`.
#[derive(Debug, clap::Args)]
pub struct OperatorArgs {
    /// kubeconfig file. Without it: $KUBECONFIG, then ~/.kube/config, then in-cluster.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Time between passes (e.g. 1m, 30s).
    #[arg(long, default_value = "1m", value_parser = cmdline::parse_interval, value_name = "DURATION")]
    pub interval: Duration,
    /// Run one pass, print its report as JSON, and exit (no election).
    #[arg(long)]
    pub once: bool,
    /// The admin listener: /metrics and /status.
    #[arg(long, default_value = "127.0.0.1:9105", value_name = "ADDR")]
    pub admin_listen: String,
    /// This replica's identity in the Lease (default: host name and process ID).
    #[arg(long, value_name = "ID")]
    pub identity: Option<String>,
}

pub async fn run(args: OperatorArgs) -> anyhow::Result<ExitCode> {
    let client = cmdline::kube_client(args.kubeconfig.as_deref()).await?;
    if args.once {
        let report = ha::operator::pass(&client, jiff::Timestamp::now()).await?;
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    let opts = ha::operator::ServeOptions {
        admin_listen: args.admin_listen,
        identity: args.identity.unwrap_or_else(daemon::default_identity),
        interval: args.interval,
    };
    ha::operator::serve(&client, opts, &cmdline::shutdown_token()).await?;
    Ok(ExitCode::SUCCESS)
}
