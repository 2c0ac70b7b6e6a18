//! The `/scale` subresource (upstream's scale REST of Deployments, ReplicaSets,
//! StatefulSets, ReplicationControllers and custom resources with a scale subresource): an
//! `autoscaling/v1` Scale read from and written to the paths the kind names.

use serde_json::{Value, json};

use crate::error::{ApiError, Path};
use crate::meta;
use crate::resources::{ResourceInfo, ScaleSubresource};
use crate::store::{Store, Tenant, UpdateTarget, WriteOptions};

/// The `autoscaling/v1` Scale of `obj` as `spec` maps it.
pub fn scale_of(obj: &Value, spec: &ScaleSubresource) -> Value {
    let metadata = json!({
        "name": meta::name(obj),
        "namespace": meta::namespace(obj),
        "uid": meta::uid(obj),
        "resourceVersion": meta::resource_version(obj),
        "creationTimestamp": meta::str_at(obj, &["metadata", "creationTimestamp"]),
    });
    json!({
        "kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": metadata,
        "spec": {"replicas": meta::at(obj, &spec.spec_replicas).and_then(Value::as_i64).unwrap_or(0)},
        "status": {
            "replicas": meta::at(obj, &spec.status_replicas).and_then(Value::as_i64).unwrap_or(0),
            // A custom resource's labelSelectorPath names the serialized selector itself.
            "selector": match spec.label_selector.as_ref().and_then(|path| meta::at(obj, path)) {
                Some(Value::String(serialized)) => serialized.clone(),
                other => crate::strategies::selector_string(other),
            },
        },
    })
}

/// Writes the replicas of the Scale `next_scale` makes of the object's current Scale (refusing
/// a stale resourceVersion or negative replicas as upstream's scale REST does), through the
/// object's own update path; returns the Scale of what was written.
#[allow(clippy::too_many_arguments)]
pub async fn update<F>(
    store: &Store,
    tenant: &Tenant,
    resource: &ResourceInfo,
    spec: &ScaleSubresource,
    namespace: &str,
    name: &str,
    options: &WriteOptions,
    next_scale: F,
) -> Result<Value, ApiError>
where
    F: Fn(&Value) -> Result<Value, ApiError>,
{
    let updated = store
        .guaranteed_update(
            tenant,
            resource,
            namespace,
            name,
            options.dry_run,
            |current| {
                let scale = next_scale(&scale_of(current, spec))?;
                let rv = meta::resource_version(&scale);
                if !rv.is_empty() && rv != meta::resource_version(current) {
                    return Err(ApiError::stale_update(
                        &resource.group_subresource("scale"),
                        name,
                    ));
                }
                let replicas = match meta::at(&scale, &["spec", "replicas"]) {
                    Some(Value::Number(n)) if n.as_i64().is_some_and(|r| r >= 0) => {
                        n.as_i64().unwrap_or(0)
                    }
                    other => {
                        return Err(ApiError::invalid(
                            "autoscaling",
                            "Scale",
                            name,
                            vec![crate::error::FieldError::invalid(
                                &Path::new("spec.replicas"),
                                other.unwrap_or(&Value::Null).clone(),
                                "must be greater than or equal to 0",
                            )],
                        ));
                    }
                };
                let mut next = current.clone();
                meta::set_at(&mut next, &spec.spec_replicas, json!(replicas));
                let mut warnings = Vec::new();
                store
                    .prepare_update(
                        resource,
                        current,
                        next,
                        UpdateTarget::Main,
                        options,
                        &mut warnings,
                    )
                    .map(Some)
            },
        )
        .await?;
    Ok(scale_of(&updated, spec))
}
