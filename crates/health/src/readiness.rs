//! The readiness decision: a pure function of what the agent's subsystems reported.

use std::fmt;

/// How the agent currently receives control-plane events.
///
/// Readiness requires a known mode. The [`Server`](crate::Server) starts in
/// [`DeliveryMode::Streaming`], the mode the agent's reconnecting event client starts in, so
/// that readiness after registration does not depend on whether the mode-change callback
/// was wired up before or after registration finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeliveryMode {
    /// The agent cannot tell how events reach it; it is not ready.
    Unknown,
    /// A long-lived stream (watch) delivers events.
    Streaming,
    /// Streaming is unavailable and the agent polls instead: slower, but events arrive.
    Polling,
}

impl fmt::Display for DeliveryMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeliveryMode::Unknown => "unknown",
            DeliveryMode::Streaming => "streaming",
            DeliveryMode::Polling => "polling",
        })
    }
}

/// Why `/readyz` answers 503. Only ever logged: the response body is a constant.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotReady {
    /// Long-running subsystems exited before shutdown. Nothing restarts them, so this is
    /// permanent for the life of the process.
    SubsystemStopped {
        /// The subsystems, in the order they stopped.
        names: Vec<String>,
    },
    /// Control-plane event delivery stopped for good.
    DeliveryStopped,
    /// The node identity is not registered (or loaded) yet.
    NotRegistered,
    /// The mesh data plane (tunnel interface and firewall baseline) has not been set up.
    DataPlaneNotEstablished,
    /// A data-plane check is installed but has not finished its first run.
    DataPlaneCheckPending,
    /// The last run of the data-plane check failed.
    DataPlaneCheckFailed {
        /// What the check reported.
        reason: String,
    },
    /// The delivery mode is [`DeliveryMode::Unknown`].
    DeliveryModeUnknown,
}

impl NotReady {
    /// Whether this state can never become ready again without restarting the process.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            NotReady::SubsystemStopped { .. } | NotReady::DeliveryStopped
        )
    }
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::SubsystemStopped { names } => write!(
                f,
                "subsystem(s) {} stopped before shutdown and nothing restarts them; \
                 see the earlier log lines of those subsystems, then restart the agent",
                names.join(", ")
            ),
            NotReady::DeliveryStopped => f.write_str(
                "control-plane event delivery stopped for good (permanent failure or rejected \
                 node secret); see the delivery log lines, then restart the agent",
            ),
            NotReady::NotRegistered => f.write_str("node is not registered yet"),
            NotReady::DataPlaneNotEstablished => f.write_str(
                "mesh data plane (tunnel interface, firewall baseline) is not set up yet",
            ),
            NotReady::DataPlaneCheckPending => {
                f.write_str("data-plane check has not completed its first run yet")
            }
            NotReady::DataPlaneCheckFailed { reason } => {
                write!(f, "data-plane check failed: {reason}")
            }
            NotReady::DeliveryModeUnknown => f.write_str("control-plane delivery mode is unknown"),
        }
    }
}

/// The last verdict of the background data-plane check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CheckVerdict {
    /// No check installed: the latch alone decides.
    NotInstalled,
    /// Installed, first run not finished.
    Pending,
    Passed,
    Failed(String),
}

/// Everything readiness depends on, as reported by the agent's subsystems.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Conditions {
    pub(crate) registered: bool,
    pub(crate) data_plane_latched: bool,
    pub(crate) data_plane_check: CheckVerdict,
    pub(crate) delivery_stopped: bool,
    pub(crate) delivery_mode: DeliveryMode,
    pub(crate) stopped_subsystems: Vec<String>,
}

impl Default for Conditions {
    fn default() -> Self {
        Conditions {
            registered: false,
            data_plane_latched: false,
            data_plane_check: CheckVerdict::NotInstalled,
            delivery_stopped: false,
            delivery_mode: DeliveryMode::Streaming,
            stopped_subsystems: Vec::new(),
        }
    }
}

impl Conditions {
    /// Ready, or the most important reason not to be. Permanent reasons come first so the
    /// log names what needs an operator, not a condition that would clear on its own.
    pub(crate) fn evaluate(&self) -> Result<(), NotReady> {
        if !self.stopped_subsystems.is_empty() {
            return Err(NotReady::SubsystemStopped {
                names: self.stopped_subsystems.clone(),
            });
        }
        if self.delivery_stopped {
            return Err(NotReady::DeliveryStopped);
        }
        if !self.registered {
            return Err(NotReady::NotRegistered);
        }
        if !self.data_plane_latched {
            return Err(NotReady::DataPlaneNotEstablished);
        }
        match &self.data_plane_check {
            CheckVerdict::NotInstalled | CheckVerdict::Passed => {}
            CheckVerdict::Pending => return Err(NotReady::DataPlaneCheckPending),
            CheckVerdict::Failed(reason) => {
                return Err(NotReady::DataPlaneCheckFailed {
                    reason: reason.clone(),
                });
            }
        }
        if self.delivery_mode == DeliveryMode::Unknown {
            return Err(NotReady::DeliveryModeUnknown);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Operators grep logs for these words; a blank mode in "not ready" lines hides why.
    #[test]
    fn delivery_modes_log_by_name() {
        assert_eq!(DeliveryMode::Unknown.to_string(), "unknown");
        assert_eq!(DeliveryMode::Streaming.to_string(), "streaming");
        assert_eq!(DeliveryMode::Polling.to_string(), "polling");
    }

    fn all_good() -> Conditions {
        Conditions {
            registered: true,
            data_plane_latched: true,
            ..Conditions::default()
        }
    }

    #[test]
    fn starts_not_ready_and_seeded_to_streaming() {
        let c = Conditions::default();
        assert_eq!(c.delivery_mode, DeliveryMode::Streaming);
        assert_eq!(c.evaluate(), Err(NotReady::NotRegistered));
    }

    #[test]
    fn all_conditions_make_ready() {
        assert_eq!(all_good().evaluate(), Ok(()));
        let polling = Conditions {
            delivery_mode: DeliveryMode::Polling,
            data_plane_check: CheckVerdict::Passed,
            ..all_good()
        };
        assert_eq!(polling.evaluate(), Ok(()));
    }

    #[test]
    fn each_condition_alone_withholds_readiness() {
        let cases: Vec<(Conditions, NotReady)> = vec![
            (
                Conditions {
                    registered: false,
                    ..all_good()
                },
                NotReady::NotRegistered,
            ),
            (
                Conditions {
                    data_plane_latched: false,
                    ..all_good()
                },
                NotReady::DataPlaneNotEstablished,
            ),
            (
                Conditions {
                    data_plane_check: CheckVerdict::Pending,
                    ..all_good()
                },
                NotReady::DataPlaneCheckPending,
            ),
            (
                Conditions {
                    data_plane_check: CheckVerdict::Failed("wg0 missing".into()),
                    ..all_good()
                },
                NotReady::DataPlaneCheckFailed {
                    reason: "wg0 missing".into(),
                },
            ),
            (
                Conditions {
                    delivery_stopped: true,
                    ..all_good()
                },
                NotReady::DeliveryStopped,
            ),
            (
                Conditions {
                    delivery_mode: DeliveryMode::Unknown,
                    ..all_good()
                },
                NotReady::DeliveryModeUnknown,
            ),
            (
                Conditions {
                    stopped_subsystems: vec!["firewall".into()],
                    ..all_good()
                },
                NotReady::SubsystemStopped {
                    names: vec!["firewall".into()],
                },
            ),
        ];
        for (conditions, want) in cases {
            assert_eq!(conditions.evaluate(), Err(want), "{conditions:?}");
        }
    }

    #[test]
    fn permanent_reasons_take_precedence() {
        let c = Conditions {
            stopped_subsystems: vec!["delivery".into()],
            delivery_stopped: true,
            registered: false,
            ..Conditions::default()
        };
        let err = c.evaluate().unwrap_err();
        assert!(err.is_permanent());
        assert!(err.to_string().contains("delivery"), "{err}");
        assert!(!NotReady::NotRegistered.is_permanent());
    }
}
