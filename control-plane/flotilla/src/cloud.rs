//! The cloud controllers in this binary: `flotilla cloud-controller` against any kubeconfig,
//! and (in the hosted service) the bridge from a cluster's management record — its `cloud`
//! section and node pools — to the cloud-controller crate, run beside the cluster's other
//! control loops on the replica holding its lease.

use std::sync::Arc;

use flotilla_cloud_controller::aws::AwsCloud;
use flotilla_cloud_controller::config::{CloudSettings, StaticCredentials};

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
