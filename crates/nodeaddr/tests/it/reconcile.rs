//! `Reconciler::once` and `diagnostics` against the API double.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition};
use kube::api::{Api, PostParams};
use nodeaddr::{
    NODE_ARGS_ANNOTATION, Reconciler, SkipReason, first_external_ip, kubelet_port_for_node,
    loopback_candidate, observed_kubelet_port,
};
use testkube::{ApiServer, Fault, FaultKind};

use crate::common::*;

#[tokio::test]
async fn first_pass_patches_every_routed_node_and_the_second_writes_nothing() {
    install_crypto();
    let server = ApiServer::start().await.unwrap();
    let api: Api<Node> = Api::all(server.client());
    let names: Vec<String> = (0..12).map(|i| format!("worker-{i}")).collect();
    create_nodes(
        &api,
        names
            .iter()
            .enumerate()
            .map(|(i, n)| kubelet_node(n, i as u8 + 1))
            .chain([virtual_node("gpu-provider")]),
    )
    .await;
    let r = Reconciler::new(server.client());

    let before = r.diagnostics().await.unwrap();
    assert!(
        before
            .iter()
            .filter(|d| d.skipped.is_none())
            .all(|d| !d.patched)
    );
    server.clear_requests();

    let report = r.once().await.unwrap();
    assert_eq!(report.nodes, 13);
    assert_eq!(report.skipped, 1);
    assert_eq!(report.writes, 12);
    let writes: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|q| q.is_write() && q.resource == "nodes")
        .collect();
    assert_eq!(writes.len(), 12, "{writes:#?}");
    // One Kubernetes Event per repaired node, from the reconciler, about that node.
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(server.client(), "default");
    let listed = events.list(&Default::default()).await.unwrap().items;
    assert_eq!(listed.len(), 12, "{listed:#?}");
    for e in &listed {
        assert_eq!(e.reason.as_deref(), Some("KubeletRouteRepaired"));
        assert_eq!(
            e.reporting_controller.as_deref(),
            Some(nodeaddr::EVENT_CONTROLLER)
        );
        let regarding = e.regarding.as_ref().unwrap();
        assert_eq!(regarding.kind.as_deref(), Some("Node"));
        let name = regarding.name.clone().unwrap();
        assert!(names.contains(&name), "{e:?}");
        let note = e.note.clone().unwrap();
        assert!(
            note.contains(&format!(
                "{}:{}",
                loopback_candidate(&name),
                kubelet_port_for_node(&name)
            )),
            "{note}"
        );
    }
    for w in &writes {
        // A full replace of the status subresource, never a strategic merge of addresses.
        assert_eq!(
            (w.verb.as_str(), w.subresource.as_deref()),
            ("update", Some("status"))
        );
        assert_ne!(
            w.name.as_deref(),
            Some("gpu-provider"),
            "virtual node written"
        );
        assert_eq!(w.code, 200);
    }

    for (i, name) in names.iter().enumerate() {
        let n = api.get(name).await.unwrap();
        let ip = first_external_ip(&n).unwrap().to_string();
        // No two of these names collide, so nothing probed past the first candidate.
        assert_eq!(ip, loopback_candidate(name).to_string(), "{name}");
        assert_eq!(observed_kubelet_port(&n), Some(kubelet_port_for_node(name)));
        let addrs = n.status.as_ref().unwrap().addresses.clone().unwrap();
        assert!(
            addrs
                .iter()
                .any(|a| a.type_ == "InternalIP" && a.address == format!("192.0.2.{}", i + 1)),
            "InternalIP kept: {addrs:?}"
        );
        assert!(
            addrs
                .iter()
                .any(|a| a.type_ == "Hostname" && &a.address == name)
        );
    }
    let v = api.get("gpu-provider").await.unwrap();
    assert_eq!(first_external_ip(&v), None);
    assert_eq!(observed_kubelet_port(&v), Some(10250));

    // Steady state: a second pass lists and writes nothing.
    server.clear_requests();
    let report = r.once().await.unwrap();
    assert_eq!(report.writes, 0);
    assert!(!report.needs_attention(), "{report:?}");
    assert_eq!(report.states[&nodeaddr::NodeState::Ok], 12);
    assert_eq!(report.states[&nodeaddr::NodeState::Virtual], 1);
    let log = server.requests();
    assert!(log.iter().all(|q| !q.is_write()), "{log:#?}");
    assert_eq!(log.iter().filter(|q| q.verb == "list").count(), 1);

    let rows = r.diagnostics().await.unwrap();
    let row_names: Vec<&str> = rows.iter().map(|d| d.node_name.as_str()).collect();
    let mut sorted = row_names.clone();
    sorted.sort();
    assert_eq!(row_names, sorted);
    for d in &rows {
        if d.node_name == "gpu-provider" {
            assert_eq!(d.skipped, Some(SkipReason::Virtual));
            assert!(!d.needs_attention());
        } else {
            assert!(d.patched, "{d:?}");
            assert!(d.collides_with.is_empty());
            assert_eq!(d.expected_external_ip, d.observed_external_ip);
        }
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_conflicting_status_write_is_reread_and_nothing_is_lost() {
    install_crypto();
    let server = ApiServer::start().await.unwrap();
    let api: Api<Node> = Api::all(server.client());
    create_nodes(&api, [kubelet_node("worker-1", 1)]).await;
    let r = Reconciler::new(server.client());

    // Hold the reconciler's write long enough for a kubelet heartbeat to land first: the
    // heartbeat goes in once the reconciler's list is done, while its write waits.
    server.clear_requests();
    server.inject(
        Fault::new(FaultKind::Latency(Duration::from_secs(2)))
            .verb("update")
            .resource("nodes/status")
            .times(1),
    );
    let pass = tokio::spawn({
        let r = r.clone();
        async move { r.once().await }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !server.requests().iter().any(|q| q.verb == "list") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pass never listed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut n = api.get("worker-1").await.unwrap();
    n.status
        .as_mut()
        .unwrap()
        .conditions
        .as_mut()
        .unwrap()
        .push(NodeCondition {
            type_: "MemoryPressure".into(),
            status: "False".into(),
            ..Default::default()
        });
    api.replace_status("worker-1", &PostParams::default(), &n)
        .await
        .unwrap();

    let report = pass.await.unwrap().unwrap();
    assert_eq!(report.conflicts, 1, "{report:?}");
    assert_eq!(report.writes, 1);
    let codes: Vec<u16> = server
        .requests()
        .iter()
        .filter(|q| q.verb == "update" && q.name.as_deref() == Some("worker-1"))
        .map(|q| q.code)
        .collect();
    assert!(
        codes.contains(&409),
        "the stale write must have been refused: {codes:?}"
    );

    let n = api.get("worker-1").await.unwrap();
    let conditions = n.status.as_ref().unwrap().conditions.clone().unwrap();
    assert!(
        conditions.iter().any(|c| c.type_ == "MemoryPressure"),
        "the heartbeat was overwritten: {conditions:?}"
    );
    assert_eq!(
        first_external_ip(&n),
        Some(loopback_candidate("worker-1").to_string().as_str())
    );
    server.shutdown().await;
}

/// Holds the reconciler's first status write for 2 s and, once its list is served, lets
/// `concurrent` write the node first: the reconciler's write then carries a stale
/// resourceVersion.
async fn pass_with_a_concurrent_write<F, Fut>(
    server: &ApiServer,
    r: &Reconciler,
    concurrent: F,
) -> nodeaddr::PassReport
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    server.clear_requests();
    server.inject(
        Fault::new(FaultKind::Latency(Duration::from_secs(2)))
            .verb("update")
            .resource("nodes/status")
            .times(1),
    );
    let pass = tokio::spawn({
        let r = r.clone();
        async move { r.once().await }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !server
        .requests()
        .iter()
        .any(|q| q.verb == "list" && q.resource == "nodes")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pass never listed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    concurrent().await;
    pass.await.unwrap().unwrap()
}

#[tokio::test]
async fn after_a_conflict_the_wanted_status_is_recomputed_from_the_fresh_addresses() {
    install_crypto();
    let server = ApiServer::start().await.unwrap();
    let api: Api<Node> = Api::all(server.client());
    create_nodes(&api, [kubelet_node("worker-1", 1)]).await;
    let r = Reconciler::new(server.client());
    let ours = loopback_candidate("worker-1").to_string();

    // The concurrent writer (the k3s cloud controller, say) changes the addresses: a new
    // InternalIP and a public ExternalIP. Re-applying the change planned from the stale
    // copy would put the old InternalIP back.
    let report = pass_with_a_concurrent_write(&server, &r, || async {
        let mut n = api.get("worker-1").await.unwrap();
        n.status.as_mut().unwrap().addresses = Some(vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: "192.0.2.99".into(),
            },
            NodeAddress {
                type_: "ExternalIP".into(),
                address: "203.0.113.5".into(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: "worker-1".into(),
            },
        ]);
        api.replace_status("worker-1", &PostParams::default(), &n)
            .await
            .unwrap();
    })
    .await;
    assert_eq!((report.conflicts, report.writes), (1, 1), "{report:?}");
    let n = api.get("worker-1").await.unwrap();
    let addrs: Vec<(String, String)> = n
        .status
        .unwrap()
        .addresses
        .unwrap()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    let pair = |t: &str, a: &str| (t.to_string(), a.to_string());
    assert_eq!(
        addrs,
        [
            pair("InternalIP", "192.0.2.99"),
            pair("ExternalIP", &ours),
            pair("ExternalIP", "203.0.113.5"),
            pair("Hostname", "worker-1"),
        ],
        "the concurrent writer's addresses are kept, ours first among ExternalIPs"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_conflict_with_a_writer_that_already_applied_the_change_writes_nothing() {
    install_crypto();
    let server = ApiServer::start().await.unwrap();
    let api: Api<Node> = Api::all(server.client());
    create_nodes(&api, [kubelet_node("worker-1", 1)]).await;
    let mut r = Reconciler::new(server.client());
    r.reporter = None;
    let ip: std::net::Ipv4Addr = loopback_candidate("worker-1");
    let port = kubelet_port_for_node("worker-1");

    // Another reconciler (a former leader, say) gets there first with the same change.
    let report = pass_with_a_concurrent_write(&server, &r, || async {
        let mut n = api.get("worker-1").await.unwrap();
        let change = nodeaddr::wanted_status(&n, ip, port).unwrap();
        nodeaddr::apply_change(&mut n, &change);
        api.replace_status("worker-1", &PostParams::default(), &n)
            .await
            .unwrap();
    })
    .await;
    assert_eq!((report.conflicts, report.writes), (1, 0), "{report:?}");
    let updates: Vec<u16> = server
        .requests()
        .iter()
        .filter(|q| q.verb == "update" && q.resource == "nodes")
        .map(|q| q.code)
        .collect();
    // The concurrent writer's 200, our 409, and no second update after the re-read.
    assert_eq!(
        updates.iter().filter(|c| **c == 409).count(),
        1,
        "{updates:?}"
    );
    assert_eq!(updates.len(), 2, "{updates:?}");
    let n = api.get("worker-1").await.unwrap();
    assert_eq!(first_external_ip(&n), Some(ip.to_string().as_str()));
    assert_eq!(observed_kubelet_port(&n), Some(port));
    server.shutdown().await;
}

#[tokio::test]
async fn k3s_node_ids_route_by_the_configured_name_and_collisions_are_flagged() {
    install_crypto();
    let server = ApiServer::start().await.unwrap();
    let api: Api<Node> = Api::all(server.client());
    let mut suffixed = kubelet_node("box-1a2b3c4d", 1);
    suffixed.metadata.annotations = Some(
        [(
            NODE_ARGS_ANNOTATION.to_string(),
            r#"["agent","--node-name","box","--with-node-id","--token","********"]"#.to_string(),
        )]
        .into(),
    );
    // An annotation naming another node must not borrow that node's route.
    let mut hostile = kubelet_node("intruder", 2);
    hostile.metadata.annotations = Some(
        [(
            NODE_ARGS_ANNOTATION.to_string(),
            r#"["--node-name","box"]"#.to_string(),
        )]
        .into(),
    );
    let (a, b) = colliding_pair();
    create_nodes(
        &api,
        [suffixed, hostile, kubelet_node(&a, 3), kubelet_node(&b, 4)],
    )
    .await;
    let r = Reconciler::new(server.client());
    let report = r.once().await.unwrap();
    assert_eq!(report.writes, 4);
    assert_eq!(report.colliding, 2);

    let n = api.get("box-1a2b3c4d").await.unwrap();
    assert_eq!(
        observed_kubelet_port(&n),
        Some(kubelet_port_for_node("box"))
    );
    let n = api.get("intruder").await.unwrap();
    assert_eq!(
        observed_kubelet_port(&n),
        Some(kubelet_port_for_node("intruder"))
    );

    let rows = r.diagnostics().await.unwrap();
    let row = |name: &str| rows.iter().find(|d| d.node_name == name).unwrap().clone();
    assert_eq!(row("box-1a2b3c4d").routing_name, "box");
    assert_eq!(row(&a).collides_with, vec![b.clone()]);
    assert_eq!(row(&b).collides_with, vec![a.clone()]);
    assert!(row(&a).patched && row(&a).needs_attention());
    assert!(!row("intruder").needs_attention());
    // Secret-free: the annotation's content is never echoed.
    let json = serde_json::to_string(&rows).unwrap();
    assert!(!json.contains("--token") && !json.contains("********"));
    server.shutdown().await;
}

/// Two names deriving one port, found by search so the test does not depend on a list.
pub fn colliding_pair() -> (String, String) {
    let mut seen = std::collections::HashMap::new();
    for i in 0.. {
        let name = format!("edge-{i}");
        if let Some(other) = seen.insert(kubelet_port_for_node(&name), name.clone()) {
            return (other, name);
        }
    }
    unreachable!()
}
