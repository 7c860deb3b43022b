//! Conformance tests for the API double, run with real clients.
mod conformance;
mod kubectl;
mod proxy;
