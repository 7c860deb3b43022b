//! Server-side printing: `meta.k8s.io/v1` Table answers for clients that ask for them
//! (`kubectl get` sends `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`), with the
//! columns of kube-apiserver's printers for the kinds people look at
//! (`pkg/printers/internalversion/printers.go`) and Name/Age for the rest.

use serde_json::{Value, json};

use crate::resources::Resource;

/// Whether an Accept header asks for a Table.
pub fn wants_table(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table") && first.contains("g=meta.k8s.io"))
}

/// A Go `duration.HumanDuration` of `secs`.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    let s = secs.max(0);
    if s < 120 {
        return format!("{s}s");
    }
    let m = s / 60;
    if m < 10 {
        return if s % 60 == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", s % 60)
        };
    }
    if m < 180 {
        return format!("{m}m");
    }
    let h = s / 3600;
    if h < 8 {
        return if m % 60 == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{}m", m % 60)
        };
    }
    if h < 48 {
        return format!("{h}h");
    }
    if h < 24 * 8 {
        return if h % 24 == 0 {
            format!("{}d", h / 24)
        } else {
            format!("{}d{}h", h / 24, h % 24)
        };
    }
    if h < 24 * 365 * 2 {
        return format!("{}d", h / 24);
    }
    let y = h / (24 * 365);
    let d = (h / 24) % 365;
    if h < 24 * 365 * 8 && d != 0 {
        return format!("{y}y{d}d");
    }
    format!("{y}y")
}

fn s<'a>(o: &'a Value, p: &str) -> &'a str {
    o.pointer(p).and_then(Value::as_str).unwrap_or("")
}

fn age(o: &Value, now: i64) -> String {
    since(s(o, "/metadata/creationTimestamp"), now)
}

fn col(name: &str, ty: &str, priority: u8) -> Value {
    let format = if name == "Name" { "name" } else { "" };
    json!({"name": name, "type": ty, "format": format, "description": "", "priority": priority})
}

fn count(o: &Value, p: &str) -> usize {
    o.pointer(p)
        .and_then(Value::as_object)
        .map_or(0, |m| m.len())
}

fn node_status(o: &Value) -> String {
    let ready = o
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .map(|c| match c["status"].as_str() {
            Some("True") => "Ready",
            Some("False") => "NotReady",
            _ => "Unknown",
        })
        .unwrap_or("Unknown");
    let mut st = ready.to_string();
    if o.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
        st.push_str(",SchedulingDisabled");
    }
    st
}

fn node_roles(o: &Value) -> String {
    let mut roles: Vec<&str> = o
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|l| {
            l.keys()
                .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                .filter(|r| !r.is_empty())
                .collect()
        })
        .unwrap_or_default();
    roles.sort();
    if roles.is_empty() {
        "<none>".into()
    } else {
        roles.join(",")
    }
}

fn address(o: &Value, ty: &str) -> String {
    o.pointer("/status/addresses")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().find(|x| x["type"] == ty))
        .and_then(|x| x["address"].as_str())
        .unwrap_or("<none>")
        .to_string()
}

fn pod_cells(o: &Value) -> (String, String, i64) {
    let statuses = o
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array);
    let total = o
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let ready = statuses.map_or(0, |a| a.iter().filter(|c| c["ready"] == true).count());
    let restarts = statuses.map_or(0, |a| {
        a.iter().filter_map(|c| c["restartCount"].as_i64()).sum()
    });
    let mut status = s(o, "/status/phase").to_string();
    if let Some(reason) = o.pointer("/status/reason").and_then(Value::as_str) {
        status = reason.to_string();
    }
    if let Some(a) = statuses {
        for c in a {
            if let Some(r) = c.pointer("/state/waiting/reason").and_then(Value::as_str) {
                status = r.to_string();
            } else if let Some(r) = c
                .pointer("/state/terminated/reason")
                .and_then(Value::as_str)
            {
                status = r.to_string();
            }
        }
    }
    if o.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["reason"] == "SchedulingGated"))
    {
        status = "SchedulingGated".into();
    }
    if o.pointer("/metadata/deletionTimestamp").is_some() {
        status = "Terminating".into();
    }
    (format!("{ready}/{total}"), status, restarts)
}

fn or_none(v: &str) -> String {
    if v.is_empty() {
        "<none>".into()
    } else {
        v.to_string()
    }
}

/// Column definitions and cells of one object.
pub fn columns(res: &Resource) -> Vec<Value> {
    match res.plural {
        "nodes" => vec![
            col("Name", "string", 0),
            col("Status", "string", 0),
            col("Roles", "string", 0),
            col("Age", "string", 0),
            col("Version", "string", 0),
            col("Internal-IP", "string", 1),
            col("External-IP", "string", 1),
            col("OS-Image", "string", 1),
            col("Kernel-Version", "string", 1),
            col("Container-Runtime", "string", 1),
        ],
        "pods" => vec![
            col("Name", "string", 0),
            col("Ready", "string", 0),
            col("Status", "string", 0),
            col("Restarts", "string", 0),
            col("Age", "string", 0),
            col("IP", "string", 1),
            col("Node", "string", 1),
            col("Nominated Node", "string", 1),
            col("Readiness Gates", "string", 1),
        ],
        "namespaces" => vec![
            col("Name", "string", 0),
            col("Status", "string", 0),
            col("Age", "string", 0),
        ],
        "configmaps" => vec![
            col("Name", "string", 0),
            col("Data", "integer", 0),
            col("Age", "string", 0),
        ],
        "secrets" => vec![
            col("Name", "string", 0),
            col("Type", "string", 0),
            col("Data", "integer", 0),
            col("Age", "string", 0),
        ],
        "leases" => vec![
            col("Name", "string", 0),
            col("Holder", "string", 0),
            col("Age", "string", 0),
        ],
        // Both event groups print core Events (one storage, one printer).
        "events" => vec![
            col("Last Seen", "string", 0),
            col("Type", "string", 0),
            col("Reason", "string", 0),
            col("Object", "string", 0),
            col("Subobject", "string", 1),
            col("Source", "string", 1),
            col("Message", "string", 0),
            col("First Seen", "string", 1),
            col("Count", "string", 1),
            col("Name", "string", 1),
        ],
        _ => vec![col("Name", "string", 0), col("Age", "string", 0)],
    }
}

/// How long ago an RFC 3339 time was, as kubectl prints ages; `<unknown>` when unset.
fn since(t: &str, now: i64) -> String {
    match crate::times::parse_rfc3339(t) {
        Ok(t) => human_duration(now - t.as_second()),
        Err(_) => "<unknown>".into(),
    }
}

/// kube-apiserver's event row (`printEvent`): times fall back to `eventTime`, a series
/// gives the last time and count, a singleton of the new API counts 1; the source is the
/// legacy `source` or else the reporting controller and instance.
fn event_cells(o: &Value, now: i64) -> Vec<Value> {
    let first = if s(o, "/firstTimestamp").is_empty() {
        since(s(o, "/eventTime"), now)
    } else {
        since(s(o, "/firstTimestamp"), now)
    };
    let mut last = if s(o, "/lastTimestamp").is_empty() {
        first.clone()
    } else {
        since(s(o, "/lastTimestamp"), now)
    };
    let mut count = o.get("count").and_then(Value::as_i64).unwrap_or(0);
    if let Some(series) = o.get("series").filter(|v| v.is_object()) {
        last = since(s(series, "/lastObservedTime"), now);
        count = series.get("count").and_then(Value::as_i64).unwrap_or(0);
    } else if count == 0 {
        count = 1;
    }
    let kind = s(o, "/involvedObject/kind").to_lowercase();
    let target = match s(o, "/involvedObject/name") {
        "" => kind,
        name => format!("{kind}/{name}"),
    };
    let first_non_empty = |a: &str, b: &str| {
        if a.is_empty() {
            b.to_string()
        } else {
            a.to_string()
        }
    };
    let component = first_non_empty(s(o, "/source/component"), s(o, "/reportingComponent"));
    let instance = first_non_empty(s(o, "/source/host"), s(o, "/reportingInstance"));
    let source = match (component.is_empty(), instance.is_empty()) {
        (true, _) => String::new(),
        (false, true) => component,
        (false, false) => format!("{component}, {instance}"),
    };
    vec![
        json!(last),
        json!(s(o, "/type")),
        json!(s(o, "/reason")),
        json!(target),
        json!(s(o, "/involvedObject/fieldPath")),
        json!(source),
        json!(s(o, "/message").trim()),
        json!(first),
        json!(count),
        json!(s(o, "/metadata/name")),
    ]
}

fn cells(res: &Resource, o: &Value, now: i64) -> Vec<Value> {
    let name = json!(s(o, "/metadata/name"));
    let a = json!(age(o, now));
    match res.plural {
        "nodes" => vec![
            name,
            json!(node_status(o)),
            json!(node_roles(o)),
            a,
            json!(s(o, "/status/nodeInfo/kubeletVersion")),
            json!(address(o, "InternalIP")),
            json!(address(o, "ExternalIP")),
            json!(or_none(s(o, "/status/nodeInfo/osImage"))),
            json!(or_none(s(o, "/status/nodeInfo/kernelVersion"))),
            json!(or_none(s(o, "/status/nodeInfo/containerRuntimeVersion"))),
        ],
        "pods" => {
            let (ready, status, restarts) = pod_cells(o);
            vec![
                name,
                json!(ready),
                json!(status),
                json!(restarts.to_string()),
                a,
                json!(or_none(s(o, "/status/podIP"))),
                json!(or_none(s(o, "/spec/nodeName"))),
                json!(or_none(s(o, "/status/nominatedNodeName"))),
                json!("<none>"),
            ]
        }
        "namespaces" => vec![name, json!(s(o, "/status/phase")), a],
        "configmaps" => vec![name, json!(count(o, "/data") + count(o, "/binaryData")), a],
        "secrets" => vec![name, json!(s(o, "/type")), json!(count(o, "/data")), a],
        "leases" => vec![name, json!(s(o, "/spec/holderIdentity")), a],
        "events" if crate::convert::is_events_v1(res) => {
            event_cells(&crate::convert::events_v1_to_core(o), now)
        }
        "events" => event_cells(o, now),
        _ => vec![name, a],
    }
}

/// The `object` of a row: the whole object for `includeObject=Object`, none for `None`,
/// else PartialObjectMetadata (the default).
fn row_object(o: &Value, include: &str) -> Value {
    match include {
        "Object" => o.clone(),
        "None" => Value::Null,
        _ => json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": o.get("metadata").cloned().unwrap_or(json!({}))}),
    }
}

/// A Table of `objs`. `with_columns` is false for the second and later watch events,
/// as kube-apiserver sends the column definitions once per watch.
pub fn table(
    res: &Resource,
    objs: &[&Value],
    list_meta: Value,
    include: &str,
    with_columns: bool,
    now: i64,
) -> Value {
    let rows: Vec<Value> = objs
        .iter()
        .map(|o| json!({"cells": cells(res, o, now), "object": row_object(o, include)}))
        .collect();
    let mut t = json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta, "rows": rows});
    t["columnDefinitions"] = if with_columns {
        json!(columns(res))
    } else {
        json!([])
    };
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::find;

    #[test]
    fn durations_read_like_kubectl() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(150), "2m30s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(3 * 3600 + 60), "3h1m");
        assert_eq!(human_duration(30 * 3600), "30h");
        assert_eq!(human_duration(3 * 86400 + 3600), "3d1h");
    }

    #[test]
    fn node_rows_show_readiness_roles_and_cordon() {
        let nodes = find("", "v1", "nodes").unwrap();
        let n = json!({"metadata": {"name": "n1", "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"node-role.kubernetes.io/control-plane": ""}},
            "spec": {"unschedulable": true},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "nodeInfo": {"kubeletVersion": "v1.33.0"}}});
        let t = table(nodes, &[&n], json!({}), "", true, 1_767_225_600 + 10);
        assert_eq!(
            t["rows"][0]["cells"],
            json!([
                "n1",
                "Ready,SchedulingDisabled",
                "control-plane",
                "10s",
                "v1.33.0",
                "<none>",
                "<none>",
                "<none>",
                "<none>",
                "<none>"
            ])
        );
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert!(wants_table(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
        assert!(!wants_table("application/json"));
    }

    #[test]
    fn pod_rows_show_terminating() {
        let pods = find("", "v1", "pods").unwrap();
        let p = json!({"metadata": {"name": "p", "deletionTimestamp": "x"},
            "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Running",
            "containerStatuses": [{"ready": true, "restartCount": 2}]}});
        let c = cells(pods, &p, 0);
        assert_eq!(
            (c[1].as_str(), c[2].as_str(), c[3].as_str()),
            (Some("1/1"), Some("Terminating"), Some("2"))
        );
    }

    #[test]
    fn event_rows_print_as_kube_apiservers_in_both_groups() {
        let t0 = 1_800_000_000;
        let at = |secs: i64| {
            jiff::Timestamp::from_second(t0 - secs)
                .unwrap()
                .strftime("%Y-%m-%dT%H:%M:%SZ")
                .to_string()
        };
        let core = find("", "v1", "events").unwrap();
        let events_v1 = find("events.k8s.io", "v1", "events").unwrap();
        assert_eq!(columns(core), columns(events_v1));
        assert_eq!(
            columns(core)
                .iter()
                .filter(|c| c["priority"] == 0)
                .map(|c| c["name"].as_str().unwrap())
                .collect::<Vec<_>>(),
            ["Last Seen", "Type", "Reason", "Object", "Message"]
        );
        // What a Recorder writes (events.k8s.io/v1): eventTime, no series yet.
        let recorded = json!({"metadata": {"name": "p.1"}, "eventTime": format!("{}.000000Z", &at(30)[..19]),
            "type": "Normal", "reason": "Provisioned", "note": "made it ",
            "regarding": {"kind": "Pod", "name": "p"}, "reportingController": "nebula-manager",
            "reportingInstance": "i1", "action": "Provision"});
        let row = cells(events_v1, &recorded, t0);
        assert_eq!(
            row,
            [
                json!("30s"),
                json!("Normal"),
                json!("Provisioned"),
                json!("pod/p"),
                json!(""),
                json!("nebula-manager, i1"),
                json!("made it"),
                json!("30s"),
                json!(1),
                json!("p.1")
            ]
        );
        // A legacy event: counted, with first and last times and a source without host.
        let legacy = json!({"metadata": {"name": "n.2"}, "type": "Warning", "reason": "Down",
            "message": "m", "involvedObject": {"kind": "Node", "name": "n", "fieldPath": "spec"},
            "source": {"component": "kubelet"}, "firstTimestamp": at(600), "lastTimestamp": at(5),
            "count": 4});
        let row = cells(core, &legacy, t0);
        assert_eq!(
            row,
            [
                json!("5s"),
                json!("Warning"),
                json!("Down"),
                json!("node/n"),
                json!("spec"),
                json!("kubelet"),
                json!("m"),
                json!("10m"),
                json!(4),
                json!("n.2")
            ]
        );
        // A series gives the last time and the count.
        let mut series = legacy;
        series["series"] =
            json!({"count": 9, "lastObservedTime": format!("{}.000000Z", &at(1)[..19])});
        let row = cells(core, &series, t0);
        assert_eq!((row[0].clone(), row[8].clone()), (json!("1s"), json!(9)));
    }
}
