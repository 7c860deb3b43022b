//! A test double of the Kubernetes API server, for this project's tests and its local
//! sandbox. It is never a production control plane.
//!
//! [`ApiServer`] serves HTTPS on loopback with a throwaway CA, writes a kubeconfig that
//! kubectl, kube-rs and the python client load, and behaves like kube-apiserver where
//! this project depends on it: resourceVersions and conflicts, the status subresource
//! strategies, merge/JSON/strategic patches, selectors, watches with bookmarks and 410,
//! graceful pod deletion, finalizers, owner-reference garbage collection, the bootstrap
//! token cleaner and signer, a scheduler stand-in, eviction, and the kubelet proxy for `pods/log|exec|attach|portforward`.
//! Tests inject faults ([`Fault`]) and read the request log ([`RequestRecord`]).
//!
//! Controllers kube-controller-manager and kube-scheduler would run, each opt-in on the
//! [`Builder`]: the [`scheduler`] stand-in (and `pods/binding`), the [`bootstrap`] signer
//! (and bootstrap-token authentication); plus `pods/eviction` for `kubectl drain`. Bodies
//! are decoded through their `k8s-openapi` types ([`typed`]); [`query`] is the one query
//! decoder; [`fixtures`] holds test helpers the project's suites share.
//!
//! Modules by concern: [`server`] (builder, listener, routing, controllers), [`store`] (objects,
//! resourceVersions, the event window), [`resources`] (the served kinds; events.k8s.io/v1
//! Events are the core v1 ones, converted by [`convert`]), [`strategy`]
//! (what create/update/delete do to objects), [`patch`], [`selector`], [`watch`], [`gc`],
//! [`auth`], [`faults`], [`discovery`], [`kubeconfig`], [`tls`], [`table`] (server-side
//! printing for kubectl), [`protobuf`] (the request bodies kubectl 1.32+ sends), and the
//! kubelet side: [`proxy`] and the stub [`kubelet`].

pub mod admission;
mod api;
pub mod auth;
pub mod body;
pub mod bootstrap;
pub mod convert;
pub mod discovery;
pub mod faults;
pub mod fixtures;
pub mod gc;
pub mod kubeconfig;
pub mod kubelet;
pub mod patch;
pub mod protobuf;
pub mod proxy;
mod proxy_seam;
pub mod query;
pub mod resources;
pub mod scheduler;
pub mod selector;
pub mod server;
pub mod standalone;
pub mod status;
pub mod store;
pub mod strategy;
pub mod table;
pub mod times;
pub mod tls;
pub mod typed;
pub mod watch;

pub use auth::{Attributes, UserInfo};
pub use faults::{Fault, FaultKind};
pub use server::{ApiServer, Builder, RequestRecord};
pub use tls::CertPair;
