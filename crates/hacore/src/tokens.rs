//! Bootstrap tokens: the pure part (`ha::tokens` reads, mints and deletes them).

/// Whether a grant's token still lets its holder read the grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenState {
    /// The token Secret exists and has not expired.
    Live,
    /// The token Secret exists but its expiration has passed (or cannot be read, which the
    /// bootstrap authenticator also treats as expired).
    Expired,
    /// The token Secret does not exist.
    Gone,
}
