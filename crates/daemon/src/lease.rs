//! Leader election on a Lease.
//!
//! Every replica runs a [`LeaderElection`]; the one whose identity is the Lease's
//! `holderIdentity` is the leader. The protocol is the one client-go's `leaderelection`
//! package uses, on plain GET and PUT with the resourceVersion read (never a blind write):
//!
//! - the holder renews every `retry_period`; it counts itself the leader only until
//!   `renew_deadline` after it *sent* its last successful renewal, measured on its own
//!   monotonic clock, so it stops writing before any standby may take over;
//! - a standby takes the Lease over only when it has seen no change to it (no new
//!   resourceVersion) for the Lease's own `leaseDurationSeconds`, measured from when the
//!   standby observed the last change, so clock skew between hosts does not matter;
//! - a holder shutting down releases the Lease (empty holder, one-second duration), so a
//!   standby takes over at its next retry instead of waiting out the duration.
//!
//! Consumers ask [`LeaderHandle::is_leader`] right before each write.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// A Lease configuration that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The timings do not satisfy `retry_period < renew_deadline < lease_duration`.
    #[error(
        "lease {namespace}/{name}: timings must satisfy retry period ({retry:?}) < renew deadline ({renew:?}) < lease duration ({duration:?}), with a lease duration of at least 1s"
    )]
    Timings {
        /// Lease namespace.
        namespace: String,
        /// Lease name.
        name: String,
        /// The retry period given.
        retry: Duration,
        /// The renew deadline given.
        renew: Duration,
        /// The lease duration given.
        duration: Duration,
    },
    /// The identity is empty: nobody could tell holders apart.
    #[error("lease {namespace}/{name}: the holder identity must not be empty")]
    EmptyIdentity {
        /// Lease namespace.
        namespace: String,
        /// Lease name.
        name: String,
    },
}

/// Where the Lease lives, who this replica is, and the timings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Lease namespace (the project's leases live in `kube-system`).
    pub namespace: String,
    /// Lease name.
    pub name: String,
    /// This replica's identity, written as `holderIdentity`: unique per process (host name
    /// plus a random or process-specific suffix).
    pub identity: String,
    /// How long a standby waits, after the last change it saw, before taking over.
    pub lease_duration: Duration,
    /// How long after its last successful renewal the holder still counts itself leader.
    pub renew_deadline: Duration,
    /// How often every replica tries to acquire or renew.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// A configuration with client-go's default timings: 15 s duration, 10 s renew
    /// deadline, 2 s retry period.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        LeaseConfig {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// Sets the three timings at once.
    pub fn with_timings(
        mut self,
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Self {
        self.lease_duration = lease_duration;
        self.renew_deadline = renew_deadline;
        self.retry_period = retry_period;
        self
    }

    /// Checks the configuration can elect a single leader.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.identity.is_empty() {
            return Err(ConfigError::EmptyIdentity {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
            });
        }
        if self.lease_duration < Duration::from_secs(1)
            || self.retry_period.is_zero()
            || self.retry_period >= self.renew_deadline
            || self.renew_deadline >= self.lease_duration
        {
            return Err(ConfigError::Timings {
                namespace: self.namespace.clone(),
                name: self.name.clone(),
                retry: self.retry_period,
                renew: self.renew_deadline,
                duration: self.lease_duration,
            });
        }
        Ok(())
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }
}

/// This process's default holder identity: the pod name in a cluster (`POD_NAME`, set from
/// a fieldRef), else `<host name>-<pid>`. Unique per process and readable in
/// `kubectl get lease`.
pub fn default_identity() -> String {
    if let Ok(name) = std::env::var("POD_NAME")
        && !name.is_empty()
    {
        return name;
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".into());
    format!("{host}-{}", std::process::id())
}

/// What this replica last learnt about the Lease.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseStatus {
    /// The holder the Lease named at the last read (`None`: unheld or never read).
    pub holder: Option<String>,
    /// Whether this replica held the Lease at its last successful renewal.
    pub held: bool,
    /// The Lease's `leaseTransitions` at the last read.
    pub transitions: i32,
    /// Until when this replica may act as leader (monotonic clock); `None` when not leader.
    pub valid_until: Option<Instant>,
}

/// A cheap, cloneable view of the election, for the code that writes.
#[derive(Clone, Debug)]
pub struct LeaderHandle {
    rx: watch::Receiver<LeaseStatus>,
    // Without election (`always()`): the only writer by configuration.
    unconditional: bool,
}

impl LeaderHandle {
    /// A handle that is always the leader, for a daemon run without leader election
    /// (a single replica, or `--leader-elect=false`).
    pub fn always() -> LeaderHandle {
        let (_tx, rx) = watch::channel(LeaseStatus {
            holder: None,
            held: true,
            transitions: 0,
            valid_until: None,
        });
        LeaderHandle {
            rx,
            unconditional: true,
        }
    }

    /// Whether this replica may write now: it holds the Lease and its last renewal is
    /// recent enough that no standby can have taken over. Ask right before each write.
    pub fn is_leader(&self) -> bool {
        if self.unconditional {
            return true;
        }
        let status = self.rx.borrow();
        status.held
            && status
                .valid_until
                .is_some_and(|until| Instant::now() < until)
    }

    /// The last status published by the election loop.
    pub fn status(&self) -> LeaseStatus {
        self.rx.borrow().clone()
    }

    /// Waits until this replica is the leader, or the election stopped (then `false`).
    pub async fn wait_leader(&mut self) -> bool {
        loop {
            if self.is_leader() {
                return true;
            }
            if self.unconditional || self.rx.changed().await.is_err() {
                return false;
            }
        }
    }

    /// Waits for the next change of the election's status. `false` once the election
    /// loop has ended.
    pub async fn changed(&mut self) -> bool {
        !self.unconditional && self.rx.changed().await.is_ok()
    }
}

#[derive(Clone, Default)]
struct Metrics {
    leader: Gauge,
    acquisitions: Counter,
    errors: Counter,
}

/// One replica's side of the election.
pub struct LeaderElection {
    api: Api<Lease>,
    config: LeaseConfig,
    metrics: Metrics,
    // The last resourceVersion seen and when it was first seen (monotonic clock).
    observed: Option<(String, Instant)>,
}

enum Outcome {
    Held {
        transitions: i32,
    },
    Other {
        holder: Option<String>,
        transitions: i32,
    },
}

impl LeaderElection {
    /// An election on `config`'s Lease through `client`. Fails when the configuration
    /// cannot elect a single leader.
    pub fn new(client: kube::Client, config: LeaseConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(LeaderElection {
            api: Api::namespaced(client, &config.namespace),
            config,
            metrics: Metrics::default(),
            observed: None,
        })
    }

    /// Registers `lease_leader` (1 while this replica leads), `lease_acquisitions_total`
    /// and `lease_errors_total` in `registry` (give a prefixed sub-registry).
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "lease_leader",
            "1 while this replica holds the lease and may write",
            self.metrics.leader.clone(),
        );
        registry.register(
            "lease_acquisitions",
            "Times this replica acquired the lease",
            self.metrics.acquisitions.clone(),
        );
        registry.register(
            "lease_errors",
            "Lease reads or writes that failed (the replica retries)",
            self.metrics.errors.clone(),
        );
    }

    /// Starts the election loop. It runs until `shutdown` is cancelled, then releases the
    /// Lease if it holds it. The handle answers [`LeaderHandle::is_leader`].
    pub fn spawn(self, shutdown: CancellationToken) -> (LeaderHandle, JoinHandle<()>) {
        let (tx, rx) = watch::channel(LeaseStatus::default());
        let task = tokio::spawn(self.run(tx, shutdown));
        (
            LeaderHandle {
                rx,
                unconditional: false,
            },
            task,
        )
    }

    async fn run(mut self, tx: watch::Sender<LeaseStatus>, shutdown: CancellationToken) {
        let lease = format!("{}/{}", self.config.namespace, self.config.name);
        let mut was_leader = false;
        loop {
            let sent_at = Instant::now();
            let outcome = tokio::select! {
                () = shutdown.cancelled() => break,
                outcome = self.try_acquire_or_renew() => outcome,
            };
            match outcome {
                Ok(Outcome::Held { transitions }) => {
                    if !was_leader {
                        info!(lease = %lease, identity = %self.config.identity, "acquired the lease; now the leader");
                        self.metrics.acquisitions.inc();
                    }
                    was_leader = true;
                    self.metrics.leader.set(1);
                    tx.send_replace(LeaseStatus {
                        holder: Some(self.config.identity.clone()),
                        held: true,
                        transitions,
                        valid_until: Some(sent_at + self.config.renew_deadline),
                    });
                }
                Ok(Outcome::Other {
                    holder,
                    transitions,
                }) => {
                    if was_leader {
                        warn!(lease = %lease, holder = ?holder, "lost the lease; stopped acting as leader");
                    } else {
                        debug!(lease = %lease, holder = ?holder, "lease held by another replica");
                    }
                    was_leader = false;
                    self.metrics.leader.set(0);
                    tx.send_replace(LeaseStatus {
                        holder,
                        held: false,
                        transitions,
                        valid_until: None,
                    });
                }
                Err(err) => {
                    // Keep the deadline as it is: it runs out by itself if renewals keep
                    // failing, and the handle then answers "not leader".
                    self.metrics.errors.inc();
                    warn!(lease = %lease, error = %err, "could not read or renew the lease; retrying");
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(self.config.retry_period) => {}
            }
        }
        self.metrics.leader.set(0);
        let held = tx.borrow().held;
        tx.send_replace(LeaseStatus::default());
        if held {
            match self.release().await {
                Ok(()) => info!(lease = %lease, "released the lease"),
                Err(err) => {
                    warn!(lease = %lease, error = %err, "could not release the lease; a standby takes over when it expires")
                }
            }
        }
    }

    async fn try_acquire_or_renew(&mut self) -> Result<Outcome, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.config.identity.clone()),
                    lease_duration_seconds: Some(self.config.duration_seconds()),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Outcome::Held { transitions: 0 }),
                Err(err) if is_status(&err, 409) => Ok(Outcome::Other {
                    holder: None,
                    transitions: 0,
                }),
                Err(err) => Err(err),
            };
        };

        let rv = lease.metadata.resource_version.clone().unwrap_or_default();
        let seen_at = match &self.observed {
            Some((seen_rv, at)) if *seen_rv == rv => *at,
            _ => {
                let at = Instant::now();
                self.observed = Some((rv, at));
                at
            }
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let transitions = spec.lease_transitions.unwrap_or(0);
        let mine = holder.as_deref() == Some(self.config.identity.as_str());
        if !mine {
            let duration = u64::try_from(spec.lease_duration_seconds.unwrap_or(0))
                .unwrap_or(0)
                .max(1);
            let expired = holder.is_none() || seen_at.elapsed() >= Duration::from_secs(duration);
            if !expired {
                return Ok(Outcome::Other {
                    holder,
                    transitions,
                });
            }
            spec.holder_identity = Some(self.config.identity.clone());
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(transitions.saturating_add(1));
        }
        spec.lease_duration_seconds = Some(self.config.duration_seconds());
        spec.renew_time = Some(now);
        let transitions = spec.lease_transitions.unwrap_or(0);
        // The object carries the resourceVersion it was read at: a concurrent writer wins
        // with a 409 and this replica stays (or becomes) a follower.
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                if let Some(rv) = written.metadata.resource_version {
                    self.observed = Some((rv, Instant::now()));
                }
                Ok(Outcome::Held { transitions })
            }
            Err(err) if is_status(&err, 409) => Ok(Outcome::Other {
                holder,
                transitions,
            }),
            Err(err) => Err(err),
        }
    }

    async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.config.name).await? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            // Someone else wrote it since: it is not ours to release any more.
            Err(err) if is_status(&err, 409) => Ok(()),
            Err(err) => Err(err),
        }
    }
}

fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_must_order_retry_renew_duration() {
        let ok = LeaseConfig::new("kube-system", "x", "me");
        assert!(ok.validate().is_ok());
        let bad = ok.clone().with_timings(
            Duration::from_secs(5),
            Duration::from_secs(5),
            Duration::from_secs(1),
        );
        let err = bad.validate().unwrap_err().to_string();
        assert!(err.contains("kube-system/x"), "{err}");
        let empty = LeaseConfig::new("kube-system", "x", "");
        assert!(matches!(
            empty.validate(),
            Err(ConfigError::EmptyIdentity { .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn always_is_leader_and_a_lapsed_deadline_is_not() {
        assert!(LeaderHandle::always().is_leader());
        let (tx, rx) = watch::channel(LeaseStatus {
            holder: Some("me".into()),
            held: true,
            transitions: 1,
            valid_until: Some(Instant::now() + Duration::from_secs(10)),
        });
        let handle = LeaderHandle {
            rx,
            unconditional: false,
        };
        assert!(handle.is_leader());
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(
            !handle.is_leader(),
            "a holder past its renew deadline must stop writing"
        );
        drop(tx);
    }
}
