//! The process provider on its own: re-finding instances after a restart, the PID-reuse
//! guard, and the optional capabilities (exec, port-forward, stats, log tail).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vnode::providers::process::ProcessProvider;
use vnode::{ExecIo, InstanceState, LogOptions, Provider, ProvisionRequest};

use crate::common::*;

fn req(claim: &str, script: &str) -> ProvisionRequest {
    ProvisionRequest {
        claim: claim.into(),
        namespace: "default".into(),
        pod_name: "p".into(),
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        env: vec![("GREETING".into(), "hi".into())],
        ..ProvisionRequest::default()
    }
}

#[tokio::test]
async fn a_new_provider_on_the_same_state_dir_finds_the_process_and_provision_is_idempotent()
-> anyhow::Result<()> {
    let state = tempfile::tempdir()?;
    let first = ProcessProvider::new("proc", state.path())?;
    let a = first
        .provision(&req("nebula-aaaa", "exec sleep 1000"))
        .await?;
    // A restarted manager: a fresh provider over the same directory.
    let second = ProcessProvider::new("proc", state.path())?;
    let listed = second.list().await?;
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].id.as_str(), &listed[0].state),
        (a.id.as_str(), &InstanceState::Running)
    );
    let again = second
        .provision(&req("nebula-aaaa", "exec sleep 1000"))
        .await?;
    assert_eq!(
        again.id, a.id,
        "a second provision of the claim answers the same process"
    );
    second.terminate(&a.id).await?;
    second.terminate(&a.id).await?; // idempotent
    assert!(second.list().await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn a_reused_pid_is_not_taken_for_the_instance() -> anyhow::Result<()> {
    let state = tempfile::tempdir()?;
    let p = ProcessProvider::new("proc", state.path())?;
    let a = p.provision(&req("nebula-bbbb", "exec sleep 1000")).await?;
    let record = state.path().join("proc/nebula-bbbb/instance.json");
    // Pretend the recorded process died and its PID now belongs to someone else: the
    // record's start time no longer matches the live process.
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&record)?)?;
    let pid = v["pid"].as_i64().unwrap() as i32;
    v["start_time"] = serde_json::json!(v["start_time"].as_u64().unwrap() + 1);
    std::fs::write(&record, serde_json::to_vec(&v)?)?;
    let fresh = ProcessProvider::new("proc", state.path())?;
    let listed = fresh.list().await?;
    assert!(
        matches!(listed[0].state, InstanceState::Failed { .. }),
        "{listed:?}"
    );
    // Terminating the stale record must not signal the live process with that PID.
    fresh.terminate(&listed[0].id).await?;
    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the live process was spared"
    );
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = a;
    Ok(())
}

#[tokio::test]
async fn exec_port_forward_stats_and_log_tail() -> anyhow::Result<()> {
    let state = tempfile::tempdir()?;
    let p = ProcessProvider::new("proc", state.path())?;
    let a = p
        .provision(&req(
            "nebula-cccc",
            "for i in 1 2 3; do echo line$i; done; exec sleep 1000",
        ))
        .await?;
    // Log tail.
    let text = wait_for("three lines", || async {
        let mut s = String::new();
        let opts = LogOptions {
            tail_lines: Some(2),
            ..LogOptions::default()
        };
        p.log_streamer()
            .unwrap()
            .logs(&a.id, &opts)
            .await?
            .read_to_string(&mut s)
            .await?;
        Ok((s == "line2\nline3\n").then_some(s))
    })
    .await?;
    assert_eq!(text, "line2\nline3\n");
    // Exec in the pod's environment and working directory.
    let (out_w, mut out_r) = tokio::io::duplex(4096);
    let code = p
        .executor()
        .unwrap()
        .exec(
            &a.id,
            vec![
                "/bin/sh".into(),
                "-c".into(),
                "echo $GREETING; pwd; exit 7".into(),
            ],
            ExecIo::pipes(None, Some(Box::pin(out_w)), None),
        )
        .await?;
    let mut out = String::new();
    out_r.read_to_string(&mut out).await?;
    assert_eq!(code, 7);
    assert_eq!(
        out,
        format!(
            "hi\n{}\n",
            state.path().join("proc/nebula-cccc/root").display()
        )
    );
    // Port-forward reaches a port on loopback.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let echo = tokio::spawn(async move {
        let (mut c, _) = listener.accept().await?;
        let mut buf = [0u8; 4];
        c.read_exact(&mut buf).await?;
        c.write_all(&buf).await?;
        Ok::<(), std::io::Error>(())
    });
    let mut stream = p.port_forwarder().unwrap().connect(&a.id, port).await?;
    stream.write_all(b"ping").await?;
    let mut back = [0u8; 4];
    stream.read_exact(&mut back).await?;
    assert_eq!(&back, b"ping");
    echo.await??;
    // Stats of a live process.
    let stats = p.stats().unwrap().stats(&a.id).await?;
    assert!(stats.memory_bytes > 0);
    p.terminate(&a.id).await?;
    tokio::time::sleep(Duration::from_millis(10)).await;
    Ok(())
}
