//! Admission benchmark: `cargo bench -p flotilla-apiserver --bench admission`.
//!
//! An in-process [`ApiServer`] on the embedded store serves the `demo` tenant over TLS on
//! 127.0.0.1 and the kube-rs client drives it, as in the `api` bench. Measured side by side in
//! one run, never asserted:
//!
//! - pod create, one client, with the admission chain off (the reference), on in a plain
//!   namespace, and on in a namespace where every plugin has work (a LimitRange defaulting the
//!   pod, a ResourceQuota charging it, `restricted` Pod Security enforced and warned),
//!   interleaved create by create: µs per create and the cost of the chain over the reference;
//! - quota contention: 100 writers creating ConfigMaps into one namespace whose quota counts
//!   them (every create is a compare-and-swap on the same quota), against the same writers in
//!   a namespace without a quota: creates/s and the ratio.

mod support;
use support::percentile;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use flotilla_apiserver::local::LocalServer;
use flotilla_storage::EmbeddedStorage;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DynamicObject, PostParams};

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Pod creates per case, one client.
const POD_CREATES: usize = 1000;
/// Writers of the contention case.
const WRITERS: usize = 100;
/// Length of each contention case.
const CONTENTION_RUN: Duration = Duration::from_secs(4);

const NAMESPACES: &str = r#"
{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "plain"}}
{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "busy", "labels": {
  "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted"}}}
{"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "defaults", "namespace": "busy"},
 "spec": {"limits": [{"type": "Container", "default": {"cpu": "200m", "memory": "64Mi"},
   "defaultRequest": {"cpu": "100m", "memory": "32Mi"}, "max": {"cpu": "2"}}]}}
{"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "compute", "namespace": "busy"},
 "spec": {"hard": {"pods": "100000", "requests.cpu": "100000", "limits.memory": "1000Gi"}}}
{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "open"}}
{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "counted"}}
{"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "objects", "namespace": "counted"},
 "spec": {"hard": {"configmaps": "1000000"}}}
"#;

fn pod(name: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "c", "image": "nginx:1.27",
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}],
        },
    }))?)
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The three cases' latencies, interleaved create by create so that the store's own drift
/// (compactions, page cache) falls on all of them alike: chain off in the plain namespace,
/// chain on there, chain on in the busy one. Each: mean, p50, p99.
async fn pod_creates(
    client: &kube::Client,
    chain: &flotilla_apiserver::admission::Chain,
    tag: &str,
) -> anyhow::Result<[[Duration; 3]; 3]> {
    let cases = [("plain", false), ("plain", true), ("busy", true)];
    let mut latencies: [Vec<Duration>; 3] = Default::default();
    for i in 0..POD_CREATES {
        for (case, (namespace, enabled)) in cases.iter().enumerate() {
            let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
            chain.set_enabled(*enabled);
            let name = format!("{tag}-{case}-{i}");
            let body = pod(&name)?;
            let began = Instant::now();
            pods.create(&PostParams::default(), &body)
                .await
                .with_context(|| format!("create pod {name} in {namespace}"))?;
            latencies[case].push(began.elapsed());
        }
    }
    chain.set_enabled(true);
    Ok(latencies.map(|mut case| {
        let mean = case.iter().sum::<Duration>() / case.len().max(1) as u32;
        case.sort_unstable();
        [mean, percentile(&case, 0.5), percentile(&case, 0.99)]
    }))
}

/// `WRITERS` clients creating ConfigMaps named `tag-…` into `namespace` for `CONTENTION_RUN`:
/// creates/s.
async fn contention(client: &kube::Client, namespace: &str, tag: &str) -> anyhow::Result<f64> {
    let deadline = Instant::now() + CONTENTION_RUN;
    let started = Instant::now();
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let tag = tag.to_string();
        writers.push(tokio::spawn(async move {
            let mut done = 0usize;
            while Instant::now() < deadline {
                let mut map = ConfigMap::default();
                map.metadata.name = Some(format!("{tag}-{writer}-{done}"));
                api.create(&PostParams::default(), &map).await?;
                done += 1;
            }
            anyhow::Ok(done)
        }));
    }
    let mut total = 0;
    for writer in writers {
        total += writer.await.context("writer panicked")??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

async fn run() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let storage = Arc::new(EmbeddedStorage::open(dir.path().join("store.redb"))?);
    let local = LocalServer::start(storage, "demo").await?;
    let client = support::client(&local).await?;
    for line in serde_json::Deserializer::from_str(NAMESPACES).into_iter::<serde_json::Value>() {
        let object: DynamicObject = serde_json::from_value(line?)?;
        let kind = object
            .types
            .as_ref()
            .map(|t| t.kind.clone())
            .unwrap_or_default();
        let plural = match kind.as_str() {
            "Namespace" => "namespaces",
            "LimitRange" => "limitranges",
            _ => "resourcequotas",
        };
        let resource = kube::api::ApiResource {
            group: String::new(),
            version: "v1".into(),
            api_version: "v1".into(),
            kind: kind.clone(),
            plural: plural.into(),
        };
        let api: Api<DynamicObject> = match object.metadata.namespace.as_deref() {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        api.create(&PostParams::default(), &object)
            .await
            .with_context(|| format!("create {kind}"))?;
    }
    // No controller runs here: the quotas' usage is set as the controller would count it.
    for (namespace, name, used) in [
        (
            "busy",
            "compute",
            serde_json::json!({"pods": "0", "requests.cpu": "0", "limits.memory": "0"}),
        ),
        ("counted", "objects", serde_json::json!({"configmaps": "0"})),
    ] {
        let quotas: Api<k8s_openapi::api::core::v1::ResourceQuota> =
            Api::namespaced(client.clone(), namespace);
        let mut quota = quotas.get(name).await?;
        quota.status = Some(serde_json::from_value(serde_json::json!({
            "hard": quota.spec.as_ref().and_then(|s| s.hard.clone()), "used": used}))?);
        quotas
            .replace_status(name, &PostParams::default(), &quota)
            .await?;
    }

    let chain = local.server.admission();
    println!("admission chain: {}", chain.names().join(", "));
    pod_creates(&client, chain, "warm").await?;
    let [off, plain, busy] = pod_creates(&client, chain, "run").await?;

    println!("\npod create, one client, {POD_CREATES} each, interleaved (µs: mean / p50 / p99)");
    let row = |name: &str, [mean, p50, p99]: [Duration; 3]| {
        println!(
            "  {name:<44} {:>8.0} / {:>8.0} / {:>8.0}   {:+.0} µs per create over chain off ({:.2}×)",
            micros(mean),
            micros(p50),
            micros(p99),
            micros(mean) - micros(off[0]),
            mean.as_secs_f64() / off[0].as_secs_f64(),
        );
    };
    row("chain off (reference)", off);
    row("chain on, plain namespace", plain);
    row("chain on, LimitRange + quota + restricted PSS", busy);

    contention(&client, "open", "warm").await?;
    let open = contention(&client, "open", "run").await?;
    let counted = contention(&client, "counted", "run").await?;
    println!("\nquota contention, {WRITERS} writers, ConfigMap creates for {CONTENTION_RUN:?}");
    println!("  without a quota (reference)  {open:>8.0}/s");
    println!(
        "  one quota counting them      {counted:>8.0}/s   {:.2}× of the reference",
        counted / open
    );
    local.stop().abort();
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run())
}
