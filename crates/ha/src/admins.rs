//! The cluster-admins binding: what gives `admin.conf` its rights.
//!
//! `admin.conf`'s user is in [`pki::CLUSTER_ADMINS_GROUP`], not `system:masters`, so its
//! rights come from one ClusterRoleBinding to `cluster-admin` that can be revoked (kubeadm's
//! layout since 1.29). Bootstrap (`up`) creates it with the break-glass
//! `super-admin.conf` ([`pki::SUPER_ADMIN_KUBECONFIG`]), before anyone uses admin.conf:
//! [`ensure_cluster_admins_binding`]. [`cluster_admins_binding`] is the object, pure.

use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};

/// Name of the ClusterRoleBinding (kubeadm's, so either tool finds it).
pub const CLUSTER_ADMINS_BINDING: &str = "kubeadm:cluster-admins";
const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// The ClusterRoleBinding of [`pki::CLUSTER_ADMINS_GROUP`] to `cluster-admin` (pure).
pub fn cluster_admins_binding() -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(CLUSTER_ADMINS_BINDING.into()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: RBAC_GROUP.into(),
            kind: "ClusterRole".into(),
            name: "cluster-admin".into(),
        },
        subjects: Some(vec![admins_subject()]),
    }
}

fn admins_subject() -> Subject {
    Subject {
        api_group: Some(RBAC_GROUP.into()),
        kind: "Group".into(),
        name: pki::CLUSTER_ADMINS_GROUP.into(),
        namespace: None,
    }
}

/// What [`ensure_cluster_admins_binding`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindingChange {
    /// It was already there, as wanted: nothing written.
    Unchanged,
    /// It was absent and was created.
    Created,
    /// It lacked the group as a subject; the group was added, other subjects kept.
    SubjectAdded,
}

/// The binding could not be ensured.
#[derive(Debug, thiserror::Error)]
pub enum AdminsError {
    /// The binding exists with another role: not ours to replace.
    #[error(
        "ClusterRoleBinding {CLUSTER_ADMINS_BINDING} exists but binds {found}, not \
         ClusterRole cluster-admin: admin.conf would have no rights. Delete it (with \
         super-admin.conf) and run this again"
    )]
    WrongRole {
        /// `kind/name` of the role it binds.
        found: String,
    },
    /// Another writer kept changing it.
    #[error(
        "ClusterRoleBinding {CLUSTER_ADMINS_BINDING} kept changing under this write (5 \
         attempts, each from a fresh read); retry in a moment"
    )]
    Conflict,
    /// The API server refused or could not be asked.
    #[error("cannot {action} ClusterRoleBinding {CLUSTER_ADMINS_BINDING}")]
    Api {
        /// What was being done.
        action: &'static str,
        /// The client's error.
        #[source]
        source: Box<kube::Error>,
    },
}

/// Creates the cluster-admins binding when absent, adds the group to an existing one that
/// lacks it, and writes nothing when it is already right. `client` must have the rights to
/// do so: at bootstrap, `super-admin.conf`'s.
pub async fn ensure_cluster_admins_binding(
    client: &kube::Client,
) -> Result<BindingChange, AdminsError> {
    let api: Api<ClusterRoleBinding> = Api::all(client.clone());
    let api_err = |action: &'static str| {
        move |source| AdminsError::Api {
            action,
            source: Box::new(source),
        }
    };
    for _ in 0..5 {
        let Some(mut observed) = api
            .get_opt(CLUSTER_ADMINS_BINDING)
            .await
            .map_err(api_err("read"))?
        else {
            match api
                .create(&PostParams::default(), &cluster_admins_binding())
                .await
            {
                Ok(_) => return Ok(BindingChange::Created),
                Err(kube::Error::Api(s)) if s.is_already_exists() => continue,
                Err(e) => return Err(api_err("create")(e)),
            }
        };
        let wanted = cluster_admins_binding().role_ref;
        if observed.role_ref != wanted {
            return Err(AdminsError::WrongRole {
                found: format!("{}/{}", observed.role_ref.kind, observed.role_ref.name),
            });
        }
        let subject = admins_subject();
        let subjects = observed.subjects.get_or_insert_with(Vec::new);
        if subjects
            .iter()
            .any(|s| s.kind == subject.kind && s.name == subject.name)
        {
            return Ok(BindingChange::Unchanged);
        }
        subjects.push(subject);
        match api
            .replace(CLUSTER_ADMINS_BINDING, &PostParams::default(), &observed)
            .await
        {
            Ok(_) => return Ok(BindingChange::SubjectAdded),
            Err(kube::Error::Api(s)) if s.is_conflict() || s.is_not_found() => continue,
            Err(e) => return Err(api_err("update")(e)),
        }
    }
    Err(AdminsError::Conflict)
}
