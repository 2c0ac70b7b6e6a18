//! The persistent volume binder (upstream `pkg/controller/volume/persistentvolume`,
//! `PersistentVolumeController` without provisioning): binds each Pending claim to the
//! smallest Available volume that fits it (class, access modes, capacity, selector, volume
//! mode) — claimRef on the volume, volumeName on the claim, both Bound, with upstream's
//! annotations — waits for the scheduler's selected node under WaitForFirstConsumer, marks
//! volumes whose claim is gone Released, and deletes released `Delete` volumes no
//! provisioner owns. Dynamic provisioning is not done here.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, Patch};
use serde_json::json;

use crate::informers::{Index, Informer, Informers};
use crate::pods;
use crate::selectors;
use crate::workqueue::{Requeue, WorkQueue, run_workers};
use flotilla_api_machinery::quantity::Quantity;

const MANAGER: &str = "persistentvolume-binder-controller";
/// Set on a claim once the controller has finished binding it.
pub const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// Set on a claim or volume whose binding the controller (not the user) made.
pub const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
/// Set on a claim by the scheduler under WaitForFirstConsumer.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Set on a volume a provisioner created (and will delete).
const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
const ANN_BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
/// The index of volumes by the claim their claimRef names (`namespace/name`).
const VOLUMES_BY_CLAIM: &str = "pvbinder-volumes-by-claim";
/// The index of volumes by their class.
const VOLUMES_BY_CLASS: &str = "pvbinder-volumes-by-class";
/// The index of claims still to bind (no bind-completed annotation) by their class.
const UNBOUND_CLAIMS_BY_CLASS: &str = "pvbinder-unbound-claims-by-class";

/// Runs the controller until the task is aborted. As upstream, one queue of volumes and one
/// of claims, each with one worker (two claims must not both take the last volume): a
/// volume's change queues it and the claim its claimRef names; a claim's change queues it and
/// the volumes bound or pre-bound to it; a volume that may be free, or a class's change,
/// queues the claims of its class still to bind (which upstream's 15 s resync finds).
pub async fn run(informers: Arc<Informers>) {
    let volumes = informers.get::<PersistentVolume>();
    let claims = informers.get::<PersistentVolumeClaim>();
    let classes = informers.get::<StorageClass>();
    let volumes_by_claim = volumes.index(VOLUMES_BY_CLAIM, claim_of_volume);
    let volumes_by_class = volumes.index(VOLUMES_BY_CLASS, |v| vec![volume_class(v).to_string()]);
    let unbound_by_class = claims.index(UNBOUND_CLAIMS_BY_CLASS, class_of_unbound_claim);
    let client = informers.client().clone();
    let volume_queue = Arc::new(WorkQueue::new("volumes"));
    let claim_queue = Arc::new(WorkQueue::new("claims"));

    let (to_volumes, to_claims) = (volume_queue.clone(), claim_queue.clone());
    let waiting = unbound_by_class.clone();
    volumes.on_change(move |change| {
        let keys = volume_change_keys(change.old, change.new);
        for key in keys.volumes {
            to_volumes.add(key);
        }
        for key in keys.claims {
            to_claims.add(key);
        }
        for class in keys.classes {
            for claim in waiting.get(&class) {
                to_claims.add(pods::key(&claim.metadata));
            }
        }
    });
    let (to_volumes, to_claims) = (volume_queue.clone(), claim_queue.clone());
    let partners = volumes_by_claim.clone();
    claims.on_change(move |change| {
        for claim in change.objects() {
            let key = pods::key(&claim.metadata);
            for volume in partners.get(&key) {
                to_volumes.add(pods::key(&volume.metadata));
            }
            if let Some(volume) = bound_volume(claim) {
                to_volumes.add(format!("/{volume}"));
            }
            to_claims.add(key);
        }
    });
    let to_claims = claim_queue.clone();
    classes.on_change(move |change| {
        for class in change.objects() {
            for claim in unbound_by_class.get(class.metadata.name.as_deref().unwrap_or("")) {
                to_claims.add(pods::key(&claim.metadata));
            }
        }
    });

    volumes.ready().await;
    claims.ready().await;
    classes.ready().await;
    let volume_workers = run_workers(&volume_queue, 1, |key: String| {
        sync_volume_key(&client, &volumes, &claims, key)
    });
    let candidates = Candidates {
        volumes: &volumes,
        by_claim: &volumes_by_claim,
        by_class: &volumes_by_class,
    };
    let claim_workers = run_workers(&claim_queue, 1, |key: String| {
        sync_claim_key(&client, &claims, candidates, &classes, key)
    });
    futures::future::join(volume_workers, claim_workers).await;
}

/// What a volume's change queues.
#[derive(Debug, Default, PartialEq)]
struct VolumeChangeKeys {
    volumes: BTreeSet<String>,
    claims: BTreeSet<String>,
    /// Classes whose claims still to bind may take the volume now.
    classes: BTreeSet<String>,
}

/// The keys a volume's change queues: the volume, the claims its claimRef names before and
/// after, and (while it may be free) the class whose unbound claims may take it.
fn volume_change_keys(
    old: Option<&PersistentVolume>,
    new: Option<&PersistentVolume>,
) -> VolumeChangeKeys {
    let mut keys = VolumeChangeKeys::default();
    for volume in old.into_iter().chain(new) {
        keys.volumes.insert(pods::key(&volume.metadata));
        keys.claims.extend(claim_of_volume(volume));
    }
    if let Some(volume) = new
        && volume.metadata.deletion_timestamp.is_none()
        && volume.spec.as_ref().is_none_or(|s| s.claim_ref.is_none())
    {
        keys.classes.insert(volume_class(volume).to_string());
    }
    keys
}

/// The `namespace/name` of the claim a volume's claimRef names (an index function).
fn claim_of_volume(volume: &PersistentVolume) -> Vec<String> {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .map(|r| {
            format!(
                "{}/{}",
                r.namespace.as_deref().unwrap_or(""),
                r.name.as_deref().unwrap_or("")
            )
        })
        .into_iter()
        .collect()
}

/// The class of a claim not bound yet (an index function; bound claims index nothing).
fn class_of_unbound_claim(claim: &PersistentVolumeClaim) -> Vec<String> {
    if annotation(&claim.metadata, ANN_BIND_COMPLETED).is_some()
        || claim.metadata.deletion_timestamp.is_some()
    {
        return Vec::new();
    }
    vec![claim_class(claim).to_string()]
}

/// The volume a claim's `spec.volumeName` names.
fn bound_volume(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// Syncs the volume `key` (`/name`).
async fn sync_volume_key(
    client: &kube::Client,
    volumes: &Informer<PersistentVolume>,
    claims: &Informer<PersistentVolumeClaim>,
    key: String,
) -> Result<Requeue, kube::Error> {
    let (_, name) = pods::split_key(&key);
    if let Some(volume) = volumes.get("", name) {
        sync_volume(client, &volume, claims).await?;
    }
    Ok(Requeue::No)
}

/// Where the volumes a claim may bind to are found.
#[derive(Clone, Copy)]
struct Candidates<'a> {
    volumes: &'a Informer<PersistentVolume>,
    by_claim: &'a Index<PersistentVolume>,
    by_class: &'a Index<PersistentVolume>,
}

impl Candidates<'_> {
    /// The volumes of the claim's class, those pre-bound to it, and the one it names.
    fn of(&self, claim: &PersistentVolumeClaim) -> Vec<Arc<PersistentVolume>> {
        let mut found = self.by_class.get(claim_class(claim));
        found.extend(self.by_claim.get(&pods::key(&claim.metadata)));
        found.extend(bound_volume(claim).and_then(|name| self.volumes.get("", name)));
        let mut seen = BTreeSet::new();
        found.retain(|v| seen.insert(v.metadata.name.clone()));
        found
    }
}

/// Syncs the claim `key`. A volume another claim took a moment ago may still look free in
/// the cache: binding it fails on its resourceVersion and the retry sees it taken.
async fn sync_claim_key(
    client: &kube::Client,
    claims: &Informer<PersistentVolumeClaim>,
    candidates: Candidates<'_>,
    classes: &Informer<StorageClass>,
    key: String,
) -> Result<Requeue, kube::Error> {
    let (namespace, name) = pods::split_key(&key);
    let Some(claim) = claims.get(namespace, name) else {
        return Ok(Requeue::No);
    };
    if claim.metadata.deletion_timestamp.is_some() {
        return Ok(Requeue::No);
    }
    let found = candidates.of(&claim);
    let free: Vec<&PersistentVolume> = found.iter().map(|v| &**v).collect();
    sync_claim(client, &claim, &free, candidates.volumes, classes).await?;
    Ok(Requeue::No)
}

fn annotation<'a>(
    metadata: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    key: &str,
) -> Option<&'a str> {
    metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Upstream's GetPersistentVolumeClaimClass ("" for none).
fn claim_class(claim: &PersistentVolumeClaim) -> &str {
    annotation(&claim.metadata, ANN_BETA_STORAGE_CLASS)
        .or_else(|| {
            claim
                .spec
                .as_ref()
                .and_then(|s| s.storage_class_name.as_deref())
        })
        .unwrap_or("")
}

/// Upstream's GetPersistentVolumeClass ("" for none).
fn volume_class(volume: &PersistentVolume) -> &str {
    annotation(&volume.metadata, ANN_BETA_STORAGE_CLASS)
        .or_else(|| {
            volume
                .spec
                .as_ref()
                .and_then(|s| s.storage_class_name.as_deref())
        })
        .unwrap_or("")
}

fn volume_phase(volume: &PersistentVolume) -> &str {
    volume
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn claim_phase(claim: &PersistentVolumeClaim) -> &str {
    claim
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn capacity(volume: &PersistentVolume) -> Quantity {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .and_then(|q| Quantity::parse(&q.0).ok())
        .unwrap_or(Quantity::ZERO)
}

fn requested(claim: &PersistentVolumeClaim) -> Quantity {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| Quantity::parse(&q.0).ok())
        .unwrap_or(Quantity::ZERO)
}

/// Upstream's IsVolumeBoundToClaim: the volume's claimRef names this claim (and its uid,
/// once set).
fn is_bound_to(volume: &PersistentVolume, claim: &PersistentVolumeClaim) -> bool {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .is_some_and(|r| {
            r.name == claim.metadata.name
                && r.namespace == claim.metadata.namespace
                && r.uid
                    .as_deref()
                    .is_none_or(|uid| uid.is_empty() || Some(uid) == claim.metadata.uid.as_deref())
        })
}

/// Whether the volume's mode (default Filesystem) is the claim's.
fn same_mode(volume: &PersistentVolume, claim: &PersistentVolumeClaim) -> bool {
    let volume_mode = volume.spec.as_ref().and_then(|s| s.volume_mode.as_deref());
    let claim_mode = claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref());
    volume_mode.unwrap_or("Filesystem") == claim_mode.unwrap_or("Filesystem")
}

/// Upstream's findMatchingVolume: a volume pre-bound to the claim wins; otherwise the
/// smallest unclaimed Available volume of the claim's class that has every requested access
/// mode, enough capacity, the selected labels and the same volume mode. Under delayed binding
/// only pre-bound volumes are taken (the scheduler chooses the others).
fn find_best_match<'a>(
    claim: &PersistentVolumeClaim,
    volumes: &[&'a PersistentVolume],
    delay_binding: bool,
) -> Option<&'a PersistentVolume> {
    let wanted = requested(claim);
    let class = claim_class(claim);
    let spec = claim.spec.as_ref();
    let modes = spec
        .and_then(|s| s.access_modes.clone())
        .unwrap_or_default();
    let selector = spec.and_then(|s| s.selector.as_ref());
    let mut best: Option<&PersistentVolume> = None;
    for volume in volumes.iter().copied() {
        if volume.metadata.deletion_timestamp.is_some() || !same_mode(volume, claim) {
            continue;
        }
        let size = capacity(volume);
        if is_bound_to(volume, claim) {
            if size >= wanted {
                return Some(volume);
            }
            continue;
        }
        let unclaimed = volume
            .spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .is_none();
        // A volume just created is Pending until its first sync makes it Available.
        if delay_binding
            || !unclaimed
            || !matches!(volume_phase(volume), "Available" | "Pending" | "")
        {
            continue;
        }
        if volume_class(volume) != class || size < wanted {
            continue;
        }
        let labels = volume.metadata.labels.clone().unwrap_or_default();
        if selector.is_some_and(|s| !selectors::matches(s, &labels)) {
            continue;
        }
        let offered = volume
            .spec
            .as_ref()
            .and_then(|s| s.access_modes.as_deref())
            .unwrap_or_default();
        if !modes.iter().all(|m| offered.contains(m)) {
            continue;
        }
        if best.is_none_or(|b| size < capacity(b)) {
            best = Some(volume);
        }
    }
    best
}

/// Upstream's shouldDelayBinding: the claim's class binds on first consumer and the scheduler
/// has not chosen a node yet.
fn delay_binding(claim: &PersistentVolumeClaim, classes: &Informer<StorageClass>) -> bool {
    if annotation(&claim.metadata, ANN_SELECTED_NODE).is_some() {
        return false;
    }
    let class = claim_class(claim);
    !class.is_empty()
        && classes
            .get("", class)
            .is_some_and(|c| c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"))
}

async fn set_volume_phase(
    api: &Api<PersistentVolume>,
    volume: &PersistentVolume,
    phase: &str,
) -> Result<(), kube::Error> {
    if volume_phase(volume) == phase {
        return Ok(());
    }
    let Some(name) = &volume.metadata.name else {
        return Ok(());
    };
    let patch = json!({"status": {"phase": phase}});
    api.patch_status(name, &pods::manager(MANAGER), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

/// Upstream's syncVolume: Available when unclaimed, Bound when its claim is bound to it,
/// Released (then reclaimed) when its claim is gone.
async fn sync_volume(
    client: &kube::Client,
    volume: &PersistentVolume,
    claims: &Informer<PersistentVolumeClaim>,
) -> Result<(), kube::Error> {
    let api: Api<PersistentVolume> = Api::all(client.clone());
    let Some(claim_ref) = volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return set_volume_phase(&api, volume, "Available").await;
    };
    let Some(uid) = claim_ref.uid.as_deref().filter(|u| !u.is_empty()) else {
        // Pre-bound by the user to a claim that has not been bound yet.
        return set_volume_phase(&api, volume, "Available").await;
    };
    let namespace = claim_ref.namespace.as_deref().unwrap_or("");
    let claim_name = claim_ref.name.as_deref().unwrap_or("");
    let mut claim = claims
        .get(namespace, claim_name)
        .map(|c| PersistentVolumeClaim::clone(&c));
    if claim.is_none() {
        // The cache may be behind a claim created a moment ago: ask the API before releasing.
        let live: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
        claim = live.get_opt(claim_name).await?;
    }
    match claim.filter(|c| c.metadata.uid.as_deref() == Some(uid)) {
        Some(claim) => {
            let volume_name = volume.metadata.name.as_deref();
            let claimed = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref());
            if claimed == volume_name {
                set_volume_phase(&api, volume, "Bound").await
            } else if claimed.is_some_and(|c| !c.is_empty())
                && annotation(&volume.metadata, ANN_BOUND_BY_CONTROLLER).is_some()
            {
                // The claim went to another volume: undo this half-made binding.
                unbind(&api, volume).await
            } else {
                // The claim's half of the binding is still to be written (by sync_claim).
                Ok(())
            }
        }
        None => {
            if !matches!(volume_phase(volume), "Released" | "Failed") {
                set_volume_phase(&api, volume, "Released").await?;
            }
            reclaim(&api, volume).await
        }
    }
}

async fn unbind(api: &Api<PersistentVolume>, volume: &PersistentVolume) -> Result<(), kube::Error> {
    let Some(name) = &volume.metadata.name else {
        return Ok(());
    };
    let patch = json!({
        "metadata": {
            "resourceVersion": volume.metadata.resource_version,
            "annotations": {ANN_BOUND_BY_CONTROLLER: null},
        },
        "spec": {"claimRef": null},
    });
    let unbound = api
        .patch(name, &pods::manager(MANAGER), &Patch::Merge(&patch))
        .await?;
    set_volume_phase(api, &unbound, "Available").await
}

/// Upstream's reclaimVolume for a Released volume: Retain keeps it; Delete removes it when
/// no provisioner made it (a provisioner deletes its own, with the storage behind it).
async fn reclaim(
    api: &Api<PersistentVolume>,
    volume: &PersistentVolume,
) -> Result<(), kube::Error> {
    let policy = volume
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
        .unwrap_or("Retain");
    let Some(name) = &volume.metadata.name else {
        return Ok(());
    };
    if policy == "Delete"
        && volume.metadata.deletion_timestamp.is_none()
        && annotation(&volume.metadata, ANN_PROVISIONED_BY).is_none()
    {
        tracing::info!(volume = %name, "deleting a released volume (reclaim policy Delete)");
        return pods::delete(api, name, &DeleteParams::default()).await;
    }
    Ok(())
}

/// Upstream's syncClaim; returns the volume bound in this call.
async fn sync_claim(
    client: &kube::Client,
    claim: &PersistentVolumeClaim,
    volumes: &[&PersistentVolume],
    volume_cache: &Informer<PersistentVolume>,
    classes: &Informer<StorageClass>,
) -> Result<Option<String>, kube::Error> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(
        client.clone(),
        claim.metadata.namespace.as_deref().unwrap_or(""),
    );
    let volume_name = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|n| !n.is_empty());
    if annotation(&claim.metadata, ANN_BIND_COMPLETED).is_some() {
        // Bound before: keep both halves consistent, or report the volume lost.
        let Some(volume_name) = volume_name else {
            return Ok(None);
        };
        return match volume_cache.get("", volume_name) {
            Some(volume) if is_bound_to(&volume, claim) => {
                bind(client, &volume, claim).await?;
                Ok(None)
            }
            // Bound elsewhere (upstream's ClaimMisbound), or the cache is behind our write.
            Some(_) => Ok(None),
            None if claim_phase(claim) != "Lost" => {
                set_claim_status(&claims, claim, json!({"phase": "Lost"})).await?;
                Ok(None)
            }
            None => Ok(None),
        };
    }
    let chosen = match volume_name {
        // Pre-bound by the user: only that volume, if it is free for this claim.
        Some(name) => volumes
            .iter()
            .copied()
            .find(|v| v.metadata.name.as_deref() == Some(name))
            .filter(|v| {
                v.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_none()
                    || is_bound_to(v, claim)
            })
            .filter(|v| same_mode(v, claim) && capacity(v) >= requested(claim)),
        None => find_best_match(claim, volumes, delay_binding(claim, classes)),
    };
    match chosen {
        Some(volume) => {
            bind(client, volume, claim).await?;
            Ok(volume.metadata.name.clone())
        }
        None => {
            if claim_phase(claim) != "Pending" {
                set_claim_status(&claims, claim, json!({"phase": "Pending"})).await?;
            }
            Ok(None)
        }
    }
}

async fn set_claim_status(
    api: &Api<PersistentVolumeClaim>,
    claim: &PersistentVolumeClaim,
    status: serde_json::Value,
) -> Result<(), kube::Error> {
    let Some(name) = &claim.metadata.name else {
        return Ok(());
    };
    let patch = json!({"status": status});
    api.patch_status(name, &pods::manager(MANAGER), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

/// Upstream's bind: the volume's claimRef, the volume Bound, the claim's volumeName and
/// annotations, the claim Bound with the volume's modes and capacity. Each step is skipped
/// when already done, so an interrupted bind completes on the next pass.
async fn bind(
    client: &kube::Client,
    volume: &PersistentVolume,
    claim: &PersistentVolumeClaim,
) -> Result<(), kube::Error> {
    let (Some(volume_name), Some(claim_name), Some(namespace)) = (
        &volume.metadata.name,
        &claim.metadata.name,
        &claim.metadata.namespace,
    ) else {
        return Ok(());
    };
    tracing::debug!(volume = %volume_name, claim = %claim_name, %namespace, "binding");
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let has_uid = volume
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| r.uid.as_deref())
        .is_some_and(|u| Some(u) == claim.metadata.uid.as_deref());
    let mut volume = volume.clone();
    if !has_uid {
        let mut patch = json!({
            "metadata": {"resourceVersion": volume.metadata.resource_version},
            "spec": {"claimRef": {
                "kind": "PersistentVolumeClaim", "apiVersion": "v1",
                "namespace": namespace, "name": claim_name,
                "uid": claim.metadata.uid, "resourceVersion": claim.metadata.resource_version,
            }},
        });
        if !is_bound_to(&volume, claim) {
            patch["metadata"]["annotations"] = json!({ANN_BOUND_BY_CONTROLLER: "yes"});
        }
        volume = volumes
            .patch(volume_name, &pods::manager(MANAGER), &Patch::Merge(&patch))
            .await?;
    }
    set_volume_phase(&volumes, &volume, "Bound").await?;
    let claimed = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref());
    if claimed != Some(volume_name.as_str())
        || annotation(&claim.metadata, ANN_BIND_COMPLETED).is_none()
    {
        let mut annotations = json!({ANN_BIND_COMPLETED: "yes"});
        if claimed.is_none_or(str::is_empty) {
            annotations[ANN_BOUND_BY_CONTROLLER] = json!("yes");
        }
        let patch = json!({
            "metadata": {"resourceVersion": claim.metadata.resource_version, "annotations": annotations},
            "spec": {"volumeName": volume_name},
        });
        claims
            .patch(claim_name, &pods::manager(MANAGER), &Patch::Merge(&patch))
            .await?;
    }
    let spec = volume.spec.as_ref();
    let status = json!({
        "phase": "Bound",
        "accessModes": spec.and_then(|s| s.access_modes.clone()),
        "capacity": spec.and_then(|s| s.capacity.clone()),
    });
    let current = claim.status.as_ref();
    let unchanged = claim_phase(claim) == "Bound"
        && current.and_then(|s| s.access_modes.clone())
            == spec.and_then(|s| s.access_modes.clone())
        && current.and_then(|s| s.capacity.clone()) == spec.and_then(|s| s.capacity.clone());
    if !unchanged {
        set_claim_status(&claims, claim, status).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(value: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))
    }

    fn pv(
        name: &str,
        size: &str,
        class: &str,
        modes: &[&str],
        labels: serde_json::Value,
    ) -> PersistentVolume {
        volume(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"capacity": {"storage": size}, "storageClassName": class, "accessModes": modes},
            "status": {"phase": "Available"},
        }))
    }

    fn claim(spec: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "ns", "uid": "claim-uid"},
            "spec": spec,
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_smallest_fitting_volume_wins() {
        let volumes = [
            pv("big", "10Gi", "slow", &["ReadWriteOnce"], json!({})),
            pv("small", "1Gi", "slow", &["ReadWriteOnce"], json!({})),
            pv("tiny", "500Mi", "slow", &["ReadWriteOnce"], json!({})),
            pv("fast", "2Gi", "fast", &["ReadWriteOnce"], json!({})),
            pv(
                "shared",
                "3Gi",
                "slow",
                &["ReadWriteMany", "ReadWriteOnce"],
                json!({"tier": "gold"}),
            ),
        ];
        let refs: Vec<&PersistentVolume> = volumes.iter().collect();
        let name = |c: &PersistentVolumeClaim, delay: bool| {
            find_best_match(c, &refs, delay).and_then(|v| v.metadata.name.clone())
        };
        let rwo = |size: &str| {
            claim(
                json!({"storageClassName": "slow", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}),
            )
        };
        assert_eq!(name(&rwo("1Gi"), false).as_deref(), Some("small"));
        assert_eq!(name(&rwo("600Mi"), false).as_deref(), Some("small"));
        assert_eq!(name(&rwo("100Mi"), false).as_deref(), Some("tiny"));
        assert_eq!(name(&rwo("20Gi"), false), None);
        // Delayed binding leaves the choice to the scheduler.
        assert_eq!(name(&rwo("1Gi"), true), None);
        let many = claim(
            json!({"storageClassName": "slow", "accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}),
        );
        assert_eq!(name(&many, false).as_deref(), Some("shared"));
        let gold = claim(
            json!({"storageClassName": "slow", "accessModes": ["ReadWriteOnce"], "selector": {"matchLabels": {"tier": "gold"}}, "resources": {"requests": {"storage": "1Gi"}}}),
        );
        assert_eq!(name(&gold, false).as_deref(), Some("shared"));
        let block = claim(
            json!({"storageClassName": "slow", "accessModes": ["ReadWriteOnce"], "volumeMode": "Block", "resources": {"requests": {"storage": "1Gi"}}}),
        );
        assert_eq!(name(&block, false), None);
        let classless = claim(
            json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}),
        );
        assert_eq!(name(&classless, false), None);
    }

    #[test]
    fn a_pre_bound_volume_is_taken_even_when_delayed() {
        let mut reserved = pv("reserved", "5Gi", "other", &["ReadOnlyMany"], json!({}));
        if let Some(spec) = reserved.spec.as_mut() {
            spec.claim_ref =
                serde_json::from_value(json!({"namespace": "ns", "name": "data"})).ok();
        }
        let free = pv("free", "1Gi", "slow", &["ReadWriteOnce"], json!({}));
        let mut claimed = pv("claimed", "1Gi", "slow", &["ReadWriteOnce"], json!({}));
        if let Some(spec) = claimed.spec.as_mut() {
            spec.claim_ref =
                serde_json::from_value(json!({"namespace": "ns", "name": "other", "uid": "x"}))
                    .ok();
        }
        let c = claim(
            json!({"storageClassName": "slow", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}),
        );
        let refs = [&claimed, &free, &reserved];
        assert_eq!(
            find_best_match(&c, &refs, true)
                .and_then(|v| v.metadata.name.clone())
                .as_deref(),
            Some("reserved")
        );
        let refs = [&claimed, &free];
        assert_eq!(
            find_best_match(&c, &refs, false)
                .and_then(|v| v.metadata.name.clone())
                .as_deref(),
            Some("free")
        );
    }

    #[test]
    fn a_volume_change_queues_itself_its_claim_and_the_claims_that_may_take_it() {
        let free = pv("free", "1Gi", "slow", &["ReadWriteOnce"], json!({}));
        let keys = volume_change_keys(None, Some(&free));
        assert_eq!(keys.volumes, BTreeSet::from(["/free".to_string()]));
        assert!(keys.claims.is_empty());
        assert_eq!(keys.classes, BTreeSet::from(["slow".to_string()]));
        let mut bound = free.clone();
        if let Some(spec) = bound.spec.as_mut() {
            spec.claim_ref =
                serde_json::from_value(json!({"namespace": "ns", "name": "data", "uid": "u"})).ok();
        }
        // Bound: its claim, before and after; no class (it is taken).
        let keys = volume_change_keys(Some(&bound), Some(&free));
        assert_eq!(keys.claims, BTreeSet::from(["ns/data".to_string()]));
        let keys = volume_change_keys(Some(&free), Some(&bound));
        assert_eq!(keys.claims, BTreeSet::from(["ns/data".to_string()]));
        assert!(keys.classes.is_empty());
        let keys = volume_change_keys(Some(&bound), None);
        assert_eq!(keys.claims, BTreeSet::from(["ns/data".to_string()]));
        assert!(keys.classes.is_empty());
    }
}
