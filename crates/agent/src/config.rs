//! The one agent configuration: a single `agent.yaml` that every `outpost-agent` command
//! reads.
//!
//! Each section is owned by the crate that uses it: `health` is the `health` crate's
//! [`health::Config`]; `kubelet`, `containerd`, `auth`, `localDNS` and `slots` are the
//! node-stack keys of `hostnode`'s [`hostnode::goalstate::AgentConfig`], which checks them;
//! `kubeconfig`, `admin`, `dataPlane` and `tunnel` belong to the `run` daemon and are
//! checked here. `nodeName` is shared.
//!
//! ```yaml
//! nodeName: worker-1
//! kubeconfig: /etc/kubernetes/kubelet.conf   # default: the kubelet's own
//! health: {listen: 127.0.0.1:9101}
//! admin: {listen: 127.0.0.1:9103}
//! dataPlane: {check: tunnel}                 # none | wireguard | tunnel
//! tunnel:
//!   format: ssh
//!   server: cp.example.net:22
//!   user: outpost
//!   identityFile: /etc/outpost-agent/tunnel_key
//!   knownHosts: /etc/outpost-agent/known_hosts
//! kubelet: {config: {kind: KubeletConfiguration}}
//! auth: {bootstrapToken: {apiServer: "https://10.0.0.1:6443", token: "...", caFile: /etc/kubernetes/pki/ca.crt}}
//! ```
//!
//! Unknown keys are errors at every level. An error names the field and never repeats a
//! value from the file: a misshapen `auth` block would otherwise echo the bootstrap token.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// The admin listener's default address: loopback, like the probe listener.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9103";

/// The agent's default credential: the kubelet's own kubeconfig (after the TLS bootstrap
/// the kubelet writes it there), which may read its own Node.
pub const DEFAULT_KUBECONFIG: &str = hostnode::configure::KUBELET_KUBECONFIG;

/// Where `join` writes the agent configuration below `--host-root`.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/outpost-agent/agent.yaml";

/// A WireGuard peer re-handshakes every 2 minutes while traffic flows and a session is
/// dead after 3 (`REJECT_AFTER_TIME`); a newest handshake older than that means no peer
/// is reachable.
pub const DEFAULT_MAX_HANDSHAKE_AGE: Duration = Duration::from_secs(180);

/// The tunnel's first restart delay.
pub const DEFAULT_RESTART_BACKOFF: Duration = Duration::from_secs(1);
/// The tunnel's longest restart delay.
pub const DEFAULT_MAX_RESTART_BACKOFF: Duration = Duration::from_secs(30);

/// The whole agent configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentConfig {
    /// The Kubernetes node name this worker registers as.
    pub node_name: String,
    /// The kubeconfig the agent reads its own Node with.
    pub kubeconfig: PathBuf,
    /// The probe listener (defaults applied).
    pub health: health::Config,
    /// The admin listener.
    pub admin: AdminConfig,
    /// What "the data plane is up" means for readiness.
    pub data_plane: DataPlaneConfig,
    /// The supervised tunnel, if any.
    pub tunnel: Option<TunnelConfig>,
    /// The node-stack keys, when the file has them (the `node` commands need them).
    pub node_stack: Option<hostnode::goalstate::AgentConfig>,
}

/// The `admin:` block.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AdminConfig {
    /// `host:port` of the admin listener (`/metrics`, `/status`).
    #[serde(default = "default_admin_listen")]
    pub listen: String,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: default_admin_listen(),
        }
    }
}

fn default_admin_listen() -> String {
    DEFAULT_ADMIN_LISTEN.into()
}

/// Which data-plane check readiness waits for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataPlaneCheck {
    /// No data plane to check: readiness follows registration alone.
    #[default]
    None,
    /// A WireGuard interface is up and its newest peer handshake is recent.
    Wireguard,
    /// The supervised tunnel runs and its remote port answers.
    Tunnel,
}

impl DataPlaneCheck {
    /// The YAML word.
    pub fn as_str(self) -> &'static str {
        match self {
            DataPlaneCheck::None => "none",
            DataPlaneCheck::Wireguard => "wireguard",
            DataPlaneCheck::Tunnel => "tunnel",
        }
    }
}

/// The `dataPlane:` block.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataPlaneConfig {
    /// The check.
    #[serde(default)]
    pub check: DataPlaneCheck,
    /// The WireGuard interface (`check: wireguard`).
    #[serde(default)]
    pub interface: Option<String>,
    /// The oldest newest-handshake that still counts as up (`check: wireguard`).
    #[serde(
        default = "default_max_handshake_age",
        deserialize_with = "max_handshake_age"
    )]
    pub max_handshake_age: Duration,
}

impl Default for DataPlaneConfig {
    fn default() -> Self {
        DataPlaneConfig {
            check: DataPlaneCheck::None,
            interface: None,
            max_handshake_age: DEFAULT_MAX_HANDSHAKE_AGE,
        }
    }
}

fn default_max_handshake_age() -> Duration {
    DEFAULT_MAX_HANDSHAKE_AGE
}

/// The tunnel client the daemon supervises.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TunnelFormat {
    /// `ssh -N -R`, exactly as `outpost-agent tunnel-config --format ssh` renders it.
    /// (frpc is rendered by `tunnel-config` but not supervised.)
    #[default]
    Ssh,
}

/// The `tunnel:` block.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TunnelConfig {
    /// The client.
    #[serde(default)]
    pub format: TunnelFormat,
    /// sshd on the control-plane host, `HOST:PORT`.
    pub server: String,
    /// The login there.
    #[serde(default = "default_user")]
    pub user: String,
    /// The private key to log in with.
    #[serde(default)]
    pub identity_file: Option<PathBuf>,
    /// A known_hosts file pinning the control-plane host's key.
    #[serde(default)]
    pub known_hosts: Option<PathBuf>,
    /// The address the forward binds on the control-plane host. Default: the one the
    /// reconciler assigns this node, read from the Nodes with `kubeconfig` at each start.
    #[serde(default)]
    pub remote_bind: Option<Ipv4Addr>,
    /// First port of the derived kubelet port range (must match the control plane's).
    #[serde(default = "default_port_base")]
    pub port_base: u16,
    /// Ports in the derived range.
    #[serde(default = "default_port_slots")]
    pub port_slots: u16,
    /// The first restart delay; it doubles per failed start up to `maxRestartBackoff`.
    #[serde(
        default = "default_restart_backoff",
        deserialize_with = "restart_backoff"
    )]
    pub restart_backoff: Duration,
    /// The longest restart delay.
    #[serde(
        default = "default_max_restart_backoff",
        deserialize_with = "max_restart_backoff"
    )]
    pub max_restart_backoff: Duration,
}

fn default_user() -> String {
    "outpost".into()
}
fn default_port_base() -> u16 {
    nodeaddr::PortRange::DEFAULT.base()
}
fn default_port_slots() -> u16 {
    nodeaddr::PortRange::DEFAULT.slots()
}
fn default_restart_backoff() -> Duration {
    DEFAULT_RESTART_BACKOFF
}
fn default_max_restart_backoff() -> Duration {
    DEFAULT_MAX_RESTART_BACKOFF
}

fn human_duration<'de, D: Deserializer<'de>>(
    d: D,
    field: &'static str,
) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    humantime::parse_duration(&text).map_err(|_| {
        serde::de::Error::custom(format!(
            "{field}: expected a duration such as 30s, 2m or 1h30m"
        ))
    })
}

fn max_handshake_age<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    human_duration(d, "maxHandshakeAge")
}
fn restart_backoff<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    human_duration(d, "restartBackoff")
}
fn max_restart_backoff<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    human_duration(d, "maxRestartBackoff")
}

/// The file as written: the daemon's sections typed, the node-stack sections kept as
/// values for `hostnode` to check.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileYaml {
    /// Required, unless `--node-name` gives it (a DaemonSet's one file for every node).
    #[serde(default)]
    node_name: String,
    #[serde(default)]
    kubeconfig: Option<PathBuf>,
    #[serde(default)]
    health: health::Config,
    #[serde(default)]
    admin: AdminConfig,
    #[serde(default)]
    data_plane: DataPlaneConfig,
    #[serde(default)]
    tunnel: Option<TunnelConfig>,
    #[serde(default)]
    kubelet: Option<serde_yaml::Value>,
    #[serde(default)]
    containerd: Option<serde_yaml::Value>,
    #[serde(default)]
    auth: Option<serde_yaml::Value>,
    #[serde(default, rename = "localDNS")]
    local_dns: Option<serde_yaml::Value>,
    #[serde(default)]
    slots: Option<serde_yaml::Value>,
}

/// A configuration that cannot be used. No variant carries a value from the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read agent configuration {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Not YAML of the expected shape: the parser's message with every value replaced by
    /// `<value>` (field names and positions stay).
    #[error("agent configuration {} is not valid: {reason}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said, redacted.
        reason: String,
    },
    /// A field has a value that cannot work.
    #[error("agent configuration {}: {field}: {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The field, as written in YAML.
        field: String,
        /// What is wrong and what to write instead.
        reason: String,
    },
    /// The node-stack sections were rejected by `hostnode`.
    #[error("agent configuration {}: the node-stack sections are not valid", path.display())]
    NodeStack {
        /// The file.
        path: PathBuf,
        /// hostnode's verdict (names the field, never a value).
        #[source]
        source: hostnode::goalstate::GoalStateError,
    },
    /// A `node` command was given a file without node-stack sections.
    #[error(
        "agent configuration {} has no node-stack sections: the node commands need at least \
         `kubelet` and `auth` (see docs/examples/agent.yaml)",
        path.display()
    )]
    NoNodeStack {
        /// The file.
        path: PathBuf,
    },
}

impl AgentConfig {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<AgentConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        AgentConfig::parse(&text, path)
    }

    /// [`AgentConfig::load`], with `nodeName` taken from `node_name` when given (a
    /// DaemonSet passes the Pod's `spec.nodeName`, so one file serves every node). The
    /// name is checked as the file's would be.
    pub fn load_for_node(path: &Path, node_name: Option<&str>) -> Result<AgentConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        AgentConfig::parse_for_node(&text, path, node_name)
    }

    /// Parses and checks configuration text; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<AgentConfig, ConfigError> {
        AgentConfig::parse_for_node(text, path, None)
    }

    /// [`AgentConfig::parse`] with an optional `nodeName` override (see
    /// [`AgentConfig::load_for_node`]).
    pub fn parse_for_node(
        text: &str,
        path: &Path,
        node_name: Option<&str>,
    ) -> Result<AgentConfig, ConfigError> {
        let mut file: FileYaml = serde_yaml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            reason: redact_values(&e.to_string()),
        })?;
        if let Some(name) = node_name {
            file.node_name = name.to_string();
        }
        if file.node_name.is_empty() {
            return Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                field: "nodeName".into(),
                reason: "missing: name this node in the file, or pass --node-name".into(),
            });
        }
        let invalid = |field: &str, reason: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            field: field.to_string(),
            reason,
        };
        if let Err(why) = hostnode::goalstate::check_dns_subdomain(&file.node_name) {
            return Err(invalid("nodeName", why));
        }
        let node_stack = node_stack(&file, path)?;
        let mut health = file.health;
        health.apply_defaults();
        check_listen(&health.listen).map_err(|r| invalid("health.listen", r))?;
        check_listen(&file.admin.listen).map_err(|r| invalid("admin.listen", r))?;
        let dp = &file.data_plane;
        match dp.check {
            DataPlaneCheck::None => {}
            DataPlaneCheck::Wireguard => match dp.interface.as_deref() {
                None => {
                    return Err(invalid(
                        "dataPlane.interface",
                        "check: wireguard needs the WireGuard interface name (e.g. wg0)".into(),
                    ));
                }
                Some(name) => {
                    check_interface(name).map_err(|r| invalid("dataPlane.interface", r))?
                }
            },
            DataPlaneCheck::Tunnel => {
                if file.tunnel.is_none() {
                    return Err(invalid(
                        "dataPlane.check",
                        "check: tunnel needs a tunnel: section (server, user, identityFile)".into(),
                    ));
                }
            }
        }
        if dp.max_handshake_age.is_zero() {
            return Err(invalid(
                "dataPlane: maxHandshakeAge",
                "must be longer than zero".into(),
            ));
        }
        if let Some(t) = &file.tunnel {
            nodeaddr::tunnel::split_host_port(&t.server)
                .map_err(|e| invalid("tunnel.server", e.reason.to_string()))?;
            if t.user.is_empty()
                || t.user.starts_with('-')
                || !t
                    .user
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                return Err(invalid(
                    "tunnel.user",
                    "must be a login name: letters, digits, '-', '_' and '.', not starting with '-'"
                        .into(),
                ));
            }
            nodeaddr::PortRange::new(t.port_base, t.port_slots)
                .map_err(|e| invalid("tunnel.portBase/portSlots", e.to_string()))?;
            if t.restart_backoff.is_zero() || t.restart_backoff > t.max_restart_backoff {
                return Err(invalid(
                    "tunnel.restartBackoff",
                    "must be longer than zero and at most tunnel.maxRestartBackoff".into(),
                ));
            }
        }
        Ok(AgentConfig {
            node_name: file.node_name,
            kubeconfig: file
                .kubeconfig
                .unwrap_or_else(|| PathBuf::from(DEFAULT_KUBECONFIG)),
            health,
            admin: file.admin,
            data_plane: file.data_plane,
            tunnel: file.tunnel,
            node_stack,
        })
    }

    /// The derived kubelet port range of the tunnel (the default range without one).
    pub fn port_range(&self) -> nodeaddr::PortRange {
        self.tunnel
            .as_ref()
            .and_then(|t| nodeaddr::PortRange::new(t.port_base, t.port_slots).ok())
            .unwrap_or(nodeaddr::PortRange::DEFAULT)
    }
}

/// The node-stack configuration of the agent file at `path`, for the `node` commands:
/// the whole file is checked (so a typo anywhere is caught by every command), and its
/// node-stack sections must be present.
pub fn load_node_stack(path: &Path) -> Result<hostnode::goalstate::AgentConfig, ConfigError> {
    AgentConfig::load(path)?
        .node_stack
        .ok_or_else(|| ConfigError::NoNodeStack {
            path: path.to_path_buf(),
        })
}

fn node_stack(
    file: &FileYaml,
    path: &Path,
) -> Result<Option<hostnode::goalstate::AgentConfig>, ConfigError> {
    use serde_yaml::Value;
    let sections = [
        ("kubelet", &file.kubelet),
        ("containerd", &file.containerd),
        ("auth", &file.auth),
        ("localDNS", &file.local_dns),
        ("slots", &file.slots),
    ];
    if sections.iter().all(|(_, v)| v.is_none()) {
        return Ok(None);
    }
    let mut map = serde_yaml::Mapping::new();
    map.insert("nodeName".into(), Value::String(file.node_name.clone()));
    for (key, value) in sections {
        if let Some(v) = value {
            map.insert(key.into(), v.clone());
        }
    }
    // The sections go through hostnode's own parser, so its checks and its redaction of
    // values apply; the text is re-rendered, so its positions are dropped.
    let text = serde_yaml::to_string(&Value::Mapping(map)).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        reason: redact_values(&e.to_string()),
    })?;
    match hostnode::goalstate::AgentConfig::parse(&text, path) {
        Ok(c) => Ok(Some(c)),
        Err(hostnode::goalstate::GoalStateError::Parse { path, reason }) => {
            Err(ConfigError::Parse {
                path,
                reason: strip_position(&reason),
            })
        }
        Err(source) => Err(ConfigError::NodeStack {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn strip_position(reason: &str) -> String {
    match reason.find(" at line ") {
        Some(i) => reason[..i].to_string(),
        None => reason.to_string(),
    }
}

fn check_listen(listen: &str) -> Result<(), String> {
    nodeaddr::tunnel::split_host_port(listen)
        .map(|_| ())
        .map_err(|e| format!("expected HOST:PORT ({})", e.reason))
}

fn check_interface(name: &str) -> Result<(), String> {
    // IFNAMSIZ is 16 including the NUL; the name also reaches `wg show` as an argument.
    if name.is_empty()
        || name.len() > 15
        || name.starts_with('-')
        || name == "."
        || name == ".."
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err(
            "must be 1-15 characters of letters, digits, '-', '_' and '.', not starting with '-'"
                .into(),
        );
    }
    Ok(())
}

pub(crate) use common::errors::redact_values;

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<AgentConfig, ConfigError> {
        AgentConfig::parse(text, Path::new("/etc/outpost-agent/agent.yaml"))
    }

    const SECRET: &str = "abcdef.0123456789abcdef";

    #[test]
    fn node_name_comes_from_the_file_or_the_override() {
        let path = Path::new("agent.yaml");
        let err = AgentConfig::parse("kubeconfig: /k\n", path).unwrap_err();
        assert!(
            err.to_string().contains("nodeName") && err.to_string().contains("--node-name"),
            "{err}"
        );
        let c = AgentConfig::parse_for_node("kubeconfig: /k\n", path, Some("w7")).unwrap();
        assert_eq!(c.node_name, "w7");
        let c = AgentConfig::parse_for_node("nodeName: w1\n", path, Some("w2")).unwrap();
        assert_eq!(c.node_name, "w2");
        let err = AgentConfig::parse_for_node("nodeName: w1\n", path, Some("W_2")).unwrap_err();
        assert!(err.to_string().contains("nodeName"), "{err}");
    }

    #[test]
    fn a_minimal_file_gets_every_default() {
        let c = parse("nodeName: w1\n").unwrap();
        assert_eq!(c.kubeconfig, Path::new("/etc/kubernetes/kubelet.conf"));
        assert_eq!(c.health.listen, "127.0.0.1:9101");
        assert_eq!(c.admin.listen, "127.0.0.1:9103");
        assert_eq!(c.data_plane.check, DataPlaneCheck::None);
        assert_eq!(c.data_plane.max_handshake_age, Duration::from_secs(180));
        assert!(c.tunnel.is_none() && c.node_stack.is_none());
    }

    #[test]
    fn the_example_file_is_accepted_with_every_section() {
        let text = include_str!("../../../docs/examples/agent.yaml");
        let c = parse(text).unwrap();
        assert!(c.tunnel.is_some());
        assert!(c.node_stack.is_some());
        assert_ne!(c.data_plane.check, DataPlaneCheck::None);
    }

    #[test]
    fn unknown_keys_are_errors_at_every_level() {
        for (text, field) in [
            ("nodeName: w1\nhelth: {}\n", "helth"),
            ("nodeName: w1\nhealth: {listne: x}\n", "listne"),
            ("nodeName: w1\nadmin: {port: 1}\n", "port"),
            ("nodeName: w1\ndataPlane: {chek: none}\n", "chek"),
            ("nodeName: w1\ntunnel: {server: 'a:22', usr: x}\n", "usr"),
            (
                "nodeName: w1\nkubelet: {unti: x}\nauth: {kubeconfig: {content: x}}\n",
                "unti",
            ),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(field), "{text:?}: {err}");
        }
    }

    #[test]
    fn errors_name_the_field_and_never_echo_the_token() {
        // A misshapen auth block (the token where a mapping belongs).
        let text = format!("nodeName: w1\nkubelet: {{}}\nauth:\n  bootstrapToken: \"{SECRET}\"\n");
        let err = parse(&text).unwrap_err();
        let shown = format!("{err:#} {err:?}");
        assert!(!shown.contains("0123456789abcdef"), "{shown}");
        assert!(shown.contains("auth"), "{shown}");
        // A bad token value.
        let text = "nodeName: w1\nkubelet: {}\nauth:\n  bootstrapToken: {apiServer: 'https://a:6443', token: 'abcdef.SECRETSECRETSECRE', caFile: /ca}\n";
        let err = parse(text).unwrap_err();
        let shown = format!("{err:#} {:?}", std::error::Error::source(&err));
        assert!(!shown.contains("SECRETSECRET"), "{shown}");
        assert!(shown.contains("auth.bootstrapToken.token"), "{shown}");
        // A type error elsewhere with the token nearby.
        let text = format!("nodeName: w1\nhealth: {{listen: [\"{SECRET}\"]}}\n");
        let shown = parse(&text).unwrap_err().to_string();
        assert!(
            shown.contains("health.listen") && !shown.contains("0123456789"),
            "{shown}"
        );
    }

    #[test]
    fn daemon_sections_are_checked() {
        for (text, field) in [
            ("nodeName: W_1\n", "nodeName"),
            (
                "nodeName: w1\ndataPlane: {check: wireguard}\n",
                "dataPlane.interface",
            ),
            (
                "nodeName: w1\ndataPlane: {check: wireguard, interface: '-bad'}\n",
                "dataPlane.interface",
            ),
            (
                "nodeName: w1\ndataPlane: {check: tunnel}\n",
                "dataPlane.check",
            ),
            (
                "nodeName: w1\ndataPlane: {maxHandshakeAge: soon}\n",
                "dataPlane: maxHandshakeAge",
            ),
            ("nodeName: w1\ntunnel: {server: cp}\n", "tunnel.server"),
            (
                "nodeName: w1\ntunnel: {server: 'cp:22', format: frpc}\n",
                "tunnel.format",
            ),
            (
                "nodeName: w1\ntunnel: {server: 'cp:22', user: '-oProxyCommand=x'}\n",
                "tunnel.user",
            ),
            ("nodeName: w1\nadmin: {listen: nowhere}\n", "admin.listen"),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(field), "{text:?}: {err}");
        }
        let c = parse("nodeName: w1\ndataPlane: {check: wireguard, interface: wg0, maxHandshakeAge: 2m}\ntunnel: {server: 'cp:2222', restartBackoff: 200ms}\n").unwrap();
        assert_eq!(c.data_plane.max_handshake_age, Duration::from_secs(120));
        let t = c.tunnel.unwrap();
        assert_eq!(t.restart_backoff, Duration::from_millis(200));
        assert_eq!(t.user, "outpost");
    }

    #[test]
    fn node_commands_need_the_node_stack_sections() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.yaml");
        std::fs::write(&path, "nodeName: w1\n").unwrap();
        let err = load_node_stack(&path).unwrap_err();
        assert!(matches!(err, ConfigError::NoNodeStack { .. }), "{err}");
        std::fs::write(
            &path,
            "nodeName: w1\nhealth: {listen: '127.0.0.1:9201'}\nkubelet: {}\nauth: {kubeconfig: {content: x}}\n",
        )
        .unwrap();
        let ns = load_node_stack(&path).unwrap();
        assert_eq!(ns.node_name, "w1");
    }
}
