//! The decisions about the grant Secret, as pure functions over what was read: which entries
//! stay, which go, whose owner references it carries, and whether it still fits.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::tokens::TokenState;
use common::token::is_token_id;

/// Namespace of the grant Secret.
pub const NAMESPACE: &str = "kube-system";
/// Name of the grant Secret.
pub const SECRET_NAME: &str = "stratum-certs";
/// `namespace/name` of the grant Secret, as bound into every sealed entry.
pub const SECRET_REF: &str = "kube-system/stratum-certs";
/// The legacy entry: a flat file map under the newest key.
pub const LEGACY_ENTRY: &str = "certs";
/// Prefix of a grant entry; the token id follows.
pub const GRANT_ENTRY_PREFIX: &str = "certs-";
/// The entry proving which at-rest encryption config the newest bundle carries.
pub const PROOF_ENTRY: &str = "key-proof";
/// The generation of the newest publication.
pub use common::keys::GENERATION_ANNOTATION;
/// When the certificate-key of the legacy entry was last set (RFC 3339).
pub use common::keys::KEY_SET_AT_ANNOTATION;
/// kube-apiserver refuses a Secret whose data values add up to more than this.
pub const SECRET_SIZE_LIMIT: usize = 1024 * 1024;
/// What the grant Secret's data may add up to: the API limit less 128 KiB, so the legacy
/// entry, the key proof and a grown file set (a CA rotation's staged CAs roughly double
/// it) still fit after a grant was accepted, and the whole object stays clear of etcd's
/// 1.5 MiB request limit once base64 and metadata are added.
pub const GRANT_SECRET_BUDGET: usize = SECRET_SIZE_LIMIT - 128 * 1024;

/// `certs-<token-id>`.
pub fn grant_entry_name(token_id: &str) -> String {
    format!("{GRANT_ENTRY_PREFIX}{token_id}")
}

/// The token id a data key names, when it is a grant entry.
pub fn grant_token_id(entry: &str) -> Option<&str> {
    entry
        .strip_prefix(GRANT_ENTRY_PREFIX)
        .filter(|id| is_token_id(id))
}

/// The token ids of every grant entry in `secret`, sorted.
pub fn grant_token_ids(secret: Option<&Secret>) -> Vec<String> {
    secret
        .and_then(|s| s.data.as_ref())
        .map(|data| {
            data.keys()
                .filter_map(|k| grant_token_id(k))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The generation recorded on the Secret; 0 when absent or unreadable, so the next
/// publication is 1 either way.
pub fn observed_generation(secret: Option<&Secret>) -> u64 {
    secret
        .and_then(|s| s.metadata.annotations.as_ref())
        .and_then(|a| a.get(GENERATION_ANNOTATION))
        .and_then(|g| g.trim().parse().ok())
        .unwrap_or(0)
}

/// The generation the next publication seals: one more than the Secret's. A Secret whose
/// annotation is already at `u64::MAX` (only an edit by hand gets it there) is refused
/// rather than wrapped to 0 or panicking.
pub fn next_generation(secret: Option<&Secret>) -> Result<u64, GenerationExhausted> {
    let observed = observed_generation(secret);
    observed
        .checked_add(1)
        .ok_or(GenerationExhausted { observed })
}

/// The Secret's generation annotation cannot be incremented.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the grant Secret {SECRET_REF} records generation {observed} in its {GENERATION_ANNOTATION} \
     annotation, which cannot be incremented; it was edited by hand: set the annotation to 0 \
     (or delete the Secret and publish again). Nothing was written"
)]
pub struct GenerationExhausted {
    /// The generation found.
    pub observed: u64,
}

/// The grant entries to drop: those whose token is expired or gone. A grant whose token
/// state is not in `tokens` is kept: not knowing is not a reason to destroy a live join.
pub fn expired_grant_entries(
    secret: Option<&Secret>,
    tokens: &BTreeMap<String, TokenState>,
) -> BTreeSet<String> {
    let Some(data) = secret.and_then(|s| s.data.as_ref()) else {
        return BTreeSet::new();
    };
    data.keys()
        .filter(|entry| {
            grant_token_id(entry).is_some_and(|id| {
                matches!(tokens.get(id), Some(TokenState::Expired | TokenState::Gone))
            })
        })
        .cloned()
        .collect()
}

/// `existing` plus `add`, deduplicated by UID, never dropping or reordering what was there:
/// a later mint must not shorten an earlier token's hold on the Secret.
pub fn merge_owner_references(
    existing: &[OwnerReference],
    add: Option<&OwnerReference>,
) -> Vec<OwnerReference> {
    let mut merged: Vec<OwnerReference> = Vec::with_capacity(existing.len() + 1);
    for reference in existing.iter().chain(add) {
        if !merged.iter().any(|r| r.uid == reference.uid) {
            merged.push(reference.clone());
        }
    }
    merged
}

/// The size kube-apiserver's Secret validation counts: the sum of the data values' lengths.
pub fn data_size(data: &BTreeMap<String, ByteString>) -> usize {
    data.values().map(|v| v.0.len()).sum()
}

/// A publication the grant Secret cannot hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the grant Secret {SECRET_REF} would hold {size} bytes with this publication, over its \
     {budget}-byte budget (Secrets are capped at {SECRET_SIZE_LIMIT} bytes); {grants} grant(s) \
     are pending. Nothing was written. Delete control-plane tokens that will not be used \
     (`kubectl -n kube-system delete secret bootstrap-token-<id>`) or wait for them to expire, \
     then mint again"
)]
pub struct BudgetExceeded {
    /// The size the Secret's data would have.
    pub size: usize,
    /// The budget.
    pub budget: usize,
    /// How many grant entries it would hold.
    pub grants: usize,
}

/// What one publication writes into the grant Secret.
#[derive(Debug, Clone)]
pub struct Publication {
    /// This mint's own grant entry (name, sealed bytes); `None` for a re-upload or rekey.
    pub grant: Option<(String, Vec<u8>)>,
    /// The legacy flat map, sealed under this publication's key.
    pub legacy: Vec<u8>,
    /// The key proof, when the bundle carries the at-rest encryption config.
    pub proof: Option<Vec<u8>>,
    /// The generation sealed into the grant.
    pub generation: u64,
    /// The token Secret this grant belongs to; `None` keeps the owners as read.
    pub owner: Option<OwnerReference>,
    /// Remove every grant entry (re-upload, rekey): their keys must stop opening anything.
    pub retire_all_grants: bool,
    /// When the key was set: stamped on the Secret.
    pub now: Timestamp,
}

/// The Secret to write for `publication` given what was read (`None`: absent). It keeps
/// every live grant's entry and every unrelated key, drops the entries of expired or gone
/// tokens, appends this grant, replaces the legacy entry and the proof, merges the owner
/// and carries the resourceVersion read. Refuses when the result would not fit `budget`.
pub fn plan_publication(
    observed: Option<&Secret>,
    publication: Publication,
    tokens: &BTreeMap<String, TokenState>,
    budget: usize,
) -> Result<Secret, BudgetExceeded> {
    let mut secret = observed.cloned().unwrap_or_else(|| Secret {
        metadata: ObjectMeta {
            name: Some(SECRET_NAME.to_string()),
            namespace: Some(NAMESPACE.to_string()),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_string()),
        ..Secret::default()
    });
    let drop = expired_grant_entries(observed, tokens);
    let data = secret.data.get_or_insert_with(BTreeMap::new);
    let retired = |entry: &str| publication.retire_all_grants && grant_token_id(entry).is_some();
    data.retain(|entry, _| !drop.contains(entry) && !retired(entry));
    if let Some((entry, sealed)) = publication.grant {
        data.insert(entry, ByteString(sealed));
    }
    data.insert(LEGACY_ENTRY.to_string(), ByteString(publication.legacy));
    match publication.proof {
        Some(proof) => {
            data.insert(PROOF_ENTRY.to_string(), ByteString(proof));
        }
        // The proof speaks for the newest bundle; a keyless one must not inherit it.
        None => {
            data.remove(PROOF_ENTRY);
        }
    }
    let size = data_size(data);
    if size > budget {
        return Err(BudgetExceeded {
            size,
            budget,
            grants: data.keys().filter(|k| grant_token_id(k).is_some()).count(),
        });
    }
    // string_data would be merged into data by the server and could overwrite entries.
    secret.string_data = None;
    let annotations = secret
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new);
    annotations.insert(
        KEY_SET_AT_ANNOTATION.to_string(),
        publication.now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
    );
    annotations.insert(
        GENERATION_ANNOTATION.to_string(),
        publication.generation.to_string(),
    );
    if let Some(owner) = publication.owner.as_ref() {
        let existing = secret.metadata.owner_references.take().unwrap_or_default();
        secret.metadata.owner_references = Some(merge_owner_references(&existing, Some(owner)));
    }
    Ok(secret)
}

/// The Secret as read minus the grants of expired or gone tokens; `None` when nothing
/// expired, so a steady state writes nothing.
pub fn plan_prune(observed: &Secret, tokens: &BTreeMap<String, TokenState>) -> Option<Secret> {
    let drop = expired_grant_entries(Some(observed), tokens);
    if drop.is_empty() {
        return None;
    }
    let mut secret = observed.clone();
    if let Some(data) = secret.data.as_mut() {
        data.retain(|entry, _| !drop.contains(entry));
    }
    Some(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_token_ids_lists_only_well_formed_grant_entries_sorted() {
        let mut data = BTreeMap::new();
        for key in [
            "certs-zzzzzz",
            "certs-abcdef",
            "certs-BAD!",
            "key-proof",
            "certs",
        ] {
            data.insert(key.to_string(), ByteString(b"x".to_vec()));
        }
        let secret = Secret {
            data: Some(data),
            ..Secret::default()
        };
        assert_eq!(grant_token_ids(Some(&secret)), ["abcdef", "zzzzzz"]);
        assert!(grant_token_ids(None).is_empty());
    }

    #[test]
    fn the_grant_budget_is_the_api_limit_less_128_kib() {
        assert_eq!(SECRET_SIZE_LIMIT, 1_048_576);
        assert_eq!(GRANT_SECRET_BUDGET, 1_048_576 - 131_072);
    }

    fn owner(uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: "Secret".into(),
            name: format!("bootstrap-token-{uid}"),
            uid: uid.into(),
            ..OwnerReference::default()
        }
    }

    fn secret_with(entries: &[(&str, usize)], owners: &[&str]) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(SECRET_NAME.into()),
                namespace: Some(NAMESPACE.into()),
                resource_version: Some("41".into()),
                owner_references: Some(owners.iter().map(|o| owner(o)).collect()),
                annotations: Some(BTreeMap::from([(
                    GENERATION_ANNOTATION.to_string(),
                    "3".to_string(),
                )])),
                ..ObjectMeta::default()
            },
            data: Some(
                entries
                    .iter()
                    .map(|(k, len)| (k.to_string(), ByteString(vec![b'x'; *len])))
                    .collect(),
            ),
            ..Secret::default()
        }
    }

    fn publication(token: Option<&str>, now: Timestamp) -> Publication {
        Publication {
            grant: token.map(|t| (grant_entry_name(t), vec![b'g'; 100])),
            legacy: vec![b'l'; 50],
            proof: None,
            generation: 4,
            owner: token.map(owner),
            retire_all_grants: false,
            now,
        }
    }

    fn states(pairs: &[(&str, TokenState)]) -> BTreeMap<String, TokenState> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn entry_names_round_trip_and_reject_non_tokens() {
        assert_eq!(grant_entry_name("abc123"), "certs-abc123");
        assert_eq!(grant_token_id("certs-abc123"), Some("abc123"));
        for not_grant in [
            "certs",
            "certs-",
            "certs-ABC123",
            "certs-abc1234",
            "key-proof",
        ] {
            assert_eq!(grant_token_id(not_grant), None, "{not_grant}");
        }
    }

    #[test]
    fn only_expired_and_gone_grants_are_dropped() {
        let secret = secret_with(
            &[
                ("certs", 1),
                ("certs-aaaaaa", 1),
                ("certs-bbbbbb", 1),
                ("certs-cccccc", 1),
                ("certs-dddddd", 1),
                ("key-proof", 1),
            ],
            &[],
        );
        let tokens = states(&[
            ("aaaaaa", TokenState::Live),
            ("bbbbbb", TokenState::Expired),
            ("cccccc", TokenState::Gone),
            // dddddd: unknown, kept
        ]);
        let dropped = expired_grant_entries(Some(&secret), &tokens);
        assert_eq!(
            dropped,
            BTreeSet::from(["certs-bbbbbb".to_string(), "certs-cccccc".to_string()])
        );
    }

    #[test]
    fn owner_references_merge_by_uid_and_never_shrink() {
        let existing = vec![owner("u1"), owner("u2")];
        let merged = merge_owner_references(&existing, Some(&owner("u3")));
        assert_eq!(
            merged.iter().map(|o| o.uid.as_str()).collect::<Vec<_>>(),
            ["u1", "u2", "u3"]
        );
        let again = merge_owner_references(&merged, Some(&owner("u2")));
        assert_eq!(again, merged);
        assert_eq!(merge_owner_references(&existing, None), existing);
        // Duplicates already present collapse too.
        let dup = merge_owner_references(&[owner("u1"), owner("u1")], None);
        assert_eq!(dup.len(), 1);
    }

    #[test]
    fn publication_appends_keeps_live_drops_expired() {
        let now = Timestamp::now();
        let observed = secret_with(
            &[
                ("certs", 10),
                ("certs-aaaaaa", 10),
                ("certs-bbbbbb", 10),
                ("unrelated", 3),
                ("key-proof", 5),
            ],
            &["aaaaaa", "bbbbbb"],
        );
        let tokens = states(&[
            ("aaaaaa", TokenState::Live),
            ("bbbbbb", TokenState::Gone),
            ("cccccc", TokenState::Live),
        ]);
        let planned = plan_publication(
            Some(&observed),
            publication(Some("cccccc"), now),
            &tokens,
            GRANT_SECRET_BUDGET,
        )
        .unwrap();
        let data = planned.data.as_ref().unwrap();
        assert_eq!(
            data.keys().map(String::as_str).collect::<Vec<_>>(),
            ["certs", "certs-aaaaaa", "certs-cccccc", "unrelated"]
        );
        assert_eq!(
            data["certs-aaaaaa"].0,
            vec![b'x'; 10],
            "a live grant is untouched"
        );
        assert_eq!(
            data["certs"].0,
            vec![b'l'; 50],
            "legacy follows the newest key"
        );
        assert_eq!(planned.metadata.resource_version.as_deref(), Some("41"));
        let owners: Vec<_> = planned
            .metadata
            .owner_references
            .as_ref()
            .unwrap()
            .iter()
            .map(|o| o.uid.as_str())
            .collect();
        // The gone token's reference stays: garbage collection owns that cleanup.
        assert_eq!(owners, ["aaaaaa", "bbbbbb", "cccccc"]);
        let annotations = planned.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations[GENERATION_ANNOTATION], "4");
        assert_eq!(
            annotations[KEY_SET_AT_ANNOTATION],
            now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
        );
    }

    #[test]
    fn a_first_publication_creates_the_secret() {
        let planned = plan_publication(
            None,
            publication(Some("aaaaaa"), Timestamp::now()),
            &BTreeMap::new(),
            GRANT_SECRET_BUDGET,
        )
        .unwrap();
        assert_eq!(planned.metadata.name.as_deref(), Some(SECRET_NAME));
        assert_eq!(planned.metadata.namespace.as_deref(), Some(NAMESPACE));
        assert_eq!(planned.metadata.resource_version, None);
        assert_eq!(planned.type_.as_deref(), Some("Opaque"));
        assert_eq!(planned.metadata.owner_references.as_ref().unwrap().len(), 1);
    }

    #[test]
    fn retiring_removes_every_grant_and_keeps_owners() {
        let observed = secret_with(
            &[("certs", 10), ("certs-aaaaaa", 10), ("certs-bbbbbb", 10)],
            &["aaaaaa"],
        );
        let mut p = publication(None, Timestamp::now());
        p.retire_all_grants = true;
        p.proof = Some(vec![1, 2, 3]);
        let planned =
            plan_publication(Some(&observed), p, &BTreeMap::new(), GRANT_SECRET_BUDGET).unwrap();
        let data = planned.data.as_ref().unwrap();
        assert_eq!(
            data.keys().map(String::as_str).collect::<Vec<_>>(),
            ["certs", "key-proof"]
        );
        assert_eq!(
            planned.metadata.owner_references,
            observed.metadata.owner_references
        );
    }

    #[test]
    fn a_keyless_publication_removes_the_old_proof() {
        let observed = secret_with(&[("certs", 10), ("key-proof", 10)], &[]);
        let planned = plan_publication(
            Some(&observed),
            publication(Some("aaaaaa"), Timestamp::now()),
            &BTreeMap::new(),
            GRANT_SECRET_BUDGET,
        )
        .unwrap();
        assert!(!planned.data.unwrap().contains_key(PROOF_ENTRY));
    }

    #[test]
    fn the_budget_counts_the_result_and_refuses_over_it() {
        let observed = secret_with(&[("certs", 10), ("certs-aaaaaa", 500)], &[]);
        let tokens = states(&[("aaaaaa", TokenState::Live)]);
        // 500 kept + 100 new grant + 50 legacy = 650.
        let fits = plan_publication(
            Some(&observed),
            publication(Some("bbbbbb"), Timestamp::now()),
            &tokens,
            650,
        );
        assert!(fits.is_ok());
        let err = plan_publication(
            Some(&observed),
            publication(Some("bbbbbb"), Timestamp::now()),
            &tokens,
            649,
        )
        .unwrap_err();
        assert_eq!(
            err,
            BudgetExceeded {
                size: 650,
                budget: 649,
                grants: 2
            }
        );
        assert!(err.to_string().contains("Nothing was written"));
        // An expired grant's bytes do not count against the new one.
        let gone = states(&[("aaaaaa", TokenState::Gone)]);
        assert!(
            plan_publication(
                Some(&observed),
                publication(Some("bbbbbb"), Timestamp::now()),
                &gone,
                150
            )
            .is_ok()
        );
    }

    #[test]
    fn prune_writes_nothing_when_nothing_expired() {
        let observed = secret_with(&[("certs", 1), ("certs-aaaaaa", 1)], &["aaaaaa"]);
        let live = states(&[("aaaaaa", TokenState::Live)]);
        assert!(plan_prune(&observed, &live).is_none());
        let expired = states(&[("aaaaaa", TokenState::Expired)]);
        let pruned = plan_prune(&observed, &expired).unwrap();
        assert_eq!(
            pruned.data.as_ref().unwrap().keys().collect::<Vec<_>>(),
            ["certs"]
        );
        assert_eq!(
            pruned.metadata.owner_references,
            observed.metadata.owner_references
        );
        assert_eq!(pruned.metadata.resource_version.as_deref(), Some("41"));
        assert_eq!(pruned.metadata.annotations, observed.metadata.annotations);
    }

    #[test]
    fn a_generation_at_u64_max_is_refused_not_wrapped() {
        let mut at_max = secret_with(&[], &[]);
        at_max
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(GENERATION_ANNOTATION.into(), u64::MAX.to_string());
        assert_eq!(
            next_generation(Some(&at_max)),
            Err(GenerationExhausted { observed: u64::MAX })
        );
        assert_eq!(next_generation(Some(&secret_with(&[], &[]))), Ok(4));
        assert_eq!(next_generation(None), Ok(1));
    }

    #[test]
    fn generation_reads_the_annotation() {
        assert_eq!(observed_generation(None), 0);
        assert_eq!(observed_generation(Some(&secret_with(&[], &[]))), 3);
        let mut garbled = secret_with(&[], &[]);
        garbled
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(GENERATION_ANNOTATION.into(), "x".into());
        assert_eq!(observed_generation(Some(&garbled)), 0);
    }
}
