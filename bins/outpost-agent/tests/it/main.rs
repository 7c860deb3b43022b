//! Process-level tests of the `outpost-agent` binary.

mod health;
mod node;
