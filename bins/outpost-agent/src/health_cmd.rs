//! `outpost-agent health`: the probe listener, standalone.
//!
//! Serves `/healthz` and `/readyz` until SIGINT/SIGTERM. No node is registered and no data
//! plane is brought up by this command, so `/readyz` truthfully answers 503 here; the full
//! agent reports into the same listener as its subsystems come up.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tracing::info;

/// Flags of `outpost-agent health`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address to serve /healthz and /readyz on, as host:port. Overrides `health.listen` from
    /// --config; with neither, 127.0.0.1:9101. The endpoints are unauthenticated, which is
    /// why the default is loopback; bind wider only on purpose.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Agent configuration file (the one agent.yaml; see docs/examples/agent.yaml). This
    /// command uses its `health:` block: `enabled` (default true; false exits at once)
    /// and `listen` (host:port); the rest of the file is checked too.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    // Installed first, so a signal that arrives while binding is already a clean shutdown.
    let shutdown = cmdline::shutdown_token();
    let config = resolve(args.config.as_deref(), args.listen)?;
    if !config.is_enabled() {
        info!(
            listen = %config.listen,
            "health listener is disabled (health.enabled: false); not serving /healthz or /readyz"
        );
        return Ok(ExitCode::SUCCESS);
    }
    let server = health::Server::new(config);
    // Fails at once, naming the address, when another process holds it.
    let listener = server.listen().await?;
    info!(
        "standalone mode: nothing registers the node here, so /readyz answers 503 while /healthz answers 200"
    );
    server.serve(shutdown, listener).await?;
    Ok(ExitCode::SUCCESS)
}

/// The file's `health:` block (the whole file is checked), the `--listen` flag over it,
/// then defaults.
fn resolve(file: Option<&Path>, listen: Option<String>) -> anyhow::Result<health::Config> {
    let mut config = match file {
        Some(path) => agent::AgentConfig::load(path)?.health,
        None => health::Config::default(),
    };
    if let Some(listen) = listen {
        config.listen = listen;
    }
    config.apply_defaults();
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_overrides_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.yaml");
        std::fs::write(&path, "nodeName: w1\nhealth:\n  listen: 127.0.0.2:9300\n").unwrap();
        assert_eq!(resolve(Some(&path), None).unwrap().listen, "127.0.0.2:9300");
        let c = resolve(Some(&path), Some("127.0.0.3:9400".into())).unwrap();
        assert_eq!(c.listen, "127.0.0.3:9400");
        assert_eq!(c.enabled, Some(true));
        assert_eq!(resolve(None, None).unwrap().listen, "127.0.0.1:9101");
    }

    #[test]
    fn a_typo_in_the_health_block_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.yaml");
        std::fs::write(&path, "nodeName: w1\nhealth:\n  listne: 0.0.0.0:9200\n").unwrap();
        let err = resolve(Some(&path), None).unwrap_err();
        assert!(format!("{err:#}").contains("listne"), "{err:#}");
    }

    #[test]
    fn an_unreadable_file_names_its_path() {
        let err = resolve(Some(Path::new("/nonexistent/agent.yaml")), None).unwrap_err();
        assert!(
            format!("{err:#}").contains("/nonexistent/agent.yaml"),
            "{err:#}"
        );
    }
}
