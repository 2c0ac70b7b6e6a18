//! ELBv2 network load balancers for `type: LoadBalancer` Services, as cloud-provider-aws
//! makes them: one NLB per Service named from its UID, one TCP/UDP target group (instance
//! targets on the NodePort) and one listener per Service port, subnets discovered by the
//! `kubernetes.io/role/(internal-)elb` tags, everything tagged with the cluster and the
//! Service. Every object is looked up before it is created, so a call retried after a fault
//! never makes a second one (moto, like a lost reply on AWS, does not deduplicate).
//!
//! What to build is decided by pure functions ([`load_balancer_spec`], [`choose_subnets`],
//! [`plan_listeners`], [`target_diff`]); the [`LoadBalancers`] methods only carry it out.

use std::collections::{BTreeMap, BTreeSet};

use async_trait::async_trait;
use aws_sdk_elasticloadbalancingv2::types::{
    Action, ActionTypeEnum, Listener, LoadBalancer, LoadBalancerAttribute, LoadBalancerSchemeEnum,
    LoadBalancerTypeEnum, ProtocolEnum, Tag, TargetDescription, TargetGroup, TargetHealthStateEnum,
    TargetTypeEnum,
};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};

use super::instance_id_from_provider_id;
use super::{AwsCloud, cloud_error, missing};
use crate::provider::{CloudError, CloudResult, LoadBalancers};

/// `"true"` makes the load balancer internal (scheme `internal`, internal-elb subnets).
pub const ANNOTATION_INTERNAL: &str = "service.beta.kubernetes.io/aws-load-balancer-internal";
/// `nlb` or `external` (or absent): we make network load balancers only.
pub const ANNOTATION_TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-type";
/// The LB attribute `load_balancing.cross_zone.enabled`.
pub const ANNOTATION_CROSS_ZONE: &str =
    "service.beta.kubernetes.io/aws-load-balancer-cross-zone-load-balancing-enabled";
/// Health check protocol: `TCP`, `HTTP` or `HTTPS`.
pub const ANNOTATION_HC_PROTOCOL: &str =
    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-protocol";
/// Health check port: `traffic-port` or a number.
pub const ANNOTATION_HC_PORT: &str =
    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-port";
/// Health check path (HTTP and HTTPS only).
pub const ANNOTATION_HC_PATH: &str =
    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-path";
/// Seconds between health checks.
pub const ANNOTATION_HC_INTERVAL: &str =
    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval";
/// Seconds before a health check counts as failed.
pub const ANNOTATION_HC_TIMEOUT: &str =
    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-timeout";
/// Successes before a target counts as healthy.
pub const ANNOTATION_HC_HEALTHY: &str =
    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-healthy-threshold";
/// Failures before a target counts as unhealthy.
pub const ANNOTATION_HC_UNHEALTHY: &str =
    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-unhealthy-threshold";
/// Upstream's tag naming the Service (`<namespace>/<name>`) on every object made for it.
pub const SERVICE_NAME_TAG: &str = "kubernetes.io/service-name";
/// Subnet tag for internet-facing load balancers.
pub const ROLE_ELB_TAG: &str = "kubernetes.io/role/elb";
/// Subnet tag for internal load balancers.
pub const ROLE_INTERNAL_ELB_TAG: &str = "kubernetes.io/role/internal-elb";

/// Upstream's NLB health check defaults (cloud-provider-aws `defaultNlbHealthCheck*`).
const DEFAULT_HC_INTERVAL: i32 = 30;
const DEFAULT_HC_TIMEOUT: i32 = 10;
const DEFAULT_HC_THRESHOLD: i32 = 3;
const TRAFFIC_PORT: &str = "traffic-port";

/// Upstream's `cloudprovider.DefaultLoadBalancerName`: `a` + the UID without dashes, cut to
/// the 32 characters AWS allows.
pub fn load_balancer_name(uid: &str) -> String {
    let mut name: String = format!("a{}", uid.replace('-', ""));
    name.truncate(32);
    name
}

/// FNV-1a (64 bit): a stable hash for names, no dependency needed for it.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn truncated(text: &str, max: usize) -> &str {
    // Names and namespaces are DNS labels (ASCII), so a byte cut is a character cut.
    text.get(..max.min(text.len())).unwrap_or(text)
}

/// A target group's name (≤ 32 characters, unique per Service port): upstream's
/// `k8s-<namespace>-<name>-<hash>` with the hash over what fixes the group (UID, port,
/// NodePort, protocol), so a changed NodePort makes a new group and the old one is removed.
pub fn target_group_name(
    namespace: &str,
    name: &str,
    uid: &str,
    port: i32,
    node_port: i32,
    protocol: &str,
) -> String {
    let hash = fnv1a(&format!("{uid}:{port}:{node_port}:{protocol}:instance"));
    let hex = format!("{hash:016x}");
    format!(
        "k8s-{}-{}-{}",
        truncated(namespace, 8).trim_end_matches('-'),
        truncated(name, 8).trim_end_matches('-'),
        &hex[..10]
    )
}

/// One NLB health check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// `TCP`, `HTTP` or `HTTPS`.
    pub protocol: String,
    /// `traffic-port` or a port number.
    pub port: String,
    /// HTTP(S) path.
    pub path: Option<String>,
    /// Seconds between checks.
    pub interval: i32,
    /// Seconds a check may take.
    pub timeout: i32,
    /// Successes to become healthy.
    pub healthy_threshold: i32,
    /// Failures to become unhealthy.
    pub unhealthy_threshold: i32,
}

/// One Service port: its listener and target group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMapping {
    /// The listener's port (the Service port).
    pub port: i32,
    /// The targets' port (the NodePort).
    pub node_port: i32,
    /// `TCP` or `UDP`.
    pub protocol: String,
    /// The target group's name.
    pub target_group_name: String,
}

/// Everything the Service asks of its load balancer, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadBalancerSpec {
    /// The NLB's name.
    pub name: String,
    /// Scheme `internal` instead of `internet-facing`.
    pub internal: bool,
    /// Cross-zone load balancing.
    pub cross_zone: bool,
    /// The health check of every target group.
    pub health_check: HealthCheck,
    /// One per Service port.
    pub ports: Vec<PortMapping>,
    /// Tags of everything made for the Service.
    pub tags: BTreeMap<String, String>,
}

/// Go's `strconv.ParseBool`, which upstream uses for boolean annotations.
fn parse_bool(annotation: &str, value: &str) -> CloudResult<bool> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(CloudError::invalid(format!(
            "annotation {annotation}: {value:?} is not a boolean (want \"true\" or \"false\")"
        ))),
    }
}

fn parse_int(annotation: &str, value: &str, min: i32, max: i32) -> CloudResult<i32> {
    match value.trim().parse::<i32>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(CloudError::invalid(format!(
            "annotation {annotation}: {value:?} is not a whole number from {min} to {max}"
        ))),
    }
}

/// The Service's load balancer, from its spec and annotations; any invalid annotation is a
/// [`CloudError::invalid`] naming it, before anything is called.
pub fn load_balancer_spec(
    service: &Service,
    cluster_tag_key: &str,
) -> CloudResult<LoadBalancerSpec> {
    let metadata = &service.metadata;
    let uid = metadata
        .uid
        .as_deref()
        .filter(|uid| !uid.is_empty())
        .ok_or_else(|| CloudError::invalid("the Service has no UID yet"))?;
    let namespace = metadata.namespace.as_deref().unwrap_or("default");
    let name = metadata.name.as_deref().unwrap_or_default();
    let empty = BTreeMap::new();
    let annotations = metadata.annotations.as_ref().unwrap_or(&empty);
    let get = |key: &str| annotations.get(key).map(String::as_str);

    match get(ANNOTATION_TYPE) {
        None | Some("nlb") | Some("external") => {}
        Some(other) => {
            return Err(CloudError::invalid(format!(
                "annotation {ANNOTATION_TYPE}: {other:?} is not supported (this cloud makes network load balancers: \"nlb\")"
            )));
        }
    }
    let internal = match get(ANNOTATION_INTERNAL) {
        Some(value) => parse_bool(ANNOTATION_INTERNAL, value)?,
        None => false,
    };
    let cross_zone = match get(ANNOTATION_CROSS_ZONE) {
        Some(value) => parse_bool(ANNOTATION_CROSS_ZONE, value)?,
        None => false,
    };

    let spec = service.spec.as_ref();
    // externalTrafficPolicy Local: kube-proxy answers /healthz on the health check NodePort
    // only on nodes with a local endpoint, which is upstream's default check then.
    let local_check = spec
        .filter(|s| s.external_traffic_policy.as_deref() == Some("Local"))
        .and_then(|s| s.health_check_node_port)
        .filter(|port| *port > 0);
    let (default_protocol, default_port, default_path) = match local_check {
        Some(port) => ("HTTP".to_string(), port.to_string(), Some("/healthz")),
        None => ("TCP".to_string(), TRAFFIC_PORT.to_string(), None),
    };
    let protocol = match get(ANNOTATION_HC_PROTOCOL) {
        None => default_protocol,
        Some(value) => match value.to_ascii_uppercase().as_str() {
            p @ ("TCP" | "HTTP" | "HTTPS") => p.to_string(),
            _ => {
                return Err(CloudError::invalid(format!(
                    "annotation {ANNOTATION_HC_PROTOCOL}: {value:?} is not TCP, HTTP or HTTPS"
                )));
            }
        },
    };
    let port = match get(ANNOTATION_HC_PORT) {
        None => default_port,
        Some(TRAFFIC_PORT) => TRAFFIC_PORT.to_string(),
        Some(value) => parse_int(ANNOTATION_HC_PORT, value, 1, 65535)?.to_string(),
    };
    let path = if protocol == "TCP" {
        None
    } else {
        match get(ANNOTATION_HC_PATH) {
            Some(path) if path.starts_with('/') => Some(path.to_string()),
            Some(path) => {
                return Err(CloudError::invalid(format!(
                    "annotation {ANNOTATION_HC_PATH}: {path:?} does not start with \"/\""
                )));
            }
            None => Some(default_path.unwrap_or("/").to_string()),
        }
    };
    let number = |key: &str, default: i32, min: i32, max: i32| match get(key) {
        Some(value) => parse_int(key, value, min, max),
        None => Ok(default),
    };
    // AWS's limits for network load balancer target groups.
    let health_check = HealthCheck {
        protocol,
        port,
        path,
        interval: number(ANNOTATION_HC_INTERVAL, DEFAULT_HC_INTERVAL, 5, 300)?,
        timeout: number(ANNOTATION_HC_TIMEOUT, DEFAULT_HC_TIMEOUT, 2, 120)?,
        healthy_threshold: number(ANNOTATION_HC_HEALTHY, DEFAULT_HC_THRESHOLD, 2, 10)?,
        unhealthy_threshold: number(ANNOTATION_HC_UNHEALTHY, DEFAULT_HC_THRESHOLD, 2, 10)?,
    };

    let mut ports = Vec::new();
    for service_port in spec.and_then(|s| s.ports.as_deref()).unwrap_or_default() {
        let protocol = service_port.protocol.as_deref().unwrap_or("TCP");
        if !matches!(protocol, "TCP" | "UDP") {
            return Err(CloudError::invalid(format!(
                "port {}: protocol {protocol} is not supported by network load balancers (TCP or UDP)",
                service_port.port
            )));
        }
        let node_port = service_port.node_port.filter(|p| *p > 0).ok_or_else(|| {
            CloudError::invalid(format!(
                "port {} has no nodePort (allocateLoadBalancerNodePorts: false is not supported)",
                service_port.port
            ))
        })?;
        ports.push(PortMapping {
            port: service_port.port,
            node_port,
            protocol: protocol.to_string(),
            target_group_name: target_group_name(
                namespace,
                name,
                uid,
                service_port.port,
                node_port,
                protocol,
            ),
        });
    }
    if ports.is_empty() {
        return Err(CloudError::invalid("the Service has no ports"));
    }
    let tags = BTreeMap::from([
        (cluster_tag_key.to_string(), "owned".to_string()),
        (SERVICE_NAME_TAG.to_string(), format!("{namespace}/{name}")),
    ]);
    Ok(LoadBalancerSpec {
        name: load_balancer_name(uid),
        internal,
        cross_zone,
        health_check,
        ports,
        tags,
    })
}

/// A subnet as subnet discovery sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubnetInfo {
    /// Subnet id.
    pub id: String,
    /// Availability zone.
    pub zone: String,
    /// Tags.
    pub tags: BTreeMap<String, String>,
}

/// Upstream's `findELBSubnets`: subnets carrying the role tag (`kubernetes.io/role/elb`, or
/// `…/internal-elb` for internal load balancers), not tagged for another cluster, one per
/// zone — preferring the one tagged for this cluster, then the lowest id — in zone order.
pub fn choose_subnets(
    subnets: &[SubnetInfo],
    cluster_tag_key: &str,
    internal: bool,
) -> Vec<String> {
    let role = if internal {
        ROLE_INTERNAL_ELB_TAG
    } else {
        ROLE_ELB_TAG
    };
    let mut by_zone: BTreeMap<&str, &SubnetInfo> = BTreeMap::new();
    for subnet in subnets {
        let ours = subnet.tags.contains_key(cluster_tag_key);
        let other_cluster = subnet
            .tags
            .keys()
            .any(|k| k.starts_with("kubernetes.io/cluster/") && k != cluster_tag_key);
        if !subnet.tags.contains_key(role) || (other_cluster && !ours) {
            continue;
        }
        let better = match by_zone.get(subnet.zone.as_str()) {
            None => true,
            Some(existing) => {
                let existing_ours = existing.tags.contains_key(cluster_tag_key);
                if ours != existing_ours {
                    ours
                } else {
                    subnet.id < existing.id
                }
            }
        };
        if better {
            by_zone.insert(&subnet.zone, subnet);
        }
    }
    by_zone.values().map(|s| s.id.clone()).collect()
}

/// An existing listener: ARN, port and the target group it forwards to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExistingListener {
    /// Listener ARN.
    pub arn: String,
    /// Port.
    pub port: i32,
    /// Protocol (`TCP`, `UDP`…).
    pub protocol: String,
    /// The forward action's target group.
    pub target_group_arn: Option<String>,
}

/// A wanted listener: port, protocol and target group ARN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantedListener {
    /// Port.
    pub port: i32,
    /// Protocol.
    pub protocol: String,
    /// Target group ARN.
    pub target_group_arn: String,
}

/// What to change to go from the existing listeners to the wanted ones.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListenerPlan {
    /// Listeners to create.
    pub create: Vec<WantedListener>,
    /// `(listener ARN, new target group ARN)`: same port and protocol, other group.
    pub modify: Vec<(String, String)>,
    /// Listener ARNs to delete (ports gone, a changed protocol, or duplicates).
    pub delete: Vec<String>,
}

/// The listener changes: one listener per wanted port, forwarding to its group.
pub fn plan_listeners(existing: &[ExistingListener], wanted: &[WantedListener]) -> ListenerPlan {
    let mut plan = ListenerPlan::default();
    let mut kept: BTreeSet<i32> = BTreeSet::new();
    for listener in existing {
        let want = wanted
            .iter()
            .find(|w| w.port == listener.port && w.protocol == listener.protocol);
        match want {
            Some(want) if kept.insert(want.port) => {
                if listener.target_group_arn.as_deref() != Some(want.target_group_arn.as_str()) {
                    plan.modify
                        .push((listener.arn.clone(), want.target_group_arn.clone()));
                }
            }
            _ => plan.delete.push(listener.arn.clone()),
        }
    }
    plan.create = wanted
        .iter()
        .filter(|w| !kept.contains(&w.port))
        .cloned()
        .collect();
    plan
}

/// `(register, deregister)`: the instances to add to and remove from a target group so that
/// exactly `wanted` are registered.
pub fn target_diff(
    registered: &BTreeSet<String>,
    wanted: &BTreeSet<String>,
) -> (Vec<String>, Vec<String>) {
    (
        wanted.difference(registered).cloned().collect(),
        registered.difference(wanted).cloned().collect(),
    )
}

/// The instance ids behind `nodes` (Nodes without an AWS provider ID are left out: they
/// have no instance to target yet).
pub fn node_instance_ids(nodes: &[Node]) -> BTreeSet<String> {
    nodes
        .iter()
        .filter_map(|node| node.spec.as_ref()?.provider_id.as_deref())
        .filter_map(instance_id_from_provider_id)
        .map(str::to_string)
        .collect()
}

fn tags_of(spec: &LoadBalancerSpec) -> Vec<Tag> {
    spec.tags
        .iter()
        .map(|(key, value)| Tag::builder().key(key).value(value).build())
        .collect()
}

fn status_of(load_balancer: &LoadBalancer) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: load_balancer.dns_name().map(|hostname| {
            vec![LoadBalancerIngress {
                hostname: Some(hostname.to_string()),
                ..Default::default()
            }]
        }),
    }
}

/// `Ok(())` for the error codes that mean "already gone".
pub(super) fn tolerate_gone(result: CloudResult<()>, codes: &[&str]) -> CloudResult<()> {
    match result {
        Err(err) if codes.contains(&err.code.as_str()) => Ok(()),
        other => other,
    }
}

fn health_check_matches(group: &TargetGroup, check: &HealthCheck) -> bool {
    group.health_check_protocol().map(|p| p.as_str()) == Some(check.protocol.as_str())
        && group.health_check_port() == Some(check.port.as_str())
        && (check.path.is_none() || group.health_check_path() == check.path.as_deref())
        && group.health_check_interval_seconds() == Some(check.interval)
        && group.health_check_timeout_seconds() == Some(check.timeout)
        && group.healthy_threshold_count() == Some(check.healthy_threshold)
        && group.unhealthy_threshold_count() == Some(check.unhealthy_threshold)
}

impl AwsCloud {
    /// Every load balancer named `name`, oldest first (AWS has at most one; moto may hold
    /// several after a create it did not deduplicate).
    pub(super) async fn load_balancers_named(&self, name: &str) -> CloudResult<Vec<LoadBalancer>> {
        match self.elb.describe_load_balancers().names(name).send().await {
            Ok(answer) => {
                let mut found = answer.load_balancers().to_vec();
                found.sort_by(|a, b| {
                    let key = |lb: &LoadBalancer| {
                        (
                            lb.created_time().map(|t| (t.secs(), t.subsec_nanos())),
                            lb.load_balancer_arn().unwrap_or_default().to_string(),
                        )
                    };
                    key(a).cmp(&key(b))
                });
                Ok(found)
            }
            Err(err) => {
                let err = cloud_error(err);
                if err.code == "LoadBalancerNotFound" {
                    Ok(Vec::new())
                } else {
                    Err(err)
                }
            }
        }
    }

    /// The Service's load balancer; extra ones of the same name (a duplicate create) are
    /// deleted so that exactly one is left.
    pub(super) async fn find_load_balancer(&self, name: &str) -> CloudResult<Option<LoadBalancer>> {
        let mut found = self.load_balancers_named(name).await?;
        if found.is_empty() {
            return Ok(None);
        }
        let keep = found.remove(0);
        for extra in found {
            if let Some(arn) = extra.load_balancer_arn() {
                tracing::warn!(%name, %arn, "deleting a duplicate load balancer");
                self.delete_load_balancer_tree(arn).await?;
            }
        }
        Ok(Some(keep))
    }

    /// The candidate subnets: those of the cluster's VPC, else those tagged for the cluster,
    /// plus the cluster's configured subnets.
    pub(super) async fn candidate_subnets(&self) -> CloudResult<Vec<SubnetInfo>> {
        let settings = &self.settings;
        let mut requests = Vec::new();
        let filter = |name: &str, value: &str| {
            aws_sdk_ec2::types::Filter::builder()
                .name(name)
                .values(value)
                .build()
        };
        match &settings.vpc_id {
            Some(vpc) => requests.push(self.ec2.describe_subnets().filters(filter("vpc-id", vpc))),
            None => requests.push(
                self.ec2
                    .describe_subnets()
                    .filters(filter("tag-key", &settings.cluster_tag_key())),
            ),
        }
        if settings.vpc_id.is_none() && !settings.subnet_ids.is_empty() {
            requests.push(
                self.ec2
                    .describe_subnets()
                    .set_subnet_ids(Some(settings.subnet_ids.clone())),
            );
        }
        let mut found: BTreeMap<String, SubnetInfo> = BTreeMap::new();
        for request in requests {
            let answer = request.send().await.map_err(cloud_error)?;
            for subnet in answer.subnets() {
                let (Some(id), Some(zone)) = (subnet.subnet_id(), subnet.availability_zone())
                else {
                    continue;
                };
                let tags = subnet
                    .tags()
                    .iter()
                    .filter_map(|t| {
                        Some((t.key()?.to_string(), t.value().unwrap_or("").to_string()))
                    })
                    .collect();
                found.insert(
                    id.to_string(),
                    SubnetInfo {
                        id: id.to_string(),
                        zone: zone.to_string(),
                        tags,
                    },
                );
            }
        }
        Ok(found.into_values().collect())
    }

    async fn create_load_balancer(&self, spec: &LoadBalancerSpec) -> CloudResult<LoadBalancer> {
        let candidates = self.candidate_subnets().await?;
        let subnets = choose_subnets(&candidates, &self.settings.cluster_tag_key(), spec.internal);
        if subnets.is_empty() {
            let role = if spec.internal {
                ROLE_INTERNAL_ELB_TAG
            } else {
                ROLE_ELB_TAG
            };
            return Err(CloudError::invalid(format!(
                "no subnet for the load balancer: none of the cluster's subnets ({}) is tagged {role}",
                self.settings
                    .vpc_id
                    .as_deref()
                    .map(|vpc| format!("in VPC {vpc}"))
                    .unwrap_or_else(|| format!("tagged {}", self.settings.cluster_tag_key()))
            )));
        }
        let scheme = if spec.internal {
            LoadBalancerSchemeEnum::Internal
        } else {
            LoadBalancerSchemeEnum::InternetFacing
        };
        let answer = self
            .elb
            .create_load_balancer()
            .name(&spec.name)
            .r#type(LoadBalancerTypeEnum::Network)
            .scheme(scheme)
            .set_subnets(Some(subnets))
            .set_tags(Some(tags_of(spec)))
            .send()
            .await
            .map_err(cloud_error)?;
        tracing::info!(name = %spec.name, "created network load balancer");
        answer
            .load_balancers()
            .first()
            .cloned()
            .ok_or_else(|| missing("the new load balancer"))
    }

    pub(super) async fn target_group_named(&self, name: &str) -> CloudResult<Option<TargetGroup>> {
        match self.elb.describe_target_groups().names(name).send().await {
            Ok(answer) => Ok(answer.target_groups().first().cloned()),
            Err(err) => {
                let err = cloud_error(err);
                if err.code == "TargetGroupNotFound" {
                    Ok(None)
                } else {
                    Err(err)
                }
            }
        }
    }

    /// The port's target group, created or its health check brought up to date.
    async fn ensure_target_group(
        &self,
        spec: &LoadBalancerSpec,
        mapping: &PortMapping,
        vpc_id: &str,
    ) -> CloudResult<String> {
        let check = &spec.health_check;
        let protocol = ProtocolEnum::from(mapping.protocol.as_str());
        let check_protocol = ProtocolEnum::from(check.protocol.as_str());
        if let Some(group) = self.target_group_named(&mapping.target_group_name).await? {
            let arn = group
                .target_group_arn()
                .ok_or_else(|| missing("a target group ARN"))?
                .to_string();
            if !health_check_matches(&group, check) {
                self.elb
                    .modify_target_group()
                    .target_group_arn(&arn)
                    .health_check_protocol(check_protocol)
                    .health_check_port(&check.port)
                    .set_health_check_path(check.path.clone())
                    .health_check_interval_seconds(check.interval)
                    .health_check_timeout_seconds(check.timeout)
                    .healthy_threshold_count(check.healthy_threshold)
                    .unhealthy_threshold_count(check.unhealthy_threshold)
                    .send()
                    .await
                    .map_err(cloud_error)?;
            }
            return Ok(arn);
        }
        let answer = self
            .elb
            .create_target_group()
            .name(&mapping.target_group_name)
            .protocol(protocol)
            .port(mapping.node_port)
            .vpc_id(vpc_id)
            .target_type(TargetTypeEnum::Instance)
            .health_check_protocol(check_protocol)
            .health_check_port(&check.port)
            .set_health_check_path(check.path.clone())
            .health_check_interval_seconds(check.interval)
            .health_check_timeout_seconds(check.timeout)
            .healthy_threshold_count(check.healthy_threshold)
            .unhealthy_threshold_count(check.unhealthy_threshold)
            .set_tags(Some(tags_of(spec)))
            .send()
            .await
            .map_err(cloud_error)?;
        answer
            .target_groups()
            .first()
            .and_then(|g| g.target_group_arn())
            .map(str::to_string)
            .ok_or_else(|| missing("the new target group"))
    }

    /// Registers and deregisters so that exactly `wanted` are the group's targets.
    pub(super) async fn sync_targets(
        &self,
        group_arn: &str,
        node_port: i32,
        wanted: &BTreeSet<String>,
    ) -> CloudResult<()> {
        let health = self
            .elb
            .describe_target_health()
            .target_group_arn(group_arn)
            .send()
            .await
            .map_err(cloud_error)?;
        let registered: BTreeSet<String> = health
            .target_health_descriptions()
            .iter()
            // A draining target is on its way out already (AWS does that for terminated
            // instances); deregistering it again is refused.
            .filter(|d| {
                !matches!(
                    d.target_health().and_then(|h| h.state()),
                    Some(TargetHealthStateEnum::Draining)
                )
            })
            .filter_map(|d| d.target()?.id().map(str::to_string))
            .collect();
        let (register, deregister) = target_diff(&registered, wanted);
        let targets = |ids: &[String]| {
            ids.iter()
                .map(|id| TargetDescription::builder().id(id).port(node_port).build())
                .collect::<Vec<_>>()
        };
        if !register.is_empty() {
            self.elb
                .register_targets()
                .target_group_arn(group_arn)
                .set_targets(Some(targets(&register)))
                .send()
                .await
                .map_err(cloud_error)?;
            tracing::info!(group = %group_arn, instances = ?register, "registered targets");
        }
        if !deregister.is_empty() {
            let result = self
                .elb
                .deregister_targets()
                .target_group_arn(group_arn)
                .set_targets(Some(targets(&deregister)))
                .send()
                .await
                .map(|_| ())
                .map_err(cloud_error);
            tolerate_gone(result, &["InvalidTarget"])?;
            tracing::info!(group = %group_arn, instances = ?deregister, "deregistered targets");
        }
        Ok(())
    }

    /// Every listener of the load balancer, page by page; none when it is gone.
    pub(super) async fn full_listeners_of(
        &self,
        load_balancer_arn: &str,
    ) -> CloudResult<Vec<Listener>> {
        let mut listeners = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let answer = match self
                .elb
                .describe_listeners()
                .load_balancer_arn(load_balancer_arn)
                .set_marker(marker.clone())
                .send()
                .await
            {
                Ok(answer) => answer,
                Err(err) => {
                    let err = cloud_error(err);
                    if err.code == "LoadBalancerNotFound" || err.code == "ListenerNotFound" {
                        return Ok(Vec::new());
                    }
                    return Err(err);
                }
            };
            listeners.extend(answer.listeners().to_vec());
            match answer.next_marker() {
                Some(next) if !next.is_empty() && marker.as_deref() != Some(next) => {
                    marker = Some(next.to_string());
                }
                _ => return Ok(listeners),
            }
        }
    }

    async fn listeners_of(&self, load_balancer_arn: &str) -> CloudResult<Vec<ExistingListener>> {
        let listeners = self.full_listeners_of(load_balancer_arn).await?;
        Ok(listeners
            .iter()
            .filter_map(|l| {
                Some(ExistingListener {
                    arn: l.listener_arn()?.to_string(),
                    port: l.port()?,
                    protocol: l
                        .protocol()
                        .map(|p| p.as_str().to_string())
                        .unwrap_or_default(),
                    target_group_arn: l
                        .default_actions()
                        .iter()
                        .find_map(|a| a.target_group_arn())
                        .map(str::to_string),
                })
            })
            .collect())
    }

    /// The ARNs of the target groups attached to the load balancer.
    async fn target_groups_of(&self, load_balancer_arn: &str) -> CloudResult<Vec<String>> {
        match self
            .elb
            .describe_target_groups()
            .load_balancer_arn(load_balancer_arn)
            .send()
            .await
        {
            Ok(answer) => Ok(answer
                .target_groups()
                .iter()
                .filter_map(|g| g.target_group_arn().map(str::to_string))
                .collect()),
            Err(err) => {
                let err = cloud_error(err);
                if err.code == "LoadBalancerNotFound" || err.code == "TargetGroupNotFound" {
                    Ok(Vec::new())
                } else {
                    Err(err)
                }
            }
        }
    }

    pub(super) async fn delete_target_group(&self, arn: &str) -> CloudResult<()> {
        let result = self
            .elb
            .delete_target_group()
            .target_group_arn(arn)
            .send()
            .await
            .map(|_| ())
            .map_err(cloud_error);
        tolerate_gone(result, &["TargetGroupNotFound"])
    }

    pub(super) async fn delete_listener(&self, arn: &str) -> CloudResult<()> {
        let result = self
            .elb
            .delete_listener()
            .listener_arn(arn)
            .send()
            .await
            .map(|_| ())
            .map_err(cloud_error);
        tolerate_gone(result, &["ListenerNotFound"])
    }

    /// Listeners, then the target groups they used, then the load balancer.
    pub(super) async fn delete_load_balancer_tree(&self, arn: &str) -> CloudResult<()> {
        let groups = self.target_groups_of(arn).await?;
        for listener in self.listeners_of(arn).await? {
            self.delete_listener(&listener.arn).await?;
        }
        for group in groups {
            self.delete_target_group(&group).await?;
        }
        let result = self
            .elb
            .delete_load_balancer()
            .load_balancer_arn(arn)
            .send()
            .await
            .map(|_| ())
            .map_err(cloud_error);
        tolerate_gone(result, &["LoadBalancerNotFound"])
    }

    /// Target groups carrying the Service's tags that no listener holds (left by a changed
    /// NodePort or a failure between creating a group and its listener).
    pub(super) async fn tagged_target_groups(
        &self,
        tags: &BTreeMap<String, String>,
    ) -> CloudResult<Vec<String>> {
        let mut arns = Vec::new();
        let mut pages = self.elb.describe_target_groups().into_paginator().send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(cloud_error)?;
            arns.extend(
                page.target_groups()
                    .iter()
                    .filter_map(|g| g.target_group_arn().map(str::to_string)),
            );
        }
        self.carrying_tags(&arns, tags).await
    }
}

#[async_trait]
impl LoadBalancers for AwsCloud {
    async fn get_load_balancer(
        &self,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        let Some(uid) = service.metadata.uid.as_deref() else {
            return Ok(None);
        };
        Ok(self
            .load_balancers_named(&load_balancer_name(uid))
            .await?
            .first()
            .map(status_of))
    }

    async fn ensure_load_balancer(
        &self,
        service: &Service,
        nodes: &[Node],
    ) -> CloudResult<LoadBalancerStatus> {
        // Validated before any call: an invalid Service creates nothing.
        let spec = load_balancer_spec(service, &self.settings.cluster_tag_key())?;
        let mut load_balancer = self.find_load_balancer(&spec.name).await?;
        let wanted_scheme = if spec.internal {
            LoadBalancerSchemeEnum::Internal
        } else {
            LoadBalancerSchemeEnum::InternetFacing
        };
        if let Some(existing) = &load_balancer
            && existing.scheme().is_some_and(|s| *s != wanted_scheme)
            && let Some(arn) = existing.load_balancer_arn()
        {
            // The scheme cannot be changed in place (upstream recreates the NLB too).
            tracing::info!(name = %spec.name, "scheme changed: recreating the load balancer");
            self.delete_load_balancer_tree(arn).await?;
            load_balancer = None;
        }
        let load_balancer = match load_balancer {
            Some(existing) => existing,
            None => self.create_load_balancer(&spec).await?,
        };
        let arn = load_balancer
            .load_balancer_arn()
            .ok_or_else(|| missing("a load balancer ARN"))?
            .to_string();
        let vpc_id = match (load_balancer.vpc_id(), &self.settings.vpc_id) {
            (Some(vpc), _) => vpc.to_string(),
            (None, Some(vpc)) => vpc.clone(),
            (None, None) => return Err(missing("the load balancer's VPC")),
        };
        self.elb
            .modify_load_balancer_attributes()
            .load_balancer_arn(&arn)
            .attributes(
                LoadBalancerAttribute::builder()
                    .key("load_balancing.cross_zone.enabled")
                    .value(spec.cross_zone.to_string())
                    .build(),
            )
            .send()
            .await
            .map_err(cloud_error)?;

        let instances = node_instance_ids(nodes);
        let attached_before = self.target_groups_of(&arn).await?;
        let mut wanted = Vec::new();
        for mapping in &spec.ports {
            let group = self.ensure_target_group(&spec, mapping, &vpc_id).await?;
            self.sync_targets(&group, mapping.node_port, &instances)
                .await?;
            wanted.push(WantedListener {
                port: mapping.port,
                protocol: mapping.protocol.clone(),
                target_group_arn: group,
            });
        }
        let plan = plan_listeners(&self.listeners_of(&arn).await?, &wanted);
        for listener in &plan.delete {
            self.delete_listener(listener).await?;
        }
        for (listener, group) in &plan.modify {
            self.elb
                .modify_listener()
                .listener_arn(listener)
                .default_actions(
                    Action::builder()
                        .r#type(ActionTypeEnum::Forward)
                        .target_group_arn(group)
                        .build(),
                )
                .send()
                .await
                .map_err(cloud_error)?;
        }
        for listener in &plan.create {
            self.elb
                .create_listener()
                .load_balancer_arn(&arn)
                .protocol(ProtocolEnum::from(listener.protocol.as_str()))
                .port(listener.port)
                .default_actions(
                    Action::builder()
                        .r#type(ActionTypeEnum::Forward)
                        .target_group_arn(&listener.target_group_arn)
                        .build(),
                )
                .send()
                .await
                .map_err(cloud_error)?;
        }
        // Groups no listener forwards to any more (a port removed, a NodePort changed).
        for group in attached_before {
            if !wanted.iter().any(|w| w.target_group_arn == group) {
                self.delete_target_group(&group).await?;
            }
        }
        Ok(status_of(&load_balancer))
    }

    async fn update_load_balancer(&self, service: &Service, nodes: &[Node]) -> CloudResult<()> {
        let spec = load_balancer_spec(service, &self.settings.cluster_tag_key())?;
        let instances = node_instance_ids(nodes);
        let mut groups = Vec::new();
        for mapping in &spec.ports {
            match self.target_group_named(&mapping.target_group_name).await? {
                Some(group) => groups.push((group, mapping.node_port)),
                // Something is missing: only a full ensure can fix that.
                None => return self.ensure_load_balancer(service, nodes).await.map(|_| ()),
            }
        }
        for (group, node_port) in groups {
            let arn = group
                .target_group_arn()
                .ok_or_else(|| missing("a target group ARN"))?;
            self.sync_targets(arn, node_port, &instances).await?;
        }
        Ok(())
    }

    async fn ensure_load_balancer_deleted(&self, service: &Service) -> CloudResult<()> {
        let Some(uid) = service.metadata.uid.as_deref() else {
            return Ok(());
        };
        for load_balancer in self.load_balancers_named(&load_balancer_name(uid)).await? {
            if let Some(arn) = load_balancer.load_balancer_arn() {
                self.delete_load_balancer_tree(arn).await?;
                tracing::info!(name = %load_balancer_name(uid), "deleted network load balancer");
            }
        }
        // Groups never attached (or detached) are found by the Service's tags.
        let namespace = service.metadata.namespace.as_deref().unwrap_or("default");
        let name = service.metadata.name.as_deref().unwrap_or_default();
        let tags = BTreeMap::from([
            (self.settings.cluster_tag_key(), "owned".to_string()),
            (SERVICE_NAME_TAG.to_string(), format!("{namespace}/{name}")),
        ]);
        for group in self.tagged_target_groups(&tags).await? {
            self.delete_target_group(&group).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(annotations: serde_json::Value, spec: serde_json::Value) -> Service {
        let mut spec = spec;
        if spec.get("ports").is_none() {
            spec["ports"] = json!([
                {"name": "http", "port": 80, "nodePort": 30080},
                {"name": "https", "port": 443, "nodePort": 30443, "protocol": "TCP"},
            ]);
        }
        serde_json::from_value(json!({
            "metadata": {
                "name": "web", "namespace": "shop",
                "uid": "6b1c0f0e-3f4a-4c59-9d27-0c5e8e5a1b2c",
                "annotations": annotations,
            },
            "spec": spec,
        }))
        .expect("a service")
    }

    const CLUSTER: &str = "kubernetes.io/cluster/demo";

    #[test]
    fn names_follow_upstream() {
        let name = load_balancer_name("6b1c0f0e-3f4a-4c59-9d27-0c5e8e5a1b2c");
        assert_eq!(name, "a6b1c0f0e3f4a4c599d270c5e8e5a1b2");
        assert_eq!(name.len(), 32);
        assert_eq!(load_balancer_name("ab-cd"), "aabcd");
        let group = target_group_name("kube-system-long", "my-service-x", "u", 80, 30080, "TCP");
        assert!(group.starts_with("k8s-kube-sys-my-servi-"), "{group}");
        assert_eq!(group.len(), 32);
        // Stable, and different for another NodePort.
        assert_eq!(
            group,
            target_group_name("kube-system-long", "my-service-x", "u", 80, 30080, "TCP")
        );
        assert_ne!(
            group,
            target_group_name("kube-system-long", "my-service-x", "u", 80, 30081, "TCP")
        );
        // A cut ending in a dash does not leave a double dash.
        assert!(!target_group_name("abcdefg-x", "n", "u", 1, 2, "TCP").contains("--"));
    }

    #[test]
    fn defaults_are_an_internet_facing_tcp_checked_nlb() {
        let spec = load_balancer_spec(&service(json!({}), json!({})), CLUSTER).expect("valid");
        assert!(!spec.internal);
        assert!(!spec.cross_zone);
        assert_eq!(
            spec.health_check,
            HealthCheck {
                protocol: "TCP".into(),
                port: "traffic-port".into(),
                path: None,
                interval: 30,
                timeout: 10,
                healthy_threshold: 3,
                unhealthy_threshold: 3,
            }
        );
        assert_eq!(
            spec.ports
                .iter()
                .map(|p| (p.port, p.node_port, p.protocol.as_str()))
                .collect::<Vec<_>>(),
            vec![(80, 30080, "TCP"), (443, 30443, "TCP")]
        );
        assert_eq!(spec.tags[CLUSTER], "owned");
        assert_eq!(spec.tags[SERVICE_NAME_TAG], "shop/web");
    }

    #[test]
    fn annotations_are_parsed() {
        let spec = load_balancer_spec(
            &service(
                json!({
                    ANNOTATION_INTERNAL: "true",
                    ANNOTATION_TYPE: "nlb",
                    ANNOTATION_CROSS_ZONE: "true",
                    ANNOTATION_HC_PROTOCOL: "http",
                    ANNOTATION_HC_PORT: "8080",
                    ANNOTATION_HC_PATH: "/ready",
                    ANNOTATION_HC_INTERVAL: "10",
                    ANNOTATION_HC_TIMEOUT: "6",
                    ANNOTATION_HC_HEALTHY: "2",
                    ANNOTATION_HC_UNHEALTHY: "4",
                }),
                json!({}),
            ),
            CLUSTER,
        )
        .expect("valid");
        assert!(spec.internal && spec.cross_zone);
        assert_eq!(
            spec.health_check,
            HealthCheck {
                protocol: "HTTP".into(),
                port: "8080".into(),
                path: Some("/ready".into()),
                interval: 10,
                timeout: 6,
                healthy_threshold: 2,
                unhealthy_threshold: 4,
            }
        );
    }

    #[test]
    fn local_traffic_policy_checks_the_health_check_node_port() {
        let spec = load_balancer_spec(
            &service(
                json!({}),
                json!({"externalTrafficPolicy": "Local", "healthCheckNodePort": 31999}),
            ),
            CLUSTER,
        )
        .expect("valid");
        assert_eq!(spec.health_check.protocol, "HTTP");
        assert_eq!(spec.health_check.port, "31999");
        assert_eq!(spec.health_check.path.as_deref(), Some("/healthz"));
    }

    #[test]
    fn invalid_annotations_are_refused_by_name() {
        let cases = [
            (ANNOTATION_HC_INTERVAL, "abc"),
            (ANNOTATION_HC_INTERVAL, "1"),
            (ANNOTATION_HC_TIMEOUT, "-3"),
            (ANNOTATION_HC_HEALTHY, "11"),
            (ANNOTATION_HC_UNHEALTHY, "x"),
            (ANNOTATION_HC_PORT, "70000"),
            (ANNOTATION_HC_PROTOCOL, "UDP"),
            (ANNOTATION_INTERNAL, "maybe"),
            (ANNOTATION_CROSS_ZONE, "yes"),
            (ANNOTATION_TYPE, "classic"),
            (ANNOTATION_TYPE, "alb"),
        ];
        for (annotation, value) in cases {
            let err = load_balancer_spec(&service(json!({annotation: value}), json!({})), CLUSTER)
                .expect_err(&format!("{annotation}={value} must be refused"));
            assert_eq!(err.code, "InvalidParameterValue");
            assert!(!err.retryable);
            assert!(
                err.message.contains(annotation),
                "{annotation}={value}: {}",
                err.message
            );
        }
        let err = load_balancer_spec(
            &service(
                json!({ANNOTATION_HC_PROTOCOL: "HTTP", ANNOTATION_HC_PATH: "ready"}),
                json!({}),
            ),
            CLUSTER,
        )
        .expect_err("a relative path");
        assert!(err.message.contains(ANNOTATION_HC_PATH));
    }

    #[test]
    fn ports_need_a_node_port_and_a_supported_protocol() {
        let no_node_port = service(json!({}), json!({"ports": [{"port": 80}]}));
        assert!(load_balancer_spec(&no_node_port, CLUSTER).is_err());
        let sctp = service(
            json!({}),
            json!({"ports": [{"port": 80, "nodePort": 30000, "protocol": "SCTP"}]}),
        );
        assert!(load_balancer_spec(&sctp, CLUSTER).is_err());
        let udp = service(
            json!({}),
            json!({"ports": [{"port": 53, "nodePort": 30053, "protocol": "UDP"}]}),
        );
        assert_eq!(
            load_balancer_spec(&udp, CLUSTER).expect("udp").ports[0].protocol,
            "UDP"
        );
    }

    fn subnet(id: &str, zone: &str, tags: &[(&str, &str)]) -> SubnetInfo {
        SubnetInfo {
            id: id.into(),
            zone: zone.into(),
            tags: tags
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn subnets_one_per_zone_by_role_tag() {
        let subnets = [
            subnet("subnet-b", "us-east-1a", &[(ROLE_ELB_TAG, "1")]),
            subnet("subnet-a", "us-east-1a", &[(ROLE_ELB_TAG, "1")]),
            subnet("subnet-c", "us-east-1b", &[(ROLE_ELB_TAG, "1")]),
            subnet("subnet-d", "us-east-1c", &[(ROLE_INTERNAL_ELB_TAG, "1")]),
            subnet("subnet-e", "us-east-1d", &[]),
            // Tagged for another cluster only: not ours to use.
            subnet(
                "subnet-f",
                "us-east-1e",
                &[
                    (ROLE_ELB_TAG, "1"),
                    ("kubernetes.io/cluster/other", "owned"),
                ],
            ),
            // The cluster's own tag wins over a lower id.
            subnet(
                "subnet-z",
                "us-east-1b",
                &[(ROLE_ELB_TAG, ""), (CLUSTER, "shared")],
            ),
        ];
        let cases: [(bool, Vec<&str>); 2] = [
            (false, vec!["subnet-a", "subnet-z"]),
            (true, vec!["subnet-d"]),
        ];
        for (internal, want) in cases {
            assert_eq!(
                choose_subnets(&subnets, CLUSTER, internal),
                want,
                "internal={internal}"
            );
        }
        assert!(choose_subnets(&[subnet("s", "z", &[])], CLUSTER, false).is_empty());
    }

    fn existing(arn: &str, port: i32, group: &str) -> ExistingListener {
        ExistingListener {
            arn: arn.into(),
            port,
            protocol: "TCP".into(),
            target_group_arn: Some(group.into()),
        }
    }

    fn wanted(port: i32, group: &str) -> WantedListener {
        WantedListener {
            port,
            protocol: "TCP".into(),
            target_group_arn: group.into(),
        }
    }

    #[test]
    fn listener_plans() {
        // Nothing yet: create both.
        let plan = plan_listeners(&[], &[wanted(80, "g1"), wanted(443, "g2")]);
        assert_eq!(plan.create.len(), 2);
        assert!(plan.modify.is_empty() && plan.delete.is_empty());
        // Up to date: nothing to do.
        let plan = plan_listeners(
            &[existing("l1", 80, "g1"), existing("l2", 443, "g2")],
            &[wanted(80, "g1"), wanted(443, "g2")],
        );
        assert_eq!(plan, ListenerPlan::default());
        // A new NodePort (new group), a port removed, a duplicate listener.
        let plan = plan_listeners(
            &[
                existing("l1", 80, "g1"),
                existing("l2", 443, "g2"),
                existing("l3", 80, "g1"),
            ],
            &[wanted(80, "g9")],
        );
        assert_eq!(plan.modify, vec![("l1".to_string(), "g9".to_string())]);
        assert_eq!(plan.delete, vec!["l2".to_string(), "l3".to_string()]);
        assert!(plan.create.is_empty());
    }

    #[test]
    fn target_diffs() {
        let set = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        type Ids = &'static [&'static str];
        let cases: [(Ids, Ids, Ids, Ids); 4] = [
            (&[], &["i-1", "i-2"], &["i-1", "i-2"], &[]),
            (&["i-1", "i-2"], &["i-1", "i-2"], &[], &[]),
            (&["i-1", "i-2"], &["i-2", "i-3"], &["i-3"], &["i-1"]),
            (&["i-1"], &[], &[], &["i-1"]),
        ];
        for (registered, want, register, deregister) in cases {
            let (r, d) = target_diff(&set(registered), &set(want));
            assert_eq!(r, set(register).into_iter().collect::<Vec<_>>());
            assert_eq!(d, set(deregister).into_iter().collect::<Vec<_>>());
        }
    }

    #[test]
    fn instance_ids_come_from_provider_ids() {
        let nodes: Vec<Node> = [
            Some("aws:///us-east-1a/i-1"),
            Some("gce://p/z/n"),
            None,
            Some("aws:///us-east-1b/i-2"),
        ]
        .iter()
        .map(|id| serde_json::from_value(json!({"spec": {"providerID": id}})).expect("node"))
        .collect();
        assert_eq!(
            node_instance_ids(&nodes).into_iter().collect::<Vec<_>>(),
            vec!["i-1", "i-2"]
        );
    }
}
