//! `stratum-server nodes reconcile` and `stratum-server nodes diagnostics`: the control-plane
//! half of the kubelet tunnel routes (`crates/nodeaddr`, `docs/nodeaddr.md`).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use nodeaddr::{NodeAddressDiagnostic, PortRange, Reconciler, Status};

/// Exit code of `nodes diagnostics` when a node is unpatched or shares its port.
pub const EXIT_NEEDS_ATTENTION: u8 = 3;

/// `stratum-server nodes` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Keep every Node's ExternalIP and kubelet port pointed at its tunnel, until
    /// SIGINT/SIGTERM.
    Reconcile(ReconcileArgs),
    /// Print each Node's expected and observed address and kubelet port. Exits 0 when all
    /// routed nodes are patched, 3 when one is unpatched or shares its derived port with
    /// another, 1 when the API server cannot be asked.
    Diagnostics(DiagnosticsArgs),
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
}

/// Flags of `nodes reconcile`.
#[derive(Debug, clap::Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Resync interval (e.g. 30s, 1m). Node watch events trigger passes in between.
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub interval: Duration,
    /// Write the reconciler's liveness snapshot (JSON) here whenever it changes, so that
    /// `nodes diagnostics --status-file` can show it.
    #[arg(long, value_name = "FILE")]
    pub status_file: Option<PathBuf>,
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
    /// A liveness snapshot written by `nodes reconcile --status-file`, shown with the rows.
    #[arg(long, value_name = "FILE")]
    pub status_file: Option<PathBuf>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("{e}: write a duration such as 30s, 2m or 1h"))?;
    if d.is_zero() {
        return Err("the interval must be longer than zero".into());
    }
    Ok(d)
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
    let client = client(cluster.kubeconfig.as_deref()).await?;
    let mut r = Reconciler::new(client);
    r.port_for = nodeaddr::port_func(range);
    Ok(r)
}

async fn client(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("cannot use kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context(
            "no cluster configuration: pass --kubeconfig, set KUBECONFIG, \
             or run inside a pod with a service account",
        )?,
    };
    kube::Client::try_from(config).context("cannot build the Kubernetes client")
}

async fn reconcile(args: ReconcileArgs) -> anyhow::Result<ExitCode> {
    let mut r = reconciler(&args.cluster).await?;
    r.interval = args.interval;
    let cancel = cmdline::shutdown_token();
    let writer = args.status_file.map(|path| {
        let cancel = cancel.clone();
        tokio::spawn(async move { write_status_until(&path, cancel).await })
    });
    r.run(cancel.clone()).await;
    if let Some(w) = writer {
        cancel.cancel();
        w.await.context("status file writer panicked")??;
    }
    Ok(ExitCode::SUCCESS)
}

/// Mirrors the process-global snapshot into `path` (write to a temporary file, then
/// rename, so a reader never sees half a document).
async fn write_status_until(
    path: &Path,
    cancel: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let mut last: Option<Status> = None;
    loop {
        let now = nodeaddr::last_status();
        if now != last {
            if let Some(s) = &now {
                let body = serde_json::to_vec_pretty(s)?;
                let tmp = path.with_extension("tmp");
                tokio::fs::write(&tmp, body)
                    .await
                    .with_context(|| format!("cannot write status file {}", tmp.display()))?;
                tokio::fs::rename(&tmp, path)
                    .await
                    .with_context(|| format!("cannot replace status file {}", path.display()))?;
            }
            last = now;
        }
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
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
    let liveness: Option<Status> = match &args.status_file {
        Some(path) => {
            let body = std::fs::read(path).with_context(|| {
                format!(
                    "cannot read status file {} (is `nodes reconcile --status-file` running?)",
                    path.display()
                )
            })?;
            Some(
                serde_json::from_slice::<Status>(&body)
                    .with_context(|| format!("status file {} is not a snapshot", path.display()))?,
            )
        }
        None => nodeaddr::last_status(),
    };
    let mut out = std::io::stdout().lock();
    match args.output {
        Output::Json => {
            let doc = serde_json::json!({ "nodes": rows, "reconciler": liveness });
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
        let state = match (r.skipped, r.patched, r.port_collides_with.is_empty()) {
            (Some(reason), _, _) => format!(
                "skipped ({})",
                serde_json::to_value(reason)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            ),
            (None, true, true) => "ok".into(),
            (None, false, true) => "UNPATCHED".into(),
            (None, patched, false) => format!(
                "{}PORT COLLIDES with {}",
                if patched { "" } else { "UNPATCHED, " },
                r.port_collides_with.join(",")
            ),
        };
        table.push([
            r.node_name.clone(),
            r.routing_name.clone(),
            opt(&r.expected_external_ip),
            opt(&r.observed_external_ip),
            port(r.expected_kubelet_port),
            port(r.observed_kubelet_port),
            state,
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
            "\nreconciler: no liveness snapshot (it runs in `stratum-server nodes reconcile`; \
             pass --status-file to show the one it writes)"
        )?,
        Some(s) => writeln!(
            out,
            "\nreconciler: started={} last_run_at={} consecutive_failures={} last_error={}",
            s.started,
            s.last_run_at
                .map(|t| t.to_rfc3339())
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

    #[test]
    fn durations_parse_human_style() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("soon").unwrap_err().contains("30s"));
    }

    #[test]
    fn table_marks_each_state() {
        let row = |name: &str, patched: bool, coll: &[&str], skipped| NodeAddressDiagnostic {
            node_name: name.into(),
            routing_name: name.into(),
            expected_external_ip: Some("127.0.0.9".into()),
            observed_external_ip: patched.then(|| "127.0.0.9".into()),
            expected_kubelet_port: Some(20001),
            observed_kubelet_port: patched.then_some(20001),
            patched,
            skipped,
            port_collides_with: coll.iter().map(|s| s.to_string()).collect(),
        };
        let rows = [
            row("a", true, &[], None),
            row("b", false, &[], None),
            row("c", true, &["d"], None),
            row("v", false, &[], Some(nodeaddr::SkipReason::Virtual)),
        ];
        let mut buf = Vec::new();
        write_table(&mut buf, &rows, None).unwrap();
        let text = String::from_utf8(buf).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("NODE"));
        assert!(lines[1].ends_with("ok"), "{text}");
        assert!(lines[2].ends_with("UNPATCHED"), "{text}");
        assert!(lines[3].ends_with("PORT COLLIDES with d"), "{text}");
        assert!(lines[4].ends_with("skipped (virtual)"), "{text}");
        assert!(text.contains("no liveness snapshot"));
    }
}
