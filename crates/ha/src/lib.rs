//! Grows a control plane from one controller to several without risking etcd quorum or
//! leaking the cluster's CA keys.

pub mod admins;
pub mod etcd;
pub mod grants;
pub mod journal;
pub mod tokens;
