//! The pvc-protection and pv-protection controllers (upstream
//! `pkg/controller/volume/pvcprotection` and `pvprotection`): a claim being deleted keeps its
//! `kubernetes.io/pvc-protection` finalizer while a scheduled, unfinished pod of its
//! namespace mounts it; a volume being deleted keeps `kubernetes.io/pv-protection` while it
//! is Bound. When nothing uses them any more, the finalizer goes and the delete completes.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::informers::{Index, Informer, Informers};
use crate::pods;
use crate::workqueue::{Requeue, WorkQueue, run_workers};

/// The claim finalizer StorageObjectInUseProtection admission adds.
pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
/// The volume finalizer StorageObjectInUseProtection admission adds.
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";
/// Runs both controllers until the task is aborted: a claim or volume being deleted queues
/// itself, and a pod that stops using claims (deleted, finished or not scheduled) queues
/// them (upstream's handlers); one worker each releases what nothing uses any more.
pub async fn run(informers: Arc<Informers>) {
    let claims = informers.get::<PersistentVolumeClaim>();
    let volumes = informers.get::<PersistentVolume>();
    let pod_cache = informers.get::<Pod>();
    let pods_by_namespace = pod_cache.by_namespace();
    let client = informers.client().clone();
    let claim_queue = Arc::new(WorkQueue::new("pvcprotection"));
    let volume_queue = Arc::new(WorkQueue::new("pvprotection"));

    let on_claim = claim_queue.clone();
    claims.on_change(move |change| {
        if let Some(claim) = change.new
            && is_releasable(&claim.metadata, PVC_PROTECTION)
        {
            on_claim.add(pods::key(&claim.metadata));
        }
    });
    let on_pod = claim_queue.clone();
    pod_cache.on_change(move |change| {
        for key in claims_released_by(change.old, change.new) {
            on_pod.add(key);
        }
    });
    let on_volume = volume_queue.clone();
    volumes.on_change(move |change| {
        if let Some(volume) = change.new
            && is_releasable(&volume.metadata, PV_PROTECTION)
        {
            on_volume.add(pods::key(&volume.metadata));
        }
    });

    claims.ready().await;
    volumes.ready().await;
    pod_cache.ready().await;
    let claim_workers = run_workers(&claim_queue, 1, |key: String| {
        sync_claim(&client, &claims, &pods_by_namespace, key)
    });
    let volume_workers = run_workers(&volume_queue, 1, |key: String| {
        sync_volume(&client, &volumes, key)
    });
    futures::future::join(claim_workers, volume_workers).await;
}

/// Upstream's podAddedDeletedUpdated: the keys of the claims a pod mounts (before or after
/// the change) when the change may release them — the pod is gone, finished or not
/// scheduled; a pod that keeps its claims queues nothing.
fn claims_released_by(old: Option<&Pod>, new: Option<&Pod>) -> BTreeSet<String> {
    if new.is_some_and(holds_claims) {
        return BTreeSet::new();
    }
    old.into_iter()
        .chain(new)
        .flat_map(|pod| {
            let namespace = pod.metadata.namespace.as_deref().unwrap_or("");
            claim_names(pod).map(move |claim| format!("{namespace}/{claim}"))
        })
        .collect()
}

/// Whether `pod` keeps the claims it mounts: scheduled and not finished.
fn holds_claims(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .is_some_and(|s| !s.node_name.as_deref().unwrap_or("").is_empty())
        && !pods::is_finished(pod)
}

/// The claims `pod` mounts: directly, or as the claim of one of its generic ephemeral
/// volumes (named `<pod>-<volume>`).
fn claim_names(pod: &Pod) -> impl Iterator<Item = String> + '_ {
    let pod_name = pod.metadata.name.as_deref().unwrap_or("");
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(move |volume| {
            if let Some(claim) = &volume.persistent_volume_claim {
                Some(claim.claim_name.clone())
            } else {
                volume
                    .ephemeral
                    .as_ref()
                    .map(|_| format!("{pod_name}-{}", volume.name))
            }
        })
}

/// Releases the claim `key` when it is being deleted and no pod uses it.
async fn sync_claim(
    client: &kube::Client,
    claims: &Informer<PersistentVolumeClaim>,
    pods_by_namespace: &Index<Pod>,
    key: String,
) -> Result<Requeue, kube::Error> {
    let (namespace, name) = pods::split_key(&key);
    let Some(claim) = claims.get(namespace, name) else {
        return Ok(Requeue::No);
    };
    if is_releasable(&claim.metadata, PVC_PROTECTION)
        && !claim_in_use(&claim, &pods_by_namespace.get(namespace))
    {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
        release(&api, &claim.metadata, PVC_PROTECTION).await?;
    }
    Ok(Requeue::No)
}

/// Releases the volume `key` when it is being deleted and not Bound.
async fn sync_volume(
    client: &kube::Client,
    volumes: &Informer<PersistentVolume>,
    key: String,
) -> Result<Requeue, kube::Error> {
    let (_, name) = pods::split_key(&key);
    let Some(volume) = volumes.get("", name) else {
        return Ok(Requeue::No);
    };
    let bound = volume.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    if is_releasable(&volume.metadata, PV_PROTECTION) && !bound {
        let api: Api<PersistentVolume> = Api::all(client.clone());
        release(&api, &volume.metadata, PV_PROTECTION).await?;
    }
    Ok(Requeue::No)
}

/// Being deleted and still held by `finalizer`.
fn is_releasable(metadata: &ObjectMeta, finalizer: &str) -> bool {
    metadata.deletion_timestamp.is_some()
        && metadata.finalizers.iter().flatten().any(|f| f == finalizer)
}

/// Whether a scheduled pod that has not finished mounts `claim`.
fn claim_in_use(claim: &PersistentVolumeClaim, all_pods: &[Arc<Pod>]) -> bool {
    let name = claim.metadata.name.as_deref().unwrap_or("");
    let namespace = claim.metadata.namespace.as_deref();
    all_pods.iter().any(|pod| {
        pod.metadata.namespace.as_deref() == namespace
            && holds_claims(pod)
            && claim_names(pod).any(|c| c == name)
    })
}

/// Removes `finalizer`, against the resourceVersion it was seen at (a concurrent change
/// fails the write, and the retry reads the newer object).
async fn release<K>(api: &Api<K>, metadata: &ObjectMeta, finalizer: &str) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let rest: Vec<&String> = metadata
        .finalizers
        .iter()
        .flatten()
        .filter(|f| *f != finalizer)
        .collect();
    let patch = json!({"metadata": {
        "finalizers": rest,
        "resourceVersion": metadata.resource_version,
    }});
    let name = metadata.name.as_deref().unwrap_or("");
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: serde_json::Value) -> Arc<Pod> {
        Arc::new(serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}")))
    }

    #[test]
    fn only_scheduled_unfinished_pods_keep_a_claim() {
        let claim: PersistentVolumeClaim =
            serde_json::from_value(json!({"metadata": {"name": "data", "namespace": "ns"}}))
                .unwrap_or_else(|e| panic!("{e}"));
        let mounting = |node: &str, phase: &str, namespace: &str| {
            pod(json!({"metadata": {"name": "p", "namespace": namespace},
                "spec": {"nodeName": node, "containers": [],
                    "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]},
                "status": {"phase": phase}}))
        };
        assert!(claim_in_use(&claim, &[mounting("n1", "Running", "ns")]));
        assert!(!claim_in_use(&claim, &[mounting("", "Pending", "ns")]));
        assert!(!claim_in_use(&claim, &[mounting("n1", "Succeeded", "ns")]));
        assert!(!claim_in_use(&claim, &[mounting("n1", "Running", "other")]));
        let ephemeral = pod(json!({"metadata": {"name": "web", "namespace": "ns"},
            "spec": {"nodeName": "n1", "containers": [],
                "volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]}}));
        let generated: PersistentVolumeClaim =
            serde_json::from_value(json!({"metadata": {"name": "web-scratch", "namespace": "ns"}}))
                .unwrap_or_else(|e| panic!("{e}"));
        assert!(claim_in_use(&generated, &[ephemeral]));
    }

    #[test]
    fn a_pod_queues_its_claims_only_when_it_may_release_them() {
        let with = |node: &str, phase: &str| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "ns"},
                "spec": {"nodeName": node, "containers": [], "volumes": [
                    {"name": "v", "persistentVolumeClaim": {"claimName": "data"}},
                    {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                    {"name": "cfg", "configMap": {"name": "c"}}]},
                "status": {"phase": phase}}))
            .unwrap_or_else(|e| panic!("{e}"))
        };
        let running = with("n1", "Running");
        let keys = |old: Option<&Pod>, new: Option<&Pod>| {
            claims_released_by(old, new).into_iter().collect::<Vec<_>>()
        };
        assert!(keys(None, Some(&running)).is_empty());
        assert!(keys(Some(&running), Some(&running)).is_empty());
        let both = ["ns/data", "ns/web-scratch"];
        assert_eq!(keys(Some(&running), None), both);
        assert_eq!(keys(Some(&running), Some(&with("n1", "Succeeded"))), both);
        assert_eq!(keys(None, Some(&with("", "Pending"))), both);
    }
}
