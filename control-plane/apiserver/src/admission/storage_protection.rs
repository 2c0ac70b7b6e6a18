//! Upstream's StorageObjectInUseProtection admission plugin: every new PersistentVolumeClaim
//! gets the `kubernetes.io/pvc-protection` finalizer and every new PersistentVolume
//! `kubernetes.io/pv-protection`, so neither disappears while a pod or a claim still uses it;
//! the controller-manager's pvc-protection and pv-protection controllers remove them.

use serde_json::{Value, json};

use super::{Attributes, Context, Operation, Plugin};
use crate::error::ApiError;
use crate::meta;

/// The StorageObjectInUseProtection plugin.
pub struct StorageObjectInUseProtection;

#[async_trait::async_trait]
impl Plugin for StorageObjectInUseProtection {
    fn name(&self) -> &'static str {
        "StorageObjectInUseProtection"
    }

    fn handles(&self, attributes: &Attributes<'_>) -> bool {
        attributes.operation == Operation::Create
            && (attributes.is_core("persistentvolumeclaims")
                || attributes.is_core("persistentvolumes"))
    }

    async fn admit(
        &self,
        _context: &Context<'_>,
        attributes: &Attributes<'_>,
        object: &mut Value,
        _warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        let finalizer = match &*attributes.resource.plural {
            "persistentvolumeclaims" => "kubernetes.io/pvc-protection",
            _ => "kubernetes.io/pv-protection",
        };
        if object.is_object() && !meta::finalizers(object).iter().any(|f| f == finalizer) {
            let mut finalizers: Vec<Value> = meta::at(object, &["metadata", "finalizers"])
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            finalizers.push(json!(finalizer));
            meta::set_at(
                object,
                &["metadata", "finalizers"],
                Value::Array(finalizers),
            );
        }
        Ok(())
    }
}
