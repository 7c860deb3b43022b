//! A test double of the Kubernetes API server for tests and the local sandbox (never a production control plane).
