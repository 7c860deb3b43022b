//! The kubelet API of the virtual nodes with real kubectl: `logs`, `logs -f` and `exec`
//! go through the API double's kubelet proxy to the manager's listener (the node's
//! address and daemon endpoint), which runs them against the process provider.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::crash::{running, start_with, wait_for};

/// The versioned kubectl binaries ship beside gcloud on these machines.
fn kubectl_bin(version: &str) -> PathBuf {
    let out = std::process::Command::new("sh")
        .args(["-c", "dirname \"$(readlink -f \"$(command -v gcloud)\")\""])
        .output()
        .expect("running sh to locate gcloud");
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let bin = Path::new(&dir).join(format!("kubectl.{version}"));
    assert!(
        !dir.is_empty() && bin.is_file(),
        "kubectl {version} not found at {} (it ships beside gcloud: `gcloud components install kubectl` brings kubectl.1.27 ... kubectl.1.33)",
        bin.display()
    );
    bin
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn kubectl(bin: &Path, kubeconfig: &Path, args: &[&str]) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(bin);
    c.arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    c
}

async fn run(bin: &Path, kubeconfig: &Path, args: &[&str], stdin: Option<&[u8]>) -> Out {
    let mut c = kubectl(bin, kubeconfig, args);
    if stdin.is_some() {
        c.stdin(Stdio::piped());
    }
    let mut child = c.spawn().expect("spawning kubectl");
    if let Some(input) = stdin {
        let mut w = child.stdin.take().unwrap();
        w.write_all(input).await.unwrap();
        drop(w);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("kubectl {args:?} did not finish within 60 s"))
        .unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The tick counter of the last `tick N` line in `text`.
fn last_tick(text: &str) -> Option<u64> {
    text.lines()
        .filter_map(|l| l.strip_prefix("tick ")?.trim().parse().ok())
        .next_back()
}

#[tokio::test]
async fn kubectl_logs_follow_and_exec_reach_the_process_provider() {
    let k132 = kubectl_bin("1.32");
    let k127 = kubectl_bin("1.27");
    let server = testkube::ApiServer::start().await.unwrap();
    let kc = server.kubeconfig_path().to_path_buf();
    let state = crate::state::state_dir();
    let _manager = start_with(&kc, state.path(), None, &[]).unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "nodeName": "nebula-process",
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "main", "image": "none",
                "command": ["sh", "-c", "echo hello from web; i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done"],
                "env": [{"name": "GREETING", "value": "hi there"}],
            }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    running(&pods, "web").await.unwrap();

    // logs: what the process wrote so far.
    let logs = run(&k132, &kc, &["logs", "web"], None).await;
    assert_eq!(logs.code, 0, "kubectl logs failed: {}", logs.stderr);
    assert!(
        logs.stdout.starts_with("hello from web\n"),
        "{}",
        logs.stdout
    );
    let tail = run(&k132, &kc, &["logs", "web", "--tail=1"], None).await;
    assert_eq!(tail.code, 0, "{}", tail.stderr);
    assert_eq!(tail.stdout.lines().count(), 1, "{}", tail.stdout);
    assert!(tail.stdout.starts_with("tick "), "{}", tail.stdout);

    // logs -f: lines the process writes after the request arrive on the open stream.
    let seen = last_tick(&logs.stdout).unwrap_or(0);
    let mut follow = kubectl(&k132, &kc, &["logs", "-f", "web"]).spawn().unwrap();
    let mut lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    let target = seen + 10;
    let got = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if last_tick(&line).is_some_and(|n| n >= target) {
                return line;
            }
        }
        panic!("kubectl logs -f ended before tick {target}");
    })
    .await
    .expect("kubectl logs -f did not follow new output within 30 s");
    assert!(got.starts_with("tick "), "{got}");
    follow.kill().await.unwrap();

    // exec over WebSocket (kubectl 1.32) and SPDY (kubectl 1.27): stdout, stderr, the
    // pod's environment, and the exit code as kubectl's own.
    for (version, bin) in [("1.32", &k132), ("1.27", &k127)] {
        let out = run(
            bin,
            &kc,
            &[
                "exec",
                "web",
                "--",
                "sh",
                "-c",
                "echo \"$GREETING from exec\"; echo oops >&2; exit 3",
            ],
            None,
        )
        .await;
        assert_eq!(
            out.code, 3,
            "kubectl {version} exec: want exit 3, got {}: {}{}",
            out.code, out.stdout, out.stderr
        );
        assert!(
            out.stdout == "hi there from exec\n",
            "kubectl {version}: {}",
            out.stdout
        );
        assert!(
            out.stderr.contains("oops"),
            "kubectl {version}: {}",
            out.stderr
        );

        // -t: the command runs on a terminal whose size is the client's. `script` gives
        // kubectl a terminal of 33 rows and 111 columns.
        let line = format!(
            "stty rows 33 cols 111; {} --kubeconfig {} exec -it web -- sh -c 'tty; stty size; exit 4'",
            bin.display(),
            kc.display()
        );
        let tty = tokio::process::Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .env_remove("KUBECONFIG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("running script (util-linux) to give kubectl a terminal");
        let tty = tokio::time::timeout(Duration::from_secs(60), tty.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("kubectl {version} exec -it did not finish within 60 s"))
            .unwrap();
        let text = String::from_utf8_lossy(&tty.stdout);
        assert!(
            text.contains("/dev/pts/") && text.contains("33 111"),
            "kubectl {version} exec -it: want a terminal of 33x111, got {text:?} {}",
            String::from_utf8_lossy(&tty.stderr)
        );
        assert_eq!(
            tty.status.code(),
            Some(4),
            "kubectl {version} exec -it: {text:?}"
        );

        let ok = run(
            bin,
            &kc,
            &["exec", "-i", "web", "--", "cat"],
            Some(b"typed in\n"),
        )
        .await;
        assert_eq!(ok.code, 0, "kubectl {version} exec -i: {}", ok.stderr);
        assert_eq!(ok.stdout, "typed in\n", "kubectl {version}");
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn kubectl_port_forward_reaches_a_port_the_pods_process_listens_on() {
    let server = testkube::ApiServer::start().await.unwrap();
    let kc = server.kubeconfig_path().to_path_buf();
    let state = crate::state::state_dir();
    let _manager = start_with(&kc, state.path(), None, &[]).unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let pod_port = free_port();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "srv", "namespace": "default"},
        "spec": {
            "nodeName": "nebula-process",
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "main", "image": "none",
                "command": ["sh", "-c", format!("echo served by the pod > index.html; exec python3 -m http.server {pod_port} --bind 127.0.0.1")],
            }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    running(&pods, "srv").await.unwrap();
    // kubectl port-forward gives up on a refused dial: wait until the pod's server listens.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(("127.0.0.1", pod_port))
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pod's python3 http.server never listened on {pod_port} (is python3 installed?)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    for version in ["1.32", "1.27"] {
        let bin = kubectl_bin(version);
        let local = free_port();
        let mut pf = kubectl(
            &bin,
            &kc,
            &["port-forward", "pod/srv", &format!("{local}:{pod_port}")],
        )
        .spawn()
        .unwrap();
        let mut lines = BufReader::new(pf.stdout.take().unwrap()).lines();
        tokio::time::timeout(Duration::from_secs(20), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if line.contains("Forwarding from") {
                    return;
                }
            }
            panic!("kubectl {version} port-forward ended before forwarding");
        })
        .await
        .unwrap_or_else(|_| panic!("kubectl {version} port-forward did not start within 20 s"));
        // The pod's server may still be starting: retry the request for a while.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let body = loop {
            let attempt = async {
                let mut s = tokio::net::TcpStream::connect(("127.0.0.1", local)).await?;
                s.write_all(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")
                    .await?;
                let mut out = String::new();
                tokio::io::AsyncReadExt::read_to_string(&mut s, &mut out).await?;
                Ok::<_, std::io::Error>(out)
            };
            match tokio::time::timeout(Duration::from_secs(10), attempt).await {
                Ok(Ok(out)) if out.contains("200") => break out,
                other => {
                    if tokio::time::Instant::now() >= deadline {
                        let _ = pf.start_kill();
                        let mut stderr = String::new();
                        if let Some(mut e) = pf.stderr.take() {
                            let _ = tokio::time::timeout(
                                Duration::from_secs(5),
                                tokio::io::AsyncReadExt::read_to_string(&mut e, &mut stderr),
                            )
                            .await;
                        }
                        panic!(
                            "kubectl {version} port-forward: no answer from the pod: {other:?}; kubectl said: {stderr}"
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        };
        assert!(
            body.ends_with("served by the pod\n"),
            "kubectl {version}: {body}"
        );
        pf.kill().await.unwrap();
    }

    // The Python client's exec (WebSocket v4) and port-forward (WebSocket channels,
    // `v4.channel.k8s.io`): it reads the forwarded connection until the server closes the
    // session, which the server does when the pod's side of the connection ends.
    let python = Path::new("/usr/bin/python3");
    assert!(
        python.is_file(),
        "/usr/bin/python3 not found: apt-get install python3 python3-kubernetes"
    );
    let script = r#"
import sys
from kubernetes import client, config
from kubernetes.stream import stream
config.load_kube_config(config_file=sys.argv[1])
api = client.CoreV1Api()
out = stream(api.connect_get_namespaced_pod_exec, "srv", "default",
             command=["sh", "-c", "cat index.html"],
             stderr=True, stdin=False, stdout=True, tty=False)
sys.stdout.write(out)
"#;
    let out = run_python(python, script, &[kc.to_str().unwrap()], "exec").await;
    assert!(
        out.status.success(),
        "python client failed ({:?}): {}; it wrote {:?}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "served by the pod\n");

    let script = r#"
import sys
from kubernetes import client, config
from kubernetes.stream import portforward
config.load_kube_config(config_file=sys.argv[1])
api = client.CoreV1Api()
port = int(sys.argv[2])
pf = portforward(api.connect_get_namespaced_pod_portforward, "srv", "default", ports=str(port))
s = pf.socket(port)
s.setblocking(True)
s.sendall(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")
data = b""
while True:
    chunk = s.recv(4096)
    if not chunk:
        break
    data += chunk
s.close()
error = pf.error(port)
if error:
    sys.exit("port-forward error: " + error)
sys.stdout.write(data.decode().split("\r\n\r\n", 1)[1])
"#;
    let port = pod_port.to_string();
    let out = run_python(
        python,
        script,
        &[kc.to_str().unwrap(), &port],
        "port-forward",
    )
    .await;
    assert!(
        out.status.success(),
        "python port-forward failed ({:?}, 124 is the 50 s timeout): {}; it wrote {:?}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "served by the pod\n");
}

/// Runs a python `kubernetes` client script (under `timeout 50`, and at most 60 s) with
/// `args`; fails at once, naming the package, when the module is missing.
async fn run_python(
    python: &std::path::Path,
    script: &str,
    args: &[&str],
    what: &str,
) -> std::process::Output {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("timeout")
            .arg("50")
            .arg(python)
            .arg("-u")
            .arg("-c")
            .arg(script)
            .args(args)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("the python client's {what} did not finish within 60 s"))
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named 'kubernetes'"),
        "the kubernetes module is missing: apt-get install python3-kubernetes"
    );
    out
}

#[tokio::test]
async fn a_hundred_concurrent_exec_sessions_complete() {
    use kube::api::AttachParams;
    let server = testkube::ApiServer::start().await.unwrap();
    let kc = server.kubeconfig_path().to_path_buf();
    let state = crate::state::state_dir();
    let _manager = start_with(&kc, state.path(), None, &[]).unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "busy", "namespace": "default"},
        "spec": {
            "nodeName": "nebula-process",
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "main", "image": "none", "command": ["sleep", "1000"]}],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    running(&pods, "busy").await.unwrap();

    let mut sessions = tokio::task::JoinSet::new();
    for i in 0..100 {
        let pods = pods.clone();
        sessions.spawn(async move {
            let command = vec!["sh".to_string(), "-c".into(), format!("echo session-{i}")];
            let params = AttachParams::default().stdout(true).stderr(false);
            let mut attached = pods.exec("busy", command, &params).await.unwrap();
            let mut out = String::new();
            let mut stdout = attached.stdout().unwrap();
            tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut out)
                .await
                .unwrap();
            let status = attached.take_status().unwrap().await;
            attached.join().await.unwrap();
            (i, out, status.and_then(|s| s.status))
        });
    }
    let all = tokio::time::timeout(Duration::from_secs(120), async {
        let mut done = Vec::new();
        while let Some(r) = sessions.join_next().await {
            done.push(r.unwrap());
        }
        done
    })
    .await
    .expect("100 concurrent exec sessions did not complete within 120 s");
    assert_eq!(all.len(), 100);
    for (i, out, status) in all {
        assert_eq!(out, format!("session-{i}\n"));
        assert_eq!(status.as_deref(), Some("Success"), "session {i}");
    }
}

/// A pod on the process provider from its first container's fields.
fn process_pod(name: &str, container: serde_json::Value) -> Pod {
    let mut c = json!({"name": "main", "image": "none"});
    for (k, v) in container.as_object().unwrap() {
        c[k] = v.clone();
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": "nebula-process",
            "terminationGracePeriodSeconds": 5,
            "containers": [c],
        },
    }))
    .unwrap()
}

/// Runs `line` (a shell command line) on a terminal of 33 rows and 111 columns made by
/// `script`, typing each of `typed` once the output shows its trigger, and typing the
/// previous text again every second until it does (the client's first terminal size may
/// arrive after the first keys); the exit code and everything the terminal showed.
async fn on_terminal(line: &str, typed: &[(&str, &str)]) -> (Option<i32>, String) {
    let full = format!("stty rows 33 cols 111; {line}");
    let mut child = tokio::process::Command::new("script")
        .args(["-qec", &full, "/dev/null"])
        .env_remove("KUBECONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("running script (util-linux) to give kubectl a terminal");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    let mut again: Option<&str> = None;
    for (trigger, text) in typed {
        let found = tokio::time::timeout(Duration::from_secs(30), async {
            while !String::from_utf8_lossy(&seen).contains(trigger) {
                let mut chunk = [0u8; 4096];
                let read = tokio::time::timeout(
                    Duration::from_secs(1),
                    tokio::io::AsyncReadExt::read(&mut stdout, &mut chunk),
                )
                .await;
                match read {
                    Ok(n) => {
                        let n = n.unwrap();
                        if n == 0 {
                            return false;
                        }
                        seen.extend_from_slice(&chunk[..n]);
                    }
                    Err(_) => {
                        if let Some(t) = again {
                            stdin.write_all(t.as_bytes()).await.unwrap();
                        }
                    }
                }
            }
            true
        })
        .await;
        again = Some(text);
        assert!(
            found == Ok(true),
            "{line}: no {trigger:?} on the terminal: {:?}",
            String::from_utf8_lossy(&seen)
        );
        stdin.write_all(text.as_bytes()).await.unwrap();
    }
    let rest = tokio::time::timeout(Duration::from_secs(60), async {
        let mut rest = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut stdout, &mut rest)
            .await
            .unwrap();
        rest
    })
    .await
    .unwrap_or_else(|_| panic!("{line} did not finish within 60 s"));
    seen.extend_from_slice(&rest);
    let status = child.wait().await.unwrap();
    (status.code(), String::from_utf8_lossy(&seen).into_owned())
}

#[tokio::test]
async fn kubectl_attach_log_options_and_node_stats_reach_the_process_provider() {
    let k132 = kubectl_bin("1.32");
    let k127 = kubectl_bin("1.27");
    let server = testkube::ApiServer::start().await.unwrap();
    let kc = server.kubeconfig_path().to_path_buf();
    let state = crate::state::state_dir();
    let _manager = start_with(&kc, state.path(), None, &[]).unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let chat = r#"echo ready; while read l; do echo "got $l"; echo "err $l" >&2; [ "$l" = bye ] && exit 0; done"#;
    let sized = r#"while read l; do echo "size $(stty size)"; [ "$l" = bye ] && exit 0; done"#;
    let timed = "echo early; sleep 2; echo late; exec sleep 1000";
    let versions = [("132", &k132), ("127", &k127)];
    for (v, _) in versions {
        for (name, script, tty) in [("chat", chat, false), ("tty", sized, true)] {
            let pod = process_pod(
                &format!("{name}-{v}"),
                json!({"command": ["sh", "-c", script], "stdin": true, "tty": tty}),
            );
            pods.create(&PostParams::default(), &pod).await.unwrap();
        }
    }
    let timed_pod = process_pod("timed", json!({"command": ["sh", "-c", timed]}));
    pods.create(&PostParams::default(), &timed_pod)
        .await
        .unwrap();
    for (v, _) in versions {
        running(&pods, &format!("chat-{v}")).await.unwrap();
        running(&pods, &format!("tty-{v}")).await.unwrap();
    }
    running(&pods, "timed").await.unwrap();

    for (v, bin) in versions {
        // attach -i: what kubectl reads goes to the running process's stdin; its stdout
        // and stderr come back apart; the attach ends, exit 0, when the process exits.
        let pod = format!("chat-{v}");
        let out = run(bin, &kc, &["attach", "-i", &pod], Some(b"hello\nbye\n")).await;
        assert_eq!(
            out.code, 0,
            "kubectl {v} attach -i: {}{}",
            out.stdout, out.stderr
        );
        assert_eq!(
            out.stdout, "got hello\ngot bye\n",
            "kubectl {v}: {}",
            out.stderr
        );
        assert!(
            out.stderr.contains("err hello\nerr bye\n"),
            "kubectl {v}: {}",
            out.stderr
        );
        // What the process wrote before the attach is in its log, not the attach.
        let logs = run(bin, &kc, &["logs", &pod], None).await;
        assert!(logs.stdout.starts_with("ready\n"), "{}", logs.stdout);

        // attach -it to a pod with a terminal: the client's size reaches it.
        let line = format!(
            "{} --kubeconfig {} attach -it tty-{v}",
            bin.display(),
            kc.display()
        );
        let (code, text) = on_terminal(
            &line,
            &[("try pressing enter", "x\r"), ("size 33 111", "bye\r")],
        )
        .await;
        assert_eq!(code, Some(0), "kubectl {v} attach -it: {text:?}");
        assert!(
            text.contains("size 33 111"),
            "kubectl {v} attach -it: {text:?}"
        );
    }

    // Log options as the kubelet serves them, through kubectl 1.32.
    let lines = wait_for("the timed pod's second line", || async {
        let out = run(&k132, &kc, &["logs", "timed", "--timestamps"], None).await;
        Ok((out.stdout.lines().count() == 2).then_some(out.stdout))
    })
    .await
    .unwrap();
    let stamps: Vec<k8s_openapi::jiff::Timestamp> = lines
        .lines()
        .map(|l| l.split(' ').next().unwrap().parse().unwrap())
        .collect();
    assert!(lines.lines().next().unwrap().ends_with(" early"), "{lines}");
    assert!(
        stamps[1].duration_since(stamps[0]) >= k8s_openapi::jiff::SignedDuration::from_millis(1900),
        "the times are the writes', two seconds apart: {lines}"
    );
    // sinceTime has second precision: the second the late line was written in.
    let since = format!("{:.0}", stamps[1]);
    let late = run(
        &k132,
        &kc,
        &["logs", "timed", &format!("--since-time={since}")],
        None,
    )
    .await;
    assert_eq!(
        late.stdout, "late\n",
        "--since-time={since}: {}",
        late.stderr
    );
    let hour = run(&k132, &kc, &["logs", "timed", "--since=1h"], None).await;
    assert_eq!(hour.stdout, "early\nlate\n", "{}", hour.stderr);
    let limited = run(&k132, &kc, &["logs", "timed", "--limit-bytes=8"], None).await;
    assert_eq!(limited.stdout, "early\nla", "{}", limited.stderr);
    let tail = run(&k132, &kc, &["logs", "timed", "--tail=1"], None).await;
    assert_eq!(tail.stdout, "late\n", "{}", tail.stderr);
    let previous = run(&k132, &kc, &["logs", "timed", "--previous"], None).await;
    assert_ne!(previous.code, 0);
    assert!(
        previous.stderr.contains("previous terminated container"),
        "{}",
        previous.stderr
    );

    // Stats and resource metrics through the API server's node proxy.
    let summary = run(
        &k132,
        &kc,
        &[
            "get",
            "--raw",
            "/api/v1/nodes/nebula-process/proxy/stats/summary",
        ],
        None,
    )
    .await;
    assert_eq!(summary.code, 0, "{}", summary.stderr);
    let summary: serde_json::Value = serde_json::from_str(&summary.stdout).unwrap();
    assert_eq!(summary["node"]["nodeName"], "nebula-process");
    let timed_stats = summary["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["podRef"]["name"] == "timed")
        .unwrap_or_else(|| panic!("no stats of pod timed: {summary}"));
    assert_eq!(timed_stats["containers"][0]["name"], "main");
    assert!(
        timed_stats["memory"]["workingSetBytes"].as_u64().unwrap() > 0,
        "{timed_stats}"
    );
    assert!(
        timed_stats["cpu"]["usageCoreNanoSeconds"].is_u64(),
        "{timed_stats}"
    );
    assert!(timed_stats["startTime"].is_string(), "{timed_stats}");
    let metrics = run(
        &k132,
        &kc,
        &[
            "get",
            "--raw",
            "/api/v1/nodes/nebula-process/proxy/metrics/resource",
        ],
        None,
    )
    .await;
    assert_eq!(metrics.code, 0, "{}", metrics.stderr);
    for want in [
        "container_cpu_usage_seconds_total{container=\"main\",namespace=\"default\",pod=\"timed\"} ",
        "container_memory_working_set_bytes{container=\"main\",namespace=\"default\",pod=\"timed\"} ",
        "pod_cpu_usage_seconds_total{namespace=\"default\",pod=\"timed\"} ",
        "resource_scrape_error 0",
    ] {
        assert!(
            metrics.stdout.contains(want),
            "no {want:?} in {}",
            metrics.stdout
        );
    }
}
