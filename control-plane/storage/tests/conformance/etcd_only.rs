//! etcd-backend behaviour beyond the conformance suite: key namespacing, creates sharing etcd
//! transactions, and a watch whose etcd goes away ending with an error rather than quietly.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure};
use flotilla_storage::{RangeRequest, Storage};
use futures::StreamExt;

use crate::etcd_server::EtcdServer;
use crate::suite::{Store, create_all_at_once, done, value};

/// The conformance case `simultaneous_creates_each_get_their_own_revision` proves batched
/// creates behave; this proves they are batched, so that case is not passing trivially. The
/// store's revisions are `etcd revision × 1000 + slot`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simultaneous_creates_share_etcd_transactions() -> anyhow::Result<()> {
    const CREATES: usize = 40;
    let server = Arc::new(tokio::task::spawn_blocking(EtcdServer::start).await??);
    let store: Store = Arc::new(server.connect(None).await?);
    let created = create_all_at_once(
        &store,
        (0..CREATES).map(|i| (format!("/k{i:02}"), value("v"))),
    )
    .await?;
    let etcd_revisions: BTreeSet<_> = created.iter().map(|kv| kv.mod_revision / 1000).collect();
    ensure!(
        etcd_revisions.len() < CREATES,
        "{CREATES} simultaneous creates took {} etcd transactions",
        etcd_revisions.len()
    );
    Ok(())
}

/// An etcd whose limits are below a batch's refuses it whole; the batch then goes in parts and
/// every create is answered as if it had been sent alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_over_etcds_limits_is_sent_in_parts() -> anyhow::Result<()> {
    const CREATES: usize = 40;
    let server = Arc::new(
        tokio::task::spawn_blocking(|| {
            EtcdServer::start_with(&["--max-txn-ops=8", "--max-request-bytes=20000"])
        })
        .await??,
    );
    let store: Store = Arc::new(server.connect(None).await?);
    // 1 KiB each: 20 of them exceed the request limit, 8 the operation limit.
    let kib = bytes::Bytes::from(vec![b'x'; 1024]);
    let created = create_all_at_once(
        &store,
        (0..CREATES).map(|i| (format!("/k{i:02}"), kib.clone())),
    )
    .await?;
    let revisions: BTreeSet<_> = created.iter().map(|kv| kv.mod_revision).collect();
    ensure!(
        revisions.len() == CREATES,
        "every create has its own revision"
    );
    let all = store.range(RangeRequest::default()).await?;
    ensure!(all.kvs.len() == CREATES);
    Ok(())
}

/// A caller that goes away mid-create (an HTTP client disconnecting) takes only its own create
/// with it: every other create, batched with it or queued behind it, is still answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_creates_leave_the_others_answered() -> anyhow::Result<()> {
    const CREATES: usize = 60;
    let server = Arc::new(tokio::task::spawn_blocking(EtcdServer::start).await??);
    let store = Arc::new(server.connect(None).await?);
    for round in 0..5 {
        let start = Arc::new(tokio::sync::Barrier::new(CREATES));
        let mut kept = Vec::new();
        for i in 0..CREATES {
            let (store, start) = (store.clone(), start.clone());
            let task = tokio::spawn(async move {
                start.wait().await;
                done(
                    store
                        .create(&format!("/r{round}/k{i:02}"), value("v"))
                        .await?,
                )
            });
            if i % 3 == 0 {
                // Abandoned at whatever point it reached: queued, sending, or waiting.
                let abort = task.abort_handle();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_micros(200 * (i as u64 % 7))).await;
                    abort.abort();
                });
            } else {
                kept.push(task);
            }
        }
        for task in kept {
            tokio::time::timeout(Duration::from_secs(20), task)
                .await
                .map_err(|_| anyhow::anyhow!("a create was never answered (round {round})"))???;
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefixes_namespace_stores_sharing_one_etcd() -> anyhow::Result<()> {
    let server = Arc::new(tokio::task::spawn_blocking(EtcdServer::start).await??);
    let tenant_a = server.connect(Some("/tenant-a".to_owned())).await?;
    let tenant_b = server.connect(Some("/tenant-b".to_owned())).await?;
    let unprefixed = server.connect(None).await?;

    let a = done(tenant_a.create("/pods/x", value("a")).await?)?;
    ensure!(a.key == "/pods/x", "keys come back without the namespace");
    ensure!(tenant_b.get("/pods/x").await?.is_none());
    done(tenant_b.create("/pods/x", value("b")).await?)?;

    let everything_of_a = tenant_a.range(RangeRequest::default()).await?;
    ensure!(
        everything_of_a.kvs == [a.clone()],
        "{:?}",
        everything_of_a.kvs
    );
    let raw = unprefixed.get("/tenant-a/pods/x").await?;
    ensure!(raw.map(|kv| kv.value) == Some(value("a")));

    let mut watch_a = tenant_a.watch("/", 0).await?;
    done(tenant_b.create("/pods/y", value("b")).await?)?;
    let mine = done(tenant_a.create("/pods/y", value("a")).await?)?;
    let first = crate::suite::next_response(&mut watch_a).await?;
    ensure!(
        first.events.len() == 1 && first.events[0].kv == mine,
        "{first:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_ends_with_an_error_when_etcd_goes_away() -> anyhow::Result<()> {
    let server = tokio::task::spawn_blocking(EtcdServer::start).await??;
    let store = server.connect(None).await?;
    let mut watch = store.watch("/", 0).await?;
    let kv = done(store.create("/k", value("v")).await?)?;
    ensure!(crate::suite::next_response(&mut watch).await?.events[0].kv == kv);

    drop(server);
    match tokio::time::timeout(Duration::from_secs(30), watch.next()).await? {
        Some(Err(error)) => eprintln!("watch ended with: {error}"),
        Some(Ok(response)) => bail!("expected an error, got {response:?}"),
        None => bail!("the watch ended quietly; the caller would not know to relist"),
    }
    ensure!(watch.next().await.is_none(), "an errored watch stays ended");
    Ok(())
}
