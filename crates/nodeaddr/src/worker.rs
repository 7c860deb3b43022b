//! The worker's side of the loopback assignment: which address its `ssh -R` must bind on
//! the control-plane host.
//!
//! The reconciler hands out loopback addresses by probing in sorted order over every
//! routed node, so a worker cannot compute its own address from its name alone once two
//! names hash to the same candidate (at 5,000 nodes over 16.7 million addresses that
//! happens in about half of all clusters). A worker that can read the Nodes (it has a
//! kubeconfig anyway) does not need to compute it: the reconciler publishes it as the
//! first ExternalIP of the worker's own Node. Binding exactly that address means no two
//! nodes ever share an (address, port) pair, at any scale.

use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};
use serde::Serialize;

use crate::derive::{PortRange, loopback_candidate};
use crate::plan::{first_external_ip, plan};

/// Where a bind address came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BindSource {
    /// The first ExternalIP the reconciler published on the node, and the one it expects.
    Published,
    /// The reconciler's assignment computed from the current Nodes: the node is not
    /// patched yet (or not registered yet); the reconciler will publish this address.
    Planned,
    /// The first candidate derived from the name alone, without looking at other nodes:
    /// right unless another node's name hashes to the same address.
    Candidate,
}

/// The address a worker's tunnel binds, and how it was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct BindAddress {
    /// The address.
    pub address: Ipv4Addr,
    /// How it was found.
    pub source: BindSource,
}

/// Why the bind address could not be found from the cluster.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The Nodes could not be listed.
    #[error("could not list nodes to find the address the reconciler assigns to {name}")]
    List {
        /// The routing name asked about.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Several registered nodes route by this name (k3s `--with-node-id` with one
    /// `--node-name` on several hosts), each with its own address.
    #[error(
        "nodes {nodes} all route by the name {name}, each with its own address: \
         pass --remote-bind with the EXPECTED-IP `stratum-server nodes diagnostics` shows \
         for this host's node"
    )]
    Ambiguous {
        /// The routing name.
        name: String,
        /// The registered names, comma-separated.
        nodes: String,
    },
}

/// The address a worker whose configured node name is `name` binds, from the Nodes of the
/// cluster: the loopback ExternalIP published on its Node when that is what the reconciler
/// expects, otherwise the reconciler's assignment over these nodes (with the node added
/// when it has not registered yet).
pub fn bind_address_from(
    nodes: &[Node],
    name: &str,
    range: PortRange,
) -> Result<BindAddress, BindError> {
    let port_for = move |n: &str| Some(range.port_for(n));
    let mut rows = plan(nodes, &port_for);
    let mut mine: Vec<_> = rows.iter().filter(|r| r.routing_name == name).collect();
    if mine.is_empty() {
        // Not registered yet: plan as if it were, exactly as the reconciler will.
        let mut with_me: Vec<Node> = nodes.to_vec();
        with_me.push(Node {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            ..Default::default()
        });
        rows = plan(&with_me, &port_for);
        mine = rows.iter().filter(|r| r.node_name == name).collect();
    }
    if mine.len() > 1 {
        // The node registered under exactly this name is unambiguous.
        mine.retain(|r| r.node_name == name);
        if mine.len() != 1 {
            let nodes: Vec<&str> = rows
                .iter()
                .filter(|r| r.routing_name == name)
                .map(|r| r.node_name.as_str())
                .collect();
            return Err(BindError::Ambiguous {
                name: name.to_string(),
                nodes: nodes.join(","),
            });
        }
    }
    let Some(row) = mine.first() else {
        return Ok(BindAddress {
            address: loopback_candidate(name),
            source: BindSource::Candidate,
        });
    };
    let Some(expected) = row.expected_external_ip else {
        // Skipped (virtual): nothing will be published; the name's candidate is as good
        // as anything.
        return Ok(BindAddress {
            address: loopback_candidate(name),
            source: BindSource::Candidate,
        });
    };
    let published = nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(row.node_name.as_str()))
        .and_then(first_external_ip)
        .and_then(|ip| ip.parse::<Ipv4Addr>().ok());
    Ok(BindAddress {
        address: expected,
        source: if published == Some(expected) {
            BindSource::Published
        } else {
            BindSource::Planned
        },
    })
}

/// [`bind_address_from`] over the Nodes listed with `client`: one list, no writes.
pub async fn bind_address(
    client: kube::Client,
    name: &str,
    range: PortRange,
) -> Result<BindAddress, BindError> {
    let nodes = Api::<Node>::all(client)
        .list(&ListParams::default())
        .await
        .map_err(|source| BindError::List {
            name: name.to_string(),
            source,
        })?;
    bind_address_from(&nodes.items, name, range)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{apply_change, wanted_status};
    use k8s_openapi::api::core::v1::NodeStatus;

    fn node(name: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            status: Some(NodeStatus::default()),
            ..Default::default()
        }
    }

    /// Two names whose loopback candidates are the same address.
    fn same_candidate_pair() -> (String, String) {
        // The birthday bound over 16.7 million addresses: a few thousand names.
        let mut seen = std::collections::HashMap::new();
        for i in 0u64.. {
            let name = format!("n{i}");
            if let Some(other) = seen.insert(loopback_candidate(&name), name.clone()) {
                return (other, name);
            }
        }
        unreachable!()
    }

    #[test]
    fn a_node_whose_candidate_is_taken_binds_where_the_reconciler_puts_it() {
        let (a, b) = same_candidate_pair();
        let (first, second) = if a < b { (a, b) } else { (b, a) };
        let nodes = vec![node(&first), node(&second)];
        let range = PortRange::DEFAULT;
        let plan_rows = plan(&nodes, &|n: &str| Some(range.port_for(n)));
        let expected = |n: &str| {
            plan_rows
                .iter()
                .find(|r| r.node_name == n)
                .unwrap()
                .expected_external_ip
                .unwrap()
        };
        assert_eq!(expected(&first), loopback_candidate(&first));
        assert_ne!(expected(&second), loopback_candidate(&second), "probed");

        let got = bind_address_from(&nodes, &second, range).unwrap();
        assert_eq!(got.address, expected(&second));
        assert_eq!(got.source, BindSource::Planned);

        // Once the reconciler published it, the worker reads it back.
        let mut patched = nodes.clone();
        for n in &mut patched {
            let name = n.metadata.name.clone().unwrap();
            let c = wanted_status(n, expected(&name), range.port_for(&name)).unwrap();
            apply_change(n, &c);
        }
        let got = bind_address_from(&patched, &second, range).unwrap();
        assert_eq!(
            (got.address, got.source),
            (expected(&second), BindSource::Published)
        );
    }

    #[test]
    fn an_unregistered_node_gets_the_address_it_will_be_assigned() {
        let got = bind_address_from(&[node("w1")], "w2", PortRange::DEFAULT).unwrap();
        assert_eq!(got.address, loopback_candidate("w2"));
        assert_eq!(got.source, BindSource::Planned);
    }
}
