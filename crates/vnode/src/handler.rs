//! The pod lifecycle handler of one provider: create, delete and look up a pod's
//! instance, keeping the in-memory map of which claim has which instance.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::core::v1::Pod;

use crate::claim::{claim_name, provision_request};
use crate::compact::{ClaimKey, SmallStr};
use crate::crash::{self, CrashHook, CrashPoint};
use crate::metrics::Metrics;
use crate::provider::{Instance, Provider, ProviderError, UpdateRequest};

/// What the handler keeps per tracked claim.
#[derive(Clone, Debug)]
struct Entry {
    /// The provider's instance id.
    id: SmallStr,
    /// The epoch it was recorded in.
    epoch: u64,
    /// Whether the pod's connect Secret is known to exist (or the provider issues none).
    secret: bool,
}

/// Why [`Handler::get`] has no instance to give.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// The provider answered and holds no instance for this pod's claim.
    #[error("no instance for claim {claim}")]
    NotFound {
        /// The claim asked about.
        claim: String,
    },
    /// The provider could not be asked, so whether an instance exists is unknown. The
    /// caller must neither create (there may be one) nor terminate-and-forget (there may
    /// be one we cannot see): requeue. `claim` is the placeholder "pod" this outcome
    /// carries alongside the error.
    #[error("cannot tell whether claim {claim} has an instance")]
    Unknown {
        /// The claim asked about.
        claim: String,
        /// Why the provider could not be asked.
        #[source]
        source: ProviderError,
    },
    /// The pod has no UID (not stored yet) or no container.
    #[error("pod {0} has no UID or no container, so it has no claim")]
    NoClaim(String),
}

/// What a handler knows of a pod by name ([`Handler::pod_instance`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodInstance {
    /// The handler has not seen this pod (another node's, or not synced yet).
    NotTracked,
    /// The pod is this handler's, but its instance is not provisioned (yet).
    NoInstance,
    /// The pod's instance.
    Instance(String),
}

/// What [`Handler::get`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// The claim.
    pub claim: String,
    /// The provider's id of the instance.
    pub instance_id: String,
    /// Whether this lookup rebuilt the entry from the provider's list (a re-adoption).
    pub readopted: bool,
}

/// Why [`Handler::delete`] did not finish.
#[derive(Debug, thiserror::Error)]
pub enum DeleteError {
    /// Ownership unknown: nothing was terminated; retry later.
    #[error("cannot delete the instance of pod {pod} while the provider cannot be asked")]
    Unknown {
        /// `namespace/name`.
        pod: String,
        /// Why.
        #[source]
        source: ProviderError,
    },
    /// Terminate failed.
    #[error("terminating instance {instance} of pod {pod}")]
    Terminate {
        /// `namespace/name`.
        pod: String,
        /// The instance.
        instance: String,
        /// Why.
        #[source]
        source: ProviderError,
    },
}

/// The lifecycle handler of one provider. Shared (`Arc`) between the pod controller's
/// workers and its notify loop.
pub struct Handler {
    provider: Arc<dyn Provider>,
    /// claim -> instance id. The claim includes the pod UID, so an old and a new pod of
    /// the same name never share an entry.
    /// Each entry carries the epoch it was recorded in, so the notify loop can tell an
    /// instance recorded after its list was taken from one that vanished.
    /// Claims are kept as their hash bytes and ids inline ([`ClaimKey`], [`SmallStr`]):
    /// with thousands of pods every byte of an entry counts.
    tracked: Mutex<HashMap<ClaimKey, Entry>>,
    epoch: std::sync::atomic::AtomicU64,
    /// Claims whose instance is being updated.
    updating: Mutex<std::collections::HashSet<ClaimKey>>,
    /// Claims this handler provisioned whose pod does not say so yet (its applied-spec
    /// annotation not written), with the fingerprint of the spec they were provisioned
    /// from: when that write fails, the retry records it instead of taking the pod for
    /// changed and pushing the same spec again as an update. Only pods in that window
    /// have an entry.
    provisioned: Mutex<HashMap<ClaimKey, SmallStr>>,
    /// `namespace/name` -> claim of every pod this handler has looked up or created: the
    /// kubelet API only has the pod's name, and the claim needs its UID.
    names: Mutex<HashMap<SmallStr, ClaimKey>>,
    /// The provider's instances as listed once after start (the cold map), consumed as
    /// pods are re-adopted; `None` until a list succeeded.
    cold: tokio::sync::Mutex<Option<HashMap<String, Instance>>>,
    crash: Option<CrashHook>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Handler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handler")
            .field("provider", &self.provider.name())
            .field("tracked", &self.tracked_len())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Handler {
    /// A handler for `provider`. `crash` is a test hook run at each [`CrashPoint`].
    pub fn new(
        provider: Arc<dyn Provider>,
        metrics: Arc<Metrics>,
        crash: Option<CrashHook>,
    ) -> Handler {
        Handler {
            provider,
            tracked: Mutex::default(),
            names: Mutex::default(),
            cold: tokio::sync::Mutex::new(None),
            epoch: std::sync::atomic::AtomicU64::new(0),
            updating: Mutex::default(),
            provisioned: Mutex::default(),
            crash,
            metrics,
        }
    }

    /// The provider.
    pub fn provider(&self) -> &Arc<dyn Provider> {
        &self.provider
    }

    /// How many claims are tracked.
    pub fn tracked_len(&self) -> usize {
        lock(&self.tracked).len()
    }

    /// The instance id tracked for `claim`, if any.
    pub fn tracked(&self, claim: &str) -> Option<String> {
        lock(&self.tracked)
            .get(&ClaimKey::new(claim))
            .map(|e| e.id.to_string())
    }

    /// Notes that `claim` was provisioned from the spec whose fingerprint is
    /// `fingerprint`, until [`Handler::provisioned_recorded`] says the pod carries it.
    pub fn provisioned_from(&self, claim: &str, fingerprint: &str) {
        lock(&self.provisioned).insert(ClaimKey::new(claim), SmallStr::from(fingerprint));
    }

    /// The fingerprint `claim` was provisioned from, while its pod does not record it.
    pub fn provisioned_spec(&self, claim: &str) -> Option<String> {
        lock(&self.provisioned)
            .get(&ClaimKey::new(claim))
            .map(|f| f.as_str().to_string())
    }

    /// The pod of `claim` records what its instance was given: nothing to remember.
    pub fn provisioned_recorded(&self, claim: &str) {
        let mut provisioned = lock(&self.provisioned);
        if !provisioned.is_empty() {
            provisioned.remove(&ClaimKey::new(claim));
        }
    }

    /// The current epoch: entries recorded from now on carry a larger one.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The instance id tracked for `claim` and the epoch it was recorded in.
    pub fn tracked_with_epoch(&self, claim: &str) -> Option<(String, u64)> {
        self.tracked_key(&ClaimKey::new(claim))
            .map(|(id, epoch)| (id.to_string(), epoch))
    }

    /// [`Handler::tracked_with_epoch`] by claim key, the id as kept (no allocation for a
    /// short one).
    pub(crate) fn tracked_key(&self, claim: &ClaimKey) -> Option<(SmallStr, u64)> {
        lock(&self.tracked)
            .get(claim)
            .map(|e| (e.id.clone(), e.epoch))
    }

    fn record(&self, claim: &str, id: &str) {
        let epoch = self.epoch.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let claim = ClaimKey::new(claim);
        let mut tracked = lock(&self.tracked);
        // The same instance recorded again (an update that kept its id) keeps what is
        // known of its Secret.
        let secret = tracked
            .get(&claim)
            .is_some_and(|e| e.id.as_str() == id && e.secret);
        tracked.insert(
            claim,
            Entry {
                id: SmallStr::new(id),
                epoch,
                secret,
            },
        );
    }

    /// Whether the connect Secret of `claim` is known to be written (or not needed).
    pub fn secret_written(&self, claim: &str) -> bool {
        lock(&self.tracked)
            .get(&ClaimKey::new(claim))
            .is_some_and(|e| e.secret)
    }

    /// Notes that the connect Secret of `claim`'s instance `id` exists (or is not needed),
    /// so it is not looked at again while this manager runs.
    pub fn mark_secret_written(&self, claim: &str, id: &str) {
        if let Some(e) = lock(&self.tracked).get_mut(&ClaimKey::new(claim))
            && e.id.as_str() == id
        {
            e.secret = true;
        }
    }

    /// Pushes a change of the pod's mutable fields to its instance `instance_id`, and
    /// records the instance id the provider answers (a change may replace the instance,
    /// as the process provider's restart on an image change does).
    pub async fn update(
        &self,
        instance_id: &str,
        req: &UpdateRequest,
    ) -> Result<Instance, ProviderError> {
        // While the provider works on it the instance may be briefly absent from its list
        // (a restart between two processes): the notify loop must not take that for a
        // vanished instance.
        let key = ClaimKey::new(&req.claim);
        lock(&self.updating).insert(key.clone());
        let result = self.provider.update(instance_id, req).await;
        if let Ok(instance) = &result {
            // Recorded again even with the same id: the new epoch makes the notify loop
            // ignore lists taken while the update ran.
            self.record(&req.claim, &instance.id);
        }
        lock(&self.updating).remove(&key);
        let instance = result.inspect_err(|e| {
            if !matches!(e, ProviderError::Unsupported(_)) {
                Metrics::inc(&self.metrics.provider_errors);
            }
        })?;
        Metrics::inc(&self.metrics.updates);
        Ok(instance)
    }

    /// Whether an update of `claim`'s instance is in flight.
    pub fn updating(&self, claim: &str) -> bool {
        self.updating_key(&ClaimKey::new(claim))
    }

    /// [`Handler::updating`] by claim key.
    pub(crate) fn updating_key(&self, claim: &ClaimKey) -> bool {
        lock(&self.updating).contains(claim)
    }

    /// Whether this handler tracks the pod `namespace/name` with this claim: what the
    /// kubelet API asks before serving logs or exec.
    pub fn tracks(&self, pod: &Pod) -> Option<String> {
        claim_name(pod).and_then(|c| self.tracked(&c))
    }

    /// What this handler knows of the pod `namespace/name`, for the kubelet API.
    pub fn pod_instance(&self, namespace: &str, name: &str) -> PodInstance {
        let claim = lock(&self.names)
            .get(format!("{namespace}/{name}").as_str())
            .cloned();
        match claim {
            None => PodInstance::NotTracked,
            Some(claim) => match self.tracked_key(&claim) {
                Some((id, _)) => PodInstance::Instance(id.to_string()),
                None => PodInstance::NoInstance,
            },
        }
    }

    /// `(namespace, name)` of every pod this handler knows by name.
    pub fn pod_names(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = lock(&self.names)
            .keys()
            .filter_map(|k| k.split_once('/'))
            .map(|(n, p)| (n.to_string(), p.to_string()))
            .collect();
        out.sort();
        out
    }

    fn remember_name(&self, pod: &Pod, claim: &str) {
        lock(&self.names).insert(
            SmallStr::from(crate::claim::pod_key(pod)),
            ClaimKey::new(claim),
        );
    }

    fn forget_name(&self, claim: &ClaimKey) {
        lock(&self.names).retain(|_, c| c != claim);
    }

    pub(crate) async fn crash_at(&self, point: CrashPoint) {
        crash::at(&self.crash, point).await;
    }

    /// Loads the cold map from the provider's list if it is not loaded yet.
    async fn ensure_cold(&self) -> Result<(), ProviderError> {
        let mut cold = self.cold.lock().await;
        if cold.is_none() {
            let listed = self.provider.list().await.inspect_err(|_| {
                Metrics::inc(&self.metrics.provider_errors);
            })?;
            *cold = Some(listed.into_iter().map(|i| (i.claim.clone(), i)).collect());
        }
        Ok(())
    }

    /// The instances the provider listed at start that no pod has re-adopted yet:
    /// orphans, once every pod has been looked up. `None` until a list succeeded.
    pub async fn unadopted(&self) -> Option<Vec<Instance>> {
        self.ensure_cold().await.ok()?;
        let cold = self.cold.lock().await;
        let tracked = lock(&self.tracked);
        cold.as_ref().map(|m| {
            m.values()
                .filter(|i| !tracked.contains_key(&ClaimKey::new(&i.claim)))
                .cloned()
                .collect()
        })
    }

    /// The pod's instance: from the map, else re-adopted from the provider's list.
    ///
    /// Three outcomes, kept apart because they have opposite consequences: found (the
    /// entry is rebuilt), [`LookupError::NotFound`] (the provider answered: no instance;
    /// creating one is right), [`LookupError::Unknown`] (the provider could not be asked:
    /// neither create nor terminate).
    pub async fn get(&self, pod: &Pod) -> Result<Found, LookupError> {
        let claim =
            claim_name(pod).ok_or_else(|| LookupError::NoClaim(crate::claim::pod_key(pod)))?;
        self.remember_name(pod, &claim);
        if let Some(id) = self.tracked(&claim) {
            return Ok(Found {
                claim,
                instance_id: id,
                readopted: false,
            });
        }
        if let Err(source) = self.ensure_cold().await {
            return Err(LookupError::Unknown { claim, source });
        }
        let mut cold = self.cold.lock().await;
        let hit = cold.as_mut().and_then(|m| m.remove(&claim));
        drop(cold);
        match hit {
            Some(instance) => {
                self.record(&claim, &instance.id);
                Metrics::inc(&self.metrics.readoptions);
                Ok(Found {
                    claim,
                    instance_id: instance.id,
                    readopted: true,
                })
            }
            None => Err(LookupError::NotFound { claim }),
        }
    }

    /// Provisions the pod's instance (idempotent on its claim) and records the instance id
    /// before answering, so an instance that exists is always reachable for teardown.
    pub async fn create(&self, pod: &Pod) -> Result<Instance, ProviderError> {
        let req = provision_request(pod).ok_or_else(|| ProviderError::Failed {
            operation: "provision",
            reason: format!(
                "pod {} has no UID or no container to run",
                crate::claim::pod_key(pod)
            ),
        })?;
        self.remember_name(pod, &req.claim);
        self.crash_at(CrashPoint::BeforeProvision).await;
        let instance = self.provider.provision(&req).await.inspect_err(|_| {
            Metrics::inc(&self.metrics.provider_errors);
        })?;
        self.record(&req.claim, &instance.id);
        Metrics::inc(&self.metrics.provisions);
        self.crash_at(CrashPoint::AfterProvision).await;
        Ok(instance)
    }

    /// Terminates the pod's instance, if it has one, and stops tracking it. Safe to repeat.
    pub async fn delete(&self, pod: &Pod) -> Result<(), DeleteError> {
        let key = crate::claim::pod_key(pod);
        let found = match self.get(pod).await {
            Ok(found) => found,
            Err(LookupError::NotFound { .. } | LookupError::NoClaim(_)) => return Ok(()),
            Err(LookupError::Unknown { source, .. }) => {
                return Err(DeleteError::Unknown { pod: key, source });
            }
        };
        self.terminate_claim(&key, &found.claim, &found.instance_id)
            .await
    }

    /// Terminates `instance` of `claim` and forgets it.
    pub async fn terminate_claim(
        &self,
        pod: &str,
        claim: &str,
        instance: &str,
    ) -> Result<(), DeleteError> {
        let key = ClaimKey::new(claim);
        // While the provider works on it the instance may already be gone from its list
        // while the claim is still tracked: the notify loop must not take that for a
        // vanished instance (a pod failed for its deadline would be reported vanished).
        lock(&self.updating).insert(key.clone());
        let result = self.provider.terminate(instance).await;
        if result.is_err() {
            lock(&self.updating).remove(&key);
        }
        result.map_err(|source| {
            Metrics::inc(&self.metrics.provider_errors);
            DeleteError::Terminate {
                pod: pod.to_string(),
                instance: instance.to_string(),
                source,
            }
        })?;
        lock(&self.tracked).remove(&key);
        lock(&self.updating).remove(&key);
        lock(&self.provisioned).remove(&key);
        self.forget_name(&key);
        if let Some(m) = self.cold.lock().await.as_mut() {
            m.remove(claim);
        }
        Metrics::inc(&self.metrics.terminations);
        Ok(())
    }

    /// Stops tracking a claim without touching its instance.
    pub fn forget(&self, claim: &str) {
        let key = ClaimKey::new(claim);
        lock(&self.tracked).remove(&key);
        lock(&self.provisioned).remove(&key);
        self.forget_name(&key);
    }
}
