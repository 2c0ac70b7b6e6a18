//! The sans-IO renderer: the model → an `nft -f` script for table `ip kube-proxy`, laid out as
//! upstream kube-proxy's nftables mode (`pkg/proxy/nftables/proxier.go`, KEP-3866).
//!
//! Each Service renders to a [`ServiceRules`] value (its chains, affinity sets and map
//! elements). The [`Renderer`] remembers what it installed per Service, so a partial sync
//! writes only the difference for the changed Services: rewritten chains (`add` + `flush` +
//! rules), added and deleted map elements, new and removed affinity sets. A full sync deletes
//! and rebuilds the table in one transaction. Chains no longer used are flushed at once and
//! deleted by a later transaction (as upstream: kernels before 6.2 notice a map element no
//! longer points at a chain only some time after the commit).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use crate::model::{
    Cidr, Endpoint, NamespacedName, ProxyState, ServicePort, ServicePortName, categorize_endpoints,
};

/// The table (family `ip`).
pub const TABLE: &str = "kube-proxy";
/// The most Service tables a configuration may have ([`Config::service_tables`]); a full sync
/// deletes those of the names up to it that it does not rebuild, so none is left behind.
pub const MAX_SERVICE_TABLES: u16 = 32;
/// The proxy's [`Config::service_tables`] unless told otherwise.
pub const DEFAULT_SERVICE_TABLES: u16 = 8;
/// How long a stale chain is kept (flushed) before it is deleted.
pub const STALE_CHAIN_DELAY: Duration = Duration::from_secs(1);

const SERVICES_CHAIN: &str = "services";
const SERVICE_IPS_MAP: &str = "service-ips";
const SERVICE_NODEPORTS_MAP: &str = "service-nodeports";
const NODEPORT_IPS_SET: &str = "nodeport-ips";
const CLUSTER_IPS_SET: &str = "cluster-ips";
const SERVICE_ENDPOINTS_CHECK_CHAIN: &str = "service-endpoints-check";
const NODEPORT_ENDPOINTS_CHECK_CHAIN: &str = "nodeport-endpoints-check";
const NO_ENDPOINT_SERVICES_MAP: &str = "no-endpoint-services";
const NO_ENDPOINT_NODEPORTS_MAP: &str = "no-endpoint-nodeports";
const REJECT_CHAIN: &str = "reject-chain";
const CLUSTER_IPS_CHECK_CHAIN: &str = "cluster-ips-check";
const FIREWALL_IPS_MAP: &str = "firewall-ips";
const FIREWALL_CHECK_CHAIN: &str = "firewall-check";
const MARK_MASQ_CHAIN: &str = "mark-for-masquerade";
const MASQUERADING_CHAIN: &str = "masquerading";
/// The prefix of a Service's firewall chain (in table `kube-proxy`, however split).
const FIREWALL_PREFIX: &str = "firewall-";
/// The longest comment nft accepts, in bytes (`NFTNL_UDATA_COMMENT_MAXLEN`): a longer one
/// makes nft refuse the whole transaction.
pub const MAX_COMMENT_LENGTH: usize = 128;

/// The renderer's settings (kube-proxy's flags that shape the rules).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `--cluster-cidr`: pods' addresses. Traffic to a ClusterIP from outside it is
    /// masqueraded, and pod traffic to an external destination of an
    /// `externalTrafficPolicy: Local` Service is short-circuited (upstream's local detector).
    /// `None`: no detector, as upstream without `--cluster-cidr`.
    pub cluster_cidr: Option<Cidr>,
    /// `--masquerade-all`: masquerade all traffic to ClusterIPs.
    pub masquerade_all: bool,
    /// `--masquerade-bit` (default 14): the fwmark bit of "masquerade this".
    pub masquerade_bit: u8,
    /// The addresses NodePorts answer on; `None` matches every local address
    /// (`fib daddr type local`, upstream's `--nodeport-addresses 0.0.0.0/0`).
    pub node_port_ips: Option<Vec<Ipv4Addr>>,
    /// `--service-cluster-ip-range`: traffic to unallocated ClusterIPs in it is dropped.
    pub service_cidrs: Vec<Cidr>,
    /// Service addresses this node answers itself (the cluster DNS address, on a local
    /// interface): never rejected or dropped as unallocated ClusterIPs.
    pub node_local_ips: Vec<Ipv4Addr>,
    /// This node's IP (a LoadBalancer source range containing it also admits the VIPs).
    pub node_ip: Option<Ipv4Addr>,
    /// This node's pod CIDR when pods sit on a Linux bridge whose traffic netfilter does not
    /// see (no `br_netfilter`): traffic from it to an endpoint inside it is masqueraded, so
    /// that the endpoint's reply — otherwise bridged straight back, never un-DNATed — goes
    /// through this node's conntrack. `None` when `br_netfilter` is active (as upstream
    /// requires).
    pub bridge_pod_cidr: Option<Cidr>,
    /// How a policy chain picks an endpoint.
    pub load_balancing: LoadBalancing,
    /// How many tables (`kube-proxy-services-NN`, at most [`MAX_SERVICE_TABLES`]) share the
    /// Services' NAT part: dispatch maps, Service and endpoint chains, affinity sets. 0 keeps
    /// it in table `kube-proxy` (upstream's layout). The kernel walks a table's whole jump
    /// graph from both NAT hooks at every commit that adds a rule or a jump: at 10 000
    /// Services that walk alone is ~65 ms in one table; split, a change walks one slice.
    pub service_tables: u16,
}

/// How a Service chain picks one of its endpoints at random.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoadBalancing {
    /// Upstream's `numgen random mod N vmap { 0 : goto …, … }`. Each such rule is an
    /// anonymous verdict map, and the kernel (6.18 here) allocates anonymous set names by
    /// scanning every set of the table: 10 000 Services took 159 s to load, and each later
    /// transaction pays for nft fetching all those sets (373 ms per change at 10 000).
    Vmap,
    /// One rule per endpoint, `numgen random mod (N-i) == 0 goto endpoint-i`, the last one
    /// unconditional: the same uniform choice without any set (the default).
    #[default]
    Cascade,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            cluster_cidr: None,
            masquerade_all: false,
            masquerade_bit: 14,
            node_port_ips: None,
            service_cidrs: Vec::new(),
            node_local_ips: Vec::new(),
            node_ip: None,
            bridge_pod_cidr: None,
            load_balancing: LoadBalancing::default(),
            service_tables: DEFAULT_SERVICE_TABLES,
        }
    }
}

impl Config {
    /// The table of `service`'s NAT part (see [`Config::service_tables`]).
    pub fn service_table(&self, service: &NamespacedName) -> String {
        let count = self.service_tables.min(MAX_SERVICE_TABLES);
        if count == 0 {
            return TABLE.to_string();
        }
        let digest = ring::digest::digest(
            &ring::digest::SHA256,
            format!("{}/{}", service.namespace, service.name).as_bytes(),
        );
        let bytes = digest.as_ref();
        let hash = u16::from_be_bytes([bytes[0], bytes[1]]);
        service_table_name(hash % count)
    }

    fn masquerade_mark(&self) -> String {
        // Upstream formats the mark with %#08x: 0x004000 for bit 14.
        format!("{:#08x}", 1u32 << self.masquerade_bit.min(31))
    }
}

/// One of the table's shared sets and maps that Services put elements into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Container {
    /// `cluster-ips` (set).
    ClusterIps,
    /// `service-ips` (map).
    ServiceIps,
    /// `service-nodeports` (map).
    ServiceNodePorts,
    /// `no-endpoint-services` (map).
    NoEndpointServices,
    /// `no-endpoint-nodeports` (map).
    NoEndpointNodePorts,
    /// `firewall-ips` (map).
    FirewallIps,
}

impl Container {
    /// Its nft name.
    pub fn name(self) -> &'static str {
        match self {
            Self::ClusterIps => CLUSTER_IPS_SET,
            Self::ServiceIps => SERVICE_IPS_MAP,
            Self::ServiceNodePorts => SERVICE_NODEPORTS_MAP,
            Self::NoEndpointServices => NO_ENDPOINT_SERVICES_MAP,
            Self::NoEndpointNodePorts => NO_ENDPOINT_NODEPORTS_MAP,
            Self::FirewallIps => FIREWALL_IPS_MAP,
        }
    }
}

/// A set or map element's value and comment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element {
    /// The map value (a verdict); `None` in a set.
    pub value: Option<String>,
    /// The element comment (upstream writes the service port name on no-endpoint elements).
    pub comment: Option<String>,
}

/// Everything one Service contributes to the table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceRules {
    /// Its regular chains and their rules.
    pub chains: BTreeMap<String, Vec<String>>,
    /// Its ClientIP affinity sets with their timeouts (seconds).
    pub affinity_sets: BTreeMap<String, u32>,
    /// Its elements in the shared sets and maps, by container and key.
    pub elements: BTreeMap<(Container, String), Element>,
}

/// Upstream's `hashAndTruncate`: the first 8 base32 characters of the name's SHA-256, a dash,
/// the name; cut to 240 characters.
pub fn hash_and_truncate(name: &str) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    const BASE_MAX: usize = 256 - 16;
    let digest = ring::digest::digest(&ring::digest::SHA256, name.as_bytes());
    // 8 base32 characters are exactly the first 40 bits.
    let bits = digest.as_ref()[..5]
        .iter()
        .fold(0u64, |acc, byte| (acc << 8) | u64::from(*byte));
    let mut out = String::with_capacity(name.len() + 9);
    for i in (0..8).rev() {
        out.push(ALPHABET[((bits >> (i * 5)) & 31) as usize] as char);
    }
    out.push('-');
    out.push_str(name);
    if out.len() > BASE_MAX {
        out.truncate(BASE_MAX - 3);
        out.push_str("...");
    }
    out
}

/// A map element's comment: the service port name (`ns/name:port`), cut to
/// [`MAX_COMMENT_LENGTH`] bytes as upstream does since kubernetes#139515 (a 63-character
/// namespace and name with a port name make 143).
fn element_comment(name: &ServicePortName) -> String {
    let mut comment = name.to_string();
    let mut end = comment.len().min(MAX_COMMENT_LENGTH);
    while !comment.is_char_boundary(end) {
        end -= 1;
    }
    comment.truncate(end);
    comment
}

/// The name of Service table `index`.
pub fn service_table_name(index: u16) -> String {
    format!("{TABLE}-services-{index:02}")
}

/// Whether `name` is one of the proxy's tables.
pub fn is_proxy_table(name: &str) -> bool {
    name == TABLE
        || name
            .strip_prefix(TABLE)
            .and_then(|rest| rest.strip_prefix("-services-"))
            .and_then(|index| index.parse::<u16>().ok())
            .is_some_and(|index| index < MAX_SERVICE_TABLES && service_table_name(index) == name)
}

/// Every table the proxy may own: `kube-proxy` and each possible Service table.
pub fn all_tables() -> Vec<String> {
    std::iter::once(TABLE.to_string())
        .chain((0..MAX_SERVICE_TABLES).map(service_table_name))
        .collect()
}

/// `HASH-ns/svc/proto/port` (upstream `servicePortChainNameBase`).
fn service_chain_base(name: &ServicePortName) -> String {
    hash_and_truncate(&format!(
        "{}/{}/{}/{}",
        name.service.namespace,
        name.service.name,
        name.protocol.lower(),
        name.port
    ))
}

/// `HASH-ns/svc/proto/port__ip/port` (upstream `servicePortEndpointChainNameBase`).
fn endpoint_chain_base(name: &ServicePortName, endpoint: &Endpoint) -> String {
    hash_and_truncate(&format!(
        "{}/{}/{}/{}__{}/{}",
        name.service.namespace,
        name.service.name,
        name.protocol.lower(),
        name.port,
        endpoint.ip,
        endpoint.port
    ))
}

/// The endpoint chain's name.
pub fn endpoint_chain(name: &ServicePortName, endpoint: &Endpoint) -> String {
    format!("endpoint-{}", endpoint_chain_base(name, endpoint))
}

/// The Cluster-policy chain's name.
pub fn service_chain(name: &ServicePortName) -> String {
    format!("service-{}", service_chain_base(name))
}

/// Renders one Service's ports with their endpoints (the body of upstream's per-service-port
/// loop in `syncProxyRules`).
pub fn render_service(
    config: &Config,
    ports: &[ServicePort],
    endpoints_of: &dyn Fn(&ServicePortName) -> Vec<Endpoint>,
) -> ServiceRules {
    let mut out = ServiceRules::default();
    let mark_masq = MARK_MASQ_CHAIN;
    for svc in ports {
        let protocol = svc.name.protocol.lower();
        let name_string = element_comment(&svc.name);
        let base = service_chain_base(&svc.name);
        let cluster_chain = format!("service-{base}");
        let local_chain = format!("local-{base}");
        let external_chain = format!("external-{base}");
        let firewall_chain = format!("{FIREWALL_PREFIX}{base}");

        let all = endpoints_of(&svc.name);
        let cat = categorize_endpoints(&all, svc);
        let has_endpoints = cat.has_any;

        let uses_cluster_chain = !cat.cluster.is_empty() && svc.uses_cluster_endpoints();
        let uses_local_chain = !cat.local.is_empty() && svc.uses_local_endpoints();

        let (internal_chain, has_internal) = if svc.internal_policy_local {
            (&local_chain, has_endpoints && !cat.local.is_empty())
        } else {
            (&cluster_chain, has_endpoints)
        };
        let (external_policy_chain, has_external) = if svc.external_policy_local {
            (&local_chain, has_endpoints && !cat.local.is_empty())
        } else {
            (&cluster_chain, has_endpoints)
        };
        // Written even without external endpoints: it holds the short-circuit rules.
        let uses_external_chain = has_endpoints && svc.externally_accessible();

        let (internal_verdict, external_verdict) = if !has_endpoints {
            (
                format!("goto {REJECT_CHAIN}"),
                format!("goto {REJECT_CHAIN}"),
            )
        } else {
            ("drop".to_string(), "drop".to_string())
        };

        let key = |ip: Ipv4Addr| format!("{ip} . {protocol} . {}", svc.port);
        let mut add = |container: Container, key: String, value: Option<String>, comment: bool| {
            out.elements.insert(
                (container, key),
                Element {
                    value,
                    comment: comment.then(|| name_string.clone()),
                },
            );
        };

        add(
            Container::ClusterIps,
            svc.cluster_ip.to_string(),
            None,
            false,
        );
        if has_internal {
            add(
                Container::ServiceIps,
                key(svc.cluster_ip),
                Some(format!("goto {internal_chain}")),
                false,
            );
        } else {
            add(
                Container::NoEndpointServices,
                key(svc.cluster_ip),
                Some(internal_verdict.clone()),
                true,
            );
        }
        for ip in &svc.external_ips {
            if has_endpoints {
                add(
                    Container::ServiceIps,
                    key(*ip),
                    Some(format!("goto {external_chain}")),
                    false,
                );
            }
            if !has_external {
                add(
                    Container::NoEndpointServices,
                    key(*ip),
                    Some(external_verdict.clone()),
                    true,
                );
            }
        }
        let uses_firewall =
            !svc.load_balancer_vips.is_empty() && !svc.load_balancer_source_ranges.is_empty();
        for ip in &svc.load_balancer_vips {
            if has_endpoints {
                add(
                    Container::ServiceIps,
                    key(*ip),
                    Some(format!("goto {external_chain}")),
                    false,
                );
            }
            if uses_firewall {
                add(
                    Container::FirewallIps,
                    key(*ip),
                    Some(format!("goto {firewall_chain}")),
                    false,
                );
            }
            if !has_external {
                add(
                    Container::NoEndpointServices,
                    key(*ip),
                    Some(external_verdict.clone()),
                    true,
                );
            }
        }
        if svc.node_port != 0 {
            let node_port_key = format!("{protocol} . {}", svc.node_port);
            if has_endpoints {
                add(
                    Container::ServiceNodePorts,
                    node_port_key.clone(),
                    Some(format!("goto {external_chain}")),
                    false,
                );
            }
            if !has_external {
                add(
                    Container::NoEndpointNodePorts,
                    node_port_key,
                    Some(external_verdict.clone()),
                    true,
                );
            }
        }

        fn chain<'a>(out: &'a mut ServiceRules, name: &str) -> &'a mut Vec<String> {
            out.chains.entry(name.to_string()).or_default()
        }

        // Internal traffic: masquerade what does not come from a pod (it may have been
        // routed here from off-cluster and must return through this node).
        if has_internal {
            let matcher = format!("ip daddr {} {protocol} dport {}", svc.cluster_ip, svc.port);
            if config.masquerade_all {
                chain(&mut out, internal_chain).push(format!("{matcher} jump {mark_masq}"));
            } else if let Some(cidr) = config.cluster_cidr {
                chain(&mut out, internal_chain)
                    .push(format!("{matcher} ip saddr != {cidr} jump {mark_masq}"));
            }
        }

        if uses_external_chain {
            let rules = chain(&mut out, &external_chain);
            if !svc.external_policy_local {
                // Endpoints may be on another node: masquerade so replies come back here.
                rules.push(format!("jump {mark_masq}"));
            } else {
                if let Some(cidr) = config.cluster_cidr {
                    rules.push(format!(
                        "ip saddr {cidr} goto {cluster_chain} comment \"short-circuit pod traffic\""
                    ));
                }
                rules.push(format!(
                    "fib saddr type local jump {mark_masq} comment \"masquerade local traffic\""
                ));
                rules.push(format!(
                    "fib saddr type local goto {cluster_chain} comment \"short-circuit local traffic\""
                ));
            }
            if has_external {
                rules.push(format!("goto {external_policy_chain}"));
            }
        }

        if uses_firewall {
            let mut sources: Vec<String> = svc
                .load_balancer_source_ranges
                .iter()
                .map(Cidr::to_string)
                .collect();
            let allow_from_node = config.node_ip.is_some_and(|ip| {
                svc.load_balancer_source_ranges
                    .iter()
                    .any(|cidr| cidr.contains(ip))
            });
            if allow_from_node {
                sources.extend(svc.load_balancer_vips.iter().map(Ipv4Addr::to_string));
            }
            chain(&mut out, &firewall_chain)
                .push(format!("ip saddr != {{ {} }} drop", sources.join(", ")));
        }

        if let Some(timeout) = svc.sticky_max_age_seconds {
            for endpoint in &cat.all_reachable {
                out.affinity_sets.insert(
                    format!("affinity-{}", endpoint_chain_base(&svc.name, endpoint)),
                    timeout,
                );
            }
        }

        let mut write_policy_chain = |chain_name: &str, endpoints: &[Endpoint]| {
            let rules = out.chains.entry(chain_name.to_string()).or_default();
            if svc.sticky_max_age_seconds.is_some() {
                for endpoint in endpoints {
                    let base = endpoint_chain_base(&svc.name, endpoint);
                    rules.push(format!("ip saddr @affinity-{base} goto endpoint-{base}"));
                }
            }
            match config.load_balancing {
                LoadBalancing::Vmap => {
                    let elements: Vec<String> = endpoints
                        .iter()
                        .enumerate()
                        .map(|(i, endpoint)| {
                            format!("{i} : goto {}", endpoint_chain(&svc.name, endpoint))
                        })
                        .collect();
                    rules.push(format!(
                        "numgen random mod {} vmap {{ {} }}",
                        endpoints.len(),
                        elements.join(", ")
                    ));
                }
                LoadBalancing::Cascade => {
                    // Endpoint i of n is taken with probability 1/(n-i) among those left:
                    // uniform overall, as iptables-mode's `--probability` cascade.
                    let n = endpoints.len();
                    for (i, endpoint) in endpoints.iter().enumerate() {
                        let chain = endpoint_chain(&svc.name, endpoint);
                        if i + 1 == n {
                            rules.push(format!("goto {chain}"));
                        } else {
                            rules.push(format!("numgen random mod {} == 0 goto {chain}", n - i));
                        }
                    }
                }
            }
        };
        if uses_cluster_chain {
            write_policy_chain(&cluster_chain, &cat.cluster);
        }
        if uses_local_chain {
            write_policy_chain(&local_chain, &cat.local);
        }

        for endpoint in &cat.all_reachable {
            let base = endpoint_chain_base(&svc.name, endpoint);
            let rules = out.chains.entry(format!("endpoint-{base}")).or_default();
            // Hairpin: a pod reaching itself through the Service must see the reply come from
            // the Service, so its own source is masqueraded.
            rules.push(format!("ip saddr {} jump {mark_masq}", endpoint.ip));
            if let Some(cidr) = config.bridge_pod_cidr
                && cidr.contains(endpoint.ip)
            {
                rules.push(format!(
                    "ip saddr {cidr} jump {mark_masq} comment \"pod to a pod on this node's bridge\""
                ));
            }
            if svc.sticky_max_age_seconds.is_some() {
                rules.push(format!("update @affinity-{base} {{ ip saddr }}"));
            }
            rules.push(format!("meta l4proto {protocol} dnat to {endpoint}"));
        }
        // A policy chain that gets no rule (no endpoints) is not written at all.
        out.chains.retain(|_, rules| !rules.is_empty());
    }
    out
}

/// Upstream's base chains: name, type, hook, priority. The priorities are upstream's
/// `dstnat - 10`, `dstnat + 10`, `dstnat` and `srcnat` as numbers: nft 1.0.6 accepts the
/// names only on some hooks (`dstnat` on prerouting, `srcnat` on postrouting).
const BASE_CHAINS: &[(&str, &str, &str, &str)] = &[
    ("filter-prerouting", "filter", "prerouting", "-110"),
    ("filter-input", "filter", "input", "-110"),
    ("filter-forward", "filter", "forward", "-110"),
    ("filter-output", "filter", "output", "-110"),
    ("filter-output-post-dnat", "filter", "output", "-90"),
    ("nat-prerouting", "nat", "prerouting", "-100"),
    ("nat-output", "nat", "output", "-100"),
    ("nat-postrouting", "nat", "postrouting", "100"),
];

/// Upstream's jumps from base chains to top-level chains: target, source, match.
const JUMP_CHAINS: &[(&str, &str, &str)] = &[
    (
        NODEPORT_ENDPOINTS_CHECK_CHAIN,
        "filter-input",
        "ct state new ",
    ),
    (
        SERVICE_ENDPOINTS_CHECK_CHAIN,
        "filter-input",
        "ct state new ",
    ),
    (
        SERVICE_ENDPOINTS_CHECK_CHAIN,
        "filter-forward",
        "ct state new ",
    ),
    (
        SERVICE_ENDPOINTS_CHECK_CHAIN,
        "filter-output",
        "ct state new ",
    ),
    (FIREWALL_CHECK_CHAIN, "filter-prerouting", "ct state new "),
    (FIREWALL_CHECK_CHAIN, "filter-output", "ct state new "),
    (SERVICES_CHAIN, "nat-output", ""),
    (SERVICES_CHAIN, "nat-prerouting", ""),
    (MASQUERADING_CHAIN, "nat-postrouting", ""),
    (CLUSTER_IPS_CHECK_CHAIN, "filter-forward", "ct state new "),
    (
        CLUSTER_IPS_CHECK_CHAIN,
        "filter-output-post-dnat",
        "ct state new ",
    ),
];

fn push(s: &mut String, line: String) {
    s.push_str(&line);
    s.push('\n');
}

/// Deletes table `name` if it exists and creates it anew.
fn recreate_table(s: &mut String, name: &str, comment: &str) {
    let t = format!("ip {name}");
    let table_comment = format!("{{ comment \"{comment}\" ; }}");
    // "add" first so that "delete" never fails on a missing table.
    let _ = writeln!(s, "add table {t} {table_comment}");
    let _ = writeln!(s, "delete table {t}");
    let _ = writeln!(s, "add table {t} {table_comment}");
}

/// The NAT chains that only jump to `services` (a Service table's own hooks when split).
fn is_dispatch_hook(chain: &str) -> bool {
    chain == "nat-prerouting" || chain == "nat-output"
}

/// `mark-for-masquerade`'s rule.
fn mark_for_masquerade(s: &mut String, t: &str, config: &Config) {
    let mark = config.masquerade_mark();
    let _ = writeln!(s, "add rule {t} {MARK_MASQ_CHAIN} mark set mark or {mark}");
}

/// The `nodeport-ips` set with the node's addresses (when NodePorts are limited to them).
fn nodeport_ips(s: &mut String, t: &str, config: &Config) {
    if let Some(ips) = &config.node_port_ips {
        let _ = writeln!(
            s,
            "add set {t} {NODEPORT_IPS_SET} {{ type ipv4_addr ; comment \"IPs that accept NodePort traffic\" ; }}"
        );
        for ip in ips.iter().filter(|ip| !ip.is_loopback()) {
            let _ = writeln!(s, "add element {t} {NODEPORT_IPS_SET} {{ {ip} }}");
        }
    }
}

/// The `service-ips` / `service-nodeports` maps and the `services` rules dispatching on them.
fn dispatch(s: &mut String, t: &str, config: &Config) {
    let _ = writeln!(
        s,
        "add map {t} {SERVICE_IPS_MAP} {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }}"
    );
    let _ = writeln!(
        s,
        "add map {t} {SERVICE_NODEPORTS_MAP} {{ type inet_proto . inet_service : verdict ; comment \"NodePort traffic\" ; }}"
    );
    let _ = writeln!(
        s,
        "add rule {t} {SERVICES_CHAIN} ip daddr . meta l4proto . th dport vmap @{SERVICE_IPS_MAP}"
    );
    let node_port_dispatch = if config.node_port_ips.is_some() {
        format!("ip daddr @{NODEPORT_IPS_SET}")
    } else {
        "fib daddr type local ip daddr != 127.0.0.0/8".to_string()
    };
    let _ = writeln!(
        s,
        "add rule {t} {SERVICES_CHAIN} {node_port_dispatch} meta l4proto . th dport vmap @{SERVICE_NODEPORTS_MAP}"
    );
}

/// A Service table's fixed part: its own NAT hooks jumping to its `services` dispatch, and
/// its own `mark-for-masquerade` (a jump cannot leave its table; the mark is read by
/// `masquerading` in table `kube-proxy`).
fn render_service_table(s: &mut String, name: &str, config: &Config) {
    recreate_table(s, name, "Service rules for kube-proxy");
    let t = format!("ip {name}");
    for (chain, type_, hook, priority) in BASE_CHAINS {
        if is_dispatch_hook(chain) {
            let _ = writeln!(
                s,
                "add chain {t} {chain} {{ type {type_} hook {hook} priority {priority} ; }}"
            );
        }
    }
    let _ = writeln!(s, "add chain {t} {SERVICES_CHAIN}");
    let _ = writeln!(s, "add chain {t} {MARK_MASQ_CHAIN}");
    for (target, source, matcher) in JUMP_CHAINS {
        if is_dispatch_hook(source) {
            let _ = writeln!(s, "add rule {t} {source} {matcher}jump {target}");
        }
    }
    mark_for_masquerade(s, &t, config);
    nodeport_ips(s, &t, config);
    dispatch(s, &t, config);
}

/// The tables' fixed part (upstream `setupNFTables`), rebuilding them from scratch: table
/// `kube-proxy`, then each Service table (when split), and the deletion of any other Service
/// table an earlier configuration left.
pub fn render_base(config: &Config) -> String {
    let split = config.service_tables.min(MAX_SERVICE_TABLES);
    let t = format!("ip {TABLE}");
    let mut s = String::new();
    recreate_table(&mut s, TABLE, "rules for kube-proxy");
    // Split, table kube-proxy keeps the filter part and masquerading; the NAT hooks that
    // dispatch Services are the Service tables' own.
    let in_main = |chain: &str| split == 0 || (chain != SERVICES_CHAIN && !is_dispatch_hook(chain));
    for (name, type_, hook, priority) in BASE_CHAINS {
        if in_main(name) {
            push(
                &mut s,
                format!(
                    "add chain {t} {name} {{ type {type_} hook {hook} priority {priority} ; }}"
                ),
            );
        }
    }
    let mut created = BTreeSet::new();
    for (target, _, _) in JUMP_CHAINS {
        if in_main(target) && created.insert(*target) {
            push(&mut s, format!("add chain {t} {target}"));
        }
    }
    push(&mut s, format!("add chain {t} {MARK_MASQ_CHAIN}"));
    push(
        &mut s,
        format!(
            "add chain {t} {REJECT_CHAIN} {{ comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\" ; }}"
        ),
    );
    for (target, source, matcher) in JUMP_CHAINS {
        if in_main(source) {
            push(
                &mut s,
                format!("add rule {t} {source} {matcher}jump {target}"),
            );
        }
    }
    let mark = config.masquerade_mark();
    mark_for_masquerade(&mut s, &t, config);
    push(
        &mut s,
        format!("add rule {t} {MASQUERADING_CHAIN} mark and {mark} == 0 return"),
    );
    push(
        &mut s,
        format!("add rule {t} {MASQUERADING_CHAIN} mark set mark xor {mark}"),
    );
    push(
        &mut s,
        format!("add rule {t} {MASQUERADING_CHAIN} masquerade fully-random"),
    );
    push(
        &mut s,
        format!(
            "add set {t} {CLUSTER_IPS_SET} {{ type ipv4_addr ; comment \"Active ClusterIPs\" ; }}"
        ),
    );
    if !config.node_local_ips.is_empty() {
        let ips: Vec<String> = config
            .node_local_ips
            .iter()
            .map(Ipv4Addr::to_string)
            .collect();
        push(
            &mut s,
            format!(
                "add rule {t} {CLUSTER_IPS_CHECK_CHAIN} ip daddr {{ {} }} return comment \"Addresses this node answers itself\"",
                ips.join(", ")
            ),
        );
    }
    push(
        &mut s,
        format!(
            "add rule {t} {CLUSTER_IPS_CHECK_CHAIN} ip daddr @{CLUSTER_IPS_SET} reject comment \"Reject traffic to invalid ports of ClusterIPs\""
        ),
    );
    if !config.service_cidrs.is_empty() {
        let cidrs: Vec<String> = config.service_cidrs.iter().map(Cidr::to_string).collect();
        push(
            &mut s,
            format!(
                "add rule {t} {CLUSTER_IPS_CHECK_CHAIN} ip daddr {{ {} }} drop comment \"Drop traffic to unallocated ClusterIPs\"",
                cidrs.join(", ")
            ),
        );
    }
    nodeport_ips(&mut s, &t, config);
    push(
        &mut s,
        format!(
            "add map {t} {NO_ENDPOINT_SERVICES_MAP} {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to services with no endpoints\" ; }}"
        ),
    );
    push(
        &mut s,
        format!(
            "add map {t} {NO_ENDPOINT_NODEPORTS_MAP} {{ type inet_proto . inet_service : verdict ; comment \"vmap to drop or reject packets to service nodeports with no endpoints\" ; }}"
        ),
    );
    push(&mut s, format!("add rule {t} {REJECT_CHAIN} reject"));
    push(
        &mut s,
        format!(
            "add rule {t} {SERVICE_ENDPOINTS_CHECK_CHAIN} ip daddr . meta l4proto . th dport vmap @{NO_ENDPOINT_SERVICES_MAP}"
        ),
    );
    let node_port_match = if config.node_port_ips.is_some() {
        format!("ip daddr @{NODEPORT_IPS_SET}")
    } else {
        "ip daddr != 127.0.0.0/8".to_string()
    };
    push(
        &mut s,
        format!(
            "add rule {t} {NODEPORT_ENDPOINTS_CHECK_CHAIN} {node_port_match} meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS_MAP}"
        ),
    );
    push(
        &mut s,
        format!(
            "add map {t} {FIREWALL_IPS_MAP} {{ type ipv4_addr . inet_proto . inet_service : verdict ; comment \"destinations that are subject to LoadBalancerSourceRanges\" ; }}"
        ),
    );
    push(
        &mut s,
        format!(
            "add rule {t} {FIREWALL_CHECK_CHAIN} ip daddr . meta l4proto . th dport vmap @{FIREWALL_IPS_MAP}"
        ),
    );
    if split == 0 {
        dispatch(&mut s, &t, config);
    }
    for index in 0..MAX_SERVICE_TABLES {
        let name = service_table_name(index);
        if index < split {
            render_service_table(&mut s, &name, config);
        } else {
            let _ = writeln!(s, "add table ip {name}\ndelete table ip {name}");
        }
    }
    s
}

/// The script's sections, in the order a transaction needs them: objects exist before rules
/// and elements refer to them; elements are deleted before re-added; affinity sets are
/// deleted only after the rules using them are gone.
#[derive(Default)]
struct Script {
    create: String,
    rules: String,
    delete_elements: String,
    add_elements: String,
    cleanup: String,
}

impl Script {
    fn finish(self, base: Option<String>) -> String {
        let mut out = base.unwrap_or_default();
        for part in [
            self.create,
            self.rules,
            self.delete_elements,
            self.add_elements,
            self.cleanup,
        ] {
            out.push_str(&part);
        }
        out
    }
}

fn element_text(key: &str, element: &Element) -> String {
    let comment = element
        .comment
        .as_ref()
        .map(|c| format!(" comment \"{c}\""))
        .unwrap_or_default();
    match &element.value {
        Some(value) => format!("{key}{comment} : {value}"),
        None => format!("{key}{comment}"),
    }
}

/// Which table holds each of one Service's objects.
struct Tables {
    /// Its NAT part: Service, local, external and endpoint chains, affinity sets, and its
    /// `service-ips` / `service-nodeports` elements.
    nat: String,
}

impl Tables {
    fn of(config: &Config, service: &NamespacedName) -> Self {
        Self {
            nat: config.service_table(service),
        }
    }

    /// Firewall chains are reached from `firewall-ips`, a filter map of table `kube-proxy`.
    fn of_chain(&self, chain: &str) -> &str {
        if chain.starts_with(FIREWALL_PREFIX) {
            TABLE
        } else {
            &self.nat
        }
    }

    fn of_container(&self, container: Container) -> &str {
        match container {
            Container::ServiceIps | Container::ServiceNodePorts => &self.nat,
            _ => TABLE,
        }
    }
}

/// What a sync produced: the script for `nft -f -` and what it contains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transaction {
    /// The nft script (empty when nothing changed).
    pub script: String,
    /// A full rebuild of the table.
    pub full: bool,
    /// How many Services were rendered.
    pub services: usize,
}

/// Renders syncs, remembering what the table holds per Service.
#[derive(Debug)]
pub struct Renderer {
    config: Config,
    installed: BTreeMap<NamespacedName, ServiceRules>,
    /// Flushed chains waiting for deletion: (table, chain) → since when.
    stale_chains: BTreeMap<(String, String), Instant>,
    need_full_sync: bool,
}

impl Renderer {
    /// A renderer whose first sync is a full one.
    pub fn new(config: Config) -> Self {
        Self {
            config,
            installed: BTreeMap::new(),
            stale_chains: BTreeMap::new(),
            need_full_sync: true,
        }
    }

    /// Its settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Changes the settings; the next sync is a full one.
    pub fn set_config(&mut self, config: Config) {
        if config != self.config {
            self.config = config;
            self.need_full_sync = true;
        }
    }

    /// Forgets what is installed (after a failed apply): the next sync is a full one.
    pub fn invalidate(&mut self) {
        self.need_full_sync = true;
    }

    /// Whether the next sync is a full one.
    pub fn needs_full_sync(&self) -> bool {
        self.need_full_sync
    }

    /// Renders a sync: a full rebuild when one is due, otherwise the changes of `changed`.
    pub fn sync(
        &mut self,
        state: &ProxyState,
        changed: &BTreeSet<NamespacedName>,
        now: Instant,
    ) -> Transaction {
        if self.need_full_sync {
            self.full_sync(state)
        } else {
            self.partial_sync(state, changed, now)
        }
    }

    /// Deletes the table and rebuilds every Service.
    pub fn full_sync(&mut self, state: &ProxyState) -> Transaction {
        self.installed.clear();
        self.stale_chains.clear();
        let mut script = Script::default();
        for (key, ports) in state.services() {
            let rules = render_service(&self.config, ports, &|name| state.endpoints(name));
            let tables = Tables::of(&self.config, key);
            self.write_diff(
                &mut script,
                &tables,
                &ServiceRules::default(),
                &rules,
                Instant::now(),
                false,
            );
            self.installed.insert(key.clone(), rules);
        }
        self.need_full_sync = false;
        Transaction {
            script: script.finish(Some(render_base(&self.config))),
            full: true,
            services: state.services().len(),
        }
    }

    /// Writes only what changed for the Services in `changed`.
    pub fn partial_sync(
        &mut self,
        state: &ProxyState,
        changed: &BTreeSet<NamespacedName>,
        now: Instant,
    ) -> Transaction {
        let mut script = Script::default();
        // Chains flushed at least a second ago are unreferenced now: delete them first.
        if let Some(stale) = self.take_stale_chains(now) {
            script.create.push_str(&stale);
        }
        for key in changed {
            let new = render_service(&self.config, state.service(key), &|name| {
                state.endpoints(name)
            });
            let old = self.installed.remove(key).unwrap_or_default();
            let tables = Tables::of(&self.config, key);
            self.write_diff(&mut script, &tables, &old, &new, now, true);
            if new != ServiceRules::default() {
                self.installed.insert(key.clone(), new);
            }
        }
        Transaction {
            script: script.finish(None),
            full: false,
            services: changed.len(),
        }
    }

    /// The commands deleting the chains flushed at least [`STALE_CHAIN_DELAY`] before `now`
    /// (as upstream, not at once: before Linux 6.2 a chain stays referenced for a moment
    /// after the map element pointing at it is deleted); `None` when there are none. Partial
    /// syncs put them first in their transaction.
    pub fn take_stale_chains(&mut self, now: Instant) -> Option<String> {
        let due: Vec<(String, String)> = self
            .stale_chains
            .iter()
            .filter(|(_, since)| now.duration_since(**since) >= STALE_CHAIN_DELAY)
            .map(|(chain, _)| chain.clone())
            .collect();
        if due.is_empty() {
            return None;
        }
        let mut script = String::new();
        for (table, name) in due {
            let _ = writeln!(script, "delete chain ip {table} {name}");
            self.stale_chains.remove(&(table, name));
        }
        Some(script)
    }

    /// How many chains wait for deletion.
    pub fn stale_chain_count(&self) -> usize {
        self.stale_chains.len()
    }

    fn write_diff(
        &mut self,
        script: &mut Script,
        tables: &Tables,
        old: &ServiceRules,
        new: &ServiceRules,
        now: Instant,
        partial: bool,
    ) {
        let nat = format!("ip {}", tables.nat);
        let chain_table = |name: &str| format!("ip {}", tables.of_chain(name));
        // A set's timeout cannot be changed in place: the set is deleted and re-added, which
        // needs the rules using it gone first, so every chain of the Service is rewritten.
        let timeout_changed = new.affinity_sets.iter().any(|(name, timeout)| {
            old.affinity_sets
                .get(name)
                .is_some_and(|old_timeout| old_timeout != timeout)
        });
        if timeout_changed {
            for name in old.chains.keys() {
                let _ = writeln!(script.create, "flush chain {} {name}", chain_table(name));
            }
        }
        for (name, timeout) in &new.affinity_sets {
            if old.affinity_sets.get(name) != Some(timeout) {
                if old.affinity_sets.contains_key(name) {
                    let _ = writeln!(script.create, "delete set {nat} {name}");
                }
                let _ = writeln!(
                    script.create,
                    "add set {nat} {name} {{ type ipv4_addr ; flags dynamic,timeout ; timeout {timeout}s ; }}"
                );
            }
        }
        for (name, rules) in &new.chains {
            if !timeout_changed && old.chains.get(name) == Some(rules) {
                continue;
            }
            let t = chain_table(name);
            self.stale_chains
                .remove(&(tables.of_chain(name).to_string(), name.clone()));
            let _ = writeln!(script.create, "add chain {t} {name}");
            if partial {
                let _ = writeln!(script.rules, "flush chain {t} {name}");
            }
            for rule in rules {
                let _ = writeln!(script.rules, "add rule {t} {name} {rule}");
            }
        }
        for ((container, key), element) in &old.elements {
            if new.elements.get(&(*container, key.clone())) != Some(element) {
                let _ = writeln!(
                    script.delete_elements,
                    "delete element ip {} {} {{ {key} }}",
                    tables.of_container(*container),
                    container.name()
                );
            }
        }
        for ((container, key), element) in &new.elements {
            if old.elements.get(&(*container, key.clone())) != Some(element) {
                let _ = writeln!(
                    script.add_elements,
                    "add element ip {} {} {{ {} }}",
                    tables.of_container(*container),
                    container.name(),
                    element_text(key, element)
                );
            }
        }
        for name in old.chains.keys() {
            if !new.chains.contains_key(name) {
                let _ = writeln!(script.cleanup, "flush chain {} {name}", chain_table(name));
                self.stale_chains
                    .insert((tables.of_chain(name).to_string(), name.clone()), now);
            }
        }
        for name in old.affinity_sets.keys() {
            if !new.affinity_sets.contains_key(name) {
                let _ = writeln!(script.cleanup, "delete set {nat} {name}");
            }
        }
    }
}

#[cfg(test)]
#[path = "render_tests.rs"]
mod tests;
