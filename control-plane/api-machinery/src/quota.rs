//! ResourceQuota's evaluators (upstream `pkg/quota/v1/evaluator/core`), shared by the quota
//! controller that recounts `status.used` and the ResourceQuota admission plugin that charges
//! each create against it: which object a hard resource name counts, a pod's requests and
//! limits as quota sees them, the quota scopes, and a claim's class and request.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerStatus, PersistentVolumeClaim, Pod, ResourceQuotaSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as WireQuantity;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::quantity::Quantity;

/// The prefix of per-StorageClass resource names' second half (`gold.storageclass.storage.k8s.io/requests.storage`).
pub const STORAGE_CLASS_SUFFIX: &str = ".storageclass.storage.k8s.io/";

/// A kind counted by `count/…` or its legacy name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[allow(missing_docs)] // each variant is the kind it names
pub enum Kind {
    Service,
    ConfigMap,
    Secret,
    PersistentVolumeClaim,
    ReplicationController,
    ResourceQuota,
    Deployment,
    ReplicaSet,
    StatefulSet,
    DaemonSet,
    Job,
    CronJob,
}

impl Kind {
    /// The kind stored as `plural` in `group`, when quota counts it.
    pub fn of(group: &str, plural: &str) -> Option<Kind> {
        Some(match (group, plural) {
            ("", "services") => Kind::Service,
            ("", "configmaps") => Kind::ConfigMap,
            ("", "secrets") => Kind::Secret,
            ("", "persistentvolumeclaims") => Kind::PersistentVolumeClaim,
            ("", "replicationcontrollers") => Kind::ReplicationController,
            ("", "resourcequotas") => Kind::ResourceQuota,
            ("apps", "deployments") => Kind::Deployment,
            ("apps", "replicasets") => Kind::ReplicaSet,
            ("apps", "statefulsets") => Kind::StatefulSet,
            ("apps", "daemonsets") => Kind::DaemonSet,
            ("batch", "jobs") => Kind::Job,
            ("batch", "cronjobs") => Kind::CronJob,
            _ => return None,
        })
    }
}

/// What a hard resource name measures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tracked {
    /// Non-terminal pods in scope.
    Pods,
    /// The sum of a compute resource's requests of those pods.
    Requests(String),
    /// The sum of its limits.
    Limits(String),
    /// Objects of a kind.
    Objects(Kind),
    /// Services of type LoadBalancer.
    LoadBalancers,
    /// Node ports of NodePort and LoadBalancer services.
    NodePorts,
    /// Claimed storage, of one storage class or all.
    ClaimedStorage(Option<String>),
    /// Claims, of one storage class.
    ClassClaims(String),
}

/// Upstream's evaluators' names (core ones and `count/<resource>.<group>`); `None` for a
/// resource this controller does not measure.
pub fn classify(resource: &str) -> Option<Tracked> {
    let kind = |k| Some(Tracked::Objects(k));
    match resource {
        "pods" | "count/pods" => Some(Tracked::Pods),
        "cpu" | "memory" | "ephemeral-storage" => Some(Tracked::Requests(resource.into())),
        "services" | "count/services" => kind(Kind::Service),
        "services.loadbalancers" => Some(Tracked::LoadBalancers),
        "services.nodeports" => Some(Tracked::NodePorts),
        "configmaps" | "count/configmaps" => kind(Kind::ConfigMap),
        "secrets" | "count/secrets" => kind(Kind::Secret),
        "persistentvolumeclaims" | "count/persistentvolumeclaims" => {
            kind(Kind::PersistentVolumeClaim)
        }
        "replicationcontrollers" | "count/replicationcontrollers" => {
            kind(Kind::ReplicationController)
        }
        "resourcequotas" | "count/resourcequotas" => kind(Kind::ResourceQuota),
        "count/deployments.apps" => kind(Kind::Deployment),
        "count/replicasets.apps" => kind(Kind::ReplicaSet),
        "count/statefulsets.apps" => kind(Kind::StatefulSet),
        "count/daemonsets.apps" => kind(Kind::DaemonSet),
        "count/jobs.batch" => kind(Kind::Job),
        "count/cronjobs.batch" => kind(Kind::CronJob),
        "requests.storage" => Some(Tracked::ClaimedStorage(None)),
        other => {
            if let Some((class, what)) = other.split_once(STORAGE_CLASS_SUFFIX) {
                return match what {
                    "requests.storage" => Some(Tracked::ClaimedStorage(Some(class.into()))),
                    "persistentvolumeclaims" => Some(Tracked::ClassClaims(class.into())),
                    _ => None,
                };
            }
            if let Some(name) = other.strip_prefix("requests.") {
                return Some(Tracked::Requests(name.into()));
            }
            other
                .strip_prefix("limits.")
                .map(|name| Tracked::Limits(name.into()))
        }
    }
}

/// Whether a pod still counts (upstream's QuotaV1Pod): not finished, and not past its
/// deletion grace period.
pub fn pod_counts(pod: &Pod, now: Timestamp) -> bool {
    if matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) {
        return false;
    }
    match (
        &pod.metadata.deletion_timestamp,
        pod.metadata.deletion_grace_period_seconds,
    ) {
        (Some(at), Some(grace)) => {
            at.0.checked_add(SignedDuration::from_secs(grace))
                .is_ok_and(|end| end >= now)
        }
        _ => true,
    }
}

fn quantity(value: Option<&WireQuantity>) -> Option<Quantity> {
    value.and_then(|q| Quantity::parse(&q.0).ok())
}

/// A pod's request (or limit) of `resource`, as the scheduler and quota see it (upstream's
/// `PodRequests` / `PodLimits`): the app containers and sidecars summed, at least each init
/// container with the sidecars started before it, plus the pod overhead. A container without a
/// request of something it limits requests its limit (the API server's default). While a resize
/// is pending or under way, a container counts the larger of what its spec asks and what the
/// kubelet reports in its status (`resources`, `allocatedResources`); a resize the kubelet
/// found infeasible counts only the status.
pub fn pod_amount(pod: &Pod, resource: &str, limits: bool) -> Quantity {
    let Some(spec) = &pod.spec else {
        return Quantity::ZERO;
    };
    let status = pod.status.as_ref();
    let infeasible = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "PodResizePending" && c.reason.as_deref() == Some("Infeasible"));
    let reported = |statuses: Option<&Vec<ContainerStatus>>, name: &str| {
        statuses
            .into_iter()
            .flatten()
            .find(|s| s.name == name && s.resources.is_some())
            .cloned()
    };
    let of = |c: &Container, statuses: Option<&Vec<ContainerStatus>>| {
        let r = c.resources.as_ref();
        let limit = quantity(
            r.and_then(|r| r.limits.as_ref())
                .and_then(|l| l.get(resource)),
        );
        let desired = if limits {
            limit
        } else {
            quantity(
                r.and_then(|r| r.requests.as_ref())
                    .and_then(|l| l.get(resource)),
            )
            .or(limit)
        };
        let Some(status) = reported(statuses, &c.name) else {
            return desired;
        };
        let actual = status.resources.as_ref().and_then(|r| {
            let list = if limits { &r.limits } else { &r.requests };
            quantity(list.as_ref().and_then(|l| l.get(resource)))
        });
        let allocated = if limits {
            None
        } else {
            quantity(
                status
                    .allocated_resources
                    .as_ref()
                    .and_then(|l| l.get(resource)),
            )
        };
        let desired = if infeasible { None } else { desired };
        [desired, actual, allocated].into_iter().flatten().max()
    };
    let container_statuses = status.and_then(|s| s.container_statuses.as_ref());
    let init_statuses = status.and_then(|s| s.init_container_statuses.as_ref());
    let mut total = spec
        .containers
        .iter()
        .filter_map(|c| of(c, container_statuses))
        .fold(Quantity::ZERO, |sum, q| sum + q);
    let mut sidecars = Quantity::ZERO;
    let mut init = Quantity::ZERO;
    for container in spec.init_containers.iter().flatten() {
        let amount = of(container, init_statuses).unwrap_or(Quantity::ZERO);
        if container.restart_policy.as_deref() == Some("Always") {
            total = total + amount;
            sidecars = sidecars + amount;
            init = init.max(sidecars);
        } else {
            init = init.max(amount + sidecars);
        }
    }
    let overhead =
        quantity(spec.overhead.as_ref().and_then(|o| o.get(resource))).unwrap_or(Quantity::ZERO);
    total.max(init) + overhead
}

/// Upstream's BestEffort QoS: no container requests or limits cpu or memory.
pub fn is_best_effort(pod: &Pod) -> bool {
    pod.spec
        .iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .all(|c| {
            let r = c.resources.as_ref();
            let empty = |m: Option<&BTreeMap<String, WireQuantity>>| {
                m.is_none_or(|m| !m.contains_key("cpu") && !m.contains_key("memory"))
            };
            empty(r.and_then(|r| r.requests.as_ref())) && empty(r.and_then(|r| r.limits.as_ref()))
        })
}

/// Whether `pod` is in every scope of the quota (`scopes` and `scopeSelector`).
pub fn pod_in_scope(pod: &Pod, spec: &ResourceQuotaSpec) -> bool {
    let terminating = pod
        .spec
        .as_ref()
        .and_then(|s| s.active_deadline_seconds)
        .is_some_and(|d| d >= 0);
    let in_scope = |scope: &str, operator: &str, values: &[String]| -> bool {
        let holds = match scope {
            "Terminating" => terminating,
            "NotTerminating" => !terminating,
            "BestEffort" => is_best_effort(pod),
            "NotBestEffort" => !is_best_effort(pod),
            "PriorityClass" => {
                let class = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.priority_class_name.as_deref());
                return match operator {
                    "In" => class.is_some_and(|c| values.iter().any(|v| v == c)),
                    "NotIn" => class.is_none_or(|c| !values.iter().any(|v| v == c)),
                    "Exists" => class.is_some_and(|c| !c.is_empty()),
                    "DoesNotExist" => class.is_none_or(str::is_empty),
                    _ => false,
                };
            }
            // Scopes about other objects (CrossNamespacePodAffinity, VolumeAttributesClass)
            // are not evaluated: the pod is taken as in scope.
            _ => true,
        };
        match operator {
            "DoesNotExist" => !holds,
            _ => holds,
        }
    };
    spec.scopes
        .iter()
        .flatten()
        .all(|scope| in_scope(scope, "Exists", &[]))
        && spec
            .scope_selector
            .iter()
            .flat_map(|s| s.match_expressions.iter().flatten())
            .all(|e| {
                in_scope(
                    &e.scope_name,
                    &e.operator,
                    e.values.as_deref().unwrap_or_default(),
                )
            })
}

/// The usage of a pod-related resource over `pods` (already in the quota's namespace).
pub fn pod_usage(tracked: &Tracked, pods: &[&Pod]) -> Quantity {
    match tracked {
        Tracked::Pods => Quantity::from_count(pods.len() as i64),
        Tracked::Requests(name) => pods
            .iter()
            .fold(Quantity::ZERO, |sum, p| sum + pod_amount(p, name, false)),
        Tracked::Limits(name) => pods
            .iter()
            .fold(Quantity::ZERO, |sum, p| sum + pod_amount(p, name, true)),
        _ => Quantity::ZERO,
    }
}

/// The claim's `spec.storageClassName` (empty when unset).
pub fn claim_class(claim: &PersistentVolumeClaim) -> &str {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or("")
}

/// The claim's `spec.resources.requests.storage` (zero when unset).
pub fn claim_request(claim: &PersistentVolumeClaim) -> Quantity {
    quantity(
        claim
            .spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage")),
    )
    .unwrap_or(Quantity::ZERO)
}

/// Whether a quota's hard resource `name` can count objects of `plural` in `group` (upstream's
/// `Evaluator.MatchingResources`), whatever one object happens to use.
pub fn counts(group: &str, plural: &str, name: &str) -> bool {
    let tracked = classify(name);
    match (group, plural) {
        ("", "pods") => matches!(
            tracked,
            Some(Tracked::Pods | Tracked::Requests(_) | Tracked::Limits(_))
        ),
        ("", "services") => matches!(
            tracked,
            Some(Tracked::Objects(Kind::Service) | Tracked::LoadBalancers | Tracked::NodePorts)
        ),
        ("", "persistentvolumeclaims") => matches!(
            tracked,
            Some(
                Tracked::Objects(Kind::PersistentVolumeClaim)
                    | Tracked::ClaimedStorage(_)
                    | Tracked::ClassClaims(_)
            )
        ),
        _ => match Kind::of(group, plural) {
            Some(kind) => tracked == Some(Tracked::Objects(kind)),
            None if group.is_empty() => name == format!("count/{plural}"),
            None => name == format!("count/{plural}.{group}"),
        },
    }
}

/// Usage by resource name, as upstream's evaluators report it for one object.
pub type Usage = BTreeMap<String, Quantity>;

/// What one object of `plural` in `group` uses of every quota resource name that can count
/// it (upstream's `Evaluator.Usage`): the object counts (`count/<resource>[.<group>]` and the
/// legacy name), and for pods their compute requests and limits, for services their load
/// balancers and node ports, for claims their storage (also per StorageClass). A finished
/// pod uses only `count/pods`. `now` decides whether a pod past its grace period still counts.
pub fn usage_of(group: &str, plural: &str, object: &serde_json::Value, now: Timestamp) -> Usage {
    let mut usage = Usage::new();
    let one = Quantity::from_count(1);
    let count_name = if group.is_empty() {
        format!("count/{plural}")
    } else {
        format!("count/{plural}.{group}")
    };
    usage.insert(count_name, one);
    match (group, plural) {
        ("", "pods") => {
            if let Ok(pod) = serde_json::from_value::<Pod>(object.clone()) {
                add_pod_usage(&pod, now, &mut usage);
            }
        }
        ("", "services") => {
            usage.insert("services".into(), one);
            let spec = object.get("spec");
            let service_type = spec
                .and_then(|s| s.get("type"))
                .and_then(serde_json::Value::as_str)
                .unwrap_or("ClusterIP");
            let ports = spec
                .and_then(|s| s.get("ports"))
                .and_then(serde_json::Value::as_array)
                .map_or(0, Vec::len) as i64;
            let allocates_node_ports = spec
                .and_then(|s| s.get("allocateLoadBalancerNodePorts"))
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(true);
            let (load_balancers, node_ports) = match service_type {
                "LoadBalancer" if allocates_node_ports => (1, ports),
                "LoadBalancer" => (1, 0),
                "NodePort" => (0, ports),
                _ => (0, 0),
            };
            usage.insert(
                "services.loadbalancers".into(),
                Quantity::from_count(load_balancers),
            );
            usage.insert(
                "services.nodeports".into(),
                Quantity::from_count(node_ports),
            );
        }
        ("", "persistentvolumeclaims") => {
            usage.insert(plural.into(), one);
            if let Ok(claim) = serde_json::from_value::<PersistentVolumeClaim>(object.clone()) {
                let request = claim_request(&claim);
                usage.insert("requests.storage".into(), request);
                let class = claim_class(&claim);
                if !class.is_empty() {
                    let prefix = format!("{class}{STORAGE_CLASS_SUFFIX}");
                    usage.insert(format!("{prefix}requests.storage"), request);
                    usage.insert(format!("{prefix}persistentvolumeclaims"), one);
                }
            }
        }
        ("", "configmaps" | "secrets" | "replicationcontrollers" | "resourcequotas") => {
            usage.insert(plural.into(), one);
        }
        _ => {}
    }
    usage
}

/// What `after` uses beyond `before`, resource by resource; resources that did not grow are
/// left out (upstream's `SubtractWithNonNegativeResult` and `RemoveZeros`).
pub fn added(after: &Usage, before: &Usage) -> Usage {
    after
        .iter()
        .filter_map(|(name, amount)| {
            let was = before.get(name).copied().unwrap_or(Quantity::ZERO);
            (*amount > was).then(|| (name.clone(), amount.minus(was)))
        })
        .collect()
}

/// A pod's compute usage (upstream's `PodUsageFunc` and `podComputeUsageHelper`).
fn add_pod_usage(pod: &Pod, now: Timestamp, usage: &mut Usage) {
    if !pod_counts(pod, now) {
        return;
    }
    usage.insert("pods".into(), Quantity::from_count(1));
    let mut requested = std::collections::BTreeSet::new();
    let mut limited = std::collections::BTreeSet::new();
    for container in pod.spec.iter().flat_map(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
    }) {
        if let Some(resources) = &container.resources {
            requested.extend(resources.requests.iter().flatten().map(|(k, _)| k.clone()));
            // A limit without a request requests the limit.
            requested.extend(resources.limits.iter().flatten().map(|(k, _)| k.clone()));
            limited.extend(resources.limits.iter().flatten().map(|(k, _)| k.clone()));
        }
    }
    for name in requested {
        let amount = pod_amount(pod, &name, false);
        match name.as_str() {
            "cpu" | "memory" | "ephemeral-storage" => {
                usage.insert(name.clone(), amount);
                usage.insert(format!("requests.{name}"), amount);
            }
            hugepages if hugepages.starts_with("hugepages-") => {
                usage.insert(name.clone(), amount);
                usage.insert(format!("requests.{name}"), amount);
            }
            extended if is_extended_resource(extended) => {
                usage.insert(format!("requests.{name}"), amount);
            }
            _ => {}
        }
    }
    for name in limited {
        if matches!(name.as_str(), "cpu" | "memory" | "ephemeral-storage") {
            usage.insert(format!("limits.{name}"), pod_amount(pod, &name, true));
        }
    }
}

/// Upstream's extended resources: a domain-qualified name outside `kubernetes.io/`.
fn is_extended_resource(name: &str) -> bool {
    name.contains('/') && !name.starts_with("kubernetes.io/") && !name.starts_with("requests.")
}

/// The resources upstream's pod evaluator requires every container to set when a quota
/// limits them (a backward-compatibility rule it keeps for cpu and memory only), with the
/// containers missing each: upstream's `must specify …` text, or `None` when all are set.
pub fn missing_pod_constraints(pod: &Pod, hard: &[&str]) -> Option<String> {
    let mut missing: BTreeMap<&str, std::collections::BTreeSet<&str>> = BTreeMap::new();
    for container in pod.spec.iter().flat_map(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
    }) {
        let resources = container.resources.as_ref();
        let has = |list: Option<&BTreeMap<String, WireQuantity>>, key: &str| {
            list.is_some_and(|l| l.contains_key(key))
        };
        let requests = resources.and_then(|r| r.requests.as_ref());
        let limits = resources.and_then(|r| r.limits.as_ref());
        for name in hard {
            let set = match *name {
                "cpu" | "requests.cpu" => has(requests, "cpu"),
                "memory" | "requests.memory" => has(requests, "memory"),
                "limits.cpu" => has(limits, "cpu"),
                "limits.memory" => has(limits, "memory"),
                _ => continue,
            };
            if !set {
                missing.entry(name).or_default().insert(&container.name);
            }
        }
    }
    if missing.is_empty() {
        return None;
    }
    let parts: Vec<String> = missing
        .iter()
        .map(|(name, containers)| {
            let names: Vec<&str> = containers.iter().copied().collect();
            format!("{name} for: {}", names.join(","))
        })
        .collect();
    Some(format!("must specify {}", parts.join("; ")))
}

/// Upstream's `prettyPrint` of a resource list in errors: `name=value` sorted, comma-joined.
pub fn pretty_print(usage: &Usage) -> String {
    usage
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))
    }

    fn container(requests: serde_json::Value, limits: serde_json::Value) -> serde_json::Value {
        json!({"name": "c", "image": "i", "resources": {"requests": requests, "limits": limits}})
    }

    #[test]
    fn resource_names_are_classified_as_upstream() {
        for (name, want) in [
            ("pods", Some(Tracked::Pods)),
            ("count/pods", Some(Tracked::Pods)),
            ("cpu", Some(Tracked::Requests("cpu".into()))),
            ("requests.memory", Some(Tracked::Requests("memory".into()))),
            ("limits.cpu", Some(Tracked::Limits("cpu".into()))),
            (
                "count/deployments.apps",
                Some(Tracked::Objects(Kind::Deployment)),
            ),
            ("configmaps", Some(Tracked::Objects(Kind::ConfigMap))),
            (
                "gold.storageclass.storage.k8s.io/requests.storage",
                Some(Tracked::ClaimedStorage(Some("gold".into()))),
            ),
            (
                "gold.storageclass.storage.k8s.io/persistentvolumeclaims",
                Some(Tracked::ClassClaims("gold".into())),
            ),
            ("count/widgets.example.com", None),
        ] {
            assert_eq!(classify(name), want, "{name}");
        }
    }

    #[test]
    fn pod_requests_take_the_larger_of_containers_and_init() {
        let p = pod(json!({"spec": {
            "containers": [
                container(json!({"cpu": "100m", "memory": "64Mi"}), json!({"cpu": "200m"})),
                container(json!({}), json!({"cpu": "300m", "memory": "128Mi"})),
            ],
            "initContainers": [container(json!({"cpu": "500m"}), json!({}))],
        }}));
        assert_eq!(pod_amount(&p, "cpu", false).to_string(), "500m");
        assert_eq!(pod_amount(&p, "memory", false).to_string(), "192Mi");
        assert_eq!(pod_amount(&p, "cpu", true).to_string(), "500m");
        assert_eq!(pod_amount(&p, "memory", true).to_string(), "128Mi");
        assert!(!is_best_effort(&p));
        let sums = pod_usage(&Tracked::Requests("cpu".into()), &[&p, &p]);
        assert_eq!(sums.to_string(), "1");
    }

    #[test]
    fn sidecars_add_to_the_containers_and_to_later_init_containers() {
        let mut sidecar = container(json!({"cpu": "100m"}), json!({}));
        sidecar["restartPolicy"] = json!("Always");
        let p = pod(json!({"spec": {
            "containers": [container(json!({"cpu": "200m"}), json!({}))],
            "initContainers": [
                sidecar,
                container(json!({"cpu": "250m"}), json!({})),
            ],
        }}));
        // The app container and the sidecar run together (300m); the second init container
        // ran beside the sidecar (350m).
        assert_eq!(pod_amount(&p, "cpu", false).to_string(), "350m");
    }

    #[test]
    fn a_pending_resize_counts_the_larger_of_spec_and_status() {
        let resized = |reason: &str| {
            pod(json!({
                "spec": {"containers": [container(json!({"cpu": "2"}), json!({"cpu": "2"}))]},
                "status": {
                    "conditions": [{"type": "PodResizePending", "status": "True", "reason": reason}],
                    "containerStatuses": [{
                        "name": "c", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                        "resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "500m"}},
                        "allocatedResources": {"cpu": "1"},
                    }],
                },
            }))
        };
        let deferred = resized("Deferred");
        assert_eq!(pod_amount(&deferred, "cpu", false).to_string(), "2");
        assert_eq!(pod_amount(&deferred, "cpu", true).to_string(), "2");
        let infeasible = resized("Infeasible");
        assert_eq!(pod_amount(&infeasible, "cpu", false).to_string(), "1");
        assert_eq!(pod_amount(&infeasible, "cpu", true).to_string(), "500m");
        // A scale-down counts the old, larger size until the kubelet reports the new one.
        let mut shrinking = deferred.clone();
        let spec = shrinking.spec.as_mut().expect("spec");
        spec.containers[0].resources =
            serde_json::from_value(json!({"requests": {"cpu": "100m"}, "limits": {"cpu": "100m"}}))
                .expect("resources");
        assert_eq!(pod_amount(&shrinking, "cpu", false).to_string(), "1");
    }

    #[test]
    fn finished_and_expired_pods_do_not_count() {
        let now = Timestamp::from_second(1_800_000_000).expect("time");
        let running = pod(json!({"status": {"phase": "Running"}}));
        let done = pod(json!({"status": {"phase": "Succeeded"}}));
        let past = now
            .checked_sub(SignedDuration::from_secs(60))
            .expect("time");
        let expired = pod(
            json!({"metadata": {"deletionTimestamp": past.to_string(), "deletionGracePeriodSeconds": 30}, "status": {"phase": "Running"}}),
        );
        let stopping = pod(
            json!({"metadata": {"deletionTimestamp": past.to_string(), "deletionGracePeriodSeconds": 300}, "status": {"phase": "Running"}}),
        );
        assert!(pod_counts(&running, now));
        assert!(!pod_counts(&done, now));
        assert!(!pod_counts(&expired, now));
        assert!(pod_counts(&stopping, now));
    }

    #[test]
    fn scopes_select_pods() {
        let best_effort = pod(json!({"spec": {"containers": [{"name": "c"}]}}));
        let burstable = pod(
            json!({"spec": {"containers": [container(json!({"cpu": "1"}), json!({}))], "activeDeadlineSeconds": 60, "priorityClassName": "high"}}),
        );
        let spec = |value: serde_json::Value| -> ResourceQuotaSpec {
            serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))
        };
        for (quota, be, bu) in [
            (json!({}), true, true),
            (json!({"scopes": ["BestEffort"]}), true, false),
            (json!({"scopes": ["NotBestEffort"]}), false, true),
            (json!({"scopes": ["Terminating"]}), false, true),
            (
                json!({"scopes": ["NotTerminating", "BestEffort"]}),
                true,
                false,
            ),
            (
                json!({"scopeSelector": {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}}),
                false,
                true,
            ),
            (
                json!({"scopeSelector": {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "DoesNotExist"}]}}),
                true,
                false,
            ),
        ] {
            let s = spec(quota.clone());
            assert_eq!(
                (pod_in_scope(&best_effort, &s), pod_in_scope(&burstable, &s)),
                (be, bu),
                "{quota}"
            );
        }
    }

    #[test]
    fn usage_names_what_each_kind_uses() {
        let now = Timestamp::from_second(1_800_000_000).expect("time");
        let pod = json!({"spec": {"containers": [
            container(json!({"cpu": "100m"}), json!({"cpu": "200m", "memory": "64Mi"})),
            {"name": "gpu", "image": "i", "resources": {"limits": {"example.com/gpu": "1"}}},
        ]}});
        let usage = usage_of("", "pods", &pod, now);
        let printed = pretty_print(&usage);
        assert_eq!(
            printed,
            "count/pods=1,cpu=100m,limits.cpu=200m,limits.memory=64Mi,memory=64Mi,pods=1,requests.cpu=100m,requests.example.com/gpu=1,requests.memory=64Mi"
        );
        let finished =
            json!({"spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Succeeded"}});
        assert_eq!(
            pretty_print(&usage_of("", "pods", &finished, now)),
            "count/pods=1"
        );
        let service = json!({"spec": {"type": "NodePort", "ports": [{"port": 80}, {"port": 443}]}});
        assert_eq!(
            pretty_print(&usage_of("", "services", &service, now)),
            "count/services=1,services=1,services.loadbalancers=0,services.nodeports=2"
        );
        let claim = json!({"spec": {"storageClassName": "gold", "resources": {"requests": {"storage": "1Gi"}}}});
        assert_eq!(
            pretty_print(&usage_of("", "persistentvolumeclaims", &claim, now)),
            "count/persistentvolumeclaims=1,gold.storageclass.storage.k8s.io/persistentvolumeclaims=1,gold.storageclass.storage.k8s.io/requests.storage=1Gi,persistentvolumeclaims=1,requests.storage=1Gi"
        );
        assert_eq!(
            pretty_print(&usage_of("apps", "deployments", &json!({}), now)),
            "count/deployments.apps=1"
        );
        assert_eq!(
            pretty_print(&usage_of("", "configmaps", &json!({}), now)),
            "configmaps=1,count/configmaps=1"
        );
    }

    #[test]
    fn an_update_adds_only_what_grew() {
        let now = Timestamp::from_second(1_800_000_000).expect("time");
        let claim = |size: &str| json!({"spec": {"storageClassName": "gold", "resources": {"requests": {"storage": size}}}});
        let grown = added(
            &usage_of("", "persistentvolumeclaims", &claim("3Gi"), now),
            &usage_of("", "persistentvolumeclaims", &claim("1Gi"), now),
        );
        assert_eq!(
            pretty_print(&grown),
            "gold.storageclass.storage.k8s.io/requests.storage=2Gi,requests.storage=2Gi"
        );
        let shrunk = added(
            &usage_of("", "persistentvolumeclaims", &claim("1Gi"), now),
            &usage_of("", "persistentvolumeclaims", &claim("3Gi"), now),
        );
        assert!(shrunk.is_empty());
    }

    #[test]
    fn cpu_and_memory_quotas_require_every_container_to_set_them() {
        let p = pod(json!({"spec": {"containers": [
            container(json!({"cpu": "1"}), json!({})),
            {"name": "bare", "image": "i"},
        ]}}));
        assert_eq!(
            missing_pod_constraints(&p, &["requests.cpu", "limits.memory", "pods"]).as_deref(),
            Some("must specify limits.memory for: bare,c; requests.cpu for: bare")
        );
        assert_eq!(
            missing_pod_constraints(&p, &["pods", "requests.storage"]),
            None
        );
    }
}
