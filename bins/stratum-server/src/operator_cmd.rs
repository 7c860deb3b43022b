//! `stratum-server operator`: prune expired grants and report the certificate-key's age on
//! an interval (`ha::operator`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;

/// Flags of `stratum-server operator`.
#[derive(Debug, clap::Args)]
pub struct OperatorArgs {
    /// kubeconfig file. Without it: $KUBECONFIG, then ~/.kube/config, then in-cluster.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Time between passes (e.g. 1m, 30s).
    #[arg(long, default_value = "1m", value_parser = parse_duration, value_name = "DURATION")]
    pub interval: Duration,
    /// Run one pass, print its report as JSON, and exit.
    #[arg(long)]
    pub once: bool,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e}: write a duration such as 30s or 1m"))
}

async fn client(path: Option<&PathBuf>) -> anyhow::Result<kube::Client> {
    let config = match path {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p)
                .with_context(|| format!("cannot read kubeconfig {}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("cannot use kubeconfig {}", p.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("cannot find a kubeconfig: pass --kubeconfig or set KUBECONFIG")?,
    };
    kube::Client::try_from(config).context("cannot build an API client")
}

pub async fn run(args: OperatorArgs) -> anyhow::Result<ExitCode> {
    let client = client(args.kubeconfig.as_ref()).await?;
    if args.once {
        let report = ha::operator::pass(&client, chrono::Utc::now()).await?;
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(ExitCode::SUCCESS);
    }
    let shutdown = cmdline::shutdown_token();
    loop {
        match ha::operator::pass(&client, chrono::Utc::now()).await {
            Ok(r) => {
                tracing::info!(pruned = ?r.pruned, key_age_seconds = ?r.key_age_seconds, "operator pass")
            }
            Err(e) => tracing::warn!("operator pass failed: {e:#}"),
        }
        tokio::select! {
            _ = tokio::time::sleep(args.interval) => {}
            _ = shutdown.cancelled() => return Ok(ExitCode::SUCCESS),
        }
    }
}
