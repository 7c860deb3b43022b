//! Whether a slot's node stack is up, asked of the isolation backend that runs it.

use crate::BoxFuture;
use crate::runner::{Cmd, RunError, Runner};

/// A slot of a node: the units that make up its stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotRef {
    /// The slot name (empty: the base).
    pub slot: String,
    /// The stack's units, in start order.
    pub units: Vec<String>,
}

/// A backend could not tell.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The backend's tool could not be asked (not "not running": unknown).
    #[error("cannot tell whether {unit} is running")]
    CouldNotAsk {
        /// The unit asked about.
        unit: String,
        /// Why.
        #[source]
        source: RunError,
    },
}

/// Where a node stack runs (the host itself, a container, a machine).
pub trait IsolationBackend: Send + Sync {
    /// The mode's name (`none` for the host).
    fn name(&self) -> &'static str;
    /// Whether every unit of the slot's stack is active.
    fn running<'a>(&'a self, slot: &'a SlotRef) -> BoxFuture<'a, Result<bool, BackendError>>;
    /// Each unit with its state word (`active`, `inactive`, `failed`, ...).
    fn unit_states<'a>(
        &'a self,
        slot: &'a SlotRef,
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, BackendError>>;
}

/// Whether the slot's stack is up.
pub async fn running(backend: &dyn IsolationBackend, slot: &SlotRef) -> Result<bool, BackendError> {
    backend.running(slot).await
}

/// Whether a stack whose units are in these states runs: at least one unit, and every
/// one `active` (or `reloading`, which is active with a reload in flight). The one
/// predicate [`HostBackend::running`] and a status report both use.
pub fn stack_running(states: &[(String, String)]) -> bool {
    !states.is_empty()
        && states
            .iter()
            .all(|(_, s)| s == "active" || s == "reloading")
}

/// The host (`none`) mode: the stack runs as systemd units on the host, asked with
/// `systemctl is-active`.
#[derive(Clone, Debug)]
pub struct HostBackend<R> {
    runner: R,
}

impl<R: Runner> HostBackend<R> {
    /// A backend asking through `runner`.
    pub fn new(runner: R) -> Self {
        Self { runner }
    }

    async fn state(&self, unit: &str) -> Result<String, BackendError> {
        let cmd = Cmd::new("systemctl", ["is-active", "--", unit]);
        let out = self
            .runner
            .output(&cmd)
            .await
            .map_err(|source| BackendError::CouldNotAsk {
                unit: unit.into(),
                source,
            })?;
        let word = out.stdout.lines().next().unwrap_or("").trim().to_string();
        // is-active exits non-zero for every state but active, so the exit code alone
        // cannot tell "inactive" from "cannot reach systemd"; the printed state can.
        const STATES: &[&str] = &[
            "active",
            "reloading",
            "inactive",
            "failed",
            "activating",
            "deactivating",
            "maintenance",
            "refreshing",
        ];
        if STATES.contains(&word.as_str()) {
            Ok(word)
        } else {
            Err(BackendError::CouldNotAsk {
                unit: unit.into(),
                source: RunError::Failed {
                    command: cmd.to_string(),
                    status: out
                        .code
                        .map_or("killed by a signal".into(), |c| format!("exit status {c}")),
                    stderr: out.stderr.trim().to_string(),
                    stdout: out.stdout,
                },
            })
        }
    }
}

impl<R: Runner> IsolationBackend for HostBackend<R> {
    fn name(&self) -> &'static str {
        "none"
    }

    fn running<'a>(&'a self, slot: &'a SlotRef) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move { Ok(stack_running(&self.unit_states(slot).await?)) })
    }

    fn unit_states<'a>(
        &'a self,
        slot: &'a SlotRef,
    ) -> BoxFuture<'a, Result<Vec<(String, String)>, BackendError>> {
        Box::pin(async move {
            let mut states = Vec::new();
            for unit in &slot.units {
                states.push((unit.clone(), self.state(unit).await?));
            }
            Ok(states)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::{CmdOutput, RecordingRunner};

    fn slot() -> SlotRef {
        SlotRef {
            slot: String::new(),
            units: vec!["containerd.service".into(), "kubelet.service".into()],
        }
    }

    #[tokio::test]
    async fn all_active_is_running() {
        let runner = RecordingRunner::new();
        runner.respond(&["systemctl", "is-active"], CmdOutput::stdout("active\n"));
        assert!(
            running(&HostBackend::new(runner.clone()), &slot())
                .await
                .unwrap()
        );
        assert_eq!(
            runner.commands(),
            [
                "systemctl is-active -- containerd.service",
                "systemctl is-active -- kubelet.service"
            ]
        );
    }

    #[tokio::test]
    async fn one_inactive_is_not_running() {
        let runner = RecordingRunner::new();
        runner.respond(
            &["systemctl", "is-active", "--", "kubelet.service"],
            CmdOutput {
                code: Some(3),
                stdout: "inactive\n".into(),
                stderr: String::new(),
            },
        );
        runner.respond(&["systemctl", "is-active"], CmdOutput::stdout("active\n"));
        assert!(!running(&HostBackend::new(runner), &slot()).await.unwrap());
    }

    #[tokio::test]
    async fn no_systemd_is_could_not_ask() {
        let runner = RecordingRunner::new();
        runner.respond(
            &["systemctl"],
            CmdOutput::failed(
                1,
                "System has not been booted with systemd as init system (PID 1). Can't operate.\n",
            ),
        );
        let err = running(&HostBackend::new(runner), &slot())
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("cannot tell whether containerd.service is running"),
            "{err}"
        );
        assert!(crate::error_chain(&err).contains("PID 1"), "{err}");
    }
}
