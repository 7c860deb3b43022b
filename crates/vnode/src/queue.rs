//! A small work queue: each key is processed by one worker at a time, a key added while
//! queued is queued once, a key added while processing is processed again afterwards.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct State {
    queued: HashSet<String>,
    active: HashSet<String>,
    dirty: HashSet<String>,
}

/// The queue. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Queue {
    tx: mpsc::UnboundedSender<String>,
    rx: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<String>>>,
    state: Arc<Mutex<State>>,
}

impl Queue {
    pub(crate) fn new() -> Queue {
        let (tx, rx) = mpsc::unbounded_channel();
        Queue {
            tx,
            rx: Arc::new(tokio::sync::Mutex::new(rx)),
            state: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn add(&self, key: &str) {
        let mut st = self.lock();
        if st.active.contains(key) {
            st.dirty.insert(key.to_string());
            return;
        }
        if st.queued.insert(key.to_string()) {
            let _ = self.tx.send(key.to_string());
        }
    }

    pub(crate) fn add_after(&self, key: &str, after: Duration, cancel: &CancellationToken) {
        let q = self.clone();
        let key = key.to_string();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = tokio::time::sleep(after) => q.add(&key),
            }
        });
    }

    /// The next key to work on, marked active; `None` when the queue is closed.
    pub(crate) async fn next(&self) -> Option<String> {
        let key = self.rx.lock().await.recv().await?;
        let mut st = self.lock();
        st.queued.remove(&key);
        st.active.insert(key.clone());
        Some(key)
    }

    /// Work on `key` finished; re-queues it if it was added meanwhile.
    pub(crate) fn done(&self, key: &str) {
        let again = {
            let mut st = self.lock();
            st.active.remove(key);
            st.dirty.remove(key)
        };
        if again {
            self.add(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_key_is_queued_once_and_redone_when_added_while_active() {
        let q = Queue::new();
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.next().await.as_deref(), Some("a"));
        q.add("a");
        assert_eq!(q.next().await.as_deref(), Some("b"));
        q.done("b");
        q.done("a");
        assert_eq!(q.next().await.as_deref(), Some("a"));
    }
}
