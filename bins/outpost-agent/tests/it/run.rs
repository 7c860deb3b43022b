//! `outpost-agent run` as a process: SIGTERM ends it within 5 s and stops the tunnel it
//! started.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "../../../../crates/agent/tests/it/sshd.rs"]
mod sshd;

const BIN: &str = env!("CARGO_BIN_EXE_outpost-agent");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn status(admin: SocketAddr) -> Option<serde_json::Value> {
    let mut s = tokio::net::TcpStream::connect(admin).await.ok()?;
    s.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    serde_json::from_str(text.split_once("\r\n\r\n")?.1).ok()
}

#[tokio::test]
async fn sigterm_ends_the_agent_within_5s_and_stops_its_tunnel() {
    testkube::fixtures::install_crypto();
    let sshd = sshd::Sshd::start().await;
    let server = testkube::ApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let probe = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let config = dir.path().join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "nodeName: sigterm-1\nkubeconfig: {kc}\nhealth: {{listen: '{probe}'}}\n\
             admin: {{listen: '{admin}'}}\ndataPlane: {{check: tunnel}}\n{tunnel}",
            kc = server.kubeconfig_path().display(),
            tunnel = sshd.tunnel_yaml(Ipv4Addr::new(127, 45, 1, 1), "1s"),
        ),
    )
    .unwrap();
    let mut child = tokio::process::Command::new(BIN)
        .args(["--log-level", "info", "run", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let ssh_pid = loop {
        if let Some(st) = status(admin).await
            && st["tunnel"]["running"] == true
            && let Some(pid) = st["tunnel"]["pid"].as_u64()
        {
            break i32::try_from(pid).unwrap();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the agent's tunnel never ran"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(kill(Pid::from_raw(ssh_pid), None).is_ok());
    // What runs is exactly what `tunnel-config --config` prints for the same file.
    let st = status(admin).await.unwrap();
    let printed = std::process::Command::new(BIN)
        .args(["tunnel-config", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        printed.status.success(),
        "{}",
        String::from_utf8_lossy(&printed.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&printed.stdout).trim_end(),
        st["tunnel"]["command"].as_str().unwrap()
    );

    let sent = tokio::time::Instant::now();
    kill(Pid::from_raw(child.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .expect("the agent exits within 5 s of SIGTERM")
        .unwrap();
    assert!(exit.success(), "{exit}");
    assert!(sent.elapsed() < Duration::from_secs(5));
    assert!(
        kill(Pid::from_raw(ssh_pid), None).is_err(),
        "the tunnel (pid {ssh_pid}) outlived the agent"
    );
}

/// With its stderr gone (a closed pipe, as `run ... 2>&1 | head -1` leaves it), the agent
/// still stops on SIGTERM: a failed log write must not take the signal handling with it.
#[tokio::test]
async fn sigterm_ends_the_agent_whose_stderr_was_closed() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.yaml");
    // A kubeconfig that does not exist yet: the agent logs that it waits, and keeps going.
    std::fs::write(
        &config,
        format!(
            "nodeName: closed-stderr\nkubeconfig: {}\nhealth: {{listen: '127.0.0.1:{}'}}\n\
             admin: {{listen: '127.0.0.1:{}'}}\n",
            dir.path().join("absent.conf").display(),
            free_port(),
            free_port()
        ),
    )
    .unwrap();
    let mut child = tokio::process::Command::new(BIN)
        .args(["--log-level", "info", "run", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("waiting for the kubeconfig") {
                return;
            }
        }
        panic!("the agent's stderr ended before it said it waits for its kubeconfig");
    })
    .await
    .expect("the agent logs that it waits for its kubeconfig");
    drop(lines);
    kill(Pid::from_raw(child.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .expect("the agent exits within 5 s of SIGTERM with its stderr closed")
        .unwrap();
    assert!(exit.success(), "{exit}");
}
