//! `token create`'s mint protocol as a library, against the API double.

use std::collections::BTreeMap;
use std::time::Duration;

use ha::bootstrap::ServerPolicy;
use ha::grants::{self, UploadProfile};
use ha::mint::{self, Cleanup, Discovery, GrantRequest, MintError, MintRequest};
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

fn request(server: &ApiServer, grant: Option<GrantRequest>) -> MintRequest<'static> {
    MintRequest {
        discovery: Discovery {
            server: server.url(),
            ca_pem: server.ca_pem().into_bytes(),
            policy: ServerPolicy::KeepPublished,
        },
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
    let worker = mint::mint(&client, &request(&server, None), jiff::Timestamp::now()).await?;
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
        &request(&server, Some(grant(dir.path())?)),
        jiff::Timestamp::now(),
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

    let mut long = request(&server, Some(g.clone()));
    long.ttl = Duration::from_secs(25 * 3600);
    let err = mint::mint(&client, &long, jiff::Timestamp::now())
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
    let err = mint::mint(
        &client,
        &request(&server, Some(g.clone())),
        jiff::Timestamp::now(),
    )
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
    let err = mint::mint(&client, &request(&server, Some(g)), jiff::Timestamp::now())
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

/// After a mint against the double's bootstrap signer, an anonymous client reads a signed
/// cluster-info that `ha::discovery` verifies with the token and the CA pin, and cannot
/// read anything else; a second mint writes no discovery object.
#[tokio::test]
async fn a_minted_token_discovers_the_cluster_anonymously_and_nothing_else_is_public()
-> anyhow::Result<()> {
    use ha::bootstrap::{self, CLUSTER_INFO_READER};
    use ha::discovery::{self, CaPin, DiscoveryTimeouts};
    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};

    let server = ApiServer::builder()
        .strict_auth()
        .bootstrap_signer(true)
        .start()
        .await?;
    let client = server.client();
    let first = mint::mint(&client, &request(&server, None), jiff::Timestamp::now()).await?;
    assert_eq!(
        first.discovery_writes, 3,
        "cluster-info, its reader Role and RoleBinding"
    );

    // Exactly one ConfigMap, one verb, one subject.
    let role: Role = Api::namespaced(client.clone(), "kube-public")
        .get(CLUSTER_INFO_READER)
        .await?;
    let rules = role.rules.unwrap_or_default();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].verbs, ["get"]);
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["configmaps".to_string()][..])
    );
    assert_eq!(
        rules[0].resource_names.as_deref(),
        Some(&["cluster-info".to_string()][..])
    );
    let binding: RoleBinding = Api::namespaced(client.clone(), "kube-public")
        .get(CLUSTER_INFO_READER)
        .await?;
    let subjects = binding.subjects.unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(
        (subjects[0].kind.as_str(), subjects[0].name.as_str()),
        ("User", "system:anonymous")
    );

    // A joiner's discovery: anonymous, unverified fetch, the token's signature, the pin.
    let ca = server.ca_pem();
    let pin = CaPin::parse(&pki::ca_cert_hash(ca.as_bytes())?)?;
    let url = server.url();
    let host_port = url.trim_start_matches("https://").to_string();
    let timeouts = DiscoveryTimeouts {
        total: Duration::from_secs(15),
        request: Duration::from_secs(5),
    };
    let found = discovery::discover(&host_port, &first.token.token, &pin, timeouts).await?;
    assert_eq!(found.info.server, url);
    assert_eq!(found.info.ca_pem, ca.as_bytes());

    // Anonymous reads of anything else are refused.
    let anon = discovery::client_for(&url, Some(ca.as_bytes()), None, Duration::from_secs(5))?;
    let public: Api<ConfigMap> = Api::namespaced(anon.clone(), "kube-public");
    assert!(
        public.get("cluster-info").await.is_ok(),
        "cluster-info is public"
    );
    let refused = |r: Result<(), kube::Error>| match r {
        Err(kube::Error::Api(s)) => s.code == 401 || s.code == 403,
        _ => false,
    };
    assert!(
        refused(public.list(&ListParams::default()).await.map(|_| ())),
        "list"
    );
    let secrets: Api<Secret> = Api::namespaced(anon.clone(), NS);
    assert!(
        refused(
            secrets
                .get(&first.token.token.secret_name())
                .await
                .map(|_| ())
        ),
        "the token Secret"
    );
    let roles: Api<Role> = Api::namespaced(anon, "kube-public");
    assert!(
        refused(roles.get(CLUSTER_INFO_READER).await.map(|_| ())),
        "the Role"
    );

    // A second mint writes no discovery object, and its token is signed too.
    let second = mint::mint(&client, &request(&server, None), jiff::Timestamp::now()).await?;
    assert_eq!(second.discovery_writes, 0, "steady state writes nothing");
    discovery::discover(&host_port, &second.token.token, &pin, timeouts).await?;
    assert_eq!(
        bootstrap::ensure_discovery(&client, &url, ca.as_bytes()).await?,
        0
    );

    // A broadened Role is narrowed back.
    let mut broad = cluster_info_role_with_all_names(&client).await?;
    broad.metadata.managed_fields = None;
    Api::<Role>::namespaced(client.clone(), "kube-public")
        .replace(CLUSTER_INFO_READER, &Default::default(), &broad)
        .await?;
    assert_eq!(
        bootstrap::ensure_discovery(&client, &url, ca.as_bytes()).await?,
        1
    );
    let role: Role = Api::namespaced(client.clone(), "kube-public")
        .get(CLUSTER_INFO_READER)
        .await?;
    assert_eq!(role.rules, bootstrap::cluster_info_role().rules);

    // Another server: kept out when the published cluster-info carries this CA and the
    // policy keeps it (a kubeconfig pointing at 127.0.0.1 must not replace the VIP);
    // published when asked to replace.
    let mut other = request(&server, None);
    other.discovery.server = "https://10.9.9.9:6443".into();
    let kept = mint::mint(&client, &other, jiff::Timestamp::now()).await?;
    assert_eq!(kept.discovery_writes, 0);
    let info_server = || async {
        let cm: ConfigMap = Api::namespaced(client.clone(), "kube-public")
            .get("cluster-info")
            .await
            .unwrap();
        cm.data.unwrap_or_default()["kubeconfig"].clone()
    };
    assert!(info_server().await.contains(&url), "kept");
    other.discovery.policy = ServerPolicy::Replace;
    let replaced = mint::mint(&client, &other, jiff::Timestamp::now()).await?;
    assert_eq!(replaced.discovery_writes, 1);
    assert!(
        info_server().await.contains("https://10.9.9.9:6443"),
        "replaced"
    );
    server.shutdown().await;
    Ok(())
}

/// The reader Role as stored, with its `resourceNames` removed (every ConfigMap).
async fn cluster_info_role_with_all_names(
    client: &kube::Client,
) -> anyhow::Result<k8s_openapi::api::rbac::v1::Role> {
    let mut role: k8s_openapi::api::rbac::v1::Role = Api::namespaced(client.clone(), "kube-public")
        .get(ha::bootstrap::CLUSTER_INFO_READER)
        .await?;
    for rule in role.rules.iter_mut().flatten() {
        rule.resource_names = None;
    }
    Ok(role)
}
