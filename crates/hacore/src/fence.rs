//! The maintenance fence, as pure decisions over the Lease read: who holds it, whether it
//! may be taken, renewed or released. `ha::fence` reads and writes the Lease.
//!
//! The fence is the Lease `kube-system/stratum-maintenance`. A cluster-wide maintenance
//! operation (a rekey of the shared certs) takes it for its run and rechecks it right before
//! each write it makes, so two such operations never interleave and one whose lease ran out
//! while a call stalled stops instead of overwriting its successor's work. A lease whose
//! holder stopped renewing is free once `renewTime + leaseDurationSeconds` has passed.

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec, Validation,
};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// The fence Lease's namespace.
pub const FENCE_NAMESPACE: &str = "kube-system";
/// The fence Lease's name.
pub const FENCE_LEASE: &str = "stratum-maintenance";
/// How long a take or renewal holds the fence without another renewal.
pub const FENCE_DURATION_SECONDS: i32 = 60;

/// Who holds the fence, as judged at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceState {
    /// Nobody: no holder, or the holder's term ran out.
    Free,
    /// The caller, until `expires`.
    Mine {
        /// When the term ends without a renewal.
        expires: Timestamp,
    },
    /// Someone else.
    Held {
        /// Their identity.
        holder: String,
        /// When their term ends without a renewal; `None` when the Lease records no renewal
        /// time or duration (only an edit by hand makes one): it never expires by itself.
        expires: Option<Timestamp>,
    },
}

fn expiry(spec: &LeaseSpec) -> Option<Timestamp> {
    let renewed = spec
        .renew_time
        .as_ref()
        .or(spec.acquire_time.as_ref())
        .map(|t| t.0)?;
    let seconds = spec.lease_duration_seconds?;
    renewed
        .checked_add(SignedDuration::from_secs(i64::from(seconds.max(0))))
        .ok()
}

/// Who holds `lease` (absent: nobody) at `now`, as seen by `me`.
pub fn judge(lease: Option<&Lease>, me: &str, now: Timestamp) -> FenceState {
    let Some(spec) = lease.and_then(|l| l.spec.as_ref()) else {
        return FenceState::Free;
    };
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() {
        return FenceState::Free;
    }
    let expires = expiry(spec);
    if expires.is_some_and(|e| e <= now) {
        return FenceState::Free;
    }
    match expires {
        Some(expires) if holder == me => FenceState::Mine { expires },
        _ => FenceState::Held {
            holder: holder.to_string(),
            expires,
        },
    }
}

/// The Lease to write so `me` holds the fence from `now` (a create when `observed` is
/// absent, else a replace carrying the resourceVersion read), or the state that forbids it.
/// Taking a free fence counts a transition; renewing one's own does not.
pub fn take(observed: Option<&Lease>, me: &str, now: Timestamp) -> Result<Lease, FenceState> {
    let state = judge(observed, me, now);
    if let FenceState::Held { .. } = state {
        return Err(state);
    }
    let mut lease = observed.cloned().unwrap_or_else(|| Lease {
        metadata: ObjectMeta {
            name: Some(FENCE_LEASE.into()),
            namespace: Some(FENCE_NAMESPACE.into()),
            ..ObjectMeta::default()
        },
        spec: None,
    });
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if !matches!(state, FenceState::Mine { .. }) {
        spec.acquire_time = Some(MicroTime(now));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    }
    spec.holder_identity = Some(me.to_string());
    spec.lease_duration_seconds = Some(FENCE_DURATION_SECONDS);
    spec.renew_time = Some(MicroTime(now));
    Ok(lease)
}

/// The Lease to write to renew `me`'s term, or the state that says it is no longer
/// `me`'s (taken over, or run out: a fence that ran out is lost, not silently re-taken).
pub fn renew(observed: Option<&Lease>, me: &str, now: Timestamp) -> Result<Lease, FenceState> {
    match judge(observed, me, now) {
        FenceState::Mine { .. } => take(observed, me, now),
        other => Err(other),
    }
}

/// The Lease to write to give the fence up, when `me` holds it; `None` otherwise (nothing
/// to release, and never someone else's term to end).
pub fn release(observed: Option<&Lease>, me: &str, now: Timestamp) -> Option<Lease> {
    if !matches!(judge(observed, me, now), FenceState::Mine { .. }) {
        return None;
    }
    let mut lease = observed.cloned()?;
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = None;
        spec.renew_time = None;
        spec.acquire_time = None;
    }
    Some(lease)
}

/// The admission policy that keeps the control-plane bootstrap group to its own fence: a
/// joining control plane authenticates with a bootstrap token that the reader Role lets
/// `update` the fence Lease, and RBAC cannot say "only under your own name". The policy
/// does: a write of the fence Lease by a member of that group must name the caller
/// (`system:bootstrap:<token-id>`) as holder, or release a term the caller held.
pub const JOIN_FENCE_POLICY: &str = "stratum-join-fence";
/// The annotation a dry-run write carries to probe that the policy is enforced: the policy
/// refuses any write carrying it, from anyone, so a refusal proves the serving API server
/// enforces the policy (and an acceptance that it does not yet).
pub const FENCE_PROBE_ANNOTATION: &str = "outpost.dhnt.io/fence-probe";
/// The message of the probe's refusal, which the prober looks for.
pub const FENCE_PROBE_MESSAGE: &str = "enforcement probe: the join fence policy is in force";

/// The wanted join fence policy, with the defaults kube-apiserver stores spelled out so
/// that a stored policy compares equal to it.
pub fn join_fence_policy(group: &str) -> ValidatingAdmissionPolicy {
    let in_group = format!("request.userInfo.groups.exists(g, g == '{group}')");
    let probing = format!(
        "has(object.metadata.annotations) && '{FENCE_PROBE_ANNOTATION}' in object.metadata.annotations"
    );
    let holder = |o: &str| {
        format!("has({o}.spec) && has({o}.spec.holderIdentity) && {o}.spec.holderIdentity")
    };
    let own_name = format!(
        "({new} == request.userInfo.username) || \
         ((!has(object.spec) || !has(object.spec.holderIdentity) || object.spec.holderIdentity == '') \
          && oldObject != null && {old} == request.userInfo.username)",
        new = holder("object"),
        old = holder("oldObject"),
    );
    ValidatingAdmissionPolicy {
        metadata: ObjectMeta {
            name: Some(JOIN_FENCE_POLICY.into()),
            ..ObjectMeta::default()
        },
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".into()),
            match_constraints: Some(MatchResources {
                match_policy: Some("Equivalent".into()),
                namespace_selector: Some(LabelSelector::default()),
                object_selector: Some(LabelSelector::default()),
                resource_rules: Some(vec![NamedRuleWithOperations {
                    api_groups: Some(vec!["coordination.k8s.io".into()]),
                    api_versions: Some(vec!["v1".into()]),
                    operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
                    resources: Some(vec!["leases".into()]),
                    resource_names: Some(vec![FENCE_LEASE.into()]),
                    scope: Some("*".into()),
                }]),
                exclude_resource_rules: None,
            }),
            match_conditions: Some(vec![MatchCondition {
                name: "bootstrap-group-or-probe".into(),
                expression: format!("{in_group} || ({probing})"),
            }]),
            validations: Some(vec![
                Validation {
                    expression: format!("!({probing})"),
                    message: Some(FENCE_PROBE_MESSAGE.into()),
                    ..Validation::default()
                },
                Validation {
                    expression: own_name,
                    message: Some(
                        "the control-plane bootstrap group may hold the maintenance fence \
                         only under its own name (system:bootstrap:<token-id>)"
                            .into(),
                    ),
                    reason: Some("Forbidden".into()),
                    ..Validation::default()
                },
            ]),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    }
}

/// The binding that puts [`join_fence_policy`] in force (deny, no parameters).
pub fn join_fence_binding() -> ValidatingAdmissionPolicyBinding {
    ValidatingAdmissionPolicyBinding {
        metadata: ObjectMeta {
            name: Some(JOIN_FENCE_POLICY.into()),
            ..ObjectMeta::default()
        },
        spec: Some(ValidatingAdmissionPolicyBindingSpec {
            policy_name: Some(JOIN_FENCE_POLICY.into()),
            validation_actions: Some(vec!["Deny".into()]),
            ..ValidatingAdmissionPolicyBindingSpec::default()
        }),
    }
}

/// The bootstrap-token user name a joining control plane holds the fence as.
pub fn joiner_identity(token_id: &str) -> String {
    format!("system:bootstrap:{token_id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn held(holder: &str, renewed: i64) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(FENCE_LEASE.into()),
                resource_version: Some("7".into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(FENCE_DURATION_SECONDS),
                renew_time: Some(MicroTime(at(renewed))),
                acquire_time: Some(MicroTime(at(renewed))),
                lease_transitions: Some(2),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn an_absent_or_empty_lease_is_free_and_taken() {
        assert_eq!(judge(None, "me", at(0)), FenceState::Free);
        let lease = take(None, "me", at(0)).unwrap();
        assert_eq!(lease.metadata.name.as_deref(), Some(FENCE_LEASE));
        assert_eq!(lease.metadata.namespace.as_deref(), Some(FENCE_NAMESPACE));
        assert_eq!(
            judge(Some(&lease), "me", at(1)),
            FenceState::Mine { expires: at(60) }
        );
        let released = release(Some(&lease), "me", at(1)).unwrap();
        assert_eq!(judge(Some(&released), "other", at(1)), FenceState::Free);
    }

    #[test]
    fn anothers_live_term_refuses_until_it_runs_out() {
        let lease = held("other", 0);
        let refused = take(Some(&lease), "me", at(59)).unwrap_err();
        assert_eq!(
            refused,
            FenceState::Held {
                holder: "other".into(),
                expires: Some(at(60))
            }
        );
        // At the instant the term ends it is free; the take keeps the resourceVersion read
        // and counts a transition.
        let taken = take(Some(&lease), "me", at(60)).unwrap();
        assert_eq!(taken.metadata.resource_version.as_deref(), Some("7"));
        let spec = taken.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("me"));
        assert_eq!(spec.lease_transitions, Some(3));
        assert_eq!(spec.acquire_time, Some(MicroTime(at(60))));
        // Someone else's term is never released by me.
        assert!(release(Some(&lease), "me", at(1)).is_none());
    }

    #[test]
    fn a_renewal_keeps_the_term_and_a_lost_one_is_not_retaken() {
        let mine = held("me", 0);
        let renewed = renew(Some(&mine), "me", at(30)).unwrap();
        let spec = renewed.spec.as_ref().unwrap();
        assert_eq!(spec.renew_time, Some(MicroTime(at(30))));
        assert_eq!(spec.acquire_time, Some(MicroTime(at(0))), "not a new term");
        assert_eq!(spec.lease_transitions, Some(2));
        // Run out: renew refuses (the caller lost it), though take would succeed.
        assert_eq!(
            renew(Some(&mine), "me", at(61)).unwrap_err(),
            FenceState::Free
        );
        // Taken over.
        let theirs = held("other", 40);
        assert!(matches!(
            renew(Some(&theirs), "me", at(41)),
            Err(FenceState::Held { .. })
        ));
        assert_eq!(renew(None, "me", at(0)).unwrap_err(), FenceState::Free);
    }

    #[test]
    fn a_holder_without_times_never_expires_by_itself() {
        let mut lease = held("other", 0);
        if let Some(spec) = lease.spec.as_mut() {
            spec.renew_time = None;
            spec.acquire_time = None;
        }
        assert_eq!(
            judge(Some(&lease), "me", at(10_000)),
            FenceState::Held {
                holder: "other".into(),
                expires: None
            }
        );
    }
}
