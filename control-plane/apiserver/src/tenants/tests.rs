//! The tenant registry under storage faults: a cluster the store cannot read now is a 503,
//! never a 404 that tells a client its whole cluster is gone.

use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use flotilla_storage::{
    EmbeddedStorage, KeyValue, Outcome, ProgressRequester, RangeRequest, RangeResponse, Revision,
    Storage, StorageError, WatchStream,
};

use super::*;

/// An embedded store whose every call fails `Unavailable` while `away` is set, as etcd
/// does to a replica cut off from it.
struct Unreachable {
    inner: EmbeddedStorage,
    away: AtomicBool,
}

impl Unreachable {
    fn check(&self) -> Result<(), StorageError> {
        if self.away.load(Ordering::Relaxed) {
            return Err(StorageError::Unavailable {
                message: "etcd is unreachable".to_string(),
                source: None,
            });
        }
        Ok(())
    }
}

#[async_trait]
impl Storage for Unreachable {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StorageError> {
        self.check()?;
        self.inner.get(key).await
    }
    async fn range(&self, request: RangeRequest) -> Result<RangeResponse, StorageError> {
        self.check()?;
        self.inner.range(request).await
    }
    async fn create(&self, key: &str, value: Bytes) -> Result<Outcome<KeyValue>, StorageError> {
        self.check()?;
        self.inner.create(key, value).await
    }
    async fn update(
        &self,
        key: &str,
        value: Bytes,
        expected_revision: Revision,
    ) -> Result<Outcome<KeyValue>, StorageError> {
        self.check()?;
        self.inner.update(key, value, expected_revision).await
    }
    async fn delete(
        &self,
        key: &str,
        expected_revision: Option<Revision>,
    ) -> Result<Outcome<KeyValue>, StorageError> {
        self.check()?;
        self.inner.delete(key, expected_revision).await
    }
    async fn watch(&self, prefix: &str, from: Revision) -> Result<WatchStream, StorageError> {
        self.check()?;
        self.inner.watch(prefix, from).await
    }
    async fn watch_with_progress(
        &self,
        prefix: &str,
        from: Revision,
    ) -> Result<(WatchStream, ProgressRequester), StorageError> {
        self.check()?;
        self.inner.watch_with_progress(prefix, from).await
    }
    fn progress_follows_events(&self) -> bool {
        true
    }
    async fn compact(&self, revision: Revision) -> Result<(), StorageError> {
        self.check()?;
        self.inner.compact(revision).await
    }
    async fn current_revision(&self) -> Result<Revision, StorageError> {
        self.check()?;
        self.inner.current_revision().await
    }
    async fn compacted_revision(&self) -> Result<Revision, StorageError> {
        self.check()?;
        self.inner.compacted_revision().await
    }

    fn untransformed(&self) -> &dyn Storage {
        self
    }
}

#[tokio::test]
async fn an_unreadable_record_is_unavailable_and_an_absent_one_is_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = Arc::new(Unreachable {
        inner: EmbeddedStorage::open(dir.path().join("s.redb")).expect("open"),
        away: AtomicBool::new(false),
    });
    let key_encryption = Arc::new(
        KeyEncryptionKey::from_file_text(&KeyEncryptionKey::generate_file_text().expect("kek"))
            .expect("kek"),
    );
    let tenants = Tenants::new(
        Store::new(storage.clone()),
        "https://127.0.0.1:6443",
        key_encryption,
        None,
    );
    for id in ["loaded", "not-yet-loaded"] {
        let record = Tenants::new_record(id).expect("record");
        let key = Tenants::record_key(id);
        let sealed = tenants.encode(&key, &record).expect("sealed");
        storage.create(&key, sealed).await.expect("stored");
    }

    let loaded = tenants.get("loaded").await.expect("readable");
    assert!(loaded.is_some_and(|state| state.record.id == "loaded"));
    assert!(tenants.get("absent").await.expect("readable").is_none());

    storage.away.store(true, Ordering::Relaxed);
    // What this replica loaded keeps serving while the store is away...
    let loaded = tenants.get("loaded").await.expect("served from memory");
    assert!(loaded.is_some());
    // ...and what it has not is a 503 the client retries, not "no such cluster".
    let err = tenants
        .get("not-yet-loaded")
        .await
        .err()
        .expect("an error, not an answer");
    assert_eq!(err.code, 503, "{}", err.message);

    storage.away.store(false, Ordering::Relaxed);
    let found = tenants.get("not-yet-loaded").await.expect("readable again");
    assert!(found.is_some());
}
