//! The node lifecycle controller (upstream `pkg/controller/nodelifecycle`) and the taint
//! eviction controller (upstream `pkg/controller/tainteviction`), pure API clients.
//!
//! Node health: a node whose Lease (`kube-node-lease`) and Ready heartbeat have not moved for
//! the grace period gets every kubelet condition set to Unknown ("Kubelet stopped posting node
//! status."), and its pods are marked not Ready. Taints follow the conditions: the NoSchedule
//! ones of upstream's TaintNodesByCondition, and `not-ready` / `unreachable` NoExecute taints
//! that are removed when the node is healthy again (and from every node when all of them are
//! unhealthy — upstream's full-disruption mode, which suspects the control plane's view instead).
//! Taint eviction: pods on a node with NoExecute taints they do not tolerate are deleted, after
//! the shortest `tolerationSeconds` of the tolerations they use, with the DisruptionTarget
//! condition set first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, Patch};
use serde_json::json;

use crate::informers::{Index, Informer, Informers};
use crate::pods;
use crate::workqueue::{Requeue, WorkQueue, run_workers};

/// Upstream's `--node-monitor-grace-period`: how long a node may go without a heartbeat.
pub const NODE_MONITOR_GRACE_PERIOD: Duration = Duration::from_secs(40);
/// Upstream's `--node-startup-grace-period`: the grace of a node that never posted status.
pub const NODE_STARTUP_GRACE_PERIOD: Duration = Duration::from_secs(60);

/// The taint of a node whose kubelet reports it not ready.
pub const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
/// The taint of a node whose kubelet stopped reporting.
pub const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
const TAINT_UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";
const NO_SCHEDULE: &str = "NoSchedule";
const NO_EXECUTE: &str = "NoExecute";
const MANAGER: &str = "node-lifecycle-controller";
const EVICTION_MANAGER: &str = "taint-eviction-controller";

/// The kubelet-owned conditions set to Unknown when the kubelet goes silent (not
/// NetworkUnavailable, which the control plane owns).
const KUBELET_CONDITIONS: [&str; 4] = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"];

/// The controller's timings, upstream's defaults unless a test shortens them.
#[derive(Debug, Clone)]
pub struct Config {
    /// Upstream's `nodeMonitorGracePeriod`.
    pub node_monitor_grace_period: Duration,
    /// Upstream's `nodeStartupGracePeriod`.
    pub node_startup_grace_period: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            node_monitor_grace_period: NODE_MONITOR_GRACE_PERIOD,
            node_startup_grace_period: NODE_STARTUP_GRACE_PERIOD,
        }
    }
}

/// Runs node health monitoring and taint eviction until the task is aborted.
pub async fn run(informers: Arc<Informers>, config: Config) {
    futures::join!(
        monitor_nodes(informers.clone(), config.clone()),
        evict_by_taints(informers),
    );
}

// ---------------------------------------------------------------------------------------------
// Node health

/// What the controller last saw of a node (upstream's `nodeHealthData`): the heartbeats, and
/// when (on this process's clock) one of them last moved.
#[derive(Debug, Clone, PartialEq)]
struct NodeHealth {
    ready_heartbeat: Option<Timestamp>,
    lease_renewed: Option<Timestamp>,
    probed_at: Timestamp,
}

fn condition<'a>(node: &'a Node, kind: &str) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == kind))
}

/// The Ready condition's status, `None` when the kubelet never posted one.
fn ready_status(node: &Node) -> Option<&str> {
    condition(node, "Ready").map(|c| c.status.as_str())
}

/// Upstream's tryUpdateNodeHealth bookkeeping: the probe time moves to `now` whenever the Ready
/// heartbeat or the Lease renewal moves; a node first seen without a Ready condition counts
/// from its creation.
fn observe(
    previous: Option<&NodeHealth>,
    node: &Node,
    lease: Option<&Lease>,
    now: Timestamp,
) -> NodeHealth {
    let ready_heartbeat = condition(node, "Ready")
        .and_then(|c| c.last_heartbeat_time.as_ref())
        .map(|t| t.0);
    let has_ready = condition(node, "Ready").is_some();
    let lease_renewed = lease
        .and_then(|l| l.spec.as_ref())
        .and_then(|s| s.renew_time.as_ref())
        .map(|t| t.0);
    let mut probed_at = match previous {
        None if !has_ready => node
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(now, |t| t.0),
        None => now,
        Some(seen) if seen.ready_heartbeat != ready_heartbeat => now,
        Some(seen) => seen.probed_at,
    };
    if lease_renewed.is_some()
        && previous.is_none_or(|seen| seen.lease_renewed.is_none_or(|t| Some(t) < lease_renewed))
    {
        probed_at = now;
    }
    NodeHealth {
        ready_heartbeat,
        // A lease that went backwards is not a renewal; keep the newest seen.
        lease_renewed: lease_renewed.max(previous.and_then(|p| p.lease_renewed)),
        probed_at,
    }
}

/// The conditions of a node whose heartbeat is older than its grace period: every kubelet
/// condition Unknown (those never posted are added), or `None` when Ready already is Unknown
/// (upstream writes only when the Ready condition changes).
fn unknown_conditions(node: &Node, now: Timestamp) -> Option<Vec<NodeCondition>> {
    let mut conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let before = conditions.iter().find(|c| c.type_ == "Ready").cloned();
    for kind in KUBELET_CONDITIONS {
        match conditions.iter_mut().find(|c| c.type_ == kind) {
            Some(existing) if existing.status != "Unknown" => {
                existing.status = "Unknown".into();
                existing.reason = Some("NodeStatusUnknown".into());
                existing.message = Some("Kubelet stopped posting node status.".into());
                existing.last_transition_time = Some(Time(now));
            }
            Some(_) => {}
            None => conditions.push(NodeCondition {
                type_: kind.into(),
                status: "Unknown".into(),
                reason: Some("NodeStatusNeverUpdated".into()),
                message: Some("Kubelet never posted node status.".into()),
                last_heartbeat_time: node.metadata.creation_timestamp.clone(),
                last_transition_time: Some(Time(now)),
            }),
        }
    }
    let after = conditions.iter().find(|c| c.type_ == "Ready");
    (before.as_ref() != after).then_some(conditions)
}

/// The NoSchedule taint each condition status implies (upstream's
/// nodeConditionToTaintKeyStatusMap), plus `unschedulable` for a cordoned node.
fn no_schedule_taint_keys(node: &Node) -> Vec<&'static str> {
    let mut keys = Vec::new();
    for (kind, status, key) in [
        ("Ready", "False", TAINT_NOT_READY),
        ("Ready", "Unknown", TAINT_UNREACHABLE),
        (
            "MemoryPressure",
            "True",
            "node.kubernetes.io/memory-pressure",
        ),
        ("DiskPressure", "True", "node.kubernetes.io/disk-pressure"),
        (
            "NetworkUnavailable",
            "True",
            "node.kubernetes.io/network-unavailable",
        ),
        ("PIDPressure", "True", "node.kubernetes.io/pid-pressure"),
    ] {
        if condition(node, kind).is_some_and(|c| c.status == status) {
            keys.push(key);
        }
    }
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        keys.push(TAINT_UNSCHEDULABLE);
    }
    keys
}

/// Every NoSchedule taint key the controller owns (added and removed by it).
const MANAGED_NO_SCHEDULE: [&str; 7] = [
    TAINT_NOT_READY,
    TAINT_UNREACHABLE,
    "node.kubernetes.io/memory-pressure",
    "node.kubernetes.io/disk-pressure",
    "node.kubernetes.io/network-unavailable",
    "node.kubernetes.io/pid-pressure",
    TAINT_UNSCHEDULABLE,
];

/// The node's taints as the controller wants them, or `None` when they already are.
/// `evictions` is false in full-disruption mode: no NoExecute taints then.
fn desired_taints(node: &Node, evictions: bool, now: Timestamp) -> Option<Vec<Taint>> {
    let current: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let mut wanted: Vec<(&str, &str)> = no_schedule_taint_keys(node)
        .into_iter()
        .map(|key| (key, NO_SCHEDULE))
        .collect();
    if evictions {
        match ready_status(node) {
            Some("False") => wanted.push((TAINT_NOT_READY, NO_EXECUTE)),
            Some("Unknown") => wanted.push((TAINT_UNREACHABLE, NO_EXECUTE)),
            _ => {}
        }
    }
    let managed = |t: &Taint| match t.effect.as_str() {
        NO_SCHEDULE => MANAGED_NO_SCHEDULE.contains(&t.key.as_str()),
        NO_EXECUTE => t.key == TAINT_NOT_READY || t.key == TAINT_UNREACHABLE,
        _ => false,
    };
    let mut next: Vec<Taint> = current
        .iter()
        .filter(|t| !managed(t) || wanted.contains(&(t.key.as_str(), t.effect.as_str())))
        .cloned()
        .collect();
    for (key, effect) in wanted {
        if !next.iter().any(|t| t.key == key && t.effect == effect) {
            next.push(Taint {
                key: key.into(),
                effect: effect.into(),
                // Upstream stamps NoExecute taints only: eviction timing may read it.
                time_added: (effect == NO_EXECUTE).then_some(Time(now)),
                value: None,
            });
        }
    }
    (next != current).then_some(next)
}

/// Runs node health monitoring until the task is aborted: a change to a node, its Lease, or a
/// pod turning Ready on it queues the node's name; a sync judges that node alone and, while it
/// is healthy, looks at it again just after its grace would run out (the heartbeat that
/// normally comes first queues it sooner). A node's Ready flipping queues every node, as it may
/// switch the full-disruption mode on or off.
async fn monitor_nodes(informers: Arc<Informers>, config: Config) {
    let nodes = informers.get::<Node>();
    let leases = informers.get::<Lease>();
    let pods = informers.get::<Pod>();
    let pods_by_node = pods.index(BY_NODE, pod_node);
    let client = informers.client().clone();
    let queue = Arc::new(WorkQueue::new("node_lifecycle_controller"));
    let on_node = queue.clone();
    let every_node = nodes.clone();
    nodes.on_change(move |change| {
        for node in change.objects() {
            if let Some(name) = &node.metadata.name {
                on_node.add(name.clone());
            }
        }
        if change.old.and_then(ready_status) != change.new.and_then(ready_status) {
            for node in every_node.list() {
                if let Some(name) = &node.metadata.name {
                    on_node.add(name.clone());
                }
            }
        }
    });
    let on_lease = queue.clone();
    leases.on_change(move |change| {
        for lease in change.objects() {
            if lease.metadata.namespace.as_deref() == Some("kube-node-lease")
                && let Some(name) = &lease.metadata.name
            {
                on_lease.add(name.clone());
            }
        }
    });
    let on_pod = queue.clone();
    pods.on_change(move |change| {
        // Only a pod that became Ready (or moved) can need marking on a node not Ready.
        if let Some(new) = change.new
            && pods::is_ready(new)
            && change.old.is_none_or(|old| !pods::is_ready(old))
            && let Some(node) = pod_node(new).pop()
        {
            on_pod.add(node);
        }
    });
    nodes.ready().await;
    leases.ready().await;
    pods.ready().await;
    let health: Mutex<HashMap<String, NodeHealth>> = Mutex::default();
    let caches = Caches {
        nodes: &nodes,
        leases: &leases,
        pods_by_node: &pods_by_node,
    };
    run_workers(&queue, CONCURRENT_SYNCS, |name: String| {
        sync_node(&client, &config, caches, &health, name)
    })
    .await
}

/// Node monitors run at once (upstream: `--concurrent-node-syncs`, 5).
const CONCURRENT_SYNCS: usize = 5;
/// The name of the index of pods by the node they are bound to.
const BY_NODE: &str = "node";

fn pod_node(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty())
        .into_iter()
        .collect()
}

/// The caches the node monitor reads.
#[derive(Clone, Copy)]
struct Caches<'a> {
    nodes: &'a Informer<Node>,
    leases: &'a Informer<Lease>,
    pods_by_node: &'a Index<Pod>,
}

/// Upstream's monitorNodeHealth for one node: its conditions set Unknown once it has been
/// silent for its grace period, its taints made to follow its conditions, and its pods marked
/// not Ready while it is not Ready.
async fn sync_node(
    client: &kube::Client,
    config: &Config,
    caches: Caches<'_>,
    health: &Mutex<HashMap<String, NodeHealth>>,
    name: String,
) -> Result<Requeue, kube::Error> {
    let now = Timestamp::now();
    let Some(cached) = caches.nodes.get("", &name) else {
        health
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&name);
        return Ok(Requeue::No);
    };
    let lease = caches.leases.get("kube-node-lease", &name);
    let seen = {
        let mut health = health.lock().unwrap_or_else(|p| p.into_inner());
        let seen = observe(health.get(&name), &cached, lease.as_deref(), now);
        health.insert(name.clone(), seen.clone());
        seen
    };
    let grace = if condition(&cached, "Ready").is_some() {
        config.node_monitor_grace_period
    } else {
        config.node_startup_grace_period
    };
    let grace = SignedDuration::try_from(grace).unwrap_or(SignedDuration::MAX);
    let silent_for = now.duration_since(seen.probed_at);
    let api: Api<Node> = Api::all(client.clone());
    let mut node = Node::clone(&cached);
    if silent_for > grace
        && let Some(conditions) = unknown_conditions(&node, now)
    {
        tracing::info!(node = %name, "node stopped posting status; marking it Unknown");
        let patch = json!({
            "metadata": {"resourceVersion": node.metadata.resource_version},
            "status": {"conditions": conditions},
        });
        node = api
            .patch_status(&name, &pods::manager(MANAGER), &Patch::Merge(&patch))
            .await?;
    }
    // Upstream's full-disruption mode: when no node at all is Ready, the fault is more likely
    // on this side, so nothing is evicted.
    let evictions =
        ready_status(&node) == Some("True")
            || caches.nodes.list().iter().any(|n| {
                n.metadata.name.as_deref() != Some(&name) && ready_status(n) == Some("True")
            });
    if let Some(taints) = desired_taints(&node, evictions, now) {
        // No taints left is no `taints` field, as upstream's omitempty leaves it.
        let taints = (!taints.is_empty()).then_some(taints);
        let patch = json!({
            "metadata": {"resourceVersion": node.metadata.resource_version},
            "spec": {"taints": taints},
        });
        api.patch(&name, &pods::manager(MANAGER), &Patch::Merge(&patch))
            .await?;
    }
    if ready_status(&node).is_some_and(|s| s != "True") {
        mark_pods_not_ready(client, caches.pods_by_node.get(&name), now).await;
    }
    // Silence is what the monitor looks for: a node still within its grace is looked at just
    // after the grace would run out, unless a heartbeat queues it first.
    Ok(if silent_for <= grace {
        let left = Duration::try_from(grace - silent_for).unwrap_or(Duration::ZERO);
        Requeue::After(left + Duration::from_millis(100))
    } else {
        Requeue::No
    })
}

/// Upstream's MarkPodsNotReady: the pods of a node that is not Ready are not Ready either.
async fn mark_pods_not_ready(client: &kube::Client, on_node: Vec<Arc<Pod>>, now: Timestamp) {
    for pod in on_node {
        if !pods::is_ready(&pod) || pods::is_finished(&pod) {
            continue;
        }
        let (Some(name), Some(namespace)) = (&pod.metadata.name, &pod.metadata.namespace) else {
            continue;
        };
        let mut conditions = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        for condition in conditions.iter_mut().filter(|c| c.type_ == "Ready") {
            condition.status = "False".into();
            condition.last_transition_time = Some(Time(now));
        }
        let patch = json!({
            "metadata": {"resourceVersion": pod.metadata.resource_version},
            "status": {"conditions": conditions},
        });
        let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
        if let Err(err) = api
            .patch_status(name, &pods::manager(MANAGER), &Patch::Merge(&patch))
            .await
        {
            tracing::info!(pod = %name, %err, "marking pod not ready failed; retrying");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Taint eviction

/// When a pod must go because of its node's NoExecute taints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Eviction {
    /// It does not tolerate one of them.
    Now,
    /// It tolerates them all, the shortest for this long.
    After(Duration),
    /// It tolerates them all forever.
    Never,
}

/// Upstream's GetMatchingTolerations then getMinTolerationTime: each taint is tolerated by the
/// first toleration matching it; the pod goes after the shortest `tolerationSeconds` among
/// those (at once for zero or less), or never when none of them is limited.
fn eviction_for(taints: &[&Taint], tolerations: &[Toleration]) -> Eviction {
    if taints.is_empty() {
        return Eviction::Never;
    }
    let mut shortest: Option<i64> = None;
    for taint in taints {
        let Some(used) = tolerations
            .iter()
            .find(|t| crate::pods::tolerates(t, taint))
        else {
            return Eviction::Now;
        };
        if let Some(seconds) = used.toleration_seconds {
            shortest = Some(shortest.map_or(seconds, |s| s.min(seconds)));
        }
    }
    match shortest {
        None => Eviction::Never,
        Some(seconds) if seconds <= 0 => Eviction::Now,
        Some(seconds) => Eviction::After(Duration::from_secs(seconds.unsigned_abs())),
    }
}

/// When each pod (by key, with its uid, so a pod created again under the name starts anew) was
/// first seen due for eviction: its toleration runs from then, as upstream's timed workers
/// start at the first observation.
type EvictionClock = HashMap<String, (String, Timestamp)>;

/// Whether the pod `key` should be deleted now; records or clears its start in `clock`.
/// Returns the time it becomes due, when that is in the future.
fn due(
    clock: &mut EvictionClock,
    key: &str,
    uid: &str,
    eviction: Eviction,
    now: Timestamp,
) -> (bool, Option<Timestamp>) {
    match eviction {
        Eviction::Never => {
            clock.remove(key);
            (false, None)
        }
        Eviction::Now => (true, None),
        Eviction::After(wait) => {
            let entry = clock
                .entry(key.to_string())
                .or_insert_with(|| (uid.to_string(), now));
            if entry.0 != uid {
                *entry = (uid.to_string(), now);
            }
            let at = entry
                .1
                .checked_add(SignedDuration::try_from(wait).unwrap_or(SignedDuration::MAX))
                .unwrap_or(Timestamp::MAX);
            if at <= now {
                (true, None)
            } else {
                (false, Some(at))
            }
        }
    }
}

/// A node's NoExecute taints.
fn no_execute_taints(node: &Node) -> Vec<&Taint> {
    node.spec
        .iter()
        .flat_map(|s| s.taints.iter().flatten())
        .filter(|t| t.effect == NO_EXECUTE)
        .collect()
}

/// Runs taint eviction until the task is aborted, as upstream's taint-eviction controller: a
/// node's NoExecute taints changing queues the pods bound to it, a pod bound or changed
/// queues itself; a pod that tolerates its node's taints for a while is looked at again when
/// that time is up.
async fn evict_by_taints(informers: Arc<Informers>) {
    let nodes = informers.get::<Node>();
    let pods = informers.get::<Pod>();
    let pods_by_node = pods.index(BY_NODE, pod_node);
    let client = informers.client().clone();
    let queue = Arc::new(WorkQueue::new("noexec_taint_pod"));
    let on_node = queue.clone();
    let bound = pods_by_node.clone();
    nodes.on_change(move |change| {
        let before = change.old.map(no_execute_taints).unwrap_or_default();
        let after = change.new.map(no_execute_taints).unwrap_or_default();
        if before == after {
            return;
        }
        if let Some(name) = change.objects().find_map(|n| n.metadata.name.clone()) {
            for pod in bound.get(&name) {
                on_node.add(pods::key(&pod.metadata));
            }
        }
    });
    let on_pod = queue.clone();
    pods.on_change(move |change| {
        let moved = match (change.old, change.new) {
            (Some(old), Some(new)) => {
                pod_node(old) != pod_node(new)
                    || old.spec.as_ref().map(|s| &s.tolerations)
                        != new.spec.as_ref().map(|s| &s.tolerations)
            }
            _ => true,
        };
        if moved && let Some(pod) = change.new.or(change.old) {
            on_pod.add(pods::key(&pod.metadata));
        }
    });
    nodes.ready().await;
    pods.ready().await;
    let clock: Mutex<EvictionClock> = Mutex::default();
    run_workers(&queue, CONCURRENT_SYNCS, |key: String| {
        evict_if_due(&client, &nodes, &pods, &clock, key)
    })
    .await
}

/// Deletes the pod `key` if its node's NoExecute taints are due for it; otherwise says when
/// they will be.
async fn evict_if_due(
    client: &kube::Client,
    nodes: &Informer<Node>,
    pods: &Informer<Pod>,
    clock: &Mutex<EvictionClock>,
    key: String,
) -> Result<Requeue, kube::Error> {
    let forget = || {
        clock.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        Ok(Requeue::No)
    };
    let (namespace, name) = pods::split_key(&key);
    let Some(pod) = pods.get(namespace, name) else {
        return forget();
    };
    if pod.metadata.deletion_timestamp.is_some() || pods::is_finished(&pod) {
        return forget();
    }
    let Some(node) = pod_node(&pod).pop().and_then(|n| nodes.get("", &n)) else {
        return forget();
    };
    let taints = no_execute_taints(&node);
    if taints.is_empty() {
        return forget();
    }
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default();
    let now = Timestamp::now();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let (evict, later) = due(
        &mut clock.lock().unwrap_or_else(|p| p.into_inner()),
        &key,
        &uid,
        eviction_for(&taints, &tolerations),
        now,
    );
    if evict {
        delete_by_taint_manager(client, &pod).await?;
        return Ok(Requeue::No);
    }
    Ok(later.map_or(Requeue::No, |at| {
        Requeue::After(Duration::try_from(at.duration_since(now)).unwrap_or(Duration::ZERO))
    }))
}

async fn delete_by_taint_manager(client: &kube::Client, pod: &Pod) -> Result<(), kube::Error> {
    let (Some(name), Some(namespace)) = (&pod.metadata.name, &pod.metadata.namespace) else {
        return Ok(());
    };
    tracing::info!(pod = %name, %namespace, "deleting pod for a NoExecute taint it does not tolerate");
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let marked = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter().any(|c| {
                c.type_ == "DisruptionTarget"
                    && c.status == "True"
                    && c.reason.as_deref() == Some("DeletionByTaintManager")
            })
        });
    if !marked {
        let patch = json!({"status": {"conditions": [{
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "DeletionByTaintManager",
            "message": "Taint manager: deleting due to NoExecute taint",
            "lastTransitionTime": Timestamp::now().to_string(),
        }]}});
        match api
            .patch_status(
                name,
                &pods::manager(EVICTION_MANAGER),
                &Patch::Strategic(&patch),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            Err(err) => return Err(err),
        }
    }
    pods::delete(&api, name, &DeleteParams::default()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(value: serde_json::Value) -> Node {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))
    }

    fn ts(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap_or_else(|e| panic!("{e}"))
    }

    fn ready_node(heartbeat: i64) -> Node {
        node(json!({
            "metadata": {"name": "n", "creationTimestamp": ts(0).to_string()},
            "status": {"conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "lastHeartbeatTime": ts(heartbeat).to_string(), "lastTransitionTime": ts(0).to_string()},
                {"type": "MemoryPressure", "status": "False",
                 "lastHeartbeatTime": ts(heartbeat).to_string(), "lastTransitionTime": ts(0).to_string()},
            ]},
        }))
    }

    fn lease(renewed: i64) -> Lease {
        serde_json::from_value(
            json!({"metadata": {"name": "n"}, "spec": {"renewTime": format!("{}", ts(renewed))}}),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn probe_time_moves_only_when_a_heartbeat_moves() {
        let first = observe(None, &ready_node(0), Some(&lease(0)), ts(5));
        assert_eq!(first.probed_at, ts(5));
        // Nothing moved: the probe time stays, so the node goes silent.
        let same = observe(Some(&first), &ready_node(0), Some(&lease(0)), ts(30));
        assert_eq!(same.probed_at, ts(5));
        // A lease renewal alone keeps the node alive.
        let renewed = observe(Some(&same), &ready_node(0), Some(&lease(20)), ts(35));
        assert_eq!(renewed.probed_at, ts(35));
        // So does a new Ready heartbeat.
        let beat = observe(Some(&renewed), &ready_node(40), Some(&lease(20)), ts(50));
        assert_eq!(beat.probed_at, ts(50));
        // A node that never posted status counts from its creation.
        let fresh =
            node(json!({"metadata": {"name": "n", "creationTimestamp": ts(-100).to_string()}}));
        assert_eq!(observe(None, &fresh, None, ts(0)).probed_at, ts(-100));
    }

    #[test]
    fn silent_nodes_get_unknown_conditions_once() {
        let conditions = unknown_conditions(&ready_node(0), ts(60)).expect("changed");
        let ready = conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .expect("ready");
        assert_eq!(ready.status, "Unknown");
        assert_eq!(ready.reason.as_deref(), Some("NodeStatusUnknown"));
        assert_eq!(
            ready.message.as_deref(),
            Some("Kubelet stopped posting node status.")
        );
        assert_eq!(ready.last_heartbeat_time, Some(Time(ts(0))));
        let never = conditions
            .iter()
            .find(|c| c.type_ == "DiskPressure")
            .expect("added");
        assert_eq!(never.reason.as_deref(), Some("NodeStatusNeverUpdated"));
        assert_eq!(conditions.len(), 4);
        let mut updated = ready_node(0);
        if let Some(status) = updated.status.as_mut() {
            status.conditions = Some(conditions);
        }
        assert!(unknown_conditions(&updated, ts(70)).is_none());
    }

    fn with_ready(status: &str, taints: serde_json::Value, unschedulable: bool) -> Node {
        node(json!({
            "metadata": {"name": "n"},
            "spec": {"taints": taints, "unschedulable": unschedulable},
            "status": {"conditions": [{"type": "Ready", "status": status}]},
        }))
    }

    fn keys(taints: &[Taint]) -> Vec<String> {
        taints
            .iter()
            .map(|t| format!("{}:{}", t.key, t.effect))
            .collect()
    }

    #[test]
    fn taints_follow_the_ready_condition() {
        let unknown =
            desired_taints(&with_ready("Unknown", json!([]), false), true, ts(0)).expect("tainted");
        assert_eq!(
            keys(&unknown),
            [
                "node.kubernetes.io/unreachable:NoSchedule",
                "node.kubernetes.io/unreachable:NoExecute"
            ]
        );
        assert!(unknown[1].time_added.is_some() && unknown[0].time_added.is_none());
        // Unknown → False swaps the taints and keeps the user's own.
        let swapped = desired_taints(
            &with_ready(
                "False",
                json!([
                    {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
                    {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
                    {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
                ]),
                false,
            ),
            true,
            ts(0),
        )
        .expect("changed");
        assert_eq!(
            keys(&swapped),
            [
                "dedicated:NoSchedule",
                "node.kubernetes.io/not-ready:NoSchedule",
                "node.kubernetes.io/not-ready:NoExecute"
            ]
        );
        // Healthy again: the controller's taints go, a cordon adds unschedulable.
        let healthy = desired_taints(
            &with_ready(
                "True",
                json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]),
                true,
            ),
            true,
            ts(0),
        )
        .expect("changed");
        assert_eq!(
            keys(&healthy),
            ["node.kubernetes.io/unschedulable:NoSchedule"]
        );
        // Full disruption: no NoExecute taints.
        let disrupted = desired_taints(&with_ready("Unknown", json!([]), false), false, ts(0))
            .expect("tainted");
        assert_eq!(
            keys(&disrupted),
            ["node.kubernetes.io/unreachable:NoSchedule"]
        );
        // Already as wanted: no write.
        assert!(desired_taints(&with_ready("True", json!([]), false), true, ts(0)).is_none());
    }

    fn toleration(value: serde_json::Value) -> Toleration {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn toleration_timing() {
        let unreachable = Taint {
            key: TAINT_UNREACHABLE.into(),
            effect: NO_EXECUTE.into(),
            ..Default::default()
        };
        let dedicated = Taint {
            key: "dedicated".into(),
            value: Some("db".into()),
            effect: NO_EXECUTE.into(),
            ..Default::default()
        };
        let five = toleration(
            json!({"key": TAINT_UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}),
        );
        let default = toleration(
            json!({"key": TAINT_UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}),
        );
        let forever = toleration(json!({"operator": "Exists"}));
        let db = toleration(json!({"key": "dedicated", "value": "db", "effect": "NoExecute"}));
        let other = toleration(json!({"key": "dedicated", "value": "web"}));
        for (taints, tolerations, want) in [
            (vec![], vec![], Eviction::Never),
            (vec![&unreachable], vec![], Eviction::Now),
            (
                vec![&unreachable],
                vec![five.clone()],
                Eviction::After(Duration::from_secs(5)),
            ),
            // The first matching toleration is the one used.
            (
                vec![&unreachable],
                vec![default.clone(), five.clone()],
                Eviction::After(Duration::from_secs(300)),
            ),
            (vec![&unreachable], vec![forever.clone()], Eviction::Never),
            (
                vec![&unreachable, &dedicated],
                vec![five.clone(), db.clone()],
                Eviction::After(Duration::from_secs(5)),
            ),
            (
                vec![&unreachable, &dedicated],
                vec![five.clone(), other],
                Eviction::Now,
            ),
            (vec![&dedicated], vec![db], Eviction::Never),
            (
                vec![&unreachable],
                vec![toleration(
                    json!({"key": TAINT_UNREACHABLE, "operator": "Exists", "tolerationSeconds": 0}),
                )],
                Eviction::Now,
            ),
        ] {
            assert_eq!(
                eviction_for(&taints, &tolerations),
                want,
                "{taints:?} {tolerations:?}"
            );
        }
    }

    #[test]
    fn a_toleration_runs_from_the_first_sighting() {
        let mut clock = EvictionClock::new();
        let five = Eviction::After(Duration::from_secs(5));
        assert_eq!(
            due(&mut clock, "ns/p", "u", five, ts(0)),
            (false, Some(ts(5)))
        );
        assert_eq!(
            due(&mut clock, "ns/p", "u", five, ts(3)),
            (false, Some(ts(5)))
        );
        assert_eq!(due(&mut clock, "ns/p", "u", five, ts(5)), (true, None));
        // The taint went away: the clock restarts next time.
        let never = Eviction::Never;
        assert_eq!(due(&mut clock, "ns/p", "u", never, ts(6)), (false, None));
        assert_eq!(
            due(&mut clock, "ns/p", "u", five, ts(7)),
            (false, Some(ts(12)))
        );
        // A new pod under the same name starts its own clock.
        assert_eq!(
            due(&mut clock, "ns/p", "u2", five, ts(8)),
            (false, Some(ts(13)))
        );
    }
}
