//! Values shared by content while anyone holds them: tenants that install the same
//! definitions share one compiled schema and one OpenAPI document (a leaf any module may use).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// The live values, by a hash of their content; a value goes when its last holder drops it.
pub struct Shared<T> {
    buckets: Mutex<HashMap<u64, Vec<Weak<T>>>>,
}

impl<T> Default for Shared<T> {
    fn default() -> Self {
        Shared {
            buckets: Mutex::default(),
        }
    }
}

impl<T> Shared<T> {
    /// The live value under `hash` that `same` accepts, else a new one from `make`, kept
    /// for later callers.
    pub fn get_or_make(
        &self,
        hash: u64,
        same: impl Fn(&T) -> bool,
        make: impl FnOnce() -> T,
    ) -> Arc<T> {
        let Ok(mut buckets) = self.buckets.lock() else {
            return Arc::new(make());
        };
        let bucket = buckets.entry(hash).or_default();
        bucket.retain(|weak| weak.strong_count() > 0);
        if let Some(found) = bucket.iter().filter_map(Weak::upgrade).find(|v| same(v)) {
            return found;
        }
        let made = Arc::new(make());
        bucket.push(Arc::downgrade(&made));
        made
    }

    /// How many distinct values are alive.
    pub fn live(&self) -> usize {
        self.buckets.lock().map_or(0, |buckets| {
            buckets
                .values()
                .flatten()
                .filter(|weak| weak.strong_count() > 0)
                .count()
        })
    }
}
