//! The resource table: every kind the double serves, with its group, version, plural,
//! scope and subresources. Discovery, routing and strategies all read it.

/// How names of a kind are validated (`k8s.io/apimachinery/pkg/api/validation/path`,
/// `staging/src/k8s.io/apimachinery/pkg/util/validation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameRule {
    /// RFC 1123 subdomain: lowercase alphanumerics, '-' and '.', at most 253 characters.
    Subdomain,
    /// RFC 1123 label: lowercase alphanumerics and '-', at most 63 characters.
    Label,
    /// Any name that is a valid path segment (no '/', '%', not "." or "..").
    PathSegment,
}

/// One served resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resource {
    /// API group ("" for core).
    pub group: &'static str,
    /// Version ("v1").
    pub version: &'static str,
    /// Kind ("Pod").
    pub kind: &'static str,
    /// Plural resource name ("pods").
    pub plural: &'static str,
    /// Singular name ("pod").
    pub singular: &'static str,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Whether it has a `status` subresource.
    pub has_status: bool,
    /// Create-only review resources (SubjectAccessReview, TokenReview): not stored.
    pub create_only: bool,
    /// Whether `metadata.generation` is tracked (set to 1 on create, bumped on spec change).
    pub tracks_generation: bool,
    /// Short names kubectl accepts.
    pub short_names: &'static [&'static str],
    /// Name validation.
    pub name_rule: NameRule,
}

impl Resource {
    /// `apiVersion` of objects of this resource ("v1", "apps/v1").
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The `resource.group` form used in messages ("pods", "leases.coordination.k8s.io").
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// Verbs advertised in discovery.
    pub fn verbs(&self) -> &'static [&'static str] {
        if self.create_only {
            &["create"]
        } else {
            &[
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ]
        }
    }
}

const fn res(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    singular: &'static str,
    namespaced: bool,
    has_status: bool,
) -> Resource {
    Resource {
        group,
        version,
        kind,
        plural,
        singular,
        namespaced,
        has_status,
        create_only: false,
        tracks_generation: false,
        short_names: &[],
        name_rule: NameRule::Subdomain,
    }
}

/// Every resource the double serves.
pub static RESOURCES: &[Resource] = &[
    Resource {
        short_names: &["ns"],
        name_rule: NameRule::Label,
        ..res(
            "",
            "v1",
            "Namespace",
            "namespaces",
            "namespace",
            false,
            true,
        )
    },
    Resource {
        short_names: &["no"],
        ..res("", "v1", "Node", "nodes", "node", false, true)
    },
    Resource {
        short_names: &["po"],
        tracks_generation: true,
        ..res("", "v1", "Pod", "pods", "pod", true, true)
    },
    res("", "v1", "Secret", "secrets", "secret", true, false),
    Resource {
        short_names: &["cm"],
        ..res(
            "",
            "v1",
            "ConfigMap",
            "configmaps",
            "configmap",
            true,
            false,
        )
    },
    Resource {
        short_names: &["sa"],
        ..res(
            "",
            "v1",
            "ServiceAccount",
            "serviceaccounts",
            "serviceaccount",
            true,
            false,
        )
    },
    Resource {
        short_names: &["ev"],
        ..res("", "v1", "Event", "events", "event", true, false)
    },
    // kube-rs's event Recorder writes events.k8s.io/v1; kubectl reads core/v1 events.
    // Both are one resource, stored as core v1 Events ([`storage`], [`crate::convert`]).
    res(
        "events.k8s.io",
        "v1",
        "Event",
        "events",
        "event",
        true,
        false,
    ),
    Resource {
        short_names: &["svc"],
        name_rule: NameRule::Label,
        ..res("", "v1", "Service", "services", "service", true, true)
    },
    Resource {
        short_names: &["ep"],
        ..res("", "v1", "Endpoints", "endpoints", "endpoints", true, false)
    },
    res(
        "coordination.k8s.io",
        "v1",
        "Lease",
        "leases",
        "lease",
        true,
        false,
    ),
    Resource {
        name_rule: NameRule::PathSegment,
        ..res(
            "rbac.authorization.k8s.io",
            "v1",
            "Role",
            "roles",
            "role",
            true,
            false,
        )
    },
    Resource {
        name_rule: NameRule::PathSegment,
        ..res(
            "rbac.authorization.k8s.io",
            "v1",
            "RoleBinding",
            "rolebindings",
            "rolebinding",
            true,
            false,
        )
    },
    Resource {
        name_rule: NameRule::PathSegment,
        ..res(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRole",
            "clusterroles",
            "clusterrole",
            false,
            false,
        )
    },
    Resource {
        name_rule: NameRule::PathSegment,
        ..res(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRoleBinding",
            "clusterrolebindings",
            "clusterrolebinding",
            false,
            false,
        )
    },
    Resource {
        tracks_generation: true,
        ..res(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicy",
            "validatingadmissionpolicies",
            "validatingadmissionpolicy",
            false,
            true,
        )
    },
    Resource {
        tracks_generation: true,
        ..res(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicyBinding",
            "validatingadmissionpolicybindings",
            "validatingadmissionpolicybinding",
            false,
            false,
        )
    },
    Resource {
        short_names: &["ds"],
        tracks_generation: true,
        ..res(
            "apps",
            "v1",
            "DaemonSet",
            "daemonsets",
            "daemonset",
            true,
            true,
        )
    },
    Resource {
        short_names: &["deploy"],
        tracks_generation: true,
        ..res(
            "apps",
            "v1",
            "Deployment",
            "deployments",
            "deployment",
            true,
            true,
        )
    },
    Resource {
        create_only: true,
        ..res(
            "authorization.k8s.io",
            "v1",
            "SubjectAccessReview",
            "subjectaccessreviews",
            "subjectaccessreview",
            false,
            false,
        )
    },
    Resource {
        create_only: true,
        ..res(
            "authorization.k8s.io",
            "v1",
            "SelfSubjectAccessReview",
            "selfsubjectaccessreviews",
            "selfsubjectaccessreview",
            false,
            false,
        )
    },
    Resource {
        create_only: true,
        ..res(
            "authentication.k8s.io",
            "v1",
            "TokenReview",
            "tokenreviews",
            "tokenreview",
            false,
            false,
        )
    },
];

/// Looks a resource up by group, version and plural.
pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The resource whose storage `res` is served from: core v1 Events for events.k8s.io/v1
/// Events (kube-apiserver serves both from one event store), `res` itself otherwise.
pub fn storage(res: &'static Resource) -> &'static Resource {
    if crate::convert::is_events_v1(res) {
        find("", "v1", "events").expect("core events are served")
    } else {
        res
    }
}

/// Looks a resource up by kind (for owner references, which name kinds).
pub fn find_kind(api_version: &str, kind: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.kind == kind && r.api_version() == api_version)
}

/// The groups served, in discovery order, each with its versions.
pub fn groups() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for r in RESOURCES {
        if !r.group.is_empty() && !out.contains(&r.group) {
            out.push(r.group);
        }
    }
    out
}

/// Subresources a resource has, besides `status`.
pub fn subresources(r: &Resource) -> &'static [&'static str] {
    if r.plural == "pods" {
        &[
            "status",
            "binding",
            "eviction",
            "log",
            "exec",
            "attach",
            "portforward",
        ]
    } else if r.has_status {
        &["status"]
    } else {
        &[]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plural_lookup_distinguishes_groups() {
        assert_eq!(find("", "v1", "pods").unwrap().kind, "Pod");
        assert!(find("apps", "v1", "pods").is_none());
        assert_eq!(
            find("coordination.k8s.io", "v1", "leases")
                .unwrap()
                .qualified(),
            "leases.coordination.k8s.io"
        );
        assert_eq!(
            find_kind("apps/v1", "DaemonSet").unwrap().plural,
            "daemonsets"
        );
    }

    #[test]
    fn both_event_groups_share_core_storage() {
        let core = find("", "v1", "events").unwrap();
        let ev = find("events.k8s.io", "v1", "events").unwrap();
        assert_eq!(storage(ev), core);
        assert_eq!(storage(core), core);
    }

    #[test]
    fn groups_are_listed_once() {
        let g = groups();
        assert_eq!(
            g.iter()
                .filter(|g| **g == "rbac.authorization.k8s.io")
                .count(),
            1
        );
        assert!(!g.contains(&""));
    }
}
