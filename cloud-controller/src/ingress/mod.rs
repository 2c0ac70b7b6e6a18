//! The ingress controller (the AWS Load Balancer Controller's Ingress side, one ALB per
//! Ingress, no IngressGroups): every Ingress of class `alb` (see [`class`]) gets an
//! application load balancer built from its rules ([`model`], [`annotations`]), its DNS name
//! in `status.loadBalancer`, and the `ingress.k8s.aws/resources` finalizer so that the load
//! balancer, listeners, rules and target groups are deleted before the Ingress is. Changes of
//! the Ingress, of its backend Services and of the set of target nodes re-reconcile it (one
//! work queue entry per Ingress). Problems are events (`FailedBuildModel` before anything is
//! called, `FailedDeployModel` when the cloud fails) and back-off requeues.

pub mod annotations;
pub mod class;
pub mod model;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use crate::config::CloudSettings;
use crate::node::api_error;
use crate::provider::{AlbModel, ApplicationLoadBalancers, CloudError};
use crate::service::{backoff, node_is_eligible};

/// Upstream's finalizer of an Ingress outside any explicit group.
pub const FINALIZER: &str = "ingress.k8s.aws/resources";
/// Upstream's event reporter.
const REPORTER: &str = "ingress";
const MANAGER: &str = "ingress-controller";
/// How often an unchanged Ingress is deployed again, repairing drift in the cloud.
const RESYNC: Duration = Duration::from_secs(100);
/// First retry while the caches are not listed yet.
const NOT_READY_RETRY: Duration = Duration::from_secs(2);

fn has_finalizer(ingress: &Ingress) -> bool {
    ingress
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
}

fn key_of(ingress: &Ingress) -> String {
    format!(
        "{}/{}",
        ingress.metadata.namespace.as_deref().unwrap_or_default(),
        ingress.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The provider IDs of the Nodes that are load balancer targets (the service controller's
/// eligibility rules).
fn target_nodes(nodes: &[Arc<Node>]) -> BTreeSet<String> {
    nodes
        .iter()
        .filter(|n| node_is_eligible(n))
        .filter_map(|n| n.spec.as_ref()?.provider_id.clone())
        .filter(|id| !id.is_empty())
        .collect()
}

/// The Ingresses whose backends name `service` (same namespace).
fn ingresses_using(ingresses: &[Arc<Ingress>], service: &Service) -> Vec<ObjectRef<Ingress>> {
    let namespace = service.metadata.namespace.as_deref();
    let Some(name) = service.metadata.name.as_deref() else {
        return Vec::new();
    };
    ingresses
        .iter()
        .filter(|ing| ing.metadata.namespace.as_deref() == namespace)
        .filter(|ing| model::backend_service_names(ing).contains(name))
        .map(|ing| ObjectRef::from_obj(ing.as_ref()))
        .collect()
}

/// The hostname the Ingress's status shows.
fn status_hostname(ingress: &Ingress) -> Option<&str> {
    ingress
        .status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .hostname
        .as_deref()
}

/// What the controller last deployed for an Ingress.
struct Synced {
    model: AlbModel,
    at: Instant,
}

struct Context {
    client: kube::Client,
    cloud: Arc<dyn ApplicationLoadBalancers>,
    settings: Arc<CloudSettings>,
    nodes: Store<Node>,
    classes: Store<IngressClass>,
    recorder: Recorder,
    synced: Mutex<HashMap<String, Synced>>,
    failures: Mutex<HashMap<String, u32>>,
}

impl Context {
    async fn event(&self, ingress: &Ingress, type_: EventType, reason: &str, note: String) {
        crate::owned::publish(
            &self.recorder,
            &ingress.object_ref(&()),
            type_,
            reason,
            note,
        )
        .await;
    }

    fn api(&self, ingress: &Ingress) -> Api<Ingress> {
        Api::namespaced(
            self.client.clone(),
            ingress.metadata.namespace.as_deref().unwrap_or("default"),
        )
    }

    fn forget(&self, ingress: &Ingress) {
        if let Ok(mut synced) = self.synced.lock() {
            synced.remove(&key_of(ingress));
        }
    }
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    }
}

/// The finalizers with ours added or removed ([`crate::owned::finalizer_patch`]).
fn finalizer_patch(ingress: &Ingress, add: bool) -> serde_json::Value {
    crate::owned::finalizer_patch(&ingress.metadata, FINALIZER, add)
}

/// Runs the ingress controller until the task is dropped: makes sure the `alb` IngressClass
/// exists, then reconciles Ingresses.
pub async fn run(
    client: kube::Client,
    cloud: Arc<dyn ApplicationLoadBalancers>,
    settings: Arc<CloudSettings>,
) {
    let (nodes, node_writer) = reflector::store();
    let node_stream = reflector::reflector(
        node_writer,
        watcher(Api::<Node>::all(client.clone()), watcher::Config::default()),
    )
    .default_backoff()
    .touched_objects();
    // Only a change of the target set (not heartbeats) re-reconciles every Ingress.
    let node_trigger = {
        let nodes = nodes.clone();
        let mut last: Option<BTreeSet<String>> = None;
        node_stream.filter_map(move |event| {
            let changed = match event {
                Ok(_) => {
                    let targets = target_nodes(&nodes.state());
                    let changed = last.as_ref() != Some(&targets);
                    last = Some(targets);
                    changed
                }
                Err(err) => {
                    tracing::warn!(%err, "watching nodes failed");
                    false
                }
            };
            futures::future::ready(changed.then_some(()))
        })
    };
    let (classes, class_writer) = reflector::store();
    let class_trigger = reflector::reflector(
        class_writer,
        watcher(
            Api::<IngressClass>::all(client.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .touched_objects()
    .filter_map(|event| {
        if let Err(err) = &event {
            tracing::warn!(%err, "watching ingress classes failed");
        }
        futures::future::ready(event.ok().map(|_| ()))
    });
    let context = Arc::new(Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: REPORTER.into(),
                instance: None,
            },
        ),
        client: client.clone(),
        cloud,
        settings: settings.clone(),
        nodes,
        classes,
        synced: Mutex::new(HashMap::new()),
        failures: Mutex::new(HashMap::new()),
    });
    tracing::info!(cluster = %settings.cluster_id, "ingress controller starting");
    let controller = Controller::new(
        Api::<Ingress>::all(client.clone()),
        watcher::Config::default(),
    );
    let ingresses = controller.store();
    let controller = controller
        .watches(
            Api::<Service>::all(client.clone()),
            watcher::Config::default(),
            move |service| ingresses_using(&ingresses.state(), &service),
        )
        .reconcile_all_on(futures::stream::select(node_trigger, class_trigger))
        .run(reconcile, error_policy, context)
        .for_each(|outcome| async move {
            if let Err(err) = outcome {
                tracing::debug!(%err, "ingress reconcile failed");
            }
        });
    futures::join!(class::ensure_alb_class(client), controller);
}

/// Deletes every application load balancer and target group this controller made for the
/// cluster, whatever Ingresses exist (for a cluster being deleted: found by the cluster
/// tags alone, which NLBs of Services do not carry both of).
pub async fn release(
    cloud: &dyn ApplicationLoadBalancers,
    settings: &CloudSettings,
) -> Result<(), CloudError> {
    let tags = BTreeMap::from([
        (settings.cluster_tag_key(), "owned".to_string()),
        (model::CLUSTER_TAG.to_string(), settings.cluster_id.clone()),
    ]);
    cloud.delete_application_load_balancer(&tags).await
}

async fn reconcile(ingress: Arc<Ingress>, context: Arc<Context>) -> Result<Action, CloudError> {
    // Targets and classes come from caches: wait until each was listed once, or the first
    // pass would see no node and no class.
    if context.nodes.wait_until_ready().await.is_err()
        || context.classes.wait_until_ready().await.is_err()
    {
        return Ok(Action::requeue(NOT_READY_RETRY));
    }
    let action = sync(&ingress, &context).await?;
    if let Ok(mut failures) = context.failures.lock() {
        failures.remove(&key_of(&ingress));
    }
    Ok(action)
}

/// The Ingress's backend Services that exist, by name.
async fn backend_services(
    ingress: &Ingress,
    context: &Context,
) -> Result<BTreeMap<String, Service>, CloudError> {
    let api: Api<Service> = Api::namespaced(
        context.client.clone(),
        ingress.metadata.namespace.as_deref().unwrap_or("default"),
    );
    let mut services = BTreeMap::new();
    for name in model::backend_service_names(ingress) {
        if let Some(service) = api.get_opt(&name).await.map_err(api_error)? {
            services.insert(name, service);
        }
    }
    Ok(services)
}

async fn cleanup(ingress: &Ingress, context: &Context) -> Result<Action, CloudError> {
    let namespace = ingress.metadata.namespace.as_deref().unwrap_or("default");
    let name = ingress.metadata.name.clone().unwrap_or_default();
    let tags = model::stack_tags(&context.settings, namespace, &name);
    if let Err(err) = context.cloud.delete_application_load_balancer(&tags).await {
        context
            .event(
                ingress,
                EventType::Warning,
                "FailedDeployModel",
                format!("Failed deploy model due to {err}"),
            )
            .await;
        return Err(err);
    }
    let api = context.api(ingress);
    if ingress.metadata.deletion_timestamp.is_none() && status_hostname(ingress).is_some() {
        api.patch_status(
            &name,
            &patch_params(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": null}}})),
        )
        .await
        .map_err(api_error)?;
    }
    match api
        .patch(
            &name,
            &patch_params(),
            &Patch::Merge(finalizer_patch(ingress, false)),
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(err) => return Err(api_error(err)),
    }
    context.forget(ingress);
    tracing::info!(ingress = %key_of(ingress), "load balancer deleted, finalizer removed");
    Ok(Action::await_change())
}

async fn sync(ingress: &Ingress, context: &Context) -> Result<Action, CloudError> {
    let key = key_of(ingress);
    let ours = class::is_ours(ingress, &context.classes.state());
    let deleting = ingress.metadata.deletion_timestamp.is_some();
    if has_finalizer(ingress) && (deleting || !ours) {
        return cleanup(ingress, context).await;
    }
    if !ours || deleting {
        if !deleting && let Some(class) = class::unknown_class(ingress, &context.classes.state()) {
            context
                .event(
                    ingress,
                    EventType::Warning,
                    "UnknownIngressClass",
                    format!(
                        "IngressClass {class:?} not found: no controller serves this Ingress (the {:?} class is {})",
                        class::CLASS_NAME,
                        class::CONTROLLER
                    ),
                )
                .await;
        }
        context.forget(ingress);
        return Ok(Action::await_change());
    }

    let services = backend_services(ingress, context).await?;
    let targets = target_nodes(&context.nodes.state());
    let model = match model::build(ingress, &services, &targets, &context.settings) {
        Ok(model) => model,
        Err(err) => {
            // Bad input: nothing is called in the cloud, whatever exists stays as it was.
            // A fixed Ingress or a new Service re-reconciles at once; the resync is a backstop.
            tracing::info!(ingress = %key, %err, "ingress cannot be built");
            context
                .event(
                    ingress,
                    EventType::Warning,
                    "FailedBuildModel",
                    format!("Failed build model due to ingress: {key}: {err}"),
                )
                .await;
            context.forget(ingress);
            return Ok(Action::requeue(RESYNC));
        }
    };
    let previous = context
        .synced
        .lock()
        .ok()
        .and_then(|synced| synced.get(&key).map(|s| (s.model == model, s.at.elapsed())));
    let deployed = status_hostname(ingress).is_some() && has_finalizer(ingress);
    if let Some((true, elapsed)) = previous
        && deployed
        && elapsed < RESYNC
    {
        return Ok(Action::requeue(RESYNC - elapsed));
    }
    // A resync of an unchanged model repairs drift silently; anything else is announced.
    let announce = !matches!(previous, Some((true, _))) || !deployed;
    let api = context.api(ingress);
    let name = ingress.metadata.name.clone().unwrap_or_default();
    if !has_finalizer(ingress) {
        // Before anything exists in the cloud, so a delete can leave nothing behind.
        api.patch(
            &name,
            &patch_params(),
            &Patch::Merge(finalizer_patch(ingress, true)),
        )
        .await
        .map_err(api_error)?;
    }
    let hostname = match context.cloud.ensure_application_load_balancer(&model).await {
        Ok(hostname) => hostname,
        Err(err) => {
            context
                .event(
                    ingress,
                    EventType::Warning,
                    "FailedDeployModel",
                    format!("Failed deploy model due to {err}"),
                )
                .await;
            return Err(err);
        }
    };
    if status_hostname(ingress) != Some(hostname.as_str()) {
        api.patch_status(
            &name,
            &patch_params(),
            &Patch::Merge(
                json!({"status": {"loadBalancer": {"ingress": [{"hostname": hostname}]}}}),
            ),
        )
        .await
        .map_err(api_error)?;
        tracing::info!(ingress = %key, %hostname, "ingress status updated");
    }
    if announce {
        context
            .event(
                ingress,
                EventType::Normal,
                "SuccessfullyReconciled",
                "Successfully reconciled".into(),
            )
            .await;
    }
    if let Ok(mut synced) = context.synced.lock() {
        synced.insert(
            key,
            Synced {
                model,
                at: Instant::now(),
            },
        );
    }
    Ok(Action::requeue(RESYNC))
}

fn error_policy(ingress: Arc<Ingress>, err: &CloudError, context: Arc<Context>) -> Action {
    let key = key_of(&ingress);
    context.forget(&ingress);
    let failures = match context.failures.lock() {
        Ok(mut failures) => {
            let count = failures.entry(key.clone()).or_insert(0);
            *count = count.saturating_add(1);
            *count
        }
        Err(_) => 1,
    };
    let delay = backoff(failures);
    tracing::warn!(ingress = %key, %err, retry_in = ?delay, "ingress sync failed");
    Action::requeue(delay)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ingress(value: serde_json::Value) -> Ingress {
        serde_json::from_value(value).expect("an ingress")
    }

    #[test]
    fn finalizer_patches_keep_other_finalizers() {
        let ing =
            ingress(json!({"metadata": {"finalizers": ["a", FINALIZER], "resourceVersion": "7"}}));
        assert_eq!(
            finalizer_patch(&ing, false)["metadata"]["finalizers"],
            json!(["a"])
        );
        assert_eq!(
            finalizer_patch(&ing, true)["metadata"]["finalizers"],
            json!(["a", FINALIZER])
        );
        assert_eq!(
            finalizer_patch(&ing, true)["metadata"]["resourceVersion"],
            "7"
        );
    }

    #[test]
    fn services_map_to_the_ingresses_naming_them() {
        let ingresses: Vec<Arc<Ingress>> = [
            ("a", "shop", "web"),
            ("b", "shop", "api"),
            ("c", "other", "web"),
        ]
        .iter()
        .map(|(name, namespace, service)| {
            Arc::new(ingress(json!({
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"defaultBackend": {"service": {"name": service, "port": {"number": 80}}}},
            })))
        })
        .collect();
        let service: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop"},
        }))
        .expect("a service");
        let refs: Vec<String> = ingresses_using(&ingresses, &service)
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(refs, vec!["a"]);
    }

    #[test]
    fn targets_are_eligible_nodes_with_provider_ids() {
        let ready = json!({"conditions": [{"type": "Ready", "status": "True"}]});
        let nodes: Vec<Arc<Node>> = [
            json!({"spec": {"providerID": "aws:///us-east-1a/i-1"}, "status": ready}),
            json!({"spec": {"providerID": "aws:///us-east-1b/i-2"},
                   "status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
            json!({"spec": {}, "status": ready}),
        ]
        .into_iter()
        .map(|v| Arc::new(serde_json::from_value(v).expect("a node")))
        .collect();
        assert_eq!(
            target_nodes(&nodes).into_iter().collect::<Vec<_>>(),
            vec!["aws:///us-east-1a/i-1"]
        );
    }
}
