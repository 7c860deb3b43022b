//! The pod controller's stored form of a pod: only what it reads, decoded straight from
//! the watch (serde skips every other field), so a tracked pod costs a few hundred bytes
//! instead of a whole `k8s_openapi` `Pod` (whose struct alone is kilobytes, set or not).

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, PodSpec, PodStatus, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::NamespaceResourceScope;
use serde::Deserialize;

/// A pod as the pod controller stores it.
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct SlimPod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<SlimSpec>,
    #[serde(default)]
    pub status: Option<PodStatus>,
}

/// The parts of a pod's spec the controller reads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SlimSpec {
    #[serde(default)]
    pub node_name: Option<String>,
    #[serde(default)]
    pub containers: Vec<SlimContainer>,
    /// Read for the mutable-fields fingerprint, then dropped.
    #[serde(default)]
    pub active_deadline_seconds: Option<i64>,
    /// Read for the mutable-fields fingerprint, then dropped.
    #[serde(default)]
    pub tolerations: Option<Vec<Toleration>>,
}

/// The first container's shape (what a provision request carries).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SlimContainer {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub command: Option<Vec<String>>,
    #[serde(default)]
    pub args: Option<Vec<String>>,
    #[serde(default)]
    pub env: Option<Vec<EnvVar>>,
    #[serde(default)]
    pub working_dir: Option<String>,
    /// The provider keeps a stdin open for these (attach -i).
    #[serde(default)]
    pub stdin: Option<bool>,
    /// The provider runs these on a terminal (attach -t, exec resize).
    #[serde(default)]
    pub tty: Option<bool>,
}

impl kube::Resource for SlimPod {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("Pod")
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("")
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("pods")
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl SlimPod {
    /// A `Pod` holding what this one holds, for the functions written against `Pod`
    /// (claims, provision requests, status comparisons). Built per use, dropped after.
    pub fn to_pod(&self) -> Pod {
        Pod {
            metadata: self.metadata.clone(),
            spec: self.spec.as_ref().map(|s| PodSpec {
                node_name: s.node_name.clone(),
                active_deadline_seconds: s.active_deadline_seconds,
                tolerations: s.tolerations.clone(),
                containers: s
                    .containers
                    .iter()
                    .map(|c| Container {
                        name: c.name.clone(),
                        image: c.image.clone(),
                        command: c.command.clone(),
                        args: c.args.clone(),
                        env: c.env.clone(),
                        working_dir: c.working_dir.clone(),
                        stdin: c.stdin,
                        tty: c.tty,
                        ..Container::default()
                    })
                    .collect(),
                ..PodSpec::default()
            }),
            status: self.status.clone(),
        }
    }

    /// Keeps only what the controller reads: the identity and version, this crate's
    /// annotations plus the fingerprint of the mutable fields (computed here, before the
    /// labels, annotations and tolerations it covers are dropped), the first container and
    /// the status fields it compares.
    pub fn prune(&mut self, own: &[&str], desired_key: &str) {
        let desired = crate::claim::pod_spec_fingerprint(&self.to_pod());
        let meta = &mut self.metadata;
        meta.managed_fields = None;
        meta.labels = None;
        meta.owner_references = None;
        meta.finalizers = None;
        meta.generate_name = None;
        meta.creation_timestamp = None;
        let mut kept: BTreeMap<String, String> = meta
            .annotations
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| own.contains(&k.as_str()))
            .collect();
        if let Some(fp) = desired {
            kept.insert(desired_key.to_string(), fp);
        }
        meta.annotations = (!kept.is_empty()).then_some(kept);
        if let Some(spec) = self.spec.as_mut() {
            spec.containers.truncate(1);
            spec.containers.shrink_to_fit();
            spec.tolerations = None;
            spec.active_deadline_seconds = None;
        }
        if let Some(st) = self.status.as_mut() {
            st.host_ip = None;
            st.host_ips = None;
            st.pod_ips = None;
            st.init_container_statuses = None;
            st.ephemeral_container_statuses = None;
            st.resource_claim_statuses = None;
            if let Some(cs) = st.conditions.as_mut() {
                // Only the conditions this crate writes lose their details: others are
                // carried over as they are when the status is rewritten.
                for c in cs
                    .iter_mut()
                    .filter(|c| crate::status::OWNED_CONDITIONS.contains(&c.type_.as_str()))
                {
                    c.last_probe_time = None;
                    c.message = None;
                }
            }
        }
    }
}
