//! `repoint --vip` against live TLS servers standing for the VIP: another cluster's
//! certificate, this cluster's without the VIP, and the right one; and Cilium's env patch
//! through the API double.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use ha::nodestate::{ClusterState, EtcdMember, NODE_STATE_VERSION, NodeState, Origin};
use ha::repoint::{self, RepointFailure, RepointRequest, Restarter, VipFault};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use kube::api::{Api, PostParams};

use crate::tls_backends::{self as tb, Subnet};

/// Records restarts; fails the units it is told to.
#[derive(Default)]
struct Recorder {
    fail: Vec<String>,
    done: Mutex<Vec<String>>,
}

impl Restarter for Recorder {
    fn restart(&self, unit: &str) -> Result<(), String> {
        self.done.lock().unwrap().push(unit.to_string());
        if self.fail.iter().any(|f| f == unit) {
            Err(format!("unit {unit} not found"))
        } else {
            Ok(())
        }
    }
}

fn node_state(pki_dir: &Path) -> NodeState {
    NodeState {
        version: NODE_STATE_VERSION,
        origin: Origin::Bootstrap,
        node_name: "cp1".into(),
        node_ip: "10.0.0.1".parse().unwrap(),
        pki_dir: pki_dir.to_path_buf(),
        api_server: "https://127.0.0.1:6443".into(),
        etcd: EtcdMember {
            name: "cp1".into(),
            client_url: "https://10.0.0.1:2379".into(),
            peer_url: "https://10.0.0.1:2380".into(),
            data_dir: "/data/etcd".into(),
            initial_cluster: "cp1=https://10.0.0.1:2380".into(),
            initial_cluster_state: ClusterState::New,
            member_id: None,
            learner: false,
        },
        cluster_endpoints: vec![],
    }
}

/// Every file under `dir`, path and bytes; not the maintenance lock files, whose content
/// names their last holder.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().unwrap().is_file())
        .filter(|e| !e.file_name().to_string_lossy().ends_with(".lock"))
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repoint_changes_nothing_unless_the_vip_serves_this_cluster() -> anyhow::Result<()> {
    let net = Subnet::next();
    let vip = net.ip(30);
    let root = tempfile::tempdir()?;
    let pki_dir = root.path().join("pki");
    let kc_dir = root.path().to_path_buf();
    let data_dir = root.path().join("data");
    std::fs::create_dir_all(&data_dir)?;
    pki::generate_shared(&pki_dir, false)?;
    pki::write_kubeconfigs(&pki_dir, &kc_dir, "https://127.0.0.1:6443", false)?;
    node_state(&pki_dir).save(&data_dir)?;
    let cluster_ca = pki::Ca::load(&pki_dir, "ca")?;

    let before_kc = snapshot(&kc_dir);
    let before_state = snapshot(&data_dir);
    let recorder = Recorder::default();

    let attempt = |port: u16| RepointRequest {
        vip,
        port,
        ca_file: pki_dir.join("ca.crt"),
        kubeconfig_dir: kc_dir.clone(),
        data_dir: Some(data_dir.clone()),
        restart: vec!["kubelet".into()],
        timeout: Duration::from_secs(5),
    };

    // Another cluster holds the VIP: its certificate comes from another CA.
    let other_ca = pki::Ca::generate("other-cluster-ca")?;
    let mut other = tb::Backend::start(
        vip,
        &tb::serving_cert(&other_ca, "apiserver", &[vip])?,
        "other",
    )
    .await?;
    let mut out = Vec::new();
    let err = repoint::node_repoint(&mut out, &attempt(other.addr.port()), &recorder)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            RepointFailure::VipDoesNotServe {
                fault: VipFault::OtherCa,
                ..
            }
        ),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("not issued by this cluster's CA") && text.contains("nothing was changed"),
        "{text}"
    );
    assert!(text.contains(&other.addr.to_string()), "{text}");
    other.kill().await;

    // A self-signed certificate (a CA certificate served as the leaf), as a quickly made
    // test cluster would serve: refused as well.
    let self_signed = pki::IssuedCert {
        cert_pem: other_ca.cert_pem().to_string(),
        key_pem: other_ca.key_pem(),
    };
    let mut selfs = tb::Backend::start(vip, &self_signed, "self-signed").await?;
    let err = repoint::node_repoint(&mut out, &attempt(selfs.addr.port()), &recorder)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            RepointFailure::VipDoesNotServe {
                fault: VipFault::OtherCa | VipFault::Untrusted(_),
                ..
            }
        ),
        "{err}"
    );
    selfs.kill().await;

    // This cluster's CA, but the certificate does not name the VIP.
    let mut no_san = tb::Backend::start(
        vip,
        &tb::serving_cert(&cluster_ca, "apiserver", &["10.9.9.9".parse()?])?,
        "no-san",
    )
    .await?;
    let err = repoint::node_repoint(&mut out, &attempt(no_san.addr.port()), &recorder)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            RepointFailure::VipDoesNotServe {
                fault: VipFault::NotForVip,
                ..
            }
        ),
        "{err}"
    );
    no_san.kill().await;

    // Nothing answers at all.
    let closed = std::net::TcpListener::bind((vip, 0))?.local_addr()?.port();
    let err = repoint::node_repoint(&mut out, &attempt(closed), &recorder)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            RepointFailure::VipDoesNotServe {
                fault: VipFault::Unreachable(_),
                ..
            }
        ),
        "{err}"
    );

    // Another maintenance command holds the node: refused, naming it.
    {
        let _held = ha::maintenance::NodeLock::acquire(&data_dir, "rejoin")?;
        let err = repoint::node_repoint(&mut out, &attempt(closed), &recorder)
            .await
            .unwrap_err();
        assert!(matches!(&err, RepointFailure::Locked(_)), "{err}");
        assert!(err.to_string().contains("rejoin"), "{err}");
    }

    // None of that touched a file or restarted anything.
    assert_eq!(snapshot(&kc_dir), before_kc);
    assert_eq!(snapshot(&data_dir), before_state);
    assert!(recorder.done.lock().unwrap().is_empty());

    // The right certificate: every kubeconfig now names the VIP, every other byte kept.
    let good = tb::Backend::start(
        vip,
        &tb::serving_cert(&cluster_ca, "apiserver", &[vip])?,
        "ours",
    )
    .await?;
    let failing = Recorder {
        fail: vec!["kubelet".into()],
        ..Default::default()
    };
    let req = attempt(good.addr.port());
    let report = repoint::node_repoint(&mut out, &req, &failing).await?;
    let server = format!("https://{vip}:{}", good.addr.port());
    assert_eq!(report.server, server);
    assert_eq!(report.vip.readyz_status, 200);
    assert_eq!(
        report.kubeconfigs.rewritten.len(),
        pki::KUBECONFIG_FILES.len()
    );
    for (name, old) in &before_kc {
        let new = std::fs::read(kc_dir.join(name))?;
        let want = String::from_utf8(old.clone())?.replace("https://127.0.0.1:6443", &server);
        assert_eq!(String::from_utf8(new)?, want, "{name}");
    }
    let state = NodeState::load(&data_dir)?.unwrap();
    assert_eq!(state.api_server, server);
    // A unit that did not restart is a warning beside a successful repoint.
    assert_eq!(report.warnings.len(), 1, "{:?}", report.warnings);
    assert!(report.warnings[0].contains("kubelet"));
    let progress = String::from_utf8(out)?;
    assert!(progress.contains("rewriting kubeconfigs"), "{progress}");

    // Again: nothing left to change, nothing written.
    let after = snapshot(&kc_dir);
    let report = repoint::node_repoint(&mut Vec::new(), &req, &recorder).await?;
    assert!(report.kubeconfigs.rewritten.is_empty());
    assert!(!report.kubeconfigs.state_recorded);
    assert_eq!(snapshot(&kc_dir), after);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cilium_env_is_patched_by_strategic_merge_and_an_unfinished_rollout_warns()
-> anyhow::Result<()> {
    let server = testkube::ApiServer::start().await?;
    let client = server.client();
    let ds: DaemonSet = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "cilium", "namespace": "kube-system"},
        "spec": {
            "selector": {"matchLabels": {"k8s-app": "cilium"}},
            "template": {
                "metadata": {"labels": {"k8s-app": "cilium"}},
                "spec": {
                    "initContainers": [
                        {"name": "config", "image": "cilium", "env": [
                            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                            {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}]},
                        {"name": "mount-bpf-fs", "image": "cilium"}
                    ],
                    "containers": [{"name": "cilium-agent", "image": "cilium", "env": [
                        {"name": "K8S_NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                        {"name": "KUBERNETES_SERVICE_PORT", "value": "6443"}]}]
                }
            }
        }
    }))?;
    let dep: Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "cilium-operator", "namespace": "kube-system"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"name": "cilium-operator"}},
            "template": {
                "metadata": {"labels": {"name": "cilium-operator"}},
                "spec": {"containers": [{"name": "cilium-operator", "image": "operator"}]}
            }
        }
    }))?;
    let ds_api: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    let dep_api: Api<Deployment> = Api::namespaced(client.clone(), "kube-system");
    ds_api.create(&PostParams::default(), &ds).await?;
    dep_api.create(&PostParams::default(), &dep).await?;
    server.clear_requests();

    let mut out = Vec::new();
    let report = repoint::repoint_cilium_with(
        &mut out,
        &client,
        "10.0.0.100",
        6443,
        Duration::from_millis(300),
    )
    .await?;
    assert_eq!(
        report.patched,
        vec!["daemonset/cilium", "deployment/cilium-operator"]
    );
    // No controller rolls these out in the API double: both rollouts are unfinished.
    assert_eq!(report.warnings.len(), 2, "{:?}", report.warnings);
    assert!(
        report
            .warnings
            .iter()
            .all(|w| w.contains("has not finished rolling out"))
    );

    let ds = ds_api.get("cilium").await?;
    // A template change is a spec change: the generation moves, and a rollout is complete
    // only once the controller has observed it (kube-apiserver's workload strategies).
    assert_eq!(ds.metadata.generation, Some(2));
    let pod = ds.spec.unwrap().template.spec.unwrap();
    let env = |c: &k8s_openapi::api::core::v1::Container| {
        c.env
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|e| (e.name, e.value))
            .collect::<Vec<_>>()
    };
    let agent = env(&pod.containers[0]);
    assert!(
        agent.contains(&("KUBERNETES_SERVICE_HOST".into(), Some("10.0.0.100".into()))),
        "{agent:?}"
    );
    // The strategic merge kept the other env entry (a merge patch would have replaced the
    // whole container list).
    assert!(agent.iter().any(|(n, _)| n == "K8S_NODE_NAME"), "{agent:?}");
    assert_eq!(agent.len(), 3, "{agent:?}");
    let inits = pod.init_containers.unwrap();
    assert!(
        env(&inits[0]).contains(&("KUBERNETES_SERVICE_HOST".into(), Some("10.0.0.100".into())))
    );
    assert!(
        inits[1].env.is_none(),
        "an init container without the env gains none"
    );
    let d = dep_api.get("cilium-operator").await?;
    let op = env(&d.spec.unwrap().template.spec.unwrap().containers[0]);
    assert!(
        op.contains(&("KUBERNETES_SERVICE_PORT".into(), Some("6443".into()))),
        "{op:?}"
    );

    let writes: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.is_write())
        .collect();
    let patches: Vec<_> = writes.iter().filter(|r| r.verb == "patch").collect();
    assert_eq!(patches.len(), 2, "{writes:?}");
    assert!(patches.iter().all(|r| r.code == 200), "{patches:?}");
    // Each patched object gets a Repointed Event, and nothing else is written.
    assert_eq!(writes.len(), 4, "{writes:?}");
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), "kube-system");
    let mut regarding: Vec<String> = events
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Repointed"))
        .filter_map(|e| {
            e.regarding
                .and_then(|r| Some(format!("{}/{}", r.kind?, r.name?)))
        })
        .collect();
    regarding.sort();
    assert_eq!(
        regarding,
        vec!["DaemonSet/cilium", "Deployment/cilium-operator"]
    );

    // Steady state: nothing to patch, nothing written.
    server.clear_requests();
    let report = repoint::repoint_cilium_with(
        &mut Vec::new(),
        &client,
        "10.0.0.100",
        6443,
        Duration::from_millis(300),
    )
    .await?;
    assert!(report.patched.is_empty());
    assert_eq!(report.unchanged.len(), 2);
    assert!(server.requests().iter().all(|r| !r.is_write()));
    Ok(())
}
