//! The sandbox's network: a bridge on the host and one network namespace per worker,
//! joined to it by a veth pair. Everything is named `sbx*` and removed on teardown.

use std::net::Ipv4Addr;
use std::process::Command;

use anyhow::{Context, bail};

/// The bridge and the host's address on it: the workers reach the API server and sshd here.
pub const BRIDGE: &str = "sbx0";
pub const HOST_IP: Ipv4Addr = Ipv4Addr::new(10, 251, 0, 1);

/// The address of worker `i` (1-based) inside its namespace.
pub fn worker_ip(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 251, 0, 10 + i)
}

/// The namespace of worker `i`.
pub fn netns(i: u8) -> String {
    format!("sbx-w{i}")
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

fn exists(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success() && !o.stdout.is_empty())
}

/// The bridge and worker namespaces, removed on drop.
pub struct Net {
    workers: Vec<u8>,
    bridge: bool,
}

impl Net {
    /// Creates the bridge and `workers` namespaces. Refuses when a previous sandbox's
    /// left them behind, naming the commands that remove them.
    pub fn create(workers: u8) -> anyhow::Result<Net> {
        let mut stale = Vec::new();
        if exists(&["link", "show", BRIDGE]) {
            stale.push(format!("ip link del {BRIDGE}"));
        }
        for i in 1..=workers {
            if exists(&["netns", "pids", &netns(i)]) || netns_listed(&netns(i)) {
                stale.push(format!("ip netns del {}", netns(i)));
            }
        }
        if !stale.is_empty() {
            bail!(
                "a previous sandbox left its network behind; remove it with: {}",
                stale.join(" && ")
            );
        }
        let mut net = Net {
            workers: Vec::new(),
            bridge: false,
        };
        ip(&["link", "add", BRIDGE, "type", "bridge"])?;
        net.bridge = true;
        ip(&["addr", "add", &format!("{HOST_IP}/24"), "dev", BRIDGE])?;
        ip(&["link", "set", BRIDGE, "up"])?;
        for i in 1..=workers {
            let ns = netns(i);
            ip(&["netns", "add", &ns])?;
            net.workers.push(i);
            let (host_end, ns_end) = (format!("sbx-w{i}h"), format!("sbx-w{i}n"));
            ip(&[
                "link", "add", &host_end, "type", "veth", "peer", "name", &ns_end,
            ])?;
            ip(&["link", "set", &ns_end, "netns", &ns])?;
            ip(&["link", "set", &host_end, "master", BRIDGE, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", worker_ip(i)),
                "dev",
                &ns_end,
            ])?;
            ip(&["-n", &ns, "link", "set", &ns_end, "up"])?;
        }
        Ok(net)
    }

    /// A command that runs `program` inside worker `i`'s namespace.
    pub fn exec(i: u8, program: &std::path::Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &netns(i)]).arg(program);
        cmd
    }
}

fn netns_listed(name: &str) -> bool {
    Command::new("ip")
        .args(["netns", "list"])
        .output()
        .is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.split_whitespace().next() == Some(name))
        })
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting a namespace deletes its veth end, and with it the host end.
        for i in self.workers.drain(..).rev() {
            if let Err(e) = ip(&["netns", "del", &netns(i)]) {
                eprintln!("sandbox: {e}");
            }
        }
        if self.bridge
            && let Err(e) = ip(&["link", "del", BRIDGE])
        {
            eprintln!("sandbox: {e}");
        }
    }
}
