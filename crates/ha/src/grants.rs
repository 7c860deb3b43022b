//! Encrypted shared-cert grants.
