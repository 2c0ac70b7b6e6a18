//! `metrics.k8s.io/v1beta1` (NodeMetrics, PodMetrics), served natively as metrics-server
//! serves it behind its APIService: each node's usage read from its kubelet's summary API
//! (`/stats/summary`, whose CPU rates the kubelet computes over its housekeeping interval).
//! Nodes are read when a request asks — no cluster is scraped on a timer, so an idle one
//! costs nothing — and a node's summary is reused for [`FRESH_FOR`], so that a cluster's
//! autoscalers and `kubectl top` asking together read each kubelet once. As metrics-server,
//! a pod or node without metrics is left out of a list, and named alone is NotFound.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::ApiServer;
use crate::error::ApiError;
use crate::meta;
use crate::resources::{ResourceInfo, Strategy};
use crate::selection::Selection;
use crate::store::ListOptions;
use crate::table::{Column, name_column};
use crate::tenants::TenantState;

/// How long a node's summary is reused (metrics-server's default resolution is 15 s; the
/// kubelet's samples move every 10 s).
pub const FRESH_FOR: Duration = Duration::from_secs(5);
/// How long one kubelet may take to answer (metrics-server's `--kubelet-request-timeout`).
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);
/// The interval the kubelet's CPU rates are over (its housekeeping interval): the metrics'
/// `window`.
pub const WINDOW: &str = "10s";

/// Each node's last summary, for one tenant (empty until its metrics are first asked for).
#[derive(Default)]
pub struct Summaries {
    by_node: Mutex<HashMap<String, (Instant, Arc<Value>)>>,
}

impl Summaries {
    fn fresh(&self, node: &str) -> Option<Arc<Value>> {
        let by_node = self.by_node.lock().ok()?;
        let (at, summary) = by_node.get(node)?;
        (at.elapsed() < FRESH_FOR).then(|| summary.clone())
    }

    fn remember(&self, node: &str, summary: Arc<Value>) {
        if let Ok(mut by_node) = self.by_node.lock() {
            by_node.retain(|_, (at, _)| at.elapsed() < FRESH_FOR);
            by_node.insert(node.to_string(), (Instant::now(), summary));
        }
    }
}

/// The summary of `node` from its kubelet (or the one read within [`FRESH_FOR`]); `None`
/// when the kubelet cannot be read (as metrics-server, the node is then left out).
async fn summary(server: &ApiServer, state: &TenantState, node: &Value) -> Option<Arc<Value>> {
    let name = meta::name(node);
    if let Some(summary) = state.node_summaries.fresh(name) {
        return Some(summary);
    }
    let body = crate::kubelet::kubelet_get(server, state, node, "/stats/summary", SCRAPE_TIMEOUT)
        .await
        .ok()?;
    let summary: Value = serde_json::from_slice(&body).ok()?;
    let summary = Arc::new(summary);
    state.node_summaries.remember(name, summary.clone());
    Some(summary)
}

/// The summaries of `nodes`, read together.
async fn summaries(
    server: &ApiServer,
    state: &TenantState,
    nodes: &[Value],
) -> HashMap<String, Arc<Value>> {
    let reads = nodes.iter().map(|node| async move {
        let summary = summary(server, state, node).await?;
        Some((meta::name(node).to_string(), summary))
    });
    futures::future::join_all(reads)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// A CPU rate in nanocores as Go's `Quantity` writes it canonically (`250m`, `1500u`,
/// `12345n`, `2`).
pub fn cpu_quantity(nano_cores: u64) -> String {
    match nano_cores {
        0 => "0".into(),
        n if n % 1_000_000_000 == 0 => format!("{}", n / 1_000_000_000),
        n if n % 1_000_000 == 0 => format!("{}m", n / 1_000_000),
        n if n % 1_000 == 0 => format!("{}u", n / 1_000),
        n => format!("{n}n"),
    }
}

/// Bytes as metrics-server writes them (a binary-SI `Quantity`: `Ki` when whole).
pub fn memory_quantity(bytes: u64) -> String {
    let mut value = bytes;
    for suffix in ["", "Ki", "Mi", "Gi", "Ti", "Pi"] {
        if value == 0 || !value.is_multiple_of(1024) || suffix == "Pi" {
            return format!("{value}{suffix}");
        }
        value /= 1024;
    }
    format!("{value}Ei")
}

/// `{cpu, memory}` of a summary's `cpu` and `memory` objects, when both are there.
fn usage(cpu: &Value, memory: &Value) -> Option<Value> {
    let nano_cores = cpu["usageNanoCores"].as_u64()?;
    let working_set = memory["workingSetBytes"].as_u64()?;
    Some(json!({"cpu": cpu_quantity(nano_cores), "memory": memory_quantity(working_set)}))
}

/// The metrics' `metadata`: the object's name, namespace and labels, created now (as
/// metrics-server writes it).
fn metadata(object: &Value, now: &str) -> Value {
    let mut metadata = json!({"name": meta::name(object)});
    if let Some(namespace) = object["metadata"]["namespace"].as_str() {
        metadata["namespace"] = json!(namespace);
    }
    metadata["creationTimestamp"] = json!(now);
    if let Some(labels) = object["metadata"].get("labels") {
        metadata["labels"] = labels.clone();
    }
    metadata
}

/// `NodeMetrics` of `node` from its kubelet's summary.
pub fn node_metrics(node: &Value, summary: &Value, now: &str) -> Option<Value> {
    let usage = usage(&summary["node"]["cpu"], &summary["node"]["memory"])?;
    Some(json!({
        "kind": "NodeMetrics", "apiVersion": "metrics.k8s.io/v1beta1",
        "metadata": metadata(node, now),
        "timestamp": summary["node"]["cpu"]["time"],
        "window": WINDOW,
        "usage": usage,
    }))
}

/// `PodMetrics` of `pod` from its node's summary: every container of the summary's entry
/// for this pod (by UID), or none when any lacks a CPU rate yet.
pub fn pod_metrics(pod: &Value, summary: &Value, now: &str) -> Option<Value> {
    let uid = pod["metadata"]["uid"].as_str()?;
    let entry = summary["pods"]
        .as_array()?
        .iter()
        .find(|entry| entry["podRef"]["uid"] == uid)?;
    let containers = entry["containers"]
        .as_array()?
        .iter()
        .map(|c| Some(json!({"name": c["name"], "usage": usage(&c["cpu"], &c["memory"])?})))
        .collect::<Option<Vec<Value>>>()?;
    if containers.is_empty() {
        return None;
    }
    Some(json!({
        "kind": "PodMetrics", "apiVersion": "metrics.k8s.io/v1beta1",
        "metadata": metadata(pod, now),
        "timestamp": entry["cpu"]["time"],
        "window": WINDOW,
        "containers": containers,
    }))
}

/// The NodeMetrics or PodMetrics list, or the one named `name`.
pub async fn answer(
    server: &ApiServer,
    state: &TenantState,
    resource: &ResourceInfo,
    namespace: Option<&str>,
    name: Option<&str>,
    query: &HashMap<String, String>,
) -> Result<Value, ApiError> {
    let pods_kind = resource.kind == "PodMetrics";
    let plural = if pods_kind { "pods" } else { "nodes" };
    let source = server
        .resources
        .find("", "v1", plural)
        .ok_or_else(ApiError::no_such_path)?;
    let selection = Selection::parse(
        query.get("labelSelector").map(String::as_str),
        query.get("fieldSelector").map(String::as_str),
        source,
    )?;
    let objects = match name {
        Some(name) => {
            let object = server
                .store
                .get(
                    &state.tenant,
                    source,
                    namespace.unwrap_or(""),
                    name,
                    crate::store::ReadAt::Latest,
                )
                .await
                .map_err(|_| ApiError::not_found(&resource.group_resource(), name))?;
            vec![object]
        }
        None => {
            let options = ListOptions {
                selection,
                ..ListOptions::default()
            };
            server
                .store
                .list(&state.tenant, source, namespace, &options)
                .await?
                .items
        }
    };
    let nodes = if pods_kind {
        node_objects(server, state, &objects).await?
    } else {
        objects.clone()
    };
    let summaries = summaries(server, state, &nodes).await;
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let items: Vec<Value> = objects
        .iter()
        .filter_map(|object| {
            if pods_kind {
                let node = meta::str_at(object, &["spec", "nodeName"])?;
                pod_metrics(object, summaries.get(node)?, &now)
            } else {
                node_metrics(object, summaries.get(meta::name(object))?, &now)
            }
        })
        .collect();
    match name {
        Some(name) => items
            .into_iter()
            .next()
            .ok_or_else(|| ApiError::not_found(&resource.group_resource(), name)),
        None => Ok(json!({
            "kind": format!("{}List", resource.kind), "apiVersion": "metrics.k8s.io/v1beta1",
            "metadata": {}, "items": items,
        })),
    }
}

/// The Nodes the running `pods` are on.
async fn node_objects(
    server: &ApiServer,
    state: &TenantState,
    pods: &[Value],
) -> Result<Vec<Value>, ApiError> {
    let mut names: Vec<&str> = pods
        .iter()
        .filter(|pod| meta::str_at(pod, &["status", "phase"]) == Some("Running"))
        .filter_map(|pod| meta::str_at(pod, &["spec", "nodeName"]))
        .collect();
    names.sort_unstable();
    names.dedup();
    let nodes = server
        .resources
        .find("", "v1", "nodes")
        .ok_or_else(ApiError::no_such_path)?;
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        if let Ok(node) = server
            .store
            .get(&state.tenant, nodes, "", name, crate::store::ReadAt::Latest)
            .await
        {
            out.push(node);
        }
    }
    Ok(out)
}

/// The kinds' tables (metrics-server's): CPU, memory and window for nodes; window for pods.
pub struct MetricsStrategy;

impl Strategy for MetricsStrategy {
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new("CPU", "string", "CPU usage", |m| m["usage"]["cpu"].clone()),
            Column::new("Memory", "string", "Memory usage", |m| {
                m["usage"]["memory"].clone()
            }),
            Column::new("Window", "string", "Interval the usage is over", |m| {
                m["window"].clone()
            }),
        ]
    }
}

/// OpenAPI's `NodeMetrics` (k8s-metrics' types have no JSON schema): registered under its
/// upstream name, a reference returned.
pub fn node_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schema(generator, "NodeMetrics")
}

/// OpenAPI's `PodMetrics`, as [`node_schema`].
pub fn pod_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schema(generator, "PodMetrics")
}

/// The OpenAPI definition name of a metrics kind.
pub fn definition_name(kind: &str) -> String {
    format!("io.k8s.metrics.pkg.apis.metrics.v1beta1.{kind}")
}

fn schema(generator: &mut schemars::SchemaGenerator, kind: &str) -> schemars::Schema {
    let meta =
        generator.subschema_for::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>();
    let quantity =
        generator.subschema_for::<k8s_openapi::apimachinery::pkg::api::resource::Quantity>();
    let usage = json!({"type": "object", "additionalProperties": quantity});
    let mut properties = json!({
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": meta,
        "timestamp": {"type": "string", "format": "date-time"},
        "window": {"type": "string"},
    });
    let required = if kind == "PodMetrics" {
        properties["containers"] = json!({"type": "array", "items": {"type": "object",
            "properties": {"name": {"type": "string"}, "usage": usage},
            "required": ["name", "usage"]}});
        json!(["timestamp", "window", "containers"])
    } else {
        properties["usage"] = usage;
        json!(["timestamp", "window", "usage"])
    };
    let name = definition_name(kind);
    generator.definitions_mut().insert(
        name.clone(),
        json!({"type": "object", "properties": properties, "required": required,
            "x-kubernetes-group-version-kind": [{"group": "metrics.k8s.io", "version": "v1beta1", "kind": kind}]}),
    );
    let path = generator.settings().definitions_path.to_string();
    let path = path.trim_start_matches('#').trim_end_matches('/');
    schemars::Schema::new_ref(format!("#{path}/{name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary() -> Value {
        json!({
            "node": {"nodeName": "n1",
                "cpu": {"time": "2026-12-07T10:00:00Z", "usageNanoCores": 250_000_000u64, "usageCoreNanoSeconds": 9},
                "memory": {"time": "2026-12-07T10:00:00Z", "workingSetBytes": 1_073_741_824u64}},
            "pods": [
                {"podRef": {"name": "web", "namespace": "shop", "uid": "u1"},
                 "cpu": {"time": "2026-12-07T10:00:01Z", "usageNanoCores": 1_500_000u64},
                 "memory": {"workingSetBytes": 10_485_760u64},
                 "containers": [
                    {"name": "app", "cpu": {"usageNanoCores": 1_000_000u64}, "memory": {"workingSetBytes": 8_388_608u64}},
                    {"name": "sidecar", "cpu": {"usageNanoCores": 500_000u64}, "memory": {"workingSetBytes": 2_097_152u64}}]},
                {"podRef": {"name": "new", "namespace": "shop", "uid": "u2"},
                 "containers": [{"name": "app", "cpu": {"usageCoreNanoSeconds": 5}, "memory": {"workingSetBytes": 1}}]},
            ],
        })
    }

    #[test]
    fn quantities_are_written_canonically() {
        assert_eq!(cpu_quantity(0), "0");
        assert_eq!(cpu_quantity(2_000_000_000), "2");
        assert_eq!(cpu_quantity(250_000_000), "250m");
        assert_eq!(cpu_quantity(1_500_000), "1500u");
        assert_eq!(cpu_quantity(12_345), "12345n");
        assert_eq!(memory_quantity(0), "0");
        assert_eq!(memory_quantity(1000), "1000");
        assert_eq!(memory_quantity(8_388_608), "8Mi");
        assert_eq!(memory_quantity(1_536 * 1024), "1536Ki");
    }

    #[test]
    fn node_metrics_are_the_nodes_usage_over_the_window() {
        let node = json!({"metadata": {"name": "n1", "labels": {"zone": "a"}, "uid": "x"}});
        let metrics = node_metrics(&node, &summary(), "now").expect("metrics");
        assert_eq!(
            metrics["metadata"],
            json!({"name": "n1", "creationTimestamp": "now", "labels": {"zone": "a"}})
        );
        assert_eq!(metrics["usage"], json!({"cpu": "250m", "memory": "1Gi"}));
        assert_eq!(metrics["timestamp"], "2026-12-07T10:00:00Z");
        assert_eq!(metrics["window"], WINDOW);
    }

    #[test]
    fn pod_metrics_list_each_container_and_skip_pods_without_a_rate() {
        let pod = json!({"metadata": {"name": "web", "namespace": "shop", "uid": "u1"}});
        let metrics = pod_metrics(&pod, &summary(), "now").expect("metrics");
        assert_eq!(metrics["metadata"]["namespace"], "shop");
        assert_eq!(
            metrics["containers"],
            json!([{"name": "app", "usage": {"cpu": "1m", "memory": "8Mi"}},
                   {"name": "sidecar", "usage": {"cpu": "500u", "memory": "2Mi"}}])
        );
        let new = json!({"metadata": {"name": "new", "namespace": "shop", "uid": "u2"}});
        assert_eq!(pod_metrics(&new, &summary(), "now"), None);
        let elsewhere = json!({"metadata": {"name": "web", "namespace": "shop", "uid": "other"}});
        assert_eq!(pod_metrics(&elsewhere, &summary(), "now"), None);
    }
}
