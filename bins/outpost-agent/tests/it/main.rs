//! Process-level tests of the `outpost-agent` binary.

mod config;
mod health;
mod node;
mod run;
