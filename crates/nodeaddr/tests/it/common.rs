//! Shared helpers: nodes shaped like a kubelet registers them, and polling.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use nodeaddr::{RUNTIME_LABEL, RUNTIME_VIRTUAL};

pub use testkube::fixtures::{
    eventually_within as eventually, install_crypto, kubelet_addresses, kubelet_node,
};

pub fn virtual_node(name: &str) -> Node {
    let mut n = kubelet_node(name, 250);
    n.metadata.labels = Some([(RUNTIME_LABEL.to_string(), RUNTIME_VIRTUAL.to_string())].into());
    n
}

pub async fn create_nodes(api: &Api<Node>, nodes: impl IntoIterator<Item = Node>) {
    for n in nodes {
        api.create(&PostParams::default(), &n).await.unwrap();
    }
}

/// Plays a kubelet status write: re-reads the node and stores its self-reported
/// addresses, which drops the ExternalIP the reconciler set.
pub async fn kubelet_status_write(api: &Api<Node>, name: &str, lan_octet: u8) {
    for _ in 0..10 {
        let mut n = api.get(name).await.unwrap();
        n.status.as_mut().unwrap().addresses = Some(kubelet_addresses(name, lan_octet));
        match api.replace_status(name, &PostParams::default(), &n).await {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => panic!("kubelet status write for {name}: {e}"),
        }
    }
    panic!("kubelet status write for {name} kept conflicting");
}

/// Whether every routed node of the cluster carries what diagnostics expects.
pub async fn all_patched(r: &nodeaddr::Reconciler) -> bool {
    match r.diagnostics().await {
        Ok(rows) => rows.iter().all(|d| d.skipped.is_some() || d.patched),
        Err(_) => false,
    }
}
