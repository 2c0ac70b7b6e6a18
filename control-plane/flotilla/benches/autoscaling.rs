//! Autoscaling benchmark: `cargo bench -p flotilla --bench autoscaling`.
//!
//! The cost of 1000 HorizontalPodAutoscalers in one cluster: `flotilla up` with
//! `--external-control-loops` and `flotilla controller-manager` as its own process, 1000
//! Deployments of one replica each (no nodes: their pods stay Pending, so every HPA finds no
//! metrics, the path of a cluster without usable metrics — each sync still reads the scale,
//! the pods and `metrics.k8s.io`, and writes its condition and Event). Measured side by side in
//! one run:
//!
//! - **create → first decision**: from each HPA's create to its first status (the
//!   controller's first sync of it), p50 and p99 over the 1000 created at once;
//! - **CPU and memory**: the controller-manager's and the API server's CPU over three sync
//!   periods (45 s) and the controller-manager's resident memory, with the 1000 Deployments
//!   alone (the reference) and then with an HPA on each;
//! - **Events**: how many the HPAs left after one and after three sync periods (a repeated
//!   event is counted on one Event, not written anew every 15 s).
//!
//! It prints figures and ratios; it never asserts.

#[path = "support/proc.rs"]
mod proc;
#[path = "support/service.rs"]
mod service;

use service::{Process, client, spawn, start_up};

use std::collections::HashMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::bail;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher::{self, Event};
use serde_json::json;

/// HPAs (and Deployments).
const COUNT: usize = 1000;
/// Upstream's sync period: what the CPU is measured over, three times.
const SYNC_PERIOD: Duration = Duration::from_secs(15);
/// Creates in flight at once.
const CONCURRENCY: usize = 32;

fn deployment(index: usize) -> anyhow::Result<Deployment> {
    let name = format!("app-{index}");
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "100m", "memory": "16Mi"}}}]},
            },
        },
    }))?)
}

fn autoscaler(index: usize) -> anyhow::Result<HorizontalPodAutoscaler> {
    let name = format!("app-{index}");
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": 1, "maxReplicas": 3,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                "target": {"type": "Utilization", "averageUtilization": 50}}}],
        },
    }))?)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(index).copied().unwrap_or_default()
}

/// CPU cores each process used over `period`, and the controller-manager's memory after it.
async fn measure(service: &Process, controllers: &Process, period: Duration) -> (f64, f64, u64) {
    let (api_before, cm_before) = (service.cpu(), controllers.cpu());
    tokio::time::sleep(period).await;
    let cores = |before: Duration, after: Duration| {
        after.saturating_sub(before).as_secs_f64() / period.as_secs_f64()
    };
    (
        cores(api_before, service.cpu()),
        cores(cm_before, controllers.cpu()),
        controllers.rss().unwrap_or(0),
    )
}

async fn hpa_events(client: &kube::Client) -> anyhow::Result<usize> {
    let events: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let params = ListParams::default().fields("involvedObject.kind=HorizontalPodAutoscaler");
    Ok(events.list(&params).await?.items.len())
}

async fn run() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (service, kubeconfig) = start_up(
        dir.path(),
        &["--external-control-loops", "--nodes", "0"],
        Stdio::null(),
    )?;
    let client = client(&kubeconfig).await?;
    let controllers = spawn(&["controller-manager", "--kubeconfig", &kubeconfig])?;

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    futures::stream::iter(0..COUNT)
        .map(|index| {
            let deployments = deployments.clone();
            async move {
                deployments
                    .create(&PostParams::default(), &deployment(index)?)
                    .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(300);
    while pods.list(&ListParams::default()).await?.items.len() < COUNT {
        if Instant::now() > deadline {
            bail!("the {COUNT} Deployments' pods were not created");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (api_ref, cm_ref, rss_ref) = measure(&service, &controllers, SYNC_PERIOD * 3).await;

    // Every HPA's first status, by a watch established before the first create.
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), "default");
    let mut watch = watcher::watcher(hpas.clone(), watcher::Config::default()).boxed();
    while let Some(event) = watch.next().await {
        if matches!(event, Ok(Event::InitDone)) {
            break;
        }
    }
    let created_at = std::sync::Arc::new(std::sync::Mutex::new(HashMap::new()));
    let started = Instant::now();
    let creating = {
        let created_at = created_at.clone();
        let hpas = hpas.clone();
        async move {
            futures::stream::iter(0..COUNT)
                .map(|index| {
                    let hpas = hpas.clone();
                    let created_at = created_at.clone();
                    async move {
                        let at = Instant::now();
                        hpas.create(&PostParams::default(), &autoscaler(index)?)
                            .await?;
                        if let Ok(mut created) = created_at.lock() {
                            created.insert(format!("app-{index}"), at);
                        }
                        anyhow::Ok(())
                    }
                })
                .buffer_unordered(CONCURRENCY)
                .try_collect::<Vec<()>>()
                .await
        }
    };
    let deciding = async {
        let mut decided: HashMap<String, Instant> = HashMap::new();
        while decided.len() < COUNT {
            let Some(event) = watch.next().await else {
                break;
            };
            let hpa = match event {
                Ok(Event::Apply(hpa)) | Ok(Event::InitApply(hpa)) => hpa,
                _ => continue,
            };
            let has_status = hpa
                .status
                .as_ref()
                .is_some_and(|s| s.conditions.as_ref().is_some_and(|c| !c.is_empty()));
            if has_status && let Some(name) = hpa.metadata.name {
                decided.entry(name).or_insert_with(Instant::now);
            }
            if started.elapsed() > Duration::from_secs(300) {
                break;
            }
        }
        decided
    };
    let (created, decided) = tokio::join!(creating, deciding);
    created?;
    let all_created = started.elapsed();
    let created_at = created_at.lock().map(|c| c.clone()).unwrap_or_default();
    let mut latencies: Vec<Duration> = decided
        .iter()
        .filter_map(|(name, at)| Some(at.saturating_duration_since(*created_at.get(name)?)))
        .collect();
    latencies.sort();
    let first_events = hpa_events(&client).await?;
    let (api_hpa, cm_hpa, rss_hpa) = measure(&service, &controllers, SYNC_PERIOD * 3).await;
    let later_events = hpa_events(&client).await?;

    println!(
        "autoscaling: {COUNT} HPAs over {COUNT} one-replica Deployments (no metrics: pods Pending)"
    );
    println!(
        "  created in {:.1} s; create → first status: p50 {:.0} ms, p99 {:.0} ms ({} of {COUNT} seen)",
        all_created.as_secs_f64(),
        percentile(&latencies, 0.5).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
        latencies.len()
    );
    println!(
        "  controller-manager CPU: {cm_hpa:.3} cores with the HPAs (reference without: {cm_ref:.3}); API server {api_hpa:.3} cores (reference: {api_ref:.3})"
    );
    println!(
        "  controller-manager memory: {:.1} MiB with the HPAs (reference: {:.1} MiB): {:.1} KiB per HPA",
        mib(rss_hpa),
        mib(rss_ref),
        rss_hpa.saturating_sub(rss_ref) as f64 / 1024.0 / COUNT as f64
    );
    println!(
        "  syncs: {:.1}/s expected ({COUNT} every {} s); per sync {:.0} µs of controller-manager CPU and {:.0} µs of the API server's over the reference",
        COUNT as f64 / SYNC_PERIOD.as_secs_f64(),
        SYNC_PERIOD.as_secs(),
        (cm_hpa - cm_ref).max(0.0) / (COUNT as f64 / SYNC_PERIOD.as_secs_f64()) * 1e6,
        (api_hpa - api_ref).max(0.0) / (COUNT as f64 / SYNC_PERIOD.as_secs_f64()) * 1e6,
    );
    println!(
        "  HPA events: {first_events} after the first syncs, {later_events} three sync periods later"
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let outcome = runtime.block_on(run());
    println!(
        "autoscaling bench: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    outcome
}
