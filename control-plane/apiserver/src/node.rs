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
        ("", "serviceaccounts")
            if attributes.verb == "create" && attributes.subresource == "token" =>
        {
            let reference = body
                .map(|b| b["spec"]["boundObjectRef"].clone())
                .unwrap_or(Value::Null);
            let pod_name = token_binding(&reference).map_err(|m| forbidden(m.into()))?;
            let pods = server
                .resources
                .find("", "v1", "pods")
                .ok_or_else(ApiError::no_such_path)?;
            let pod = server
                .store
                .get(
                    &state.tenant,
                    pods,
                    &attributes.namespace,
                    pod_name,
                    ReadAt::Latest,
                )
                .await?;
            token_pod(&reference, &pod, node).map_err(forbidden)?;
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
                let node_uid = match server.resources.find("", "v1", "nodes") {
                    Some(nodes) => server
                        .store
                        .get(&state.tenant, nodes, "", node, ReadAt::Latest)
                        .await
                        .ok()
                        .and_then(|n| meta::str_at(&n, &["metadata", "uid"]).map(String::from)),
                    None => None,
                };
                mirror_pod_refusal(&pod, node, node_uid.as_deref()).map_err(forbidden)?;
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

/// NodeRestriction on a mirror pod a node creates (upstream `admitPodCreate`, its
/// messages): owned by that Node alone, as controller, and referring to no other API object.
pub fn mirror_pod_refusal(pod: &Value, node: &str, node_uid: Option<&str>) -> Result<(), String> {
    let owners = pod["metadata"]["ownerReferences"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let owner = match owners.as_slice() {
        [] => {
            return Err(format!(
                "node \"{node}\" can only create pods with an owner reference set to itself"
            ));
        }
        [owner] => owner,
        _ => {
            return Err(format!(
                "node \"{node}\" can only create pods with a single owner reference set to itself"
            ));
        }
    };
    if owner["apiVersion"] != "v1" || owner["kind"] != "Node" || owner["name"] != node {
        return Err(format!(
            "node \"{node}\" can only create pods with an owner reference set to itself"
        ));
    }
    if owner["controller"] != true {
        return Err(format!(
            "node \"{node}\" can only create pods with a controller owner reference set to itself"
        ));
    }
    if owner["blockOwnerDeletion"] == true {
        return Err(format!(
            "node \"{node}\" must not set blockOwnerDeletion on an owner reference"
        ));
    }
    let owner_uid = owner["uid"].as_str().unwrap_or_default();
    if node_uid != Some(owner_uid) {
        return Err(format!(
            "node {node} UID mismatch: expected {} got {owner_uid}",
            node_uid.unwrap_or_default()
        ));
    }
    let spec = &pod["spec"];
    if !spec["serviceAccountName"]
        .as_str()
        .unwrap_or_default()
        .is_empty()
    {
        return Err(format!(
            "node \"{node}\" can not create pods that reference a service account"
        ));
    }
    let references = |kind: &str| {
        let (volume_key, env_ref, env_from) = match kind {
            "secrets" => ("secret", "secretKeyRef", "secretRef"),
            _ => ("configMap", "configMapKeyRef", "configMapRef"),
        };
        let in_volumes = volumes(spec).any(|v| {
            !v[volume_key].is_null()
                || v["projected"]["sources"]
                    .as_array()
                    .is_some_and(|s| s.iter().any(|s| !s[volume_key].is_null()))
        });
        let in_containers = containers(spec).any(|c| {
            c["envFrom"]
                .as_array()
                .is_some_and(|l| l.iter().any(|e| !e[env_from].is_null()))
                || c["env"]
                    .as_array()
                    .is_some_and(|l| l.iter().any(|e| !e["valueFrom"][env_ref].is_null()))
        });
        let pull_secrets = kind == "secrets"
            && spec["imagePullSecrets"]
                .as_array()
                .is_some_and(|l| !l.is_empty());
        in_volumes || in_containers || pull_secrets
    };
    for kind in ["secrets", "configmaps"] {
        if references(kind) {
            return Err(format!(
                "node \"{node}\" can not create pods that reference {kind}"
            ));
        }
    }
    if volumes(spec).any(|v| !v["persistentVolumeClaim"].is_null()) {
        return Err(format!(
            "node \"{node}\" can not create pods that reference persistentvolumeclaims"
        ));
    }
    Ok(())
}

/// NodeRestriction on a node's TokenRequest: it must be bound to a pod by name and UID
/// (upstream's messages); returns the pod's name.
pub fn token_binding(reference: &Value) -> Result<&str, &'static str> {
    let name = reference["name"].as_str().unwrap_or("");
    if reference["apiVersion"].as_str() != Some("v1")
        || reference["kind"].as_str() != Some("Pod")
        || name.is_empty()
    {
        return Err("node requested token not bound to a pod");
    }
    if reference["uid"].as_str().unwrap_or("").is_empty() {
        return Err("node requested token with a pod binding without a uid");
    }
    Ok(name)
}

/// NodeRestriction on a node's TokenRequest, given the pod it is bound to: the same pod
/// (by UID), scheduled on this node.
pub fn token_pod(reference: &Value, pod: &Value, node: &str) -> Result<(), String> {
    let uid = reference["uid"].as_str().unwrap_or("");
    if uid != meta::uid(pod) {
        return Err(format!(
            "the UID in the bound object reference ({uid}) does not match the UID in record. The object might have been deleted and then recreated"
        ));
    }
    if meta::str_at(pod, &["spec", "nodeName"]) != Some(node) {
        return Err("node requested token bound to a pod scheduled on a different node".into());
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
    fn nodes_create_only_self_owned_mirror_pods_without_references() {
        let owner = json!({"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u1", "controller": true});
        let mirror = |spec: Value, owners: Value| json!({"metadata": {"ownerReferences": owners}, "spec": spec});
        let plain = json!({"containers": [{"name": "c", "image": "i"}]});
        assert_eq!(
            mirror_pod_refusal(&mirror(plain.clone(), json!([owner])), "n1", Some("u1")),
            Ok(())
        );
        let refused = |pod: Value| mirror_pod_refusal(&pod, "n1", Some("u1")).expect_err("refused");
        assert!(
            refused(mirror(plain.clone(), json!([]))).contains("owner reference set to itself")
        );
        assert!(refused(mirror(plain.clone(), json!([owner, owner]))).contains("single owner"));
        let mut other = owner.clone();
        other["name"] = json!("n2");
        assert!(refused(mirror(plain.clone(), json!([other]))).contains("set to itself"));
        let mut not_controller = owner.clone();
        not_controller["controller"] = json!(false);
        assert!(
            refused(mirror(plain.clone(), json!([not_controller]))).contains("controller owner")
        );
        let mut blocking = owner.clone();
        blocking["blockOwnerDeletion"] = json!(true);
        assert!(refused(mirror(plain.clone(), json!([blocking]))).contains("blockOwnerDeletion"));
        let mut stale = owner.clone();
        stale["uid"] = json!("old");
        assert_eq!(
            refused(mirror(plain.clone(), json!([stale]))),
            "node n1 UID mismatch: expected u1 got old"
        );
        let cases = [
            (
                json!({"serviceAccountName": "sa", "containers": []}),
                "a service account",
            ),
            (
                json!({"volumes": [{"name": "v", "secret": {"secretName": "s"}}]}),
                "secrets",
            ),
            (
                json!({"containers": [{"env": [{"name": "E", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]}]}),
                "configmaps",
            ),
            (
                json!({"volumes": [{"name": "v", "projected": {"sources": [{"configMap": {"name": "c"}}]}}]}),
                "configmaps",
            ),
            (
                json!({"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]}),
                "persistentvolumeclaims",
            ),
        ];
        for (spec, want) in cases {
            let err = refused(mirror(spec.clone(), json!([owner])));
            assert!(
                err.ends_with(&format!("can not create pods that reference {want}")),
                "{spec}: {err}"
            );
        }
    }

    #[test]
    fn node_tokens_must_be_bound_to_a_pod_on_the_node() {
        let good = json!({"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": "u1"});
        assert_eq!(token_binding(&good), Ok("web"));
        for (reference, message) in [
            (Value::Null, "node requested token not bound to a pod"),
            (
                json!({"apiVersion": "v1", "kind": "Secret", "name": "s", "uid": "u"}),
                "node requested token not bound to a pod",
            ),
            (
                json!({"apiVersion": "v1", "kind": "Pod", "uid": "u"}),
                "node requested token not bound to a pod",
            ),
            (
                json!({"apiVersion": "v1", "kind": "Pod", "name": "web"}),
                "node requested token with a pod binding without a uid",
            ),
        ] {
            assert_eq!(token_binding(&reference), Err(message), "{reference}");
        }
        let pod = json!({"metadata": {"name": "web", "uid": "u1"}, "spec": {"nodeName": "n1"}});
        assert_eq!(token_pod(&good, &pod, "n1"), Ok(()));
        assert_eq!(
            token_pod(&good, &pod, "n2"),
            Err("node requested token bound to a pod scheduled on a different node".into())
        );
        let recreated = json!({"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": "old"});
        assert!(
            token_pod(&recreated, &pod, "n1")
                .expect_err("uid")
                .starts_with("the UID in the bound object reference (old) does not match")
        );
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
