//! The provider seam: what a backend of external instances must answer, and the optional
//! capabilities (logs, exec, port-forward, stats) the kubelet API asks for separately.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite};

/// What a provider offers, read once when its handler starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// How often the notify loop asks the provider for instance states.
    pub poll_interval: Duration,
    /// Node capacity advertised on the virtual node (`cpu`, `memory`, `pods`, ...), as
    /// Kubernetes quantities.
    pub capacity: BTreeMap<String, String>,
    /// Capacity types the provider sells, in order of preference (`on-demand`, `spot`).
    /// Placement writes the first one the blocklist does not hold.
    pub capacity_types: Vec<String>,
}

impl Default for Capabilities {
    fn default() -> Self {
        let capacity = [("cpu", "64"), ("memory", "256Gi"), ("pods", "10000")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Capabilities {
            poll_interval: Duration::from_secs(5),
            capacity,
            capacity_types: vec!["on-demand".to_string()],
        }
    }
}

/// Everything a provider needs to provision one pod's instance. Built from the Pod alone
/// (plus the capacity-type annotation placement wrote), so a retry builds the same request.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ProvisionRequest {
    /// The claim ([`crate::claim_name`]): the provider tags the instance with it and must
    /// answer a second provision of the same claim with the instance it already has.
    pub claim: String,
    /// Namespace of the pod.
    pub namespace: String,
    /// Name of the pod.
    pub pod_name: String,
    /// The first container's image.
    pub image: String,
    /// The first container's `command`.
    pub command: Vec<String>,
    /// The first container's `args`.
    pub args: Vec<String>,
    /// The first container's literal environment (`value`, not `valueFrom`).
    pub env: Vec<(String, String)>,
    /// The first container's `workingDir`, if set.
    pub working_dir: Option<String>,
    /// The capacity type placement chose, if any.
    pub capacity_type: Option<String>,
    /// The first container's `stdin`: keep a standard input open that `kubectl attach -i`
    /// can write to (otherwise the process reads end of file).
    pub stdin: bool,
    /// The first container's `tty`: run the process on a terminal.
    pub tty: bool,
    /// The first container's name (reported in stats).
    pub container: String,
    /// The pod's UID (reported in stats).
    pub pod_uid: String,
}

/// Where an instance is in its life, as the provider sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InstanceState {
    /// Being created or booted.
    Pending,
    /// Up.
    Running,
    /// Finished with an exit code (0 is success).
    Exited {
        /// The exit code; a signal death is 128 + the signal number.
        code: i32,
    },
    /// Gone or broken for a reason the provider can name.
    Failed {
        /// What happened.
        reason: String,
    },
}

/// One instance as a provider reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    /// The provider's identifier (a VM id, a PID...); written to the pod's
    /// `instance-id` annotation.
    pub id: String,
    /// The claim tag the instance carries.
    pub claim: String,
    /// Its state.
    pub state: InstanceState,
    /// Where it answers (a host name or address, maybe with a port), if known.
    pub endpoint: Option<String>,
    /// Its IP address, if it has one (written to `status.podIP`).
    pub ip: Option<String>,
    /// When it started, RFC 3339, if known (written to the container's `startedAt`).
    pub started_at: Option<String>,
    /// How many times the provider restarted the instance's workload in place (for
    /// example for an image change): the container's `restartCount`. A provider keeps it
    /// with the instance, so a restarted manager reads the same count.
    pub restart_count: i32,
}

/// What a placement refusal blocks: the whole provider, or one capacity type of it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockScope {
    /// Every request to this provider.
    Provider,
    /// Requests for one capacity type (for example spot capacity ran out).
    CapacityType(String),
}

/// Why a provider call did not succeed. The classes have different consequences, so they
/// are variants, not message texts.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProviderError {
    /// The provider answered and said no (quota, no capacity): placement moves on.
    #[error("provider refused the request ({scope:?}): {reason}")]
    Refused {
        /// What the refusal covers.
        scope: BlockScope,
        /// The provider's words.
        reason: String,
    },
    /// The provider could not be asked. Ownership of instances is unknown: nothing may be
    /// created or terminated on this answer.
    #[error("provider unreachable: {reason}")]
    Unreachable {
        /// What failed.
        reason: String,
    },
    /// The request reached the provider and failed there.
    #[error("provider operation {operation} failed: {reason}")]
    Failed {
        /// Which operation.
        operation: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// The optional capability is not offered by this provider.
    #[error("the provider does not support {0}")]
    Unsupported(&'static str),
    /// No such instance.
    #[error("instance {0} not found")]
    NotFound(String),
}

/// A backend of external instances. One virtual node per provider.
///
/// Every method is safe to call again after a crash: `provision` answers the existing
/// instance for a claim it already has, `terminate` of a gone instance succeeds.
pub trait Provider: Send + Sync + 'static {
    /// The provider's name (`process`, `mem`...): the node is `nebula-<name>`.
    fn name(&self) -> &str;
    /// What it offers.
    fn capabilities(&self) -> Capabilities;
    /// Creates the instance for `req.claim`, or returns the one that claim already has.
    fn provision<'a>(
        &'a self,
        req: &'a ProvisionRequest,
    ) -> BoxFuture<'a, Result<Instance, ProviderError>>;
    /// Ends an instance; an instance that is already gone is a success.
    fn terminate<'a>(&'a self, instance_id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>>;
    /// Every instance the provider holds, with its claim tag. `Unreachable` when it cannot
    /// be asked: never an empty list.
    fn list(&self) -> BoxFuture<'_, Result<Vec<Instance>, ProviderError>>;
    /// One instance's current state; `Ok(None)` when it no longer exists.
    fn status<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Instance>, ProviderError>>;
    /// Whether the provider can be used now; while it fails the node is not Ready and its
    /// lease is not renewed.
    fn health(&self) -> BoxFuture<'_, Result<(), ProviderError>>;
    /// Log streaming, if offered.
    fn log_streamer(&self) -> Option<&dyn LogStreamer> {
        None
    }
    /// Exec, if offered.
    fn executor(&self) -> Option<&dyn Executor> {
        None
    }
    /// Port-forward, if offered.
    fn port_forwarder(&self) -> Option<&dyn PortForwarder> {
        None
    }
    /// Resource statistics, if offered.
    fn stats(&self) -> Option<&dyn StatsSource> {
        None
    }
    /// Attach to the instance's own process, if offered.
    fn attacher(&self) -> Option<&dyn Attacher> {
        None
    }
    /// Applies a change of the pod's mutable fields ([`UpdateRequest`]) to its instance and
    /// answers the instance as it is afterwards (its id may change, for example when the
    /// change restarts it). Idempotent: the same request twice changes nothing the second
    /// time. A provider that cannot apply a change answers
    /// [`ProviderError::Unsupported`] (the default), and the pod controller reports that on
    /// the pod instead of retrying.
    fn update<'a>(
        &'a self,
        instance_id: &'a str,
        req: &'a UpdateRequest,
    ) -> BoxFuture<'a, Result<Instance, ProviderError>> {
        let _ = (instance_id, req);
        Box::pin(async { Err(ProviderError::Unsupported("updating a running instance")) })
    }
    /// What a client needs to connect to the instance (a token, a key, a password), which
    /// the pod controller writes to the pod's connect Secret before it reports the pod
    /// Running. `Ok(None)` (the default): this provider issues no credential and no Secret
    /// is written. Asked again after a restart, it must answer the same credential.
    fn connect_credential<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<ConnectCredential>, ProviderError>> {
        let _ = instance_id;
        Box::pin(async { Ok(None) })
    }
}

/// The mutable fields of a pod, as kube-apiserver lets them change on a pod that exists
/// (`ValidatePodUpdate`): labels, annotations, the container image, `activeDeadlineSeconds`
/// and added tolerations. Command, args, env and working directory cannot change, so they
/// are not here. Annotations under `outpost.dhnt.io/` are this crate's own bookkeeping and
/// are left out.
#[derive(Clone, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct UpdateRequest {
    /// The claim of the instance.
    pub claim: String,
    /// The pod's labels.
    pub labels: BTreeMap<String, String>,
    /// The pod's annotations, without `outpost.dhnt.io/` ones.
    pub annotations: BTreeMap<String, String>,
    /// The first container's image.
    pub image: String,
    /// `spec.activeDeadlineSeconds`.
    pub active_deadline_seconds: Option<i64>,
    /// `spec.tolerations`, each as `key[=value|:Exists]:effect` (for example
    /// `dedicated=gpu:NoSchedule`).
    pub tolerations: Vec<String>,
}

/// A credential for connecting to an instance: named values (for example `token`,
/// `endpoint`), stored in the pod's connect Secret. Its `Debug` shows the names only, and
/// the values are wiped from memory when it is dropped.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ConnectCredential {
    values: BTreeMap<String, String>,
}

impl ConnectCredential {
    /// An empty credential.
    pub fn new() -> ConnectCredential {
        ConnectCredential::default()
    }

    /// Adds a named value.
    pub fn with(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.values.insert(name.into(), value.into());
        self
    }

    /// The named values.
    pub fn values(&self) -> &BTreeMap<String, String> {
        &self.values
    }
}

impl std::fmt::Debug for ConnectCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectCredential")
            .field("names", &self.values.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Drop for ConnectCredential {
    fn drop(&mut self) {
        for v in std::mem::take(&mut self.values).into_values() {
            zeroize::Zeroize::zeroize(&mut v.into_bytes());
        }
    }
}

/// A byte stream read by the kubelet API.
pub type ByteStream = Pin<Box<dyn AsyncRead + Send>>;
/// A byte sink written by the kubelet API.
pub type ByteSink = Pin<Box<dyn AsyncWrite + Send>>;

/// Where one output stream (stdout or stderr) of an exec or attach session goes.
///
/// A provider that has the output as a reader (a process's pipe) hands it over with
/// [`ExecOutput::pump_from`]: to a kubelet API session that is the fast path (the session
/// reads the pipe straight into the buffer it sends frames from). Anything else writes to
/// it ([`AsyncWrite`]).
pub struct ExecOutput(OutputKind);

enum OutputKind {
    /// Any writer (tests, other callers).
    Writer(ByteSink),
    /// A stream of a kubelet API session.
    Session(kubestream::exec::Output),
}

impl ExecOutput {
    /// Output to any writer.
    pub fn writer(w: impl AsyncWrite + Send + 'static) -> ExecOutput {
        ExecOutput(OutputKind::Writer(Box::pin(w)))
    }

    /// Output to a stream of a kubelet API session.
    pub(crate) fn session(o: kubestream::exec::Output) -> ExecOutput {
        ExecOutput(OutputKind::Session(o))
    }

    /// Sends everything `from` yields up to its end of file (or first read error), then
    /// ends this output. Answers once the last of it was passed on, or the receiving side
    /// is gone.
    pub async fn pump_from<R>(self, mut from: R)
    where
        R: AsyncRead + Send + Unpin + 'static,
    {
        match self.0 {
            OutputKind::Session(o) => o.pump_from(from).await,
            OutputKind::Writer(mut w) => {
                use tokio::io::AsyncWriteExt;
                let _ = copy_large(&mut from, &mut w).await;
                let _ = w.shutdown().await;
            }
        }
    }
}

impl From<ByteSink> for ExecOutput {
    fn from(w: ByteSink) -> ExecOutput {
        ExecOutput(OutputKind::Writer(w))
    }
}

impl std::fmt::Debug for ExecOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.0 {
            OutputKind::Writer(_) => "ExecOutput::Writer",
            OutputKind::Session(_) => "ExecOutput::Session",
        })
    }
}

impl AsyncWrite for ExecOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.get_mut().0 {
            OutputKind::Writer(w) => w.as_mut().poll_write(cx, buf),
            OutputKind::Session(o) => Pin::new(o).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().0 {
            OutputKind::Writer(w) => w.as_mut().poll_flush(cx),
            OutputKind::Session(o) => Pin::new(o).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().0 {
            OutputKind::Writer(w) => w.as_mut().poll_shutdown(cx),
            OutputKind::Session(o) => Pin::new(o).poll_shutdown(cx),
        }
    }
}

/// Copies `from` to `to` in reads of up to 128 KiB. `tokio::io::copy` reads 8 KiB at a
/// time, and every chunk handed on becomes a frame, a flush and a TLS record downstream:
/// output of a fast command then costs several times its bytes.
async fn copy_large<R, W>(from: &mut R, to: &mut W) -> std::io::Result<u64>
where
    R: AsyncRead + Unpin + ?Sized,
    W: AsyncWrite + Unpin + ?Sized,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 128 * 1024];
    let mut total = 0u64;
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            to.flush().await?;
            return Ok(total);
        }
        to.write_all(&buf[..n]).await?;
        total += n as u64;
    }
}

/// A duplex stream (port-forward).
pub trait Duplex: AsyncRead + AsyncWrite + Send {}
impl<T: AsyncRead + AsyncWrite + Send> Duplex for T {}

/// Options of a log request (`kubectl logs`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// Keep the stream open and send new lines as they come.
    pub follow: bool,
    /// Only the last N lines.
    pub tail_lines: Option<u64>,
    /// Stop after this many bytes (timestamps included, as the kubelet counts them).
    pub limit_bytes: Option<u64>,
    /// Only lines written at or after this time, nanoseconds since the Unix epoch
    /// (`sinceSeconds` / `sinceTime`).
    pub since_unix_nanos: Option<i128>,
    /// Prefix each line with the time it was written (RFC 3339, nanoseconds).
    pub timestamps: bool,
}

/// Optional capability: the instance's console output.
pub trait LogStreamer: Send + Sync {
    /// Opens the instance's log (stdout and stderr, in order written where possible).
    fn logs<'a>(
        &'a self,
        instance_id: &'a str,
        opts: &'a LogOptions,
    ) -> BoxFuture<'a, Result<ByteStream, ProviderError>>;
}

/// The streams of one exec session.
pub struct ExecIo {
    /// Standard input, if the client sends one.
    pub stdin: Option<ByteStream>,
    /// Standard output, if the client wants it.
    pub stdout: Option<ExecOutput>,
    /// Standard error, if the client wants it (`None` with a terminal: it has one output).
    pub stderr: Option<ExecOutput>,
    /// Run the command on a terminal (`kubectl exec -t`): stdin and stdout are the
    /// terminal's.
    pub tty: bool,
    /// Terminal size changes as `(columns, rows)`, with a terminal.
    pub resize: Option<tokio::sync::mpsc::Receiver<(u16, u16)>>,
}

impl ExecIo {
    /// Pipes only: no terminal, no resize events.
    pub fn pipes(
        stdin: Option<ByteStream>,
        stdout: Option<ByteSink>,
        stderr: Option<ByteSink>,
    ) -> ExecIo {
        ExecIo {
            stdin,
            stdout: stdout.map(ExecOutput::from),
            stderr: stderr.map(ExecOutput::from),
            tty: false,
            resize: None,
        }
    }
}

impl std::fmt::Debug for ExecIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecIo")
            .field("stdin", &self.stdin.is_some())
            .field("stdout", &self.stdout.is_some())
            .field("stderr", &self.stderr.is_some())
            .field("tty", &self.tty)
            .finish()
    }
}

/// Optional capability: run a command in the instance's environment.
pub trait Executor: Send + Sync {
    /// Runs `command` to completion, pumping `io`; answers its exit code.
    fn exec<'a>(
        &'a self,
        instance_id: &'a str,
        command: Vec<String>,
        io: ExecIo,
    ) -> BoxFuture<'a, Result<i32, ProviderError>>;
}

/// Optional capability: a connection to a port of the instance.
pub trait PortForwarder: Send + Sync {
    /// Connects to `port` of the instance.
    fn connect<'a>(
        &'a self,
        instance_id: &'a str,
        port: u16,
    ) -> BoxFuture<'a, Result<Pin<Box<dyn Duplex>>, ProviderError>>;
}

/// Resource usage of one instance.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InstanceStats {
    /// CPU time used since the instance started, nanoseconds (all its processes).
    pub cpu_nanos: u64,
    /// Resident memory, bytes (all its processes).
    pub memory_bytes: u64,
    /// Working-set memory, bytes: what the kubelet reports as `workingSetBytes` (for a
    /// process group without a cgroup of its own, its resident memory).
    pub working_set_bytes: u64,
    /// When the instance started, seconds since the Unix epoch, if known.
    pub start_time_unix: Option<u64>,
    /// When these figures were read, nanoseconds since the Unix epoch.
    pub timestamp_unix_nanos: u64,
    /// The container the instance runs, if the provider recorded it.
    pub container: Option<String>,
    /// The UID of the pod, if the provider recorded it.
    pub pod_uid: Option<String>,
}

/// Optional capability: per-instance statistics (the kubelet's stats summary).
pub trait StatsSource: Send + Sync {
    /// Current usage of an instance.
    fn stats<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<InstanceStats, ProviderError>>;
}

/// Optional capability: attach to the instance's own process (`kubectl attach`): its
/// live standard output and error from now on, and its standard input.
pub trait Attacher: Send + Sync {
    /// Pumps `io` against the instance's process until its output ends (the process
    /// exited) or the client's output streams close. A client stdin is written to the
    /// process's standard input (dropped when the instance keeps none open, as a
    /// container runtime does for a container without `stdin: true`).
    fn attach<'a>(
        &'a self,
        instance_id: &'a str,
        io: ExecIo,
    ) -> BoxFuture<'a, Result<(), ProviderError>>;
}
