//! An in-memory provider for tests and benchmarks, with fault injection: latency,
//! refusals, an unreachable `list`, a failing health check, updates it cannot apply and a
//! crash point between creating an instance and answering.
//!
//! Each instance gets a random connect token at creation ([`Provider::connect_credential`]
//! answers it with the instance's endpoint), and every [`Provider::update`] is recorded
//! ([`MemoryProvider::updates`]); an update changes nothing else of the instance.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;

use crate::compact::ClaimKey;
use crate::crash::{CrashHook, CrashPoint};
use crate::provider::{
    BlockScope, Capabilities, ConnectCredential, Instance, InstanceState, Provider, ProviderError,
    ProvisionRequest, UpdateRequest,
};

/// Faults currently injected. Change them at any time through [`MemoryProvider::faults`].
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Added to every call.
    pub latency: Duration,
    /// Every provision is refused with this scope.
    pub refuse: Option<BlockScope>,
    /// Provisions asking for these capacity types are refused (scope: that type).
    pub refuse_capacity_types: Vec<String>,
    /// `list`, `status`, `provision` and `terminate` answer `Unreachable`.
    pub unreachable: bool,
    /// `health` fails.
    pub unhealthy: bool,
    /// `update` answers [`ProviderError::Unsupported`] (a provider that cannot apply
    /// changes to a running instance).
    pub update_unsupported: bool,
    /// `update` answers [`ProviderError::Failed`] with this reason.
    pub update_fails: Option<String>,
}

/// Counters of what was asked, for assertions.
#[derive(Debug, Default)]
pub struct Calls {
    /// Instances created (not idempotent answers).
    pub created: AtomicU64,
    /// Instances terminated (not idempotent answers).
    pub terminated: AtomicU64,
    /// `list` calls.
    pub lists: AtomicU64,
    /// `provision` calls, including idempotent ones and refusals.
    pub provisions: AtomicU64,
    /// `update` calls, including refused ones.
    pub updates: AtomicU64,
    /// `connect_credential` calls.
    pub credentials: AtomicU64,
}

/// The started time every instance reports once Running.
const STARTED_AT: &str = "2026-01-01T00:00:00Z";

/// One instance, kept small (benchmarks hold thousands): its id is `mem-<n>`, its
/// endpoint derives from the id, it has no IP, and its token is 16 random bytes.
#[derive(Clone, Debug)]
struct Record {
    n: u64,
    state: InstanceState,
    /// Reports [`STARTED_AT`].
    started: bool,
    token: [u8; 16],
}

#[derive(Default)]
struct State {
    /// claim -> instance
    instances: HashMap<ClaimKey, Record>,
    /// Every update applied, in order: (instance id, request).
    updates: Vec<(String, UpdateRequest)>,
    next_id: u64,
}

impl State {
    /// The claim and record of the instance `id`.
    fn find(&self, id: &str) -> Option<(&ClaimKey, &Record)> {
        let n = id_number(id)?;
        self.instances.iter().find(|(_, r)| r.n == n)
    }
}

/// `n` of an id `mem-<n>` as this provider writes it (no sign, no leading zero), so
/// comparing numbers is comparing ids.
fn id_number(id: &str) -> Option<u64> {
    let digits = id.strip_prefix("mem-")?;
    let n: u64 = digits.parse().ok()?;
    (n.to_string() == digits).then_some(n)
}

/// The in-memory provider. Clones share state, so a test can keep one handle to inspect
/// what a manager (or two) did, and hand another to a restarted manager: the instances
/// outlive the manager, as a cloud's would.
#[derive(Clone)]
pub struct MemoryProvider {
    name: String,
    caps: Capabilities,
    state: Arc<Mutex<State>>,
    faults: Arc<Mutex<Faults>>,
    crash: Arc<Mutex<Option<CrashHook>>>,
    /// Newly created instances start Pending and become Running on the next status read.
    instant_running: Arc<AtomicBool>,
    /// Issue connect credentials (on by default).
    credentials: bool,
    /// What was asked.
    pub calls: Arc<Calls>,
}

impl std::fmt::Debug for MemoryProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryProvider")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl MemoryProvider {
    /// A provider called `name` polling every `poll_interval`.
    pub fn new(name: impl Into<String>, poll_interval: Duration) -> MemoryProvider {
        MemoryProvider {
            name: name.into(),
            caps: Capabilities {
                poll_interval,
                capacity_types: vec!["on-demand".into(), "spot".into()],
                ..Capabilities::default()
            },
            state: Arc::default(),
            faults: Arc::default(),
            crash: Arc::default(),
            instant_running: Arc::new(AtomicBool::new(true)),
            credentials: true,
            calls: Arc::default(),
        }
    }

    /// A provider that issues no connect credentials (so no connect Secrets are written):
    /// the trait's default behaviour.
    pub fn without_credentials(mut self) -> MemoryProvider {
        self.credentials = false;
        self
    }

    /// The injected faults, to change.
    pub fn faults(&self) -> MutexGuard<'_, Faults> {
        lock(&self.faults)
    }

    /// Installs a hook run at [`CrashPoint::ProviderCreated`]: after the instance exists,
    /// before `provision` answers.
    pub fn set_crash_hook(&self, hook: Option<CrashHook>) {
        *lock(&self.crash) = hook;
    }

    /// A snapshot of the instances, live and finished.
    pub fn instances(&self) -> Vec<Instance> {
        lock(&self.state)
            .instances
            .iter()
            .map(|(c, r)| self.instance(c, r))
            .collect()
    }

    /// The instance a record stands for.
    fn instance(&self, claim: &ClaimKey, r: &Record) -> Instance {
        let id = format!("mem-{}", r.n);
        Instance {
            endpoint: Some(format!("{id}.{}.invalid:22", self.name)),
            id,
            claim: claim.to_string(),
            state: r.state.clone(),
            ip: None,
            started_at: r.started.then(|| STARTED_AT.to_string()),
            // An update changes nothing of a memory instance, so it never restarts.
            restart_count: 0,
        }
    }

    /// Every update applied so far, in order, as (instance id, request).
    pub fn updates(&self) -> Vec<(String, UpdateRequest)> {
        lock(&self.state).updates.clone()
    }

    /// The connect token of the instance of `claim`, if it exists.
    pub fn token(&self, claim: &str) -> Option<String> {
        lock(&self.state)
            .instances
            .get(&ClaimKey::new(claim))
            .map(|r| hex::encode(r.token))
    }

    /// Makes an instance vanish behind the manager's back (a VM deleted in the console).
    pub fn vanish(&self, claim: &str) -> bool {
        lock(&self.state)
            .instances
            .remove(&ClaimKey::new(claim))
            .is_some()
    }

    /// Sets an instance's state (for example an exit).
    pub fn set_state(&self, claim: &str, state: InstanceState) {
        if let Some(r) = lock(&self.state).instances.get_mut(&ClaimKey::new(claim)) {
            r.state = state;
        }
    }

    async fn delay(&self) -> Result<(), ProviderError> {
        let (latency, unreachable) = {
            let f = lock(&self.faults);
            (f.latency, f.unreachable)
        };
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        if unreachable {
            return Err(ProviderError::Unreachable {
                reason: format!("in-memory provider {} is set unreachable", self.name),
            });
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Provider for MemoryProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> Capabilities {
        self.caps.clone()
    }

    fn provision<'a>(
        &'a self,
        req: &'a ProvisionRequest,
    ) -> BoxFuture<'a, Result<Instance, ProviderError>> {
        async move {
            self.calls.provisions.fetch_add(1, Ordering::Relaxed);
            self.delay().await?;
            {
                let f = lock(&self.faults);
                if let Some(scope) = &f.refuse {
                    return Err(ProviderError::Refused {
                        scope: scope.clone(),
                        reason: "injected refusal".into(),
                    });
                }
                if let Some(ct) = &req.capacity_type
                    && f.refuse_capacity_types.contains(ct)
                {
                    return Err(ProviderError::Refused {
                        scope: BlockScope::CapacityType(ct.clone()),
                        reason: format!("no {ct} capacity (injected)"),
                    });
                }
            }
            let instance = {
                let mut st = lock(&self.state);
                let claim = ClaimKey::new(&req.claim);
                if let Some(existing) = st.instances.get(&claim) {
                    return Ok(self.instance(&claim, existing));
                }
                st.next_id += 1;
                let mut token = [0u8; 16];
                rand::RngCore::fill_bytes(&mut rand::rng(), &mut token);
                let record = Record {
                    n: st.next_id,
                    state: InstanceState::Pending,
                    started: false,
                    token,
                };
                let instance = self.instance(&claim, &record);
                st.instances.insert(claim, record);
                instance
            };
            self.calls.created.fetch_add(1, Ordering::Relaxed);
            let hook = lock(&self.crash).clone();
            crate::crash::at(&hook, CrashPoint::ProviderCreated).await;
            Ok(instance)
        }
        .boxed()
    }

    fn terminate<'a>(&'a self, instance_id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        async move {
            self.delay().await?;
            let mut st = lock(&self.state);
            let claim = st.find(instance_id).map(|(c, _)| c.clone());
            if let Some(claim) = claim {
                st.instances.remove(&claim);
                self.calls.terminated.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }
        .boxed()
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Instance>, ProviderError>> {
        async move {
            self.calls.lists.fetch_add(1, Ordering::Relaxed);
            self.delay().await?;
            let running = self.instant_running.load(Ordering::Relaxed);
            let mut st = lock(&self.state);
            Ok(st
                .instances
                .iter_mut()
                .map(|(c, r)| {
                    if running && r.state == InstanceState::Pending {
                        r.state = InstanceState::Running;
                        r.started = true;
                    }
                    self.instance(c, r)
                })
                .collect())
        }
        .boxed()
    }

    fn status<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Instance>, ProviderError>> {
        async move {
            self.delay().await?;
            let st = lock(&self.state);
            Ok(st.find(instance_id).map(|(c, r)| self.instance(c, r)))
        }
        .boxed()
    }

    fn update<'a>(
        &'a self,
        instance_id: &'a str,
        req: &'a UpdateRequest,
    ) -> BoxFuture<'a, Result<Instance, ProviderError>> {
        async move {
            self.calls.updates.fetch_add(1, Ordering::Relaxed);
            self.delay().await?;
            {
                let f = lock(&self.faults);
                if f.update_unsupported {
                    return Err(ProviderError::Unsupported(
                        "changing a running instance (injected)",
                    ));
                }
                if let Some(reason) = &f.update_fails {
                    return Err(ProviderError::Failed {
                        operation: "update",
                        reason: reason.clone(),
                    });
                }
            }
            let mut st = lock(&self.state);
            let instance = st
                .find(instance_id)
                .map(|(c, r)| self.instance(c, r))
                .ok_or_else(|| ProviderError::NotFound(instance_id.to_string()))?;
            st.updates.push((instance_id.to_string(), req.clone()));
            Ok(instance)
        }
        .boxed()
    }

    fn connect_credential<'a>(
        &'a self,
        instance_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<ConnectCredential>, ProviderError>> {
        async move {
            self.calls.credentials.fetch_add(1, Ordering::Relaxed);
            self.delay().await?;
            if !self.credentials {
                return Ok(None);
            }
            let st = lock(&self.state);
            let instance = st
                .find(instance_id)
                .map(|(c, r)| (self.instance(c, r), hex::encode(r.token)))
                .ok_or_else(|| ProviderError::NotFound(instance_id.to_string()));
            drop(st);
            let (instance, token) = instance?;
            Ok(Some(
                ConnectCredential::new()
                    .with("endpoint", instance.endpoint.unwrap_or_default())
                    .with("token", token),
            ))
        }
        .boxed()
    }

    fn health(&self) -> BoxFuture<'_, Result<(), ProviderError>> {
        async move {
            if lock(&self.faults).unhealthy {
                return Err(ProviderError::Unreachable {
                    reason: "in-memory provider is set unhealthy".into(),
                });
            }
            Ok(())
        }
        .boxed()
    }
}
