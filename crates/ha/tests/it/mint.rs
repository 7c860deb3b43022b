//! `token create`'s mint protocol as a library, against the API double.

use std::collections::BTreeMap;
use std::time::Duration;

use ha::grants::{self, UploadProfile};
use ha::mint::{self, Cleanup, GrantRequest, MintError, MintRequest};
use ha::tokens::TokenRole;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};
use testkube::{ApiServer, Fault, FaultKind};

const NS: &str = "kube-system";

fn grant(dir: &std::path::Path) -> anyhow::Result<GrantRequest> {
    pki::generate_shared(dir, false)?;
    Ok(GrantRequest {
        files: grants::read_bundle_files(dir)?,
        profile: UploadProfile {
            vip: Some("10.0.0.100".into()),
            etcd_endpoints: vec!["https://10.0.0.1:2379".into()],
        },
    })
}

fn request(grant: Option<GrantRequest>) -> MintRequest<'static> {
    MintRequest {
        ttl: Duration::from_secs(3600),
        allow_long_ttl: false,
        description: Some("test"),
        grant,
    }
}

async fn token_secrets(client: &kube::Client) -> anyhow::Result<Vec<String>> {
    let api: Api<Secret> = Api::namespaced(client.clone(), NS);
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|s| s.type_.as_deref() == Some("bootstrap.kubernetes.io/token"))
        .filter_map(|s| s.metadata.name)
        .collect())
}

fn data_str(secret: &Secret, key: &str) -> String {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .unwrap_or_default()
}

/// A worker mint creates one token carrying both usages and no grant; a control-plane
/// mint also publishes the grant, owned by the token, under a fresh key.
#[tokio::test]
async fn worker_and_control_plane_mints() -> anyhow::Result<()> {
    let server = ApiServer::start().await?;
    let client = server.client();
    let worker = mint::mint(&client, &request(None), chrono::Utc::now()).await?;
    assert!(worker.cert_key.is_none());
    let api: Api<Secret> = Api::namespaced(client.clone(), NS);
    let secret = api.get(&worker.token.token.secret_name()).await?;
    assert_eq!(data_str(&secret, "usage-bootstrap-signing"), "true");
    assert_eq!(data_str(&secret, "usage-bootstrap-authentication"), "true");
    assert_eq!(
        data_str(&secret, "auth-extra-groups"),
        TokenRole::Worker.groups().join(",")
    );
    assert!(
        api.get_opt(grants::SECRET_NAME).await?.is_none(),
        "no grant"
    );

    let dir = tempfile::tempdir()?;
    let cp = mint::mint(
        &client,
        &request(Some(grant(dir.path())?)),
        chrono::Utc::now(),
    )
    .await?;
    assert!(cp.cert_key.is_some());
    let published = api.get(grants::SECRET_NAME).await?;
    let entry = grants::plan::grant_entry_name(cp.token.token.id());
    assert!(
        published
            .data
            .as_ref()
            .is_some_and(|d| d.contains_key(&entry)),
        "grant entry {entry} published"
    );
    let owners: Vec<String> = published
        .metadata
        .owner_references
        .unwrap_or_default()
        .into_iter()
        .map(|o| o.uid)
        .collect();
    assert!(owners.contains(&cp.token.uid), "{owners:?}");
    assert_eq!(token_secrets(&client).await?.len(), 2);
    server.shutdown().await;
    Ok(())
}

/// A refused TTL asks nothing of the API; a failed grant publication deletes the token
/// again, and a failed delete says so.
#[tokio::test]
async fn a_failed_grant_leaves_no_live_control_plane_token() -> anyhow::Result<()> {
    let server = ApiServer::start().await?;
    let client = server.client();
    let dir = tempfile::tempdir()?;
    let g = grant(dir.path())?;

    let mut long = request(Some(g.clone()));
    long.ttl = Duration::from_secs(25 * 3600);
    let err = mint::mint(&client, &long, chrono::Utc::now())
        .await
        .unwrap_err();
    assert!(matches!(err, MintError::Refused(_)), "{err}");
    assert!(token_secrets(&client).await?.is_empty());

    // A grant Secret whose generation cannot advance: the upload fails after the mint.
    let api: Api<Secret> = Api::namespaced(client.clone(), NS);
    let mut planted = Secret::default();
    planted.metadata.name = Some(grants::SECRET_NAME.into());
    planted.metadata.annotations = Some(BTreeMap::from([(
        grants::plan::GENERATION_ANNOTATION.to_string(),
        u64::MAX.to_string(),
    )]));
    api.create(&Default::default(), &planted).await?;
    let err = mint::mint(&client, &request(Some(g.clone())), chrono::Utc::now())
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            MintError::Grant {
                cleanup: Cleanup::Deleted,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("deleted again"), "{err}");
    assert!(token_secrets(&client).await?.is_empty(), "token deleted");

    // The delete fails too: the error says the token is still there.
    server.inject(
        Fault::new(FaultKind::Status(500))
            .verb("delete")
            .resource("secrets"),
    );
    let err = mint::mint(&client, &request(Some(g)), chrono::Utc::now())
        .await
        .unwrap_err();
    let MintError::Grant {
        token_id, cleanup, ..
    } = &err
    else {
        panic!("{err}");
    };
    assert!(matches!(cleanup, Cleanup::Failed(_)), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("by hand") && text.contains(&format!("bootstrap-token-{token_id}")),
        "{text}"
    );
    assert_eq!(token_secrets(&client).await?.len(), 1);
    server.shutdown().await;
    Ok(())
}
