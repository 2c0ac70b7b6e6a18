//! Per-object work queues (client-go's `workqueue`): watch events enqueue keys; a key waits
//! at most once however often it is added, is processed by one worker at a time (an add
//! while it is processed queues it again once that worker is done), and is retried with
//! per-key exponential back-off after a failure. Workers wait on a notification, never on a
//! timer, so an idle queue costs nothing. Every queue reports upstream's `workqueue_*`
//! metrics under its controller's name ([`render_metrics`]).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Notify;
use tokio::time::Instant;

/// The first retry's delay after a failure (client-go's `DefaultControllerRateLimiter`).
const BASE_DELAY: Duration = Duration::from_millis(5);
/// The longest retry delay: an object that always fails is retried this often, no faster.
const MAX_DELAY: Duration = Duration::from_secs(1000);

/// A controller's queue of keys of type `K` (usually `namespace/name`).
pub struct WorkQueue<K> {
    state: Arc<Mutex<State<K>>>,
    wake: Notify,
    metrics: Arc<QueueMetrics>,
}

tokio::task_local! {
    /// The queues of the cluster whose control loops are being polled: every queue made
    /// inside [`ClusterQueues::scope`] joins it. A task-local rather than an argument to
    /// every controller, so no controller can forget to be counted.
    static CLUSTER_QUEUES: Arc<ClusterQueues>;
}

/// Whether one queue holds a key (ready, delayed, being processed or re-added meanwhile);
/// `None` once the queue is gone.
type HoldsKeys = Box<dyn Fn() -> Option<bool> + Send + Sync>;

/// Every work queue of one cluster's control loops, asked together whether any holds a key:
/// a cluster whose queues hold none, not even one due later, has nothing left to do until a
/// watch event comes.
#[derive(Default)]
pub struct ClusterQueues {
    queues: Mutex<Vec<HoldsKeys>>,
}

impl ClusterQueues {
    /// Runs `loops` with every queue they make counted here.
    pub async fn scope<F: Future>(self: Arc<Self>, loops: F) -> F::Output {
        CLUSTER_QUEUES.scope(self, loops).await
    }

    /// Whether no queue holds a key, now or later.
    pub fn all_empty(&self) -> bool {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let mut empty = true;
        queues.retain(|holds| match holds() {
            Some(holds) => {
                empty &= !holds;
                true
            }
            None => false,
        });
        empty
    }

    fn join<K: Send + 'static>(&self, state: &Arc<Mutex<State<K>>>) {
        let state = Arc::downgrade(state);
        self.queues
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Box::new(move || {
                let state = state.upgrade()?;
                let state = state.lock().unwrap_or_else(|p| p.into_inner());
                Some(
                    !(state.ready.is_empty()
                        && state.delayed.is_empty()
                        && state.processing.is_empty()
                        && state.dirty.is_empty()),
                )
            }));
    }
}

struct State<K> {
    /// Keys ready to process, oldest first.
    ready: VecDeque<K>,
    /// The keys in `ready`, with when each was added (for the queue-duration metric).
    queued: HashMap<K, Instant>,
    /// Keys a worker holds.
    processing: HashSet<K>,
    /// Keys added while a worker held them: queued again when it is done.
    dirty: HashSet<K>,
    /// Keys to add later, by when (a sequence number keeps equal instants apart).
    delayed: BTreeMap<(Instant, u64), K>,
    /// The earliest time each delayed key is due (a later add-after of it changes nothing).
    delayed_until: HashMap<K, (Instant, u64)>,
    sequence: u64,
    /// Failures since each key last succeeded.
    failures: HashMap<K, u32>,
}

impl<K> Default for State<K> {
    fn default() -> Self {
        Self {
            ready: VecDeque::new(),
            queued: HashMap::new(),
            processing: HashSet::new(),
            dirty: HashSet::new(),
            delayed: BTreeMap::new(),
            delayed_until: HashMap::new(),
            sequence: 0,
            failures: HashMap::new(),
        }
    }
}

impl<K: Clone + Eq + Hash> State<K> {
    /// Adds `key` now; returns whether a worker should be woken.
    fn add(&mut self, key: K, metrics: &QueueMetrics) -> bool {
        metrics.adds.fetch_add(1, Ordering::Relaxed);
        if self.queued.contains_key(&key) {
            return false;
        }
        if self.processing.contains(&key) {
            self.dirty.insert(key);
            return false;
        }
        self.queued.insert(key.clone(), Instant::now());
        self.ready.push_back(key);
        metrics.depth.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Moves the delayed keys that are due into the ready queue.
    fn promote_due(&mut self, now: Instant, metrics: &QueueMetrics) {
        while let Some(entry) = self.delayed.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            self.delayed_until.remove(&key);
            self.add(key, metrics);
        }
    }
}

impl<K: Clone + Eq + Hash + Send> WorkQueue<K> {
    /// An empty queue whose metrics are reported as `name`'s (queues of one controller in
    /// every cluster share them, as one process's controllers do upstream).
    pub fn new(name: &'static str) -> Self
    where
        K: 'static,
    {
        let state = Arc::new(Mutex::new(State::default()));
        let _ = CLUSTER_QUEUES.try_with(|cluster| cluster.join(&state));
        Self {
            state,
            wake: Notify::new(),
            metrics: QueueMetrics::named(name),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<K>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `key` unless it already waits.
    pub fn add(&self, key: K) {
        let woke = self.state().add(key, &self.metrics);
        if woke {
            self.wake.notify_one();
        }
    }

    /// Queues `key` once `delay` has passed (at once when it is zero). A key already waiting
    /// for an earlier time keeps it.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let due = Instant::now() + delay;
        let mut state = self.state();
        if let Some(existing) = state.delayed_until.get(&key) {
            if existing.0 <= due {
                return;
            }
            let existing = *existing;
            state.delayed.remove(&existing);
        }
        state.sequence += 1;
        let slot = (due, state.sequence);
        state.delayed.insert(slot, key.clone());
        state.delayed_until.insert(key, slot);
        drop(state);
        // A worker asleep until a later deadline must recompute it.
        self.wake.notify_one();
    }

    /// Queues `key` again after its back-off: 5 ms doubled per failure since it last
    /// succeeded, at most 1000 s.
    pub fn add_rate_limited(&self, key: K) {
        let failures = {
            let mut state = self.state();
            let count = state.failures.entry(key.clone()).or_default();
            *count = count.saturating_add(1);
            *count
        };
        self.metrics.retries.fetch_add(1, Ordering::Relaxed);
        self.add_after(key, backoff(failures));
    }

    /// Drops a later add of `key`, if one is waiting.
    pub fn cancel_delayed(&self, key: &K) {
        let mut state = self.state();
        if let Some(slot) = state.delayed_until.remove(key) {
            state.delayed.remove(&slot);
        }
    }

    /// Forgets `key`'s failures (it succeeded, or its object is gone).
    pub fn forget(&self, key: &K) {
        self.state().failures.remove(key);
    }

    /// Failures recorded for `key` since it last succeeded.
    pub fn failures(&self, key: &K) -> u32 {
        self.state().failures.get(key).copied().unwrap_or(0)
    }

    /// Keys waiting now (ready, not delayed).
    pub fn len(&self) -> usize {
        self.state().ready.len()
    }

    /// Whether no key is ready.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits for a ready key and hands it to the caller, who must call [`WorkQueue::done`]
    /// with it afterwards.
    pub async fn next(&self) -> K {
        loop {
            let wake = self.wake.notified();
            let deadline = {
                let mut state = self.state();
                state.promote_due(Instant::now(), &self.metrics);
                if let Some(key) = state.ready.pop_front() {
                    if let Some(added) = state.queued.remove(&key) {
                        self.metrics.queue_duration.observe(added.elapsed());
                    }
                    state.processing.insert(key.clone());
                    self.metrics.depth.fetch_sub(1, Ordering::Relaxed);
                    // Others may be ready too: pass the wake-up on.
                    if !state.ready.is_empty() {
                        self.wake.notify_one();
                    }
                    return key;
                }
                state.delayed.first_key_value().map(|(slot, _)| slot.0)
            };
            match deadline {
                Some(deadline) => {
                    tokio::select! {
                        _ = wake => {}
                        _ = tokio::time::sleep_until(deadline) => {}
                    }
                }
                None => wake.await,
            }
        }
    }

    /// Releases `key` after processing; queues it again if it was added meanwhile.
    pub fn done(&self, key: &K) {
        let mut state = self.state();
        state.processing.remove(key);
        if state.dirty.remove(key) {
            // Not counted as a new add: it was counted when it was marked dirty.
            state.queued.insert(key.clone(), Instant::now());
            state.ready.push_back(key.clone());
            self.metrics.depth.fetch_add(1, Ordering::Relaxed);
            drop(state);
            self.wake.notify_one();
        }
    }
}

/// The delay before retry number `failures` (1 is the first).
fn backoff(failures: u32) -> Duration {
    let exponent = failures.saturating_sub(1).min(32);
    BASE_DELAY
        .checked_mul(1u32 << exponent.min(31))
        .map_or(MAX_DELAY, |delay| delay.min(MAX_DELAY))
}

/// What a sync asks of its queue afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Requeue {
    /// Nothing until a watch event adds the key again.
    #[default]
    No,
    /// Look again after this long (a deadline or a readiness delay the object waits for).
    After(Duration),
}

/// Runs up to `workers` syncs at once over `queue` until the task is aborted: each takes a
/// key, runs `sync` on it, and on an error retries it with back-off (a conflict is such an
/// error: the next try reads the newer object). A sync exists only while it has a key: an
/// idle controller holds one small wait on its queue, not `workers` parked copies of its sync
/// (they were a fifth of an idle hosted cluster's memory). The syncs are polled here, not
/// spawned, so aborting the caller stops them.
pub async fn run_workers<K, E, F, Fut>(queue: &WorkQueue<K>, workers: usize, sync: F)
where
    K: Clone + Eq + Hash + Send + std::fmt::Display,
    E: std::fmt::Display,
    F: Fn(K) -> Fut,
    Fut: Future<Output = Result<Requeue, E>>,
{
    let process = |key: K| {
        let outcome = sync(key.clone());
        async move {
            let started = Instant::now();
            let outcome = outcome.await;
            queue.metrics.work_duration.observe(started.elapsed());
            match outcome {
                Ok(requeue) => {
                    queue.forget(&key);
                    match requeue {
                        Requeue::After(delay) => queue.add_after(key.clone(), delay),
                        // Every delay comes from a sync's verdict or a failure's back-off:
                        // the latest sync says nothing is due, so a look asked for earlier
                        // (a deadline of an object since deleted) is no longer needed, and
                        // does not keep an idle cluster's queue holding a key.
                        Requeue::No => queue.cancel_delayed(&key),
                    }
                }
                Err(err) => {
                    tracing::info!(
                        controller = queue.metrics.name,
                        key = %key,
                        %err,
                        "sync failed; retrying with back-off"
                    );
                    queue.add_rate_limited(key.clone());
                }
            }
            queue.done(&key);
        }
    };
    let limit = workers.max(1);
    let mut running = futures::stream::FuturesUnordered::new();
    loop {
        if running.len() >= limit {
            running.next().await;
            continue;
        }
        tokio::select! {
            // Boxed: a FuturesUnordered keeps a stub slot the size of what it holds, and
            // the sync's state machine would make that as large as the workers it replaces.
            key = queue.next() => running.push(Box::pin(process(key))),
            Some(()) = running.next(), if !running.is_empty() => {}
        }
    }
}

/// Upstream's buckets for the queue's durations: 10 ns to 10 s, ×10 each.
const DURATION_BUCKETS: [f64; 10] = [1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0];

#[derive(Default)]
struct Histogram {
    buckets: [AtomicU64; DURATION_BUCKETS.len()],
    count: AtomicU64,
    /// The sum in nanoseconds.
    sum_nanos: AtomicU64,
}

impl Histogram {
    fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        if let Some(first) = DURATION_BUCKETS.iter().position(|bound| seconds <= *bound) {
            self.buckets[first].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, metric: &str, name: &str) {
        let mut cumulative = 0;
        for (bound, bucket) in DURATION_BUCKETS.iter().zip(&self.buckets) {
            cumulative += bucket.load(Ordering::Relaxed);
            out.push_str(&format!(
                "{metric}_bucket{{name=\"{name}\",le=\"{bound:e}\"}} {cumulative}\n"
            ));
        }
        let count = self.count.load(Ordering::Relaxed);
        out.push_str(&format!(
            "{metric}_bucket{{name=\"{name}\",le=\"+Inf\"}} {count}\n"
        ));
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        out.push_str(&format!("{metric}_sum{{name=\"{name}\"}} {sum}\n"));
        out.push_str(&format!("{metric}_count{{name=\"{name}\"}} {count}\n"));
    }
}

/// One controller's queue metrics, summed over its queues in every cluster.
struct QueueMetrics {
    name: &'static str,
    depth: AtomicU64,
    adds: AtomicU64,
    retries: AtomicU64,
    queue_duration: Histogram,
    work_duration: Histogram,
}

static REGISTRY: LazyLock<Mutex<BTreeMap<&'static str, Arc<QueueMetrics>>>> =
    LazyLock::new(Mutex::default);

impl QueueMetrics {
    fn named(name: &'static str) -> Arc<Self> {
        let mut registry = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
        registry
            .entry(name)
            .or_insert_with(|| {
                Arc::new(QueueMetrics {
                    name,
                    depth: AtomicU64::new(0),
                    adds: AtomicU64::new(0),
                    retries: AtomicU64::new(0),
                    queue_duration: Histogram::default(),
                    work_duration: Histogram::default(),
                })
            })
            .clone()
    }
}

/// Every queue's metrics in the Prometheus text format, with upstream's names
/// (`k8s.io/client-go/util/workqueue` through component-base's provider).
pub fn render_metrics() -> String {
    let registry = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    let mut out = String::new();
    let mut counter = |metric: &str, kind: &str, help: &str, value: fn(&QueueMetrics) -> u64| {
        out.push_str(&format!("# HELP {metric} {help}\n# TYPE {metric} {kind}\n"));
        for (name, metrics) in registry.iter() {
            out.push_str(&format!("{metric}{{name=\"{name}\"}} {}\n", value(metrics)));
        }
    };
    counter(
        "workqueue_depth",
        "gauge",
        "Current depth of workqueue",
        |m| m.depth.load(Ordering::Relaxed),
    );
    counter(
        "workqueue_adds_total",
        "counter",
        "Total number of adds handled by workqueue",
        |m| m.adds.load(Ordering::Relaxed),
    );
    counter(
        "workqueue_retries_total",
        "counter",
        "Total number of retries handled by workqueue",
        |m| m.retries.load(Ordering::Relaxed),
    );
    let mut histogram = |metric: &str, help: &str, of: fn(&QueueMetrics) -> &Histogram| {
        out.push_str(&format!(
            "# HELP {metric} {help}\n# TYPE {metric} histogram\n"
        ));
        for (name, metrics) in registry.iter() {
            of(metrics).render(&mut out, metric, name);
        }
    };
    histogram(
        "workqueue_queue_duration_seconds",
        "How long in seconds an item stays in workqueue before being requested.",
        |m| &m.queue_duration,
    );
    histogram(
        "workqueue_work_duration_seconds",
        "How long in seconds processing an item from workqueue takes.",
        |m| &m.work_duration,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> WorkQueue<String> {
        WorkQueue::new("test")
    }

    #[tokio::test]
    async fn a_key_added_twice_waits_once() {
        let queue = queue();
        queue.add("ns/a".to_string());
        queue.add("ns/a".to_string());
        queue.add("ns/b".to_string());
        assert_eq!(queue.len(), 2);
        assert_eq!(queue.next().await, "ns/a");
        assert_eq!(queue.next().await, "ns/b");
        assert!(queue.is_empty());
    }

    #[tokio::test]
    async fn a_key_added_while_processed_comes_back_once_done() {
        let queue = queue();
        queue.add("k".to_string());
        let key = queue.next().await;
        queue.add("k".to_string());
        queue.add("k".to_string());
        assert!(queue.is_empty(), "one worker at a time per key");
        queue.done(&key);
        assert_eq!(queue.len(), 1);
        assert_eq!(queue.next().await, "k");
    }

    #[test]
    fn backoff_doubles_from_5ms_and_stops_at_1000s() {
        assert_eq!(backoff(1), Duration::from_millis(5));
        assert_eq!(backoff(2), Duration::from_millis(10));
        assert_eq!(backoff(5), Duration::from_millis(80));
        assert_eq!(backoff(30), MAX_DELAY);
        assert_eq!(backoff(u32::MAX), MAX_DELAY);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_key_is_retried_later_and_later_never_in_a_hot_loop() {
        let queue = queue();
        let start = Instant::now();
        let mut retries_at = Vec::new();
        queue.add("bad".to_string());
        for _ in 0..6 {
            let key = queue.next().await;
            retries_at.push(start.elapsed());
            queue.add_rate_limited(key.clone());
            queue.done(&key);
        }
        let gaps: Vec<u128> = retries_at
            .windows(2)
            .map(|w| (w[1] - w[0]).as_millis())
            .collect();
        assert_eq!(gaps, vec![5, 10, 20, 40, 80]);
        queue.forget(&"bad".to_string());
        assert_eq!(queue.failures(&"bad".to_string()), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_keeps_the_earliest_time_and_an_add_now_wins() {
        let queue = queue();
        let start = Instant::now();
        queue.add_after("k".to_string(), Duration::from_secs(10));
        queue.add_after("k".to_string(), Duration::from_secs(2));
        queue.add_after("k".to_string(), Duration::from_secs(30));
        assert_eq!(queue.next().await, "k");
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        queue.done(&"k".to_string());
        // The key is no longer delayed: nothing more comes.
        let more = tokio::time::timeout(Duration::from_secs(60), queue.next()).await;
        assert!(more.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_cluster_s_queues_are_empty_only_when_none_holds_a_key_now_or_later() {
        let cluster = Arc::new(ClusterQueues::default());
        let (first, second) = cluster
            .clone()
            .scope(async { (queue(), WorkQueue::<String>::new("other")) })
            .await;
        // Made outside the scope: not the cluster's.
        let outside = queue();
        outside.add("elsewhere".to_string());
        assert!(cluster.all_empty());
        second.add_after("later".to_string(), Duration::from_secs(5));
        assert!(!cluster.all_empty(), "a delayed key is work to come");
        second.cancel_delayed(&"later".to_string());
        assert!(cluster.all_empty());
        first.add("k".to_string());
        assert!(!cluster.all_empty());
        let key = first.next().await;
        assert!(!cluster.all_empty(), "a key being processed is work");
        first.done(&key);
        assert!(cluster.all_empty());
        drop((first, second));
        assert!(cluster.all_empty());
        assert!(
            cluster.queues.lock().expect("lock").is_empty(),
            "dropped queues forgotten"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_sync_that_asks_for_nothing_cancels_a_look_asked_for_earlier() {
        let queue = Arc::new(WorkQueue::<String>::new("test-cancel"));
        let runs = Arc::new(AtomicU64::new(0));
        let (worker_queue, counted) = (queue.clone(), runs.clone());
        let workers = tokio::spawn(async move {
            run_workers(&worker_queue, 1, |_key: String| {
                let counted = counted.clone();
                async move {
                    // The first sync asks to look again in a minute, the next for nothing.
                    let requeue = match counted.fetch_add(1, Ordering::SeqCst) {
                        0 => Requeue::After(Duration::from_secs(60)),
                        _ => Requeue::No,
                    };
                    Ok::<_, String>(requeue)
                }
            })
            .await;
        });
        queue.add("k".to_string());
        tokio::time::sleep(Duration::from_secs(1)).await;
        queue.add("k".to_string());
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            2,
            "the minute's look still came"
        );
        workers.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn run_workers_retries_conflicts_and_forgets_a_key_whose_object_is_gone() {
        let queue = Arc::new(WorkQueue::<String>::new("test-run"));
        let attempts = Arc::new(Mutex::new(Vec::new()));
        let worker_queue = queue.clone();
        let seen = attempts.clone();
        let workers = tokio::spawn(async move {
            run_workers(&worker_queue, 2, |key: String| {
                let seen = seen.clone();
                async move {
                    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                    seen.push(key.clone());
                    let tries = seen.iter().filter(|k| **k == key).count();
                    // "conflict" fails twice, then succeeds (its object re-read).
                    if key == "conflict" && tries < 3 {
                        return Err("the object has been modified");
                    }
                    Ok(Requeue::No)
                }
            })
            .await
        });
        queue.add("conflict".to_string());
        queue.add("gone".to_string());
        tokio::time::sleep(Duration::from_secs(1)).await;
        let seen = attempts.lock().unwrap_or_else(|p| p.into_inner()).clone();
        assert_eq!(seen.iter().filter(|k| *k == "conflict").count(), 3);
        assert_eq!(seen.iter().filter(|k| *k == "gone").count(), 1);
        assert_eq!(queue.failures(&"conflict".to_string()), 0);
        workers.abort();
        let metrics = render_metrics();
        assert!(metrics.contains("workqueue_retries_total{name=\"test-run\"} 2"));
        assert!(metrics.contains("workqueue_adds_total{name=\"test-run\"} 4"));
        assert!(metrics.contains("workqueue_depth{name=\"test-run\"} 0"));
        assert!(metrics.contains("workqueue_work_duration_seconds_count{name=\"test-run\"} 4"));
    }

    #[tokio::test(start_paused = true)]
    async fn run_workers_runs_at_most_its_workers_at_once_and_every_key_in_the_end() {
        let queue = Arc::new(WorkQueue::<String>::new("test-limit"));
        // (running now, most at once, finished)
        let counts = Arc::new(Mutex::new((0usize, 0usize, 0usize)));
        let worker_queue = queue.clone();
        let tally = counts.clone();
        let workers = tokio::spawn(async move {
            run_workers(&worker_queue, 3, |_key: String| {
                let tally = tally.clone();
                async move {
                    {
                        let mut c = tally.lock().unwrap_or_else(|p| p.into_inner());
                        c.0 += 1;
                        c.1 = c.1.max(c.0);
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let mut c = tally.lock().unwrap_or_else(|p| p.into_inner());
                    c.0 -= 1;
                    c.2 += 1;
                    Ok::<_, String>(Requeue::No)
                }
            })
            .await
        });
        for key in 0..10 {
            queue.add(format!("key-{key}"));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (running, most, finished) = *counts.lock().unwrap_or_else(|p| p.into_inner());
        assert_eq!((running, most, finished), (0, 3, 10));
        // Idle again, a new key is still taken.
        queue.add("late".to_string());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(counts.lock().unwrap_or_else(|p| p.into_inner()).2, 11);
        workers.abort();
    }
}
