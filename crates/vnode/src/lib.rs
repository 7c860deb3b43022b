//! A virtual kubelet: one virtual Node per provider, whose pods become external instances
//! (cloud VMs, GPU boxes, local processes) through a provider seam.
//!
//! Status: not built yet. No open issue covers it; the specification is
//! `seeds/vnode.txt` in the project's shared folder. The planned shape: a `Provider` trait
//! (provision / terminate / list / status, with optional log streaming and exec), a pod
//! lifecycle handler that derives each instance's identity from its pod so a restarted
//! manager reclaims instances instead of leaking or doubling them, and a shared kubelet
//! API server answering `kubectl logs/exec` for every virtual node.
