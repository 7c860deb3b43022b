//! Bootstrap tokens and the ways callers authenticate:
//! `pkg/controller/bootstrap/bootstrapsigner.go` with `cluster-bootstrap/token/jws`,
//! `plugin/pkg/auth/authenticator/token/bootstrap/bootstrap.go`, and the authenticator
//! chain of `staging/src/k8s.io/apiserver/pkg/authentication/request/union` (x509 before
//! tokens, FailOnError before anonymous).

use std::collections::BTreeMap;

use base64::Engine;
use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testkube::fixtures::eventually;
use testkube::{ApiServer, UserInfo};

const ID: &str = "abc123";
const SECRET: &str = "0123456789abcdef";

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn token_secret(id: &str, extra: &[(&str, &str)]) -> Secret {
    let mut data = json!({"token-id": b64(id), "token-secret": b64(SECRET),
        "usage-bootstrap-authentication": b64("true"), "usage-bootstrap-signing": b64("true")});
    for (k, v) in extra {
        data[*k] = json!(b64(v));
    }
    serde_json::from_value(
        json!({"metadata": {"name": format!("bootstrap-token-{id}")},
        "type": "bootstrap.kubernetes.io/token", "data": data}),
    )
    .unwrap()
}

fn cluster_info(kubeconfig: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": "cluster-info"},
        "data": {"kubeconfig": kubeconfig, "jws-kubeconfig-stale1": "old"}}))
    .unwrap()
}

/// A client that presents no credentials at all.
fn anonymous(s: &ApiServer) -> kube::Client {
    let mut cfg = s.config();
    cfg.auth_info = Default::default();
    kube::Client::try_from(cfg).unwrap()
}

/// A client with a bearer token (and whatever certificate `base` carries).
fn with_token(base: kube::Config, token: &str) -> kube::Client {
    let mut cfg = base;
    cfg.auth_info.token = Some(token.to_string().into());
    kube::Client::try_from(cfg).unwrap()
}

fn code(r: Result<impl std::fmt::Debug, kube::Error>) -> u16 {
    match r {
        Ok(_) => 200,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => panic!("expected an HTTP answer, got {e}"),
    }
}

async fn data(api: &Api<ConfigMap>) -> BTreeMap<String, String> {
    api.get("cluster-info")
        .await
        .unwrap()
        .data
        .unwrap_or_default()
}

#[tokio::test]
async fn bootstrap_signer_signs_cluster_info_per_signing_token_and_drops_stale_signatures() {
    let s = ApiServer::builder()
        .strict_auth()
        .bootstrap_signer(true)
        .start()
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "kube-public");
    let secrets: Api<Secret> = Api::namespaced(s.client(), "kube-system");
    let kc = "apiVersion: v1\nkind: Config\nclusters: []\n";
    cms.create(&PostParams::default(), &cluster_info(kc))
        .await
        .unwrap();
    eventually("the stale signature goes", || async {
        !data(&cms).await.contains_key("jws-kubeconfig-stale1")
    })
    .await;
    secrets
        .create(&PostParams::default(), &token_secret(ID, &[]))
        .await
        .unwrap();
    // A token without the signing usage, and one whose id differs from its name's.
    let mut no_sign = token_secret("nosign", &[]);
    no_sign
        .data
        .as_mut()
        .unwrap()
        .remove("usage-bootstrap-signing");
    secrets
        .create(&PostParams::default(), &no_sign)
        .await
        .unwrap();
    let mut mismatch = token_secret("zzzzzz", &[]);
    mismatch.metadata.name = Some("bootstrap-token-yyyyyy".into());
    secrets
        .create(&PostParams::default(), &mismatch)
        .await
        .unwrap();
    let key = format!("jws-kubeconfig-{ID}");
    eventually("cluster-info is signed for the token", || async {
        data(&cms).await.contains_key(&key)
    })
    .await;
    let d = data(&cms).await;
    assert_eq!(d[&key], testkube::bootstrap::detached_jws(kc, ID, SECRET));
    let (header, rest) = d[&key]
        .split_once("..")
        .expect("detached: header..signature");
    let header = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header)
        .unwrap();
    assert_eq!(header, br#"{"alg":"HS256","kid":"abc123"}"#);
    assert!(!rest.contains('.'));
    let keys: Vec<&String> = d.keys().filter(|k| k.starts_with("jws-")).collect();
    assert_eq!(
        keys,
        [&key],
        "only the signing token whose id matches its name signs"
    );

    // Anonymous callers read cluster-info even under strict auth, and nothing else.
    let anon = anonymous(&s);
    let public: Api<ConfigMap> = Api::namespaced(anon.clone(), "kube-public");
    let got = public.get("cluster-info").await.unwrap();
    assert_eq!(got.data.unwrap()[&key], d[&key]);
    assert_eq!(code(public.list(&ListParams::default()).await), 401);
    assert_eq!(
        code(
            Api::<ConfigMap>::namespaced(anon, "default")
                .get("cluster-info")
                .await
        ),
        401
    );

    // The signature follows the content; a deleted token's signature goes.
    cms.patch(
        "cluster-info",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"kubeconfig": "changed"}})),
    )
    .await
    .unwrap();
    eventually("the signature follows the new content", || async {
        data(&cms).await.get(&key)
            == Some(&testkube::bootstrap::detached_jws("changed", ID, SECRET))
    })
    .await;
    secrets
        .delete(&format!("bootstrap-token-{ID}"), &DeleteParams::default())
        .await
        .unwrap();
    eventually("the deleted token's signature goes", || async {
        !data(&cms).await.contains_key(&key)
    })
    .await;
    // Steady state: nothing rewrites cluster-info.
    let rv = s.resource_version();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(s.resource_version(), rv);
}

#[tokio::test]
async fn bootstrap_token_authentication_follows_the_upstream_rules() {
    let s = ApiServer::builder().strict_auth().start().await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(s.client(), "kube-system");
    let token = format!("{ID}.{SECRET}");
    let no_cert = || {
        let mut c = s.config();
        c.auth_info = Default::default();
        c
    };
    let ok = token_secret(
        ID,
        &[(
            "auth-extra-groups",
            "system:bootstrappers:kubeadm:default-node-token",
        )],
    );
    secrets.create(&PostParams::default(), &ok).await.unwrap();
    let as_token = with_token(no_cert(), &token);
    let cms: Api<ConfigMap> = Api::namespaced(as_token.clone(), "default");
    assert_eq!(code(cms.list(&ListParams::default()).await), 200);
    let reviews: Api<TokenReview> = Api::all(s.client());
    let review: TokenReview = serde_json::from_value(json!({"spec": {"token": token}})).unwrap();
    let st = reviews
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap();
    let user = st.user.unwrap();
    assert_eq!(user.username.as_deref(), Some("system:bootstrap:abc123"));
    assert_eq!(
        user.groups.unwrap(),
        [
            "system:bootstrappers",
            "system:bootstrappers:kubeadm:default-node-token",
            "system:authenticated"
        ]
    );

    // An extra group outside system:bootstrappers:* rejects the token.
    secrets
        .patch(
            &format!("bootstrap-token-{ID}"),
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"auth-extra-groups": b64("system:masters")}})),
        )
        .await
        .unwrap();
    assert_eq!(code(cms.list(&ListParams::default()).await), 401);

    // token-id must match the id in the Secret's name.
    let mut renamed = token_secret("bbbbbb", &[]);
    renamed.data.as_mut().unwrap().insert(
        "token-id".into(),
        k8s_openapi::ByteString(b"cccccc".to_vec()),
    );
    secrets
        .create(&PostParams::default(), &renamed)
        .await
        .unwrap();
    let other = with_token(no_cert(), &format!("bbbbbb.{SECRET}"));
    assert_eq!(
        code(
            Api::<ConfigMap>::namespaced(other, "default")
                .list(&ListParams::default())
                .await
        ),
        401
    );

    // A Secret being deleted (held by a finalizer) does not authenticate.
    let mut held = token_secret("dddddd", &[]);
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    secrets.create(&PostParams::default(), &held).await.unwrap();
    let dtoken = with_token(no_cert(), &format!("dddddd.{SECRET}"));
    let dapi: Api<ConfigMap> = Api::namespaced(dtoken, "default");
    assert_eq!(code(dapi.list(&ListParams::default()).await), 200);
    secrets
        .delete("bootstrap-token-dddddd", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(code(dapi.list(&ListParams::default()).await), 401);
}

#[tokio::test]
async fn an_invalid_bearer_token_is_401_even_when_anonymous_requests_are_allowed() {
    let s = ApiServer::start().await.unwrap();
    let mut cfg = s.config();
    cfg.auth_info = Default::default();
    let bad = with_token(cfg, "not-a-known-token");
    let api: Api<ConfigMap> = Api::namespaced(bad, "default");
    assert_eq!(code(api.list(&ListParams::default()).await), 401);
    // No credential at all is anonymous, and allowed in this mode.
    let anon: Api<ConfigMap> = Api::namespaced(anonymous(&s), "default");
    assert_eq!(code(anon.list(&ListParams::default()).await), 200);
}

#[tokio::test]
async fn a_client_certificate_from_an_unknown_ca_is_an_http_401() {
    let s = ApiServer::start().await.unwrap();
    let stranger_ca = testkube::tls::Ca::generate("elsewhere").unwrap();
    let pair = stranger_ca
        .issue("mallory", &["system:masters"], &[], false, true)
        .unwrap();
    let mut cfg = s.config();
    cfg.auth_info = Default::default();
    cfg.auth_info.client_certificate_data =
        Some(base64::engine::general_purpose::STANDARD.encode(&pair.cert_pem));
    cfg.auth_info.client_key_data = Some(
        base64::engine::general_purpose::STANDARD
            .encode(&pair.key_pem)
            .into(),
    );
    let client = kube::Client::try_from(cfg).unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    // The TLS handshake succeeds; the answer is a 401 Status.
    assert_eq!(code(api.list(&ListParams::default()).await), 401);
}

#[tokio::test]
async fn x509_is_tried_before_bearer_tokens() {
    let s = ApiServer::builder()
        .strict_auth()
        .token("bob-token", UserInfo::new("bob", &[]))
        .authorizer(|u, _| u.username == "alice")
        .start()
        .await
        .unwrap();
    let alice = s.issue_client_cert("alice", &["dev"]).unwrap();
    let mut cfg = s.config();
    cfg.auth_info = Default::default();
    cfg.auth_info.client_certificate_data =
        Some(base64::engine::general_purpose::STANDARD.encode(&alice.cert_pem));
    cfg.auth_info.client_key_data = Some(
        base64::engine::general_purpose::STANDARD
            .encode(&alice.key_pem)
            .into(),
    );
    // alice's certificate and bob's token: the request is alice's.
    let both = with_token(cfg, "bob-token");
    let api: Api<ConfigMap> = Api::namespaced(both, "default");
    assert_eq!(code(api.list(&ListParams::default()).await), 200);
}

#[tokio::test]
async fn pki_dir_serves_with_the_cluster_ca() {
    let dir = tempfile::tempdir().unwrap();
    pki::generate_shared(dir.path(), false).unwrap();
    let ca = std::fs::read_to_string(dir.path().join("ca.crt")).unwrap();
    let s = ApiServer::builder()
        .pki_dir(dir.path())
        .start()
        .await
        .unwrap();
    assert_eq!(s.ca_pem(), ca);
    // The kubeconfig pins the cluster CA, and the server's certificate chains to it.
    let kc = kube::config::Kubeconfig::read_from(s.kubeconfig_path()).unwrap();
    let pinned = kc.clusters[0]
        .cluster
        .as_ref()
        .unwrap()
        .certificate_authority_data
        .clone()
        .unwrap();
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(pinned)
            .unwrap(),
        ca.as_bytes()
    );
    Api::<ConfigMap>::namespaced(s.client(), "default")
        .list(&ListParams::default())
        .await
        .unwrap();
    // A directory without the CA is an error naming the fix.
    let empty = tempfile::tempdir().unwrap();
    let err = ApiServer::builder()
        .pki_dir(empty.path())
        .start()
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("stratum-server certs generate"),
        "{err}"
    );
}
