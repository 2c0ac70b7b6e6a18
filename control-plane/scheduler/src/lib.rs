//! Flotilla's scheduler, a pure API client of one cluster: it watches pods and nodes, runs
//! upstream's default filters and scores ([`framework`]) for every pending pod of the default
//! scheduler, binds it through `pods/binding`, and marks a pod that fits nowhere with
//! `PodScheduled=False` (reason `Unschedulable`, upstream's message) and a `FailedScheduling`
//! event. Pending pods are retried whenever a pod or node changes, and every few seconds.

pub mod framework;

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use crate::framework::NodeInfo;

/// The scheduler name pods ask for by default.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";
/// How often pending pods are retried without any change seen.
const RETRY: Duration = Duration::from_secs(3);

/// Runs the scheduler on `client`'s cluster until the task is aborted.
pub async fn run(client: kube::Client) {
    let (pods, pod_writer) = reflector::store::<Pod>();
    let (nodes, node_writer) = reflector::store::<Node>();
    let pod_events = reflector::reflector(
        pod_writer,
        watcher::watcher(Api::<Pod>::all(client.clone()), watcher::Config::default()),
    )
    .default_backoff()
    .touched_objects()
    .map(|_| ());
    let node_events = reflector::reflector(
        node_writer,
        watcher::watcher(Api::<Node>::all(client.clone()), watcher::Config::default()),
    )
    .default_backoff()
    .touched_objects()
    .map(|_| ());
    let ticks = futures::stream::unfold((), |()| async {
        tokio::time::sleep(RETRY).await;
        Some(((), ()))
    });
    let mut triggers =
        futures::stream::select(futures::stream::select(pod_events, node_events), ticks)
            .ready_chunks(256)
            .boxed();
    while triggers.next().await.is_some() {
        // Not before both caches are filled: an empty node cache would call every pod
        // unschedulable.
        let filled = |ready: Option<Result<(), _>>| ready.is_some_and(|r: Result<(), _>| r.is_ok());
        if filled(futures::FutureExt::now_or_never(pods.wait_until_ready()))
            && filled(futures::FutureExt::now_or_never(nodes.wait_until_ready()))
        {
            schedule_pending(&client, &pods, &nodes).await;
        }
    }
}

fn is_pending(pod: &Pod) -> bool {
    let spec = pod.spec.as_ref();
    let unbound = spec
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or("")
        .is_empty();
    let ours = spec
        .and_then(|s| s.scheduler_name.as_deref())
        .is_none_or(|name| name == DEFAULT_SCHEDULER);
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("");
    unbound
        && ours
        && pod.metadata.deletion_timestamp.is_none()
        && !matches!(phase, "Succeeded" | "Failed")
}

/// The nodes with what is bound to them, by name.
fn snapshot(pods: &Store<Pod>, nodes: &Store<Node>) -> Vec<NodeInfo> {
    let mut infos: BTreeMap<String, NodeInfo> = nodes
        .state()
        .iter()
        .filter_map(|node| {
            let name = node.metadata.name.clone()?;
            Some((name, NodeInfo::new((**node).clone())))
        })
        .collect();
    for pod in pods.state() {
        let phase = pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .unwrap_or("");
        if matches!(phase, "Succeeded" | "Failed") {
            continue;
        }
        let Some(info) = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .and_then(|n| infos.get_mut(n))
        else {
            continue;
        };
        info.add_pod(&pod);
    }
    infos.into_values().collect()
}

async fn schedule_pending(client: &kube::Client, pods: &Store<Pod>, nodes: &Store<Node>) {
    let mut pending: Vec<_> = pods.state().into_iter().filter(|p| is_pending(p)).collect();
    if pending.is_empty() {
        return;
    }
    // Upstream's queue sort: higher priority first, then the older pod.
    pending.sort_by_key(|p| {
        (
            std::cmp::Reverse(p.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)),
            p.metadata.creation_timestamp.clone().map(|t| t.0),
        )
    });
    let mut infos = snapshot(pods, nodes);
    for pod in pending {
        let (Some(name), Some(namespace)) = (&pod.metadata.name, &pod.metadata.namespace) else {
            continue;
        };
        match framework::schedule(&pod, &infos) {
            Ok(node) => {
                if let Err(err) = bind(client, namespace, name, &node).await {
                    tracing::info!(pod = %name, %err, "binding failed; retrying later");
                    continue;
                }
                // Later pods of this pass see the node as it now is.
                if let Some(info) = infos
                    .iter_mut()
                    .find(|i| i.node.metadata.name.as_deref() == Some(node.as_str()))
                {
                    info.add_pod(&pod);
                }
            }
            Err(message) => {
                if let Err(err) = mark_unschedulable(client, &pod, namespace, name, &message).await
                {
                    tracing::debug!(pod = %name, %err, "marking the pod unschedulable failed");
                }
            }
        }
    }
}

/// `POST pods/{name}/binding` (upstream's DefaultBinder).
async fn bind(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    node: &str,
) -> Result<(), kube::Error> {
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": name, "namespace": namespace},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    });
    let body = serde_json::to_vec(&binding).map_err(kube::Error::SerdeError)?;
    let request = http::Request::post(format!(
        "/api/v1/namespaces/{namespace}/pods/{name}/binding"
    ))
    .header("content-type", "application/json")
    .body(body)
    .map_err(kube::Error::HttpError)?;
    client.request_text(request).await.map(|_| ())
}

/// `PodScheduled=False/Unschedulable` with the message, once per new message, and a
/// `FailedScheduling` event.
async fn mark_unschedulable(
    client: &kube::Client,
    pod: &Pod,
    namespace: &str,
    name: &str,
    message: &str,
) -> Result<(), kube::Error> {
    let already = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions.iter().any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.message.as_deref() == Some(message)
            })
        });
    if already {
        return Ok(());
    }
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let status = json!({"status": {"conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": message, "lastTransitionTime": now,
    }]}});
    let params = PatchParams {
        field_manager: Some(DEFAULT_SCHEDULER.into()),
        ..Default::default()
    };
    pods.patch_status(name, &params, &Patch::Strategic(&status))
        .await?;
    // A core/v1 Event, which `kubectl describe` and `kubectl get events` show.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), namespace);
    let event = serde_json::from_value(json!({
        "metadata": {"generateName": format!("{name}.")},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace,
                           "name": name, "uid": pod.metadata.uid},
        "reason": "FailedScheduling",
        "message": message,
        "type": "Warning",
        "source": {"component": DEFAULT_SCHEDULER},
        "reportingComponent": DEFAULT_SCHEDULER,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }))
    .map_err(kube::Error::SerdeError)?;
    events
        .create(&PostParams::default(), &event)
        .await
        .map(|_| ())
}
