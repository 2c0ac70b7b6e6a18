//! Per-tenant limits, so one noisy cluster cannot take the whole service from the others: a
//! token bucket of requests per tenant, seats for the requests it may have executing at once
//! with a bounded queue for the rest (both answered 429 with `Retry-After`, as upstream's
//! priority and fairness does), caps on its open watches and its exec, attach and
//! port-forward sessions (429 too), and quotas on the number of objects a cluster stores and
//! on their total size (403, as upstream's ResourceQuota answers).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;

/// The limits every tenant of a server gets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TenantLimits {
    /// Sustained requests per second per tenant; `None` for no limit.
    pub requests_per_second: Option<f64>,
    /// Requests a tenant may make at once above the sustained rate.
    pub burst: u32,
    /// Requests a tenant may have executing at once (watches and other long-running requests
    /// aside); `None` for no limit. A tenant's burst then queues for a seat instead of landing
    /// on the CPUs and the store all at once, in front of other tenants' requests.
    pub max_in_flight: Option<usize>,
    /// Requests that may wait for a seat; more are refused.
    pub max_queued: usize,
    /// Most keys a tenant may store (objects and their allocations); `None` for no quota.
    pub max_objects: Option<usize>,
    /// Most bytes a tenant's keys may hold together (their values as stored, after
    /// encryption at rest; a write between two sums is counted by its size before it);
    /// `None` for no quota. Creates and updates that would grow the total past it are
    /// refused; updates that shrink and deletes never are, so a full cluster can always make
    /// room.
    pub max_bytes: Option<u64>,
    /// Watches a tenant may have open at once; `None` for no limit. Each holds a connection,
    /// a task and its place in the initial state it is sending.
    pub max_watches: Option<usize>,
    /// exec, attach and port-forward sessions a tenant may have open at once; `None` for no
    /// limit. Each holds two connections (client and kubelet) and a task splicing them, for
    /// as long as the session lasts — outside the request seats, as upstream counts
    /// long-running requests.
    pub max_streams: Option<usize>,
}

impl TenantLimits {
    /// No limit (one tenant on one machine: `flotilla up`, benchmarks of a single cluster).
    pub const UNLIMITED: TenantLimits = TenantLimits {
        requests_per_second: None,
        burst: 0,
        max_in_flight: None,
        max_queued: 0,
        max_objects: None,
        max_bytes: None,
        max_watches: None,
        max_streams: None,
    };
}

impl Default for TenantLimits {
    fn default() -> Self {
        TenantLimits::UNLIMITED
    }
}

/// One tenant's bucket.
#[derive(Debug)]
pub struct RateLimiter {
    state: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    refilled_at: Instant,
}

impl Default for RateLimiter {
    fn default() -> Self {
        RateLimiter {
            state: Mutex::new(Bucket {
                tokens: f64::INFINITY,
                refilled_at: Instant::now(),
            }),
        }
    }
}

impl RateLimiter {
    /// Takes one token, or refuses with upstream's 429 when the bucket is empty.
    pub fn admit(&self, limits: &TenantLimits) -> Result<(), ApiError> {
        self.admit_at(limits, Instant::now())
    }

    fn admit_at(&self, limits: &TenantLimits, now: Instant) -> Result<(), ApiError> {
        let Some(rate) = limits.requests_per_second else {
            return Ok(());
        };
        let capacity = f64::from(limits.burst.max(1));
        let Ok(mut bucket) = self.state.lock() else {
            // A panic while holding this lock cannot leave it inconsistent: admit.
            return Ok(());
        };
        let elapsed = now
            .saturating_duration_since(bucket.refilled_at)
            .as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(capacity);
        bucket.refilled_at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(too_many_requests())
        }
    }
}

/// Longest wait in a tenant's queue for a seat before the request is refused (upstream's
/// priority and fairness gives up on a queued request after a quarter of its timeout).
const MAX_QUEUE_WAIT: Duration = Duration::from_secs(15);

/// One tenant's seats and queue.
#[derive(Debug, Default)]
pub struct Seats {
    seats: OnceLock<Arc<Semaphore>>,
    queued: AtomicUsize,
}

/// A request's hold on a seat (none under no limit), given back when dropped.
#[derive(Debug)]
pub struct Seat {
    _held: Option<OwnedSemaphorePermit>,
}

/// Counts a request in the queue for as long as it waits, also when it is dropped (its client
/// hung up) while waiting.
struct InQueue<'a>(&'a AtomicUsize);

impl Drop for InQueue<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Seats {
    /// A seat for one request: at once if one is free, else after the requests queued before
    /// it (first come, first served); refused with upstream's 429 when the queue is full or the
    /// wait too long.
    pub async fn take(&self, limits: &TenantLimits) -> Result<Seat, ApiError> {
        self.take_within(limits, MAX_QUEUE_WAIT).await
    }

    async fn take_within(&self, limits: &TenantLimits, wait: Duration) -> Result<Seat, ApiError> {
        let Some(count) = limits.max_in_flight else {
            return Ok(Seat { _held: None });
        };
        let seats = self
            .seats
            .get_or_init(|| Arc::new(Semaphore::new(count.max(1))));
        if let Ok(seat) = seats.clone().try_acquire_owned() {
            return Ok(Seat { _held: Some(seat) });
        }
        if self.queued.fetch_add(1, Ordering::Relaxed) >= limits.max_queued {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(too_many_requests());
        }
        let _waiting = InQueue(&self.queued);
        match tokio::time::timeout(wait, seats.clone().acquire_owned()).await {
            Ok(Ok(seat)) => Ok(Seat { _held: Some(seat) }),
            // Timed out, or the semaphore closed (it never is).
            _ => Err(too_many_requests()),
        }
    }
}

/// One tenant's open long-running requests of one kind (watches, or streaming sessions).
#[derive(Debug, Default)]
pub struct LongRunning {
    open: Arc<AtomicUsize>,
}

/// One open long-running request's place in its tenant's count, given back when it ends.
#[derive(Debug)]
pub struct LongRunningSlot {
    open: Option<Arc<AtomicUsize>>,
}

impl Drop for LongRunningSlot {
    fn drop(&mut self) {
        if let Some(open) = &self.open {
            open.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl LongRunning {
    /// A place for one more, or upstream's 429 when the tenant has `limit` open.
    pub fn open(&self, limit: Option<usize>) -> Result<LongRunningSlot, ApiError> {
        let Some(limit) = limit else {
            return Ok(LongRunningSlot { open: None });
        };
        if self.open.fetch_add(1, Ordering::AcqRel) >= limit {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return Err(too_many_requests());
        }
        Ok(LongRunningSlot {
            open: Some(self.open.clone()),
        })
    }

    /// How many are open now.
    pub fn count(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }
}

fn too_many_requests() -> ApiError {
    ApiError::too_many_requests("Too many requests, please try again later.", 1)
}

/// How long a counted number of objects is trusted (plus the creates made here since): creates
/// through other replicas are seen this late, so the quota may be overshot by what they add.
const OBJECT_COUNT_TTL: std::time::Duration = std::time::Duration::from_secs(5);

/// One tenant's object count, read from storage now and then.
#[derive(Debug, Default)]
pub struct ObjectCount {
    state: Mutex<Option<(usize, Instant)>>,
}

impl ObjectCount {
    /// How many objects are under `prefix`: the count read at most [`OBJECT_COUNT_TTL`] ago
    /// (plus the creates admitted here since), else a fresh one.
    pub async fn current(
        &self,
        storage: &dyn flotilla_storage::Storage,
        prefix: &str,
    ) -> Result<usize, ApiError> {
        let cached = self
            .state
            .lock()
            .ok()
            .and_then(|state| *state)
            .filter(|(_, counted_at)| counted_at.elapsed() < OBJECT_COUNT_TTL);
        if let Some((count, _)) = cached {
            return Ok(count);
        }
        let counted = storage
            .range(flotilla_storage::RangeRequest {
                prefix: prefix.to_string(),
                start_key: None,
                limit: 1,
                revision: 0,
            })
            .await?
            .count;
        if let Ok(mut state) = self.state.lock() {
            *state = Some((counted, Instant::now()));
        }
        Ok(counted)
    }

    /// Admits one more object under `prefix`, or refuses with upstream's quota 403.
    pub async fn admit_create(
        &self,
        storage: &dyn flotilla_storage::Storage,
        prefix: &str,
        limits: &TenantLimits,
        resource: &crate::resources::GroupResource,
        name: &str,
    ) -> Result<(), ApiError> {
        let Some(limit) = limits.max_objects else {
            return Ok(());
        };
        let used = self.current(storage, prefix).await?;
        if used >= limit {
            return Err(ApiError::forbidden(
                resource,
                name,
                &format!(
                    "exceeded quota: flotilla-cluster-objects, requested: objects=1, used: objects={used}, limited: objects={limit}"
                ),
            ));
        }
        if let Ok(mut state) = self.state.lock()
            && let Some((count, _)) = state.as_mut()
        {
            *count += 1;
        }
        Ok(())
    }
}

/// How long a summed size of a tenant's keys is trusted (plus the writes made here since)
/// before it is read again: writes through other replicas are seen about this late, so the
/// quota may be overshot by what they add in that time. Longer than the object count's, as
/// the sum reads every value.
const STORED_BYTES_TTL: Duration = Duration::from_secs(60);

/// Keys read per page while summing a tenant's size, so the sum never holds a large tenant
/// in memory at once.
const STORED_BYTES_PAGE: usize = 500;

/// One tenant's stored bytes, for its byte quota and its metrics: summed from storage now and
/// then, and moved by each write made through this replica in between.
#[derive(Debug, Default)]
pub struct StoredBytes {
    limit: Option<u64>,
    state: Mutex<Option<SummedBytes>>,
    /// One first sum at a time: writes arriving while it runs wait for it rather than each
    /// reading the whole tenant.
    summing: tokio::sync::Mutex<()>,
    /// Whether a later sum is being read in the background.
    summing_again: std::sync::atomic::AtomicBool,
}

#[derive(Debug, Clone, Copy)]
struct SummedBytes {
    bytes: i64,
    summed_at: Instant,
    /// Which sum this is: a charge made against an earlier one is not refunded into it.
    epoch: u64,
}

/// Bytes a write was allowed to add (or take away): given back unless [`Charge::keep`] is
/// called once the write is stored.
#[derive(Debug)]
#[must_use = "a charge not kept is refunded when dropped"]
pub struct Charge<'a> {
    owner: Option<&'a StoredBytes>,
    delta: i64,
    epoch: u64,
}

impl Charge<'_> {
    /// The write was stored: its bytes stay counted.
    pub fn keep(mut self) {
        self.owner = None;
    }
}

impl Drop for Charge<'_> {
    fn drop(&mut self) {
        if let Some(owner) = self.owner {
            owner.adjust(-self.delta, Some(self.epoch));
        }
    }
}

impl StoredBytes {
    /// A tenant's size, refused growth past `limit` (`None`: only counted, for its metrics).
    pub fn new(limit: Option<u64>) -> Self {
        StoredBytes {
            limit,
            ..Default::default()
        }
    }

    /// Moves the current sum by `delta`, if there is one (and it is the sum `epoch` names).
    fn adjust(&self, delta: i64, epoch: Option<u64>) {
        if let Ok(mut state) = self.state.lock()
            && let Some(summed) = state.as_mut()
            && epoch.is_none_or(|epoch| epoch == summed.epoch)
        {
            summed.bytes = (summed.bytes + delta).max(0);
        }
    }

    /// The bytes stored under `prefix`: the last sum (plus the writes made here since), read
    /// again when it is missing or older than [`STORED_BYTES_TTL`].
    pub async fn current(
        self: &Arc<Self>,
        storage: &Arc<dyn flotilla_storage::Storage>,
        prefix: &str,
    ) -> Result<u64, ApiError> {
        Ok(self.summed(storage, prefix).await?.bytes.max(0) as u64)
    }

    /// The last sum. Only the first one is waited for: an older one (with every write here
    /// since) still decides while a new one is read in the background, so no write waits a
    /// whole tenant's read once a minute.
    async fn summed(
        self: &Arc<Self>,
        storage: &Arc<dyn flotilla_storage::Storage>,
        prefix: &str,
    ) -> Result<SummedBytes, ApiError> {
        let last = self.state.lock().ok().and_then(|state| *state);
        if let Some(last) = last {
            if last.summed_at.elapsed() >= STORED_BYTES_TTL
                && !self.summing_again.swap(true, Ordering::AcqRel)
            {
                let (quota, storage, prefix) = (self.clone(), storage.clone(), prefix.to_string());
                tokio::spawn(async move {
                    if let Err(err) = quota.sum(storage.as_ref(), &prefix).await {
                        tracing::debug!(%prefix, err = %err.message, "summing a cluster's stored bytes");
                    }
                    quota.summing_again.store(false, Ordering::Release);
                });
            }
            return Ok(last);
        }
        let _summing = self.summing.lock().await;
        // Summed by the write that held the lock before this one.
        if let Some(summed) = self.state.lock().ok().and_then(|state| *state) {
            return Ok(summed);
        }
        self.sum(storage.as_ref(), prefix).await
    }

    /// Sums the sizes under `prefix` as stored, read beneath encryption at rest: the sum never
    /// decrypts a value (nor needs a KMS plugin to answer).
    async fn sum(
        &self,
        storage: &dyn flotilla_storage::Storage,
        prefix: &str,
    ) -> Result<SummedBytes, ApiError> {
        let storage = storage.untransformed();
        let mut bytes = 0i64;
        let mut start_key = None;
        let mut revision = 0;
        loop {
            let page = storage
                .range(flotilla_storage::RangeRequest {
                    prefix: prefix.to_string(),
                    start_key: start_key.take(),
                    limit: STORED_BYTES_PAGE,
                    revision,
                })
                .await?;
            // Every page from the first one's revision: one snapshot of the tenant.
            revision = page.revision;
            bytes += page.kvs.iter().map(|kv| kv.value.len() as i64).sum::<i64>();
            match page.kvs.last() {
                Some(last) if page.more => start_key = Some(format!("{}\u{0}", last.key)),
                _ => break,
            }
        }
        let mut state = self
            .state
            .lock()
            .map_err(|_| ApiError::internal("stored bytes lock poisoned"))?;
        let summed = SummedBytes {
            bytes,
            summed_at: Instant::now(),
            epoch: state.map_or(0, |earlier| earlier.epoch + 1),
        };
        *state = Some(summed);
        Ok(summed)
    }

    /// Admits a write that changes the tenant's size by `delta` bytes, or refuses it with
    /// upstream's quota 403 when it would grow the tenant past its limit. A write that does
    /// not grow it is never refused, nor read for.
    pub async fn charge(
        self: &Arc<Self>,
        storage: &Arc<dyn flotilla_storage::Storage>,
        prefix: &str,
        delta: i64,
        resource: &crate::resources::GroupResource,
        name: &str,
    ) -> Result<Charge<'_>, ApiError> {
        let epoch = match (self.limit, delta > 0) {
            (Some(limit), true) => {
                let summed = self.summed(storage, prefix).await?;
                let used = summed.bytes.max(0) as u64;
                if used + delta as u64 > limit {
                    return Err(ApiError::forbidden(
                        resource,
                        name,
                        &format!(
                            "exceeded quota: flotilla-cluster-bytes, requested: bytes={delta}, used: bytes={used}, limited: bytes={limit}"
                        ),
                    ));
                }
                summed.epoch
            }
            _ => match self.state.lock().ok().and_then(|state| *state) {
                Some(summed) => summed.epoch,
                // Nothing summed yet: nothing to move.
                None => {
                    return Ok(Charge {
                        owner: None,
                        delta,
                        epoch: 0,
                    });
                }
            },
        };
        self.adjust(delta, Some(epoch));
        Ok(Charge {
            owner: Some(self),
            delta,
            epoch,
        })
    }

    /// A delete made through this replica: its bytes are room again at once.
    pub fn release(&self, bytes: usize) {
        self.adjust(-(bytes as i64), None);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let limits = TenantLimits {
            requests_per_second: Some(10.0),
            burst: 5,
            ..TenantLimits::UNLIMITED
        };
        let limiter = RateLimiter::default();
        let start = Instant::now();
        for _ in 0..5 {
            assert!(limiter.admit_at(&limits, start).is_ok());
        }
        let refused = limiter
            .admit_at(&limits, start)
            .expect_err("the bucket is empty after its burst");
        assert_eq!((refused.code, refused.reason), (429, "TooManyRequests"));
        assert_eq!(refused.details.and_then(|d| d.retry_after_seconds), Some(1));
        // 10/s: one more token after 100 ms, not before.
        assert!(
            limiter
                .admit_at(&limits, start + Duration::from_millis(50))
                .is_err()
        );
        assert!(
            limiter
                .admit_at(&limits, start + Duration::from_millis(150))
                .is_ok()
        );
        // Idle time refills only up to the burst.
        let later = start + Duration::from_secs(60);
        for _ in 0..5 {
            assert!(limiter.admit_at(&limits, later).is_ok());
        }
        assert!(limiter.admit_at(&limits, later).is_err());
    }

    #[test]
    fn no_rate_means_no_limit() {
        let limiter = RateLimiter::default();
        for _ in 0..10_000 {
            assert!(limiter.admit(&TenantLimits::UNLIMITED).is_ok());
        }
    }

    #[test]
    fn long_running_requests_are_counted_until_they_end() {
        let watches = LongRunning::default();
        let first = watches.open(Some(2)).expect("first");
        let _second = watches.open(Some(2)).expect("second");
        let refused = watches.open(Some(2)).expect_err("third");
        assert_eq!((refused.code, refused.reason), (429, "TooManyRequests"));
        drop(first);
        assert_eq!(watches.count(), 1);
        assert!(watches.open(Some(2)).is_ok());
        assert!(watches.open(None).is_ok());
    }

    #[tokio::test]
    async fn seats_are_held_then_queued_in_order_then_refused() {
        let limits = TenantLimits {
            max_in_flight: Some(2),
            max_queued: 1,
            ..TenantLimits::UNLIMITED
        };
        let seats = Arc::new(Seats::default());
        let first = seats.take(&limits).await.expect("a free seat");
        let second = seats.take(&limits).await.expect("a free seat");
        // The third waits in the queue; a fourth finds the queue full.
        let waiting = tokio::spawn({
            let seats = seats.clone();
            async move { seats.take(&limits).await.map(|_| ()) }
        });
        while seats.queued.load(Ordering::Relaxed) == 0 {
            tokio::task::yield_now().await;
        }
        let refused = seats.take(&limits).await.expect_err("the queue is full");
        assert_eq!((refused.code, refused.reason), (429, "TooManyRequests"));
        assert!(!waiting.is_finished());
        drop(first);
        waiting
            .await
            .expect("joined")
            .expect("seated once one was free");
        assert_eq!(seats.queued.load(Ordering::Relaxed), 0);
        // A wait longer than allowed is refused, and leaves the queue.
        let _third = seats
            .take(&limits)
            .await
            .expect("the queued one gave its seat back");
        let late = seats
            .take_within(&limits, Duration::from_millis(10))
            .await
            .expect_err("no seat came free");
        assert_eq!(late.code, 429);
        assert_eq!(seats.queued.load(Ordering::Relaxed), 0);
        drop(second);
    }

    #[tokio::test]
    async fn no_seat_limit_means_no_wait() {
        let seats = Seats::default();
        let held: Vec<Seat> =
            futures::future::try_join_all((0..1000).map(|_| seats.take(&TenantLimits::UNLIMITED)))
                .await
                .expect("never refused");
        assert_eq!(held.len(), 1000);
    }

    #[tokio::test]
    async fn stored_bytes_refuse_growth_past_the_limit_and_never_shrinking() {
        use flotilla_storage::Storage;
        let dir = tempfile::tempdir().expect("tempdir");
        let storage: Arc<dyn Storage> = Arc::new(
            flotilla_storage::EmbeddedStorage::open(dir.path().join("s.redb")).expect("open"),
        );
        // More keys than a page, so the sum reads several; and one key of another tenant.
        for i in 0..(STORED_BYTES_PAGE + 10) {
            let _ = storage
                .create(
                    &format!("/registry/a/k{i:04}"),
                    bytes::Bytes::from_static(b"x"),
                )
                .await
                .expect("create");
        }
        let _ = storage
            .create("/registry/ab/other", bytes::Bytes::from(vec![b'y'; 5000]))
            .await
            .expect("create");
        let resource = crate::resources::GroupResource {
            group: String::new(),
            resource: "configmaps".into(),
        };
        let quota = Arc::new(StoredBytes::new(Some(1000)));
        assert_eq!(
            quota.current(&storage, "/registry/a/").await.expect("sum"),
            510
        );
        quota
            .charge(&storage, "/registry/a/", 400, &resource, "big")
            .await
            .expect("room")
            .keep();
        let refused = quota
            .charge(&storage, "/registry/a/", 100, &resource, "more")
            .await
            .expect_err("past the limit");
        assert_eq!((refused.code, refused.reason), (403, "Forbidden"));
        assert!(
            refused.message.contains(
                "exceeded quota: flotilla-cluster-bytes, requested: bytes=100, used: bytes=910, limited: bytes=1000"
            ),
            "{}",
            refused.message
        );
        // A write that fails gives its charge back; a shrinking one is always admitted.
        drop(
            quota
                .charge(&storage, "/registry/a/", 90, &resource, "failed")
                .await
                .expect("room"),
        );
        quota
            .charge(&storage, "/registry/a/", -300, &resource, "smaller")
            .await
            .expect("shrinking")
            .keep();
        quota.release(10);
        assert_eq!(
            quota.current(&storage, "/registry/a/").await.expect("sum"),
            600
        );
        // Without a limit, nothing is refused.
        Arc::new(StoredBytes::new(None))
            .charge(&storage, "/registry/a/", 1 << 40, &resource, "huge")
            .await
            .expect("no quota")
            .keep();
    }
}
