//! Upstream's model builder for one Ingress, sans IO: the Ingress, its backend Services and
//! the target nodes become an [`AlbModel`] (load balancer, listeners, rules in priority
//! order, one target group per Service port, tags), or a [`BuildError`] that says what to fix
//! before anything is made in the cloud.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::networking::v1::{HTTPIngressPath, Ingress, IngressBackend};

use super::annotations::{self, AnnotationError, ListenProtocol};
use crate::config::CloudSettings;
use crate::provider::{
    AlbAction, AlbListener, AlbModel, AlbRule, AlbSecurityGroups, AlbTargetGroup,
};

/// Upstream's tag naming the Ingress (`<namespace>/<name>`) on everything made for it.
pub const STACK_TAG: &str = "ingress.k8s.aws/stack";
/// Upstream's tag naming the cluster.
pub const CLUSTER_TAG: &str = "elbv2.k8s.aws/cluster";
/// Upstream's tag naming what a resource is for (`<ns>/<ingress>-<service>:<port>`).
pub const RESOURCE_TAG: &str = "ingress.k8s.aws/resource";

/// Why an Ingress cannot be built into a load balancer yet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// An annotation's value is unusable.
    #[error(transparent)]
    Annotation(#[from] AnnotationError),
    /// A backend Service does not exist.
    #[error("Service \"{namespace}/{name}\" not found")]
    ServiceNotFound {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// A backend Service has no NodePorts for instance targets.
    #[error(
        "Service \"{namespace}/{name}\" is of type {type_}: instance targets need type NodePort or LoadBalancer"
    )]
    ServiceNotNodePort {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Its type.
        type_: String,
    },
    /// A backend names a port the Service does not have.
    #[error("Service \"{namespace}/{name}\" has no port {port}")]
    ServicePortNotFound {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The port as the Ingress names it.
        port: String,
    },
    /// The Service port has no NodePort allocated.
    #[error("Service \"{namespace}/{name}\" port {port} has no NodePort")]
    NoNodePort {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The port as the Ingress names it.
        port: String,
    },
    /// A backend that is not a Service.
    #[error("the backend of path {path:?} is not a Service (resource backends are not supported)")]
    NotAService {
        /// The path.
        path: String,
    },
    /// An HTTPS listener without a certificate.
    #[error(
        "listener HTTPS:{port} needs a certificate: set annotation {}",
        annotations::CERTIFICATE_ARN
    )]
    CertificateRequired {
        /// The listener's port.
        port: i32,
    },
    /// A path ELBv2 cannot express for its type.
    #[error("{path_type} path {path:?} must not contain wildcards")]
    WildcardPath {
        /// The path.
        path: String,
        /// Its pathType.
        path_type: String,
    },
    /// A pathType that is not one of the three.
    #[error("unknown pathType {path_type:?} for path {path:?}")]
    UnknownPathType {
        /// The path.
        path: String,
        /// Its pathType.
        path_type: String,
    },
}

/// FNV-1a (64 bit): a stable hash for names.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Upstream's name sanitizing: only alphanumerics, at most `max` of them.
fn sanitized(text: &str, max: usize) -> String {
    text.chars()
        .filter(char::is_ascii_alphanumeric)
        .take(max)
        .collect()
}

fn resource_name(namespace: &str, name: &str, hash_input: &str) -> String {
    format!(
        "k8s-{}-{}-{}",
        sanitized(namespace, 8),
        sanitized(name, 8),
        &format!("{:016x}", fnv1a(hash_input))[..10]
    )
}

/// The ALB's name (≤ 32 characters, upstream's `k8s-<ns8>-<name8>-<hash>`), the hash over
/// the cluster, the Ingress and the scheme: a new scheme is a new load balancer.
pub fn load_balancer_name(cluster_id: &str, namespace: &str, name: &str, internal: bool) -> String {
    let scheme = if internal {
        "internal"
    } else {
        "internet-facing"
    };
    resource_name(
        namespace,
        name,
        &format!("{cluster_id}:{namespace}/{name}:{scheme}"),
    )
}

/// The managed security group's name (upstream's `k8s-<ns8>-<name8>-<hash>`, the hash over
/// the cluster and the Ingress: unlike the load balancer, a new scheme keeps the group).
pub fn security_group_name(cluster_id: &str, namespace: &str, name: &str) -> String {
    resource_name(namespace, name, &format!("{cluster_id}:{namespace}/{name}"))
}

/// The load balancer's security groups: those the annotation names, else a managed one.
fn security_groups(
    settings: &CloudSettings,
    namespace: &str,
    name: &str,
    ingress: &BTreeMap<String, String>,
) -> Result<AlbSecurityGroups, BuildError> {
    let named = annotations::security_groups(ingress);
    if !named.is_empty() {
        return Ok(AlbSecurityGroups::Named(named));
    }
    Ok(AlbSecurityGroups::Managed {
        name: security_group_name(&settings.cluster_id, namespace, name),
        inbound_cidrs: annotations::inbound_cidrs(ingress)?,
    })
}

/// The tags on everything made for the Ingress (and by which it is all found again).
pub fn stack_tags(
    settings: &CloudSettings,
    namespace: &str,
    name: &str,
) -> BTreeMap<String, String> {
    BTreeMap::from([
        (settings.cluster_tag_key(), "owned".to_string()),
        (CLUSTER_TAG.to_string(), settings.cluster_id.clone()),
        (STACK_TAG.to_string(), format!("{namespace}/{name}")),
    ])
}

/// ELBv2 path patterns for an Ingress path (upstream's `buildPathPatterns`): Exact is the
/// path itself; Prefix `/foo` is `/foo` and `/foo/*` (`/` is `/*`); ImplementationSpecific
/// is the path as written, wildcards included. Exact and Prefix paths may not hold `*` or `?`.
pub fn path_patterns(path: &str, path_type: &str) -> Result<Vec<String>, BuildError> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    let wildcard = || BuildError::WildcardPath {
        path: path.to_string(),
        path_type: path_type.to_string(),
    };
    match path_type {
        "ImplementationSpecific" | "" => Ok(vec![path.to_string()]),
        "Exact" if path.contains(['*', '?']) => Err(wildcard()),
        "Exact" => Ok(vec![path.to_string()]),
        "Prefix" if path == "/" => Ok(vec!["/*".to_string()]),
        "Prefix" if path.contains(['*', '?']) => Err(wildcard()),
        "Prefix" => {
            let base = path.strip_suffix('/').unwrap_or(path);
            Ok(vec![base.to_string(), format!("{base}/*")])
        }
        other => Err(BuildError::UnknownPathType {
            path: path.to_string(),
            path_type: other.to_string(),
        }),
    }
}

/// Upstream's `sortIngressPaths`: Exact paths first, then Prefix paths longest first (stable),
/// then ImplementationSpecific ones in their order.
pub fn sort_paths(paths: &[HTTPIngressPath]) -> Result<Vec<&HTTPIngressPath>, BuildError> {
    let mut exact = Vec::new();
    let mut prefix = Vec::new();
    let mut specific = Vec::new();
    for path in paths {
        match path.path_type.as_str() {
            "Exact" => exact.push(path),
            "Prefix" => prefix.push(path),
            "ImplementationSpecific" | "" => specific.push(path),
            other => {
                return Err(BuildError::UnknownPathType {
                    path: path.path.clone().unwrap_or_default(),
                    path_type: other.to_string(),
                });
            }
        }
    }
    prefix.sort_by_key(|p| std::cmp::Reverse(p.path.as_deref().map_or(0, str::len)));
    exact.extend(prefix);
    exact.extend(specific);
    Ok(exact)
}

/// The Services (by name, in the Ingress's namespace) its rules and default backend name.
pub fn backend_service_names(ingress: &Ingress) -> BTreeSet<String> {
    let Some(spec) = ingress.spec.as_ref() else {
        return BTreeSet::new();
    };
    let paths = spec
        .rules
        .iter()
        .flatten()
        .filter_map(|r| r.http.as_ref())
        .flat_map(|h| h.paths.iter().map(|p| &p.backend));
    spec.default_backend
        .iter()
        .chain(paths)
        .filter_map(|b| b.service.as_ref().map(|s| s.name.clone()))
        .collect()
}

struct Builder<'a> {
    settings: &'a CloudSettings,
    namespace: &'a str,
    name: &'a str,
    annotations: &'a BTreeMap<String, String>,
    services: &'a BTreeMap<String, Service>,
    groups: Vec<AlbTargetGroup>,
    by_backend: BTreeMap<(String, String), String>,
}

impl Builder<'_> {
    /// The target group of a backend (made on first use); returns its name.
    fn target_group(&mut self, backend: &IngressBackend, path: &str) -> Result<String, BuildError> {
        let Some(service_backend) = backend.service.as_ref() else {
            return Err(BuildError::NotAService {
                path: path.to_string(),
            });
        };
        let svc_name = service_backend.name.as_str();
        let port = service_backend.port.as_ref();
        let port_key = match (
            port.and_then(|p| p.number),
            port.and_then(|p| p.name.as_deref()),
        ) {
            (Some(number), _) => number.to_string(),
            (None, Some(name)) => name.to_string(),
            (None, None) => String::new(),
        };
        let namespace = self.namespace.to_string();
        let Some(service) = self.services.get(svc_name) else {
            return Err(BuildError::ServiceNotFound {
                namespace,
                name: svc_name.to_string(),
            });
        };
        let spec = service.spec.as_ref();
        let type_ = spec
            .and_then(|s| s.type_.clone())
            .unwrap_or_else(|| "ClusterIP".into());
        if type_ != "NodePort" && type_ != "LoadBalancer" {
            return Err(BuildError::ServiceNotNodePort {
                namespace,
                name: svc_name.to_string(),
                type_,
            });
        }
        let service_port = spec
            .and_then(|s| s.ports.as_ref())
            .into_iter()
            .flatten()
            .find(|p| {
                match (
                    port.and_then(|p| p.number),
                    port.and_then(|p| p.name.as_deref()),
                ) {
                    (Some(number), _) => p.port == number,
                    (None, Some(name)) => p.name.as_deref() == Some(name),
                    (None, None) => false,
                }
            })
            .ok_or_else(|| BuildError::ServicePortNotFound {
                namespace: namespace.clone(),
                name: svc_name.to_string(),
                port: port_key.clone(),
            })?;
        let node_port =
            service_port
                .node_port
                .filter(|p| *p > 0)
                .ok_or_else(|| BuildError::NoNodePort {
                    namespace: namespace.clone(),
                    name: svc_name.to_string(),
                    port: port_key.clone(),
                })?;
        // One group per Service port, however the Ingress names it (by name or number).
        let port_key = service_port.port.to_string();
        if let Some(existing) = self
            .by_backend
            .get(&(svc_name.to_string(), port_key.clone()))
        {
            return Ok(existing.clone());
        }
        let empty = BTreeMap::new();
        let service_annotations = service.metadata.annotations.as_ref().unwrap_or(&empty);
        let layers = [service_annotations, self.annotations];
        annotations::check_target_type(&layers)?;
        let protocol = annotations::backend_protocol(&layers)?;
        let health_check = annotations::health_check(&layers, &protocol)?;
        let uid = service.metadata.uid.as_deref().unwrap_or_default();
        let name = resource_name(
            self.namespace,
            svc_name,
            &format!(
                "{}:{}/{}:{uid}:{port_key}:{node_port}:{protocol}:instance",
                self.settings.cluster_id, self.namespace, self.name
            ),
        );
        self.groups.push(AlbTargetGroup {
            name: name.clone(),
            protocol,
            port: node_port,
            health_check,
            tags: BTreeMap::from([(
                RESOURCE_TAG.to_string(),
                format!("{}/{}-{svc_name}:{port_key}", self.namespace, self.name),
            )]),
        });
        self.by_backend
            .insert((svc_name.to_string(), port_key), name.clone());
        Ok(name)
    }
}

/// Builds the Ingress's load balancer. `services` are the Ingress namespace's Services by
/// name (absent ones are missing), `targets` the target Nodes' provider IDs.
pub fn build(
    ingress: &Ingress,
    services: &BTreeMap<String, Service>,
    targets: &BTreeSet<String>,
    settings: &CloudSettings,
) -> Result<AlbModel, BuildError> {
    let namespace = ingress.metadata.namespace.as_deref().unwrap_or("default");
    let name = ingress.metadata.name.as_deref().unwrap_or_default();
    let empty = BTreeMap::new();
    let ingress_annotations = ingress.metadata.annotations.as_ref().unwrap_or(&empty);

    let internal = annotations::internal(ingress_annotations)?;
    annotations::check_target_type(&[ingress_annotations])?;
    let certificates = annotations::certificate_arns(ingress_annotations);
    let ports = annotations::listen_ports(ingress_annotations, !certificates.is_empty())?;
    if certificates.is_empty()
        && let Some((port, _)) = ports.iter().find(|(_, p)| **p == ListenProtocol::Https)
    {
        return Err(BuildError::CertificateRequired { port: *port });
    }
    let ssl_policy = annotations::ssl_policy(ingress_annotations);
    let security_groups = security_groups(settings, namespace, name, ingress_annotations)?;

    let mut builder = Builder {
        settings,
        namespace,
        name,
        annotations: ingress_annotations,
        services,
        groups: Vec::new(),
        by_backend: BTreeMap::new(),
    };
    let spec = ingress.spec.as_ref();
    let mut rules = Vec::new();
    let mut priority = 1;
    for rule in spec.and_then(|s| s.rules.as_ref()).into_iter().flatten() {
        let Some(http) = rule.http.as_ref() else {
            continue;
        };
        let host_header: Vec<String> = rule
            .host
            .iter()
            .filter(|h| !h.is_empty())
            .cloned()
            .collect();
        for path in sort_paths(&http.paths)? {
            let text = path.path.as_deref().unwrap_or_default();
            let mut path_pattern = path_patterns(text, &path.path_type)?;
            if host_header.is_empty() && path_pattern.is_empty() {
                path_pattern = vec!["/*".to_string()];
            }
            let target_group = builder.target_group(&path.backend, text)?;
            rules.push(AlbRule {
                priority,
                host_header: host_header.clone(),
                path_pattern,
                action: AlbAction::Forward { target_group },
            });
            priority += 1;
        }
    }
    let default_action = match spec.and_then(|s| s.default_backend.as_ref()) {
        Some(backend) => AlbAction::Forward {
            target_group: builder.target_group(backend, "(default backend)")?,
        },
        None => AlbAction::FixedResponse {
            status_code: "404".into(),
            content_type: "text/plain".into(),
        },
    };
    let listeners = ports
        .iter()
        .map(|(port, protocol)| {
            let https = *protocol == ListenProtocol::Https;
            AlbListener {
                port: *port,
                protocol: protocol.as_str().to_string(),
                certificate_arns: if https {
                    certificates.clone()
                } else {
                    Vec::new()
                },
                ssl_policy: https.then(|| ssl_policy.clone()),
                default_action: default_action.clone(),
                rules: rules.clone(),
            }
        })
        .collect();
    Ok(AlbModel {
        name: load_balancer_name(&settings.cluster_id, namespace, name, internal),
        internal,
        security_groups,
        tags: stack_tags(settings, namespace, name),
        target_groups: builder.groups,
        listeners,
        targets: targets.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn settings() -> CloudSettings {
        CloudSettings {
            cluster_id: "demo".into(),
            region: "us-east-1".into(),
            endpoint_override: None,
            credentials: None,
            role_arn: None,
            vpc_id: None,
            subnet_ids: Vec::new(),
            security_group_ids: Vec::new(),
        }
    }

    fn service(name: &str, type_: &str, node_port: i32) -> (String, Service) {
        let svc = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}")},
            "spec": {"type": type_, "ports": [
                {"name": "http", "port": 80, "targetPort": 8080, "nodePort": node_port},
            ]},
        }))
        .expect("a service");
        (name.to_string(), svc)
    }

    fn services() -> BTreeMap<String, Service> {
        BTreeMap::from([
            service("web", "NodePort", 30080),
            service("api", "LoadBalancer", 30081),
            service("internal", "ClusterIP", 0),
        ])
    }

    fn ingress(annotations: serde_json::Value, spec: serde_json::Value) -> Ingress {
        serde_json::from_value(json!({
            "metadata": {"name": "shop", "namespace": "shop", "annotations": annotations},
            "spec": spec,
        }))
        .expect("an ingress")
    }

    fn two_hosts() -> serde_json::Value {
        json!({"rules": [
            {"host": "web.example.com", "http": {"paths": [
                {"path": "/", "pathType": "Prefix",
                 "backend": {"service": {"name": "web", "port": {"number": 80}}}},
            ]}},
            {"host": "api.example.com", "http": {"paths": [
                {"path": "/v1", "pathType": "Prefix",
                 "backend": {"service": {"name": "api", "port": {"name": "http"}}}},
                {"path": "/v1/status", "pathType": "Exact",
                 "backend": {"service": {"name": "api", "port": {"number": 80}}}},
            ]}},
        ]})
    }

    fn targets() -> BTreeSet<String> {
        BTreeSet::from(["aws:///us-east-1a/i-1".to_string()])
    }

    #[test]
    fn two_hosts_become_rules_over_two_target_groups() {
        let model = build(
            &ingress(json!({}), two_hosts()),
            &services(),
            &targets(),
            &settings(),
        )
        .expect("valid");
        assert!(model.internal, "internal is upstream's default");
        assert!(model.name.starts_with("k8s-shop-shop-"), "{}", model.name);
        assert!(model.name.len() <= 32);
        assert_eq!(model.targets, targets());
        assert_eq!(model.tags[STACK_TAG], "shop/shop");
        assert_eq!(model.tags[CLUSTER_TAG], "demo");
        assert_eq!(model.tags["kubernetes.io/cluster/demo"], "owned");
        // A group of its own, open to everyone on the listen ports (upstream's default).
        let AlbSecurityGroups::Managed {
            name: group_name,
            inbound_cidrs,
        } = &model.security_groups
        else {
            panic!("a managed group: {:?}", model.security_groups);
        };
        assert!(group_name.starts_with("k8s-shop-shop-"), "{group_name}");
        assert_eq!(inbound_cidrs, &vec!["0.0.0.0/0".to_string()]);
        // `api` by port name and by number is one Service port, so one group.
        assert_eq!(model.target_groups.len(), 2);
        let ports: Vec<(i32, &str)> = model
            .target_groups
            .iter()
            .map(|g| (g.port, g.protocol.as_str()))
            .collect();
        assert_eq!(ports, vec![(30080, "HTTP"), (30081, "HTTP")]);
        assert_eq!(model.target_groups[0].health_check.path, "/");
        assert!(model.target_groups.iter().all(|g| g.name.len() <= 32));

        assert_eq!(model.listeners.len(), 1);
        let listener = &model.listeners[0];
        assert_eq!((listener.port, listener.protocol.as_str()), (80, "HTTP"));
        assert_eq!(
            listener.default_action,
            AlbAction::FixedResponse {
                status_code: "404".into(),
                content_type: "text/plain".into()
            }
        );
        let web = AlbAction::Forward {
            target_group: model.target_groups[0].name.clone(),
        };
        let api = AlbAction::Forward {
            target_group: model.target_groups[1].name.clone(),
        };
        let rules: Vec<(i32, Vec<&str>, Vec<&str>, &AlbAction)> = listener
            .rules
            .iter()
            .map(|r| {
                (
                    r.priority,
                    r.host_header.iter().map(String::as_str).collect(),
                    r.path_pattern.iter().map(String::as_str).collect(),
                    &r.action,
                )
            })
            .collect();
        assert_eq!(
            rules,
            vec![
                (1, vec!["web.example.com"], vec!["/*"], &web),
                // Exact before Prefix within a rule.
                (2, vec!["api.example.com"], vec!["/v1/status"], &api),
                (3, vec!["api.example.com"], vec!["/v1", "/v1/*"], &api),
            ]
        );
    }

    #[test]
    fn path_types_map_as_upstream() {
        type Case = (&'static str, &'static str, Result<Vec<&'static str>, ()>);
        let cases: [Case; 11] = [
            ("/", "Prefix", Ok(vec!["/*"])),
            ("/foo", "Prefix", Ok(vec!["/foo", "/foo/*"])),
            ("/foo/", "Prefix", Ok(vec!["/foo", "/foo/*"])),
            ("/foo*", "Prefix", Err(())),
            ("/foo", "Exact", Ok(vec!["/foo"])),
            ("/foo/", "Exact", Ok(vec!["/foo/"])),
            ("/fo?", "Exact", Err(())),
            ("/foo*", "ImplementationSpecific", Ok(vec!["/foo*"])),
            ("/foo", "ImplementationSpecific", Ok(vec!["/foo"])),
            ("", "Prefix", Ok(vec![])),
            ("/foo", "Regex", Err(())),
        ];
        for (path, path_type, want) in cases {
            let got = path_patterns(path, path_type).map_err(|_| ());
            let want = want.map(|v| v.into_iter().map(str::to_string).collect::<Vec<_>>());
            assert_eq!(got, want, "{path_type} {path:?}");
        }
    }

    #[test]
    fn prefix_paths_sort_longest_first_after_exact_ones() {
        let paths: Vec<HTTPIngressPath> = serde_json::from_value(json!([
            {"path": "/a", "pathType": "ImplementationSpecific", "backend": {}},
            {"path": "/b", "pathType": "Prefix", "backend": {}},
            {"path": "/bbb", "pathType": "Prefix", "backend": {}},
            {"path": "/c", "pathType": "Exact", "backend": {}},
            {"path": "/dd", "pathType": "Prefix", "backend": {}},
        ]))
        .expect("paths");
        let sorted: Vec<&str> = sort_paths(&paths)
            .expect("known types")
            .iter()
            .map(|p| p.path.as_deref().unwrap_or_default())
            .collect();
        assert_eq!(sorted, vec!["/c", "/bbb", "/dd", "/b", "/a"]);
    }

    #[test]
    fn default_backend_and_listen_ports() {
        let spec = json!({"defaultBackend": {"service": {"name": "web", "port": {"number": 80}}}});
        let model = build(
            &ingress(
                json!({
                    annotations::SCHEME: "internet-facing",
                    annotations::LISTEN_PORTS: r#"[{"HTTP": 80}, {"HTTPS": 443}]"#,
                    annotations::CERTIFICATE_ARN: "arn:aws:acm:us-east-1:000000000000:certificate/x",
                }),
                spec,
            ),
            &services(),
            &targets(),
            &settings(),
        )
        .expect("valid");
        assert!(!model.internal);
        assert_eq!(model.target_groups.len(), 1);
        let forward = AlbAction::Forward {
            target_group: model.target_groups[0].name.clone(),
        };
        let listeners: Vec<(i32, &str, usize, Option<&str>)> = model
            .listeners
            .iter()
            .map(|l| {
                (
                    l.port,
                    l.protocol.as_str(),
                    l.certificate_arns.len(),
                    l.ssl_policy.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            listeners,
            vec![
                (80, "HTTP", 0, None),
                (443, "HTTPS", 1, Some(annotations::DEFAULT_SSL_POLICY))
            ]
        );
        assert!(
            model
                .listeners
                .iter()
                .all(|l| l.default_action == forward && l.rules.is_empty())
        );
        // The scheme is in the name: a new scheme is a new load balancer.
        let internal = build(
            &ingress(json!({}), json!({})),
            &services(),
            &targets(),
            &settings(),
        )
        .expect("valid");
        assert_ne!(internal.name, model.name);
    }

    #[test]
    fn a_rule_without_host_or_path_matches_everything() {
        let spec = json!({"rules": [{"http": {"paths": [
            {"pathType": "ImplementationSpecific",
             "backend": {"service": {"name": "web", "port": {"number": 80}}}},
        ]}}]});
        let model = build(
            &ingress(json!({}), spec),
            &services(),
            &targets(),
            &settings(),
        )
        .expect("valid");
        assert_eq!(model.listeners[0].rules[0].path_pattern, vec!["/*"]);
        assert!(model.listeners[0].rules[0].host_header.is_empty());
    }

    #[test]
    fn node_port_changes_make_a_new_target_group() {
        let before = build(
            &ingress(json!({}), two_hosts()),
            &services(),
            &targets(),
            &settings(),
        )
        .expect("valid");
        let mut changed = services();
        changed.insert("web".into(), service("web", "NodePort", 31999).1);
        let after = build(
            &ingress(json!({}), two_hosts()),
            &changed,
            &targets(),
            &settings(),
        )
        .expect("valid");
        assert_ne!(before.target_groups[0].name, after.target_groups[0].name);
        assert_eq!(after.target_groups[0].port, 31999);
        assert_eq!(before.target_groups[1], after.target_groups[1]);
    }

    fn error_of(annotations: serde_json::Value, spec: serde_json::Value) -> BuildError {
        build(
            &ingress(annotations, spec),
            &services(),
            &targets(),
            &settings(),
        )
        .expect_err("must be refused")
    }

    fn one_path(service: &str, port: serde_json::Value) -> serde_json::Value {
        json!({"rules": [{"http": {"paths": [
            {"path": "/", "pathType": "Prefix",
             "backend": {"service": {"name": service, "port": port}}},
        ]}}]})
    }

    #[test]
    fn bad_backends_name_the_service() {
        let cases = [
            (
                one_path("missing", json!({"number": 80})),
                "Service \"shop/missing\" not found",
            ),
            (
                one_path("internal", json!({"number": 80})),
                "Service \"shop/internal\" is of type ClusterIP",
            ),
            (
                one_path("web", json!({"number": 81})),
                "Service \"shop/web\" has no port 81",
            ),
            (
                one_path("web", json!({"name": "grpc"})),
                "Service \"shop/web\" has no port grpc",
            ),
            (
                json!({"defaultBackend": {"service": {"name": "gone", "port": {"number": 80}}}}),
                "Service \"shop/gone\" not found",
            ),
            (
                json!({"rules": [{"http": {"paths": [{"path": "/", "pathType": "Prefix",
                    "backend": {"resource": {"kind": "Bucket", "name": "b"}}}]}}]}),
                "is not a Service",
            ),
        ];
        for (spec, want) in cases {
            let err = error_of(json!({}), spec);
            assert!(err.to_string().contains(want), "{err} does not say {want}");
        }
        let mut services = services();
        services.insert("web".into(), service("web", "NodePort", 0).1);
        let err = build(
            &ingress(json!({}), one_path("web", json!({"number": 80}))),
            &services,
            &targets(),
            &settings(),
        )
        .expect_err("no NodePort");
        assert!(matches!(err, BuildError::NoNodePort { .. }), "{err}");
    }

    #[test]
    fn bad_annotations_and_https_without_certificate() {
        let spec = one_path("web", json!({"number": 80}));
        for (annotation, value) in [
            (annotations::SCHEME, "public"),
            (annotations::LISTEN_PORTS, "[{\"HTTP\": \"x\"}]"),
            (annotations::TARGET_TYPE, "ip"),
            (annotations::HEALTHCHECK_PATH, "health"),
            (annotations::BACKEND_PROTOCOL, "TCP"),
            (annotations::INBOUND_CIDRS, "10.0.0.0"),
        ] {
            let err = error_of(json!({annotation: value}), spec.clone());
            assert!(
                err.to_string().contains(annotation),
                "{annotation}={value}: {err}"
            );
        }
        let err = error_of(
            json!({annotations::LISTEN_PORTS: r#"[{"HTTPS": 443}]"#}),
            spec.clone(),
        );
        assert_eq!(err, BuildError::CertificateRequired { port: 443 });
        assert!(err.to_string().contains(annotations::CERTIFICATE_ARN));
        // A Service's own annotation is checked too, and wins over the Ingress's.
        let mut services = services();
        let (_, mut web) = service("web", "NodePort", 30080);
        web.metadata.annotations = Some(BTreeMap::from([(
            annotations::HEALTHCHECK_PATH.to_string(),
            "/svc".to_string(),
        )]));
        services.insert("web".into(), web);
        let model = build(
            &ingress(json!({annotations::HEALTHCHECK_PATH: "/ing"}), spec),
            &services,
            &targets(),
            &settings(),
        )
        .expect("valid");
        assert_eq!(model.target_groups[0].health_check.path, "/svc");
    }

    #[test]
    fn security_groups_are_named_or_managed() {
        let spec = one_path("web", json!({"number": 80}));
        let model = build(
            &ingress(
                json!({annotations::SECURITY_GROUPS: "sg-1,clients",
                       annotations::INBOUND_CIDRS: "10.1.0.0/16"}),
                spec.clone(),
            ),
            &services(),
            &targets(),
            &settings(),
        )
        .expect("valid");
        // Named groups are used as they are; the CIDRs are for a managed group only.
        assert_eq!(
            model.security_groups,
            AlbSecurityGroups::Named(vec!["sg-1".into(), "clients".into()])
        );
        let model = build(
            &ingress(json!({annotations::INBOUND_CIDRS: "10.1.0.0/16"}), spec),
            &services(),
            &targets(),
            &settings(),
        )
        .expect("valid");
        assert_eq!(
            model.security_groups,
            AlbSecurityGroups::Managed {
                name: security_group_name("demo", "shop", "shop"),
                inbound_cidrs: vec!["10.1.0.0/16".into()],
            }
        );
        // The scheme is not in the group's name: switching it keeps the group.
        assert_ne!(
            security_group_name("demo", "shop", "shop"),
            security_group_name("demo", "shop", "web")
        );
    }

    #[test]
    fn backend_names_are_collected() {
        let names = backend_service_names(&ingress(
            json!({}),
            json!({"defaultBackend": {"service": {"name": "d", "port": {"number": 1}}},
                   "rules": two_hosts()["rules"].clone()}),
        ));
        assert_eq!(
            names.into_iter().collect::<Vec<_>>(),
            vec!["api", "d", "web"]
        );
    }

    #[test]
    fn names_are_sanitized_and_bounded() {
        let name = load_balancer_name("demo", "kube-system", "my.ingress-name", true);
        assert!(name.starts_with("k8s-kubesyst-myingres-"), "{name}");
        assert_eq!(name.len(), 32);
        assert_eq!(
            name,
            load_balancer_name("demo", "kube-system", "my.ingress-name", true)
        );
        assert_ne!(
            name,
            load_balancer_name("other", "kube-system", "my.ingress-name", true)
        );
    }
}
