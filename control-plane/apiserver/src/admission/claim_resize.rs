//! Upstream's PersistentVolumeClaimResize admission plugin: a claim's storage request may grow
//! only once the claim is Bound, and only when its StorageClass (unchanged) says
//! `allowVolumeExpansion: true`; shrinking and other changes are left to validation.

use flotilla_api_machinery::quantity::Quantity;
use serde_json::Value;

use super::{Attributes, Context, Operation, Plugin, forbidden};
use crate::error::ApiError;
use crate::meta;

/// The PersistentVolumeClaimResize plugin.
pub struct PersistentVolumeClaimResize;

fn requested_storage(claim: &Value) -> Option<Quantity> {
    meta::str_at(claim, &["spec", "resources", "requests", "storage"])
        .and_then(|text| Quantity::parse(text).ok())
}

/// Upstream's `GetPersistentVolumeClaimClass`: the beta annotation, else the field.
fn claim_class(claim: &Value) -> &str {
    meta::str_at(
        claim,
        &[
            "metadata",
            "annotations",
            "volume.beta.kubernetes.io/storage-class",
        ],
    )
    .or_else(|| meta::str_at(claim, &["spec", "storageClassName"]))
    .unwrap_or("")
}

#[async_trait::async_trait]
impl Plugin for PersistentVolumeClaimResize {
    fn name(&self) -> &'static str {
        "PersistentVolumeClaimResize"
    }

    fn handles(&self, attributes: &Attributes<'_>) -> bool {
        attributes.operation == Operation::Update && attributes.is_core("persistentvolumeclaims")
    }

    async fn validate(
        &self,
        context: &Context<'_>,
        attributes: &Attributes<'_>,
        claim: &Value,
        _warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        let Some(old) = attributes.old else {
            return Ok(());
        };
        let grows = match (requested_storage(claim), requested_storage(old)) {
            (Some(new), Some(before)) => new > before,
            (Some(new), None) => !new.is_zero(),
            _ => false,
        };
        if !grows {
            return Ok(());
        }
        if meta::str_at(old, &["status", "phase"]) != Some("Bound") {
            return Err(forbidden(
                attributes,
                claim,
                "Only bound persistent volume claims can be expanded",
            ));
        }
        let class = claim_class(claim);
        let allowed = if class.is_empty() || class != claim_class(old) {
            false
        } else {
            let classes = context.resource("storage.k8s.io", "v1", "storageclasses")?;
            context
                .get_cached(classes, class)
                .await?
                .is_some_and(|c| c["allowVolumeExpansion"] == Value::Bool(true))
        };
        if allowed {
            Ok(())
        } else {
            Err(forbidden(
                attributes,
                claim,
                "only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize",
            ))
        }
    }
}
