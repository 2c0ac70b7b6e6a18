//! Shared informers: one watch-fed cache per resource type per cluster, read by every
//! controller that needs it (upstream's SharedInformerFactory), each with a change signal the
//! controllers wait on. Dropping the [`Informers`] stops its watches.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The caches of one cluster, created on first use.
pub struct Informers {
    client: kube::Client,
    caches: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
    watches: Mutex<Vec<JoinHandle<()>>>,
}

/// One resource type's cache and its change signal.
pub struct Informer<K: kube::Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    changes: watch::Receiver<u64>,
}

impl<K: kube::Resource<DynamicType = ()> + 'static> Clone for Informer<K> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            changes: self.changes.clone(),
        }
    }
}

impl<K> Informer<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
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

    /// The cache's change signal, for loops that erase the cached type.
    pub fn signal(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    /// Whether the first list has filled the cache: before that, an empty cache means
    /// "not known yet", not "none exist".
    pub fn is_ready(&self) -> bool {
        futures::FutureExt::now_or_never(self.store.wait_until_ready()).is_some_and(|r| r.is_ok())
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
        let (store, writer) = reflector::store::<K>();
        let (signal, changes) = watch::channel(0u64);
        // managedFields are never read by a controller and are often the larger part of an
        // object: dropped before caching (upstream's informers do the same transform).
        let events = reflector::reflector(
            writer,
            watcher::watcher(
                Api::<K>::all(self.client.clone()),
                watcher::Config::default(),
            )
            .modify(|object| {
                object.meta_mut().managed_fields = None;
            }),
        )
        .default_backoff();
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                if event.is_ok() {
                    signal.send_modify(|count| *count = count.wrapping_add(1));
                }
            }
        });
        self.watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(task);
        let informer = Informer { store, changes };
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

/// How often, at most, a loop starts a pass while changes keep coming.
pub const PASS_INTERVAL: Duration = Duration::from_millis(100);
/// The same for loops whose work is not urgent to the second (garbage collection, disruption
/// budgets, quota usage, node lifecycle).
pub const RELAXED_PASS_INTERVAL: Duration = Duration::from_secs(1);

/// What a controller waits on between passes: a change in any of its caches, or its resync
/// period elapsing. Changes made while a pass runs are coalesced into the next one.
///
/// A pass walks whole caches, so on a busy cluster (a change every few milliseconds) a loop
/// would start pass after pass, each costing time in proportion to the cluster's size. Passes
/// are therefore spaced by at least [`PASS_INTERVAL`] (or what [`Triggers::at_most_every`]
/// sets): the first change after a quiet spell still starts one at once, while changes
/// arriving sooner wait and are coalesced into one pass.
pub struct Triggers {
    changes: Vec<watch::Receiver<u64>>,
    resync: Duration,
    min_interval: Duration,
    last_pass: Option<tokio::time::Instant>,
}

impl Triggers {
    /// Wakes on changes to the given informers' caches and every `resync`.
    pub fn new(resync: Duration) -> Self {
        Self {
            changes: Vec::new(),
            resync,
            min_interval: PASS_INTERVAL,
            last_pass: None,
        }
    }

    /// Starts passes at most once per `interval`.
    pub fn at_most_every(mut self, interval: Duration) -> Self {
        self.min_interval = interval;
        self
    }

    /// Also wakes on changes to `informer`.
    pub fn on<K: kube::Resource<DynamicType = ()> + 'static>(
        mut self,
        informer: &Informer<K>,
    ) -> Self {
        self.changes.push(informer.changes.clone());
        self
    }

    /// Also wakes on `signal` (an [`Informer::signal`]).
    pub fn on_signal(mut self, signal: watch::Receiver<u64>) -> Self {
        self.changes.push(signal);
        self
    }

    /// Waits for the next reason to run a pass.
    pub async fn next(&mut self) {
        self.next_within(None).await
    }

    /// As [`Triggers::next`], but also wakes after `wake` when that comes before the resync
    /// (a deadline, backoff or schedule time the loop is waiting for).
    pub async fn next_within(&mut self, wake: Option<Duration>) {
        let limit = wake.map_or(self.resync, |wake| wake.min(self.resync));
        let waits: Vec<_> = self
            .changes
            .iter_mut()
            .map(|changes| Box::pin(changes.changed()))
            .collect();
        if waits.is_empty() {
            tokio::time::sleep(limit).await;
            return;
        }
        match tokio::time::timeout(limit, futures::future::select_all(waits)).await {
            // A cache's watch ended (its informers are being dropped): do not spin.
            Ok((Err(_), _, _)) => tokio::time::sleep(self.resync).await,
            Ok((Ok(()), _, _)) | Err(_) => {}
        }
        if let Some(last) = self.last_pass {
            tokio::time::sleep_until(last + self.min_interval).await;
        }
        for changes in &mut self.changes {
            changes.borrow_and_update();
        }
        self.last_pass = Some(tokio::time::Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn passes_are_spaced_out_but_a_change_after_a_quiet_spell_starts_one_at_once() {
        let (signal, changes) = watch::channel(0u64);
        let mut triggers = Triggers::new(Duration::from_secs(3600))
            .on_signal(changes)
            .at_most_every(Duration::from_secs(1));
        let start = tokio::time::Instant::now();

        signal.send_modify(|c| *c += 1);
        triggers.next().await;
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "the first change waits for nothing"
        );

        // Two changes right after that pass are coalesced into one pass a second later.
        signal.send_modify(|c| *c += 1);
        signal.send_modify(|c| *c += 1);
        triggers.next().await;
        assert_eq!(start.elapsed(), Duration::from_secs(1));

        // After a quiet spell longer than the interval, a change starts a pass at once.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let quiet_end = tokio::time::Instant::now();
        signal.send_modify(|c| *c += 1);
        triggers.next().await;
        assert_eq!(quiet_end.elapsed(), Duration::ZERO);
    }
}
