//! `stratum-server token ...`: mint bootstrap tokens and, for a control-plane join, publish
//! the shared certs as that token's encrypted grant.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use ha::bootstrap::ServerPolicy;
use ha::grants::{self, CertKey, UploadProfile};
use ha::mint::{self, Discovery, GrantRequest, MintRequest, Minted};
use ha::tokens::MintedToken;

/// `stratum-server token` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Mint a bootstrap token and print the join command (with --control-plane, also
    /// publish the shared certs for it and print the certificate-key).
    Create(CreateArgs),
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Text for a person.
    Text,
    /// One JSON object, for scripts.
    Json,
}

/// `stratum-server token create`: also ensures `kube-public/cluster-info` (the server
/// joiners dial and the CA) and its anonymous reader, which token discovery needs.
#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    /// Mint a control-plane token: it may read the shared-cert grant, which this command
    /// publishes under a fresh certificate-key.
    #[arg(long)]
    pub control_plane: bool,
    /// How long the token (and a control-plane token's grant) lives: e.g. 2h, 30m, 1h30m.
    /// A control-plane token lives at most 24h unless --allow-long-ttl is given.
    #[arg(long, default_value = "2h", value_parser = ha::tokens::parse_ttl)]
    pub ttl: std::time::Duration,
    /// Let a control-plane token (whose grant decrypts the CA keys) live longer than 24h.
    #[arg(long)]
    pub allow_long_ttl: bool,
    /// Kubeconfig with admin rights (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The PKI directory holding ca.crt (for the CA hash pin) and the shared material.
    #[arg(long, default_value = pki::DEFAULT_PKI_DIR)]
    pub pki_dir: PathBuf,
    /// The API server address joiners dial, HOST:PORT (default: the kubeconfig's server).
    #[arg(long)]
    pub server: Option<String>,
    /// A description stored on the token Secret.
    #[arg(long)]
    pub description: Option<String>,
    /// The cluster VIP to record in a control-plane grant.
    #[arg(long)]
    pub vip: Option<String>,
    /// An etcd client endpoint to record in a control-plane grant (repeatable).
    #[arg(long = "etcd-endpoint")]
    pub etcd_endpoints: Vec<String>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

pub async fn run(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Create(args) => create(args).await,
    }
}

async fn create(args: CreateArgs) -> anyhow::Result<ExitCode> {
    let ca_path = args.pki_dir.join("ca.crt");
    let ca_pem = std::fs::read(&ca_path).with_context(|| {
        format!(
            "cannot read the cluster CA {} (run on a control plane, or pass --pki-dir)",
            ca_path.display()
        )
    })?;
    let ca_hash = pki::ca_cert_hash(&ca_pem)
        .with_context(|| format!("cannot compute the CA hash pin of {}", ca_path.display()))?;
    let grant = if args.control_plane {
        Some(GrantRequest {
            files: grants::read_bundle_files(&args.pki_dir)?,
            profile: UploadProfile {
                vip: args.vip.clone(),
                etcd_endpoints: args.etcd_endpoints.clone(),
            },
        })
    } else {
        None
    };
    let mut req = MintRequest {
        discovery: Discovery {
            server: String::new(),
            ca_pem,
            // A named --server is what joiners dial: publish it. Without one, the
            // kubeconfig's server only fills a missing cluster-info.
            policy: if args.server.is_some() {
                ServerPolicy::Replace
            } else {
                ServerPolicy::KeepPublished
            },
        },
        ttl: args.ttl,
        allow_long_ttl: args.allow_long_ttl,
        description: args.description.as_deref(),
        grant,
    };
    // Everything that can be refused locally is refused before the API is asked.
    req.expiration(jiff::Timestamp::now())?;

    let config = match &args.kubeconfig {
        Some(path) => load_kubeconfig(path).await?,
        None => kube::Config::infer()
            .await
            .context("cannot find a kubeconfig: pass --kubeconfig or set KUBECONFIG")?,
    };
    let server = match &args.server {
        Some(server) => server.clone(),
        None => default_server(&config)?,
    };
    // cluster-info names the address the join command tells joiners to dial.
    req.discovery.server = ha::discovery::server_url(&server)?;
    let client = kube::Client::try_from(config).context("cannot build an API client")?;
    let Minted {
        token: minted,
        cert_key,
        ..
    } = mint::mint(&client, &req, jiff::Timestamp::now()).await?;

    let join = join_command(&server, &minted, &ca_hash, cert_key.as_ref());
    if cert_key.is_some() {
        eprintln!(
            "WARNING: the certificate-key decrypts this cluster's CA private keys. Treat it like \
             a private key: hand it to the joining control plane over a channel you trust and \
             never paste it into tickets or chat. It stops working when the token expires ({}) \
             or when the shared certs are re-keyed.",
            expiration(&minted)
        );
    }
    match args.output {
        Output::Json => {
            let mut out = serde_json::json!({
                "token": minted.token.to_string(),
                "tokenId": minted.token.id(),
                "expiration": expiration(&minted),
                "controlPlane": args.control_plane,
                "server": server,
                "caCertHash": ca_hash,
                "joinCommand": join,
            });
            if let Some(key) = &cert_key {
                out["certificateKey"] = serde_json::Value::String(key.to_hex());
            }
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        Output::Text => {
            let what = if args.control_plane {
                "control plane"
            } else {
                "worker"
            };
            println!(
                "Bootstrap token {} ({what}) expires at {}.",
                minted.token.id(),
                expiration(&minted)
            );
            if let Some(key) = &cert_key {
                println!("Certificate-key: {}", key.to_hex());
            }
            println!("Join a {what} with:\n\n  {join}\n");
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn load_kubeconfig(path: &Path) -> anyhow::Result<kube::Config> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
        .await
        .with_context(|| format!("cannot use kubeconfig {}", path.display()))
}

/// HOST:PORT of the kubeconfig's API server URL, the port defaulted from the scheme.
fn default_server(config: &kube::Config) -> anyhow::Result<String> {
    let url = &config.cluster_url;
    let host = url
        .host()
        .with_context(|| format!("the kubeconfig's server {url} has no host: pass --server"))?;
    let port = url
        .port_u16()
        .unwrap_or(if url.scheme_str() == Some("http") {
            80
        } else {
            443
        });
    Ok(if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    })
}

fn expiration(minted: &MintedToken) -> String {
    minted.expiration.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn join_command(
    server: &str,
    minted: &MintedToken,
    ca_hash: &str,
    cert_key: Option<&CertKey>,
) -> String {
    match cert_key {
        Some(key) => format!(
            "stratum-server join --server {server} --token {} --discovery-token-ca-cert-hash \
             {ca_hash} --control-plane --certificate-key {}",
            minted.token,
            key.to_hex()
        ),
        None => format!(
            "outpost-agent join --server {server} --token {} --discovery-token-ca-cert-hash \
             {ca_hash} --config agent.yaml",
            minted.token
        ),
    }
}
