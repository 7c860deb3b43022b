//! `outpost-agent kubelet-port` and `outpost-agent tunnel-config`.

use std::process::ExitCode;

/// Flags of `outpost-agent kubelet-port`.
#[derive(Debug, clap::Args)]
pub struct KubeletPortArgs {}

/// Flags of `outpost-agent tunnel-config`.
#[derive(Debug, clap::Args)]
pub struct TunnelConfigArgs {}

pub fn kubelet_port(_args: KubeletPortArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("outpost-agent kubelet-port is not built yet")
}

pub fn tunnel_config(_args: TunnelConfigArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("outpost-agent tunnel-config is not built yet")
}
