//! The process provider on its own: re-finding instances after a restart, the PID-reuse
//! guard, and the optional capabilities (exec, port-forward, stats, log tail).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vnode::providers::process::ProcessProvider;
use vnode::{ExecIo, ExecOutput, InstanceState, LogOptions, Provider, ProvisionRequest};

use crate::common::*;

/// A claim unique to this test process: claim tags are found machine-wide (a restarted
/// manager finds its processes by them), so a process left by another run, or by a test
/// running at the same time, must never carry the same one.
fn claim(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

fn req(name: &str, script: &str) -> ProvisionRequest {
    ProvisionRequest {
        claim: claim(name),
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
    let record = state
        .path()
        .join("proc")
        .join(claim("nebula-bbbb"))
        .join("instance.json");
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
async fn an_image_restart_is_counted_even_when_the_manager_dies_before_recording_it()
-> anyhow::Result<()> {
    let state = tempfile::tempdir()?;
    // The second process start (the restart) never gets past its spawn: the manager
    // dies before instance.json names the new process.
    let starts = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let hook: vnode::CrashHook = {
        let starts = starts.clone();
        std::sync::Arc::new(move |point| {
            let n = if point == vnode::CrashPoint::ProviderCreated {
                starts.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1
            } else {
                0
            };
            Box::pin(async move {
                if n == 2 {
                    std::future::pending::<()>().await;
                }
            })
        })
    };
    let first = ProcessProvider::new("proc", state.path())?.with_crash_hook(Some(hook));
    let request = req("nebula-cccc", "exec sleep 1000");
    let a = first.provision(&request).await?;
    assert_eq!(a.restart_count, 0);
    let update = vnode::UpdateRequest {
        claim: request.claim.clone(),
        image: "busybox:2".into(),
        ..vnode::UpdateRequest::default()
    };
    let restarting = {
        let first = first.clone();
        let id = a.id.clone();
        tokio::spawn(async move { first.update(&id, &update).await })
    };
    wait_for("the restarted process spawned", || async {
        Ok((starts.load(std::sync::atomic::Ordering::SeqCst) == 2).then_some(()))
    })
    .await?;
    restarting.abort();
    let _ = restarting.await;

    // A restarted manager finds the new process by its tag, with the restart counted.
    let second = ProcessProvider::new("proc", state.path())?;
    let listed = second.list().await?;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_ne!(listed[0].id, a.id);
    assert_eq!(listed[0].state, InstanceState::Running);
    assert_eq!(listed[0].restart_count, 1);
    second.terminate(&listed[0].id).await?;
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
            state
                .path()
                .join("proc")
                .join(claim("nebula-cccc"))
                .join("root")
                .display()
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

/// Reads `from` into `buf` until `want` appears (10 s at most); what was read.
async fn read_until(
    from: &mut (impl tokio::io::AsyncRead + Unpin),
    buf: &mut Vec<u8>,
    want: &str,
) -> anyhow::Result<String> {
    tokio::time::timeout(Duration::from_secs(10), async {
        while !String::from_utf8_lossy(buf).contains(want) {
            let mut chunk = [0u8; 4096];
            let n = from.read(&mut chunk).await?;
            anyhow::ensure!(
                n > 0,
                "ended before {want:?}: {:?}",
                String::from_utf8_lossy(buf)
            );
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok(String::from_utf8_lossy(buf).into_owned())
    })
    .await
    .map_err(|_| {
        anyhow::anyhow!(
            "no {want:?} within 10 s: {:?}",
            String::from_utf8_lossy(buf)
        )
    })?
}

#[tokio::test]
async fn attach_writes_the_live_process_stdin_and_reads_its_stdout_and_stderr_apart()
-> anyhow::Result<()> {
    let state = tempfile::tempdir()?;
    let p = ProcessProvider::new("proc", state.path())?;
    let mut r = req(
        "nebula-dddd",
        r#"echo before; while read l; do echo "out $l"; echo "err $l" >&2; [ "$l" = quit ] && exit 0; done"#,
    );
    r.stdin = true;
    let a = p.provision(&r).await?;
    // Output written before the attach is the log's, not the attached client's.
    wait_for("the first line", || async {
        let mut s = String::new();
        p.log_streamer()
            .unwrap()
            .logs(&a.id, &LogOptions::default())
            .await?
            .read_to_string(&mut s)
            .await?;
        Ok((s == "before\n").then_some(()))
    })
    .await?;
    let (mut stdin_w, stdin_r) = tokio::io::duplex(4096);
    let (out_w, mut out_r) = tokio::io::duplex(4096);
    let (err_w, mut err_r) = tokio::io::duplex(4096);
    let attacher = p.clone();
    let id = a.id.clone();
    let session = tokio::spawn(async move {
        attacher
            .attacher()
            .unwrap()
            .attach(
                &id,
                ExecIo::pipes(
                    Some(Box::pin(stdin_r)),
                    Some(Box::pin(out_w)),
                    Some(Box::pin(err_w)),
                ),
            )
            .await
    });
    stdin_w.write_all(b"one\n").await?;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    assert_eq!(
        read_until(&mut out_r, &mut out, "out one\n").await?,
        "out one\n"
    );
    assert_eq!(
        read_until(&mut err_r, &mut err, "err one\n").await?,
        "err one\n"
    );
    // The client's end of input does not close the process's (no stdinOnce).
    drop(stdin_w);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(matches!(p.status(&a.id).await?, Some(i) if i.state == InstanceState::Running));
    // A second client writes to the same stdin; the process exits and the attach ends.
    let (mut w2, r2) = tokio::io::duplex(64);
    let writer = p.clone();
    let id = a.id.clone();
    let second = tokio::spawn(async move {
        writer
            .attacher()
            .unwrap()
            .attach(&id, ExecIo::pipes(Some(Box::pin(r2)), None, None))
            .await
    });
    w2.write_all(b"quit\n").await?;
    read_until(&mut out_r, &mut out, "out quit\n").await?;
    tokio::time::timeout(Duration::from_secs(10), session)
        .await
        .map_err(|_| anyhow::anyhow!("attach did not end when the process exited"))???;
    tokio::time::timeout(Duration::from_secs(10), second).await???;
    // Everything went to the log too, stdout and stderr together (the last lines once the
    // manager has drained both pipes).
    let log = wait_for("both streams' last lines in the log", || async {
        let mut s = String::new();
        p.log_streamer()
            .unwrap()
            .logs(&a.id, &LogOptions::default())
            .await?
            .read_to_string(&mut s)
            .await?;
        Ok((s.contains("out quit\n") && s.contains("err quit\n")).then_some(s))
    })
    .await?;
    // Each stream keeps its order; between the two, the order is the drain's (two pipes).
    let lines: Vec<&str> = log.lines().collect();
    let out_lines: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| !l.starts_with("err "))
        .collect();
    assert_eq!(out_lines, ["before", "out one", "out quit"], "{log}");
    let err_lines: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("err "))
        .collect();
    assert_eq!(err_lines, ["err one", "err quit"], "{log}");
    // Attaching to a process that ended says so.
    wait_for("the process to end", || async {
        Ok(matches!(p.status(&a.id).await?, Some(i) if i.state == (InstanceState::Exited { code: 0 })).then_some(()))
    })
    .await?;
    let late = p
        .attacher()
        .unwrap()
        .attach(&a.id, ExecIo::pipes(None, None, None))
        .await;
    assert!(
        late.as_ref()
            .is_err_and(|e| e.to_string().contains("not running")),
        "{late:?}"
    );
    p.terminate(&a.id).await?;
    Ok(())
}

#[tokio::test]
async fn attach_to_a_terminal_pod_sets_its_size() -> anyhow::Result<()> {
    let state = tempfile::tempdir()?;
    let p = ProcessProvider::new("proc", state.path())?;
    let mut r = req(
        "nebula-eeee",
        r#"while read l; do echo "got $l"; stty size; done"#,
    );
    r.stdin = true;
    r.tty = true;
    let a = p.provision(&r).await?;
    let (mut stdin_w, stdin_r) = tokio::io::duplex(4096);
    let (out_w, mut out_r) = tokio::io::duplex(4096);
    let (resize_tx, resize_rx) = tokio::sync::mpsc::channel(4);
    let attacher = p.clone();
    let id = a.id.clone();
    let mut session = tokio::spawn(async move {
        let io = ExecIo {
            stdin: Some(Box::pin(stdin_r)),
            stdout: Some(ExecOutput::writer(out_w)),
            stderr: None,
            tty: true,
            resize: Some(resize_rx),
        };
        attacher.attacher().unwrap().attach(&id, io).await
    });
    resize_tx.send((111, 33)).await?;
    // The size is set by another task: ask until it shows.
    let mut out = Vec::new();
    let text = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Err(e) = stdin_w.write_all(b"x\n").await {
                let ended = if session.is_finished() {
                    format!("{:?}", (&mut session).await)
                } else {
                    "still running".into()
                };
                anyhow::bail!(
                    "writing to the session's stdin: {e}; the session: {ended}; output so far {:?}",
                    String::from_utf8_lossy(&out)
                );
            }
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout(Duration::from_millis(500), out_r.read(&mut chunk))
                .await
                .unwrap_or(Ok(0))?;
            out.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&out).into_owned();
            if text.contains("33 111") {
                return Ok::<_, anyhow::Error>(text);
            }
        }
    })
    .await
    .map_err(|_| anyhow::anyhow!("no 33x111 terminal: {:?}", String::from_utf8_lossy(&out)))??;
    // A terminal: the input is echoed and lines end in CR LF.
    assert!(text.contains("got x\r\n"), "{text:?}");
    session.abort();
    p.terminate(&a.id).await?;
    Ok(())
}

/// `(time, line)` of a `timestamps=true` log.
fn stamped(text: &str) -> Vec<(i128, String)> {
    text.lines()
        .map(|l| {
            let (t, rest) = l.split_once(' ').unwrap();
            // RFC 3339 in UTC with nanoseconds, as the kubelet writes them.
            assert_eq!(t.len(), 30, "{l}");
            let t: k8s_openapi::jiff::Timestamp = t.parse().unwrap();
            (t.as_nanosecond(), rest.to_string())
        })
        .collect()
}

#[tokio::test]
async fn logs_honour_since_timestamps_tail_and_limit() -> anyhow::Result<()> {
    let state = tempfile::tempdir()?;
    let p = ProcessProvider::new("proc", state.path())?;
    let a = p
        .provision(&req(
            "nebula-ffff",
            "echo first; sleep 1; echo second; exec sleep 1000",
        ))
        .await?;
    let logs = |opts: LogOptions| {
        let p = p.clone();
        let id = a.id.clone();
        async move {
            let mut s = String::new();
            p.log_streamer()
                .unwrap()
                .logs(&id, &opts)
                .await?
                .read_to_string(&mut s)
                .await?;
            Ok::<_, anyhow::Error>(s)
        }
    };
    wait_for("two lines", || async {
        Ok((logs(LogOptions::default()).await? == "first\nsecond\n").then_some(()))
    })
    .await?;
    let all = logs(LogOptions {
        timestamps: true,
        ..LogOptions::default()
    })
    .await?;
    let lines = stamped(&all);
    assert_eq!(
        lines.iter().map(|(_, l)| l.as_str()).collect::<Vec<_>>(),
        ["first", "second"]
    );
    let (t1, t2) = (lines[0].0, lines[1].0);
    // The times are those of the writes, a second apart, not of the request.
    assert!(t2 - t1 >= 900_000_000, "{all}");
    let since = |t: i128| LogOptions {
        since_unix_nanos: Some(t),
        ..LogOptions::default()
    };
    assert_eq!(logs(since(t1)).await?, "first\nsecond\n");
    assert_eq!(logs(since(t1 + 1)).await?, "second\n");
    assert_eq!(logs(since(t2 + 1)).await?, "");
    let tail = LogOptions {
        tail_lines: Some(1),
        ..LogOptions::default()
    };
    assert_eq!(logs(tail.clone()).await?, "second\n");
    // tail first, then since (as the kubelet does): the last line is before t2 + 1.
    assert_eq!(
        logs(LogOptions {
            since_unix_nanos: Some(t1 + 1),
            ..tail.clone()
        })
        .await?,
        "second\n"
    );
    assert_eq!(
        logs(LogOptions {
            limit_bytes: Some(8),
            ..LogOptions::default()
        })
        .await?,
        "first\nse"
    );
    // The limit counts the timestamps too.
    let limited = logs(LogOptions {
        limit_bytes: Some(10),
        timestamps: true,
        ..LogOptions::default()
    })
    .await?;
    assert_eq!(limited, all[..10]);
    // follow with a limit ends at the limit.
    let followed = tokio::time::timeout(
        Duration::from_secs(10),
        logs(LogOptions {
            follow: true,
            limit_bytes: Some(3),
            ..LogOptions::default()
        }),
    )
    .await
    .map_err(|_| anyhow::anyhow!("a limited follow did not end at its limit"))??;
    assert_eq!(followed, "fir");
    p.terminate(&a.id).await?;
    Ok(())
}

#[tokio::test]
async fn stats_sum_the_pods_processes() -> anyhow::Result<()> {
    let state = tempfile::tempdir()?;
    let p = ProcessProvider::new("proc", state.path())?;
    let mut r = req(
        "nebula-gggg",
        // A child that burns CPU, then stays: its time is the pod's.
        "sh -c 'i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; exec sleep 1000' & exec sleep 1000",
    );
    r.container = "main".into();
    r.pod_uid = "uid-1".into();
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let a = p.provision(&r).await?;
    let stats = wait_for("CPU time of the busy child", || async {
        let s = p.stats().unwrap().stats(&a.id).await?;
        Ok((s.cpu_nanos >= 100_000_000).then_some(s))
    })
    .await?;
    assert!(
        stats.memory_bytes > 0 && stats.working_set_bytes > 0,
        "{stats:?}"
    );
    let start = stats.start_time_unix.unwrap();
    assert!(
        start + 2 >= before && start <= before + 5,
        "{start} vs {before}"
    );
    assert_eq!(stats.container.as_deref(), Some("main"));
    assert_eq!(stats.pod_uid.as_deref(), Some("uid-1"));
    p.terminate(&a.id).await?;
    Ok(())
}
