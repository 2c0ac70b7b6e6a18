//! The etcd backend: [`Storage`] on an etcd v3 cluster through `etcd-client`.
//!
//! Every conditional write is one etcd transaction (compare, then put or delete, else get the
//! current state), so preconditions hold across any number of apiserver replicas. Creates that
//! wait at the same time share one transaction ([`batch`]), so one etcd revision can hold
//! several writes: the revisions this store hands out are `etcd revision × SLOTS + slot`, where
//! a batched create's slot is stored in front of its value ([`slotted_value`]) and every other
//! write has slot 0. Reads, lists, watches and errors speak only these revisions. An optional
//! key prefix namespaces everything this store writes, for sharing one etcd with others.
//!
//! Watches are strict about etcd's known watch bugs (etcd-io/etcd#15220, #15271, #17529,
//! #18089): a watch never resumes silently. If etcd's stream ends, errors, is cancelled, goes
//! backwards or omits a previous value it was asked for, the [`WatchStream`] ends with an error
//! and the caller relists. Progress notifications are requested only by a watch made with
//! [`Storage::watch_with_progress`], and forwarded only to it.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KvClient, PutOptions, Txn,
    TxnOp, TxnOpResponse, TxnResponse, WatchOptions,
};
use futures::StreamExt;

mod batch;

use batch::CreateBatcher;

use crate::types::{
    EventKind, KeyValue, Outcome, ProgressRequester, RangeRequest, RangeResponse, Revision,
    Storage, StorageError, WatchEvent, WatchResponse, WatchStream,
};

/// How long [`EtcdStorage::connect`] waits for a first answer before calling etcd unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// gRPC messages may be as large as a whole unpaginated list; etcd itself bounds them.
const MAX_MESSAGE_BYTES: usize = i32::MAX as usize;
/// A key this store never writes, read only for the response header or a revision check.
const PROBE_KEY: &str = "\0flotilla-probe";

/// Revisions this store hands out per etcd revision: a batch of creates commits at one etcd
/// revision, and each of its creates gets its own slot in it. A thousand keeps the numbers
/// readable (`4711003` is etcd revision 4711, slot 3) and is far above a batch's size.
const SLOTS: i64 = 1000;
/// Marks a stored value that carries a slot: `SLOT_MARK ‖ slot (u16, big-endian) ‖ 0x00 ‖ value`.
/// The zero byte makes every marked value sort strictly above `SLOT_MARK ‖ slot`, which
/// [`last_written_at`] relies on. JSON never starts with 0xff; any other value that does is
/// stored marked, with slot 0, so unmarked values sort below every marked one and reading is
/// never ambiguous.
const SLOT_MARK: &[u8] = b"\xffslot";

/// The revision of slot `slot` of etcd revision `etcd`.
fn revision_of(etcd: i64, slot: i64) -> Revision {
    etcd.saturating_mul(SLOTS).saturating_add(slot)
}

/// The highest revision within etcd revision `etcd`: what a read at `etcd` has seen all of.
fn revision_through(etcd: i64) -> Revision {
    revision_of(etcd, SLOTS - 1)
}

/// The etcd revision holding `revision`, and its slot there. etcd reads revision 0 as "latest",
/// so revisions before the first etcd revision map to 1 (an empty store's revision).
fn etcd_revision(revision: Revision) -> (i64, i64) {
    let revision = revision.max(0);
    ((revision / SLOTS).max(1), revision % SLOTS)
}

/// `value` as stored with slot `slot`: marked when it has a slot or starts with 0xff.
fn slotted_value(slot: u16, value: &[u8]) -> Vec<u8> {
    if slot == 0 && value.first() != Some(&0xff) {
        return value.to_vec();
    }
    let mut stored = Vec::with_capacity(SLOT_MARK.len() + 3 + value.len());
    stored.extend_from_slice(SLOT_MARK);
    stored.extend_from_slice(&slot.to_be_bytes());
    stored.push(0);
    stored.extend_from_slice(value);
    stored
}

/// The slot a stored value was written with, and the caller's bytes.
fn split_slot(stored: &[u8]) -> (i64, &[u8]) {
    match stored.strip_prefix(SLOT_MARK) {
        Some([high, low, 0, value @ ..]) => (i64::from(u16::from_be_bytes([*high, *low])), value),
        _ => (0, stored),
    }
}

/// Turns etcd's key-values into this store's, and back: the key prefix and the slots.
struct Codec {
    /// Prepended to every key on the way in and stripped on the way out.
    namespace: String,
}

impl Codec {
    fn full_key(&self, key: &str) -> Vec<u8> {
        let mut full = Vec::with_capacity(self.namespace.len() + key.len());
        full.extend_from_slice(self.namespace.as_bytes());
        full.extend_from_slice(key.as_bytes());
        full
    }

    /// One etcd key-value as this store's. `create_revision` is slot 0 of the etcd revision that
    /// created the key: the slot is stored with a value only until the key is next written, and
    /// a key's creation revision must not change.
    fn key_value(&self, kv: &etcd_client::KeyValue) -> Result<KeyValue, StorageError> {
        let (slot, value) = split_slot(kv.value());
        Ok(KeyValue {
            key: user_key(&self.namespace, kv.key())?,
            value: Bytes::copy_from_slice(value),
            create_revision: revision_of(kv.create_revision(), 0),
            mod_revision: revision_of(kv.mod_revision(), slot),
            stale: false,
        })
    }

    /// The state of `key` as the failure branch of a transaction read it.
    fn failed_branch_state(
        &self,
        response: &TxnResponse,
    ) -> Result<Option<KeyValue>, StorageError> {
        for op in response.op_responses() {
            if let TxnOpResponse::Get(get) = op {
                return get.kvs().first().map(|kv| self.key_value(kv)).transpose();
            }
        }
        Err(unexpected("transaction failure branch carries no read"))
    }

    /// What a create transaction committed at etcd revision `etcd` in slot `slot` means.
    fn create_outcome(
        &self,
        response: &TxnResponse,
        etcd: i64,
        key: &str,
        value: Bytes,
        slot: u16,
    ) -> Result<Outcome<KeyValue>, StorageError> {
        if !response.succeeded() {
            return Ok(Outcome::Conflict(self.failed_branch_state(response)?));
        }
        Ok(Outcome::Done(KeyValue {
            key: key.to_owned(),
            value,
            create_revision: revision_of(etcd, 0),
            mod_revision: revision_of(etcd, i64::from(slot)),
            stale: false,
        }))
    }
}

/// [`Storage`] on an etcd v3 cluster (tested against etcd 3.4).
pub struct EtcdStorage {
    client: Client,
    codec: Arc<Codec>,
    /// Where creates queue to share a transaction.
    creates: CreateBatcher,
    /// The last compaction point seen, in etcd revisions; it only moves forward, so it is a
    /// lower bound for [`EtcdStorage::compacted_revision`]'s search.
    compacted_hint: AtomicI64,
    /// Whether every member that answered at connection runs an etcd whose progress reports
    /// follow a watch's events ([`progress_follows_events`]).
    progress_in_order: bool,
}

impl std::fmt::Debug for EtcdStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStorage")
            .field("namespace", &self.codec.namespace)
            .finish_non_exhaustive()
    }
}

impl EtcdStorage {
    /// Connects to etcd at `endpoints` (`host:port` or `http://host:port`; TLS is not built in)
    /// and checks that it answers.
    ///
    /// With `prefix`, every key is stored as `prefix + key` and handed back without it. End the
    /// prefix with a separator (`/flotilla/`): it is a plain byte prefix, so a range over all
    /// keys of prefix `/a` would also see the keys of a store with prefix `/ab`.
    pub async fn connect(
        endpoints: &[String],
        prefix: Option<String>,
    ) -> Result<Self, StorageError> {
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            // Keepalives are what notice a dead member under an idle watch.
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_keep_alive_while_idle(true);
        let client = Client::connect(endpoints, Some(options))
            .await
            .map_err(etcd_error(format!(
                "connect to etcd at {}",
                endpoints.join(",")
            )))?;
        let codec = Arc::new(Codec {
            namespace: prefix.unwrap_or_default(),
        });
        let creates = CreateBatcher::new(
            client
                .kv_client()
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
            codec.clone(),
        );
        let progress_in_order = members_report_progress_in_order(endpoints).await;
        let storage = Self {
            client,
            codec,
            creates,
            compacted_hint: AtomicI64::new(0),
            progress_in_order,
        };
        // The client connects lazily; one round trip here turns a wrong endpoint into an error
        // now rather than on the first request.
        tokio::time::timeout(CONNECT_TIMEOUT, storage.current_revision())
            .await
            .map_err(|_| StorageError::Unavailable {
                message: format!(
                    "etcd at {} did not answer within {CONNECT_TIMEOUT:?}",
                    endpoints.join(",")
                ),
                source: None,
            })??;
        Ok(storage)
    }

    fn kv(&self) -> KvClient {
        self.client
            .kv_client()
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// A range read, sent again while refused at connection ([`unsent_retried`]).
    async fn get_retried(
        &self,
        key: Vec<u8>,
        options: Option<GetOptions>,
    ) -> Result<etcd_client::GetResponse, etcd_client::Error> {
        unsent_retried(|| {
            let (mut kv, key, options) = (self.kv(), key.clone(), options.clone());
            async move { kv.get(key, options).await }
        })
        .await
    }

    /// A transaction, sent again while refused at connection ([`unsent_retried`]).
    async fn txn_retried(&self, txn: Txn) -> Result<etcd_client::TxnResponse, etcd_client::Error> {
        unsent_retried(|| {
            let (mut kv, txn) = (self.kv(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await
    }

    fn full_key(&self, key: &str) -> Vec<u8> {
        self.codec.full_key(key)
    }

    /// Turns etcd's refusal of a revision into the matching [`StorageError`].
    async fn revision_error(
        &self,
        error: etcd_client::Error,
        requested: Revision,
        context: &str,
    ) -> StorageError {
        match refusal(&error) {
            Some(Refusal::Compacted) => {
                // etcd does not say where the compaction point is; look it up. If that fails
                // too, the point is at least just past what was asked for.
                let compacted = self.compacted_revision().await.unwrap_or(requested + 1);
                StorageError::Compacted {
                    requested,
                    compacted,
                }
            }
            Some(Refusal::Future) => match self.current_revision().await {
                Ok(current) => StorageError::FutureRevision { requested, current },
                Err(error) => error,
            },
            Some(Refusal::TooBig) | None => etcd_error(context)(error),
        }
    }

    /// Whether etcd can still serve a read at etcd revision `revision`.
    async fn readable(&self, revision: i64) -> Result<bool, StorageError> {
        let options = GetOptions::new().with_revision(revision).with_count_only();
        match self
            .get_retried(self.full_key(PROBE_KEY), Some(options))
            .await
        {
            Ok(_) => Ok(true),
            Err(error) if refusal(&error) == Some(Refusal::Compacted) => Ok(false),
            Err(error) => Err(etcd_error("probe a past revision")(error)),
        }
    }
}

/// Whether etcd `version` (`3.4.23`) sends a watch's progress report only after every event
/// before it. Before 3.4.31 and 3.5.13 it answered a progress request at once with its current
/// revision, even to a watch still catching up on history (etcd-io/etcd#15220): a cache trusting
/// that report believes itself current while events are still on their way. Upstream's
/// kube-apiserver serves consistent reads from its watch cache only from those versions on.
fn progress_follows_events(version: &str) -> bool {
    let mut parts = version
        .trim_start_matches('v')
        .split(['.', '-', '+'])
        .map(|part| part.parse::<u32>().ok());
    let (Some(Some(major)), Some(Some(minor)), Some(Some(patch))) =
        (parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    match (major, minor) {
        (3, 4) => patch >= 31,
        (3, 5) => patch >= 13,
        (3, 0..=3) | (0..=2, _) => false,
        _ => true,
    }
}

/// Asks each member for its version: whether every one that answers has progress reports in
/// order. A member that does not answer now is not counted (one down at start-up would
/// otherwise cost every consistent read its cache for the life of the process).
async fn members_report_progress_in_order(endpoints: &[String]) -> bool {
    let options = ConnectOptions::new().with_connect_timeout(Duration::from_secs(2));
    // Asked at once, not in turn: a dead member costs start-up its timeout once, not each.
    let answers = futures::future::join_all(endpoints.iter().map(|endpoint| {
        let options = options.clone();
        async move {
            let status = async {
                let mut client = Client::connect([endpoint.as_str()], Some(options)).await?;
                client.status().await
            };
            (
                endpoint,
                tokio::time::timeout(Duration::from_secs(3), status).await,
            )
        }
    }))
    .await;
    let mut versions = Vec::new();
    for (endpoint, answer) in answers {
        match answer {
            Ok(Ok(status)) => versions.push(status.version().to_string()),
            Ok(Err(error)) => tracing::debug!(%endpoint, %error, "etcd member's version"),
            Err(_) => tracing::debug!(%endpoint, "etcd member's version: no answer"),
        }
    }
    let old: Vec<&String> = versions
        .iter()
        .filter(|v| !progress_follows_events(v))
        .collect();
    if let Some(version) = old.first() {
        tracing::warn!(
            %version,
            "etcd before 3.4.31 or 3.5.13 may report a watch's progress ahead of its events: \
             consistent reads are served by etcd, not the watch caches (upgrade etcd to serve \
             them from memory)"
        );
    }
    !versions.is_empty() && old.is_empty()
}

impl EtcdStorage {
    /// A watch of `prefix`; with `progress`, one that asks etcd for progress when requested.
    async fn open_watch(
        &self,
        prefix: &str,
        from_revision: Revision,
        progress: Option<ProgressRequester>,
    ) -> Result<WatchStream, StorageError> {
        let mut options = WatchOptions::new().with_prefix().with_prev_key();
        if from_revision > 0 {
            // From inside an etcd revision: etcd sends all of it, the watch drops what precedes
            // `from_revision`.
            options = options.with_start_revision(etcd_revision(from_revision).0);
        }
        let mut stream = self
            .client
            .watch_client()
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .watch(self.full_key(prefix), Some(options))
            .await
            .map_err(etcd_error("start watch"))?;
        // Wait until etcd has registered the watch: a watch "from now" must see every write made
        // after this call returns.
        match stream.message().await {
            Ok(Some(created)) if created.created() && !created.canceled() => {}
            Ok(Some(other)) => {
                return Err(StorageError::Unavailable {
                    message: format!(
                        "etcd refused the watch: canceled={} reason={:?}",
                        other.canceled(),
                        other.cancel_reason()
                    ),
                    source: None,
                });
            }
            Ok(None) => return Err(unexpected("etcd closed the watch before creating it")),
            Err(error) => return Err(etcd_error("start watch")(error)),
        }
        let (requests, responses) = stream.split();
        let watch = EtcdWatch {
            requests,
            responses,
            progress,
            codec: self.codec.clone(),
            start: from_revision.max(0),
            next: from_revision.max(0),
            finished: false,
        };
        Ok(futures::stream::unfold(watch, |mut watch| async move {
            let item = watch.next_response().await?;
            Some((item, watch))
        })
        .boxed())
    }
}

#[async_trait]
impl Storage for EtcdStorage {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StorageError> {
        let response = self
            .get_retried(self.full_key(key), None)
            .await
            .map_err(etcd_error("get"))?;
        response
            .kvs()
            .first()
            .map(|kv| self.codec.key_value(kv))
            .transpose()
    }

    async fn range(&self, request: RangeRequest) -> Result<RangeResponse, StorageError> {
        let prefix = self.full_key(&request.prefix);
        let mut start = match &request.start_key {
            Some(start) if start.as_str() > request.prefix.as_str() => self.full_key(start),
            _ => prefix.clone(),
        };
        if start.is_empty() {
            // etcd has no empty key; "\0" is the smallest one.
            start.push(0);
        }
        // A read inside an etcd revision reads all of it, then drops the creates of slots after
        // the one asked for: only batched creates have slots, so they did not exist yet.
        let (at, last_slot) = if request.revision > 0 {
            etcd_revision(request.revision)
        } else {
            (0, SLOTS - 1)
        };
        // Those dropped are one batch's creates at most, so reading that many more keys keeps
        // every page full.
        let inside_revision = at > 0 && last_slot < SLOTS - 1;
        let mut options = GetOptions::new()
            .with_range(prefix_end(&prefix))
            .with_revision(at);
        if request.limit > 0 {
            let extra = if inside_revision { batch::MAX_BATCH } else { 0 };
            let limit = request.limit.saturating_add(extra);
            options = options.with_limit(i64::try_from(limit).unwrap_or(i64::MAX));
        }
        let response = match self.get_retried(start, Some(options)).await {
            Ok(response) => response,
            Err(error) => return Err(self.revision_error(error, request.revision, "range").await),
        };
        let revision = if request.revision > 0 {
            request.revision
        } else {
            revision_through(header_revision(response.header())?)
        };
        let newest = revision_of(at, last_slot);
        let mut kvs = Vec::with_capacity(response.kvs().len());
        let mut later = 0;
        for kv in response.kvs() {
            let kv = self.codec.key_value(kv)?;
            if inside_revision && kv.mod_revision > newest {
                later += 1;
            } else {
                kvs.push(kv);
            }
        }
        let mut more = response.more();
        if request.limit > 0 && kvs.len() > request.limit {
            kvs.truncate(request.limit);
            more = true;
        }
        let count =
            usize::try_from(response.count()).map_err(|_| unexpected("negative range count"))?;
        Ok(RangeResponse {
            kvs,
            more,
            // Exact unless a page of a read inside an etcd revision leaves out later creates
            // beyond what it read, which it cannot see.
            count: count.saturating_sub(later),
            revision,
        })
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<Outcome<KeyValue>, StorageError> {
        self.creates.create(self.full_key(key), key, value).await
    }

    async fn update(
        &self,
        key: &str,
        value: Bytes,
        expected_revision: Revision,
    ) -> Result<Outcome<KeyValue>, StorageError> {
        let full = self.full_key(key);
        // etcd compares an absent key's mod_revision as 0; requiring it to exist keeps an
        // update from ever creating a key.
        let mut compares = vec![Compare::create_revision(
            full.clone(),
            CompareOp::Greater,
            0,
        )];
        compares.extend(last_written_at(&full, expected_revision));
        let txn = Txn::new()
            .when(compares)
            .and_then([TxnOp::put(
                full.clone(),
                slotted_value(0, &value),
                Some(PutOptions::new().with_prev_key()),
            )])
            .or_else([TxnOp::get(full, None)]);
        let response = self.txn_retried(txn).await.map_err(etcd_error("update"))?;
        if !response.succeeded() {
            return Ok(Outcome::Conflict(
                self.codec.failed_branch_state(&response)?,
            ));
        }
        let revision = header_revision(response.header())?;
        let prev = response.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Put(put) => put.prev_key().map(etcd_client::KeyValue::create_revision),
            _ => None,
        });
        let created = prev.ok_or_else(|| unexpected("update response lacks the previous value"))?;
        Ok(Outcome::Done(KeyValue {
            key: key.to_owned(),
            value,
            create_revision: revision_of(created, 0),
            mod_revision: revision_of(revision, 0),
            stale: false,
        }))
    }

    async fn delete(
        &self,
        key: &str,
        expected_revision: Option<Revision>,
    ) -> Result<Outcome<KeyValue>, StorageError> {
        let full = self.full_key(key);
        let mut compares = vec![Compare::create_revision(
            full.clone(),
            CompareOp::Greater,
            0,
        )];
        if let Some(expected) = expected_revision {
            compares.extend(last_written_at(&full, expected));
        }
        let txn = Txn::new()
            .when(compares)
            .and_then([TxnOp::delete(
                full.clone(),
                Some(etcd_client::DeleteOptions::new().with_prev_key()),
            )])
            .or_else([TxnOp::get(full, None)]);
        let response = self.txn_retried(txn).await.map_err(etcd_error("delete"))?;
        if !response.succeeded() {
            return Ok(Outcome::Conflict(
                self.codec.failed_branch_state(&response)?,
            ));
        }
        let revision = header_revision(response.header())?;
        let prev = response
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Delete(delete) => delete.prev_kvs().first().cloned(),
                _ => None,
            })
            .ok_or_else(|| unexpected("delete response lacks the previous value"))?;
        let mut deleted = self.codec.key_value(&prev)?;
        deleted.mod_revision = revision_of(revision, 0);
        Ok(Outcome::Done(deleted))
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
        self.progress_in_order
    }

    async fn compact(&self, revision: Revision) -> Result<(), StorageError> {
        // History from the start of `revision`'s etcd revision is kept: a little more than asked.
        let (etcd, _) = etcd_revision(revision);
        let compacted = unsent_retried(|| {
            let mut kv = self.kv();
            async move { kv.compact(etcd, None).await }
        })
        .await;
        match compacted {
            Ok(_) => {}
            // Already compacted to or past `revision`: the goal holds; another replica got there.
            Err(error) if refusal(&error) == Some(Refusal::Compacted) => {}
            Err(error) => return Err(self.revision_error(error, revision, "compact").await),
        }
        self.compacted_hint.fetch_max(etcd, Ordering::Relaxed);
        Ok(())
    }

    async fn current_revision(&self) -> Result<Revision, StorageError> {
        let response = self
            .get_retried(
                self.full_key(PROBE_KEY),
                Some(GetOptions::new().with_count_only()),
            )
            .await
            .map_err(etcd_error("read the current revision"))?;
        // Later writes go to later etcd revisions, so all of this one is current.
        Ok(revision_through(header_revision(response.header())?))
    }

    async fn compacted_revision(&self) -> Result<Revision, StorageError> {
        // etcd exposes its compaction point only through refusals, so find the oldest readable
        // revision by bisection, starting from the last point seen (usually still exact: two
        // probes).
        let (current, _) = etcd_revision(self.current_revision().await?);
        let hint = self
            .compacted_hint
            .load(Ordering::Relaxed)
            .clamp(1, current);
        let found = if self.readable(hint).await? {
            hint
        } else {
            // Invariant: `low` is not readable, `high` is (the current revision always is).
            let (mut low, mut high) = (hint, current);
            while high - low > 1 {
                let middle = low + (high - low) / 2;
                if self.readable(middle).await? {
                    high = middle;
                } else {
                    low = middle;
                }
            }
            high
        };
        self.compacted_hint.fetch_max(found, Ordering::Relaxed);
        // Revision 1 readable means nothing was compacted, which the trait reports as 0.
        Ok(if found <= 1 { 0 } else { revision_of(found, 0) })
    }

    fn untransformed(&self) -> &dyn Storage {
        self
    }
}

/// One etcd watch, translated and checked response by response.
struct EtcdWatch {
    /// Kept while the watch lives: dropping it closes the gRPC stream, which ends the watch.
    requests: etcd_client::WatchRequestSender,
    responses: etcd_client::WatchResponseStream,
    /// Set for a watch that reports progress when asked.
    progress: Option<ProgressRequester>,
    codec: Arc<Codec>,
    /// The revision the watch starts from: events of the same etcd revision before it are
    /// not this watch's.
    start: Revision,
    /// Events below this revision were delivered already (or precede the watch's start).
    next: Revision,
    finished: bool,
}

impl EtcdWatch {
    async fn next_response(&mut self) -> Option<Result<WatchResponse, StorageError>> {
        if self.finished {
            return None;
        }
        let item = self.step().await;
        if item.is_err() {
            self.finished = true;
        }
        Some(item)
    }

    async fn step(&mut self) -> Result<WatchResponse, StorageError> {
        loop {
            let message = match &self.progress {
                Some(progress) => tokio::select! {
                    message = self.responses.message() => message,
                    () = progress.requested() => {
                        self.requests
                            .request_progress()
                            .await
                            .map_err(etcd_error("request watch progress"))?;
                        continue;
                    }
                },
                None => self.responses.message().await,
            };
            let response = match message {
                Ok(Some(response)) => response,
                // A quiet end would look like "no more changes"; it means the opposite.
                Ok(None) => return Err(unexpected("etcd ended the watch stream")),
                Err(error) => return Err(etcd_error("watch")(error)),
            };
            if response.compact_revision() > 0 {
                return Err(StorageError::Compacted {
                    requested: self.next,
                    compacted: revision_of(response.compact_revision(), 0),
                });
            }
            if response.canceled() {
                return Err(StorageError::Unavailable {
                    message: format!("etcd cancelled the watch: {:?}", response.cancel_reason()),
                    source: None,
                });
            }
            let mut events = Vec::with_capacity(response.events().len());
            for event in response.events() {
                let event = self.event(event)?;
                // A watch from inside an etcd revision starts with all of it; the slots before
                // the start are not this watch's.
                if event.kv.mod_revision >= self.next {
                    events.push(event);
                } else if event.kv.mod_revision >= self.start {
                    // Past the start and yet below what a progress report promised was all
                    // sent: etcd reported progress ahead of its events (etcd-io/etcd#15220).
                    // Ended loudly, so the watch's consumer starts again from what it has;
                    // dropped quietly, the event would be lost to every watcher.
                    return Err(unexpected(&format!(
                        "etcd sent an event at revision {} after reporting progress through {}",
                        event.kv.mod_revision,
                        self.next - 1
                    )));
                }
            }
            if events.is_empty() {
                // A progress notification (no events at all, answering a request: etcd sends
                // them to a watch only once it has sent every event up to the header's
                // revision), a duplicate creation notice, or only events before the start.
                if self.progress.is_some() && response.events().is_empty() && !response.created() {
                    let through = revision_through(header_revision(response.header())?);
                    if through >= self.next {
                        self.next = through + 1;
                    }
                    return Ok(WatchResponse {
                        events,
                        revision: self.next - 1,
                    });
                }
                continue;
            }
            let mut previous = self.next;
            for event in &events {
                if event.kv.mod_revision < previous {
                    return Err(unexpected(&format!(
                        "etcd watch went backwards: event at revision {} after revision {}",
                        event.kv.mod_revision, previous
                    )));
                }
                previous = event.kv.mod_revision;
            }
            // Responses split only between etcd revisions, so this one holds all of the last
            // event's etcd revision: the watch has seen every slot of it, and the next response
            // starts after it. Reporting that (not the last event's slot) lets a cache fed by
            // the watch match the store's current revision without asking for progress.
            let through = revision_through(etcd_revision(previous).0);
            self.next = through + 1;
            return Ok(WatchResponse {
                events,
                revision: through,
            });
        }
    }

    fn event(&self, event: &etcd_client::Event) -> Result<WatchEvent, StorageError> {
        let raw = event
            .kv()
            .ok_or_else(|| unexpected("watch event without a key"))?;
        let kv = self.codec.key_value(raw)?;
        let prev = event
            .prev_kv()
            .map(|prev| self.codec.key_value(prev))
            .transpose()?;
        let kind = match event.event_type() {
            EventType::Put => EventKind::Put,
            EventType::Delete => EventKind::Delete,
        };
        // etcd drops the previous value when it was compacted away before the event was sent;
        // an event that should carry one and does not cannot be trusted to be complete.
        let expects_prev = kind == EventKind::Delete || raw.create_revision() != raw.mod_revision();
        if expects_prev && prev.is_none() {
            return Err(unexpected(&format!(
                "watch event for {} at revision {} lacks its previous value",
                kv.key, kv.mod_revision
            )));
        }
        Ok(WatchEvent { kind, kv, prev })
    }
}

/// What etcd refused a request for, where its answer says so only in words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    Compacted,
    Future,
    /// Over `--max-txn-ops` or `--max-request-bytes`; none of the request applied.
    TooBig,
}

/// The compares that hold only if `key` was last written at `revision`: its etcd revision, and
/// the slot stored with its value. A key is written at most once per etcd revision, so a slot
/// that does not match means the key never had `revision`. The slot is checked by comparing
/// bytes: a value written with slot `s` sorts strictly between `SLOT_MARK ‖ s` and
/// `SLOT_MARK ‖ s+1`, and a value without a mark (slot 0) sorts below every marked one.
fn last_written_at(full_key: &[u8], revision: Revision) -> Vec<Compare> {
    let (etcd, slot) = etcd_revision(revision);
    let bound = |slot: i64| {
        let mut bound = SLOT_MARK.to_vec();
        bound.extend_from_slice(&u16::try_from(slot).unwrap_or(u16::MAX).to_be_bytes());
        bound
    };
    let mut compares = vec![
        Compare::mod_revision(full_key.to_vec(), CompareOp::Equal, etcd),
        Compare::value(full_key.to_vec(), CompareOp::Less, bound(slot + 1)),
    ];
    if slot > 0 {
        compares.push(Compare::value(
            full_key.to_vec(),
            CompareOp::Greater,
            bound(slot),
        ));
    }
    compares
}

/// etcd reports these as gRPC `OutOfRange` or `InvalidArgument` and tells them apart only by
/// message.
fn refusal(error: &etcd_client::Error) -> Option<Refusal> {
    let etcd_client::Error::GRpcStatus(status) = error else {
        return None;
    };
    let message = status.message();
    if message.contains("required revision has been compacted") {
        Some(Refusal::Compacted)
    } else if message.contains("required revision is a future revision") {
        Some(Refusal::Future)
    } else if message.contains("too many operations in txn request")
        || message.contains("request is too large")
    {
        Some(Refusal::TooBig)
    } else {
        None
    }
}

/// The end of the key range holding exactly the keys that start with `prefix`: the prefix without
/// its trailing 0xff bytes, last byte incremented. An empty or all-0xff prefix has no such end and
/// gets `"\0"`, which etcd reads as "to the end of the key space".
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn user_key(namespace: &str, raw: &[u8]) -> Result<String, StorageError> {
    let lossy = || String::from_utf8_lossy(raw).into_owned();
    let Some(key) = raw.strip_prefix(namespace.as_bytes()) else {
        return Err(StorageError::Corrupt {
            key: lossy(),
            message: format!("key outside the store's prefix {namespace:?}"),
        });
    };
    String::from_utf8(key.to_vec()).map_err(|error| StorageError::Corrupt {
        key: lossy(),
        message: format!("key is not UTF-8: {error}"),
    })
}

fn header_revision(header: Option<&etcd_client::ResponseHeader>) -> Result<Revision, StorageError> {
    header
        .map(etcd_client::ResponseHeader::revision)
        .ok_or_else(|| unexpected("etcd response without a header"))
}

/// Sends `call` again, up to [`UNSENT_RETRIES`] times, while it fails before reaching etcd
/// (a member's endpoint refusing the connection: the member is down). The balanced channel
/// keeps a dead member's endpoint and may pick it for any request; a request that was never
/// sent is safe to send again, whatever it does, and the next pick is likely a live member.
/// (etcd's Go client retries the same way.) A request that was sent is never repeated here.
pub(crate) async fn unsent_retried<T, F, Fut>(mut call: F) -> Result<T, etcd_client::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let mut retries = 0;
    loop {
        match call().await {
            Err(error) if retries < UNSENT_RETRIES && never_sent(&error) => retries += 1,
            answer => return answer,
        }
    }
}

/// How often a request refused at connection is sent again ([`unsent_retried`]): with one
/// member of three down, six more random picks all landing on it is under 1 in 700.
const UNSENT_RETRIES: usize = 6;

/// Whether `error` says the request never left this process: the connection to the chosen
/// member could not be made.
fn never_sent(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::GRpcStatus(status) => {
            // tonic's Code::Unavailable (14), named by its number: tonic is etcd-client's.
            i32::from(status.code()) == 14 && status.message().contains("tcp connect error")
        }
        _ => false,
    }
}

fn etcd_error(context: impl std::fmt::Display) -> impl FnOnce(etcd_client::Error) -> StorageError {
    move |source| StorageError::Unavailable {
        message: format!("etcd {context}: {source}"),
        source: Some(Box::new(source)),
    }
}

fn unexpected(message: &str) -> StorageError {
    StorageError::Unavailable {
        message: format!("unexpected answer from etcd: {message}"),
        source: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_is_trusted_from_the_releases_that_fixed_its_order() {
        for old in [
            "3.4.23", "3.4.30", "3.5.0", "3.5.12", "3.3.27", "v3.5.9", "garbage", "3.5",
        ] {
            assert!(!progress_follows_events(old), "{old}");
        }
        for fixed in [
            "3.4.31",
            "3.4.34",
            "3.5.13",
            "3.5.17",
            "v3.5.21",
            "3.6.0",
            "3.6.0-rc.1",
        ] {
            assert!(progress_follows_events(fixed), "{fixed}");
        }
    }

    #[test]
    fn prefix_end_bounds_exactly_the_prefix() {
        let cases: &[(&[u8], &[u8])] = &[
            (b"/a/", b"/a0"),
            (b"/registry/pods/", b"/registry/pods0"),
            (b"a", b"b"),
            (b"a\xff", b"b"),
            (b"a\xff\xff", b"b"),
            (b"\xff\xff", b"\0"),
            (b"", b"\0"),
        ];
        for (prefix, end) in cases {
            assert_eq!(prefix_end(prefix), *end, "prefix {prefix:?}");
        }
    }

    #[test]
    fn slots_are_framed_unambiguously_and_sort_between_their_bounds() {
        let values: [&[u8]; 5] = [b"", b"{}", b"\xff", b"\xffslot", b"\xffslot\x00\x01\x00x"];
        for value in values {
            for slot in [0, 1, 7, 999] {
                let stored = slotted_value(slot, value);
                assert_eq!(split_slot(&stored), (i64::from(slot), value), "{value:?}");
                // What `last_written_at` compares: strictly between slot and slot + 1, and
                // unmarked values below every marked one.
                let bound = |slot: u16| [SLOT_MARK, &slot.to_be_bytes()].concat();
                assert!(stored.as_slice() < bound(slot + 1).as_slice());
                if stored.starts_with(SLOT_MARK) {
                    assert!(stored.as_slice() > bound(slot).as_slice());
                } else {
                    assert_eq!(slot, 0);
                    assert!(stored.as_slice() < bound(0).as_slice());
                }
            }
        }
    }

    #[test]
    fn revisions_map_to_etcd_revisions_and_slots() {
        assert_eq!(revision_of(4711, 3), 4_711_003);
        assert_eq!(etcd_revision(4_711_003), (4711, 3));
        assert_eq!(etcd_revision(revision_through(4711)), (4711, SLOTS - 1));
        assert!(revision_through(4711) < revision_of(4712, 0));
        // Before etcd's first revision: its empty first revision, never 0 ("latest" to etcd).
        assert_eq!(etcd_revision(5), (1, 5));
        assert_eq!(etcd_revision(-1), (1, 0));
    }

    #[test]
    fn user_key_strips_the_namespace() -> Result<(), StorageError> {
        assert_eq!(user_key("/ns", b"/ns/a/b")?, "/a/b");
        assert_eq!(user_key("", b"/a")?, "/a");
        assert!(matches!(
            user_key("/ns", b"/other/a"),
            Err(StorageError::Corrupt { .. })
        ));
        assert!(matches!(
            user_key("", b"/\xff"),
            Err(StorageError::Corrupt { .. })
        ));
        Ok(())
    }
}
