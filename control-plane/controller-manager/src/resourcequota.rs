//! The resource quota controller (upstream `pkg/controller/resourcequota` with the core
//! evaluators): `status.hard` mirrors `spec.hard`, `status.used` counts what the namespace
//! holds of each hard resource — objects (`pods`, `services`, `count/<resource>.<group>`, …),
//! the requests and limits of its non-terminal pods (`requests.cpu`, `limits.memory`, bare
//! `cpu` / `memory`), claimed storage — with the Terminating / NotTerminating / BestEffort /
//! NotBestEffort scopes and the PriorityClass scope selector (the evaluators are
//! `flotilla_api_machinery::quota`, shared with admission). Caches of the counted kinds
//! start only when some quota names them, so an idle cluster pays for none. Admission-time
//! enforcement is not here (that is the API server's).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, Pod, ReplicationController, ResourceQuota, Secret, Service,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as WireQuantity;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::watch;

use flotilla_api_machinery::quantity::Quantity;
use flotilla_api_machinery::quota::{
    Kind, Tracked, claim_class, claim_request, classify, pod_counts, pod_in_scope, pod_usage,
};

use crate::informers::{Informer, Informers, RELAXED_PASS_INTERVAL, Triggers};
use crate::pods;

/// How often every quota is recounted without a change seen (upstream resyncs every 5
/// minutes and recounts on events; the counts here come from caches, so this is cheap).
const RESYNC: Duration = Duration::from_secs(10);
const MANAGER: &str = "resourcequota-controller";

/// The objects of `K` in `namespace`, from its (lazily started) cache; `None` until it has
/// filled.
fn in_namespace<K>(informers: &Informers, namespace: &str) -> Option<Vec<Arc<K>>>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let informer: Informer<K> = informers.get::<K>();
    informer.is_ready().then(|| {
        informer
            .list()
            .into_iter()
            .filter(|o| o.meta().namespace.as_deref() == Some(namespace))
            .collect()
    })
}

fn signal_of(informers: &Informers, kind: Kind) -> watch::Receiver<u64> {
    match kind {
        Kind::Service => informers.get::<Service>().signal(),
        Kind::ConfigMap => informers.get::<ConfigMap>().signal(),
        Kind::Secret => informers.get::<Secret>().signal(),
        Kind::PersistentVolumeClaim => informers.get::<PersistentVolumeClaim>().signal(),
        Kind::ReplicationController => informers.get::<ReplicationController>().signal(),
        Kind::ResourceQuota => informers.get::<ResourceQuota>().signal(),
        Kind::Deployment => informers.get::<Deployment>().signal(),
        Kind::ReplicaSet => informers.get::<ReplicaSet>().signal(),
        Kind::StatefulSet => informers.get::<StatefulSet>().signal(),
        Kind::DaemonSet => informers.get::<DaemonSet>().signal(),
        Kind::Job => informers.get::<Job>().signal(),
        Kind::CronJob => informers.get::<CronJob>().signal(),
    }
}

fn count_of(informers: &Informers, kind: Kind, namespace: &str) -> Option<usize> {
    fn n<K>(informers: &Informers, namespace: &str) -> Option<usize>
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        in_namespace::<K>(informers, namespace).map(|v| v.len())
    }
    match kind {
        Kind::Service => n::<Service>(informers, namespace),
        Kind::ConfigMap => n::<ConfigMap>(informers, namespace),
        Kind::Secret => n::<Secret>(informers, namespace),
        Kind::PersistentVolumeClaim => n::<PersistentVolumeClaim>(informers, namespace),
        Kind::ReplicationController => n::<ReplicationController>(informers, namespace),
        Kind::ResourceQuota => n::<ResourceQuota>(informers, namespace),
        Kind::Deployment => n::<Deployment>(informers, namespace),
        Kind::ReplicaSet => n::<ReplicaSet>(informers, namespace),
        Kind::StatefulSet => n::<StatefulSet>(informers, namespace),
        Kind::DaemonSet => n::<DaemonSet>(informers, namespace),
        Kind::Job => n::<Job>(informers, namespace),
        Kind::CronJob => n::<CronJob>(informers, namespace),
    }
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

/// Runs the controller until the task is aborted.
pub async fn run(informers: Arc<Informers>) {
    let quotas = informers.get::<ResourceQuota>();
    let pods = informers.get::<Pod>();
    let client = informers.client().clone();
    let mut triggers = Some(
        Triggers::new(RESYNC)
            .at_most_every(RELAXED_PASS_INTERVAL)
            .on(&quotas)
            .on(&pods),
    );
    let mut watched: BTreeSet<Kind> = BTreeSet::new();
    let mut decreases = Decreases::default();
    loop {
        if let Some(t) = triggers.as_mut() {
            let wake = (!decreases.is_empty()).then_some(DECREASE_CONFIRMATION);
            t.next_within(wake).await;
        }
        if !(quotas.is_ready() && pods.is_ready()) {
            continue;
        }
        // Start (and wake on) the caches the quotas now name.
        for quota in quotas.list() {
            for resource in quota
                .spec
                .iter()
                .flat_map(|s| s.hard.iter().flatten())
                .map(|(k, _)| k)
            {
                if let Some(kind) = classify(resource).as_ref().and_then(kind_needed)
                    && watched.insert(kind)
                {
                    triggers = triggers.map(|t| t.on_signal(signal_of(&informers, kind)));
                }
            }
        }
        sync_all(&client, &informers, &quotas, &pods, &mut decreases).await;
    }
}

/// How long a lower count must hold before it replaces `status.used`. Admission charges a
/// create to the quota just before the object is stored, so for a moment the caches here
/// lack an object the quota already counts; writing that lower count would hand its unit
/// to a second create. An object stored is in the caches well within this time.
const DECREASE_CONFIRMATION: Duration = Duration::from_secs(1);

/// Lower counts seen once, by quota (namespace, name): the count and when it was first seen.
type Decreases =
    std::collections::HashMap<(String, String), (BTreeMap<String, String>, std::time::Instant)>;

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
            decreases.insert(key, (used.clone(), std::time::Instant::now()));
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

async fn sync_all(
    client: &kube::Client,
    informers: &Informers,
    quotas: &Informer<ResourceQuota>,
    pods: &Informer<Pod>,
    decreases: &mut Decreases,
) {
    let now = Timestamp::now();
    let all_pods = pods.list();
    for quota in quotas.list() {
        let (Some(name), Some(namespace)) = (&quota.metadata.name, &quota.metadata.namespace)
        else {
            continue;
        };
        let namespace_pods: Vec<&Pod> = all_pods
            .iter()
            .map(|p| &**p)
            .filter(|p| p.metadata.namespace.as_deref() == Some(namespace.as_str()))
            .collect();
        let listed = count_by_listing(client, &quota, namespace).await;
        let Some(used) = usage(informers, &quota, &namespace_pods, now, &listed) else {
            continue;
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
            decreases.remove(&(namespace.clone(), name.clone()));
            continue;
        }
        if current_hard == hard
            && !confirmed(
                decreases,
                (namespace.clone(), name.clone()),
                &used,
                &current_used,
            )
        {
            continue;
        }
        // A merge patch: resources no longer in spec.hard are removed with nulls.
        let with_removals = |next: &BTreeMap<String, String>,
                             current: &BTreeMap<String, String>| {
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
        // write, and the next pass counts again.
        let patch = json!({
            "metadata": {"resourceVersion": quota.metadata.resource_version},
            "status": {
                "hard": with_removals(&hard, &current_hard),
                "used": with_removals(&used, &current_used),
            },
        });
        let api: Api<ResourceQuota> = Api::namespaced(client.clone(), namespace);
        let outcome = api
            .patch_status(name, &pods::manager(MANAGER), &Patch::Merge(&patch))
            .await;
        if let Err(err) = outcome {
            tracing::info!(quota = %name, %err, "quota status update failed; retrying");
        }
    }
}
