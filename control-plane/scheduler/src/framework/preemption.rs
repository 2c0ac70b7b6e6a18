//! DefaultPreemption, the PostFilter (upstream's `plugins/defaultpreemption` and
//! `framework/preemption`): for a pod that fits nowhere, dry-run evicting lower-priority pods on
//! each node where that might help, keep as few victims as possible (reprieving the most
//! important first, PDB-violating ones before the others), and pick the node with the fewest PDB
//! violations, then the lowest highest victim priority, the smallest priority sum, the fewest
//! victims, the latest start of the highest-priority victims. Pure: `lib.rs` deletes the
//! victims and nominates the node.

use std::collections::HashSet;
use std::sync::Arc;

use super::selector::Selector;
use super::{Code, CycleState, Diagnosis, FitError, Framework, PodInfo, Snapshot, Status};

/// The plugin's name.
pub const NAME: &str = "DefaultPreemption";
/// Upstream's message for a node where evicting pods cannot help.
pub const NOT_HELPFUL: &str = "Preemption is not helpful for scheduling";
/// Upstream's message for a node without lower-priority pods.
pub const NO_VICTIMS: &str = "No preemption victims found for incoming pod";
/// Upstream's `MinCandidateNodesPercentage` and `MinCandidateNodesAbsolute`.
const MIN_CANDIDATE_NODES_PERCENTAGE: usize = 10;
const MIN_CANDIDATE_NODES_ABSOLUTE: usize = 100;

/// A node where preemption makes the pod fit, and the pods to evict there.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The node's index in the snapshot.
    pub node: usize,
    /// Pods to evict, most important first.
    pub victims: Vec<Arc<PodInfo>>,
    /// How many victims a PodDisruptionBudget protects.
    pub pdb_violations: usize,
}

/// Whether the pod is being deleted by an earlier preemption (its DisruptionTarget condition).
fn terminating_by_preemption(pod: &PodInfo) -> bool {
    pod.terminating
        && pod
            .pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|conditions| {
                conditions.iter().any(|c| {
                    c.type_ == "DisruptionTarget"
                        && c.reason.as_deref() == Some("PreemptionByScheduler")
                })
            })
}

/// Upstream's `PodEligibleToPreemptOthers`.
fn eligible(pod: &PodInfo, snapshot: &Snapshot, diagnosis: &Diagnosis) -> Result<(), String> {
    if !pod.may_preempt {
        return Err("not eligible due to preemptionPolicy=Never.".into());
    }
    if let Some(nominated) = pod.nominated_node_name()
        && let Some(index) = snapshot.nodes.iter().position(|n| n.name == nominated)
    {
        let unresolvable = diagnosis
            .node_statuses
            .iter()
            .find(|(i, _)| *i == index)
            .is_some_and(|(_, s)| s.code == Code::UnschedulableAndUnresolvable);
        if !unresolvable
            && snapshot.nodes[index]
                .pods
                .iter()
                .any(|p| p.priority < pod.priority && terminating_by_preemption(p))
        {
            return Err("not eligible due to a terminating pod on the nominated node.".into());
        }
    }
    Ok(())
}

/// Splits `pods` into those whose eviction would violate a PodDisruptionBudget and the others
/// (upstream's `filterPodsWithPDBViolation`), keeping their order.
pub fn split_by_pdb_violation(
    pods: &[Arc<PodInfo>],
    snapshot: &Snapshot,
) -> (Vec<Arc<PodInfo>>, Vec<Arc<PodInfo>>) {
    let pdbs: Vec<_> = snapshot.pdbs.values().collect();
    let mut allowed: Vec<i32> = pdbs
        .iter()
        .map(|p| p.status.as_ref().map_or(0, |s| s.disruptions_allowed))
        .collect();
    let selectors: Vec<Selector> = pdbs
        .iter()
        .map(|p| Selector::from_label_selector(p.spec.as_ref().and_then(|s| s.selector.as_ref())))
        .collect();
    let mut violating = Vec::new();
    let mut fine = Vec::new();
    for pod in pods {
        let mut violated = false;
        if pod.labels().is_some_and(|l| !l.is_empty()) {
            for (i, pdb) in pdbs.iter().enumerate() {
                if pdb.metadata.namespace.as_deref() != Some(pod.namespace.as_str())
                    || selectors[i].is_empty()
                    || !selectors[i].matches(pod.labels())
                {
                    continue;
                }
                let disrupted = pdb
                    .status
                    .as_ref()
                    .and_then(|s| s.disrupted_pods.as_ref())
                    .is_some_and(|d| d.contains_key(&pod.name));
                if disrupted {
                    continue;
                }
                allowed[i] -= 1;
                if allowed[i] < 0 {
                    violated = true;
                }
            }
        }
        if violated {
            violating.push(pod.clone());
        } else {
            fine.push(pod.clone());
        }
    }
    (violating, fine)
}

/// Upstream's `MoreImportantPod` order: higher priority, then the earlier start.
fn importance_order(a: &Arc<PodInfo>, b: &Arc<PodInfo>) -> std::cmp::Ordering {
    b.priority
        .cmp(&a.priority)
        .then_with(|| a.start_time.cmp(&b.start_time))
}

/// Upstream's `SelectVictimsOnNode`: the fewest pods to evict on `node` so that `pod` fits.
pub fn select_victims_on_node(
    framework: &Framework,
    state: &CycleState,
    pod: &PodInfo,
    index: usize,
    snapshot: &Snapshot,
) -> Result<Candidate, Status> {
    let node = &snapshot.nodes[index];
    let mut potential: Vec<Arc<PodInfo>> = node
        .pods
        .iter()
        .filter(|p| p.priority < pod.priority)
        .cloned()
        .collect();
    if potential.is_empty() {
        return Err(Status::new(Code::UnschedulableAndUnresolvable, NO_VICTIMS));
    }
    let mut node = node.clone();
    let mut state = state.clone();
    for victim in &potential {
        node.remove_pod(&victim.key);
        framework.run_remove_pod(&mut state, pod, victim, &node, snapshot);
    }
    let status = framework.run_filter_with_nominated_pods(&state, pod, &node, snapshot);
    if !status.is_success() {
        return Err(status);
    }
    potential.sort_by(importance_order);
    let (violating, fine) = split_by_pdb_violation(&potential, snapshot);
    let mut victims = Vec::new();
    let mut pdb_violations = 0;
    for (group, violates) in [(violating, true), (fine, false)] {
        for candidate in group {
            node.add_pod(candidate.clone());
            framework.run_add_pod(&mut state, pod, &candidate, &node, snapshot);
            let fits = framework
                .run_filter_with_nominated_pods(&state, pod, &node, snapshot)
                .is_success();
            if !fits {
                node.remove_pod(&candidate.key);
                framework.run_remove_pod(&mut state, pod, &candidate, &node, snapshot);
                if violates {
                    pdb_violations += 1;
                }
                victims.push(candidate);
            }
        }
    }
    victims.sort_by(importance_order);
    Ok(Candidate {
        node: index,
        victims,
        pdb_violations,
    })
}

/// Upstream's `pickOneNodeForPreemption`.
pub fn pick_one(candidates: &[Candidate]) -> Option<&Candidate> {
    let highest = |c: &Candidate| c.victims.first().map_or(i32::MIN, |v| v.priority);
    let sum = |c: &Candidate| {
        c.victims
            .iter()
            .map(|v| i64::from(v.priority) + i64::from(i32::MAX) + 1)
            .sum::<i64>()
    };
    // The earliest start among the highest-priority victims; later is better.
    let earliest_top_start = |c: &Candidate| {
        let top = highest(c);
        c.victims
            .iter()
            .filter(|v| v.priority == top)
            .filter_map(|v| v.start_time)
            .min()
    };
    let mut remaining: Vec<&Candidate> = candidates.iter().collect();
    let mut narrow = |key: &dyn Fn(&Candidate) -> i64| {
        let best = remaining.iter().map(|c| key(c)).min();
        if let Some(best) = best {
            remaining.retain(|c| key(c) == best);
        }
    };
    narrow(&|c| c.pdb_violations as i64);
    narrow(&|c| i64::from(highest(c)));
    narrow(&sum);
    narrow(&|c| c.victims.len() as i64);
    let latest = remaining.iter().filter_map(|c| earliest_top_start(c)).max();
    if let Some(latest) = latest {
        remaining.retain(|c| earliest_top_start(c) == Some(latest));
    }
    remaining.first().copied()
}

/// Runs preemption for a pod that fits nowhere: the chosen candidate, or the PostFilter's
/// message (`preemption: …`). `offset` rotates where the dry run starts.
pub fn preempt(
    framework: &Framework,
    state: &CycleState,
    pod: &PodInfo,
    snapshot: &Snapshot,
    diagnosis: &Diagnosis,
    offset: usize,
) -> Result<Candidate, String> {
    if let Err(message) = eligible(pod, snapshot, diagnosis) {
        return Err(format!("preemption: {message}"));
    }
    let all = snapshot.nodes.len();
    // Nodes whose filter said Unschedulable (not unresolvable) might fit after evictions.
    let potential: Vec<usize> = if diagnosis.absent_status.is_some() {
        Vec::new()
    } else {
        diagnosis
            .node_statuses
            .iter()
            .filter(|(_, s)| s.code == Code::Unschedulable)
            .map(|(i, _)| *i)
            .collect()
    };
    let wanted = (all * MIN_CANDIDATE_NODES_PERCENTAGE / 100)
        .max(MIN_CANDIDATE_NODES_ABSOLUTE)
        .min(all);
    let mut statuses: Vec<(usize, Status)> = Vec::new();
    let mut candidates = Vec::new();
    let mut non_violating = 0;
    let tried: HashSet<usize> = potential.iter().copied().collect();
    for step in 0..potential.len() {
        if non_violating >= wanted {
            break;
        }
        let index = potential[(offset + step) % potential.len()];
        match select_victims_on_node(framework, state, pod, index, snapshot) {
            Ok(candidate) => {
                if candidate.pdb_violations == 0 {
                    non_violating += 1;
                }
                candidates.push(candidate);
            }
            Err(status) => statuses.push((index, status)),
        }
    }
    if let Some(best) = pick_one(&candidates) {
        return Ok(best.clone());
    }
    for index in 0..all {
        if !tried.contains(&index) {
            statuses.push((
                index,
                Status::new(Code::UnschedulableAndUnresolvable, NOT_HELPFUL),
            ));
        }
    }
    let inner = FitError {
        num_all_nodes: all,
        diagnosis: Diagnosis {
            node_statuses: statuses,
            ..Default::default()
        },
    };
    Err(format!("preemption: {}", inner.message()))
}
