//! The service controller (upstream's cloud-provider `controllers/service`): every
//! `type: LoadBalancer` Service without a `loadBalancerClass` gets a cloud load balancer
//! targeting the cluster's eligible nodes, its hostname in `status.loadBalancer`, and the
//! `service.kubernetes.io/load-balancer-cleanup` finalizer so the load balancer is deleted
//! before the Service is. Node changes that alter the set of eligible nodes resync every
//! Service's targets. Failures are events (`SyncLoadBalancerFailed`) and back-off requeues.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use crate::config::CloudSettings;
use crate::node::{api_error, is_ready};
use crate::provider::{CloudError, LoadBalancers};

/// Upstream's finalizer: the load balancer is deleted before the Service may go.
pub const FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";
/// A Node with this label is never a target (upstream's `LabelNodeExcludeBalancers`).
pub const EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
/// The cluster autoscaler's taint on a Node it is about to remove.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";
const REPORTER: &str = "service-controller";
const MANAGER: &str = "service-controller";
/// First retry after a failure, doubled on each further failure up to [`MAX_BACKOFF`]
/// (upstream's `minRetryDelay` / `maxRetryDelay`).
const MIN_BACKOFF: Duration = Duration::from_secs(5);
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// How often an unchanged Service is ensured again, repairing drift in the cloud
/// (upstream's node sync period is 100 s).
const RESYNC: Duration = Duration::from_secs(100);

/// Whether the Service asks this controller for a load balancer (upstream's
/// `wantsLoadBalancer`): `type: LoadBalancer` and no `loadBalancerClass` (another
/// implementation's).
pub fn wants_load_balancer(service: &Service) -> bool {
    service.spec.as_ref().is_some_and(|spec| {
        spec.type_.as_deref() == Some("LoadBalancer") && spec.load_balancer_class.is_none()
    })
}

fn has_finalizer(service: &Service) -> bool {
    service
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
}

/// Upstream's `needsCleanup`: we hold the finalizer and the Service is being deleted or no
/// longer wants a load balancer.
pub fn needs_cleanup(service: &Service) -> bool {
    has_finalizer(service)
        && (service.metadata.deletion_timestamp.is_some() || !wants_load_balancer(service))
}

/// Whether a Node is a load balancer target: Ready, not being deleted, not labelled
/// [`EXCLUDE_LABEL`] and not tainted [`TO_BE_DELETED_TAINT`] (upstream's node predicates;
/// unschedulable Nodes stay targets, as upstream keeps them since 1.19).
pub fn node_is_eligible(node: &Node) -> bool {
    let excluded = node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(EXCLUDE_LABEL));
    let doomed = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TO_BE_DELETED_TAINT));
    node.metadata.deletion_timestamp.is_none() && !excluded && !doomed && is_ready(node)
}

/// The eligible Nodes, and their identity (name and provider ID) to notice a change by.
fn eligible(nodes: &[Arc<Node>]) -> (Vec<Node>, BTreeSet<(String, String)>) {
    let mut chosen = Vec::new();
    let mut hosts = BTreeSet::new();
    for node in nodes.iter().filter(|n| node_is_eligible(n)) {
        hosts.insert((
            node.metadata.name.clone().unwrap_or_default(),
            node.spec
                .as_ref()
                .and_then(|s| s.provider_id.clone())
                .unwrap_or_default(),
        ));
        chosen.push(Node::clone(node));
    }
    (chosen, hosts)
}

/// The retry delay after `failures` failures in a row.
pub fn backoff(failures: u32) -> Duration {
    let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(16));
    MIN_BACKOFF.saturating_mul(factor).min(MAX_BACKOFF)
}

/// What of a Service its load balancer depends on: when it changes the load balancer is
/// ensured again (upstream's `needsUpdate`).
pub fn fingerprint(service: &Service) -> String {
    let spec = service.spec.as_ref();
    json!({
        "type": spec.and_then(|s| s.type_.clone()),
        "ports": spec.and_then(|s| s.ports.clone()),
        "externalTrafficPolicy": spec.and_then(|s| s.external_traffic_policy.clone()),
        "healthCheckNodePort": spec.and_then(|s| s.health_check_node_port),
        "annotations": service.metadata.annotations,
        "uid": service.metadata.uid,
    })
    .to_string()
}

/// What the controller last did for a Service.
struct Synced {
    fingerprint: String,
    hosts: BTreeSet<(String, String)>,
    at: Instant,
}

struct Context {
    client: kube::Client,
    cloud: Arc<dyn LoadBalancers>,
    nodes: Store<Node>,
    recorder: Recorder,
    synced: Mutex<HashMap<String, Synced>>,
    failures: Mutex<HashMap<String, u32>>,
}

fn key_of(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or_default(),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

impl Context {
    async fn event(&self, service: &Service, type_: EventType, reason: &str, note: String) {
        crate::owned::publish(
            &self.recorder,
            &service.object_ref(&()),
            type_,
            reason,
            note,
        )
        .await;
    }

    fn services(&self, service: &Service) -> Api<Service> {
        Api::namespaced(
            self.client.clone(),
            service.metadata.namespace.as_deref().unwrap_or("default"),
        )
    }

    fn forget(&self, service: &Service) {
        if let Ok(mut synced) = self.synced.lock() {
            synced.remove(&key_of(service));
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
fn finalizer_patch(service: &Service, add: bool) -> serde_json::Value {
    crate::owned::finalizer_patch(&service.metadata, FINALIZER, add)
}

/// Runs the service controller until the task is dropped.
pub async fn run(
    client: kube::Client,
    cloud: Arc<dyn LoadBalancers>,
    settings: Arc<CloudSettings>,
) {
    let services: Api<Service> = Api::all(client.clone());
    let (nodes, writer) = reflector::store();
    let node_stream = reflector::reflector(
        writer,
        watcher(Api::<Node>::all(client.clone()), watcher::Config::default()),
    )
    .default_backoff()
    .touched_objects();
    // Heartbeats change Nodes all the time; only a change of the eligible set (readiness,
    // labels, taints, provider IDs, Nodes coming and going) resyncs the Services.
    let trigger = {
        let nodes = nodes.clone();
        let mut last: Option<BTreeSet<(String, String)>> = None;
        node_stream.filter_map(move |event| {
            let changed = match event {
                Ok(_) => {
                    let (_, hosts) = eligible(&nodes.state());
                    let changed = last.as_ref() != Some(&hosts);
                    last = Some(hosts);
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
    let context = Arc::new(Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: REPORTER.into(),
                instance: None,
            },
        ),
        client,
        cloud,
        nodes: nodes.clone(),
        synced: Mutex::new(HashMap::new()),
        failures: Mutex::new(HashMap::new()),
    });
    tracing::info!(cluster = %settings.cluster_id, "service controller starting");
    Controller::new(services, watcher::Config::default())
        .reconcile_all_on(trigger)
        .run(reconcile, error_policy, context)
        .for_each(|outcome| async move {
            if let Err(err) = outcome {
                tracing::debug!(%err, "service reconcile failed");
            }
        })
        .await;
}

async fn reconcile(service: Arc<Service>, context: Arc<Context>) -> Result<Action, CloudError> {
    // The targets come from the Node cache: wait until it has been listed once, or the first
    // pass would register no node at all.
    if context.nodes.wait_until_ready().await.is_err() {
        return Ok(Action::requeue(MIN_BACKOFF));
    }
    let action = sync(&service, &context).await?;
    if let Ok(mut failures) = context.failures.lock() {
        failures.remove(&key_of(&service));
    }
    Ok(action)
}

async fn sync(service: &Service, context: &Context) -> Result<Action, CloudError> {
    let key = key_of(service);
    let api = context.services(service);
    let name = service.metadata.name.clone().unwrap_or_default();
    if needs_cleanup(service) {
        context
            .event(
                service,
                EventType::Normal,
                "DeletingLoadBalancer",
                "Deleting load balancer".into(),
            )
            .await;
        if let Err(err) = context.cloud.ensure_load_balancer_deleted(service).await {
            context
                .event(
                    service,
                    EventType::Warning,
                    "SyncLoadBalancerFailed",
                    format!("Error syncing load balancer: failed to delete load balancer: {err}"),
                )
                .await;
            return Err(err);
        }
        context
            .event(
                service,
                EventType::Normal,
                "DeletedLoadBalancer",
                "Deleted load balancer".into(),
            )
            .await;
        let has_ingress = service
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .is_some_and(|lb| lb.ingress.as_ref().is_some_and(|i| !i.is_empty()));
        if service.metadata.deletion_timestamp.is_none() && has_ingress {
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
                &Patch::Merge(finalizer_patch(service, false)),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(err) => return Err(api_error(err)),
        }
        context.forget(service);
        tracing::info!(service = %key, "load balancer deleted, finalizer removed");
        return Ok(Action::await_change());
    }
    if !wants_load_balancer(service) || service.metadata.deletion_timestamp.is_some() {
        context.forget(service);
        return Ok(Action::await_change());
    }

    let (nodes, hosts) = eligible(&context.nodes.state());
    let fingerprint = fingerprint(service);
    let current = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.clone());
    let has_ingress = current
        .as_ref()
        .is_some_and(|lb| lb.ingress.as_ref().is_some_and(|i| !i.is_empty()));
    let previous = context.synced.lock().ok().and_then(|synced| {
        synced.get(&key).map(|s| {
            (
                s.fingerprint == fingerprint,
                s.hosts == hosts,
                s.at.elapsed(),
            )
        })
    });
    match previous {
        Some((true, true, elapsed)) if has_ingress && elapsed < RESYNC => {
            return Ok(Action::requeue(RESYNC - elapsed));
        }
        Some((true, false, _)) if has_ingress => {
            // Only the nodes changed: upstream's `updateLoadBalancerHosts`.
            if let Err(err) = context.cloud.update_load_balancer(service, &nodes).await {
                context
                    .event(
                        service,
                        EventType::Warning,
                        "UpdateLoadBalancerFailed",
                        format!(
                            "Error updating load balancer with new hosts {}: {err}",
                            host_names(&hosts)
                        ),
                    )
                    .await;
                return Err(err);
            }
            context
                .event(
                    service,
                    EventType::Normal,
                    "UpdatedLoadBalancer",
                    "Updated load balancer with new hosts".into(),
                )
                .await;
            remember(context, key, fingerprint, hosts);
            return Ok(Action::requeue(RESYNC));
        }
        _ => {}
    }
    // A resync of an unchanged Service repairs drift silently; anything else is announced.
    let announce = !matches!(previous, Some((true, true, _))) || !has_ingress;
    if !has_finalizer(service) {
        // Before anything exists in the cloud, so nothing can be left behind by a delete.
        api.patch(
            &name,
            &patch_params(),
            &Patch::Merge(finalizer_patch(service, true)),
        )
        .await
        .map_err(api_error)?;
    }
    if announce {
        context
            .event(
                service,
                EventType::Normal,
                "EnsuringLoadBalancer",
                "Ensuring load balancer".into(),
            )
            .await;
    }
    let status = match context.cloud.ensure_load_balancer(service, &nodes).await {
        Ok(status) => status,
        Err(err) => {
            context
                .event(
                    service,
                    EventType::Warning,
                    "SyncLoadBalancerFailed",
                    format!("Error syncing load balancer: failed to ensure load balancer: {err}"),
                )
                .await;
            return Err(err);
        }
    };
    if announce {
        context
            .event(
                service,
                EventType::Normal,
                "EnsuredLoadBalancer",
                "Ensured load balancer".into(),
            )
            .await;
    }
    if !same_status(current.as_ref(), &status) {
        api.patch_status(
            &name,
            &patch_params(),
            &Patch::Merge(json!({"status": {"loadBalancer": status}})),
        )
        .await
        .map_err(api_error)?;
        tracing::info!(service = %key, ?status, "load balancer status updated");
    }
    remember(context, key, fingerprint, hosts);
    Ok(Action::requeue(RESYNC))
}

fn host_names(hosts: &BTreeSet<(String, String)>) -> String {
    let names: Vec<&str> = hosts.iter().map(|(name, _)| name.as_str()).collect();
    format!("{names:?}")
}

fn remember(
    context: &Context,
    key: String,
    fingerprint: String,
    hosts: BTreeSet<(String, String)>,
) {
    if let Ok(mut synced) = context.synced.lock() {
        synced.insert(
            key,
            Synced {
                fingerprint,
                hosts,
                at: Instant::now(),
            },
        );
    }
}

fn same_status(current: Option<&LoadBalancerStatus>, next: &LoadBalancerStatus) -> bool {
    let normalize = |s: Option<&LoadBalancerStatus>| {
        s.and_then(|s| s.ingress.clone())
            .filter(|i| !i.is_empty())
            .unwrap_or_default()
    };
    normalize(current) == normalize(Some(next))
}

fn error_policy(service: Arc<Service>, err: &CloudError, context: Arc<Context>) -> Action {
    let key = key_of(&service);
    // The next pass must do a full ensure, whatever it remembered.
    context.forget(&service);
    let failures = match context.failures.lock() {
        Ok(mut failures) => {
            let count = failures.entry(key.clone()).or_insert(0);
            *count = count.saturating_add(1);
            *count
        }
        Err(_) => 1,
    };
    let delay = backoff(failures);
    tracing::warn!(service = %key, %err, retry_in = ?delay, "service sync failed");
    Action::requeue(delay)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(value: serde_json::Value) -> Service {
        serde_json::from_value(value).expect("a service")
    }

    #[test]
    fn which_services_are_ours() {
        let cases = [
            (json!({"spec": {"type": "LoadBalancer"}}), true),
            (json!({"spec": {"type": "ClusterIP"}}), false),
            (json!({"spec": {"type": "NodePort"}}), false),
            (json!({"spec": {}}), false),
            (
                json!({"spec": {"type": "LoadBalancer", "loadBalancerClass": "example.com/lb"}}),
                false,
            ),
        ];
        for (value, want) in cases {
            assert_eq!(
                wants_load_balancer(&service(value.clone())),
                want,
                "{value}"
            );
        }
    }

    #[test]
    fn cleanup_needs_our_finalizer_and_a_delete_or_a_type_change() {
        let cases = [
            (json!({"spec": {"type": "LoadBalancer"}}), false),
            (
                json!({"metadata": {"finalizers": [FINALIZER]}, "spec": {"type": "LoadBalancer"}}),
                false,
            ),
            (
                json!({"metadata": {"finalizers": [FINALIZER], "deletionTimestamp": "2025-01-01T00:00:00Z"},
                       "spec": {"type": "LoadBalancer"}}),
                true,
            ),
            (
                json!({"metadata": {"finalizers": [FINALIZER]}, "spec": {"type": "ClusterIP"}}),
                true,
            ),
            (
                json!({"metadata": {"finalizers": ["other"], "deletionTimestamp": "2025-01-01T00:00:00Z"},
                       "spec": {"type": "LoadBalancer"}}),
                false,
            ),
        ];
        for (value, want) in cases {
            assert_eq!(needs_cleanup(&service(value.clone())), want, "{value}");
        }
    }

    fn node(value: serde_json::Value) -> Node {
        serde_json::from_value(value).expect("a node")
    }

    #[test]
    fn eligible_nodes() {
        let ready = json!({"conditions": [{"type": "Ready", "status": "True"}]});
        let cases = [
            (json!({"status": ready}), true),
            (
                json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
                false,
            ),
            (
                json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}),
                false,
            ),
            (json!({}), false),
            (
                json!({"metadata": {"deletionTimestamp": "2025-01-01T00:00:00Z"}, "status": ready}),
                false,
            ),
            (
                json!({"metadata": {"labels": {EXCLUDE_LABEL: ""}}, "status": ready}),
                false,
            ),
            (
                json!({"spec": {"taints": [{"key": TO_BE_DELETED_TAINT, "effect": "NoSchedule"}]},
                       "status": ready}),
                false,
            ),
            (
                json!({"spec": {"unschedulable": true}, "status": ready}),
                true,
            ),
        ];
        for (value, want) in cases {
            assert_eq!(node_is_eligible(&node(value.clone())), want, "{value}");
        }
    }

    #[test]
    fn backoff_doubles_from_five_seconds_to_five_minutes() {
        let secs: Vec<u64> = [1, 2, 3, 4, 5, 6, 7, 8, 100]
            .into_iter()
            .map(|n| backoff(n).as_secs())
            .collect();
        assert_eq!(secs, vec![5, 10, 20, 40, 80, 160, 300, 300, 300]);
    }

    #[test]
    fn finalizer_patches_keep_other_finalizers() {
        let svc =
            service(json!({"metadata": {"finalizers": ["a", FINALIZER], "resourceVersion": "9"}}));
        assert_eq!(
            finalizer_patch(&svc, false)["metadata"]["finalizers"],
            json!(["a"])
        );
        assert_eq!(
            finalizer_patch(&svc, true)["metadata"]["finalizers"],
            json!(["a", FINALIZER])
        );
        assert_eq!(
            finalizer_patch(&svc, true)["metadata"]["resourceVersion"],
            "9"
        );
    }

    #[test]
    fn fingerprints_change_with_ports_and_annotations_only() {
        let base = json!({"metadata": {"uid": "u", "resourceVersion": "1"},
                          "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "nodePort": 30080}]}});
        let mut status_only = base.clone();
        status_only["metadata"]["resourceVersion"] = json!("2");
        status_only["status"] = json!({"loadBalancer": {"ingress": [{"hostname": "h"}]}});
        assert_eq!(
            fingerprint(&service(base.clone())),
            fingerprint(&service(status_only))
        );
        let mut annotated = base.clone();
        annotated["metadata"]["annotations"] = json!({"a": "b"});
        assert_ne!(
            fingerprint(&service(base.clone())),
            fingerprint(&service(annotated))
        );
        let mut ported = base.clone();
        ported["spec"]["ports"][0]["nodePort"] = json!(30081);
        assert_ne!(fingerprint(&service(base)), fingerprint(&service(ported)));
    }
}
