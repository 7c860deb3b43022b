//! LocalDNS: the node-local DNS cache pods are pointed at listens on addresses carried
//! by an interface of their own (a `dummy` link), so they exist before the cache starts
//! and survive its restarts.
//!
//! [`setup_network`] and [`cleanup_network`] compute the `ip` commands from what is
//! there (steady state runs none) and run them through a [`Runner`]. [`await_local_dns`]
//! sends real DNS queries over UDP to every listener until each answers.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use tokio::net::UdpSocket;
use tokio::time::Instant;

use crate::goalstate::LocalDns;
use crate::runner::{Cmd, RunError, Runner};

/// A LocalDNS step failed.
#[derive(Debug, thiserror::Error)]
pub enum LocalDnsError {
    /// An `ip` command failed.
    #[error("LocalDNS interface command failed")]
    Command(#[from] RunError),
    /// The configured interface exists and is not one the agent created.
    #[error(
        "LocalDNS interface {interface} exists ({kind}) and was not created by outpost-agent; it is left alone: set localDNS.interface to a name of its own"
    )]
    NotOurs {
        /// The interface.
        interface: String,
        /// Its kind.
        kind: String,
    },
    /// The probe name is not a valid DNS name.
    #[error("LocalDNS probe name {name:?} is not a valid DNS name: {reason}")]
    BadName {
        /// The configured name.
        name: String,
        /// The parser's reason.
        reason: String,
    },
    /// A listener did not answer before the deadline.
    #[error(
        "LocalDNS listener {listener} did not answer a query for {name} within {waited:?} (last attempt: {last}); check that the DNS cache is running and bound to {listener}"
    )]
    NeverAnswered {
        /// The listener.
        listener: SocketAddr,
        /// The name queried.
        name: String,
        /// How long it was waited for.
        waited: Duration,
        /// What the last attempt saw.
        last: String,
    },
}

/// The alias the agent sets on the LocalDNS interface when it creates it. Only a link
/// carrying it is ever deleted: `localDNS.interface: eth0` must not take the node off
/// the network.
pub const LINK_ALIAS: &str = "outpost-agent:localdns";

/// What the interface looks like now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkState {
    /// Whether the link exists.
    pub exists: bool,
    /// Whether it is administratively up.
    pub up: bool,
    /// Its addresses.
    pub addrs: Vec<IpAddr>,
    /// Its link kind (`dummy`, `bridge`, `veth`, ...); `None` for a physical device or
    /// loopback.
    pub kind: Option<String>,
    /// Whether it carries [`LINK_ALIAS`]: the agent created it.
    pub ours: bool,
}

/// The commands that bring the interface from `state` to what `dns` wants. Pure; empty in
/// steady state. A new link gets [`LINK_ALIAS`]; an existing one without it is adopted
/// (given the alias) only when it is of the configured kind and carries no address but
/// the listeners, as a link an earlier agent version created does. Any other existing
/// link is refused by [`setup_network`] before this runs.
pub fn plan_setup(state: &LinkState, dns: &LocalDns) -> Vec<Cmd> {
    let ifname = dns.interface.as_str();
    let mut cmds = Vec::new();
    if !state.exists {
        cmds.push(Cmd::new(
            "ip",
            ["link", "add", ifname, "type", dns.interface_kind.as_str()],
        ));
    }
    if !state.ours {
        cmds.push(Cmd::new(
            "ip",
            ["link", "set", "dev", ifname, "alias", LINK_ALIAS],
        ));
    }
    for addr in &dns.listeners {
        if !state.addrs.contains(addr) {
            let prefix = if addr.is_ipv4() { 32 } else { 128 };
            cmds.push(Cmd::new(
                "ip",
                [
                    "addr".to_string(),
                    "add".into(),
                    format!("{addr}/{prefix}"),
                    "dev".into(),
                    ifname.into(),
                ],
            ));
        }
    }
    if !state.up || !state.exists {
        cmds.push(Cmd::new("ip", ["link", "set", ifname, "up"]));
    }
    cmds
}

/// Whether an existing link the agent did not mark may be adopted for `dns`.
fn adoptable(state: &LinkState, dns: &LocalDns) -> bool {
    state.kind.as_deref() == Some(dns.interface_kind.as_str())
        && state.addrs.iter().all(|a| dns.listeners.contains(a))
}

/// Reads the interface's state with `ip -d -o link show` and `ip -o addr show`.
pub async fn link_state(runner: &dyn Runner, ifname: &str) -> Result<LinkState, RunError> {
    let show = Cmd::new("ip", ["-d", "-o", "link", "show", "dev", ifname]);
    let out = runner.output(&show).await?;
    if !out.success() {
        if out.stderr.contains("does not exist") || out.stderr.contains("Cannot find device") {
            return Ok(LinkState::default());
        }
        return runner.run(&show).await.map(|_| LinkState::default());
    }
    // `2: outpost-dns: <BROADCAST,NOARP,UP,LOWER_UP> mtu 1500 ...`
    let up = out
        .stdout
        .split_once('<')
        .and_then(|(_, rest)| rest.split_once('>'))
        .is_some_and(|(flags, _)| flags.split(',').any(|f| f == "UP"));
    let (kind, alias) = parse_link_details(&out.stdout);
    let addrs_out = runner
        .run(&Cmd::new("ip", ["-o", "addr", "show", "dev", ifname]))
        .await?;
    Ok(LinkState {
        exists: true,
        up,
        addrs: parse_addrs(&addrs_out.stdout),
        kind,
        ours: alias.as_deref() == Some(LINK_ALIAS),
    })
}

/// The link kind and alias from an `ip -d -o link show` line, whose parts are separated
/// by a backslash: `2: x: <...> mtu 1500 ...`, `link/ether ...`, `dummy ...`, `alias A`.
pub fn parse_link_details(line: &str) -> (Option<String>, Option<String>) {
    let parts: Vec<&str> = line
        .lines()
        .next()
        .unwrap_or("")
        .split('\\')
        .map(str::trim)
        .collect();
    let alias = parts
        .iter()
        .find_map(|p| p.strip_prefix("alias "))
        .map(str::to_string);
    let kind = parts
        .iter()
        .skip_while(|p| !p.starts_with("link/"))
        .nth(1)
        .and_then(|p| p.split_whitespace().next())
        .filter(|w| !matches!(*w, "alias" | "addrgenmode"))
        .map(str::to_string);
    (kind, alias)
}

/// Parses the addresses from `ip -o addr show` lines:
/// `5: outpost-dns    inet 169.254.20.10/32 scope global outpost-dns\ ...`.
pub fn parse_addrs(text: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|w| *w == "inet" || *w == "inet6")?;
            let cidr = words.next()?;
            cidr.split('/').next()?.parse().ok()
        })
        .collect()
}

/// Creates the LocalDNS interface with the listener addresses, idempotently. An existing
/// link of that name the agent did not create is refused (see [`plan_setup`]).
pub async fn setup_network(runner: &dyn Runner, dns: &LocalDns) -> Result<(), LocalDnsError> {
    let state = link_state(runner, &dns.interface).await?;
    if state.exists && !state.ours && !adoptable(&state, dns) {
        return Err(LocalDnsError::NotOurs {
            interface: dns.interface.clone(),
            kind: state.kind.unwrap_or_else(|| "device".into()),
        });
    }
    for cmd in plan_setup(&state, dns) {
        runner.run(&cmd).await?;
    }
    Ok(())
}

/// Removes the LocalDNS interface (and so its addresses), idempotently: only a link that
/// carries [`LINK_ALIAS`], the one the agent created. Any other link of that name is left
/// alone (and logged).
pub async fn cleanup_network(runner: &dyn Runner, ifname: &str) -> Result<(), LocalDnsError> {
    let state = link_state(runner, ifname).await?;
    if !state.exists {
        return Ok(());
    }
    if !state.ours {
        tracing::warn!(
            interface = ifname,
            kind = state.kind.as_deref().unwrap_or("device"),
            "not created by outpost-agent (no {LINK_ALIAS} alias): left in place"
        );
        return Ok(());
    }
    runner
        .run(&Cmd::new("ip", ["link", "del", "dev", ifname]))
        .await?;
    Ok(())
}

/// A listener's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answered {
    /// The listener.
    pub listener: SocketAddr,
    /// The response code (NoError or NXDomain: both mean the cache is serving).
    pub rcode: String,
    /// The answer records' data, as text.
    pub answers: Vec<String>,
}

/// How long one query waits for its answer before the next attempt.
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(500);
/// The pause between attempts.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Waits until every listener answers a query for `name` (NoError or NXDomain), within
/// `deadline` overall. SERVFAIL and REFUSED are not an answer: the cache is up but cannot
/// serve yet.
pub async fn await_local_dns(
    listeners: &[SocketAddr],
    name: &str,
    deadline: Duration,
) -> Result<Vec<Answered>, LocalDnsError> {
    let qname = Name::from_ascii(name).map_err(|e| LocalDnsError::BadName {
        name: name.into(),
        reason: e.to_string(),
    })?;
    let start = Instant::now();
    let until = start + deadline;
    let mut answered = Vec::new();
    for listener in listeners {
        let mut attempt: u16 = 0;
        let mut last = String::from("no attempt made");
        loop {
            attempt = attempt.wrapping_add(1);
            let remaining = until.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(LocalDnsError::NeverAnswered {
                    listener: *listener,
                    name: name.into(),
                    waited: start.elapsed(),
                    last,
                });
            }
            match tokio::time::timeout(
                remaining.min(ATTEMPT_TIMEOUT),
                query(*listener, &qname, attempt),
            )
            .await
            {
                Ok(Ok(a)) => {
                    tracing::info!(listener = %listener, rcode = %a.rcode, "LocalDNS answered");
                    answered.push(a);
                    break;
                }
                Ok(Err(why)) => last = why,
                Err(_) => last = format!("no answer within {ATTEMPT_TIMEOUT:?}"),
            }
            tracing::debug!(listener = %listener, last = %last, "LocalDNS not answering yet");
            tokio::time::sleep(RETRY_PAUSE.min(until.saturating_duration_since(Instant::now())))
                .await;
        }
    }
    Ok(answered)
}

async fn query(listener: SocketAddr, name: &Name, attempt: u16) -> Result<Answered, String> {
    let bind: SocketAddr = if listener.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = UdpSocket::bind(bind)
        .await
        .map_err(|e| format!("bind: {e}"))?;
    socket
        .connect(listener)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    // Mix the attempt into the id so a late answer to an earlier attempt is ignored.
    let id = (std::process::id() as u16)
        .wrapping_mul(31)
        .wrapping_add(attempt);
    let mut msg = Message::new();
    msg.set_id(id)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(name.clone(), RecordType::A));
    let bytes = msg.to_vec().map_err(|e| format!("encode query: {e}"))?;
    socket
        .send(&bytes)
        .await
        .map_err(|e| format!("send: {e}"))?;
    let mut buf = vec![0u8; 4096];
    loop {
        // A refused port shows up here as ECONNREFUSED (ICMP port unreachable).
        let n = socket
            .recv(&mut buf)
            .await
            .map_err(|e| format!("receive: {e}"))?;
        let Ok(reply) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        if reply.id() != id || reply.message_type() != MessageType::Response {
            continue;
        }
        let rcode = reply.response_code();
        if rcode != ResponseCode::NoError && rcode != ResponseCode::NXDomain {
            return Err(format!("answered {rcode}"));
        }
        return Ok(Answered {
            listener,
            rcode: rcode.to_string(),
            answers: reply
                .answers()
                .iter()
                .map(|r| r.data().to_string())
                .collect(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::goalstate::InterfaceKind;
    use crate::runner::{CmdOutput, RecordingRunner};

    fn dns() -> LocalDns {
        LocalDns {
            interface: "outpost-dns".into(),
            interface_kind: InterfaceKind::Dummy,
            listeners: vec![
                "169.254.20.10".parse().unwrap(),
                "fd00::10".parse().unwrap(),
            ],
            port: 53,
            probe_name: "a.test.".into(),
            ready_timeout_seconds: 1,
        }
    }

    #[tokio::test]
    async fn setup_from_nothing() {
        let runner = RecordingRunner::new();
        runner.respond(
            &["ip", "-d", "-o", "link", "show"],
            CmdOutput::failed(1, "Device \"outpost-dns\" does not exist.\n"),
        );
        setup_network(&runner, &dns()).await.unwrap();
        assert_eq!(
            runner.commands(),
            [
                "ip -d -o link show dev outpost-dns",
                "ip link add outpost-dns type dummy",
                "ip link set dev outpost-dns alias outpost-agent:localdns",
                "ip addr add 169.254.20.10/32 dev outpost-dns",
                "ip addr add fd00::10/128 dev outpost-dns",
                "ip link set outpost-dns up",
            ]
        );
    }

    #[tokio::test]
    async fn steady_state_runs_nothing_but_reads() {
        let runner = RecordingRunner::new();
        runner.respond(&["ip", "-d", "-o", "link", "show"], CmdOutput::stdout(OURS));
        runner.respond(
            &["ip", "-o", "addr", "show"],
            CmdOutput::stdout(
                "7: outpost-dns    inet 169.254.20.10/32 scope global outpost-dns\\       valid_lft forever\n\
                 7: outpost-dns    inet6 fd00::10/128 scope global \\       valid_lft forever\n",
            ),
        );
        setup_network(&runner, &dns()).await.unwrap();
        assert_eq!(
            runner.commands(),
            [
                "ip -d -o link show dev outpost-dns",
                "ip -o addr show dev outpost-dns"
            ]
        );
        runner.clear();
        cleanup_network(&runner, "outpost-dns").await.unwrap();
        assert_eq!(
            runner.commands().last().unwrap(),
            "ip link del dev outpost-dns"
        );
    }

    #[tokio::test]
    async fn cleanup_of_nothing_is_nothing() {
        let runner = RecordingRunner::new();
        runner.respond(
            &["ip", "-d", "-o", "link"],
            CmdOutput::failed(1, "Device \"x\" does not exist.\n"),
        );
        cleanup_network(&runner, "x").await.unwrap();
        assert_eq!(runner.commands(), ["ip -d -o link show dev x"]);
    }

    #[tokio::test]
    async fn could_not_ask_is_an_error() {
        let runner = RecordingRunner::new();
        runner.respond(
            &["ip", "-d", "-o", "link"],
            CmdOutput::failed(255, "RTNETLINK answers: Operation not permitted\n"),
        );
        let err = setup_network(&runner, &dns()).await.unwrap_err();
        assert!(
            crate::error_chain(&err).contains("Operation not permitted"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_address_is_added_alone() {
        let state = LinkState {
            exists: true,
            up: true,
            addrs: vec!["169.254.20.10".parse().unwrap()],
            kind: Some("dummy".into()),
            ours: true,
        };
        let cmds: Vec<String> = plan_setup(&state, &dns())
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(cmds, ["ip addr add fd00::10/128 dev outpost-dns"]);
    }

    #[tokio::test]
    async fn bad_probe_name() {
        let err = await_local_dns(&[], "a..b", Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(matches!(err, LocalDnsError::BadName { .. }), "{err}");
    }

    const OURS: &str = "7: outpost-dns: <BROADCAST,NOARP,UP,LOWER_UP> mtu 1500 qdisc noqueue state UNKNOWN mode DEFAULT group default qlen 1000\\    link/ether 6e:1c:00:00:00:01 brd ff:ff:ff:ff:ff:ff promiscuity 0 minmtu 0 maxmtu 0 \\    dummy addrgenmode eui64 numtxqueues 1 \\    alias outpost-agent:localdns\n";
    const ETH0: &str = "2: eth0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc fq_codel state UP mode DEFAULT group default qlen 1000\\    link/ether 52:54:00:12:34:56 brd ff:ff:ff:ff:ff:ff promiscuity 0 minmtu 68 maxmtu 65535 addrgenmode eui64 numtxqueues 1\n";

    #[test]
    fn link_details_give_kind_and_alias() {
        assert_eq!(
            parse_link_details(OURS),
            (Some("dummy".into()), Some(LINK_ALIAS.into()))
        );
        assert_eq!(parse_link_details(ETH0), (None, None));
    }

    /// Issue 17: cleanup deletes only the link the agent created; `interface: eth0`
    /// must never take the node off the network.
    #[tokio::test]
    async fn cleanup_never_deletes_an_interface_the_agent_did_not_create() {
        let runner = RecordingRunner::new();
        runner.respond(&["ip", "-d", "-o", "link", "show"], CmdOutput::stdout(ETH0));
        runner.respond(
            &["ip", "-o", "addr", "show"],
            CmdOutput::stdout("2: eth0    inet 10.0.0.5/24 brd 10.0.0.255 scope global eth0\\       valid_lft forever\n"),
        );
        cleanup_network(&runner, "eth0").await.unwrap();
        assert!(
            !runner.commands().iter().any(|c| c.contains("del")),
            "{:?}",
            runner.commands()
        );
        // And setup refuses to take it over.
        let mut spec = dns();
        spec.interface = "eth0".into();
        let err = setup_network(&runner, &spec).await.unwrap_err();
        assert!(matches!(err, LocalDnsError::NotOurs { .. }), "{err}");
        assert!(err.to_string().contains("localDNS.interface"), "{err}");
    }
}
