//! The client commands (`account`, `cluster`, `nodepool`): build the request, call the
//! management API, wait when asked (with progress on standard error), print the result as a
//! table, JSON or YAML.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use http::Method;
use serde_json::{Value, json};

use flotilla_management::backup;

use crate::client::{ManagementClient, ServiceError};
use crate::{
    AccountCommand, ClientArgs, ClusterCommand, ClusterCreateArgs, NodePoolCommand,
    NodePoolCreateArgs, Output,
};

/// How often `--wait` polls.
const POLL: Duration = Duration::from_millis(500);
/// How long `--wait` waits before giving up.
const WAIT_TIMEOUT: Duration = Duration::from_secs(600);

/// `flotilla account …`.
pub async fn account(args: &ClientArgs, command: AccountCommand) -> anyhow::Result<()> {
    let client = args.client()?;
    match command {
        AccountCommand::Create { id } => {
            let key = client
                .call_json(Method::POST, "/v1/accounts", Some(&json!({ "id": id })))
                .await?;
            print_one(args.output, &key, &ACCOUNT_KEY_COLUMNS)
        }
        AccountCommand::List => {
            let list = client.call_json(Method::GET, "/v1/accounts", None).await?;
            print_many(args.output, &list, "accounts", &ACCOUNT_COLUMNS)
        }
        AccountCommand::Get { id } => {
            let answer = client
                .call_json(Method::GET, &format!("/v1/accounts/{id}"), None)
                .await?;
            print_one(args.output, &answer["account"], &ACCOUNT_COLUMNS)
        }
        AccountCommand::Delete { id } => {
            let answer = client
                .call_json(Method::DELETE, &format!("/v1/accounts/{id}"), None)
                .await?;
            print_one(args.output, &answer["account"], &ACCOUNT_COLUMNS)
        }
        AccountCommand::NewKey { id, rotate } => {
            let query = if rotate { "?rotate=true" } else { "" };
            let key = client
                .call_json(
                    Method::POST,
                    &format!("/v1/accounts/{id}/apikeys{query}"),
                    None,
                )
                .await?;
            print_one(args.output, &key, &ACCOUNT_KEY_COLUMNS)
        }
    }
}

/// The cluster of a create's or update's `answer`, or, with `--wait`, the cluster once it is
/// ACTIVE again.
async fn active_if(
    wait: bool,
    client: &flotilla_management_client::ManagementClient,
    name: &str,
    answer: &Value,
) -> anyhow::Result<Value> {
    if !wait {
        return Ok(answer["cluster"].clone());
    }
    wait_for(
        client,
        &format!("cluster {name}"),
        &cluster_path(name),
        "cluster",
        "ACTIVE",
    )
    .await
}

/// `flotilla cluster …`.
pub async fn cluster(args: &ClientArgs, command: ClusterCommand) -> anyhow::Result<()> {
    let client = args.client()?;
    match command {
        ClusterCommand::Create(create) => {
            let wait = create.wait;
            let name = create.name.clone();
            let policy = match &create.audit_policy_file {
                Some(file) => Some(audit_policy(file)?),
                None => None,
            };
            let mut request = cluster_request(*create);
            if let Some(policy) = policy {
                request["auditPolicy"] = policy;
            }
            let answer = client
                .call_json(Method::POST, "/v1/clusters", Some(&request))
                .await?;
            let cluster = active_if(wait, &client, &name, &answer).await?;
            print_one(args.output, &cluster, &CLUSTER_COLUMNS)
        }
        ClusterCommand::Update(update) => {
            let path = cluster_path(&update.name);
            let current = client.call_json(Method::GET, &path, None).await?;
            let mut request = cluster_update_request(&update, &current["cluster"]);
            if let Some(file) = &update.audit_policy_file {
                request["auditPolicy"] = audit_policy(file)?;
            }
            if update.remove_audit_policy {
                request["auditPolicy"] = Value::Null;
            }
            if request.as_object().is_none_or(|r| r.is_empty()) {
                anyhow::bail!(
                    "nothing to change: give --public-access-cidr, --tag, --remove-tag, an audit policy flag or a --pod-security-… flag"
                );
            }
            let answer = client
                .call_json(Method::PATCH, &path, Some(&request))
                .await?;
            let cluster = active_if(update.wait, &client, &update.name, &answer).await?;
            print_one(args.output, &cluster, &CLUSTER_COLUMNS)
        }
        ClusterCommand::List => {
            let list = client.call_json(Method::GET, "/v1/clusters", None).await?;
            print_many(args.output, &list, "clusters", &CLUSTER_COLUMNS)
        }
        ClusterCommand::Get { name } => {
            let answer = client
                .call_json(Method::GET, &cluster_path(&name), None)
                .await?;
            print_one(args.output, &answer["cluster"], &CLUSTER_COLUMNS)?;
            if args.output == Output::Table {
                print!("{}", health_issues(&answer["cluster"]));
            }
            Ok(())
        }
        ClusterCommand::Delete { name, wait } => {
            let answer = client
                .call_json(Method::DELETE, &cluster_path(&name), None)
                .await?;
            if wait {
                wait_until_gone(
                    &client,
                    &format!("cluster {name}"),
                    &cluster_path(&name),
                    "cluster",
                )
                .await?;
                eprintln!("cluster {name} deleted");
                return Ok(());
            }
            print_one(args.output, &answer["cluster"], &CLUSTER_COLUMNS)
        }
        ClusterCommand::Kubeconfig { name, file, exec } => {
            let text = if exec {
                exec_kubeconfig(&client, args, &name).await?
            } else {
                let config = client
                    .call(
                        Method::GET,
                        &format!("{}/kubeconfig", cluster_path(&name)),
                        None,
                    )
                    .await?;
                String::from_utf8(config.to_vec()).context("the kubeconfig is not UTF-8")?
            };
            match file {
                Some(path) => {
                    crate::private_files::write_private(&path, &text)?;
                    eprintln!("wrote {}", path.display());
                }
                None => print!("{text}"),
            }
            Ok(())
        }
        ClusterCommand::Backup { name, file } => {
            let bytes = client
                .call(
                    Method::GET,
                    &format!("{}/backup", cluster_path(&name)),
                    None,
                )
                .await?;
            // What arrived is checked before it is kept: a file on disk is a whole backup.
            let (header, _) = backup::format::read_header(&bytes)
                .with_context(|| format!("the backup of cluster {name} as received"))?;
            let mut partial = file.clone().into_os_string();
            partial.push(".partial");
            let partial = std::path::PathBuf::from(partial);
            crate::private_files::write_private(&partial, &bytes)?;
            std::fs::rename(&partial, &file)
                .with_context(|| format!("writing {}", file.display()))?;
            eprintln!(
                "wrote {}: cluster {} ({}) at revision {}, {} objects, {} bytes",
                file.display(),
                header.cluster.name,
                header.cluster.id,
                header.revision,
                header.objects,
                bytes.len()
            );
            Ok(())
        }
        ClusterCommand::Restore { file, name, wait } => {
            let bytes =
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            // Refused here, with the service's words, before it is sent.
            let (header, _) =
                backup::format::read_header(&bytes).with_context(|| file.display().to_string())?;
            let name = name.unwrap_or(header.cluster.name);
            let answer = client
                .call_bytes(
                    Method::POST,
                    &format!("{}/restore", cluster_path(&name)),
                    backup::format::MEDIA_TYPE,
                    bytes::Bytes::from(bytes),
                )
                .await?;
            let answer: Value = serde_json::from_slice(&answer)
                .context("the service answered with invalid JSON")?;
            let cluster = active_if(wait, &client, &name, &answer).await?;
            print_one(args.output, &cluster, &CLUSTER_COLUMNS)
        }
        ClusterCommand::Token { name } => {
            let answer = client
                .call_json(
                    Method::POST,
                    &format!("{}/token", cluster_path(&name)),
                    None,
                )
                .await?;
            let credential = json!({
                "apiVersion": "client.authentication.k8s.io/v1",
                "kind": "ExecCredential",
                "spec": {"interactive": false},
                "status": {
                    "token": answer["token"],
                    "expirationTimestamp": answer["expirationTimestamp"],
                },
            });
            println!("{}", serde_json::to_string(&credential)?);
            Ok(())
        }
    }
}

/// A kubeconfig whose user runs `flotilla cluster token NAME` with this client configuration.
async fn exec_kubeconfig(
    client: &ManagementClient,
    args: &ClientArgs,
    name: &str,
) -> anyhow::Result<String> {
    let Some(config) = &args.config else {
        bail!(
            "--exec needs the client configuration as a file: pass --config or set FLOTILLA_CONFIG"
        );
    };
    let config =
        std::fs::canonicalize(config).with_context(|| format!("resolving {}", config.display()))?;
    let program = std::env::current_exe().context("locating the flotilla binary")?;
    let described = client
        .call_json(Method::GET, &cluster_path(name), None)
        .await?;
    let cluster = &described["cluster"];
    let config = config.display().to_string();
    let kubeconfig = flotilla_api_machinery::kubeconfig::exec_kubeconfig(
        name,
        &cluster["endpoint"],
        &cluster["certificateAuthority"]["data"],
        &serde_json::json!(program),
        &["cluster", "token", name],
        &[("FLOTILLA_CONFIG", &config)],
    );
    Ok(serde_yaml::to_string(&kubeconfig)?)
}

/// `flotilla nodepool …`.
pub async fn node_pool(args: &ClientArgs, command: NodePoolCommand) -> anyhow::Result<()> {
    let client = args.client()?;
    match command {
        NodePoolCommand::Create(create) => {
            let wait = create.wait;
            let path = pool_path(&create.cluster, &create.name);
            let what = format!("node pool {}/{}", create.cluster, create.name);
            let request = node_pool_request(&create)?;
            let answer = client
                .call_json(
                    Method::POST,
                    &format!("{}/nodepools", cluster_path(&create.cluster)),
                    Some(&request),
                )
                .await?;
            let pool = if wait {
                wait_for(&client, &what, &path, "nodePool", "ACTIVE").await?
            } else {
                answer["nodePool"].clone()
            };
            print_one(args.output, &pool, &POOL_COLUMNS)
        }
        NodePoolCommand::List { cluster } => {
            let list = client
                .call_json(
                    Method::GET,
                    &format!("{}/nodepools", cluster_path(&cluster)),
                    None,
                )
                .await?;
            print_many(args.output, &list, "nodePools", &POOL_COLUMNS)
        }
        NodePoolCommand::Scale {
            cluster,
            name,
            desired,
            min,
            max,
            wait,
        } => {
            let path = pool_path(&cluster, &name);
            let current = client.call_json(Method::GET, &path, None).await?;
            let scaling = &current["nodePool"]["scalingConfig"];
            let size = |field: &str| {
                scaling[field]
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .unwrap_or(desired)
            };
            let (current_min, current_max) = (size("minSize"), size("maxSize"));
            let request = json!({ "scalingConfig": {
                "minSize": min.unwrap_or(current_min.min(desired)),
                "maxSize": max.unwrap_or(current_max.max(desired)),
                "desiredSize": desired,
            }});
            let answer = client
                .call_json(Method::PATCH, &path, Some(&request))
                .await?;
            let pool = if wait {
                wait_for(
                    &client,
                    &format!("node pool {cluster}/{name}"),
                    &path,
                    "nodePool",
                    "ACTIVE",
                )
                .await?
            } else {
                answer["nodePool"].clone()
            };
            print_one(args.output, &pool, &POOL_COLUMNS)
        }
        NodePoolCommand::Delete {
            cluster,
            name,
            wait,
        } => {
            let path = pool_path(&cluster, &name);
            let answer = client.call_json(Method::DELETE, &path, None).await?;
            if wait {
                let what = format!("node pool {cluster}/{name}");
                wait_until_gone(&client, &what, &path, "nodePool").await?;
                eprintln!("{what} deleted");
                return Ok(());
            }
            print_one(args.output, &answer["nodePool"], &POOL_COLUMNS)
        }
    }
}

fn cluster_path(name: &str) -> String {
    format!("/v1/clusters/{name}")
}

fn pool_path(cluster: &str, pool: &str) -> String {
    format!("/v1/clusters/{cluster}/nodepools/{pool}")
}

/// The cluster's `podSecurity` with the flags given applied over `current` (the cluster's, or
/// `{}` for a new one); `None` when no flag was given.
fn pod_security_request(args: &crate::PodSecurityArgs, current: &Value) -> Option<Value> {
    let mut defaults = current["defaults"].as_object().cloned().unwrap_or_default();
    let mut given = false;
    for (mode, flag) in [
        ("enforce", &args.pod_security_enforce),
        ("audit", &args.pod_security_audit),
        ("warn", &args.pod_security_warn),
    ] {
        if let Some(flag) = flag {
            given = true;
            let (level, version) = match flag.split_once(':') {
                Some((level, version)) => (level, Some(version)),
                None => (flag.as_str(), None),
            };
            defaults.insert(mode.into(), json!(level));
            match version {
                Some(version) => defaults.insert(format!("{mode}-version"), json!(version)),
                None => defaults.remove(&format!("{mode}-version")),
            };
        }
    }
    let mut exemptions = current["exemptions"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    if !args.pod_security_exempt_namespaces.is_empty() {
        given = true;
        exemptions.insert(
            "namespaces".into(),
            json!(args.pod_security_exempt_namespaces),
        );
    }
    given.then(|| json!({"defaults": defaults, "exemptions": exemptions}))
}

/// An audit policy file (YAML or JSON) as the JSON the management API takes; the service
/// checks its rules and names the field it refuses.
fn audit_policy(file: &std::path::Path) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("--audit-policy-file {}", file.display()))?;
    serde_yaml::from_str(&text)
        .with_context(|| format!("--audit-policy-file {}: not YAML or JSON", file.display()))
}

/// UpdateCluster's body for the flags given, the cluster being `current`.
fn cluster_update_request(args: &crate::ClusterUpdateArgs, current: &Value) -> Value {
    let mut request = json!({});
    if !args.public_access_cidrs.is_empty() {
        request["endpointAccess"] = json!({"publicAccessCidrs": args.public_access_cidrs});
    }
    if !args.tags.is_empty() || !args.remove_tags.is_empty() {
        let mut tags = serde_json::Map::new();
        for key in &args.remove_tags {
            tags.insert(key.clone(), Value::Null);
        }
        for (key, value) in &args.tags {
            tags.insert(key.clone(), json!(value));
        }
        request["tags"] = Value::Object(tags);
    }
    if let Some(pod_security) = pod_security_request(&args.pod_security, &current["podSecurity"]) {
        request["podSecurity"] = pod_security;
    }
    request
}

fn cluster_request(args: ClusterCreateArgs) -> Value {
    let mut request = json!({
        "name": args.name,
        "tags": args.tags.into_iter().collect::<std::collections::BTreeMap<_, _>>(),
        "kubernetesNetworkConfig": {},
        "cloud": {},
    });
    if let Some(version) = args.version {
        request["version"] = json!(version);
    }
    if let Some(cidr) = args.service_cidr {
        request["kubernetesNetworkConfig"]["serviceIpv4Cidr"] = json!(cidr);
    }
    if let Some(cidr) = args.pod_cidr {
        request["kubernetesNetworkConfig"]["podIpv4Cidr"] = json!(cidr);
    }
    if !args.public_access_cidrs.is_empty() {
        request["endpointAccess"] = json!({ "publicAccessCidrs": args.public_access_cidrs });
    }
    // Pod Security: only what was given; the service fills in upstream's defaults (and
    // refuses a level or version that does not exist, naming the field).
    if let Some(pod_security) = pod_security_request(&args.pod_security, &json!({})) {
        request["podSecurity"] = pod_security;
    }
    if let Some(region) = args.region {
        request["cloud"]["region"] = json!(region);
    }
    if !args.subnets.is_empty() {
        request["cloud"]["subnetIds"] = json!(args.subnets);
    }
    if let Some(endpoint) = args.cloud_endpoint {
        request["cloud"]["endpointOverride"] = json!(endpoint);
    }
    if let Some(vpc) = args.vpc_id {
        request["cloud"]["vpcId"] = json!(vpc);
    }
    if !args.security_groups.is_empty() {
        request["cloud"]["securityGroupIds"] = json!(args.security_groups);
    }
    if let Some(role) = args.role_arn {
        request["cloud"]["roleArn"] = json!(role);
    }
    if let Some(key) = args.cloud_access_key_id {
        request["cloud"]["credentials"] = json!({
            "accessKeyId": key,
            "secretAccessKey": args.cloud_secret_access_key,
        });
    }
    if let Some(token) = args.client_request_token {
        request["clientRequestToken"] = json!(token);
    }
    request
}

fn node_pool_request(args: &NodePoolCreateArgs) -> anyhow::Result<Value> {
    let taints = args
        .taints
        .iter()
        .map(|text| parse_taint(text))
        .collect::<anyhow::Result<Vec<Value>>>()?;
    let mut request = json!({
        "name": args.name,
        "instanceTypes": args.instance_types,
        "scalingConfig": { "minSize": args.min, "maxSize": args.max, "desiredSize": args.desired },
        "labels": args.labels.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
        "taints": taints,
        "subnets": args.subnets,
    });
    if let Some(image) = &args.image {
        request["imageId"] = json!(image);
    }
    if let Some(token) = &args.client_request_token {
        request["clientRequestToken"] = json!(token);
    }
    Ok(request)
}

/// `key[=value]:EFFECT`, kubectl taint's spelling with EKS's effect names.
fn parse_taint(text: &str) -> anyhow::Result<Value> {
    let Some((key_value, effect)) = text.rsplit_once(':') else {
        bail!("taint {text:?} must look like key[=value]:EFFECT");
    };
    let mut taint = json!({ "effect": effect });
    match key_value.split_once('=') {
        Some((key, value)) => {
            taint["key"] = json!(key);
            taint["value"] = json!(value);
        }
        None => taint["key"] = json!(key_value),
    }
    Ok(taint)
}

/// Polls `path` until its `field.status` is `wanted`, showing each status change on standard
/// error; a `FAILED` or `DEGRADED` status ends the wait with its reason.
async fn wait_for(
    client: &ManagementClient,
    what: &str,
    path: &str,
    field: &str,
    wanted: &str,
) -> anyhow::Result<Value> {
    let started = Instant::now();
    let mut last = String::new();
    loop {
        let answer = client.call_json(Method::GET, path, None).await?;
        let object = &answer[field];
        let status = object["status"].as_str().unwrap_or("UNKNOWN").to_string();
        if status != last {
            progress(what, &status, started);
            last = status.clone();
        }
        if status == wanted {
            return Ok(object.clone());
        }
        if status == "FAILED" || status == "DEGRADED" {
            let reason = object["statusReason"].as_str().unwrap_or("no reason given");
            bail!("{what} {status}: {reason}");
        }
        if started.elapsed() > WAIT_TIMEOUT {
            bail!(
                "{what} is still {status} after {} s",
                WAIT_TIMEOUT.as_secs()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Polls `path` until it answers 404, showing status changes on standard error.
async fn wait_until_gone(
    client: &ManagementClient,
    what: &str,
    path: &str,
    field: &str,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut last = String::new();
    loop {
        match client.call_json(Method::GET, path, None).await {
            Ok(answer) => {
                let status = answer[field]["status"]
                    .as_str()
                    .unwrap_or("UNKNOWN")
                    .to_string();
                if status != last {
                    progress(what, &status, started);
                    last = status;
                }
            }
            Err(err)
                if err
                    .downcast_ref::<ServiceError>()
                    .is_some_and(|e| e.status == http::StatusCode::NOT_FOUND) =>
            {
                return Ok(());
            }
            Err(err) => return Err(err),
        }
        if started.elapsed() > WAIT_TIMEOUT {
            bail!("{what} still exists after {} s", WAIT_TIMEOUT.as_secs());
        }
        tokio::time::sleep(POLL).await;
    }
}

fn progress(what: &str, status: &str, started: Instant) {
    eprintln!(
        "{what}: {status} ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
}

/// A table column: its heading and where its value is in the object.
type Column = (&'static str, &'static [&'static str]);

const CLUSTER_COLUMNS: [Column; 5] = [
    ("NAME", &["name"]),
    ("STATUS", &["status"]),
    ("VERSION", &["version"]),
    ("ENDPOINT", &["endpoint"]),
    ("CREATED", &["createdAt"]),
];
const POOL_COLUMNS: [Column; 7] = [
    ("NAME", &["name"]),
    ("STATUS", &["status"]),
    ("DESIRED", &["scalingConfig", "desiredSize"]),
    ("READY", &["readyNodes"]),
    ("MIN", &["scalingConfig", "minSize"]),
    ("MAX", &["scalingConfig", "maxSize"]),
    ("INSTANCE TYPES", &["instanceTypes"]),
];
const ACCOUNT_COLUMNS: [Column; 2] = [("ID", &["id"]), ("CREATED", &["createdAt"])];
const ACCOUNT_KEY_COLUMNS: [Column; 2] = [("ACCOUNT", &["accountId"]), ("API KEY", &["apiKey"])];

/// The `health.issues` of a cluster or node pool as lines under its table row (none when
/// healthy).
fn health_issues(object: &Value) -> String {
    let issues = object["health"]["issues"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    issues
        .iter()
        .map(|issue| {
            format!(
                "ISSUE {}: {}\n",
                cell(issue, &["code"]),
                cell(issue, &["message"])
            )
        })
        .collect()
}

fn print_one(output: Output, object: &Value, columns: &[Column]) -> anyhow::Result<()> {
    match output {
        Output::Table => print_table(std::slice::from_ref(object), columns),
        _ => print_document(output, object),
    }
}

fn print_many(
    output: Output,
    answer: &Value,
    field: &str,
    columns: &[Column],
) -> anyhow::Result<()> {
    match output {
        Output::Table => {
            let items = answer[field].as_array().cloned().unwrap_or_default();
            print_table(&items, columns)
        }
        _ => print_document(output, answer),
    }
}

fn print_document(output: Output, value: &Value) -> anyhow::Result<()> {
    let text = match output {
        Output::Yaml => serde_yaml::to_string(value)?,
        _ => format!("{}\n", serde_json::to_string_pretty(value)?),
    };
    std::io::stdout().write_all(text.as_bytes())?;
    Ok(())
}

fn cell(object: &Value, path: &[&str]) -> String {
    let value = path.iter().fold(object, |value, key| &value[*key]);
    match value {
        Value::Null => "<none>".to_string(),
        Value::String(text) => text.clone(),
        Value::Array(items) => items
            .iter()
            .map(|item| {
                item.as_str()
                    .map_or_else(|| item.to_string(), str::to_string)
            })
            .collect::<Vec<_>>()
            .join(","),
        other => other.to_string(),
    }
}

fn print_table(items: &[Value], columns: &[Column]) -> anyhow::Result<()> {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|item| columns.iter().map(|(_, path)| cell(item, path)).collect())
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, (heading, _))| {
            rows.iter()
                .map(|row| row[i].len())
                .chain([heading.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<&str>| {
        let mut text = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect::<Vec<_>>()
            .join("   ");
        text.truncate(text.trim_end().len());
        text
    };
    let mut out = String::new();
    out.push_str(&line(columns.iter().map(|(heading, _)| *heading).collect()));
    out.push('\n');
    for row in &rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    std::io::stdout().write_all(out.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_security_flags_become_the_clusters_pod_security() {
        #[derive(clap::Parser)]
        struct Create {
            #[command(flatten)]
            args: crate::ClusterCreateArgs,
        }
        use clap::Parser as _;
        let parsed = Create::parse_from([
            "create",
            "prod",
            "--pod-security-enforce=baseline:v1.33",
            "--pod-security-warn=restricted",
            "--pod-security-exempt-namespace=kube-system",
        ]);
        assert_eq!(
            cluster_request(parsed.args)["podSecurity"],
            json!({"defaults": {"enforce": "baseline", "enforce-version": "v1.33", "warn": "restricted"},
                "exemptions": {"namespaces": ["kube-system"]}})
        );
        let plain = Create::parse_from(["create", "prod"]);
        assert!(cluster_request(plain.args).get("podSecurity").is_none());
    }

    #[test]
    fn an_update_changes_only_what_its_flags_name() {
        #[derive(clap::Parser)]
        struct Update {
            #[command(flatten)]
            args: crate::ClusterUpdateArgs,
        }
        use clap::Parser as _;
        let current = json!({"podSecurity": {
            "defaults": {"enforce": "baseline", "enforce-version": "v1.30", "warn": "privileged"},
            "exemptions": {"namespaces": ["kube-system"], "usernames": ["ci"]}}});
        let parsed = Update::parse_from([
            "update",
            "prod",
            "--pod-security-warn=restricted",
            "--tag=tier=gold",
            "--remove-tag=owner",
        ]);
        assert_eq!(
            cluster_update_request(&parsed.args, &current),
            json!({"tags": {"owner": null, "tier": "gold"},
                "podSecurity": {
                    "defaults": {"enforce": "baseline", "enforce-version": "v1.30", "warn": "restricted"},
                    "exemptions": {"namespaces": ["kube-system"], "usernames": ["ci"]}}})
        );
        let nothing = Update::parse_from(["update", "prod"]);
        assert_eq!(cluster_update_request(&nothing.args, &current), json!({}));
    }

    #[test]
    fn taints_parse_with_and_without_a_value() -> anyhow::Result<()> {
        assert_eq!(
            parse_taint("dedicated=gpu:NO_SCHEDULE")?,
            json!({"key": "dedicated", "value": "gpu", "effect": "NO_SCHEDULE"})
        );
        assert_eq!(
            parse_taint("spot:NO_EXECUTE")?,
            json!({"key": "spot", "effect": "NO_EXECUTE"})
        );
        assert!(parse_taint("no-effect").is_err());
        Ok(())
    }

    #[test]
    fn health_issues_print_one_line_each() {
        let cluster = json!({"health": {"issues": [
            {"code": "NoLocalNodes", "message": "this machine lacks runc"},
            {"code": "Other", "message": "m"},
        ]}});
        assert_eq!(
            health_issues(&cluster),
            "ISSUE NoLocalNodes: this machine lacks runc\nISSUE Other: m\n"
        );
        assert_eq!(health_issues(&json!({"health": {"issues": []}})), "");
        assert_eq!(health_issues(&json!({})), "");
    }

    #[test]
    fn cells_show_nested_values_lists_and_absence() {
        let pool =
            json!({"scalingConfig": {"desiredSize": 3}, "instanceTypes": ["t3.small", "t3.large"]});
        assert_eq!(cell(&pool, &["scalingConfig", "desiredSize"]), "3");
        assert_eq!(cell(&pool, &["instanceTypes"]), "t3.small,t3.large");
        assert_eq!(cell(&pool, &["status"]), "<none>");
    }
}
