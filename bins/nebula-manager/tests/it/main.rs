//! nebula-manager end to end: the real binary against the API double, with the process
//! provider running real processes.

mod crash;
mod deploy;
mod failover;
mod kubelet;
mod state;
