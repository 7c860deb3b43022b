//! Tests that run the stratum-server binary as a process.

mod certs_etcd;
mod cli;
mod etcd_downgrade_cli;
mod front_cli;
mod ha_cluster;
mod restore;
mod token;
