//! Where each cluster's control loops run when several replicas serve one etcd: the replica
//! holding the cluster's `kube-system/kube-controller-manager` Lease (upstream's leader
//! election record, so `kubectl -n kube-system get lease` shows the holder). Every replica
//! renews the leases it holds and takes over expired ones, so a dead replica's clusters move
//! within one lease duration.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use flotilla_apiserver::ApiServer;
use flotilla_apiserver::authn::UserInfo;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio::task::JoinHandle;

/// The Lease of a cluster's control loops (upstream kube-controller-manager's name).
const LEASE_NAME: &str = "kube-controller-manager";
const LEASE_NAMESPACE: &str = "kube-system";
/// Clusters whose leases are looked at concurrently in one pass.
const CONCURRENT_LEASES: usize = 16;

/// How this replica takes part.
#[derive(Clone)]
pub struct PlacementConfig {
    /// This replica's identity in the leases (unique among replicas).
    pub identity: String,
    /// How long a lease holds without renewal (upstream's default: 15 s).
    pub lease_duration: Duration,
    /// How often held leases are renewed and free ones tried (upstream retries every 2 s).
    pub retry_period: Duration,
    /// What the root-CA publisher publishes.
    pub root_ca_pem: String,
    /// The management records the cloud controllers work from (clusters with a cloud).
    pub management: Arc<flotilla_management::Management>,
    /// How long a node pool's instance may run without its Node.
    pub node_join_timeout: Duration,
}

/// Who the control loops act as: the controller manager, with the masters' group so every
/// loop may do its work (upstream gives each controller its own narrower account).
fn controller_user() -> UserInfo {
    UserInfo::new(
        "system:kube-controller-manager",
        &["system:masters", "system:authenticated"],
    )
}

/// Runs placement until the task is aborted.
pub fn spawn(server: Arc<ApiServer>, router: Router, config: PlacementConfig) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut running: HashMap<String, JoinHandle<()>> = HashMap::new();
        let mut ticker = tokio::time::interval(config.retry_period);
        loop {
            ticker.tick().await;
            let ids = match server.tenants.ids().await {
                Ok(ids) => ids,
                Err(err) => {
                    tracing::warn!(err = %err.message, "listing clusters for placement failed");
                    continue;
                }
            };
            let outcomes: Vec<(String, bool)> = futures::stream::iter(ids)
                .map(|id| {
                    let client = crate::inprocess::client(router.clone(), &id, controller_user());
                    let config = &config;
                    async move {
                        let held = match hold(&client, config).await {
                            Ok(held) => held,
                            Err(err) => {
                                tracing::debug!(cluster = %id, %err, "lease not held");
                                false
                            }
                        };
                        (id, held)
                    }
                })
                .buffer_unordered(CONCURRENT_LEASES)
                .collect()
                .await;
            let mut held_now = Vec::new();
            for (id, held) in outcomes {
                if held {
                    held_now.push(id.clone());
                    if running.contains_key(&id) {
                        continue;
                    }
                    // The cluster's own client CA signs its nodes' certificates, as the
                    // kube-controller-manager's --cluster-signing-cert-file does upstream.
                    let cluster_signing = server.tenants.get(&id).await.map(|tenant| {
                        flotilla_controller_manager::certificates::ClusterSigning {
                            cert_pem: tenant.record.client_ca.cert_pem.clone(),
                            key_pem: tenant.record.client_ca.key_pem.clone(),
                            max_duration:
                                flotilla_controller_manager::certificates::DEFAULT_MAX_DURATION,
                        }
                    });
                    tracing::info!(cluster = %id, replica = %config.identity, "running the cluster's control loops");
                    let client = crate::inprocess::client(router.clone(), &id, controller_user());
                    let controllers = flotilla_controller_manager::Config {
                        root_ca_pem: config.root_ca_pem.clone(),
                        cluster_signing,
                    };
                    let cloud = crate::cloud::hosted(
                        client.clone(),
                        config.management.clone(),
                        id.clone(),
                        config.node_join_timeout,
                    );
                    running.insert(
                        id.clone(),
                        tokio::spawn(cluster_loops(client, controllers, cloud)),
                    );
                }
            }
            running.retain(|id, task| {
                let keep = held_now.contains(id);
                if !keep {
                    tracing::info!(cluster = %id, "control loops stopped: lease lost or cluster gone");
                    task.abort();
                }
                keep
            });
        }
    })
}

/// Upstream's `tryAcquireOrRenew` on the cluster's Lease: `true` when this replica holds it.
async fn hold(client: &kube::Client, config: &PlacementConfig) -> Result<bool, kube::Error> {
    hold_lease(client, LEASE_NAME, &config.identity, config.lease_duration).await
}

/// Upstream's `tryAcquireOrRenew` on `kube-system/{name}` for `identity`: `true` when held.
pub async fn hold_lease(
    client: &kube::Client,
    name: &str,
    identity: &str,
    lease_duration: Duration,
) -> Result<bool, kube::Error> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let duration_seconds = i32::try_from(lease_duration.as_secs()).unwrap_or(i32::MAX);
    let Some(mut lease) = leases.get_opt(name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(identity.to_string()),
                lease_duration_seconds: Some(duration_seconds),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        return conflict_is_loss(leases.create(&PostParams::default(), &lease).await);
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    let mine = spec.holder_identity.as_deref() == Some(identity);
    let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
        (Some(renewed), Some(seconds)) => {
            let expires = renewed.0.as_millisecond() + i64::from(seconds) * 1000;
            now.0.as_millisecond() > expires
        }
        _ => true,
    };
    if !mine && !expired {
        return Ok(false);
    }
    if !mine {
        spec.holder_identity = Some(identity.to_string());
        spec.acquire_time = Some(now.clone());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.lease_duration_seconds = Some(duration_seconds);
    spec.renew_time = Some(now);
    // The replace carries the resourceVersion read: a replica that wrote in between wins.
    conflict_is_loss(leases.replace(name, &PostParams::default(), &lease).await)
}

fn conflict_is_loss(outcome: Result<Lease, kube::Error>) -> Result<bool, kube::Error> {
    match outcome {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(err) => Err(err),
    }
}

/// Everything that runs per cluster on the replica holding its lease: the controllers, the
/// scheduler and the cloud controllers, joined so that aborting the task stops them all.
async fn cluster_loops(
    client: kube::Client,
    controllers: flotilla_controller_manager::Config,
    cloud: impl std::future::Future<Output = ()>,
) {
    futures::future::join3(
        flotilla_controller_manager::run(client.clone(), controllers),
        flotilla_scheduler::run(client),
        cloud,
    )
    .await;
}
