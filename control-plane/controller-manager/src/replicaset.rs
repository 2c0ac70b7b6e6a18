//! The ReplicaSet controller (upstream `ReplicaSetController`, a pure API client): keeps
//! `spec.replicas` pods of each ReplicaSet, created from its template and owned by it, deletes
//! the surplus (unscheduled, then not ready, then newest first) and reports status. Creates go
//! out in upstream's slow-start batches (1, 2, 4, …), and expectations keep a sync that runs
//! before the watch has caught up from creating duplicates. A change to a ReplicaSet or to a
//! pod it controls queues the ReplicaSet (per-object work queue).

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PostParams};
use serde_json::json;

use crate::expectations::Expectations;
use crate::handlers;
use crate::informers::{Index, Informer, Informers};
use crate::pods;
use crate::workqueue::{Requeue, WorkQueue, run_workers};

const MANAGER: &str = "replicaset-controller";
/// The largest batch of pod creates in flight at once (upstream's burst).
const MAX_BATCH: usize = 500;
/// ReplicaSets synced at once (upstream's `--concurrent-replicaset-syncs`).
const CONCURRENT_SYNCS: usize = 5;

/// Runs the controller until the task is aborted: a change to a ReplicaSet, or to a pod it
/// controls, queues that ReplicaSet's key; workers sync one key at a time each.
pub async fn run(informers: Arc<Informers>) {
    let sets = informers.get::<ReplicaSet>();
    let pods = informers.get::<Pod>();
    let owned = pods.index(pods::BY_CONTROLLER_UID, pods::controller_uid::<Pod>);
    let client = informers.client().clone();
    let queue = Arc::new(WorkQueue::new("replicaset"));
    let expectations = Arc::new(Expectations::default());
    handlers::queue_each(&sets, &queue);
    handlers::queue_pod_controller(&pods, &queue, "ReplicaSet", &expectations);
    // Only with both caches filled: an empty pod cache would mean "create every replica".
    sets.ready().await;
    pods.ready().await;
    run_workers(&queue, CONCURRENT_SYNCS, |key: String| {
        sync_key(&client, &sets, &owned, &expectations, key)
    })
    .await
}

/// Syncs the ReplicaSet `key` from the caches.
async fn sync_key(
    client: &kube::Client,
    sets: &Informer<ReplicaSet>,
    owned: &Index<Pod>,
    expectations: &Expectations,
    key: String,
) -> Result<Requeue, kube::Error> {
    let (namespace, name) = pods::split_key(&key);
    let Some(set) = sets.get(namespace, name) else {
        expectations.forget(&key);
        return Ok(Requeue::No);
    };
    let uid = set.metadata.uid.as_deref().unwrap_or("");
    let pods_now = owned.get(uid);
    let caught_up = expectations.satisfied(
        &key,
        |pod| {
            pods_now
                .iter()
                .any(|p| p.metadata.name.as_deref() == Some(pod))
        },
        |pod| {
            !pods_now.iter().any(|p| {
                p.metadata.name.as_deref() == Some(pod) && p.metadata.deletion_timestamp.is_none()
            })
        },
    );
    if !caught_up {
        // Its pods' events queue it again; the timeout is the backstop.
        return Ok(Requeue::After(expectations.remaining(&key)));
    }
    let active: Vec<&Pod> = pods_now
        .iter()
        .map(|p| &**p)
        .filter(|p| pods::is_active(p))
        .collect();
    sync(client, &set, active, expectations).await
}

/// `spec.replicas` (default 1).
fn wanted_replicas(set: &ReplicaSet) -> usize {
    set.spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or(1)
        .max(0) as usize
}

/// One ReplicaSet, given its active pods: create or delete pods toward `spec.replicas`, then
/// report status.
async fn sync(
    client: &kube::Client,
    set: &ReplicaSet,
    mut active: Vec<&Pod>,
    expectations: &Expectations,
) -> Result<Requeue, kube::Error> {
    let (Some(name), Some(namespace)) = (&set.metadata.name, &set.metadata.namespace) else {
        return Ok(Requeue::No);
    };
    if set.metadata.deletion_timestamp.is_some() {
        return Ok(Requeue::No);
    }
    let key = pods::key(&set.metadata);
    let spec = set.spec.as_ref();
    let wanted = wanted_replicas(set);
    // Status reports the pods seen at the start of this sync, as upstream's calculateStatus;
    // the next sync sees what this one created or deleted.
    let replicas = active.len();
    let ready = active.iter().filter(|p| pods::is_ready(p)).count();
    let min_ready_seconds = spec.and_then(|s| s.min_ready_seconds).unwrap_or(0);
    let available = active
        .iter()
        .filter(|p| is_available(p, min_ready_seconds))
        .count();
    let labeled = active
        .iter()
        .filter(|p| {
            let labels = p.metadata.labels.clone().unwrap_or_default();
            spec.and_then(|s| s.template.as_ref())
                .and_then(|t| t.metadata.as_ref())
                .and_then(|m| m.labels.as_ref())
                .is_none_or(|want| want.iter().all(|(k, v)| labels.get(k) == Some(v)))
        })
        .count();
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    if active.len() < wanted {
        let template = spec.and_then(|s| s.template.clone()).unwrap_or_default();
        let owner = pods::controller_reference("apps/v1", "ReplicaSet", &set.metadata);
        let pod = pods::from_template(&template, namespace, None, &format!("{name}-"), owner);
        create_in_batches(&api, &pod, wanted - active.len(), &key, expectations).await?;
    } else if active.len() > wanted {
        // Upstream's order of victims: unscheduled, then not ready, then the newest.
        active.sort_by_key(|p| {
            (
                pods::is_scheduled(p),
                pods::is_ready(p),
                std::cmp::Reverse(p.metadata.creation_timestamp.clone().map(|t| t.0)),
            )
        });
        let victims: Vec<String> = active
            .iter()
            .take(active.len() - wanted)
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        for victim in &victims {
            expectations.deleted(&key, victim);
        }
        futures::stream::iter(victims.into_iter().map(|victim| {
            let api = api.clone();
            async move { pods::delete(&api, &victim, &DeleteParams::default()).await }
        }))
        .buffer_unordered(MAX_BATCH)
        .try_collect::<Vec<()>>()
        .await?;
    }
    let current = set.status.as_ref();
    let unchanged = current.is_some_and(|s| {
        s.replicas as usize == replicas
            && s.ready_replicas.unwrap_or(0) as usize == ready
            && s.available_replicas.unwrap_or(0) as usize == available
            && s.fully_labeled_replicas.unwrap_or(0) as usize == labeled
            && s.observed_generation == set.metadata.generation
    });
    if !unchanged {
        let status = json!({"status": {
            "replicas": replicas,
            "fullyLabeledReplicas": labeled,
            "readyReplicas": ready,
            "availableReplicas": available,
            "observedGeneration": set.metadata.generation,
        }});
        let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), namespace);
        sets.patch_status(name, &pods::manager(MANAGER), &Patch::Merge(&status))
            .await?;
    }
    // Ready pods become available only once minReadySeconds have passed, which no event
    // announces: look again then (upstream's AddAfter).
    if min_ready_seconds > 0 && ready > available {
        return Ok(Requeue::After(Duration::from_secs(
            u64::try_from(min_ready_seconds).unwrap_or(0),
        )));
    }
    Ok(Requeue::No)
}

/// Ready for at least `min_ready_seconds` (upstream's IsPodAvailable).
pub fn is_available(pod: &Pod, min_ready_seconds: i32) -> bool {
    let Some(ready) = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready" && c.status == "True"))
    else {
        return false;
    };
    if min_ready_seconds <= 0 {
        return true;
    }
    ready.last_transition_time.as_ref().is_some_and(|since| {
        let ready_for = k8s_openapi::jiff::Timestamp::now().duration_since(since.0);
        ready_for.as_secs() >= i64::from(min_ready_seconds)
    })
}

/// Upstream's slowStartBatch: creates `count` copies of `pod` in batches of 1, 2, 4, … up to
/// [`MAX_BATCH`], stopping at the first batch with a failure so an invalid template costs
/// one request, not `count`.
async fn create_in_batches(
    api: &Api<Pod>,
    pod: &Pod,
    count: usize,
    owner: &str,
    expectations: &Expectations,
) -> Result<(), kube::Error> {
    let params = PostParams::default();
    let mut remaining = count;
    let mut batch = 1;
    while remaining > 0 {
        let size = batch.min(remaining);
        let outcomes: Vec<Result<Pod, kube::Error>> = futures::stream::iter((0..size).map(|_| {
            let (api, pod, params) = (api.clone(), pod.clone(), params.clone());
            async move { api.create(&params, &pod).await }
        }))
        .buffer_unordered(size)
        .collect()
        .await;
        let mut failure = None;
        for outcome in outcomes {
            match outcome {
                Ok(created) => {
                    if let Some(name) = &created.metadata.name {
                        expectations.created(owner, name);
                    }
                }
                Err(err) => failure = Some(err),
            }
        }
        if let Some(err) = failure {
            return Err(err);
        }
        remaining -= size;
        batch = (batch * 2).min(MAX_BATCH);
    }
    Ok(())
}
