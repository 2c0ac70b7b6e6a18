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
//!
//! Progress: asked through its [`ProgressRequester`], a watch takes every batch already in its
//! channel and answers with the revision it has accounted for. The writer broadcasts a batch
//! before it acknowledges the batch's writes, so that revision covers every acknowledged write.

use std::sync::Arc;

use futures::StreamExt;
use redb::ReadTransaction;
use tokio::sync::broadcast;

use super::handle::DatabaseHandle;
use super::{
    CHANGES, Committed, change_event, change_name, codec, read_blocking, read_heads, read_table,
    unavailable,
};
use crate::types::{
    ProgressRequester, Revision, StorageError, WatchEvent, WatchResponse, WatchStream,
};

/// Events per replayed response: bounds the memory one response takes.
const REPLAY_MAX_EVENTS: usize = 512;
/// Log entries scanned per replay step: bounds how long one blocking read runs when the prefix
/// matches few of the changes.
const REPLAY_MAX_SCAN: usize = 16_384;

pub(super) struct Watch {
    /// Each read leases the store's current `Database`, so a watch outlives a reopen of the
    /// file: reads that fail while it is reopened end the watch like any other read failure.
    db: Arc<DatabaseHandle>,
    prefix: String,
    live: broadcast::Receiver<Arc<Committed>>,
    /// Every revision below this one has been delivered or did not match the prefix.
    next: Revision,
    /// Replay the changes up to and including this revision before following live batches.
    replay_through: Revision,
    /// Set for a watch that reports progress when asked.
    progress: Option<ProgressRequester>,
    finished: bool,
}

impl Watch {
    pub(super) fn new(
        db: Arc<DatabaseHandle>,
        prefix: String,
        live: broadcast::Receiver<Arc<Committed>>,
        next: Revision,
        replay_through: Revision,
        progress: Option<ProgressRequester>,
    ) -> Self {
        Self {
            db,
            prefix,
            live,
            next,
            replay_through,
            progress,
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
            let received = match &self.progress {
                Some(progress) => tokio::select! {
                    received = self.live.recv() => received,
                    () = progress.requested() => match self.progress_report().await? {
                        Some(report) => return Ok(Some(report)),
                        None => continue,
                    },
                },
                None => self.live.recv().await,
            };
            match received {
                Ok(batch) => {
                    if let Some(response) = self.take(&batch) {
                        return Ok(Some(response));
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

    /// This watch's part of a live batch, and its place moved past the batch.
    fn take(&mut self, batch: &Committed) -> Option<WatchResponse> {
        if batch.last_revision < self.next {
            return None;
        }
        let events: Vec<WatchEvent> = batch
            .events
            .iter()
            .filter(|e| e.kv.mod_revision >= self.next && e.kv.key.starts_with(&self.prefix))
            .cloned()
            .collect();
        self.next = batch.last_revision + 1;
        (!events.is_empty()).then_some(WatchResponse {
            events,
            revision: batch.last_revision,
        })
    }

    /// Answers a progress request: the batches already broadcast, taken now, and the revision
    /// they bring the watch to. `None` when the channel lagged: the changes are replayed first,
    /// and the request is kept to be answered after them.
    async fn progress_report(&mut self) -> Result<Option<WatchResponse>, StorageError> {
        let mut events = Vec::new();
        loop {
            match self.live.try_recv() {
                Ok(batch) => {
                    if let Some(response) = self.take(&batch) {
                        events.extend(response.events);
                    }
                }
                // A closed channel ends the watch at its next receive.
                Err(
                    broadcast::error::TryRecvError::Empty | broadcast::error::TryRecvError::Closed,
                ) => break,
                Err(broadcast::error::TryRecvError::Lagged(_)) => {
                    let heads = read_blocking(Arc::clone(&self.db), read_heads).await?;
                    self.replay_through = heads.current;
                    if let Some(progress) = &self.progress {
                        progress.request();
                    }
                    if events.is_empty() {
                        return Ok(None);
                    }
                    // What was taken is delivered now; its revision is a true report too.
                    break;
                }
            }
        }
        Ok(Some(WatchResponse {
            events,
            revision: self.next - 1,
        }))
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
