//! End-to-end tests: the binaries driven by real clients.
mod deploy;
mod nodeaddr;
