//! external-resizer for `ebs.csi.aws.com`: a bound claim of a class with
//! `allowVolumeExpansion: true` that asks for more than its PV has gets ModifyVolume to the
//! new size (whole GiB), then the PV's capacity and the claim's `status.capacity`.
//!
//! The EBS driver answers ControllerExpandVolume with NodeExpansionRequired for filesystem
//! volumes, after which the kubelet grows the filesystem and clears
//! `FileSystemResizePending`. Flotilla has no kubelet doing that yet, so this resizer
//! finishes as external-resizer does for a volume that needs no node expansion: the
//! `Resizing` condition while ModifyVolume runs, then the conditions cleared and the new
//! capacity on the claim, with the `Resizing` / `VolumeResizeSuccessful` events.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, Patch};
use serde_json::json;

use super::params::{self, DRIVER};
use super::provisioner::{claim_class, manager};
use super::{Context, api_error, event};
use crate::provider::CloudError;

fn storage_bytes(
    list: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >,
) -> Option<u128> {
    params::quantity_bytes(&list?.get("storage")?.0)
}

/// The size (GiB) to grow a claim's volume to, or `None` when nothing is to be done: the
/// claim is Bound to our PV, its class allows expansion, and it requests more than the PV has
/// (shrinking is never done, as upstream refuses it).
pub fn resize_target(
    claim: &PersistentVolumeClaim,
    class: Option<&StorageClass>,
    volume: Option<&PersistentVolume>,
) -> Option<i32> {
    let class = class?;
    if class.provisioner != DRIVER || class.allow_volume_expansion != Some(true) {
        return None;
    }
    if claim.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
        return None;
    }
    let volume = volume?;
    let spec = volume.spec.as_ref()?;
    spec.csi.as_ref().filter(|c| c.driver == DRIVER)?;
    let requested = storage_bytes(claim.spec.as_ref()?.resources.as_ref()?.requests.as_ref())?;
    let current = storage_bytes(spec.capacity.as_ref())?;
    (requested > current).then(|| params::size_gib(requested))?
}

/// One pass over every bound claim.
pub(crate) async fn sync(context: &Arc<Context>) {
    for claim in context.claims.state() {
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let key = format!("resize/{namespace}/{name}");
        if !context.backoff.ready(&key) {
            continue;
        }
        let class = claim_class(&claim).and_then(|c| context.class(c));
        let pv_name = claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default();
        let volume = context.volume(&pv_name);
        let Some(size_gib) = resize_target(&claim, class.as_deref(), volume.as_deref()) else {
            continue;
        };
        let Some(volume) = volume else { continue };
        event(
            &context.client,
            &*claim,
            "Normal",
            "Resizing",
            &format!("External resizer is resizing volume {pv_name}"),
        )
        .await;
        match resize(context, &claim, &volume, size_gib).await {
            Ok(()) => {
                context.backoff.succeeded(&key);
                tracing::info!(claim = %name, %namespace, volume = %pv_name, size_gib, "resized");
                event(
                    &context.client,
                    &*claim,
                    "Normal",
                    "VolumeResizeSuccessful",
                    "Resize volume succeeded",
                )
                .await;
            }
            Err(err) => {
                let delay = context.backoff.failed(&key);
                tracing::warn!(claim = %name, %namespace, %err, ?delay, "resize failed");
                event(
                    &context.client,
                    &*claim,
                    "Warning",
                    "VolumeResizeFailed",
                    &format!("resize volume \"{pv_name}\" by resizer \"{DRIVER}\" failed: {err}"),
                )
                .await;
            }
        }
    }
}

async fn resize(
    context: &Context,
    claim: &PersistentVolumeClaim,
    volume: &PersistentVolume,
    size_gib: i32,
) -> Result<(), CloudError> {
    let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let pv_name = volume.metadata.name.as_deref().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(context.client.clone(), namespace);
    let volumes: Api<PersistentVolume> = Api::all(context.client.clone());
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    // external-resizer's markPVCResizeInProgress.
    claims
        .patch_status(
            name,
            &manager(),
            &Patch::Merge(&json!({"status": {"conditions": [
                {"type": "Resizing", "status": "True", "lastTransitionTime": now},
            ]}})),
        )
        .await
        .map_err(api_error)?;
    let handle = volume
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone())
        .unwrap_or_default();
    context.cloud.resize_volume(&handle, size_gib).await?;
    let capacity = format!("{size_gib}Gi");
    volumes
        .patch(
            pv_name,
            &manager(),
            &Patch::Merge(&json!({"spec": {"capacity": {"storage": capacity}}})),
        )
        .await
        .map_err(api_error)?;
    // external-resizer's markPVCResizeFinished (no node expansion: see the module comment).
    claims
        .patch_status(
            name,
            &manager(),
            &Patch::Merge(&json!({"status": {
                "capacity": {"storage": capacity},
                "conditions": [],
                "allocatedResourceStatuses": null,
            }})),
        )
        .await
        .map_err(api_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(expand: bool, provisioner: &str) -> StorageClass {
        serde_json::from_value(
            json!({"metadata": {"name": "ebs"}, "provisioner": provisioner,
                                      "allowVolumeExpansion": expand}),
        )
        .expect("a class")
    }

    fn claim(request: &str, phase: &str) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "default"},
            "spec": {"storageClassName": "ebs", "volumeName": "pvc-1",
                     "resources": {"requests": {"storage": request}}},
            "status": {"phase": phase},
        }))
        .expect("a claim")
    }

    fn pv(capacity: &str, driver: &str) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": "pvc-1"},
            "spec": {"capacity": {"storage": capacity},
                     "csi": {"driver": driver, "volumeHandle": "vol-1"}},
        }))
        .expect("a pv")
    }

    #[test]
    fn claims_grow_only_when_allowed_and_bigger() {
        let cases = [
            (
                claim("2Gi", "Bound"),
                class(true, DRIVER),
                pv("1Gi", DRIVER),
                Some(2),
            ),
            (
                claim("1500M", "Bound"),
                class(true, DRIVER),
                pv("1Gi", DRIVER),
                Some(2),
            ),
            (
                claim("1500M", "Bound"),
                class(true, DRIVER),
                pv("2Gi", DRIVER),
                None,
            ),
            (
                claim("1Gi", "Bound"),
                class(true, DRIVER),
                pv("2Gi", DRIVER),
                None,
            ),
            (
                claim("2Gi", "Bound"),
                class(false, DRIVER),
                pv("1Gi", DRIVER),
                None,
            ),
            (
                claim("2Gi", "Bound"),
                class(true, "other"),
                pv("1Gi", DRIVER),
                None,
            ),
            (
                claim("2Gi", "Pending"),
                class(true, DRIVER),
                pv("1Gi", DRIVER),
                None,
            ),
            (
                claim("2Gi", "Bound"),
                class(true, DRIVER),
                pv("1Gi", "other"),
                None,
            ),
        ];
        for (index, (claim, class, pv, expected)) in cases.iter().enumerate() {
            assert_eq!(
                resize_target(claim, Some(class), Some(pv)),
                *expected,
                "case {index}"
            );
        }
        assert_eq!(resize_target(&cases[0].0, None, Some(&cases[0].2)), None);
    }
}
