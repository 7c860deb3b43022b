//! The pure half of the reconciler: from observed Nodes to the wanted status changes and
//! the diagnostic rows. Nothing here performs I/O.

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{DaemonEndpoint, Node, NodeAddress, NodeDaemonEndpoints};
use serde::Serialize;

use crate::derive::loopback_held_by;
use crate::routing::{is_virtual_node, routing_name};

/// Node address type the API server is told to prefer (`--kubelet-preferred-address-types`
/// with ExternalIP first).
pub const EXTERNAL_IP: &str = "ExternalIP";

/// The status fields a pass wants on one node.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusChange {
    /// The complete address list to store (replaces the node's list).
    pub addresses: Vec<NodeAddress>,
    /// The value for `status.daemonEndpoints.kubeletEndpoint.Port`; 0 clears it (the API
    /// server then dials 10250), which only the cleanup of a node turned virtual does.
    pub kubelet_port: u16,
}

/// Why a node is not routed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SkipReason {
    /// A virtual-kubelet node: no kubelet listens for it.
    Virtual,
    /// The port function knows no port for it yet (its tunnel is not up).
    PortUnknown,
    /// `--require-tunnel`: nothing accepted a TCP connection at the node's loopback
    /// address and port, so the node is left as it is.
    TunnelDown,
}

/// The tunnel that publishes kubelets on the control-plane host; it decides which
/// collisions break a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Tunnel {
    /// frps binds every remote port on all addresses: every node shares one port space,
    /// so two nodes deriving one port collide and the second proxy is refused.
    #[default]
    Frpc,
    /// `ssh -R ADDR:PORT:...` binds the node's own loopback address: only two nodes with
    /// the same (address, port) pair collide, which the unique loopback assignment rules
    /// out.
    Ssh,
}

/// One node as a pass sees it: what it should carry, what it carries, and what to write.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedNode {
    /// `metadata.name`.
    pub node_name: String,
    /// The name the route derives from (see [`crate::routing_name`]).
    pub routing_name: String,
    /// Set when the node is left alone.
    pub skipped: Option<SkipReason>,
    /// The loopback address the node should advertise as its first ExternalIP.
    pub expected_external_ip: Option<Ipv4Addr>,
    /// The kubelet port the node should advertise.
    pub expected_kubelet_port: Option<u16>,
    /// The first ExternalIP the node carries now (the one the API server would dial).
    pub observed_external_ip: Option<String>,
    /// The kubelet port the node advertises now (0 and absent both read as `None`).
    pub observed_kubelet_port: Option<u16>,
    /// Other routed nodes that derive the same port; empty when the port is the node's own.
    /// Breaks a node behind frpc ([`Tunnel::Frpc`]).
    pub port_collides_with: Vec<String>,
    /// Other routed nodes expected at the same (address, port) pair: what breaks a node
    /// behind `ssh -R` ([`Tunnel::Ssh`]). Empty by construction, since every routed node
    /// gets its own address; computed rather than assumed so diagnostics prove it.
    pub address_collides_with: Vec<String>,
    /// The status change to write; `None` when the node already matches or is skipped.
    /// For a virtual node it is the removal of what the reconciler wrote before the node
    /// became virtual.
    pub change: Option<StatusChange>,
}

impl PlannedNode {
    /// The nodes whose route collides with this one behind `tunnel`.
    pub fn collides_with(&self, tunnel: Tunnel) -> &[String] {
        match tunnel {
            Tunnel::Frpc => &self.port_collides_with,
            Tunnel::Ssh => &self.address_collides_with,
        }
    }
}

/// Computes a pass over `nodes`: rows sorted by node name.
///
/// Loopback addresses are handed out in sorted (routing name, node name) order over the
/// routed nodes only, so that the same node set always yields the same assignment and an
/// unchanged cluster plans no writes.
///
/// A virtual node that still carries a loopback ExternalIP or the derived port (it was
/// patched before it became virtual) plans their removal, so the API server stops dialing
/// a kubelet that does not exist.
pub fn plan<N: Borrow<Node>>(
    nodes: &[N],
    port_for: &dyn Fn(&str) -> Option<u16>,
) -> Vec<PlannedNode> {
    let mut rows: Vec<(PlannedNode, &Node)> = nodes
        .iter()
        .map(|node| {
            let node: &Node = node.borrow();
            let routing = routing_name(node);
            let port = port_for(&routing);
            let skipped = if is_virtual_node(node) {
                Some(SkipReason::Virtual)
            } else if port.is_none() {
                Some(SkipReason::PortUnknown)
            } else {
                None
            };
            let row = PlannedNode {
                node_name: node.metadata.name.clone().unwrap_or_default(),
                routing_name: routing,
                skipped,
                expected_external_ip: None,
                expected_kubelet_port: if skipped.is_none() { port } else { None },
                observed_external_ip: first_external_ip(node).map(str::to_string),
                observed_kubelet_port: observed_kubelet_port(node),
                port_collides_with: Vec::new(),
                address_collides_with: Vec::new(),
                change: if skipped == Some(SkipReason::Virtual) {
                    unroute_status(node, port)
                } else {
                    None
                },
            };
            (row, node)
        })
        .collect();

    // Loopbacks: deterministic probe order.
    let mut order: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].0.skipped.is_none())
        .collect();
    order.sort_by(|&a, &b| {
        (&rows[a].0.routing_name, &rows[a].0.node_name)
            .cmp(&(&rows[b].0.routing_name, &rows[b].0.node_name))
    });
    let mut taken: BTreeMap<Ipv4Addr, String> = BTreeMap::new();
    for &i in &order {
        let row = &mut rows[i].0;
        let ip = loopback_held_by(&row.routing_name, &row.node_name, &taken);
        taken.insert(ip, row.node_name.clone());
        row.expected_external_ip = Some(ip);
    }

    // Collisions: every routed node sharing a port (frpc) or an address and a port (ssh)
    // with another.
    let mut by_port: HashMap<u16, Vec<String>> = HashMap::new();
    let mut by_pair: HashMap<(Ipv4Addr, u16), Vec<String>> = HashMap::new();
    for (row, _) in &rows {
        if let Some(port) = row.expected_kubelet_port {
            by_port.entry(port).or_default().push(row.node_name.clone());
            if let Some(ip) = row.expected_external_ip {
                by_pair
                    .entry((ip, port))
                    .or_default()
                    .push(row.node_name.clone());
            }
        }
    }
    let others = |all: Option<&Vec<String>>, me: &str| -> Vec<String> {
        let mut v: Vec<String> = all
            .into_iter()
            .flatten()
            .filter(|n| *n != me)
            .cloned()
            .collect();
        v.sort();
        v
    };
    for (row, node) in &mut rows {
        if let Some(port) = row.expected_kubelet_port {
            row.port_collides_with = others(by_port.get(&port), &row.node_name);
            if let Some(ip) = row.expected_external_ip {
                row.address_collides_with = others(by_pair.get(&(ip, port)), &row.node_name);
            }
        }
        if let (Some(ip), Some(port)) = (row.expected_external_ip, row.expected_kubelet_port) {
            row.change = wanted_status(node, ip, port);
        }
    }

    let mut out: Vec<PlannedNode> = rows.into_iter().map(|(row, _)| row).collect();
    out.sort_by(|a, b| a.node_name.cmp(&b.node_name));
    out
}

/// The pure diff for one node: the status change that makes `node` advertise `ip` as its
/// first ExternalIP and `port` as its kubelet port, or `None` when it already does.
///
/// Address policy: `ip` becomes the first ExternalIP (where the first ExternalIP was, or at
/// the end); other ExternalIPs in 127.0.0.0/8 are dropped, since they can only be earlier
/// assignments of ours and would keep a stale route in k3s' index; every other address,
/// including non-loopback ExternalIPs, is kept in its order.
pub fn wanted_status(node: &Node, ip: Ipv4Addr, port: u16) -> Option<StatusChange> {
    let current: &[NodeAddress] = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default();
    let addresses = wanted_addresses(current, ip);
    let port_ok = observed_kubelet_port(node) == Some(port);
    if port_ok && addresses.as_slice() == current {
        return None;
    }
    Some(StatusChange {
        addresses,
        kubelet_port: port,
    })
}

/// The cleanup of a node that became virtual after it was routed: its loopback
/// ExternalIPs go (only this reconciler puts them there), and its kubelet port is cleared
/// when it is still `derived_port`. `None` when there is nothing of ours on it.
pub fn unroute_status(node: &Node, derived_port: Option<u16>) -> Option<StatusChange> {
    let current: &[NodeAddress] = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default();
    let addresses: Vec<NodeAddress> = current
        .iter()
        .filter(|a| !(a.type_ == EXTERNAL_IP && is_loopback(&a.address)))
        .cloned()
        .collect();
    let observed = observed_kubelet_port(node);
    let port_ours = derived_port.is_some() && observed == derived_port;
    if !port_ours && addresses.len() == current.len() {
        return None;
    }
    Some(StatusChange {
        addresses,
        kubelet_port: if port_ours { 0 } else { observed.unwrap_or(0) },
    })
}

fn is_loopback(address: &str) -> bool {
    address
        .parse::<Ipv4Addr>()
        .is_ok_and(|addr| addr.is_loopback())
}

fn wanted_addresses(current: &[NodeAddress], ip: Ipv4Addr) -> Vec<NodeAddress> {
    let ours = NodeAddress {
        type_: EXTERNAL_IP.to_string(),
        address: ip.to_string(),
    };
    let mut out = Vec::with_capacity(current.len() + 1);
    let mut placed = false;
    for a in current {
        if a.type_ == EXTERNAL_IP {
            if !placed {
                out.push(ours.clone());
                placed = true;
            }
            if is_loopback(&a.address) {
                continue;
            }
        }
        out.push(a.clone());
    }
    if !placed {
        out.push(ours);
    }
    out
}

/// Writes `change` into `node`'s status, keeping every other status field.
pub fn apply_change(node: &mut Node, change: &StatusChange) {
    let status = node.status.get_or_insert_with(Default::default);
    status.addresses = Some(change.addresses.clone());
    if change.kubelet_port == 0 && observed_kubelet_port(node).is_none() {
        // Nothing to clear; leave an absent endpoint absent.
        return;
    }
    let status = node.status.get_or_insert_with(Default::default);
    let endpoints = status
        .daemon_endpoints
        .get_or_insert_with(NodeDaemonEndpoints::default);
    endpoints.kubelet_endpoint = Some(DaemonEndpoint {
        port: i32::from(change.kubelet_port),
    });
}

/// The first ExternalIP in the node's address list.
pub fn first_external_ip(node: &Node) -> Option<&str> {
    node.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .find(|a| a.type_ == EXTERNAL_IP)
        .map(|a| a.address.as_str())
}

/// `status.daemonEndpoints.kubeletEndpoint.Port`, `None` when absent or not a valid port.
pub fn observed_kubelet_port(node: &Node) -> Option<u16> {
    let port = node
        .status
        .as_ref()?
        .daemon_endpoints
        .as_ref()?
        .kubelet_endpoint
        .as_ref()?
        .port;
    u16::try_from(port).ok().filter(|p| *p != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::derive::{derived_kubelet_port, kubelet_port_for_node, loopback_candidate};
    use crate::routing::{NODE_ARGS_ANNOTATION, RUNTIME_LABEL, RUNTIME_VIRTUAL};
    use k8s_openapi::api::core::v1::NodeStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn addr(t: &str, a: &str) -> NodeAddress {
        NodeAddress {
            type_: t.into(),
            address: a.into(),
        }
    }

    fn node(name: &str, addresses: Vec<NodeAddress>, port: Option<i32>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            status: Some(NodeStatus {
                addresses: Some(addresses),
                daemon_endpoints: port.map(|p| NodeDaemonEndpoints {
                    kubelet_endpoint: Some(DaemonEndpoint { port: p }),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn derived(name: &str) -> Option<u16> {
        derived_kubelet_port(name)
    }

    #[test]
    fn fresh_node_gets_external_ip_and_port() {
        let n = node(
            "w1",
            vec![addr("InternalIP", "10.0.0.5"), addr("Hostname", "w1")],
            Some(10250),
        );
        let ip = Ipv4Addr::new(127, 1, 2, 3);
        let change = wanted_status(&n, ip, 21000).unwrap();
        assert_eq!(
            change.addresses,
            vec![
                addr("InternalIP", "10.0.0.5"),
                addr("Hostname", "w1"),
                addr("ExternalIP", "127.1.2.3")
            ]
        );
        assert_eq!(change.kubelet_port, 21000);
    }

    #[test]
    fn matching_node_needs_nothing() {
        let n = node(
            "w1",
            vec![
                addr("InternalIP", "10.0.0.5"),
                addr("ExternalIP", "127.1.2.3"),
            ],
            Some(21000),
        );
        assert_eq!(wanted_status(&n, Ipv4Addr::new(127, 1, 2, 3), 21000), None);
    }

    #[test]
    fn port_alone_is_repaired() {
        let n = node("w1", vec![addr("ExternalIP", "127.1.2.3")], Some(10250));
        let change = wanted_status(&n, Ipv4Addr::new(127, 1, 2, 3), 21000).unwrap();
        assert_eq!(change.addresses, vec![addr("ExternalIP", "127.1.2.3")]);
        assert_eq!(change.kubelet_port, 21000);
        let none = node("w1", vec![addr("ExternalIP", "127.1.2.3")], None);
        assert!(wanted_status(&none, Ipv4Addr::new(127, 1, 2, 3), 21000).is_some());
    }

    #[test]
    fn our_address_goes_first_among_external_ips_and_stale_loopbacks_go() {
        let n = node(
            "w1",
            vec![
                addr("InternalIP", "10.0.0.5"),
                addr("ExternalIP", "203.0.113.7"),
                addr("ExternalIP", "127.9.9.9"),
                addr("Hostname", "w1"),
            ],
            Some(21000),
        );
        let change = wanted_status(&n, Ipv4Addr::new(127, 1, 2, 3), 21000).unwrap();
        assert_eq!(
            change.addresses,
            vec![
                addr("InternalIP", "10.0.0.5"),
                addr("ExternalIP", "127.1.2.3"),
                addr("ExternalIP", "203.0.113.7"),
                addr("Hostname", "w1"),
            ]
        );
        // Applying the change reaches a fixed point.
        let mut after = n.clone();
        apply_change(&mut after, &change);
        assert_eq!(
            wanted_status(&after, Ipv4Addr::new(127, 1, 2, 3), 21000),
            None
        );
    }

    #[test]
    fn apply_keeps_other_status_fields() {
        let mut n = node("w1", vec![], None);
        n.status.as_mut().unwrap().phase = Some("Running".into());
        apply_change(
            &mut n,
            &StatusChange {
                addresses: vec![addr("ExternalIP", "127.0.0.9")],
                kubelet_port: 20001,
            },
        );
        assert_eq!(observed_kubelet_port(&n), Some(20001));
        assert_eq!(first_external_ip(&n), Some("127.0.0.9"));
        assert_eq!(n.status.unwrap().phase.as_deref(), Some("Running"));
    }

    #[test]
    fn plan_sorts_skips_virtual_and_is_stable_under_input_order() {
        let mut v = node("v1", vec![], None);
        v.metadata.labels = Some([(RUNTIME_LABEL.to_string(), RUNTIME_VIRTUAL.to_string())].into());
        let nodes = vec![node("w2", vec![], None), v, node("w1", vec![], None)];
        let rows = plan(&nodes, &derived);
        let names: Vec<_> = rows.iter().map(|r| r.node_name.as_str()).collect();
        assert_eq!(names, ["v1", "w1", "w2"]);
        assert_eq!(rows[0].skipped, Some(SkipReason::Virtual));
        assert_eq!(rows[0].change, None);
        assert_eq!(rows[0].expected_external_ip, None);
        assert_eq!(
            rows[1].expected_kubelet_port,
            Some(kubelet_port_for_node("w1"))
        );
        assert_eq!(rows[1].expected_external_ip, Some(loopback_candidate("w1")));
        assert!(rows[1].change.is_some() && rows[2].change.is_some());

        let mut reversed = nodes.clone();
        reversed.reverse();
        assert_eq!(plan(&reversed, &derived), rows);
    }

    #[test]
    fn a_node_turned_virtual_loses_what_we_wrote_and_nothing_else() {
        let port = kubelet_port_for_node("v1");
        let mut v = node(
            "v1",
            vec![
                addr("InternalIP", "10.0.0.5"),
                addr("ExternalIP", "127.4.5.6"),
                addr("ExternalIP", "203.0.113.7"),
            ],
            Some(i32::from(port)),
        );
        v.metadata.labels = Some([(RUNTIME_LABEL.to_string(), RUNTIME_VIRTUAL.to_string())].into());
        let rows = plan(std::slice::from_ref(&v), &derived);
        assert_eq!(rows[0].skipped, Some(SkipReason::Virtual));
        let change = rows[0].change.clone().expect("cleanup planned");
        assert_eq!(
            change.addresses,
            vec![
                addr("InternalIP", "10.0.0.5"),
                addr("ExternalIP", "203.0.113.7")
            ]
        );
        assert_eq!(change.kubelet_port, 0);
        let mut after = v.clone();
        apply_change(&mut after, &change);
        assert_eq!(observed_kubelet_port(&after), None);
        assert_eq!(first_external_ip(&after), Some("203.0.113.7"));
        assert!(
            plan(&[after], &derived)[0].change.is_none(),
            "a fixed point"
        );

        // A port someone else set (the virtual kubelet's own) is not ours to clear.
        let mut own = v.clone();
        own.status.as_mut().unwrap().daemon_endpoints = Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint { port: 10250 }),
        });
        let change = unroute_status(&own, Some(port)).unwrap();
        assert_eq!(change.kubelet_port, 10250);
        own.status.as_mut().unwrap().addresses = Some(vec![addr("InternalIP", "10.0.0.5")]);
        assert_eq!(unroute_status(&own, Some(port)), None);
    }

    #[test]
    fn ssh_collisions_need_a_shared_address_and_port() {
        let nodes = vec![node("a", vec![], None), node("b", vec![], None)];
        let same = |_: &str| Some(20000);
        let rows = plan(&nodes, &same);
        assert_eq!(rows[0].collides_with(Tunnel::Frpc), ["b"]);
        assert!(rows[0].collides_with(Tunnel::Ssh).is_empty());
        assert!(rows[1].collides_with(Tunnel::Ssh).is_empty());
    }

    #[test]
    fn unknown_ports_are_skipped() {
        let nodes = vec![node("w1", vec![], None)];
        let rows = plan(&nodes, &|_| None);
        assert_eq!(rows[0].skipped, Some(SkipReason::PortUnknown));
        assert_eq!(rows[0].change, None);
    }

    #[test]
    fn a_planned_cluster_plans_nothing_next_time() {
        let mut nodes: Vec<Node> = (0..30)
            .map(|i| {
                node(
                    &format!("w{i}"),
                    vec![addr("InternalIP", "10.0.0.1")],
                    Some(10250),
                )
            })
            .collect();
        let rows = plan(&nodes, &derived);
        for n in &mut nodes {
            let row = rows
                .iter()
                .find(|r| Some(&r.node_name) == n.metadata.name.as_ref())
                .unwrap();
            apply_change(n, row.change.as_ref().unwrap());
        }
        assert!(plan(&nodes, &derived).iter().all(|r| r.change.is_none()));
    }

    #[test]
    fn collisions_are_flagged_both_ways() {
        let nodes = vec![
            node("a", vec![], None),
            node("b", vec![], None),
            node("c", vec![], None),
        ];
        let same = |n: &str| if n == "c" { Some(20001) } else { Some(20000) };
        let rows = plan(&nodes, &same);
        assert_eq!(rows[0].port_collides_with, ["b"]);
        assert_eq!(rows[1].port_collides_with, ["a"]);
        assert!(rows[2].port_collides_with.is_empty());
        // Colliding nodes still get distinct loopbacks.
        assert_ne!(rows[0].expected_external_ip, rows[1].expected_external_ip);
    }

    #[test]
    fn shared_routing_names_get_distinct_loopbacks() {
        let args = r#"["agent","--node-name","box","--with-node-id"]"#;
        let mut a = node("box-0000000a", vec![], None);
        let mut b = node("box-0000000b", vec![], None);
        for n in [&mut a, &mut b] {
            n.metadata.annotations =
                Some([(NODE_ARGS_ANNOTATION.to_string(), args.to_string())].into());
        }
        let rows = plan(&[a, b], &derived);
        assert_eq!(rows[0].routing_name, "box");
        assert_eq!(rows[1].routing_name, "box");
        assert_eq!(
            rows[0].expected_external_ip,
            Some(loopback_candidate("box"))
        );
        assert_eq!(
            rows[1].expected_external_ip.map(u32::from),
            Some(u32::from(loopback_candidate("box")) + 1)
        );
        assert_eq!(rows[0].port_collides_with, ["box-0000000b"]);
    }

    #[test]
    fn a_node_named_like_another_nodes_routing_name_does_not_share_its_address() {
        let args = r#"["agent","--node-name","box","--with-node-id"]"#;
        let mut suffixed = node("box-0000000a", vec![], None);
        suffixed.metadata.annotations =
            Some([(NODE_ARGS_ANNOTATION.to_string(), args.to_string())].into());
        let plain = node("box", vec![], None);
        let rows = plan(&[suffixed, plain], &derived);
        assert_ne!(rows[0].expected_external_ip, rows[1].expected_external_ip);
    }
}
