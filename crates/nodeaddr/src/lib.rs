//! Derived kubelet tunnel routes and the Node address reconciler.
