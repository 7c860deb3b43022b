//! `cargo xtask`: project automation that would otherwise live in shell scripts.
//!
//! - `cargo xtask ci`: everything CI checks (format, clippy with `-D warnings`, every test).
//! - `cargo xtask bench <name>`: one benchmark (a `harness = false` bench target owned by
//!   the crate it measures); each prints its figures as ratios against a baseline measured
//!   in the same run. Figures are recorded by hand in `docs/benchmarks.md`.

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
    /// Run one benchmark; `cargo xtask bench --list` lists them.
    Bench {
        /// Benchmark name (see --list).
        name: Option<String>,
        /// List the benchmarks.
        #[arg(long)]
        list: bool,
    },
}

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
        "reconciler passes and event-to-repair latency, 5,000 nodes, against a plain LIST",
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
        "etcd",
        "ha",
        "etcd",
        "member add to healthy and a 3-member health check on real etcd, against one status call",
    ),
];

fn main() -> ExitCode {
    match run(Cli::parse()) {
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
    }
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
