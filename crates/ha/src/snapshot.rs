//! etcd snapshots: save one over etcd's snapshot API, and restore one on the seed node.
//!
//! - [`save_snapshot`] streams a member's backend through the maintenance `Snapshot` RPC
//!   (the stream etcd ends with the SHA-256 of the database, which `etcdctl snapshot
//!   restore` checks) and writes it with `common::fsutil`'s atomic writer under a name that
//!   must not exist yet (a temporary file, fsync, `RENAME_NOREPLACE`, directory fsync): a
//!   crash leaves no half-written snapshot under the name, and an existing file is never
//!   replaced. The file is the one `etcdctl snapshot save` writes.
//! - [`restore_snapshot`] resets this node's etcd to a **new single-member cluster** holding
//!   the snapshot's data (the seed's half of a restore; the other control planes then
//!   [`crate::rejoin`] it). etcd 3.4 ships no `etcdutl`, so the restore itself is the real
//!   `etcdctl snapshot restore`, run into a staging directory beside the data directory;
//!   the staged directory is then switched in with one `renameat2(RENAME_EXCHANGE)` and the
//!   old data kept aside as `<etcd-dir>.before-restore-<unix-time>`. It runs under the node
//!   maintenance lock and the etcd data lock, so it **refuses while `stratum-server up` (or
//!   anything else) runs this node's etcd**, naming that process: stop it first, restore,
//!   then start it again. It never stops a running node by itself.
//!
//! The restored cluster gets a fresh `--initial-cluster-token`, so its cluster and member
//! IDs differ from the old cluster's: a member of the old cluster that is still running
//! cannot mistake the seed for its old peer, and a rejoin tells the two clusters apart.

use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nix::fcntl::RenameFlags;
use tracing::info;

use crate::etcd::{self, EtcdError, EtcdOptions};
use crate::maintenance::{EtcdDataLock, MaintenanceError, NodeLock};
use crate::nodestate::{ClusterState, NodeState, NodeStateError};

/// How long the stream may go without a chunk before the save gives up on a member.
pub const CHUNK_TIMEOUT: Duration = Duration::from_secs(60);
/// The marker a staged restore carries until it is switched in: a staging directory
/// without it is the old data an interrupted switch left there, and is kept, never removed.
pub const STAGED_MARKER: &str = ".stratum-restore-staged";

/// A snapshot save or restore that failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The snapshot file exists: it is never replaced.
    #[error(
        "{} exists; a snapshot never replaces a file: choose another name or move it away",
        path.display()
    )]
    Exists {
        /// The file.
        path: PathBuf,
    },
    /// No member could stream a snapshot.
    #[error("no etcd member streamed a snapshot: {}", tried.join("; "))]
    NoSnapshot {
        /// `endpoint: why` for each member tried.
        tried: Vec<String>,
    },
    /// An etcd client could not be set up.
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    /// A file could not be written.
    #[error("cannot write the snapshot")]
    Write(#[source] common::fsutil::FsError),
    /// Another command holds a lock of this node.
    #[error(transparent)]
    Lock(#[from] MaintenanceError),
    /// The node state could not be read or written.
    #[error(transparent)]
    State(#[from] NodeStateError),
    /// This node has no state: it is not a control plane.
    #[error(
        "{} has no node state: this is not a control-plane node brought up by `stratum-server \
         up` or `join`; nothing was changed",
        data_dir.display()
    )]
    NoState {
        /// The data dir.
        data_dir: PathBuf,
    },
    /// A join intent survives: the node is half-joined.
    #[error(
        "a join intent survives in {}: this node is half-joined; finish or roll back that join \
         first (`stratum-server up` explains). Nothing was changed",
        data_dir.display()
    )]
    HalfJoined {
        /// The data dir.
        data_dir: PathBuf,
    },
    /// etcdctl could not be run, or refused.
    #[error("`{command}` failed: {reason}")]
    Etcdctl {
        /// The command line (no secrets: paths and names only).
        command: String,
        /// Its stderr, or why it could not be run.
        reason: String,
    },
    /// A local file operation failed.
    #[error("cannot {op} {}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SnapshotError {
    let path = path.to_path_buf();
    move |source| SnapshotError::Io { op, path, source }
}

/// A saved snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotSaved {
    /// The file written.
    pub path: PathBuf,
    /// The member that streamed it.
    pub endpoint: String,
    /// Its size in bytes.
    pub bytes: u64,
}

/// Streams a snapshot from the first of `endpoints` that serves one into `path`, which
/// must not exist. `progress` is called with the bytes received so far after each chunk.
/// Chunks go straight to a temporary file beside `path` (a control plane's database can be
/// gigabytes: etcd's default quota is 2 GiB, nothing of that size is held in memory), which
/// is renamed into place only once the stream ended cleanly; a broken stream, or another
/// file appearing at `path` meanwhile, leaves nothing behind.
pub async fn save_snapshot(
    opts: &EtcdOptions,
    endpoints: &[String],
    path: &Path,
    mut progress: impl FnMut(&str, u64),
) -> Result<SnapshotSaved, SnapshotError> {
    if endpoints.is_empty() {
        return Err(EtcdError::NoEndpoints.into());
    }
    if path.symlink_metadata().is_ok() {
        return Err(SnapshotError::Exists {
            path: path.to_path_buf(),
        });
    }
    // The stream can outlast any per-request timeout: each chunk has CHUNK_TIMEOUT instead.
    let mut stream_opts = opts.clone();
    stream_opts.request_timeout = Duration::from_secs(24 * 3600);
    let mut tried = Vec::new();
    for endpoint in endpoints {
        let mut file =
            common::fsutil::PendingFile::create(path, 0o600).map_err(SnapshotError::Write)?;
        match stream_one(&stream_opts, endpoint, &mut file, &mut progress).await {
            Ok(size) => {
                let created = file.commit(true).map_err(SnapshotError::Write)?;
                if !created {
                    return Err(SnapshotError::Exists {
                        path: path.to_path_buf(),
                    });
                }
                info!(%endpoint, bytes = size, path = %path.display(), "snapshot saved");
                return Ok(SnapshotSaved {
                    path: path.to_path_buf(),
                    endpoint: endpoint.clone(),
                    bytes: size,
                });
            }
            Err(StreamError::Setup(e)) => return Err(e.into()),
            Err(StreamError::Write(e)) => return Err(SnapshotError::Write(*e)),
            Err(StreamError::Failed(reason)) => tried.push(format!("{endpoint}: {reason}")),
        }
    }
    Err(SnapshotError::NoSnapshot { tried })
}

enum StreamError {
    Setup(EtcdError),
    /// The local file could not be written: no other member is tried.
    Write(Box<common::fsutil::FsError>),
    Failed(String),
}

/// Streams one member's snapshot into `file`; the bytes written.
async fn stream_one(
    opts: &EtcdOptions,
    endpoint: &str,
    file: &mut common::fsutil::PendingFile,
    progress: &mut impl FnMut(&str, u64),
) -> Result<u64, StreamError> {
    let client = etcd::connect_one(opts, endpoint)
        .await
        .map_err(StreamError::Setup)?;
    let first = tokio::time::timeout(
        opts.connect_timeout + CHUNK_TIMEOUT,
        client.maintenance_client().snapshot(),
    )
    .await;
    let mut stream = match first {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(StreamError::Failed(e.to_string())),
        Err(_) => return Err(StreamError::Failed("no answer".into())),
    };
    let mut bytes = 0u64;
    loop {
        match tokio::time::timeout(CHUNK_TIMEOUT, stream.message()).await {
            Ok(Ok(Some(chunk))) => {
                file.write_all(chunk.blob())
                    .map_err(|e| StreamError::Write(Box::new(e)))?;
                bytes += chunk.blob().len() as u64;
                // The last chunk (etcd's checksum) says nothing remains; read on to the end
                // of the stream all the same, so a trailing error is not missed.
                progress(endpoint, bytes);
            }
            Ok(Ok(None)) => break,
            Ok(Err(e)) => {
                return Err(StreamError::Failed(format!(
                    "the stream broke after {bytes} bytes: {e}"
                )));
            }
            Err(_) => {
                return Err(StreamError::Failed(format!(
                    "no chunk for {CHUNK_TIMEOUT:?} after {bytes} bytes"
                )));
            }
        }
    }
    if bytes == 0 {
        return Err(StreamError::Failed("the stream was empty".into()));
    }
    Ok(bytes)
}

/// What `etcdctl snapshot status` reports about a snapshot file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotStatus {
    /// The database hash.
    pub hash: u64,
    /// The revision the snapshot was taken at.
    pub revision: i64,
    /// How many keys it holds.
    pub total_key: u64,
    /// The database size in bytes.
    pub total_size: u64,
}

fn run_etcdctl(etcdctl: &Path, args: &[String]) -> Result<Vec<u8>, SnapshotError> {
    let command = format!("{} {}", etcdctl.display(), args.join(" "));
    let out = Command::new(etcdctl)
        .args(args)
        .env("ETCDCTL_API", "3")
        .output()
        .map_err(|e| SnapshotError::Etcdctl {
            command: command.clone(),
            reason: format!(
                "cannot run it ({e}); install etcdctl (Debian: etcd-client) or pass --etcdctl"
            ),
        })?;
    if !out.status.success() {
        return Err(SnapshotError::Etcdctl {
            command,
            reason: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(out.stdout)
}

/// `etcdctl snapshot status FILE -w json`: the file is a readable etcd snapshot.
pub fn snapshot_status(etcdctl: &Path, file: &Path) -> Result<SnapshotStatus, SnapshotError> {
    let out = run_etcdctl(
        etcdctl,
        &[
            "snapshot".into(),
            "status".into(),
            file.display().to_string(),
            "-w".into(),
            "json".into(),
        ],
    )?;
    serde_json::from_slice(&out).map_err(|e| SnapshotError::Etcdctl {
        command: format!("{} snapshot status", etcdctl.display()),
        reason: format!("unexpected output ({e})"),
    })
}

/// What [`restore_snapshot`] is given.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    /// This node's data (state) directory.
    pub data_dir: PathBuf,
    /// The snapshot file.
    pub snapshot: PathBuf,
    /// The etcdctl binary (3.4).
    pub etcdctl: PathBuf,
}

/// What a restore did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// The snapshot as etcdctl reported it.
    pub status: SnapshotStatus,
    /// The member name of the new single-member cluster.
    pub member: String,
    /// Its peer URL.
    pub peer_url: String,
    /// Its client URL: what the other control planes `rejoin --server`.
    pub client_url: String,
    /// Where the old etcd data was moved (none when there was none).
    pub old_data: Option<PathBuf>,
}

pub(crate) fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub(crate) fn sibling(dir: &Path, suffix: &str) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    dir.with_file_name(name)
}

fn parent_dir(path: &Path) -> Result<std::fs::File, SnapshotError> {
    let parent = path.parent().unwrap_or(Path::new("/"));
    std::fs::File::open(parent).map_err(io("open the directory", parent))
}

/// Moves `from` to `to` (same directory), refusing to replace anything at `to`.
pub(crate) fn rename_noreplace(from: &Path, to: &Path) -> Result<(), SnapshotError> {
    let dir = parent_dir(from)?;
    let (Some(a), Some(b)) = (from.file_name(), to.file_name()) else {
        return Err(io("rename", from)(std::io::Error::other("not a file name")));
    };
    nix::fcntl::renameat2(
        dir.as_fd(),
        a,
        dir.as_fd(),
        b,
        RenameFlags::RENAME_NOREPLACE,
    )
    .map_err(|e| io("rename", from)(std::io::Error::from(e)))?;
    dir.sync_all().map_err(io("sync the directory of", from))
}

/// Resets this node's etcd to a new single-member cluster holding `opts.snapshot`; see the
/// module docs. `progress` receives one line per step.
pub fn restore_snapshot(
    opts: &RestoreOptions,
    mut progress: impl FnMut(&str),
) -> Result<Restored, SnapshotError> {
    let _maintenance = NodeLock::acquire(&opts.data_dir, "snapshot restore")?;
    let _data = EtcdDataLock::acquire(&opts.data_dir, "snapshot restore")?;
    let mut state = NodeState::load(&opts.data_dir)?.ok_or_else(|| SnapshotError::NoState {
        data_dir: opts.data_dir.clone(),
    })?;
    if crate::journal::JoinIntentJournal::new(&opts.data_dir)
        .survives()
        .map_err(|e| {
            io("read the join intent in", &opts.data_dir)(std::io::Error::other(e.to_string()))
        })?
    {
        return Err(SnapshotError::HalfJoined {
            data_dir: opts.data_dir.clone(),
        });
    }
    let status = snapshot_status(&opts.etcdctl, &opts.snapshot)?;
    progress(&format!(
        "snapshot {}: revision {}, {} keys, {} bytes",
        opts.snapshot.display(),
        status.revision,
        status.total_key,
        status.total_size
    ));
    let etcd_dir = state.etcd.data_dir.clone();
    let staging = sibling(&etcd_dir, ".restore-staging");
    let aside = sibling(&etcd_dir, &format!(".before-restore-{}", now_unix()));
    // What an earlier, interrupted restore left: a staged copy (marker present) is ours to
    // remove; a staging directory without the marker is old data an interrupted switch
    // moved there, and is kept.
    if staging.symlink_metadata().is_ok() {
        if staging.join(STAGED_MARKER).exists() {
            std::fs::remove_dir_all(&staging).map_err(io("remove the stale staging", &staging))?;
        } else {
            rename_noreplace(&staging, &aside)?;
            progress(&format!(
                "kept the data an interrupted restore left in {} as {}",
                staging.display(),
                aside.display()
            ));
        }
    }
    let token = format!("stratum-restore-{}", now_unix());
    let initial_cluster = format!("{}={}", state.etcd.name, state.etcd.peer_url);
    run_etcdctl(
        &opts.etcdctl,
        &[
            "snapshot".into(),
            "restore".into(),
            opts.snapshot.display().to_string(),
            format!("--name={}", state.etcd.name),
            format!("--initial-cluster={initial_cluster}"),
            format!("--initial-advertise-peer-urls={}", state.etcd.peer_url),
            format!("--initial-cluster-token={token}"),
            format!("--data-dir={}", staging.display()),
        ],
    )?;
    common::fsutil::write_atomic(&staging.join(STAGED_MARKER), b"", 0o600, None)
        .map_err(SnapshotError::Write)?;
    progress(&format!("restored into {}", staging.display()));
    // The switch: one atomic exchange when there is old data, else a plain move.
    let old_data = if etcd_dir.symlink_metadata().is_ok() {
        let dir = parent_dir(&etcd_dir)?;
        let (Some(a), Some(b)) = (staging.file_name(), etcd_dir.file_name()) else {
            return Err(io("switch in", &etcd_dir)(std::io::Error::other(
                "not a file name",
            )));
        };
        nix::fcntl::renameat2(dir.as_fd(), a, dir.as_fd(), b, RenameFlags::RENAME_EXCHANGE)
            .map_err(|e| {
                io("switch in the restored data at", &etcd_dir)(std::io::Error::from(e))
            })?;
        dir.sync_all()
            .map_err(io("sync the directory of", &etcd_dir))?;
        rename_noreplace(&staging, &aside)?;
        Some(aside)
    } else {
        rename_noreplace(&staging, &etcd_dir)?;
        None
    };
    common::fsutil::remove_file_synced(&etcd_dir.join(STAGED_MARKER))
        .map_err(SnapshotError::Write)?;
    if let Some(old) = &old_data {
        progress(&format!(
            "switched the restored data in; the old data is kept in {} (remove it once the \
             cluster is whole again)",
            old.display()
        ));
    }
    state.etcd.initial_cluster = initial_cluster;
    state.etcd.initial_cluster_state = ClusterState::New;
    state.etcd.member_id = None;
    state.etcd.learner = false;
    state.cluster_endpoints = vec![state.etcd.client_url.clone()];
    state.save(&opts.data_dir)?;
    // A rejoin this node had in progress is moot: it is the seed now.
    let _ = common::fsutil::remove_file_synced(
        &opts.data_dir.join(hacore::rejoin::REJOIN_JOURNAL_FILE),
    );
    progress(
        "node state rewritten: a new single-member cluster; start it with `stratum-server up`",
    );
    Ok(Restored {
        status,
        member: state.etcd.name.clone(),
        peer_url: state.etcd.peer_url.clone(),
        client_url: state.etcd.client_url.clone(),
        old_data,
    })
}
