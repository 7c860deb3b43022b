//! After an upgrade restarts the kubelet, `systemctl restart` exiting 0 only says systemd
//! started the process. Settling waits until the unit is active AND the kubelet answers
//! its healthz endpoint, and keeps checking for a hold period so a kubelet that starts
//! and then crashes on the new configuration is caught; the caller rolls back otherwise.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use crate::runner::{Cmd, Runner};

/// The kubelet's default healthz port.
pub const DEFAULT_HEALTHZ_PORT: u16 = 10248;

/// How often the unit and healthz are checked while settling.
const POLL: Duration = Duration::from_millis(500);

/// One healthz request's budget.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// The kubelet did not settle.
#[derive(Debug, thiserror::Error)]
#[error(
    "{unit} did not settle within {waited:?} (last check: {last}); look at journalctl -u {unit}"
)]
pub struct SettleError {
    /// The kubelet unit.
    pub unit: String,
    /// How long it was given.
    pub waited: Duration,
    /// What the last check saw.
    pub last: String,
}

/// Where the kubelet's healthz endpoint listens, from its KubeletConfiguration
/// (`healthzBindAddress`, default 127.0.0.1; `healthzPort`, default 10248). `None` when
/// the configuration turns it off (`healthzPort: 0`). A wildcard bind address is asked
/// on loopback.
pub fn healthz_addr(kubelet_config: &serde_yaml::Value) -> Option<SocketAddr> {
    let port = match kubelet_config.get("healthzPort") {
        None => DEFAULT_HEALTHZ_PORT,
        Some(v) => u16::try_from(v.as_u64().unwrap_or(u64::from(DEFAULT_HEALTHZ_PORT)))
            .unwrap_or(DEFAULT_HEALTHZ_PORT),
    };
    if port == 0 {
        return None;
    }
    let ip = kubelet_config
        .get("healthzBindAddress")
        .and_then(|v| v.as_str())
        .and_then(|s| s.parse::<std::net::IpAddr>().ok())
        .filter(|ip| !ip.is_unspecified())
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
    Some(SocketAddr::new(ip, port))
}

/// Waits up to `timeout` for `unit` to be active and `healthz` (when given) to answer
/// 200, then requires both to stay so for `hold` (checked every half second). A check
/// that fails during the hold starts it over, within the same overall deadline of
/// `timeout + hold`.
pub async fn settle_kubelet(
    runner: &dyn Runner,
    unit: &str,
    healthz: Option<SocketAddr>,
    timeout: Duration,
    hold: Duration,
) -> Result<(), SettleError> {
    let start = Instant::now();
    let deadline = start + timeout + hold;
    let mut healthy_since: Option<Instant> = None;
    let mut last;
    loop {
        last = match check(runner, unit, healthz).await {
            Ok(()) => {
                let since = *healthy_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= hold {
                    tracing::info!(unit, "kubelet settled");
                    return Ok(());
                }
                "healthy, holding".to_string()
            }
            Err(why) => {
                if healthy_since.take().is_some() {
                    tracing::warn!(unit, %why, "kubelet became unhealthy while settling");
                }
                why
            }
        };
        if Instant::now() + POLL > deadline {
            return Err(SettleError {
                unit: unit.into(),
                waited: start.elapsed(),
                last,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn check(runner: &dyn Runner, unit: &str, healthz: Option<SocketAddr>) -> Result<(), String> {
    let out = runner
        .output(&Cmd::new("systemctl", ["is-active", "--", unit]))
        .await
        .map_err(|e| crate::error_chain(&e))?;
    let state = out.stdout.lines().next().unwrap_or("").trim().to_string();
    if state != "active" {
        return Err(format!(
            "unit is {}",
            if state.is_empty() {
                "in an unknown state"
            } else {
                &state
            }
        ));
    }
    if let Some(addr) = healthz {
        match tokio::time::timeout(REQUEST_TIMEOUT, get_status(addr)).await {
            Ok(Ok(200)) => {}
            Ok(Ok(code)) => return Err(format!("healthz on {addr} answered {code}")),
            Ok(Err(e)) => return Err(format!("healthz on {addr}: {e}")),
            Err(_) => {
                return Err(format!(
                    "healthz on {addr} did not answer within {REQUEST_TIMEOUT:?}"
                ));
            }
        }
    }
    Ok(())
}

/// `GET /healthz` over plain HTTP/1.0; returns the status code.
async fn get_status(addr: SocketAddr) -> std::io::Result<u16> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET /healthz HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut head = Vec::new();
    let mut buf = [0u8; 256];
    while !head.contains(&b'\n') && head.len() < 1024 {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    line.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other("not an HTTP response"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::{CmdOutput, RecordingRunner};

    #[test]
    fn healthz_address_from_the_kubelet_configuration() {
        let cfg = |text: &str| serde_yaml::from_str::<serde_yaml::Value>(text).unwrap();
        assert_eq!(
            healthz_addr(&cfg("kind: KubeletConfiguration")),
            Some("127.0.0.1:10248".parse().unwrap())
        );
        assert_eq!(healthz_addr(&cfg("healthzPort: 0")), None);
        assert_eq!(
            healthz_addr(&cfg("{healthzPort: 9999, healthzBindAddress: 0.0.0.0}")),
            Some("127.0.0.1:9999".parse().unwrap())
        );
        assert_eq!(
            healthz_addr(&cfg("{healthzBindAddress: '::1'}")),
            Some("[::1]:10248".parse().unwrap())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_unit_that_never_gets_active_does_not_settle() {
        let runner = RecordingRunner::new();
        runner.respond(
            &["systemctl", "is-active"],
            CmdOutput::failed(3, "").clone(),
        );
        let err = settle_kubelet(
            &runner,
            "kubelet.service",
            None,
            Duration::from_secs(10),
            Duration::from_secs(2),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("unknown state"), "{err}");
        assert!(
            err.to_string().contains("journalctl -u kubelet.service"),
            "{err}"
        );
    }
}
