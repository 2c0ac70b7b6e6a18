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
use crate::layout::{Section, page, status, time};
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

/// How many rows of a cluster's list the page asks the API for (the API pages, so a cluster
/// with thousands of pods costs the page no more than one with fifty).
const LIST_LIMIT: usize = 50;

/// One page of a list of the tenant API: its items, the continue token of the next page and
/// how many items follow (when the API says).
pub(crate) struct ListPage {
    pub items: Vec<serde_json::Value>,
    pub next: Option<String>,
    pub remaining: Option<u64>,
}

/// A page of the list at `path` of the tenant API.
pub(crate) async fn list_page(
    upstream: &Upstream<'_>,
    tenant: &Tenant,
    path: &str,
) -> Result<ListPage, UpstreamError> {
    let answer = upstream
        .with_bearer(&tenant.token)
        .get(&format!("{}{path}", tenant.prefix))
        .await?;
    Ok(ListPage {
        items: answer["items"].as_array().cloned().unwrap_or_default(),
        next: answer["metadata"]["continue"]
            .as_str()
            .filter(|c| !c.is_empty())
            .map(str::to_string),
        remaining: answer["metadata"]["remainingItemCount"].as_u64(),
    })
}

/// `items` of a list at `path` of the tenant API.
pub(crate) async fn items(
    upstream: &Upstream<'_>,
    tenant: &Tenant,
    path: &str,
) -> Result<Vec<serde_json::Value>, UpstreamError> {
    Ok(list_page(upstream, tenant, path).await?.items)
}

/// Which pods the workloads page lists: those of one node (or all), from a continue token
/// (or the first).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PodQuery {
    pub node: String,
    pub from: String,
}

impl PodQuery {
    pub(crate) fn from_query(query: &HashMap<String, String>) -> Self {
        PodQuery {
            node: query.get("node").cloned().unwrap_or_default(),
            from: query.get("continue").cloned().unwrap_or_default(),
        }
    }

    /// The page's query string, from `from`.
    pub(crate) fn query(&self, from: &str) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        if !self.node.is_empty() {
            query.append_pair("node", &self.node);
        }
        if !from.is_empty() {
            query.append_pair("continue", from);
        }
        query.finish()
    }

    /// The tenant API path of this page.
    pub(crate) fn path(&self) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        query.append_pair("limit", &LIST_LIMIT.to_string());
        if !self.node.is_empty() {
            query.append_pair("fieldSelector", &format!("spec.nodeName={}", self.node));
        }
        if !self.from.is_empty() {
            query.append_pair("continue", &self.from);
        }
        format!("/api/v1/pods?{}", query.finish())
    }
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

/// The pods table's pager: where this page is, the next page, back to the first.
fn pod_pager(cluster: &str, pods: &PodQuery, page: &ListPage) -> Markup {
    let base = format!("/console/clusters/{}/workloads", segment(cluster));
    html! {
        nav.actions aria-label="Pages of pods" {
            span.muted {
                (page.items.len()) " pods shown"
                @if let Some(remaining) = page.remaining { ", " (remaining) " more" }
                @if !pods.node.is_empty() { " on node " (pods.node) }
            }
            @if !pods.from.is_empty() || !pods.node.is_empty() { a href=(format!("{base}#pods")) { "All pods, first page" } }
            @if let Some(next) = &page.next { a href=(format!("{base}?{}#pods", pods.query(next))) rel="next" { "Next" } }
        }
    }
}

/// The lists of a cluster the workloads page shows beside its pods (each bounded; Events
/// sorted newest first, of the first 500 the API lists).
pub(crate) struct Lists {
    nodes: Vec<serde_json::Value>,
    namespaces: Vec<serde_json::Value>,
    deployments: Vec<serde_json::Value>,
    services: Vec<serde_json::Value>,
    events: Vec<serde_json::Value>,
}

fn event_time(event: &serde_json::Value) -> String {
    [
        text(event, "/lastTimestamp"),
        text(event, "/eventTime"),
        text(event, "/metadata/creationTimestamp"),
    ]
    .into_iter()
    .find(|t| !t.is_empty())
    .unwrap_or_default()
    .to_string()
}

/// Reads the [`Lists`] of cluster `tenant`.
pub(crate) async fn lists(
    upstream: &Upstream<'_>,
    tenant: &Tenant,
) -> Result<Lists, UpstreamError> {
    let (nodes, namespaces, deployments, services, events) = tokio::join!(
        items(upstream, tenant, "/api/v1/nodes?limit=100"),
        items(upstream, tenant, "/api/v1/namespaces?limit=100"),
        items(upstream, tenant, "/apis/apps/v1/deployments?limit=100"),
        items(upstream, tenant, "/api/v1/services?limit=100"),
        items(upstream, tenant, "/api/v1/events?limit=500"),
    );
    let mut events = events?;
    events.sort_by_key(|e| std::cmp::Reverse(event_time(e)));
    events.truncate(20);
    Ok(Lists {
        nodes: nodes?,
        namespaces: namespaces?,
        deployments: deployments?,
        services: services?,
        events,
    })
}

/// The bodies of the lists' tables, by element id (what a live update replaces whole).
pub(crate) fn list_bodies(cluster: &str, lists: &Lists) -> Vec<(&'static str, Markup)> {
    let nodes = html! {
        tbody #nodes {
            @for node in &lists.nodes {
                @let name = text(node, "/metadata/name");
                @let pressure: Vec<&str> = ["MemoryPressure", "DiskPressure", "PIDPressure"].into_iter().filter(|k| condition(node, k) == "True").collect();
                tr {
                    td { (name) }
                    td { (status(&condition(node, "Ready"))) }
                    td { @if pressure.is_empty() { span.muted { "none" } } @else { span.error { (pressure.join(", ")) } } }
                    td { (text(node, "/status/capacity/cpu")) }
                    td { (text(node, "/status/capacity/memory")) }
                    td {
                        a href=(format!("/console/clusters/{}/workloads?{}#pods", segment(cluster), PodQuery { node: name.to_string(), from: String::new() }.query(""))) { "its pods" }
                        " (room for " (text(node, "/status/capacity/pods")) ")"
                    }
                }
            }
            @if lists.nodes.is_empty() { tr { td colspan="6" .muted { "No nodes have joined." } } }
        }
    };
    let namespaces = html! {
        p #namespaces { @for (i, ns) in lists.namespaces.iter().enumerate() { @if i > 0 { ", " } (text(ns, "/metadata/name")) } }
    };
    let deployments = html! {
        tbody #deployments {
            @for d in &lists.deployments {
                tr {
                    td { (text(d, "/metadata/namespace")) } td { (text(d, "/metadata/name")) }
                    td { (d["status"]["readyReplicas"].as_u64().unwrap_or(0)) " / " (d["spec"]["replicas"].as_u64().unwrap_or(1)) }
                    td { (d["status"]["updatedReplicas"].as_u64().unwrap_or(0)) }
                }
            }
            @if lists.deployments.is_empty() { tr { td colspan="4" .muted { "No Deployments." } } }
        }
    };
    let services = html! {
        tbody #services {
            @for s in &lists.services {
                tr {
                    td { (text(s, "/metadata/namespace")) } td { (text(s, "/metadata/name")) }
                    td { (text(s, "/spec/type")) } td { (text(s, "/spec/clusterIP")) }
                    td { @for ingress in s["status"]["loadBalancer"]["ingress"].as_array().into_iter().flatten() {
                        code { (ingress["hostname"].as_str().or(ingress["ip"].as_str()).unwrap_or_default()) } " "
                    } }
                }
            }
        }
    };
    let events = html! {
        tbody #events {
            @for e in &lists.events {
                tr {
                    td { (time(&event_time(e))) } td { (text(e, "/type")) }
                    td { (text(e, "/involvedObject/kind")) "/" (text(e, "/involvedObject/name")) }
                    td { (text(e, "/reason")) } td { (text(e, "/message")) }
                }
            }
            @if lists.events.is_empty() { tr { td colspan="5" .muted { "No events." } } }
        }
    };
    vec![
        ("nodes", nodes),
        ("namespaces", namespaces),
        ("deployments", deployments),
        ("services", services),
        ("events", events),
    ]
}

async fn workloads(
    signed: Signed,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let pod_query = PodQuery::from_query(&query);
    let upstream = signed.upstream();
    let tenant = match tenant(&upstream, &name).await {
        Ok(tenant) => tenant,
        Err(err) => return signed.failed(&err),
    };
    let pods_path = pod_query.path();
    let (lists, pods) = tokio::join!(
        lists(&upstream, &tenant),
        list_page(&upstream, &tenant, &pods_path)
    );
    let (lists, pods) = match (lists, pods) {
        (Ok(lists), Ok(pods)) => (lists, pods),
        (Err(err), _) | (_, Err(err)) => return signed.failed(&err),
    };
    let bodies: HashMap<&str, Markup> = list_bodies(&name, &lists).into_iter().collect();
    let body_of = |id: &str| bodies.get(id).cloned().unwrap_or_else(|| html! {});
    let body = html! {
        h1 { "Cluster " (name) }
        (cluster_tabs(&name, "workloads"))
        div #workloads-live data-live=(format!("/console/live/clusters/{}/workloads", segment(&name))) {
            h2 { "Nodes" }
            div.scroll { table {
                thead { tr { th scope="col" { "Name" } th scope="col" { "Ready" } th scope="col" { "Pressure" } th scope="col" { "CPU" } th scope="col" { "Memory" } th scope="col" { "Pods" } } }
                (body_of("nodes"))
            } }
            h2 { "Namespaces" }
            (body_of("namespaces"))
            h2 { "Deployments" }
            div.scroll { table {
                thead { tr { th scope="col" { "Namespace" } th scope="col" { "Name" } th scope="col" { "Ready / desired" } th scope="col" { "Up to date" } } }
                (body_of("deployments"))
            } }
        }
        h2 { "Pods" }
        div.scroll { table {
            thead { tr { th scope="col" { "Namespace" } th scope="col" { "Name" } th scope="col" { "Phase" } th scope="col" { "Restarts" } th scope="col" { "Node" } th.hide-narrow scope="col" { "IP" } } }
            tbody #pods data-live=(format!("/console/live/clusters/{}/pods?{}", segment(&name), pod_query.query(&pod_query.from))) {
                @for pod in &pods.items { (pod_row(pod)) }
                @if pods.items.is_empty() { tr #pods-empty { td colspan="6" .muted { "No pods." } } }
            }
        } }
        (pod_pager(&name, &pod_query, &pods))
        h2 { "Services" }
        div.scroll { table {
            thead { tr { th scope="col" { "Namespace" } th scope="col" { "Name" } th scope="col" { "Type" } th scope="col" { "Cluster IP" } th scope="col" { "Load balancer" } } }
            (body_of("services"))
        } }
        h2 { "Recent events" }
        div.scroll { table {
            thead { tr { th scope="col" { "When" } th scope="col" { "Type" } th scope="col" { "Object" } th scope="col" { "Reason" } th scope="col" { "Message" } } }
            (body_of("events"))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_are_asked_for_a_page_at_a_time() {
        let first = PodQuery::default();
        assert_eq!(first.path(), "/api/v1/pods?limit=50");
        let next = PodQuery {
            node: "node-1".into(),
            from: "abc=".into(),
        };
        assert_eq!(
            next.path(),
            "/api/v1/pods?limit=50&fieldSelector=spec.nodeName%3Dnode-1&continue=abc%3D"
        );
        assert_eq!(next.query("xyz"), "node=node-1&continue=xyz");
        let query: HashMap<String, String> = [("continue".to_string(), "t".to_string())].into();
        assert_eq!(PodQuery::from_query(&query).from, "t");
    }
}
