//! Authentication (bearer tokens, bootstrap tokens, client certificates) and
//! authorization (a closure), plus the policy behind SubjectAccessReview and TokenReview.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};

/// An authenticated (or anonymous) caller.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct UserInfo {
    /// User name (`system:node:n1`, the CN of a client certificate).
    pub username: String,
    /// User uid, if known.
    pub uid: String,
    /// Groups (the O values of a client certificate).
    pub groups: Vec<String>,
}

impl UserInfo {
    /// A user with groups.
    pub fn new(username: &str, groups: &[&str]) -> Self {
        UserInfo {
            username: username.into(),
            uid: String::new(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    /// The anonymous user kube-apiserver assigns callers without credentials.
    pub fn anonymous() -> Self {
        UserInfo::new("system:anonymous", &["system:unauthenticated"])
    }

    fn to_json(&self) -> Value {
        json!({"username": self.username, "uid": self.uid, "groups": self.groups})
    }
}

/// What a request asks to do, as an authorizer sees it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Attributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, ...
    pub verb: String,
    /// API group ("" for core).
    pub group: String,
    /// Plural resource; empty for a non-resource request.
    pub resource: String,
    /// Subresource, if any.
    pub subresource: String,
    /// Namespace, if any.
    pub namespace: String,
    /// Object name, if any.
    pub name: String,
    /// The URL path of a non-resource request (`/version`).
    pub path: String,
}

/// Decides whether a user may do something.
pub type Authorizer = Arc<dyn Fn(&UserInfo, &Attributes) -> bool + Send + Sync>;

/// How callers are authenticated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AuthMode {
    /// Everyone gets in; callers without known credentials are anonymous.
    #[default]
    AllowAll,
    /// Unknown tokens and callers without credentials get 401.
    Strict,
}

/// The authentication and authorization policy.
#[derive(Clone, Default)]
pub struct Policy {
    /// Authentication mode.
    pub mode: AuthMode,
    /// Bearer token to user.
    pub tokens: HashMap<String, UserInfo>,
    /// The authorizer; None allows everything.
    pub authorizer: Option<Authorizer>,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("mode", &self.mode)
            .field("tokens", &self.tokens.len())
            .field("authorizer", &self.authorizer.is_some())
            .finish()
    }
}

/// The members of `system:masters` may do anything, as in kube-apiserver.
pub fn is_superuser(user: &UserInfo) -> bool {
    user.groups.iter().any(|g| g == "system:masters")
}

impl Policy {
    /// Whether `user` may do `attrs`.
    pub fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> bool {
        if is_superuser(user) {
            return true;
        }
        self.authorizer.as_ref().is_none_or(|a| a(user, attrs))
    }
}

/// The user with `system:authenticated` added, as kube-apiserver's group adder does for
/// every authenticated request (anonymous callers excepted).
pub fn with_authenticated_group(mut user: UserInfo) -> UserInfo {
    if user.username != "system:anonymous"
        && !user.groups.iter().any(|g| g == "system:authenticated")
    {
        user.groups.push("system:authenticated".into());
    }
    user
}

/// The status of a TokenReview for a user (or for an unknown token).
pub fn token_review_status(user: Option<&UserInfo>) -> Value {
    match user {
        Some(u) => json!({"authenticated": true, "user": u.to_json(), "audiences": []}),
        None => json!({"authenticated": false, "error": "invalid bearer token"}),
    }
}

/// The attributes a SubjectAccessReview spec asks about, and the user it names.
pub fn access_review_request(spec: &Value) -> (UserInfo, Attributes) {
    let s = |p: &str| {
        spec.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let user = UserInfo {
        username: s("/user"),
        uid: s("/uid"),
        groups: spec
            .get("groups")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|g| g.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default(),
    };
    let attrs = if spec.get("nonResourceAttributes").is_some() {
        Attributes {
            verb: s("/nonResourceAttributes/verb"),
            path: s("/nonResourceAttributes/path"),
            ..Default::default()
        }
    } else {
        Attributes {
            verb: s("/resourceAttributes/verb"),
            group: s("/resourceAttributes/group"),
            resource: s("/resourceAttributes/resource"),
            subresource: s("/resourceAttributes/subresource"),
            namespace: s("/resourceAttributes/namespace"),
            name: s("/resourceAttributes/name"),
            path: String::new(),
        }
    };
    (user, attrs)
}

/// The Forbidden message kube-apiserver writes.
pub fn forbidden_message(user: &UserInfo, a: &Attributes) -> String {
    if a.resource.is_empty() {
        return format!(
            "forbidden: User \"{}\" cannot {} path \"{}\"",
            user.username, a.verb, a.path
        );
    }
    let res = if a.group.is_empty() {
        a.resource.clone()
    } else {
        format!("{}.{}", a.resource, a.group)
    };
    let what = if a.name.is_empty() {
        format!("{res} is forbidden")
    } else {
        format!("{res} \"{}\" is forbidden", a.name)
    };
    let sub = if a.subresource.is_empty() {
        a.resource.clone()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let scope = if a.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace \"{}\"", a.namespace)
    };
    format!(
        "{what}: User \"{}\" cannot {} resource \"{sub}\" in API group \"{}\" {scope}",
        user.username, a.verb, a.group
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn authenticated_users_carry_the_group_once() {
        let u = with_authenticated_group(UserInfo::new("alice", &["dev"]));
        assert_eq!(u.groups, ["dev", "system:authenticated"]);
        assert_eq!(with_authenticated_group(u.clone()), u);
        assert_eq!(
            with_authenticated_group(UserInfo::anonymous()).groups,
            ["system:unauthenticated"]
        );
    }

    #[test]
    fn forbidden_messages_name_the_request() {
        let u = UserInfo::new("alice", &[]);
        let a = Attributes {
            verb: "get".into(),
            resource: "pods".into(),
            namespace: "default".into(),
            name: "p".into(),
            ..Default::default()
        };
        assert_eq!(
            forbidden_message(&u, &a),
            "pods \"p\" is forbidden: User \"alice\" cannot get resource \"pods\" in API group \"\" in the namespace \"default\""
        );
    }

    #[test]
    fn masters_bypass_the_authorizer() {
        let p = Policy {
            authorizer: Some(Arc::new(|_, _| false)),
            ..Default::default()
        };
        assert!(p.authorize(
            &UserInfo::new("root", &["system:masters"]),
            &Attributes::default()
        ));
        assert!(!p.authorize(&UserInfo::new("bob", &[]), &Attributes::default()));
    }

    #[test]
    fn access_reviews_read_the_spec() {
        let (u, a) = access_review_request(&json!({"user": "bob", "groups": ["g"],
            "resourceAttributes": {"verb": "list", "resource": "nodes"}}));
        assert_eq!(u.groups, ["g"]);
        assert_eq!((a.verb.as_str(), a.resource.as_str()), ("list", "nodes"));
    }
}
