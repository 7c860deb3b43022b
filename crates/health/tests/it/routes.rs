//! Routes, methods, and the guarantee that bodies are constants whatever the state.

use std::collections::BTreeMap;

use health::{DeliveryMode, Tuning};

use crate::support::{Reply, call, get, start};

#[tokio::test]
async fn only_the_two_probe_paths_exist() {
    let r = start(Tuning::default()).await;
    for path in [
        "/",
        "/healthz/",
        "/livez",
        "/readyz/verbose",
        "/metrics",
        "/HEALTHZ",
        "/debug/pprof",
    ] {
        let reply = get(r.addr, path).await;
        assert_eq!(reply.status, 404, "{path}");
        assert_eq!(reply.body, b"not found", "{path}");
    }
    // A query string does not change the route (nor the body).
    assert_eq!(get(r.addr, "/healthz?verbose=1").await.body, b"ok");
    r.stop().await;
}

#[tokio::test]
async fn other_methods_are_405_with_allow() {
    let r = start(Tuning::default()).await;
    for method in ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"] {
        for path in ["/healthz", "/readyz"] {
            let reply = call(r.addr, method, path).await;
            assert_eq!(reply.status, 405, "{method} {path}");
            assert_eq!(reply.header("allow"), Some("GET, HEAD"), "{method} {path}");
            assert_eq!(reply.body, b"method not allowed");
        }
    }
    // An unknown path is 404 whatever the method.
    assert_eq!(call(r.addr, "POST", "/nope").await.status, 404);
    r.stop().await;
}

#[tokio::test]
async fn head_answers_like_get_without_a_body() {
    let r = start(Tuning::default()).await;
    let head = call(r.addr, "HEAD", "/readyz").await;
    assert_eq!(head.status, 503);
    assert!(head.body.is_empty());
    r.server.set_registered();
    r.server.set_data_plane_ready();
    let head = call(r.addr, "HEAD", "/readyz").await;
    assert_eq!(head.status, 200);
    assert_eq!(call(r.addr, "HEAD", "/healthz").await.status, 200);
    // The head still announces the GET body's length, as HTTP requires.
    assert_eq!(head.header("content-length"), Some("2"));
    r.stop().await;
}

/// The body and stable headers first seen for a (request, status), and in which state.
type Seen<'a> = (Vec<u8>, Vec<(String, String)>, &'a str);

/// Every response the listener can give, in one state.
async fn snapshot(r: &crate::support::Running) -> Vec<(String, Reply)> {
    let mut out = Vec::new();
    for (method, path) in [
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("HEAD", "/healthz"),
        ("HEAD", "/readyz"),
        ("GET", "/nope"),
        ("POST", "/readyz"),
    ] {
        out.push((format!("{method} {path}"), call(r.addr, method, path).await));
    }
    out
}

#[tokio::test]
async fn bodies_and_headers_never_depend_on_the_state() {
    let r = start(Tuning::default()).await;
    // A subsystem name that must never reach a response.
    let secret = "node-7f3a-secret-subsystem";
    let mut states: Vec<(&str, Vec<(String, Reply)>)> = Vec::new();
    states.push(("fresh", snapshot(&r).await));
    r.server.set_registered();
    states.push(("registered", snapshot(&r).await));
    r.server.set_data_plane_ready();
    states.push(("ready", snapshot(&r).await));
    r.server.set_delivery_mode(DeliveryMode::Unknown);
    states.push(("mode unknown", snapshot(&r).await));
    r.server.set_delivery_mode(DeliveryMode::Polling);
    states.push(("polling", snapshot(&r).await));
    r.server.set_delivery_stopped();
    states.push(("delivery stopped", snapshot(&r).await));
    r.server.set_subsystem_stopped(secret);
    states.push(("subsystem stopped", snapshot(&r).await));

    // For every request and status, one exact body and header set across all states.
    let mut seen: BTreeMap<(String, u16), Seen> = BTreeMap::new();
    for (state, replies) in &states {
        for (request, reply) in replies {
            let text = format!(
                "{:?}{:?}",
                reply.headers,
                String::from_utf8_lossy(&reply.body)
            );
            assert!(!text.contains(secret), "{state}: {request} leaked: {text}");
            let key = (request.clone(), reply.status);
            let value = (reply.body.clone(), reply.stable_headers(), *state);
            match seen.get(&key) {
                None => {
                    seen.insert(key, value);
                }
                Some((body, headers, first)) => {
                    assert_eq!(
                        (body, headers),
                        (&value.0, &value.1),
                        "{request} {} differs between state {first} and {state}",
                        reply.status
                    );
                }
            }
        }
    }
    let bodies: BTreeMap<String, Vec<u8>> = seen
        .iter()
        .map(|((req, status), (body, _, _))| (format!("{req} {status}"), body.clone()))
        .collect();
    let want: BTreeMap<String, Vec<u8>> = [
        ("GET /healthz 200", &b"ok"[..]),
        ("GET /readyz 200", b"ok"),
        ("GET /readyz 503", b"not ready"),
        ("HEAD /healthz 200", b""),
        ("HEAD /readyz 200", b""),
        ("HEAD /readyz 503", b""),
        ("GET /nope 404", b"not found"),
        ("POST /readyz 405", b"method not allowed"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_vec()))
    .collect();
    assert_eq!(bodies, want, "every (request, status) seen, with its body");
    // Only hyper's framing headers: nothing a state or a node name could ride on.
    let names: Vec<&str> = seen[&("GET /readyz".to_string(), 503)]
        .1
        .iter()
        .map(|(n, _)| n.as_str())
        .collect();
    // (`connection: close` answers the client's own `Connection: close`.)
    assert_eq!(
        names,
        ["connection", "content-length"],
        "headers besides date"
    );
    r.stop().await;
}
