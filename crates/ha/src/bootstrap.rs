//! What the first controller publishes through the API so that others can join:
//!
//! - `kube-public/cluster-info` with the API server URL and CA (the bootstrap signer adds
//!   one `jws-kubeconfig-<token-id>` signature per signing token),
//! - a Role and RoleBinding letting anonymous callers get exactly that ConfigMap
//!   (kubeadm's `kubeadm:bootstrap-signer-clusterinfo`),
//! - kubeadm's bootstrap bindings for the node-token group (CSR creation and
//!   auto-approval),
//! - `kube-system/stratum-control-plane`, the etcd client URLs a joiner adds its member
//!   through when its grant records none, readable by the control-plane bootstrap group.
//!
//! Each object is computed, compared with what the API holds, and written only when it
//! differs (with the resourceVersion read), so a restart writes nothing. cluster-info is
//! patched on its `kubeconfig` key alone: the signer's keys are left alone.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{
    ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::discovery::{
    CLUSTER_INFO_NAME, CLUSTER_INFO_NAMESPACE, KUBECONFIG_KEY, cluster_info_kubeconfig,
};
use crate::tokens::{CONTROL_PLANE_GROUP, WORKER_GROUP};

/// Namespace of the control-plane ConfigMap.
pub const CONTROL_PLANE_NAMESPACE: &str = "kube-system";
/// The ConfigMap recording the control plane's etcd client URLs.
pub const CONTROL_PLANE_CONFIGMAP: &str = "stratum-control-plane";
/// Its data key: comma-separated etcd client URLs.
pub const ETCD_ENDPOINTS_KEY: &str = "etcd-endpoints";
/// The Role and RoleBinding letting anonymous callers read cluster-info.
pub const CLUSTER_INFO_READER: &str = "kubeadm:bootstrap-signer-clusterinfo";
/// The Role and RoleBinding letting joining control planes read the control-plane ConfigMap.
pub const CONTROL_PLANE_READER: &str = "stratum:control-plane-reader";
const RBAC: &str = "rbac.authorization.k8s.io";
const MAX_ATTEMPTS: u32 = 8;

/// A publication that failed, naming the object.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The API refused or could not be asked.
    #[error("cannot {action} {object}")]
    Api {
        /// What was being done.
        action: &'static str,
        /// `kind namespace/name`.
        object: String,
        /// The client's error.
        #[source]
        source: Box<kube::Error>,
    },
    /// Writes kept conflicting.
    #[error("{object} kept changing under this write ({MAX_ATTEMPTS} attempts); retry")]
    Conflict {
        /// The object.
        object: String,
    },
}

fn api_err<'a>(
    action: &'static str,
    object: &'a str,
) -> impl FnOnce(kube::Error) -> PublishError + 'a {
    move |e| PublishError::Api {
        action,
        object: object.to_string(),
        source: Box::new(e),
    }
}

fn meta(name: &str, ns: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: ns.map(Into::into),
        ..Default::default()
    }
}

fn group(name: &str) -> Subject {
    Subject {
        api_group: Some(RBAC.into()),
        kind: "Group".into(),
        name: name.into(),
        namespace: None,
    }
}

/// The anonymous cluster-info reader Role (pure).
pub fn cluster_info_role() -> Role {
    Role {
        metadata: meta(CLUSTER_INFO_READER, Some(CLUSTER_INFO_NAMESPACE)),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            resource_names: Some(vec![CLUSTER_INFO_NAME.into()]),
            verbs: vec!["get".into()],
            non_resource_urls: None,
        }]),
    }
}

/// Its binding to `system:anonymous` (pure).
pub fn cluster_info_binding() -> RoleBinding {
    RoleBinding {
        metadata: meta(CLUSTER_INFO_READER, Some(CLUSTER_INFO_NAMESPACE)),
        role_ref: RoleRef {
            api_group: RBAC.into(),
            kind: "Role".into(),
            name: CLUSTER_INFO_READER.into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some(RBAC.into()),
            kind: "User".into(),
            name: "system:anonymous".into(),
            namespace: None,
        }]),
    }
}

/// The control-plane ConfigMap reader Role (pure).
pub fn control_plane_role() -> Role {
    Role {
        metadata: meta(CONTROL_PLANE_READER, Some(CONTROL_PLANE_NAMESPACE)),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            resource_names: Some(vec![CONTROL_PLANE_CONFIGMAP.into()]),
            verbs: vec!["get".into()],
            non_resource_urls: None,
        }]),
    }
}

/// Its binding to the control-plane bootstrap group only (pure).
pub fn control_plane_binding() -> RoleBinding {
    RoleBinding {
        metadata: meta(CONTROL_PLANE_READER, Some(CONTROL_PLANE_NAMESPACE)),
        role_ref: RoleRef {
            api_group: RBAC.into(),
            kind: "Role".into(),
            name: CONTROL_PLANE_READER.into(),
        },
        subjects: Some(vec![group(CONTROL_PLANE_GROUP)]),
    }
}

/// kubeadm's bootstrap ClusterRoleBindings for the node-token group (pure): CSR creation
/// (`system:node-bootstrapper`) and auto-approval of node client CSRs.
pub fn bootstrap_cluster_role_bindings() -> Vec<ClusterRoleBinding> {
    [
        ("kubeadm:kubelet-bootstrap", "system:node-bootstrapper"),
        (
            "kubeadm:node-autoapprove-bootstrap",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
        ),
    ]
    .into_iter()
    .map(|(name, role)| ClusterRoleBinding {
        metadata: meta(name, None),
        role_ref: RoleRef {
            api_group: RBAC.into(),
            kind: "ClusterRole".into(),
            name: role.into(),
        },
        subjects: Some(vec![group(WORKER_GROUP)]),
    })
    .collect()
}

/// Creates `want` or replaces what differs in it; unchanged writes nothing. `same` compares
/// the parts this module owns. Returns whether it wrote.
async fn ensure<K>(
    api: &Api<K>,
    want: &K,
    same: impl Fn(&K, &K) -> bool,
) -> Result<bool, PublishError>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let name = want.meta().name.clone().unwrap_or_default();
    let object = format!("{} {name}", K::kind(&()));
    for _ in 0..MAX_ATTEMPTS {
        let observed = api.get_opt(&name).await.map_err(api_err("read", &object))?;
        let result = match observed {
            Some(o) if same(&o, want) => return Ok(false),
            Some(o) => {
                let mut w = want.clone();
                w.meta_mut().resource_version = o.meta().resource_version.clone();
                api.replace(&name, &PostParams::default(), &w).await
            }
            None => api.create(&PostParams::default(), want).await,
        };
        match result {
            Ok(_) => {
                tracing::info!(%object, "written");
                return Ok(true);
            }
            Err(kube::Error::Api(s)) if s.is_conflict() || s.is_already_exists() => continue,
            Err(e) => return Err(api_err("write", &object)(e)),
        }
    }
    Err(PublishError::Conflict { object })
}

/// Ensures what token discovery needs, as `kubeadm join` expects it: `kube-public/
/// cluster-info` holding a kubeconfig with `server` (an `https://` URL) and `ca_pem` (the
/// bootstrap signer adds a `jws-kubeconfig-<token-id>` per signing token), a Role that
/// may `get` that one ConfigMap (`resourceNames`) and nothing else, and its binding to
/// `system:anonymous` alone. An object that differs (a broader rule, another subject) is
/// replaced; one that matches is not written. Returns how many objects were written (0
/// on a second run).
pub async fn ensure_discovery(
    client: &kube::Client,
    server: &str,
    ca_pem: &[u8],
) -> Result<usize, PublishError> {
    ensure_discovery_with(client, server, ca_pem, ServerPolicy::Replace).await
}

/// Whose API server URL cluster-info keeps when it already holds this CA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerPolicy {
    /// Make it `server` (the bootstrap, or an operator who named the server).
    Replace,
    /// Keep the published server when cluster-info already carries this CA; `server` is
    /// used only to create it or to replace one with another CA. A joining control plane
    /// writes its kubeconfigs with cluster-info's server, so a `token create` run through
    /// a kubeconfig that points at `127.0.0.1` must not replace the VIP `up` published.
    KeepPublished,
}

/// [`ensure_discovery`] with a [`ServerPolicy`].
pub async fn ensure_discovery_with(
    client: &kube::Client,
    server: &str,
    ca_pem: &[u8],
    policy: ServerPolicy,
) -> Result<usize, PublishError> {
    let mut written = usize::from(ensure_cluster_info_with(client, server, ca_pem, policy).await?);
    let public_roles: Api<Role> = Api::namespaced(client.clone(), CLUSTER_INFO_NAMESPACE);
    let public_bindings: Api<RoleBinding> = Api::namespaced(client.clone(), CLUSTER_INFO_NAMESPACE);
    written += usize::from(
        ensure(&public_roles, &cluster_info_role(), |a, b| {
            a.rules == b.rules
        })
        .await?,
    );
    written += usize::from(
        ensure(&public_bindings, &cluster_info_binding(), |a, b| {
            a.role_ref == b.role_ref && a.subjects == b.subjects
        })
        .await?,
    );
    Ok(written)
}

/// Publishes (or confirms) every bootstrap object: cluster-info for `server` and
/// `ca_pem`, its anonymous reader, the bootstrap bindings, and the control-plane ConfigMap
/// with `etcd_endpoint` in it. Returns how many objects were written (0 on a restart with
/// nothing changed).
pub async fn ensure_cluster_objects(
    client: &kube::Client,
    server: &str,
    ca_pem: &[u8],
    etcd_endpoint: &str,
) -> Result<usize, PublishError> {
    let mut written = ensure_discovery(client, server, ca_pem).await?;
    let roles: Api<Role> = Api::namespaced(client.clone(), CONTROL_PLANE_NAMESPACE);
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), CONTROL_PLANE_NAMESPACE);
    written += usize::from(ensure(&roles, &control_plane_role(), |a, b| a.rules == b.rules).await?);
    written += usize::from(
        ensure(&bindings, &control_plane_binding(), |a, b| {
            a.role_ref == b.role_ref && a.subjects == b.subjects
        })
        .await?,
    );
    let crbs: Api<ClusterRoleBinding> = Api::all(client.clone());
    for crb in bootstrap_cluster_role_bindings() {
        written += usize::from(
            ensure(&crbs, &crb, |a, b| {
                a.role_ref == b.role_ref && a.subjects == b.subjects
            })
            .await?,
        );
    }
    written += usize::from(add_etcd_endpoint(client, etcd_endpoint).await?);
    Ok(written)
}

/// Creates cluster-info or patches its `kubeconfig` key when it differs; the signer's
/// `jws-kubeconfig-*` keys are never touched. Returns whether it wrote.
pub async fn ensure_cluster_info(
    client: &kube::Client,
    server: &str,
    ca_pem: &[u8],
) -> Result<bool, PublishError> {
    ensure_cluster_info_with(client, server, ca_pem, ServerPolicy::Replace).await
}

/// The server of a published cluster-info kubeconfig when its one cluster carries
/// `ca_pem` as its CA (pure).
pub fn published_server_with_ca(kubeconfig: &str, ca_pem: &[u8]) -> Option<String> {
    use base64::Engine as _;
    let parsed = kube::config::Kubeconfig::from_yaml(kubeconfig).ok()?;
    let [named] = parsed.clusters.as_slice() else {
        return None;
    };
    let cluster = named.cluster.as_ref()?;
    let ca = base64::engine::general_purpose::STANDARD
        .decode(cluster.certificate_authority_data.as_deref()?.trim())
        .ok()?;
    if ca != ca_pem {
        return None;
    }
    cluster.server.clone()
}

async fn ensure_cluster_info_with(
    client: &kube::Client,
    server: &str,
    ca_pem: &[u8],
    policy: ServerPolicy,
) -> Result<bool, PublishError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), CLUSTER_INFO_NAMESPACE);
    let object = format!("ConfigMap {CLUSTER_INFO_NAMESPACE}/{CLUSTER_INFO_NAME}");
    let kubeconfig = cluster_info_kubeconfig(server, ca_pem);
    for _ in 0..MAX_ATTEMPTS {
        let observed = api
            .get_opt(CLUSTER_INFO_NAME)
            .await
            .map_err(api_err("read", &object))?;
        let result = match observed {
            Some(cm) => {
                let published = cm.data.as_ref().and_then(|d| d.get(KUBECONFIG_KEY));
                if published == Some(&kubeconfig) {
                    return Ok(false);
                }
                if policy == ServerPolicy::KeepPublished
                    && published.is_some_and(|p| published_server_with_ca(p, ca_pem).is_some())
                {
                    return Ok(false);
                }
                // The resourceVersion in the patch makes it conditional on what was read.
                let patch = serde_json::json!({
                    "metadata": {"resourceVersion": cm.metadata.resource_version},
                    "data": {KUBECONFIG_KEY: kubeconfig},
                });
                api.patch(
                    CLUSTER_INFO_NAME,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            }
            None => {
                let cm = ConfigMap {
                    metadata: meta(CLUSTER_INFO_NAME, Some(CLUSTER_INFO_NAMESPACE)),
                    data: Some(BTreeMap::from([(
                        KUBECONFIG_KEY.to_string(),
                        kubeconfig.clone(),
                    )])),
                    ..Default::default()
                };
                api.create(&PostParams::default(), &cm).await
            }
        };
        match result {
            Ok(_) => {
                tracing::info!(%object, server, "published cluster-info");
                return Ok(true);
            }
            Err(kube::Error::Api(s)) if s.is_conflict() || s.is_already_exists() => continue,
            Err(e) => return Err(api_err("write", &object)(e)),
        }
    }
    Err(PublishError::Conflict { object })
}

/// The etcd client URLs recorded in the control-plane ConfigMap (pure).
pub fn recorded_endpoints(cm: Option<&ConfigMap>) -> Vec<String> {
    cm.and_then(|cm| cm.data.as_ref())
        .and_then(|d| d.get(ETCD_ENDPOINTS_KEY))
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// Adds `endpoint` to the control-plane ConfigMap (creating it), with the resourceVersion
/// read; present already writes nothing. Returns whether it wrote.
pub async fn add_etcd_endpoint(
    client: &kube::Client,
    endpoint: &str,
) -> Result<bool, PublishError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), CONTROL_PLANE_NAMESPACE);
    let object = format!("ConfigMap {CONTROL_PLANE_NAMESPACE}/{CONTROL_PLANE_CONFIGMAP}");
    for _ in 0..MAX_ATTEMPTS {
        let observed = api
            .get_opt(CONTROL_PLANE_CONFIGMAP)
            .await
            .map_err(api_err("read", &object))?;
        let mut endpoints = recorded_endpoints(observed.as_ref());
        if endpoints.iter().any(|e| e == endpoint) {
            return Ok(false);
        }
        endpoints.push(endpoint.to_string());
        let value = endpoints.join(",");
        let result = match observed {
            Some(mut cm) => {
                cm.data
                    .get_or_insert_with(Default::default)
                    .insert(ETCD_ENDPOINTS_KEY.into(), value);
                api.replace(CONTROL_PLANE_CONFIGMAP, &PostParams::default(), &cm)
                    .await
            }
            None => {
                let cm = ConfigMap {
                    metadata: meta(CONTROL_PLANE_CONFIGMAP, Some(CONTROL_PLANE_NAMESPACE)),
                    data: Some(BTreeMap::from([(ETCD_ENDPOINTS_KEY.to_string(), value)])),
                    ..Default::default()
                };
                api.create(&PostParams::default(), &cm).await
            }
        };
        match result {
            Ok(_) => {
                tracing::info!(%object, endpoint, "recorded etcd endpoint");
                return Ok(true);
            }
            Err(kube::Error::Api(s)) if s.is_conflict() || s.is_already_exists() => continue,
            Err(e) => return Err(api_err("write", &object)(e)),
        }
    }
    Err(PublishError::Conflict { object })
}

/// Reads the control-plane ConfigMap's endpoints with `client` (a joiner's bootstrap
/// client). Absent or forbidden is an empty list: the grant may record the endpoints.
pub async fn read_etcd_endpoints(client: &kube::Client) -> Result<Vec<String>, PublishError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), CONTROL_PLANE_NAMESPACE);
    match api.get_opt(CONTROL_PLANE_CONFIGMAP).await {
        Ok(cm) => Ok(recorded_endpoints(cm.as_ref())),
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(Vec::new()),
        Err(e) => Err(api_err(
            "read",
            &format!("ConfigMap {CONTROL_PLANE_NAMESPACE}/{CONTROL_PLANE_CONFIGMAP}"),
        )(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_anonymous_reads_only_cluster_info() {
        let role = cluster_info_role();
        let rules = role.rules.unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].verbs, vec!["get"]);
        assert_eq!(
            rules[0].resource_names.as_deref(),
            Some(&["cluster-info".to_string()][..])
        );
        let b = cluster_info_binding();
        assert_eq!(b.subjects.unwrap()[0].name, "system:anonymous");
    }

    #[test]
    fn the_control_plane_configmap_is_for_the_control_plane_group_only() {
        let b = control_plane_binding();
        let subjects = b.subjects.unwrap();
        assert_eq!(subjects.len(), 1);
        assert_eq!(subjects[0].name, CONTROL_PLANE_GROUP);
    }

    #[test]
    fn a_published_server_is_recognised_only_with_the_same_ca() {
        let published = cluster_info_kubeconfig("https://10.0.0.100:6443", b"CA-ONE");
        assert_eq!(
            published_server_with_ca(&published, b"CA-ONE").as_deref(),
            Some("https://10.0.0.100:6443")
        );
        assert_eq!(published_server_with_ca(&published, b"CA-TWO"), None);
        assert_eq!(published_server_with_ca("not: [yaml", b"CA-ONE"), None);
    }

    #[test]
    fn endpoints_parse_from_the_configmap() {
        let cm = ConfigMap {
            data: Some(BTreeMap::from([(
                ETCD_ENDPOINTS_KEY.to_string(),
                " https://a:2379, ,https://b:2379".to_string(),
            )])),
            ..Default::default()
        };
        assert_eq!(
            recorded_endpoints(Some(&cm)),
            vec!["https://a:2379", "https://b:2379"]
        );
        assert!(recorded_endpoints(None).is_empty());
    }
}
