//! Component tests of the agent crate: join against the API double's bootstrap signer,
//! the run daemon's readiness against the API double, the tunnel supervisor against a real
//! sshd on loopback, and the wireguard check against a real wireguard-go pair in a network
//! namespace of its own.

mod common;
mod join;
mod run;
mod sshd;
mod tunnel;
mod wireguard;
