//! Host commands (`systemctl`, `ip`, `umount`) go through the [`Runner`] trait so that
//! unit tests can record them ([`RecordingRunner`]) and component tests can run the real
//! programs inside namespaces ([`HostRunner`]).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::BoxFuture;

/// A command line: a program and its arguments, never a shell string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cmd {
    /// The program, looked up on `PATH` unless absolute.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
}

impl Cmd {
    /// A command from a program and arguments.
    pub fn new<I, S>(program: impl Into<String>, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
        }
    }

    /// Whether the command line starts with these words (program first).
    pub fn starts_with(&self, words: &[&str]) -> bool {
        let mut line =
            std::iter::once(self.program.as_str()).chain(self.args.iter().map(String::as_str));
        words.iter().all(|w| line.next() == Some(*w))
    }
}

impl fmt::Display for Cmd {
    /// Shell-like rendering for messages: arguments with spaces are quoted.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.program)?;
        for arg in &self.args {
            if arg.is_empty() || arg.contains(|c: char| c.is_whitespace() || c == '\'' || c == '"')
            {
                write!(f, " '{}'", arg.replace('\'', r"'\''"))?;
            } else {
                write!(f, " {arg}")?;
            }
        }
        Ok(())
    }
}

/// What a finished command printed and how it exited.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CmdOutput {
    /// The exit code; `None` when a signal ended the process.
    pub code: Option<i32>,
    /// Standard output, lossily decoded.
    pub stdout: String,
    /// Standard error, lossily decoded.
    pub stderr: String,
}

impl CmdOutput {
    /// A successful, silent command.
    pub fn ok() -> Self {
        Self {
            code: Some(0),
            ..Self::default()
        }
    }

    /// A successful command that printed `stdout`.
    pub fn stdout(stdout: impl Into<String>) -> Self {
        Self {
            code: Some(0),
            stdout: stdout.into(),
            stderr: String::new(),
        }
    }

    /// A command that exited with `code` and printed `stderr`.
    pub fn failed(code: i32, stderr: impl Into<String>) -> Self {
        Self {
            code: Some(code),
            stdout: String::new(),
            stderr: stderr.into(),
        }
    }

    /// Whether the command exited 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// A command that could not run, or ran and failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The program could not be started at all (missing, not executable).
    #[error("cannot run `{command}`")]
    Spawn {
        /// The command line.
        command: String,
        /// Why it could not start.
        #[source]
        source: std::io::Error,
    },
    /// The program did not finish in time and was killed.
    #[error("`{command}` did not finish within {after:?} and was killed")]
    TimedOut {
        /// The command line.
        command: String,
        /// The time it was given.
        after: std::time::Duration,
    },
    /// The program ran and exited non-zero (or was killed).
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        /// The command line.
        command: String,
        /// `exit status N` or `killed by a signal`.
        status: String,
        /// What it printed on standard error, trimmed.
        stderr: String,
        /// What it printed on standard output (some tools report errors there).
        stdout: String,
    },
}

impl RunError {
    /// The failed command's standard error, if it ran.
    pub fn stderr(&self) -> Option<&str> {
        match self {
            RunError::Failed { stderr, .. } => Some(stderr),
            RunError::Spawn { .. } | RunError::TimedOut { .. } => None,
        }
    }

    fn failed(cmd: &Cmd, out: CmdOutput) -> Self {
        RunError::Failed {
            command: cmd.to_string(),
            status: match out.code {
                Some(code) => format!("exit status {code}"),
                None => "killed by a signal".to_string(),
            },
            stderr: out.stderr.trim().to_string(),
            stdout: out.stdout,
        }
    }
}

/// Runs host commands.
pub trait Runner: Send + Sync {
    /// Runs `cmd` to completion and returns what it printed, whatever its exit status.
    /// An error means the command could not be started.
    fn output<'a>(&'a self, cmd: &'a Cmd) -> BoxFuture<'a, Result<CmdOutput, RunError>>;

    /// Runs `cmd` and fails unless it exits 0; the error names the command and carries
    /// its standard error.
    fn run<'a>(&'a self, cmd: &'a Cmd) -> BoxFuture<'a, Result<CmdOutput, RunError>> {
        Box::pin(async move {
            let out = self.output(cmd).await?;
            if out.success() {
                Ok(out)
            } else {
                Err(RunError::failed(cmd, out))
            }
        })
    }
}

impl<R: Runner + ?Sized> Runner for Arc<R> {
    fn output<'a>(&'a self, cmd: &'a Cmd) -> BoxFuture<'a, Result<CmdOutput, RunError>> {
        (**self).output(cmd)
    }
}

impl<R: Runner + ?Sized> Runner for &R {
    fn output<'a>(&'a self, cmd: &'a Cmd) -> BoxFuture<'a, Result<CmdOutput, RunError>> {
        (**self).output(cmd)
    }
}

/// Runs commands on the real host with `tokio::process`.
///
/// A program can be substituted by another executable ([`HostRunner::with_program`]):
/// `outpost-agent` uses it so tests and development machines whose PID 1 is not systemd
/// can point `systemctl` at a script.
///
/// Every command gets a deadline ([`HostRunner::DEFAULT_TIMEOUT`] unless set with
/// [`HostRunner::with_timeout`]): a hung `systemctl` or `umount` fails the step, naming
/// the command, instead of hanging the agent. The process is killed when it runs out.
#[derive(Clone, Debug)]
pub struct HostRunner {
    substitutes: BTreeMap<String, PathBuf>,
    timeout: std::time::Duration,
}

impl Default for HostRunner {
    fn default() -> Self {
        Self {
            substitutes: BTreeMap::new(),
            timeout: Self::DEFAULT_TIMEOUT,
        }
    }
}

impl HostRunner {
    /// How long a command may run by default: two minutes, room for systemd to stop a
    /// kubelet that drains its pods' containers.
    pub const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

    /// Runs every program as named.
    pub fn new() -> Self {
        Self::default()
    }

    /// Gives every command `timeout` to finish.
    pub fn with_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Runs `replacement` wherever a command names `program`.
    pub fn with_program(
        mut self,
        program: impl Into<String>,
        replacement: impl Into<PathBuf>,
    ) -> Self {
        self.substitutes.insert(program.into(), replacement.into());
        self
    }
}

impl Runner for HostRunner {
    fn output<'a>(&'a self, cmd: &'a Cmd) -> BoxFuture<'a, Result<CmdOutput, RunError>> {
        Box::pin(async move {
            let program = self
                .substitutes
                .get(&cmd.program)
                .cloned()
                .unwrap_or_else(|| PathBuf::from(&cmd.program));
            tracing::debug!(command = %cmd, "running");
            // kill_on_drop: a command that runs out of time is killed when its future is
            // dropped by the timeout.
            let run = tokio::process::Command::new(&program)
                .args(&cmd.args)
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true)
                .output();
            let out = tokio::time::timeout(self.timeout, run)
                .await
                .map_err(|_| RunError::TimedOut {
                    command: cmd.to_string(),
                    after: self.timeout,
                })?
                .map_err(|source| RunError::Spawn {
                    command: cmd.to_string(),
                    source,
                })?;
            Ok(CmdOutput {
                code: out.status.code(),
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            })
        })
    }
}

/// A fake [`Runner`] for unit tests: it records every command and answers from scripted
/// responses (the first whose words prefix the command line), or with a silent success.
#[derive(Clone, Debug, Default)]
pub struct RecordingRunner {
    inner: Arc<Mutex<Recording>>,
}

#[derive(Debug, Default)]
struct Recording {
    commands: Vec<Cmd>,
    responses: Vec<(Vec<String>, CmdOutput)>,
}

impl RecordingRunner {
    /// A runner that answers every command with success.
    pub fn new() -> Self {
        Self::default()
    }

    /// Answers commands starting with `words` with `output`.
    pub fn respond(&self, words: &[&str], output: CmdOutput) -> &Self {
        self.lock()
            .responses
            .push((words.iter().map(|w| w.to_string()).collect(), output));
        self
    }

    /// Every command run so far, rendered as command lines.
    pub fn commands(&self) -> Vec<String> {
        self.lock().commands.iter().map(Cmd::to_string).collect()
    }

    /// Forgets the recorded commands (the scripted responses stay).
    pub fn clear(&self) {
        self.lock().commands.clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recording> {
        // A test that panicked while holding the lock already failed; keep going.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Runner for RecordingRunner {
    fn output<'a>(&'a self, cmd: &'a Cmd) -> BoxFuture<'a, Result<CmdOutput, RunError>> {
        let mut rec = self.lock();
        rec.commands.push(cmd.clone());
        let out = rec
            .responses
            .iter()
            .find(|(words, _)| {
                cmd.starts_with(&words.iter().map(String::as_str).collect::<Vec<_>>())
            })
            .map(|(_, out)| out.clone())
            .unwrap_or_else(CmdOutput::ok);
        Box::pin(async move { Ok(out) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_quotes_arguments_with_spaces() {
        let cmd = Cmd::new("umount", ["-l", "/var/lib/kubelet/pods/a b"]);
        assert_eq!(cmd.to_string(), "umount -l '/var/lib/kubelet/pods/a b'");
    }

    #[tokio::test]
    async fn run_error_names_command_and_stderr() {
        let runner = RecordingRunner::new();
        runner.respond(
            &["systemctl", "restart"],
            CmdOutput::failed(1, "Job for kubelet.service failed.\n"),
        );
        let err = runner
            .run(&Cmd::new("systemctl", ["restart", "kubelet.service"]))
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "`systemctl restart kubelet.service` failed (exit status 1): Job for kubelet.service failed."
        );
        runner
            .run(&Cmd::new("systemctl", ["start", "kubelet.service"]))
            .await
            .unwrap();
        assert_eq!(
            runner.commands(),
            [
                "systemctl restart kubelet.service",
                "systemctl start kubelet.service"
            ]
        );
    }
}
