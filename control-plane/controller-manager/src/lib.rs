//! Flotilla's controller-manager: upstream's controllers as pure API clients (kube-rs) of one
//! cluster, sharing one watch cache per resource type ([`informers`]) and each syncing objects
//! from per-object work queues ([`workqueue`]) that its watch handlers ([`handlers`]) feed. The
//! hosted service runs them per tenant on the in-process transport; `flotilla
//! controller-manager` runs them against any kubeconfig.

pub mod certificates;
pub mod cronjob;
pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod endpoints;
pub mod events;
pub mod expectations;
pub mod gc;
pub mod handlers;
pub mod history;
pub mod informers;
pub mod job;
pub mod namespace;
pub mod nodelifecycle;
pub mod podautoscaler;
pub mod pods;
pub mod pvbinder;
pub mod replicaset;
pub mod resourcequota;
pub mod selectors;
pub mod statefulset;
pub mod storageprotection;
pub mod workqueue;

use futures::FutureExt;
use futures::future::BoxFuture;
use std::sync::Arc;

use informers::Informers;

/// What the controllers of one cluster are given at start.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// What the root-CA publisher publishes (`kube-root-ca.crt`).
    pub root_ca_pem: String,
    /// The CA `csrsigning` signs approved requests with; without it the signer does not run.
    pub cluster_signing: Option<certificates::ClusterSigning>,
}

/// Whether a cluster's controllers have nothing to do until a watch event comes, and nothing
/// time alone would start: no cache changed for `quiet`, no work queue holds a key (not even
/// one due later), no cached object is being deleted, and the cluster has none of the kinds
/// whose controllers act on the clock rather than on events — Nodes (heartbeats that stop),
/// Pods (scheduling retries, grace periods, evictions), Jobs and CronJobs (deadlines,
/// schedules), HorizontalPodAutoscalers (a sync every 15 s), volumes and claims (binding
/// retries) and certificate requests. Such a cluster's loops can stop and start again on the
/// next write, as they would on another replica after a failover: every controller starts
/// from a list.
pub fn idle(
    informers: &Informers,
    queues: &workqueue::ClusterQueues,
    quiet: std::time::Duration,
) -> bool {
    use k8s_openapi::api::{autoscaling, batch, certificates, core};
    fn none<K: informers::Cacheable>(informers: &Informers) -> bool {
        informers.get::<K>().list().is_empty()
    }
    informers.quiet_for() >= quiet
        && !informers.holds_terminating()
        && queues.all_empty()
        && none::<core::v1::Node>(informers)
        && none::<core::v1::Pod>(informers)
        && none::<batch::v1::Job>(informers)
        && none::<batch::v1::CronJob>(informers)
        && none::<autoscaling::v2::HorizontalPodAutoscaler>(informers)
        && none::<core::v1::PersistentVolumeClaim>(informers)
        && none::<core::v1::PersistentVolume>(informers)
        && none::<certificates::v1::CertificateSigningRequest>(informers)
        // The namespace controller watches on its own; its draining of a terminating
        // namespace is told by this cache's deletion count.
        && informers.get::<core::v1::Namespace>().is_ready()
}

/// Runs every controller of one cluster until the task is aborted: aborting drops every loop
/// and watch, since they are joined here rather than spawned.
pub async fn run(client: kube::Client, config: Config) {
    run_with(Informers::new(client), config).await;
}

/// [`run`] on caches the caller shares with others of the same cluster (the hosted service
/// feeds the scheduler from them: [`informers::Informer::events`]).
pub async fn run_with(informers: Arc<Informers>, config: Config) {
    let Config {
        root_ca_pem,
        cluster_signing,
    } = config;
    let client = informers.client().clone();
    let mut controllers: Vec<BoxFuture<'static, ()>> = vec![
        namespace::run(client, root_ca_pem).boxed(),
        replicaset::run(informers.clone()).boxed(),
        deployment::run(informers.clone()).boxed(),
        endpoints::run(informers.clone()).boxed(),
        gc::run(informers.clone()).boxed(),
        disruption::run(informers.clone()).boxed(),
        pvbinder::run(informers.clone()).boxed(),
        resourcequota::run(informers.clone()).boxed(),
        storageprotection::run(informers.clone()).boxed(),
        nodelifecycle::run(informers.clone(), nodelifecycle::Config::default()).boxed(),
        job::run(informers.clone()).boxed(),
        cronjob::run(informers.clone()).boxed(),
        statefulset::run(informers.clone()).boxed(),
        daemonset::run(informers.clone()).boxed(),
        certificates::run_approver(informers.clone()).boxed(),
        podautoscaler::run(informers.clone()).boxed(),
    ];
    if let Some(ca) = cluster_signing {
        controllers.push(certificates::run_signer(informers.clone(), ca).boxed());
    }
    futures::future::join_all(controllers).await;
}
