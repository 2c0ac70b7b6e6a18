//! The garbage collector (upstream `garbagecollector`, a pure API client): deletes objects
//! whose owners are all gone (background propagation), deletes the dependents of an owner
//! being deleted in the foreground and then removes its `foregroundDeletion` finalizer once no
//! blocking dependent is left, and strips the references to an owner being deleted with
//! `orphan` before removing that finalizer. It walks the shared caches of the kinds listed in
//! [`sources`]; an owner of a kind it does not watch is never judged absent.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::{
    ControllerRevision, DaemonSet, Deployment, ReplicaSet, StatefulSet,
};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch};
use serde_json::json;

use crate::informers::{Informer, Informers, RELAXED_PASS_INTERVAL, Triggers};
use crate::pods;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, watcher};

/// How often everything is looked at again without a change seen.
const RESYNC: Duration = Duration::from_secs(30);
/// How long a delete this collector asked for is not asked for again while the cache catches up.
const DELETE_PATIENCE: Duration = Duration::from_secs(10);
/// Writes in flight at once.
const CONCURRENT_WRITES: usize = 64;
const MANAGER: &str = "generic-garbage-collector";
const ORPHAN: &str = "orphan";
const FOREGROUND: &str = "foregroundDeletion";

/// One watched kind, type-erased so the collector walks them all alike.
trait Source: Send + Sync {
    fn resource(&self) -> &ApiResource;
    fn namespaced(&self) -> bool;
    fn is_ready(&self) -> bool;
    fn visit(&self, visit: &mut dyn FnMut(&ObjectMeta));
    fn signal(&self) -> tokio::sync::watch::Receiver<u64>;
}

struct Typed<K: kube::Resource<DynamicType = ()> + 'static> {
    informer: Informer<K>,
    resource: ApiResource,
    namespaced: bool,
}

impl<K> Source for Typed<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    fn resource(&self) -> &ApiResource {
        &self.resource
    }
    fn namespaced(&self) -> bool {
        self.namespaced
    }
    fn is_ready(&self) -> bool {
        self.informer.is_ready()
    }
    fn visit(&self, visit: &mut dyn FnMut(&ObjectMeta)) {
        for object in self.informer.list() {
            visit(object.meta());
        }
    }
    fn signal(&self) -> tokio::sync::watch::Receiver<u64> {
        self.informer.signal()
    }
}

fn typed<K>(informers: &Informers, namespaced: bool) -> Box<dyn Source>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    Box::new(Typed {
        informer: informers.get::<K>(),
        resource: ApiResource::erase::<K>(&()),
        namespaced,
    })
}

/// A custom resource kind, watched by its objects' metadata only (upstream's collector
/// watches every deletable kind the same way): a cluster pays for the kinds its
/// definitions add, and for their metadata alone.
struct Custom {
    resource: ApiResource,
    namespaced: bool,
    store: Store<PartialObjectMeta<DynamicObject>>,
    changes: tokio::sync::watch::Receiver<u64>,
    watch: tokio::task::JoinHandle<()>,
}

impl Drop for Custom {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

impl Custom {
    fn start(client: &kube::Client, resource: ApiResource, namespaced: bool) -> Self {
        let writer =
            reflector::store::Writer::<PartialObjectMeta<DynamicObject>>::new(resource.clone());
        let store = writer.as_reader();
        let (signal, changes) = tokio::sync::watch::channel(0u64);
        // An `Api` of `PartialObjectMeta` lists and watches metadata only.
        let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(client.clone(), &resource);
        let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()));
        let watch = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                if event.is_ok() {
                    signal.send_modify(|n| *n = n.wrapping_add(1));
                } else {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        });
        Custom {
            resource,
            namespaced,
            store,
            changes,
            watch,
        }
    }
}

impl Source for Custom {
    fn resource(&self) -> &ApiResource {
        &self.resource
    }
    fn namespaced(&self) -> bool {
        self.namespaced
    }
    fn is_ready(&self) -> bool {
        self.store
            .wait_until_ready()
            .now_or_never()
            .is_some_and(|r| r.is_ok())
    }
    fn visit(&self, visit: &mut dyn FnMut(&ObjectMeta)) {
        for object in self.store.state() {
            visit(&object.metadata);
        }
    }
    fn signal(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.clone()
    }
}

/// The custom resource kinds the cluster serves (its established definitions', at each
/// one's storage version): (kind, namespaced).
async fn custom_kinds(client: &kube::Client) -> Option<Vec<(ApiResource, bool)>> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
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

/// The definitions' names and resourceVersions (a metadata-only list: what changes them).
async fn definition_versions(client: &kube::Client) -> Option<Vec<(String, String)>> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let definitions: Api<CustomResourceDefinition> = Api::all(client.clone());
    let list = definitions.list_metadata(&Default::default()).await.ok()?;
    Some(
        list.items
            .into_iter()
            .map(|d| {
                (
                    d.metadata.name.unwrap_or_default(),
                    d.metadata.resource_version.unwrap_or_default(),
                )
            })
            .collect(),
    )
}

/// How often the collector asks which custom resource kinds exist.
const DISCOVERY_INTERVAL: Duration = Duration::from_secs(15);

/// The kinds the collector watches: those upstream's controllers own or are owned by, plus
/// every custom resource kind (see [`Custom`]). ConfigMaps and Secrets are not watched
/// (their full caches would cost every cluster memory); references to and from them are
/// left alone.
fn sources(informers: &Informers) -> Vec<Box<dyn Source>> {
    vec![
        typed::<Pod>(informers, true),
        typed::<ReplicaSet>(informers, true),
        typed::<Deployment>(informers, true),
        typed::<StatefulSet>(informers, true),
        typed::<DaemonSet>(informers, true),
        typed::<ControllerRevision>(informers, true),
        typed::<Job>(informers, true),
        typed::<CronJob>(informers, true),
        typed::<Service>(informers, true),
        typed::<EndpointSlice>(informers, true),
        typed::<PersistentVolumeClaim>(informers, true),
    ]
}

/// Runs the collector until the task is aborted.
pub async fn run(informers: Arc<Informers>) {
    let client = informers.client().clone();
    let mut sources = sources(&informers);
    let built_in = sources.len();
    let mut custom: Vec<(ApiResource, bool)> = Vec::new();
    let mut discovered: Option<Instant> = None;
    let mut seen_definitions: Option<Vec<(String, String)>> = None;
    let mut triggers = Triggers::new(RESYNC).at_most_every(RELAXED_PASS_INTERVAL);
    for source in &sources {
        triggers = triggers.on_signal(source.signal());
    }
    let mut requested: HashMap<String, Instant> = HashMap::new();
    loop {
        // Definitions come and go: the custom kinds watched follow them. Their metadata is
        // read each time, the definitions themselves (large schemas) only when it changed.
        if discovered.is_none_or(|at| at.elapsed() >= DISCOVERY_INTERVAL) {
            discovered = Some(Instant::now());
            let versions = definition_versions(&client).await;
            let changed = versions.is_some() && versions != seen_definitions;
            let kinds = match changed {
                true => custom_kinds(&client).await,
                false => None,
            };
            if let Some(kinds) = kinds {
                seen_definitions = versions;
                if kinds != custom {
                    sources.truncate(built_in);
                    for (resource, namespaced) in &kinds {
                        sources.push(Box::new(Custom::start(
                            &client,
                            resource.clone(),
                            *namespaced,
                        )));
                    }
                    custom = kinds;
                    triggers = Triggers::new(RESYNC).at_most_every(RELAXED_PASS_INTERVAL);
                    for source in &sources {
                        triggers = triggers.on_signal(source.signal());
                    }
                }
            }
        }
        tokio::select! {
            _ = triggers.next() => {}
            _ = tokio::time::sleep(DISCOVERY_INTERVAL) => continue,
        }
        if !sources.iter().all(|s| s.is_ready()) {
            continue;
        }
        requested.retain(|_, at| at.elapsed() < DELETE_PATIENCE);
        let plan = plan(&sources, &requested);
        for delete in &plan.deletes {
            requested.insert(delete.uid.clone(), Instant::now());
        }
        apply(&client, &sources, plan).await;
    }
}

/// Where an object lives, for writes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Target {
    source: usize,
    namespace: String,
    name: String,
    uid: String,
}

/// What one pass decided.
#[derive(Debug, Default, PartialEq)]
struct Plan {
    /// Objects to delete; `foreground` when they have dependents of their own and an owner
    /// waits for them.
    deletes: Vec<Delete>,
    /// Objects whose `ownerReferences` shrink to the given list.
    owner_updates: Vec<(Target, String, Vec<OwnerReference>)>,
    /// Owners whose finalizer (`orphan` or `foregroundDeletion`) is done.
    finalized: Vec<(Target, String, Vec<String>)>,
    /// Dependents whose only owners are absent from the caches: deleted once a live read
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

/// Decides one pass from the caches alone (pure, so the rules are unit-tested).
fn plan(sources: &[Box<dyn Source>], requested: &HashMap<String, Instant>) -> Plan {
    let mut seen: Vec<Seen> = Vec::new();
    for (index, source) in sources.iter().enumerate() {
        source.visit(&mut |meta| {
            seen.push(Seen {
                target: Target {
                    source: index,
                    namespace: meta.namespace.clone().unwrap_or_default(),
                    name: meta.name.clone().unwrap_or_default(),
                    uid: meta.uid.clone().unwrap_or_default(),
                },
                resource_version: meta.resource_version.clone().unwrap_or_default(),
                deleting: meta.deletion_timestamp.is_some(),
                finalizers: meta.finalizers.clone().unwrap_or_default(),
                owners: meta.owner_references.clone().unwrap_or_default(),
            })
        });
    }
    let kinds: Vec<(&str, &str, bool)> = sources
        .iter()
        .map(|s| {
            (
                s.resource().group.as_str(),
                s.resource().kind.as_str(),
                s.namespaced(),
            )
        })
        .collect();
    decide(&seen, &kinds, requested)
}

fn decide(
    seen: &[Seen],
    kinds: &[(&str, &str, bool)],
    requested: &HashMap<String, Instant>,
) -> Plan {
    let by_uid: HashMap<&str, &Seen> = seen.iter().map(|s| (s.target.uid.as_str(), s)).collect();
    let watched = |owner: &OwnerReference| {
        kinds.iter().position(|(group, kind, _)| {
            *group == group_of(&owner.api_version) && *kind == owner.kind
        })
    };
    // Owners' dependents, for the finalizers: (all, blocking).
    let mut dependents: HashMap<&str, (usize, usize)> = HashMap::new();
    // Objects that own something (deleted in the foreground when their owner waits).
    let owners_of_something: HashSet<&str> = seen
        .iter()
        .flat_map(|s| s.owners.iter().map(|o| o.uid.as_str()))
        .collect();
    let mut plan = Plan::default();
    for object in seen {
        if object.owners.is_empty() {
            continue;
        }
        let mut alive = Vec::new();
        let mut absent = Vec::new();
        let mut waiting = false;
        let mut orphaning = false;
        let mut unknown = false;
        for owner in &object.owners {
            let Some(kind) = watched(owner) else {
                unknown = true;
                alive.push(owner.clone());
                continue;
            };
            let found = by_uid.get(owner.uid.as_str()).filter(|o| {
                o.target.source == kind
                    && (!kinds[kind].2 || o.target.namespace == object.target.namespace)
            });
            match found {
                None => absent.push(owner.clone()),
                Some(o) => {
                    let entry = dependents.entry(owner.uid.as_str()).or_default();
                    entry.0 += 1;
                    if owner.block_owner_deletion == Some(true) {
                        entry.1 += 1;
                    }
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
        if object.deleting {
            continue;
        }
        let delete = Delete {
            target: object.target.clone(),
            uid: object.target.uid.clone(),
            foreground: waiting && owners_of_something.contains(object.target.uid.as_str()),
        };
        let only_waiting = !unknown
            && alive.iter().all(|owner| {
                by_uid
                    .get(owner.uid.as_str())
                    .is_some_and(|o| o.deleting && o.finalizers.iter().any(|f| f == FOREGROUND))
            });
        if orphaning {
            // Drop the references to owners being orphaned from (absent ones stay for the
            // background rule to judge on the next pass).
            let mut keep = alive.clone();
            keep.extend(absent.iter().cloned());
            plan.owner_updates
                .push((object.target.clone(), object.resource_version.clone(), keep));
        } else if !alive.is_empty() && only_waiting {
            if !requested.contains_key(&object.target.uid) {
                plan.deletes.push(delete);
            }
        } else if alive.is_empty() && !absent.is_empty() {
            if !requested.contains_key(&object.target.uid) {
                plan.suspected.push((delete, absent));
            }
        } else if !absent.is_empty() {
            // Some owners live on: only the dangling references go (upstream verifies them
            // the same way before patching; an absent owner in a fresh cache is gone).
            plan.owner_updates.push((
                object.target.clone(),
                object.resource_version.clone(),
                alive,
            ));
        }
    }
    for owner in seen.iter().filter(|s| s.deleting) {
        let (all, blocking) = dependents
            .get(owner.target.uid.as_str())
            .copied()
            .unwrap_or_default();
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
    plan
}

fn api(client: &kube::Client, sources: &[Box<dyn Source>], target: &Target) -> Api<DynamicObject> {
    let resource = sources[target.source].resource();
    if sources[target.source].namespaced() {
        Api::namespaced_with(client.clone(), &target.namespace, resource)
    } else {
        Api::all_with(client.clone(), resource)
    }
}

/// Whether the owner really is gone: a live read, since the cache may lag behind a create.
async fn confirmed_absent(
    client: &kube::Client,
    sources: &[Box<dyn Source>],
    dependent: &Target,
    owner: &OwnerReference,
) -> bool {
    let Some(source) = sources.iter().position(|s| {
        s.resource().group == group_of(&owner.api_version) && s.resource().kind == owner.kind
    }) else {
        return false;
    };
    let target = Target {
        source,
        namespace: dependent.namespace.clone(),
        name: owner.name.clone(),
        uid: owner.uid.clone(),
    };
    match api(client, sources, &target).get_opt(&owner.name).await {
        Ok(None) => true,
        Ok(Some(found)) => found.metadata.uid.as_deref() != Some(owner.uid.as_str()),
        Err(_) => false,
    }
}

async fn apply(client: &kube::Client, sources: &[Box<dyn Source>], plan: Plan) {
    let mut writes: Vec<BoxFuture<'_, ()>> = Vec::new();
    for (delete, owners) in plan.suspected {
        writes.push(
            async move {
                for owner in &owners {
                    if !confirmed_absent(client, sources, &delete.target, owner).await {
                        return;
                    }
                }
                delete_object(client, sources, &delete).await;
            }
            .boxed(),
        );
    }
    for delete in plan.deletes {
        writes.push(async move { delete_object(client, sources, &delete).await }.boxed());
    }
    for (target, version, owners) in plan.owner_updates {
        // An emptied list is removed (null), as upstream's omitempty encoding leaves it.
        let owners = if owners.is_empty() {
            json!(null)
        } else {
            json!(owners)
        };
        let patch = json!({"metadata": {
            "ownerReferences": owners, "resourceVersion": version, "uid": target.uid}});
        writes.push(patch_metadata(client, sources, target, patch).boxed());
    }
    for (target, version, finalizers) in plan.finalized {
        let finalizers = if finalizers.is_empty() {
            json!(null)
        } else {
            json!(finalizers)
        };
        let patch = json!({"metadata": {
            "finalizers": finalizers, "resourceVersion": version, "uid": target.uid}});
        writes.push(patch_metadata(client, sources, target, patch).boxed());
    }
    futures::stream::iter(writes)
        .buffer_unordered(CONCURRENT_WRITES)
        .collect::<Vec<()>>()
        .await;
}

/// A merge patch of `target`'s metadata, refused by the server if the object changed since
/// the cache saw it (the next pass decides again).
async fn patch_metadata(
    client: &kube::Client,
    sources: &[Box<dyn Source>],
    target: Target,
    patch: serde_json::Value,
) {
    if let Err(err) = api(client, sources, &target)
        .patch(&target.name, &pods::manager(MANAGER), &Patch::Merge(&patch))
        .await
    {
        tracing::debug!(object = %target.name, %err, "metadata not updated; retrying on the next pass");
    }
}

async fn delete_object(client: &kube::Client, sources: &[Box<dyn Source>], delete: &Delete) {
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
    let api = api(client, sources, &delete.target);
    match api.delete(&delete.target.name, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {}
        Err(err) => {
            tracing::info!(object = %delete.target.name, %err, "garbage collection failed; retrying")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
