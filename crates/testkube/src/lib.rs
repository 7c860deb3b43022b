//! A test double of the Kubernetes API server, for this project's tests and its local
//! sandbox. It is never a production control plane.

pub mod body;
pub mod kubelet;
pub mod proxy;
pub mod status;
