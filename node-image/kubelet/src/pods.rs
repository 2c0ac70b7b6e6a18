//! The pod loop: every pod bound to this node (watched with `spec.nodeName=<node>`) gets a
//! worker (upstream `pod_workers.go`) that drives the runtime toward the spec by level —
//! sandbox, then each container (image check, config, create, start, restart with crash-loop
//! back-off) — and reports the status it sees through `pods/{name}/status`. Deleted pods are
//! stopped with their grace period, their sandboxes removed, then deleted for good (grace 0).
//! All state lives in the runtime (labels and annotations), so a restarted kubelet adopts
//! its sandboxes and containers instead of duplicating them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, Preconditions};
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use tokio::sync::watch;

use crate::cri::{Cri, CriError, call};
use crate::events::Recorder;
use crate::eviction::{EVICTION_GRACE_SECONDS, Eviction, Pressure};
use crate::hooks::{self, KillReason};
use crate::init::{self, InitPlan, InitState};
use crate::node::manager;
use crate::probe::{Observed, is_restartable_init};
use crate::prober::{self, PodProbes, Seen};
use crate::resize;
use crate::resources;
use crate::static_pods::{self, Mirror};
use crate::status::{self, Backoff, ContainerView, RuntimeContainer, RuntimeState};
use crate::translate::{
    self, CONTAINER_NAME_LABEL, EnvSources, ImageDecision, NodeFacts, POD_UID_LABEL,
    RESTART_COUNT_ANNOTATION,
};

/// How often a pod is re-synced while something is still to happen.
const BUSY_RESYNC: Duration = Duration::from_secs(1);
/// How often a steady pod is re-synced; runtime changes wake its worker sooner, through the
/// relist ([`crate::pleg`]). (Upstream re-syncs every minute; the volumes' ConfigMaps and
/// Secrets are re-read on this beat, so it is shorter here.)
const STEADY_RESYNC: Duration = Duration::from_secs(10);

/// What every pod worker shares.
pub struct Kubelet {
    /// The node's API client.
    pub client: kube::Client,
    /// The runtime.
    pub cri: Cri,
    /// The Node's name.
    pub node_name: String,
    /// The node's IP (pods' hostIP).
    pub node_ip: String,
    /// Where pod logs go (`<dir>/<ns>_<name>_<uid>/<container>/<n>.log`).
    pub log_root: String,
    /// Crash-loop back-off, keyed `<uid>/<container>`.
    pub backoff: Mutex<Backoff>,
    /// Pods' volumes under `<root-dir>/pods`.
    pub volumes: crate::volumes::VolumeManager,
    /// Events about the node's pods.
    pub recorder: Arc<Recorder>,
    /// Cluster DNS, the cluster domain and the node's resolvers: pods' resolv.conf.
    pub dns: crate::dns::DnsSettings,
    /// What each pod's containers were admitted and resized to, and what the runtime took.
    pub allocations: crate::resize::Allocations,
    /// The node's memory in bytes (for Burstable containers' OOM score).
    pub memory_capacity: i64,
    /// Node pressure: admission, and the pods the eviction manager evicted.
    pub pressure: Arc<Pressure>,
    /// The runtime relist that wakes workers whose pod changed in the runtime.
    pub pleg: Arc<crate::pleg::Pleg>,
    /// RunPodSandbox calls under way at once, at most one per CPU: more only share the cores
    /// (a sandbox is most of a pod's start: pause container, network namespace, CNI), so when
    /// pods arrive faster than the runtime can start them, all of them finish late. Waiting in
    /// arrival order (the semaphore is fair), each starts as soon as the node can.
    pub sandbox_starts: tokio::sync::Semaphore,
}

/// Watches this node's pods and runs a worker per pod until the watch ends; with a static
/// pod source, runs its pods too and keeps their mirror pods in step.
pub async fn run(
    kubelet: Arc<Kubelet>,
    mut static_pods: Option<watch::Receiver<Vec<Pod>>>,
) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::all(kubelet.client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", kubelet.node_name));
    let mut events = watcher::watcher(pods, config).boxed();
    let mut workers: HashMap<String, watch::Sender<Pod>> = HashMap::new();
    let mut listed: HashSet<String> = HashSet::new();
    let mut statics = StaticWorkers::default();
    // Static pods start before the first list, so the orphan sweep after it adopts them.
    if let Some(source) = static_pods.as_mut() {
        let current = source.borrow_and_update().clone();
        statics.apply(&kubelet, current);
    }
    loop {
        let event = tokio::select! {
            event = events.next() => match event {
                Some(event) => event,
                None => break,
            },
            Some(Ok(())) = async {
                match static_pods.as_mut() {
                    Some(source) => Some(source.changed().await),
                    None => None,
                }
            } => {
                if let Some(source) = static_pods.as_mut() {
                    let current = source.borrow_and_update().clone();
                    statics.apply(&kubelet, current);
                    statics.delete_orphaned_mirrors(&kubelet);
                }
                continue;
            }
        };
        let event = match event {
            Ok(event) => event,
            Err(err) => {
                tracing::debug!(%err, "pod watch failed; retrying");
                continue;
            }
        };
        match event {
            Event::Init => {
                listed.clear();
                statics.mirrors.clear();
            }
            // Mirror pods are the API's view of static pods: never run, only kept in step.
            Event::InitApply(pod) | Event::Apply(pod) if static_pods::is_mirror(&pod) => {
                statics.mirror_seen(&kubelet, pod);
            }
            Event::Delete(pod) if static_pods::is_mirror(&pod) => statics.mirror_gone(&pod),
            Event::InitApply(pod) | Event::Apply(pod) => {
                let Some(uid) = pod.metadata.uid.clone() else {
                    continue;
                };
                listed.insert(uid.clone());
                match workers.get(&uid) {
                    Some(sender) => {
                        let _ = sender.send(pod);
                    }
                    None => {
                        admit(&kubelet, &pod, &uid);
                        let (sender, receiver) = watch::channel(pod);
                        workers.insert(uid, sender);
                        tokio::spawn(worker(kubelet.clone(), receiver));
                    }
                }
            }
            Event::Delete(pod) => {
                // Dropping the sender tells the worker its pod is gone from the API.
                if let Some(uid) = &pod.metadata.uid {
                    workers.remove(uid);
                }
            }
            Event::InitDone => {
                // Pods that vanished while the watch was down get no Delete event.
                workers.retain(|uid, _| listed.contains(uid));
                statics.delete_orphaned_mirrors(&kubelet);
                let known: HashSet<String> = workers
                    .keys()
                    .chain(statics.workers.keys())
                    .cloned()
                    .collect();
                kubelet.allocations.retain(&known);
                match remove_orphans(&kubelet, &known).await {
                    Ok(()) => kubelet.volumes.remove_orphans(&known),
                    Err(err) => tracing::warn!(%err, "removing orphaned sandboxes failed"),
                }
            }
        }
    }
    anyhow::bail!("the pod watch ended")
}

/// Upstream's admission of a pod new to this kubelet (`canAdmitPod`): under node pressure
/// it may be refused, which its worker reports as Failed with reason `Evicted`. Pods that
/// already ran here (a restarted kubelet) are not judged again.
fn admit(kubelet: &Kubelet, pod: &Pod, uid: &str) {
    let status = pod.status.as_ref();
    let pending = status
        .and_then(|s| s.phase.as_deref())
        .is_none_or(|p| p == "Pending");
    let never_ran = status
        .and_then(|s| s.container_statuses.as_ref())
        .is_none_or(|list| {
            list.iter()
                .all(|c| c.state.as_ref().is_none_or(|s| s.waiting.is_some()))
        });
    if !pending || !never_ran || pod.metadata.deletion_timestamp.is_some() {
        return;
    }
    if let Err(message) = kubelet.pressure.admit(pod) {
        tracing::warn!(pod = %static_pods::full_name(pod), %message, "pod refused under node pressure");
        kubelet
            .recorder
            .pod_event(pod, "Warning", "Evicted", &message);
        kubelet.pressure.evict(
            uid,
            Eviction {
                message,
                killed: false,
            },
        );
    }
}

/// The static pods' workers (by static UID) and the mirror pods the API holds (by full name).
#[derive(Default)]
struct StaticWorkers {
    workers: HashMap<String, watch::Sender<Pod>>,
    mirrors: HashMap<String, Pod>,
}

impl StaticWorkers {
    /// Starts workers for new static pods, updates changed ones, and stops removed ones.
    fn apply(&mut self, kubelet: &Arc<Kubelet>, pods: Vec<Pod>) {
        let current: HashSet<String> = pods.iter().filter_map(|p| p.metadata.uid.clone()).collect();
        self.workers.retain(|uid, _| current.contains(uid));
        for pod in pods {
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            match self.workers.get(&uid) {
                Some(sender) => {
                    sender.send_if_modified(|old| {
                        let changed = *old != pod;
                        if changed {
                            *old = pod;
                        }
                        changed
                    });
                }
                None => {
                    tracing::info!(pod = %static_pods::full_name(&pod), %uid, "static pod added");
                    let (sender, receiver) = watch::channel(pod);
                    self.workers.insert(uid, sender);
                    tokio::spawn(worker(kubelet.clone(), receiver));
                }
            }
        }
    }

    /// The static worker of the pod called `full_name`.
    fn worker_named(&self, full_name: &str) -> Option<&watch::Sender<Pod>> {
        self.workers
            .values()
            .find(|sender| static_pods::full_name(&sender.borrow()) == full_name)
    }

    /// A mirror pod appeared or changed: one without a static pod is deleted; one being
    /// deleted or outdated wakes its static pod's worker to replace it.
    fn mirror_seen(&mut self, kubelet: &Arc<Kubelet>, mirror: Pod) {
        let name = static_pods::full_name(&mirror);
        let worker = self.worker_named(&name);
        match worker {
            None => delete_mirror_later(kubelet, mirror.clone()),
            Some(sender) => {
                let current = sender.borrow().metadata.uid.as_deref()
                    == static_pods::mirrored_uid(&mirror)
                    && mirror.metadata.deletion_timestamp.is_none();
                if !current {
                    sender.send_modify(|_| {});
                }
            }
        }
        self.mirrors.insert(name, mirror);
    }

    /// A mirror pod is gone from the API: its static pod's worker creates it again.
    fn mirror_gone(&mut self, mirror: &Pod) {
        let name = static_pods::full_name(mirror);
        self.mirrors.remove(&name);
        if let Some(sender) = self.worker_named(&name) {
            sender.send_modify(|_| {});
        }
    }

    /// Deletes the mirror pods whose static pod is gone (upstream `deleteOrphanedMirrorPods`).
    fn delete_orphaned_mirrors(&self, kubelet: &Arc<Kubelet>) {
        for (name, mirror) in &self.mirrors {
            if self.worker_named(name).is_none() {
                delete_mirror_later(kubelet, mirror.clone());
            }
        }
    }
}

/// Deletes `mirror` in the background (the pod loop never waits on the API).
fn delete_mirror_later(kubelet: &Arc<Kubelet>, mirror: Pod) {
    let client = kubelet.client.clone();
    tokio::spawn(async move {
        if let Err(err) = static_pods::delete_mirror(&client, &mirror).await {
            tracing::warn!(pod = %static_pods::full_name(&mirror), %err, "deleting an orphaned mirror pod failed");
        }
    });
}

/// Removes the sandboxes of pods that are no longer bound here (deleted while the kubelet
/// was down).
async fn remove_orphans(kubelet: &Kubelet, known: &HashSet<String>) -> Result<(), CriError> {
    let mut cri = kubelet.cri.clone();
    for sandbox in cri.sandboxes(None).await? {
        let uid = sandbox
            .labels
            .get(POD_UID_LABEL)
            .cloned()
            .unwrap_or_default();
        if !known.contains(&uid) {
            tracing::info!(pod_uid = %uid, sandbox = %sandbox.id, "removing an orphaned sandbox");
            kill_pod(&mut cri, &uid, 2).await?;
        }
    }
    Ok(())
}

/// One pod's worker: syncs on every change of the pod and after each resync interval;
/// when the pod is gone from the API, makes sure nothing of it runs.
async fn worker(kubelet: Arc<Kubelet>, mut pod: watch::Receiver<Pod>) {
    let mut last_sent: Option<serde_json::Value> = None;
    let first = pod.borrow().clone();
    let uid = first.metadata.uid.clone().unwrap_or_default();
    // Probes run beside the worker and wake it when a result changes.
    let probes = Arc::new(PodProbes::new(&first));
    let has_probes = probes.prober.lock().is_ok_and(|p| !p.is_empty());
    let mut evictions = kubelet.pressure.evicted.subscribe();
    let runtime_changed = kubelet.pleg.register(&uid);
    let probe_task = has_probes.then(|| {
        tokio::spawn(prober::probe_loop(
            kubelet.cri.clone(),
            kubelet.recorder.clone(),
            first.clone(),
            probes.clone(),
        ))
    });
    loop {
        let current = pod.borrow_and_update().clone();
        let wait = match sync_pod(&kubelet, &current, &mut last_sent, &probes).await {
            Ok(wait) => wait,
            Err(err) => {
                tracing::warn!(pod = ?current.metadata.name, %err, "pod sync failed; retrying");
                BUSY_RESYNC * 2
            }
        };
        tokio::select! {
            changed = pod.changed() => if changed.is_err() { break },
            _ = tokio::time::sleep(wait) => {}
            _ = probes.wake_pod.notified() => {}
            _ = evictions.changed() => {}
            _ = runtime_changed.notified() => {}
        }
    }
    kubelet.pleg.unregister(&uid);
    if let Some(task) = probe_task {
        task.abort();
    }
    kubelet.recorder.forget_pod(&uid);
    kubelet.pressure.forget(&uid);
    kubelet.allocations.release(&uid);
    let mut cri = kubelet.cri.clone();
    // A static pod whose manifest went away stops gracefully (preStop, grace period); an
    // API pod already did, when its deletion was seen.
    let last = pod.borrow().clone();
    let stopped = if static_pods::is_static(&last) {
        terminate_pod(&kubelet, &mut cri, &last, &uid).await
    } else {
        kill_pod(&mut cri, &uid, 2).await
    };
    match stopped {
        // Nothing of the pod runs any more: its volumes can go.
        Ok(()) => kubelet.volumes.cleanup(&uid),
        Err(err) => tracing::warn!(pod_uid = %uid, %err, "cleaning up a deleted pod failed"),
    }
    if let Ok(mut backoff) = kubelet.backoff.lock() {
        backoff.forget_prefix(&format!("{uid}/"));
    }
}

/// Stops every container of pod `uid` with `grace` seconds, then stops and removes its
/// sandboxes (upstream `killPodWithSyncResult`).
async fn kill_pod(cri: &mut Cri, uid: &str, grace: i64) -> Result<(), CriError> {
    let running = cri
        .containers(uid)
        .await?
        .into_iter()
        .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32);
    // Containers stop in parallel, each with the whole grace period, as upstream.
    let stops = running.map(|c| {
        let mut cri = cri.clone();
        async move { cri.stop_container(&c.id, grace).await }
    });
    for result in futures::future::join_all(stops).await {
        result?;
    }
    for sandbox in cri.sandboxes(Some(uid)).await? {
        cri.remove_sandbox(&sandbox.id).await?;
    }
    Ok(())
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The monotonic instant of a runtime timestamp (ns since the epoch).
fn instant_of(ns: i64) -> Instant {
    let ago = u64::try_from(now_ns().saturating_sub(ns)).unwrap_or(0);
    Instant::now()
        .checked_sub(Duration::from_nanos(ago))
        .unwrap_or_else(Instant::now)
}

fn runtime_container(status: &cri::ContainerStatus) -> RuntimeContainer {
    let state = match cri::ContainerState::try_from(status.state) {
        Ok(cri::ContainerState::ContainerCreated) => RuntimeState::Created,
        Ok(cri::ContainerState::ContainerRunning) => RuntimeState::Running,
        Ok(cri::ContainerState::ContainerExited) => RuntimeState::Exited,
        _ => RuntimeState::Unknown,
    };
    let restart_count = status
        .annotations
        .get(RESTART_COUNT_ANNOTATION)
        .and_then(|n| n.parse().ok())
        .or_else(|| {
            status
                .metadata
                .as_ref()
                .and_then(|m| i32::try_from(m.attempt).ok())
        })
        .unwrap_or(0);
    RuntimeContainer {
        id: status.id.clone(),
        state,
        restart_count,
        started_at: status.started_at,
        finished_at: status.finished_at,
        exit_code: status.exit_code,
        reason: status.reason.clone(),
        message: status.message.clone(),
        image_ref: status.image_ref.clone(),
    }
}

/// The ConfigMaps and Secrets `container`'s env refers to, read afresh from the API through
/// the volume manager's reader (as upstream reads them at each container start).
async fn env_sources(
    kubelet: &Kubelet,
    namespace: &str,
    container: &Container,
) -> Result<EnvSources, crate::volumes::VolumeError> {
    let (config_maps, secrets) = translate::env_references(container);
    let as_text = |data: crate::volumes::plan::ObjectData| -> BTreeMap<String, String> {
        data.into_iter()
            .map(|(key, value)| (key, String::from_utf8_lossy(&value).into_owned()))
            .collect()
    };
    let mut sources = EnvSources::default();
    for name in config_maps {
        let data = kubelet
            .volumes
            .object("configmap", namespace, &name, false)
            .await?;
        sources.config_maps.insert(name, data.map(as_text));
    }
    for name in secrets {
        let data = kubelet
            .volumes
            .object("secret", namespace, &name, false)
            .await?;
        sources.secrets.insert(name, data.map(as_text));
    }
    Ok(sources)
}

/// The CRI runtime handler of the pod's RuntimeClass (upstream's runtime class manager): none
/// for a pod without a class, the class's `handler` otherwise; a class that does not exist is
/// upstream's `RuntimeClass "x" not found`.
async fn runtime_handler(
    kubelet: &Kubelet,
    spec: &k8s_openapi::api::core::v1::PodSpec,
) -> Result<String, String> {
    let Some(class) = spec.runtime_class_name.as_deref().filter(|c| !c.is_empty()) else {
        return Ok(String::new());
    };
    let classes: Api<k8s_openapi::api::node::v1::RuntimeClass> = Api::all(kubelet.client.clone());
    match classes.get_opt(class).await {
        Ok(Some(found)) => Ok(found.handler),
        Ok(None) => Err(format!("RuntimeClass {class:?} not found")),
        Err(err) => Err(format!("looking up RuntimeClass {class:?}: {err}")),
    }
}

/// One pass over `pod`: returns when to look again.
async fn sync_pod(
    kubelet: &Kubelet,
    pod: &Pod,
    last_sent: &mut Option<serde_json::Value>,
    probes: &PodProbes,
) -> anyhow::Result<Duration> {
    let (Some(name), Some(uid)) = (&pod.metadata.name, &pod.metadata.uid) else {
        return Ok(STEADY_RESYNC);
    };
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let Some(spec) = &pod.spec else {
        return Ok(STEADY_RESYNC);
    };
    let api: Api<Pod> = Api::namespaced(kubelet.client.clone(), &namespace);
    let mut cri = kubelet.cri.clone();

    if pod.metadata.deletion_timestamp.is_some() {
        probes.update(Seen {
            deleting: true,
            ..Default::default()
        });
        terminate_pod(kubelet, &mut cri, pod, uid).await?;
        // The containers are gone: finish the deletion, as the kubelet's status manager does.
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {}
            Err(err) => return Err(err.into()),
        }
        return Ok(BUSY_RESYNC);
    }

    let restart_policy = spec
        .restart_policy
        .clone()
        .unwrap_or_else(|| "Always".into());
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    // An evicted (or refused) pod is finished: its containers stop and never restart.
    let eviction = kubelet.pressure.eviction_of(uid);
    let terminal = matches!(phase.as_str(), "Succeeded" | "Failed") || eviction.is_some();
    // The pod as it runs here: its containers at the resources the kubelet allocated them (a
    // resize that does not fit waits, reported in the status).
    let allocated = if terminal {
        pod.clone()
    } else {
        kubelet.allocations.allocate(pod)
    };
    let pod = &allocated;
    let Some(spec) = &pod.spec else {
        return Ok(STEADY_RESYNC);
    };
    if eviction.is_some() {
        let running = cri
            .containers(uid)
            .await?
            .into_iter()
            .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32);
        for container in running {
            cri.stop_container(&container.id, EVICTION_GRACE_SECONDS)
                .await?;
        }
    }

    // Volumes before the sandbox (upstream `WaitForAttachAndMount`): one that cannot be set
    // up keeps the pod in ContainerCreating, reported as a FailedMount event.
    let volumes_ready = terminal || {
        match kubelet.volumes.prepare(pod).await {
            Ok(()) => true,
            Err(err) => {
                tracing::info!(pod = %name, %err, "volumes are not ready");
                false
            }
        }
    };

    // The sandbox: the newest ready one of this pod, or a new one.
    let sandboxes = cri.sandboxes(Some(uid)).await?;
    let ready = sandboxes
        .iter()
        .filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
        .max_by_key(|s| s.created_at)
        .cloned();
    let attempt = |s: &cri::PodSandbox| s.metadata.as_ref().map_or(0, |m| m.attempt);
    let sandbox = match ready {
        Some(sandbox) => Some(sandbox),
        None if terminal || !volumes_ready => None,
        None => {
            let next_attempt = sandboxes.iter().map(|s| attempt(s) + 1).max().unwrap_or(0);
            // A sandbox that died takes its containers with it (upstream recreates all).
            for old in &sandboxes {
                kill_pod_sandbox(&mut cri, old).await?;
            }
            let mut config = translate::sandbox_config(pod, next_attempt, &kubelet.log_root)?;
            let (dns, warnings) = crate::dns::pod_dns(&kubelet.dns, pod);
            for (reason, message) in warnings {
                kubelet.recorder.pod_event(pod, "Warning", reason, &message);
            }
            config.dns_config = Some(dns);
            std::fs::create_dir_all(&config.log_directory)?;
            // Upstream's FailedCreatePodSandBox: the pod stays in ContainerCreating, told why.
            let failed = |why: String| {
                kubelet.recorder.pod_event(
                    pod,
                    "Warning",
                    "FailedCreatePodSandBox",
                    &format!("Failed to create pod sandbox: {why}"),
                );
                anyhow::anyhow!("creating the sandbox: {why}")
            };
            let runtime_handler = runtime_handler(kubelet, spec).await.map_err(failed)?;
            let permit = kubelet.sandbox_starts.acquire().await?;
            let id = cri
                .runtime
                .run_pod_sandbox(cri::RunPodSandboxRequest {
                    config: Some(config),
                    runtime_handler,
                })
                .await
                .map_err(|status| {
                    failed(format!(
                        "rpc error: code = {:?} desc = {}",
                        status.code(),
                        status.message()
                    ))
                })?
                .into_inner()
                .pod_sandbox_id;
            drop(permit);
            tracing::info!(pod = %name, sandbox = %id, "sandbox started");
            cri.sandboxes(Some(uid))
                .await?
                .into_iter()
                .find(|s| s.id == id)
        }
    };
    let sandbox_status = match &sandbox {
        Some(s) => cri.sandbox_status(&s.id).await?,
        None => None,
    };
    let pod_ip = sandbox_status
        .as_ref()
        .and_then(|s| s.network.as_ref())
        .map(|n| n.ip.clone())
        .filter(|ip| !ip.is_empty());
    let facts = NodeFacts {
        node_name: kubelet.node_name.clone(),
        host_ip: kubelet.node_ip.clone(),
        pod_ip: pod_ip.clone().unwrap_or_default(),
    };

    let mut wait = STEADY_RESYNC;
    let all = cri.containers(uid).await?;
    let sandbox_id = sandbox.as_ref().map(|s| s.id.clone());
    let init_specs = spec.init_containers.clone().unwrap_or_default();
    let mut init_views = Vec::new();
    for container in &init_specs {
        init_views.push(container_view(&mut cri, &all, container, sandbox_id.as_deref()).await?);
    }
    let mut views = Vec::new();
    for container in &spec.containers {
        views.push(container_view(&mut cri, &all, container, sandbox_id.as_deref()).await?);
    }
    let ephemeral_specs = ephemeral_containers(pod);
    let mut ephemeral_views = Vec::new();
    for container in &ephemeral_specs {
        ephemeral_views
            .push(container_view(&mut cri, &all, container, sandbox_id.as_deref()).await?);
    }
    let has_probes = probes.prober.lock().is_ok_and(|p| !p.is_empty());
    let mut resizing = false;

    if let Some(sandbox) = sandbox.as_ref().filter(|_| volumes_ready && !terminal) {
        let mut ctx = SyncCtx {
            kubelet,
            pod,
            uid,
            sandbox,
            facts: &facts,
            pid_targets: HashMap::new(),
        };
        // Containers whose liveness or startup probe failed are killed first (upstream
        // `computePodActions`) and restarted below without back-off.
        let mut killed = HashSet::new();
        let sidecars = init_specs
            .iter()
            .zip(init_views.iter_mut())
            .filter(|(c, _)| is_restartable_init(c));
        for (container, (view, in_sandbox)) in
            spec.containers.iter().zip(views.iter_mut()).chain(sidecars)
        {
            let Some(current) = view
                .current
                .clone()
                .filter(|c| *in_sandbox && c.state == RuntimeState::Running)
            else {
                continue;
            };
            let Some(kind) = probes.failed(&container.name, &current.id) else {
                continue;
            };
            let restart = is_restartable_init(container) || restart_policy != "Never";
            let grace = hooks::grace_period(pod, Some(container), KillReason::Probe(kind));
            tracing::info!(pod = %name, container = %container.name, probe = kind.title(), "probe failed; killing the container");
            hooks::kill_container(
                &mut cri,
                &kubelet.recorder,
                pod,
                &container.name,
                Some(container),
                &current.id,
                grace,
                Some(hooks::probe_kill_message(&container.name, kind, restart)),
                &facts.pod_ip,
            )
            .await?;
            if let Some(status) = cri.container_status(&current.id).await? {
                view.current = Some(runtime_container(&status));
            }
            killed.insert(container.name.clone());
        }
        // An allocated resize reaches the running containers, in place or by a restart.
        let running = running_containers(spec, &views, &init_views);
        let stopped = resize::actuate(
            &kubelet.allocations,
            &kubelet.recorder,
            &mut cri,
            pod,
            uid,
            &running,
            kubelet.memory_capacity,
            &facts.pod_ip,
        )
        .await?;
        drop(running);
        for name in stopped {
            let view = views
                .iter_mut()
                .chain(init_views.iter_mut())
                .find(|(view, _)| view.name == name);
            if let Some((view, _)) = view
                && let Some(current) = &view.current
                && let Some(status) = cri.container_status(&current.id).await?
            {
                view.current = Some(runtime_container(&status));
            }
            killed.insert(name);
        }

        // Init containers in order, then the app containers.
        let states: Vec<InitState> = init_specs
            .iter()
            .zip(&init_views)
            .map(|(c, (view, in_sandbox))| init_state(c, view, *in_sandbox, probes))
            .collect();
        let sidecar: Vec<bool> = init_specs.iter().map(is_restartable_init).collect();
        let initialized_before = views.iter().any(|(v, in_sandbox)| {
            *in_sandbox
                && v.current.as_ref().is_some_and(|c| {
                    matches!(c.state, RuntimeState::Running | RuntimeState::Exited)
                })
        });
        let plan = init::plan(&states, &sidecar, &restart_policy, initialized_before);
        let (to_start, app_may_run) = match &plan {
            InitPlan::Start(list) => (list.clone(), false),
            InitPlan::Wait => (Vec::new(), false),
            InitPlan::Failed => (Vec::new(), false),
            InitPlan::Done(list) => (list.clone(), true),
        };
        if !matches!(plan, InitPlan::Done(ref l) if l.is_empty()) && plan != InitPlan::Failed {
            wait = BUSY_RESYNC;
        }
        for i in to_start {
            let (Some(container), Some((view, in_sandbox))) =
                (init_specs.get(i), init_views.get_mut(i))
            else {
                continue;
            };
            let skip_backoff = first_kill(&killed, view);
            ensure_started(
                &ctx,
                &mut cri,
                container,
                view,
                *in_sandbox,
                skip_backoff,
                &mut wait,
            )
            .await?;
        }
        if app_may_run {
            for (container, (view, in_sandbox)) in spec.containers.iter().zip(views.iter_mut()) {
                let needs_start = match &view.current {
                    None => true,
                    Some(_) if !*in_sandbox => true,
                    Some(c) => match c.state {
                        RuntimeState::Running | RuntimeState::Unknown => false,
                        // Created but never started (the kubelet died in between).
                        RuntimeState::Created => true,
                        RuntimeState::Exited => {
                            status::should_restart(&restart_policy, c.exit_code)
                        }
                    },
                };
                if needs_start {
                    let skip_backoff = first_kill(&killed, view);
                    ensure_started(
                        &ctx,
                        &mut cri,
                        container,
                        view,
                        *in_sandbox,
                        skip_backoff,
                        &mut wait,
                    )
                    .await?;
                }
            }
        }
        let running = running_containers(spec, &views, &init_views);
        resizing = resize::in_progress(&kubelet.allocations, uid, &running);
        drop(running);
        // Ephemeral containers (`kubectl debug`) start once, when added, and are never
        // restarted (upstream `computePodActions`); one with a target shares its running
        // container's process namespace.
        ctx.pid_targets = pid_targets(pod, &spec.containers, &views);
        for (container, (view, in_sandbox)) in
            ephemeral_specs.iter().zip(ephemeral_views.iter_mut())
        {
            if view.current.is_none() {
                ensure_started(
                    &ctx,
                    &mut cri,
                    container,
                    view,
                    *in_sandbox,
                    true,
                    &mut wait,
                )
                .await?;
            }
        }
    }

    // What the probes say of running containers, and what the probes see next.
    let mut seen = Seen {
        pod_ip: facts.pod_ip.clone(),
        ..Default::default()
    };
    for (view, _) in init_views.iter_mut().chain(views.iter_mut()) {
        let Some(current) = &view.current else {
            continue;
        };
        if current.state == RuntimeState::Running && has_probes {
            view.probed = Some(probes.started_ready(&view.name, &current.id));
        }
        seen.containers.insert(
            view.name.clone(),
            Observed {
                id: current.id.clone(),
                running_since: (current.state == RuntimeState::Running)
                    .then(|| instant_of(current.started_at)),
                terminated: current.state == RuntimeState::Exited,
            },
        );
    }
    if has_probes {
        probes.update(seen);
    }
    let init_views: Vec<ContainerView> = init_views.into_iter().map(|(v, _)| v).collect();
    let views: Vec<ContainerView> = views.into_iter().map(|(v, _)| v).collect();
    let ephemeral_views: Vec<ContainerView> = ephemeral_views.into_iter().map(|(v, _)| v).collect();

    let mut computed = status::pod_status(
        pod,
        &init_views,
        &views,
        pod_ip.as_deref(),
        &kubelet.node_ip,
        k8s_openapi::jiff::Timestamp::now(),
    );
    computed.ephemeral_container_statuses = status::ephemeral_statuses(&ephemeral_views);
    report_resize(kubelet, pod, uid, resizing, &mut computed);
    if let Some(eviction) = &eviction {
        status::mark_evicted(&mut computed, eviction, k8s_openapi::jiff::Timestamp::now());
    }
    let new_phase = computed.phase.clone().unwrap_or_default();
    let value = serde_json::to_value(&computed)?;
    // A static pod's status goes to its mirror pod, which must exist (and be current) first.
    let mut reportable = true;
    if static_pods::is_static(pod) {
        match static_pods::ensure_mirror(&kubelet.client, pod, &kubelet.node_name).await {
            Ok(Mirror::Current) => {}
            Ok(Mirror::Created) => *last_sent = None,
            Err(err) => {
                tracing::warn!(pod = %name, %err, "the static pod's mirror pod is not there");
                reportable = false;
            }
        }
    }
    if reportable && last_sent.as_ref().map(comparable) != Some(comparable(&value)) {
        api.patch_status(name, &manager(), &Patch::Merge(&json!({"status": value})))
            .await?;
        *last_sent = Some(value);
    }
    // A finished pod's sandbox stops (its containers stay for their logs and exit codes)
    // and its volumes go, which gives an evicted pod's local storage back.
    if matches!(new_phase.as_str(), "Succeeded" | "Failed") {
        if let Some(sandbox) = &sandbox {
            cri.runtime
                .stop_pod_sandbox(cri::StopPodSandboxRequest {
                    pod_sandbox_id: sandbox.id.clone(),
                })
                .await
                .map_err(call("StopPodSandbox"))?;
        }
        kubelet.volumes.cleanup(uid);
        kubelet.allocations.release(uid);
    }
    Ok(wait)
}

/// The app containers and sidecars running in the pod's current sandbox (`views` and
/// `init_views` are in the spec's order).
fn running_containers<'a>(
    spec: &'a PodSpec,
    views: &'a [(ContainerView, bool)],
    init_views: &'a [(ContainerView, bool)],
) -> Vec<resize::Running<'a>> {
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .zip(init_views)
        .filter(|(c, _)| is_restartable_init(c));
    spec.containers
        .iter()
        .zip(views)
        .chain(sidecars)
        .filter_map(|(container, (view, in_sandbox))| {
            let current = view.current.as_ref()?;
            (*in_sandbox && current.state == RuntimeState::Running).then(|| resize::Running {
                container,
                id: current.id.clone(),
            })
        })
        .collect()
}

/// The resize part of the status: each resizable container's `resources`, and the
/// `PodResizePending` / `PodResizeInProgress` conditions in place of the old ones.
fn report_resize(kubelet: &Kubelet, pod: &Pod, uid: &str, resizing: bool, status: &mut PodStatus) {
    let Some(spec) = &pod.spec else {
        return;
    };
    let statuses = status
        .container_statuses
        .iter_mut()
        .flatten()
        .zip(&spec.containers)
        .chain(
            status
                .init_container_statuses
                .iter_mut()
                .flatten()
                .zip(spec.init_containers.iter().flatten()),
        );
    for (container_status, container) in statuses {
        let running = container_status
            .state
            .as_ref()
            .is_some_and(|s| s.running.is_some());
        container_status.resources =
            resize::status_resources(&kubelet.allocations, uid, container, running);
    }
    let old = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let conditions = status.conditions.get_or_insert_default();
    conditions.retain(|c| !resize::is_resize_condition(c));
    conditions.extend(kubelet.allocations.conditions(uid, resizing, &old, &now));
}

/// For each ephemeral container naming a `targetContainerName`, the runtime id of that
/// container while it runs.
fn pid_targets(
    pod: &Pod,
    containers: &[Container],
    views: &[(ContainerView, bool)],
) -> HashMap<String, String> {
    let running: HashMap<&str, &str> = containers
        .iter()
        .zip(views)
        .filter_map(|(container, (view, in_sandbox))| {
            let current = view.current.as_ref()?;
            (*in_sandbox && current.state == RuntimeState::Running)
                .then_some((container.name.as_str(), current.id.as_str()))
        })
        .collect();
    pod.spec
        .iter()
        .flat_map(|s| s.ephemeral_containers.iter().flatten())
        .filter_map(|e| {
            let target = e.target_container_name.as_deref()?;
            Some((e.name.clone(), running.get(target)?.to_string()))
        })
        .collect()
}

/// The pod's ephemeral containers as the containers the runtime runs: an
/// `EphemeralContainer` is a `Container` with a target (whose process namespace it joins, see
/// [`pid_targets`]).
pub fn ephemeral_containers(pod: &Pod) -> Vec<Container> {
    pod.spec
        .iter()
        .flat_map(|s| s.ephemeral_containers.iter().flatten())
        .filter_map(|ephemeral| {
            serde_json::to_value(ephemeral)
                .and_then(serde_json::from_value::<Container>)
                .ok()
        })
        .collect()
}

/// A status without the times the kubelet sets afresh, to tell real changes apart.
fn comparable(status: &serde_json::Value) -> serde_json::Value {
    let mut status = status.clone();
    if let Some(conditions) = status.get_mut("conditions").and_then(|c| c.as_array_mut()) {
        for condition in conditions {
            if let Some(c) = condition.as_object_mut() {
                c.remove("lastTransitionTime");
                c.remove("lastProbeTime");
            }
        }
    }
    if let Some(s) = status.as_object_mut() {
        s.remove("startTime");
    }
    status
}

async fn kill_pod_sandbox(cri: &mut Cri, sandbox: &cri::PodSandbox) -> Result<(), CriError> {
    cri.remove_sandbox(&sandbox.id).await
}

/// What the per-container steps of one sync share.
struct SyncCtx<'a> {
    kubelet: &'a Kubelet,
    pod: &'a Pod,
    uid: &'a str,
    sandbox: &'a cri::PodSandbox,
    facts: &'a NodeFacts,
    /// Ephemeral containers' targets: container name → the runtime id of the container
    /// whose process namespace it joins (`kubectl debug --target`).
    pid_targets: HashMap<String, String>,
}

/// `container`'s newest two runtime containers as a view, and whether the newest is in
/// the current sandbox.
async fn container_view(
    cri: &mut Cri,
    all: &[cri::Container],
    container: &Container,
    sandbox: Option<&str>,
) -> Result<(ContainerView, bool), CriError> {
    let mut mine: Vec<&cri::Container> = all
        .iter()
        .filter(|c| c.labels.get(CONTAINER_NAME_LABEL) == Some(&container.name))
        .collect();
    mine.sort_by_key(|c| std::cmp::Reverse(c.created_at));
    let mut runtime = Vec::new();
    for c in mine.iter().take(2) {
        if let Some(status) = cri.container_status(&c.id).await? {
            runtime.push((c.pod_sandbox_id.clone(), runtime_container(&status)));
        }
    }
    let in_sandbox = runtime
        .first()
        .is_some_and(|(s, _)| Some(s.as_str()) == sandbox);
    let view = ContainerView {
        name: container.name.clone(),
        image: container.image.clone().unwrap_or_default(),
        current: runtime.first().map(|(_, c)| c.clone()),
        previous: runtime.get(1).map(|(_, c)| c.clone()),
        waiting: None,
        probed: None,
    };
    Ok((view, in_sandbox))
}

/// Whether `view`'s container was just killed by a probe and never exited before: upstream
/// restarts it at once (its `doBackOff` finds no exited container to back off from); later
/// kills back off like crashes.
fn first_kill(killed: &HashSet<String>, view: &ContainerView) -> bool {
    killed.contains(&view.name)
        && view
            .previous
            .as_ref()
            .is_none_or(|p| p.state != RuntimeState::Exited)
}

/// An init container's state for `init::plan`.
fn init_state(
    container: &Container,
    view: &ContainerView,
    in_sandbox: bool,
    probes: &PodProbes,
) -> InitState {
    let Some(current) = view.current.as_ref().filter(|_| in_sandbox) else {
        return InitState::None;
    };
    match current.state {
        RuntimeState::Created => InitState::Created,
        RuntimeState::Exited => InitState::Exited(current.exit_code),
        RuntimeState::Running | RuntimeState::Unknown => InitState::Running {
            started: !is_restartable_init(container)
                || probes.started_ready(&container.name, &current.id).0,
        },
    }
}

/// Starts `container`, which the caller decided must run: a created one is started; an
/// exited one waits out its crash-loop back-off (unless a probe just killed it) and is
/// replaced. Updates `view` with what the runtime then has or why it waits.
async fn ensure_started(
    ctx: &SyncCtx<'_>,
    cri: &mut Cri,
    container: &Container,
    view: &mut ContainerView,
    in_sandbox: bool,
    skip_backoff: bool,
    wait: &mut Duration,
) -> anyhow::Result<()> {
    let kubelet = ctx.kubelet;
    *wait = BUSY_RESYNC;
    if let Some(c) = view
        .current
        .clone()
        .filter(|c| in_sandbox && c.state == RuntimeState::Created)
    {
        if let Err(err) = cri
            .runtime
            .start_container(cri::StartContainerRequest {
                container_id: c.id.clone(),
            })
            .await
        {
            view.waiting = Some(("RunContainerError".into(), err.message().to_string()));
        }
        return Ok(());
    }
    let key = format!("{}/{}", ctx.uid, container.name);
    let exited = view
        .current
        .clone()
        .filter(|c| c.state == RuntimeState::Exited);
    let poisoned = || anyhow::anyhow!("back-off state poisoned");
    if let Some(c) = exited.as_ref().filter(|_| !skip_backoff) {
        let remaining = kubelet.backoff.lock().map_err(|_| poisoned())?.remaining(
            &key,
            instant_of(c.finished_at),
            Instant::now(),
        );
        if let Some(remaining) = remaining {
            let delay = kubelet
                .backoff
                .lock()
                .map_err(|_| poisoned())?
                .current(&key);
            view.waiting = Some((
                "CrashLoopBackOff".into(),
                status::crash_loop_message(delay, &container.name, ctx.pod),
            ));
            kubelet.recorder.container_event(
                ctx.pod,
                &container.name,
                "Warning",
                "BackOff",
                &format!(
                    "Back-off restarting failed container {} in pod {}",
                    container.name,
                    hooks::format_pod(ctx.pod)
                ),
            );
            *wait = (*wait).min(remaining.max(Duration::from_millis(200)));
            return Ok(());
        }
    }
    let result = start_container(ctx, cri, container, view).await;
    // A restart, or a container that was created but would not start, backs off next time.
    let started_one = (exited.is_some() && !skip_backoff)
        || matches!(&result, Err((reason, _)) if reason == "RunContainerError" || reason == "PostStartHookError");
    if started_one {
        kubelet
            .backoff
            .lock()
            .map_err(|_| poisoned())?
            .next(&key, Instant::now());
    }
    // Report what the runtime now has.
    let newest = cri
        .containers(ctx.uid)
        .await?
        .into_iter()
        .filter(|c| c.labels.get(CONTAINER_NAME_LABEL) == Some(&container.name))
        .max_by_key(|c| c.created_at);
    if let Some(newest) = newest
        && view.current.as_ref().is_none_or(|c| c.id != newest.id)
        && let Some(status) = cri.container_status(&newest.id).await?
    {
        view.previous = view.current.take();
        view.current = Some(runtime_container(&status));
    }
    if let Err(waiting) = result {
        view.waiting = Some(waiting);
    }
    Ok(())
}

/// Deletion (upstream `killPodWithSyncResult` with `killContainer`): every running
/// container stops with its preStop hook within the pod's grace period — regular ones in
/// parallel, then sidecars in reverse order — then the sandboxes go.
async fn terminate_pod(
    kubelet: &Kubelet,
    cri: &mut Cri,
    pod: &Pod,
    uid: &str,
) -> Result<(), CriError> {
    let spec = pod.spec.clone().unwrap_or_default();
    let pod_ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default();
    let running: Vec<cri::Container> = cri
        .containers(uid)
        .await?
        .into_iter()
        .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
        .collect();
    let name_of = |c: &cri::Container| {
        c.labels
            .get(CONTAINER_NAME_LABEL)
            .cloned()
            .unwrap_or_default()
    };
    let names: Vec<String> = running.iter().map(name_of).collect();
    let started = Instant::now();
    // Regular containers together, then sidecars one by one in reverse order, all within
    // the one grace period.
    for wave in hooks::termination_waves(pod, &names) {
        let stops = running
            .iter()
            .filter(|c| wave.contains(&name_of(c)))
            .map(|c| {
                let mut cri = cri.clone();
                let name = name_of(c);
                let container = spec
                    .containers
                    .iter()
                    .chain(spec.init_containers.iter().flatten())
                    .find(|s| s.name == name);
                let elapsed = i64::try_from(started.elapsed().as_secs()).unwrap_or(0);
                let grace = hooks::grace_period(pod, container, KillReason::Other) - elapsed;
                let pod_ip = pod_ip.as_str();
                async move {
                    hooks::kill_container(
                        &mut cri,
                        &kubelet.recorder,
                        pod,
                        &name,
                        container,
                        &c.id,
                        grace.max(0),
                        None,
                        pod_ip,
                    )
                    .await
                }
            });
        for result in futures::future::join_all(stops).await {
            result?;
        }
    }
    for sandbox in cri.sandboxes(Some(uid)).await? {
        cri.remove_sandbox(&sandbox.id).await?;
    }
    Ok(())
}

/// Image check, config, CreateContainer, StartContainer, postStart; on failure the waiting
/// reason and message upstream reports. Records upstream's events on the way.
async fn start_container(
    ctx: &SyncCtx<'_>,
    cri: &mut Cri,
    container: &Container,
    view: &ContainerView,
) -> Result<(), (String, String)> {
    let (kubelet, pod, sandbox, facts) = (ctx.kubelet, ctx.pod, ctx.sandbox, ctx.facts);
    let recorder = &kubelet.recorder;
    let name = container.name.as_str();
    let failed = |reason: &str, message: String| {
        recorder.container_event(pod, name, "Warning", "Failed", &format!("Error: {message}"));
        (reason.to_string(), message)
    };
    let image_name = container.image.clone().unwrap_or_default();
    let image = cri
        .image(&image_name)
        .await
        .map_err(|err| ("ErrImageInspect".to_string(), err.to_string()))?;
    match translate::image_decision(
        &image_name,
        container.image_pull_policy.as_deref(),
        image.is_some(),
    ) {
        ImageDecision::Wait { reason, message } => {
            let (kind, event) = if reason == "ErrImageNeverPull" {
                ("Warning", "ErrImageNeverPull")
            } else {
                ("Normal", "BackOff")
            };
            recorder.container_event(pod, name, kind, event, &message);
            return Err((reason.to_string(), message));
        }
        ImageDecision::Use => recorder.container_event(
            pod,
            name,
            "Normal",
            "Pulled",
            &format!("Container image {image_name:?} already present on machine"),
        ),
    }
    let image_ref = image.map(|i| i.id).unwrap_or(image_name);
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let config_error = |message: String| failed("CreateContainerConfigError", message);
    let sources = env_sources(kubelet, &namespace, container)
        .await
        .map_err(|err| config_error(err.to_string()))?;
    let env = translate::resolve_env(pod, container, facts, &sources)
        .map_err(|err| config_error(err.to_string()))?;
    let restart_count = view
        .current
        .as_ref()
        .map_or(0, |c| u32::try_from(c.restart_count + 1).unwrap_or(0));
    let mounts = kubelet
        .volumes
        .container_mounts(pod, container, &env, &facts.pod_ip)
        .map_err(|err| config_error(err.to_string()))?;
    let mut config =
        translate::container_config(pod, container, restart_count, &env, &image_ref, &mounts)
            .map_err(|err| config_error(err.to_string()))?;
    if let Some(target) = ctx.pid_targets.get(&container.name)
        && let Some(namespaces) = config
            .linux
            .as_mut()
            .and_then(|l| l.security_context.as_mut())
            .and_then(|s| s.namespace_options.as_mut())
    {
        namespaces.pid = cri::NamespaceMode::Target as i32;
        namespaces.target_id = target.clone();
    }
    config.linux.get_or_insert_default().resources = Some(resources::linux_resources(
        pod,
        container,
        kubelet.memory_capacity,
    ));
    let attempt = sandbox.metadata.as_ref().map_or(0, |m| m.attempt);
    let sandbox_config = translate::sandbox_config(pod, attempt, &kubelet.log_root)
        .map_err(|err| config_error(err.to_string()))?;
    let _ = std::fs::create_dir_all(format!(
        "{}/{}",
        sandbox_config.log_directory, container.name
    ));
    let id = cri
        .runtime
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.id.clone(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        })
        .await
        .map_err(|err| failed("CreateContainerError", err.message().to_string()))?
        .into_inner()
        .container_id;
    recorder.container_event(
        pod,
        name,
        "Normal",
        "Created",
        &format!("Created container: {name}"),
    );
    cri.runtime
        .start_container(cri::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .map_err(|err| failed("RunContainerError", err.message().to_string()))?;
    recorder.container_event(
        pod,
        name,
        "Normal",
        "Started",
        &format!("Started container {name}"),
    );
    tracing::info!(pod = ?pod.metadata.name, container = %name, %id, restart_count, "container started");
    if let Some(uid) = &pod.metadata.uid {
        kubelet.allocations.set_actuated(uid, container);
    }
    let post_start = container
        .lifecycle
        .as_ref()
        .and_then(|l| l.post_start.as_ref());
    if let Some(hook) = post_start
        && let Err(message) = hooks::run_hook(cri, pod, container, &id, hook, &facts.pod_ip).await
    {
        recorder.container_event(pod, name, "Warning", "FailedPostStartHook", &message);
        let grace = hooks::grace_period(pod, Some(container), KillReason::Other);
        if let Err(err) = hooks::kill_container(
            cri,
            recorder,
            pod,
            name,
            Some(container),
            &id,
            grace,
            Some("FailedPostStartHook".into()),
            &facts.pod_ip,
        )
        .await
        {
            tracing::warn!(pod = ?pod.metadata.name, container = %name, %err, "killing after a failed postStart hook failed");
        }
        return Err(("PostStartHookError".into(), message));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ephemeral_containers_run_as_containers_without_their_target() {
        let pod: Pod = serde_json::from_value(json!({"spec": {
            "containers": [{"name": "app", "image": "nginx"}],
            "ephemeralContainers": [{"name": "debugger", "image": "busybox",
                "command": ["sleep", "3600"], "stdin": true, "tty": true,
                "targetContainerName": "app"}],
        }}))
        .unwrap_or_else(|e| panic!("{e}"));
        let containers = ephemeral_containers(&pod);
        assert_eq!(containers.len(), 1);
        let debugger = &containers[0];
        assert_eq!(debugger.name, "debugger");
        assert_eq!(debugger.image.as_deref(), Some("busybox"));
        assert_eq!(debugger.command, Some(vec!["sleep".into(), "3600".into()]));
        assert_eq!((debugger.stdin, debugger.tty), (Some(true), Some(true)));
    }
}
