//! The Node authorizer for kubelets (`system:node:<name>` in `system:nodes`): a node reads
//! only the Secrets, ConfigMaps, PersistentVolumeClaims and service-account tokens of pods
//! bound to it, and uses upstream's node rules for the rest. What a node may change is the
//! NodeRestriction admission plugin's (`admission/node_restriction.rs`).

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

/// The node a request's user is, if it is one.
pub fn node_name(attributes: &Attributes) -> Option<&str> {
    node_of(&attributes.user)
}

/// The node `user` is, if it is one (`system:node:<name>` in `system:nodes`).
pub fn node_of(user: &rbac::UserInfo) -> Option<&str> {
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
    if !attributes.resource_request {
        return Ok(Some(rbac::rules_allow(attributes, &NODE_RULES)));
    }
    if attributes.api_group == "storage.k8s.io" && attributes.resource == "volumeattachments" {
        // Only attachments to this node (upstream's graph edge VolumeAttachment → Node).
        if attributes.verb != "get" || attributes.name.is_empty() {
            return Ok(Some(false));
        }
        let attachment = match server
            .resources
            .find("storage.k8s.io", "v1", "volumeattachments")
        {
            Some(resource) => server
                .store
                .get(
                    &state.tenant,
                    resource,
                    "",
                    &attributes.name,
                    ReadAt::Latest,
                )
                .await
                .ok(),
            None => None,
        };
        return Ok(Some(attachment.is_some_and(|a| {
            meta::str_at(&a, &["spec", "nodeName"]) == Some(node)
        })));
    }
    if !attributes.api_group.is_empty() {
        return Ok(Some(rbac::rules_allow(attributes, &NODE_RULES)));
    }
    if attributes.resource == "persistentvolumes" && attributes.subresource.is_empty() {
        // Only volumes bound to a claim a pod on this node uses.
        if attributes.verb != "get" || attributes.name.is_empty() {
            return Ok(Some(false));
        }
        return Ok(Some(
            volume_used_on_node(server, state, node, &attributes.name).await?,
        ));
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

/// Whether PersistentVolume `pv` is bound to a claim that a pod bound to `node` uses.
async fn volume_used_on_node(
    server: &ApiServer,
    state: &TenantState,
    node: &str,
    pv: &str,
) -> Result<bool, ApiError> {
    let Some(claims) = server.resources.find("", "v1", "persistentvolumeclaims") else {
        return Ok(false);
    };
    for pod in pods_on_node_in(server, state, None, node).await? {
        let namespace = meta::str_at(&pod, &["metadata", "namespace"]).unwrap_or("");
        for claim in claim_names(&pod) {
            let bound = server
                .store
                .get(&state.tenant, claims, namespace, claim, ReadAt::Latest)
                .await
                .ok()
                .is_some_and(|c| meta::str_at(&c, &["spec", "volumeName"]) == Some(pv));
            if bound {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// The claims a pod's volumes name.
fn claim_names(pod: &Value) -> Vec<&str> {
    volumes(&pod["spec"])
        .filter_map(|v| v["persistentVolumeClaim"]["claimName"].as_str())
        .collect()
}

/// Pods of `namespace` bound to `node`.
async fn pods_on_node(
    server: &ApiServer,
    state: &TenantState,
    namespace: &str,
    node: &str,
) -> Result<Vec<Value>, ApiError> {
    pods_on_node_in(server, state, Some(namespace), node).await
}

/// Pods of `namespace` (all namespaces for `None`) bound to `node`.
async fn pods_on_node_in(
    server: &ApiServer,
    state: &TenantState,
    namespace: Option<&str>,
    node: &str,
) -> Result<Vec<Value>, ApiError> {
    let Some(pods) = server.resources.find("", "v1", "pods") else {
        return Ok(Vec::new());
    };
    let page = server
        .store
        .list(&state.tenant, pods, namespace, &ListOptions::default())
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

pub(crate) fn volumes(spec: &Value) -> impl Iterator<Item = &Value> {
    spec["volumes"].as_array().into_iter().flatten()
}

pub(crate) fn containers(spec: &Value) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .into_iter()
        .flat_map(|key| spec[key].as_array().into_iter().flatten())
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
    fn a_pod_claims_what_its_volumes_name() {
        assert_eq!(
            claim_names(&json!({"spec": {"volumes": [
            {"name": "a", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "b", "emptyDir": {}}]}})),
            ["data"]
        );
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
