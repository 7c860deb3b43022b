//! Authentication, authorization, reviews and injected faults.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use testkube::{ApiServer, Fault, FaultKind, UserInfo};

use crate::conformance::{cm, raw};

async fn client_for(s: &ApiServer, dir: &std::path::Path, token: &str) -> kube::Client {
    let path = dir.join(format!("kc-{}", token.len()));
    s.write_token_kubeconfig(&path, token).unwrap();
    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(cfg).unwrap()
}

#[tokio::test]
async fn strict_auth_rejects_unknown_callers_with_401() {
    let s = ApiServer::builder()
        .strict_auth()
        .token("alice-token", UserInfo::new("alice", &["dev"]))
        .start()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let stranger = client_for(&s, dir.path(), "nobody").await;
    let api: Api<ConfigMap> = Api::namespaced(stranger, "default");
    match api.list(&ListParams::default()).await {
        Err(kube::Error::Api(st)) => {
            assert_eq!((st.code, st.reason.as_str()), (401, "Unauthorized"))
        }
        other => panic!("expected 401, got {other:?}"),
    }
    let alice = client_for(&s, dir.path(), "alice-token").await;
    Api::<ConfigMap>::namespaced(alice, "default")
        .list(&ListParams::default())
        .await
        .unwrap();
    // The kubeconfig's client certificate works too.
    Api::<ConfigMap>::namespaced(s.client(), "default")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(s.requests().iter().any(|r| r.code == 401));
}

#[tokio::test]
async fn the_authorizer_answers_requests_and_subject_access_reviews() {
    let s = ApiServer::builder()
        .token("bob-token", UserInfo::new("bob", &[]))
        .authorizer(|user, attrs| user.username == "bob" && attrs.verb == "get")
        .start()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bob = client_for(&s, dir.path(), "bob-token").await;
    let api: Api<ConfigMap> = Api::namespaced(bob, "default");
    match api.list(&ListParams::default()).await {
        Err(kube::Error::Api(st)) => {
            assert_eq!(st.code, 403);
            assert_eq!(
                st.message,
                "configmaps is forbidden: User \"bob\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"default\""
            );
        }
        other => panic!("expected 403, got {other:?}"),
    }
    let sars: Api<SubjectAccessReview> = Api::all(s.client());
    let ask = |verb: &str| -> SubjectAccessReview {
        serde_json::from_value(json!({"spec": {"user": "bob",
            "resourceAttributes": {"verb": verb, "resource": "nodes"}}}))
        .unwrap()
    };
    let yes = sars
        .create(&PostParams::default(), &ask("get"))
        .await
        .unwrap();
    assert!(yes.status.unwrap().allowed);
    let no = sars
        .create(&PostParams::default(), &ask("delete"))
        .await
        .unwrap();
    assert!(!no.status.unwrap().allowed);
    // TokenReview answers from the configured tokens.
    use k8s_openapi::api::authentication::v1::TokenReview;
    let reviews: Api<TokenReview> = Api::all(s.client());
    let review = |token: &str| -> TokenReview {
        serde_json::from_value(json!({"spec": {"token": token}})).unwrap()
    };
    let known = reviews
        .create(&PostParams::default(), &review("bob-token"))
        .await
        .unwrap();
    let st = known.status.unwrap();
    assert_eq!(st.authenticated, Some(true));
    assert_eq!(st.user.unwrap().username.as_deref(), Some("bob"));
    let unknown = reviews
        .create(&PostParams::default(), &review("nope"))
        .await
        .unwrap();
    assert_eq!(unknown.status.unwrap().authenticated, Some(false));
}

#[tokio::test]
async fn injected_status_codes_come_back_as_status_bodies() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    s.inject(
        Fault::new(FaultKind::Status(500))
            .verb("create")
            .resource("configmaps")
            .times(1),
    );
    match api.create(&PostParams::default(), &cm("a")).await {
        Err(kube::Error::Api(st)) => {
            assert_eq!((st.code, st.reason.as_str()), (500, "InternalError"))
        }
        other => panic!("expected 500, got {other:?}"),
    }
    // times(1): the next create goes through; gets were never affected.
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    s.inject(Fault::new(FaultKind::Status(409)).resource("configmaps"));
    assert!(api.get("a").await.is_err());
    assert!(api.get("a").await.is_err());
    s.clear_faults();
    api.get("a").await.unwrap();
    // kube 5 clients retry 503 by themselves: one injected 503, then success.
    s.clear_requests();
    s.inject(Fault::new(FaultKind::Status(503)).verb("get").times(1));
    api.get("a").await.unwrap();
    let codes: Vec<u16> = s.requests().iter().map(|r| r.code).collect();
    assert_eq!(codes, [503, 200]);
}

#[tokio::test]
async fn too_many_requests_carries_retry_after() {
    let s = ApiServer::start().await.unwrap();
    s.inject(
        Fault::new(FaultKind::TooManyRequests {
            retry_after_secs: 7,
        })
        .verb("list")
        .times(1),
    );
    let (code, headers, body) = raw(&s, "GET", "/api/v1/nodes", "", vec![]).await;
    assert_eq!(code, 429);
    assert_eq!(headers["retry-after"], "7");
    assert_eq!(body["reason"], "TooManyRequests");
    assert_eq!(body["details"]["retryAfterSeconds"], 7);
    let (code, _, _) = raw(&s, "GET", "/api/v1/nodes", "", vec![]).await;
    assert_eq!(code, 200);
    // A kube::Client honours Retry-After: it waits, retries, and succeeds.
    s.clear_requests();
    s.inject(
        Fault::new(FaultKind::TooManyRequests {
            retry_after_secs: 1,
        })
        .verb("list")
        .times(1),
    );
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let t = std::time::Instant::now();
    api.list(&ListParams::default()).await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_secs(1),
        "the client waited Retry-After"
    );
    let codes: Vec<u16> = s.requests().iter().map(|r| r.code).collect();
    assert_eq!(codes, [429, 200]);
}

#[tokio::test]
async fn injected_latency_delays_the_answer() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    s.inject(
        Fault::new(FaultKind::Latency(Duration::from_millis(300)))
            .verb("list")
            .times(1),
    );
    let t = std::time::Instant::now();
    api.list(&ListParams::default()).await.unwrap();
    // A lower bound only: the delay is injected, so it cannot be shorter.
    assert!(t.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn a_dropped_watch_ends_the_stream_and_the_watcher_recovers() {
    use kube::runtime::watcher::{self, Event};
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    s.inject(Fault::new(FaultKind::DropWatch).verb("watch").times(1));
    let mut stream = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    let first = tokio::time::timeout(Duration::from_secs(10), stream.try_next())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(first, Some(WatchEvent::Added(_))));
    let end = tokio::time::timeout(Duration::from_secs(10), stream.try_next())
        .await
        .unwrap()
        .unwrap();
    assert!(end.is_none(), "the stream closes after the initial events");
    // kube-runtime's watcher re-watches after a drop and still sees later changes.
    s.inject(Fault::new(FaultKind::DropWatch).verb("watch").times(2));
    let mut w = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
    loop {
        match tokio::time::timeout(Duration::from_secs(20), w.try_next())
            .await
            .unwrap()
            .unwrap()
        {
            Some(Event::InitDone) => break,
            Some(_) => {}
            None => panic!("the watcher stream ended"),
        }
    }
    // Each object is created after the previous one was seen, so at least the second
    // arrives over a watch started after a dropped one.
    for name in ["b", "c"] {
        api.create(&PostParams::default(), &cm(name)).await.unwrap();
        let mut seen = false;
        for _ in 0..50 {
            match tokio::time::timeout(Duration::from_secs(20), w.next())
                .await
                .unwrap()
            {
                Some(Ok(Event::Apply(c) | Event::InitApply(c)))
                    if c.metadata.name.as_deref() == Some(name) =>
                {
                    seen = true;
                    break;
                }
                Some(_) => {}
                None => break,
            }
        }
        assert!(seen, "the watcher saw {name}");
    }
    let watches = s.requests().iter().filter(|r| r.verb == "watch").count();
    assert!(
        watches >= 3,
        "the watcher re-watched after drops ({watches} watches)"
    );
}

#[tokio::test]
async fn injected_compaction_forces_410() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let rv = api
        .create(&PostParams::default(), &cm("a"))
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    api.create(&PostParams::default(), &cm("b")).await.unwrap();
    s.inject(Fault::new(FaultKind::Compact).verb("watch").times(1));
    let mut stream = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let ev = tokio::time::timeout(Duration::from_secs(10), stream.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        matches!(ev, WatchEvent::Error(ref st) if st.code == 410),
        "{ev:?}"
    );
}

#[tokio::test]
async fn the_request_log_records_verbs_and_codes() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    s.clear_requests();
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let _ = api.get("missing").await;
    api.list(&ListParams::default()).await.unwrap();
    let log: Vec<(String, String, Option<String>, u16)> = s
        .requests()
        .into_iter()
        .map(|r| (r.verb, r.resource, r.name, r.code))
        .collect();
    assert_eq!(
        log,
        [
            ("create".to_string(), "configmaps".to_string(), None, 201),
            (
                "get".to_string(),
                "configmaps".to_string(),
                Some("missing".to_string()),
                404
            ),
            ("list".to_string(), "configmaps".to_string(), None, 200),
        ]
    );
    assert_eq!(s.requests().iter().filter(|r| r.is_write()).count(), 1);
}

#[tokio::test]
async fn self_subject_access_review_answers_for_the_caller() {
    use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
    let s = ApiServer::builder()
        .token("carol-token", UserInfo::new("carol", &[]))
        .authorizer(|user, attrs| user.username == "carol" && attrs.resource == "pods")
        .start()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let carol = client_for(&s, dir.path(), "carol-token").await;
    let api: Api<SelfSubjectAccessReview> = Api::all(carol);
    let ask = |resource: &str| -> SelfSubjectAccessReview {
        serde_json::from_value(
            json!({"spec": {"resourceAttributes": {"verb": "list", "resource": resource}}}),
        )
        .unwrap()
    };
    // Every caller may ask about itself (the default system:basic-user role grants it).
    let pods = api
        .create(&PostParams::default(), &ask("pods"))
        .await
        .unwrap();
    assert!(pods.status.unwrap().allowed);
    let nodes = api
        .create(&PostParams::default(), &ask("nodes"))
        .await
        .unwrap();
    assert!(!nodes.status.unwrap().allowed);
}
