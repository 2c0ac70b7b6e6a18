//! What admission plugins read, kept briefly: upstream's plugins read LimitRanges, quotas,
//! namespaces and classes from informers rather than storage, and so do these, from copies
//! at most [`LOOKUP_TTL`] old. A write through this server to one of those kinds forgets
//! the tenant's copies of it at once; another replica's write is seen within the TTL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long a copy is used.
pub const LOOKUP_TTL: Duration = Duration::from_secs(1);
/// Copies kept at most; past it every copy is dropped (they are cheap to read again).
const MAX_ENTRIES: usize = 10_000;

/// The kinds plugins read, whose writes forget copies.
pub const LOOKED_UP: [&str; 9] = [
    "limitranges",
    "resourcequotas",
    "namespaces",
    "priorityclasses",
    "storageclasses",
    "mutatingwebhookconfigurations",
    "validatingwebhookconfigurations",
    "validatingadmissionpolicies",
    "validatingadmissionpolicybindings",
];

/// (tenant, plural, namespace or `=name`).
type Key = (String, &'static str, String);
/// When a copy was read, and the objects read.
type Copy = (Instant, Arc<Vec<Value>>);

/// The copies, shared by every request of the server.
#[derive(Default)]
pub struct Lookups {
    entries: Mutex<HashMap<Key, Copy>>,
}

impl Lookups {
    /// The copy under `key`, when it is fresh.
    pub(super) fn get(&self, key: &Key) -> Option<Arc<Vec<Value>>> {
        let entries = self.entries.lock().ok()?;
        entries
            .get(key)
            .filter(|(read, _)| read.elapsed() < LOOKUP_TTL)
            .map(|(_, items)| items.clone())
    }

    /// Keeps `items` under `key`.
    pub(super) fn put(&self, key: Key, items: Arc<Vec<Value>>) {
        if let Ok(mut entries) = self.entries.lock() {
            if entries.len() >= MAX_ENTRIES {
                entries.clear();
            }
            entries.insert(key, (Instant::now(), items));
        }
    }

    /// The name copies of `plural` are kept under: only the kinds plugins read are kept
    /// (and forgotten after writes); any other is read afresh each time.
    pub(super) fn kept(plural: &str) -> Option<&'static str> {
        LOOKED_UP.iter().copied().find(|kept| *kept == plural)
    }

    /// Forgets every copy of `plural` of `tenant` (after a write to one of them).
    pub fn forget(&self, tenant: &str, plural: &str) {
        if !LOOKED_UP.contains(&plural) {
            return;
        }
        if let Ok(mut entries) = self.entries.lock() {
            entries.retain(|(t, p, _), _| !(t == tenant && *p == plural));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_forgets_only_its_tenants_copies_of_its_kind() {
        let lookups = Lookups::default();
        let key =
            |tenant: &str, plural: &'static str| (tenant.to_string(), plural, "ns".to_string());
        lookups.put(key("a", "limitranges"), Arc::new(vec![]));
        lookups.put(key("b", "limitranges"), Arc::new(vec![]));
        lookups.put(key("a", "resourcequotas"), Arc::new(vec![]));
        lookups.forget("a", "limitranges");
        assert!(lookups.get(&key("a", "limitranges")).is_none());
        assert!(lookups.get(&key("b", "limitranges")).is_some());
        assert!(lookups.get(&key("a", "resourcequotas")).is_some());
    }
}
