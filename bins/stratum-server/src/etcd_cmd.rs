//! `stratum-server etcd ...`: etcd cluster health and membership.

use std::path::PathBuf;
use std::process::ExitCode;

use ha::etcd::{self, EtcdError, EtcdOptions, EtcdTls};

/// `stratum-server etcd` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Read the member list through the given endpoints, then check that every voting
    /// member has started, answers at its own client URL, knows a leader and raises no
    /// alarm, and that all name the same leader. Exits non-zero otherwise, naming each
    /// failing member. The endpoints only locate the cluster: leaving a dead member off
    /// them, or listing a live one twice, does not hide anything.
    Health(Args),
    /// List the cluster's members (learners and not-yet-started members included).
    Members(Args),
    /// Downgrade the cluster one minor version: read every member's version, refuse what
    /// etcd cannot do (no downgrade before etcd 3.5; one minor version at a time), from
    /// etcd 3.6 on validate and enable the downgrade (3.5 to 3.4 is etcd's rolling
    /// replacement: nothing is enabled), print what to do to each member, then wait until
    /// every member runs the target (restart each on the older binary meanwhile). A re-run
    /// part way waits for the rest. Exit 0: done; 3: refused, or not every member on the
    /// target within --wait; 2: a bad --to; 1: etcd could not be asked.
    Downgrade(DowngradeArgs),
}

/// Where a command finds the etcd cluster: --endpoints (with TLS flags), or the node state
/// of --data-dir (its recorded endpoints and the node's etcd client certificate).
#[derive(Debug, clap::Args)]
pub struct AccessArgs {
    /// etcd client URLs, comma-separated (default: the endpoints the node state in
    /// --data-dir records).
    #[arg(long, value_delimiter = ',', env = "STRATUM_ETCD_ENDPOINTS")]
    pub endpoints: Vec<String>,
    /// Client TLS (default with --data-dir: the node's PKI).
    #[command(flatten)]
    pub tls: TlsArgs,
    /// A control-plane node's data directory: its node state names the endpoints and PKI.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

impl AccessArgs {
    /// The etcd options and endpoints to use (`ha::etcd::access_from`).
    pub fn access(&self) -> Result<(EtcdOptions, Vec<String>), etcd::AccessError> {
        etcd::access_from(&self.endpoints, self.tls.tls(), self.data_dir.as_deref())
    }
}

/// `etcd downgrade`.
#[derive(Debug, clap::Args)]
pub struct DowngradeArgs {
    /// The version to go to, MAJOR.MINOR (a patch is ignored: etcd's cluster version is
    /// MAJOR.MINOR), one minor below the cluster's.
    #[arg(long, value_name = "VERSION")]
    pub to: String,
    #[command(flatten)]
    pub access: AccessArgs,
    /// How long to wait for every member to run the target (then exit 3 naming the members
    /// not on it; a re-run resumes the wait).
    #[arg(
        long,
        visible_alias = "timeout",
        default_value = "30m",
        value_parser = humantime::parse_duration
    )]
    pub wait: std::time::Duration,
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// A table for a person.
    Table,
    /// One JSON object, for scripts.
    Json,
}

/// Flags shared by the etcd commands.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// etcd client URLs, comma-separated (e.g. https://10.0.0.1:2379,https://10.0.0.2:2379):
    /// where to read the member list.
    #[arg(
        long,
        value_delimiter = ',',
        required = true,
        env = "STRATUM_ETCD_ENDPOINTS"
    )]
    pub endpoints: Vec<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

impl Args {
    fn options(&self) -> EtcdOptions {
        EtcdOptions::with_tls(self.tls.tls())
    }

    fn endpoints(&self) -> Vec<String> {
        clean_endpoints(&self.endpoints)
    }
}

/// The etcd client TLS flags every etcd-facing command takes: all three or none.
#[derive(Debug, Default, clap::Args)]
pub struct TlsArgs {
    /// The etcd CA certificate (e.g. /etc/kubernetes/pki/etcd/ca.crt).
    #[arg(long, requires_all = ["cert", "key"])]
    pub cacert: Option<PathBuf>,
    /// A client certificate the etcd CA issued (e.g. .../etcd/healthcheck-client.crt).
    #[arg(long, requires_all = ["cacert", "key"])]
    pub cert: Option<PathBuf>,
    /// Its key.
    #[arg(long, requires_all = ["cacert", "cert"])]
    pub key: Option<PathBuf>,
}

impl TlsArgs {
    /// The TLS files, when all three were given.
    pub fn tls(&self) -> Option<EtcdTls> {
        match (&self.cacert, &self.cert, &self.key) {
            (Some(ca), Some(cert), Some(key)) => Some(EtcdTls::from_paths(ca, cert, key)),
            _ => None,
        }
    }
}

/// `--endpoints` without blanks (a trailing comma, spaces around the commas).
pub fn clean_endpoints(endpoints: &[String]) -> Vec<String> {
    endpoints
        .iter()
        .map(|e| e.trim().to_string())
        .filter(|e| !e.is_empty())
        .collect()
}

pub async fn run(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Health(args) => health(args).await,
        Command::Members(args) => members(args).await,
        Command::Downgrade(args) => downgrade(args).await,
    }
}

async fn downgrade(args: DowngradeArgs) -> anyhow::Result<ExitCode> {
    use ha::etcd::rules::DowngradeRefusal;
    let (opts, endpoints) = match args.access.access() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {}", ha::error_chain(&e));
            return Ok(ExitCode::from(2));
        }
    };
    let mut out = std::io::stdout();
    match etcd::downgrade_cluster(&opts, &endpoints, &args.to, args.wait, &mut out).await {
        Ok(_) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("error: {}", ha::error_chain(&e));
            Ok(match e {
                EtcdError::DowngradeRefused(DowngradeRefusal::BadTarget { .. }) => {
                    ExitCode::from(2)
                }
                EtcdError::DowngradeRefused(_)
                | EtcdError::DowngradeIncomplete { .. }
                | EtcdError::DowngradeNotValidated { .. } => ExitCode::from(3),
                _ => ExitCode::FAILURE,
            })
        }
    }
}

fn leader_text(l: Option<u64>) -> String {
    l.map(|l| format!("{l:x}")).unwrap_or_else(|| "none".into())
}

async fn health(args: Args) -> anyhow::Result<ExitCode> {
    let endpoints = args.endpoints();
    let result = etcd::etcd_cluster_healthy(&args.options(), &endpoints).await;
    let (answers, problems, leader) = match &result {
        Ok(h) => (h.members.clone(), Vec::new(), Some(h.leader)),
        Err(EtcdError::Unhealthy { problems, answers }) => {
            (answers.clone(), problems.clone(), None)
        }
        Err(other) => anyhow::bail!("{other}"),
    };
    match args.output {
        Output::Json => {
            let out = serde_json::json!({
                "healthy": result.is_ok(),
                "leader": leader.map(|l| format!("{l:x}")),
                "members": answers,
                "problems": problems,
            });
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        Output::Table => {
            println!(
                "{:<32} {:>17} {:>17} {:>6} {:<9} {:<7} STATUS",
                "ENDPOINT", "MEMBER", "LEADER", "TERM", "VERSION", "LEARNER"
            );
            for a in &answers {
                let status = match (&a.error, a.healthy()) {
                    (Some(e), _) => format!("no answer: {e}"),
                    (None, true) => "ok".into(),
                    (None, false) if a.leader.is_none() => "no leader".into(),
                    (None, false) => format!("alarms: {}", a.alarms.join(", ")),
                };
                println!(
                    "{:<32} {:>17} {:>17} {:>6} {:<9} {:<7} {status}",
                    a.endpoint,
                    a.member_id.map(|m| format!("{m:x}")).unwrap_or_default(),
                    leader_text(a.leader),
                    a.raft_term,
                    a.version,
                    a.is_learner,
                );
            }
        }
    }
    if problems.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    for p in &problems {
        eprintln!("unhealthy: {p}");
    }
    Ok(ExitCode::FAILURE)
}

async fn members(args: Args) -> anyhow::Result<ExitCode> {
    let (endpoint, members) = etcd::member_list_via(&args.options(), &args.endpoints()).await?;
    match args.output {
        Output::Json => {
            let out = serde_json::json!({ "answered_by": endpoint, "members": members });
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
        Output::Table => {
            println!(
                "{:>17} {:<16} {:<8} {:<8} {:<32} CLIENT URLS",
                "ID", "NAME", "STARTED", "LEARNER", "PEER URLS"
            );
            for m in &members {
                println!(
                    "{:>17} {:<16} {:<8} {:<8} {:<32} {}",
                    format!("{:x}", m.id),
                    if m.name.is_empty() { "-" } else { &m.name },
                    m.started(),
                    m.is_learner,
                    m.peer_urls.join(","),
                    m.client_urls.join(",")
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(endpoints: &[&str]) -> Args {
        Args {
            endpoints: endpoints.iter().map(|s| s.to_string()).collect(),
            tls: TlsArgs::default(),
            output: Output::Json,
        }
    }

    // Port 9 (discard) on an unused loopback address: nothing listens, connections are
    // refused at once. Live members are covered by the ha crate's etcd tests.
    #[tokio::test]
    async fn health_of_an_unreachable_member_fails() {
        let code = health(args(&["http://127.0.0.29:9"])).await.unwrap();
        assert_eq!(code, ExitCode::FAILURE);
    }

    #[tokio::test]
    async fn members_names_every_endpoint_it_could_not_reach() {
        let err = members(args(&["http://127.0.0.29:9", "127.0.0.28:9"]))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("http://127.0.0.29:9") && err.contains("127.0.0.28:9"),
            "{err}"
        );
    }
}
