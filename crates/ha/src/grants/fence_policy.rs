//! The admission policy that keeps the control-plane bootstrap group to its own maintenance
//! fence ([`hacore::fence::join_fence_policy`]), written before the reader Role that lets the
//! group update the fence Lease, and proven in force before that Role is written: RBAC
//! alone would let one joiner write the fence under another's name.
//!
//! "In force" is observed, not assumed: policy storage and the admission plugin's cache are
//! not synchronized, and behind a VIP each request may reach a different API server. A
//! dry-run write of the fence carrying [`hacore::fence::FENCE_PROBE_ANNOTATION`] must be
//! refused by the policy [`PROBES_IN_A_ROW`] times in a row before the Role is written.

use std::time::Duration;

use hacore::fence::{
    FENCE_LEASE, FENCE_NAMESPACE, FENCE_PROBE_ANNOTATION, FENCE_PROBE_MESSAGE, JOIN_FENCE_POLICY,
    join_fence_binding, join_fence_policy,
};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

use super::GrantError;
use crate::tokens::CONTROL_PLANE_GROUP;

/// Refusals in a row that count as "enforced on every serving API server".
pub const PROBES_IN_A_ROW: u32 = 3;
/// How long to wait for the policy to be enforced.
pub const ENFORCEMENT_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_ATTEMPTS: u32 = 5;

fn api_error(action: &'static str, kind: &'static str) -> impl Fn(kube::Error) -> GrantError {
    move |source| GrantError::Api {
        action,
        object: format!("{kind} {JOIN_FENCE_POLICY}"),
        source: Box::new(source),
    }
}

fn is_race(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.is_conflict() || s.is_already_exists() || s.is_not_found())
}

/// Writes the policy and its binding where absent or different; writes nothing when both
/// are as wanted. Whether anything was written.
pub async fn ensure_join_fence_policy(client: &kube::Client) -> Result<bool, GrantError> {
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let wanted = join_fence_policy(CONTROL_PLANE_GROUP);
    let policy = ensure(
        &policies,
        wanted,
        |o, w| o.spec == w.spec,
        |o, w| o.spec = w.spec,
        "ValidatingAdmissionPolicy",
    )
    .await?;
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let binding = ensure(
        &bindings,
        join_fence_binding(),
        |o, w| o.spec == w.spec,
        |o, w| o.spec = w.spec,
        "ValidatingAdmissionPolicyBinding",
    )
    .await?;
    Ok(policy || binding)
}

async fn ensure<K>(
    api: &Api<K>,
    wanted: K,
    same: impl Fn(&K, &K) -> bool,
    adopt: impl Fn(&mut K, K),
    kind: &'static str,
) -> Result<bool, GrantError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    for _ in 0..MAX_ATTEMPTS {
        let observed = api
            .get_opt(JOIN_FENCE_POLICY)
            .await
            .map_err(api_error("read", kind))?;
        let written = match observed {
            None => api.create(&PostParams::default(), &wanted).await,
            Some(o) if same(&o, &wanted) => return Ok(false),
            Some(mut o) => {
                adopt(&mut o, wanted.clone());
                api.replace(JOIN_FENCE_POLICY, &PostParams::default(), &o)
                    .await
            }
        };
        match written {
            Ok(_) => {
                tracing::info!(kind, name = JOIN_FENCE_POLICY, "join fence policy written");
                return Ok(true);
            }
            Err(e) if is_race(&e) => continue,
            Err(e) => return Err(api_error("write", kind)(e)),
        }
    }
    Err(GrantError::Api {
        action: "write",
        object: format!("{kind} {JOIN_FENCE_POLICY}"),
        source: Box::new(kube::Error::Service(
            format!("still conflicting after {MAX_ATTEMPTS} attempts").into(),
        )),
    })
}

/// What one probe saw.
#[derive(Debug, PartialEq, Eq)]
enum Probe {
    /// The policy refused the probe.
    Enforced,
    /// The write was admitted: this API server does not enforce the policy (yet).
    NotYet,
}

async fn probe(leases: &Api<Lease>) -> Result<Probe, GrantError> {
    let params = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let patch = serde_json::json!({"metadata": {"annotations": {FENCE_PROBE_ANNOTATION: "probe"}}});
    match leases
        .patch(FENCE_LEASE, &params, &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(Probe::NotYet),
        Err(kube::Error::Api(s))
            if s.message.contains(JOIN_FENCE_POLICY) && s.message.contains(FENCE_PROBE_MESSAGE) =>
        {
            Ok(Probe::Enforced)
        }
        Err(e) => Err(GrantError::Api {
            action: "probe the enforcement of",
            object: format!(
                "ValidatingAdmissionPolicy {JOIN_FENCE_POLICY} (a dry-run write of Lease {FENCE_NAMESPACE}/{FENCE_LEASE})"
            ),
            source: Box::new(e),
        }),
    }
}

/// Waits until [`PROBES_IN_A_ROW`] dry-run probes in a row are refused by the policy;
/// [`GrantError::PolicyNotEnforced`] after [`ENFORCEMENT_TIMEOUT`] (nothing else written).
pub async fn wait_for_enforcement(client: &kube::Client) -> Result<(), GrantError> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), FENCE_NAMESPACE);
    let deadline = tokio::time::Instant::now() + ENFORCEMENT_TIMEOUT;
    let mut in_a_row = 0;
    loop {
        match probe(&leases).await? {
            Probe::Enforced => in_a_row += 1,
            Probe::NotYet => in_a_row = 0,
        }
        if in_a_row >= PROBES_IN_A_ROW {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(GrantError::PolicyNotEnforced {
                policy: JOIN_FENCE_POLICY,
                waited: ENFORCEMENT_TIMEOUT,
            });
        }
        if in_a_row == 0 {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}
