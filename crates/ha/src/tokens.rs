//! Bootstrap tokens: the short-lived credentials a joining node presents before it has a
//! certificate of its own.
//!
//! A token is `<id>.<secret>` (`[a-z0-9]{6}.[a-z0-9]{16}`), stored as the Secret
//! `kube-system/bootstrap-token-<id>` of type `bootstrap.kubernetes.io/token`, the shape
//! kube-apiserver's bootstrap authenticator and the token cleaner read. A control-plane token
//! carries one more group than a worker's, [`CONTROL_PLANE_GROUP`], the only group the grant
//! Secret's reader binding names: a worker token cannot read the shared certs.
//!
//! Main items: [`BootstrapToken`] (generate, parse), [`token_secret`] (the Secret, pure),
//! [`create_token`] (mint it), [`token_state`] (live, expired or gone, pure) and
//! [`token_from_kubeconfig`] (which token a bootstrap kubeconfig carries).

use std::path::{Path, PathBuf};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, PostParams, Preconditions};

/// Namespace of every bootstrap token Secret.
pub const TOKEN_NAMESPACE: &str = "kube-system";
/// Secret type the bootstrap authenticator looks for.
pub const TOKEN_SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
/// The group every token joins as: the one kubeadm's node bootstrap RBAC names.
pub const WORKER_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";
/// The extra group of a control-plane token: the only subject allowed to get the grant
/// Secret.
pub const CONTROL_PLANE_GROUP: &str = "system:bootstrappers:stratum:control-plane";

const GROUP_PREFIX: &str = "system:bootstrappers:";

pub use common::token::{
    BootstrapToken, MalformedToken, TOKEN_SECRET_PREFIX, is_token_id, token_secret_name,
};

/// Which kind of node a token joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenRole {
    /// A worker: the default node-token group only.
    Worker,
    /// A control plane: the worker group plus [`CONTROL_PLANE_GROUP`].
    ControlPlane,
}

impl TokenRole {
    /// The `auth-extra-groups` this role's token carries.
    pub fn groups(self) -> &'static [&'static str] {
        match self {
            TokenRole::Worker => &[WORKER_GROUP],
            TokenRole::ControlPlane => &[WORKER_GROUP, CONTROL_PLANE_GROUP],
        }
    }
}

/// Checks a group against what the bootstrap authenticator accepts:
/// `system:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]`.
pub fn validate_group(group: &str) -> Result<(), TokenError> {
    let invalid = |reason: &str| TokenError::InvalidGroup {
        group: group.to_string(),
        reason: reason.to_string(),
    };
    let Some(rest) = group.strip_prefix(GROUP_PREFIX) else {
        return Err(invalid("it must start with \"system:bootstrappers:\""));
    };
    if rest.is_empty() || rest.len() > 256 {
        return Err(invalid(
            "1 to 256 characters must follow \"system:bootstrappers:\"",
        ));
    }
    if !rest
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b':' || b == b'-')
    {
        return Err(invalid(
            "only lowercase letters, digits, ':' and '-' are allowed",
        ));
    }
    if !rest
        .bytes()
        .last()
        .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return Err(invalid("it must end with a lowercase letter or a digit"));
    }
    Ok(())
}

/// The bootstrap token Secret for `token` (pure). Groups are validated so a typo fails here
/// rather than as a token the authenticator silently ignores.
pub fn token_secret(
    token: &BootstrapToken,
    role: TokenRole,
    expiration: Timestamp,
    description: Option<&str>,
) -> Result<Secret, TokenError> {
    for group in role.groups() {
        validate_group(group)?;
    }
    let mut data = std::collections::BTreeMap::new();
    let mut put = |key: &str, value: &str| {
        data.insert(key.to_string(), ByteString(value.as_bytes().to_vec()));
    };
    put("token-id", token.id());
    put("token-secret", token.secret());
    put(
        "expiration",
        &expiration.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
    );
    put("usage-bootstrap-authentication", "true");
    put("usage-bootstrap-signing", "true");
    put("auth-extra-groups", &role.groups().join(","));
    if let Some(description) = description {
        put("description", description);
    }
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(token.secret_name()),
            namespace: Some(TOKEN_NAMESPACE.to_string()),
            ..ObjectMeta::default()
        },
        type_: Some(TOKEN_SECRET_TYPE.to_string()),
        data: Some(data),
        ..Secret::default()
    })
}

pub use hacore::tokens::TokenState;

/// Judges a token Secret as read (`None`: not found) at `now` (pure).
pub fn token_state(secret: Option<&Secret>, now: Timestamp) -> TokenState {
    let Some(secret) = secret else {
        return TokenState::Gone;
    };
    if secret.metadata.deletion_timestamp.is_some() {
        return TokenState::Gone;
    }
    let expiration = secret
        .data
        .as_ref()
        .and_then(|data| data.get("expiration"))
        .map(|value| String::from_utf8_lossy(&value.0).into_owned());
    match expiration {
        // No expiration: a token that never expires (kubeadm's --ttl 0).
        None => TokenState::Live,
        Some(text) => match text.trim().parse::<Timestamp>() {
            Ok(at) if at > now => TokenState::Live,
            _ => TokenState::Expired,
        },
    }
}

/// A token this process minted, with what the grant Secret's owner reference needs.
#[derive(Debug, Clone)]
pub struct MintedToken {
    /// The token itself.
    pub token: BootstrapToken,
    /// When it expires.
    pub expiration: Timestamp,
    /// The UID the API server gave its Secret.
    pub uid: String,
}

impl MintedToken {
    /// An owner reference to the token Secret, so garbage collection can reap what the
    /// token owns once it is gone.
    pub fn owner_reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: "Secret".into(),
            name: self.token.secret_name(),
            uid: self.uid.clone(),
            controller: None,
            block_owner_deletion: None,
        }
    }
}

/// The longest a control-plane token (and so its grant of the CA keys) lives unless the
/// caller explicitly allows longer ([`TokenRequest::allow_long_ttl`]): kubeadm's
/// `upload-certs` secret lives two hours; a day covers a slow join.
pub const MAX_CONTROL_PLANE_TTL: Duration = Duration::from_secs(24 * 3600);

/// When a token minted at `now` with `ttl` expires, refusing a zero TTL, a control-plane TTL
/// over [`MAX_CONTROL_PLANE_TTL`] unless `allow_long`, and a TTL that overflows the
/// calendar (pure).
pub fn token_expiration(
    role: TokenRole,
    ttl: Duration,
    allow_long: bool,
    now: Timestamp,
) -> Result<Timestamp, TokenError> {
    let bad = |reason: String| TokenError::Ttl {
        text: humanize(ttl),
        reason,
    };
    if ttl.is_zero() {
        return Err(bad(
            "a token that never expires is refused: give a positive --ttl".into(),
        ));
    }
    if role == TokenRole::ControlPlane && ttl > MAX_CONTROL_PLANE_TTL && !allow_long {
        return Err(bad(format!(
            "a control-plane token's grant decrypts the CA keys, so it lives at most {} \
             unless explicitly allowed (--allow-long-ttl)",
            humanize(MAX_CONTROL_PLANE_TTL)
        )));
    }
    jiff::SignedDuration::try_from(ttl)
        .ok()
        .and_then(|d| now.checked_add(d).ok())
        .ok_or_else(|| bad("it ends past the last date the calendar can hold".into()))
}

fn humanize(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, s % 3600 / 60, s % 60) {
        (h, 0, 0) => format!("{h}h"),
        (0, m, 0) => format!("{m}m"),
        (h, m, sec) => format!("{h}h{m}m{sec}s"),
    }
}

/// What to mint: the role, lifetime and description of a token.
#[derive(Debug, Clone)]
pub struct TokenRequest<'a> {
    /// Worker or control plane.
    pub role: TokenRole,
    /// How long it lives.
    pub ttl: Duration,
    /// Stored on the token Secret.
    pub description: Option<&'a str>,
    /// Let a control-plane token live longer than [`MAX_CONTROL_PLANE_TTL`].
    pub allow_long_ttl: bool,
}

/// Creates a fresh token Secret expiring `ttl` after `now` ([`token_expiration`]'s limits,
/// a control-plane token capped at [`MAX_CONTROL_PLANE_TTL`]).
pub async fn create_token(
    client: &kube::Client,
    role: TokenRole,
    ttl: Duration,
    description: Option<&str>,
    now: Timestamp,
) -> Result<MintedToken, TokenError> {
    mint_token(
        client,
        &TokenRequest {
            role,
            ttl,
            description,
            allow_long_ttl: false,
        },
        now,
    )
    .await
}

/// Creates a fresh token Secret as `request` asks.
pub async fn mint_token(
    client: &kube::Client,
    request: &TokenRequest<'_>,
    now: Timestamp,
) -> Result<MintedToken, TokenError> {
    let (role, description) = (request.role, request.description);
    let expiration = token_expiration(role, request.ttl, request.allow_long_ttl, now)?;
    let api: Api<Secret> = Api::namespaced(client.clone(), TOKEN_NAMESPACE);
    // 36^6 ids: a collision with a live token is rare, but a retry costs nothing and an
    // AlreadyExists must never overwrite someone else's token.
    let mut attempts = 0;
    loop {
        attempts += 1;
        let token = BootstrapToken::generate();
        let secret = token_secret(&token, role, expiration, description)?;
        match api.create(&PostParams::default(), &secret).await {
            Ok(created) => {
                let uid = created.metadata.uid.ok_or_else(|| TokenError::NoUid {
                    name: token.secret_name(),
                })?;
                tracing::info!(token_id = %token.id(), ?role, %expiration, "minted bootstrap token");
                return Ok(MintedToken {
                    token,
                    expiration,
                    uid,
                });
            }
            Err(kube::Error::Api(status)) if status.is_already_exists() && attempts < 3 => {
                continue;
            }
            Err(source) => {
                return Err(TokenError::Api {
                    name: token.secret_name(),
                    action: "create",
                    source: Box::new(source),
                });
            }
        }
    }
}

/// Deletes a token this process minted, by UID, so a same-named token minted meanwhile by
/// someone else is never removed. Already gone is success.
pub async fn delete_token(client: &kube::Client, minted: &MintedToken) -> Result<(), TokenError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), TOKEN_NAMESPACE);
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(minted.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&minted.token.secret_name(), &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        Err(source) => Err(TokenError::Api {
            name: minted.token.secret_name(),
            action: "delete",
            source: Box::new(source),
        }),
    }
}

/// Reads a token's Secret and judges it at `now`. Not found is [`TokenState::Gone`]; an API
/// server that cannot be asked is an error, never "gone".
pub async fn lookup_token_state(
    client: &kube::Client,
    token_id: &str,
    now: Timestamp,
) -> Result<TokenState, TokenError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), TOKEN_NAMESPACE);
    let name = token_secret_name(token_id);
    let secret = api.get_opt(&name).await.map_err(|source| TokenError::Api {
        name: name.clone(),
        action: "read",
        source: Box::new(source),
    })?;
    Ok(token_state(secret.as_ref(), now))
}

/// Parses a token lifetime: [`common::token::parse_ttl`] (humantime, whole seconds), its
/// refusal as [`TokenError::Ttl`].
pub fn parse_ttl(text: &str) -> Result<Duration, TokenError> {
    common::token::parse_ttl(text).map_err(|err| TokenError::Ttl {
        text: err.text,
        reason: err.reason,
    })
}

/// The bootstrap token a kubeconfig authenticates with: the token of the current context's
/// user (or of the only user when there is no current context). Read from the file's own
/// auth info, not from a built client config, because the token id must be known whatever
/// transport the client ends up using.
pub fn token_from_kubeconfig(path: &Path) -> Result<BootstrapToken, TokenError> {
    use secrecy::ExposeSecret as _;
    let bad = |reason: String| TokenError::Kubeconfig {
        path: path.to_path_buf(),
        reason,
    };
    let text =
        std::fs::read_to_string(path).map_err(|err| bad(format!("cannot read it: {err}")))?;
    let config = kube::config::Kubeconfig::from_yaml(&text)
        .map_err(|err| bad(format!("not a kubeconfig: {err}")))?;
    let user_name = match config.current_context.as_deref().filter(|c| !c.is_empty()) {
        Some(current) => config
            .contexts
            .iter()
            .find(|c| c.name == current)
            .ok_or_else(|| bad(format!("its current context {current:?} is not defined")))?
            .context
            .as_ref()
            .and_then(|c| c.user.clone())
            .unwrap_or_default(),
        None if config.auth_infos.len() == 1 => config.auth_infos[0].name.clone(),
        None => {
            return Err(bad(
                "it has no current context and more than one user; set current-context".into(),
            ));
        }
    };
    let user = config
        .auth_infos
        .iter()
        .find(|u| u.name == user_name)
        .ok_or_else(|| bad(format!("its user {user_name:?} is not defined")))?;
    let token = user
        .auth_info
        .as_ref()
        .and_then(|a| a.token.as_ref())
        .ok_or_else(|| bad(format!("user {user_name:?} has no bootstrap token")))?;
    BootstrapToken::parse(token.expose_secret())
        .map_err(|err| bad(format!("user {user_name:?}: {err}")))
}

/// What went wrong with a token.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// Not `[a-z0-9]{6}.[a-z0-9]{16}`.
    #[error(transparent)]
    Malformed(#[from] MalformedToken),
    /// A group the bootstrap authenticator would ignore.
    #[error("bootstrap token group {group:?} is invalid: {reason}")]
    InvalidGroup {
        /// The group.
        group: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A TTL that cannot be used.
    #[error("token lifetime {text:?} is invalid: {reason}")]
    Ttl {
        /// The text given.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The API server refused or could not be reached.
    #[error("cannot {action} bootstrap token Secret {TOKEN_NAMESPACE}/{name}")]
    Api {
        /// The Secret's name.
        name: String,
        /// What was being done.
        action: &'static str,
        /// The client's error.
        #[source]
        source: Box<kube::Error>,
    },
    /// The API server answered a create without the object's UID, which owner references
    /// need.
    #[error(
        "the API server created {TOKEN_NAMESPACE}/{name} but returned no metadata.uid; \
         delete the token and retry against a conforming API server"
    )]
    NoUid {
        /// The Secret's name.
        name: String,
    },
    /// A bootstrap kubeconfig that does not carry a usable token.
    #[error("bootstrap kubeconfig {}: {reason}", path.display())]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_are_well_formed_and_distinct() {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let token = BootstrapToken::generate();
            let text = token.to_string();
            assert_eq!(text.len(), 23);
            assert_eq!(BootstrapToken::parse(&text).unwrap(), token);
            assert!(seen.insert(text));
        }
    }

    #[test]
    fn generated_characters_cover_the_alphabet() {
        // 200 tokens draw 4400 characters; every one of 36 symbols must appear, or the
        // draw is not uniform over [a-z0-9].
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let token = BootstrapToken::generate();
            seen.extend(token.id().chars());
            seen.extend(token.secret().chars());
        }
        assert_eq!(seen.len(), 36);
    }

    #[test]
    fn parse_explains_what_is_wrong() {
        let cases = [
            ("abcdef0123456789abcdef", "no '.'"),
            ("abcde.0123456789abcdef", "id is 5 characters"),
            ("abcdef.0123456789abcde", "secret is 15 characters"),
            ("ABCDEF.0123456789abcdef", "contains 'A'"),
            ("abcdef.0123456789abcde_", "position 16"),
        ];
        for (text, want) in cases {
            let err = BootstrapToken::parse(text).unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
        assert!(BootstrapToken::parse(" abcdef.0123456789abcdef\n").is_ok());
    }

    #[test]
    fn a_malformed_secret_half_is_never_quoted() {
        let err = BootstrapToken::parse("abcdef.0123456789abcdE!")
            .unwrap_err()
            .to_string();
        assert!(err.contains("position 15"), "{err}");
        for leaked in ["'E'", "\"E\"", "0123456789abcd", "E!"] {
            assert!(!err.contains(leaked), "quotes the secret ({leaked}): {err}");
        }
        // The public id is still quoted, so a typo there is easy to find.
        let err = BootstrapToken::parse("abcdeF.0123456789abcdef")
            .unwrap_err()
            .to_string();
        assert!(err.contains("'F'"), "{err}");
    }

    #[test]
    fn token_lifetimes_are_checked_not_overflowed() {
        let now = Timestamp::now();
        let hours = |h: u64| Duration::from_secs(h * 3600);
        // 3000000000h ends past the calendar jiff holds (year 9999): an error, not a panic.
        let huge = parse_ttl("3000000000h").unwrap();
        let err = token_expiration(TokenRole::Worker, huge, true, now).unwrap_err();
        assert!(err.to_string().contains("calendar"), "{err}");
        let err = token_expiration(TokenRole::ControlPlane, huge, false, now).unwrap_err();
        assert!(err.to_string().contains("--allow-long-ttl"), "{err}");
        assert_eq!(
            token_expiration(TokenRole::ControlPlane, hours(24), false, now).unwrap(),
            now + jiff::SignedDuration::from_hours(24)
        );
        let err = token_expiration(TokenRole::ControlPlane, hours(25), false, now).unwrap_err();
        assert!(
            err.to_string().contains("24h") && err.to_string().contains("--allow-long-ttl"),
            "{err}"
        );
        assert!(token_expiration(TokenRole::ControlPlane, hours(25), true, now).is_ok());
        assert!(token_expiration(TokenRole::Worker, hours(24 * 30), false, now).is_ok());
        assert!(token_expiration(TokenRole::Worker, Duration::ZERO, true, now).is_err());
        // u64 overflow while parsing is an error as before.
        assert!(parse_ttl("99999999999999999999h").is_err());
    }

    #[test]
    fn debug_hides_the_secret() {
        let token = BootstrapToken::parse("abcdef.0123456789abcdef").unwrap();
        assert_eq!(format!("{token:?}"), "BootstrapToken(abcdef.<redacted>)");
    }

    #[test]
    fn groups_follow_the_authenticator_pattern() {
        for role in [TokenRole::Worker, TokenRole::ControlPlane] {
            for group in role.groups() {
                validate_group(group).unwrap();
            }
        }
        for bad in [
            "system:masters",
            "system:bootstrappers:",
            "system:bootstrappers:Upper",
            "system:bootstrappers:trailing-",
            "system:bootstrappers:trailing:",
            "system:bootstrappers:sp ace",
        ] {
            assert!(validate_group(bad).is_err(), "{bad}");
        }
        let long = format!("system:bootstrappers:{}", "a".repeat(256));
        assert!(validate_group(&long).is_ok());
        let too_long = format!("system:bootstrappers:{}", "a".repeat(257));
        assert!(validate_group(&too_long).is_err());
    }

    #[test]
    fn token_secret_has_the_bootstrap_shape() {
        let token = BootstrapToken::parse("abcdef.0123456789abcdef").unwrap();
        let at = "2030-01-02T03:04:05Z".parse::<Timestamp>().unwrap();
        let secret = token_secret(&token, TokenRole::ControlPlane, at, Some("cp join")).unwrap();
        assert_eq!(
            secret.metadata.name.as_deref(),
            Some("bootstrap-token-abcdef")
        );
        assert_eq!(secret.metadata.namespace.as_deref(), Some("kube-system"));
        assert_eq!(secret.type_.as_deref(), Some(TOKEN_SECRET_TYPE));
        let data = secret.data.unwrap();
        let get = |k: &str| String::from_utf8(data[k].0.clone()).unwrap();
        assert_eq!(get("token-id"), "abcdef");
        assert_eq!(get("token-secret"), "0123456789abcdef");
        assert_eq!(get("expiration"), "2030-01-02T03:04:05Z");
        assert_eq!(get("usage-bootstrap-authentication"), "true");
        assert_eq!(get("usage-bootstrap-signing"), "true");
        assert_eq!(
            get("auth-extra-groups"),
            format!("{WORKER_GROUP},{CONTROL_PLANE_GROUP}")
        );
        assert_eq!(get("description"), "cp join");

        let worker = token_secret(&token, TokenRole::Worker, at, None).unwrap();
        let data = worker.data.unwrap();
        assert_eq!(data["auth-extra-groups"].0, WORKER_GROUP.as_bytes());
        assert!(!data.contains_key("description"));
    }

    #[test]
    fn token_state_judges_expiry() {
        let token = BootstrapToken::parse("abcdef.0123456789abcdef").unwrap();
        let now = Timestamp::now();
        let live = token_secret(
            &token,
            TokenRole::Worker,
            now + jiff::SignedDuration::from_hours(1),
            None,
        )
        .unwrap();
        let expired = token_secret(
            &token,
            TokenRole::Worker,
            now - jiff::SignedDuration::from_secs(1),
            None,
        )
        .unwrap();
        assert_eq!(token_state(Some(&live), now), TokenState::Live);
        assert_eq!(token_state(Some(&expired), now), TokenState::Expired);
        assert_eq!(token_state(None, now), TokenState::Gone);
        let mut garbled = live.clone();
        garbled
            .data
            .as_mut()
            .unwrap()
            .insert("expiration".into(), ByteString(b"tomorrow".to_vec()));
        assert_eq!(token_state(Some(&garbled), now), TokenState::Expired);
        let mut forever = live;
        forever.data.as_mut().unwrap().remove("expiration");
        assert_eq!(token_state(Some(&forever), now), TokenState::Live);
    }

    #[test]
    fn ttl_parses_human_durations() {
        assert_eq!(parse_ttl("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_ttl("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_ttl("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_ttl("1d").unwrap(), Duration::from_secs(86400));
        for bad in ["", "2", "h", "-1h", "2x", "1500ms"] {
            let err = parse_ttl(bad).unwrap_err().to_string();
            assert!(err.contains("write e.g. 2h"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn kubeconfig_token_is_the_current_users() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bootstrap.conf");
        std::fs::write(
            &path,
            r#"
apiVersion: v1
kind: Config
current-context: join
contexts:
- name: join
  context: {cluster: c, user: tls-bootstrap-token-user}
- name: other
  context: {cluster: c, user: admin}
users:
- name: admin
  user: {token: zzzzzz.zzzzzzzzzzzzzzzz}
- name: tls-bootstrap-token-user
  user: {token: abcdef.0123456789abcdef}
"#,
        )
        .unwrap();
        assert_eq!(token_from_kubeconfig(&path).unwrap().id(), "abcdef");

        std::fs::write(
            &path,
            "users:\n- name: u\n  user: {client-certificate-data: eA==}\n",
        )
        .unwrap();
        let err = token_from_kubeconfig(&path).unwrap_err().to_string();
        assert!(err.contains("has no bootstrap token"), "{err}");

        let err = token_from_kubeconfig(&dir.path().join("missing"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot read it"), "{err}");
    }
}
