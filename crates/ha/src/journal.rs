//! The join intent journal.
//!
//! A control-plane join adds an etcd member before this node has persisted anything that
//! records the membership. If the node dies between the add and its first etcd start,
//! the cluster counts a member that does not exist, and a plain restart would happily
//! bootstrap a fresh single-member cluster over it. The journal closes that window: the
//! intent is written durably (fsync of the file and its directory) *before* the add, and
//! cleared only once the local member's data is confirmed. While the file survives, a
//! start must treat the node as half-joined.

use std::path::{Path, PathBuf};

/// Where node state lives when no directory is given.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/stratum";
/// The journal's file name inside the state directory.
pub const JOIN_INTENT_FILE: &str = "join-intent.json";

/// What a join was about to do: enough to find and undo the member it added.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JoinIntent {
    /// The etcd member name being added.
    pub member_name: String,
    /// The new member's peer URL (what a rollback removes by).
    pub peer_url: String,
    /// The endpoints the add went through.
    pub endpoints: Vec<String>,
    /// When the intent was recorded, seconds since the Unix epoch.
    pub recorded_at_unix: u64,
}

/// A journal failure, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The file exists (or may exist) but could not be read: never treated as absent,
    /// because absent would let a half-joined node bootstrap a new cluster.
    #[error(
        "join intent journal {path} cannot be read; fix its permissions or storage \
         before starting this node (treating it as absent could split the etcd cluster)"
    )]
    Unreadable {
        /// The journal file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file was read but is not a journal.
    #[error(
        "join intent journal {path} is corrupt ({reason}); inspect it and the etcd member list \
         before removing it"
    )]
    Corrupt {
        /// The journal file.
        path: PathBuf,
        /// Why it does not parse.
        reason: String,
    },
    /// Writing the journal failed: the add must not go ahead.
    #[error("cannot record the join intent in {path}")]
    Write {
        /// The journal file.
        path: PathBuf,
        /// The write error.
        #[source]
        source: pki::PkiError,
    },
    /// An earlier intent survives: a join that may have added an etcd member and not
    /// finished. Recording over it would lose the only record of that member.
    #[error(
        "join intent journal {path} already records {intent}; a join may have added that etcd \
         member and not finished. Check `stratum-server etcd members`: remove the member if it \
         never started, finish or roll back that join, then remove the journal. Nothing was sent"
    )]
    Survives {
        /// The journal file.
        path: PathBuf,
        /// The surviving intent (member name, peer URL, when), or why it cannot be read.
        intent: String,
    },
    /// Removing the journal failed.
    #[error("cannot clear the join intent journal {path}")]
    Clear {
        /// The journal file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// The journal file of one node's state directory.
#[derive(Debug, Clone)]
pub struct JoinIntentJournal {
    path: PathBuf,
}

impl JoinIntentJournal {
    /// The journal in `state_dir` (production: [`DEFAULT_STATE_DIR`]).
    pub fn new(state_dir: &Path) -> Self {
        JoinIntentJournal {
            path: join_intent_path(state_dir),
        }
    }

    /// The journal file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records `intent` durably: temporary file, fsync, hard link into place (which, unlike a
    /// rename, never replaces an existing journal), fsync of the directory. Only after this
    /// returns may the member add be sent. A surviving intent is refused, naming it
    /// ([`JournalError::Survives`]).
    pub fn record(&self, intent: &JoinIntent) -> Result<(), JournalError> {
        self.refuse_survivor()?;
        let bytes = serde_json::to_vec_pretty(intent).unwrap_or_default();
        let dir = self
            .path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let tmp = dir.join(format!(".{JOIN_INTENT_FILE}.new.{}", std::process::id()));
        let write_err = |source| JournalError::Write {
            path: self.path.clone(),
            source,
        };
        let _ = std::fs::remove_file(&tmp);
        pki::write_atomic(&tmp, &bytes, 0o600).map_err(write_err)?;
        let linked = std::fs::hard_link(&tmp, &self.path);
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => {}
            // Recorded by someone else between the check and the link.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return self.refuse_survivor();
            }
            Err(e) => {
                return Err(write_err(pki::PkiError::Io {
                    op: "link",
                    path: self.path.clone(),
                    source: e,
                }));
            }
        }
        std::fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| {
                write_err(pki::PkiError::Io {
                    op: "fsync directory",
                    path: dir.clone(),
                    source: e,
                })
            })
    }

    /// `Ok` when no intent survives; otherwise the refusal naming it.
    fn refuse_survivor(&self) -> Result<(), JournalError> {
        let intent = match self.read() {
            Ok(None) => return Ok(()),
            Ok(Some(i)) => format!(
                "member {:?} at peer URL {} (recorded at Unix time {}, through {})",
                i.member_name,
                i.peer_url,
                i.recorded_at_unix,
                i.endpoints.join(", ")
            ),
            Err(e @ JournalError::Unreadable { .. }) => return Err(e),
            Err(e) => format!("an intent that does not parse ({e})"),
        };
        Err(JournalError::Survives {
            path: self.path.clone(),
            intent,
        })
    }

    /// Whether the journal file survives, whatever its contents. A file that exists but
    /// cannot be read is an error, never `false`.
    pub fn survives(&self) -> Result<bool, JournalError> {
        match std::fs::read(&self.path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(JournalError::Unreadable {
                path: self.path.clone(),
                source,
            }),
        }
    }

    /// The recorded intent: `None` when there is no journal, an error when it exists
    /// but cannot be read or parsed.
    pub fn read(&self) -> Result<Option<JoinIntent>, JournalError> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(JournalError::Unreadable {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| JournalError::Corrupt {
                path: self.path.clone(),
                reason: e.to_string(),
            })
    }

    /// Ends the journal once the join's work is done. A missing file is fine; the removal
    /// is made durable with an fsync of the directory.
    pub fn clear(&self) -> Result<(), JournalError> {
        let clear_err = |source| JournalError::Clear {
            path: self.path.clone(),
            source,
        };
        match std::fs::remove_file(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(clear_err(e)),
        }
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(clear_err)?;
        }
        Ok(())
    }
}

/// The journal path in `state_dir`.
pub fn join_intent_path(state_dir: &Path) -> PathBuf {
    state_dir.join(JOIN_INTENT_FILE)
}

/// Whether a join intent survives in `state_dir` (see [`JoinIntentJournal::survives`]).
pub fn join_intent_survives(state_dir: &Path) -> Result<bool, JournalError> {
    JoinIntentJournal::new(state_dir).survives()
}

/// Clears the join intent in `state_dir` (see [`JoinIntentJournal::clear`]).
pub fn clear_join_intent(state_dir: &Path) -> Result<(), JournalError> {
    JoinIntentJournal::new(state_dir).clear()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intent() -> JoinIntent {
        JoinIntent {
            member_name: "cp-2".into(),
            peer_url: "https://10.0.0.2:2380".into(),
            endpoints: vec!["https://10.0.0.1:2379".into()],
            recorded_at_unix: 1,
        }
    }

    #[test]
    fn record_survive_read_clear() {
        let dir = tempfile::tempdir().unwrap();
        let j = JoinIntentJournal::new(dir.path());
        assert!(!j.survives().unwrap());
        assert_eq!(j.read().unwrap(), None);
        j.record(&intent()).unwrap();
        assert!(j.survives().unwrap());
        assert_eq!(j.read().unwrap(), Some(intent()));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(j.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        j.clear().unwrap();
        assert!(!j.survives().unwrap());
        j.clear().unwrap();
    }

    #[test]
    fn a_surviving_intent_is_refused_and_named_not_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let j = JoinIntentJournal::new(dir.path());
        j.record(&intent()).unwrap();
        let mut other = intent();
        other.member_name = "cp-3".into();
        other.peer_url = "https://10.0.0.3:2380".into();
        let err = j.record(&other).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("cp-2") && text.contains("https://10.0.0.2:2380"),
            "the surviving intent is named: {text}"
        );
        assert!(text.contains(JOIN_INTENT_FILE), "{text}");
        assert_eq!(j.read().unwrap(), Some(intent()), "the survivor is kept");
        // A survivor that does not parse is refused too, not replaced.
        std::fs::write(j.path(), b"garbage").unwrap();
        assert!(j.record(&other).is_err());
        assert_eq!(std::fs::read(j.path()).unwrap(), b"garbage");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers.len(), 1, "{leftovers:?}");
        // Once cleared, a new intent is recorded.
        j.clear().unwrap();
        j.record(&other).unwrap();
        assert_eq!(j.read().unwrap(), Some(other));
    }

    #[test]
    fn garbage_still_survives_but_does_not_parse() {
        let dir = tempfile::tempdir().unwrap();
        let j = JoinIntentJournal::new(dir.path());
        std::fs::write(j.path(), b"\0\0 not json").unwrap();
        assert!(j.survives().unwrap());
        assert!(matches!(j.read(), Err(JournalError::Corrupt { .. })));
    }

    #[test]
    fn unreadable_is_an_error_not_absent() {
        let dir = tempfile::tempdir().unwrap();
        let j = JoinIntentJournal::new(dir.path());
        // A directory where the file should be: reading it fails with EISDIR, even as root.
        std::fs::create_dir(j.path()).unwrap();
        let err = j.survives().unwrap_err();
        assert!(matches!(err, JournalError::Unreadable { .. }));
        assert!(err.to_string().contains(JOIN_INTENT_FILE), "{err}");
        assert!(matches!(j.read(), Err(JournalError::Unreadable { .. })));
    }
}
