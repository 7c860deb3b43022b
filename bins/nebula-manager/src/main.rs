//! `nebula-manager`: the in-cluster manager. It runs one virtual kubelet per provider
//! (`vnode`), the shared kubelet API server that serves their pods' logs and exec, and
//! placement.
//!
//! Operations: `docs/nebula-manager.md`. Not built yet: no open issue covers `vnode`.

use std::process::ExitCode;

use clap::Parser;

/// The in-cluster manager.
#[derive(Debug, Parser)]
#[command(name = "nebula-manager", version, about, long_about = None)]
struct Cli {
    #[command(flatten)]
    log: cmdline::LogArgs,
}

fn main() -> ExitCode {
    cmdline::install_crypto_provider();
    let cli = Cli::parse();
    cli.log.init();
    eprintln!("error: nebula-manager has no providers yet: the vnode crate is not built");
    ExitCode::from(2)
}
