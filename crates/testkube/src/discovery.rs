//! Discovery documents: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/<group>/<version>`.
//! Served in the legacy (unaggregated) form: kubectl 1.32 asks for aggregated discovery
//! first and falls back when the answer is a plain APIGroupList.

use serde_json::{Value, json};

use crate::resources::{RESOURCES, Resource, groups, subresources};

/// The Kubernetes version reported.
pub const MINOR: &str = "33";

/// `/version`.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": MINOR,
        "gitVersion": format!("v1.{MINOR}.0-testkube"),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/api`.
pub fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_json(g: &str) -> Value {
    let gv = format!("{g}/v1");
    json!({
        "name": g,
        "versions": [{"groupVersion": gv, "version": "v1"}],
        "preferredVersion": {"groupVersion": gv, "version": "v1"},
    })
}

/// `/apis`.
pub fn group_list() -> Value {
    json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": groups().into_iter().map(group_json).collect::<Vec<_>>(),
    })
}

/// `/apis/<group>`.
pub fn group(g: &str) -> Option<Value> {
    groups().contains(&g).then(|| {
        let mut v = group_json(g);
        v["kind"] = json!("APIGroup");
        v["apiVersion"] = json!("v1");
        v
    })
}

fn sub_entry(r: &Resource, sub: &str) -> Value {
    let (kind, verbs): (&str, &[&str]) = match sub {
        "status" => (r.kind, &["get", "patch", "update"]),
        "binding" => ("Binding", &["create"]),
        "eviction" => ("Eviction", &["create"]),
        "log" => ("Pod", &["get"]),
        "exec" => ("PodExecOptions", &["create", "get"]),
        "attach" => ("PodAttachOptions", &["create", "get"]),
        "portforward" => ("PodPortForwardOptions", &["create", "get"]),
        _ => (r.kind, &["get"]),
    };
    json!({
        "name": format!("{}/{sub}", r.plural),
        "singularName": "",
        "namespaced": r.namespaced,
        "kind": kind,
        "verbs": verbs,
    })
}

/// `/api/v1` or `/apis/<group>/<version>`.
pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let members: Vec<&Resource> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if members.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let mut resources = Vec::new();
    for r in members {
        let mut entry = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": r.verbs(),
        });
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        resources.push(entry);
        for sub in subresources(r) {
            resources.push(sub_entry(r, sub));
        }
    }
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": resources,
    }))
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: the index of group-version documents.
pub fn openapi_v3_root() -> Value {
    let mut paths = serde_json::Map::new();
    let mut gvs: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES {
        if !gvs.contains(&(r.group, r.version)) {
            gvs.push((r.group, r.version));
        }
    }
    for (g, v) in gvs {
        let p = gv_path(g, v);
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash=testkube")}),
        );
    }
    json!({ "paths": paths })
}

/// `/openapi/v3/<gv>`: a document without schemas whose write operations declare the
/// `fieldValidation` parameter. kubectl reads it to learn that the server validates
/// fields itself, and then skips its client-side schema validation (for which it would
/// need the full schemas this double does not carry).
pub fn openapi_v3_gv(group: &str, version: &str) -> Option<Value> {
    let members: Vec<&Resource> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if members.is_empty() {
        return None;
    }
    let base = format!("/{}", gv_path(group, version));
    let mut paths = serde_json::Map::new();
    for r in members {
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let op = |action: &str| {
            json!({
                "x-kubernetes-group-version-kind": gvk,
                "x-kubernetes-action": action,
                "parameters": [
                    {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                    {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                    {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                ],
                "responses": {"200": {"description": "OK"}},
            })
        };
        let collection = if r.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("{base}/{}", r.plural)
        };
        paths.insert(collection.clone(), json!({"post": op("post")}));
        if !r.create_only {
            paths.insert(
                format!("{collection}/{{name}}"),
                json!({"put": op("put"), "patch": op("patch")}),
            );
        }
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v1.{MINOR}.0-testkube")},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_list_has_pod_subresources() {
        let l = resource_list("", "v1").unwrap();
        let names: Vec<&str> = l["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        for n in [
            "pods",
            "pods/status",
            "pods/log",
            "pods/exec",
            "nodes/status",
            "secrets",
        ] {
            assert!(names.contains(&n), "{n} missing from {names:?}");
        }
        assert!(resource_list("nope", "v1").is_none());
        assert!(group("apps").is_some());
    }
}
