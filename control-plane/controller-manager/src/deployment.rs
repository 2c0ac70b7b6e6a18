//! The Deployment controller (upstream `pkg/controller/deployment`, a pure API client): each
//! Deployment owns ReplicaSets named `<deployment>-<pod-template-hash>`, one per pod template
//! it has had; the controller adopts and releases them by selector, rolls from the old ones to
//! the new one (RollingUpdate within maxSurge/maxUnavailable, or Recreate), scales them
//! proportionally when the Deployment is scaled mid-rollout, keeps the revision annotations
//! `kubectl rollout history|undo` read, prunes history beyond `revisionHistoryLimit`, and
//! reports status with the Progressing (progress deadline) and Available conditions.
//!
//! As the ReplicaSet controller, it syncs one Deployment at a time from a work queue fed by
//! the watches of Deployments, ReplicaSets and pods. Writes carry the cached
//! `resourceVersion`, so a sync on a stale cache gets a conflict and is retried with back-off;
//! to spare those round trips, a Deployment is held back until the caches show the ReplicaSet
//! it created (expectations) and the versions it wrote over are gone from them
//! ([`UnseenWrites`]). The arithmetic and bookkeeping of upstream's `deployment/util` are in
//! [`util`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PostParams};
use kube::core::{Selector, SelectorExt};
use serde_json::json;

use crate::expectations::Expectations;
use crate::handlers;
use crate::informers::{Index, Informer, Informers};
use crate::pods;
use crate::workqueue::{Requeue, WorkQueue, run_workers};

mod util;

use util::*;
pub use util::{
    DEFAULT_DEPLOYMENT_UNIQUE_LABEL_KEY, DESIRED_REPLICAS_ANNOTATION, MAX_REPLICAS_ANNOTATION,
    REVISION_ANNOTATION, REVISION_HISTORY_ANNOTATION, compute_hash,
};

const MANAGER: &str = "deployment-controller";
/// How long the controller waits for its caches to show its own writes before syncing a
/// Deployment anyway (a conflict then tells it the cache is still behind).
const UNSEEN_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

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

    /// A core/v1 Event about the Deployment ([`crate::events::create`]).
    async fn event(&self, type_: &str, reason: &str, message: &str) {
        let object = crate::events::EventRef {
            api_version: "apps/v1",
            kind: "Deployment",
            metadata: &self.d.metadata,
        };
        crate::events::create(self.client, MANAGER, object, type_, reason, message).await;
    }
}

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    }
}
