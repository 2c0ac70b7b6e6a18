//! Workloads benchmark: `cargo bench -p flotilla --bench workloads`.
//!
//! Runs the real binaries as a user of a self-managed control plane would: `flotilla up` with
//! `--external-control-loops`, then `flotilla controller-manager`, `flotilla scheduler` and
//! `flotilla simulate-nodes` (100 nodes) against its kubeconfig, each its own process. It
//! creates Deployments totalling 10 000 replicas at once and measures, through a watch:
//!
//! - **10 000 pods Running**: from the first Deployment create to the last pod Running (and
//!   the intermediate points: all created, all bound), against kwok's CI bar (10 000 pods in
//!   120 s) and the target (30 s);
//! - **controller-manager memory per 1000 pods**: the resident set of the
//!   `flotilla controller-manager` process with the nodes only, then with the 10 000 pods
//!   (and their ReplicaSets) in its caches.
//!
//! It prints figures and ratios; it never asserts.

#[path = "support/proc.rs"]
mod proc;
#[path = "support/service.rs"]
mod service;

use service::{Process, client, spawn, start_up};

use std::collections::HashSet;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::bail;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher::{self, Event};
use serde_json::json;

/// Simulated nodes (110 pods each, as a kubelet's default).
const NODES: usize = 100;
/// Deployments, and replicas of each.
const DEPLOYMENTS: usize = 10;
const REPLICAS: usize = 1000;
/// How long the whole rollout may take before the bench gives up.
const GIVE_UP: Duration = Duration::from_secs(600);
/// kwok's CI bar and the target for 10 000 pods Running.
const KWOK_BAR: Duration = Duration::from_secs(120);
const TARGET: Duration = Duration::from_secs(30);

/// CPU used by each process of the run between two readings.
struct CpuReadings(Vec<(&'static str, Duration)>);

impl CpuReadings {
    fn take(processes: &[(&'static str, &Process)]) -> Self {
        let mut readings: Vec<_> = processes.iter().map(|(role, p)| (*role, p.cpu())).collect();
        readings.push(("bench (watch client)", proc::cpu("self")));
        Self(readings)
    }
}

fn deployment(name: &str) -> anyhow::Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]},
            },
        },
    }))?)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

async fn wait_for_nodes(client: &kube::Client) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if nodes.list(&ListParams::default()).await?.items.len() >= NODES {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{NODES} simulated nodes did not register");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Milestones of the rollout, as seen by a pod watch.
#[derive(Default)]
struct Milestones {
    created: Option<Duration>,
    bound: Option<Duration>,
    running: Option<Duration>,
}

async fn run() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (service, kubeconfig) = start_up(dir.path(), &["--external-control-loops"], Stdio::null())?;
    let client = client(&kubeconfig).await?;
    let controllers = spawn(&["controller-manager", "--kubeconfig", &kubeconfig])?;
    let scheduler = spawn(&["scheduler", "--kubeconfig", &kubeconfig])?;
    let nodes = spawn(&[
        "simulate-nodes",
        "--kubeconfig",
        &kubeconfig,
        "--count",
        &NODES.to_string(),
    ])?;
    wait_for_nodes(&client).await?;
    // Let the controller-manager take its lease and fill its caches before the baseline.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let baseline = controllers.rss()?;

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut events = watcher::watcher(pods, watcher::Config::default()).boxed();
    // The watch is established (its initial, empty list done) before the clock starts.
    while let Some(event) = events.next().await {
        if matches!(event, Ok(Event::InitDone)) {
            break;
        }
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let total = DEPLOYMENTS * REPLICAS;
    let processes = [
        ("API server (flotilla up)", &service),
        ("controller-manager", &controllers),
        ("scheduler", &scheduler),
        ("node simulator", &nodes),
    ];
    let cpu_before = CpuReadings::take(&processes);
    let start = Instant::now();
    for index in 0..DEPLOYMENTS {
        deployments
            .create(
                &PostParams::default(),
                &deployment(&format!("web-{index}"))?,
            )
            .await?;
    }
    let (mut created, mut bound, mut running) = (HashSet::new(), HashSet::new(), HashSet::new());
    let mut milestones = Milestones::default();
    while milestones.running.is_none() {
        let next = tokio::time::timeout_at((start + GIVE_UP).into(), events.next()).await;
        let Ok(Some(event)) = next else {
            bail!(
                "gave up after {GIVE_UP:?}: {} created, {} bound, {} running",
                created.len(),
                bound.len(),
                running.len()
            );
        };
        let Ok(Event::Apply(pod)) = event else {
            continue;
        };
        let name = pod.metadata.name.clone().unwrap_or_default();
        created.insert(name.clone());
        if pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_some()
        {
            bound.insert(name.clone());
        }
        if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
            running.insert(name);
        }
        let now = start.elapsed();
        if created.len() >= total {
            milestones.created.get_or_insert(now);
        }
        if bound.len() >= total {
            milestones.bound.get_or_insert(now);
        }
        if running.len() >= total {
            milestones.running = Some(now);
        }
    }
    let cpu_after = CpuReadings::take(&processes);
    // The controller-manager's caches have seen the last status updates by now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let loaded = controllers.rss()?;
    report(&milestones, baseline, loaded);
    report_cpu(
        &cpu_before,
        &cpu_after,
        milestones.running.unwrap_or_default(),
    );
    Ok(())
}

fn report(milestones: &Milestones, baseline: u64, loaded: u64) {
    let secs =
        |d: Option<Duration>| d.map_or("-".to_string(), |d| format!("{:.1} s", d.as_secs_f64()));
    let total = DEPLOYMENTS * REPLICAS;
    println!(
        "workloads: {DEPLOYMENTS} Deployments × {REPLICAS} replicas on {NODES} simulated nodes"
    );
    println!("  all {total} pods created   {}", secs(milestones.created));
    println!("  all {total} pods bound     {}", secs(milestones.bound));
    println!("  all {total} pods Running   {}", secs(milestones.running));
    if let Some(running) = milestones.running {
        let rate = total as f64 / running.as_secs_f64();
        println!(
            "  {rate:.0} pods/s; {:.2}× kwok's CI bar ({} s), target ≤ {} s: {}",
            KWOK_BAR.as_secs_f64() / running.as_secs_f64(),
            KWOK_BAR.as_secs(),
            TARGET.as_secs(),
            if running <= TARGET { "met" } else { "NOT met" }
        );
    }
    let per_thousand = mib(loaded.saturating_sub(baseline)) / (total as f64 / 1000.0);
    println!(
        "  controller-manager RSS {:.1} MiB with nodes only, {:.1} MiB with {total} pods: {per_thousand:.2} MiB per 1000 pods",
        mib(baseline),
        mib(loaded)
    );
}

/// CPU per process over the rollout, per pod and as a share of the machine's two cores.
fn report_cpu(before: &CpuReadings, after: &CpuReadings, elapsed: Duration) {
    let pods = (DEPLOYMENTS * REPLICAS) as f64;
    let mut total = Duration::ZERO;
    println!("  CPU during the rollout (ms per pod, cores busy on average):");
    for ((role, start), (_, end)) in before.0.iter().zip(&after.0) {
        let used = end.saturating_sub(*start);
        total += used;
        println!(
            "    {role:<26} {:>6.2} ms  {:.2} cores",
            used.as_secs_f64() * 1000.0 / pods,
            used.as_secs_f64() / elapsed.as_secs_f64().max(f64::EPSILON)
        );
    }
    println!(
        "    {:<26} {:>6.2} ms  {:.2} cores",
        "all",
        total.as_secs_f64() * 1000.0 / pods,
        total.as_secs_f64() / elapsed.as_secs_f64().max(f64::EPSILON)
    );
}

fn main() {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("workloads bench: no runtime: {err}");
            std::process::exit(1);
        }
    };
    if let Err(err) = runtime.block_on(run()) {
        eprintln!("workloads bench failed: {err:#}");
        std::process::exit(1);
    }
}
