//! Helpers for the end-to-end tests in `it/`.
//!
//! The tests run the real binaries as processes. They do not build them: a `cargo build`
//! from inside a running test relinks test executables that the runner is still using.
//! `cargo xtask ci` runs `cargo build --workspace --bins` before the tests, and
//! `cargo nextest run --workspace` builds every binary that has integration tests; when
//! running this package alone, build the binaries first.

use std::path::PathBuf;

/// Path of the workspace binary `name`, from the same target directory and profile as the
/// running test executable (`target/<profile>/deps/it-<hash>` → `target/<profile>/<name>`).
///
/// Panics, naming the command to run, when the binary has not been built.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable has a path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test executable lives in target/<profile>/deps");
    let path = profile_dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: build the binaries first with `cargo build --workspace --bins` \
         (cargo xtask ci does)",
        path.display()
    );
    path
}
