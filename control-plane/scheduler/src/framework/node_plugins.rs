//! The plugins that look at one node at a time (upstream's `plugins/{queuesort,
//! nodeunschedulable, nodename, tainttoleration, nodeaffinity, nodeports, noderesources}`):
//! PrioritySort, NodeUnschedulable, NodeName, TaintToleration, NodeAffinity, NodePorts,
//! NodeResourcesFit (least-allocated scoring) and NodeResourcesBalancedAllocation.

use k8s_openapi::api::core::v1::{Taint, Toleration};

use super::selector::{node_selector_matches, node_selector_term_matches};
use super::{
    Code, CycleState, MAX_NODE_SCORE, NodeInfo, NodeScore, Plugin, PodInfo, QueuedOrder, Snapshot,
    Status, default_normalize_score,
};

/// Upstream `Toleration.ToleratesTaint`.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = toleration.effect.as_deref().filter(|e| !e.is_empty())
        && effect != taint.effect
    {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("") {
        "Exists" => true,
        "Equal" | "" => {
            toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        _ => false,
    }
}

/// The first NoSchedule / NoExecute taint no toleration tolerates (upstream's
/// `FindMatchingUntoleratedTaint` with `doNotScheduleTaintsFilterFunc`).
pub fn untolerated_taint<'a>(taints: &'a [Taint], tolerations: &[Toleration]) -> Option<&'a Taint> {
    taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .find(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
}

/// Whether `spec.nodeSelector` and the required node affinity of `pod` select `node` (upstream's
/// `RequiredNodeAffinity.Match`).
pub fn matches_node_selector(pod: &PodInfo, node: &NodeInfo) -> bool {
    let Some(spec) = &pod.pod.spec else {
        return true;
    };
    let labels = node.labels();
    if let Some(selector) = &spec.node_selector
        && !selector
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
    {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    required.is_none_or(|required| node_selector_matches(required, &node.name, labels))
}

/// QueueSort: higher priority first, then the pod queued earlier.
pub struct PrioritySort;

impl Plugin for PrioritySort {
    fn name(&self) -> &'static str {
        "PrioritySort"
    }
    fn less(&self, a: &QueuedOrder, b: &QueuedOrder) -> bool {
        a.priority > b.priority || (a.priority == b.priority && a.timestamp < b.timestamp)
    }
}

/// Rejects nodes with `spec.unschedulable` unless the pod tolerates
/// `node.kubernetes.io/unschedulable:NoSchedule`.
pub struct NodeUnschedulable;

impl Plugin for NodeUnschedulable {
    fn name(&self) -> &'static str {
        "NodeUnschedulable"
    }
    fn filter(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo, _: &Snapshot) -> Status {
        let unschedulable = node.node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
        if !unschedulable {
            return Status::success();
        }
        let taint = Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        if pod.tolerations().iter().any(|t| tolerates(t, &taint)) {
            Status::success()
        } else {
            Status::new(
                Code::UnschedulableAndUnresolvable,
                "node(s) were unschedulable",
            )
        }
    }
}

/// Rejects every node but the one in `spec.nodeName`, if set.
pub struct NodeName;

impl Plugin for NodeName {
    fn name(&self) -> &'static str {
        "NodeName"
    }
    fn filter(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo, _: &Snapshot) -> Status {
        match pod.node_name() {
            Some(wanted) if wanted != node.name => Status::new(
                Code::UnschedulableAndUnresolvable,
                "node(s) didn't match the requested node name",
            ),
            _ => Status::success(),
        }
    }
}

/// Rejects nodes with an untolerated NoSchedule/NoExecute taint; scores fewer untolerated
/// PreferNoSchedule taints higher.
pub struct TaintToleration;

impl Plugin for TaintToleration {
    fn name(&self) -> &'static str {
        "TaintToleration"
    }
    fn filter(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo, _: &Snapshot) -> Status {
        match untolerated_taint(node.taints(), pod.tolerations()) {
            None => Status::success(),
            Some(taint) => Status::new(
                Code::UnschedulableAndUnresolvable,
                format!(
                    "node(s) had untolerated taint {{{}: {}}}",
                    taint.key,
                    taint.value.as_deref().unwrap_or("")
                ),
            ),
        }
    }
    fn pre_score(&self, _: &mut CycleState, _: &PodInfo, _: &Snapshot, _: &[usize]) -> Status {
        Status::success()
    }
    fn score(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo) -> i64 {
        // Only tolerations with an empty or PreferNoSchedule effect count here.
        let tolerations: Vec<&Toleration> = pod
            .tolerations()
            .iter()
            .filter(|t| {
                t.effect
                    .as_deref()
                    .is_none_or(|e| e.is_empty() || e == "PreferNoSchedule")
            })
            .collect();
        node.taints()
            .iter()
            .filter(|t| t.effect == "PreferNoSchedule")
            .filter(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
            .count() as i64
    }
    fn normalize_score(&self, _: &CycleState, _: &Snapshot, scores: &mut [NodeScore]) {
        default_normalize_score(scores, true);
    }
}

/// `spec.nodeSelector` and required node affinity filter; preferred node affinity scores.
pub struct NodeAffinity;

impl Plugin for NodeAffinity {
    fn name(&self) -> &'static str {
        "NodeAffinity"
    }
    fn pre_filter(&self, _: &mut CycleState, pod: &PodInfo, _: &Snapshot) -> Status {
        let spec = pod.pod.spec.as_ref();
        let has_selector = spec.and_then(|s| s.node_selector.as_ref()).is_some();
        let has_required = spec
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .is_some();
        if has_selector || has_required {
            Status::success()
        } else {
            Status::skip()
        }
    }
    fn filter(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo, _: &Snapshot) -> Status {
        if matches_node_selector(pod, node) {
            Status::success()
        } else {
            Status::new(
                Code::UnschedulableAndUnresolvable,
                "node(s) didn't match Pod's node affinity/selector",
            )
        }
    }
    fn pre_score(&self, _: &mut CycleState, pod: &PodInfo, _: &Snapshot, _: &[usize]) -> Status {
        let preferred = pod
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            });
        if preferred.is_some_and(|p| !p.is_empty()) {
            Status::success()
        } else {
            Status::skip()
        }
    }
    fn score(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo) -> i64 {
        let preferred = pod
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            });
        preferred
            .into_iter()
            .flatten()
            .filter(|term| term.weight != 0)
            .filter(|term| node_selector_term_matches(&term.preference, &node.name, node.labels()))
            .map(|term| i64::from(term.weight))
            .sum()
    }
    fn normalize_score(&self, _: &CycleState, _: &Snapshot, scores: &mut [NodeScore]) {
        default_normalize_score(scores, false);
    }
}

/// Rejects nodes where a host port the pod wants is taken.
pub struct NodePorts;

impl Plugin for NodePorts {
    fn name(&self) -> &'static str {
        "NodePorts"
    }
    fn pre_filter(&self, _: &mut CycleState, pod: &PodInfo, _: &Snapshot) -> Status {
        if pod.host_ports.is_empty() {
            Status::skip()
        } else {
            Status::success()
        }
    }
    fn filter(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo, _: &Snapshot) -> Status {
        let conflict = pod
            .host_ports
            .iter()
            .any(|wanted| node.used_ports.iter().any(|used| used.conflicts(wanted)));
        if conflict {
            Status::new(
                Code::Unschedulable,
                "node(s) didn't have free ports for the requested pod ports",
            )
        } else {
            Status::success()
        }
    }
}

/// Rejects nodes without room for the pod's requests; scores the least allocated higher.
pub struct NodeResourcesFit;

/// Upstream's `fitsRequest`: every shortfall is its own reason.
pub fn insufficient_resources(pod: &PodInfo, node: &NodeInfo) -> Vec<String> {
    let mut reasons = Vec::new();
    if node.pods.len() as i64 + 1 > node.allocatable.pods {
        reasons.push("Too many pods".to_string());
    }
    let wanted = &pod.requests;
    if wanted.milli_cpu == 0
        && wanted.memory == 0
        && wanted.ephemeral_storage == 0
        && pod.scalar_requests.values().all(|v| *v == 0)
    {
        return reasons;
    }
    let free = &node.allocatable;
    let used = &node.requested;
    if wanted.milli_cpu > 0 && wanted.milli_cpu > free.milli_cpu - used.milli_cpu {
        reasons.push("Insufficient cpu".into());
    }
    if wanted.memory > 0 && wanted.memory > free.memory - used.memory {
        reasons.push("Insufficient memory".into());
    }
    if wanted.ephemeral_storage > 0
        && wanted.ephemeral_storage > free.ephemeral_storage - used.ephemeral_storage
    {
        reasons.push("Insufficient ephemeral-storage".into());
    }
    for (name, value) in &pod.scalar_requests {
        if *value == 0 {
            continue;
        }
        let allocatable = node.allocatable_scalar.get(name).copied().unwrap_or(0);
        let requested = node.requested_scalar.get(name).copied().unwrap_or(0);
        if *value > allocatable - requested {
            reasons.push(format!("Insufficient {name}"));
        }
    }
    reasons
}

impl Plugin for NodeResourcesFit {
    fn name(&self) -> &'static str {
        "NodeResourcesFit"
    }
    fn pre_filter(&self, _: &mut CycleState, _: &PodInfo, _: &Snapshot) -> Status {
        Status::success()
    }
    fn filter(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo, _: &Snapshot) -> Status {
        let reasons = insufficient_resources(pod, node);
        if reasons.is_empty() {
            Status::success()
        } else {
            Status {
                code: Code::Unschedulable,
                reasons: reasons.into_iter().map(Into::into).collect(),
                plugin: "",
            }
        }
    }
    fn pre_score(&self, _: &mut CycleState, _: &PodInfo, _: &Snapshot, _: &[usize]) -> Status {
        Status::success()
    }
    /// LeastAllocated over CPU and memory (weight 1 each), with non-zero requests.
    fn score(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo) -> i64 {
        let least = |requested: i64, capacity: i64| {
            if capacity == 0 || requested > capacity {
                0
            } else {
                (capacity - requested) * MAX_NODE_SCORE / capacity
            }
        };
        let mut total = 0;
        let mut weights = 0;
        for (requested, capacity) in [
            (
                node.non_zero_requested.milli_cpu + pod.non_zero_requests.milli_cpu,
                node.allocatable.milli_cpu,
            ),
            (
                node.non_zero_requested.memory + pod.non_zero_requests.memory,
                node.allocatable.memory,
            ),
        ] {
            if capacity == 0 {
                continue;
            }
            total += least(requested, capacity);
            weights += 1;
        }
        if weights == 0 { 0 } else { total / weights }
    }
}

/// Scores nodes whose CPU and memory shares would be closest after placing the pod higher.
pub struct NodeResourcesBalancedAllocation;

impl Plugin for NodeResourcesBalancedAllocation {
    fn name(&self) -> &'static str {
        "NodeResourcesBalancedAllocation"
    }
    /// Skipped for best-effort pods, as upstream since kubernetes#129138 (they would otherwise
    /// pile onto one node).
    fn pre_score(&self, _: &mut CycleState, pod: &PodInfo, _: &Snapshot, _: &[usize]) -> Status {
        if pod.requests.milli_cpu == 0 && pod.requests.memory == 0 {
            Status::skip()
        } else {
            Status::success()
        }
    }
    fn score(&self, _: &CycleState, pod: &PodInfo, node: &NodeInfo) -> i64 {
        let mut fractions = Vec::with_capacity(2);
        for (requested, capacity) in [
            (
                node.requested.milli_cpu + pod.requests.milli_cpu,
                node.allocatable.milli_cpu,
            ),
            (
                node.requested.memory + pod.requests.memory,
                node.allocatable.memory,
            ),
        ] {
            if capacity == 0 {
                continue;
            }
            fractions.push((requested as f64 / capacity as f64).min(1.0));
        }
        let deviation = if fractions.len() == 2 {
            ((fractions[0] - fractions[1]) / 2.0).abs()
        } else {
            0.0
        };
        ((1.0 - deviation) * MAX_NODE_SCORE as f64) as i64
    }
}
