//! The pod controller of one provider: watches the pods bound to its node, provisions and
//! terminates their instances through the [`Handler`], and runs the notify loop that
//! writes instance metadata and status.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Event as KEvent, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::blocklist::Blocklist;
use crate::claim::{claim_name, pod_key};
use crate::crash::CrashPoint;
use crate::handler::{DeleteError, Handler, LookupError};
use crate::metrics::Metrics;
use crate::provider::{Instance, ProviderError};
use crate::status::{self, Observed};

/// How long a refusing provider (or capacity type) is skipped by placement.
pub const DEFAULT_BLOCK_TTL: Duration = Duration::from_secs(300);
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
}

struct Ctx {
    client: Client,
    handler: Arc<Handler>,
    store: Store<Pod>,
    queue: crate::queue::Queue,
    cfg: PodControllerConfig,
    metrics: Arc<Metrics>,
    recorder: Option<Recorder>,
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
    let api: Api<Pod> = Api::all(client.clone());
    let (store, writer) = reflector::store();
    let watch = watcher::watcher(
        api,
        watcher::Config::default().fields(&format!("spec.nodeName={node}")),
    )
    .default_backoff()
    .modify(prune);
    let recorder = cfg.events.then(|| {
        Recorder::new(
            client.clone(),
            Reporter {
                controller: "nebula-manager".into(),
                instance: Some(node.clone()),
            },
        )
    });
    let ctx = Arc::new(Ctx {
        client,
        handler,
        store,
        queue: crate::queue::Queue::new(),
        cfg,
        metrics,
        recorder,
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
    let mut events = std::pin::pin!(reflector::reflector(writer, watch));
    loop {
        let ev = tokio::select! {
            _ = cancel.cancelled() => break,
            ev = events.next() => ev,
        };
        match ev {
            Some(Ok(Event::Apply(pod) | Event::InitApply(pod))) => ctx.queue.add(&pod_key(&pod)),
            Some(Ok(Event::Delete(pod))) => {
                // Gone from the API (our final delete, or a force delete): an instance
                // still tracked for it must not outlive it.
                let ctx = ctx.clone();
                tasks.spawn(async move {
                    if let Some(claim) = claim_name(&pod)
                        && let Some(id) = ctx.handler.tracked(&claim)
                        && let Err(e) = ctx
                            .handler
                            .terminate_claim(&pod_key(&pod), &claim, &id)
                            .await
                    {
                        warn!(error = %crate::chain(&e), "terminating the instance of a deleted pod failed; the orphan sweep retries");
                    }
                });
            }
            Some(Ok(Event::Init | Event::InitDone)) => {}
            Some(Err(e)) => warn!(node = %node, error = %e, "pod watch failed; retrying"),
            None => break,
        }
    }
    cancel.cancel();
    while tasks.join_next().await.is_some() {}
}

/// Keeps only what the controller reads, so each tracked pod costs little memory: the
/// identity and version, this crate's annotations, the first container's shape and the
/// status fields it compares. (Re-gating reads the full pod from the API.)
fn prune(pod: &mut Pod) {
    let meta = &mut pod.metadata;
    meta.managed_fields = None;
    meta.labels = None;
    meta.owner_references = None;
    meta.finalizers = None;
    meta.generate_name = None;
    meta.creation_timestamp = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.retain(|k, _| {
            k == common::keys::INSTANCE_ID_ANNOTATION
                || k == common::keys::ENDPOINT_ANNOTATION
                || k == common::keys::CAPACITY_TYPE_ANNOTATION
        });
    }
    if let Some(spec) = pod.spec.as_mut() {
        let first =
            spec.containers
                .drain(..)
                .next()
                .map(|c| k8s_openapi::api::core::v1::Container {
                    name: c.name,
                    image: c.image,
                    command: c.command,
                    args: c.args,
                    env: c.env,
                    working_dir: c.working_dir,
                    // The provider keeps a stdin open / runs a terminal for these.
                    stdin: c.stdin,
                    tty: c.tty,
                    ..Default::default()
                });
        *spec = k8s_openapi::api::core::v1::PodSpec {
            containers: first.into_iter().collect(),
            node_name: spec.node_name.take(),
            ..Default::default()
        };
    }
    if let Some(st) = pod.status.as_mut() {
        st.host_ip = None;
        st.host_ips = None;
        st.pod_ips = None;
        st.init_container_statuses = None;
        st.ephemeral_container_statuses = None;
        st.resource_claim_statuses = None;
        if let Some(cs) = st.conditions.as_mut() {
            for c in cs {
                c.last_probe_time = None;
                c.message = None;
            }
        }
    }
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

fn is_conflict(e: &SyncError) -> bool {
    matches!(e, SyncError::Api { source: kube::Error::Api(s), .. } if s.code == 409)
}

async fn reconcile(ctx: &Ctx, key: &str) -> Result<(), SyncError> {
    let Some((ns, name)) = key.split_once('/') else {
        return Ok(());
    };
    let Some(pod) = ctx.store.get(&ObjectRef::new(name).within(ns)) else {
        return Ok(());
    };
    let pod = (*pod).clone();
    if pod.metadata.deletion_timestamp.is_some() {
        return delete_pod(ctx, &pod).await;
    }
    if status::is_terminal(&pod) {
        return Ok(());
    }
    match ctx.handler.get(&pod).await {
        Ok(found) => {
            if found.readopted {
                info!(instance = %found.instance_id, "pod re-adopted from the provider's list");
                publish(
                    ctx,
                    &pod,
                    "Readopted",
                    format!("re-adopted instance {}", found.instance_id),
                )
                .await;
            }
            if let Ok(Some(instance)) = ctx.handler.provider().status(&found.instance_id).await {
                write_observed(ctx, &pod, &Observed::Instance(&instance)).await?;
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
                write_observed(ctx, &pod, &Observed::Vanished).await?;
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
                "Provisioned",
                format!("provisioned instance {} on {provider}", instance.id),
            )
            .await;
            write_observed(ctx, pod, &Observed::Instance(&instance)).await
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
            write_observed(ctx, pod, &Observed::ProvisionFailed(&reason)).await
        }
        Err(e) => {
            warn!(error = %e, "provisioning failed; retrying");
            ctx.queue.add_after(&pod_key(pod), ctx.poll, &ctx.cancel);
            Ok(())
        }
    }
}

/// Writes the instance's metadata first, then its status, each with the resourceVersion
/// it read; nothing when the pod already says it.
async fn write_observed(ctx: &Ctx, pod: &Pod, observed: &Observed<'_>) -> Result<(), SyncError> {
    let api = pods_api(&ctx.client, pod);
    let name = pod.metadata.name.clone().unwrap_or_default();
    let mut current = pod.clone();
    if let Observed::Instance(instance) = observed
        && let Some(patch) = status::metadata_patch(&current, instance)
    {
        current = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(api_err("annotating", pod))?;
        Metrics::inc(&ctx.metrics.metadata_writes);
        ctx.handler.crash_at(CrashPoint::AfterMetadata).await;
    }
    if let Some(patch) = status::status_patch(&current, observed, Timestamp::now()) {
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(api_err("writing the status of", pod))?;
        Metrics::inc(&ctx.metrics.status_writes);
    }
    Ok(())
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

async fn publish(ctx: &Ctx, pod: &Pod, reason: &str, note: String) {
    let Some(recorder) = &ctx.recorder else {
        return;
    };
    let ev = KEvent {
        type_: EventType::Normal,
        reason: reason.into(),
        note: Some(note),
        action: reason.into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, &pod.object_ref(&())).await {
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
        if ctx.store.wait_until_ready().await.is_err() {
            return;
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
        let by_claim: HashMap<&str, &Instance> =
            listed.iter().map(|i| (i.claim.as_str(), i)).collect();
        let pods = ctx.store.state();
        let mut live_claims = HashSet::new();
        let mut phases = [0i64; 4];
        let mut writes: Vec<(Arc<Pod>, Option<&Instance>)> = Vec::new();
        for pod in &pods {
            let Some(claim) = claim_name(pod) else {
                continue;
            };
            live_claims.insert(claim.clone());
            match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
                Some("Running") => phases[1] += 1,
                Some("Succeeded") => phases[2] += 1,
                Some("Failed") => phases[3] += 1,
                _ => phases[0] += 1,
            }
            if pod.metadata.deletion_timestamp.is_some() || status::is_terminal(pod) {
                continue;
            }
            let Some((id, recorded)) = ctx.handler.tracked_with_epoch(&claim) else {
                ctx.queue.add(&pod_key(pod));
                continue;
            };
            match by_claim.get(claim.as_str()) {
                Some(instance) if instance.id == id => {
                    // Only pods whose status would change are written (steady state: none).
                    let observed = Observed::Instance(instance);
                    if status::metadata_patch(pod, instance).is_some()
                        || status::status_patch(pod, &observed, Timestamp::now()).is_some()
                    {
                        writes.push((pod.clone(), Some(*instance)));
                    }
                }
                _ if recorded > epoch => {}
                _ => {
                    warn!(node = %ctx.node, pod = %pod_key(pod), instance = %id, "instance vanished: marking the pod Failed");
                    ctx.handler.forget(&claim);
                    writes.push((pod.clone(), None));
                }
            }
        }
        // Writes of different pods go out concurrently; each pod's own writes stay ordered
        // (metadata, then status).
        futures::stream::iter(writes)
            .for_each_concurrent(NOTIFY_CONCURRENCY, |(pod, instance)| {
                let ctx = &ctx;
                async move {
                    let observed = match instance {
                        Some(i) => Observed::Instance(i),
                        None => Observed::Vanished,
                    };
                    if let Err(e) = write_observed(ctx, &pod, &observed).await
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
            if !live_claims.contains(&instance.claim) {
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
