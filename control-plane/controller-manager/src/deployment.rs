//! The Deployment controller (upstream `pkg/controller/deployment`, a pure API client): each
//! Deployment owns ReplicaSets named `<deployment>-<pod-template-hash>`, one per pod template
//! it has had; the controller adopts and releases them by selector, rolls from the old ones to
//! the new one (RollingUpdate within maxSurge/maxUnavailable, or Recreate), scales them
//! proportionally when the Deployment is scaled mid-rollout, keeps the revision annotations
//! `kubectl rollout history|undo` read, prunes history beyond `revisionHistoryLimit`, and
//! reports status with the Progressing (progress deadline) and Available conditions.
//!
//! As the ReplicaSet controller, it is a level-triggered loop over shared caches: every pass
//! looks at every Deployment. Writes carry the cached `resourceVersion`, so a pass that runs
//! on a stale cache gets a conflict and the next pass retries; to spare those round trips, a
//! Deployment is held back until the caches show the ReplicaSet it created (expectations) and
//! the versions it wrote over are gone from them ([`UnseenWrites`]).

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet, ReplicaSetSpec, ReplicaSetStatus,
};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PostParams};
use kube::core::{Selector, SelectorExt};
use serde_json::{Value, json};

use crate::expectations::Expectations;
use crate::handlers;
use crate::informers::{Index, Informer, Informers};
use crate::pods;
use crate::workqueue::{Requeue, WorkQueue, run_workers};

const MANAGER: &str = "deployment-controller";
/// How long the controller waits for its caches to show its own writes before syncing a
/// Deployment anyway (a conflict then tells it the cache is still behind).
const UNSEEN_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

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
const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";
const DEPRECATED_ROLLBACK_TO: &str = "deprecated.deployment.rollback.to";
/// Upstream's `--deployment-controller-max-revision-history-length` default… in characters.
const MAX_REVISION_HISTORY_LENGTH_IN_CHARS: usize = 2000;
/// `progressDeadlineSeconds` meaning "no deadline".
const NO_DEADLINE: i32 = i32::MAX;

const PROGRESSING: &str = "Progressing";
const AVAILABLE: &str = "Available";
const REPLICA_FAILURE: &str = "ReplicaFailure";
const FAILED_RS_CREATE_REASON: &str = "ReplicaSetCreateError";
const NEW_RS_REASON: &str = "NewReplicaSetCreated";
const FOUND_NEW_RS_REASON: &str = "FoundNewReplicaSet";
const NEW_RS_AVAILABLE_REASON: &str = "NewReplicaSetAvailable";
const RS_UPDATED_REASON: &str = "ReplicaSetUpdated";
const TIMED_OUT_REASON: &str = "ProgressDeadlineExceeded";
const PAUSED_DEPLOY_REASON: &str = "DeploymentPaused";
const RESUMED_DEPLOY_REASON: &str = "DeploymentResumed";
const MINIMUM_REPLICAS_AVAILABLE: &str = "MinimumReplicasAvailable";
const MINIMUM_REPLICAS_UNAVAILABLE: &str = "MinimumReplicasUnavailable";

/// Deployments synced at once (upstream's `--concurrent-deployment-syncs`).
const CONCURRENT_SYNCS: usize = 5;

/// Runs the controller until the task is aborted: a change to a Deployment, to a ReplicaSet
/// it controls (or an orphan it may adopt), or a deleted pod of one of its ReplicaSets queues
/// the Deployment's key (upstream's handlers); workers sync one key at a time each.
pub async fn run(informers: Arc<Informers>) {
    let deployments = informers.get::<Deployment>();
    let sets = informers.get::<ReplicaSet>();
    let pods = informers.get::<Pod>();
    let sets_by_namespace = sets.by_namespace();
    let pods_by_owner = pods.index(pods::BY_CONTROLLER_UID, pods::controller_uid::<Pod>);
    let client = informers.client().clone();
    let queue = Arc::new(WorkQueue::new("deployment"));
    let expectations = Expectations::default();
    let unseen = Mutex::new(UnseenWrites::default());

    handlers::queue_each(&deployments, &queue);
    let on_set = queue.clone();
    let all_deployments = deployments.clone();
    sets.on_change(move |change| {
        for rs in change.objects() {
            match controller_ref(&rs.metadata) {
                Some(owner) if owner.kind == "Deployment" => {
                    let namespace = rs.metadata.namespace.as_deref().unwrap_or("");
                    on_set.add(format!("{namespace}/{}", owner.name));
                }
                Some(_) => {}
                // An orphan: every Deployment that selects it may adopt it.
                None => {
                    for d in adopters(&all_deployments, rs) {
                        on_set.add(d);
                    }
                }
            }
        }
    });
    // Recreate waits for the old pods to be gone: a deleted pod may unblock its Deployment.
    let on_pod = queue.clone();
    let owning_sets = sets.clone();
    pods.on_change(move |change| {
        let (Some(pod), None) = (change.old, change.new) else {
            return;
        };
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("");
        let owner = pods::controller_of(&pod.metadata, "ReplicaSet")
            .and_then(|owner| owning_sets.get(namespace, &owner.name))
            .and_then(|rs| pods::controller_key(&rs.metadata, "Deployment"));
        if let Some(key) = owner {
            on_pod.add(key);
        }
    });

    // With all caches filled only: an empty ReplicaSet cache would mean "create one".
    deployments.ready().await;
    sets.ready().await;
    pods.ready().await;
    let caches = Caches {
        deployments: &deployments,
        sets: &sets,
        sets_by_namespace: &sets_by_namespace,
        pods_by_owner: &pods_by_owner,
    };
    run_workers(&queue, CONCURRENT_SYNCS, |key: String| {
        sync_key(&client, caches, &expectations, &unseen, key)
    })
    .await
}

/// The keys of the Deployments in an orphan ReplicaSet's namespace whose selector matches it.
fn adopters(deployments: &Informer<Deployment>, rs: &ReplicaSet) -> Vec<String> {
    let namespace = rs.metadata.namespace.as_deref().unwrap_or("");
    let labels = rs.metadata.labels.clone().unwrap_or_default();
    deployments
        .list()
        .into_iter()
        .filter(|d| d.metadata.namespace.as_deref() == Some(namespace))
        .filter(|d| {
            d.spec
                .as_ref()
                .filter(|spec| !crate::selectors::is_empty(&spec.selector))
                .and_then(|spec| Selector::try_from(spec.selector.clone()).ok())
                .is_some_and(|selector| selector.matches(&labels))
        })
        .map(|d| pods::key(&d.metadata))
        .collect()
}

/// The caches the controller reads.
#[derive(Clone, Copy)]
struct Caches<'a> {
    deployments: &'a Informer<Deployment>,
    sets: &'a Informer<ReplicaSet>,
    sets_by_namespace: &'a Index<ReplicaSet>,
    pods_by_owner: &'a Index<Pod>,
}

/// Syncs the Deployment `key` from the caches.
async fn sync_key(
    client: &kube::Client,
    caches: Caches<'_>,
    expectations: &Expectations,
    unseen: &Mutex<UnseenWrites>,
    key: String,
) -> SyncResult<Requeue> {
    let (namespace, name) = pods::split_key(&key);
    let Some(deployment) = caches.deployments.get(namespace, name) else {
        expectations.forget(&key);
        unseen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_deployment
            .remove(&key);
        return Ok(Requeue::No);
    };
    let caught_up = expectations.satisfied(
        &key,
        |rs| caches.sets.get(namespace, rs).is_some(),
        |_| true,
    );
    if !caught_up {
        return Ok(Requeue::After(expectations.remaining(&key)));
    }
    if let Some(wait) = unseen
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .unseen_for(&key, namespace, caches)
    {
        // The ReplicaSet and Deployment events that show the writes queue it again.
        return Ok(Requeue::After(wait));
    }
    let candidates: Vec<ReplicaSet> = caches
        .sets_by_namespace
        .get(namespace)
        .iter()
        .map(|rs| (**rs).clone())
        .collect();
    let mut sync = DeploymentSync {
        client,
        expectations,
        key: key.clone(),
        d: (*deployment).clone(),
        writes: Mutex::default(),
        requeue: Requeue::No,
    };
    let outcome = sync.sync_deployment(candidates, caches.pods_by_owner).await;
    unseen.lock().unwrap_or_else(|p| p.into_inner()).record(
        &key,
        sync.writes.into_inner().unwrap_or_else(|p| p.into_inner()),
    );
    outcome.map(|()| sync.requeue)
}

/// Updates this controller made that its caches may not show yet, per Deployment.
#[derive(Default)]
struct UnseenWrites {
    by_deployment: HashMap<String, (Instant, Vec<Write>)>,
}

/// An object the controller updated and the `resourceVersion` it replaced: the cache has
/// caught up once it shows any other version (versions are opaque, never compared).
struct Write {
    kind: WrittenKind,
    name: String,
    replaced: Option<String>,
}

enum WrittenKind {
    Deployment,
    ReplicaSet,
}

impl UnseenWrites {
    fn record(&mut self, deployment: &str, writes: Vec<Write>) {
        if !writes.is_empty() {
            self.by_deployment
                .insert(deployment.to_string(), (Instant::now(), writes));
        }
    }

    /// `None` when the caches show every write made for `deployment` (or they timed out),
    /// else how long they may still hold it back.
    fn unseen_for(
        &mut self,
        deployment: &str,
        namespace: &str,
        caches: Caches<'_>,
    ) -> Option<Duration> {
        let (since, writes) = self.by_deployment.get(deployment)?;
        let version = |write: &Write| match write.kind {
            WrittenKind::Deployment => caches
                .deployments
                .get(namespace, &write.name)
                .and_then(|d| d.metadata.resource_version.clone()),
            WrittenKind::ReplicaSet => caches
                .sets
                .get(namespace, &write.name)
                .and_then(|rs| rs.metadata.resource_version.clone()),
        };
        let seen = writes.iter().all(|w| version(w) != w.replaced);
        let waited = since.elapsed();
        if seen || waited > UNSEEN_WRITE_TIMEOUT {
            self.by_deployment.remove(deployment);
            return None;
        }
        Some(UNSEEN_WRITE_TIMEOUT - waited)
    }
}

/// One Deployment's sync (upstream `syncDeployment` and what it calls). `d` is the working
/// copy: status writes replace it with what the server returned.
struct DeploymentSync<'a> {
    client: &'a kube::Client,
    expectations: &'a Expectations,
    key: String,
    d: Deployment,
    /// What this sync updated, for [`UnseenWrites`].
    writes: Mutex<Vec<Write>>,
    /// When to look at the Deployment again without an event (its progress deadline).
    requeue: Requeue,
}

type SyncResult<T> = Result<T, kube::Error>;

impl DeploymentSync<'_> {
    fn namespace(&self) -> String {
        self.d.metadata.namespace.clone().unwrap_or_default()
    }

    fn name(&self) -> String {
        self.d.metadata.name.clone().unwrap_or_default()
    }

    /// Records a successful update of the object `metadata` describes (as it was before).
    fn wrote(&self, kind: WrittenKind, metadata: &ObjectMeta) {
        self.writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Write {
                kind,
                name: metadata.name.clone().unwrap_or_default(),
                replaced: metadata.resource_version.clone(),
            });
    }

    fn replica_sets(&self) -> Api<ReplicaSet> {
        Api::namespaced(self.client.clone(), &self.namespace())
    }

    async fn sync_deployment(
        &mut self,
        candidates: Vec<ReplicaSet>,
        pods_by_owner: &Index<Pod>,
    ) -> SyncResult<()> {
        let label_selector = self
            .d
            .spec
            .as_ref()
            .map(|s| s.selector.clone())
            .unwrap_or_default();
        if crate::selectors::is_empty(&label_selector) {
            self.event(
                "Warning",
                "SelectingAll",
                "This deployment is selecting all pods. A non-empty selector is required.",
            )
            .await;
            let status = self.d.status.get_or_insert_with(Default::default);
            if self.d.metadata.generation > status.observed_generation {
                status.observed_generation = self.d.metadata.generation;
                self.update_status().await?;
            }
            return Ok(());
        }
        let Ok(selector) = Selector::try_from(label_selector) else {
            tracing::info!(deployment = %self.key, "invalid selector; not syncing");
            return Ok(());
        };
        let rs_list = self.claim_replica_sets(&selector, candidates).await?;
        if self.d.metadata.deletion_timestamp.is_some() {
            return self.sync_status_only(rs_list).await;
        }
        // Paused conditions come first so a paused deployment's Progressing condition is
        // not mistaken for a timeout.
        self.check_paused_conditions().await?;
        if is_paused(&self.d) {
            return self.sync(rs_list).await;
        }
        if self.is_scaling_event(&rs_list).await? {
            return self.sync(rs_list).await;
        }
        match strategy(&self.d) {
            Strategy::Recreate => {
                let pod_map: HashMap<String, Vec<Pod>> = rs_list
                    .iter()
                    .filter_map(|rs| rs.metadata.uid.clone())
                    .map(|uid| {
                        let owned = pods_by_owner
                            .get(&uid)
                            .iter()
                            .map(|p| (**p).clone())
                            .collect();
                        (uid, owned)
                    })
                    .collect();
                self.rollout_recreate(rs_list, &pod_map).await
            }
            Strategy::RollingUpdate { .. } => self.rollout_rolling(rs_list).await,
        }
    }

    // ------------------------------------------------------------ adoption

    /// Upstream's `ClaimReplicaSets`: the ReplicaSets this Deployment controls, adopting
    /// matching orphans and releasing owned ones that no longer match. Those controlled by
    /// anything else are left alone.
    async fn claim_replica_sets(
        &mut self,
        selector: &Selector,
        candidates: Vec<ReplicaSet>,
    ) -> SyncResult<Vec<ReplicaSet>> {
        let uid = self.d.metadata.uid.clone().unwrap_or_default();
        let deleting = self.d.metadata.deletion_timestamp.is_some();
        let mut owned = Vec::new();
        let mut may_adopt: Option<bool> = None;
        for rs in candidates {
            let labels = rs.metadata.labels.clone().unwrap_or_default();
            let matches = selector.matches(&labels);
            match controller_ref(&rs.metadata) {
                Some(owner) if owner.uid == uid => {
                    if matches {
                        owned.push(rs);
                    } else if !deleting {
                        self.release(&rs).await?;
                    }
                }
                Some(_) => {}
                None => {
                    if !matches || deleting || rs.metadata.deletion_timestamp.is_some() {
                        continue;
                    }
                    if may_adopt.is_none() {
                        may_adopt = Some(self.recheck_not_deleted().await?);
                    }
                    if may_adopt == Some(true)
                        && let Some(adopted) = self.adopt(&rs).await?
                    {
                        owned.push(adopted);
                    }
                }
            }
        }
        Ok(owned)
    }

    /// Upstream's `RecheckDeletionTimestamp`: before adopting, a live read confirms this is
    /// still the same Deployment and it is not being deleted.
    async fn recheck_not_deleted(&self) -> SyncResult<bool> {
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), &self.namespace());
        let fresh = api.get_opt(&self.name()).await?;
        Ok(fresh.is_some_and(|fresh| {
            fresh.metadata.uid == self.d.metadata.uid && fresh.metadata.deletion_timestamp.is_none()
        }))
    }

    async fn adopt(&self, rs: &ReplicaSet) -> SyncResult<Option<ReplicaSet>> {
        let owner = pods::controller_reference("apps/v1", "Deployment", &self.d.metadata);
        let patch = json!({"metadata": {
            "ownerReferences": [owner],
            "uid": rs.metadata.uid,
        }});
        let name = rs.metadata.name.clone().unwrap_or_default();
        self.wrote(WrittenKind::ReplicaSet, &rs.metadata);
        match self
            .replica_sets()
            .patch(&name, &pods::manager(MANAGER), &Patch::Strategic(&patch))
            .await
        {
            Ok(adopted) => Ok(Some(adopted)),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
            Err(err) => Err(err),
        }
    }

    async fn release(&self, rs: &ReplicaSet) -> SyncResult<()> {
        let patch = json!({"metadata": {
            "ownerReferences": [{"$patch": "delete", "uid": self.d.metadata.uid}],
            "uid": rs.metadata.uid,
        }});
        let name = rs.metadata.name.clone().unwrap_or_default();
        self.wrote(WrittenKind::ReplicaSet, &rs.metadata);
        match self
            .replica_sets()
            .patch(&name, &pods::manager(MANAGER), &Patch::Strategic(&patch))
            .await
        {
            // Gone, or no longer ours: nothing to release.
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 422 => Ok(()),
            other => other.map(|_| ()),
        }
    }

    // ------------------------------------------------------------ sync.go

    /// Upstream `syncStatusOnly`: a Deployment being deleted only reports status.
    async fn sync_status_only(&mut self, rs_list: Vec<ReplicaSet>) -> SyncResult<()> {
        let (new_rs, old) = self
            .all_replica_sets_and_sync_revision(&rs_list, false)
            .await?;
        let all = with_new(&old, new_rs.as_ref());
        self.sync_deployment_status(&all, new_rs.as_ref()).await
    }

    /// Upstream `sync`: scaling events and paused Deployments scale without rolling out.
    async fn sync(&mut self, rs_list: Vec<ReplicaSet>) -> SyncResult<()> {
        let (new_rs, old) = self
            .all_replica_sets_and_sync_revision(&rs_list, false)
            .await?;
        let (new_rs, old) = self.scale(new_rs, old).await?;
        if is_paused(&self.d) {
            self.cleanup_deployment(&old).await?;
        }
        let all = with_new(&old, new_rs.as_ref());
        self.sync_deployment_status(&all, new_rs.as_ref()).await
    }

    /// Upstream `checkPausedConditions`: Progressing=Unknown while paused and once resumed.
    async fn check_paused_conditions(&mut self) -> SyncResult<()> {
        if !has_progress_deadline(&self.d) {
            return Ok(());
        }
        let status = self.d.status.clone().unwrap_or_default();
        let current = get_condition(&status, PROGRESSING);
        if current.is_some_and(|c| c.reason.as_deref() == Some(TIMED_OUT_REASON)) {
            // A timed-out rollout stays reported as such.
            return Ok(());
        }
        let paused_reported =
            current.is_some_and(|c| c.reason.as_deref() == Some(PAUSED_DEPLOY_REASON));
        let condition = if is_paused(&self.d) && !paused_reported {
            new_condition(
                PROGRESSING,
                "Unknown",
                PAUSED_DEPLOY_REASON,
                "Deployment is paused",
            )
        } else if !is_paused(&self.d) && paused_reported {
            new_condition(
                PROGRESSING,
                "Unknown",
                RESUMED_DEPLOY_REASON,
                "Deployment is resumed",
            )
        } else {
            return Ok(());
        };
        set_condition(
            self.d.status.get_or_insert_with(Default::default),
            condition,
        );
        self.update_status().await
    }

    /// Upstream `isScalingEvent`: an active ReplicaSet was last scaled for another size.
    async fn is_scaling_event(&mut self, rs_list: &[ReplicaSet]) -> SyncResult<bool> {
        let (new_rs, old) = self
            .all_replica_sets_and_sync_revision(rs_list, false)
            .await?;
        let wanted = replicas(&self.d);
        Ok(with_new(&old, new_rs.as_ref())
            .iter()
            .filter(|rs| rs_replicas(rs) > 0)
            .filter_map(|rs| int_annotation(&rs.metadata, DESIRED_REPLICAS_ANNOTATION))
            .any(|desired| desired != wanted))
    }

    /// Upstream `getAllReplicaSetsAndSyncRevision`: the new ReplicaSet (created when asked)
    /// and all old ones, with revisions brought up to date.
    async fn all_replica_sets_and_sync_revision(
        &mut self,
        rs_list: &[ReplicaSet],
        create_if_missing: bool,
    ) -> SyncResult<(Option<ReplicaSet>, Vec<ReplicaSet>)> {
        let (_, all_old) = find_old_replica_sets(&self.d, rs_list);
        let new_rs = self
            .get_new_replica_set(rs_list, &all_old, create_if_missing)
            .await?;
        Ok((new_rs, all_old))
    }

    /// Upstream `getNewReplicaSet`.
    async fn get_new_replica_set(
        &mut self,
        rs_list: &[ReplicaSet],
        old: &[ReplicaSet],
        create_if_missing: bool,
    ) -> SyncResult<Option<ReplicaSet>> {
        let new_revision = max_revision(old) + 1;
        if let Some(existing) = find_new_replica_set(&self.d, rs_list) {
            let mut rs = existing.clone();
            let annotations_updated = set_new_replica_set_annotations(
                &self.d,
                &mut rs,
                new_revision,
                true,
                MAX_REVISION_HISTORY_LENGTH_IN_CHARS,
            );
            let min_ready = min_ready_seconds(&self.d);
            let spec = rs.spec.get_or_insert_with(Default::default);
            let min_ready_changed = spec.min_ready_seconds.unwrap_or(0) != min_ready;
            if annotations_updated || min_ready_changed {
                spec.min_ready_seconds = Some(min_ready);
                let name = rs.metadata.name.clone().unwrap_or_default();
                let updated = self
                    .replica_sets()
                    .replace(&name, &post_params(), &rs)
                    .await?;
                self.wrote(WrittenKind::ReplicaSet, &rs.metadata);
                rs = updated;
            }
            let revision = rs
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(REVISION_ANNOTATION))
                .cloned()
                .unwrap_or_default();
            let mut needs_update = set_deployment_revision(&mut self.d, &revision);
            let status = self.d.status.clone().unwrap_or_default();
            if has_progress_deadline(&self.d) && get_condition(&status, PROGRESSING).is_none() {
                let message = format!(
                    "Found new replica set {:?}",
                    rs.metadata.name.as_deref().unwrap_or("")
                );
                let condition = new_condition(PROGRESSING, "True", FOUND_NEW_RS_REASON, &message);
                set_condition(
                    self.d.status.get_or_insert_with(Default::default),
                    condition,
                );
                needs_update = true;
            }
            if needs_update {
                self.update_status().await?;
            }
            return Ok(Some(rs));
        }
        if !create_if_missing {
            return Ok(None);
        }
        let new_rs = new_replica_set(&self.d, old, new_revision);
        let rs_name = new_rs.metadata.name.clone().unwrap_or_default();
        let new_replicas = rs_replicas(&new_rs);
        let (created, already_existed) = match self
            .replica_sets()
            .create(&post_params(), &new_rs)
            .await
        {
            Ok(created) => {
                self.expectations.created(&self.key, &rs_name);
                (created, false)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let existing = self.replica_sets().get_opt(&rs_name).await?;
                let ours = existing.filter(|rs| {
                    controller_ref(&rs.metadata).map(|o| &o.uid) == self.d.metadata.uid.as_ref()
                        && equal_ignore_hash(
                            &rs.spec
                                .as_ref()
                                .and_then(|s| s.template.clone())
                                .unwrap_or_default(),
                            &template(&self.d),
                        )
                });
                match ours {
                    Some(existing) => (existing, true),
                    None => {
                        // A hash collision: another template already has this name. Bump
                        // collisionCount so the next sync computes another hash.
                        let status = self.d.status.get_or_insert_with(Default::default);
                        status.collision_count = Some(status.collision_count.unwrap_or(0) + 1);
                        self.update_status().await?;
                        tracing::info!(deployment = %self.key, "found a hash collision for deployment - bumping collisionCount");
                        // The next pass creates the ReplicaSet under the new hash.
                        return Ok(None);
                    }
                }
            }
            Err(kube::Error::Api(status))
                if status.code == 403 && status.message.contains("being terminated") =>
            {
                return Err(kube::Error::Api(status));
            }
            Err(err) => {
                let message = format!("Failed to create new replica set {rs_name:?}: {err}");
                if has_progress_deadline(&self.d) {
                    let condition =
                        new_condition(PROGRESSING, "False", FAILED_RS_CREATE_REASON, &message);
                    set_condition(
                        self.d.status.get_or_insert_with(Default::default),
                        condition,
                    );
                    // The create error is what matters; a failed status write is retried.
                    let _ = self.update_status().await;
                }
                self.event("Warning", FAILED_RS_CREATE_REASON, &message)
                    .await;
                return Err(err);
            }
        };
        if !already_existed && new_replicas > 0 {
            self.event(
                "Normal",
                "ScalingReplicaSet",
                &format!("Scaled up replica set {rs_name} from 0 to {new_replicas}"),
            )
            .await;
        }
        let mut needs_update = set_deployment_revision(&mut self.d, &new_revision.to_string());
        if !already_existed && has_progress_deadline(&self.d) {
            let message = format!("Created new replica set {rs_name:?}");
            let condition = new_condition(PROGRESSING, "True", NEW_RS_REASON, &message);
            set_condition(
                self.d.status.get_or_insert_with(Default::default),
                condition,
            );
            needs_update = true;
        }
        if needs_update {
            self.update_status().await?;
        }
        Ok(Some(created))
    }

    /// Upstream `scale`: sizes the ReplicaSets for a scaling event or a paused Deployment.
    async fn scale(
        &mut self,
        new_rs: Option<ReplicaSet>,
        mut old: Vec<ReplicaSet>,
    ) -> SyncResult<(Option<ReplicaSet>, Vec<ReplicaSet>)> {
        let wanted = replicas(&self.d);
        if let Some(target) = find_active_or_latest(new_rs.as_ref(), &old) {
            if rs_replicas(&target) != wanted {
                let (_, scaled) = self
                    .scale_replica_set_and_record_event(&target, wanted)
                    .await?;
                return Ok(replace_in(new_rs, old, scaled));
            }
            return Ok((new_rs, old));
        }
        if is_saturated(&self.d, new_rs.as_ref()) {
            for rs in old.iter_mut().filter(|rs| rs_replicas(rs) > 0) {
                let (_, scaled) = self.scale_replica_set_and_record_event(rs, 0).await?;
                *rs = scaled;
            }
            return Ok((new_rs, old));
        }
        if !matches!(strategy(&self.d), Strategy::RollingUpdate { .. }) {
            return Ok((new_rs, old));
        }
        let all = with_new(&old, new_rs.as_ref());
        let active: Vec<&ReplicaSet> = all.iter().filter(|rs| rs_replicas(rs) > 0).collect();
        let sizes = proportional_sizes(&self.d, &active);
        let (mut new_rs, mut old) = (new_rs, old);
        for (name, size) in sizes {
            let Some(rs) = all
                .iter()
                .find(|rs| rs.metadata.name.as_deref() == Some(&name))
            else {
                continue;
            };
            let (_, scaled) = self.scale_replica_set(rs, size).await?;
            (new_rs, old) = replace_in(new_rs, old, scaled);
        }
        Ok((new_rs, old))
    }

    /// Upstream `scaleReplicaSetAndRecordEvent`.
    async fn scale_replica_set_and_record_event(
        &self,
        rs: &ReplicaSet,
        new_scale: i32,
    ) -> SyncResult<(bool, ReplicaSet)> {
        if rs_replicas(rs) == new_scale {
            return Ok((false, rs.clone()));
        }
        self.scale_replica_set(rs, new_scale).await
    }

    /// Upstream `scaleReplicaSet`: sets the size and the desired/max replicas annotations.
    async fn scale_replica_set(
        &self,
        rs: &ReplicaSet,
        new_scale: i32,
    ) -> SyncResult<(bool, ReplicaSet)> {
        let old_scale = rs_replicas(rs);
        let desired = replicas(&self.d);
        let max = desired + max_surge(&self.d);
        let size_changed = old_scale != new_scale;
        if !size_changed && !replicas_annotations_need_update(rs, desired, max) {
            return Ok((false, rs.clone()));
        }
        let mut copy = rs.clone();
        copy.spec.get_or_insert_with(Default::default).replicas = Some(new_scale);
        set_replicas_annotations(&mut copy, desired, max);
        let name = rs.metadata.name.clone().unwrap_or_default();
        let updated = self
            .replica_sets()
            .replace(&name, &post_params(), &copy)
            .await?;
        self.wrote(WrittenKind::ReplicaSet, &rs.metadata);
        if size_changed {
            let operation = if old_scale < new_scale { "up" } else { "down" };
            self.event(
                "Normal",
                "ScalingReplicaSet",
                &format!("Scaled {operation} replica set {name} from {old_scale} to {new_scale}"),
            )
            .await;
        }
        Ok((size_changed, updated))
    }

    /// Upstream `cleanupDeployment`: deletes the oldest fully scaled-down ReplicaSets beyond
    /// `revisionHistoryLimit`.
    async fn cleanup_deployment(&self, old: &[ReplicaSet]) -> SyncResult<()> {
        for name in replica_sets_to_clean_up(&self.d, old) {
            tracing::debug!(deployment = %self.key, replicaset = %name, "deleting old replica set");
            pods::delete(&self.replica_sets(), &name, &Default::default()).await?;
        }
        Ok(())
    }

    /// Upstream `syncDeploymentStatus`.
    async fn sync_deployment_status(
        &mut self,
        all: &[ReplicaSet],
        new_rs: Option<&ReplicaSet>,
    ) -> SyncResult<()> {
        let status = calculate_status(all, new_rs, &self.d);
        if self.d.status.as_ref() == Some(&status) {
            return Ok(());
        }
        self.d.status = Some(status);
        self.update_status().await
    }

    // ------------------------------------------------------------ rolling.go

    /// Upstream `rolloutRolling`.
    async fn rollout_rolling(&mut self, rs_list: Vec<ReplicaSet>) -> SyncResult<()> {
        let (new_rs, old) = self
            .all_replica_sets_and_sync_revision(&rs_list, true)
            .await?;
        let Some(new_rs) = new_rs else {
            return Ok(());
        };
        let all = with_new(&old, Some(&new_rs));
        // Scale up, if we can.
        let (scaled_up, new_rs) = self.reconcile_new_replica_set(&all, new_rs).await?;
        if scaled_up {
            let all = with_new(&old, Some(&new_rs));
            return self.sync_rollout_status(&all, Some(&new_rs)).await;
        }
        // Scale down, if we can.
        let (scaled_down, old) = self.reconcile_old_replica_sets(&all, old, &new_rs).await?;
        let all = with_new(&old, Some(&new_rs));
        if scaled_down {
            return self.sync_rollout_status(&all, Some(&new_rs)).await;
        }
        let status = self.d.status.clone().unwrap_or_default();
        if deployment_complete(&self.d, &status) {
            self.cleanup_deployment(&old).await?;
        }
        self.sync_rollout_status(&all, Some(&new_rs)).await
    }

    /// Upstream `reconcileNewReplicaSet`.
    async fn reconcile_new_replica_set(
        &self,
        all: &[ReplicaSet],
        new_rs: ReplicaSet,
    ) -> SyncResult<(bool, ReplicaSet)> {
        let wanted = replicas(&self.d);
        let current = rs_replicas(&new_rs);
        if current == wanted {
            return Ok((false, new_rs));
        }
        let target = if current > wanted {
            wanted
        } else {
            new_rs_new_replicas(&self.d, all, &new_rs)
        };
        self.scale_replica_set_and_record_event(&new_rs, target)
            .await
    }

    /// Upstream `reconcileOldReplicaSets`: scales old ReplicaSets down, unhealthy replicas
    /// first, never below `replicas - maxUnavailable` available.
    async fn reconcile_old_replica_sets(
        &self,
        all: &[ReplicaSet],
        old: Vec<ReplicaSet>,
        new_rs: &ReplicaSet,
    ) -> SyncResult<(bool, Vec<ReplicaSet>)> {
        let plan = old_replica_sets_scale_down(&self.d, all, &old, new_rs);
        let mut old = old;
        let mut scaled = false;
        for (name, size) in plan {
            let Some(slot) = old
                .iter_mut()
                .find(|rs| rs.metadata.name.as_deref() == Some(&name))
            else {
                continue;
            };
            let (changed, updated) = self.scale_replica_set_and_record_event(slot, size).await?;
            scaled |= changed;
            *slot = updated;
        }
        Ok((scaled, old))
    }

    // ------------------------------------------------------------ recreate.go

    /// Upstream `rolloutRecreate`: every old pod is gone before the new ReplicaSet scales up.
    async fn rollout_recreate(
        &mut self,
        rs_list: Vec<ReplicaSet>,
        pod_map: &HashMap<String, Vec<Pod>>,
    ) -> SyncResult<()> {
        // The new ReplicaSet is not created yet, so nothing scales up before the old go.
        let (new_rs, mut old) = self
            .all_replica_sets_and_sync_revision(&rs_list, false)
            .await?;
        let mut scaled_down = false;
        for rs in old.iter_mut().filter(|rs| rs_replicas(rs) > 0) {
            let (changed, updated) = self.scale_replica_set_and_record_event(rs, 0).await?;
            scaled_down |= changed;
            *rs = updated;
        }
        if scaled_down {
            let all = with_new(&old, new_rs.as_ref());
            return self.sync_rollout_status(&all, new_rs.as_ref()).await;
        }
        if old_pods_running(new_rs.as_ref(), &old, pod_map) {
            let all = with_new(&old, new_rs.as_ref());
            return self.sync_rollout_status(&all, new_rs.as_ref()).await;
        }
        let (new_rs, old) = match new_rs {
            Some(new_rs) => (Some(new_rs), old),
            None => {
                self.all_replica_sets_and_sync_revision(&rs_list, true)
                    .await?
            }
        };
        let new_rs = match new_rs {
            Some(rs) => Some(
                self.scale_replica_set_and_record_event(&rs, replicas(&self.d))
                    .await?
                    .1,
            ),
            None => None,
        };
        let status = self.d.status.clone().unwrap_or_default();
        if deployment_complete(&self.d, &status) {
            self.cleanup_deployment(&old).await?;
        }
        let all = with_new(&old, new_rs.as_ref());
        self.sync_rollout_status(&all, new_rs.as_ref()).await
    }

    // ------------------------------------------------------------ progress.go

    /// Upstream `syncRolloutStatus`: status plus the Progressing condition.
    async fn sync_rollout_status(
        &mut self,
        all: &[ReplicaSet],
        new_rs: Option<&ReplicaSet>,
    ) -> SyncResult<()> {
        let old_status = self.d.status.clone().unwrap_or_default();
        let mut status = calculate_status(all, new_rs, &self.d);
        progress(&self.d, &old_status, &mut status, new_rs, Timestamp::now());
        match replica_failure(all, new_rs) {
            Some(condition) => set_condition(&mut status, condition),
            None => remove_condition(&mut status, REPLICA_FAILURE),
        }
        if let Some(wait) = until_stuck(&self.d, &status, Timestamp::now()) {
            self.requeue = Requeue::After(wait);
        }
        if self.d.status.as_ref() == Some(&status) {
            return Ok(());
        }
        self.d.status = Some(status);
        self.update_status().await
    }

    // ------------------------------------------------------------ writes

    /// `UpdateStatus` with the working copy (annotations ride along, as upstream's status
    /// strategy allows); the cached resourceVersion makes a stale pass fail with a conflict.
    async fn update_status(&mut self) -> SyncResult<()> {
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), &self.namespace());
        let updated = api
            .replace_status(&self.name(), &post_params(), &self.d)
            .await?;
        self.wrote(WrittenKind::Deployment, &self.d.metadata);
        self.d = updated;
        Ok(())
    }

    /// A core/v1 Event about the Deployment, as upstream's recorder writes; a failure to
    /// record is logged, never fails the sync.
    async fn event(&self, type_: &str, reason: &str, message: &str) {
        let now = Timestamp::now().to_string();
        let namespace = self.namespace();
        let event = serde_json::from_value(json!({
            "metadata": {"generateName": format!("{}.", self.name())},
            "involvedObject": {"apiVersion": "apps/v1", "kind": "Deployment",
                               "namespace": namespace, "name": self.name(),
                               "uid": self.d.metadata.uid,
                               "resourceVersion": self.d.metadata.resource_version},
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": MANAGER},
            "reportingComponent": MANAGER,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }));
        let Ok(event) = event else { return };
        let events: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(self.client.clone(), &namespace);
        if let Err(err) = events.create(&PostParams::default(), &event).await {
            tracing::debug!(deployment = %self.key, %err, "recording an event failed");
        }
    }
}

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    }
}

/// `old` followed by `new_rs` (upstream's `append(oldRSs, newRS)`).
fn with_new(old: &[ReplicaSet], new_rs: Option<&ReplicaSet>) -> Vec<ReplicaSet> {
    old.iter().cloned().chain(new_rs.cloned()).collect()
}

/// Puts `updated` where the ReplicaSet of the same name was.
fn replace_in(
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

// ---------------------------------------------------------------- deployment_util.go (pure)

/// The rollout strategy with upstream's defaults filled in where the stored object lacks them
/// (upstream's API server would have stored them).
#[derive(Debug, Clone, PartialEq)]
enum Strategy {
    Recreate,
    RollingUpdate {
        max_surge: IntOrString,
        max_unavailable: IntOrString,
    },
}

fn strategy(d: &Deployment) -> Strategy {
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

fn replicas(d: &Deployment) -> i32 {
    d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

fn rs_replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
}

fn rs_available(rs: &ReplicaSet) -> i32 {
    rs.status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0)
}

fn is_paused(d: &Deployment) -> bool {
    d.spec.as_ref().and_then(|s| s.paused).unwrap_or(false)
}

fn min_ready_seconds(d: &Deployment) -> i32 {
    d.spec
        .as_ref()
        .and_then(|s| s.min_ready_seconds)
        .unwrap_or(0)
}

fn template(d: &Deployment) -> PodTemplateSpec {
    d.spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default()
}

fn has_progress_deadline(d: &Deployment) -> bool {
    d.spec
        .as_ref()
        .and_then(|s| s.progress_deadline_seconds)
        .is_some_and(|s| s != NO_DEADLINE)
}

/// The owner reference marked `controller: true`, of any kind.
fn controller_ref(metadata: &ObjectMeta) -> Option<&OwnerReference> {
    metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

/// Upstream `GetScaledValueFromIntOrPercent`: an int as is, `N%` of `total` rounded up or
/// down; `None` for anything else (validation rejects it).
fn scaled_value(value: &IntOrString, total: i32, round_up: bool) -> Option<i32> {
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
fn resolve_fenceposts(
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
fn max_surge(d: &Deployment) -> i32 {
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
fn max_unavailable(d: &Deployment) -> i32 {
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
fn new_rs_new_replicas(d: &Deployment, all: &[ReplicaSet], new_rs: &ReplicaSet) -> i32 {
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
fn old_replica_sets_scale_down(
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

fn set_rs_replicas(rs: &mut ReplicaSet, size: i32) {
    rs.spec.get_or_insert_with(Default::default).replicas = Some(size);
}

/// Upstream's proportional part of `scale`: spreads `replicas + maxSurge - current` over the
/// active ReplicaSets in proportion to their size, leftovers to the largest. Returns each
/// ReplicaSet's new size, in the order upstream writes them.
fn proportional_sizes(d: &Deployment, active: &[&ReplicaSet]) -> Vec<(String, i32)> {
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
fn get_proportion(rs: &ReplicaSet, d: &Deployment, to_add: i32, added: i32) -> i32 {
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
fn get_replica_set_fraction(rs: &ReplicaSet, d: &Deployment) -> i32 {
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
fn is_saturated(d: &Deployment, rs: Option<&ReplicaSet>) -> bool {
    let Some(rs) = rs else { return false };
    let wanted = replicas(d);
    int_annotation(&rs.metadata, DESIRED_REPLICAS_ANNOTATION) == Some(wanted)
        && rs_replicas(rs) == wanted
        && rs_available(rs) == wanted
}

/// Upstream `FindActiveOrLatest`: the only active ReplicaSet, or the newest when none is.
fn find_active_or_latest(new_rs: Option<&ReplicaSet>, old: &[ReplicaSet]) -> Option<ReplicaSet> {
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
fn by_creation(a: &ReplicaSet, b: &ReplicaSet) -> Ordering {
    let created = |rs: &ReplicaSet| rs.metadata.creation_timestamp.clone().map(|t| t.0);
    created(a)
        .cmp(&created(b))
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

/// Upstream `FindNewReplicaSet`: the oldest ReplicaSet whose template is the Deployment's.
fn find_new_replica_set<'a>(d: &Deployment, rs_list: &'a [ReplicaSet]) -> Option<&'a ReplicaSet> {
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
fn find_old_replica_sets(
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
fn equal_ignore_hash(a: &PodTemplateSpec, b: &PodTemplateSpec) -> bool {
    comparable_template(a) == comparable_template(b)
}

/// A template as JSON without the hash label and without null or empty values, so that
/// templates equal in upstream's semantic sense (nil and empty alike) compare equal.
fn comparable_template(template: &PodTemplateSpec) -> Value {
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
fn prune_empty(value: &mut Value) -> bool {
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
fn canonical_json(value: &Value) -> String {
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
fn new_replica_set(d: &Deployment, old: &[ReplicaSet], revision: i64) -> ReplicaSet {
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
fn skip_copy_annotation(key: &str) -> bool {
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
fn set_new_replica_set_annotations(
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
fn set_replicas_annotations(rs: &mut ReplicaSet, desired: i32, max: i32) -> bool {
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
fn replicas_annotations_need_update(rs: &ReplicaSet, desired: i32, max: i32) -> bool {
    let annotations = rs.metadata.annotations.as_ref();
    let get = |key: &str| annotations.and_then(|a| a.get(key)).cloned();
    get(DESIRED_REPLICAS_ANNOTATION) != Some(desired.to_string())
        || get(MAX_REPLICAS_ANNOTATION) != Some(max.to_string())
}

fn int_annotation(metadata: &ObjectMeta, key: &str) -> Option<i32> {
    metadata.annotations.as_ref()?.get(key)?.parse().ok()
}

/// Upstream `Revision`: the revision annotation, 0 when absent or unreadable.
fn revision(rs: &ReplicaSet) -> i64 {
    rs.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REVISION_ANNOTATION))
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

/// Upstream `MaxRevision`.
fn max_revision(rs_list: &[ReplicaSet]) -> i64 {
    rs_list.iter().map(revision).max().unwrap_or(0)
}

/// Upstream `SetDeploymentRevision`.
fn set_deployment_revision(d: &mut Deployment, revision: &str) -> bool {
    let annotations = d.metadata.annotations.get_or_insert_with(Default::default);
    if annotations.get(REVISION_ANNOTATION).map(String::as_str) == Some(revision) {
        return false;
    }
    annotations.insert(REVISION_ANNOTATION.into(), revision.into());
    true
}

/// Upstream `cleanupDeployment`'s choice: the oldest revisions beyond the limit that are
/// scaled to zero, observed so, and not being deleted.
fn replica_sets_to_clean_up(d: &Deployment, old: &[ReplicaSet]) -> Vec<String> {
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
fn old_pods_running(
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
fn calculate_status(
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
fn status_sum<'a>(
    sets: impl IntoIterator<Item = &'a ReplicaSet>,
    field: fn(&ReplicaSetStatus) -> i32,
) -> i32 {
    sets.into_iter()
        .filter_map(|rs| rs.status.as_ref())
        .map(field)
        .sum()
}

fn nonzero(count: i32) -> Option<i32> {
    (count != 0).then_some(count)
}

fn count(value: Option<i32>) -> i32 {
    value.unwrap_or(0)
}

/// The Progressing condition part of upstream `syncRolloutStatus`, at time `now`.
fn progress(
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
fn until_stuck(d: &Deployment, status: &DeploymentStatus, now: Timestamp) -> Option<Duration> {
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
fn deployment_complete(d: &Deployment, status: &DeploymentStatus) -> bool {
    let wanted = replicas(d);
    count(status.updated_replicas) == wanted
        && count(status.replicas) == wanted
        && count(status.available_replicas) == wanted
        && status.observed_generation >= d.metadata.generation
}

/// Upstream `DeploymentProgressing`: more updated, ready or available replicas, or fewer old.
fn deployment_progressing(old: &DeploymentStatus, new: &DeploymentStatus) -> bool {
    let old_old = count(old.replicas) - count(old.updated_replicas);
    let new_old = count(new.replicas) - count(new.updated_replicas);
    count(new.updated_replicas) > count(old.updated_replicas)
        || new_old < old_old
        || count(new.ready_replicas) > count(old.ready_replicas)
        || count(new.available_replicas) > count(old.available_replicas)
}

/// Upstream `DeploymentTimedOut`: no progress for `progressDeadlineSeconds` since the
/// Progressing condition was last updated.
fn deployment_timed_out(d: &Deployment, status: &DeploymentStatus, now: Timestamp) -> bool {
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
fn replica_failure(all: &[ReplicaSet], new_rs: Option<&ReplicaSet>) -> Option<DeploymentCondition> {
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
fn new_condition(type_: &str, status: &str, reason: &str, message: &str) -> DeploymentCondition {
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

fn get_condition<'a>(status: &'a DeploymentStatus, type_: &str) -> Option<&'a DeploymentCondition> {
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_)
}

/// Upstream `SetDeploymentCondition`: no change for the same status and reason; the
/// transition time kept while the status is unchanged; the condition moves to the end.
fn set_condition(status: &mut DeploymentStatus, mut condition: DeploymentCondition) {
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

fn remove_condition(status: &mut DeploymentStatus, type_: &str) {
    if let Some(conditions) = &mut status.conditions {
        conditions.retain(|c| c.type_ != type_);
    }
}

#[cfg(test)]
mod tests {
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
