//! The pvc-protection and pv-protection controllers (upstream
//! `pkg/controller/volume/pvcprotection` and `pvprotection`): a claim being deleted keeps its
//! `kubernetes.io/pvc-protection` finalizer while a scheduled, unfinished pod of its
//! namespace mounts it; a volume being deleted keeps `kubernetes.io/pv-protection` while it
//! is Bound. When nothing uses them any more, the finalizer goes and the delete completes.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::informers::{Informers, Triggers};
use crate::pods;

const RESYNC: Duration = Duration::from_secs(15);
/// The claim finalizer StorageObjectInUseProtection admission adds.
pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
/// The volume finalizer StorageObjectInUseProtection admission adds.
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";

/// Runs both controllers until the task is aborted.
pub async fn run(informers: Arc<Informers>) {
    let claims = informers.get::<PersistentVolumeClaim>();
    let volumes = informers.get::<PersistentVolume>();
    let pod_cache = informers.get::<Pod>();
    let client = informers.client().clone();
    let mut triggers = Triggers::new(RESYNC)
        .on(&claims)
        .on(&volumes)
        .on(&pod_cache);
    loop {
        triggers.next().await;
        if !(claims.is_ready() && volumes.is_ready() && pod_cache.is_ready()) {
            continue;
        }
        let all_pods = pod_cache.list();
        for claim in claims.list() {
            if is_releasable(&claim.metadata, PVC_PROTECTION) && !claim_in_use(&claim, &all_pods) {
                let namespace = claim.metadata.namespace.as_deref().unwrap_or("");
                let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
                release(&api, &claim.metadata, PVC_PROTECTION).await;
            }
        }
        for volume in volumes.list() {
            let bound = volume.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
            if is_releasable(&volume.metadata, PV_PROTECTION) && !bound {
                let api: Api<PersistentVolume> = Api::all(client.clone());
                release(&api, &volume.metadata, PV_PROTECTION).await;
            }
        }
    }
}

/// Being deleted and still held by `finalizer`.
fn is_releasable(metadata: &ObjectMeta, finalizer: &str) -> bool {
    metadata.deletion_timestamp.is_some()
        && metadata.finalizers.iter().flatten().any(|f| f == finalizer)
}

/// Whether a scheduled pod that has not finished mounts `claim` (directly, or as the claim
/// of one of its generic ephemeral volumes, named `<pod>-<volume>`).
fn claim_in_use(claim: &PersistentVolumeClaim, all_pods: &[Arc<Pod>]) -> bool {
    let name = claim.metadata.name.as_deref().unwrap_or("");
    let namespace = claim.metadata.namespace.as_deref();
    all_pods.iter().any(|pod| {
        let Some(spec) = &pod.spec else {
            return false;
        };
        if pod.metadata.namespace.as_deref() != namespace
            || spec.node_name.as_deref().unwrap_or("").is_empty()
            || pods::is_finished(pod)
        {
            return false;
        }
        let pod_name = pod.metadata.name.as_deref().unwrap_or("");
        spec.volumes.iter().flatten().any(|volume| {
            volume
                .persistent_volume_claim
                .as_ref()
                .is_some_and(|c| c.claim_name == name)
                || (volume.ephemeral.is_some() && format!("{pod_name}-{}", volume.name) == name)
        })
    })
}

/// Removes `finalizer`, against the resourceVersion it was seen at (a concurrent change
/// makes the next pass look again).
async fn release<K>(api: &Api<K>, metadata: &ObjectMeta, finalizer: &str)
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
    if let Err(err) = api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        tracing::info!(%name, %err, finalizer, "could not remove the protection finalizer; retrying");
    }
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
}
