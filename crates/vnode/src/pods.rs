//! The pod controller of one provider: watches the pods bound to its node, provisions and
//! terminates their instances through the [`Handler`], fails pods that outlive their
//! `activeDeadlineSeconds` (one timer per pod), and runs the notify loop that writes
//! instance metadata and status.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, PodCondition, Secret, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::blocklist::Blocklist;
use crate::claim::{claim_name, connect_secret, connect_secret_name, pod_key, update_request};
use crate::compact::ClaimKey;
use crate::crash::CrashPoint;
use crate::events::EventType;
use crate::handler::{DeleteError, Handler, LookupError};
use crate::metrics::Metrics;
use crate::provider::{Instance, InstanceState, ProviderError};
use crate::slim::{PodRecord, PodStore, SlimPod};
use crate::status::{self, Deadline, Observed};

/// How long a refusing provider (or capacity type) is skipped by placement.
pub const DEFAULT_BLOCK_TTL: Duration = Duration::from_secs(300);
/// Pod condition reporting whether the last change of the pod's mutable fields reached
/// its instance (`False` with reason `UpdateUnsupported` or `UpdateFailed` when the
/// provider could not apply it).
pub const SPEC_APPLIED_CONDITION: &str = "outpost.dhnt.io/SpecApplied";
/// The stored copy of a pod carries the fingerprint of its mutable fields under this key
/// (in the `Pod` built from it), computed while decoding, before the labels and
/// annotations it covers are dropped. Never written to the API.
pub(crate) const DESIRED_SPEC_KEY: &str = "outpost.dhnt.io/desired-spec";
const WORKERS: usize = 32;
const NOTIFY_CONCURRENCY: usize = 16;

/// Settings of a pod controller.
#[derive(Clone)]
pub struct PodControllerConfig {
    /// The shared blocklist refusals are recorded in.
    pub blocklist: Arc<Blocklist>,
    /// How long a refusal blocks.
    pub block_ttl: Duration,
    /// Publish Kubernetes Events for provisioned and re-adopted pods.
    pub events: bool,
}

impl Default for PodControllerConfig {
    fn default() -> Self {
        PodControllerConfig {
            blocklist: Arc::new(Blocklist::new()),
            block_ttl: DEFAULT_BLOCK_TTL,
            events: true,
        }
    }
}

/// Errors the pod controller logs and retries on.
#[derive(Debug, thiserror::Error)]
enum SyncError {
    #[error("{what} pod {pod}")]
    Api {
        what: &'static str,
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Delete(#[from] DeleteError),
    #[error("asking the provider for the connect credential of pod {pod}")]
    Credential {
        pod: String,
        #[source]
        source: ProviderError,
    },
}

struct Ctx {
    client: Client,
    handler: Arc<Handler>,
    store: PodStore,
    queue: crate::queue::Queue,
    deadlines: DeadlineTimers,
    cfg: PodControllerConfig,
    metrics: Arc<Metrics>,
    events: Option<crate::events::Publisher>,
    node: String,
    poll: Duration,
    cancel: CancellationToken,
}

/// Runs the pod controller for `handler`'s provider until `cancel` fires.
pub async fn run_pods(
    client: Client,
    handler: Arc<Handler>,
    metrics: Arc<Metrics>,
    cfg: PodControllerConfig,
    cancel: CancellationToken,
) {
    let provider = handler.provider().clone();
    let node = common::keys::virtual_node_name(provider.name());
    let poll = provider.capabilities().poll_interval;
    // Decoded as SlimPod: the fields the controller never reads are skipped while parsing.
    let api: Api<SlimPod> = Api::all(client.clone());
    let watch = watcher::watcher(
        api,
        watcher::Config::default().fields(&format!("spec.nodeName={node}")),
    )
    .default_backoff();
    let events = cfg
        .events
        .then(|| crate::events::Publisher::new(client.clone(), "nebula-manager", &node));
    let ctx = Arc::new(Ctx {
        client,
        handler,
        store: PodStore::new(),
        queue: crate::queue::Queue::new(),
        deadlines: DeadlineTimers::default(),
        cfg,
        metrics,
        events,
        node: node.clone(),
        poll,
        cancel: cancel.clone(),
    });
    // A JoinSet aborts its tasks when dropped: dropping this future stops everything at
    // once, which is what a crash does (the crash-safety tests rely on it).
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..WORKERS {
        let ctx = ctx.clone();
        tasks.spawn(async move {
            loop {
                let key = tokio::select! {
                    _ = ctx.cancel.cancelled() => return,
                    k = ctx.queue.next() => match k { Some(k) => k, None => return },
                };
                let span = info_span!("pod", node = %ctx.node, pod = %key);
                if let Err(e) = reconcile(&ctx, &key).instrument(span).await {
                    if is_conflict(&e) {
                        // Someone wrote the pod since we read it; its newer version is on
                        // the way through the watch.
                        debug!(node = %ctx.node, pod = %key, "write conflict; re-reading");
                        ctx.queue.add_after(&key, Duration::from_millis(50), &ctx.cancel);
                        ctx.queue.done(&key);
                        continue;
                    }
                    warn!(node = %ctx.node, pod = %key, error = %crate::chain(&e), "pod sync failed; retrying");
                    ctx.queue.add_after(&key, ctx.poll, &ctx.cancel);
                }
                ctx.queue.done(&key);
            }
        });
    }
    tasks.spawn(notify_loop(ctx.clone()));
    let mut events = std::pin::pin!(watch);
    loop {
        let ev = tokio::select! {
            _ = cancel.cancelled() => break,
            ev = events.next() => ev,
        };
        // As kube's reflector does: the store changes first, then the key is queued.
        match ev {
            Some(Ok(Event::Apply(pod))) => {
                let rec = Arc::new(PodRecord::new(pod));
                ctx.store.apply(rec.clone());
                ctx.queue.add(rec.key());
            }
            Some(Ok(Event::InitApply(pod))) => {
                let rec = Arc::new(PodRecord::new(pod));
                ctx.store.list_item(rec.clone());
                ctx.queue.add(rec.key());
            }
            Some(Ok(Event::Init)) => ctx.store.list_start(),
            Some(Ok(Event::InitDone)) => ctx.store.list_done(),
            Some(Ok(Event::Delete(pod))) => {
                let rec = PodRecord::new(pod);
                ctx.store.remove(rec.key());
                // Gone from the API (our final delete, or a force delete): an instance
                // still tracked for it must not outlive it.
                let ctx = ctx.clone();
                tasks.spawn(async move {
                    if let Some(claim) = rec.claim().map(ClaimKey::to_string)
                        && let Some(id) = ctx.handler.tracked(&claim)
                        && let Err(e) = ctx
                            .handler
                            .terminate_claim(rec.key(), &claim, &id)
                            .await
                    {
                        warn!(error = %crate::chain(&e), "terminating the instance of a deleted pod failed; the orphan sweep retries");
                    }
                });
            }
            Some(Err(e)) => warn!(node = %node, error = %e, "pod watch failed; retrying"),
            None => break,
        }
    }
    cancel.cancel();
    while tasks.join_next().await.is_some() {}
}

fn pods_api(client: &Client, pod: &Pod) -> Api<Pod> {
    Api::namespaced(
        client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
    )
}

fn api_err(what: &'static str, pod: &Pod) -> impl FnOnce(kube::Error) -> SyncError {
    let pod = pod_key(pod);
    move |source| SyncError::Api { what, pod, source }
}

/// One merge patch of `pod`'s status, counted as a status write; `what` names it in the
/// error.
async fn write_status(
    ctx: &Ctx,
    pod: &Pod,
    patch: &serde_json::Value,
    what: &'static str,
) -> Result<(), SyncError> {
    pods_api(&ctx.client, pod)
        .patch_status(
            pod.metadata.name.as_deref().unwrap_or_default(),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
        .map_err(api_err(what, pod))?;
    Metrics::inc(&ctx.metrics.status_writes);
    Ok(())
}

fn is_conflict(e: &SyncError) -> bool {
    matches!(e, SyncError::Api { source: kube::Error::Api(s), .. } if s.code == 409)
}

async fn reconcile(ctx: &Ctx, key: &str) -> Result<(), SyncError> {
    let Some(pod) = ctx.store.get(key) else {
        return Ok(());
    };
    let pod = pod.to_pod();
    if pod.metadata.deletion_timestamp.is_some() {
        return delete_pod(ctx, &pod).await;
    }
    if status::is_terminal(&pod) {
        return Ok(());
    }
    // Before anything else: a pod past its deadline is not to be created, updated or
    // reported vanished, only failed (also right after a restart, when the deadline
    // passed while no manager ran).
    match status::active_deadline(
        pod.status.as_ref().and_then(|s| s.start_time.as_ref()),
        pod.spec.as_ref().and_then(|s| s.active_deadline_seconds),
        Timestamp::now(),
    ) {
        Deadline::Passed => return fail_past_deadline(ctx, &pod).await,
        Deadline::In(left) => ctx.deadlines.wake(ctx, key, left),
        Deadline::None => {}
    }
    match ctx.handler.get(&pod).await {
        Ok(found) => {
            if found.readopted {
                info!(instance = %found.instance_id, "pod re-adopted from the provider's list");
                publish(
                    ctx,
                    &pod,
                    EventType::Normal,
                    "Readopted",
                    format!("re-adopted instance {}", found.instance_id),
                )
                .await;
            }
            let annotations = pod.metadata.annotations.as_ref();
            let desired = annotations.and_then(|a| a.get(DESIRED_SPEC_KEY));
            let applied = annotations
                .and_then(|a| a.get(common::keys::APPLIED_SPEC_ANNOTATION))
                .cloned();
            // Provisioned here, but the write that records it failed: record it now.
            let provisioned = match &applied {
                None => ctx.handler.provisioned_spec(&found.claim),
                Some(_) => {
                    ctx.handler.provisioned_recorded(&found.claim);
                    None
                }
            };
            if let Ok(Some(instance)) = ctx.handler.provider().status(&found.instance_id).await {
                write_observed(
                    ctx,
                    &pod,
                    &Observed::Instance(&instance),
                    provisioned.as_deref(),
                )
                .await?;
                if provisioned.is_some() {
                    ctx.handler.provisioned_recorded(&found.claim);
                }
            }
            let applied = applied.or(provisioned);
            if desired.is_some() && desired != applied.as_ref() {
                push_update(ctx, &pod, &found.instance_id).await?;
            }
            Ok(())
        }
        Err(LookupError::NotFound { .. }) => {
            let had_instance = pod
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(common::keys::INSTANCE_ID_ANNOTATION));
            if had_instance {
                warn!(
                    "the pod's instance no longer exists at the provider: marking the pod Failed"
                );
                write_observed(ctx, &pod, &Observed::Vanished, None).await?;
                return Ok(());
            }
            create_pod(ctx, &pod).await
        }
        Err(LookupError::Unknown { source, .. }) => {
            warn!(error = %source, "provider unreachable: neither creating nor terminating; retrying");
            ctx.queue.add_after(key, ctx.poll, &ctx.cancel);
            Ok(())
        }
        Err(LookupError::NoClaim(_)) => Ok(()),
    }
}

async fn create_pod(ctx: &Ctx, pod: &Pod) -> Result<(), SyncError> {
    let provider = ctx.handler.provider().name().to_string();
    match ctx.handler.create(pod).await {
        Ok(instance) => {
            info!(instance = %instance.id, "instance provisioned");
            publish(
                ctx,
                pod,
                EventType::Normal,
                "Provisioned",
                format!("provisioned instance {} on {provider}", instance.id),
            )
            .await;
            // What was provisioned is this snapshot's mutable fields: recorded with the
            // instance id, so only a later change is pushed as an update.
            let applied = annotation(pod, DESIRED_SPEC_KEY).map(str::to_string);
            if let (Some(claim), Some(fp)) = (claim_name(pod), applied.as_deref()) {
                ctx.handler.provisioned_from(&claim, fp);
            }
            write_observed(ctx, pod, &Observed::Instance(&instance), applied.as_deref()).await
        }
        Err(ProviderError::Refused { scope, reason }) => {
            info!(%reason, ?scope, "provider refused the pod: blocking it and re-gating the pod for the next candidate");
            ctx.cfg
                .blocklist
                .record(&provider, scope, ctx.cfg.block_ttl);
            regate(ctx, pod).await
        }
        Err(ProviderError::Failed {
            operation: "provision",
            reason,
        }) => {
            warn!(%reason, "provisioning failed for good: marking the pod Failed");
            write_observed(ctx, pod, &Observed::ProvisionFailed(&reason), None).await
        }
        Err(e) => {
            warn!(error = %e, "provisioning failed; retrying");
            ctx.queue.add_after(&pod_key(pod), ctx.poll, &ctx.cancel);
            Ok(())
        }
    }
}

/// The kubelet's active-deadline handling: a pod that outlived `activeDeadlineSeconds`,
/// counted from its `status.startTime`, has its instance terminated and is reported
/// Failed with reason `DeadlineExceeded`, whatever its restartPolicy. The instance goes
/// first: a Failed pod is never looked at again, so an instance left behind it would
/// leak. Repeating it is safe (a crash between the two finds no instance, and the status
/// is written only when the pod does not say it yet), and the Event and the metric follow
/// the one status write that succeeded.
async fn fail_past_deadline(ctx: &Ctx, pod: &Pod) -> Result<(), SyncError> {
    let key = pod_key(pod);
    match ctx.handler.get(pod).await {
        Ok(found) => {
            info!(instance = %found.instance_id, "the pod's active deadline passed: terminating its instance");
            ctx.handler
                .terminate_claim(&key, &found.claim, &found.instance_id)
                .await?;
        }
        Err(LookupError::NotFound { .. } | LookupError::NoClaim(_)) => {}
        Err(LookupError::Unknown { source, .. }) => {
            warn!(error = %crate::chain(&source), "the pod's active deadline passed but the provider is unreachable: the pod is failed once its instance is terminated; retrying");
            ctx.queue.add_after(&key, ctx.poll, &ctx.cancel);
            return Ok(());
        }
    }
    let Some(patch) = status::status_patch(pod, &Observed::DeadlineExceeded, Timestamp::now())
    else {
        return Ok(());
    };
    write_status(ctx, pod, &patch, "failing (deadline exceeded)").await?;
    Metrics::inc(&ctx.metrics.deadlines_exceeded);
    info!("pod failed: its active deadline passed");
    publish(
        ctx,
        pod,
        EventType::Normal,
        status::REASON_DEADLINE_EXCEEDED,
        status::DEADLINE_EXCEEDED_MESSAGE.to_string(),
    )
    .await;
    Ok(())
}

/// When pods' active deadlines pass: one timer per pod for the earliest deadline it was
/// scheduled for, so the reconcile a pod gets on every watch event starts no second timer
/// for the same deadline, and nothing polls every pod every tick. A lowered deadline
/// starts an earlier timer; the later one finds a Failed pod and does nothing.
#[derive(Default)]
struct DeadlineTimers {
    due: Arc<std::sync::Mutex<HashMap<Box<str>, tokio::time::Instant>>>,
}

/// Timers further out than this wake the pod early, and its reconcile schedules the rest.
const LONGEST_TIMER: Duration = Duration::from_secs(24 * 3600);
/// How much later than wanted a pending deadline timer may fire and still be kept.
const TIMER_SLACK: Duration = Duration::from_millis(50);

impl DeadlineTimers {
    /// Queues `key` once `after` has passed (a moment later: the check is against the wall
    /// clock, the timer on the monotonic one, and an early wake only schedules again).
    fn wake(&self, ctx: &Ctx, key: &str, after: Duration) {
        let after = after.min(LONGEST_TIMER) + Duration::from_millis(10);
        let at = tokio::time::Instant::now() + after;
        {
            let mut due = self.due.lock().unwrap_or_else(|p| p.into_inner());
            // The same deadline computed again a little later lands within a few
            // milliseconds of the first (two clocks, whole milliseconds): no second timer.
            if due.get(key).is_some_and(|t| *t <= at + TIMER_SLACK) {
                return;
            }
            due.insert(key.into(), at);
        }
        let key = key.to_string();
        let queue = ctx.queue.clone();
        let cancel = ctx.cancel.clone();
        let due = self.due.clone();
        // Like the queue's delayed adds: a timer that can only queue a key, ended by the
        // controller's cancellation.
        tokio::spawn(async move {
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = tokio::time::sleep_until(at) => {
                    let mut due = due.lock().unwrap_or_else(|p| p.into_inner());
                    if due.get(key.as_str()) == Some(&at) {
                        due.remove(key.as_str());
                    }
                    drop(due);
                    queue.add(&key);
                }
            }
        });
    }
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// Writes the instance's metadata first (with `applied`, the fingerprint of the mutable
/// fields it was given, when set), then its connect Secret if the pod is about to be
/// reported Running, then its status, each write with the resourceVersion it read;
/// nothing when the pod already says it.
async fn write_observed(
    ctx: &Ctx,
    pod: &Pod,
    observed: &Observed<'_>,
    applied: Option<&str>,
) -> Result<(), SyncError> {
    let api = pods_api(&ctx.client, pod);
    let name = pod.metadata.name.clone().unwrap_or_default();
    let mut current = pod.clone();
    if let Observed::Instance(instance) = observed
        && let Some(patch) = status::metadata_patch_applied(&current, instance, applied)
    {
        current = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(api_err("annotating", pod))?;
        Metrics::inc(&ctx.metrics.metadata_writes);
        ctx.handler.crash_at(CrashPoint::AfterMetadata).await;
    }
    if let Observed::Instance(instance) = observed
        && instance.state == InstanceState::Running
    {
        ensure_connect_secret(ctx, &current, instance).await?;
    }
    if let Some(patch) = status::status_patch(&current, observed, Timestamp::now()) {
        write_status(ctx, &current, &patch, "writing the status of").await?;
    }
    Ok(())
}

/// Makes sure the pod's connect Secret holds the credential its instance's provider
/// issues, before the pod is reported Running. Once per instance while this manager runs;
/// after a restart one read finds a Secret written before the crash, so it is created
/// exactly once. The credential is never logged.
async fn ensure_connect_secret(ctx: &Ctx, pod: &Pod, instance: &Instance) -> Result<(), SyncError> {
    let Some(claim) = claim_name(pod) else {
        return Ok(());
    };
    if ctx.handler.secret_written(&claim) {
        return Ok(());
    }
    let key = pod_key(pod);
    let credential = match ctx
        .handler
        .provider()
        .connect_credential(&instance.id)
        .await
    {
        Ok(Some(c)) => c,
        Ok(None) => {
            ctx.handler.mark_secret_written(&claim, &instance.id);
            return Ok(());
        }
        Err(source) => {
            Metrics::inc(&ctx.metrics.provider_errors);
            return Err(SyncError::Credential { pod: key, source });
        }
    };
    let name = connect_secret_name(pod.metadata.name.as_deref().unwrap_or_default());
    let api: Api<Secret> = Api::namespaced(
        ctx.client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
    );
    let owned_by_pod = |s: &Secret| {
        s.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "Pod" && Some(&o.uid) == pod.metadata.uid.as_ref())
    };
    match api
        .get_opt(&name)
        .await
        .map_err(api_err("reading the connect Secret of", pod))?
    {
        Some(existing) if owned_by_pod(&existing) => {
            ctx.handler.mark_secret_written(&claim, &instance.id);
            return Ok(());
        }
        Some(stale) => {
            // An earlier pod of the same name owned it and the garbage collector has not
            // removed it yet: it holds that pod's credential, not this one's.
            info!(secret = %name, "replacing a connect Secret left by an earlier pod of the same name");
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: stale.metadata.uid.clone(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &dp).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(source) => {
                    return Err(SyncError::Api {
                        what: "deleting a stale connect Secret of",
                        pod: key,
                        source,
                    });
                }
            }
        }
        None => {}
    }
    let Some(secret) = connect_secret(pod, credential.values().clone()) else {
        return Ok(());
    };
    api.create(&PostParams::default(), &secret)
        .await
        .map_err(api_err("creating the connect Secret of", pod))?;
    Metrics::inc(&ctx.metrics.connect_secrets);
    ctx.handler.mark_secret_written(&claim, &instance.id);
    ctx.handler.crash_at(CrashPoint::AfterSecret).await;
    Ok(())
}

/// Pushes a change of the pod's mutable fields to its instance, then records it on the
/// pod (`applied-spec`, with the resourceVersion read). A provider that cannot apply it
/// gets the change recorded as handled all the same, with a `SpecApplied=False` condition
/// and a Warning Event saying why: retrying would only repeat the refusal.
async fn push_update(ctx: &Ctx, pruned: &Pod, instance_id: &str) -> Result<(), SyncError> {
    let api = pods_api(&ctx.client, pruned);
    let name = pruned.metadata.name.clone().unwrap_or_default();
    // The store holds a pruned copy without labels and annotations; the request needs them.
    let full = api.get(&name).await.map_err(api_err("reading", pruned))?;
    if full.metadata.uid != pruned.metadata.uid || full.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let Some(req) = update_request(&full) else {
        return Ok(());
    };
    let fp = crate::claim::spec_fingerprint(&req);
    if annotation(&full, common::keys::APPLIED_SPEC_ANNOTATION) == Some(fp.as_str()) {
        // Handled already; the store had not seen that write yet.
        return Ok(());
    }
    let refusal = match ctx.handler.update(instance_id, &req).await {
        Ok(instance) => {
            info!(instance = %instance.id, "change of the pod's mutable fields applied by the provider");
            let patched = match status::metadata_patch_applied(&full, &instance, Some(&fp)) {
                Some(patch) => {
                    let p = api
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .map_err(api_err("recording the applied change of", pruned))?;
                    Metrics::inc(&ctx.metrics.metadata_writes);
                    p
                }
                None => full,
            };
            publish(
                ctx,
                pruned,
                EventType::Normal,
                "Updated",
                format!("applied the pod's changed labels, annotations, image, deadline or tolerations to instance {}", instance.id),
            )
            .await;
            // After an earlier refusal, say that this change went through.
            if has_condition(&patched, SPEC_APPLIED_CONDITION) {
                write_spec_condition(
                    ctx,
                    &patched,
                    true,
                    "Applied",
                    "the last change reached the instance",
                )
                .await?;
            }
            return Ok(());
        }
        Err(ProviderError::Unreachable { reason }) => {
            warn!(%reason, "provider unreachable: the pod's change is not applied yet; retrying");
            ctx.queue.add_after(&pod_key(pruned), ctx.poll, &ctx.cancel);
            return Ok(());
        }
        Err(ProviderError::Unsupported(what)) => (
            "UpdateUnsupported",
            format!(
                "provider {} does not support {what}: the instance keeps running as provisioned; delete and re-create the pod to apply the change",
                ctx.handler.provider().name()
            ),
        ),
        Err(e) => (
            "UpdateFailed",
            format!(
                "applying the pod's change failed: {}; the instance keeps what it had; change the pod again to retry",
                crate::chain(&e)
            ),
        ),
    };
    let (reason, message) = refusal;
    warn!(reason, %message, "the provider did not apply the pod's change");
    Metrics::inc(&ctx.metrics.updates_refused);
    let patch = serde_json::json!({"metadata": {
        "resourceVersion": full.metadata.resource_version,
        "annotations": {common::keys::APPLIED_SPEC_ANNOTATION: fp},
    }});
    let patched = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(api_err("recording the refused change of", pruned))?;
    Metrics::inc(&ctx.metrics.metadata_writes);
    publish(ctx, pruned, EventType::Warning, reason, message.clone()).await;
    write_spec_condition(ctx, &patched, false, reason, &message).await
}

fn has_condition(pod: &Pod, type_: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == type_))
}

/// Sets the `SpecApplied` condition (the whole list is written: a merge patch replaces
/// lists), with the resourceVersion of `pod`.
async fn write_spec_condition(
    ctx: &Ctx,
    pod: &Pod,
    ok: bool,
    reason: &str,
    message: &str,
) -> Result<(), SyncError> {
    let mut conditions = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    conditions.retain(|c| c.type_ != SPEC_APPLIED_CONDITION);
    conditions.push(PodCondition {
        type_: SPEC_APPLIED_CONDITION.to_string(),
        status: if ok { "True" } else { "False" }.to_string(),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            Timestamp::now(),
        )),
        ..PodCondition::default()
    });
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": pod.metadata.resource_version},
        "status": {"conditions": conditions},
    });
    write_status(ctx, pod, &patch, "writing the SpecApplied condition of").await
}

async fn delete_pod(ctx: &Ctx, pod: &Pod) -> Result<(), SyncError> {
    match ctx.handler.delete(pod).await {
        Ok(()) => {}
        Err(DeleteError::Unknown { source, .. }) => {
            warn!(error = %source, "provider unreachable: the pod's instance is not terminated yet; retrying");
            ctx.queue.add_after(&pod_key(pod), ctx.poll, &ctx.cancel);
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    }
    ctx.handler.crash_at(CrashPoint::AfterTerminate).await;
    final_delete(ctx, pod).await
}

/// The kubelet's last word on a pod: delete with grace 0, only this very pod (UID).
async fn final_delete(ctx: &Ctx, pod: &Pod) -> Result<(), SyncError> {
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match pods_api(&ctx.client, pod)
        .delete(pod.metadata.name.as_deref().unwrap_or_default(), &dp)
        .await
    {
        Ok(_) => Ok(()),
        // Gone already, or a newer pod of the same name (precondition): nothing to do.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(source) => Err(SyncError::Api {
            what: "deleting",
            pod: pod_key(pod),
            source,
        }),
    }
}

/// A refused pod goes back to placement. Gates cannot be added to a stored pod and a
/// bound pod cannot move, so the pod is replaced: deleted (grace 0, UID precondition) and
/// created again with the gate, without this provider's selector and toleration.
async fn regate(ctx: &Ctx, pruned: &Pod) -> Result<(), SyncError> {
    let provider = ctx.handler.provider().name().to_string();
    // The store holds a pruned copy; the replacement needs the whole pod.
    let full = pods_api(&ctx.client, pruned)
        .get(pruned.metadata.name.as_deref().unwrap_or_default())
        .await
        .map_err(api_err("reading", pruned))?;
    if full.metadata.uid != pruned.metadata.uid {
        return Ok(());
    }
    let pod = &full;
    let mut spec = pod.spec.clone().unwrap_or_default();
    spec.node_name = None;
    if let Some(sel) = spec.node_selector.as_mut() {
        sel.remove(common::keys::PROVIDER_LABEL);
    }
    if let Some(tol) = spec.tolerations.as_mut() {
        tol.retain(|t: &Toleration| t.key.as_deref() != Some(common::keys::PROVIDER_TAINT));
    }
    let gates = spec.scheduling_gates.get_or_insert_with(Vec::new);
    if !gates.iter().any(|g| g.name == common::keys::PLACEMENT_GATE) {
        gates.push(k8s_openapi::api::core::v1::PodSchedulingGate {
            name: common::keys::PLACEMENT_GATE.into(),
        });
    }
    let mut annotations = pod.metadata.annotations.clone().unwrap_or_default();
    annotations.remove(common::keys::CAPACITY_TYPE_ANNOTATION);
    annotations.remove(common::keys::INSTANCE_ID_ANNOTATION);
    annotations.remove(common::keys::ENDPOINT_ANNOTATION);
    let replacement = Pod {
        metadata: ObjectMeta {
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            labels: pod.metadata.labels.clone(),
            annotations: Some(annotations),
            owner_references: pod.metadata.owner_references.clone(),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    };
    final_delete(ctx, pod).await?;
    let api = pods_api(&ctx.client, pod);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match api.create(&PostParams::default(), &replacement).await {
            Ok(_) => {
                info!(refused_by = %provider, "pod re-created behind the placement gate");
                return Ok(());
            }
            Err(kube::Error::Api(s)) if s.code == 409 && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(source) => {
                return Err(SyncError::Api {
                    what: "re-creating (gated)",
                    pod: pod_key(pod),
                    source,
                });
            }
        }
    }
}

async fn publish(ctx: &Ctx, pod: &Pod, type_: EventType, reason: &str, note: String) {
    let Some(events) = &ctx.events else {
        return;
    };
    if let Err(e) = events.publish(pod, type_, reason, &note).await {
        debug!(error = %e, "publishing an event failed");
    }
}

/// At the provider's cadence: one `list`, then for every tracked pod write what changed
/// (metadata first, then status), mark pods whose instance vanished Failed, and terminate
/// instances whose pod is gone.
async fn notify_loop(ctx: Arc<Ctx>) {
    let mut tick = tokio::time::interval(ctx.poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ctx.cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        tokio::select! {
            _ = ctx.cancel.cancelled() => return,
            _ = ctx.store.ready() => {}
        }
        // Entries recorded after this point may be missing from the list without having
        // vanished.
        let epoch = ctx.handler.epoch();
        let listed = match ctx.handler.provider().list().await {
            Ok(l) => l,
            Err(e) => {
                Metrics::inc(&ctx.metrics.provider_errors);
                debug!(node = %ctx.node, error = %e, "provider list failed; statuses not refreshed this round");
                continue;
            }
        };
        let by_claim: HashMap<ClaimKey, &Instance> = listed
            .iter()
            .map(|i| (ClaimKey::new(&i.claim), i))
            .collect();
        let pods = ctx.store.snapshot();
        let mut live_claims: HashSet<&ClaimKey> = HashSet::with_capacity(pods.len());
        let mut phases = [0i64; 4];
        // The stored records, compared as they are (no `Pod` is built per pod per tick); at
        // a mass transition (every pod turning Running at once) this list holds every pod.
        let mut writes: Vec<(Arc<PodRecord>, Option<&Instance>)> = Vec::new();
        for rec in &pods {
            let Some(claim) = rec.claim() else {
                continue;
            };
            live_claims.insert(claim);
            match rec.phase() {
                Some("Running") => phases[1] += 1,
                Some("Succeeded") => phases[2] += 1,
                Some("Failed") => phases[3] += 1,
                _ => phases[0] += 1,
            }
            if rec.deleting() || rec.is_terminal() {
                continue;
            }
            let Some((id, recorded)) = ctx.handler.tracked_key(claim) else {
                ctx.queue.add(rec.key());
                continue;
            };
            match by_claim.get(claim) {
                // An update in flight may be restarting the instance: its listed state is
                // about to be stale.
                _ if ctx.handler.updating_key(claim) => {}
                Some(instance) if instance.id == id.as_str() => {
                    // Only pods whose status would change are written (steady state: none).
                    if rec.metadata_stale(instance)
                        || status::status_stale(rec, &Observed::Instance(instance))
                    {
                        writes.push((rec.clone(), Some(*instance)));
                    }
                }
                _ if recorded > epoch => {}
                _ => {
                    warn!(node = %ctx.node, pod = %rec.key(), instance = %id, "instance vanished: marking the pod Failed");
                    ctx.handler.forget(&claim.to_string());
                    writes.push((rec.clone(), None));
                }
            }
        }
        // Writes of different pods go out concurrently; each pod's own writes stay ordered
        // (metadata, then status).
        futures::stream::iter(writes)
            .for_each_concurrent(NOTIFY_CONCURRENCY, |(rec, instance)| {
                let ctx = &ctx;
                async move {
                    let pod = rec.to_pod();
                    let observed = match instance {
                        Some(i) => Observed::Instance(i),
                        None => Observed::Vanished,
                    };
                    if let Err(e) = write_observed(ctx, &pod, &observed, None).await
                        && !is_conflict(&e)
                    {
                        warn!(node = %ctx.node, error = %crate::chain(&e), "status write failed; next round retries");
                    }
                }
            })
            .await;
        for (phase, n) in ["Pending", "Running", "Succeeded", "Failed"]
            .iter()
            .zip(phases)
        {
            ctx.metrics.set_pods(phase, n);
        }
        // Orphans: instances whose pod no longer exists (deleted while no manager ran).
        for instance in &listed {
            if !live_claims.contains(&ClaimKey::new(&instance.claim)) {
                info!(node = %ctx.node, instance = %instance.id, claim = %instance.claim, "terminating an instance whose pod is gone");
                if let Err(e) = ctx
                    .handler
                    .terminate_claim(&instance.claim, &instance.claim, &instance.id)
                    .await
                {
                    warn!(error = %crate::chain(&e), "terminating an orphan failed; next round retries");
                }
            }
        }
    }
}
