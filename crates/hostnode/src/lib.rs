//! Start, upgrade, roll back and reset a node stack on a host.
