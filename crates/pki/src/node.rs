//! This node's leaves, issued from the shared CAs.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use crate::{Ca, LeafSpec, PkiError, Usage, refuse_existing_keys, write_files};

/// Who this node is, as its certificates name it.
#[derive(Debug, Clone)]
pub struct NodeIdentity {
    /// The node name (etcd member name, a DNS SAN of the apiserver and etcd certificates).
    pub node_name: String,
    /// The node's own address, when known.
    pub node_ip: Option<IpAddr>,
    /// The cluster VIP in front of every apiserver, when there is one.
    pub vip: Option<IpAddr>,
    /// The first address of the service range: the `kubernetes` Service's cluster IP.
    pub service_ip: IpAddr,
    /// The cluster DNS domain.
    pub cluster_domain: String,
    /// More apiserver SANs (DNS names or IPs).
    pub extra_sans: Vec<String>,
}

impl NodeIdentity {
    /// A node named `node_name` with the defaults: service IP 10.43.0.1 (the first
    /// address of the default 10.43.0.0/16 service range), domain `cluster.local`.
    pub fn new(node_name: impl Into<String>) -> Self {
        NodeIdentity {
            node_name: node_name.into(),
            node_ip: None,
            vip: None,
            service_ip: IpAddr::V4(Ipv4Addr::new(10, 43, 0, 1)),
            cluster_domain: "cluster.local".into(),
            extra_sans: Vec::new(),
        }
    }

    /// This host's name, lower-cased: the default node name (as kubeadm takes it).
    pub fn host_name() -> Result<String, String> {
        let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map_err(|e| format!("cannot read the host name ({e}): pass --node-name"))?;
        let name = raw.trim().to_lowercase();
        if name.is_empty() {
            return Err("the host name is empty: pass --node-name".into());
        }
        Ok(name)
    }

    /// The apiserver serving certificate's SANs.
    pub fn apiserver_spec(&self) -> LeafSpec {
        let mut spec = LeafSpec::new("kube-apiserver", &[Usage::ServerAuth]);
        spec.dns_names = vec![
            "kubernetes".into(),
            "kubernetes.default".into(),
            "kubernetes.default.svc".into(),
            format!("kubernetes.default.svc.{}", self.cluster_domain),
            self.node_name.clone(),
            "localhost".into(),
        ];
        spec.ips = vec![self.service_ip, IpAddr::V4(Ipv4Addr::LOCALHOST)];
        spec.ips.extend(self.node_ip);
        spec.ips.extend(self.vip);
        for san in &self.extra_sans {
            match san.parse::<IpAddr>() {
                Ok(ip) => spec.ips.push(ip),
                Err(_) => spec.dns_names.push(san.clone()),
            }
        }
        dedup(&mut spec.dns_names);
        dedup(&mut spec.ips);
        spec
    }

    /// The etcd server (or peer) certificate: both usages, because etcd also dials its
    /// peers and itself with the same certificate.
    pub fn etcd_spec(&self) -> LeafSpec {
        let mut spec = LeafSpec::new(
            self.node_name.clone(),
            &[Usage::ServerAuth, Usage::ClientAuth],
        );
        spec.dns_names = vec![self.node_name.clone(), "localhost".into()];
        spec.ips = vec![IpAddr::V4(Ipv4Addr::LOCALHOST)];
        spec.ips.extend(self.node_ip);
        dedup(&mut spec.dns_names);
        dedup(&mut spec.ips);
        spec
    }

    /// Every leaf of this node: (relative path prefix, issuing CA prefix, spec).
    pub fn leaf_specs(&self) -> Vec<(&'static str, &'static str, LeafSpec)> {
        let client = |cn: &str, orgs: &[&str]| {
            let mut s = LeafSpec::new(cn, &[Usage::ClientAuth]);
            s.organizations = orgs.iter().map(|o| o.to_string()).collect();
            s
        };
        vec![
            ("apiserver", "ca", self.apiserver_spec()),
            (
                "apiserver-kubelet-client",
                "ca",
                client("kube-apiserver-kubelet-client", &["system:masters"]),
            ),
            (
                "front-proxy-client",
                "front-proxy-ca",
                client("front-proxy-client", &[]),
            ),
            ("etcd/server", "etcd/ca", self.etcd_spec()),
            ("etcd/peer", "etcd/ca", self.etcd_spec()),
            (
                "etcd/healthcheck-client",
                "etcd/ca",
                client("kube-etcd-healthcheck-client", &[]),
            ),
            (
                "apiserver-etcd-client",
                "etcd/ca",
                client("kube-apiserver-etcd-client", &[]),
            ),
        ]
    }
}

fn dedup<T: PartialEq + Clone>(v: &mut Vec<T>) {
    let mut out: Vec<T> = Vec::with_capacity(v.len());
    for x in v.drain(..) {
        if !out.contains(&x) {
            out.push(x);
        }
    }
    *v = out;
}

/// Relative paths of every file [`issue_node_leaves`] writes.
pub fn node_leaf_files() -> Vec<String> {
    NodeIdentity::new("x")
        .leaf_specs()
        .into_iter()
        .flat_map(|(p, _, _)| [format!("{p}.crt"), format!("{p}.key")])
        .collect()
}

/// Issues this node's leaves from the CAs in `dir` and writes them there. With
/// `overwrite` false it refuses, before writing anything, when any leaf key exists.
pub fn issue_node_leaves(
    dir: &Path,
    node: &NodeIdentity,
    overwrite: bool,
) -> Result<Vec<PathBuf>, PkiError> {
    if node.node_name.is_empty() {
        return Err(PkiError::Invalid {
            what: "node name".into(),
            reason: "empty: pass --node-name".into(),
        });
    }
    let files = node_leaf_files();
    let rels: Vec<&str> = files.iter().map(String::as_str).collect();
    refuse_existing_keys(dir, &rels, overwrite)?;
    let cas = [
        ("ca", Ca::load(dir, "ca")?),
        ("front-proxy-ca", Ca::load(dir, "front-proxy-ca")?),
        ("etcd/ca", Ca::load(dir, "etcd/ca")?),
    ];
    let refs: Vec<(&str, &Ca)> = cas.iter().map(|(p, c)| (*p, c)).collect();
    let out = leaves_from(&refs, node)?;
    write_files(dir, &out)
}

/// This node's leaves issued in memory from `cas` (CA prefix, CA): (relative path, bytes).
pub(crate) fn leaves_from(
    cas: &[(&str, &Ca)],
    node: &NodeIdentity,
) -> Result<Vec<(String, Vec<u8>)>, PkiError> {
    if node.node_name.is_empty() {
        return Err(PkiError::Invalid {
            what: "node name".into(),
            reason: "empty: pass --node-name".into(),
        });
    }
    let mut out = Vec::new();
    for (prefix, ca_prefix, spec) in node.leaf_specs() {
        let ca = cas
            .iter()
            .find(|(p, _)| *p == ca_prefix)
            .map(|(_, c)| *c)
            .ok_or_else(|| PkiError::Invalid {
                what: format!("{prefix}.crt"),
                reason: format!("no CA {ca_prefix} to issue it from"),
            })?;
        let issued = ca.issue(&spec)?;
        out.push((format!("{prefix}.crt"), issued.cert_pem.into_bytes()));
        out.push((format!("{prefix}.key"), issued.key_pem.into_bytes()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apiserver_sans_cover_service_names_node_and_vip() {
        let mut id = NodeIdentity::new("cp-1");
        id.node_ip = Some("10.0.0.5".parse().unwrap());
        id.vip = Some("10.0.0.100".parse().unwrap());
        let spec = id.apiserver_spec();
        for dns in [
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "cp-1",
            "localhost",
        ] {
            assert!(spec.dns_names.iter().any(|d| d == dns), "missing {dns}");
        }
        for ip in ["10.43.0.1", "127.0.0.1", "10.0.0.5", "10.0.0.100"] {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(spec.ips.contains(&ip), "missing {ip}");
        }
    }

    #[test]
    fn etcd_certs_serve_and_dial() {
        let spec = NodeIdentity::new("cp-1").etcd_spec();
        assert_eq!(spec.usages, vec![Usage::ServerAuth, Usage::ClientAuth]);
    }

    #[test]
    fn leaf_files_are_pairs() {
        let files = node_leaf_files();
        assert_eq!(files.len(), 14);
        assert!(files.contains(&"etcd/peer.key".to_string()));
    }
}
