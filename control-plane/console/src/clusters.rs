//! Clusters: the list (filtered, sorted, live), the create form (every field of the
//! management API, messages beside the field, the equivalent CLI command and Terraform block),
//! the detail page (overview, node pools, kubeconfig downloads, delete by typed confirmation).

use std::collections::{BTreeMap, HashMap};

use axum::Router;
use axum::extract::{Path, Query};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use http::{Method, StatusCode};
use maud::{Markup, html};
use ring::digest;

use crate::layout::{
    Listing, PAGE_SIZE, Section, check_field, csrf_field, page, pager, status, text_field, time,
};
use crate::upstream::{Upstream, UpstreamError, segment};
use crate::{Console, Signed};

pub(crate) fn routes() -> Router<std::sync::Arc<Console>> {
    Router::new()
        .route("/console/clusters", get(list).post(create))
        .route("/console/clusters/new", get(new_form))
        .route("/console/clusters/new/preview", post(preview))
        .route("/console/clusters/{name}", get(detail))
        .route("/console/clusters/{name}/kubeconfig", get(kubeconfig))
        .route("/console/clusters/{name}/delete", post(delete))
}

/// A cluster with what the list shows of its node pools.
pub(crate) struct ClusterRow {
    pub cluster: serde_json::Value,
    pub pools: Vec<serde_json::Value>,
}

/// One page of the account's clusters (sorted by name, filtered) with their pools, and how
/// many clusters match in all. Only the page's clusters' pools are read.
pub(crate) async fn cluster_rows(
    upstream: &Upstream<'_>,
    listing: &Listing,
) -> Result<(Vec<ClusterRow>, usize), UpstreamError> {
    let answer = upstream.get("/v1/clusters").await?;
    let mut clusters: Vec<serde_json::Value> = answer["clusters"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| matches_filter(c, &listing.filter))
        .collect();
    clusters.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    let total = clusters.len();
    let clusters: Vec<serde_json::Value> = clusters
        .into_iter()
        .skip((listing.page - 1) * PAGE_SIZE)
        .take(PAGE_SIZE)
        .collect();
    let pools = futures::future::join_all(clusters.iter().map(|c| {
        let name = c["name"].as_str().unwrap_or_default().to_string();
        async move {
            upstream
                .get(&format!("/v1/clusters/{}/nodepools", segment(&name)))
                .await
                .map(|answer| answer["nodePools"].as_array().cloned().unwrap_or_default())
                .unwrap_or_default()
        }
    }))
    .await;
    Ok((
        clusters
            .into_iter()
            .zip(pools)
            .map(|(cluster, pools)| ClusterRow { cluster, pools })
            .collect(),
        total,
    ))
}

fn matches_filter(cluster: &serde_json::Value, filter: &str) -> bool {
    let filter = filter.trim().to_lowercase();
    if filter.is_empty() {
        return true;
    }
    let name = cluster["name"].as_str().unwrap_or_default().to_lowercase();
    name.contains(&filter)
        || cluster["tags"].as_object().is_some_and(|tags| {
            tags.iter().any(|(k, v)| {
                k.to_lowercase().contains(&filter)
                    || v.as_str()
                        .is_some_and(|v| v.to_lowercase().contains(&filter))
                    || format!("{k}={}", v.as_str().unwrap_or_default())
                        .to_lowercase()
                        .contains(&filter)
            })
        })
}

/// The element id of a cluster's row.
pub(crate) fn row_id(name: &str) -> String {
    format!("cluster-{name}")
}

/// One row of the list.
pub(crate) fn cluster_row(row: &ClusterRow) -> Markup {
    let c = &row.cluster;
    let name = c["name"].as_str().unwrap_or_default();
    let ready: u64 = row
        .pools
        .iter()
        .filter_map(|p| p["readyNodes"].as_u64())
        .sum();
    let desired: u64 = row
        .pools
        .iter()
        .filter_map(|p| p["scalingConfig"]["desiredSize"].as_u64())
        .sum();
    html! {
        tr id=(row_id(name)) {
            td { a href=(format!("/console/clusters/{}", segment(name))) { (name) } }
            td { (status(c["status"].as_str().unwrap_or("UNKNOWN"))) }
            td { (c["version"].as_str().unwrap_or_default()) }
            td.hide-narrow { code { (c["endpoint"].as_str().unwrap_or_default()) } }
            td { (row.pools.len()) }
            td { @if row.pools.is_empty() { span.muted { "—" } } @else { (ready) " / " (desired) } }
            td.hide-narrow { (tags_text(c)) }
            td.hide-narrow { (time(c["createdAt"].as_str().unwrap_or_default())) }
        }
    }
}

fn tags_text(cluster: &serde_json::Value) -> String {
    cluster["tags"]
        .as_object()
        .map(|tags| {
            tags.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

/// The list page's body.
pub(crate) fn list_body(rows: &[ClusterRow], listing: &Listing, total: usize) -> Markup {
    let live = format!("/console/live/clusters?{}", listing.query(listing.page));
    html! {
        h1 { "Clusters" }
        div.actions {
            form method="get" action="/console/clusters" role="search" {
                label.check for="q" {
                    "Filter"
                    input #q name="q" value=(listing.filter) placeholder="name or tag";
                }
            }
            a.button href="/console/clusters/new" { "Create cluster" }
        }
        div.scroll {
            table {
                caption.muted { "Sorted by name; status changes appear as they happen." }
                thead { tr {
                    th scope="col" { "Name" } th scope="col" { "Status" } th scope="col" { "Version" }
                    th.hide-narrow scope="col" { "Endpoint" } th scope="col" { "Node pools" }
                    th scope="col" { "Nodes ready" } th.hide-narrow scope="col" { "Tags" }
                    th.hide-narrow scope="col" { "Created" }
                } }
                tbody #clusters data-live=(live) {
                    @for row in rows { (cluster_row(row)) }
                    @if rows.is_empty() {
                        tr #clusters-empty { td colspan="8" .muted { "No clusters yet." } }
                    }
                }
            }
        }
        (pager("/console/clusters", listing, rows.len(), total))
    }
}

async fn list(signed: Signed, Query(query): Query<HashMap<String, String>>) -> Response {
    let listing = Listing::from_query(&query);
    if signed.session.is_operator() {
        return Redirect::to("/console/accounts").into_response();
    }
    match cluster_rows(&signed.upstream(), &listing).await {
        Ok((rows, total)) => Html(
            page(
                Some(&signed.session),
                Section::Clusters,
                "Clusters",
                list_body(&rows, &listing, total),
            )
            .into_string(),
        )
        .into_response(),
        Err(err) => signed.failed(&err),
    }
}

/// What the create form holds (as typed).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ClusterForm {
    fields: HashMap<String, String>,
    public: bool,
    private: bool,
}

impl Default for ClusterForm {
    fn default() -> Self {
        ClusterForm {
            fields: HashMap::new(),
            public: true,
            private: false,
        }
    }
}

/// Comma- or whitespace-separated items.
fn items(text: &str) -> Vec<String> {
    text.split([',', ' ', '\n'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

impl ClusterForm {
    pub(crate) fn from_fields(fields: HashMap<String, String>) -> Self {
        ClusterForm {
            public: fields.contains_key("endpoint_public"),
            private: fields.contains_key("endpoint_private"),
            fields,
        }
    }

    fn get(&self, name: &str) -> &str {
        self.fields.get(name).map_or("", |v| v.trim())
    }

    /// The tags as typed (`key=value`, one per line or comma-separated), or which is wrong.
    fn tags(&self) -> Result<BTreeMap<String, String>, String> {
        items(self.get("tags"))
            .into_iter()
            .map(|item| match item.split_once('=') {
                Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
                _ => Err(format!("{item:?} is not key=value")),
            })
            .collect()
    }

    /// The management API's CreateCluster body.
    pub(crate) fn request(&self) -> Result<serde_json::Value, (&'static str, String)> {
        let tags = self.tags().map_err(|e| ("tags", e))?;
        let mut request = serde_json::json!({
            "name": self.get("name"),
            "tags": tags,
            "endpointAccess": {
                "public": self.public,
                "private": self.private,
            },
            "kubernetesNetworkConfig": {},
        });
        let cidrs = items(self.get("public_access_cidrs"));
        if !cidrs.is_empty() {
            request["endpointAccess"]["publicAccessCidrs"] = cidrs.into();
        }
        for (field, key) in [
            ("service_cidr", "serviceIpv4Cidr"),
            ("pod_cidr", "podIpv4Cidr"),
        ] {
            if !self.get(field).is_empty() {
                request["kubernetesNetworkConfig"][key] = self.get(field).into();
            }
        }
        if !self.get("version").is_empty() {
            request["version"] = self.get("version").into();
        }
        let mut cloud = serde_json::Map::new();
        for (field, key) in [
            ("cloud_region", "region"),
            ("cloud_endpoint", "endpointOverride"),
            ("cloud_vpc_id", "vpcId"),
            ("cloud_role_arn", "roleArn"),
        ] {
            if !self.get(field).is_empty() {
                cloud.insert(key.into(), self.get(field).into());
            }
        }
        for (field, key) in [
            ("cloud_subnets", "subnetIds"),
            ("cloud_security_groups", "securityGroupIds"),
        ] {
            let list = items(self.get(field));
            if !list.is_empty() {
                cloud.insert(key.into(), list.into());
            }
        }
        if !self.get("cloud_access_key_id").is_empty() {
            cloud.insert(
                "credentials".into(),
                serde_json::json!({
                    "accessKeyId": self.get("cloud_access_key_id"),
                    "secretAccessKey": self.get("cloud_secret_access_key"),
                }),
            );
        }
        if !cloud.is_empty() {
            request["cloud"] = cloud.into();
        }
        let level = self.get("pod_security_enforce");
        let exempt = items(self.get("pod_security_exempt_namespaces"));
        if !level.is_empty() || !exempt.is_empty() {
            let mut defaults = serde_json::Map::new();
            if !level.is_empty() {
                defaults.insert("enforce".into(), level.into());
            }
            request["podSecurity"] =
                serde_json::json!({"defaults": defaults, "exemptions": {"namespaces": exempt}});
        }
        Ok(request)
    }

    /// The `flotilla` command that makes the same cluster.
    pub(crate) fn cli(&self) -> String {
        let quote = |s: &str| {
            if s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._/:=,".contains(c))
            {
                s.to_string()
            } else {
                format!("'{}'", s.replace('\'', r"'\''"))
            }
        };
        let name = self.get("name");
        let mut words = vec![format!(
            "flotilla cluster create {}",
            quote(if name.is_empty() { "NAME" } else { name })
        )];
        for (field, flag) in [
            ("version", "--version"),
            ("service_cidr", "--service-cidr"),
            ("pod_cidr", "--pod-cidr"),
            ("cloud_region", "--region"),
            ("cloud_endpoint", "--cloud-endpoint"),
            ("cloud_vpc_id", "--vpc-id"),
            ("cloud_role_arn", "--role-arn"),
            ("cloud_access_key_id", "--cloud-access-key-id"),
            ("pod_security_enforce", "--pod-security-enforce"),
        ] {
            if !self.get(field).is_empty() {
                words.push(format!("{flag} {}", quote(self.get(field))));
            }
        }
        for (field, flag) in [
            ("public_access_cidrs", "--public-access-cidr"),
            ("cloud_subnets", "--subnet"),
            ("cloud_security_groups", "--security-group"),
            ("tags", "--tag"),
            (
                "pod_security_exempt_namespaces",
                "--pod-security-exempt-namespace",
            ),
        ] {
            for item in items(self.get(field)) {
                words.push(format!("{flag} {}", quote(&item)));
            }
        }
        words.push("--wait".into());
        let mut text = words.join(" \\\n    ");
        if !self.get("cloud_access_key_id").is_empty() {
            text = format!("FLOTILLA_CLOUD_SECRET_ACCESS_KEY=… {text}");
        }
        text
    }

    /// The `flotilla_cluster` resource that makes the same cluster.
    pub(crate) fn terraform(&self) -> String {
        let hcl = |s: &str| serde_json::Value::from(s).to_string();
        let list = |v: Vec<String>| {
            format!(
                "[{}]",
                v.iter().map(|s| hcl(s)).collect::<Vec<_>>().join(", ")
            )
        };
        let name = self.get("name");
        let label = if name.is_empty() {
            "this".to_string()
        } else {
            name.replace('-', "_")
        };
        let mut out = format!(
            "resource \"flotilla_cluster\" \"{label}\" {{\n  name = {}\n",
            hcl(if name.is_empty() { "NAME" } else { name })
        );
        for (field, attribute) in [
            ("version", "version"),
            ("service_cidr", "service_ipv4_cidr"),
            ("pod_cidr", "pod_ipv4_cidr"),
        ] {
            if !self.get(field).is_empty() {
                out += &format!("  {attribute} = {}\n", hcl(self.get(field)));
            }
        }
        if !self.public {
            out += "  endpoint_public_access = false\n";
        }
        if self.private {
            out += "  endpoint_private_access = true\n";
        }
        let cidrs = items(self.get("public_access_cidrs"));
        if !cidrs.is_empty() {
            out += &format!("  public_access_cidrs = {}\n", list(cidrs));
        }
        if let Ok(tags) = self.tags()
            && !tags.is_empty()
        {
            let pairs: Vec<String> = tags
                .iter()
                .map(|(k, v)| format!("{} = {}", hcl(k), hcl(v)))
                .collect();
            out += &format!("  tags = {{ {} }}\n", pairs.join(", "));
        }
        let mut cloud = String::new();
        for (field, attribute) in [
            ("cloud_region", "region"),
            ("cloud_endpoint", "endpoint_override"),
            ("cloud_vpc_id", "vpc_id"),
            ("cloud_role_arn", "role_arn"),
            ("cloud_access_key_id", "access_key_id"),
        ] {
            if !self.get(field).is_empty() {
                cloud += &format!("    {attribute} = {}\n", hcl(self.get(field)));
            }
        }
        for (field, attribute) in [
            ("cloud_subnets", "subnet_ids"),
            ("cloud_security_groups", "security_group_ids"),
        ] {
            let v = items(self.get(field));
            if !v.is_empty() {
                cloud += &format!("    {attribute} = {}\n", list(v));
            }
        }
        if !self.get("cloud_access_key_id").is_empty() {
            cloud += "    secret_access_key = var.cloud_secret_access_key\n";
        }
        if !cloud.is_empty() {
            out += &format!("  cloud {{\n{cloud}  }}\n");
        }
        let mut pod_security = String::new();
        if !self.get("pod_security_enforce").is_empty() {
            pod_security += &format!("    enforce = {}\n", hcl(self.get("pod_security_enforce")));
        }
        let exempt = items(self.get("pod_security_exempt_namespaces"));
        if !exempt.is_empty() {
            pod_security += &format!("    exempt_namespaces = {}\n", list(exempt));
        }
        if !pod_security.is_empty() {
            out += &format!("  pod_security {{\n{pod_security}  }}\n");
        }
        out + "}\n"
    }
}

/// The cluster's Pod Security defaults in a line: `enforce baseline:latest, warn
/// restricted:latest; exempt namespaces kube-system` (modes at privileged are left out).
fn pod_security_text(cluster: &serde_json::Value) -> String {
    let config = &cluster["podSecurity"];
    let modes: Vec<String> = ["enforce", "audit", "warn"]
        .into_iter()
        .filter_map(|mode| {
            let level = config["defaults"][mode].as_str().unwrap_or("privileged");
            let version = config["defaults"][format!("{mode}-version")]
                .as_str()
                .unwrap_or("latest");
            (level != "privileged").then(|| format!("{mode} {level}:{version}"))
        })
        .collect();
    let mut text = if modes.is_empty() {
        "privileged (no defaults)".to_string()
    } else {
        modes.join(", ")
    };
    let exempt: Vec<&str> = config["exemptions"]["namespaces"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(serde_json::Value::as_str)
        .collect();
    if !exempt.is_empty() {
        text += &format!("; exempt namespaces {}", exempt.join(", "));
    }
    text
}

/// Which form field an API message is about (the API names its fields in its messages).
pub(crate) fn field_of(message: &str) -> Option<&'static str> {
    let rules: [(&str, &str); 12] = [
        ("podSecurity.defaults", "pod_security_enforce"),
        ("podSecurity.exemptions", "pod_security_exempt_namespaces"),
        ("cluster name", "name"),
        ("already exists", "name"),
        ("serviceIpv4Cidr", "service_cidr"),
        ("podIpv4Cidr", "pod_cidr"),
        ("publicAccessCidrs", "public_access_cidrs"),
        ("endpointAccess", "endpoint_public"),
        ("Kubernetes version", "version"),
        ("tag", "tags"),
        ("cloud.endpointOverride", "cloud_endpoint"),
        ("cloud:", "cloud_role_arn"),
    ];
    rules
        .into_iter()
        .find(|(needle, _)| message.contains(needle))
        .map(|(_, field)| field)
}

fn preview_body(form: &ClusterForm) -> Markup {
    html! {
        h2 { "The same with the CLI" }
        pre { code { (form.cli()) } }
        h2 { "The same with Terraform" }
        pre { code { (form.terraform()) } }
    }
}

/// The create form, with `error` beside its field (or above the form).
pub(crate) fn form_body(
    session: &crate::session::Session,
    form: &ClusterForm,
    error: Option<(&str, &str)>,
) -> Markup {
    let message = |field: &str| error.filter(|(f, _)| *f == field).map(|(_, m)| m);
    let general = error.filter(|(f, _)| f.is_empty());
    let field = |name: &str, label: &str, hint: &str| {
        text_field(name, label, hint, form.get(name), message(name))
    };
    html! {
        h1 { "Create cluster" }
        @if let Some((_, m)) = general { p.error role="alert" { (m) } }
        div.columns {
            form.stacked method="post" action="/console/clusters" data-preview="/console/clusters/new/preview" {
                (csrf_field(session))
                (field("name", "Name", "a DNS label, at most 40 characters"))
                (field("version", "Kubernetes version", "empty: the newest supported"))
                label for="tags" {
                    "Tags" span.hint { "key=value, one per line" }
                    textarea #tags name="tags" rows="3"
                        aria-invalid=[message("tags").map(|_| "true")] { (form.get("tags")) }
                    @if let Some(m) = message("tags") { span.error role="alert" { (m) } }
                }
                fieldset {
                    legend { "Endpoint access" }
                    (check_field("endpoint_public", "Public endpoint", form.public))
                    (check_field("endpoint_private", "Private endpoint (the nodes' networks)", form.private))
                    @if let Some(m) = message("endpoint_public") { span.error role="alert" { (m) } }
                    (field("public_access_cidrs", "Public access CIDRs", "comma-separated; empty: 0.0.0.0/0"))
                }
                fieldset {
                    legend { "Network" }
                    (field("service_cidr", "Service IPv4 CIDR", "empty: 10.96.0.0/12"))
                    (field("pod_cidr", "Pod IPv4 CIDR", "empty: 10.244.0.0/16"))
                }
                fieldset {
                    legend { "Pod Security (namespaces that set no level of their own)" }
                    label for="pod_security_enforce" {
                        "Enforced level" span.hint { "privileged lets everything run, as upstream ships" }
                        select #pod_security_enforce name="pod_security_enforce"
                            aria-invalid=[message("pod_security_enforce").map(|_| "true")] {
                            @for (value, text) in [("", "privileged (default)"), ("baseline", "baseline"), ("restricted", "restricted")] {
                                option value=(value) selected[form.get("pod_security_enforce") == value] { (text) }
                            }
                        }
                        @if let Some(m) = message("pod_security_enforce") { span.error role="alert" { (m) } }
                    }
                    (field("pod_security_exempt_namespaces", "Exempt namespaces", "comma-separated, e.g. kube-system"))
                }
                fieldset {
                    legend { "Cloud (optional: node pools, load balancers, volumes)" }
                    (field("cloud_region", "Region", "e.g. us-east-1"))
                    (field("cloud_endpoint", "Endpoint override", "one endpoint for every AWS API (LocalStack's)"))
                    (field("cloud_vpc_id", "VPC id", ""))
                    (field("cloud_subnets", "Subnet ids", "comma-separated"))
                    (field("cloud_security_groups", "Security group ids", "comma-separated"))
                    (field("cloud_role_arn", "Role ARN", "or static credentials below"))
                    (field("cloud_access_key_id", "Access key id", ""))
                    label for="cloud_secret_access_key" {
                        "Secret access key"
                        input #cloud_secret_access_key type="password" name="cloud_secret_access_key" autocomplete="off";
                    }
                }
                div.actions {
                    button type="submit" { "Create" }
                    a.button.secondary href="/console/clusters" { "Cancel" }
                }
            }
            section #preview aria-live="polite" { (preview_body(form)) }
        }
    }
}

async fn new_form(signed: Signed) -> Response {
    let body = form_body(&signed.session, &ClusterForm::default(), None);
    Html(
        page(
            Some(&signed.session),
            Section::Clusters,
            "Create cluster",
            body,
        )
        .into_string(),
    )
    .into_response()
}

async fn preview(
    signed: Signed,
    axum::Form(fields): axum::Form<HashMap<String, String>>,
) -> Response {
    if let Some(refused) = signed.refuse_forged(&fields) {
        return refused;
    }
    Html(preview_body(&ClusterForm::from_fields(fields)).into_string()).into_response()
}

async fn create(
    signed: Signed,
    axum::Form(fields): axum::Form<HashMap<String, String>>,
) -> Response {
    if let Some(refused) = signed.refuse_forged(&fields) {
        return refused;
    }
    let form = ClusterForm::from_fields(fields);
    let refused = |field: &str, message: &str| {
        let body = form_body(&signed.session, &form, Some((field, message)));
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            Html(
                page(
                    Some(&signed.session),
                    Section::Clusters,
                    "Create cluster",
                    body,
                )
                .into_string(),
            ),
        )
            .into_response()
    };
    let request = match form.request() {
        Ok(request) => request,
        Err((field, message)) => return refused(field, &message),
    };
    match signed
        .upstream()
        .call(Method::POST, "/v1/clusters", Some(&request))
        .await
    {
        Ok(_) => Redirect::to(&format!("/console/clusters/{}", segment(form.get("name"))))
            .into_response(),
        Err(err) if err.status.is_client_error() => {
            refused(field_of(&err.message).unwrap_or(""), &err.message)
        }
        Err(err) => signed.failed(&err),
    }
}

/// The hex SHA-256 of the first certificate in base64 PEM data (as `openssl x509
/// -fingerprint -sha256` prints it).
pub(crate) fn ca_fingerprint(base64_pem: &str) -> Option<String> {
    use base64::Engine;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(base64_pem)
        .ok()?;
    let pem = String::from_utf8(pem).ok()?;
    let body: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .ok()?;
    let hash = digest::digest(&digest::SHA256, &der);
    Some(
        hash.as_ref()
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect::<Vec<_>>()
            .join(":"),
    )
}

/// The tabs of a cluster's pages.
pub(crate) fn cluster_tabs(name: &str, current: &str) -> Markup {
    let base = format!("/console/clusters/{}", segment(name));
    html! {
        nav.tabs aria-label="Cluster" {
            @for (tab, path, label) in [("overview", "", "Overview"), ("nodepools", "/nodepools", "Node pools"), ("workloads", "/workloads", "Nodes and workloads"), ("metrics", "/metrics", "Metrics")] {
                a href=(format!("{base}{path}")) aria-current=[(tab == current).then_some("page")] { (label) }
            }
        }
    }
}

/// The overview's facts, one element so a live update replaces it whole.
pub(crate) fn overview_facts(cluster: &serde_json::Value) -> Markup {
    let issues = cluster["health"]["issues"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    html! {
        dl.facts #overview {
            dt { "Status" } dd { (status(cluster["status"].as_str().unwrap_or("UNKNOWN"))) }
            @if let Some(reason) = cluster["statusReason"].as_str() { dt { "Status reason" } dd { (reason) } }
            @for issue in &issues {
                dt { "Health" } dd.error { (issue["code"].as_str().unwrap_or_default()) ": " (issue["message"].as_str().unwrap_or_default()) }
            }
            dt { "Kubernetes version" } dd { (cluster["version"].as_str().unwrap_or_default()) }
            dt { "API endpoint" } dd { code { (cluster["endpoint"].as_str().unwrap_or_default()) } }
            dt { "CA fingerprint (SHA-256)" } dd { code { (cluster["certificateAuthority"]["data"].as_str().and_then(ca_fingerprint).unwrap_or_default()) } }
            dt { "OIDC issuer" } dd { code { (cluster["identity"]["oidc"]["issuer"].as_str().unwrap_or_default()) } }
            dt { "ARN" } dd { code { (cluster["arn"].as_str().unwrap_or_default()) } }
            dt { "Service range" } dd { (cluster["kubernetesNetworkConfig"]["serviceIpv4Cidr"].as_str().unwrap_or_default()) }
            dt { "Pod range" } dd { (cluster["kubernetesNetworkConfig"]["podIpv4Cidr"].as_str().unwrap_or_default()) }
            dt { "Endpoint access" } dd {
                @if cluster["endpointAccess"]["public"] == true { "public " }
                @if cluster["endpointAccess"]["private"] == true { "private " }
            }
            dt { "Pod Security" } dd { (pod_security_text(cluster)) }
            dt { "Tags" } dd { (tags_text(cluster)) }
            @if let Some(region) = cluster["cloud"]["region"].as_str() { dt { "Cloud region" } dd { (region) } }
            dt { "Created" } dd { (time(cluster["createdAt"].as_str().unwrap_or_default())) }
        }
    }
}

async fn detail(signed: Signed, Path(name): Path<String>) -> Response {
    let upstream = signed.upstream();
    let cluster = match upstream
        .get(&format!("/v1/clusters/{}", segment(&name)))
        .await
    {
        Ok(answer) => answer["cluster"].clone(),
        Err(err) => return signed.failed(&err),
    };
    let base = format!("/console/clusters/{}", segment(&name));
    let body = html! {
        h1 { "Cluster " (name) }
        (cluster_tabs(&name, "overview"))
        div data-live=(format!("/console/live/clusters/{}", segment(&name))) #overview-live {
            (overview_facts(&cluster))
        }
        h2 { "Access" }
        p { "Download an administrator kubeconfig: "
            a href=(format!("{base}/kubeconfig?form=certificate")) download=(format!("{name}.kubeconfig")) { "with a client certificate" }
            " or "
            a href=(format!("{base}/kubeconfig?form=exec")) download=(format!("{name}-exec.kubeconfig")) { "running " code { "flotilla cluster token" } }
            " (as EKS kubeconfigs run " code { "aws eks get-token" } ")." }
        h2 { "Delete" }
        form.stacked method="post" action=(format!("{base}/delete")) {
            (csrf_field(&signed.session))
            label for="confirm" {
                span { "Type " strong { (name) } " to delete the cluster and everything in it" }
                input #confirm name="confirm" data-confirm=(name) autocomplete="off";
            }
            div.actions { button.danger type="submit" disabled { "Delete cluster" } }
        }
    };
    Html(
        page(
            Some(&signed.session),
            Section::Clusters,
            &format!("Cluster {name}"),
            body,
        )
        .into_string(),
    )
    .into_response()
}

/// An exec-credential kubeconfig whose user runs `flotilla cluster token NAME` (with the
/// user's own `FLOTILLA_CONFIG`).
fn exec_kubeconfig(name: &str, cluster: &serde_json::Value) -> String {
    let kubeconfig = flotilla_api_machinery::kubeconfig::exec_kubeconfig(
        name,
        &cluster["endpoint"],
        &cluster["certificateAuthority"]["data"],
        &"flotilla".into(),
        &["cluster", "token", name],
        &[],
    );
    serde_yaml::to_string(&kubeconfig).unwrap_or_default()
}

async fn kubeconfig(
    signed: Signed,
    Path(name): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let upstream = signed.upstream();
    let path = format!("/v1/clusters/{}", segment(&name));
    let text = if query.get("form").map(String::as_str) == Some("exec") {
        match upstream.get(&path).await {
            Ok(answer) => exec_kubeconfig(&name, &answer["cluster"]),
            Err(err) => return signed.failed(&err),
        }
    } else {
        match upstream
            .call_bytes(Method::GET, &format!("{path}/kubeconfig"), None)
            .await
        {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(err) => return signed.failed(&err),
        }
    };
    (
        [
            (http::header::CONTENT_TYPE, "application/yaml".to_string()),
            (
                http::header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}.kubeconfig\""),
            ),
            (http::header::CACHE_CONTROL, "no-store".to_string()),
        ],
        text,
    )
        .into_response()
}

async fn delete(
    signed: Signed,
    Path(name): Path<String>,
    axum::Form(fields): axum::Form<HashMap<String, String>>,
) -> Response {
    if let Some(refused) = signed.refuse_forged(&fields) {
        return refused;
    }
    if fields.get("confirm").map(|c| c.trim()) != Some(name.as_str()) {
        return signed.error(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!("Type the cluster's name ({name}) to delete it."),
        );
    }
    match signed
        .upstream()
        .call(
            Method::DELETE,
            &format!("/v1/clusters/{}", segment(&name)),
            None,
        )
        .await
    {
        Ok(_) => Redirect::to("/console/clusters").into_response(),
        Err(err) => signed.failed(&err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(pairs: &[(&str, &str)]) -> ClusterForm {
        ClusterForm::from_fields(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn the_form_becomes_the_apis_request_and_its_cli_and_terraform() {
        let form = form(&[
            ("name", "prod"),
            ("tags", "team=infra\ntier=gold"),
            ("endpoint_public", "on"),
            ("service_cidr", "10.100.0.0/16"),
            ("cloud_region", "us-east-1"),
            ("cloud_subnets", "subnet-1, subnet-2"),
        ]);
        let request = form.request().unwrap_or_default();
        assert_eq!(
            request,
            serde_json::json!({"name": "prod", "tags": {"team": "infra", "tier": "gold"},
                "endpointAccess": {"public": true, "private": false},
                "kubernetesNetworkConfig": {"serviceIpv4Cidr": "10.100.0.0/16"},
                "cloud": {"region": "us-east-1", "subnetIds": ["subnet-1", "subnet-2"]}})
        );
        let cli = form.cli();
        assert!(cli.starts_with("flotilla cluster create prod"), "{cli}");
        assert!(
            cli.contains("--service-cidr 10.100.0.0/16")
                && cli.contains("--subnet subnet-2")
                && cli.contains("--tag team=infra"),
            "{cli}"
        );
        let tf = form.terraform();
        assert!(
            tf.contains(r#"resource "flotilla_cluster" "prod""#)
                && tf.contains(r#"service_ipv4_cidr = "10.100.0.0/16""#),
            "{tf}"
        );
        assert!(
            tf.contains(r#"subnet_ids = ["subnet-1", "subnet-2"]"#),
            "{tf}"
        );
        assert_eq!(
            self::form(&[("name", "x"), ("tags", "novalue")])
                .request()
                .err()
                .map(|e| e.0),
            Some("tags")
        );
    }

    #[test]
    fn pod_security_reaches_the_request_the_previews_and_the_detail() {
        let form = form(&[
            ("name", "guarded"),
            ("endpoint_public", "on"),
            ("pod_security_enforce", "baseline"),
            ("pod_security_exempt_namespaces", "kube-system, monitoring"),
        ]);
        let request = form.request().unwrap_or_default();
        assert_eq!(
            request["podSecurity"],
            serde_json::json!({"defaults": {"enforce": "baseline"},
                "exemptions": {"namespaces": ["kube-system", "monitoring"]}})
        );
        let cli = form.cli();
        assert!(
            cli.contains("--pod-security-enforce baseline")
                && cli.contains("--pod-security-exempt-namespace monitoring"),
            "{cli}"
        );
        let tf = form.terraform();
        assert!(
            tf.contains("  pod_security {\n    enforce = \"baseline\"\n    exempt_namespaces = [\"kube-system\", \"monitoring\"]\n  }\n"),
            "{tf}"
        );
        let cluster = serde_json::json!({"podSecurity": {
            "defaults": {"enforce": "baseline", "enforce-version": "latest", "warn": "restricted",
                "warn-version": "v1.33", "audit": "privileged", "audit-version": "latest"},
            "exemptions": {"namespaces": ["kube-system"]}}});
        assert_eq!(
            pod_security_text(&cluster),
            "enforce baseline:latest, warn restricted:v1.33; exempt namespaces kube-system"
        );
        assert_eq!(
            field_of("podSecurity.defaults.enforce: Unsupported value: \"strict\""),
            Some("pod_security_enforce")
        );
    }

    #[test]
    fn api_messages_find_their_field() {
        assert_eq!(field_of(r#"cluster name "A" is invalid: …"#), Some("name"));
        assert_eq!(
            field_of(r#"serviceIpv4Cidr "x" is invalid"#),
            Some("service_cidr")
        );
        assert_eq!(field_of(r#"cluster "a" already exists"#), Some("name"));
        assert_eq!(field_of("something else"), None);
    }

    #[test]
    fn markup_escapes_what_users_typed() {
        let row = ClusterRow {
            cluster: serde_json::json!({"name": "prod", "status": "ACTIVE", "tags": {"team": "<script>alert(1)</script>"}}),
            pools: Vec::new(),
        };
        let html = cluster_row(&row).into_string();
        assert!(!html.contains("<script>"), "{html}");
        assert!(html.contains("&lt;script&gt;"), "{html}");
        let session = crate::session::Session::new("k".into(), Some("a".into()), 0);
        let page = form_body(
            &session,
            &form(&[("name", "\"><script>")]),
            Some(("name", "<b>bad</b>")),
        )
        .into_string();
        assert!(
            !page.contains("<script>") && !page.contains("<b>bad"),
            "{page}"
        );
    }

    #[test]
    fn the_ca_fingerprint_is_of_the_certificate() {
        use base64::Engine;
        let pem = "-----BEGIN CERTIFICATE-----\nAAEC\n-----END CERTIFICATE-----\n";
        let data = base64::engine::general_purpose::STANDARD.encode(pem);
        let expected = digest::digest(&digest::SHA256, &[0, 1, 2]);
        assert_eq!(
            ca_fingerprint(&data).map(|f| f.replace(':', "").to_lowercase()),
            Some(
                expected
                    .as_ref()
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<String>()
            )
        );
    }
}
