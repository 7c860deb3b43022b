//! vnode component tests: the controllers against the API double over real HTTPS, with the
//! in-memory provider and the process provider (real processes).

mod common;
mod crash;
mod deadline;
mod kubelet;
mod lifecycle;
mod placement;
mod process;
mod readopt;
mod secret;
mod update;
