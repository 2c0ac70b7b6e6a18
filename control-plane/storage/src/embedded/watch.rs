//! Watches on the embedded store: replay from the `changes` table, then follow live commits,
//! never a gap.
//!
//! A watch tracks `next`, the first revision it has not yet accounted for. It replays the changes
//! up to a target revision, then takes batches from the broadcast channel, dropping whatever it
//! has already replayed (the subscription was taken before the target was read, so the two
//! overlap rather than leave a hole). When the channel reports that this watch lagged and batches
//! were dropped, it reads the head revision again and replays the changes up to it: a slow
//! consumer costs re-reads, never lost events. If compaction overtakes a replay, the watch ends with
//! [`StorageError::Compacted`] and the caller relists, as it would with etcd.

use std::sync::Arc;

use futures::StreamExt;
use redb::{Database, ReadTransaction};
use tokio::sync::broadcast;

use super::{
    CHANGES, Committed, change_event, change_name, codec, read_blocking, read_heads, read_table,
    unavailable,
};
use crate::types::{Revision, StorageError, WatchEvent, WatchResponse, WatchStream};

/// Events per replayed response: bounds the memory one response takes.
const REPLAY_MAX_EVENTS: usize = 512;
/// Log entries scanned per replay step: bounds how long one blocking read runs when the prefix
/// matches few of the changes.
const REPLAY_MAX_SCAN: usize = 16_384;

pub(super) struct Watch {
    db: Arc<Database>,
    prefix: String,
    live: broadcast::Receiver<Arc<Committed>>,
    /// Every revision below this one has been delivered or did not match the prefix.
    next: Revision,
    /// Replay the changes up to and including this revision before following live batches.
    replay_through: Revision,
    finished: bool,
}

impl Watch {
    pub(super) fn new(
        db: Arc<Database>,
        prefix: String,
        live: broadcast::Receiver<Arc<Committed>>,
        next: Revision,
        replay_through: Revision,
    ) -> Self {
        Self {
            db,
            prefix,
            live,
            next,
            replay_through,
            finished: false,
        }
    }

    pub(super) fn into_stream(self) -> WatchStream {
        futures::stream::unfold(self, |mut watch| async move {
            let item = watch.next_response().await?;
            Some((item, watch))
        })
        .boxed()
    }

    async fn next_response(&mut self) -> Option<Result<WatchResponse, StorageError>> {
        if self.finished {
            return None;
        }
        let item = self.step().await.transpose();
        // Once the stream has failed (or the store shut down), it stays ended.
        if !matches!(item, Some(Ok(_))) {
            self.finished = true;
        }
        item
    }

    async fn step(&mut self) -> Result<Option<WatchResponse>, StorageError> {
        loop {
            if self.next <= self.replay_through {
                let (db, prefix, from, through) = (
                    Arc::clone(&self.db),
                    self.prefix.clone(),
                    self.next,
                    self.replay_through,
                );
                let (events, scanned_through) =
                    read_blocking(db, move |txn| replay(txn, &prefix, from, through)).await?;
                self.next = scanned_through + 1;
                if !events.is_empty() {
                    return Ok(Some(WatchResponse {
                        events,
                        revision: scanned_through,
                    }));
                }
                continue;
            }
            match self.live.recv().await {
                Ok(batch) => {
                    if batch.last_revision < self.next {
                        continue;
                    }
                    let events: Vec<WatchEvent> = batch
                        .events
                        .iter()
                        .filter(|e| {
                            e.kv.mod_revision >= self.next && e.kv.key.starts_with(&self.prefix)
                        })
                        .cloned()
                        .collect();
                    self.next = batch.last_revision + 1;
                    if !events.is_empty() {
                        return Ok(Some(WatchResponse {
                            events,
                            revision: batch.last_revision,
                        }));
                    }
                }
                Err(broadcast::error::RecvError::Lagged(skipped)) => {
                    tracing::debug!(
                        skipped,
                        next = self.next,
                        "watch lagged, replaying from the changes table"
                    );
                    let heads = read_blocking(Arc::clone(&self.db), read_heads).await?;
                    self.replay_through = heads.current;
                }
                // The store was dropped: no more commits will come.
                Err(broadcast::error::RecvError::Closed) => return Ok(None),
            }
        }
    }
}

/// Reads a bounded chunk of the changes from `from` through `through`: the matching events and the
/// last revision the chunk accounts for.
fn replay(
    txn: &ReadTransaction,
    prefix: &str,
    from: Revision,
    through: Revision,
) -> Result<(Vec<WatchEvent>, Revision), StorageError> {
    let heads = read_heads(txn)?;
    if from < heads.compacted {
        return Err(StorageError::Compacted {
            requested: from,
            compacted: heads.compacted,
        });
    }
    let changes = read_table(txn, CHANGES)?;
    let mut events = Vec::new();
    let mut scanned = 0;
    for entry in changes
        .range(from..=through)
        .map_err(unavailable("read changes table"))?
    {
        let (revision, record) = entry.map_err(unavailable("read changes table"))?;
        let revision = revision.value();
        let what = change_name(revision);
        if codec::decode_change_key(&what, record.value())?.starts_with(prefix) {
            let change = codec::decode_change(&what, record.value())?;
            events.push(change_event(&changes, revision, change)?);
        }
        scanned += 1;
        if events.len() >= REPLAY_MAX_EVENTS || scanned >= REPLAY_MAX_SCAN {
            return Ok((events, revision));
        }
    }
    // Revisions without a change (the initial revision) account for nothing.
    Ok((events, through))
}
