//! A cluster's node pools: the live table (status, sizes, ready nodes, health issues with the
//! cloud's reason), and the forms that create, scale and delete pools.

use std::collections::{BTreeMap, HashMap};

use axum::Router;
use axum::extract::Path;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use http::{Method, StatusCode};
use maud::{Markup, html};

use crate::clusters::cluster_tabs;
use crate::layout::{Section, csrf_field, page, status, text_field};
use crate::session::Session;
use crate::upstream::segment;
use crate::{Console, Signed};

pub(crate) fn routes() -> Router<std::sync::Arc<Console>> {
    Router::new()
        .route("/console/clusters/{name}/nodepools", get(list).post(create))
        .route(
            "/console/clusters/{name}/nodepools/{pool}/scale",
            post(scale),
        )
        .route(
            "/console/clusters/{name}/nodepools/{pool}/delete",
            post(delete),
        )
}

/// The console page of cluster `cluster`'s pools.
fn pools_page(cluster: &str) -> String {
    format!("/console/clusters/{}/nodepools", segment(cluster))
}

/// The management API path of one pool.
fn pool_path(cluster: &str, pool: &str) -> String {
    format!(
        "/v1/clusters/{}/nodepools/{}",
        segment(cluster),
        segment(pool)
    )
}

/// The element id of a pool's row.
pub(crate) fn row_id(pool: &str) -> String {
    format!("pool-{pool}")
}

/// One pool's row, with its scale and delete forms.
pub(crate) fn pool_row(session: &Session, cluster: &str, pool: &serde_json::Value) -> Markup {
    let name = pool["name"].as_str().unwrap_or_default();
    let scaling = &pool["scalingConfig"];
    let base = format!(
        "/console/clusters/{}/nodepools/{}",
        segment(cluster),
        segment(name)
    );
    let issues = pool["health"]["issues"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    html! {
        tr id=(row_id(name)) {
            td { (name) }
            td {
                (status(pool["status"].as_str().unwrap_or("UNKNOWN")))
                @for issue in &issues {
                    div.error { (issue["code"].as_str().unwrap_or_default()) ": " (issue["message"].as_str().unwrap_or_default()) }
                }
            }
            td { (pool["instanceTypes"].as_array().map(|t| t.iter().filter_map(|v| v.as_str()).collect::<Vec<_>>().join(", ")).unwrap_or_default()) }
            td { (pool["readyNodes"].as_u64().unwrap_or(0)) " / " (scaling["desiredSize"].as_u64().unwrap_or(0)) }
            td {
                form.actions method="post" action=(format!("{base}/scale")) {
                    (csrf_field(session))
                    label.check { "Min" input name="min" type="number" min="0" size="3" value=(scaling["minSize"].as_u64().unwrap_or(0)); }
                    label.check { "Desired" input name="desired" type="number" min="0" size="3" value=(scaling["desiredSize"].as_u64().unwrap_or(0)); }
                    label.check { "Max" input name="max" type="number" min="1" size="3" value=(scaling["maxSize"].as_u64().unwrap_or(0)); }
                    button.secondary type="submit" aria-label=(format!("Scale {name}")) { "Scale" }
                }
            }
            td {
                form method="post" action=(format!("{base}/delete")) data-ask=(format!("Delete node pool {name} and its instances?")) {
                    (csrf_field(session))
                    button.danger type="submit" aria-label=(format!("Delete {name}")) { "Delete" }
                }
            }
        }
    }
}

fn create_form(
    session: &Session,
    cluster: &str,
    fields: &HashMap<String, String>,
    error: Option<(&str, &str)>,
) -> Markup {
    let value = |name: &str| fields.get(name).map_or("", |v| v.as_str());
    let message = |field: &str| error.filter(|(f, _)| *f == field).map(|(_, m)| m);
    html! {
        h2 { "Create a node pool" }
        @if let Some((_, m)) = error.filter(|(f, _)| f.is_empty()) { p.error role="alert" { (m) } }
        form.stacked method="post" action=(format!("/console/clusters/{}/nodepools", segment(cluster))) {
            (csrf_field(session))
            (text_field("pool_name", "Name", "a DNS label", value("pool_name"), message("pool_name")))
            (text_field("instance_types", "Instance types", "comma-separated; the first is launched", value("instance_types"), message("instance_types")))
            (text_field("min", "Minimum size", "", if value("min").is_empty() { "1" } else { value("min") }, message("min")))
            (text_field("desired", "Desired size", "", if value("desired").is_empty() { "1" } else { value("desired") }, message("desired")))
            (text_field("max", "Maximum size", "", if value("max").is_empty() { "2" } else { value("max") }, message("max")))
            (text_field("labels", "Node labels", "key=value, comma-separated", value("labels"), message("labels")))
            div.actions { button type="submit" { "Create node pool" } }
        }
    }
}

fn list_body(
    session: &Session,
    cluster: &str,
    pools: &[serde_json::Value],
    fields: &HashMap<String, String>,
    error: Option<(&str, &str)>,
) -> Markup {
    html! {
        h1 { "Cluster " (cluster) }
        (cluster_tabs(cluster, "nodepools"))
        div.scroll {
            table {
                thead { tr {
                    th scope="col" { "Name" } th scope="col" { "Status" } th scope="col" { "Instance types" }
                    th scope="col" { "Ready / desired" } th scope="col" { "Size" } th scope="col" { span.hide-narrow { "Delete" } }
                } }
                tbody #pools data-live=(format!("/console/live/clusters/{}/nodepools", segment(cluster))) {
                    @for pool in pools { (pool_row(session, cluster, pool)) }
                    @if pools.is_empty() { tr #pools-empty { td colspan="6" .muted { "No node pools." } } }
                }
            }
        }
        (create_form(session, cluster, fields, error))
    }
}

async fn render(
    signed: &Signed,
    cluster: &str,
    fields: &HashMap<String, String>,
    error: Option<(&str, &str)>,
) -> Response {
    let pools = match signed
        .upstream()
        .get(&format!("/v1/clusters/{}/nodepools", segment(cluster)))
        .await
    {
        Ok(answer) => answer["nodePools"].as_array().cloned().unwrap_or_default(),
        Err(err) => return signed.failed(&err),
    };
    let body = list_body(&signed.session, cluster, &pools, fields, error);
    let status = if error.is_some() {
        StatusCode::UNPROCESSABLE_ENTITY
    } else {
        StatusCode::OK
    };
    (
        status,
        Html(
            page(
                Some(&signed.session),
                Section::Clusters,
                &format!("Node pools of {cluster}"),
                body,
            )
            .into_string(),
        ),
    )
        .into_response()
}

async fn list(signed: Signed, Path(cluster): Path<String>) -> Response {
    render(&signed, &cluster, &HashMap::new(), None).await
}

/// A size field as a number, or which field is wrong.
fn size(
    fields: &HashMap<String, String>,
    name: &'static str,
) -> Result<u64, (&'static str, String)> {
    let text = fields.get(name).map_or("", |v| v.trim());
    text.parse()
        .map_err(|_| (name, format!("{text:?} is not a whole number")))
}

fn scaling(fields: &HashMap<String, String>) -> Result<serde_json::Value, (&'static str, String)> {
    Ok(serde_json::json!({
        "minSize": size(fields, "min")?,
        "maxSize": size(fields, "max")?,
        "desiredSize": size(fields, "desired")?,
    }))
}

/// The API message's form field.
fn field_of(message: &str) -> &'static str {
    if message.contains("node pool name") || message.contains("already exists") {
        "pool_name"
    } else if message.contains("instanceTypes") {
        "instance_types"
    } else if message.contains("desiredSize") {
        "desired"
    } else if message.contains("minSize") {
        "min"
    } else if message.contains("maxSize") {
        "max"
    } else if message.contains("label") {
        "labels"
    } else {
        ""
    }
}

async fn create(
    signed: Signed,
    Path(cluster): Path<String>,
    axum::Form(fields): axum::Form<HashMap<String, String>>,
) -> Response {
    if let Some(refused) = signed.refuse_forged(&fields) {
        return refused;
    }
    let labels: Result<BTreeMap<String, String>, String> = fields
        .get("labels")
        .map_or("", |v| v.as_str())
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| match item.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(format!("{item:?} is not key=value")),
        })
        .collect();
    let labels = match labels {
        Ok(labels) => labels,
        Err(message) => {
            return render(&signed, &cluster, &fields, Some(("labels", &message))).await;
        }
    };
    let scaling = match scaling(&fields) {
        Ok(scaling) => scaling,
        Err((field, message)) => {
            return render(&signed, &cluster, &fields, Some((field, &message))).await;
        }
    };
    let instance_types: Vec<String> = fields
        .get("instance_types")
        .map_or("", |v| v.as_str())
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect();
    let request = serde_json::json!({
        "name": fields.get("pool_name").map_or("", |v| v.trim()),
        "instanceTypes": instance_types,
        "scalingConfig": scaling,
        "labels": labels,
    });
    let path = format!("/v1/clusters/{}/nodepools", segment(&cluster));
    match signed
        .upstream()
        .call(Method::POST, &path, Some(&request))
        .await
    {
        Ok(_) => Redirect::to(&pools_page(&cluster)).into_response(),
        Err(err) if err.status.is_client_error() => {
            render(
                &signed,
                &cluster,
                &fields,
                Some((field_of(&err.message), &err.message)),
            )
            .await
        }
        Err(err) => signed.failed(&err),
    }
}

async fn scale(
    signed: Signed,
    Path((cluster, pool)): Path<(String, String)>,
    axum::Form(fields): axum::Form<HashMap<String, String>>,
) -> Response {
    if let Some(refused) = signed.refuse_forged(&fields) {
        return refused;
    }
    let scaling = match scaling(&fields) {
        Ok(scaling) => scaling,
        Err((_, message)) => {
            return render(
                &signed,
                &cluster,
                &HashMap::new(),
                Some(("", &format!("Scaling {pool}: {message}"))),
            )
            .await;
        }
    };
    let path = pool_path(&cluster, &pool);
    match signed
        .upstream()
        .call(
            Method::PATCH,
            &path,
            Some(&serde_json::json!({"scalingConfig": scaling})),
        )
        .await
    {
        Ok(_) => Redirect::to(&pools_page(&cluster)).into_response(),
        Err(err) if err.status.is_client_error() => {
            render(
                &signed,
                &cluster,
                &HashMap::new(),
                Some(("", &format!("Scaling {pool}: {}", err.message))),
            )
            .await
        }
        Err(err) => signed.failed(&err),
    }
}

async fn delete(
    signed: Signed,
    Path((cluster, pool)): Path<(String, String)>,
    axum::Form(fields): axum::Form<HashMap<String, String>>,
) -> Response {
    if let Some(refused) = signed.refuse_forged(&fields) {
        return refused;
    }
    let path = pool_path(&cluster, &pool);
    match signed.upstream().call(Method::DELETE, &path, None).await {
        Ok(_) => Redirect::to(&pools_page(&cluster)).into_response(),
        Err(err) if err.status.is_client_error() => {
            let message = format!("Deleting {pool}: {}", err.message);
            render(&signed, &cluster, &HashMap::new(), Some(("", &message))).await
        }
        Err(err) => signed.failed(&err),
    }
}
