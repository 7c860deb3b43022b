//! One stored resource served in two API groups: Events.
//!
//! kube-apiserver stores Events once (core `v1`, `pkg/registry/core/event`) and serves
//! the same storage as `events.k8s.io/v1` (`pkg/registry/events/rest/storage_events.go`
//! builds its REST storage from the core event store). Objects are converted on the
//! way in and out (`pkg/apis/events/v1/conversion.go`, `Convert_v1_Event_To_core_Event`
//! and `Convert_core_Event_To_v1_Event`): `regarding` is `involvedObject`, `note` is
//! `message`, `deprecatedSource` is `source`, `deprecatedFirstTimestamp`,
//! `deprecatedLastTimestamp` and `deprecatedCount` are `firstTimestamp`,
//! `lastTimestamp` and `count`, and the internal `ReportingController` is
//! `reportingController` in events.k8s.io/v1 but `reportingComponent` in core v1.
//! Everything else (`metadata`, `eventTime`, `series`, `action`, `reason`, `type`,
//! `related`, `reportingInstance`) has the same name in both.
//!
//! The double keeps the core form in the store; the handlers convert at the edge
//! ([`to_served`], [`to_storage`]).

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::resources::Resource;

/// Fields whose name differs: (core v1, events.k8s.io/v1).
const RENAMED: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
];

/// Whether `res` is Events in either group.
pub fn is_event(res: &Resource) -> bool {
    res.plural == "events" && (res.group.is_empty() || res.group == "events.k8s.io")
}

/// Whether `res` is served from another resource's storage (events.k8s.io/v1 Events).
pub fn is_events_v1(res: &Resource) -> bool {
    res.group == "events.k8s.io" && res.plural == "events"
}

/// Renames the top-level keys of an Event (`to_events` picks the direction over
/// [`RENAMED`]) and sets its type.
fn rename(obj: &Value, to_events: bool) -> Value {
    let Some(m) = obj.as_object() else {
        return obj.clone();
    };
    let mut out = Map::with_capacity(m.len());
    for (k, v) in m {
        let key = RENAMED
            .iter()
            .find_map(|&(core, ev)| {
                let (src, dst) = if to_events { (core, ev) } else { (ev, core) };
                (src == k).then_some(dst)
            })
            .unwrap_or(k.as_str());
        out.insert(key.to_string(), v.clone());
    }
    let api_version = if to_events { "events.k8s.io/v1" } else { "v1" };
    out.insert("apiVersion".into(), Value::String(api_version.into()));
    out.insert("kind".into(), Value::String("Event".into()));
    Value::Object(out)
}

/// A core v1 Event as events.k8s.io/v1 serves it.
pub fn core_to_events_v1(obj: &Value) -> Value {
    rename(obj, true)
}

/// An events.k8s.io/v1 Event in its core v1 (storage) form.
pub fn events_v1_to_core(obj: &Value) -> Value {
    rename(obj, false)
}

/// A stored object in the form `res` serves.
pub fn to_served(res: &Resource, obj: Arc<Value>) -> Arc<Value> {
    if is_events_v1(res) {
        Arc::new(core_to_events_v1(&obj))
    } else {
        obj
    }
}

/// An object written through `res`, in the form the store keeps.
pub fn to_storage(res: &Resource, obj: Value) -> Value {
    if is_events_v1(res) {
        events_v1_to_core(&obj)
    } else {
        obj
    }
}

/// The storage field an events.k8s.io/v1 field selector label names
/// (`AddFieldLabelConversionsForEvent` in `pkg/apis/events/v1/conversion.go`); None
/// for a label that API refuses ("field label not supported").
pub fn events_v1_field_label(label: &str) -> Option<String> {
    if let Some(rest) = label.strip_prefix("regarding.") {
        return matches!(
            rest,
            "kind" | "namespace" | "name" | "uid" | "apiVersion" | "resourceVersion" | "fieldPath"
        )
        .then(|| format!("involvedObject.{rest}"));
    }
    match label {
        "reportingController" => Some("reportingComponent".into()),
        "reason" | "source" | "type" | "metadata.name" | "metadata.namespace" => Some(label.into()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn events_v1() -> Value {
        json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e1", "namespace": "ns", "uid": "u", "resourceVersion": "7"},
            "eventTime": "2026-01-02T03:04:05.123456Z",
            "series": {"count": 3, "lastObservedTime": "2026-01-02T03:05:05.000001Z"},
            "reportingController": "example.com/ctl",
            "reportingInstance": "ctl-1",
            "action": "Reconcile", "reason": "Synced", "type": "Warning",
            "regarding": {"kind": "Pod", "namespace": "ns", "name": "p", "uid": "pu",
                          "apiVersion": "v1", "resourceVersion": "5", "fieldPath": "spec"},
            "related": {"kind": "Node", "name": "n1"},
            "note": "it happened",
            "deprecatedSource": {"component": "kubelet", "host": "n1"},
            "deprecatedFirstTimestamp": "2026-01-02T03:04:05Z",
            "deprecatedLastTimestamp": "2026-01-02T03:06:05Z",
            "deprecatedCount": 4
        })
    }

    #[test]
    fn events_v1_maps_onto_core_fields() {
        let core = events_v1_to_core(&events_v1());
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["kind"], "Event");
        assert_eq!(core["involvedObject"]["name"], "p");
        assert_eq!(core["involvedObject"]["fieldPath"], "spec");
        assert_eq!(core["message"], "it happened");
        assert_eq!(core["reportingComponent"], "example.com/ctl");
        assert_eq!(core["reportingInstance"], "ctl-1");
        assert_eq!(
            core["source"],
            json!({"component": "kubelet", "host": "n1"})
        );
        assert_eq!(core["firstTimestamp"], "2026-01-02T03:04:05Z");
        assert_eq!(core["lastTimestamp"], "2026-01-02T03:06:05Z");
        assert_eq!(core["count"], 4);
        for same in [
            "metadata",
            "eventTime",
            "series",
            "action",
            "reason",
            "type",
            "related",
        ] {
            assert_eq!(core[same], events_v1()[same], "{same}");
        }
        for gone in [
            "regarding",
            "note",
            "reportingController",
            "deprecatedSource",
            "deprecatedFirstTimestamp",
            "deprecatedLastTimestamp",
            "deprecatedCount",
        ] {
            assert!(core.get(gone).is_none(), "{gone} is not a core v1 field");
        }
    }

    #[test]
    fn conversion_round_trips_both_ways() {
        let ev = events_v1();
        assert_eq!(core_to_events_v1(&events_v1_to_core(&ev)), ev);
        let core = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "e2", "namespace": "ns"},
            "involvedObject": {"kind": "Node", "name": "n1"},
            "message": "m", "reason": "R", "type": "Normal",
            "source": {"component": "kubelet"}, "count": 2,
            "firstTimestamp": "2026-01-02T03:04:05Z", "lastTimestamp": "2026-01-02T03:04:06Z",
            "eventTime": null, "reportingComponent": "kubelet", "reportingInstance": "n1",
            "series": {"count": 2, "lastObservedTime": "2026-01-02T03:04:06.000000Z"},
            "action": "A", "related": {"kind": "Pod", "name": "p"}
        });
        let ev = core_to_events_v1(&core);
        assert_eq!(ev["apiVersion"], "events.k8s.io/v1");
        assert_eq!(ev["regarding"]["kind"], "Node");
        assert_eq!(ev["note"], "m");
        assert_eq!(ev["deprecatedCount"], 2);
        assert_eq!(ev["reportingController"], "kubelet");
        assert_eq!(events_v1_to_core(&ev), core);
    }

    #[test]
    fn events_v1_field_labels_are_the_apiservers() {
        assert_eq!(
            events_v1_field_label("regarding.name").as_deref(),
            Some("involvedObject.name")
        );
        assert_eq!(
            events_v1_field_label("reportingController").as_deref(),
            Some("reportingComponent")
        );
        assert_eq!(events_v1_field_label("source").as_deref(), Some("source"));
        // Core v1 spellings are not events.k8s.io/v1 labels.
        assert_eq!(events_v1_field_label("involvedObject.name"), None);
        assert_eq!(events_v1_field_label("reportingComponent"), None);
        assert_eq!(events_v1_field_label("note"), None);
        assert_eq!(events_v1_field_label("regarding.other"), None);
    }
}
