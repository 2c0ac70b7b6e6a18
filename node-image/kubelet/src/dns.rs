//! A pod's `/etc/resolv.conf` (upstream's `pkg/kubelet/network/dns`): by `dnsPolicy` the
//! cluster DNS with the cluster's search path and `ndots:5` (ClusterFirst, and
//! ClusterFirstWithHostNet on the host's network), the node's own resolvers (Default, and
//! ClusterFirst on the host's network), or nothing (None); then the pod's `dnsConfig`
//! appended, and the resolver's limits applied (3 nameservers, 32 search domains).

use std::collections::BTreeMap;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;

/// Upstream's `defaultDNSOptions` for cluster DNS.
const CLUSTER_OPTIONS: &[&str] = &["ndots:5"];
/// glibc's limits (`MAXNS`, and the search list's length since glibc 2.26).
const MAX_NAMESERVERS: usize = 3;
const MAX_SEARCHES: usize = 32;
const MAX_SEARCH_CHARS: usize = 2048;

/// The kubelet's DNS settings.
#[derive(Debug, Clone, Default)]
pub struct DnsSettings {
    /// `--cluster-dns`.
    pub cluster_dns: Vec<String>,
    /// `--cluster-domain`.
    pub cluster_domain: String,
    /// The node's resolvers, from `--resolv-conf`.
    pub host: cri::DnsConfig,
}

/// A warning about a pod's DNS, for an Event: (reason, message).
pub type DnsWarning = (&'static str, String);

/// Parses a resolv.conf: nameservers, the last `search` line, options.
pub fn parse_resolv_conf(text: &str) -> cri::DnsConfig {
    let mut config = cri::DnsConfig::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or_default();
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => config.servers.extend(words.next().map(str::to_string)),
            Some("search") => {
                config.searches = words.map(|s| s.trim_end_matches('.').to_string()).collect();
            }
            Some("options") => config.options.extend(words.map(str::to_string)),
            _ => {}
        }
    }
    config
}

/// The DNS configuration of `pod`'s sandbox, and what to warn about.
pub fn pod_dns(settings: &DnsSettings, pod: &Pod) -> (cri::DnsConfig, Vec<DnsWarning>) {
    let mut warnings = Vec::new();
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let policy = spec
        .and_then(|s| s.dns_policy.as_deref())
        .unwrap_or("ClusterFirst");
    let cluster = match policy {
        "None" => None,
        "ClusterFirstWithHostNet" => Some(true),
        "Default" => Some(false),
        // ClusterFirst, and anything else as upstream defaults it.
        _ => Some(!host_network),
    };
    let mut config = match cluster {
        None => cri::DnsConfig::default(),
        Some(true) if !settings.cluster_dns.is_empty() => cri::DnsConfig {
            servers: settings.cluster_dns.clone(),
            searches: cluster_searches(settings, pod),
            options: CLUSTER_OPTIONS.iter().map(|o| o.to_string()).collect(),
        },
        Some(true) => {
            warnings.push((
                "MissingClusterDNS",
                format!(
                    "pod: {:?}. kubelet does not have ClusterDNS IP configured and cannot create Pod using \"ClusterFirst\" policy. Falling back to \"Default\" policy.",
                    pod_name(pod)
                ),
            ));
            settings.host.clone()
        }
        Some(false) => settings.host.clone(),
    };
    if let Some(extra) = spec.and_then(|s| s.dns_config.as_ref()) {
        let servers = extra.nameservers.iter().flatten().cloned();
        config.servers = without_duplicates(config.servers.into_iter().chain(servers));
        let searches = extra.searches.iter().flatten().cloned();
        config.searches = without_duplicates(config.searches.into_iter().chain(searches));
        let mut options: BTreeMap<String, Option<String>> = config
            .options
            .iter()
            .map(|o| match o.split_once(':') {
                Some((name, value)) => (name.to_string(), Some(value.to_string())),
                None => (o.clone(), None),
            })
            .collect();
        for option in extra.options.iter().flatten() {
            if let Some(name) = &option.name {
                options.insert(name.clone(), option.value.clone());
            }
        }
        config.options = options
            .into_iter()
            .map(|(name, value)| match value {
                Some(value) if !value.is_empty() => format!("{name}:{value}"),
                _ => name,
            })
            .collect();
    }
    fit_limits(&mut config, &mut warnings);
    (config, warnings)
}

/// `<ns>.svc.<domain>`, `svc.<domain>`, `<domain>`, then the node's search domains.
fn cluster_searches(settings: &DnsSettings, pod: &Pod) -> Vec<String> {
    if settings.cluster_domain.is_empty() {
        return settings.host.searches.clone();
    }
    let domain = &settings.cluster_domain;
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let cluster = [
        format!("{namespace}.svc.{domain}"),
        format!("svc.{domain}"),
        domain.clone(),
    ];
    without_duplicates(
        cluster
            .into_iter()
            .chain(settings.host.searches.iter().cloned()),
    )
}

fn without_duplicates(items: impl Iterator<Item = String>) -> Vec<String> {
    let mut kept: Vec<String> = Vec::new();
    for item in items {
        if !kept.contains(&item) {
            kept.push(item);
        }
    }
    kept
}

/// Drops what the resolver cannot take, with upstream's `DNSConfigForming` warnings.
fn fit_limits(config: &mut cri::DnsConfig, warnings: &mut Vec<DnsWarning>) {
    if config.servers.len() > MAX_NAMESERVERS {
        config.servers.truncate(MAX_NAMESERVERS);
        warnings.push((
            "DNSConfigForming",
            format!(
                "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: {}",
                config.servers.join(" ")
            ),
        ));
    }
    let mut length = 0;
    let mut fitting = 0;
    for search in &config.searches {
        if fitting == MAX_SEARCHES || length + search.len() + 1 > MAX_SEARCH_CHARS {
            break;
        }
        length += search.len() + 1;
        fitting += 1;
    }
    if fitting < config.searches.len() {
        config.searches.truncate(fitting);
        warnings.push((
            "DNSConfigForming",
            format!(
                "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: {}",
                config.searches.join(" ")
            ),
        ));
    }
}

fn pod_name(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.uid.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn settings() -> DnsSettings {
        DnsSettings {
            cluster_dns: vec!["10.96.0.10".into()],
            cluster_domain: "cluster.local".into(),
            host: parse_resolv_conf(
                "# the node's\nnameserver 10.0.0.2\nsearch ec2.internal.\noptions timeout:2\n",
            ),
        }
    }

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "shop", "uid": "u"},
            "spec": spec,
        }))
        .expect("pod")
    }

    fn lines(config: &cri::DnsConfig) -> (Vec<&str>, Vec<&str>, Vec<&str>) {
        (
            config.servers.iter().map(String::as_str).collect(),
            config.searches.iter().map(String::as_str).collect(),
            config.options.iter().map(String::as_str).collect(),
        )
    }

    #[test]
    fn each_dns_policy_as_upstream() {
        let settings = settings();
        let cluster = (
            vec!["10.96.0.10"],
            vec![
                "shop.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "ec2.internal",
            ],
            vec!["ndots:5"],
        );
        let host = (vec!["10.0.0.2"], vec!["ec2.internal"], vec!["timeout:2"]);
        let none: (Vec<&str>, Vec<&str>, Vec<&str>) = (vec![], vec![], vec![]);
        for (spec, want) in [
            (json!({"containers": []}), &cluster),
            (json!({"dnsPolicy": "ClusterFirst"}), &cluster),
            (
                json!({"dnsPolicy": "ClusterFirst", "hostNetwork": true}),
                &host,
            ),
            (
                json!({"dnsPolicy": "ClusterFirstWithHostNet", "hostNetwork": true}),
                &cluster,
            ),
            (json!({"dnsPolicy": "Default"}), &host),
            (json!({"dnsPolicy": "None"}), &none),
        ] {
            let (config, warnings) = pod_dns(&settings, &pod(spec.clone()));
            assert_eq!(&lines(&config), want, "{spec}");
            assert!(warnings.is_empty());
        }
    }

    #[test]
    fn dns_config_is_appended_and_options_merged() {
        let (config, _) = pod_dns(
            &settings(),
            &pod(json!({"dnsConfig": {
                "nameservers": ["1.1.1.1", "10.96.0.10"],
                "searches": ["example.com", "svc.cluster.local"],
                "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}],
            }})),
        );
        assert_eq!(
            lines(&config),
            (
                vec!["10.96.0.10", "1.1.1.1"],
                vec![
                    "shop.svc.cluster.local",
                    "svc.cluster.local",
                    "cluster.local",
                    "ec2.internal",
                    "example.com",
                ],
                vec!["edns0", "ndots:2"],
            )
        );
        let (config, _) = pod_dns(
            &settings(),
            &pod(json!({"dnsPolicy": "None", "dnsConfig": {"nameservers": ["8.8.8.8"]}})),
        );
        assert_eq!(lines(&config), (vec!["8.8.8.8"], vec![], vec![]));
    }

    #[test]
    fn no_cluster_dns_falls_back_to_the_node_with_a_warning() {
        let settings = DnsSettings {
            cluster_dns: Vec::new(),
            ..settings()
        };
        let (config, warnings) = pod_dns(&settings, &pod(json!({})));
        assert_eq!(config.servers, vec!["10.0.0.2"]);
        assert_eq!(warnings.len(), 1);
        assert_eq!(warnings[0].0, "MissingClusterDNS");
        assert!(
            warnings[0]
                .1
                .ends_with("Falling back to \"Default\" policy."),
            "{}",
            warnings[0].1
        );
    }

    #[test]
    fn limits_drop_extra_nameservers_and_searches() {
        let searches: Vec<String> = (0..40).map(|i| format!("d{i}.example")).collect();
        let (config, warnings) = pod_dns(
            &settings(),
            &pod(json!({"dnsConfig": {
                "nameservers": ["1.1.1.1", "2.2.2.2", "3.3.3.3"],
                "searches": searches,
            }})),
        );
        assert_eq!(config.servers, vec!["10.96.0.10", "1.1.1.1", "2.2.2.2"]);
        assert_eq!(config.searches.len(), 32);
        let reasons: Vec<&str> = warnings.iter().map(|w| w.0).collect();
        assert_eq!(reasons, ["DNSConfigForming", "DNSConfigForming"]);
        assert!(warnings[0].1.ends_with("10.96.0.10 1.1.1.1 2.2.2.2"));
    }
}
