//! The cluster PKI: CAs, leaf certificates and kubeconfigs, written safely.
