//! Forwarding of `pods/log`, `pods/exec`, `pods/attach`, `pods/portforward` and
//! `nodes/{name}/proxy/{path}` (plain GETs only: [`forward_node`]) to the kubelet.
//!
//! This follows kube-apiserver (`pkg/registry/core/pod/strategy.go` for the locations,
//! `pkg/kubelet/client/kubelet_client.go` for the connection, the upgrade-aware proxy in
//! `apimachinery/pkg/util/proxy` for exec/attach/port-forward, and the generic location
//! streamer for logs):
//! - the kubelet is the node's first address in the preferred address-type order, on
//!   `status.daemonEndpoints.kubeletEndpoint.Port` (10250 when unset), over HTTPS with a
//!   client certificate, its serving certificate checked only when a CA is configured;
//! - logs are a fresh `GET /containerLogs/...` whose body is streamed back;
//! - exec, attach and port-forward pass the client's upgrade request to the kubelet and,
//!   once it answers 101, splice the two connections byte for byte (SPDY or WebSocket:
//!   whatever the client speaks reaches the kubelet unchanged).
//!
//! Unlike kube-apiserver, the double dials only loopback addresses unless
//! [`ProxyConfig::allow_non_loopback`] is set: a node address elsewhere fails exactly like
//! an unreachable kubelet (500, `dial tcp ...`), and no packet leaves the machine.
//!
//! The pure parts ([`kubelet_target`], [`choose_container`], [`log_location`],
//! [`exec_location`], [`port_forward_location`]) decide; [`forward`] applies.
//!
//! By job: `location` (where a request goes), `dial` (reaching the kubelet: loopback
//! policy, TLS), `forward` (logs and upgrades), `errors` (the Statuses failures become).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::body::{Body, BoxError, empty};
use crate::status::failure;

/// The kubelet port when a node does not report one.
pub const DEFAULT_KUBELET_PORT: u16 = 10250;
/// kube-apiserver's default `--kubelet-preferred-address-types`.
pub const DEFAULT_ADDRESS_TYPES: &[&str] = &[
    "Hostname",
    "InternalDNS",
    "InternalIP",
    "ExternalDNS",
    "ExternalIP",
];
/// How long a dial (TCP and TLS) may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// How much of a kubelet error body is read into the Status message (kube-apiserver's
/// `maxReadLength`).
const MAX_ERROR_BODY: usize = 50_000;

/// How the double reaches kubelets.
#[derive(Clone)]
pub struct ProxyConfig {
    /// Node address types in order of preference.
    pub preferred_address_types: Vec<String>,
    /// CA bundle (PEM) that kubelet serving certificates must chain to; `None` skips
    /// verification, as kube-apiserver does without `--kubelet-certificate-authority`.
    pub kubelet_ca: Option<Vec<u8>>,
    /// The client certificate (PEM) presented to kubelets.
    pub client_cert_pem: String,
    /// Its private key (PEM).
    pub client_key_pem: String,
    /// Dial node addresses outside 127.0.0.0/8 and ::1 (and resolve host names).
    pub allow_non_loopback: bool,
}

impl std::fmt::Debug for ProxyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyConfig")
            .field("preferred_address_types", &self.preferred_address_types)
            .field("kubelet_ca", &self.kubelet_ca.as_ref().map(|_| "<pem>"))
            .field("allow_non_loopback", &self.allow_non_loopback)
            .finish_non_exhaustive()
    }
}

impl Default for ProxyConfig {
    fn default() -> Self {
        let (client_cert_pem, client_key_pem) =
            client_certificate().expect("generating a client certificate with rcgen");
        ProxyConfig {
            preferred_address_types: DEFAULT_ADDRESS_TYPES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            kubelet_ca: None,
            client_cert_pem,
            client_key_pem,
            allow_non_loopback: false,
        }
    }
}

/// A self-signed client certificate as kube-apiserver's kubelet client has
/// (`CN=kube-apiserver-kubelet-client, O=system:masters`): `(cert_pem, key_pem)`.
pub fn client_certificate() -> Result<(String, String), rcgen::Error> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kube-apiserver-kubelet-client");
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:masters");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

mod dial;
mod errors;
mod forward;
mod location;

pub use dial::{is_loopback, loopback_target};
pub use errors::ProxyError;
pub use forward::{forward, forward_node, is_upgrade_request};
pub use location::{
    LogLocation, choose_container, exec_location, kubelet_target, log_location,
    port_forward_location,
};
use {dial::*, location::*};

#[cfg(test)]
mod tests {
    use super::errors::kubelet_status;
    use super::*;

    fn pod(node: &str, containers: &[&str], init: &[&str]) -> Value {
        let c = |names: &[&str]| names.iter().map(|n| json!({"name": n})).collect::<Vec<_>>();
        json!({
            "metadata": {"name": "web", "namespace": "team-a"},
            "spec": {"nodeName": node, "containers": c(containers), "initContainers": c(init)},
        })
    }

    fn node(addresses: &[(&str, &str)], port: i64) -> Value {
        json!({
            "metadata": {"name": "n1"},
            "status": {
                "addresses": addresses.iter().map(|(t, a)| json!({"type": t, "address": a})).collect::<Vec<_>>(),
                "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
            }
        })
    }

    fn prefs() -> Vec<String> {
        DEFAULT_ADDRESS_TYPES
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    #[test]
    fn address_follows_preference_order_not_list_order() {
        let n = node(
            &[
                ("ExternalIP", "203.0.113.9"),
                ("InternalIP", "127.0.0.9"),
                ("Hostname", "n1"),
            ],
            0,
        );
        assert_eq!(kubelet_target(&n, &prefs()).unwrap(), ("n1".into(), 10250));
        let ip_first = vec!["InternalIP".to_string(), "Hostname".to_string()];
        assert_eq!(
            kubelet_target(&n, &ip_first).unwrap(),
            ("127.0.0.9".into(), 10250)
        );
    }

    #[test]
    fn port_comes_from_daemon_endpoints_when_positive() {
        let n = node(&[("InternalIP", "127.0.0.9")], 31250);
        assert_eq!(kubelet_target(&n, &prefs()).unwrap().1, 31250);
        let n = node(&[("InternalIP", "127.0.0.9")], -1);
        assert_eq!(kubelet_target(&n, &prefs()).unwrap().1, 10250);
    }

    #[test]
    fn no_preferred_address_lists_known_ones() {
        let n = node(&[("InternalIP", "127.0.0.9")], 0);
        let err = kubelet_target(&n, &["Hostname".to_string()]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no preferred addresses found; known addresses: [{InternalIP 127.0.0.9}]"
        );
    }

    #[test]
    fn container_choice_matches_kube_apiserver() {
        assert_eq!(choose_container(&pod("n", &["a"], &[]), None).unwrap(), "a");
        assert_eq!(
            choose_container(&pod("n", &["a", "b"], &["i"]), Some("i")).unwrap(),
            "i"
        );
        assert_eq!(
            choose_container(&pod("n", &["a", "b"], &["i"]), None)
                .unwrap_err()
                .to_string(),
            "a container name must be specified for pod web, choose one of: [i a b]"
        );
        assert_eq!(
            choose_container(&pod("n", &["a"], &[]), Some("c"))
                .unwrap_err()
                .to_string(),
            "container c is not valid for pod web"
        );
        assert_eq!(
            choose_container(&pod("n", &[], &[]), None)
                .unwrap_err()
                .to_string(),
            "a container name must be specified for pod web"
        );
    }

    #[test]
    fn log_query_maps_only_true_flags_and_passes_numbers() {
        let loc = log_location(
            &pod("n", &["app"], &[]),
            "follow=true&previous=false&timestamps=1&tailLines=5&limitBytes=100&sinceSeconds=60&container=app",
        )
        .unwrap();
        assert_eq!(
            loc.path_and_query.unwrap(),
            "/containerLogs/team-a/web/app?follow=true&limitBytes=100&sinceSeconds=60&tailLines=5&timestamps=true"
        );
        let loc = log_location(
            &pod("n", &["app"], &[]),
            "sinceTime=2024-05-01T10:00:00%2B02:00",
        )
        .unwrap();
        assert_eq!(
            loc.path_and_query.unwrap(),
            "/containerLogs/team-a/web/app?sinceTime=2024-05-01T08%3A00%3A00Z"
        );
    }

    #[test]
    fn log_options_are_validated() {
        let p = pod("n", &["app"], &[]);
        let e = log_location(&p, "tailLines=-1").unwrap_err();
        assert_eq!(
            e.to_string(),
            "PodLogOptions \"web\" is invalid: tailLines: Invalid value: -1: must be greater than or equal to 0"
        );
        assert!(matches!(
            log_location(&p, "sinceSeconds=5&sinceTime=2024-05-01T10:00:00Z"),
            Err(ProxyError::InvalidLogOptions { .. })
        ));
        assert!(matches!(
            log_location(&p, "tailLines=abc"),
            Err(ProxyError::BadRequest(_))
        ));
    }

    #[test]
    fn unscheduled_pod_logs_are_empty_but_exec_is_refused() {
        let p = pod("", &["app"], &[]);
        assert_eq!(log_location(&p, "").unwrap().path_and_query, None);
        assert_eq!(
            exec_location(&p, "exec", "command=ls")
                .unwrap_err()
                .to_string(),
            "pod web does not have a host assigned"
        );
        assert_eq!(
            port_forward_location(&p, "ports=80")
                .unwrap_err()
                .to_string(),
            "pod web does not have a host assigned"
        );
    }

    #[test]
    fn exec_query_maps_to_kubelet_flags() {
        let p = pod("n", &["app"], &[]);
        assert_eq!(
            exec_location(
                &p,
                "exec",
                "command=sh&command=-c&command=echo+a%26b&stdin=true&stdout=true&stderr=true&tty=false"
            )
            .unwrap(),
            "/exec/team-a/web/app?command=sh&command=-c&command=echo+a%26b&error=1&input=1&output=1"
        );
        assert_eq!(
            exec_location(&p, "attach", "stdin=1&tty=true&command=ignored").unwrap(),
            "/attach/team-a/web/app?input=1&tty=1"
        );
    }

    #[test]
    fn port_forward_ports_are_joined() {
        let p = pod("n", &["app"], &[]);
        assert_eq!(
            port_forward_location(&p, "ports=80&ports=443").unwrap(),
            "/portForward/team-a/web?port=80%2C443"
        );
        assert!(port_forward_location(&p, "ports=http").is_err());
    }

    #[test]
    fn only_loopback_is_dialed() {
        assert!(loopback_target("127.0.0.7", 1).is_ok());
        assert!(loopback_target("::1", 1).is_ok());
        assert!(loopback_target("::ffff:127.0.0.1", 1).is_ok());
        assert!(loopback_target("localhost", 1).is_ok());
        for bad in [
            "10.0.0.5",
            "0.0.0.0",
            "::",
            "192.168.1.1",
            "::ffff:10.0.0.1",
            "node-1",
        ] {
            let e = loopback_target(bad, 10250).unwrap_err();
            assert!(e.starts_with("dial tcp"), "{e}");
            assert!(
                e.contains("not dialed") || e.contains("not resolved"),
                "{e}"
            );
        }
    }

    #[test]
    fn kubelet_errors_become_statuses() {
        let r = kubelet_status(404, "pod \"x\" does not exist", "web");
        assert_eq!(r.status(), 404);
        let r = kubelet_status(400, "bad", "web");
        assert_eq!(r.status(), 400);
    }
}
