//! Component tests of the kubelet proxy against stub kubelets on loopback, through a
//! minimal HTTP front that calls `testkube::proxy::forward` the way the API server's
//! router does (so these run without the rest of the double).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use rand::RngCore;
use serde_json::{Value, json};
use testkube::kubelet::spdy::{Codec, FLAG_FIN, Frame};
use testkube::kubelet::{StubKubelet, generate_ca};
use testkube::proxy::{ProxyConfig, forward};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::codec::Framed;

pub fn pod(node: &str) -> Value {
    json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "app"}]},
    })
}

pub fn node_at(address: &str, port: u16) -> Value {
    json!({
        "metadata": {"name": "n1"},
        "status": {
            "addresses": [{"type": "InternalIP", "address": address}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        },
    })
}

/// A plain-HTTP front on loopback that forwards `.../pods/web/{sub}` with a fixed pod and
/// node, like the API server's router after authentication and lookup.
/// A stub kubelet on loopback and a default proxy front whose pod runs on it.
async fn stub_behind_default_front() -> (StubKubelet, SocketAddr) {
    let stub = StubKubelet::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let api = front(
        ProxyConfig::default(),
        pod("n1"),
        Some(node_at("127.0.0.1", stub.addr().port())),
    )
    .await;
    (stub, api)
}

async fn front(cfg: ProxyConfig, pod: Value, node: Option<Value>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cfg = std::sync::Arc::new(cfg);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (cfg, pod, node) = (cfg.clone(), pod.clone(), node.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: http::Request<_>| {
                    let (cfg, pod, node) = (cfg.clone(), pod.clone(), node.clone());
                    async move {
                        let sub = req.uri().path().rsplit('/').next().unwrap().to_string();
                        Ok::<_, std::convert::Infallible>(
                            forward(&cfg, &pod, node.as_ref(), &sub, req).await,
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .with_upgrades()
                    .await;
            });
        }
    });
    addr
}

/// Issues a GET on a fresh connection; returns status and the response to stream.
async fn get(addr: SocketAddr, path: &str) -> http::Response<hyper::body::Incoming> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    send.send_request(
        http::Request::get(path)
            .header("host", "apiserver")
            .body(http_body_util::Empty::<Bytes>::new())
            .unwrap(),
    )
    .await
    .unwrap()
}

async fn body_text(resp: http::Response<hyper::body::Incoming>) -> String {
    String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap()
}

async fn status_of(resp: http::Response<hyper::body::Incoming>) -> (u16, Value) {
    let code = resp.status().as_u16();
    let text = body_text(resp).await;
    (
        code,
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("not a Status: {text}")),
    )
}

const LOG: &str = "/api/v1/namespaces/default/pods/web/log";

#[tokio::test]
async fn logs_reach_the_stub_with_mapped_query() {
    let stub = StubKubelet::builder()
        .logs("default", "web", "app", "one\ntwo\nthree\n")
        .start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let api = front(
        ProxyConfig::default(),
        pod("n1"),
        Some(node_at("127.0.0.1", stub.addr().port())),
    )
    .await;
    let resp = get(
        api,
        &format!("{LOG}?tailLines=2&previous=false&follow=false"),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/plain");
    assert_eq!(body_text(resp).await, "two\nthree\n");
    assert_eq!(
        stub.requests(),
        vec!["/containerLogs/default/web/app?tailLines=2".to_string()]
    );
    stub.shutdown().await;
}

#[tokio::test]
async fn followed_logs_stream_and_close_upstream_when_the_client_goes() {
    let stub = StubKubelet::builder()
        .name("kubelet-7")
        .follow_interval(Duration::from_millis(50))
        .start("127.0.0.7:0".parse().unwrap())
        .await
        .unwrap();
    let api = front(
        ProxyConfig::default(),
        pod("n1"),
        Some(node_at("127.0.0.7", stub.addr().port())),
    )
    .await;
    let resp = get(api, &format!("{LOG}?follow=true")).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut seen = String::new();
    // Lines arrive while the stream stays open: the proxy does not buffer the response.
    while !seen.contains("follow 3\n") {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("no follow line within 10 s")
            .expect("stream ended early")
            .unwrap();
        if let Some(d) = frame.data_ref() {
            seen.push_str(std::str::from_utf8(d).unwrap());
        }
    }
    assert!(
        seen.starts_with("kubelet-7 default/web/app line 1\n"),
        "{seen}"
    );
    assert_eq!(stub.open_log_streams(), 1);
    drop(body);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while stub.open_log_streams() != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the kubelet stream stayed open after the client left"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stub.shutdown().await;
}

#[tokio::test]
async fn kubelet_errors_become_statuses_with_its_code() {
    let stub = StubKubelet::builder()
        .logs("default", "other", "app", "x\n")
        .only_configured_logs()
        .start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let api = front(
        ProxyConfig::default(),
        pod("n1"),
        Some(node_at("127.0.0.1", stub.addr().port())),
    )
    .await;
    let (code, status) = status_of(get(api, LOG).await).await;
    assert_eq!(code, 404);
    assert_eq!(status["reason"], "NotFound");
    assert_eq!(
        status["message"],
        "the server could not find the requested resource ( pods/log web)"
    );
    assert_eq!(status["details"]["kind"], "pods/log");
    // 400 keeps the kubelet's own words.
    let stub2 = StubKubelet::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let front2 = front(
        ProxyConfig::default(),
        pod("n1"),
        Some(node_at("127.0.0.1", stub2.addr().port())),
    )
    .await;
    let (code, status) = status_of(get(front2, &format!("{LOG}?previous=true")).await).await;
    assert_eq!(code, 400);
    assert_eq!(status["reason"], "BadRequest");
    assert_eq!(
        status["message"],
        "previous terminated container \"app\" in pod \"web\" not found"
    );
    stub.shutdown().await;
    stub2.shutdown().await;
}

#[tokio::test]
async fn missing_node_no_host_and_refused_dials_answer_like_kube_apiserver() {
    // Node object missing: the node lookup's 404.
    let front1 = front(ProxyConfig::default(), pod("gone"), None).await;
    let (code, status) = status_of(get(front1, LOG).await).await;
    assert_eq!(code, 404);
    assert_eq!(status["message"], "nodes \"gone\" not found");
    assert_eq!(status["details"]["kind"], "nodes");

    // No host: logs are 204 No Content, exec is a 400.
    let front2 = front(ProxyConfig::default(), pod(""), None).await;
    let resp = get(front2, LOG).await;
    assert_eq!(resp.status(), 204);
    assert_eq!(body_text(resp).await, "");
    let (code, status) = status_of(
        get(
            front2,
            "/api/v1/namespaces/default/pods/web/exec?command=ls&stdout=true",
        )
        .await,
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(status["message"], "pod web does not have a host assigned");

    // A loopback port with nothing listening.
    let free = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let front3 = front(
        ProxyConfig::default(),
        pod("n1"),
        Some(node_at("127.0.0.1", port)),
    )
    .await;
    let (code, status) = status_of(get(front3, LOG).await).await;
    assert_eq!(code, 500);
    assert_eq!(
        status["message"],
        format!(
            "Get \"https://127.0.0.1:{port}/containerLogs/default/web/app\": dial tcp 127.0.0.1:{port}: connect: connection refused"
        )
    );
}

#[tokio::test]
async fn non_loopback_node_addresses_are_never_dialed() {
    let stub = StubKubelet::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let port = stub.addr().port();
    // 0.0.0.0 would reach this stub if it were dialed (Linux connects it to the local
    // host), so a connection count of zero proves nothing was dialed, while no packet
    // can leave the machine whatever happens.
    for address in ["0.0.0.0", "10.0.0.5", "node-a.example"] {
        let api = front(
            ProxyConfig::default(),
            pod("n1"),
            Some(node_at(address, port)),
        )
        .await;
        let started = std::time::Instant::now();
        let (code, status) = status_of(get(api, LOG).await).await;
        assert_eq!(code, 500, "{status}");
        let message = status["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!(
                "Get \"https://{address}:{port}/containerLogs/default/web/app\": dial tcp"
            )),
            "{message}"
        );
        assert!(
            message.contains("not dialed"),
            "the error must say it was not dialed: {message}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "refusal must be immediate"
        );
        let (code, status) = status_of(
            get(
                api,
                "/api/v1/namespaces/default/pods/web/exec?command=ls&stdout=true",
            )
            .await,
        )
        .await;
        // Not an upgrade request: refused as such only after the location is known.
        assert_eq!(code, 400, "{status}");
    }
    assert_eq!(stub.connections(), 0, "a non-loopback address was dialed");
    stub.shutdown().await;
}

#[tokio::test]
async fn kubelet_serving_cert_is_verified_only_with_a_ca() {
    let (ca_a, ca_a_key) = generate_ca("kubelet-ca-a").unwrap();
    let (ca_b, ca_b_key) = generate_ca("kubelet-ca-b").unwrap();
    let signed_by_a = StubKubelet::builder()
        .serving_ca(&ca_a, &ca_a_key)
        .start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let signed_by_b = StubKubelet::builder()
        .serving_ca(&ca_b, &ca_b_key)
        .start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let verifying = ProxyConfig {
        kubelet_ca: Some(ca_a.clone().into_bytes()),
        ..ProxyConfig::default()
    };
    let ok = front(
        verifying.clone(),
        pod("n1"),
        Some(node_at("127.0.0.1", signed_by_a.addr().port())),
    )
    .await;
    assert_eq!(get(ok, LOG).await.status(), 200);
    let bad = front(
        verifying.clone(),
        pod("n1"),
        Some(node_at("127.0.0.1", signed_by_b.addr().port())),
    )
    .await;
    let (code, status) = status_of(get(bad, LOG).await).await;
    assert_eq!(code, 500);
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("tls: failed to verify certificate"),
        "{status}"
    );
    assert!(signed_by_b.requests().is_empty());
    // insecureSkipTLSVerifyBackend skips it, as kube-apiserver does for logs.
    assert_eq!(
        get(bad, &format!("{LOG}?insecureSkipTLSVerifyBackend=true"))
            .await
            .status(),
        200
    );
    // Without a CA nothing is verified.
    let lax = front(
        ProxyConfig::default(),
        pod("n1"),
        Some(node_at("127.0.0.1", signed_by_b.addr().port())),
    )
    .await;
    assert_eq!(get(lax, LOG).await.status(), 200);
    signed_by_a.shutdown().await;
    signed_by_b.shutdown().await;
}

#[tokio::test]
async fn the_proxy_presents_its_client_certificate() {
    let cfg = ProxyConfig::default();
    let strict = StubKubelet::builder()
        .require_client_cert(&cfg.client_cert_pem)
        .start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let f = front(
        cfg,
        pod("n1"),
        Some(node_at("127.0.0.1", strict.addr().port())),
    )
    .await;
    assert_eq!(get(f, LOG).await.status(), 200);
    // Another proxy identity is refused by the same kubelet.
    let other = front(
        ProxyConfig::default(),
        pod("n1"),
        Some(node_at("127.0.0.1", strict.addr().port())),
    )
    .await;
    assert_eq!(get(other, LOG).await.status(), 500);
    strict.shutdown().await;
}

/// Sends a raw HTTP/1.1 upgrade request and returns the connection after the 101.
async fn raw_upgrade(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> TcpStream {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let mut req =
        format!("POST {path} HTTP/1.1\r\nHost: apiserver\r\nAuthorization: Bearer secret\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        tcp.read_exact(&mut b).await.unwrap();
        head.push(b[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    tcp
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rand::rng().fill_bytes(&mut v);
    v
}

#[tokio::test]
async fn spdy_upgrade_passes_bytes_both_ways_unchanged() {
    let (stub, api) = stub_behind_default_front().await;
    let tcp = raw_upgrade(
        api,
        "/api/v1/namespaces/default/pods/web/exec?command=cat&stdin=true&stdout=true&stderr=true",
        &[
            ("Connection", "Upgrade"),
            ("Upgrade", "SPDY/3.1"),
            ("X-Stream-Protocol-Version", "v4.channel.k8s.io"),
            ("X-Stream-Protocol-Version", "channel.k8s.io"),
        ],
    )
    .await;
    let mut conn = Framed::new(tcp, Codec::new());
    for (id, t) in [(1, "error"), (3, "stdin"), (5, "stdout"), (7, "stderr")] {
        conn.send(Frame::SynStream {
            stream_id: id,
            associated_to: 0,
            priority: 0,
            flags: 0,
            headers: vec![("streamtype".into(), t.into())],
        })
        .await
        .unwrap();
    }
    let payload = random_bytes(6000);
    for chunk in payload.chunks(1000) {
        conn.send(Frame::Data {
            stream_id: 3,
            flags: 0,
            data: Bytes::copy_from_slice(chunk),
        })
        .await
        .unwrap();
    }
    conn.send(Frame::Data {
        stream_id: 3,
        flags: FLAG_FIN,
        data: Bytes::new(),
    })
    .await
    .unwrap();
    let mut stdout = BytesMut::new();
    let mut error = BytesMut::new();
    let mut replies = 0;
    let mut goaway = false;
    while let Some(frame) = tokio::time::timeout(Duration::from_secs(10), conn.next())
        .await
        .expect("kubelet went silent")
    {
        match frame.unwrap() {
            Frame::SynReply { .. } => replies += 1,
            Frame::Data {
                stream_id: 5, data, ..
            } => stdout.extend_from_slice(&data),
            Frame::Data {
                stream_id: 1, data, ..
            } => error.extend_from_slice(&data),
            Frame::GoAway { .. } => goaway = true,
            _ => {}
        }
    }
    assert_eq!(replies, 4);
    assert_eq!(
        &stdout[..],
        &payload[..],
        "stdin did not come back unchanged"
    );
    let status: Value = serde_json::from_slice(&error).unwrap();
    assert_eq!(status["status"], "Success");
    assert!(goaway);
    let seen = stub.requests();
    assert_eq!(
        seen,
        vec!["/exec/default/web/app?command=cat&error=1&input=1&output=1".to_string()]
    );
    stub.shutdown().await;
}

#[tokio::test]
async fn websocket_upgrade_passes_bytes_both_ways_unchanged() {
    let (stub, api) = stub_behind_default_front().await;
    let tcp = TcpStream::connect(api).await.unwrap();
    let mut request = tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(
        "ws://apiserver/api/v1/namespaces/default/pods/web/exec?command=cat&stdin=true&stdout=true&stderr=true",
    )
    .unwrap();
    request.headers_mut().insert(
        "sec-websocket-protocol",
        "v5.channel.k8s.io, v4.channel.k8s.io".parse().unwrap(),
    );
    let (mut ws, resp) = tokio_tungstenite::client_async(request, tcp).await.unwrap();
    assert_eq!(
        resp.headers()["sec-websocket-protocol"],
        "v5.channel.k8s.io"
    );
    let payload = random_bytes(5000);
    for chunk in payload.chunks(700) {
        let mut m = vec![0u8];
        m.extend_from_slice(chunk);
        ws.send(Message::binary(m)).await.unwrap();
    }
    ws.send(Message::binary(vec![255u8, 0])).await.unwrap();
    let mut stdout = Vec::new();
    let mut error = Vec::new();
    while let Some(msg) = tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .expect("kubelet went silent")
    {
        match msg {
            Ok(Message::Binary(b)) if !b.is_empty() => match b[0] {
                1 => stdout.extend_from_slice(&b[1..]),
                3 => error.extend_from_slice(&b[1..]),
                other => panic!("unexpected channel {other}"),
            },
            Ok(Message::Close(_)) | Err(_) => break,
            _ => {}
        }
    }
    assert_eq!(stdout, payload, "stdin did not come back unchanged");
    let status: Value = serde_json::from_slice(&error).unwrap();
    assert_eq!(status["status"], "Success");
    stub.shutdown().await;
}

#[tokio::test]
async fn spdy_port_forward_echoes_through_the_proxy() {
    let (stub, api) = stub_behind_default_front().await;
    let tcp = raw_upgrade(
        api,
        "/api/v1/namespaces/default/pods/web/portforward?ports=8080",
        &[
            ("Connection", "Upgrade"),
            ("Upgrade", "SPDY/3.1"),
            ("X-Stream-Protocol-Version", "portforward.k8s.io"),
        ],
    )
    .await;
    let mut conn = Framed::new(tcp, Codec::new());
    for (id, t) in [(1, "error"), (3, "data")] {
        conn.send(Frame::SynStream {
            stream_id: id,
            associated_to: 0,
            priority: 0,
            flags: 0,
            headers: vec![
                ("streamtype".into(), t.into()),
                ("port".into(), "8080".into()),
                ("requestid".into(), "0".into()),
            ],
        })
        .await
        .unwrap();
    }
    let payload = random_bytes(3000);
    conn.send(Frame::Data {
        stream_id: 3,
        flags: FLAG_FIN,
        data: Bytes::from(payload.clone()),
    })
    .await
    .unwrap();
    let mut echoed = Vec::new();
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(10), conn.next())
            .await
            .expect("kubelet went silent")
            .expect("connection closed")
            .unwrap();
        if let Frame::Data {
            stream_id: 3,
            flags,
            data,
        } = frame
        {
            echoed.extend_from_slice(&data);
            if flags & FLAG_FIN != 0 {
                break;
            }
        }
    }
    assert_eq!(echoed, payload);
    assert_eq!(
        stub.requests(),
        vec!["/portForward/default/web?port=8080".to_string()]
    );
    stub.shutdown().await;
}

#[tokio::test]
async fn kube_rs_exec_reaches_the_stub_over_websocket() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, AttachParams};

    let (stub, api) = stub_behind_default_front().await;
    let client =
        kube::Client::try_from(kube::Config::new(format!("http://{api}").parse().unwrap()))
            .unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");

    let mut proc = pods
        .exec(
            "web",
            vec!["echo", "from", "kube-rs"],
            &AttachParams::default().stderr(false),
        )
        .await
        .unwrap();
    let mut out = String::new();
    proc.stdout()
        .unwrap()
        .read_to_string(&mut out)
        .await
        .unwrap();
    let status = proc.take_status().unwrap().await.unwrap();
    assert_eq!(status.status.as_deref(), Some("Success"));
    proc.join().await.unwrap();
    assert_eq!(out, "from kube-rs\n");

    let mut proc = pods
        .exec(
            "web",
            vec!["cat"],
            &AttachParams::default().stdin(true).stderr(false),
        )
        .await
        .unwrap();
    let mut stdin = proc.stdin().unwrap();
    let mut stdout = proc.stdout().unwrap();
    stdin.write_all(b"echo me").await.unwrap();
    let mut buf = [0u8; 7];
    tokio::time::timeout(Duration::from_secs(10), stdout.read_exact(&mut buf))
        .await
        .expect("no echo within 10 s")
        .unwrap();
    assert_eq!(&buf, b"echo me");
    proc.abort();
    assert!(
        stub.sessions()
            .iter()
            .all(|s| s.starts_with("exec websocket v")),
        "{:?}",
        stub.sessions()
    );
    stub.shutdown().await;
}

/// The API server's builder settings reach the proxy: address-type order, kubelet CA,
/// and the loopback-only default.
#[tokio::test]
async fn api_server_kubelet_settings_reach_the_proxy() {
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::{Api, LogParams, PostParams};

    let (ca, ca_key) = generate_ca("kubelet-ca").unwrap();
    let (other, other_key) = generate_ca("another-ca").unwrap();
    let trusted = StubKubelet::builder()
        .name("trusted")
        .serving_ca(&ca, &ca_key)
        .start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let untrusted = StubKubelet::builder()
        .name("untrusted")
        .serving_ca(&other, &other_key)
        .start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = testkube::ApiServer::builder()
        .kubelet_ca(ca.clone().into_bytes())
        .preferred_address_types(vec!["ExternalIP".into(), "InternalIP".into()])
        .start()
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(server.client());
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    // ExternalIP is preferred: the InternalIP (the untrusted stub) must not be used.
    let mk_node = |name: &str, addresses: Value, port: u16| -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "status": {
                "addresses": addresses,
                "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
            },
        }))
        .unwrap()
    };
    for node in [
        mk_node(
            "good",
            json!([{"type": "InternalIP", "address": "127.0.0.2"},
                   {"type": "ExternalIP", "address": "127.0.0.1"}]),
            trusted.addr().port(),
        ),
        mk_node(
            "bad",
            json!([{"type": "InternalIP", "address": "127.0.0.1"}]),
            untrusted.addr().port(),
        ),
        mk_node(
            "far",
            json!([{"type": "InternalIP", "address": "10.0.0.5"}]),
            trusted.addr().port(),
        ),
    ] {
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
    for (pod, node) in [("on-good", "good"), ("on-bad", "bad"), ("on-far", "far")] {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": pod},
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": "x"}]},
        }))
        .unwrap();
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let logs = pods.logs("on-good", &LogParams::default()).await.unwrap();
    assert_eq!(logs, trusted.default_log("default", "on-good", "app"));

    let err = pods
        .logs("on-bad", &LogParams::default())
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("tls: failed to verify certificate"), "{msg}");
    assert!(untrusted.requests().is_empty());

    let connections_before = trusted.connections();
    let err = pods
        .logs("on-far", &LogParams::default())
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("not dialed"), "{msg}");
    assert_eq!(trusted.connections(), connections_before);

    trusted.shutdown().await;
    untrusted.shutdown().await;
    server.shutdown().await;
}

/// A front that forwards every request as `nodes/n1/proxy/{path}` (the path after
/// `/proxy`), like the API server's node proxy after authentication and lookup.
async fn node_front(cfg: ProxyConfig, node: Value) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cfg = std::sync::Arc::new(cfg);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (cfg, node) = (cfg.clone(), node.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: http::Request<_>| {
                    let (cfg, node) = (cfg.clone(), node.clone());
                    async move {
                        let path = req.uri().path().trim_start_matches("/proxy").to_string();
                        Ok::<_, std::convert::Infallible>(
                            testkube::proxy::forward_node(&cfg, &node, &path, req).await,
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn the_node_proxy_passes_the_kubelets_answer_through_with_the_query() {
    let stub = StubKubelet::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let api = node_front(
        ProxyConfig::default(),
        node_at("127.0.0.1", stub.addr().port()),
    )
    .await;
    let resp = get(api, "/proxy/containerLogs/default/web/app?tailLines=1").await;
    assert_eq!(resp.status(), 200);
    let text = body_text(resp).await;
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(
        stub.requests()
            .iter()
            .any(|r| r.contains("/containerLogs/default/web/app") && r.contains("tailLines=1")),
        "{:?}",
        stub.requests()
    );
    // The kubelet's own error status passes through unchanged (not turned into a Status).
    let missing = get(api, "/proxy/no/such/route").await;
    assert_eq!(missing.status(), 404);
    assert_eq!(body_text(missing).await, "404 page not found\n");
    // What the double does not implement is refused, not half-done.
    let tcp = TcpStream::connect(api).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let post = send
        .send_request(
            http::Request::post("/proxy/run/default/web/app")
                .header("host", "apiserver")
                .body(http_body_util::Empty::<Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    let (code, status) = status_of(post).await;
    assert_eq!(code, 405);
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("only plain GET"),
        "{status}"
    );
}
