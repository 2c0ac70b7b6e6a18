//! What several controllers ask of pods and owned objects: is a pod active or ready, which
//! object controls it, and how a controller stamps a pod out of its template.

use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, PatchParams};

use crate::informers::Change;

/// Whether `pod` counts toward its owner's replicas: not terminating, not finished.
pub fn is_active(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none() && !is_finished(pod)
}

/// Whether `pod` has run to completion, successfully or not.
pub fn is_finished(pod: &Pod) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed")
}

/// The pod's phase, empty when it has no status yet.
pub fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// Whether `pod`'s Ready condition is True.
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether `pod` is bound to a node.
pub fn is_scheduled(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
}

/// The owner reference marked `controller: true`, if it is of `kind`.
pub fn controller_of<'a>(metadata: &'a ObjectMeta, kind: &str) -> Option<&'a OwnerReference> {
    metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .filter(|o| o.kind == kind)
}

/// The name of the index of objects by their controller's uid ([`controller_uid`]).
pub const BY_CONTROLLER_UID: &str = "controller-uid";

/// The uid of the object's controller (the owner reference marked `controller: true`), as an
/// index value: objects found by the controller that owns them, whatever its kind.
pub fn controller_uid<K: kube::Resource>(object: &K) -> Vec<String> {
    object
        .meta()
        .owner_references
        .iter()
        .flatten()
        .filter(|o| o.controller == Some(true))
        .map(|o| o.uid.clone())
        .collect()
}

/// The key (`namespace/name`) of the object's controller when it is of `kind`: what an
/// owned object's change enqueues.
pub fn controller_key(metadata: &ObjectMeta, kind: &str) -> Option<String> {
    let owner = controller_of(metadata, kind)?;
    Some(format!(
        "{}/{}",
        metadata.namespace.as_deref().unwrap_or(""),
        owner.name
    ))
}

/// The keys of the `kind` controllers of a changed object, before and after the change (both
/// when its controller changed): what an owned object's handler queues.
pub fn controller_keys<K: kube::Resource>(change: &Change<'_, K>, kind: &str) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for object in change.objects() {
        if let Some(key) = controller_key(object.meta(), kind)
            && !keys.contains(&key)
        {
            keys.push(key);
        }
    }
    keys
}

/// Splits a `namespace/name` key (namespace empty for cluster-scoped objects).
pub fn split_key(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

/// A controller reference to `owner` (`blockOwnerDeletion` set, as upstream's controllers do).
pub fn controller_reference(api_version: &str, kind: &str, owner: &ObjectMeta) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: owner.name.clone().unwrap_or_default(),
        uid: owner.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// `namespace/name` of an object, the key controllers index their owners by.
pub fn key(metadata: &ObjectMeta) -> String {
    format!(
        "{}/{}",
        metadata.namespace.as_deref().unwrap_or(""),
        metadata.name.as_deref().unwrap_or("")
    )
}

/// A pod made from `template` in `namespace`, controlled by `owner`, named `name` or (when
/// `name` is None) generated from `generate_name`.
pub fn from_template(
    template: &PodTemplateSpec,
    namespace: &str,
    name: Option<String>,
    generate_name: &str,
    owner: OwnerReference,
) -> Pod {
    let mut metadata = template.metadata.clone().unwrap_or_default();
    metadata.generate_name = name.is_none().then(|| generate_name.to_string());
    metadata.name = name;
    metadata.namespace = Some(namespace.to_string());
    metadata.owner_references = Some(vec![owner]);
    Pod {
        metadata,
        spec: template.spec.clone(),
        status: None,
    }
}

/// Deletes `name`, treating "already gone" as done.
pub async fn delete<K>(api: &Api<K>, name: &str, params: &DeleteParams) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(err) => Err(err),
    }
}

/// Patch parameters naming the controller as field manager.
pub fn manager(name: &str) -> PatchParams {
    PatchParams {
        field_manager: Some(name.into()),
        ..Default::default()
    }
}

/// Upstream `Toleration.ToleratesTaint`.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = toleration.effect.as_deref().filter(|e| !e.is_empty())
        && effect != taint.effect
    {
        return false;
    }
    if let Some(key) = toleration.key.as_deref().filter(|k| !k.is_empty())
        && key != taint.key
    {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("") {
        "" | "Equal" => {
            toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        "Exists" => true,
        _ => false,
    }
}
