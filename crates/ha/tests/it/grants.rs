//! Grants against the API double: real kube::Client requests over loopback TLS, real files
//! in tempdirs.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use ha::grants::{
    self, BoxError, CertKey, EntryBinding, EnvelopeError, GrantError, GrantOwner, UploadProfile,
};
use ha::tokens::{self, MintedToken, TokenRole};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{RoleBinding, Subject};
use kube::api::{Api, DeleteParams, PostParams};
use testkube::{ApiServer, Fault, FaultKind};

const NS: &str = "kube-system";

/// A pki dir holding a freshly generated shared set.
fn shared_pki() -> anyhow::Result<(tempfile::TempDir, BTreeMap<String, Vec<u8>>)> {
    let dir = tempfile::tempdir()?;
    pki::generate_shared(dir.path(), false)?;
    let files = grants::read_bundle_files(dir.path())?;
    Ok((dir, files))
}

/// Every file under `dir` with its bytes and mode: what "the disk is untouched" compares.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (Vec<u8>, u32)> {
    fn walk(dir: &Path, out: &mut BTreeMap<PathBuf, (Vec<u8>, u32)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                walk(&path, out);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                out.insert(path, (bytes, meta.permissions().mode()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, &mut out);
    out
}

/// A joiner's pki dir that already holds other material (a previous, failed attempt).
fn joiner_dir() -> anyhow::Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    pki::generate_shared(dir.path(), false)?;
    Ok(dir)
}

/// The API double's kubeconfig with its user replaced by a bearer token.
fn bootstrap_kubeconfig(
    server: &ApiServer,
    dir: &Path,
    token: &tokens::BootstrapToken,
) -> anyhow::Result<PathBuf> {
    let text = std::fs::read_to_string(server.kubeconfig_path())?;
    let mut config: serde_yaml::Value = serde_yaml::from_str(&text)?;
    let users = config
        .get_mut("users")
        .and_then(|u| u.as_sequence_mut())
        .context("kubeconfig without users")?;
    for user in users {
        let mut auth = serde_yaml::Mapping::new();
        auth.insert("token".into(), token.to_string().into());
        user["user"] = serde_yaml::Value::Mapping(auth);
    }
    let path = dir.join(format!("bootstrap-{}.conf", token.id()));
    std::fs::write(&path, serde_yaml::to_string(&config)?)?;
    Ok(path)
}

async fn mint(client: &kube::Client, ttl: Duration) -> anyhow::Result<MintedToken> {
    Ok(tokens::create_token(
        client,
        TokenRole::ControlPlane,
        ttl,
        None,
        jiff::Timestamp::now(),
    )
    .await?)
}

async fn upload(
    client: &kube::Client,
    key: &CertKey,
    minted: &MintedToken,
    files: &BTreeMap<String, Vec<u8>>,
) -> Result<grants::Published, GrantError> {
    grants::upload_certs(
        client,
        key,
        &GrantOwner::from(minted),
        files,
        &UploadProfile {
            vip: Some("10.0.0.100".into()),
            etcd_endpoints: vec!["https://10.0.0.1:2379".into()],
        },
        grants::no_confirm,
    )
    .await
}

async fn grant_secret(client: &kube::Client) -> anyhow::Result<Option<Secret>> {
    let api: Api<Secret> = Api::namespaced(client.clone(), NS);
    Ok(api.get_opt(grants::SECRET_NAME).await?)
}

fn data_keys(secret: &Secret) -> Vec<String> {
    secret
        .data
        .as_ref()
        .map(|d| d.keys().cloned().collect())
        .unwrap_or_default()
}

fn owner_uids(secret: &Secret) -> Vec<String> {
    secret
        .metadata
        .owner_references
        .as_ref()
        .map(|o| o.iter().map(|r| r.uid.clone()).collect())
        .unwrap_or_default()
}

fn secret_writes(server: &ApiServer) -> Vec<testkube::RequestRecord> {
    server
        .requests()
        .into_iter()
        .filter(|r| r.is_write() && r.resource == "secrets")
        .collect()
}

fn accept(_: &grants::BundleProfile) -> Result<(), BoxError> {
    Ok(())
}

#[tokio::test]
async fn two_concurrent_grants_each_open_their_own_entry() -> anyhow::Result<()> {
    let server = ApiServer::start().await?;
    let client = server.client();
    let (_pki, files) = shared_pki()?;
    let (a, b) = (
        mint(&client, Duration::from_secs(3600)).await?,
        mint(&client, Duration::from_secs(3600)).await?,
    );
    let (key_a, key_b) = (CertKey::generate(), CertKey::generate());

    // Both mints race on the one Secret: each reads, then waits for the other to have read
    // before its first write, so one of them must lose, re-read and append.
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let racing = |key: CertKey, minted: MintedToken| {
        let barrier = barrier.clone();
        let first = Arc::new(AtomicBool::new(true));
        let client = client.clone();
        let files = files.clone();
        async move {
            grants::upload_certs(
                &client,
                &key,
                &GrantOwner::from(&minted),
                &files,
                &UploadProfile::default(),
                move || {
                    let barrier = barrier.clone();
                    let first = first.swap(false, Ordering::SeqCst);
                    async move {
                        if first {
                            barrier.wait().await;
                        }
                        Ok::<(), BoxError>(())
                    }
                },
            )
            .await
        }
    };
    server.clear_requests();
    let (ra, rb) = tokio::join!(
        racing(key_a.clone(), a.clone()),
        racing(key_b.clone(), b.clone())
    );
    ra?;
    rb?;
    let writes: Vec<_> = secret_writes(&server)
        .into_iter()
        .map(|r| (r.verb, r.code))
        .collect();
    assert_eq!(
        writes,
        [
            ("create".to_string(), 201),
            ("create".to_string(), 409),
            ("update".to_string(), 200)
        ],
        "one create wins, the other conflicts and updates from a fresh read"
    );

    let secret = grant_secret(&client)
        .await?
        .context("grant Secret missing")?;
    let mut want = vec![
        "certs".to_string(),
        grants::grant_entry_name(a.token.id()),
        grants::grant_entry_name(b.token.id()),
    ];
    want.sort();
    assert_eq!(data_keys(&secret), want);
    let mut uids = owner_uids(&secret);
    uids.sort();
    let mut want_uids = vec![a.uid.clone(), b.uid.clone()];
    want_uids.sort();
    assert_eq!(uids, want_uids);

    let scratch = tempfile::tempdir()?;
    for (minted, key) in [(&a, &key_a), (&b, &key_b)] {
        let kubeconfig = bootstrap_kubeconfig(&server, scratch.path(), &minted.token)?;
        let target = tempfile::tempdir()?;
        let profile = grants::download_certs(&kubeconfig, target.path(), key, accept).await?;
        assert_eq!(profile.entry, grants::grant_entry_name(minted.token.id()));
        assert!(!profile.legacy);
        assert_eq!(profile.vip, None);
        assert!(profile.etcd_endpoints.is_empty());
        assert!(!profile.carries_encryption_key);
        assert!(profile.generation >= 1);
        for (rel, bytes) in &files {
            let path = target.path().join(rel);
            assert_eq!(&std::fs::read(&path)?, bytes, "{rel}");
            let mode = std::fs::metadata(&path)?.permissions().mode() & 0o777;
            assert_eq!(mode, pki::file_mode(rel), "{rel}");
        }
    }

    // Each key opens only its own grant.
    let kubeconfig = bootstrap_kubeconfig(&server, scratch.path(), &a.token)?;
    let target = joiner_dir()?;
    let before = snapshot(target.path());
    let err = grants::download_certs(&kubeconfig, target.path(), &key_b, accept)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, GrantError::Entry { source: EnvelopeError::Authentication, entry, .. }
            if *entry == grants::grant_entry_name(a.token.id())),
        "{err}"
    );
    assert_eq!(snapshot(target.path()), before);

    // The legacy entry follows the newest mint's key: exactly one of the two opens it.
    let mut opened = 0;
    for key in [&key_a, &key_b] {
        let target = tempfile::tempdir()?;
        if grants::download_certs_admin(&client, target.path(), key)
            .await
            .is_ok()
        {
            opened += 1;
            assert_eq!(grants::read_bundle_files(target.path())?, files);
        }
    }
    assert_eq!(opened, 1);
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn expiry_prunes_only_the_expired_and_upload_drops_the_gone() -> anyhow::Result<()> {
    let server = ApiServer::start().await?;
    let client = server.client();
    let (_pki, files) = shared_pki()?;
    let long = mint(&client, Duration::from_secs(2 * 3600)).await?;
    let short = mint(&client, Duration::from_secs(60)).await?;
    upload(&client, &CertKey::generate(), &long, &files).await?;
    upload(&client, &CertKey::generate(), &short, &files).await?;
    let before = grant_secret(&client).await?.context("missing")?;

    // Now: nothing has expired, and a prune writes nothing.
    server.clear_requests();
    assert!(grants::prune_expired_grants(&client).await?.is_empty());
    assert!(secret_writes(&server).is_empty());

    // Ten minutes on, the one-minute token has expired; the two-hour one has not.
    let later = || jiff::Timestamp::now() + jiff::SignedDuration::from_mins(10);
    let dropped = grants::prune_expired_grants_at(&client, later).await?;
    assert_eq!(dropped, [grants::grant_entry_name(short.token.id())]);
    let after = grant_secret(&client).await?.context("missing")?;
    let mut want = vec![
        "certs".to_string(),
        grants::grant_entry_name(long.token.id()),
    ];
    want.sort();
    assert_eq!(data_keys(&after), want);
    assert_eq!(
        after.metadata.owner_references,
        before.metadata.owner_references
    );
    let data = after.data.as_ref().unwrap();
    let old = before.data.as_ref().unwrap();
    assert_eq!(
        data["certs"], old["certs"],
        "the legacy entry is left as read"
    );
    let long_entry = grants::grant_entry_name(long.token.id());
    assert_eq!(data[&long_entry], old[&long_entry]);

    // Steady state again: a second prune writes nothing.
    server.clear_requests();
    assert!(
        grants::prune_expired_grants_at(&client, later)
            .await?
            .is_empty()
    );
    assert!(secret_writes(&server).is_empty());

    // A token whose Secret is gone loses its grant in the next upload's own update.
    let third = mint(&client, Duration::from_secs(3600)).await?;
    tokens::delete_token(&client, &long).await?;
    let published = upload(&client, &CertKey::generate(), &third, &files).await?;
    assert_eq!(published.dropped, std::slice::from_ref(&long_entry));
    let after = grant_secret(&client).await?.context("missing")?;
    assert!(!data_keys(&after).contains(&long_entry));
    assert!(data_keys(&after).contains(&grants::grant_entry_name(third.token.id())));

    // An absent Secret stays absent.
    let api: Api<Secret> = Api::namespaced(client.clone(), NS);
    api.delete(grants::SECRET_NAME, &DeleteParams::default())
        .await?;
    server.clear_requests();
    assert!(grants::prune_expired_grants(&client).await?.is_empty());
    assert!(secret_writes(&server).is_empty());
    assert!(grant_secret(&client).await?.is_none());
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn garbage_collection_removes_the_secret_only_after_the_last_token() -> anyhow::Result<()> {
    let server = ApiServer::start().await?;
    let client = server.client();
    let (_pki, files) = shared_pki()?;
    let a = mint(&client, Duration::from_secs(3600)).await?;
    let b = mint(&client, Duration::from_secs(3600)).await?;
    upload(&client, &CertKey::generate(), &a, &files).await?;
    upload(&client, &CertKey::generate(), &b, &files).await?;

    tokens::delete_token(&client, &a).await?;
    // The collector drops the dangling reference and keeps the Secret for b.
    let mut kept = None;
    for _ in 0..100 {
        let secret = grant_secret(&client)
            .await?
            .context("the Secret went with a live owner left")?;
        if owner_uids(&secret) == [b.uid.clone()] {
            kept = Some(secret);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        kept.is_some(),
        "the collector never removed the deleted token's reference"
    );

    tokens::delete_token(&client, &b).await?;
    let mut gone = false;
    for _ in 0..200 {
        if grant_secret(&client).await?.is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gone, "the Secret outlived its last owning token");
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn damaged_swapped_or_misaddressed_entries_write_nothing() -> anyhow::Result<()> {
    let server = ApiServer::start().await?;
    let client = server.client();
    let api: Api<Secret> = Api::namespaced(client.clone(), NS);
    let (_pki, files) = shared_pki()?;
    let a = mint(&client, Duration::from_secs(3600)).await?;
    let b = mint(&client, Duration::from_secs(3600)).await?;
    let (key_a, key_b) = (CertKey::generate(), CertKey::generate());
    upload(&client, &key_a, &a, &files).await?;
    upload(&client, &key_b, &b, &files).await?;
    let entry_a = grants::grant_entry_name(a.token.id());
    let entry_b = grants::grant_entry_name(b.token.id());
    let pristine = grant_secret(&client).await?.context("missing")?;
    let sealed_a = pristine.data.as_ref().unwrap()[&entry_a].0.clone();
    let sealed_b = pristine.data.as_ref().unwrap()[&entry_b].0.clone();

    let scratch = tempfile::tempdir()?;
    let kubeconfig = bootstrap_kubeconfig(&server, scratch.path(), &a.token)?;
    let target = joiner_dir()?;
    let before = snapshot(target.path());

    let set_entry_a = |bytes: Vec<u8>| {
        let api = api.clone();
        let entry_a = entry_a.clone();
        async move {
            let mut secret = api.get(grants::SECRET_NAME).await?;
            secret
                .data
                .as_mut()
                .unwrap()
                .insert(entry_a, ByteString(bytes));
            api.replace(grants::SECRET_NAME, &PostParams::default(), &secret)
                .await?;
            anyhow::Ok(())
        }
    };

    let mut flipped = sealed_a.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x40;
    let mut future_version = sealed_a.clone();
    future_version[4] = 2;
    // Sealed with a's key, entry name and token, but for another Secret.
    let other_secret = grants::envelope::seal_bundle(
        &key_a,
        EntryBinding {
            secret: "kube-system/other-certs",
            entry: &entry_a,
            token_id: a.token.id(),
        },
        &grants::Bundle {
            files: files.clone(),
            generation: 99,
            ..grants::Bundle::default()
        },
    )?;

    // Sealed with a's key under a's own entry name, but for b's token id: only the token-id
    // half of the binding tells it apart (a seal that left the token id out of the
    // associated data would open).
    let other_token = grants::envelope::seal_bundle(
        &key_a,
        EntryBinding {
            secret: grants::SECRET_REF,
            entry: &entry_a,
            token_id: b.token.id(),
        },
        &grants::Bundle {
            files: files.clone(),
            generation: 99,
            ..grants::Bundle::default()
        },
    )?;

    type Case<'a> = (&'a str, Vec<u8>, &'a CertKey, fn(&EnvelopeError) -> bool);
    let cases: Vec<Case<'_>> = vec![
        ("wrong key", sealed_a.clone(), &key_b, |e| {
            *e == EnvelopeError::Authentication
        }),
        ("flipped byte", flipped, &key_a, |e| {
            *e == EnvelopeError::Authentication
        }),
        // b's ciphertext under a's name, opened with b's own key: the binding refuses it.
        ("swapped entry", sealed_b.clone(), &key_b, |e| {
            *e == EnvelopeError::Authentication
        }),
        ("moved from another Secret", other_secret, &key_a, |e| {
            *e == EnvelopeError::Authentication
        }),
        ("sealed for another token id", other_token, &key_a, |e| {
            *e == EnvelopeError::Authentication
        }),
        ("truncated", sealed_a[..20].to_vec(), &key_a, |e| {
            matches!(e, EnvelopeError::Truncated { .. })
        }),
        ("unknown version", future_version, &key_a, |e| {
            matches!(e, EnvelopeError::UnknownVersion { found: 2, .. })
        }),
    ];
    for (what, bytes, key, expected) in cases {
        set_entry_a(bytes).await?;
        let err = grants::download_certs(&kubeconfig, target.path(), key, accept)
            .await
            .expect_err(what);
        match &err {
            GrantError::Entry { entry, source, .. } => {
                assert_eq!(*entry, entry_a, "{what}");
                assert!(expected(source), "{what}: {source:?}");
            }
            other => panic!("{what}: unexpected error {other}"),
        }
        let message = err.to_string();
        assert!(
            message.contains(&entry_a) && message.contains("nothing was written"),
            "{what}: {message}"
        );
        assert_eq!(snapshot(target.path()), before, "{what}: the disk changed");
    }

    // A refusing check writes nothing either, even though the entry opens.
    set_entry_a(sealed_a.clone()).await?;
    let err = grants::download_certs(&kubeconfig, target.path(), &key_a, |p| {
        Err(format!("cluster VIP {:?} differs from this node's", p.vip).into())
    })
    .await
    .unwrap_err();
    assert!(matches!(err, GrantError::Check { .. }), "{err}");
    assert_eq!(snapshot(target.path()), before);

    // The restored entry opens: the failures above were the damage, not the setup.
    grants::download_certs(&kubeconfig, target.path(), &key_a, accept).await?;
    assert_eq!(grants::read_bundle_files(target.path())?, files);

    // A token with no grant gets a clear "no entry", not a decryption error.
    let worker = tokens::create_token(
        &client,
        TokenRole::Worker,
        Duration::from_secs(600),
        None,
        jiff::Timestamp::now(),
    )
    .await?;
    let kubeconfig = bootstrap_kubeconfig(&server, scratch.path(), &worker.token)?;
    let err = grants::download_certs(&kubeconfig, tempfile::tempdir()?.path(), &key_a, accept)
        .await
        .unwrap_err();
    assert!(matches!(err, GrantError::NoEntry { .. }), "{err}");
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn conflicts_retry_from_a_fresh_read_and_confirm_runs_before_each_write() -> anyhow::Result<()>
{
    let server = ApiServer::start().await?;
    let client = server.client();
    let (_pki, files) = shared_pki()?;
    let a = mint(&client, Duration::from_secs(3600)).await?;
    upload(&client, &CertKey::generate(), &a, &files).await?;

    let b = mint(&client, Duration::from_secs(3600)).await?;
    server.clear_requests();
    server.inject(Fault {
        verb: Some("update".into()),
        resource: Some("secrets".into()),
        times: Some(2),
        kind: FaultKind::Status(409),
    });
    let confirms = Arc::new(AtomicU32::new(0));
    let key_b = CertKey::generate();
    let counter = confirms.clone();
    let server_ref = &server;
    grants::upload_certs(
        &client,
        &key_b,
        &GrantOwner::from(&b),
        &files,
        &UploadProfile::default(),
        || {
            let counter = counter.clone();
            // The write this confirm precedes has not happened yet: exactly as many
            // Secret updates were answered as confirms ran before this one.
            let updates_so_far = secret_writes(server_ref).len() as u32;
            async move {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                assert_eq!(updates_so_far, n, "confirm ran after its write");
                Ok::<(), BoxError>(())
            }
        },
    )
    .await?;
    assert_eq!(confirms.load(Ordering::SeqCst), 3);

    let log: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.resource == "secrets" && r.name.as_deref() == Some(grants::SECRET_NAME))
        .map(|r| (r.verb.clone(), r.code))
        .collect();
    // Each write attempt follows its own fresh read.
    assert_eq!(
        log,
        [
            ("get".to_string(), 200),
            ("update".to_string(), 409),
            ("get".to_string(), 200),
            ("update".to_string(), 409),
            ("get".to_string(), 200),
            ("update".to_string(), 200),
        ]
    );
    let secret = grant_secret(&client).await?.context("missing")?;
    assert!(data_keys(&secret).contains(&grants::grant_entry_name(b.token.id())));
    assert!(data_keys(&secret).contains(&grants::grant_entry_name(a.token.id())));

    // Conflicts that never stop end in a bounded, clear error.
    let c = mint(&client, Duration::from_secs(3600)).await?;
    server.inject(Fault {
        verb: Some("update".into()),
        resource: Some("secrets".into()),
        times: None,
        kind: FaultKind::Status(409),
    });
    let err = upload(&client, &CertKey::generate(), &c, &files)
        .await
        .unwrap_err();
    assert!(
        matches!(err, GrantError::Conflict { attempts, .. } if attempts == grants::MAX_WRITE_ATTEMPTS),
        "{err}"
    );
    server.clear_faults();
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_refusing_confirm_or_an_oversized_grant_writes_nothing() -> anyhow::Result<()> {
    let server = ApiServer::start().await?;
    let client = server.client();
    let (_pki, files) = shared_pki()?;

    // A first grant too big for the Secret on its own: refused before any write at all,
    // the reader RBAC included.
    let a = mint(&client, Duration::from_secs(3600)).await?;
    server.clear_requests();
    let mut huge = files.clone();
    huge.insert("ca.crt".into(), vec![b'c'; 400 * 1024]);
    let err = upload(&client, &CertKey::generate(), &a, &huge)
        .await
        .unwrap_err();
    assert!(matches!(err, GrantError::Budget(_)), "{err}");
    let writes: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.is_write())
        .collect();
    assert!(writes.is_empty(), "{writes:?}");

    // First publication, confirm refuses: no Secret at all.
    server.clear_requests();
    let err = grants::upload_certs(
        &client,
        &CertKey::generate(),
        &GrantOwner::from(&a),
        &files,
        &UploadProfile::default(),
        || async { Err::<(), BoxError>("maintenance lease lost to node cp2".into()) },
    )
    .await
    .unwrap_err();
    assert!(matches!(err, GrantError::Confirm { .. }), "{err}");
    assert!(
        ha::error_chain(&err).contains("lease lost to node cp2"),
        "{err}"
    );
    assert!(secret_writes(&server).is_empty());
    assert!(grant_secret(&client).await?.is_none());

    // Big files: one grant plus the legacy map fit; a second live grant does not.
    let mut big = files.clone();
    big.insert("ca.crt".into(), vec![b'c'; 300 * 1024]);
    upload(&client, &CertKey::generate(), &a, &big).await?;
    let before = grant_secret(&client).await?.context("missing")?;
    let b = mint(&client, Duration::from_secs(3600)).await?;
    server.clear_requests();
    let err = upload(&client, &CertKey::generate(), &b, &big)
        .await
        .unwrap_err();
    match &err {
        GrantError::Budget(budget) => {
            assert_eq!(budget.budget, grants::GRANT_SECRET_BUDGET);
            assert!(budget.size > budget.budget);
            assert_eq!(budget.grants, 2);
        }
        other => panic!("expected a budget refusal, got {other}"),
    }
    assert!(secret_writes(&server).is_empty());
    let after = grant_secret(&client).await?.context("missing")?;
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version
    );
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn rekey_retires_every_grant_in_one_update() -> anyhow::Result<()> {
    let server = ApiServer::start().await?;
    let client = server.client();
    let (pki_dir, files) = shared_pki()?;
    let a = mint(&client, Duration::from_secs(3600)).await?;
    let b = mint(&client, Duration::from_secs(3600)).await?;
    let key_a = CertKey::generate();
    upload(&client, &key_a, &a, &files).await?;
    upload(&client, &CertKey::generate(), &b, &files).await?;
    let owners = grant_secret(&client)
        .await?
        .unwrap()
        .metadata
        .owner_references;

    // Refused by the fence: nothing changes.
    let before = grant_secret(&client).await?.unwrap();
    let err = grants::rekey_shared_certs(
        &client,
        pki_dir.path(),
        &CertKey::generate(),
        &UploadProfile::default(),
        || async { Err::<(), BoxError>("fence lost".into()) },
    )
    .await
    .unwrap_err();
    assert!(matches!(err, GrantError::Confirm { .. }));
    assert_eq!(grant_secret(&client).await?.unwrap(), before);

    let rekey = CertKey::generate();
    server.clear_requests();
    let published = grants::rekey_shared_certs(
        &client,
        pki_dir.path(),
        &rekey,
        &UploadProfile::default(),
        grants::no_confirm,
    )
    .await?;
    assert_eq!(published.dropped.len(), 2);
    assert_eq!(
        secret_writes(&server).len(),
        1,
        "one update retires every grant"
    );
    let after = grant_secret(&client).await?.unwrap();
    assert_eq!(data_keys(&after), ["certs"]);
    assert_eq!(after.metadata.owner_references, owners);

    let scratch = tempfile::tempdir()?;
    let kubeconfig = bootstrap_kubeconfig(&server, scratch.path(), &a.token)?;
    let err = grants::download_certs(&kubeconfig, scratch.path(), &key_a, accept)
        .await
        .unwrap_err();
    assert!(matches!(err, GrantError::NoEntry { .. }), "{err}");

    let target = tempfile::tempdir()?;
    let profile = grants::download_certs_admin(&client, target.path(), &rekey).await?;
    assert!(profile.legacy);
    assert_eq!(grants::read_bundle_files(target.path())?, files);

    // re_upload_certs is the same publication without a fence.
    let reupload = CertKey::generate();
    grants::re_upload_certs(
        &client,
        pki_dir.path(),
        &reupload,
        &UploadProfile::default(),
    )
    .await?;
    let target = tempfile::tempdir()?;
    grants::download_certs_admin(&client, target.path(), &reupload).await?;
    let err = grants::download_certs_admin(&client, target.path(), &rekey)
        .await
        .unwrap_err();
    assert!(
        matches!(err, GrantError::Entry { ref entry, .. } if entry == "certs"),
        "{err}"
    );
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn key_proof_and_key_age_answer_from_the_secret() -> anyhow::Result<()> {
    let server = ApiServer::start().await?;
    let client = server.client();
    assert_eq!(
        grants::published_bundle_carries_key(&client, Some(b"config")).await?,
        grants::BundleKeyState {
            published: false,
            carries: false
        }
    );
    assert_eq!(grants::shared_certs_key_set_at(&client).await?, None);

    let (pki_dir, _) = shared_pki()?;
    let config = b"kind: EncryptionConfiguration\n# secret: c2VjcmV0c2VjcmV0\n".to_vec();
    std::fs::write(pki_dir.path().join(grants::ENCRYPTION_CONFIG_FILE), &config)?;
    let files = grants::read_bundle_files(pki_dir.path())?;
    let a = mint(&client, Duration::from_secs(3600)).await?;
    let key = CertKey::generate();
    let started = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(1);
    upload(&client, &key, &a, &files).await?;

    let state = grants::published_bundle_carries_key(&client, Some(&config)).await?;
    assert!(state.published && state.carries);
    let other = grants::published_bundle_carries_key(&client, Some(b"another config")).await?;
    assert!(other.published && !other.carries);
    let none = grants::published_bundle_carries_key(&client, None).await?;
    assert!(none.published && !none.carries);

    let set_at = grants::shared_certs_key_set_at(&client)
        .await?
        .context("no key age")?;
    assert!(
        set_at >= started && set_at <= jiff::Timestamp::now(),
        "{set_at}"
    );

    let scratch = tempfile::tempdir()?;
    let kubeconfig = bootstrap_kubeconfig(&server, scratch.path(), &a.token)?;
    let target = tempfile::tempdir()?;
    let profile = grants::download_certs(&kubeconfig, target.path(), &key, accept).await?;
    assert!(profile.carries_encryption_key);
    assert_eq!(profile.vip.as_deref(), Some("10.0.0.100"));
    assert_eq!(profile.etcd_endpoints, ["https://10.0.0.1:2379"]);
    assert_eq!(profile.generation, 1);
    let path = target.path().join(grants::ENCRYPTION_CONFIG_FILE);
    assert_eq!(std::fs::read(&path)?, config);
    assert_eq!(
        std::fs::metadata(&path)?.permissions().mode() & 0o777,
        0o600
    );

    // A keyless publication retracts the proof.
    std::fs::remove_file(pki_dir.path().join(grants::ENCRYPTION_CONFIG_FILE))?;
    grants::re_upload_certs(
        &client,
        pki_dir.path(),
        &CertKey::generate(),
        &UploadProfile::default(),
    )
    .await?;
    let state = grants::published_bundle_carries_key(&client, Some(&config)).await?;
    assert!(state.published && !state.carries);
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn reader_grant_is_one_secret_for_the_control_plane_group() -> anyhow::Result<()> {
    let server = ApiServer::start().await?;
    let client = server.client();
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), NS);

    // Narrowing with no binding leaves it absent.
    grants::narrow_certs_reader_binding(&client).await?;
    assert!(bindings.get_opt(grants::READER_NAME).await?.is_none());

    grants::grant_certs_reader(&client).await?;
    let binding = bindings.get(grants::READER_NAME).await?;
    let subjects = binding.subjects.clone().unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].name, tokens::CONTROL_PLANE_GROUP);
    assert_eq!(binding.role_ref.kind, "Role");
    let roles: Api<k8s_openapi::api::rbac::v1::Role> = Api::namespaced(client.clone(), NS);
    let role = roles.get(grants::READER_NAME).await?;
    let rules = role.rules.unwrap_or_default();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].verbs, ["get"]);
    assert_eq!(
        rules[0].resource_names.as_deref().unwrap_or_default(),
        [grants::SECRET_NAME]
    );

    // Steady state writes nothing.
    server.clear_requests();
    grants::grant_certs_reader(&client).await?;
    grants::narrow_certs_reader_binding(&client).await?;
    assert!(server.requests().iter().all(|r| !r.is_write()));

    // A binding someone widened to every worker is narrowed again.
    let mut wide = bindings.get(grants::READER_NAME).await?;
    wide.subjects.get_or_insert_with(Vec::new).push(Subject {
        api_group: Some("rbac.authorization.k8s.io".into()),
        kind: "Group".into(),
        name: tokens::WORKER_GROUP.into(),
        namespace: None,
    });
    bindings
        .replace(grants::READER_NAME, &PostParams::default(), &wide)
        .await?;
    grants::narrow_certs_reader_binding(&client).await?;
    let narrowed = bindings.get(grants::READER_NAME).await?;
    let names: Vec<_> = narrowed
        .subjects
        .unwrap_or_default()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, [tokens::CONTROL_PLANE_GROUP]);
    server.shutdown().await;
    Ok(())
}

/// admin.conf's group gets its rights from one ClusterRoleBinding to cluster-admin, which
/// bootstrap creates once; a second run writes nothing, and a binding missing the group
/// gets it added without losing its other subjects.
#[tokio::test]
async fn cluster_admins_binding_is_created_once_and_repaired() -> anyhow::Result<()> {
    use ha::admins::{self, BindingChange};
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let server = ApiServer::start().await?;
    let client = server.client();
    let api: Api<ClusterRoleBinding> = Api::all(client.clone());
    assert_eq!(
        admins::ensure_cluster_admins_binding(&client).await?,
        BindingChange::Created
    );
    let created = api.get(admins::CLUSTER_ADMINS_BINDING).await?;
    assert_eq!(created.role_ref.kind, "ClusterRole");
    assert_eq!(created.role_ref.name, "cluster-admin");
    let subjects = created.subjects.clone().unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(
        (subjects[0].kind.as_str(), subjects[0].name.as_str()),
        ("Group", pki::CLUSTER_ADMINS_GROUP)
    );
    assert_eq!(
        admins::ensure_cluster_admins_binding(&client).await?,
        BindingChange::Unchanged
    );
    let again = api.get(admins::CLUSTER_ADMINS_BINDING).await?;
    assert_eq!(
        again.metadata.resource_version, created.metadata.resource_version,
        "a steady state writes nothing"
    );
    let mut edited = again;
    edited.subjects = Some(vec![Subject {
        api_group: Some("rbac.authorization.k8s.io".into()),
        kind: "User".into(),
        name: "alice".into(),
        namespace: None,
    }]);
    api.replace(
        admins::CLUSTER_ADMINS_BINDING,
        &PostParams::default(),
        &edited,
    )
    .await?;
    assert_eq!(
        admins::ensure_cluster_admins_binding(&client).await?,
        BindingChange::SubjectAdded
    );
    let repaired = api.get(admins::CLUSTER_ADMINS_BINDING).await?;
    let names: Vec<String> = repaired
        .subjects
        .unwrap_or_default()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(
        names,
        vec!["alice".to_string(), pki::CLUSTER_ADMINS_GROUP.to_string()]
    );
    server.shutdown().await;
    Ok(())
}

/// The key proof speaks for the publication it was sealed with: a Secret whose generation
/// moved on (rewritten by hand, or by a writer that left the old proof in) no longer
/// proves it carries this node's at-rest key.
#[tokio::test]
async fn a_key_proof_vouches_for_its_own_generation_only() -> anyhow::Result<()> {
    let server = ApiServer::start().await?;
    let client = server.client();
    let (pki_dir, _) = shared_pki()?;
    let config = b"kind: EncryptionConfiguration\n# secret: c2VjcmV0c2VjcmV0\n".to_vec();
    std::fs::write(pki_dir.path().join(grants::ENCRYPTION_CONFIG_FILE), &config)?;
    let files = grants::read_bundle_files(pki_dir.path())?;
    let a = mint(&client, Duration::from_secs(3600)).await?;
    upload(&client, &CertKey::generate(), &a, &files).await?;
    assert!(
        grants::published_bundle_carries_key(&client, Some(&config))
            .await?
            .carries
    );
    let api: Api<Secret> = Api::namespaced(client.clone(), NS);
    let mut secret = api.get(grants::SECRET_NAME).await?;
    secret
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(grants::plan::GENERATION_ANNOTATION.into(), "2".into());
    api.replace(grants::SECRET_NAME, &PostParams::default(), &secret)
        .await?;
    let state = grants::published_bundle_carries_key(&client, Some(&config)).await?;
    assert!(
        state.published && !state.carries,
        "a generation-1 proof must not vouch for generation 2"
    );
    server.shutdown().await;
    Ok(())
}

/// A rekey to the certificate-key already set is refused before anything is written:
/// it would retire nothing the old key opens.
#[tokio::test]
async fn a_rekey_to_the_key_already_set_is_refused() -> anyhow::Result<()> {
    let server = ApiServer::start().await?;
    let client = server.client();
    let (pki_dir, files) = shared_pki()?;
    let a = mint(&client, Duration::from_secs(3600)).await?;
    let current = CertKey::generate();
    upload(&client, &current, &a, &files).await?;
    let before = grant_secret(&client).await?.context("published")?;
    let err = grants::rekey_shared_certs(
        &client,
        pki_dir.path(),
        &current,
        &UploadProfile::default(),
        grants::no_confirm,
    )
    .await
    .expect_err("a rekey to the same key must be refused");
    assert!(err.to_string().contains("same key"), "{err}");
    assert_eq!(grant_secret(&client).await?.context("kept")?, before);
    // A fresh key goes through; the earlier one, no longer current, may be chosen again.
    let fresh = CertKey::generate();
    grants::rekey_shared_certs(
        &client,
        pki_dir.path(),
        &fresh,
        &UploadProfile::default(),
        grants::no_confirm,
    )
    .await?;
    grants::rekey_shared_certs(
        &client,
        pki_dir.path(),
        &current,
        &UploadProfile::default(),
        grants::no_confirm,
    )
    .await?;
    server.shutdown().await;
    Ok(())
}
