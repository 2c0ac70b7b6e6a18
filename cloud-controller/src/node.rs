//! The cloud node controllers (upstream's `cloud-node-controller` and
//! `cloud-node-lifecycle-controller` over `InstancesV2`): a Node registered with the
//! `node.cloudprovider.kubernetes.io/uninitialized` taint gets its provider ID, addresses and
//! topology labels from its instance and loses the taint; a Node that is not Ready is deleted
//! when its instance is gone and tainted `node.cloudprovider.kubernetes.io/shutdown` while
//! the instance is stopped.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use serde_json::json;

use crate::provider::{CloudError, InstanceMetadata, InstancesV2};

/// The taint kubelets started with `--cloud-provider=external` register with.
pub const UNINITIALIZED_TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// The taint of a Node whose instance is stopped.
pub const SHUTDOWN_TAINT: &str = "node.cloudprovider.kubernetes.io/shutdown";
/// Zone, region and instance-type labels, current and the deprecated ones upstream still sets.
const ZONE_LABELS: [&str; 2] = [
    "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/zone",
];
const REGION_LABELS: [&str; 2] = [
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/region",
];
const INSTANCE_TYPE_LABELS: [&str; 2] = [
    "node.kubernetes.io/instance-type",
    "beta.kubernetes.io/instance-type",
];
/// Upstream's `--node-monitor-period` for the lifecycle checks of not-Ready nodes.
const LIFECYCLE_PERIOD: Duration = Duration::from_secs(5);
/// Upstream's `nodeStatusUpdateFrequency` for refreshing the addresses of Ready nodes.
const ADDRESS_REFRESH: Duration = Duration::from_secs(300);
const MANAGER: &str = "cloud-controller-manager";

struct Context {
    nodes: Api<Node>,
    cloud: Arc<dyn InstancesV2>,
}

/// Runs the node controllers until the task is dropped.
pub async fn run(client: kube::Client, cloud: Arc<dyn InstancesV2>) {
    let nodes: Api<Node> = Api::all(client);
    let context = Arc::new(Context {
        nodes: nodes.clone(),
        cloud,
    });
    Controller::new(nodes, watcher::Config::default())
        .run(reconcile, error_policy, context)
        .for_each(|outcome| async move {
            if let Err(err) = outcome {
                tracing::debug!(%err, "node reconcile failed");
            }
        })
        .await;
}

fn has_taint(node: &Node, key: &str) -> bool {
    taints(node).iter().any(|t| t.key == key)
}

fn taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

/// Whether the Node's Ready condition is True.
pub(crate) fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// What the node controller writes onto a Node initialised from `metadata`: the spec and
/// label patch (provider ID only when unset, as upstream never changes it) and the taints
/// left once the uninitialized one is gone.
pub fn initialization_patch(node: &Node, metadata: &InstanceMetadata) -> serde_json::Value {
    let mut labels = serde_json::Map::new();
    for key in ZONE_LABELS {
        labels.insert(key.into(), json!(metadata.zone));
    }
    for key in REGION_LABELS {
        labels.insert(key.into(), json!(metadata.region));
    }
    for key in INSTANCE_TYPE_LABELS {
        labels.insert(key.into(), json!(metadata.instance_type));
    }
    let remaining: Vec<&Taint> = taints(node)
        .iter()
        .filter(|t| t.key != UNINITIALIZED_TAINT)
        .collect();
    let mut spec = json!({ "taints": remaining });
    let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
    if provider_id.is_none_or(str::is_empty) {
        spec["providerID"] = json!(metadata.provider_id);
    }
    json!({
        "metadata": {
            "labels": labels,
            // The taints list is replaced whole; the resourceVersion makes that safe.
            "resourceVersion": node.metadata.resource_version,
        },
        "spec": spec,
    })
}

async fn reconcile(node: Arc<Node>, context: Arc<Context>) -> Result<Action, CloudError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    if node.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let patch_params = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    if has_taint(&node, UNINITIALIZED_TAINT) {
        let Some(metadata) = context.cloud.instance_metadata(&node).await? else {
            tracing::info!(node = %name, "no instance found for the node yet");
            return Ok(Action::requeue(LIFECYCLE_PERIOD));
        };
        set_addresses(&context.nodes, &name, &metadata, &patch_params).await?;
        context
            .nodes
            .patch(
                &name,
                &patch_params,
                &Patch::Merge(initialization_patch(&node, &metadata)),
            )
            .await
            .map_err(api_error)?;
        tracing::info!(node = %name, provider_id = %metadata.provider_id, "node initialized");
        return Ok(Action::requeue(ADDRESS_REFRESH));
    }
    if is_ready(&node) {
        if let Some(metadata) = context.cloud.instance_metadata(&node).await? {
            set_addresses(&context.nodes, &name, &metadata, &patch_params).await?;
        }
        return Ok(Action::requeue(ADDRESS_REFRESH));
    }
    // Not Ready: is the machine gone, or only stopped?
    if !context.cloud.instance_exists(&node).await? {
        tracing::info!(node = %name, "deleting the node: its instance no longer exists");
        match context.nodes.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(err) => return Err(api_error(err)),
        }
        return Ok(Action::await_change());
    }
    let shutdown = context.cloud.instance_shutdown(&node).await?;
    if shutdown != has_taint(&node, SHUTDOWN_TAINT) {
        let mut next: Vec<Taint> = taints(&node)
            .iter()
            .filter(|t| t.key != SHUTDOWN_TAINT)
            .cloned()
            .collect();
        if shutdown {
            next.push(Taint {
                key: SHUTDOWN_TAINT.into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            });
        }
        let patch = json!({
            "metadata": {"resourceVersion": node.metadata.resource_version},
            "spec": {"taints": next},
        });
        context
            .nodes
            .patch(&name, &patch_params, &Patch::Merge(patch))
            .await
            .map_err(api_error)?;
    }
    Ok(Action::requeue(LIFECYCLE_PERIOD))
}

async fn set_addresses(
    nodes: &Api<Node>,
    name: &str,
    metadata: &InstanceMetadata,
    params: &PatchParams,
) -> Result<(), CloudError> {
    if metadata.node_addresses.is_empty() {
        return Ok(());
    }
    nodes
        .patch_status(
            name,
            params,
            &Patch::Merge(json!({"status": {"addresses": metadata.node_addresses}})),
        )
        .await
        .map_err(api_error)?;
    Ok(())
}

/// A failed API call, carried in the controllers' one error type: an API answer keeps its
/// Status reason (`Conflict`, `NotFound`, `TooManyRequests`…) as the code.
pub(crate) fn api_error(err: kube::Error) -> CloudError {
    let code = match &err {
        kube::Error::Api(status) if !status.reason.is_empty() => status.reason.clone(),
        _ => "KubernetesApiError".into(),
    };
    CloudError {
        code,
        message: err.to_string(),
        retryable: true,
    }
}

fn error_policy(node: Arc<Node>, err: &CloudError, _: Arc<Context>) -> Action {
    // A write that lost to the kubelet's own status update is retried at once on the new
    // version; anything else waits a monitor period.
    if err.code == "Conflict" {
        tracing::debug!(node = ?node.metadata.name, %err, "node changed meanwhile; retrying");
        return Action::requeue(Duration::from_millis(200));
    }
    tracing::warn!(node = ?node.metadata.name, %err, "node reconcile failed; retrying");
    Action::requeue(LIFECYCLE_PERIOD)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(taints: serde_json::Value, provider_id: Option<&str>) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "ip-10-0-1-5.ec2.internal", "resourceVersion": "7"},
            "spec": {"taints": taints, "providerID": provider_id},
        }))
        .expect("a node")
    }

    fn metadata() -> InstanceMetadata {
        InstanceMetadata {
            provider_id: "aws:///us-east-1a/i-1".into(),
            instance_type: "t3.large".into(),
            node_addresses: vec![],
            zone: "us-east-1a".into(),
            region: "us-east-1".into(),
        }
    }

    #[test]
    fn initialization_sets_provider_id_labels_and_drops_only_the_uninitialized_taint() {
        let node = node(
            json!([
                {"key": UNINITIALIZED_TAINT, "value": "true", "effect": "NoSchedule"},
                {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
            ]),
            None,
        );
        let patch = initialization_patch(&node, &metadata());
        assert_eq!(patch["spec"]["providerID"], "aws:///us-east-1a/i-1");
        assert_eq!(
            patch["spec"]["taints"],
            json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}])
        );
        assert_eq!(
            patch["metadata"]["labels"]["topology.kubernetes.io/zone"],
            "us-east-1a"
        );
        assert_eq!(
            patch["metadata"]["labels"]["topology.kubernetes.io/region"],
            "us-east-1"
        );
        assert_eq!(
            patch["metadata"]["labels"]["node.kubernetes.io/instance-type"],
            "t3.large"
        );
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
    }

    #[test]
    fn an_existing_provider_id_is_never_changed() {
        let node = node(json!([]), Some("aws:///us-east-1b/i-9"));
        let patch = initialization_patch(&node, &metadata());
        assert!(patch["spec"].get("providerID").is_none());
    }
}
