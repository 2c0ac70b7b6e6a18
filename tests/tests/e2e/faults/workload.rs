//! The fault suite's workload: kube-rs clients across tenants and replicas creating,
//! updating (with `resourceVersion` preconditions), applying (server-side) and deleting
//! ConfigMaps, reading each write back through another replica, listing in pages, bumping a
//! shared counter by compare-and-swap, and watching from every replica with resumption —
//! everything recorded with its times for the checker.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent,
    WatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::checker::{self, Counter, Epoch, Outcome, Read, Write};

const NAMESPACE: &str = "default";
/// Every ConfigMap the workload writes carries it; the watches select on it.
const LABEL: &str = "fault-suite";
const COUNTER: &str = "counter";
/// How long an operation may take before its answer counts as lost.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(3);

/// One tenant cluster as the workload sees it: a client per replica.
pub struct Tenant {
    pub name: String,
    pub clients: Vec<kube::Client>,
    pub watch_clients: Vec<kube::Client>,
}

impl Tenant {
    /// Clients for `kubeconfig`'s cluster through each of `replica_urls`.
    pub async fn connect(
        name: &str,
        kubeconfig: &Path,
        replica_urls: &[String],
    ) -> anyhow::Result<Tenant> {
        let mut clients = Vec::new();
        let mut watch_clients = Vec::new();
        for url in replica_urls {
            clients.push(client_via(kubeconfig, url, Some(OPERATION_TIMEOUT)).await?);
            // A watch is quiet while nothing changes; past this it is resumed, as a client
            // that stops hearing from its server does.
            watch_clients.push(client_via(kubeconfig, url, Some(Duration::from_secs(8))).await?);
        }
        Ok(Tenant {
            name: name.to_string(),
            clients,
            watch_clients,
        })
    }
}

async fn client_via(
    kubeconfig: &Path,
    url: &str,
    read_timeout: Option<Duration>,
) -> anyhow::Result<kube::Client> {
    let mut config = Kubeconfig::read_from(kubeconfig)?;
    for named in &mut config.clusters {
        if let Some(cluster) = named.cluster.as_mut() {
            let server = cluster.server.clone().unwrap_or_default();
            let path = server
                .find("/clusters/")
                .map(|at| server[at..].to_string())
                .unwrap_or_default();
            cluster.server = Some(format!("{url}{path}"));
        }
    }
    let mut config =
        kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default()).await?;
    config.connect_timeout = Some(Duration::from_secs(1));
    config.read_timeout = read_timeout;
    config.write_timeout = Some(OPERATION_TIMEOUT);
    // kube-rs retries a 429, 503 or 504 by default, writes included: a write whose first
    // attempt was applied but answered 504 (etcd too slow to confirm it) comes back as the
    // retry's 409, a refusal of something that happened. Each attempt is this workload's to
    // record.
    config.default_retry = false;
    Ok(kube::Client::try_from(config)?)
}

/// Everything recorded, shared by the tasks.
#[derive(Default)]
pub struct Recorder {
    pub writes: Vec<Write>,
    pub reads: Vec<Read>,
    pub watchers: Vec<checker::Watcher>,
    pub counters: BTreeMap<String, Counter>,
    /// Every operation: (invoked ms, latency ms, answered).
    pub operations: Vec<(f64, f64, bool)>,
    /// Every probe: (ms, tenant, replica, answered).
    pub probes: Vec<(f64, String, usize, bool)>,
    /// GETs answered 404 about something other than their object (the whole cluster "not
    /// found" while the store was away): (ms, the Status's message). The service's mistake.
    pub stray_not_found: Vec<(f64, String)>,
    /// Paginated lists listed again at their revision: (compared, not answered — e.g. 410
    /// after a compaction).
    pub exact_lists: (usize, usize),
}

/// The clock and the record the tasks share.
#[derive(Clone)]
pub struct Shared {
    pub start: Instant,
    pub record: Arc<Mutex<Recorder>>,
    pub stop: Arc<AtomicBool>,
    /// The clients' rounds so far, all together (the workload's rate).
    pub rounds: Arc<AtomicU64>,
    /// The least time a client's round takes, in µs (0: as fast as answers come).
    pub pace_micros: Arc<AtomicU64>,
}

impl Shared {
    pub fn new() -> Shared {
        Shared {
            start: Instant::now(),
            record: Arc::new(Mutex::new(Recorder::default())),
            stop: Arc::new(AtomicBool::new(false)),
            rounds: Arc::new(AtomicU64::new(0)),
            pace_micros: Arc::new(AtomicU64::new(0)),
        }
    }

    pub fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * 1000.0
    }

    fn record(&self, f: impl FnOnce(&mut Recorder)) {
        if let Ok(mut record) = self.record.lock() {
            f(&mut record);
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// What an answer says about whether the operation happened.
fn outcome_of<T>(result: &Result<T, kube::Error>) -> Outcome {
    let Err(error) = result else {
        return Outcome::Ok;
    };
    match error {
        // Refusals the server made before writing anything.
        kube::Error::Api(status) if matches!(status.code, 400..=499) => Outcome::Failed,
        // A 5xx (a timeout, an unavailable store) or a lost connection: it may have happened.
        _ => Outcome::Unknown,
    }
}

/// What a client believes of one of its keys.
#[derive(Clone, Copy)]
enum Known {
    Absent,
    Present { resource_version: u64 },
    Unsure,
}

fn key_name(tenant: &str, client: usize, key: usize) -> String {
    format!("{tenant}-c{client}-k{key}")
}

fn config_map(name: &str, seq: u64, resource_version: Option<u64>) -> ConfigMap {
    let mut map = ConfigMap::default();
    map.metadata.name = Some(name.to_string());
    map.metadata.labels = Some(BTreeMap::from([(LABEL.to_string(), "true".to_string())]));
    map.metadata.resource_version = resource_version.map(|rv| rv.to_string());
    map.data = Some(BTreeMap::from([("seq".to_string(), seq.to_string())]));
    map
}

fn seq_of(map: &ConfigMap) -> Option<u64> {
    map.data.as_ref()?.get("seq")?.parse().ok()
}

fn resource_version_of(map: &ConfigMap) -> u64 {
    map.metadata
        .resource_version
        .as_deref()
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0)
}

/// One client: `keys` ConfigMaps of its own written one operation at a time, each write read
/// back through another replica, a paginated list now and then, and increments of the shared
/// counter.
pub async fn run_client(
    shared: Shared,
    tenant: Arc<Tenant>,
    client: usize,
    keys: usize,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut known = vec![Known::Absent; keys];
    let mut seq = 0_u64;
    let replicas = tenant.clients.len();
    let mut round = 0_u64;
    // A replica that failed the last operation is avoided for the next, as a client behind a
    // load balancer is moved to a healthy one.
    let mut avoid: Option<usize> = None;
    while !shared.stopped() {
        round += 1;
        let round_started = Instant::now();
        shared.rounds.fetch_add(1, Ordering::Relaxed);
        let key = rng.random_range(0..keys);
        let name = key_name(&tenant.name, client, key);
        let via = match avoid.take() {
            Some(failed) if replicas > 1 => (failed + rng.random_range(1..replicas)) % replicas,
            _ => rng.random_range(0..replicas),
        };
        let api: Api<ConfigMap> = Api::namespaced(tenant.clients[via].clone(), NAMESPACE);
        if matches!(known[key], Known::Unsure) {
            known[key] = read(&shared, &api, &name, "get after an unanswered write")
                .await
                .map_or(Known::Unsure, |m| match m {
                    Some(map) => Known::Present {
                        resource_version: resource_version_of(&map),
                    },
                    None => Known::Absent,
                });
            continue;
        }
        seq += 1;
        let invoked = shared.now();
        let mut what = "create";
        let (present, result) = match known[key] {
            Known::Absent => (
                true,
                timed(api.create(&PostParams::default(), &config_map(&name, seq, None))).await,
            ),
            Known::Present { resource_version } => match rng.random_range(0..10) {
                0..=5 => {
                    what = "update";
                    let replaced = timed(api.replace(
                        &name,
                        &PostParams::default(),
                        &config_map(&name, seq, Some(resource_version)),
                    ))
                    .await;
                    (true, replaced)
                }
                6..=7 => {
                    what = "apply";
                    let applied = config_map(&name, seq, Some(resource_version));
                    (
                        true,
                        timed(api.patch(
                            &name,
                            &PatchParams::apply(&format!("fault-c{client}")).force(),
                            &Patch::Apply(serde_json::json!({
                                "apiVersion": "v1",
                                "kind": "ConfigMap",
                                "metadata": applied.metadata,
                                "data": applied.data,
                            })),
                        ))
                        .await,
                    )
                }
                _ => {
                    what = "delete";
                    let params = DeleteParams {
                        preconditions: Some(Preconditions {
                            resource_version: Some(resource_version.to_string()),
                            uid: None,
                        }),
                        ..DeleteParams::default()
                    };
                    let deleted = timed(api.delete(&name, &params)).await;
                    (false, deleted.map(|_| ConfigMap::default()))
                }
            },
            Known::Unsure => continue,
        };
        let completed = shared.now();
        let outcome = outcome_of(&result);
        shared.record(|r| {
            r.writes.push(Write {
                key: name.clone(),
                seq,
                present,
                invoked,
                completed,
                outcome,
                what: match &result {
                    Err(kube::Error::Api(status)) => {
                        format!("{what} via r{via} ({} {})", status.code, status.message)
                    }
                    Err(error) => format!("{what} via r{via} ({error})"),
                    _ => format!("{what} via r{via}"),
                },
                resource_version: result
                    .as_ref()
                    .ok()
                    .filter(|_| present)
                    .map(resource_version_of),
            });
            r.operations
                .push((invoked, completed - invoked, outcome != Outcome::Unknown));
        });
        known[key] = match (&result, present) {
            (Ok(map), true) => Known::Present {
                resource_version: resource_version_of(map),
            },
            (Ok(_), false) => Known::Absent,
            // A refusal says the client's belief was wrong (409) or the server was busy: ask.
            (Err(_), _) => Known::Unsure,
        };
        if outcome == Outcome::Unknown {
            avoid = Some(via);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if outcome == Outcome::Ok {
            // Read the write back through another replica: a linearizable read sees it.
            let other = (via + 1 + rng.random_range(0..replicas.max(2) - 1)) % replicas;
            let api: Api<ConfigMap> = Api::namespaced(tenant.clients[other].clone(), NAMESPACE);
            let _ = read(&shared, &api, &name, "get after an acknowledged write").await;
        }
        if round.is_multiple_of(8) {
            // Listed again at its revision through another replica: the same snapshot.
            let other = (via + 1) % replicas;
            let again: Api<ConfigMap> = Api::namespaced(tenant.clients[other].clone(), NAMESPACE);
            list_in_pages(&shared, &api, &again, &tenant.name).await;
        }
        if round.is_multiple_of(4) {
            increment(&shared, &api, &tenant.name).await;
        }
        // Paced (the soak), a round takes at least its share of the rate asked for.
        let pace = Duration::from_micros(shared.pace_micros.load(Ordering::Relaxed));
        let rest = pace.saturating_sub(round_started.elapsed());
        tokio::time::sleep(rest.max(Duration::from_millis(5))).await;
    }
}

async fn timed<T>(
    call: impl std::future::Future<Output = kube::Result<T>>,
) -> Result<T, kube::Error> {
    match tokio::time::timeout(OPERATION_TIMEOUT, call).await {
        Ok(result) => result,
        Err(_) => Err(kube::Error::Service(
            "the operation timed out in the client".into(),
        )),
    }
}

/// GETs `name` and records the read; `None` when it answered 404, an error when it did not
/// answer.
async fn read(
    shared: &Shared,
    api: &Api<ConfigMap>,
    name: &str,
    what: &str,
) -> anyhow::Result<Option<ConfigMap>> {
    let invoked = shared.now();
    let answer = timed(api.get(name)).await;
    if let Err(kube::Error::Api(status)) = &answer
        && status.code == 404
        && !about(status, name)
    {
        let message = status.message.clone();
        shared.record(|r| r.stray_not_found.push((invoked, message)));
    }
    let result = object_or_absent(answer, name);
    let completed = shared.now();
    shared.record(|r| {
        r.operations
            .push((invoked, completed - invoked, result.is_ok()))
    });
    let map = result?;
    let observed = match &map {
        Some(map) => Some(seq_of(map).context("a ConfigMap without its seq")?),
        None => None,
    };
    shared.record(|r| {
        r.reads.push(Read {
            key: name.to_string(),
            observed,
            invoked,
            completed,
            fin: false,
            what: what.to_string(),
        })
    });
    Ok(map)
}

/// Whether an error `Status` is about object `name` (its details name it), not the path or
/// the cluster.
fn about(status: &kube::core::Status, name: &str) -> bool {
    status.details.as_ref().is_some_and(|d| d.name == name)
}

/// A GET's answer: the object, or `None` for a 404 about this very object. Any other 404
/// (the cluster not found, a path not served) says nothing about the object: an error.
fn object_or_absent(
    result: Result<ConfigMap, kube::Error>,
    name: &str,
) -> anyhow::Result<Option<ConfigMap>> {
    match result {
        Ok(map) => Ok(Some(map)),
        Err(kube::Error::Api(status)) if status.code == 404 && about(&status, name) => Ok(None),
        Err(kube::Error::Api(status)) if status.code == 404 => {
            // Not an answer about the object: shown, as it may be the service's mistake.
            println!("fault suite: GET {name} answered a 404 not about it: {status:?}");
            Err(kube::Error::Api(status).into())
        }
        Err(error) => Err(error.into()),
    }
}

/// Lists the tenant's ConfigMaps five at a time; each of the tenant's keys is then a read over
/// the whole list's time (a list is one snapshot: a continue token keeps its revision). Then
/// lists them through `again` at that revision (`resourceVersionMatch=Exact`): the history at
/// one revision is one set of values, whoever reads it and when.
async fn list_in_pages(
    shared: &Shared,
    api: &Api<ConfigMap>,
    again: &Api<ConfigMap>,
    tenant: &str,
) {
    let invoked = shared.now();
    let Ok((seen, revision)) = paged(shared, api, ListParams::default(), invoked).await else {
        return;
    };
    let completed = shared.now();
    let prefix = format!("{tenant}-c");
    shared.record(|r| {
        r.operations.push((invoked, completed - invoked, true));
        // Every key this tenant's clients ever wrote: absent ones are reads of absence.
        for key in keys_written(r, &prefix) {
            let observed = seen.get(&key).copied().flatten();
            r.reads.push(Read {
                key,
                observed,
                invoked,
                completed,
                fin: false,
                what: "a paginated list".to_string(),
            });
        }
    });

    let at = ListParams::default()
        .at(&revision)
        .matching(kube::api::VersionMatch::Exact);
    let invoked = shared.now();
    // A revision compacted away answers 410, as upstream: nothing to compare.
    let Ok((listed_again, _)) = paged(shared, again, at, invoked).await else {
        shared.record(|r| r.exact_lists.1 += 1);
        return;
    };
    shared.record(|r| r.exact_lists.0 += 1);
    if listed_again != seen {
        let differing: std::collections::BTreeSet<&String> = seen
            .keys()
            .chain(listed_again.keys())
            .filter(|key| seen.get(*key) != listed_again.get(*key))
            .collect();
        println!(
            "fault suite: the list at revision {revision} differs when listed again there: {differing:?}"
        );
        // Recorded as reads of a value no write made: the checker reports them as stale.
        shared.record(|r| {
            for key in differing {
                r.reads.push(Read {
                    key: key.clone(),
                    observed: Some(u64::MAX),
                    invoked,
                    completed: shared.now(),
                    fin: false,
                    what: format!("a list at revision {revision} (Exact), unlike the list then"),
                });
            }
        });
    }
}

/// The labelled ConfigMaps, five a page, as `params` selects them: each one's `seq` by name,
/// and the list's revision. A failed page is recorded as a failed operation.
async fn paged(
    shared: &Shared,
    api: &Api<ConfigMap>,
    params: ListParams,
    invoked: f64,
) -> Result<(BTreeMap<String, Option<u64>>, String), ()> {
    let mut seen: BTreeMap<String, Option<u64>> = BTreeMap::new();
    let mut params = params.labels(LABEL).limit(5);
    let mut revision = None;
    loop {
        let page = match timed(api.list(&params)).await {
            Ok(page) => page,
            Err(_) => {
                let completed = shared.now();
                shared.record(|r| r.operations.push((invoked, completed - invoked, false)));
                return Err(());
            }
        };
        revision.get_or_insert(page.metadata.resource_version.clone().unwrap_or_default());
        for map in &page.items {
            let name = map.metadata.name.clone().unwrap_or_default();
            if seen.insert(name.clone(), seq_of(map)).is_some() {
                shared.record(|r| {
                    r.reads.push(Read {
                        key: name.clone(),
                        observed: Some(u64::MAX),
                        invoked,
                        completed: shared.now(),
                        fin: false,
                        what: "a paginated list (listed twice)".to_string(),
                    })
                });
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            // A continue token carries the revision; the first page's settles it.
            Some(token) => {
                params = params.continue_token(&token);
                params.resource_version = None;
                params.version_match = None;
            }
            None => break,
        }
    }
    Ok((seen, revision.unwrap_or_default()))
}

/// Every key starting with `prefix` that a write was recorded for, once each, in order.
fn keys_written(record: &Recorder, prefix: &str) -> Vec<String> {
    record
        .writes
        .iter()
        .filter(|w| w.key.starts_with(prefix))
        .map(|w| w.key.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// One compare-and-swap increment of the tenant's counter.
async fn increment(shared: &Shared, api: &Api<ConfigMap>, tenant: &str) {
    let name = format!("{tenant}-{COUNTER}");
    let invoked = shared.now();
    let current = match timed(api.get_opt(&name)).await {
        Ok(current) => current,
        Err(_) => return,
    };
    let (value, resource_version) = current
        .as_ref()
        .map(|map| (seq_of(map).unwrap_or(0), Some(resource_version_of(map))))
        .unwrap_or((0, None));
    let mut next = config_map(&name, value + 1, resource_version);
    next.metadata.labels = None;
    let result = match resource_version {
        Some(_) => timed(api.replace(&name, &PostParams::default(), &next)).await,
        None => timed(api.create(&PostParams::default(), &next)).await,
    };
    let completed = shared.now();
    let outcome = outcome_of(&result);
    shared.record(|r| {
        r.operations
            .push((invoked, completed - invoked, outcome != Outcome::Unknown));
        let counter = r.counters.entry(name).or_default();
        match outcome {
            Outcome::Ok => counter.acknowledged += 1,
            Outcome::Unknown => counter.unknown += 1,
            Outcome::Failed => {}
        }
    });
}

/// A watcher of the tenant's keys through one replica: lists, then watches from the list's
/// `resourceVersion`, resuming from the last one seen whenever the stream ends or fails, and
/// listing again after `410 Gone`.
pub async fn run_watcher(shared: Shared, tenant: Arc<Tenant>, replica: usize) {
    let name = format!("{} via replica {replica}", tenant.name);
    let api: Api<ConfigMap> = Api::namespaced(tenant.watch_clients[replica].clone(), NAMESPACE);
    let mut watcher = checker::Watcher {
        name,
        prefix: format!("{}-c", tenant.name),
        epochs: Vec::new(),
    };
    let mut resource_version: Option<String> = None;
    while !shared.stopped() {
        let Some(from) = resource_version.clone() else {
            match api.list(&ListParams::default().labels(LABEL)).await {
                Ok(list) => {
                    let listed = list
                        .items
                        .iter()
                        .filter_map(|m| Some((m.metadata.name.clone()?, seq_of(m)?)))
                        .collect();
                    let at = list.metadata.resource_version.clone().unwrap_or_default();
                    watcher.epochs.push(Epoch {
                        list_resource_version: at.parse().unwrap_or(0),
                        listed,
                        events: Vec::new(),
                        resumes: Vec::new(),
                    });
                    resource_version = Some(at);
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
            continue;
        };
        if let Some(epoch) = watcher.epochs.last_mut() {
            let resumed = (epoch.events.len(), from.parse().unwrap_or(0));
            if !epoch.resumes.is_empty() || !epoch.events.is_empty() {
                epoch.resumes.push(resumed);
            }
        }
        let params = WatchParams::default().labels(LABEL).timeout(30);
        let mut stream = match api.watch(&params, &from).await {
            Ok(stream) => stream.boxed(),
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        while let Some(event) = tokio::select! {
            event = stream.next() => event,
            _ = wait_for_stop(&shared) => None,
        } {
            let (map, deleted) = match event {
                Ok(WatchEvent::Added(map)) | Ok(WatchEvent::Modified(map)) => (map, false),
                Ok(WatchEvent::Deleted(map)) => (map, true),
                Ok(WatchEvent::Bookmark(bookmark)) => {
                    resource_version = Some(bookmark.metadata.resource_version);
                    continue;
                }
                Ok(WatchEvent::Error(status)) if status.code == 410 => {
                    resource_version = None;
                    break;
                }
                Ok(WatchEvent::Error(_)) | Err(_) => break,
            };
            let at = resource_version_of(&map);
            if let (Some(key), Some(seq), Some(epoch)) = (
                map.metadata.name.clone(),
                seq_of(&map),
                watcher.epochs.last_mut(),
            ) {
                epoch.events.push(checker::WatchEvent {
                    key,
                    seq,
                    deleted,
                    resource_version: at,
                });
            }
            resource_version = Some(at.to_string());
        }
    }
    shared.record(|r| r.watchers.push(watcher));
}

async fn wait_for_stop(shared: &Shared) {
    while !shared.stopped() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Asks every tenant through every replica for one object every 100 ms: when each answers.
pub async fn run_probes(shared: Shared, tenants: Vec<Arc<Tenant>>) {
    while !shared.stopped() {
        let mut probes = Vec::new();
        for tenant in &tenants {
            for (replica, client) in tenant.clients.iter().enumerate() {
                let api: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
                let (shared, tenant) = (shared.clone(), tenant.name.clone());
                probes.push(async move {
                    let at = shared.now();
                    let answered = matches!(
                        tokio::time::timeout(
                            Duration::from_secs(1),
                            api.get_opt("kube-root-ca.crt")
                        )
                        .await,
                        Ok(Ok(_))
                    );
                    shared.record(|r| r.probes.push((at, tenant, replica, answered)));
                });
            }
        }
        futures::future::join_all(probes).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// After the faults: the final value of every key and counter, read until each answers.
pub async fn read_final(shared: &Shared, tenant: &Tenant) -> anyhow::Result<()> {
    let api: Api<ConfigMap> = Api::namespaced(tenant.clients[0].clone(), NAMESPACE);
    let prefix = format!("{}-c", tenant.name);
    let keys: Vec<String> = {
        let record = shared
            .record
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?;
        keys_written(&record, &prefix)
    };
    for key in keys {
        let invoked = shared.now();
        let map = read_until_answered(&api, &key).await?;
        let completed = shared.now();
        let observed = map.as_ref().and_then(seq_of);
        shared.record(|r| {
            r.reads.push(Read {
                key: key.clone(),
                observed,
                invoked,
                completed,
                fin: true,
                what: "the final read".to_string(),
            })
        });
    }
    let counter = format!("{}-{COUNTER}", tenant.name);
    let value = read_until_answered(&api, &counter)
        .await?
        .as_ref()
        .and_then(seq_of)
        .unwrap_or(0);
    shared.record(|r| r.counters.entry(counter).or_default().final_value = value);
    Ok(())
}

/// GETs `name` until the service answers about it (within 30 s).
async fn read_until_answered(
    api: &Api<ConfigMap>,
    name: &str,
) -> anyhow::Result<Option<ConfigMap>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match object_or_absent(timed(api.get(name)).await, name) {
            Ok(map) => return Ok(map),
            Err(error) if Instant::now() > deadline => {
                anyhow::bail!("the service did not answer within 30 s of healing: {error:?}");
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

async fn retry<T, F: std::future::Future<Output = kube::Result<T>>>(
    call: impl Fn() -> F,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match timed(call()).await {
            Ok(value) => return Ok(value),
            Err(error) if Instant::now() > deadline => {
                anyhow::bail!("the service did not answer within 30 s of healing: {error:?}");
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The store's state of the workload's keys now, for the watchers to agree with.
pub async fn final_state(tenant: &Tenant) -> anyhow::Result<(BTreeMap<String, Option<u64>>, u64)> {
    let api: Api<ConfigMap> = Api::namespaced(tenant.clients[0].clone(), NAMESPACE);
    let params = ListParams::default().labels(LABEL);
    let list = retry(|| api.list(&params)).await?;
    let state = list
        .items
        .iter()
        .filter_map(|m| Some((m.metadata.name.clone()?, Some(seq_of(m)?))))
        .collect();
    let at = list
        .metadata
        .resource_version
        .and_then(|rv| rv.parse().ok())
        .unwrap_or(0);
    Ok((state, at))
}

/// Seeds per task derived from the run's seed.
pub fn task_seed(seed: u64, task: u64) -> u64 {
    let mut rng = StdRng::seed_from_u64(seed ^ task.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    rng.random()
}
