//! A control-plane node's persisted state, and the settings it runs with.
//!
//! The node state (`<data-dir>/node-state.json`, 0600, written atomically) is what a start
//! renders etcd's flags from: the member's name, URLs, data directory, the cluster it
//! boots into (`new` for the first controller, `existing` with the `initial-cluster`
//! string the member add returned for a joiner), and whether it is still a learner. A
//! node with state starts what the state says; a node without one bootstraps, unless a
//! join intent survives.
//!
//! [`NodeConfig`] is the optional `--config` file: ports, the etcd binary and timeouts.
//! Everything in it has a default, so a node runs without one.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The node state's file name inside the data directory.
pub const NODE_STATE_FILE: &str = "node-state.json";
/// The format version written; a newer one is refused rather than misread.
pub const NODE_STATE_VERSION: u32 = 1;

/// How the node came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    /// The first controller: it created the cluster.
    Bootstrap,
    /// A control plane that joined an existing cluster.
    Join,
}

/// etcd's `--initial-cluster-state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClusterState {
    /// A new cluster (the first controller).
    New,
    /// Joining an existing cluster (a member added before it starts).
    Existing,
}

impl ClusterState {
    /// The flag value.
    pub fn as_flag(self) -> &'static str {
        match self {
            ClusterState::New => "new",
            ClusterState::Existing => "existing",
        }
    }
}

/// This node's etcd member.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EtcdMember {
    /// The member name (the node name).
    pub name: String,
    /// `https://<node-ip>:<client-port>`.
    pub client_url: String,
    /// `https://<node-ip>:<peer-port>`.
    pub peer_url: String,
    /// The member's data directory.
    pub data_dir: PathBuf,
    /// `--initial-cluster`.
    pub initial_cluster: String,
    /// `--initial-cluster-state`.
    pub initial_cluster_state: ClusterState,
    /// The member ID the add returned (joiners), once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_id: Option<u64>,
    /// Still a non-voting learner: the next start promotes it once it has caught up.
    pub learner: bool,
}

/// What a control-plane node persists.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeState {
    /// Format version ([`NODE_STATE_VERSION`]).
    pub version: u32,
    /// How the node came to be.
    pub origin: Origin,
    /// The node name.
    pub node_name: String,
    /// The node's address: etcd listens and advertises here.
    pub node_ip: IpAddr,
    /// The PKI directory.
    pub pki_dir: PathBuf,
    /// The cluster's API server URL (what cluster-info publishes).
    pub api_server: String,
    /// The etcd member.
    pub etcd: EtcdMember,
    /// etcd client URLs of the cluster when this state was written (for reaching the
    /// cluster while the local member is down).
    #[serde(default)]
    pub cluster_endpoints: Vec<String>,
}

/// A node state that could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum NodeStateError {
    /// The file exists but cannot be read.
    #[error(
        "node state {path} cannot be read; fix its permissions or storage before starting \
         (treating it as absent would bootstrap a second cluster)"
    )]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file does not parse.
    #[error("node state {path} is corrupt ({reason}); restore it from a backup or rejoin")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The file was written by a newer release.
    #[error("node state {path} has version {found}; this release reads {NODE_STATE_VERSION}")]
    Version {
        /// The file.
        path: PathBuf,
        /// The version found.
        found: u32,
    },
    /// Writing failed.
    #[error("cannot write node state {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The write error.
        #[source]
        source: pki::PkiError,
    },
    /// Removing failed.
    #[error("cannot remove node state {path}")]
    Remove {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// The node state file of `data_dir`.
pub fn node_state_path(data_dir: &Path) -> PathBuf {
    data_dir.join(NODE_STATE_FILE)
}

impl NodeState {
    /// Reads the state of `data_dir`: `None` when there is none; an error when it exists but
    /// cannot be read or parsed, never `None`.
    pub fn load(data_dir: &Path) -> Result<Option<NodeState>, NodeStateError> {
        let path = node_state_path(data_dir);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(NodeStateError::Unreadable { path, source }),
        };
        let state: NodeState =
            serde_json::from_slice(&bytes).map_err(|e| NodeStateError::Corrupt {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        if state.version > NODE_STATE_VERSION {
            return Err(NodeStateError::Version {
                path,
                found: state.version,
            });
        }
        Ok(Some(state))
    }

    /// Writes the state durably (temporary file, fsync, rename, directory fsync), 0600.
    pub fn save(&self, data_dir: &Path) -> Result<(), NodeStateError> {
        let path = node_state_path(data_dir);
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| NodeStateError::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        pki::write_atomic(&path, &bytes, 0o600)
            .map_err(|source| NodeStateError::Write { path, source })
    }

    /// Removes the state of `data_dir` (a rolled-back join). Missing is fine.
    pub fn remove(data_dir: &Path) -> Result<(), NodeStateError> {
        let path = node_state_path(data_dir);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => return Err(NodeStateError::Remove { path, source }),
        }
        std::fs::File::open(data_dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| NodeStateError::Remove { path, source })
    }

    /// The client URLs to reach the cluster through: the other members recorded first
    /// (a learner answers no membership or linearizable request), then this member's.
    pub fn endpoints(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for e in &self.cluster_endpoints {
            if !out.contains(e) && *e != self.etcd.client_url {
                out.push(e.clone());
            }
        }
        out.push(self.etcd.client_url.clone());
        out
    }
}

/// `https://IP:PORT` with IPv6 bracketed.
pub fn https_url(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => format!("https://{v4}:{port}"),
        IpAddr::V6(v6) => format!("https://[{v6}]:{port}"),
    }
}

/// The etcd section of [`NodeConfig`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct EtcdConfig {
    /// The etcd binary (default `etcd`, looked up on PATH).
    pub binary: PathBuf,
    /// Client port (default 2379).
    pub client_port: u16,
    /// Peer port (default 2380).
    pub peer_port: u16,
    /// How long a starting member may take to answer healthy before a join rolls back
    /// (default 60 s).
    #[serde(with = "humantime_serde_compat")]
    pub start_timeout: Duration,
    /// How long a learner may take to catch up before promotion gives up (default 300 s;
    /// a later start tries again).
    #[serde(with = "humantime_serde_compat")]
    pub promote_timeout: Duration,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            binary: PathBuf::from("etcd"),
            client_port: 2379,
            peer_port: 2380,
            start_timeout: Duration::from_secs(60),
            promote_timeout: Duration::from_secs(300),
        }
    }
}

/// A control-plane component other than etcd, run when its binary is configured.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ComponentConfig {
    /// Its name (logs, stop order).
    pub name: String,
    /// The binary.
    pub binary: PathBuf,
    /// Its arguments; `{nodeIP}`, `{nodeName}`, `{pkiDir}` and `{etcdClientURL}` are
    /// replaced from the node state.
    #[serde(default)]
    pub args: Vec<String>,
}

/// The `front` section of [`NodeConfig`]: the per-node HAProxy `up` runs when present.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct FrontConfig {
    /// The HAProxy binary (default `haproxy`, looked up on PATH).
    pub haproxy: PathBuf,
    /// Where HAProxy listens for API clients (default `127.0.0.1:6444`).
    pub listen: String,
    /// The API servers' port (default 6443).
    pub api_port: u16,
    /// How often the member list is read (default 30 s).
    #[serde(with = "humantime_serde_compat")]
    pub interval: Duration,
}

impl Default for FrontConfig {
    fn default() -> Self {
        FrontConfig {
            haproxy: PathBuf::from("haproxy"),
            listen: "127.0.0.1:6444".into(),
            api_port: 6443,
            interval: Duration::from_secs(30),
        }
    }
}

/// The `--config` file of `up` and `join` (YAML). Every field has a default.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeConfig {
    /// etcd.
    pub etcd: EtcdConfig,
    /// Components started after etcd, in order (stopped in reverse).
    pub components: Vec<ComponentConfig>,
    /// The admin listener (`/metrics`, `/status`), e.g. `127.0.0.1:9104`; none when unset.
    pub admin_listen: Option<String>,
    /// How long a join keeps retrying discovery while the server is unreachable or has
    /// not signed cluster-info for its token (default 60 s).
    #[serde(with = "humantime_serde_compat")]
    pub discovery_timeout: Duration,
    /// The per-node HAProxy front (`ha::front`); none when unset.
    pub front: Option<FrontConfig>,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            etcd: EtcdConfig::default(),
            components: Vec::new(),
            admin_listen: None,
            discovery_timeout: Duration::from_secs(60),
            front: None,
        }
    }
}

/// A config file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("config file {path}: {reason}")]
pub struct ConfigError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub reason: String,
}

impl NodeConfig {
    /// Reads `path`, or the defaults when `None`.
    pub fn load(path: Option<&Path>) -> Result<NodeConfig, ConfigError> {
        let Some(path) = path else {
            return Ok(NodeConfig::default());
        };
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            path: path.to_path_buf(),
            reason: format!("cannot read it: {e}"),
        })?;
        serde_yaml::from_str(&text).map_err(|e| ConfigError {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
    }
}

/// Durations in the config file as humantime text (`30s`, `5m`).
mod humantime_serde_compat {
    use std::time::Duration;

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text: String = serde::Deserialize::deserialize(d)?;
        parse(&text).map_err(serde::de::Error::custom)
    }

    /// `<n>ms`, `<n>s`, `<n>m`, `<n>h`.
    pub fn parse(text: &str) -> Result<Duration, String> {
        let t = text.trim();
        let split = t
            .find(|c: char| !c.is_ascii_digit())
            .ok_or_else(|| format!("{text:?} has no unit (ms, s, m, h)"))?;
        let (n, unit) = t.split_at(split);
        let n: u64 = n.parse().map_err(|_| format!("{text:?} is not a number"))?;
        let secs = match unit {
            "ms" => return Ok(Duration::from_millis(n)),
            "s" => n,
            "m" => n.checked_mul(60).ok_or("too large")?,
            "h" => n.checked_mul(3600).ok_or("too large")?,
            _ => return Err(format!("{text:?}: units are ms, s, m, h")),
        };
        Ok(Duration::from_secs(secs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> NodeState {
        NodeState {
            version: NODE_STATE_VERSION,
            origin: Origin::Join,
            node_name: "cp2".into(),
            node_ip: "10.0.0.2".parse().unwrap(),
            pki_dir: "/etc/kubernetes/pki".into(),
            api_server: "https://10.0.0.1:6443".into(),
            etcd: EtcdMember {
                name: "cp2".into(),
                client_url: "https://10.0.0.2:2379".into(),
                peer_url: "https://10.0.0.2:2380".into(),
                data_dir: "/var/lib/stratum/etcd".into(),
                initial_cluster: "cp1=https://10.0.0.1:2380,cp2=https://10.0.0.2:2380".into(),
                initial_cluster_state: ClusterState::Existing,
                member_id: Some(0xabc),
                learner: true,
            },
            cluster_endpoints: vec!["https://10.0.0.1:2379".into()],
        }
    }

    #[test]
    fn state_round_trips_and_is_private() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(NodeState::load(dir.path()).unwrap(), None);
        state().save(dir.path()).unwrap();
        assert_eq!(NodeState::load(dir.path()).unwrap(), Some(state()));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(node_state_path(dir.path()))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            state().endpoints(),
            vec!["https://10.0.0.1:2379", "https://10.0.0.2:2379"]
        );
        NodeState::remove(dir.path()).unwrap();
        NodeState::remove(dir.path()).unwrap();
        assert_eq!(NodeState::load(dir.path()).unwrap(), None);
    }

    #[test]
    fn unreadable_or_newer_state_is_an_error_not_absent() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(node_state_path(dir.path())).unwrap();
        assert!(matches!(
            NodeState::load(dir.path()),
            Err(NodeStateError::Unreadable { .. })
        ));
        let dir = tempfile::tempdir().unwrap();
        let mut s = state();
        s.version = 99;
        s.save(dir.path()).unwrap();
        assert!(matches!(
            NodeState::load(dir.path()),
            Err(NodeStateError::Version { found: 99, .. })
        ));
    }

    #[test]
    fn config_defaults_and_overrides() {
        assert_eq!(NodeConfig::load(None).unwrap().etcd.client_port, 2379);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(
            &path,
            "etcd:\n  clientPort: 12379\n  startTimeout: 20s\n  binary: /bin/false\n",
        )
        .unwrap();
        let c = NodeConfig::load(Some(&path)).unwrap();
        assert_eq!(c.etcd.client_port, 12379);
        assert_eq!(c.etcd.peer_port, 2380);
        assert_eq!(c.etcd.start_timeout, Duration::from_secs(20));
        std::fs::write(&path, "etcd:\n  clientprot: 1\n").unwrap();
        let err = NodeConfig::load(Some(&path)).unwrap_err().to_string();
        assert!(err.contains("clientprot"), "{err}");
    }

    #[test]
    fn front_section_is_optional_and_typed() {
        assert_eq!(NodeConfig::load(None).unwrap().front, None);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, "front:\n  listen: 127.0.0.1:7444\n  interval: 10s\n").unwrap();
        let f = NodeConfig::load(Some(&path)).unwrap().front.unwrap();
        assert_eq!(f.listen, "127.0.0.1:7444");
        assert_eq!(f.interval, Duration::from_secs(10));
        assert_eq!(f.api_port, 6443);
        std::fs::write(&path, "front:\n  listne: x\n").unwrap();
        assert!(NodeConfig::load(Some(&path)).is_err());
    }

    #[test]
    fn urls_bracket_v6() {
        assert_eq!(
            https_url("fd00::1".parse().unwrap(), 2379),
            "https://[fd00::1]:2379"
        );
    }
}
