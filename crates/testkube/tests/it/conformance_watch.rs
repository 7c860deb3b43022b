//! Watches: resourceVersion semantics, bookmarks, 410 Expired, kube-runtime's watcher.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{
    ListParams, Patch, PatchParams, PostParams, VersionMatch, WatchEvent, WatchParams,
};
use serde_json::json;
use testkube::ApiServer;

use crate::conformance::cm;

const LIMIT: Duration = Duration::from_secs(20);

fn name(c: &ConfigMap) -> String {
    c.metadata.name.clone().unwrap()
}

#[tokio::test]
async fn watch_from_a_resource_version_sends_only_later_events() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    api.create(&PostParams::default(), &cm("before"))
        .await
        .unwrap();
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    api.create(&PostParams::default(), &cm("after"))
        .await
        .unwrap();
    api.patch(
        "before",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"z": "1"}})),
    )
    .await
    .unwrap();
    api.delete("after", &Default::default()).await.unwrap();
    let mut stream = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let ev = tokio::time::timeout(LIMIT, stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        match ev {
            WatchEvent::Added(c) => seen.push(format!("ADDED {}", name(&c))),
            WatchEvent::Modified(c) => seen.push(format!("MODIFIED {}", name(&c))),
            WatchEvent::Deleted(c) => seen.push(format!("DELETED {}", name(&c))),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(seen, ["ADDED after", "MODIFIED before", "DELETED after"]);
    // From "0": the current state as ADDED events first.
    let mut stream = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    match tokio::time::timeout(LIMIT, stream.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
    {
        WatchEvent::Added(c) => assert_eq!(name(&c), "before"),
        other => panic!("expected the synthetic ADDED, got {other:?}"),
    }
}

#[tokio::test]
async fn a_watch_with_a_selector_sees_objects_leave_as_deletions() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let mut c = cm("a");
    c.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
    let created = api.create(&PostParams::default(), &c).await.unwrap();
    let rv = created.metadata.resource_version.unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "db"}}})),
    )
    .await
    .unwrap();
    let mut stream = api
        .watch(&WatchParams::default().labels("app=web"), &rv)
        .await
        .unwrap()
        .boxed();
    match tokio::time::timeout(LIMIT, stream.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
    {
        WatchEvent::Deleted(c) => {
            // `staging/src/k8s.io/apiserver/pkg/storage/cacher/cache_watcher.go`
            // (`convertToWatchEvent`): the last state that matched, at the event's
            // resourceVersion.
            assert_eq!(name(&c), "a");
            assert_eq!(c.metadata.labels.unwrap()["app"], "web");
            let v = api.get("a").await.unwrap().metadata.resource_version;
            assert_eq!(c.metadata.resource_version, v);
        }
        other => panic!("expected DELETED, got {other:?}"),
    }
}

/// `staging/src/k8s.io/apiserver/pkg/storage/cacher/watch_cache.go`
/// (`waitUntilFreshAndBlock`): a watch from a resourceVersion the store has not reached
/// is an error (504 Too large resource version), not a silent wait.
#[tokio::test]
async fn a_watch_from_a_resource_version_ahead_of_the_store_is_an_error() {
    let s = ApiServer::start().await.unwrap();
    let ahead = s.resource_version() + 1000;
    let (code, _, body) = crate::conformance::raw(
        &s,
        "GET",
        &format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={ahead}"),
        "application/json",
        Vec::new(),
    )
    .await;
    assert_eq!(code, 504, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("Too large resource version"),
        "{body}"
    );
}

/// The watch cache keeps one window per resource (`cacher.go`, one `watchCache` per
/// resource): changes to other kinds do not expire a resource's resourceVersions.
#[tokio::test]
async fn the_event_window_is_per_resource() {
    let s = ApiServer::builder().event_window(3).start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let first = api
        .create(&PostParams::default(), &cm("a"))
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(s.client(), "default");
    for i in 0..6 {
        let sec: k8s_openapi::api::core::v1::Secret =
            serde_json::from_value(json!({"metadata": {"name": format!("s{i}")}})).unwrap();
        secrets.create(&PostParams::default(), &sec).await.unwrap();
    }
    api.create(&PostParams::default(), &cm("b")).await.unwrap();
    let mut stream = api
        .watch(&WatchParams::default(), &first)
        .await
        .unwrap()
        .boxed();
    match tokio::time::timeout(LIMIT, stream.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
    {
        WatchEvent::Added(c) => assert_eq!(name(&c), "b"),
        other => panic!("expected ADDED b, got {other:?}"),
    }
    // The secrets' own window did move past that version.
    let mut stream = secrets
        .watch(&WatchParams::default(), &first)
        .await
        .unwrap()
        .boxed();
    let ev = tokio::time::timeout(LIMIT, stream.try_next())
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
async fn watch_bookmarks_carry_only_the_resource_version() {
    let s = ApiServer::builder()
        .bookmark_interval(Duration::from_millis(200))
        .start()
        .await
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let latest = s.resource_version();
    let mut stream = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    loop {
        match tokio::time::timeout(LIMIT, stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Added(_) => continue,
            WatchEvent::Bookmark(b) => {
                assert_eq!(b.types.kind, "ConfigMap");
                assert_eq!(b.metadata.resource_version.parse::<u64>().unwrap(), latest);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // Without allowWatchBookmarks there are none: the stream ends at its timeout silently.
    let mut quiet = api
        .watch(
            &WatchParams::default().disable_bookmarks().timeout(1),
            &latest.to_string(),
        )
        .await
        .unwrap()
        .boxed();
    assert!(
        tokio::time::timeout(LIMIT, quiet.try_next())
            .await
            .unwrap()
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn a_bookmark_arrives_before_the_watch_deadline() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let rv = s.resource_version().to_string();
    // The periodic bookmark is a minute away; the deadline is 2 s.
    let mut stream = api
        .watch(&WatchParams::default().timeout(2), &rv)
        .await
        .unwrap()
        .boxed();
    let ev = tokio::time::timeout(LIMIT, stream.try_next())
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(ev, Some(WatchEvent::Bookmark(_))), "{ev:?}");
    assert!(
        tokio::time::timeout(LIMIT, stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn watch_from_a_compacted_resource_version_gets_a_410_expired_event() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let old = api
        .create(&PostParams::default(), &cm("a"))
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    api.create(&PostParams::default(), &cm("b")).await.unwrap();
    s.compact();
    let mut stream = api
        .watch(&WatchParams::default(), &old)
        .await
        .unwrap()
        .boxed();
    match tokio::time::timeout(LIMIT, stream.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
    {
        WatchEvent::Error(st) => {
            assert_eq!((st.code, st.reason.as_str()), (410, "Expired"));
            assert!(
                st.message
                    .starts_with(&format!("too old resource version: {old} (")),
                "{}",
                st.message
            );
        }
        other => panic!("expected an ERROR event, got {other:?}"),
    }
    assert!(
        tokio::time::timeout(LIMIT, stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn the_event_window_expires_old_resource_versions() {
    let s = ApiServer::builder().event_window(3).start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let first = api
        .create(&PostParams::default(), &cm("a"))
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    for i in 0..5 {
        api.create(&PostParams::default(), &cm(&format!("x{i}")))
            .await
            .unwrap();
    }
    let mut stream = api
        .watch(&WatchParams::default(), &first)
        .await
        .unwrap()
        .boxed();
    let ev = tokio::time::timeout(LIMIT, stream.try_next())
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
async fn list_with_exact_resource_version_too_old_is_http_410() {
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let old = api
        .create(&PostParams::default(), &cm("a"))
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    api.create(&PostParams::default(), &cm("b")).await.unwrap();
    // Within the window, Exact answers the state at that version.
    let at = api
        .list(&ListParams::default().at(&old).matching(VersionMatch::Exact))
        .await
        .unwrap();
    assert_eq!(at.items.iter().map(name).collect::<Vec<_>>(), ["a"]);
    assert_eq!(at.metadata.resource_version.as_deref(), Some(old.as_str()));
    s.compact();
    match api
        .list(&ListParams::default().at(&old).matching(VersionMatch::Exact))
        .await
    {
        Err(kube::Error::Api(st)) => assert_eq!((st.code, st.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410, got {other:?}"),
    }
}

#[tokio::test]
async fn kube_runtime_watcher_follows_changes() {
    use kube::runtime::watcher::{self, Event};
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let mut w = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
    let mut initial = Vec::new();
    loop {
        match tokio::time::timeout(LIMIT, w.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            Event::Init => {}
            Event::InitApply(c) => initial.push(name(&c)),
            Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(initial, ["a"]);
    api.create(&PostParams::default(), &cm("b")).await.unwrap();
    api.delete("a", &Default::default()).await.unwrap();
    let mut live = Vec::new();
    while live.len() < 2 {
        match tokio::time::timeout(LIMIT, w.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            Event::Apply(c) => live.push(format!("apply {}", name(&c))),
            Event::Delete(c) => live.push(format!("delete {}", name(&c))),
            _ => {}
        }
    }
    assert_eq!(live, ["apply b", "delete a"]);
}

#[tokio::test]
async fn kube_runtime_watcher_with_streaming_lists() {
    use kube::runtime::watcher::{self, Event};
    let s = ApiServer::start().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let mut w = watcher::watcher(api.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut initial = Vec::new();
    loop {
        match tokio::time::timeout(LIMIT, w.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            Event::Init => {}
            Event::InitApply(c) => initial.push(name(&c)),
            Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(initial, ["a"]);
    assert!(
        s.requests()
            .iter()
            .any(|r| r.verb == "watch" && r.query.contains("sendInitialEvents=true"))
    );
    api.create(&PostParams::default(), &cm("b")).await.unwrap();
    match tokio::time::timeout(LIMIT, w.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
    {
        Event::Apply(c) => assert_eq!(name(&c), "b"),
        other => panic!("unexpected {other:?}"),
    }
}
