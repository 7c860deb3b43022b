//! LocalDNS in a network namespace: the real `ip` steps, a real dnsmasq on the listener
//! address, and real queries from inside the namespace.

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hostnode::BoxFuture;
use hostnode::goalstate::{InterfaceKind, LocalDns};
use hostnode::localdns::{self, LocalDnsError};
use hostnode::runner::{Cmd, CmdOutput, HostRunner, RunError, Runner};

use crate::support::{require_program, require_root, sh};

/// A network namespace, deleted on drop (with the dnsmasq started in it).
struct Netns {
    name: String,
    dnsmasq: Option<Child>,
}

impl Netns {
    fn new(tag: &str) -> Self {
        let name = format!("hn-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        sh("ip", &["netns", "add", &name]);
        sh(
            "ip",
            &["netns", "exec", &name, "ip", "link", "set", "lo", "up"],
        );
        Self {
            name,
            dnsmasq: None,
        }
    }

    fn start_dnsmasq(&mut self, listen: &str) {
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.name,
                "dnsmasq",
                "--no-daemon",
                "--conf-file=/dev/null",
            ])
            .arg(format!("--listen-address={listen}"))
            .args([
                "--bind-interfaces",
                "--address=/test/1.2.3.4",
                "--no-resolv",
                "--no-hosts",
                "--port=53",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start dnsmasq");
        self.dnsmasq = Some(child);
    }

    /// Runs `fut` on a thread that has entered the namespace: setns(CLONE_NEWNET)
    /// changes only the calling thread, so the test harness's other threads stay out.
    fn run_inside<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = T> + Send + 'static,
    ) -> T {
        let path = format!("/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).unwrap();
            nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(fut)
        })
        .join()
        .unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Some(mut child) = self.dnsmasq.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Runs every command inside the namespace (`ip netns exec NAME ...`) and records them.
struct InNetns {
    netns: String,
    recorded: Arc<Mutex<Vec<String>>>,
}

impl Runner for InNetns {
    fn output<'a>(&'a self, cmd: &'a Cmd) -> BoxFuture<'a, Result<CmdOutput, RunError>> {
        self.recorded.lock().unwrap().push(cmd.to_string());
        let mut args = vec![
            "netns".to_string(),
            "exec".into(),
            self.netns.clone(),
            cmd.program.clone(),
        ];
        args.extend(cmd.args.iter().cloned());
        let wrapped = Cmd::new("ip", args);
        Box::pin(async move { HostRunner::new().output(&wrapped).await })
    }
}

/// The dummy driver when the kernel has it; otherwise a port-less bridge, which carries
/// addresses the same way (some CI kernels are built without dummy).
fn interface_kind(netns: &str) -> InterfaceKind {
    let probe = Command::new("ip")
        .args([
            "netns", "exec", netns, "ip", "link", "add", "hn-probe", "type", "dummy",
        ])
        .output()
        .unwrap();
    if probe.status.success() {
        sh(
            "ip",
            &["netns", "exec", netns, "ip", "link", "del", "hn-probe"],
        );
        InterfaceKind::Dummy
    } else {
        eprintln!(
            "kernel has no dummy link driver ({}); using a bridge",
            String::from_utf8_lossy(&probe.stderr).trim()
        );
        InterfaceKind::Bridge
    }
}

fn spec(kind: InterfaceKind) -> LocalDns {
    LocalDns {
        interface: "outpost-dns".into(),
        interface_kind: kind,
        listeners: vec![
            "169.254.20.10".parse().unwrap(),
            "169.254.20.11".parse().unwrap(),
        ],
        port: 53,
        probe_name: "probe.test.".into(),
        ready_timeout_seconds: 5,
    }
}

#[test]
fn network_setup_is_idempotent_and_dnsmasq_answers() {
    require_root("LocalDNS in a network namespace");
    require_program("ip", "iproute2");
    require_program("dnsmasq", "dnsmasq-base");
    let mut netns = Netns::new("dns");
    let dns = spec(interface_kind(&netns.name));
    let recorded = Arc::new(Mutex::new(Vec::new()));
    let runner = InNetns {
        netns: netns.name.clone(),
        recorded: recorded.clone(),
    };
    let rt = tokio::runtime::Runtime::new().unwrap();

    rt.block_on(localdns::setup_network(&runner, &dns)).unwrap();
    let first = std::mem::take(&mut *recorded.lock().unwrap());
    assert!(
        first
            .iter()
            .any(|c| c.starts_with("ip link add outpost-dns type")),
        "{first:?}"
    );
    let addrs = sh(
        "ip",
        &[
            "netns",
            "exec",
            &netns.name,
            "ip",
            "-o",
            "addr",
            "show",
            "dev",
            "outpost-dns",
        ],
    );
    assert!(
        addrs.contains("169.254.20.10/32") && addrs.contains("169.254.20.11/32"),
        "{addrs}"
    );

    // Steady state: only reads.
    rt.block_on(localdns::setup_network(&runner, &dns)).unwrap();
    let second = std::mem::take(&mut *recorded.lock().unwrap());
    assert_eq!(
        second,
        [
            "ip -d -o link show dev outpost-dns",
            "ip -o addr show dev outpost-dns"
        ]
    );

    // dnsmasq on the first listener only. Started after the wait begins would work too;
    // the wait retries until it answers.
    netns.start_dnsmasq("169.254.20.10");
    let first_listener: SocketAddr = "169.254.20.10:53".parse().unwrap();
    let answered = netns
        .run_inside(async move {
            localdns::await_local_dns(&[first_listener], "probe.test.", Duration::from_secs(10))
                .await
        })
        .unwrap();
    assert_eq!(answered.len(), 1);
    assert_eq!(answered[0].rcode, "No Error");
    assert_eq!(answered[0].answers, ["1.2.3.4"]);

    // The second listener has its address but nothing serving: the deadline error names it.
    let both = dns.listener_addrs();
    let started = std::time::Instant::now();
    let err = netns
        .run_inside(async move {
            localdns::await_local_dns(&both, "probe.test.", Duration::from_millis(1500)).await
        })
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10));
    match &err {
        LocalDnsError::NeverAnswered { listener, .. } => {
            assert_eq!(listener.to_string(), "169.254.20.11:53", "{err}")
        }
        other => panic!("expected NeverAnswered, got {other}"),
    }
    assert!(err.to_string().contains("169.254.20.11:53"), "{err}");

    rt.block_on(localdns::cleanup_network(&runner, "outpost-dns"))
        .unwrap();
    rt.block_on(localdns::cleanup_network(&runner, "outpost-dns"))
        .unwrap();
    let gone = Command::new("ip")
        .args([
            "netns",
            "exec",
            &netns.name,
            "ip",
            "link",
            "show",
            "outpost-dns",
        ])
        .output()
        .unwrap();
    assert!(!gone.status.success(), "the interface is still there");
}

/// A DNS responder on loopback that answers SERVFAIL to the first `servfail` queries,
/// then NOERROR with 10.0.0.53.
async fn responder(servfail: usize) -> SocketAddr {
    use hickory_proto::op::{Message, MessageType, ResponseCode};
    use hickory_proto::rr::{RData, Record, rdata::A};
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 512];
        let mut seen = 0;
        loop {
            let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                return;
            };
            let query = Message::from_vec(&buf[..n]).unwrap();
            let mut reply = Message::new();
            reply
                .set_id(query.id())
                .set_message_type(MessageType::Response)
                .add_queries(query.queries().to_vec());
            if seen < servfail {
                reply.set_response_code(ResponseCode::ServFail);
            } else {
                let name = query.queries()[0].name().clone();
                reply.add_answer(Record::from_rdata(name, 30, RData::A(A::new(10, 0, 0, 53))));
            }
            seen += 1;
            socket
                .send_to(&reply.to_vec().unwrap(), from)
                .await
                .unwrap();
        }
    });
    addr
}

#[tokio::test]
async fn servfail_is_not_ready_and_the_wait_goes_on() {
    let listener = responder(2).await;
    let answered = localdns::await_local_dns(
        &[listener],
        "kubernetes.default.svc.cluster.local.",
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert_eq!(answered[0].answers, ["10.0.0.53"]);
}

#[tokio::test(start_paused = true)]
async fn a_silent_listener_hits_the_deadline_in_paused_time() {
    // Bound but never answering: every attempt times out, and the clock is virtual, so
    // a 60 s deadline costs no real time.
    let silent = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let listener = silent.local_addr().unwrap();
    let started = tokio::time::Instant::now();
    let err = localdns::await_local_dns(&[listener], "probe.test.", Duration::from_secs(60))
        .await
        .unwrap_err();
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(60) && waited < Duration::from_secs(61),
        "{waited:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(&listener.to_string()) && msg.contains("no answer within"),
        "{msg}"
    );
    drop(silent);
}

/// Issue 17: `node down`/`reset` clean up the LocalDNS interface by name; configured as
/// `eth0`, the old cleanup deleted the node's uplink. Only the link the agent created
/// (it carries the agent's alias) is deleted; anything else of that name stays, and
/// setup refuses to take it over.
#[test]
fn cleanup_never_deletes_an_interface_the_agent_did_not_create() {
    require_root("LocalDNS in a network namespace");
    require_program("ip", "iproute2");
    let netns = Netns::new("eth0");
    sh(
        "ip",
        &[
            "netns",
            "exec",
            &netns.name,
            "ip",
            "link",
            "add",
            "eth0",
            "type",
            "veth",
            "peer",
            "name",
            "eth1",
        ],
    );
    sh(
        "ip",
        &[
            "netns",
            "exec",
            &netns.name,
            "ip",
            "addr",
            "add",
            "10.9.0.5/24",
            "dev",
            "eth0",
        ],
    );
    let runner = InNetns {
        netns: netns.name.clone(),
        recorded: Arc::new(Mutex::new(Vec::new())),
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(localdns::cleanup_network(&runner, "eth0"))
        .unwrap();
    let show = |dev: &str| {
        Command::new("ip")
            .args(["netns", "exec", &netns.name, "ip", "link", "show", dev])
            .output()
            .unwrap()
            .status
            .success()
    };
    assert!(show("eth0"), "cleanup deleted eth0");

    let mut dns = spec(InterfaceKind::Bridge);
    dns.interface = "eth0".into();
    let err = rt
        .block_on(localdns::setup_network(&runner, &dns))
        .unwrap_err();
    assert!(matches!(err, LocalDnsError::NotOurs { .. }), "{err}");
    assert!(show("eth0"));

    // What the agent creates, it removes.
    let ours = spec(interface_kind(&netns.name));
    rt.block_on(localdns::setup_network(&runner, &ours))
        .unwrap();
    assert!(show("outpost-dns"));
    rt.block_on(localdns::cleanup_network(&runner, "outpost-dns"))
        .unwrap();
    assert!(!show("outpost-dns"), "the agent's own interface stayed");
}
