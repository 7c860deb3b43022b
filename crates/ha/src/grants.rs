//! Encrypted shared-cert grants: how a joining control plane receives the cluster's CA keys
//! without any of them ever sitting readable in the API.
//!
//! `token create --control-plane` mints a bootstrap token and a fresh certificate-key
//! ([`CertKey`]), seals the shared files under that key, and appends the result to the one
//! grant Secret, `kube-system/stratum-certs`:
//!
//! | data key | what |
//! |---|---|
//! | `certs-<token-id>` | one grant: a versioned envelope ([`envelope`]) sealed under that mint's key, bound to the Secret, the entry name and the token id |
//! | `certs` | the legacy flat file map, sealed under the newest key, for joiners that read only it; dropped with the token whose mint sealed it (annotation `outpost.dhnt.io/legacy-entry-token`), so that key opens nothing once its token is over |
//! | `key-proof` | present when the newest bundle carries the at-rest encryption config: opens only under that config ([`published_bundle_carries_key`]) |
//!
//! The joiner reads the Secret with its bootstrap token (the reader Role lets only the
//! control-plane bootstrap group get it, [`grant_certs_reader`]), opens its own entry with
//! the key its join command carries, and writes the files only if everything opened and
//! its check passed ([`download_certs`]).
//!
//! The Secret is owned by every token that minted a live grant (owner references merged by
//! UID), so garbage collection removes it once the last such token is gone. Expired grants
//! are dropped on every upload and by [`prune_expired_grants`]. Every write carries the
//! resourceVersion it read and re-reads on a conflict.
//!
//! Decisions are pure functions in [`plan`] and [`rbac`]; this module is the thin layer that
//! reads and writes through `kube::Api`.

pub mod disk;
pub mod fence_policy;
// The pure parts live in `hacore` (no kube client in its tree); re-exported here.
pub use hacore::grants::{envelope, plan};
pub mod rbac;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, PostParams};

pub use disk::{ENCRYPTION_CONFIG_FILE, read_bundle_files};
pub use envelope::{Bundle, CertKey, CertKeyError, EntryBinding, EnvelopeError};
pub use plan::{
    BudgetExceeded, GRANT_SECRET_BUDGET, KEY_SET_AT_ANNOTATION, LEGACY_ENTRY, NAMESPACE,
    PROOF_ENTRY, SECRET_NAME, SECRET_REF, grant_entry_name,
};
pub use rbac::{READER_NAME, grant_certs_reader, narrow_certs_reader_binding};

use crate::tokens::{
    MintedToken, TokenError, TokenState, lookup_token_state, token_from_kubeconfig,
};

/// An error a caller's `confirm` or `check` returns.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How many times a write is attempted before conflicts are reported.
pub const MAX_WRITE_ATTEMPTS: u32 = 8;

/// A `confirm` for callers that hold no fence.
pub async fn no_confirm() -> Result<(), BoxError> {
    Ok(())
}

/// What went wrong with a grant, naming the Secret, the entry or the file.
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    /// An entry did not open or did not parse.
    #[error("grant entry {entry:?} of {secret} cannot be opened (nothing was written)")]
    Entry {
        /// `namespace/name` of the Secret.
        secret: String,
        /// The data key.
        entry: String,
        /// Why.
        #[source]
        source: EnvelopeError,
    },
    /// The grant Secret does not exist.
    #[error(
        "{SECRET_REF} does not exist: no control-plane join is published (or it was deleted \
         once every granting token expired); mint one with `stratum-server token create \
         --control-plane`"
    )]
    NoSecret,
    /// The Secret exists but holds no entry for this token.
    #[error(
        "{SECRET_REF} has no entry {entry:?}: the grant of token {token_id} expired and was \
         pruned, or a rekey or CA rotation retired it; mint a new join command with \
         `stratum-server token create --control-plane`"
    )]
    NoEntry {
        /// The entry looked for.
        entry: String,
        /// The token it belongs to.
        token_id: String,
    },
    /// An opened bundle names a file outside the shared set.
    #[error(
        "grant entry {entry:?} carries {path:?}, which is not part of the shared control-plane \
         set; refusing the whole bundle, nothing was written"
    )]
    UnexpectedFile {
        /// The entry.
        entry: String,
        /// The offending path.
        path: String,
    },
    /// An opened bundle lacks a shared file.
    #[error(
        "grant entry {entry:?} lacks {path:?}; the publishing control plane's pki dir was \
         incomplete: re-run the upload there. Nothing was written"
    )]
    IncompleteBundle {
        /// The entry.
        entry: String,
        /// The missing path.
        path: String,
    },
    /// The caller's check refused the bundle.
    #[error("the downloaded bundle was refused (nothing was written)")]
    Check {
        /// The check's error.
        #[source]
        source: BoxError,
    },
    /// The caller's confirm refused the write.
    #[error("the publication was refused before writing {SECRET_REF} (nothing was written)")]
    Confirm {
        /// The confirm's error.
        #[source]
        source: BoxError,
    },
    /// A rekey was asked to the key already set.
    #[error(
        "{SECRET_REF} is already sealed under this certificate-key: a rekey to the same key \
         retires nothing; generate a fresh one (CertKey::generate). Nothing was written"
    )]
    SameKey,
    /// The publication would not fit.
    #[error(transparent)]
    Budget(#[from] BudgetExceeded),
    /// The Secret's generation cannot be incremented.
    #[error(transparent)]
    Generation(#[from] plan::GenerationExhausted),
    /// A bundle could not be encoded.
    #[error("cannot seal the bundle")]
    Seal(#[source] EnvelopeError),
    /// Writes kept conflicting.
    #[error(
        "{object} kept changing under this write ({attempts} attempts, each from a fresh \
         read); another writer is busy: retry in a moment"
    )]
    Conflict {
        /// The object.
        object: String,
        /// Attempts made.
        attempts: u32,
    },
    /// The API server refused or could not be asked.
    #[error("cannot {action} {object}")]
    Api {
        /// What was being done.
        action: &'static str,
        /// The object.
        object: String,
        /// The client's error.
        #[source]
        source: Box<kube::Error>,
    },
    /// A token problem (lookup, kubeconfig).
    #[error(transparent)]
    Token(#[from] TokenError),
    /// The maintenance fence Lease could not be written.
    #[error(transparent)]
    Fence(#[from] crate::fence::FenceError),
    /// The join fence policy was written but the API server did not enforce it in time: the
    /// Role that lets the bootstrap group update the fence was not written.
    #[error(
        "the admission policy {policy} is stored but not enforced after {}s (a dry-run probe \
         was still admitted); the API server needs ValidatingAdmissionPolicy \
         (admissionregistration.k8s.io/v1, Kubernetes 1.30+). The reader Role was not written: \
         run this again once the policy is enforced",
        waited.as_secs()
    )]
    PolicyNotEnforced {
        /// The policy's name.
        policy: &'static str,
        /// How long it was waited for.
        waited: std::time::Duration,
    },
    /// The pki dir could not be read.
    #[error(transparent)]
    Pki(#[from] pki::PkiError),
    /// A file could not be read or written.
    #[error("{op} {}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A kubeconfig could not be turned into a client.
    #[error("kubeconfig {}: {reason}", path.display())]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

fn secret_api_error(action: &'static str) -> impl Fn(kube::Error) -> GrantError {
    move |source| GrantError::Api {
        action,
        object: format!("Secret {SECRET_REF}"),
        source: Box::new(source),
    }
}

/// The token whose grant an upload appends, and the owner reference it adds.
#[derive(Debug, Clone)]
pub struct GrantOwner {
    /// The bootstrap token id: names the entry and is bound into it.
    pub token_id: String,
    /// The reference to its Secret.
    pub reference: OwnerReference,
}

impl From<&MintedToken> for GrantOwner {
    fn from(minted: &MintedToken) -> Self {
        GrantOwner {
            token_id: minted.token.id().to_string(),
            reference: minted.owner_reference(),
        }
    }
}

/// The cluster facts a publication records beside the files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UploadProfile {
    /// The cluster VIP, if any.
    pub vip: Option<String>,
    /// The etcd client endpoints a joiner adds its member through.
    pub etcd_endpoints: Vec<String>,
}

/// What a download found: the facts of the bundle, before (for `check`) and after writing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleProfile {
    /// The entry opened (`certs-<id>`, or `certs` for the legacy map).
    pub entry: String,
    /// Whether it was the legacy flat map, whose facts are inferred rather than sealed.
    pub legacy: bool,
    /// The publication's generation (0 for the legacy map, which records none).
    pub generation: u64,
    /// Whether the bundle itself carried the at-rest encryption config: a fact about the
    /// download, not the disk, where a key left by an earlier attempt may survive.
    pub carries_encryption_key: bool,
    /// The VIP the publisher recorded (never for the legacy map).
    pub vip: Option<String>,
    /// The etcd client endpoints the publisher recorded (none for the legacy map).
    pub etcd_endpoints: Vec<String>,
    /// The files, by relative path.
    pub files: Vec<String>,
}

/// What an upload wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The grant entry appended (`None` for a re-upload or rekey).
    pub entry: Option<String>,
    /// The generation sealed.
    pub generation: u64,
    /// The grant entries dropped in the same update (expired or gone tokens, or all on a
    /// re-upload).
    pub dropped: Vec<String>,
    /// The Secret's resourceVersion after the write.
    pub resource_version: Option<String>,
}

/// Builds a client from a kubeconfig file (its current context).
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client, GrantError> {
    let bad = |reason: String| GrantError::Kubeconfig {
        path: path.to_path_buf(),
        reason,
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .map_err(|e| bad(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| bad(e.to_string()))
}

fn binding<'a>(entry: &'a str, token_id: &'a str) -> EntryBinding<'a> {
    EntryBinding {
        secret: SECRET_REF,
        entry,
        token_id,
    }
}

fn is_write_race(err: &kube::Error) -> bool {
    // Conflict: someone wrote since our read. AlreadyExists: someone created it first.
    // NotFound on a replace: garbage collection deleted it since our read.
    matches!(err, kube::Error::Api(s) if s.is_conflict() || s.is_already_exists() || s.is_not_found())
}

async fn backoff(attempt: u32) {
    tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt))).await;
}

/// The states of the tokens of every grant in `observed`, `known` added as live.
async fn grant_token_states(
    client: &kube::Client,
    observed: Option<&Secret>,
    known_live: Option<&str>,
    now: Timestamp,
) -> Result<BTreeMap<String, TokenState>, GrantError> {
    let mut states = BTreeMap::new();
    let mut ids = plan::grant_token_ids(observed);
    // The token whose mint sealed the legacy entry: its key must stop opening that entry
    // when it expires, even with its own grant entry already gone.
    if let Some(legacy) = plan::legacy_token_id(observed)
        && !ids.contains(&legacy)
    {
        ids.push(legacy);
    }
    for id in ids {
        if Some(id.as_str()) == known_live {
            continue;
        }
        let state = lookup_token_state(client, &id, now).await?;
        states.insert(id, state);
    }
    if let Some(id) = known_live {
        states.insert(id.to_string(), TokenState::Live);
    }
    Ok(states)
}

struct PublishRequest<'a> {
    cert_key: &'a CertKey,
    owner: Option<&'a GrantOwner>,
    files: &'a BTreeMap<String, Vec<u8>>,
    profile: &'a UploadProfile,
    retire_all_grants: bool,
}

async fn publish<F, Fut>(
    client: &kube::Client,
    request: PublishRequest<'_>,
    mut confirm: F,
) -> Result<Published, GrantError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), BoxError>>,
{
    let api: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let encryption_config = request.files.get(ENCRYPTION_CONFIG_FILE);
    let mut reader_granted = false;
    for attempt in 1..=MAX_WRITE_ATTEMPTS {
        let observed = api
            .get_opt(SECRET_NAME)
            .await
            .map_err(secret_api_error("read"))?;
        let now = Timestamp::now();
        let owner_id = request.owner.map(|o| o.token_id.as_str());
        let tokens = grant_token_states(client, observed.as_ref(), owner_id, now).await?;
        let generation = plan::next_generation(observed.as_ref())?;
        let grant = match request.owner {
            Some(owner) => {
                let entry = grant_entry_name(&owner.token_id);
                let bundle = Bundle {
                    files: request.files.clone(),
                    generation,
                    carries_encryption_key: encryption_config.is_some(),
                    vip: request.profile.vip.clone(),
                    etcd_endpoints: request.profile.etcd_endpoints.clone(),
                };
                let sealed = envelope::seal_bundle(
                    request.cert_key,
                    binding(&entry, &owner.token_id),
                    &bundle,
                )
                .map_err(GrantError::Seal)?;
                Some((entry, sealed))
            }
            None => None,
        };
        let entry = grant.as_ref().map(|(e, _)| e.clone());
        let publication = plan::Publication {
            grant,
            legacy: envelope::seal_legacy(request.cert_key, request.files),
            proof: encryption_config.map(|config| {
                envelope::seal_key_proof(config, binding(PROOF_ENTRY, ""), generation)
            }),
            generation,
            owner: request.owner.map(|o| o.reference.clone()),
            legacy_token: owner_id.map(str::to_string),
            retire_all_grants: request.retire_all_grants,
            now,
        };
        let desired =
            plan::plan_publication(observed.as_ref(), publication, &tokens, GRANT_SECRET_BUDGET)?;
        let dropped: Vec<String> = plan::grant_token_ids(observed.as_ref())
            .into_iter()
            .map(|id| grant_entry_name(&id))
            .filter(|e| !desired.data.as_ref().is_some_and(|d| d.contains_key(e)))
            .collect();
        // The reader grant goes before the Secret it lets joiners read, but only once the
        // publication is known to fit: a refused upload writes nothing at all.
        if !reader_granted {
            grant_certs_reader(client).await?;
            reader_granted = true;
        }
        // Last thing before the write, on every attempt: a fence lost while the reads above
        // stalled must stop this write, not the next one.
        confirm()
            .await
            .map_err(|source| GrantError::Confirm { source })?;
        let written = match observed {
            None => api.create(&PostParams::default(), &desired).await,
            Some(_) => {
                api.replace(SECRET_NAME, &PostParams::default(), &desired)
                    .await
            }
        };
        match written {
            Ok(secret) => {
                tracing::info!(
                    secret = SECRET_REF,
                    entry = entry.as_deref().unwrap_or(LEGACY_ENTRY),
                    generation,
                    dropped = dropped.len(),
                    "published shared certs"
                );
                return Ok(Published {
                    entry,
                    generation,
                    dropped,
                    resource_version: secret.metadata.resource_version,
                });
            }
            Err(err) if is_write_race(&err) => {
                tracing::debug!(attempt, error = %err, "grant Secret changed under the write; re-reading");
                backoff(attempt).await;
            }
            Err(err) => return Err(secret_api_error("write")(err)),
        }
    }
    Err(GrantError::Conflict {
        object: format!("Secret {SECRET_REF}"),
        attempts: MAX_WRITE_ATTEMPTS,
    })
}

/// Publishes `files` as `owner`'s grant under `cert_key`: appends `certs-<token-id>`,
/// re-seals the legacy entry under this key, drops the grants of expired or gone tokens,
/// merges `owner` into the owner references and makes sure the reader Role and binding
/// exist. Refuses, before writing, a grant the Secret cannot hold. `confirm` runs
/// immediately before each write attempt; an error from it aborts with nothing written.
pub async fn upload_certs<F, Fut>(
    client: &kube::Client,
    cert_key: &CertKey,
    owner: &GrantOwner,
    files: &BTreeMap<String, Vec<u8>>,
    profile: &UploadProfile,
    confirm: F,
) -> Result<Published, GrantError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), BoxError>>,
{
    disk::validate_files(&grant_entry_name(&owner.token_id), files)?;
    publish(
        client,
        PublishRequest {
            cert_key,
            owner: Some(owner),
            files,
            profile,
            retire_all_grants: false,
        },
        confirm,
    )
    .await
}

/// Re-publishes the current shared material of `pki_dir` under `cert_key` (after a CA
/// rotation): the legacy entry only, every grant entry removed in the same update, owner
/// references kept as read. Join commands minted before it fail at decryption, before
/// they change anything; mint new ones.
pub async fn re_upload_certs(
    client: &kube::Client,
    pki_dir: &Path,
    cert_key: &CertKey,
    profile: &UploadProfile,
) -> Result<Published, GrantError> {
    rekey_shared_certs(client, pki_dir, cert_key, profile, no_confirm).await
}

/// Replaces the shared bundle with one under `cert_key` and removes every per-token entry
/// in one update, so no earlier certificate-key opens anything any more. The key already
/// set is refused ([`GrantError::SameKey`]): that "rekey" would retire nothing. `confirm` is the
/// caller's fence recheck, run immediately before each write attempt.
pub async fn rekey_shared_certs<F, Fut>(
    client: &kube::Client,
    pki_dir: &Path,
    cert_key: &CertKey,
    profile: &UploadProfile,
    confirm: F,
) -> Result<Published, GrantError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), BoxError>>,
{
    let files = read_bundle_files(pki_dir)?;
    refuse_current_key(client, cert_key).await?;
    publish(
        client,
        PublishRequest {
            cert_key,
            owner: None,
            files: &files,
            profile,
            retire_all_grants: true,
        },
        confirm,
    )
    .await
}

/// Refuses a rekey to the key already set: the legacy entry is sealed under the newest
/// key, so if it opens under `cert_key` the rekey would retire nothing the old key opens.
async fn refuse_current_key(client: &kube::Client, cert_key: &CertKey) -> Result<(), GrantError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let Some(secret) = api
        .get_opt(SECRET_NAME)
        .await
        .map_err(secret_api_error("read"))?
    else {
        return Ok(());
    };
    let legacy = secret.data.as_ref().and_then(|d| d.get(LEGACY_ENTRY));
    if legacy.is_some_and(|sealed| envelope::open_legacy(cert_key, &sealed.0).is_ok()) {
        return Err(GrantError::SameKey);
    }
    Ok(())
}

async fn read_grant_secret(client: &kube::Client) -> Result<Secret, GrantError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    api.get_opt(SECRET_NAME)
        .await
        .map_err(secret_api_error("read"))?
        .ok_or(GrantError::NoSecret)
}

/// Downloads this join's grant: the token in `bootstrap_kubeconfig` names the entry
/// (`certs-<token-id>`), so a later mint moving the legacy entry to a newer key does not
/// break it. Opens it with `cert_key`, runs `check` on its profile, and only then writes the
/// files into `pki_dir`, staged whole beside it and switched in with one directory swap
/// ([`disk::write_bundle_files`]); on any failure nothing is written and no copy of a key
/// is left behind.
pub async fn download_certs<C>(
    bootstrap_kubeconfig: &Path,
    pki_dir: &Path,
    cert_key: &CertKey,
    check: C,
) -> Result<BundleProfile, GrantError>
where
    C: FnOnce(&BundleProfile) -> Result<(), BoxError>,
{
    let token = token_from_kubeconfig(bootstrap_kubeconfig)?;
    let client = client_from_kubeconfig(bootstrap_kubeconfig).await?;
    download_grant(&client, token.id(), pki_dir, cert_key, check).await
}

/// [`download_certs`] with a client and token id in hand.
pub async fn download_grant<C>(
    client: &kube::Client,
    token_id: &str,
    pki_dir: &Path,
    cert_key: &CertKey,
    check: C,
) -> Result<BundleProfile, GrantError>
where
    C: FnOnce(&BundleProfile) -> Result<(), BoxError>,
{
    let secret = read_grant_secret(client).await?;
    let entry = grant_entry_name(token_id);
    let sealed = secret
        .data
        .as_ref()
        .and_then(|d| d.get(&entry))
        .ok_or_else(|| GrantError::NoEntry {
            entry: entry.clone(),
            token_id: token_id.to_string(),
        })?;
    let bundle = envelope::open_bundle(cert_key, binding(&entry, token_id), &sealed.0).map_err(
        |source| GrantError::Entry {
            secret: SECRET_REF.into(),
            entry: entry.clone(),
            source,
        },
    )?;
    disk::validate_files(&entry, &bundle.files)?;
    let profile = BundleProfile {
        entry,
        legacy: false,
        generation: bundle.generation,
        carries_encryption_key: bundle.carries_encryption_key,
        vip: bundle.vip.clone(),
        etcd_endpoints: bundle.etcd_endpoints.clone(),
        files: bundle.files.keys().cloned().collect(),
    };
    check(&profile).map_err(|source| GrantError::Check { source })?;
    disk::write_bundle_files(pki_dir, &bundle.files)?;
    tracing::info!(entry = %profile.entry, generation = profile.generation, pki_dir = %pki_dir.display(), "downloaded shared certs");
    Ok(profile)
}

/// Downloads the legacy entry with an admin client: for a control plane that is already
/// joined (no bootstrap token, so no grant of its own) pulling re-uploaded material.
pub async fn download_certs_admin(
    client: &kube::Client,
    pki_dir: &Path,
    cert_key: &CertKey,
) -> Result<BundleProfile, GrantError> {
    let secret = read_grant_secret(client).await?;
    let sealed = secret
        .data
        .as_ref()
        .and_then(|d| d.get(LEGACY_ENTRY))
        .ok_or_else(|| GrantError::NoEntry {
            entry: LEGACY_ENTRY.into(),
            token_id: "(none: admin download)".into(),
        })?;
    let entry_error = |source| GrantError::Entry {
        secret: SECRET_REF.into(),
        entry: LEGACY_ENTRY.into(),
        source,
    };
    let files = envelope::open_legacy(cert_key, &sealed.0).map_err(entry_error)?;
    disk::validate_files(LEGACY_ENTRY, &files)?;
    let profile = BundleProfile {
        entry: LEGACY_ENTRY.into(),
        legacy: true,
        generation: 0,
        carries_encryption_key: files.contains_key(ENCRYPTION_CONFIG_FILE),
        vip: None,
        etcd_endpoints: Vec::new(),
        files: files.keys().cloned().collect(),
    };
    disk::write_bundle_files(pki_dir, &files)?;
    Ok(profile)
}

/// Drops the grant entries whose token expired or is gone, keeping the legacy entry, every
/// live grant and the owner references as read. Writes nothing when nothing expired, and
/// leaves an absent Secret absent. Returns the entries dropped.
pub async fn prune_expired_grants(client: &kube::Client) -> Result<Vec<String>, GrantError> {
    prune_expired_grants_at(client, Timestamp::now).await
}

/// [`prune_expired_grants`] with the clock token expiry is judged against.
pub async fn prune_expired_grants_at(
    client: &kube::Client,
    now: impl Fn() -> Timestamp,
) -> Result<Vec<String>, GrantError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    for attempt in 1..=MAX_WRITE_ATTEMPTS {
        let Some(observed) = api
            .get_opt(SECRET_NAME)
            .await
            .map_err(secret_api_error("read"))?
        else {
            return Ok(Vec::new());
        };
        let tokens = grant_token_states(client, Some(&observed), None, now()).await?;
        let Some(desired) = plan::plan_prune(&observed, &tokens) else {
            return Ok(Vec::new());
        };
        let dropped: Vec<String> = plan::expired_grant_entries(Some(&observed), &tokens)
            .into_iter()
            .collect();
        match api
            .replace(SECRET_NAME, &PostParams::default(), &desired)
            .await
        {
            Ok(_) => {
                tracing::info!(secret = SECRET_REF, ?dropped, "pruned expired grants");
                return Ok(dropped);
            }
            Err(err) if is_write_race(&err) => backoff(attempt).await,
            Err(err) => return Err(secret_api_error("write")(err)),
        }
    }
    Err(GrantError::Conflict {
        object: format!("Secret {SECRET_REF}"),
        attempts: MAX_WRITE_ATTEMPTS,
    })
}

/// When the grant Secret's certificate-key was last set: its annotation, else (a Secret
/// written before the annotation existed) its creation time. `None` when there is no
/// Secret.
pub async fn shared_certs_key_set_at(
    client: &kube::Client,
) -> Result<Option<Timestamp>, GrantError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let Some(secret) = api
        .get_opt(SECRET_NAME)
        .await
        .map_err(secret_api_error("read"))?
    else {
        return Ok(None);
    };
    let annotated = secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(KEY_SET_AT_ANNOTATION))
        .and_then(|v| v.trim().parse::<Timestamp>().ok());
    let created = secret.metadata.creation_timestamp.map(|t| t.0);
    Ok(annotated.or(created))
}

/// Whether a join bundle is published, and whether it carries this node's at-rest key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundleKeyState {
    /// The grant Secret exists.
    pub published: bool,
    /// Its key proof opens under this node's encryption config.
    pub carries: bool,
}

/// Answers, from the Secret a join would download, whether a bundle is published and
/// whether it carries `encryption_config` (this node's, or `None` when it has none yet).
/// "Carries" is a decryption of the key proof, not a label anyone with write access could
/// forge; a proof that does not open is "no", not an error. A Secret that cannot be read is
/// an error.
pub async fn published_bundle_carries_key(
    client: &kube::Client,
    encryption_config: Option<&[u8]>,
) -> Result<BundleKeyState, GrantError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let Some(secret) = api
        .get_opt(SECRET_NAME)
        .await
        .map_err(secret_api_error("read"))?
    else {
        return Ok(BundleKeyState {
            published: false,
            carries: false,
        });
    };
    let proof = secret.data.as_ref().and_then(|d| d.get(PROOF_ENTRY));
    let carries = match (encryption_config, proof) {
        (Some(config), Some(proof)) => envelope::key_proof_opens(
            config,
            binding(PROOF_ENTRY, ""),
            &proof.0,
            plan::observed_generation(Some(&secret)),
        ),
        _ => false,
    };
    Ok(BundleKeyState {
        published: true,
        carries,
    })
}
