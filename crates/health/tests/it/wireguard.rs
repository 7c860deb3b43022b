//! The data-plane check against a real WireGuard interface (wireguard-go) in a network
//! namespace the test creates: deleting the interface or taking it down withdraws
//! readiness within a check period, and repairing it restores readiness.

use std::process::{Command, Stdio};
use std::time::Duration;

use health::{NotReady, Tuning};
use tokio_util::sync::CancellationToken;

use crate::support::{eventually, get, start};

const DEV: &str = "wgh0";

/// A network namespace removed on drop (which also removes its interfaces and ends the
/// wireguard-go serving them).
struct Netns(String);

impl Netns {
    fn create() -> Netns {
        let name = format!("health-it-{}", std::process::id());
        run(&["netns", "add", &name]).expect("ip netns add (needs root)");
        Netns(name)
    }

    fn ip(&self, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["-n", self.0.as_str()];
        all.extend_from_slice(args);
        run(&all)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run(&["netns", "del", &self.0]);
    }
}

fn run(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

fn require_tools() {
    assert!(
        is_root(),
        "this test creates a network namespace and a WireGuard interface: run it as root"
    );
    for (tool, package) in [("ip", "iproute2"), ("wireguard-go", "wireguard-go")] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(found, "{tool} not found: apt-get install {package}");
    }
    assert!(
        std::path::Path::new("/dev/net/tun").exists(),
        "/dev/net/tun is missing: wireguard-go needs the tun device"
    );
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            == Some("0")
    })
}

/// Starts wireguard-go for DEV inside the namespace and brings the link up. wireguard-go
/// exits by itself when its interface is deleted.
async fn bring_up(ns: &Netns) -> tokio::process::Child {
    let child = tokio::process::Command::new("ip")
        .args(["netns", "exec", &ns.0, "wireguard-go", "-f", DEV])
        .env("WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start wireguard-go");
    eventually("wireguard-go created its interface", async || {
        ns.ip(&["link", "show", "dev", DEV]).is_ok()
    })
    .await;
    ns.ip(&["link", "set", DEV, "up"]).unwrap();
    child
}

/// The data-plane check an agent would install: the interface exists and is up.
fn link_up(ns: &str) -> Result<(), String> {
    let out = run(&["-n", ns, "-o", "link", "show", "dev", DEV])
        .map_err(|e| format!("interface {DEV} is missing: {e}"))?;
    let flags = out
        .split_once('<')
        .and_then(|(_, rest)| rest.split_once('>'))
        .map(|(flags, _)| flags)
        .ok_or_else(|| format!("cannot read the flags of {DEV} from {out:?}"))?;
    if flags.split(',').any(|f| f == "UP") {
        Ok(())
    } else {
        Err(format!("interface {DEV} is down"))
    }
}

fn check_failure(readiness: Result<(), NotReady>) -> Option<String> {
    match readiness {
        Err(NotReady::DataPlaneCheckFailed { reason }) => Some(reason),
        _ => None,
    }
}

#[tokio::test]
async fn a_deleted_or_downed_wireguard_interface_withdraws_readiness() {
    require_tools();
    let ns = Netns::create();
    let mut wg = bring_up(&ns).await;

    let r = start(Tuning {
        check_period: Duration::from_millis(200),
        ..Tuning::default()
    })
    .await;
    r.server.set_registered();
    r.server.set_data_plane_ready();
    let cancel = CancellationToken::new();
    let name = ns.0.clone();
    r.server
        .set_data_plane_check_blocking(cancel.clone(), move || link_up(&name));
    eventually("ready with the interface up", async || r.server.is_ready()).await;
    assert_eq!(get(r.addr, "/readyz").await.body, b"ok");

    // An admin takes the link down: not ready, and the reason is only in the log.
    ns.ip(&["link", "set", DEV, "down"]).unwrap();
    eventually("not ready while the link is down", async || {
        check_failure(r.server.readiness()).is_some_and(|reason| reason.contains("is down"))
    })
    .await;
    let reply = get(r.addr, "/readyz").await;
    assert_eq!(
        (reply.status, reply.body.as_slice()),
        (503, &b"not ready"[..])
    );
    ns.ip(&["link", "set", DEV, "up"]).unwrap();
    eventually("ready again once the link is up", async || {
        r.server.is_ready()
    })
    .await;

    // The interface is deleted outright (the latch alone would still say ready).
    ns.ip(&["link", "del", DEV]).unwrap();
    eventually("not ready once the interface is gone", async || {
        check_failure(r.server.readiness()).is_some_and(|reason| reason.contains("missing"))
    })
    .await;
    assert_eq!(get(r.addr, "/readyz").await.status, 503);
    let _ = tokio::time::timeout(Duration::from_secs(5), wg.wait()).await;

    // Repaired: readiness comes back without any other signal.
    let _wg = bring_up(&ns).await;
    eventually("ready again after the interface is recreated", async || {
        r.server.is_ready()
    })
    .await;
    assert_eq!(get(r.addr, "/readyz").await.status, 200);
    cancel.cancel();
    r.stop().await;
}
