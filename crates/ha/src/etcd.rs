//! etcd membership and health.
