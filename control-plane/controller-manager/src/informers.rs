//! Shared informers: one watch-fed cache per resource type per cluster, read by every
//! controller that needs it (upstream's SharedInformerFactory). Each delivers every change,
//! old and new object, to the handlers controllers register (which enqueue keys on their work
//! queues), and keeps the indexes they ask for. Dropping the [`Informers`] stops its watches.

use std::any::{Any, TypeId};
use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;

/// A built-in kind an [`Informers`] can cache: what its watch needs of the type.
pub trait Cacheable:
    kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

impl<K> Cacheable for K where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

/// The caches of one cluster, created on first use.
pub struct Informers {
    client: kube::Client,
    caches: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
    watches: Mutex<Vec<JoinHandle<()>>>,
    activity: Arc<Activity>,
}

/// What every cache of a cluster has seen lately: when one last changed, and how many of
/// the cached objects are being deleted (each a wait on finalizers or dependents that a
/// controller may still be driving).
struct Activity {
    last_change: Mutex<std::time::Instant>,
    terminating: std::sync::atomic::AtomicI64,
}

impl Activity {
    fn changed<K: kube::Resource>(&self, change: &Change<'_, K>) {
        let terminating =
            |object: Option<&K>| object.is_some_and(|o| o.meta().deletion_timestamp.is_some());
        let delta = i64::from(terminating(change.new)) - i64::from(terminating(change.old));
        if delta != 0 {
            self.terminating
                .fetch_add(delta, std::sync::atomic::Ordering::Relaxed);
        }
        *self.last_change.lock().unwrap_or_else(|p| p.into_inner()) = std::time::Instant::now();
    }
}

/// One resource type's cache, its change handlers and indexes, and its change signal.
pub struct Informer<K: kube::Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    dispatch: Arc<Dispatch<K>>,
}

impl<K: kube::Resource<DynamicType = ()> + 'static> Clone for Informer<K> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            dispatch: self.dispatch.clone(),
        }
    }
}

/// One change to a cached object: `old` absent for an add, `new` absent for a delete.
pub struct Change<'a, K> {
    /// The object as cached before.
    pub old: Option<&'a K>,
    /// The object as cached now.
    pub new: Option<&'a K>,
}

impl<K> Change<'_, K> {
    /// Both sides that exist (for handlers that enqueue the owners of old and new alike).
    pub fn objects(&self) -> impl Iterator<Item = &K> {
        self.old.into_iter().chain(self.new)
    }
}

/// The queue behind [`Informer::events`]: events in order, and a wake-up for the stream.
struct EventFeed<K> {
    events: Mutex<std::collections::VecDeque<watcher::Event<K>>>,
    wake: tokio::sync::Notify,
}

impl<K> Default for EventFeed<K> {
    fn default() -> Self {
        Self {
            events: Mutex::default(),
            wake: tokio::sync::Notify::new(),
        }
    }
}

impl<K> EventFeed<K> {
    fn push(&self, event: watcher::Event<K>) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(event);
        self.wake.notify_one();
    }

    fn pop(&self) -> Option<watcher::Event<K>> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }
}

type Handler<K> = Box<dyn Fn(&Change<'_, K>) + Send + Sync>;

/// What an informer's watch task tells: the registered handlers and the indexes. Held under
/// one lock with the cache's update, so a handler registered late replays exactly the
/// objects the cache holds and misses no change after.
struct Dispatch<K> {
    handlers: Mutex<Vec<Handler<K>>>,
    indexes: Mutex<HashMap<&'static str, Arc<dyn Any + Send + Sync>>>,
    /// Whether the first list has filled the cache and been told to the handlers. Not the
    /// reflector store's readiness: that is a oneshot receiver, which wakes only the last of
    /// several waiting tasks (the scheduler's shared streams waited forever on kinds with no
    /// objects while the controllers waited too).
    listed: tokio::sync::watch::Sender<bool>,
    /// Called once, right after the first list's objects are told (before `listed` is set).
    on_listed: Mutex<Vec<Box<dyn FnOnce() + Send>>>,
}

/// A secondary index over one informer's cache (upstream's `Indexer`): objects by the values
/// a function derives from them (an owner's uid, a node name).
pub struct Index<K: kube::Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    entries: Arc<Mutex<HashMap<String, HashSet<ObjectRef<K>>>>>,
}

impl<K> Index<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    /// The cached objects indexed under `value`.
    pub fn get(&self, value: &str) -> Vec<Arc<K>> {
        let refs: Vec<ObjectRef<K>> = self
            .entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(value)
            .map(|refs| refs.iter().cloned().collect())
            .unwrap_or_default();
        refs.iter().filter_map(|r| self.store.get(r)).collect()
    }
}

impl<K: kube::Resource<DynamicType = ()> + 'static> Clone for Index<K> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            entries: self.entries.clone(),
        }
    }
}

impl<K> Informer<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// Every cached object.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.store.state()
    }

    /// The cached object `namespace/name` (`namespace` empty for cluster-scoped kinds).
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        let mut key = ObjectRef::new(name);
        if !namespace.is_empty() {
            key = key.within(namespace);
        }
        self.store.get(&key)
    }

    /// Whether the first list has filled the cache: before that, an empty cache means
    /// "not known yet", not "none exist".
    pub fn is_ready(&self) -> bool {
        *self.dispatch.listed.borrow()
    }

    /// Waits until the first list has filled the cache and its objects have been told to the
    /// handlers registered by then (forever if its watch has ended).
    pub async fn ready(&self) {
        let mut listed = self.dispatch.listed.subscribe();
        if listed.wait_for(|listed| *listed).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Calls `handler` with every change from now on, after replaying each cached object as
    /// an add (upstream's `AddEventHandler`). Handlers run on the watch task: they should only
    /// enqueue keys.
    pub fn on_change(&self, handler: impl Fn(&Change<'_, K>) + Send + Sync + 'static) {
        let mut handlers = self
            .dispatch
            .handlers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        for object in self.store.state() {
            handler(&Change {
                old: None,
                new: Some(&*object),
            });
        }
        handlers.push(Box::new(handler));
    }

    /// The cache's changes as a watcher's event stream, for a client that keeps its own
    /// maps (the scheduler, hosted beside the controllers: one watch per kind, not two):
    /// `Init`, then each cached object and every change as `Apply` or `Delete`, and
    /// `InitDone` once the first list has filled the cache and every object of it has been
    /// told. A relist of the cache reaches the stream as the changes it made.
    pub fn events(&self) -> futures::stream::BoxStream<'static, watcher::Event<K>> {
        let feed = Arc::new(EventFeed::<K>::default());
        feed.push(watcher::Event::Init);
        let sink = feed.clone();
        self.on_change(move |change| {
            let event = match (change.new, change.old) {
                (Some(new), _) => watcher::Event::Apply(new.clone()),
                (None, Some(old)) => watcher::Event::Delete(old.clone()),
                (None, None) => return,
            };
            sink.push(event);
        });
        {
            // `listed` is set, and the hooks run, under the handlers' lock right after the
            // list's objects are told: either way InitDone follows them.
            let _handlers = self
                .dispatch
                .handlers
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if *self.dispatch.listed.borrow() {
                feed.push(watcher::Event::InitDone);
            } else {
                let sink = feed.clone();
                self.dispatch
                    .on_listed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(Box::new(move || sink.push(watcher::Event::InitDone)));
            }
        }
        futures::stream::unfold(feed, |feed| async move {
            loop {
                if let Some(event) = feed.pop() {
                    return Some((event, feed));
                }
                feed.wake.notified().await;
            }
        })
        .boxed()
    }

    /// The cache's objects by namespace (shared by every controller that asks).
    pub fn by_namespace(&self) -> Index<K> {
        self.index("namespace", |object| {
            vec![object.meta().namespace.clone().unwrap_or_default()]
        })
    }

    /// The index `name` of this cache, built from `values` on first use and shared by every
    /// controller that asks for it by the same name.
    pub fn index(&self, name: &'static str, values: fn(&K) -> Vec<String>) -> Index<K> {
        let mut indexes = self
            .dispatch
            .indexes
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(existing) = indexes
            .get(name)
            .and_then(|any| any.downcast_ref::<Index<K>>())
        {
            return existing.clone();
        }
        let index = Index {
            store: self.store.clone(),
            entries: Arc::default(),
        };
        indexes.insert(name, Arc::new(index.clone()));
        drop(indexes);
        let entries = index.entries.clone();
        self.on_change(move |change| {
            let mut entries = entries.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(old) = change.old {
                let key = ObjectRef::from_obj(old);
                for value in values(old) {
                    if let Some(refs) = entries.get_mut(&value) {
                        refs.remove(&key);
                        if refs.is_empty() {
                            entries.remove(&value);
                        }
                    }
                }
            }
            if let Some(new) = change.new {
                let key = ObjectRef::from_obj(new);
                for value in values(new) {
                    entries.entry(value).or_default().insert(key.clone());
                }
            }
        });
        index
    }
}

impl<K> Dispatch<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    /// Applies one watch event to the cache and tells the handlers what changed. A relist's
    /// objects (`Init` … `InitDone`) are told only once the cache holds all of them, as
    /// changes against what it held before, so a handler's worker never reads a cache that is
    /// half old, half new.
    fn apply(
        &self,
        writer: &mut reflector::store::Writer<K>,
        store: &Store<K>,
        relisted: &mut Vec<K>,
        event: watcher::Event<K>,
    ) {
        let handlers = self.handlers.lock().unwrap_or_else(|p| p.into_inner());
        let tell = |old: Option<&K>, new: Option<&K>| {
            let change = Change { old, new };
            for handler in handlers.iter() {
                handler(&change);
            }
        };
        match event {
            watcher::Event::Apply(object) => {
                let old = store.get(&ObjectRef::from_obj(&object));
                writer.apply_watcher_event(&watcher::Event::Apply(object.clone()));
                tell(old.as_deref(), Some(&object));
            }
            watcher::Event::Delete(object) => {
                let old = store.get(&ObjectRef::from_obj(&object));
                writer.apply_watcher_event(&watcher::Event::Delete(object.clone()));
                tell(Some(old.as_deref().unwrap_or(&object)), None);
            }
            watcher::Event::Init => {
                relisted.clear();
                writer.apply_watcher_event(&watcher::Event::Init);
            }
            watcher::Event::InitApply(object) => {
                writer.apply_watcher_event(&watcher::Event::InitApply(object.clone()));
                relisted.push(object);
            }
            watcher::Event::InitDone => {
                let mut before: HashMap<ObjectRef<K>, Arc<K>> = store
                    .state()
                    .into_iter()
                    .map(|object| (ObjectRef::from_obj(&*object), object))
                    .collect();
                writer.apply_watcher_event(&watcher::Event::InitDone);
                for object in relisted.drain(..) {
                    let old = before.remove(&ObjectRef::from_obj(&object));
                    let unchanged = old.as_ref().is_some_and(|old| {
                        old.meta().resource_version.is_some()
                            && old.meta().resource_version == object.meta().resource_version
                    });
                    if !unchanged {
                        tell(old.as_deref(), Some(&object));
                    }
                }
                for gone in before.into_values() {
                    tell(Some(&gone), None);
                }
                let on_listed =
                    std::mem::take(&mut *self.on_listed.lock().unwrap_or_else(|p| p.into_inner()));
                for hook in on_listed {
                    hook();
                }
                self.listed.send_replace(true);
            }
        }
    }
}

impl Informers {
    /// The (still empty) caches of `client`'s cluster.
    pub fn new(client: kube::Client) -> Arc<Self> {
        Arc::new(Self {
            client,
            caches: Mutex::default(),
            watches: Mutex::default(),
            activity: Arc::new(Activity {
                last_change: Mutex::new(std::time::Instant::now()),
                terminating: Default::default(),
            }),
        })
    }

    /// How long since any cache changed (since they were made, when none has).
    pub fn quiet_for(&self) -> std::time::Duration {
        self.activity
            .last_change
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
    }

    /// Whether any cached object has a deletion timestamp.
    pub fn holds_terminating(&self) -> bool {
        self.activity
            .terminating
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    }

    /// The client the caches watch through, for controllers' writes.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The cache of `K`, starting its watch on first use.
    pub fn get<K: Cacheable>(&self) -> Informer<K> {
        let mut caches = self.caches.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(existing) = caches
            .get(&TypeId::of::<K>())
            .and_then(|any| any.downcast_ref::<Informer<K>>())
        {
            return existing.clone();
        }
        let (store, mut writer) = reflector::store::<K>();
        let dispatch = Arc::new(Dispatch {
            handlers: Mutex::default(),
            indexes: Mutex::default(),
            listed: tokio::sync::watch::Sender::new(false),
            on_listed: Mutex::default(),
        });
        // managedFields are never read by a controller and are often the larger part of an
        // object: dropped before caching (upstream's informers do the same transform).
        let events = watcher::watcher(
            Api::<K>::all(self.client.clone()),
            // Listed as client-go's reflector lists (`resourceVersion=0`): from the server's
            // watch cache as it stands, not a quorum read of the store; the watch goes on
            // from the revision the list was served at, so nothing after it is missed.
            watcher::Config::default()
                .timeout(WATCH_TIMEOUT_SECONDS)
                .any_semantic(),
        )
        .modify(|object| {
            object.meta_mut().managed_fields = None;
        })
        .default_backoff();
        let task_dispatch = dispatch.clone();
        let task_store = store.clone();
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            let mut relisted = Vec::new();
            while let Some(event) = events.next().await {
                if let Ok(event) = event {
                    task_dispatch.apply(&mut writer, &task_store, &mut relisted, event);
                }
            }
        });
        self.watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(task);
        let informer = Informer { store, dispatch };
        let activity = self.activity.clone();
        informer.on_change(move |change| activity.changed(change));
        caches.insert(TypeId::of::<K>(), Arc::new(informer.clone()));
        informer
    }
}

impl Drop for Informers {
    fn drop(&mut self) {
        for task in self.watches.get_mut().unwrap_or_else(|p| p.into_inner()) {
            task.abort();
        }
    }
}

/// How long each watch call lasts before the informer watches anew: upstream's server-side
/// default (`--min-request-timeout`, 30 min) rather than kube-runtime's 290 s, as every
/// re-watch costs the server a request; bookmarks keep a quiet connection from looking idle.
const WATCH_TIMEOUT_SECONDS: u32 = 1800;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;

    fn config_map(name: &str, version: &str) -> ConfigMap {
        let mut object = ConfigMap::default();
        object.metadata.name = Some(name.into());
        object.metadata.namespace = Some("ns".into());
        object.metadata.resource_version = Some(version.into());
        object
    }

    #[test]
    fn handlers_see_old_and_new_and_a_relist_as_the_changes_it_makes() {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        let dispatch = Dispatch::<ConfigMap> {
            handlers: Mutex::default(),
            indexes: Mutex::default(),
            listed: tokio::sync::watch::Sender::new(false),
            on_listed: Mutex::default(),
        };
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let record = seen.clone();
        dispatch
            .handlers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Box::new(move |change: &Change<'_, ConfigMap>| {
                let version = |o: Option<&ConfigMap>| {
                    o.and_then(|o| o.metadata.resource_version.clone())
                        .unwrap_or_else(|| "-".into())
                };
                let name = change
                    .objects()
                    .find_map(|o| o.metadata.name.clone())
                    .unwrap_or_default();
                record
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(format!(
                        "{name}:{}>{}",
                        version(change.old),
                        version(change.new)
                    ));
            }));
        let mut relisted = Vec::new();
        let mut apply = |event| dispatch.apply(&mut writer, &store, &mut relisted, event);
        apply(watcher::Event::Init);
        apply(watcher::Event::InitApply(config_map("a", "1")));
        apply(watcher::Event::InitApply(config_map("b", "1")));
        apply(watcher::Event::InitDone);
        apply(watcher::Event::Apply(config_map("a", "2")));
        // A relist after a gap: a unchanged, b gone, c new.
        apply(watcher::Event::Init);
        apply(watcher::Event::InitApply(config_map("a", "2")));
        apply(watcher::Event::InitApply(config_map("c", "3")));
        apply(watcher::Event::InitDone);
        apply(watcher::Event::Delete(config_map("a", "4")));
        let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert_eq!(
            seen,
            ["a:->1", "b:->1", "a:1>2", "c:->3", "b:1>-", "a:2>-"],
            "the relist's objects are told only once the cache holds them all"
        );
        assert_eq!(store.state().len(), 1);
    }

    fn unlisted_informer() -> (Informer<ConfigMap>, reflector::store::Writer<ConfigMap>) {
        let (store, writer) = reflector::store::<ConfigMap>();
        let dispatch = Arc::new(Dispatch {
            handlers: Mutex::default(),
            indexes: Mutex::default(),
            listed: tokio::sync::watch::Sender::new(false),
            on_listed: Mutex::default(),
        });
        (Informer { store, dispatch }, writer)
    }

    fn describe(event: &watcher::Event<ConfigMap>) -> String {
        let name = |o: &ConfigMap| o.metadata.name.clone().unwrap_or_default();
        match event {
            watcher::Event::Init => "init".into(),
            watcher::Event::InitApply(o) => format!("init-apply {}", name(o)),
            watcher::Event::Apply(o) => format!("apply {}", name(o)),
            watcher::Event::Delete(o) => format!("delete {}", name(o)),
            watcher::Event::InitDone => "init-done".into(),
        }
    }

    #[tokio::test]
    async fn events_replay_the_list_then_say_init_done_then_follow_changes() {
        let (informer, mut writer) = unlisted_informer();
        let mut events = informer.events();
        let mut relisted = Vec::new();
        let store = informer.store.clone();
        let dispatch = informer.dispatch.clone();
        let mut apply = |event| dispatch.apply(&mut writer, &store, &mut relisted, event);
        apply(watcher::Event::Init);
        apply(watcher::Event::InitApply(config_map("a", "1")));
        apply(watcher::Event::InitDone);
        apply(watcher::Event::Apply(config_map("b", "2")));
        apply(watcher::Event::Delete(config_map("a", "3")));
        let mut seen = Vec::new();
        for _ in 0..5 {
            let event = tokio::time::timeout(Duration::from_secs(5), events.next())
                .await
                .expect("an event in time")
                .expect("the stream goes on");
            seen.push(describe(&event));
        }
        assert_eq!(
            seen,
            ["init", "apply a", "init-done", "apply b", "delete a"]
        );
    }

    /// The reflector store's readiness wakes only the last of several waiting tasks: an empty
    /// kind's stream waited forever beside a controller waiting on the same cache.
    #[tokio::test]
    async fn an_empty_list_readies_every_waiter_and_its_stream() {
        let (informer, mut writer) = unlisted_informer();
        let mut events = informer.events();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let informer = informer.clone();
                tokio::spawn(async move { informer.ready().await })
            })
            .collect();
        assert_eq!(describe(&events.next().await.expect("init")), "init");
        // The stream waits on readiness beside the three tasks.
        let pending = tokio::time::timeout(Duration::from_millis(50), events.next()).await;
        assert!(pending.is_err(), "nothing before the list");
        let mut relisted = Vec::new();
        let store = informer.store.clone();
        for event in [watcher::Event::Init, watcher::Event::InitDone] {
            informer
                .dispatch
                .apply(&mut writer, &store, &mut relisted, event);
        }
        for waiter in waiters {
            tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .expect("every waiter readied")
                .expect("the waiter ran");
        }
        let done = tokio::time::timeout(Duration::from_secs(5), events.next())
            .await
            .expect("InitDone in time")
            .expect("the stream goes on");
        assert_eq!(describe(&done), "init-done");
        assert!(informer.is_ready());
    }
}
