//! Group commit of creates on etcd: creates that wait at the same time go to etcd as one
//! transaction of nested create-if-absent transactions, each succeeding or failing on its own.
//!
//! Why: an etcd transaction costs etcd the same consensus round, WAL entry and apply whether it
//! carries one create or fifty, and a conditional create alone costs etcd two to five times a
//! plain put. Batched, a create costs etcd less than a plain put (see the API benchmark).
//!
//! Every create in a batch commits at the same etcd revision, so each gets a slot within it,
//! stored with its value, and the store hands out `etcd revision × SLOTS + slot` (see
//! `etcd.rs`). A create that waits alone goes out as the same single transaction as before.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use etcd_client::{Compare, CompareOp, KvClient, Txn, TxnOp, TxnOpResponse, TxnResponse};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use super::{Codec, etcd_error, header_revision, slotted_value, unexpected};
use crate::types::{KeyValue, Outcome, StorageError};

/// At most this many creates share one transaction, inside etcd's default `--max-txn-ops` (128,
/// which nested transactions count against). An etcd configured lower refuses the batch, which
/// is then sent in halves ([`commit`]).
pub(super) const MAX_BATCH: usize = 120;
/// A batch stops growing past this many value bytes, well inside etcd's default 1.5 MiB
/// `--max-request-bytes`; a larger value goes alone, and etcd judges it as before.
const MAX_BATCH_BYTES: usize = 512 * 1024;
/// Batches in flight at once. The second goes out only when at least [`OVERLAP_MIN`] creates
/// wait; fewer wait for the first to finish and join the next batch. Measured at 100 writers
/// (API benchmark): one batch in flight leaves a fifth of the cores idle while etcd syncs, two
/// unconditionally make batches so small that etcd's CPU per create goes up by a fifth; this
/// rule gets most of both.
const MAX_IN_FLIGHT: usize = 2;
const OVERLAP_MIN: usize = 24;

/// What a create waits for.
type Reply = oneshot::Sender<Result<Outcome<KeyValue>, StorageError>>;

/// One create waiting for its batch.
struct Pending {
    /// Tells a create's own entry from the others in a batch.
    ticket: u64,
    /// The key as etcd stores it (with the store's prefix).
    full_key: Vec<u8>,
    /// The key as the caller named it.
    key: String,
    value: Bytes,
    reply: Reply,
}

/// Where creates queue to share a transaction.
///
/// There is no batching task. A create that finds a send slot free takes the queue's oldest
/// creates; when that is only itself it sends its transaction in its own task, so a create that
/// waits alone pays no hand-off, and otherwise a task of their own sends the batch, so no
/// caller's disconnect can drop other callers' creates. While every slot is taken creates
/// queue, and a slot given back with creates queued starts the next batch ([`SendSlot`]).
pub(super) struct CreateBatcher {
    shared: Arc<Shared>,
}

struct Shared {
    kv: KvClient,
    codec: Arc<Codec>,
    queue: Mutex<VecDeque<Pending>>,
    in_flight: Arc<Semaphore>,
    tickets: AtomicU64,
}

impl CreateBatcher {
    pub(super) fn new(kv: KvClient, codec: Arc<Codec>) -> Self {
        Self {
            shared: Arc::new(Shared {
                kv,
                codec,
                queue: Mutex::new(VecDeque::new()),
                in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
                tickets: AtomicU64::new(0),
            }),
        }
    }

    /// Creates `key` in the next batch that has room for it.
    pub(super) async fn create(
        &self,
        full_key: Vec<u8>,
        key: &str,
        value: Bytes,
    ) -> Result<Outcome<KeyValue>, StorageError> {
        let ticket = self.shared.tickets.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        self.shared.lock_queue().push_back(Pending {
            ticket,
            full_key,
            key: key.to_owned(),
            value,
            reply,
        });
        if let Some(slot) = SendSlot::try_take(&self.shared) {
            let batch = take_batch(&mut self.shared.lock_queue());
            match batch.as_slice() {
                [only] if only.ticket == ticket => slot.send(batch).await,
                _ => {
                    tokio::spawn(slot.send(batch));
                }
            }
        }
        answer
            .await
            .map_err(|_| unexpected("a create's batch ended without answering it"))?
    }
}

impl Shared {
    fn lock_queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Pending>> {
        // The queue is consistent after any panic (push and pop only), so poison is ignored.
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The right to have one batch in flight. Giving it back (also by being dropped mid-send, when
/// a caller goes away) starts the next batch if creates are queued: a create that queued while
/// every slot was taken found none free and relies on this.
struct SendSlot {
    shared: Arc<Shared>,
    permit: Option<OwnedSemaphorePermit>,
}

impl SendSlot {
    fn try_take(shared: &Arc<Shared>) -> Option<Self> {
        if shared.in_flight.available_permits() < MAX_IN_FLIGHT
            && shared.lock_queue().len() < OVERLAP_MIN
        {
            return None;
        }
        let permit = shared.in_flight.clone().try_acquire_owned().ok()?;
        Some(Self {
            shared: shared.clone(),
            permit: Some(permit),
        })
    }

    /// Sends `batch`, then gives the slot back.
    async fn send(self, batch: Vec<Pending>) {
        commit(self.shared.kv.clone(), &self.shared.codec, batch).await;
    }
}

impl Drop for SendSlot {
    fn drop(&mut self) {
        drop(self.permit.take());
        // Checked after the release: a create queued before it is seen here, one queued after
        // it finds the slot free (or another holder, which will look here when it is done).
        if self.shared.lock_queue().is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if let Some(slot) = Self::try_take(&self.shared) {
            let batch = take_batch(&mut self.shared.lock_queue());
            runtime.spawn(slot.send(batch));
        }
    }
}

/// The oldest queued creates that fit one batch. A key already in the batch waits for the next
/// one (etcd refuses a transaction that writes a key twice), keeping its place in the queue.
fn take_batch(queued: &mut VecDeque<Pending>) -> Vec<Pending> {
    let mut batch = Vec::new();
    let mut keys = HashSet::new();
    let mut bytes = 0;
    let mut deferred = VecDeque::new();
    while let Some(pending) = queued.pop_front() {
        let full = batch.len() == MAX_BATCH
            || (!batch.is_empty() && bytes + pending.value.len() > MAX_BATCH_BYTES);
        if full {
            queued.push_front(pending);
            break;
        }
        if keys.contains(&pending.full_key) {
            deferred.push_back(pending);
            continue;
        }
        keys.insert(pending.full_key.clone());
        bytes += pending.value.len();
        batch.push(pending);
    }
    while let Some(pending) = deferred.pop_back() {
        queued.push_front(pending);
    }
    batch
}

/// Sends one batch and answers each of its creates.
async fn commit(mut kv: KvClient, codec: &Codec, mut batch: Vec<Pending>) {
    if batch.is_empty() {
        // Another sender took the queue first.
        return;
    }
    if batch.len() == 1 {
        let Some(pending) = batch.pop() else {
            return;
        };
        let txn = create_txn(&pending.full_key, slotted_value(0, &pending.value));
        let answer = match kv.txn(txn).await {
            Ok(response) => header_revision(response.header()).and_then(|revision| {
                codec.create_outcome(&response, revision, &pending.key, pending.value, 0)
            }),
            Err(error) => Err(etcd_error("create")(error)),
        };
        let _ = pending.reply.send(answer);
        return;
    }
    let creates: Vec<TxnOp> = batch
        .iter()
        .zip(0u16..)
        .map(|(pending, slot)| {
            TxnOp::txn(create_txn(
                &pending.full_key,
                slotted_value(slot, &pending.value),
            ))
        })
        .collect();
    let answers = match kv.txn(Txn::new().and_then(creates)).await {
        Ok(response) => nested_responses(&response, batch.len()),
        Err(error) if too_big(&error) => {
            // Refused whole, so nothing of it applied: send it again in halves, in order.
            let second = batch.split_off(batch.len() / 2);
            Box::pin(commit(kv.clone(), codec, batch)).await;
            Box::pin(commit(kv, codec, second)).await;
            return;
        }
        Err(error) => Err(etcd_error("create a batch")(error)),
    };
    match answers {
        Ok((revision, nested)) => {
            for ((pending, nested), slot) in batch.into_iter().zip(nested).zip(0u16..) {
                let answer =
                    codec.create_outcome(&nested, revision, &pending.key, pending.value, slot);
                let _ = pending.reply.send(answer);
            }
        }
        Err(error) => {
            // StorageError is not Clone; every create of the batch gets the same message.
            let message = match error {
                StorageError::Unavailable { message, .. } => message,
                other => other.to_string(),
            };
            for pending in batch {
                let _ = pending.reply.send(Err(StorageError::Unavailable {
                    message: message.clone(),
                    source: None,
                }));
            }
        }
    }
}

/// Whether etcd refused a transaction for its number of operations or its size (its limits
/// `--max-txn-ops` and `--max-request-bytes`); it then applied none of it.
fn too_big(error: &etcd_client::Error) -> bool {
    let etcd_client::Error::GRpcStatus(status) = error else {
        return false;
    };
    let message = status.message();
    message.contains("too many operations in txn request")
        || message.contains("request is too large")
}

/// Put `key` only if it does not exist, else read it: the transaction of one create.
fn create_txn(full_key: &[u8], stored_value: Vec<u8>) -> Txn {
    Txn::new()
        .when([Compare::create_revision(
            full_key.to_vec(),
            CompareOp::Equal,
            0,
        )])
        .and_then([TxnOp::put(full_key.to_vec(), stored_value, None)])
        .or_else([TxnOp::get(full_key.to_vec(), None)])
}

/// The etcd revision a batch committed at, and its nested create transactions' responses in
/// order (they carry no header of their own).
fn nested_responses(
    response: &TxnResponse,
    expected: usize,
) -> Result<(i64, Vec<TxnResponse>), StorageError> {
    let revision = header_revision(response.header())?;
    let nested: Vec<TxnResponse> = response
        .op_responses()
        .into_iter()
        .filter_map(|op| match op {
            TxnOpResponse::Txn(nested) => Some(nested),
            _ => None,
        })
        .collect();
    if nested.len() != expected {
        return Err(unexpected(&format!(
            "a batch of {expected} creates got {} answers at revision {revision}",
            nested.len()
        )));
    }
    Ok((revision, nested))
}
