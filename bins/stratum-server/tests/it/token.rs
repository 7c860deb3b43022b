//! `stratum-server token create`, run as a process against the API double.

use std::path::{Path, PathBuf};
use std::process::Output;

use anyhow::Context as _;
use ha::grants::{self, BoxError, CertKey};
use ha::tokens::{self, BootstrapToken};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};
use testkube::ApiServer;

async fn stratum_server(args: &[&str]) -> anyhow::Result<Output> {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_stratum-server"))
        .args(args)
        .env_remove("KUBECONFIG")
        .kill_on_drop(true)
        .output()
        .await
        .context("cannot run stratum-server")?;
    Ok(output)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The API double's kubeconfig with its user replaced by a bearer token.
fn bootstrap_kubeconfig(
    server: &ApiServer,
    dir: &Path,
    token: &BootstrapToken,
) -> anyhow::Result<PathBuf> {
    let mut config: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(server.kubeconfig_path())?)?;
    for user in config["users"]
        .as_sequence_mut()
        .context("kubeconfig without users")?
    {
        let mut auth = serde_yaml::Mapping::new();
        auth.insert("token".into(), token.to_string().into());
        user["user"] = serde_yaml::Value::Mapping(auth);
    }
    let path = dir.join("bootstrap.conf");
    std::fs::write(&path, serde_yaml::to_string(&config)?)?;
    Ok(path)
}

async fn token_secrets(client: &kube::Client) -> anyhow::Result<Vec<Secret>> {
    let api: Api<Secret> = Api::namespaced(client.clone(), tokens::TOKEN_NAMESPACE);
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|s| s.type_.as_deref() == Some(tokens::TOKEN_SECRET_TYPE))
        .collect())
}

#[tokio::test]
async fn control_plane_token_prints_a_pinned_join_and_a_key_that_opens_its_grant()
-> anyhow::Result<()> {
    let server = ApiServer::start().await?;
    let client = server.client();
    let pki_dir = tempfile::tempdir()?;
    pki::generate_shared(pki_dir.path(), false)?;
    let kubeconfig = server
        .kubeconfig_path()
        .to_str()
        .context("path")?
        .to_string();
    let pki_arg = pki_dir.path().to_str().context("path")?.to_string();

    let out = stratum_server(&[
        "token",
        "create",
        "--control-plane",
        "--ttl",
        "1h",
        "--kubeconfig",
        &kubeconfig,
        "--pki-dir",
        &pki_arg,
        "--vip",
        "10.0.0.100",
        "-o",
        "json",
    ])
    .await?;
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("stdout is not JSON: {}", text(&out.stdout)))?;
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("WARNING") && stderr.contains("certificate-key"),
        "{stderr}"
    );

    let pin = pki::ca_cert_hash(&std::fs::read(pki_dir.path().join("ca.crt"))?)?;
    assert_eq!(json["caCertHash"], pin.as_str());
    let token = BootstrapToken::parse(json["token"].as_str().context("token")?)?;
    let key_hex = json["certificateKey"].as_str().context("certificateKey")?;
    let server_addr = format!("127.0.0.1:{}", server.addr().port());
    assert_eq!(json["server"], server_addr.as_str());
    let join = json["joinCommand"].as_str().context("joinCommand")?;
    for part in [
        format!("--server {server_addr}"),
        format!("--token {token}"),
        format!("--discovery-token-ca-cert-hash {pin}"),
        format!("--certificate-key {key_hex}"),
    ] {
        assert!(join.contains(&part), "{join} lacks {part}");
    }
    assert!(pin.starts_with("sha256:") && pin.len() == 7 + 64, "{pin}");

    // The token Secret carries the control-plane group.
    let secrets = token_secrets(&client).await?;
    assert_eq!(secrets.len(), 1);
    let groups = &secrets[0].data.as_ref().context("data")?["auth-extra-groups"].0;
    assert!(String::from_utf8_lossy(groups).contains(tokens::CONTROL_PLANE_GROUP));

    // The printed key opens the grant this token reads.
    let scratch = tempfile::tempdir()?;
    let bootstrap = bootstrap_kubeconfig(&server, scratch.path(), &token)?;
    let target = tempfile::tempdir()?;
    let key = CertKey::from_hex(key_hex)?;
    let profile = grants::download_certs(&bootstrap, target.path(), &key, |p| {
        if p.vip.as_deref() == Some("10.0.0.100") {
            Ok(())
        } else {
            Err::<(), BoxError>(format!("unexpected VIP {:?}", p.vip).into())
        }
    })
    .await?;
    assert_eq!(profile.entry, grants::grant_entry_name(token.id()));
    assert_eq!(
        grants::read_bundle_files(target.path())?,
        grants::read_bundle_files(pki_dir.path())?
    );
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn worker_token_prints_a_pinned_join_without_a_grant() -> anyhow::Result<()> {
    let server = ApiServer::start().await?;
    let client = server.client();
    let pki_dir = tempfile::tempdir()?;
    pki::generate_shared(pki_dir.path(), false)?;
    let kubeconfig = server
        .kubeconfig_path()
        .to_str()
        .context("path")?
        .to_string();
    let pki_arg = pki_dir.path().to_str().context("path")?.to_string();

    let out = stratum_server(&[
        "token",
        "create",
        "--kubeconfig",
        &kubeconfig,
        "--pki-dir",
        &pki_arg,
        "--server",
        "cp.example:6443",
    ])
    .await?;
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let pin = pki::ca_cert_hash(&std::fs::read(pki_dir.path().join("ca.crt"))?)?;
    assert!(
        stdout.contains(&format!("--discovery-token-ca-cert-hash {pin}")),
        "{stdout}"
    );
    assert!(stdout.contains("--server cp.example:6443"), "{stdout}");
    assert!(!stdout.contains("certificate-key"), "{stdout}");
    assert!(!text(&out.stderr).contains("WARNING"));
    let secrets = token_secrets(&client).await?;
    assert_eq!(secrets.len(), 1);
    let groups = &secrets[0].data.as_ref().context("data")?["auth-extra-groups"].0;
    assert_eq!(groups.as_slice(), tokens::WORKER_GROUP.as_bytes());
    let api: Api<Secret> = Api::namespaced(client.clone(), grants::NAMESPACE);
    assert!(api.get_opt(grants::SECRET_NAME).await?.is_none());
    // cluster-info names the server the join command dials, with the cluster CA.
    let info: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), "kube-public");
    let info = info.get("cluster-info").await?;
    let kubeconfig_text = &info.data.context("cluster-info data")?["kubeconfig"];
    assert!(
        kubeconfig_text.contains("https://cp.example:6443"),
        "{kubeconfig_text}"
    );

    // A pki dir without the CA is refused before anything is minted.
    let empty = tempfile::tempdir()?;
    let out = stratum_server(&[
        "token",
        "create",
        "--control-plane",
        "--kubeconfig",
        &kubeconfig,
        "--pki-dir",
        empty.path().to_str().context("path")?,
    ])
    .await?;
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("ca.crt"), "{stderr}");
    assert_eq!(token_secrets(&client).await?.len(), 1);

    // A bad TTL is refused with the units it accepts.
    let out = stratum_server(&[
        "token",
        "create",
        "--ttl",
        "2fortnights",
        "--kubeconfig",
        &kubeconfig,
        "--pki-dir",
        &pki_arg,
    ])
    .await?;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--ttl") && text(&out.stderr).contains("supported units"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(token_secrets(&client).await?.len(), 1);
    server.shutdown().await;
    Ok(())
}

/// A grant Secret whose generation annotation sits at u64::MAX: `token create
/// --control-plane` fails with an error naming the annotation, not a panic, and leaves no
/// live control-plane token without its grant.
#[tokio::test]
async fn a_generation_at_u64_max_fails_cleanly_and_deletes_the_token() -> anyhow::Result<()> {
    let server = ApiServer::start().await?;
    let client = server.client();
    let pki_dir = tempfile::tempdir()?;
    pki::generate_shared(pki_dir.path(), false)?;
    let api: Api<Secret> = Api::namespaced(client.clone(), grants::NAMESPACE);
    let mut planted = Secret::default();
    planted.metadata.name = Some(grants::SECRET_NAME.into());
    planted.metadata.annotations = Some(
        [(
            grants::plan::GENERATION_ANNOTATION.to_string(),
            u64::MAX.to_string(),
        )]
        .into(),
    );
    api.create(&Default::default(), &planted).await?;
    let kubeconfig = server
        .kubeconfig_path()
        .to_str()
        .context("path")?
        .to_string();
    let out = stratum_server(&[
        "token",
        "create",
        "--control-plane",
        "--kubeconfig",
        &kubeconfig,
        "--pki-dir",
        pki_dir.path().to_str().context("path")?,
    ])
    .await?;
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "a panic: {stderr}");
    assert!(
        stderr.contains(grants::plan::GENERATION_ANNOTATION),
        "{stderr}"
    );
    assert!(
        token_secrets(&client).await?.is_empty(),
        "the control-plane token without a grant was deleted again"
    );
    let after = api.get(grants::SECRET_NAME).await?;
    assert!(
        after.data.unwrap_or_default().is_empty(),
        "nothing was published"
    );
    server.shutdown().await;
    Ok(())
}

/// Token lifetimes: an enormous --ttl is an error, not a panic; a control-plane token is
/// capped at 24h unless --allow-long-ttl is given.
#[tokio::test]
async fn token_lifetimes_are_bounded_and_never_panic() -> anyhow::Result<()> {
    let server = ApiServer::start().await?;
    let client = server.client();
    let pki_dir = tempfile::tempdir()?;
    pki::generate_shared(pki_dir.path(), false)?;
    let kubeconfig = server
        .kubeconfig_path()
        .to_str()
        .context("path")?
        .to_string();
    let pki_arg = pki_dir.path().to_str().context("path")?.to_string();
    let run = |extra: &'static [&'static str]| {
        let (kubeconfig, pki_arg) = (kubeconfig.clone(), pki_arg.clone());
        async move {
            let mut args = vec![
                "token",
                "create",
                "--kubeconfig",
                &kubeconfig,
                "--pki-dir",
                &pki_arg,
            ];
            args.extend_from_slice(extra);
            stratum_server(&args).await
        }
    };
    let out = run(&["--ttl", "3000000000h"]).await?;
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success() && !stderr.contains("panicked"),
        "{stderr}"
    );
    assert!(stderr.contains("calendar"), "{stderr}");
    let out = run(&["--control-plane", "--ttl", "25h"]).await?;
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("24h") && stderr.contains("--allow-long-ttl"),
        "{stderr}"
    );
    assert!(token_secrets(&client).await?.is_empty(), "nothing minted");
    let out = run(&["--control-plane", "--ttl", "25h", "--allow-long-ttl"]).await?;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(token_secrets(&client).await?.len(), 1);
    server.shutdown().await;
    Ok(())
}

/// `token create` against the double's bootstrap signer, the way a worker then joins: an
/// anonymous client reads a cluster-info signed for the printed token, `ha::discovery`
/// verifies it with the token and the printed pin, and nothing else is readable
/// anonymously. A second `token create` writes no discovery object.
#[tokio::test]
async fn a_printed_join_discovers_the_cluster_through_the_signed_cluster_info() -> anyhow::Result<()>
{
    use ha::discovery::{self, CaPin, DiscoveryTimeouts};
    use std::time::Duration;

    let pki_dir = tempfile::tempdir()?;
    pki::generate_shared(pki_dir.path(), false)?;
    let server = ApiServer::builder()
        .pki_dir(pki_dir.path())
        .strict_auth()
        .bootstrap_signer(true)
        .start()
        .await?;
    let kubeconfig = server
        .kubeconfig_path()
        .to_str()
        .context("path")?
        .to_string();
    let pki_arg = pki_dir.path().to_str().context("path")?.to_string();
    let args = [
        "token",
        "create",
        "-o",
        "json",
        "--kubeconfig",
        &kubeconfig,
        "--pki-dir",
        &pki_arg,
    ];
    let out = stratum_server(&args).await?;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let token = BootstrapToken::parse(printed["token"].as_str().context("token")?)?;
    let pin = CaPin::parse(printed["caCertHash"].as_str().context("caCertHash")?)?;
    let host_port = printed["server"].as_str().context("server")?.to_string();
    let found = discovery::discover(
        &host_port,
        &token,
        &pin,
        DiscoveryTimeouts {
            total: Duration::from_secs(15),
            request: Duration::from_secs(5),
        },
    )
    .await?;
    assert_eq!(found.info.server, format!("https://{host_port}"));

    let ca = std::fs::read(pki_dir.path().join("ca.crt"))?;
    let anon = discovery::client_for(&found.server_url, Some(&ca), None, Duration::from_secs(5))?;
    let secrets: Api<Secret> = Api::namespaced(anon.clone(), tokens::TOKEN_NAMESPACE);
    assert!(secrets.list(&ListParams::default()).await.is_err());
    let public: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(anon, "kube-public");
    assert!(public.list(&ListParams::default()).await.is_err());

    server.clear_requests();
    let out = stratum_server(&args).await?;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let discovery_writes: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|q| q.is_write())
        .filter(|q| q.namespace.as_deref() == Some("kube-public"))
        .collect();
    assert!(discovery_writes.is_empty(), "{discovery_writes:#?}");
    server.shutdown().await;
    Ok(())
}
