//! A look into a cluster through its own Kubernetes API (with a short-lived admin token the
//! management API issues to the signed-in account): nodes with conditions and capacity,
//! namespaces, Deployments, Pods (live), Services with their load balancers, recent Events.

use std::collections::HashMap;

use axum::Router;
use axum::extract::{Path, Query};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use http::Method;
use maud::{Markup, html};

use crate::clusters::cluster_tabs;
use crate::layout::{Listing, PAGE_SIZE, Section, page, pager, status, time};
use crate::upstream::{Upstream, UpstreamError, segment};
use crate::{Console, Signed};

pub(crate) fn routes() -> Router<std::sync::Arc<Console>> {
    Router::new().route("/console/clusters/{name}/workloads", get(workloads))
}

/// Where a cluster's tenant API is (`/clusters/{id}`) and a token for it.
#[derive(Clone)]
pub(crate) struct Tenant {
    /// The tenant API's path prefix.
    pub prefix: String,
    /// A short-lived admin bearer token.
    pub token: String,
}

/// The tenant of cluster `name`, as the signed-in account may reach it.
pub(crate) async fn tenant(upstream: &Upstream<'_>, name: &str) -> Result<Tenant, UpstreamError> {
    let path = format!("/v1/clusters/{}", segment(name));
    let cluster = upstream.get(&path).await?;
    let endpoint = cluster["cluster"]["endpoint"].as_str().unwrap_or_default();
    let prefix = endpoint
        .find("/clusters/")
        .map(|at| endpoint[at..].to_string())
        .ok_or_else(|| UpstreamError {
            status: http::StatusCode::CONFLICT,
            message: format!("cluster {name} has no API endpoint yet"),
        })?;
    let token = upstream
        .call(Method::POST, &format!("{path}/token"), None)
        .await?;
    Ok(Tenant {
        prefix,
        token: token["token"].as_str().unwrap_or_default().to_string(),
    })
}

/// `items` of a list at `path` of the tenant API.
pub(crate) async fn items(
    upstream: &Upstream<'_>,
    tenant: &Tenant,
    path: &str,
) -> Result<Vec<serde_json::Value>, UpstreamError> {
    let answer = upstream
        .with_bearer(&tenant.token)
        .get(&format!("{}{path}", tenant.prefix))
        .await?;
    Ok(answer["items"].as_array().cloned().unwrap_or_default())
}

fn text<'a>(value: &'a serde_json::Value, pointer: &str) -> &'a str {
    value
        .pointer(pointer)
        .and_then(|v| v.as_str())
        .unwrap_or_default()
}

/// The element id of a pod's row.
pub(crate) fn pod_row_id(pod: &serde_json::Value) -> String {
    format!(
        "pod-{}-{}",
        text(pod, "/metadata/namespace"),
        text(pod, "/metadata/name")
    )
}

/// One pod's row.
pub(crate) fn pod_row(pod: &serde_json::Value) -> Markup {
    let restarts: u64 = pod["status"]["containerStatuses"]
        .as_array()
        .map(|s| s.iter().filter_map(|c| c["restartCount"].as_u64()).sum())
        .unwrap_or(0);
    let phase = if pod["metadata"]["deletionTimestamp"].is_string() {
        "Terminating"
    } else {
        text(pod, "/status/phase")
    };
    html! {
        tr id=(pod_row_id(pod)) {
            td { (text(pod, "/metadata/namespace")) }
            td { (text(pod, "/metadata/name")) }
            td { (status(if phase.is_empty() { "Pending" } else { phase })) }
            td { (restarts) }
            td { (text(pod, "/spec/nodeName")) }
            td.hide-narrow { (text(pod, "/status/podIP")) }
        }
    }
}

fn condition(node: &serde_json::Value, kind: &str) -> String {
    node["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == kind))
        .and_then(|c| c["status"].as_str())
        .unwrap_or("Unknown")
        .to_string()
}

fn nodes_table(nodes: &[serde_json::Value], pods: &[serde_json::Value]) -> Markup {
    html! {
        h2 { "Nodes" }
        div.scroll { table {
            thead { tr { th scope="col" { "Name" } th scope="col" { "Ready" } th scope="col" { "Pressure" } th scope="col" { "CPU" } th scope="col" { "Memory" } th scope="col" { "Pods" } } }
            tbody #nodes {
                @for node in nodes {
                    @let name = text(node, "/metadata/name");
                    @let pressure: Vec<&str> = ["MemoryPressure", "DiskPressure", "PIDPressure"].into_iter().filter(|k| condition(node, k) == "True").collect();
                    tr {
                        td { (name) }
                        td { (status(&condition(node, "Ready"))) }
                        td { @if pressure.is_empty() { span.muted { "none" } } @else { span.error { (pressure.join(", ")) } } }
                        td { (text(node, "/status/capacity/cpu")) }
                        td { (text(node, "/status/capacity/memory")) }
                        td { (pods.iter().filter(|p| text(p, "/spec/nodeName") == name).count()) " / " (text(node, "/status/capacity/pods")) }
                    }
                }
                @if nodes.is_empty() { tr { td colspan="6" .muted { "No nodes have joined." } } }
            }
        } }
    }
}

/// Page `listing.page` of `pods` (sorted by namespace and name, as the API lists them).
pub(crate) fn pod_page<'a>(
    pods: &'a [serde_json::Value],
    listing: &Listing,
) -> &'a [serde_json::Value] {
    let start = ((listing.page - 1) * PAGE_SIZE).min(pods.len());
    &pods[start..(start + PAGE_SIZE).min(pods.len())]
}

async fn workloads(
    signed: Signed,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let listing = Listing::from_query(&query);
    let upstream = signed.upstream();
    let tenant = match tenant(&upstream, &name).await {
        Ok(tenant) => tenant,
        Err(err) => return signed.failed(&err),
    };
    let (nodes, namespaces, deployments, pods, services, events) = tokio::join!(
        items(&upstream, &tenant, "/api/v1/nodes"),
        items(&upstream, &tenant, "/api/v1/namespaces"),
        items(&upstream, &tenant, "/apis/apps/v1/deployments"),
        items(&upstream, &tenant, "/api/v1/pods"),
        items(&upstream, &tenant, "/api/v1/services"),
        items(&upstream, &tenant, "/api/v1/events?limit=500"),
    );
    let (nodes, namespaces, deployments, pods, services, mut events) =
        match (nodes, namespaces, deployments, pods, services, events) {
            (Ok(a), Ok(b), Ok(c), Ok(d), Ok(e), Ok(f)) => (a, b, c, d, e, f),
            (Err(err), ..)
            | (_, Err(err), ..)
            | (_, _, Err(err), ..)
            | (_, _, _, Err(err), ..)
            | (_, _, _, _, Err(err), _)
            | (.., Err(err)) => {
                return signed.failed(&err);
            }
        };
    let event_time = |e: &serde_json::Value| {
        [
            text(e, "/lastTimestamp"),
            text(e, "/eventTime"),
            text(e, "/metadata/creationTimestamp"),
        ]
        .into_iter()
        .find(|t| !t.is_empty())
        .unwrap_or_default()
        .to_string()
    };
    events.sort_by_key(|e| std::cmp::Reverse(event_time(e)));
    events.truncate(20);
    let body = html! {
        h1 { "Cluster " (name) }
        (cluster_tabs(&name, "workloads"))
        (nodes_table(&nodes, &pods))
        h2 { "Namespaces" }
        p { @for (i, ns) in namespaces.iter().enumerate() { @if i > 0 { ", " } (text(ns, "/metadata/name")) } }
        h2 { "Deployments" }
        div.scroll { table {
            thead { tr { th scope="col" { "Namespace" } th scope="col" { "Name" } th scope="col" { "Ready / desired" } th scope="col" { "Up to date" } } }
            tbody #deployments {
                @for d in &deployments {
                    tr {
                        td { (text(d, "/metadata/namespace")) } td { (text(d, "/metadata/name")) }
                        td { (d["status"]["readyReplicas"].as_u64().unwrap_or(0)) " / " (d["spec"]["replicas"].as_u64().unwrap_or(1)) }
                        td { (d["status"]["updatedReplicas"].as_u64().unwrap_or(0)) }
                    }
                }
                @if deployments.is_empty() { tr { td colspan="4" .muted { "No Deployments." } } }
            }
        } }
        h2 { "Pods" }
        div.scroll { table {
            thead { tr { th scope="col" { "Namespace" } th scope="col" { "Name" } th scope="col" { "Phase" } th scope="col" { "Restarts" } th scope="col" { "Node" } th.hide-narrow scope="col" { "IP" } } }
            tbody #pods data-live=(format!("/console/live/clusters/{}/pods?{}", segment(&name), listing.query(listing.page))) {
                @for pod in pod_page(&pods, &listing) { (pod_row(pod)) }
                @if pods.is_empty() { tr #pods-empty { td colspan="6" .muted { "No pods." } } }
            }
        } }
        (pager(&format!("/console/clusters/{}/workloads", segment(&name)), &listing, pod_page(&pods, &listing).len(), pods.len()))
        h2 { "Services" }
        div.scroll { table {
            thead { tr { th scope="col" { "Namespace" } th scope="col" { "Name" } th scope="col" { "Type" } th scope="col" { "Cluster IP" } th scope="col" { "Load balancer" } } }
            tbody #services {
                @for s in &services {
                    tr {
                        td { (text(s, "/metadata/namespace")) } td { (text(s, "/metadata/name")) }
                        td { (text(s, "/spec/type")) } td { (text(s, "/spec/clusterIP")) }
                        td { @for ingress in s["status"]["loadBalancer"]["ingress"].as_array().into_iter().flatten() {
                            code { (ingress["hostname"].as_str().or(ingress["ip"].as_str()).unwrap_or_default()) } " "
                        } }
                    }
                }
            }
        } }
        h2 { "Recent events" }
        div.scroll { table {
            thead { tr { th scope="col" { "When" } th scope="col" { "Type" } th scope="col" { "Object" } th scope="col" { "Reason" } th scope="col" { "Message" } } }
            tbody #events {
                @for e in &events {
                    tr {
                        td { (time(&event_time(e))) } td { (text(e, "/type")) }
                        td { (text(e, "/involvedObject/kind")) "/" (text(e, "/involvedObject/name")) }
                        td { (text(e, "/reason")) } td { (text(e, "/message")) }
                    }
                }
                @if events.is_empty() { tr { td colspan="5" .muted { "No events." } } }
            }
        } }
    };
    Html(
        page(
            Some(&signed.session),
            Section::Clusters,
            &format!("Workloads of {name}"),
            body,
        )
        .into_string(),
    )
    .into_response()
}
