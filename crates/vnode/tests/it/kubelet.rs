//! The kubelet API's listener over real TLS: client certificates when a CA is set, and
//! the NotFound answers that say which part is missing.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use vnode::kubelet::KubeletServer;
use vnode::providers::memory::MemoryProvider;
use vnode::{Handler, Metrics};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A CA and a client certificate it signs: (ca_pem, client_cert_pem, client_key_pem).
fn ca_and_client() -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "kubelet-client-ca");
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_cert.pem(), ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kube-apiserver-kubelet-client");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &issuer).unwrap();
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

async fn start(server: KubeletServer) -> (Arc<KubeletServer>, u16, CancellationToken) {
    let server = Arc::new(server);
    let listener = server.bind().await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let cancel = CancellationToken::new();
    tokio::spawn(server.clone().serve(listener, cancel.clone()));
    (server, port, cancel)
}

/// GET `path` over TLS trusting the server's own certificate; the raw response text.
async fn get(
    server: &KubeletServer,
    port: u16,
    path: &str,
    client: Option<(&str, &str)>,
) -> std::io::Result<String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut server.cert_pem().as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let cfg = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut cert.as_bytes())
                .collect::<Result<_, _>>()
                .unwrap();
            let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut key.as_bytes())
                .unwrap()
                .unwrap();
            builder.with_client_auth_cert(certs, key).unwrap()
        }
    };
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = connector.connect(name, tcp).await?;
    tls.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(10), tls.read_to_string(&mut out))
        .await
        .expect("the kubelet API answered within 10 s")?;
    Ok(out)
}

/// The suite the server settles on with a client offering `suites` (in its order).
async fn negotiated_suite(
    server: &KubeletServer,
    port: u16,
    suites: &[rustls::CipherSuite],
) -> rustls::CipherSuite {
    let mut client_provider = rustls::crypto::ring::default_provider();
    client_provider
        .cipher_suites
        .retain(|s| suites.contains(&s.suite()));
    client_provider
        .cipher_suites
        .sort_by_key(|s| suites.iter().position(|x| *x == s.suite()));
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut server.cert_pem().as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(client_provider))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    tls.get_ref().1.negotiated_cipher_suite().unwrap().suite()
}

#[tokio::test]
async fn the_server_prefers_aes_128_gcm_whatever_the_client_lists_first() {
    use rustls::CipherSuite as S;
    let (server, port, cancel) =
        start(KubeletServer::new("127.0.0.1", "127.0.0.1:0", None).unwrap()).await;
    // rustls's own client lists AES-256 first; the server chooses by its own order, as a
    // Go server on AES hardware does: the cheaper suite for exec and log streams.
    let aes256_first = [
        S::TLS13_AES_256_GCM_SHA384,
        S::TLS13_CHACHA20_POLY1305_SHA256,
        S::TLS13_AES_128_GCM_SHA256,
    ];
    assert_eq!(
        negotiated_suite(&server, port, &aes256_first).await,
        S::TLS13_AES_128_GCM_SHA256
    );
    // A client without it still gets what it offers.
    assert_eq!(
        negotiated_suite(&server, port, &[S::TLS13_AES_256_GCM_SHA384]).await,
        S::TLS13_AES_256_GCM_SHA384
    );
    assert_eq!(
        negotiated_suite(&server, port, &[S::TLS13_CHACHA20_POLY1305_SHA256]).await,
        S::TLS13_CHACHA20_POLY1305_SHA256
    );
    cancel.cancel();
}

#[tokio::test]
async fn with_a_client_ca_a_caller_without_a_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = ca_and_client();
    let ca_path = dir.path().join("ca.pem");
    std::fs::write(&ca_path, &ca).unwrap();
    let (server, port, cancel) =
        start(KubeletServer::new("127.0.0.1", "127.0.0.1:0", Some(&ca_path)).unwrap()).await;

    let refused = get(&server, port, "/healthz", None).await;
    assert!(
        !refused.as_deref().unwrap_or("").contains("200 OK"),
        "a caller without a client certificate got an answer: {refused:?}"
    );
    // A certificate from another CA is refused too.
    let (_, other_cert, other_key) = ca_and_client();
    let other = get(&server, port, "/healthz", Some((&other_cert, &other_key))).await;
    assert!(
        !other.as_deref().unwrap_or("").contains("200 OK"),
        "a certificate from another CA got an answer: {other:?}"
    );
    let ok = get(&server, port, "/healthz", Some((&cert, &key)))
        .await
        .unwrap();
    assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
    assert!(ok.ends_with("ok"), "{ok}");
    cancel.cancel();
}

#[tokio::test]
async fn missing_pods_instances_and_capabilities_are_not_found_saying_which() {
    let (server, port, cancel) =
        start(KubeletServer::new("127.0.0.1", "127.0.0.1:0", None).unwrap()).await;
    let mem = Arc::new(MemoryProvider::new("mem", Duration::from_millis(50)));
    let handler = Arc::new(Handler::new(mem, Arc::new(Metrics::default()), None));
    {
        let h = handler.clone();
        server.register("nebula-mem", Arc::new(move || h.clone()));
    }
    let untracked = get(&server, port, "/containerLogs/default/nope/main", None)
        .await
        .unwrap();
    assert!(untracked.starts_with("HTTP/1.1 404"), "{untracked}");
    assert!(
        untracked.contains("pod default/nope is not tracked"),
        "{untracked}"
    );

    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default", "uid": "u-1"},
        "spec": {"containers": [{"name": "main", "image": "x", "command": ["run"]}]},
    }))
    .unwrap();
    handler.create(&pod).await.unwrap();
    let logs = get(&server, port, "/containerLogs/default/web/main", None)
        .await
        .unwrap();
    assert!(logs.starts_with("HTTP/1.1 404"), "{logs}");
    assert!(
        logs.contains("provider mem of node nebula-mem does not support logs"),
        "{logs}"
    );
    let exec = get(
        &server,
        port,
        "/exec/default/web/main?command=true&output=1",
        None,
    )
    .await
    .unwrap();
    assert!(exec.contains("does not support exec"), "{exec}");
    let pods = get(&server, port, "/pods", None).await.unwrap();
    assert!(pods.contains(r#""name":"web""#), "{pods}");
    let bad = get(
        &server,
        port,
        "/containerLogs/default/web/main?tailLines=-3",
        None,
    )
    .await
    .unwrap();
    // Decodes but out of range: the kubelet's 422 for invalid PodLogOptions.
    assert!(bad.starts_with("HTTP/1.1 422"), "{bad}");
    assert!(bad.contains("tailLines"), "{bad}");
    let undecodable = get(
        &server,
        port,
        "/containerLogs/default/web/main?sinceTime=yesterday",
        None,
    )
    .await
    .unwrap();
    assert!(undecodable.starts_with("HTTP/1.1 400"), "{undecodable}");
    let attach = get(&server, port, "/attach/default/web/main?output=1", None)
        .await
        .unwrap();
    assert!(attach.starts_with("HTTP/1.1 404"), "{attach}");
    assert!(
        attach.contains("provider mem of node nebula-mem does not support attach"),
        "{attach}"
    );
    for path in ["/stats/summary", "/metrics/resource"] {
        let stats = get(&server, port, path, None).await.unwrap();
        assert!(stats.starts_with("HTTP/1.1 404"), "{stats}");
        assert!(
            stats.contains("no provider of this manager reports stats"),
            "{stats}"
        );
    }
    cancel.cancel();
}

/// A client certificate for `user` from the CA of `ca_and_client` style parameters.
fn client_cert(ca_cert_pem: &str, ca_key_pem: &str, user: &str) -> (String, String) {
    let ca_key = rcgen::KeyPair::from_pem(ca_key_pem).unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_pem(ca_cert_pem, ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, user);
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "ops");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

#[tokio::test]
async fn webhook_authorization_asks_the_api_server_and_refuses_with_403() {
    // The API double allows alice nodes/proxy on nebula-mem, and nobody else anything.
    let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = asked.clone();
    let api = testkube::ApiServer::builder()
        .authorizer(move |user, attrs| {
            log.lock().unwrap().push(format!(
                "{} {:?} {} {}/{} {}",
                user.username,
                user.groups,
                attrs.verb,
                attrs.resource,
                attrs.subresource,
                attrs.name
            ));
            user.username == "alice"
                && attrs.resource == "nodes"
                && attrs.subresource == "proxy"
                && attrs.name == "nebula-mem"
        })
        .start()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "kubelet-client-ca");
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let (ca_pem, ca_key_pem) = (ca_cert.pem(), ca_key.serialize_pem());
    let ca_path = dir.path().join("ca.pem");
    std::fs::write(&ca_path, &ca_pem).unwrap();
    let kubelet = KubeletServer::new("127.0.0.1", "127.0.0.1:0", Some(&ca_path))
        .unwrap()
        .with_webhook_authorization(api.client());
    let (server, port, cancel) = start(kubelet).await;
    let mem = Arc::new(MemoryProvider::new("mem", Duration::from_millis(50)));
    let handler = Arc::new(Handler::new(mem, Arc::new(Metrics::default()), None));
    {
        let h = handler.clone();
        server.register("nebula-mem", Arc::new(move || h.clone()));
    }
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default", "uid": "u-1"},
        "spec": {"containers": [{"name": "main", "image": "x", "command": ["run"]}]},
    }))
    .unwrap();
    handler.create(&pod).await.unwrap();

    let (alice, alice_key) = client_cert(&ca_pem, &ca_key_pem, "alice");
    let (mallory, mallory_key) = client_cert(&ca_pem, &ca_key_pem, "mallory");
    let path = "/exec/default/web/main?command=id&output=1";
    let denied = get(&server, port, path, Some((&mallory, &mallory_key)))
        .await
        .unwrap();
    assert!(denied.starts_with("HTTP/1.1 403"), "{denied}");
    assert!(denied.contains("user=mallory"), "{denied}");
    // Alice passes authorization and reaches the route (the memory provider has no exec).
    let allowed = get(&server, port, path, Some((&alice, &alice_key)))
        .await
        .unwrap();
    assert!(allowed.contains("does not support exec"), "{allowed}");
    let asked = asked.lock().unwrap().clone();
    assert!(
        asked
            .iter()
            .any(|a| a.starts_with("alice ") && a.ends_with(" get nodes/proxy nebula-mem")),
        "{asked:?}"
    );
    // /healthz needs no authorization.
    let health = get(&server, port, "/healthz", Some((&mallory, &mallory_key)))
        .await
        .unwrap();
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    // Stats and metrics are nodes/stats and nodes/metrics, which alice may not get.
    for (path, sub) in [
        ("/stats/summary", "stats"),
        ("/metrics/resource", "metrics"),
    ] {
        let refused = get(&server, port, path, Some((&alice, &alice_key)))
            .await
            .unwrap();
        assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
        assert!(refused.contains(&format!("subresource={sub}")), "{refused}");
    }
    cancel.cancel();
}
