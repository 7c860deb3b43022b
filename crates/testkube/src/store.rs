//! The object store: every object as JSON, one global resourceVersion counter, and a
//! retained window of change events that watches resume from.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;

use crate::resources::{RESOURCES, Resource};

/// A watch event type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// The object was created.
    Added,
    /// The object changed.
    Modified,
    /// The object was removed.
    Deleted,
}

impl EventType {
    /// The wire name (`ADDED`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One retained change.
#[derive(Clone, Debug)]
pub struct Event {
    /// The resourceVersion the change produced.
    pub rv: u64,
    /// Index of the resource in [`RESOURCES`].
    pub res: usize,
    /// What happened.
    pub kind: EventType,
    /// The object after the change (for a deletion: the last state, at the deletion's rv).
    pub object: Arc<Value>,
    /// The object before the change (None for a creation). Watches with selectors need it
    /// to tell an object leaving the selection from one that never was in it.
    pub prev: Option<Arc<Value>>,
}

/// A resourceVersion older than the retained window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooOld {
    /// The resourceVersion asked for.
    pub requested: u64,
    /// The oldest resourceVersion still servable.
    pub oldest: u64,
}

impl TooOld {
    /// kube-apiserver's wording.
    pub fn message(&self) -> String {
        format!(
            "too old resource version: {} ({})",
            self.requested, self.oldest
        )
    }
}

type ObjKey = (String, String);

/// Where an object lives: the index of its resource and its (namespace, name).
pub type ObjLoc = (usize, ObjKey);

/// The store's state, held under one lock so read-check-write sequences are atomic.
pub struct Inner {
    objects: Vec<BTreeMap<ObjKey, Arc<Value>>>,
    rv: u64,
    /// Retained change events, one window per resource (as the watch cache keeps one
    /// per resource), each in rv order.
    events: Vec<VecDeque<Event>>,
    window: usize,
    /// Per resource: a watch can resume from any rv >= floor, every later event of that
    /// resource is retained.
    floors: Vec<u64>,
    /// Where the last compaction left every resource.
    compacted: u64,
    uids: HashMap<String, (usize, ObjKey)>,
    tombstones: std::collections::HashSet<String>,
    /// What the garbage collector reads, kept up to date by every write so that a pass
    /// costs what changed, not what is stored ([`crate::gc::pass`]).
    gc: GcIndex,
}

/// The garbage collector's view of the store.
#[derive(Default)]
struct GcIndex {
    /// Owner uid -> the objects whose ownerReferences name it.
    dependents: HashMap<String, BTreeSet<ObjLoc>>,
    /// Objects with a deletionTimestamp.
    deleting: BTreeSet<ObjLoc>,
    /// Objects with owner references the collector has to look at again: written since
    /// it last did, or an owner they name was removed.
    dirty: BTreeSet<ObjLoc>,
}

/// The uids an object's ownerReferences name (those given as strings).
fn owner_uids(o: &Value) -> Vec<&str> {
    o.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("uid").and_then(Value::as_str))
        .collect()
}

fn has_owner_refs(o: &Value) -> bool {
    o.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
}

fn uid_of(o: &Value) -> Option<&str> {
    o.pointer("/metadata/uid").and_then(Value::as_str)
}

impl GcIndex {
    fn add(&mut self, loc: &ObjLoc, o: &Value) {
        if RESOURCES[loc.0].create_only {
            return;
        }
        for uid in owner_uids(o) {
            self.dependents
                .entry(uid.to_string())
                .or_default()
                .insert(loc.clone());
        }
        if has_owner_refs(o) {
            self.dirty.insert(loc.clone());
        }
        if o.pointer("/metadata/deletionTimestamp").is_some() {
            self.deleting.insert(loc.clone());
        }
    }

    fn drop(&mut self, loc: &ObjLoc, o: &Value) {
        for uid in owner_uids(o) {
            if let Some(set) = self.dependents.get_mut(uid) {
                set.remove(loc);
                if set.is_empty() {
                    self.dependents.remove(uid);
                }
            }
        }
        self.deleting.remove(loc);
        self.dirty.remove(loc);
    }

    /// The object with `uid` is gone: whatever names it as owner is looked at again.
    fn owner_gone(&mut self, uid: &str) {
        if let Some(set) = self.dependents.get(uid) {
            self.dirty.extend(set.iter().cloned());
        }
    }
}

/// The shared store.
pub struct Store {
    inner: Mutex<Inner>,
    changed: tokio::sync::watch::Sender<u64>,
}

/// The index of the storage of a resource in [`RESOURCES`]: its own, or for a resource
/// served from another's storage (events.k8s.io/v1 Events) that one's
/// ([`crate::resources::storage`]).
pub fn res_index(res: &Resource) -> usize {
    let i = RESOURCES
        .iter()
        .position(|r| r == res)
        .expect("resources come from the table");
    let stored = crate::resources::storage(&RESOURCES[i]);
    RESOURCES
        .iter()
        .position(|r| r == stored)
        .expect("resources come from the table")
}

fn key(ns: &str, name: &str) -> ObjKey {
    (ns.to_string(), name.to_string())
}

impl Store {
    /// An empty store retaining `window` events.
    pub fn new(window: usize) -> Self {
        let (changed, _) = tokio::sync::watch::channel(0);
        Store {
            inner: Mutex::new(Inner {
                objects: vec![BTreeMap::new(); RESOURCES.len()],
                rv: 0,
                events: vec![VecDeque::new(); RESOURCES.len()],
                window: window.max(1),
                floors: vec![0; RESOURCES.len()],
                compacted: 0,
                uids: HashMap::new(),
                tombstones: Default::default(),
                gc: GcIndex::default(),
            }),
            changed,
        }
    }

    /// Locks the store. Keep the guard short-lived and never hold it across an await.
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock would be a bug in the double; the data are
        // still consistent enough to keep serving other tests.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes watchers; call after releasing the lock following writes.
    pub fn notify(&self, rv: u64) {
        self.changed.send_replace(rv);
    }

    /// A receiver that changes whenever the store does.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

impl Inner {
    /// The latest resourceVersion.
    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// The oldest resourceVersion a watch of any resource can resume from.
    pub fn floor(&self) -> u64 {
        self.floors
            .iter()
            .copied()
            .max()
            .unwrap_or(0)
            .max(self.compacted)
    }

    /// The oldest resourceVersion a watch of resource `res` can resume from.
    pub fn floor_of(&self, res: usize) -> u64 {
        self.floors[res].max(self.compacted)
    }

    /// One object.
    pub fn get(&self, res: usize, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.objects[res].get(&key(ns, name)).cloned()
    }

    /// Objects of a resource, in (namespace, name) order, optionally in one namespace.
    pub fn list(&self, res: usize, ns: Option<&str>) -> Vec<Arc<Value>> {
        match ns {
            None => self.objects[res].values().cloned().collect(),
            Some(ns) => self.objects[res]
                .range(key(ns, "")..)
                .take_while(|((n, _), _)| n == ns)
                .map(|(_, v)| v.clone())
                .collect(),
        }
    }

    /// Objects after `after` (exclusive) in key order, for paged lists.
    pub fn list_after(
        &self,
        res: usize,
        ns: Option<&str>,
        after: &(String, String),
    ) -> Vec<Arc<Value>> {
        use std::ops::Bound::{Excluded, Unbounded};
        self.objects[res]
            .range((Excluded(after.clone()), Unbounded))
            .take_while(|((n, _), _)| ns.is_none_or(|ns| n == ns))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Number of objects of a resource.
    pub fn count(&self, res: usize) -> usize {
        self.objects[res].len()
    }

    /// The objects with a deletionTimestamp, in (resource, namespace, name) order.
    pub fn deleting(&self) -> Vec<(usize, Arc<Value>)> {
        self.gc
            .deleting
            .iter()
            .filter_map(|(r, (ns, name))| self.get(*r, ns, name).map(|o| (*r, o)))
            .collect()
    }

    /// The objects whose ownerReferences name `uid`, in (resource, namespace, name) order.
    pub fn dependents_of(&self, uid: &str) -> Vec<(usize, Arc<Value>)> {
        self.gc
            .dependents
            .get(uid)
            .into_iter()
            .flatten()
            .filter_map(|(r, (ns, name))| self.get(*r, ns, name).map(|o| (*r, o)))
            .collect()
    }

    /// Takes the first object the collector has to look at again that comes after
    /// `after` in (resource, namespace, name) order (from the start without `after`).
    pub fn take_gc_dirty(&mut self, after: Option<&ObjLoc>) -> Option<ObjLoc> {
        use std::ops::Bound::{Excluded, Unbounded};
        let next = match after {
            None => self.gc.dirty.first().cloned(),
            Some(a) => self
                .gc
                .dirty
                .range((Excluded(a.clone()), Unbounded))
                .next()
                .cloned(),
        }?;
        self.gc.dirty.remove(&next);
        Some(next)
    }

    /// Has the collector look at the object at `loc` again in its next pass.
    pub fn mark_gc_dirty(&mut self, loc: ObjLoc) {
        self.gc.dirty.insert(loc);
    }

    /// Where an object with this uid lives, if it exists.
    pub fn by_uid(&self, uid: &str) -> Option<(usize, String, String)> {
        self.uids
            .get(uid)
            .map(|(r, (ns, name))| (*r, ns.clone(), name.clone()))
    }

    /// Whether an object with this uid existed and was removed.
    pub fn was_removed(&self, uid: &str) -> bool {
        self.tombstones.contains(uid) && !self.uids.contains_key(uid)
    }

    /// Whether an object with this uid exists.
    pub fn uid_exists(&self, uid: &str) -> bool {
        self.uids.contains_key(uid)
    }

    /// Stores `obj` (a create when absent, else an update), giving it the next
    /// resourceVersion. Returns the stored object.
    pub fn put(&mut self, res: usize, obj: Value) -> Arc<Value> {
        let mut obj = obj;
        self.rv += 1;
        let rv = self.rv;
        obj["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let k = key(&ns, &name);
        let obj = Arc::new(obj);
        let prev = self.objects[res].insert(k.clone(), obj.clone());
        let loc = (res, k);
        if let Some(p) = &prev {
            self.gc.drop(&loc, p);
            // An object replaced under the same name by one with another uid: the old
            // one is gone for its dependents.
            if let Some(old) = uid_of(p)
                && uid_of(&obj) != Some(old)
            {
                self.gc.owner_gone(old);
            }
        }
        self.gc.add(&loc, &obj);
        if let Some(uid) = uid_of(&obj) {
            self.uids.insert(uid.to_string(), loc);
        }
        let kind = if prev.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.record(Event {
            rv,
            res,
            kind,
            object: obj.clone(),
            prev,
        });
        obj
    }

    /// Removes an object. The returned (and watched) last state carries the deletion's
    /// resourceVersion, as kube-apiserver's DELETED events do.
    pub fn remove(&mut self, res: usize, ns: &str, name: &str) -> Option<Arc<Value>> {
        let prev = self.objects[res].remove(&key(ns, name))?;
        self.gc.drop(&(res, key(ns, name)), &prev);
        if let Some(uid) = uid_of(&prev) {
            self.uids.remove(uid);
            self.tombstones.insert(uid.to_string());
            self.gc.owner_gone(uid);
        }
        self.rv += 1;
        let mut last = (*prev).clone();
        last["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        let last = Arc::new(last);
        self.record(Event {
            rv: self.rv,
            res,
            kind: EventType::Deleted,
            object: last.clone(),
            prev: Some(prev),
        });
        Some(last)
    }

    fn record(&mut self, ev: Event) {
        let res = ev.res;
        let q = &mut self.events[res];
        q.push_back(ev);
        while q.len() > self.window {
            if let Some(old) = q.pop_front() {
                self.floors[res] = old.rv;
            }
        }
    }

    /// Forgets every retained event, as an etcd compaction followed by a watch cache
    /// restart would: older resourceVersions now get 410.
    pub fn compact(&mut self) {
        for q in &mut self.events {
            q.clear();
        }
        self.compacted = self.rv;
    }

    /// Changes the retained window (per resource).
    pub fn set_window(&mut self, window: usize) {
        self.window = window.max(1);
        for (res, q) in self.events.iter_mut().enumerate() {
            while q.len() > self.window {
                if let Some(old) = q.pop_front() {
                    self.floors[res] = old.rv;
                }
            }
        }
    }

    /// Events of resource `res` with rv > `since`, at most `max` of them, or TooOld.
    pub fn events_since(&self, res: usize, since: u64, max: usize) -> Result<Vec<Event>, TooOld> {
        let floor = self.floor_of(res);
        if since < floor {
            return Err(TooOld {
                requested: since,
                oldest: floor,
            });
        }
        let q = &self.events[res];
        // Events are in rv order: binary search the first one after `since`.
        let start = q.partition_point(|e| e.rv <= since);
        Ok(q.range(start..).take(max).cloned().collect())
    }

    /// The state of resource `res` at resourceVersion `at`, rebuilt from the current
    /// objects by undoing retained events (for `resourceVersionMatch=Exact`).
    pub fn snapshot_at(
        &self,
        res: usize,
        ns: Option<&str>,
        at: u64,
    ) -> Result<Vec<Arc<Value>>, TooOld> {
        let floor = self.floor_of(res);
        if at < floor || at > self.rv {
            return Err(TooOld {
                requested: at,
                oldest: floor,
            });
        }
        let mut state: BTreeMap<ObjKey, Arc<Value>> = self.objects[res].clone();
        let q = &self.events[res];
        let start = q.partition_point(|e| e.rv <= at);
        for ev in q.range(start..).rev() {
            let k = obj_key(&ev.object);
            match &ev.prev {
                Some(p) => {
                    state.insert(k, p.clone());
                }
                None => {
                    state.remove(&k);
                }
            }
        }
        Ok(state
            .into_iter()
            .filter(|((n, _), _)| ns.is_none_or(|ns| n == ns))
            .map(|(_, v)| v)
            .collect())
    }
}

/// The (namespace, name) key of an object.
pub fn obj_key(obj: &Value) -> (String, String) {
    let s = |p: &str| {
        obj.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    (s("/metadata/namespace"), s("/metadata/name"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cm(name: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "default", "uid": format!("u-{name}")}})
    }

    #[test]
    fn every_write_gets_a_higher_resource_version() {
        let s = Store::new(100);
        let mut g = s.lock();
        let a = g.put(3, cm("a"));
        let b = g.put(3, cm("a"));
        let rv = |o: &Value| {
            o["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        };
        assert!(rv(&b) > rv(&a));
        let gone = g.remove(3, "default", "a").unwrap();
        assert!(rv(&gone) > rv(&b));
        assert!(!g.uid_exists("u-a"));
    }

    #[test]
    fn events_outside_the_window_are_too_old() {
        let s = Store::new(2);
        let mut g = s.lock();
        for n in ["a", "b", "c"] {
            g.put(3, cm(n));
        }
        assert_eq!(g.events_since(3, 1, 10).unwrap().len(), 2);
        assert_eq!(g.events_since(3, 0, 10).unwrap_err().oldest, 1);
        g.compact();
        assert!(g.events_since(3, 2, 10).is_err());
        assert!(g.events_since(3, 3, 10).unwrap().is_empty());
    }

    #[test]
    fn each_resource_keeps_its_own_window() {
        let s = Store::new(2);
        let mut g = s.lock();
        g.put(3, cm("a"));
        let before = g.rv();
        for n in ["b", "c", "d"] {
            g.put(4, cm(n));
        }
        // Three writes of another resource do not push resource 3's event out.
        assert_eq!(g.events_since(3, before - 1, 10).unwrap().len(), 1);
        assert!(g.events_since(4, before, 10).is_err());
    }

    #[test]
    fn snapshots_undo_later_events() {
        let s = Store::new(100);
        let mut g = s.lock();
        g.put(3, cm("a"));
        let at = g.rv();
        g.put(3, cm("b"));
        g.remove(3, "default", "a");
        let snap = g.snapshot_at(3, None, at).unwrap();
        assert_eq!(snap.len(), 1);
        assert_eq!(snap[0]["metadata"]["name"], "a");
    }
}
