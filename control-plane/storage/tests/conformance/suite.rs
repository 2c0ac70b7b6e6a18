//! The conformance cases: what every `Storage` backend must do, written once over `dyn Storage`.
//!
//! Each case gets a fresh key prefix and must not look outside it (the etcd under it is shared),
//! except where noted.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use bytes::Bytes;
use flotilla_storage::{
    EventKind, KeyValue, Outcome, ProgressRequester, RangeRequest, Revision, Storage, StorageError,
    WatchEvent, WatchResponse, WatchStream,
};
use futures::StreamExt;

pub type Store = Arc<dyn Storage>;

const WAIT: Duration = Duration::from_secs(20);

pub fn value(text: &str) -> Bytes {
    Bytes::copy_from_slice(text.as_bytes())
}

pub fn done(outcome: Outcome<KeyValue>) -> anyhow::Result<KeyValue> {
    match outcome {
        Outcome::Done(kv) => Ok(kv),
        Outcome::Conflict(current) => bail!("unexpected conflict, current state {current:?}"),
    }
}

fn conflict(outcome: Outcome<KeyValue>) -> anyhow::Result<Option<KeyValue>> {
    match outcome {
        Outcome::Conflict(current) => Ok(current),
        Outcome::Done(kv) => bail!("expected a conflict, the write happened: {kv:?}"),
    }
}

pub async fn next_response(stream: &mut WatchStream) -> anyhow::Result<WatchResponse> {
    match tokio::time::timeout(WAIT, stream.next()).await {
        Err(_) => bail!("no watch response within {WAIT:?}"),
        Ok(None) => bail!("watch ended"),
        Ok(Some(response)) => Ok(response?),
    }
}

/// A watch read event by event, however the backend groups events into responses.
pub struct Watcher {
    stream: WatchStream,
    pending: VecDeque<WatchEvent>,
}

impl Watcher {
    pub fn new(stream: WatchStream) -> Self {
        Self {
            stream,
            pending: VecDeque::new(),
        }
    }

    /// The next `count` events.
    pub async fn take(&mut self, count: usize) -> anyhow::Result<Vec<WatchEvent>> {
        while self.pending.len() < count {
            let response = next_response(&mut self.stream)
                .await
                .with_context(|| format!("after {} of {count} events", self.pending.len()))?;
            ensure!(
                response.events.last().map(|e| e.kv.mod_revision) <= Some(response.revision),
                "response revision {} is below its events",
                response.revision
            );
            self.pending.extend(response.events);
        }
        Ok(self.pending.drain(..count).collect())
    }

    /// Nothing more arrives within `wait`.
    pub async fn expect_quiet(&mut self, wait: Duration) -> anyhow::Result<()> {
        ensure!(
            self.pending.is_empty(),
            "unexpected events: {:?}",
            self.pending
        );
        match tokio::time::timeout(wait, self.stream.next()).await {
            Err(_) => Ok(()),
            Ok(item) => bail!("expected no watch response, got {item:?}"),
        }
    }
}

fn range(prefix: &str, limit: usize, revision: Revision) -> RangeRequest {
    RangeRequest {
        prefix: prefix.to_owned(),
        start_key: None,
        limit,
        revision,
    }
}

fn keys(kvs: &[KeyValue]) -> Vec<&str> {
    kvs.iter().map(|kv| kv.key.as_str()).collect()
}

pub async fn create_and_get(store: Store, p: &str) -> anyhow::Result<()> {
    let key = format!("{p}a");
    let created = done(store.create(&key, value("v1")).await?)?;
    ensure!(created.key == key && created.value == "v1");
    ensure!(created.create_revision > 0 && created.create_revision <= created.mod_revision);
    ensure!(store.get(&key).await? == Some(created.clone()));

    let current = conflict(store.create(&key, value("v2")).await?)?;
    ensure!(
        current == Some(created.clone()),
        "conflict carries the current state: {current:?}"
    );
    ensure!(
        store.get(&key).await? == Some(created.clone()),
        "a failed create changes nothing"
    );

    ensure!(store.get(&format!("{p}missing")).await?.is_none());
    ensure!(store.current_revision().await? >= created.mod_revision);
    Ok(())
}

pub async fn update_is_compare_and_swap(store: Store, p: &str) -> anyhow::Result<()> {
    let key = format!("{p}a");
    let first = done(store.create(&key, value("v1")).await?)?;

    let stale = conflict(
        store
            .update(&key, value("v2"), first.mod_revision + 1000)
            .await?,
    )?;
    ensure!(stale == Some(first.clone()));

    let second = done(store.update(&key, value("v2"), first.mod_revision).await?)?;
    ensure!(second.value == "v2");
    ensure!(second.create_revision == first.create_revision);
    ensure!(second.mod_revision > first.mod_revision);
    ensure!(store.get(&key).await? == Some(second.clone()));

    let lost = conflict(store.update(&key, value("v3"), first.mod_revision).await?)?;
    ensure!(
        lost == Some(second.clone()),
        "a second writer with the old revision must lose"
    );

    let absent = format!("{p}absent");
    for expected in [0, 1, second.mod_revision] {
        let current = conflict(store.update(&absent, value("x"), expected).await?)?;
        ensure!(
            current.is_none(),
            "update of an absent key, expected {expected}: {current:?}"
        );
    }
    ensure!(
        store.get(&absent).await?.is_none(),
        "an update must never create a key"
    );
    Ok(())
}

pub async fn delete_with_and_without_precondition(store: Store, p: &str) -> anyhow::Result<()> {
    let key = format!("{p}a");
    ensure!(conflict(store.delete(&key, None).await?)?.is_none());
    ensure!(conflict(store.delete(&key, Some(3)).await?)?.is_none());

    let first = done(store.create(&key, value("v1")).await?)?;
    let current = conflict(store.delete(&key, Some(first.mod_revision + 1000)).await?)?;
    ensure!(current == Some(first.clone()));
    ensure!(store.get(&key).await? == Some(first.clone()));

    let deleted = done(store.delete(&key, Some(first.mod_revision)).await?)?;
    ensure!(deleted.key == key && deleted.value == "v1");
    ensure!(deleted.create_revision == first.create_revision);
    ensure!(
        deleted.mod_revision > first.mod_revision,
        "delete reports its own revision"
    );
    ensure!(store.get(&key).await?.is_none());

    let again = done(store.create(&key, value("v2")).await?)?;
    ensure!(
        again.create_revision > deleted.mod_revision,
        "a re-created key starts a new life"
    );
    let deleted = done(store.delete(&key, None).await?)?;
    ensure!(deleted.value == "v2" && deleted.mod_revision > again.mod_revision);
    ensure!(store.get(&key).await?.is_none());
    Ok(())
}

pub async fn range_pages_at_a_fixed_revision_under_concurrent_writes(
    store: Store,
    p: &str,
) -> anyhow::Result<()> {
    let mut originals = Vec::new();
    for i in 0..10 {
        originals.push(done(
            store
                .create(&format!("{p}k{i:02}"), value(&format!("v0-{i}")))
                .await?,
        )?);
    }
    // Shares the prefix's characters but not its trailing slash: never part of the range.
    done(
        store
            .create(&format!("{}sibling", p.trim_end_matches('/')), value("x"))
            .await?,
    )?;

    let first = store.range(range(p, 4, 0)).await?;
    ensure!(keys(&first.kvs) == ["k00", "k01", "k02", "k03"].map(|k| format!("{p}{k}")));
    ensure!(
        first.more && first.count == 10,
        "first page: more={} count={}",
        first.more,
        first.count
    );
    let at = first.revision;
    ensure!(at >= originals[9].mod_revision);

    // Writers keep changing the range while the pages are read.
    let writer = {
        let (store, p) = (store.clone(), p.to_owned());
        tokio::spawn(async move {
            for i in 0..40 {
                let key = format!("{p}k08");
                if let Some(kv) = store.get(&key).await? {
                    store
                        .update(&key, value(&format!("busy-{i}")), kv.mod_revision)
                        .await?;
                }
                store.create(&format!("{p}new-{i:02}"), value("n")).await?;
            }
            anyhow::Ok(())
        })
    };
    done(
        store
            .update(
                &format!("{p}k05"),
                value("changed"),
                originals[5].mod_revision,
            )
            .await?,
    )?;
    done(store.delete(&format!("{p}k07"), None).await?)?;
    done(store.delete(&format!("{p}k01"), None).await?)?;
    done(store.create(&format!("{p}k035"), value("inserted")).await?)?;

    let mut pages = vec![first];
    while pages.last().is_some_and(|page| page.more) {
        let last_key = pages
            .last()
            .and_then(|page| page.kvs.last())
            .map(|kv| kv.key.clone())
            .context("a page with more has keys")?;
        let mut request = range(p, 4, at);
        request.start_key = Some(format!("{last_key}\0"));
        let page = store.range(request).await?;
        ensure!(
            page.revision == at,
            "a page at revision {at} reports {}",
            page.revision
        );
        ensure!(pages.len() < 10, "pagination does not end");
        pages.push(page);
    }
    let counts: Vec<usize> = pages.iter().map(|page| page.count).collect();
    ensure!(
        counts == [10, 6, 2],
        "counts from each start key: {counts:?}"
    );
    let seen: Vec<KeyValue> = pages.into_iter().flat_map(|page| page.kvs).collect();
    ensure!(
        seen == originals,
        "the pages must be the snapshot at {at}: {seen:?}"
    );

    let unpaged = store.range(range(p, 0, at)).await?;
    ensure!(unpaged.kvs == originals && !unpaged.more && unpaged.count == 10);

    writer.await??;
    let now = store.range(range(p, 0, 0)).await?;
    let now_keys: BTreeSet<&str> = now.kvs.iter().map(|kv| kv.key.as_str()).collect();
    for gone in ["k01", "k07"] {
        ensure!(
            !now_keys.contains(format!("{p}{gone}").as_str()),
            "{gone} was deleted"
        );
    }
    for added in ["k035", "new-00", "new-39"] {
        ensure!(
            now_keys.contains(format!("{p}{added}").as_str()),
            "{added} was created"
        );
    }
    ensure!(now.count == 10 - 2 + 1 + 40 && now.kvs.len() == now.count && !now.more);
    ensure!(now.revision >= at);
    Ok(())
}

pub async fn range_counts_from_the_start_key(store: Store, p: &str) -> anyhow::Result<()> {
    for name in ["a", "b", "c", "d", "e"] {
        done(store.create(&format!("{p}{name}"), value(name)).await?)?;
    }
    let page = store.range(range(p, 2, 0)).await?;
    ensure!(page.kvs.len() == 2 && page.more && page.count == 5);

    let mut from_c = range(p, 0, 0);
    from_c.start_key = Some(format!("{p}c"));
    let rest = store.range(from_c).await?;
    ensure!(keys(&rest.kvs) == ["c", "d", "e"].map(|k| format!("{p}{k}")));
    ensure!(!rest.more && rest.count == 3);

    for limit in [5, 10] {
        let all = store.range(range(p, limit, 0)).await?;
        ensure!(
            all.kvs.len() == 5 && !all.more && all.count == 5,
            "limit {limit}"
        );
    }

    // A start key before the prefix is the prefix itself.
    let mut early = range(p, 0, 0);
    early.start_key = Some("/".to_owned());
    ensure!(store.range(early).await?.count == 5);

    let empty = store.range(range(&format!("{p}nothing/"), 10, 0)).await?;
    ensure!(empty.kvs.is_empty() && !empty.more && empty.count == 0);
    ensure!(empty.revision > 0 && empty.revision <= store.current_revision().await?);
    Ok(())
}

pub async fn range_rejects_a_future_revision(store: Store, p: &str) -> anyhow::Result<()> {
    // Far enough ahead that the tests writing to the same store meanwhile cannot reach it (a
    // backend's revisions need not be consecutive).
    const AHEAD: Revision = 1_000_000_000;
    let current = store.current_revision().await?;
    match store.range(range(p, 0, current + AHEAD)).await {
        Err(StorageError::FutureRevision {
            requested,
            current: reported,
        }) => {
            ensure!(requested == current + AHEAD && reported >= current);
        }
        other => bail!("expected FutureRevision, got {other:?}"),
    }
    // The current revision itself is readable.
    ensure!(store.range(range(p, 0, current)).await?.revision == current);
    Ok(())
}

pub async fn watch_replays_history_then_follows_live_writes(
    store: Store,
    p: &str,
) -> anyhow::Result<()> {
    let (k1, k2) = (format!("{p}k1"), format!("{p}k2"));
    let c1 = done(store.create(&k1, value("v1")).await?)?;
    let u1 = done(store.update(&k1, value("v2"), c1.mod_revision).await?)?;
    let d1 = done(store.delete(&k1, None).await?)?;
    let c2 = done(store.create(&k2, value("w1")).await?)?;

    let mut watch = Watcher::new(store.watch(p, c1.mod_revision).await?);
    let replayed = watch.take(4).await?;
    let summary: Vec<(EventKind, &str, Revision)> = replayed
        .iter()
        .map(|e| (e.kind, e.kv.key.as_str(), e.kv.mod_revision))
        .collect();
    ensure!(
        summary
            == [
                (EventKind::Put, k1.as_str(), c1.mod_revision),
                (EventKind::Put, k1.as_str(), u1.mod_revision),
                (EventKind::Delete, k1.as_str(), d1.mod_revision),
                (EventKind::Put, k2.as_str(), c2.mod_revision),
            ],
        "replayed {summary:?}"
    );
    ensure!(replayed[0].kv == c1 && replayed[0].prev.is_none());
    ensure!(replayed[1].kv == u1 && replayed[1].prev == Some(c1.clone()));
    ensure!(replayed[2].kv.value.is_empty() && replayed[2].prev == Some(u1.clone()));
    ensure!(replayed[3].kv == c2 && replayed[3].prev.is_none());

    let u2 = done(store.update(&k2, value("w2"), c2.mod_revision).await?)?;
    let live = watch.take(1).await?;
    ensure!(live[0].kind == EventKind::Put && live[0].kv == u2 && live[0].prev == Some(c2.clone()));

    // Starting in the middle of history replays from exactly there.
    let mut from_middle = Watcher::new(store.watch(p, u1.mod_revision).await?);
    let first = from_middle.take(1).await?;
    ensure!(first[0].kv == u1 && first[0].prev == Some(c1));
    Ok(())
}

pub async fn watch_from_zero_starts_after_the_current_revision(
    store: Store,
    p: &str,
) -> anyhow::Result<()> {
    done(store.create(&format!("{p}before"), value("x")).await?)?;
    let mut watch = Watcher::new(store.watch(p, 0).await?);
    let after = done(store.create(&format!("{p}after"), value("y")).await?)?;
    let seen = watch.take(1).await?;
    ensure!(seen[0].kv == after, "saw {seen:?}");
    Ok(())
}

pub async fn watch_sees_only_its_prefix(store: Store, p: &str) -> anyhow::Result<()> {
    let watched = format!("{p}a/");
    let start = store.current_revision().await? + 1;
    let mut live = Watcher::new(store.watch(&watched, 0).await?);
    for other in [
        format!("{p}b/x"),
        format!("{p}ab"),
        format!("{p}a"),
        format!("{p}a0"),
    ] {
        done(store.create(&other, value("other")).await?)?;
    }
    let x = done(store.create(&format!("{watched}x"), value("mine")).await?)?;
    done(store.create(&format!("{p}ab/y"), value("other")).await?)?;
    let y = done(store.create(&format!("{watched}y"), value("mine")).await?)?;

    let seen = live.take(2).await?;
    ensure!(
        seen[0].kv == x && seen[1].kv == y,
        "live watch saw {seen:?}"
    );
    live.expect_quiet(Duration::from_millis(300)).await?;

    let mut replay = Watcher::new(store.watch(&watched, start).await?);
    let seen = replay.take(2).await?;
    ensure!(
        seen[0].kv == x && seen[1].kv == y,
        "replaying watch saw {seen:?}"
    );
    replay.expect_quiet(Duration::from_millis(300)).await?;
    Ok(())
}

/// Reads `stream` until a response reaches `revision`, asking for progress now and then (etcd
/// answers a request only once its watches are synced, and drops it otherwise); returns the
/// events it saw on the way.
async fn progress_through(
    stream: &mut WatchStream,
    progress: &ProgressRequester,
    revision: Revision,
) -> anyhow::Result<Vec<WatchEvent>> {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut events = Vec::new();
    loop {
        progress.request();
        match tokio::time::timeout_at(
            deadline.min(tokio::time::Instant::now() + Duration::from_millis(200)),
            stream.next(),
        )
        .await
        {
            Ok(Some(response)) => {
                let response = response?;
                events.extend(response.events);
                if response.revision >= revision {
                    return Ok(events);
                }
            }
            Ok(None) => bail!("watch ended"),
            Err(_) if tokio::time::Instant::now() >= deadline => {
                bail!("no progress to revision {revision} within {WAIT:?}")
            }
            Err(_) => {}
        }
    }
}

pub async fn progress_reports_cover_writes_outside_the_prefix(
    store: Store,
    p: &str,
) -> anyhow::Result<()> {
    let watched = format!("{p}a/");
    let (mut stream, progress) = store.watch_with_progress(&watched, 0).await?;
    let mine = done(store.create(&format!("{watched}x"), value("mine")).await?)?;
    for n in 0..5 {
        done(store.create(&format!("{p}b/{n}"), value("other")).await?)?;
    }
    let current = store.current_revision().await?;
    let seen = progress_through(&mut stream, &progress, current).await?;
    ensure!(
        seen.len() == 1 && seen[0].kv == mine,
        "the watch saw {seen:?} on its way to the current revision"
    );
    // Asked again with nothing new, it answers at once, without events.
    let current = store.current_revision().await?;
    let seen = progress_through(&mut stream, &progress, current).await?;
    ensure!(seen.is_empty(), "an idle watch's progress carried {seen:?}");
    // Its events still come after the reports.
    let later = done(store.create(&format!("{watched}y"), value("mine")).await?)?;
    let mut events = Vec::new();
    while events.is_empty() {
        events = next_response(&mut stream).await?.events;
    }
    ensure!(
        events[0].kv == later,
        "after progress the watch saw {events:?}"
    );
    Ok(())
}

pub async fn delete_events_carry_the_previous_state(store: Store, p: &str) -> anyhow::Result<()> {
    let key = format!("{p}k");
    let created = done(store.create(&key, value("v1")).await?)?;
    let updated = done(
        store
            .update(&key, value("v2"), created.mod_revision)
            .await?,
    )?;
    let mut watch = Watcher::new(store.watch(p, 0).await?);
    let deleted = done(store.delete(&key, Some(updated.mod_revision)).await?)?;

    let seen = watch.take(1).await?;
    let event = &seen[0];
    ensure!(event.kind == EventKind::Delete);
    ensure!(event.kv.key == key && event.kv.value.is_empty());
    ensure!(event.kv.mod_revision == deleted.mod_revision);
    ensure!(
        event.prev == Some(updated),
        "prev is the state before the delete: {:?}",
        event.prev
    );
    Ok(())
}

pub async fn watch_delivers_concurrent_writes_exactly_once_in_order(
    store: Store,
    p: &str,
) -> anyhow::Result<()> {
    const TASKS: usize = 10;
    const EACH: usize = 30;
    let mut watch = Watcher::new(store.watch(p, 0).await?);
    let mut writers = Vec::new();
    for task in 0..TASKS {
        let (store, p) = (store.clone(), p.to_owned());
        writers.push(tokio::spawn(async move {
            let mut written = Vec::new();
            for i in 0..EACH {
                written.push(done(
                    store
                        .create(&format!("{p}{task:02}/{i:03}"), value("x"))
                        .await?,
                )?);
            }
            anyhow::Ok(written)
        }));
    }
    let seen = watch.take(TASKS * EACH).await?;
    let mut written = Vec::new();
    for writer in writers {
        written.extend(writer.await??);
    }
    for pair in seen.windows(2) {
        ensure!(
            pair[0].kv.mod_revision < pair[1].kv.mod_revision,
            "out of order: {pair:?}"
        );
    }
    written.sort_by_key(|kv| kv.mod_revision);
    let seen: Vec<KeyValue> = seen.into_iter().map(|e| e.kv).collect();
    ensure!(seen == written, "the watch must see each write once");
    watch.expect_quiet(Duration::from_millis(200)).await?;
    Ok(())
}

pub async fn concurrent_compare_and_swap_loses_no_update(
    store: Store,
    p: &str,
) -> anyhow::Result<()> {
    const TASKS: usize = 50;
    const EACH: usize = 20;
    let key = format!("{p}counter");
    done(store.create(&key, value("0")).await?)?;
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (store, key) = (store.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let mut revisions = Vec::new();
            let mut current = store.get(&key).await?.context("counter exists")?;
            while revisions.len() < EACH {
                let n: u64 = std::str::from_utf8(&current.value)?.parse()?;
                match store
                    .update(&key, value(&(n + 1).to_string()), current.mod_revision)
                    .await?
                {
                    Outcome::Done(kv) => {
                        revisions.push(kv.mod_revision);
                        current = kv;
                    }
                    // Someone else won; retry from the state the conflict reports.
                    Outcome::Conflict(Some(now)) => current = now,
                    Outcome::Conflict(None) => bail!("counter vanished"),
                }
            }
            anyhow::Ok(revisions)
        }));
    }
    let mut revisions = BTreeSet::new();
    for task in tasks {
        for revision in task.await?? {
            ensure!(
                revisions.insert(revision),
                "two updates got revision {revision}"
            );
        }
    }
    ensure!(revisions.len() == TASKS * EACH);
    let last = store.get(&key).await?.context("counter exists")?;
    ensure!(
        last.value == (TASKS * EACH).to_string(),
        "final value {:?}",
        last.value
    );
    ensure!(revisions.last() == Some(&last.mod_revision));
    Ok(())
}

pub async fn revisions_strictly_increase(store: Store, p: &str) -> anyhow::Result<()> {
    let mut last = store.current_revision().await?;
    ensure!(last > 0, "the revision of a store is never 0");
    for i in 0..10 {
        let key = format!("{p}k{i}");
        let created = done(store.create(&key, value("a")).await?)?;
        let updated = done(store.update(&key, value("b"), created.mod_revision).await?)?;
        let deleted = done(store.delete(&key, None).await?)?;
        for revision in [
            created.mod_revision,
            updated.mod_revision,
            deleted.mod_revision,
        ] {
            ensure!(revision > last, "revision {revision} after {last}");
            last = revision;
        }
        ensure!(store.current_revision().await? >= last);
    }
    // A failed precondition consumes no revision of its own, and changes nothing.
    let key = format!("{p}stable");
    let kv = done(store.create(&key, value("a")).await?)?;
    conflict(store.create(&key, value("b")).await?)?;
    conflict(store.update(&key, value("b"), kv.mod_revision + 1).await?)?;
    ensure!(store.get(&key).await? == Some(kv));
    Ok(())
}

pub async fn compaction_fails_older_reads_and_watches(store: Store, p: &str) -> anyhow::Result<()> {
    let key = format!("{p}k");
    let a = done(store.create(&key, value("v1")).await?)?;
    let b = done(store.update(&key, value("v2"), a.mod_revision).await?)?;
    // The compaction point is a create: an event whose previous state (none) cannot have been
    // compacted away. (etcd drops the previous state of an update at the compaction point, and
    // a backend that cannot supply it ends the watch, as kube-apiserver does.)
    let c = done(store.create(&format!("{p}k2"), value("c")).await?)?;
    done(store.update(&key, value("v3"), b.mod_revision).await?)?;
    ensure!(store.compacted_revision().await? < a.mod_revision);

    store.compact(c.mod_revision).await?;
    ensure!(store.compacted_revision().await? == c.mod_revision);

    match store.range(range(p, 0, a.mod_revision)).await {
        Err(StorageError::Compacted {
            requested,
            compacted,
        }) => {
            ensure!(requested == a.mod_revision && compacted == c.mod_revision);
        }
        other => bail!("expected Compacted, got {other:?}"),
    }
    let at_point = store.range(range(p, 0, c.mod_revision)).await?;
    ensure!(
        at_point.kvs == [b.clone(), c.clone()],
        "the compaction point stays readable: {:?}",
        at_point.kvs
    );

    // Below the point, the watch fails at once or as its first item.
    match store.watch(p, a.mod_revision).await {
        Err(StorageError::Compacted { compacted, .. }) => ensure!(compacted == c.mod_revision),
        Err(other) => bail!("expected Compacted, got {other:?}"),
        Ok(mut watch) => match tokio::time::timeout(WAIT, watch.next()).await? {
            Some(Err(StorageError::Compacted { compacted, .. })) => {
                ensure!(compacted == c.mod_revision)
            }
            other => bail!("expected Compacted as the first item, got {other:?}"),
        },
    }
    let mut from_point = Watcher::new(store.watch(p, c.mod_revision).await?);
    let first = from_point.take(1).await?;
    ensure!(
        first[0].kv == c,
        "a watch from the compaction point starts there: {first:?}"
    );

    // Compacting to an older point is a no-op; to a future one, an error.
    store.compact(a.mod_revision).await?;
    ensure!(store.compacted_revision().await? == c.mod_revision);
    let current = store.current_revision().await?;
    match store.compact(current + 100).await {
        Err(StorageError::FutureRevision { requested, .. }) => ensure!(requested == current + 100),
        other => bail!("expected FutureRevision, got {other:?}"),
    }

    // The store keeps working past compaction.
    let d = store.get(&key).await?.context("k exists")?;
    let e = done(store.update(&key, value("v4"), d.mod_revision).await?)?;
    ensure!(e.mod_revision > current);
    Ok(())
}

pub async fn every_past_revision_reads_back_as_it_was(store: Store, p: &str) -> anyhow::Result<()> {
    use std::collections::BTreeMap;
    // A deterministic mix of creates, updates and deletes over a few keys, with the expected
    // state recorded after each write.
    let mut seed: u64 = 0x5eed;
    let mut next = move |bound: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % bound
    };
    let mut model: BTreeMap<String, KeyValue> = BTreeMap::new();
    let mut history = Vec::new();
    let first = store.current_revision().await? + 1;
    for step in 0..200 {
        let key = format!("{p}{:02}", next(12));
        let written = match model.get(&key).cloned() {
            None => done(store.create(&key, value(&format!("c{step}"))).await?)?,
            Some(current) if next(3) == 0 => {
                let deleted = done(store.delete(&key, Some(current.mod_revision)).await?)?;
                model.remove(&key);
                history.push((deleted.mod_revision, model.clone()));
                continue;
            }
            Some(current) => done(
                store
                    .update(&key, value(&format!("u{step}")), current.mod_revision)
                    .await?,
            )?,
        };
        model.insert(key, written.clone());
        history.push((written.mod_revision, model.clone()));
    }
    for (revision, expected) in &history {
        let expected: Vec<KeyValue> = expected.values().cloned().collect();
        let whole = store.range(range(p, 0, *revision)).await?;
        ensure!(whole.kvs == expected, "range at {revision}");
        ensure!(whole.count == expected.len() && !whole.more);
        // The same snapshot again, in pages of 3.
        let mut paged = Vec::new();
        let mut start_key = None;
        loop {
            let mut request = range(p, 3, *revision);
            request.start_key = start_key;
            let page = store.range(request).await?;
            ensure!(
                page.count == expected.len() - paged.len(),
                "count at {revision}"
            );
            paged.extend(page.kvs);
            if !page.more {
                break;
            }
            start_key = paged.last().map(|kv| format!("{}\0", kv.key));
        }
        ensure!(paged == expected, "paged range at {revision}");
    }
    // Replaying the whole history through a watch rebuilds the final state.
    let mut watch = Watcher::new(store.watch(p, first).await?);
    let mut rebuilt: BTreeMap<String, KeyValue> = BTreeMap::new();
    for event in watch.take(history.len()).await? {
        match event.kind {
            EventKind::Put => {
                ensure!(
                    event.prev.as_ref() == rebuilt.get(&event.kv.key),
                    "prev of {event:?}"
                );
                rebuilt.insert(event.kv.key.clone(), event.kv);
            }
            EventKind::Delete => {
                let prev = rebuilt.remove(&event.kv.key);
                ensure!(event.prev == prev, "prev of {event:?}");
            }
        }
    }
    ensure!(
        rebuilt == model,
        "the watch replay must rebuild the final state"
    );
    Ok(())
}

/// Creates every `(key, value)` from a task of its own, all released at once, and returns what
/// each create reported, in the order given.
pub async fn create_all_at_once(
    store: &Store,
    entries: impl IntoIterator<Item = (String, Bytes)>,
) -> anyhow::Result<Vec<KeyValue>> {
    let entries: Vec<(String, Bytes)> = entries.into_iter().collect();
    let start = Arc::new(tokio::sync::Barrier::new(entries.len()));
    let mut tasks = Vec::new();
    for (key, bytes) in entries {
        let (store, start) = (store.clone(), start.clone());
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            done(store.create(&key, bytes).await?)
        }));
    }
    let mut created = Vec::new();
    for task in tasks {
        created.push(task.await??);
    }
    Ok(created)
}

/// Creates issued all at once (which the etcd backend commits together, in one transaction)
/// each get their own revision, and every one of those revisions reads, watches and
/// compare-and-swaps exactly like the revision of a write committed alone.
pub async fn simultaneous_creates_each_get_their_own_revision(
    store: Store,
    p: &str,
) -> anyhow::Result<()> {
    const CREATES: usize = 40;
    let before = store.current_revision().await?;
    // Values that look like a backend's own framing must come back byte for byte.
    let entries = (0..CREATES).map(|i| {
        let bytes = match i % 4 {
            0 => Bytes::new(),
            1 => Bytes::from_static(b"\xff\xffslot\x00\x01\x00x"),
            _ => value(&format!("v{i}")),
        };
        (format!("{p}{i:02}"), bytes)
    });
    let mut created = create_all_at_once(&store, entries).await?;
    // Twice at once: one wins, the other sees the winner.
    let twice = format!("{p}twice");
    let (first, second) = tokio::join!(
        store.create(&twice, value("a")),
        store.create(&twice, value("b"))
    );
    match (first?, second?) {
        (Outcome::Done(won), Outcome::Conflict(Some(seen)))
        | (Outcome::Conflict(Some(seen)), Outcome::Done(won)) => ensure!(won == seen),
        other => bail!("one of two creates of {twice} must win: {other:?}"),
    }
    store.delete(&twice, None).await?;

    created.sort_by_key(|kv| kv.mod_revision);
    for pair in created.windows(2) {
        ensure!(
            pair[0].mod_revision < pair[1].mod_revision,
            "two creates got one revision: {pair:?}"
        );
    }
    ensure!(created[0].mod_revision > before);
    for (i, kv) in created.iter().enumerate() {
        ensure!(store.get(&kv.key).await?.as_ref() == Some(kv), "get {kv:?}");
        // A range at a create's revision holds it and the creates before it, nothing later.
        let at = store.range(range(p, 0, kv.mod_revision)).await?;
        let mut expected = created[..=i].to_vec();
        expected.sort_by(|a, b| a.key.cmp(&b.key));
        ensure!(at.kvs == expected, "range at {}", kv.mod_revision);
        ensure!(at.count == i + 1 && at.revision == kv.mod_revision);
        // The same read in pages of 3: every page but the last is full.
        let mut paged = Vec::new();
        let mut start_key = None;
        loop {
            let mut request = range(p, 3, kv.mod_revision);
            request.start_key = start_key;
            let page = store.range(request).await?;
            paged.extend(page.kvs.iter().cloned());
            if !page.more {
                break;
            }
            ensure!(page.kvs.len() == 3, "a short page at {}", kv.mod_revision);
            start_key = paged.last().map(|kv: &KeyValue| format!("{}\0", kv.key));
        }
        ensure!(paged == expected, "paged range at {}", kv.mod_revision);
        // A watch from a create's revision starts with exactly that create.
        let mut watch = Watcher::new(store.watch(p, kv.mod_revision).await?);
        let first = watch.take(1).await?;
        ensure!(
            first[0].kv == *kv,
            "watch from {} began with {first:?}",
            kv.mod_revision
        );
    }
    let all = store.watch(p, created[0].mod_revision).await?;
    let replayed = Watcher::new(all).take(CREATES).await?;
    let replayed: Vec<KeyValue> = replayed.into_iter().map(|e| e.kv).collect();
    ensure!(
        replayed == created,
        "a watch replays the creates once, in revision order"
    );
    // Compare-and-swap knows each create's exact revision: one off is a conflict.
    for kv in &created {
        for wrong in [kv.mod_revision - 1, kv.mod_revision + 1] {
            conflict(store.update(&kv.key, value("wrong"), wrong).await?)?;
            conflict(store.delete(&kv.key, Some(wrong)).await?)?;
        }
        let updated = done(store.update(&kv.key, value("new"), kv.mod_revision).await?)?;
        ensure!(updated.create_revision == kv.create_revision);
        done(store.delete(&kv.key, Some(updated.mod_revision)).await?)?;
    }
    Ok(())
}
