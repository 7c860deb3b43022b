//! Liveness and counters of one running reconciler.
//!
//! They belong to the reconciler that produces them, not to the process: a
//! [`Reconciler`](crate::Reconciler) owns a [`Monitor`], the daemon serves its snapshot on
//! the admin listener (`/status`) and registers its metrics (`/metrics`), and
//! `stratum-server nodes diagnostics --admin URL` reads them from there. The question they
//! answer, "is the reconciler running at all, and is it failing?", otherwise has no answer:
//! a reconciler that never started and one that fails every pass look the same from
//! outside.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use std::fmt::Write as _;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};

/// Liveness of one reconciler: the document `/status` serves.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// True once `Reconciler::run` entered its loop. False means it never started: the
    /// state in which no Node ever receives an ExternalIP.
    pub started: bool,
    /// Whether this process holds the reconciler lease and therefore writes. A standby
    /// keeps its view of the Nodes current but writes nothing.
    #[serde(default)]
    pub leader: bool,
    /// When the most recent pass finished, successful or not.
    pub last_run_at: Option<Timestamp>,
    /// When the most recent successful pass finished.
    #[serde(default)]
    pub last_success_at: Option<Timestamp>,
    /// How long the most recent pass took (plan and writes), in milliseconds.
    #[serde(default)]
    pub last_pass_ms: Option<u64>,
    /// The most recent pass's error; `None` when it succeeded.
    pub last_error: Option<String>,
    /// Passes failed in a row; zero after a successful pass.
    pub consecutive_failures: u32,
    /// Nodes by state after the most recent pass (`ok`, `unpatched`, `colliding`,
    /// `tunnel-down`, `virtual`, `port-unknown`).
    #[serde(default)]
    pub nodes: BTreeMap<NodeState, usize>,
}

/// Where a node stands after a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeState {
    /// Routed, carries what it should, no collision for the tunnel in use.
    Ok,
    /// Routed but does not carry what it should (its write failed, or it is not leader's
    /// to write).
    Unpatched,
    /// Routed and patched, but its route collides with another node's for the tunnel in
    /// use, so one of them cannot be reached.
    Colliding,
    /// `--require-tunnel`: its tunnel does not accept connections; left as it is.
    TunnelDown,
    /// A virtual-kubelet node: never routed.
    Virtual,
    /// The port function knows no port for it.
    PortUnknown,
}

impl NodeState {
    /// Every state, for exposing zero-valued gauges.
    pub const ALL: [NodeState; 6] = [
        NodeState::Ok,
        NodeState::Unpatched,
        NodeState::Colliding,
        NodeState::TunnelDown,
        NodeState::Virtual,
        NodeState::PortUnknown,
    ];

    /// Whether an operator should look at a node in this state.
    pub fn needs_attention(self) -> bool {
        matches!(
            self,
            NodeState::Unpatched | NodeState::Colliding | NodeState::TunnelDown
        )
    }

    /// The kebab-case name used in `/status`, tables and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Ok => "ok",
            NodeState::Unpatched => "unpatched",
            NodeState::Colliding => "colliding",
            NodeState::TunnelDown => "tunnel-down",
            NodeState::Virtual => "virtual",
            NodeState::PortUnknown => "port-unknown",
        }
    }
}

impl EncodeLabelValue for NodeState {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// What failed, as counted by `nodeaddr_errors_total{kind}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A Node list (`--once`, diagnostics) failed.
    List,
    /// The Node watch failed (the watcher restarts it with backoff).
    Watch,
    /// A status write was refused (not a conflict).
    Write,
    /// A node could not be re-read after a conflict.
    Reread,
    /// A node conflicted on every attempt of a pass.
    Conflict,
    /// A Kubernetes Event could not be published.
    Event,
}

impl EncodeLabelValue for ErrorKind {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(match self {
            ErrorKind::List => "list",
            ErrorKind::Watch => "watch",
            ErrorKind::Write => "write",
            ErrorKind::Reread => "reread",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Event => "event",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StateLabel {
    state: NodeState,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabel {
    kind: ErrorKind,
}

#[derive(Debug, Default)]
struct Metrics {
    passes: Counter,
    writes: Counter,
    conflicts: Counter,
    errors: Family<KindLabel, Counter>,
    watch_restarts: Counter,
    last_success: Gauge<f64, AtomicU64>,
    last_pass_seconds: Gauge<f64, AtomicU64>,
    nodes: Family<StateLabel, Gauge>,
    leader: Gauge,
}

/// The live status and counters of one reconciler. Cheap to clone; every clone sees the
/// same values.
#[derive(Clone, Debug, Default)]
pub struct Monitor {
    status: Arc<Mutex<Status>>,
    metrics: Arc<Metrics>,
}

impl Monitor {
    /// A monitor with nothing recorded (not started).
    pub fn new() -> Monitor {
        Monitor::default()
    }

    /// The current liveness snapshot.
    pub fn status(&self) -> Status {
        self.with(|s| s.clone())
    }

    /// Registers the reconciler's metrics (all prefixed `nodeaddr_`) in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("nodeaddr");
        let m = &self.metrics;
        r.register("passes", "Reconcile passes run", m.passes.clone());
        r.register(
            "writes",
            "Node status writes that succeeded",
            m.writes.clone(),
        );
        r.register(
            "conflicts",
            "Node status writes refused with a resourceVersion conflict (each re-reads the node)",
            m.conflicts.clone(),
        );
        r.register(
            "errors",
            "Failures by kind (list, watch, write, reread, conflict, event)",
            m.errors.clone(),
        );
        r.register(
            "watch_restarts",
            "Times the Node watch had to re-list after a failure",
            m.watch_restarts.clone(),
        );
        r.register(
            "last_success_timestamp_seconds",
            "Unix time of the last successful pass",
            m.last_success.clone(),
        );
        r.register(
            "last_pass_duration_seconds",
            "How long the last pass took (plan and writes)",
            m.last_pass_seconds.clone(),
        );
        r.register(
            "nodes",
            "Nodes by state after the last pass",
            m.nodes.clone(),
        );
        r.register(
            "leader",
            "1 while this process holds the reconciler lease and writes",
            m.leader.clone(),
        );
        for state in NodeState::ALL {
            let _ = m.nodes.get_or_create(&StateLabel { state });
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Status) -> T) -> T {
        // A panic while holding this lock cannot leave a half-written snapshot worth
        // refusing to read.
        let mut guard = self.status.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    pub(crate) fn mark_started(&self) {
        self.with(|s| s.started = true);
    }

    pub(crate) fn set_leader(&self, leader: bool) {
        self.metrics.leader.set(i64::from(leader));
        self.with(|s| s.leader = leader);
    }

    pub(crate) fn count_write(&self) {
        self.metrics.writes.inc();
    }

    pub(crate) fn count_conflicts(&self, n: usize) {
        self.metrics.conflicts.inc_by(n as u64);
    }

    pub(crate) fn count_error(&self, kind: ErrorKind) {
        self.metrics.errors.get_or_create(&KindLabel { kind }).inc();
    }

    pub(crate) fn count_watch_restart(&self) {
        self.metrics.watch_restarts.inc();
    }

    pub(crate) fn set_nodes(&self, nodes: &BTreeMap<NodeState, usize>) {
        for state in NodeState::ALL {
            let n = nodes.get(&state).copied().unwrap_or(0);
            self.metrics
                .nodes
                .get_or_create(&StateLabel { state })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.with(|s| s.nodes = nodes.clone());
    }

    /// Records a finished pass; returns the failure count before it (to detect
    /// transitions).
    pub(crate) fn record_pass(&self, result: Result<(), String>, took: Option<Duration>) -> u32 {
        self.metrics.passes.inc();
        if let Some(took) = took {
            self.metrics.last_pass_seconds.set(took.as_secs_f64());
        }
        let now = Timestamp::now();
        if result.is_ok() {
            self.metrics
                .last_success
                .set(now.as_millisecond() as f64 / 1000.0);
        }
        self.with(|st| {
            let before = st.consecutive_failures;
            st.last_run_at = Some(now);
            st.last_pass_ms = took.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
            match result {
                Ok(()) => {
                    st.last_error = None;
                    st.last_success_at = Some(now);
                    st.consecutive_failures = 0;
                }
                Err(e) => {
                    st.last_error = Some(e);
                    st.consecutive_failures = st.consecutive_failures.saturating_add(1);
                }
            }
            before
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_render_with_their_names() {
        let m = Monitor::new();
        let mut reg = Registry::default();
        m.register(&mut reg);
        m.count_write();
        m.count_conflicts(2);
        m.count_error(ErrorKind::Watch);
        m.record_pass(Ok(()), Some(Duration::from_millis(7)));
        m.set_nodes(&BTreeMap::from([
            (NodeState::Ok, 3),
            (NodeState::Colliding, 1),
        ]));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        for needle in [
            "nodeaddr_passes_total 1",
            "nodeaddr_writes_total 1",
            "nodeaddr_conflicts_total 2",
            "nodeaddr_errors_total{kind=\"watch\"} 1",
            "nodeaddr_watch_restarts_total 0",
            "nodeaddr_nodes{state=\"ok\"} 3",
            "nodeaddr_nodes{state=\"colliding\"} 1",
            "nodeaddr_nodes{state=\"tunnel-down\"} 0",
            "nodeaddr_last_success_timestamp_seconds ",
            "nodeaddr_leader 0",
        ] {
            assert!(text.contains(needle), "{needle} missing from:\n{text}");
        }
        let st = m.status();
        assert!(st.last_success_at.is_some());
        assert_eq!(st.nodes[&NodeState::Ok], 3);
        assert_eq!(st.last_pass_ms, Some(7));
        let json = serde_json::to_value(&st).unwrap();
        assert_eq!(json["nodes"]["colliding"], 1);
    }

    #[test]
    fn failures_count_up_and_a_success_clears_them() {
        let m = Monitor::new();
        assert_eq!(m.record_pass(Err("a".into()), None), 0);
        assert_eq!(m.record_pass(Err("b".into()), None), 1);
        let st = m.status();
        assert_eq!(
            (st.consecutive_failures, st.last_error.as_deref()),
            (2, Some("b"))
        );
        assert_eq!(st.last_success_at, None);
        assert_eq!(m.record_pass(Ok(()), None), 2);
        assert_eq!(m.status().consecutive_failures, 0);
    }
}
