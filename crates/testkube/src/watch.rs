//! Watch streams: JSON lines (`{"type":...,"object":...}`) over a chunked response, from
//! a resourceVersion or from the current state, with bookmarks, timeouts, selectors and
//! 410 Expired for a resourceVersion older than the retained window.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::body::Body;
use crate::resources::Resource;
use crate::selector::{FieldSelector, LabelSelector};
use crate::status::ApiError;
use crate::store::{Event, EventType, Store, TooOld};

/// Where a watch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// Synthetic ADDED events for the current state, then changes (resourceVersion
    /// unset or "0").
    Current,
    /// Changes after this resourceVersion.
    From(u64),
}

/// A watch request.
#[derive(Clone, Debug)]
pub struct WatchSpec {
    /// Index of the resource's storage in the table ([`crate::store::res_index`]).
    pub res: usize,
    /// The resource the watch was asked of: objects, tables and bookmarks take its form
    /// (events.k8s.io/v1 Events are stored as core v1 ones).
    pub served: &'static Resource,
    /// Namespace filter.
    pub namespace: Option<String>,
    /// Label selector.
    pub labels: LabelSelector,
    /// Field selector.
    pub fields: FieldSelector,
    /// Start point.
    pub start: Start,
    /// Send BOOKMARK events.
    pub bookmarks: bool,
    /// Bookmark period.
    pub bookmark_interval: Duration,
    /// Close after this long.
    pub timeout: Option<Duration>,
    /// Close after the events already due (injected DropWatch).
    pub drop_after_backlog: bool,
    /// Render objects as Tables (`includeObject` value), for `kubectl get -w`.
    pub table: Option<String>,
    /// `sendInitialEvents=true` (streaming lists): after the initial ADDED events, a
    /// BOOKMARK annotated `k8s.io/initial-events-end: "true"` marks the end of the state.
    pub initial_events_end: bool,
}

impl WatchSpec {
    fn selects(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace
            && obj.pointer("/metadata/namespace").and_then(Value::as_str) != Some(ns.as_str())
        {
            return false;
        }
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    /// What a watcher with this selection sees of a change: an object leaving the
    /// selection is DELETED for it, carrying the last state that matched with the
    /// event's resourceVersion (the cacher's `convertToWatchEvent`); one entering it ADDED.
    pub fn translate(&self, ev: &Event) -> Option<(EventType, Arc<Value>)> {
        let now = self.selects(&ev.object);
        let before = ev.prev.as_ref().is_some_and(|p| self.selects(p));
        match ev.kind {
            EventType::Added => now.then(|| (EventType::Added, ev.object.clone())),
            EventType::Deleted => before.then(|| (EventType::Deleted, ev.object.clone())),
            EventType::Modified => match (before, now) {
                (true, true) => Some((EventType::Modified, ev.object.clone())),
                (true, false) => {
                    let mut last = ev.prev.as_deref().cloned().unwrap_or(Value::Null);
                    last["metadata"]["resourceVersion"] = Value::String(ev.rv.to_string());
                    Some((EventType::Deleted, Arc::new(last)))
                }
                (false, true) => Some((EventType::Added, ev.object.clone())),
                (false, false) => None,
            },
        }
    }
}

fn push_event(buf: &mut BytesMut, kind: &str, obj: &Value) {
    buf.extend_from_slice(b"{\"type\":\"");
    buf.extend_from_slice(kind.as_bytes());
    buf.extend_from_slice(b"\",\"object\":");
    // Serializing a serde_json::Value into a Vec cannot fail.
    buf.extend_from_slice(&serde_json::to_vec(obj).unwrap_or_default());
    buf.extend_from_slice(b"}\n");
}

/// Writes an event, rendering the object as a one-row Table when the watch asked for
/// Tables (column definitions on the first such event only, as kube-apiserver does).
fn emit(buf: &mut BytesMut, spec: &WatchSpec, first: &mut bool, kind: &str, obj: &Arc<Value>) {
    let obj = &*crate::convert::to_served(spec.served, obj.clone());
    match &spec.table {
        Some(include) if kind != "ERROR" && kind != "BOOKMARK" => {
            let res = spec.served;
            let meta = json!({"resourceVersion": obj.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null)});
            let t =
                crate::table::table(res, &[obj], meta, include, *first, crate::times::now_secs());
            *first = false;
            push_event(buf, kind, &t);
        }
        _ => push_event(buf, kind, obj),
    }
}

fn bookmark(res: &Resource, rv: u64) -> Value {
    json!({"kind": res.kind, "apiVersion": res.api_version(),
           "metadata": {"resourceVersion": rv.to_string()}})
}

fn expired_event(t: TooOld) -> Value {
    ApiError::expired(t.message()).to_status()
}

const FLUSH_AT: usize = 64 * 1024;

/// Starts a watch; the returned body streams its events.
pub fn start(store: Arc<Store>, spec: WatchSpec) -> Body {
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(run(store, spec, tx));
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let stream =
        futures::StreamExt::map(stream, |b| Ok::<_, crate::body::BoxError>(Frame::data(b)));
    StreamBody::new(stream).boxed()
}

async fn send(tx: &mpsc::Sender<Bytes>, buf: &mut BytesMut) -> bool {
    if buf.is_empty() {
        return true;
    }
    tx.send(buf.split().freeze()).await.is_ok()
}

async fn run(store: Arc<Store>, spec: WatchSpec, tx: mpsc::Sender<Bytes>) {
    let res = spec.served;
    let mut changed = store.subscribe();
    changed.borrow_and_update();
    let mut buf = BytesMut::new();
    let mut first = true;
    let mut last = match spec.start {
        Start::Current => {
            let (objs, rv) = {
                let g = store.lock();
                (g.list(spec.res, spec.namespace.as_deref()), g.rv())
            };
            for o in objs.iter().filter(|o| spec.selects(o)) {
                emit(&mut buf, &spec, &mut first, "ADDED", o);
                if buf.len() > FLUSH_AT && !send(&tx, &mut buf).await {
                    return;
                }
            }
            if spec.initial_events_end {
                let mut b = bookmark(res, rv);
                b["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
                push_event(&mut buf, "BOOKMARK", &b);
            }
            rv
        }
        Start::From(rv) => rv,
    };
    let started = Instant::now();
    let deadline = spec.timeout.map(|t| started + t);
    // One bookmark shortly before the deadline, so a client resuming after the timeout
    // starts from a recent resourceVersion (the cacher does the same).
    let mut pre_deadline = match (spec.bookmarks, spec.timeout) {
        (true, Some(t)) => {
            Some(started + t.saturating_sub(t.min(Duration::from_secs(1)).max(t / 10)))
        }
        _ => None,
    };
    let mut next_bookmark = started + spec.bookmark_interval;
    loop {
        loop {
            let batch = {
                let g = store.lock();
                g.events_since(spec.res, last, 1000)
                    .map(|evs| (evs, g.rv()))
            };
            let (events, head) = match batch {
                Ok(b) => b,
                Err(too_old) => {
                    push_event(&mut buf, "ERROR", &expired_event(too_old));
                    send(&tx, &mut buf).await;
                    return;
                }
            };
            let full = events.len() == 1000;
            for ev in &events {
                if let Some((kind, obj)) = spec.translate(ev) {
                    emit(&mut buf, &spec, &mut first, kind.as_str(), &obj);
                }
                last = ev.rv;
                if buf.len() > FLUSH_AT && !send(&tx, &mut buf).await {
                    return;
                }
            }
            if !full {
                // Every change up to `head` has been considered, including other kinds'.
                last = last.max(head);
                break;
            }
        }
        if !send(&tx, &mut buf).await {
            return;
        }
        if spec.drop_after_backlog {
            return;
        }
        let far = Instant::now() + Duration::from_secs(86400 * 365);
        let bookmark_at = if spec.bookmarks {
            pre_deadline.map_or(next_bookmark, |p| p.min(next_bookmark))
        } else {
            far
        };
        tokio::select! {
            r = changed.changed() => {
                if r.is_err() {
                    return;
                }
                changed.borrow_and_update();
            }
            _ = tokio::time::sleep_until(bookmark_at) => {
                push_event(&mut buf, "BOOKMARK", &bookmark(res, last));
                if !send(&tx, &mut buf).await {
                    return;
                }
                if pre_deadline.is_some_and(|p| p <= Instant::now()) {
                    pre_deadline = None;
                } else {
                    next_bookmark += spec.bookmark_interval;
                }
            }
            _ = tokio::time::sleep_until(deadline.unwrap_or(far)) => return,
            _ = tx.closed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::find;
    use crate::store::res_index;

    fn spec(labels: &str) -> WatchSpec {
        let pods = find("", "v1", "pods").unwrap();
        WatchSpec {
            res: res_index(pods),
            served: pods,
            namespace: None,
            labels: LabelSelector::parse(labels).unwrap(),
            fields: FieldSelector::default(),
            start: Start::Current,
            bookmarks: false,
            bookmark_interval: Duration::from_secs(60),
            timeout: None,
            drop_after_backlog: false,
            table: None,
            initial_events_end: false,
        }
    }

    fn ev(kind: EventType, prev: Option<Value>, obj: Value) -> Event {
        Event {
            rv: 2,
            res: 0,
            kind,
            object: Arc::new(obj),
            prev: prev.map(Arc::new),
        }
    }

    #[test]
    fn leaving_the_selection_is_a_deletion() {
        let s = spec("app=web");
        let web = json!({"metadata": {"labels": {"app": "web"}}});
        let db = json!({"metadata": {"labels": {"app": "db"}}});
        let t = |e: &Event| s.translate(e).map(|(k, _)| k);
        assert_eq!(
            t(&ev(EventType::Modified, Some(web.clone()), db.clone())),
            Some(EventType::Deleted)
        );
        assert_eq!(
            t(&ev(EventType::Modified, Some(db.clone()), web.clone())),
            Some(EventType::Added)
        );
        assert_eq!(
            t(&ev(EventType::Modified, Some(db.clone()), db.clone())),
            None
        );
        assert_eq!(
            t(&ev(EventType::Deleted, Some(web.clone()), web.clone())),
            Some(EventType::Deleted)
        );
        // Leaving: the last state that matched, at the event's resourceVersion.
        let (_, obj) = s
            .translate(&ev(EventType::Modified, Some(web), db))
            .unwrap();
        assert_eq!(obj["metadata"]["labels"]["app"], "web");
        assert_eq!(obj["metadata"]["resourceVersion"], "2");
    }
}
