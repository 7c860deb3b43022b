//! The `process` provider: a pod is a local process group running its first container's
//! command and args, with its literal env, in a working directory under a per-pod
//! directory of the state dir. Its stdout and stderr go through FIFOs the manager drains
//! into `output.log` (see the `capture` module), which is what log streaming serves and
//! what attach follows live. A container with `stdin: true` gets a stdin FIFO kept open
//! (attach writes to it); one with `tty: true` runs under `script`, on a terminal that
//! lives inside the pod's process group.
//!
//! Layout of `--state-dir`, one directory per claim:
//!
//! ```text
//! <state-dir>/<claim>/instance.json   pid, start time, pod, restarts (written after the spawn)
//! <state-dir>/<claim>/output.log      stdout and stderr, in the order captured
//! <state-dir>/<claim>/output.idx      capture time of each chunk of output.log
//! <state-dir>/<claim>/stdout.fifo     the process's stdout (also stderr.fifo, stdin.fifo)
//! <state-dir>/<claim>/exit            exit code, written by the process's shell wrapper
//! <state-dir>/<claim>/root/           working directory base (workingDir resolves here)
//! <state-dir>/<claim>/connect-token    the pod's connect token (0600)
//! <state-dir>/<claim>/launch.json      what was started: command, args, env, image, restarts
//! <state-dir>/<claim>/spec.json        the pod's mutable fields last applied (updates)
//! ```
//!
//! **Connect credential.** Before the first start of a pod's process the provider draws a
//! random token (128 bits, hex), keeps it in `connect-token` and gives it to the process in
//! `NEBULA_CONNECT_TOKEN`; the pod controller copies it (with the endpoint, `127.0.0.1`)
//! into the pod's connect Secret. The provider does not check the token itself: a local
//! process is reached on loopback at whatever port it opens, so the token is for a workload
//! that serves clients to require from them (as a cloud provider injects a key into a VM
//! and hands the other half to its owner). The same token survives manager restarts and
//! process restarts.
//!
//! **Updates.** Of the fields kube-apiserver lets change on a pod, only the image could
//! change what runs, and this provider runs the container's command, not its image. It
//! treats an image change the way the kubelet treats one: the process group is stopped
//! (SIGTERM, then SIGKILL after the grace period) and started again with the same command,
//! args, env and working directory, appending to the same `output.log`; the instance gets
//! a new id (pid and start time), and the restart is counted in `instance.json` (the
//! container's `restartCount`, which a restarted manager reads back). Command and args
//! cannot change on a pod, so nothing else restarts it. Labels, annotations,
//! `activeDeadlineSeconds` and tolerations are recorded in `spec.json` and change nothing
//! in the running process (the pod controller enforces the deadline: it terminates the
//! instance when the deadline passes).
//!
//! A restarted manager finds its instances again from these files, and resumes draining
//! their FIFOs. A PID alone is not an
//! identity (the kernel reuses them), so an instance is alive only when the PID's start
//! time (`/proc/<pid>/stat`) matches the recorded one. Every process carries its claim in
//! `NEBULA_CLAIM`, so a manager that died between the spawn and the write of
//! `instance.json` finds the process by that tag instead of starting a second one.
//!
//! Stats are those of the pod's process group and its descendants, read from `/proc`.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use super::capture::{self, Captures, OUTPUT};
use crate::crash::{CrashHook, CrashPoint};
use crate::provider::{
    Attacher, ByteStream, Capabilities, ConnectCredential, Duplex, ExecIo, Executor, Instance,
    InstanceState, InstanceStats, LogOptions, LogStreamer, PortForwarder, Provider, ProviderError,
    ProvisionRequest, StatsSource, UpdateRequest,
};

/// Environment variable every process of this provider carries: its claim.
pub const CLAIM_ENV: &str = "NEBULA_CLAIM";
/// Environment variable carrying the pod's connect token to its process.
pub const CONNECT_TOKEN_ENV: &str = "NEBULA_CONNECT_TOKEN";
const RECORD: &str = "instance.json";
const EXIT: &str = "exit";
/// How long a terminated process group gets between SIGTERM and SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
struct Record {
    claim: String,
    pid: i32,
    start_time: u64,
    namespace: String,
    pod: String,
    env: Vec<(String, String)>,
    working_dir: PathBuf,
    /// Runs on a terminal (under `script`).
    #[serde(default)]
    tty: bool,
    /// The first container's name.
    #[serde(default)]
    container: String,
    /// The pod's UID.
    #[serde(default)]
    pod_uid: String,
    /// How many times the process group was restarted in place (image changes): the
    /// container's `restartCount`. Kept here so it survives a manager restart.
    #[serde(default)]
    restarts: i32,
}

impl Record {
    fn id(&self) -> String {
        format!("{}-{}", self.pid, self.start_time)
    }
}

/// The process provider. Cheap to clone.
#[derive(Clone)]
pub struct ProcessProvider {
    name: String,
    state_dir: PathBuf,
    poll_interval: Duration,
    crash: Option<CrashHook>,
    /// Serialises provisions of the same claim inside one manager.
    provisioning: Arc<tokio::sync::Mutex<()>>,
    /// Cache of id -> claim directory, rebuilt from disk when missing.
    index: Arc<Mutex<HashMap<String, String>>>,
    /// Output captures running in this manager.
    captures: Captures,
}

impl std::fmt::Debug for ProcessProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessProvider")
            .field("name", &self.name)
            .field("state_dir", &self.state_dir)
            .finish_non_exhaustive()
    }
}

/// Why the process provider could not start.
#[derive(Debug, thiserror::Error)]
#[error("process provider state directory {path}")]
pub struct StateDirError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

impl ProcessProvider {
    /// A provider named `name` keeping its state under `state_dir/<name>` (created).
    pub fn new(
        name: impl Into<String>,
        state_dir: &Path,
    ) -> Result<ProcessProvider, StateDirError> {
        let name = name.into();
        let dir = state_dir.join(&name);
        std::fs::create_dir_all(&dir).map_err(|source| StateDirError {
            path: dir.clone(),
            source,
        })?;
        Ok(ProcessProvider {
            name,
            state_dir: dir,
            poll_interval: Duration::from_secs(2),
            crash: None,
            provisioning: Arc::default(),
            index: Arc::default(),
            captures: Captures::default(),
        })
    }

    /// Sets the notify cadence (default 2 s).
    pub fn with_poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every;
        self
    }

    /// Installs a hook run at [`CrashPoint::ProviderCreated`] (after the spawn, before
    /// `instance.json` is written).
    pub fn with_crash_hook(mut self, hook: Option<CrashHook>) -> Self {
        self.crash = hook;
        self
    }

    fn claim_dir(&self, claim: &str) -> Result<PathBuf, ProviderError> {
        // Claims come from claim_name (hex), but the provider is a library seam: refuse
        // anything that could leave the state directory.
        if claim.is_empty()
            || !claim
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return Err(failed(
                "provision",
                format!("claim {claim:?} is not a plain name"),
            ));
        }
        Ok(self.state_dir.join(claim))
    }

    fn read_record(dir: &Path) -> Option<Record> {
        let bytes = std::fs::read(dir.join(RECORD)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Records `rec` only when `dir` has no record yet; whether it did.
    fn write_new_record(dir: &Path, rec: &Record) -> Result<bool, ProviderError> {
        let bytes = serde_json::to_vec(rec).map_err(|e| failed("adopt", e.to_string()))?;
        common::fsutil::write_atomic_new(&dir.join(RECORD), &bytes, 0o600)
            .map_err(|e| failed("adopt", common::error_chain(&e)))
    }

    fn write_record(dir: &Path, rec: &Record) -> Result<(), ProviderError> {
        let bytes = serde_json::to_vec(rec).map_err(|e| failed("provision", e.to_string()))?;
        common::fsutil::write_atomic(&dir.join(RECORD), &bytes, 0o600, None)
            .map_err(|e| failed("provision", common::error_chain(&e)))
    }

    fn instance_of(&self, dir: &Path, rec: &Record) -> Instance {
        let state = if alive(rec.pid, rec.start_time) {
            InstanceState::Running
        } else {
            match std::fs::read_to_string(dir.join(EXIT)) {
                Ok(code) => match code.trim().parse::<i32>() {
                    Ok(code) => InstanceState::Exited { code },
                    Err(_) => InstanceState::Failed {
                        reason: format!("unreadable exit code {:?}", code.trim()),
                    },
                },
                Err(_) => InstanceState::Failed {
                    reason: "the process ended without recording an exit code (killed)".into(),
                },
            }
        };
        Instance {
            id: rec.id(),
            claim: rec.claim.clone(),
            state,
            endpoint: Some("127.0.0.1".into()),
            ip: Some("127.0.0.1".into()),
            started_at: None,
            restart_count: rec.restarts,
        }
    }

    fn lookup(&self, id: &str) -> Option<(PathBuf, Record)> {
        let cached = self
            .index
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned();
        if let Some(claim) = cached {
            let dir = self.state_dir.join(claim);
            if let Some(rec) = Self::read_record(&dir)
                && rec.id() == id
            {
                self.captures.ensure(&dir);
                return Some((dir, rec));
            }
        }
        let entries = std::fs::read_dir(&self.state_dir).ok()?;
        for e in entries.flatten() {
            let dir = e.path();
            if let Some(rec) = Self::read_record(&dir)
                && rec.id() == id
            {
                self.remember(&rec);
                self.captures.ensure(&dir);
                return Some((dir, rec));
            }
        }
        None
    }

    fn remember(&self, rec: &Record) {
        self.index
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(rec.id(), rec.claim.clone());
    }

    /// Provisions `req`'s claim; a process started now is recorded with `restarts` (0 for
    /// a first start, the previous count plus one for a restart in place).
    async fn provision_inner(
        &self,
        req: &ProvisionRequest,
        restarts: i32,
    ) -> Result<Instance, ProviderError> {
        let _one_at_a_time = self.provisioning.lock().await;
        let dir = self.claim_dir(&req.claim)?;
        if let Some(rec) = Self::read_record(&dir) {
            self.remember(&rec);
            return Ok(self.instance_of(&dir, &rec));
        }
        let mut argv: Vec<String> = req.command.clone();
        argv.extend(req.args.iter().cloned());
        if argv.is_empty() {
            return Err(failed(
                "provision",
                format!(
                    "pod {}/{} has no command: the process provider runs the first \
                     container's command and args, not its image",
                    req.namespace, req.pod_name
                ),
            ));
        }
        let working_dir = resolve_working_dir(&dir, req.working_dir.as_deref())?;
        std::fs::create_dir_all(&working_dir)
            .map_err(|e| failed("provision", format!("{}: {e}", working_dir.display())))?;
        // A process started before a crash and not yet recorded: adopt it by its tag.
        if let Some((pid, start_time)) = find_by_tag(&req.claim) {
            let rec = Record {
                claim: req.claim.clone(),
                pid,
                start_time,
                namespace: req.namespace.clone(),
                pod: req.pod_name.clone(),
                env: req.env.clone(),
                working_dir,
                tty: req.tty,
                container: req.container.clone(),
                pod_uid: req.pod_uid.clone(),
                restarts,
            };
            Self::write_record(&dir, &rec)?;
            self.remember(&rec);
            self.captures.ensure(&dir);
            return Ok(self.instance_of(&dir, &rec));
        }
        let token = ensure_token(&dir)?;
        write_launch(&dir, req, restarts)?;
        let stdin = req.stdin || req.tty;
        capture::make_fifos(&dir, stdin).map_err(|e| {
            failed(
                "provision",
                format!("making FIFOs in {}: {e}", dir.display()),
            )
        })?;
        let open = |name: &str| {
            capture::open_for_process(&dir.join(name))
                .map_err(|e| failed("provision", format!("{}: {e}", dir.join(name).display())))
        };
        let out = open(capture::STDOUT_FIFO)?;
        let err = open(capture::STDERR_FIFO)?;
        let input = if stdin {
            Stdio::from(open(capture::STDIN_FIFO)?)
        } else {
            Stdio::null()
        };
        if req.tty {
            // `script` runs the command on a new terminal it holds (inside the pod's process
            // group, so the terminal outlives a manager restart), copying its stdin to the
            // terminal and the terminal's output to its stdout.
            argv = vec![
                "script".into(),
                "-qfec".into(),
                shell_join(&argv),
                "/dev/null".into(),
            ];
        }
        // The shell wrapper records the exit code next to the log, so the code survives a
        // manager restart (the new manager is not the parent and cannot wait for it).
        let script = r#""$@"; code=$?; printf '%s\n' "$code" > "$NEBULA_STATE/exit.tmp" && mv "$NEBULA_STATE/exit.tmp" "$NEBULA_STATE/exit"; exit $code"#;
        let mut cmd = tokio::process::Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(script)
            .arg("sh")
            .args(&argv)
            .env_clear()
            .env(
                "PATH",
                std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
            )
            .envs(req.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env(CLAIM_ENV, &req.claim)
            .env(CONNECT_TOKEN_ENV, token.as_str())
            .env("NEBULA_STATE", &dir)
            .env("SHELL", "/bin/sh")
            .current_dir(&working_dir)
            .stdin(input)
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .kill_on_drop(false);
        let spawned = cmd.spawn();
        // The command holds our copies of the FIFOs: drop them, or the capture would never
        // see the end of the output.
        drop(cmd);
        let mut child =
            spawned.map_err(|e| failed("provision", format!("starting {:?}: {e}", argv[0])))?;
        let pid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| failed("provision", "the started process has no pid".into()))?;
        let start_time = start_time(pid)
            .ok_or_else(|| failed("provision", format!("reading /proc/{pid}/stat")))?;
        // Reap it while this manager lives; a later manager is not its parent.
        let exit_path = dir.join(EXIT);
        tokio::spawn(async move {
            if let Ok(status) = child.wait().await
                && !exit_path.exists()
            {
                use std::os::unix::process::ExitStatusExt;
                let code = status
                    .code()
                    .or_else(|| status.signal().map(|s| 128 + s))
                    .unwrap_or(255);
                let _ = std::fs::write(&exit_path, format!("{code}\n"));
            }
        });
        crate::crash::at(&self.crash, CrashPoint::ProviderCreated).await;
        let rec = Record {
            claim: req.claim.clone(),
            pid,
            start_time,
            namespace: req.namespace.clone(),
            pod: req.pod_name.clone(),
            env: req.env.clone(),
            working_dir,
            tty: req.tty,
            container: req.container.clone(),
            pod_uid: req.pod_uid.clone(),
            restarts,
        };
        Self::write_record(&dir, &rec)?;
        self.remember(&rec);
        self.captures.ensure(&dir);
        Ok(self.instance_of(&dir, &rec))
    }

    async fn terminate_inner(&self, id: &str) -> Result<(), ProviderError> {
        let Some((dir, rec)) = self.lookup(id) else {
            return Ok(());
        };
        // Leaves no group member behind; only a group verified ours is signalled (a stale
        // record's PID may be someone else's).
        stop_group(&rec).await;
        self.index
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(failed(
                "terminate",
                format!("removing {}: {e}", dir.display()),
            )),
        }
    }

    fn list_inner(&self) -> Result<Vec<Instance>, ProviderError> {
        let entries =
            std::fs::read_dir(&self.state_dir).map_err(|e| ProviderError::Unreachable {
                reason: format!("reading {}: {e}", self.state_dir.display()),
            })?;
        let mut out = Vec::new();
        for e in entries.flatten() {
            let dir = e.path();
            if let Some(rec) = Self::read_record(&dir) {
                self.remember(&rec);
                if alive(rec.pid, rec.start_time) {
                    self.captures.ensure(&dir);
                }
                out.push(self.instance_of(&dir, &rec));
            } else if let Some(claim) = dir.file_name().and_then(|n| n.to_str())
                && let Some((pid, start_time)) = find_by_tag(claim)
            {
                // Spawned but never recorded (the manager died in between): still this
                // provider's instance. Record it now so terminate and logs find it.
                let rec = Record {
                    claim: claim.to_string(),
                    pid,
                    start_time,
                    namespace: String::new(),
                    pod: String::new(),
                    env: Vec::new(),
                    working_dir: dir.join("root"),
                    tty: false,
                    container: String::new(),
                    pod_uid: String::new(),
                    // Written before the spawn: the count this process was started with.
                    restarts: read_launch(&dir).map_or(0, |l| l.restarts),
                };
                // Only if still unrecorded: a provision finishing meanwhile writes the
                // full record (with the pod's environment), which this must not replace.
                let created =
                    Self::write_new_record(&dir, &rec).map_err(|e| ProviderError::Unreachable {
                        reason: format!("recording adopted process {pid}: {e}"),
                    })?;
                let rec = if created {
                    rec
                } else {
                    match Self::read_record(&dir) {
                        Some(r) => r,
                        None => continue,
                    }
                };
                self.remember(&rec);
                out.push(self.instance_of(&dir, &rec));
            }
        }
        Ok(out)
    }
}

/// `argv` as one `sh` command line (each word single-quoted).
fn shell_join(argv: &[String]) -> String {
    let words: Vec<String> = argv
        .iter()
        .map(|w| format!("'{}'", w.replace('\'', "'\\''")))
        .collect();
    format!("exec {}", words.join(" "))
}

fn failed(operation: &'static str, reason: String) -> ProviderError {
    ProviderError::Failed { operation, reason }
}

/// `workingDir` of the container, re-rooted under the pod's directory.
fn resolve_working_dir(dir: &Path, wd: Option<&str>) -> Result<PathBuf, ProviderError> {
    let mut out = dir.join("root");
    if let Some(wd) = wd {
        for c in Path::new(wd).components() {
            match c {
                Component::Normal(part) => out.push(part),
                Component::RootDir | Component::CurDir => {}
                Component::ParentDir | Component::Prefix(_) => {
                    return Err(failed(
                        "provision",
                        format!("workingDir {wd:?} climbs out of the pod's directory"),
                    ));
                }
            }
        }
    }
    Ok(out)
}

/// Field 22 (start time in clock ticks since boot) and field 3 (state) of /proc/<pid>/stat.
fn stat_fields(pid: i32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

fn start_time(pid: i32) -> Option<u64> {
    stat_fields(pid).map(|(_, s)| s)
}

/// Whether `pid` is the very process recorded (same start time) and not a zombie.
fn alive(pid: i32, recorded_start: u64) -> bool {
    matches!(stat_fields(pid), Some((state, start)) if start == recorded_start && state != 'Z' && state != 'X')
}

/// A live process-group leader carrying `NEBULA_CLAIM=<claim>`.
fn find_by_tag(claim: &str) -> Option<(i32, u64)> {
    let needle = format!("{CLAIM_ENV}={claim}");
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if !environ.split(|b| *b == 0).any(|v| v == needle.as_bytes()) {
            continue;
        }
        if nix::unistd::getpgid(Some(Pid::from_raw(pid))).ok() != Some(Pid::from_raw(pid)) {
            continue;
        }
        if let Some((state, start)) = stat_fields(pid)
            && state != 'Z'
        {
            return Some((pid, start));
        }
    }
    None
}

impl Provider for ProcessProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> Capabilities {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Capabilities {
            poll_interval: self.poll_interval,
            capacity: [
                ("cpu".to_string(), cpus.to_string()),
                ("memory".to_string(), "8Gi".to_string()),
                ("pods".to_string(), "110".to_string()),
            ]
            .into_iter()
            .collect(),
            capacity_types: vec!["on-demand".into()],
        }
    }

    fn provision<'a>(
        &'a self,
        req: &'a ProvisionRequest,
    ) -> BoxFuture<'a, Result<Instance, ProviderError>> {
        self.provision_inner(req, 0).boxed()
    }

    fn terminate<'a>(&'a self, instance_id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        self.terminate_inner(instance_id).boxed()
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Instance>, ProviderError>> {
        let result = self.list_inner();
        async move { result }.boxed()
    }

    fn status<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Instance>, ProviderError>> {
        let result = self
            .lookup(instance_id)
            .map(|(dir, rec)| self.instance_of(&dir, &rec));
        async move { Ok(result) }.boxed()
    }

    fn health(&self) -> BoxFuture<'_, Result<(), ProviderError>> {
        let result = match std::fs::metadata(&self.state_dir) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(ProviderError::Unreachable {
                reason: format!("{} is not a directory", self.state_dir.display()),
            }),
            Err(e) => Err(ProviderError::Unreachable {
                reason: format!("{}: {e}", self.state_dir.display()),
            }),
        };
        async move { result }.boxed()
    }

    fn log_streamer(&self) -> Option<&dyn LogStreamer> {
        Some(self)
    }

    fn executor(&self) -> Option<&dyn Executor> {
        Some(self)
    }

    fn port_forwarder(&self) -> Option<&dyn PortForwarder> {
        Some(self)
    }

    fn stats(&self) -> Option<&dyn StatsSource> {
        Some(self)
    }

    fn attacher(&self) -> Option<&dyn Attacher> {
        Some(self)
    }

    fn update<'a>(
        &'a self,
        instance_id: &'a str,
        req: &'a UpdateRequest,
    ) -> BoxFuture<'a, Result<Instance, ProviderError>> {
        self.update_inner(instance_id, req).boxed()
    }

    fn connect_credential<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<ConnectCredential>, ProviderError>> {
        let result = self.credential_inner(instance_id);
        async move { result }.boxed()
    }
}

impl LogStreamer for ProcessProvider {
    fn logs<'a>(
        &'a self,
        instance_id: &'a str,
        opts: &'a LogOptions,
    ) -> BoxFuture<'a, Result<ByteStream, ProviderError>> {
        async move {
            let (dir, rec) = self
                .lookup(instance_id)
                .ok_or_else(|| ProviderError::NotFound(instance_id.to_string()))?;
            let capture = self.captures.ensure(&dir);
            let path = dir.join(OUTPUT);
            let mut content = Vec::new();
            match std::fs::File::open(&path) {
                Ok(mut f) => {
                    f.read_to_end(&mut content)
                        .map_err(|e| failed("logs", format!("{}: {e}", path.display())))?;
                }
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(failed("logs", format!("{}: {e}", path.display()))),
            }
            let fallback = modified_nanos(&path);
            let index = capture::read_index(&dir);
            let start = opts.tail_lines.map_or(0, |n| tail_start(&content, n));
            let render = capture::Render {
                since: opts.since_unix_nanos,
                timestamps: opts.timestamps,
            };
            let mut head = Vec::new();
            // Following with timestamps, a partial last line waits for its end.
            let used = capture::render_lines(
                &content[start..],
                start as u64,
                &index,
                fallback,
                &render,
                opts.follow && opts.timestamps,
                &mut head,
            );
            let mut offset = (start + used) as u64;
            let mut remaining = opts.limit_bytes;
            if let Some(limit) = remaining {
                head.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
                remaining = Some(limit.saturating_sub(head.len() as u64));
            }
            if !opts.follow || remaining == Some(0) {
                return Ok(Box::pin(std::io::Cursor::new(head)) as ByteStream);
            }
            let (mut tx, rx) = tokio::io::duplex(64 * 1024);
            let timestamps = opts.timestamps;
            tokio::spawn(async move {
                if tx.write_all(&head).await.is_err() {
                    return;
                }
                let mut written = capture.map(|c| c.written());
                let mut ended = false;
                loop {
                    let mut more = Vec::new();
                    if let Ok(mut f) = std::fs::File::open(&path)
                        && f.seek(SeekFrom::Start(offset)).is_ok()
                    {
                        let _ = f.read_to_end(&mut more);
                    }
                    let mut out = Vec::new();
                    let used = if timestamps {
                        let index = capture::read_index(&dir);
                        capture::render_lines(
                            &more,
                            offset,
                            &index,
                            modified_nanos(&path),
                            &capture::Render {
                                since: None,
                                timestamps,
                            },
                            !ended,
                            &mut out,
                        )
                    } else {
                        out = more;
                        out.len()
                    };
                    offset += used as u64;
                    if let Some(left) = remaining.as_mut() {
                        out.truncate(usize::try_from(*left).unwrap_or(usize::MAX));
                        *left = left.saturating_sub(out.len() as u64);
                    }
                    if !out.is_empty() && tx.write_all(&out).await.is_err() {
                        return;
                    }
                    if remaining == Some(0) || ended {
                        return;
                    }
                    if used > 0 {
                        continue;
                    }
                    // Wait for more output: woken by the capture as it writes, or (for an
                    // instance without one) by polling.
                    match written.as_mut() {
                        Some(w) => {
                            match tokio::time::timeout(Duration::from_secs(1), w.changed()).await {
                                Ok(Ok(())) => {}
                                Ok(Err(_)) => ended = true,
                                Err(_) => {}
                            }
                        }
                        None => {
                            if !alive(rec.pid, rec.start_time) {
                                ended = true;
                            } else {
                                tokio::time::sleep(Duration::from_millis(200)).await;
                            }
                        }
                    }
                }
            });
            Ok(Box::pin(rx) as ByteStream)
        }
        .boxed()
    }
}

/// Modification time of a file, nanoseconds since the epoch (0 when unknown).
fn modified_nanos(path: &Path) -> u64 {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Byte offset where the last `n` lines of `content` start.
fn tail_start(content: &[u8], n: u64) -> usize {
    if n == 0 {
        return content.len();
    }
    let mut seen = 0u64;
    // A trailing newline ends the last line; it does not start an empty one.
    let end = content
        .len()
        .saturating_sub(usize::from(content.last() == Some(&b'\n')));
    for i in (0..end).rev() {
        if content[i] == b'\n' {
            seen += 1;
            if seen == n {
                return i + 1;
            }
        }
    }
    0
}

impl Executor for ProcessProvider {
    fn exec<'a>(
        &'a self,
        instance_id: &'a str,
        command: Vec<String>,
        io: ExecIo,
    ) -> BoxFuture<'a, Result<i32, ProviderError>> {
        async move {
            let (_dir, rec) = self
                .lookup(instance_id)
                .ok_or_else(|| ProviderError::NotFound(instance_id.to_string()))?;
            let Some((program, args)) = command.split_first() else {
                return Err(failed("exec", "empty command".into()));
            };
            if io.tty {
                return exec_on_terminal(&rec, program, args, io).await;
            }
            let mut child = tokio::process::Command::new(program)
                .args(args)
                .env_clear()
                .env(
                    "PATH",
                    std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
                )
                .envs(rec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .env(CLAIM_ENV, format!("{}-exec", rec.claim))
                .current_dir(&rec.working_dir)
                .stdin(if io.stdin.is_some() {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stdout(if io.stdout.is_some() {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stderr(if io.stderr.is_some() {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| failed("exec", format!("starting {program:?}: {e}")))?;
            let mut pumps = Vec::new();
            // Not awaited: a client may keep its stdin open after the command ended.
            let mut stdin_pump = None;
            if let (Some(mut from), Some(mut to)) = (io.stdin, child.stdin.take()) {
                stdin_pump = Some(tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut from, &mut to).await;
                }));
            }
            // The pipes are handed over whole: a kubelet API session reads them itself.
            if let (Some(to), Some(from)) = (io.stdout, child.stdout.take()) {
                capture::widen_pipe(&from);
                pumps.push(tokio::spawn(to.pump_from(from)));
            }
            if let (Some(to), Some(from)) = (io.stderr, child.stderr.take()) {
                capture::widen_pipe(&from);
                pumps.push(tokio::spawn(to.pump_from(from)));
            }
            let status = child
                .wait()
                .await
                .map_err(|e| failed("exec", format!("waiting for {program:?}: {e}")))?;
            if let Some(p) = stdin_pump {
                p.abort();
            }
            for p in pumps {
                let _ = p.await;
            }
            use std::os::unix::process::ExitStatusExt;
            Ok(status
                .code()
                .or_else(|| status.signal().map(|s| 128 + s))
                .unwrap_or(255))
        }
        .boxed()
    }
}

/// Runs `program` on a new pseudo-terminal as its controlling terminal (`setsid -c`, so
/// no unsafe pre-exec code is needed), copying the client's stdin to the terminal and the
/// terminal's output to the client's stdout, and applying resize events to it.
async fn exec_on_terminal(
    rec: &Record,
    program: &str,
    args: &[String],
    io: ExecIo,
) -> Result<i32, ProviderError> {
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let pty_err = |what: &str, e: rustix::io::Errno| failed("exec", format!("{what}: {e}"));
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)
        .map_err(|e| pty_err("opening a pseudo-terminal", e))?;
    grantpt(&master).map_err(|e| pty_err("grantpt", e))?;
    unlockpt(&master).map_err(|e| pty_err("unlockpt", e))?;
    let name = ptsname(&master, Vec::new()).map_err(|e| pty_err("ptsname", e))?;
    let name = PathBuf::from(std::ffi::OsStr::from_bytes(name.as_bytes()));
    let master = std::fs::File::from(master);
    let mut resize = io.resize;
    // The first size usually arrives with the session; apply it before the program starts.
    if let Some(rx) = resize.as_mut()
        && let Ok(Some((cols, rows))) =
            tokio::time::timeout(Duration::from_millis(200), rx.recv()).await
    {
        set_size(&master, cols, rows);
    }
    let mut child = {
        let open_slave = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc_o_noctty())
                .open(&name)
                .map_err(|e| failed("exec", format!("opening {}: {e}", name.display())))
        };
        let mut cmd = tokio::process::Command::new("setsid");
        cmd.args(["--ctty", "--wait", "--"])
            .arg(program)
            .args(args)
            .env_clear()
            .env(
                "PATH",
                std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()),
            )
            .env("TERM", "xterm")
            .envs(rec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env(CLAIM_ENV, format!("{}-exec", rec.claim))
            .current_dir(&rec.working_dir)
            .stdin(Stdio::from(open_slave()?))
            .stdout(Stdio::from(open_slave()?))
            .stderr(Stdio::from(open_slave()?))
            .kill_on_drop(true);
        // The command (and its copies of the terminal) is dropped here, so the terminal
        // reports end of file once the program and its children are gone.
        cmd.spawn()
            .map_err(|e| failed("exec", format!("starting {program:?} on a terminal: {e}")))?
    };
    let reader = master
        .try_clone()
        .map_err(|e| failed("exec", format!("duplicating the terminal: {e}")))?;
    let writer = master
        .try_clone()
        .map_err(|e| failed("exec", format!("duplicating the terminal: {e}")))?;
    let mut side = Vec::new();
    if let Some(mut rx) = resize {
        side.push(tokio::spawn(async move {
            while let Some((cols, rows)) = rx.recv().await {
                set_size(&master, cols, rows);
            }
        }));
    }
    if let Some(mut from) = io.stdin {
        side.push(tokio::spawn(async move {
            let mut to = tokio::fs::File::from_std(writer);
            let _ = tokio::io::copy(&mut from, &mut to).await;
            let _ = to.flush().await;
        }));
    }
    // Reading the terminal fails (EIO) once every program holding it is gone.
    let output = io
        .stdout
        .map(|to| tokio::spawn(to.pump_from(tokio::fs::File::from_std(reader))));
    let status = child
        .wait()
        .await
        .map_err(|e| failed("exec", format!("waiting for {program:?}: {e}")))?;
    if let Some(out) = output {
        let _ = tokio::time::timeout(Duration::from_secs(5), out).await;
    }
    for task in side {
        task.abort();
    }
    use std::os::unix::process::ExitStatusExt;
    Ok(status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(255))
}

fn libc_o_noctty() -> i32 {
    rustix::fs::OFlags::NOCTTY.bits() as i32
}

fn set_size(terminal: &std::fs::File, cols: u16, rows: u16) {
    let size = rustix::termios::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    if let Err(e) = rustix::termios::tcsetwinsize(terminal, size) {
        tracing::debug!(error = %e, "setting the terminal size");
    }
}

impl PortForwarder for ProcessProvider {
    fn connect<'a>(
        &'a self,
        instance_id: &'a str,
        port: u16,
    ) -> BoxFuture<'a, Result<Pin<Box<dyn Duplex>>, ProviderError>> {
        async move {
            self.lookup(instance_id)
                .ok_or_else(|| ProviderError::NotFound(instance_id.to_string()))?;
            let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .map_err(|e| {
                    failed(
                        "port-forward",
                        format!("connecting to 127.0.0.1:{port}: {e}"),
                    )
                })?;
            Ok(Box::pin(stream) as Pin<Box<dyn Duplex>>)
        }
        .boxed()
    }
}

impl StatsSource for ProcessProvider {
    fn stats<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<InstanceStats, ProviderError>> {
        let result = (|| {
            let (_, rec) = self
                .lookup(instance_id)
                .ok_or_else(|| ProviderError::NotFound(instance_id.to_string()))?;
            if !alive(rec.pid, rec.start_time) {
                return Err(ProviderError::NotFound(instance_id.to_string()));
            }
            let group = group_usage(rec.pid).map_err(|e| {
                failed(
                    "stats",
                    format!("reading /proc for process group {}: {e}", rec.pid),
                )
            })?;
            let tick = clock_tick_nanos();
            let page = page_size();
            let boot = boot_time_unix();
            Ok(InstanceStats {
                cpu_nanos: group.cpu_ticks.saturating_mul(tick),
                memory_bytes: group.rss_pages.saturating_mul(page),
                working_set_bytes: group.rss_pages.saturating_mul(page),
                start_time_unix: boot
                    .map(|b| b + rec.start_time.saturating_mul(tick) / 1_000_000_000),
                timestamp_unix_nanos: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
                container: (!rec.container.is_empty()).then(|| rec.container.clone()),
                pod_uid: (!rec.pod_uid.is_empty()).then(|| rec.pod_uid.clone()),
            })
        })();
        async move { result }.boxed()
    }
}

/// CPU and memory of a pod's processes, summed.
#[derive(Debug, Default, PartialEq, Eq)]
struct GroupUsage {
    /// utime + stime of every process, plus what its reaped children used (cutime +
    /// cstime), in clock ticks: the pod's CPU time so far.
    cpu_ticks: u64,
    /// Resident pages of every process.
    rss_pages: u64,
}

/// One line of `/proc/<pid>/stat`, the fields the provider uses.
#[derive(Debug, Default, PartialEq, Eq)]
struct ProcStat {
    ppid: i32,
    pgrp: i32,
    usage: GroupUsage,
}

/// Parses a stat line. The command name may hold spaces and parentheses: the fields
/// start after the last `)`.
fn parse_stat(stat: &str) -> Option<ProcStat> {
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split(' ').collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // Index 0 is field 3 (state): 4 ppid, 5 pgrp, 14-17 utime stime cutime cstime, 24 rss.
    Some(ProcStat {
        ppid: f.get(1)?.parse().ok()?,
        pgrp: f.get(2)?.parse().ok()?,
        usage: GroupUsage {
            cpu_ticks: num(11) + num(12) + num(13) + num(14),
            rss_pages: num(21),
        },
    })
}

/// The pod's processes: its process group, and every descendant of it (a program under
/// `script` runs in a session of its own).
fn pod_processes(pgid: i32) -> std::io::Result<Vec<(i32, ProcStat)>> {
    let mut all = Vec::new();
    for e in std::fs::read_dir("/proc")?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            && let Some(p) = parse_stat(&stat)
        {
            all.push((pid, p));
        }
    }
    Ok(select_pod(all, pgid))
}

/// The group `pgid` and its descendants out of `all`.
fn select_pod(all: Vec<(i32, ProcStat)>, pgid: i32) -> Vec<(i32, ProcStat)> {
    let mut members: std::collections::HashSet<i32> = all
        .iter()
        .filter(|(_, p)| p.pgrp == pgid)
        .map(|(pid, _)| *pid)
        .collect();
    loop {
        let before = members.len();
        for (pid, p) in &all {
            if members.contains(&p.ppid) {
                members.insert(*pid);
            }
        }
        if members.len() == before {
            break;
        }
    }
    all.into_iter()
        .filter(|(pid, _)| members.contains(pid))
        .collect()
}

fn group_usage(pgid: i32) -> std::io::Result<GroupUsage> {
    let mut total = GroupUsage::default();
    for (_, p) in pod_processes(pgid)? {
        total.cpu_ticks += p.usage.cpu_ticks;
        total.rss_pages += p.usage.rss_pages;
    }
    Ok(total)
}

fn clock_tick_nanos() -> u64 {
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|v| u64::try_from(v).ok())
        .filter(|v| *v > 0)
        .unwrap_or(100);
    1_000_000_000 / hz
}

fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|v| u64::try_from(v).ok())
        .unwrap_or(4096)
}

/// The boot time (`btime` of /proc/stat), seconds since the epoch.
fn boot_time_unix() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

impl Attacher for ProcessProvider {
    fn attach<'a>(
        &'a self,
        instance_id: &'a str,
        io: ExecIo,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        async move {
            let (dir, rec) = self
                .lookup(instance_id)
                .ok_or_else(|| ProviderError::NotFound(instance_id.to_string()))?;
            if !alive(rec.pid, rec.start_time) {
                return Err(failed(
                    "attach",
                    format!("the process of instance {instance_id} is not running"),
                ));
            }
            let capture = self.captures.ensure(&dir).ok_or_else(|| {
                failed(
                    "attach",
                    format!(
                        "instance {instance_id} writes straight to its log (started by an older manager): only instances started since can be attached to"
                    ),
                )
            })?;
            // Subscribed before anything else: output from here on reaches the client.
            let mut chunks = capture.subscribe();
            let mut side = AbortOnDrop(Vec::new());
            if let Some(mut from) = io.stdin {
                let fifo = dir.join(capture::STDIN_FIFO);
                side.0.push(tokio::spawn(async move {
                    match tokio::net::unix::pipe::OpenOptions::new().open_sender(&fifo) {
                        Ok(mut to) => {
                            let _ = tokio::io::copy(&mut from, &mut to).await;
                        }
                        // No stdin kept open (the container has no `stdin: true`): what the
                        // client types is dropped, as a container runtime does.
                        Err(_) => {
                            let _ = tokio::io::copy(&mut from, &mut tokio::io::sink()).await;
                        }
                    }
                }));
            }
            if let Some(mut rx) = io.resize {
                let pgid = rec.pid;
                side.0.push(tokio::spawn(async move {
                    // A pod just started may not have its terminal yet (`script` opens it
                    // after it starts): keep the last size asked for and apply it once
                    // the terminal shows, rather than dropping the client's first size.
                    let mut pending: Option<(u16, u16)> = None;
                    let mut tries = 0u32;
                    loop {
                        let next = match pending {
                            None => rx.recv().await,
                            Some(_) => {
                                tokio::select! {
                                    got = rx.recv() => got,
                                    () = tokio::time::sleep(Duration::from_millis(100)) => pending,
                                }
                            }
                        };
                        let Some((cols, rows)) = next else { break };
                        pending = match group_terminal(pgid) {
                            Some(t) => {
                                set_size(&t, cols, rows);
                                tries = 0;
                                None
                            }
                            // A pod without a terminal never gets one: stop asking after
                            // a minute (the next size the client sends tries again).
                            None if tries < 600 => {
                                tries += 1;
                                Some((cols, rows))
                            }
                            None => {
                                tracing::debug!(pgid, "attach resize: the process group has no terminal");
                                tries = 0;
                                None
                            }
                        };
                    }
                }));
            }
            let (mut out, mut err) = (io.stdout, io.stderr);
            loop {
                let (stream, data) = match chunks.recv().await {
                    Ok(chunk) => chunk,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        tracing::debug!(instance = instance_id, missed = n, "attach: the client fell behind and missed output");
                        continue;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                };
                let sink = match stream {
                    capture::Stream::Stdout => out.as_mut(),
                    capture::Stream::Stderr => err.as_mut(),
                };
                if let Some(w) = sink
                    && w.write_all(&data).await.is_err()
                {
                    break;
                }
            }
            for w in [out.as_mut(), err.as_mut()].into_iter().flatten() {
                let _ = w.shutdown().await;
            }
            Ok(())
        }
        .boxed()
    }
}

/// Aborts its tasks when dropped (the session's future may be dropped mid-way).
struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// The terminal of a pod run under `script`: the `/dev/pts/N` one of its processes has
/// as its standard input, opened for setting its size.
fn group_terminal(pgid: i32) -> Option<std::fs::File> {
    for (pid, _) in pod_processes(pgid).ok()? {
        let Ok(target) = std::fs::read_link(format!("/proc/{pid}/fd/0")) else {
            continue;
        };
        if target.starts_with("/dev/pts/") {
            return std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc_o_noctty())
                .open(&target)
                .ok();
        }
    }
    None
}

const TOKEN: &str = "connect-token";
const LAUNCH: &str = "launch.json";
const SPEC: &str = "spec.json";

/// What was started for a claim, so an update can start it again the same way.
#[derive(Serialize, Deserialize)]
struct Launch {
    namespace: String,
    pod: String,
    image: String,
    command: Vec<String>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    working_dir: Option<String>,
    capacity_type: Option<String>,
    /// The restart count of the process started with it: read back when the manager died
    /// between that start and the write of `instance.json`.
    #[serde(default)]
    restarts: i32,
}

fn read_launch(dir: &Path) -> Option<Launch> {
    std::fs::read(dir.join(LAUNCH))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
}

/// The claim's connect token: the one on disk, or a fresh one recorded now (only if still
/// absent, so a racing provision cannot replace it).
fn ensure_token(dir: &Path) -> Result<zeroize::Zeroizing<String>, ProviderError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| failed("provision", format!("{}: {e}", dir.display())))?;
    let path = dir.join(TOKEN);
    if let Some(t) = read_token(dir) {
        return Ok(t);
    }
    let fresh = zeroize::Zeroizing::new(crate::random_token());
    common::fsutil::write_atomic_new(&path, fresh.as_bytes(), 0o600)
        .map_err(|e| failed("provision", common::error_chain(&e)))?;
    read_token(dir).ok_or_else(|| {
        failed(
            "provision",
            format!("{} is unreadable after writing it", path.display()),
        )
    })
}

fn read_token(dir: &Path) -> Option<zeroize::Zeroizing<String>> {
    let t = zeroize::Zeroizing::new(std::fs::read_to_string(dir.join(TOKEN)).ok()?);
    let trimmed = t.trim();
    (!trimmed.is_empty()).then(|| zeroize::Zeroizing::new(trimmed.to_string()))
}

fn write_launch(dir: &Path, req: &ProvisionRequest, restarts: i32) -> Result<(), ProviderError> {
    let launch = Launch {
        namespace: req.namespace.clone(),
        pod: req.pod_name.clone(),
        image: req.image.clone(),
        command: req.command.clone(),
        args: req.args.clone(),
        env: req.env.clone(),
        working_dir: req.working_dir.clone(),
        capacity_type: req.capacity_type.clone(),
        restarts,
    };
    let bytes = serde_json::to_vec(&launch).map_err(|e| failed("provision", e.to_string()))?;
    common::fsutil::write_atomic(&dir.join(LAUNCH), &bytes, 0o600, None)
        .map_err(|e| failed("provision", common::error_chain(&e)))
}

impl ProcessProvider {
    fn credential_inner(&self, id: &str) -> Result<Option<ConnectCredential>, ProviderError> {
        let (dir, _) = self
            .lookup(id)
            .ok_or_else(|| ProviderError::NotFound(id.to_string()))?;
        // A process started before this provider issued tokens has none in its
        // environment: no credential rather than one nothing knows.
        Ok(read_token(&dir).map(|t| {
            ConnectCredential::new()
                .with("endpoint", "127.0.0.1")
                .with("token", t.as_str())
        }))
    }

    async fn update_inner(&self, id: &str, req: &UpdateRequest) -> Result<Instance, ProviderError> {
        let (dir, rec) = self
            .lookup(id)
            .ok_or_else(|| ProviderError::NotFound(id.to_string()))?;
        if rec.claim != req.claim {
            return Err(failed(
                "update",
                format!(
                    "instance {id} belongs to claim {}, not {}",
                    rec.claim, req.claim
                ),
            ));
        }
        let launch = read_launch(&dir);
        let mut instance = self.instance_of(&dir, &rec);
        match launch {
            Some(mut launch) if launch.image != req.image => {
                if instance.state != InstanceState::Running {
                    return Err(failed(
                        "update",
                        format!(
                            "instance {id} is not running, so its image change cannot restart it"
                        ),
                    ));
                }
                tracing::info!(claim = %rec.claim, from = %launch.image, to = %req.image, "image changed: restarting the process group");
                stop_group(&rec).await;
                // The old process's reaper may still record its exit code; give it a
                // moment, then clear it so the new process is not read as exited.
                for _ in 0..10 {
                    if dir.join(EXIT).exists() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                for f in [EXIT, RECORD] {
                    match std::fs::remove_file(dir.join(f)) {
                        Ok(()) => {}
                        Err(e) if e.kind() == ErrorKind::NotFound => {}
                        Err(e) => {
                            return Err(failed(
                                "update",
                                format!("removing {}: {e}", dir.join(f).display()),
                            ));
                        }
                    }
                }
                self.index
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(id);
                launch.image = req.image.clone();
                let again = ProvisionRequest {
                    claim: rec.claim.clone(),
                    namespace: launch.namespace,
                    pod_name: launch.pod,
                    image: launch.image,
                    command: launch.command,
                    args: launch.args,
                    env: launch.env,
                    working_dir: launch.working_dir,
                    capacity_type: launch.capacity_type,
                    // As first started: a stdin FIFO exists when it had one.
                    stdin: dir.join(capture::STDIN_FIFO).exists(),
                    tty: rec.tty,
                    container: rec.container.clone(),
                    pod_uid: rec.pod_uid.clone(),
                };
                // The restart is counted as the kubelet counts a container restart.
                instance = self
                    .provision_inner(&again, rec.restarts.saturating_add(1))
                    .await?;
            }
            Some(_) => {}
            // Started before launch records existed: the command is unknown, so an image
            // change cannot restart it.
            None => {
                return Err(ProviderError::Unsupported(
                    "changes to an instance started without a launch record",
                ));
            }
        }
        let bytes = serde_json::to_vec(req).map_err(|e| failed("update", e.to_string()))?;
        common::fsutil::write_atomic(&dir.join(SPEC), &bytes, 0o600, None)
            .map_err(|e| failed("update", common::error_chain(&e)))?;
        Ok(instance)
    }
}

/// SIGTERM to the process group, SIGKILL after [`TERM_GRACE`]; returns once the recorded
/// process is gone.
async fn stop_group(rec: &Record) {
    if !alive(rec.pid, rec.start_time) {
        return;
    }
    let group = Pid::from_raw(rec.pid);
    let _ = killpg(group, Signal::SIGTERM);
    let deadline = tokio::time::Instant::now() + TERM_GRACE;
    while alive(rec.pid, rec.start_time) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = killpg(group, Signal::SIGKILL);
    // SIGKILL cannot be ignored; the bound only covers a process stuck in the kernel.
    let deadline = tokio::time::Instant::now() + TERM_GRACE;
    while alive(rec.pid, rec.start_time) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_counts_lines_from_the_end() {
        let c = b"a\nb\nc\n";
        assert_eq!(&c[tail_start(c, 1)..], b"c\n");
        assert_eq!(&c[tail_start(c, 2)..], b"b\nc\n");
        assert_eq!(&c[tail_start(c, 9)..], c);
        assert_eq!(&c[tail_start(c, 0)..], b"");
        assert_eq!(&b"x"[tail_start(b"x", 1)..], b"x");
    }

    #[test]
    fn working_dir_stays_under_the_pod() {
        let d = Path::new("/s/c");
        assert_eq!(
            resolve_working_dir(d, None).unwrap(),
            Path::new("/s/c/root")
        );
        assert_eq!(
            resolve_working_dir(d, Some("/app/x")).unwrap(),
            Path::new("/s/c/root/app/x")
        );
        assert!(resolve_working_dir(d, Some("../../etc")).is_err());
    }

    #[test]
    fn a_stat_line_parses_past_a_name_with_parentheses() {
        let line = "42 (a (b) c) S 7 40 40 0 -1 4194304 1 0 0 0 11 22 33 44 20 0 1 0 500 1000 77 x";
        let p = parse_stat(line).unwrap();
        assert_eq!((p.ppid, p.pgrp), (7, 40));
        assert_eq!(p.usage.cpu_ticks, 11 + 22 + 33 + 44);
        assert_eq!(p.usage.rss_pages, 77);
    }

    #[test]
    fn the_pod_is_its_group_and_every_descendant() {
        let st = |ppid, pgrp| ProcStat {
            ppid,
            pgrp,
            usage: GroupUsage::default(),
        };
        // 10 leads group 10; 11 is in it; 12 (child of 11) started a session of its own;
        // 13 is 12's child; 20 is unrelated.
        let all = vec![
            (10, st(1, 10)),
            (11, st(10, 10)),
            (12, st(11, 12)),
            (13, st(12, 12)),
            (20, st(1, 20)),
        ];
        let mut pids: Vec<i32> = select_pod(all, 10).into_iter().map(|(p, _)| p).collect();
        pids.sort_unstable();
        assert_eq!(pids, vec![10, 11, 12, 13]);
    }

    #[test]
    fn shell_join_quotes_every_word() {
        assert_eq!(
            shell_join(&["echo".into(), "it's".into(), "a b".into()]),
            "exec 'echo' 'it'\\''s' 'a b'"
        );
    }

    #[test]
    fn own_process_is_alive_and_a_wrong_start_time_is_not() {
        let me = i32::try_from(std::process::id()).unwrap();
        let start = start_time(me).unwrap();
        assert!(alive(me, start));
        assert!(!alive(me, start + 1));
    }
}
