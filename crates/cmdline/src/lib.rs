//! What the three binaries (`stratum-server`, `outpost-agent`, `nebula-manager`) share, so
//! each `main.rs` stays a few lines: the logging flags, the process-wide rustls crypto
//! provider, and a shutdown token driven by SIGINT/SIGTERM.
//!
//! Libraries never call into this crate; it is only for composition roots.

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
use clap::{Args, ValueEnum};
use tokio_util::sync::CancellationToken;

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Logging flags every binary accepts (`#[command(flatten)]` them).
#[derive(Clone, Debug, Args)]
pub struct LogArgs {
    /// Log format: text for people, json for log shippers.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// Log filter in tracing's EnvFilter syntax (e.g. `info`, `nodeaddr=debug`).
    /// Overrides `RUST_LOG` when given.
    #[arg(long, global = true)]
    pub log_level: Option<String>,
}

impl LogArgs {
    /// Installs the global tracing subscriber. Logs go to stderr so that stdout stays
    /// clean for command output (`-o json`, printed ports and configs).
    pub fn init(&self) {
        use tracing_subscriber::EnvFilter;
        let filter = match &self.log_level {
            Some(level) => EnvFilter::new(level),
            None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        };
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(|| LossyStderr)
            // Colour codes only for a person at a terminal, never into a log file.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
        // A second init (tests that call a binary's `run` twice) is harmless: keep the first.
        let _ = match self.log_format {
            LogFormat::Text => builder.try_init(),
            LogFormat::Json => builder.json().try_init(),
        };
    }
}

/// stderr for log lines, losing them instead of failing when stderr is gone (a closed
/// pipe, `agent ... 2>&1 | head -1`). A write error would make tracing-subscriber report it
/// with `eprintln!`, which panics on the same closed stderr and kills whichever task was
/// logging: the signal task among them, after which SIGTERM did nothing.
struct LossyStderr;

impl std::io::Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// Writes one line to stderr, ignoring a stderr that is gone.
fn report(line: std::fmt::Arguments<'_>) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// A Kubernetes client from `--kubeconfig` when given, else the usual inference
/// (`$KUBECONFIG`, `~/.kube/config`, the in-cluster service account), with errors that
/// say which file failed and what to pass instead.
pub async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    use anyhow::Context as _;
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

/// An interval flag (`30s`, `2m`, `1h30m`; humantime), longer than zero.
pub fn parse_interval(s: &str) -> Result<std::time::Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("{e}: write a duration such as 30s, 2m or 1h"))?;
    if d.is_zero() {
        return Err("the interval must be longer than zero".into());
    }
    Ok(d)
}

/// Installs ring as rustls' process-wide crypto provider. Call once at the start of `main`,
/// before any TLS client or server is built; a second call is a no-op.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Returns a token cancelled on the first SIGINT or SIGTERM. A second signal exits the
/// process at once with status 130, for an operator whose graceful shutdown is stuck.
pub fn shutdown_token() -> CancellationToken {
    use tokio::signal::unix::{SignalKind, signal};
    let token = CancellationToken::new();
    let child = token.clone();
    // Registered here, before returning, not in the task: a signal that arrives while the
    // caller starts up is then a clean shutdown, never the default action's kill.
    let signals = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    tokio::spawn(async move {
        // Without signal handlers the process still dies on the default action.
        let (Ok(mut term), Ok(mut int)) = signals else {
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        // Cancel first: nothing after the signal may stand between it and the shutdown.
        child.cancel();
        tracing::info!("shutdown requested; send the signal again to exit at once");
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::warn!("second shutdown signal: exiting without waiting");
        std::process::exit(130);
    });
    token
}

/// Turns a command's result into the process exit code: the command's own code on success,
/// 1 with the whole error chain on stderr on failure.
pub fn exit_code(result: anyhow::Result<std::process::ExitCode>) -> std::process::ExitCode {
    match result {
        Ok(code) => code,
        Err(err) => {
            report(format_args!("error: {err:#}"));
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs a command on a multi-threaded tokio runtime and turns its result into the exit
/// code (see [`exit_code`]).
pub fn block_on(
    command: impl std::future::Future<Output = anyhow::Result<std::process::ExitCode>>,
) -> std::process::ExitCode {
    match tokio::runtime::Runtime::new() {
        Ok(runtime) => exit_code(runtime.block_on(command)),
        Err(err) => {
            report(format_args!("error: cannot start the async runtime: {err}"));
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn intervals_parse_human_style_and_are_never_zero() {
        assert_eq!(parse_interval("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_interval("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_interval("0s").is_err());
        assert!(parse_interval("soon").unwrap_err().contains("30s"));
    }
}
