//! The proxy's command line, as `flotilla-proxy` and `flotilla proxy` run it: its flags; it
//! serves `/healthz` and `/metrics` and programs table `ip kube-proxy` from Services and
//! EndpointSlices until SIGINT/SIGTERM (leaving the rules in place); `--cleanup` deletes the
//! table and exits.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::dns::{self, records::ClusterDns};
use crate::health::{self, Metrics, ProxyHealth};
use crate::model::Cidr;
use crate::netlink::Netlink;
use crate::nft::Nft;
use crate::proxier::{self, BridgeMasquerade, NodeDns, NodePortAddresses, ProxierConfig};
use crate::render;
use anyhow::Context;
use clap::Parser;

/// Parses `500ms`, `1s`, `30m`, `1h` (Go-style durations, one unit).
fn parse_duration(value: &str) -> Result<Duration, String> {
    let value = value.trim();
    let split = value
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .ok_or_else(|| format!("duration {value:?} has no unit"))?;
    let (number, unit) = value.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("invalid duration {value:?}"))?;
    let seconds = match unit {
        "ms" => number / 1000.0,
        "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => return Err(format!("invalid duration unit in {value:?}")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|err| err.to_string())
}

/// The proxy's flags (upstream kube-proxy's names where it has them).
#[derive(Debug, Parser)]
#[command(name = "flotilla-proxy", about = "The Flotilla node proxy (nftables)")]
pub struct ProxyArgs {
    /// A kubeconfig to talk to the API with (default: the usual kubeconfig search).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The Node's name (default: the hostname); endpoints on it are local.
    #[arg(long)]
    hostname_override: Option<String>,
    /// The node's IP (default: the Node's first IPv4 InternalIP).
    #[arg(long)]
    node_ip: Option<Ipv4Addr>,
    /// The pods' CIDR: traffic from outside it to a ClusterIP is masqueraded.
    #[arg(long)]
    cluster_cidr: Option<Cidr>,
    /// The Service CIDR: traffic to unallocated ClusterIPs in it is dropped (upstream reads
    /// ServiceCIDR objects).
    #[arg(long)]
    service_cluster_ip_range: Option<Cidr>,
    /// Where NodePorts answer: `primary` (the node IP), or CIDRs (`0.0.0.0/0`: everywhere).
    #[arg(long, default_value = "primary")]
    nodeport_addresses: NodePortAddresses,
    /// Masquerade pod traffic to endpoints on this node's bridge: auto = only when
    /// br_netfilter is not active.
    #[arg(long, value_enum, default_value = "auto")]
    bridge_masquerade: BridgeMasquerade,
    /// This node's pod CIDR for --bridge-masquerade (default: the Node's spec.podCIDR).
    #[arg(long)]
    pod_cidr: Option<Cidr>,
    /// Masquerade all traffic to ClusterIPs.
    #[arg(long)]
    masquerade_all: bool,
    /// The fwmark bit marking packets to masquerade.
    #[arg(long, default_value_t = 14, value_parser = clap::value_parser!(u8).range(0..=31))]
    masquerade_bit: u8,
    /// `/healthz`, `/livez` and `/metrics`.
    #[arg(long, default_value = "0.0.0.0:10256")]
    healthz_bind_address: SocketAddr,
    /// The shortest interval between syncs.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    min_sync_period: Duration,
    /// Retry delay after a failed sync; /healthz turns 503 when a change waits twice this.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    sync_period: Duration,
    /// How often the whole table is rebuilt.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    full_sync_period: Duration,
    /// How many tables share the Services' NAT chains (0: all in table kube-proxy, as
    /// upstream); each change makes the kernel re-check one table's rules.
    #[arg(long, default_value_t = render::DEFAULT_SERVICE_TABLES,
          value_parser = clap::value_parser!(u16).range(0..=i64::from(render::MAX_SERVICE_TABLES)))]
    service_tables: u16,
    /// Delete the proxy's tables and exit.
    #[arg(long)]
    cleanup: bool,
    /// The cluster DNS address (the `kube-system/kube-dns` Service's ClusterIP): this node
    /// answers it itself, on a local interface, with the cluster's records (as NodeLocal
    /// DNSCache does). Unset: no DNS on this node.
    #[arg(long)]
    cluster_dns: Option<Ipv4Addr>,
    /// The cluster's DNS domain.
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// The resolv.conf naming the resolvers that answer names outside the cluster.
    #[arg(long, default_value = "/etc/resolv.conf")]
    resolv_conf: PathBuf,
}

/// The interface holding the cluster DNS address on the node: the loopback, as load balancers
/// put a virtual address there (a dummy interface needs a kernel module some nodes lack).
const DNS_INTERFACE: &str = "lo";

/// The proxy's default log filter (`RUST_LOG` overrides it).
pub const DEFAULT_LOG_FILTER: &str = "info,kube=warn,tower=warn,h2=warn";

/// Runs the proxy until SIGINT or SIGTERM, or with `--cleanup` deletes its tables.
pub async fn run_until_signalled(args: ProxyArgs) -> anyhow::Result<()> {
    if args.cleanup {
        Nft::default()
            .delete_table()
            .context("error cleaning up nftables rules")?;
        return Ok(());
    }
    tokio::select! {
        outcome = run(args) => outcome,
        _ = shutdown() => {
            tracing::info!("shutting down; the rules stay in place");
            Ok(())
        }
    }
}

async fn shutdown() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_lowercase())
        .unwrap_or_else(|_| "localhost".into())
}

async fn run(args: ProxyArgs) -> anyhow::Result<()> {
    let mut nft = Nft::default();
    let version = nft.version().context("nft is required")?;
    tracing::info!(%version, "using nft");
    // Partial syncs go through netlink when it opens; nft -f remains the way otherwise.
    match Netlink::open() {
        Ok(netlink) => nft = nft.with_netlink(netlink),
        Err(err) => tracing::warn!(%err, "partial syncs will run nft"),
    }
    let client = match &args.kubeconfig {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let config = kube::Config::from_custom_kubeconfig(
                kube::config::Kubeconfig::from_yaml(&text)?,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .context("the kubeconfig is not usable")?;
            kube::Client::try_from(config)?
        }
        None => kube::Client::try_default().await?,
    };
    let health = Arc::new(ProxyHealth::new(args.sync_period * 2));
    let metrics = Arc::new(Metrics::default());
    let server =
        health::serve_healthz(args.healthz_bind_address, health.clone(), metrics.clone()).await?;
    let dns = match args.cluster_dns {
        Some(address) => Some(start_dns(address, &args.cluster_domain, &args.resolv_conf).await?),
        None => None,
    };
    let config = ProxierConfig {
        hostname: args.hostname_override.unwrap_or_else(hostname),
        node_ip: args.node_ip,
        render: render::Config {
            cluster_cidr: args.cluster_cidr,
            masquerade_all: args.masquerade_all,
            masquerade_bit: args.masquerade_bit,
            service_cidrs: args.service_cluster_ip_range.into_iter().collect(),
            service_tables: args.service_tables,
            node_local_ips: dns.iter().map(|d| d.address).collect(),
            ..render::Config::default()
        },
        node_port_addresses: args.nodeport_addresses,
        bridge_masquerade: args.bridge_masquerade,
        pod_cidr: args.pod_cidr,
        min_sync_period: args.min_sync_period,
        sync_period: args.sync_period,
        full_sync_period: args.full_sync_period,
        nft,
        dns,
    };
    tracing::info!(node = %config.hostname, healthz = %args.healthz_bind_address, "starting the proxy");
    let outcome = proxier::run(client, config, health, metrics).await;
    server.abort();
    outcome
}

/// Puts the cluster DNS `address` on this node (on the loopback, so that pods' packets to it
/// are delivered here) and starts answering on it.
async fn start_dns(
    address: Ipv4Addr,
    domain: &str,
    resolv_conf: &std::path::Path,
) -> anyhow::Result<NodeDns> {
    let records = ClusterDns::new(domain)
        .map_err(|err| anyhow::anyhow!("--cluster-domain {domain:?}: {err}"))?;
    let ip = |args: &[&str]| -> anyhow::Result<()> {
        let output = std::process::Command::new("ip")
            .args(args)
            .output()
            .context("running ip (iproute2)")?;
        anyhow::ensure!(
            output.status.success(),
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
        Ok(())
    };
    // `replace`: left from an earlier run, the address is kept.
    ip(&[
        "addr",
        "replace",
        &format!("{address}/32"),
        "dev",
        DNS_INTERFACE,
    ])?;
    let conf = std::fs::read_to_string(resolv_conf).unwrap_or_default();
    let upstreams = dns::server::upstreams(&conf, IpAddr::V4(address));
    let records = Arc::new(RwLock::new(records));
    let socket = SocketAddr::new(IpAddr::V4(address), 53);
    let served = records.clone();
    // Bound before the proxier starts, so that a taken port fails the start.
    let listening = dns::server::bind(socket).await?;
    tokio::spawn(async move {
        if let Err(err) = dns::server::serve(listening, served, upstreams).await {
            tracing::error!(%err, "the cluster DNS stopped");
        }
    });
    Ok(NodeDns { address, records })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5d").is_err());
    }

    #[test]
    fn flags() {
        let args = ProxyArgs::try_parse_from([
            "flotilla-proxy",
            "--kubeconfig",
            "/k",
            "--hostname-override",
            "n1",
            "--cluster-cidr",
            "10.244.0.0/16",
            "--healthz-bind-address",
            "10.199.7.2:10256",
        ])
        .expect("flags");
        assert_eq!(args.hostname_override.as_deref(), Some("n1"));
        assert_eq!(args.nodeport_addresses, NodePortAddresses::Primary);
        assert_eq!(args.min_sync_period, Duration::from_secs(1));
        assert_eq!(args.service_tables, render::DEFAULT_SERVICE_TABLES);
        assert!(
            ProxyArgs::try_parse_from(["flotilla-proxy", "--service-tables", "33"]).is_err(),
            "at most MAX_SERVICE_TABLES"
        );
    }
}
