//! `stratum-server nodes reconcile` and `stratum-server nodes diagnostics`: the control-plane
//! half of the kubelet tunnel routes (`crates/nodeaddr`, `docs/nodeaddr.md`).

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use nodeaddr::{NodeAddressDiagnostic, PortRange, Reconciler, Status, Tunnel};

/// Exit code when a node is unpatched, collides or has its tunnel down.
pub const EXIT_NEEDS_ATTENTION: u8 = 3;

/// Exit code when the API server (or the admin listener) cannot be asked.
pub const EXIT_CANNOT_ASK: u8 = 1;

/// `stratum-server nodes` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Keep every Node's ExternalIP and kubelet port pointed at its tunnel, until
    /// SIGINT/SIGTERM (or one pass with --once).
    Reconcile(ReconcileArgs),
    /// Print each Node's expected and observed address and kubelet port. Exits 0 when all
    /// routed nodes are patched, 3 when one is unpatched, collides for the tunnel in use or
    /// has its tunnel down, 1 when the API server cannot be asked.
    Diagnostics(DiagnosticsArgs),
}

/// The tunnel in use on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TunnelArg {
    /// frpc/frps: every node shares one remote-port space; a shared port breaks a node.
    Frpc,
    /// ssh -R: each node binds its own loopback address; only a shared (address, port)
    /// pair breaks a node.
    Ssh,
}

impl From<TunnelArg> for Tunnel {
    fn from(t: TunnelArg) -> Tunnel {
        match t {
            TunnelArg::Frpc => Tunnel::Frpc,
            TunnelArg::Ssh => Tunnel::Ssh,
        }
    }
}

/// Flags shared by both subcommands.
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterArgs {
    /// kubeconfig file. Without it: $KUBECONFIG, then ~/.kube/config, then the pod's
    /// service account when running in a cluster.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// First port of the derived kubelet port range (must match the workers').
    #[arg(long, default_value_t = PortRange::DEFAULT.base(), value_name = "PORT")]
    pub port_base: u16,
    /// Number of ports in the derived range (must match the workers').
    #[arg(long, default_value_t = PortRange::DEFAULT.slots(), value_name = "N")]
    pub port_slots: u16,
    /// The tunnel the workers use; decides which collisions break a node.
    #[arg(long, value_enum, default_value_t = TunnelArg::Frpc)]
    pub tunnel: TunnelArg,
    /// Treat a node whose loopback address and port do not accept a TCP connection from
    /// this host as "tunnel down": the reconciler leaves it as it is.
    #[arg(long)]
    pub require_tunnel: bool,
}

/// Flags of `nodes reconcile`.
#[derive(Debug, clap::Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Resync interval (e.g. 30s, 1m). Node watch events trigger passes in between; a
    /// resync plans from the watch's store and sends nothing unless a node differs.
    #[arg(long, default_value = "30s", value_parser = cmdline::parse_interval, value_name = "DURATION")]
    pub interval: Duration,
    /// Admin listener: /metrics (Prometheus text) and /status (the liveness snapshot as
    /// JSON). Read it with `nodes diagnostics --admin http://ADDR`.
    #[arg(long, default_value = "127.0.0.1:9102", value_name = "ADDR")]
    pub admin_listen: SocketAddr,
    /// Run one pass (list, plan, write) and exit: 0 when every routed node is right
    /// afterwards, 3 when one needs attention, 1 when the API server cannot be asked.
    #[arg(long)]
    pub once: bool,
    /// This process's identity in the reconciler Lease kube-system/nodeaddr-reconciler
    /// (default: host name and pid).
    #[arg(long, value_name = "ID")]
    pub identity: Option<String>,
    /// How long a standby waits, after the last change of the Lease it saw, before it
    /// takes over.
    #[arg(long, default_value = "15s", value_parser = cmdline::parse_interval, value_name = "DURATION")]
    pub lease_duration: Duration,
    /// How long after its last successful renewal the holder still writes (shorter than
    /// --lease-duration, so it stops before a standby can start).
    #[arg(long, default_value = "10s", value_parser = cmdline::parse_interval, value_name = "DURATION")]
    pub lease_renew_deadline: Duration,
    /// How often to try to acquire or renew the Lease (shorter than the renew deadline).
    #[arg(long, default_value = "2s", value_parser = cmdline::parse_interval, value_name = "DURATION")]
    pub lease_retry: Duration,
}

/// Output format of `nodes diagnostics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns for people.
    Table,
    /// One JSON document for scripts.
    Json,
}

/// Flags of `nodes diagnostics`.
#[derive(Debug, clap::Args)]
pub struct DiagnosticsArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// The admin listener of a running `nodes reconcile` (e.g. http://127.0.0.1:9102):
    /// its liveness snapshot is shown with the rows.
    #[arg(long, value_name = "URL")]
    pub admin: Option<String>,
}

pub async fn run(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Reconcile(args) => reconcile(args).await,
        Command::Diagnostics(args) => diagnostics(args).await,
    }
}

async fn reconciler(cluster: &ClusterArgs) -> anyhow::Result<Reconciler> {
    let range = PortRange::new(cluster.port_base, cluster.port_slots)
        .context("invalid --port-base/--port-slots")?;
    let client = cmdline::kube_client(cluster.kubeconfig.as_deref()).await?;
    let mut r = Reconciler::new(client);
    r.port_for = nodeaddr::port_func(range);
    r.tunnel = cluster.tunnel.into();
    r.require_tunnel = cluster.require_tunnel;
    Ok(r)
}

async fn reconcile(args: ReconcileArgs) -> anyhow::Result<ExitCode> {
    let mut r = reconciler(&args.cluster).await?;
    r.interval = args.interval;
    let identity = args
        .identity
        .clone()
        .unwrap_or_else(daemon::default_identity);
    r.reporter = Some(kube::runtime::events::Reporter {
        controller: nodeaddr::EVENT_CONTROLLER.into(),
        instance: Some(identity.clone()),
    });
    if args.once {
        return Ok(once(&r).await);
    }
    let mut opts = nodeaddr::ServeOptions::new(args.admin_listen.to_string(), identity);
    opts.lease = opts.lease.with_timings(
        args.lease_duration,
        args.lease_renew_deadline,
        args.lease_retry,
    );
    nodeaddr::serve(&r, opts, cmdline::shutdown_token())
        .await
        .map_err(|e| anyhow::anyhow!(nodeaddr::error_chain(&e)))?;
    Ok(ExitCode::SUCCESS)
}

/// `--once`: one pass, a one-line summary, the exit code.
async fn once(r: &Reconciler) -> ExitCode {
    match r.once().await {
        Ok(report) => {
            println!("{report}");
            if report.needs_attention() {
                ExitCode::from(EXIT_NEEDS_ATTENTION)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(nodeaddr::Error::Writes { report, first, .. }) => {
            println!("{report}");
            eprintln!(
                "error: some node status writes failed; first: {}",
                nodeaddr::error_chain(&*first)
            );
            ExitCode::from(EXIT_NEEDS_ATTENTION)
        }
        Err(e) => {
            eprintln!("error: {}", nodeaddr::error_chain(&e));
            ExitCode::from(EXIT_CANNOT_ASK)
        }
    }
}

async fn diagnostics(args: DiagnosticsArgs) -> anyhow::Result<ExitCode> {
    let r = reconciler(&args.cluster).await?;
    let rows = r
        .diagnostics()
        .await
        .map_err(|e| anyhow::anyhow!(nodeaddr::error_chain(&e)))
        .context("cannot read Nodes")?;
    let liveness = match &args.admin {
        Some(admin) => Some(
            daemon::admin::fetch_status::<Status>(admin, Duration::from_secs(10))
                .await
                .context("cannot read the reconciler's status (--admin)")?,
        ),
        None => None,
    };
    let mut out = std::io::stdout().lock();
    match args.output {
        Output::Json => {
            let doc = serde_json::json!({
                "tunnel": Tunnel::from(args.cluster.tunnel),
                "nodes": rows,
                "reconciler": liveness,
            });
            serde_json::to_writer_pretty(&mut out, &doc)?;
            writeln!(out)?;
        }
        Output::Table => write_table(&mut out, &rows, liveness.as_ref())?,
    }
    let attention = rows.iter().any(NodeAddressDiagnostic::needs_attention);
    Ok(if attention {
        ExitCode::from(EXIT_NEEDS_ATTENTION)
    } else {
        ExitCode::SUCCESS
    })
}

fn write_table(
    out: &mut impl std::io::Write,
    rows: &[NodeAddressDiagnostic],
    liveness: Option<&Status>,
) -> std::io::Result<()> {
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let port = |v: Option<u16>| v.map(|p| p.to_string()).unwrap_or_else(|| "-".into());
    let mut table: Vec<[String; 7]> = vec![[
        "NODE".into(),
        "ROUTING-NAME".into(),
        "EXPECTED-IP".into(),
        "OBSERVED-IP".into(),
        "EXPECTED-PORT".into(),
        "OBSERVED-PORT".into(),
        "STATE".into(),
    ]];
    for r in rows {
        table.push([
            r.node_name.clone(),
            r.routing_name.clone(),
            opt(&r.expected_external_ip),
            opt(&r.observed_external_ip),
            port(r.expected_kubelet_port),
            port(r.observed_kubelet_port),
            r.state_text(),
        ]);
    }
    let mut widths = [0usize; 7];
    for row in &table {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in &table {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  "));
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    match liveness {
        None => writeln!(
            out,
            "\nreconciler: not asked (pass --admin http://ADDR, the --admin-listen of \
             `stratum-server nodes reconcile`, default 127.0.0.1:9102)"
        )?,
        Some(s) => writeln!(
            out,
            "\nreconciler: started={} leader={} last_run_at={} last_success_at={} \
             consecutive_failures={} last_error={}",
            s.started,
            s.leader,
            s.last_run_at
                .map(|t| t.to_string())
                .unwrap_or_else(|| "-".into()),
            s.last_success_at
                .map(|t| t.to_string())
                .unwrap_or_else(|| "-".into()),
            s.consecutive_failures,
            s.last_error.as_deref().unwrap_or("-"),
        )?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodeaddr::NodeState;

    #[test]
    fn table_aligns_columns_and_says_when_the_reconciler_was_not_asked() {
        let row = |name: &str, state| NodeAddressDiagnostic {
            node_name: name.into(),
            routing_name: name.into(),
            expected_external_ip: Some("127.0.0.9".into()),
            observed_external_ip: None,
            expected_kubelet_port: Some(20001),
            observed_kubelet_port: None,
            patched: false,
            skipped: None,
            collides_with: vec!["d".into()],
            state,
        };
        let rows = [
            row("a-long-name", NodeState::Unpatched),
            row("c", NodeState::Colliding),
        ];
        let mut buf = Vec::new();
        write_table(&mut buf, &rows, None).unwrap();
        let text = String::from_utf8(buf).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("NODE         ROUTING-NAME"), "{text}");
        assert!(lines[1].ends_with("UNPATCHED"), "{text}");
        assert!(lines[2].starts_with("c            c "), "{text}");
        assert!(lines[2].ends_with("COLLIDES with d"), "{text}");
        assert!(text.contains("not asked (pass --admin"));
    }
}
