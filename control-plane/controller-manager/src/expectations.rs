//! Upstream's controller expectations: after a controller creates or deletes objects for an
//! owner, it does not act on that owner again until its caches show those writes (or a while
//! has passed), so a sync that runs before the watch catches up does not create duplicates.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

use crate::informers::Change;

/// How long unobserved writes hold an owner back (upstream: five minutes).
const EXPECTATION_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Pending {
    creates: HashSet<String>,
    deletes: HashSet<String>,
    since: Option<Instant>,
}

/// Writes not yet seen in the caches, per owner key (`namespace/name` or a uid).
#[derive(Default)]
pub struct Expectations {
    pending: Mutex<HashMap<String, Pending>>,
}

impl Expectations {
    /// Records that `owner` created the object named `name`.
    pub fn created(&self, owner: &str, name: &str) {
        self.update(owner, |p| {
            p.creates.insert(name.to_string());
        });
    }

    /// Records that `owner` deleted the object named `name`.
    pub fn deleted(&self, owner: &str, name: &str) {
        self.update(owner, |p| {
            p.deletes.insert(name.to_string());
        });
    }

    /// Records that the caches show `owner`'s object `name` created (upstream's
    /// `CreationObserved`, called from the owned kind's add handler: a create observed and
    /// then deleted before the owner's next sync still counts).
    pub fn seen_created(&self, owner: &str, name: &str) {
        self.observe(owner, |p| p.creates.remove(name));
    }

    /// Records that the caches show `owner`'s object `name` deleted or terminating.
    pub fn seen_deleted(&self, owner: &str, name: &str) {
        self.observe(owner, |p| p.deletes.remove(name));
    }

    /// Lowers the expectations of a pod's `kind` controller as its creates and deletes are seen
    /// (upstream's CreationObserved / DeletionObserved in the pod handlers).
    pub fn observe_owned(&self, change: &Change<'_, Pod>, kind: &str) {
        let Some(pod) = change.new.or(change.old) else {
            return;
        };
        let (Some(owner), Some(name)) = (
            crate::pods::controller_key(&pod.metadata, kind),
            pod.metadata.name.as_deref(),
        ) else {
            return;
        };
        match (change.old, change.new) {
            (None, Some(_)) => self.seen_created(&owner, name),
            (_, None) => self.seen_deleted(&owner, name),
            (Some(old), Some(new)) => {
                if old.metadata.deletion_timestamp.is_none()
                    && new.metadata.deletion_timestamp.is_some()
                {
                    self.seen_deleted(&owner, name);
                }
            }
        }
    }

    fn observe(&self, owner: &str, change: impl FnOnce(&mut Pending) -> bool) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = pending.get_mut(owner) {
            change(entry);
        }
    }

    /// How long the writes `owner` still waits for may hold it back: when to look at it
    /// again if no event comes first.
    pub fn remaining(&self, owner: &str) -> Duration {
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending
            .get(owner)
            .and_then(|p| p.since)
            .map_or(Duration::ZERO, |since| {
                EXPECTATION_TIMEOUT.saturating_sub(since.elapsed())
            })
    }

    fn update(&self, owner: &str, change: impl FnOnce(&mut Pending)) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let entry = pending.entry(owner.to_string()).or_default();
        entry.since.get_or_insert_with(Instant::now);
        change(entry);
    }

    /// Whether `owner` may be synced: every create it made is visible (`present`) and every
    /// delete it made is visible (`gone`: absent or terminating), or they have timed out.
    pub fn satisfied(
        &self,
        owner: &str,
        present: impl Fn(&str) -> bool,
        gone: impl Fn(&str) -> bool,
    ) -> bool {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let Some(entry) = pending.get_mut(owner) else {
            return true;
        };
        entry.creates.retain(|name| !present(name));
        entry.deletes.retain(|name| !gone(name));
        let expired = entry
            .since
            .is_some_and(|t| t.elapsed() > EXPECTATION_TIMEOUT);
        if expired || (entry.creates.is_empty() && entry.deletes.is_empty()) {
            pending.remove(owner);
            return true;
        }
        false
    }

    /// [`Expectations::satisfied`] against a pod cache: a create is seen once the pod is
    /// cached in `namespace`, a delete once it is gone from it or terminating.
    pub fn satisfied_by_pods(
        &self,
        owner: &str,
        pods: &crate::informers::Informer<Pod>,
        namespace: &str,
    ) -> bool {
        self.satisfied(
            owner,
            |name| pods.get(namespace, name).is_some(),
            |name| {
                pods.get(namespace, name)
                    .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
            },
        )
    }

    /// Forgets `owner` (it was deleted).
    pub fn forget(&self, owner: &str) {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(owner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_waits_until_its_writes_are_seen() {
        let expectations = Expectations::default();
        assert!(expectations.satisfied("ns/rs", |_| false, |_| false));
        expectations.created("ns/rs", "rs-a");
        expectations.deleted("ns/rs", "rs-b");
        assert!(!expectations.satisfied("ns/rs", |_| false, |_| false));
        assert!(!expectations.satisfied("ns/rs", |n| n == "rs-a", |_| false));
        // rs-a was seen already: only rs-b's deletion is awaited now.
        assert!(expectations.satisfied("ns/rs", |_| false, |n| n == "rs-b"));
        assert!(expectations.satisfied("ns/rs", |_| false, |_| false));
    }
}
