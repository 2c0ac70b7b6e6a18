//! InterPodAffinity (upstream's `plugins/interpodaffinity`): required pod affinity and
//! anti-affinity of the incoming pod, required anti-affinity of the pods already placed against
//! the incoming pod (Filter), and preferred terms of both sides plus existing pods' required
//! affinity at `hardPodAffinityWeight` 1 (Score), each counted per topology domain
//! (`topologyKey` = the node label's value).

use std::collections::HashMap;

use super::{
    AffinityTerm, Code, CycleState, NodeInfo, NodeScore, Plugin, PodInfo, Snapshot, Status,
    WeightedAffinityTerm,
};

/// The plugin.
pub struct InterPodAffinity;

/// Upstream's `ErrReasonAffinityRulesNotMatch`.
pub const AFFINITY_NOT_MATCH: &str = "node(s) didn't match pod affinity rules";
/// Upstream's `ErrReasonAntiAffinityRulesNotMatch`.
pub const ANTI_AFFINITY_NOT_MATCH: &str = "node(s) didn't match pod anti-affinity rules";
/// Upstream's `ErrReasonExistingAntiAffinityRulesNotMatch`.
pub const EXISTING_ANTI_AFFINITY_NOT_MATCH: &str =
    "node(s) didn't satisfy existing pods anti-affinity rules";
/// Upstream's default `hardPodAffinityWeight`.
const HARD_POD_AFFINITY_WEIGHT: i64 = 1;

/// Matching pods per (topology key, value).
pub type TopologyCounts = HashMap<(String, String), i64>;

fn update(counts: &mut TopologyCounts, node: &NodeInfo, key: &str, delta: i64) {
    let Some(value) = node.label(key) else {
        return;
    };
    let entry = counts
        .entry((key.to_string(), value.to_string()))
        .or_default();
    *entry += delta;
    if *entry == 0 {
        counts.remove(&(key.to_string(), value.to_string()));
    }
}

/// PreFilter's counts.
#[derive(Debug, Clone, Default)]
pub struct PreFilterState {
    /// Existing pods whose required anti-affinity selects the incoming pod.
    pub existing_anti_affinity: TopologyCounts,
    /// Existing pods matching all the incoming pod's required affinity terms.
    pub affinity: TopologyCounts,
    /// Existing pods matching the incoming pod's required anti-affinity terms.
    pub anti_affinity: TopologyCounts,
}

impl PreFilterState {
    fn count(
        &mut self,
        pod: &PodInfo,
        existing: &PodInfo,
        node: &NodeInfo,
        snapshot: &Snapshot,
        delta: i64,
    ) {
        let incoming_ns = snapshot.namespace_labels(&pod.namespace);
        for term in &existing.required_anti_affinity_terms {
            if term.matches(pod, incoming_ns) {
                update(
                    &mut self.existing_anti_affinity,
                    node,
                    &term.topology_key,
                    delta,
                );
            }
        }
        let existing_ns = snapshot.namespace_labels(&existing.namespace);
        if !pod.required_affinity_terms.is_empty()
            && pod
                .required_affinity_terms
                .iter()
                .all(|t| t.matches(existing, existing_ns))
        {
            for term in &pod.required_affinity_terms {
                update(&mut self.affinity, node, &term.topology_key, delta);
            }
        }
        for term in &pod.required_anti_affinity_terms {
            if term.matches(existing, existing_ns) {
                update(&mut self.anti_affinity, node, &term.topology_key, delta);
            }
        }
    }
}

/// PreScore's scores per topology key and value.
#[derive(Debug, Clone, Default)]
pub struct PreScoreState {
    /// key → value → score.
    pub topology_score: HashMap<String, HashMap<String, i64>>,
}

impl PreScoreState {
    fn process_term(
        &mut self,
        term: &AffinityTerm,
        weight: i64,
        target: &PodInfo,
        target_namespace: Option<&super::selector::Labels>,
        node: &NodeInfo,
    ) {
        if term.matches(target, target_namespace)
            && let Some(value) = node.label(&term.topology_key)
        {
            *self
                .topology_score
                .entry(term.topology_key.clone())
                .or_default()
                .entry(value.to_string())
                .or_default() += weight;
        }
    }

    fn process_terms(
        &mut self,
        terms: &[WeightedAffinityTerm],
        target: &PodInfo,
        target_namespace: Option<&super::selector::Labels>,
        node: &NodeInfo,
        multiplier: i64,
    ) {
        for weighted in terms {
            self.process_term(
                &weighted.term,
                weighted.weight * multiplier,
                target,
                target_namespace,
                node,
            );
        }
    }
}

impl Plugin for InterPodAffinity {
    fn name(&self) -> &'static str {
        "InterPodAffinity"
    }

    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo, snapshot: &Snapshot) -> Status {
        let own_terms =
            !pod.required_affinity_terms.is_empty() || !pod.required_anti_affinity_terms.is_empty();
        let mut counts = PreFilterState::default();
        for node in &snapshot.nodes {
            if !own_terms && node.pods_with_required_anti_affinity == 0 {
                continue;
            }
            for existing in &node.pods {
                if own_terms || !existing.required_anti_affinity_terms.is_empty() {
                    counts.count(pod, existing, node, snapshot, 1);
                }
            }
        }
        if !own_terms && counts.existing_anti_affinity.is_empty() {
            return Status::skip();
        }
        state.inter_pod_affinity = Some(counts);
        Status::success()
    }

    fn add_pod(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        added: &PodInfo,
        node: &NodeInfo,
        snapshot: &Snapshot,
    ) {
        if let Some(counts) = state.inter_pod_affinity.as_mut() {
            counts.count(pod, added, node, snapshot, 1);
        }
    }

    fn remove_pod(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        removed: &PodInfo,
        node: &NodeInfo,
        snapshot: &Snapshot,
    ) {
        if let Some(counts) = state.inter_pod_affinity.as_mut() {
            counts.count(pod, removed, node, snapshot, -1);
        }
    }

    fn filter(
        &self,
        state: &CycleState,
        pod: &PodInfo,
        node: &NodeInfo,
        snapshot: &Snapshot,
    ) -> Status {
        let Some(counts) = &state.inter_pod_affinity else {
            return Status::success();
        };
        if !satisfies_pod_affinity(counts, pod, node, snapshot) {
            return Status::new(Code::UnschedulableAndUnresolvable, AFFINITY_NOT_MATCH);
        }
        let anti_affinity_hit = pod.required_anti_affinity_terms.iter().any(|term| {
            node.label(&term.topology_key).is_some_and(|value| {
                counts
                    .anti_affinity
                    .get(&(term.topology_key.clone(), value.to_string()))
                    .is_some_and(|c| *c > 0)
            })
        });
        if anti_affinity_hit {
            return Status::new(Code::Unschedulable, ANTI_AFFINITY_NOT_MATCH);
        }
        if !counts.existing_anti_affinity.is_empty() {
            let hit = node.labels().into_iter().flatten().any(|(key, value)| {
                counts
                    .existing_anti_affinity
                    .get(&(key.clone(), value.clone()))
                    .is_some_and(|c| *c > 0)
            });
            if hit {
                return Status::new(Code::Unschedulable, EXISTING_ANTI_AFFINITY_NOT_MATCH);
            }
        }
        Status::success()
    }

    fn pre_score(
        &self,
        state: &mut CycleState,
        pod: &PodInfo,
        snapshot: &Snapshot,
        _: &[usize],
    ) -> Status {
        let has_constraints = !pod.preferred_affinity_terms.is_empty()
            || !pod.preferred_anti_affinity_terms.is_empty();
        let incoming_ns = snapshot.namespace_labels(&pod.namespace);
        let mut scores = PreScoreState::default();
        for node in &snapshot.nodes {
            // Without preferred terms of its own, only nodes hosting pods with affinity matter.
            if !has_constraints && node.pods_with_affinity == 0 {
                continue;
            }
            for existing in &node.pods {
                if !has_constraints && !existing.has_affinity() {
                    continue;
                }
                let existing_ns = snapshot.namespace_labels(&existing.namespace);
                scores.process_terms(
                    &pod.preferred_affinity_terms,
                    existing,
                    existing_ns,
                    node,
                    1,
                );
                scores.process_terms(
                    &pod.preferred_anti_affinity_terms,
                    existing,
                    existing_ns,
                    node,
                    -1,
                );
                for term in &existing.required_affinity_terms {
                    scores.process_term(term, HARD_POD_AFFINITY_WEIGHT, pod, incoming_ns, node);
                }
                scores.process_terms(
                    &existing.preferred_affinity_terms,
                    pod,
                    incoming_ns,
                    node,
                    1,
                );
                scores.process_terms(
                    &existing.preferred_anti_affinity_terms,
                    pod,
                    incoming_ns,
                    node,
                    -1,
                );
            }
        }
        if scores.topology_score.is_empty() {
            return Status::skip();
        }
        state.inter_pod_affinity_score = Some(scores);
        Status::success()
    }

    fn score(&self, state: &CycleState, _: &PodInfo, node: &NodeInfo) -> i64 {
        let Some(scores) = &state.inter_pod_affinity_score else {
            return 0;
        };
        scores
            .topology_score
            .iter()
            .filter_map(|(key, values)| node.label(key).and_then(|v| values.get(v)))
            .sum()
    }

    fn normalize_score(&self, _: &CycleState, _: &Snapshot, scores: &mut [NodeScore]) {
        let min = scores.iter().map(|s| s.score).min().unwrap_or(0);
        let max = scores.iter().map(|s| s.score).max().unwrap_or(0);
        let spread = max - min;
        for s in scores {
            s.score = if spread > 0 {
                (super::MAX_NODE_SCORE as f64 * ((s.score - min) as f64 / spread as f64)) as i64
            } else {
                0
            };
        }
    }
}

/// Upstream's `satisfyPodAffinity`: every term's domain on this node holds a matching pod —
/// or no pod anywhere matches and the pod matches its own terms (the first of a group).
fn satisfies_pod_affinity(
    counts: &PreFilterState,
    pod: &PodInfo,
    node: &NodeInfo,
    snapshot: &Snapshot,
) -> bool {
    let mut pods_exist = true;
    for term in &pod.required_affinity_terms {
        let Some(value) = node.label(&term.topology_key) else {
            return false;
        };
        let count = counts
            .affinity
            .get(&(term.topology_key.clone(), value.to_string()))
            .copied()
            .unwrap_or(0);
        if count <= 0 {
            pods_exist = false;
        }
    }
    if pods_exist {
        return true;
    }
    let own_ns = snapshot.namespace_labels(&pod.namespace);
    counts.affinity.is_empty()
        && pod
            .required_affinity_terms
            .iter()
            .all(|t| t.matches(pod, own_ns))
}
