//! The `health:` block of the agent's configuration.

use serde::Deserialize;

/// The address the probe listener binds when the configuration names none.
///
/// Loopback on purpose: `/healthz` and `/readyz` answer anyone who can reach them, so the
/// default must not put them on the node's interfaces (or, once the mesh is up, in front of
/// every peer). A host-networked DaemonSet pod shares the host's network namespace, so a
/// kubelet probe with `host: 127.0.0.1` still reaches a loopback listener, the same
/// arrangement kube-proxy uses. Binding wider is an explicit choice through `health.listen`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9101";

/// Settings of the probe listener, as read from the `health:` block of the agent's YAML
/// configuration. The crate never reads files: the binary deserializes this and passes it in.
///
/// ```yaml
/// health:
///   enabled: true          # default true
///   listen: 127.0.0.1:9101 # default DEFAULT_LISTEN
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Whether the listener runs. `None` means the default, which is on.
    ///
    /// On by default because the shipped DaemonSet probes both endpoints unconditionally.
    /// Operators must write the control-plane and mesh settings anyway, but have no reason
    /// to know about this block; if omitting it left the port unbound, every kubelet would
    /// fail liveness and restart its agent, and each restart runs the drain path that tears
    /// down the node's tunnel and firewall chain, across the whole fleet, in a loop.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// `host:port` to bind. Empty means [`DEFAULT_LISTEN`].
    #[serde(default)]
    pub listen: String,
}

impl Config {
    /// Fills unset fields with their defaults: enabled, and [`DEFAULT_LISTEN`].
    pub fn apply_defaults(&mut self) {
        if self.enabled.is_none() {
            self.enabled = Some(true);
        }
        if self.listen.trim().is_empty() {
            self.listen = DEFAULT_LISTEN.to_string();
        }
    }

    /// Whether the listener should run; an unset `enabled` counts as on.
    pub fn is_enabled(&self) -> bool {
        self.enabled.unwrap_or(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fill_only_unset_fields() {
        let mut empty = Config::default();
        empty.apply_defaults();
        assert_eq!(
            empty,
            Config {
                enabled: Some(true),
                listen: "127.0.0.1:9101".into()
            }
        );

        let mut explicit = Config {
            enabled: Some(false),
            listen: "0.0.0.0:9200".into(),
        };
        explicit.apply_defaults();
        assert_eq!(explicit.enabled, Some(false));
        assert_eq!(explicit.listen, "0.0.0.0:9200");
        assert!(!explicit.is_enabled());
    }

    #[test]
    fn unset_enabled_means_on() {
        assert!(Config::default().is_enabled());
    }
}
