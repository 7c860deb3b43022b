//! A control plane joining an existing cluster (the seed's `PrepareControlPlaneJoin`).
//!
//! Through [`assemble_node`]'s pinned order: discovery with the CA pin and the grant
//! download (nothing written unless the entry opens and its files are complete), the data
//! directories, the node IP, this node's leaf certificates, its kubeconfigs, and the join
//! intent journal (fsynced). Then the live part: the etcd member is added as a **learner**
//! (queued behind other joiners, see [`crate::etcd::learner`]) and the node state is
//! persisted with the `--initial-cluster` the add returned. The caller then starts it
//! ([`crate::node::run_node`]): etcd as `existing`, promotion once caught up.
//!
//! From the member add until the node state is persisted, cancellation (the first SIGINT
//! or SIGTERM) is deferred: stopping in between would leave a member the node does not
//! know it has. A failure in that window removes the member again; the journal and a
//! [`JoinOutcome`] record tell the next `up` what happened.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::assembly::{AssemblyError, NodeAssembly, Step, assemble_node};
use crate::bootstrap;
use crate::discovery::{self, CaPin, Discovered, DiscoveryTimeouts};
use crate::etcd::learner::{self, LearnerError, Queueing};
use crate::etcd::{self, EtcdOptions, EtcdTls};
use crate::grants::{self, BundleProfile, CertKey, GrantError};
use crate::journal::{JoinIntent, JoinIntentJournal, JournalError};
use crate::nodestate::{
    ClusterState, EtcdMember, NODE_STATE_VERSION, NodeConfig, NodeState, NodeStateError, Origin,
    https_url,
};
use crate::tokens::BootstrapToken;

/// The outcome record's file name in the data directory.
pub const JOIN_OUTCOME_FILE: &str = "join-outcome.json";
/// The etcd data directory inside the data directory.
pub const ETCD_DATA_DIR: &str = "etcd";

/// What `stratum-server join` was given. Debug redacts the token secret and the key.
#[derive(Debug, Clone)]
pub struct JoinOptions {
    /// The API server to discover, `HOST:PORT`.
    pub server: String,
    /// The bootstrap token.
    pub token: BootstrapToken,
    /// The CA pin.
    pub ca_pin: CaPin,
    /// The certificate-key opening this token's grant.
    pub cert_key: CertKey,
    /// This node's name (etcd member name).
    pub node_name: String,
    /// This node's address.
    pub node_ip: IpAddr,
    /// Where node state, the journal and etcd's data live.
    pub data_dir: PathBuf,
    /// Where the PKI goes.
    pub pki_dir: PathBuf,
    /// Where the kubeconfigs go.
    pub kubeconfig_dir: PathBuf,
    /// Ports, binary, timeouts.
    pub config: NodeConfig,
    /// Discovery's patience.
    pub discovery: DiscoveryTimeouts,
    /// How long the add may queue.
    pub queueing: Queueing,
}

/// A join that stopped, and what it left.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// This node already has state: it is a control plane.
    #[error(
        "{} exists: this node is already a control plane; start it with `stratum-server up`",
        path.display()
    )]
    AlreadyMember {
        /// The node state file.
        path: PathBuf,
    },
    /// A join intent survives from an earlier attempt.
    #[error(
        "a join intent survives in {}: an earlier join of member {member} ({peer_url}) did not \
         finish. {advice}",
        path.display()
    )]
    IntentSurvives {
        /// The journal.
        path: PathBuf,
        /// The member name recorded.
        member: String,
        /// Its peer URL.
        peer_url: String,
        /// What to do.
        advice: String,
    },
    /// The node name is unusable.
    #[error("node name {0:?} is not usable as an etcd member name: pass --node-name")]
    BadNodeName(String),
    /// Discovery refused: nothing was written.
    #[error("discovery failed; nothing was written and no member was added")]
    Discovery(#[source] discovery::DiscoveryError),
    /// The grant download refused: nothing was written.
    #[error("the certificate grant could not be downloaded; no member was added")]
    Grant(#[source] GrantError),
    /// The maintenance fence could not be taken (another maintenance operation, such as a
    /// rekey, holds it): nothing was written.
    #[error("cannot take the maintenance fence for the certificate download; no member was added")]
    Fence(#[source] crate::fence::FenceError),
    /// Reading the published etcd endpoints failed.
    #[error("cannot read the cluster's etcd endpoints; nothing was written")]
    Endpoints(#[source] bootstrap::PublishError),
    /// A local file could not be written.
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
    /// Certificates or kubeconfigs could not be issued.
    #[error("cannot issue this node's certificates")]
    Pki(#[source] pki::PkiError),
    /// The journal could not be recorded or read: no member was added.
    #[error("no member was added")]
    Journal(#[source] JournalError),
    /// The learner add failed: nothing was added (or it was removed again).
    #[error("the etcd member add failed")]
    Add(#[source] LearnerError),
    /// The node state could not be written after the add; the member was removed again.
    #[error(
        "the node state could not be persisted after the member add; {rollback}. The journal \
         {} records the attempt", journal.display()
    )]
    Persist {
        /// The journal.
        journal: PathBuf,
        /// What the rollback did.
        rollback: String,
        /// The write error.
        #[source]
        source: Box<NodeStateError>,
    },
    /// Interrupted before the member add.
    #[error("interrupted before the step \"{next}\"; no member was added")]
    Cancelled {
        /// The step that did not start.
        next: String,
    },
    /// Another command holds this node's maintenance lock; no member was added.
    #[error(transparent)]
    Lock(#[from] crate::maintenance::MaintenanceError),
}

/// What a rolled-back join left for the next `up` to explain.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JoinOutcome {
    /// The member name.
    pub member_name: String,
    /// Its peer URL.
    pub peer_url: String,
    /// Why the join was rolled back.
    pub reason: String,
    /// Whether the member was removed from the cluster again.
    pub member_removed: bool,
    /// When, seconds since the epoch.
    pub at_unix: u64,
}

impl JoinOutcome {
    /// The record's path in `data_dir`.
    pub fn path(data_dir: &Path) -> PathBuf {
        data_dir.join(JOIN_OUTCOME_FILE)
    }

    /// Reads the record, `None` when there is none or it cannot be parsed (it is advice,
    /// the journal is the authority).
    pub fn load(data_dir: &Path) -> Option<JoinOutcome> {
        let bytes = std::fs::read(Self::path(data_dir)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Writes the record durably.
    pub fn save(&self, data_dir: &Path) -> Result<(), pki::PkiError> {
        let bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        pki::write_atomic(&Self::path(data_dir), &bytes, 0o600)
    }
}

/// What to tell an operator about a surviving intent (pure): whether the member is still
/// in the cluster, per `outcome`.
pub fn intent_advice(intent: &JoinIntent, outcome: Option<&JoinOutcome>) -> String {
    match outcome {
        Some(o) if o.member_removed => format!(
            "It was rolled back ({}) and the member was removed from etcd. Remove {JOIN_OUTCOME_FILE} \
             and the journal from the data directory, then run the join again",
            o.reason
        ),
        Some(o) => format!(
            "It was rolled back ({}) but the member could NOT be removed: run `stratum-server \
             etcd members --endpoints {}` and remove the member with peer URL {} before \
             anything else, then remove {JOIN_OUTCOME_FILE} and the journal and join again",
            o.reason,
            intent.endpoints.join(","),
            intent.peer_url
        ),
        None => format!(
            "The member may have been added without this node recording it: run `stratum-server \
             etcd members --endpoints {}`; if a member with peer URL {} is listed, remove it; \
             then remove the journal and join again. Do not bootstrap this node: that would \
             start a second cluster",
            intent.endpoints.join(","),
            intent.peer_url
        ),
    }
}

/// The etcd client options of a node whose PKI is in `pki_dir`.
pub fn etcd_options(pki_dir: &Path) -> EtcdOptions {
    EtcdOptions::with_tls(Some(EtcdTls::from_paths(
        pki_dir.join("etcd/ca.crt"),
        pki_dir.join("apiserver-etcd-client.crt"),
        pki_dir.join("apiserver-etcd-client.key"),
    )))
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Refuses a join on a node with state or a surviving intent (read-only).
pub fn preflight(opts: &JoinOptions) -> Result<(), JoinError> {
    let name = &opts.node_name;
    if name.is_empty()
        || name.len() > 63
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    {
        return Err(JoinError::BadNodeName(name.clone()));
    }
    if NodeState::load(&opts.data_dir)
        .map_err(|e| JoinError::Io {
            op: "read the node state",
            path: crate::nodestate::node_state_path(&opts.data_dir),
            source: std::io::Error::other(e.to_string()),
        })?
        .is_some()
    {
        return Err(JoinError::AlreadyMember {
            path: crate::nodestate::node_state_path(&opts.data_dir),
        });
    }
    let journal = JoinIntentJournal::new(&opts.data_dir);
    if journal.survives().map_err(JoinError::Journal)? {
        let intent = journal.read().map_err(JoinError::Journal)?;
        let outcome = JoinOutcome::load(&opts.data_dir);
        let (member, peer_url, advice) = match intent {
            Some(i) => (
                i.member_name.clone(),
                i.peer_url.clone(),
                intent_advice(&i, outcome.as_ref()),
            ),
            None => (
                "?".into(),
                "?".into(),
                "Inspect it before removing it".into(),
            ),
        };
        return Err(JoinError::IntentSurvives {
            path: journal.path().to_path_buf(),
            member,
            peer_url,
            advice,
        });
    }
    Ok(())
}

struct JoinAssembly<'a> {
    opts: &'a JoinOptions,
    discovered: Option<Discovered>,
    profile: Option<BundleProfile>,
    endpoints: Vec<String>,
    /// The node maintenance lock, taken where the join starts writing this node's state
    /// directory and held until the node state is persisted.
    lock: Option<crate::maintenance::NodeLock>,
}

impl JoinAssembly<'_> {
    fn peer_url(&self) -> String {
        https_url(self.opts.node_ip, self.opts.config.etcd.peer_port)
    }

    async fn resolve(&mut self) -> Result<(), JoinError> {
        let o = self.opts;
        let found = discovery::discover(&o.server, &o.token, &o.ca_pin, o.discovery)
            .await
            .map_err(JoinError::Discovery)?;
        let client = found
            .bootstrap_client(&o.token, o.discovery.request)
            .map_err(JoinError::Discovery)?;
        let published = bootstrap::read_etcd_endpoints(&client)
            .await
            .map_err(JoinError::Endpoints)?;
        // The download runs under the maintenance fence, held under this token's own name
        // (the join fence policy allows no other), so a rekey or a rotation's re-upload never
        // interleaves with it. Released right after; a failed release only leaves the term to
        // run out.
        let fence =
            crate::fence::Fence::take(&client, &hacore::fence::joiner_identity(o.token.id()))
                .await
                .map_err(JoinError::Fence)?;
        let mut endpoints = Vec::new();
        let downloaded =
            grants::download_grant(&client, o.token.id(), &o.pki_dir, &o.cert_key, |p| {
                endpoints = if p.etcd_endpoints.is_empty() {
                    published.clone()
                } else {
                    p.etcd_endpoints.clone()
                };
                if endpoints.is_empty() {
                    return Err(
                        "the grant records no etcd endpoints and the cluster publishes none \
                    in kube-system/stratum-control-plane: mint the join with `token create \
                    --etcd-endpoint URL`"
                            .into(),
                    );
                }
                Ok(())
            })
            .await;
        if let Err(e) = fence.release().await {
            tracing::warn!(error = %e, "the maintenance fence was not released; its term runs out by itself");
        }
        let profile = downloaded.map_err(JoinError::Grant)?;
        self.endpoints = endpoints;
        self.discovered = Some(found);
        self.profile = Some(profile);
        Ok(())
    }
}

impl NodeAssembly for JoinAssembly<'_> {
    type Error = JoinError;

    async fn run(&mut self, step: Step) -> Result<(), JoinError> {
        let o = self.opts;
        match step {
            Step::ResolveCluster => self.resolve().await,
            Step::HostDirs => {
                // Taken here, not before discovery: a join refused there leaves this node
                // exactly as it was, lock file included.
                self.lock = Some(crate::maintenance::NodeLock::acquire(&o.data_dir, "join")?);
                for dir in [&o.data_dir, &o.pki_dir, &o.kubeconfig_dir] {
                    std::fs::create_dir_all(dir).map_err(|source| JoinError::Io {
                        op: "create",
                        path: dir.clone(),
                        source,
                    })?;
                }
                use std::os::unix::fs::PermissionsExt as _;
                std::fs::set_permissions(&o.data_dir, std::fs::Permissions::from_mode(0o700))
                    .map_err(|source| JoinError::Io {
                        op: "chmod",
                        path: o.data_dir.clone(),
                        source,
                    })
            }
            Step::NodeIp => {
                if o.node_ip.is_unspecified() {
                    return Err(JoinError::Io {
                        op: "use the node IP",
                        path: PathBuf::from(o.node_ip.to_string()),
                        source: std::io::Error::other(
                            "an unspecified address cannot be advertised",
                        ),
                    });
                }
                Ok(())
            }
            Step::BeforeCerts => Ok(()),
            Step::IssueCerts => {
                let mut id = pki::NodeIdentity::new(o.node_name.clone());
                id.node_ip = Some(o.node_ip);
                id.vip = self
                    .profile
                    .as_ref()
                    .and_then(|p| p.vip.as_deref())
                    .and_then(|v| v.parse().ok());
                // Overwrite: preflight proved this node has no state, so any leaves here are
                // from an earlier, failed attempt.
                pki::issue_node_leaves(&o.pki_dir, &id, true).map_err(JoinError::Pki)?;
                Ok(())
            }
            Step::WriteKubeconfigs => {
                let server = self
                    .discovered
                    .as_ref()
                    .map(|d| d.info.server.clone())
                    .unwrap_or_default();
                pki::write_kubeconfigs(&o.pki_dir, &o.kubeconfig_dir, &server, true)
                    .map_err(JoinError::Pki)?;
                Ok(())
            }
            Step::BeforeRun => JoinIntentJournal::new(&o.data_dir)
                .record(&JoinIntent {
                    member_name: o.node_name.clone(),
                    peer_url: self.peer_url(),
                    endpoints: self.endpoints.clone(),
                    recorded_at_unix: now_unix(),
                })
                .map_err(JoinError::Journal),
        }
    }
}

/// Readies this node as an additional control plane and adds its etcd member as a
/// learner; returns the persisted node state, which [`crate::node::run_node`] starts.
/// `cancel` stops the join between preparation steps; from the member add until the state
/// is persisted it is deliberately not observed (see the module docs).
pub async fn prepare_control_plane_join(
    opts: &JoinOptions,
    cancel: &CancellationToken,
) -> Result<NodeState, JoinError> {
    preflight(opts)?;
    let mut a = JoinAssembly {
        opts,
        discovered: None,
        profile: None,
        endpoints: Vec::new(),
        lock: None,
    };
    match assemble_node(cancel, &mut a).await {
        Ok(()) => {}
        Err(AssemblyError::Step(e)) => return Err(e),
        Err(AssemblyError::Cancelled { next }) => {
            return Err(JoinError::Cancelled {
                next: next.to_string(),
            });
        }
    }
    if cancel.is_cancelled() {
        // The intent is recorded but nothing was added: clearing it is safe.
        let _ = JoinIntentJournal::new(&opts.data_dir).clear();
        return Err(JoinError::Cancelled {
            next: "add the etcd member".into(),
        });
    }
    // From here until the state is saved, cancellation is deferred.
    let peer_url = a.peer_url();
    let client_url = https_url(opts.node_ip, opts.config.etcd.client_port);
    let etcd_opts = etcd_options(&opts.pki_dir);
    info!(member = %opts.node_name, %peer_url, endpoints = ?a.endpoints, "adding the etcd member as a learner");
    let mut queued_logged = false;
    let added = learner::add_learner(
        &etcd_opts,
        &a.endpoints,
        &opts.node_name,
        &peer_url,
        opts.queueing,
        |r| {
            if !queued_logged {
                info!(member = %opts.node_name, refusal = ?r, "member add queued behind another join");
                queued_logged = true;
            }
        },
    )
    .await;
    let added = match added {
        Ok(a) => a,
        Err(e) => {
            // Refused or timed out. An add whose answer was lost may still have been
            // applied: clear the intent only once a linearizable list shows no member with
            // this peer URL; otherwise remove it, and keep the intent if that fails.
            let journal = JoinIntentJournal::new(&opts.data_dir);
            let present = match learner::linearizable_member_list(&etcd_opts, &a.endpoints).await {
                Ok((_, members)) => Some(members.iter().any(|m| m.peer_urls.contains(&peer_url))),
                Err(list) => {
                    warn!(
                        "cannot confirm that no member was added ({list}); the join intent is kept"
                    );
                    None
                }
            };
            let removed = match present {
                Some(false) => true,
                Some(true) => etcd::member_remove(&etcd_opts, &a.endpoints, &peer_url)
                    .await
                    .inspect_err(|r| warn!("cannot remove the member the failed add left: {r}"))
                    .is_ok(),
                None => false,
            };
            if removed && let Err(clear) = journal.clear() {
                warn!("cannot clear the join intent after a failed add: {clear}");
            }
            return Err(JoinError::Add(e));
        }
    };
    let state = NodeState {
        version: NODE_STATE_VERSION,
        origin: Origin::Join,
        node_name: opts.node_name.clone(),
        node_ip: opts.node_ip,
        pki_dir: opts.pki_dir.clone(),
        api_server: a
            .discovered
            .as_ref()
            .map(|d| d.info.server.clone())
            .unwrap_or_default(),
        etcd: EtcdMember {
            name: opts.node_name.clone(),
            client_url,
            peer_url: peer_url.clone(),
            data_dir: opts.data_dir.join(ETCD_DATA_DIR),
            initial_cluster: added.initial_cluster.clone(),
            initial_cluster_state: ClusterState::Existing,
            member_id: Some(added.id),
            learner: true,
        },
        cluster_endpoints: if added.cluster_endpoints.is_empty() {
            a.endpoints.clone()
        } else {
            added.cluster_endpoints.clone()
        },
    };
    if let Err(source) = state.save(&opts.data_dir) {
        let rollback = rollback(
            &opts.data_dir,
            &state,
            &format!("node state not persisted: {source}"),
        )
        .await;
        return Err(JoinError::Persist {
            journal: JoinIntentJournal::new(&opts.data_dir).path().to_path_buf(),
            rollback,
            source: Box::new(source),
        });
    }
    info!(member = %opts.node_name, id = %format!("{:x}", added.id), "node state persisted; the member starts as a learner");
    if cancel.is_cancelled() {
        info!(
            "a shutdown was requested during the member add; it is honoured now that the node state is persisted: `stratum-server up` starts this member"
        );
    }
    Ok(state)
}

/// Removes the member `state` names from the cluster, moves aside any etcd data it wrote,
/// removes the node state, and records why in a [`JoinOutcome`]; the journal is kept so
/// the next `up` refuses to bootstrap and explains. Returns a sentence saying what it did.
pub async fn rollback(data_dir: &Path, state: &NodeState, reason: &str) -> String {
    let etcd_opts = etcd_options(&state.pki_dir);
    let others: Vec<String> = state
        .cluster_endpoints
        .iter()
        .filter(|e| **e != state.etcd.client_url)
        .cloned()
        .collect();
    let removed = match etcd::member_remove(&etcd_opts, &others, &state.etcd.peer_url).await {
        Ok(_) => true,
        Err(etcd::EtcdError::MemberNotFound { .. }) => true,
        Err(e) => {
            warn!(
                "rollback could not remove the etcd member {}: {}",
                state.etcd.peer_url,
                crate::error_chain(&e)
            );
            false
        }
    };
    let aside = state
        .etcd
        .data_dir
        .with_extension(format!("failed-{}", now_unix()));
    if state.etcd.data_dir.exists()
        && let Err(e) = std::fs::rename(&state.etcd.data_dir, &aside)
    {
        warn!("cannot move {} aside: {e}", state.etcd.data_dir.display());
    }
    if let Err(e) = NodeState::remove(data_dir) {
        warn!("{}", crate::error_chain(&e));
    }
    let outcome = JoinOutcome {
        member_name: state.etcd.name.clone(),
        peer_url: state.etcd.peer_url.clone(),
        reason: reason.to_string(),
        member_removed: removed,
        at_unix: now_unix(),
    };
    if let Err(e) = outcome.save(data_dir) {
        warn!("cannot record the join outcome: {}", crate::error_chain(&e));
    }
    if removed {
        format!("the member {} was removed again", state.etcd.peer_url)
    } else {
        format!(
            "the member {} could NOT be removed: remove it by hand (`stratum-server etcd members`)",
            state.etcd.peer_url
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intent() -> JoinIntent {
        JoinIntent {
            member_name: "cp2".into(),
            peer_url: "https://10.0.0.2:2380".into(),
            endpoints: vec!["https://10.0.0.1:2379".into()],
            recorded_at_unix: 1,
        }
    }

    #[test]
    fn advice_says_what_happened_to_the_member() {
        let none = intent_advice(&intent(), None);
        assert!(none.contains("Do not bootstrap"), "{none}");
        assert!(none.contains("https://10.0.0.2:2380"), "{none}");
        let removed = JoinOutcome {
            member_name: "cp2".into(),
            peer_url: "https://10.0.0.2:2380".into(),
            reason: "etcd did not answer within 20s".into(),
            member_removed: true,
            at_unix: 1,
        };
        let text = intent_advice(&intent(), Some(&removed));
        assert!(text.contains("was removed from etcd"), "{text}");
        assert!(text.contains("etcd did not answer"), "{text}");
        let kept = JoinOutcome {
            member_removed: false,
            ..removed
        };
        assert!(intent_advice(&intent(), Some(&kept)).contains("could NOT be removed"));
    }
}
