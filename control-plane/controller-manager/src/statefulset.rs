//! The StatefulSet controller (upstream `pkg/controller/statefulset`, a pure API client): pods
//! with stable names `<set>-<ordinal>`, hostnames and per-ordinal PersistentVolumeClaims made
//! from `volumeClaimTemplates`; OrderedReady (one ordinal at a time, each Running and Ready
//! before the next, scale-down from the highest) or Parallel pod management; template history
//! in ControllerRevisions, RollingUpdate (highest ordinal first, down to `partition`) and
//! OnDelete updates; the claims' retention policy as owner references; status.
//!
//! A change to a StatefulSet, to a pod or ControllerRevision it controls, or the deletion of
//! a claim one of its pods waits for queues the set's key; each sync plans the set's pod
//! actions with the pure [`plan`] and then performs them. Ready pods becoming available after
//! `minReadySeconds`, which no event announces, requeue the set after that time.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet, StatefulSetStatus};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{Api, DeleteParams, Patch, PostParams};
use serde_json::{Value, json};

use crate::expectations::Expectations;
use crate::handlers;
use crate::history::{self, CONTROLLER_REVISION_HASH_LABEL, REVISION_HASH_LABEL};
use crate::informers::{Index, Informer, Informers};
use crate::pods;
use crate::replicaset::is_available;
use crate::workqueue::{Requeue, WorkQueue, run_workers};

const MANAGER: &str = "statefulset-controller";
/// The pod label with the pod's own name (`apps.StatefulSetPodNameLabel`), for per-pod Services.
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
/// The pod label with the pod's ordinal (`apps.PodIndexLabel`).
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
/// How many name collisions creating one revision tolerates before giving up for this sync.
const MAX_COLLISIONS: i32 = 16;
/// StatefulSets synced at once (upstream's `--concurrent-statefulset-syncs`).
const CONCURRENT_SYNCS: usize = 5;
/// How long after a pod's availability time its set looks again, so the sync finds it passed.
const AVAILABILITY_DELTA: Duration = Duration::from_millis(100);

/// Why a StatefulSet's sync stopped early.
#[derive(Debug)]
pub enum SyncError {
    /// An API request failed.
    Api(kube::Error),
    /// A claim the next pod needs is being deleted; the pod waits for it to go.
    ClaimTerminating {
        /// The claim's name.
        claim: String,
    },
    /// Every revision name tried was taken by other data.
    RevisionCollisions {
        /// The StatefulSet's name.
        set: String,
    },
}

impl std::fmt::Display for SyncError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SyncError::Api(err) => write!(f, "api request failed: {err}"),
            SyncError::ClaimTerminating { claim } => write!(f, "pvc {claim} is being deleted"),
            SyncError::RevisionCollisions { set } => {
                write!(f, "too many controller revision name collisions for {set}")
            }
        }
    }
}

impl std::error::Error for SyncError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SyncError::Api(err) => Some(err),
            _ => None,
        }
    }
}

impl From<kube::Error> for SyncError {
    fn from(err: kube::Error) -> Self {
        SyncError::Api(err)
    }
}

/// The caches a sync reads.
struct Caches {
    sets: Informer<StatefulSet>,
    pods: Informer<Pod>,
    claims: Informer<PersistentVolumeClaim>,
    /// Pods by their controller's uid.
    owned_pods: Index<Pod>,
    /// ControllerRevisions by their controller's uid.
    owned_revisions: Index<ControllerRevision>,
}

/// Runs the controller until the task is aborted: handlers queue StatefulSet keys, workers
/// sync one key at a time each.
pub async fn run(informers: Arc<Informers>) {
    let sets = informers.get::<StatefulSet>();
    let pods = informers.get::<Pod>();
    let claims = informers.get::<PersistentVolumeClaim>();
    let revisions = informers.get::<ControllerRevision>();
    let caches = Caches {
        owned_pods: pods.index(pods::BY_CONTROLLER_UID, pods::controller_uid::<Pod>),
        owned_revisions: revisions.index(
            pods::BY_CONTROLLER_UID,
            pods::controller_uid::<ControllerRevision>,
        ),
        sets: sets.clone(),
        pods: pods.clone(),
        claims: claims.clone(),
    };
    let client = informers.client().clone();
    let queue = Arc::new(WorkQueue::new("statefulset"));
    let expectations = Arc::new(Expectations::default());

    handlers::queue_each(&sets, &queue);
    handlers::queue_pod_controller(&pods, &queue, "StatefulSet", &expectations);
    handlers::queue_controller(&revisions, &queue, "StatefulSet");
    // A pod whose claim is being deleted waits for it to go (upstream only retries).
    let on_claim = queue.clone();
    let claim_sets = sets.clone();
    claims.on_change(move |change| {
        if let (Some(claim), None) = (change.old, change.new) {
            for key in sets_of_deleted_claim(claim, &claim_sets.list()) {
                on_claim.add(key);
            }
        }
    });

    // Only with every cache filled: an empty pod cache would mean "create every ordinal".
    sets.ready().await;
    pods.ready().await;
    claims.ready().await;
    revisions.ready().await;
    run_workers(&queue, CONCURRENT_SYNCS, |key: String| {
        sync_key(&client, &caches, &expectations, key)
    })
    .await
}

/// The keys of the StatefulSets of `claim`'s namespace one of whose claims it is (named
/// `<template>-<set>-<ordinal>`): the sets a deleted claim may have held back.
fn sets_of_deleted_claim(claim: &PersistentVolumeClaim, sets: &[Arc<StatefulSet>]) -> Vec<String> {
    let namespace = claim.metadata.namespace.as_deref();
    let claim_name = claim.metadata.name.as_deref().unwrap_or("");
    sets.iter()
        .filter(|set| set.metadata.namespace.as_deref() == namespace)
        .filter(|set| {
            let set_name = set.metadata.name.as_deref().unwrap_or("");
            set.spec
                .iter()
                .flat_map(|s| s.volume_claim_templates.iter().flatten())
                .filter_map(|t| t.metadata.name.as_deref())
                .any(|template| {
                    claim_name
                        .strip_prefix(&format!("{template}-{set_name}-"))
                        .is_some_and(|o| !o.is_empty() && o.bytes().all(|b| b.is_ascii_digit()))
                })
        })
        .map(|set| pods::key(&set.metadata))
        .collect()
}

/// Syncs the StatefulSet `key` from the caches.
async fn sync_key(
    client: &kube::Client,
    caches: &Caches,
    expectations: &Expectations,
    key: String,
) -> Result<Requeue, SyncError> {
    let (namespace, name) = pods::split_key(&key);
    let Some(set) = caches.sets.get(namespace, name) else {
        expectations.forget(&key);
        return Ok(Requeue::No);
    };
    let caught_up = expectations.satisfied_by_pods(&key, &caches.pods, namespace);
    if !caught_up {
        // Its pods' events queue it again; the timeout is the backstop.
        return Ok(Requeue::After(expectations.remaining(&key)));
    }
    let uid = set.metadata.uid.as_deref().unwrap_or("");
    let set_name = set.metadata.name.as_deref().unwrap_or("");
    let owned = caches.owned_pods.get(uid);
    // Upstream releases pods whose names do not parse as `<set>-<ordinal>`; they are simply
    // not members here.
    let members: Vec<&Pod> = owned
        .iter()
        .map(|p| &**p)
        .filter(|p| ordinal_of(set_name, p).is_some())
        .collect();
    let revisions: Vec<ControllerRevision> = caches
        .owned_revisions
        .get(uid)
        .iter()
        .map(|r| (**r).clone())
        .collect();
    sync(client, caches, &set, &members, revisions, expectations).await
}

/// How long until the first of `pods` that is Ready but not yet available (Ready for less
/// than `min_ready_seconds`) becomes available, and a moment more: when its owner must look
/// again though no event will announce it (upstream's `enqueueAfter(minReadySeconds)`).
/// `None` when no pod is waiting for that. The DaemonSet controller shares it.
pub(crate) fn until_available(
    pods: &[&Pod],
    min_ready_seconds: i32,
    now: Timestamp,
) -> Option<Duration> {
    if min_ready_seconds <= 0 {
        return None;
    }
    pods.iter()
        .filter_map(|pod| {
            let since = pod
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .find(|c| c.type_ == "Ready" && c.status == "True")?
                .last_transition_time
                .as_ref()?
                .0;
            let available_at = since
                .checked_add(SignedDuration::from_secs(i64::from(min_ready_seconds)))
                .ok()?;
            (available_at > now).then(|| Duration::try_from(now.duration_until(available_at)))
        })
        .filter_map(Result::ok)
        .min()
        .map(|wait| wait + AVAILABILITY_DELTA)
}

/// One StatefulSet: revisions, claims' owners, pod actions, status, history.
async fn sync(
    client: &kube::Client,
    caches: &Caches,
    set: &StatefulSet,
    members: &[&Pod],
    mut revisions: Vec<ControllerRevision>,
    expectations: &Expectations,
) -> Result<Requeue, SyncError> {
    let (Some(name), Some(namespace)) = (&set.metadata.name, &set.metadata.namespace) else {
        return Ok(Requeue::No);
    };
    let Some(spec) = &set.spec else {
        return Ok(Requeue::No);
    };
    let key = pods::key(&set.metadata);
    let revision_api: Api<ControllerRevision> = Api::namespaced(client.clone(), namespace);
    history::sort_revisions(&mut revisions);
    let (current, update, collision_count) =
        current_and_update_revisions(&revision_api, set, &revisions).await?;
    let current_name = current.metadata.name.clone().unwrap_or_default();
    let update_name = update.metadata.name.clone().unwrap_or_default();
    let min_ready = spec.min_ready_seconds.unwrap_or(0);

    let mut counts = count_replicas(members, min_ready, &current_name, &update_name);
    let mut outcome = Ok(());
    if set.metadata.deletion_timestamp.is_none() {
        let claim_api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
        outcome = apply_retention_policy(&claim_api, &caches.claims, set, members).await;
        if outcome.is_ok() {
            let plan = plan(set, members, &update_name);
            if plan.deleted_for_update {
                counts.current -= 1;
            }
            let templates = Templates {
                current: history::template_of(&current).unwrap_or_else(|| spec.template.clone()),
                current_revision: &current_name,
                update: history::template_of(&update).unwrap_or_else(|| spec.template.clone()),
                update_revision: &update_name,
            };
            outcome = perform(
                client,
                caches,
                set,
                &templates,
                plan.actions,
                &key,
                expectations,
            )
            .await;
        }
    }

    let mut status = set.status.clone().unwrap_or_default();
    status.observed_generation = set.metadata.generation;
    status.current_revision = Some(current_name.clone());
    status.update_revision = Some(update_name.clone());
    status.collision_count = Some(collision_count);
    status.replicas = counts.replicas;
    status.ready_replicas = Some(counts.ready);
    status.available_replicas = Some(counts.available);
    status.current_replicas = Some(counts.current);
    status.updated_replicas = Some(counts.updated);
    complete_rolling_update(set, &mut status);
    if set.status.as_ref() != Some(&status) {
        let patch = json!({"status": {
            "observedGeneration": status.observed_generation,
            "replicas": status.replicas,
            "readyReplicas": status.ready_replicas,
            "availableReplicas": status.available_replicas,
            "currentReplicas": status.current_replicas,
            "updatedReplicas": status.updated_replicas,
            "currentRevision": status.current_revision,
            "updateRevision": status.update_revision,
            "collisionCount": status.collision_count,
        }});
        let sets: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
        sets.patch_status(name, &pods::manager(MANAGER), &Patch::Merge(&patch))
            .await?;
    }

    // Upstream truncateHistory: revisions in use by a pod or the status are live.
    let mut live: BTreeSet<String> = [current_name, update_name].into();
    live.extend(members.iter().filter_map(|p| {
        labels(&p.metadata)
            .get(CONTROLLER_REVISION_HASH_LABEL)
            .cloned()
    }));
    let limit = spec.revision_history_limit.unwrap_or(10);
    for stale in history::revisions_to_delete(&revisions, &live, limit) {
        pods::delete(&revision_api, &stale, &DeleteParams::default()).await?;
    }
    outcome?;
    Ok(until_available(members, min_ready, Timestamp::now()).map_or(Requeue::No, Requeue::After))
}

/// Upstream `getStatefulSetRevisions`: the update revision is the set's template (an equal
/// older revision is renumbered to be the newest, a new one is created); the current revision
/// is the one the status names, or the update revision when there is none yet.
async fn current_and_update_revisions(
    api: &Api<ControllerRevision>,
    set: &StatefulSet,
    sorted: &[ControllerRevision],
) -> Result<(ControllerRevision, ControllerRevision, i32), SyncError> {
    let status = set.status.clone().unwrap_or_default();
    let mut collision_count = status.collision_count.unwrap_or(0);
    let template = set
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default();
    let data = history::template_patch(&template);
    let next = history::next_revision(sorted);
    let newest_equal = sorted.iter().rev().find(|r| history::stores(r, &data));
    let update = match newest_equal {
        Some(equal) if sorted.last().map(|r| &r.metadata.name) == Some(&equal.metadata.name) => {
            equal.clone()
        }
        Some(equal) => {
            // A rollback to an older template: that revision becomes the newest again.
            let name = equal.metadata.name.as_deref().unwrap_or("");
            api.patch(
                name,
                &pods::manager(MANAGER),
                &Patch::Merge(&json!({"revision": next})),
            )
            .await?
        }
        None => {
            create_revision(
                api,
                set,
                &template.metadata.and_then(|m| m.labels).unwrap_or_default(),
                data,
                next,
                &mut collision_count,
            )
            .await?
        }
    };
    let current = status
        .current_revision
        .as_ref()
        .and_then(|wanted| {
            sorted
                .iter()
                .find(|r| r.metadata.name.as_ref() == Some(wanted))
        })
        .cloned()
        .unwrap_or_else(|| update.clone());
    Ok((current, update, collision_count))
}

/// Upstream `CreateControllerRevision`: names the revision by its hash; a name taken by other
/// data bumps the collision count and tries again, one taken by the same data is reused.
async fn create_revision(
    api: &Api<ControllerRevision>,
    set: &StatefulSet,
    template_labels: &BTreeMap<String, String>,
    data: Value,
    number: i64,
    collision_count: &mut i32,
) -> Result<ControllerRevision, SyncError> {
    let parent = set.metadata.name.clone().unwrap_or_default();
    for _ in 0..MAX_COLLISIONS {
        let hash = history::hash_revision(&data, Some(*collision_count));
        let mut labels = template_labels.clone();
        labels.insert(REVISION_HASH_LABEL.into(), hash.clone());
        let revision = ControllerRevision {
            metadata: ObjectMeta {
                name: Some(history::revision_name(&parent, &hash)),
                namespace: set.metadata.namespace.clone(),
                labels: Some(labels),
                owner_references: Some(vec![pods::controller_reference(
                    "apps/v1",
                    "StatefulSet",
                    &set.metadata,
                )]),
                ..Default::default()
            },
            data: Some(RawExtension(data.clone())),
            revision: number,
        };
        match api.create(&PostParams::default(), &revision).await {
            Ok(created) => return Ok(created),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let existing = api
                    .get(revision.metadata.name.as_deref().unwrap_or(""))
                    .await?;
                if history::stores(&existing, &data) {
                    return Ok(existing);
                }
                *collision_count += 1;
            }
            Err(err) => return Err(err.into()),
        }
    }
    Err(SyncError::RevisionCollisions { set: parent })
}

/// The templates pods are stamped from at the current and update revisions.
struct Templates<'a> {
    current: k8s_openapi::api::core::v1::PodTemplateSpec,
    current_revision: &'a str,
    update: k8s_openapi::api::core::v1::PodTemplateSpec,
    update_revision: &'a str,
}

/// Performs `actions` in order, stopping at the first failure.
async fn perform(
    client: &kube::Client,
    caches: &Caches,
    set: &StatefulSet,
    templates: &Templates<'_>,
    actions: Vec<Action>,
    key: &str,
    expectations: &Expectations,
) -> Result<(), SyncError> {
    let namespace = set.metadata.namespace.as_deref().unwrap_or("");
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let claim_api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let set_name = set.metadata.name.as_deref().unwrap_or("");
    for action in actions {
        match action {
            Action::CreatePod {
                ordinal,
                at_update_revision,
            } => {
                create_missing_claims(client, &claim_api, &caches.claims, set, ordinal).await?;
                let (template, revision) = if at_update_revision {
                    (&templates.update, templates.update_revision)
                } else {
                    (&templates.current, templates.current_revision)
                };
                let pod = new_pod(set, template, ordinal, revision);
                let pod_name = pod.metadata.name.clone().unwrap_or_default();
                match pod_api.create(&PostParams::default(), &pod).await {
                    Ok(_) => {
                        let message =
                            format!("create Pod {pod_name} in StatefulSet {set_name} successful");
                        record_event(client, set, "Normal", "SuccessfulCreate", &message).await;
                    }
                    // Made by an earlier sync the cache has not shown yet.
                    Err(kube::Error::Api(status)) if status.code == 409 => {}
                    Err(err) => {
                        let message = format!(
                            "create Pod {pod_name} in StatefulSet {set_name} failed error: {err}"
                        );
                        record_event(client, set, "Warning", "FailedCreate", &message).await;
                        return Err(err.into());
                    }
                }
                expectations.created(key, &pod_name);
            }
            Action::CreateMissingClaims { ordinal } => {
                create_missing_claims(client, &claim_api, &caches.claims, set, ordinal).await?;
            }
            Action::DeletePod { name } => {
                expectations.deleted(key, &name);
                match pods::delete(&pod_api, &name, &DeleteParams::default()).await {
                    Ok(()) => {
                        let message =
                            format!("delete Pod {name} in StatefulSet {set_name} successful");
                        record_event(client, set, "Normal", "SuccessfulDelete", &message).await;
                    }
                    Err(err) => {
                        let message = format!(
                            "delete Pod {name} in StatefulSet {set_name} failed error: {err}"
                        );
                        record_event(client, set, "Warning", "FailedDelete", &message).await;
                        return Err(err.into());
                    }
                }
            }
            Action::RestoreIdentity { name, ordinal } => {
                let patch = json!({"metadata": {"labels": {
                    POD_NAME_LABEL: name,
                    POD_INDEX_LABEL: ordinal.to_string(),
                }}});
                pod_api
                    .patch(&name, &pods::manager(MANAGER), &Patch::Merge(&patch))
                    .await?;
            }
        }
    }
    Ok(())
}

/// Upstream `createPersistentVolumeClaims`: every claim of `ordinal` the cache does not show
/// is created; one being deleted holds the pod back.
async fn create_missing_claims(
    client: &kube::Client,
    api: &Api<PersistentVolumeClaim>,
    cache: &Informer<PersistentVolumeClaim>,
    set: &StatefulSet,
    ordinal: i32,
) -> Result<(), SyncError> {
    let namespace = set.metadata.namespace.as_deref().unwrap_or("");
    for claim in claims_for(set, ordinal) {
        let claim_name = claim.metadata.name.clone().unwrap_or_default();
        match cache.get(namespace, &claim_name) {
            Some(existing) if existing.metadata.deletion_timestamp.is_some() => {
                return Err(SyncError::ClaimTerminating { claim: claim_name });
            }
            Some(_) => {}
            None => {
                let set_name = set.metadata.name.as_deref().unwrap_or("");
                let pod_name = format!("{set_name}-{ordinal}");
                match api.create(&PostParams::default(), &claim).await {
                    Ok(_) => {
                        let message = format!(
                            "create Claim {claim_name} Pod {pod_name} in StatefulSet {set_name} success"
                        );
                        record_event(client, set, "Normal", "SuccessfulCreate", &message).await;
                    }
                    Err(kube::Error::Api(status)) if status.code == 409 => {}
                    Err(err) => {
                        let message = format!(
                            "create Claim {claim_name} for Pod {pod_name} in StatefulSet {set_name} failed error: {err}"
                        );
                        record_event(client, set, "Warning", "FailedCreate", &message).await;
                        return Err(err.into());
                    }
                }
            }
        }
    }
    Ok(())
}

/// A core/v1 Event about `set` ([`crate::events::create`]).
async fn record_event(
    client: &kube::Client,
    set: &StatefulSet,
    type_: &str,
    reason: &str,
    message: &str,
) {
    let object = crate::events::EventRef {
        api_version: "apps/v1",
        kind: "StatefulSet",
        metadata: &set.metadata,
    };
    crate::events::create(client, MANAGER, object, type_, reason, message).await;
}

/// Upstream `updateClaimOwnerRefForSetAndPod` over every member's claims.
async fn apply_retention_policy(
    api: &Api<PersistentVolumeClaim>,
    cache: &Informer<PersistentVolumeClaim>,
    set: &StatefulSet,
    members: &[&Pod],
) -> Result<(), SyncError> {
    let namespace = set.metadata.namespace.as_deref().unwrap_or("");
    let set_name = set.metadata.name.as_deref().unwrap_or("");
    let policy = RetentionPolicy::of(set);
    for pod in members {
        let Some(ordinal) = ordinal_of(set_name, pod) else {
            continue;
        };
        let scaled_down = !in_ordinal_range(set, ordinal);
        for wanted in claims_for(set, ordinal) {
            let claim_name = wanted.metadata.name.unwrap_or_default();
            let Some(claim) = cache.get(namespace, &claim_name) else {
                continue;
            };
            let current = claim.metadata.owner_references.clone().unwrap_or_default();
            if let Some(owners) =
                claim_owners(policy, &current, &set.metadata, &pod.metadata, scaled_down)
            {
                let patch = json!({"metadata": {"ownerReferences": owners}});
                api.patch(&claim_name, &pods::manager(MANAGER), &Patch::Merge(&patch))
                    .await?;
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- pure logic

/// `persistentVolumeClaimRetentionPolicy`: whether claims are deleted with the set
/// (`whenDeleted`) and with a scale-down (`whenScaled`); both default to Retain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// `whenDeleted: Delete`.
    pub delete_with_set: bool,
    /// `whenScaled: Delete`.
    pub delete_when_scaled: bool,
}

impl RetentionPolicy {
    /// The policy of `set`.
    pub fn of(set: &StatefulSet) -> Self {
        let policy = set
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_claim_retention_policy.as_ref());
        RetentionPolicy {
            delete_with_set: policy.and_then(|p| p.when_deleted.as_deref()) == Some("Delete"),
            delete_when_scaled: policy.and_then(|p| p.when_scaled.as_deref()) == Some("Delete"),
        }
    }
}

fn plain_reference(api_version: &str, kind: &str, owner: &ObjectMeta) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: owner.name.clone().unwrap_or_default(),
        uid: owner.uid.clone().unwrap_or_default(),
        ..Default::default()
    }
}

/// The owner references a claim should have under `policy` (upstream
/// `updateClaimOwnerRefForSetAndPod`): the set when claims go with the set, the pod when they
/// go with a scale-down that condemned it. `None` when `current` is already right.
pub fn claim_owners(
    policy: RetentionPolicy,
    current: &[OwnerReference],
    set: &ObjectMeta,
    pod: &ObjectMeta,
    scaled_down: bool,
) -> Option<Vec<OwnerReference>> {
    let set_ref = plain_reference("apps/v1", "StatefulSet", set);
    let pod_ref = plain_reference("v1", "Pod", pod);
    let (want_set, want_pod) = match (policy.delete_when_scaled, policy.delete_with_set) {
        (false, false) => (false, false),
        (false, true) => (true, false),
        (true, false) => (false, scaled_down),
        (true, true) => (!scaled_down, scaled_down),
    };
    let mut owners: Vec<OwnerReference> = current
        .iter()
        .filter(|o| (o.uid != set_ref.uid || want_set) && (o.uid != pod_ref.uid || want_pod))
        .cloned()
        .collect();
    for (wanted, reference) in [(want_set, set_ref), (want_pod, pod_ref)] {
        if wanted && !owners.iter().any(|o| o.uid == reference.uid) {
            owners.push(reference);
        }
    }
    (owners != current).then_some(owners)
}

fn labels(metadata: &ObjectMeta) -> BTreeMap<String, String> {
    metadata.labels.clone().unwrap_or_default()
}

/// The ordinal of `pod` when its name is `<set>-<ordinal>` (upstream
/// `getParentNameAndOrdinal`), else `None`.
pub fn ordinal_of(set_name: &str, pod: &Pod) -> Option<i32> {
    let name = pod.metadata.name.as_deref()?;
    let (parent, ordinal) = name.rsplit_once('-')?;
    if parent != set_name || ordinal.is_empty() || !ordinal.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    ordinal.parse().ok()
}

/// `spec.ordinals.start` (0 unless set).
pub fn start_ordinal(set: &StatefulSet) -> i32 {
    set.spec
        .as_ref()
        .and_then(|s| s.ordinals.as_ref())
        .and_then(|o| o.start)
        .unwrap_or(0)
}

fn replicas_of(set: &StatefulSet) -> i32 {
    set.spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1)
        .max(0)
}

/// Whether `ordinal` is among the set's replicas (`podInOrdinalRange`).
pub fn in_ordinal_range(set: &StatefulSet, ordinal: i32) -> bool {
    let start = start_ordinal(set);
    ordinal >= start && ordinal < start + replicas_of(set)
}

/// The claims of `ordinal` (upstream `getPersistentVolumeClaims`): each template named
/// `<template>-<set>-<ordinal>`, labelled with the set's selector labels.
pub fn claims_for(set: &StatefulSet, ordinal: i32) -> Vec<PersistentVolumeClaim> {
    let set_name = set.metadata.name.as_deref().unwrap_or("");
    let Some(spec) = &set.spec else {
        return Vec::new();
    };
    let selector_labels = spec.selector.match_labels.clone().unwrap_or_default();
    spec.volume_claim_templates
        .iter()
        .flatten()
        .map(|template| {
            let mut claim = template.clone();
            let template_name = template.metadata.name.as_deref().unwrap_or("");
            let mut claim_labels = labels(&claim.metadata);
            claim_labels.extend(selector_labels.clone());
            claim.metadata = ObjectMeta {
                name: Some(format!("{template_name}-{set_name}-{ordinal}")),
                namespace: set.metadata.namespace.clone(),
                labels: Some(claim_labels),
                annotations: claim.metadata.annotations.clone(),
                ..Default::default()
            };
            claim.status = None;
            claim
        })
        .collect()
}

/// The pod of `ordinal` made from `template` at `revision` (upstream `newStatefulSetPod` and
/// `setPodRevision`): its stable name, hostname and subdomain, identity and revision labels,
/// and a volume per claim template bound to that ordinal's claim.
pub fn new_pod(
    set: &StatefulSet,
    template: &k8s_openapi::api::core::v1::PodTemplateSpec,
    ordinal: i32,
    revision: &str,
) -> Pod {
    let set_name = set.metadata.name.as_deref().unwrap_or("");
    let namespace = set.metadata.namespace.as_deref().unwrap_or("");
    let name = format!("{set_name}-{ordinal}");
    let owner = pods::controller_reference("apps/v1", "StatefulSet", &set.metadata);
    let mut pod = pods::from_template(
        template,
        namespace,
        Some(name.clone()),
        &format!("{set_name}-"),
        owner,
    );
    pod.metadata.generate_name = Some(format!("{set_name}-"));
    let mut pod_labels = labels(&pod.metadata);
    pod_labels.insert(POD_NAME_LABEL.into(), name.clone());
    pod_labels.insert(POD_INDEX_LABEL.into(), ordinal.to_string());
    pod_labels.insert(CONTROLLER_REVISION_HASH_LABEL.into(), revision.into());
    pod.metadata.labels = Some(pod_labels);
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.hostname = Some(name);
    spec.subdomain = set
        .spec
        .as_ref()
        .and_then(|s| s.service_name.clone())
        .filter(|s| !s.is_empty());
    let claims = claims_for(set, ordinal);
    let templates: Vec<&str> = set
        .spec
        .iter()
        .flat_map(|s| s.volume_claim_templates.iter().flatten())
        .map(|t| t.metadata.name.as_deref().unwrap_or(""))
        .collect();
    let mut volumes: Vec<Volume> = templates
        .iter()
        .zip(&claims)
        .map(|(template, claim)| Volume {
            name: (*template).to_string(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.metadata.name.clone().unwrap_or_default(),
                read_only: None,
            }),
            ..Default::default()
        })
        .collect();
    volumes.extend(
        spec.volumes
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|v| !templates.contains(&v.name.as_str())),
    );
    spec.volumes = (!volumes.is_empty()).then_some(volumes);
    pod
}

/// Whether `pod` carries its identity labels (upstream `identityMatches`; the hostname and
/// subdomain are immutable once created).
pub fn identity_matches(set_name: &str, pod: &Pod) -> bool {
    let Some(ordinal) = ordinal_of(set_name, pod) else {
        return false;
    };
    let pod_labels = labels(&pod.metadata);
    pod_labels.get(POD_NAME_LABEL) == pod.metadata.name.as_ref()
        && pod_labels.get(POD_INDEX_LABEL) == Some(&ordinal.to_string())
}

fn is_running_and_ready(pod: &Pod) -> bool {
    pods::phase(pod) == "Running" && pods::is_ready(pod)
}

fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

fn revision_of(pod: &Pod) -> String {
    labels(&pod.metadata)
        .get(CONTROLLER_REVISION_HASH_LABEL)
        .cloned()
        .unwrap_or_default()
}

/// What a status reports of the members (upstream `computeReplicaStatus`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Pods the API server holds (a phase set).
    pub replicas: i32,
    /// Running and Ready.
    pub ready: i32,
    /// Ready for `minReadySeconds`.
    pub available: i32,
    /// Not terminating, at the current revision.
    pub current: i32,
    /// Not terminating, at the update revision.
    pub updated: i32,
}

/// Counts `members` for the status.
pub fn count_replicas(members: &[&Pod], min_ready: i32, current: &str, update: &str) -> Counts {
    let mut counts = Counts::default();
    for pod in members {
        let created = !pods::phase(pod).is_empty();
        if created {
            counts.replicas += 1;
        }
        if is_running_and_ready(pod) {
            counts.ready += 1;
            if is_available(pod, min_ready) {
                counts.available += 1;
            }
        }
        if created && !is_terminating(pod) {
            let revision = revision_of(pod);
            if revision == current {
                counts.current += 1;
            }
            if revision == update {
                counts.updated += 1;
            }
        }
    }
    counts
}

/// Upstream `completeRollingUpdate`: once every replica is updated and ready, the update
/// revision becomes the current one.
pub fn complete_rolling_update(set: &StatefulSet, status: &mut StatefulSetStatus) {
    let rolling = set
        .spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.type_.as_deref())
        .is_none_or(|t| t == "RollingUpdate");
    let wanted = replicas_of(set);
    if rolling
        && status.updated_replicas == Some(wanted)
        && status.ready_replicas == Some(wanted)
        && status.replicas == wanted
    {
        status.current_replicas = status.updated_replicas;
        status.current_revision = status.update_revision.clone();
    }
}

/// One step of a StatefulSet's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Create the claims and then the pod of `ordinal`, at the update revision or the current.
    CreatePod {
        /// The pod's ordinal.
        ordinal: i32,
        /// Whether it is made from the update revision (else the current one).
        at_update_revision: bool,
    },
    /// Create the claims a pending pod lacks.
    CreateMissingClaims {
        /// The pod's ordinal.
        ordinal: i32,
    },
    /// Delete a pod: finished, condemned by a scale-down, or out of date.
    DeletePod {
        /// The pod's name.
        name: String,
    },
    /// Put back a pod's identity labels.
    RestoreIdentity {
        /// The pod's name.
        name: String,
        /// Its ordinal.
        ordinal: i32,
    },
}

/// A sync's actions, in order.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// What to do, in this order.
    pub actions: Vec<Action>,
    /// Whether the last action deletes a pod for the rolling update (its status no longer
    /// counts it as current).
    pub deleted_for_update: bool,
}

/// A replica slot: a member pod, or the pod that would be created for it.
enum Slot<'a> {
    Member(&'a Pod),
    Missing { ordinal: i32, at_update: bool },
}

/// Upstream `updateStatefulSet` as a plan over the members seen: fill the missing ordinals,
/// delete the condemned ones (above the replica range, highest first), then replace one
/// out-of-date pod (highest ordinal first, not below the partition). OrderedReady stops at the
/// first pod that is missing, not Running and Ready, or terminating; Parallel goes on.
pub fn plan(set: &StatefulSet, members: &[&Pod], update: &str) -> Plan {
    let mut plan = Plan::default();
    let set_name = set.metadata.name.as_deref().unwrap_or("");
    let Some(spec) = &set.spec else {
        return plan;
    };
    if set.metadata.deletion_timestamp.is_some() {
        return plan;
    }
    let start = start_ordinal(set);
    let replicas = replicas_of(set);
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let monotonic = spec.pod_management_policy.as_deref() != Some("Parallel");
    let strategy = spec.update_strategy.as_ref();
    let rolling = strategy
        .and_then(|u| u.type_.as_deref())
        .is_none_or(|t| t == "RollingUpdate");
    let partition = strategy
        .and_then(|u| u.rolling_update.as_ref())
        .map(|r| r.partition.unwrap_or(0));
    let status_current = set
        .status
        .as_ref()
        .and_then(|s| s.current_replicas)
        .unwrap_or(0);
    // Upstream newVersionedStatefulSetPod: ordinals below the partition (or, without one,
    // below the current replicas count) are recreated at the current revision.
    let at_update = |ordinal: i32| {
        let at_current = (rolling && partition.is_none() && ordinal < start + status_current)
            || partition.is_some_and(|p| ordinal < start + p);
        !at_current
    };
    let mut slots: Vec<Slot> = (0..replicas)
        .map(|i| Slot::Missing {
            ordinal: start + i,
            at_update: at_update(start + i),
        })
        .collect();
    let mut condemned: Vec<(i32, &Pod)> = Vec::new();
    for pod in members {
        let Some(ordinal) = ordinal_of(set_name, pod) else {
            continue;
        };
        if in_ordinal_range(set, ordinal) {
            slots[(ordinal - start) as usize] = Slot::Member(pod);
        } else {
            condemned.push((ordinal, pod));
        }
    }
    condemned.sort_by_key(|(ordinal, _)| std::cmp::Reverse(*ordinal));
    let unavailable = |pod: &Pod| !is_available(pod, min_ready) || is_terminating(pod);
    let first_unavailable: Option<&str> = slots
        .iter()
        .find_map(|slot| match slot {
            Slot::Missing { .. } => Some(None),
            Slot::Member(pod) => unavailable(pod).then_some(pod.metadata.name.as_deref()),
        })
        .or_else(|| {
            condemned
                .iter()
                .rev()
                .find(|(_, pod)| unavailable(pod))
                .map(|(_, pod)| pod.metadata.name.as_deref())
        })
        .flatten();

    for slot in &slots {
        let pod = match slot {
            Slot::Missing { ordinal, at_update } => {
                plan.actions.push(Action::CreatePod {
                    ordinal: *ordinal,
                    at_update_revision: *at_update,
                });
                if monotonic {
                    return plan;
                }
                continue;
            }
            Slot::Member(pod) => *pod,
        };
        let name = pod.metadata.name.clone().unwrap_or_default();
        if pods::is_finished(pod) {
            // Recreated once the API server has removed it.
            if !is_terminating(pod) {
                plan.actions.push(Action::DeletePod { name });
            }
            if monotonic {
                return plan;
            }
            continue;
        }
        if pods::phase(pod) == "Pending"
            && let Some(ordinal) = ordinal_of(set_name, pod)
        {
            plan.actions.push(Action::CreateMissingClaims { ordinal });
        }
        if monotonic
            && (is_terminating(pod) || !is_running_and_ready(pod) || !is_available(pod, min_ready))
        {
            return plan;
        }
        if !identity_matches(set_name, pod)
            && let Some(ordinal) = ordinal_of(set_name, pod)
        {
            plan.actions.push(Action::RestoreIdentity { name, ordinal });
        }
    }

    for (_, pod) in &condemned {
        let name = pod.metadata.name.clone().unwrap_or_default();
        if is_terminating(pod) {
            if monotonic {
                return plan;
            }
            continue;
        }
        let is_first_unavailable = first_unavailable == Some(name.as_str());
        if monotonic
            && (!is_running_and_ready(pod) || !is_available(pod, min_ready))
            && !is_first_unavailable
        {
            return plan;
        }
        plan.actions.push(Action::DeletePod { name });
        if monotonic {
            return plan;
        }
    }

    if !rolling {
        // OnDelete: pods are replaced only when someone deletes them.
        return plan;
    }
    let update_min = partition.unwrap_or(0).max(0) as usize;
    for slot in slots.iter().skip(update_min).rev() {
        match slot {
            // Being created in this sync (in Parallel mode): not yet available.
            Slot::Missing { .. } => return plan,
            Slot::Member(pod) => {
                if revision_of(pod) != update && !is_terminating(pod) {
                    plan.actions.push(Action::DeletePod {
                        name: pod.metadata.name.clone().unwrap_or_default(),
                    });
                    plan.deleted_for_update = true;
                    return plan;
                }
                if unavailable(pod) {
                    return plan;
                }
            }
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(extra: Value) -> StatefulSet {
        let mut base = json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "set-uid", "generation": 1},
            "spec": {
                "replicas": 3,
                "serviceName": "nginx",
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                             "spec": {"containers": [{"name": "c", "image": "nginx"}]}},
                "volumeClaimTemplates": [{"metadata": {"name": "www"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}],
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
            },
        });
        merge(&mut base, extra);
        serde_json::from_value(base).expect("test fixture")
    }

    fn merge(base: &mut Value, extra: Value) {
        match (base, extra) {
            (Value::Object(b), Value::Object(e)) => {
                for (k, v) in e {
                    merge(b.entry(k).or_insert(Value::Null), v);
                }
            }
            (b, e) => *b = e,
        }
    }

    /// A member pod: `state` is "ready", "pending", "terminating" or "failed".
    fn pod(ordinal: i32, revision: &str, state: &str) -> Pod {
        let ready = if state == "ready" { "True" } else { "False" };
        let phase = match state {
            "ready" | "terminating" => "Running",
            "failed" => "Failed",
            _ => "Pending",
        };
        let mut value = json!({
            "metadata": {"name": format!("web-{ordinal}"), "namespace": "default",
                "labels": {"app": "web", POD_NAME_LABEL: format!("web-{ordinal}"),
                           POD_INDEX_LABEL: ordinal.to_string(),
                           CONTROLLER_REVISION_HASH_LABEL: revision}},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]},
        });
        if state == "terminating" {
            value["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
        }
        serde_json::from_value(value).expect("test fixture")
    }

    fn create(ordinal: i32) -> Action {
        Action::CreatePod {
            ordinal,
            at_update_revision: true,
        }
    }

    fn delete(name: &str) -> Action {
        Action::DeletePod { name: name.into() }
    }

    #[test]
    fn ordered_ready_creates_one_ordinal_after_its_predecessors_are_ready() {
        let s = set(json!({}));
        let (p0r, p0p, p1r) = (
            pod(0, "r1", "ready"),
            pod(0, "r1", "pending"),
            pod(1, "r1", "ready"),
        );
        let cases: Vec<(&str, Vec<&Pod>, Vec<Action>)> = vec![
            ("empty: web-0 only", vec![], vec![create(0)]),
            (
                "web-0 pending: wait",
                vec![&p0p],
                vec![Action::CreateMissingClaims { ordinal: 0 }],
            ),
            ("web-0 ready: web-1", vec![&p0r], vec![create(1)]),
            ("web-0,1 ready: web-2", vec![&p0r, &p1r], vec![create(2)]),
        ];
        for (name, members, want) in cases {
            assert_eq!(plan(&s, &members, "r1").actions, want, "{name}");
        }
    }

    #[test]
    fn parallel_creates_every_missing_ordinal_at_once() {
        let s = set(json!({"spec": {"podManagementPolicy": "Parallel"}}));
        let p1 = pod(1, "r1", "pending");
        assert_eq!(
            plan(&s, &[&p1], "r1").actions,
            vec![
                create(0),
                Action::CreateMissingClaims { ordinal: 1 },
                create(2)
            ]
        );
    }

    #[test]
    fn scale_down_removes_the_highest_ordinal_first_one_at_a_time() {
        let s = set(json!({"spec": {"replicas": 1}}));
        let (p0, p1, p2) = (
            pod(0, "r1", "ready"),
            pod(1, "r1", "ready"),
            pod(2, "r1", "ready"),
        );
        let p2_going = pod(2, "r1", "terminating");
        assert_eq!(
            plan(&s, &[&p0, &p1, &p2], "r1").actions,
            vec![delete("web-2")]
        );
        // While web-2 terminates, web-1 waits.
        assert_eq!(plan(&s, &[&p0, &p1, &p2_going], "r1").actions, vec![]);
        assert_eq!(plan(&s, &[&p0, &p1], "r1").actions, vec![delete("web-1")]);
        // Parallel deletes both at once.
        let parallel = set(json!({"spec": {"replicas": 1, "podManagementPolicy": "Parallel"}}));
        assert_eq!(
            plan(&parallel, &[&p0, &p1, &p2], "r1").actions,
            vec![delete("web-2"), delete("web-1")]
        );
    }

    #[test]
    fn rolling_update_replaces_the_highest_outdated_ordinal_down_to_the_partition() {
        let s = set(json!({}));
        let (o0, o1, o2) = (
            pod(0, "old", "ready"),
            pod(1, "old", "ready"),
            pod(2, "old", "ready"),
        );
        let (n1, n2) = (pod(1, "new", "ready"), pod(2, "new", "ready"));
        let n2_pending = pod(2, "new", "pending");
        let p = plan(&s, &[&o0, &o1, &o2], "new");
        assert_eq!(p.actions, vec![delete("web-2")]);
        assert!(p.deleted_for_update);
        // web-2 updated but not ready yet: wait (OrderedReady blocks before the update too).
        assert_eq!(
            plan(&s, &[&o0, &o1, &n2_pending], "new").actions,
            vec![Action::CreateMissingClaims { ordinal: 2 }]
        );
        assert_eq!(
            plan(&s, &[&o0, &o1, &n2], "new").actions,
            vec![delete("web-1")]
        );
        assert_eq!(
            plan(&s, &[&o0, &n1, &n2], "new").actions,
            vec![delete("web-0")]
        );
        // A partition of 2 keeps web-0 and web-1 at the old revision.
        let partitioned =
            set(json!({"spec": {"updateStrategy": {"rollingUpdate": {"partition": 2}}}}));
        assert_eq!(plan(&partitioned, &[&o0, &o1, &n2], "new").actions, vec![]);
        // A missing ordinal below the partition is recreated at the current revision.
        assert_eq!(
            plan(&partitioned, &[&o1, &n2], "new").actions,
            vec![Action::CreatePod {
                ordinal: 0,
                at_update_revision: false
            }]
        );
        // OnDelete never deletes for an update.
        let on_delete =
            set(json!({"spec": {"updateStrategy": {"type": "OnDelete", "rollingUpdate": null}}}));
        assert_eq!(plan(&on_delete, &[&o0, &o1, &o2], "new").actions, vec![]);
    }

    #[test]
    fn a_failed_pod_is_deleted_to_be_recreated() {
        let s = set(json!({}));
        let (p0, p1) = (pod(0, "r1", "ready"), pod(1, "r1", "failed"));
        assert_eq!(plan(&s, &[&p0, &p1], "r1").actions, vec![delete("web-1")]);
    }

    #[test]
    fn pods_get_stable_identity_storage_and_revision() {
        let s = set(json!({"spec": {"template": {"spec": {"volumes": [
            {"name": "www", "emptyDir": {}}, {"name": "config", "emptyDir": {}}]}}}}));
        let template = s.spec.as_ref().expect("test fixture").template.clone();
        let p = new_pod(&s, &template, 1, "web-abc");
        assert_eq!(p.metadata.name.as_deref(), Some("web-1"));
        assert_eq!(p.metadata.generate_name.as_deref(), Some("web-"));
        let l = p.metadata.labels.clone().expect("test fixture");
        assert_eq!(l[POD_NAME_LABEL], "web-1");
        assert_eq!(l[POD_INDEX_LABEL], "1");
        assert_eq!(l[CONTROLLER_REVISION_HASH_LABEL], "web-abc");
        assert_eq!(l["app"], "web");
        let spec = p.spec.clone().expect("test fixture");
        assert_eq!(spec.hostname.as_deref(), Some("web-1"));
        assert_eq!(spec.subdomain.as_deref(), Some("nginx"));
        let volumes = spec.volumes.expect("test fixture");
        // The claim replaces the template's own volume of the same name.
        assert_eq!(volumes.len(), 2);
        assert_eq!(
            volumes[0]
                .persistent_volume_claim
                .as_ref()
                .expect("test fixture")
                .claim_name,
            "www-web-1"
        );
        assert_eq!(volumes[1].name, "config");
        let owner = &p.metadata.owner_references.clone().expect("test fixture")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("StatefulSet", Some(true))
        );
        let claims = claims_for(&s, 1);
        assert_eq!(claims[0].metadata.name.as_deref(), Some("www-web-1"));
        assert_eq!(
            claims[0].metadata.labels.as_ref().expect("test fixture")["app"],
            "web"
        );
        assert!(identity_matches("web", &p));
    }

    #[test]
    fn ordinals_parse_only_for_the_sets_own_pods() {
        let named = |n: &str| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": n}})).expect("test fixture")
        };
        let cases = [
            ("web-0", Some(0)),
            ("web-12", Some(12)),
            ("web-x", None),
            ("web-", None),
            ("webby-1", None),
            ("web-web-1", None),
            ("web--1", None),
        ];
        for (name, want) in cases {
            assert_eq!(ordinal_of("web", &named(name)), want, "{name}");
        }
        assert_eq!(ordinal_of("web-web", &named("web-web-1")), Some(1));
    }

    #[test]
    fn status_counts_and_rollout_completion() {
        let s = set(json!({}));
        let (a, b, c) = (
            pod(0, "old", "ready"),
            pod(1, "new", "ready"),
            pod(2, "new", "terminating"),
        );
        let counts = count_replicas(&[&a, &b, &c], 0, "old", "new");
        assert_eq!(
            counts,
            Counts {
                replicas: 3,
                ready: 2,
                available: 2,
                current: 1,
                updated: 1
            }
        );
        let mut status = StatefulSetStatus {
            replicas: 3,
            ready_replicas: Some(3),
            updated_replicas: Some(3),
            current_replicas: Some(0),
            current_revision: Some("old".into()),
            update_revision: Some("new".into()),
            ..Default::default()
        };
        complete_rolling_update(&s, &mut status);
        assert_eq!(status.current_revision.as_deref(), Some("new"));
        assert_eq!(status.current_replicas, Some(3));
    }

    #[test]
    fn a_ready_pod_requeues_its_set_when_min_ready_seconds_have_passed() {
        let ready_at = |pod: &mut Pod, at: &str| {
            let conditions = pod.status.as_mut().and_then(|s| s.conditions.as_mut());
            for condition in conditions.into_iter().flatten() {
                condition.last_transition_time = at
                    .parse()
                    .ok()
                    .map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time);
            }
        };
        let now: Timestamp = "2025-01-01T00:00:03Z".parse().expect("time");
        let mut early = pod(0, "r1", "ready");
        ready_at(&mut early, "2025-01-01T00:00:00Z");
        let mut later = pod(1, "r1", "ready");
        ready_at(&mut later, "2025-01-01T00:00:02Z");
        let mut long_ago = pod(2, "r1", "ready");
        ready_at(&mut long_ago, "2024-12-31T00:00:00Z");
        let pending = pod(3, "r1", "pending");
        let all = [&early, &later, &long_ago, &pending];
        assert_eq!(
            until_available(&all, 10, now),
            Some(Duration::from_secs(7) + AVAILABILITY_DELTA),
            "the earliest to become available"
        );
        assert_eq!(until_available(&[&long_ago, &pending], 10, now), None);
        assert_eq!(until_available(&all, 0, now), None);
    }

    #[test]
    fn a_deleted_claim_queues_the_set_it_belongs_to() {
        let web = Arc::new(set(json!({})));
        let other = Arc::new(set(json!({"metadata": {"name": "db"}})));
        let elsewhere = Arc::new(set(json!({"metadata": {"namespace": "prod"}})));
        let sets = [web, other, elsewhere];
        let claim = |name: &str| PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            sets_of_deleted_claim(&claim("www-web-2"), &sets),
            vec!["default/web"]
        );
        assert_eq!(
            sets_of_deleted_claim(&claim("www-db-0"), &sets),
            vec!["default/db"]
        );
        assert!(sets_of_deleted_claim(&claim("www-web-x"), &sets).is_empty());
        assert!(sets_of_deleted_claim(&claim("data-web-0"), &sets).is_empty());
    }

    #[test]
    fn claim_owners_follow_the_retention_policy() {
        let set_meta = ObjectMeta {
            name: Some("web".into()),
            uid: Some("s".into()),
            ..Default::default()
        };
        let pod_meta = ObjectMeta {
            name: Some("web-2".into()),
            uid: Some("p".into()),
            ..Default::default()
        };
        let policy = |deleted: bool, scaled: bool| RetentionPolicy {
            delete_with_set: deleted,
            delete_when_scaled: scaled,
        };
        let uids = |refs: Option<Vec<OwnerReference>>| {
            refs.map(|r| r.into_iter().map(|o| o.uid).collect::<Vec<_>>())
        };
        let set_ref = plain_reference("apps/v1", "StatefulSet", &set_meta);
        // (policy, current owners, scaled down) → new owners (None: unchanged)
        type Case = (
            RetentionPolicy,
            Vec<OwnerReference>,
            bool,
            Option<Vec<&'static str>>,
        );
        let cases: Vec<Case> = vec![
            (policy(false, false), vec![], false, None),
            (
                policy(false, false),
                vec![set_ref.clone()],
                false,
                Some(vec![]),
            ),
            (policy(true, false), vec![], false, Some(vec!["s"])),
            (policy(true, false), vec![set_ref.clone()], true, None),
            (policy(false, true), vec![], false, None),
            (policy(false, true), vec![], true, Some(vec!["p"])),
            (
                policy(true, true),
                vec![set_ref.clone()],
                true,
                Some(vec!["p"]),
            ),
            (policy(true, true), vec![], false, Some(vec!["s"])),
        ];
        for (i, (policy, current, scaled_down, want)) in cases.into_iter().enumerate() {
            let got = uids(claim_owners(
                policy,
                &current,
                &set_meta,
                &pod_meta,
                scaled_down,
            ));
            let want = want.map(|w| w.into_iter().map(String::from).collect::<Vec<_>>());
            assert_eq!(got, want, "case {i}");
        }
    }
}
