//! `testkube serve`: the API double as a process, for the local sandbox and for manual
//! use with kubectl. Never a production control plane.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "testkube",
    about = "A Kubernetes API double for tests and the sandbox"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve HTTPS until Ctrl-C and write a kubeconfig kubectl can use.
    Serve {
        /// Address to listen on (a loopback address keeps it private).
        #[arg(long, default_value = "127.0.0.1:6443")]
        listen: SocketAddr,
        /// Where to write the kubeconfig (it holds an admin client key: mode 0600).
        #[arg(long)]
        kubeconfig: PathBuf,
        /// Reject callers without known credentials with 401.
        #[arg(long)]
        strict_auth: bool,
        /// Let the kubelet proxy dial node addresses outside loopback.
        #[arg(long)]
        allow_non_loopback_kubelets: bool,
        /// Kubelet address-type order for the proxy, comma-separated.
        #[arg(long, value_delimiter = ',')]
        kubelet_preferred_address_types: Vec<String>,
        /// Seconds between watch BOOKMARK events.
        #[arg(long, default_value_t = 60)]
        bookmark_interval_secs: u64,
        /// Leave pending pods unbound (the scheduler stand-in is on by default).
        #[arg(long)]
        no_scheduler: bool,
        /// Do not sign kube-public/cluster-info (the bootstrap signer is on by default).
        #[arg(long)]
        no_bootstrap_signer: bool,
        /// Serve with the cluster CA of a `stratum-server certs generate` directory
        /// (ca.crt, ca.key) instead of a throwaway one.
        #[arg(long, value_name = "DIR")]
        pki_dir: Option<PathBuf>,
    },
    /// Play a worker's kubelet: register the Node, serve the stub kubelet routes (logs,
    /// exec, port-forward echo) and renew the Ready heartbeat until Ctrl-C or SIGTERM.
    Kubelet {
        /// The Node's name.
        #[arg(long)]
        node: String,
        /// Kubelet API address; its port is the Node's daemon endpoint.
        #[arg(long)]
        listen: SocketAddr,
        /// Kubeconfig to register the Node with.
        #[arg(long)]
        kubeconfig: PathBuf,
        /// The Node's InternalIP (default: the listen address's IP).
        #[arg(long)]
        internal_ip: Option<std::net::IpAddr>,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    match Cli::parse().command {
        Command::Serve {
            listen,
            kubeconfig,
            strict_auth,
            allow_non_loopback_kubelets,
            kubelet_preferred_address_types,
            bookmark_interval_secs,
            no_scheduler,
            no_bootstrap_signer,
            pki_dir,
        } => {
            let mut b = testkube::ApiServer::builder()
                .listen(listen)
                .kubeconfig_path(&kubeconfig)
                .allow_non_loopback_kubelets(allow_non_loopback_kubelets)
                .bookmark_interval(Duration::from_secs(bookmark_interval_secs.max(1)))
                .scheduler(!no_scheduler)
                .bootstrap_signer(!no_bootstrap_signer)
                .token_cleaner(true);
            if let Some(dir) = pki_dir {
                b = b.pki_dir(dir);
            }
            if strict_auth {
                b = b.strict_auth();
            }
            if !kubelet_preferred_address_types.is_empty() {
                b = b.preferred_address_types(kubelet_preferred_address_types);
            }
            let server = match b.start().await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("testkube: {e}");
                    return ExitCode::FAILURE;
                }
            };
            println!(
                "testkube serving {} (kubeconfig {}); Ctrl-C stops it",
                server.url(),
                kubeconfig.display()
            );
            if let Err(e) = tokio::signal::ctrl_c().await {
                eprintln!("testkube: waiting for Ctrl-C: {e}");
            }
            server.shutdown().await;
            ExitCode::SUCCESS
        }
        Command::Kubelet {
            node,
            listen,
            kubeconfig,
            internal_ip,
        } => match kubelet(node, listen, kubeconfig, internal_ip).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("testkube kubelet: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

async fn kubelet(
    node: String,
    listen: SocketAddr,
    kubeconfig: PathBuf,
    internal_ip: Option<std::net::IpAddr>,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig)
        .with_context(|| format!("reading kubeconfig {}", kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .with_context(|| format!("loading kubeconfig {}", kubeconfig.display()))?;
    let client = kube::Client::try_from(config)?;
    let stop = tokio_util::sync::CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
        on_signal.cancel();
    });
    let opts = testkube::standalone::KubeletOptions {
        node,
        listen,
        internal_ip,
    };
    testkube::standalone::serve_kubelet(client, opts, stop).await
}
