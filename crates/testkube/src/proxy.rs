//! Forwarding of `pods/log`, `pods/exec`, `pods/attach`, `pods/portforward` to the kubelet.
