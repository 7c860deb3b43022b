//! What the CLI tests share: running the binary, and a plain-HTTP single etcd member.

use std::net::TcpListener;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use anyhow::{Context as _, bail};

/// Runs stratum-server with `args`, without the caller's KUBECONFIG or etcd endpoints.
pub(crate) fn stratum_server(args: &[&str]) -> anyhow::Result<Output> {
    std::process::Command::new(env!("CARGO_BIN_EXE_stratum-server"))
        .args(args)
        .env_remove("KUBECONFIG")
        .env_remove("STRATUM_ETCD_ENDPOINTS")
        .output()
        .context("cannot run stratum-server")
}

pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Kills the member when the test ends, passed or not.
pub(crate) struct Member(pub(crate) std::process::Child);

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `etcd` as a one-member plain-HTTP cluster `m1` on `ip`, data and log under
/// `dir`, and waits (30 s) until `stratum-server etcd members` reads it. Returns the member
/// and its client URL.
pub(crate) fn plain_member(etcd: &Path, ip: &str, dir: &Path) -> anyhow::Result<(Member, String)> {
    let free = || -> anyhow::Result<u16> { Ok(TcpListener::bind((ip, 0))?.local_addr()?.port()) };
    let (client, peer) = (free()?, free()?);
    let client_url = format!("http://{ip}:{client}");
    let peer_url = format!("http://{ip}:{peer}");
    let log = std::fs::File::create(dir.join("etcd.log"))?;
    let member = Member(
        std::process::Command::new(etcd)
            .args(["--name", "m1", "--data-dir"])
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("m1={peer_url}")])
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?,
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let out = stratum_server(&["etcd", "members", "--endpoints", &client_url])?;
        if out.status.success() {
            return Ok((member, client_url));
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "etcd {} did not answer: {}",
                etcd.display(),
                text(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
