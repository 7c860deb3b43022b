//! Bootstrap tokens: the authenticator (`plugin/pkg/auth/authenticator/token/bootstrap`)
//! and the bootstrap signer (`pkg/controller/bootstrap/bootstrapsigner.go`) that signs
//! `kube-public/cluster-info` with a detached JWS per signing token
//! (`cluster-bootstrap/token/jws`), so a joining node verifies the cluster as
//! `kubeadm join` does.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::auth::UserInfo;
use crate::resources;
use crate::server::State;
use crate::store::{Inner, res_index};

/// The Secret type of bootstrap tokens.
pub const TOKEN_SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
/// The namespace of `cluster-info`.
pub const CLUSTER_INFO_NAMESPACE: &str = "kube-public";
/// The ConfigMap the signer signs.
pub const CLUSTER_INFO: &str = "cluster-info";
/// The key in `cluster-info` whose value is signed.
pub const KUBECONFIG_KEY: &str = "kubeconfig";
/// The prefix of signature keys in `cluster-info`.
pub const JWS_PREFIX: &str = "jws-kubeconfig-";

/// The detached JWS of `content` (`cluster-bootstrap/token/jws.ComputeDetachedSignature`):
/// a compact HS256 JWS keyed by the token secret, protected header
/// `{"alg":"HS256","kid":"<token-id>"}`, with the payload removed (`header..signature`).
pub fn detached_jws(content: &str, token_id: &str, token_secret: &str) -> String {
    // The header bytes are what go-jose writes: its header map marshals with sorted keys.
    let header = URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(&json!({"alg": "HS256", "kid": token_id})).unwrap_or_default());
    let payload = URL_SAFE_NO_PAD.encode(content);
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, token_secret.as_bytes());
    let tag = ring::hmac::sign(&key, format!("{header}.{payload}").as_bytes());
    format!("{header}..{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
}

fn data(secret: &Value, key: &str) -> Option<String> {
    let b = secret.pointer(&format!("/data/{key}"))?.as_str()?;
    String::from_utf8(STANDARD.decode(b).ok()?).ok()
}

fn lower_alnum(s: &str, n: usize) -> bool {
    s.len() == n
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Bootstrap token parts: `[a-z0-9]{6}.[a-z0-9]{16}`.
pub fn parse_token(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.split_once('.')?;
    (lower_alnum(id, 6) && lower_alnum(secret, 16)).then_some((id, secret))
}

/// Whether the Secret's `expiration` has passed (`now` in seconds since the epoch). An
/// unparsable expiration counts as expired, as `bootstrapsecretutil.HasExpired` does.
pub fn expired(secret: &Value, now: i64) -> bool {
    match data(secret, "expiration") {
        None => false,
        Some(exp) => crate::times::parse_rfc3339(exp.trim()).map_or(true, |t| t.as_second() <= now),
    }
}

/// `system:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]` (`ValidateBootstrapGroupName`).
pub fn valid_group(g: &str) -> bool {
    let Some(rest) = g.strip_prefix("system:bootstrappers:") else {
        return false;
    };
    !rest.is_empty()
        && rest.len() <= 256
        && rest
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b':' || b == b'-')
        && rest
            .bytes()
            .last()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// The user a bootstrap token authenticates as, following `TokenAuthenticator`: the
/// Secret `bootstrap-token-<id>` exists in kube-system (the caller looks it up), is not
/// being deleted, has the token type, its `token-secret` matches (constant time) and its
/// `token-id` equals the id, has not expired, allows `usage-bootstrap-authentication`,
/// and every `auth-extra-groups` entry is a `system:bootstrappers:` group. The user is
/// `system:bootstrap:<id>` in `system:bootstrappers` and the extra groups (the server adds
/// `system:authenticated` to every authenticated user).
pub fn authenticate(
    secret: &Value,
    token_id: &str,
    token_secret: &str,
    now: i64,
) -> Option<UserInfo> {
    if secret.pointer("/metadata/deletionTimestamp").is_some()
        || secret.get("type").and_then(Value::as_str) != Some(TOKEN_SECRET_TYPE)
    {
        return None;
    }
    let stored = data(secret, "token-secret")?;
    if !constant_time_eq(stored.as_bytes(), token_secret.as_bytes()) {
        return None;
    }
    if data(secret, "token-id").as_deref() != Some(token_id) || expired(secret, now) {
        return None;
    }
    if data(secret, "usage-bootstrap-authentication").as_deref() != Some("true") {
        return None;
    }
    let mut groups = vec!["system:bootstrappers".to_string()];
    if let Some(extra) = data(secret, "auth-extra-groups") {
        for g in extra.split(',').map(str::trim).filter(|g| !g.is_empty()) {
            if !valid_group(g) {
                return None;
            }
            if !groups.iter().any(|x| x == g) {
                groups.push(g.to_string());
            }
        }
    }
    Some(UserInfo {
        username: format!("system:bootstrap:{token_id}"),
        uid: String::new(),
        groups,
    })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    // Constant time in the content (length differences are public).
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The tokens that sign (`validateSecretForSigning`): token type, valid id and secret, the
/// id matching the Secret name's, `usage-bootstrap-signing: "true"`, not expired.
/// Returns token id to token secret.
pub fn signing_tokens(secrets: &[Arc<Value>], now: i64) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for s in secrets {
        if s.get("type").and_then(Value::as_str) != Some(TOKEN_SECRET_TYPE) {
            continue;
        }
        let (Some(id), Some(secret)) = (data(s, "token-id"), data(s, "token-secret")) else {
            continue;
        };
        if !lower_alnum(&id, 6) || !lower_alnum(&secret, 16) {
            continue;
        }
        let name = s
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        if let Some(name_id) = name.strip_prefix("bootstrap-token-")
            && name_id != id
        {
            continue;
        }
        if data(s, "usage-bootstrap-signing").as_deref() != Some("true") || expired(s, now) {
            continue;
        }
        out.insert(id, secret);
    }
    out
}

/// What `cluster-info`'s data should be: signatures for every signing token, stale ones
/// removed. None when it needs no change (or has no `kubeconfig` to sign).
pub fn signed_data(cm: &Value, tokens: &BTreeMap<String, String>) -> Option<Value> {
    let data = cm.get("data")?.as_object()?;
    let content = data.get(KUBECONFIG_KEY)?.as_str()?;
    let mut new = data.clone();
    new.retain(|k, _| {
        k.strip_prefix(JWS_PREFIX)
            .is_none_or(|id| tokens.contains_key(id))
    });
    for (id, secret) in tokens {
        new.insert(
            format!("{JWS_PREFIX}{id}"),
            Value::String(detached_jws(content, id, secret)),
        );
    }
    (new != *data).then_some(Value::Object(new))
}

/// One signer pass under the lock. Returns whether `cluster-info` was rewritten.
pub fn sign_pass(g: &mut Inner, now: i64) -> bool {
    let cms = res_index(resources::find("", "v1", "configmaps").expect("configmaps are served"));
    let secrets = res_index(resources::find("", "v1", "secrets").expect("secrets are served"));
    let Some(cm) = g.get(cms, CLUSTER_INFO_NAMESPACE, CLUSTER_INFO) else {
        return false;
    };
    if cm.pointer("/metadata/deletionTimestamp").is_some() {
        return false;
    }
    let tokens = signing_tokens(&g.list(secrets, Some("kube-system")), now);
    let Some(data) = signed_data(&cm, &tokens) else {
        return false;
    };
    let mut new = (*cm).clone();
    new["data"] = data;
    g.put(cms, new);
    true
}

/// Whether a request is the anonymous read of `cluster-info` kubeadm's RBAC allows
/// (`kubeadm:bootstrap-signer-clusterinfo`, bound to `system:anonymous`).
pub fn is_cluster_info_read(method: &http::Method, path: &str) -> bool {
    *method == http::Method::GET
        && path.trim_end_matches('/')
            == format!("/api/v1/namespaces/{CLUSTER_INFO_NAMESPACE}/configmaps/{CLUSTER_INFO}")
}

/// Runs the signer on every store change until cancelled.
pub(crate) async fn run(state: Arc<State>, cancel: CancellationToken) {
    let mut rx = state.store.subscribe();
    loop {
        let changed = sign_pass(&mut state.store.lock(), crate::times::now_secs());
        if changed {
            state.notify();
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            r = rx.changed() => if r.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(s: &str) -> String {
        STANDARD.encode(s)
    }

    fn token(name: &str, id: &str, secret: &str, extra: &[(&str, &str)]) -> Value {
        let mut d = json!({"token-id": enc(id), "token-secret": enc(secret),
            "usage-bootstrap-authentication": enc("true"), "usage-bootstrap-signing": enc("true")});
        for (k, v) in extra {
            d[*k] = json!(enc(v));
        }
        json!({"type": TOKEN_SECRET_TYPE, "metadata": {"name": name, "namespace": "kube-system"}, "data": d})
    }

    #[test]
    fn detached_signature_matches_the_kubernetes_test_vector() {
        // pkg/controller/bootstrap/bootstrapsigner_test.go: content "payload",
        // token abc123, secret "tokenSecret".
        assert_eq!(
            detached_jws("payload", "abc123", "tokenSecret"),
            "eyJhbGciOiJIUzI1NiIsImtpZCI6ImFiYzEyMyJ9..QSxpUG7Q542CirTI2ECPSZjvBOJURUW5a7XqFpNI958"
        );
    }

    #[test]
    fn authentication_follows_the_bootstrap_authenticator() {
        let now = 1_700_000_000;
        let ok = token(
            "bootstrap-token-abcdef",
            "abcdef",
            "0123456789abcdef",
            &[(
                "auth-extra-groups",
                "system:bootstrappers:kubeadm:default-node-token",
            )],
        );
        let u = authenticate(&ok, "abcdef", "0123456789abcdef", now).unwrap();
        assert_eq!(u.username, "system:bootstrap:abcdef");
        assert_eq!(
            u.groups,
            [
                "system:bootstrappers",
                "system:bootstrappers:kubeadm:default-node-token"
            ]
        );
        assert!(authenticate(&ok, "abcdef", "0123456789abcdeX", now).is_none());
        // token-id must match the id the caller presented (the Secret name's).
        assert!(authenticate(&ok, "zzzzzz", "0123456789abcdef", now).is_none());
        let bad_group = token(
            "bootstrap-token-abcdef",
            "abcdef",
            "0123456789abcdef",
            &[("auth-extra-groups", "system:masters")],
        );
        assert!(authenticate(&bad_group, "abcdef", "0123456789abcdef", now).is_none());
        let mut deleting = ok.clone();
        deleting["metadata"]["deletionTimestamp"] = json!("2023-01-01T00:00:00Z");
        assert!(authenticate(&deleting, "abcdef", "0123456789abcdef", now).is_none());
        let old = token(
            "bootstrap-token-abcdef",
            "abcdef",
            "0123456789abcdef",
            &[("expiration", "2020-01-01T00:00:00Z")],
        );
        assert!(authenticate(&old, "abcdef", "0123456789abcdef", now).is_none());
        let garbled = token(
            "bootstrap-token-abcdef",
            "abcdef",
            "0123456789abcdef",
            &[("expiration", "soon")],
        );
        assert!(authenticate(&garbled, "abcdef", "0123456789abcdef", now).is_none());
        assert!(valid_group("system:bootstrappers:a-b:c1"));
        assert!(!valid_group("system:bootstrappers:"));
        assert!(!valid_group("system:bootstrappers:x-"));
        assert!(!valid_group("system:bootstrappers:X"));
    }

    #[test]
    fn signer_signs_valid_tokens_and_drops_stale_signatures() {
        let now = 1_700_000_000;
        let secrets: Vec<Arc<Value>> = [
            token("bootstrap-token-abc123", "abc123", "0123456789abcdef", &[]),
            token("bootstrap-token-wrong1", "abc999", "0123456789abcdef", &[]),
            token(
                "bootstrap-token-old111",
                "old111",
                "0123456789abcdef",
                &[("expiration", "2020-01-01T00:00:00Z")],
            ),
            {
                let mut t = token("bootstrap-token-nosign", "nosign", "0123456789abcdef", &[]);
                t["data"]["usage-bootstrap-signing"] = json!(enc("false"));
                t
            },
        ]
        .into_iter()
        .map(Arc::new)
        .collect();
        let tokens = signing_tokens(&secrets, now);
        assert_eq!(tokens.keys().collect::<Vec<_>>(), ["abc123"]);
        let cm = json!({"data": {"kubeconfig": "payload", "jws-kubeconfig-gone11": "x"}});
        let data = signed_data(&cm, &tokens).unwrap();
        assert_eq!(data["kubeconfig"], "payload");
        assert!(data.get("jws-kubeconfig-gone11").is_none());
        assert_eq!(
            data["jws-kubeconfig-abc123"],
            json!(detached_jws("payload", "abc123", "0123456789abcdef"))
        );
        let signed = json!({"data": data});
        assert!(
            signed_data(&signed, &tokens).is_none(),
            "steady state writes nothing"
        );
        assert!(signed_data(&json!({"data": {}}), &tokens).is_none());
    }
}
