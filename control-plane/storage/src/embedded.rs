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
//!
//! An I/O error (a full disk) poisons redb's `Database`: it refuses every later transaction until
//! the file is closed and opened again. The writer thread does that itself (see `handle`) when a
//! batch or a read finds the file failed, pausing between attempts while they fail, so the store
//! heals once the disk has room again instead of failing every write until a restart.

mod codec;
mod handle;
mod watch;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
use handle::{DatabaseHandle, Reopen, Wake};

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

/// How long a reopen waits for the reads still using the failed file (reads are short).
const REOPEN_DRAIN: Duration = Duration::from_secs(5);
/// The pause after a reopen that did not bring the store back (the reopen failed, or the next
/// commit did) before the next attempt; it doubles with each attempt up to [`REOPEN_PAUSE_MAX`],
/// so that a disk that stays full does not make the writer repair the file over and over.
const REOPEN_PAUSE_MIN: Duration = Duration::from_millis(100);
/// The longest pause between two attempts to reopen the file.
const REOPEN_PAUSE_MAX: Duration = Duration::from_secs(2);

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
    db: Arc<DatabaseHandle>,
    /// `None` only while dropping: closing the queue is what stops the writer.
    requests: Option<mpsc::Sender<Queued>>,
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
        // `open`, not `create`: a file that vanished must not come back as an empty store.
        let (file, cache_bytes) = (path.clone(), config.cache_bytes);
        let reopen: Reopen = Box::new(move || {
            Database::builder()
                .set_cache_size(cache_bytes)
                .open(&file)
                .map_err(unavailable(format!("reopen {}", file.display())))
        });
        Self::start(path, config, db, reopen)
    }

    /// Starts the store on `db`, opened from `path`; `reopen` opens it again after an I/O error.
    fn start(
        path: PathBuf,
        config: EmbeddedConfig,
        db: Database,
        reopen: Reopen,
    ) -> Result<Self, StorageError> {
        initialize(&db)?;
        let head = {
            let txn = db
                .begin_read()
                .map_err(unavailable("begin read transaction"))?;
            read_heads(&txn)?.current
        };
        let (requests, queue) = mpsc::channel(config.queue_depth.max(1));
        // Weak: wake-ups must not keep the writer running once the store is dropped.
        let wake_queue = requests.downgrade();
        let wake: Wake = Box::new(move || {
            wake_queue
                .upgrade()
                .is_some_and(|queue| queue.try_send(Queued::Heal).is_ok())
        });
        let db = Arc::new(DatabaseHandle::new(db, reopen, wake));
        let (events, _) = broadcast::channel(config.watch_buffer.max(1));
        let writer = Writer {
            db: Arc::clone(&db),
            queue,
            events: events.clone(),
            max_batch: config.max_batch.max(1),
            quick_repair: config.quick_repair,
            broadcast_through: head,
            health: Health::Healthy,
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
            .send(Queued::Request(Request { op, reply }))
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

    fn untransformed(&self) -> &dyn Storage {
        self
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

/// Runs `read` in a read transaction on the store's current `Database`, on the blocking pool.
/// A read that finds the file failed by an earlier I/O error asks the writer to reopen it (and
/// fails: the caller retries, as after any unavailable store).
async fn read_blocking<T, F>(db: Arc<DatabaseHandle>, read: F) -> Result<T, StorageError>
where
    T: Send + 'static,
    F: FnOnce(&ReadTransaction) -> Result<T, StorageError> + Send + 'static,
{
    tokio::task::spawn_blocking(move || {
        let lease = db.lease()?;
        let result = lease
            .db
            .begin_read()
            .map_err(unavailable("begin read transaction"))
            .and_then(|txn| read(&txn));
        if let Err(error) = &result
            && is_previous_io(error)
        {
            db.report_poisoned(lease.generation);
        }
        result
    })
    .await
    .map_err(unavailable("read task"))?
}

/// Whether `error` is redb refusing work because an earlier I/O error poisoned its `Database`
/// (`StorageError::PreviousIo`, possibly inside a transaction, table or commit error): only
/// closing and reopening the file cures that.
fn is_previous_io(error: &StorageError) -> bool {
    let StorageError::Unavailable {
        source: Some(source),
        ..
    } = error
    else {
        return false;
    };
    let source: &(dyn std::error::Error + 'static) = source.as_ref();
    if matches!(
        source.downcast_ref::<redb::Error>(),
        Some(redb::Error::PreviousIo)
    ) {
        return true;
    }
    matches!(
        redb_storage_error(source),
        Some(redb::StorageError::PreviousIo)
    )
}

/// The `redb::StorageError` that `source` is or wraps, for the redb error types this module
/// turns into [`StorageError::Unavailable`].
fn redb_storage_error<'e>(
    source: &'e (dyn std::error::Error + 'static),
) -> Option<&'e redb::StorageError> {
    if let Some(error) = source.downcast_ref::<redb::StorageError>() {
        return Some(error);
    }
    if let Some(redb::TransactionError::Storage(error)) =
        source.downcast_ref::<redb::TransactionError>()
    {
        return Some(error);
    }
    if let Some(redb::TableError::Storage(error)) = source.downcast_ref::<redb::TableError>() {
        return Some(error);
    }
    if let Some(redb::CommitError::Storage(error)) = source.downcast_ref::<redb::CommitError>() {
        return Some(error);
    }
    if let Some(redb::DatabaseError::Storage(error)) = source.downcast_ref::<redb::DatabaseError>()
    {
        return Some(error);
    }
    None
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

/// What the writer thread's queue carries.
enum Queued {
    Request(Request),
    /// A read found the file failed (or still closed after a failed reopen): reopen it if due.
    Heal,
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
    /// One event per revision of the batch, in order; first, if a commit the writer took for
    /// failed had landed after all, the events of its revisions, read back from the file.
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

/// Why a whole batch failed.
#[derive(Debug)]
enum BatchError {
    /// Before its commit: nothing of the batch is in the file.
    NotWritten(StorageError),
    /// In its commit: the batch may be in the file or not.
    Unknown(StorageError),
}

impl BatchError {
    fn error(&self) -> &StorageError {
        match self {
            BatchError::NotWritten(error) | BatchError::Unknown(error) => error,
        }
    }

    /// What each caller in the batch is answered.
    fn answer(&self) -> StorageError {
        let message = match self {
            BatchError::NotWritten(error) => {
                format!("write batch failed, nothing written: {error}")
            }
            BatchError::Unknown(error) => format!("write batch failed, outcome unknown: {error}"),
        };
        StorageError::Unavailable {
            message,
            source: None,
        }
    }
}

/// The writer's standing with its file across I/O failures. `Writer::heal` moves it to
/// `Recovering`, a batch that commits moves it back to `Healthy`.
#[derive(Debug, Clone, Copy)]
enum Health {
    /// Nothing has failed, or a batch committed since.
    Healthy,
    /// An I/O error failed the file's `Database`. The file is reopened when a batch or a read
    /// needs it, at most once per pause, until a batch commits again.
    Recovering {
        since: Instant,
        /// Reopens tried since `since`.
        attempts: u32,
        next_attempt: Instant,
    },
}

/// The pause before the attempt after the `attempts`-th one.
fn reopen_pause(attempts: u32) -> Duration {
    let doublings = attempts.saturating_sub(1).min(16);
    REOPEN_PAUSE_MIN
        .saturating_mul(1 << doublings)
        .min(REOPEN_PAUSE_MAX)
}

/// The single thread that writes the file.
struct Writer {
    db: Arc<DatabaseHandle>,
    queue: mpsc::Receiver<Queued>,
    events: broadcast::Sender<Arc<Committed>>,
    max_batch: usize,
    quick_repair: bool,
    /// Every revision through this one has been broadcast to watchers (or was in the file when
    /// it was opened). Nothing else is kept between batches: each reads the revision from the file.
    broadcast_through: Revision,
    health: Health,
}

impl Writer {
    fn run(mut self) {
        let mut batch = Vec::with_capacity(self.max_batch);
        while let Some(first) = self.queue.blocking_recv() {
            let mut heal = false;
            let mut next = Some(first);
            // Everything that queued up during the previous fsync rides on this one.
            while let Some(queued) = next {
                match queued {
                    Queued::Request(request) => batch.push(request),
                    Queued::Heal => heal = true,
                }
                next = if batch.len() < self.max_batch {
                    self.queue.try_recv().ok()
                } else {
                    None
                };
            }
            self.db.woken();
            if !batch.is_empty() {
                self.commit(std::mem::take(&mut batch));
            } else if heal {
                // Failures are logged by `heal`; the reads that asked will try again.
                let _ = self.heal();
            }
        }
        tracing::debug!("storage writer stopped");
    }

    fn commit(&mut self, batch: Vec<Request>) {
        let (ops, replies): (Vec<Op>, Vec<_>) = batch.into_iter().map(|r| (r.op, r.reply)).unzip();
        match self.apply_healing(&ops) {
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
            Err(failure) => {
                // While the file is being recovered batches fail alike; the state changes are
                // what `heal` logs.
                if matches!(self.health, Health::Recovering { .. }) {
                    tracing::debug!(error = %failure.error(), ops = ops.len(), "storage batch failed");
                } else {
                    tracing::error!(error = %failure.error(), ops = ops.len(), "storage batch failed");
                }
                for reply in replies {
                    let _ = reply.send(Err(failure.answer()));
                }
            }
        }
    }

    /// [`Self::apply`], on a file reopened first if an I/O error failed it. A batch that finds
    /// the file failed before anything of it was written is tried once more on the reopened file;
    /// one whose commit failed is not (its callers are told the outcome is unknown).
    fn apply_healing(&mut self, ops: &[Op]) -> Result<BatchOutcome, BatchError> {
        self.heal().map_err(BatchError::NotWritten)?;
        let outcome = match self.apply(ops) {
            Err(BatchError::NotWritten(_)) if self.db.needs_reopen() => {
                self.heal().map_err(BatchError::NotWritten)?;
                self.apply(ops)
            }
            outcome => outcome,
        };
        if outcome.is_ok()
            && let Health::Recovering {
                since, attempts, ..
            } = self.health
        {
            tracing::info!(
                outage = ?since.elapsed(),
                reopens = attempts,
                "the embedded store recovered from an I/O error"
            );
            self.health = Health::Healthy;
        }
        outcome
    }

    /// Reopens the file if an I/O error failed it and the pause after the last attempt is over.
    fn heal(&mut self) -> Result<(), StorageError> {
        if !self.db.needs_reopen() {
            return Ok(());
        }
        let now = Instant::now();
        let (since, attempts) = match self.health {
            Health::Healthy => {
                tracing::error!("an I/O error failed the embedded store's file; reopening it");
                (now, 0)
            }
            Health::Recovering { next_attempt, .. } if now < next_attempt => {
                return Err(StorageError::Unavailable {
                    message: format!(
                        "the embedded store is recovering from an I/O error; it reopens its \
                         file again in {} ms",
                        (next_attempt - now).as_millis()
                    ),
                    source: None,
                });
            }
            Health::Recovering {
                since, attempts, ..
            } => (since, attempts),
        };
        let attempts = attempts + 1;
        self.health = Health::Recovering {
            since,
            attempts,
            next_attempt: now + reopen_pause(attempts),
        };
        match self.db.reopen(REOPEN_DRAIN) {
            Ok(()) => {
                tracing::debug!(attempts, "reopened the embedded store's file");
                Ok(())
            }
            Err(error) => {
                if attempts == 1 {
                    tracing::warn!(
                        %error,
                        "could not reopen the embedded store's file; trying again as writes and \
                         reads come, at most every {REOPEN_PAUSE_MAX:?}"
                    );
                } else {
                    tracing::debug!(%error, attempts, "could not reopen the embedded store's file");
                }
                Err(error)
            }
        }
    }

    /// Applies the ops in order in one transaction and commits it. An `Err` means the whole
    /// batch failed (redb could not read, write or commit); per-op failures are in the results.
    fn apply(&mut self, ops: &[Op]) -> Result<BatchOutcome, BatchError> {
        let lease = self.db.lease().map_err(BatchError::NotWritten)?;
        let outcome = self
            .prepare(&lease.db, ops)
            .map_err(BatchError::NotWritten)
            .and_then(|prepared| {
                let Prepared {
                    txn,
                    results,
                    events,
                    revision,
                } = prepared;
                txn.commit()
                    .map_err(unavailable("commit write transaction"))
                    .map_err(BatchError::Unknown)?;
                Ok((results, events, revision))
            });
        match outcome {
            Ok((results, events, revision)) => {
                self.broadcast_through = revision;
                let committed = (!events.is_empty()).then_some(Committed {
                    last_revision: revision,
                    events,
                });
                Ok((results, committed))
            }
            Err(failure) => {
                if is_previous_io(failure.error()) {
                    self.db.mark_poisoned(lease.generation);
                }
                Err(failure)
            }
        }
    }

    /// Applies the ops in a write transaction, left for the caller to commit.
    fn prepare(&self, db: &Database, ops: &[Op]) -> Result<Prepared, StorageError> {
        let mut txn = db
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
            if start > self.broadcast_through {
                // A commit that reported a failure (outcome unknown) landed after all: watchers
                // get its changes before this batch's, or they would never see them.
                tracing::warn!(
                    from = self.broadcast_through + 1,
                    through = start,
                    "a commit that failed is in the file after all; sending its changes to watchers"
                );
                events = read_back(&changes, self.broadcast_through + 1, start)?;
            } else if start < self.broadcast_through {
                tracing::error!(
                    file = start,
                    broadcast = self.broadcast_through,
                    "the embedded store's file lost committed revisions"
                );
            }
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
        Ok(Prepared {
            txn,
            results,
            events,
            revision,
        })
    }
}

/// A batch applied in its write transaction, not yet committed.
struct Prepared {
    txn: WriteTransaction,
    /// Each op's answer, in order.
    results: Vec<Result<Done, StorageError>>,
    /// The events to broadcast once committed.
    events: Vec<WatchEvent>,
    /// The store's revision after the batch.
    revision: Revision,
}

/// The watch events of the changes from `from` through `through`, read back from the file. A
/// change that does not decode is logged and left out rather than failing every later batch.
fn read_back(
    changes: &ChangesTable<'_>,
    from: Revision,
    through: Revision,
) -> Result<Vec<WatchEvent>, StorageError> {
    let mut events = Vec::new();
    for entry in changes
        .range(from..=through)
        .map_err(unavailable("read changes table"))?
    {
        let (revision, record) = entry.map_err(unavailable("read changes table"))?;
        let revision = revision.value();
        let event = codec::decode_change(&change_name(revision), record.value())
            .and_then(|change| change_event(changes, revision, change));
        match event {
            Ok(event) => events.push(event),
            Err(error @ StorageError::Corrupt { .. }) => {
                tracing::error!(%error, "watchers miss a change that does not decode");
            }
            Err(error) => return Err(error),
        }
    }
    Ok(events)
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
mod tests;
