//! The embedded store's redb `Database`, swappable so that the store heals from I/O errors.
//!
//! Once an I/O error (a full disk, say) has failed one of its writes, a redb `Database` refuses
//! every later operation that needs the file ([`redb::StorageError::PreviousIo`]) until it is
//! closed and the file opened again, which runs redb's repair. redb refuses to open a file this
//! process still has open, so every holder of the old `Database` must let go first.
//!
//! Readers therefore never keep the `Database`: each read leases the current one
//! ([`DatabaseHandle::lease`]) for its one read transaction. The writer thread, the only caller
//! of [`DatabaseHandle::reopen`], takes the old one out (new leases fail fast meanwhile), waits a
//! bounded time for the leases still out to end, closes it, and installs a freshly opened one.
//! Each installed `Database` has a generation, so that a reader's report that the `Database` it
//! leased was poisoned cannot mark the one that replaced it.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockWriteGuard};
use std::time::{Duration, Instant};

use redb::Database;

use crate::types::StorageError;

/// Opens the store's file again after a failure.
pub(super) type Reopen = Box<dyn Fn() -> Result<Database, StorageError> + Send + Sync>;
/// Asks the writer thread to look at the handle; `false` when the request could not be sent.
pub(super) type Wake = Box<dyn Fn() -> bool + Send + Sync>;

/// The store's current `Database`, shared by the readers, the watches and the writer thread.
pub(super) struct DatabaseHandle {
    slot: RwLock<Slot>,
    reopen: Reopen,
    wake: Wake,
    /// Set while a wake-up is on its way to the writer: failing reads send one, not one each.
    wake_pending: AtomicBool,
}

struct Slot {
    /// `None` while a reopen is under way, and after one failed until the next succeeds.
    db: Option<Arc<Database>>,
    /// Changes each time the `Database` is taken out, so reports about an old one are ignored.
    generation: u64,
    /// A reader found this generation's `Database` poisoned.
    poisoned: bool,
}

/// One reader's hold on the current `Database`. Keep it for one transaction only: a reopen
/// waits for every lease on the old `Database` to be dropped.
pub(super) struct Lease {
    pub(super) db: Arc<Database>,
    pub(super) generation: u64,
}

impl fmt::Debug for DatabaseHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let slot = self.slot.read().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("DatabaseHandle")
            .field("open", &slot.db.is_some())
            .field("generation", &slot.generation)
            .field("poisoned", &slot.poisoned)
            .finish_non_exhaustive()
    }
}

impl DatabaseHandle {
    /// A handle on `db`; `reopen` opens the same file again, `wake` nudges the writer thread.
    pub(super) fn new(db: Database, reopen: Reopen, wake: Wake) -> Self {
        Self {
            slot: RwLock::new(Slot {
                db: Some(Arc::new(db)),
                generation: 0,
                poisoned: false,
            }),
            reopen,
            wake,
            wake_pending: AtomicBool::new(false),
        }
    }

    /// The current `Database`, or an error while there is none (the writer is reopening the
    /// file, or could not): reads fail fast rather than queue behind a reopen that may take long.
    pub(super) fn lease(&self) -> Result<Lease, StorageError> {
        let slot = self.slot.read().unwrap_or_else(PoisonError::into_inner);
        match &slot.db {
            Some(db) => Ok(Lease {
                db: Arc::clone(db),
                generation: slot.generation,
            }),
            None => {
                drop(slot);
                // A reopen that failed is tried again when asked (after a pause): reads alone
                // must be able to bring the store back.
                self.wake();
                Err(StorageError::Unavailable {
                    message: "the embedded store's file awaits reopening after an I/O error"
                        .to_owned(),
                    source: None,
                })
            }
        }
    }

    /// Records that the `Database` of `generation` reported a previous I/O error, and wakes the
    /// writer to reopen it.
    pub(super) fn report_poisoned(&self, generation: u64) {
        if self.mark_poisoned(generation) {
            self.wake();
        }
    }

    /// [`Self::report_poisoned`] without the wake-up, for the writer itself. `true` if the
    /// report concerns the current `Database`.
    pub(super) fn mark_poisoned(&self, generation: u64) -> bool {
        let mut slot = self.slot_mut();
        let current = slot.generation == generation && slot.db.is_some();
        if current {
            slot.poisoned = true;
        }
        current
    }

    /// Whether the file has to be opened again before the next transaction.
    pub(super) fn needs_reopen(&self) -> bool {
        let slot = self.slot.read().unwrap_or_else(PoisonError::into_inner);
        slot.db.is_none() || slot.poisoned
    }

    /// Called by the writer each time it takes work from its queue, wake-ups included.
    pub(super) fn woken(&self) {
        self.wake_pending.store(false, Ordering::Release);
    }

    fn wake(&self) {
        if !self.wake_pending.swap(true, Ordering::AcqRel) && !(self.wake)() {
            self.wake_pending.store(false, Ordering::Release);
        }
    }

    /// Closes the current `Database` and opens the file again (writer thread only). Leases still
    /// out on the old `Database` get up to `drain` to end; if one outlasts it, the open most
    /// likely fails with redb's "database already open" and the next attempt tries again. On
    /// failure the handle stays without a `Database` until an attempt succeeds.
    pub(super) fn reopen(&self, drain: Duration) -> Result<(), StorageError> {
        let old = {
            let mut slot = self.slot_mut();
            slot.generation += 1;
            slot.poisoned = false;
            slot.db.take()
        };
        if let Some(old) = old {
            close_when_released(old, drain);
        }
        let db = (self.reopen)()?;
        self.slot_mut().db = Some(Arc::new(db));
        Ok(())
    }

    fn slot_mut(&self) -> RwLockWriteGuard<'_, Slot> {
        // Every write leaves the slot consistent, so a panic elsewhere does not spoil it.
        self.slot.write().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Waits up to `drain` for `db`'s other holders (reads in flight) to drop it, then closes it.
/// Past the deadline it lets go of its own reference: the last reader then closes it.
fn close_when_released(mut db: Arc<Database>, drain: Duration) -> bool {
    let deadline = Instant::now() + drain;
    let mut pause = Duration::from_micros(100);
    loop {
        match Arc::try_unwrap(db) {
            Ok(db) => {
                // A poisoned Database reports the I/O error again as it closes; that is expected.
                if let Err(error) = db.close() {
                    tracing::debug!(%error, "closed the failed embedded store file");
                }
                return true;
            }
            Err(shared) if Instant::now() >= deadline => {
                tracing::warn!(
                    holders = Arc::strong_count(&shared) - 1,
                    ?drain,
                    "reads still hold the failed embedded store file; reopening anyway"
                );
                return false;
            }
            Err(shared) => {
                db = shared;
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(10));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::AtomicUsize;

    use redb::{ReadableDatabase, TableDefinition};

    use super::*;

    const T: TableDefinition<u64, u64> = TableDefinition::new("t");

    fn reopener(path: &Path) -> Reopen {
        let path = path.to_path_buf();
        Box::new(move || {
            Database::open(&path).map_err(|error| StorageError::Unavailable {
                message: format!("reopen: {error}"),
                source: Some(Box::new(error)),
            })
        })
    }

    fn handle(dir: &tempfile::TempDir) -> (DatabaseHandle, PathBuf, Arc<AtomicUsize>) {
        let path = dir.path().join("t.redb");
        let db = Database::create(&path).expect("create");
        let txn = db.begin_write().expect("write");
        txn.open_table(T)
            .expect("table")
            .insert(1, 10)
            .expect("insert");
        txn.commit().expect("commit");
        let wakes = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&wakes);
        let wake: Wake = Box::new(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            true
        });
        (DatabaseHandle::new(db, reopener(&path), wake), path, wakes)
    }

    fn value(lease: &Lease) -> u64 {
        let txn = lease.db.begin_read().expect("read");
        let table = txn.open_table(T).expect("table");
        table.get(1).expect("get").expect("present").value()
    }

    #[test]
    fn reopen_waits_for_the_reads_in_flight_then_installs_a_new_database() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (handle, _, _) = handle(&dir);
        let handle = Arc::new(handle);
        let before = handle.lease().expect("lease");
        assert_eq!(value(&before), 10);
        let reader = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            // Still readable: the reopen has not closed it under this read.
            let read = value(&before);
            (read, before.generation)
        });
        handle.reopen(Duration::from_secs(10)).expect("reopen");
        let (read, old_generation) = reader.join().expect("reader");
        assert_eq!(read, 10);
        let after = handle.lease().expect("lease");
        assert_ne!(after.generation, old_generation);
        assert_eq!(value(&after), 10);
    }

    #[test]
    fn a_report_about_a_replaced_database_is_ignored() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (handle, _, wakes) = handle(&dir);
        let old = handle.lease().expect("lease").generation;
        handle.reopen(Duration::from_secs(1)).expect("reopen");
        handle.report_poisoned(old);
        assert!(!handle.needs_reopen());
        assert_eq!(wakes.load(Ordering::SeqCst), 0);

        let current = handle.lease().expect("lease").generation;
        handle.report_poisoned(current);
        handle.report_poisoned(current);
        assert!(handle.needs_reopen());
        // One wake-up until the writer has taken it.
        assert_eq!(wakes.load(Ordering::SeqCst), 1);
        handle.woken();
        handle.report_poisoned(current);
        assert_eq!(wakes.load(Ordering::SeqCst), 2);
        handle.reopen(Duration::from_secs(1)).expect("reopen");
        assert!(!handle.needs_reopen());
    }

    #[test]
    fn a_read_outlasting_the_drain_fails_that_reopen_and_the_next_one_succeeds() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (handle, _, wakes) = handle(&dir);
        let straggler = handle.lease().expect("lease");
        let error = handle
            .reopen(Duration::from_millis(20))
            .expect_err("the file is still open");
        assert!(error.to_string().contains("reopen"), "{error}");
        assert!(handle.needs_reopen());
        // Reads fail fast while there is no Database, and ask the writer to try again.
        assert!(handle.lease().is_err());
        assert_eq!(wakes.load(Ordering::SeqCst), 1);
        assert_eq!(value(&straggler), 10);
        drop(straggler);
        handle.reopen(Duration::from_millis(20)).expect("reopen");
        assert_eq!(value(&handle.lease().expect("lease")), 10);
    }
}
