//! The front of a control plane, as pure rendering: the per-node HAProxy configuration
//! that spreads API clients over every API server, and the kube-vip static pod that holds
//! the cluster VIP. `ha::front` checks the configuration with `haproxy -c`, installs it and
//! reloads the running HAProxy; nothing here touches a file or a process.
//!
//! Every value that ends up in the configuration is checked here first. HAProxy's config
//! is line- and word-oriented (a space ends a word, `#` starts a comment, a newline starts
//! a directive), so a member name or address carrying any of those could add directives of
//! its own: such a value is an error naming it, never escaped into something else.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EnvVar, HostAlias, HostPathVolumeSource, Pod, PodSpec,
    SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The API server port a member serves on unless told otherwise.
pub const DEFAULT_API_PORT: u16 = 6443;
/// Where the per-node HAProxy listens by default: loopback only, beside (not on) the
/// local API server's own port, so local clients reach every API server through it.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:6444";
/// How long an idle connection (a watch between events) may stay open through the front.
/// Watches are long-lived by design; seconds would cut every watch.
pub const WATCH_TIMEOUT: Duration = Duration::from_secs(4 * 3600);
/// How long an old HAProxy worker keeps serving its open connections after a reload.
pub const HARD_STOP_AFTER: Duration = Duration::from_secs(30 * 60);

/// A value the renderer refuses, naming it and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrontError {
    /// No API server to send clients to.
    #[error("no API servers to front: give at least one HOST:PORT")]
    NoServers,
    /// A `HOST:PORT` that does not parse.
    #[error("API server {value:?} is not HOST:PORT ({reason})")]
    BadServer {
        /// The value as given.
        value: String,
        /// Why.
        reason: &'static str,
    },
    /// A host that is neither an IP address nor a DNS name (it could inject config).
    #[error(
        "API server host {value:?} is neither an IP address nor a DNS name; refusing to put it \
         in the HAProxy configuration"
    )]
    BadHost {
        /// The host as given.
        value: String,
    },
    /// A server name with characters HAProxy's config would read as syntax.
    #[error(
        "server name {value:?} may only hold letters, digits, '.', '-', '_' and ':' (1 to 64 of them)"
    )]
    BadName {
        /// The name as given.
        value: String,
    },
    /// The same server twice.
    #[error("API server {value} is listed twice")]
    Duplicate {
        /// The server.
        value: String,
    },
    /// A file path HAProxy's config could not hold as one word.
    #[error(
        "{what} {path:?} must be an absolute path of printable characters without spaces, \
         quotes, '#', '$' or '\\'"
    )]
    BadPath {
        /// Which file.
        what: &'static str,
        /// The path as given.
        path: String,
    },
    /// A kube-vip setting that cannot be used.
    #[error("kube-vip {what} {value:?}: {reason}")]
    BadVip {
        /// Which setting.
        what: &'static str,
        /// The value.
        value: String,
        /// Why.
        reason: &'static str,
    },
}

/// One API server behind the front.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Backend {
    /// Its `server` name in the configuration (checked by [`check_name`]).
    pub name: String,
    /// Its address: an IP address or a DNS name (checked by [`check_host`]).
    pub host: String,
    /// Its API port.
    pub port: u16,
}

impl Backend {
    /// A backend named after its host: `apiserver-<host>`.
    pub fn new(host: &str, port: u16) -> Result<Backend, FrontError> {
        let host = check_host(host)?;
        let b = Backend {
            name: format!("apiserver-{host}"),
            host,
            port,
        };
        check_name(&b.name)?;
        Ok(b)
    }

    /// `HOST:PORT`, an IPv6 host in brackets.
    pub fn address(&self) -> String {
        match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(v6)) => format!("[{v6}]:{}", self.port),
            _ => format!("{}:{}", self.host, self.port),
        }
    }
}

/// Checks a server name: 1 to 64 of `[A-Za-z0-9._:-]` (HAProxy's own identifier set).
pub fn check_name(name: &str) -> Result<(), FrontError> {
    let ok = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
    if ok {
        Ok(())
    } else {
        Err(FrontError::BadName {
            value: name.to_string(),
        })
    }
}

/// Checks a host: an IP address (returned in canonical form) or an RFC 1123 DNS name
/// (returned lower-cased). Anything else is [`FrontError::BadHost`].
pub fn check_host(host: &str) -> Result<String, FrontError> {
    let bad = || FrontError::BadHost {
        value: host.to_string(),
    };
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        if ip.is_unspecified() || ip.is_multicast() {
            return Err(bad());
        }
        return Ok(ip.to_string());
    }
    if bare != host || host.is_empty() || host.len() > 253 {
        return Err(bad());
    }
    let name = host.strip_suffix('.').unwrap_or(host);
    let label_ok = |l: &str| {
        (1..=63).contains(&l.len())
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    // A name of digits and dots only is a malformed IPv4 address, not a name.
    let numeric = name.chars().all(|c| c.is_ascii_digit() || c == '.');
    if name.split('.').all(label_ok) && !numeric {
        Ok(name.to_ascii_lowercase())
    } else {
        Err(bad())
    }
}

/// Parses one `HOST:PORT` (`[v6]:PORT` for IPv6). A bare host takes `default_port`.
pub fn parse_server(value: &str, default_port: u16) -> Result<Backend, FrontError> {
    let v = value.trim();
    let bad = |reason| FrontError::BadServer {
        value: value.to_string(),
        reason,
    };
    if v.is_empty() {
        return Err(bad("empty"));
    }
    let (host, port) = if let Some(rest) = v.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or_else(|| bad("unclosed '['"))?;
        match after.strip_prefix(':') {
            Some(p) => (h, Some(p)),
            None if after.is_empty() => (h, None),
            None => return Err(bad("text after ']' that is not :PORT")),
        }
    } else if v.parse::<IpAddr>().is_ok() {
        // A bare IPv6 address: its colons are not a port separator.
        (v, None)
    } else {
        match v.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (v, None),
        }
    };
    let port = match port {
        None => default_port,
        Some(p) => match p.parse::<u16>() {
            Ok(0) | Err(_) => return Err(bad("the port must be 1 to 65535")),
            Ok(n) => n,
        },
    };
    Backend::new(host, port)
}

/// Parses a comma-separated `HOST:PORT,...` list.
pub fn parse_servers(list: &[String], default_port: u16) -> Result<Vec<Backend>, FrontError> {
    list.iter()
        .flat_map(|s| s.split(','))
        .filter(|s| !s.trim().is_empty())
        .map(|s| parse_server(s, default_port))
        .collect()
}

/// Backends for member hosts (as `hacore::etcd::rules::client_hosts` lists them), each on
/// `port`.
pub fn backends_for_hosts(hosts: &[String], port: u16) -> Result<Vec<Backend>, FrontError> {
    hosts.iter().map(|h| Backend::new(h, port)).collect()
}

/// What the HAProxy configuration is rendered from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontSpec {
    /// Where HAProxy listens for API clients.
    pub listen: SocketAddr,
    /// The API servers; order does not matter (the rendering sorts them).
    pub backends: Vec<Backend>,
    /// The cluster CA (PEM) the health checks verify each API server's certificate with.
    pub ca_file: PathBuf,
    /// Time between health checks of a server.
    pub check_interval: Duration,
    /// An optional stats socket (`show stat` for operators and tests), mode 0600.
    pub stats_socket: Option<PathBuf>,
}

impl FrontSpec {
    /// The defaults for `backends`: [`DEFAULT_LISTEN`], the CA at `ca_file`, a check every
    /// 2 s, no stats socket.
    pub fn new(backends: Vec<Backend>, ca_file: impl Into<PathBuf>) -> FrontSpec {
        FrontSpec {
            listen: DEFAULT_LISTEN
                .parse()
                .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 6444))),
            backends,
            ca_file: ca_file.into(),
            check_interval: Duration::from_secs(2),
            stats_socket: None,
        }
    }
}

/// Checks a path for the config: absolute, printable ASCII, no word or comment syntax.
fn check_path(what: &'static str, path: &Path) -> Result<String, FrontError> {
    let text = path.to_str().unwrap_or("");
    let ok = path.is_absolute()
        && !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_graphic() && !matches!(c, '#' | '"' | '\'' | '\\' | '$'));
    if ok {
        Ok(text.to_string())
    } else {
        Err(FrontError::BadPath {
            what,
            path: path.display().to_string(),
        })
    }
}

/// HAProxy's time format: milliseconds, or whole seconds/minutes/hours when exact.
fn hatime(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "1ms".into();
    }
    if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// Renders the per-node HAProxy configuration: TCP pass-through to every API server
/// (clients keep their end-to-end TLS and client certificates), `balance leastconn` (a
/// watch is one long connection: counting connections spreads them, round-robin would
/// not), health checks of `GET /readyz` over TLS verified against the cluster CA, and
/// timeouts of hours so watches are not cut. The same spec renders the same bytes, whatever
/// order the backends come in: an unchanged member list never reloads HAProxy.
pub fn render_haproxy(spec: &FrontSpec) -> Result<String, FrontError> {
    if spec.backends.is_empty() {
        return Err(FrontError::NoServers);
    }
    let ca = check_path("CA file", &spec.ca_file)?;
    let stats = spec
        .stats_socket
        .as_deref()
        .map(|p| check_path("stats socket", p))
        .transpose()?;
    let mut backends = BTreeMap::new();
    for b in &spec.backends {
        check_name(&b.name)?;
        let host = check_host(&b.host)?;
        if b.port == 0 {
            return Err(FrontError::BadServer {
                value: b.address(),
                reason: "the port must be 1 to 65535",
            });
        }
        let canonical = Backend {
            name: b.name.clone(),
            host,
            port: b.port,
        };
        let addr = canonical.address();
        if backends
            .values()
            .any(|o: &Backend| o.address() == addr || o.name == canonical.name)
        {
            return Err(FrontError::Duplicate { value: addr });
        }
        backends.insert(canonical.name.clone(), canonical);
    }
    let listen = match spec.listen {
        SocketAddr::V4(a) => a.to_string(),
        SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
    };
    let watch = hatime(WATCH_TIMEOUT);
    let inter = hatime(spec.check_interval);
    let mut out = String::new();
    // `write!` into a String cannot fail; the results are ignored deliberately.
    let _ = writeln!(
        out,
        "# Rendered by stratum-server (ha::front) from the control-plane member list.\n\
         # Replaced whenever the member list changes: do not edit."
    );
    let _ = writeln!(out, "global");
    let _ = writeln!(out, "    log stderr format raw local0 info");
    // No `maxconn`: HAProxy derives it from the file-descriptor limit it is given. A fixed
    // one larger than that limit allows makes HAProxy refuse to start (which `haproxy -c`
    // does not catch: the limit is the running process's).
    let _ = writeln!(out, "    hard-stop-after {}", hatime(HARD_STOP_AFTER));
    if let Some(s) = &stats {
        let _ = writeln!(out, "    stats socket {s} mode 600 level user");
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "defaults");
    let _ = writeln!(out, "    mode tcp");
    let _ = writeln!(out, "    log global");
    let _ = writeln!(out, "    option tcplog");
    let _ = writeln!(out, "    option dontlognull");
    // A connection refused by a server that died since its last check is retried, and
    // every retry may go to another server: a client never sees the dead one.
    let _ = writeln!(out, "    retries 3");
    let _ = writeln!(out, "    option redispatch 1");
    let _ = writeln!(out, "    timeout connect 5s");
    let _ = writeln!(out, "    timeout client {watch}");
    let _ = writeln!(out, "    timeout server {watch}");
    let _ = writeln!(out, "    timeout tunnel {watch}");
    let _ = writeln!(out, "    timeout client-fin 30s");
    let _ = writeln!(out, "    timeout check 5s");
    let _ = writeln!(out);
    let _ = writeln!(out, "frontend kube-apiserver");
    let _ = writeln!(out, "    bind {listen}");
    let _ = writeln!(out, "    default_backend kube-apiservers");
    let _ = writeln!(out);
    let _ = writeln!(out, "backend kube-apiservers");
    let _ = writeln!(out, "    balance leastconn");
    let _ = writeln!(out, "    option httpchk GET /readyz");
    let _ = writeln!(out, "    http-check expect status 200");
    // The check speaks TLS and verifies the server's chain against the cluster CA: a
    // port answering with some other certificate is not this cluster's API server. (The
    // host name is not matched: HAProxy matches `verifyhost` against DNS names only, and
    // members are addressed by IP; the chain is what tells this cluster from another.)
    // A connection error marks a server down at once, without waiting for its checks; a
    // DNS name that does not resolve yet disables that one server, not the whole front.
    let _ = writeln!(
        out,
        "    default-server check check-ssl verify required ca-file {ca} inter {inter} fall 2 rise 2 \
         observe layer4 error-limit 1 on-error mark-down init-addr libc,none"
    );
    for b in backends.values() {
        let _ = writeln!(out, "    server {} {}", b.name, b.address());
    }
    Ok(out)
}

/// What the kube-vip static pod is rendered from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeVipSpec {
    /// The cluster VIP.
    pub vip: IpAddr,
    /// The interface the VIP is announced on (ARP).
    pub interface: String,
    /// The API server port the VIP serves.
    pub port: u16,
    /// The kube-vip image.
    pub image: String,
    /// The kubeconfig kube-vip runs with on the host (for its leader-election Lease).
    pub kubeconfig: PathBuf,
}

/// The kube-vip image used unless told otherwise.
pub const KUBE_VIP_IMAGE: &str = "ghcr.io/kube-vip/kube-vip:v0.8.9";
/// The Lease in kube-system whose holder owns the VIP.
pub const KUBE_VIP_LEASE: &str = "plndr-cp-lock";

fn check_interface(name: &str) -> Result<(), FrontError> {
    // Linux interface names: at most 15 bytes, no '/', no whitespace, not "." or "..".
    let ok = (1..=15).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '@'))
        && name != "."
        && name != "..";
    if ok {
        Ok(())
    } else {
        Err(FrontError::BadVip {
            what: "interface",
            value: name.to_string(),
            reason: "not a Linux interface name (1 to 15 of letters, digits, '.', '-', '_', '@')",
        })
    }
}

/// The kube-vip static pod (`kube-system/kube-vip`): ARP mode on `interface`, the
/// control-plane VIP on `port`, leader election through the [`KUBE_VIP_LEASE`] Lease in
/// kube-system, so exactly one control plane answers ARP for the VIP at a time. It runs
/// on the host network with NET_ADMIN and NET_RAW (to add the address and send gratuitous
/// ARP) and reads the node's kubeconfig; `kubernetes` resolves to the local API server
/// (a static pod starts before cluster DNS does).
pub fn kube_vip_pod(spec: &KubeVipSpec) -> Result<Pod, FrontError> {
    check_interface(&spec.interface)?;
    if spec.vip.is_unspecified() || spec.vip.is_loopback() || spec.vip.is_multicast() {
        return Err(FrontError::BadVip {
            what: "VIP",
            value: spec.vip.to_string(),
            reason: "a VIP must be a unicast address other nodes can reach",
        });
    }
    if spec.port == 0 {
        return Err(FrontError::BadVip {
            what: "port",
            value: "0".into(),
            reason: "must be 1 to 65535",
        });
    }
    let kubeconfig = check_path("kube-vip kubeconfig", &spec.kubeconfig)?;
    let cidr = if spec.vip.is_ipv4() { "32" } else { "128" };
    let env = |name: &str, value: &str| EnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    };
    let container = Container {
        name: "kube-vip".into(),
        image: Some(spec.image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        args: Some(vec!["manager".into()]),
        env: Some(vec![
            env("vip_arp", "true"),
            env("port", &spec.port.to_string()),
            env("vip_interface", &spec.interface),
            env("vip_cidr", cidr),
            env("cp_enable", "true"),
            env("cp_namespace", "kube-system"),
            env("vip_leaderelection", "true"),
            env("vip_leasename", KUBE_VIP_LEASE),
            env("vip_leaseduration", "5"),
            env("vip_renewdeadline", "3"),
            env("vip_retryperiod", "1"),
            env("address", &spec.vip.to_string()),
        ]),
        security_context: Some(SecurityContext {
            capabilities: Some(Capabilities {
                add: Some(vec!["NET_ADMIN".into(), "NET_RAW".into()]),
                drop: None,
            }),
            ..Default::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: "kubeconfig".into(),
            mount_path: "/etc/kubernetes/admin.conf".into(),
            read_only: Some(true),
            ..Default::default()
        }]),
        ..Default::default()
    };
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some("kube-vip".into()),
            namespace: Some("kube-system".into()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/name".to_string(),
                "kube-vip".to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![container],
            host_network: Some(true),
            priority_class_name: Some("system-node-critical".into()),
            host_aliases: Some(vec![HostAlias {
                ip: "127.0.0.1".into(),
                hostnames: Some(vec!["kubernetes".into()]),
            }]),
            volumes: Some(vec![Volume {
                name: "kubeconfig".into(),
                host_path: Some(HostPathVolumeSource {
                    path: kubeconfig,
                    type_: Some("File".into()),
                }),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(servers: &[&str]) -> FrontSpec {
        let backends = servers
            .iter()
            .map(|s| parse_server(s, DEFAULT_API_PORT).unwrap())
            .collect();
        FrontSpec::new(backends, "/etc/kubernetes/pki/ca.crt")
    }

    #[test]
    fn renders_tcp_leastconn_tls_checks_and_watch_timeouts() {
        let cfg = render_haproxy(&spec(&["10.0.0.1:6443", "10.0.0.2", "[fd00::3]:6443"])).unwrap();
        for want in [
            "    mode tcp\n",
            "    balance leastconn\n",
            "    option httpchk GET /readyz\n",
            "check check-ssl verify required ca-file /etc/kubernetes/pki/ca.crt",
            "    timeout client 4h\n",
            "    timeout server 4h\n",
            "    timeout tunnel 4h\n",
            "    bind 127.0.0.1:6444\n",
            "    server apiserver-10.0.0.1 10.0.0.1:6443\n",
            "    server apiserver-10.0.0.2 10.0.0.2:6443\n",
            "    server apiserver-fd00::3 [fd00::3]:6443\n",
        ] {
            assert!(cfg.contains(want), "missing {want:?} in\n{cfg}");
        }
        assert!(!cfg.contains("verify none"), "{cfg}");
    }

    #[test]
    fn rendering_is_deterministic_whatever_the_order() {
        let a = render_haproxy(&spec(&["10.0.0.2", "10.0.0.1", "cp3.example"])).unwrap();
        let b = render_haproxy(&spec(&["cp3.example", "10.0.0.1", "10.0.0.2"])).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn hostile_hosts_are_refused_not_escaped() {
        for hostile in [
            "10.0.0.1\n    server evil 6.6.6.6",
            "10.0.0.1 backup",
            "cp1#comment",
            "cp1\"",
            "cp 1",
            "cp1\r",
            "cp1\\n",
            "-cp1",
            "cp1..example",
            "",
            "0.0.0.0",
            "999.1.1.1",
            "cp1$HOME",
            "a".repeat(64).as_str(),
        ] {
            let err = Backend::new(hostile, 6443).unwrap_err();
            assert!(
                matches!(err, FrontError::BadHost { .. }),
                "{hostile:?}: {err}"
            );
        }
    }

    #[test]
    fn hostile_servers_and_names_are_refused() {
        for hostile in [
            "10.0.0.1:6443\nfrontend x",
            "10.0.0.1:0",
            "10.0.0.1:99999",
            "10.0.0.1:64x",
            "[fd00::1",
            "[fd00::1]x",
            "[fd00::1]:6443 check",
        ] {
            assert!(parse_server(hostile, 6443).is_err(), "{hostile:?} accepted");
        }
        let mut s = spec(&["10.0.0.1"]);
        for name in ["a b", "a\nserver x", "", "x#", &"n".repeat(65)] {
            s.backends[0].name = name.to_string();
            let err = render_haproxy(&s).unwrap_err();
            assert!(matches!(err, FrontError::BadName { .. }), "{name:?}: {err}");
        }
        // A backend built by hand with a hostile host is refused at rendering too.
        let mut s = spec(&["10.0.0.1"]);
        s.backends[0].host = "10.0.0.1\n    server evil 6.6.6.6:1".into();
        assert!(matches!(
            render_haproxy(&s),
            Err(FrontError::BadHost { .. })
        ));
    }

    #[test]
    fn hostile_paths_empty_lists_and_duplicates_are_refused() {
        for bad in [
            "relative/ca.crt",
            "/etc/ca crt",
            "/etc/ca.crt\nglobal",
            "/etc/#ca",
            "/etc/$CA",
        ] {
            let mut s = spec(&["10.0.0.1"]);
            s.ca_file = bad.into();
            assert!(
                matches!(render_haproxy(&s), Err(FrontError::BadPath { .. })),
                "{bad:?}"
            );
        }
        assert_eq!(render_haproxy(&spec(&[])), Err(FrontError::NoServers));
        assert!(matches!(
            render_haproxy(&spec(&["10.0.0.1", "10.0.0.1:6443"])),
            Err(FrontError::Duplicate { .. })
        ));
    }

    #[test]
    fn server_lists_parse() {
        let b = parse_servers(
            &["10.0.0.1:6443, cp2.example:7443".into(), "fd00::1".into()],
            6443,
        )
        .unwrap();
        assert_eq!(b[0].address(), "10.0.0.1:6443");
        assert_eq!(b[1].address(), "cp2.example:7443");
        assert_eq!(b[2].address(), "[fd00::1]:6443");
        assert_eq!(b[1].name, "apiserver-cp2.example");
    }

    #[test]
    fn times_render_in_haproxy_units() {
        assert_eq!(hatime(Duration::from_secs(4 * 3600)), "4h");
        assert_eq!(hatime(Duration::from_secs(120)), "2m");
        assert_eq!(hatime(Duration::from_secs(5)), "5s");
        assert_eq!(hatime(Duration::from_millis(1500)), "1500ms");
    }

    #[test]
    fn kube_vip_pod_holds_the_vip_interface_and_lease() {
        let pod = kube_vip_pod(&KubeVipSpec {
            vip: "10.0.0.100".parse().unwrap(),
            interface: "eth0".into(),
            port: 6443,
            image: KUBE_VIP_IMAGE.into(),
            kubeconfig: "/etc/kubernetes/admin.conf".into(),
        })
        .unwrap();
        let env: BTreeMap<String, String> = pod.spec.as_ref().unwrap().containers[0]
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| (e.name.clone(), e.value.clone().unwrap()))
            .collect();
        assert_eq!(env["address"], "10.0.0.100");
        assert_eq!(env["vip_arp"], "true");
        assert_eq!(env["vip_interface"], "eth0");
        assert_eq!(env["cp_namespace"], "kube-system");
        assert_eq!(env["vip_leasename"], KUBE_VIP_LEASE);
        assert_eq!(pod.metadata.namespace.as_deref(), Some("kube-system"));
        for bad in ["eth0 x", "", "averyveryverylongname", "eth0/1"] {
            let err = kube_vip_pod(&KubeVipSpec {
                vip: "10.0.0.100".parse().unwrap(),
                interface: bad.into(),
                port: 6443,
                image: KUBE_VIP_IMAGE.into(),
                kubeconfig: "/etc/kubernetes/admin.conf".into(),
            })
            .unwrap_err();
            assert!(matches!(err, FrontError::BadVip { .. }), "{bad:?}");
        }
    }

    fn vip_spec(vip: &str) -> KubeVipSpec {
        KubeVipSpec {
            vip: vip.parse().unwrap(),
            interface: "eth0".into(),
            port: 6443,
            image: KUBE_VIP_IMAGE.into(),
            kubeconfig: "/etc/kubernetes/admin.conf".into(),
        }
    }

    #[test]
    fn an_old_worker_is_stopped_half_an_hour_after_a_reload() {
        let cfg = render_haproxy(&spec(&["10.0.0.1"])).unwrap();
        assert!(cfg.contains("\n    hard-stop-after 30m\n"), "{cfg}");
    }

    #[test]
    fn a_dns_name_may_be_253_bytes_and_no_more() {
        // Three 63-byte labels, their dots, and a last label filling the name to 253.
        let name = |last: usize| {
            format!(
                "{}.{}.{}.{}",
                "a".repeat(63),
                "b".repeat(63),
                "c".repeat(63),
                "D".repeat(last)
            )
        };
        let longest = name(61);
        assert_eq!(longest.len(), 253);
        assert_eq!(check_host(&longest).unwrap(), longest.to_ascii_lowercase());
        let too_long = name(62);
        assert_eq!(
            check_host(&too_long),
            Err(FrontError::BadHost { value: too_long })
        );
        // Rendered with a short name of its own, the longest host reaches the config whole.
        let mut s = spec(&["10.0.0.1"]);
        s.backends[0] = Backend {
            name: "cp-long".into(),
            host: longest.clone(),
            port: 6443,
        };
        let cfg = render_haproxy(&s).unwrap();
        let want = format!(
            "\n    server cp-long {}:6443\n",
            longest.to_ascii_lowercase()
        );
        assert!(cfg.contains(&want), "{cfg}");
    }

    #[test]
    fn a_bracketed_ipv6_server_without_a_port_takes_the_default() {
        let b = parse_server("[fd00::1]", DEFAULT_API_PORT).unwrap();
        assert_eq!(b.address(), "[fd00::1]:6443");
        assert_eq!(b.name, "apiserver-fd00::1");
        assert_eq!(
            parse_server(" [FD00::1]:7443 ", 6443).unwrap().address(),
            "[fd00::1]:7443"
        );
    }

    #[test]
    fn member_hosts_become_backends_on_the_api_port() {
        let hosts = [
            "10.0.0.2".to_string(),
            "CP1.Example".to_string(),
            "fd00::3".to_string(),
        ];
        let b = backends_for_hosts(&hosts, 7443).unwrap();
        let shown: Vec<(String, String)> =
            b.iter().map(|b| (b.name.clone(), b.address())).collect();
        assert_eq!(
            shown,
            [
                ("apiserver-10.0.0.2".into(), "10.0.0.2:7443".into()),
                ("apiserver-cp1.example".into(), "cp1.example:7443".into()),
                ("apiserver-fd00::3".into(), "[fd00::3]:7443".into()),
            ]
        );
        let hostile = ["10.0.0.2".to_string(), "cp1 backup".to_string()];
        assert_eq!(
            backends_for_hosts(&hostile, 7443),
            Err(FrontError::BadHost {
                value: "cp1 backup".into()
            })
        );
    }

    #[test]
    fn one_address_under_two_names_or_one_name_for_two_addresses_is_refused() {
        let backend = |name: &str, host: &str| Backend {
            name: name.into(),
            host: host.into(),
            port: 6443,
        };
        // The same API server twice would count its connections twice as often.
        let mut s = spec(&[]);
        s.backends = vec![backend("a", "10.0.0.1"), backend("b", "10.0.0.1")];
        assert_eq!(
            render_haproxy(&s),
            Err(FrontError::Duplicate {
                value: "10.0.0.1:6443".into()
            })
        );
        // Two servers under one name: one of them would silently not be in the config.
        s.backends = vec![backend("a", "10.0.0.1"), backend("a", "10.0.0.2")];
        assert_eq!(
            render_haproxy(&s),
            Err(FrontError::Duplicate {
                value: "10.0.0.2:6443".into()
            })
        );
        s.backends = vec![backend("a", "10.0.0.1"), backend("b", "10.0.0.2")];
        let cfg = render_haproxy(&s).unwrap();
        assert!(
            cfg.contains("\n    server a 10.0.0.1:6443\n    server b 10.0.0.2:6443\n"),
            "{cfg}"
        );
    }

    #[test]
    fn a_vip_other_nodes_cannot_reach_is_refused() {
        for bad in [
            "0.0.0.0",
            "::",
            "127.0.0.1",
            "127.0.0.2",
            "::1",
            "224.0.0.1",
            "ff02::1",
        ] {
            let err = kube_vip_pod(&vip_spec(bad)).unwrap_err();
            assert!(
                matches!(err, FrontError::BadVip { what: "VIP", .. }),
                "{bad}: {err}"
            );
        }
        for good in ["10.0.0.100", "192.0.2.7", "fd00::100"] {
            assert!(kube_vip_pod(&vip_spec(good)).is_ok(), "{good}");
        }
    }

    #[test]
    fn the_kube_vip_manifest_is_what_the_kubelet_needs_to_run_it() {
        // The whole manifest as the static pod file carries it: every field an operator
        // (or the kubelet) relies on, and nothing else.
        let mut vip = vip_spec("10.0.0.100");
        vip.image = "registry.example/kube-vip:v9".into();
        vip.kubeconfig = "/etc/kubernetes/super-admin.conf".into();
        let pod = serde_json::to_value(kube_vip_pod(&vip).unwrap()).unwrap();
        let want = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "kube-vip",
                "namespace": "kube-system",
                "labels": {"app.kubernetes.io/name": "kube-vip"},
            },
            "spec": {
                "containers": [{
                    "name": "kube-vip",
                    "image": "registry.example/kube-vip:v9",
                    "imagePullPolicy": "IfNotPresent",
                    "args": ["manager"],
                    "env": [
                        {"name": "vip_arp", "value": "true"},
                        {"name": "port", "value": "6443"},
                        {"name": "vip_interface", "value": "eth0"},
                        {"name": "vip_cidr", "value": "32"},
                        {"name": "cp_enable", "value": "true"},
                        {"name": "cp_namespace", "value": "kube-system"},
                        {"name": "vip_leaderelection", "value": "true"},
                        {"name": "vip_leasename", "value": "plndr-cp-lock"},
                        {"name": "vip_leaseduration", "value": "5"},
                        {"name": "vip_renewdeadline", "value": "3"},
                        {"name": "vip_retryperiod", "value": "1"},
                        {"name": "address", "value": "10.0.0.100"},
                    ],
                    "securityContext": {
                        "capabilities": {"add": ["NET_ADMIN", "NET_RAW"]},
                    },
                    "volumeMounts": [{
                        "name": "kubeconfig",
                        "mountPath": "/etc/kubernetes/admin.conf",
                        "readOnly": true,
                    }],
                }],
                "hostNetwork": true,
                "priorityClassName": "system-node-critical",
                "hostAliases": [{"ip": "127.0.0.1", "hostnames": ["kubernetes"]}],
                "volumes": [{
                    "name": "kubeconfig",
                    "hostPath": {"path": "/etc/kubernetes/super-admin.conf", "type": "File"},
                }],
            },
        });
        assert_eq!(pod, want, "{pod:#}");
        // An IPv6 VIP is announced as a /128.
        let pod = kube_vip_pod(&vip_spec("fd00::100")).unwrap();
        let env = pod.spec.unwrap().containers[0].env.clone().unwrap();
        let cidr = env.iter().find(|e| e.name == "vip_cidr").unwrap();
        assert_eq!(cidr.value.as_deref(), Some("128"));
    }
}
