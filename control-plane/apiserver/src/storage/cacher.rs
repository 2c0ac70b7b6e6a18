//! The watch cache (upstream's cacher): per tenant and resource, one watch of the store feeds an
//! in-memory copy of the resource's objects and a window of its recent events. Lists with
//! `resourceVersion=0`, consistent lists and every watch of the resource are served from it, so
//! the store holds one watch per resource in use however many clients watch it.
//!
//! - **Consistent reads.** A list of the latest state waits until the cache has reached the
//!   store's current revision. The cache's revision moves with its events and, when the writes
//!   since were all to other resources, with a progress report asked of its store watch
//!   ([`ProgressRequester`]), as upstream's consistent reads from cache do.
//! - **The window.** A watch may start anywhere in the window of recent events. One that starts
//!   before it fails `Compacted`, which the client sees as `410 Gone` and relists. Events older
//!   than [`EVENT_FRESHNESS`] leave the window when it grows past [`EVENT_WINDOW_MIN`], and
//!   whatever its size on the periodic sweep, so an idle cache holds its objects and nothing else.
//! - **Built on use, released when idle.** A cache is built by the first list or watch of its
//!   resource and released once it has had no watcher and no list for [`IDLE_RELEASE`]: idle
//!   tenants do not keep copies of every resource they once listed.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use flotilla_storage::{
    EventKind, KeyValue, ProgressRequester, RangeRequest, Revision, Storage, StorageError,
    WatchEvent, WatchResponse, WatchStream,
};
use futures::StreamExt;
use tokio::sync::{OnceCell, mpsc, watch};

/// Events the window keeps whatever their age while it is in use (upstream's default capacity).
const EVENT_WINDOW_MIN: usize = 100;
/// Events the window never exceeds: a busy resource's window covers less time.
const EVENT_WINDOW_MAX: usize = 4096;
/// How long an event stays in the window beyond the minimum (upstream sizes its window to hold
/// at least 75 s of events).
const EVENT_FRESHNESS: Duration = Duration::from_secs(75);
/// How long a cache with no watcher and no list is kept.
const IDLE_RELEASE: Duration = Duration::from_secs(120);
/// How often idle caches are looked for: one timer for the whole server.
const SWEEP_INTERVAL: Duration = Duration::from_secs(30);
/// How soon a read waiting for the cache to catch up first asks the store watch again (etcd
/// drops a progress request that arrives while its watches are not synced, as a cache's are
/// for a moment after it is built); each later ask waits twice as long, up to
/// [`PROGRESS_RETRY_MAX`]. A fixed 100 ms had every new cluster's first consistent list wait
/// 100 ms (create → namespaces listed took 137 ms at p50, from 30–42 ms before the caches).
const PROGRESS_RETRY_FIRST: Duration = Duration::from_millis(2);
/// The longest wait between two progress requests of one read.
const PROGRESS_RETRY_MAX: Duration = Duration::from_millis(100);
/// Batches a slow watcher may fall behind before its watch ends (its client then resumes from
/// the revision it has, usually still in the window).
const LAG_BATCHES: usize = 1024;

/// Every resource's cache, by the resource's key prefix.
#[derive(Clone)]
pub struct WatchCaches {
    inner: Arc<Caches>,
}

struct Caches {
    storage: Arc<dyn Storage>,
    by_prefix: Mutex<HashMap<String, Arc<OnceCell<Arc<Cache>>>>>,
    sweeping: AtomicBool,
    /// Consistent reads the store answered because a cache could not (upstream's
    /// `apiserver_watch_cache_consistent_read_total{fallback="true"}`).
    fallbacks: AtomicU64,
    /// Consistent reads a cache answered (`…{fallback="false"}`).
    served: AtomicU64,
}

impl WatchCaches {
    /// No caches yet, over `storage`.
    pub fn new(storage: Arc<dyn Storage>) -> Self {
        WatchCaches {
            inner: Arc::new(Caches {
                storage,
                by_prefix: Mutex::default(),
                sweeping: AtomicBool::new(false),
                fallbacks: AtomicU64::new(0),
                served: AtomicU64::new(0),
            }),
        }
    }

    /// The cache of the resource stored under `prefix`, built now if there is none. A new one
    /// is built as of `from` when that is given and still readable, so the watch that builds it
    /// can start there.
    pub async fn cache(&self, prefix: &str, from: Revision) -> Result<Arc<Cache>, StorageError> {
        self.start_sweeping();
        let cell = {
            let mut by_prefix = self.inner.lock();
            let entry = by_prefix.entry(prefix.to_string()).or_default();
            if entry.get().is_some_and(|cache| cache.ended()) {
                *entry = Arc::default();
            }
            Arc::clone(entry)
        };
        let cache = cell
            .get_or_try_init(|| build(&self.inner, prefix, from))
            .await?;
        cache.touch();
        Ok(Arc::clone(cache))
    }

    /// The cache of the resource stored under `prefix`, when it has one already.
    pub fn existing(&self, prefix: &str) -> Option<Arc<Cache>> {
        let cache = self
            .inner
            .lock()
            .get(prefix)
            .and_then(|cell| cell.get())
            .filter(|cache| !cache.ended())
            .cloned()?;
        cache.touch();
        Some(cache)
    }

    /// How many resources have a cache now.
    pub fn live(&self) -> usize {
        self.inner
            .lock()
            .values()
            .filter(|cell| cell.get().is_some())
            .count()
    }

    /// Counts a read the store answered because a cache could not.
    pub fn count_fallback(&self) {
        self.inner.fallbacks.fetch_add(1, Ordering::Relaxed);
    }

    /// How many reads the store answered because a cache could not.
    pub fn fallbacks(&self) -> u64 {
        self.inner.fallbacks.load(Ordering::Relaxed)
    }

    /// Counts a consistent read a cache answered.
    pub fn count_served(&self) {
        self.inner.served.fetch_add(1, Ordering::Relaxed);
    }

    /// The caches' metrics in Prometheus' text format: upstream's consistent-read counter
    /// (without its per-resource label) and how many caches are held.
    pub fn render_metrics(&self) -> String {
        let served = self.inner.served.load(Ordering::Relaxed);
        format!(
            "# HELP apiserver_watch_cache_consistent_read_total Consistent reads, by whether the store answered them instead of a watch cache.\n\
             # TYPE apiserver_watch_cache_consistent_read_total counter\n\
             apiserver_watch_cache_consistent_read_total{{fallback=\"false\",success=\"true\"}} {served}\n\
             apiserver_watch_cache_consistent_read_total{{fallback=\"true\",success=\"true\"}} {}\n\
             # HELP flotilla_watch_caches Watch caches held (one per tenant and resource in use).\n\
             # TYPE flotilla_watch_caches gauge\n\
             flotilla_watch_caches {}\n",
            self.fallbacks(),
            self.live()
        )
    }

    /// Releases the caches unused for `idle`, and drops stale events from the others' windows.
    pub fn sweep(&self, idle: Duration) {
        self.inner.sweep(idle);
    }

    /// Starts the one sweeper of this server (it ends with the server's caches).
    fn start_sweeping(&self) {
        if self.inner.sweeping.swap(true, Ordering::Relaxed) {
            return;
        }
        let caches = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(SWEEP_INTERVAL);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                let Some(caches) = caches.upgrade() else {
                    return;
                };
                caches.sweep(IDLE_RELEASE);
            }
        });
    }
}

impl Caches {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<OnceCell<Arc<Cache>>>>> {
        self.by_prefix.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn sweep(&self, idle: Duration) {
        let mut by_prefix = self.lock();
        by_prefix.retain(|_, cell| {
            // A cache being built is kept: its builder is about to use it.
            let Some(cache) = cell.get() else {
                return true;
            };
            !cache.ended() && !cache.idle_for(idle)
        });
        for cache in by_prefix.values().filter_map(|cell| cell.get()) {
            cache.state().drop_stale_events(0);
        }
    }

    /// Forgets `cache` if it is still the one kept for its prefix.
    fn forget(&self, cache: &Cache) {
        let mut by_prefix = self.lock();
        if by_prefix
            .get(&cache.prefix)
            .and_then(|cell| cell.get())
            .is_some_and(|kept| std::ptr::eq(Arc::as_ptr(kept), cache))
        {
            by_prefix.remove(&cache.prefix);
        }
    }
}

/// Lists `prefix` (as of `from - 1` when given and readable) and starts the watch that feeds it.
async fn build(
    caches: &Arc<Caches>,
    prefix: &str,
    from: Revision,
) -> Result<Arc<Cache>, StorageError> {
    let list = |revision| {
        caches.storage.range(RangeRequest {
            prefix: prefix.to_string(),
            start_key: None,
            limit: 0,
            revision,
        })
    };
    let page = match from {
        f if f > 1 => match list(f - 1).await {
            // Older than the store keeps: the cache starts now and that watch gets its 410.
            Err(StorageError::Compacted { .. } | StorageError::FutureRevision { .. }) => {
                list(0).await?
            }
            other => other?,
        },
        _ => list(0).await?,
    };
    let (stream, progress) = caches
        .storage
        .watch_with_progress(prefix, page.revision + 1)
        .await?;
    let objects = page
        .kvs
        .into_iter()
        .map(|kv| (kv.key.clone(), kv))
        .collect();
    let (reached, _) = watch::channel(page.revision);
    let cache = Arc::new(Cache {
        prefix: prefix.to_string(),
        state: Mutex::new(State {
            objects,
            revision: page.revision,
            recent: VecDeque::new(),
            window_start: page.revision + 1,
            watchers: Vec::new(),
            ended: None,
        }),
        reached,
        progress: caches.storage.progress_follows_events().then_some(progress),
        last_used: Mutex::new(Instant::now()),
        feeder: Mutex::new(None),
    });
    let feeder = tokio::spawn(feed(Arc::downgrade(&cache), Arc::downgrade(caches), stream));
    *cache.feeder.lock().unwrap_or_else(|p| p.into_inner()) = Some(feeder.abort_handle());
    Ok(cache)
}

/// Applies the store watch's batches to the cache until the watch fails or the cache goes.
async fn feed(cache: Weak<Cache>, caches: Weak<Caches>, mut stream: WatchStream) {
    let error = loop {
        let batch = stream.next().await;
        let Some(cache) = cache.upgrade() else {
            return;
        };
        match batch {
            Some(Ok(batch)) => cache.apply(batch),
            Some(Err(error)) => break (cache, error),
            None => {
                let error = StorageError::Unavailable {
                    message: "the store's watch ended".to_string(),
                    source: None,
                };
                break (cache, error);
            }
        }
    };
    let (cache, error) = error;
    tracing::debug!(prefix = %cache.prefix, %error, "watch cache stopped");
    if let Some(caches) = caches.upgrade() {
        caches.forget(&cache);
    }
    cache.end(error);
}

/// One resource's cache.
pub struct Cache {
    prefix: String,
    state: Mutex<State>,
    /// The revision the cache has reached, for reads waiting for it (also rung when it ends).
    reached: watch::Sender<Revision>,
    /// Asks the store watch how far it has got; `None` when its answer cannot be trusted to
    /// follow its events ([`Storage::progress_follows_events`]).
    progress: Option<ProgressRequester>,
    last_used: Mutex<Instant>,
    feeder: Mutex<Option<tokio::task::AbortHandle>>,
}

impl Drop for Cache {
    fn drop(&mut self) {
        if let Some(feeder) = self.feeder.lock().unwrap_or_else(|p| p.into_inner()).take() {
            feeder.abort();
        }
    }
}

struct State {
    objects: BTreeMap<String, KeyValue>,
    /// Every write at or below this revision is reflected.
    revision: Revision,
    recent: VecDeque<(Instant, WatchEvent)>,
    /// The oldest revision a watch can start from: every event from it on is in `recent`.
    window_start: Revision,
    watchers: Vec<Watcher>,
    /// Why the cache stopped, once it has.
    ended: Option<String>,
}

type Delivery = Result<Arc<WatchResponse>, Arc<StorageError>>;

struct Watcher {
    sender: mpsc::Sender<Delivery>,
    /// Set when the cache dropped it for falling behind.
    lagged: Arc<AtomicBool>,
}

impl State {
    fn drop_stale_events(&mut self, keep: usize) {
        while (self.recent.len() > keep
            && self
                .recent
                .front()
                .is_some_and(|(at, _)| at.elapsed() > EVENT_FRESHNESS))
            || self.recent.len() > EVENT_WINDOW_MAX
        {
            if let Some((_, dropped)) = self.recent.pop_front() {
                self.window_start = dropped.kv.mod_revision + 1;
            }
        }
    }

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

impl Cache {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn idle_for(&self, idle: Duration) -> bool {
        let unused = self
            .last_used
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
            >= idle;
        let mut state = self.state();
        state.watchers.retain(|w| !w.sender.is_closed());
        unused && state.watchers.is_empty()
    }

    fn ended(&self) -> bool {
        self.state().ended.is_some()
    }

    /// The revision every write at or below which the cache reflects.
    pub fn revision(&self) -> Revision {
        self.state().revision
    }

    fn apply(&self, batch: WatchResponse) {
        let mut state = self.state();
        let now = Instant::now();
        for event in &batch.events {
            match event.kind {
                EventKind::Put => {
                    state.objects.insert(event.kv.key.clone(), event.kv.clone());
                }
                EventKind::Delete => {
                    state.objects.remove(&event.kv.key);
                }
            }
            state.recent.push_back((now, event.clone()));
        }
        state.drop_stale_events(EVENT_WINDOW_MIN);
        state.revision = state.revision.max(batch.revision);
        let revision = state.revision;
        // A progress report moves the revision but wakes no watch: an idle watch stays asleep.
        if !batch.events.is_empty() {
            state.send(&Ok(Arc::new(batch)));
        }
        drop(state);
        self.reached.send_replace(revision);
    }

    fn end(&self, error: StorageError) {
        let mut state = self.state();
        state.ended = Some(error.to_string());
        state.send(&Err(Arc::new(error)));
        state.watchers.clear();
        drop(state);
        self.reached.send_modify(|_| {});
    }

    fn stopped(&self) -> Option<StorageError> {
        self.state()
            .ended
            .as_ref()
            .map(|reason| StorageError::Unavailable {
                message: format!("the watch cache of {} stopped: {reason}", self.prefix),
                source: None,
            })
    }

    /// Waits until the cache has reached `revision`, asking its store watch for progress, for
    /// at most `timeout`: `false` when it has not by then, or at once when the store's
    /// progress reports cannot be trusted and the cache has not reached it.
    pub async fn wait_until(
        &self,
        revision: Revision,
        timeout: Duration,
    ) -> Result<bool, StorageError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut reached = self.reached.subscribe();
        // Progress is asked for at once and then on the back-off's schedule only: an event
        // that moves the cache without reaching `revision` is no reason to ask again.
        let mut retry_after = PROGRESS_RETRY_FIRST;
        let mut next_request = tokio::time::Instant::now();
        loop {
            if let Some(error) = self.stopped() {
                return Err(error);
            }
            if *reached.borrow_and_update() >= revision {
                return Ok(true);
            }
            // Without progress reports an idle cache would wait for nothing: the store answers.
            let Some(progress) = &self.progress else {
                return Ok(false);
            };
            let now = tokio::time::Instant::now();
            if now >= next_request {
                progress.request();
                next_request = now + retry_after;
                retry_after = (retry_after * 2).min(PROGRESS_RETRY_MAX);
            }
            let retry = next_request.min(deadline);
            tokio::select! {
                changed = reached.changed() => {
                    if changed.is_err() {
                        return Err(StorageError::Unavailable {
                            message: format!("the watch cache of {} went away", self.prefix),
                            source: None,
                        });
                    }
                }
                () = tokio::time::sleep_until(retry) => {
                    if retry >= deadline {
                        return Ok(*reached.borrow() >= revision);
                    }
                }
            }
        }
    }

    /// The object at `key`, as the cache stands.
    pub fn get(&self, key: &str) -> Option<KeyValue> {
        self.state().objects.get(key).cloned()
    }

    /// The objects under `prefix` (a part of the cache's, such as one namespace), from
    /// `start_key` on, and the revision they are the state at.
    pub fn list(&self, prefix: &str, start_key: Option<&str>) -> (Vec<KeyValue>, Revision) {
        self.touch();
        let state = self.state();
        let start = match start_key {
            Some(key) if key > prefix => Bound::Included(key),
            _ => Bound::Included(prefix),
        };
        let kvs = state
            .objects
            .range::<str, _>((start, Bound::Unbounded))
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(_, kv)| kv.clone())
            .collect();
        (kvs, state.revision)
    }

    /// Every change under `prefix` (a part of the cache's) with revision `>= from`, in order.
    /// Fails `Compacted` when `from` is older than the window.
    pub fn watch(
        self: &Arc<Self>,
        prefix: &str,
        from: Revision,
    ) -> Result<WatchStream, StorageError> {
        self.touch();
        let mut state = self.state();
        if let Some(reason) = &state.ended {
            return Err(StorageError::Unavailable {
                message: format!("the watch cache of {} stopped: {reason}", self.prefix),
                source: None,
            });
        }
        if from < state.window_start {
            return Err(StorageError::Compacted {
                requested: from,
                compacted: state.window_start - 1,
            });
        }
        let replay: Vec<WatchEvent> = state
            .recent
            .iter()
            .map(|(_, event)| event)
            .filter(|e| e.kv.mod_revision >= from && e.kv.key.starts_with(prefix))
            .cloned()
            .collect();
        let (sender, receiver) = mpsc::channel(LAG_BATCHES);
        let lagged = Arc::new(AtomicBool::new(false));
        state.watchers.push(Watcher {
            sender,
            lagged: Arc::clone(&lagged),
        });
        drop(state);
        let first = (!replay.is_empty()).then(|| {
            let revision = replay.last().map_or(0, |e| e.kv.mod_revision);
            Ok(WatchResponse {
                events: replay,
                revision,
            })
        });
        let subscription = Subscription {
            _cache: Arc::clone(self),
            prefix: prefix.to_string(),
            from,
            receiver,
            lagged,
        };
        let live = futures::stream::unfold(Some(subscription), |subscription| async move {
            let mut subscription = subscription?;
            let item = subscription.next().await?;
            let more = item.is_ok().then_some(subscription);
            Some((item, more))
        });
        Ok(futures::stream::iter(first).chain(live).boxed())
    }
}

/// One watcher's end: it keeps its cache alive while it lasts.
struct Subscription {
    _cache: Arc<Cache>,
    prefix: String,
    from: Revision,
    receiver: mpsc::Receiver<Delivery>,
    lagged: Arc<AtomicBool>,
}

impl Subscription {
    async fn next(&mut self) -> Option<Result<WatchResponse, StorageError>> {
        loop {
            match self.receiver.recv().await {
                Some(Ok(batch)) => {
                    let events: Vec<WatchEvent> = batch
                        .events
                        .iter()
                        .filter(|e| {
                            e.kv.mod_revision >= self.from && e.kv.key.starts_with(&self.prefix)
                        })
                        .cloned()
                        .collect();
                    if events.is_empty() {
                        continue;
                    }
                    return Some(Ok(WatchResponse {
                        events,
                        revision: batch.revision,
                    }));
                }
                Some(Err(error)) => return Some(Err(error.duplicate())),
                None if self.lagged.load(Ordering::Relaxed) => {
                    return Some(Err(StorageError::Unavailable {
                        message: format!(
                            "watch ended: the watch fell {LAG_BATCHES} batches behind"
                        ),
                        source: None,
                    }));
                }
                None => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use flotilla_storage::{EmbeddedStorage, Outcome};

    const PREFIX: &str = "/registry/t/core/configmaps/";

    struct Fixture {
        storage: Arc<dyn Storage>,
        caches: WatchCaches,
        _dir: tempfile::TempDir,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let storage: Arc<dyn Storage> =
            Arc::new(EmbeddedStorage::open(dir.path().join("s.redb")).expect("open"));
        Fixture {
            caches: WatchCaches::new(Arc::clone(&storage)),
            storage,
            _dir: dir,
        }
    }

    async fn put(storage: &Arc<dyn Storage>, key: &str) -> KeyValue {
        match storage.create(key, Bytes::from_static(b"{}")).await {
            Ok(Outcome::Done(kv)) => kv,
            other => panic!("create {key}: {other:?}"),
        }
    }

    fn keys(kvs: &[KeyValue]) -> Vec<&str> {
        kvs.iter().map(|kv| kv.key.as_str()).collect()
    }

    async fn next_events(stream: &mut WatchStream) -> Vec<WatchEvent> {
        let response = tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .expect("a watch response in time")
            .expect("the watch goes on")
            .expect("no watch error");
        response.events
    }

    #[tokio::test]
    async fn a_consistent_read_waits_for_the_cache_even_when_only_other_resources_changed() {
        let f = fixture();
        put(&f.storage, &format!("{PREFIX}default/a")).await;
        let cache = f.caches.cache(PREFIX, 0).await.expect("cache");
        put(&f.storage, &format!("{PREFIX}default/b")).await;
        // Writes elsewhere move the store past everything this cache's watch will ever carry.
        for n in 0..5 {
            put(&f.storage, &format!("/registry/t/core/secrets/default/{n}")).await;
        }
        let current = f.storage.current_revision().await.expect("revision");
        let reached = cache
            .wait_until(current, Duration::from_secs(3))
            .await
            .expect("wait");
        assert!(reached, "the cache never reached revision {current}");
        let (kvs, revision) = cache.list(&format!("{PREFIX}default/"), None);
        assert_eq!(
            keys(&kvs),
            [format!("{PREFIX}default/a"), format!("{PREFIX}default/b")]
        );
        assert!(revision >= current);
        // A page starts at its start key and stays inside its prefix.
        let (kvs, _) = cache.list(
            &format!("{PREFIX}default/"),
            Some(&format!("{PREFIX}default/a\u{0}")),
        );
        assert_eq!(keys(&kvs), [format!("{PREFIX}default/b")]);
        let (kvs, _) = cache.list(&format!("{PREFIX}other/"), None);
        assert!(kvs.is_empty());
    }

    #[tokio::test]
    async fn watches_replay_the_window_follow_live_changes_and_410_before_it() {
        let f = fixture();
        let before = put(&f.storage, &format!("{PREFIX}default/before")).await;
        let cache = f.caches.cache(PREFIX, 0).await.expect("cache");
        let first = put(&f.storage, &format!("{PREFIX}default/first")).await;
        put(&f.storage, &format!("{PREFIX}elsewhere/x")).await;
        let current = f.storage.current_revision().await.expect("revision");
        assert!(
            cache
                .wait_until(current, Duration::from_secs(3))
                .await
                .expect("wait")
        );

        // From the revision of `before`: the window holds what came after it; the namespace's
        // watch sees only its own keys.
        let mut watch = cache
            .watch(&format!("{PREFIX}default/"), before.mod_revision + 1)
            .expect("watch in the window");
        assert_eq!(
            keys(&[next_events(&mut watch).await[0].kv.clone()]),
            [first.key.as_str()]
        );
        let live = put(&f.storage, &format!("{PREFIX}default/live")).await;
        put(&f.storage, &format!("{PREFIX}elsewhere/y")).await;
        let events = next_events(&mut watch).await;
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].kv, live);

        // From before the cache was built: older than its window.
        match cache.watch(PREFIX, before.mod_revision) {
            Err(StorageError::Compacted { requested, .. }) => {
                assert_eq!(requested, before.mod_revision)
            }
            Err(other) => panic!("expected Compacted, got {other}"),
            Ok(_) => panic!("a watch from before the window was accepted"),
        }
    }

    #[tokio::test]
    async fn a_cache_built_for_a_watch_starts_where_the_watch_does() {
        let f = fixture();
        let old = put(&f.storage, &format!("{PREFIX}default/old")).await;
        let next = put(&f.storage, &format!("{PREFIX}default/next")).await;
        let cache = f
            .caches
            .cache(PREFIX, old.mod_revision + 1)
            .await
            .expect("cache");
        let mut watch = cache
            .watch(PREFIX, old.mod_revision + 1)
            .expect("the watch that built the cache is in its window");
        let events = next_events(&mut watch).await;
        assert_eq!(events[0].kv, next);
    }

    #[tokio::test]
    async fn idle_caches_are_released_and_watched_ones_kept() {
        let f = fixture();
        let watched = "/registry/t/core/pods/";
        let cache = f.caches.cache(PREFIX, 0).await.expect("cache");
        let pods = f.caches.cache(watched, 0).await.expect("cache");
        let watch = pods.watch(watched, pods.revision() + 1).expect("watch");
        drop((cache, pods));
        assert_eq!(f.caches.live(), 2);
        f.caches.sweep(Duration::ZERO);
        assert_eq!(f.caches.live(), 1, "the watched cache is kept");
        assert!(
            f.caches
                .render_metrics()
                .contains("\nflotilla_watch_caches 1\n")
        );
        drop(watch);
        f.caches.sweep(Duration::ZERO);
        assert_eq!(f.caches.live(), 0);
        // Used again, it is built again, with the writes made meanwhile.
        put(&f.storage, &format!("{PREFIX}default/later")).await;
        let cache = f.caches.cache(PREFIX, 0).await.expect("cache");
        assert_eq!(cache.list(PREFIX, None).0.len(), 1);
    }

    #[tokio::test]
    async fn stale_events_leave_the_window_on_the_sweep() {
        let f = fixture();
        let cache = f.caches.cache(PREFIX, 0).await.expect("cache");
        let kv = put(&f.storage, &format!("{PREFIX}default/a")).await;
        assert!(
            cache
                .wait_until(kv.mod_revision, Duration::from_secs(3))
                .await
                .expect("wait")
        );
        {
            let mut state = cache.state();
            let aged = Instant::now() - EVENT_FRESHNESS - Duration::from_secs(1);
            for (at, _) in state.recent.iter_mut() {
                *at = aged;
            }
        }
        let watch = cache.watch(PREFIX, kv.mod_revision).expect("in the window");
        f.caches.sweep(IDLE_RELEASE);
        assert!(cache.state().recent.is_empty());
        // A client that saw the event resumes after it; one that did not must relist.
        assert!(cache.watch(PREFIX, kv.mod_revision + 1).is_ok());
        assert!(matches!(
            cache.watch(PREFIX, kv.mod_revision),
            Err(StorageError::Compacted { .. })
        ));
        drop(watch);
    }
}
