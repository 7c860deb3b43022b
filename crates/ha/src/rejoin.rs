//! `stratum-server rejoin --server SEED`: re-add this control plane's etcd to a cluster
//! that `snapshot restore` reset on the seed node (the seed's `RejoinEtcd`).
//!
//! Under the node maintenance lock, then the etcd data lock (both non-blocking, naming the
//! holder; a running `stratum-server up` holds the data lock, so the rejoin refuses until
//! it is stopped), the rejoin:
//!
//! 1. refuses while the **old** cluster still has quorum (a member of it answers a
//!    linearizable read with a cluster ID other than the seed's), unless `force`: wiping a
//!    member of a working cluster would cost that cluster a voter;
//! 2. moves the old cluster's etcd data aside (`<etcd-dir>.before-rejoin-<unix-time>`);
//! 3. adds this member to the seed's cluster as a **learner** (adopting a member that
//!    already has this node's peer URL: a lost answer or an earlier run) and rewrites the
//!    node state as a joining member (`existing`, learner);
//! 4. starts etcd through the supervisor, waits for it to answer, promotes it once it has
//!    caught up, records the promotion in the node state, and stops it again. The command
//!    then runs the node as `up` does ([`crate::node::run_node`]) at once: with two voters,
//!    a member left stopped would cost the seed's cluster its quorum.
//!
//! Each step is journaled in `<state-dir>/rejoin.json` before the next; a re-run resumes
//! where the last one stopped ([`hacore::rejoin::plan_rejoin`]), and never wipes data the
//! new cluster wrote.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::etcd::learner::{self, LearnerError, Queueing};
use crate::etcd::{self, EtcdOptions};
use crate::join::etcd_options;
use crate::maintenance::{EtcdDataLock, MaintenanceError, NodeLock};
use crate::nodestate::{ClusterState, NodeConfig, NodeState, NodeStateError, Origin};
use crate::supervisor::{self, Backoff, Supervisor};

pub use hacore::rejoin::{
    OldMemberProbe, REJOIN_JOURNAL_FILE, RejoinPhase, RejoinPlanError, RejoinRecord, RejoinStep,
    RejoinView, SeedMember, plan_rejoin, quorate_old_member, seed_endpoint,
};

/// What `rejoin` was given.
#[derive(Debug, Clone)]
pub struct RejoinOptions {
    /// This node's data (state) directory.
    pub data_dir: PathBuf,
    /// `--server`: the seed's address, `HOST[:PORT]` or an etcd client URL.
    pub server: String,
    /// Wipe even when the old cluster still has quorum.
    pub force: bool,
    /// Ports, the etcd binary, timeouts.
    pub config: NodeConfig,
    /// How long the learner add may queue.
    pub queueing: Queueing,
}

/// A rejoin that stopped.
#[derive(Debug, thiserror::Error)]
pub enum RejoinError {
    /// Another command holds a lock of this node.
    #[error(transparent)]
    Lock(#[from] MaintenanceError),
    /// The node state could not be read or written.
    #[error(transparent)]
    State(#[from] NodeStateError),
    /// This node has no state.
    #[error(
        "{} has no node state: only a control plane brought up by `up` or `join` can rejoin; \
         a new node joins with `stratum-server join`. Nothing was changed",
        data_dir.display()
    )]
    NoState {
        /// The data dir.
        data_dir: PathBuf,
    },
    /// The journal names another seed.
    #[error(transparent)]
    Plan(#[from] RejoinPlanError),
    /// The seed's etcd did not answer.
    #[error(
        "the seed's etcd at {seed} did not answer ({reason}); is the restored seed running \
         (`stratum-server up` on it)? Nothing was changed"
    )]
    SeedUnreachable {
        /// The seed endpoint.
        seed: String,
        /// Why.
        reason: String,
    },
    /// The old cluster still has quorum.
    #[error(
        "the old etcd cluster still has quorum ({endpoint} answered a linearizable read, in \
         cluster {cluster:x}, not the seed's {seed_cluster:x}): wiping this member would cost \
         that cluster a voter. Stop the old cluster's members (or remove this one from it) \
         first, or pass --force if it is to be abandoned. Nothing was changed"
    )]
    OldClusterQuorate {
        /// The member that answered.
        endpoint: String,
        /// Its cluster ID.
        cluster: u64,
        /// The seed's cluster ID.
        seed_cluster: u64,
    },
    /// The journal could not be read or written.
    #[error("cannot {op} the rejoin journal {}", path.display())]
    Journal {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The old data could not be moved aside.
    #[error("cannot move the old etcd data aside")]
    Wipe(#[source] crate::snapshot::SnapshotError),
    /// The learner add failed.
    #[error("the learner add to the seed's cluster failed; re-run the rejoin to retry")]
    Add(#[source] LearnerError),
    /// The supervisor could not start etcd.
    #[error(transparent)]
    Supervisor(#[from] supervisor::SupervisorError),
    /// etcd did not answer after its start.
    #[error(
        "this node's etcd did not answer within {waited:?} of its start ({last}; log: {}); \
         re-run the rejoin once the cause is fixed: it resumes here",
        log.display()
    )]
    Start {
        /// How long it waited.
        waited: Duration,
        /// The last answer.
        last: String,
        /// etcd's log.
        log: PathBuf,
    },
    /// The promotion failed.
    #[error("the learner was not promoted; re-run the rejoin to retry (it resumes here)")]
    Promote(#[source] LearnerError),
    /// Interrupted between steps.
    #[error("interrupted before the step \"{next}\"; re-run the rejoin to resume")]
    Cancelled {
        /// The step that did not run.
        next: RejoinStep,
    },
}

/// What a rejoin did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejoined {
    /// The seed endpoint.
    pub seed: String,
    /// The steps run this time.
    pub steps: Vec<RejoinStep>,
    /// Whether a journal from an earlier run was resumed.
    pub resumed: bool,
    /// This member's ID in the seed's cluster (`None` when it was already a voter).
    pub member_id: Option<u64>,
    /// Where the old data was moved.
    pub old_data: Option<PathBuf>,
    /// The node state as the rejoin left it: what [`crate::node::run_node`] starts next.
    pub state: NodeState,
}

fn journal_path(data_dir: &Path) -> PathBuf {
    data_dir.join(REJOIN_JOURNAL_FILE)
}

/// The surviving rejoin journal of `data_dir`, `None` when there is none. A file that
/// cannot be read or parsed is an error, never "none".
pub fn read_journal(data_dir: &Path) -> Result<Option<RejoinRecord>, RejoinError> {
    let path = journal_path(data_dir);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(RejoinError::Journal {
                op: "read",
                path,
                source,
            });
        }
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| RejoinError::Journal {
            op: "parse",
            path,
            source: std::io::Error::other(e.to_string()),
        })
}

fn write_journal(data_dir: &Path, record: &RejoinRecord) -> Result<(), RejoinError> {
    let path = journal_path(data_dir);
    let bytes = serde_json::to_vec_pretty(record).map_err(|e| RejoinError::Journal {
        op: "encode",
        path: path.clone(),
        source: std::io::Error::other(e.to_string()),
    })?;
    common::fsutil::write_atomic(&path, &bytes, 0o600, None).map_err(|e| RejoinError::Journal {
        op: "write",
        path,
        source: e.source,
    })
}

/// The cluster ID of the cluster `endpoint` serves a linearizable read for: proof that
/// cluster has a leader and a quorum.
async fn quorate_cluster(opts: &EtcdOptions, endpoint: &str) -> Result<u64, String> {
    let mut client = etcd::connect_one(opts, endpoint)
        .await
        .map_err(|e| e.to_string())?;
    let read = client.get(
        "stratum/rejoin-quorum-probe",
        Some(etcd_client::GetOptions::new().with_count_only()),
    );
    match tokio::time::timeout(opts.connect_timeout + opts.request_timeout, read).await {
        Ok(Ok(r)) => r
            .header()
            .map(|h| h.cluster_id())
            .ok_or_else(|| "an answer without a header".to_string()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer".into()),
    }
}

/// Every old-cluster client URL to probe: the ones the node state recorded, and every
/// member those know of, less this node's own and the seed's.
async fn old_endpoints(opts: &EtcdOptions, state: &NodeState, seed: &str) -> Vec<String> {
    let mine = &state.etcd.client_url;
    let mut known: Vec<String> = state
        .cluster_endpoints
        .iter()
        .filter(|e| *e != mine && e.as_str() != seed)
        .cloned()
        .collect();
    if !known.is_empty()
        && let Ok((_, members)) = etcd::member_list_via(opts, &known).await
    {
        for url in members.iter().flat_map(|m| m.client_urls.iter()) {
            if url != mine && url != seed && !known.contains(url) {
                known.push(url.clone());
            }
        }
    }
    known
}

/// Runs (or resumes) the rejoin; see the module docs. `progress` receives one line per
/// step; `cancel` is honoured between steps and while waiting for etcd. The etcd data lock
/// comes back still held, for [`crate::node::run_node_holding`]: between the rejoin and the
/// node's run, no snapshot restore or second rejoin can take it.
pub async fn rejoin_etcd(
    opts: &RejoinOptions,
    mut progress: impl FnMut(&str),
    cancel: &CancellationToken,
) -> Result<(Rejoined, EtcdDataLock), RejoinError> {
    let _maintenance = NodeLock::acquire(&opts.data_dir, "rejoin")?;
    let data = EtcdDataLock::acquire(&opts.data_dir, "rejoin")?;
    let mut state = NodeState::load(&opts.data_dir)?.ok_or_else(|| RejoinError::NoState {
        data_dir: opts.data_dir.clone(),
    })?;
    let seed = seed_endpoint(&opts.server, opts.config.etcd.client_port);
    let etcd_opts = etcd_options(&state.pki_dir);
    let record = read_journal(&opts.data_dir)?;
    let resumed = record.is_some();
    if let Some(r) = &record {
        progress(&format!(
            "resuming the rejoin journaled in {}",
            journal_path(&opts.data_dir).display()
        ));
        info!(phase = ?r.phase, "resuming a rejoin");
    }
    let seed_cluster = quorate_cluster(&etcd_opts, &seed).await.map_err(|reason| {
        RejoinError::SeedUnreachable {
            seed: seed.clone(),
            reason,
        }
    })?;
    let (_, seed_members) =
        learner::linearizable_member_list(&etcd_opts, std::slice::from_ref(&seed))
            .await
            .map_err(|reason| RejoinError::SeedUnreachable {
                seed: seed.clone(),
                reason,
            })?;
    let in_seed = seed_members
        .iter()
        .find(|m| m.peer_urls.contains(&state.etcd.peer_url))
        .map(|m| SeedMember {
            is_learner: m.is_learner,
            started: !m.client_urls.is_empty(),
        });
    let steps = plan_rejoin(RejoinView {
        record: record.as_ref(),
        seed: &seed,
        data_present: state.etcd.data_dir.symlink_metadata().is_ok(),
        in_seed,
    })?;
    progress(&format!(
        "seed {seed} (cluster {seed_cluster:x}); steps: {}",
        steps
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let mut record = record.unwrap_or_else(|| RejoinRecord {
        seed: seed.clone(),
        member_name: state.etcd.name.clone(),
        peer_url: state.etcd.peer_url.clone(),
        phase: RejoinPhase::Started,
        recorded_at_unix: crate::snapshot::now_unix(),
    });
    let mut old_data = None;
    for step in steps.iter().copied() {
        if cancel.is_cancelled() {
            return Err(RejoinError::Cancelled { next: step });
        }
        match step {
            RejoinStep::CheckOldCluster => {
                let mut probe_opts = etcd_opts.clone();
                probe_opts.connect_timeout = Duration::from_secs(2);
                probe_opts.request_timeout = Duration::from_secs(3);
                let mut probes = Vec::new();
                for endpoint in old_endpoints(&probe_opts, &state, &seed).await {
                    let quorate = quorate_cluster(&probe_opts, &endpoint).await.ok();
                    probes.push(OldMemberProbe {
                        endpoint,
                        quorate_cluster: quorate,
                    });
                }
                match quorate_old_member(seed_cluster, &probes) {
                    Some(p) if !opts.force => {
                        return Err(RejoinError::OldClusterQuorate {
                            endpoint: p.endpoint.clone(),
                            cluster: p.quorate_cluster.unwrap_or_default(),
                            seed_cluster,
                        });
                    }
                    Some(p) => progress(&format!(
                        "warning: the old cluster still has quorum ({} answers); going ahead \
                         because of --force",
                        p.endpoint
                    )),
                    None => progress(&format!(
                        "the old cluster has no quorum ({} old member(s) asked)",
                        probes.len()
                    )),
                }
                // Journaled before anything is removed: a re-run knows the data may be gone.
                write_journal(&opts.data_dir, &record)?;
            }
            RejoinStep::Wipe => {
                let dir = &state.etcd.data_dir;
                let aside = crate::snapshot::sibling(
                    dir,
                    &format!(".before-rejoin-{}", crate::snapshot::now_unix()),
                );
                crate::snapshot::rename_noreplace(dir, &aside).map_err(RejoinError::Wipe)?;
                progress(&format!(
                    "moved the old cluster's etcd data aside to {}",
                    aside.display()
                ));
                old_data = Some(aside);
            }
            RejoinStep::AddLearner => {
                write_journal(&opts.data_dir, &record)?;
                progress(&format!(
                    "adding {} ({}) to the seed's cluster as a learner",
                    state.etcd.name, state.etcd.peer_url
                ));
                let added = learner::add_learner(
                    &etcd_opts,
                    std::slice::from_ref(&seed),
                    &state.etcd.name,
                    &state.etcd.peer_url,
                    opts.queueing,
                    |r| info!(refusal = ?r, "learner add queued"),
                )
                .await
                .map_err(RejoinError::Add)?;
                record.phase = RejoinPhase::Added {
                    member_id: added.id,
                    initial_cluster: added.initial_cluster.clone(),
                    cluster_endpoints: if added.cluster_endpoints.is_empty() {
                        vec![seed.clone()]
                    } else {
                        added.cluster_endpoints.clone()
                    },
                };
                record.recorded_at_unix = crate::snapshot::now_unix();
                write_journal(&opts.data_dir, &record)?;
                progress(&format!(
                    "learner {:x} {}",
                    added.id,
                    if added.adopted {
                        "adopted (added by an earlier run)"
                    } else {
                        "added"
                    }
                ));
            }
            RejoinStep::StartAndPromote => {
                let RejoinPhase::Added {
                    member_id,
                    initial_cluster,
                    cluster_endpoints,
                } = record.phase.clone()
                else {
                    // plan_rejoin puts StartAndPromote only after an add.
                    return Err(RejoinError::Cancelled { next: step });
                };
                state.origin = Origin::Join;
                state.etcd.initial_cluster = initial_cluster;
                state.etcd.initial_cluster_state = ClusterState::Existing;
                state.etcd.member_id = Some(member_id);
                state.etcd.learner = true;
                state.cluster_endpoints = cluster_endpoints.clone();
                state.save(&opts.data_dir)?;
                start_and_promote(
                    opts,
                    &etcd_opts,
                    &mut state,
                    member_id,
                    &cluster_endpoints,
                    &mut progress,
                    cancel,
                )
                .await?;
                record.phase = RejoinPhase::Promoted;
                record.recorded_at_unix = crate::snapshot::now_unix();
                write_journal(&opts.data_dir, &record)?;
            }
            RejoinStep::Finish => {
                common::fsutil::remove_file_synced(&journal_path(&opts.data_dir)).map_err(|e| {
                    RejoinError::Journal {
                        op: "clear",
                        path: journal_path(&opts.data_dir),
                        source: e.source,
                    }
                })?;
            }
        }
    }
    let member_id = match &record.phase {
        RejoinPhase::Added { member_id, .. } => Some(*member_id),
        _ => state.etcd.member_id,
    };
    Ok((
        Rejoined {
            seed,
            steps,
            resumed,
            member_id,
            old_data,
            state,
        },
        data,
    ))
}

async fn start_and_promote(
    opts: &RejoinOptions,
    etcd_opts: &EtcdOptions,
    state: &mut NodeState,
    member_id: u64,
    cluster_endpoints: &[String],
    progress: &mut impl FnMut(&str),
    cancel: &CancellationToken,
) -> Result<(), RejoinError> {
    let etcd_only: Vec<_> = supervisor::components(state, &opts.config)
        .into_iter()
        .take(1)
        .collect();
    let log_dir = opts.data_dir.join("logs");
    let sup = Supervisor::start(etcd_only, &log_dir, Backoff::default())?;
    progress(&format!(
        "started etcd as an existing member (log {})",
        log_dir.join("etcd.log").display()
    ));
    let start = tokio::time::Instant::now();
    loop {
        let answer = etcd::etcd_member_status(etcd_opts, &state.etcd.client_url).await;
        if answer.error.is_none() && answer.leader.is_some() {
            break;
        }
        if cancel.is_cancelled() {
            sup.stop().await;
            return Err(RejoinError::Cancelled {
                next: RejoinStep::StartAndPromote,
            });
        }
        if start.elapsed() >= opts.config.etcd.start_timeout {
            sup.stop().await;
            return Err(RejoinError::Start {
                waited: start.elapsed(),
                last: answer.error.unwrap_or_else(|| "no leader".into()),
                log: log_dir.join("etcd.log"),
            });
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = cancel.cancelled() => {}
        }
    }
    progress("etcd answers; promoting the learner once it has caught up");
    // Ask the others first: a promote sent to the learner itself is refused.
    let mut endpoints: Vec<String> = cluster_endpoints
        .iter()
        .filter(|e| **e != state.etcd.client_url)
        .cloned()
        .collect();
    endpoints.push(state.etcd.client_url.clone());
    let promoted = tokio::select! {
        r = learner::promote_when_caught_up(
            etcd_opts,
            &endpoints,
            member_id,
            &state.etcd.peer_url,
            opts.config.etcd.promote_timeout,
        ) => r,
        _ = cancel.cancelled() => {
            sup.stop().await;
            return Err(RejoinError::Cancelled { next: RejoinStep::StartAndPromote });
        }
    };
    let result = match promoted {
        Ok(attempts) => {
            state.etcd.learner = false;
            match state.save(&opts.data_dir) {
                Ok(()) => {
                    progress(&format!(
                        "promoted to a voting member ({attempts} attempt(s))"
                    ));
                    Ok(())
                }
                Err(e) => Err(RejoinError::State(e)),
            }
        }
        Err(e) => Err(RejoinError::Promote(e)),
    };
    sup.stop().await;
    if result.is_err() {
        warn!("etcd stopped after a failed promotion; the rejoin resumes on a re-run");
    }
    result
}
