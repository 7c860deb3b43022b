//! `join` against the API double: its bootstrap signer signs `kube-public/cluster-info`
//! per token, and its bootstrap authenticator decides who a token is.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agent::join::{JoinError, JoinRequest, join};
use base64::Engine as _;
use ha::discovery::{CaPin, DiscoveryError, DiscoveryTimeouts};
use ha::tokens::BootstrapToken;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, PostParams};
use testkube::ApiServer;

use super::common::{eventually_within, install_crypto};

const TEMPLATE: &str = "nodeName: worker-1\nhealth: {listen: '127.0.0.1:9101'}\nkubelet: {}\n";

fn token_secret(token: &BootstrapToken, expiration: jiff::Timestamp) -> Secret {
    let enc = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("bootstrap-token-{}", token.id()), "namespace": "kube-system"},
        "type": "bootstrap.kubernetes.io/token",
        "data": {
            "token-id": enc(token.id()),
            "token-secret": enc(token.secret()),
            "expiration": enc(&expiration.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
            "usage-bootstrap-authentication": enc("true"),
            "usage-bootstrap-signing": enc("true"),
            "auth-extra-groups": enc("system:bootstrappers:kubeadm:default-node-token"),
        },
    }))
    .unwrap()
}

async fn ensure_namespace(client: &kube::Client, name: &str) {
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("create namespace {name}: {e}"),
    }
}

/// The API double with the signer on, cluster-info published (server and CA), and a
/// token valid for an hour. Returns the server, the token and the `--server` value.
struct Cluster {
    server: ApiServer,
    token: BootstrapToken,
    pin: CaPin,
}

impl Cluster {
    async fn start(signer: bool) -> Cluster {
        install_crypto();
        // With the signer, strict authorization (anonymous may read cluster-info and
        // nothing else); without it, allow-all, so anonymous can still read cluster-info.
        let builder = ApiServer::builder().bootstrap_signer(signer);
        let builder = if signer {
            builder.strict_auth()
        } else {
            builder
        };
        let server = builder.start().await.unwrap();
        let client = server.client();
        for ns in ["kube-public", "kube-system"] {
            ensure_namespace(&client, ns).await;
        }
        let ca = server.ca_pem();
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cluster-info", "namespace": "kube-public"},
            "data": {"kubeconfig": ha::discovery::cluster_info_kubeconfig(&server.url(), ca.as_bytes())},
        }))
        .unwrap();
        Api::<ConfigMap>::namespaced(client.clone(), "kube-public")
            .create(&PostParams::default(), &cm)
            .await
            .unwrap();
        let token = BootstrapToken::generate();
        Api::<Secret>::namespaced(client.clone(), "kube-system")
            .create(
                &PostParams::default(),
                &token_secret(
                    &token,
                    jiff::Timestamp::now() + jiff::SignedDuration::from_hours(1),
                ),
            )
            .await
            .unwrap();
        let pin = CaPin::parse(&pki::ca_cert_hash(ca.as_bytes()).unwrap()).unwrap();
        Cluster { server, token, pin }
    }

    async fn cluster_info(&self) -> BTreeMap<String, String> {
        Api::<ConfigMap>::namespaced(self.server.client(), "kube-public")
            .get("cluster-info")
            .await
            .unwrap()
            .data
            .unwrap_or_default()
    }

    async fn wait_signed(&self, token: &BootstrapToken, signed: bool) {
        let key = ha::discovery::jws_key(token.id());
        eventually_within(
            "the signer to follow the token",
            Duration::from_secs(20),
            async || self.cluster_info().await.contains_key(&key) == signed,
        )
        .await;
    }

    fn request(&self, dir: &Path, token: &BootstrapToken, pin: &CaPin) -> JoinRequest {
        let template = dir.join("template.yaml");
        std::fs::write(&template, TEMPLATE).unwrap();
        JoinRequest {
            server: self.server.addr().to_string(),
            token: token.clone(),
            pin: pin.clone(),
            config: template,
            host_root: hostnode::HostRoot::new(dir.join("root")),
            timeouts: DiscoveryTimeouts {
                total: Duration::from_secs(2),
                request: Duration::from_secs(5),
            },
        }
    }
}

/// Every file below `dir`, with contents.
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.insert(p.clone(), Vec::new());
                out.extend(tree(&p));
            } else {
                out.insert(p.clone(), std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

/// Runs a join that must fail; asserts the host root is untouched and returns the error.
async fn refused(req: JoinRequest) -> JoinError {
    let root = req.host_root.prefix().to_path_buf();
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("keep"), b"before").unwrap();
    let before = tree(&root);
    let err = join(req).await.expect_err("the join must be refused");
    assert_eq!(
        tree(&root),
        before,
        "a refused join wrote below the host root: {err}"
    );
    err
}

fn chain(err: &JoinError) -> String {
    let mut out = err.to_string();
    let mut s = std::error::Error::source(err);
    while let Some(e) = s {
        out.push_str(": ");
        out.push_str(&e.to_string());
        s = e.source();
    }
    out
}

#[tokio::test]
async fn a_good_pin_joins_and_the_bootstrap_kubeconfig_authenticates_as_the_token() {
    let c = Cluster::start(true).await;
    c.wait_signed(&c.token, true).await;
    let dir = tempfile::tempdir().unwrap();
    let joined = join(c.request(dir.path(), &c.token, &c.pin)).await.unwrap();

    let root = dir.path().join("root");
    let kubeconfig = root.join("etc/kubernetes/bootstrap-kubelet.conf");
    assert_eq!(joined.bootstrap_kubeconfig, kubeconfig);
    use std::os::unix::fs::PermissionsExt;
    for (path, mode) in [
        (kubeconfig.clone(), 0o600),
        (root.join("etc/outpost-agent/agent.yaml"), 0o600),
        (root.join("etc/kubernetes/pki/ca.crt"), 0o644),
    ] {
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(
            meta.permissions().mode() & 0o777,
            mode,
            "{}",
            path.display()
        );
    }
    assert_eq!(
        std::fs::read_to_string(root.join("etc/kubernetes/pki/ca.crt")).unwrap(),
        c.server.ca_pem()
    );

    // The written agent configuration is one every command accepts, with the join's auth.
    let ns = agent::load_node_stack(&joined.config).unwrap();
    assert_eq!(ns.node_name, "worker-1");
    assert_eq!(ns.auth.name(), "bootstrap-token");

    // The kubeconfig, used as a client would, authenticates (a bad bearer would be 401)...
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
    let raw: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&kubeconfig).unwrap()).unwrap();
    let bearer = raw["users"][0]["user"]["token"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(bearer, c.token.to_string());
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    Api::<ConfigMap>::namespaced(client, "kube-public")
        .get("cluster-info")
        .await
        .unwrap();
    // ... as the token's bootstrap user.
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(bearer),
            ..Default::default()
        },
        ..Default::default()
    };
    let review = Api::<TokenReview>::all(c.server.client())
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    let status = review.status.unwrap();
    assert_eq!(status.authenticated, Some(true));
    let user = status.user.unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some(format!("system:bootstrap:{}", c.token.id()).as_str())
    );
    assert!(
        user.groups
            .unwrap()
            .contains(&"system:bootstrappers".to_string())
    );
}

#[tokio::test]
async fn a_wrong_pin_is_refused_and_writes_nothing() {
    let c = Cluster::start(true).await;
    c.wait_signed(&c.token, true).await;
    let other = pki::Ca::generate("not-this-cluster").unwrap();
    let wrong = CaPin::parse(&pki::ca_cert_hash(other.cert_pem().as_bytes()).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let err = refused(c.request(dir.path(), &c.token, &wrong)).await;
    assert!(
        matches!(
            &err,
            JoinError::Discovery {
                source: DiscoveryError::PinMismatch { .. },
                ..
            }
        ),
        "{}",
        chain(&err)
    );
    assert!(
        chain(&err).contains("--discovery-token-ca-cert-hash"),
        "{}",
        chain(&err)
    );
}

#[tokio::test]
async fn a_tampered_cluster_info_is_refused_and_writes_nothing() {
    // No signer: the fixture signs, then an attacker swaps the server in the kubeconfig.
    let c = Cluster::start(false).await;
    let api = Api::<ConfigMap>::namespaced(c.server.client(), "kube-public");
    let mut cm = api.get("cluster-info").await.unwrap();
    let data = cm.data.as_mut().unwrap();
    let kubeconfig = data["kubeconfig"].clone();
    data.insert(
        ha::discovery::jws_key(c.token.id()),
        ha::discovery::sign_detached(kubeconfig.as_bytes(), &c.token),
    );
    let evil = ha::discovery::cluster_info_kubeconfig(
        "https://203.0.113.66:6443",
        c.server.ca_pem().as_bytes(),
    );
    data.insert("kubeconfig".into(), evil);
    api.replace("cluster-info", &PostParams::default(), &cm)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let err = refused(c.request(dir.path(), &c.token, &c.pin)).await;
    assert!(
        matches!(
            &err,
            JoinError::Discovery {
                source: DiscoveryError::BadSignature { .. },
                ..
            }
        ),
        "{}",
        chain(&err)
    );
}

#[tokio::test]
async fn an_expired_token_is_refused_and_writes_nothing() {
    let c = Cluster::start(true).await;
    let expired = BootstrapToken::generate();
    Api::<Secret>::namespaced(c.server.client(), "kube-system")
        .create(
            &PostParams::default(),
            &token_secret(
                &expired,
                jiff::Timestamp::now() - jiff::SignedDuration::from_mins(1),
            ),
        )
        .await
        .unwrap();
    // The valid token is signed, the expired one never is.
    c.wait_signed(&c.token, true).await;
    c.wait_signed(&expired, false).await;
    let dir = tempfile::tempdir().unwrap();
    let err = refused(c.request(dir.path(), &expired, &c.pin)).await;
    let text = chain(&err);
    assert!(text.contains("unknown, expired or deleted"), "{text}");
    assert!(text.contains(expired.id()), "{text}");
    assert!(!text.contains(expired.secret()), "{text}");
}

#[tokio::test]
async fn a_deleted_token_is_refused_and_writes_nothing() {
    let c = Cluster::start(true).await;
    c.wait_signed(&c.token, true).await;
    Api::<Secret>::namespaced(c.server.client(), "kube-system")
        .delete(
            &format!("bootstrap-token-{}", c.token.id()),
            &Default::default(),
        )
        .await
        .unwrap();
    c.wait_signed(&c.token, false).await;
    let dir = tempfile::tempdir().unwrap();
    let err = refused(c.request(dir.path(), &c.token, &c.pin)).await;
    let text = chain(&err);
    assert!(text.contains("unknown, expired or deleted"), "{text}");
}

#[tokio::test]
async fn a_server_that_does_not_answer_is_named_and_nothing_is_written() {
    install_crypto();
    let port = super::common::free_port();
    let token = BootstrapToken::generate();
    let pin = CaPin::parse(&format!("sha256:{}", "a".repeat(64))).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("template.yaml");
    std::fs::write(&template, TEMPLATE).unwrap();
    let err = refused(JoinRequest {
        server: format!("127.0.0.1:{port}"),
        token,
        pin,
        config: template,
        host_root: hostnode::HostRoot::new(dir.path().join("root")),
        timeouts: DiscoveryTimeouts {
            total: Duration::from_secs(1),
            request: Duration::from_secs(1),
        },
    })
    .await;
    let text = chain(&err);
    assert!(
        text.contains(&format!(
            "cannot read kube-public/cluster-info from https://127.0.0.1:{port}"
        )),
        "{text}"
    );
}
