//! Discovery documents: `/version`, `/api`, `/apis`, per-group lists and aggregated
//! discovery (`apidiscovery.k8s.io/v2`), all derived from the resource table.

use serde_json::{Value, json};

use crate::resources::{ResourceInfo, Resources};

/// The Kubernetes version this server speaks (matches the k8s-openapi feature it is built with).
pub const KUBERNETES_MINOR: &str = "33";

/// The media type of an aggregated discovery answer.
pub const AGGREGATED_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// `/version`.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": KUBERNETES_MINOR,
        "gitVersion": format!("v1.{KUBERNETES_MINOR}.0-flotilla"),
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
        "goVersion": "rust",
        "compiler": "rustc",
        "platform": "linux/amd64",
    })
}

fn verbs(resource: &ResourceInfo) -> Vec<&'static str> {
    if resource.create_only {
        return vec!["create"];
    }
    if resource.computed {
        return vec!["get", "list"];
    }
    let mut verbs = vec!["create", "delete"];
    if resource.kind != "Namespace" {
        verbs.push("deletecollection");
    }
    verbs.extend(["get", "list", "patch", "update", "watch"]);
    verbs
}

/// (subresource, response group, version, kind, verbs) for each subresource of a resource.
pub(crate) fn subresources(
    resource: &ResourceInfo,
) -> Vec<(&'static str, &str, &str, &str, Vec<&'static str>)> {
    let read_write = || vec!["get", "patch", "update"];
    let mut out: Vec<(&'static str, &str, &str, &str, Vec<&'static str>)> = Vec::new();
    if resource.status_subresource {
        out.push((
            "status",
            &resource.group,
            &resource.version,
            &resource.kind,
            read_write(),
        ));
    }
    if resource.scale.is_some() {
        out.push(("scale", "autoscaling", "v1", "Scale", read_write()));
    }
    if resource.kind == "Pod" && resource.group.is_empty() {
        out.push(("binding", "", "v1", "Binding", vec!["create"]));
        out.push(("ephemeralcontainers", "", "v1", "Pod", read_write()));
        out.push(("resize", "", "v1", "Pod", read_write()));
        out.push(("eviction", "policy", "v1", "Eviction", vec!["create"]));
        // Served by the pod's kubelet through the API server (see `kubelet`).
        out.push(("log", "", "v1", "Pod", vec!["get"]));
        out.push(("exec", "", "v1", "PodExecOptions", vec!["create", "get"]));
        out.push((
            "attach",
            "",
            "v1",
            "PodAttachOptions",
            vec!["create", "get"],
        ));
        out.push((
            "portforward",
            "",
            "v1",
            "PodPortForwardOptions",
            vec!["create", "get"],
        ));
    }
    // Served by the pod, a Service endpoint or the node through the API server (`proxy`).
    let proxy_options = match (&*resource.group, &*resource.kind) {
        ("", "Pod") => Some("PodProxyOptions"),
        ("", "Service") => Some("ServiceProxyOptions"),
        ("", "Node") => Some("NodeProxyOptions"),
        _ => None,
    };
    if let Some(kind) = proxy_options {
        out.push((
            "proxy",
            "",
            "v1",
            kind,
            vec!["create", "delete", "get", "patch", "update"],
        ));
    }
    if resource.kind == "CertificateSigningRequest" {
        out.push((
            "approval",
            &resource.group,
            &resource.version,
            &resource.kind,
            read_write(),
        ));
    }
    if resource.kind == "Namespace" {
        out.push(("finalize", "", "v1", "Namespace", vec!["update"]));
    }
    if resource.kind == "ServiceAccount" {
        out.push((
            "token",
            "authentication.k8s.io",
            "v1",
            "TokenRequest",
            vec!["create"],
        ));
    }
    out
}

/// `/api`: the legacy core versions.
pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_entry(group: &str, versions: &[&str]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "versions": versions, "preferredVersion": versions.first().cloned().unwrap_or(Value::Null)})
}

/// `/apis`: the named groups.
pub fn api_group_list(resources: &Resources) -> Value {
    let groups: Vec<Value> = resources
        .groups()
        .into_iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, versions)| group_entry(g, &versions))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/{group}`.
pub fn api_group(resources: &Resources, group: &str) -> Option<Value> {
    let (_, versions) = resources
        .groups()
        .into_iter()
        .find(|(g, _)| *g == group && !g.is_empty())?;
    let mut entry = group_entry(group, &versions);
    entry["kind"] = json!("APIGroup");
    entry["apiVersion"] = json!("v1");
    Some(entry)
}

/// `/api/v1` or `/apis/{group}/{version}`: the resources of one group version.
pub fn api_resource_list(resources: &Resources, group: &str, version: &str) -> Option<Value> {
    let mut list = Vec::new();
    for r in resources
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let mut entry = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": verbs(r),
        });
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            entry["categories"] = json!(r.categories);
        }
        list.push(entry);
        for (sub, g, v, kind, verbs) in subresources(r) {
            let mut entry = json!({
                "name": format!("{}/{sub}", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": kind,
                "verbs": verbs,
            });
            if g != group || v != version {
                entry["group"] = json!(g);
                entry["version"] = json!(v);
            }
            list.push(entry);
        }
    }
    if list.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": list}),
    )
}

fn discovery_resources(resources: &Resources, group: &str, version: &str) -> Vec<Value> {
    resources
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .map(|r| {
            let mut entry = json!({
                "resource": r.plural,
                "responseKind": {"group": r.group, "version": r.version, "kind": r.kind},
                "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
                "singularResource": r.singular,
                "verbs": verbs(r),
            });
            if !r.short_names.is_empty() {
                entry["shortNames"] = json!(r.short_names);
            }
            if !r.categories.is_empty() {
                entry["categories"] = json!(r.categories);
            }
            let subs: Vec<Value> = subresources(r)
                .into_iter()
                .map(|(sub, g, v, kind, verbs)| {
                    json!({"subresource": sub, "responseKind": {"group": g, "version": v, "kind": kind}, "verbs": verbs})
                })
                .collect();
            if !subs.is_empty() {
                entry["subresources"] = json!(subs);
            }
            entry
        })
        .collect()
}

/// Aggregated discovery for `/api` (`core == true`) or `/apis`.
pub fn aggregated(resources: &Resources, core: bool) -> Value {
    let items: Vec<Value> = resources
        .groups()
        .into_iter()
        .filter(|(g, _)| g.is_empty() == core)
        .map(|(g, versions)| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|v| json!({"version": v, "resources": discovery_resources(resources, g, v), "freshness": "Current"}))
                .collect();
            let metadata = if g.is_empty() { json!({"creationTimestamp": null}) } else { json!({"name": g, "creationTimestamp": null}) };
            json!({"metadata": metadata, "versions": versions})
        })
        .collect();
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

/// Whether an `Accept` header asks for aggregated discovery v2.
pub fn wants_aggregated(accept: &str) -> bool {
    accept.split(',').any(|media| {
        let params: Vec<&str> = media.split(';').map(str::trim).collect();
        params.contains(&"g=apidiscovery.k8s.io")
            && params.contains(&"v=v2")
            && params.contains(&"as=APIGroupDiscoveryList")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_list_has_pods_and_their_subresources() {
        let resources = Resources::builtin();
        let list = api_resource_list(&resources, "", "v1").expect("core v1");
        let names: Vec<&str> = list["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["name"].as_str())
            .collect();
        for want in [
            "pods",
            "pods/status",
            "pods/binding",
            "pods/eviction",
            "pods/log",
            "pods/exec",
            "pods/attach",
            "pods/portforward",
            "pods/proxy",
            "namespaces",
            "namespaces/finalize",
            "services",
            "services/proxy",
            "nodes/proxy",
        ] {
            assert!(names.contains(&want), "{want} missing");
        }
    }

    #[test]
    fn aggregated_accept_header_is_recognised() {
        assert!(wants_aggregated(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
        ));
        assert!(!wants_aggregated("application/json"));
    }
}
