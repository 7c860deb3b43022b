//! Events: one resource served in two groups. kube-apiserver stores Events once (core v1)
//! and serves that storage as `events.k8s.io/v1` too (`pkg/registry/events/rest`), with
//! the conversions of `pkg/apis/events/v1/conversion.go` and the field selectors of its
//! `AddFieldLabelConversionsForEvent`.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, ObjectReference};
use k8s_openapi::api::events::v1::Event as EventsV1;
use kube::Api;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use serde_json::json;
use testkube::ApiServer;

use crate::conformance::cm;

const LIMIT: Duration = Duration::from_secs(20);

fn reference(c: &ConfigMap) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ConfigMap".into()),
        name: c.metadata.name.clone(),
        namespace: c.metadata.namespace.clone(),
        uid: c.metadata.uid.clone(),
        ..Default::default()
    }
}

fn recorded() -> Event {
    Event {
        type_: EventType::Warning,
        reason: "Rotated".into(),
        note: Some("the key was rotated".into()),
        action: "Rotate".into(),
        secondary: None,
    }
}

/// The next ADDED or MODIFIED object of a watch, skipping bookmarks.
async fn next_change<K: Clone + std::fmt::Debug>(
    stream: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<K>>> + Unpin),
) -> (&'static str, K) {
    loop {
        let ev = tokio::time::timeout(LIMIT, stream.try_next())
            .await
            .expect("a watch event within the limit")
            .unwrap()
            .expect("the watch stays open");
        match ev {
            WatchEvent::Added(o) => return ("ADDED", o),
            WatchEvent::Modified(o) => return ("MODIFIED", o),
            WatchEvent::Deleted(o) => return ("DELETED", o),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(e) => panic!("watch error: {e:?}"),
        }
    }
}

#[tokio::test]
async fn recorder_events_are_listed_and_watched_as_core_v1_events() {
    let s = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(s.client(), "default");
    let target = cms
        .create(&PostParams::default(), &cm("keys"))
        .await
        .unwrap();
    let core: Api<CoreEvent> = Api::namespaced(s.client(), "default");
    let before = core
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut watch = core
        .watch(&WatchParams::default(), &before)
        .await
        .unwrap()
        .boxed();

    let recorder = Recorder::new(
        s.client(),
        Reporter {
            controller: "example.com/rotator".into(),
            instance: Some("rotator-0".into()),
        },
    );
    recorder
        .publish(&recorded(), &reference(&target))
        .await
        .unwrap();

    let list = core.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(list.len(), 1, "the Recorder's event is a core v1 Event");
    let e = &list[0];
    assert_eq!(e.involved_object.kind.as_deref(), Some("ConfigMap"));
    assert_eq!(e.involved_object.name.as_deref(), Some("keys"));
    assert_eq!(e.involved_object.uid, target.metadata.uid);
    assert_eq!(e.message.as_deref(), Some("the key was rotated"));
    assert_eq!(e.reason.as_deref(), Some("Rotated"));
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    assert_eq!(e.action.as_deref(), Some("Rotate"));
    assert_eq!(
        e.reporting_component.as_deref(),
        Some("example.com/rotator")
    );
    assert_eq!(e.reporting_instance.as_deref(), Some("rotator-0"));
    assert!(e.event_time.is_some());

    let (kind, seen) = next_change(&mut watch).await;
    assert_eq!(kind, "ADDED");
    assert_eq!(seen.metadata.uid, e.metadata.uid);
    assert_eq!(seen.involved_object.name.as_deref(), Some("keys"));
    assert_eq!(seen.message.as_deref(), Some("the key was rotated"));

    // The same object through events.k8s.io/v1: same name, uid and resourceVersion.
    let name = e.metadata.name.clone().unwrap();
    let ev: Api<EventsV1> = Api::namespaced(s.client(), "default");
    let same = ev.get(&name).await.unwrap();
    assert_eq!(same.metadata.uid, e.metadata.uid);
    assert_eq!(same.metadata.resource_version, e.metadata.resource_version);
    assert_eq!(
        same.regarding.as_ref().unwrap().name.as_deref(),
        Some("keys")
    );
    assert_eq!(same.note.as_deref(), Some("the key was rotated"));

    // A repeat is a merge patch through events.k8s.io/v1 setting `series`; the core
    // watch sees it as a change of the same Event.
    recorder
        .publish(&recorded(), &reference(&target))
        .await
        .unwrap();
    let (kind, changed) = next_change(&mut watch).await;
    assert_eq!(kind, "MODIFIED");
    assert_eq!(changed.metadata.name.as_deref(), Some(name.as_str()));
    assert_eq!(changed.series.as_ref().map(|s| s.count), Some(Some(2)));
    let again = ev.get(&name).await.unwrap();
    assert_eq!(
        again.metadata.resource_version,
        changed.metadata.resource_version
    );
    assert_eq!(again.series.map(|s| s.count), Some(2));
    s.shutdown().await;
}

#[tokio::test]
async fn core_v1_events_are_served_through_events_k8s_io() {
    let s = ApiServer::builder()
        .bookmark_interval(Duration::from_millis(200))
        .start()
        .await
        .unwrap();
    let ev: Api<EventsV1> = Api::namespaced(s.client(), "default");
    let start = ev
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let core: Api<CoreEvent> = Api::namespaced(s.client(), "default");
    let written: CoreEvent = serde_json::from_value(json!({
        "metadata": {"name": "n1.started"},
        "involvedObject": {"kind": "Node", "name": "n1", "apiVersion": "v1"},
        "reason": "Starting", "message": "kubelet started", "type": "Normal",
        "source": {"component": "kubelet", "host": "n1"},
        "count": 3,
        "firstTimestamp": "2026-01-02T03:04:05Z", "lastTimestamp": "2026-01-02T03:14:05Z",
        "reportingComponent": "kubelet", "reportingInstance": "n1"
    }))
    .unwrap();
    let created = core.create(&PostParams::default(), &written).await.unwrap();

    let got = ev.get("n1.started").await.unwrap();
    assert_eq!(got.metadata.uid, created.metadata.uid);
    assert_eq!(
        got.metadata.resource_version,
        created.metadata.resource_version
    );
    let regarding = got.regarding.clone().unwrap();
    assert_eq!(regarding.kind.as_deref(), Some("Node"));
    assert_eq!(regarding.name.as_deref(), Some("n1"));
    assert_eq!(got.note.as_deref(), Some("kubelet started"));
    let source = got.deprecated_source.clone().unwrap();
    assert_eq!(source.component.as_deref(), Some("kubelet"));
    assert_eq!(source.host.as_deref(), Some("n1"));
    assert_eq!(got.deprecated_count, Some(3));
    assert_eq!(
        got.deprecated_first_timestamp, created.first_timestamp,
        "firstTimestamp is deprecatedFirstTimestamp"
    );
    assert_eq!(got.deprecated_last_timestamp, created.last_timestamp);
    assert_eq!(got.reporting_controller.as_deref(), Some("kubelet"));
    assert_eq!(got.reporting_instance.as_deref(), Some("n1"));

    // A watch through events.k8s.io/v1 resumed from before the write sees it converted,
    // and its bookmarks name the events.k8s.io/v1 kind.
    let mut stream = ev
        .watch(&WatchParams::default(), &start)
        .await
        .unwrap()
        .boxed();
    let (kind, added) = next_change(&mut stream).await;
    assert_eq!(kind, "ADDED");
    assert_eq!(added.note.as_deref(), Some("kubelet started"));
    assert_eq!(added.regarding.unwrap().name.as_deref(), Some("n1"));
    let next = tokio::time::timeout(LIMIT, stream.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match next {
        WatchEvent::Bookmark(b) => {
            assert_eq!(b.types.api_version, "events.k8s.io/v1");
            assert_eq!(b.types.kind, "Event");
        }
        other => panic!("expected a bookmark, got {other:?}"),
    }

    // A write through events.k8s.io/v1 is a write of the core Event. (Through that API
    // only `series` and metadata may change: `ValidateEventUpdate`.)
    let patched = ev
        .patch(
            "n1.started",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"seen": "twice"}},
                "series": {"count": 2, "lastObservedTime": "2026-01-02T03:15:05.000000Z"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.series.as_ref().map(|s| s.count), Some(2));
    assert_eq!(patched.note.as_deref(), Some("kubelet started"));
    let reread = core.get("n1.started").await.unwrap();
    assert_eq!(reread.series.and_then(|s| s.count), Some(2));
    assert_eq!(
        reread
            .metadata
            .labels
            .unwrap()
            .get("seen")
            .map(String::as_str),
        Some("twice")
    );
    assert_eq!(
        reread.metadata.resource_version,
        patched.metadata.resource_version
    );
    assert_eq!(reread.message.as_deref(), Some("kubelet started"));
    assert_eq!(reread.source.unwrap().component.as_deref(), Some("kubelet"));

    // A delete through either group removes the one object.
    ev.delete("n1.started", &DeleteParams::default())
        .await
        .unwrap();
    let gone = core.get("n1.started").await.unwrap_err();
    assert!(
        matches!(gone, kube::Error::Api(ref st) if st.code == 404),
        "{gone:?}"
    );
    s.shutdown().await;
}

#[tokio::test]
async fn event_field_selectors_follow_each_groups_labels() {
    let s = ApiServer::start().await.unwrap();
    let core: Api<CoreEvent> = Api::namespaced(s.client(), "default");
    for (name, node) in [("a", "n1"), ("b", "n2")] {
        let e: CoreEvent = serde_json::from_value(json!({
            "metadata": {"name": name},
            "involvedObject": {"kind": "Node", "name": node},
            "reason": "Starting", "type": "Normal", "reportingComponent": "kubelet"
        }))
        .unwrap();
        core.create(&PostParams::default(), &e).await.unwrap();
    }
    let names = |items: Vec<EventsV1>| {
        items
            .into_iter()
            .map(|e| e.metadata.name.unwrap())
            .collect::<Vec<_>>()
    };
    let ev: Api<EventsV1> = Api::namespaced(s.client(), "default");
    let by_regarding = ev
        .list(&ListParams::default().fields("regarding.name=n2"))
        .await
        .unwrap();
    assert_eq!(names(by_regarding.items), ["b"]);
    let by_controller = ev
        .list(&ListParams::default().fields("reportingController=kubelet,source=kubelet"))
        .await
        .unwrap();
    assert_eq!(names(by_controller.items), ["a", "b"]);
    let core_names = core
        .list(&ListParams::default().fields("involvedObject.name=n1,source=kubelet"))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|e| e.metadata.name.unwrap())
        .collect::<Vec<_>>();
    assert_eq!(
        core_names,
        ["a"],
        "`source` falls back to reportingComponent"
    );

    // Each group refuses the other's spellings, as kube-apiserver's label conversions do.
    let refused = ev
        .list(&ListParams::default().fields("involvedObject.name=n1"))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, kube::Error::Api(st) if st.code == 400
            && st.message.contains("field label not supported: involvedObject.name")),
        "{refused:?}"
    );
    let refused = core
        .list(&ListParams::default().fields("regarding.name=n1"))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, kube::Error::Api(st) if st.code == 400
            && st.message.contains("field label not supported: regarding.name")),
        "{refused:?}"
    );
    s.shutdown().await;
}

#[tokio::test]
async fn events_k8s_io_writes_follow_its_strict_validation() {
    let s = ApiServer::start().await.unwrap();
    let ev: Api<EventsV1> = Api::namespaced(s.client(), "default");
    // events.k8s.io/v1 needs eventTime, the reporter, an action (ValidateEventCreate).
    let bare: EventsV1 = serde_json::from_value(json!({
        "metadata": {"name": "bare"}, "reason": "Started", "type": "Normal",
        "regarding": {"kind": "Node", "name": "n1"}
    }))
    .unwrap();
    let err = ev.create(&PostParams::default(), &bare).await.unwrap_err();
    let kube::Error::Api(st) = &err else {
        panic!("expected a Status, got {err:?}")
    };
    assert_eq!(st.code, 422, "{st:?}");
    let causes: Vec<String> = st
        .details
        .as_ref()
        .unwrap()
        .causes
        .iter()
        .map(|c| c.field.clone())
        .collect();
    assert_eq!(causes, ["eventTime"], "{st:?}");
    // The same body through core v1 passes (legacy rules only).
    let core: Api<CoreEvent> = Api::namespaced(s.client(), "default");
    let legacy: CoreEvent = serde_json::from_value(json!({
        "metadata": {"name": "bare"}, "reason": "Started", "type": "Normal",
        "involvedObject": {"kind": "Node", "name": "n1"}
    }))
    .unwrap();
    core.create(&PostParams::default(), &legacy).await.unwrap();
    // Through events.k8s.io/v1 only series and metadata may change; core v1 may change
    // the message.
    let err = ev
        .patch(
            "bare",
            &PatchParams::default(),
            &Patch::Merge(json!({"note": "changed"})),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(st) if st.code == 422
            && st.message.contains("message: Invalid value")
            && st.message.contains("field is immutable")),
        "{err:?}"
    );
    let changed = core
        .patch(
            "bare",
            &PatchParams::default(),
            &Patch::Merge(json!({"message": "changed"})),
        )
        .await
        .unwrap();
    assert_eq!(changed.message.as_deref(), Some("changed"));
    s.shutdown().await;
}
