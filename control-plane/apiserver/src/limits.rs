//! Per-tenant limits: a token bucket of requests per tenant, so one noisy cluster cannot take
//! the whole service from the others (answered 429 with `Retry-After`, as upstream's priority
//! and fairness does), and a quota on the number of objects a cluster stores.

use std::sync::Mutex;
use std::time::Instant;

use crate::error::ApiError;

/// The limits every tenant of a server gets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TenantLimits {
    /// Sustained requests per second per tenant; `None` for no limit.
    pub requests_per_second: Option<f64>,
    /// Requests a tenant may make at once above the sustained rate.
    pub burst: u32,
    /// Most keys a tenant may store (objects and their allocations); `None` for no quota.
    pub max_objects: Option<usize>,
}

impl TenantLimits {
    /// No limit (one tenant on one machine: `flotilla up`, benchmarks of a single cluster).
    pub const UNLIMITED: TenantLimits = TenantLimits {
        requests_per_second: None,
        burst: 0,
        max_objects: None,
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
            Err(ApiError::too_many_requests(
                "Too many requests, please try again later.",
                1,
            ))
        }
    }
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
        let cached = self
            .state
            .lock()
            .ok()
            .and_then(|state| *state)
            .filter(|(_, counted_at)| counted_at.elapsed() < OBJECT_COUNT_TTL);
        let used = match cached {
            Some((count, _)) => count,
            None => {
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
                counted
            }
        };
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let limits = TenantLimits {
            requests_per_second: Some(10.0),
            burst: 5,
            max_objects: None,
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
}
