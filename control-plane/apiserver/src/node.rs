//! The Node authorizer and the NodeRestriction admission rules for kubelets
//! (`system:node:<name>` in `system:nodes`): a node reads only the Secrets, ConfigMaps,
//! PersistentVolumeClaims and service-account tokens of pods bound to it, uses upstream's
//! node rules for the rest, and changes only its own Node, its own Lease and pods bound to it.

use std::sync::LazyLock;

use flotilla_api_machinery::rbac::{self, Attributes};
use k8s_openapi::api::rbac::v1::PolicyRule;
use serde_json::Value;

use crate::ApiServer;
use crate::error::ApiError;
use crate::meta;
use crate::store::{ListOptions, ReadAt};
use crate::tenants::TenantState;

/// The group of every kubelet.
pub const NODES_GROUP: &str = rbac::NODES_GROUP;
const NODE_USER_PREFIX: &str = "system:node:";

/// The static rules the Node authorizer grants nodes (upstream `bootstrappolicy.NodeRules`).
static NODE_RULES: LazyLock<Vec<PolicyRule>> = LazyLock::new(|| {
    rbac::bootstrap_cluster_roles()
        .into_iter()
        .find(|role| role.metadata.name.as_deref() == Some("system:node"))
        .and_then(|role| role.rules)
        .unwrap_or_default()
});

/// Where the client CA is published (upstream's `extension-apiserver-authentication`); every
/// node may read it, since its kubelet verifies the API server's client certificate with it.
pub const CLIENT_CA_CONFIGMAP: (&str, &str) = ("kube-system", "extension-apiserver-authentication");

/// The node a user is, if it is one (`system:node:<name>` in `system:nodes`).
pub fn node_name(attributes: &Attributes) -> Option<&str> {
    let user = &attributes.user;
    if !user.groups.iter().any(|g| g == NODES_GROUP) {
        return None;
    }
    user.name
        .strip_prefix(NODE_USER_PREFIX)
        .filter(|name| !name.is_empty())
}

/// Upstream's Node authorizer: `Some(allowed)` for a node's request, `None` for anyone else.
pub async fn authorize(
    server: &ApiServer,
    state: &TenantState,
    attributes: &Attributes,
) -> Result<Option<bool>, ApiError> {
    let Some(node) = node_name(attributes) else {
        return Ok(None);
    };
    if !attributes.resource_request || !attributes.api_group.is_empty() {
        return Ok(Some(rbac::rules_allow(attributes, &NODE_RULES)));
    }
    let graph_kind = matches!(
        (
            attributes.resource.as_str(),
            attributes.subresource.as_str()
        ),
        ("secrets" | "configmaps" | "persistentvolumeclaims", "") | ("serviceaccounts", "token")
    );
    if !graph_kind {
        return Ok(Some(rbac::rules_allow(attributes, &NODE_RULES)));
    }
    // Only single named objects, read (or, for tokens, created), and only what a pod bound
    // to this node refers to.
    let verb_ok = if attributes.subresource == "token" {
        attributes.verb == "create"
    } else {
        matches!(attributes.verb.as_str(), "get" | "list" | "watch")
    };
    if !verb_ok || attributes.name.is_empty() {
        return Ok(Some(false));
    }
    if attributes.resource == "configmaps"
        && attributes.verb == "get"
        && (attributes.namespace.as_str(), attributes.name.as_str()) == CLIENT_CA_CONFIGMAP
    {
        return Ok(Some(true));
    }
    let pods = pods_on_node(server, state, &attributes.namespace, node).await?;
    Ok(Some(pods.iter().any(|pod| {
        references(pod, &attributes.resource, &attributes.name)
    })))
}

/// Pods of `namespace` bound to `node`.
async fn pods_on_node(
    server: &ApiServer,
    state: &TenantState,
    namespace: &str,
    node: &str,
) -> Result<Vec<Value>, ApiError> {
    let Some(pods) = server.resources.find("", "v1", "pods") else {
        return Ok(Vec::new());
    };
    let page = server
        .store
        .list(
            &state.tenant,
            pods,
            Some(namespace),
            &ListOptions::default(),
        )
        .await?;
    Ok(page
        .items
        .into_iter()
        .filter(|pod| meta::str_at(pod, &["spec", "nodeName"]) == Some(node))
        .collect())
}

/// Whether `pod` refers to the `resource` named `name` (volumes, projected sources, env,
/// envFrom, image pull secrets, its service account) — upstream's node graph edges.
pub fn references(pod: &Value, resource: &str, name: &str) -> bool {
    let spec = &pod["spec"];
    let named = |value: &Value| value.as_str() == Some(name);
    match resource {
        "serviceaccounts" => spec["serviceAccountName"].as_str().unwrap_or("default") == name,
        "persistentvolumeclaims" => {
            volumes(spec).any(|volume| named(&volume["persistentVolumeClaim"]["claimName"]))
        }
        "secrets" | "configmaps" => {
            let (volume_key, source_key, ref_key, key_ref) = if resource == "secrets" {
                ("secret", "secret", "secretRef", "secretKeyRef")
            } else {
                ("configMap", "configMap", "configMapRef", "configMapKeyRef")
            };
            let volume_name_key = if resource == "secrets" {
                "secretName"
            } else {
                "name"
            };
            let in_volumes = volumes(spec).any(|volume| {
                named(&volume[volume_key][volume_name_key])
                    || volume["projected"]["sources"]
                        .as_array()
                        .is_some_and(|sources| {
                            sources
                                .iter()
                                .any(|source| named(&source[source_key]["name"]))
                        })
            });
            let in_containers = containers(spec).any(|container| {
                container["envFrom"]
                    .as_array()
                    .is_some_and(|list| list.iter().any(|from| named(&from[ref_key]["name"])))
                    || container["env"].as_array().is_some_and(|list| {
                        list.iter()
                            .any(|env| named(&env["valueFrom"][key_ref]["name"]))
                    })
            });
            let pull_secret = resource == "secrets"
                && spec["imagePullSecrets"]
                    .as_array()
                    .is_some_and(|list| list.iter().any(|s| named(&s["name"])));
            in_volumes || in_containers || pull_secret
        }
        _ => false,
    }
}

fn volumes(spec: &Value) -> impl Iterator<Item = &Value> {
    spec["volumes"].as_array().into_iter().flatten()
}

fn containers(spec: &Value) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .into_iter()
        .flat_map(|key| spec[key].as_array().into_iter().flatten())
}

/// NodeRestriction: what a node may change, with upstream's messages. Runs after
/// authorization, with the request body (`body`, parsed when the request has one).
pub async fn admit(
    server: &ApiServer,
    state: &TenantState,
    attributes: &Attributes,
    body: Option<&Value>,
) -> Result<(), ApiError> {
    let Some(node) = node_name(attributes) else {
        return Ok(());
    };
    if !attributes.resource_request || matches!(attributes.verb.as_str(), "get" | "list" | "watch")
    {
        return Ok(());
    }
    let forbidden = |message: String| crate::authz::forbidden_because(attributes, &message);
    match (attributes.api_group.as_str(), attributes.resource.as_str()) {
        ("", "nodes") => {
            let target = if attributes.name.is_empty() {
                body.map(meta::name).unwrap_or("")
            } else {
                attributes.name.as_str()
            };
            if target != node {
                return Err(forbidden(format!(
                    "node \"{node}\" is not allowed to modify node \"{target}\""
                )));
            }
        }
        ("coordination.k8s.io", "leases") => {
            let target = if attributes.name.is_empty() {
                body.map(meta::name).unwrap_or("")
            } else {
                attributes.name.as_str()
            };
            if attributes.namespace != "kube-node-lease" || target != node {
                return Err(forbidden(
                    "can only access node lease with the same name as the requesting node".into(),
                ));
            }
        }
        ("", "pods") => match (attributes.verb.as_str(), attributes.subresource.as_str()) {
            ("create", "") => {
                let pod = body.cloned().unwrap_or(Value::Null);
                let mirror =
                    !pod["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_null();
                if !mirror {
                    return Err(forbidden(
                        "pod does not have \"kubernetes.io/config.mirror\" annotation, node \"{node}\" can only create mirror pods"
                            .replace("{node}", node),
                    ));
                }
                if meta::str_at(&pod, &["spec", "nodeName"]) != Some(node) {
                    return Err(forbidden(format!(
                        "node \"{node}\" can only create pods with spec.nodeName set to itself"
                    )));
                }
            }
            ("create", "eviction") | ("update" | "patch", "status") | ("delete", "") => {
                let bound = match server.resources.find("", "v1", "pods") {
                    Some(pods) => server
                        .store
                        .get(
                            &state.tenant,
                            pods,
                            &attributes.namespace,
                            &attributes.name,
                            ReadAt::Latest,
                        )
                        .await
                        .ok()
                        .and_then(|pod| {
                            meta::str_at(&pod, &["spec", "nodeName"]).map(String::from)
                        }),
                    None => None,
                };
                if bound.as_deref() != Some(node) {
                    let what = match attributes.verb.as_str() {
                        "delete" => "delete pods",
                        "create" => "evict pods",
                        _ => "update pod status for pods",
                    };
                    return Err(forbidden(format!(
                        "node \"{node}\" can only {what} with spec.nodeName set to itself"
                    )));
                }
            }
            _ => {}
        },
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_pod_refers_to_what_it_mounts_and_reads_only() {
        let pod = json!({"spec": {
            "nodeName": "n1",
            "serviceAccountName": "web",
            "volumes": [
                {"name": "a", "secret": {"secretName": "tls"}},
                {"name": "b", "configMap": {"name": "settings"}},
                {"name": "c", "persistentVolumeClaim": {"claimName": "data"}},
                {"name": "d", "projected": {"sources": [{"secret": {"name": "projected-secret"}}]}},
            ],
            "imagePullSecrets": [{"name": "registry"}],
            "containers": [{"name": "app",
                "envFrom": [{"configMapRef": {"name": "env-cm"}}],
                "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "env-secret", "key": "k"}}}]}],
        }});
        for (resource, name) in [
            ("secrets", "tls"),
            ("secrets", "projected-secret"),
            ("secrets", "registry"),
            ("secrets", "env-secret"),
            ("configmaps", "settings"),
            ("configmaps", "env-cm"),
            ("persistentvolumeclaims", "data"),
            ("serviceaccounts", "web"),
        ] {
            assert!(references(&pod, resource, name), "{resource}/{name}");
        }
        for (resource, name) in [
            ("secrets", "settings"),
            ("configmaps", "tls"),
            ("secrets", "other"),
            ("serviceaccounts", "default"),
        ] {
            assert!(!references(&pod, resource, name), "{resource}/{name}");
        }
    }

    #[test]
    fn only_node_users_are_nodes() {
        let attributes = |name: &str, groups: &[&str]| Attributes {
            user: rbac::UserInfo::new(name, groups),
            ..Default::default()
        };
        assert_eq!(
            node_name(&attributes("system:node:n1", &[NODES_GROUP])),
            Some("n1")
        );
        assert_eq!(node_name(&attributes("system:node:n1", &[])), None);
        assert_eq!(node_name(&attributes("alice", &[NODES_GROUP])), None);
        assert_eq!(node_name(&attributes("system:node:", &[NODES_GROUP])), None);
    }
}
