//! VolumeBinding and VolumeZone (upstream's `plugins/volumebinding`, `plugins/volumezone`):
//! a pod's PersistentVolumeClaims must exist; a bound claim's PersistentVolume must allow the
//! node (its node affinity, its zone/region labels); an unbound claim whose StorageClass is
//! `WaitForFirstConsumer` is matched to an available static volume on the node or provisioned
//! there (PreBind writes the PV's `claimRef`, or the claim's `volume.kubernetes.io/selected-node`
//! annotation); an unbound `Immediate` claim makes the pod unschedulable.

use std::collections::HashSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use serde_json::json;

use super::selector::{Selector, node_selector_matches};
use super::{
    ApiAction, Code, CycleState, NodeInfo, Plugin, PodInfo, Snapshot, Status, parse_quantity,
};

/// Upstream's `volume.AnnSelectedNode`.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Upstream's `ErrUnboundImmediatePVC`.
pub const UNBOUND_IMMEDIATE: &str = "pod has unbound immediate PersistentVolumeClaims";
/// Upstream's `ErrReasonBindConflict`.
pub const BIND_CONFLICT: &str = "node(s) didn't find available persistent volumes to bind";
/// Upstream's `ErrReasonNodeConflict` (v1.33 wording).
pub const NODE_CONFLICT: &str = "node(s) didn't match PersistentVolume's node affinity";
/// Upstream's `ErrReasonPVNotExist`.
pub const PV_NOT_EXIST: &str =
    "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)";
/// Upstream's VolumeZone `ErrReasonConflict`.
pub const ZONE_CONFLICT: &str = "node(s) had no available volume zone";
/// Provisioner name meaning "no dynamic provisioning".
const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";

/// The claims of a pod, sorted out in PreFilter.
#[derive(Debug, Clone, Default)]
pub struct PodVolumes {
    /// Claims bound to a volume.
    pub bound: Vec<Arc<PersistentVolumeClaim>>,
    /// Unbound claims of `WaitForFirstConsumer` classes.
    pub delayed: Vec<Arc<PersistentVolumeClaim>>,
    /// Zone/region labels of the bound volumes: (label key, allowed values).
    pub zones: Vec<(String, Vec<String>)>,
}

/// The claim names a pod uses (`persistentVolumeClaim` volumes, and generic ephemeral volumes'
/// `<pod>-<volume>` claims).
pub fn claim_names(pod: &PodInfo) -> Vec<String> {
    pod.pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| {
            if let Some(claim) = &v.persistent_volume_claim {
                Some(claim.claim_name.clone())
            } else {
                v.ephemeral
                    .as_ref()
                    .map(|_| format!("{}-{}", pod.name, v.name))
            }
        })
        .collect()
}

fn storage(
    list: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >,
) -> i64 {
    list.and_then(|l| l.get("storage"))
        .and_then(|q| parse_quantity(&q.0, 1))
        .unwrap_or(0)
}

fn class_of_claim(claim: &PersistentVolumeClaim) -> &str {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or("")
}

fn pv_fits_node(pv: &PersistentVolume, node: &NodeInfo) -> bool {
    pv.spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .is_none_or(|required| node_selector_matches(required, &node.name, node.labels()))
}

/// The smallest available static volume that satisfies `claim` on `node` (upstream's
/// `FindMatchingVolume`), not among `taken`.
pub fn find_matching_volume<'a>(
    claim: &PersistentVolumeClaim,
    node: &NodeInfo,
    snapshot: &'a Snapshot,
    taken: &HashSet<String>,
) -> Option<&'a Arc<PersistentVolume>> {
    let spec = claim.spec.as_ref()?;
    let wanted = storage(spec.resources.as_ref().and_then(|r| r.requests.as_ref()));
    let class = class_of_claim(claim);
    let modes = spec.access_modes.clone().unwrap_or_default();
    let mode = spec.volume_mode.as_deref().unwrap_or("Filesystem");
    let selector = spec
        .selector
        .as_ref()
        .map(|s| Selector::from_label_selector(Some(s)));
    let claim_ns = claim.metadata.namespace.as_deref();
    let claim_name = claim.metadata.name.as_deref();
    snapshot
        .pvs
        .iter()
        .filter(|(name, _)| !taken.contains(*name))
        .map(|(_, pv)| pv)
        .filter(|pv| {
            let Some(pv_spec) = &pv.spec else {
                return false;
            };
            let free = match &pv_spec.claim_ref {
                None => true,
                Some(r) => r.namespace.as_deref() == claim_ns && r.name.as_deref() == claim_name,
            };
            let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
            free && !matches!(phase, Some("Released") | Some("Failed"))
                && pv.metadata.deletion_timestamp.is_none()
                && pv_spec.storage_class_name.as_deref().unwrap_or("") == class
                && storage(pv_spec.capacity.as_ref()) >= wanted
                && modes
                    .iter()
                    .all(|m| pv_spec.access_modes.iter().flatten().any(|have| have == m))
                && pv_spec.volume_mode.as_deref().unwrap_or("Filesystem") == mode
                && selector
                    .as_ref()
                    .is_none_or(|s| s.matches(pv.metadata.labels.as_ref()))
                && pv_fits_node(pv, node)
        })
        .min_by_key(|pv| {
            (
                storage(pv.spec.as_ref().and_then(|s| s.capacity.as_ref())),
                pv.metadata.name.clone(),
            )
        })
}

/// Whether `claim` can be provisioned on `node` (a provisioner, and the class's
/// allowedTopologies admit the node).
fn can_provision(claim: &PersistentVolumeClaim, node: &NodeInfo, snapshot: &Snapshot) -> bool {
    let Some(class) = snapshot.storage_classes.get(class_of_claim(claim)) else {
        return false;
    };
    if class.provisioner == NO_PROVISIONER {
        return false;
    }
    let topologies = class.allowed_topologies.as_deref().unwrap_or(&[]);
    topologies.is_empty()
        || topologies.iter().any(|term| {
            term.match_label_expressions.iter().flatten().all(|e| {
                node.label(&e.key)
                    .is_some_and(|v| e.values.iter().any(|w| w == v))
            })
        })
}

/// VolumeBinding.
pub struct VolumeBinding;

impl Plugin for VolumeBinding {
    fn name(&self) -> &'static str {
        "VolumeBinding"
    }

    fn pre_filter(&self, state: &mut CycleState, pod: &PodInfo, snapshot: &Snapshot) -> Status {
        let names = claim_names(pod);
        if names.is_empty() {
            return Status::skip();
        }
        let mut volumes = PodVolumes::default();
        let mut immediate = false;
        for name in names {
            let Some(claim) = snapshot.pvcs.get(&format!("{}/{name}", pod.namespace)) else {
                return Status::new(
                    Code::UnschedulableAndUnresolvable,
                    format!("persistentvolumeclaim \"{name}\" not found"),
                );
            };
            if claim.metadata.deletion_timestamp.is_some() {
                return Status::new(
                    Code::UnschedulableAndUnresolvable,
                    format!("persistentvolumeclaim \"{name}\" is being deleted"),
                );
            }
            let bound = claim
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.as_deref())
                .is_some_and(|v| !v.is_empty());
            if bound {
                volumes.bound.push(claim.clone());
                continue;
            }
            let delayed = snapshot
                .storage_classes
                .get(class_of_claim(claim))
                .and_then(|c| c.volume_binding_mode.as_deref())
                == Some("WaitForFirstConsumer");
            if delayed {
                volumes.delayed.push(claim.clone());
            } else {
                immediate = true;
            }
        }
        if immediate {
            return Status::new(Code::UnschedulableAndUnresolvable, UNBOUND_IMMEDIATE);
        }
        state.volumes = Some(volumes);
        Status::success()
    }

    fn filter(
        &self,
        state: &CycleState,
        _: &PodInfo,
        node: &NodeInfo,
        snapshot: &Snapshot,
    ) -> Status {
        let Some(volumes) = &state.volumes else {
            return Status::success();
        };
        let mut node_conflict = false;
        let mut missing_pv = false;
        for claim in &volumes.bound {
            let volume = claim
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.as_deref())
                .unwrap_or("");
            match snapshot.pvs.get(volume) {
                None => missing_pv = true,
                Some(pv) if !pv_fits_node(pv, node) => node_conflict = true,
                Some(_) => {}
            }
        }
        let mut bind_conflict = false;
        let mut taken = HashSet::new();
        for claim in &volumes.delayed {
            let selected = claim
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANN_SELECTED_NODE));
            if let Some(selected) = selected {
                if *selected != node.name {
                    bind_conflict = true;
                }
                continue;
            }
            match find_matching_volume(claim, node, snapshot, &taken) {
                Some(pv) => {
                    taken.insert(pv.metadata.name.clone().unwrap_or_default());
                }
                None if can_provision(claim, node, snapshot) => {}
                None => bind_conflict = true,
            }
        }
        let mut reasons = Vec::new();
        if node_conflict {
            reasons.push(NODE_CONFLICT.into());
        }
        if bind_conflict {
            reasons.push(BIND_CONFLICT.into());
        }
        if missing_pv {
            reasons.push(PV_NOT_EXIST.into());
        }
        if reasons.is_empty() {
            Status::success()
        } else {
            Status {
                code: Code::UnschedulableAndUnresolvable,
                reasons,
                plugin: "",
            }
        }
    }

    /// Assumes the volumes on the chosen node: the PreBind writes that bind a static volume
    /// (`spec.claimRef`) or ask for provisioning there (`volume.kubernetes.io/selected-node`).
    fn reserve(
        &self,
        state: &CycleState,
        _: &PodInfo,
        node: &NodeInfo,
        snapshot: &Snapshot,
    ) -> Result<Vec<super::ApiAction>, Status> {
        let Some(volumes) = &state.volumes else {
            return Ok(Vec::new());
        };
        let mut actions = Vec::new();
        let mut taken = HashSet::new();
        for claim in &volumes.delayed {
            let namespace = claim.metadata.namespace.clone().unwrap_or_default();
            let name = claim.metadata.name.clone().unwrap_or_default();
            let selected = claim
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANN_SELECTED_NODE));
            if selected.is_some() {
                continue;
            }
            if let Some(pv) = find_matching_volume(claim, node, snapshot, &taken) {
                let pv_name = pv.metadata.name.clone().unwrap_or_default();
                taken.insert(pv_name.clone());
                actions.push(ApiAction::Patch {
                    path: format!("/api/v1/persistentvolumes/{pv_name}"),
                    patch: json!({
                        "metadata": {"annotations": {"pv.kubernetes.io/bound-by-controller": "yes"}},
                        "spec": {"claimRef": {
                            "kind": "PersistentVolumeClaim", "apiVersion": "v1",
                            "namespace": namespace, "name": name,
                            "uid": claim.metadata.uid,
                            "resourceVersion": claim.metadata.resource_version,
                        }},
                    }),
                });
            } else {
                actions.push(ApiAction::Patch {
                    path: format!("/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}"),
                    patch: json!({"metadata": {"annotations": {ANN_SELECTED_NODE: node.name}}}),
                });
            }
        }
        Ok(actions)
    }
}

/// Zone and region labels a volume may carry, GA then beta.
const TOPOLOGY_LABELS: [&str; 4] = [
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
];

fn ga_label(key: &str) -> &str {
    match key {
        "failure-domain.beta.kubernetes.io/zone" => "topology.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region" => "topology.kubernetes.io/region",
        other => other,
    }
}

/// VolumeZone.
pub struct VolumeZone;

impl Plugin for VolumeZone {
    fn name(&self) -> &'static str {
        "VolumeZone"
    }

    fn pre_filter(&self, state: &mut CycleState, _: &PodInfo, snapshot: &Snapshot) -> Status {
        let Some(volumes) = state.volumes.as_mut() else {
            return Status::skip();
        };
        let mut zones = Vec::new();
        for claim in &volumes.bound {
            let volume = claim
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.as_deref())
                .unwrap_or("");
            let Some(labels) = snapshot
                .pvs
                .get(volume)
                .and_then(|pv| pv.metadata.labels.as_ref())
            else {
                continue;
            };
            for key in TOPOLOGY_LABELS {
                if let Some(value) = labels.get(key) {
                    // Multi-zone volumes list their zones joined by "__".
                    zones.push((
                        key.to_string(),
                        value.split("__").map(str::to_string).collect(),
                    ));
                }
            }
        }
        if zones.is_empty() {
            return Status::skip();
        }
        volumes.zones = zones;
        Status::success()
    }

    fn filter(&self, state: &CycleState, _: &PodInfo, node: &NodeInfo, _: &Snapshot) -> Status {
        let Some(volumes) = &state.volumes else {
            return Status::success();
        };
        if !TOPOLOGY_LABELS.iter().any(|k| node.label(k).is_some()) {
            return Status::success();
        }
        for (key, values) in &volumes.zones {
            let value = node.label(key).or_else(|| node.label(ga_label(key)));
            if value.is_none_or(|v| !values.iter().any(|w| w == v)) {
                return Status::new(Code::UnschedulableAndUnresolvable, ZONE_CONFLICT);
            }
        }
        Status::success()
    }
}
