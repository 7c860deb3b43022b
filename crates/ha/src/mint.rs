//! `token create`'s mint protocol, as a library: narrow the grant reader binding, ensure
//! the discovery objects (cluster-info and its anonymous reader), mint the token, and for
//! a control-plane token publish the shared certs as its encrypted grant, deleting the
//! token again when that publication fails (a control-plane token without its grant
//! joins nothing and must not stay live).

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;

use crate::bootstrap::{PublishError, ServerPolicy, ensure_discovery_with};
use crate::grants::{self, CertKey, GrantError, GrantOwner, UploadProfile};
use crate::tokens::{self, MintedToken, TokenError, TokenRequest, TokenRole};

/// The grant a control-plane token carries: the shared files and the facts recorded
/// beside them.
#[derive(Clone)]
pub struct GrantRequest {
    /// The shared control-plane files ([`grants::read_bundle_files`]).
    pub files: BTreeMap<String, Vec<u8>>,
    /// The VIP and etcd endpoints recorded in the grant.
    pub profile: UploadProfile,
}

impl std::fmt::Debug for GrantRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The files hold the CA keys: names only.
        f.debug_struct("GrantRequest")
            .field("files", &self.files.keys().collect::<Vec<_>>())
            .field("profile", &self.profile)
            .finish()
    }
}

/// What joiners discover the cluster by: the API server URL and CA that
/// `kube-public/cluster-info` must publish ([`crate::bootstrap::ensure_discovery`]).
#[derive(Clone)]
pub struct Discovery {
    /// `https://HOST:PORT`, the address joiners are told to dial.
    pub server: String,
    /// The cluster CA (PEM).
    pub ca_pem: Vec<u8>,
    /// Whether `server` replaces a published cluster-info's server that carries the same
    /// CA ([`ServerPolicy`]).
    pub policy: ServerPolicy,
}

impl std::fmt::Debug for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovery")
            .field("server", &self.server)
            .field("ca_pem_bytes", &self.ca_pem.len())
            .field("policy", &self.policy)
            .finish()
    }
}

/// What to mint.
#[derive(Debug, Clone)]
pub struct MintRequest<'a> {
    /// The discovery objects every token relies on (ensured before the token exists, so
    /// the signer signs cluster-info for it).
    pub discovery: Discovery,
    /// How long the token (and its grant) lives.
    pub ttl: Duration,
    /// Let a control-plane token live longer than [`tokens::MAX_CONTROL_PLANE_TTL`].
    pub allow_long_ttl: bool,
    /// Stored on the token Secret.
    pub description: Option<&'a str>,
    /// `Some` mints a control-plane token and publishes this grant for it; `None` mints a
    /// worker token.
    pub grant: Option<GrantRequest>,
}

impl MintRequest<'_> {
    /// Worker or control plane, by whether a grant is asked for.
    pub fn role(&self) -> TokenRole {
        if self.grant.is_some() {
            TokenRole::ControlPlane
        } else {
            TokenRole::Worker
        }
    }

    /// When the token would expire if minted at `now`; refuses (pure, before anything is
    /// asked of the API) a zero TTL, a long control-plane TTL not allowed, and a TTL past
    /// the calendar.
    pub fn expiration(&self, now: Timestamp) -> Result<Timestamp, TokenError> {
        tokens::token_expiration(self.role(), self.ttl, self.allow_long_ttl, now)
    }
}

/// A minted token, with the certificate-key of its grant for a control-plane token.
#[derive(Debug)]
pub struct Minted {
    /// The token, its expiration and its Secret's UID.
    pub token: MintedToken,
    /// The key that opens the token's grant (control plane only). It decrypts the CA
    /// keys: its Debug is redacted.
    pub cert_key: Option<CertKey>,
    /// How many discovery objects this mint wrote (0 when they were already right).
    pub discovery_writes: usize,
}

/// What the token Secret became after a failed grant publication.
#[derive(Debug)]
pub enum Cleanup {
    /// Deleted again: nothing is left live.
    Deleted,
    /// Could not be deleted: the operator must delete it.
    Failed(TokenError),
}

impl std::fmt::Display for Cleanup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cleanup::Deleted => f.write_str("the token was deleted again"),
            Cleanup::Failed(e) => write!(
                f,
                "the token could not be deleted ({}): delete it by hand",
                crate::error_chain(e)
            ),
        }
    }
}

/// A mint that failed, at the step it names.
#[derive(Debug, thiserror::Error)]
pub enum MintError {
    /// Refused before anything was asked of the API (the TTL).
    #[error("refused before minting anything")]
    Refused(#[source] TokenError),
    /// The grant reader binding could not be narrowed; nothing was minted.
    #[error("cannot narrow the grant reader binding; nothing was minted")]
    Narrow(#[source] GrantError),
    /// cluster-info or its anonymous reader could not be ensured; nothing was minted.
    #[error("cannot publish the discovery objects joiners need; nothing was minted")]
    Discovery(#[source] PublishError),
    /// The token could not be created.
    #[error("cannot mint the bootstrap token")]
    Token(#[source] TokenError),
    /// The grant of a control-plane token could not be published; [`Cleanup`] says what
    /// became of the token.
    #[error(
        "cannot publish the shared certs for control-plane token {token_id} \
         (kube-system/bootstrap-token-{token_id}); {cleanup}"
    )]
    Grant {
        /// The token minted.
        token_id: String,
        /// Why the publication failed.
        #[source]
        source: GrantError,
        /// Whether the token was deleted again.
        cleanup: Cleanup,
    },
}

/// Mints a token as `req` asks, at `now`: refuses a bad TTL before any API call, narrows
/// an older, broader grant reader binding (every mint does, not only control-plane ones),
/// ensures the discovery objects ([`ensure_discovery_with`]: cluster-info with the server and
/// CA, readable anonymously and nothing else), creates the token Secret (with
/// `usage-bootstrap-signing`, `usage-bootstrap-authentication` and its role's
/// `auth-extra-groups`), and for a control-plane token publishes its grant under a
/// fresh certificate-key. When that publication fails the token is deleted again (by UID)
/// and [`MintError::Grant`] says whether the delete worked.
pub async fn mint(
    client: &kube::Client,
    req: &MintRequest<'_>,
    now: Timestamp,
) -> Result<Minted, MintError> {
    req.expiration(now).map_err(MintError::Refused)?;
    grants::narrow_certs_reader_binding(client)
        .await
        .map_err(MintError::Narrow)?;
    let discovery_writes = ensure_discovery_with(
        client,
        &req.discovery.server,
        &req.discovery.ca_pem,
        req.discovery.policy,
    )
    .await
    .map_err(MintError::Discovery)?;
    let token = tokens::mint_token(
        client,
        &TokenRequest {
            role: req.role(),
            ttl: req.ttl,
            description: req.description,
            allow_long_ttl: req.allow_long_ttl,
        },
        now,
    )
    .await
    .map_err(MintError::Token)?;
    let Some(grant) = &req.grant else {
        return Ok(Minted {
            token,
            cert_key: None,
            discovery_writes,
        });
    };
    let key = CertKey::generate();
    let owner = GrantOwner::from(&token);
    match grants::upload_certs(
        client,
        &key,
        &owner,
        &grant.files,
        &grant.profile,
        grants::no_confirm,
    )
    .await
    {
        Ok(_) => Ok(Minted {
            token,
            cert_key: Some(key),
            discovery_writes,
        }),
        Err(source) => {
            let cleanup = match tokens::delete_token(client, &token).await {
                Ok(()) => Cleanup::Deleted,
                Err(e) => Cleanup::Failed(e),
            };
            tracing::warn!(token_id = %token.token.id(), %cleanup, "grant publication failed");
            Err(MintError::Grant {
                token_id: token.token.id().to_string(),
                source,
                cleanup,
            })
        }
    }
}
