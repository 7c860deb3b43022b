//! Background controllers kube-controller-manager would run: the owner-reference garbage
//! collector, the namespace controller's cleanup, and the bootstrap token cleaner.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::api::{delete_locked, namespaced_resources};
use crate::resources::{RESOURCES, find};
use crate::store::{Inner, obj_key, res_index};

/// What the collector decides for one dependent, from the uids of the owners it names
/// and which of them still exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every owner still exists (or was never seen: unknown uids are left alone).
    Keep,
    /// Some owners are gone: keep only these owner references.
    Prune(Vec<Value>),
    /// No owner is left: delete the dependent.
    Delete,
}

/// Decides for one dependent (`attemptToDeleteItem`): references to owners that are gone
/// are dropped; with no owner left the dependent goes.
pub fn verdict(owner_refs: &[Value], gone: &dyn Fn(&str) -> bool) -> Verdict {
    if owner_refs.is_empty() {
        return Verdict::Keep;
    }
    let live: Vec<Value> = owner_refs
        .iter()
        .filter(|r| !gone(r.get("uid").and_then(Value::as_str).unwrap_or("")))
        .cloned()
        .collect();
    if live.len() == owner_refs.len() {
        Verdict::Keep
    } else if live.is_empty() {
        Verdict::Delete
    } else {
        Verdict::Prune(live)
    }
}

/// The finalizers an object lists (strings only).
pub(crate) fn finalizers(o: &Value) -> Vec<String> {
    o.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn without_finalizer(o: &Value, f: &str) -> Value {
    let mut o = o.clone();
    let rest: Vec<String> = finalizers(&o).into_iter().filter(|x| x != f).collect();
    o["metadata"]["finalizers"] = json!(rest);
    o
}

/// Stores an updated object, removing it instead when it is being deleted and nothing
/// holds it any more.
fn put_or_remove(g: &mut Inner, idx: usize, o: Value) {
    if crate::strategy::should_remove_after_update(&o) {
        let (ns, name) = obj_key(&o);
        g.remove(idx, &ns, &name);
    } else {
        g.put(idx, o);
    }
}

/// One collection pass.
/// Returns whether anything changed (the caller repeats until nothing does, since a
/// deletion can orphan further dependents).
///
/// It decides as a walk over every stored object would, but only looks at what can have
/// changed: the objects being deleted (for foreground and orphan deletion) and the
/// dependents the store marked since the last pass (written since, or an owner of theirs
/// removed). Every other dependent's owners are all as they were when it was last looked
/// at, so its verdict is still to keep it. The store keeps these indexes on every write,
/// so a pass costs what changed, not the number of stored objects.
pub fn pass(g: &mut Inner) -> bool {
    let mut changed = false;
    // Owners being deleted in the foreground or with orphaning.
    let mut foreground: Vec<(usize, Arc<Value>)> = Vec::new();
    let mut orphaning: Vec<(usize, Arc<Value>)> = Vec::new();
    for (idx, o) in g.deleting() {
        let f = finalizers(&o);
        if f.iter().any(|x| x == "foregroundDeletion") {
            foreground.push((idx, o.clone()));
        }
        if f.iter().any(|x| x == "orphan") {
            orphaning.push((idx, o));
        }
    }
    let refs_of = |o: &Value| -> Vec<Value> {
        o.pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let uid_of = |o: &Value| -> String {
        o.pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    for (idx, owner) in &orphaning {
        let uid = uid_of(owner);
        for (didx, d) in g.dependents_of(&uid) {
            let refs = refs_of(&d);
            if refs.iter().any(|r| r["uid"] == uid.as_str()) {
                let mut nd = (*d).clone();
                nd["metadata"]["ownerReferences"] = json!(
                    refs.into_iter()
                        .filter(|r| r["uid"] != uid.as_str())
                        .collect::<Vec<_>>()
                );
                g.put(didx, nd);
                changed = true;
            }
        }
        if !changed {
            put_or_remove(g, *idx, without_finalizer(owner, "orphan"));
            return true;
        }
    }
    if changed {
        return true;
    }
    for (idx, owner) in &foreground {
        let uid = uid_of(owner);
        // `processDeletingDependentsItem`: the owner waits only for dependents whose
        // reference to it sets blockOwnerDeletion.
        let mut blocked = false;
        for (didx, d) in g.dependents_of(&uid) {
            let refs = refs_of(&d);
            let Some(r) = refs.iter().find(|r| r["uid"] == uid.as_str()) else {
                continue;
            };
            if r.get("blockOwnerDeletion") == Some(&json!(true)) {
                blocked = true;
            }
            if d.pointer("/metadata/deletionTimestamp").is_some() {
                continue;
            }
            let solid_other = refs
                .iter()
                .any(|o| o["uid"] != uid.as_str() && owner_state(g, &d, o) == OwnerState::Solid);
            if solid_other {
                // `attemptToDeleteItem`: another live owner keeps it; only this
                // reference goes.
                let mut nd = (*d).clone();
                nd["metadata"]["ownerReferences"] = json!(
                    refs.iter()
                        .filter(|o| o["uid"] != uid.as_str())
                        .collect::<Vec<_>>()
                );
                g.put(didx, nd);
            } else {
                let (ns, name) = obj_key(&d);
                let _ = delete_locked(
                    g,
                    &RESOURCES[didx],
                    &ns,
                    &name,
                    None,
                    Some("Foreground"),
                    false,
                );
            }
            changed = true;
        }
        if !blocked && !changed {
            put_or_remove(g, *idx, without_finalizer(owner, "foregroundDeletion"));
            return true;
        }
    }
    if changed {
        return true;
    }
    // The marked dependents in store order; one marked again while this runs is looked
    // at in this pass when it comes later in that order, else in the next pass (as a walk
    // over a snapshot of every dependent would).
    let mut cursor = None;
    while let Some(loc) = g.take_gc_dirty(cursor.as_ref()) {
        let (didx, (ns, name)) = &loc;
        let Some(d) = g.get(*didx, ns, name) else {
            cursor = Some(loc);
            continue;
        };
        let refs = refs_of(&d);
        let states: Vec<(String, OwnerState)> = refs
            .iter()
            .map(|r| {
                (
                    r.get("uid")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    owner_state(g, &d, r),
                )
            })
            .collect();
        let gone = |uid: &str| {
            states
                .iter()
                .any(|(u, s)| u == uid && *s == OwnerState::Absent)
        };
        match verdict(&refs, &gone) {
            Verdict::Keep => {}
            Verdict::Prune(live) => {
                let mut nd = (*d).clone();
                nd["metadata"]["ownerReferences"] = json!(live);
                g.put(*didx, nd);
                changed = true;
            }
            Verdict::Delete => {
                if d.pointer("/metadata/deletionTimestamp").is_none() {
                    if delete_locked(g, &RESOURCES[*didx], ns, name, None, None, false).is_err() {
                        // Tried again next pass, as a walk over every dependent would.
                        g.mark_gc_dirty(loc.clone());
                    }
                    changed = true;
                }
            }
        }
        cursor = Some(loc);
    }
    changed |= namespace_pass(g);
    changed
}

/// What the collector finds for one owner reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerState {
    /// The owner exists and is not being deleted.
    Solid,
    /// The owner exists and is being deleted.
    Deleting,
    /// No object of that kind, name and uid exists (the reference dangles).
    Absent,
    /// The kind is not one the double serves: the collector cannot tell, and leaves it.
    Unknown,
}

/// Looks an owner reference up as the collector does: by kind, name (in the dependent's
/// namespace for namespaced owners) and uid, so a recreated owner is another owner.
pub fn owner_state(g: &Inner, dependent: &Value, r: &Value) -> OwnerState {
    let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("");
    let Some(res) = crate::resources::find_kind(s("apiVersion"), s("kind")) else {
        return if g.was_removed(s("uid")) {
            OwnerState::Absent
        } else {
            OwnerState::Unknown
        };
    };
    let ns = if res.namespaced {
        dependent
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
    } else {
        ""
    };
    match g.get(res_index(res), ns, s("name")) {
        Some(o) if o.pointer("/metadata/uid").and_then(Value::as_str) == Some(s("uid")) => {
            if o.pointer("/metadata/deletionTimestamp").is_some() {
                OwnerState::Deleting
            } else {
                OwnerState::Solid
            }
        }
        _ => OwnerState::Absent,
    }
}

/// The namespace controller: a terminating namespace loses its contents, then its
/// `kubernetes` finalizer, then goes.
fn namespace_pass(g: &mut Inner) -> bool {
    let nsres = find("", "v1", "namespaces").expect("served");
    let nsidx = res_index(nsres);
    let mut changed = false;
    for ns in g.list(nsidx, None) {
        if ns.pointer("/metadata/deletionTimestamp").is_none() {
            continue;
        }
        let name = ns
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let mut empty = true;
        for r in namespaced_resources() {
            let idx = res_index(r);
            for o in g.list(idx, Some(&name)) {
                empty = false;
                if o.pointer("/metadata/deletionTimestamp").is_none() {
                    let (ons, oname) = obj_key(&o);
                    // The namespace deleter uses default DeleteOptions: scheduled pods
                    // terminate gracefully and the namespace waits for their kubelets.
                    let _ = delete_locked(g, r, &ons, &oname, None, None, false);
                    changed = true;
                }
            }
        }
        if empty {
            let mut o = without_finalizer(&ns, "kubernetes");
            o["spec"]["finalizers"] = json!([]);
            put_or_remove(g, nsidx, o);
            changed = true;
        }
    }
    changed
}

/// Bootstrap token Secrets in kube-system whose expiration has passed (`now` in seconds
/// since the epoch): (namespace, name, uid).
pub fn expired_tokens(secrets: &[Arc<Value>], now: i64) -> Vec<(String, String, String)> {
    use base64::Engine;
    secrets
        .iter()
        .filter(|s| s.get("type").and_then(Value::as_str) == Some("bootstrap.kubernetes.io/token"))
        .filter(|s| {
            s.pointer("/data/expiration")
                .and_then(Value::as_str)
                .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                .and_then(|raw| String::from_utf8(raw).ok())
                .and_then(|t| crate::times::parse_rfc3339(t.trim()).ok())
                .is_some_and(|exp| exp.as_second() <= now)
        })
        .map(|s| {
            let (ns, name) = obj_key(s);
            let uid = s
                .pointer("/metadata/uid")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            (ns, name, uid)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs(uids: &[&str]) -> Vec<Value> {
        uids.iter()
            .map(|u| json!({"uid": u, "kind": "ConfigMap", "name": u}))
            .collect()
    }

    #[test]
    fn a_dependent_goes_only_when_every_owner_is_gone() {
        let gone_a = |u: &str| u == "a";
        assert_eq!(verdict(&refs(&["a"]), &gone_a), Verdict::Delete);
        assert_eq!(
            verdict(&refs(&["a", "b"]), &gone_a),
            Verdict::Prune(refs(&["b"]))
        );
        assert_eq!(verdict(&refs(&["b"]), &gone_a), Verdict::Keep);
        assert_eq!(verdict(&[], &gone_a), Verdict::Keep);
    }

    #[test]
    fn a_pass_looks_only_at_what_changed() {
        let store = crate::store::Store::new(1000);
        let mut g = store.lock();
        let cms = res_index(find("", "v1", "configmaps").expect("served"));
        let cm = |name: &str, owners: &[&str]| {
            let refs: Vec<Value> = owners
                .iter()
                .map(|o| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": o, "uid": format!("u-{o}")}))
                .collect();
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
                "name": name, "namespace": "default", "uid": format!("u-{name}"),
                "ownerReferences": refs,
            }})
        };
        let settle = |g: &mut Inner| while pass(g) {};
        g.put(cms, cm("owner", &[]));
        g.put(cms, cm("dep", &["owner"]));
        g.put(cms, cm("dangling", &["missing"]));
        settle(&mut g);
        assert!(g.get(cms, "default", "dangling").is_none());
        assert!(g.get(cms, "default", "dep").is_some());
        // Nothing is left to look at, and a write that names no owner adds nothing.
        assert_eq!(g.take_gc_dirty(None), None);
        g.put(cms, cm("other", &[]));
        assert_eq!(g.take_gc_dirty(None), None);
        assert!(!pass(&mut g));
        // Removing the owner marks its dependent, which the next pass deletes.
        g.remove(cms, "default", "owner");
        assert!(pass(&mut g));
        assert!(g.get(cms, "default", "dep").is_none());
        // An owner deleted with orphaning: the dependent loses the reference and stays.
        g.put(cms, cm("o2", &[]));
        g.put(cms, cm("d2", &["o2", "other"]));
        settle(&mut g);
        let mut o2 = (*g.get(cms, "default", "o2").expect("stored")).clone();
        o2["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        o2["metadata"]["finalizers"] = json!(["orphan"]);
        g.put(cms, o2);
        settle(&mut g);
        assert!(g.get(cms, "default", "o2").is_none());
        let d2 = g.get(cms, "default", "d2").expect("kept");
        assert_eq!(
            d2["metadata"]["ownerReferences"],
            json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": "u-other"}])
        );
        assert!(g.dependents_of("u-o2").is_empty());
        assert_eq!(g.dependents_of("u-other").len(), 1);
    }

    #[test]
    fn expired_tokens_are_found() {
        use base64::Engine;
        let enc = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let tok = |name: &str, exp: &str| {
            Arc::new(json!({"type": "bootstrap.kubernetes.io/token",
            "metadata": {"name": name, "namespace": "kube-system", "uid": name},
            "data": {"expiration": enc(exp)}}))
        };
        let list = [
            tok("old", "2020-01-01T00:00:00Z"),
            tok("new", "2099-01-01T00:00:00Z"),
            Arc::new(
                json!({"type": "Opaque", "metadata": {"name": "x"}, "data": {"expiration": enc("2020-01-01T00:00:00Z")}}),
            ),
        ];
        let out = expired_tokens(&list, 1_700_000_000);
        assert_eq!(
            out,
            [(
                "kube-system".to_string(),
                "old".to_string(),
                "old".to_string()
            )]
        );
    }
}
