//! `apiservices.apiregistration.k8s.io` (upstream kube-aggregator): one local APIService per
//! group version a tenant serves — its built-in groups and its definitions' — each `Available`,
//! computed from the tenant's table on every request (upstream's autoregister controller
//! writes the same objects); and the APIServices the tenant writes, which name a Service
//! whose server serves the group version ([`remote`]) and which requests for it are proxied
//! to ([`proxy`]), as metrics-server's `metrics.k8s.io` is.

pub mod proxy;
pub mod remote;

use flotilla_api_machinery::field::{FieldError, Path};
use serde_json::{Value, json};

use crate::ApiServer;
use crate::error::ApiError;
use crate::resources::{ResourceInfo, Resources, Strategy, version_priority};
use crate::store::{ListOptions, ReadAt};
use crate::table::{Column, age_column, name_column};
use crate::tenants::TenantState;

/// Upstream's `groupPriorityMinimum` for the built-in groups it orders first (the rest of the
/// built-in groups get 17000 and definitions' groups 1000, as upstream's autoregister does).
fn group_priority(group: &str, custom: bool) -> i64 {
    match group {
        "" => 18000,
        "apps" => 17800,
        "events.k8s.io" => 17750,
        "authentication.k8s.io" => 17700,
        "authorization.k8s.io" => 17600,
        "autoscaling" => 17500,
        "batch" => 17400,
        "certificates.k8s.io" => 17300,
        "networking.k8s.io" => 17200,
        "policy" => 17100,
        "rbac.authorization.k8s.io" => 17000,
        "storage.k8s.io" => 16800,
        "apiextensions.k8s.io" => 16700,
        "admissionregistration.k8s.io" => 16700,
        "scheduling.k8s.io" => 16600,
        "coordination.k8s.io" => 16500,
        "node.k8s.io" => 16300,
        "discovery.k8s.io" => 16200,
        _ if custom => 1000,
        _ => 17000,
    }
}

/// The local APIServices of `table`, by name.
pub fn local_api_services(table: &Resources) -> Vec<Value> {
    let mut services: Vec<Value> = table
        .groups()
        .into_iter()
        .flat_map(|(group, versions)| {
            let custom = table.iter().any(|r| r.group == group && r.is_custom());
            let count = versions.len() as i64;
            versions
                .into_iter()
                .enumerate()
                .map(move |(rank, version)| {
                    json!({
                        "kind": "APIService", "apiVersion": "apiregistration.k8s.io/v1",
                        "metadata": {"name": format!("{version}.{group}"),
                                     "labels": {"kube-aggregator.kubernetes.io/automanaged": if custom { "true" } else { "onstart" }}},
                        "spec": {
                            "group": group, "version": version,
                            "groupPriorityMinimum": group_priority(group, custom),
                            // Versions were sorted newest first; the first has the highest priority.
                            "versionPriority": if custom { 100 - rank as i64 } else { 15 + count - rank as i64 },
                        },
                        "status": {"conditions": [{
                            "type": "Available", "status": "True", "reason": "Local",
                            "message": "Local APIServices are always available",
                        }]},
                    })
                })
        })
        .collect();
    services.sort_by(|a, b| {
        let key = |s: &Value| {
            (
                s["spec"]["group"].as_str().unwrap_or("").to_string(),
                std::cmp::Reverse(version_priority(
                    s["spec"]["version"].as_str().unwrap_or(""),
                )),
            )
        };
        key(a).cmp(&key(b))
    });
    services
}

/// The list, or the APIService named `name`: the local ones computed, the stored ones with
/// their last probe's `Available` condition.
pub async fn answer(
    server: &ApiServer,
    state: &TenantState,
    table: &Resources,
    resource: &ResourceInfo,
    name: Option<&str>,
) -> Result<Value, ApiError> {
    let local = local_api_services(table);
    let local_names: std::collections::HashSet<String> = local
        .iter()
        .map(|s| crate::meta::name(s).to_string())
        .collect();
    let is_local = |candidate: &str| local_names.contains(candidate);
    let stored = match name {
        Some(name) if is_local(name) => Vec::new(),
        Some(name) => vec![
            server
                .store
                .get(&state.tenant, resource, "", name, ReadAt::Latest)
                .await?,
        ],
        None => {
            server
                .store
                .list(&state.tenant, resource, None, &ListOptions::default())
                .await?
                .items
        }
    };
    let mut all = local;
    for mut service in stored {
        if is_local(crate::meta::name(&service)) {
            continue;
        }
        service["status"]["conditions"] = json!([with_status(server, state, &service).await]);
        all.push(service);
    }
    match name {
        None => {
            all.sort_by(|a, b| crate::meta::name(a).cmp(crate::meta::name(b)));
            Ok(
                json!({"kind": "APIServiceList", "apiVersion": "apiregistration.k8s.io/v1",
                "metadata": {}, "items": all}),
            )
        }
        Some(name) => all
            .into_iter()
            .find(|s| s["metadata"]["name"] == name)
            .ok_or_else(|| ApiError::not_found(&resource.group_resource(), name)),
    }
}

/// Before a write to the local APIService `name` of a replaceable built-in group
/// ([`crate::resources::REPLACEABLE_GROUPS`]): the object read back until then is stored, as
/// upstream's autoregister controller stores it, so that `kubectl apply` of metrics-server's
/// APIService patches it into one naming metrics-server's Service (which then takes the
/// group over).
pub async fn store_replaceable_local(
    server: &ApiServer,
    state: &TenantState,
    table: &Resources,
    resource: &ResourceInfo,
    name: &str,
) -> Result<(), ApiError> {
    let Some(local) = local_api_services(table).into_iter().find(|service| {
        crate::meta::name(service) == name
            && crate::resources::REPLACEABLE_GROUPS
                .iter()
                .any(|group| service["spec"]["group"] == *group)
    }) else {
        return Ok(());
    };
    let mut stored = local;
    if let Some(object) = stored.as_object_mut() {
        object.remove("status");
    }
    crate::tenants::create_if_absent(
        server,
        &state.tenant,
        resource,
        "",
        stored,
        &crate::store::WriteOptions::default(),
    )
    .await
}

/// A remote group's versions, each with what it was last found to serve (`None`: not
/// available).
pub type RemoteVersions = Vec<(String, Option<Value>)>;

/// The groups the tenant's remote APIServices serve (none of its own), each with its
/// versions by descending `versionPriority` and what each was last found to serve (`None`:
/// not available).
pub async fn remote_groups(
    server: &ApiServer,
    state: &TenantState,
    table: &Resources,
) -> Result<Vec<(String, RemoteVersions)>, ApiError> {
    let mut apis: Vec<remote::RemoteApi> = state
        .remote_apis
        .list(server, state)
        .await?
        .iter()
        .filter(|api| !table.iter().any(|r| r.group == api.group))
        .cloned()
        .collect();
    apis.sort_by(|a, b| {
        (
            std::cmp::Reverse(a.group_priority),
            &a.group,
            std::cmp::Reverse(a.version_priority),
        )
            .cmp(&(
                std::cmp::Reverse(b.group_priority),
                &b.group,
                std::cmp::Reverse(b.version_priority),
            ))
    });
    let mut groups: Vec<(String, RemoteVersions)> = Vec::new();
    for api in apis {
        let served = state.remote_apis.outcome(server, state, &api).await.ok();
        match groups.last_mut() {
            Some((group, versions)) if *group == api.group => {
                versions.push((api.version.clone(), served));
            }
            _ => groups.push((api.group.clone(), vec![(api.version.clone(), served)])),
        }
    }
    Ok(groups)
}

/// The `APIGroup` entry of a remote group (legacy discovery lists every version, available
/// or not, as upstream's aggregator does).
pub fn remote_group_entry(group: &str, versions: &[(String, Option<Value>)]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|(v, _)| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "versions": versions,
        "preferredVersion": versions.first().cloned().unwrap_or(Value::Null)})
}

/// The aggregated discovery entry of a remote group: its available versions' resources.
pub fn remote_group_discovery(group: &str, versions: &[(String, Option<Value>)]) -> Option<Value> {
    let versions: Vec<Value> = versions
        .iter()
        .filter_map(|(v, served)| {
            let list = served.as_ref()?;
            Some(
                json!({"version": v, "resources": remote::discovery_resources(list),
                "freshness": "Current"}),
            )
        })
        .collect();
    (!versions.is_empty()).then(
        || json!({"metadata": {"name": group, "creationTimestamp": null}, "versions": versions}),
    )
}

/// A stored APIService's `Available` condition: its probe's for one naming a Service; a
/// stored one naming none serves nothing here (this cluster's own groups are computed).
async fn with_status(server: &ApiServer, state: &TenantState, service: &Value) -> Value {
    match remote::RemoteApi::of(service) {
        Some(api) => {
            remote::available_condition(&state.remote_apis.outcome(server, state, &api).await)
        }
        None => json!({"type": "Available", "status": "False", "reason": "ServiceNotFound",
            "message": "no group version of this cluster is served locally by this name"}),
    }
}

/// The kind's table (upstream's printer): Service, Available, Age.
pub struct ApiServiceStrategy;

impl Strategy for ApiServiceStrategy {
    fn default(&self, obj: &mut Value) {
        if let Some(service) = obj["spec"]["service"].as_object_mut() {
            service.entry("port").or_insert(json!(443));
        }
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        validate_api_service(obj)
    }

    fn validate_update(&self, new: &Value, _old: &Value) -> Vec<FieldError> {
        validate_api_service(new)
    }

    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new(
                "Service",
                "string",
                "The reference to the service that hosts the API endpoint.",
                |s| match s["spec"]["service"].as_object() {
                    Some(service) => json!(format!(
                        "{}/{}",
                        service
                            .get("namespace")
                            .and_then(Value::as_str)
                            .unwrap_or(""),
                        service.get("name").and_then(Value::as_str).unwrap_or("")
                    )),
                    None => json!("Local"),
                },
            ),
            Column::new(
                "Available",
                "string",
                "Whether this service is available.",
                |s| {
                    let available = s["status"]["conditions"]
                        .as_array()
                        .and_then(|c| c.iter().find(|c| c["type"] == "Available"))
                        .map(|c| c["status"].as_str().unwrap_or("Unknown").to_string());
                    json!(available.unwrap_or_else(|| "Unknown".to_string()))
                },
            ),
            age_column(),
        ]
    }
}

/// Upstream's `ValidateAPIService`.
fn validate_api_service(obj: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let spec = &obj["spec"];
    let here = Path::new("spec");
    let group = spec["group"].as_str().unwrap_or("");
    let version = spec["version"].as_str().unwrap_or("");
    let name = crate::meta::name(obj);
    let expected = format!("{version}.{group}");
    if name != expected {
        errors.push(FieldError::invalid(
            &Path::new("metadata").child("name"),
            json!(name),
            format!("must be `spec.version+\".\"+spec.group`: {expected:?}"),
        ));
    }
    if group.is_empty() && version != "v1" {
        errors.push(FieldError::required(
            &here.child("group"),
            "only v1 may have an empty group and it better be legacy kube",
        ));
    }
    if !group.is_empty() {
        for message in flotilla_api_machinery::names::is_dns1123_subdomain(group) {
            errors.push(FieldError::invalid(
                &here.child("group"),
                json!(group),
                &message,
            ));
        }
    }
    if version.is_empty() {
        errors.push(FieldError::required(&here.child("version"), ""));
    } else {
        for message in flotilla_api_machinery::names::is_dns1123_label(version) {
            errors.push(FieldError::invalid(
                &here.child("version"),
                json!(version),
                &message,
            ));
        }
    }
    let priority = |field: &str, max: i64, errors: &mut Vec<FieldError>| {
        let value = spec[field].as_i64().unwrap_or(0);
        if value <= 0 || value > max {
            errors.push(FieldError::invalid(
                &here.child(field),
                json!(value),
                format!("must be positive and less than {max}"),
            ));
        }
    };
    priority("groupPriorityMinimum", 20000, &mut errors);
    priority("versionPriority", 1000, &mut errors);
    let ca_bundle = spec["caBundle"].as_str().unwrap_or("");
    let insecure = spec["insecureSkipTLSVerify"] == json!(true);
    match spec["service"].as_object() {
        None => {
            if !ca_bundle.is_empty() {
                errors.push(FieldError::invalid(
                    &here.child("caBundle"),
                    json!(ca_bundle),
                    "local APIServices may not have a caBundle",
                ));
            }
            if insecure {
                errors.push(FieldError::invalid(
                    &here.child("insecureSkipTLSVerify"),
                    json!(true),
                    "local APIServices may not have insecureSkipTLSVerify",
                ));
            }
        }
        Some(service) => {
            let service_path = here.child("service");
            for field in ["namespace", "name"] {
                if service
                    .get(field)
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    errors.push(FieldError::required(&service_path.child(field), ""));
                }
            }
            if let Some(port) = service.get("port").and_then(Value::as_i64)
                && !(1..=65535).contains(&port)
            {
                errors.push(FieldError::invalid(
                    &service_path.child("port"),
                    json!(port),
                    "port is not valid: must be between 1 and 65535, inclusive",
                ));
            }
            if insecure && !ca_bundle.is_empty() {
                errors.push(FieldError::invalid(
                    &here.child("insecureSkipTLSVerify"),
                    json!(true),
                    "may not be true if caBundle is present",
                ));
            }
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_served_group_version_is_a_local_available_api_service() {
        let services = local_api_services(&Resources::builtin());
        let names: Vec<&str> = services
            .iter()
            .filter_map(|s| s["metadata"]["name"].as_str())
            .collect();
        for expected in [
            "v1.",
            "v1.apps",
            "v2.autoscaling",
            "v1.apiextensions.k8s.io",
        ] {
            assert!(
                names.contains(&expected),
                "{expected} missing from {names:?}"
            );
        }
        let core = &services[0];
        assert_eq!(core["spec"]["groupPriorityMinimum"], 18000);
        assert_eq!(core["status"]["conditions"][0]["reason"], "Local");
    }

    #[test]
    fn api_services_are_validated_as_upstream_validates_them() {
        let good = json!({"metadata": {"name": "v1beta1.metrics.k8s.io"},
            "spec": {"group": "metrics.k8s.io", "version": "v1beta1",
                "service": {"namespace": "kube-system", "name": "metrics-server", "port": 443},
                "insecureSkipTLSVerify": true, "groupPriorityMinimum": 100, "versionPriority": 100}});
        assert!(validate_api_service(&good).is_empty());
        let mut bad = good.clone();
        bad["metadata"]["name"] = json!("metrics");
        bad["spec"]["caBundle"] = json!("Zm9v");
        bad["spec"]["versionPriority"] = json!(0);
        let errors: Vec<String> = validate_api_service(&bad)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            errors,
            [
                "metadata.name: Invalid value: \"metrics\": must be `spec.version+\".\"+spec.group`: \"v1beta1.metrics.k8s.io\"",
                "spec.versionPriority: Invalid value: 0: must be positive and less than 1000",
                "spec.insecureSkipTLSVerify: Invalid value: true: may not be true if caBundle is present",
            ]
        );
    }
}
