//! Scheduler throughput benchmark: `cargo bench -p flotilla-scheduler --bench throughput`.
//!
//! Mirrors upstream's scheduler_perf `SchedulingBasic` at 5000 nodes / 10 000 pods (each pod
//! requests 100m CPU and 500Mi, each node offers 4 CPUs, 32Gi and 110 pods). The real API
//! server is the `flotilla` binary (`FLOTILLA_BIN`, else `flotilla` beside this bench in the
//! target directory; build it with `cargo build --release -p flotilla`), started with
//! `flotilla up --external-control-loops` so that it runs no scheduler of its own. The bench
//! creates the nodes and pending pods through the API, then runs
//! `flotilla_scheduler::run` in this process and measures, through a watch of bound pods,
//! how long it takes until all 10 000 are bound through `pods/binding`.
//!
//! It prints pods/s (from the scheduler's start, and from its first binding, i.e. without the
//! initial list of 10 000 pods) and the ratio to upstream's CI floor for this test (270 pods/s)
//! and to the target (1000 pods/s). It never asserts; it gives up after 10 minutes.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher::{self, Event};
use serde_json::json;

const NODES: usize = 5000;
const PODS: usize = 10_000;
const ZONES: usize = 10;
/// Concurrent creates while setting up.
const CREATE_CONCURRENCY: usize = 64;
/// Upstream's CI floor for SchedulingBasic 5000 nodes / 10 000 pods, and our target.
const ANCHOR: f64 = 270.0;
const TARGET: f64 = 1000.0;
const GIVE_UP: Duration = Duration::from_secs(600);

/// A child process killed on drop.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn flotilla_bin() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("FLOTILLA_BIN") {
        return Ok(PathBuf::from(path));
    }
    // target/<profile>/deps/throughput-… → target/<profile>/flotilla, else the other profile.
    let exe = std::env::current_exe()?;
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .context("no target directory")?;
    let target_dir = profile_dir.parent().context("no target directory")?;
    for candidate in [
        profile_dir.join("flotilla"),
        target_dir.join("release/flotilla"),
        target_dir.join("debug/flotilla"),
    ] {
        if candidate.exists() {
            return Ok(candidate);
        }
    }
    bail!("no flotilla binary: run `cargo build --release -p flotilla` or set FLOTILLA_BIN")
}

fn node(index: usize) -> Node {
    let name = format!("node-{index}");
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name,
            "topology.kubernetes.io/zone": format!("zone-{}", index % ZONES),
        }},
        "status": {
            "allocatable": {"cpu": "4", "memory": "32Gi", "pods": "110"},
            "capacity": {"cpu": "4", "memory": "32Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }))
    .expect("node literal")
}

fn pod(index: usize) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("pod-{index}"), "namespace": "default"},
        "spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": "100m", "memory": "500Mi"}}}]},
    }))
    .expect("pod literal")
}

async fn create_all<K, F>(api: Api<K>, count: usize, make: F) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
    F: Fn(usize) -> K,
{
    futures::stream::iter((0..count).map(|i| {
        let api = api.clone();
        let object = make(i);
        async move {
            api.create(&PostParams::default(), &object)
                .await
                .map(|_| ())
        }
    }))
    .buffer_unordered(CREATE_CONCURRENCY)
    .try_collect::<Vec<()>>()
    .await?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench())
}

async fn bench() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let binary = flotilla_bin()?;
    let mut child = Command::new(&binary)
        .args([
            "up",
            "--listen",
            "127.0.0.1:0",
            "--external-control-loops",
            "--data-dir",
        ])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let stdout = child.stdout.take().context("no stdout")?;
    let _server = Process(child);
    // `flotilla up` prints the kubeconfig's path once it serves.
    let kubeconfig_path = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .next()
            .transpose()
            .map(|l| l.map(PathBuf::from))
    })
    .await??
    .context("flotilla up printed nothing")?;
    let kubeconfig = Kubeconfig::read_from(&kubeconfig_path)?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let client = kube::Client::try_from(config)?;

    let setup = Instant::now();
    create_all(Api::<Node>::all(client.clone()), NODES, node).await?;
    println!(
        "{NODES} nodes created in {:.1}s",
        setup.elapsed().as_secs_f64()
    );
    let created = Instant::now();
    create_all(Api::<Pod>::namespaced(client.clone(), "default"), PODS, pod).await?;
    println!(
        "{PODS} pending pods created in {:.1}s",
        created.elapsed().as_secs_f64()
    );

    // Watch bound pods only; count each once.
    let bound_watch = watcher::watcher(
        Api::<Pod>::namespaced(client.clone(), "default"),
        watcher::Config::default().fields("spec.nodeName!="),
    );
    let mut bound_watch = bound_watch.boxed();
    let mut placements: HashMap<String, String> = HashMap::new();
    // Wait for the watch's (empty) initial list before starting the clock.
    loop {
        match bound_watch.next().await {
            Some(Ok(Event::InitDone)) => break,
            Some(Ok(_)) => {}
            Some(Err(err)) => bail!("watching pods: {err}"),
            None => bail!("watch ended"),
        }
    }

    let start = Instant::now();
    let scheduler = tokio::spawn(flotilla_scheduler::run(client.clone()));
    let mut first_bound: Option<Instant> = None;
    let mut last_report = Instant::now();
    while placements.len() < PODS {
        let next = tokio::time::timeout(Duration::from_secs(10), bound_watch.next()).await;
        match next {
            Ok(Some(Ok(Event::Apply(pod) | Event::InitApply(pod)))) => {
                if let (Some(name), Some(node)) = (
                    pod.metadata.name.clone(),
                    pod.spec.as_ref().and_then(|s| s.node_name.clone()),
                ) {
                    first_bound.get_or_insert_with(Instant::now);
                    placements.insert(name, node);
                }
            }
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(err))) => eprintln!("watch error (retrying): {err}"),
            Ok(None) => bail!("watch ended"),
            Err(_) => {}
        }
        if last_report.elapsed() >= Duration::from_secs(5) {
            last_report = Instant::now();
            println!(
                "  {} pods bound after {:.1}s",
                placements.len(),
                start.elapsed().as_secs_f64()
            );
        }
        if start.elapsed() > GIVE_UP {
            scheduler.abort();
            bail!(
                "gave up: {} of {PODS} pods bound after {:?}",
                placements.len(),
                GIVE_UP
            );
        }
    }
    let elapsed = start.elapsed();
    let since_first = first_bound.map_or(elapsed, |t| t.elapsed());
    scheduler.abort();

    let mut per_node: HashMap<&str, usize> = HashMap::new();
    for node in placements.values() {
        *per_node.entry(node).or_default() += 1;
    }
    let max_per_node = per_node.values().copied().max().unwrap_or(0);
    let overall = PODS as f64 / elapsed.as_secs_f64();
    let steady = PODS as f64 / since_first.as_secs_f64();
    println!(
        "scheduled {PODS} pods on {NODES} nodes in {:.2}s: {overall:.0} pods/s \
         ({steady:.0} pods/s from the first binding, after the initial sync)",
        elapsed.as_secs_f64()
    );
    println!(
        "  ratio to upstream's CI floor ({ANCHOR} pods/s): {:.2}×; to the target ({TARGET} pods/s): {:.2}×",
        overall / ANCHOR,
        overall / TARGET
    );
    println!(
        "  {} nodes used, at most {max_per_node} pods on one node",
        per_node.len()
    );
    Ok(())
}
