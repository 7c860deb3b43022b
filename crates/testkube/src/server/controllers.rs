//! The background loops kube-controller-manager would run: the garbage collector and
//! the bootstrap token cleaner (the scheduler stand-in and bootstrap signer live in
//! `crate::scheduler` and `crate::bootstrap`).

use super::*;

pub(super) async fn gc_loop(state: Arc<State>, cancel: CancellationToken) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = state.gc_kick.notified() => {}
        }
        let mut changed = false;
        {
            let mut g = state.store.lock();
            // Bounded: each pass removes or prunes something, and a chain of owners is finite.
            for _ in 0..1000 {
                if !crate::gc::pass(&mut g) {
                    break;
                }
                changed = true;
            }
        }
        if changed {
            state.notify();
        }
    }
}

pub(super) async fn token_cleaner(state: Arc<State>, every: Duration, cancel: CancellationToken) {
    let secrets = res_index(resources::find("", "v1", "secrets").expect("served"));
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = crate::times::now_secs();
        let removed = {
            let mut g = state.store.lock();
            let list = g.list(secrets, Some("kube-system"));
            let expired = crate::gc::expired_tokens(&list, now);
            for (ns, name, uid) in &expired {
                // The cleaner deletes with a uid precondition: a token recreated under
                // the same name in the meantime is a different object.
                if g.get(secrets, ns, name).is_some_and(|s| {
                    s.pointer("/metadata/uid").and_then(Value::as_str) == Some(uid)
                }) {
                    let _ = api::delete_locked(
                        &mut g,
                        resources::find("", "v1", "secrets").expect("served"),
                        ns,
                        name,
                        None,
                        None,
                        false,
                    );
                }
            }
            !expired.is_empty()
        };
        if removed {
            state.notify();
            state.kick_gc();
        }
    }
}
