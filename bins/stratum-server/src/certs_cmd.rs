//! `stratum-server certs ...`: create the cluster PKI and report its expiry.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

/// `stratum-server certs` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Create the shared control-plane material (CAs, service-account key pair), this
    /// node's leaf certificates and the admin, controller-manager and scheduler
    /// kubeconfigs. Refuses to replace any existing key unless --force is given.
    Generate(GenerateArgs),
    /// Report every certificate's expiry (and the shared certificate-key's age); exits
    /// non-zero when any certificate expires within --warn-within or cannot be read.
    Check(CheckArgs),
    /// Seal the shared certs under a fresh certificate-key and retire every earlier one
    /// (every pending control-plane join command stops working: mint new ones), under the
    /// node maintenance lock and the cluster's maintenance fence.
    Rekey(RekeyArgs),
}

/// `stratum-server certs rekey`.
#[derive(Debug, clap::Args)]
pub struct RekeyArgs {
    /// The PKI directory holding the shared files.
    #[arg(long, default_value = pki::DEFAULT_PKI_DIR)]
    pub pki_dir: PathBuf,
    /// An admin kubeconfig (default: $KUBECONFIG, then in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// This node's data directory: where the node maintenance lock lives.
    #[arg(long, value_name = "D", default_value = "/var/lib/stratum")]
    pub data_dir: PathBuf,
    /// Write the new certificate-key to this file (0600; it must not exist) instead of
    /// printing it.
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// The fence holder's identity (default: host name and pid).
    #[arg(long)]
    pub identity: Option<String>,
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// A table for a person.
    Table,
    /// One JSON object, for scripts.
    Json,
}

/// `stratum-server certs generate`.
#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// The PKI directory (kubeadm's layout: ca.crt, etcd/ca.crt, ...).
    #[arg(long, default_value = pki::DEFAULT_PKI_DIR)]
    pub pki_dir: PathBuf,
    /// The cluster VIP: an extra apiserver SAN, and the kubeconfigs' server.
    #[arg(long)]
    pub vip: Option<IpAddr>,
    /// This node's name (default: the host name).
    #[arg(long)]
    pub node_name: Option<String>,
    /// This node's address: an apiserver and etcd SAN.
    #[arg(long)]
    pub node_ip: Option<IpAddr>,
    /// The `kubernetes` Service's cluster IP (first address of the service range).
    #[arg(long, default_value = "10.43.0.1")]
    pub service_ip: IpAddr,
    /// More apiserver SANs, DNS names or IPs (repeatable).
    #[arg(long = "apiserver-san")]
    pub apiserver_sans: Vec<String>,
    /// Only issue this node's leaves and kubeconfigs from the CAs already in --pki-dir
    /// (a joining control plane, after it downloaded the shared certs).
    #[arg(long)]
    pub leaves_only: bool,
    /// Where the kubeconfigs go (default: the parent of --pki-dir, /etc/kubernetes).
    #[arg(long)]
    pub kubeconfig_dir: Option<PathBuf>,
    /// The API server URL the kubeconfigs point at (default: https://<vip, else node IP,
    /// else 127.0.0.1>:6443).
    #[arg(long)]
    pub server: Option<String>,
    /// Replace existing keys and certificates. Anything issued from a replaced CA stops
    /// verifying: every node must get the new material.
    #[arg(long)]
    pub force: bool,
}

/// `stratum-server certs check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// The PKI directory.
    #[arg(long, default_value = pki::DEFAULT_PKI_DIR)]
    pub pki_dir: PathBuf,
    /// Fail when a certificate expires within this long (e.g. 30d, 12h).
    #[arg(long, default_value = "30d", value_parser = humantime::parse_duration)]
    pub warn_within: Duration,
    /// An admin kubeconfig: also report when the shared certificate-key (the grant
    /// Secret's) was last set. Without it the key's age is not checked.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Fail when the shared certificate-key is older than this (default: report only).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub key_max_age: Option<Duration>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

pub async fn run(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Generate(args) => generate(args),
        Command::Check(args) => check(args).await,
        Command::Rekey(args) => rekey(args).await,
    }
}

async fn rekey(args: RekeyArgs) -> anyhow::Result<ExitCode> {
    if let Some(file) = &args.key_file {
        ha::rekey::key_file_free(file)?;
    }
    let client = cmdline::kube_client(args.kubeconfig.as_deref()).await?;
    let done = ha::rekey::rekey_certs(
        &client,
        &ha::rekey::RekeyOptions {
            pki_dir: args.pki_dir,
            state_dir: args.data_dir,
            identity: args
                .identity
                .unwrap_or_else(daemon::lease::default_identity),
        },
        |line| eprintln!("{line}"),
    )
    .await?;
    match &args.key_file {
        Some(file) => {
            ha::rekey::save_key(file, &done.key)?;
            println!("certificate-key written to {}", file.display());
        }
        None => {
            eprintln!(
                "warning: the certificate-key decrypts the CA private keys; keep it like one"
            );
            println!("certificate-key: {}", done.key.to_hex());
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn generate(args: GenerateArgs) -> anyhow::Result<ExitCode> {
    let node_name = match args.node_name.clone() {
        Some(n) => n,
        None => pki::NodeIdentity::host_name().map_err(anyhow::Error::msg)?,
    };
    let mut node = pki::NodeIdentity::new(node_name);
    node.node_ip = args.node_ip;
    node.vip = args.vip;
    node.service_ip = args.service_ip;
    node.extra_sans = args.apiserver_sans.clone();
    let mut req = pki::PkiRequest::new(&args.pki_dir, node);
    if let Some(dir) = args.kubeconfig_dir {
        req.kubeconfig_dir = dir;
    }
    if let Some(server) = args.server {
        req.server = server;
    }
    req.leaves_only = args.leaves_only;
    req.overwrite = args.force;
    // Refused before anything is written (pki::plan_pki).
    let plan = pki::plan_pki(&req)?;
    let pin = plan.ca_cert_hash()?;
    for path in plan.apply()? {
        println!("wrote {}", path.display());
    }
    println!("CA hash pin: {pin}");
    Ok(ExitCode::SUCCESS)
}

async fn check(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let now = SystemTime::now();
    let report = pki::check(&args.pki_dir, now)?;
    let key = ha::operator::certificate_key_age(
        args.kubeconfig.as_deref(),
        jiff::Timestamp::try_from(now)?,
    )
    .await;
    let attention = report.attention(args.warn_within);
    let key_failed = key.fails(args.key_max_age);
    let ok = attention.is_empty() && !key_failed && !report.certs.is_empty();

    match args.output {
        Output::Json => {
            let out = serde_json::json!({
                "pki_dir": args.pki_dir,
                "warn_within_secs": args.warn_within.as_secs(),
                "certificates": report.certs,
                "certificate_key": key,
                "ok": ok,
            });
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        Output::Table => {
            println!(
                "{:<44} {:<32} {:>9}  STATUS",
                "CERTIFICATE", "EXPIRES", "LEFT"
            );
            for c in &report.certs {
                let rel = c.path.strip_prefix(&args.pki_dir).unwrap_or(&c.path);
                let status = c.verdict(args.warn_within);
                println!(
                    "{:<44} {:<32} {:>9}  {status}",
                    rel.display(),
                    c.not_after,
                    c.remaining_secs
                        .map(pki::short_duration)
                        .unwrap_or_default()
                );
            }
            println!(
                "\ncertificate-key: {key}{}",
                if key_failed {
                    "  TOO OLD: rotate it"
                } else {
                    ""
                }
            );
        }
    }
    if report.certs.is_empty() {
        eprintln!(
            "no certificates found under {}: wrong --pki-dir?",
            args.pki_dir.display()
        );
    }
    for c in &attention {
        match &c.error {
            Some(e) => eprintln!("{}: unreadable: {e}", c.path.display()),
            None => eprintln!(
                "{}: expires {} (within {})",
                c.path.display(),
                c.not_after,
                humantime::format_duration(args.warn_within)
            ),
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn gen_args(dir: &Path) -> GenerateArgs {
        GenerateArgs {
            pki_dir: dir.join("pki"),
            vip: Some("10.2.0.100".parse().unwrap()),
            node_name: Some("cp-1".into()),
            node_ip: Some("10.2.0.1".parse().unwrap()),
            service_ip: "10.43.0.1".parse().unwrap(),
            apiserver_sans: vec![],
            leaves_only: false,
            kubeconfig_dir: None,
            server: None,
            force: false,
        }
    }

    fn check_args(dir: &Path, warn_within: Duration) -> CheckArgs {
        CheckArgs {
            pki_dir: dir.join("pki"),
            warn_within,
            kubeconfig: None,
            key_max_age: None,
            output: Output::Json,
        }
    }

    #[tokio::test]
    async fn generate_refuses_then_leaves_only_and_check_thresholds() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(generate(gen_args(dir.path())).unwrap(), ExitCode::SUCCESS);
        assert!(
            dir.path().join("admin.conf").exists(),
            "kubeconfigs beside the pki dir"
        );

        let err = generate(gen_args(dir.path())).unwrap_err().to_string();
        assert!(
            err.contains("pki/ca.key") && err.contains("--force"),
            "{err}"
        );

        // Leaves only still refuses existing leaf keys, and names them.
        let mut leaves = gen_args(dir.path());
        leaves.leaves_only = true;
        let err = generate(leaves).unwrap_err().to_string();
        assert!(
            err.contains("apiserver") && !err.contains("--leaves-only"),
            "{err}"
        );

        // Re-issuing leaves with --force keeps the shared CA.
        let ca_before = std::fs::read(dir.path().join("pki/ca.key")).unwrap();
        let mut leaves = gen_args(dir.path());
        leaves.leaves_only = true;
        leaves.force = true;
        assert_eq!(generate(leaves).unwrap(), ExitCode::SUCCESS);
        assert_eq!(
            std::fs::read(dir.path().join("pki/ca.key")).unwrap(),
            ca_before
        );

        let day = Duration::from_secs(24 * 3600);
        let ok = check(check_args(dir.path(), 30 * day)).await.unwrap();
        assert_eq!(ok, ExitCode::SUCCESS);
        // Leaves live a year: a 400-day threshold flags them.
        let flagged = check(check_args(dir.path(), 400 * day)).await.unwrap();
        assert_eq!(flagged, ExitCode::FAILURE);
        // An unreadable certificate fails at any threshold.
        std::fs::write(dir.path().join("pki/broken.crt"), "x").unwrap();
        let broken = check(check_args(dir.path(), Duration::ZERO)).await.unwrap();
        assert_eq!(broken, ExitCode::FAILURE);
    }

    #[tokio::test]
    async fn check_of_a_missing_dir_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = check(check_args(dir.path(), Duration::ZERO))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("pki") && err.contains("--pki-dir"), "{err}");
    }
}
