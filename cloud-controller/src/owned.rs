//! What the controllers that own cloud resources for an object (`type: LoadBalancer`
//! Services, Ingresses) share about that object: the patch that adds or removes their
//! finalizer, and the events they record about it.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::events::{Event, EventType, Recorder};
use serde_json::json;

/// The object's finalizers with `finalizer` added or removed, as a merge patch guarded by
/// the resourceVersion (a merge patch replaces the list whole).
pub fn finalizer_patch(metadata: &ObjectMeta, finalizer: &str, add: bool) -> serde_json::Value {
    let mut finalizers: Vec<String> = metadata
        .finalizers
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|f| f != finalizer)
        .collect();
    if add {
        finalizers.push(finalizer.into());
    }
    json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": metadata.resource_version,
    }})
}

/// Records an event about `object`; a failure is logged, never fails the sync.
pub async fn publish(
    recorder: &Recorder,
    object: &ObjectReference,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: reason.into(),
        secondary: None,
    };
    if let Err(err) = recorder.publish(&event, object).await {
        tracing::debug!(kind = ?object.kind, name = ?object.name, %err, "recording an event failed");
    }
}
