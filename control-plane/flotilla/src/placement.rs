//! Where each cluster's control loops run when several replicas serve one store. Each
//! replica renews one lease of its own ([`crate::replicas`]); the clusters are assigned to the
//! live replicas by rendezvous hashing, so an idle fleet costs one store write per replica per
//! renewal, not one per cluster. A cluster's `kube-system/kube-controller-manager` Lease
//! (upstream's leader-election record, so `kubectl -n kube-system get lease` shows who runs its
//! loops) is written only on handover: the new owner takes it once the previous holder has
//! released it, or its replica is no longer live, or the holder names an earlier life of a
//! replica — so one cluster's loops never run on two replicas at once.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use flotilla_apiserver::ApiServer;
use flotilla_apiserver::authn::UserInfo;
use flotilla_apiserver::tenants::Tenants;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::replicas::{Member, Membership, owner};

type WatchBatch = Result<flotilla_storage::WatchResponse, flotilla_storage::StorageError>;

/// The Lease of a cluster's control loops (upstream kube-controller-manager's name).
const LEASE_NAME: &str = "kube-controller-manager";
pub(crate) const LEASE_NAMESPACE: &str = "kube-system";
/// Clusters whose leases are taken or released concurrently.
const CONCURRENT_LEASES: usize = 32;

/// How this replica takes part.
#[derive(Clone)]
pub struct PlacementConfig {
    /// This replica's identity (unique among replicas).
    pub identity: String,
    /// How long a replica's lease holds without renewal (upstream's default: 15 s).
    pub lease_duration: Duration,
    /// How often this replica renews its lease and looks at the membership.
    pub retry_period: Duration,
    /// What the root-CA publisher publishes.
    pub root_ca_pem: String,
    /// The management records the cloud controllers work from (clusters with a cloud).
    pub management: Arc<flotilla_management::Management>,
    /// How long a node pool's instance may run without its Node.
    pub node_join_timeout: Duration,
    /// Whether the store admits only this process (the embedded store), so that every other
    /// replica record is an earlier run's and need not be waited out.
    pub sole_replica: bool,
    /// How long a cluster's loops may have nothing to do before they are parked
    /// ([`flotilla_controller_manager::idle`]); `None`: never parked.
    pub park_idle_after: Option<Duration>,
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
        let mut placement = Placement {
            membership: Membership::new(
                config.identity.clone(),
                config.lease_duration,
                config.retry_period,
                config.sole_replica,
            ),
            clusters: Clusters::default(),
            writes: Writes::default(),
            running: HashMap::new(),
            server,
            router,
            config,
        };
        placement.run().await;
    })
}

/// The clusters that exist, followed through a watch of their records rather than listed on
/// every tick (a listing reads every record).
#[derive(Default)]
struct Clusters {
    ids: BTreeSet<String>,
    changes: Option<flotilla_storage::WatchStream>,
}

impl Clusters {
    /// Lists the clusters and starts following changes, when not following already.
    async fn follow(&mut self, server: &ApiServer) {
        if self.changes.is_some() {
            return;
        }
        let storage = server.store().storage();
        let Ok(revision) = storage.current_revision().await else {
            return;
        };
        // Listed after the revision is taken: a cluster created in between is in both.
        let Ok(ids) = server.tenants.ids().await else {
            return;
        };
        match storage.watch(Tenants::RECORDS_PREFIX, revision + 1).await {
            Ok(changes) => {
                self.ids = ids.into_iter().collect();
                self.changes = Some(changes);
            }
            Err(err) => tracing::warn!(%err, "following the clusters for placement"),
        }
    }

    /// Applies one batch of changes, or forgets the watch when it failed.
    fn apply(
        &mut self,
        batch: Option<Result<flotilla_storage::WatchResponse, flotilla_storage::StorageError>>,
    ) {
        let Some(Ok(batch)) = batch else {
            self.changes = None;
            return;
        };
        for event in batch.events {
            let Some(id) = Tenants::record_id(&event.kv.key) else {
                continue;
            };
            match event.kind {
                flotilla_storage::EventKind::Put => self.ids.insert(id.to_string()),
                flotilla_storage::EventKind::Delete => self.ids.remove(id),
            };
        }
    }
}

/// Every write to any cluster's objects, followed so that a parked cluster's loops start
/// again on the first one.
#[derive(Default)]
struct Writes {
    changes: Option<flotilla_storage::WatchStream>,
    /// The revision the watch has delivered everything up to; 0 before the first watch and
    /// after one fell behind the compaction point.
    seen: flotilla_storage::Revision,
}

impl Writes {
    /// Starts following, when not following already: from where the last watch ended, else
    /// from now. `true` when writes may have been missed (a watch started afresh).
    async fn follow(&mut self, server: &ApiServer) -> bool {
        if self.changes.is_some() {
            return false;
        }
        // Beneath encryption at rest: only keys are read, never a value decrypted.
        let storage = server.store().storage().untransformed();
        let (from, afresh) = match self.seen {
            0 => match storage.current_revision().await {
                Ok(current) => (current + 1, true),
                Err(_) => return false,
            },
            seen => (seen + 1, false),
        };
        match storage.watch(CLUSTER_OBJECTS_PREFIX, from).await {
            Ok(changes) => {
                self.changes = Some(changes);
                self.seen = from - 1;
                afresh
            }
            Err(err) => {
                self.failed(&err);
                tracing::warn!(%err, "following writes to wake parked clusters");
                false
            }
        }
    }

    /// The watch ended: the next tick follows again, from where it ended unless that is
    /// compacted away.
    fn failed(&mut self, err: &flotilla_storage::StorageError) {
        self.changes = None;
        if matches!(err, flotilla_storage::StorageError::Compacted { .. }) {
            self.seen = 0;
        }
    }
}

/// Where every cluster's objects are stored: `/registry/{cluster}/…`.
const CLUSTER_OBJECTS_PREFIX: &str = "/registry/";

/// The cluster a stored object's key belongs to.
fn cluster_of(key: &str) -> Option<&str> {
    key.strip_prefix(CLUSTER_OBJECTS_PREFIX)?.split('/').next()
}

/// One cluster whose Lease this replica holds.
struct Hosted {
    /// This replica's generation when it took the Lease: loops started by an earlier life
    /// are stopped, never carried over.
    generation: u64,
    loops: Loops,
}

enum Loops {
    /// Running, and when a write to the cluster was last seen here.
    Running {
        task: JoinHandle<()>,
        last_write: Option<Instant>,
    },
    /// Stopped while idle, the Lease kept: started again on the cluster's next write.
    Parked,
}

struct Placement {
    membership: Membership,
    clusters: Clusters,
    writes: Writes,
    /// The clusters whose Lease this replica holds, their loops running or parked.
    running: HashMap<String, Hosted>,
    server: Arc<ApiServer>,
    router: Router,
    config: PlacementConfig,
}

impl Placement {
    async fn run(&mut self) {
        let mut ticker = tokio::time::interval(self.config.retry_period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut index = self.config.management.cluster_index();
        loop {
            let writes = async {
                match self.writes.changes.as_mut() {
                    Some(changes) => changes.next().await,
                    None => std::future::pending().await,
                }
            };
            let records = async {
                match self.clusters.changes.as_mut() {
                    Some(changes) => changes.next().await,
                    None => std::future::pending().await,
                }
            };
            enum Woken {
                Tick,
                Records(Option<WatchBatch>),
                Writes(Option<WatchBatch>),
                Index,
            }
            let woken = tokio::select! {
                _ = ticker.tick() => Woken::Tick,
                batch = records => Woken::Records(batch),
                batch = writes => Woken::Writes(batch),
                changed = index.changed(), if self.config.park_idle_after.is_some() => {
                    if changed.is_err() {
                        // The management side is gone (shutting down): no more index.
                        index = tokio::sync::watch::channel(Default::default()).1;
                    }
                    Woken::Index
                }
            };
            match woken {
                Woken::Tick => {
                    let storage = self.server.store().storage().clone();
                    if let Err(err) = self.membership.renew_and_observe(&*storage).await {
                        tracing::warn!(%err, "renewing this replica's lease");
                    }
                    self.clusters.follow(&self.server).await;
                    if self.config.park_idle_after.is_some()
                        && self.writes.follow(&self.server).await
                    {
                        // Writes between the last watch and this one were not seen.
                        self.wake(|_| true).await;
                    }
                }
                Woken::Records(batch) => self.clusters.apply(batch),
                Woken::Writes(Some(Ok(batch))) => {
                    self.writes.seen = batch.revision;
                    let now = Instant::now();
                    let mut woken = BTreeSet::new();
                    for event in &batch.events {
                        let Some(hosted) =
                            cluster_of(&event.kv.key).and_then(|id| self.running.get_mut(id))
                        else {
                            continue;
                        };
                        match &mut hosted.loops {
                            Loops::Running { last_write, .. } => *last_write = Some(now),
                            Loops::Parked => {
                                woken.insert(cluster_of(&event.kv.key).unwrap_or_default());
                            }
                        }
                    }
                    let woken: BTreeSet<String> = woken.into_iter().map(String::from).collect();
                    self.wake(|id| woken.contains(id)).await;
                    // Nothing else to place: a busy fleet's writes must not cost a pass over
                    // every cluster each.
                    continue;
                }
                Woken::Writes(Some(Err(err))) => {
                    self.writes.failed(&err);
                    continue;
                }
                Woken::Writes(None) => {
                    self.writes.changes = None;
                    continue;
                }
                Woken::Index => {
                    // A parked cluster given a cloud runs its cloud controllers from now on.
                    let index = index.borrow_and_update().clone();
                    self.wake(|id| index.get(id).is_some_and(|m| m.cluster.has_cloud()))
                        .await;
                    continue;
                }
            }
            self.place().await;
        }
    }

    /// Starts the parked loops of the clusters `which` picks (written to, given a cloud, or
    /// every one when writes may have been missed).
    async fn wake(&mut self, which: impl Fn(&str) -> bool) {
        let parked: Vec<String> = self
            .running
            .iter()
            .filter(|(id, hosted)| matches!(hosted.loops, Loops::Parked) && which(id))
            .map(|(id, _)| id.clone())
            .collect();
        for id in parked {
            tracing::info!(cluster = %id, replica = %self.config.identity, "control loops woken");
            self.start(&id).await;
        }
    }

    /// Parks the loops that ended because they were idle, unless the cluster was written to
    /// since they last looked (the write may not have reached them): those start again.
    async fn park_finished(&mut self) {
        let Some(quiet) = self.config.park_idle_after else {
            return;
        };
        let finished: Vec<(String, bool)> = self
            .running
            .iter()
            .filter_map(|(id, hosted)| match &hosted.loops {
                Loops::Running { task, last_write } if task.is_finished() => Some((
                    id.clone(),
                    last_write.is_some_and(|at| at.elapsed() < quiet),
                )),
                _ => None,
            })
            .collect();
        for (id, written) in finished {
            if written {
                self.start(&id).await;
            } else if let Some(hosted) = self.running.get_mut(&id) {
                hosted.loops = Loops::Parked;
                self.server.tenants.set_loops_parked(&id, true);
                tracing::info!(cluster = %id, replica = %self.config.identity, "control loops parked: the cluster is idle");
            }
        }
    }

    /// Starts the loops of the clusters this replica owns and can take, and stops the
    /// others'.
    async fn place(&mut self) {
        self.park_finished().await;
        let now = Instant::now();
        let live = self.membership.live(now);
        let me = self.membership.me();
        let holding = self.membership.holds_lease(now);
        let mine = |cluster: &str| holding && owner(cluster, &live).is_some_and(|m| *m == me);

        let leaving: Vec<String> = self
            .running
            .iter()
            // A replica that lost its lease (paused, cut off) rejoins with a new generation:
            // meanwhile another may have taken its clusters, so what it ran in its earlier
            // life stops, and runs again only once the Lease is taken afresh.
            .filter(|(id, hosted)| {
                !self.clusters.ids.contains(*id) || !mine(id) || hosted.generation != me.generation
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in &leaving {
            let Some(hosted) = self.running.remove(id) else {
                continue;
            };
            self.server.tenants.set_loops_parked(id, false);
            if let Loops::Running { task, .. } = hosted.loops {
                task.abort();
                // Aborting takes effect at the task's next await: wait for that, so nothing
                // of these loops runs once the Lease is released below.
                let _ = task.await;
            }
            tracing::info!(cluster = %id, replica = %me.identity, "control loops stopped: the cluster moved or is gone");
        }
        // Released only while this replica still holds its lease: otherwise another may
        // already have taken them, and the record is theirs.
        if holding {
            let releases: Vec<BoxFuture<'static, ()>> = leaving
                .iter()
                .filter(|id| self.clusters.ids.contains(*id))
                .map(|id| {
                    let client =
                        crate::inprocess::client(self.router.clone(), id, controller_user());
                    let holder = me.holder();
                    async move {
                        if let Err(err) = release(&client, &holder).await {
                            tracing::debug!(%err, "releasing a cluster's lease");
                        }
                    }
                    .boxed()
                })
                .collect();
            futures::stream::iter(releases)
                .buffer_unordered(CONCURRENT_LEASES)
                .collect::<Vec<()>>()
                .await;
        }

        let wanted: Vec<String> = self
            .clusters
            .ids
            .iter()
            .filter(|id| !self.running.contains_key(*id) && mine(id))
            .cloned()
            .collect();
        let view = Arc::new(self.membership.clone());
        let takes: Vec<BoxFuture<'static, (String, bool)>> = wanted
            .into_iter()
            .map(|id| {
                let client = crate::inprocess::client(self.router.clone(), &id, controller_user());
                let (me, view, lease_duration) =
                    (me.clone(), view.clone(), self.config.lease_duration);
                async move {
                    let taken = take(&client, &me, &view, lease_duration)
                        .await
                        .unwrap_or_else(|err| {
                            tracing::debug!(cluster = %id, %err, "cluster's lease not taken");
                            false
                        });
                    (id, taken)
                }
                .boxed()
            })
            .collect();
        let taken: Vec<(String, bool)> = futures::stream::iter(takes)
            .buffer_unordered(CONCURRENT_LEASES)
            .collect()
            .await;
        for (id, taken) in taken {
            if taken {
                self.start(&id).await;
            }
        }
    }

    async fn start(&mut self, id: &str) {
        // The cluster's own client CA signs its nodes' certificates, as the
        // kube-controller-manager's --cluster-signing-cert-file does upstream.
        // Unreadable now (the store away): not started, so the next pass tries again rather
        // than running loops that could never sign a node's certificate.
        let tenant = match self.server.tenants.get(id).await {
            Ok(Some(tenant)) => tenant,
            Ok(None) => return,
            Err(err) => {
                tracing::warn!(cluster = %id, err = %err.message, "control loops not started: the cluster's record is unreadable");
                return;
            }
        };
        let cluster_signing = Some(flotilla_controller_manager::certificates::ClusterSigning {
            cert_pem: tenant.record.client_ca.cert_pem.clone(),
            key_pem: tenant.record.client_ca.key_pem.clone(),
            max_duration: flotilla_controller_manager::certificates::DEFAULT_MAX_DURATION,
        });
        tracing::info!(cluster = %id, replica = %self.config.identity, "running the cluster's control loops");
        let client = crate::inprocess::client(self.router.clone(), id, controller_user());
        let controllers = flotilla_controller_manager::Config {
            root_ca_pem: self.config.root_ca_pem.clone(),
            cluster_signing,
        };
        let cloud = crate::cloud::hosted(
            client.clone(),
            self.config.management.clone(),
            id.to_string(),
            self.config.node_join_timeout,
        );
        // Parked only while it has no cloud: its controllers watch instances on a timer.
        let parking = self.config.park_idle_after.map(|quiet| Parking {
            quiet,
            has_cloud: {
                let (index, id) = (self.config.management.cluster_index(), id.to_string());
                Box::new(move || {
                    index
                        .borrow()
                        .get(&id)
                        .is_none_or(|managed| managed.cluster.has_cloud())
                })
            },
        });
        self.server.tenants.set_loops_parked(id, false);
        self.running.insert(
            id.to_string(),
            Hosted {
                generation: self.membership.me().generation,
                loops: Loops::Running {
                    task: tokio::spawn(cluster_loops(client, controllers, cloud, parking)),
                    last_write: None,
                },
            },
        );
    }
}

/// Takes the cluster's Lease for `me` when it is absent, already `me`'s, or its holder's
/// claim is free in `view` ([`Membership::is_free`]). `true` when held.
async fn take(
    client: &kube::Client,
    me: &Member,
    view: &Membership,
    lease_duration: Duration,
) -> Result<bool, kube::Error> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let holder = me.holder();
    let duration_seconds = i32::try_from(lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
    let Some(mut lease) = leases.get_opt(LEASE_NAME).await? else {
        let lease = new_lease(LEASE_NAME, &holder, duration_seconds, now);
        return conflict_is_loss(leases.create(&PostParams::default(), &lease).await);
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    let current = spec.holder_identity.clone().unwrap_or_default();
    if current == holder {
        return Ok(true);
    }
    if !view.is_free(&current, Instant::now()) {
        return Ok(false);
    }
    spec.holder_identity = Some(holder);
    spec.acquire_time = Some(now.clone());
    spec.renew_time = Some(now);
    spec.lease_duration_seconds = Some(duration_seconds);
    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    // The replace carries the resourceVersion read: a replica that wrote in between wins.
    conflict_is_loss(
        leases
            .replace(LEASE_NAME, &PostParams::default(), &lease)
            .await,
    )
}

/// Upstream's release of a lease on shutdown: the holder cleared, so the next owner need
/// not wait. Only a Lease `holder` still holds is touched.
async fn release(client: &kube::Client, holder: &str) -> Result<(), kube::Error> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let Some(mut lease) = leases.get_opt(LEASE_NAME).await? else {
        return Ok(());
    };
    let spec = lease.spec.get_or_insert_with(Default::default);
    if spec.holder_identity.as_deref() != Some(holder) {
        return Ok(());
    }
    spec.holder_identity = Some(String::new());
    spec.lease_duration_seconds = Some(1);
    conflict_is_loss(
        leases
            .replace(LEASE_NAME, &PostParams::default(), &lease)
            .await,
    )
    .map(|_| ())
}

/// A Lease first acquired by `holder` now.
pub(crate) fn new_lease(name: &str, holder: &str, duration_seconds: i32, now: MicroTime) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.to_string()),
            lease_duration_seconds: Some(duration_seconds),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(0),
            ..Default::default()
        }),
    }
}

pub(crate) fn conflict_is_loss(outcome: Result<Lease, kube::Error>) -> Result<bool, kube::Error> {
    match outcome {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(err) => Err(err),
    }
}

/// Everything that runs per cluster on the replica holding its lease: the controllers, the
/// scheduler and the cloud controllers, joined so that aborting the task stops them all. The
/// scheduler reads the kinds the controllers cache from their caches: every watch and cache
/// held once less per cluster.
async fn cluster_loops(
    client: kube::Client,
    controllers: flotilla_controller_manager::Config,
    cloud: impl std::future::Future<Output = ()>,
    parking: Option<Parking>,
) {
    let informers = flotilla_controller_manager::informers::Informers::new(client.clone());
    let queues = Arc::new(flotilla_controller_manager::workqueue::ClusterQueues::default());
    let shared = flotilla_scheduler::SharedEvents {
        pods: Some(informers.get().events()),
        nodes: Some(informers.get().events()),
        claims: Some(informers.get().events()),
        volumes: Some(informers.get().events()),
        storage_classes: Some(informers.get().events()),
        budgets: Some(informers.get().events()),
        services: Some(informers.get().events()),
        replica_sets: Some(informers.get().events()),
        stateful_sets: Some(informers.get().events()),
    };
    let loops = queues.clone().scope(futures::future::join3(
        flotilla_controller_manager::run_with(informers.clone(), controllers),
        flotilla_scheduler::run_sharing(client, shared),
        cloud,
    ));
    let Some(parking) = parking else {
        loops.await;
        return;
    };
    // Looked at a few times per quiet period, and only while running: a parked cluster has
    // no timer at all.
    let idle = async {
        let mut look = tokio::time::interval((parking.quiet / 4).max(Duration::from_millis(100)));
        look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            look.tick().await;
            if !(parking.has_cloud)()
                && flotilla_controller_manager::idle(&informers, &queues, parking.quiet)
            {
                return;
            }
        }
    };
    tokio::select! {
        _ = loops => {}
        () = idle => {}
    }
}

/// When a cluster's loops park themselves.
struct Parking {
    /// How long the loops must have had nothing to do.
    quiet: Duration,
    /// Whether the cluster has a cloud now (or is unknown to the management records yet).
    has_cloud: Box<dyn Fn() -> bool + Send + Sync>,
}
