//! A control plane re-joining a restored cluster, as pure decisions: what the journal
//! records, which steps a run (or a re-run after a crash) still has to do, and whether the
//! old cluster still has quorum. `ha::rejoin` does the steps.
//!
//! After `snapshot restore` makes the seed node a new single-member cluster, every other
//! control plane rejoins it: its old data (of the old cluster) goes, it is added to the
//! seed's cluster as a learner, its etcd starts as `existing` and is promoted once caught
//! up. Each step is journaled before the next, so a re-run resumes: the old data is only
//! ever removed before the member is added (after that, what is on disk is the new
//! cluster's), and the add adopts a member that already has this node's peer URL, so a
//! crash between the add and its journal entry never leaves a second member.

use serde::{Deserialize, Serialize};

/// The journal's file name in the node's state directory.
pub const REJOIN_JOURNAL_FILE: &str = "rejoin.json";

/// How far a rejoin got.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "phase")]
pub enum RejoinPhase {
    /// The old cluster was checked (or the check forced past); the old data may be gone.
    Started,
    /// The member was added to the seed's cluster as a learner.
    Added {
        /// Its member ID.
        member_id: u64,
        /// The `--initial-cluster` it boots with.
        initial_cluster: String,
        /// The cluster's client URLs when it was added.
        cluster_endpoints: Vec<String>,
    },
    /// It was promoted to a voting member.
    Promoted,
}

/// The rejoin journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejoinRecord {
    /// The seed's etcd client URL the rejoin adds its member through.
    pub seed: String,
    /// The member name.
    pub member_name: String,
    /// The member's peer URL.
    pub peer_url: String,
    /// How far it got.
    #[serde(flatten)]
    pub phase: RejoinPhase,
    /// When the phase was recorded, seconds since the Unix epoch.
    pub recorded_at_unix: u64,
}

/// One step of a rejoin, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejoinStep {
    /// Refuse when the old cluster still has quorum (unless forced).
    CheckOldCluster,
    /// Move the old cluster's etcd data aside.
    Wipe,
    /// Add the member to the seed's cluster as a learner (adopting one already there).
    AddLearner,
    /// Start etcd as `existing` and promote it once it has caught up.
    StartAndPromote,
    /// Clear the journal.
    Finish,
}

impl std::fmt::Display for RejoinStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RejoinStep::CheckOldCluster => "check that the old cluster has lost quorum",
            RejoinStep::Wipe => "move the old etcd data aside",
            RejoinStep::AddLearner => "add this member to the seed's cluster as a learner",
            RejoinStep::StartAndPromote => "start etcd as an existing member and promote it",
            RejoinStep::Finish => "clear the rejoin journal",
        })
    }
}

/// What this node's member looks like in the seed's cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeedMember {
    /// Still a learner.
    pub is_learner: bool,
    /// It has started (it publishes client URLs).
    pub started: bool,
}

/// What a rejoin sees before it does anything.
#[derive(Debug, Clone, Copy)]
pub struct RejoinView<'a> {
    /// The journal, when one survives.
    pub record: Option<&'a RejoinRecord>,
    /// The seed this run was asked to rejoin.
    pub seed: &'a str,
    /// Whether this node's etcd data directory exists.
    pub data_present: bool,
    /// This node's member in the seed's cluster, by peer URL, when there is one.
    pub in_seed: Option<SeedMember>,
}

/// A rejoin that cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RejoinPlanError {
    /// A journaled rejoin went to another seed.
    #[error(
        "a rejoin to the seed {journaled} is in progress on this node (journal {REJOIN_JOURNAL_FILE}); \
         re-run it with --server pointing at that seed to finish it, nothing was changed"
    )]
    OtherSeed {
        /// The seed the journal names.
        journaled: String,
    },
}

/// The steps a rejoin still has to run, from what it sees (pure).
///
/// - Promoted: only the journal is left to clear.
/// - Added: the data on disk (if any) is the new cluster's: start and promote, never wipe.
/// - Not yet added, or no journal: the data on disk is the old cluster's. With no journal
///   and this node already a started voter of the seed's cluster, the rejoin is done.
///   Otherwise the old cluster is checked and the data moved aside (when there is any)
///   before the add.
pub fn plan_rejoin(view: RejoinView<'_>) -> Result<Vec<RejoinStep>, RejoinPlanError> {
    use RejoinStep::*;
    if let Some(record) = view.record
        && record.seed != view.seed
    {
        return Err(RejoinPlanError::OtherSeed {
            journaled: record.seed.clone(),
        });
    }
    match view.record.map(|r| &r.phase) {
        Some(RejoinPhase::Promoted) => return Ok(vec![Finish]),
        Some(RejoinPhase::Added { .. }) => return Ok(vec![StartAndPromote, Finish]),
        Some(RejoinPhase::Started) => {}
        None => {
            if matches!(
                view.in_seed,
                Some(SeedMember {
                    is_learner: false,
                    started: true
                })
            ) {
                return Ok(vec![Finish]);
            }
        }
    }
    let mut steps = Vec::new();
    if view.data_present {
        steps.extend([CheckOldCluster, Wipe]);
    }
    steps.extend([AddLearner, StartAndPromote, Finish]);
    Ok(steps)
}

/// One old-cluster member's answer to the quorum probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OldMemberProbe {
    /// The endpoint asked.
    pub endpoint: String,
    /// The cluster ID it answered a linearizable read for; `None` when it did not answer
    /// one (down, or alive without quorum).
    pub quorate_cluster: Option<u64>,
}

/// The first endpoint whose cluster still has quorum and is not the seed's (pure): a member
/// that answers a linearizable read is in a cluster with a leader and a majority. One
/// already rejoined to the seed answers with the seed's cluster ID, and does not count.
pub fn quorate_old_member(seed_cluster: u64, probes: &[OldMemberProbe]) -> Option<&OldMemberProbe> {
    probes
        .iter()
        .find(|p| p.quorate_cluster.is_some_and(|c| c != seed_cluster))
}

/// The seed's etcd client URL from `--server` (pure): a URL is kept; `HOST:PORT` or a bare
/// host (an IPv6 address with or without brackets) gets `https://` and, for a bare host,
/// `default_port` (this node's own etcd client port: control planes share their layout).
pub fn seed_endpoint(server: &str, default_port: u16) -> String {
    let server = server.trim().trim_end_matches('/');
    if server.contains("://") {
        return server.to_string();
    }
    if let Ok(ip) = server.parse::<std::net::IpAddr>() {
        return match ip {
            std::net::IpAddr::V4(v4) => format!("https://{v4}:{default_port}"),
            std::net::IpAddr::V6(v6) => format!("https://[{v6}]:{default_port}"),
        };
    }
    if server.parse::<std::net::SocketAddr>().is_ok() {
        return format!("https://{server}");
    }
    match server.rsplit_once(':') {
        Some((_, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
            format!("https://{server}")
        }
        _ => format!("https://{server}:{default_port}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RejoinStep::*;

    fn record(phase: RejoinPhase) -> RejoinRecord {
        RejoinRecord {
            seed: "https://10.0.0.1:2379".into(),
            member_name: "cp2".into(),
            peer_url: "https://10.0.0.2:2380".into(),
            phase,
            recorded_at_unix: 1,
        }
    }

    fn view<'a>(
        record: Option<&'a RejoinRecord>,
        data_present: bool,
        in_seed: Option<SeedMember>,
    ) -> RejoinView<'a> {
        RejoinView {
            record,
            seed: "https://10.0.0.1:2379",
            data_present,
            in_seed,
        }
    }

    #[test]
    fn a_fresh_rejoin_checks_wipes_adds_starts_and_finishes() {
        assert_eq!(
            plan_rejoin(view(None, true, None)).unwrap(),
            [CheckOldCluster, Wipe, AddLearner, StartAndPromote, Finish]
        );
        // No data: nothing to wipe, and so nothing the quorum check protects.
        assert_eq!(
            plan_rejoin(view(None, false, None)).unwrap(),
            [AddLearner, StartAndPromote, Finish]
        );
    }

    #[test]
    fn a_rerun_resumes_and_never_wipes_the_new_clusters_data() {
        let started = record(RejoinPhase::Started);
        // Crashed after journaling Started: the data may or may not be gone yet.
        assert_eq!(
            plan_rejoin(view(Some(&started), true, None)).unwrap(),
            [CheckOldCluster, Wipe, AddLearner, StartAndPromote, Finish]
        );
        // Crashed after the add but before journaling it: the add adopts the member; the
        // data on disk is still the old cluster's (etcd only starts after Added).
        let learner = Some(SeedMember {
            is_learner: true,
            started: false,
        });
        assert_eq!(
            plan_rejoin(view(Some(&started), false, learner)).unwrap(),
            [AddLearner, StartAndPromote, Finish]
        );
        let added = record(RejoinPhase::Added {
            member_id: 7,
            initial_cluster: "cp1=https://10.0.0.1:2380,cp2=https://10.0.0.2:2380".into(),
            cluster_endpoints: vec!["https://10.0.0.1:2379".into()],
        });
        assert_eq!(
            plan_rejoin(view(Some(&added), true, learner)).unwrap(),
            [StartAndPromote, Finish]
        );
        let promoted = record(RejoinPhase::Promoted);
        assert_eq!(
            plan_rejoin(view(Some(&promoted), true, None)).unwrap(),
            [Finish]
        );
    }

    #[test]
    fn a_node_already_voting_in_the_seeds_cluster_is_done() {
        let voter = Some(SeedMember {
            is_learner: false,
            started: true,
        });
        assert_eq!(plan_rejoin(view(None, true, voter)).unwrap(), [Finish]);
    }

    #[test]
    fn a_journal_for_another_seed_is_refused() {
        let mut other = record(RejoinPhase::Started);
        other.seed = "https://10.0.0.9:2379".into();
        let err = plan_rejoin(view(Some(&other), true, None)).unwrap_err();
        assert!(err.to_string().contains("https://10.0.0.9:2379"), "{err}");
    }

    #[test]
    fn only_a_quorate_member_of_another_cluster_counts() {
        let probe = |e: &str, c: Option<u64>| OldMemberProbe {
            endpoint: e.into(),
            quorate_cluster: c,
        };
        let probes = [probe("a", None), probe("b", Some(1)), probe("c", Some(2))];
        assert_eq!(quorate_old_member(1, &probes).unwrap().endpoint, "c");
        assert!(quorate_old_member(2, &probes[..2]).unwrap().endpoint == "b");
        assert!(quorate_old_member(1, &probes[..2]).is_none());
        assert!(quorate_old_member(1, &[]).is_none());
    }

    #[test]
    fn the_seed_endpoint_takes_ips_host_ports_and_urls() {
        assert_eq!(seed_endpoint("10.0.0.1", 2379), "https://10.0.0.1:2379");
        assert_eq!(
            seed_endpoint("10.0.0.1:32379", 2379),
            "https://10.0.0.1:32379"
        );
        assert_eq!(seed_endpoint("::1", 2379), "https://[::1]:2379");
        assert_eq!(seed_endpoint("[::1]:2380", 2379), "https://[::1]:2380");
        assert_eq!(
            seed_endpoint("cp1.example", 2379),
            "https://cp1.example:2379"
        );
        assert_eq!(
            seed_endpoint("cp1.example:1", 2379),
            "https://cp1.example:1"
        );
        assert_eq!(
            seed_endpoint("http://127.0.0.1:2379/", 2379),
            "http://127.0.0.1:2379"
        );
    }

    #[test]
    fn the_steps_print_as_the_operator_reads_them() {
        // `ha::rejoin` prints the plan as these names joined, and names the step an
        // interrupted run stopped before.
        let plan = plan_rejoin(view(None, true, None)).unwrap();
        let printed: Vec<String> = plan.iter().map(ToString::to_string).collect();
        assert_eq!(
            printed,
            [
                "check that the old cluster has lost quorum",
                "move the old etcd data aside",
                "add this member to the seed's cluster as a learner",
                "start etcd as an existing member and promote it",
                "clear the rejoin journal",
            ]
        );
    }

    #[test]
    fn a_bracketed_ipv6_seed_without_a_port_takes_the_default() {
        // The text after its last ':' is "1]", not a port.
        assert_eq!(seed_endpoint("[fd00::1]", 2379), "https://[fd00::1]:2379");
        assert_eq!(
            seed_endpoint(" [fd00::1]/ ", 32379),
            "https://[fd00::1]:32379"
        );
        assert_eq!(
            seed_endpoint("[fd00::1]:2380", 2379),
            "https://[fd00::1]:2380"
        );
    }

    #[test]
    fn the_journal_round_trips_as_json() {
        let added = record(RejoinPhase::Added {
            member_id: 7,
            initial_cluster: "cp1=x".into(),
            cluster_endpoints: vec!["e".into()],
        });
        let json = serde_json::to_string(&added).unwrap();
        assert!(json.contains("\"phase\":\"added\""), "{json}");
        assert_eq!(serde_json::from_str::<RejoinRecord>(&json).unwrap(), added);
    }
}
