//! Tenancy benchmark: `cargo bench -p flotilla --bench tenancy`.
//!
//! Runs the real `flotilla serve` binary on an etcd the bench starts, and measures, through its
//! HTTPS APIs only:
//!
//! - **create → ready**: from `POST /v1/clusters` to the new cluster's API answering a
//!   namespace list (what `kubectl get ns` sends), polling the cluster until `ACTIVE`, fetching
//!   its kubeconfig and connecting with it — the steps a user takes;
//! - **memory**: the resident set of the `flotilla serve` process with no clusters, then 1,
//!   100 and 1000 idle clusters, and the increment per cluster;
//! - **idle cost**: the CPU the service uses with the 1000 clusters idle, and the store writes
//!   per second meanwhile (etcd's revision before and after);
//! - **reaction time**: then a Deployment of one replica in each of the 1000 clusters, and one
//!   at a time in turn, scaled to one more: the time from the scale to its new Pod's `ADDED`
//!   event on a watch opened before it;
//! - **noisy neighbour**, once the fleet of 1000 idle clusters is there: the latency of
//!   cluster B's single reader (100 GETs/s of one ConfigMap) alone, and while cluster A is
//!   flooded with ConfigMap creates by many clients,
//!   which wait out a 429's Retry-After as client-go does, in alternating rounds (so a drift
//!   of the machine or of etcd over the run weighs on both sides alike). The service runs with
//!   its default per-cluster request limit and seats.
//!
//! - **worst bodies**: the same reader of B alone, and while A's clients send the costliest
//!   bodies the request limits let through (3 MiB of YAML: a flow sequence of small scalars
//!   nested 120 deep), in alternating rounds.
//!
//! The references, in the same run: memory against the empty service; B's latency under the
//! flood or the worst bodies against B alone. It prints figures, ratios and the issues'
//! targets; it never asserts. `FLOTILLA_BENCH_NOISY_ONLY=1` measures the two noisy-neighbour
//! parts alone (no fleet of 1000 clusters); `FLOTILLA_BENCH_FLEET_ONLY=1` the fleet alone (no
//! noisy-neighbour parts); `FLOTILLA_BENCH_IDLE_SECONDS=N` measures the idle fleet for N s
//! (default 6); `FLOTILLA_BENCH_NO_REACTION=1` leaves out the reaction time;
//! `FLOTILLA_BENCH_FLEET_SIZES=1,100,1000,5000` sets the fleet sizes memory is read at (issue
//! 28's density runs); `FLOTILLA_BENCH_SERVE_ARGS="--external-control-loops"` adds arguments
//! to `flotilla serve` (that one: memory without the clusters' hosted control loops). The
//! service parks an idle cluster's loops after 15 s here (`--park-idle-clusters-after`; the
//! bench's own `--park-idle-clusters-after=0s` in that variable turns it off), and memory is
//! read once more after they have.

#[path = "../../storage/tests/conformance/etcd_server.rs"]
#[allow(dead_code)] // shared with the storage tests; this bench needs only start and endpoint
mod etcd_server;
#[path = "support/proc.rs"]
mod proc;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use flotilla::client::ManagementClient;
use futures::TryStreamExt;
use http::Method;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

/// Clusters created one at a time for the create → ready figure.
const READY_SAMPLES: usize = 40;
/// Fleet sizes at which memory is read.
const FLEET_SIZES: [usize; 3] = [1, 100, 1000];
/// How long an idle cluster's loops run before they park (the service's default is 60 s;
/// shorter here so the bench need not wait a minute for the parked reading).
const PARK_AFTER: Duration = Duration::from_secs(15);
/// How long after the last create the parked reading is taken: the loops' quiet period and
/// a look, then the API server's release of the watch caches nobody watches any more (after
/// 120 s) and jemalloc's decay returning their pages.
const PARKED_READING_AFTER: Duration = Duration::from_secs(150);
/// How long the idle fleet's CPU use is measured.
const IDLE_RUN: Duration = Duration::from_secs(6);
/// How often a create → ready sample asks whether its cluster is ACTIVE: often, as the
/// figure is its latency.
const READY_POLL: Duration = Duration::from_millis(2);
/// How often each create of the growing fleet asks: as a client that waits would (the CLI's
/// `--wait` and Terraform poll far less often). Sixteen creates polling every 2 ms were 8000
/// requests a second taken from the same two cores the service creates clusters on.
const FLEET_POLL: Duration = Duration::from_millis(100);
/// Clusters created concurrently while growing the fleet.
const CREATE_CONCURRENCY: usize = 32;
/// How long B's reader runs in each round, alone and under the flood.
const PROBE_RUN: Duration = Duration::from_secs(5);
/// Rounds of (B alone, B under A's flood): 2000 GETs on each side in all, so a p99 rests on 20
/// samples rather than on the 5 worst of a few hundred.
const PROBE_ROUNDS: usize = 4;
/// B's GETs per second.
const PROBE_RATE: u32 = 100;
/// Clients flooding cluster A.
const FLOOD_CLIENTS: usize = 64;
/// How long to wait for one cluster to become ready before the bench gives up.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Deployments scaled, one at a time, for the reaction figure.
const REACTION_SAMPLES: usize = 100;
/// Issue 28's target for a scale → new pod.
const TARGET_REACTION_P99: Duration = Duration::from_millis(100);
/// Targets of the tenancy issue.
const TARGET_READY_P50: Duration = Duration::from_millis(100);
const TARGET_READY_P99: Duration = Duration::from_millis(500);
const TARGET_MIB_PER_TENANT: f64 = 2.0;
const TARGET_NOISY_RATIO: f64 = 2.0;
/// Issue 28's target for the same ratio at 1000 clusters.
const TARGET_FLEET_NOISY_RATIO: f64 = 1.3;
/// Clients of cluster A sending the worst bodies.
const WORST_BODY_CLIENTS: usize = 8;
/// The security review's target: B's p99 while A sends the worst bodies, against B alone.
const TARGET_WORST_BODY_RATIO: f64 = 1.3;

/// A `flotilla serve` child process, killed on drop.
struct Service {
    child: Child,
    dir: tempfile::TempDir,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Service {
    fn start(etcd: &str) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let operator = dir.path().join("operator.json");
        let child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(["serve", "--etcd", etcd, "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--operator-config")
            .arg(&operator)
            .arg("--key-encryption-key-file")
            .arg(dir.path().join("key-encryption-key"))
            .args(serve_args())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("start flotilla serve")?;
        let service = Service { child, dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !operator.exists() || std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                bail!("flotilla serve did not come up");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(service)
    }

    fn operator_config(&self) -> PathBuf {
        self.dir.path().join("operator.json")
    }

    /// CPU time the service process has used so far.
    fn cpu(&self) -> Duration {
        proc::cpu(&self.child.id().to_string())
    }

    /// Resident memory of the service process, in bytes.
    fn rss(&self) -> anyhow::Result<u64> {
        proc::rss(self.child.id())
    }
}

/// The arguments `FLOTILLA_BENCH_SERVE_ARGS` adds, and [`PARK_AFTER`] unless they set it.
fn serve_args() -> Vec<String> {
    let mut args: Vec<String> = std::env::var("FLOTILLA_BENCH_SERVE_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect();
    if !args
        .iter()
        .any(|arg| arg.starts_with("--park-idle-clusters-after"))
    {
        args.push(format!(
            "--park-idle-clusters-after={}s",
            PARK_AFTER.as_secs()
        ));
    }
    args
}

/// An account's management client and where its configuration is.
async fn account(service: &Service, id: &str) -> anyhow::Result<ManagementClient> {
    let operator = ManagementClient::from_config_file(&service.operator_config())?;
    let key = operator
        .call_json(Method::POST, "/v1/accounts", Some(&json!({ "id": id })))
        .await?;
    let mut settings: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(service.operator_config())?)?;
    settings["apiKey"] = key["apiKey"].clone();
    let path = service.dir.path().join(format!("{id}.json"));
    std::fs::write(&path, serde_json::to_vec(&settings)?)?;
    ManagementClient::from_config_file(&path)
}

/// Creates cluster `name` and waits until it is ACTIVE; returns a kube client for it and its
/// kubeconfig.
async fn create_ready(
    client: &ManagementClient,
    name: &str,
    poll: Duration,
) -> anyhow::Result<(kube::Client, String)> {
    client
        .call_json(Method::POST, "/v1/clusters", Some(&json!({ "name": name })))
        .await?;
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let described = client
            .call_json(Method::GET, &format!("/v1/clusters/{name}"), None)
            .await?;
        match described["cluster"]["status"].as_str() {
            Some("ACTIVE") => break,
            Some("FAILED") => bail!("cluster {name} FAILED: {}", described["cluster"]),
            _ if Instant::now() > deadline => bail!("cluster {name} not ACTIVE in time"),
            _ => tokio::time::sleep(poll).await,
        }
    }
    let kubeconfig = client
        .call(
            Method::GET,
            &format!("/v1/clusters/{name}/kubeconfig"),
            None,
        )
        .await?;
    let kubeconfig = String::from_utf8(kubeconfig.to_vec())?;
    let kube = kube_client(&kubeconfig).await?;
    Api::<Namespace>::all(kube.clone())
        .list(&ListParams::default())
        .await
        .with_context(|| format!("list namespaces of {name}"))?;
    Ok((kube, kubeconfig))
}

/// A kube client from a kubeconfig, on the current runtime.
async fn kube_client(kubeconfig: &str) -> anyhow::Result<kube::Client> {
    let mut config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(kubeconfig)?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    // kube's own retry of 429s would hide them; the flooders wait out Retry-After themselves
    // and count each refusal.
    config.default_retry = false;
    Ok(kube::Client::try_from(config)?)
}

/// [`probe`] on a thread and runtime of its own, with its own client: tenant B's client is
/// another program than A's flooders, so B's requests must not queue behind A's tasks in the
/// bench's runtime.
fn probe_apart(kubeconfig: String) -> anyhow::Result<Vec<Duration>> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async move { probe(&kube_client(&kubeconfig).await?).await })
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the probe thread panicked"))?
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn verdict(met: bool) -> &'static str {
    if met { "MET" } else { "NOT MET" }
}

/// GETs of one ConfigMap, `PROBE_RATE` a second (well inside the per-cluster limit, so what
/// is measured is latency, not B's own throttling) for `PROBE_RUN`: the latencies, in order sent.
async fn probe(client: &kube::Client) -> anyhow::Result<Vec<Duration>> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut latencies = Vec::new();
    let mut ticker = tokio::time::interval(Duration::from_secs(1) / PROBE_RATE);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let started = Instant::now();
    while started.elapsed() < PROBE_RUN {
        ticker.tick().await;
        let sent = Instant::now();
        api.get("probe").await.context("probe GET")?;
        latencies.push(sent.elapsed());
    }
    Ok(latencies)
}

fn config_map(name: String) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("payload".to_string(), "x".repeat(1024))])),
        ..Default::default()
    }
}

/// Runs `FLOOD_CLIENTS` ConfigMap creators against `client` until `stop`, naming their objects
/// apart from earlier rounds'; counts outcomes.
fn flood(
    round: usize,
    client: &kube::Client,
    stop: &Arc<AtomicBool>,
    done: &Arc<AtomicU64>,
    refused: &Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..FLOOD_CLIENTS)
        .map(|task| {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
            let (stop, done, refused) = (stop.clone(), done.clone(), refused.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    match api
                        .create(
                            &PostParams::default(),
                            &config_map(format!("f-{round}-{task}-{i}")),
                        )
                        .await
                    {
                        Ok(_) => {
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        // As client-go does: wait out the Retry-After second of a 429.
                        Err(kube::Error::Api(status)) if status.code == 429 => {
                            refused.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                        Err(_) => {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect()
}

/// The costliest body the limits let through, as YAML: just under 3 MiB of one flow sequence
/// of one-character scalars nested 120 deep (under the 128 depth limit), as a ConfigMap.
fn worst_body() -> Vec<u8> {
    let depth = 120;
    let mut body = String::from("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: worst}\ndata: ");
    body.push_str(&"[".repeat(depth));
    while body.len() < 3 * 1024 * 1024 - 4096 {
        body.push_str("1,");
    }
    body.push('1');
    body.push_str(&"]".repeat(depth));
    body.push('\n');
    body.into_bytes()
}

/// Runs `WORST_BODY_CLIENTS` senders of [`worst_body`] against `client` until `stop`; counts
/// the bodies answered (each is refused once read: its data is no map).
fn send_worst_bodies(
    client: &kube::Client,
    stop: &Arc<AtomicBool>,
    answered: &Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let body = bytes::Bytes::from(worst_body());
    (0..WORST_BODY_CLIENTS)
        .map(|_| {
            let (client, stop, answered, body) =
                (client.clone(), stop.clone(), answered.clone(), body.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let request = http::Request::post("/api/v1/namespaces/default/configmaps")
                        .header(http::header::CONTENT_TYPE, "application/yaml")
                        .body(kube::client::Body::from(body.to_vec()));
                    let Ok(request) = request else { return };
                    match client.send(request).await {
                        Ok(response) => {
                            let status = response.status();
                            answered.fetch_add(1, Ordering::Relaxed);
                            if status == http::StatusCode::TOO_MANY_REQUESTS {
                                tokio::time::sleep(Duration::from_secs(1)).await;
                            }
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                }
            })
        })
        .collect()
}

async fn run(service: &Service, etcd: &str) -> anyhow::Result<()> {
    let client = account(service, "bench").await?;
    let empty = service.rss()?;

    // Create → ready, one cluster at a time.
    eprintln!("create → ready: {READY_SAMPLES} clusters, one at a time…");
    let mut ready = Vec::new();
    let mut clients = Vec::new();
    // Every cluster's client, for the reaction time over the whole fleet.
    let mut fleet_clients: Vec<kube::Client> = Vec::new();
    for i in 0..READY_SAMPLES {
        let started = Instant::now();
        let (kube, kubeconfig) = create_ready(&client, &format!("ready-{i}"), READY_POLL).await?;
        ready.push(started.elapsed());
        fleet_clients.push(kube.clone());
        if i < 2 {
            clients.push((kube, kubeconfig));
        }
    }
    ready.sort();
    let mut fleet = READY_SAMPLES;

    let fleet_only = std::env::var_os("FLOTILLA_BENCH_FLEET_ONLY").is_some();
    let noisy_only = std::env::var_os("FLOTILLA_BENCH_NOISY_ONLY").is_some();
    // Memory with a growing fleet of idle clusters.
    let mut memory = vec![(0usize, empty)];
    let fleet_sizes: Vec<usize> = match std::env::var("FLOTILLA_BENCH_FLEET_SIZES") {
        Ok(sizes) => sizes
            .split(',')
            .map(|size| size.trim().parse())
            .collect::<Result<_, _>>()
            .context("FLOTILLA_BENCH_FLEET_SIZES: comma-separated cluster counts")?,
        Err(_) => FLEET_SIZES.to_vec(),
    };
    for size in fleet_sizes.iter().copied().filter(|_| !noisy_only) {
        let (grown_from, growing) = (fleet, Instant::now());
        if fleet < size {
            eprintln!("growing the fleet to {size} clusters…");
        }
        while fleet < size {
            let batch = (size - fleet).min(CREATE_CONCURRENCY);
            let creates = (fleet..fleet + batch).map(|i| {
                let client = &client;
                async move { create_ready(client, &format!("idle-{i}"), FLEET_POLL).await }
            });
            for outcome in futures::future::join_all(creates).await {
                fleet_clients.push(outcome?.0);
            }
            fleet += batch;
        }
        if fleet > grown_from {
            eprintln!(
                "  {} clusters created, {CREATE_CONCURRENCY} at a time, each until it answered, in {:.1} s",
                fleet - grown_from,
                growing.elapsed().as_secs_f64()
            );
        }
        // Let the fleet settle (reconciler passes, connection pools) before reading.
        tokio::time::sleep(Duration::from_secs(3)).await;
        memory.push((size.max(fleet), service.rss()?));
    }
    // Once the idle clusters' loops have parked (unless parking is off).
    let parking = !std::env::var("FLOTILLA_BENCH_SERVE_ARGS")
        .unwrap_or_default()
        .contains("--park-idle-clusters-after=0s");
    let parked = if parking && !noisy_only {
        eprintln!(
            "waiting {} s for the idle clusters' loops to park…",
            PARKED_READING_AFTER.as_secs()
        );
        tokio::time::sleep(PARKED_READING_AFTER).await;
        Some((fleet, service.rss()?))
    } else {
        None
    };
    // What an idle fleet costs: the replica's lease renewal and whatever the clusters' loops
    // and watches still do when nothing changes; store writes counted by etcd's revision.
    let idle_run = std::env::var("FLOTILLA_BENCH_IDLE_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(IDLE_RUN, Duration::from_secs);
    let revision_before = etcd_revision(etcd)?;
    let (cpu_before, idle_started) = (service.cpu(), Instant::now());
    tokio::time::sleep(idle_run).await;
    let idle_secs = idle_started.elapsed().as_secs_f64();
    let idle_cores = (service.cpu() - cpu_before).as_secs_f64() / idle_secs;
    let writes_per_second = (etcd_revision(etcd)? - revision_before) as f64 / idle_secs;
    // The first reading above the empty service may have been taken with more clusters
    // than asked for (the create → ready samples); the table says how many.
    let noisy = if fleet_only {
        None
    } else {
        Some({
            // Noisy neighbour, with the whole fleet there (issue 28 asks for it at 1000
            // clusters): A = ready-0 floods, B = ready-1 reads.
            let ((a, _), (b, b_kubeconfig)) = (&clients[0], &clients[1]);
            Api::<ConfigMap>::namespaced(b.clone(), "default")
                .create(&PostParams::default(), &config_map("probe".into()))
                .await?;
            eprintln!(
                "noisy neighbour: B alone, then B while A is flooded by {FLOOD_CLIENTS} clients…"
            );
            let probe_b = || {
                let kubeconfig = b_kubeconfig.clone();
                tokio::task::spawn_blocking(move || probe_apart(kubeconfig))
            };
            let (mut alone, mut flooded) = (Vec::new(), Vec::new());
            let (mut flood_done, mut flood_refused, mut flood_secs) = (0, 0, 0.0);
            for round in 0..PROBE_ROUNDS {
                alone.extend(probe_b().await??);
                let stop = Arc::new(AtomicBool::new(false));
                let (done, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
                let flooders = flood(round, a, &stop, &done, &refused);
                tokio::time::sleep(Duration::from_millis(500)).await;
                let flood_started = Instant::now();
                let done_before = done.load(Ordering::Relaxed);
                let refused_before = refused.load(Ordering::Relaxed);
                flooded.extend(probe_b().await??);
                flood_secs += flood_started.elapsed().as_secs_f64();
                flood_done += done.load(Ordering::Relaxed) - done_before;
                flood_refused += refused.load(Ordering::Relaxed) - refused_before;
                stop.store(true, Ordering::Relaxed);
                for flooder in flooders {
                    let _ = flooder.await;
                }
            }
            alone.sort();
            flooded.sort();

            // Worst bodies: B alone, then B while A's clients send the costliest bodies.
            eprintln!(
                "worst bodies: B alone, then B while {WORST_BODY_CLIENTS} clients of A send 3 MiB of nested YAML…"
            );
            let (mut alone_again, mut attacked) = (Vec::new(), Vec::new());
            let (mut bodies_answered, mut attack_secs) = (0, 0.0);
            for _ in 0..PROBE_ROUNDS {
                alone_again.extend(probe_b().await??);
                let stop = Arc::new(AtomicBool::new(false));
                let answered = Arc::new(AtomicU64::new(0));
                let senders = send_worst_bodies(a, &stop, &answered);
                tokio::time::sleep(Duration::from_millis(500)).await;
                let started = Instant::now();
                let before = answered.load(Ordering::Relaxed);
                attacked.extend(probe_b().await??);
                attack_secs += started.elapsed().as_secs_f64();
                bodies_answered += answered.load(Ordering::Relaxed) - before;
                stop.store(true, Ordering::Relaxed);
                for sender in senders {
                    let _ = sender.await;
                }
            }
            alone_again.sort();
            attacked.sort();
            let worst = (alone_again, attacked, bodies_answered as f64 / attack_secs);
            if noisy_only {
                report_noisy(&alone, &flooded, (flood_done, flood_refused, flood_secs));
                report_worst(&worst);
                return Ok(());
            }
            (
                alone,
                flooded,
                (flood_done, flood_refused, flood_secs),
                worst,
            )
        })
    };

    match &noisy {
        Some((alone, flooded, flood, worst)) => {
            report(&ready, &memory, alone, flooded, *flood);
            report_worst(worst);
        }
        None => report_ready_and_memory(&ready, &memory),
    }
    if let Some((clusters, rss)) = parked {
        let per = mib(rss.saturating_sub(memory[0].1)) / clusters as f64;
        println!(
            "\n{clusters} idle clusters with their loops parked ({} s after the last create): RSS {:.1} MiB, {per:.3} MiB per cluster against the empty service (issue 28's target: ≤ 0.5 MiB — {})",
            PARKED_READING_AFTER.as_secs(),
            mib(rss),
            verdict(per <= 0.5)
        );
    }
    println!(
        "\nidle fleet of {fleet} clusters over {idle_secs:.0} s: flotilla serve uses {idle_cores:.3} cores; the store takes {writes_per_second:.2} writes/s (targets at 10,000 clusters: ≤ 0.1 core, ≤ 10 writes/s)"
    );
    if std::env::var_os("FLOTILLA_BENCH_NO_REACTION").is_none() {
        eprintln!(
            "reaction time: a Deployment in each of {} clusters, then {REACTION_SAMPLES} scaled one at a time…",
            fleet_clients.len()
        );
        let mut samples = reaction(&fleet_clients).await?;
        samples.sort();
        let p99 = percentile(&samples, 0.99);
        println!(
            "\nreaction time with {} clusters each running a Deployment: scale one → its new Pod ADDED, {} samples: p50 {}, p99 {}, max {}",
            fleet_clients.len(),
            samples.len(),
            ms(percentile(&samples, 0.5)),
            ms(p99),
            ms(percentile(&samples, 1.0))
        );
        println!(
            "  target p99 ≤ {}: {}",
            ms(TARGET_REACTION_P99),
            verdict(p99 <= TARGET_REACTION_P99)
        );
    }
    Ok(())
}

/// A Deployment `web` of `replicas` pods.
fn deployment(replicas: i32) -> anyhow::Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx"}]}
            }
        }
    }))?)
}

/// One Deployment in every cluster, then, one cluster at a time, the time from scaling it
/// by one to the new Pod's `ADDED` on a watch opened before the scale.
async fn reaction(clients: &[kube::Client]) -> anyhow::Result<Vec<Duration>> {
    let selector = ListParams::default().labels("app=web");
    for chunk in clients.chunks(CREATE_CONCURRENCY) {
        let creates = chunk.iter().map(|client| async move {
            Api::<Deployment>::namespaced(client.clone(), "default")
                .create(&PostParams::default(), &deployment(1)?)
                .await?;
            anyhow::Ok(())
        });
        for outcome in futures::future::join_all(creates).await {
            outcome?;
        }
    }
    // Every cluster's first pod, so that each sample measures one scale alone.
    let deadline = Instant::now() + Duration::from_secs(120);
    for chunk in clients.chunks(CREATE_CONCURRENCY) {
        let waits = chunk.iter().map(|client| {
            let selector = selector.clone();
            async move {
                let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
                while pods.list(&selector).await?.items.is_empty() {
                    if Instant::now() > deadline {
                        bail!("a Deployment's first pod did not appear");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                anyhow::Ok(())
            }
        });
        for outcome in futures::future::join_all(waits).await {
            outcome?;
        }
    }
    let mut samples = Vec::with_capacity(REACTION_SAMPLES);
    for i in 0..REACTION_SAMPLES {
        // A prime stride visits distinct clusters across the fleet.
        let client = &clients[(i * 7919) % clients.len()];
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let listed = pods.list(&selector).await?;
        let replicas = i32::try_from(listed.items.len())? + 1;
        let version = listed.metadata.resource_version.unwrap_or_default();
        let mut events = Box::pin(
            pods.watch(&WatchParams::default().labels("app=web"), &version)
                .await?,
        );
        let started = Instant::now();
        Api::<Deployment>::namespaced(client.clone(), "default")
            .patch(
                "web",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": replicas}})),
            )
            .await?;
        loop {
            match tokio::time::timeout(Duration::from_secs(30), events.try_next()).await {
                Ok(Ok(Some(WatchEvent::Added(_)))) => break,
                Ok(Ok(Some(_))) => {}
                Ok(Ok(None)) => bail!("the pod watch ended before the new pod"),
                Ok(Err(err)) => return Err(err.into()),
                Err(_) => bail!("no new pod 30 s after the scale"),
            }
        }
        samples.push(started.elapsed());
    }
    Ok(samples)
}

/// etcd's current revision (every write moves it by one), through its JSON gateway.
fn etcd_revision(endpoint: &str) -> anyhow::Result<i64> {
    let out = Command::new("curl")
        .args(["-sS", "--fail", "-X", "POST", "-d", "{}"])
        .arg(format!("{endpoint}/v3/maintenance/status"))
        .output()
        .context("curl (for etcd's revision)")?;
    anyhow::ensure!(
        out.status.success(),
        "etcd status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    status["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .or_else(|| status["header"]["revision"].as_i64())
        .with_context(|| format!("no revision in {status}"))
}

fn report_ready_and_memory(ready: &[Duration], memory: &[(usize, u64)]) {
    let (ready_p50, ready_p99) = (percentile(ready, 0.5), percentile(ready, 0.99));
    println!(
        "\ncreate → ready ({} clusters, POST /v1/clusters → ACTIVE → kubeconfig → namespaces listed)",
        ready.len()
    );
    println!(
        "  p50 {}   p99 {}   max {}",
        ms(ready_p50),
        ms(ready_p99),
        ms(percentile(ready, 1.0))
    );

    println!("\nresident memory of flotilla serve");
    println!(
        "  {:>8}  {:>10}  {:>16}",
        "clusters", "RSS MiB", "MiB per cluster"
    );
    let (_, empty) = memory[0];
    for &(clusters, rss) in memory {
        let per = if clusters == 0 {
            String::from("-")
        } else {
            format!("{:.3}", mib(rss.saturating_sub(empty)) / clusters as f64)
        };
        println!("  {clusters:>8}  {:>10.1}  {per:>16}", mib(rss));
    }
    let increment = match (memory.iter().rev().nth(1), memory.last()) {
        (Some(&(n1, r1)), Some(&(n2, r2))) if n2 > n1 => {
            mib(r2.saturating_sub(r1)) / (n2 - n1) as f64
        }
        _ => f64::NAN,
    };
    println!("  increment between the last two sizes: {increment:.3} MiB per idle cluster");
    println!(
        "  ≤ {TARGET_MIB_PER_TENANT} MiB per idle cluster: {increment:.3} MiB — {}",
        verdict(increment <= TARGET_MIB_PER_TENANT)
    );
    println!(
        "  create → ready p50 < {} and p99 < {}: {} / {} — {}",
        ms(TARGET_READY_P50),
        ms(TARGET_READY_P99),
        ms(ready_p50),
        ms(ready_p99),
        verdict(ready_p50 < TARGET_READY_P50 && ready_p99 < TARGET_READY_P99)
    );
}

fn report(
    ready: &[Duration],
    memory: &[(usize, u64)],
    alone: &[Duration],
    flooded: &[Duration],
    (flood_done, flood_refused, flood_secs): (u64, u64, f64),
) {
    report_ready_and_memory(ready, memory);
    report_noisy(alone, flooded, (flood_done, flood_refused, flood_secs));
    println!(
        "\n  B's p99 under A's flood within {TARGET_NOISY_RATIO}× of B alone: {:.2}× — {}",
        noisy_ratio(alone, flooded),
        verdict(noisy_ratio(alone, flooded) <= TARGET_NOISY_RATIO)
    );
    println!(
        "  issue 28, with the whole fleet there: within {TARGET_FLEET_NOISY_RATIO}× — {}",
        verdict(noisy_ratio(alone, flooded) <= TARGET_FLEET_NOISY_RATIO)
    );
}

fn noisy_ratio(alone: &[Duration], flooded: &[Duration]) -> f64 {
    percentile(flooded, 0.99).as_secs_f64() / percentile(alone, 0.99).as_secs_f64().max(1e-9)
}

fn report_noisy(
    alone: &[Duration],
    flooded: &[Duration],
    (flood_done, flood_refused, flood_secs): (u64, u64, f64),
) {
    let (alone_p99, flooded_p99) = (percentile(alone, 0.99), percentile(flooded, 0.99));
    let ratio = flooded_p99.as_secs_f64() / alone_p99.as_secs_f64().max(1e-9);
    println!("\nnoisy neighbour: cluster B's GET latency");
    println!(
        "  B alone:         {} GETs, p50 {}, p99 {}",
        alone.len(),
        ms(percentile(alone, 0.5)),
        ms(alone_p99)
    );
    println!(
        "  B while A floods: {} GETs, p50 {}, p99 {}   (A: {:.0} creates/s accepted, {:.0}/s refused)",
        flooded.len(),
        ms(percentile(flooded, 0.5)),
        ms(flooded_p99),
        flood_done as f64 / flood_secs,
        flood_refused as f64 / flood_secs
    );
    println!("  p99 under flood / alone = {ratio:.2}");
}

/// B alone, B under A's worst bodies, A's bodies answered per second.
type WorstBodies = (Vec<Duration>, Vec<Duration>, f64);

fn report_worst((alone, attacked, answered_per_second): &WorstBodies) {
    let ratio = noisy_ratio(alone, attacked);
    println!("\nworst bodies: cluster B's GET latency");
    println!(
        "  B alone:                   {} GETs, p50 {}, p99 {}",
        alone.len(),
        ms(percentile(alone, 0.5)),
        ms(percentile(alone, 0.99))
    );
    println!(
        "  B while A sends 3 MiB YAML: {} GETs, p50 {}, p99 {}   (A: {answered_per_second:.1} bodies/s answered)",
        attacked.len(),
        ms(percentile(attacked, 0.5)),
        ms(percentile(attacked, 0.99))
    );
    println!(
        "  target: B's p99 within {TARGET_WORST_BODY_RATIO}× of B alone: {ratio:.2}× — {}",
        verdict(ratio <= TARGET_WORST_BODY_RATIO)
    );
}

fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let outcome = (|| -> anyhow::Result<()> {
        let etcd = etcd_server::EtcdServer::start()
            .context("start etcd for the benchmark (is the `etcd` binary on PATH?)")?;
        let service = Service::start(&etcd.endpoint())?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let began = Instant::now();
        runtime.block_on(run(&service, &etcd.endpoint()))?;
        println!("\n(measured in {:.0} s)", began.elapsed().as_secs_f64());
        Ok(())
    })();
    if let Err(err) = outcome {
        eprintln!("tenancy bench failed: {err:#}");
        std::process::exit(1);
    }
}
