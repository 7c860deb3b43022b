//! A stub kubelet serving the streaming endpoints, for tests.
