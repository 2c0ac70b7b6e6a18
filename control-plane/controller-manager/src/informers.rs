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

/// The caches of one cluster, created on first use.
pub struct Informers {
    client: kube::Client,
    caches: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
    watches: Mutex<Vec<JoinHandle<()>>>,
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

type Handler<K> = Box<dyn Fn(&Change<'_, K>) + Send + Sync>;

/// What an informer's watch task tells: the registered handlers and the indexes. Held under
/// one lock with the cache's update, so a handler registered late replays exactly the
/// objects the cache holds and misses no change after.
struct Dispatch<K> {
    handlers: Mutex<Vec<Handler<K>>>,
    indexes: Mutex<HashMap<&'static str, Arc<dyn Any + Send + Sync>>>,
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
        futures::FutureExt::now_or_never(self.store.wait_until_ready()).is_some_and(|r| r.is_ok())
    }

    /// Waits until the first list has filled the cache (forever if its watch has ended).
    pub async fn ready(&self) {
        if self.store.wait_until_ready().await.is_err() {
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
        })
    }

    /// The client the caches watch through, for controllers' writes.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The cache of `K`, starting its watch on first use.
    pub fn get<K>(&self) -> Informer<K>
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Debug
            + Send
            + Sync
            + 'static,
    {
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
        });
        // managedFields are never read by a controller and are often the larger part of an
        // object: dropped before caching (upstream's informers do the same transform).
        let events = watcher::watcher(
            Api::<K>::all(self.client.clone()),
            watcher::Config::default().timeout(WATCH_TIMEOUT_SECONDS),
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
}
