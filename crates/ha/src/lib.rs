//! Grow a control plane from one controller to several without risking etcd quorum.
