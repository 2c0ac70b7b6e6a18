//! Flotilla's cloud controller: the provider traits ([`provider`]), their AWS implementation
//! ([`aws`], the only code that links the AWS SDK), and the per-cluster controllers that run
//! as pure API clients of the tenant API, beside the scheduler and the controller-manager:
//! nodes ([`node`]), `type: LoadBalancer` Services ([`service`]), Ingresses on application
//! load balancers ([`ingress`]), EBS volumes ([`volume`]) and node pools ([`nodepool`], driven
//! by the hosted service's records).

pub mod aws;
pub mod config;
pub mod ingress;
pub mod node;
pub mod nodepool;
pub mod owned;
pub mod provider;
pub mod service;
pub mod volume;

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;

use crate::config::CloudSettings;
use crate::provider::Cloud;

/// Runs every cloud controller of one cluster until the task is dropped (upstream's
/// cloud-controller-manager): they are joined here, not spawned, so dropping stops them all.
pub async fn run(client: kube::Client, cloud: Arc<dyn Cloud>, settings: Arc<CloudSettings>) {
    let controllers: Vec<BoxFuture<'static, ()>> = vec![
        node::run(client.clone(), cloud.clone()).boxed(),
        service::run(client.clone(), cloud.clone(), settings.clone()).boxed(),
        ingress::run(client.clone(), cloud.clone(), settings.clone()).boxed(),
        volume::run(client, cloud, settings).boxed(),
    ];
    futures::future::join_all(controllers).await;
}
