//! The garbage collector (upstream `garbagecollector`, a pure API client): deletes objects
//! whose owners are all gone (background propagation), deletes the dependents of an owner
//! being deleted in the foreground and then removes its `foregroundDeletion` finalizer once no
//! blocking dependent is left, and strips the references to an owner being deleted with
//! `orphan` before removing that finalizer.
//!
//! As upstream's, it keeps a dependency graph ([`Graph`]: objects by uid, and the dependents
//! of each owner uid, present or not) fed by the watches of the kinds listed in [`sources`]
//! and of every custom resource kind; an owner of a kind it does not watch is never judged
//! absent. A change queues the uids it concerns (upstream's attemptToDelete queue): the
//! object when its owners or deletion changed, its dependents when it went or started a
//! foreground or orphan deletion, and its owners being deleted when it stopped depending on
//! them. A worker decides for one uid from the graph; owners the graph lacks are confirmed
//! gone with a live read before anything is deleted or stripped.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::{
    ControllerRevision, DaemonSet, Deployment, ReplicaSet, StatefulSet,
};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use serde_json::json;

use crate::informers::Informers;
use crate::pods;
use crate::workqueue::{Requeue, WorkQueue, run_workers};

/// How long a delete this collector asked for is not asked for again while the cache catches up.
const DELETE_PATIENCE: Duration = Duration::from_secs(10);
/// Objects attempted at once (upstream's `--concurrent-gc-syncs`).
const CONCURRENT_SYNCS: usize = 20;
const MANAGER: &str = "generic-garbage-collector";
const ORPHAN: &str = "orphan";
const FOREGROUND: &str = "foregroundDeletion";
/// How long a custom kind's first list may take before the collector goes on without it.
const LIST_PATIENCE: Duration = Duration::from_secs(30);

/// A kind the collector watches, by its place in [`Graph::kinds`] (a place is never reused
/// for another kind, so the graph's targets stay valid while custom kinds come and go).
#[derive(Clone, Debug)]
struct KindEntry {
    resource: ApiResource,
    namespaced: bool,
    /// Watched now (a custom kind whose definition went is not).
    active: bool,
    /// Its watch has listed every object once: before that an absent owner of the kind is
    /// not judged, nor a finalizer removed (a dependent may not be known yet).
    ready: bool,
}

/// The collector's dependency graph.
#[derive(Default)]
struct Graph {
    kinds: Vec<KindEntry>,
    /// Objects by uid.
    nodes: HashMap<String, Seen>,
    /// The uids of the objects referring to each owner uid, whether the owner is known or not
    /// (upstream's virtual nodes).
    dependents: HashMap<String, HashSet<String>>,
}

impl Graph {
    /// Records the object `meta` of kind `source`; returns the uids to attempt.
    fn upsert(&mut self, source: usize, meta: &ObjectMeta) -> Vec<String> {
        let Some(uid) = meta.uid.clone().filter(|u| !u.is_empty()) else {
            return Vec::new();
        };
        let seen = Seen {
            target: Target {
                source,
                namespace: meta.namespace.clone().unwrap_or_default(),
                name: meta.name.clone().unwrap_or_default(),
                uid: uid.clone(),
            },
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            deleting: meta.deletion_timestamp.is_some(),
            finalizers: meta.finalizers.clone().unwrap_or_default(),
            owners: meta.owner_references.clone().unwrap_or_default(),
        };
        self.insert(seen)
    }

    fn insert(&mut self, seen: Seen) -> Vec<String> {
        let uid = seen.target.uid.clone();
        let mut attempt = Vec::new();
        let old = self.nodes.remove(&uid);
        let owners_changed = old.as_ref().is_none_or(|o| o.owners != seen.owners);
        let deletion_changed = old
            .as_ref()
            .is_none_or(|o| o.deleting != seen.deleting || o.finalizers != seen.finalizers);
        if owners_changed {
            let before: Vec<OwnerReference> = old.iter().flat_map(|o| o.owners.clone()).collect();
            for owner in &before {
                self.unlink(&owner.uid, &uid);
            }
            for owner in &seen.owners {
                self.dependents
                    .entry(owner.uid.clone())
                    .or_default()
                    .insert(uid.clone());
            }
            // Owners being deleted count their (blocking) dependents again.
            attempt.extend(
                before
                    .iter()
                    .chain(&seen.owners)
                    .filter(|o| self.nodes.get(&o.uid).is_some_and(|n| n.deleting))
                    .map(|o| o.uid.clone()),
            );
        }
        let waits = seen.deleting
            && seen
                .finalizers
                .iter()
                .any(|f| f == ORPHAN || f == FOREGROUND);
        if (!seen.owners.is_empty() && (owners_changed || deletion_changed))
            || (waits && deletion_changed)
        {
            attempt.push(uid.clone());
        }
        if deletion_changed {
            // New, or starting a deletion its dependents follow (foreground) or outlive
            // (orphan).
            attempt.extend(self.dependents.get(&uid).into_iter().flatten().cloned());
        }
        self.nodes.insert(uid, seen);
        attempt
    }

    /// Forgets the object `uid`; returns the uids to attempt: its dependents (an owner is
    /// gone) and its owners being deleted (a dependent is gone).
    fn remove(&mut self, uid: &str) -> Vec<String> {
        let Some(old) = self.nodes.remove(uid) else {
            return Vec::new();
        };
        let mut attempt: Vec<String> = Vec::new();
        for owner in &old.owners {
            self.unlink(&owner.uid, uid);
            if self.nodes.get(&owner.uid).is_some_and(|n| n.deleting) {
                attempt.push(owner.uid.clone());
            }
        }
        attempt.extend(self.dependents.get(uid).into_iter().flatten().cloned());
        attempt
    }

    fn unlink(&mut self, owner: &str, dependent: &str) {
        if let Some(set) = self.dependents.get_mut(owner) {
            set.remove(dependent);
            if set.is_empty() {
                self.dependents.remove(owner);
            }
        }
    }

    /// The uids of the objects of kind `source`.
    fn uids_of(&self, source: usize) -> Vec<String> {
        self.nodes
            .values()
            .filter(|n| n.target.source == source)
            .map(|n| n.target.uid.clone())
            .collect()
    }

    /// The place of the kind `owner` names, if it is watched and its watch has listed.
    fn watched(&self, owner: &OwnerReference) -> Option<usize> {
        self.kinds.iter().position(|k| {
            k.active
                && k.ready
                && k.resource.group == group_of(&owner.api_version)
                && k.resource.kind == owner.kind
        })
    }

    /// The owner `owner` of `dependent`, if the graph holds it (of the named kind, and in the
    /// dependent's namespace when that kind is namespaced).
    fn owner(&self, dependent: &Seen, owner: &OwnerReference, kind: usize) -> Option<&Seen> {
        self.nodes.get(&owner.uid).filter(|o| {
            o.target.source == kind
                && (!self.kinds[kind].namespaced
                    || o.target.namespace == dependent.target.namespace)
        })
    }

    /// What to do about the object `uid`, from the graph alone (pure, so the rules are
    /// unit-tested); `requested` holds the deletes asked for a moment ago.
    fn attempt(&self, uid: &str, requested: &HashMap<String, Instant>) -> Plan {
        let mut plan = Plan::default();
        let Some(object) = self.nodes.get(uid) else {
            return plan;
        };
        if !object.owners.is_empty() && !object.deleting {
            self.judge_dependent(object, requested, &mut plan);
        }
        if object.deleting && self.kinds.iter().all(|k| !k.active || k.ready) {
            self.judge_owner(object, &mut plan);
        }
        plan
    }

    /// Upstream's attemptToDeleteItem for one dependent, by the state of its owners.
    fn judge_dependent(
        &self,
        object: &Seen,
        requested: &HashMap<String, Instant>,
        plan: &mut Plan,
    ) {
        let mut alive = Vec::new();
        let mut absent = Vec::new();
        let mut waiting = false;
        let mut orphaning = false;
        let mut unknown = false;
        for owner in &object.owners {
            let Some(kind) = self.watched(owner) else {
                unknown = true;
                alive.push(owner.clone());
                continue;
            };
            match self.owner(object, owner, kind) {
                None => absent.push(owner.clone()),
                Some(o) => {
                    if o.deleting && o.finalizers.iter().any(|f| f == ORPHAN) {
                        orphaning = true;
                    } else {
                        if o.deleting && o.finalizers.iter().any(|f| f == FOREGROUND) {
                            waiting = true;
                        }
                        alive.push(owner.clone());
                    }
                }
            }
        }
        let owns_something = self
            .dependents
            .get(&object.target.uid)
            .is_some_and(|d| !d.is_empty());
        let delete = Delete {
            target: object.target.clone(),
            uid: object.target.uid.clone(),
            foreground: waiting && owns_something,
        };
        let only_waiting = !unknown
            && alive.iter().all(|owner| {
                self.nodes
                    .get(&owner.uid)
                    .is_some_and(|o| o.deleting && o.finalizers.iter().any(|f| f == FOREGROUND))
            });
        if orphaning {
            // Drop the references to owners being orphaned from (absent ones stay for the
            // background rule to judge once these are gone).
            let mut keep = alive.clone();
            keep.extend(absent.iter().cloned());
            plan.owner_updates.push((
                object.target.clone(),
                object.resource_version.clone(),
                keep,
                Vec::new(),
            ));
        } else if !alive.is_empty() && only_waiting {
            if !requested.contains_key(&object.target.uid) {
                plan.deletes.push(delete);
            }
        } else if alive.is_empty() && !absent.is_empty() {
            if !requested.contains_key(&object.target.uid) {
                plan.suspected.push((delete, absent));
            }
        } else if !absent.is_empty() {
            // Some owners live on: only the dangling references go, once a live read
            // confirms their owners are gone (upstream's isDangling).
            plan.owner_updates.push((
                object.target.clone(),
                object.resource_version.clone(),
                alive,
                absent,
            ));
        }
    }

    /// The finalizers of an owner being deleted that are done: `orphan` once no dependent
    /// refers to it, `foregroundDeletion` once no blocking one does.
    fn judge_owner(&self, owner: &Seen, plan: &mut Plan) {
        let (mut all, mut blocking) = (0, 0);
        for dependent in self
            .dependents
            .get(&owner.target.uid)
            .into_iter()
            .flatten()
            .filter_map(|uid| self.nodes.get(uid))
        {
            for reference in dependent
                .owners
                .iter()
                .filter(|o| o.uid == owner.target.uid)
            {
                let found = self
                    .watched(reference)
                    .and_then(|kind| self.owner(dependent, reference, kind))
                    .is_some();
                if found {
                    all += 1;
                    if reference.block_owner_deletion == Some(true) {
                        blocking += 1;
                    }
                }
            }
        }
        let mut finalizers = owner.finalizers.clone();
        if all == 0 {
            finalizers.retain(|f| f != ORPHAN);
        }
        if blocking == 0 {
            finalizers.retain(|f| f != FOREGROUND);
        }
        if finalizers != owner.finalizers {
            plan.finalized.push((
                owner.target.clone(),
                owner.resource_version.clone(),
                finalizers,
            ));
        }
    }
}

/// The collector's shared state: the graph, its queue, and the deletes it asked for.
struct Collector {
    client: kube::Client,
    graph: Mutex<Graph>,
    queue: WorkQueue<String>,
    requested: Mutex<HashMap<String, Instant>>,
}

impl Collector {
    fn graph(&self) -> std::sync::MutexGuard<'_, Graph> {
        self.graph.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn enqueue(&self, uids: Vec<String>) {
        for uid in uids {
            self.queue.add(uid);
        }
    }

    /// A watched kind's place, reusing the one it had if it was watched before.
    fn add_kind(&self, resource: ApiResource, namespaced: bool, ready: bool) -> usize {
        let mut graph = self.graph();
        let existing = graph
            .kinds
            .iter()
            .position(|k| k.resource == resource && k.namespaced == namespaced);
        let entry = KindEntry {
            resource,
            namespaced,
            active: true,
            ready,
        };
        match existing {
            Some(place) => {
                graph.kinds[place] = entry;
                place
            }
            None => {
                graph.kinds.push(entry);
                graph.kinds.len() - 1
            }
        }
    }

    /// Upstream's attemptToDeleteItem (and attemptToOrphan, and the finalizer removals) for
    /// the object `uid`.
    async fn attempt_to_delete(&self, uid: String) -> Result<Requeue, kube::Error> {
        let (plan, wait) = {
            let mut requested = self.requested.lock().unwrap_or_else(|p| p.into_inner());
            requested.retain(|_, at| at.elapsed() < DELETE_PATIENCE);
            let graph = self.graph();
            if !graph.nodes.contains_key(&uid) {
                requested.remove(&uid);
                return Ok(Requeue::No);
            }
            // A delete asked for a moment ago: looked at again when the patience runs out,
            // should no event have come by then.
            let wait = requested
                .get(&uid)
                .map(|at| DELETE_PATIENCE.saturating_sub(at.elapsed()));
            (graph.attempt(&uid, &requested), wait)
        };
        let asked = self.apply(plan).await?;
        if asked {
            self.requested
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(uid, Instant::now());
            return Ok(Requeue::After(DELETE_PATIENCE));
        }
        Ok(wait.map_or(Requeue::No, Requeue::After))
    }

    fn api(&self, target: &Target) -> Option<Api<DynamicObject>> {
        let graph = self.graph();
        let kind = graph.kinds.get(target.source)?;
        Some(if kind.namespaced {
            Api::namespaced_with(self.client.clone(), &target.namespace, &kind.resource)
        } else {
            Api::all_with(self.client.clone(), &kind.resource)
        })
    }

    /// Whether the owner really is gone: a live read, since the cache may lag behind a create.
    async fn confirmed_absent(
        &self,
        dependent: &Target,
        owner: &OwnerReference,
    ) -> Result<bool, kube::Error> {
        let Some(source) = self.graph().watched(owner) else {
            return Ok(false);
        };
        let target = Target {
            source,
            namespace: dependent.namespace.clone(),
            name: owner.name.clone(),
            uid: owner.uid.clone(),
        };
        let Some(api) = self.api(&target) else {
            return Ok(false);
        };
        Ok(match api.get_metadata_opt(&owner.name).await? {
            None => true,
            Some(found) => found.metadata.uid.as_deref() != Some(owner.uid.as_str()),
        })
    }

    /// Carries out one object's plan; returns whether a delete was asked for.
    async fn apply(&self, plan: Plan) -> Result<bool, kube::Error> {
        let mut asked = false;
        'suspected: for (delete, owners) in plan.suspected {
            for owner in &owners {
                if !self.confirmed_absent(&delete.target, owner).await? {
                    continue 'suspected;
                }
            }
            self.delete_object(&delete).await?;
            asked = true;
        }
        for delete in plan.deletes {
            self.delete_object(&delete).await?;
            asked = true;
        }
        for (target, version, mut owners, dangling) in plan.owner_updates {
            let suspected = !dangling.is_empty();
            let mut stripped = false;
            for owner in dangling {
                if self.confirmed_absent(&target, &owner).await? {
                    stripped = true;
                } else {
                    owners.push(owner);
                }
            }
            if suspected && !stripped {
                // Every owner missing from the graph exists after all (the graph lags).
                continue;
            }
            // An emptied list is removed (null), as upstream's omitempty encoding leaves it.
            let owners = if owners.is_empty() {
                json!(null)
            } else {
                json!(owners)
            };
            let patch = json!({"metadata": {
                "ownerReferences": owners, "resourceVersion": version, "uid": target.uid}});
            self.patch_metadata(&target, patch).await?;
        }
        for (target, version, finalizers) in plan.finalized {
            let finalizers = if finalizers.is_empty() {
                json!(null)
            } else {
                json!(finalizers)
            };
            let patch = json!({"metadata": {
                "finalizers": finalizers, "resourceVersion": version, "uid": target.uid}});
            self.patch_metadata(&target, patch).await?;
        }
        Ok(asked)
    }

    /// A merge patch of `target`'s metadata, refused by the server if the object changed
    /// since the graph saw it (the retry decides again).
    async fn patch_metadata(
        &self,
        target: &Target,
        patch: serde_json::Value,
    ) -> Result<(), kube::Error> {
        let Some(api) = self.api(target) else {
            return Ok(());
        };
        match api
            .patch(&target.name, &pods::manager(MANAGER), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(err) => Err(err),
        }
    }

    async fn delete_object(&self, delete: &Delete) -> Result<(), kube::Error> {
        let mut params = if delete.foreground {
            DeleteParams::foreground()
        } else {
            DeleteParams::background()
        };
        // Only the object the collector judged: a new one under the same name is left alone.
        params.preconditions = Some(kube::api::Preconditions {
            uid: Some(delete.uid.clone()),
            resource_version: None,
        });
        let Some(api) = self.api(&delete.target) else {
            return Ok(());
        };
        match api.delete(&delete.target.name, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
            Err(err) => Err(err),
        }
    }
}

/// Feeds the graph from the cache of the built-in kind `K`; returns a future that waits
/// for the cache to fill.
fn watch_typed<K>(
    informers: &Informers,
    collector: &Arc<Collector>,
    namespaced: bool,
) -> BoxFuture<'static, ()>
where
    K: crate::informers::Cacheable,
{
    let informer = informers.get::<K>();
    let source = collector.add_kind(ApiResource::erase::<K>(&()), namespaced, true);
    let feed = collector.clone();
    informer.on_change(move |change| {
        let mut attempt = Vec::new();
        {
            let mut graph = feed.graph();
            if let Some(old) = change.old {
                let replaced = change
                    .new
                    .is_none_or(|new| new.meta().uid != old.meta().uid);
                if replaced {
                    attempt.extend(graph.remove(old.meta().uid.as_deref().unwrap_or("")));
                }
            }
            if let Some(new) = change.new {
                attempt.extend(graph.upsert(source, new.meta()));
            }
        }
        feed.enqueue(attempt);
    });
    async move { informer.ready().await }.boxed()
}

/// The kinds the collector watches through the shared caches: those upstream's controllers
/// own or are owned by. Custom resource kinds are watched too ([`watch_custom`]). ConfigMaps
/// and Secrets are not (their full caches would cost every cluster memory); references to
/// and from them are left alone.
fn sources(informers: &Informers, collector: &Arc<Collector>) -> Vec<BoxFuture<'static, ()>> {
    vec![
        watch_typed::<Pod>(informers, collector, true),
        watch_typed::<ReplicaSet>(informers, collector, true),
        watch_typed::<Deployment>(informers, collector, true),
        watch_typed::<StatefulSet>(informers, collector, true),
        watch_typed::<DaemonSet>(informers, collector, true),
        watch_typed::<ControllerRevision>(informers, collector, true),
        watch_typed::<Job>(informers, collector, true),
        watch_typed::<CronJob>(informers, collector, true),
        watch_typed::<Service>(informers, collector, true),
        watch_typed::<EndpointSlice>(informers, collector, true),
        watch_typed::<PersistentVolumeClaim>(informers, collector, true),
    ]
}

/// Runs the collector until the task is aborted.
pub async fn run(informers: Arc<Informers>) {
    let collector = Arc::new(Collector {
        client: informers.client().clone(),
        graph: Mutex::default(),
        queue: WorkQueue::new("garbage_collector_attempt_to_delete"),
        requested: Mutex::default(),
    });
    let filled = sources(&informers, &collector);
    // Workers start once the built-in kinds are known: an owner missing from a cache still
    // filling would look deleted.
    futures::future::join_all(filled).await;
    let workers = run_workers(&collector.queue, CONCURRENT_SYNCS, |uid: String| {
        let collector = collector.clone();
        async move { collector.attempt_to_delete(uid).await }
    });
    futures::future::join(follow_definitions(&collector), workers).await;
}

/// The watch of one custom resource kind's objects, by their metadata only (upstream's
/// collector watches every deletable kind the same way): a cluster pays for the kinds its
/// definitions add, and for their metadata alone. Dropping it stops the watch.
struct CustomWatch(tokio::task::JoinHandle<()>);

impl Drop for CustomWatch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Feeds the graph from the objects of the custom kind at `source`.
fn watch_custom(collector: &Arc<Collector>, source: usize, resource: &ApiResource) -> CustomWatch {
    // An `Api` of `PartialObjectMeta` lists and watches metadata only.
    let api: Api<PartialObjectMeta<DynamicObject>> =
        Api::all_with(collector.client.clone(), resource);
    let events = watcher(api, watcher::Config::default()).default_backoff();
    let collector = collector.clone();
    CustomWatch(tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        let mut relisted: HashSet<String> = HashSet::new();
        // A kind that cannot be listed must not hold every finalizer in the cluster: after
        // a while it is taken as known (upstream's collector goes on without a monitor that
        // does not sync); an owner of it is then confirmed by a live read as before.
        let patience = tokio::time::sleep(LIST_PATIENCE);
        let mut patience = std::pin::pin!(patience);
        let mut waited = false;
        loop {
            let event = tokio::select! {
                event = events.next() => event,
                () = &mut patience, if !waited => {
                    waited = true;
                    let attempt = mark_listed(&mut collector.graph(), source);
                    collector.enqueue(attempt);
                    continue;
                }
            };
            let Some(event) = event else {
                break;
            };
            let Ok(event) = event else {
                continue;
            };
            let mut attempt = Vec::new();
            {
                let mut graph = collector.graph();
                match event {
                    watcher::Event::Apply(object) => {
                        attempt = graph.upsert(source, &object.metadata);
                    }
                    watcher::Event::Delete(object) => {
                        attempt = graph.remove(object.metadata.uid.as_deref().unwrap_or(""));
                    }
                    watcher::Event::Init => relisted.clear(),
                    watcher::Event::InitApply(object) => {
                        relisted.extend(object.metadata.uid.clone());
                        attempt = graph.upsert(source, &object.metadata);
                    }
                    watcher::Event::InitDone => {
                        for uid in graph.uids_of(source) {
                            if !relisted.contains(&uid) {
                                attempt.extend(graph.remove(&uid));
                            }
                        }
                        relisted.clear();
                        attempt.extend(mark_listed(&mut graph, source));
                    }
                }
            }
            collector.enqueue(attempt);
        }
    }))
}

/// Marks the kind at `source` listed; the first time, returns what waited for it: owners
/// being deleted (their dependents may be of it) and dependents referring to it.
fn mark_listed(graph: &mut Graph, source: usize) -> Vec<String> {
    match graph.kinds.get_mut(source) {
        Some(kind) if !kind.ready => kind.ready = true,
        _ => return Vec::new(),
    }
    waiting_on_kind(graph, source)
}

/// The objects whose judgement waited for the kind at `source` to be listed: owners being
/// deleted, and objects with an owner of that kind.
fn waiting_on_kind(graph: &Graph, source: usize) -> Vec<String> {
    let Some(kind) = graph.kinds.get(source) else {
        return Vec::new();
    };
    graph
        .nodes
        .values()
        .filter(|n| {
            n.deleting
                || n.owners.iter().any(|o| {
                    o.kind == kind.resource.kind && group_of(&o.api_version) == kind.resource.group
                })
        })
        .map(|n| n.target.uid.clone())
        .collect()
}

/// Follows the custom resource kinds the cluster serves: the definitions' metadata are
/// watched, and each change (a definition added, established, changed or removed) is
/// followed by one read of the definitions, so the kinds watched follow them within moments
/// and an idle cluster costs nothing (upstream polls discovery every 30 s instead). Changes
/// arriving while the definitions are read are coalesced into one more read.
async fn follow_definitions(collector: &Arc<Collector>) {
    let (signal, mut changed) = tokio::sync::watch::channel(0u64);
    let api: Api<PartialObjectMeta<CustomResourceDefinition>> = Api::all(collector.client.clone());
    let definitions = watcher(api, watcher::Config::default()).default_backoff();
    let watch = async move {
        let mut definitions = std::pin::pin!(definitions);
        while let Some(event) = definitions.next().await {
            if event.is_ok() {
                signal.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    };
    let follow = async {
        let mut watched: HashMap<usize, CustomWatch> = HashMap::new();
        let mut current: Vec<(ApiResource, bool)> = Vec::new();
        while changed.changed().await.is_ok() {
            changed.borrow_and_update();
            let kinds = loop {
                match custom_kinds(&collector.client).await {
                    Some(kinds) => break kinds,
                    None => tokio::time::sleep(Duration::from_secs(1)).await,
                }
            };
            if kinds == current {
                continue;
            }
            // Kinds no longer served: their watches stop and their objects leave the graph.
            let gone: Vec<usize> = {
                let graph = collector.graph();
                watched
                    .keys()
                    .copied()
                    .filter(|place| {
                        let kind = &graph.kinds[*place];
                        !kinds
                            .iter()
                            .any(|(r, n)| *r == kind.resource && *n == kind.namespaced)
                    })
                    .collect()
            };
            for place in gone {
                watched.remove(&place);
                let mut graph = collector.graph();
                graph.kinds[place].active = false;
                graph.kinds[place].ready = false;
                let mut attempt = Vec::new();
                for uid in graph.uids_of(place) {
                    attempt.extend(graph.remove(&uid));
                }
                drop(graph);
                collector.enqueue(attempt);
            }
            for (resource, namespaced) in &kinds {
                if current.contains(&(resource.clone(), *namespaced)) {
                    continue;
                }
                let place = collector.add_kind(resource.clone(), *namespaced, false);
                watched.insert(place, watch_custom(collector, place, resource));
            }
            current = kinds;
        }
    };
    futures::future::join(watch, follow).await;
}

/// Where an object lives, for writes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Target {
    source: usize,
    namespace: String,
    name: String,
    uid: String,
}

/// What the collector decided for one object (or, in tests, for every object).
#[derive(Debug, Default, PartialEq)]
struct Plan {
    /// Objects to delete; `foreground` when they have dependents of their own and an owner
    /// waits for them.
    deletes: Vec<Delete>,
    /// Objects whose `ownerReferences` shrink to the given list, plus those of the last list
    /// whose owners a live read confirms gone.
    owner_updates: Vec<(Target, String, Vec<OwnerReference>, Vec<OwnerReference>)>,
    /// Owners whose finalizer (`orphan` or `foregroundDeletion`) is done.
    finalized: Vec<(Target, String, Vec<String>)>,
    /// Dependents whose only owners are absent from the graph: deleted once a live read
    /// confirms every owner is gone.
    suspected: Vec<(Delete, Vec<OwnerReference>)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Delete {
    target: Target,
    uid: String,
    foreground: bool,
}

/// An object as the collector sees it.
#[derive(Clone, Debug)]
struct Seen {
    target: Target,
    resource_version: String,
    deleting: bool,
    finalizers: Vec<String>,
    owners: Vec<OwnerReference>,
}

fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

/// The custom resource kinds the cluster serves (its established definitions', at each
/// one's storage version): (kind, namespaced).
async fn custom_kinds(client: &kube::Client) -> Option<Vec<(ApiResource, bool)>> {
    let definitions: Api<CustomResourceDefinition> = Api::all(client.clone());
    let list = definitions.list(&Default::default()).await.ok()?;
    let mut kinds = Vec::new();
    for definition in list.items {
        let established = definition
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
        let spec = &definition.spec;
        let Some(version) = spec.versions.iter().find(|v| v.served) else {
            continue;
        };
        if !established {
            continue;
        }
        kinds.push((
            ApiResource {
                group: spec.group.clone(),
                version: version.name.clone(),
                api_version: format!("{}/{}", spec.group, version.name),
                kind: spec.names.kind.clone(),
                plural: spec.names.plural.clone(),
            },
            spec.scope == "Namespaced",
        ));
    }
    kinds.sort_by(|a, b| (&a.0.group, &a.0.plural).cmp(&(&b.0.group, &b.0.plural)));
    Some(kinds)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every object's plan, merged, from a graph of `seen` with `kinds` all listed.
    fn decide(
        seen: &[Seen],
        kinds: &[(&str, &str, bool)],
        requested: &HashMap<String, Instant>,
    ) -> Plan {
        let mut graph = graph(kinds);
        for object in seen {
            graph.insert(object.clone());
        }
        let mut plan = Plan::default();
        for object in seen {
            let one = graph.attempt(&object.target.uid, requested);
            plan.deletes.extend(one.deletes);
            plan.owner_updates.extend(one.owner_updates);
            plan.finalized.extend(one.finalized);
            plan.suspected.extend(one.suspected);
        }
        plan
    }

    fn graph(kinds: &[(&str, &str, bool)]) -> Graph {
        Graph {
            kinds: kinds
                .iter()
                .map(|(group, kind, namespaced)| KindEntry {
                    resource: ApiResource {
                        group: group.to_string(),
                        version: "v1".into(),
                        api_version: String::new(),
                        kind: kind.to_string(),
                        plural: String::new(),
                    },
                    namespaced: *namespaced,
                    active: true,
                    ready: true,
                })
                .collect(),
            ..Graph::default()
        }
    }

    const KINDS: &[(&str, &str, bool)] = &[("apps", "ReplicaSet", true), ("", "Pod", true)];

    fn object(source: usize, name: &str, owners: &[(&str, bool)]) -> Seen {
        Seen {
            target: Target {
                source,
                namespace: "ns".into(),
                name: name.into(),
                uid: format!("uid-{name}"),
            },
            resource_version: "1".into(),
            deleting: false,
            finalizers: vec![],
            owners: owners
                .iter()
                .map(|(owner, blocking)| OwnerReference {
                    api_version: "apps/v1".into(),
                    kind: "ReplicaSet".into(),
                    name: (*owner).into(),
                    uid: format!("uid-{owner}"),
                    controller: Some(true),
                    block_owner_deletion: Some(*blocking),
                })
                .collect(),
        }
    }

    fn deleting(mut seen: Seen, finalizer: &str) -> Seen {
        seen.deleting = true;
        seen.finalizers = vec![finalizer.into()];
        seen
    }

    #[test]
    fn a_dependent_of_a_vanished_owner_is_suspected_then_deleted() {
        let seen = vec![object(1, "pod", &[("rs", true)])];
        let plan = decide(&seen, KINDS, &HashMap::new());
        assert_eq!(plan.suspected.len(), 1);
        assert!(plan.deletes.is_empty() && plan.owner_updates.is_empty());
        // Asked for already: not again while the cache catches up.
        let requested = HashMap::from([("uid-pod".to_string(), Instant::now())]);
        assert!(decide(&seen, KINDS, &requested).suspected.is_empty());
    }

    #[test]
    fn a_dependent_with_a_live_owner_is_kept() {
        let seen = vec![object(0, "rs", &[]), object(1, "pod", &[("rs", true)])];
        assert_eq!(decide(&seen, KINDS, &HashMap::new()), Plan::default());
    }

    #[test]
    fn foreground_deletes_dependents_then_releases_the_owner() {
        let owner = deleting(object(0, "rs", &[]), FOREGROUND);
        let plan = decide(
            &[owner, object(1, "pod", &[("rs", true)])],
            KINDS,
            &HashMap::new(),
        );
        assert_eq!(plan.deletes.len(), 1);
        assert!(plan.finalized.is_empty(), "a blocking dependent remains");
        let owner = deleting(object(0, "rs", &[]), FOREGROUND);
        let plan = decide(&[owner], KINDS, &HashMap::new());
        assert_eq!(plan.finalized[0].2, Vec::<String>::new());
    }

    #[test]
    fn orphaning_strips_the_reference_then_releases_the_owner() {
        let owner = deleting(object(0, "rs", &[]), ORPHAN);
        let plan = decide(
            &[owner, object(1, "pod", &[("rs", true)])],
            KINDS,
            &HashMap::new(),
        );
        assert_eq!(plan.owner_updates.len(), 1);
        assert!(plan.owner_updates[0].2.is_empty());
        assert!(plan.deletes.is_empty() && plan.suspected.is_empty());
        assert!(plan.finalized.is_empty());
    }

    #[test]
    fn a_dangling_reference_beside_a_live_owner_is_removed() {
        let seen = vec![
            object(0, "rs", &[]),
            object(1, "pod", &[("rs", true), ("gone", false)]),
        ];
        let plan = decide(&seen, KINDS, &HashMap::new());
        assert_eq!(plan.owner_updates.len(), 1);
        assert_eq!(plan.owner_updates[0].2.len(), 1);
        assert_eq!(plan.owner_updates[0].2[0].name, "rs");
    }

    #[test]
    fn an_owner_of_an_unwatched_kind_is_never_judged_absent() {
        let mut pod = object(1, "pod", &[("cm", true)]);
        pod.owners[0].kind = "ConfigMap".into();
        pod.owners[0].api_version = "v1".into();
        assert_eq!(decide(&[pod], KINDS, &HashMap::new()), Plan::default());
    }

    #[test]
    fn changes_queue_the_objects_they_concern() {
        let mut graph = graph(KINDS);
        let sorted = |mut uids: Vec<String>| {
            uids.sort();
            uids.dedup();
            uids
        };
        // An owner with no dependents yet: nothing to judge; a dependent: itself.
        assert!(graph.insert(object(0, "rs", &[])).is_empty());
        assert_eq!(graph.insert(object(1, "pod", &[("rs", true)])), ["uid-pod"]);
        // A status change of either queues nothing.
        let mut moved = object(1, "pod", &[("rs", true)]);
        moved.resource_version = "2".into();
        assert!(graph.insert(moved).is_empty());
        // The owner starts a foreground deletion: itself and its dependents.
        assert_eq!(
            sorted(graph.insert(deleting(object(0, "rs", &[]), FOREGROUND))),
            ["uid-pod", "uid-rs"]
        );
        // The dependent goes: the owner waiting for it.
        assert_eq!(graph.remove("uid-pod"), ["uid-rs"]);
        // An owner goes: its dependents, known or not yet seen again.
        graph.insert(object(1, "pod", &[("rs", true)]));
        assert_eq!(graph.remove("uid-rs"), ["uid-pod"]);
        assert_eq!(graph.dependents["uid-rs"].len(), 1);
    }

    #[test]
    fn an_owner_of_a_kind_not_listed_yet_is_neither_judged_nor_released() {
        let mut graph = graph(KINDS);
        graph.kinds[0].ready = false;
        graph.insert(object(1, "pod", &[("rs", true)]));
        assert_eq!(graph.attempt("uid-pod", &HashMap::new()), Plan::default());
        graph.insert(deleting(object(1, "owner", &[]), FOREGROUND));
        assert_eq!(graph.attempt("uid-owner", &HashMap::new()), Plan::default());
    }
}
