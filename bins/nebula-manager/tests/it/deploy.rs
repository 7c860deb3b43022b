//! The deploy manifests: kubectl applies them to the API double, and every request the
//! manager makes during a pod's life is allowed by the RBAC rules they grant.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

async fn http_get(port: u16, path: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut conn = loop {
        match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Ok(c) => break c,
            Err(e) if tokio::time::Instant::now() > deadline => return Err(e.into()),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    conn.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut out = String::new();
    conn.read_to_string(&mut out).await?;
    Ok(out)
}

fn manifest() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/deploy/nebula-manager.yaml")
}

fn kubectl() -> anyhow::Result<PathBuf> {
    let out = Command::new("sh")
        .args(["-c", "command -v kubectl"])
        .output()
        .context("looking for kubectl")?;
    if !out.status.success() {
        bail!("kubectl is not on PATH: install kubectl (1.27-1.33) to run this test");
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// (namespace or None for cluster-wide, resource, verb) triples the manifests grant.
fn grants() -> anyhow::Result<Vec<(Option<String>, String, String)>> {
    let text = std::fs::read_to_string(manifest())?;
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v: Value = serde::Deserialize::deserialize(doc)?;
        let kind = v["kind"].as_str().unwrap_or_default();
        if kind != "ClusterRole" && kind != "Role" {
            continue;
        }
        let ns = v["metadata"]["namespace"].as_str().map(str::to_string);
        for rule in v["rules"].as_array().into_iter().flatten() {
            for r in rule["resources"].as_array().into_iter().flatten() {
                for verb in rule["verbs"].as_array().into_iter().flatten() {
                    out.push((
                        ns.clone(),
                        r.as_str().unwrap_or_default().to_string(),
                        verb.as_str().unwrap_or_default().to_string(),
                    ));
                }
            }
        }
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_apply_and_grant_every_request_the_manager_makes() -> anyhow::Result<()> {
    let server = testkube::ApiServer::start().await?;
    // Async: the API double serves from this test's runtime.
    let out = tokio::process::Command::new(kubectl()?)
        .arg("--kubeconfig")
        .arg(server.kubeconfig_path())
        .args(["apply", "-f"])
        .arg(manifest())
        .output()
        .await?;
    assert!(
        out.status.success(),
        "kubectl apply failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deploy: Api<Deployment> = Api::namespaced(server.client(), "nebula-system");
    let d = deploy.get("nebula-manager").await?;
    let container = &d.spec.unwrap().template.spec.unwrap().containers[0];
    let pod_ip = container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "POD_IP")
        .unwrap();
    assert_eq!(
        pod_ip
            .value_from
            .as_ref()
            .unwrap()
            .field_ref
            .as_ref()
            .unwrap()
            .field_path,
        "status.podIP"
    );
    assert_eq!(container.args.as_ref().unwrap()[0], "run");

    // A pod's whole life through the real binary, then: was every request granted?
    server.clear_requests();
    let state = crate::state::state_dir();
    let (health, admin) = (free_port()?, free_port()?);
    let mut manager = Command::new(env!("CARGO_BIN_EXE_nebula-manager"))
        .args(["run", "--provider", "process", "--leader-elect"])
        .arg(format!("--health-listen=127.0.0.1:{health}"))
        .arg(format!("--admin-listen=127.0.0.1:{admin}"))
        .arg("--kubelet-listen=127.0.0.1:0")
        .arg("--kubeconfig")
        .arg(server.kubeconfig_path())
        .arg("--state-dir")
        .arg(state.path())
        .stdout(Stdio::null())
        .spawn()?;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let p: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "rbac", "namespace": "default"},
        "spec": {"nodeName": "nebula-process", "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "main", "image": "none", "command": ["sleep", "1000"]}]},
    }))?;
    pods.create(&PostParams::default(), &p).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let p = pods.get("rbac").await?;
        if p.status.and_then(|s| s.phase).as_deref() == Some("Running") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the pod never ran");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The probe listener says ready; the admin listener counts what happened.
    let ready = http_get(health, "/readyz").await?;
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    let metrics = loop {
        let m = http_get(admin, "/metrics").await?;
        if m.contains("vnode_pods{phase=\"Running\"} 1") {
            break m;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "metrics never showed the pod: {m}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(metrics.contains("vnode_provisions_total 1"), "{metrics}");
    pods.delete("rbac", &DeleteParams::default()).await?;
    while pods.get_opt("rbac").await?.is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pod was never deleted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = manager.kill();
    let _ = manager.wait();

    let grants = grants()?;
    let mut denied = Vec::new();
    for r in server.requests() {
        if r.resource.is_empty() {
            continue;
        }
        // The test's own calls are the pod create/get/delete above.
        if r.resource == "pods"
            && r.name.as_deref() == Some("rbac")
            && r.subresource.is_none()
            && matches!(r.verb.as_str(), "get" | "create")
        {
            continue;
        }
        let resource = match &r.subresource {
            Some(sub) => format!("{}/{sub}", r.resource),
            None => r.resource.clone(),
        };
        let ok = grants.iter().any(|(ns, res, verb)| {
            res == &resource && verb == &r.verb && (ns.is_none() || ns == &r.namespace)
        });
        if !ok {
            denied.push(format!("{} {} in {:?}", r.verb, resource, r.namespace));
        }
    }
    denied.sort();
    denied.dedup();
    assert!(
        denied.is_empty(),
        "requests the manifests do not grant: {denied:?}"
    );
    Ok(())
}
