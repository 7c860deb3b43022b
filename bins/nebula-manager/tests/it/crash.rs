//! `kill -9` of the manager at every crash point of provisioning and deletion: after a
//! restart, exactly one process per live pod, none for deleted pods.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

pub(crate) const DEADLINE: Duration = Duration::from_secs(90);

pub(crate) struct Manager(pub(crate) Child);

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn start(
    kubeconfig: &Path,
    state: &Path,
    crash_at: Option<&str>,
) -> anyhow::Result<Manager> {
    start_with(kubeconfig, state, crash_at, &[])
}

pub(crate) fn start_with(
    kubeconfig: &Path,
    state: &Path,
    crash_at: Option<&str>,
    extra: &[&str],
) -> anyhow::Result<Manager> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nebula-manager"));
    cmd.args([
        "run",
        "--provider",
        "process",
        "--health-listen",
        "127.0.0.1:0",
    ])
    .args([
        "--admin-listen",
        "127.0.0.1:0",
        "--kubelet-listen",
        "127.0.0.1:0",
    ])
    .arg("--kubeconfig")
    .arg(kubeconfig)
    .arg("--state-dir")
    .arg(state)
    .env("POD_IP", "127.0.0.1")
    .env("RUST_LOG", "vnode=info")
    .stdout(Stdio::null())
    .env_remove(vnode::manager::CRASH_ENV);
    cmd.args(extra);
    if let Some(point) = crash_at {
        cmd.env(vnode::manager::CRASH_ENV, point);
    }
    Ok(Manager(cmd.spawn().context("starting nebula-manager")?))
}

pub(crate) fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": "nebula-process",
            "terminationGracePeriodSeconds": 5,
            "containers": [{"name": "main", "image": "none", "command": ["sleep", "1000"]}],
        },
    }))
    .expect("a valid pod")
}

/// Live process-group leaders tagged with a claim, by claim.
pub(crate) fn tagged_processes() -> BTreeMap<String, Vec<i32>> {
    let mut out: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat.contains(") Z ") {
            continue;
        }
        let leader = nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(pid))).ok()
            == Some(nix::unistd::Pid::from_raw(pid));
        for var in environ.split(|b| *b == 0) {
            if let Some(claim) = var.strip_prefix(b"NEBULA_CLAIM=")
                && leader
            {
                out.entry(String::from_utf8_lossy(claim).into_owned())
                    .or_default()
                    .push(pid);
            }
        }
    }
    out
}

pub(crate) fn kill_claims(claims: &[String]) {
    for (claim, pids) in tagged_processes() {
        if claims.contains(&claim) {
            for pid in pids {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

pub(crate) async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        if let Ok(Some(v)) = check().await {
            return Ok(v);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(crate) async fn running(pods: &Api<Pod>, name: &str) -> anyhow::Result<Pod> {
    wait_for(&format!("{name} Running"), || async {
        Ok(pods.get_opt(name).await?.filter(|p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                && p.metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(::common::keys::INSTANCE_ID_ANNOTATION))
        }))
    })
    .await
}

pub(crate) async fn gone(pods: &Api<Pod>, name: &str) -> anyhow::Result<()> {
    wait_for(&format!("{name} gone"), || async {
        Ok(pods.get_opt(name).await?.is_none().then_some(()))
    })
    .await
}

async fn crash_at(point: vnode::CrashPoint) -> anyhow::Result<()> {
    let server = testkube::ApiServer::start().await?;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let state = crate::state::state_dir();
    let mut claims = Vec::new();
    let result = async {
        let mut first = start(server.kubeconfig_path(), state.path(), Some(point.as_str()))?;
        let deleting = point == vnode::CrashPoint::AfterTerminate;
        if deleting {
            let v = pods.create(&PostParams::default(), &pod("victim")).await?;
            claims.push(vnode::claim_name(&v).unwrap());
            running(&pods, "victim").await?;
            pods.delete("victim", &DeleteParams::default()).await?;
        } else {
            let a = pods.create(&PostParams::default(), &pod("a")).await?;
            claims.push(vnode::claim_name(&a).unwrap());
        }
        // The manager kills itself with SIGKILL at the crash point.
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let status = loop {
            if let Some(status) = first.0.try_wait()? {
                break status;
            }
            if tokio::time::Instant::now() > deadline {
                bail!("{point:?}: the manager did not die at the crash point");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(9),
            "{point:?}: killed by SIGKILL, got {status:?}"
        );

        // While it is down: a new pod, and (for provisioning points) a pod force-deleted.
        let late = pods.create(&PostParams::default(), &pod("late")).await?;
        claims.push(vnode::claim_name(&late).unwrap());
        let _second = start(server.kubeconfig_path(), state.path(), None)?;
        running(&pods, "late").await?;
        let mut live = vec![vnode::claim_name(&late).unwrap()];
        if deleting {
            gone(&pods, "victim").await?;
        } else {
            let a = running(&pods, "a").await?;
            live.push(vnode::claim_name(&a).unwrap());
        }
        live.sort();
        let found = wait_for("one process per live pod", || async {
            let procs = tagged_processes();
            let ours: BTreeMap<String, Vec<i32>> = procs
                .into_iter()
                .filter(|(c, _)| claims.contains(c))
                .collect();
            let keys: Vec<String> = ours.keys().cloned().collect();
            Ok((keys == live && ours.values().all(|p| p.len() == 1)).then_some(ours))
        })
        .await
        .with_context(|| format!("{point:?}: processes {:?}", tagged_processes()))?;
        assert_eq!(found.len(), live.len());
        // Deleting the pods through the restarted manager ends the processes.
        for name in ["a", "late"] {
            let _ = pods.delete(name, &DeleteParams::default()).await;
        }
        for name in ["a", "late"] {
            gone(&pods, name).await?;
        }
        wait_for("no process left", || async {
            let procs = tagged_processes();
            Ok((!procs.keys().any(|c| claims.contains(c))).then_some(()))
        })
        .await?;
        Ok::<(), anyhow::Error>(())
    }
    .await;
    kill_claims(&claims);
    result.with_context(|| format!("crash point {point:?}"))
}

#[tokio::test]
async fn kill_9_at_every_crash_point_leaves_one_process_per_live_pod() -> anyhow::Result<()> {
    for point in vnode::CrashPoint::ALL {
        crash_at(point).await?;
    }
    Ok(())
}
