//! `stratum-server front ...`: the per-node HAProxy configuration and the kube-vip static
//! pod (`ha::front`).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;

use ha::front::{self, FrontIoError, FrontSpec, KubeVipSpec, render};

use crate::etcd_cmd::AccessArgs;

/// Exit code: `haproxy -c` refused the configuration.
const REFUSED: u8 = 3;
/// Exit code: bad input (a hostile or malformed server, path or address).
const BAD_INPUT: u8 = 2;

/// `stratum-server front` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Render the HAProxy configuration that fronts every API server, to stdout or --out.
    Render(RenderArgs),
    /// Render the configuration and check it with `haproxy -c`. Exit 0: valid; 3: HAProxy
    /// refused it; 2: a server, path or address was refused before rendering; 1: the
    /// member list could not be read or haproxy could not be run.
    Check(CheckArgs),
    /// Render the kube-vip static pod manifest for the cluster VIP.
    KubeVip(KubeVipArgs),
}

/// What the configuration is rendered from.
#[derive(Debug, clap::Args)]
pub struct SpecArgs {
    /// The API servers, HOST:PORT,... (a bare host takes --api-port). Default: every etcd
    /// member's host (read through --endpoints, or the node state in --data-dir).
    #[arg(long, value_delimiter = ',')]
    pub servers: Vec<String>,
    /// The API servers' port, for members and bare hosts.
    #[arg(long, default_value_t = render::DEFAULT_API_PORT)]
    pub api_port: u16,
    /// Where HAProxy listens for API clients.
    #[arg(long, default_value = render::DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// The cluster CA the health checks verify each API server's certificate with.
    #[arg(long, default_value = "/etc/kubernetes/pki/ca.crt")]
    pub ca_file: PathBuf,
    /// Where to read the member list when --servers is not given.
    #[command(flatten)]
    pub access: AccessArgs,
}

/// `front render`.
#[derive(Debug, clap::Args)]
pub struct RenderArgs {
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Write the configuration here (atomically, 0644) instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// `front check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub spec: SpecArgs,
    /// The haproxy binary.
    #[arg(long, default_value = front::HAPROXY_BINARY)]
    pub haproxy: PathBuf,
}

/// `front kube-vip`.
#[derive(Debug, clap::Args)]
pub struct KubeVipArgs {
    /// The cluster VIP.
    #[arg(long)]
    pub vip: IpAddr,
    /// The interface kube-vip announces the VIP on (ARP).
    #[arg(long)]
    pub interface: String,
    /// The API server port the VIP serves.
    #[arg(long, default_value_t = render::DEFAULT_API_PORT)]
    pub port: u16,
    /// The kube-vip image.
    #[arg(long, default_value = render::KUBE_VIP_IMAGE)]
    pub image: String,
    /// The kubeconfig kube-vip uses on the host (its leader-election Lease).
    #[arg(long, default_value = "/etc/kubernetes/admin.conf")]
    pub kubeconfig: PathBuf,
    /// Write the manifest here (atomically, 0644), e.g.
    /// /etc/kubernetes/manifests/kube-vip.yaml, instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub async fn run(cmd: Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Render(args) => render_cmd(args).await,
        Command::Check(args) => check_cmd(args).await,
        Command::KubeVip(args) => kube_vip_cmd(args),
    }
}

/// The spec, or the exit code already explained on stderr.
async fn spec(args: &SpecArgs) -> Result<FrontSpec, ExitCode> {
    let backends = if args.servers.is_empty() {
        let (opts, endpoints) = match args.access.access() {
            Ok(a) => a,
            Err(e) => {
                eprintln!("error: {}", ha::error_chain(&e));
                return Err(ExitCode::from(BAD_INPUT));
            }
        };
        front::backends_from_members(&opts, &endpoints, args.api_port).await
    } else {
        render::parse_servers(&args.servers, args.api_port).map_err(FrontIoError::from)
    };
    let backends = match backends {
        Ok(b) => b,
        Err(e) => return Err(report(&e)),
    };
    let mut spec = FrontSpec::new(backends, &args.ca_file);
    spec.listen = args.listen;
    Ok(spec)
}

fn report(e: &FrontIoError) -> ExitCode {
    eprintln!("error: {}", ha::error_chain(e));
    match e {
        FrontIoError::Render(_) => ExitCode::from(BAD_INPUT),
        FrontIoError::Invalid { .. } => ExitCode::from(REFUSED),
        _ => ExitCode::FAILURE,
    }
}

async fn render_cmd(args: RenderArgs) -> anyhow::Result<ExitCode> {
    let spec = match spec(&args.spec).await {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    let text = match render::render_haproxy(&spec) {
        Ok(t) => t,
        Err(e) => return Ok(report(&e.into())),
    };
    match &args.out {
        None => print!("{text}"),
        Some(path) => {
            common_write(path, text.as_bytes())?;
            eprintln!(
                "wrote {} ({} API servers)",
                path.display(),
                spec.backends.len()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn common_write(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    ha::front::write_file(path, bytes)?;
    Ok(())
}

async fn check_cmd(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let spec = match spec(&args.spec).await {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    let text = match render::render_haproxy(&spec) {
        Ok(t) => t,
        Err(e) => return Ok(report(&e.into())),
    };
    match front::check_text(&args.haproxy, &text).await {
        Ok(out) => {
            for line in out.output.lines().filter(|l| !l.trim().is_empty()) {
                eprintln!("{line}");
            }
            println!(
                "valid: haproxy -c accepts the configuration for {} API servers ({})",
                spec.backends.len(),
                spec.backends
                    .iter()
                    .map(|b| b.address())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => Ok(report(&e)),
    }
}

fn kube_vip_cmd(args: KubeVipArgs) -> anyhow::Result<ExitCode> {
    let spec = KubeVipSpec {
        vip: args.vip,
        interface: args.interface,
        port: args.port,
        image: args.image,
        kubeconfig: args.kubeconfig,
    };
    let text = match front::kube_vip_manifest(&spec) {
        Ok(t) => t,
        Err(e) => return Ok(report(&e)),
    };
    match &args.out {
        None => print!("{text}"),
        Some(path) => {
            common_write(path, text.as_bytes())?;
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}
