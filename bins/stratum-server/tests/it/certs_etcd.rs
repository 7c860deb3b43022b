//! The operator's path on a first control plane, as processes: `certs generate`, a real
//! etcd 3.4 member serving with the generated certificates, `etcd members` and
//! `etcd health` reaching it over mTLS with them, and `certs check` thresholds.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};

fn stratum_server(args: &[&str]) -> anyhow::Result<Output> {
    std::process::Command::new(env!("CARGO_BIN_EXE_stratum-server"))
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .context("cannot run stratum-server")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn free_port(ip: &str) -> anyhow::Result<u16> {
    Ok(TcpListener::bind((ip, 0))?.local_addr()?.port())
}

fn path_str(p: &Path) -> anyhow::Result<&str> {
    p.to_str().context("non-UTF-8 temp path")
}

/// Kills the member when the test ends, passed or not.
struct Member(std::process::Child);

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn generated_certs_serve_etcd_and_health_reports_over_mtls() -> anyhow::Result<()> {
    let etcd = which("etcd").context("etcd not found on PATH: apt-get install etcd-server")?;
    let tmp = tempfile::tempdir()?;
    let pki = tmp.path().join("pki");
    let pki_arg = path_str(&pki)?.to_string();
    let ip = "127.0.0.41";

    // certs generate, then a second run without --force refuses and writes nothing.
    let out = stratum_server(&[
        "certs",
        "generate",
        "--pki-dir",
        &pki_arg,
        "--node-name",
        "cp1",
        "--node-ip",
        ip,
        "--vip",
        "127.0.0.40",
    ])?;
    ensure!(
        out.status.success(),
        "certs generate failed: {}",
        text(&out.stderr)
    );
    let ca_key = pki.join("ca.key");
    let before = std::fs::read(&ca_key)?;
    ensure!(
        std::fs::metadata(&ca_key)?.permissions().mode() & 0o777 == 0o600,
        "ca.key is not 0600"
    );
    ensure!(
        std::fs::metadata(pki.join("ca.crt"))?.permissions().mode() & 0o777 == 0o644,
        "ca.crt is not 0644"
    );
    let again = stratum_server(&["certs", "generate", "--pki-dir", &pki_arg])?;
    ensure!(
        !again.status.success(),
        "a second generate without --force succeeded"
    );
    ensure!(
        text(&again.stderr).contains("--force"),
        "refusal does not say how to proceed: {}",
        text(&again.stderr)
    );
    ensure!(
        std::fs::read(&ca_key)? == before,
        "the refused generate changed ca.key"
    );

    // certs check: fine at 30 days, failing when asked about the leaves' one-year life.
    let ok = stratum_server(&["certs", "check", "--pki-dir", &pki_arg, "-o", "json"])?;
    ensure!(
        ok.status.success(),
        "certs check failed: {}{}",
        text(&ok.stdout),
        text(&ok.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&ok.stdout)
        .with_context(|| format!("certs check -o json is not JSON: {}", text(&ok.stdout)))?;
    ensure!(
        report.to_string().contains("apiserver.crt"),
        "certs check does not list apiserver.crt: {report}"
    );
    let near = stratum_server(&[
        "certs",
        "check",
        "--pki-dir",
        &pki_arg,
        "--warn-within",
        "400d",
    ])?;
    ensure!(
        !near.status.success(),
        "certs check passed although leaves expire within 400 days"
    );

    // A real etcd member serving with the generated server and peer certificates.
    let (client_port, peer_port) = (free_port(ip)?, free_port(ip)?);
    let client_url = format!("https://{ip}:{client_port}");
    let peer_url = format!("https://{ip}:{peer_port}");
    let f = |name: &str| -> anyhow::Result<String> { Ok(path_str(&pki.join(name))?.to_string()) };
    let log = std::fs::File::create(tmp.path().join("etcd.log"))?;
    let child = std::process::Command::new(&etcd)
        .args([
            "--name",
            "cp1",
            "--data-dir",
            path_str(&tmp.path().join("data"))?,
        ])
        .args([
            "--listen-client-urls",
            &client_url,
            "--advertise-client-urls",
            &client_url,
        ])
        .args([
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
        ])
        .args(["--initial-cluster", &format!("cp1={peer_url}")])
        .args([
            "--cert-file",
            &f("etcd/server.crt")?,
            "--key-file",
            &f("etcd/server.key")?,
        ])
        .args([
            "--trusted-ca-file",
            &f("etcd/ca.crt")?,
            "--client-cert-auth",
        ])
        .args([
            "--peer-cert-file",
            &f("etcd/peer.crt")?,
            "--peer-key-file",
            &f("etcd/peer.key")?,
        ])
        .args([
            "--peer-trusted-ca-file",
            &f("etcd/ca.crt")?,
            "--peer-client-cert-auth",
        ])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("cannot start etcd")?;
    let mut member = Member(child);
    let tls = [
        "--cacert".to_string(),
        f("etcd/ca.crt")?,
        "--cert".to_string(),
        f("etcd/healthcheck-client.crt")?,
        "--key".to_string(),
        f("etcd/healthcheck-client.key")?,
    ];
    let run = |cmd: &str, output: &str| -> anyhow::Result<Output> {
        let mut args = vec!["etcd", cmd, "--endpoints", &client_url, "-o", output];
        args.extend(tls.iter().map(String::as_str));
        stratum_server(&args)
    };

    // Wait (bounded) for the member to elect itself; health is the readiness signal.
    let mut healthy = None;
    for _ in 0..60 {
        let out = run("health", "json")?;
        if out.status.success() {
            healthy = Some(out);
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let Some(healthy) = healthy else {
        let log = std::fs::read_to_string(tmp.path().join("etcd.log")).unwrap_or_default();
        bail!("etcd health never passed over mTLS with the generated certs; etcd log:\n{log}");
    };
    ensure!(
        text(&healthy.stdout).contains(&client_url),
        "health output does not name the member: {}",
        text(&healthy.stdout)
    );

    let members = run("members", "json")?;
    ensure!(
        members.status.success(),
        "etcd members failed: {}",
        text(&members.stderr)
    );
    let listed = text(&members.stdout);
    ensure!(
        listed.contains("cp1") && listed.contains(&peer_url),
        "etcd members does not list cp1 at {peer_url}: {listed}"
    );

    // Without the client certificate the member refuses us: health fails closed.
    let bare = stratum_server(&["etcd", "health", "--endpoints", &client_url])?;
    ensure!(
        !bare.status.success(),
        "health passed against an mTLS member without TLS flags"
    );

    // The member gone: health fails and names it.
    drop(member.0.kill());
    let _ = member.0.wait();
    let down = run("health", "table")?;
    ensure!(
        !down.status.success(),
        "health passed with the only member killed"
    );
    let said = format!("{}{}", text(&down.stdout), text(&down.stderr));
    ensure!(
        said.contains(&format!("{ip}:{client_port}")),
        "health failure does not name the member: {said}"
    );
    Ok(())
}

fn which(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.is_file())
}
