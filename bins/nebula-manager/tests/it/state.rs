//! The manager's `--state-dir` for a test. The tests stop the manager with SIGKILL, and
//! its instances outlive it by design (crash safety), so the directory's guard ends them:
//! every process group recorded under it whose leader still runs in it is killed when
//! the test ends, pass or fail.

use std::ops::Deref;
use std::path::Path;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

pub(crate) struct StateDir(tempfile::TempDir);

pub(crate) fn state_dir() -> StateDir {
    StateDir(tempfile::tempdir().expect("a temporary state directory"))
}

impl Deref for StateDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        self.0.path()
    }
}

impl StateDir {
    pub(crate) fn path(&self) -> &Path {
        self.0.path()
    }
}

/// `(instance dir, pid)` of every `<state>/<provider>/<claim>/instance.json`.
fn recorded(state: &Path) -> Vec<(std::path::PathBuf, i32)> {
    let mut out = Vec::new();
    let dirs = |p: &Path| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(p)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect()
    };
    for provider in dirs(state) {
        for claim in dirs(&provider) {
            let Ok(text) = std::fs::read_to_string(claim.join("instance.json")) else {
                continue;
            };
            let pid = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v["pid"].as_i64())
                .and_then(|p| i32::try_from(p).ok());
            if let Some(pid) = pid {
                out.push((claim, pid));
            }
        }
    }
    out
}

impl Drop for StateDir {
    fn drop(&mut self) {
        for (dir, pid) in recorded(self.0.path()) {
            // Only a group whose leader still runs for this instance: a reused pid is
            // someone else's.
            let mine = std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                let want = format!("NEBULA_STATE={}", dir.display());
                env.split(|b| *b == 0).any(|kv| kv == want.as_bytes())
            });
            if mine {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}
