//! What upstream keeps in `pkg/controller/deployment/util` and the sync helpers around it,
//! all pure functions of Deployments and ReplicaSets: strategy and surge arithmetic,
//! proportional scaling, template hashing and matching, revision and replica annotations,
//! status, progress and conditions. The controller (`deployment.rs`) reads and writes; this
//! decides.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet, ReplicaSetSpec, ReplicaSetStatus,
};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use crate::pods;

/// The label (on ReplicaSets, their selectors and templates, and pods) naming the template.
pub const DEFAULT_DEPLOYMENT_UNIQUE_LABEL_KEY: &str = "pod-template-hash";
/// The revision of a ReplicaSet, and of the Deployment (its newest ReplicaSet's).
pub const REVISION_ANNOTATION: &str = "deployment.kubernetes.io/revision";
/// Earlier revisions a ReplicaSet had before a rollback made it current again.
pub const REVISION_HISTORY_ANNOTATION: &str = "deployment.kubernetes.io/revision-history";
/// `spec.replicas` of the Deployment when the ReplicaSet was last scaled.
pub const DESIRED_REPLICAS_ANNOTATION: &str = "deployment.kubernetes.io/desired-replicas";
/// `spec.replicas + maxSurge` of the Deployment when the ReplicaSet was last scaled.
pub const MAX_REPLICAS_ANNOTATION: &str = "deployment.kubernetes.io/max-replicas";
pub(super) const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";
pub(super) const DEPRECATED_ROLLBACK_TO: &str = "deprecated.deployment.rollback.to";
/// Upstream's `--deployment-controller-max-revision-history-length` default… in characters.
pub(super) const MAX_REVISION_HISTORY_LENGTH_IN_CHARS: usize = 2000;
/// `progressDeadlineSeconds` meaning "no deadline".
pub(super) const NO_DEADLINE: i32 = i32::MAX;

pub(super) const PROGRESSING: &str = "Progressing";
pub(super) const AVAILABLE: &str = "Available";
pub(super) const REPLICA_FAILURE: &str = "ReplicaFailure";
pub(super) const FAILED_RS_CREATE_REASON: &str = "ReplicaSetCreateError";
pub(super) const NEW_RS_REASON: &str = "NewReplicaSetCreated";
pub(super) const FOUND_NEW_RS_REASON: &str = "FoundNewReplicaSet";
pub(super) const NEW_RS_AVAILABLE_REASON: &str = "NewReplicaSetAvailable";
pub(super) const RS_UPDATED_REASON: &str = "ReplicaSetUpdated";
pub(super) const TIMED_OUT_REASON: &str = "ProgressDeadlineExceeded";
pub(super) const PAUSED_DEPLOY_REASON: &str = "DeploymentPaused";
pub(super) const RESUMED_DEPLOY_REASON: &str = "DeploymentResumed";
pub(super) const MINIMUM_REPLICAS_AVAILABLE: &str = "MinimumReplicasAvailable";
pub(super) const MINIMUM_REPLICAS_UNAVAILABLE: &str = "MinimumReplicasUnavailable";

// ---------------------------------------------------------------- deployment_util.go (pure)

/// The rollout strategy with upstream's defaults filled in where the stored object lacks them
/// (upstream's API server would have stored them).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Strategy {
    Recreate,
    RollingUpdate {
        max_surge: IntOrString,
        max_unavailable: IntOrString,
    },
}

pub(super) fn strategy(d: &Deployment) -> Strategy {
    let strategy = d.spec.as_ref().and_then(|s| s.strategy.as_ref());
    if strategy.and_then(|s| s.type_.as_deref()) == Some("Recreate") {
        return Strategy::Recreate;
    }
    let rolling = strategy.and_then(|s| s.rolling_update.as_ref());
    let quarter = || IntOrString::String("25%".into());
    Strategy::RollingUpdate {
        max_surge: rolling
            .and_then(|r| r.max_surge.clone())
            .unwrap_or_else(quarter),
        max_unavailable: rolling
            .and_then(|r| r.max_unavailable.clone())
            .unwrap_or_else(quarter),
    }
}

pub(super) fn replicas(d: &Deployment) -> i32 {
    d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

pub(super) fn rs_replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

pub(super) fn rs_available(rs: &ReplicaSet) -> i32 {
    rs.status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0)
}

pub(super) fn is_paused(d: &Deployment) -> bool {
    d.spec.as_ref().and_then(|s| s.paused).unwrap_or(false)
}

pub(super) fn min_ready_seconds(d: &Deployment) -> i32 {
    d.spec
        .as_ref()
        .and_then(|s| s.min_ready_seconds)
        .unwrap_or(0)
}

pub(super) fn template(d: &Deployment) -> PodTemplateSpec {
    d.spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default()
}

pub(super) fn has_progress_deadline(d: &Deployment) -> bool {
    d.spec
        .as_ref()
        .and_then(|s| s.progress_deadline_seconds)
        .is_some_and(|s| s != NO_DEADLINE)
}

/// The owner reference marked `controller: true`, of any kind.
pub(super) fn controller_ref(metadata: &ObjectMeta) -> Option<&OwnerReference> {
    metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

/// Upstream `GetScaledValueFromIntOrPercent`: an int as is, `N%` of `total` rounded up or
/// down; `None` for anything else (validation rejects it).
pub(super) fn scaled_value(value: &IntOrString, total: i32, round_up: bool) -> Option<i32> {
    match value {
        IntOrString::Int(v) => Some(*v),
        IntOrString::String(s) => {
            let percent: i64 = s.strip_suffix('%')?.parse().ok()?;
            let exact = percent as f64 * f64::from(total) / 100.0;
            let rounded = if round_up {
                exact.ceil()
            } else {
                exact.floor()
            };
            Some(rounded as i32)
        }
    }
}

/// Upstream `ResolveFenceposts`: (maxSurge, maxUnavailable) for `desired` replicas; when both
/// resolve to zero, maxUnavailable becomes 1 so the rollout can progress.
pub(super) fn resolve_fenceposts(
    max_surge: &IntOrString,
    max_unavailable: &IntOrString,
    desired: i32,
) -> Option<(i32, i32)> {
    let surge = scaled_value(max_surge, desired, true)?;
    let mut unavailable = scaled_value(max_unavailable, desired, false)?;
    if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    Some((surge, unavailable))
}

/// Upstream `MaxSurge`.
pub(super) fn max_surge(d: &Deployment) -> i32 {
    match strategy(d) {
        Strategy::RollingUpdate {
            max_surge,
            max_unavailable,
        } => resolve_fenceposts(&max_surge, &max_unavailable, replicas(d))
            .map_or(0, |(surge, _)| surge),
        Strategy::Recreate => 0,
    }
}

/// Upstream `MaxUnavailable`: never more than `replicas`.
pub(super) fn max_unavailable(d: &Deployment) -> i32 {
    let desired = replicas(d);
    match strategy(d) {
        Strategy::RollingUpdate {
            max_surge,
            max_unavailable,
        } if desired != 0 => resolve_fenceposts(&max_surge, &max_unavailable, desired)
            .map_or(0, |(_, unavailable)| unavailable.min(desired)),
        _ => 0,
    }
}

/// Upstream `NewRSNewReplicas`: how far the new ReplicaSet may grow now.
pub(super) fn new_rs_new_replicas(d: &Deployment, all: &[ReplicaSet], new_rs: &ReplicaSet) -> i32 {
    let wanted = replicas(d);
    match strategy(d) {
        Strategy::Recreate => wanted,
        Strategy::RollingUpdate { max_surge, .. } => {
            let surge = scaled_value(&max_surge, wanted, true).unwrap_or(0);
            let current: i32 = all.iter().map(rs_replicas).sum();
            let max_total = wanted + surge;
            if current >= max_total {
                return rs_replicas(new_rs);
            }
            let scale_up = (max_total - current).min(wanted - rs_replicas(new_rs));
            rs_replicas(new_rs) + scale_up
        }
    }
}

/// Upstream `reconcileOldReplicaSets` as a plan: the sizes old ReplicaSets go to, unhealthy
/// replicas cleaned up first (`cleanupUnhealthyReplicas`), then available ones removed while
/// at least `replicas - maxUnavailable` stay available (`scaleDownOldReplicaSetsForRollingUpdate`).
pub(super) fn old_replica_sets_scale_down(
    d: &Deployment,
    all: &[ReplicaSet],
    old: &[ReplicaSet],
    new_rs: &ReplicaSet,
) -> Vec<(String, i32)> {
    let mut active: Vec<ReplicaSet> = old
        .iter()
        .filter(|rs| rs_replicas(rs) > 0)
        .cloned()
        .collect();
    let old_pods: i32 = active.iter().map(rs_replicas).sum();
    if old_pods == 0 {
        return Vec::new();
    }
    let all_pods: i32 = all.iter().map(rs_replicas).sum();
    let min_available = replicas(d) - max_unavailable(d);
    let new_unavailable = rs_replicas(new_rs) - rs_available(new_rs);
    let max_scaled_down = all_pods - min_available - new_unavailable;
    if max_scaled_down <= 0 {
        return Vec::new();
    }
    active.sort_by(by_creation);
    let mut sizes: BTreeMap<String, i32> = BTreeMap::new();
    // Unhealthy replicas first, or they would block the rollout until the deadline.
    let mut cleaned = 0;
    for rs in active.iter_mut() {
        if cleaned >= max_scaled_down {
            break;
        }
        let size = rs_replicas(rs);
        if size == 0 || size == rs_available(rs) {
            continue;
        }
        let count = (max_scaled_down - cleaned).min(size - rs_available(rs));
        set_rs_replicas(rs, size - count);
        sizes.insert(rs.metadata.name.clone().unwrap_or_default(), size - count);
        cleaned += count;
    }
    // Then available ones, down to the minimum availability.
    let available: i32 = active
        .iter()
        .map(rs_available)
        .chain(std::iter::once(rs_available(new_rs)))
        .sum();
    if available > min_available {
        let total = available - min_available;
        let mut scaled = 0;
        for rs in active.iter_mut() {
            if scaled >= total {
                break;
            }
            let size = rs_replicas(rs);
            if size == 0 {
                continue;
            }
            let count = size.min(total - scaled);
            set_rs_replicas(rs, size - count);
            sizes.insert(rs.metadata.name.clone().unwrap_or_default(), size - count);
            scaled += count;
        }
    }
    active
        .iter()
        .filter_map(|rs| {
            let name = rs.metadata.name.clone().unwrap_or_default();
            sizes.get(&name).map(|size| (name, *size))
        })
        .collect()
}

pub(super) fn set_rs_replicas(rs: &mut ReplicaSet, size: i32) {
    rs.spec.get_or_insert_with(Default::default).replicas = Some(size);
}

/// Upstream's proportional part of `scale`: spreads `replicas + maxSurge - current` over the
/// active ReplicaSets in proportion to their size, leftovers to the largest. Returns each
/// ReplicaSet's new size, in the order upstream writes them.
pub(super) fn proportional_sizes(d: &Deployment, active: &[&ReplicaSet]) -> Vec<(String, i32)> {
    let mut active: Vec<&ReplicaSet> = active.to_vec();
    let current: i32 = active.iter().map(|rs| rs_replicas(rs)).sum();
    let wanted = replicas(d);
    let allowed = if wanted > 0 { wanted + max_surge(d) } else { 0 };
    let to_add = allowed - current;
    match to_add.cmp(&0) {
        // Scaling up: the larger first, the newer among equals.
        Ordering::Greater => active.sort_by(|a, b| {
            rs_replicas(b)
                .cmp(&rs_replicas(a))
                .then_with(|| by_creation(b, a))
        }),
        // Scaling down: the larger first, the older among equals.
        Ordering::Less => active.sort_by(|a, b| {
            rs_replicas(b)
                .cmp(&rs_replicas(a))
                .then_with(|| by_creation(a, b))
        }),
        Ordering::Equal => {}
    }
    let mut added = 0;
    let mut sizes: Vec<(String, i32)> = active
        .iter()
        .map(|rs| {
            let name = rs.metadata.name.clone().unwrap_or_default();
            if to_add == 0 {
                return (name, rs_replicas(rs));
            }
            let proportion = get_proportion(rs, d, to_add, added);
            added += proportion;
            (name, rs_replicas(rs) + proportion)
        })
        .collect();
    if to_add != 0
        && let Some((_, first)) = sizes.first_mut()
    {
        *first = (*first + to_add - added).max(0);
    }
    sizes
}

/// Upstream `GetProportion`: this ReplicaSet's share of `to_add`, never beyond what is left.
pub(super) fn get_proportion(rs: &ReplicaSet, d: &Deployment, to_add: i32, added: i32) -> i32 {
    if rs_replicas(rs) == 0 || to_add == 0 || to_add == added {
        return 0;
    }
    let fraction = get_replica_set_fraction(rs, d);
    let allowed = to_add - added;
    if to_add > 0 {
        fraction.min(allowed)
    } else {
        fraction.max(allowed)
    }
}

/// Upstream `getReplicaSetFraction`: the size change that keeps this ReplicaSet's share of
/// the Deployment's maximum size (from its max-replicas annotation) after the scale.
pub(super) fn get_replica_set_fraction(rs: &ReplicaSet, d: &Deployment) -> i32 {
    if replicas(d) == 0 {
        return -rs_replicas(rs);
    }
    let max_replicas = replicas(d) + max_surge(d);
    let annotated = int_annotation(&rs.metadata, MAX_REPLICAS_ANNOTATION).unwrap_or_else(|| {
        d.status
            .as_ref()
            .and_then(|s| s.replicas)
            .unwrap_or_default()
    });
    if annotated == 0 {
        return 0;
    }
    let new_size = f64::from(rs_replicas(rs)) * f64::from(max_replicas) / f64::from(annotated);
    // Go's math.Round: half away from zero, as f64::round.
    new_size.round() as i32 - rs_replicas(rs)
}

/// Upstream `IsSaturated`: the new ReplicaSet has, wants and makes available every replica.
pub(super) fn is_saturated(d: &Deployment, rs: Option<&ReplicaSet>) -> bool {
    let Some(rs) = rs else { return false };
    let wanted = replicas(d);
    int_annotation(&rs.metadata, DESIRED_REPLICAS_ANNOTATION) == Some(wanted)
        && rs_replicas(rs) == wanted
        && rs_available(rs) == wanted
}

/// Upstream `FindActiveOrLatest`: the only active ReplicaSet, or the newest when none is.
pub(super) fn find_active_or_latest(
    new_rs: Option<&ReplicaSet>,
    old: &[ReplicaSet],
) -> Option<ReplicaSet> {
    if new_rs.is_none() && old.is_empty() {
        return None;
    }
    let mut newest_first: Vec<&ReplicaSet> = old.iter().collect();
    newest_first.sort_by(|a, b| by_creation(b, a));
    let active: Vec<&ReplicaSet> = newest_first
        .iter()
        .copied()
        .chain(new_rs)
        .filter(|rs| rs_replicas(rs) > 0)
        .collect();
    match active.as_slice() {
        [] => new_rs.or(newest_first.first().copied()).cloned(),
        [only] => Some((*only).clone()),
        _ => None,
    }
}

/// Upstream `ReplicaSetsByCreationTimestamp`: older first, then by name.
pub(super) fn by_creation(a: &ReplicaSet, b: &ReplicaSet) -> Ordering {
    let created = |rs: &ReplicaSet| rs.metadata.creation_timestamp.clone().map(|t| t.0);
    created(a)
        .cmp(&created(b))
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

/// Upstream `FindNewReplicaSet`: the oldest ReplicaSet whose template is the Deployment's.
pub(super) fn find_new_replica_set<'a>(
    d: &Deployment,
    rs_list: &'a [ReplicaSet],
) -> Option<&'a ReplicaSet> {
    let wanted = comparable_template(&template(d));
    let mut sorted: Vec<&ReplicaSet> = rs_list.iter().collect();
    sorted.sort_by(|a, b| by_creation(a, b));
    sorted.into_iter().find(|rs| {
        let theirs = rs
            .spec
            .as_ref()
            .and_then(|s| s.template.clone())
            .unwrap_or_default();
        comparable_template(&theirs) == wanted
    })
}

/// Upstream `FindOldReplicaSets`: (old ReplicaSets with replicas, all old ReplicaSets).
pub(super) fn find_old_replica_sets(
    d: &Deployment,
    rs_list: &[ReplicaSet],
) -> (Vec<ReplicaSet>, Vec<ReplicaSet>) {
    let new_uid = find_new_replica_set(d, rs_list).and_then(|rs| rs.metadata.uid.clone());
    let all_old: Vec<ReplicaSet> = rs_list
        .iter()
        .filter(|rs| new_uid.is_none() || rs.metadata.uid != new_uid)
        .cloned()
        .collect();
    let required = all_old
        .iter()
        .filter(|rs| rs_replicas(rs) != 0)
        .cloned()
        .collect();
    (required, all_old)
}

/// Upstream `EqualIgnoreHash`: equal templates apart from the pod-template-hash label.
pub(super) fn equal_ignore_hash(a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
    comparable_template(a) == comparable_template(b)
}

/// A template as JSON without the hash label and without null or empty values, so that
/// templates equal in upstream's semantic sense (nil and empty alike) compare equal.
pub(super) fn comparable_template(template: &PodTemplateSpec) -> Value {
    let mut value = serde_json::to_value(template).unwrap_or(Value::Null);
    if let Some(labels) = value
        .pointer_mut("/metadata/labels")
        .and_then(Value::as_object_mut)
    {
        labels.remove(DEFAULT_DEPLOYMENT_UNIQUE_LABEL_KEY);
    }
    prune_empty(&mut value);
    value
}

/// Removes nulls, empty objects and empty arrays from object fields; returns whether
/// `value` itself is empty.
pub(super) fn prune_empty(value: &mut Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(fields) => {
            fields.retain(|_, v| !prune_empty(v));
            fields.is_empty()
        }
        Value::Array(items) => {
            for item in items.iter_mut() {
                prune_empty(item);
            }
            items.is_empty()
        }
        _ => false,
    }
}

/// JSON with object keys sorted at every level: a stable input for the hash.
pub(super) fn canonical_json(value: &Value) -> String {
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(fields) => {
                let mut keys: Vec<&String> = fields.keys().collect();
                keys.sort();
                Value::Object(
                    keys.into_iter()
                        .map(|k| (k.clone(), sorted(&fields[k])))
                        .collect(),
                )
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(value).to_string()
}

/// Upstream `ComputeHash`: FNV-1a (32 bit) over the template, then the collision count as
/// eight little-endian bytes, printed in decimal and encoded with `rand.SafeEncodeString`'s
/// alphabet. The template is hashed as canonical JSON rather than Go's struct dump, so the
/// values differ from upstream's but are as stable.
pub fn compute_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    const OFFSET: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut hash = OFFSET;
    let mut write = |bytes: &[u8]| {
        for byte in bytes {
            hash ^= u32::from(*byte);
            hash = hash.wrapping_mul(PRIME);
        }
    };
    write(canonical_json(&comparable_template(template)).as_bytes());
    if let Some(count) = collision_count {
        let mut bytes = [0u8; 8];
        bytes[..4].copy_from_slice(&(count as u32).to_le_bytes());
        write(&bytes);
    }
    hash.to_string()
        .bytes()
        .map(|b| char::from(ALPHANUMS[usize::from(b) % ALPHANUMS.len()]))
        .collect()
}

/// The new ReplicaSet for the Deployment's template (upstream `getNewReplicaSet`'s create
/// half): named by hash, labelled and selecting by hash, sized by `NewRSNewReplicas`.
pub(super) fn new_replica_set(d: &Deployment, old: &[ReplicaSet], revision: i64) -> ReplicaSet {
    let collision_count = d.status.as_ref().and_then(|s| s.collision_count);
    let mut template = template(d);
    let hash = compute_hash(&template, collision_count);
    template
        .metadata
        .get_or_insert_with(Default::default)
        .labels
        .get_or_insert_with(Default::default)
        .insert(DEFAULT_DEPLOYMENT_UNIQUE_LABEL_KEY.into(), hash.clone());
    let mut selector = d
        .spec
        .as_ref()
        .map(|s| s.selector.clone())
        .unwrap_or_default();
    selector
        .match_labels
        .get_or_insert_with(Default::default)
        .insert(DEFAULT_DEPLOYMENT_UNIQUE_LABEL_KEY.into(), hash.clone());
    let mut rs = ReplicaSet {
        metadata: ObjectMeta {
            name: Some(format!(
                "{}-{hash}",
                d.metadata.name.as_deref().unwrap_or("")
            )),
            namespace: d.metadata.namespace.clone(),
            owner_references: Some(vec![pods::controller_reference(
                "apps/v1",
                "Deployment",
                &d.metadata,
            )]),
            labels: template.metadata.as_ref().and_then(|m| m.labels.clone()),
            ..Default::default()
        },
        spec: Some(ReplicaSetSpec {
            replicas: Some(0),
            min_ready_seconds: Some(min_ready_seconds(d)),
            selector,
            template: Some(template),
        }),
        status: None,
    };
    let all = with_new(old, Some(&rs));
    let size = new_rs_new_replicas(d, &all, &rs);
    set_rs_replicas(&mut rs, size);
    set_new_replica_set_annotations(
        d,
        &mut rs,
        revision,
        false,
        MAX_REVISION_HISTORY_LENGTH_IN_CHARS,
    );
    rs
}

/// Annotations the controller owns, never copied from the Deployment to its ReplicaSets.
pub(super) fn skip_copy_annotation(key: &str) -> bool {
    matches!(
        key,
        LAST_APPLIED_ANNOTATION
            | REVISION_ANNOTATION
            | REVISION_HISTORY_ANNOTATION
            | DESIRED_REPLICAS_ANNOTATION
            | MAX_REPLICAS_ANNOTATION
            | DEPRECATED_ROLLBACK_TO
    )
}

/// Upstream `SetNewReplicaSetAnnotations`: copies the Deployment's annotations, raises the
/// revision to `new_revision` (recording the old one in the revision history: a rollback),
/// and on create sets the replicas annotations. Returns whether anything changed.
pub(super) fn set_new_replica_set_annotations(
    d: &Deployment,
    rs: &mut ReplicaSet,
    new_revision: i64,
    exists: bool,
    history_limit_in_chars: usize,
) -> bool {
    let annotations = rs.metadata.annotations.get_or_insert_with(Default::default);
    let mut changed = false;
    for (key, value) in d.metadata.annotations.iter().flatten() {
        if skip_copy_annotation(key) || annotations.get(key) == Some(value) {
            continue;
        }
        annotations.insert(key.clone(), value.clone());
        changed = true;
    }
    let old_revision = annotations.get(REVISION_ANNOTATION).cloned();
    let old_revision_number = match old_revision.as_deref() {
        None | Some("") => 0,
        Some(text) => match text.parse::<i64>() {
            Ok(number) => number,
            Err(_) => return changed,
        },
    };
    if old_revision_number < new_revision {
        annotations.insert(REVISION_ANNOTATION.into(), new_revision.to_string());
        changed = true;
        if let Some(old_revision) = old_revision.filter(|r| !r.is_empty()) {
            let history = annotations
                .get(REVISION_HISTORY_ANNOTATION)
                .cloned()
                .unwrap_or_default();
            if history.is_empty() {
                annotations.insert(REVISION_HISTORY_ANNOTATION.into(), old_revision);
            } else {
                let mut revisions: Vec<&str> = history.split(',').collect();
                let mut total = history.len() + old_revision.len() + 1;
                let mut start = 0;
                while total > history_limit_in_chars && start < revisions.len() {
                    total -= revisions[start].len() + 1;
                    start += 1;
                }
                if total <= history_limit_in_chars {
                    revisions.drain(..start);
                    revisions.push(&old_revision);
                    let joined = revisions.join(",");
                    annotations.insert(REVISION_HISTORY_ANNOTATION.into(), joined);
                }
            }
        }
    }
    if !exists {
        let desired = replicas(d);
        changed |= set_replicas_annotations(rs, desired, desired + max_surge(d));
    }
    changed
}

/// Upstream `SetReplicasAnnotations`.
pub(super) fn set_replicas_annotations(rs: &mut ReplicaSet, desired: i32, max: i32) -> bool {
    let annotations = rs.metadata.annotations.get_or_insert_with(Default::default);
    let mut changed = false;
    for (key, value) in [
        (DESIRED_REPLICAS_ANNOTATION, desired),
        (MAX_REPLICAS_ANNOTATION, max),
    ] {
        let value = value.to_string();
        if annotations.get(key) != Some(&value) {
            annotations.insert(key.into(), value);
            changed = true;
        }
    }
    changed
}

/// Upstream `ReplicasAnnotationsNeedUpdate`.
pub(super) fn replicas_annotations_need_update(rs: &ReplicaSet, desired: i32, max: i32) -> bool {
    let annotations = rs.metadata.annotations.as_ref();
    let get = |key: &str| annotations.and_then(|a| a.get(key)).cloned();
    get(DESIRED_REPLICAS_ANNOTATION) != Some(desired.to_string())
        || get(MAX_REPLICAS_ANNOTATION) != Some(max.to_string())
}

pub(super) fn int_annotation(metadata: &ObjectMeta, key: &str) -> Option<i32> {
    metadata.annotations.as_ref()?.get(key)?.parse().ok()
}

/// Upstream `Revision`: the revision annotation, 0 when absent or unreadable.
pub(super) fn revision(rs: &ReplicaSet) -> i64 {
    rs.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REVISION_ANNOTATION))
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

/// Upstream `MaxRevision`.
pub(super) fn max_revision(rs_list: &[ReplicaSet]) -> i64 {
    rs_list.iter().map(revision).max().unwrap_or(0)
}

/// Upstream `SetDeploymentRevision`.
pub(super) fn set_deployment_revision(d: &mut Deployment, revision: &str) -> bool {
    let annotations = d.metadata.annotations.get_or_insert_with(Default::default);
    if annotations.get(REVISION_ANNOTATION).map(String::as_str) == Some(revision) {
        return false;
    }
    annotations.insert(REVISION_ANNOTATION.into(), revision.into());
    true
}

/// Upstream `cleanupDeployment`'s choice: the oldest revisions beyond the limit that are
/// scaled to zero, observed so, and not being deleted.
pub(super) fn replica_sets_to_clean_up(d: &Deployment, old: &[ReplicaSet]) -> Vec<String> {
    let Some(limit) = d
        .spec
        .as_ref()
        .and_then(|s| s.revision_history_limit)
        .filter(|l| *l != i32::MAX)
    else {
        return Vec::new();
    };
    let mut cleanable: Vec<&ReplicaSet> = old
        .iter()
        .filter(|rs| rs.metadata.deletion_timestamp.is_none())
        .collect();
    let excess = cleanable.len() as i64 - i64::from(limit);
    if excess <= 0 {
        return Vec::new();
    }
    cleanable.sort_by(|a, b| {
        revision(a)
            .cmp(&revision(b))
            .then_with(|| by_creation(a, b))
    });
    cleanable
        .into_iter()
        .take(excess as usize)
        .filter(|rs| {
            let status = rs.status.as_ref();
            status.map_or(0, |s| s.replicas) == 0
                && rs_replicas(rs) == 0
                && rs.metadata.generation.unwrap_or(0)
                    <= status.and_then(|s| s.observed_generation).unwrap_or(0)
        })
        .filter_map(|rs| rs.metadata.name.clone())
        .collect()
}

/// Upstream `oldPodsRunning`: old ReplicaSets report pods, or any pod of theirs (even one
/// terminating) has not finished.
pub(super) fn old_pods_running(
    new_rs: Option<&ReplicaSet>,
    old: &[ReplicaSet],
    pod_map: &HashMap<String, Vec<Pod>>,
) -> bool {
    let reported: i32 = old
        .iter()
        .map(|rs| rs.status.as_ref().map_or(0, |s| s.replicas))
        .sum();
    if reported > 0 {
        return true;
    }
    let new_uid = new_rs.and_then(|rs| rs.metadata.uid.as_deref());
    pod_map
        .iter()
        .filter(|(uid, _)| Some(uid.as_str()) != new_uid)
        .flat_map(|(_, pods)| pods)
        .any(|pod| !matches!(pods::phase(pod), "Failed" | "Succeeded"))
}

/// Upstream `calculateStatus`: counts summed over the ReplicaSets and the Available
/// condition; zero counts are left out as upstream's `omitempty` does.
pub(super) fn calculate_status(
    all: &[ReplicaSet],
    new_rs: Option<&ReplicaSet>,
    d: &Deployment,
) -> DeploymentStatus {
    let available = status_sum(all, |s| s.available_replicas.unwrap_or(0));
    let total: i32 = all.iter().map(rs_replicas).sum();
    let unavailable = (total - available).max(0);
    let previous = d.status.clone().unwrap_or_default();
    let mut status = DeploymentStatus {
        observed_generation: d.metadata.generation,
        replicas: nonzero(status_sum(all, |s| s.replicas)),
        updated_replicas: nonzero(status_sum(new_rs, |s| s.replicas)),
        ready_replicas: nonzero(status_sum(all, |s| s.ready_replicas.unwrap_or(0))),
        available_replicas: nonzero(available),
        unavailable_replicas: nonzero(unavailable),
        collision_count: previous.collision_count,
        conditions: previous.conditions.clone(),
        terminating_replicas: None,
    };
    let condition = if available >= replicas(d) - max_unavailable(d) {
        new_condition(
            AVAILABLE,
            "True",
            MINIMUM_REPLICAS_AVAILABLE,
            "Deployment has minimum availability.",
        )
    } else {
        new_condition(
            AVAILABLE,
            "False",
            MINIMUM_REPLICAS_UNAVAILABLE,
            "Deployment does not have minimum availability.",
        )
    };
    set_condition(&mut status, condition);
    status
}

/// A status count summed over ReplicaSets (upstream `GetActualReplicaCountForReplicaSets` and
/// its siblings).
pub(super) fn status_sum<'a>(
    sets: impl IntoIterator<Item = &'a ReplicaSet>,
    field: fn(&ReplicaSetStatus) -> i32,
) -> i32 {
    sets.into_iter()
        .filter_map(|rs| rs.status.as_ref())
        .map(field)
        .sum()
}

pub(super) fn nonzero(count: i32) -> Option<i32> {
    (count != 0).then_some(count)
}

pub(super) fn count(value: Option<i32>) -> i32 {
    value.unwrap_or(0)
}

/// The Progressing condition part of upstream `syncRolloutStatus`, at time `now`.
pub(super) fn progress(
    d: &Deployment,
    old_status: &DeploymentStatus,
    status: &mut DeploymentStatus,
    new_rs: Option<&ReplicaSet>,
    now: Timestamp,
) {
    if !has_progress_deadline(d) {
        remove_condition(status, PROGRESSING);
        return;
    }
    let current = get_condition(old_status, PROGRESSING).cloned();
    let complete_before = count(status.replicas) == count(status.updated_replicas)
        && current
            .as_ref()
            .is_some_and(|c| c.reason.as_deref() == Some(NEW_RS_AVAILABLE_REASON));
    if complete_before {
        return;
    }
    let subject = match new_rs.and_then(|rs| rs.metadata.name.as_deref()) {
        Some(name) => format!("ReplicaSet {name:?}"),
        None => format!("Deployment {:?}", d.metadata.name.as_deref().unwrap_or("")),
    };
    if deployment_complete(d, status) {
        let message = format!("{subject} has successfully progressed.");
        set_condition(
            status,
            new_condition(PROGRESSING, "True", NEW_RS_AVAILABLE_REASON, &message),
        );
    } else if deployment_progressing(old_status, status) {
        let message = format!("{subject} is progressing.");
        let mut condition = new_condition(PROGRESSING, "True", RS_UPDATED_REASON, &message);
        // Progress refreshes lastUpdateTime even with the same reason; the transition time
        // stays while the status stays True.
        if let Some(current) = &current {
            if current.status == "True" {
                condition.last_transition_time = current.last_transition_time.clone();
            }
            remove_condition(status, PROGRESSING);
        }
        set_condition(status, condition);
    } else if deployment_timed_out(d, status, now) {
        let message = format!("{subject} has timed out progressing.");
        set_condition(
            status,
            new_condition(PROGRESSING, "False", TIMED_OUT_REASON, &message),
        );
    }
}

/// Upstream `requeueStuckDeployment`: how long until a rollout still progressing would pass
/// its deadline, when nothing else happens first (no event announces a deadline).
pub(super) fn until_stuck(
    d: &Deployment,
    status: &DeploymentStatus,
    now: Timestamp,
) -> Option<Duration> {
    let condition = get_condition(status, PROGRESSING)?;
    if !has_progress_deadline(d)
        || deployment_complete(d, status)
        || matches!(
            condition.reason.as_deref(),
            Some(NEW_RS_AVAILABLE_REASON | TIMED_OUT_REASON)
        )
    {
        return None;
    }
    let deadline = d.spec.as_ref()?.progress_deadline_seconds?;
    let since = condition.last_update_time.as_ref()?.0;
    let limit = since
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(i64::from(
            deadline,
        )))
        .ok()?;
    let left = now.duration_until(limit);
    // Just after the limit, so the next sync finds it passed.
    Some(Duration::try_from(left).unwrap_or(Duration::ZERO) + Duration::from_millis(100))
}

/// Upstream `DeploymentComplete`.
pub(super) fn deployment_complete(d: &Deployment, status: &DeploymentStatus) -> bool {
    let wanted = replicas(d);
    count(status.updated_replicas) == wanted
        && count(status.replicas) == wanted
        && count(status.available_replicas) == wanted
        && status.observed_generation >= d.metadata.generation
}

/// Upstream `DeploymentProgressing`: more updated, ready or available replicas, or fewer old.
pub(super) fn deployment_progressing(old: &DeploymentStatus, new: &DeploymentStatus) -> bool {
    let old_old = count(old.replicas) - count(old.updated_replicas);
    let new_old = count(new.replicas) - count(new.updated_replicas);
    count(new.updated_replicas) > count(old.updated_replicas)
        || new_old < old_old
        || count(new.ready_replicas) > count(old.ready_replicas)
        || count(new.available_replicas) > count(old.available_replicas)
}

/// Upstream `DeploymentTimedOut`: no progress for `progressDeadlineSeconds` since the
/// Progressing condition was last updated.
pub(super) fn deployment_timed_out(
    d: &Deployment,
    status: &DeploymentStatus,
    now: Timestamp,
) -> bool {
    let Some(condition) = get_condition(status, PROGRESSING) else {
        return false;
    };
    match condition.reason.as_deref() {
        Some(NEW_RS_AVAILABLE_REASON) => return false,
        Some(TIMED_OUT_REASON) => return true,
        _ => {}
    }
    let deadline = d
        .spec
        .as_ref()
        .and_then(|s| s.progress_deadline_seconds)
        .unwrap_or(NO_DEADLINE);
    let deadline = k8s_openapi::jiff::SignedDuration::from_secs(i64::from(deadline));
    condition
        .last_update_time
        .as_ref()
        .and_then(|from| from.0.checked_add(deadline).ok())
        .is_some_and(|limit| limit < now)
}

/// Upstream `getReplicaFailures`: a ReplicaFailure condition of the new ReplicaSet, else of
/// any old one, carried over to the Deployment.
pub(super) fn replica_failure(
    all: &[ReplicaSet],
    new_rs: Option<&ReplicaSet>,
) -> Option<DeploymentCondition> {
    let failure_of = |rs: &ReplicaSet| {
        rs.status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == REPLICA_FAILURE)
            .map(|c| DeploymentCondition {
                type_: c.type_.clone(),
                status: c.status.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
                last_transition_time: c.last_transition_time.clone(),
                last_update_time: c.last_transition_time.clone(),
            })
    };
    new_rs
        .and_then(failure_of)
        .or_else(|| all.iter().find_map(failure_of))
}

/// Upstream `NewDeploymentCondition`: both times now (to the second, as stored).
pub(super) fn new_condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
) -> DeploymentCondition {
    let now = Timestamp::from_second(Timestamp::now().as_second()).unwrap_or(Timestamp::UNIX_EPOCH);
    DeploymentCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_update_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

pub(super) fn get_condition<'a>(
    status: &'a DeploymentStatus,
    type_: &str,
) -> Option<&'a DeploymentCondition> {
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_)
}

/// Upstream `SetDeploymentCondition`: no change for the same status and reason; the
/// transition time kept while the status is unchanged; the condition moves to the end.
pub(super) fn set_condition(status: &mut DeploymentStatus, mut condition: DeploymentCondition) {
    if let Some(current) = get_condition(status, &condition.type_) {
        if current.status == condition.status && current.reason == condition.reason {
            return;
        }
        if current.status == condition.status {
            condition.last_transition_time = current.last_transition_time.clone();
        }
    }
    remove_condition(status, &condition.type_);
    status
        .conditions
        .get_or_insert_with(Default::default)
        .push(condition);
}

pub(super) fn remove_condition(status: &mut DeploymentStatus, type_: &str) {
    if let Some(conditions) = &mut status.conditions {
        conditions.retain(|c| c.type_ != type_);
    }
}

/// `old` followed by `new_rs` (upstream's `append(oldRSs, newRS)`).
pub(super) fn with_new(old: &[ReplicaSet], new_rs: Option<&ReplicaSet>) -> Vec<ReplicaSet> {
    old.iter().cloned().chain(new_rs.cloned()).collect()
}

/// Puts `updated` where the ReplicaSet of the same name was.
pub(super) fn replace_in(
    new_rs: Option<ReplicaSet>,
    mut old: Vec<ReplicaSet>,
    updated: ReplicaSet,
) -> (Option<ReplicaSet>, Vec<ReplicaSet>) {
    let same = |rs: &ReplicaSet| rs.metadata.name == updated.metadata.name;
    if new_rs.as_ref().is_some_and(same) {
        return (Some(updated), old);
    }
    if let Some(slot) = old.iter_mut().find(|rs| same(rs)) {
        *slot = updated;
    }
    (new_rs, old)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};

    fn deployment(replicas: i32, surge: IntOrString, unavailable: IntOrString) -> Deployment {
        Deployment {
            metadata: ObjectMeta {
                name: Some("web".into()),
                ..Default::default()
            },
            spec: Some(DeploymentSpec {
                replicas: Some(replicas),
                strategy: Some(DeploymentStrategy {
                    type_: Some("RollingUpdate".into()),
                    rolling_update: Some(RollingUpdateDeployment {
                        max_surge: Some(surge),
                        max_unavailable: Some(unavailable),
                    }),
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn int(v: i32) -> IntOrString {
        IntOrString::Int(v)
    }

    fn pct(v: &str) -> IntOrString {
        IntOrString::String(v.into())
    }

    /// A ReplicaSet of `replicas` (that many `available`), created at second `created`, last
    /// scaled for a Deployment of at most `max` replicas.
    fn rs(name: &str, replicas: i32, available: i32, created: i64, max: Option<i32>) -> ReplicaSet {
        let mut annotations = BTreeMap::new();
        if let Some(max) = max {
            annotations.insert(MAX_REPLICAS_ANNOTATION.to_string(), max.to_string());
        }
        ReplicaSet {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                creation_timestamp: Timestamp::from_second(created).ok().map(Time),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(replicas),
                ..Default::default()
            }),
            status: Some(ReplicaSetStatus {
                replicas,
                available_replicas: Some(available),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn surge_and_unavailable_resolve_as_upstream() {
        // (maxSurge, maxUnavailable, replicas) → (surge, unavailable)
        let cases = [
            (int(1), int(0), 3, (1, 0)),
            (pct("25%"), pct("25%"), 10, (3, 2)),
            (pct("25%"), pct("25%"), 4, (1, 1)),
            (pct("25%"), pct("25%"), 1, (1, 0)),
            (pct("0%"), pct("10%"), 5, (0, 1)), // both zero → unavailable 1
            (int(0), int(0), 3, (0, 1)),
            (pct("50%"), pct("50%"), 3, (2, 1)),
            (pct("100%"), int(2), 7, (7, 2)),
        ];
        for (surge, unavailable, replicas, want) in cases {
            assert_eq!(
                resolve_fenceposts(&surge, &unavailable, replicas),
                Some(want),
                "{surge:?} {unavailable:?} of {replicas}"
            );
        }
        assert_eq!(scaled_value(&pct("abc%"), 10, true), None);
        assert_eq!(scaled_value(&pct("5"), 10, true), None);
    }

    #[test]
    fn max_unavailable_never_exceeds_replicas_and_recreate_has_none() {
        assert_eq!(max_unavailable(&deployment(2, int(1), int(5))), 2);
        assert_eq!(max_unavailable(&deployment(0, int(1), int(5))), 0);
        let mut recreate = deployment(3, int(1), int(1));
        if let Some(spec) = recreate.spec.as_mut() {
            spec.strategy = Some(DeploymentStrategy {
                type_: Some("Recreate".into()),
                rolling_update: None,
            });
        }
        assert_eq!((max_surge(&recreate), max_unavailable(&recreate)), (0, 0));
        assert_eq!(
            new_rs_new_replicas(&recreate, &[], &rs("n", 0, 0, 1, None)),
            3
        );
        // A partial rollingUpdate gets upstream's 25% defaults.
        let mut partial = deployment(8, int(1), int(0));
        if let Some(spec) = partial.spec.as_mut() {
            spec.strategy = None;
        }
        assert_eq!((max_surge(&partial), max_unavailable(&partial)), (2, 2));
    }

    #[test]
    fn new_replica_set_grows_within_surge() {
        // (replicas, maxSurge, old size, new size) → new size allowed now
        let cases = [
            (3, int(1), 3, 0, 1),
            (3, int(1), 3, 1, 1), // at replicas + surge: no growth
            (3, int(1), 2, 1, 2),
            (3, int(1), 0, 2, 3),
            (10, pct("25%"), 10, 0, 3),
            (10, pct("25%"), 5, 5, 8),
            (3, int(5), 3, 0, 3), // never beyond replicas
        ];
        for (replicas, surge, old, new, want) in cases {
            let d = deployment(replicas, surge, int(0));
            let all = [rs("old", old, old, 1, None), rs("new", new, new, 2, None)];
            assert_eq!(
                new_rs_new_replicas(&d, &all, &all[1]),
                want,
                "{replicas} {old} {new}"
            );
        }
    }

    #[test]
    fn old_replica_sets_scale_down_keeps_minimum_available() {
        struct Case {
            replicas: i32,
            max_unavailable: i32,
            old: Vec<(i32, i32)>, // (replicas, available), oldest first
            new: (i32, i32),
            want: Vec<(&'static str, i32)>,
        }
        let cases = [
            // maxUnavailable 0: the new replica is available, one old may go.
            Case {
                replicas: 3,
                max_unavailable: 0,
                old: vec![(3, 3)],
                new: (1, 1),
                want: vec![("old0", 2)],
            },
            // The new replica is not available yet: nothing may go.
            Case {
                replicas: 3,
                max_unavailable: 0,
                old: vec![(3, 3)],
                new: (1, 0),
                want: vec![],
            },
            // maxUnavailable 1 lets one go before the new one is up.
            Case {
                replicas: 3,
                max_unavailable: 1,
                old: vec![(3, 3)],
                new: (1, 0),
                want: vec![("old0", 2)],
            },
            // Unhealthy old replicas go first, then the oldest available.
            Case {
                replicas: 4,
                max_unavailable: 2,
                old: vec![(2, 2), (2, 0)],
                new: (1, 1),
                want: vec![("old0", 1), ("old1", 0)],
            },
            // Only unhealthy ones when the healthy are all needed.
            Case {
                replicas: 4,
                max_unavailable: 1,
                old: vec![(2, 2), (2, 0)],
                new: (1, 1),
                want: vec![("old1", 0)],
            },
            // Two old sets, the oldest drained first; the new set's unavailable replicas count.
            Case {
                replicas: 4,
                max_unavailable: 2,
                old: vec![(1, 1), (3, 3)],
                new: (2, 0),
                want: vec![("old0", 0), ("old1", 2)],
            },
        ];
        for (i, case) in cases.into_iter().enumerate() {
            let d = deployment(case.replicas, int(1), int(case.max_unavailable));
            let old: Vec<ReplicaSet> = case
                .old
                .iter()
                .enumerate()
                .map(|(n, (r, a))| rs(&format!("old{n}"), *r, *a, n as i64, None))
                .collect();
            let new_rs = rs("new", case.new.0, case.new.1, 100, None);
            let all = with_new(&old, Some(&new_rs));
            let plan = old_replica_sets_scale_down(&d, &all, &old, &new_rs);
            let want: Vec<(String, i32)> =
                case.want.iter().map(|(n, s)| (n.to_string(), *s)).collect();
            assert_eq!(plan, want, "case {i}");
        }
    }

    #[test]
    fn proportional_scaling_spreads_a_resize_over_active_replica_sets() {
        struct Case {
            replicas: i32,
            surge: i32,
            sets: Vec<(&'static str, i32, i64, i32)>, // name, replicas, created, max annotation
            want: Vec<(&'static str, i32)>,
        }
        let cases = [
            // A stuck rollout (3 old + 1 new of max 4) scaled to 6 (max 7): 3 more, 2 to old, 1 to new.
            Case {
                replicas: 6,
                surge: 1,
                sets: vec![("old", 3, 1, 4), ("new", 1, 2, 4)],
                want: vec![("old", 5), ("new", 2)],
            },
            // 10 → 20 with sets 5/5 of max 11 (surge 1): the newer gets the leftover of equal sizes.
            Case {
                replicas: 20,
                surge: 1,
                sets: vec![("a", 5, 1, 11), ("b", 5, 2, 11)],
                want: vec![("b", 11), ("a", 10)],
            },
            // Scale down 10 → 5 (max 11 → 6) with 8/3: the larger loses most.
            Case {
                replicas: 5,
                surge: 1,
                sets: vec![("a", 8, 1, 11), ("b", 3, 2, 11)],
                want: vec![("a", 4), ("b", 2)],
            },
            // Scale to zero: everything goes.
            Case {
                replicas: 0,
                surge: 1,
                sets: vec![("a", 3, 1, 4), ("b", 1, 2, 4)],
                want: vec![("a", 0), ("b", 0)],
            },
            // Nothing to add: sizes stay.
            Case {
                replicas: 3,
                surge: 1,
                sets: vec![("a", 3, 1, 4), ("b", 1, 2, 4)],
                want: vec![("a", 3), ("b", 1)],
            },
        ];
        for (i, case) in cases.into_iter().enumerate() {
            let d = deployment(case.replicas, int(case.surge), int(0));
            let sets: Vec<ReplicaSet> = case
                .sets
                .iter()
                .map(|(name, r, created, max)| rs(name, *r, *r, *created, Some(*max)))
                .collect();
            let refs: Vec<&ReplicaSet> = sets.iter().collect();
            let want: Vec<(String, i32)> =
                case.want.iter().map(|(n, s)| (n.to_string(), *s)).collect();
            assert_eq!(proportional_sizes(&d, &refs), want, "case {i}");
        }
    }

    #[test]
    fn hash_is_stable_ignores_its_own_label_and_changes_with_collisions() {
        let mut template: PodTemplateSpec = serde_json::from_value(json!({
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": "nginx:1.25"}]},
        }))
        .unwrap_or_default();
        let hash = compute_hash(&template, None);
        assert_eq!(hash, compute_hash(&template, None));
        assert!(
            hash.chars()
                .all(|c| "bcdfghjklmnpqrstvwxz2456789".contains(c))
        );
        assert_ne!(hash, compute_hash(&template, Some(1)));
        assert_ne!(
            compute_hash(&template, Some(1)),
            compute_hash(&template, Some(2))
        );
        let mut labelled = template.clone();
        if let Some(labels) = labelled.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
            labels.insert(DEFAULT_DEPLOYMENT_UNIQUE_LABEL_KEY.into(), hash.clone());
        }
        assert!(equal_ignore_hash(&template, &labelled));
        assert_eq!(compute_hash(&labelled, None), hash);
        if let Some(spec) = template.spec.as_mut() {
            spec.containers[0].image = Some("nginx:1.26".into());
        }
        assert!(!equal_ignore_hash(&template, &labelled));
        assert_ne!(compute_hash(&template, None), hash);
        // Empty and absent lists are the same template, as in upstream's semantic equality.
        let mut with_empty = labelled.clone();
        if let Some(spec) = with_empty.spec.as_mut() {
            spec.volumes = Some(Vec::new());
        }
        assert!(equal_ignore_hash(&with_empty, &labelled));
    }

    #[test]
    fn rollback_raises_the_revision_and_records_history() {
        let d = deployment(3, int(1), int(0));
        let mut old = rs("web-a", 0, 0, 1, None);
        old.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(REVISION_ANNOTATION.into(), "1".into());
        assert!(set_new_replica_set_annotations(&d, &mut old, 3, true, 2000));
        let annotations = old.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations.get(REVISION_ANNOTATION).map(String::as_str),
            Some("3")
        );
        assert_eq!(
            annotations
                .get(REVISION_HISTORY_ANNOTATION)
                .map(String::as_str),
            Some("1")
        );
        // Again to 5: the history grows; a lower revision changes nothing.
        assert!(set_new_replica_set_annotations(&d, &mut old, 5, true, 2000));
        assert!(!set_new_replica_set_annotations(
            &d, &mut old, 4, true, 2000
        ));
        let annotations = old.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations
                .get(REVISION_HISTORY_ANNOTATION)
                .map(String::as_str),
            Some("1,3")
        );
        // A fresh ReplicaSet gets the replicas annotations.
        let mut fresh = rs("web-b", 1, 0, 2, None);
        assert!(set_new_replica_set_annotations(
            &d, &mut fresh, 1, false, 2000
        ));
        let annotations = fresh.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations
                .get(DESIRED_REPLICAS_ANNOTATION)
                .map(String::as_str),
            Some("3")
        );
        assert_eq!(
            annotations.get(MAX_REPLICAS_ANNOTATION).map(String::as_str),
            Some("4")
        );
        assert_eq!(annotations.get(REVISION_HISTORY_ANNOTATION), None);
    }

    #[test]
    fn progress_conditions_follow_the_rollout() {
        let mut d = deployment(2, int(1), int(0));
        if let Some(spec) = d.spec.as_mut() {
            spec.progress_deadline_seconds = Some(10);
        }
        let start = Timestamp::from_second(1_000).unwrap_or(Timestamp::UNIX_EPOCH);
        let mut previous = DeploymentStatus::default();
        set_condition(
            &mut previous,
            DeploymentCondition {
                last_update_time: Some(Time(start)),
                ..new_condition(PROGRESSING, "True", NEW_RS_REASON, "Created")
            },
        );
        // No progress and the deadline passed: timed out.
        let mut stuck = previous.clone();
        let later = Timestamp::from_second(1_011).unwrap_or(Timestamp::UNIX_EPOCH);
        progress(&d, &previous, &mut stuck, None, later);
        let reason = get_condition(&stuck, PROGRESSING).and_then(|c| c.reason.clone());
        assert_eq!(reason.as_deref(), Some(TIMED_OUT_REASON));
        // Within the deadline: unchanged.
        let mut waiting = previous.clone();
        let soon = Timestamp::from_second(1_005).unwrap_or(Timestamp::UNIX_EPOCH);
        progress(&d, &previous, &mut waiting, None, soon);
        assert_eq!(waiting, previous);
        // One more updated replica: progressing.
        let mut moving = DeploymentStatus {
            updated_replicas: Some(1),
            replicas: Some(3),
            ..previous.clone()
        };
        progress(&d, &previous, &mut moving, None, later);
        let reason = get_condition(&moving, PROGRESSING).and_then(|c| c.reason.clone());
        assert_eq!(reason.as_deref(), Some(RS_UPDATED_REASON));
        // Everything updated and available: complete.
        let mut done = DeploymentStatus {
            updated_replicas: Some(2),
            replicas: Some(2),
            available_replicas: Some(2),
            ..previous.clone()
        };
        progress(&d, &previous, &mut done, None, later);
        let condition = get_condition(&done, PROGRESSING)
            .cloned()
            .unwrap_or_default();
        assert_eq!(condition.reason.as_deref(), Some(NEW_RS_AVAILABLE_REASON));
        assert_eq!(
            condition.message.as_deref(),
            Some("Deployment \"web\" has successfully progressed.")
        );
    }

    #[test]
    fn status_sums_replica_sets_and_reports_availability() {
        let d = deployment(3, int(1), int(0));
        let mut old = rs("old", 2, 2, 1, None);
        let new_rs = rs("new", 2, 1, 2, None);
        if let Some(status) = old.status.as_mut() {
            status.ready_replicas = Some(2);
        }
        let status = calculate_status(&[old, new_rs.clone()], Some(&new_rs), &d);
        assert_eq!(status.replicas, Some(4));
        assert_eq!(status.updated_replicas, Some(2));
        assert_eq!(status.available_replicas, Some(3));
        assert_eq!(status.unavailable_replicas, Some(1));
        assert_eq!(status.ready_replicas, Some(2));
        let available = get_condition(&status, AVAILABLE)
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            (available.status.as_str(), available.reason.as_deref()),
            ("True", Some(MINIMUM_REPLICAS_AVAILABLE))
        );
        let short = calculate_status(&[rs("new", 3, 1, 1, None)], None, &d);
        let available = get_condition(&short, AVAILABLE)
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            available.reason.as_deref(),
            Some(MINIMUM_REPLICAS_UNAVAILABLE)
        );
    }

    #[test]
    fn history_beyond_the_limit_is_cleaned_oldest_first() {
        let mut d = deployment(3, int(1), int(0));
        if let Some(spec) = d.spec.as_mut() {
            spec.revision_history_limit = Some(1);
        }
        let with_revision = |name: &str, replicas: i32, revision: i64| {
            let mut set = rs(name, replicas, replicas, revision, None);
            set.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(REVISION_ANNOTATION.into(), revision.to_string());
            set
        };
        let old = [
            with_revision("r3", 0, 3),
            with_revision("r1", 0, 1),
            with_revision("r2", 1, 2),
        ];
        // Two beyond the limit: r1 goes, r2 still has a replica.
        assert_eq!(replica_sets_to_clean_up(&d, &old), vec!["r1".to_string()]);
    }
}
