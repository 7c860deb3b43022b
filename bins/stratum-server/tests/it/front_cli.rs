//! `front render/check`, `etcd downgrade` and `repoint` as a user runs them: exit codes,
//! what is printed, and what is (not) written. HAProxy and etcd 3.4 are the real ones.

use std::net::TcpListener;
use std::path::Path;

use anyhow::{Context as _, ensure};

use crate::cli::{stratum_server, text};

fn which(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .chain(["/usr/sbin"])
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.is_file())
}

fn path_str(p: &Path) -> anyhow::Result<&str> {
    p.to_str().context("non-UTF-8 temp path")
}

#[test]
fn front_render_and_check_as_a_user_runs_them() -> anyhow::Result<()> {
    which("haproxy").context("haproxy not found on PATH: apt-get install haproxy")?;
    let tmp = tempfile::tempdir()?;
    let ca = pki::Ca::generate("cluster-ca")?;
    let ca_file = tmp.path().join("ca.crt");
    std::fs::write(&ca_file, ca.cert_pem())?;
    let ca_arg = path_str(&ca_file)?;

    let out = stratum_server(&[
        "front",
        "render",
        "--servers",
        "10.0.0.2:6443,10.0.0.1",
        "--ca-file",
        ca_arg,
    ])?;
    ensure!(out.status.success(), "render failed: {}", text(&out.stderr));
    let cfg = text(&out.stdout);
    for want in [
        "balance leastconn",
        "server apiserver-10.0.0.1 10.0.0.1:6443",
        "server apiserver-10.0.0.2 10.0.0.2:6443",
        "timeout tunnel 4h",
        &format!("ca-file {ca_arg}"),
    ] {
        ensure!(cfg.contains(want), "missing {want:?} in\n{cfg}");
    }

    let file = tmp.path().join("haproxy.cfg");
    let out = stratum_server(&[
        "front",
        "render",
        "--servers",
        "10.0.0.1",
        "--ca-file",
        ca_arg,
        "--out",
        path_str(&file)?,
    ])?;
    ensure!(
        out.status.success(),
        "render --out failed: {}",
        text(&out.stderr)
    );
    ensure!(out.stdout.is_empty(), "render --out printed the config too");
    ensure!(std::fs::read_to_string(&file)?.contains("10.0.0.1:6443"));

    // A hostile server: refused with exit 2, nothing printed, nothing written.
    let before = std::fs::read(&file)?;
    let out = stratum_server(&[
        "front",
        "render",
        "--servers",
        "10.0.0.1:6443\n    server evil 6.6.6.6:1",
        "--ca-file",
        ca_arg,
        "--out",
        path_str(&file)?,
    ])?;
    ensure!(
        out.status.code() == Some(2),
        "hostile server: {:?}",
        out.status
    );
    ensure!(
        text(&out.stderr).contains("neither an IP address nor a DNS name"),
        "{}",
        text(&out.stderr)
    );
    ensure!(
        std::fs::read(&file)? == before,
        "a refused render changed the file"
    );

    let out = stratum_server(&[
        "front",
        "check",
        "--servers",
        "10.0.0.1,10.0.0.2",
        "--ca-file",
        ca_arg,
    ])?;
    ensure!(out.status.success(), "check failed: {}", text(&out.stderr));
    ensure!(text(&out.stdout).contains("valid"), "{}", text(&out.stdout));

    // HAProxy refuses a configuration whose CA file does not exist: exit 3, its alert shown.
    let out = stratum_server(&[
        "front",
        "check",
        "--servers",
        "10.0.0.1",
        "--ca-file",
        "/nonexistent/ca.crt",
    ])?;
    ensure!(out.status.code() == Some(3), "missing CA: {:?}", out.status);
    ensure!(
        text(&out.stderr).contains("/nonexistent/ca.crt"),
        "{}",
        text(&out.stderr)
    );

    // No servers and no way to find the member list: bad usage.
    let out = stratum_server(&["front", "render"])?;
    ensure!(out.status.code() == Some(2), "{:?}", out.status);
    ensure!(
        text(&out.stderr).contains("--endpoints"),
        "{}",
        text(&out.stderr)
    );
    Ok(())
}

#[test]
fn etcd_downgrade_on_3_4_is_refused_and_the_front_follows_its_members() -> anyhow::Result<()> {
    let etcd = which("etcd").context("etcd not found on PATH: apt-get install etcd-server")?;
    let tmp = tempfile::tempdir()?;
    let ip = "127.0.0.46";
    let (_member, client_url) = crate::cli::plain_member(&etcd, ip, tmp.path())?;

    let out = stratum_server(&[
        "etcd",
        "downgrade",
        "--to",
        "3.5.0",
        "--endpoints",
        &client_url,
    ])?;
    ensure!(
        out.status.code() == Some(3),
        "downgrade on 3.4: {:?} {}",
        out.status,
        text(&out.stderr)
    );
    let err = text(&out.stderr);
    ensure!(
        err.contains("etcd cluster version 3.4 cannot be downgraded")
            && err.contains("etcd 3.5 or later"),
        "{err}"
    );
    ensure!(
        text(&out.stdout).contains("etcd 3.4."),
        "{}",
        text(&out.stdout)
    );
    ensure!(
        !text(&out.stdout).contains("downgrade enabled"),
        "{}",
        text(&out.stdout)
    );

    let out = stratum_server(&[
        "etcd",
        "downgrade",
        "--to",
        "three",
        "--endpoints",
        &client_url,
    ])?;
    ensure!(out.status.code() == Some(2), "bad --to: {:?}", out.status);

    // The front's default servers are the members' hosts.
    let out = stratum_server(&[
        "front",
        "render",
        "--endpoints",
        &client_url,
        "--ca-file",
        "/etc/ca.crt",
    ])?;
    ensure!(out.status.success(), "{}", text(&out.stderr));
    ensure!(
        text(&out.stdout).contains(&format!("server apiserver-{ip} {ip}:6443")),
        "{}",
        text(&out.stdout)
    );
    Ok(())
}

#[test]
fn repoint_to_a_vip_nothing_serves_changes_nothing() -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let pki_dir = tmp.path().join("pki");
    let out = stratum_server(&[
        "certs",
        "generate",
        "--pki-dir",
        path_str(&pki_dir)?,
        "--node-name",
        "cp1",
        "--node-ip",
        "127.0.0.47",
    ])?;
    ensure!(
        out.status.success(),
        "certs generate: {}",
        text(&out.stderr)
    );
    let admin = std::fs::read(tmp.path().join("admin.conf"))?;
    let closed = TcpListener::bind(("127.0.0.48", 0))?
        .local_addr()?
        .port()
        .to_string();
    let out = stratum_server(&[
        "repoint",
        "--vip",
        "127.0.0.48",
        "--port",
        &closed,
        "--pki-dir",
        path_str(&pki_dir)?,
        "--no-restart",
    ])?;
    ensure!(
        out.status.code() == Some(3),
        "{:?} {}",
        out.status,
        text(&out.stderr)
    );
    let err = text(&out.stderr);
    ensure!(
        err.contains("nothing answers there") && err.contains("nothing was changed"),
        "{err}"
    );
    ensure!(
        std::fs::read(tmp.path().join("admin.conf"))? == admin,
        "admin.conf changed"
    );
    Ok(())
}
