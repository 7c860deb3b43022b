//! Bootstrap tokens.
