//! The scheduling queue (upstream's `internal/queue.PriorityQueue`): activeQ ordered by the
//! QueueSort plugin (PrioritySort: priority, then queue time), backoffQ (1 s doubling to 10 s
//! per attempt), and the unschedulable pods, moved back by cluster events that may help them
//! (a coarse form of upstream's queueing hints: the event names the plugins it can satisfy) and
//! flushed after 5 minutes regardless. Time is passed in, so the queue is a pure data structure.

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeSet, BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::framework::node_plugins::PrioritySort;
use crate::framework::{Plugin, PodInfo, QueuedOrder};

/// Upstream's `DefaultPodInitialBackoffDuration`.
pub const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
/// Upstream's `DefaultPodMaxBackoffDuration`.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Upstream's `DefaultPodMaxInUnschedulablePodsDuration`.
pub const MAX_IN_UNSCHEDULABLE: Duration = Duration::from_secs(5 * 60);
/// How often the unschedulable pods are checked for the 5-minute flush (upstream: 30 s).
pub const UNSCHEDULABLE_FLUSH_PERIOD: Duration = Duration::from_secs(30);

/// Where a pod is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// Waiting to be scheduled.
    Active,
    /// Waiting out its backoff.
    Backoff,
    /// Waiting for an event that may make it schedulable.
    Unschedulable,
    /// Popped: being scheduled or bound.
    InFlight,
}

/// A queued pod (upstream's `QueuedPodInfo`).
#[derive(Debug, Clone)]
pub struct QueuedPod {
    /// The pod.
    pub info: Arc<PodInfo>,
    /// When it was (re)added to activeQ, for PrioritySort.
    pub timestamp: Instant,
    /// Scheduling attempts so far.
    pub attempts: u32,
    /// When the last attempt was popped.
    pub last_attempt: Option<Instant>,
    /// When it entered the unschedulable pods.
    pub unschedulable_since: Option<Instant>,
    /// The plugins that rejected it last time (empty: an error).
    pub unschedulable_plugins: BTreeSet<&'static str>,
    /// The scheduling cycle it was last popped in.
    pub cycle: u64,
    /// Where it is.
    pub location: Location,
    generation: u64,
}

impl QueuedPod {
    /// Backoff after `attempts` attempts: 1 s, 2 s, 4 s, 8 s, 10 s, …
    pub fn backoff_duration(&self) -> Duration {
        let mut duration = INITIAL_BACKOFF;
        for _ in 1..self.attempts {
            if duration > MAX_BACKOFF - duration {
                return MAX_BACKOFF;
            }
            duration += duration;
        }
        duration.min(MAX_BACKOFF)
    }

    fn backoff_expiry(&self) -> Option<Instant> {
        self.last_attempt.map(|t| t + self.backoff_duration())
    }
}

#[derive(Debug, PartialEq, Eq)]
struct ActiveEntry {
    priority: i32,
    timestamp: Instant,
    generation: u64,
    key: String,
}

impl Ord for ActiveEntry {
    fn cmp(&self, other: &Self) -> Ordering {
        let a = QueuedOrder {
            priority: self.priority,
            timestamp: self.timestamp,
        };
        let b = QueuedOrder {
            priority: other.priority,
            timestamp: other.timestamp,
        };
        // BinaryHeap pops the greatest: the one PrioritySort puts first.
        if PrioritySort.less(&a, &b) {
            Ordering::Greater
        } else if PrioritySort.less(&b, &a) {
            Ordering::Less
        } else {
            other.generation.cmp(&self.generation)
        }
    }
}

impl PartialOrd for ActiveEntry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The queue.
#[derive(Debug, Default)]
pub struct SchedulingQueue {
    pods: HashMap<String, QueuedPod>,
    active: BinaryHeap<ActiveEntry>,
    backoff: BinaryHeap<Reverse<(Instant, u64, String)>>,
    /// Keys of the pods waiting as unschedulable (so events need not scan every pod).
    unschedulable: HashSet<String>,
    cycle: u64,
    move_request_cycle: u64,
    generation: u64,
    last_unschedulable_flush: Option<Instant>,
}

impl SchedulingQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether `key` is queued (anywhere, in flight included).
    pub fn contains(&self, key: &str) -> bool {
        self.pods.contains_key(key)
    }

    /// The queued pod with `key`.
    pub fn get(&self, key: &str) -> Option<&QueuedPod> {
        self.pods.get(key)
    }

    /// Pods in activeQ (lazily deleted entries aside).
    pub fn has_active(&self) -> bool {
        !self.active.is_empty()
    }

    /// Counts per location.
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        let mut counts = (0, 0, 0, 0);
        for pod in self.pods.values() {
            match pod.location {
                Location::Active => counts.0 += 1,
                Location::Backoff => counts.1 += 1,
                Location::Unschedulable => counts.2 += 1,
                Location::InFlight => counts.3 += 1,
            }
        }
        counts
    }

    fn push_active(&mut self, key: &str, now: Instant) {
        self.generation += 1;
        let generation = self.generation;
        self.unschedulable.remove(key);
        let Some(pod) = self.pods.get_mut(key) else {
            return;
        };
        pod.location = Location::Active;
        pod.timestamp = now;
        pod.unschedulable_since = None;
        pod.generation = generation;
        self.active.push(ActiveEntry {
            priority: pod.info.priority,
            timestamp: now,
            generation,
            key: key.to_string(),
        });
    }

    fn push_backoff(&mut self, key: &str, now: Instant) {
        self.generation += 1;
        let generation = self.generation;
        self.unschedulable.remove(key);
        let Some(pod) = self.pods.get_mut(key) else {
            return;
        };
        let expiry = pod.backoff_expiry().unwrap_or(now);
        if expiry <= now {
            self.push_active(key, now);
            return;
        }
        pod.location = Location::Backoff;
        pod.unschedulable_since = None;
        pod.generation = generation;
        self.backoff
            .push(Reverse((expiry, generation, key.to_string())));
    }

    /// A new pending pod goes to activeQ; an update replaces the queued pod, and one waiting
    /// as unschedulable is moved back (its spec or labels may now fit).
    pub fn add_or_update(&mut self, info: Arc<PodInfo>, now: Instant) {
        let key = info.key.clone();
        match self.pods.get_mut(&key) {
            Some(pod) => {
                let changed = pod.info.pod.spec != info.pod.spec
                    || pod.info.pod.metadata.labels != info.pod.metadata.labels;
                pod.info = info;
                if pod.location == Location::Unschedulable && changed {
                    self.push_backoff(&key, now);
                }
            }
            None => {
                self.pods.insert(
                    key.clone(),
                    QueuedPod {
                        info,
                        timestamp: now,
                        attempts: 0,
                        last_attempt: None,
                        unschedulable_since: None,
                        unschedulable_plugins: BTreeSet::new(),
                        cycle: 0,
                        location: Location::Active,
                        generation: 0,
                    },
                );
                self.push_active(&key, now);
            }
        }
    }

    /// Forgets `key` (deleted, bound elsewhere, or no longer ours).
    pub fn delete(&mut self, key: &str) {
        self.pods.remove(key);
        self.unschedulable.remove(key);
    }

    /// Pops the first pod of activeQ and starts a scheduling cycle for it.
    pub fn pop(&mut self, now: Instant) -> Option<QueuedPod> {
        while let Some(entry) = self.active.pop() {
            let Some(pod) = self.pods.get_mut(&entry.key) else {
                continue;
            };
            if pod.location != Location::Active || pod.generation != entry.generation {
                continue;
            }
            self.cycle += 1;
            pod.cycle = self.cycle;
            pod.attempts += 1;
            pod.last_attempt = Some(now);
            pod.location = Location::InFlight;
            return Some(pod.clone());
        }
        None
    }

    /// The pod was bound: it leaves the queue.
    pub fn done(&mut self, key: &str) {
        if self
            .pods
            .get(key)
            .is_some_and(|p| p.location == Location::InFlight)
        {
            self.pods.remove(key);
        }
    }

    /// A popped pod did not fit: it waits among the unschedulable pods — or in backoffQ if an
    /// event that may help it came during its cycle, or it failed with an error.
    pub fn add_unschedulable(&mut self, key: &str, plugins: BTreeSet<&'static str>, now: Instant) {
        let move_request_cycle = self.move_request_cycle;
        let Some(pod) = self.pods.get_mut(key) else {
            return;
        };
        if pod.location != Location::InFlight {
            return;
        }
        let error = plugins.is_empty();
        pod.unschedulable_plugins = plugins;
        if error || move_request_cycle >= pod.cycle {
            self.push_backoff(key, now);
        } else {
            pod.location = Location::Unschedulable;
            pod.unschedulable_since = Some(now);
            self.unschedulable.insert(key.to_string());
        }
    }

    /// A cluster event happened that may make pods rejected by `helps` plugins schedulable
    /// (`None`: any plugin): those move to backoffQ, or activeQ when their backoff is over.
    pub fn move_on_event(&mut self, helps: Option<&[&str]>, now: Instant) {
        self.move_request_cycle = self.cycle;
        let keys: Vec<String> = self
            .unschedulable
            .iter()
            .filter(|k| {
                self.pods.get(*k).is_some_and(|p| {
                    helps.is_none_or(|plugins| {
                        p.unschedulable_plugins.is_empty()
                            || p.unschedulable_plugins.iter().any(|q| plugins.contains(q))
                    })
                })
            })
            .cloned()
            .collect();
        for key in keys {
            self.push_backoff(&key, now);
        }
    }

    /// Moves pods whose backoff ended to activeQ, and pods unschedulable for 5 minutes back.
    pub fn flush(&mut self, now: Instant) {
        while let Some(Reverse((expiry, generation, key))) = self.backoff.peek().cloned() {
            if expiry > now {
                break;
            }
            self.backoff.pop();
            if self
                .pods
                .get(&key)
                .is_some_and(|p| p.location == Location::Backoff && p.generation == generation)
            {
                self.push_active(&key, now);
            }
        }
        if self
            .last_unschedulable_flush
            .is_none_or(|t| now.duration_since(t) >= UNSCHEDULABLE_FLUSH_PERIOD)
        {
            self.last_unschedulable_flush = Some(now);
            let stale: Vec<String> = self
                .unschedulable
                .iter()
                .filter(|k| {
                    self.pods.get(*k).is_some_and(|p| {
                        p.unschedulable_since
                            .is_some_and(|t| now.duration_since(t) >= MAX_IN_UNSCHEDULABLE)
                    })
                })
                .cloned()
                .collect();
            for key in stale {
                self.push_backoff(&key, now);
            }
        }
    }

    /// How long until [`Self::flush`] has something to do; `None` when no pod waits out a
    /// backoff or sits unschedulable, so an idle scheduler sleeps until an event.
    pub fn next_wakeup(&self, now: Instant) -> Option<Duration> {
        let backoff = self
            .backoff
            .peek()
            .map(|Reverse((expiry, _, _))| expiry.saturating_duration_since(now));
        let flush = (!self.unschedulable.is_empty()).then_some(UNSCHEDULABLE_FLUSH_PERIOD);
        match (backoff, flush) {
            (Some(backoff), Some(flush)) => Some(backoff.min(flush)),
            (backoff, flush) => backoff.or(flush),
        }
    }

    /// Pods waiting (not in flight) with their nominated node, for the nominator.
    pub fn pods(&self) -> impl Iterator<Item = &QueuedPod> {
        self.pods.values()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(name: &str, priority: i32) -> Arc<PodInfo> {
        let pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"priority": priority, "containers": [{"name": "c", "image": "x"}]},
        }))
        .expect("pod");
        Arc::new(PodInfo::new(Arc::new(pod)))
    }

    #[test]
    fn an_empty_queue_never_wakes_the_scheduler() {
        let start = Instant::now();
        let mut queue = SchedulingQueue::default();
        assert_eq!(queue.next_wakeup(start), None);
        queue.add_or_update(pod("p", 0), start);
        assert_eq!(
            queue.next_wakeup(start),
            None,
            "an active pod needs no timer"
        );
    }

    #[test]
    fn priority_then_time_order_active_queue() {
        let start = Instant::now();
        let mut queue = SchedulingQueue::new();
        queue.add_or_update(pod("low", 0), start);
        queue.add_or_update(pod("high", 100), start + Duration::from_millis(1));
        queue.add_or_update(pod("low-later", 0), start + Duration::from_millis(2));
        let order: Vec<String> = std::iter::from_fn(|| queue.pop(start))
            .map(|p| p.info.name.clone())
            .collect();
        assert_eq!(order, ["high", "low", "low-later"]);
    }

    #[test]
    fn backoff_doubles_to_ten_seconds() {
        let mut queued = QueuedPod {
            info: pod("p", 0),
            timestamp: Instant::now(),
            attempts: 1,
            last_attempt: None,
            unschedulable_since: None,
            unschedulable_plugins: BTreeSet::new(),
            cycle: 0,
            location: Location::Active,
            generation: 0,
        };
        let mut seen = Vec::new();
        for attempts in 1..=6 {
            queued.attempts = attempts;
            seen.push(queued.backoff_duration().as_secs());
        }
        assert_eq!(seen, [1, 2, 4, 8, 10, 10]);
    }

    #[test]
    fn unschedulable_pods_move_on_matching_events_and_after_backoff() {
        let start = Instant::now();
        let mut queue = SchedulingQueue::new();
        queue.add_or_update(pod("p", 0), start);
        let popped = queue.pop(start).expect("popped");
        queue.add_unschedulable(&popped.info.key, BTreeSet::from(["NodeAffinity"]), start);
        assert_eq!(
            queue.get("default/p").map(|p| p.location),
            Some(Location::Unschedulable)
        );
        // An event that cannot help NodeAffinity leaves it there.
        queue.move_on_event(Some(&["InterPodAffinity"]), start);
        assert_eq!(
            queue.get("default/p").map(|p| p.location),
            Some(Location::Unschedulable)
        );
        // A node update can: it waits out its 1 s backoff, then is active again.
        queue.move_on_event(None, start + Duration::from_millis(100));
        assert_eq!(
            queue.get("default/p").map(|p| p.location),
            Some(Location::Backoff)
        );
        queue.flush(start + Duration::from_millis(500));
        assert!(queue.pop(start + Duration::from_millis(500)).is_none());
        queue.flush(start + Duration::from_secs(1));
        assert_eq!(
            queue
                .pop(start + Duration::from_secs(1))
                .map(|p| p.attempts),
            Some(2)
        );
    }

    #[test]
    fn an_event_during_the_cycle_sends_the_pod_to_backoff() {
        let start = Instant::now();
        let mut queue = SchedulingQueue::new();
        queue.add_or_update(pod("p", 0), start);
        let popped = queue.pop(start).expect("popped");
        queue.move_on_event(None, start);
        queue.add_unschedulable(
            &popped.info.key,
            BTreeSet::from(["NodeResourcesFit"]),
            start,
        );
        assert_eq!(
            queue.get("default/p").map(|p| p.location),
            Some(Location::Backoff)
        );
    }

    #[test]
    fn unschedulable_pods_are_flushed_after_five_minutes() {
        let start = Instant::now();
        let mut queue = SchedulingQueue::new();
        queue.add_or_update(pod("p", 0), start);
        let popped = queue.pop(start).expect("popped");
        queue.add_unschedulable(&popped.info.key, BTreeSet::from(["NodeAffinity"]), start);
        queue.flush(start + Duration::from_secs(60));
        assert_eq!(
            queue.get("default/p").map(|p| p.location),
            Some(Location::Unschedulable)
        );
        queue.flush(start + MAX_IN_UNSCHEDULABLE);
        assert_eq!(
            queue.get("default/p").map(|p| p.location),
            Some(Location::Active)
        );
    }
}
