//! Put throughput and latency of the two backends: `cargo bench -p flotilla-storage --bench storage`.
//!
//! Each case creates fresh 1 KiB values for a fixed time from N concurrent tasks and reports
//! writes per second and the p50/p99 latency of an acknowledged (durable) write. etcd is a local
//! single member started for the run (binary `etcd` on PATH), talked to through `EtcdStorage`.

#[path = "../tests/conformance/etcd_server.rs"]
mod etcd_server;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use flotilla_storage::{EmbeddedStorage, Outcome, Storage};

const RUN: Duration = Duration::from_secs(3);
const VALUE_BYTES: usize = 1024;

struct Figures {
    writes: usize,
    elapsed: Duration,
    p50: Duration,
    p99: Duration,
}

async fn measure(
    store: Arc<dyn Storage>,
    concurrency: usize,
    prefix: &str,
) -> anyhow::Result<Figures> {
    let value = Bytes::from(vec![b'x'; VALUE_BYTES]);
    let start = Instant::now();
    let deadline = start + RUN;
    let mut tasks = Vec::with_capacity(concurrency);
    for task in 0..concurrency {
        let (store, value, prefix) = (store.clone(), value.clone(), prefix.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut i = 0u64;
            while Instant::now() < deadline {
                let key = format!("{prefix}{task:04}/{i:010}");
                let began = Instant::now();
                match store.create(&key, value.clone()).await? {
                    Outcome::Done(_) => latencies.push(began.elapsed()),
                    Outcome::Conflict(_) => anyhow::bail!("fresh key {key} already exists"),
                }
                i += 1;
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await??);
    }
    let elapsed = start.elapsed();
    latencies.sort_unstable();
    let at = |q: f64| {
        let index = ((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1));
        latencies.get(index).copied().unwrap_or_default()
    };
    Ok(Figures {
        writes: latencies.len(),
        elapsed,
        p50: at(0.50),
        p99: at(0.99),
    })
}

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let dir = tempfile::tempdir()?;
        let embedded: Arc<dyn Storage> =
            Arc::new(EmbeddedStorage::open(dir.path().join("bench.redb"))?);
        let etcd_server = tokio::task::spawn_blocking(etcd_server::EtcdServer::start)
            .await?
            .context("start etcd for the benchmark")?;
        let etcd: Arc<dyn Storage> = Arc::new(etcd_server.connect(None).await?);

        println!(
            "put {VALUE_BYTES} B values, {}s per case, durable acknowledgement",
            RUN.as_secs()
        );
        println!(
            "{:<10} {:>11} {:>8} {:>10} {:>10} {:>10}",
            "backend", "concurrency", "writes", "writes/s", "p50", "p99"
        );
        for (name, store) in [("embedded", &embedded), ("etcd", &etcd)] {
            for concurrency in [1, 100] {
                let prefix = format!("/bench/{name}/c{concurrency}/");
                let figures = measure(store.clone(), concurrency, &prefix).await?;
                println!(
                    "{:<10} {:>11} {:>8} {:>10.0} {:>10.2?} {:>10.2?}",
                    name,
                    concurrency,
                    figures.writes,
                    figures.writes as f64 / figures.elapsed.as_secs_f64(),
                    figures.p50,
                    figures.p99,
                );
            }
        }
        drop(etcd);
        drop(etcd_server);
        anyhow::Ok(())
    })
}
