//! The disruption controller (upstream `pkg/controller/disruption`): the status of every
//! PodDisruptionBudget — expected pods (the scale of the pods' controllers, or the pod count
//! for an integer minAvailable), desired and current healthy pods, disruptions allowed,
//! evictions the API server granted but that have not happened yet (`disruptedPods`), and the
//! DisruptionAllowed condition — which the eviction API reads. It also resets stale
//! DisruptionTarget conditions of pods whose deletion never came.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PostParams};
use kube::core::SelectorExt;
use serde_json::json;

use crate::informers::{Index, Informer, Informers};
use crate::workqueue::{Requeue, WorkQueue, run_workers};
use crate::{pods, selectors};

/// Upstream's DeletionTimeout: how long a granted eviction keeps its pod out of the healthy
/// count before the controller assumes it will not happen.
const DELETION_TIMEOUT: SignedDuration = SignedDuration::from_secs(2 * 60);
/// Upstream's stalePodDisruptionTimeout.
const STALE_DISRUPTION_TIMEOUT: SignedDuration = SignedDuration::from_secs(2 * 60);
const MANAGER: &str = "disruption-controller";
/// The condition type the eviction API and kubectl read.
pub const DISRUPTION_ALLOWED: &str = "DisruptionAllowed";
/// Budgets synced at once (upstream runs one worker per queue).
const CONCURRENT_SYNCS: usize = 2;
/// Runs the controller until the task is aborted: a change to a budget, or to a pod it
/// selects (before or after the change), queues the budget's key; a pod with a
/// DisruptionTarget condition queues itself on a second queue, whose worker resets the
/// condition once it is stale (upstream's handlers and queues).
pub async fn run(informers: Arc<Informers>) {
    let caches = Caches {
        budgets: informers.get::<PodDisruptionBudget>(),
        pods: informers.get::<Pod>(),
        replica_sets: informers.get::<ReplicaSet>(),
        deployments: informers.get::<Deployment>(),
        stateful_sets: informers.get::<StatefulSet>(),
    };
    let budgets_by_namespace = caches.budgets.by_namespace();
    let pods_by_namespace = caches.pods.by_namespace();
    let client = informers.client().clone();
    let queue = Arc::new(WorkQueue::new("disruption"));
    let stale_queue = Arc::new(WorkQueue::new("stale_pod_disruption"));

    let on_budget = queue.clone();
    caches.budgets.on_change(move |change| {
        for budget in change.objects() {
            on_budget.add(pods::key(&budget.metadata));
        }
    });
    let on_pod = queue.clone();
    let on_stale = stale_queue.clone();
    caches.pods.on_change(move |change| {
        let Some(pod) = change.new.or(change.old) else {
            return;
        };
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("");
        let budgets = budgets_by_namespace.get(namespace);
        for key in budgets_selecting(&budgets, change.old, change.new) {
            on_pod.add(key);
        }
        if let Some(pod) = change.new
            && disruption_target_since(pod).is_some()
        {
            on_stale.add(pods::key(&pod.metadata));
        }
    });

    // The controllers' caches are read for their scale only: a scale change shows in the
    // pods' events that follow it (upstream has no handlers on them either).
    caches.ready().await;
    let caches = &caches;
    let budget_workers = run_workers(&queue, CONCURRENT_SYNCS, |key: String| {
        sync_key(&client, caches, &pods_by_namespace, key)
    });
    let stale_workers = run_workers(&stale_queue, 1, |key: String| {
        sync_stale_pod_disruption(&client, &caches.pods, key)
    });
    futures::future::join(budget_workers, stale_workers).await;
}

/// The keys of the budgets among `budgets` (those of the pod's namespace) whose selector
/// matches the pod before or after a change (upstream's getPdbForPod, for both sides).
fn budgets_selecting(
    budgets: &[Arc<PodDisruptionBudget>],
    old: Option<&Pod>,
    new: Option<&Pod>,
) -> BTreeSet<String> {
    let no_labels = BTreeMap::new();
    budgets
        .iter()
        .filter(|budget| {
            let Some(selector) = budget_selector(budget) else {
                return false;
            };
            old.into_iter()
                .chain(new)
                .any(|pod| selector.matches(pod.metadata.labels.as_ref().unwrap_or(&no_labels)))
        })
        .map(|budget| pods::key(&budget.metadata))
        .collect()
}

/// A missing selector selects nothing; an empty one everything (upstream's
/// LabelSelectorAsSelector as the disruption controller uses it).
fn budget_selector(budget: &PodDisruptionBudget) -> Option<kube::core::Selector> {
    budget
        .spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .and_then(selectors::compile)
}

struct Caches {
    budgets: Informer<PodDisruptionBudget>,
    pods: Informer<Pod>,
    replica_sets: Informer<ReplicaSet>,
    deployments: Informer<Deployment>,
    stateful_sets: Informer<StatefulSet>,
}

impl Caches {
    /// Waits until every cache has filled: an empty one would mean "no pods", not "unknown".
    async fn ready(&self) {
        self.budgets.ready().await;
        self.pods.ready().await;
        self.replica_sets.ready().await;
        self.deployments.ready().await;
        self.stateful_sets.ready().await;
    }

    /// Upstream's finders, in their order: the Deployment above a ReplicaSet, the ReplicaSet,
    /// the StatefulSet. `None` when the reference names none of them.
    fn controller_scale(&self, owner: &OwnerReference, namespace: &str) -> Option<(String, i32)> {
        let group = owner.api_version.split_once('/').map_or("", |(g, _)| g);
        if group != "apps" {
            return None;
        }
        match owner.kind.as_str() {
            "ReplicaSet" => {
                let set = self
                    .replica_sets
                    .get(namespace, &owner.name)
                    .filter(|s| s.metadata.uid.as_deref() == Some(owner.uid.as_str()))?;
                if let Some(deployment_ref) = pods::controller_of(&set.metadata, "Deployment") {
                    let deployment = self
                        .deployments
                        .get(namespace, &deployment_ref.name)
                        .filter(|d| {
                            d.metadata.uid.as_deref() == Some(deployment_ref.uid.as_str())
                        })?;
                    let replicas = deployment.spec.as_ref().and_then(|s| s.replicas);
                    return Some((deployment_ref.uid.clone(), replicas.unwrap_or(1)));
                }
                let replicas = set.spec.as_ref().and_then(|s| s.replicas);
                Some((owner.uid.clone(), replicas.unwrap_or(1)))
            }
            "StatefulSet" => {
                let set = self
                    .stateful_sets
                    .get(namespace, &owner.name)
                    .filter(|s| s.metadata.uid.as_deref() == Some(owner.uid.as_str()))?;
                let replicas = set.spec.as_ref().and_then(|s| s.replicas);
                Some((owner.uid.clone(), replicas.unwrap_or(1)))
            }
            _ => None,
        }
    }
}

/// Upstream's GetScaledValueFromIntOrPercent with rounding up.
fn scaled_value(value: &IntOrString, total: i32) -> Result<i32, String> {
    match value {
        IntOrString::Int(n) => Ok(*n),
        IntOrString::String(text) => {
            let percent: i64 = text
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| {
                    "invalid value for IntOrString: invalid type: string is not a percentage"
                        .to_string()
                })?;
            let scaled = (percent * i64::from(total) + 99).div_euclid(100);
            Ok(i32::try_from(scaled).unwrap_or(i32::MAX))
        }
    }
}

/// Upstream's getExpectedPodCount: (expected pods, desired healthy). An integer minAvailable
/// counts the selected pods; a percentage or maxUnavailable needs the controllers' scale,
/// which `scale_of` finds (uid and replicas) for a pod's controller reference.
fn expected_and_desired(
    budget: &PodDisruptionBudget,
    selected: &[&Pod],
    scale_of: impl Fn(&OwnerReference, &str) -> Option<(String, i32)>,
) -> Result<(i32, i32), String> {
    let spec = budget.spec.as_ref();
    let expected_scale = || -> Result<i32, String> {
        let mut scales: BTreeMap<String, i32> = BTreeMap::new();
        for pod in selected {
            let Some(owner) = pod
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true))
            else {
                // Unmanaged pods do not add to the scale (upstream warns and goes on).
                continue;
            };
            let namespace = pod.metadata.namespace.as_deref().unwrap_or("");
            match scale_of(owner, namespace) {
                Some((uid, replicas)) => {
                    scales.insert(uid, replicas);
                }
                None => {
                    return Err(format!(
                        "found no controllers for pod {:?}",
                        pod.metadata.name.as_deref().unwrap_or("")
                    ));
                }
            }
        }
        Ok(scales.values().sum())
    };
    if let Some(max_unavailable) = spec.and_then(|s| s.max_unavailable.as_ref()) {
        let expected = expected_scale()?;
        let unavailable = scaled_value(max_unavailable, expected)?;
        return Ok((expected, (expected - unavailable).max(0)));
    }
    match spec.and_then(|s| s.min_available.as_ref()) {
        Some(IntOrString::Int(min)) => Ok((selected.len() as i32, *min)),
        Some(percent @ IntOrString::String(_)) => {
            let expected = expected_scale()?;
            Ok((expected, scaled_value(percent, expected)?))
        }
        None => Ok((0, 0)),
    }
}

/// Upstream's buildDisruptedPodMap: granted evictions still awaited (their pod exists, is
/// not deleting yet, and the grant is younger than the deletion timeout).
fn awaited_disruptions(
    selected: &[&Pod],
    granted: Option<&BTreeMap<String, Time>>,
    now: Timestamp,
) -> BTreeMap<String, Time> {
    let Some(granted) = granted else {
        return BTreeMap::new();
    };
    selected
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let name = p.metadata.name.as_ref()?;
            let at = granted.get(name)?;
            let expires = at.0.checked_add(DELETION_TIMEOUT).ok()?;
            (expires >= now).then(|| (name.clone(), at.clone()))
        })
        .collect()
}

/// Upstream's countHealthyPods: ready, not deleting, not about to be evicted.
fn count_healthy(selected: &[&Pod], awaited: &BTreeMap<String, Time>) -> i32 {
    selected
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.metadata
                .name
                .as_ref()
                .is_none_or(|n| !awaited.contains_key(n))
        })
        .filter(|p| pods::is_ready(p))
        .count() as i32
}

/// Upstream's UpdateDisruptionAllowedCondition (meta `SetStatusCondition` semantics: the
/// transition time moves only when the status does).
fn set_disruption_allowed(
    status: &mut PodDisruptionBudgetStatus,
    failure: Option<&str>,
    now: Timestamp,
) {
    let (value, reason, message) = match failure {
        Some(message) => ("False", "SyncFailed", message.to_string()),
        None if status.disruptions_allowed > 0 => ("True", "SufficientPods", String::new()),
        None => ("False", "InsufficientPods", String::new()),
    };
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let observed_generation = status.observed_generation;
    match conditions
        .iter_mut()
        .find(|c| c.type_ == DISRUPTION_ALLOWED)
    {
        Some(existing) => {
            if existing.status != value {
                existing.status = value.into();
                existing.last_transition_time = Time(now);
            }
            existing.reason = reason.into();
            existing.message = message;
            existing.observed_generation = observed_generation;
        }
        None => conditions.push(Condition {
            type_: DISRUPTION_ALLOWED.into(),
            status: value.into(),
            reason: reason.into(),
            message,
            observed_generation,
            last_transition_time: Time(now),
        }),
    }
}

/// The status `budget` should have, from the selected pods and the controllers' scale.
fn compute_status(
    budget: &PodDisruptionBudget,
    selected: &[&Pod],
    scale_of: impl Fn(&OwnerReference, &str) -> Option<(String, i32)>,
    now: Timestamp,
) -> PodDisruptionBudgetStatus {
    let current = budget.status.clone().unwrap_or_default();
    match expected_and_desired(budget, selected, scale_of) {
        Ok((expected, desired_healthy)) => {
            let awaited = awaited_disruptions(selected, current.disrupted_pods.as_ref(), now);
            let current_healthy = count_healthy(selected, &awaited);
            // A budget whose pods are not known yet allows nothing (expected 0).
            let disruptions_allowed = if expected <= 0 {
                0
            } else {
                (current_healthy - desired_healthy).max(0)
            };
            let mut status = PodDisruptionBudgetStatus {
                current_healthy,
                desired_healthy,
                expected_pods: expected,
                disruptions_allowed,
                disrupted_pods: (!awaited.is_empty()).then_some(awaited),
                observed_generation: budget.metadata.generation,
                conditions: current.conditions.clone(),
            };
            set_disruption_allowed(&mut status, None, now);
            status
        }
        // Upstream's failSafe: when the budget cannot be computed, allow nothing.
        Err(message) => {
            let mut status = PodDisruptionBudgetStatus {
                disruptions_allowed: 0,
                ..current
            };
            set_disruption_allowed(&mut status, Some(&message), now);
            status
        }
    }
}

/// Statuses equal up to `disruptedPods` being absent or empty.
fn same_status(a: &PodDisruptionBudgetStatus, b: &PodDisruptionBudgetStatus) -> bool {
    let pods = |s: &PodDisruptionBudgetStatus| s.disrupted_pods.clone().unwrap_or_default();
    a.current_healthy == b.current_healthy
        && a.desired_healthy == b.desired_healthy
        && a.expected_pods == b.expected_pods
        && a.disruptions_allowed == b.disruptions_allowed
        && a.observed_generation == b.observed_generation
        && pods(a) == pods(b)
        && a.conditions == b.conditions
}

/// Syncs the budget `key`: its status from the pods it selects. A granted eviction that has
/// not happened brings the key back when its deletion timeout passes (upstream's recheck
/// queue): no event announces that.
async fn sync_key(
    client: &kube::Client,
    caches: &Caches,
    pods_by_namespace: &Index<Pod>,
    key: String,
) -> Result<Requeue, kube::Error> {
    let (namespace, name) = pods::split_key(&key);
    let Some(budget) = caches.budgets.get(namespace, name) else {
        return Ok(Requeue::No);
    };
    let now = Timestamp::now();
    let selector = budget_selector(&budget);
    let no_labels = BTreeMap::new();
    let namespace_pods = pods_by_namespace.get(namespace);
    let selected: Vec<&Pod> = namespace_pods
        .iter()
        .map(|p| &**p)
        .filter(|p| {
            let labels = p.metadata.labels.as_ref().unwrap_or(&no_labels);
            selector.as_ref().is_some_and(|s| s.matches(labels))
        })
        .collect();
    let status = compute_status(
        &budget,
        &selected,
        |o, ns| caches.controller_scale(o, ns),
        now,
    );
    let recheck = recheck_after(&status, now);
    if budget
        .status
        .as_ref()
        .is_some_and(|current| same_status(current, &status))
    {
        return Ok(recheck);
    }
    let mut next = PodDisruptionBudget::clone(&budget);
    next.status = Some(status);
    let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), namespace);
    let params = PostParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    api.replace_status(name, &params, &next).await?;
    Ok(recheck)
}

/// When the earliest awaited eviction in `status` passes its deletion timeout (just after,
/// so the next sync finds it expired).
fn recheck_after(status: &PodDisruptionBudgetStatus, now: Timestamp) -> Requeue {
    status
        .disrupted_pods
        .iter()
        .flat_map(|pods| pods.values())
        .filter_map(|at| at.0.checked_add(DELETION_TIMEOUT).ok())
        .min()
        .map_or(Requeue::No, |expires| {
            let left = Duration::try_from(now.duration_until(expires)).unwrap_or_default();
            Requeue::After(left + Duration::from_secs(1))
        })
}

/// When the pod's DisruptionTarget condition (other than the kubelet's) became True, if it
/// is True and the pod is neither deleting nor finished.
fn disruption_target_since(pod: &Pod) -> Option<Timestamp> {
    if pod.metadata.deletion_timestamp.is_some() || pods::is_finished(pod) {
        return None;
    }
    let condition = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "DisruptionTarget"))?;
    if condition.status != "True" || condition.reason.as_deref() == Some("TerminationByKubelet") {
        return None;
    }
    Some(
        condition
            .last_transition_time
            .as_ref()
            .map_or(Timestamp::UNIX_EPOCH, |t| t.0),
    )
}

/// Upstream's syncStalePodDisruption: a DisruptionTarget condition (other than the kubelet's)
/// on a pod that is still not deleting two minutes later is set back to False; a younger
/// one brings the pod's key back when it will be stale.
async fn sync_stale_pod_disruption(
    client: &kube::Client,
    pods: &Informer<Pod>,
    key: String,
) -> Result<Requeue, kube::Error> {
    let (namespace, name) = pods::split_key(&key);
    let Some(since) = pods
        .get(namespace, name)
        .and_then(|pod| disruption_target_since(&pod))
    else {
        return Ok(Requeue::No);
    };
    let now = Timestamp::now();
    let stale_at = since
        .checked_add(STALE_DISRUPTION_TIMEOUT)
        .unwrap_or(Timestamp::MAX);
    if stale_at >= now {
        let left = Duration::try_from(now.duration_until(stale_at)).unwrap_or_default();
        return Ok(Requeue::After(left + Duration::from_secs(1)));
    }
    let patch = json!({"status": {"conditions": [{
        "type": "DisruptionTarget", "status": "False", "lastTransitionTime": now.to_string(),
    }]}});
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    api.patch_status(name, &pods::manager(MANAGER), &Patch::Strategic(&patch))
        .await?;
    Ok(Requeue::No)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(spec: serde_json::Value) -> PodDisruptionBudget {
        serde_json::from_value(json!({
            "metadata": {"name": "b", "namespace": "ns", "generation": 2},
            "spec": spec,
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn pod(name: &str, ready: bool, owner: Option<&str>) -> Pod {
        let owners: Vec<serde_json::Value> = owner
            .map(|uid| json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": uid, "controller": true}))
            .into_iter()
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "labels": {"app": "web"}, "ownerReferences": owners},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn scale_of_rs(replicas: i32) -> impl Fn(&OwnerReference, &str) -> Option<(String, i32)> {
        move |owner, _| (owner.uid == "rs-uid").then(|| (owner.uid.clone(), replicas))
    }

    #[test]
    fn budget_arithmetic() {
        let ready: Vec<Pod> = (0..3)
            .map(|i| pod(&format!("p{i}"), true, Some("rs-uid")))
            .collect();
        let mut four: Vec<Pod> = ready.clone();
        four.push(pod("p3", false, Some("rs-uid")));
        // (spec, pods, replicas) → (expected, desired, current, allowed)
        for (spec, pods, replicas, want) in [
            (json!({"minAvailable": 3}), &ready, 3, (3, 3, 3, 0)),
            (json!({"minAvailable": 2}), &ready, 3, (3, 2, 3, 1)),
            (json!({"minAvailable": 2}), &four, 4, (4, 2, 3, 1)),
            (json!({"minAvailable": "50%"}), &four, 4, (4, 2, 3, 1)),
            // Percentages round up.
            (json!({"minAvailable": "50%"}), &ready, 3, (3, 2, 3, 1)),
            (json!({"maxUnavailable": 1}), &four, 4, (4, 3, 3, 0)),
            (json!({"maxUnavailable": "34%"}), &ready, 3, (3, 1, 3, 2)),
            (json!({"maxUnavailable": 5}), &ready, 3, (3, 0, 3, 3)),
        ] {
            let b = budget(spec.clone());
            let selected: Vec<&Pod> = pods.iter().collect();
            let status = compute_status(&b, &selected, scale_of_rs(replicas), Timestamp::now());
            assert_eq!(
                (
                    status.expected_pods,
                    status.desired_healthy,
                    status.current_healthy,
                    status.disruptions_allowed
                ),
                want,
                "{spec}"
            );
            assert_eq!(status.observed_generation, Some(2));
            let condition = &status.conditions.as_ref().expect("conditions")[0];
            assert_eq!(condition.type_, "DisruptionAllowed");
            let (value, reason) = if want.3 > 0 {
                ("True", "SufficientPods")
            } else {
                ("False", "InsufficientPods")
            };
            assert_eq!(
                (condition.status.as_str(), condition.reason.as_str()),
                (value, reason)
            );
        }
    }

    #[test]
    fn no_pods_allow_nothing() {
        let status = compute_status(
            &budget(json!({"minAvailable": 0})),
            &[],
            scale_of_rs(0),
            Timestamp::now(),
        );
        assert_eq!(status.disruptions_allowed, 0);
    }

    #[test]
    fn a_pod_without_a_known_controller_fails_safe() {
        let mut b = budget(json!({"maxUnavailable": 1}));
        b.status = Some(PodDisruptionBudgetStatus {
            disruptions_allowed: 2,
            ..Default::default()
        });
        let stray = pod("p0", true, Some("other-uid"));
        let status = compute_status(&b, &[&stray], scale_of_rs(3), Timestamp::now());
        assert_eq!(status.disruptions_allowed, 0);
        let condition = &status.conditions.as_ref().expect("conditions")[0];
        assert_eq!(condition.reason, "SyncFailed");
        assert!(
            condition
                .message
                .contains("found no controllers for pod \"p0\"")
        );
    }

    #[test]
    fn granted_evictions_are_not_healthy_until_they_expire() {
        let now = Timestamp::now();
        let pods: Vec<Pod> = (0..3)
            .map(|i| pod(&format!("p{i}"), true, Some("rs-uid")))
            .collect();
        let mut b = budget(json!({"minAvailable": 1}));
        let recent = Time(
            now.checked_sub(SignedDuration::from_secs(10))
                .expect("time"),
        );
        let old = Time(
            now.checked_sub(SignedDuration::from_secs(300))
                .expect("time"),
        );
        b.status = Some(PodDisruptionBudgetStatus {
            disrupted_pods: Some(BTreeMap::from([
                ("p0".to_string(), recent.clone()),
                ("p1".to_string(), old),
                ("gone".to_string(), recent.clone()),
            ])),
            ..Default::default()
        });
        let selected: Vec<&Pod> = pods.iter().collect();
        let status = compute_status(&b, &selected, scale_of_rs(3), now);
        assert_eq!(status.current_healthy, 2);
        assert_eq!(status.disruptions_allowed, 1);
        assert_eq!(
            status.disrupted_pods,
            Some(BTreeMap::from([("p0".to_string(), recent)]))
        );
    }

    #[test]
    fn the_transition_time_moves_only_with_the_status() {
        let then = Timestamp::from_second(1_700_000_000).expect("time");
        let later = Timestamp::from_second(1_700_000_100).expect("time");
        let mut status = PodDisruptionBudgetStatus {
            disruptions_allowed: 1,
            ..Default::default()
        };
        set_disruption_allowed(&mut status, None, then);
        set_disruption_allowed(&mut status, None, later);
        let condition = &status.conditions.as_ref().expect("conditions")[0];
        assert_eq!(condition.last_transition_time, Time(then));
        status.disruptions_allowed = 0;
        set_disruption_allowed(&mut status, None, later);
        let condition = &status.conditions.as_ref().expect("conditions")[0];
        assert_eq!(
            (
                condition.status.as_str(),
                condition.last_transition_time.clone()
            ),
            ("False", Time(later))
        );
    }

    #[test]
    fn a_pod_change_queues_the_budgets_selecting_it_before_or_after() {
        let with_selector = |name: &str, selector: serde_json::Value| {
            let mut b = budget(json!({"minAvailable": 1, "selector": selector}));
            b.metadata.name = Some(name.into());
            Arc::new(b)
        };
        let budgets = [
            with_selector("web", json!({"matchLabels": {"app": "web"}})),
            with_selector("db", json!({"matchLabels": {"app": "db"}})),
            with_selector("everything", json!({})),
            Arc::new(budget(json!({"minAvailable": 1}))),
        ];
        let web = pod("p0", true, None);
        let mut db = web.clone();
        db.metadata.labels = Some(BTreeMap::from([("app".into(), "db".into())]));
        let keys = |old: Option<&Pod>, new: Option<&Pod>| {
            budgets_selecting(&budgets, old, new)
                .into_iter()
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(None, Some(&web)), ["ns/everything", "ns/web"]);
        assert_eq!(keys(Some(&web), None), ["ns/everything", "ns/web"]);
        assert_eq!(
            keys(Some(&web), Some(&db)),
            ["ns/db", "ns/everything", "ns/web"]
        );
    }

    #[test]
    fn an_awaited_eviction_brings_the_budget_back_when_it_expires() {
        let now = Timestamp::from_second(1_700_000_000).expect("time");
        let granted = |ago: i64| {
            Time(
                now.checked_sub(SignedDuration::from_secs(ago))
                    .expect("time"),
            )
        };
        let status = PodDisruptionBudgetStatus {
            disrupted_pods: Some(BTreeMap::from([
                ("p0".to_string(), granted(30)),
                ("p1".to_string(), granted(100)),
            ])),
            ..Default::default()
        };
        assert_eq!(
            recheck_after(&status, now),
            Requeue::After(Duration::from_secs(21))
        );
        assert_eq!(
            recheck_after(&PodDisruptionBudgetStatus::default(), now),
            Requeue::No
        );
    }
}
