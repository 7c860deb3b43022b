//! Crash-safe file writes: the project's one atomic writer, `common::fsutil` (a unique
//! temporary beside the target, `O_EXCL | O_NOFOLLOW`, the mode set at creation, fsync of
//! the file, rename, fsync of the directory), re-exported where this crate's modules
//! reach for it.

pub use common::fsutil::{FsError, fs_err, remove_file_synced, sync_dir, write_atomic};
