//! `cargo xtask bench hostnode`: how fast the unmount path is.
//!
//! 1. Parse a 100,000-line mount table and plan the unmount order below a prefix,
//!    against a baseline measured in the same run: reading the same file and splitting
//!    it into lines and fields, which any parser must do at least.
//! 2. Remove a 20,000-file kubelet-like tree with `remove::remove_contents` (the walk by
//!    file descriptor: statx, openat2, unlinkat per entry), against
//!    `std::fs::remove_dir_all` on an identical tree in the same run.
//! 3. Unmount 1,000 tmpfs mounts in a private mount namespace (needs root), with the
//!    syscall mounter and with `umount -l` through the Runner, against the time it took
//!    to mount them.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use hostnode::mountinfo::{self, Scope};
use hostnode::runner::HostRunner;
use hostnode::unmount::{Mounter, RunnerMounter, SyscallMounter, unmount_below};

const LINES: usize = 100_000;
const MOUNTS: usize = 1_000;
const ROUNDS: usize = 7;
const INNER_ENV: &str = "HOSTNODE_BENCH_INNER";

fn main() -> ExitCode {
    if std::env::var_os(INNER_ENV).is_some() {
        return unmount_bench();
    }
    parse_bench();
    remove_bench();
    // The namespace part re-executes this binary under unshare: a mount namespace cannot
    // be entered by one thread of a multithreaded process, and this keeps the mounts
    // away from the host.
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("unmount benchmark needs root (it mounts tmpfs in a private mount namespace)");
        return ExitCode::FAILURE;
    }
    let status = Command::new("unshare")
        .args(["-m", "--propagation", "private"])
        .arg(std::env::current_exe().expect("current executable"))
        .env(INNER_ENV, "1")
        .status();
    match status {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(s) => {
            eprintln!("unmount benchmark failed: {s}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("cannot run unshare ({e}): apt-get install util-linux");
            ExitCode::FAILURE
        }
    }
}

/// A mountinfo text like a busy node's: most mounts are pod volumes below the kubelet
/// directory (some with escaped spaces), the rest container rootfs and system mounts.
fn synthetic_table() -> String {
    let mut text = String::with_capacity(LINES * 150);
    text.push_str("1 0 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n");
    text.push_str("2 1 0:20 / /var/lib/kubelet rw,relatime shared:2 - ext4 /dev/sda2 rw\n");
    for i in 3..=LINES {
        let pod = i / 4;
        let line = match i % 5 {
            0 | 1 => format!(
                "{i} 2 0:{} / /var/lib/kubelet/pods/{pod:08x}-uid/volumes/kubernetes.io~secret/token-{i} rw,relatime shared:{i} - tmpfs tmpfs rw,size=65536k\n",
                i % 4096
            ),
            2 => format!(
                "{i} 2 8:2 /data/pv{i} /var/lib/kubelet/pods/{pod:08x}-uid/volumes/kubernetes.io~local-volume/my\\040volume\\040{i} rw master:3 - ext4 /dev/sda2 rw\n"
            ),
            3 => format!(
                "{i} 1 0:{} / /run/containerd/io.containerd.runtime.v2.task/k8s.io/{i:016x}/rootfs rw,relatime - overlay overlay rw,lowerdir=/l{i},upperdir=/u{i}\n",
                i % 4096
            ),
            _ => format!(
                "{i} 1 0:{} / /var/lib/kubelet-plugins/{i} rw - tmpfs tmpfs rw\n",
                i % 4096
            ),
        };
        text.push_str(&line);
    }
    text
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn per_sec(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn parse_bench() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("mountinfo");
    std::fs::write(&path, synthetic_table()).expect("write table");
    let prefix = [PathBuf::from("/var/lib/kubelet")];

    let mut baseline = Vec::new();
    let mut parsed = Vec::new();
    let mut plan_only = Vec::new();
    let mut planned_len = 0;
    for _ in 0..ROUNDS {
        let start = Instant::now();
        let bytes = std::fs::read(&path).expect("read");
        let fields: usize = bytes
            .split(|b| *b == b'\n')
            .map(|line| line.split(|b| *b == b' ').count())
            .sum();
        std::hint::black_box(fields);
        baseline.push(start.elapsed());

        let start = Instant::now();
        let table = mountinfo::read(Some(&path)).expect("parse");
        let parse_done = Instant::now();
        let plan = mountinfo::plan(&table, &prefix, Scope::AtOrBelow);
        parsed.push(start.elapsed());
        plan_only.push(parse_done.elapsed());
        planned_len = std::hint::black_box(plan).len();
    }
    let (b, p, po) = (median(baseline), median(parsed), median(plan_only));
    println!(
        "mount table: {LINES} lines, {planned_len} mounts planned below /var/lib/kubelet (median of {ROUNDS})"
    );
    println!(
        "  baseline read + split lines/fields : {:>8.2} ms  {:>12.0} lines/s",
        b.as_secs_f64() * 1e3,
        per_sec(LINES, b)
    );
    println!(
        "  parse + decode + plan (deepest 1st): {:>8.2} ms  {:>12.0} lines/s",
        p.as_secs_f64() * 1e3,
        per_sec(LINES, p)
    );
    println!(
        "    of which plan (match + sort)      : {:>8.2} ms",
        po.as_secs_f64() * 1e3
    );
    println!(
        "  ratio parse+plan / baseline        : {:>8.2}x",
        p.as_secs_f64() / b.as_secs_f64()
    );
}

const TREE_DIRS: usize = 200;
const TREE_FILES: usize = 100;

/// 200 pod-like directories of 100 files each, two levels deep.
fn build_tree(base: &Path) {
    for d in 0..TREE_DIRS {
        let dir = base.join(format!("pods/p{d:03}/volumes/kubernetes.io~empty-dir/v"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        for f in 0..TREE_FILES {
            std::fs::write(dir.join(format!("f{f}")), b"x").expect("write");
        }
    }
}

fn remove_bench() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = TREE_DIRS * TREE_FILES;
    let mut baseline = Vec::new();
    let mut walk = Vec::new();
    for round in 0..ROUNDS {
        // Alternate which goes first so neither always runs on the warmer side.
        for first in [round % 2 == 0, round % 2 == 1] {
            let base = dir.path().join(format!("k{round}{first}"));
            build_tree(&base);
            let start = Instant::now();
            if first {
                std::fs::remove_dir_all(base.join("pods")).expect("remove_dir_all");
                baseline.push(start.elapsed());
            } else {
                let report = hostnode::remove::remove_contents(&base, &[]).expect("remove");
                walk.push(start.elapsed());
                assert!(report.kept.is_empty());
            }
        }
    }
    let (b, w) = (median(baseline), median(walk));
    println!("remove: {files} files in {TREE_DIRS} pod directories (median of {ROUNDS})");
    println!(
        "  baseline std::fs::remove_dir_all     : {:>8.2} ms  {:>12.0} files/s",
        b.as_secs_f64() * 1e3,
        per_sec(files, b)
    );
    println!(
        "  remove_contents (by descriptor)      : {:>8.2} ms  {:>12.0} files/s",
        w.as_secs_f64() * 1e3,
        per_sec(files, w)
    );
    println!(
        "  ratio walk / baseline              : {:>8.2}x",
        w.as_secs_f64() / b.as_secs_f64()
    );
}

fn mount_all(base: &Path) -> Duration {
    use nix::mount::{MsFlags, mount};
    std::fs::create_dir_all(base).expect("mkdir");
    mount(
        Some("tmpfs"),
        base,
        Some("tmpfs"),
        MsFlags::empty(),
        None::<&str>,
    )
    .expect("mount base");
    let dirs: Vec<PathBuf> = (0..MOUNTS - 1)
        .map(|i| base.join(format!("pods/p{:03}/volumes/v{i}", i % 100)))
        .collect();
    for d in &dirs {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    let start = Instant::now();
    for d in &dirs {
        mount(
            Some("tmpfs"),
            d,
            Some("tmpfs"),
            MsFlags::empty(),
            None::<&str>,
        )
        .expect("mount");
    }
    start.elapsed()
}

fn unmount_bench() -> ExitCode {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path().join("var/lib/kubelet");
    println!(
        "unmount: {MOUNTS} tmpfs mounts (1 at the prefix, {} below) in a private mount namespace",
        MOUNTS - 1
    );
    let mounters: [(&str, Box<dyn Mounter>); 2] = [
        ("umount2(MNT_DETACH) syscall", Box::new(SyscallMounter)),
        (
            "umount -l via the Runner",
            Box::new(RunnerMounter(HostRunner::new())),
        ),
    ];
    for (name, mounter) in mounters {
        let mount_time = mount_all(&base);
        let start = Instant::now();
        let result = rt.block_on(unmount_below(&*mounter, None, std::slice::from_ref(&base)));
        let took = start.elapsed();
        if let Err(e) = result {
            eprintln!("unmount failed: {}", hostnode::error_chain(&e));
            return ExitCode::FAILURE;
        }
        let left = mountinfo::read(None)
            .expect("mount table")
            .iter()
            .filter(|m| m.mount_point.starts_with(&base))
            .count();
        if left != 0 {
            eprintln!("{left} mounts left below {}", base.display());
            return ExitCode::FAILURE;
        }
        println!(
            "  {name:<28}: {:>8.1} ms  {:>9.0} mounts/s   (mounting {} took {:.1} ms; ratio unmount/mount {:.2}x)",
            took.as_secs_f64() * 1e3,
            per_sec(MOUNTS, took),
            MOUNTS - 1,
            mount_time.as_secs_f64() * 1e3,
            took.as_secs_f64() / mount_time.as_secs_f64()
        );
    }
    ExitCode::SUCCESS
}
