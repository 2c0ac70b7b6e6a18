//! The embedded backend: a durable, crash-safe revisioned store in one redb file.
//!
//! Layout (see `codec` for the bytes):
//! - `kv`: key → `(create_revision, mod_revision, value)`, the current state, for fast reads;
//! - `log`: revision → the change committed at that revision, with the key's previous state;
//! - `meta`: the format version, the current revision and the compaction point.
//!
//! Writes go through one writer thread that commits whatever is queued as a single redb write
//! transaction with immediate durability (group commit: one fsync acknowledges a whole batch), so
//! throughput grows with the number of concurrent writers instead of being capped at one fsync per
//! write. Each write in a batch gets its own revision and has its precondition checked against the
//! state left by the writes before it, exactly as if they had been committed one by one.
//!
//! A read at a past revision `R` is the current state overlaid, for every key changed after `R`,
//! with the previous state recorded by its first change after `R`. Watches replay the log and then
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
};
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::types::{
    EventKind, KeyValue, Outcome, RangeRequest, RangeResponse, Revision, Storage, StorageError,
    WatchEvent, WatchStream,
};
use codec::{LogRecord, Stored};

const KV: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
const LOG: TableDefinition<i64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<&str, i64> = TableDefinition::new("meta");

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
    /// the log instead of losing events, so this trades memory for fewer re-reads. Default: 1024.
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

#[async_trait]
impl Storage for EmbeddedStorage {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StorageError> {
        let key = key.to_owned();
        self.read(move |txn| {
            let kv = txn.open_table(KV).map_err(unavailable("open kv table"))?;
            let found = kv.get(key.as_str()).map_err(unavailable("read kv table"))?;
            found
                .map(|stored| Ok(codec::decode_stored(&key, stored.value())?.into_key_value(&key)))
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
        // Subscribe before reading the head revision: every batch committed after that read is
        // then in the channel, every batch before it is in the log, and the overlap is skipped
        // by revision. Subscribing after the read would leave a window where a commit is in
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
        )
        .into_stream())
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
        txn.open_table(KV).map_err(unavailable("create kv table"))?;
        txn.open_table(LOG)
            .map_err(unavailable("create log table"))?;
        let mut meta = txn
            .open_table(META)
            .map_err(unavailable("create meta table"))?;
        let format = meta
            .get(META_FORMAT)
            .map_err(unavailable("read meta table"))?
            .map(|v| v.value());
        match format {
            Some(codec::FORMAT_VERSION) => {}
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

/// The store's current revision and compaction point, as one read transaction sees them.
#[derive(Debug, Clone, Copy)]
struct Heads {
    current: Revision,
    compacted: Revision,
}

fn read_heads(txn: &ReadTransaction) -> Result<Heads, StorageError> {
    let meta = txn
        .open_table(META)
        .map_err(unavailable("open meta table"))?;
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

    let kv = txn.open_table(KV).map_err(unavailable("open kv table"))?;
    let mut current = kv
        .range::<&str>(start..)
        .map_err(unavailable("read kv table"))?;
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
        } else if let Some((key, stored)) = next_current.take() {
            accept(&mut response, request.limit, || {
                let key = key.value();
                Ok(codec::decode_stored(key, stored.value())?.into_key_value(key))
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
            let entry = entry.map_err(unavailable("read kv table"))?;
            Ok(entry.0.value().starts_with(prefix).then_some(entry))
        }
    }
}

/// For every key under `prefix` (from `start` on) changed after revision `at`: its state at `at`
/// (`None`: it did not exist then), taken from the first change after `at`.
fn past_states(
    txn: &ReadTransaction,
    at: Revision,
    prefix: &str,
    start: &str,
) -> Result<BTreeMap<String, Option<Stored>>, StorageError> {
    let log = txn.open_table(LOG).map_err(unavailable("open log table"))?;
    let mut states = BTreeMap::new();
    for entry in log
        .range((at + 1)..)
        .map_err(unavailable("read log table"))?
    {
        let (revision, record) = entry.map_err(unavailable("read log table"))?;
        let what = log_name(revision.value());
        let key = codec::decode_log_key(&what, record.value())?;
        if key.starts_with(prefix) && key >= start && !states.contains_key(key) {
            let record = codec::decode_log(&what, record.value())?;
            states.insert(record.key, record.prev);
        }
    }
    Ok(states)
}

fn log_name(revision: Revision) -> String {
    format!("log/{revision}")
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
            let mut kv = txn.open_table(KV).map_err(unavailable("open kv table"))?;
            let mut log = txn.open_table(LOG).map_err(unavailable("open log table"))?;
            let mut meta = txn
                .open_table(META)
                .map_err(unavailable("open meta table"))?;
            let start = meta_value(&meta, META_REVISION)?;
            let mut current = start;
            for op in ops {
                let applied = match op {
                    Op::Create { key, value } => {
                        create(&mut kv, &mut log, key, value, current + 1)?
                    }
                    Op::Update {
                        key,
                        value,
                        expected,
                    } => update(&mut kv, &mut log, key, value, *expected, current + 1)?,
                    Op::Delete { key, expected } => {
                        delete(&mut kv, &mut log, key, *expected, current + 1)?
                    }
                    Op::Compact { revision } => compact(&mut log, &mut meta, *revision, current)?,
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

type KvTable<'t> = Table<'t, &'static str, &'static [u8]>;
type LogTable<'t> = Table<'t, i64, &'static [u8]>;

/// The current state of `key` inside the write transaction. The outer `Err` is a redb failure
/// (fatal for the batch); the inner one a record that does not decode (fatal for this op only).
fn current_state(
    kv: &KvTable<'_>,
    key: &str,
) -> Result<Result<Option<Stored>, StorageError>, StorageError> {
    let found = kv.get(key).map_err(unavailable("read kv table"))?;
    Ok(found
        .map(|stored| codec::decode_stored(key, stored.value()))
        .transpose())
}

fn put(
    kv: &mut KvTable<'_>,
    log: &mut LogTable<'_>,
    key: &str,
    value: &Bytes,
    prev: Option<Stored>,
    revision: Revision,
) -> Result<Applied, StorageError> {
    let create_revision = prev.as_ref().map_or(revision, |p| p.create_revision);
    kv.insert(
        key,
        codec::encode_stored(create_revision, revision, value).as_slice(),
    )
    .map_err(unavailable("write kv table"))?;
    let record = LogRecord {
        kind: EventKind::Put,
        key: key.to_owned(),
        create_revision,
        value: value.clone(),
        prev,
    };
    log.insert(revision, codec::encode_log(&record).as_slice())
        .map_err(unavailable("write log table"))?;
    let event = record.into_event(revision);
    Ok(Applied {
        result: Ok(Done::Write(Outcome::Done(event.kv.clone()))),
        event: Some(event),
    })
}

fn create(
    kv: &mut KvTable<'_>,
    log: &mut LogTable<'_>,
    key: &str,
    value: &Bytes,
    revision: Revision,
) -> Result<Applied, StorageError> {
    match current_state(kv, key)? {
        Err(error) => Ok(Applied::failed(error)),
        Ok(Some(existing)) => Ok(Applied::answer(Outcome::Conflict(Some(
            existing.into_key_value(key),
        )))),
        Ok(None) => put(kv, log, key, value, None, revision),
    }
}

fn update(
    kv: &mut KvTable<'_>,
    log: &mut LogTable<'_>,
    key: &str,
    value: &Bytes,
    expected: Revision,
    revision: Revision,
) -> Result<Applied, StorageError> {
    match current_state(kv, key)? {
        Err(error) => Ok(Applied::failed(error)),
        Ok(None) => Ok(Applied::answer(Outcome::Conflict(None))),
        Ok(Some(existing)) if existing.mod_revision != expected => Ok(Applied::answer(
            Outcome::Conflict(Some(existing.into_key_value(key))),
        )),
        Ok(Some(existing)) => put(kv, log, key, value, Some(existing), revision),
    }
}

fn delete(
    kv: &mut KvTable<'_>,
    log: &mut LogTable<'_>,
    key: &str,
    expected: Option<Revision>,
    revision: Revision,
) -> Result<Applied, StorageError> {
    let existing = match current_state(kv, key)? {
        Err(error) => return Ok(Applied::failed(error)),
        Ok(None) => return Ok(Applied::answer(Outcome::Conflict(None))),
        Ok(Some(existing)) => existing,
    };
    if expected.is_some_and(|expected| expected != existing.mod_revision) {
        return Ok(Applied::answer(Outcome::Conflict(Some(
            existing.into_key_value(key),
        ))));
    }
    kv.remove(key).map_err(unavailable("write kv table"))?;
    let deleted = KeyValue {
        key: key.to_owned(),
        value: existing.value.clone(),
        create_revision: existing.create_revision,
        mod_revision: revision,
    };
    let record = LogRecord {
        kind: EventKind::Delete,
        key: key.to_owned(),
        create_revision: 0,
        value: Bytes::new(),
        prev: Some(existing),
    };
    log.insert(revision, codec::encode_log(&record).as_slice())
        .map_err(unavailable("write log table"))?;
    Ok(Applied {
        result: Ok(Done::Write(Outcome::Done(deleted))),
        event: Some(record.into_event(revision)),
    })
}

fn compact(
    log: &mut LogTable<'_>,
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
    if revision > compacted {
        meta.insert(META_COMPACTED, revision)
            .map_err(unavailable("write meta table"))?;
        log.retain_in(..revision, |_, _| false)
            .map_err(unavailable("compact log table"))?;
        tracing::debug!(revision, "compacted embedded store");
    }
    Ok(Applied {
        result: Ok(Done::Compacted),
        event: None,
    })
}
