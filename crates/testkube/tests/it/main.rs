//! Conformance tests for the API double, run with real clients.
mod conformance;
mod conformance_admission;
mod conformance_bootstrap;
mod conformance_delete;
mod conformance_events;
mod conformance_faults;
mod conformance_patch;
mod conformance_scale;
mod conformance_scheduler;
mod conformance_status;
mod conformance_validation;
mod conformance_watch;
mod kubectl;
mod kubectl_api;
mod proxy;
mod python_client;
mod serve_binary;
