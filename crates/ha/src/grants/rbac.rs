//! Who may read the grant Secret: a Role allowing `get` on exactly that one Secret (and
//! `get`/`update` on exactly the maintenance fence Lease, [`crate::fence`]), bound to the
//! control-plane bootstrap group and nobody else. A worker token authenticates too, so a
//! binding naming any broader group would hand every worker the (encrypted) CA keys.

use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};

use super::GrantError;
use super::plan::{NAMESPACE, SECRET_NAME};
use crate::tokens::CONTROL_PLANE_GROUP;

/// Name of the Role and the RoleBinding.
pub const READER_NAME: &str = "stratum:certs-reader";
const RBAC_GROUP: &str = "rbac.authorization.k8s.io";
const MAX_ATTEMPTS: u32 = 5;

/// What to do to one RBAC object.
#[derive(Debug, Clone, PartialEq)]
pub enum Change<T> {
    /// It is as wanted (or absent and meant to stay absent).
    Nothing,
    /// It is absent: create this.
    Create(T),
    /// It differs: write this (it carries the resourceVersion read).
    Replace(T),
    /// Its immutable roleRef differs: delete the observed one (by UID and resourceVersion)
    /// and create this.
    Recreate(T),
}

/// The wanted Role: get on the grant Secret, by name, nothing else.
pub fn reader_role() -> Role {
    Role {
        metadata: meta(),
        rules: Some(wanted_rules()),
    }
}

fn wanted_rules() -> Vec<PolicyRule> {
    vec![
        PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["secrets".into()]),
            resource_names: Some(vec![SECRET_NAME.into()]),
            verbs: vec!["get".into()],
            non_resource_urls: None,
        },
        // The maintenance fence, by name only. No `create` (RBAC cannot scope it to a
        // name): `grant_certs_reader` creates the Lease, the group only holds it.
        PolicyRule {
            api_groups: Some(vec!["coordination.k8s.io".into()]),
            resources: Some(vec!["leases".into()]),
            resource_names: Some(vec![crate::fence::FENCE_LEASE.into()]),
            verbs: vec!["get".into(), "update".into()],
            non_resource_urls: None,
        },
    ]
}

/// The wanted RoleBinding: the Role, to the control-plane bootstrap group only.
pub fn reader_binding() -> RoleBinding {
    RoleBinding {
        metadata: meta(),
        role_ref: wanted_role_ref(),
        subjects: Some(wanted_subjects()),
    }
}

fn wanted_role_ref() -> RoleRef {
    RoleRef {
        api_group: RBAC_GROUP.into(),
        kind: "Role".into(),
        name: READER_NAME.into(),
    }
}

fn wanted_subjects() -> Vec<Subject> {
    vec![Subject {
        api_group: Some(RBAC_GROUP.into()),
        kind: "Group".into(),
        name: CONTROL_PLANE_GROUP.into(),
        namespace: None,
    }]
}

fn meta() -> ObjectMeta {
    ObjectMeta {
        name: Some(READER_NAME.into()),
        namespace: Some(NAMESPACE.into()),
        ..ObjectMeta::default()
    }
}

/// The change that makes `observed` the wanted Role (pure).
pub fn role_change(observed: Option<&Role>) -> Change<Role> {
    let Some(observed) = observed else {
        return Change::Create(reader_role());
    };
    if observed.rules.as_deref().unwrap_or_default() == wanted_rules().as_slice() {
        return Change::Nothing;
    }
    let mut role = observed.clone();
    role.rules = Some(wanted_rules());
    Change::Replace(role)
}

fn same_subjects(observed: &[Subject]) -> bool {
    // The API server defaults a Group subject's apiGroup; compare as if it had.
    let norm = |s: &Subject| {
        (
            s.kind.clone(),
            s.name.clone(),
            s.api_group.clone().unwrap_or_else(|| RBAC_GROUP.into()),
            s.namespace.clone().unwrap_or_default(),
        )
    };
    let wanted = wanted_subjects();
    observed.len() == wanted.len()
        && observed
            .iter()
            .zip(&wanted)
            .all(|(a, b)| norm(a) == norm(b))
}

/// The change that narrows `observed` to the wanted RoleBinding (pure). An absent binding
/// is created only when `create_if_absent`.
pub fn binding_change(
    observed: Option<&RoleBinding>,
    create_if_absent: bool,
) -> Change<RoleBinding> {
    let Some(observed) = observed else {
        return if create_if_absent {
            Change::Create(reader_binding())
        } else {
            Change::Nothing
        };
    };
    if observed.role_ref != wanted_role_ref() {
        return Change::Recreate(reader_binding());
    }
    if same_subjects(observed.subjects.as_deref().unwrap_or_default()) {
        return Change::Nothing;
    }
    let mut binding = observed.clone();
    binding.subjects = Some(wanted_subjects());
    Change::Replace(binding)
}

fn object() -> String {
    format!("{NAMESPACE}/{READER_NAME}")
}

fn api_error(action: &'static str, kind: &'static str) -> impl Fn(kube::Error) -> GrantError {
    move |source| GrantError::Api {
        action,
        object: format!("{kind} {}", object()),
        source: Box::new(source),
    }
}

fn is_retryable(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.is_conflict() || s.is_already_exists() || s.is_not_found())
}

/// Writes the Role and the RoleBinding that let only the control-plane bootstrap group get
/// the grant Secret and hold the maintenance fence, narrowing broader ones, and creates the
/// fence Lease the Role names; before the Role, the admission policy that keeps the group to
/// its own fence, waited for until enforced ([`super::fence_policy`]). Writes nothing when
/// all are as wanted (the enforcement probes are dry runs).
pub async fn grant_certs_reader(client: &kube::Client) -> Result<(), GrantError> {
    crate::fence::ensure_fence_lease(client).await?;
    // Before the Role: the policy keeps the group to its own fence, which RBAC cannot. It
    // is probed (dry runs) whenever it or the Role is about to change; once both stand, the
    // Role was written after a proof, and the steady state asks nothing more.
    let written = super::fence_policy::ensure_join_fence_policy(client).await?;
    let role = Api::<Role>::namespaced(client.clone(), NAMESPACE)
        .get_opt(READER_NAME)
        .await
        .map_err(api_error("read", "Role"))?;
    if written || role_change(role.as_ref()) != Change::Nothing {
        super::fence_policy::wait_for_enforcement(client).await?;
    }
    ensure_role(client, role).await?;
    ensure_binding(client, true).await
}

/// Narrows an existing reader binding (and Role) to the wanted ones; an absent binding
/// stays absent. Every mint runs it, so a cluster that once bound a broader group loses
/// that grant the first time any token is minted, not only at the next upload.
pub async fn narrow_certs_reader_binding(client: &kube::Client) -> Result<(), GrantError> {
    let roles: Api<Role> = Api::namespaced(client.clone(), NAMESPACE);
    let role = roles
        .get_opt(READER_NAME)
        .await
        .map_err(api_error("read", "Role"))?;
    if role.is_some() {
        ensure_role(client, role).await?;
    }
    ensure_binding(client, false).await
}

/// Makes the Role the wanted one. `read` is the caller's fresh read of it, used for the
/// first attempt; a conflict reads again.
async fn ensure_role(client: &kube::Client, read: Option<Role>) -> Result<(), GrantError> {
    let api: Api<Role> = Api::namespaced(client.clone(), NAMESPACE);
    let mut first = Some(read);
    for _ in 0..MAX_ATTEMPTS {
        let observed = match first.take() {
            Some(read) => read,
            None => api
                .get_opt(READER_NAME)
                .await
                .map_err(api_error("read", "Role"))?,
        };
        let result = match role_change(observed.as_ref()) {
            Change::Nothing => return Ok(()),
            Change::Create(role) => api.create(&PostParams::default(), &role).await.map(drop),
            Change::Replace(role) | Change::Recreate(role) => api
                .replace(READER_NAME, &PostParams::default(), &role)
                .await
                .map(drop),
        };
        match result {
            Ok(()) => {
                tracing::info!(role = %object(), "certs reader Role written");
                return Ok(());
            }
            Err(err) if is_retryable(&err) => continue,
            Err(err) => return Err(api_error("write", "Role")(err)),
        }
    }
    Err(GrantError::Conflict {
        object: format!("Role {}", object()),
        attempts: MAX_ATTEMPTS,
    })
}

async fn ensure_binding(client: &kube::Client, create_if_absent: bool) -> Result<(), GrantError> {
    let api: Api<RoleBinding> = Api::namespaced(client.clone(), NAMESPACE);
    for _ in 0..MAX_ATTEMPTS {
        let observed = api
            .get_opt(READER_NAME)
            .await
            .map_err(api_error("read", "RoleBinding"))?;
        let result = match binding_change(observed.as_ref(), create_if_absent) {
            Change::Nothing => return Ok(()),
            Change::Create(binding) => api.create(&PostParams::default(), &binding).await.map(drop),
            Change::Replace(binding) => api
                .replace(READER_NAME, &PostParams::default(), &binding)
                .await
                .map(drop),
            Change::Recreate(binding) => {
                // roleRef is immutable: delete exactly the object judged, then create.
                let observed = observed.as_ref().map(|o| &o.metadata);
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: observed.and_then(|m| m.uid.clone()),
                        resource_version: observed.and_then(|m| m.resource_version.clone()),
                    }),
                    ..DeleteParams::default()
                };
                match api.delete(READER_NAME, &params).await {
                    Ok(_) => api.create(&PostParams::default(), &binding).await.map(drop),
                    Err(err) => Err(err),
                }
            }
        };
        match result {
            Ok(()) => {
                tracing::info!(binding = %object(), "certs reader RoleBinding narrowed");
                return Ok(());
            }
            Err(err) if is_retryable(&err) => continue,
            Err(err) => return Err(api_error("write", "RoleBinding")(err)),
        }
    }
    Err(GrantError::Conflict {
        object: format!("RoleBinding {}", object()),
        attempts: MAX_ATTEMPTS,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_is_get_on_one_secret_and_hold_of_one_lease() {
        let role = reader_role();
        let rules = role.rules.unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0].verbs, ["get"]);
        assert_eq!(rules[0].resource_names.as_deref().unwrap(), [SECRET_NAME]);
        assert_eq!(rules[0].resources.as_deref().unwrap(), ["secrets"]);
        assert_eq!(rules[1].verbs, ["get", "update"]);
        assert_eq!(
            rules[1].api_groups.as_deref().unwrap(),
            ["coordination.k8s.io"]
        );
        assert_eq!(rules[1].resources.as_deref().unwrap(), ["leases"]);
        assert_eq!(
            rules[1].resource_names.as_deref().unwrap(),
            [crate::fence::FENCE_LEASE]
        );
    }

    #[test]
    fn role_changes_only_when_rules_differ() {
        assert!(matches!(role_change(None), Change::Create(_)));
        let mut observed = reader_role();
        observed.metadata.resource_version = Some("5".into());
        assert_eq!(role_change(Some(&observed)), Change::Nothing);
        let mut broad = observed.clone();
        broad.rules.as_mut().unwrap()[0].resource_names = None;
        broad.rules.as_mut().unwrap()[0].verbs.push("list".into());
        let Change::Replace(fixed) = role_change(Some(&broad)) else {
            panic!("a broader role must be replaced")
        };
        assert_eq!(fixed.rules, reader_role().rules);
        assert_eq!(fixed.metadata.resource_version.as_deref(), Some("5"));
    }

    #[test]
    fn binding_is_narrowed_to_the_control_plane_group() {
        assert!(matches!(binding_change(None, true), Change::Create(_)));
        assert_eq!(binding_change(None, false), Change::Nothing);

        let mut defaulted = reader_binding();
        defaulted.subjects.as_mut().unwrap()[0].api_group = None;
        assert_eq!(binding_change(Some(&defaulted), false), Change::Nothing);

        let mut broad = reader_binding();
        broad.metadata.resource_version = Some("9".into());
        broad.subjects.as_mut().unwrap().push(Subject {
            api_group: Some(RBAC_GROUP.into()),
            kind: "Group".into(),
            name: crate::tokens::WORKER_GROUP.into(),
            namespace: None,
        });
        let Change::Replace(narrowed) = binding_change(Some(&broad), false) else {
            panic!("a broader binding must be narrowed")
        };
        assert_eq!(narrowed.subjects, reader_binding().subjects);
        assert_eq!(narrowed.metadata.resource_version.as_deref(), Some("9"));

        let mut cluster_role = reader_binding();
        cluster_role.role_ref.kind = "ClusterRole".into();
        cluster_role.role_ref.name = "admin".into();
        assert!(matches!(
            binding_change(Some(&cluster_role), false),
            Change::Recreate(_)
        ));
    }
}
