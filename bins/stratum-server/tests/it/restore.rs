//! Disaster recovery as processes: a three-member control plane (real etcd 3.4 members
//! supervised by `stratum-server up`/`join`, mTLS), `snapshot save`, `snapshot restore` on
//! the seed, `rejoin` of the other two (one of them SIGKILLed half way and re-run), and the
//! data read back from every member. And the node locks between real processes.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use etcd_client::GetOptions;
use nix::sys::signal::Signal;

use crate::ha_cluster::{Cluster, Node, Proc, kill_etcd_of, spawn};

const KEYS: usize = 25;

fn etcdctl() -> anyhow::Result<std::path::PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("etcdctl"))
        .find(|p| p.is_file())
        .context("etcdctl not found on PATH: apt-get install etcd-client")
}

/// A client bound to one member only, so a read is that member's answer.
async fn client_of(c: &Cluster, url: &str) -> anyhow::Result<etcd_client::Client> {
    let tls = crate::ha_cluster::client_tls(c)?;
    Ok(etcd_client::Client::connect(
        [url],
        Some(
            etcd_client::ConnectOptions::new()
                .with_tls(tls)
                .with_connect_timeout(Duration::from_secs(3))
                .with_timeout(Duration::from_secs(5)),
        ),
    )
    .await?)
}

fn run(args: &[String]) -> anyhow::Result<(bool, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_stratum-server"))
        .args(args)
        .env_remove("KUBECONFIG")
        .env("RUST_LOG", "info")
        .output()?;
    Ok((
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}

fn s(p: impl AsRef<std::path::Path>) -> String {
    p.as_ref().display().to_string()
}

fn rejoin_args(c: &Cluster, i: usize) -> Vec<String> {
    let n: &Node = &c.nodes[i];
    vec![
        "rejoin".into(),
        "--server".into(),
        c.nodes[0].client_url.clone(),
        "--data-dir".into(),
        s(n.data()),
        "--config".into(),
        s(n.config()),
    ]
}

async fn stop(p: &mut Proc) -> anyhow::Result<()> {
    p.signal(Signal::SIGTERM);
    let st = p.wait().await?;
    ensure!(st.success(), "{} exited {st}:\n{}", p.what, p.log());
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_restored_on_the_seed_and_rejoined_by_the_others_keeps_the_data()
-> anyhow::Result<()> {
    let etcdctl = etcdctl()?;
    let mut c = Cluster::new().await?;
    let mut p1 = c.bootstrap().await?;
    let join = c.mint("1h").await?;
    c.plan(None, "60s")?;
    let mut p2 = c.join(1, &join, &[])?;
    c.wait_voters(&["cp1", "cp2"], &[0], &mut [&mut p1, &mut p2])
        .await?;
    c.plan(None, "60s")?;
    let mut p3 = c.join(2, &join, &[])?;
    c.wait_voters(
        &["cp1", "cp2", "cp3"],
        &[0, 1],
        &mut [&mut p1, &mut p2, &mut p3],
    )
    .await?;

    let mut kv = client_of(&c, &c.nodes[1].client_url).await?;
    for i in 0..KEYS {
        kv.put(
            format!("/restore-test/key-{i:02}"),
            format!("value-{i}"),
            None,
        )
        .await?;
    }

    // snapshot save through the CLI, over mTLS, from the members' endpoints.
    let pki = c.nodes[0].pki();
    let file = c.dir.path().join("backup/etcd.snap");
    let (ok, out) = run(&[
        "snapshot".into(),
        "save".into(),
        "--endpoints".into(),
        c.endpoints(&[0, 1, 2]).join(","),
        "--cacert".into(),
        s(pki.join("etcd/ca.crt")),
        "--cert".into(),
        s(pki.join("apiserver-etcd-client.crt")),
        "--key".into(),
        s(pki.join("apiserver-etcd-client.key")),
        s(&file),
    ])?;
    ensure!(ok, "snapshot save: {out}");
    ensure!(out.contains("snapshot saved to"), "{out}");
    let status = Command::new(&etcdctl)
        .env("ETCDCTL_API", "3")
        .args(["snapshot", "status", "-w", "json"])
        .arg(&file)
        .output()?;
    ensure!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&status.stdout)?;
    ensure!(
        status["totalKey"].as_u64().unwrap_or(0) >= KEYS as u64,
        "{status}"
    );
    // Written after the snapshot: not restored.
    kv.put("/restore-test/after", "lost", None).await?;

    // A restore while `up` runs this node's etcd refuses, naming that process.
    let restore = vec![
        "snapshot".to_string(),
        "restore".into(),
        "--data-dir".into(),
        s(c.nodes[0].data()),
        s(&file),
    ];
    let (ok, out) = run(&restore)?;
    ensure!(!ok, "a restore under a running node went ahead: {out}");
    ensure!(
        out.contains(&format!("`stratum-server up` (pid {}", p1.child.id())),
        "{out}"
    );

    // Stop the whole control plane, restore the seed, start it: one member.
    for p in [&mut p3, &mut p2, &mut p1] {
        stop(p).await?;
    }
    let (ok, out) = run(&restore)?;
    ensure!(ok, "snapshot restore: {out}");
    ensure!(out.contains("new single-member cluster"), "{out}");
    let mut p1 = c.up(0)?;
    let members = c.wait_voters(&["cp1"], &[0], &mut [&mut p1]).await?;
    ensure!(members.len() == 1, "{members:?}");

    // cp2's rejoin is SIGKILLed once its learner add is journaled; its etcd goes with it,
    // as on a node that crashed.
    let mut r2 = spawn("rejoin cp2", &rejoin_args(&c, 1), &[])?;
    r2.wait_log(" added").await?;
    r2.signal(Signal::SIGKILL);
    r2.wait().await?;
    kill_etcd_of(&c.nodes[1])?;
    let journal = c.nodes[1].data().join("rejoin.json");
    ensure!(
        journal.exists(),
        "the journal survives the kill:\n{}",
        r2.log()
    );
    // The re-run resumes from the journal, completes, and runs the node.
    let mut r2 = spawn("rejoin cp2 (re-run)", &rejoin_args(&c, 1), &[])?;
    r2.wait_log("running this node").await?;
    let log = r2.log();
    ensure!(log.contains("resuming the rejoin"), "{log}");
    ensure!(log.contains("promoted to a voting member"), "{log}");
    ensure!(!journal.exists(), "the journal is cleared at the end");
    // While it runs, another rejoin of that node refuses, naming it.
    let (ok, out) = run(&rejoin_args(&c, 1))?;
    ensure!(
        !ok && out.contains(&format!("(pid {}", r2.child.id())),
        "{out}"
    );

    // cp3 rejoins in one go: its old data is moved aside, not deleted.
    let mut r3 = spawn("rejoin cp3", &rejoin_args(&c, 2), &[])?;
    r3.wait_log("running this node").await?;
    ensure!(
        r3.log().contains("moved the old cluster's etcd data aside"),
        "{}",
        r3.log()
    );
    let kept = std::fs::read_dir(c.nodes[2].data())?.flatten().any(|e| {
        e.file_name()
            .to_string_lossy()
            .starts_with("etcd.before-rejoin-")
    });
    ensure!(kept, "old data kept aside");

    let members = c
        .wait_voters(
            &["cp1", "cp2", "cp3"],
            &[0],
            &mut [&mut p1, &mut r2, &mut r3],
        )
        .await?;
    // No stray member: exactly the three, each once.
    ensure!(members.len() == 3, "{members:?}");
    c.wait_healthy(&[0, 1, 2]).await?;

    // Every member holds the data written before the snapshot, and not what came after.
    for node in &c.nodes {
        let mut kv = client_of(&c, &node.client_url).await?;
        let got = kv
            .get(
                "/restore-test/key-",
                Some(GetOptions::new().with_prefix().with_serializable()),
            )
            .await?;
        ensure!(
            got.kvs().len() == KEYS,
            "{} holds {} keys",
            node.name,
            got.kvs().len()
        );
        for (i, kv) in got.kvs().iter().enumerate() {
            ensure!(
                kv.value() == format!("value-{i}").as_bytes(),
                "{}",
                node.name
            );
        }
        let after = kv
            .get(
                "/restore-test/after",
                Some(GetOptions::new().with_serializable()),
            )
            .await?;
        ensure!(after.kvs().is_empty(), "{}", node.name);
    }
    Ok(())
}

/// Two maintenance commands at once, in separate processes: this test process holds the
/// node maintenance lock (a `flock` belongs to the open file description, so the binary's
/// own acquisition is a real second holder), and each maintenance command refuses naming
/// it, having changed nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_maintenance_command_refuses_naming_the_first() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let held = ha::maintenance::NodeLock::acquire(&data, "snapshot restore")?;
    let holder = format!(
        "`stratum-server snapshot restore` (pid {}",
        std::process::id()
    );
    let snap = dir.path().join("x.snap");
    std::fs::write(&snap, b"not read")?;
    let api = testkube::ApiServer::start().await?;
    for args in [
        vec!["rejoin", "--server", "127.0.0.1", "--data-dir", &s(&data)],
        vec!["snapshot", "restore", "--data-dir", &s(&data), &s(&snap)],
        vec![
            "certs",
            "rekey",
            "--data-dir",
            &s(&data),
            "--kubeconfig",
            &s(api.kubeconfig_path()),
        ],
    ] {
        let args: Vec<String> = args.into_iter().map(String::from).collect();
        let (ok, out) = run(&args)?;
        ensure!(!ok, "{args:?} went ahead: {out}");
        ensure!(
            out.contains(&holder) && out.contains("the node maintenance lock"),
            "{args:?}: {out}"
        );
    }
    // Nothing was published by the refused rekey.
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(api.client(), "kube-system");
    ensure!(secrets.get_opt("stratum-certs").await?.is_none());
    drop(held);
    // Released: the next command gets past the lock (and stops at what it lacks).
    let (ok, out) = run(&[
        "rejoin".into(),
        "--server".into(),
        "127.0.0.1".into(),
        "--data-dir".into(),
        s(&data),
    ])?;
    ensure!(!ok && out.contains("has no node state"), "{out}");
    Ok(())
}

/// Gives node `i` the shared PKI of node 0 (its own leaves are issued by its `up`).
fn share_pki(c: &Cluster, i: usize) -> anyhow::Result<()> {
    for rel in pki::SHARED_FILES {
        let to = c.nodes[i].pki().join(rel);
        std::fs::create_dir_all(to.parent().context("parent")?)?;
        std::fs::copy(c.nodes[0].pki().join(rel), &to)?;
    }
    Ok(())
}

/// A rejoin refuses to wipe a member of an old cluster that still has quorum, having
/// changed nothing; `--force` goes ahead. Three single-member clusters from one PKI: cp1
/// is the "old" cluster (running, quorate), cp2 the restored seed, cp3 the node whose
/// state says it was a member of cp1's cluster.
#[tokio::test(flavor = "multi_thread")]
async fn a_rejoin_refuses_while_the_old_cluster_has_quorum_unless_forced() -> anyhow::Result<()> {
    let mut c = Cluster::new().await?;
    let mut p1 = c.bootstrap().await?;
    c.plan(None, "60s")?;
    c.plan(None, "60s")?;
    share_pki(&c, 1)?;
    share_pki(&c, 2)?;
    let mut seed = c.up(1)?;
    seed.wait_log("bootstrap objects in place").await?;
    let mut p3 = c.up(2)?;
    p3.wait_log("bootstrap objects in place").await?;
    stop(&mut p3).await?;
    // cp3 recorded cp1's cluster when it joined it.
    let state_file = c.nodes[2].data().join("node-state.json");
    let mut state: serde_json::Value = serde_json::from_slice(&std::fs::read(&state_file)?)?;
    state["cluster_endpoints"] = serde_json::json!([c.nodes[0].client_url]);
    std::fs::write(&state_file, serde_json::to_vec_pretty(&state)?)?;
    let before = std::fs::read_dir(c.nodes[2].data().join("etcd"))?.count();

    let mut args = vec![
        "rejoin".to_string(),
        "--server".into(),
        c.nodes[1].client_url.clone(),
        "--data-dir".into(),
        s(c.nodes[2].data()),
        "--config".into(),
        s(c.nodes[2].config()),
    ];
    let (ok, out) = run(&args)?;
    ensure!(!ok, "a rejoin wiped a member of a quorate cluster: {out}");
    ensure!(
        out.contains("the old etcd cluster still has quorum")
            && out.contains(&c.nodes[0].client_url),
        "{out}"
    );
    ensure!(std::fs::read_dir(c.nodes[2].data().join("etcd"))?.count() == before);
    ensure!(!c.nodes[2].data().join("rejoin.json").exists());

    args.push("--force".into());
    let mut forced = spawn("rejoin --force", &args, &[])?;
    forced.wait_log("running this node").await?;
    ensure!(
        forced.log().contains("going ahead because of --force"),
        "{}",
        forced.log()
    );
    let members = c
        .wait_voters(&["cp2", "cp3"], &[1], &mut [&mut seed, &mut forced])
        .await?;
    ensure!(members.len() == 2, "{members:?}");
    stop(&mut p1).await?;
    Ok(())
}
