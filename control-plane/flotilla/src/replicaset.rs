//! The ReplicaSet controller (upstream `ReplicaSetController`, a pure API client): keeps
//! `spec.replicas` pods of each ReplicaSet, created from its template and owned by it, deletes
//! the surplus (unscheduled, then not ready, then newest first), reports status, and deletes
//! pods whose owning ReplicaSet is gone (the garbage collector's background propagation for
//! this pair).

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

/// How often every ReplicaSet is looked at again without a change seen.
const RESYNC: Duration = Duration::from_secs(5);
const MANAGER: &str = "replicaset-controller";

/// Runs the controller until the task is aborted.
pub async fn run(client: kube::Client) {
    let (sets, set_writer) = reflector::store::<ReplicaSet>();
    let (pods, pod_writer) = reflector::store::<Pod>();
    let set_events = reflector::reflector(
        set_writer,
        watcher::watcher(
            Api::<ReplicaSet>::all(client.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .touched_objects()
    .map(|_| ());
    let pod_events = reflector::reflector(
        pod_writer,
        watcher::watcher(Api::<Pod>::all(client.clone()), watcher::Config::default()),
    )
    .default_backoff()
    .touched_objects()
    .map(|_| ());
    let ticks = futures::stream::unfold((), |()| async {
        tokio::time::sleep(RESYNC).await;
        Some(((), ()))
    });
    let mut triggers =
        futures::stream::select(futures::stream::select(set_events, pod_events), ticks)
            .ready_chunks(256)
            .boxed();
    while triggers.next().await.is_some() {
        // Only with both caches filled: an empty pod cache would mean "create every replica",
        // an empty ReplicaSet cache "every owned pod is an orphan".
        if ready(&sets) && ready(&pods) {
            sync_all(&client, &sets, &pods).await;
        }
    }
}

/// Whether a reflector's cache has been filled by its first list.
pub(crate) fn ready<K>(store: &Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    futures::FutureExt::now_or_never(store.wait_until_ready()).is_some_and(|r| r.is_ok())
}

fn controller_uid(pod: &Pod) -> Option<&str> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == "ReplicaSet")
        .map(|o| o.uid.as_str())
}

fn is_active(pod: &Pod) -> bool {
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("");
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase, "Succeeded" | "Failed")
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn sync_all(client: &kube::Client, sets: &Store<ReplicaSet>, pods: &Store<Pod>) {
    let sets = sets.state();
    let pods = pods.state();
    let live: HashSet<&str> = sets
        .iter()
        .filter_map(|s| s.metadata.uid.as_deref())
        .collect();
    let mut owned: BTreeMap<&str, Vec<&Pod>> = BTreeMap::new();
    for pod in &pods {
        let Some(uid) = controller_uid(pod) else {
            continue;
        };
        if live.contains(uid) {
            owned.entry(uid).or_default().push(pod);
        } else if pod.metadata.deletion_timestamp.is_none() {
            // The owner is gone: background deletion of its dependents.
            delete_pod(client, pod).await;
        }
    }
    for set in &sets {
        let uid = set.metadata.uid.as_deref().unwrap_or("");
        let mine = owned.remove(uid).unwrap_or_default();
        if let Err(err) = sync(client, set, &mine).await {
            tracing::info!(replicaset = ?set.metadata.name, %err, "replicaset sync failed; retrying");
        }
    }
}

async fn delete_pod(client: &kube::Client, pod: &Pod) {
    let (Some(name), Some(namespace)) = (&pod.metadata.name, &pod.metadata.namespace) else {
        return;
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    if let Err(err) = api.delete(name, &DeleteParams::default()).await
        && !matches!(&err, kube::Error::Api(s) if s.code == 404)
    {
        tracing::info!(pod = %name, %err, "deleting a pod failed");
    }
}

/// One ReplicaSet: create or delete pods toward `spec.replicas`, then report status.
async fn sync(client: &kube::Client, set: &ReplicaSet, pods: &[&Pod]) -> Result<(), kube::Error> {
    let (Some(name), Some(namespace)) = (&set.metadata.name, &set.metadata.namespace) else {
        return Ok(());
    };
    if set.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let spec = set.spec.as_ref();
    let wanted = spec.and_then(|s| s.replicas).unwrap_or(1).max(0) as usize;
    let mut active: Vec<&Pod> = pods.iter().copied().filter(|p| is_active(p)).collect();
    // Status reports the pods seen at the start of this sync, as upstream's calculateStatus;
    // the next sync sees what this one created or deleted.
    let replicas = active.len();
    let ready = active.iter().filter(|p| is_ready(p)).count();
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    if active.len() < wanted {
        let template = spec.and_then(|s| s.template.clone()).unwrap_or_default();
        for _ in active.len()..wanted {
            let mut metadata = template.metadata.clone().unwrap_or_default();
            metadata.name = None;
            metadata.generate_name = Some(format!("{name}-"));
            metadata.namespace = Some(namespace.clone());
            metadata.owner_references = Some(vec![OwnerReference {
                api_version: "apps/v1".into(),
                kind: "ReplicaSet".into(),
                name: name.clone(),
                uid: set.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]);
            let pod = Pod {
                metadata,
                spec: template.spec.clone(),
                status: None,
            };
            api.create(&PostParams::default(), &pod).await?;
        }
    } else if active.len() > wanted {
        // Upstream's order of victims: unscheduled, then not ready, then the newest.
        active.sort_by_key(|p| {
            let scheduled = p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| !n.is_empty());
            (
                scheduled,
                is_ready(p),
                std::cmp::Reverse(p.metadata.creation_timestamp.clone().map(|t| t.0)),
            )
        });
        for pod in active.iter().take(active.len() - wanted) {
            delete_pod(client, pod).await;
        }
    }
    let status = json!({"status": {
        "replicas": replicas,
        "fullyLabeledReplicas": replicas,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "observedGeneration": set.metadata.generation,
    }});
    let current = set.status.as_ref();
    let unchanged = current.is_some_and(|s| {
        s.ready_replicas.unwrap_or(0) as usize == ready
            && s.observed_generation == set.metadata.generation
            && s.replicas as usize == replicas
    });
    if !unchanged {
        let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), namespace);
        let params = PatchParams {
            field_manager: Some(MANAGER.into()),
            ..Default::default()
        };
        sets.patch_status(name, &params, &Patch::Merge(&status))
            .await?;
    }
    Ok(())
}
