//! The cluster's DNS records as the Kubernetes DNS specification (schema 1.1.0, kubernetes/dns
//! `docs/specification.md`) and CoreDNS's `kubernetes` plugin define them: a sans-IO index of
//! one cluster's Services and EndpointSlices, and the answer to one question. ClusterIP
//! Services get A/AAAA and SRV records and PTRs of their IPs; headless Services the addresses of
//! their ready endpoints, each endpoint by its hostname (or its dashed address), SRV per
//! endpoint, and PTRs of endpoints with a hostname; ExternalName Services a CNAME; pods
//! `a-b-c-d.<ns>.pod.<zone>` (CoreDNS's `pods insecure`). Names that do not exist get NXDOMAIN,
//! names that exist without the asked type NODATA, both with the zone's SOA; names outside the
//! zone (and reverse names of no Service) are for the upstream resolvers.

use std::collections::BTreeMap;
use std::net::IpAddr;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::rdata::{A, AAAA, CNAME, PTR, SOA, SRV, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// CoreDNS's default TTL for the cluster's records (and the SOA's minimum).
pub const TTL: u32 = 5;
/// The DNS specification's schema version, answered at `dns-version.<zone>`.
pub const SCHEMA_VERSION: &str = "1.1.0";
/// The label naming an EndpointSlice's Service.
const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";

/// What a Service resolves to.
#[derive(Debug, Clone, PartialEq)]
enum Target {
    /// Its cluster IPs.
    ClusterIps(Vec<IpAddr>),
    /// Its ready endpoints (`clusterIP: None`).
    Headless,
    /// A CNAME to this name.
    ExternalName(Name),
}

/// A port by name and protocol (`_http._tcp`), with its number.
#[derive(Debug, Clone, PartialEq)]
struct NamedPort {
    name: String,
    protocol: String,
    port: u16,
}

/// One endpoint of a slice.
#[derive(Debug, Clone, PartialEq)]
struct Endpoint {
    addresses: Vec<IpAddr>,
    hostname: Option<String>,
}

/// One EndpointSlice's ready endpoints and its ports.
#[derive(Debug, Clone, PartialEq, Default)]
struct Slice {
    endpoints: Vec<Endpoint>,
    ports: Vec<NamedPort>,
}

/// The answer to one question.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// Answered from the cluster: the response code, the answers and the authority records.
    Cluster {
        /// NOERROR (with answers, or none: NODATA) or NXDOMAIN.
        code: ResponseCode,
        /// The records of the name and type asked.
        answers: Vec<Record>,
        /// The zone's SOA when there are no answers (for negative caching).
        authority: Vec<Record>,
    },
    /// Not the cluster's name: ask the upstream resolvers.
    Upstream,
}

/// One cluster's Services and EndpointSlices, as DNS sees them.
#[derive(Debug, Clone)]
pub struct ClusterDns {
    zone: Name,
    services: BTreeMap<(String, String), (Target, Vec<NamedPort>)>,
    /// Keyed (namespace, service, slice name).
    slices: BTreeMap<(String, String, String), Slice>,
    /// The Services an address reverses to, counted per source (a cluster IP, or a
    /// hostname'd endpoint of a slice): PTR lookups read this rather than every Service.
    by_address: BTreeMap<(IpAddr, String, String), u32>,
}

impl ClusterDns {
    /// An empty index for the zone `domain` (`cluster.local`).
    pub fn new(domain: &str) -> Result<Self, hickory_proto::ProtoError> {
        let mut zone = Name::from_ascii(domain)?.to_lowercase();
        zone.set_fqdn(true);
        Ok(Self {
            zone,
            services: BTreeMap::new(),
            slices: BTreeMap::new(),
            by_address: BTreeMap::new(),
        })
    }

    /// The zone's apex (`cluster.local.`).
    pub fn zone(&self) -> &Name {
        &self.zone
    }

    /// Adds or replaces a Service. Returns whether what DNS answers changed.
    pub fn apply_service(&mut self, service: &Service) -> bool {
        let (Some(namespace), Some(name)) = (&service.metadata.namespace, &service.metadata.name)
        else {
            return false;
        };
        let Some(spec) = &service.spec else {
            return self.delete_service(namespace, name);
        };
        let target = if spec.type_.as_deref() == Some("ExternalName") {
            match spec
                .external_name
                .as_deref()
                .and_then(|n| Name::from_ascii(n).ok())
            {
                Some(mut external) => {
                    external.set_fqdn(true);
                    Target::ExternalName(external)
                }
                None => return self.delete_service(namespace, name),
            }
        } else if spec.cluster_ip.as_deref() == Some("None") {
            Target::Headless
        } else {
            let ips = spec
                .cluster_ips
                .iter()
                .flatten()
                .chain(spec.cluster_ip.iter())
                .filter_map(|ip| ip.parse().ok())
                .fold(Vec::new(), |mut ips: Vec<IpAddr>, ip| {
                    if !ips.contains(&ip) {
                        ips.push(ip);
                    }
                    ips
                });
            Target::ClusterIps(ips)
        };
        let ports = spec
            .ports
            .iter()
            .flatten()
            .filter_map(|p| named_port(p.name.as_ref(), p.protocol.as_ref(), Some(p.port)))
            .collect();
        let entry = (target, ports);
        let key = (namespace.clone(), name.clone());
        if self.services.get(&key) == Some(&entry) {
            return false;
        }
        self.index_addresses(&key, service_addresses(&entry.0), Change::Add);
        if let Some((old, _)) = self.services.insert(key.clone(), entry) {
            self.index_addresses(&key, service_addresses(&old), Change::Remove);
        }
        true
    }

    /// Removes a Service. Returns whether it was there.
    pub fn delete_service(&mut self, namespace: &str, name: &str) -> bool {
        let key = (namespace.to_string(), name.to_string());
        match self.services.remove(&key) {
            Some((old, _)) => {
                self.index_addresses(&key, service_addresses(&old), Change::Remove);
                true
            }
            None => false,
        }
    }

    /// Counts `addresses` for the Service `key` in (or out of) the reverse index.
    fn index_addresses(
        &mut self,
        (namespace, service): &(String, String),
        addresses: impl IntoIterator<Item = IpAddr>,
        change: Change,
    ) {
        for ip in addresses {
            let key = (ip, namespace.clone(), service.clone());
            match change {
                Change::Add => *self.by_address.entry(key).or_default() += 1,
                Change::Remove => {
                    if let Some(count) = self.by_address.get_mut(&key) {
                        *count -= 1;
                        if *count == 0 {
                            self.by_address.remove(&key);
                        }
                    }
                }
            }
        }
    }

    /// Adds or replaces an EndpointSlice (only its ready endpoints are kept). Returns whether
    /// what DNS answers changed.
    pub fn apply_slice(&mut self, slice: &EndpointSlice) -> bool {
        let Some(key) = slice_key(slice) else {
            return false;
        };
        let endpoints = slice
            .endpoints
            .iter()
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
            .map(|e| Endpoint {
                addresses: e.addresses.iter().filter_map(|a| a.parse().ok()).collect(),
                hostname: e.hostname.clone().filter(|h| !h.is_empty()),
            })
            .collect();
        let ports = slice
            .ports
            .iter()
            .flatten()
            .filter_map(|p| named_port(p.name.as_ref(), p.protocol.as_ref(), p.port))
            .collect();
        let entry = Slice { endpoints, ports };
        if self.slices.get(&key) == Some(&entry) {
            return false;
        }
        let service = (key.0.clone(), key.1.clone());
        self.index_addresses(&service, slice_addresses(&entry), Change::Add);
        if let Some(old) = self.slices.insert(key, entry) {
            self.index_addresses(&service, slice_addresses(&old), Change::Remove);
        }
        true
    }

    /// Removes an EndpointSlice. Returns whether it was there.
    pub fn delete_slice(&mut self, slice: &EndpointSlice) -> bool {
        let Some(key) = slice_key(slice) else {
            return false;
        };
        self.remove_slice(&key)
    }

    fn remove_slice(&mut self, key: &(String, String, String)) -> bool {
        match self.slices.remove(key) {
            Some(old) => {
                let service = (key.0.clone(), key.1.clone());
                self.index_addresses(&service, slice_addresses(&old), Change::Remove);
                true
            }
            None => false,
        }
    }

    /// Keeps only the Services in `listed` (after a relist).
    pub fn retain_services(&mut self, listed: &std::collections::BTreeSet<(String, String)>) {
        let gone: Vec<(String, String)> = self
            .services
            .keys()
            .filter(|key| !listed.contains(*key))
            .cloned()
            .collect();
        for (namespace, name) in gone {
            self.delete_service(&namespace, &name);
        }
    }

    /// Keeps only the slices in `listed` (after a relist), keyed (namespace, slice name).
    pub fn retain_slices(&mut self, listed: &std::collections::BTreeSet<(String, String)>) {
        let gone: Vec<(String, String, String)> = self
            .slices
            .keys()
            .filter(|(namespace, _, name)| !listed.contains(&(namespace.clone(), name.clone())))
            .cloned()
            .collect();
        for key in gone {
            self.remove_slice(&key);
        }
    }

    /// How many Services the index holds.
    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    /// The answer to `name` of `kind`.
    pub fn answer(&self, name: &Name, kind: RecordType) -> Answer {
        let mut name = name.to_lowercase();
        name.set_fqdn(true);
        if let Some(answer) = self.reverse(&name, kind) {
            return answer;
        }
        if !self.zone.zone_of(&name) {
            return Answer::Upstream;
        }
        let labels: Vec<String> = name
            .iter()
            .take(usize::from(name.num_labels() - self.zone.num_labels()))
            .map(|l| String::from_utf8_lossy(l).into_owned())
            .collect();
        let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
        let found = match labels.as_slice() {
            [] => match kind {
                RecordType::SOA => Found::Records(vec![self.soa()]),
                _ => Found::Empty,
            },
            ["dns-version"] => match kind {
                RecordType::TXT => Found::Records(vec![Record::from_rdata(
                    name.clone(),
                    TTL,
                    RData::TXT(TXT::new(vec![SCHEMA_VERSION.into()])),
                )]),
                _ => Found::Empty,
            },
            ["svc"] | ["pod"] => Found::Empty,
            [namespace, "svc"] => {
                let first = self
                    .services
                    .range((namespace.to_string(), String::new())..)
                    .next();
                if first.is_some_and(|((ns, _), _)| ns == namespace) {
                    Found::Empty
                } else {
                    Found::Nothing
                }
            }
            [service, namespace, "svc"] => self.service(&name, namespace, service, kind),
            [port, protocol, service, namespace, "svc"]
                if port.starts_with('_') && protocol.starts_with('_') =>
            {
                self.port(&name, namespace, service, &port[1..], &protocol[1..], kind)
            }
            [endpoint, service, namespace, "svc"] => {
                self.endpoint(&name, namespace, service, endpoint, kind)
            }
            [address, _namespace, "pod"] => match dashed_ip(address) {
                Some(ip) => Found::Records(address_records(&name, &[ip], kind)).or_empty(),
                None => Found::Nothing,
            },
            _ => Found::Nothing,
        };
        match found {
            Found::Records(answers) => Answer::Cluster {
                code: ResponseCode::NoError,
                answers,
                authority: Vec::new(),
            },
            Found::Empty => Answer::Cluster {
                code: ResponseCode::NoError,
                answers: Vec::new(),
                authority: vec![self.soa()],
            },
            Found::Nothing => Answer::Cluster {
                code: ResponseCode::NXDomain,
                answers: Vec::new(),
                authority: vec![self.soa()],
            },
        }
    }

    /// `<service>.<ns>.svc.<zone>`.
    fn service(&self, name: &Name, namespace: &str, service: &str, kind: RecordType) -> Found {
        let Some((target, ports)) = self.services.get(&(namespace.into(), service.into())) else {
            return Found::Nothing;
        };
        match target {
            Target::ExternalName(external) => Found::Records(vec![Record::from_rdata(
                name.clone(),
                TTL,
                RData::CNAME(CNAME(external.clone())),
            )]),
            Target::ClusterIps(_) if kind == RecordType::SRV => Found::Records(
                ports
                    .iter()
                    .map(|p| srv(name, 100, p.port, name.clone()))
                    .collect(),
            )
            .or_empty(),
            Target::ClusterIps(ips) => Found::Records(address_records(name, ips, kind)).or_empty(),
            Target::Headless if kind == RecordType::SRV => {
                let targets = self.endpoint_targets(namespace, service, None);
                let weight = srv_weight(targets.len());
                Found::Records(
                    targets
                        .into_iter()
                        .map(|(target, port)| srv(name, weight, port, target))
                        .collect(),
                )
                .or_empty()
            }
            Target::Headless => {
                let mut ips = Vec::new();
                for endpoint in self.ready_endpoints(namespace, service) {
                    for ip in &endpoint.addresses {
                        if !ips.contains(ip) {
                            ips.push(*ip);
                        }
                    }
                }
                Found::Records(address_records(name, &ips, kind)).or_empty()
            }
        }
    }

    /// `_<port>._<protocol>.<service>.<ns>.svc.<zone>`.
    fn port(
        &self,
        name: &Name,
        namespace: &str,
        service: &str,
        port: &str,
        protocol: &str,
        kind: RecordType,
    ) -> Found {
        let Some((target, ports)) = self.services.get(&(namespace.into(), service.into())) else {
            return Found::Nothing;
        };
        let matches = |p: &NamedPort| p.name == port && p.protocol.eq_ignore_ascii_case(protocol);
        let records: Vec<Record> = match target {
            Target::ExternalName(_) => return Found::Nothing,
            Target::ClusterIps(_) => {
                let service_name = name.base_name().base_name();
                ports
                    .iter()
                    .filter(|p| matches(p))
                    .map(|p| srv(name, 100, p.port, service_name.clone()))
                    .collect()
            }
            Target::Headless => {
                let targets = self.endpoint_targets(namespace, service, Some(&matches));
                let weight = srv_weight(targets.len());
                targets
                    .into_iter()
                    .map(|(target, port)| srv(name, weight, port, target))
                    .collect()
            }
        };
        if records.is_empty() {
            Found::Nothing
        } else if kind == RecordType::SRV {
            Found::Records(records)
        } else {
            Found::Empty
        }
    }

    /// `<hostname or dashed address>.<service>.<ns>.svc.<zone>` of a headless Service.
    fn endpoint(
        &self,
        name: &Name,
        namespace: &str,
        service: &str,
        endpoint: &str,
        kind: RecordType,
    ) -> Found {
        match self.services.get(&(namespace.into(), service.into())) {
            Some((Target::Headless, _)) => {}
            _ => return Found::Nothing,
        }
        let mut ips = Vec::new();
        for candidate in self.ready_endpoints(namespace, service) {
            for ip in &candidate.addresses {
                if endpoint_label(candidate, ip) == endpoint && !ips.contains(ip) {
                    ips.push(*ip);
                }
            }
        }
        if ips.is_empty() {
            return Found::Nothing;
        }
        Found::Records(address_records(name, &ips, kind)).or_empty()
    }

    /// PTR records of an address in `in-addr.arpa` / `ip6.arpa`; `None` when `name` is not a
    /// reverse name.
    fn reverse(&self, name: &Name, kind: RecordType) -> Option<Answer> {
        let ip = reverse_ip(name)?;
        let mut targets = Vec::new();
        // The Services the address may belong to, in the index's (namespace, name) order.
        let candidates = self
            .by_address
            .range((ip, String::new(), String::new())..)
            .take_while(|((candidate, _, _), _)| *candidate == ip)
            .filter_map(|((_, namespace, service), _)| {
                let key = (namespace.clone(), service.clone());
                let (target, _) = self.services.get(&key)?;
                Some((key, target))
            });
        for ((namespace, service), target) in candidates {
            let (namespace, service) = (namespace.as_str(), service.as_str());
            match target {
                Target::ClusterIps(ips) if ips.contains(&ip) => {
                    targets.push(self.service_name(namespace, service));
                }
                Target::Headless => {
                    for endpoint in self.ready_endpoints(namespace, service) {
                        if endpoint.hostname.is_some() && endpoint.addresses.contains(&ip) {
                            let label = endpoint_label(endpoint, &ip);
                            if let Ok(target) = Name::from_ascii(&label).and_then(|l| {
                                l.append_domain(&self.service_name(namespace, service))
                            }) {
                                targets.push(target);
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        // An address of no Service is someone else's (CoreDNS's `fallthrough`).
        if targets.is_empty() {
            return Some(Answer::Upstream);
        }
        let answers = if kind == RecordType::PTR {
            targets
                .into_iter()
                .map(|target| Record::from_rdata(name.clone(), TTL, RData::PTR(PTR(target))))
                .collect()
        } else {
            Vec::new()
        };
        let authority = if answers.is_empty() {
            vec![self.soa()]
        } else {
            Vec::new()
        };
        Some(Answer::Cluster {
            code: ResponseCode::NoError,
            answers,
            authority,
        })
    }

    /// `<service>.<ns>.svc.<zone>.`
    fn service_name(&self, namespace: &str, service: &str) -> Name {
        Name::from_ascii(format!("{service}.{namespace}.svc"))
            .and_then(|n| n.append_domain(&self.zone))
            .unwrap_or_else(|_| self.zone.clone())
    }

    /// A Service's slices (a range of the index: slices are keyed by their Service).
    fn slices_of<'a>(
        &'a self,
        namespace: &'a str,
        service: &'a str,
    ) -> impl Iterator<Item = &'a Slice> + 'a {
        self.slices
            .range((namespace.to_string(), service.to_string(), String::new())..)
            .take_while(move |((ns, svc, _), _)| ns == namespace && svc == service)
            .map(|(_, slice)| slice)
    }

    /// The ready endpoints of a Service, from all its slices.
    fn ready_endpoints<'a>(
        &'a self,
        namespace: &'a str,
        service: &'a str,
    ) -> impl Iterator<Item = &'a Endpoint> + 'a {
        self.slices_of(namespace, service)
            .flat_map(|slice| slice.endpoints.iter())
    }

    /// Each ready endpoint's name and port number, for the slices' ports that `port` accepts
    /// (all when `None`).
    fn endpoint_targets(
        &self,
        namespace: &str,
        service: &str,
        port: Option<&dyn Fn(&NamedPort) -> bool>,
    ) -> Vec<(Name, u16)> {
        let service_name = self.service_name(namespace, service);
        let mut targets = Vec::new();
        for slice in self.slices_of(namespace, service) {
            for named in slice.ports.iter().filter(|p| port.is_none_or(|f| f(p))) {
                for endpoint in &slice.endpoints {
                    for ip in &endpoint.addresses {
                        let label = endpoint_label(endpoint, ip);
                        if let Ok(target) =
                            Name::from_ascii(&label).and_then(|l| l.append_domain(&service_name))
                            && !targets.contains(&(target.clone(), named.port))
                        {
                            targets.push((target, named.port));
                        }
                    }
                }
            }
        }
        targets
    }

    /// The zone's SOA (CoreDNS's: `ns.dns.<zone>`, `hostmaster.<zone>`, its timers).
    fn soa(&self) -> Record {
        let under = |label: &str| {
            Name::from_ascii(label)
                .and_then(|n| n.append_domain(&self.zone))
                .unwrap_or_else(|_| self.zone.clone())
        };
        Record::from_rdata(
            self.zone.clone(),
            TTL,
            RData::SOA(SOA::new(
                under("ns.dns"),
                under("hostmaster"),
                1,
                7200,
                1800,
                86400,
                TTL,
            )),
        )
    }
}

/// Whether addresses enter or leave the reverse index.
#[derive(Clone, Copy)]
enum Change {
    Add,
    Remove,
}

/// The addresses a Service reverses from itself: its cluster IPs.
fn service_addresses(target: &Target) -> Vec<IpAddr> {
    match target {
        Target::ClusterIps(ips) => ips.clone(),
        Target::Headless | Target::ExternalName(_) => Vec::new(),
    }
}

/// The addresses a slice's endpoints reverse from (those with a hostname).
fn slice_addresses(slice: &Slice) -> Vec<IpAddr> {
    slice
        .endpoints
        .iter()
        .filter(|endpoint| endpoint.hostname.is_some())
        .flat_map(|endpoint| endpoint.addresses.iter().copied())
        .collect()
}

/// What a name holds.
enum Found {
    Records(Vec<Record>),
    /// The name exists, without records of the asked type (NODATA).
    Empty,
    /// The name does not exist (NXDOMAIN).
    Nothing,
}

impl Found {
    fn or_empty(self) -> Found {
        match self {
            Found::Records(records) if records.is_empty() => Found::Empty,
            other => other,
        }
    }
}

/// A port SRV can name: one with a name (the protocol defaulting to TCP).
fn named_port(
    name: Option<&String>,
    protocol: Option<&String>,
    port: Option<i32>,
) -> Option<NamedPort> {
    Some(NamedPort {
        name: name.filter(|n| !n.is_empty())?.clone(),
        protocol: protocol.cloned().unwrap_or_else(|| "TCP".into()),
        port: u16::try_from(port?).ok()?,
    })
}

fn slice_key(slice: &EndpointSlice) -> Option<(String, String, String)> {
    let namespace = slice.metadata.namespace.clone()?;
    let name = slice.metadata.name.clone()?;
    let service = slice
        .metadata
        .labels
        .as_ref()?
        .get(LABEL_SERVICE_NAME)?
        .clone();
    Some((namespace, service, name))
}

/// An endpoint's name under its Service: its hostname, or its address with dashes.
fn endpoint_label(endpoint: &Endpoint, ip: &IpAddr) -> String {
    match &endpoint.hostname {
        Some(hostname) => hostname.to_lowercase(),
        None => dashed(ip),
    }
}

/// `10.0.0.1` → `10-0-0-1`; IPv6 with every `:` a `-`.
fn dashed(ip: &IpAddr) -> String {
    ip.to_string().replace(['.', ':'], "-")
}

/// `10-0-0-1` → `10.0.0.1`.
fn dashed_ip(label: &str) -> Option<IpAddr> {
    let dotted = label.replace('-', ".");
    if let Ok(ip) = dotted.parse::<std::net::Ipv4Addr>() {
        return Some(IpAddr::V4(ip));
    }
    label.replace('-', ":").parse().ok()
}

/// The A (or AAAA) records of `ips` for a question of `kind`.
fn address_records(name: &Name, ips: &[IpAddr], kind: RecordType) -> Vec<Record> {
    ips.iter()
        .filter_map(|ip| match (ip, kind) {
            (IpAddr::V4(v4), RecordType::A) => Some(RData::A(A(*v4))),
            (IpAddr::V6(v6), RecordType::AAAA) => Some(RData::AAAA(AAAA(*v6))),
            _ => None,
        })
        .map(|data| Record::from_rdata(name.clone(), TTL, data))
        .collect()
}

fn srv(name: &Name, weight: u16, port: u16, target: Name) -> Record {
    Record::from_rdata(
        name.clone(),
        TTL,
        RData::SRV(SRV::new(0, weight, port, target)),
    )
}

/// CoreDNS spreads a weight of 100 over a name's SRV targets.
fn srv_weight(targets: usize) -> u16 {
    u16::try_from(100 / targets.max(1)).unwrap_or(100)
}

/// The address of a reverse name (`4.3.2.1.in-addr.arpa.`, nibbles under `ip6.arpa.`).
fn reverse_ip(name: &Name) -> Option<IpAddr> {
    let labels: Vec<String> = name
        .iter()
        .map(|l| String::from_utf8_lossy(l).to_lowercase())
        .collect();
    match labels.as_slice() {
        [d, c, b, a, in_addr, arpa] if in_addr == "in-addr" && arpa == "arpa" => {
            format!("{a}.{b}.{c}.{d}").parse().ok()
        }
        [nibbles @ .., ip6, arpa] if ip6 == "ip6" && arpa == "arpa" && nibbles.len() == 32 => {
            let hex: String = nibbles.iter().rev().map(String::as_str).collect();
            let groups: Vec<&str> = (0..8).map(|i| &hex[i * 4..i * 4 + 4]).collect();
            groups.join(":").parse().ok()
        }
        _ => None,
    }
}

#[cfg(test)]
#[path = "records_tests.rs"]
mod tests;
