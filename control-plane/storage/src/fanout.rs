//! Watch fan-out: every watch of one prefix shares one watch of the backend (a *hub*), as
//! upstream's cacher feeds all of a resource's watchers from one etcd watch. A hub keeps its
//! most recent events, so a watch that starts a little in the past (a client resuming from the
//! resourceVersion of its last list) joins it too; one older than that window gets a watch of
//! its own, exactly as without fan-out. A hub stops, and releases its backend watch, when its
//! last watcher goes.
//!
//! Why: each hosted cluster's scheduler, controllers, cloud controller and kubelets watch the
//! same few prefixes; without sharing, an etcd-backed fleet of thousands of clusters holds
//! hundreds of thousands of etcd watch streams.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{Notify, mpsc};

use crate::types::{
    KeyValue, Outcome, ProgressRequester, RangeRequest, RangeResponse, Revision, Storage,
    StorageError, WatchEvent, WatchResponse, WatchStream,
};

/// Events a hub keeps for watches that start in the past (a client resuming right after its
/// list needs a few; an older start gets a watch of its own). Every watched prefix of every
/// cluster has a hub, so the window is kept small.
const RECENT_EVENTS: usize = 64;
/// Batches a slow watcher may fall behind before its watch ends (its client then relists).
/// Each watcher's channel grows to this only when it lags: an idle one holds almost nothing
/// (a broadcast channel would allocate every slot up front, for every hub of every cluster).
const LAG_BATCHES: usize = 1024;

/// A [`Storage`] whose watches of one prefix share one watch of `inner`.
pub struct FanOut<S> {
    inner: Arc<S>,
    hubs: Arc<Mutex<HashMap<String, Arc<Hub>>>>,
}

impl<S: Storage> FanOut<S> {
    /// `inner` with its watches shared.
    pub fn new(inner: S) -> Self {
        Self {
            inner: Arc::new(inner),
            hubs: Arc::default(),
        }
    }

    /// How many backend watches the hubs hold now (one per prefix being watched).
    pub fn hubs(&self) -> usize {
        self.hubs.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

type Delivery = Result<Arc<WatchResponse>, Arc<StorageError>>;

/// One prefix's shared watch.
struct Hub {
    prefix: String,
    state: Mutex<HubState>,
    /// Rung when a watcher leaves, so the hub can stop once none is left.
    left: Notify,
}

struct HubState {
    /// The oldest revision from which the hub can serve every event.
    window_start: Revision,
    recent: VecDeque<WatchEvent>,
    watchers: Vec<Watcher>,
    ended: bool,
}

/// One watcher's end of a hub.
struct Watcher {
    sender: mpsc::Sender<Delivery>,
    /// Set when the hub dropped it for falling behind.
    lagged: Arc<AtomicBool>,
}

impl HubState {
    /// Sends to every watcher; one whose channel is full is dropped as lagging, one that left
    /// is forgotten.
    fn send(&mut self, delivery: &Delivery) {
        self.watchers
            .retain(|watcher| match watcher.sender.try_send(delivery.clone()) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    watcher.lagged.store(true, Ordering::Relaxed);
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            });
    }
}

impl Hub {
    /// Subscribes a watch from `from`, with the recent events it must see first; `None` when
    /// the hub cannot serve `from` (older than its window, or ended).
    fn join(self: &Arc<Self>, from: Revision) -> Option<(Vec<WatchEvent>, Subscription)> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.ended || from < state.window_start {
            return None;
        }
        let replay = state
            .recent
            .iter()
            .filter(|e| e.kv.mod_revision >= from)
            .cloned()
            .collect();
        let (sender, receiver) = mpsc::channel(LAG_BATCHES);
        let lagged = Arc::new(AtomicBool::new(false));
        state.watchers.push(Watcher {
            sender,
            lagged: lagged.clone(),
        });
        Some((
            replay,
            Subscription {
                hub: Arc::downgrade(self),
                receiver: Some(receiver),
                lagged,
            },
        ))
    }

    /// Records and forwards one batch from the backend.
    fn deliver(&self, batch: WatchResponse) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for event in &batch.events {
            state.recent.push_back(event.clone());
        }
        while state.recent.len() > RECENT_EVENTS {
            if let Some(dropped) = state.recent.pop_front() {
                state.window_start = dropped.kv.mod_revision + 1;
            }
        }
        state.send(&Ok(Arc::new(batch)));
    }

    /// Ends every watcher's stream with `error`.
    fn end(&self, error: StorageError) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.ended = true;
        state.send(&Err(Arc::new(error)));
        state.watchers.clear();
    }
}

/// A watcher's place in a hub; leaving tells the hub.
struct Subscription {
    hub: Weak<Hub>,
    receiver: Option<mpsc::Receiver<Delivery>>,
    lagged: Arc<AtomicBool>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        drop(self.receiver.take());
        if let Some(hub) = self.hub.upgrade() {
            hub.left.notify_one();
        }
    }
}

impl<S: Storage> FanOut<S> {
    /// The hub of `prefix`, started from `from` when there is none that can serve it.
    async fn subscribe(
        &self,
        prefix: &str,
        from: Revision,
    ) -> Result<Option<(Revision, Vec<WatchEvent>, Subscription)>, StorageError> {
        // "From now" is made explicit: a hub that is still replaying older history must not
        // hand that history to a watch that asked for none of it.
        let from = if from > 0 {
            from
        } else {
            self.inner.current_revision().await? + 1
        };
        if let Some(hub) = self.live_hub(prefix)
            && let Some((replay, subscription)) = hub.join(from)
        {
            return Ok(Some((from, replay, subscription)));
        }
        let start = from;
        let backend = self.inner.watch(prefix, start).await?;
        let hub = Arc::new(Hub {
            prefix: prefix.to_string(),
            state: Mutex::new(HubState {
                window_start: start,
                recent: VecDeque::new(),
                watchers: Vec::new(),
                ended: false,
            }),
            left: Notify::new(),
        });
        let joined = hub.join(from);
        {
            let mut hubs = self.hubs.lock().unwrap_or_else(|p| p.into_inner());
            // Another watch may have started a hub meanwhile: this one stays private to the
            // watch that made it, and ends with it.
            hubs.entry(prefix.to_string())
                .or_insert_with(|| hub.clone());
        }
        tokio::spawn(run_hub(hub, backend, Arc::downgrade(&self.hubs)));
        Ok(joined.map(|(replay, subscription)| (from, replay, subscription)))
    }

    fn live_hub(&self, prefix: &str) -> Option<Arc<Hub>> {
        self.hubs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(prefix)
            .cloned()
    }
}

/// Feeds a hub from its backend watch until the backend ends or no watcher is left.
async fn run_hub(
    hub: Arc<Hub>,
    mut backend: WatchStream,
    hubs: Weak<Mutex<HashMap<String, Arc<Hub>>>>,
) {
    let reason = loop {
        tokio::select! {
            batch = backend.next() => match batch {
                Some(Ok(batch)) => hub.deliver(batch),
                Some(Err(err)) => break Some(err),
                None => break Some(unavailable("the store's watch ended")),
            },
            () = hub.left.notified() => {
                // Checked under the hubs' lock, so no watch joins while the hub goes.
                let Some(hubs) = hubs.upgrade() else { break None };
                let mut hubs = hubs.lock().unwrap_or_else(|p| p.into_inner());
                let mut state = hub.state.lock().unwrap_or_else(|p| p.into_inner());
                state.watchers.retain(|watcher| !watcher.sender.is_closed());
                if state.watchers.is_empty() {
                    if hubs.get(&hub.prefix).is_some_and(|h| Arc::ptr_eq(h, &hub)) {
                        hubs.remove(&hub.prefix);
                    }
                    state.ended = true;
                    break None;
                }
            }
        }
    };
    if let Some(error) = reason {
        if let Some(hubs) = hubs.upgrade() {
            let mut hubs = hubs.lock().unwrap_or_else(|p| p.into_inner());
            if hubs.get(&hub.prefix).is_some_and(|h| Arc::ptr_eq(h, &hub)) {
                hubs.remove(&hub.prefix);
            }
        }
        hub.end(error);
    }
}

/// One watcher's stream: its replay, then the hub's batches from `from` on.
fn stream(from: Revision, replay: Vec<WatchEvent>, subscription: Subscription) -> WatchStream {
    let first = (!replay.is_empty()).then(|| {
        let revision = replay.last().map_or(0, |e| e.kv.mod_revision);
        Ok(WatchResponse {
            events: replay,
            revision,
        })
    });
    let live = futures::stream::unfold(Some(subscription), move |subscription| async move {
        let mut subscription = subscription?;
        loop {
            let receiver = subscription.receiver.as_mut()?;
            match receiver.recv().await {
                Some(Ok(batch)) => {
                    let events: Vec<WatchEvent> = batch
                        .events
                        .iter()
                        .filter(|e| e.kv.mod_revision >= from)
                        .cloned()
                        .collect();
                    if events.is_empty() && !batch.events.is_empty() {
                        continue;
                    }
                    let response = WatchResponse {
                        events,
                        revision: batch.revision,
                    };
                    return Some((Ok(response), Some(subscription)));
                }
                Some(Err(error)) => return Some((Err(error.duplicate()), None)),
                None if subscription.lagged.load(Ordering::Relaxed) => {
                    let reason = format!("the watch fell {LAG_BATCHES} batches behind");
                    return Some((Err(unavailable(&reason)), None));
                }
                None => return None,
            }
        }
    });
    futures::stream::iter(first).chain(live).boxed()
}

fn unavailable(reason: &str) -> StorageError {
    StorageError::Unavailable {
        message: format!("watch ended: {reason}"),
        source: None,
    }
}

#[async_trait]
impl<S: Storage> Storage for FanOut<S> {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StorageError> {
        self.inner.get(key).await
    }

    async fn range(&self, request: RangeRequest) -> Result<RangeResponse, StorageError> {
        self.inner.range(request).await
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<Outcome<KeyValue>, StorageError> {
        self.inner.create(key, value).await
    }

    async fn update(
        &self,
        key: &str,
        value: Bytes,
        expected_revision: Revision,
    ) -> Result<Outcome<KeyValue>, StorageError> {
        self.inner.update(key, value, expected_revision).await
    }

    async fn delete(
        &self,
        key: &str,
        expected_revision: Option<Revision>,
    ) -> Result<Outcome<KeyValue>, StorageError> {
        self.inner.delete(key, expected_revision).await
    }

    async fn watch(
        &self,
        prefix: &str,
        from_revision: Revision,
    ) -> Result<WatchStream, StorageError> {
        match self.subscribe(prefix, from_revision).await? {
            Some((from, replay, subscription)) => Ok(stream(from, replay, subscription)),
            // Older than any hub's window: a watch of its own, as without fan-out.
            None => self.inner.watch(prefix, from_revision).await,
        }
    }

    async fn watch_with_progress(
        &self,
        prefix: &str,
        from_revision: Revision,
    ) -> Result<(WatchStream, ProgressRequester), StorageError> {
        // Its one consumer shares it onwards; a hub would only add a copy.
        self.inner.watch_with_progress(prefix, from_revision).await
    }

    async fn compact(&self, revision: Revision) -> Result<(), StorageError> {
        self.inner.compact(revision).await
    }

    async fn current_revision(&self) -> Result<Revision, StorageError> {
        self.inner.current_revision().await
    }

    async fn compacted_revision(&self) -> Result<Revision, StorageError> {
        self.inner.compacted_revision().await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::EmbeddedStorage;

    async fn next_key(watch: &mut WatchStream) -> String {
        let batch = tokio::time::timeout(Duration::from_secs(5), watch.next())
            .await
            .expect("an event in time")
            .expect("the watch goes on")
            .expect("no error");
        batch.events[0].kv.key.clone()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watches_of_one_prefix_share_one_backend_watch_which_goes_with_the_last() {
        let dir = tempfile::tempdir().expect("a directory");
        let store = FanOut::new(EmbeddedStorage::open(dir.path().join("s")).expect("a store"));
        let first = store
            .create("/p/a", Bytes::from("1"))
            .await
            .expect("create");
        let Outcome::Done(first) = first else {
            panic!("created")
        };
        let mut now = store.watch("/p/", 0).await.expect("watch");
        let mut also_now = store.watch("/p/", 0).await.expect("watch");
        assert_eq!(store.hubs(), 1, "one backend watch for both");
        store
            .create("/p/b", Bytes::from("2"))
            .await
            .expect("create");
        assert_eq!(next_key(&mut now).await, "/p/b");
        assert_eq!(next_key(&mut also_now).await, "/p/b");

        // A watch from a revision inside the hub's window replays what it missed.
        let mut resumed = store
            .watch("/p/", first.mod_revision + 1)
            .await
            .expect("watch");
        assert_eq!(store.hubs(), 1);
        assert_eq!(next_key(&mut resumed).await, "/p/b");
        // One from before the window gets a watch of its own, with the full history.
        let mut from_start = store.watch("/p/", first.mod_revision).await.expect("watch");
        assert_eq!(next_key(&mut from_start).await, "/p/a");

        drop((now, also_now, resumed, from_start));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while store.hubs() > 0 {
            assert!(tokio::time::Instant::now() < deadline, "the hub stayed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
