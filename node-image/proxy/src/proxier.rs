//! The proxier loop (upstream `Proxier` with its `BoundedFrequencyRunner`): watches Services,
//! EndpointSlices and its own Node through kube-rs, keeps the model, and syncs — a full
//! rebuild at start, after an error and every `full_sync_period`; otherwise only the changed
//! Services, at most once per `min_sync_period`.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime};

use futures::{StreamExt, stream::BoxStream};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::watcher::{self, Event};

use crate::dns::records::ClusterDns;
use crate::health::{Metrics, ProxyHealth, ServiceHealthServer, TO_BE_DELETED_TAINT};
use crate::model::{Cidr, NamespacedName, ProxyState};
use crate::nft::{Nft, NftError};
use crate::render::{self, Renderer};

/// Where NodePorts answer (`--nodeport-addresses`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodePortAddresses {
    /// The node's primary IP (upstream's default in nftables mode).
    Primary,
    /// Every local address (`0.0.0.0/0`).
    All,
    /// The local addresses inside these CIDRs.
    Cidrs(Vec<Cidr>),
}

impl std::str::FromStr for NodePortAddresses {
    type Err = crate::model::ModelError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let value = value.trim();
        if value.is_empty() || value == "primary" {
            return Ok(Self::Primary);
        }
        let cidrs = value
            .split(',')
            .map(|cidr| cidr.trim().parse::<Cidr>())
            .collect::<Result<Vec<_>, _>>()?;
        if cidrs.iter().any(|cidr| cidr.prefix == 0) {
            return Ok(Self::All);
        }
        Ok(Self::Cidrs(cidrs))
    }
}

/// Whether to masquerade pod traffic to endpoints on this node's bridge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BridgeMasquerade {
    /// Only when `br_netfilter` is not active (and cannot be turned on).
    Auto,
    /// Always.
    Always,
    /// Never (rely on `br_netfilter`, as upstream).
    Never,
}

/// The proxier's settings.
#[derive(Debug, Clone)]
pub struct ProxierConfig {
    /// The Node's name (`--hostname-override`): endpoints with this `nodeName` are local.
    pub hostname: String,
    /// The node's IP (`--node-ip`); `None`: the Node's first IPv4 InternalIP.
    pub node_ip: Option<Ipv4Addr>,
    /// Rendering settings (cluster CIDR, masquerading, Service CIDRs); node-derived fields
    /// are filled in by the proxier.
    pub render: render::Config,
    /// `--nodeport-addresses`.
    pub node_port_addresses: NodePortAddresses,
    /// `--bridge-masquerade`.
    pub bridge_masquerade: BridgeMasquerade,
    /// `--pod-cidr`; `None`: the Node's `spec.podCIDR`.
    pub pod_cidr: Option<Cidr>,
    /// `--min-sync-period`.
    pub min_sync_period: Duration,
    /// `--sync-period`: retry delay after a failed sync.
    pub sync_period: Duration,
    /// `--full-sync-period`.
    pub full_sync_period: Duration,
    /// How nft is run.
    pub nft: Nft,
    /// The cluster DNS this node answers (`--cluster-dns`): its records follow the watches.
    pub dns: Option<NodeDns>,
}

/// The cluster DNS on this node: its address (the `kube-dns` Service's, which this node
/// answers itself rather than proxying) and the records it serves.
#[derive(Debug, Clone)]
pub struct NodeDns {
    /// The cluster DNS address.
    pub address: Ipv4Addr,
    /// The records, shared with the responder.
    pub records: Arc<RwLock<ClusterDns>>,
}

/// Whether bridged IPv4 traffic passes netfilter here (`br_netfilter` with
/// `net.bridge.bridge-nf-call-iptables=1`); tries to turn the sysctl on when it is off.
pub fn bridge_netfilter_active() -> bool {
    const SYSCTL: &str = "/proc/sys/net/bridge/bridge-nf-call-iptables";
    let read = || std::fs::read_to_string(SYSCTL).map(|v| v.trim() == "1");
    match read() {
        Ok(true) => true,
        Ok(false) => std::fs::write(SYSCTL, "1").is_ok() && read().unwrap_or(false),
        // No /proc/sys/net/bridge: the br_netfilter module is not loaded.
        Err(_) => false,
    }
}

/// Parses `ip -4 -o addr show` output into addresses.
pub fn parse_ip_addr_output(output: &str) -> Vec<Ipv4Addr> {
    output
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            words.find(|w| *w == "inet")?;
            words.next()?.split('/').next()?.parse().ok()
        })
        .collect()
}

fn local_addresses() -> Vec<Ipv4Addr> {
    std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .map(|out| parse_ip_addr_output(&String::from_utf8_lossy(&out.stdout)))
        .unwrap_or_default()
}

/// What the proxier learns from its Node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct NodeInfo {
    ip: Option<Ipv4Addr>,
    pod_cidr: Option<Cidr>,
}

fn node_info(node: &Node) -> NodeInfo {
    let ip = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter(|a| a.type_ == "InternalIP")
        .find_map(|a| a.address.parse().ok());
    let pod_cidr = node
        .spec
        .as_ref()
        .and_then(|s| s.pod_cidr.as_deref())
        .and_then(|c| c.parse().ok());
    NodeInfo { ip, pod_cidr }
}

fn node_eligible(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_none()
        && !node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .into_iter()
            .flatten()
            .any(|t| t.key == TO_BE_DELETED_TAINT)
}

enum Update {
    Service(Boxed<Service>),
    Slice(Boxed<EndpointSlice>),
    Node(Boxed<Node>),
}

/// The watches' results, boxed: the objects are large and of very different sizes.
type Boxed<K> = Box<Result<Event<K>, watcher::Error>>;
/// The proxier's state between events.
struct Proxier {
    config: ProxierConfig,
    bridge_needed: bool,
    node: NodeInfo,
    state: ProxyState,
    renderer: Renderer,
    pending: BTreeSet<NamespacedName>,
    services_synced: bool,
    slices_synced: bool,
    listed_services: BTreeSet<NamespacedName>,
    listed_slices: BTreeSet<(NamespacedName, String)>,
    /// The slices of the current list, by (namespace, name), for the DNS records.
    dns_listed_slices: BTreeSet<(String, String)>,
    last_sync: Option<Instant>,
    last_full_sync: Option<Instant>,
    retry_at: Option<Instant>,
    health: Arc<ProxyHealth>,
    metrics: Arc<Metrics>,
    service_health: ServiceHealthServer,
}

impl Proxier {
    fn render_config(&self) -> render::Config {
        let mut config = self.config.render.clone();
        let node_ip = self.config.node_ip.or(self.node.ip);
        config.node_ip = node_ip;
        config.node_port_ips = match &self.config.node_port_addresses {
            NodePortAddresses::All => None,
            NodePortAddresses::Primary => Some(node_ip.into_iter().collect()),
            NodePortAddresses::Cidrs(cidrs) => Some(
                local_addresses()
                    .into_iter()
                    .filter(|ip| cidrs.iter().any(|c| c.contains(*ip)))
                    .collect(),
            ),
        };
        config.bridge_pod_cidr = if self.bridge_needed {
            self.config.pod_cidr.or(self.node.pod_cidr)
        } else {
            None
        };
        config
    }

    fn note_changes(&mut self) {
        let changed = self.state.take_changed();
        if !changed.is_empty() {
            self.health.queued_update(SystemTime::now());
            self.pending.extend(changed);
        }
    }

    /// Applies a change to the DNS records, when this node answers DNS.
    fn with_dns<T>(&self, change: impl FnOnce(&mut ClusterDns) -> T) {
        if let Some(dns) = &self.config.dns
            && let Ok(mut records) = dns.records.write()
        {
            change(&mut records);
        }
    }

    /// Whether `service` is the cluster DNS this node answers itself (not proxied).
    fn answered_here(&self, service: &Service) -> bool {
        let Some(dns) = &self.config.dns else {
            return false;
        };
        let address = dns.address.to_string();
        service
            .spec
            .as_ref()
            .and_then(|s| s.cluster_ip.as_deref())
            .is_some_and(|ip| ip == address)
    }

    fn handle(&mut self, update: Update) {
        match update {
            Update::Service(update) => match *update {
                Err(err) => tracing::warn!(%err, "service watch failed; retrying"),
                Ok(event) => match event {
                    Event::Init => self.listed_services.clear(),
                    Event::InitApply(service) | Event::Apply(service) => {
                        let (namespace, name) = (
                            service.metadata.namespace.as_deref().unwrap_or_default(),
                            service.metadata.name.as_deref().unwrap_or_default(),
                        );
                        self.listed_services
                            .insert(NamespacedName::new(namespace, name));
                        self.with_dns(|dns| dns.apply_service(&service));
                        if self.answered_here(&service) {
                            self.state.delete_service(namespace, name);
                        } else {
                            self.state.apply_service(&service);
                        }
                    }
                    Event::Delete(service) => {
                        let (namespace, name) = (
                            service.metadata.namespace.as_deref().unwrap_or_default(),
                            service.metadata.name.as_deref().unwrap_or_default(),
                        );
                        self.with_dns(|dns| dns.delete_service(namespace, name));
                        self.state.delete_service(namespace, name);
                    }
                    Event::InitDone => {
                        self.state.retain_services(&self.listed_services);
                        let listed = self
                            .listed_services
                            .iter()
                            .map(|n| (n.namespace.clone(), n.name.clone()))
                            .collect();
                        self.with_dns(|dns| dns.retain_services(&listed));
                        self.services_synced = true;
                    }
                },
            },
            Update::Slice(update) => match *update {
                Err(err) => tracing::warn!(%err, "endpointslice watch failed; retrying"),
                Ok(event) => match event {
                    Event::Init => {
                        self.listed_slices.clear();
                        self.dns_listed_slices.clear();
                    }
                    Event::InitApply(slice) | Event::Apply(slice) => {
                        if let Some(key) = ProxyState::slice_key(&slice) {
                            self.listed_slices.insert(key);
                        }
                        if let (Some(namespace), Some(name)) =
                            (&slice.metadata.namespace, &slice.metadata.name)
                        {
                            self.dns_listed_slices
                                .insert((namespace.clone(), name.clone()));
                        }
                        self.with_dns(|dns| dns.apply_slice(&slice));
                        self.state.apply_slice(&slice);
                    }
                    Event::Delete(slice) => {
                        self.with_dns(|dns| dns.delete_slice(&slice));
                        self.state.delete_slice(&slice);
                    }
                    Event::InitDone => {
                        self.state.retain_slices(&self.listed_slices);
                        let listed = std::mem::take(&mut self.dns_listed_slices);
                        self.with_dns(|dns| dns.retain_slices(&listed));
                        self.dns_listed_slices = listed;
                        self.slices_synced = true;
                    }
                },
            },
            Update::Node(node_update) => match *node_update {
                Err(err) => tracing::warn!(%err, "node watch failed; retrying"),
                Ok(event) => match event {
                    Event::InitApply(node) | Event::Apply(node) => {
                        self.health.set_node_eligible(node_eligible(&node));
                        self.node = node_info(&node);
                        let config = self.render_config();
                        // A new node IP or pod CIDR changes the base rules: a full sync.
                        self.renderer.set_config(config);
                    }
                    Event::Delete(_) => self.health.set_node_eligible(false),
                    Event::Init | Event::InitDone => {}
                },
            },
        }
        self.note_changes();
    }

    /// When the next sync is due; `None` before the first lists completed.
    fn next_sync(&self) -> Option<Instant> {
        if !(self.services_synced && self.slices_synced) {
            return None;
        }
        let Some(last) = self.last_sync else {
            return Some(Instant::now());
        };
        let mut due = self
            .last_full_sync
            .map(|t| t + self.config.full_sync_period)
            .unwrap_or(last);
        if !self.pending.is_empty() || self.renderer.needs_full_sync() {
            due = due.min(last + self.config.min_sync_period);
        }
        if self.renderer.stale_chain_count() > 0 {
            due = due.min(last + render::STALE_CHAIN_DELAY);
        }
        if let Some(retry) = self.retry_at {
            due = due.max(retry);
        }
        Some(due)
    }

    async fn apply(&self, script: String, full: bool) -> Result<(), NftError> {
        let nft = self.config.nft.clone();
        let apply = move || {
            if full {
                nft.apply(&script)
            } else {
                nft.apply_partial(&script).map(|_| ())
            }
        };
        match tokio::task::spawn_blocking(apply).await {
            Ok(result) => result,
            Err(err) => Err(NftError::Spawn {
                program: "nft".into(),
                source: std::io::Error::other(err),
            }),
        }
    }

    async fn sync(&mut self) {
        let start = Instant::now();
        self.last_sync = Some(start);
        if self
            .last_full_sync
            .is_some_and(|t| start >= t + self.config.full_sync_period)
        {
            self.renderer.invalidate();
        }
        let changed = std::mem::take(&mut self.pending);
        let transaction = self.renderer.sync(&self.state, &changed, start);
        if !transaction.script.is_empty()
            && let Err(err) = self.apply(transaction.script, transaction.full).await
        {
            tracing::error!(%err, "nftables sync failed");
            self.metrics.sync_failed();
            self.renderer.invalidate();
            self.retry_at = Some(Instant::now() + self.config.sync_period);
            return;
        }
        self.retry_at = None;
        let elapsed = start.elapsed();
        if transaction.full {
            self.last_full_sync = Some(start);
            tracing::info!(
                services = transaction.services,
                ?elapsed,
                "full sync of nftables rules"
            );
        } else if transaction.services > 0 {
            tracing::debug!(
                services = transaction.services,
                ?elapsed,
                "partial sync of nftables rules"
            );
        }
        self.metrics
            .observe_sync(elapsed, transaction.full, SystemTime::now());
        self.health.updated(SystemTime::now());
        self.service_health
            .sync(self.state.health_check_services())
            .await;
    }
}

/// Runs the proxier until a watch ends for good.
pub async fn run(
    client: kube::Client,
    config: ProxierConfig,
    health: Arc<ProxyHealth>,
    metrics: Arc<Metrics>,
) -> anyhow::Result<()> {
    let bridge_needed = match config.bridge_masquerade {
        BridgeMasquerade::Always => true,
        BridgeMasquerade::Never => false,
        BridgeMasquerade::Auto => !bridge_netfilter_active(),
    };
    if bridge_needed {
        tracing::info!(
            "bridged pod traffic bypasses netfilter: masquerading pod traffic to same-node endpoints"
        );
    }
    let mut proxier = Proxier {
        renderer: Renderer::new(config.render.clone()),
        state: ProxyState::new(&config.hostname),
        service_health: ServiceHealthServer::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), health.clone()),
        config,
        bridge_needed,
        node: NodeInfo::default(),
        pending: BTreeSet::new(),
        services_synced: false,
        slices_synced: false,
        listed_services: BTreeSet::new(),
        listed_slices: BTreeSet::new(),
        dns_listed_slices: BTreeSet::new(),
        last_sync: None,
        last_full_sync: None,
        retry_at: None,
        health,
        metrics,
    };
    let render_config = proxier.render_config();
    proxier.renderer.set_config(render_config);

    let services: BoxStream<'static, Update> = watcher::watcher(
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
    )
    .map(|update| Update::Service(Box::new(update)))
    .boxed();
    let slices: BoxStream<'static, Update> = watcher::watcher(
        Api::<EndpointSlice>::all(client.clone()),
        watcher::Config::default(),
    )
    .map(|update| Update::Slice(Box::new(update)))
    .boxed();
    let nodes: BoxStream<'static, Update> = watcher::watcher(
        Api::<Node>::all(client),
        watcher::Config::default().fields(&format!("metadata.name={}", proxier.config.hostname)),
    )
    .map(|update| Update::Node(Box::new(update)))
    .boxed();
    let mut updates = futures::stream::select_all([services, slices, nodes]);
    loop {
        let due = proxier.next_sync();
        let sleep = async {
            match due {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            update = updates.next() => match update {
                Some(update) => proxier.handle(update),
                None => anyhow::bail!("the watches ended"),
            },
            _ = sleep => proxier.sync().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodeport_addresses_flag() {
        assert_eq!(
            "".parse::<NodePortAddresses>().ok(),
            Some(NodePortAddresses::Primary)
        );
        assert_eq!(
            "primary".parse::<NodePortAddresses>().ok(),
            Some(NodePortAddresses::Primary)
        );
        assert_eq!(
            "0.0.0.0/0".parse::<NodePortAddresses>().ok(),
            Some(NodePortAddresses::All)
        );
        assert_eq!(
            "10.0.0.0/8, 192.168.1.0/24"
                .parse::<NodePortAddresses>()
                .ok(),
            Some(NodePortAddresses::Cidrs(vec![
                "10.0.0.0/8".parse().expect("cidr"),
                "192.168.1.0/24".parse().expect("cidr")
            ]))
        );
        assert!("bogus".parse::<NodePortAddresses>().is_err());
    }

    #[test]
    fn ip_addr_output() {
        let out = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n\
                   2: eth0    inet 10.199.7.2/24 brd 10.199.7.255 scope global eth0\\ valid_lft forever\n";
        assert_eq!(
            parse_ip_addr_output(out),
            vec![Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(10, 199, 7, 2)]
        );
    }

    #[test]
    fn node_facts() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1"},
            "spec": {"podCIDR": "10.244.1.0/24",
                     "taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]},
            "status": {"addresses": [{"type": "Hostname", "address": "n1"},
                                     {"type": "InternalIP", "address": "10.199.7.2"}]}
        }))
        .expect("node");
        assert_eq!(
            node_info(&node),
            NodeInfo {
                ip: Some(Ipv4Addr::new(10, 199, 7, 2)),
                pod_cidr: Some("10.244.1.0/24".parse().expect("cidr")),
            }
        );
        assert!(!node_eligible(&node));
    }
}
