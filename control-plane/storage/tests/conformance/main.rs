//! The storage crate's integration tests: one conformance suite run against both backends, plus
//! backend-specific tests (crash safety of the embedded store, etcd stream failures).
//!
//! The etcd tests start real etcd processes (binary `etcd` on PATH, Debian package
//! `etcd-server`); they fail, never skip, when it is missing.

mod embedded_only;
mod etcd_only;
mod etcd_server;
mod suite;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use flotilla_storage::{EmbeddedStorage, Storage};
use tempfile::TempDir;

use etcd_server::EtcdServer;

/// A store under test, with what must outlive it.
pub struct Fixture {
    /// Declared first so that it is dropped before the process or directory it lives in.
    pub store: Arc<dyn Storage>,
    /// A key prefix no other test uses.
    pub prefix: String,
    _etcd: Option<Arc<EtcdServer>>,
    _dir: Option<TempDir>,
}

/// A unique prefix: tests sharing one etcd never see each other's keys.
pub fn unique_prefix(case: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "/conformance/{case}/{nanos}-{}/",
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A fresh embedded store in its own directory.
pub fn embedded(case: &str) -> anyhow::Result<Fixture> {
    let dir = tempfile::tempdir()?;
    let store = EmbeddedStorage::open(dir.path().join("store.redb"))?;
    Ok(Fixture {
        store: Arc::new(store),
        prefix: unique_prefix(case),
        _etcd: None,
        _dir: Some(dir),
    })
}

/// A store on the etcd shared by the tests running right now.
///
/// The etcd lives as long as some test holds it: the last one to finish kills it (a test that
/// starts later gets a new one), so no etcd outlives the test binary.
pub async fn shared_etcd(case: &str) -> anyhow::Result<Fixture> {
    static SHARED: tokio::sync::Mutex<Weak<EtcdServer>> =
        tokio::sync::Mutex::const_new(Weak::new());
    let server = {
        let mut shared = SHARED.lock().await;
        match shared.upgrade() {
            Some(server) => server,
            None => {
                let server = Arc::new(tokio::task::spawn_blocking(EtcdServer::start).await??);
                *shared = Arc::downgrade(&server);
                server
            }
        }
    };
    etcd_fixture(server, case).await
}

/// A store on an etcd of its own, for tests whose effects are global (compaction is).
pub async fn private_etcd(case: &str) -> anyhow::Result<Fixture> {
    let server = Arc::new(tokio::task::spawn_blocking(EtcdServer::start).await??);
    etcd_fixture(server, case).await
}

async fn etcd_fixture(server: Arc<EtcdServer>, case: &str) -> anyhow::Result<Fixture> {
    let store = server.connect(None).await?;
    Ok(Fixture {
        store: Arc::new(store),
        prefix: unique_prefix(case),
        _etcd: Some(server),
        _dir: None,
    })
}

/// One `#[tokio::test]` per case and backend, named `embedded::<case>` and `etcd::<case>`.
/// `shared` cases run on the shared etcd; `private` ones on an etcd of their own.
macro_rules! conformance {
    (shared: [$($shared:ident),* $(,)?], private: [$($private:ident),* $(,)?] $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $shared() -> anyhow::Result<()> {
                    let fixture = crate::embedded(stringify!($shared))?;
                    crate::suite::$shared(fixture.store.clone(), &fixture.prefix).await
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $private() -> anyhow::Result<()> {
                    let fixture = crate::embedded(stringify!($private))?;
                    crate::suite::$private(fixture.store.clone(), &fixture.prefix).await
                }
            )*
        }
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $shared() -> anyhow::Result<()> {
                    let fixture = crate::shared_etcd(stringify!($shared)).await?;
                    crate::suite::$shared(fixture.store.clone(), &fixture.prefix).await
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $private() -> anyhow::Result<()> {
                    let fixture = crate::private_etcd(stringify!($private)).await?;
                    crate::suite::$private(fixture.store.clone(), &fixture.prefix).await
                }
            )*
        }
    };
}

conformance! {
    shared: [
        create_and_get,
        update_is_compare_and_swap,
        delete_with_and_without_precondition,
        range_pages_at_a_fixed_revision_under_concurrent_writes,
        range_counts_from_the_start_key,
        range_rejects_a_future_revision,
        watch_replays_history_then_follows_live_writes,
        watch_from_zero_starts_after_the_current_revision,
        watch_sees_only_its_prefix,
        progress_reports_cover_writes_outside_the_prefix,
        delete_events_carry_the_previous_state,
        watch_delivers_concurrent_writes_exactly_once_in_order,
        concurrent_compare_and_swap_loses_no_update,
        revisions_strictly_increase,
        every_past_revision_reads_back_as_it_was,
        simultaneous_creates_each_get_their_own_revision,
    ],
    private: [
        compaction_fails_older_reads_and_watches,
    ],
}
