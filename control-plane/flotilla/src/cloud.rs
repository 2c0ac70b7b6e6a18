//! The cloud controllers in this binary: `flotilla cloud-controller` against any kubeconfig,
//! and (in the hosted service) the bridge from a cluster's management record — its `cloud`
//! section and node pools — to the cloud-controller crate, run beside the cluster's other
//! control loops on the replica holding its lease.

use std::sync::Arc;
use std::time::Duration;

use flotilla_cloud_controller::aws::AwsCloud;
use flotilla_cloud_controller::config::{CloudSettings, StaticCredentials};
use flotilla_cloud_controller::nodepool::{
    ClusterEndpoint, NodePoolSpec, NodePools, PoolObservation,
};
use flotilla_management::model::{Cluster, ClusterStatus, HealthIssue, NodePool, NodePoolStatus};
use flotilla_management::{Management, NodePoolReport};
use k8s_openapi::api::core::v1::{PersistentVolume, Service, Taint};
use kube::api::{Api, ListParams};

use crate::CloudControllerArgs;

/// `flotilla cloud-controller`: the node, load-balancer and volume controllers of one cluster,
/// leader-elected as upstream's cloud-controller-manager.
pub async fn standalone(args: CloudControllerArgs) -> anyhow::Result<()> {
    let credentials = match (
        std::env::var("AWS_ACCESS_KEY_ID"),
        std::env::var("AWS_SECRET_ACCESS_KEY"),
    ) {
        (Ok(access_key_id), Ok(secret_access_key)) => Some(StaticCredentials {
            access_key_id,
            secret_access_key,
        }),
        _ => None,
    };
    let settings = Arc::new(CloudSettings {
        cluster_id: args.cluster_id,
        region: args.region,
        endpoint_override: args.endpoint_override,
        credentials,
        role_arn: args.role_arn,
        vpc_id: args.vpc_id,
        subnet_ids: args.subnet_ids,
        security_group_ids: Vec::new(),
    });
    let cloud = Arc::new(AwsCloud::connect((*settings).clone()).await);
    crate::standalone::run(args.standalone, "cloud-controller-manager", move |client| {
        flotilla_cloud_controller::run(client, cloud.clone(), settings.clone())
    })
    .await
}

/// How often a cluster's node pools are reconciled even without a change of records, while
/// the cluster has a cloud (the reconciler's index, which also wakes this loop, changes only
/// when a record does).
const POOL_RESYNC: Duration = Duration::from_secs(5);

/// What a cluster record says about its cloud.
fn settings_of(cluster: &Cluster) -> CloudSettings {
    let cloud = &cluster.cloud;
    CloudSettings {
        cluster_id: cluster.id.clone(),
        region: cloud.region.clone().unwrap_or_else(|| "us-east-1".into()),
        endpoint_override: cloud.endpoint_override.clone(),
        credentials: cloud.credentials.as_ref().and_then(|keys| {
            Some(StaticCredentials {
                access_key_id: keys.access_key_id.clone(),
                secret_access_key: keys.secret_access_key.clone()?,
            })
        }),
        role_arn: cloud.role_arn.clone(),
        vpc_id: cloud.vpc_id.clone(),
        subnet_ids: cloud.subnet_ids.clone(),
        security_group_ids: cloud.security_group_ids.clone(),
    }
}

/// EKS's taint effects in Kubernetes spelling.
fn taint_of(taint: &flotilla_management::model::Taint) -> Taint {
    let effect = match taint.effect.as_str() {
        "NO_EXECUTE" => "NoExecute",
        "PREFER_NO_SCHEDULE" => "PreferNoSchedule",
        _ => "NoSchedule",
    };
    Taint {
        key: taint.key.clone(),
        value: taint.value.clone(),
        effect: effect.into(),
        time_added: None,
    }
}

fn pool_spec(cluster: &Cluster, pool: &NodePool) -> NodePoolSpec {
    NodePoolSpec {
        cluster_name: cluster.name.clone(),
        name: pool.name.clone(),
        instance_types: pool.instance_types.clone(),
        image_id: pool.image_id.clone(),
        kubernetes_version: cluster.version.clone(),
        desired_size: pool.scaling_config.desired_size,
        labels: pool.labels.clone(),
        taints: pool.taints.iter().map(taint_of).collect(),
        subnet_ids: if pool.subnets.is_empty() {
            cluster.cloud.subnet_ids.clone()
        } else {
            pool.subnets.clone()
        },
        deleting: pool.status == NodePoolStatus::Deleting
            || cluster.status == ClusterStatus::Deleting,
    }
}

/// The cloud controllers of one cluster with a cloud, in the hosted service: the node,
/// load-balancer and volume controllers while the cluster's cloud settings stay the same
/// (restarted when they change), and a pass over its node pools whenever the management
/// records change (at least every [`POOL_RESYNC`]). When the cluster is being deleted, its
/// pools drain away, then every load balancer and volume it made goes, then the record is
/// released for the reconciler to destroy the tenant.
pub async fn hosted(
    client: kube::Client,
    management: Arc<Management>,
    cluster_id: String,
    node_join_timeout: Duration,
) {
    let mut index = management.cluster_index();
    let mut current: Option<(CloudSettings, Arc<AwsCloud>, tokio::task::JoinHandle<()>)> = None;
    let mut ticker = tokio::time::interval(POOL_RESYNC);
    let mut first = true;
    loop {
        // The first pass runs at once. After it, a cluster without a cloud waits only for its
        // record to change: the resync ticks only while there are cloud resources to watch
        // over, so an idle fleet's clusters have no timer here.
        if !std::mem::take(&mut first) {
            tokio::select! {
                changed = index.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                _ = ticker.tick(), if current.is_some() => {}
            }
        }
        let managed = index.borrow_and_update().get(&cluster_id).cloned();
        let Some(managed) = managed else {
            continue;
        };
        if !managed.cluster.has_cloud() {
            if let Some((_, _, task)) = current.take() {
                task.abort();
            }
            continue;
        }
        let settings = settings_of(&managed.cluster);
        if current
            .as_ref()
            .is_none_or(|(seen, _, _)| *seen != settings)
        {
            if let Some((_, _, task)) = current.take() {
                task.abort();
            }
            tracing::info!(cluster = %cluster_id, region = %settings.region, "cloud controllers starting");
            let cloud = Arc::new(AwsCloud::connect(settings.clone()).await);
            let task = tokio::spawn(flotilla_cloud_controller::run(
                client.clone(),
                cloud.clone(),
                Arc::new(settings.clone()),
            ));
            current = Some((settings.clone(), cloud, task));
        }
        let Some((current_settings, cloud, _)) = current.as_ref() else {
            continue;
        };
        let pools = NodePools::new(
            client.clone(),
            cloud.clone(),
            Arc::new(settings),
            ClusterEndpoint {
                server: managed.cluster.endpoint.clone(),
                ca_pem: management.public_endpoint().ca_pem.clone(),
            },
        )
        .with_node_join_timeout(node_join_timeout);
        let specs: Vec<NodePoolSpec> = managed
            .pools
            .iter()
            .map(|pool| pool_spec(&managed.cluster, pool))
            .collect();
        let observations = pools.reconcile_all(&specs).await;
        for (pool, observation) in managed.pools.iter().zip(observations) {
            let outcome = if observation.gone {
                management
                    .forget_node_pool(&managed.cluster, &pool.name)
                    .await
            } else {
                management
                    .report_node_pool(&managed.cluster, &pool.name, report_of(observation))
                    .await
            };
            if let Err(err) = outcome {
                tracing::warn!(cluster = %cluster_id, pool = %pool.name, %err, "recording the node pool failed");
            }
        }
        if managed.cluster.status == ClusterStatus::Deleting
            && managed.pools.is_empty()
            && !managed.cluster.cloud_released
        {
            match release(&client, cloud.as_ref(), current_settings).await {
                Ok(()) => {
                    if let Err(err) = management.release_cloud(&managed.cluster).await {
                        tracing::warn!(cluster = %cluster_id, %err, "releasing the cluster failed");
                    }
                }
                Err(err) => {
                    tracing::warn!(cluster = %cluster_id, %err, "cloud clean-up of a deleted cluster failed; retrying")
                }
            }
        }
    }
}

fn report_of(observation: PoolObservation) -> NodePoolReport {
    NodePoolReport {
        instance_ids: observation.instance_ids,
        ready_nodes: observation.ready_nodes,
        issues: observation
            .issues
            .into_iter()
            .map(|issue| HealthIssue {
                code: issue.code,
                message: issue.message,
                resource_ids: issue.resource_ids,
            })
            .collect(),
    }
}

/// Deletes what the cluster's objects made in the cloud: every `type: LoadBalancer`
/// Service's load balancer, every Ingress's application load balancer (found by the
/// cluster's tags), and the volumes of PersistentVolumes whose reclaim policy is Delete (the
/// tenant and its objects go right after, so no controller would).
async fn release(
    client: &kube::Client,
    cloud: &AwsCloud,
    settings: &CloudSettings,
) -> anyhow::Result<()> {
    use flotilla_cloud_controller::provider::{LoadBalancers, Volumes};
    let services: Api<Service> = Api::all(client.clone());
    for service in services.list(&ListParams::default()).await?.items {
        let is_load_balancer = service
            .spec
            .as_ref()
            .and_then(|s| s.type_.as_deref())
            .is_some_and(|t| t == "LoadBalancer");
        if is_load_balancer {
            cloud.ensure_load_balancer_deleted(&service).await?;
        }
    }
    flotilla_cloud_controller::ingress::release(cloud, settings).await?;
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    for volume in volumes.list(&ListParams::default()).await?.items {
        let Some(spec) = volume.spec.as_ref() else {
            continue;
        };
        let ours = spec
            .csi
            .as_ref()
            .is_some_and(|csi| csi.driver == flotilla_cloud_controller::volume::params::DRIVER);
        let delete = spec.persistent_volume_reclaim_policy.as_deref() == Some("Delete");
        if let (true, true, Some(csi)) = (ours, delete, spec.csi.as_ref()) {
            cloud.delete_volume(&csi.volume_handle).await?;
        }
    }
    Ok(())
}
