//! `stratum-server join`: join this node to a cluster as an additional control plane
//! (`ha::join`), then run it as `up` unless `--no-start`.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use ha::discovery::{CaPin, DiscoveryTimeouts};
use ha::etcd::learner::Queueing;
use ha::grants::CertKey;
use ha::join::{self, JoinOptions};
use ha::node::{self, RunOptions};
use ha::nodestate::NodeConfig;
use ha::tokens::BootstrapToken;

use crate::up_cmd::kubeconfig_dir;

/// Exit code when a signal stopped the join after its state was persisted: the member is
/// added but not started; `stratum-server up` starts it.
pub const EXIT_NOT_STARTED: u8 = 3;

/// Flags of `stratum-server join`. Debug redacts the token secret and the key.
#[derive(clap::Args)]
pub struct JoinArgs {
    /// The API server to discover, HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    pub server: String,
    /// The bootstrap token `token create` printed (also $STRATUM_JOIN_TOKEN).
    #[arg(
        long,
        value_name = "T",
        env = "STRATUM_JOIN_TOKEN",
        hide_env_values = true
    )]
    pub token: String,
    /// The CA pin, sha256:<hex> of the CA's public key.
    #[arg(long = "discovery-token-ca-cert-hash", value_name = "sha256:H")]
    pub ca_cert_hash: String,
    /// Accepted for the command `token create --control-plane` prints; this command always
    /// joins a control plane.
    #[arg(long)]
    pub control_plane: bool,
    /// The certificate-key (64 hex digits). Argv is visible to every user of the host:
    /// prefer --certificate-key-file or $STRATUM_CERTIFICATE_KEY.
    #[arg(
        long,
        value_name = "K",
        env = "STRATUM_CERTIFICATE_KEY",
        hide_env_values = true,
        conflicts_with = "certificate_key_file"
    )]
    pub certificate_key: Option<String>,
    /// A file holding the certificate-key.
    #[arg(long, value_name = "FILE")]
    pub certificate_key_file: Option<PathBuf>,
    /// This node's name: the etcd member name and a certificate SAN.
    #[arg(long, value_name = "N")]
    pub node_name: String,
    /// This node's address.
    #[arg(long, value_name = "IP")]
    pub node_ip: IpAddr,
    /// Node state, the join journal, etcd's data and the component logs.
    #[arg(long, value_name = "D")]
    pub data_dir: PathBuf,
    /// Stop once the member is added and the state persisted; `stratum-server up` starts it.
    #[arg(long)]
    pub no_start: bool,
    /// The PKI directory; kubeconfigs go to its parent.
    #[arg(long, value_name = "P", default_value = pki::DEFAULT_PKI_DIR)]
    pub pki_dir: PathBuf,
    /// Kubeconfig for the API writes after the join (endpoint record, Event); default:
    /// the admin.conf the join writes.
    #[arg(long, value_name = "K")]
    pub kubeconfig: Option<PathBuf>,
    /// Node config (YAML): etcd ports, binary and timeouts.
    #[arg(long, value_name = "F")]
    pub config: Option<PathBuf>,
}

impl std::fmt::Debug for JoinArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let token_id = self.token.split('.').next().unwrap_or("");
        f.debug_struct("JoinArgs")
            .field("server", &self.server)
            .field("token", &format_args!("{token_id}.<redacted>"))
            .field("ca_cert_hash", &self.ca_cert_hash)
            .field(
                "certificate_key",
                &self.certificate_key.as_ref().map(|_| "<redacted>"),
            )
            .field("certificate_key_file", &self.certificate_key_file)
            .field("node_name", &self.node_name)
            .field("node_ip", &self.node_ip)
            .field("data_dir", &self.data_dir)
            .field("no_start", &self.no_start)
            .finish_non_exhaustive()
    }
}

fn cert_key(args: &JoinArgs) -> anyhow::Result<CertKey> {
    let text = match (&args.certificate_key, &args.certificate_key_file) {
        (Some(k), _) => k.clone(),
        (None, Some(path)) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the certificate-key file {}", path.display()))?,
        (None, None) => anyhow::bail!(
            "no certificate-key: pass --certificate-key-file FILE, set $STRATUM_CERTIFICATE_KEY, \
             or --certificate-key K (visible to every user of this host)"
        ),
    };
    CertKey::from_hex(&text).context(
        "the certificate-key is not the 64 hex digits `token create --control-plane` printed",
    )
}

pub async fn run(args: JoinArgs) -> anyhow::Result<ExitCode> {
    let config = NodeConfig::load(args.config.as_deref())?;
    let token = BootstrapToken::parse(&args.token)?;
    let ca_pin = CaPin::parse(&args.ca_cert_hash)?;
    let cert_key = cert_key(&args)?;
    let kubeconfig_dir = kubeconfig_dir(&args.pki_dir);
    let opts = JoinOptions {
        server: args.server.clone(),
        token,
        ca_pin,
        cert_key,
        node_name: args.node_name.clone(),
        node_ip: args.node_ip,
        data_dir: args.data_dir.clone(),
        pki_dir: args.pki_dir.clone(),
        kubeconfig_dir: kubeconfig_dir.clone(),
        config: config.clone(),
        discovery: DiscoveryTimeouts {
            total: config.discovery_timeout,
            ..DiscoveryTimeouts::default()
        },
        queueing: Queueing::default(),
    };
    let shutdown = cmdline::shutdown_token();
    let state = join::prepare_control_plane_join(&opts, &shutdown).await?;
    let up_hint = format!(
        "stratum-server up --node-name {} --node-ip {} --data-dir {} --pki-dir {}",
        args.node_name,
        args.node_ip,
        args.data_dir.display(),
        args.pki_dir.display()
    );
    if shutdown.is_cancelled() {
        eprintln!(
            "interrupted during the member add; the member is added as a learner and the node \
             state is persisted. Start it with: {up_hint}"
        );
        return Ok(ExitCode::from(EXIT_NOT_STARTED));
    }
    if args.no_start {
        println!(
            "etcd member {} added as a learner; start it with: {up_hint}",
            args.node_name
        );
        return Ok(ExitCode::SUCCESS);
    }
    node::run_node(
        state,
        RunOptions {
            data_dir: args.data_dir,
            config,
            api_kubeconfig: Some(
                args.kubeconfig
                    .unwrap_or_else(|| kubeconfig_dir.join("admin.conf")),
            ),
            first_join_start: true,
        },
        &shutdown,
    )
    .await?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        join: JoinArgs,
    }

    const TOKEN: &str = "abcdef.0123456789abcdef";

    fn parse(extra: &[&str]) -> JoinArgs {
        let mut argv = vec![
            "join",
            "--server",
            "10.0.0.1:6443",
            "--token",
            TOKEN,
            "--discovery-token-ca-cert-hash",
            "sha256:00",
            "--node-name",
            "cp2",
            "--node-ip",
            "10.0.0.2",
            "--data-dir",
            "/var/lib/stratum",
        ];
        argv.extend_from_slice(extra);
        Cli::try_parse_from(argv).unwrap().join
    }

    #[test]
    fn the_certificate_key_comes_from_a_file_and_debug_hides_secrets() {
        let key = CertKey::generate().to_hex();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("key");
        std::fs::write(&file, format!("{key}\n")).unwrap();
        let args = parse(&["--certificate-key-file", file.to_str().unwrap()]);
        assert_eq!(cert_key(&args).unwrap().to_hex(), key);
        let args = parse(&["--certificate-key", &key]);
        let debug = format!("{args:?}");
        assert!(
            !debug.contains(&key) && !debug.contains("0123456789abcdef"),
            "{debug}"
        );
        assert!(debug.contains("abcdef.<redacted>"), "{debug}");
    }

    #[test]
    fn no_certificate_key_says_where_to_put_it() {
        let err = cert_key(&parse(&[])).unwrap_err().to_string();
        assert!(err.contains("--certificate-key-file"), "{err}");
    }
}
