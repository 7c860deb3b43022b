//! `outpost-agent join`: a worker join by token discovery (`agent::join`), then `node up`
//! unless `--no-start`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;

/// Flags of `outpost-agent join`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The API server, HOST:PORT (as `stratum-server token create` prints it).
    #[arg(long, value_name = "HOST:PORT")]
    pub server: String,
    /// The bootstrap token, ID.SECRET. Prefer the environment variable: a flag is visible
    /// to every user of this host in the process list while the join runs.
    #[arg(
        long,
        env = "OUTPOST_JOIN_TOKEN",
        hide_env_values = true,
        value_name = "ID.SECRET"
    )]
    pub token: String,
    /// The CA pin, sha256:HEX (the SHA-256 of the cluster CA's public key).
    #[arg(long, value_name = "sha256:HEX")]
    pub discovery_token_ca_cert_hash: String,
    /// The agent configuration template (the one agent.yaml); the join sets its `auth`
    /// block and writes it to /etc/outpost-agent/agent.yaml below --host-root.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// Prefix under which every host path is written. Unset: the real host.
    #[arg(long, value_name = "DIR")]
    pub host_root: Option<PathBuf>,
    /// Write the files but do not run `node up`.
    #[arg(long)]
    pub no_start: bool,
    /// How long to keep trying a server that does not answer, or a token the cluster has
    /// not signed cluster-info for yet.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = humantime::parse_duration)]
    pub discovery_timeout: Duration,
}

impl Args {
    fn request(&self) -> anyhow::Result<agent::join::JoinRequest> {
        let token = ha::tokens::BootstrapToken::parse(&self.token).context("--token")?;
        let pin = ha::discovery::CaPin::parse(&self.discovery_token_ca_cert_hash)
            .context("--discovery-token-ca-cert-hash")?;
        Ok(agent::join::JoinRequest {
            server: self.server.clone(),
            token,
            pin,
            config: self.config.clone(),
            host_root: self
                .host_root
                .clone()
                .map_or_else(hostnode::HostRoot::real, hostnode::HostRoot::new),
            timeouts: ha::discovery::DiscoveryTimeouts {
                total: self.discovery_timeout,
                request: Duration::from_secs(10),
            },
        })
    }
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let joined = agent::join::join(args.request()?).await?;
    println!(
        "joined {} as node {}: wrote {}, {} and {}",
        joined.api_server,
        joined.node_name,
        joined.ca_file.display(),
        joined.bootstrap_kubeconfig.display(),
        joined.config.display()
    );
    if args.no_start {
        println!(
            "not starting the node stack (--no-start); run `outpost-agent node up --config {}`",
            joined.config.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    crate::node_cmd::run(crate::node_cmd::Command::Up(crate::node_cmd::Args {
        config: joined.config,
        host_root: args.host_root,
        slot: String::new(),
        systemctl: std::env::var_os("OUTPOST_SYSTEMCTL").map(PathBuf::from),
        mountinfo: None,
        command_timeout_seconds: 120,
    }))
    .await
}
