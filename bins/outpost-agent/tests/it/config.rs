//! One agent.yaml for every command: each `outpost-agent` command that takes `--config`
//! accepts `docs/examples/agent.yaml` (it may fail later for other reasons: no API
//! server, no systemd, but never on the configuration).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_outpost-agent");

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/examples/agent.yaml")
}

/// The error, when the command refused the configuration itself.
fn refused_config(out: &Output) -> Option<String> {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let named = format!("agent configuration {}", example().display());
    (err.contains(&named) || err.contains("unknown field") || err.contains("is not valid"))
        .then_some(err)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn every_command_that_takes_config_accepts_the_example() {
    let example = example();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();

    // health: serves (the flag moves it off the example's port), stops on SIGTERM.
    let listen = format!("127.0.0.1:{}", free_port());
    let mut health = Command::new(BIN)
        .args(["health", "--listen", &listen, "--config"])
        .arg(&example)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::net::TcpStream::connect(&listen).is_err() {
        if let Ok(Some(status)) = health.try_wait() {
            panic!("health exited ({status}) with the example configuration");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "health never listened"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(health.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(health.wait().unwrap().success());

    // run: the configuration loads; the example's kubeconfig does not exist here, so it
    // serves not-ready probes while it waits for one, until SIGTERM.
    let mut run = Command::new(BIN)
        .args(["--log-level", "info", "run", "--config"])
        .arg(&example)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Drain stderr to the end: a closed pipe would fail the agent's log writes.
    let stderr = run.stderr.take().unwrap();
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let log = log.clone();
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let mut l = log.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let text = log.lock().unwrap().clone();
        if text.contains("waiting for the kubeconfig") || reader.is_finished() {
            break;
        }
        if std::time::Instant::now() > deadline {
            let _ = run.kill();
            panic!("run neither waited for the kubeconfig nor exited: {text}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    if run.try_wait().unwrap().is_none() {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(run.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
    }
    let status = run.wait().unwrap();
    reader.join().unwrap();
    let log = log.lock().unwrap().clone();
    assert!(
        !log.contains("is not valid") && !log.contains("unknown field"),
        "{log}"
    );
    // The example's ports may be taken on a busy machine; anything else is a waiting agent.
    assert!(
        log.contains("waiting for the kubeconfig") || log.contains("already in use"),
        "{log}"
    );
    if log.contains("waiting for the kubeconfig") {
        assert!(status.success(), "{status}: {log}");
    }

    // join: the template is accepted; discovery then finds no server.
    let out = Command::new(BIN)
        .args(["join", "--server", &format!("127.0.0.1:{}", free_port())])
        .args([
            "--discovery-token-ca-cert-hash",
            &format!("sha256:{}", "a".repeat(64)),
        ])
        .args(["--discovery-timeout", "1s", "--no-start", "--config"])
        .arg(&example)
        .arg("--host-root")
        .arg(&root)
        .env("OUTPOST_JOIN_TOKEN", "abcdef.0123456789abcdef")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(refused_config(&out).is_none(), "{err}");
    assert!(
        err.contains("cannot read kube-public/cluster-info"),
        "{err}"
    );
    assert!(!err.contains("0123456789abcdef"), "{err}");

    // tunnel-config: prints the ssh command `run` would start (binding the first
    // candidate: the example's kubeconfig does not exist here).
    let out = Command::new(BIN)
        .args(["tunnel-config", "--config"])
        .arg(&example)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.starts_with("ssh -N ") && printed.contains(" -R 127."),
        "{printed}"
    );
    assert!(
        printed.contains("-i /etc/outpost-agent/tunnel_ed25519"),
        "{printed}"
    );

    // node ...: in a private network namespace (LocalDNS runs `ip`), under --host-root,
    // with a systemctl that fails: each gets past the configuration.
    for cmd in ["status", "up", "down", "reset", "upgrade"] {
        let out = Command::new("unshare")
            .args(["--net", "--mount", "--"])
            .arg(BIN)
            .args(["node", cmd, "--config"])
            .arg(&example)
            .arg("--host-root")
            .arg(&root)
            .args(["--command-timeout-seconds", "5"])
            .env("OUTPOST_SYSTEMCTL", "/bin/false")
            .output()
            .expect("unshare runs (apt-get install util-linux)");
        assert!(
            refused_config(&out).is_none(),
            "node {cmd}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
