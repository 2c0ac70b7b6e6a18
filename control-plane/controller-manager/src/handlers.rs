//! The watch handlers most controllers register (upstream's `enqueueController` and
//! `addPod`/`updatePod`/`deletePod` shapes): a primary object's change queues its own key, an
//! owned object's change queues its controller's key, lowering the controller's expectations
//! when the owned object is a pod it created or deleted.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use serde::de::DeserializeOwned;

use crate::expectations::Expectations;
use crate::informers::Informer;
use crate::pods;
use crate::workqueue::WorkQueue;

/// Queues the `namespace/name` of every object of `informer` that changes.
pub fn queue_each<K>(informer: &Informer<K>, queue: &Arc<WorkQueue<String>>)
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Send + Sync + 'static,
{
    let queue = queue.clone();
    informer.on_change(move |change| {
        for object in change.objects() {
            queue.add(pods::key(object.meta()));
        }
    });
}

/// Queues the key of the `kind` controller of every object of `informer` that changes (both
/// controllers when its controller changed).
pub fn queue_controller<K>(
    informer: &Informer<K>,
    queue: &Arc<WorkQueue<String>>,
    kind: &'static str,
) where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Send + Sync + 'static,
{
    let queue = queue.clone();
    informer.on_change(move |change| {
        for key in pods::controller_keys(change, kind) {
            queue.add(key);
        }
    });
}

/// [`queue_controller`] for pods, lowering the controller's `expectations` as its creates
/// and deletes show up first.
pub fn queue_pod_controller(
    pods: &Informer<Pod>,
    queue: &Arc<WorkQueue<String>>,
    kind: &'static str,
    expectations: &Arc<Expectations>,
) {
    let (queue, expectations) = (queue.clone(), expectations.clone());
    pods.on_change(move |change| {
        expectations.observe_owned(change, kind);
        for key in pods::controller_keys(change, kind) {
            queue.add(key);
        }
    });
}
