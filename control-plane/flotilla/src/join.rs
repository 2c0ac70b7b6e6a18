//! The simulator's node joining its cluster with `--node-config`: the same bootstrap flow as
//! the real kubelet (`flotilla-node-bootstrap`: bootstrap token → CertificateSigningRequest →
//! `system:node:<name>`), then what the simulated node registers as.

use std::path::Path;

use anyhow::Context;

use crate::SimulateArgs;
use crate::simulator::SimNode;

/// Joins the node `args` names with the bootstrap document at `path`: its client, acting as
/// `system:node:<name>`, and what it registers as.
pub async fn join(path: &Path, args: &SimulateArgs) -> anyhow::Result<(kube::Client, SimNode)> {
    let name = args
        .node_name
        .clone()
        .context("--node-name is required with --node-config")?;
    let ip = args
        .node_ip
        .context("--node-ip is required with --node-config")?;
    let cert_dir = args
        .cert_dir
        .clone()
        .context("--cert-dir is required with --node-config")?;
    let (client, config) = flotilla_node_bootstrap::join(path, &name, &cert_dir).await?;
    let node = SimNode {
        name,
        ip: ip.to_string(),
        labels: config.spec.kubelet.node_labels,
        taints: config.spec.kubelet.register_with_taints,
    };
    Ok((client, node))
}
