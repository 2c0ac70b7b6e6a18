//! Upstream's attach-detach controller and external-attacher in one, for `ebs.csi.aws.com`:
//! every volume a live pod on a node uses gets a VolumeAttachment named as upstream; the
//! attacher side attaches it to the node's instance at a free device, waits until EC2 says
//! `attached` and reports it in the VolumeAttachment's status; once no pending or running pod
//! on that node uses it, the VolumeAttachment is deleted and its finalizer holds it until the
//! volume is detached. Cloud errors land in `attachError`/`detachError` and are retried with
//! back-off.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, Patch, PostParams};
use serde_json::json;

use super::params::{self, DRIVER};
use super::provisioner::manager;
use super::{Context, api_error, is_status};
use crate::aws::instance_id_from_provider_id;
use crate::provider::{CloudError, Volume};

/// external-attacher's finalizer on VolumeAttachments (`external-attacher/<driver with - for .>`).
pub const VA_FINALIZER: &str = "external-attacher/ebs-csi-aws-com";
/// external-attacher's annotation of the CSI node id (our instance id) an attachment is for,
/// so a detach still knows the instance after its Node is gone.
pub const ANN_NODE_ID: &str = "csi.alpha.kubernetes.io/node-id";
/// How often and how long one pass polls EC2 right after an attach/detach call.
const POLLS: u32 = 5;
const POLL_EVERY: Duration = Duration::from_millis(300);

/// A VolumeAttachment that should exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// Its name (`csi-<sha256>`).
    pub name: String,
    /// The PV attached.
    pub pv_name: String,
    /// The node it is attached to.
    pub node_name: String,
}

/// Whether a pod still needs its volumes on its node: scheduled and not terminal (upstream's
/// desired-state populator drops pods once deleted or Succeeded/Failed).
pub fn pod_needs_volumes(pod: &Pod) -> bool {
    let scheduled = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    scheduled && !matches!(phase, Some("Succeeded" | "Failed"))
}

/// The attachments that should exist, by name: one per (our PV, node) pair that a pod on
/// that node uses through a bound claim.
pub fn desired_attachments(
    pods: &[Arc<Pod>],
    claims: &[Arc<PersistentVolumeClaim>],
    volumes: &[Arc<PersistentVolume>],
) -> BTreeMap<String, Wanted> {
    let claims: HashMap<(&str, &str), &PersistentVolumeClaim> = claims
        .iter()
        .map(|c| {
            (
                (
                    c.metadata.namespace.as_deref().unwrap_or_default(),
                    c.metadata.name.as_deref().unwrap_or_default(),
                ),
                &**c,
            )
        })
        .collect();
    let volumes: HashMap<&str, &PersistentVolume> = volumes
        .iter()
        .map(|v| (v.metadata.name.as_deref().unwrap_or_default(), &**v))
        .collect();
    let mut wanted = BTreeMap::new();
    for pod in pods.iter().filter(|p| pod_needs_volumes(p)) {
        let Some(spec) = pod.spec.as_ref() else {
            continue;
        };
        let node_name = spec.node_name.clone().unwrap_or_default();
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
        for volume in spec.volumes.iter().flatten() {
            let claim_name = match (&volume.persistent_volume_claim, &volume.ephemeral) {
                (Some(source), _) => source.claim_name.clone(),
                (None, Some(_)) => format!("{pod_name}-{}", volume.name),
                (None, None) => continue,
            };
            let Some(claim) = claims.get(&(namespace, claim_name.as_str())) else {
                continue;
            };
            let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
            let Some(pv_name) = claim
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.as_deref())
                .filter(|n| bound && !n.is_empty())
            else {
                continue;
            };
            let Some(csi) = volumes
                .get(pv_name)
                .and_then(|pv| pv.spec.as_ref())
                .and_then(|s| s.csi.as_ref())
                .filter(|c| c.driver == DRIVER)
            else {
                continue;
            };
            let name = params::attachment_name(&csi.volume_handle, DRIVER, &node_name);
            wanted.insert(
                name.clone(),
                Wanted {
                    name,
                    pv_name: pv_name.to_string(),
                    node_name: node_name.clone(),
                },
            );
        }
    }
    wanted
}

/// The VolumeAttachment the attach-detach controller creates for `wanted`.
pub fn volume_attachment(wanted: &Wanted) -> serde_json::Value {
    json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "VolumeAttachment",
        "metadata": {"name": wanted.name},
        "spec": {
            "attacher": DRIVER,
            "nodeName": wanted.node_name,
            "source": {"persistentVolumeName": wanted.pv_name},
        },
    })
}

fn is_ours(attachment: &VolumeAttachment) -> bool {
    attachment.spec.attacher == DRIVER
}

fn has_finalizer(attachment: &VolumeAttachment) -> bool {
    attachment
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == VA_FINALIZER)
}

fn device_path(attachment: &VolumeAttachment) -> Option<&str> {
    attachment
        .status
        .as_ref()?
        .attachment_metadata
        .as_ref()?
        .get("devicePath")
        .map(String::as_str)
}

/// One pass: the attach-detach side (create / delete VolumeAttachments), then the attacher
/// side for each of ours.
pub(crate) async fn sync(context: &Arc<Context>) {
    let wanted = desired_attachments(
        &context.pods.state(),
        &context.claims.state(),
        &context.volumes.state(),
    );
    let api: Api<VolumeAttachment> = Api::all(context.client.clone());
    let existing = context.attachments.state();
    for want in wanted.values() {
        if existing
            .iter()
            .any(|a| a.metadata.name.as_deref() == Some(want.name.as_str()))
        {
            continue;
        }
        let Ok(attachment) = serde_json::from_value::<VolumeAttachment>(volume_attachment(want))
        else {
            continue;
        };
        match api.create(&PostParams::default(), &attachment).await {
            Ok(_) => {
                tracing::info!(attachment = %want.name, volume = %want.pv_name, node = %want.node_name, "volume attachment created");
            }
            Err(err) if is_status(&err, 409) => {}
            Err(err) => {
                tracing::warn!(attachment = %want.name, %err, "creating a volume attachment failed")
            }
        }
    }
    for attachment in existing.iter().filter(|a| is_ours(a)) {
        let name = attachment.metadata.name.clone().unwrap_or_default();
        if attachment.metadata.deletion_timestamp.is_none() && !wanted.contains_key(&name) {
            tracing::info!(attachment = %name, "no pod on the node uses the volume: detaching");
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(err) if is_status(&err, 404) => {}
                Err(err) => {
                    tracing::warn!(attachment = %name, %err, "deleting a volume attachment failed")
                }
            }
            continue;
        }
        let key = format!("attach/{name}");
        if !context.backoff.ready(&key) {
            continue;
        }
        let outcome = if attachment.metadata.deletion_timestamp.is_some() {
            if !has_finalizer(attachment) {
                continue;
            }
            detach(context, &api, attachment).await
        } else {
            let attached = attachment.status.as_ref().is_some_and(|s| s.attached);
            if attached && has_finalizer(attachment) {
                context.backoff.succeeded(&key);
                continue;
            }
            attach(context, &api, attachment).await
        };
        match outcome {
            Ok(true) => context.backoff.succeeded(&key),
            Ok(false) => context.backoff.later(&key),
            Err(err) => {
                let delay = context.backoff.failed(&key);
                tracing::warn!(attachment = %name, %err, ?delay, "attach/detach failed; retrying");
            }
        }
    }
    // Devices of attachments that are gone are free again.
    let mut devices = context.devices.lock().unwrap_or_else(|e| e.into_inner());
    devices.retain(|name, _| {
        existing
            .iter()
            .any(|a| a.metadata.name.as_deref() == Some(name))
    });
}

fn volume_handle(context: &Context, attachment: &VolumeAttachment) -> Result<String, CloudError> {
    let pv_name = attachment
        .spec
        .source
        .persistent_volume_name
        .as_deref()
        .unwrap_or_default();
    context
        .volume(pv_name)
        .and_then(|pv| {
            pv.spec
                .as_ref()?
                .csi
                .as_ref()
                .map(|c| c.volume_handle.clone())
        })
        .ok_or_else(|| CloudError::invalid(format!("PersistentVolume {pv_name:?} not found")))
}

fn node_instance(context: &Context, attachment: &VolumeAttachment) -> Option<String> {
    let node_name = &attachment.spec.node_name;
    context
        .node(node_name)
        .and_then(|n| n.spec.as_ref()?.provider_id.clone())
        .and_then(|id| instance_id_from_provider_id(&id).map(str::to_string))
}

fn attachment_state<'a>(volume: &'a Volume, instance_id: &str) -> Option<(&'a str, &'a str)> {
    volume
        .attachments
        .iter()
        .find(|a| a.instance_id == instance_id)
        .map(|a| (a.state.as_str(), a.device.as_str()))
}

async fn set_status(
    api: &Api<VolumeAttachment>,
    name: &str,
    status: serde_json::Value,
) -> Result<(), CloudError> {
    api.patch_status(name, &manager(), &Patch::Merge(&json!({"status": status})))
        .await
        .map(|_| ())
        .map_err(api_error)
}

fn error_status(err: &CloudError) -> serde_json::Value {
    json!({"time": k8s_openapi::jiff::Timestamp::now().to_string(), "message": err.to_string()})
}

/// The attacher's attach: `true` once attached and reported.
async fn attach(
    context: &Context,
    api: &Api<VolumeAttachment>,
    attachment: &VolumeAttachment,
) -> Result<bool, CloudError> {
    let name = attachment.metadata.name.clone().unwrap_or_default();
    let result = try_attach(context, api, attachment, &name).await;
    if let Err(err) = &result {
        let _ = set_status(
            api,
            &name,
            json!({"attached": false, "attachError": error_status(err)}),
        )
        .await;
    }
    result
}

async fn try_attach(
    context: &Context,
    api: &Api<VolumeAttachment>,
    attachment: &VolumeAttachment,
    name: &str,
) -> Result<bool, CloudError> {
    let node_name = attachment.spec.node_name.clone();
    let instance_id = node_instance(context, attachment)
        .ok_or_else(|| CloudError::invalid(format!("node {node_name:?} has no AWS provider ID")))?;
    if !has_finalizer(attachment) {
        let mut finalizers = attachment.metadata.finalizers.clone().unwrap_or_default();
        finalizers.push(VA_FINALIZER.into());
        let patch = json!({"metadata": {
            "finalizers": finalizers,
            "annotations": {ANN_NODE_ID: instance_id},
            "resourceVersion": attachment.metadata.resource_version,
        }});
        api.patch(name, &manager(), &Patch::Merge(&patch))
            .await
            .map_err(api_error)?;
    }
    let handle = volume_handle(context, attachment)?;
    let volume = context
        .cloud
        .describe_volume(&handle)
        .await?
        .ok_or_else(|| CloudError {
            code: "InvalidVolume.NotFound".into(),
            message: format!("The volume '{handle}' does not exist."),
            retryable: false,
        })?;
    match attachment_state(&volume, &instance_id) {
        Some(("attached", device)) => {
            return report_attached(context, api, name, device).await;
        }
        Some(("attaching", _)) => return Ok(false),
        _ => {}
    }
    if let Some(other) = volume
        .attachments
        .iter()
        .find(|a| a.instance_id != instance_id)
    {
        return Err(CloudError {
            code: "VolumeInUse".into(),
            message: format!(
                "{handle} is already attached to instance {}",
                other.instance_id
            ),
            retryable: true,
        });
    }
    let device = {
        let mut devices = context.devices.lock().unwrap_or_else(|e| e.into_inner());
        match devices.get(name) {
            Some((_, device)) => device.clone(),
            None => {
                let states = context.attachments.state();
                let mut used: Vec<String> = states
                    .iter()
                    .filter(|a| a.spec.node_name == node_name)
                    .filter_map(|a| device_path(a).map(str::to_string))
                    .collect();
                used.extend(
                    devices
                        .values()
                        .filter(|(node, _)| *node == node_name)
                        .map(|(_, d)| d.clone()),
                );
                let device =
                    params::free_device(used.iter().map(String::as_str)).ok_or_else(|| {
                        CloudError::invalid(format!("no free device name on node {node_name:?}"))
                    })?;
                devices.insert(name.to_string(), (node_name.clone(), device.clone()));
                device
            }
        }
    };
    tracing::info!(attachment = %name, %handle, instance = %instance_id, %device, "attaching");
    context
        .cloud
        .attach_volume(&handle, &instance_id, &device)
        .await?;
    for _ in 0..POLLS {
        if let Some(volume) = context.cloud.describe_volume(&handle).await?
            && let Some(("attached", device)) = attachment_state(&volume, &instance_id)
        {
            return report_attached(context, api, name, device).await;
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
    Ok(false)
}

async fn report_attached(
    context: &Context,
    api: &Api<VolumeAttachment>,
    name: &str,
    device: &str,
) -> Result<bool, CloudError> {
    set_status(
        api,
        name,
        json!({"attached": true, "attachmentMetadata": {"devicePath": device}, "attachError": null}),
    )
    .await?;
    context
        .devices
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(name);
    tracing::info!(attachment = %name, %device, "attached");
    Ok(true)
}

/// The attacher's detach of a deleted VolumeAttachment: `true` once detached and the
/// finalizer is gone.
async fn detach(
    context: &Context,
    api: &Api<VolumeAttachment>,
    attachment: &VolumeAttachment,
) -> Result<bool, CloudError> {
    let name = attachment.metadata.name.clone().unwrap_or_default();
    let instance_id = attachment
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_NODE_ID).cloned())
        .or_else(|| node_instance(context, attachment));
    let result = match (instance_id, volume_handle(context, attachment)) {
        (Some(instance_id), Ok(handle)) => try_detach(context, &handle, &instance_id).await,
        // Never attached anywhere we know of, or its PV is gone: nothing to detach.
        _ => Ok(true),
    };
    match result {
        Ok(true) => {
            let rest: Vec<&String> = attachment
                .metadata
                .finalizers
                .iter()
                .flatten()
                .filter(|f| *f != VA_FINALIZER)
                .collect();
            let patch = json!({"metadata": {
                "finalizers": rest, "resourceVersion": attachment.metadata.resource_version,
            }});
            match api.patch(&name, &manager(), &Patch::Merge(&patch)).await {
                Ok(_) => {}
                Err(err) if is_status(&err, 404) => {}
                Err(err) => return Err(api_error(err)),
            }
            tracing::info!(attachment = %name, "detached");
            Ok(true)
        }
        Ok(false) => Ok(false),
        Err(err) => {
            let _ = set_status(api, &name, json!({"detachError": error_status(&err)})).await;
            Err(err)
        }
    }
}

async fn try_detach(
    context: &Context,
    handle: &str,
    instance_id: &str,
) -> Result<bool, CloudError> {
    let attached = |volume: Option<Volume>| {
        volume.is_some_and(|v| attachment_state(&v, instance_id).is_some())
    };
    if !attached(context.cloud.describe_volume(handle).await?) {
        return Ok(true);
    }
    tracing::info!(%handle, instance = %instance_id, "detaching");
    context.cloud.detach_volume(handle, instance_id).await?;
    for _ in 0..POLLS {
        if !attached(context.cloud.describe_volume(handle).await?) {
            return Ok(true);
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, node: Option<&str>, phase: &str, claims: &[&str]) -> Arc<Pod> {
        let volumes: Vec<serde_json::Value> = claims
            .iter()
            .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
            .collect();
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"nodeName": node, "containers": [], "volumes": volumes},
                "status": {"phase": phase},
            }))
            .expect("a pod"),
        )
    }

    fn claim(name: &str, volume: Option<&str>, phase: &str) -> Arc<PersistentVolumeClaim> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"volumeName": volume}, "status": {"phase": phase},
            }))
            .expect("a claim"),
        )
    }

    fn pv(name: &str, driver: &str, handle: &str) -> Arc<PersistentVolume> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"csi": {"driver": driver, "volumeHandle": handle}},
            }))
            .expect("a pv"),
        )
    }

    #[test]
    fn attachments_follow_the_pods_that_use_our_volumes() {
        let claims = vec![
            claim("data", Some("pvc-1"), "Bound"),
            claim("pending", None, "Pending"),
            claim("other", Some("pv-nfs"), "Bound"),
        ];
        let volumes = vec![pv("pvc-1", DRIVER, "vol-1"), pv("pv-nfs", "nfs.csi", "x")];
        let name_1 = params::attachment_name("vol-1", DRIVER, "node-1");
        let name_2 = params::attachment_name("vol-1", DRIVER, "node-2");
        let cases: Vec<(Vec<Arc<Pod>>, Vec<&str>)> = vec![
            (
                vec![pod("a", Some("node-1"), "Running", &["data"])],
                vec![&name_1],
            ),
            (
                vec![pod("a", Some("node-1"), "Pending", &["data"])],
                vec![&name_1],
            ),
            // Two pods on one node share one attachment.
            (
                vec![
                    pod("a", Some("node-1"), "Running", &["data"]),
                    pod("b", Some("node-1"), "Running", &["data"]),
                ],
                vec![&name_1],
            ),
            (vec![pod("a", None, "Pending", &["data"])], vec![]),
            (
                vec![pod("a", Some("node-1"), "Succeeded", &["data"])],
                vec![],
            ),
            (vec![pod("a", Some("node-1"), "Failed", &["data"])], vec![]),
            (
                vec![pod(
                    "a",
                    Some("node-1"),
                    "Running",
                    &["pending", "other", "missing"],
                )],
                vec![],
            ),
            (
                vec![
                    pod("a", Some("node-1"), "Running", &["data"]),
                    pod("b", Some("node-2"), "Running", &["data"]),
                ],
                {
                    let mut both = vec![name_1.as_str(), name_2.as_str()];
                    both.sort();
                    both
                },
            ),
        ];
        for (index, (pods, expected)) in cases.into_iter().enumerate() {
            let wanted = desired_attachments(&pods, &claims, &volumes);
            let names: Vec<&str> = wanted.keys().map(String::as_str).collect();
            assert_eq!(names, expected, "case {index}");
        }
        let wanted = desired_attachments(
            &[pod("a", Some("node-1"), "Running", &["data"])],
            &claims,
            &volumes,
        );
        let want = &wanted[&name_1];
        assert_eq!(want.pv_name, "pvc-1");
        assert_eq!(want.node_name, "node-1");
        let object = volume_attachment(want);
        assert_eq!(object["spec"]["attacher"], DRIVER);
        assert_eq!(object["spec"]["source"]["persistentVolumeName"], "pvc-1");
        assert!(serde_json::from_value::<VolumeAttachment>(object).is_ok());
    }
}
