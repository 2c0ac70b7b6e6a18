//! The EBS volume controllers of one cluster, as pure API clients: upstream's
//! external-provisioner ([`provisioner`]: PVs for claims of `ebs.csi.aws.com` classes, and
//! their reclaim), the KCM attach-detach controller and external-attacher in one
//! ([`attacher`]: a VolumeAttachment per volume in use on a node, AttachVolume/DetachVolume
//! behind it) and external-resizer ([`resizer`]: ModifyVolume when a bound claim grows). The
//! pure decisions live in [`params`]; this file holds the shared caches, the level-triggered
//! loop with per-object back-off, and events.
//!
//! Our PV binder does not set `volume.kubernetes.io/storage-provisioner` on claims (upstream's
//! PV controller does), so the provisioner decides by the claim's StorageClass `provisioner`.

pub mod attacher;
pub mod params;
pub mod provisioner;
pub mod resizer;

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use kube::api::{Api, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::Notify;

use crate::config::CloudSettings;
use crate::provider::Volumes;

/// Pause after a change before a pass, so a burst of watch events makes one pass.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// external-provisioner's and external-attacher's default retry back-off bounds.
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// Attaching/detaching/provisioning in progress: look again soon, without back-off.
pub(crate) const IN_PROGRESS: Duration = Duration::from_secs(1);
/// The component name in events (as external-provisioner's `<driver>_<host>`, without the host).
const COMPONENT: &str = "ebs.csi.aws.com";

/// Exponential per-object back-off (workqueue's ItemExponentialFailureRateLimiter).
#[derive(Default)]
pub(crate) struct Backoff {
    entries: Mutex<HashMap<String, (Instant, Duration)>>,
}

impl Backoff {
    /// Whether `key` may be tried now.
    pub(crate) fn ready(&self, key: &str) -> bool {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(key)
            .is_none_or(|(next, _)| Instant::now() >= *next)
    }

    /// `key` failed: wait twice as long as last time before the next try.
    pub(crate) fn failed(&self, key: &str) -> Duration {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let delay = entries
            .get(key)
            .map_or(BACKOFF_FIRST, |(_, d)| (*d * 2).min(BACKOFF_MAX));
        entries.insert(key.to_string(), (Instant::now() + delay, delay));
        delay
    }

    /// `key` is waiting on the cloud: try again in [`IN_PROGRESS`], keeping its back-off.
    pub(crate) fn later(&self, key: &str) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let delay = entries.get(key).map_or(BACKOFF_FIRST, |(_, d)| *d);
        entries.insert(key.to_string(), (Instant::now() + IN_PROGRESS, delay));
    }

    /// `key` succeeded: its back-off starts over.
    pub(crate) fn succeeded(&self, key: &str) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }
}

/// What every volume controller shares: the client, the cloud, the caches, the back-off.
pub(crate) struct Context {
    pub(crate) client: kube::Client,
    pub(crate) cloud: Arc<dyn Volumes>,
    pub(crate) settings: Arc<CloudSettings>,
    pub(crate) claims: Store<PersistentVolumeClaim>,
    pub(crate) volumes: Store<PersistentVolume>,
    pub(crate) classes: Store<StorageClass>,
    pub(crate) pods: Store<Pod>,
    pub(crate) nodes: Store<Node>,
    pub(crate) attachments: Store<VolumeAttachment>,
    pub(crate) backoff: Backoff,
    /// Devices chosen for attachments not yet reported attached (the attacher's device
    /// allocator: two volumes attaching to one instance must not get the same name).
    pub(crate) devices: Mutex<HashMap<String, (String, String)>>,
}

impl Context {
    pub(crate) fn class(&self, name: &str) -> Option<Arc<StorageClass>> {
        self.classes.get(&reflector::ObjectRef::new(name))
    }
    pub(crate) fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(&reflector::ObjectRef::new(name))
    }
    pub(crate) fn volume(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        self.volumes.get(&reflector::ObjectRef::new(name))
    }
}

fn watch<K>(client: &kube::Client, notify: Arc<Notify>) -> (Store<K>, BoxFuture<'static, ()>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let (store, writer) = reflector::store();
    let api: Api<K> = Api::all(client.clone());
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .for_each(move |_| {
            notify.notify_one();
            futures::future::ready(())
        })
        .boxed();
    (store, stream)
}

/// Runs the provisioner, attacher and resizer until the task is dropped.
pub async fn run(client: kube::Client, cloud: Arc<dyn Volumes>, settings: Arc<CloudSettings>) {
    let notify = Arc::new(Notify::new());
    let (claims, claims_watch) = watch(&client, notify.clone());
    let (volumes, volumes_watch) = watch(&client, notify.clone());
    let (classes, classes_watch) = watch(&client, notify.clone());
    let (pods, pods_watch) = watch(&client, notify.clone());
    let (nodes, nodes_watch) = watch(&client, notify.clone());
    let (attachments, attachments_watch) = watch(&client, notify.clone());
    let context = Arc::new(Context {
        client,
        cloud,
        settings,
        claims,
        volumes,
        classes,
        pods,
        nodes,
        attachments,
        backoff: Backoff::default(),
        devices: Mutex::new(HashMap::new()),
    });
    let watches = futures::future::join_all([
        claims_watch,
        volumes_watch,
        classes_watch,
        pods_watch,
        nodes_watch,
        attachments_watch,
    ]);
    let passes = async move {
        let ready = futures::future::join_all([
            context.claims.wait_until_ready().boxed(),
            context.volumes.wait_until_ready().boxed(),
            context.classes.wait_until_ready().boxed(),
            context.pods.wait_until_ready().boxed(),
            context.nodes.wait_until_ready().boxed(),
            context.attachments.wait_until_ready().boxed(),
        ]);
        if ready.await.iter().any(Result::is_err) {
            return;
        }
        loop {
            sync_all(&context).await;
            // A short tick while the back-off holds work (attach in progress, retries), else
            // wait for a change only: an idle cluster's volume loop never wakes on a timer.
            if context.backoff.is_empty() {
                notify.notified().await;
            } else {
                let _ = tokio::time::timeout(IN_PROGRESS, notify.notified()).await;
            }
            tokio::time::sleep(DEBOUNCE).await;
        }
    };
    futures::future::join(watches, passes).await;
}

impl Backoff {
    fn is_empty(&self) -> bool {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }
}

async fn sync_all(context: &Arc<Context>) {
    provisioner::sync(context).await;
    attacher::sync(context).await;
    resizer::sync(context).await;
}

pub(crate) use crate::node::api_error;

/// Whether a kube error is the API's 404 / 409.
pub(crate) fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == code)
}

/// A core/v1 Event about `object`, as the sidecars' client-go recorders write them
/// (`kubectl describe` shows it); a failure to record is logged, never fails the pass.
pub(crate) async fn event<K>(
    client: &kube::Client,
    object: &K,
    type_: &str,
    reason: &str,
    message: &str,
) where
    K: Resource<DynamicType = ()>,
{
    let namespace = object.namespace().unwrap_or_else(|| "default".into());
    let name = object.name_any();
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let event = serde_json::from_value(json!({
        "metadata": {"generateName": format!("{name}.")},
        "involvedObject": {
            "apiVersion": K::api_version(&()), "kind": K::kind(&()),
            "namespace": object.namespace(), "name": name,
            "uid": object.meta().uid, "resourceVersion": object.meta().resource_version,
        },
        "reason": reason,
        "message": message,
        "type": type_,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }));
    let Ok(event) = event else { return };
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(client.clone(), &namespace);
    if let Err(err) = events.create(&PostParams::default(), &event).await {
        tracing::debug!(object = %name, %err, "recording an event failed");
    }
}
