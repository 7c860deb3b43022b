//! The thin async half of the reconciler: a watch into a reflector store, a plan from the
//! store (pure), a write per node that differs; the loop that drives passes from Node
//! events and a resync ticker; `once` (list, plan, write) for one-shot use.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Resource as _;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, reflector::store::Writer};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::derive::{KubeletPortFunc, PortRange, port_func};
use crate::plan::{
    PlannedNode, SkipReason, StatusChange, Tunnel, apply_change, first_external_ip,
    observed_kubelet_port, plan, unroute_status, wanted_status,
};
use crate::routing::{is_virtual_node, routing_name};
use crate::status::{ErrorKind, Monitor, NodeState};

/// Default resync interval of [`Reconciler::run`].
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);

/// How long `run` gathers watch events before planning, so that a burst of Node updates
/// costs one pass. Short, because a pass plans from the local store (no request) and
/// writes only what differs: the echo of our own writes costs a plan, nothing more.
pub const DEBOUNCE: Duration = Duration::from_millis(20);

/// How long `--require-tunnel` waits for a node's tunnel to accept a TCP connection.
pub const TUNNEL_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Writes to one node that may hit a resourceVersion conflict before the pass gives up on
/// it (each conflict re-reads the node first).
const MAX_WRITE_ATTEMPTS: u32 = 5;

/// Status writes in flight at once during a pass.
const WRITE_CONCURRENCY: usize = 8;

/// Kubernetes Events waiting to be published before new ones are dropped (and counted as
/// `nodeaddr_errors_total{kind="event"}`): a first pass over a large cluster must not
/// queue without bound behind the API server.
const EVENT_QUEUE: usize = 1024;

/// The controller name on the Events the reconciler publishes.
pub const EVENT_CONTROLLER: &str = "nodeaddr-reconciler";

/// Whether this process may write: the handle of its election on the Lease
/// [`LEASE_NAME`] in [`LEASE_NAMESPACE`] ([`daemon::LeaderElection`]). It answers "leader"
/// only until the renew deadline after the last successful renewal, which is before any
/// standby may take over. A reconciler that runs alone passes [`always_leader`].
pub type Leadership = daemon::LeaderHandle;

/// The namespace of the reconciler's Lease.
pub const LEASE_NAMESPACE: &str = "kube-system";
/// The name of the reconciler's Lease: one writer per cluster.
pub const LEASE_NAME: &str = "nodeaddr-reconciler";

/// A [`Leadership`] that is always the leader, for a reconciler that runs alone.
pub fn always_leader() -> Leadership {
    daemon::LeaderHandle::always()
}

/// What failed in a reconcile pass.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Node list could not be fetched (no verdict about any node was possible).
    #[error("could not list nodes from the API server")]
    List(#[source] kube::Error),
    /// The Node watch could not list or watch (the reconciler has no view of the nodes).
    #[error("could not list nodes through the node watch")]
    Watch(#[source] watcher::Error),
    /// A status write was refused for a reason other than a conflict.
    #[error("could not write the status of node {node}")]
    Write {
        /// The node.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// After a conflict, the node could not be read again.
    #[error("could not re-read node {node} after a write conflict")]
    Reread {
        /// The node.
        node: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Every attempt hit a conflict: something else writes the node continuously.
    #[error(
        "node {node}: {attempts} status writes in a row hit a resourceVersion conflict; \
         another writer keeps changing it (check for a second reconciler)"
    )]
    Conflict {
        /// The node.
        node: String,
        /// Attempts made.
        attempts: u32,
    },
    /// Some node writes of the pass failed; the others were made.
    #[error(
        "{failed} of {attempted} node status writes failed; first: {}",
        error_chain(first)
    )]
    Writes {
        /// Writes that failed.
        failed: usize,
        /// Writes attempted.
        attempted: usize,
        /// The first failure, in node-name order.
        first: Box<Error>,
        /// The pass's counts, failures included (as [`NodeState::Unpatched`]).
        report: Box<PassReport>,
    },
}

impl Error {
    fn kind(&self) -> ErrorKind {
        match self {
            Error::List(_) => ErrorKind::List,
            Error::Watch(_) => ErrorKind::Watch,
            Error::Write { .. } | Error::Writes { .. } => ErrorKind::Write,
            Error::Reread { .. } => ErrorKind::Reread,
            Error::Conflict { .. } => ErrorKind::Conflict,
        }
    }
}

/// An error and its causes on one line (`a: b: c`), for logs and the liveness snapshot.
pub use common::error_chain;

/// Counts from one pass.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PassReport {
    /// Nodes planned.
    pub nodes: usize,
    /// Nodes skipped (virtual, no port known, tunnel down).
    pub skipped: usize,
    /// Status writes that succeeded.
    pub writes: usize,
    /// Conflicts met (each followed by a re-read).
    pub conflicts: usize,
    /// Nodes whose route another node's route collides with, for the tunnel in use.
    pub colliding: usize,
    /// Nodes by state after the pass.
    pub states: BTreeMap<NodeState, usize>,
}

impl PassReport {
    /// Whether a node is left in a state an operator should look at (unpatched, colliding,
    /// tunnel down): `nodes reconcile --once` exits 3 then.
    pub fn needs_attention(&self) -> bool {
        self.states
            .iter()
            .any(|(state, n)| *n > 0 && state.needs_attention())
    }
}

/// One line: `nodes=N writes=N conflicts=N <state>=N ...`, what `nodes reconcile --once`
/// prints.
impl std::fmt::Display for PassReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "nodes={} writes={} conflicts={}",
            self.nodes, self.writes, self.conflicts
        )?;
        for (state, n) in &self.states {
            write!(f, " {}={n}", state.as_str())?;
        }
        Ok(())
    }
}

/// One diagnostic row: deterministic, secret-free addressing state of a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeAddressDiagnostic {
    /// `metadata.name`.
    pub node_name: String,
    /// The name its route is derived from (differs under k3s `--with-node-id`).
    pub routing_name: String,
    /// The ExternalIP it should carry first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_external_ip: Option<String>,
    /// The first ExternalIP it carries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_external_ip: Option<String>,
    /// The kubelet port it should advertise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_kubelet_port: Option<u16>,
    /// The kubelet port it advertises.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_kubelet_port: Option<u16>,
    /// True when the node carries exactly what it should.
    pub patched: bool,
    /// Set when the reconciler leaves the node alone, and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skipped: Option<SkipReason>,
    /// Other nodes whose route collides with this one's for the tunnel in use: the same
    /// derived port behind frpc, the same (address, port) pair behind ssh. One of the
    /// colliding nodes cannot be reached.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub collides_with: Vec<String>,
    /// Where the node stands.
    pub state: NodeState,
}

impl NodeAddressDiagnostic {
    /// The state as an operator reads it in a table: upper case where it needs attention,
    /// naming the nodes a route collides with.
    pub fn state_text(&self) -> String {
        match self.state {
            NodeState::Ok => "ok".to_string(),
            NodeState::Unpatched => "UNPATCHED".to_string(),
            NodeState::Colliding => format!("COLLIDES with {}", self.collides_with.join(",")),
            NodeState::TunnelDown => "TUNNEL DOWN".to_string(),
            NodeState::Virtual => "skipped (virtual)".to_string(),
            NodeState::PortUnknown => "skipped (port unknown)".to_string(),
        }
    }

    /// Whether an operator should look at this node: a routed node that is not patched,
    /// whose route collides, or whose tunnel is down.
    pub fn needs_attention(&self) -> bool {
        self.state.needs_attention()
    }

    fn from_row(row: &PlannedNode, tunnel: Tunnel) -> Self {
        let expected_ip = row.expected_external_ip.map(|ip| ip.to_string());
        let patched = row.skipped.is_none()
            && expected_ip.is_some()
            && expected_ip == row.observed_external_ip
            && row.expected_kubelet_port == row.observed_kubelet_port
            && row.change.is_none();
        let collides_with = row.collides_with(tunnel).to_vec();
        NodeAddressDiagnostic {
            node_name: row.node_name.clone(),
            routing_name: row.routing_name.clone(),
            expected_external_ip: expected_ip,
            observed_external_ip: row.observed_external_ip.clone(),
            expected_kubelet_port: row.expected_kubelet_port,
            observed_kubelet_port: row.observed_kubelet_port,
            patched,
            skipped: row.skipped,
            state: state_of(row.skipped, patched, !collides_with.is_empty()),
            collides_with,
        }
    }
}

fn state_of(skipped: Option<SkipReason>, patched: bool, colliding: bool) -> NodeState {
    match skipped {
        Some(SkipReason::Virtual) => NodeState::Virtual,
        Some(SkipReason::PortUnknown) => NodeState::PortUnknown,
        Some(SkipReason::TunnelDown) => NodeState::TunnelDown,
        None if !patched => NodeState::Unpatched,
        None if colliding => NodeState::Colliding,
        None => NodeState::Ok,
    }
}

/// Keeps every routed Node's first ExternalIP at its loopback address and its kubelet
/// port at the derived port, so the API server dials each kubelet through its tunnel.
#[derive(Clone)]
pub struct Reconciler {
    /// The API client.
    pub client: kube::Client,
    /// Where this host reaches each node's kubelet (by routing name).
    pub port_for: KubeletPortFunc,
    /// Resync interval of [`Reconciler::run`]; watch events trigger passes in between.
    /// A resync plans from the watch's store: it sends no request unless a node differs.
    pub interval: Duration,
    /// How long [`Reconciler::run`] gathers watch events before a pass.
    pub debounce: Duration,
    /// The tunnel in use, which decides which collisions break a node.
    pub tunnel: Tunnel,
    /// Write a node only when its loopback address and port accept a TCP connection from
    /// this host; a node whose tunnel is down is left as it is and reported `tunnel-down`.
    pub require_tunnel: bool,
    /// Who the Kubernetes Events about repaired Nodes come from; `None` publishes none.
    pub reporter: Option<Reporter>,
    monitor: Monitor,
}

impl std::fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconciler")
            .field("interval", &self.interval)
            .field("debounce", &self.debounce)
            .field("tunnel", &self.tunnel)
            .field("require_tunnel", &self.require_tunnel)
            .finish_non_exhaustive()
    }
}

enum WriteOutcome {
    Written {
        conflicts: usize,
        /// The resourceVersion the successful write replaced.
        base_rv: Option<String>,
        /// The node as stored by the write.
        stored: Box<Node>,
    },
    AlreadyDone {
        conflicts: usize,
    },
    Gone,
}

/// Nodes this reconciler wrote whose watch echo has not reached the store yet, by name:
/// the resourceVersion the write replaced and the node it stored.
///
/// Without it a pass that runs between a write and its echo would plan the same change
/// again from the store's older copy and send a write bound to fail with a conflict. A
/// successful write with a resourceVersion precondition means no other event for the node
/// sits between the replaced version and ours, so the store holding exactly the replaced
/// version means "echo not here yet"; any other version means the store moved on.
type Overlay = HashMap<String, (Option<String>, Arc<Node>)>;

/// What `run` keeps between passes: the watch's store, the writes whose echo is due, the
/// last plan, and what changed since.
struct View {
    store: Store<Node>,
    overlay: Overlay,
    cache: Option<PlanCache>,
    /// Nodes with watch events since the last pass.
    dirty: HashSet<String>,
    /// Plan the whole store next time (start, re-list, resync, a deleted node, leadership).
    full: bool,
}

/// The rows of the last full plan, by node name.
struct PlanCache {
    rows: Vec<PlannedNode>,
    index: HashMap<String, usize>,
}

impl PlanCache {
    fn new(rows: Vec<PlannedNode>) -> PlanCache {
        let index = rows
            .iter()
            .enumerate()
            .map(|(i, r)| (r.node_name.clone(), i))
            .collect();
        PlanCache { rows, index }
    }
}

/// Re-derives the observed fields and the change of a planned row from the node as it is
/// now, keeping its assignment.
fn refresh_row(row: &mut PlannedNode, node: &Node, port_for: &dyn Fn(&str) -> Option<u16>) {
    row.observed_external_ip = first_external_ip(node).map(str::to_string);
    row.observed_kubelet_port = observed_kubelet_port(node);
    let target = match (
        row.skipped,
        row.expected_external_ip,
        row.expected_kubelet_port,
    ) {
        (None, Some(ip), Some(port)) => Some(Target::Route { ip, port }),
        (Some(SkipReason::Virtual), _, _) => Some(Target::Unroute {
            derived: port_for(&row.routing_name),
        }),
        _ => None,
    };
    row.change = target.and_then(|t| t.wanted(node));
}

/// Where a pass sends what it repaired.
enum Events<'a> {
    None,
    Queue(&'a mpsc::Sender<(Node, KubeEvent)>),
    Collect(&'a mut Vec<(Node, KubeEvent)>),
}

impl Reconciler {
    /// A reconciler with the default port range, interval and debounce, frpc collision
    /// rules, no tunnel probing, and Events published as [`EVENT_CONTROLLER`].
    pub fn new(client: kube::Client) -> Self {
        Reconciler {
            client,
            port_for: port_func(PortRange::DEFAULT),
            interval: DEFAULT_INTERVAL,
            debounce: DEBOUNCE,
            tunnel: Tunnel::Frpc,
            require_tunnel: false,
            reporter: Some(Reporter {
                controller: EVENT_CONTROLLER.into(),
                instance: None,
            }),
            monitor: Monitor::new(),
        }
    }

    /// The liveness and counters of this reconciler (shared by its clones): serve
    /// [`Monitor::status`] on `/status` and register [`Monitor::register`] for `/metrics`.
    pub fn monitor(&self) -> Monitor {
        self.monitor.clone()
    }

    fn api(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    async fn list(&self) -> Result<Vec<Node>, Error> {
        let list = self.api().list(&ListParams::default()).await.map_err(|e| {
            self.monitor.count_error(ErrorKind::List);
            Error::List(e)
        })?;
        Ok(list.items)
    }

    /// One pass for one-shot use (`nodes reconcile --once`): list the Nodes, compute the
    /// wanted changes, write those (and only those), publish an Event per repaired node.
    /// A pass over nodes that already match writes nothing. [`Reconciler::run`] does not
    /// use this: it plans from its watch and never lists.
    pub async fn once(&self) -> Result<PassReport, Error> {
        let nodes: Vec<Arc<Node>> = self.list().await?.into_iter().map(Arc::new).collect();
        let mut overlay = Overlay::new();
        let mut events = Vec::new();
        let result = self
            .pass_over(
                &nodes,
                &always_leader(),
                &mut overlay,
                Events::Collect(&mut events),
            )
            .await;
        if let Some(recorder) = self.recorder() {
            let monitor = self.monitor.clone();
            futures::stream::iter(events)
                .for_each_concurrent(WRITE_CONCURRENCY, |(node, ev)| {
                    let recorder = recorder.clone();
                    let monitor = monitor.clone();
                    async move { publish(&recorder, &monitor, &node, &ev).await }
                })
                .await;
        }
        let mut report = result?;
        if self.require_tunnel {
            // One-shot: also check the tunnels of the nodes that needed no write, so the
            // exit code says whether every node is reachable. (`run` probes only the
            // nodes it writes: a settled cluster costs it no connection.)
            let rows = plan(&nodes, &*self.port_for);
            let targets: Vec<(Ipv4Addr, u16, NodeState)> = rows
                .iter()
                .filter(|r| r.change.is_none() && r.skipped.is_none())
                .filter_map(|r| {
                    let colliding = !r.collides_with(self.tunnel).is_empty();
                    Some((
                        r.expected_external_ip?,
                        r.expected_kubelet_port?,
                        state_of(None, true, colliding),
                    ))
                })
                .collect();
            let probed: Vec<Option<NodeState>> = futures::stream::iter(targets)
                .map(|(ip, port, state)| async move {
                    (!tunnel_answers(ip, port).await).then_some(state)
                })
                .buffer_unordered(64)
                .collect()
                .await;
            let down = probed.into_iter().flatten();
            for was in down {
                if let Some(n) = report.states.get_mut(&was) {
                    *n = n.saturating_sub(1);
                }
                *report.states.entry(NodeState::TunnelDown).or_default() += 1;
                report.skipped += 1;
            }
            report.states.retain(|_, n| *n > 0);
        }
        self.monitor.set_nodes(&report.states);
        Ok(report)
    }

    /// The addressing state of every node, sorted by node name. Reads only (one list; with
    /// `require_tunnel`, a TCP connection to each routed node's tunnel).
    pub async fn diagnostics(&self) -> Result<Vec<NodeAddressDiagnostic>, Error> {
        let nodes = self.list().await?;
        let mut rows = plan(&nodes, &*self.port_for);
        if self.require_tunnel {
            let down: Vec<bool> = futures::stream::iter(rows.iter())
                .map(|row| async move {
                    match (
                        row.skipped,
                        row.expected_external_ip,
                        row.expected_kubelet_port,
                    ) {
                        (None, Some(ip), Some(port)) => !tunnel_answers(ip, port).await,
                        _ => false,
                    }
                })
                .buffered(64)
                .collect()
                .await;
            for (row, down) in rows.iter_mut().zip(down) {
                if down {
                    row.skipped = Some(SkipReason::TunnelDown);
                }
            }
        }
        Ok(rows
            .iter()
            .map(|r| NodeAddressDiagnostic::from_row(r, self.tunnel))
            .collect())
    }

    fn recorder(&self) -> Option<Recorder> {
        self.reporter
            .clone()
            .map(|r| Recorder::new(self.client.clone(), r))
    }

    /// Plans over `nodes` and writes what differs while `leader` says so.
    async fn pass_over(
        &self,
        nodes: &[Arc<Node>],
        leader: &Leadership,
        overlay: &mut Overlay,
        events: Events<'_>,
    ) -> Result<PassReport, Error> {
        let rows = plan(nodes, &*self.port_for);
        let by_name: HashMap<&str, &Arc<Node>> = nodes
            .iter()
            .map(|n| (n.metadata.name.as_deref().unwrap_or_default(), n))
            .collect();
        let lookup = |name: &str| by_name.get(name).map(|n| Arc::clone(n));
        self.write_rows(&rows, 0..rows.len(), &lookup, leader, overlay, events)
            .await
    }

    /// Writes the changes of `rows[candidates]` (the nodes found through `lookup`) while
    /// `leader` says so, and reports the states of all `rows` afterwards.
    async fn write_rows(
        &self,
        rows: &[PlannedNode],
        candidates: impl Iterator<Item = usize>,
        lookup: &(dyn Fn(&str) -> Option<Arc<Node>> + Sync),
        leader: &Leadership,
        overlay: &mut Overlay,
        mut events: Events<'_>,
    ) -> Result<PassReport, Error> {
        let mut report = PassReport {
            nodes: rows.len(),
            ..Default::default()
        };
        // Per written or probed node: (skip reason after probing, patched after the pass);
        // `None` for a node that turned out to be gone.
        let mut outcome: HashMap<String, Option<(Option<SkipReason>, bool)>> = HashMap::new();
        let mut befores: HashMap<String, Arc<Node>> = HashMap::new();

        let mut jobs = Vec::new();
        for i in candidates {
            let row = &rows[i];
            let (Some(change), Some(node)) = (row.change.clone(), lookup(&row.node_name)) else {
                continue;
            };
            let target = match (
                row.skipped,
                row.expected_external_ip,
                row.expected_kubelet_port,
            ) {
                (None, Some(ip), Some(port)) => Target::Route { ip, port },
                (Some(SkipReason::Virtual), _, _) => Target::Unroute {
                    derived: (self.port_for)(&row.routing_name),
                },
                _ => continue,
            };
            outcome.insert(row.node_name.clone(), Some((row.skipped, false)));
            jobs.push((row.node_name.clone(), Node::clone(&node), target, change));
            befores.insert(row.node_name.clone(), node);
        }
        let api = self.api();
        let require_tunnel = self.require_tunnel;
        let results: Vec<(String, Attempt)> = futures::stream::iter(jobs)
            .map(|(name, node, target, change)| {
                let api = api.clone();
                let leader = leader.clone();
                let span = info_span!("node_status_write", node = %name, target = %target);
                async move {
                    if let Target::Route { ip, port } = target
                        && require_tunnel
                        && !tunnel_answers(ip, port).await
                    {
                        return (name, Attempt::TunnelDown);
                    }
                    // Checked per write, not per pass: a holder that loses the lease
                    // mid-pass stops at the next node.
                    if !leader.is_leader() {
                        return (name, Attempt::NotLeader);
                    }
                    let r = write_node(&api, node, target, change.clone()).await;
                    (name, Attempt::Made(Box::new((r, change))))
                }
                .instrument(span)
            })
            .buffer_unordered(WRITE_CONCURRENCY)
            .collect()
            .await;

        let mut failures: Vec<(String, Error)> = Vec::new();
        let mut attempted = 0;
        for (name, attempt) in results {
            let mut gone = false;
            let mut entry = outcome
                .get(&name)
                .copied()
                .flatten()
                .unwrap_or((None, false));
            match attempt {
                Attempt::TunnelDown => entry.0 = Some(SkipReason::TunnelDown),
                Attempt::NotLeader => {}
                Attempt::Made(made) => {
                    let (r, change) = *made;
                    attempted += 1;
                    match r {
                        Ok(WriteOutcome::Written {
                            conflicts,
                            base_rv,
                            stored,
                        }) => {
                            report.writes += 1;
                            report.conflicts += conflicts;
                            self.monitor.count_write();
                            self.monitor.count_conflicts(conflicts);
                            entry.1 = true;
                            let ev =
                                repair_event(befores.get(name.as_str()).map(|n| &**n), &change);
                            match &mut events {
                                Events::None => {}
                                Events::Queue(tx) => {
                                    if tx.try_send(((*stored).clone(), ev)).is_err() {
                                        self.monitor.count_error(ErrorKind::Event);
                                    }
                                }
                                Events::Collect(v) => v.push(((*stored).clone(), ev)),
                            }
                            overlay.insert(name.clone(), (base_rv, Arc::new(*stored)));
                        }
                        Ok(WriteOutcome::AlreadyDone { conflicts }) => {
                            report.conflicts += conflicts;
                            self.monitor.count_conflicts(conflicts);
                            entry.1 = true;
                        }
                        Ok(WriteOutcome::Gone) => gone = true,
                        Err(e) => {
                            if let Error::Conflict { attempts, .. } = e {
                                self.monitor.count_conflicts(attempts as usize);
                                report.conflicts += attempts as usize;
                            }
                            self.monitor.count_error(e.kind());
                            failures.push((name.clone(), e));
                        }
                    }
                }
            }
            outcome.insert(name, (!gone).then_some(entry));
        }

        let mut counted = 0;
        for row in rows {
            let (skipped, patched) = match outcome.get(&row.node_name) {
                Some(Some(o)) => *o,
                Some(None) => continue,
                None => (row.skipped, row.change.is_none()),
            };
            counted += 1;
            let colliding = !row.collides_with(self.tunnel).is_empty();
            if skipped.is_some() {
                report.skipped += 1;
            } else if colliding {
                report.colliding += 1;
            }
            *report
                .states
                .entry(state_of(skipped, patched, colliding))
                .or_default() += 1;
        }
        report.nodes = counted;

        if failures.is_empty() {
            return Ok(report);
        }
        failures.sort_by(|a, b| a.0.cmp(&b.0));
        let failed = failures.len();
        let first = failures.swap_remove(0).1;
        Err(Error::Writes {
            failed,
            attempted,
            first: Box::new(first),
            report: Box::new(report),
        })
    }

    /// Reconciles until `cancel` fires. The Node watch fills a reflector store; a pass
    /// plans from the store after every burst of events ([`Reconciler::debounce`]), when
    /// this process becomes leader, and every `interval` as a resync. After start the only
    /// LISTs are the watcher's own re-lists after a watch failure. Writes happen only while
    /// `leader` is `true`; a standby keeps its store and its counters current.
    ///
    /// Logging is part of the contract: one info line on start (evidence that it runs), a
    /// warning on the transition into failure and one on recovery (evidence that it
    /// fails, then that it stopped failing), and repeats at debug so that a long outage
    /// cannot flood the log. The same facts are in [`Reconciler::monitor`].
    pub async fn run(&self, cancel: CancellationToken, mut leader: Leadership) {
        self.monitor.mark_started();
        let mut was_leader = leader.is_leader();
        self.monitor.set_leader(was_leader);
        info!(
            interval = ?self.interval,
            "node address reconciler started: watching Nodes, resync every {:?}",
            self.interval
        );
        let (events_tx, events_task) = match self.recorder() {
            Some(recorder) => {
                let (tx, rx) = mpsc::channel(EVENT_QUEUE);
                let task = tokio::spawn(publish_events(recorder, self.monitor.clone(), rx));
                (Some(tx), Some(task))
            }
            None => (None, None),
        };
        let (store, writer) = reflector::store::<Node>();
        let mut view = View {
            store,
            overlay: Overlay::new(),
            cache: None,
            dirty: HashSet::new(),
            full: true,
        };
        let mut watch = self.watch(writer);
        let mut ticker = tokio::time::interval(self.interval.max(Duration::from_millis(10)));
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut pending: Option<Instant> = None;
        let mut ready = false;
        let mut lists = 0u64;
        let mut watch_failing = false;
        let mut leader_open = true;
        loop {
            let deadline = pending.unwrap_or_else(Instant::now);
            tokio::select! {
                biased;
                _ = cancel.cancelled() => break,
                open = leader.changed(), if leader_open => {
                    leader_open = open;
                    let now_leader = leader.is_leader();
                    self.monitor.set_leader(now_leader);
                    if now_leader && !was_leader {
                        info!("holding the reconciler lease: writing");
                        view.full = true;
                        pending = Some(Instant::now());
                    } else if !now_leader && was_leader {
                        info!("not holding the reconciler lease: standing by, not writing");
                    }
                    was_leader = now_leader;
                },
                _ = tokio::time::sleep_until(deadline), if pending.is_some() && ready => {
                    pending = None;
                    was_leader = self.pass(&mut view, &leader, events_tx.as_ref(), "watch").await;
                }
                _ = ticker.tick() => {
                    if ready {
                        pending = None;
                        view.full = true;
                        was_leader = self.pass(&mut view, &leader, events_tx.as_ref(), "resync").await;
                    }
                }
                ev = watch.next() => match ev {
                    Some(Ok(ev)) => {
                        if watch_failing {
                            watch_failing = false;
                            warn!("node watch recovered");
                        }
                        match &ev {
                            Event::Init => {
                                lists += 1;
                                if lists > 1 {
                                    self.monitor.count_watch_restart();
                                    debug!("node watch re-listing");
                                }
                            }
                            Event::InitApply(_) => {}
                            // The initial list (and every relist) ends with InitDone; the
                            // store now holds all of it, and one pass covers it.
                            Event::InitDone => {
                                ready = true;
                                view.full = true;
                                pending = Some(Instant::now());
                            }
                            Event::Apply(n) | Event::Delete(n) => {
                                let name = n.metadata.name.clone().unwrap_or_default();
                                debug!(node = %name, "node event");
                                if matches!(ev, Event::Delete(_)) {
                                    view.full = true;
                                }
                                view.dirty.insert(name);
                                if pending.is_none() {
                                    pending = Some(Instant::now() + self.debounce);
                                }
                            }
                        }
                    }
                    Some(Err(e)) => {
                        self.monitor.count_error(ErrorKind::Watch);
                        let e = Error::Watch(e);
                        if !ready {
                            // No view of the nodes at all: that is a failing pass.
                            self.record(Err(&e), None, None);
                        } else if watch_failing {
                            debug!(error = %error_chain(&e), "node watch still failing; retrying with backoff");
                        } else {
                            watch_failing = true;
                            warn!(error = %error_chain(&e), "node watch failed; retrying with backoff, resync continues every {:?} from the last view", self.interval);
                        }
                    }
                    None => {
                        // The watcher restarts watches itself and is not expected to end;
                        // if it does, start a new one rather than go deaf.
                        warn!("node watch ended; starting a new one");
                        let (fresh, writer) = reflector::store::<Node>();
                        view.store = fresh;
                        view.cache = None;
                        view.full = true;
                        ready = false;
                        watch = self.watch(writer);
                    }
                },
            }
        }
        drop(events_tx);
        if let Some(task) = events_task {
            // Events queued before the stop are published; a stuck API server cannot hold
            // the shutdown for long.
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        info!("node address reconciler stopped");
    }

    fn watch(
        &self,
        writer: Writer<Node>,
    ) -> futures::stream::BoxStream<'static, Result<Event<Node>, watcher::Error>> {
        reflector::reflector(
            writer,
            watcher::watcher(self.api(), watcher::Config::default()).default_backoff(),
        )
        .boxed()
    }

    /// One pass of `run`. With a plan cached from an earlier pass and only nodes whose
    /// routing identity is unchanged in `view.dirty`, it re-plans just those nodes: the
    /// loopback assignment depends only on the set of routed nodes, so a status change of
    /// one node (a kubelet write, the echo of ours) cannot move another node's address.
    /// Anything else (a resync, a new or deleted node, a label or annotation change that
    /// changes a route) plans the whole store.
    async fn pass(
        &self,
        view: &mut View,
        leader: &Leadership,
        events: Option<&mpsc::Sender<(Node, KubeEvent)>>,
        trigger: &'static str,
    ) -> bool {
        let started = Instant::now();
        // Leadership can lapse without a notification (renewals failing until the renew
        // deadline passes); what this pass saw is what the caller compares the next
        // notification with, so a regained lease always gets a full pass.
        let is_leader = leader.is_leader();
        self.monitor.set_leader(is_leader);
        let events = match events {
            Some(tx) => Events::Queue(tx),
            None => Events::None,
        };
        let dirty = std::mem::take(&mut view.dirty);
        let full = std::mem::take(&mut view.full);
        let incremental = if full {
            None
        } else {
            self.refresh(view, &dirty)
        };
        let result = match incremental {
            Some(fresh) => {
                let span = info_span!("nodeaddr_pass", trigger, nodes = fresh.len());
                let cache = view.cache.as_ref().map(|c| &c.rows[..]).unwrap_or_default();
                let index = &view.cache.as_ref().map(|c| &c.index);
                let candidates: Vec<usize> = fresh
                    .keys()
                    .filter_map(|n| index.and_then(|i| i.get(n).copied()))
                    .collect();
                let lookup = |name: &str| fresh.get(name).cloned();
                self.write_rows(
                    cache,
                    candidates.into_iter(),
                    &lookup,
                    leader,
                    &mut view.overlay,
                    events,
                )
                .instrument(span)
                .await
            }
            None => {
                let nodes = with_overlay(view.store.state(), &mut view.overlay);
                let span = info_span!("nodeaddr_pass", trigger, nodes = nodes.len());
                let rows = plan(&nodes, &*self.port_for);
                let by_name: HashMap<&str, &Arc<Node>> = nodes
                    .iter()
                    .map(|n| (n.metadata.name.as_deref().unwrap_or_default(), n))
                    .collect();
                let lookup = |name: &str| by_name.get(name).map(|n| Arc::clone(n));
                let r = self
                    .write_rows(
                        &rows,
                        0..rows.len(),
                        &lookup,
                        leader,
                        &mut view.overlay,
                        events,
                    )
                    .instrument(span)
                    .await;
                view.cache = Some(PlanCache::new(rows));
                r
            }
        };
        // Rows of nodes just written describe them as they were: bring them up to date
        // from what the writes stored.
        if let Some(cache) = &mut view.cache {
            for (name, (_, stored)) in &view.overlay {
                if let Some(&i) = cache.index.get(name) {
                    refresh_row(&mut cache.rows[i], stored, &*self.port_for);
                }
            }
        }
        let took = Some(started.elapsed());
        match &result {
            Ok(report) => self.record(Ok(()), Some(report), took),
            Err(e) => {
                let report = match e {
                    Error::Writes { report, .. } => Some(&**report),
                    _ => None,
                };
                self.record(Err(e), report, took)
            }
        }
        is_leader
    }

    /// Refreshes the cached rows of `dirty` nodes from the store; `None` when the cache
    /// cannot serve (no cache, a node new, gone, or routed differently): plan everything.
    fn refresh(
        &self,
        view: &mut View,
        dirty: &HashSet<String>,
    ) -> Option<HashMap<String, Arc<Node>>> {
        let cache = view.cache.as_mut()?;
        let mut fresh = HashMap::with_capacity(dirty.len());
        for name in dirty {
            let node = view.store.get(&ObjectRef::new(name))?;
            let &i = cache.index.get(name)?;
            let row = &mut cache.rows[i];
            let virtual_now = is_virtual_node(&node);
            if routing_name(&node) != row.routing_name
                || virtual_now != (row.skipped == Some(SkipReason::Virtual))
            {
                return None;
            }
            let node = match view.overlay.get(name) {
                Some((base_rv, written)) if *base_rv == node.metadata.resource_version => {
                    written.clone()
                }
                Some(_) => {
                    view.overlay.remove(name);
                    node
                }
                None => node,
            };
            refresh_row(row, &node, &*self.port_for);
            fresh.insert(name.clone(), node);
        }
        Some(fresh)
    }

    fn record(
        &self,
        result: Result<(), &Error>,
        report: Option<&PassReport>,
        took: Option<Duration>,
    ) {
        if let Some(report) = report {
            self.monitor.set_nodes(&report.states);
        }
        let failures_before = self
            .monitor
            .record_pass(result.map_err(|e| error_chain(e)), took);
        match result {
            Ok(()) => {
                let (writes, conflicts) =
                    report.map(|r| (r.writes, r.conflicts)).unwrap_or_default();
                if failures_before > 0 {
                    warn!(
                        failed_passes = failures_before,
                        writes,
                        "node address reconcile recovered after {failures_before} failed passes"
                    );
                } else {
                    debug!(writes, conflicts, "node address pass done");
                }
            }
            Err(e) => {
                let chain = error_chain(e);
                if failures_before == 0 {
                    warn!(error = %chain, "node address reconcile failing; kubectl logs/exec may not reach kubelets");
                } else {
                    debug!(error = %chain, consecutive_failures = failures_before + 1, "node address reconcile still failing");
                }
            }
        }
    }
}

/// The store's nodes, with the overlay's copy where our write's echo has not arrived yet.
/// Prunes overlay entries the store has caught up with (or that it no longer holds).
fn with_overlay(nodes: Vec<Arc<Node>>, overlay: &mut Overlay) -> Vec<Arc<Node>> {
    if overlay.is_empty() {
        return nodes;
    }
    let mut seen = std::collections::HashSet::with_capacity(overlay.len());
    let out = nodes
        .into_iter()
        .map(|n| {
            let name = n.metadata.name.as_deref().unwrap_or_default();
            match overlay.get(name) {
                Some((base_rv, written)) if *base_rv == n.metadata.resource_version => {
                    seen.insert(name.to_string());
                    written.clone()
                }
                _ => n,
            }
        })
        .collect();
    overlay.retain(|name, _| seen.contains(name));
    out
}

/// What became of one planned write.
enum Attempt {
    /// `require_tunnel` and the tunnel did not answer: not written.
    TunnelDown,
    /// This process does not hold the lease: not written.
    NotLeader,
    /// The write was made (or found unnecessary after a conflict).
    Made(Box<(Result<WriteOutcome, Error>, StatusChange)>),
}

/// What a write does to a node.
#[derive(Clone, Copy, Debug)]
enum Target {
    /// Route it: this ExternalIP first, this kubelet port.
    Route { ip: Ipv4Addr, port: u16 },
    /// It became virtual: remove what we wrote (the port only while it is `derived`).
    Unroute { derived: Option<u16> },
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Route { ip, port } => write!(f, "{ip}:{port}"),
            Target::Unroute { .. } => f.write_str("unroute"),
        }
    }
}

impl Target {
    /// The change wanted on `node` as it is now; `None` when it already holds.
    fn wanted(&self, node: &Node) -> Option<StatusChange> {
        match *self {
            Target::Route { ip, port } => wanted_status(node, ip, port),
            Target::Unroute { derived } => {
                if is_virtual_node(node) {
                    unroute_status(node, derived)
                } else {
                    None
                }
            }
        }
    }
}

/// Whether something accepts a TCP connection at `ip:port` within
/// [`TUNNEL_PROBE_TIMEOUT`]: the local end of a node's tunnel.
pub async fn tunnel_answers(ip: Ipv4Addr, port: u16) -> bool {
    matches!(
        tokio::time::timeout(
            TUNNEL_PROBE_TIMEOUT,
            tokio::net::TcpStream::connect((ip, port))
        )
        .await,
        Ok(Ok(_))
    )
}

async fn write_node(
    api: &Api<Node>,
    mut node: Node,
    target: Target,
    mut change: StatusChange,
) -> Result<WriteOutcome, Error> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut conflicts = 0;
    for _ in 0..MAX_WRITE_ATTEMPTS {
        // The replace carries the resourceVersion read with the node, so a concurrent
        // kubelet status write turns into a 409 instead of being overwritten.
        let base_rv = node.metadata.resource_version.clone();
        apply_change(&mut node, &change);
        match api
            .replace_status(&name, &PostParams::default(), &node)
            .await
        {
            Ok(stored) => {
                debug!("status written");
                return Ok(WriteOutcome::Written {
                    conflicts,
                    base_rv,
                    stored: Box::new(stored),
                });
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                conflicts += 1;
                debug!("conflict; re-reading the node");
                match api.get_opt(&name).await {
                    Ok(Some(fresh)) => {
                        // The wanted status is recomputed from the fresh copy: another
                        // writer may have changed the addresses we are about to replace.
                        node = fresh;
                        match target.wanted(&node) {
                            Some(c) => change = c,
                            None => return Ok(WriteOutcome::AlreadyDone { conflicts }),
                        }
                    }
                    Ok(None) => return Ok(WriteOutcome::Gone),
                    Err(source) => return Err(Error::Reread { node: name, source }),
                }
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                debug!("node deleted before its status was written");
                return Ok(WriteOutcome::Gone);
            }
            Err(source) => return Err(Error::Write { node: name, source }),
        }
    }
    Err(Error::Conflict {
        node: name,
        attempts: MAX_WRITE_ATTEMPTS,
    })
}

/// The Event for a written node: what it carried before and what it carries now.
fn repair_event(before: Option<&Node>, change: &StatusChange) -> KubeEvent {
    let was_ip = before
        .and_then(first_external_ip)
        .unwrap_or("none")
        .to_string();
    let was_port = before
        .and_then(observed_kubelet_port)
        .map_or_else(|| "none".to_string(), |p| p.to_string());
    let now_ip = change
        .addresses
        .iter()
        .find(|a| a.type_ == crate::plan::EXTERNAL_IP)
        .map_or("none", |a| a.address.as_str());
    if change.kubelet_port == 0 || before.is_some_and(is_virtual_node) {
        KubeEvent {
            type_: EventType::Normal,
            reason: "KubeletRouteRemoved".into(),
            note: Some(format!(
                "virtual node: removed the tunnel route (ExternalIP was {was_ip}, kubelet port was {was_port})"
            )),
            action: "UpdateNodeStatus".into(),
            secondary: None,
        }
    } else {
        KubeEvent {
            type_: EventType::Normal,
            reason: "KubeletRouteRepaired".into(),
            note: Some(format!(
                "kubelet reached through its tunnel at {now_ip}:{} (ExternalIP was {was_ip}, kubelet port was {was_port})",
                change.kubelet_port
            )),
            action: "UpdateNodeStatus".into(),
            secondary: None,
        }
    }
}

async fn publish(recorder: &Recorder, monitor: &Monitor, node: &Node, ev: &KubeEvent) {
    let reference = node.object_ref(&());
    if let Err(e) = recorder.publish(ev, &reference).await {
        monitor.count_error(ErrorKind::Event);
        debug!(error = %error_chain(&e), node = node.metadata.name.as_deref().unwrap_or_default(), "could not publish an Event");
    }
}

async fn publish_events(
    recorder: Recorder,
    monitor: Monitor,
    mut rx: mpsc::Receiver<(Node, KubeEvent)>,
) {
    while let Some((node, ev)) = rx.recv().await {
        publish(&recorder, &monitor, &node, &ev).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(state: NodeState, collides_with: &[&str]) -> NodeAddressDiagnostic {
        NodeAddressDiagnostic {
            node_name: "n".into(),
            routing_name: "n".into(),
            expected_external_ip: None,
            observed_external_ip: None,
            expected_kubelet_port: None,
            observed_kubelet_port: None,
            patched: false,
            skipped: None,
            collides_with: collides_with.iter().map(|s| s.to_string()).collect(),
            state,
        }
    }

    #[test]
    fn each_state_reads_as_an_operator_expects() {
        let cases = [
            (row(NodeState::Ok, &[]), "ok"),
            (row(NodeState::Unpatched, &[]), "UNPATCHED"),
            (row(NodeState::Colliding, &["d", "e"]), "COLLIDES with d,e"),
            (row(NodeState::TunnelDown, &[]), "TUNNEL DOWN"),
            (row(NodeState::Virtual, &[]), "skipped (virtual)"),
            (row(NodeState::PortUnknown, &[]), "skipped (port unknown)"),
        ];
        for (r, want) in cases {
            assert_eq!(r.state_text(), want);
        }
    }

    #[test]
    fn a_pass_summarises_on_one_line_with_every_state_counted() {
        let mut report = PassReport {
            nodes: 3,
            writes: 2,
            conflicts: 1,
            ..PassReport::default()
        };
        report.states.insert(NodeState::Ok, 2);
        report.states.insert(NodeState::Unpatched, 1);
        assert_eq!(
            report.to_string(),
            format!(
                "nodes=3 writes=2 conflicts=1 {}=2 {}=1",
                NodeState::Ok.as_str(),
                NodeState::Unpatched.as_str()
            )
        );
        assert!(report.needs_attention());
    }
}
