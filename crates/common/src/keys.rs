//! The names the project writes into Kubernetes objects, in one place.
//!
//! Every label, annotation, taint, scheduling gate and well-known object name that more
//! than one crate reads or writes lives here, under the project's one domain,
//! `outpost.dhnt.io/`. The crate has no dependencies, so pure cores (derivation, planning,
//! fuzz targets) can use it without the I/O stack.
//!
//! Names fixed by the systems the project reimplements (`k3s.io/...`, `kubernetes.io/...`)
//! stay where the crate that reads them documents them.

/// The project's one domain for labels, annotations and taints.
pub const DOMAIN: &str = "outpost.dhnt.io";

/// Node label carrying a node's runtime kind.
pub const RUNTIME_LABEL: &str = "outpost.dhnt.io/runtime";
/// [`RUNTIME_LABEL`] value of a virtual-kubelet node: it has no kubelet to dial, so the
/// node-address reconciler leaves it alone.
pub const RUNTIME_VIRTUAL: &str = "virtual";

/// Node label, taint key and pod nodeSelector key naming the provider behind a virtual
/// node.
pub const PROVIDER_LABEL: &str = "outpost.dhnt.io/provider";
/// Taint key set on every virtual node (effect `NoSchedule`, value the provider name), so
/// only pods placed on a provider land there.
pub const PROVIDER_TAINT: &str = PROVIDER_LABEL;
/// Scheduling gate a pod carries until placement has chosen its provider.
pub const PLACEMENT_GATE: &str = "outpost.dhnt.io/placement";
/// Pod annotation: the candidate providers, comma-separated, in order of preference.
pub const PROVIDERS_ANNOTATION: &str = "outpost.dhnt.io/providers";
/// Pod annotation: the capacity type placement chose (for example `on-demand`, `spot`).
pub const CAPACITY_TYPE_ANNOTATION: &str = "outpost.dhnt.io/capacity-type";
/// Pod annotation: the provider's identifier of the pod's instance.
pub const INSTANCE_ID_ANNOTATION: &str = "outpost.dhnt.io/instance-id";
/// Pod annotation: where the instance answers (a host name or address, with a port where
/// the provider has one); `status.podIP` cannot hold a DNS name.
pub const ENDPOINT_ANNOTATION: &str = "outpost.dhnt.io/endpoint";

/// Pod annotation: the fingerprint of the pod's mutable fields (labels, annotations, image,
/// activeDeadlineSeconds, tolerations) the manager last handed to the provider, so a change
/// is pushed once and an unchanged pod costs nothing.
pub const APPLIED_SPEC_ANNOTATION: &str = "outpost.dhnt.io/applied-spec";

/// Prefix of a virtual node's name; the provider name follows.
pub const VIRTUAL_NODE_PREFIX: &str = "nebula-";

/// The virtual Node registered for `provider`: `nebula-<provider>`.
pub fn virtual_node_name(provider: &str) -> String {
    format!("{VIRTUAL_NODE_PREFIX}{provider}")
}

/// Secret annotation: when the current certificate key was set (RFC 3339).
pub const KEY_SET_AT_ANNOTATION: &str = "outpost.dhnt.io/certificate-key-set-at";
/// Secret annotation: the generation of the grant bundle, bumped at each rekey.
pub const GENERATION_ANNOTATION: &str = "outpost.dhnt.io/bundle-generation";
/// Secret annotation: the bootstrap token whose mint sealed the grant Secret's legacy entry
/// (`-` when a rekey or re-upload sealed it under an operator-held key with no token). The
/// legacy entry goes when that token expires, like the token's own grant entry.
pub const LEGACY_ENTRY_TOKEN_ANNOTATION: &str = "outpost.dhnt.io/legacy-entry-token";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_owned_key_is_under_the_domain() {
        for key in [
            RUNTIME_LABEL,
            PROVIDER_LABEL,
            PLACEMENT_GATE,
            PROVIDERS_ANNOTATION,
            CAPACITY_TYPE_ANNOTATION,
            INSTANCE_ID_ANNOTATION,
            ENDPOINT_ANNOTATION,
            KEY_SET_AT_ANNOTATION,
            GENERATION_ANNOTATION,
            LEGACY_ENTRY_TOKEN_ANNOTATION,
        ] {
            let (domain, name) = key.split_once('/').expect("a prefixed key");
            assert_eq!(domain, DOMAIN, "{key}");
            assert!(!name.is_empty() && name.len() <= 63, "{key}");
        }
    }

    #[test]
    fn virtual_node_names_carry_the_provider() {
        assert_eq!(virtual_node_name("process"), "nebula-process");
    }
}
