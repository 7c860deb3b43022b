//! The guided tour: each step runs what a user would run (kubectl, stratum-server, an HTTP
//! probe), prints the command and its output, and says whether the result is what the
//! system promises.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, ensure};

use super::procs::Procs;
use super::{
    AGENT_HEALTH_PORT, RECONCILER_ADMIN, Sandbox, etcd_flags, kubectl, net, output, wait_for,
};

/// The pod the tour runs on the virtual node.
const POD: &str = "hello";
const GREETING: &str = "hello from a process on the virtual node";

/// Runs every step; returns the title of the first that failed, or `None`.
pub fn run(sbx: &Sandbox, procs: &mut Procs) -> Option<String> {
    type Step<'a> = (
        &'a str,
        Box<dyn Fn(&mut Procs) -> anyhow::Result<String> + 'a>,
    );
    let steps: Vec<Step> = vec![
        ("the nodes and their addresses", Box::new(|p| nodes(sbx, p))),
        ("a pod on the virtual node", Box::new(|p| pod(sbx, p))),
        ("the pod's logs", Box::new(|p| pod_logs(sbx, p))),
        ("an exec into the pod", Box::new(|_| exec(sbx))),
        (
            "logs from each worker's kubelet, through its ssh tunnel",
            Box::new(|p| worker_logs(sbx, p)),
        ),
        ("the agents' /readyz", Box::new(|p| readyz(sbx, p))),
        ("etcd health", Box::new(|_| etcd_health(sbx))),
        ("nodes diagnostics", Box::new(|_| diagnostics(sbx))),
    ];
    let total = steps.len();
    let mut first_failed = None;
    for (n, (title, f)) in steps.iter().enumerate() {
        println!("\n== step {}/{total}: {title}", n + 1);
        match f(procs) {
            Ok(shown) => {
                print!("{shown}");
                println!("-- ok: {title}");
            }
            Err(e) => {
                println!("-- FAILED: {title}: {e:#}");
                first_failed.get_or_insert_with(|| title.to_string());
            }
        }
    }
    first_failed
}

/// Deletes what the tour created, so the process provider ends its instances before the
/// manager stops.
pub fn cleanup(sbx: &Sandbox) {
    let mut hello = kubectl(&sbx.kubeconfig);
    hello.args([
        "delete",
        "pod",
        "--ignore-not-found",
        "--wait=true",
        "--timeout=30s",
        POD,
    ]);
    // The stub kubelets do not run containers, so nothing would confirm a graceful
    // deletion of the workers' probe pods: remove them at once.
    let mut probes = kubectl(&sbx.kubeconfig);
    probes.args([
        "delete",
        "pod",
        "--ignore-not-found",
        "--grace-period=0",
        "--force",
    ]);
    for w in &sbx.workers {
        probes.arg(format!("probe-{w}"));
    }
    for cmd in [hello, probes] {
        if let Err(e) = output(cmd) {
            eprintln!("sandbox: deleting the tour's pods: {e:#}");
        }
    }
}

/// `$ cmd` and its output, for the tour's transcript.
fn shown(cmd: &str, out: &str) -> String {
    format!(
        "$ {cmd}\n{out}{}",
        if out.ends_with('\n') { "" } else { "\n" }
    )
}

fn kubectl_out(sbx: &Sandbox, args: &[&str]) -> anyhow::Result<String> {
    let mut cmd = kubectl(&sbx.kubeconfig);
    cmd.args(args);
    output(cmd)
}

fn nodes(sbx: &Sandbox, procs: &mut Procs) -> anyhow::Result<String> {
    // Every worker carries its tunnel address (the reconciler's patch), and the virtual
    // node is there.
    wait_for(
        "every node registered with its tunnel address",
        Duration::from_secs(90),
        procs,
        || {
            let v: serde_json::Value =
                serde_json::from_str(&kubectl_out(sbx, &["get", "nodes", "-o", "json"])?)?;
            let items = v["items"].as_array().cloned().unwrap_or_default();
            let external = |name: &str| {
                items.iter().any(|n| {
                    n["metadata"]["name"] == name
                        && n["status"]["addresses"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|a| a["type"] == "ExternalIP")
                })
            };
            let virt = items
                .iter()
                .any(|n| n["metadata"]["name"] == "nebula-process");
            Ok((virt && sbx.workers.iter().all(|w| external(w))).then_some(()))
        },
    )?;
    Ok(shown(
        "kubectl get nodes -o wide",
        &kubectl_out(sbx, &["get", "nodes", "-o", "wide"])?,
    ))
}

fn pod(sbx: &Sandbox, procs: &mut Procs) -> anyhow::Result<String> {
    let manifest = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": POD, "namespace": "default"},
        "spec": {
            "nodeSelector": {"outpost.dhnt.io/provider": "process"},
            "tolerations": [{"key": "outpost.dhnt.io/provider", "operator": "Equal",
                             "value": "process", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "main", "image": "process",
                "command": ["sh", "-c", format!("echo {GREETING}; exec sleep 3600")]}],
        },
    });
    let file = sbx.dir.join("hello.json");
    std::fs::write(&file, manifest.to_string())?;
    let applied = kubectl_out(sbx, &["apply", "-f", &file.display().to_string()])?;
    wait_for("the pod Running", Duration::from_secs(60), procs, || {
        let phase = kubectl_out(sbx, &["get", "pod", POD, "-o", "jsonpath={.status.phase}"])?;
        Ok((phase == "Running").then_some(()))
    })?;
    let shown_pod = kubectl_out(sbx, &["get", "pod", POD, "-o", "wide"])?;
    ensure!(
        shown_pod.contains("nebula-process"),
        "the pod is not on the virtual node: {shown_pod}"
    );
    Ok(format!(
        "{}{}",
        shown("kubectl apply -f hello.json", &applied),
        shown(&format!("kubectl get pod {POD} -o wide"), &shown_pod)
    ))
}

fn pod_logs(sbx: &Sandbox, procs: &mut Procs) -> anyhow::Result<String> {
    let logs = wait_for(
        "the greeting in the logs",
        Duration::from_secs(20),
        procs,
        || {
            let logs = kubectl_out(sbx, &["logs", POD])?;
            Ok(logs.contains(GREETING).then_some(logs))
        },
    )?;
    Ok(shown(&format!("kubectl logs {POD}"), &logs))
}

fn exec(sbx: &Sandbox) -> anyhow::Result<String> {
    let out = kubectl_out(sbx, &["exec", POD, "--", "sh", "-c", "echo exec in pid $$"])?;
    ensure!(
        out.starts_with("exec in pid "),
        "unexpected exec output: {out}"
    );
    Ok(shown(
        &format!("kubectl exec {POD} -- sh -c 'echo exec in pid $$'"),
        &out,
    ))
}

fn worker_logs(sbx: &Sandbox, procs: &mut Procs) -> anyhow::Result<String> {
    let mut out = String::new();
    for w in &sbx.workers {
        let name = format!("probe-{w}");
        let manifest = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": w, "containers": [{"name": "main", "image": "stub"}]},
        });
        let file = sbx.dir.join(format!("{name}.json"));
        std::fs::write(&file, manifest.to_string())?;
        kubectl_out(sbx, &["apply", "-f", &file.display().to_string()])?;
        // The stub kubelet's lines name the kubelet that answered: the worker's own.
        let logs = wait_for(
            &format!("{w}'s kubelet answering through its tunnel"),
            Duration::from_secs(60),
            procs,
            || {
                let logs = kubectl_out(sbx, &["logs", &name])?;
                Ok(logs.contains(w.as_str()).then_some(logs))
            },
        )?;
        out.push_str(&shown(&format!("kubectl logs {name}"), &logs));
    }
    Ok(out)
}

/// A plain HTTP/1.0 GET: (status code, body).
fn http_get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let mut conn = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(conn, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    conn.read_to_string(&mut text)?;
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("no HTTP status from {addr}: {text}"))?;
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Ok((code, body))
}

fn readyz(sbx: &Sandbox, procs: &mut Procs) -> anyhow::Result<String> {
    let mut out = String::new();
    for (i, w) in sbx.workers.iter().enumerate() {
        let addr = format!("{}:{AGENT_HEALTH_PORT}", net::worker_ip(i as u8 + 1));
        let body = wait_for(
            &format!("{w}'s agent ready"),
            Duration::from_secs(60),
            procs,
            || {
                let (code, body) = http_get(&addr, "/readyz")?;
                Ok((code == 200).then_some(body))
            },
        )?;
        out.push_str(&shown(&format!("curl http://{addr}/readyz   # {w}"), &body));
    }
    Ok(out)
}

fn stratum(sbx: &Sandbox, args: &[String]) -> anyhow::Result<String> {
    let mut cmd = Command::new(&sbx.stratum);
    cmd.args(args);
    output(cmd)
}

fn etcd_health(sbx: &Sandbox) -> anyhow::Result<String> {
    let mut args = vec!["etcd".to_string(), "health".into()];
    args.extend(etcd_flags(&sbx.pki, &sbx.etcd_endpoints));
    let out = stratum(sbx, &args)?;
    let healthy = out
        .lines()
        .filter(|l| l.trim_end().ends_with(" ok"))
        .count();
    ensure!(healthy == 3, "expected three healthy members: {out}");
    Ok(shown(
        &format!(
            "stratum-server etcd health --endpoints {} ...",
            sbx.etcd_endpoints.join(",")
        ),
        &out,
    ))
}

fn diagnostics(sbx: &Sandbox) -> anyhow::Result<String> {
    let args: Vec<String> = [
        "nodes",
        "diagnostics",
        "--tunnel",
        "ssh",
        "--admin",
        &format!("http://{RECONCILER_ADMIN}"),
        "--kubeconfig",
        &sbx.kubeconfig.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let out = stratum(sbx, &args)?;
    for w in &sbx.workers {
        ensure!(
            out.contains(w.as_str()),
            "{w} missing from the diagnostics: {out}"
        );
    }
    Ok(shown(
        &format!("stratum-server nodes diagnostics --tunnel ssh --admin http://{RECONCILER_ADMIN}"),
        &out,
    ))
}
