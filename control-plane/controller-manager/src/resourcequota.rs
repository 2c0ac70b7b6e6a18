//! The resource quota controller (upstream `pkg/controller/resourcequota` with the core
//! evaluators): `status.hard` mirrors `spec.hard`, `status.used` counts what the namespace
//! holds of each hard resource — objects (`pods`, `services`, `count/<resource>.<group>`, …),
//! the requests and limits of its non-terminal pods (`requests.cpu`, `limits.memory`, bare
//! `cpu` / `memory`), claimed storage — with the Terminating / NotTerminating / BestEffort /
//! NotBestEffort scopes and the PriorityClass scope selector. Caches of the counted kinds
//! start only when some quota names them, so an idle cluster pays for none. Admission-time
//! enforcement is not here (that is the API server's).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, ReplicationController, ResourceQuota, ResourceQuotaSpec,
    Secret, Service,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as WireQuantity;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::watch;

use crate::informers::{Informer, Informers, RELAXED_PASS_INTERVAL, Triggers};
use crate::pods;
use crate::quantity::Quantity;

/// How often every quota is recounted without a change seen (upstream resyncs every 5
/// minutes and recounts on events; the counts here come from caches, so this is cheap).
const RESYNC: Duration = Duration::from_secs(10);
const MANAGER: &str = "resourcequota-controller";
const STORAGE_CLASS_SUFFIX: &str = ".storageclass.storage.k8s.io/";

/// A kind counted by `count/…` or its legacy name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
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

/// What a hard resource name measures.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tracked {
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
fn classify(resource: &str) -> Option<Tracked> {
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
fn pod_counts(pod: &Pod, now: Timestamp) -> bool {
    if pods::is_finished(pod) {
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

/// A pod's request (or limit) of `resource`, as the scheduler and quota see it: the larger of
/// the containers' sum and the largest init container, plus the pod overhead. A container
/// without a request of something it limits requests its limit (the API server's default).
fn pod_amount(pod: &Pod, resource: &str, limits: bool) -> Quantity {
    let Some(spec) = &pod.spec else {
        return Quantity::ZERO;
    };
    let of = |c: &k8s_openapi::api::core::v1::Container| {
        let r = c.resources.as_ref();
        let limit = quantity(
            r.and_then(|r| r.limits.as_ref())
                .and_then(|l| l.get(resource)),
        );
        if limits {
            return limit;
        }
        quantity(
            r.and_then(|r| r.requests.as_ref())
                .and_then(|l| l.get(resource)),
        )
        .or(limit)
    };
    let containers = spec
        .containers
        .iter()
        .filter_map(of)
        .fold(Quantity::ZERO, |sum, q| sum + q);
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .filter_map(of)
        .max()
        .unwrap_or(Quantity::ZERO);
    let overhead =
        quantity(spec.overhead.as_ref().and_then(|o| o.get(resource))).unwrap_or(Quantity::ZERO);
    containers.max(init) + overhead
}

/// Upstream's BestEffort QoS: no container requests or limits cpu or memory.
fn is_best_effort(pod: &Pod) -> bool {
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
fn pod_in_scope(pod: &Pod, spec: &ResourceQuotaSpec) -> bool {
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
fn pod_usage(tracked: &Tracked, pods: &[&Pod]) -> Quantity {
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

fn claim_class(claim: &PersistentVolumeClaim) -> &str {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or("")
}

fn claim_request(claim: &PersistentVolumeClaim) -> Quantity {
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

/// The objects of `K` in `namespace`, from its (lazily started) cache; `None` until it has
/// filled.
fn in_namespace<K>(informers: &Informers, namespace: &str) -> Option<Vec<Arc<K>>>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let informer: Informer<K> = informers.get::<K>();
    informer.is_ready().then(|| {
        informer
            .list()
            .into_iter()
            .filter(|o| o.meta().namespace.as_deref() == Some(namespace))
            .collect()
    })
}

fn signal_of(informers: &Informers, kind: Kind) -> watch::Receiver<u64> {
    match kind {
        Kind::Service => informers.get::<Service>().signal(),
        Kind::ConfigMap => informers.get::<ConfigMap>().signal(),
        Kind::Secret => informers.get::<Secret>().signal(),
        Kind::PersistentVolumeClaim => informers.get::<PersistentVolumeClaim>().signal(),
        Kind::ReplicationController => informers.get::<ReplicationController>().signal(),
        Kind::ResourceQuota => informers.get::<ResourceQuota>().signal(),
        Kind::Deployment => informers.get::<Deployment>().signal(),
        Kind::ReplicaSet => informers.get::<ReplicaSet>().signal(),
        Kind::StatefulSet => informers.get::<StatefulSet>().signal(),
        Kind::DaemonSet => informers.get::<DaemonSet>().signal(),
        Kind::Job => informers.get::<Job>().signal(),
        Kind::CronJob => informers.get::<CronJob>().signal(),
    }
}

fn count_of(informers: &Informers, kind: Kind, namespace: &str) -> Option<usize> {
    fn n<K>(informers: &Informers, namespace: &str) -> Option<usize>
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        in_namespace::<K>(informers, namespace).map(|v| v.len())
    }
    match kind {
        Kind::Service => n::<Service>(informers, namespace),
        Kind::ConfigMap => n::<ConfigMap>(informers, namespace),
        Kind::Secret => n::<Secret>(informers, namespace),
        Kind::PersistentVolumeClaim => n::<PersistentVolumeClaim>(informers, namespace),
        Kind::ReplicationController => n::<ReplicationController>(informers, namespace),
        Kind::ResourceQuota => n::<ResourceQuota>(informers, namespace),
        Kind::Deployment => n::<Deployment>(informers, namespace),
        Kind::ReplicaSet => n::<ReplicaSet>(informers, namespace),
        Kind::StatefulSet => n::<StatefulSet>(informers, namespace),
        Kind::DaemonSet => n::<DaemonSet>(informers, namespace),
        Kind::Job => n::<Job>(informers, namespace),
        Kind::CronJob => n::<CronJob>(informers, namespace),
    }
}

/// The kind whose cache a tracked resource reads, beyond pods.
fn kind_needed(tracked: &Tracked) -> Option<Kind> {
    match tracked {
        Tracked::Objects(kind) => Some(*kind),
        Tracked::LoadBalancers | Tracked::NodePorts => Some(Kind::Service),
        Tracked::ClaimedStorage(_) | Tracked::ClassClaims(_) => Some(Kind::PersistentVolumeClaim),
        Tracked::Pods | Tracked::Requests(_) | Tracked::Limits(_) => None,
    }
}

/// Runs the controller until the task is aborted.
pub async fn run(informers: Arc<Informers>) {
    let quotas = informers.get::<ResourceQuota>();
    let pods = informers.get::<Pod>();
    let client = informers.client().clone();
    let mut triggers = Some(
        Triggers::new(RESYNC)
            .at_most_every(RELAXED_PASS_INTERVAL)
            .on(&quotas)
            .on(&pods),
    );
    let mut watched: BTreeSet<Kind> = BTreeSet::new();
    loop {
        if let Some(t) = triggers.as_mut() {
            t.next().await;
        }
        if !(quotas.is_ready() && pods.is_ready()) {
            continue;
        }
        // Start (and wake on) the caches the quotas now name.
        for quota in quotas.list() {
            for resource in quota
                .spec
                .iter()
                .flat_map(|s| s.hard.iter().flatten())
                .map(|(k, _)| k)
            {
                if let Some(kind) = classify(resource).as_ref().and_then(kind_needed)
                    && watched.insert(kind)
                {
                    triggers = triggers.map(|t| t.on_signal(signal_of(&informers, kind)));
                }
            }
        }
        sync_all(&client, &informers, &quotas, &pods).await;
    }
}

/// The usage of every hard resource of `quota` this controller measures; `None` while a
/// cache it needs is still filling.
fn usage(
    informers: &Informers,
    quota: &ResourceQuota,
    namespace_pods: &[&Pod],
    now: Timestamp,
) -> Option<BTreeMap<String, Quantity>> {
    let namespace = quota.metadata.namespace.as_deref().unwrap_or("");
    let spec = quota.spec.clone().unwrap_or_default();
    let in_scope: Vec<&Pod> = namespace_pods
        .iter()
        .copied()
        .filter(|p| pod_counts(p, now) && pod_in_scope(p, &spec))
        .collect();
    let mut used = BTreeMap::new();
    for resource in spec.hard.iter().flatten().map(|(k, _)| k) {
        let Some(tracked) = classify(resource) else {
            continue;
        };
        let amount = match &tracked {
            Tracked::Pods | Tracked::Requests(_) | Tracked::Limits(_) => {
                pod_usage(&tracked, &in_scope)
            }
            Tracked::Objects(kind) => {
                Quantity::from_count(count_of(informers, *kind, namespace)? as i64)
            }
            Tracked::LoadBalancers | Tracked::NodePorts => {
                let services = in_namespace::<Service>(informers, namespace)?;
                let count: usize = services
                    .iter()
                    .filter_map(|s| s.spec.as_ref())
                    .map(|s| match (&tracked, s.type_.as_deref()) {
                        (Tracked::LoadBalancers, Some("LoadBalancer")) => 1,
                        (Tracked::NodePorts, Some("NodePort" | "LoadBalancer")) => s
                            .ports
                            .iter()
                            .flatten()
                            .filter(|p| p.node_port.is_some())
                            .count(),
                        _ => 0,
                    })
                    .sum();
                Quantity::from_count(count as i64)
            }
            Tracked::ClaimedStorage(class) => {
                in_namespace::<PersistentVolumeClaim>(informers, namespace)?
                    .iter()
                    .filter(|c| class.as_deref().is_none_or(|k| claim_class(c) == k))
                    .fold(Quantity::ZERO, |sum, c| sum + claim_request(c))
            }
            Tracked::ClassClaims(class) => Quantity::from_count(
                in_namespace::<PersistentVolumeClaim>(informers, namespace)?
                    .iter()
                    .filter(|c| claim_class(c) == class)
                    .count() as i64,
            ),
        };
        used.insert(resource.clone(), amount);
    }
    Some(used)
}

/// Canonical wire form of a quantity map (`1000m` → `1`); unparsable values as given.
fn canonical(values: &BTreeMap<String, WireQuantity>) -> BTreeMap<String, String> {
    values
        .iter()
        .map(|(k, v)| {
            let text = Quantity::parse(&v.0).map_or_else(|_| v.0.clone(), |q| q.to_string());
            (k.clone(), text)
        })
        .collect()
}

async fn sync_all(
    client: &kube::Client,
    informers: &Informers,
    quotas: &Informer<ResourceQuota>,
    pods: &Informer<Pod>,
) {
    let now = Timestamp::now();
    let all_pods = pods.list();
    for quota in quotas.list() {
        let (Some(name), Some(namespace)) = (&quota.metadata.name, &quota.metadata.namespace)
        else {
            continue;
        };
        let namespace_pods: Vec<&Pod> = all_pods
            .iter()
            .map(|p| &**p)
            .filter(|p| p.metadata.namespace.as_deref() == Some(namespace.as_str()))
            .collect();
        let Some(used) = usage(informers, &quota, &namespace_pods, now) else {
            continue;
        };
        let hard = canonical(
            &quota
                .spec
                .as_ref()
                .and_then(|s| s.hard.clone())
                .unwrap_or_default(),
        );
        let used: BTreeMap<String, String> =
            used.into_iter().map(|(k, q)| (k, q.to_string())).collect();
        let status = quota.status.as_ref();
        let current_hard = canonical(&status.and_then(|s| s.hard.clone()).unwrap_or_default());
        let current_used = canonical(&status.and_then(|s| s.used.clone()).unwrap_or_default());
        if status.is_some() && current_hard == hard && current_used == used {
            continue;
        }
        // A merge patch: resources no longer in spec.hard are removed with nulls.
        let with_removals = |next: &BTreeMap<String, String>,
                             current: &BTreeMap<String, String>| {
            let mut map = serde_json::Map::new();
            for key in current.keys().filter(|k| !next.contains_key(*k)) {
                map.insert(key.clone(), serde_json::Value::Null);
            }
            for (key, value) in next {
                map.insert(key.clone(), json!(value));
            }
            serde_json::Value::Object(map)
        };
        let patch = json!({"status": {
            "hard": with_removals(&hard, &current_hard),
            "used": with_removals(&used, &current_used),
        }});
        let api: Api<ResourceQuota> = Api::namespaced(client.clone(), namespace);
        let outcome = api
            .patch_status(name, &pods::manager(MANAGER), &Patch::Merge(&patch))
            .await;
        if let Err(err) = outcome {
            tracing::info!(quota = %name, %err, "quota status update failed; retrying");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn finished_and_expired_pods_do_not_count() {
        let now = Timestamp::now();
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
}
