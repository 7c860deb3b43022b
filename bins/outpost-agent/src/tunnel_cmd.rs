//! `outpost-agent kubelet-port` and `outpost-agent tunnel-config`: the worker half of the
//! kubelet tunnel routes (`crates/nodeaddr`, `docs/nodeaddr.md`).
//!
//! The worker runs its kubelet on the derived port and publishes that port, unchanged, on
//! the control-plane host through a tunnel; the control plane derives the same number from
//! the same name and points the Node at it. Nothing is exchanged between the two.

use std::net::Ipv4Addr;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use nodeaddr::PortRange;

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
    /// The node name as configured on this worker (k3s `--node-name`).
    #[arg(long, env = "NODE_NAME", value_name = "NAME")]
    pub node_name: String,
    /// The tunnel server on the control-plane host: frps' bind port for frpc, sshd's port
    /// for ssh (e.g. cp.example.net:7000, [2001:db8::1]:22).
    #[arg(long, value_name = "HOST:PORT")]
    pub server: String,
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
    check_name(&args.node_name)?;
    let range = args.range.range()?;
    let port = range.port_for(&args.node_name);
    let (host, server_port) = split_host_port(&args.server)?;
    let text = match args.format {
        Format::Frpc => frpc_toml(&args.node_name, &host, server_port, port),
        Format::Ssh => {
            let bind = match (args.remote_bind, &args.kubeconfig) {
                (Some(ip), _) => ip,
                (None, Some(path)) => {
                    let client = client(path).await?;
                    let found = nodeaddr::bind_address(client, &args.node_name, range)
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
                    let ip = nodeaddr::loopback_candidate(&args.node_name);
                    eprintln!(
                        "# binding {ip}, the first candidate for this name; pass --kubeconfig \
                         to bind exactly the address the reconciler assigns"
                    );
                    ip
                }
            };
            let mut options = Vec::new();
            if let Some(key) = &args.identity_file {
                options.push(format!("-i {}", shell_quote(&key.to_string_lossy())));
                options.push("-o IdentitiesOnly=yes".to_string());
            }
            if let Some(known) = &args.known_hosts {
                options.push(format!(
                    "-o {}",
                    shell_quote(&format!("UserKnownHostsFile={}", known.to_string_lossy()))
                ));
                options.push("-o StrictHostKeyChecking=yes".to_string());
            }
            ssh_command(&args.ssh_user, &host, server_port, bind, port, &options)
        }
    };
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

async fn client(path: &std::path::Path) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .with_context(|| format!("cannot use kubeconfig {}", path.display()))?;
    kube::Client::try_from(config).context("cannot build the Kubernetes client")
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

/// Splits `host:port` or `[v6]:port`.
fn split_host_port(s: &str) -> anyhow::Result<(String, u16)> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, p) = rest
            .split_once("]:")
            .with_context(|| format!("--server {s:?}: expected [IPv6]:PORT"))?;
        (h, p)
    } else {
        s.rsplit_once(':')
            .with_context(|| format!("--server {s:?}: expected HOST:PORT"))?
    };
    if host.is_empty() {
        bail!("--server {s:?}: the host is empty");
    }
    if host.contains(':') && !s.starts_with('[') {
        bail!("--server {s:?}: write IPv6 addresses in brackets, e.g. [2001:db8::1]:7000");
    }
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p != 0)
        .with_context(|| format!("--server {s:?}: {port:?} is not a port number (1-65535)"))?;
    Ok((host.to_string(), port))
}

fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// frpc (0.52+ TOML). remotePort == localPort == the derived port: the kubelet listens on
/// it locally (kubelet `--port`), and frps publishes it under the same number on the
/// control-plane host, where the Node's ExternalIP:port leads.
fn frpc_toml(node: &str, host: &str, server_port: u16, port: u16) -> String {
    format!(
        "# Generated by `outpost-agent tunnel-config` for node {node_q}.\n\
         # Publishes this node's kubelet (listening on 127.0.0.1:{port}, kubelet --port={port})\n\
         # on the control-plane host at port {port}.\n\
         serverAddr = {host_q}\n\
         serverPort = {server_port}\n\
         \n\
         [[proxies]]\n\
         name = {proxy_q}\n\
         type = \"tcp\"\n\
         localIP = \"127.0.0.1\"\n\
         localPort = {port}\n\
         remotePort = {port}\n",
        node_q = toml_string(node),
        host_q = toml_string(host),
        proxy_q = toml_string(&format!("kubelet-{node}")),
    )
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:@/[]".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// `ssh -N -R`: the forwarded port binds the node's loopback address on the control-plane
/// host (a socket on 127.0.0.1 does not answer 127.a.b.c). ExitOnForwardFailure makes a
/// forward that cannot bind fail loudly instead of leaving a session that forwards
/// nothing; BatchMode makes a missing key or host key fail instead of prompting.
fn ssh_command(
    user: &str,
    host: &str,
    ssh_port: u16,
    bind: Ipv4Addr,
    port: u16,
    options: &[String],
) -> String {
    let mut extra = String::new();
    for o in options {
        extra.push_str(o);
        extra.push(' ');
    }
    format!(
        "ssh -N -o BatchMode=yes -o ExitOnForwardFailure=yes -o ServerAliveInterval=15 \
         -o ServerAliveCountMax=3 {extra}-R {bind}:{port}:127.0.0.1:{port} -p {ssh_port} {dest}\n",
        dest = shell_quote(&format!("{user}@{host}")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_addresses_parse() {
        assert_eq!(split_host_port("cp:7000").unwrap(), ("cp".into(), 7000));
        assert_eq!(
            split_host_port("[2001:db8::1]:22").unwrap(),
            ("2001:db8::1".into(), 22)
        );
        for bad in [
            "cp",
            ":7000",
            "cp:0",
            "cp:http",
            "2001:db8::1:22",
            "[::1]22",
        ] {
            assert!(split_host_port(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn frpc_publishes_the_derived_port_unchanged() {
        let port = nodeaddr::kubelet_port_for_node("worker-1");
        let toml = frpc_toml("worker-1", "cp.example", 7000, port);
        assert!(toml.contains("serverAddr = \"cp.example\"\nserverPort = 7000\n"));
        assert!(toml.contains(&format!("localPort = {port}\nremotePort = {port}\n")));
        assert!(toml.contains("type = \"tcp\""));
        assert!(toml.contains("localIP = \"127.0.0.1\""));
        assert!(toml.contains("name = \"kubelet-worker-1\""));
        assert_eq!(toml_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
    }

    #[test]
    fn ssh_binds_the_node_loopback() {
        let cmd = ssh_command("outpost", "cp", 22, Ipv4Addr::new(127, 3, 4, 5), 21149, &[]);
        assert!(cmd.starts_with("ssh -N -o BatchMode=yes -o ExitOnForwardFailure=yes"));
        assert!(cmd.contains(" -R 127.3.4.5:21149:127.0.0.1:21149 -p 22 outpost@cp\n"));
        let cmd = ssh_command(
            "outpost",
            "cp",
            22,
            Ipv4Addr::new(127, 3, 4, 5),
            21149,
            &["-i /k".into()],
        );
        assert!(cmd.contains(" -i /k -R 127.3.4.5:"), "{cmd}");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("").is_err());
        assert!(check_name(" w1").is_err());
        assert!(check_name("w1").is_ok());
    }
}
