//! In-place pod resize on the node (KEP 1287; upstream's allocation manager and the runtime
//! manager's resize actions): the resources the kubelet admitted for each pod's resizable
//! containers (allocated) and those the runtime accepted (actuated), checkpointed under the
//! root directory so a restarted kubelet neither forgets a resize nor repeats one; whether a
//! resize fits the node now (`Deferred`) or ever (`Infeasible`); bringing running containers
//! to their allocation, in place or by a restart; and the `PodResizePending` /
//! `PodResizeInProgress` conditions.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Container, Pod, PodCondition, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

use crate::cri::{Cri, CriError};
use crate::events::Recorder;
use crate::hooks::{self, KillReason};
use crate::resources;
use crate::status::is_restartable_init;

/// The checkpoint's file under the kubelet's root directory.
const CHECKPOINT: &str = "allocated_pods_state.json";

/// A pod's CPU (millicores) and memory (bytes) requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requests {
    pub milli_cpu: i64,
    pub memory: i64,
}

/// What the kubelet holds for one pod.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct PodAllocation {
    /// Admitted resources by container name (app containers and sidecars).
    allocated: BTreeMap<String, ResourceRequirements>,
    /// What the runtime accepted for each container (on create or update).
    actuated: BTreeMap<String, ResourceRequirements>,
    /// The pod's requests under `allocated`, which other pods' resizes must fit beside.
    requests: Requests,
    /// Why the spec's resources are not allocated: (`Deferred` or `Infeasible`, message).
    #[serde(skip)]
    pending: Option<(String, String)>,
    /// The last failed actuation, reported as the `Error` reason of `PodResizeInProgress`.
    #[serde(skip)]
    error: Option<String>,
}

/// Every pod's allocation on this node.
pub struct Allocations {
    path: Option<PathBuf>,
    allocatable: Requests,
    pods: Mutex<BTreeMap<String, PodAllocation>>,
}

impl Allocations {
    /// The allocations checkpointed under `root_dir` (none when the file is missing or
    /// unreadable: every pod is then admitted again at its spec), for a node of `allocatable`.
    pub fn load(root_dir: &std::path::Path, allocatable: Requests) -> Self {
        let path = root_dir.join(CHECKPOINT);
        let pods = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|err| {
                tracing::warn!(path = %path.display(), %err, "ignoring an unreadable allocation checkpoint");
                BTreeMap::new()
            }),
            Err(_) => BTreeMap::new(),
        };
        Self {
            path: Some(path),
            allocatable,
            pods: Mutex::new(pods),
        }
    }

    /// Allocations kept in memory only (tests).
    #[cfg(test)]
    fn in_memory(allocatable: Requests) -> Self {
        Self {
            path: None,
            allocatable,
            pods: Mutex::new(BTreeMap::new()),
        }
    }

    fn save(&self, pods: &BTreeMap<String, PodAllocation>) {
        let Some(path) = &self.path else {
            return;
        };
        let written = serde_json::to_vec(pods)
            .map_err(std::io::Error::other)
            .and_then(|bytes| {
                // Written aside and renamed, so a crash leaves the old checkpoint or the new.
                let partial = path.with_extension("json.tmp");
                std::fs::write(&partial, bytes)?;
                std::fs::rename(&partial, path)
            });
        if let Err(err) = written {
            tracing::warn!(path = %path.display(), %err, "writing the allocation checkpoint failed");
        }
    }

    /// Admits `pod` (its first sync here) or decides its pending resize (upstream's
    /// `handlePodResourcesResize`), and returns the pod as the kubelet runs it: with its
    /// containers' resources as allocated. A resize is taken whole or not at all.
    pub fn allocate(&self, pod: &Pod) -> Pod {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return pod.clone();
        };
        let desired = resizable(pod);
        let Ok(mut pods) = self.pods.lock() else {
            return pod.clone();
        };
        let (running, changed) = match pods.get(uid).map(|a| a.allocated == desired) {
            None => {
                let allocation = pods.entry(uid.to_string()).or_default();
                allocation.allocated = desired;
                allocation.requests = pod_requests(pod);
                (pod.clone(), true)
            }
            Some(true) => {
                if let Some(allocation) = pods.get_mut(uid) {
                    allocation.pending = None;
                }
                (pod.clone(), false)
            }
            Some(false) => {
                let wanted = pod_requests(pod);
                // What the node's other pods hold: summed only when a resize is judged.
                let others = pods.iter().filter(|(other, _)| other.as_str() != uid).fold(
                    Requests::default(),
                    |sum, (_, a)| Requests {
                        milli_cpu: sum.milli_cpu + a.requests.milli_cpu,
                        memory: sum.memory + a.requests.memory,
                    },
                );
                let pending = self.misfit(wanted, others);
                let allocation = pods.entry(uid.to_string()).or_default();
                allocation.pending = pending;
                if allocation.pending.is_none() {
                    allocation.allocated = desired;
                    allocation.requests = wanted;
                    allocation.error = None;
                    (pod.clone(), true)
                } else {
                    (with_resources(pod, &allocation.allocated), false)
                }
            }
        };
        if changed {
            self.save(&pods);
        }
        running
    }

    /// Why `wanted` cannot be allocated beside `others`: `Infeasible` when it exceeds the
    /// node, `Deferred` when the node's other pods leave too little (upstream's texts).
    fn misfit(&self, wanted: Requests, others: Requests) -> Option<(String, String)> {
        let capacity = self.allocatable;
        if wanted.memory > capacity.memory {
            return Some(infeasible(format!(
                "memory, requested: {}, capacity: {}",
                wanted.memory, capacity.memory
            )));
        }
        if wanted.milli_cpu > capacity.milli_cpu {
            return Some(infeasible(format!(
                "cpu, requested: {}, capacity: {}",
                wanted.milli_cpu, capacity.milli_cpu
            )));
        }
        let short = [
            (
                "cpu",
                wanted.milli_cpu,
                others.milli_cpu,
                capacity.milli_cpu,
            ),
            ("memory", wanted.memory, others.memory, capacity.memory),
        ]
        .into_iter()
        .find(|(_, requested, used, capacity)| requested + used > *capacity)?;
        let (name, requested, used, capacity) = short;
        Some((
            "Deferred".into(),
            format!(
                "Node didn't have enough resource: {name}, requested: {requested}, used: {used}, capacity: {capacity}"
            ),
        ))
    }

    /// What the runtime last accepted for `container` of pod `uid`.
    pub fn actuated(&self, uid: &str, container: &str) -> Option<ResourceRequirements> {
        let pods = self.pods.lock().ok()?;
        pods.get(uid)?.actuated.get(container).cloned()
    }

    /// Records that the runtime accepted `resources` for `container` of pod `uid` (a create
    /// or an update), clearing a failed actuation.
    pub fn set_actuated(&self, uid: &str, container: &Container) {
        let Ok(mut pods) = self.pods.lock() else {
            return;
        };
        let Some(allocation) = pods.get_mut(uid) else {
            return;
        };
        if !allocation.allocated.contains_key(&container.name) {
            return;
        }
        let resources = container.resources.clone().unwrap_or_default();
        if allocation.actuated.get(&container.name) == Some(&resources) {
            return;
        }
        allocation
            .actuated
            .insert(container.name.clone(), resources);
        self.save(&pods);
    }

    /// Records a failed actuation of pod `uid`'s resize.
    pub fn set_error(&self, uid: &str, message: Option<String>) {
        if let Ok(mut pods) = self.pods.lock()
            && let Some(allocation) = pods.get_mut(uid)
        {
            allocation.error = message;
        }
    }

    /// Forgets pod `uid` (finished or gone): its resources are free for other resizes.
    pub fn release(&self, uid: &str) {
        if let Ok(mut pods) = self.pods.lock()
            && pods.remove(uid).is_some()
        {
            self.save(&pods);
        }
    }

    /// Forgets every pod not in `known` (pods deleted while the kubelet was down).
    pub fn retain(&self, known: &std::collections::HashSet<String>) {
        if let Ok(mut pods) = self.pods.lock() {
            let before = pods.len();
            pods.retain(|uid, _| known.contains(uid));
            if pods.len() != before {
                self.save(&pods);
            }
        }
    }

    /// The resize conditions of pod `uid` (upstream's status manager): `PodResizePending`
    /// while a resize is not allocated, `PodResizeInProgress` while `in_progress` (an
    /// allocated resize a running container has not taken yet), with reason `Error` after a
    /// failed actuation. Each keeps its times while its reason and message stay.
    pub fn conditions(
        &self,
        uid: &str,
        in_progress: bool,
        old: &[PodCondition],
        now: &Time,
    ) -> Vec<PodCondition> {
        let Ok(pods) = self.pods.lock() else {
            return Vec::new();
        };
        let Some(allocation) = pods.get(uid) else {
            return Vec::new();
        };
        let mut conditions = Vec::new();
        if let Some((reason, message)) = &allocation.pending {
            conditions.push(resize_condition(
                old,
                "PodResizePending",
                reason,
                message,
                now,
            ));
        }
        if in_progress {
            let (reason, message) = match &allocation.error {
                Some(message) => ("Error", message.as_str()),
                None => ("", ""),
            };
            conditions.push(resize_condition(
                old,
                "PodResizeInProgress",
                reason,
                message,
                now,
            ));
        }
        conditions
    }
}

fn infeasible(what: String) -> (String, String) {
    (
        "Infeasible".into(),
        format!("Node didn't have enough capacity: {what}"),
    )
}

/// A resize condition, with the old one's times when its reason and message are the same.
fn resize_condition(
    old: &[PodCondition],
    kind: &str,
    reason: &str,
    message: &str,
    now: &Time,
) -> PodCondition {
    let non_empty = |text: &str| (!text.is_empty()).then(|| text.to_string());
    let condition = PodCondition {
        type_: kind.to_string(),
        status: "True".into(),
        reason: non_empty(reason),
        message: non_empty(message),
        last_probe_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
        ..Default::default()
    };
    match old.iter().find(|c| c.type_ == kind) {
        Some(kept) if kept.reason == condition.reason && kept.message == condition.message => {
            kept.clone()
        }
        _ => condition,
    }
}

/// Whether a resize condition is the kubelet's to set (it drops the old ones each sync).
pub fn is_resize_condition(condition: &PodCondition) -> bool {
    matches!(
        condition.type_.as_str(),
        "PodResizePending" | "PodResizeInProgress"
    )
}

/// The containers a resize may change (app containers and sidecars) with their resources.
fn resizable(pod: &Pod) -> BTreeMap<String, ResourceRequirements> {
    let Some(spec) = &pod.spec else {
        return BTreeMap::new();
    };
    spec.containers
        .iter()
        .chain(
            spec.init_containers
                .iter()
                .flatten()
                .filter(|c| is_restartable_init(c)),
        )
        .map(|c| (c.name.clone(), c.resources.clone().unwrap_or_default()))
        .collect()
}

/// `pod` with its resizable containers' resources replaced by `allocated`.
fn with_resources(pod: &Pod, allocated: &BTreeMap<String, ResourceRequirements>) -> Pod {
    let mut pod = pod.clone();
    if let Some(spec) = pod.spec.as_mut() {
        for container in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
        {
            if let Some(resources) = allocated.get(&container.name) {
                container.resources = Some(resources.clone());
            }
        }
    }
    pod
}

/// A pod's CPU and memory requests (upstream's `PodRequests`): app containers and sidecars
/// summed, at least each init container beside the sidecars before it, plus overhead.
pub fn pod_requests(pod: &Pod) -> Requests {
    let Some(spec) = &pod.spec else {
        return Requests::default();
    };
    let of = |c: &Container| {
        let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        Requests {
            milli_cpu: resources::get(requests, "cpu").unwrap_or(0),
            memory: resources::get(requests, "memory").unwrap_or(0),
        }
    };
    let add = |a: Requests, b: Requests| Requests {
        milli_cpu: a.milli_cpu + b.milli_cpu,
        memory: a.memory + b.memory,
    };
    let max = |a: Requests, b: Requests| Requests {
        milli_cpu: a.milli_cpu.max(b.milli_cpu),
        memory: a.memory.max(b.memory),
    };
    let mut total = spec
        .containers
        .iter()
        .map(of)
        .fold(Requests::default(), add);
    let (mut sidecars, mut init) = (Requests::default(), Requests::default());
    for container in spec.init_containers.iter().flatten() {
        if is_restartable_init(container) {
            total = add(total, of(container));
            sidecars = add(sidecars, of(container));
            init = max(init, sidecars);
        } else {
            init = max(init, add(of(container), sidecars));
        }
    }
    let overhead = Requests {
        milli_cpu: resources::get(spec.overhead.as_ref(), "cpu").unwrap_or(0),
        memory: resources::get(spec.overhead.as_ref(), "memory").unwrap_or(0),
    };
    add(max(total, init), overhead)
}

/// The resources (CPU, memory) whose requests or limits differ between `a` and `b`.
pub fn changed(a: &ResourceRequirements, b: &ResourceRequirements) -> Vec<&'static str> {
    let amount = |r: &ResourceRequirements, limits: bool, name: &str| {
        let list = if limits { &r.limits } else { &r.requests };
        resources::get(list.as_ref(), name)
    };
    ["cpu", "memory"]
        .into_iter()
        .filter(|name| {
            amount(a, false, name) != amount(b, false, name)
                || amount(a, true, name) != amount(b, true, name)
        })
        .collect()
}

/// Whether resizing `resource` of `container` restarts it (its `resizePolicy`).
pub fn restarts_on_resize(container: &Container, resource: &str) -> bool {
    container
        .resize_policy
        .iter()
        .flatten()
        .any(|p| p.resource_name == resource && p.restart_policy == "RestartContainer")
}

/// A running container of the pod and its runtime id.
pub struct Running<'a> {
    pub container: &'a Container,
    pub id: String,
}

/// Brings `running` containers of `pod` (as allocated) to their allocation (upstream's
/// `computePodResizeAction` and `doPodResizeAction`): a container whose changed resource has
/// the `RestartContainer` resize policy is stopped, to start again at its allocation; the
/// others are updated in place through the runtime, those whose limits go down first, and
/// none goes up once one failed to come down. Returns the names of the containers stopped.
#[allow(clippy::too_many_arguments)] // the pod worker's pieces, passed rather than shared
pub async fn actuate(
    allocations: &Allocations,
    recorder: &Recorder,
    cri: &mut Cri,
    pod: &Pod,
    uid: &str,
    running: &[Running<'_>],
    memory_capacity: i64,
    pod_ip: &str,
) -> Result<Vec<String>, CriError> {
    let mut stopped = Vec::new();
    let mut updates = Vec::new();
    for Running { container, id } in running {
        let allocated = container.resources.clone().unwrap_or_default();
        // Without a record of what the runtime took (a lost checkpoint), the update is sent
        // again: the runtime takes the same limits twice without harm.
        let actuated = allocations.actuated(uid, &container.name);
        let changes = match &actuated {
            Some(actuated) => changed(actuated, &allocated),
            None => vec!["cpu", "memory"],
        };
        if changes.is_empty() {
            continue;
        }
        if changes.iter().any(|r| restarts_on_resize(container, r)) {
            let name = &container.name;
            let grace = hooks::grace_period(pod, Some(container), KillReason::Other);
            hooks::kill_container(
                cri,
                recorder,
                pod,
                name,
                Some(container),
                id,
                grace,
                Some(format!("Container {name} resize requires restart")),
                pod_ip,
            )
            .await?;
            stopped.push(name.clone());
            continue;
        }
        let lowered = actuated.is_some_and(|actuated| limits_lowered(&actuated, &allocated));
        updates.push((!lowered, *container, id));
    }
    // Decreases first, so the containers never hold more than the pod is allowed.
    updates.sort_by_key(|(raising, _, _)| *raising);
    let mut error = None;
    for (raising, container, id) in updates {
        if raising && error.is_some() {
            break;
        }
        let linux = resources::linux_resources(pod, container, memory_capacity);
        match cri.update_resources(id, linux).await {
            Ok(()) => {
                tracing::info!(pod = ?pod.metadata.name, container = %container.name, "container resized in place");
                allocations.set_actuated(uid, container);
            }
            Err(err) => {
                tracing::warn!(pod = ?pod.metadata.name, container = %container.name, %err, "resizing the container failed");
                error.get_or_insert(format!(
                    "failed to resize container {}: {err}",
                    container.name
                ));
            }
        }
    }
    allocations.set_error(uid, error);
    Ok(stopped)
}

/// Whether a CPU or memory limit of `before` is lower in `after` (or newly set).
fn limits_lowered(before: &ResourceRequirements, after: &ResourceRequirements) -> bool {
    let limit = |r: &ResourceRequirements, name: &str| resources::get(r.limits.as_ref(), name);
    ["cpu", "memory"]
        .into_iter()
        .any(|name| match (limit(before, name), limit(after, name)) {
            (Some(old), Some(new)) => new < old,
            (None, Some(_)) => true,
            _ => false,
        })
}

/// Whether one of `running` containers has not taken its allocation yet.
pub fn in_progress(allocations: &Allocations, uid: &str, running: &[Running<'_>]) -> bool {
    running.iter().any(|Running { container, .. }| {
        let allocated = container.resources.clone().unwrap_or_default();
        allocations
            .actuated(uid, &container.name)
            .is_none_or(|actuated| !changed(&actuated, &allocated).is_empty())
    })
}

/// `status.containerStatuses[].resources` (upstream's `convertContainerStatusResources`): what
/// the runtime took for a running container, the allocation for any other; nothing for a
/// container a resize cannot touch (ephemeral and plain init containers).
pub fn status_resources(
    allocations: &Allocations,
    uid: &str,
    container: &Container,
    running: bool,
) -> Option<ResourceRequirements> {
    let pods = allocations.pods.lock().ok()?;
    let allocation = pods.get(uid)?;
    let allocated = allocation.allocated.get(&container.name)?;
    let actuated = running
        .then(|| allocation.actuated.get(&container.name))
        .flatten();
    Some(actuated.unwrap_or(allocated).clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(uid: &str, cpu: &str, memory: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": uid, "uid": uid},
            "spec": {"containers": [{"name": "app", "resources": {
                "requests": {"cpu": cpu, "memory": memory},
                "limits": {"cpu": cpu, "memory": memory},
            }}]},
        }))
        .expect("pod")
    }

    fn cpu_of(pod: &Pod) -> String {
        let spec = pod.spec.as_ref().expect("spec");
        let resources = spec.containers[0].resources.as_ref().expect("resources");
        resources.requests.as_ref().expect("requests")["cpu"]
            .0
            .clone()
    }

    fn pending(allocations: &Allocations, uid: &str) -> Option<(String, String)> {
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let conditions = allocations.conditions(uid, false, &[], &now);
        conditions.first().map(|c| {
            (
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
    }

    #[test]
    fn a_resize_is_allocated_deferred_or_infeasible_as_upstream() {
        // Upstream's TestHandlePodResourcesResize, on a node of 4 CPUs and 4 GiB.
        let node = Requests {
            milli_cpu: 4000,
            memory: 4 << 30,
        };
        let allocations = Allocations::in_memory(node);
        allocations.allocate(&pod("a", "1", "1Gi"));
        allocations.allocate(&pod("b", "1", "1Gi"));

        // Fits beside b: allocated, no condition.
        let running = allocations.allocate(&pod("a", "1500m", "1Gi"));
        assert_eq!(cpu_of(&running), "1500m");
        assert_eq!(pending(&allocations, "a"), None);

        // More than the node has: infeasible, and the pod runs at its allocation.
        let running = allocations.allocate(&pod("a", "5", "1Gi"));
        assert_eq!(cpu_of(&running), "1500m");
        assert_eq!(
            pending(&allocations, "a"),
            Some((
                "Infeasible".into(),
                "Node didn't have enough capacity: cpu, requested: 5000, capacity: 4000".into()
            ))
        );
        let running = allocations.allocate(&pod("a", "1", "4500M"));
        assert_eq!(
            pending(&allocations, "a").map(|p| p.1),
            Some(
                "Node didn't have enough capacity: memory, requested: 4500000000, capacity: 4294967296"
                    .into()
            )
        );
        assert_eq!(cpu_of(&running), "1500m");

        // Fits the node but not beside b: deferred, until b is gone.
        allocations.allocate(&pod("a", "3500m", "1Gi"));
        assert_eq!(
            pending(&allocations, "a"),
            Some((
                "Deferred".into(),
                "Node didn't have enough resource: cpu, requested: 3500, used: 1000, capacity: 4000"
                    .into()
            ))
        );
        allocations.release("b");
        let running = allocations.allocate(&pod("a", "3500m", "1Gi"));
        assert_eq!(cpu_of(&running), "3500m");
        assert_eq!(pending(&allocations, "a"), None);
    }

    #[test]
    fn actuation_is_tracked_per_container() {
        let allocations = Allocations::in_memory(Requests {
            milli_cpu: 4000,
            memory: 4 << 30,
        });
        let first = pod("a", "1", "1Gi");
        allocations.allocate(&first);
        let container = &first.spec.as_ref().expect("spec").containers[0];
        assert_eq!(allocations.actuated("a", "app"), None);
        allocations.set_actuated("a", container);
        let actuated = allocations.actuated("a", "app").expect("actuated");
        let resized = allocations.allocate(&pod("a", "2", "1Gi"));
        let wanted = resized.spec.as_ref().expect("spec").containers[0]
            .resources
            .clone()
            .expect("resources");
        assert_eq!(changed(&actuated, &wanted), vec!["cpu"]);
    }

    #[test]
    fn sidecars_count_beside_app_and_later_init_containers() {
        let pod: Pod = serde_json::from_value(json!({"spec": {
            "containers": [{"name": "app", "resources": {"requests": {"cpu": "200m"}}}],
            "initContainers": [
                {"name": "sidecar", "restartPolicy": "Always",
                 "resources": {"requests": {"cpu": "100m", "memory": "1Mi"}}},
                {"name": "init", "resources": {"requests": {"cpu": "250m"}}},
            ],
        }}))
        .expect("pod");
        assert_eq!(
            pod_requests(&pod),
            Requests {
                milli_cpu: 350,
                memory: 1 << 20
            }
        );
        assert_eq!(resizable(&pod).len(), 2);
    }

    #[test]
    fn conditions_keep_their_times_while_unchanged() {
        let allocations = Allocations::in_memory(Requests {
            milli_cpu: 1000,
            memory: 1 << 30,
        });
        allocations.allocate(&pod("a", "500m", "1Mi"));
        allocations.allocate(&pod("a", "2", "1Mi"));
        let then = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let first = allocations.conditions("a", true, &[], &then);
        assert_eq!(
            first.iter().map(|c| c.type_.as_str()).collect::<Vec<_>>(),
            ["PodResizePending", "PodResizeInProgress"]
        );
        let later = Time(k8s_openapi::jiff::Timestamp::now());
        let again = allocations.conditions("a", true, &first, &later);
        assert_eq!(again, first);
        allocations.set_error("a", Some("boom".into()));
        let failed = allocations.conditions("a", true, &first, &later);
        assert_eq!(failed[1].reason.as_deref(), Some("Error"));
        assert_eq!(failed[1].last_transition_time, Some(later));
    }
}
