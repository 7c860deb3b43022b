//! The tunnel supervisor: runs the exact `ssh -R` that `outpost-agent tunnel-config
//! --format ssh` renders ([`nodeaddr::tunnel::SshTunnel`]), restarts it with exponential
//! backoff when it exits, and reports its state to the log, the metrics, `/status`, and a
//! Kubernetes Event on the Node each time it exits.
//!
//! The bind address is resolved at each start (the reconciler's assignment, read from the
//! Nodes, unless `tunnel.remoteBind` pins it), so a restarted tunnel follows a changed
//! assignment. A start that ran longer than `maxRestartBackoff` resets the backoff.

use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use nodeaddr::tunnel::SshTunnel;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::TunnelConfig;
use crate::dataplane::DataPlaneError;

/// How long a stopping tunnel gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// How long one remote-port probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the supervisor reports.
#[derive(Clone, Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TunnelStatus {
    /// The ssh process runs.
    pub running: bool,
    /// Its pid, while it runs.
    pub pid: Option<u32>,
    /// Times it was restarted after an exit.
    pub restarts: u64,
    /// The command line it runs (as `tunnel-config` prints it).
    pub command: Option<String>,
    /// How the last run ended.
    pub last_exit: Option<String>,
}

/// The supervisor's shared state and metrics. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct TunnelHandle {
    status: Arc<Mutex<TunnelStatus>>,
    probe: Arc<Mutex<Option<SshTunnel>>>,
    /// `outpost_agent_tunnel_up`.
    pub up: Gauge,
    /// `outpost_agent_tunnel_restarts_total`.
    pub restarts: Counter,
}

impl TunnelHandle {
    /// A snapshot of the state.
    pub fn status(&self) -> TunnelStatus {
        self.status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn update(&self, change: impl FnOnce(&mut TunnelStatus)) {
        let mut st = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        change(&mut st);
        self.up.set(i64::from(st.running));
    }

    /// The `tunnel` data-plane check: the ssh process runs, and an `ssh -W` through the
    /// same server reaches the forwarded port on the control-plane host.
    pub async fn check(&self) -> Result<(), DataPlaneError> {
        if !self.status().running {
            return Err(DataPlaneError::TunnelDown);
        }
        let Some(tunnel) = self
            .probe
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        else {
            return Err(DataPlaneError::TunnelDown);
        };
        let remote = format!("{}:{}", tunnel.bind, tunnel.port);
        let argv = tunnel.probe_argv();
        let fail = |reason: String| DataPlaneError::TunnelProbe {
            remote: remote.clone(),
            reason,
        };
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .map_err(|e| fail(format!("cannot run ssh: {e}")))?;
        match tokio::time::timeout(PROBE_TIMEOUT, child.wait_with_output()).await {
            Err(_) => Err(fail(format!(
                "no answer within {}",
                humantime::format_duration(PROBE_TIMEOUT)
            ))),
            Ok(Err(e)) => Err(fail(e.to_string())),
            Ok(Ok(out)) if out.status.success() => Ok(()),
            Ok(Ok(out)) => Err(fail(
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("ssh failed")
                    .to_string(),
            )),
        }
    }
}

/// Supervises the tunnel until `cancel`; then stops it (SIGTERM, SIGKILL after 2 s) and
/// returns.
pub async fn supervise(
    config: TunnelConfig,
    node_name: String,
    client: kube::Client,
    handle: TunnelHandle,
    cancel: CancellationToken,
) {
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "outpost-agent".into(),
            instance: Some(node_name.clone()),
        },
    );
    let node_ref = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node_name.clone()),
        ..Default::default()
    };
    let mut backoff = config.restart_backoff;
    loop {
        let tunnel = resolve(&config, &node_name, Some(&client)).await;
        let command = tunnel.render().trim_end().to_string();
        *handle.probe.lock().unwrap_or_else(PoisonError::into_inner) = Some(tunnel.clone());
        let argv = tunnel.argv();
        let started = tokio::time::Instant::now();
        let outcome = match spawn(&argv) {
            Ok(child) => {
                let pid = child.id();
                info!(node = %node_name, pid, %command, "tunnel started");
                handle.update(|st| {
                    st.running = true;
                    st.pid = pid;
                    st.command = Some(command.clone());
                });
                run_one(child, &cancel).await
            }
            Err(e) => Some(format!("could not start ssh: {e}")),
        };
        handle.update(|st| {
            st.running = false;
            st.pid = None;
            st.last_exit = outcome.clone();
        });
        let Some(how) = outcome else {
            info!(node = %node_name, "tunnel stopped for shutdown");
            return;
        };
        backoff = restart_delay(backoff, started.elapsed(), &config);
        handle.restarts.inc();
        handle.update(|st| st.restarts += 1);
        warn!(
            node = %node_name,
            exit = %how,
            retry_in = %humantime::format_duration(backoff),
            "tunnel exited; restarting"
        );
        let event = Event {
            type_: EventType::Warning,
            reason: "TunnelExited".into(),
            note: Some(format!(
                "the ssh tunnel publishing this node's kubelet exited ({how}); restarting in {}",
                humantime::format_duration(backoff)
            )),
            action: "SuperviseTunnel".into(),
            secondary: None,
        };
        tokio::select! {
            r = recorder.publish(&event, &node_ref) => if let Err(e) = r {
                warn!(node = %node_name, error = %e, "cannot record the TunnelExited Event");
            },
            () = cancel.cancelled() => return,
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = cancel.cancelled() => return,
        }
        backoff = backoff.saturating_mul(2).min(config.max_restart_backoff);
    }
}

/// The delay before the next start: the current backoff, or the first one again when the
/// run that just ended lasted at least `maxRestartBackoff` (it was healthy, and this exit
/// is a new incident, not the same one repeating).
pub fn restart_delay(current: Duration, ran_for: Duration, config: &TunnelConfig) -> Duration {
    if ran_for >= config.max_restart_backoff {
        config.restart_backoff
    } else {
        current
    }
}

/// The tunnel `run` starts for this configuration: the configured bind address, else the
/// one the reconciler assigns (read with `client`), else the first candidate derived from
/// the name (logged). `outpost-agent tunnel-config --config F` prints the same.
pub async fn resolve(
    config: &TunnelConfig,
    node_name: &str,
    client: Option<&kube::Client>,
) -> SshTunnel {
    let range = nodeaddr::PortRange::new(config.port_base, config.port_slots)
        .unwrap_or(nodeaddr::PortRange::DEFAULT);
    // Validated at load.
    let (host, ssh_port) = nodeaddr::tunnel::split_host_port(&config.server)
        .unwrap_or_else(|_| (config.server.clone(), 22));
    let found = match (config.remote_bind, client) {
        (Some(ip), _) => Ok(ip),
        (None, Some(client)) => nodeaddr::bind_address(client.clone(), node_name, range)
            .await
            .map(|f| f.address)
            .map_err(|e| nodeaddr::error_chain(&e)),
        (None, None) => Err("no client to read the Nodes with".to_string()),
    };
    let bind = match found {
        Ok(ip) => ip,
        Err(e) => {
            let ip = nodeaddr::loopback_candidate(node_name);
            warn!(
                node = %node_name,
                error = %e,
                "cannot read the address the reconciler assigns; binding the first candidate {ip}"
            );
            ip
        }
    };
    SshTunnel {
        user: config.user.clone(),
        host,
        ssh_port,
        bind,
        port: range.port_for(node_name),
        identity_file: config.identity_file.clone(),
        known_hosts: config.known_hosts.clone(),
    }
}

fn spawn(argv: &[String]) -> std::io::Result<Child> {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd.spawn()
}

/// Waits for the child to exit (`Some(how)`) or for shutdown (`None`, child stopped).
async fn run_one(mut child: Child, cancel: &CancellationToken) -> Option<String> {
    let pid = child.id();
    let stderr = child.stderr.take().map(|s| {
        tokio::spawn(async move {
            let mut lines = BufReader::new(s).lines();
            let mut last = None;
            while let Ok(Some(line)) = lines.next_line().await {
                warn!(pid, "ssh: {line}");
                last = Some(line);
            }
            last
        })
    });
    let status = tokio::select! {
        status = child.wait() => status,
        () = cancel.cancelled() => {
            stop(&mut child).await;
            if let Some(task) = stderr {
                task.abort();
            }
            return None;
        }
    };
    let last = match stderr {
        Some(task) => tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .ok()
            .and_then(Result::ok)
            .flatten(),
        None => None,
    };
    let how = match status {
        Ok(s) => s.to_string(),
        Err(e) => format!("cannot wait for ssh: {e}"),
    };
    Some(match last {
        Some(line) => format!("{how}: {line}"),
        None => how,
    })
}

async fn stop(child: &mut Child) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
        if tokio::time::timeout(STOP_GRACE, child.wait()).await.is_ok() {
            return;
        }
    }
    let _ = child.kill().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> TunnelConfig {
        crate::AgentConfig::parse(
            "nodeName: w1\ntunnel: {server: 'cp:22', restartBackoff: 1s, maxRestartBackoff: 8s}\n",
            std::path::Path::new("t.yaml"),
        )
        .unwrap()
        .tunnel
        .unwrap()
    }

    #[test]
    fn the_backoff_doubles_to_the_cap_and_resets_after_a_long_run() {
        let c = config();
        let s = Duration::from_secs;
        let mut delays = Vec::new();
        let mut backoff = c.restart_backoff;
        for _ in 0..6 {
            backoff = restart_delay(backoff, s(0), &c);
            delays.push(backoff.as_secs());
            backoff = backoff.saturating_mul(2).min(c.max_restart_backoff);
        }
        assert_eq!(delays, [1, 2, 4, 8, 8, 8]);
        assert_eq!(restart_delay(s(8), s(8), &c), s(1));
        assert_eq!(restart_delay(s(8), s(7), &c), s(8));
    }

    #[tokio::test]
    async fn a_stopped_tunnel_fails_the_check() {
        let h = TunnelHandle::default();
        assert!(matches!(h.check().await, Err(DataPlaneError::TunnelDown)));
        assert_eq!(h.status().restarts, 0);
    }
}
