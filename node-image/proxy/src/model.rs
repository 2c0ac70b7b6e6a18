//! The proxy's sans-IO model: Services and EndpointSlices reduced to `ServicePort`s and their
//! `Endpoint`s (upstream `pkg/proxy`'s `ServicePortMap` / `EndpointsMap`), the set of services
//! changed since the last sync, and upstream's `CategorizeEndpoints`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// Services (and their slices) with this label belong to another proxy (upstream skips them).
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// EndpointSlices of headless Services carry this label; they are never proxied.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// The label naming an EndpointSlice's Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Upstream's default ClientIP affinity timeout (`DefaultClientIPServiceAffinitySeconds`).
pub const DEFAULT_AFFINITY_SECONDS: u32 = 10800;

/// Errors of the model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A CIDR that does not parse.
    #[error("invalid IPv4 CIDR {0:?}")]
    InvalidCidr(String),
}

/// A namespace and name (upstream `types.NamespacedName`); displays as `ns/name`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamespacedName {
    /// The namespace.
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl NamespacedName {
    /// Builds one.
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }
}

impl fmt::Display for NamespacedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A Service port's L4 protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// TCP (the default).
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// Parses the API's `TCP`/`UDP`/`SCTP` (absent means TCP); unknown protocols are `None`.
    pub fn from_api(value: Option<&str>) -> Option<Self> {
        match value.unwrap_or("TCP") {
            "TCP" => Some(Self::Tcp),
            "UDP" => Some(Self::Udp),
            "SCTP" => Some(Self::Sctp),
            _ => None,
        }
    }

    /// The lower-case name nft and the chain names use.
    pub fn lower(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
            Self::Sctp => "sctp",
        }
    }
}

/// One port of one Service (upstream `proxy.ServicePortName`: the protocol is part of the
/// identity). Displays as upstream's `ns/name:port` (`ns/name` for an unnamed port).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortName {
    /// The Service.
    pub service: NamespacedName,
    /// The port's name (may be empty).
    pub port: String,
    /// The protocol.
    pub protocol: Protocol,
}

impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port.is_empty() {
            write!(f, "{}", self.service)
        } else {
            write!(f, "{}:{}", self.service, self.port)
        }
    }
}

/// An IPv4 CIDR (`10.244.0.0/16`); the address is kept as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cidr {
    /// The address.
    pub addr: Ipv4Addr,
    /// The prefix length (0–32).
    pub prefix: u8,
}

impl Cidr {
    /// Whether `ip` lies inside.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        if self.prefix == 0 {
            return true;
        }
        let mask = u32::MAX << (32 - u32::from(self.prefix));
        (u32::from(self.addr) & mask) == (u32::from(ip) & mask)
    }
}

impl FromStr for Cidr {
    type Err = ModelError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let invalid = || ModelError::InvalidCidr(value.to_string());
        let (addr, prefix) = match value.split_once('/') {
            Some((addr, prefix)) => (addr, prefix.parse::<u8>().map_err(|_| invalid())?),
            None => (value, 32),
        };
        let addr = addr.parse::<Ipv4Addr>().map_err(|_| invalid())?;
        if prefix > 32 {
            return Err(invalid());
        }
        Ok(Self { addr, prefix })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// What the proxy needs of one Service port (upstream `BaseServicePortInfo`, IPv4 only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    /// Its name.
    pub name: ServicePortName,
    /// The ClusterIP.
    pub cluster_ip: Ipv4Addr,
    /// The Service port.
    pub port: u16,
    /// The NodePort (0: none).
    pub node_port: u16,
    /// `spec.externalIPs` (IPv4 ones).
    pub external_ips: Vec<Ipv4Addr>,
    /// `status.loadBalancer.ingress[].ip` of a LoadBalancer Service (not `ipMode: Proxy`).
    pub load_balancer_vips: Vec<Ipv4Addr>,
    /// `spec.loadBalancerSourceRanges`.
    pub load_balancer_source_ranges: Vec<Cidr>,
    /// ClientIP affinity timeout in seconds (`None`: no affinity).
    pub sticky_max_age_seconds: Option<u32>,
    /// `externalTrafficPolicy: Local` on an externally reachable Service.
    pub external_policy_local: bool,
    /// `internalTrafficPolicy: Local`.
    pub internal_policy_local: bool,
    /// `spec.healthCheckNodePort` (0: none).
    pub health_check_node_port: u16,
}

impl ServicePort {
    /// Reachable from outside through a NodePort, an external IP or a load balancer IP.
    pub fn externally_accessible(&self) -> bool {
        self.node_port != 0 || !self.load_balancer_vips.is_empty() || !self.external_ips.is_empty()
    }

    /// Uses endpoints on any node: internal policy Cluster, or any external access (even with
    /// `externalTrafficPolicy: Local`, pods' traffic is short-circuited to all endpoints).
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_policy_local || self.externally_accessible()
    }

    /// Uses this node's endpoints separately.
    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_policy_local || (self.external_policy_local && self.externally_accessible())
    }
}

/// One endpoint of one Service port (upstream `BaseEndpointInfo`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Endpoint {
    /// The endpoint's IP.
    pub ip: Ipv4Addr,
    /// The target port.
    pub port: u16,
    /// `conditions.ready` (absent: true).
    pub ready: bool,
    /// `conditions.serving` (absent: as ready).
    pub serving: bool,
    /// `conditions.terminating` (absent: false).
    pub terminating: bool,
    /// `nodeName`.
    pub node_name: Option<String>,
    /// `zone` (kept for topology-aware routing; not used for routing yet).
    pub zone: Option<String>,
    /// On this proxy's node.
    pub is_local: bool,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.ip, self.port)
    }
}

/// The ports of one Service; empty when the proxy does not handle it (headless, ExternalName,
/// no IPv4 ClusterIP, another proxy's Service) — upstream's `ShouldSkipService`.
pub fn service_ports(service: &Service) -> Vec<ServicePort> {
    let namespace = service.metadata.namespace.clone().unwrap_or_default();
    let name = service.metadata.name.clone().unwrap_or_default();
    let labels = service.metadata.labels.clone().unwrap_or_default();
    let Some(spec) = &service.spec else {
        return Vec::new();
    };
    if labels.contains_key(LABEL_SERVICE_PROXY_NAME)
        || spec.type_.as_deref() == Some("ExternalName")
    {
        return Vec::new();
    }
    let mut cluster_ips: Vec<&str> = spec
        .cluster_ips
        .iter()
        .flatten()
        .map(String::as_str)
        .collect();
    if cluster_ips.is_empty()
        && let Some(ip) = spec.cluster_ip.as_deref()
    {
        cluster_ips.push(ip);
    }
    let Some(cluster_ip) = cluster_ips
        .iter()
        .find_map(|ip| ip.parse::<Ipv4Addr>().ok())
    else {
        return Vec::new();
    };
    let type_ = spec.type_.as_deref().unwrap_or("ClusterIP");
    let external_ips: Vec<Ipv4Addr> = spec
        .external_ips
        .iter()
        .flatten()
        .filter_map(|ip| ip.parse().ok())
        .collect();
    let load_balancer_vips: Vec<Ipv4Addr> = if type_ == "LoadBalancer" {
        service
            .status
            .as_ref()
            .and_then(|status| status.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .into_iter()
            .flatten()
            .filter(|ingress| ingress.ip_mode.as_deref() != Some("Proxy"))
            .filter_map(|ingress| ingress.ip.as_deref()?.parse().ok())
            .collect()
    } else {
        Vec::new()
    };
    let load_balancer_source_ranges: Vec<Cidr> = spec
        .load_balancer_source_ranges
        .iter()
        .flatten()
        .filter_map(|range| range.trim().parse().ok())
        .collect();
    let sticky_max_age_seconds =
        (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
            spec.session_affinity_config
                .as_ref()
                .and_then(|config| config.client_ip.as_ref())
                .and_then(|client_ip| client_ip.timeout_seconds)
                .and_then(|seconds| u32::try_from(seconds).ok())
                .unwrap_or(DEFAULT_AFFINITY_SECONDS)
        });
    let internal_policy_local = spec.internal_traffic_policy.as_deref() == Some("Local");
    let etp_local = spec.external_traffic_policy.as_deref() == Some("Local");
    let node_ports_allowed = matches!(type_, "NodePort" | "LoadBalancer");
    let health_check_node_port = if type_ == "LoadBalancer" && etp_local {
        spec.health_check_node_port
            .and_then(|port| u16::try_from(port).ok())
            .unwrap_or(0)
    } else {
        0
    };
    let service_name = NamespacedName { namespace, name };
    spec.ports
        .iter()
        .flatten()
        .filter_map(|port| {
            let protocol = Protocol::from_api(port.protocol.as_deref())?;
            let node_port = if node_ports_allowed {
                port.node_port
                    .and_then(|p| u16::try_from(p).ok())
                    .unwrap_or(0)
            } else {
                0
            };
            let mut service_port = ServicePort {
                name: ServicePortName {
                    service: service_name.clone(),
                    port: port.name.clone().unwrap_or_default(),
                    protocol,
                },
                cluster_ip,
                port: u16::try_from(port.port).ok()?,
                node_port,
                external_ips: external_ips.clone(),
                load_balancer_vips: load_balancer_vips.clone(),
                load_balancer_source_ranges: load_balancer_source_ranges.clone(),
                sticky_max_age_seconds,
                external_policy_local: false,
                internal_policy_local,
                health_check_node_port,
            };
            // Upstream: the external policy only matters when something external reaches it.
            service_port.external_policy_local = etp_local && service_port.externally_accessible();
            Some(service_port)
        })
        .collect()
}

/// One port of an EndpointSlice with the endpoints' target port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SlicePort {
    name: String,
    protocol: Protocol,
    port: u16,
}

/// An endpoint address of a slice before it is paired with a port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SliceEndpoint {
    ip: Ipv4Addr,
    ready: bool,
    serving: bool,
    terminating: bool,
    node_name: Option<String>,
    zone: Option<String>,
}

/// What the proxy keeps of one EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct SliceInfo {
    ports: Vec<SlicePort>,
    endpoints: Vec<SliceEndpoint>,
}

/// The Service an EndpointSlice belongs to and what the proxy keeps of it; `None` for slices
/// the proxy ignores (not IPv4, no service-name label, headless, another proxy's).
fn slice_info(slice: &EndpointSlice) -> Option<(NamespacedName, String, SliceInfo)> {
    let labels = slice.metadata.labels.as_ref()?;
    if labels.contains_key(LABEL_HEADLESS) || labels.contains_key(LABEL_SERVICE_PROXY_NAME) {
        return None;
    }
    let service = labels.get(LABEL_SERVICE_NAME)?;
    let namespace = slice.metadata.namespace.as_deref().unwrap_or_default();
    let name = slice.metadata.name.clone()?;
    if slice.address_type != "IPv4" {
        return None;
    }
    let ports = slice
        .ports
        .iter()
        .flatten()
        .filter_map(|port| {
            Some(SlicePort {
                name: port.name.clone().unwrap_or_default(),
                protocol: Protocol::from_api(port.protocol.as_deref())?,
                port: u16::try_from(port.port?).ok()?,
            })
        })
        .collect();
    let endpoints = slice
        .endpoints
        .iter()
        .filter_map(|endpoint| {
            // Upstream uses only the first address of an endpoint.
            let ip = endpoint.addresses.first()?.parse().ok()?;
            let conditions = endpoint.conditions.as_ref();
            let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
            Some(SliceEndpoint {
                ip,
                ready,
                serving: conditions.and_then(|c| c.serving).unwrap_or(ready),
                terminating: conditions.and_then(|c| c.terminating).unwrap_or(false),
                node_name: endpoint.node_name.clone(),
                zone: endpoint.zone.clone(),
            })
        })
        .collect();
    Some((
        NamespacedName::new(namespace, service),
        name,
        SliceInfo { ports, endpoints },
    ))
}

/// Every Service and EndpointSlice the proxy handles, and which Services changed since the
/// last sync (upstream's change trackers, reduced to the set of touched Services).
#[derive(Debug, Default, Clone)]
pub struct ProxyState {
    hostname: String,
    services: BTreeMap<NamespacedName, Vec<ServicePort>>,
    slices: BTreeMap<NamespacedName, BTreeMap<String, SliceInfo>>,
    changed: BTreeSet<NamespacedName>,
}

impl ProxyState {
    /// An empty state for the proxy on node `hostname` (endpoints there are local).
    pub fn new(hostname: &str) -> Self {
        Self {
            hostname: hostname.to_string(),
            ..Self::default()
        }
    }

    /// Records a Service (added or changed); true when what the proxy renders changed.
    pub fn apply_service(&mut self, service: &Service) -> bool {
        let key = NamespacedName::new(
            service.metadata.namespace.as_deref().unwrap_or_default(),
            service.metadata.name.as_deref().unwrap_or_default(),
        );
        let ports = service_ports(service);
        self.set_service(key, ports)
    }

    /// Records a Service's ports directly (tests and benchmarks build states this way).
    pub fn set_service(&mut self, key: NamespacedName, ports: Vec<ServicePort>) -> bool {
        let changed = if ports.is_empty() {
            self.services.remove(&key).is_some()
        } else if self.services.get(&key) != Some(&ports) {
            self.services.insert(key.clone(), ports);
            true
        } else {
            false
        };
        if changed {
            self.changed.insert(key);
        }
        changed
    }

    /// Forgets a Service.
    pub fn delete_service(&mut self, namespace: &str, name: &str) -> bool {
        self.set_service(NamespacedName::new(namespace, name), Vec::new())
    }

    /// Records an EndpointSlice (added or changed).
    pub fn apply_slice(&mut self, slice: &EndpointSlice) -> bool {
        match slice_info(slice) {
            Some((service, name, info)) => {
                let slices = self.slices.entry(service.clone()).or_default();
                if slices.get(&name) == Some(&info) {
                    return false;
                }
                slices.insert(name, info);
                self.changed.insert(service);
                true
            }
            // A slice that turned into one we ignore is dropped like a deleted one.
            None => self.delete_slice(slice),
        }
    }

    /// Forgets an EndpointSlice.
    pub fn delete_slice(&mut self, slice: &EndpointSlice) -> bool {
        let Some(name) = slice.metadata.name.as_deref() else {
            return false;
        };
        let namespace = slice.metadata.namespace.as_deref().unwrap_or_default();
        let Some(service) = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(LABEL_SERVICE_NAME))
        else {
            return false;
        };
        let key = NamespacedName::new(namespace, service);
        let Some(slices) = self.slices.get_mut(&key) else {
            return false;
        };
        if slices.remove(name).is_none() {
            return false;
        }
        if slices.is_empty() {
            self.slices.remove(&key);
        }
        self.changed.insert(key);
        true
    }

    /// Sets one Service port's endpoints directly, as one slice named after the port
    /// (tests and benchmarks).
    pub fn set_endpoints(
        &mut self,
        port: &ServicePortName,
        target_port: u16,
        endpoints: &[Endpoint],
    ) {
        let info = SliceInfo {
            ports: vec![SlicePort {
                name: port.port.clone(),
                protocol: port.protocol,
                port: target_port,
            }],
            endpoints: endpoints
                .iter()
                .map(|endpoint| SliceEndpoint {
                    ip: endpoint.ip,
                    ready: endpoint.ready,
                    serving: endpoint.serving,
                    terminating: endpoint.terminating,
                    node_name: endpoint.node_name.clone(),
                    zone: endpoint.zone.clone(),
                })
                .collect(),
        };
        let slices = self.slices.entry(port.service.clone()).or_default();
        let slice_name = format!("{}-{}", port.port, port.protocol.lower());
        if info.endpoints.is_empty() {
            slices.remove(&slice_name);
        } else {
            slices.insert(slice_name, info);
        }
        self.changed.insert(port.service.clone());
    }

    /// After a relist: forgets the Services not listed.
    pub fn retain_services(&mut self, listed: &BTreeSet<NamespacedName>) {
        let gone: Vec<NamespacedName> = self
            .services
            .keys()
            .filter(|key| !listed.contains(*key))
            .cloned()
            .collect();
        for key in gone {
            self.services.remove(&key);
            self.changed.insert(key);
        }
    }

    /// The key a relist tracks a slice by: its Service and its name.
    pub fn slice_key(slice: &EndpointSlice) -> Option<(NamespacedName, String)> {
        let service = slice.metadata.labels.as_ref()?.get(LABEL_SERVICE_NAME)?;
        Some((
            NamespacedName::new(
                slice.metadata.namespace.as_deref().unwrap_or_default(),
                service,
            ),
            slice.metadata.name.clone()?,
        ))
    }

    /// After a relist: forgets the slices not listed.
    pub fn retain_slices(&mut self, listed: &BTreeSet<(NamespacedName, String)>) {
        for (service, slices) in self.slices.iter_mut() {
            let before = slices.len();
            slices.retain(|name, _| listed.contains(&(service.clone(), name.clone())));
            if slices.len() != before {
                self.changed.insert(service.clone());
            }
        }
        self.slices.retain(|_, slices| !slices.is_empty());
    }

    /// The Services changed since the last call.
    pub fn take_changed(&mut self) -> BTreeSet<NamespacedName> {
        std::mem::take(&mut self.changed)
    }

    /// Every Service the proxy handles.
    pub fn services(&self) -> &BTreeMap<NamespacedName, Vec<ServicePort>> {
        &self.services
    }

    /// One Service's ports (empty when unknown or skipped).
    pub fn service(&self, key: &NamespacedName) -> &[ServicePort] {
        self.services.get(key).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The endpoints of one Service port over all its slices, deduplicated by `ip:port` (the
    /// first slice in name order wins) and sorted.
    pub fn endpoints(&self, port: &ServicePortName) -> Vec<Endpoint> {
        let mut endpoints: BTreeMap<(Ipv4Addr, u16), Endpoint> = BTreeMap::new();
        for slice in self
            .slices
            .get(&port.service)
            .into_iter()
            .flat_map(|s| s.values())
        {
            let Some(slice_port) = slice
                .ports
                .iter()
                .find(|p| p.name == port.port && p.protocol == port.protocol)
            else {
                continue;
            };
            for endpoint in &slice.endpoints {
                endpoints
                    .entry((endpoint.ip, slice_port.port))
                    .or_insert_with(|| Endpoint {
                        ip: endpoint.ip,
                        port: slice_port.port,
                        ready: endpoint.ready,
                        serving: endpoint.serving,
                        terminating: endpoint.terminating,
                        is_local: endpoint.node_name.as_deref() == Some(self.hostname.as_str()),
                        node_name: endpoint.node_name.clone(),
                        zone: endpoint.zone.clone(),
                    });
            }
        }
        endpoints.into_values().collect()
    }

    /// Local ready endpoints per Service with a health-check node port (what the service
    /// health server reports; upstream `LocalReadyEndpoints` over `HealthCheckNodePorts`).
    pub fn health_check_services(&self) -> BTreeMap<u16, (NamespacedName, usize)> {
        let mut out = BTreeMap::new();
        for (key, ports) in &self.services {
            let Some(first) = ports.first() else { continue };
            if first.health_check_node_port == 0 {
                continue;
            }
            // Upstream counts distinct local ready endpoints over all the Service's ports.
            let mut local: BTreeSet<Ipv4Addr> = BTreeSet::new();
            for port in ports {
                local.extend(
                    self.endpoints(&port.name)
                        .into_iter()
                        .filter(|e| e.is_local && e.ready)
                        .map(|e| e.ip),
                );
            }
            out.insert(first.health_check_node_port, (key.clone(), local.len()));
        }
        out
    }
}

/// The endpoints one Service port uses (upstream `CategorizeEndpoints`, without topology
/// hints): `cluster` for Cluster policy, `local` for Local policy, `all_reachable` the union,
/// and whether the Service has any usable endpoint anywhere.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Categorized {
    /// Ready endpoints anywhere (or, when none, serving terminating ones).
    pub cluster: Vec<Endpoint>,
    /// This node's ready endpoints (or, when none, its serving terminating ones).
    pub local: Vec<Endpoint>,
    /// Every endpoint a chain is written for.
    pub all_reachable: Vec<Endpoint>,
    /// Any usable endpoint anywhere.
    pub has_any: bool,
}

/// Splits a Service port's endpoints as upstream's `CategorizeEndpoints` does.
pub fn categorize_endpoints(endpoints: &[Endpoint], port: &ServicePort) -> Categorized {
    let mut out = Categorized::default();
    if port.uses_cluster_endpoints() {
        out.cluster = endpoints.iter().filter(|e| e.ready).cloned().collect();
        if out.cluster.is_empty() {
            // No ready endpoint anywhere: fall back to serving terminating ones.
            out.cluster = endpoints
                .iter()
                .filter(|e| e.serving && e.terminating)
                .cloned()
                .collect();
        }
        out.has_any = !out.cluster.is_empty();
    }
    if !port.uses_local_endpoints() {
        out.all_reachable = out.cluster.clone();
        return out;
    }
    let mut local_ready = false;
    let mut local_serving_terminating = false;
    for endpoint in endpoints {
        if endpoint.ready {
            out.has_any = true;
            local_ready |= endpoint.is_local;
        } else if endpoint.serving && endpoint.terminating {
            out.has_any = true;
            local_serving_terminating |= endpoint.is_local;
        }
    }
    if local_ready {
        out.local = endpoints
            .iter()
            .filter(|e| e.is_local && e.ready)
            .cloned()
            .collect();
    } else if local_serving_terminating {
        out.local = endpoints
            .iter()
            .filter(|e| e.is_local && e.serving && e.terminating)
            .cloned()
            .collect();
    }
    if !port.uses_cluster_endpoints() {
        out.all_reachable = out.local.clone();
        return out;
    }
    let mut all: BTreeSet<Endpoint> = out.cluster.iter().cloned().collect();
    all.extend(out.local.iter().cloned());
    out.all_reachable = all.into_iter().collect();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn endpoint(ip: &str, ready: bool, terminating: bool, local: bool) -> Endpoint {
        Endpoint {
            ip: ip.parse().expect("ip"),
            port: 80,
            ready,
            serving: ready || terminating,
            terminating,
            node_name: Some(if local { "node1" } else { "node2" }.to_string()),
            zone: None,
            is_local: local,
        }
    }

    fn port(etp_local: bool, itp_local: bool, node_port: u16) -> ServicePort {
        ServicePort {
            name: ServicePortName {
                service: NamespacedName::new("ns", "svc"),
                port: "p80".into(),
                protocol: Protocol::Tcp,
            },
            cluster_ip: "172.30.0.41".parse().expect("ip"),
            port: 80,
            node_port,
            external_ips: vec![],
            load_balancer_vips: vec![],
            load_balancer_source_ranges: vec![],
            sticky_max_age_seconds: None,
            external_policy_local: etp_local && node_port != 0,
            internal_policy_local: itp_local,
            health_check_node_port: 0,
        }
    }

    fn ips(endpoints: &[Endpoint]) -> Vec<String> {
        endpoints.iter().map(|e| e.ip.to_string()).collect()
    }

    #[test]
    fn categorize_as_upstream() {
        let remote_ready = endpoint("10.0.2.1", true, false, false);
        let local_ready = endpoint("10.0.1.1", true, false, true);
        let local_term = endpoint("10.0.1.2", false, true, true);
        let remote_term = endpoint("10.0.2.2", false, true, false);
        let not_serving = endpoint("10.0.2.3", false, false, false);
        struct Case {
            name: &'static str,
            port: ServicePort,
            endpoints: Vec<Endpoint>,
            cluster: Vec<&'static str>,
            local: Vec<&'static str>,
            has_any: bool,
        }
        let cases = [
            Case {
                name: "cluster policy uses ready endpoints only",
                port: port(false, false, 0),
                endpoints: vec![
                    remote_ready.clone(),
                    local_term.clone(),
                    not_serving.clone(),
                ],
                cluster: vec!["10.0.2.1"],
                local: vec![],
                has_any: true,
            },
            Case {
                name: "terminating fallback when none is ready",
                port: port(false, false, 0),
                endpoints: vec![remote_term.clone(), local_term.clone(), not_serving.clone()],
                cluster: vec!["10.0.2.2", "10.0.1.2"],
                local: vec![],
                has_any: true,
            },
            Case {
                name: "no serving endpoint at all",
                port: port(false, false, 0),
                endpoints: vec![not_serving.clone()],
                cluster: vec![],
                local: vec![],
                has_any: false,
            },
            Case {
                name: "internal Local uses local ready",
                port: port(false, true, 0),
                endpoints: vec![
                    remote_ready.clone(),
                    local_ready.clone(),
                    local_term.clone(),
                ],
                cluster: vec![],
                local: vec!["10.0.1.1"],
                has_any: true,
            },
            Case {
                name: "internal Local without local endpoints still has endpoints",
                port: port(false, true, 0),
                endpoints: vec![remote_ready.clone()],
                cluster: vec![],
                local: vec![],
                has_any: true,
            },
            Case {
                name: "external Local: cluster and local",
                port: port(true, false, 30080),
                endpoints: vec![remote_ready.clone(), local_ready.clone()],
                cluster: vec!["10.0.2.1", "10.0.1.1"],
                local: vec!["10.0.1.1"],
                has_any: true,
            },
            Case {
                name: "external Local falls back to local terminating",
                port: port(true, false, 30080),
                endpoints: vec![remote_ready.clone(), local_term.clone()],
                cluster: vec!["10.0.2.1"],
                local: vec!["10.0.1.2"],
                has_any: true,
            },
        ];
        for case in cases {
            let got = categorize_endpoints(&case.endpoints, &case.port);
            assert_eq!(ips(&got.cluster), case.cluster, "{}: cluster", case.name);
            assert_eq!(ips(&got.local), case.local, "{}: local", case.name);
            assert_eq!(got.has_any, case.has_any, "{}: has_any", case.name);
        }
    }

    #[test]
    fn services_and_slices_from_the_api() {
        let service: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "ns", "name": "web"},
            "spec": {
                "type": "LoadBalancer", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                "externalTrafficPolicy": "Local", "healthCheckNodePort": 32000,
                "sessionAffinity": "ClientIP",
                "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
                "externalIPs": ["192.0.2.7"],
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080},
                          {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053}]
            },
            "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.5"},
                                                    {"ip": "203.0.113.6", "ipMode": "Proxy"}]}}
        }))
        .expect("service");
        let ports = service_ports(&service);
        assert_eq!(ports.len(), 2);
        assert_eq!(ports[0].name.to_string(), "ns/web:http");
        assert_eq!(ports[0].node_port, 30080);
        assert_eq!(ports[0].sticky_max_age_seconds, Some(60));
        assert!(ports[0].external_policy_local);
        assert_eq!(ports[0].health_check_node_port, 32000);
        assert_eq!(
            ports[0].load_balancer_vips,
            vec![Ipv4Addr::new(203, 0, 113, 5)]
        );
        assert_eq!(ports[1].name.protocol, Protocol::Udp);

        let headless: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "ns", "name": "h"},
            "spec": {"clusterIP": "None", "ports": [{"port": 80}]}
        }))
        .expect("service");
        assert!(service_ports(&headless).is_empty());

        let mut state = ProxyState::new("node1");
        assert!(state.apply_service(&service));
        assert!(
            !state.apply_service(&service),
            "an unchanged Service is no change"
        );
        let slice: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "ns", "name": "web-abc",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.244.1.5"], "nodeName": "node1", "zone": "a"},
                {"addresses": ["10.244.2.5"], "nodeName": "node2",
                 "conditions": {"ready": false, "serving": true, "terminating": true}}
            ]
        }))
        .expect("slice");
        assert_eq!(
            state.take_changed().into_iter().collect::<Vec<_>>(),
            vec![NamespacedName::new("ns", "web")]
        );
        assert!(state.apply_slice(&slice));
        let endpoints = state.endpoints(&ports[0].name);
        assert_eq!(endpoints.len(), 2);
        assert!(endpoints[0].is_local && endpoints[0].ready && endpoints[0].port == 8080);
        assert!(!endpoints[1].ready && endpoints[1].serving && endpoints[1].terminating);
        assert!(
            state.endpoints(&ports[1].name).is_empty(),
            "the slice has no dns port"
        );
        assert_eq!(
            state.health_check_services().get(&32000).map(|(_, n)| *n),
            Some(1)
        );
        assert!(state.delete_slice(&slice));
        assert!(state.endpoints(&ports[0].name).is_empty());
    }

    #[test]
    fn cidrs() {
        let cidr: Cidr = "10.244.0.0/16".parse().expect("cidr");
        assert!(cidr.contains("10.244.3.4".parse().expect("ip")));
        assert!(!cidr.contains("10.245.0.1".parse().expect("ip")));
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("nope".parse::<Cidr>().is_err());
        assert_eq!(
            "10.1.2.3".parse::<Cidr>().expect("cidr").to_string(),
            "10.1.2.3/32"
        );
    }
}
