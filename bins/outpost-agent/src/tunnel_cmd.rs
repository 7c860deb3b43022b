//! `outpost-agent kubelet-port` and `outpost-agent tunnel-config`: the worker half of the
//! kubelet tunnel routes (`crates/nodeaddr`, `docs/nodeaddr.md`).
//!
//! The worker runs its kubelet on the derived port and publishes that port, unchanged, on
//! the control-plane host through a tunnel; the control plane derives the same number from
//! the same name and points the Node at it. Nothing is exchanged between the two. The
//! rendering lives in `nodeaddr::tunnel`; this module parses flags and prints.

use std::net::Ipv4Addr;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use nodeaddr::{PortRange, tunnel};

/// The port-range flags (must match `stratum-server nodes reconcile`).
#[derive(Debug, Clone, clap::Args)]
pub struct RangeArgs {
    /// First port of the derived kubelet port range.
    #[arg(long, default_value_t = PortRange::DEFAULT.base(), value_name = "PORT")]
    pub port_base: u16,
    /// Number of ports in the derived range.
    #[arg(long, default_value_t = PortRange::DEFAULT.slots(), value_name = "N")]
    pub port_slots: u16,
}

impl RangeArgs {
    fn range(&self) -> anyhow::Result<PortRange> {
        PortRange::new(self.port_base, self.port_slots).context("invalid --port-base/--port-slots")
    }
}

/// Flags of `outpost-agent kubelet-port`.
#[derive(Debug, clap::Args)]
pub struct KubeletPortArgs {
    /// The node name as configured on this worker (k3s `--node-name`, without any
    /// `--with-node-id` suffix).
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: String,
    #[command(flatten)]
    pub range: RangeArgs,
}

/// Tunnel client flavours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// An frpc TOML configuration with one tcp proxy.
    Frpc,
    /// An `ssh -N -R` command line.
    Ssh,
}

/// Flags of `outpost-agent tunnel-config`.
#[derive(Debug, clap::Args)]
pub struct TunnelConfigArgs {
    /// The agent configuration (the one agent.yaml): print exactly the `ssh -R` that
    /// `outpost-agent run --config FILE` runs, from its `nodeName` and `tunnel:` block
    /// (bind address: `tunnel.remoteBind`, else the reconciler's, read with `kubeconfig`).
    #[arg(long, value_name = "FILE", conflicts_with_all = [
        "server", "format", "ssh_user", "remote_bind", "identity_file", "known_hosts",
        "kubeconfig", "port_base", "port_slots",
    ])]
    pub config: Option<std::path::PathBuf>,
    /// The node name as configured on this worker (k3s `--node-name`).
    #[arg(
        long,
        env = "NODE_NAME",
        value_name = "NAME",
        required_unless_present = "config"
    )]
    pub node_name: Option<String>,
    /// The tunnel server on the control-plane host: frps' bind port for frpc, sshd's port
    /// for ssh (e.g. cp.example.net:7000, [2001:db8::1]:22).
    #[arg(long, value_name = "HOST:PORT", required_unless_present = "config")]
    pub server: Option<String>,
    /// Which tunnel client to configure.
    #[arg(long, value_enum, default_value_t = Format::Frpc)]
    pub format: Format,
    /// ssh only: the login on the control-plane host.
    #[arg(long, default_value = "outpost", value_name = "USER")]
    pub ssh_user: String,
    /// ssh only: the address the forwarded port binds on the control-plane host. Default:
    /// with --kubeconfig, the address the reconciler assigns this node (the ExternalIP it
    /// published on the node, or the one it will publish); without, the first candidate
    /// derived from the name (wrong when another node's name hashes to the same address).
    /// Needs `GatewayPorts clientspecified` in sshd_config.
    #[arg(long, value_name = "ADDR")]
    pub remote_bind: Option<Ipv4Addr>,
    /// ssh only: the private key to log in with (rendered as `-i FILE -o IdentitiesOnly=yes`).
    #[arg(long, value_name = "FILE")]
    pub identity_file: Option<std::path::PathBuf>,
    /// ssh only: a known_hosts file pinning the control-plane host's key (rendered as
    /// `-o UserKnownHostsFile=FILE -o StrictHostKeyChecking=yes`).
    #[arg(long, value_name = "FILE")]
    pub known_hosts: Option<std::path::PathBuf>,
    /// ssh only: read the Nodes with this kubeconfig to bind exactly the address the
    /// reconciler assigns this node (one list of Nodes, no writes).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub range: RangeArgs,
}

pub fn kubelet_port(args: KubeletPortArgs) -> anyhow::Result<ExitCode> {
    check_name(&args.node_name)?;
    println!("{}", args.range.range()?.port_for(&args.node_name));
    Ok(ExitCode::SUCCESS)
}

pub async fn tunnel_config(args: TunnelConfigArgs) -> anyhow::Result<ExitCode> {
    if let Some(path) = &args.config {
        return from_agent_config(path, args.node_name.as_deref()).await;
    }
    let (Some(node_name), Some(server)) = (&args.node_name, &args.server) else {
        bail!("pass --node-name and --server, or --config FILE");
    };
    check_name(node_name)?;
    let range = args.range.range()?;
    let port = range.port_for(node_name);
    let (host, server_port) = tunnel::split_host_port(server).context("--server")?;
    let text = match args.format {
        Format::Frpc => tunnel::frpc_toml(node_name, &host, server_port, port),
        Format::Ssh => {
            let bind = match (args.remote_bind, &args.kubeconfig) {
                (Some(ip), _) => ip,
                (None, Some(path)) => {
                    let client = cmdline::kube_client(Some(path)).await?;
                    let found = nodeaddr::bind_address(client, node_name, range)
                        .await
                        .map_err(|e| anyhow::anyhow!(nodeaddr::error_chain(&e)))?;
                    let how = match found.source {
                        nodeaddr::BindSource::Published => {
                            "published on the node by the reconciler"
                        }
                        nodeaddr::BindSource::Planned => {
                            "assigned by the reconciler's plan; not published on the node yet"
                        }
                        nodeaddr::BindSource::Candidate => "derived from the name",
                    };
                    eprintln!("# binding {} ({how})", found.address);
                    found.address
                }
                (None, None) => {
                    let ip = nodeaddr::loopback_candidate(node_name);
                    eprintln!(
                        "# binding {ip}, the first candidate for this name; pass --kubeconfig \
                         to bind exactly the address the reconciler assigns"
                    );
                    ip
                }
            };
            tunnel::SshTunnel {
                user: args.ssh_user.clone(),
                host,
                ssh_port: server_port,
                bind,
                port,
                identity_file: args.identity_file.clone(),
                known_hosts: args.known_hosts.clone(),
            }
            .render()
        }
    };
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

/// `tunnel-config --config F`: the command `run` would start, resolved the same way.
async fn from_agent_config(
    path: &std::path::Path,
    node_name: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let config = agent::AgentConfig::load(path)?;
    if let Some(name) = node_name
        && name != config.node_name
    {
        bail!(
            "--node-name (or NODE_NAME) {name:?} differs from nodeName {:?} in {}; drop one",
            config.node_name,
            path.display()
        );
    }
    let Some(t) = &config.tunnel else {
        bail!("{} has no tunnel: block; nothing to render", path.display());
    };
    let client = if t.remote_bind.is_none() {
        match agent::run::client_from(&config.kubeconfig).await {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("# {e}; binding the first candidate for this name");
                None
            }
        }
    } else {
        None
    };
    let tunnel = agent::tunnel::resolve(t, &config.node_name, client.as_ref()).await;
    print!("{}", tunnel.render());
    Ok(ExitCode::SUCCESS)
}

fn check_name(name: &str) -> anyhow::Result<()> {
    if name.trim().is_empty() {
        bail!("--node-name is empty: pass the node name this worker registers with");
    }
    if name != name.trim() {
        bail!(
            "--node-name {name:?} has surrounding whitespace; the port would not match the control plane's"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_name("").is_err());
        assert!(check_name(" w1").is_err());
        assert!(check_name("w1").is_ok());
    }
}
