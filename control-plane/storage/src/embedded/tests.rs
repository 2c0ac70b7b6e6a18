//! The embedded store's unit tests: reads, writes, watches, compaction and recovery from I/O
//! errors, against real redb files in temporary directories.
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

impl EmbeddedStorage {
    /// The current `Database`, for tests that look at or tamper with the file directly.
    fn database(&self) -> Arc<Database> {
        self.db.lease().expect("database").db
    }
}

/// The revisions the `changes` table holds.
fn kept_changes(store: &EmbeddedStorage) -> Vec<Revision> {
    let txn = store.database().begin_read().expect("read transaction");
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
        let txn = store.database().begin_write().expect("write transaction");
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
        let txn = store.database().begin_read().expect("read transaction");
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

/// A file whose writes or syncs fail on demand, as on a disk that filled up.
#[derive(Debug)]
struct FlakyDisk {
    file: redb::backends::FileBackend,
    faults: Arc<Faults>,
}

#[derive(Debug, Default)]
struct Faults {
    /// Writes and growth fail with ENOSPC.
    full: std::sync::atomic::AtomicBool,
    /// Syncs fail with EIO (the data written before them still reaches the file).
    sync_fails: std::sync::atomic::AtomicBool,
}

impl Faults {
    fn set_full(&self, on: bool) {
        self.full.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    fn set_sync_fails(&self, on: bool) {
        self.sync_fails
            .store(on, std::sync::atomic::Ordering::SeqCst);
    }

    fn check(&self, flag: &std::sync::atomic::AtomicBool, errno: i32) -> std::io::Result<()> {
        if flag.load(std::sync::atomic::Ordering::SeqCst) {
            Err(std::io::Error::from_raw_os_error(errno))
        } else {
            Ok(())
        }
    }
}

const ENOSPC: i32 = 28;
const EIO: i32 = 5;

type LockBound = std::ops::Bound<u64>;

impl redb::StorageBackend for FlakyDisk {
    fn len(&self) -> std::io::Result<u64> {
        self.file.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.file.read(offset, out)
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.faults.check(&self.faults.full, ENOSPC)?;
        self.file.set_len(len)
    }

    fn sync_data(&self) -> std::io::Result<()> {
        self.faults.check(&self.faults.sync_fails, EIO)?;
        self.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.faults.check(&self.faults.full, ENOSPC)?;
        self.file.write(offset, data)
    }

    fn close(&self) -> std::io::Result<()> {
        self.file.close()
    }

    fn try_lock_range(&self, start: LockBound, end: LockBound) -> Result<bool, redb::BackendError> {
        self.file.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: LockBound,
        end: LockBound,
    ) -> Result<bool, redb::BackendError> {
        self.file.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: LockBound, end: LockBound) -> Result<(), redb::BackendError> {
        self.file.lock_range(start, end)
    }

    fn lock_shared_range(
        &self,
        start: LockBound,
        end: LockBound,
    ) -> Result<(), redb::BackendError> {
        self.file.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: LockBound, end: LockBound) -> Result<(), redb::BackendError> {
        self.file.unlock_range(start, end)
    }

    fn query_lock_range(
        &self,
        start: LockBound,
        end: LockBound,
    ) -> Result<bool, redb::BackendError> {
        self.file.query_lock_range(start, end)
    }
}

/// A store on a [`FlakyDisk`] (with a small page cache, so that reads reach the file), and the
/// switches of its faults.
fn flaky_store(dir: &tempfile::TempDir) -> (EmbeddedStorage, Arc<Faults>) {
    let path = dir.path().join("store.redb");
    let faults = Arc::new(Faults::default());
    let open = {
        let (path, faults) = (path.clone(), Arc::clone(&faults));
        move || {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(unavailable("open the file"))?;
            let file = redb::backends::FileBackend::new(file).map_err(unavailable("backend"))?;
            Database::builder()
                .set_cache_size(0)
                .create_with_backend(FlakyDisk {
                    file,
                    faults: Arc::clone(&faults),
                })
                .map_err(unavailable("open the database"))
        }
    };
    let db = open().expect("open");
    let config = EmbeddedConfig {
        cache_bytes: 0,
        ..EmbeddedConfig::default()
    };
    let store = EmbeddedStorage::start(path, config, db, Box::new(open)).expect("start");
    (store, faults)
}

/// Retries `attempt` until it succeeds, for at most ten seconds.
async fn eventually<T>(what: &str, mut attempt: impl AsyncFnMut() -> Result<T, StorageError>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match attempt().await {
            Ok(done) => return done,
            Err(error) if Instant::now() < deadline => {
                tracing::debug!(%error, what, "not yet");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => panic!("{what} still fails after 10 s: {error}"),
        }
    }
}

fn created_at(outcome: Outcome<KeyValue>) -> Revision {
    match outcome {
        Outcome::Done(kv) => kv.mod_revision,
        Outcome::Conflict(found) => panic!("conflict: {found:?}"),
    }
}

#[tokio::test]
async fn the_store_heals_once_a_full_disk_has_room_again() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (store, faults) = flaky_store(&dir);
    let value = |v: &'static str| Bytes::from_static(v.as_bytes());
    let a = store.create("/k/a", value("a1")).await.expect("create a");
    assert_eq!(created_at(a), 2);
    let mut watch = store.watch("/k/", 0).await.expect("watch");

    faults.set_full(true);
    // It fails as it spills pages before the commit (with this small cache) or in the commit.
    let failed = store
        .create("/k/b", value("b1"))
        .await
        .expect_err("disk full");
    assert!(failed.to_string().contains("No space left"), "{failed}");
    // The file is poisoned now; this batch finds it so, reopens the file (or fails to, on
    // the full disk), and fails without having written anything.
    store
        .create("/k/c", value("c1"))
        .await
        .expect_err("disk still full");

    faults.set_full(false);
    // Reads alone bring the store back: they ask the writer to reopen the file.
    let a = eventually("get", || store.get("/k/a")).await;
    assert_eq!(a.map(|kv| kv.value), Some(value("a1")));
    let d = eventually("create", || store.create("/k/d", value("d1"))).await;
    // Neither failed write reached the file: revisions go on from the last durable one.
    assert_eq!(created_at(d), 3);
    assert_eq!(store.current_revision().await.expect("revision"), 3);
    assert!(store.get("/k/b").await.expect("get").is_none());

    // The watch opened before the failure goes on, without a gap.
    let response = watch.next().await.expect("watch ended").expect("watch");
    let seen: Vec<_> = response
        .events
        .iter()
        .map(|e| (e.kv.key.as_str(), e.kv.mod_revision))
        .collect();
    assert_eq!(seen, vec![("/k/d", 3)]);
}

#[tokio::test]
async fn a_failed_commit_that_landed_after_all_still_reaches_watchers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (store, faults) = flaky_store(&dir);
    let value = |v: &'static str| Bytes::from_static(v.as_bytes());
    store.create("/k/a", value("a1")).await.expect("create a");
    let mut watch = store.watch("/k/", 0).await.expect("watch");

    // The data and the header are written, only the sync fails: the commit is in the file.
    faults.set_sync_fails(true);
    let failed = store
        .create("/k/b", value("b1"))
        .await
        .expect_err("sync fails");
    assert!(failed.to_string().contains("outcome unknown"), "{failed}");
    faults.set_sync_fails(false);

    let c = created_at(eventually("create", || store.create("/k/c", value("c1"))).await);
    let b = store.get("/k/b").await.expect("get");
    let landed = b.is_some();
    assert_eq!(c, if landed { 4 } else { 3 });
    let mut seen = Vec::new();
    while seen.last().is_none_or(|(key, _)| key != "/k/c") {
        let response = watch.next().await.expect("watch ended").expect("watch");
        seen.extend(
            response
                .events
                .into_iter()
                .map(|e| (e.kv.key, e.kv.mod_revision)),
        );
    }
    let mut expected = vec![("/k/c".to_owned(), c)];
    if landed {
        expected.insert(0, ("/k/b".to_owned(), 3));
    }
    assert_eq!(seen, expected);
    assert!(landed, "this test means to cover a commit that landed");
}
