//! Scale: thousands of objects through list and watch. Counts and order, never time.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use testkube::ApiServer;

use crate::conformance::{cm, node};

#[tokio::test]
async fn five_thousand_nodes_list_and_watch() {
    let s = ApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(s.client());
    // Create with a few concurrent clients; the count is what matters.
    let mut tasks = Vec::new();
    for w in 0..8 {
        let nodes = nodes.clone();
        tasks.push(tokio::spawn(async move {
            for i in (w..5000).step_by(8) {
                nodes
                    .create(&PostParams::default(), &node(&format!("node-{i:05}")))
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let all = nodes.list(&ListParams::default()).await.unwrap();
    assert_eq!(all.items.len(), 5000);
    assert_eq!(all.items[0].metadata.name.as_deref(), Some("node-00000"));
    // Paged as kube-runtime's watcher does it.
    let mut paged = 0;
    let mut lp = ListParams::default().limit(500);
    loop {
        let page = nodes.list(&lp).await.unwrap();
        paged += page.items.len();
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = ListParams::default().limit(500).continue_token(&c),
            _ => break,
        }
    }
    assert_eq!(paged, 5000);
    let mut stream = nodes
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    let mut added = 0;
    while added < 5000 {
        match tokio::time::timeout(Duration::from_secs(60), stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Added(_) => added += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(added, 5000);
}

#[tokio::test]
async fn a_watch_delivers_ten_thousand_events_in_order() {
    // A window larger than the run, so a slow reader on a loaded machine cannot fall
    // out of it: delivery and order are what this test checks, not expiry.
    let s = ApiServer::builder()
        .event_window(20_000)
        .start()
        .await
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    api.create(&PostParams::default(), &cm("counter"))
        .await
        .unwrap();
    let rv = s.resource_version().to_string();
    let mut stream = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let writer = {
        let api = api.clone();
        tokio::spawn(async move {
            for i in 0..10_000 {
                api.patch(
                    "counter",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"data": {"n": i.to_string()}})),
                )
                .await
                .unwrap();
            }
        })
    };
    let mut expected = 0u32;
    let mut last_rv = 0u64;
    while expected < 10_000 {
        match tokio::time::timeout(Duration::from_secs(60), stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Modified(c) => {
                let n: u32 = c.data.unwrap()["n"].parse().unwrap();
                assert_eq!(n, expected, "events arrive in write order");
                let rv: u64 = c.metadata.resource_version.unwrap().parse().unwrap();
                assert!(rv > last_rv);
                last_rv = rv;
                expected += 1;
            }
            WatchEvent::Bookmark(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    writer.await.unwrap();
    assert_eq!(expected, 10_000);
}
