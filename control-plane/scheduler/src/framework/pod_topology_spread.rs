//! PodTopologySpread (upstream's `plugins/podtopologyspread`): `DoNotSchedule` constraints
//! filter (skew = matching pods in the node's domain + the pod itself − the global minimum,
//! at most `maxSkew`; `minDomains`), `ScheduleAnyway` constraints score; a pod without
//! constraints gets upstream's system defaults (hostname maxSkew 3, zone maxSkew 5,
//! ScheduleAnyway) over the selector of its Services and controller. `nodeAffinityPolicy`
//! defaults to Honor and `nodeTaintsPolicy` to Ignore; `matchLabelKeys` merge into the selector.

use std::collections::{HashMap, HashSet};

use super::node_plugins::{matches_node_selector, untolerated_taint};
use super::selector::{Requirement, Selector};
use super::{
    Code, CycleState, MAX_NODE_SCORE, NodeInfo, NodeScore, Plugin, PodInfo, Snapshot, Status,
};

/// The plugin.
pub struct PodTopologySpread;

/// Upstream's `ErrReasonConstraintsNotMatch`.
pub const CONSTRAINTS_NOT_MATCH: &str = "node(s) didn't match pod topology spread constraints";
/// Upstream's `ErrReasonNodeLabelNotMatch`.
pub const NODE_LABEL_NOT_MATCH: &str =
    "node(s) didn't match pod topology spread constraints (missing required label)";
/// `kubernetes.io/hostname`.
pub const HOSTNAME: &str = "kubernetes.io/hostname";
/// `topology.kubernetes.io/zone`.
pub const ZONE: &str = "topology.kubernetes.io/zone";

/// One parsed constraint.
#[derive(Debug, Clone)]
pub struct Constraint {
    /// maxSkew.
    pub max_skew: i64,
    /// topologyKey.
    pub topology_key: String,
    /// labelSelector with matchLabelKeys merged.
    pub selector: Selector,
    /// minDomains (1 when unset).
    pub min_domains: i64,
    /// nodeAffinityPolicy is Honor (the default).
    pub honor_node_affinity: bool,
    /// nodeTaintsPolicy is Honor (the default is Ignore).
    pub honor_node_taints: bool,
}

impl Constraint {
    fn counts_node(&self, pod: &PodInfo, node: &NodeInfo) -> bool {
        (!self.honor_node_affinity || matches_node_selector(pod, node))
            && (!self.honor_node_taints
                || untolerated_taint(node.taints(), pod.tolerations()).is_none())
    }
}

/// The pod's constraints with `whenUnsatisfiable` = `action`.
pub fn pod_constraints(pod: &PodInfo, action: &str) -> Vec<Constraint> {
    let constraints = pod
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.topology_spread_constraints.as_deref())
        .unwrap_or(&[]);
    constraints
        .iter()
        .filter(|c| c.when_unsatisfiable == action)
        .map(|c| {
            let mut selector = Selector::from_label_selector(c.label_selector.as_ref());
            if c.label_selector.is_some() {
                for key in c.match_label_keys.iter().flatten() {
                    if let Some(value) = pod.labels().and_then(|l| l.get(key)) {
                        selector.add_requirement(Requirement::In(key.clone(), vec![value.clone()]));
                    }
                }
            }
            Constraint {
                max_skew: i64::from(c.max_skew),
                topology_key: c.topology_key.clone(),
                selector,
                min_domains: c.min_domains.map_or(1, i64::from),
                honor_node_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
                honor_node_taints: c.node_taints_policy.as_deref() == Some("Honor"),
            }
        })
        .collect()
}

/// Upstream's `DefaultSelector`: the selectors of the Services selecting the pod, and of its
/// controlling ReplicationController, ReplicaSet or StatefulSet, merged.
pub fn default_selector(pod: &PodInfo, snapshot: &Snapshot) -> Selector {
    let mut set = std::collections::BTreeMap::new();
    for service in snapshot.services.values() {
        if service.metadata.namespace.as_deref() != Some(pod.namespace.as_str()) {
            continue;
        }
        let Some(selector) = service.spec.as_ref().and_then(|s| s.selector.as_ref()) else {
            continue;
        };
        if selector.is_empty() || !Selector::from_set(selector).matches(pod.labels()) {
            continue;
        }
        set.extend(selector.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    let owner = pod
        .pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true));
    let mut selector = Selector::from_set(&set);
    if let Some(owner) = owner {
        let key = format!("{}/{}", pod.namespace, owner.name);
        match (owner.api_version.as_str(), owner.kind.as_str()) {
            ("v1", "ReplicationController") => {
                if let Some(rc_selector) = snapshot
                    .replication_controllers
                    .get(&key)
                    .and_then(|rc| rc.spec.as_ref())
                    .and_then(|s| s.selector.as_ref())
                {
                    set.extend(rc_selector.iter().map(|(k, v)| (k.clone(), v.clone())));
                    selector = Selector::from_set(&set);
                }
            }
            ("apps/v1", "ReplicaSet") => {
                if let Some(rs) = snapshot
                    .replica_sets
                    .get(&key)
                    .and_then(|rs| rs.spec.as_ref())
                {
                    selector.add(&Selector::from_label_selector(Some(&rs.selector)));
                }
            }
            ("apps/v1", "StatefulSet") => {
                if let Some(sts) = snapshot
                    .stateful_sets
                    .get(&key)
                    .and_then(|s| s.spec.as_ref())
                {
                    selector.add(&Selector::from_label_selector(Some(&sts.selector)));
                }
            }
            _ => {}
        }
    }
    selector
}

/// Upstream's system default constraints (`systemDefaultConstraints`) over `selector`.
pub fn system_default_constraints(selector: &Selector) -> Vec<Constraint> {
    [(HOSTNAME, 3), (ZONE, 5)]
        .into_iter()
        .map(|(key, max_skew)| Constraint {
            max_skew,
            topology_key: key.to_string(),
            selector: selector.clone(),
            min_domains: 1,
            honor_node_affinity: true,
            honor_node_taints: false,
        })
        .collect()
}

fn has_all_keys(node: &NodeInfo, constraints: &[Constraint]) -> bool {
    constraints
        .iter()
        .all(|c| node.label(&c.topology_key).is_some())
}

/// Pods on `node` in `namespace`, not terminating, selected by `selector`.
fn count_matching(node: &NodeInfo, selector: &Selector, namespace: &str) -> i64 {
    node.match_counts.get_or_count(namespace, selector, || {
        node.pods
            .iter()
            .filter(|p| !p.terminating && p.namespace == namespace && selector.matches(p.labels()))
            .count() as i64
    })
}

/// PreFilter's counts.
#[derive(Debug, Clone)]
pub struct PreFilterState {
    /// The `DoNotSchedule` constraints.
    pub constraints: Vec<Constraint>,
    /// Per constraint: matching pods per domain.
    pub match_num: Vec<HashMap<String, i64>>,
    /// Per constraint: the smallest count over domains.
    pub min_match: Vec<i64>,
}

impl PreFilterState {
    fn recompute_min(&mut self) {
        self.min_match = self
            .match_num
            .iter()
            .map(|m| m.values().copied().min().unwrap_or(i64::from(i32::MAX)))
            .collect();
    }

    fn min_match_num(&self, i: usize) -> i64 {
        if (self.match_num[i].len() as i64) < self.constraints[i].min_domains {
            0
        } else {
            self.min_match[i]
        }
    }

    fn update_with_pod(&mut self, pod: &PodInfo, other: &PodInfo, node: &NodeInfo, delta: i64) {
        if other.namespace != pod.namespace || !has_all_keys(node, &self.constraints) {
            return;
        }
        for (i, c) in self.constraints.iter().enumerate() {
            if !c.selector.matches(other.labels()) {
                continue;
            }
            if let Some(value) = node.label(&c.topology_key) {
                *self.match_num[i].entry(value.to_string()).or_default() += delta;
            }
        }
        self.recompute_min();
    }
}

/// PreScore's counts.
#[derive(Debug, Clone)]
pub struct PreScoreState {
    /// The `ScheduleAnyway` (or system default) constraints.
    pub constraints: Vec<Constraint>,
    /// Nodes lacking a constraint's key (scored 0).
    pub ignored: HashSet<String>,
    /// Per constraint: matching pods per domain (not for hostname, counted per node).
    pub counts: Vec<HashMap<String, i64>>,
    /// Per constraint: `ln(domains + 2)`.
    pub weights: Vec<f64>,
}

impl Plugin for PodTopologySpread {
    fn name(&self) -> &'static str {
        "PodTopologySpread"
    }

    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo, snapshot: &Snapshot) -> Status {
        let constraints = pod_constraints(pod, "DoNotSchedule");
        if constraints.is_empty() {
            return Status::skip();
        }
        let mut match_num = vec![HashMap::new(); constraints.len()];
        for node in &snapshot.nodes {
            if !has_all_keys(node, &constraints) {
                continue;
            }
            for (i, c) in constraints.iter().enumerate() {
                if !c.counts_node(pod, node) {
                    continue;
                }
                let Some(value) = node.label(&c.topology_key) else {
                    continue;
                };
                let count = count_matching(node, &c.selector, &pod.namespace);
                *match_num[i].entry(value.to_string()).or_default() += count;
            }
        }
        let mut counts = PreFilterState {
            constraints,
            match_num,
            min_match: Vec::new(),
        };
        counts.recompute_min();
        state.topology_spread = Some(counts);
        Status::success()
    }

    fn add_pod(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        added: &PodInfo,
        node: &NodeInfo,
        _: &Snapshot,
    ) {
        if let Some(counts) = state.topology_spread.as_mut() {
            counts.update_with_pod(pod, added, node, 1);
        }
    }

    fn remove_pod(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        removed: &PodInfo,
        node: &NodeInfo,
        _: &Snapshot,
    ) {
        if let Some(counts) = state.topology_spread.as_mut() {
            counts.update_with_pod(pod, removed, node, -1);
        }
    }

    fn filter(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo, _: &Snapshot) -> Status {
        let Some(counts) = &state.topology_spread else {
            return Status::success();
        };
        for (i, c) in counts.constraints.iter().enumerate() {
            let Some(value) = node.label(&c.topology_key) else {
                return Status::new(Code::UnschedulableAndUnresolvable, NODE_LABEL_NOT_MATCH);
            };
            let self_match = i64::from(c.selector.matches(pod.labels()));
            let match_num = counts.match_num[i].get(value).copied().unwrap_or(0);
            let skew = match_num + self_match - counts.min_match_num(i);
            if skew > c.max_skew {
                return Status::new(Code::Unschedulable, CONSTRAINTS_NOT_MATCH);
            }
        }
        Status::success()
    }

    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snapshot: &Snapshot,
        feasible: &[usize],
    ) -> Status {
        let has_own = pod
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.topology_spread_constraints.as_ref())
            .is_some_and(|c| !c.is_empty());
        let constraints = if has_own {
            pod_constraints(pod, "ScheduleAnyway")
        } else {
            let selector = default_selector(pod, snapshot);
            if selector.is_empty() {
                Vec::new()
            } else {
                system_default_constraints(&selector)
            }
        };
        if constraints.is_empty() || feasible.is_empty() {
            return Status::skip();
        }
        // System defaults do not require every key on a node (upstream's requireAllTopologies).
        let require_all = has_own;
        let mut ignored = HashSet::new();
        let mut counts = vec![HashMap::new(); constraints.len()];
        for &index in feasible {
            let node = &snapshot.nodes[index];
            if require_all && !has_all_keys(node, &constraints) {
                ignored.insert(node.name.clone());
                continue;
            }
            for (i, c) in constraints.iter().enumerate() {
                if c.topology_key == HOSTNAME {
                    continue;
                }
                if let Some(value) = node.label(&c.topology_key) {
                    counts[i].entry(value.to_string()).or_insert(0i64);
                }
            }
        }
        let weights = constraints
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let size = if c.topology_key == HOSTNAME {
                    feasible.len() - ignored.len()
                } else {
                    counts[i].len()
                };
                ((size + 2) as f64).ln()
            })
            .collect();
        for node in &snapshot.nodes {
            if require_all && !has_all_keys(node, &constraints) {
                continue;
            }
            for (i, c) in constraints.iter().enumerate() {
                if c.topology_key == HOSTNAME || !c.counts_node(pod, node) {
                    continue;
                }
                let Some(value) = node.label(&c.topology_key) else {
                    continue;
                };
                if let Some(count) = counts[i].get_mut(value) {
                    *count += count_matching(node, &c.selector, &pod.namespace);
                }
            }
        }
        state.topology_spread_score = Some(PreScoreState {
            constraints,
            ignored,
            counts,
            weights,
        });
        Status::success()
    }

    fn score(&self, state: &CycleState, pod: &PodInfo, node: &NodeInfo) -> i64 {
        let Some(s) = &state.topology_spread_score else {
            return 0;
        };
        if s.ignored.contains(&node.name) {
            return 0;
        }
        let mut score = 0.0;
        for (i, c) in s.constraints.iter().enumerate() {
            let Some(value) = node.label(&c.topology_key) else {
                continue;
            };
            let count = if c.topology_key == HOSTNAME {
                count_matching(node, &c.selector, &pod.namespace)
            } else {
                s.counts[i].get(value).copied().unwrap_or(0)
            };
            // Upstream's scoreForCount.
            score += count as f64 * s.weights[i] + (c.max_skew - 1) as f64;
        }
        score.round() as i64
    }

    fn normalize_score(&self, state: &CycleState, snapshot: &Snapshot, scores: &mut [NodeScore]) {
        let Some(s) = &state.topology_spread_score else {
            return;
        };
        let ignored = |score: &NodeScore| s.ignored.contains(&snapshot.nodes[score.node].name);
        let mut min = i64::MAX;
        let mut max = 0;
        for score in scores.iter().filter(|x| !ignored(x)) {
            min = min.min(score.score);
            max = max.max(score.score);
        }
        for score in scores.iter_mut() {
            score.score = if ignored(score) {
                0
            } else if max == 0 {
                MAX_NODE_SCORE
            } else {
                MAX_NODE_SCORE * (max + min - score.score) / max
            };
        }
    }
}
