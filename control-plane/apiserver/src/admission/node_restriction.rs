//! Upstream's NodeRestriction admission plugin (`plugin/pkg/admission/noderestriction`), for
//! kubelets (`system:node:<name>` in `system:nodes`): a node changes only its own Node and its
//! own Lease, creates only mirror pods of its own, deletes, evicts and updates the status of
//! only pods bound to it, and requests only tokens bound to such a pod — with upstream's
//! messages. It decides in the mutating half on creates and deletes (before any other plugin
//! changes the object) and in the validating half on updates (this server's mutating half
//! does not run on updates; the old object is there).

use flotilla_api_machinery::rbac::UserInfo;
use serde_json::Value;

use super::{Attributes, Context, Operation, Plugin};
use crate::error::ApiError;
use crate::meta;
use crate::node::{containers, node_of, volumes};
use crate::store::ReadAt;

/// The NodeRestriction plugin.
pub struct NodeRestriction;

/// The node the request's user is, if it is one.
fn requesting_node<'a>(attributes: &Attributes<'a>) -> Option<&'a str> {
    attributes.user.and_then(|user: &'a UserInfo| node_of(user))
}

#[async_trait::async_trait]
impl Plugin for NodeRestriction {
    fn name(&self) -> &'static str {
        "NodeRestriction"
    }

    fn handles(&self, attributes: &Attributes<'_>) -> bool {
        if requesting_node(attributes).is_none() {
            return false;
        }
        let kind = attributes.resource;
        match (&*kind.group, &*kind.plural, attributes.subresource) {
            ("", "nodes", _) | ("coordination.k8s.io", "leases", _) => {
                attributes.operation != Operation::Connect
            }
            ("", "serviceaccounts", "token") | ("", "pods", "eviction") => {
                attributes.operation == Operation::Create
            }
            ("", "pods", "") => {
                matches!(attributes.operation, Operation::Create | Operation::Delete)
            }
            ("", "pods", "status") => attributes.operation == Operation::Update,
            _ => false,
        }
    }

    async fn admit(
        &self,
        context: &Context<'_>,
        attributes: &Attributes<'_>,
        object: &mut Value,
        _warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        if attributes.operation == Operation::Update {
            return Ok(());
        }
        check(context, attributes, object).await
    }

    async fn validate(
        &self,
        context: &Context<'_>,
        attributes: &Attributes<'_>,
        object: &Value,
        _warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        if attributes.operation != Operation::Update {
            return Ok(());
        }
        check(context, attributes, object).await
    }
}

/// What a node may do to `object`, given the request's attributes.
async fn check(
    context: &Context<'_>,
    attributes: &Attributes<'_>,
    object: &Value,
) -> Result<(), ApiError> {
    let Some(node) = requesting_node(attributes) else {
        return Ok(());
    };
    // Named as the request's path names it (nothing, on a create), as upstream's
    // authorization-time messages are.
    let forbidden = |message: String| {
        ApiError::forbidden(
            &attributes.resource.group_resource(),
            attributes.name,
            &message,
        )
    };
    let target = || {
        if attributes.name.is_empty() {
            meta::name(object)
        } else {
            attributes.name
        }
    };
    match (&*attributes.resource.group, &*attributes.resource.plural) {
        ("", "nodes") => {
            let target = target();
            if target != node {
                return Err(forbidden(format!(
                    "node \"{node}\" is not allowed to modify node \"{target}\""
                )));
            }
        }
        ("coordination.k8s.io", "leases")
            if attributes.namespace != "kube-node-lease" || target() != node =>
        {
            return Err(forbidden(
                "can only access node lease with the same name as the requesting node".into(),
            ));
        }
        ("", "serviceaccounts") => {
            let reference = &object["spec"]["boundObjectRef"];
            let pod_name = token_binding(reference).map_err(|m| forbidden(m.into()))?;
            let pods = context.resource("", "v1", "pods")?;
            let pod = context
                .store
                .get(
                    context.tenant,
                    pods,
                    attributes.namespace,
                    pod_name,
                    ReadAt::Latest,
                )
                .await?;
            token_pod(reference, &pod, node).map_err(forbidden)?;
        }
        ("", "pods") => match (attributes.operation, attributes.subresource) {
            (Operation::Create, "") => {
                let mirror =
                    !object["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_null();
                if !mirror {
                    return Err(forbidden(format!(
                        "pod does not have \"kubernetes.io/config.mirror\" annotation, node \"{node}\" can only create mirror pods"
                    )));
                }
                if meta::str_at(object, &["spec", "nodeName"]) != Some(node) {
                    return Err(forbidden(format!(
                        "node \"{node}\" can only create pods with spec.nodeName set to itself"
                    )));
                }
                let nodes = context.resource("", "v1", "nodes")?;
                let node_uid = context
                    .store
                    .get(context.tenant, nodes, "", node, ReadAt::Latest)
                    .await
                    .ok()
                    .and_then(|n| meta::str_at(&n, &["metadata", "uid"]).map(String::from));
                mirror_pod_refusal(object, node, node_uid.as_deref()).map_err(forbidden)?;
            }
            (operation, subresource) => {
                // The pod as stored: the old object of a delete or status update; an
                // eviction's pod is read.
                let bound = match attributes.old {
                    Some(pod) => meta::str_at(pod, &["spec", "nodeName"]).map(String::from),
                    None => {
                        let pods = context.resource("", "v1", "pods")?;
                        context
                            .store
                            .get(
                                context.tenant,
                                pods,
                                attributes.namespace,
                                attributes.name,
                                ReadAt::Latest,
                            )
                            .await
                            .ok()
                            .and_then(|pod| {
                                meta::str_at(&pod, &["spec", "nodeName"]).map(String::from)
                            })
                    }
                };
                if bound.as_deref() != Some(node) {
                    let what = match (operation, subresource) {
                        (Operation::Delete, _) => "delete pods",
                        (_, "eviction") => "evict pods",
                        _ => "update pod status for pods",
                    };
                    return Err(forbidden(format!(
                        "node \"{node}\" can only {what} with spec.nodeName set to itself"
                    )));
                }
            }
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
    }

    #[test]
    fn only_nodes_writes_are_its_business() {
        use super::super::testing::attributes;
        let kubelet = UserInfo::new("system:node:n1", &[crate::node::NODES_GROUP]);
        let alice = UserInfo::new("alice", &[]);
        let plugin = NodeRestriction;
        let by = |user, operation, group, plural, subresource| Attributes {
            user: Some(user),
            ..attributes(operation, group, plural, subresource)
        };
        for (operation, group, plural, subresource) in [
            (Operation::Create, "", "nodes", ""),
            (Operation::Update, "", "nodes", "status"),
            (Operation::Delete, "coordination.k8s.io", "leases", ""),
            (Operation::Create, "", "serviceaccounts", "token"),
            (Operation::Create, "", "pods", ""),
            (Operation::Create, "", "pods", "eviction"),
            (Operation::Update, "", "pods", "status"),
            (Operation::Delete, "", "pods", ""),
        ] {
            let asked = by(&kubelet, operation, group, plural, subresource);
            assert!(plugin.handles(&asked), "{plural}/{subresource}");
            let asked = by(&alice, operation, group, plural, subresource);
            assert!(!plugin.handles(&asked), "alice {plural}/{subresource}");
        }
        for (operation, plural, subresource) in [
            (Operation::Update, "pods", ""),
            (Operation::Connect, "pods", "exec"),
            (Operation::Create, "configmaps", ""),
        ] {
            let asked = by(&kubelet, operation, "", plural, subresource);
            assert!(!plugin.handles(&asked), "{plural}/{subresource}");
        }
    }
}
