//! A third real client: the Debian python3-kubernetes module lists nodes and watches
//! them against the double, loading the kubeconfig it wrote.

use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;
use testkube::ApiServer;

use crate::conformance::node;

const SCRIPT: &str = r#"
import sys
from kubernetes import client, config, watch
config.load_kube_config(config_file=sys.argv[1])
v1 = client.CoreV1Api()
nodes = v1.list_node()
print("LIST", ",".join(sorted(n.metadata.name for n in nodes.items)), flush=True)
w = watch.Watch()
for ev in w.stream(v1.list_node, resource_version=nodes.metadata.resource_version, timeout_seconds=20):
    print("EVENT", ev["type"], ev["object"].metadata.name, flush=True)
    if ev["object"].metadata.name == "late":
        w.stop()
"#;

#[tokio::test]
async fn python_kubernetes_client_lists_and_watches_nodes() {
    let python = "/usr/bin/python3";
    assert!(
        std::path::Path::new(python).exists(),
        "{python} not found: apt-get install python3-kubernetes"
    );
    let s = ApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(s.client());
    nodes
        .create(&PostParams::default(), &node("early"))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("client.py");
    std::fs::write(&script, SCRIPT).unwrap();
    let mut child = tokio::process::Command::new(python)
        .arg(&script)
        .arg(s.kubeconfig_path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the python client listed within 30 s")
        .unwrap();
    assert_eq!(
        first.as_deref(),
        Some("LIST early"),
        "the python client must list the nodes"
    );
    // Wait until its watch is open before writing, so the event is not part of the list.
    for _ in 0..200 {
        if s.requests()
            .iter()
            .any(|r| r.verb == "watch" && r.resource == "nodes")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    nodes
        .create(&PostParams::default(), &node("late"))
        .await
        .unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the python watch delivered within 30 s")
        .unwrap();
    let out = child.wait_with_output().await.unwrap();
    assert_eq!(
        ev.as_deref(),
        Some("EVENT ADDED late"),
        "python stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "python stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
