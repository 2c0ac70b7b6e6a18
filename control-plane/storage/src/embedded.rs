//! The embedded backend: a durable, crash-safe revisioned store in one redb file.
//!
//! Layout (see `codec` for the bytes):
//! - `changes`: revision → the change committed at that revision (key, value, and the revisions of
//!   the key's previous state). Every value is stored here, once.
//! - `keys`: key → `(create_revision, mod_revision)` of its current state; the value is that of
//!   the change at `mod_revision`.
//! - `meta`: the format version, the current revision and the compaction point.
//!
//! Values are not kept in `keys` because the writer pays for every page it commits: a 4 KiB B-tree
//! leaf holds dozens of keys with their 16 bytes of revisions but only two or three 1 KiB
//! objects, so concurrent writes spread over many keys would each dirty, split and rewrite a
//! leaf of their own, and every value would be written twice.
//!
//! Writes go through one writer thread that commits whatever is queued as a single redb write
//! transaction with immediate durability (group commit: one fsync acknowledges a whole batch), so
//! throughput grows with the number of concurrent writers instead of being capped at one fsync per
//! write. Each write in a batch gets its own revision and has its precondition checked against the
//! state left by the writes before it, exactly as if they had been committed one by one.
//!
//! A read at a past revision `R` is the current state overlaid, for every key changed after `R`,
//! with the previous state named by its first change after `R`. Compaction to `R` drops the
//! changes superseded before `R` and the deletes before `R`, so every state a read or watch at
//! `R` or later can name is still there. Watches replay the changes and then
//! follow an in-memory broadcast of committed batches (see `watch`).

mod codec;
mod watch;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use async_trait::async_trait;
use bytes::Bytes;
use redb::{
    Database, Durability, ReadTransaction, ReadableDatabase, ReadableTable, Table, TableDefinition,
    TableHandle, WriteTransaction,
};
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::types::{
    EventKind, KeyValue, Outcome, ProgressRequester, RangeRequest, RangeResponse, Revision,
    Storage, StorageError, WatchEvent, WatchStream,
};
use codec::{Change, Revisions, Stored};

const KEYS: TableDefinition<&str, &[u8]> = TableDefinition::new("keys");
const CHANGES: TableDefinition<i64, &[u8]> = TableDefinition::new("changes");
const META: TableDefinition<&str, i64> = TableDefinition::new("meta");
/// Format version 1's tables, read only to convert a file an earlier build wrote.
const V1_KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
const V1_LOG: TableDefinition<i64, &[u8]> = TableDefinition::new("log");

const META_FORMAT: &str = "format";
const META_REVISION: &str = "revision";
const META_COMPACTED: &str = "compacted";

/// The revision of a store nothing was ever written to. Like etcd's, it is 1, not 0: clients read
/// `resourceVersion` "0" as "any version", so an empty store must never report revision 0.
const INITIAL_REVISION: Revision = 1;

/// Tuning for [`EmbeddedStorage`]. `Default` gives the values documented on each field.
#[derive(Debug, Clone)]
pub struct EmbeddedConfig {
    /// Memory redb may use to cache pages, in bytes. Default: 128 MiB.
    pub cache_bytes: usize,
    /// Most writes committed together in one transaction (and one fsync). Default: 1024.
    pub max_batch: usize,
    /// Writes queued for the writer thread before callers wait for room. Default: 4096.
    pub queue_depth: usize,
    /// Committed batches buffered for live watchers. A watcher that falls further behind re-reads
    /// the `changes` table instead of losing events, so this trades memory for fewer re-reads.
    /// Default: 1024.
    pub watch_buffer: usize,
    /// redb's quick repair: every commit also saves the allocator state (a second fsync), so that
    /// reopening after a crash is instant instead of a walk over the whole file. Default: false,
    /// because a control plane's store is small enough to repair quickly and writes are hot.
    pub quick_repair: bool,
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        Self {
            cache_bytes: 128 << 20,
            max_batch: 1024,
            queue_depth: 4096,
            watch_buffer: 1024,
            quick_repair: false,
        }
    }
}

/// The zero-setup [`Storage`] backend: one redb file, fsync on every commit.
///
/// Dropping it stops the writer thread after its current batch (waiting for it) and ends every
/// live watch; the file is closed once the last watch stream has been dropped or polled to its end.
pub struct EmbeddedStorage {
    path: PathBuf,
    db: Arc<Database>,
    /// `None` only while dropping: closing the queue is what stops the writer.
    requests: Option<mpsc::Sender<Request>>,
    events: broadcast::Sender<Arc<Committed>>,
    writer: Option<JoinHandle<()>>,
}

impl fmt::Debug for EmbeddedStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmbeddedStorage")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl EmbeddedStorage {
    /// Opens the store in the redb file at `path`, creating the file if it does not exist (its
    /// directory must). Recovers from a crash if the last process died mid-commit.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StorageError> {
        Self::open_with(path, EmbeddedConfig::default())
    }

    /// [`EmbeddedStorage::open`] with explicit tuning.
    pub fn open_with(path: impl AsRef<Path>, config: EmbeddedConfig) -> Result<Self, StorageError> {
        let path = path.as_ref().to_path_buf();
        let db = Database::builder()
            .set_cache_size(config.cache_bytes)
            .create(&path)
            .map_err(unavailable(format!("open {}", path.display())))?;
        initialize(&db)?;
        let db = Arc::new(db);
        let (requests, queue) = mpsc::channel(config.queue_depth.max(1));
        let (events, _) = broadcast::channel(config.watch_buffer.max(1));
        let writer = Writer {
            db: Arc::clone(&db),
            queue,
            events: events.clone(),
            max_batch: config.max_batch.max(1),
            quick_repair: config.quick_repair,
        };
        let writer = std::thread::Builder::new()
            .name("storage-writer".to_owned())
            .spawn(move || writer.run())
            .map_err(unavailable("start the writer thread"))?;
        tracing::debug!(path = %path.display(), "opened embedded store");
        Ok(Self {
            path,
            db,
            requests: Some(requests),
            events,
            writer: Some(writer),
        })
    }

    /// The file this store lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    async fn submit(&self, op: Op) -> Result<Done, StorageError> {
        let requests = self.requests.as_ref().ok_or_else(writer_gone)?;
        let (reply, done) = oneshot::channel();
        requests
            .send(Request { op, reply })
            .await
            .map_err(|_| writer_gone())?;
        done.await.map_err(|_| writer_gone())?
    }

    async fn write(&self, op: Op) -> Result<Outcome<KeyValue>, StorageError> {
        match self.submit(op).await? {
            Done::Write(outcome) => Ok(outcome),
            Done::Compacted => Err(internal("writer answered a write with a compaction")),
        }
    }

    /// Runs `read` in a fresh read transaction on the blocking pool: redb reads may hit the disk.
    async fn read<T, F>(&self, read: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&ReadTransaction) -> Result<T, StorageError> + Send + 'static,
    {
        read_blocking(Arc::clone(&self.db), read).await
    }
}

impl Drop for EmbeddedStorage {
    fn drop(&mut self) {
        // Closing the queue ends the writer's loop once the batch in hand is committed; joining
        // it makes sure the file is no longer written when the caller reopens it.
        self.requests = None;
        if let Some(writer) = self.writer.take()
            && writer.join().is_err()
        {
            tracing::error!(path = %self.path.display(), "storage writer thread panicked");
        }
    }
}

impl EmbeddedStorage {
    async fn open_watch(
        &self,
        prefix: &str,
        from_revision: Revision,
        progress: Option<ProgressRequester>,
    ) -> Result<WatchStream, StorageError> {
        // Subscribe before reading the head revision: every batch committed after that read is
        // then in the channel, every batch before it is in the `changes` table, and the overlap
        // is skipped by revision. Subscribing after the read would leave a window where a commit is in
        // neither.
        let live = self.events.subscribe();
        let heads = self.read(read_heads).await?;
        if from_revision > 0 && from_revision < heads.compacted {
            return Err(StorageError::Compacted {
                requested: from_revision,
                compacted: heads.compacted,
            });
        }
        let next = if from_revision > 0 {
            from_revision
        } else {
            heads.current + 1
        };
        Ok(watch::Watch::new(
            Arc::clone(&self.db),
            prefix.to_owned(),
            live,
            next,
            heads.current,
            progress,
        )
        .into_stream())
    }
}

#[async_trait]
impl Storage for EmbeddedStorage {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StorageError> {
        let key = key.to_owned();
        self.read(move |txn| {
            let keys = read_table(txn, KEYS)?;
            let changes = read_table(txn, CHANGES)?;
            let found = keys
                .get(key.as_str())
                .map_err(unavailable("read keys table"))?;
            found
                .map(|revisions| {
                    let revisions = codec::decode_revisions(&key, revisions.value())?;
                    Ok(load(&changes, &key, revisions)?.into_key_value(&key))
                })
                .transpose()
        })
        .await
    }

    async fn range(&self, request: RangeRequest) -> Result<RangeResponse, StorageError> {
        self.read(move |txn| range_at(txn, &request)).await
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<Outcome<KeyValue>, StorageError> {
        check_entry(key, &value)?;
        self.write(Op::Create {
            key: key.to_owned(),
            value,
        })
        .await
    }

    async fn update(
        &self,
        key: &str,
        value: Bytes,
        expected_revision: Revision,
    ) -> Result<Outcome<KeyValue>, StorageError> {
        check_entry(key, &value)?;
        self.write(Op::Update {
            key: key.to_owned(),
            value,
            expected: expected_revision,
        })
        .await
    }

    async fn delete(
        &self,
        key: &str,
        expected_revision: Option<Revision>,
    ) -> Result<Outcome<KeyValue>, StorageError> {
        check_entry(key, &[])?;
        self.write(Op::Delete {
            key: key.to_owned(),
            expected: expected_revision,
        })
        .await
    }

    async fn watch(
        &self,
        prefix: &str,
        from_revision: Revision,
    ) -> Result<WatchStream, StorageError> {
        self.open_watch(prefix, from_revision, None).await
    }

    async fn watch_with_progress(
        &self,
        prefix: &str,
        from_revision: Revision,
    ) -> Result<(WatchStream, ProgressRequester), StorageError> {
        let progress = ProgressRequester::default();
        let stream = self
            .open_watch(prefix, from_revision, Some(progress.clone()))
            .await?;
        Ok((stream, progress))
    }

    fn progress_follows_events(&self) -> bool {
        // One process writes and notifies: a progress report is sent after every event before
        // it by construction.
        true
    }

    async fn compact(&self, revision: Revision) -> Result<(), StorageError> {
        match self.submit(Op::Compact { revision }).await? {
            Done::Compacted => Ok(()),
            Done::Write(_) => Err(internal("writer answered a compaction with a write")),
        }
    }

    async fn current_revision(&self) -> Result<Revision, StorageError> {
        Ok(self.read(read_heads).await?.current)
    }

    async fn compacted_revision(&self) -> Result<Revision, StorageError> {
        Ok(self.read(read_heads).await?.compacted)
    }
}

/// Creates the tables and the meta entries of a new file, or checks those of an existing one.
fn initialize(db: &Database) -> Result<(), StorageError> {
    let mut txn = db
        .begin_write()
        .map_err(unavailable("begin write transaction"))?;
    txn.set_durability(Durability::Immediate)
        .map_err(unavailable("set durability"))?;
    {
        write_table(&txn, KEYS)?;
        write_table(&txn, CHANGES)?;
        let mut meta = write_table(&txn, META)?;
        let format = meta
            .get(META_FORMAT)
            .map_err(unavailable("read meta table"))?
            .map(|v| v.value());
        match format {
            Some(codec::FORMAT_VERSION) => {}
            Some(codec::v1::FORMAT_VERSION) => {
                upgrade_from_v1(&txn)?;
                meta.insert(META_FORMAT, codec::FORMAT_VERSION)
                    .map_err(unavailable("write meta table"))?;
                tracing::info!(
                    "converted the embedded store to format {}",
                    codec::FORMAT_VERSION
                );
            }
            Some(other) => {
                return Err(StorageError::Corrupt {
                    key: format!("meta/{META_FORMAT}"),
                    message: format!(
                        "file has format version {other}, this build reads version {}",
                        codec::FORMAT_VERSION
                    ),
                });
            }
            None => {
                for (name, value) in [
                    (META_FORMAT, codec::FORMAT_VERSION),
                    (META_REVISION, INITIAL_REVISION),
                    (META_COMPACTED, 0),
                ] {
                    meta.insert(name, value)
                        .map_err(unavailable("write meta table"))?;
                }
            }
        }
    }
    txn.commit().map_err(unavailable("commit initialization"))
}

/// Rewrites a format-1 file's `kv` and `log` tables as `keys` and `changes`, inside the opening
/// transaction, and drops the old tables.
///
/// Version 1 compaction dropped every record before the compaction point, including the ones
/// that wrote a state still current or named as a later record's previous state (version 1 kept
/// a copy of both elsewhere). Each such state becomes a change of its own at the revision that
/// wrote it, so every pointer of the new layout resolves.
fn upgrade_from_v1(txn: &WriteTransaction) -> Result<(), StorageError> {
    {
        let old_kv = write_table(txn, V1_KV)?;
        let old_log = write_table(txn, V1_LOG)?;
        let mut keys = write_table(txn, KEYS)?;
        let mut changes = write_table(txn, CHANGES)?;
        let restore = |changes: &mut ChangesTable<'_>, key: &str, state: Stored| {
            let present = changes
                .get(state.mod_revision)
                .map_err(unavailable("read changes table"))?
                .is_some()
                || old_log
                    .get(state.mod_revision)
                    .map_err(unavailable("read log table"))?
                    .is_some();
            if !present {
                let revision = state.mod_revision;
                let change = Change {
                    kind: EventKind::Put,
                    key: key.to_owned(),
                    create_revision: state.create_revision,
                    value: state.value,
                    prev: None,
                };
                changes
                    .insert(revision, codec::encode_change(&change).as_slice())
                    .map_err(unavailable("write changes table"))?;
            }
            Ok::<_, StorageError>(())
        };
        for entry in old_log.iter().map_err(unavailable("read log table"))? {
            let (revision, record) = entry.map_err(unavailable("read log table"))?;
            let revision = revision.value();
            let (change, prev) = codec::v1::decode_log(&change_name(revision), record.value())?;
            if let Some(prev) = prev {
                restore(&mut changes, &change.key, prev)?;
            }
            changes
                .insert(revision, codec::encode_change(&change).as_slice())
                .map_err(unavailable("write changes table"))?;
        }
        for entry in old_kv.iter().map_err(unavailable("read kv table"))? {
            let (key, stored) = entry.map_err(unavailable("read kv table"))?;
            let key = key.value();
            let state = codec::v1::decode_kv(key, stored.value())?;
            keys.insert(key, codec::encode_revisions(state.revisions()).as_slice())
                .map_err(unavailable("write keys table"))?;
            restore(&mut changes, key, state)?;
        }
    }
    txn.delete_table(V1_KV)
        .map_err(unavailable("drop kv table"))?;
    txn.delete_table(V1_LOG)
        .map_err(unavailable("drop log table"))?;
    Ok(())
}

/// The state of `key` that `revisions` names: its value is that of the change at
/// `mod_revision`.
fn load(
    changes: &impl ReadableTable<i64, &'static [u8]>,
    key: &str,
    revisions: Revisions,
) -> Result<Stored, StorageError> {
    let what = change_name(revisions.mod_revision);
    let corrupt = |message: String| StorageError::Corrupt {
        key: key.to_owned(),
        message,
    };
    let found = changes
        .get(revisions.mod_revision)
        .map_err(unavailable("read changes table"))?
        .ok_or_else(|| corrupt(format!("the change holding its value, {what}, is missing")))?;
    let (kind, written_key, value) = codec::decode_written(&what, found.value())?;
    if written_key != key {
        return Err(corrupt(format!(
            "{what} changed {written_key}, not this key"
        )));
    }
    if kind != EventKind::Put {
        return Err(corrupt(format!("{what} deleted it")));
    }
    Ok(Stored {
        create_revision: revisions.create_revision,
        mod_revision: revisions.mod_revision,
        value,
    })
}

/// The store's current revision and compaction point, as one read transaction sees them.
#[derive(Debug, Clone, Copy)]
struct Heads {
    current: Revision,
    compacted: Revision,
}

fn read_heads(txn: &ReadTransaction) -> Result<Heads, StorageError> {
    let meta = read_table(txn, META)?;
    Ok(Heads {
        current: meta_value(&meta, META_REVISION)?,
        compacted: meta_value(&meta, META_COMPACTED)?,
    })
}

fn meta_value(
    meta: &impl ReadableTable<&'static str, i64>,
    name: &str,
) -> Result<i64, StorageError> {
    meta.get(name)
        .map_err(unavailable("read meta table"))?
        .map(|v| v.value())
        .ok_or_else(|| StorageError::Corrupt {
            key: format!("meta/{name}"),
            message: "missing".to_owned(),
        })
}

async fn read_blocking<T, F>(db: Arc<Database>, read: F) -> Result<T, StorageError>
where
    T: Send + 'static,
    F: FnOnce(&ReadTransaction) -> Result<T, StorageError> + Send + 'static,
{
    tokio::task::spawn_blocking(move || {
        let txn = db
            .begin_read()
            .map_err(unavailable("begin read transaction"))?;
        read(&txn)
    })
    .await
    .map_err(unavailable("read task"))?
}

/// Serves a [`RangeRequest`] from one read transaction (so from one consistent snapshot).
fn range_at(txn: &ReadTransaction, request: &RangeRequest) -> Result<RangeResponse, StorageError> {
    let heads = read_heads(txn)?;
    let at = if request.revision > 0 {
        request.revision
    } else {
        heads.current
    };
    if at > heads.current {
        return Err(StorageError::FutureRevision {
            requested: at,
            current: heads.current,
        });
    }
    if at < heads.compacted {
        return Err(StorageError::Compacted {
            requested: at,
            compacted: heads.compacted,
        });
    }
    let prefix = request.prefix.as_str();
    let start = match &request.start_key {
        Some(start) if start.as_str() > prefix => start.as_str(),
        _ => prefix,
    };
    let overlay = if at < heads.current {
        past_states(txn, at, prefix, start)?
    } else {
        BTreeMap::new()
    };

    let keys = read_table(txn, KEYS)?;
    let changes = read_table(txn, CHANGES)?;
    let mut current = keys
        .range::<&str>(start..)
        .map_err(unavailable("read keys table"))?;
    let mut overlay = overlay.into_iter().peekable();
    let mut response = RangeResponse {
        revision: at,
        ..RangeResponse::default()
    };
    let mut next_current = next_in_prefix(&mut current, prefix)?;
    // A sorted merge of the current table and the overlay; the overlay wins on equal keys
    // because it holds the state at `at`, which the current table no longer does.
    loop {
        let take_overlay = match (&next_current, overlay.peek()) {
            (None, None) => break,
            (Some(_), None) => false,
            (None, Some(_)) => true,
            (Some((key, _)), Some((overlay_key, _))) => overlay_key.as_str() <= key.value(),
        };
        if take_overlay {
            let Some((key, state)) = overlay.next() else {
                break;
            };
            if next_current.as_ref().is_some_and(|(k, _)| k.value() == key) {
                next_current = next_in_prefix(&mut current, prefix)?;
            }
            if let Some(state) = state {
                accept(&mut response, request.limit, || {
                    Ok(state.into_key_value(&key))
                })?;
            }
        } else if let Some((key, revisions)) = next_current.take() {
            accept(&mut response, request.limit, || {
                let key = key.value();
                let revisions = codec::decode_revisions(key, revisions.value())?;
                Ok(load(&changes, key, revisions)?.into_key_value(key))
            })?;
            next_current = next_in_prefix(&mut current, prefix)?;
        }
    }
    Ok(response)
}

/// Counts one key of a range and returns it if the page still has room; values past the page
/// are never decoded, only counted.
fn accept(
    response: &mut RangeResponse,
    limit: usize,
    decode: impl FnOnce() -> Result<KeyValue, StorageError>,
) -> Result<(), StorageError> {
    response.count += 1;
    if limit == 0 || response.kvs.len() < limit {
        response.kvs.push(decode()?);
    } else {
        response.more = true;
    }
    Ok(())
}

type KvEntry<'a> = (
    redb::AccessGuard<'a, &'static str>,
    redb::AccessGuard<'a, &'static [u8]>,
);

fn next_in_prefix<'a>(
    range: &mut redb::Range<'a, &'static str, &'static [u8]>,
    prefix: &str,
) -> Result<Option<KvEntry<'a>>, StorageError> {
    match range.next() {
        None => Ok(None),
        Some(entry) => {
            let entry = entry.map_err(unavailable("read keys table"))?;
            Ok(entry.0.value().starts_with(prefix).then_some(entry))
        }
    }
}

/// For every key under `prefix` (from `start` on) changed after revision `at`: its state at `at`
/// (`None`: it did not exist then), named by the first change after `at`.
fn past_states(
    txn: &ReadTransaction,
    at: Revision,
    prefix: &str,
    start: &str,
) -> Result<BTreeMap<String, Option<Stored>>, StorageError> {
    let changes = read_table(txn, CHANGES)?;
    let mut states = BTreeMap::new();
    for entry in changes
        .range((at + 1)..)
        .map_err(unavailable("read changes table"))?
    {
        let (revision, record) = entry.map_err(unavailable("read changes table"))?;
        let what = change_name(revision.value());
        let key = codec::decode_change_key(&what, record.value())?;
        if key.starts_with(prefix) && key >= start && !states.contains_key(key) {
            let (_, prev) = codec::decode_change_links(&what, record.value())?;
            let state = prev.map(|prev| load(&changes, key, prev)).transpose()?;
            states.insert(key.to_owned(), state);
        }
    }
    Ok(states)
}

/// The watch event for `change`, committed at `revision`, with the key's previous state.
fn change_event(
    changes: &impl ReadableTable<i64, &'static [u8]>,
    revision: Revision,
    change: Change,
) -> Result<WatchEvent, StorageError> {
    let prev = change
        .prev
        .map(|prev| load(changes, &change.key, prev))
        .transpose()?;
    Ok(change.into_event(revision, prev))
}

fn change_name(revision: Revision) -> String {
    format!("changes/{revision}")
}

fn check_entry(key: &str, value: &[u8]) -> Result<(), StorageError> {
    if key.is_empty() {
        return Err(StorageError::Unavailable {
            message: "refusing an empty key".to_owned(),
            source: None,
        });
    }
    if key.len() + value.len() > codec::MAX_ENTRY_BYTES {
        return Err(StorageError::Unavailable {
            message: format!(
                "entry of {} bytes at {key} exceeds the limit of {} bytes",
                key.len() + value.len(),
                codec::MAX_ENTRY_BYTES
            ),
            source: None,
        });
    }
    Ok(())
}

fn unavailable<E>(context: impl fmt::Display) -> impl FnOnce(E) -> StorageError
where
    E: std::error::Error + Send + Sync + 'static,
{
    move |source| StorageError::Unavailable {
        message: format!("{context}: {source}"),
        source: Some(Box::new(source)),
    }
}

/// `table` in a read transaction; an error names it.
fn read_table<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &ReadTransaction,
    table: TableDefinition<'_, K, V>,
) -> Result<redb::ReadOnlyTable<K, V>, StorageError> {
    txn.open_table(table)
        .map_err(unavailable(format!("open {} table", table.name())))
}

/// `table` in a write transaction, created if the file has none yet; an error names it.
fn write_table<'t, K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &'t WriteTransaction,
    table: TableDefinition<'_, K, V>,
) -> Result<Table<'t, K, V>, StorageError> {
    txn.open_table(table)
        .map_err(unavailable(format!("open {} table", table.name())))
}

fn writer_gone() -> StorageError {
    StorageError::Unavailable {
        message: "the embedded store's writer has stopped".to_owned(),
        source: None,
    }
}

fn internal(message: &str) -> StorageError {
    StorageError::Unavailable {
        message: format!("internal error: {message}"),
        source: None,
    }
}

/// A write or compaction waiting for the writer thread.
struct Request {
    op: Op,
    reply: oneshot::Sender<Result<Done, StorageError>>,
}

enum Op {
    Create {
        key: String,
        value: Bytes,
    },
    Update {
        key: String,
        value: Bytes,
        expected: Revision,
    },
    Delete {
        key: String,
        expected: Option<Revision>,
    },
    Compact {
        revision: Revision,
    },
}

enum Done {
    Write(Outcome<KeyValue>),
    Compacted,
}

/// The events of one committed batch, as live watchers receive them.
#[derive(Debug)]
struct Committed {
    /// The batch's last revision (the store's revision right after the commit).
    last_revision: Revision,
    /// One event per revision of the batch, in order.
    events: Vec<WatchEvent>,
}

/// What applying one op did inside the batch's transaction.
struct Applied {
    result: Result<Done, StorageError>,
    /// Set when the op committed a change, which consumed the next revision.
    event: Option<WatchEvent>,
}

impl Applied {
    fn answer(outcome: Outcome<KeyValue>) -> Self {
        Self {
            result: Ok(Done::Write(outcome)),
            event: None,
        }
    }

    fn failed(error: StorageError) -> Self {
        Self {
            result: Err(error),
            event: None,
        }
    }
}

/// Each op's answer, in order, and the batch's events if it changed anything.
type BatchOutcome = (Vec<Result<Done, StorageError>>, Option<Committed>);

/// The single thread that writes the file.
struct Writer {
    db: Arc<Database>,
    queue: mpsc::Receiver<Request>,
    events: broadcast::Sender<Arc<Committed>>,
    max_batch: usize,
    quick_repair: bool,
}

impl Writer {
    fn run(mut self) {
        let mut batch = Vec::with_capacity(self.max_batch);
        while let Some(first) = self.queue.blocking_recv() {
            batch.push(first);
            // Everything that queued up during the previous fsync rides on this one.
            while batch.len() < self.max_batch {
                match self.queue.try_recv() {
                    Ok(request) => batch.push(request),
                    Err(_) => break,
                }
            }
            self.commit(std::mem::take(&mut batch));
        }
        tracing::debug!("storage writer stopped");
    }

    fn commit(&self, batch: Vec<Request>) {
        let (ops, replies): (Vec<Op>, Vec<_>) = batch.into_iter().map(|r| (r.op, r.reply)).unzip();
        match self.apply(&ops) {
            Ok((results, committed)) => {
                if let Some(committed) = committed {
                    // An error only means nobody is watching right now.
                    let _ = self.events.send(Arc::new(committed));
                }
                for (reply, result) in replies.into_iter().zip(results) {
                    // The caller may have given up waiting; the write stands regardless.
                    let _ = reply.send(result);
                }
            }
            Err(error) => {
                tracing::error!(%error, ops = ops.len(), "storage batch failed");
                for reply in replies {
                    let _ = reply.send(Err(StorageError::Unavailable {
                        message: format!("write batch failed, outcome unknown: {error}"),
                        source: None,
                    }));
                }
            }
        }
    }

    /// Applies the ops in order in one transaction and commits it. An `Err` means the whole
    /// batch failed (redb could not read, write or commit); per-op failures are in the results.
    fn apply(&self, ops: &[Op]) -> Result<BatchOutcome, StorageError> {
        let mut txn = self
            .db
            .begin_write()
            .map_err(unavailable("begin write transaction"))?;
        txn.set_durability(Durability::Immediate)
            .map_err(unavailable("set durability"))?;
        txn.set_quick_repair(self.quick_repair);
        let mut results = Vec::with_capacity(ops.len());
        let mut events = Vec::new();
        let revision;
        {
            let mut keys = write_table(&txn, KEYS)?;
            let mut changes = write_table(&txn, CHANGES)?;
            let mut meta = write_table(&txn, META)?;
            let start = meta_value(&meta, META_REVISION)?;
            let mut current = start;
            for op in ops {
                let applied = match op {
                    Op::Create { key, value } => {
                        create(&mut keys, &mut changes, key, value, current + 1)?
                    }
                    Op::Update {
                        key,
                        value,
                        expected,
                    } => update(&mut keys, &mut changes, key, value, *expected, current + 1)?,
                    Op::Delete { key, expected } => {
                        delete(&mut keys, &mut changes, key, *expected, current + 1)?
                    }
                    Op::Compact { revision } => {
                        compact(&mut changes, &mut meta, *revision, current)?
                    }
                };
                if let Some(event) = applied.event {
                    current += 1;
                    events.push(event);
                }
                results.push(applied.result);
            }
            if current != start {
                meta.insert(META_REVISION, current)
                    .map_err(unavailable("write meta table"))?;
            }
            revision = current;
        }
        txn.commit()
            .map_err(unavailable("commit write transaction"))?;
        let committed = (!events.is_empty()).then_some(Committed {
            last_revision: revision,
            events,
        });
        Ok((results, committed))
    }
}

type KeysTable<'t> = Table<'t, &'static str, &'static [u8]>;
type ChangesTable<'t> = Table<'t, i64, &'static [u8]>;

/// The revisions of `key` inside the write transaction. The outer `Err` is a redb failure (fatal
/// for the batch); the inner one a record that does not decode (fatal for this op only).
fn current_revisions(
    keys: &KeysTable<'_>,
    key: &str,
) -> Result<Result<Option<Revisions>, StorageError>, StorageError> {
    let found = keys.get(key).map_err(unavailable("read keys table"))?;
    Ok(found
        .map(|revisions| codec::decode_revisions(key, revisions.value()))
        .transpose())
}

/// [`load`] with the writer's error layering: a record that does not decode fails this op only
/// (the inner `Err`), a failure to read the file fails the whole batch (the outer one).
fn load_for_write(
    changes: &ChangesTable<'_>,
    key: &str,
    revisions: Revisions,
) -> Result<Result<Stored, StorageError>, StorageError> {
    match load(changes, key, revisions) {
        Err(error @ StorageError::Corrupt { .. }) => Ok(Err(error)),
        loaded => loaded.map(Ok),
    }
}

/// What a write that found `key` at `revisions` answers when its precondition fails: the key's
/// current state, or the failure to decode it.
fn conflict_with(
    changes: &ChangesTable<'_>,
    key: &str,
    revisions: Revisions,
) -> Result<Applied, StorageError> {
    Ok(match load_for_write(changes, key, revisions)? {
        Ok(existing) => Applied::answer(Outcome::Conflict(Some(existing.into_key_value(key)))),
        Err(error) => Applied::failed(error),
    })
}

fn put(
    keys: &mut KeysTable<'_>,
    changes: &mut ChangesTable<'_>,
    key: &str,
    value: &Bytes,
    prev: Option<Stored>,
    revision: Revision,
) -> Result<Applied, StorageError> {
    let create_revision = prev.as_ref().map_or(revision, |p| p.create_revision);
    let revisions = Revisions {
        create_revision,
        mod_revision: revision,
    };
    keys.insert(key, codec::encode_revisions(revisions).as_slice())
        .map_err(unavailable("write keys table"))?;
    let change = Change {
        kind: EventKind::Put,
        key: key.to_owned(),
        create_revision,
        value: value.clone(),
        prev: prev.as_ref().map(Stored::revisions),
    };
    changes
        .insert(revision, codec::encode_change(&change).as_slice())
        .map_err(unavailable("write changes table"))?;
    let event = change.into_event(revision, prev);
    Ok(Applied {
        result: Ok(Done::Write(Outcome::Done(event.kv.clone()))),
        event: Some(event),
    })
}

fn create(
    keys: &mut KeysTable<'_>,
    changes: &mut ChangesTable<'_>,
    key: &str,
    value: &Bytes,
    revision: Revision,
) -> Result<Applied, StorageError> {
    match current_revisions(keys, key)? {
        Err(error) => Ok(Applied::failed(error)),
        Ok(Some(existing)) => conflict_with(changes, key, existing),
        Ok(None) => put(keys, changes, key, value, None, revision),
    }
}

fn update(
    keys: &mut KeysTable<'_>,
    changes: &mut ChangesTable<'_>,
    key: &str,
    value: &Bytes,
    expected: Revision,
    revision: Revision,
) -> Result<Applied, StorageError> {
    match current_revisions(keys, key)? {
        Err(error) => Ok(Applied::failed(error)),
        Ok(None) => Ok(Applied::answer(Outcome::Conflict(None))),
        Ok(Some(existing)) if existing.mod_revision != expected => {
            conflict_with(changes, key, existing)
        }
        // The previous value goes into the watch event, as etcd's `prev_kv` does.
        Ok(Some(existing)) => match load_for_write(changes, key, existing)? {
            Err(error) => Ok(Applied::failed(error)),
            Ok(existing) => put(keys, changes, key, value, Some(existing), revision),
        },
    }
}

fn delete(
    keys: &mut KeysTable<'_>,
    changes: &mut ChangesTable<'_>,
    key: &str,
    expected: Option<Revision>,
    revision: Revision,
) -> Result<Applied, StorageError> {
    let existing = match current_revisions(keys, key)? {
        Err(error) => return Ok(Applied::failed(error)),
        Ok(None) => return Ok(Applied::answer(Outcome::Conflict(None))),
        Ok(Some(existing)) => existing,
    };
    if expected.is_some_and(|expected| expected != existing.mod_revision) {
        return conflict_with(changes, key, existing);
    }
    let existing = match load_for_write(changes, key, existing)? {
        Err(error) => return Ok(Applied::failed(error)),
        Ok(existing) => existing,
    };
    keys.remove(key).map_err(unavailable("write keys table"))?;
    let deleted = KeyValue {
        key: key.to_owned(),
        value: existing.value.clone(),
        create_revision: existing.create_revision,
        mod_revision: revision,
        stale: false,
    };
    let change = Change {
        kind: EventKind::Delete,
        key: key.to_owned(),
        create_revision: 0,
        value: Bytes::new(),
        prev: Some(existing.revisions()),
    };
    changes
        .insert(revision, codec::encode_change(&change).as_slice())
        .map_err(unavailable("write changes table"))?;
    Ok(Applied {
        result: Ok(Done::Write(Outcome::Done(deleted))),
        event: Some(change.into_event(revision, Some(existing))),
    })
}

fn compact(
    changes: &mut ChangesTable<'_>,
    meta: &mut Table<'_, &'static str, i64>,
    revision: Revision,
    current: Revision,
) -> Result<Applied, StorageError> {
    if revision > current {
        return Ok(Applied::failed(StorageError::FutureRevision {
            requested: revision,
            current,
        }));
    }
    let compacted = meta_value(meta, META_COMPACTED)?;
    // Compacting to a point already passed is a no-op, not an error: several apiservers (or a
    // restarted one) may race to compact to the same revision.
    if revision <= compacted {
        return Ok(Applied {
            result: Ok(Done::Compacted),
            event: None,
        });
    }
    // Reads at `revision` or later need, of each key, its latest change at or before the read,
    // and watches from `revision` on need every change from there and the previous state of
    // each (the change it superseded, which may be older than `revision`). So a change goes
    // once a change before `revision` supersedes it, and a delete goes once it is before
    // `revision` (no state is its value).
    // Changes before the previous compaction point were settled by the previous pass, except
    // those still needed then: each of those is named as `prev` by the change that supersedes it,
    // which is at or after that point, so in this pass's range.
    let mut superseded = Vec::new();
    for entry in changes
        .range(compacted..revision)
        .map_err(unavailable("read changes table"))?
    {
        let (at, record) = entry.map_err(unavailable("read changes table"))?;
        let at = at.value();
        match codec::decode_change_links(&change_name(at), record.value()) {
            Ok((kind, prev)) => {
                superseded.extend(prev.map(|prev| prev.mod_revision));
                if kind == EventKind::Delete {
                    superseded.push(at);
                }
            }
            // Kept, with whatever it superseded: one bad record must not stop every later
            // compaction and let the history grow without bound.
            Err(error) => tracing::error!(%error, "compaction skips an undecodable change"),
        }
    }
    meta.insert(META_COMPACTED, revision)
        .map_err(unavailable("write meta table"))?;
    for at in superseded {
        changes
            .remove(at)
            .map_err(unavailable("compact changes table"))?;
    }
    tracing::debug!(revision, "compacted embedded store");
    Ok(Applied {
        result: Ok(Done::Compacted),
        event: None,
    })
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::codec::tests::{v1_kv, v1_log};
    use super::*;

    fn state(create_revision: Revision, mod_revision: Revision, value: &'static str) -> Stored {
        Stored {
            create_revision,
            mod_revision,
            value: Bytes::from_static(value.as_bytes()),
        }
    }

    fn put_change(key: &str, create_revision: Revision, value: &'static str) -> Change {
        Change {
            kind: EventKind::Put,
            key: key.to_owned(),
            create_revision,
            value: Bytes::from_static(value.as_bytes()),
            prev: None,
        }
    }

    /// The revisions the `changes` table holds.
    fn kept_changes(store: &EmbeddedStorage) -> Vec<Revision> {
        let txn = store.db.begin_read().expect("read transaction");
        let changes = txn.open_table(CHANGES).expect("changes table");
        changes
            .iter()
            .expect("iterate changes")
            .map(|entry| entry.expect("change").0.value())
            .collect()
    }

    async fn at(store: &EmbeddedStorage, revision: Revision) -> Vec<(String, String, Revision)> {
        let response = store
            .range(RangeRequest {
                prefix: "/k/".to_owned(),
                revision,
                ..RangeRequest::default()
            })
            .await
            .expect("range");
        response
            .kvs
            .into_iter()
            .map(|kv| {
                let value = String::from_utf8(kv.value.to_vec()).expect("utf-8 value");
                (kv.key, value, kv.mod_revision)
            })
            .collect()
    }

    /// (revision, key, previous value) of the first `n` events of a watch from `from`.
    async fn replay(
        store: &EmbeddedStorage,
        from: Revision,
        n: usize,
    ) -> Vec<(Revision, String, Option<String>)> {
        let mut stream = store.watch("/k/", from).await.expect("watch");
        let mut events = Vec::new();
        while events.len() < n {
            let response = stream.next().await.expect("watch ended").expect("watch");
            events.extend(response.events.into_iter().map(|event| {
                let prev = event
                    .prev
                    .map(|p| String::from_utf8(p.value.to_vec()).expect("utf-8 value"));
                (event.kv.mod_revision, event.kv.key, prev)
            }));
        }
        events
    }

    fn row(key: &str, value: &str, revision: Revision) -> (String, String, Revision) {
        (key.to_owned(), value.to_owned(), revision)
    }

    #[tokio::test]
    async fn compaction_keeps_exactly_what_later_reads_and_watches_name() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStorage::open(dir.path().join("store.redb")).expect("open");
        let value = |v: &'static str| Bytes::from_static(v.as_bytes());
        // 2: a=a1, 3: a=a2, 4: b=b1, 5: a=a3, 6: b deleted, 7: c=c1, 8: a=a4
        let writes = [
            store.create("/k/a", value("a1")).await,
            store.update("/k/a", value("a2"), 2).await,
            store.create("/k/b", value("b1")).await,
            store.update("/k/a", value("a3"), 3).await,
            store.delete("/k/b", Some(4)).await,
            store.create("/k/c", value("c1")).await,
            store.update("/k/a", value("a4"), 5).await,
        ];
        for (revision, write) in (2..).zip(writes) {
            assert!(
                matches!(write, Ok(Outcome::Done(ref kv)) if kv.mod_revision == revision),
                "write at {revision}: {write:?}"
            );
        }
        assert_eq!(kept_changes(&store), (2..=8).collect::<Vec<_>>());

        store.compact(6).await.expect("compact");
        // 2 and 3 were superseded before 6; 5 holds a's state at 6 and 7; 4 is b's state that
        // the delete at 6 names; the delete itself is needed by a watch from 6.
        assert_eq!(kept_changes(&store), vec![4, 5, 6, 7, 8]);
        assert_eq!(at(&store, 6).await, vec![row("/k/a", "a3", 5)]);
        assert_eq!(
            at(&store, 7).await,
            vec![row("/k/a", "a3", 5), row("/k/c", "c1", 7)]
        );
        assert_eq!(
            replay(&store, 6, 3).await,
            vec![
                (6, "/k/b".to_owned(), Some("b1".to_owned())),
                (7, "/k/c".to_owned(), None),
                (8, "/k/a".to_owned(), Some("a3".to_owned())),
            ]
        );

        store.compact(8).await.expect("compact");
        // Now b's delete and its state are gone, and a's state at 5 only as long as the
        // change at 8 can be watched.
        assert_eq!(kept_changes(&store), vec![5, 7, 8]);
        assert_eq!(
            at(&store, 8).await,
            vec![row("/k/a", "a4", 8), row("/k/c", "c1", 7)]
        );
        assert_eq!(
            replay(&store, 8, 1).await,
            vec![(8, "/k/a".to_owned(), Some("a3".to_owned()))]
        );
        assert!(matches!(store.get("/k/b").await, Ok(None)));
    }

    #[tokio::test]
    async fn compaction_passes_over_an_undecodable_change() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = EmbeddedStorage::open(dir.path().join("store.redb")).expect("open");
        let value = |v: &'static str| Bytes::from_static(v.as_bytes());
        // 2: a=a1, 3: a=a2, 4: b=b1, 5: b=b2, 6: c=c1
        store.create("/k/a", value("a1")).await.expect("create");
        store.update("/k/a", value("a2"), 2).await.expect("update");
        store.create("/k/b", value("b1")).await.expect("create");
        store.update("/k/b", value("b2"), 4).await.expect("update");
        store.create("/k/c", value("c1")).await.expect("create");
        {
            let txn = store.db.begin_write().expect("write transaction");
            txn.open_table(CHANGES)
                .expect("changes table")
                .insert(3, &[0xee_u8][..])
                .expect("overwrite change 3");
            txn.commit().expect("commit");
        }
        store.compact(6).await.expect("compaction still runs");
        // The bad change at 3 is kept, and so is the state it superseded; b's old state goes.
        assert_eq!(kept_changes(&store), vec![2, 3, 5, 6]);
        assert_eq!(store.compacted_revision().await.expect("compacted"), 6);
    }

    /// A file as format 1 left it after: 2: a=a1, 3: a=a2, 4: b=b1, 5: a=a3, 6: b deleted,
    /// 7: c=c1, compacted at 4 (records before 4 dropped, values kept in `kv`).
    fn write_version_1(path: &Path) {
        let db = Database::create(path).expect("create file");
        let txn = db.begin_write().expect("write transaction");
        {
            let mut meta = txn.open_table(META).expect("meta");
            for (name, value) in [(META_FORMAT, 1), (META_REVISION, 7), (META_COMPACTED, 4)] {
                meta.insert(name, value).expect("meta entry");
            }
            let mut log = txn.open_table(V1_LOG).expect("log");
            let mut delete_b = put_change("/k/b", 0, "");
            delete_b.kind = EventKind::Delete;
            let records = [
                (4, v1_log(&put_change("/k/b", 4, "b1"), None)),
                (
                    5,
                    v1_log(&put_change("/k/a", 2, "a3"), Some(&state(2, 3, "a2"))),
                ),
                (6, v1_log(&delete_b, Some(&state(4, 4, "b1")))),
                (7, v1_log(&put_change("/k/c", 7, "c1"), None)),
            ];
            for (revision, record) in records {
                log.insert(revision, record.as_slice()).expect("log entry");
            }
            let mut kv = txn.open_table(V1_KV).expect("kv");
            for (key, stored) in [("/k/a", state(2, 5, "a3")), ("/k/c", state(7, 7, "c1"))] {
                kv.insert(key, v1_kv(&stored).as_slice()).expect("kv entry");
            }
        }
        txn.commit().expect("commit");
    }

    #[tokio::test]
    async fn a_version_1_file_is_converted_on_open() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("store.redb");
        write_version_1(&path);
        for _reopen in 0..2 {
            let store = EmbeddedStorage::open(&path).expect("open");
            assert_eq!(store.current_revision().await.expect("revision"), 7);
            assert_eq!(store.compacted_revision().await.expect("compacted"), 4);
            let a = store.get("/k/a").await.expect("get").expect("a exists");
            assert_eq!(
                (a.create_revision, a.mod_revision, &a.value[..]),
                (2, 5, &b"a3"[..])
            );
            // a's state at 4 was only in the record at 5; it is a change of its own now.
            assert_eq!(
                at(&store, 4).await,
                vec![row("/k/a", "a2", 3), row("/k/b", "b1", 4)]
            );
            assert_eq!(
                replay(&store, 4, 4).await,
                vec![
                    (4, "/k/b".to_owned(), None),
                    (5, "/k/a".to_owned(), Some("a2".to_owned())),
                    (6, "/k/b".to_owned(), Some("b1".to_owned())),
                    (7, "/k/c".to_owned(), None),
                ]
            );
            let txn = store.db.begin_read().expect("read transaction");
            assert!(
                txn.open_table(V1_KV).is_err(),
                "the old kv table is dropped"
            );
            assert!(
                txn.open_table(V1_LOG).is_err(),
                "the old log table is dropped"
            );
        }
        let store = EmbeddedStorage::open(&path).expect("open");
        store.compact(6).await.expect("compact");
        assert_eq!(kept_changes(&store), vec![4, 5, 6, 7]);
        let c = store
            .update("/k/c", Bytes::from_static(b"c2"), 7)
            .await
            .expect("update");
        assert!(matches!(c, Outcome::Done(ref kv) if kv.mod_revision == 8));
    }
}
