//! What the runners did, as prometheus-client metrics (the binary serves them on its admin
//! listener, names prefixed `vnode_`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Label set of the per-phase pod gauge.
pub type PhaseLabels = Vec<(String, String)>;

/// What one manager did, across its providers. Clones share the same metrics.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// Instances provisioned (a provision call that answered an instance).
    pub provisions: Counter,
    /// Instances terminated.
    pub terminations: Counter,
    /// Pods re-adopted from the provider's list after a restart or failover.
    pub readoptions: Counter,
    /// Provider calls that failed (refusals, unreachable, failures).
    pub provider_errors: Counter,
    /// Pods placed on a provider (gate removed).
    pub placements: Counter,
    /// Pod status writes (the steady-state goal is none).
    pub status_writes: Counter,
    /// Pod metadata writes (instance id, endpoint).
    pub metadata_writes: Counter,
    /// Changes of pods' mutable fields applied by the provider.
    pub updates: Counter,
    /// Changes of pods' mutable fields the provider could not apply.
    pub updates_refused: Counter,
    /// Connect Secrets written.
    pub connect_secrets: Counter,
    /// Pods failed for outliving `spec.activeDeadlineSeconds` (reason `DeadlineExceeded`).
    pub deadlines_exceeded: Counter,
    /// Pods on the virtual nodes by phase (`phase` label).
    pub pods: Family<PhaseLabels, Gauge>,
    /// Provider runners currently leading (holding their lease, or not elected).
    pub leases_held: Gauge,
}

impl Metrics {
    pub(crate) fn inc(counter: &Counter) {
        counter.inc();
    }

    /// Reads a counter.
    pub fn get(counter: &Counter) -> u64 {
        counter.get()
    }

    /// Sets the pod gauge of `phase`.
    pub fn set_pods(&self, phase: &str, n: i64) {
        self.pods
            .get_or_create(&vec![("phase".to_string(), phase.to_string())])
            .set(n);
    }

    /// Registers every metric under the `vnode` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("vnode");
        r.register(
            "provisions",
            "Instances provisioned",
            self.provisions.clone(),
        );
        r.register(
            "terminations",
            "Instances terminated",
            self.terminations.clone(),
        );
        r.register(
            "readoptions",
            "Pods re-adopted from a provider's list after a restart or failover",
            self.readoptions.clone(),
        );
        r.register(
            "provider_errors",
            "Provider calls that failed",
            self.provider_errors.clone(),
        );
        r.register(
            "placements",
            "Pods placed on a provider",
            self.placements.clone(),
        );
        r.register(
            "pod_status_writes",
            "Pod status writes",
            self.status_writes.clone(),
        );
        r.register(
            "pod_metadata_writes",
            "Pod metadata writes (instance id, endpoint)",
            self.metadata_writes.clone(),
        );
        r.register(
            "updates",
            "Changes of pods' mutable fields applied by the provider",
            self.updates.clone(),
        );
        r.register(
            "updates_refused",
            "Changes of pods' mutable fields the provider could not apply",
            self.updates_refused.clone(),
        );
        r.register(
            "connect_secrets",
            "Connect Secrets written",
            self.connect_secrets.clone(),
        );
        r.register(
            "deadlines_exceeded",
            "Pods failed for outliving spec.activeDeadlineSeconds",
            self.deadlines_exceeded.clone(),
        );
        r.register(
            "pods",
            "Pods on the virtual nodes, by phase",
            self.pods.clone(),
        );
        r.register(
            "leases_held",
            "Provider runners currently leading",
            self.leases_held.clone(),
        );
    }
}
