//! A virtual kubelet: pods become external instances of a provider.
