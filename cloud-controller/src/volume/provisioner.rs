//! external-provisioner for `ebs.csi.aws.com`: a Pending claim of such a class (under
//! WaitForFirstConsumer only once the scheduler chose its node) gets an EBS volume in the
//! right zone and a PV `pvc-<claim uid>` pre-bound to it, which our PV binder then binds; a
//! Released PV we provisioned with reclaim policy Delete loses its volume, then itself.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::params::{self, ClaimRequest, DRIVER, VolumeParameters};
use super::{Context, api_error, event, is_status};
use crate::provider::{CloudError, Volume};

/// Set on claims by the scheduler under WaitForFirstConsumer.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Set on PVs a provisioner made (our binder leaves their reclaim to us).
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// Set on claims by upstream's PV controller (not by ours); honoured when present.
const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
const ANN_BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
/// external-provisioner's PV finalizer: the PV outlives its volume's deletion.
pub const PV_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
/// The zone label of Nodes and of our PVs' node affinity.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const MANAGER: &str = "ebs-csi-provisioner";

/// What to do with a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Not a claim for us, or nothing to do.
    Skip,
    /// Ours, but the scheduler has not chosen a node yet (WaitForFirstConsumer).
    WaitForConsumer,
    /// Provision; under WaitForFirstConsumer in the zone of this node.
    Provision {
        /// The scheduler's chosen node.
        selected_node: Option<String>,
    },
}

fn annotation<'a>(claim: &'a PersistentVolumeClaim, key: &str) -> Option<&'a str> {
    claim
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// Upstream's GetPersistentVolumeClaimClass.
pub fn claim_class(claim: &PersistentVolumeClaim) -> Option<&str> {
    annotation(claim, ANN_BETA_STORAGE_CLASS)
        .or_else(|| {
            claim
                .spec
                .as_ref()
                .and_then(|s| s.storage_class_name.as_deref())
        })
        .filter(|c| !c.is_empty())
}

/// external-provisioner's shouldProvision, by the class since our binder names no
/// provisioner: a Pending, unbound, live claim of an `ebs.csi.aws.com` class whose PV does
/// not exist yet; under WaitForFirstConsumer only with a selected node.
pub fn decide(
    claim: &PersistentVolumeClaim,
    class: Option<&StorageClass>,
    pv_exists: bool,
) -> Decision {
    let Some(class) = class else {
        return Decision::Skip;
    };
    let named = annotation(claim, ANN_STORAGE_PROVISIONER)
        .or_else(|| annotation(claim, ANN_BETA_STORAGE_PROVISIONER));
    if class.provisioner != DRIVER || named.is_some_and(|p| p != DRIVER) {
        return Decision::Skip;
    }
    let phase = claim.status.as_ref().and_then(|s| s.phase.as_deref());
    let volume_name = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref());
    if claim.metadata.deletion_timestamp.is_some()
        || phase.is_some_and(|p| p != "Pending")
        || volume_name.is_some_and(|v| !v.is_empty())
        || pv_exists
    {
        return Decision::Skip;
    }
    let selected_node = annotation(claim, ANN_SELECTED_NODE).map(str::to_string);
    if class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer")
        && selected_node.is_none()
    {
        return Decision::WaitForConsumer;
    }
    Decision::Provision { selected_node }
}

fn node_zone(node: &Node) -> Option<&str> {
    node.metadata
        .labels
        .as_ref()?
        .get(ZONE_LABEL)
        .map(String::as_str)
}

/// The zone of a new volume: the selected node's (WaitForFirstConsumer); else one allowed by
/// the class's `allowedTopologies`, else one of the nodes' zones, picked by the claim's name
/// so that claims spread over zones and a retry picks the same one.
pub fn choose_zone(
    class: &StorageClass,
    selected_node: Option<(&str, Option<&Node>)>,
    node_zones: &[String],
    claim_name: &str,
) -> Result<String, String> {
    if let Some((name, node)) = selected_node {
        let node = node.ok_or_else(|| format!("the selected node {name:?} does not exist"))?;
        return node_zone(node)
            .map(str::to_string)
            .ok_or_else(|| format!("the selected node {name:?} has no {ZONE_LABEL} label"));
    }
    let allowed: Vec<String> = class
        .allowed_topologies
        .iter()
        .flatten()
        .flat_map(|term| term.match_label_expressions.iter().flatten())
        .filter(|e| e.key == ZONE_LABEL || e.key == "topology.ebs.csi.aws.com/zone")
        .flat_map(|e| e.values.iter().cloned())
        .collect();
    let mut candidates: Vec<String> = if allowed.is_empty() {
        node_zones.to_vec()
    } else {
        allowed
    };
    candidates.sort();
    candidates.dedup();
    if candidates.is_empty() {
        return Err(format!(
            "no node has a {ZONE_LABEL} label to place the volume in"
        ));
    }
    let hash = claim_name.bytes().fold(0usize, |h, b| {
        h.wrapping_mul(31).wrapping_add(usize::from(b))
    });
    Ok(candidates[hash % candidates.len()].clone())
}

/// The PV external-provisioner writes for a claim provisioned as `volume`.
pub fn persistent_volume(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    parameters: &VolumeParameters,
    volume: &Volume,
) -> serde_json::Value {
    let spec = claim.spec.as_ref();
    let volume_mode = spec
        .and_then(|s| s.volume_mode.clone())
        .unwrap_or_else(|| "Filesystem".into());
    let mut csi = json!({"driver": DRIVER, "volumeHandle": volume.id});
    if volume_mode == "Filesystem" {
        csi["fsType"] = json!(parameters.fs_type);
    }
    let policy = class.reclaim_policy.as_deref().unwrap_or("Delete");
    let mut metadata = json!({
        "name": params::pv_name(claim.metadata.uid.as_deref().unwrap_or_default()),
        "annotations": {ANN_PROVISIONED_BY: DRIVER},
    });
    if policy == "Delete" {
        metadata["finalizers"] = json!([PV_FINALIZER]);
    }
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": metadata,
        "spec": {
            "capacity": {"storage": format!("{}Gi", volume.size_gib)},
            "accessModes": spec.and_then(|s| s.access_modes.clone()).unwrap_or_default(),
            "volumeMode": volume_mode,
            "storageClassName": class.metadata.name,
            "persistentVolumeReclaimPolicy": policy,
            "mountOptions": class.mount_options,
            "claimRef": {
                "kind": "PersistentVolumeClaim", "apiVersion": "v1",
                "namespace": claim.metadata.namespace, "name": claim.metadata.name,
                "uid": claim.metadata.uid, "resourceVersion": claim.metadata.resource_version,
            },
            "csi": csi,
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": ZONE_LABEL, "operator": "In", "values": [volume.zone]},
            ]}]}},
        },
    })
}

/// A failure to report on the claim: `ProvisioningFailed`, then retry with back-off.
struct Failure(String);

impl From<CloudError> for Failure {
    fn from(err: CloudError) -> Self {
        Failure(err.to_string())
    }
}

/// One pass over every claim and every PV we provisioned.
pub(crate) async fn sync(context: &Arc<Context>) {
    for claim in context.claims.state() {
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let key = format!("provision/{namespace}/{name}");
        if !context.backoff.ready(&key) {
            continue;
        }
        let class_name = claim_class(&claim).unwrap_or_default().to_string();
        let class = context.class(&class_name);
        let pv_name = params::pv_name(claim.metadata.uid.as_deref().unwrap_or_default());
        let pv_exists = context.volume(&pv_name).is_some();
        let Decision::Provision { selected_node } = decide(&claim, class.as_deref(), pv_exists)
        else {
            continue;
        };
        let Some(class) = class else { continue };
        // The cache may be behind a PV made a moment ago: ask before provisioning again.
        let pvs: Api<PersistentVolume> = Api::all(context.client.clone());
        if !matches!(pvs.get_opt(&pv_name).await, Ok(None)) {
            continue;
        }
        event(
            &context.client,
            &*claim,
            "Normal",
            "Provisioning",
            &format!(
                "External provisioner is provisioning volume for claim \"{namespace}/{name}\""
            ),
        )
        .await;
        match provision(context, &claim, &class, selected_node.as_deref()).await {
            Ok(pv) => {
                context.backoff.succeeded(&key);
                tracing::info!(claim = %name, %namespace, volume = %pv, "provisioned");
                event(
                    &context.client,
                    &*claim,
                    "Normal",
                    "ProvisioningSucceeded",
                    &format!("Successfully provisioned volume {pv}"),
                )
                .await;
            }
            Err(Failure(message)) => {
                let delay = context.backoff.failed(&key);
                tracing::warn!(claim = %name, %namespace, %message, ?delay, "provisioning failed");
                event(
                    &context.client,
                    &*claim,
                    "Warning",
                    "ProvisioningFailed",
                    &format!(
                        "failed to provision volume with StorageClass \"{class_name}\": {message}"
                    ),
                )
                .await;
            }
        }
    }
    for volume in context.volumes.state() {
        let name = volume.metadata.name.clone().unwrap_or_default();
        let key = format!("reclaim/{name}");
        if !context.backoff.ready(&key) || !should_delete(&volume) {
            continue;
        }
        match reclaim(context, &volume).await {
            Ok(true) => context.backoff.succeeded(&key),
            Ok(false) => context.backoff.later(&key),
            Err(err) => {
                let delay = context.backoff.failed(&key);
                tracing::warn!(volume = %name, %err, ?delay, "deleting the volume failed");
                event(
                    &context.client,
                    &*volume,
                    "Warning",
                    "VolumeFailedDelete",
                    &err.to_string(),
                )
                .await;
            }
        }
    }
}

async fn provision(
    context: &Context,
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    selected_node: Option<&str>,
) -> Result<String, Failure> {
    let parameters = VolumeParameters::parse(&class.parameters.clone().unwrap_or_default())
        .map_err(|e| Failure(format!("rpc error: code = InvalidArgument desc = {e}")))?;
    let node = selected_node.map(|name| (name, context.node(name)));
    let node_zones: Vec<String> = context
        .nodes
        .state()
        .iter()
        .filter_map(|n| node_zone(n).map(str::to_string))
        .collect();
    let claim_name = claim.metadata.name.as_deref().unwrap_or_default();
    let zone = choose_zone(
        class,
        node.as_ref().map(|(n, node)| (*n, node.as_deref())),
        &node_zones,
        claim_name,
    )
    .map_err(|e| Failure(format!("rpc error: code = ResourceExhausted desc = {e}")))?;
    let requested = claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .ok_or_else(|| Failure("the claim requests no storage".into()))?;
    let bytes = params::quantity_bytes(&requested.0)
        .ok_or_else(|| Failure(format!("invalid storage request {:?}", requested.0)))?;
    let pv_name = params::pv_name(claim.metadata.uid.as_deref().unwrap_or_default());
    let cluster_tag = context.settings.cluster_tag_key();
    let request = params::create_request(
        &parameters,
        &ClaimRequest {
            cluster_tag: &cluster_tag,
            cluster_id: &context.settings.cluster_id,
            pv_name: &pv_name,
            claim_name,
            claim_namespace: claim.metadata.namespace.as_deref().unwrap_or_default(),
            zone: &zone,
            bytes,
        },
    )
    .map_err(|e| Failure(format!("rpc error: code = InvalidArgument desc = {e}")))?;
    let volume = context.cloud.create_volume(&request).await.map_err(|e| {
        Failure(format!(
            "rpc error: code = Internal desc = Could not create volume \"{pv_name}\": {e}"
        ))
    })?;
    let pv: PersistentVolume =
        serde_json::from_value(persistent_volume(claim, class, &parameters, &volume))
            .map_err(|e| Failure(format!("building the PV: {e}")))?;
    let api: Api<PersistentVolume> = Api::all(context.client.clone());
    match api.create(&PostParams::default(), &pv).await {
        Ok(_) => Ok(pv_name),
        Err(err) if is_status(&err, 409) => Ok(pv_name),
        // The volume stays; the next try finds it by its PV-name tag.
        Err(err) => Err(Failure(format!("creating PV {pv_name}: {err}"))),
    }
}

fn has_finalizer(volume: &PersistentVolume) -> bool {
    volume
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == PV_FINALIZER)
}

/// Upstream's shouldDelete for our PVs: Released (its claim gone) with policy Delete.
pub fn should_delete(volume: &PersistentVolume) -> bool {
    let ours = volume
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_PROVISIONED_BY))
        .is_some_and(|p| p == DRIVER);
    let spec = volume.spec.as_ref();
    let csi_ours = spec
        .and_then(|s| s.csi.as_ref())
        .is_some_and(|c| c.driver == DRIVER);
    let policy = spec.and_then(|s| s.persistent_volume_reclaim_policy.as_deref());
    let phase = volume.status.as_ref().and_then(|s| s.phase.as_deref());
    ours && csi_ours && policy == Some("Delete") && phase == Some("Released")
}

/// Deletes a released volume's EBS volume, then the PV; `false` while it is still attached
/// somewhere (EBS refuses to delete an in-use volume).
async fn reclaim(context: &Context, volume: &PersistentVolume) -> Result<bool, CloudError> {
    let name = volume.metadata.name.clone().unwrap_or_default();
    let attached = context
        .attachments
        .state()
        .iter()
        .any(|a| a.spec.source.persistent_volume_name.as_deref() == Some(name.as_str()));
    if attached {
        return Ok(false);
    }
    let handle = volume
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone())
        .unwrap_or_default();
    if let Some(cloud_volume) = context.cloud.describe_volume(&handle).await? {
        if !cloud_volume.attachments.is_empty() {
            return Ok(false);
        }
        context.cloud.delete_volume(&handle).await?;
        tracing::info!(volume = %name, %handle, "deleted the volume of a released PV");
    }
    let api: Api<PersistentVolume> = Api::all(context.client.clone());
    if has_finalizer(volume) {
        let rest: Vec<&String> = volume
            .metadata
            .finalizers
            .iter()
            .flatten()
            .filter(|f| *f != PV_FINALIZER)
            .collect();
        let patch = json!({"metadata": {
            "finalizers": rest, "resourceVersion": volume.metadata.resource_version,
        }});
        match api.patch(&name, &manager(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(err) if is_status(&err, 404) => return Ok(true),
            Err(err) => return Err(api_error(err)),
        }
    }
    match api.delete(&name, &DeleteParams::default()).await {
        Ok(_) => Ok(true),
        Err(err) if is_status(&err, 404) => Ok(true),
        Err(err) => Err(api_error(err)),
    }
}

pub(crate) fn manager() -> PatchParams {
    PatchParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn class(value: serde_json::Value) -> StorageClass {
        serde_json::from_value(value).expect("a class")
    }

    fn claim(value: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(value).expect("a claim")
    }

    fn ebs(mode: &str) -> StorageClass {
        class(json!({"metadata": {"name": "ebs"}, "provisioner": DRIVER,
                     "volumeBindingMode": mode, "reclaimPolicy": "Delete"}))
    }

    #[test]
    fn which_claims_are_provisioned() {
        let pending = json!({"metadata": {"name": "data", "namespace": "default", "uid": "u1"},
                             "spec": {"storageClassName": "ebs"}, "status": {"phase": "Pending"}});
        let selected = json!({"metadata": {"name": "data", "namespace": "default", "uid": "u1",
                                           "annotations": {ANN_SELECTED_NODE: "node-1"}},
                              "spec": {"storageClassName": "ebs"}, "status": {"phase": "Pending"}});
        let bound = json!({"metadata": {"name": "data", "uid": "u1"},
                           "spec": {"storageClassName": "ebs", "volumeName": "pv-1"},
                           "status": {"phase": "Bound"}});
        let other_provisioner = json!({"metadata": {"name": "data", "uid": "u1",
                           "annotations": {ANN_STORAGE_PROVISIONER: "other.csi"}},
                           "spec": {"storageClassName": "ebs"}, "status": {"phase": "Pending"}});
        let other = class(json!({"metadata": {"name": "ebs"}, "provisioner": "other.csi"}));
        let wffc = ebs("WaitForFirstConsumer");
        let immediate = ebs("Immediate");
        let cases = [
            (
                &pending,
                Some(&immediate),
                false,
                Decision::Provision {
                    selected_node: None,
                },
            ),
            (&pending, Some(&wffc), false, Decision::WaitForConsumer),
            (
                &selected,
                Some(&wffc),
                false,
                Decision::Provision {
                    selected_node: Some("node-1".into()),
                },
            ),
            (&selected, Some(&wffc), true, Decision::Skip),
            (&bound, Some(&immediate), false, Decision::Skip),
            (&pending, Some(&other), false, Decision::Skip),
            (&pending, None, false, Decision::Skip),
            (&other_provisioner, Some(&immediate), false, Decision::Skip),
        ];
        for (index, (value, class, exists, expected)) in cases.into_iter().enumerate() {
            assert_eq!(
                decide(&claim(value.clone()), class, exists),
                expected,
                "case {index}"
            );
        }
    }

    #[test]
    fn zones_come_from_the_selected_node_the_class_or_the_nodes() {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1",
            "labels": {ZONE_LABEL: "us-east-1b"}}}))
        .expect("a node");
        let bare: Node =
            serde_json::from_value(json!({"metadata": {"name": "n2"}})).expect("a node");
        let plain = ebs("Immediate");
        let restricted = class(json!({"metadata": {"name": "ebs"}, "provisioner": DRIVER,
            "allowedTopologies": [{"matchLabelExpressions": [
                {"key": ZONE_LABEL, "values": ["us-east-1c"]}]}]}));
        let zones = vec!["us-east-1a".to_string(), "us-east-1a".to_string()];
        assert_eq!(
            choose_zone(&plain, Some(("n1", Some(&node))), &zones, "c"),
            Ok("us-east-1b".into())
        );
        assert!(choose_zone(&plain, Some(("n2", Some(&bare))), &zones, "c").is_err());
        assert!(choose_zone(&plain, Some(("gone", None)), &zones, "c").is_err());
        assert_eq!(
            choose_zone(&plain, None, &zones, "c"),
            Ok("us-east-1a".into())
        );
        assert_eq!(
            choose_zone(&restricted, None, &zones, "c"),
            Ok("us-east-1c".into())
        );
        assert!(choose_zone(&plain, None, &[], "c").is_err());
    }

    #[test]
    fn the_pv_is_external_provisioners() {
        let claim = claim(
            json!({"metadata": {"name": "data", "namespace": "default", "uid": "u1",
                                              "resourceVersion": "5"},
            "spec": {"storageClassName": "ebs", "accessModes": ["ReadWriteOnce"],
                     "volumeMode": "Filesystem", "resources": {"requests": {"storage": "1500M"}}}}),
        );
        let volume = Volume {
            id: "vol-1".into(),
            zone: "us-east-1a".into(),
            size_gib: 2,
            volume_type: "gp3".into(),
            state: "creating".into(),
            attachments: vec![],
        };
        let parameters = VolumeParameters::parse(&BTreeMap::new()).expect("defaults");
        let pv = persistent_volume(&claim, &ebs("WaitForFirstConsumer"), &parameters, &volume);
        assert_eq!(pv["metadata"]["name"], "pvc-u1");
        assert_eq!(pv["metadata"]["annotations"][ANN_PROVISIONED_BY], DRIVER);
        assert_eq!(pv["metadata"]["finalizers"], json!([PV_FINALIZER]));
        assert_eq!(pv["spec"]["capacity"]["storage"], "2Gi");
        assert_eq!(
            pv["spec"]["csi"],
            json!({"driver": DRIVER, "volumeHandle": "vol-1", "fsType": "ext4"})
        );
        assert_eq!(pv["spec"]["claimRef"]["uid"], "u1");
        assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Delete");
        assert_eq!(
            pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"],
            json!(["us-east-1a"])
        );
        let typed: Result<PersistentVolume, _> = serde_json::from_value(pv);
        assert!(typed.is_ok());
    }

    #[test]
    fn only_our_released_delete_volumes_are_reclaimed() {
        let pv = |annotation: &str, policy: &str, phase: &str| -> PersistentVolume {
            serde_json::from_value(json!({
                "metadata": {"name": "pvc-1", "annotations": {ANN_PROVISIONED_BY: annotation}},
                "spec": {"persistentVolumeReclaimPolicy": policy,
                         "csi": {"driver": DRIVER, "volumeHandle": "vol-1"}},
                "status": {"phase": phase},
            }))
            .expect("a pv")
        };
        assert!(should_delete(&pv(DRIVER, "Delete", "Released")));
        assert!(!should_delete(&pv(DRIVER, "Retain", "Released")));
        assert!(!should_delete(&pv(DRIVER, "Delete", "Bound")));
        assert!(!should_delete(&pv("other", "Delete", "Released")));
    }
}
