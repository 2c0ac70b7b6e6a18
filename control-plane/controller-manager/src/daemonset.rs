//! The DaemonSet controller (upstream `pkg/controller/daemon`, a pure API client): one pod per
//! eligible node (nodeSelector, required node affinity, taints against the pod's tolerations
//! plus upstream's default daemon tolerations), each created with a required node affinity on
//! the node's `metadata.name` for the scheduler to honour; pods follow nodes joining, leaving
//! and changing; template history in ControllerRevisions; RollingUpdate (maxUnavailable,
//! maxSurge) and OnDelete updates; status.
//!
//! A change to a DaemonSet or to a pod or ControllerRevision it controls queues the set's key;
//! so does a node's: an added node queues the sets that should run on it, a changed one the
//! sets whose verdict on it changed (upstream's addNode/updateNode), a deleted one every set
//! (their pods there are deleted; upstream leaves that to pod GC). The decisions —
//! eligibility, what each node needs, which pods a rolling update replaces, the status counts —
//! are pure functions below; a sync performs them. Pods waiting out `minReadySeconds`, which no
//! event announces, requeue the set after that time.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    PodSpec, PodTemplateSpec, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, Patch, PostParams};
use serde_json::json;

use crate::expectations::Expectations;
use crate::handlers;
use crate::history::{self, CONTROLLER_REVISION_HASH_LABEL};
use crate::informers::{Change, Index, Informer, Informers};
use crate::pods;
use crate::replicaset::is_available;
use crate::statefulset::until_available;
use crate::workqueue::{Requeue, WorkQueue, run_workers};

const MANAGER: &str = "daemonset-controller";
/// DaemonSets synced at once (upstream's `--concurrent-daemonset-syncs`).
const CONCURRENT_SYNCS: usize = 2;
/// The largest batch of pod creates in flight at once (upstream's burst).
const MAX_BATCH: usize = 500;
/// The pod label with the DaemonSet's template generation (`extensions.DaemonSetTemplateGenerationKey`).
pub const TEMPLATE_GENERATION_LABEL: &str = "pod-template-generation";
/// The DaemonSet annotation the API server keeps the template generation in.
pub const TEMPLATE_GENERATION_ANNOTATION: &str = "deprecated.daemonset.template.generation";

/// Why a DaemonSet's sync stopped early.
#[derive(Debug)]
pub enum SyncError {
    /// An API request failed.
    Api(kube::Error),
    /// The revision name for the template is taken by other data: the collision count was
    /// bumped and the next sync tries the new name.
    HashCollision {
        /// The revision name that collided.
        revision: String,
    },
}

impl std::fmt::Display for SyncError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SyncError::Api(err) => write!(f, "api request failed: {err}"),
            SyncError::HashCollision { revision } => {
                write!(f, "controller revision {revision} exists with other data")
            }
        }
    }
}

impl std::error::Error for SyncError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SyncError::Api(err) => Some(err),
            SyncError::HashCollision { .. } => None,
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
    sets: Informer<DaemonSet>,
    pods: Informer<Pod>,
    nodes: Informer<Node>,
    /// Pods by their controller's uid.
    owned_pods: Index<Pod>,
    /// ControllerRevisions by their controller's uid.
    owned_revisions: Index<ControllerRevision>,
}

/// Runs the controller until the task is aborted: handlers queue DaemonSet keys, workers sync
/// one key at a time each.
pub async fn run(informers: Arc<Informers>) {
    let sets = informers.get::<DaemonSet>();
    let pods = informers.get::<Pod>();
    let nodes = informers.get::<Node>();
    let revisions = informers.get::<ControllerRevision>();
    let caches = Caches {
        owned_pods: pods.index(pods::BY_CONTROLLER_UID, pods::controller_uid::<Pod>),
        owned_revisions: revisions.index(
            pods::BY_CONTROLLER_UID,
            pods::controller_uid::<ControllerRevision>,
        ),
        sets: sets.clone(),
        pods: pods.clone(),
        nodes: nodes.clone(),
    };
    let client = informers.client().clone();
    let queue = Arc::new(WorkQueue::new("daemonset"));
    let expectations = Arc::new(Expectations::default());

    handlers::queue_each(&sets, &queue);
    handlers::queue_pod_controller(&pods, &queue, "DaemonSet", &expectations);
    handlers::queue_controller(&revisions, &queue, "DaemonSet");
    let on_node = queue.clone();
    let node_sets = sets.clone();
    nodes.on_change(move |change| {
        if !node_change_matters(change) {
            return;
        }
        for key in sets_for_node_change(change, &node_sets.list()) {
            on_node.add(key);
        }
    });

    sets.ready().await;
    pods.ready().await;
    nodes.ready().await;
    revisions.ready().await;
    run_workers(&queue, CONCURRENT_SYNCS, |key: String| {
        sync_key(&client, &caches, &expectations, key)
    })
    .await
}

/// Whether a node's change may change where daemon pods run: it was added or deleted, or its
/// name, labels or taints changed ([`should_run`] reads nothing else). Status heartbeats
/// queue nothing.
fn node_change_matters(change: &Change<'_, Node>) -> bool {
    let (Some(old), Some(new)) = (change.old, change.new) else {
        return true;
    };
    let taints = |n: &Node| n.spec.as_ref().and_then(|s| s.taints.clone());
    old.metadata.name != new.metadata.name
        || old.metadata.labels != new.metadata.labels
        || taints(old) != taints(new)
}

/// The keys of the DaemonSets a node's change concerns: for an added node, those that should
/// run a pod there; for a changed one, those whose verdict ([`should_run`]) changed; for a
/// deleted one, all of them (this controller deletes their pods bound there).
fn sets_for_node_change(change: &Change<'_, Node>, sets: &[Arc<DaemonSet>]) -> Vec<String> {
    let verdict = |node: &Node, set: &DaemonSet| {
        set.spec
            .as_ref()
            .map_or((false, false), |spec| should_run(node, &spec.template))
    };
    sets.iter()
        .filter(|set| match (change.old, change.new) {
            (None, Some(new)) => verdict(new, set).0,
            (Some(old), Some(new)) => verdict(old, set) != verdict(new, set),
            (Some(_), None) => true,
            (None, None) => false,
        })
        .map(|set| pods::key(&set.metadata))
        .collect()
}

/// Syncs the DaemonSet `key` from the caches.
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
    let uid = set.metadata.uid.as_deref().unwrap_or("");
    let owned = caches.owned_pods.get(uid);
    let mine: Vec<&Pod> = owned.iter().map(|p| &**p).collect();
    let revisions: Vec<ControllerRevision> = caches
        .owned_revisions
        .get(uid)
        .iter()
        .map(|r| (**r).clone())
        .collect();
    // Upstream lists every node per sync too: what each needs is decided against all of them.
    let nodes = caches.nodes.list();
    let after = sync(
        client,
        &set,
        &mine,
        revisions,
        &nodes,
        caught_up,
        expectations,
    )
    .await?;
    // Unseen writes hold pod changes back; their pods' events queue the set again, the
    // expectations' timeout is the backstop.
    let backstop = (!caught_up).then(|| expectations.remaining(&key));
    Ok(match after.into_iter().chain(backstop).min() {
        Some(after) => Requeue::After(after),
        None => Requeue::No,
    })
}

/// One DaemonSet (upstream `syncDaemonSet`): history, then — once earlier writes are seen —
/// the pods each node needs, then the rolling update, then history cleanup and status.
async fn sync(
    client: &kube::Client,
    set: &DaemonSet,
    owned: &[&Pod],
    revisions: Vec<ControllerRevision>,
    nodes: &[Arc<Node>],
    caught_up: bool,
    expectations: &Expectations,
) -> Result<Option<Duration>, SyncError> {
    let (Some(name), Some(namespace)) = (&set.metadata.name, &set.metadata.namespace) else {
        return Ok(None);
    };
    let Some(spec) = &set.spec else {
        return Ok(None);
    };
    let key = pods::key(&set.metadata);
    let revision_api: Api<ControllerRevision> = Api::namespaced(client.clone(), namespace);
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let (hash, old_revisions) =
        construct_history(client, &revision_api, &pod_api, set, revisions, owned).await?;
    if set.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    let generation = template_generation(set);
    let min_ready = spec.min_ready_seconds.unwrap_or(0);
    let template = template_for(set, &hash, generation.as_deref());
    let node_pods = pods_by_node(owned);
    let eligibility: BTreeMap<String, (bool, bool)> = nodes
        .iter()
        .filter_map(|n| Some((n.metadata.name.clone()?, should_run(n, &spec.template))))
        .collect();

    if caught_up {
        let surge = allows_surge(set);
        let mut to_delete: Vec<(String, bool)> = Vec::new();
        let mut to_create: Vec<String> = Vec::new();
        for (node, (run, keep)) in &eligibility {
            let on_node = node_pods.get(node).map(Vec::as_slice).unwrap_or(&[]);
            let work = pods_should_be_on_node(
                *run,
                *keep,
                on_node,
                surge,
                &hash,
                generation.as_deref(),
                min_ready,
            );
            if work.create {
                to_create.push(node.clone());
            }
            to_delete.extend(work.delete.into_iter().map(|p| (p, false)));
        }
        // Pods whose node is gone: unscheduled ones go as upstream's manage does; bound ones
        // are force-deleted, as upstream's pod GC does for pods of nodes that no longer exist.
        for (node, on_node) in &node_pods {
            if eligibility.contains_key(node) {
                continue;
            }
            for pod in on_node {
                if pod.metadata.deletion_timestamp.is_none() || pods::is_scheduled(pod) {
                    let force = pods::is_scheduled(pod);
                    if let Some(pod_name) = &pod.metadata.name {
                        to_delete.push((pod_name.clone(), force));
                    }
                }
            }
        }
        let wrote = !to_delete.is_empty() || !to_create.is_empty();
        sync_nodes(
            client,
            set,
            &template,
            to_delete,
            to_create,
            &key,
            expectations,
        )
        .await?;
        if !wrote && is_rolling_update(set) {
            let eligible: BTreeSet<String> = eligibility
                .iter()
                .filter(|(_, (run, _))| *run)
                .map(|(n, _)| n.clone())
                .collect();
            let budget = Budget::of(set, eligible.len() as i32);
            let existing: BTreeSet<String> = eligibility.keys().cloned().collect();
            let mut considered: BTreeMap<String, Vec<&Pod>> = node_pods
                .iter()
                .filter(|(n, _)| existing.contains(*n))
                .map(|(n, p)| (n.clone(), p.clone()))
                .collect();
            for node in &eligible {
                considered.entry(node.clone()).or_default();
            }
            let (delete, create) = rolling_update(
                &considered,
                &eligible,
                budget,
                &hash,
                generation.as_deref(),
                min_ready,
            );
            sync_nodes(
                client,
                set,
                &template,
                delete.into_iter().map(|p| (p, false)).collect(),
                create,
                &key,
                expectations,
            )
            .await?;
        }
    }

    // Upstream cleanupHistory: old revisions beyond the limit whose hash no pod carries.
    let live: BTreeSet<String> = owned
        .iter()
        .filter_map(|p| {
            p.metadata
                .labels
                .as_ref()?
                .get(CONTROLLER_REVISION_HASH_LABEL)
                .cloned()
        })
        .collect();
    let limit = spec.revision_history_limit.unwrap_or(10);
    for stale in old_revisions_to_delete(&old_revisions, &live, limit) {
        pods::delete(&revision_api, &stale, &DeleteParams::default()).await?;
    }

    let nodes_eligibility: Vec<(String, bool)> = eligibility
        .iter()
        .map(|(n, (run, _))| (n.clone(), *run))
        .collect();
    let counts = count_daemons(
        &nodes_eligibility,
        &node_pods,
        &hash,
        generation.as_deref(),
        min_ready,
    );
    let current = set.status.clone().unwrap_or_default();
    let observed = if caught_up {
        set.metadata.generation
    } else {
        current.observed_generation
    };
    let unchanged = current.desired_number_scheduled == counts.desired
        && current.current_number_scheduled == counts.current
        && current.number_misscheduled == counts.misscheduled
        && current.number_ready == counts.ready
        && current.updated_number_scheduled.unwrap_or(0) == counts.updated
        && current.number_available.unwrap_or(0) == counts.available
        && current.number_unavailable.unwrap_or(0) == counts.desired - counts.available
        && current.observed_generation == observed;
    if !unchanged {
        let patch = json!({"status": {
            "desiredNumberScheduled": counts.desired,
            "currentNumberScheduled": counts.current,
            "numberMisscheduled": counts.misscheduled,
            "numberReady": counts.ready,
            "updatedNumberScheduled": counts.updated,
            "numberAvailable": counts.available,
            "numberUnavailable": counts.desired - counts.available,
            "observedGeneration": observed,
        }});
        let sets: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
        sets.patch_status(name, &pods::manager(MANAGER), &Patch::Merge(&patch))
            .await?;
    }
    // Pods become available minReadySeconds after turning Ready, which no event announces:
    // the status counts, and a surge's old pod waiting for its replacement, look again then.
    Ok(until_available(
        owned,
        min_ready,
        k8s_openapi::jiff::Timestamp::now(),
    ))
}

/// Upstream `constructHistory`: the revision storing the current template (created when
/// missing, renumbered to be the newest, duplicates folded into it) gives the hash pods are
/// labelled with; the others are returned, oldest first, as old history.
async fn construct_history(
    client: &kube::Client,
    api: &Api<ControllerRevision>,
    pod_api: &Api<Pod>,
    set: &DaemonSet,
    mut revisions: Vec<ControllerRevision>,
    owned: &[&Pod],
) -> Result<(String, Vec<ControllerRevision>), SyncError> {
    history::sort_revisions(&mut revisions);
    let template = set
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default();
    let data = history::template_patch(&template);
    let max_revision = revisions.last().map_or(0, |r| r.revision);
    let (mut current, old): (Vec<ControllerRevision>, Vec<ControllerRevision>) = revisions
        .into_iter()
        .partition(|r| history::stores(r, &data));
    let mut current = match current.pop() {
        None => snapshot(client, api, set, &data, max_revision + 1).await?,
        Some(kept) => {
            // Upstream dedupCurHistories: pods of a duplicate take the kept revision's hash.
            let kept_hash = revision_hash(&kept);
            for duplicate in &current {
                let duplicate_hash = revision_hash(duplicate);
                for pod in owned.iter().filter(|p| {
                    p.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(CONTROLLER_REVISION_HASH_LABEL))
                        == Some(&duplicate_hash)
                }) {
                    let patch = json!({"metadata": {"labels": {CONTROLLER_REVISION_HASH_LABEL: kept_hash}}});
                    let pod_name = pod.metadata.name.as_deref().unwrap_or("");
                    pod_api
                        .patch(pod_name, &pods::manager(MANAGER), &Patch::Merge(&patch))
                        .await?;
                }
                let duplicate_name = duplicate.metadata.name.as_deref().unwrap_or("");
                pods::delete(api, duplicate_name, &DeleteParams::default()).await?;
            }
            kept
        }
    };
    let current_name = current.metadata.name.clone().unwrap_or_default();
    if current.revision < max_revision {
        current = api
            .patch(
                &current_name,
                &pods::manager(MANAGER),
                &Patch::Merge(&json!({"revision": max_revision + 1})),
            )
            .await?;
    }
    let has_hash_label = current
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(CONTROLLER_REVISION_HASH_LABEL));
    if !has_hash_label {
        // Revisions written before the label existed are labelled with their own name.
        let patch = json!({"metadata": {"labels": {CONTROLLER_REVISION_HASH_LABEL: current_name}}});
        current = api
            .patch(
                &current_name,
                &pods::manager(MANAGER),
                &Patch::Merge(&patch),
            )
            .await?;
    }
    Ok((revision_hash(&current), old))
}

fn revision_hash(revision: &ControllerRevision) -> String {
    revision
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(CONTROLLER_REVISION_HASH_LABEL))
        .cloned()
        .or_else(|| revision.metadata.name.clone())
        .unwrap_or_default()
}

/// Upstream `snapshot`: a revision `<set>-<hash>` of the template; a name taken by other data
/// bumps `status.collisionCount` so the next sync hashes to a new name.
async fn snapshot(
    client: &kube::Client,
    api: &Api<ControllerRevision>,
    set: &DaemonSet,
    data: &serde_json::Value,
    number: i64,
) -> Result<ControllerRevision, SyncError> {
    let template = set
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default();
    let collision_count = set.status.as_ref().and_then(|s| s.collision_count);
    let hash = template_hash(&template, collision_count);
    let parent = set.metadata.name.clone().unwrap_or_default();
    let name = format!("{parent}-{hash}");
    let mut labels = template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    labels.insert(CONTROLLER_REVISION_HASH_LABEL.into(), hash);
    let revision = ControllerRevision {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: set.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: set.metadata.annotations.clone(),
            owner_references: Some(vec![pods::controller_reference(
                "apps/v1",
                "DaemonSet",
                &set.metadata,
            )]),
            ..Default::default()
        },
        data: Some(RawExtension(data.clone())),
        revision: number,
    };
    match api.create(&PostParams::default(), &revision).await {
        Ok(created) => Ok(created),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let existing = api.get(&name).await?;
            if history::stores(&existing, data) {
                return Ok(existing);
            }
            let sets: Api<DaemonSet> = Api::namespaced(
                client.clone(),
                set.metadata.namespace.as_deref().unwrap_or(""),
            );
            let bumped = json!({"status": {"collisionCount": collision_count.unwrap_or(0) + 1}});
            sets.patch_status(&parent, &pods::manager(MANAGER), &Patch::Merge(&bumped))
                .await?;
            Err(SyncError::HashCollision { revision: name })
        }
        Err(err) => Err(err.into()),
    }
}

/// Upstream `syncNodes`: deletes `to_delete` (`true`: with no grace period), then creates a pod
/// for each node of `to_create` in slow-start batches (1, 2, 4, …), stopping at the first
/// batch with a failure.
async fn sync_nodes(
    client: &kube::Client,
    set: &DaemonSet,
    template: &PodTemplateSpec,
    to_delete: Vec<(String, bool)>,
    to_create: Vec<String>,
    key: &str,
    expectations: &Expectations,
) -> Result<(), SyncError> {
    let api: Api<Pod> = Api::namespaced(
        client.clone(),
        set.metadata.namespace.as_deref().unwrap_or(""),
    );
    for (name, _) in &to_delete {
        expectations.deleted(key, name);
    }
    let deletes: Vec<(Api<Pod>, String, DeleteParams)> = to_delete
        .into_iter()
        .map(|(name, force)| {
            let params = if force {
                DeleteParams::default().grace_period(0)
            } else {
                DeleteParams::default()
            };
            (api.clone(), name, params)
        })
        .collect();
    let deletes: Vec<(String, Result<(), kube::Error>)> =
        futures::stream::iter(deletes.into_iter().map(|(api, name, params)| async move {
            let outcome = pods::delete(&api, &name, &params).await;
            (name, outcome)
        }))
        .buffer_unordered(MAX_BATCH)
        .collect()
        .await;
    let mut failure = None;
    for (name, outcome) in deletes {
        match outcome {
            Ok(()) => {
                let message = format!("Deleted pod: {name}");
                record_event(client, set, "Normal", "SuccessfulDelete", &message).await;
            }
            Err(err) => {
                let message = format!("Error deleting: {err}");
                record_event(client, set, "Warning", "FailedDelete", &message).await;
                failure = Some(err);
            }
        }
    }
    if let Some(err) = failure {
        return Err(err.into());
    }
    let mut remaining: &[String] = &to_create;
    let mut batch = 1;
    while !remaining.is_empty() {
        let size = batch.min(remaining.len());
        let (now, later) = remaining.split_at(size);
        let creates: Vec<(Api<Pod>, Pod)> = now
            .iter()
            .map(|node| (api.clone(), pod_for_node(set, template, node)))
            .collect();
        let outcomes: Vec<Result<Pod, kube::Error>> = futures::stream::iter(
            creates
                .into_iter()
                .map(|(api, pod)| async move { api.create(&PostParams::default(), &pod).await }),
        )
        .buffer_unordered(size)
        .collect()
        .await;
        let mut failure = None;
        for outcome in outcomes {
            match outcome {
                Ok(created) => {
                    if let Some(name) = &created.metadata.name {
                        expectations.created(key, name);
                        let message = format!("Created pod: {name}");
                        record_event(client, set, "Normal", "SuccessfulCreate", &message).await;
                    }
                }
                Err(err) => {
                    let message = format!("Error creating: {err}");
                    record_event(client, set, "Warning", "FailedCreate", &message).await;
                    failure = Some(err);
                }
            }
        }
        if let Some(err) = failure {
            return Err(err.into());
        }
        remaining = later;
        batch = (batch * 2).min(MAX_BATCH);
    }
    Ok(())
}

/// A core/v1 Event about `set` ([`crate::events::create`]).
async fn record_event(
    client: &kube::Client,
    set: &DaemonSet,
    type_: &str,
    reason: &str,
    message: &str,
) {
    let object = crate::events::EventRef {
        api_version: "apps/v1",
        kind: "DaemonSet",
        metadata: &set.metadata,
    };
    crate::events::create(client, MANAGER, object, type_, reason, message).await;
}

// ---------------------------------------------------------------- pure logic

/// Upstream `ComputeHash` of a DaemonSet template: FNV-1a over the template and the collision
/// count, safely encoded. (Upstream hashes Go's printed form of the struct; this hashes its
/// canonical JSON, so names differ from upstream's but are stable the same way.)
pub fn template_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    let value = serde_json::to_value(template).unwrap_or_default();
    let bytes = serde_json::to_vec(&history::canonical(&value)).unwrap_or_default();
    let count = collision_count.map(|c| (c as u32).to_le_bytes());
    let hash = history::fnv1a_32(&[&bytes, count.as_ref().map_or(&[][..], |c| &c[..])]);
    history::safe_encode(&hash.to_string())
}

/// The template generation the API server records in the DaemonSet's annotation.
pub fn template_generation(set: &DaemonSet) -> Option<String> {
    set.metadata
        .annotations
        .as_ref()?
        .get(TEMPLATE_GENERATION_ANNOTATION)
        .cloned()
}

/// Upstream `AddOrUpdateDaemonPodTolerations`: daemon pods tolerate the node conditions'
/// taints (not-ready and unreachable NoExecute; pressure and unschedulable NoSchedule, and
/// network-unavailable for host-network pods), so node problems do not evict or block them.
pub fn add_daemon_tolerations(spec: &mut PodSpec) {
    let mut defaults = vec![
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ];
    if spec.host_network == Some(true) {
        defaults.push(("node.kubernetes.io/network-unavailable", "NoSchedule"));
    }
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    for (key, effect) in defaults {
        let wanted = Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: Some(effect.into()),
            ..Default::default()
        };
        // Upstream AddOrUpdateTolerationInPodSpec: one with the same key, operator, value and
        // effect is replaced (dropping its tolerationSeconds), else it is appended.
        let same = |t: &Toleration| {
            t.key == wanted.key
                && t.operator == wanted.operator
                && t.value.as_deref().unwrap_or("").is_empty()
                && t.effect == wanted.effect
        };
        match tolerations.iter_mut().find(|t| same(t)) {
            Some(existing) => *existing = wanted,
            None => tolerations.push(wanted),
        }
    }
}

fn requirement_matches(requirement: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = requirement.values.as_deref().unwrap_or(&[]);
    let contains = |v: &str| values.iter().any(|w| w == v);
    match requirement.operator.as_str() {
        "In" => value.is_some_and(contains),
        "NotIn" => value.is_none_or(|v| !contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(actual), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|v| v.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if requirement.operator == "Gt" {
                actual > bound
            } else {
                actual < bound
            }
        }
        _ => false,
    }
}

/// Upstream `GetRequiredNodeAffinity(pod).Match(node)`: `nodeSelector` and the required node
/// affinity terms (ORed; a term's label expressions and `metadata.name` fields ANDed).
pub fn matches_node(spec: &PodSpec, node: &Node) -> bool {
    let empty = BTreeMap::new();
    let node_labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    if let Some(selector) = &spec.node_selector
        && !selector.iter().all(|(k, v)| node_labels.get(k) == Some(v))
    {
        return false;
    }
    let Some(required) = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
    else {
        return true;
    };
    let node_name = node.metadata.name.as_deref();
    required.node_selector_terms.iter().any(|term| {
        let expressions = term.match_expressions.as_deref().unwrap_or(&[]);
        let fields = term.match_fields.as_deref().unwrap_or(&[]);
        if expressions.is_empty() && fields.is_empty() {
            return false;
        }
        expressions
            .iter()
            .all(|r| requirement_matches(r, node_labels.get(&r.key).map(String::as_str)))
            && fields.iter().all(|r| {
                let value = if r.key == "metadata.name" {
                    node_name
                } else {
                    None
                };
                requirement_matches(r, value)
            })
    })
}

/// Upstream `NodeShouldRunDaemonPod`: (should a daemon pod run here, may a running one stay).
/// A pod that fits except for a NoSchedule taint may stay; a NoExecute one it does not
/// tolerate, or a selector or affinity it does not match, sends it away.
pub fn should_run(node: &Node, template: &PodTemplateSpec) -> (bool, bool) {
    let mut spec = template.spec.clone().unwrap_or_default();
    let node_name = node.metadata.name.as_deref().unwrap_or("");
    if spec
        .node_name
        .as_deref()
        .is_some_and(|n| !n.is_empty() && n != node_name)
    {
        return (false, false);
    }
    add_daemon_tolerations(&mut spec);
    if !matches_node(&spec, node) {
        return (false, false);
    }
    let tolerations = spec.tolerations.as_deref().unwrap_or(&[]);
    let untolerated = |effects: &[&str]| {
        node.spec
            .iter()
            .flat_map(|s| s.taints.iter().flatten())
            .filter(|t| effects.contains(&t.effect.as_str()))
            .any(|t| !tolerations.iter().any(|tol| pods::tolerates(tol, t)))
    };
    if untolerated(&["NoSchedule", "NoExecute"]) {
        return (false, !untolerated(&["NoExecute"]));
    }
    (true, true)
}

/// The node a daemon pod is for (upstream `GetTargetNodeName`): its `nodeName`, or before
/// binding the single `metadata.name` its required node affinity names.
pub fn target_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(name) = spec.node_name.as_ref().filter(|n| !n.is_empty()) {
        return Some(name.clone());
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    terms.iter().find_map(|term| {
        term.match_fields.iter().flatten().find_map(|r| {
            let values = r.values.as_deref().unwrap_or(&[]);
            (r.key == "metadata.name" && r.operator == "In" && values.len() == 1)
                .then(|| values[0].clone())
        })
    })
}

/// Upstream `ReplaceDaemonSetPodNodeNameNodeAffinity`: the required node affinity becomes the
/// one term `metadata.name In [node]` (the controller checked the rest already); preferred
/// terms and pod (anti-)affinity stay.
pub fn pin_to_node(affinity: Option<Affinity>, node: &str) -> Affinity {
    let selector = NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".into(),
                operator: "In".into(),
                values: Some(vec![node.to_string()]),
            }]),
            match_expressions: None,
        }],
    };
    let mut affinity = affinity.unwrap_or_default();
    let node_affinity = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    node_affinity.required_during_scheduling_ignored_during_execution = Some(selector);
    affinity
}

/// Upstream `CreatePodTemplate`: the set's template with the daemon tolerations, the
/// revision hash label and (when known) the template generation label.
pub fn template_for(set: &DaemonSet, hash: &str, generation: Option<&str>) -> PodTemplateSpec {
    let mut template = set
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default();
    add_daemon_tolerations(template.spec.get_or_insert_with(Default::default));
    let metadata = template.metadata.get_or_insert_with(Default::default);
    let labels = metadata.labels.get_or_insert_with(BTreeMap::new);
    if let Some(generation) = generation {
        labels.insert(TEMPLATE_GENERATION_LABEL.into(), generation.into());
    }
    if !hash.is_empty() {
        labels.insert(CONTROLLER_REVISION_HASH_LABEL.into(), hash.into());
    }
    template
}

/// The daemon pod for `node`: `template` pinned to it, named from `<set>-`, owned by the set.
pub fn pod_for_node(set: &DaemonSet, template: &PodTemplateSpec, node: &str) -> Pod {
    let namespace = set.metadata.namespace.as_deref().unwrap_or("");
    let set_name = set.metadata.name.as_deref().unwrap_or("");
    let owner = pods::controller_reference("apps/v1", "DaemonSet", &set.metadata);
    let mut pod = pods::from_template(template, namespace, None, &format!("{set_name}-"), owner);
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.affinity = Some(pin_to_node(spec.affinity.take(), node));
    pod
}

/// The set's pods by the node they are for; terminal pods already being deleted are left out
/// (upstream `getNodesToDaemonPods`), as are pods with no target node.
pub fn pods_by_node<'a>(owned: &[&'a Pod]) -> BTreeMap<String, Vec<&'a Pod>> {
    let mut by_node: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
    for pod in owned {
        if pods::is_finished(pod) && pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        if let Some(node) = target_node(pod) {
            by_node.entry(node).or_default().push(pod);
        }
    }
    by_node
}

/// Upstream `podByCreationTimestampAndPhase`: bound pods first, then oldest, then by name.
fn sort_oldest_first(pods: &mut [&Pod]) {
    pods.sort_by(|a, b| {
        pods::is_scheduled(b)
            .cmp(&pods::is_scheduled(a))
            .then_with(|| {
                let time = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
                time(a).cmp(&time(b))
            })
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
}

/// Upstream `IsPodUpdated`: the pod carries the current hash, or the current template
/// generation.
pub fn is_updated(pod: &Pod, hash: &str, generation: Option<&str>) -> bool {
    let pod_labels = pod.metadata.labels.as_ref();
    let label = |key: &str| pod_labels.and_then(|l| l.get(key)).map(String::as_str);
    let hash_matches = !hash.is_empty() && label(CONTROLLER_REVISION_HASH_LABEL) == Some(hash);
    let generation_matches = generation.is_some() && label(TEMPLATE_GENERATION_LABEL) == generation;
    hash_matches || generation_matches
}

/// What one node needs of a DaemonSet.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct NodeWork {
    /// A daemon pod must be created there.
    pub create: bool,
    /// These daemon pods must go.
    pub delete: Vec<String>,
}

/// Upstream `podsShouldBeOnNode`: create the missing pod; delete finished pods, surplus pods
/// (all but the oldest, or with surge one old and one new while the new one is not yet
/// available), and every pod on a node it may no longer run on.
pub fn pods_should_be_on_node(
    should_run: bool,
    should_continue_running: bool,
    on_node: &[&Pod],
    surge: bool,
    hash: &str,
    generation: Option<&str>,
    min_ready: i32,
) -> NodeWork {
    let mut work = NodeWork::default();
    let name = |p: &Pod| p.metadata.name.clone().unwrap_or_default();
    if should_run && on_node.is_empty() {
        work.create = true;
    } else if should_continue_running {
        let mut running: Vec<&Pod> = Vec::new();
        for pod in on_node {
            if pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            if pods::is_finished(pod) {
                work.delete.push(name(pod));
            } else {
                running.push(pod);
            }
        }
        sort_oldest_first(&mut running);
        if !surge {
            work.delete.extend(running.iter().skip(1).map(|p| name(p)));
        } else if running.is_empty() {
            work.create = should_run;
        } else if running.len() > 1 {
            let mut oldest_new: Option<&Pod> = None;
            let mut oldest_old: Option<&Pod> = None;
            for pod in &running {
                let slot = if is_updated(pod, hash, generation) {
                    &mut oldest_new
                } else {
                    &mut oldest_old
                };
                if slot.is_none() {
                    *slot = Some(pod);
                } else {
                    work.delete.push(name(pod));
                }
            }
            if let (Some(new), Some(old)) = (oldest_new, oldest_old)
                && (!pods::is_ready(old) || is_available(new, min_ready))
            {
                work.delete.push(name(old));
            }
        }
    } else if !on_node.is_empty() {
        work.delete.extend(
            on_node
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .map(|p| name(p)),
        );
    }
    work
}

fn is_rolling_update(set: &DaemonSet) -> bool {
    set.spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|u| u.type_.as_deref())
        .is_none_or(|t| t == "RollingUpdate")
}

fn rolling_params(set: &DaemonSet) -> Option<&k8s_openapi::api::apps::v1::RollingUpdateDaemonSet> {
    if !is_rolling_update(set) {
        return None;
    }
    set.spec
        .as_ref()?
        .update_strategy
        .as_ref()?
        .rolling_update
        .as_ref()
}

/// Upstream `AllowsSurge`: a rolling update with a non-zero `maxSurge`.
pub fn allows_surge(set: &DaemonSet) -> bool {
    rolling_params(set)
        .and_then(|r| r.max_surge.as_ref())
        .and_then(|s| scaled_value(s, 1, true))
        .is_some_and(|s| s > 0)
}

/// Upstream `GetScaledValueFromIntOrPercent`: an integer, or a percentage of `total` rounded
/// up or down; `None` for a malformed percentage.
pub fn scaled_value(value: &IntOrString, total: i32, round_up: bool) -> Option<i32> {
    match value {
        IntOrString::Int(i) => Some(*i),
        IntOrString::String(text) => {
            let percent: i64 = text.strip_suffix('%')?.parse().ok()?;
            let scaled = percent * i64::from(total);
            let value = if round_up {
                (scaled + 99).div_euclid(100)
            } else {
                scaled.div_euclid(100)
            };
            i32::try_from(value).ok()
        }
    }
}

/// How far a rolling update may go (upstream `updatedDesiredNodeCounts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Extra new pods allowed beside old ones.
    pub max_surge: i32,
    /// Nodes allowed without an available pod.
    pub max_unavailable: i32,
    /// Nodes that should run the pod.
    pub desired: i32,
}

impl Budget {
    /// The budget of `set` over `desired` eligible nodes; a configuration allowing neither
    /// surge nor unavailability gets one unavailable, as upstream.
    pub fn of(set: &DaemonSet, desired: i32) -> Self {
        let params = rolling_params(set);
        let scaled = |v: Option<&IntOrString>| {
            v.and_then(|v| scaled_value(v, desired, true))
                .unwrap_or(0)
                .max(0)
        };
        let max_surge = scaled(params.and_then(|r| r.max_surge.as_ref()));
        let mut max_unavailable = scaled(params.and_then(|r| r.max_unavailable.as_ref()));
        if desired > 0 && max_surge == 0 && max_unavailable == 0 {
            max_unavailable = 1;
        }
        Budget {
            max_surge,
            max_unavailable,
            desired,
        }
    }
}

/// Upstream `findUpdatedPodsOnNode`: the node's one new and one old live pod; `None` when it
/// has more than one of either (the manage step cleans that up first).
fn updated_and_old<'a>(
    on_node: &[&'a Pod],
    hash: &str,
    generation: Option<&str>,
) -> Option<(Option<&'a Pod>, Option<&'a Pod>)> {
    let (mut new, mut old) = (None, None);
    for pod in on_node {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let slot = if is_updated(pod, hash, generation) {
            &mut new
        } else {
            &mut old
        };
        if slot.is_some() {
            return None;
        }
        *slot = Some(*pod);
    }
    Some((new, old))
}

/// Upstream `rollingUpdate`: (old pods to delete, nodes to create a new pod on). Without
/// surge, old pods are deleted while fewer than `maxUnavailable` nodes lack an available pod
/// (unavailable old pods always); with surge, new pods are created beside old ones up to
/// `maxSurge` and each old pod goes once its node's new pod is available. `node_pods` holds
/// every eligible node (empty ones too) and the existing nodes with pods.
pub fn rolling_update(
    node_pods: &BTreeMap<String, Vec<&Pod>>,
    eligible: &BTreeSet<String>,
    budget: Budget,
    hash: &str,
    generation: Option<&str>,
    min_ready: i32,
) -> (Vec<String>, Vec<String>) {
    let name = |p: &Pod| p.metadata.name.clone().unwrap_or_default();
    let available = |p: &Pod| is_available(p, min_ready);
    if budget.max_surge == 0 {
        let mut unavailable = 0;
        let mut replace: Vec<String> = Vec::new();
        let mut candidates: Vec<String> = Vec::new();
        for on_node in node_pods.values() {
            let Some((new, old)) = updated_and_old(on_node, hash, generation) else {
                unavailable += 1;
                continue;
            };
            match (new, old) {
                (None, None) | (Some(_), Some(_)) => unavailable += 1,
                (Some(new), None) => {
                    if !available(new) {
                        unavailable += 1;
                    }
                }
                (None, Some(old)) => {
                    if !available(old) {
                        replace.push(name(old));
                        unavailable += 1;
                    } else if unavailable < budget.max_unavailable {
                        candidates.push(name(old));
                    }
                }
            }
        }
        let room = (budget.max_unavailable - unavailable).max(0) as usize;
        replace.extend(candidates.into_iter().take(room));
        return (replace, Vec::new());
    }

    let mut delete: Vec<String> = Vec::new();
    let mut sunset: Vec<String> = Vec::new();
    let mut candidates: Vec<String> = Vec::new();
    let mut allowed: Vec<String> = Vec::new();
    let mut surging = 0;
    let mut available_nodes = 0;
    for (node, on_node) in node_pods {
        let Some((new, old)) = updated_and_old(on_node, hash, generation) else {
            surging += 1;
            continue;
        };
        if let Some(pod) = old.or(new)
            && available(pod)
        {
            available_nodes += 1;
        }
        match (new, old) {
            (_, None) => {}
            (None, Some(old)) => {
                let runs_here = eligible.contains(node);
                if !available(old) {
                    if runs_here {
                        allowed.push(node.clone());
                    } else {
                        delete.push(name(old));
                    }
                } else if !runs_here {
                    sunset.push(name(old));
                } else if surging < budget.max_surge {
                    candidates.push(node.clone());
                }
            }
            (Some(new), Some(old)) => {
                if available(new) {
                    delete.push(name(old));
                } else {
                    surging += 1;
                }
            }
        }
    }
    // Pods on nodes the set no longer fits go only while enough others are available.
    let deletable = (available_nodes - budget.desired).max(0) as usize;
    delete.extend(sunset.into_iter().take(deletable));
    let room = (budget.max_surge - surging).max(0) as usize;
    allowed.extend(candidates.into_iter().take(room));
    (delete, allowed)
}

/// What a DaemonSet's status reports (upstream `updateDaemonSetStatus`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DaemonCounts {
    /// Nodes that should run the pod.
    pub desired: i32,
    /// Of those, nodes with a pod.
    pub current: i32,
    /// Nodes with a pod that should not run it.
    pub misscheduled: i32,
    /// Desired nodes whose oldest pod is Ready.
    pub ready: i32,
    /// ... and available.
    pub available: i32,
    /// Desired nodes whose oldest pod is up to date.
    pub updated: i32,
}

/// Counts the status over `nodes` (name, should run) and the set's pods by node.
pub fn count_daemons(
    nodes: &[(String, bool)],
    node_pods: &BTreeMap<String, Vec<&Pod>>,
    hash: &str,
    generation: Option<&str>,
    min_ready: i32,
) -> DaemonCounts {
    let mut counts = DaemonCounts::default();
    for (node, runs) in nodes {
        let mut on_node: Vec<&Pod> = node_pods.get(node).cloned().unwrap_or_default();
        if !runs {
            if !on_node.is_empty() {
                counts.misscheduled += 1;
            }
            continue;
        }
        counts.desired += 1;
        sort_oldest_first(&mut on_node);
        let Some(pod) = on_node.first() else {
            continue;
        };
        counts.current += 1;
        if pods::is_ready(pod) {
            counts.ready += 1;
            if is_available(pod, min_ready) {
                counts.available += 1;
            }
        }
        if is_updated(pod, hash, generation) {
            counts.updated += 1;
        }
    }
    counts
}

/// Upstream `cleanupHistory`: of the old revisions (oldest first), as many as exceed `limit`
/// are deleted, sparing those whose hash a pod still carries.
pub fn old_revisions_to_delete(
    old_sorted: &[ControllerRevision],
    live_hashes: &BTreeSet<String>,
    limit: i32,
) -> Vec<String> {
    let Ok(limit) = usize::try_from(limit) else {
        return Vec::new();
    };
    let to_kill = old_sorted.len().saturating_sub(limit);
    old_sorted
        .iter()
        .filter(|r| !live_hashes.contains(&revision_hash(r)))
        .take(to_kill)
        .filter_map(|r| r.metadata.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn node(name: &str, extra: Value) -> Node {
        let mut value =
            json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}});
        if let (Value::Object(base), Value::Object(extra)) = (&mut value, extra) {
            base.extend(extra);
        }
        serde_json::from_value(value).expect("test fixture")
    }

    fn template(spec: Value) -> PodTemplateSpec {
        serde_json::from_value(json!({"metadata": {"labels": {"app": "d"}}, "spec": spec}))
            .expect("test fixture")
    }

    /// A daemon pod on `node`: `state` is "ready", "pending", "terminating" or "failed".
    fn pod(name: &str, node: &str, hash: &str, state: &str, created: &str) -> Pod {
        let mut value = json!({
            "metadata": {"name": name, "labels": {CONTROLLER_REVISION_HASH_LABEL: hash},
                         "creationTimestamp": created},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": if state == "failed" { "Failed" } else { "Running" },
                       "conditions": [{"type": "Ready", "status": if state == "ready" { "True" } else { "False" }}]},
        });
        if state == "terminating" {
            value["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
        }
        serde_json::from_value(value).expect("test fixture")
    }

    const T1: &str = "2025-01-01T00:00:01Z";
    const T2: &str = "2025-01-01T00:00:02Z";

    #[test]
    fn eligibility_follows_selectors_affinity_and_taints() {
        let plain = template(json!({"containers": []}));
        let cases: Vec<(&str, Node, PodTemplateSpec, (bool, bool))> = vec![
            (
                "plain node",
                node("a", json!({})),
                plain.clone(),
                (true, true),
            ),
            (
                "selector misses",
                node("a", json!({})),
                template(json!({"nodeSelector": {"disk": "ssd"}})),
                (false, false),
            ),
            (
                "selector hits",
                node(
                    "a",
                    json!({"metadata": {"name": "a", "labels": {"disk": "ssd"}}}),
                ),
                template(json!({"nodeSelector": {"disk": "ssd"}})),
                (true, true),
            ),
            (
                "affinity on name",
                node("b", json!({})),
                template(
                    json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}]}}}}),
                ),
                (false, false),
            ),
            (
                "NoSchedule taint: may stay",
                node(
                    "a",
                    json!({"spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}),
                ),
                plain.clone(),
                (false, true),
            ),
            (
                "NoExecute taint: must go",
                node(
                    "a",
                    json!({"spec": {"taints": [{"key": "k", "effect": "NoExecute"}]}}),
                ),
                plain.clone(),
                (false, false),
            ),
            (
                "tolerated taint",
                node(
                    "a",
                    json!({"spec": {"taints": [{"key": "k", "value": "v", "effect": "NoExecute"}]}}),
                ),
                template(json!({"tolerations": [{"key": "k", "operator": "Equal", "value": "v"}]})),
                (true, true),
            ),
            (
                "cordoned and not ready: default tolerations",
                node(
                    "a",
                    json!({"spec": {"unschedulable": true, "taints": [
                    {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
                    {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},
                    {"key": "node.kubernetes.io/memory-pressure", "effect": "NoSchedule"}]}}),
                ),
                plain.clone(),
                (true, true),
            ),
            (
                "network unavailable without host network",
                node(
                    "a",
                    json!({"spec": {"taints": [
                    {"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule"}]}}),
                ),
                plain.clone(),
                (false, true),
            ),
            (
                "network unavailable with host network",
                node(
                    "a",
                    json!({"spec": {"taints": [
                    {"key": "node.kubernetes.io/network-unavailable", "effect": "NoSchedule"}]}}),
                ),
                template(json!({"hostNetwork": true})),
                (true, true),
            ),
            (
                "nodeName elsewhere",
                node("a", json!({})),
                template(json!({"nodeName": "b"})),
                (false, false),
            ),
        ];
        for (name, n, t, want) in cases {
            assert_eq!(should_run(&n, &t), want, "{name}");
        }
    }

    #[test]
    fn a_node_change_queues_the_daemonsets_it_concerns() {
        let set = |name: &str, spec: Value| -> Arc<DaemonSet> {
            Arc::new(
                serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": "kube-system"},
                    "spec": {"selector": {"matchLabels": {"app": "d"}},
                             "template": {"metadata": {"labels": {"app": "d"}}, "spec": spec}},
                }))
                .expect("test fixture"),
            )
        };
        let sets = [
            set("everywhere", json!({"containers": []})),
            set(
                "gpu",
                json!({"containers": [], "nodeSelector": {"gpu": "true"}}),
            ),
        ];
        let plain = node("n1", json!({}));
        let gpu = node(
            "n1",
            json!({"metadata": {"name": "n1", "labels": {"gpu": "true"}}}),
        );
        let tainted = node(
            "n1",
            json!({"spec": {"taints": [{"key": "dedicated", "effect": "NoExecute"}]}}),
        );
        let keys = |old: Option<&Node>, new: Option<&Node>| {
            let change = Change { old, new };
            if node_change_matters(&change) {
                sets_for_node_change(&change, &sets)
            } else {
                Vec::new()
            }
        };
        // Added: the sets that should run there.
        assert_eq!(keys(None, Some(&plain)), vec!["kube-system/everywhere"]);
        // A label the gpu set selects: only its verdict changed.
        assert_eq!(keys(Some(&plain), Some(&gpu)), vec!["kube-system/gpu"]);
        // An untolerated NoExecute taint: every set that ran there must leave.
        assert_eq!(
            keys(Some(&plain), Some(&tainted)),
            vec!["kube-system/everywhere"]
        );
        // A status heartbeat changes nothing that matters.
        let mut heartbeat = plain.clone();
        heartbeat.metadata.resource_version = Some("2".into());
        assert!(keys(Some(&plain), Some(&heartbeat)).is_empty());
        // Deleted: every set, whose pods bound there this controller deletes.
        assert_eq!(keys(Some(&gpu), None).len(), 2);
    }

    #[test]
    fn daemon_pods_are_pinned_to_their_node_with_default_tolerations() {
        let set: DaemonSet = serde_json::from_value(json!({
            "metadata": {"name": "d", "namespace": "kube-system", "uid": "u",
                         "annotations": {TEMPLATE_GENERATION_ANNOTATION: "2"}},
            "spec": {"selector": {"matchLabels": {"app": "d"}},
                     "template": {"metadata": {"labels": {"app": "d"}}, "spec": {
                        "containers": [{"name": "c", "image": "i"}],
                        "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                         "effect": "NoExecute", "tolerationSeconds": 30}],
                        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                            {"nodeSelectorTerms": [{"matchExpressions": [{"key": "x", "operator": "Exists"}]}]}}}}}},
        }))
        .expect("test fixture");
        let t = template_for(&set, "abc", template_generation(&set).as_deref());
        let p = pod_for_node(&set, &t, "node-1");
        let labels = p.metadata.labels.clone().expect("labels");
        assert_eq!(labels[CONTROLLER_REVISION_HASH_LABEL], "abc");
        assert_eq!(labels[TEMPLATE_GENERATION_LABEL], "2");
        assert_eq!(p.metadata.generate_name.as_deref(), Some("d-"));
        assert_eq!(target_node(&p).as_deref(), Some("node-1"));
        let spec = p.spec.expect("spec");
        let tolerations = spec.tolerations.expect("tolerations");
        assert_eq!(tolerations.len(), 6, "{tolerations:?}");
        // The user's not-ready toleration is replaced, losing its tolerationSeconds.
        assert!(tolerations.iter().all(|t| t.toleration_seconds.is_none()));
        let terms = spec
            .affinity
            .and_then(|a| a.node_affinity)
            .and_then(|a| a.required_during_scheduling_ignored_during_execution)
            .expect("required affinity")
            .node_selector_terms;
        assert_eq!(terms.len(), 1);
        assert_eq!(
            serde_json::to_value(&terms[0]).expect("json"),
            json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]})
        );
    }

    #[test]
    fn each_node_gets_exactly_one_pod() {
        let names = |w: NodeWork| (w.create, w.delete);
        let a = pod("a", "n", "h", "ready", T1);
        let b = pod("b", "n", "h", "ready", T2);
        let failed = pod("f", "n", "h", "failed", T1);
        let going = pod("g", "n", "h", "terminating", T1);
        type Case<'a> = (&'a str, bool, bool, Vec<&'a Pod>, (bool, Vec<&'a str>));
        let cases: Vec<Case> = vec![
            ("missing", true, true, vec![], (true, vec![])),
            ("present", true, true, vec![&a], (false, vec![])),
            (
                "two: the newer goes",
                true,
                true,
                vec![&b, &a],
                (false, vec!["b"]),
            ),
            (
                "failed goes, recreated next sync",
                true,
                true,
                vec![&failed],
                (false, vec!["f"]),
            ),
            (
                "terminating: wait",
                true,
                true,
                vec![&going],
                (false, vec![]),
            ),
            (
                "not eligible: all go",
                false,
                false,
                vec![&a, &b],
                (false, vec!["a", "b"]),
            ),
            (
                "tainted NoSchedule: stays",
                false,
                true,
                vec![&a],
                (false, vec![]),
            ),
            (
                "ineligible and empty",
                false,
                false,
                vec![],
                (false, vec![]),
            ),
        ];
        for (name, run, keep, on_node, (create, delete)) in cases {
            let got = names(pods_should_be_on_node(
                run, keep, &on_node, false, "h", None, 0,
            ));
            assert_eq!(
                got,
                (create, delete.iter().map(|s| s.to_string()).collect()),
                "{name}"
            );
        }
    }

    #[test]
    fn with_surge_the_old_pod_goes_once_the_new_one_is_available() {
        let old = pod("old", "n", "h1", "ready", T1);
        let new_ready = pod("new", "n", "h2", "ready", T2);
        let new_pending = pod("new", "n", "h2", "pending", T2);
        let work =
            |pods: Vec<&Pod>| pods_should_be_on_node(true, true, &pods, true, "h2", None, 0).delete;
        assert_eq!(work(vec![&old, &new_pending]), Vec::<String>::new());
        assert_eq!(work(vec![&old, &new_ready]), vec!["old".to_string()]);
    }

    #[test]
    fn rolling_update_stays_within_max_unavailable() {
        let old: Vec<Pod> = (0..4)
            .map(|i| pod(&format!("o{i}"), &format!("n{i}"), "h1", "ready", T1))
            .collect();
        let nodes: BTreeSet<String> = (0..4).map(|i| format!("n{i}")).collect();
        fn by_node<'a>(
            nodes: &BTreeSet<String>,
            pods: Vec<&'a Pod>,
        ) -> BTreeMap<String, Vec<&'a Pod>> {
            let mut map: BTreeMap<String, Vec<&Pod>> =
                nodes.iter().map(|n| (n.clone(), vec![])).collect();
            for p in pods {
                map.entry(target_node(p).expect("node"))
                    .or_default()
                    .push(p);
            }
            map
        }
        let budget = |max_unavailable| Budget {
            max_surge: 0,
            max_unavailable,
            desired: 4,
        };
        let all_old = by_node(&nodes, old.iter().collect());
        assert_eq!(
            rolling_update(&all_old, &nodes, budget(1), "h2", None, 0),
            (vec!["o0".into()], vec![])
        );
        assert_eq!(
            rolling_update(&all_old, &nodes, budget(2), "h2", None, 0),
            (vec!["o0".into(), "o1".into()], vec![])
        );
        // n0 has a new pod that is not ready yet: that uses the one unavailability allowed.
        let new_pending = pod("x0", "n0", "h2", "pending", T2);
        let waiting = by_node(&nodes, vec![&new_pending, &old[1], &old[2], &old[3]]);
        assert_eq!(
            rolling_update(&waiting, &nodes, budget(1), "h2", None, 0),
            (vec![], vec![])
        );
        // n0's new pod is ready: n1 is next.
        let new_ready = pod("x0", "n0", "h2", "ready", T2);
        let next = by_node(&nodes, vec![&new_ready, &old[1], &old[2], &old[3]]);
        assert_eq!(
            rolling_update(&next, &nodes, budget(1), "h2", None, 0),
            (vec!["o1".into()], vec![])
        );
        // An unavailable old pod is replaced regardless of the budget.
        let broken = pod("b1", "n1", "h1", "pending", T1);
        let mixed = by_node(&nodes, vec![&new_pending, &broken, &old[2], &old[3]]);
        assert_eq!(
            rolling_update(&mixed, &nodes, budget(1), "h2", None, 0),
            (vec!["b1".into()], vec![])
        );
    }

    #[test]
    fn rolling_update_with_surge_creates_beside_old_pods() {
        let nodes: BTreeSet<String> = ["n0".to_string(), "n1".to_string()].into();
        let (o0, o1) = (
            pod("o0", "n0", "h1", "ready", T1),
            pod("o1", "n1", "h1", "ready", T1),
        );
        let budget = Budget {
            max_surge: 1,
            max_unavailable: 0,
            desired: 2,
        };
        fn map<'a>(pairs: Vec<(&str, Vec<&'a Pod>)>) -> BTreeMap<String, Vec<&'a Pod>> {
            pairs.into_iter().map(|(n, p)| (n.to_string(), p)).collect()
        }
        let all_old = map(vec![("n0", vec![&o0]), ("n1", vec![&o1])]);
        assert_eq!(
            rolling_update(&all_old, &nodes, budget, "h2", None, 0),
            (vec![], vec!["n0".into()])
        );
        let n0_pending = pod("x0", "n0", "h2", "pending", T2);
        let surging = map(vec![("n0", vec![&o0, &n0_pending]), ("n1", vec![&o1])]);
        assert_eq!(
            rolling_update(&surging, &nodes, budget, "h2", None, 0),
            (vec![], vec![])
        );
        let n0_ready = pod("x0", "n0", "h2", "ready", T2);
        let surged = map(vec![("n0", vec![&o0, &n0_ready]), ("n1", vec![&o1])]);
        assert_eq!(
            rolling_update(&surged, &nodes, budget, "h2", None, 0),
            (vec!["o0".into()], vec!["n1".into()])
        );
    }

    #[test]
    fn budgets_scale_percentages_and_never_stall() {
        let set = |strategy: Value| -> DaemonSet {
            serde_json::from_value(json!({"metadata": {"name": "d"}, "spec": {
                "selector": {}, "template": {}, "updateStrategy": strategy}}))
            .expect("test fixture")
        };
        let b = Budget::of(
            &set(
                json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": 0}}),
            ),
            10,
        );
        assert_eq!((b.max_unavailable, b.max_surge), (3, 0));
        let b = Budget::of(
            &set(
                json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 0}}),
            ),
            10,
        );
        assert_eq!((b.max_unavailable, b.max_surge), (1, 0));
        let surge = set(
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "10%"}}),
        );
        assert!(allows_surge(&surge));
        assert_eq!(Budget::of(&surge, 10).max_surge, 1);
        assert!(!allows_surge(&set(json!({"type": "OnDelete"}))));
        assert_eq!(
            scaled_value(&IntOrString::String("50%".into()), 3, false),
            Some(1)
        );
        assert_eq!(
            scaled_value(&IntOrString::String("bad".into()), 3, false),
            None
        );
    }

    #[test]
    fn status_counts_the_oldest_pod_per_node() {
        let nodes = vec![
            ("n0".to_string(), true),
            ("n1".to_string(), true),
            ("n2".to_string(), false),
            ("n3".to_string(), true),
        ];
        let (a, b, c) = (
            pod("a", "n0", "h2", "ready", T1),
            pod("b", "n1", "h1", "pending", T1),
            pod("c", "n2", "h2", "ready", T1),
        );
        let mut by_node: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
        for p in [&a, &b, &c] {
            by_node
                .entry(target_node(p).expect("node"))
                .or_default()
                .push(p);
        }
        assert_eq!(
            count_daemons(&nodes, &by_node, "h2", None, 0),
            DaemonCounts {
                desired: 3,
                current: 2,
                misscheduled: 1,
                ready: 1,
                available: 1,
                updated: 1
            }
        );
    }

    #[test]
    fn old_history_beyond_the_limit_goes_unless_pods_use_it() {
        let revision = |name: &str, n: i64| ControllerRevision {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    [(CONTROLLER_REVISION_HASH_LABEL.to_string(), name.to_string())].into(),
                ),
                ..Default::default()
            },
            data: None,
            revision: n,
        };
        let old = vec![revision("a", 1), revision("b", 2), revision("c", 3)];
        let live: BTreeSet<String> = ["a".to_string()].into();
        assert_eq!(
            old_revisions_to_delete(&old, &live, 1),
            vec!["b".to_string(), "c".to_string()]
        );
        assert_eq!(
            old_revisions_to_delete(&old, &live, 2),
            vec!["b".to_string()]
        );
        assert!(old_revisions_to_delete(&old, &live, 3).is_empty());
    }

    #[test]
    fn template_hashes_change_with_the_template_and_collisions() {
        let a = template(json!({"containers": [{"name": "c", "image": "1"}]}));
        let b = template(json!({"containers": [{"name": "c", "image": "2"}]}));
        assert_eq!(template_hash(&a, None), template_hash(&a.clone(), None));
        assert_ne!(template_hash(&a, None), template_hash(&b, None));
        assert_ne!(template_hash(&a, None), template_hash(&a, Some(1)));
    }
}
