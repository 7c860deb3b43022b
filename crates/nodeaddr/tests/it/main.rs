//! Component tests: the reconciler against the API double over real HTTPS, and the
//! documented shell derivation against the Rust one.

mod common;
mod reconcile;
mod run;
mod serve;
mod shell;
