//! `stratum-server etcd downgrade --to 3.4` as a user runs it against real etcd 3.5.16
//! (installed by `.ci/run` into /opt/etcd-3.5, or `$ETCD35_BIN`): what it prints, that it
//! enables nothing, and its exit code and error when the wait (`--timeout`) runs out.
//! The restarts themselves are in crates/ha/tests/it/downgrade.rs.

use std::path::PathBuf;

use anyhow::ensure;

use crate::cli::{stratum_server, text};

fn etcd35() -> anyhow::Result<PathBuf> {
    let p = std::env::var_os("ETCD35_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/etcd-3.5/usr/bin/etcd"));
    let version = std::process::Command::new(&p)
        .arg("--version")
        .output()
        .map(|o| text(&o.stdout))
        .unwrap_or_default();
    ensure!(
        version.contains("etcd Version: 3.5."),
        "etcd 3.5 not found at {}: run the etcd 3.5 step of .ci/run (Debian trixie's \
         etcd-server unpacked into /opt/etcd-3.5), or set $ETCD35_BIN",
        p.display()
    );
    Ok(p)
}

#[test]
fn etcd_downgrade_on_3_5_prints_the_restart_procedure_and_exits_3_at_its_timeout()
-> anyhow::Result<()> {
    let etcd = etcd35()?;
    let tmp = tempfile::tempdir()?;
    let ip = "127.0.0.47";
    let (_member, client_url) = crate::cli::plain_member(&etcd, ip, tmp.path())?;

    let out = stratum_server(&[
        "etcd",
        "downgrade",
        "--to",
        "3.4",
        "--endpoints",
        &client_url,
        "--timeout",
        "3s",
    ])?;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    ensure!(
        out.status.code() == Some(3),
        "{:?}\n{stdout}\n{stderr}",
        out.status
    );
    ensure!(
        stdout.contains("etcd 3.5.16")
            && stdout.contains("nothing is asked of etcd")
            && stdout.contains("waiting up to 3s")
            && !stdout.contains("enabled"),
        "{stdout}"
    );
    ensure!(
        stderr.contains("after 3s these members do not run etcd 3.4 yet: m1")
            && stderr.contains("3.4.32 or later")
            && stderr.contains("--next-cluster-version-compatible"),
        "{stderr}"
    );
    // The member is as it was: healthy, still on 3.5.
    let out = stratum_server(&["etcd", "health", "--endpoints", &client_url])?;
    ensure!(out.status.success(), "{}", text(&out.stderr));
    Ok(())
}
