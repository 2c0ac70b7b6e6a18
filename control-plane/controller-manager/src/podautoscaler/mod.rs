//! The horizontal pod autoscaler controller (upstream `pkg/controller/podautoscaler`,
//! autoscaling/v2): every HPA is reconciled 15 s after its last reconcile (and at once when it
//! is created or its spec changes), reading its target's `scale` subresource, the pods the
//! scale selects and their usage from metrics.k8s.io, and writing the target's scale, the
//! HPA's status and events. The decision itself is pure ([`horizontal`]); this module does
//! the reads and writes around it and keeps each HPA's history in memory.

pub mod behavior;
pub mod horizontal;
pub mod metrics;
pub mod replica_calculator;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_api_machinery::selector::LabelSelector;
use k8s_openapi::api::autoscaling::v1::Scale;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use tracing::Instrument;

use crate::events::{EventRef, Recorder};
use crate::informers::{Index, Informer, Informers};
use crate::pods;
use crate::workqueue::{Requeue, WorkQueue, run_workers};

use behavior::History;
use horizontal::{Decision, Event, Observed, Outcome};

/// Upstream's `--horizontal-pod-autoscaler-sync-period`.
pub const SYNC_PERIOD: Duration = Duration::from_secs(15);
/// Upstream's `--concurrent-horizontal-pod-autoscaler-syncs`.
const CONCURRENT_SYNCS: usize = 5;
/// The events' source component, as upstream's recorder names it.
const COMPONENT: &str = "horizontal-pod-autoscaler";

/// Runs the controller until the task is aborted. Only the HPA cache is watched up front: the
/// pods' cache is asked for at the first reconcile, so a cluster without HPAs pays for
/// nothing more.
pub async fn run(informers: Arc<Informers>) {
    let hpas = informers.get::<HorizontalPodAutoscaler>();
    let queue = Arc::new(WorkQueue::new("horizontalpodautoscaler"));
    let on_hpa = queue.clone();
    let recorder = Arc::new(Recorder::new(informers.client().clone(), COMPONENT));
    let forgets = recorder.clone();
    hpas.on_change(move |change| {
        if let (Some(gone), None) = (change.old, change.new) {
            forgets.forget(gone.metadata.uid.as_deref().unwrap_or(""));
        }
        // A status write changes nothing the next periodic reconcile would not see: only a
        // new HPA, a spec change or a deletion is worth an early look.
        let early = match (change.old, change.new) {
            (Some(old), Some(new)) => old.metadata.generation != new.metadata.generation,
            _ => true,
        };
        if early && let Some(object) = change.new.or(change.old) {
            on_hpa.add(pods::key(&object.metadata));
        }
    });
    hpas.ready().await;
    let controller = Controller {
        client: informers.client().clone(),
        informers: informers.clone(),
        hpas,
        hpas_by_namespace: Mutex::new(None),
        pods_by_namespace: Mutex::new(None),
        config: replica_calculator::Config::default(),
        state: Mutex::default(),
        recorder,
    };
    let controller = &controller;
    run_workers(&queue, CONCURRENT_SYNCS, |key: String| controller.sync(key)).await;
}

/// What the controller keeps between reconciles.
#[derive(Default)]
struct State {
    /// Each HPA's recommendations and scale events.
    histories: HashMap<String, History>,
    /// Each HPA's selector as its last reconcile found it (upstream's `hpaSelectors`).
    selectors: HashMap<String, LabelSelector>,
    /// Scale targets' resources by (apiVersion, kind), found through discovery.
    resources: HashMap<(String, String), ApiResource>,
}

struct Controller {
    client: kube::Client,
    informers: Arc<Informers>,
    hpas: Informer<HorizontalPodAutoscaler>,
    hpas_by_namespace: Mutex<Option<Index<HorizontalPodAutoscaler>>>,
    pods_by_namespace: Mutex<Option<(Informer<Pod>, Index<Pod>)>>,
    config: replica_calculator::Config,
    state: Mutex<State>,
    recorder: Arc<Recorder>,
}

/// Why a scale target could not be read or written.
#[derive(Debug, thiserror::Error)]
enum ScaleError {
    #[error("{0}")]
    Api(#[from] kube::Error),
    #[error("the server could not find the requested resource")]
    NoScaleSubresource,
}

impl Controller {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pods' cache and its namespace index, made on first use.
    async fn pods(&self) -> (Informer<Pod>, Index<Pod>) {
        let pods = {
            let mut slot = self
                .pods_by_namespace
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert_with(|| {
                let informer = self.informers.get::<Pod>();
                let index = informer.by_namespace();
                (informer, index)
            })
            .clone()
        };
        pods.0.ready().await;
        pods
    }

    fn hpas_by_namespace(&self) -> Index<HorizontalPodAutoscaler> {
        self.hpas_by_namespace
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(|| self.hpas.by_namespace())
            .clone()
    }

    /// Upstream's `processNextWorkItem` + `reconcileKey`: a gone HPA's history is dropped;
    /// any other is looked at again after the sync period whatever the outcome (upstream's
    /// fixed-interval rate limiter: a failing HPA is retried no faster).
    async fn sync(&self, key: String) -> Result<Requeue, std::convert::Infallible> {
        let (namespace, name) = pods::split_key(&key);
        let Some(hpa) = self.hpas.get(namespace, name) else {
            let mut state = self.state();
            state.histories.remove(&key);
            state.selectors.remove(&key);
            return Ok(Requeue::No);
        };
        let span = tracing::info_span!("hpa", hpa = %key);
        if let Err(err) = self.reconcile(&hpa, &key).instrument(span).await {
            tracing::info!(hpa = %key, %err, "reconciling the horizontal pod autoscaler failed");
        }
        Ok(Requeue::After(SYNC_PERIOD))
    }

    /// Upstream's `reconcileAutoscaler`.
    async fn reconcile(&self, hpa: &HorizontalPodAutoscaler, key: &str) -> Result<(), String> {
        let namespace = hpa.metadata.namespace.as_deref().unwrap_or("");
        let Some(target) = hpa.spec.as_ref().map(|s| s.scale_target_ref.clone()) else {
            return Ok(());
        };
        let api_version = target.api_version.clone().unwrap_or_default();
        let scale_api = match self.scale_api(namespace, &api_version, &target.kind).await {
            Ok(api) => api,
            Err(err) => {
                return self
                    .conclude(
                        hpa,
                        horizontal::failed_get_scale(hpa, &err.to_string(), Timestamp::now()),
                    )
                    .await;
            }
        };
        let scale = match scale_api.get_scale(&target.name).await {
            Ok(scale) => scale,
            Err(err) => {
                if let kube::Error::Api(status) = &err
                    && status.code == 404
                {
                    // A deleted CRD leaves a stale mapping behind: look it up again next time.
                    self.state()
                        .resources
                        .remove(&(api_version.clone(), target.kind.clone()));
                }
                return self
                    .conclude(
                        hpa,
                        horizontal::failed_get_scale(hpa, &err.to_string(), Timestamp::now()),
                    )
                    .await;
            }
        };

        let (_, pods_index) = self.pods().await;
        let namespace_pods = pods_index.get(namespace);
        let pod_refs: Vec<&Pod> = namespace_pods.iter().map(|p| &**p).collect();
        let selector = horizontal::parse_selector(&scale).ok();
        let other_selectors = self.record_selector(key, namespace, selector.clone());
        let pod_metrics = match (&selector, horizontal::computes_metrics(hpa, &scale)) {
            (Some(_), true) if horizontal::uses_resource_metrics(hpa) => {
                let text = scale
                    .status
                    .as_ref()
                    .and_then(|s| s.selector.clone())
                    .unwrap_or_default();
                Some(
                    metrics::list_pod_metrics(&self.client, namespace, &text)
                        .await
                        .map_err(|e| e.to_string()),
                )
            }
            _ => None,
        };

        let now = Timestamp::now();
        let observed = Observed {
            hpa,
            key,
            scale: &scale,
            pods: &pod_refs,
            other_selectors: &other_selectors,
            pod_metrics,
            now,
        };
        let mut history = self.state().histories.remove(key).unwrap_or_default();
        let planned = horizontal::plan(&observed, &mut history, &self.config);
        let outcome = match planned {
            Decision::Stop(outcome) => outcome,
            Decision::Proceed(plan) => {
                let write = if plan.rescale {
                    let mut next: Scale = scale.clone();
                    next.spec.get_or_insert_with(Default::default).replicas =
                        Some(plan.desired_replicas);
                    Some(
                        scale_api
                            .replace_scale(&target.name, &PostParams::default(), &next)
                            .await
                            .map(|_| ())
                            .map_err(|e| e.to_string()),
                    )
                } else {
                    None
                };
                horizontal::finish(hpa, plan, write, &mut history, Timestamp::now())
            }
        };
        self.state().histories.insert(key.to_string(), history);
        self.conclude(hpa, outcome).await
    }

    /// Remembers `hpa`'s selector and returns the other HPAs' of its namespace.
    fn record_selector(
        &self,
        key: &str,
        namespace: &str,
        selector: Option<LabelSelector>,
    ) -> Vec<(String, LabelSelector)> {
        let others: Vec<String> = self
            .hpas_by_namespace()
            .get(namespace)
            .iter()
            .map(|h| pods::key(&h.metadata))
            .filter(|k| k != key)
            .collect();
        let mut state = self.state();
        match selector {
            Some(selector) => state.selectors.insert(key.to_string(), selector),
            None => state.selectors.remove(key),
        };
        others
            .into_iter()
            .filter_map(|k| state.selectors.get(&k).cloned().map(|s| (k, s)))
            .collect()
    }

    /// The API of the target kind's objects, for its scale subresource: the resource found
    /// through discovery (cached), which must have one.
    async fn scale_api(
        &self,
        namespace: &str,
        api_version: &str,
        kind: &str,
    ) -> Result<Api<DynamicObject>, ScaleError> {
        let cache_key = (api_version.to_string(), kind.to_string());
        let cached = self.state().resources.get(&cache_key).cloned();
        let resource = match cached {
            Some(resource) => resource,
            None => {
                let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
                let gvk = GroupVersionKind::gvk(group, version, kind);
                let (resource, capabilities) =
                    kube::discovery::pinned_kind(&self.client, &gvk).await?;
                if !capabilities
                    .subresources
                    .iter()
                    .any(|(sub, _)| sub.plural == "scale")
                {
                    return Err(ScaleError::NoScaleSubresource);
                }
                self.state().resources.insert(cache_key, resource.clone());
                resource
            }
        };
        Ok(Api::namespaced_with(
            self.client.clone(),
            namespace,
            &resource,
        ))
    }

    /// Records the outcome's events and writes its status when it changed.
    async fn conclude(
        &self,
        hpa: &HorizontalPodAutoscaler,
        outcome: Outcome,
    ) -> Result<(), String> {
        for event in &outcome.events {
            self.record_event(hpa, event).await;
        }
        if hpa.status.as_ref() != Some(&outcome.status) {
            let mut next = hpa.clone();
            next.status = Some(outcome.status);
            let namespace = hpa.metadata.namespace.as_deref().unwrap_or("");
            let name = hpa.metadata.name.as_deref().unwrap_or("");
            let api: Api<HorizontalPodAutoscaler> = Api::namespaced(self.client.clone(), namespace);
            let params = PostParams {
                field_manager: Some(COMPONENT.into()),
                ..Default::default()
            };
            if let Err(err) = api.replace_status(name, &params, &next).await {
                let event = Event {
                    type_: "Warning",
                    reason: "FailedUpdateStatus",
                    message: err.to_string(),
                };
                self.record_event(hpa, &event).await;
                return Err(format!("failed to update status for {name}: {err}"));
            }
        }
        outcome.error.map_or(Ok(()), Err)
    }

    /// A core/v1 Event about `hpa`; the same one again counts up the Event recorded before.
    async fn record_event(&self, hpa: &HorizontalPodAutoscaler, event: &Event) {
        let object = EventRef {
            api_version: "autoscaling/v2",
            kind: "HorizontalPodAutoscaler",
            metadata: &hpa.metadata,
        };
        self.recorder
            .record(object, event.type_, event.reason, &event.message)
            .await;
    }
}
