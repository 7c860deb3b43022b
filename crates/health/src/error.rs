//! Errors of the probe listener.

use std::io;

/// What went wrong starting the probe listener.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Another socket already listens on the configured address.
    #[error(
        "health listen address {addr} is already in use (another outpost-agent or another \
         process listens there): stop it, or choose another address with --listen or health.listen"
    )]
    AddressInUse {
        /// The configured `host:port`.
        addr: String,
        /// The bind error.
        #[source]
        source: io::Error,
    },
    /// The address could not be bound for any other reason (unparseable, not an address of
    /// this machine, a privileged port).
    #[error(
        "cannot bind the health listener to {addr} (health.listen must be host:port on an \
         address of this machine)"
    )]
    Bind {
        /// The configured `host:port`.
        addr: String,
        /// The bind or resolution error.
        #[source]
        source: io::Error,
    },
    /// `listen()` was called on a server whose configuration disables it.
    #[error("the health listener for {addr} is disabled (health.enabled: false); not binding")]
    Disabled {
        /// The configured `host:port`.
        addr: String,
    },
}
