//! Replica membership for placement: each replica of `flotilla serve` renews one lease record
//! of its own in the store (`/flotilla/replicas/<identity>`), whatever the number of clusters,
//! and every replica derives the live membership from those records and assigns each cluster
//! to one live replica by rendezvous hashing. A replica's *generation* grows each time it
//! (re)joins, so a claim made by an earlier life of a replica is recognisably stale.
//!
//! Liveness is judged as upstream's leader election judges a lease: by when this replica last
//! saw the record change, on its own clock, never by comparing another machine's timestamps.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use flotilla_storage::{Outcome, RangeRequest, Revision, Storage, StorageError};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// Where the replicas' lease records live.
pub const REPLICA_RECORDS: &str = "/flotilla/replicas/";

/// One replica's lease record.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
struct ReplicaRecord {
    identity: String,
    generation: u64,
    /// For a reader; liveness does not depend on it.
    renew_time: String,
    lease_duration_seconds: u64,
}

/// A live replica as this replica sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its identity.
    pub identity: String,
    /// Its current life.
    pub generation: u64,
}

impl Member {
    /// How its claims are written (`holderIdentity` of the clusters' Leases).
    pub fn holder(&self) -> String {
        format!("{}_{}", self.identity, self.generation)
    }

    /// The member a holder string names, if it is one.
    pub fn parse_holder(holder: &str) -> Option<Member> {
        let (identity, generation) = holder.rsplit_once('_')?;
        Some(Member {
            identity: identity.to_string(),
            generation: generation.parse().ok()?,
        })
    }
}

/// What one record looked like when this replica last saw it change.
#[derive(Clone)]
struct Observed {
    revision: Revision,
    generation: u64,
    since: Instant,
}

/// This replica's lease and its view of the others'.
#[derive(Clone)]
pub struct Membership {
    identity: String,
    lease_duration: Duration,
    /// How often the lease is renewed; the margin by which this replica fences itself before
    /// others may consider its lease expired.
    retry_period: Duration,
    generation: u64,
    /// The revision of this replica's record as last written.
    revision: Option<Revision>,
    /// When the last successful renewal was sent (before the write, so never later than the
    /// commit others observe).
    renewed: Option<Instant>,
    others: HashMap<String, Observed>,
    /// The store admits one process: other records are earlier runs', dead already.
    sole: bool,
    /// When this replica first read the records: a replica it has not seen by one lease
    /// duration after that does not exist (every live one renews within that time).
    observing_since: Option<Instant>,
    /// When this replica last read the records. Another's record is judged unchanged only up
    /// to then: a replica that could not read the store (cut off, its reads stalled) has not
    /// watched the others' records stay still, and must not take their clusters for it.
    observed: Option<Instant>,
}

/// How many lease durations a record may go unchanged before a replica deletes it (a replica
/// that never came back, whose record would otherwise stay forever).
const FORGET_AFTER_LEASES: u32 = 4;

impl Membership {
    /// A replica that has not joined yet; `sole` when the store admits only this process.
    pub fn new(
        identity: String,
        lease_duration: Duration,
        retry_period: Duration,
        sole: bool,
    ) -> Self {
        Self {
            identity,
            lease_duration,
            retry_period,
            generation: 0,
            revision: None,
            renewed: None,
            others: HashMap::new(),
            sole,
            observing_since: None,
            observed: None,
        }
    }

    /// This replica as a member.
    pub fn me(&self) -> Member {
        Member {
            identity: self.identity.clone(),
            generation: self.generation,
        }
    }

    /// Whether this replica may run loops: it renewed its lease recently enough that no other
    /// replica can yet consider it expired. A replica cut off from the store stops its loops
    /// before anyone takes them over.
    pub fn holds_lease(&self, now: Instant) -> bool {
        // Two renewal periods short of the lease: placement notices the lapse only at its
        // next tick (one period), and the other period is slack for stopping the loops.
        let fence = self
            .lease_duration
            .saturating_sub(self.retry_period.saturating_mul(2));
        self.renewed
            .is_some_and(|sent| now.saturating_duration_since(sent) < fence)
    }

    /// Renews this replica's record (joining with the next generation the first time, or
    /// after it lost the lease), then reads every record.
    pub async fn renew_and_observe(&mut self, storage: &dyn Storage) -> Result<(), StorageError> {
        let sent = Instant::now();
        if !self.holds_lease(sent) {
            // A new life: whatever this replica held before is no longer its.
            self.revision = None;
        }
        let key = format!("{REPLICA_RECORDS}{}", self.identity);
        let revision = match self.revision {
            Some(revision) => {
                let record = self.record(self.generation);
                match storage.update(&key, record, revision).await? {
                    Outcome::Done(kv) => Some(kv.mod_revision),
                    // Someone else wrote this identity's record: rejoin below.
                    Outcome::Conflict(_) => None,
                }
            }
            None => None,
        };
        let revision = match revision {
            Some(revision) => revision,
            None => self.join(storage, &key).await?,
        };
        self.revision = Some(revision);
        self.renewed = Some(sent);
        self.observe(storage).await
    }

    /// Writes this replica's record with the generation after the stored one.
    async fn join(&mut self, storage: &dyn Storage, key: &str) -> Result<Revision, StorageError> {
        loop {
            let existing = storage.get(key).await?;
            let previous = existing
                .as_ref()
                .and_then(|kv| serde_json::from_slice::<ReplicaRecord>(&kv.value).ok())
                .map_or(0, |record| record.generation);
            let generation = previous.max(self.generation) + 1;
            let record = self.record(generation);
            let outcome = match &existing {
                Some(kv) => storage.update(key, record, kv.mod_revision).await?,
                None => storage.create(key, record).await?,
            };
            if let Outcome::Done(kv) = outcome {
                self.generation = generation;
                tracing::info!(replica = %self.identity, generation, "joined the replicas");
                return Ok(kv.mod_revision);
            }
        }
    }

    fn record(&self, generation: u64) -> Bytes {
        let record = ReplicaRecord {
            identity: self.identity.clone(),
            generation,
            renew_time: k8s_openapi::jiff::Timestamp::now().to_string(),
            lease_duration_seconds: self.lease_duration.as_secs().max(1),
        };
        Bytes::from(serde_json::to_vec(&record).unwrap_or_default())
    }

    /// Reads every replica record and notes which changed since the last look.
    async fn observe(&mut self, storage: &dyn Storage) -> Result<(), StorageError> {
        let page = storage
            .range(RangeRequest {
                prefix: REPLICA_RECORDS.to_string(),
                ..Default::default()
            })
            .await?;
        // When the records were read, at the latest: a change seen now happened no later (the
        // time the renewal was sent could be long before, when the store was slow to answer).
        let now = Instant::now();
        let mut seen = HashMap::new();
        for kv in page.kvs {
            let Ok(record) = serde_json::from_slice::<ReplicaRecord>(&kv.value) else {
                continue;
            };
            if record.identity == self.identity {
                continue;
            }
            let since = match self.others.get(&record.identity) {
                Some(before) if before.revision == kv.mod_revision => before.since,
                _ => now,
            };
            let forget_after = self.lease_duration * FORGET_AFTER_LEASES;
            if self.sole || now.saturating_duration_since(since) > forget_after {
                // Only this version of it: a replica that renewed meanwhile keeps its record.
                let _ = storage.delete(&kv.key, Some(kv.mod_revision)).await?;
                continue;
            }
            seen.insert(
                record.identity,
                Observed {
                    revision: kv.mod_revision,
                    generation: record.generation,
                    since,
                },
            );
        }
        self.others = seen;
        self.observing_since.get_or_insert(now);
        self.observed = Some(now);
        Ok(())
    }

    /// How long `seen`'s record has been watched not changing: up to this replica's last
    /// read of the records, not up to `now`.
    fn unchanged_for(&self, seen: &Observed, now: Instant) -> Duration {
        let horizon = self.observed.map_or(now, |observed| observed.min(now));
        horizon.saturating_duration_since(seen.since)
    }

    /// Whether a claim written by `holder` may be taken over: nobody holds it, or it is an
    /// earlier life of this replica or of another, or a replica whose lease has lapsed, or
    /// one that has not existed for as long as this replica has been looking. A holder this
    /// replica has not seen yet is never taken from before then: it may have just joined.
    pub fn is_free(&self, holder: &str, now: Instant) -> bool {
        if holder.is_empty() {
            return true;
        }
        let Some(held_by) = Member::parse_holder(holder) else {
            // Not a placement holder (an older release's): nobody renews it.
            return true;
        };
        if held_by.identity == self.identity {
            return held_by.generation != self.generation || !self.holds_lease(now);
        }
        match self.others.get(&held_by.identity) {
            Some(seen) => {
                seen.generation != held_by.generation
                    || self.unchanged_for(seen, now) > self.lease_duration
            }
            None => {
                self.sole
                    || self.observing_since.is_some_and(|since| {
                        now.saturating_duration_since(since) > self.lease_duration
                    })
            }
        }
    }

    /// The live replicas, this one first when it holds its lease, the others in identity
    /// order: those whose record changed within one lease duration.
    pub fn live(&self, now: Instant) -> Vec<Member> {
        let mut live: Vec<Member> = self
            .others
            .iter()
            .filter(|(_, seen)| self.unchanged_for(seen, now) <= self.lease_duration)
            .map(|(identity, seen)| Member {
                identity: identity.clone(),
                generation: seen.generation,
            })
            .collect();
        live.sort_by(|a, b| a.identity.cmp(&b.identity));
        if self.holds_lease(now) {
            live.insert(0, self.me());
        }
        live
    }
}

/// The live replica that runs `cluster`'s loops: the highest rendezvous score, so when a
/// replica joins or leaves only the clusters it gains or loses move.
pub fn owner<'a>(cluster: &str, live: &'a [Member]) -> Option<&'a Member> {
    live.iter()
        .max_by_key(|member| (score(cluster, &member.identity), member.identity.as_str()))
}

/// A stable 64-bit hash of the pair (FNV-1a, then a SplitMix64 finaliser to spread it):
/// stable across builds and machines, as every replica must compute the same owner.
fn score(cluster: &str, replica: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in cluster.bytes().chain([0]).chain(replica.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash ^= hash >> 30;
    hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 27;
    hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh embedded store, with the directory it lives in.
    fn store() -> (tempfile::TempDir, flotilla_storage::EmbeddedStorage) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let storage =
            flotilla_storage::EmbeddedStorage::open(dir.path().join("store")).expect("a store");
        (dir, storage)
    }

    fn member(identity: &str) -> Member {
        Member {
            identity: identity.into(),
            generation: 1,
        }
    }

    #[test]
    fn rendezvous_moves_only_the_clusters_a_replica_gains_or_loses() {
        let two = [member("a"), member("b")];
        let three = [member("a"), member("b"), member("c")];
        let clusters: Vec<String> = (0..3000).map(|i| format!("cluster-{i}")).collect();
        let mut moved = 0;
        let mut to_c = 0;
        for cluster in &clusters {
            let before = owner(cluster, &two).map(|m| m.identity.clone());
            let after = owner(cluster, &three).map(|m| m.identity.clone());
            if before != after {
                moved += 1;
                assert_eq!(
                    after.as_deref(),
                    Some("c"),
                    "a move only ever goes to the newcomer"
                );
                to_c += 1;
            }
        }
        assert_eq!(moved, to_c);
        // About a third moves to the newcomer.
        assert!((800..1200).contains(&moved), "{moved} of 3000 moved");
        // Membership order does not matter.
        let shuffled = [member("c"), member("a"), member("b")];
        for cluster in &clusters {
            assert_eq!(
                owner(cluster, &three).map(|m| &m.identity),
                owner(cluster, &shuffled).map(|m| &m.identity)
            );
        }
    }

    #[test]
    fn a_holder_names_the_replica_and_its_life() {
        let me = Member {
            identity: "host_6443_0badf00d".into(),
            generation: 7,
        };
        assert_eq!(me.holder(), "host_6443_0badf00d_7");
        assert_eq!(Member::parse_holder(&me.holder()), Some(me));
        assert_eq!(Member::parse_holder("no-generation"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_that_stops_renewing_is_dropped_and_one_cut_off_fences_itself() {
        let (_dir, storage) = store();
        let lease = Duration::from_secs(2);
        let tick = Duration::from_millis(400);
        let mut a = Membership::new("a".into(), lease, tick, false);
        let mut b = Membership::new("b".into(), lease, tick, false);
        a.renew_and_observe(&storage).await.expect("a joins");
        b.renew_and_observe(&storage).await.expect("b joins");
        a.renew_and_observe(&storage).await.expect("a sees b");
        let now = Instant::now();
        let names = |live: Vec<Member>| live.into_iter().map(|m| m.identity).collect::<Vec<_>>();
        assert_eq!(names(a.live(now)), ["a", "b"]);
        assert_eq!(names(b.live(now)), ["b", "a"]);

        // b stops renewing: a drops it one lease duration after it last saw a change.
        for _ in 0..6 {
            tokio::time::advance(tick).await;
            a.renew_and_observe(&storage).await.expect("a renews");
        }
        assert_eq!(names(a.live(Instant::now())), ["a"]);
        // b, which has not renewed for as long, no longer counts itself as holding a lease:
        // it runs nothing. Nor, not having read the records meanwhile, does it count a as
        // gone: it never saw a's record stay still (found by the fault suite, where a replica
        // whose reads stalled through a partition took the other's clusters on its return).
        assert!(!b.holds_lease(Instant::now()));
        assert_eq!(names(b.live(Instant::now())), ["a"]);
        assert!(!b.is_free(&a.me().holder(), Instant::now()));
        // When it renews again, it comes back as a new life.
        b.renew_and_observe(&storage).await.expect("b rejoins");
        assert_eq!(b.me().generation, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_is_taken_only_from_a_replica_known_to_be_gone() {
        let (_dir, storage) = store();
        let lease = Duration::from_secs(2);
        let tick = Duration::from_millis(400);
        let mut a = Membership::new("a".into(), lease, tick, false);
        a.renew_and_observe(&storage).await.expect("a joins");
        // b joined after a last looked: a has not seen it, so b's claim stands.
        let mut b = Membership::new("b".into(), lease, tick, false);
        b.renew_and_observe(&storage).await.expect("b joins");
        let claim = b.me().holder();
        assert!(!a.is_free(&claim, Instant::now()));
        // Seen and renewing: still b's.
        a.renew_and_observe(&storage).await.expect("a sees b");
        assert!(!a.is_free(&claim, Instant::now()));
        // b stops renewing: its claim is free once its lease has lapsed in a's eyes.
        for _ in 0..6 {
            tokio::time::advance(tick).await;
            a.renew_and_observe(&storage).await.expect("a renews");
        }
        assert!(a.is_free(&claim, Instant::now()));
        // Unknown holders, empty claims and a's own earlier life.
        assert!(
            a.is_free("nobody_1", Instant::now()),
            "a has looked long enough"
        );
        assert!(a.is_free("", Instant::now()));
        let earlier = Member {
            identity: "a".into(),
            generation: a.me().generation - 1,
        };
        assert!(a.is_free(&earlier.holder(), Instant::now()));
        assert!(!a.is_free(&a.me().holder(), Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn the_sole_replica_of_an_embedded_store_waits_for_no_earlier_run() {
        let (_dir, storage) = store();
        let lease = Duration::from_secs(15);
        let tick = Duration::from_secs(3);
        let mut earlier = Membership::new("run-1".into(), lease, tick, true);
        earlier
            .renew_and_observe(&storage)
            .await
            .expect("first run");
        let mut now_running = Membership::new("run-2".into(), lease, tick, true);
        now_running
            .renew_and_observe(&storage)
            .await
            .expect("second run");
        let live = now_running.live(Instant::now());
        assert_eq!(live, vec![now_running.me()]);
        let left = storage
            .range(RangeRequest {
                prefix: REPLICA_RECORDS.into(),
                ..Default::default()
            })
            .await
            .expect("records");
        assert_eq!(left.kvs.len(), 1, "the earlier run's record is deleted");
    }
}
