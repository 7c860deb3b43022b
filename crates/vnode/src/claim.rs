//! Identity derived from the Pod: the claim an instance is tagged with, and the names of
//! objects owned by a pod.

use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use sha2::{Digest, Sha256};

use crate::provider::{ProvisionRequest, UpdateRequest};

/// Prefix of every claim tag.
pub const CLAIM_PREFIX: &str = "nebula-";

/// The claim of a pod: a short, stable tag derived from its namespace, name and UID.
///
/// The UID is part of it on purpose: a pod deleted and re-created under the same name is a
/// different claim, so the new pod never adopts (nor is terminated with) the old pod's
/// instance. The tag is a hash so it fits every provider's tag alphabet and length limit
/// (lowercase hex, 31 characters). `None` when the pod has no UID yet (not stored).
pub fn claim_name(pod: &Pod) -> Option<String> {
    let meta = &pod.metadata;
    let uid = meta.uid.as_deref().filter(|u| !u.is_empty())?;
    Some(claim_for(
        meta.namespace.as_deref().unwrap_or("default"),
        meta.name.as_deref().unwrap_or(""),
        uid,
    ))
}

/// [`claim_name`] from its parts.
pub fn claim_for(namespace: &str, name: &str, uid: &str) -> String {
    format!(
        "{CLAIM_PREFIX}{}",
        hex::encode(claim_hash(namespace, name, uid))
    )
}

/// The 12 hash bytes a claim shows as 24 hex digits.
pub(crate) fn claim_hash(namespace: &str, name: &str, uid: &str) -> [u8; 12] {
    let mut h = Sha256::new();
    // Separators that cannot appear in names keep ("a","b/c") and ("a/b","c") apart.
    h.update(namespace.as_bytes());
    h.update([0]);
    h.update(name.as_bytes());
    h.update([0]);
    h.update(uid.as_bytes());
    let digest = h.finalize();
    let mut out = [0u8; 12];
    out.copy_from_slice(&digest[..12]);
    out
}

/// Name of the Secret holding a pod's connect credential: `<pod>-connect`.
pub fn connect_secret_name(pod_name: &str) -> String {
    format!("{pod_name}-connect")
}

/// The connect Secret of `pod` holding `data`, owned by the pod (controller reference), so
/// the garbage collector deletes it with the pod. `None` when the pod has no UID.
pub fn connect_secret(
    pod: &Pod,
    data: std::collections::BTreeMap<String, String>,
) -> Option<Secret> {
    let name = pod.metadata.name.clone()?;
    let uid = pod.metadata.uid.clone()?;
    Some(Secret {
        metadata: ObjectMeta {
            name: Some(connect_secret_name(&name)),
            namespace: pod.metadata.namespace.clone(),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".to_string(),
                kind: "Pod".to_string(),
                name,
                uid,
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        string_data: Some(data),
        type_: Some("Opaque".to_string()),
        ..Secret::default()
    })
}

/// `namespace/name` of a pod, the key everything is tracked under.
pub fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// The provisioning request for `pod`: its first container's shape and the capacity type
/// placement chose. `None` when the pod has no UID or no container.
pub fn provision_request(pod: &Pod) -> Option<ProvisionRequest> {
    let claim = claim_name(pod)?;
    let spec = pod.spec.as_ref()?;
    let c = spec.containers.first()?;
    let env = c
        .env
        .iter()
        .flatten()
        .filter_map(|e| e.value.as_ref().map(|v| (e.name.clone(), v.clone())))
        .collect();
    Some(ProvisionRequest {
        claim,
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        pod_name: pod.metadata.name.clone().unwrap_or_default(),
        image: c.image.clone().unwrap_or_default(),
        command: c.command.clone().unwrap_or_default(),
        args: c.args.clone().unwrap_or_default(),
        env,
        working_dir: c.working_dir.clone(),
        capacity_type: pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(common::keys::CAPACITY_TYPE_ANNOTATION).cloned()),
        stdin: c.stdin.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        container: c.name.clone(),
        pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
    })
}

/// The mutable fields of `pod` ([`UpdateRequest`]): what a change pushed to its instance
/// carries. `None` when the pod has no UID or no container.
pub fn update_request(pod: &Pod) -> Option<UpdateRequest> {
    let claim = claim_name(pod)?;
    let spec = pod.spec.as_ref()?;
    let c = spec.containers.first()?;
    Some(update_request_of(
        claim,
        &pod.metadata,
        c.image.as_deref(),
        spec.active_deadline_seconds,
        spec.tolerations.as_deref(),
    ))
}

/// [`update_request`] from the parts it reads (the slim decode of a pod has them too).
pub(crate) fn update_request_of(
    claim: String,
    meta: &ObjectMeta,
    image: Option<&str>,
    active_deadline_seconds: Option<i64>,
    tolerations: Option<&[k8s_openapi::api::core::v1::Toleration]>,
) -> UpdateRequest {
    let own = format!("{}/", common::keys::DOMAIN);
    UpdateRequest {
        claim,
        labels: meta.labels.clone().unwrap_or_default(),
        annotations: meta
            .annotations
            .iter()
            .flatten()
            .filter(|(k, _)| !k.starts_with(&own))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        image: image.unwrap_or_default().to_string(),
        active_deadline_seconds,
        tolerations: tolerations
            .iter()
            .copied()
            .flatten()
            .map(|t| {
                let mut s = t.key.clone().unwrap_or_default();
                match (t.operator.as_deref(), &t.value) {
                    (Some("Exists"), _) => s.push_str(":Exists"),
                    (_, Some(v)) => {
                        s.push('=');
                        s.push_str(v);
                    }
                    _ => {}
                }
                s.push(':');
                s.push_str(t.effect.as_deref().unwrap_or(""));
                if let Some(secs) = t.toleration_seconds {
                    s.push_str(&format!(" for {secs}s"));
                }
                s
            })
            .collect(),
    }
}

/// A short fingerprint of an [`UpdateRequest`] (16 hex digits of a SHA-256 over its JSON):
/// what the `applied-spec` annotation records, so "changed since it was applied" is one
/// string comparison.
pub fn spec_fingerprint(req: &UpdateRequest) -> String {
    let bytes = serde_json::to_vec(req).unwrap_or_default();
    hex::encode(&Sha256::digest(&bytes)[..8])
}

/// [`spec_fingerprint`] of `pod`'s mutable fields; `None` without UID or container.
pub fn pod_spec_fingerprint(pod: &Pod) -> Option<String> {
    update_request(pod).map(|r| spec_fingerprint(&r))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, uid: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some(ns.into());
        p.metadata.name = Some(name.into());
        p.metadata.uid = Some(uid.into());
        p
    }

    #[test]
    fn recreated_pod_is_another_claim() {
        let a = claim_name(&pod("ns", "web", "uid-1")).unwrap();
        let b = claim_name(&pod("ns", "web", "uid-2")).unwrap();
        assert_ne!(a, b);
        assert_eq!(a, claim_name(&pod("ns", "web", "uid-1")).unwrap());
        assert!(a.starts_with(CLAIM_PREFIX) && a.len() == CLAIM_PREFIX.len() + 24);
    }

    #[test]
    fn parts_do_not_run_together() {
        assert_ne!(claim_for("a", "bc", "u"), claim_for("ab", "c", "u"));
    }

    #[test]
    fn no_uid_no_claim() {
        let mut p = pod("ns", "web", "");
        assert_eq!(claim_name(&p), None);
        p.metadata.uid = None;
        assert_eq!(claim_name(&p), None);
    }

    #[test]
    fn fingerprint_follows_mutable_fields_and_ignores_own_annotations() {
        let mut p = pod("ns", "web", "u1");
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            containers: vec![k8s_openapi::api::core::v1::Container {
                name: "main".into(),
                image: Some("a:1".into()),
                ..Default::default()
            }],
            ..Default::default()
        });
        let base = pod_spec_fingerprint(&p).unwrap();
        assert_eq!(base.len(), 16);
        p.metadata.annotations = Some(
            [(
                common::keys::INSTANCE_ID_ANNOTATION.to_string(),
                "i".to_string(),
            )]
            .into(),
        );
        assert_eq!(pod_spec_fingerprint(&p).unwrap(), base);
        p.metadata.labels = Some([("tier".to_string(), "web".to_string())].into());
        let labelled = pod_spec_fingerprint(&p).unwrap();
        assert_ne!(labelled, base);
        if let Some(spec) = p.spec.as_mut() {
            spec.containers[0].image = Some("a:2".into());
        }
        assert_ne!(pod_spec_fingerprint(&p).unwrap(), labelled);
        let req = update_request(&p).unwrap();
        assert_eq!(req.image, "a:2");
        assert_eq!(req.labels.get("tier").map(String::as_str), Some("web"));
        assert!(req.annotations.is_empty());
    }

    #[test]
    fn connect_secret_is_owned_by_the_pod() {
        let s = connect_secret(&pod("ns", "web", "u1"), Default::default()).unwrap();
        assert_eq!(s.metadata.name.as_deref(), Some("web-connect"));
        let owner = &s.metadata.owner_references.unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Pod", "u1"));
    }
}
