//! The resource quota controller (upstream `pkg/controller/resourcequota` with the core
//! evaluators): `status.hard` mirrors `spec.hard`, `status.used` counts what the namespace
//! holds of each hard resource — objects (`pods`, `services`, `count/<resource>.<group>`, …),
//! the requests and limits of its non-terminal pods (`requests.cpu`, `limits.memory`, bare
//! `cpu` / `memory`), claimed storage — with the Terminating / NotTerminating / BestEffort /
//! NotBestEffort scopes and the PriorityClass scope selector (the evaluators are
//! `flotilla_api_machinery::quota`, shared with admission). Caches of the counted kinds
//! start only when some quota names them, so an idle cluster pays for none. Admission-time
//! enforcement is not here (that is the API server's).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, ReplicationController, ResourceQuota, Secret, Service,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as WireQuantity;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch};
use serde_json::json;

use flotilla_api_machinery::quantity::Quantity;
use flotilla_api_machinery::quota::{
    Kind, Tracked, claim_class, claim_request, classify, pod_counts, pod_in_scope, pod_usage,
};

use crate::informers::{Change, Index, Informer, Informers};
use crate::pods;
use crate::workqueue::{Requeue, WorkQueue, run_workers};

const MANAGER: &str = "resourcequota-controller";
/// Quotas synced at once (upstream's `--concurrent-resource-quota-syncs`).
const CONCURRENT_SYNCS: usize = 5;
/// How long a sync waits for a counted kind's cache to fill before trying again later.
const CACHE_FILL_WAIT: Duration = Duration::from_secs(5);
/// How often a quota counting kinds without a cache here (custom resources, counted by
/// listing) is recounted: no event announces their changes to this controller.
const LISTED_RECOUNT: Duration = Duration::from_secs(10);
/// Evaluates `$body` with `$k` the Rust type of the counted kind `$kind`.
macro_rules! with_kind {
    ($kind:expr, $k:ident => $body:expr) => {
        match $kind {
            Kind::Service => {
                type $k = Service;
                $body
            }
            Kind::ConfigMap => {
                type $k = ConfigMap;
                $body
            }
            Kind::Secret => {
                type $k = Secret;
                $body
            }
            Kind::PersistentVolumeClaim => {
                type $k = PersistentVolumeClaim;
                $body
            }
            Kind::ReplicationController => {
                type $k = ReplicationController;
                $body
            }
            Kind::ResourceQuota => {
                type $k = ResourceQuota;
                $body
            }
            Kind::Deployment => {
                type $k = Deployment;
                $body
            }
            Kind::ReplicaSet => {
                type $k = ReplicaSet;
                $body
            }
            Kind::StatefulSet => {
                type $k = StatefulSet;
                $body
            }
            Kind::DaemonSet => {
                type $k = DaemonSet;
                $body
            }
            Kind::Job => {
                type $k = Job;
                $body
            }
            Kind::CronJob => {
                type $k = CronJob;
                $body
            }
        }
    };
}

/// The objects of `K` in `namespace`, from its (lazily started) cache; `None` until it has
/// filled.
fn in_namespace<K>(informers: &Informers, namespace: &str) -> Option<Vec<Arc<K>>>
where
    K: crate::informers::Cacheable,
{
    let informer: Informer<K> = informers.get::<K>();
    informer
        .is_ready()
        .then(|| informer.by_namespace().get(namespace))
}

fn count_of(informers: &Informers, kind: Kind, namespace: &str) -> Option<usize> {
    with_kind!(kind, K => in_namespace::<K>(informers, namespace).map(|v| v.len()))
}

/// The kind whose cache a tracked resource reads, beyond pods.
fn kind_needed(tracked: &Tracked) -> Option<Kind> {
    match tracked {
        Tracked::Objects(kind) => Some(*kind),
        Tracked::LoadBalancers | Tracked::NodePorts => Some(Kind::Service),
        Tracked::ClaimedStorage(_) | Tracked::ClassClaims(_) => Some(Kind::PersistentVolumeClaim),
        Tracked::Pods | Tracked::Requests(_) | Tracked::Limits(_) => None,
    }
}

/// What the workers share.
struct Context {
    client: kube::Client,
    informers: Arc<Informers>,
    quotas: Informer<ResourceQuota>,
    quotas_by_namespace: Index<ResourceQuota>,
    pods_by_namespace: Index<Pod>,
    queue: Arc<WorkQueue<String>>,
    /// The kinds whose caches quotas have named, each watched once.
    watched: Mutex<BTreeSet<Kind>>,
    decreases: Mutex<Decreases>,
}

/// Runs the controller until the task is aborted: a quota's change queues it; a change to
/// a counted object that may change usage (upstream's replenishment: a delete, a pod turning
/// terminal, a resize) queues the quotas of its namespace. Caches of the kinds quotas name
/// start, with their handlers, when a quota naming them is first synced.
pub async fn run(informers: Arc<Informers>) {
    let quotas = informers.get::<ResourceQuota>();
    let pods = informers.get::<Pod>();
    let context = Context {
        client: informers.client().clone(),
        informers: informers.clone(),
        quotas_by_namespace: quotas.by_namespace(),
        pods_by_namespace: pods.by_namespace(),
        quotas: quotas.clone(),
        queue: Arc::new(WorkQueue::new("resource_quota_primary")),
        watched: Mutex::default(),
        decreases: Mutex::default(),
    };
    let on_quota = context.queue.clone();
    quotas.on_change(move |change| {
        if quota_needs_sync(change) {
            for quota in change.objects() {
                on_quota.add(pods::key(&quota.metadata));
            }
        }
    });
    let on_pod = context.queue.clone();
    let pod_quotas = context.quotas_by_namespace.clone();
    pods.on_change(move |change| {
        if pod_usage_changed(change.old, change.new) {
            enqueue_namespace(&on_pod, &pod_quotas, change);
        }
    });
    // Without both caches filled a count would be zero, not unknown.
    quotas.ready().await;
    pods.ready().await;
    let context = &context;
    run_workers(&context.queue, CONCURRENT_SYNCS, |key: String| {
        sync_key(context, key)
    })
    .await
}

/// Queues the quotas of the changed object's namespace.
fn enqueue_namespace<K: kube::Resource>(
    queue: &WorkQueue<String>,
    quotas: &Index<ResourceQuota>,
    change: &Change<'_, K>,
) {
    let Some(object) = change.new.or(change.old) else {
        return;
    };
    for quota in quotas.get(object.meta().namespace.as_deref().unwrap_or("")) {
        queue.add(pods::key(&quota.metadata));
    }
}

/// Upstream's quota handlers: a new or deleted quota, a changed spec, or a status whose
/// `hard` does not show the spec's yet.
fn quota_needs_sync(change: &Change<'_, ResourceQuota>) -> bool {
    let (Some(old), Some(new)) = (change.old, change.new) else {
        return true;
    };
    let hard = |q: &ResourceQuota| q.spec.as_ref().and_then(|s| s.hard.clone());
    old.spec != new.spec || new.status.as_ref().and_then(|s| s.hard.clone()) != hard(new)
}

/// Whether a pod's change may change what quotas count of it: it came or went, turned
/// terminal, started deleting, or changed what it requests or which scopes hold for it.
fn pod_usage_changed(old: Option<&Pod>, new: Option<&Pod>) -> bool {
    let (Some(old), Some(new)) = (old, new) else {
        return true;
    };
    let view = |pod: &Pod| {
        let spec = pod.spec.as_ref();
        (
            pods::is_finished(pod),
            pod.metadata.deletion_timestamp.clone(),
            pod.metadata.deletion_grace_period_seconds,
            spec.and_then(|s| s.active_deadline_seconds),
            spec.and_then(|s| s.priority_class_name.clone()),
            spec.and_then(|s| s.overhead.clone()),
            spec.map(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
                    .map(|c| c.resources.clone())
                    .collect::<Vec<_>>()
            }),
        )
    };
    view(old) != view(new)
}

/// Whether a change to a counted object of another kind may change usage: it came or went,
/// or (Services, claims) what is counted of it changed.
fn object_usage_changed<K: serde::Serialize>(kind: Kind, old: Option<&K>, new: Option<&K>) -> bool {
    let (Some(old), Some(new)) = (old, new) else {
        return true;
    };
    match kind {
        Kind::Service | Kind::PersistentVolumeClaim => {
            let spec = |o: &K| serde_json::to_value(o).ok().map(|v| v["spec"].clone());
            spec(old) != spec(new)
        }
        _ => false,
    }
}

/// Starts the cache of `kind` (once) with a handler queueing the quotas of a changed
/// object's namespace.
fn watch_kind(context: &Context, kind: Kind) {
    if !context
        .watched
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(kind)
    {
        return;
    }
    let queue = context.queue.clone();
    let quotas = context.quotas_by_namespace.clone();
    with_kind!(kind, K => {
        let informer = context.informers.get::<K>();
        informer.by_namespace();
        informer.on_change(move |change| {
            if object_usage_changed(kind, change.old, change.new) {
                enqueue_namespace(&queue, &quotas, change);
            }
        });
    })
}

/// Waits (a while) for the cache of `kind` to fill.
async fn kind_ready(informers: &Informers, kind: Kind) -> bool {
    with_kind!(kind, K => {
        let informer = informers.get::<K>();
        tokio::time::timeout(CACHE_FILL_WAIT, informer.ready()).await.is_ok()
    })
}

/// How long a lower count must hold before it replaces `status.used`. Admission charges a
/// create to the quota just before the object is stored, so for a moment the caches here
/// lack an object the quota already counts; writing that lower count would hand its unit
/// to a second create. An object stored is in the caches well within this time.
const DECREASE_CONFIRMATION: Duration = Duration::from_secs(1);

/// Lower counts seen once, by quota (namespace, name): the count and when it was first seen.
type Decreases = HashMap<(String, String), (BTreeMap<String, String>, Instant)>;

/// Whether `used` may replace `current`: at once when nothing in it went down, else only
/// once the same lower count has been seen for [`DECREASE_CONFIRMATION`].
fn confirmed(
    decreases: &mut Decreases,
    key: (String, String),
    used: &BTreeMap<String, String>,
    current: &BTreeMap<String, String>,
) -> bool {
    let lower = used.iter().any(|(name, amount)| {
        let (Ok(next), Some(Ok(now))) = (
            Quantity::parse(amount),
            current.get(name).map(|c| Quantity::parse(c)),
        ) else {
            return false;
        };
        next < now
    });
    if !lower {
        decreases.remove(&key);
        return true;
    }
    match decreases.get(&key) {
        Some((seen, since)) if seen == used && since.elapsed() >= DECREASE_CONFIRMATION => {
            decreases.remove(&key);
            true
        }
        Some((seen, _)) if seen == used => false,
        _ => {
            decreases.insert(key, (used.clone(), Instant::now()));
            false
        }
    }
}

/// The usage of every hard resource of `quota` this controller measures; `None` while a
/// cache it needs is still filling.
fn usage(
    informers: &Informers,
    quota: &ResourceQuota,
    namespace_pods: &[&Pod],
    now: Timestamp,
    listed: &BTreeMap<String, usize>,
) -> Option<BTreeMap<String, Quantity>> {
    let namespace = quota.metadata.namespace.as_deref().unwrap_or("");
    let spec = quota.spec.clone().unwrap_or_default();
    let in_scope: Vec<&Pod> = namespace_pods
        .iter()
        .copied()
        .filter(|p| pod_counts(p, now) && pod_in_scope(p, &spec))
        .collect();
    let mut used = BTreeMap::new();
    for resource in spec.hard.iter().flatten().map(|(k, _)| k) {
        let Some(tracked) = classify(resource) else {
            // Any other kind's objects (custom resources), counted by listing them.
            if let Some(count) = listed.get(resource) {
                used.insert(resource.clone(), Quantity::from_count(*count as i64));
            }
            continue;
        };
        let amount = match &tracked {
            Tracked::Pods | Tracked::Requests(_) | Tracked::Limits(_) => {
                pod_usage(&tracked, &in_scope)
            }
            Tracked::Objects(kind) => {
                Quantity::from_count(count_of(informers, *kind, namespace)? as i64)
            }
            Tracked::LoadBalancers | Tracked::NodePorts => {
                let services = in_namespace::<Service>(informers, namespace)?;
                let count: usize = services
                    .iter()
                    .filter_map(|s| s.spec.as_ref())
                    .map(|s| match (&tracked, s.type_.as_deref()) {
                        (Tracked::LoadBalancers, Some("LoadBalancer")) => 1,
                        (Tracked::NodePorts, Some("NodePort" | "LoadBalancer")) => s
                            .ports
                            .iter()
                            .flatten()
                            .filter(|p| p.node_port.is_some())
                            .count(),
                        _ => 0,
                    })
                    .sum();
                Quantity::from_count(count as i64)
            }
            Tracked::ClaimedStorage(class) => {
                in_namespace::<PersistentVolumeClaim>(informers, namespace)?
                    .iter()
                    .filter(|c| class.as_deref().is_none_or(|k| claim_class(c) == k))
                    .fold(Quantity::ZERO, |sum, c| sum + claim_request(c))
            }
            Tracked::ClassClaims(class) => Quantity::from_count(
                in_namespace::<PersistentVolumeClaim>(informers, namespace)?
                    .iter()
                    .filter(|c| claim_class(c) == class)
                    .count() as i64,
            ),
        };
        used.insert(resource.clone(), amount);
    }
    Some(used)
}

/// `count/<plural>.<group>` of kinds without a cache here (custom resources, and built-in
/// kinds the evaluators do not name): the objects in `namespace`, counted by listing their
/// metadata through discovery (upstream counts any such resource with its generic
/// evaluator). A kind the server does not serve is left out, so its quota shows no usage.
async fn count_by_listing(
    client: &kube::Client,
    quota: &ResourceQuota,
    namespace: &str,
) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for resource in quota
        .spec
        .iter()
        .flat_map(|s| s.hard.iter().flatten())
        .map(|(k, _)| k)
        .filter(|k| classify(k).is_none())
    {
        let Some((plural, group)) = resource
            .strip_prefix("count/")
            .map(|r| r.split_once('.').unwrap_or((r, "")))
        else {
            continue;
        };
        let Ok(discovered) = kube::discovery::group(client, group).await else {
            continue;
        };
        let Some((api_resource, _)) = discovered
            .recommended_resources()
            .into_iter()
            .find(|(r, _)| r.plural == plural)
        else {
            continue;
        };
        let api: Api<kube::api::DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &api_resource);
        match api.list_metadata(&Default::default()).await {
            Ok(list) => {
                counts.insert(resource.clone(), list.items.len());
            }
            Err(err) => tracing::info!(%resource, %err, "counting for a quota failed"),
        }
    }
    counts
}

/// Canonical wire form of a quantity map (`1000m` → `1`); unparsable values as given.
fn canonical(values: &BTreeMap<String, WireQuantity>) -> BTreeMap<String, String> {
    values
        .iter()
        .map(|(k, v)| {
            let text = Quantity::parse(&v.0).map_or_else(|_| v.0.clone(), |q| q.to_string());
            (k.clone(), text)
        })
        .collect()
}

/// Recounts the quota `key` and writes its status when it changed. A lower count waits for
/// its confirmation, and a deleting pod's grace period ending lowers usage: both bring the
/// key back after their time, which no event announces.
async fn sync_key(context: &Context, key: String) -> Result<Requeue, kube::Error> {
    let (namespace, name) = pods::split_key(&key);
    let decreases_key = (namespace.to_string(), name.to_string());
    let Some(quota) = context.quotas.get(namespace, name) else {
        context
            .decreases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&decreases_key);
        return Ok(Requeue::No);
    };
    let hard_resources: Vec<&String> = quota
        .spec
        .iter()
        .flat_map(|s| s.hard.iter().flatten())
        .map(|(k, _)| k)
        .collect();
    // Start (and wake on) the caches the quota names.
    let kinds: BTreeSet<Kind> = hard_resources
        .iter()
        .filter_map(|r| classify(r).as_ref().and_then(kind_needed))
        .collect();
    for kind in &kinds {
        watch_kind(context, *kind);
    }
    for kind in &kinds {
        if !kind_ready(&context.informers, *kind).await {
            return Ok(Requeue::After(CACHE_FILL_WAIT));
        }
    }
    let now = Timestamp::now();
    let namespace_pods = context.pods_by_namespace.get(namespace);
    let namespace_pods: Vec<&Pod> = namespace_pods.iter().map(|p| &**p).collect();
    let listed = count_by_listing(&context.client, &quota, namespace).await;
    let mut requeue = if hard_resources.iter().any(|r| classify(r).is_none()) {
        Requeue::After(LISTED_RECOUNT)
    } else {
        Requeue::No
    };
    if let Some(end) = next_grace_end(&namespace_pods, now) {
        requeue = earliest(requeue, end);
    }
    let Some(used) = usage(&context.informers, &quota, &namespace_pods, now, &listed) else {
        return Ok(Requeue::After(CACHE_FILL_WAIT));
    };
    let hard = canonical(
        &quota
            .spec
            .as_ref()
            .and_then(|s| s.hard.clone())
            .unwrap_or_default(),
    );
    let used: BTreeMap<String, String> =
        used.into_iter().map(|(k, q)| (k, q.to_string())).collect();
    let status = quota.status.as_ref();
    let current_hard = canonical(&status.and_then(|s| s.hard.clone()).unwrap_or_default());
    let current_used = canonical(&status.and_then(|s| s.used.clone()).unwrap_or_default());
    if status.is_some() && current_hard == hard && current_used == used {
        context
            .decreases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&decreases_key);
        return Ok(requeue);
    }
    if current_hard == hard
        && !confirmed(
            &mut context.decreases.lock().unwrap_or_else(|p| p.into_inner()),
            decreases_key,
            &used,
            &current_used,
        )
    {
        return Ok(earliest(requeue, DECREASE_CONFIRMATION));
    }
    // A merge patch: resources no longer in spec.hard are removed with nulls.
    let with_removals = |next: &BTreeMap<String, String>, current: &BTreeMap<String, String>| {
        let mut map = serde_json::Map::new();
        for key in current.keys().filter(|k| !next.contains_key(*k)) {
            map.insert(key.clone(), serde_json::Value::Null);
        }
        for (key, value) in next {
            map.insert(key.clone(), json!(value));
        }
        serde_json::Value::Object(map)
    };
    // Against the resourceVersion counted from: a create charged since then fails the
    // write, and the retry counts again.
    let patch = json!({
        "metadata": {"resourceVersion": quota.metadata.resource_version},
        "status": {
            "hard": with_removals(&hard, &current_hard),
            "used": with_removals(&used, &current_used),
        },
    });
    let api: Api<ResourceQuota> = Api::namespaced(context.client.clone(), namespace);
    api.patch_status(name, &pods::manager(MANAGER), &Patch::Merge(&patch))
        .await?;
    Ok(requeue)
}

/// The sooner of `requeue` and `after`.
fn earliest(requeue: Requeue, after: Duration) -> Requeue {
    match requeue {
        Requeue::After(at) if at <= after => requeue,
        _ => Requeue::After(after),
    }
}

/// How long until the first deleting pod still counted stops counting (its grace period
/// ends), just after.
fn next_grace_end(namespace_pods: &[&Pod], now: Timestamp) -> Option<Duration> {
    namespace_pods
        .iter()
        .filter(|p| pod_counts(p, now))
        .filter_map(|p| {
            let at = p.metadata.deletion_timestamp.as_ref()?;
            let grace = p.metadata.deletion_grace_period_seconds?;
            at.0.checked_add(SignedDuration::from_secs(grace)).ok()
        })
        .min()
        .map(|end| {
            Duration::try_from(now.duration_until(end)).unwrap_or_default() + Duration::from_secs(1)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn only_pod_changes_that_may_change_usage_queue_the_quotas() {
        let running = pod(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
            "status": {"phase": "Running"},
        }));
        assert!(pod_usage_changed(None, Some(&running)));
        assert!(pod_usage_changed(Some(&running), None));
        let mut ready = running.clone();
        ready.metadata.labels = Some(BTreeMap::from([("a".into(), "b".into())]));
        assert!(!pod_usage_changed(Some(&running), Some(&ready)));
        let mut done = running.clone();
        done.status = Some(serde_json::from_value(json!({"phase": "Succeeded"})).expect("status"));
        assert!(pod_usage_changed(Some(&running), Some(&done)));
        let mut resized = running.clone();
        resized.spec = Some(
            serde_json::from_value(
                json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]}),
            )
            .expect("spec"),
        );
        assert!(pod_usage_changed(Some(&running), Some(&resized)));
    }

    #[test]
    fn a_deleting_pod_brings_the_quota_back_when_its_grace_period_ends() {
        let now = Timestamp::from_second(1_700_000_000).expect("time");
        let deleting = pod(json!({
            "metadata": {"name": "p", "namespace": "ns",
                "deletionTimestamp": "2023-11-14T22:13:10Z", "deletionGracePeriodSeconds": 30},
        }));
        // 2023-11-14T22:13:20Z is `now`: 20 s of the grace period are left.
        assert_eq!(
            next_grace_end(&[&deleting], now),
            Some(Duration::from_secs(21))
        );
        let running = pod(json!({"metadata": {"name": "q", "namespace": "ns"}}));
        assert_eq!(next_grace_end(&[&running], now), None);
        assert_eq!(
            earliest(
                Requeue::After(Duration::from_secs(10)),
                Duration::from_secs(1)
            ),
            Requeue::After(Duration::from_secs(1))
        );
        assert_eq!(
            earliest(Requeue::No, Duration::from_secs(5)),
            Requeue::After(Duration::from_secs(5))
        );
    }
}
