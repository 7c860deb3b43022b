//! kubectl against the API double's core (discovery, validation, typed creates): every
//! kubectl version on the machine must be able to create and read objects without flags
//! such as `--validate=false`.

use std::path::PathBuf;
use std::process::Command;

use testkube::ApiServer;

fn kubectl(version: &str) -> PathBuf {
    let out = Command::new("sh")
        .args(["-c", "dirname \"$(readlink -f \"$(command -v gcloud)\")\""])
        .output()
        .expect("running sh to locate gcloud");
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        .join(format!("kubectl.{version}"));
    assert!(
        p.exists(),
        "kubectl {version} not found at {} (it ships beside gcloud: `gcloud components install kubectl`)",
        p.display()
    );
    p
}

fn run(bin: &PathBuf, kubeconfig: &std::path::Path, args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write;
    let mut child = Command::new(bin)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", kubeconfig.parent().unwrap())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn kubectl");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const MANIFEST: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: n-VERSION}
status:
  addresses: [{type: InternalIP, address: 127.0.0.1}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cm-VERSION, namespace: default}
data: {a: b}
"#;

async fn journey(version: &str) {
    let bin = kubectl(version);
    let s = ApiServer::start().await.unwrap();
    let kc = s.kubeconfig_path().to_path_buf();
    let tag = version.replace('.', "-");
    let manifest = MANIFEST.replace("VERSION", &tag);
    let (bin2, kc2) = (bin.clone(), kc.clone());
    // kubectl blocks; run it off the runtime's worker threads.
    let out = tokio::task::spawn_blocking(move || {
        let mut out = run(&bin2, &kc2, &["create", "-f", "-"], Some(&manifest));
        out += &run(&bin2, &kc2, &["get", "nodes", "-o", "name"], None);
        // Typed creates: protobuf bodies from kubectl 1.32 on.
        out += &run(&bin2, &kc2, &["create", "namespace", "team"], None);
        out += &run(
            &bin2,
            &kc2,
            &[
                "-n",
                "team",
                "create",
                "configmap",
                "c",
                "--from-literal=k=v",
            ],
            None,
        );
        out += &run(
            &bin2,
            &kc2,
            &[
                "-n",
                "team",
                "get",
                "configmap",
                "c",
                "-o",
                "jsonpath={.data.k}",
            ],
            None,
        );
        out += "\n";
        out += &run(&bin2, &kc2, &["auth", "can-i", "delete", "nodes"], None);
        out += &run(
            &bin2,
            &kc2,
            &[
                "api-resources",
                "--api-group=coordination.k8s.io",
                "-o",
                "name",
            ],
            None,
        );
        out
    })
    .await
    .unwrap();
    assert!(out.contains(&format!("node/n-{tag} created")), "{out}");
    assert!(
        out.contains(&format!("configmap/cm-{tag} created")),
        "{out}"
    );
    assert!(out.contains(&format!("node/n-{tag}\n")), "{out}");
    assert!(out.contains("namespace/team created"), "{out}");
    assert!(out.contains("configmap/c created\nv\n"), "{out}");
    assert!(out.contains("yes\n"), "{out}");
    assert!(out.contains("leases.coordination.k8s.io"), "{out}");
    let writes: Vec<String> = s
        .requests()
        .into_iter()
        .filter(|r| r.is_write())
        .map(|r| format!("{} {}", r.verb, r.resource))
        .collect();
    assert!(
        writes.contains(&"create namespaces".to_string()),
        "{writes:?}"
    );
}

#[tokio::test]
async fn kubectl_1_27_creates_and_reads_objects() {
    journey("1.27").await;
}

#[tokio::test]
async fn kubectl_1_32_creates_and_reads_objects_with_protobuf_bodies() {
    journey("1.32").await;
}

#[tokio::test]
async fn kubectl_1_33_creates_and_reads_objects_with_protobuf_bodies() {
    journey("1.33").await;
}
