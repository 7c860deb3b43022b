//! The thin async half of the reconciler: list, plan (pure), write; and the loop that
//! drives passes from Node watch events and a resync ticker.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::Serialize;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::derive::{KubeletPortFunc, PortRange, port_func};
use crate::plan::{PlannedNode, SkipReason, StatusChange, apply_change, plan, wanted_status};
use crate::status;

/// Default resync interval of [`Reconciler::run`].
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);

/// How long `run` gathers watch events before starting a pass, so that a burst of Node
/// updates (a kubelet status write, our own writes echoing back) costs one pass.
pub const DEBOUNCE: Duration = Duration::from_millis(200);

/// Writes to one node that may hit a resourceVersion conflict before the pass gives up on
/// it (each conflict re-reads the node first).
const MAX_WRITE_ATTEMPTS: u32 = 5;

/// Status writes in flight at once during a pass.
const WRITE_CONCURRENCY: usize = 8;

/// What failed in a reconcile pass.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Node list could not be fetched (no verdict about any node was possible).
    #[error("could not list nodes from the API server")]
    List(#[source] kube::Error),
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
    },
}

/// An error and its causes on one line (`a: b: c`), for logs and the liveness snapshot.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        out.push_str(": ");
        out.push_str(&e.to_string());
        cur = e.source();
    }
    out
}

/// Counts from one pass.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PassReport {
    /// Nodes listed.
    pub nodes: usize,
    /// Nodes skipped (virtual, or no port known).
    pub skipped: usize,
    /// Status writes that succeeded.
    pub writes: usize,
    /// Conflicts met (each followed by a re-read).
    pub conflicts: usize,
    /// Nodes whose derived port another node shares.
    pub colliding: usize,
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
    /// Other nodes deriving the same kubelet port. Two tunnels cannot both publish one
    /// port on every address, so at least one of these nodes' logs will fail.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub port_collides_with: Vec<String>,
}

impl NodeAddressDiagnostic {
    /// Whether an operator should look at this node: a routed node that is not patched or
    /// whose port collides.
    pub fn needs_attention(&self) -> bool {
        self.skipped.is_none() && (!self.patched || !self.port_collides_with.is_empty())
    }
}

impl From<&PlannedNode> for NodeAddressDiagnostic {
    fn from(row: &PlannedNode) -> Self {
        let expected_ip = row.expected_external_ip.map(|ip| ip.to_string());
        let patched = row.skipped.is_none()
            && expected_ip.is_some()
            && expected_ip == row.observed_external_ip
            && row.expected_kubelet_port == row.observed_kubelet_port
            && row.change.is_none();
        NodeAddressDiagnostic {
            node_name: row.node_name.clone(),
            routing_name: row.routing_name.clone(),
            expected_external_ip: expected_ip,
            observed_external_ip: row.observed_external_ip.clone(),
            expected_kubelet_port: row.expected_kubelet_port,
            observed_kubelet_port: row.observed_kubelet_port,
            patched,
            skipped: row.skipped,
            port_collides_with: row.port_collides_with.clone(),
        }
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
    pub interval: Duration,
}

impl std::fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconciler")
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

enum WriteOutcome {
    Written { conflicts: usize },
    AlreadyDone { conflicts: usize },
    Gone,
}

impl Reconciler {
    /// A reconciler with the default port range and interval.
    pub fn new(client: kube::Client) -> Self {
        Reconciler {
            client,
            port_for: port_func(PortRange::DEFAULT),
            interval: DEFAULT_INTERVAL,
        }
    }

    fn api(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    async fn planned(&self) -> Result<(Vec<Node>, Vec<PlannedNode>), Error> {
        let list = self
            .api()
            .list(&ListParams::default())
            .await
            .map_err(Error::List)?;
        let rows = plan(&list.items, &*self.port_for);
        Ok((list.items, rows))
    }

    /// One pass: list the Nodes, compute the wanted changes, write those (and only those).
    /// A pass over nodes that already match writes nothing.
    pub async fn once(&self) -> Result<PassReport, Error> {
        let (nodes, rows) = self.planned().await?;
        let mut by_name: HashMap<&str, &Node> = HashMap::with_capacity(nodes.len());
        for n in &nodes {
            by_name.insert(n.metadata.name.as_deref().unwrap_or_default(), n);
        }
        let mut report = PassReport {
            nodes: rows.len(),
            skipped: rows.iter().filter(|r| r.skipped.is_some()).count(),
            colliding: rows
                .iter()
                .filter(|r| !r.port_collides_with.is_empty())
                .count(),
            ..Default::default()
        };
        let api = self.api();
        let jobs: Vec<_> = rows
            .iter()
            .filter_map(|row| {
                let change = row.change.clone()?;
                let node = (*by_name.get(row.node_name.as_str())?).clone();
                let ip = row.expected_external_ip?;
                Some((row.node_name.clone(), node, ip, change))
            })
            .collect();
        let attempted = jobs.len();
        let results: Vec<(String, Result<WriteOutcome, Error>)> = futures::stream::iter(jobs)
            .map(|(name, node, ip, change)| {
                let api = api.clone();
                let span = info_span!("node_status_write", node = %name, external_ip = %ip, kubelet_port = change.kubelet_port);
                async move {
                    let r = write_node(&api, node, ip, change).await;
                    (name, r)
                }
                .instrument(span)
            })
            .buffer_unordered(WRITE_CONCURRENCY)
            .collect()
            .await;
        let mut failures: Vec<(String, Error)> = Vec::new();
        for (name, r) in results {
            match r {
                Ok(WriteOutcome::Written { conflicts }) => {
                    report.writes += 1;
                    report.conflicts += conflicts;
                }
                Ok(WriteOutcome::AlreadyDone { conflicts }) => report.conflicts += conflicts,
                Ok(WriteOutcome::Gone) => {}
                Err(e) => failures.push((name, e)),
            }
        }
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
        })
    }

    /// The addressing state of every node, sorted by node name. Reads only.
    pub async fn diagnostics(&self) -> Result<Vec<NodeAddressDiagnostic>, Error> {
        let (_, rows) = self.planned().await?;
        Ok(rows.iter().map(NodeAddressDiagnostic::from).collect())
    }

    /// Reconciles until `cancel` fires: a pass at start, one after every burst of Node
    /// watch events ([`DEBOUNCE`]), and one every `interval` as a resync in case an event
    /// was missed. Failed passes are retried by the next trigger.
    ///
    /// Logging is part of the contract: one info line on start (evidence that it runs), a
    /// warning on the transition into failure and one on recovery (evidence that it
    /// fails, then that it stopped failing), and repeats at debug so that a long outage
    /// cannot flood the log. The same facts are in [`crate::last_status`].
    pub async fn run(&self, cancel: CancellationToken) {
        status::mark_started();
        info!(
            interval = ?self.interval,
            "node address reconciler started: watching Nodes, resync every {:?}",
            self.interval
        );
        let mut watch = self.watch();
        let mut ticker = tokio::time::interval(self.interval.max(Duration::from_millis(10)));
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut pending: Option<Instant> = None;
        let mut watch_failing = false;
        loop {
            let deadline = pending.unwrap_or_else(Instant::now);
            tokio::select! {
                biased;
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep_until(deadline), if pending.is_some() => {
                    pending = None;
                    self.pass("watch").await;
                }
                _ = ticker.tick() => {
                    pending = None;
                    self.pass("resync").await;
                }
                ev = watch.next() => match ev {
                    Some(Ok(ev)) => {
                        if watch_failing {
                            watch_failing = false;
                            warn!("node watch recovered");
                        }
                        let wake = match &ev {
                            Event::Apply(n) | Event::Delete(n) => {
                                debug!(node = n.metadata.name.as_deref().unwrap_or_default(), "node event");
                                true
                            }
                            // The initial list (and every relist) ends with InitDone; one
                            // pass covers all of it.
                            Event::InitDone => true,
                            Event::Init | Event::InitApply(_) => false,
                        };
                        if wake && pending.is_none() {
                            pending = Some(Instant::now() + DEBOUNCE);
                        }
                    }
                    Some(Err(e)) => {
                        if watch_failing {
                            debug!(error = %e, "node watch still failing; retrying with backoff");
                        } else {
                            watch_failing = true;
                            warn!(error = %e, "node watch failed; retrying with backoff, resync continues every {:?}", self.interval);
                        }
                    }
                    None => {
                        // The watcher stream restarts watches itself and is not expected
                        // to end; if it does, start a new one rather than go deaf.
                        warn!("node watch ended; starting a new one");
                        watch = self.watch();
                    }
                },
            }
        }
        info!("node address reconciler stopped");
    }

    fn watch(&self) -> futures::stream::BoxStream<'static, Result<Event<Node>, String>> {
        watcher::watcher(self.api(), watcher::Config::default())
            .default_backoff()
            .map_err(|e| error_chain(&e))
            .boxed()
    }

    async fn pass(&self, trigger: &'static str) {
        let span = info_span!("nodeaddr_pass", trigger);
        let result = self.once().instrument(span).await;
        let failures_before =
            status::record_pass(result.as_ref().map(|_| ()).map_err(|e| error_chain(e)));
        match result {
            Ok(report) => {
                if failures_before > 0 {
                    warn!(
                        failed_passes = failures_before,
                        writes = report.writes,
                        "node address reconcile recovered after {failures_before} failed passes"
                    );
                } else {
                    debug!(
                        trigger,
                        nodes = report.nodes,
                        writes = report.writes,
                        conflicts = report.conflicts,
                        "node address pass done"
                    );
                }
            }
            Err(e) => {
                let chain = error_chain(&e);
                if failures_before == 0 {
                    warn!(error = %chain, "node address reconcile failing; kubectl logs/exec may not reach kubelets");
                } else {
                    debug!(error = %chain, consecutive_failures = failures_before + 1, "node address reconcile still failing");
                }
            }
        }
    }
}

async fn write_node(
    api: &Api<Node>,
    mut node: Node,
    ip: Ipv4Addr,
    mut change: StatusChange,
) -> Result<WriteOutcome, Error> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut conflicts = 0;
    for _ in 0..MAX_WRITE_ATTEMPTS {
        // The replace carries the resourceVersion read with the node, so a concurrent
        // kubelet status write turns into a 409 instead of being overwritten.
        apply_change(&mut node, &change);
        match api
            .replace_status(&name, &PostParams::default(), &node)
            .await
        {
            Ok(_) => {
                debug!("status written");
                return Ok(WriteOutcome::Written { conflicts });
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                conflicts += 1;
                debug!("conflict; re-reading the node");
                match api.get_opt(&name).await {
                    Ok(Some(fresh)) => {
                        node = fresh;
                        match wanted_status(&node, ip, change.kubelet_port) {
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
