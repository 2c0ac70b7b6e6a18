//! The `Storage` trait and the value types that cross it.

use std::fmt;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;

/// A storage revision: strictly increasing across the whole store, each committed write its own.
/// Revisions need not be consecutive (the etcd backend's are `etcd revision × 1000 + slot`), and
/// a read's revision may lie between writes' ones: it covers every write at or below it.
/// Revision 0 means "unset" / "latest" wherever it is accepted as input.
pub type Revision = i64;

/// One key with the metadata the apiserver needs for optimistic concurrency.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// The full key.
    pub key: String,
    /// The stored bytes (empty for the tombstone carried by a delete event).
    pub value: Bytes,
    /// Revision at which the key was created (since it last did not exist). It never changes
    /// while the key exists; creates committed together may share it (etcd batches), so it can
    /// be below the create's own `mod_revision`.
    pub create_revision: Revision,
    /// Revision of the last write to the key; for a delete event, the delete's revision.
    pub mod_revision: Revision,
    /// The value was read through a value transformer other than the one that writes
    /// (encryption at rest: an older key, or plain text once a key is configured), so an
    /// update that changes nothing must still be written to re-encrypt it (upstream's
    /// `stale`). The backends themselves always say `false`.
    pub stale: bool,
}

impl fmt::Debug for KeyValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyValue")
            .field("key", &self.key)
            .field("value_len", &self.value.len())
            .field("create_revision", &self.create_revision)
            .field("mod_revision", &self.mod_revision)
            .field("stale", &self.stale)
            .finish()
    }
}

/// The result of a conditional write: either it happened, or the precondition did not hold.
/// A failed precondition is an expected outcome, not an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The write was committed.
    Done(T),
    /// The precondition failed; carries the key's current state (`None` if absent).
    Conflict(Option<KeyValue>),
}

/// A range read over every key that starts with `prefix`, in key order.
#[derive(Debug, Clone, Default)]
pub struct RangeRequest {
    /// Only keys starting with this prefix are returned.
    pub prefix: String,
    /// Start at this key (inclusive) instead of the first key of the prefix; used for `continue`.
    pub start_key: Option<String>,
    /// At most this many keys; 0 means no limit.
    pub limit: usize,
    /// Read the store as it was at this revision; 0 means the current revision.
    /// A revision below the compaction point fails with [`StorageError::Compacted`].
    pub revision: Revision,
}

/// The answer to a [`RangeRequest`].
#[derive(Debug, Clone, Default)]
pub struct RangeResponse {
    /// The keys, in key order.
    pub kvs: Vec<KeyValue>,
    /// True when keys after the last returned one exist in the range.
    pub more: bool,
    /// How many keys the range holds from `start_key` on (including the returned ones).
    pub count: usize,
    /// The revision the read was served at (the current revision when the request said 0).
    pub revision: Revision,
}

/// What happened to a key in a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// The key was created or updated.
    Put,
    /// The key was deleted.
    Delete,
}

/// One change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    /// Put or delete.
    pub kind: EventKind,
    /// The key's new state. For a delete: the key, an empty value, and the delete's revision
    /// as `mod_revision`.
    pub kv: KeyValue,
    /// The key's state before this event, when it existed (always present for a delete or an
    /// update). A backend that can no longer supply it (etcd, once that state is compacted away)
    /// ends the watch with an error instead of sending the event without it.
    pub prev: Option<KeyValue>,
}

/// A batch of watch events, or a progress notification when `events` is empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchResponse {
    /// Events in revision order.
    pub events: Vec<WatchEvent>,
    /// The store has delivered everything up to and including this revision to this watch.
    pub revision: Revision,
}

/// A live watch: batches in revision order, ending with an error (e.g. [`StorageError::Compacted`])
/// or when the store shuts down.
pub type WatchStream = BoxStream<'static, Result<WatchResponse, StorageError>>;

/// Asks a watch made by [`Storage::watch_with_progress`] to report how far it has got: after
/// [`request`](Self::request), the watch's stream yields a response (with no events when none is
/// due) whose `revision` covers, as far as the backend can promise, every write committed
/// before the request (etcd's `RequestProgress`). A consistent read from a cache fed by the
/// watch uses it to learn that the cache has caught up with the store, even when the writes
/// since it last moved were all outside its prefix. Requests made while one is outstanding are
/// answered together; a caller that needs a later revision asks again.
#[derive(Debug, Clone, Default)]
pub struct ProgressRequester(std::sync::Arc<tokio::sync::Notify>);

impl ProgressRequester {
    /// Asks for a progress report.
    pub fn request(&self) {
        self.0.notify_one();
    }

    /// Waits for a request (the watch's side).
    pub async fn requested(&self) {
        self.0.notified().await;
    }
}

/// Failures of the store itself. Precondition failures are [`Outcome::Conflict`], not errors.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The requested revision has been compacted away.
    #[error("required revision {requested} has been compacted (compacted up to {compacted})")]
    Compacted {
        /// The revision that was asked for.
        requested: Revision,
        /// The store's compaction point.
        compacted: Revision,
    },
    /// The requested revision is newer than the store's current revision.
    #[error("required revision {requested} is a future revision (current is {current})")]
    FutureRevision {
        /// The revision that was asked for.
        requested: Revision,
        /// The store's current revision.
        current: Revision,
    },
    /// The backend could not be reached or failed.
    #[error("storage backend unavailable: {message}")]
    Unavailable {
        /// What went wrong, for the operator.
        message: String,
        /// The underlying failure, when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// Stored data could not be read back (a bug or corruption, never a client mistake).
    #[error("storage data corrupt at {key}: {message}")]
    Corrupt {
        /// The key whose data was bad.
        key: String,
        /// What was wrong with it.
        message: String,
    },
}

impl StorageError {
    /// A copy of the same kind, for each of the watchers one failure ends (a compaction stays
    /// `Compacted`, so each client gets its 410); the underlying source is not copied.
    pub fn duplicate(&self) -> StorageError {
        match self {
            StorageError::Compacted {
                requested,
                compacted,
            } => StorageError::Compacted {
                requested: *requested,
                compacted: *compacted,
            },
            StorageError::FutureRevision { requested, current } => StorageError::FutureRevision {
                requested: *requested,
                current: *current,
            },
            StorageError::Corrupt { key, message } => StorageError::Corrupt {
                key: key.clone(),
                message: message.clone(),
            },
            StorageError::Unavailable { message, .. } => StorageError::Unavailable {
                message: message.clone(),
                source: None,
            },
        }
    }
}

/// The revisioned key-value store the apiserver runs on (kube-apiserver's `storage.Interface`,
/// one layer down: this knows keys and bytes, not objects).
#[async_trait]
pub trait Storage: Send + Sync + 'static {
    /// The current value of `key`, if any.
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StorageError>;

    /// Keys under a prefix, optionally at a past revision and in pages.
    async fn range(&self, request: RangeRequest) -> Result<RangeResponse, StorageError>;

    /// Writes `key` only if it does not exist. `Conflict(Some(current))` if it does.
    async fn create(&self, key: &str, value: Bytes) -> Result<Outcome<KeyValue>, StorageError>;

    /// Replaces `key` only if its `mod_revision` is `expected_revision` (compare-and-swap).
    /// `Conflict(current)` otherwise, including `Conflict(None)` when the key is absent.
    async fn update(
        &self,
        key: &str,
        value: Bytes,
        expected_revision: Revision,
    ) -> Result<Outcome<KeyValue>, StorageError>;

    /// Deletes `key`, only if its `mod_revision` is `expected_revision` when one is given.
    /// Returns the deleted state with `mod_revision` set to the delete's revision.
    /// `Conflict(None)` when the key is absent.
    async fn delete(
        &self,
        key: &str,
        expected_revision: Option<Revision>,
    ) -> Result<Outcome<KeyValue>, StorageError>;

    /// Every change under `prefix` with revision `>= from_revision` (0: from now on), in order.
    /// Fails (immediately or as the stream's first item) with `Compacted` when `from_revision`
    /// is older than the compaction point.
    async fn watch(
        &self,
        prefix: &str,
        from_revision: Revision,
    ) -> Result<WatchStream, StorageError>;

    /// [`watch`](Self::watch), plus a handle that asks the watch to report its progress. A
    /// watch of its own, never shared: it is meant for one long-lived consumer (a watch cache)
    /// that shares it onwards.
    async fn watch_with_progress(
        &self,
        prefix: &str,
        from_revision: Revision,
    ) -> Result<(WatchStream, ProgressRequester), StorageError>;

    /// Whether a progress report of [`watch_with_progress`](Self::watch_with_progress) always
    /// follows every event before it. When it may not (etcd before 3.4.31 and 3.5.13), a
    /// cache fed by the watch cannot learn from one that it is current, and consistent reads
    /// go to the store.
    fn progress_follows_events(&self) -> bool;

    /// Discards history older than `revision`; reads and watches below it then fail `Compacted`.
    async fn compact(&self, revision: Revision) -> Result<(), StorageError>;

    /// A revision at or after the last committed write, and before any later one.
    async fn current_revision(&self) -> Result<Revision, StorageError>;

    /// The oldest revision still readable (the compaction point); 0 if nothing was ever compacted.
    async fn compacted_revision(&self) -> Result<Revision, StorageError>;

    /// The store beneath any transformation of values (encryption at rest): for readers that
    /// need keys, revisions and the stored sizes but never the values themselves, so they
    /// neither pay for nor depend on decryption. A store that transforms nothing is its own.
    fn untransformed(&self) -> &dyn Storage;
}
