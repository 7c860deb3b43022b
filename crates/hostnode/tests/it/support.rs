//! Running a test body inside namespaces.

use std::path::Path;
use std::process::Command;

/// Set in the re-executed test process to the name of the test it must run.
const INNER_ENV: &str = "HOSTNODE_IT_INNER";

/// Fails the test unless it runs as root.
pub fn require_root(what: &str) {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "{what} needs root (it creates mount and network namespaces): run the tests as root"
    );
}

/// Fails the test unless `program` is on PATH.
pub fn require_program(program: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()));
    assert!(found, "{program} not found: apt-get install {package}");
}

/// Runs the calling test in a private mount namespace. A mount namespace cannot be
/// entered by one thread of a multithreaded process (the test harness has several), so
/// the test binary is executed again under `unshare -m --propagation private`, filtered
/// to this one test. Returns `true` in that inner process, where the caller runs its
/// body; `false` in the outer one, after the inner run passed.
pub fn in_private_mount_ns(module_path: &str, test: &str) -> bool {
    // module_path!() is "it::mounts"; libtest names the test "mounts::<fn>".
    let name = match module_path.split_once("::") {
        Some((_, rest)) => format!("{rest}::{test}"),
        None => test.to_string(),
    };
    if std::env::var(INNER_ENV).is_ok_and(|v| v == name) {
        return true;
    }
    require_root(&name);
    require_program("unshare", "util-linux");
    let exe = std::env::current_exe().expect("current test executable");
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private"])
        .arg(&exe)
        .args(["--exact", &name, "--nocapture", "--test-threads=1"])
        .env(INNER_ENV, &name)
        .output()
        .expect("run unshare");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    print!("{stdout}");
    eprint!("{stderr}");
    assert!(
        out.status.success(),
        "{name} failed inside the mount namespace ({})",
        out.status
    );
    // A filter that matched nothing also exits 0: make sure the body really ran.
    assert!(
        stdout.contains("test result: ok. 1 passed"),
        "{name}: the inner run did not run exactly this test"
    );
    false
}

/// Runs `cmd` and fails the test with its output unless it succeeds.
pub fn sh(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `mount -t tmpfs tmpfs <dir>`, creating the directory.
pub fn mount_tmpfs(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    sh("mount", &["-t", "tmpfs", "tmpfs", dir.to_str().unwrap()]);
}

/// `mount --bind <src> <dir>`, creating the directory.
pub fn mount_bind(src: &Path, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    sh(
        "mount",
        &["--bind", src.to_str().unwrap(), dir.to_str().unwrap()],
    );
}

/// The mount points at or below `dir`, from the real mount table.
pub fn mounts_below(dir: &Path) -> Vec<std::path::PathBuf> {
    hostnode::mountinfo::read(None)
        .unwrap()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// A current-thread runtime for a test body that runs in a re-executed process.
pub fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(fut)
}
