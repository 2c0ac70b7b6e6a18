//! Flotilla's scheduler, a pure API client of one cluster, structured as upstream's
//! kube-scheduler: watches feed an incremental [`cache::Cache`] and the
//! [`queue::SchedulingQueue`]; each scheduling cycle pops the first pending pod (of the default
//! scheduler), runs the [`framework`] (PreFilter, Filter over a sample of nodes, PreScore,
//! Score, Reserve, Permit), assumes the pod on the chosen node and binds it asynchronously
//! (PreBind volume writes, then `pods/binding`). A pod that fits nowhere runs the PostFilter
//! (DefaultPreemption: evict lower-priority victims, nominate the node), gets
//! `PodScheduled=False` (reason `Unschedulable`, upstream's message) and a `FailedScheduling`
//! event, and waits among the unschedulable pods until a cluster event may help it.

pub mod cache;
pub mod framework;
pub mod queue;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::{BoxStream, FuturesUnordered};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{
    Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, ReplicationController, Service,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::json;

use crate::cache::{Cache, NodeChange};
use crate::framework::{ApiAction, BindingPlan, Framework, PodInfo, preemption};
use crate::queue::SchedulingQueue;

/// The scheduler name pods ask for by default.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";
/// Most API calls (bindings, status writes, evictions) in flight at once.
const MAX_IN_FLIGHT: usize = 256;

/// Plugins a deleted (or finished) bound pod may help (upstream's `AssignedPodDelete` hints).
const POD_DELETE_HELPS: &[&str] = &[
    "NodeResourcesFit",
    "NodePorts",
    "InterPodAffinity",
    "PodTopologySpread",
];
/// Plugins a newly bound or relabelled pod may help (`AssignedPodAdd` / `AssignedPodUpdate`).
const POD_ADD_HELPS: &[&str] = &["InterPodAffinity", "PodTopologySpread"];
/// Plugins a claim, volume or class change may help.
const VOLUME_HELPS: &[&str] = &["VolumeBinding", "VolumeZone"];
/// Plugins a namespace label change may help.
const NAMESPACE_HELPS: &[&str] = &["InterPodAffinity"];

/// One watch event, by kind.
#[allow(clippy::large_enum_variant)] // each event is moved once, straight into the cache
enum Update {
    Pod(Event<Pod>),
    Node(Event<Node>),
    Pvc(Event<PersistentVolumeClaim>),
    Pv(Event<PersistentVolume>),
    StorageClass(Event<StorageClass>),
    Namespace(Event<Namespace>),
    PriorityClass(Event<PriorityClass>),
    Pdb(Event<PodDisruptionBudget>),
    Service(Event<Service>),
    ReplicaSet(Event<ReplicaSet>),
    StatefulSet(Event<StatefulSet>),
    ReplicationController(Event<ReplicationController>),
}

/// Kinds watched; scheduling starts once every one has been listed.
const KINDS: usize = 12;

impl Update {
    fn kind(&self) -> usize {
        match self {
            Update::Pod(_) => 0,
            Update::Node(_) => 1,
            Update::Pvc(_) => 2,
            Update::Pv(_) => 3,
            Update::StorageClass(_) => 4,
            Update::Namespace(_) => 5,
            Update::PriorityClass(_) => 6,
            Update::Pdb(_) => 7,
            Update::Service(_) => 8,
            Update::ReplicaSet(_) => 9,
            Update::StatefulSet(_) => 10,
            Update::ReplicationController(_) => 11,
        }
    }

    fn is_init_done(&self) -> bool {
        matches!(
            self,
            Update::Pod(Event::InitDone)
                | Update::Node(Event::InitDone)
                | Update::Pvc(Event::InitDone)
                | Update::Pv(Event::InitDone)
                | Update::StorageClass(Event::InitDone)
                | Update::Namespace(Event::InitDone)
                | Update::PriorityClass(Event::InitDone)
                | Update::Pdb(Event::InitDone)
                | Update::Service(Event::InitDone)
                | Update::ReplicaSet(Event::InitDone)
                | Update::StatefulSet(Event::InitDone)
                | Update::ReplicationController(Event::InitDone)
        )
    }
}

/// What an API call reports back to the loop.
enum IoDone {
    /// A binding cycle ended.
    Bound {
        key: String,
        result: Result<(), kube::Error>,
    },
    /// Anything else (status writes, evictions): logged where it failed.
    Other,
}

/// `K`'s events as updates: the stream a host shares, or else the scheduler's own watch.
fn watch<K>(
    client: &kube::Client,
    shared: Option<BoxStream<'static, Event<K>>>,
    wrap: fn(Event<K>) -> Update,
) -> BoxStream<'static, Update>
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
{
    if let Some(events) = shared {
        return events.map(wrap).boxed();
    }
    watcher::watcher(Api::<K>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .filter_map(move |event| futures::future::ready(event.ok().map(wrap)))
        .boxed()
}

/// `namespace/name`, or `name` for cluster-scoped objects.
fn key_of(meta: &ObjectMeta) -> String {
    let name = meta.name.as_deref().unwrap_or("");
    match meta.namespace.as_deref() {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_string(),
    }
}

/// Applies a watch event to a map of objects (with relist bookkeeping); whether it changed.
fn apply_event<K: Resource>(
    map: &mut HashMap<String, Arc<K>>,
    relist: &mut Option<HashSet<String>>,
    event: Event<K>,
) -> bool {
    match event {
        Event::Init => {
            *relist = Some(HashSet::new());
            false
        }
        Event::InitApply(object) | Event::Apply(object) => {
            let key = key_of(object.meta());
            if let Some(seen) = relist {
                seen.insert(key.clone());
            }
            map.insert(key, Arc::new(object));
            true
        }
        Event::Delete(object) => map.remove(&key_of(object.meta())).is_some(),
        Event::InitDone => {
            if let Some(seen) = relist.take() {
                map.retain(|key, _| seen.contains(key));
            }
            true
        }
    }
}

/// Sleeps for `wait`, or forever when there is nothing to wait for.
async fn sleep_or_never(wait: Option<Duration>) {
    match wait {
        Some(wait) => tokio::time::sleep(wait).await,
        None => std::future::pending().await,
    }
}

/// Runs the scheduler on `client`'s cluster until the task is aborted.
///
/// Boxed here, in this crate: an `async fn`'s state machines are not exported, so a caller in
/// another crate that awaited the bare future would compile all of them again (the `flotilla`
/// crate held a second copy of the scheduler). Through the box's vtable it calls this
/// crate's copy.
pub fn run(client: kube::Client) -> futures::future::BoxFuture<'static, ()> {
    run_sharing(client, SharedEvents::default())
}

/// [`run`], taking the kinds a host already watches as event streams instead of watching
/// them again.
pub fn run_sharing(
    client: kube::Client,
    shared: SharedEvents,
) -> futures::future::BoxFuture<'static, ()> {
    Box::pin(schedule(client, shared))
}

/// Watch event streams a host shares with the scheduler (the hosted service feeds it from the
/// controllers' caches of the same cluster, so an idle cluster holds one watch per kind, not
/// two). A kind left `None` the scheduler watches itself. A stream must behave as a watcher's:
/// `Init`, the objects, `InitDone`, then changes.
#[derive(Default)]
pub struct SharedEvents {
    /// Pods.
    pub pods: Option<BoxStream<'static, Event<Pod>>>,
    /// Nodes.
    pub nodes: Option<BoxStream<'static, Event<Node>>>,
    /// PersistentVolumeClaims.
    pub claims: Option<BoxStream<'static, Event<PersistentVolumeClaim>>>,
    /// PersistentVolumes.
    pub volumes: Option<BoxStream<'static, Event<PersistentVolume>>>,
    /// StorageClasses.
    pub storage_classes: Option<BoxStream<'static, Event<StorageClass>>>,
    /// PodDisruptionBudgets.
    pub budgets: Option<BoxStream<'static, Event<PodDisruptionBudget>>>,
    /// Services.
    pub services: Option<BoxStream<'static, Event<Service>>>,
    /// ReplicaSets.
    pub replica_sets: Option<BoxStream<'static, Event<ReplicaSet>>>,
    /// StatefulSets.
    pub stateful_sets: Option<BoxStream<'static, Event<StatefulSet>>>,
}

async fn schedule(client: kube::Client, shared: SharedEvents) {
    let mut updates = futures::stream::select_all([
        watch(&client, shared.pods, Update::Pod),
        watch(&client, shared.nodes, Update::Node),
        watch(&client, shared.claims, Update::Pvc),
        watch(&client, shared.volumes, Update::Pv),
        watch(&client, shared.storage_classes, Update::StorageClass),
        watch::<Namespace>(&client, None, Update::Namespace),
        watch::<PriorityClass>(&client, None, Update::PriorityClass),
        watch(&client, shared.budgets, Update::Pdb),
        watch(&client, shared.services, Update::Service),
        watch(&client, shared.replica_sets, Update::ReplicaSet),
        watch(&client, shared.stateful_sets, Update::StatefulSet),
        watch::<ReplicationController>(&client, None, Update::ReplicationController),
    ]);
    let mut scheduler = Scheduler::new(client);
    let mut io: FuturesUnordered<BoxFuture<'static, IoDone>> = FuturesUnordered::new();
    loop {
        let busy = scheduler.synced() && scheduler.queue.has_active() && io.len() < MAX_IN_FLIGHT;
        if !busy {
            let wait = scheduler.queue.next_wakeup(Instant::now());
            tokio::select! {
                update = updates.next() => match update {
                    Some(update) => scheduler.handle(update),
                    None => return,
                },
                Some(done) = io.next(), if !io.is_empty() => scheduler.handle_io(done),
                () = sleep_or_never(wait) => {}
            }
        }
        // Everything that already arrived is applied before the next cycle.
        while let Some(Some(update)) = updates.next().now_or_never() {
            scheduler.handle(update);
        }
        while let Some(Some(done)) = io.next().now_or_never() {
            scheduler.handle_io(done);
        }
        scheduler.queue.flush(Instant::now());
        if scheduler.synced() && io.len() < MAX_IN_FLIGHT {
            scheduler.schedule_one();
        }
        io.extend(scheduler.io.drain(..));
        if busy {
            // Let the API calls and watches make progress between cycles.
            tokio::task::yield_now().await;
        }
    }
}

/// The loop's state.
struct Scheduler {
    client: kube::Client,
    framework: Framework,
    cache: Cache,
    queue: SchedulingQueue,
    synced: [bool; KINDS],
    relist: Vec<Option<HashSet<String>>>,
    namespaces: HashMap<String, Arc<Namespace>>,
    priority_classes: HashMap<String, Arc<PriorityClass>>,
    /// Pods whose binding cycle is running.
    binding: HashSet<String>,
    /// Pod → the node it is nominated to.
    nominations: HashMap<String, String>,
    /// Where the next sample of nodes starts (upstream's `nextStartNodeIndex`).
    next_start: usize,
    /// Where the next preemption dry run starts.
    preemption_offset: usize,
    /// API calls to start.
    io: Vec<BoxFuture<'static, IoDone>>,
}

impl Scheduler {
    fn new(client: kube::Client) -> Self {
        Scheduler {
            client,
            framework: Framework::default(),
            cache: Cache::new(),
            queue: SchedulingQueue::new(),
            synced: [false; KINDS],
            relist: vec![None; KINDS],
            namespaces: HashMap::new(),
            priority_classes: HashMap::new(),
            binding: HashSet::new(),
            nominations: HashMap::new(),
            next_start: 0,
            preemption_offset: 0,
            io: Vec::new(),
        }
    }

    /// Not before every cache is filled: an empty node cache would call every pod
    /// unschedulable.
    fn synced(&self) -> bool {
        self.synced.iter().all(|s| *s)
    }

    fn handle(&mut self, update: Update) {
        let now = Instant::now();
        let kind = update.kind();
        let init_done = update.is_init_done();
        let relist = &mut self.relist[kind];
        let snapshot = &mut self.cache.snapshot;
        let helps: Option<&[&str]> = match update {
            Update::Pod(event) => {
                self.on_pod_event(event, now);
                None
            }
            Update::Node(event) => {
                self.on_node_event(event, now);
                None
            }
            Update::Pvc(e) => apply_event(&mut snapshot.pvcs, relist, e).then_some(VOLUME_HELPS),
            Update::Pv(e) => apply_event(&mut snapshot.pvs, relist, e).then_some(VOLUME_HELPS),
            Update::StorageClass(e) => {
                apply_event(&mut snapshot.storage_classes, relist, e).then_some(VOLUME_HELPS)
            }
            Update::Namespace(e) => {
                let changed = apply_event(&mut self.namespaces, relist, e);
                if changed {
                    snapshot.namespaces = self
                        .namespaces
                        .iter()
                        .map(|(k, ns)| (k.clone(), ns.metadata.labels.clone().unwrap_or_default()))
                        .collect();
                }
                changed.then_some(NAMESPACE_HELPS)
            }
            // Priority, budgets and the default spreading selectors only change later cycles.
            Update::PriorityClass(e) => {
                apply_event(&mut self.priority_classes, relist, e);
                None
            }
            Update::Pdb(e) => {
                apply_event(&mut snapshot.pdbs, relist, e);
                None
            }
            Update::Service(e) => {
                apply_event(&mut snapshot.services, relist, e);
                None
            }
            Update::ReplicaSet(e) => {
                apply_event(&mut snapshot.replica_sets, relist, e);
                None
            }
            Update::StatefulSet(e) => {
                apply_event(&mut snapshot.stateful_sets, relist, e);
                None
            }
            Update::ReplicationController(e) => {
                apply_event(&mut snapshot.replication_controllers, relist, e);
                None
            }
        };
        if init_done {
            self.synced[kind] = true;
        }
        if let Some(helps) = helps {
            self.queue.move_on_event(Some(helps), now);
        }
    }

    /// A pod's effective priority: `spec.priority`, or — when the API server did not resolve
    /// `priorityClassName` (Flotilla's does not yet) — the class's value, as upstream's
    /// Priority admission would have set it.
    fn pod_info(&self, pod: Arc<Pod>) -> PodInfo {
        let mut info = PodInfo::new(pod);
        if info.priority != 0 {
            return info;
        }
        let spec = info.pod.spec.as_ref();
        let class_name = spec
            .and_then(|s| s.priority_class_name.as_deref())
            .filter(|n| !n.is_empty());
        let class: Option<(i32, Option<String>)> = match class_name {
            Some("system-node-critical") => Some((2_000_001_000, None)),
            Some("system-cluster-critical") => Some((2_000_000_000, None)),
            Some(name) => self
                .priority_classes
                .get(name)
                .map(|c| (c.value, c.preemption_policy.clone())),
            None => self
                .priority_classes
                .values()
                .find(|c| c.global_default == Some(true))
                .map(|c| (c.value, c.preemption_policy.clone())),
        };
        if let Some((value, policy)) = class {
            let own_policy = spec.and_then(|s| s.preemption_policy.as_deref());
            info.priority = value;
            if own_policy.is_none() && policy.as_deref() == Some("Never") {
                info.may_preempt = false;
            }
        }
        info
    }

    fn is_ours(info: &PodInfo) -> bool {
        let spec = info.pod.spec.as_ref();
        let ours = spec
            .and_then(|s| s.scheduler_name.as_deref())
            .is_none_or(|name| name.is_empty() || name == DEFAULT_SCHEDULER);
        // SchedulingGates (PreEnqueue): gated pods stay out of the queue.
        let gated = spec
            .and_then(|s| s.scheduling_gates.as_ref())
            .is_some_and(|g| !g.is_empty());
        ours && !gated && !info.terminating
    }

    /// Points the nominator at `node` for the pod (or nowhere).
    fn nominate(&mut self, pod: Option<&Arc<PodInfo>>, key: &str, node: Option<&str>) {
        if let Some(previous) = self.nominations.remove(key)
            && let Some(list) = self.cache.snapshot.nominated.get_mut(&previous)
        {
            list.retain(|p| p.key != key);
            if list.is_empty() {
                self.cache.snapshot.nominated.remove(&previous);
            }
        }
        if let (Some(pod), Some(node)) = (pod, node) {
            self.nominations.insert(key.to_string(), node.to_string());
            self.cache
                .snapshot
                .nominated
                .entry(node.to_string())
                .or_default()
                .push(pod.clone());
        }
    }

    fn on_pod_event(&mut self, event: Event<Pod>, now: Instant) {
        match event {
            Event::Init => self.relist[0] = Some(HashSet::new()),
            Event::InitApply(pod) | Event::Apply(pod) => {
                if let Some(seen) = &mut self.relist[0] {
                    seen.insert(key_of(&pod.metadata));
                }
                self.on_pod(pod, now);
            }
            Event::Delete(pod) => self.on_pod_gone(&key_of(&pod.metadata), now),
            Event::InitDone => {
                let Some(seen) = self.relist[0].take() else {
                    return;
                };
                let gone: Vec<String> = self
                    .cache
                    .pod_keys()
                    .into_iter()
                    .filter(|k| !seen.contains(k) && !self.cache.is_assumed(k))
                    .chain(
                        self.queue
                            .pods()
                            .map(|p| p.info.key.clone())
                            .filter(|k| !seen.contains(k) && !self.binding.contains(k)),
                    )
                    .collect();
                for key in gone {
                    self.on_pod_gone(&key, now);
                }
            }
        }
    }

    fn on_pod(&mut self, pod: Pod, now: Instant) {
        let key = key_of(&pod.metadata);
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded") | Some("Failed")) {
            self.on_pod_gone(&key, now);
            return;
        }
        let info = Arc::new(self.pod_info(Arc::new(pod)));
        if let Some(node) = info.node_name().map(str::to_string) {
            self.queue.delete(&key);
            self.nominate(None, &key, None);
            let was_assumed = self.cache.is_assumed(&key);
            let previous = self.cache.remove_pod(&key);
            self.cache.add_pod(info.clone(), &node);
            match previous {
                None => self.queue.move_on_event(Some(POD_ADD_HELPS), now),
                Some((_, old)) if !was_assumed && old.labels() != info.labels() => {
                    self.queue.move_on_event(Some(POD_ADD_HELPS), now);
                }
                Some(_) => {}
            }
            return;
        }
        if !Self::is_ours(&info) {
            self.on_pod_gone(&key, now);
            return;
        }
        // A stale event from before our binding landed.
        if self.cache.is_assumed(&key) || self.binding.contains(&key) {
            return;
        }
        let nominated = info.nominated_node_name().map(str::to_string);
        self.nominate(Some(&info), &key, nominated.as_deref());
        self.queue.add_or_update(info, now);
    }

    fn on_pod_gone(&mut self, key: &str, now: Instant) {
        self.queue.delete(key);
        self.nominate(None, key, None);
        if self.cache.remove_pod(key).is_some() {
            self.queue.move_on_event(Some(POD_DELETE_HELPS), now);
        }
    }

    fn on_node_event(&mut self, event: Event<Node>, now: Instant) {
        match event {
            Event::Init => self.relist[1] = Some(HashSet::new()),
            Event::InitApply(node) | Event::Apply(node) => {
                if let Some(seen) = &mut self.relist[1] {
                    seen.insert(key_of(&node.metadata));
                }
                if self.cache.add_node(Arc::new(node)) != NodeChange::Irrelevant {
                    self.queue.move_on_event(None, now);
                }
            }
            Event::Delete(node) => self.cache.remove_node(&key_of(&node.metadata)),
            Event::InitDone => {
                if let Some(seen) = self.relist[1].take() {
                    for name in self.cache.node_names() {
                        if !seen.contains(&name) {
                            self.cache.remove_node(&name);
                        }
                    }
                }
            }
        }
    }

    fn handle_io(&mut self, done: IoDone) {
        let IoDone::Bound { key, result } = done else {
            return;
        };
        self.binding.remove(&key);
        match result {
            Ok(()) => self.queue.done(&key),
            Err(err) => {
                self.cache.forget(&key);
                match &err {
                    // Gone, or bound by someone else: the watch tells the rest.
                    kube::Error::Api(status) if status.code == 404 || status.code == 409 => {
                        self.queue.delete(&key);
                    }
                    _ => {
                        tracing::info!(pod = %key, %err, "binding failed; retrying after backoff");
                        self.queue
                            .add_unschedulable(&key, BTreeSet::new(), Instant::now());
                    }
                }
            }
        }
    }

    /// One scheduling cycle (upstream's `ScheduleOne`).
    fn schedule_one(&mut self) {
        let now = Instant::now();
        let Some(queued) = self.queue.pop(now) else {
            return;
        };
        let pod = queued.info;
        let snapshot = &self.cache.snapshot;
        let all = snapshot.nodes.len();
        match self.framework.schedule_pod(&pod, snapshot, self.next_start) {
            Ok(result) => {
                if all > 0 {
                    self.next_start = (self.next_start + result.evaluated) % all;
                }
                let node = &snapshot.nodes[result.node];
                match self
                    .framework
                    .reserve_and_permit(&result.state, &pod, node, snapshot)
                {
                    Ok(plan) => {
                        tracing::debug!(pod = %pod.key, node = %plan.node, "assumed");
                        self.cache.assume(pod.clone(), &plan.node);
                        self.cache.assume_volumes(&plan.pre_bind);
                        self.nominate(None, &pod.key, None);
                        self.binding.insert(pod.key.clone());
                        self.io.push(bind(self.client.clone(), pod, plan).boxed());
                    }
                    Err(status) => {
                        let message = status.message();
                        self.report_failure(&pod, BTreeSet::from([status.plugin]), message, None);
                    }
                }
            }
            Err(unschedulable) => {
                let (mut fit_error, state) = *unschedulable;
                let mut nominated = None;
                if all > 0 {
                    self.preemption_offset = self.preemption_offset.wrapping_add(1);
                    match preemption::preempt(
                        &self.framework,
                        &state,
                        &pod,
                        snapshot,
                        &fit_error.diagnosis,
                        self.preemption_offset,
                    ) {
                        Ok(candidate) => {
                            let node = snapshot.nodes[candidate.node].name.clone();
                            // Lower-priority pods nominated there lose their nomination.
                            let displaced: Vec<Arc<PodInfo>> = snapshot
                                .nominated
                                .get(&node)
                                .into_iter()
                                .flatten()
                                .filter(|p| p.priority < pod.priority)
                                .cloned()
                                .collect();
                            for p in &displaced {
                                self.nominate(None, &p.key, None);
                            }
                            tracing::info!(pod = %pod.key, %node, victims = candidate.victims.len(), "preempting");
                            self.io.push(
                                evict(
                                    self.client.clone(),
                                    pod.clone(),
                                    node.clone(),
                                    candidate.victims,
                                    displaced,
                                )
                                .boxed(),
                            );
                            nominated = Some(node);
                        }
                        Err(message) => fit_error.diagnosis.post_filter_msg = Some(message),
                    }
                }
                let message = fit_error.message();
                let plugins = fit_error.diagnosis.unschedulable_plugins.clone();
                self.report_failure(&pod, plugins, message, nominated);
            }
        }
    }

    /// Upstream's `handleSchedulingFailure`: back to the queue, the nomination recorded, the
    /// condition and event written.
    fn report_failure(
        &mut self,
        pod: &Arc<PodInfo>,
        plugins: BTreeSet<&'static str>,
        message: String,
        nominated: Option<String>,
    ) {
        tracing::debug!(pod = %pod.key, %message, "unschedulable");
        self.queue
            .add_unschedulable(&pod.key, plugins, Instant::now());
        if nominated.is_some() {
            self.nominate(Some(pod), &pod.key, nominated.as_deref());
        }
        self.io.push(
            mark_unschedulable(self.client.clone(), pod.pod.clone(), message, nominated).boxed(),
        );
    }
}

/// Makes an API call given as a [`ApiAction`].
async fn apply_action(client: &kube::Client, action: &ApiAction) -> Result<(), kube::Error> {
    let ApiAction::Patch { path, patch } = action;
    let body = serde_json::to_vec(patch).map_err(kube::Error::SerdeError)?;
    let request = http::Request::patch(path.as_str())
        .header("content-type", "application/merge-patch+json")
        .body(body)
        .map_err(kube::Error::HttpError)?;
    client.request_text(request).await.map(|_| ())
}

/// The binding cycle: PreBind writes, then `POST pods/{name}/binding` (DefaultBinder).
async fn bind(client: kube::Client, pod: Arc<PodInfo>, plan: BindingPlan) -> IoDone {
    let result = async {
        for action in &plan.pre_bind {
            apply_action(&client, action).await?;
        }
        let binding = json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.pod.metadata.uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": plan.node},
        });
        let body = serde_json::to_vec(&binding).map_err(kube::Error::SerdeError)?;
        let request = http::Request::post(format!(
            "/api/v1/namespaces/{}/pods/{}/binding",
            pod.namespace, pod.name
        ))
        .header("content-type", "application/json")
        .body(body)
        .map_err(kube::Error::HttpError)?;
        client.request_text(request).await.map(|_| ())
    }
    .await;
    IoDone::Bound {
        key: pod.key.clone(),
        result,
    }
}

fn scheduler_params() -> PatchParams {
    PatchParams {
        field_manager: Some(DEFAULT_SCHEDULER.into()),
        ..Default::default()
    }
}

/// A core/v1 Event about a pod, which `kubectl describe` and `kubectl get events` show.
async fn record_event(
    client: &kube::Client,
    pod: &Pod,
    kind: &str,
    reason: &str,
    message: &str,
) -> Result<(), kube::Error> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or("");
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), namespace);
    let event = serde_json::from_value(json!({
        "metadata": {"generateName": format!("{name}.")},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace,
                           "name": name, "uid": pod.metadata.uid},
        "reason": reason,
        "message": message,
        "type": kind,
        "source": {"component": DEFAULT_SCHEDULER},
        "reportingComponent": DEFAULT_SCHEDULER,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }))
    .map_err(kube::Error::SerdeError)?;
    events
        .create(&PostParams::default(), &event)
        .await
        .map(|_| ())
}

/// `PodScheduled=False/Unschedulable` with the message (and the nominated node), written when
/// either changed, with a `FailedScheduling` event.
async fn mark_unschedulable(
    client: kube::Client,
    pod: Arc<Pod>,
    message: String,
    nominated: Option<String>,
) -> IoDone {
    let status = pod.status.as_ref();
    let already = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.message.as_deref() == Some(message.as_str())
            })
        });
    let nomination_written = nominated.is_none()
        || status.and_then(|s| s.nominated_node_name.as_deref()) == nominated.as_deref();
    if already && nomination_written {
        return IoDone::Other;
    }
    let result = async {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let name = pod.metadata.name.as_deref().unwrap_or("");
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let mut patch = json!({"status": {"conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": message, "lastTransitionTime": now,
        }]}});
        if let Some(node) = &nominated {
            patch["status"]["nominatedNodeName"] = json!(node);
        }
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        pods.patch_status(name, &scheduler_params(), &Patch::Strategic(&patch))
            .await?;
        if !already {
            record_event(&client, &pod, "Warning", "FailedScheduling", &message).await?;
        }
        Ok::<(), kube::Error>(())
    }
    .await;
    if let Err(err) = result {
        tracing::debug!(pod = ?pod.metadata.name, %err, "marking the pod unschedulable failed");
    }
    IoDone::Other
}

/// Preemption's API side (upstream's `prepareCandidate`): each victim gets the
/// `DisruptionTarget` condition, is deleted and gets a `Preempted` event; lower-priority pods
/// nominated to the node lose their nomination.
async fn evict(
    client: kube::Client,
    preemptor: Arc<PodInfo>,
    node: String,
    victims: Vec<Arc<PodInfo>>,
    displaced: Vec<Arc<PodInfo>>,
) -> IoDone {
    let scheduler_name = preemptor
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.scheduler_name.clone())
        .unwrap_or_else(|| DEFAULT_SCHEDULER.into());
    let preemptor_uid = preemptor.pod.metadata.uid.clone().unwrap_or_default();
    for victim in victims {
        let result = async {
            let pods: Api<Pod> = Api::namespaced(client.clone(), &victim.namespace);
            let now = k8s_openapi::jiff::Timestamp::now().to_string();
            let condition = json!({"status": {"conditions": [{
                "type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                "message": format!("{scheduler_name}: preempting to accommodate a higher priority pod"),
                "lastTransitionTime": now,
            }]}});
            pods.patch_status(&victim.name, &scheduler_params(), &Patch::Strategic(&condition))
                .await?;
            pods.delete(&victim.name, &DeleteParams::default()).await?;
            record_event(
                &client,
                &victim.pod,
                "Normal",
                "Preempted",
                &format!("Preempted by pod {preemptor_uid} on node {node}"),
            )
            .await
        }
        .await;
        match result {
            Ok(()) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(err) => tracing::info!(victim = %victim.key, %err, "preempting failed"),
        }
    }
    for pod in displaced {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
        let clear = json!({"status": {"nominatedNodeName": null}});
        if let Err(err) = pods
            .patch_status(&pod.name, &scheduler_params(), &Patch::Merge(&clear))
            .await
        {
            tracing::debug!(pod = %pod.key, %err, "clearing the nomination failed");
        }
    }
    IoDone::Other
}
