//! Real kubectl (1.27, which speaks SPDY, and 1.32, which tries WebSocket first) and the
//! Python client against the API double, with `logs`, `exec` and `port-forward` reaching
//! a stub kubelet through the kubelet proxy.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use testkube::ApiServer;
use testkube::kubelet::StubKubelet;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// The versioned kubectl binaries sit beside gcloud on these machines.
fn kubectl_bin(version: &str) -> PathBuf {
    let out = std::process::Command::new("sh")
        .args(["-c", "dirname \"$(readlink -f \"$(command -v gcloud)\")\""])
        .output()
        .expect("running sh to locate gcloud");
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let bin = Path::new(&dir).join(format!("kubectl.{version}"));
    assert!(
        !dir.is_empty() && bin.is_file(),
        "kubectl {version} not found at {} (it ships beside gcloud: install the Google Cloud SDK \
         kubectl component, `gcloud components install kubectl`, which brings kubectl.1.27 ... kubectl.1.33)",
        bin.display()
    );
    bin
}

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Kubectl {
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        c
    }

    async fn run_with_stdin(&self, args: &[&str], stdin: Option<&[u8]>) -> Out {
        let mut c = self.command(args);
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

    async fn run(&self, args: &[&str]) -> Out {
        self.run_with_stdin(args, None).await
    }

    /// Runs and requires success.
    async fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        assert_eq!(
            out.code, 0,
            "kubectl {args:?} failed: {}{}",
            out.stdout, out.stderr
        );
        out.stdout
    }

    fn spawn(&self, args: &[&str]) -> Child {
        self.command(args).spawn().expect("spawning kubectl")
    }
}

/// Reads lines from a child's stdout until one satisfies `pred`; on failure the panic
/// carries what the child wrote to stderr.
async fn read_until(
    child: &mut Child,
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    what: &str,
    pred: impl Fn(&str) -> bool,
) -> String {
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await {
            Ok(Ok(Some(line))) => {
                if pred(&line) {
                    return line;
                }
                seen.push(line);
            }
            other => {
                let _ = child.start_kill();
                let mut stderr = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(5), e.read_to_string(&mut stderr))
                            .await;
                }
                panic!("waiting for {what}: got {other:?} after {seen:?}; stderr: {stderr}")
            }
        }
    }
}

async fn write_manifest(dir: &Path, name: &str, body: serde_json::Value) -> PathBuf {
    let path = dir.join(name);
    tokio::fs::write(&path, serde_json::to_vec_pretty(&body).unwrap())
        .await
        .unwrap();
    path
}

/// One API server, one stub kubelet, one kubectl version: the whole user journey.
async fn kubectl_journey(version: &str, expect_exec: &str, expect_port_forward: &str) {
    let kubectl = Kubectl {
        bin: kubectl_bin(version),
        kubeconfig: PathBuf::new(),
    };
    let server = ApiServer::start().await.unwrap();
    let kubectl = Kubectl {
        kubeconfig: server.kubeconfig_path().to_path_buf(),
        ..kubectl
    };
    let stub = StubKubelet::builder()
        .name(format!("kubelet-{version}"))
        .logs("default", "web", "app", "hello from web\nsecond line\n")
        .follow_interval(Duration::from_millis(100))
        .start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();

    // A node whose kubelet is the stub: address and port as a kubelet reports them.
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "worker-1"},
        "status": {
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": stub.addr().port()}},
        },
    }))
    .unwrap();
    Api::<Node>::all(server.client())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();

    let nodes = kubectl.ok(&["get", "nodes"]).await;
    assert!(nodes.contains("worker-1"), "{nodes}");

    // A watch running before the pod exists receives its events.
    let mut watch = kubectl.spawn(&["get", "pods", "-w", "--no-headers"]);
    let mut watch_lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !server
        .requests()
        .iter()
        .any(|r| r.verb == "watch" && r.resource == "pods")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "kubectl get pods -w never opened a watch"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pod = write_manifest(
        dir.path(),
        "pod.json",
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"nodeName": "worker-1", "containers": [{"name": "app", "image": "busybox"}]},
        }),
    )
    .await;
    let created = kubectl.ok(&["create", "-f", pod.to_str().unwrap()]).await;
    assert!(created.contains("pod/web created"), "{created}");
    read_until(&mut watch, &mut watch_lines, "the create event", |l| {
        l.starts_with("web ")
    })
    .await;
    kubectl.ok(&["label", "pod", "web", "tier=front"]).await;
    read_until(&mut watch, &mut watch_lines, "the update event", |l| {
        l.starts_with("web ")
    })
    .await;
    watch.kill().await.unwrap();

    // Logs through the proxy reach the stub.
    let logs = kubectl.ok(&["logs", "web"]).await;
    assert_eq!(logs, "hello from web\nsecond line\n");
    let tail = kubectl
        .ok(&["logs", "web", "--tail=1", "--timestamps"])
        .await;
    assert!(
        tail.ends_with(" second line\n") && tail.lines().count() == 1,
        "{tail}"
    );
    assert!(
        stub.requests()
            .contains(&"/containerLogs/default/web/app?tailLines=1&timestamps=true".to_string()),
        "{:?}",
        stub.requests()
    );

    // logs -f sees lines as the kubelet writes them, and leaving closes the stream.
    let mut follow = kubectl.spawn(&["logs", "-f", "web"]);
    let mut follow_lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    read_until(&mut follow, &mut follow_lines, "the first log line", |l| {
        l == "hello from web"
    })
    .await;
    let label = format!("kubelet-{version} default/web/app follow 2");
    read_until(&mut follow, &mut follow_lines, "a followed line", |l| {
        l == label
    })
    .await;
    follow.kill().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while stub.open_log_streams() != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the kubelet log stream outlived kubectl logs -f"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // exec with stdin: the stub echoes.
    let out = kubectl
        .run_with_stdin(&["exec", "-i", "web", "--", "cat"], Some(b"hi\n"))
        .await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "hi\n"),
        "stderr: {}",
        out.stderr
    );
    assert!(
        stub.sessions().iter().any(|s| s == expect_exec),
        "expected a session {expect_exec:?}, saw {:?}",
        stub.sessions()
    );
    // A non-zero exit code travels back through the error stream.
    let out = kubectl
        .run(&["exec", "web", "--", "sh", "-c", "exit 3"])
        .await;
    assert_eq!(out.code, 3, "{} {}", out.stdout, out.stderr);

    // port-forward: kubectl wants a running pod, as the kubelet would report it.
    Api::<Pod>::namespaced(server.client(), "default")
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
    // attach: the stub's process echoes what it is sent.
    let out = kubectl
        .run_with_stdin(&["attach", "-i", "web", "-c", "app"], Some(b"attached\n"))
        .await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "attached\n"),
        "stderr: {}",
        out.stderr
    );
    assert!(
        stub.requests()
            .iter()
            .any(|r| r == "/attach/default/web/app?error=1&input=1&output=1"),
        "{:?}",
        stub.requests()
    );

    // Bytes sent to the local port come back from the stub.
    let mut pf = kubectl.spawn(&["port-forward", "pod/web", ":8080", "--address", "127.0.0.1"]);
    let mut pf_lines = BufReader::new(pf.stdout.take().unwrap()).lines();
    let line = read_until(&mut pf, &mut pf_lines, "the forwarding line", |l| {
        l.starts_with("Forwarding from 127.0.0.1:")
    })
    .await;
    let local: u16 = line["Forwarding from 127.0.0.1:".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", local))
        .await
        .unwrap();
    tcp.write_all(b"ping through port-forward").await.unwrap();
    let mut buf = vec![0u8; 25];
    tokio::time::timeout(Duration::from_secs(20), tcp.read_exact(&mut buf))
        .await
        .expect("no echo through port-forward within 20 s")
        .unwrap();
    assert_eq!(&buf, b"ping through port-forward");
    drop(tcp);
    pf.kill().await.unwrap();
    assert!(
        stub.sessions().iter().any(|s| s == expect_port_forward),
        "{:?}",
        stub.sessions()
    );

    stub.shutdown().await;
    server.shutdown().await;
}

/// `kubectl drain` against the double: cordon, then `pods/eviction`
/// (`pkg/registry/core/pod/storage/eviction.go`) for each pod, waiting until a kubelet
/// (played here) completes the graceful deletions.
async fn kubectl_drain(version: &str) {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{DeleteParams, ListParams, Preconditions};
    let server = ApiServer::start().await.unwrap();
    let kubectl = Kubectl {
        bin: kubectl_bin(version),
        kubeconfig: server.kubeconfig_path().to_path_buf(),
    };
    let nodes: Api<Node> = Api::all(server.client());
    nodes
        .create(
            &PostParams::default(),
            &testkube::fixtures::kubelet_node("n1", 1),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    for name in ["a", "b"] {
        let p: Pod = serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox:1.36"}]}}))
        .unwrap();
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    // The kubelet: completes graceful deletions of its pods.
    let all: Api<Pod> = Api::all(server.client());
    let kubelet = tokio::spawn(async move {
        loop {
            if let Ok(list) = all.list(&ListParams::default()).await {
                for p in list.items {
                    if p.metadata.deletion_timestamp.is_some() {
                        let dp = DeleteParams {
                            grace_period_seconds: Some(0),
                            preconditions: Some(Preconditions {
                                uid: p.metadata.uid.clone(),
                                resource_version: None,
                            }),
                            ..Default::default()
                        };
                        let ns = p.metadata.namespace.clone().unwrap();
                        let api: Api<Pod> = Api::namespaced(all.clone().into_client(), &ns);
                        let _ = api.delete(p.metadata.name.as_deref().unwrap(), &dp).await;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let out = kubectl
        .ok(&[
            "drain",
            "n1",
            "--force",
            "--ignore-daemonsets",
            "--timeout=50s",
        ])
        .await;
    assert!(out.contains("drained"), "{out}");
    kubelet.abort();
    assert_eq!(
        nodes.get("n1").await.unwrap().spec.unwrap().unschedulable,
        Some(true)
    );
    assert!(
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let evictions = server
        .requests()
        .iter()
        .filter(|r| r.subresource.as_deref() == Some("eviction") && r.code == 201)
        .count();
    assert_eq!(evictions, 2, "one eviction per pod");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_27_drains_a_node_through_pods_eviction() {
    kubectl_drain("1.27").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_32_drains_a_node_through_pods_eviction() {
    kubectl_drain("1.32").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_27_speaks_spdy_through_the_proxy() {
    kubectl_journey(
        "1.27",
        "exec SPDY/3.1 v4.channel.k8s.io",
        "portForward SPDY/3.1 portforward.k8s.io",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_32_speaks_websocket_through_the_proxy() {
    kubectl_journey(
        "1.32",
        "exec websocket v5.channel.k8s.io",
        "portForward websocket SPDY/3.1+portforward.k8s.io",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_execs_and_port_forwards_over_websocket() {
    let python = Path::new("/usr/bin/python3");
    assert!(
        python.is_file(),
        "/usr/bin/python3 not found: apt-get install python3 python3-kubernetes"
    );
    let server = ApiServer::start().await.unwrap();
    let stub = StubKubelet::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "worker-py"},
        "status": {
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": stub.addr().port()}},
        },
    }))
    .unwrap();
    Api::<Node>::all(server.client())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "py", "namespace": "default"},
        "spec": {"nodeName": "worker-py", "containers": [{"name": "app", "image": "busybox"}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(server.client(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let script = r#"
import sys
from kubernetes import client, config
from kubernetes.stream import stream
config.load_kube_config(config_file=sys.argv[1])
api = client.CoreV1Api()
out = stream(api.connect_get_namespaced_pod_exec, "py", "default",
             command=["echo", "hello", "from", "python"],
             stderr=True, stdin=False, stdout=True, tty=False)
sys.stdout.write(out)

from kubernetes.stream import portforward
pf = portforward(api.connect_get_namespaced_pod_portforward, "py", "default", ports="8080")
sock = pf.socket(8080)
sock.setblocking(True)
sock.sendall(b"ping over websocket port-forward")
data = b""
while len(data) < 32:
    chunk = sock.recv(1024)
    if not chunk:
        break
    data += chunk
sys.stdout.write(data.decode() + "\n")
pf.close()
"#;
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(python)
            .arg("-c")
            .arg(script)
            .arg(server.kubeconfig_path())
            .output(),
    )
    .await
    .expect("python exec did not finish within 60 s")
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named 'kubernetes'"),
        "the kubernetes module is missing: apt-get install python3-kubernetes"
    );
    assert!(out.status.success(), "python exec failed: {stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "hello from python\nping over websocket port-forward\n"
    );
    assert!(
        stub.sessions()
            .iter()
            .any(|s| s.starts_with("exec websocket ")),
        "{:?}",
        stub.sessions()
    );
    assert!(
        stub.sessions()
            .iter()
            .any(|s| s == "portForward websocket v4.channel.k8s.io"),
        "{:?}",
        stub.sessions()
    );
    stub.shutdown().await;
    server.shutdown().await;
}

/// What a kube-rs Recorder writes (events.k8s.io/v1) is what `kubectl get events` and
/// `kubectl describe pod` read (core v1 Events selected by `involvedObject.*`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_shows_events_a_recorder_wrote() {
    use k8s_openapi::api::core::v1::ObjectReference;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let server = ApiServer::start().await.unwrap();
    let kubectl = Kubectl {
        bin: kubectl_bin("1.32"),
        kubeconfig: server.kubeconfig_path().to_path_buf(),
    };
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let p: Pod = serde_json::from_value(json!({"metadata": {"name": "web"},
        "spec": {"containers": [{"name": "c", "image": "busybox:1.36"}]}}))
    .unwrap();
    let p = pods.create(&PostParams::default(), &p).await.unwrap();
    let recorder = Recorder::new(
        server.client(),
        Reporter {
            controller: "example.com/probe".into(),
            instance: Some("probe-0".into()),
        },
    );
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: p.metadata.name.clone(),
        namespace: p.metadata.namespace.clone(),
        uid: p.metadata.uid.clone(),
        ..Default::default()
    };
    let ev = Event {
        type_: EventType::Warning,
        reason: "ProbeFailed".into(),
        note: Some("the probe timed out".into()),
        action: "Probe".into(),
        secondary: None,
    };
    recorder.publish(&ev, &reference).await.unwrap();
    let listed = kubectl
        .ok(&["get", "events", "-o", "jsonpath={.items[*].reason}"])
        .await;
    assert_eq!(listed.trim(), "ProbeFailed");
    // The table kubectl prints, from the server's columns (kube-apiserver's printEvent).
    let table = kubectl.ok(&["get", "events"]).await;
    let mut lines = table.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        header,
        ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
        "{table}"
    );
    let row = lines.next().unwrap_or_default();
    for cell in ["Warning", "ProbeFailed", "pod/web", "the probe timed out"] {
        assert!(row.contains(cell), "{cell} missing in:\n{table}");
    }
    let wide = kubectl.ok(&["get", "events", "-o", "wide"]).await;
    assert!(
        wide.lines().next().unwrap_or_default().contains("SOURCE"),
        "{wide}"
    );
    assert!(wide.contains("example.com/probe, probe-0"), "{wide}");
    let described = kubectl.ok(&["describe", "pod", "web"]).await;
    let events = described
        .split("Events:")
        .nth(1)
        .unwrap_or_else(|| panic!("no Events section in:\n{described}"));
    assert!(events.contains("ProbeFailed"), "{described}");
    assert!(events.contains("the probe timed out"), "{described}");
    assert!(events.contains("example.com/probe"), "{described}");
    server.shutdown().await;
}
