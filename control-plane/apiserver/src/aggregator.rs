//! `apiservices.apiregistration.k8s.io` (upstream kube-aggregator): one local APIService per
//! group version a tenant serves — its built-in groups and its definitions' — each `Available`,
//! computed from the tenant's table on every request (upstream's autoregister controller
//! writes the same objects). APIServices that proxy to a Service (metrics-server's
//! `metrics.k8s.io`) are not served yet: writes are refused.

use serde_json::{Value, json};

use crate::error::ApiError;
use crate::resources::{ResourceInfo, Resources, Strategy, version_priority};
use crate::table::{Column, age_column, name_column};

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

/// The list, or the APIService named `name`.
pub fn answer(
    table: &Resources,
    resource: &ResourceInfo,
    name: Option<&str>,
) -> Result<Value, ApiError> {
    let all = local_api_services(table);
    match name {
        None => Ok(
            json!({"kind": "APIServiceList", "apiVersion": "apiregistration.k8s.io/v1",
            "metadata": {}, "items": all}),
        ),
        Some(name) => all
            .into_iter()
            .find(|s| s["metadata"]["name"] == name)
            .ok_or_else(|| ApiError::not_found(&resource.group_resource(), name)),
    }
}

/// The kind's table (upstream's printer): Service, Available, Age.
pub struct ApiServiceStrategy;

impl Strategy for ApiServiceStrategy {
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
}
