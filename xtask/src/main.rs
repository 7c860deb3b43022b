//! `cargo xtask`: project automation that would otherwise live in shell scripts.
//!
//! - `cargo xtask ci`: everything CI checks (format, clippy with `-D warnings`, unused
//!   dependencies, every test).
//! - `cargo xtask bench <name>`: one benchmark (a `harness = false` bench target owned by
//!   the crate it measures); each prints its figures as ratios against a baseline measured
//!   in the same run. Figures are recorded by hand in `docs/benchmarks/`.
//! - `cargo xtask sandbox [--once]`: the whole system on one machine and a guided tour
//!   (docs/sandbox.md).
//! - `cargo xtask fuzz [target] [--seconds N]`: each fuzz target under fuzz/ briefly
//!   (nightly and cargo-fuzz; see docs/fuzzing.md).
//! - `cargo xtask mutants [crate]`: cargo-mutants over the pure cores (see docs/testing.md);
//!   too slow for CI, run by hand and recorded.

mod sandbox;

use std::process::{Command, ExitCode};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Project automation")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Run what CI runs: fmt --check, clippy -D warnings, the whole test suite.
    Ci,
    /// Check that the pure cores build without their I/O stack (part of `ci`).
    PureCores,
    /// Run one benchmark; `cargo xtask bench --list` lists them.
    Bench {
        /// Benchmark name (see --list).
        name: Option<String>,
        /// List the benchmarks.
        #[arg(long)]
        list: bool,
    },
    /// Run every fuzz target (or the one named) briefly; fails on the first crash.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 20)]
        seconds: u64,
        /// One target (see `cargo fuzz list` in fuzz/); all of them when omitted.
        target: Option<String>,
    },
    /// The whole system on this machine (root): API double, three controllers with real
    /// etcd, the node-address reconciler, two workers in network namespaces with ssh
    /// tunnels, nebula-manager; then a guided tour with kubectl. See docs/sandbox.md.
    Sandbox(sandbox::Args),
    /// Mutation testing of the pure cores with cargo-mutants (installed if missing).
    Mutants {
        /// One crate (see --list); every pure core when omitted.
        krate: Option<String>,
        /// List the crates and the files mutated in each.
        #[arg(long)]
        list: bool,
        /// Seconds one mutant's tests may take before it counts as a timeout.
        #[arg(long, default_value_t = 180)]
        timeout: u64,
    },
}

/// The pure cores mutation testing covers: (crate, files, test scope). Each file holds
/// decisions that the crate's own tests must guard; a missed mutant there is a missing
/// test. The scope narrows the tests run per mutant (passed to nextest) where the whole
/// suite starts real etcd clusters or servers and would take hours per crate; the cores'
/// guards are the unit tests beside them.
const MUTANT_CORES: &[(&str, &[&str], &[&str])] = &[
    (
        "nodeaddr",
        &[
            "crates/nodeaddr/src/derive.rs",
            "crates/nodeaddr/src/plan.rs",
            "crates/nodeaddr/src/routing.rs",
        ],
        &[],
    ),
    (
        "hacore",
        &[
            "crates/hacore/src/grants/envelope.rs",
            "crates/hacore/src/grants/plan.rs",
            "crates/hacore/src/etcd/rules.rs",
            "crates/hacore/src/etcd/downgrade.rs",
            "crates/hacore/src/front.rs",
            "crates/hacore/src/repoint.rs",
            "crates/hacore/src/fence.rs",
            "crates/hacore/src/rejoin.rs",
        ],
        &[],
    ),
    ("hostnode", &["crates/hostnode/src/mountinfo.rs"], &[]),
    ("health", &["crates/health/src/readiness.rs"], &[]),
    (
        "testkube",
        &[
            "crates/testkube/src/strategy.rs",
            "crates/testkube/src/patch.rs",
            "crates/testkube/src/admission.rs",
        ],
        &["--lib"],
    ),
];

/// Every benchmark: (name, package, bench target, what it measures).
const BENCHES: &[(&str, &str, &str, &str)] = &[
    (
        "health",
        "health",
        "health",
        "probe listener requests/s and p99 against a bare hyper server",
    ),
    (
        "grants",
        "ha",
        "grants",
        "seal and open a full shared-cert bundle against copy and plain serialization",
    ),
    (
        "nodeaddr",
        "nodeaddr",
        "nodeaddr",
        "reconciler passes (once and from the watch store), event-to-write p50/p99, LISTs in a steady run, RSS per node; 5,000 nodes, against a plain LIST",
    ),
    (
        "hostnode",
        "hostnode",
        "hostnode",
        "parse + plan a 100,000-line mount table against read/split; unmount 1,000 mounts in a namespace",
    ),
    (
        "testkube",
        "testkube",
        "testkube",
        "API double list/watch of 5,000 nodes over HTTPS against in-process serde_json",
    ),
    (
        "kubelet-proxy",
        "testkube",
        "kubelet_proxy",
        "exec stream MiB/s and RTT through the kubelet proxy against straight to the stub kubelet",
    ),
    (
        "kubelet",
        "vnode",
        "kubelet",
        "exec stdout MiB/s through the virtual nodes' kubelet API against a loopback TCP copy; 100 concurrent execs; logs -f latency",
    ),
    (
        "vnode",
        "vnode",
        "vnode",
        "1,000 and 10,000 pods to Running against the API double's write throughput; steady-state writes; RSS per pod",
    ),
    (
        "etcd",
        "ha",
        "etcd",
        "member add to healthy and a 3-member health check on real etcd, against one status call",
    ),
    (
        "join",
        "ha",
        "join",
        "control-plane join to a healthy voter against etcd's own learner floor; 3 concurrent vs 3 sequential joins",
    ),
];

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The sandbox chooses its own exit code (the tour's verdict).
    if let Task::Sandbox(args) = cli.command {
        return sandbox::run(args).unwrap_or_else(|err| {
            eprintln!("xtask sandbox: {err:#}");
            ExitCode::FAILURE
        });
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Task::Ci => ci(),
        Task::PureCores => pure_cores(),
        Task::Sandbox(_) => unreachable!("handled in main"),
        Task::Bench { list: true, .. } | Task::Bench { name: None, .. } => {
            for (name, _, _, what) in BENCHES {
                println!("{name:<12} {what}");
            }
            Ok(())
        }
        Task::Bench {
            name: Some(name), ..
        } => {
            let Some((_, package, target, _)) = BENCHES.iter().find(|b| b.0 == name) else {
                bail!("no benchmark named {name:?}; `cargo xtask bench --list` lists them");
            };
            cargo(&["bench", "-p", package, "--bench", target])
        }
        Task::Fuzz { seconds, target } => fuzz(seconds, target),
        Task::Mutants { list: true, .. } => {
            for (krate, files, scope) in MUTANT_CORES {
                println!("{krate:<10} {} {}", files.join(" "), scope.join(" "));
            }
            Ok(())
        }
        Task::Mutants { krate, timeout, .. } => mutants(krate.as_deref(), timeout),
    }
}

/// Runs cargo-mutants over the pure cores (or one crate's), testing each mutant with the
/// mutated crate's own tests under nextest. Two jobs: the machines have two cores.
fn mutants(only: Option<&str>, timeout: u64) -> anyhow::Result<()> {
    let cores: Vec<_> = MUTANT_CORES
        .iter()
        .filter(|(krate, _, _)| only.is_none_or(|o| o == *krate))
        .collect();
    if cores.is_empty() {
        bail!("no pure core named {only:?}; `cargo xtask mutants --list` lists them");
    }
    let installed = Command::new("cargo")
        .args(["mutants", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        eprintln!("xtask: installing cargo-mutants (cargo install cargo-mutants --locked)");
        cargo(&["install", "cargo-mutants", "--locked"])?;
    }
    let timeout = timeout.to_string();
    let mut failed = Vec::new();
    for (krate, files, scope) in cores {
        let out_dir = format!("target/mutants/{krate}");
        // cargo-mutants wants the output directory's parent to exist.
        std::fs::create_dir_all(&out_dir).with_context(|| format!("cannot create {out_dir}"))?;
        let mut args = vec![
            "mutants",
            "--package",
            krate,
            "--test-tool",
            "nextest",
            "--jobs",
            "2",
            "--timeout",
            &timeout,
            "--output",
            &out_dir,
        ];
        for file in *files {
            args.extend(["--file", file]);
        }
        if !scope.is_empty() {
            args.push("--");
            args.extend(scope.iter().copied());
        }
        eprintln!("xtask: mutants in {krate}: {}", files.join(", "));
        eprintln!("xtask: cargo {}", args.join(" "));
        // Each job builds in its own copy of the tree; a CARGO_TARGET_DIR shared by the
        // jobs would let one job's test binary run another job's mutant.
        let status = Command::new(env!("CARGO"))
            .args(&args)
            .env_remove("CARGO_TARGET_DIR")
            .status()
            .context("cannot run cargo mutants")?;
        // cargo-mutants exits 2 when a mutant was missed: report it and go on.
        if !status.success() {
            failed.push(*krate);
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        bail!(
            "missed or unviable mutants in {}: see target/mutants/<crate>/mutants.out/missed.txt",
            failed.join(", ")
        )
    }
}

/// Runs `cargo +nightly fuzz run` per target from fuzz/ (its own workspace). Goes through
/// the rustup `cargo` proxy, not `$CARGO`, because only the proxy understands `+nightly`.
fn fuzz(seconds: u64, only: Option<String>) -> anyhow::Result<()> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let rustup_cargo = |args: &[&str]| {
        let mut cmd = Command::new("cargo");
        // Set by the outer `cargo run`; they would pin the inner cargo to the stable
        // toolchain whatever `+nightly` says.
        cmd.args(args)
            .current_dir(&dir)
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("RUSTC");
        cmd
    };
    let works = |args: &[&str]| {
        rustup_cargo(args)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if !works(&["+nightly", "--version"]) {
        bail!(
            "the nightly toolchain is missing: install it with `rustup toolchain install nightly`"
        );
    }
    if !works(&["fuzz", "--version"]) {
        bail!("cargo-fuzz is missing: install it with `cargo install cargo-fuzz`");
    }
    let listed = rustup_cargo(&["fuzz", "list"])
        .output()
        .context("cannot run cargo fuzz list")?;
    if !listed.status.success() {
        bail!(
            "cargo fuzz list failed in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&listed.stderr)
        );
    }
    let all: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    let targets = match only {
        Some(name) if all.contains(&name) => vec![name],
        Some(name) => bail!(
            "no fuzz target named {name:?}; the targets: {}",
            all.join(", ")
        ),
        None => all,
    };
    let max_time = format!("-max_total_time={seconds}");
    for target in &targets {
        // New inputs go to a scratch corpus under fuzz/target (ignored by git); the
        // committed seeds in fuzz/corpus/<target> are only read.
        let scratch = format!("target/corpus/{target}");
        std::fs::create_dir_all(dir.join(&scratch))
            .with_context(|| format!("cannot create fuzz/{scratch}"))?;
        let seeds = format!("corpus/{target}");
        let mut args = vec!["+nightly", "fuzz", "run", target.as_str(), scratch.as_str()];
        if dir.join(&seeds).is_dir() {
            args.push(seeds.as_str());
        }
        args.extend(["--", max_time.as_str()]);
        eprintln!("xtask: (in fuzz/) cargo {}", args.join(" "));
        let status = rustup_cargo(&args)
            .status()
            .with_context(|| format!("cannot run cargo fuzz for {target}"))?;
        if !status.success() {
            bail!(
                "fuzz target {target} failed ({status}): a crash input is under \
                 fuzz/artifacts/{target}/; reproduce it with `cargo +nightly fuzz run {target} \
                 <artifact>` (see docs/fuzzing.md)"
            );
        }
    }
    eprintln!(
        "xtask: {} fuzz target(s) ran {seconds}s each without a crash",
        targets.len()
    );
    Ok(())
}

fn ci() -> anyhow::Result<()> {
    cargo(&["fmt", "--all", "--check"]).context("formatting differs: run `cargo fmt --all`")?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--locked",
        "--",
        "-D",
        "warnings",
    ])?;
    unused_dependencies()?;
    pure_cores()?;
    // nextest does not run doctests; run them first so the run closes on nextest's summary.
    cargo(&["test", "--workspace", "--locked", "--doc"])?;
    // The end-to-end tests run the binaries; they never build them (see tests/lib.rs).
    cargo(&["build", "--workspace", "--bins", "--locked"])?;
    let nextest = Command::new("cargo")
        .args(["nextest", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !nextest {
        bail!("cargo-nextest is missing: install it with `cargo install cargo-nextest --locked`");
    }
    cargo(&[
        "nextest",
        "run",
        "--workspace",
        "--locked",
        "--profile",
        "ci",
        "--no-fail-fast",
    ])
}

/// Fails on a dependency no crate uses (cargo-machete: a dependency whose crate name never
/// appears in the crate's sources), so an unused one cannot creep back into a build.
fn unused_dependencies() -> anyhow::Result<()> {
    // Run directly, not as `cargo machete`: under `cargo run` (this process's parent),
    // cargo-machete takes the `machete` argument cargo passes for a path and fails.
    let installed = Command::new("cargo-machete")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        bail!(
            "cargo-machete is missing: install it with `cargo install cargo-machete --locked` \
             (.ci/run does)"
        );
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    eprintln!("xtask: cargo-machete {}", root.display());
    let status = Command::new("cargo-machete")
        .arg(&root)
        .status()
        .context("cannot run cargo-machete")?;
    if !status.success() {
        bail!(
            "unused dependencies: remove them from the Cargo.toml files named above, or list a \
             false positive under [package.metadata.cargo-machete] ignored"
        );
    }
    Ok(())
}

/// The pure cores: each crate, built without its default features, and what it must never
/// pull in. The fuzz targets and the pure unit tests build against these, so they need
/// neither protoc (etcd-client) nor the kube client tree.
const PURE_CORES: &[&str] = &["common", "nodeaddr", "hostnode", "hacore"];

/// The I/O stack a pure core must not depend on, by package name.
const IO_STACK: &[&str] = &["kube", "kube-client", "etcd-client", "tokio"];

/// Fails when a pure core's normal dependency tree (default features off) holds a package
/// of the I/O stack, naming the crate, the package and the chain that brings it in
/// (`cargo tree -i`); then checks that each core's library builds that way.
fn pure_cores() -> anyhow::Result<()> {
    for krate in PURE_CORES {
        let tree = cargo_output(&[
            "tree",
            "-p",
            krate,
            "--no-default-features",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
            "--locked",
        ])?;
        for banned in IO_STACK {
            if !tree_holds(&tree, banned) {
                continue;
            }
            let chain = cargo_output(&[
                "tree",
                "-p",
                krate,
                "--no-default-features",
                "-e",
                "normal",
                "-i",
                banned,
                "--locked",
            ])
            .unwrap_or_else(|err| format!("(cargo tree -i {banned} failed: {err:#})"));
            bail!(
                "pure core {krate} depends on {banned} with its default features off; keep \
                 the I/O stack behind a feature or out of the crate. The chain:\n{chain}"
            );
        }
    }
    for krate in PURE_CORES {
        cargo(&[
            "check",
            "-p",
            krate,
            "--no-default-features",
            "--lib",
            "--locked",
        ])
        .with_context(|| {
            format!("pure core {krate} does not build without its default features")
        })?;
    }
    Ok(())
}

/// Whether a `cargo tree --prefix none --format {p}` listing holds the package `name`
/// (a line `name vX.Y.Z ...`).
fn tree_holds(tree: &str, name: &str) -> bool {
    tree.lines()
        .any(|line| line.split_whitespace().next() == Some(name))
}

/// Runs cargo and returns its standard output; a failure carries its standard error.
fn cargo_output(args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(env!("CARGO"))
        .args(args)
        .output()
        .with_context(|| format!("cannot run cargo {}", args.join(" ")))?;
    if !output.status.success() {
        bail!(
            "cargo {} failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn cargo(args: &[&str]) -> anyhow::Result<()> {
    eprintln!("xtask: cargo {}", args.join(" "));
    let status = Command::new(env!("CARGO"))
        .args(args)
        .status()
        .with_context(|| format!("cannot run cargo {}", args.join(" ")))?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_holds_matches_whole_package_names() {
        let tree = "hostnode v0.1.0 (/w/crates/hostnode)\ntokio-util v0.7.1\nkube-core v5.0.0\n";
        assert!(tree_holds(tree, "hostnode"));
        assert!(!tree_holds(tree, "tokio"), "tokio-util is not tokio");
        assert!(!tree_holds(tree, "kube"), "kube-core is not kube");
        assert!(tree_holds("tokio v1.48.0\n", "tokio"));
    }
}
