//! The ReplicaSet controller (upstream `ReplicaSetController`, a pure API client): keeps
//! `spec.replicas` pods of each ReplicaSet, created from its template and owned by it, deletes
//! the surplus (unscheduled, then not ready, then newest first) and reports status. Creates go
//! out in upstream's slow-start batches (1, 2, 4, …), and expectations keep a pass that runs
//! before the watch has caught up from creating duplicates.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PostParams};
use serde_json::json;

use crate::expectations::Expectations;
use crate::informers::{Informer, Informers, Triggers};
use crate::pods;

/// How often every ReplicaSet is looked at again without a change seen.
const RESYNC: Duration = Duration::from_secs(5);
const MANAGER: &str = "replicaset-controller";
/// The largest batch of pod creates in flight at once (upstream's burst).
const MAX_BATCH: usize = 500;
/// ReplicaSets synced at once.
const CONCURRENT_SYNCS: usize = 16;

/// Runs the controller until the task is aborted.
pub async fn run(informers: Arc<Informers>) {
    let sets = informers.get::<ReplicaSet>();
    let pods = informers.get::<Pod>();
    let client = informers.client().clone();
    let expectations = Expectations::default();
    let mut triggers = Triggers::new(RESYNC).on(&sets).on(&pods);
    loop {
        triggers.next().await;
        // Only with both caches filled: an empty pod cache would mean "create every replica".
        if sets.is_ready() && pods.is_ready() {
            sync_all(&client, &sets, &pods, &expectations).await;
        }
    }
}

async fn sync_all(
    client: &kube::Client,
    sets: &Informer<ReplicaSet>,
    pods: &Informer<Pod>,
    expectations: &Expectations,
) {
    let all_pods = pods.list();
    let mut owned: BTreeMap<&str, Vec<&Pod>> = BTreeMap::new();
    for pod in &all_pods {
        if let Some(owner) = pods::controller_of(&pod.metadata, "ReplicaSet") {
            owned.entry(owner.uid.as_str()).or_default().push(pod);
        }
    }
    let sets_now = sets.list();
    let mut shrinking: Vec<BoxFuture<'_, ()>> = Vec::new();
    let mut others: Vec<BoxFuture<'_, ()>> = Vec::new();
    for set in &sets_now {
        let key = pods::key(&set.metadata);
        let namespace = set.metadata.namespace.as_deref().unwrap_or("");
        let caught_up = expectations.satisfied(
            &key,
            |name| pods.get(namespace, name).is_some(),
            |name| {
                pods.get(namespace, name)
                    .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
            },
        );
        if !caught_up {
            continue;
        }
        let uid = set.metadata.uid.as_deref().unwrap_or("");
        let active: Vec<&Pod> = owned
            .remove(uid)
            .unwrap_or_default()
            .into_iter()
            .filter(|p| pods::is_active(p))
            .collect();
        let queue = if active.len() > wanted_replicas(set) {
            &mut shrinking
        } else {
            &mut others
        };
        queue.push(
            async move {
                if let Err(err) = sync(client, set, active, expectations).await {
                    tracing::info!(replicaset = %key, %err, "replicaset sync failed; retrying");
                }
            }
            .boxed(),
        );
    }
    // Scale-downs go first: a Deployment rolling with maxSurge shrinks its old set before it
    // grows the new one, and when both changes reach one pass, deleting first keeps the pods
    // that exist within the surge (upstream's per-set queue does so only by timing).
    // ReplicaSets are otherwise independent: syncing several at once keeps a large scale-up
    // of one from holding up the others.
    for syncs in [shrinking, others] {
        futures::stream::iter(syncs)
            .buffer_unordered(CONCURRENT_SYNCS)
            .collect::<Vec<()>>()
            .await;
    }
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
) -> Result<(), kube::Error> {
    let (Some(name), Some(namespace)) = (&set.metadata.name, &set.metadata.namespace) else {
        return Ok(());
    };
    if set.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let key = pods::key(&set.metadata);
    let spec = set.spec.as_ref();
    let wanted = wanted_replicas(set);
    // Status reports the pods seen at the start of this sync, as upstream's calculateStatus;
    // the next sync sees what this one created or deleted.
    let replicas = active.len();
    let ready = active.iter().filter(|p| pods::is_ready(p)).count();
    let available = active
        .iter()
        .filter(|p| is_available(p, spec.and_then(|s| s.min_ready_seconds).unwrap_or(0)))
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
    Ok(())
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
