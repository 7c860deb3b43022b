//! A worker join by token discovery, as `kubeadm join` does it for a worker:
//!
//! 1. read `kube-public/cluster-info` anonymously without trusting the server, verify the
//!    `jws-kubeconfig-<token-id>` signature with the token's secret, check the CA against
//!    the pin, then read it again verified against that CA ([`ha::discovery`]);
//! 2. check the agent configuration template (`--config`) with the `auth` block this join
//!    sets (bootstrap token, the verified API server and CA);
//! 3. only then write, below the host root, each file atomically: the cluster CA
//!    ([`CA_FILE`], 0644), the kubelet's bootstrap kubeconfig
//!    ([`hostnode::configure::BOOTSTRAP_KUBECONFIG`], 0600) and the agent configuration
//!    ([`crate::config::DEFAULT_CONFIG_PATH`], 0600: it holds the token).
//!
//! A wrong pin, a bad signature, an unknown or expired token, or a server that does not
//! answer each fail in step 1, naming which, and nothing is written. Starting the node
//! stack (`node up`) is the caller's next step.

use std::path::{Path, PathBuf};

use ha::discovery::{self, CaPin, DiscoveryError, DiscoveryTimeouts};
use ha::tokens::BootstrapToken;
use hostnode::HostRoot;
use tracing::info;

use crate::config::{AgentConfig, ConfigError, DEFAULT_CONFIG_PATH, redact_values};

/// Where the verified cluster CA is written (below the host root).
pub const CA_FILE: &str = "/etc/kubernetes/pki/ca.crt";

/// What a join needs.
#[derive(Debug)]
pub struct JoinRequest {
    /// `HOST:PORT` of the API server.
    pub server: String,
    /// The bootstrap token (its `Debug` hides the secret).
    pub token: BootstrapToken,
    /// The CA pin.
    pub pin: CaPin,
    /// The agent configuration template (`nodeName` and the other sections; `auth` is set
    /// by the join).
    pub config: PathBuf,
    /// Where host paths are written.
    pub host_root: HostRoot,
    /// How long discovery keeps trying an unreachable server or a missing signature.
    pub timeouts: DiscoveryTimeouts,
}

/// What a join wrote.
#[derive(Debug, Clone)]
pub struct Joined {
    /// The node name.
    pub node_name: String,
    /// The API server the bootstrap kubeconfig points at (as cluster-info publishes it).
    pub api_server: String,
    /// The written agent configuration (below the host root).
    pub config: PathBuf,
    /// The written bootstrap kubeconfig.
    pub bootstrap_kubeconfig: PathBuf,
    /// The written CA.
    pub ca_file: PathBuf,
}

/// A join that failed. Nothing was written unless the variant is [`JoinError::Write`].
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// Discovery refused the cluster (the source says why: pin, signature, token, server).
    #[error("cannot join through {server}: nothing was trusted and nothing was written")]
    Discovery {
        /// The `--server` given.
        server: String,
        /// Why.
        #[source]
        source: DiscoveryError,
    },
    /// The configuration template is not usable.
    #[error("the agent configuration template is not usable; nothing was written")]
    Config(#[source] ConfigError),
    /// A file could not be written.
    #[error("cannot write {}", path.display())]
    Write {
        /// The file (below the host root).
        path: PathBuf,
        /// Why.
        #[source]
        source: hostnode::fsutil::FsError,
    },
}

/// Joins: discovers and verifies the cluster, then writes the files. See the module docs.
pub async fn join(req: JoinRequest) -> Result<Joined, JoinError> {
    // 1. Discovery: nothing is read from disk but the template, nothing is written.
    let template = std::fs::read_to_string(&req.config).map_err(|source| {
        JoinError::Config(ConfigError::Read {
            path: req.config.clone(),
            source,
        })
    })?;
    // The template is checked before contacting anyone, so a typo fails fast.
    let _ = build_config(&template, &req.config, "https://127.0.0.1:6443", &req.token)?;
    let discovered = discovery::discover(&req.server, &req.token, &req.pin, req.timeouts)
        .await
        .map_err(|source| JoinError::Discovery {
            server: req.server.clone(),
            source,
        })?;
    let api_server = discovered.info.server.clone();
    // 2. The configuration as it will be written, checked in full.
    let (text, config) = build_config(&template, &req.config, &api_server, &req.token)?;
    let kubeconfig =
        discovery::bootstrap_kubeconfig(&api_server, &discovered.info.ca_pem, &req.token);
    // 3. Write.
    let root = &req.host_root;
    let ca_file = root.resolve(CA_FILE);
    let bootstrap = root.resolve(hostnode::configure::BOOTSTRAP_KUBECONFIG);
    let config_path = root.resolve(DEFAULT_CONFIG_PATH);
    for (path, contents, mode) in [
        (&ca_file, discovered.info.ca_pem.as_slice(), 0o644),
        (&bootstrap, kubeconfig.as_bytes(), 0o600),
        (&config_path, text.as_bytes(), 0o600),
    ] {
        hostnode::fsutil::write_atomic(path, contents, mode, None).map_err(|source| {
            JoinError::Write {
                path: path.clone(),
                source,
            }
        })?;
    }
    info!(
        node = %config.node_name,
        server = %api_server,
        token_id = req.token.id(),
        "joined: wrote the CA, the bootstrap kubeconfig and the agent configuration"
    );
    Ok(Joined {
        node_name: config.node_name,
        api_server,
        config: config_path,
        bootstrap_kubeconfig: bootstrap,
        ca_file,
    })
}

/// The template with `auth.bootstrapToken` set, as text, and checked.
fn build_config(
    template: &str,
    path: &Path,
    api_server: &str,
    token: &BootstrapToken,
) -> Result<(String, AgentConfig), JoinError> {
    use serde_yaml::{Mapping, Value};
    let parse_err = |reason: String| {
        JoinError::Config(ConfigError::Parse {
            path: path.to_path_buf(),
            reason: redact_values(&reason),
        })
    };
    let mut doc: Mapping = match serde_yaml::from_str::<Option<Mapping>>(template) {
        Ok(m) => m.unwrap_or_default(),
        Err(e) => return Err(parse_err(e.to_string())),
    };
    let mut bt = Mapping::new();
    bt.insert("apiServer".into(), Value::String(api_server.to_string()));
    bt.insert("token".into(), Value::String(token.to_string()));
    bt.insert("caFile".into(), Value::String(CA_FILE.to_string()));
    let mut auth = Mapping::new();
    auth.insert("bootstrapToken".into(), Value::Mapping(bt));
    doc.insert("auth".into(), Value::Mapping(auth));
    if !doc.contains_key("kubelet") {
        // The node stack needs a kubelet block; every key of it has a default.
        doc.insert("kubelet".into(), Value::Mapping(Mapping::new()));
    }
    let text = serde_yaml::to_string(&Value::Mapping(doc)).map_err(|e| parse_err(e.to_string()))?;
    let config = AgentConfig::parse(&text, path).map_err(JoinError::Config)?;
    let text = format!(
        "# Written by `outpost-agent join` from {}; holds the bootstrap token (mode 0600).\n{text}",
        path.display()
    );
    Ok((text, config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_gets_the_auth_block_and_keeps_the_rest() {
        let token = BootstrapToken::parse("abcdef.0123456789abcdef").unwrap();
        let (text, c) = build_config(
            "nodeName: w1\nhealth: {listen: '127.0.0.1:9201'}\nauth: {kubeconfig: {content: old}}\n",
            Path::new("/t.yaml"),
            "https://10.0.0.1:6443",
            &token,
        )
        .unwrap();
        assert_eq!(c.health.listen, "127.0.0.1:9201");
        let ns = c.node_stack.unwrap();
        match ns.auth {
            hostnode::goalstate::AuthMode::BootstrapToken(b) => {
                assert_eq!(b.api_server, "https://10.0.0.1:6443");
                assert_eq!(b.ca_file, Path::new(CA_FILE));
            }
            other => panic!("{other:?}"),
        }
        assert!(!text.contains("content: old"), "{text}");
    }

    #[test]
    fn a_bad_template_is_refused_without_echoing_the_token() {
        let token = BootstrapToken::parse("abcdef.0123456789abcdef").unwrap();
        let err = build_config(
            "nodeName: w1\nhelth: {}\n",
            Path::new("/t.yaml"),
            "https://10.0.0.1:6443",
            &token,
        )
        .unwrap_err();
        let shown = format!("{err} {:?}", std::error::Error::source(&err));
        assert!(shown.contains("helth"), "{shown}");
        assert!(!shown.contains("0123456789abcdef"), "{shown}");
    }
}
