//! The data-plane checks readiness waits for (`dataPlane.check`).
//!
//! - `wireguard`: the interface exists and is administratively up (`IFF_UP`, read
//!   with getifaddrs in the agent's network namespace), and its newest peer handshake
//!   (`wg show <if> latest-handshakes`) is younger than `maxHandshakeAge`. A WireGuard
//!   interface with no live peer is up in every other sense and forwards nothing.
//! - `tunnel`: the supervised tunnel runs and its remote port answers (see
//!   [`crate::tunnel`]).
//!
//! The pure parts ([`newest_handshake`], [`judge_handshake`]) are unit tested; the
//! component test runs a real wireguard-go pair.

use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Why the data plane is not up. The text goes to the log, never into a probe body.
#[derive(Debug, thiserror::Error)]
pub enum DataPlaneError {
    /// No such interface.
    #[error("WireGuard interface {interface} does not exist")]
    Missing {
        /// The interface.
        interface: String,
    },
    /// The interface flags could not be read.
    #[error("cannot read the flags of interface {interface}")]
    Flags {
        /// The interface.
        interface: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The interface is down.
    #[error("WireGuard interface {interface} is down")]
    Down {
        /// The interface.
        interface: String,
    },
    /// `wg` could not be run.
    #[error("cannot run `wg show {interface} latest-handshakes` (apt-get install wireguard-tools)")]
    WgSpawn {
        /// The interface.
        interface: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `wg` failed.
    #[error("`wg show {interface} latest-handshakes` failed: {stderr}")]
    WgFailed {
        /// The interface.
        interface: String,
        /// What wg said.
        stderr: String,
    },
    /// No peer ever completed a handshake.
    #[error("WireGuard interface {interface} has no peer handshake yet")]
    NoHandshake {
        /// The interface.
        interface: String,
    },
    /// The newest handshake is too old.
    #[error(
        "WireGuard interface {interface}: newest peer handshake is {} old, older than \
         maxHandshakeAge {}",
        humantime::format_duration(*age),
        humantime::format_duration(*max)
    )]
    Stale {
        /// The interface.
        interface: String,
        /// The newest handshake's age.
        age: Duration,
        /// The allowed age.
        max: Duration,
    },
    /// The supervised tunnel is not running.
    #[error("the tunnel is not running (see the tunnel log lines)")]
    TunnelDown,
    /// The tunnel's remote port did not answer.
    #[error("the tunnel's remote port {remote} does not answer: {reason}")]
    TunnelProbe {
        /// bind:port on the control-plane host.
        remote: String,
        /// What the probe reported.
        reason: String,
    },
}

/// The newest handshake time (Unix seconds) in `wg show <if> latest-handshakes` output:
/// one `<public key>\t<seconds>` line per peer, 0 for a peer that never shook hands.
/// `None` when no peer ever did.
pub fn newest_handshake(output: &str) -> Option<u64> {
    output
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter_map(|t| t.parse::<u64>().ok())
        .filter(|t| *t > 0)
        .max()
}

/// Whether the newest handshake at `newest` (Unix seconds) is recent enough at `now`.
pub fn judge_handshake(
    interface: &str,
    newest: Option<u64>,
    now: u64,
    max: Duration,
) -> Result<(), DataPlaneError> {
    let Some(newest) = newest else {
        return Err(DataPlaneError::NoHandshake {
            interface: interface.to_string(),
        });
    };
    // A handshake stamped in the future (clock step) counts as fresh.
    let age = Duration::from_secs(now.saturating_sub(newest));
    if age > max {
        return Err(DataPlaneError::Stale {
            interface: interface.to_string(),
            age,
            max,
        });
    }
    Ok(())
}

/// The `wireguard` check (blocking: reads sysfs and runs `wg`).
pub fn wireguard_check(interface: &str, max_age: Duration) -> Result<(), DataPlaneError> {
    // getifaddrs (netlink) answers for the caller's network namespace; /sys/class/net
    // answers for the namespace sysfs was mounted in, which need not be the same.
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| DataPlaneError::Flags {
        interface: interface.to_string(),
        source: std::io::Error::from(e),
    })?;
    let mut found = false;
    let mut up = false;
    for a in addrs.filter(|a| a.interface_name == interface) {
        found = true;
        up |= a.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP);
    }
    if !found {
        return Err(DataPlaneError::Missing {
            interface: interface.to_string(),
        });
    }
    if !up {
        return Err(DataPlaneError::Down {
            interface: interface.to_string(),
        });
    }
    let out = Command::new("wg")
        .args(["show", interface, "latest-handshakes"])
        .output()
        .map_err(|source| DataPlaneError::WgSpawn {
            interface: interface.to_string(),
            source,
        })?;
    if !out.status.success() {
        return Err(DataPlaneError::WgFailed {
            interface: interface.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    judge_handshake(
        interface,
        newest_handshake(&String::from_utf8_lossy(&out.stdout)),
        now,
        max_age,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_nonzero_handshake_counts() {
        let out = "AAA=\t0\nBBB=\t1700000000\nCCC=\t1700000100\n";
        assert_eq!(newest_handshake(out), Some(1_700_000_100));
        assert_eq!(newest_handshake("AAA=\t0\n"), None);
        assert_eq!(newest_handshake(""), None);
    }

    #[test]
    fn handshakes_are_judged_by_age() {
        let max = Duration::from_secs(180);
        judge_handshake("wg0", Some(1000), 1180, max).unwrap();
        judge_handshake("wg0", Some(2000), 1000, max).unwrap();
        let err = judge_handshake("wg0", Some(1000), 1181, max).unwrap_err();
        assert!(err.to_string().contains("3m 1s old"), "{err}");
        assert!(matches!(
            judge_handshake("wg0", None, 1, max),
            Err(DataPlaneError::NoHandshake { .. })
        ));
    }

    #[test]
    fn a_missing_interface_is_named() {
        let err = wireguard_check("nosuchif0", Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, DataPlaneError::Missing { .. }), "{err}");
        assert!(err.to_string().contains("nosuchif0"));
    }
}
