//! The process-wide liveness snapshot of the address reconciler.
//!
//! A process-global on purpose: there is exactly one address reconciler per control-plane
//! daemon (one per node would have every node racing to patch every other), and the
//! question it answers, "is the reconciler running at all, and is it failing?", must be
//! answerable without threading a handle through the daemon. A reconciler that never
//! started and one that fails every pass otherwise look the same from outside.

use std::sync::Mutex;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Liveness of the address reconciler in this process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// True once `Reconciler::run` entered its loop. False means it never started: the
    /// state in which no Node ever receives an ExternalIP.
    pub started: bool,
    /// When the most recent pass finished, successful or not.
    pub last_run_at: Option<DateTime<Utc>>,
    /// The most recent pass's error; `None` when it succeeded.
    pub last_error: Option<String>,
    /// Passes failed in a row; zero after a successful pass.
    pub consecutive_failures: u32,
}

static STATUS: Mutex<Option<Status>> = Mutex::new(None);

fn with_status<T>(f: impl FnOnce(&mut Option<Status>) -> T) -> T {
    // A panic while holding this lock cannot leave a half-written snapshot worth refusing.
    let mut guard = STATUS.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut guard)
}

/// The snapshot, or `None` when `run` was never called in this process.
pub fn last_status() -> Option<Status> {
    with_status(|s| s.clone())
}

/// Clears the snapshot. For tests only: the state is process-global, and a test asserting
/// on it must not inherit another test's residue.
#[doc(hidden)]
pub fn reset_status() {
    with_status(|s| *s = None);
}

pub(crate) fn mark_started() {
    with_status(|s| s.get_or_insert_with(Status::default).started = true);
}

/// Records a finished pass; returns the failure count before it (to detect transitions).
pub(crate) fn record_pass(result: Result<(), String>) -> u32 {
    with_status(|s| {
        let st = s.get_or_insert_with(Status::default);
        let before = st.consecutive_failures;
        st.last_run_at = Some(Utc::now());
        match result {
            Ok(()) => {
                st.last_error = None;
                st.consecutive_failures = 0;
            }
            Err(e) => {
                st.last_error = Some(e);
                st.consecutive_failures = st.consecutive_failures.saturating_add(1);
            }
        }
        before
    })
}
