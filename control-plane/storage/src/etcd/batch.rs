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
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use etcd_client::{Compare, CompareOp, KvClient, Txn, TxnOp, TxnOpResponse, TxnResponse};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use super::{
    Codec, Refusal, etcd_error, header_revision, refusal, slotted_value, unexpected, unsent_retried,
};
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
    /// The key as etcd stores it (with the store's prefix).
    full_key: Vec<u8>,
    /// The key as the caller named it.
    key: String,
    value: Bytes,
    reply: Reply,
}

/// Where creates queue to share a transaction.
///
/// There is no batching task. A create that finds the queue empty and a send slot free sends
/// itself, as one plain transaction, so a create that waits alone pays no hand-off. Otherwise
/// it queues; if it then gets a slot, a task of their own sends the queue's oldest creates, so
/// no caller's disconnect can drop other callers' creates. A slot given back with creates
/// queued starts the next batch ([`SendSlot`]).
pub(super) struct CreateBatcher {
    shared: Arc<Shared>,
}

struct Shared {
    kv: KvClient,
    codec: Arc<Codec>,
    queue: Mutex<VecDeque<Pending>>,
    in_flight: Arc<Semaphore>,
}

impl CreateBatcher {
    pub(super) fn new(kv: KvClient, codec: Arc<Codec>) -> Self {
        Self {
            shared: Arc::new(Shared {
                kv,
                codec,
                queue: Mutex::new(VecDeque::new()),
                in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
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
        let alone = {
            let queue = self.shared.lock_queue();
            if queue.is_empty() {
                SendSlot::try_take(&self.shared, 0)
            } else {
                None
            }
        };
        if let Some(slot) = alone {
            let answer = create_one(
                self.shared.kv.clone(),
                &self.shared.codec,
                &full_key,
                key,
                value,
            )
            .await;
            drop(slot);
            return answer;
        }
        let (reply, answer) = oneshot::channel();
        let queued = {
            let mut queue = self.shared.lock_queue();
            queue.push_back(Pending {
                full_key,
                key: key.to_owned(),
                value,
                reply,
            });
            queue.len()
        };
        if let Some(slot) = SendSlot::try_take(&self.shared, queued) {
            slot.send_next_batch();
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
    /// A slot, if one is free and worth taking with `queued` creates waiting.
    fn try_take(shared: &Arc<Shared>, queued: usize) -> Option<Self> {
        if shared.in_flight.available_permits() < MAX_IN_FLIGHT && queued < OVERLAP_MIN {
            return None;
        }
        let permit = shared.in_flight.clone().try_acquire_owned().ok()?;
        Some(Self {
            shared: shared.clone(),
            permit: Some(permit),
        })
    }

    /// Sends the queue's oldest creates in a task of their own, then gives the slot back.
    fn send_next_batch(self) {
        let batch = take_batch(&mut self.shared.lock_queue());
        if batch.is_empty() {
            // Another sender took them first.
            return;
        }
        tokio::spawn(async move {
            commit(self.shared.kv.clone(), &self.shared.codec, batch).await;
            drop(self);
        });
    }
}

impl Drop for SendSlot {
    fn drop(&mut self) {
        drop(self.permit.take());
        // Checked after the release: a create queued before it is seen here, one queued after
        // it finds the slot free (or another holder, which will look here when it is done).
        let queued = self.shared.lock_queue().len();
        if queued == 0 || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        if let Some(slot) = Self::try_take(&self.shared, queued) {
            slot.send_next_batch();
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
async fn commit(kv: KvClient, codec: &Codec, mut batch: Vec<Pending>) {
    if batch.len() <= 1 {
        if let Some(pending) = batch.pop() {
            let answer =
                create_one(kv, codec, &pending.full_key, &pending.key, pending.value).await;
            let _ = pending.reply.send(answer);
        }
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
    let batch_txn = Txn::new().and_then(creates);
    let sent = unsent_retried(|| {
        let (mut kv, txn) = (kv.clone(), batch_txn.clone());
        async move { kv.txn(txn).await }
    })
    .await;
    let answers = match sent {
        Ok(response) => nested_responses(&response, batch.len()),
        Err(error) if refusal(&error) == Some(Refusal::TooBig) => {
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

/// One create as its own plain transaction (slot 0).
async fn create_one(
    kv: KvClient,
    codec: &Codec,
    full_key: &[u8],
    key: &str,
    value: Bytes,
) -> Result<Outcome<KeyValue>, StorageError> {
    let txn = create_txn(full_key, slotted_value(0, &value));
    let response = unsent_retried(|| {
        let (mut kv, txn) = (kv.clone(), txn.clone());
        async move { kv.txn(txn).await }
    })
    .await
    .map_err(etcd_error("create"))?;
    let revision = header_revision(response.header())?;
    codec.create_outcome(&response, revision, key, value, 0)
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
