//! End-to-end API benchmark: `cargo bench -p flotilla-apiserver --bench api`.
//!
//! For each storage backend — the embedded store in a temp dir, and a single-member etcd the
//! bench starts itself (binary `etcd` on PATH) — an in-process [`ApiServer`] serves the `demo`
//! tenant over TLS on 127.0.0.1, and the kube-rs client, authenticated by the generated admin
//! kubeconfig, drives it through the real HTTPS API. Measured, client side:
//!
//! - ConfigMap create (1 KiB of data): throughput and p50/p99 latency, 1 and 100 concurrent
//!   clients, for a fixed time after a short unmeasured warm-up;
//! - get of existing ConfigMaps: p50/p99 latency at concurrency 1 and 100;
//! - list of a namespace holding 500 ConfigMaps: p50/p99 latency;
//! - watch-event latency: from a create being acknowledged to its ADDED event arriving on an
//!   already open watch, one create at a time, over a few hundred events (and, because the
//!   event often beats the response, also from the create being sent).
//!
//! The reference, in the same run against the same etcd: raw etcd puts through etcd-client,
//! at the same concurrency, with values as large as the stored ConfigMap. A second reference is
//! one create as upstream kube-apiserver sends it, raw: its own transaction that puts the key
//! only if it does not exist. (The server sends a create waiting alone that way; creates waiting
//! together share one transaction, see `flotilla-storage`'s etcd backend.) The bench
//! prints a table, the API/raw-etcd create throughput ratios, and whether the targets are met.
//! It never asserts: it reports.
//!
//! Server, client and etcd share the machine. The server runs on its own tokio runtime (threads
//! `api-server`), the client on another, and a second table shows where CPU went in each case
//! (server incl. the embedded store's writer thread, client, etcd process, and other processes
//! on the machine; read from Linux `/proc`), so a CPU-bound figure on a small machine can be
//! told from a latency-bound one, and a run disturbed by a busy neighbour is visible as such.

mod support;
use support::percentile;

#[path = "../../storage/tests/conformance/etcd_server.rs"]
mod etcd_server;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use flotilla_apiserver::ApiServer;
use flotilla_apiserver::local::LocalServer;
use flotilla_storage::{EmbeddedStorage, Storage};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use tokio::runtime::Handle;
use tokio::sync::mpsc;

/// The allocator the `flotilla` binary serves with, so the in-process server is measured as
/// shipped.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Bytes of data in every ConfigMap (one key).
const DATA_BYTES: usize = 1024;
/// Concurrency levels of the create, get and raw-put cases.
const CONCURRENCY: [usize; 2] = [1, 100];
/// Unmeasured warm-up before each timed case (opens the client's connections).
const WARMUP: Duration = Duration::from_millis(500);
/// Length of each timed create / raw-put case.
const WRITE_RUN: Duration = Duration::from_secs(4);
/// Length of each timed get case.
const READ_RUN: Duration = Duration::from_secs(2);
/// Objects in the listed namespace.
const LIST_OBJECTS: usize = 500;
/// At most this many lists, and at most `LIST_RUN` of them.
const LIST_SAMPLES: usize = 200;
const LIST_RUN: Duration = Duration::from_secs(4);
/// Watch events measured.
const WATCH_EVENTS: usize = 300;
/// How long one watch event may take before the case is abandoned.
const WATCH_EVENT_TIMEOUT: Duration = Duration::from_secs(5);
/// Worker threads of each of the two runtimes (server, client).
const WORKERS: usize = 2;
/// Name prefix of the server runtime's threads, for CPU accounting.
const SERVER_THREADS: &str = "api-server";
/// Targets checked at the end, at this concurrency.
const TARGET_CONCURRENCY: usize = 100;
const TARGET_ETCD_CREATE_RATIO: f64 = 0.70;
const TARGET_EMBEDDED_P99: Duration = Duration::from_millis(10);

// ---------------------------------------------------------------------------------------------
// CPU accounting (Linux /proc; zeros elsewhere)

/// CPU time consumed so far, split by who spent it.
#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    /// Threads of the server runtime and the embedded store's writer.
    server: Duration,
    /// Everything else in this process: the client runtime and the bench itself.
    client: Duration,
    /// The etcd process.
    etcd: Duration,
    /// Every process on the machine (busy time of all CPUs), to spot a noisy neighbour.
    machine: Duration,
}

impl Cpu {
    fn since(self, earlier: Cpu) -> Cpu {
        Cpu {
            server: self.server.saturating_sub(earlier.server),
            client: self.client.saturating_sub(earlier.client),
            etcd: self.etcd.saturating_sub(earlier.etcd),
            machine: self.machine.saturating_sub(earlier.machine),
        }
    }

    fn total(&self) -> Duration {
        self.server + self.client + self.etcd
    }

    /// CPU spent by processes other than this bench and its etcd.
    fn others(&self) -> Duration {
        self.machine.saturating_sub(self.total())
    }
}

/// The etcd process, once started.
static ETCD_PID: OnceLock<u32> = OnceLock::new();

/// `/proc` reports CPU time in USER_HZ ticks, which Linux fixes at 100 per second.
const TICKS_PER_SECOND: u64 = 100;

/// (name, user+system CPU, parent pid) of a `/proc/.../stat` file.
fn proc_stat(path: &str) -> Option<(String, Duration, u32)> {
    let text = std::fs::read_to_string(path).ok()?;
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let name = text.get(open + 1..close)?.to_string();
    // After the name: state(3) ppid(4) … utime(14) stime(15), counted from field 3.
    let fields: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((name, ticks(utime + stime), ppid))
}

fn ticks(ticks: u64) -> Duration {
    Duration::from_millis(ticks * 1000 / TICKS_PER_SECOND)
}

/// Busy time of all CPUs: the first line of `/proc/stat` without idle and iowait.
fn machine_busy() -> Option<Duration> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = text
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .take(8) // user nice system idle iowait irq softirq steal
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let (all, idle) = (fields.iter().sum::<u64>(), fields.get(3)? + fields.get(4)?);
    Some(ticks(all - idle))
}

fn cpu_now() -> Cpu {
    let process = proc_stat("/proc/self/stat")
        .map(|(_, cpu, _)| cpu)
        .unwrap_or_default();
    let mut server = Duration::ZERO;
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            let path = format!("{}/stat", task.path().display());
            if let Some((name, cpu, _)) = proc_stat(&path)
                && (name.starts_with(SERVER_THREADS) || name == "storage-writer")
            {
                server += cpu;
            }
        }
    }
    let etcd = ETCD_PID
        .get()
        .and_then(|pid| proc_stat(&format!("/proc/{pid}/stat")))
        .map(|(_, cpu, _)| cpu)
        .unwrap_or_default();
    Cpu {
        server,
        client: process.saturating_sub(server),
        etcd,
        machine: machine_busy().unwrap_or_default(),
    }
}

/// The pid of our child process named `etcd`, if `/proc` shows one.
fn find_etcd_child() -> Option<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let (name, _, ppid) = proc_stat(&format!("/proc/{pid}/stat"))?;
            (ppid == me && name == "etcd").then_some(pid)
        })
}

// ---------------------------------------------------------------------------------------------
// Statistics

/// The outcome of one timed case.
#[derive(Debug, Clone)]
struct Stats {
    ops: usize,
    elapsed: Duration,
    per_sec: f64,
    p50: Duration,
    p99: Duration,
    /// CPU spent during the timed run.
    cpu: Cpu,
}

impl Stats {
    fn from_latencies(mut latencies: Vec<Duration>, elapsed: Duration, cpu: Cpu) -> Self {
        latencies.sort_unstable();
        Stats {
            ops: latencies.len(),
            elapsed,
            per_sec: latencies.len() as f64 / elapsed.as_secs_f64().max(f64::EPSILON),
            p50: percentile(&latencies, 0.50),
            p99: percentile(&latencies, 0.99),
            cpu,
        }
    }
}

fn millis(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// Runs `op(task, i)` from `concurrency` tasks, each looping until `run` has passed, and
/// collects the latency of every completed call. The first error ends the case.
async fn drive<F, Fut>(concurrency: usize, run: Duration, op: F) -> anyhow::Result<Stats>
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let op = Arc::new(op);
    let cpu = cpu_now();
    let start = Instant::now();
    let deadline = start + run;
    let mut tasks = Vec::with_capacity(concurrency);
    for task in 0..concurrency {
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut i = 0;
            while Instant::now() < deadline {
                let began = Instant::now();
                op(task, i).await?;
                latencies.push(began.elapsed());
                i += 1;
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.context("benchmark task panicked")??);
    }
    Ok(Stats::from_latencies(
        latencies,
        start.elapsed(),
        cpu_now().since(cpu),
    ))
}

/// [`drive`] twice: an unmeasured warm-up, then the timed run. `op` gets a phase tag so the
/// two never touch the same names.
async fn warm_and_drive<F, Fut>(concurrency: usize, run: Duration, op: F) -> anyhow::Result<Stats>
where
    F: Fn(&'static str, usize, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let op = Arc::new(op);
    let warm = op.clone();
    drive(concurrency, WARMUP, move |task, i| warm("warm", task, i)).await?;
    drive(concurrency, run, move |task, i| op("run", task, i)).await
}

// ---------------------------------------------------------------------------------------------
// The server under test

/// How the server's storage is opened (on the server runtime, which then owns its tasks).
enum Backend {
    Embedded(std::path::PathBuf),
    Etcd(Arc<etcd_server::EtcdServer>),
}

impl Backend {
    async fn open(self) -> anyhow::Result<Arc<dyn Storage>> {
        Ok(match self {
            Backend::Embedded(path) => Arc::new(
                tokio::task::spawn_blocking(move || EmbeddedStorage::open(path))
                    .await?
                    .context("open the embedded store")?,
            ),
            // Retries while etcd elects itself leader after it starts listening.
            Backend::Etcd(etcd) => Arc::new(
                etcd.connect(None)
                    .await
                    .context("connect the server to etcd")?,
            ),
        })
    }
}

/// What the server runtime hands back once the server is up.
struct Started {
    storage: Arc<dyn Storage>,
    local: LocalServer,
}

/// Opens the storage, creates the `demo` tenant and starts serving TLS on 127.0.0.1:0 — all on
/// the server runtime.
async fn start_server(backend: Backend) -> anyhow::Result<Started> {
    let storage = backend.open().await?;
    let local = LocalServer::start(storage.clone(), "demo").await?;
    Ok(Started { storage, local })
}

/// An API server running on the server runtime, and an admin kube client for its `demo` tenant.
struct Served {
    client: kube::Client,
    server: Arc<ApiServer>,
    storage: Arc<dyn Storage>,
    local: LocalServer,
}

impl Served {
    async fn start(server_runtime: &Handle, backend: Backend) -> anyhow::Result<Self> {
        let started = server_runtime
            .spawn(start_server(backend))
            .await
            .context("server start-up panicked")??;
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::from_yaml(&started.local.kubeconfig)?,
            &kube::config::KubeConfigOptions::default(),
        )
        .await?;
        let client = kube::Client::try_from(config)?;
        Ok(Served {
            client,
            server: started.local.server.clone(),
            storage: started.storage,
            local: started.local,
        })
    }

    /// Stops serving; connections still open after a short grace are cut.
    async fn stop(self) {
        let Served { client, local, .. } = self;
        drop(client);
        let mut serving = local.stop();
        if tokio::time::timeout(Duration::from_secs(3), &mut serving)
            .await
            .is_err()
        {
            serving.abort();
        }
    }

    async fn create_namespace(&self, name: &str) -> anyhow::Result<()> {
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .with_context(|| format!("create namespace {name}"))?;
        Ok(())
    }

    fn config_maps(&self, namespace: &str) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// The bytes the store holds for ConfigMap `namespace/name`.
    async fn stored_bytes(&self, namespace: &str, name: &str) -> anyhow::Result<usize> {
        let resource = self
            .server
            .resources()
            .find("", "v1", "configmaps")
            .context("configmaps are not served")?;
        let tenant = self
            .server
            .tenants
            .get("demo")
            .await
            .map_err(|err| anyhow::anyhow!("tenant demo: {}", err.message))?
            .context("tenant demo vanished")?;
        let key = tenant.tenant.object_key(resource, namespace, name);
        let kv = self
            .storage
            .get(&key)
            .await?
            .with_context(|| format!("{key} is not stored"))?;
        Ok(kv.value.len())
    }
}

fn config_map(name: String, payload: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "payload".to_string(),
            payload.to_string(),
        )])),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------------
// The API cases

/// Everything measured through the API on one backend.
struct ApiFigures {
    create: Vec<(usize, Stats)>,
    get: Vec<(usize, Stats)>,
    list: Stats,
    /// Create acknowledged → ADDED event.
    watch: Stats,
    /// Create sent → ADDED event.
    watch_from_send: Stats,
    /// Watch events that arrived before their create's response did (counted as 0 latency).
    watch_early: usize,
    /// Stored bytes of one created ConfigMap.
    stored_bytes: usize,
}

async fn bench_api(server_runtime: &Handle, backend: Backend) -> anyhow::Result<ApiFigures> {
    let served = Served::start(server_runtime, backend).await?;
    let figures = api_cases(&served).await;
    served.stop().await;
    figures
}

async fn api_cases(served: &Served) -> anyhow::Result<ApiFigures> {
    const NS: &str = "bench";
    served.create_namespace(NS).await?;
    let payload: Arc<str> = "x".repeat(DATA_BYTES).into();

    let mut create = Vec::new();
    for concurrency in CONCURRENCY {
        let (api, payload) = (served.config_maps(NS), payload.clone());
        let stats = warm_and_drive(concurrency, WRITE_RUN, move |phase, task, i| {
            let api = api.clone();
            let object = config_map(format!("{phase}-c{concurrency}-{task}-{i}"), &payload);
            async move {
                api.create(&PostParams::default(), &object).await?;
                Ok(())
            }
        })
        .await
        .with_context(|| format!("create at concurrency {concurrency}"))?;
        create.push((concurrency, stats));
    }
    let stored_bytes = served.stored_bytes(NS, "run-c1-0-0").await?;

    // Gets read the objects the single-writer case created, spread over all of them.
    let names: Arc<Vec<String>> = Arc::new(
        (0..create[0].1.ops.max(1))
            .map(|i| format!("run-c1-0-{i}"))
            .collect(),
    );
    let mut get = Vec::new();
    for concurrency in CONCURRENCY {
        let (api, names) = (served.config_maps(NS), names.clone());
        let stats = warm_and_drive(concurrency, READ_RUN, move |_, task, i| {
            let api = api.clone();
            let name = names[(task * 7919 + i) % names.len()].clone();
            async move {
                api.get(&name).await?;
                Ok(())
            }
        })
        .await
        .with_context(|| format!("get at concurrency {concurrency}"))?;
        get.push((concurrency, stats));
    }

    let list = list_case(served, &payload).await.context("list")?;
    let watched = watch_case(served, &payload).await.context("watch")?;
    Ok(ApiFigures {
        create,
        get,
        list,
        watch: watched.from_ack,
        watch_from_send: watched.from_send,
        watch_early: watched.early,
        stored_bytes,
    })
}

/// Fills a namespace with exactly [`LIST_OBJECTS`] ConfigMaps and lists it, one list at a time.
async fn list_case(served: &Served, payload: &Arc<str>) -> anyhow::Result<Stats> {
    const NS: &str = "bench-list";
    served.create_namespace(NS).await?;
    let api = served.config_maps(NS);
    let fill = futures::stream::iter(0..LIST_OBJECTS)
        .map(|i| {
            let (api, object) = (api.clone(), config_map(format!("item-{i:04}"), payload));
            async move { api.create(&PostParams::default(), &object).await }
        })
        .buffer_unordered(100);
    futures::pin_mut!(fill);
    while let Some(created) = fill.next().await {
        created.context("fill the listed namespace")?;
    }
    let warm = api.list(&ListParams::default()).await?;
    if warm.items.len() != LIST_OBJECTS {
        bail!(
            "listed {} objects, expected {LIST_OBJECTS}",
            warm.items.len()
        );
    }
    let cpu = cpu_now();
    let start = Instant::now();
    let mut latencies = Vec::with_capacity(LIST_SAMPLES);
    while latencies.len() < LIST_SAMPLES && start.elapsed() < LIST_RUN {
        let began = Instant::now();
        let listed = api.list(&ListParams::default()).await?;
        latencies.push(began.elapsed());
        if listed.items.len() != LIST_OBJECTS {
            bail!(
                "listed {} objects, expected {LIST_OBJECTS}",
                listed.items.len()
            );
        }
    }
    Ok(Stats::from_latencies(
        latencies,
        start.elapsed(),
        cpu_now().since(cpu),
    ))
}

/// The watch case's figures.
struct Watched {
    from_ack: Stats,
    from_send: Stats,
    early: usize,
}

/// Opens a watch on an empty namespace, then creates [`WATCH_EVENTS`] ConfigMaps one at a
/// time, each time waiting for its ADDED event.
async fn watch_case(served: &Served, payload: &Arc<str>) -> anyhow::Result<Watched> {
    const NS: &str = "bench-watch";
    served.create_namespace(NS).await?;
    let api = served.config_maps(NS);
    let from = api
        .list(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .context("list carries no resourceVersion")?;
    let stream = api
        .watch(&WatchParams::default().timeout(290), &from)
        .await?;
    let (arrivals, mut arrived) = mpsc::unbounded_channel::<anyhow::Result<(String, Instant)>>();
    let watcher = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            let at = Instant::now();
            let sent = match event {
                Ok(WatchEvent::Added(object)) => {
                    arrivals.send(Ok((object.metadata.name.unwrap_or_default(), at)))
                }
                Ok(WatchEvent::Error(status)) => {
                    arrivals.send(Err(anyhow!("watch error: {}", status.message)))
                }
                Ok(_) => Ok(()),
                Err(err) => arrivals.send(Err(anyhow!("watch stream failed: {err}"))),
            };
            if sent.is_err() {
                break;
            }
        }
    });

    let result = async {
        let mut from_ack = Vec::with_capacity(WATCH_EVENTS);
        let mut from_send = Vec::with_capacity(WATCH_EVENTS);
        let mut early = 0;
        let cpu = cpu_now();
        let start = Instant::now();
        for i in 0..WATCH_EVENTS {
            let name = format!("watched-{i:04}");
            let object = config_map(name.clone(), payload);
            let sent = Instant::now();
            api.create(&PostParams::default(), &object).await?;
            let acknowledged = Instant::now();
            let arrived_at = loop {
                let (seen, at) = tokio::time::timeout(WATCH_EVENT_TIMEOUT, arrived.recv())
                    .await
                    .with_context(|| format!("no ADDED event for {name} within the timeout"))?
                    .context("the watch ended")??;
                if seen == name {
                    break at;
                }
            };
            if arrived_at < acknowledged {
                early += 1;
            }
            from_ack.push(arrived_at.saturating_duration_since(acknowledged));
            from_send.push(arrived_at.saturating_duration_since(sent));
        }
        let (elapsed, cpu) = (start.elapsed(), cpu_now().since(cpu));
        anyhow::Ok(Watched {
            from_ack: Stats::from_latencies(from_ack, elapsed, cpu),
            from_send: Stats::from_latencies(from_send, elapsed, cpu),
            early,
        })
    }
    .await;
    watcher.abort();
    result
}

// ---------------------------------------------------------------------------------------------
// The raw etcd reference

/// What one raw etcd operation is.
#[derive(Debug, Clone, Copy)]
enum RawOp {
    /// A plain put: the target's reference.
    Put,
    /// Put only if the key does not exist, one transaction per key: upstream's create.
    CreateTxn,
}

/// Raw etcd figures per concurrency, for each [`RawOp`].
struct RawFigures {
    put: Vec<(usize, Stats)>,
    create_txn: Vec<(usize, Stats)>,
}

/// `op` on fresh keys at each concurrency.
async fn bench_raw_etcd(
    client: &Client,
    op: RawOp,
    value_bytes: usize,
) -> anyhow::Result<Vec<(usize, Stats)>> {
    let value: Arc<Vec<u8>> = Arc::new(vec![b'x'; value_bytes]);
    let mut figures = Vec::new();
    for concurrency in CONCURRENCY {
        let (kv, value) = (client.kv_client(), value.clone());
        let stats = warm_and_drive(concurrency, WRITE_RUN, move |phase, task, i| {
            let mut kv = kv.clone();
            let key = format!("/raw-bench/{op:?}/{phase}/c{concurrency}/{task:03}/{i:08}");
            let value = value.as_ref().clone();
            async move {
                match op {
                    RawOp::Put => {
                        kv.put(key, value, None).await?;
                    }
                    RawOp::CreateTxn => {
                        let txn = Txn::new()
                            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                            .and_then([TxnOp::put(key.clone(), value, None)])
                            .or_else([TxnOp::get(key, None)]);
                        let response = kv.txn(txn).await?;
                        anyhow::ensure!(response.succeeded(), "the key already existed");
                    }
                }
                Ok(())
            }
        })
        .await
        .with_context(|| format!("raw {op:?} at concurrency {concurrency}"))?;
        figures.push((concurrency, stats));
    }
    Ok(figures)
}

// ---------------------------------------------------------------------------------------------
// Report

/// Every measured case as (backend, case, concurrency, stats), in report order.
fn rows<'a>(
    api: &'a [(&'a str, ApiFigures)],
    raw: &'a RawFigures,
) -> Vec<(&'a str, &'static str, usize, &'a Stats)> {
    let mut rows = Vec::new();
    for (backend, figures) in api {
        for (concurrency, stats) in &figures.create {
            rows.push((*backend, "create", *concurrency, stats));
        }
        for (concurrency, stats) in &figures.get {
            rows.push((*backend, "get", *concurrency, stats));
        }
        rows.push((*backend, "list 500", 1, &figures.list));
        rows.push((*backend, "watch ack→evt", 1, &figures.watch));
        rows.push((*backend, "watch send→evt", 1, &figures.watch_from_send));
    }
    for (concurrency, stats) in &raw.put {
        rows.push(("raw etcd", "put", *concurrency, stats));
    }
    for (concurrency, stats) in &raw.create_txn {
        rows.push(("raw etcd", "create txn", *concurrency, stats));
    }
    rows
}

fn verdict(met: bool) -> &'static str {
    if met { "MET" } else { "NOT MET" }
}

fn at(figures: &[(usize, Stats)], concurrency: usize) -> Option<&Stats> {
    figures
        .iter()
        .find(|(c, _)| *c == concurrency)
        .map(|(_, s)| s)
}

fn report(api: &[(&str, ApiFigures)], raw: &RawFigures, raw_value_bytes: usize) {
    let rows = rows(api, raw);
    println!();
    println!(
        "ConfigMaps with {DATA_BYTES} B of data; raw etcd puts of {raw_value_bytes} B (the stored ConfigMap size)"
    );
    println!(
        "{:<9} {:<14} {:>5} {:>7} {:>9} {:>10} {:>10}",
        "backend", "case", "conc", "ops", "ops/s", "p50", "p99"
    );
    for (backend, case, concurrency, stats) in &rows {
        println!(
            "{backend:<9} {case:<14} {concurrency:>5} {:>7} {:>9.0} {:>10} {:>10}",
            stats.ops,
            stats.per_sec,
            millis(stats.p50),
            millis(stats.p99),
        );
    }
    for (backend, figures) in api {
        if figures.watch_early > 0 {
            println!(
                "({backend}: {} of {} watch events arrived before their create's response; those count as 0 ack→evt)",
                figures.watch_early, figures.watch.ops
            );
        }
    }

    println!();
    println!(
        "CPU per operation (µs) during each timed case; cores busy with this bench and etcd, and \
         with anything else (of {} cores)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "{:<9} {:<14} {:>5} {:>9} {:>9} {:>9} {:>7} {:>7}",
        "backend", "case", "conc", "server", "client", "etcd", "cores", "others"
    );
    for (backend, case, concurrency, stats) in &rows {
        if case.starts_with("watch send") {
            continue; // same run as the ack→evt row
        }
        let per_op = |d: Duration| d.as_secs_f64() * 1e6 / stats.ops.max(1) as f64;
        let cores = |d: Duration| d.as_secs_f64() / stats.elapsed.as_secs_f64().max(f64::EPSILON);
        println!(
            "{backend:<9} {case:<14} {concurrency:>5} {:>9.0} {:>9.0} {:>9.0} {:>7.2} {:>7.2}",
            per_op(stats.cpu.server),
            per_op(stats.cpu.client),
            per_op(stats.cpu.etcd),
            cores(stats.cpu.total()),
            cores(stats.cpu.others()),
        );
    }

    println!();
    for (reference_name, references) in [
        ("raw etcd put", &raw.put),
        (
            "raw etcd create txn (one create per transaction, as upstream sends it)",
            &raw.create_txn,
        ),
    ] {
        println!("create throughput, API / {reference_name}:");
        for concurrency in CONCURRENCY {
            let Some(reference) = at(references, concurrency) else {
                continue;
            };
            for (backend, figures) in api {
                if let Some(stats) = at(&figures.create, concurrency) {
                    println!(
                        "  concurrency {concurrency:>3}  {backend:<9} {:>7.0} / {:>7.0} = {:.2}",
                        stats.per_sec,
                        reference.per_sec,
                        stats.per_sec / reference.per_sec.max(f64::EPSILON),
                    );
                }
            }
        }
    }

    println!();
    println!("targets (at {TARGET_CONCURRENCY} concurrent writers):");
    if let Some((_, etcd)) = api.iter().find(|(b, _)| *b == "etcd")
        && let (Some(ours), Some(reference)) = (
            at(&etcd.create, TARGET_CONCURRENCY),
            at(&raw.put, TARGET_CONCURRENCY),
        )
    {
        let ratio = ours.per_sec / reference.per_sec.max(f64::EPSILON);
        println!(
            "  API create throughput on etcd >= {:.0}% of raw etcd puts: {:.0}% — {}",
            TARGET_ETCD_CREATE_RATIO * 100.0,
            ratio * 100.0,
            verdict(ratio >= TARGET_ETCD_CREATE_RATIO),
        );
    }
    if let Some((_, embedded)) = api.iter().find(|(b, _)| *b == "embedded")
        && let Some(stats) = at(&embedded.create, TARGET_CONCURRENCY)
    {
        println!(
            "  p99 create latency on embedded <= {}: {} — {}",
            millis(TARGET_EMBEDDED_P99),
            millis(stats.p99),
            verdict(stats.p99 <= TARGET_EMBEDDED_P99),
        );
    }
    // One writer waits for each create before sending the next, so its rate is one over the
    // latency: an HTTPS round trip plus a conditional etcd transaction, against a bare put. The
    // raw create transaction alone bounds what any API could reach there.
    if let Some((_, etcd)) = api.iter().find(|(b, _)| *b == "etcd")
        && let (Some(ours), Some(put), Some(txn)) =
            (at(&etcd.create, 1), at(&raw.put, 1), at(&raw.create_txn, 1))
    {
        let put_rate = put.per_sec.max(f64::EPSILON);
        println!(
            "with 1 writer (latency-bound): API creates on etcd at {:.0}% of raw puts; a raw create \
             transaction alone, no HTTP, at {:.0}%",
            ours.per_sec / put_rate * 100.0,
            txn.per_sec / put_rate * 100.0,
        );
    }
}

// ---------------------------------------------------------------------------------------------

fn main() {
    if let Err(err) = run() {
        eprintln!("api bench failed: {err:#}");
        std::process::exit(1);
    }
}

fn runtime(name: &str) -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .thread_name(name)
        // Blocking threads must outlive the cases: an exited thread's CPU leaves /proc/self/task.
        .thread_keep_alive(Duration::from_secs(600))
        .enable_all()
        .build()
        .with_context(|| format!("build the {name} runtime"))
}

fn run() -> anyhow::Result<()> {
    // kube-rs builds its TLS client from the process-wide provider: make it the server's.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let server_runtime = runtime(SERVER_THREADS)?;
    let client_runtime = runtime("api-client")?;
    let server = server_runtime.handle().clone();
    let dir = tempfile::tempdir().context("create the embedded store's directory")?;
    let outcome = client_runtime.block_on(async {
        // First, so a missing etcd fails the bench before anything is measured.
        let etcd = tokio::task::spawn_blocking(etcd_server::EtcdServer::start)
            .await?
            .map(Arc::new)
            .context("start etcd for the benchmark (is the `etcd` binary on PATH?)")?;
        if let Some(pid) = find_etcd_child() {
            let _ = ETCD_PID.set(pid);
        }
        let began = Instant::now();

        eprintln!("embedded: measuring through the API…");
        let embedded = Backend::Embedded(dir.path().join("store.redb"));
        let on_embedded = bench_api(&server, embedded)
            .await
            .context("API on embedded")?;

        eprintln!("etcd: measuring through the API…");
        let on_etcd = bench_api(&server, Backend::Etcd(etcd.clone()))
            .await
            .context("API on etcd")?;

        eprintln!("etcd: measuring raw puts and create transactions…");
        let raw_value_bytes = on_etcd.stored_bytes;
        let client = Client::connect([etcd.endpoint()], None)
            .await
            .context("connect etcd-client")?;
        let raw = RawFigures {
            put: bench_raw_etcd(&client, RawOp::Put, raw_value_bytes).await?,
            create_txn: bench_raw_etcd(&client, RawOp::CreateTxn, raw_value_bytes).await?,
        };

        report(
            &[("embedded", on_embedded), ("etcd", on_etcd)],
            &raw,
            raw_value_bytes,
        );
        println!("\n(measured in {:.0} s)", began.elapsed().as_secs_f64());
        drop(etcd); // the last reference: kills it
        anyhow::Ok(())
    });
    server_runtime.shutdown_timeout(Duration::from_secs(2));
    outcome
}
