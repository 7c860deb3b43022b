//! The maintenance fence and the rekey against the API double: the fence Lease taken,
//! refused and lost; the reader Role's rules enforced on a bootstrap token by an RBAC
//! evaluator; a rekey after which no earlier certificate-key opens anything; the legacy
//! entry going with the token whose mint sealed it.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context as _;
use ha::fence::{FENCE_LEASE, FENCE_NAMESPACE, Fence, FenceError};
use ha::grants::{self, CertKey, EntryBinding, GrantError};
use ha::rekey::{RekeyError, RekeyOptions};
use ha::tokens::{self, TokenRole};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};
use testkube::ApiServer;
use testkube::auth::{Attributes, UserInfo};

use crate::grants::{bootstrap_kubeconfig, data_keys, grant_secret, mint, shared_pki, upload};

/// Which entries of the grant Secret `key` opens: grant entries through their binding, the
/// legacy entry as the flat map. The key proof is sealed under the encryption config, not
/// a certificate-key, and is not asked.
fn opened_by(secret: &Secret, key: &CertKey) -> Vec<String> {
    let mut opened = Vec::new();
    for (entry, sealed) in secret.data.iter().flatten() {
        let opens = if entry == grants::LEGACY_ENTRY {
            grants::envelope::open_legacy(key, &sealed.0).is_ok()
        } else if let Some(id) = grants::plan::grant_token_id(entry) {
            let binding = EntryBinding {
                secret: grants::SECRET_REF,
                entry,
                token_id: id,
            };
            grants::envelope::open_bundle(key, binding, &sealed.0).is_ok()
        } else {
            continue;
        };
        if opens {
            opened.push(entry.clone());
        }
    }
    opened
}

/// Every entry a certificate-key could open (the proof aside).
fn key_entries(secret: &Secret) -> Vec<String> {
    data_keys(secret)
        .into_iter()
        .filter(|e| e != grants::PROOF_ENTRY)
        .collect()
}

#[tokio::test]
async fn a_rekey_leaves_every_earlier_key_opening_nothing_and_the_new_one_everything()
-> anyhow::Result<()> {
    let server = ApiServer::start().await?;
    let client = server.client();
    let (pki_dir, files) = shared_pki()?;
    let state = tempfile::tempdir()?;
    // Two pending joins, then a rekey, then another join and a second rekey: four earlier
    // keys, each of which once opened the legacy entry.
    let a = mint(&client, Duration::from_secs(3600)).await?;
    let b = mint(&client, Duration::from_secs(3600)).await?;
    let (key_a, key_b) = (CertKey::generate(), CertKey::generate());
    upload(&client, &key_a, &a, &files).await?;
    upload(&client, &key_b, &b, &files).await?;
    let before = grant_secret(&client).await?.context("published")?;
    assert_eq!(
        opened_by(&before, &key_b).len(),
        2,
        "b's grant and the legacy entry"
    );
    let opts = RekeyOptions {
        pki_dir: pki_dir.path().to_path_buf(),
        state_dir: state.path().to_path_buf(),
        identity: "rekey-test".into(),
    };
    let first = ha::rekey::rekey_certs(&client, &opts, |_| {}).await?;
    assert_eq!(first.published.dropped.len(), 2);
    let c = mint(&client, Duration::from_secs(3600)).await?;
    let key_c = CertKey::generate();
    upload(&client, &key_c, &c, &files).await?;
    let second = ha::rekey::rekey_certs(&client, &opts, |_| {}).await?;

    let after = grant_secret(&client).await?.context("published")?;
    for (name, key) in [
        ("a", &key_a),
        ("b", &key_b),
        ("c", &key_c),
        ("the first rekey's", &first.key),
    ] {
        assert!(
            opened_by(&after, key).is_empty(),
            "{name} key still opens {:?}",
            opened_by(&after, key)
        );
        let target = tempfile::tempdir()?;
        let err = grants::download_certs_admin(&client, target.path(), key)
            .await
            .unwrap_err();
        assert!(matches!(err, GrantError::Entry { .. }), "{err}");
        assert_eq!(
            std::fs::read_dir(target.path())?.count(),
            0,
            "nothing written"
        );
    }
    // The current key opens every entry there is, and the files are the shared set.
    assert_eq!(opened_by(&after, &second.key), key_entries(&after));
    assert!(!key_entries(&after).is_empty());
    let target = tempfile::tempdir()?;
    grants::download_certs_admin(&client, target.path(), &second.key).await?;
    assert_eq!(grants::read_bundle_files(target.path())?, files);
    // Through a join command's path too: c's grant is gone.
    let scratch = tempfile::tempdir()?;
    let kubeconfig = bootstrap_kubeconfig(&server, scratch.path(), &c.token)?;
    let err = grants::download_certs(&kubeconfig, scratch.path(), &key_c, |_| Ok(()))
        .await
        .unwrap_err();
    assert!(matches!(err, GrantError::NoEntry { .. }), "{err}");
    // The fence was released: the next maintenance operation takes it at once.
    Fence::take(&client, "after").await?;
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn an_expired_tokens_key_opens_nothing_while_other_grants_keep_the_secret()
-> anyhow::Result<()> {
    let server = ApiServer::start().await?;
    let client = server.client();
    let (_pki, files) = shared_pki()?;
    let long = mint(&client, Duration::from_secs(2 * 3600)).await?;
    let short = mint(&client, Duration::from_secs(60)).await?;
    let (key_long, key_short) = (CertKey::generate(), CertKey::generate());
    upload(&client, &key_long, &long, &files).await?;
    upload(&client, &key_short, &short, &files).await?;
    let before = grant_secret(&client).await?.context("published")?;
    // The newest mint's key opens its grant and the legacy entry.
    assert_eq!(
        opened_by(&before, &key_short),
        [
            "certs".to_string(),
            grants::grant_entry_name(short.token.id())
        ]
    );

    // Ten minutes on, the short token is over; the long one keeps the Secret alive.
    let later = || jiff::Timestamp::now() + jiff::SignedDuration::from_mins(10);
    let dropped = grants::prune_expired_grants_at(&client, later).await?;
    let mut want_dropped = vec![
        "certs".to_string(),
        grants::grant_entry_name(short.token.id()),
    ];
    want_dropped.sort();
    assert_eq!(dropped, want_dropped);
    let after = grant_secret(&client)
        .await?
        .context("still owned by the long token")?;
    assert!(
        opened_by(&after, &key_short).is_empty(),
        "{:?}",
        opened_by(&after, &key_short)
    );
    assert_eq!(
        opened_by(&after, &key_long),
        [grants::grant_entry_name(long.token.id())]
    );
    let target = tempfile::tempdir()?;
    let err = grants::download_certs_admin(&client, target.path(), &key_short)
        .await
        .unwrap_err();
    assert!(matches!(err, GrantError::NoEntry { .. }), "{err}");
    server.shutdown().await;
    Ok(())
}

fn lease_api(client: &kube::Client) -> Api<Lease> {
    Api::namespaced(client.clone(), FENCE_NAMESPACE)
}

#[tokio::test]
async fn the_fence_has_one_holder_and_a_lost_fence_refuses_the_write() -> anyhow::Result<()> {
    let server = ApiServer::start().await?;
    let client = server.client();
    let (pki_dir, files) = shared_pki()?;
    let a = mint(&client, Duration::from_secs(3600)).await?;
    upload(&client, &CertKey::generate(), &a, &files).await?;

    let first = Fence::take(&client, "node-a").await?;
    first.confirm().await?;
    let err = Fence::take(&client, "node-b").await.unwrap_err();
    assert!(
        matches!(&err, FenceError::Held { holder, .. } if holder == "node-a"),
        "{err}"
    );
    assert!(err.to_string().contains("node-a"), "{err}");

    // node-b's rekey refuses before writing anything.
    let state = tempfile::tempdir()?;
    let before = grant_secret(&client).await?;
    let err = ha::rekey::rekey_certs(
        &client,
        &RekeyOptions {
            pki_dir: pki_dir.path().to_path_buf(),
            state_dir: state.path().to_path_buf(),
            identity: "node-b".into(),
        },
        |_| {},
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, RekeyError::Fence(FenceError::Held { .. })),
        "{err}"
    );
    assert_eq!(grant_secret(&client).await?, before);

    // node-a stalls past its term; node-b takes the fence over.
    let api = lease_api(&client);
    let mut lease = api.get(FENCE_LEASE).await?;
    let spec = lease.spec.as_mut().context("spec")?;
    let stale = k8s_openapi::jiff::Timestamp::now()
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(600))?;
    spec.renew_time = Some(MicroTime(stale));
    api.replace(FENCE_LEASE, &PostParams::default(), &lease)
        .await?;
    let second = Fence::take(&client, "node-b").await?;
    // node-a's write, rechecked right before it goes out, is refused: nothing written.
    let err = grants::rekey_shared_certs(
        &client,
        pki_dir.path(),
        &CertKey::generate(),
        &grants::UploadProfile::default(),
        || {
            let f = first.clone();
            async move {
                f.confirm()
                    .await
                    .map_err(|e| Box::new(e) as grants::BoxError)
            }
        },
    )
    .await
    .unwrap_err();
    let chain = ha::error_chain(&err);
    assert!(matches!(err, GrantError::Confirm { .. }), "{chain}");
    assert!(
        chain.contains("was lost") && chain.contains("node-b"),
        "{chain}"
    );
    assert_eq!(grant_secret(&client).await?, before);
    // Releasing a fence one no longer holds ends nobody's term.
    first.release().await?;
    second.confirm().await?;
    second.release().await?;
    assert!(
        api.get(FENCE_LEASE)
            .await?
            .spec
            .and_then(|s| s.holder_identity)
            .is_none()
    );
    server.shutdown().await;
    Ok(())
}

/// kube-apiserver's RBAC rule match (`pkg/registry/rbac/validation/rule.go`,
/// `RuleAllows`): the verb, the API group, the resource (with its subresource) and, when
/// the rule names any, the object name must each be listed (or `*`). A request without a
/// name (a create, a list) never matches a rule that lists names.
fn rule_allows(rule: &PolicyRule, a: &Attributes) -> bool {
    let listed = |list: Option<&Vec<String>>, v: &str| {
        list.is_some_and(|l| l.iter().any(|x| x == "*" || x == v))
    };
    let resource = if a.subresource.is_empty() {
        a.resource.clone()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    rule.verbs.iter().any(|v| v == "*" || *v == a.verb)
        && listed(rule.api_groups.as_ref(), &a.group)
        && listed(rule.resources.as_ref(), &resource)
        && rule
            .resource_names
            .as_ref()
            .is_none_or(|n| n.is_empty() || n.contains(&a.name))
}

#[tokio::test]
async fn the_bootstrap_group_may_hold_the_fence_and_nothing_else_among_leases() -> anyhow::Result<()>
{
    // The double authorizes by this closure; it evaluates the reader Role exactly as stored
    // (read back below) for the group its RoleBinding names, in its namespace.
    let rules: Arc<RwLock<Vec<PolicyRule>>> = Arc::default();
    let seen = rules.clone();
    let server = ApiServer::builder()
        .authorizer(move |user: &UserInfo, a: &Attributes| {
            user.groups.iter().any(|g| g == tokens::CONTROL_PLANE_GROUP)
                && a.namespace == FENCE_NAMESPACE
                && seen
                    .read()
                    .map(|r| r.iter().any(|rule| rule_allows(rule, a)))
                    .unwrap_or(false)
        })
        .start()
        .await?;
    let admin = server.client();
    grants::grant_certs_reader(&admin).await?;
    let role: Role = Api::namespaced(admin.clone(), FENCE_NAMESPACE)
        .get(grants::READER_NAME)
        .await?;
    *rules.write().map_err(|_| anyhow::anyhow!("poisoned"))? = role.rules.unwrap_or_default();
    // The Lease exists for the group to hold: it cannot create it.
    assert!(lease_api(&admin).get_opt(FENCE_LEASE).await?.is_some());

    let minted = tokens::create_token(
        &admin,
        TokenRole::ControlPlane,
        Duration::from_secs(600),
        None,
        jiff::Timestamp::now(),
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = bootstrap_kubeconfig(&server, dir.path(), &minted.token)?;
    let joiner = grants::client_from_kubeconfig(&kubeconfig).await?;

    // It holds, rechecks and releases the fence under its own name.
    let own = hacore::fence::joiner_identity(minted.token.id());
    let fence = Fence::take(&joiner, &own).await?;
    fence.confirm().await?;
    fence.release().await?;
    // Under any other name, the join fence policy refuses it (RBAC alone cannot), and the
    // Lease is left as it was.
    let before = lease_api(&admin).get(FENCE_LEASE).await?;
    for other in ["joiner", "system:bootstrap:abcdef", "stratum-rekey"] {
        let refused = Fence::take(&joiner, other).await;
        let text = format!("{:?}", refused.as_ref().err());
        assert!(
            text.contains(hacore::fence::JOIN_FENCE_POLICY)
                && text.contains("only under its own name"),
            "{other}: {text}"
        );
    }
    assert_eq!(
        lease_api(&admin)
            .get(FENCE_LEASE)
            .await?
            .metadata
            .resource_version,
        before.metadata.resource_version,
        "a refused take writes nothing"
    );
    // Nor can it end another holder's term: an operator holds it now.
    let operator = Fence::take(&admin, "stratum-rekey").await?;
    let held = lease_api(&admin).get(FENCE_LEASE).await?;
    let mut stolen = held.clone();
    if let Some(spec) = stolen.spec.as_mut() {
        spec.holder_identity = None;
    }
    let refused = lease_api(&joiner)
        .replace(FENCE_LEASE, &PostParams::default(), &stolen)
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(hacore::fence::JOIN_FENCE_POLICY)),
        "{refused:?}"
    );
    operator.release().await?;
    assert_eq!(
        lease_api(&admin)
            .get(FENCE_LEASE)
            .await?
            .spec
            .and_then(|s| s.holder_identity),
        None
    );

    // Any other Lease, by name or by create, is refused with a 403.
    let forbidden =
        |r: Result<Lease, kube::Error>| matches!(r, Err(kube::Error::Api(s)) if s.code == 403);
    let leases = lease_api(&joiner);
    assert!(forbidden(leases.get("stratum-operator").await));
    let other = Lease {
        metadata: kube::api::ObjectMeta {
            name: Some("mine".into()),
            ..Default::default()
        },
        spec: None,
    };
    assert!(forbidden(
        leases.create(&PostParams::default(), &other).await
    ));
    let others: Api<Lease> = Api::namespaced(joiner.clone(), "default");
    assert!(forbidden(others.get(FENCE_LEASE).await));
    // A worker token gets nothing at all.
    let worker = tokens::create_token(
        &admin,
        TokenRole::Worker,
        Duration::from_secs(600),
        None,
        jiff::Timestamp::now(),
    )
    .await?;
    let kubeconfig = bootstrap_kubeconfig(&server, dir.path(), &worker.token)?;
    let worker = grants::client_from_kubeconfig(&kubeconfig).await?;
    assert!(forbidden(lease_api(&worker).get(FENCE_LEASE).await));
    assert!(matches!(
        Fence::take(&worker, "worker").await,
        Err(FenceError::Api { .. })
    ));
    server.shutdown().await;
    Ok(())
}
