//! The fault suite's checker: from the recorded history of writes, reads, lists and watch
//! events, the acknowledged writes lost, the reads that saw a stale value, the updates applied
//! on a stale `resourceVersion`, and the watch events missing or out of order.
//!
//! Every ConfigMap the workload checks is written by one client only, one operation at a time,
//! so each is a single-writer register whose writes are ordered by their sequence numbers. For
//! such registers linearizability reduces to a rule per read (Gibbons and Korach's
//! single-writer case, as porcupine would find it by search): a read invoked at `i` and
//! completed at `c` may return the value of write `w` (or the absence a delete or the start
//! leaves) only if `w` was invoked before `c`, did not fail, and no later write was
//! acknowledged before `i`; and of two reads one after the other in real time, the second may
//! not return an earlier write than the first. A write whose answer never came (a timeout, a
//! dropped connection, a 5xx) may or may not have happened: both are allowed. The shared
//! counter checks that no update was applied on a stale `resourceVersion`: each acknowledged
//! increment was a compare-and-swap, so the final count must lie between the increments
//! acknowledged and those plus the ones whose answer was lost.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

/// What a write's answer said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged: it happened.
    Ok,
    /// Refused with a definite answer (409, 404, 422, 429): it did not happen.
    Failed,
    /// No answer (timeout, connection lost, 5xx): it may have happened.
    Unknown,
}

/// One write to a register: a create, update or server-side apply leaves `Some(seq)`, a
/// delete leaves `None`.
#[derive(Clone, Debug)]
pub struct Write {
    pub key: String,
    pub seq: u64,
    pub present: bool,
    pub invoked: f64,
    pub completed: f64,
    pub outcome: Outcome,
    /// What the write was and where it went (`update via r1`), and the `resourceVersion` its
    /// answer carried.
    pub what: String,
    pub resource_version: Option<u64>,
}

/// One read of a register (a GET, or the register's entry in a list): `Some(seq)` is the
/// value of write `seq`, `None` the register's absence.
#[derive(Clone, Debug)]
pub struct Read {
    pub key: String,
    pub observed: Option<u64>,
    pub invoked: f64,
    pub completed: f64,
    /// The read after the faults healed: a wrong answer here is a lost write.
    pub fin: bool,
    pub what: String,
}

/// One event of a watch, as received.
#[derive(Clone, Debug)]
pub struct WatchEvent {
    pub key: String,
    /// ADDED and MODIFIED: the value's sequence number; DELETED: the value it deleted.
    pub seq: u64,
    pub deleted: bool,
    pub resource_version: u64,
}

/// One watcher's life: each epoch starts with a list (at first, and after `410 Gone`) and
/// goes on with the events of every watch resumed from the last `resourceVersion` seen.
#[derive(Clone, Debug, Default)]
pub struct Watcher {
    pub name: String,
    /// The keys it watches start with this (its tenant's).
    pub prefix: String,
    pub epochs: Vec<Epoch>,
}

#[derive(Clone, Debug, Default)]
pub struct Epoch {
    pub list_resource_version: u64,
    pub listed: BTreeMap<String, u64>,
    pub events: Vec<WatchEvent>,
    /// Each watch after the first: the number of events before it, and its `resourceVersion`.
    pub resumes: Vec<(usize, u64)>,
}

/// The increments of the shared counter.
#[derive(Clone, Debug, Default)]
pub struct Counter {
    pub acknowledged: u64,
    pub unknown: u64,
    pub final_value: u64,
}

/// One anomaly: what, and when the operation that shows it was invoked (ms from the start).
#[derive(Clone, Debug)]
pub struct Anomaly {
    pub at: f64,
    pub kind: Kind,
    pub detail: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Lost,
    StaleRead,
    StaleUpdate,
    WatchGap,
    WatchOrder,
}

/// The whole history of one run.
#[derive(Default)]
pub struct History {
    pub writes: Vec<Write>,
    pub reads: Vec<Read>,
    pub watchers: Vec<Watcher>,
    pub counters: Vec<(String, Counter)>,
    /// The final state per key, as every watcher must end up seeing it.
    pub final_state: BTreeMap<String, Option<u64>>,
}

impl History {
    /// Every anomaly in the history.
    pub fn check(&self) -> Vec<Anomaly> {
        let mut anomalies = Vec::new();
        let mut writes: HashMap<&str, Vec<&Write>> = HashMap::new();
        for write in &self.writes {
            writes.entry(&write.key).or_default().push(write);
        }
        for list in writes.values_mut() {
            list.sort_by_key(|w| w.seq);
        }
        self.check_reads(&writes, &mut anomalies);
        for watcher in &self.watchers {
            check_watcher(watcher, &writes, &self.final_state, &mut anomalies);
        }
        for (name, counter) in &self.counters {
            if counter.final_value < counter.acknowledged
                || counter.final_value > counter.acknowledged + counter.unknown
            {
                anomalies.push(Anomaly {
                    at: 0.0,
                    kind: Kind::StaleUpdate,
                    detail: format!(
                        "counter {name} reads {} after {} acknowledged and {} unanswered \
                         increments",
                        counter.final_value, counter.acknowledged, counter.unknown
                    ),
                });
            }
        }
        anomalies
    }

    fn check_reads(&self, writes: &HashMap<&str, Vec<&Write>>, anomalies: &mut Vec<Anomaly>) {
        let none = Vec::new();
        let mut reads: Vec<(usize, &Read)> = self.reads.iter().enumerate().collect();
        reads.sort_by(|a, b| a.1.invoked.total_cmp(&b.1.invoked));
        let mut by_key: HashMap<&str, ReadOrder> = HashMap::new();
        for (index, read) in reads {
            let key_writes = writes.get(read.key.as_str()).unwrap_or(&none);
            let kind = if read.fin {
                Kind::Lost
            } else {
                Kind::StaleRead
            };
            let Some(position) = position_of(key_writes, read.observed) else {
                anomalies.push(Anomaly {
                    at: read.invoked,
                    kind,
                    detail: format!(
                        "{} of {} saw {:?}, which no write left{}",
                        read.what,
                        read.key,
                        read.observed,
                        refused(key_writes, read.observed)
                    ),
                });
                continue;
            };
            if !possible(key_writes, position, read.invoked, read.completed) {
                anomalies.push(Anomaly {
                    at: read.invoked,
                    kind,
                    detail: format!(
                        "{} of {} at {:.0}–{:.0} ms saw {} though {} was acknowledged \
                         before{}",
                        read.what,
                        read.key,
                        read.invoked,
                        read.completed,
                        describe(key_writes, position),
                        describe_latest_acknowledged(key_writes, read.invoked),
                        key_writes
                            .iter()
                            .rev()
                            .find(|w| w.outcome == Outcome::Ok && w.completed < read.invoked)
                            .map(|w| following(key_writes, w.seq))
                            .unwrap_or_default()
                    ),
                });
                continue;
            }
            // The furthest write any read that finished before this one began had seen: this
            // one may not return an earlier one.
            let order = by_key.entry(&read.key).or_default();
            while let Some(Reverse((finished, _, _))) = order.pending.peek()
                && (*finished as f64) / 1000.0 < read.invoked
            {
                if let Some(Reverse((_, seen, index))) = order.pending.pop()
                    && order.floor.is_none_or(|(floor, _)| seen > floor)
                {
                    order.floor = Some((seen, index));
                }
            }
            let latest = latest_possible(key_writes, position, read.invoked, read.completed);
            if let Some((floor, index)) = order.floor
                && floor > ordinal(latest)
            {
                let before = &self.reads[index];
                anomalies.push(Anomaly {
                    at: read.invoked,
                    kind,
                    detail: format!(
                        "{} of {} saw {} after an earlier {} had seen write {}",
                        read.what,
                        read.key,
                        describe(key_writes, position),
                        before.what,
                        before
                            .observed
                            .map_or("none".to_string(), |s| s.to_string())
                    ),
                });
            }
            let earliest = earliest_possible(key_writes, position, read.invoked, read.completed);
            order.pending.push(Reverse((
                (read.completed * 1000.0) as i64,
                ordinal(earliest),
                index,
            )));
        }
    }
}

/// Per key, the reads in real-time order: those not yet known to have finished before the
/// current one began (by completion: microseconds, write ordinal, read index), and the
/// furthest write seen by one that had.
#[derive(Default)]
struct ReadOrder {
    pending: BinaryHeap<Reverse<(i64, i64, usize)>>,
    floor: Option<(i64, usize)>,
}

/// Which write a read's value is: `Start` for the absence before any write, `At(i)` for
/// `writes[i]`. An absence is the latest delete that may explain it, or the start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Position {
    Start,
    At(usize),
    /// Absent: any of the deletes, or the start (resolved by `possible`).
    Absent,
}

fn ordinal(position: Position) -> i64 {
    match position {
        Position::Start | Position::Absent => -1,
        Position::At(i) => i as i64,
    }
}

fn position_of(writes: &[&Write], observed: Option<u64>) -> Option<Position> {
    match observed {
        None => Some(Position::Absent),
        Some(seq) => writes
            .iter()
            .position(|w| w.seq == seq && w.present && w.outcome != Outcome::Failed)
            .map(Position::At),
    }
}

/// Whether the register may hold `position`'s value for a read over `[invoked, completed]`.
fn possible(writes: &[&Write], position: Position, invoked: f64, completed: f64) -> bool {
    let last = last_acknowledged(writes, invoked);
    match position {
        Position::Start => last.is_none(),
        Position::At(i) => writes[i].invoked < completed && last.is_none_or(|l| l <= i),
        Position::Absent => {
            last.is_none()
                || (last.unwrap_or(0)..writes.len())
                    .any(|i| !writes[i].present && possible_delete(writes, i, invoked, completed))
        }
    }
}

/// The last write acknowledged before `before`. One writer writes a key one operation at a
/// time, so completions grow with the index: a binary search finds where they pass `before`.
fn last_acknowledged(writes: &[&Write], before: f64) -> Option<usize> {
    let completed_before = writes.partition_point(|w| w.completed < before);
    (0..completed_before)
        .rev()
        .find(|&i| writes[i].outcome == Outcome::Ok)
}

/// An absence as the latest delete (or the start) that may explain a read over
/// `[invoked, completed]`; other positions as they are.
fn latest_possible(
    writes: &[&Write],
    position: Position,
    invoked: f64,
    completed: f64,
) -> Position {
    if position != Position::Absent {
        return position;
    }
    (0..writes.len())
        .rev()
        .find(|&i| !writes[i].present && possible_delete(writes, i, invoked, completed))
        .map_or(Position::Start, Position::At)
}

/// An absence as the earliest delete (or the start) that may explain a read.
fn earliest_possible(
    writes: &[&Write],
    position: Position,
    invoked: f64,
    completed: f64,
) -> Position {
    if position != Position::Absent {
        return position;
    }
    if possible(writes, Position::Start, invoked, completed) {
        return Position::Start;
    }
    (0..writes.len())
        .find(|&i| !writes[i].present && possible_delete(writes, i, invoked, completed))
        .map_or(Position::Start, Position::At)
}

fn possible_delete(writes: &[&Write], i: usize, invoked: f64, completed: f64) -> bool {
    writes[i].outcome != Outcome::Failed
        && writes[i].invoked < completed
        && last_acknowledged(writes, invoked).is_none_or(|l| l <= i)
}

fn describe(writes: &[&Write], position: Position) -> String {
    match position {
        Position::Start => "nothing".to_string(),
        Position::Absent => "no object".to_string(),
        Position::At(i) => format!("write {}", writes[i].seq),
    }
}

fn describe_latest_acknowledged(writes: &[&Write], before: f64) -> String {
    writes
        .iter()
        .rev()
        .find(|w| w.outcome == Outcome::Ok && w.completed < before)
        .map(|w| format!("{} {}", if w.present { "write" } else { "delete" }, w.seq))
        .unwrap_or_else(|| "nothing".to_string())
}

/// ": WHAT answered REFUSAL" when the value is a refused write's, as the anomaly's reason.
fn refused(writes: &[&Write], observed: Option<u64>) -> String {
    writes
        .iter()
        .find(|w| Some(w.seq) == observed)
        .map(|w| format!(" ({} answered {:?})", w.what, w.outcome))
        .unwrap_or_default()
}

/// The writes around the one of value `seq` (three before, three after), as an anomaly's
/// context.
fn following(writes: &[&Write], seq: u64) -> String {
    let at = writes.iter().position(|w| w.seq == seq).unwrap_or(0);
    let listed: Vec<String> = writes
        .iter()
        .skip(at.saturating_sub(3))
        .take(7)
        .map(|w| {
            format!(
                "{} {} {:?} {:.0}–{:.0} ms",
                w.seq, w.what, w.outcome, w.invoked, w.completed
            )
        })
        .collect();
    format!(" (writes around it: {})", listed.join("; "))
}

/// The write a watch event shows: ADDED/MODIFIED the write of its value; DELETED the first
/// delete after the value it removed that may have happened.
fn event_write(writes: &[&Write], event: &WatchEvent) -> Option<usize> {
    if event.deleted {
        // The deletes after the value it removed, up to the next acknowledged write of a value.
        // An acknowledged one is the one: had an unanswered one before it happened, the
        // acknowledged one (preconditioned on the value's resourceVersion) would have failed.
        let after = writes.iter().position(|w| w.seq == event.seq)?;
        let candidates: Vec<usize> = (after + 1..writes.len())
            .take_while(|&i| {
                i == after + 1 || !(writes[i - 1].present && writes[i - 1].outcome == Outcome::Ok)
            })
            .filter(|&i| !writes[i].present && writes[i].outcome != Outcome::Failed)
            .collect();
        candidates
            .iter()
            .copied()
            .find(|&i| writes[i].outcome == Outcome::Ok)
            .or_else(|| candidates.first().copied())
    } else {
        writes
            .iter()
            .position(|w| w.seq == event.seq && w.present && w.outcome != Outcome::Failed)
    }
}

fn check_watcher(
    watcher: &Watcher,
    writes: &HashMap<&str, Vec<&Write>>,
    final_state: &BTreeMap<String, Option<u64>>,
    anomalies: &mut Vec<Anomaly>,
) {
    let none = Vec::new();
    let mut last_resource_version = 0;
    let mut state: BTreeMap<String, u64> = BTreeMap::new();
    for (number, epoch) in watcher.epochs.iter().enumerate() {
        if epoch.list_resource_version < last_resource_version {
            anomalies.push(Anomaly {
                at: 0.0,
                kind: Kind::WatchOrder,
                detail: format!(
                    "{}: relist {number} at resourceVersion {} after events up to {}",
                    watcher.name, epoch.list_resource_version, last_resource_version
                ),
            });
        }
        last_resource_version = epoch.list_resource_version;
        state = epoch.listed.clone();
        // The last write each key was seen at in this epoch.
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (key, seq) in &epoch.listed {
            let key_writes = writes.get(key.as_str()).unwrap_or(&none);
            if let Some(i) = key_writes.iter().position(|w| w.seq == *seq) {
                seen.insert(key, i);
            }
        }
        // The event each key was last seen at, to name the resumes between two events.
        let mut seen_at: HashMap<&str, usize> = HashMap::new();
        for (position, event) in epoch.events.iter().enumerate() {
            let since = seen_at.insert(&event.key, position);
            let resumed = |from: Option<usize>| -> String {
                let resumes: Vec<String> = epoch
                    .resumes
                    .iter()
                    .filter(|(at, _)| from.is_none_or(|f| *at > f) && *at <= position)
                    .map(|(_, rv)| rv.to_string())
                    .collect();
                if resumes.is_empty() {
                    format!(
                        " (resourceVersion {}, in one watch)",
                        event.resource_version
                    )
                } else {
                    format!(
                        " (resourceVersion {}, resumed from {} between)",
                        event.resource_version,
                        resumes.join(", ")
                    )
                }
            };
            if event.resource_version <= last_resource_version {
                anomalies.push(Anomaly {
                    at: 0.0,
                    kind: Kind::WatchOrder,
                    detail: format!(
                        "{}: event for {} at resourceVersion {} after {}",
                        watcher.name, event.key, event.resource_version, last_resource_version
                    ),
                });
            }
            last_resource_version = last_resource_version.max(event.resource_version);
            if event.deleted {
                state.remove(&event.key);
            } else {
                state.insert(event.key.clone(), event.seq);
            }
            let Some(key_writes) = writes.get(event.key.as_str()) else {
                continue;
            };
            let Some(index) = event_write(key_writes, event) else {
                anomalies.push(Anomaly {
                    at: 0.0,
                    kind: Kind::WatchGap,
                    detail: format!(
                        "{}: an event for {} ({} {}) that no write made{}",
                        watcher.name,
                        event.key,
                        if event.deleted { "deleted" } else { "value" },
                        event.seq,
                        following(key_writes, event.seq)
                    ),
                });
                continue;
            };
            if let Some(previous) = seen.insert(&event.key, index) {
                if index <= previous {
                    anomalies.push(Anomaly {
                        at: key_writes[index].invoked,
                        kind: Kind::WatchOrder,
                        detail: format!(
                            "{}: {} went back from write {} to {}",
                            watcher.name,
                            event.key,
                            key_writes[previous].seq,
                            key_writes[index].seq
                        ),
                    });
                } else if let Some(skipped) = key_writes[previous + 1..index]
                    .iter()
                    .find(|w| w.outcome == Outcome::Ok)
                {
                    anomalies.push(Anomaly {
                        at: skipped.invoked,
                        kind: Kind::WatchGap,
                        detail: format!(
                            "{}: {} went from write {} to {}, missing acknowledged write {} \
                             ({} answered at resourceVersion {:?}){}",
                            watcher.name,
                            event.key,
                            key_writes[previous].seq,
                            key_writes[index].seq,
                            skipped.seq,
                            skipped.what,
                            skipped.resource_version,
                            resumed(since)
                        ),
                    });
                }
            }
        }
    }
    for (key, expected) in final_state {
        if !key.starts_with(&watcher.prefix) {
            continue;
        }
        let seen = state.get(key).copied();
        if seen != *expected {
            anomalies.push(Anomaly {
                at: 0.0,
                kind: Kind::WatchGap,
                detail: format!(
                    "{}: ended with {key} at {seen:?}, the store at {expected:?}",
                    watcher.name
                ),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(seq: u64, present: bool, invoked: f64, completed: f64, outcome: Outcome) -> Write {
        Write {
            key: "k".into(),
            seq,
            present,
            invoked,
            completed,
            outcome,
            what: String::new(),
            resource_version: None,
        }
    }

    fn read(observed: Option<u64>, invoked: f64, completed: f64) -> Read {
        Read {
            key: "k".into(),
            observed,
            invoked,
            completed,
            fin: false,
            what: "get".into(),
        }
    }

    fn kinds(history: &History) -> Vec<Kind> {
        history.check().into_iter().map(|a| a.kind).collect()
    }

    #[test]
    fn a_read_after_an_acknowledged_write_must_see_it_or_later() {
        let mut history = History {
            writes: vec![
                write(1, true, 0.0, 10.0, Outcome::Ok),
                write(2, true, 20.0, 30.0, Outcome::Ok),
            ],
            ..History::default()
        };
        history.reads = vec![read(Some(2), 31.0, 40.0), read(Some(1), 25.0, 28.0)];
        assert!(kinds(&history).is_empty());
        history.reads = vec![read(Some(1), 31.0, 40.0)];
        assert_eq!(kinds(&history), vec![Kind::StaleRead]);
        history.reads = vec![read(None, 11.0, 12.0)];
        assert_eq!(kinds(&history), vec![Kind::StaleRead]);
        // A value from a write not yet invoked is no more possible than an invented one.
        history.reads = vec![read(Some(2), 11.0, 12.0), read(Some(7), 11.0, 12.0)];
        assert_eq!(kinds(&history), vec![Kind::StaleRead, Kind::StaleRead]);
    }

    #[test]
    fn an_unanswered_write_may_or_may_not_have_happened_a_failed_one_did_not() {
        let mut history = History {
            writes: vec![
                write(1, true, 0.0, 10.0, Outcome::Ok),
                write(2, true, 20.0, 30.0, Outcome::Unknown),
                write(3, true, 40.0, 50.0, Outcome::Failed),
            ],
            ..History::default()
        };
        history.reads = vec![read(Some(1), 60.0, 70.0), read(Some(2), 80.0, 90.0)];
        assert!(kinds(&history).is_empty());
        history.reads = vec![read(Some(3), 60.0, 70.0)];
        assert_eq!(kinds(&history), vec![Kind::StaleRead]);
        // Once a later read saw write 2, an even later one may not go back to write 1.
        history.reads = vec![read(Some(2), 60.0, 70.0), read(Some(1), 80.0, 90.0)];
        assert_eq!(kinds(&history), vec![Kind::StaleRead]);
    }

    #[test]
    fn absence_is_explained_by_the_start_or_a_delete() {
        let mut history = History {
            writes: vec![
                write(1, true, 0.0, 10.0, Outcome::Ok),
                write(2, false, 20.0, 30.0, Outcome::Ok),
            ],
            ..History::default()
        };
        history.reads = vec![read(None, 31.0, 32.0), read(None, -5.0, 1.0)];
        assert!(kinds(&history).is_empty());
        // An absence after a read of write 1 is the delete's, not the start's.
        history.reads = vec![read(Some(1), 11.0, 12.0), read(None, 31.0, 32.0)];
        assert!(kinds(&history).is_empty());
        let mut lost = read(Some(1), 31.0, 32.0);
        lost.fin = true;
        history.reads = vec![lost];
        assert_eq!(kinds(&history), vec![Kind::Lost]);
    }

    #[test]
    fn a_watch_may_not_skip_an_acknowledged_write_or_go_back() {
        let history = |events: Vec<(u64, bool, u64)>, final_state: Option<u64>| History {
            writes: vec![
                write(1, true, 0.0, 10.0, Outcome::Ok),
                write(2, true, 20.0, 30.0, Outcome::Ok),
                write(3, true, 40.0, 50.0, Outcome::Unknown),
                write(4, false, 60.0, 70.0, Outcome::Ok),
            ],
            watchers: vec![Watcher {
                name: "w".into(),
                prefix: "k".into(),
                epochs: vec![Epoch {
                    list_resource_version: 5,
                    listed: BTreeMap::from([("k".to_string(), 1)]),
                    events: events
                        .into_iter()
                        .map(|(seq, deleted, resource_version)| WatchEvent {
                            key: "k".into(),
                            seq,
                            deleted,
                            resource_version,
                        })
                        .collect(),
                    resumes: Vec::new(),
                }],
            }],
            final_state: BTreeMap::from([("k".to_string(), final_state)]),
            ..History::default()
        };
        // The unanswered write 3 may be skipped (it did not happen), write 2 may not.
        assert!(kinds(&history(vec![(2, false, 6), (2, true, 7)], None)).is_empty());
        assert!(
            kinds(&history(
                vec![(2, false, 6), (3, false, 7), (3, true, 8)],
                None
            ))
            .is_empty()
        );
        assert_eq!(
            kinds(&history(vec![(3, false, 7), (3, true, 8)], None)),
            vec![Kind::WatchGap]
        );
        assert_eq!(
            kinds(&history(vec![(2, false, 6), (2, true, 6)], None)),
            vec![Kind::WatchOrder]
        );
        // A watcher that ends somewhere else than the store missed something.
        assert_eq!(
            kinds(&history(vec![(2, false, 6)], None)),
            vec![Kind::WatchGap]
        );
    }

    #[test]
    fn the_counter_counts_every_acknowledged_increment_once() {
        let counter = |final_value| History {
            counters: vec![(
                "c".into(),
                Counter {
                    acknowledged: 10,
                    unknown: 2,
                    final_value,
                },
            )],
            ..History::default()
        };
        for fine in [10, 11, 12] {
            assert!(kinds(&counter(fine)).is_empty());
        }
        assert_eq!(kinds(&counter(9)), vec![Kind::StaleUpdate]);
        assert_eq!(kinds(&counter(13)), vec![Kind::StaleUpdate]);
    }
}
