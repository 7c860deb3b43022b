//! What a node should look like: the agent's YAML configuration ([`AgentConfig`]) resolved
//! for one slot into a [`MachineGoalState`], whose [`NodeStart`] is what the start phases
//! need: kubelet and containerd configuration, the kubelet's serving port (derived from
//! the node name with `nodeaddr`'s derivation, as the control plane derives it), how the
//! kubelet authenticates, and the LocalDNS listeners.
//!
//! ```yaml
//! nodeName: worker-1
//! kubelet:
//!   path: /usr/bin/kubelet               # default
//!   config: {kind: KubeletConfiguration, apiVersion: kubelet.config.k8s.io/v1beta1}
//!   extraArgs: [--node-labels=pool=edge]
//!   portRange: {base: 20000, slots: 10000} # default: the derived kubelet port's range
//! containerd:
//!   config: |
//!     version = 2
//! auth:
//!   bootstrapToken:
//!     apiServer: https://10.0.0.1:6443
//!     token: abcdef.0123456789abcdef
//!     caFile: /etc/kubernetes/pki/ca.crt
//! localDNS:
//!   listeners: [169.254.20.10]
//! slots:
//!   blue: {kubeletUnit: kubelet-blue.service}
//! ```

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The agent's configuration file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentConfig {
    /// The Kubernetes node name.
    pub node_name: String,
    /// Kubelet settings.
    pub kubelet: KubeletSpec,
    /// containerd settings.
    #[serde(default)]
    pub containerd: ContainerdSpec,
    /// How the kubelet authenticates to the API server.
    pub auth: AuthMode,
    /// The node-local DNS cache the kubelet points pods at, if any.
    #[serde(default, rename = "localDNS")]
    pub local_dns: Option<LocalDns>,
    /// Per-slot overrides; the empty slot is the base configuration.
    #[serde(default)]
    pub slots: BTreeMap<String, SlotSpec>,
}

/// Kubelet settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeletSpec {
    /// The systemd unit that runs the kubelet.
    #[serde(default = "default_kubelet_unit")]
    pub unit: String,
    /// The kubelet executable the unit's command line runs.
    #[serde(default = "default_kubelet_path")]
    pub path: PathBuf,
    /// The KubeletConfiguration, written as YAML. Its `port` is the node's derived port
    /// (see [`KubeletSpec::port_range`]); set it only to that value, or leave it out.
    #[serde(default)]
    pub config: serde_yaml::Value,
    /// Extra command-line flags.
    #[serde(default)]
    pub extra_args: Vec<String>,
    /// The range the kubelet's serving port is derived in from the node name
    /// (`nodeaddr`'s derivation). It must match the control plane's
    /// (`stratum-server nodes reconcile --port-base/--port-slots`).
    #[serde(default)]
    pub port_range: PortRangeSpec,
}

/// The derived kubelet port range, as configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PortRangeSpec {
    /// The first port.
    #[serde(default = "default_port_base")]
    pub base: u16,
    /// How many ports.
    #[serde(default = "default_port_slots")]
    pub slots: u16,
}

impl Default for PortRangeSpec {
    fn default() -> Self {
        Self {
            base: default_port_base(),
            slots: default_port_slots(),
        }
    }
}

impl PortRangeSpec {
    /// The validated range.
    pub fn range(&self) -> Result<nodeaddr::PortRange, nodeaddr::PortRangeError> {
        nodeaddr::PortRange::new(self.base, self.slots)
    }
}

fn default_port_base() -> u16 {
    nodeaddr::PortRange::DEFAULT.base()
}

fn default_port_slots() -> u16 {
    nodeaddr::PortRange::DEFAULT.slots()
}

fn default_kubelet_path() -> PathBuf {
    PathBuf::from("/usr/bin/kubelet")
}

/// containerd settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerdSpec {
    /// The systemd unit that runs containerd.
    #[serde(default = "default_containerd_unit")]
    pub unit: String,
    /// The contents of `config.toml`, verbatim.
    #[serde(default)]
    pub config: String,
}

impl Default for ContainerdSpec {
    fn default() -> Self {
        Self {
            unit: default_containerd_unit(),
            config: String::new(),
        }
    }
}

fn default_kubelet_unit() -> String {
    "kubelet.service".into()
}

fn default_containerd_unit() -> String {
    "containerd.service".into()
}

/// How the kubelet authenticates. Exactly one mode; in YAML a mapping with one key
/// (`bootstrapToken`, `kubeconfig` or `execCredential`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "AuthYaml", into = "AuthYaml")]
pub enum AuthMode {
    /// TLS bootstrap with a bootstrap token: the kubelet requests a client certificate
    /// and rotates it in [`crate::KUBELET_CLIENT_PKI_DIR`].
    BootstrapToken(BootstrapToken),
    /// A kubeconfig given in full.
    Kubeconfig(KubeconfigAuth),
    /// A client-go exec credential plugin.
    ExecCredential(ExecCredential),
}

#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AuthYaml {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bootstrap_token: Option<BootstrapToken>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kubeconfig: Option<KubeconfigAuth>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    exec_credential: Option<ExecCredential>,
}

impl TryFrom<AuthYaml> for AuthMode {
    type Error = String;

    fn try_from(y: AuthYaml) -> Result<Self, String> {
        match (y.bootstrap_token, y.kubeconfig, y.exec_credential) {
            (Some(b), None, None) => Ok(AuthMode::BootstrapToken(b)),
            (None, Some(k), None) => Ok(AuthMode::Kubeconfig(k)),
            (None, None, Some(e)) => Ok(AuthMode::ExecCredential(e)),
            _ => Err("auth: set exactly one of bootstrapToken, kubeconfig, execCredential".into()),
        }
    }
}

impl From<AuthMode> for AuthYaml {
    fn from(mode: AuthMode) -> Self {
        match mode {
            AuthMode::BootstrapToken(b) => AuthYaml {
                bootstrap_token: Some(b),
                ..Default::default()
            },
            AuthMode::Kubeconfig(k) => AuthYaml {
                kubeconfig: Some(k),
                ..Default::default()
            },
            AuthMode::ExecCredential(e) => AuthYaml {
                exec_credential: Some(e),
                ..Default::default()
            },
        }
    }
}

impl AuthMode {
    /// `bootstrap-token`, `kubeconfig` or `exec-credential`.
    pub fn name(&self) -> &'static str {
        match self {
            AuthMode::BootstrapToken(_) => "bootstrap-token",
            AuthMode::Kubeconfig(_) => "kubeconfig",
            AuthMode::ExecCredential(_) => "exec-credential",
        }
    }
}

/// Bootstrap token authentication. `Debug` leaves the token's secret half out.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootstrapToken {
    /// The API server URL.
    pub api_server: String,
    /// `[a-z0-9]{6}.[a-z0-9]{16}`.
    pub token: String,
    /// The cluster CA certificate file on the host.
    pub ca_file: PathBuf,
}

/// A kubeconfig given in full. `Debug` leaves the contents (client keys, tokens) out.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubeconfigAuth {
    /// The kubeconfig's contents.
    pub content: String,
}

impl std::fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let id = self.token.split_once('.').map_or("?", |(id, _)| id);
        f.debug_struct("BootstrapToken")
            .field("api_server", &self.api_server)
            .field("token", &format_args!("{id}.<redacted>"))
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

impl std::fmt::Debug for KubeconfigAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeconfigAuth")
            .field(
                "content",
                &format_args!("<redacted, {} bytes>", self.content.len()),
            )
            .finish()
    }
}

/// Exec credential plugin authentication.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecCredential {
    /// The API server URL.
    pub api_server: String,
    /// The cluster CA certificate file on the host.
    pub ca_file: PathBuf,
    /// The plugin program.
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// The ExecCredential API version the plugin speaks.
    #[serde(default = "default_exec_api_version")]
    pub api_version: String,
}

fn default_exec_api_version() -> String {
    "client.authentication.k8s.io/v1".into()
}

/// The node-local DNS cache's listeners.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LocalDns {
    /// The interface that carries the listener addresses.
    #[serde(default = "default_dns_interface")]
    pub interface: String,
    /// The kind of link created for it (see [`InterfaceKind`]).
    #[serde(default)]
    pub interface_kind: InterfaceKind,
    /// Listener addresses (link-local addresses such as 169.254.20.10 are usual).
    pub listeners: Vec<IpAddr>,
    /// The port the cache answers on.
    #[serde(default = "default_dns_port")]
    pub port: u16,
    /// The name queried to decide the cache answers.
    #[serde(default = "default_probe_name")]
    pub probe_name: String,
    /// How long a start waits for every listener to answer.
    #[serde(default = "default_ready_timeout")]
    pub ready_timeout_seconds: u64,
}

impl LocalDns {
    /// Listener socket addresses.
    pub fn listener_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .map(|ip| SocketAddr::new(*ip, self.port))
            .collect()
    }

    /// [`LocalDns::ready_timeout_seconds`] as a duration.
    pub fn ready_timeout(&self) -> Duration {
        Duration::from_secs(self.ready_timeout_seconds)
    }
}

/// The link type for the LocalDNS interface.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InterfaceKind {
    /// A `dummy` link: holds addresses, forwards nothing. The default.
    #[default]
    Dummy,
    /// A bridge without ports. It carries addresses the same way; for kernels built
    /// without the dummy driver.
    Bridge,
}

impl InterfaceKind {
    /// The `ip link add ... type <kind>` word.
    pub fn as_str(self) -> &'static str {
        match self {
            InterfaceKind::Dummy => "dummy",
            InterfaceKind::Bridge => "bridge",
        }
    }
}

fn default_dns_interface() -> String {
    "outpost-dns".into()
}

fn default_dns_port() -> u16 {
    53
}

fn default_probe_name() -> String {
    "kubernetes.default.svc.cluster.local.".into()
}

fn default_ready_timeout() -> u64 {
    60
}

/// What a slot changes from the base configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SlotSpec {
    /// The slot's kubelet unit.
    #[serde(default)]
    pub kubelet_unit: Option<String>,
    /// The slot's containerd unit.
    #[serde(default)]
    pub containerd_unit: Option<String>,
    /// Flags added to the kubelet's.
    #[serde(default)]
    pub extra_args: Vec<String>,
}

/// The goal state for one machine (slot) of a node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineGoalState {
    /// The slot it was resolved for (empty: the base).
    pub slot: String,
    /// What the start phases need.
    pub node_start: NodeStart,
}

/// What starting the node stack needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStart {
    /// The Kubernetes node name.
    pub node_name: String,
    /// The kubelet's serving port: derived from the node name over
    /// `kubelet.portRange` ([`nodeaddr::PortRange::port_for`]), the number the control
    /// plane derives too and the node's tunnel publishes.
    pub kubelet_port: u16,
    /// Kubelet unit, configuration and flags.
    pub kubelet: KubeletSpec,
    /// containerd unit and configuration.
    pub containerd: ContainerdSpec,
    /// How the kubelet authenticates.
    pub auth: AuthMode,
    /// LocalDNS listeners, if any.
    pub local_dns: Option<LocalDns>,
}

impl NodeStart {
    /// The units of the stack, in start order.
    pub fn units(&self) -> Vec<String> {
        vec![self.containerd.unit.clone(), self.kubelet.unit.clone()]
    }
}

/// A configuration or goal state that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum GoalStateError {
    /// The configuration file could not be read.
    #[error("cannot read agent configuration {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The configuration is not valid YAML of the expected shape.
    #[error("agent configuration {} is not valid: {reason}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message: the field path, what was expected and the position.
        /// Values from the file are left out (a misshapen `auth` block would otherwise
        /// be echoed, bootstrap token and all).
        reason: String,
    },
    /// A field has a value that cannot work.
    #[error("agent configuration: {field}: {reason}")]
    Invalid {
        /// The field, as written in YAML.
        field: String,
        /// What is wrong and what to write instead.
        reason: String,
    },
    /// The slot is not configured.
    #[error("no slot {slot:?} in the agent configuration (configured: {known})")]
    UnknownSlot {
        /// The slot asked for.
        slot: String,
        /// The configured slots.
        known: String,
    },
}

impl AgentConfig {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Self, GoalStateError> {
        let text = std::fs::read_to_string(path).map_err(|source| GoalStateError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates configuration text; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, GoalStateError> {
        let config: AgentConfig =
            serde_yaml::from_str(text).map_err(|err| GoalStateError::Parse {
                path: path.to_path_buf(),
                reason: common::errors::redact_values(&err.to_string()),
            })?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), GoalStateError> {
        let invalid = |field: &str, reason: &str| {
            Err(GoalStateError::Invalid {
                field: field.into(),
                reason: reason.into(),
            })
        };
        if let Err(why) = check_dns_subdomain(&self.node_name) {
            // Rendered into the kubelet's unit drop-in: a newline would add a directive.
            return invalid("nodeName", &why);
        }
        for (field, unit) in self.unit_names() {
            if let Err(why) = check_unit_name(unit) {
                return invalid(&field, &why);
            }
        }
        if !self.kubelet.config.is_null() && !self.kubelet.config.is_mapping() {
            return invalid(
                "kubelet.config",
                "must be a mapping (a KubeletConfiguration)",
            );
        }
        if let Err(why) = check_executable_path(&self.kubelet.path) {
            // Rendered as the first word of the unit's ExecStart=.
            return invalid("kubelet.path", &why);
        }
        let range = match self.kubelet.port_range.range() {
            Ok(range) => range,
            Err(e) => return invalid("kubelet.portRange", &e.to_string()),
        };
        let derived = range.port_for(&self.node_name);
        if let Some(port) = self.kubelet.config.get("port")
            && port.as_u64() != Some(u64::from(derived))
        {
            return invalid(
                "kubelet.config.port",
                &format!(
                    "the kubelet's port is derived from nodeName ({} gives {derived} in {}-{}), so the control plane finds it without being told; remove the field (or set it to {derived})",
                    self.node_name,
                    range.base(),
                    range.last()
                ),
            );
        }
        let slot_args = self.slots.values().flat_map(|s| s.extra_args.iter());
        for arg in self.kubelet.extra_args.iter().chain(slot_args) {
            if arg.is_empty()
                || arg.contains(|c: char| {
                    c.is_whitespace() || c.is_control() || c == '"' || c == '\\' || c == '\''
                })
            {
                // Each flag is one argument of the unit's ExecStart=; whitespace would
                // split it, and quotes or backslashes would be read by systemd's
                // unquoting. ('%' and '$' are escaped when the unit is rendered.)
                return invalid(
                    "kubelet.extraArgs",
                    &format!(
                        "{arg:?}: flags must be non-empty without spaces, quotes or backslashes"
                    ),
                );
            }
            let name = arg.split_once('=').map_or(arg.as_str(), |(n, _)| n);
            if let Some(owned) = OWNED_FLAGS.iter().find(|f| **f == name) {
                return invalid(
                    "kubelet.extraArgs",
                    &format!(
                        "{owned} is set by outpost-agent (the port is derived from nodeName; the paths are the files it writes): remove it"
                    ),
                );
            }
        }
        match &self.auth {
            AuthMode::BootstrapToken(b) => {
                if !valid_token(&b.token) {
                    return invalid(
                        "auth.bootstrapToken.token",
                        "must match [a-z0-9]{6}.[a-z0-9]{16} (mint one with `stratum-server token create` on a control-plane host)",
                    );
                }
                if b.api_server.is_empty() {
                    return invalid("auth.bootstrapToken.apiServer", "must not be empty");
                }
            }
            AuthMode::Kubeconfig(k) => {
                if k.content.trim().is_empty() {
                    return invalid("auth.kubeconfig.content", "must not be empty");
                }
            }
            AuthMode::ExecCredential(e) => {
                if e.command.is_empty() {
                    return invalid("auth.execCredential.command", "must not be empty");
                }
            }
        }
        if let Some(dns) = &self.local_dns {
            if dns.listeners.is_empty() {
                return invalid(
                    "localDNS.listeners",
                    "list at least one address, or drop localDNS",
                );
            }
            // IFNAMSIZ is 16 including the terminating NUL.
            if dns.interface.is_empty()
                || dns.interface.len() > 15
                || dns.interface.contains(['/', ' '])
            {
                return invalid(
                    "localDNS.interface",
                    "must be 1-15 characters, no '/' or spaces",
                );
            }
            if dns.interface.starts_with('-')
                || !dns
                    .interface
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
                || dns.interface == "."
                || dns.interface == ".."
            {
                return invalid(
                    "localDNS.interface",
                    "use letters, digits, '-', '_' and '.' only, not starting with '-'",
                );
            }
            if dns.port == 0 {
                return invalid("localDNS.port", "must be 1-65535");
            }
            if dns.ready_timeout_seconds == 0
                || dns.ready_timeout_seconds > MAX_READY_TIMEOUT_SECONDS
            {
                return invalid(
                    "localDNS.readyTimeoutSeconds",
                    &format!("must be 1-{MAX_READY_TIMEOUT_SECONDS}"),
                );
            }
            if dns.probe_name.is_empty()
                || dns.probe_name.len() > 255
                || dns
                    .probe_name
                    .contains(|c: char| c.is_whitespace() || c.is_control())
            {
                return invalid(
                    "localDNS.probeName",
                    "must be a DNS name (1-255 characters, no spaces or control characters)",
                );
            }
        }
        Ok(())
    }
}

/// Kubelet flags the agent sets itself; `extraArgs` may not set them again.
pub const OWNED_FLAGS: &[&str] = &[
    "--port",
    "--config",
    "--kubeconfig",
    "--bootstrap-kubeconfig",
    "--hostname-override",
];

/// Checks the kubelet executable path: absolute, of ASCII letters, digits and `/._+-`
/// only, no `..` component. It becomes the first word of the unit's `ExecStart=`, where
/// a leading `-`, `@`, `+`, `!` or `:` would change how systemd runs it, and a space,
/// quote, `%` or `$` would be interpreted.
pub fn check_executable_path(path: &Path) -> Result<(), String> {
    let text = path.to_str().unwrap_or("");
    let ok = text.starts_with('/')
        && text.len() <= 4096
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'.' | b'_' | b'+' | b'-'))
        && !text.split('/').any(|c| c == "..")
        && !text.ends_with('/');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{path:?} is not usable as the kubelet executable: write an absolute path of letters, digits and \"/._+-\" (e.g. /usr/bin/kubelet)"
        ))
    }
}

/// The longest LocalDNS readiness wait a configuration may ask for (one hour).
pub const MAX_READY_TIMEOUT_SECONDS: u64 = 3600;

impl AgentConfig {
    /// Every systemd unit name the configuration sets, with its field.
    fn unit_names(&self) -> Vec<(String, &str)> {
        let mut units = vec![
            ("kubelet.unit".to_string(), self.kubelet.unit.as_str()),
            ("containerd.unit".to_string(), self.containerd.unit.as_str()),
        ];
        for (slot, spec) in &self.slots {
            if let Some(u) = &spec.kubelet_unit {
                units.push((format!("slots.{slot}.kubeletUnit"), u));
            }
            if let Some(u) = &spec.containerd_unit {
                units.push((format!("slots.{slot}.containerdUnit"), u));
            }
        }
        units
    }
}

/// Checks a systemd service unit name: it becomes a path below the unit directory
/// (`<unit>.d/`) and an argument of `systemctl`, so it must be a plain unit name:
/// `name.service` (or `name@instance.service`), at most 255 bytes, of ASCII letters,
/// digits and `:-_.@`, not starting with `-` or `.`. No `/`, no `..`.
pub fn check_unit_name(unit: &str) -> Result<(), String> {
    let Some(stem) = unit.strip_suffix(".service") else {
        return Err(format!(
            "{unit:?} is not a systemd service unit name: write it in full, e.g. kubelet.service"
        ));
    };
    if stem.is_empty()
        || unit.len() > 255
        || unit.starts_with(['-', '.'])
        || unit.contains("..")
        || !unit
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b':' | b'-' | b'_' | b'.' | b'@'))
    {
        return Err(format!(
            "{unit:?} is not a systemd unit name: use letters, digits and \":-_.@\", ending in .service, no '/' or \"..\""
        ));
    }
    Ok(())
}

/// Checks a Kubernetes node name: a DNS-1123 subdomain (at most 253 characters of
/// lowercase letters, digits, `-` and `.`, each dot-separated label starting and ending
/// with a letter or digit).
pub fn check_dns_subdomain(name: &str) -> Result<(), String> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(format!(
            "{name:?} is not a valid node name: a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', at most 253 characters, starting and ending with a letter or digit)"
        ));
    }
    Ok(())
}

fn valid_token(token: &str) -> bool {
    // Untrimmed: whitespace around a token in a config is an error here, not ignored.
    token.trim() == token && common::token::BootstrapToken::parse(token).is_ok()
}

/// Resolves the goal state of `slot` from a configuration. Pure.
pub fn resolve_machine(
    config: &AgentConfig,
    slot: &str,
) -> Result<MachineGoalState, GoalStateError> {
    let mut kubelet = config.kubelet.clone();
    let mut containerd = config.containerd.clone();
    if !slot.is_empty() {
        let Some(spec) = config.slots.get(slot) else {
            return Err(GoalStateError::UnknownSlot {
                slot: slot.into(),
                known: if config.slots.is_empty() {
                    "none".into()
                } else {
                    config.slots.keys().cloned().collect::<Vec<_>>().join(", ")
                },
            });
        };
        if let Some(unit) = &spec.kubelet_unit {
            kubelet.unit = unit.clone();
        }
        if let Some(unit) = &spec.containerd_unit {
            containerd.unit = unit.clone();
        }
        kubelet.extra_args.extend(spec.extra_args.iter().cloned());
    }
    // A range that does not validate was refused at load; the default keeps this pure
    // function total for a configuration built in code.
    let range = config.kubelet.port_range.range().unwrap_or_default();
    Ok(MachineGoalState {
        slot: slot.into(),
        node_start: NodeStart {
            node_name: config.node_name.clone(),
            kubelet_port: range.port_for(&config.node_name),
            kubelet,
            containerd,
            auth: config.auth.clone(),
            local_dns: config.local_dns.clone(),
        },
    })
}

/// A replacement for [`resolve_machine`].
pub type ResolveFn = Arc<dyn Fn(&str) -> Result<MachineGoalState, GoalStateError> + Send + Sync>;

/// Resolves the goal state a node is built from.
#[derive(Clone)]
pub struct GoalStateSource {
    /// The configuration goal states are resolved from.
    pub config: AgentConfig,
    /// When set, returned instead of resolving one: a caller that has already resolved
    /// the goal state (and done the discovery that needs) passes it so it happens once.
    pub goal_state: Option<MachineGoalState>,
    /// Overrides resolution (tests); the default is [`resolve_machine`].
    pub resolve: Option<ResolveFn>,
}

impl GoalStateSource {
    /// A source that resolves from `config`.
    pub fn new(config: AgentConfig) -> Self {
        Self {
            config,
            goal_state: None,
            resolve: None,
        }
    }

    /// The goal state for `slot`: the pre-resolved one, else the override, else
    /// [`resolve_machine`].
    pub fn for_slot(&self, slot: &str) -> Result<MachineGoalState, GoalStateError> {
        if let Some(goal) = &self.goal_state {
            return Ok(goal.clone());
        }
        if let Some(resolve) = &self.resolve {
            return resolve(slot);
        }
        resolve_machine(&self.config, slot)
    }
}

impl std::fmt::Debug for GoalStateSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GoalStateSource")
            .field("config", &self.config)
            .field("goal_state", &self.goal_state)
            .field("resolve", &self.resolve.as_ref().map(|_| "custom"))
            .finish()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const CONFIG: &str = r#"
nodeName: worker-1
kubelet:
  config:
    kind: KubeletConfiguration
    apiVersion: kubelet.config.k8s.io/v1beta1
    clusterDNS: [169.254.20.10]
  extraArgs: [--node-labels=pool=edge]
containerd:
  config: |
    version = 2
auth:
  bootstrapToken:
    apiServer: https://10.0.0.1:6443
    token: abcdef.0123456789abcdef
    caFile: /etc/kubernetes/pki/ca.crt
localDNS:
  listeners: [169.254.20.10]
slots:
  blue:
    kubeletUnit: kubelet-blue.service
    extraArgs: [--v=2]
"#;

    pub(crate) fn config() -> AgentConfig {
        AgentConfig::parse(CONFIG, Path::new("agent.yaml")).unwrap()
    }

    #[test]
    fn loads_with_defaults() {
        let c = config();
        assert_eq!(c.kubelet.unit, "kubelet.service");
        assert_eq!(c.containerd.unit, "containerd.service");
        let dns = c.local_dns.as_ref().unwrap();
        assert_eq!(dns.interface, "outpost-dns");
        assert_eq!(dns.interface_kind, InterfaceKind::Dummy);
        assert_eq!(dns.listener_addrs(), ["169.254.20.10:53".parse().unwrap()]);
        assert_eq!(c.auth.name(), "bootstrap-token");
    }

    #[test]
    fn slot_overrides_apply() {
        let goal = resolve_machine(&config(), "blue").unwrap();
        assert_eq!(goal.node_start.kubelet.unit, "kubelet-blue.service");
        assert_eq!(
            goal.node_start.kubelet.extra_args,
            ["--node-labels=pool=edge", "--v=2"]
        );
        let err = resolve_machine(&config(), "green").unwrap_err();
        assert_eq!(
            err.to_string(),
            "no slot \"green\" in the agent configuration (configured: blue)"
        );
    }

    #[test]
    fn source_prefers_pre_resolved_then_override() {
        let mut source = GoalStateSource::new(config());
        assert_eq!(
            source.for_slot("").unwrap().node_start.kubelet.unit,
            "kubelet.service"
        );
        source.resolve = Some(Arc::new(|slot| {
            let mut g = resolve_machine(&config(), "")?;
            g.slot = format!("resolved-{slot}");
            Ok(g)
        }));
        assert_eq!(source.for_slot("x").unwrap().slot, "resolved-x");
        let mut pre = resolve_machine(&config(), "").unwrap();
        pre.slot = "pre".into();
        source.goal_state = Some(pre);
        assert_eq!(source.for_slot("x").unwrap().slot, "pre");
    }

    #[test]
    fn bad_input_names_the_field() {
        let bad_token = CONFIG.replace("abcdef.0123456789abcdef", "ABC.def");
        let err = AgentConfig::parse(&bad_token, Path::new("a.yaml")).unwrap_err();
        assert!(
            err.to_string().contains("auth.bootstrapToken.token"),
            "{err}"
        );

        let unknown = CONFIG.replace("nodeName:", "nodeNme:");
        let err = AgentConfig::parse(&unknown, Path::new("a.yaml")).unwrap_err();
        assert!(
            crate::error_chain(&err).contains("a.yaml")
                && crate::error_chain(&err).contains("nodeNme"),
            "{err}"
        );

        let no_listeners = CONFIG.replace("listeners: [169.254.20.10]", "listeners: []");
        let err = AgentConfig::parse(&no_listeners, Path::new("a.yaml")).unwrap_err();
        assert!(err.to_string().contains("localDNS.listeners"), "{err}");
    }

    #[test]
    fn other_auth_modes_parse() {
        let kc = CONFIG.replace(
            "  bootstrapToken:\n    apiServer: https://10.0.0.1:6443\n    token: abcdef.0123456789abcdef\n    caFile: /etc/kubernetes/pki/ca.crt\n",
            "  kubeconfig:\n    content: \"apiVersion: v1\\nkind: Config\\n\"\n",
        );
        assert_eq!(
            AgentConfig::parse(&kc, Path::new("a")).unwrap().auth.name(),
            "kubeconfig"
        );
        let ex = CONFIG.replace(
            "  bootstrapToken:\n    apiServer: https://10.0.0.1:6443\n    token: abcdef.0123456789abcdef\n",
            "  execCredential:\n    apiServer: https://10.0.0.1:6443\n    command: /usr/bin/cred\n",
        );
        assert_eq!(
            AgentConfig::parse(&ex, Path::new("a")).unwrap().auth.name(),
            "exec-credential"
        );
    }

    #[test]
    fn unit_names_and_node_names_are_checked_at_load() {
        for (from, to, field) in [
            (
                "nodeName: worker-1",
                "nodeName: \"worker-1\\nExecStartPre=/bin/sh -c id\"",
                "nodeName",
            ),
            ("nodeName: worker-1", "nodeName: Worker_1", "nodeName"),
            ("nodeName: worker-1", "nodeName: \"\"", "nodeName"),
            (
                "kubeletUnit: kubelet-blue.service",
                "kubeletUnit: ../../../../escape.service",
                "slots.blue.kubeletUnit",
            ),
            (
                "kubeletUnit: kubelet-blue.service",
                "kubeletUnit: kubelet-blue",
                "slots.blue.kubeletUnit",
            ),
            (
                "kubeletUnit: kubelet-blue.service",
                "kubeletUnit: \"--force.service\"",
                "slots.blue.kubeletUnit",
            ),
            (
                "extraArgs: [--v=2]",
                "extraArgs: [\"--v=2\\u0007\"]",
                "kubelet.extraArgs",
            ),
            (
                "listeners: [169.254.20.10]",
                "listeners: [169.254.20.10]\n  interface: \"-x\"",
                "localDNS.interface",
            ),
            (
                "listeners: [169.254.20.10]",
                "listeners: [169.254.20.10]\n  readyTimeoutSeconds: 18446744073709551615",
                "localDNS.readyTimeoutSeconds",
            ),
        ] {
            let text = CONFIG.replace(from, to);
            assert_ne!(text, CONFIG, "{to}");
            let err = AgentConfig::parse(&text, Path::new("a.yaml")).unwrap_err();
            assert!(err.to_string().contains(field), "{to}: {err}");
        }
        let unit = CONFIG.replace(
            "slots:",
            "containerd:\n  unit: containerd@x.service\nslots:",
        );
        let unit = unit.replace("containerd:\n  config: |\n    version = 2\n", "");
        AgentConfig::parse(&unit, Path::new("a.yaml")).unwrap();
        check_dns_subdomain("ip-10-0-0-1.eu-west-1.compute.internal").unwrap();
        assert!(check_dns_subdomain("a..b").is_err());
        assert!(check_dns_subdomain(&"a".repeat(254)).is_err());
    }

    /// Issue 17: a misshapen `auth` block must not echo the bootstrap token in the
    /// parse error (field paths only), and `Debug` of the configuration leaves secrets
    /// out.
    #[test]
    fn secrets_stay_out_of_parse_errors_and_debug() {
        let secret = "0123456789abcdef";
        let full = "  bootstrapToken:\n    apiServer: https://10.0.0.1:6443\n    token: abcdef.0123456789abcdef\n    caFile: /etc/kubernetes/pki/ca.crt\n";
        for (from, to, path) in [
            (
                full,
                "  bootstrapToken: abcdef.0123456789abcdef\n",
                "auth.bootstrapToken",
            ),
            ("auth:\n", "auth: abcdef.0123456789abcdef\nx:\n", "auth"),
            (
                "    caFile: /etc/kubernetes/pki/ca.crt\n",
                "    caFile: /etc/kubernetes/pki/ca.crt\n    abcdef.0123456789abcdef: 1\n",
                "auth.bootstrapToken",
            ),
            (
                "    token: abcdef.0123456789abcdef\n",
                "    token: \"abcdef.0123456789abcdef\\\"x\"\n    bad: 1\n",
                "auth.bootstrapToken",
            ),
        ] {
            let text = CONFIG.replace(from, to);
            assert_ne!(text, CONFIG);
            let err = AgentConfig::parse(&text, Path::new("a.yaml")).unwrap_err();
            let msg = crate::error_chain(&err);
            assert!(!msg.contains(secret), "{msg}");
            assert!(msg.contains(path) && msg.contains("line "), "{msg}");
        }
        let kc = CONFIG.replace(
            full,
            "  kubeconfig:\n    content: \"client-key-data: c2VjcmV0\"\n",
        );
        for config in [config(), AgentConfig::parse(&kc, Path::new("a")).unwrap()] {
            let debug = format!("{config:?} {:?}", resolve_machine(&config, "").unwrap());
            assert!(
                !debug.contains(secret) && !debug.contains("c2VjcmV0"),
                "{debug}"
            );
        }
        assert!(format!("{:?}", config().auth).contains("abcdef.<redacted>"));
    }

    /// The kubelet's port is derived from the node name; a configuration may not set
    /// another one, in the KubeletConfiguration or as a flag, nor the flags the agent
    /// owns; the executable path and the range are checked.
    #[test]
    fn the_port_is_derived_and_owned_flags_and_paths_are_checked() {
        let goal = resolve_machine(&config(), "").unwrap();
        // Pinned by nodeaddr's own tests: "worker-1" gives 21149 in the default range.
        assert_eq!(goal.node_start.kubelet_port, 21149);
        assert_eq!(goal.node_start.kubelet.path, Path::new("/usr/bin/kubelet"));
        let same = CONFIG.replace("clusterDNS:", "port: 21149\n    clusterDNS:");
        AgentConfig::parse(&same, Path::new("a")).unwrap();
        let narrow = CONFIG.replace(
            "  extraArgs: [--node-labels=pool=edge]",
            "  extraArgs: [--node-labels=pool=edge]\n  portRange: {base: 30000, slots: 1}",
        );
        let c = AgentConfig::parse(&narrow, Path::new("a")).unwrap();
        assert_eq!(
            resolve_machine(&c, "").unwrap().node_start.kubelet_port,
            30000
        );
        for (from, to, field, says) in [
            (
                "clusterDNS:",
                "port: 10250\n    clusterDNS:",
                "kubelet.config.port",
                "gives 21149 in 20000-29999",
            ),
            (
                "[--node-labels=pool=edge]",
                "[--node-labels=pool=edge, --port=10250]",
                "kubelet.extraArgs",
                "--port is set by outpost-agent",
            ),
            (
                "[--node-labels=pool=edge]",
                "[--kubeconfig=/tmp/x]",
                "kubelet.extraArgs",
                "--kubeconfig is set by outpost-agent",
            ),
            (
                "  extraArgs: [--node-labels=pool=edge]",
                "  extraArgs: [--node-labels=pool=edge]\n  path: /usr/bin/kubelet -v",
                "kubelet.path",
                "absolute path",
            ),
            (
                "  extraArgs: [--node-labels=pool=edge]",
                "  extraArgs: [--node-labels=pool=edge]\n  path: /usr/bin/../../tmp/kubelet",
                "kubelet.path",
                "absolute path",
            ),
            (
                "  extraArgs: [--node-labels=pool=edge]",
                "  extraArgs: [--node-labels=pool=edge]\n  path: kubelet",
                "kubelet.path",
                "absolute path",
            ),
            (
                "  extraArgs: [--node-labels=pool=edge]",
                "  extraArgs: [--node-labels=pool=edge]\n  portRange: {base: 65000, slots: 1000}",
                "kubelet.portRange",
                "runs past port 65535",
            ),
        ] {
            let text = CONFIG.replace(from, to);
            assert_ne!(text, CONFIG, "{to}");
            let err = AgentConfig::parse(&text, Path::new("a.yaml")).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(field) && msg.contains(says), "{to}: {msg}");
        }
    }

    /// The fuzz target `agent_config`'s invariants over every one-character insertion
    /// into the sample configuration: whatever still loads renders a five-line drop-in
    /// without control characters, and unit paths without `..`.
    #[test]
    fn no_accepted_configuration_renders_an_injected_drop_in() {
        let mut accepted = 0;
        for (at, _) in CONFIG.char_indices() {
            for c in ['\n', '\r', '\t', '"', '%', '/', '.', '\u{0}', '\u{85}', ' '] {
                let mut text = CONFIG.to_string();
                text.insert(at, c);
                let Ok(config) = AgentConfig::parse(&text, Path::new("a")) else {
                    continue;
                };
                accepted += 1;
                for slot in ["", "blue"] {
                    let Ok(goal) = resolve_machine(&config, slot) else {
                        continue;
                    };
                    for file in crate::configure::render(&goal.node_start) {
                        assert!(!file.path.contains(".."), "{text}: {}", file.path);
                        if file.unit_file {
                            let body = String::from_utf8(file.contents.unwrap()).unwrap();
                            assert_eq!(
                                body.lines().count(),
                                crate::configure::DROP_IN_LINES,
                                "{text:?}: {body:?}"
                            );
                            assert!(
                                !body.chars().any(|c| c.is_control() && c != '\n'),
                                "{text:?}: {body:?}"
                            );
                        }
                    }
                }
            }
        }
        assert!(accepted > 100, "only {accepted} variants loaded");
    }
}
