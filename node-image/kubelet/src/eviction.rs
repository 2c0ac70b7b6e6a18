//! Node-pressure eviction, the basics of upstream `pkg/kubelet/eviction`: hard thresholds
//! (`--eviction-hard`) on the node's signals — memory.available, nodefs.available and
//! inodesFree (the kubelet's root dir), imagefs.available and inodesFree (the runtime's
//! image filesystem), pid.available — observed every 10 s. A threshold that is met sets the
//! node's MemoryPressure / DiskPressure / PIDPressure condition (held for
//! `--eviction-pressure-transition-period` after the last time it was met) and evicts one pod
//! per pass, ranked as upstream (usage above requests, then priority, then usage): the pod
//! is killed at once and reported Failed with reason `Evicted`. Under pressure new pods are
//! refused as upstream's admission does. Static, mirror and system-critical pods are never
//! evicted. Soft thresholds, node-level reclaim (image and container GC) and per-pod local
//! storage limits are not done.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use tokio::sync::watch;

use crate::cri::Cri;
use crate::resources::{SYSTEM_CRITICAL_PRIORITY, qos_class, scaled};
use crate::translate::{CONTAINER_NAME_LABEL, POD_UID_LABEL};

/// How often the signals are observed (upstream's eviction monitoring period).
pub const MONITORING_PERIOD: Duration = Duration::from_secs(10);
/// Upstream's default `--eviction-hard` on Linux.
pub const DEFAULT_HARD: &str =
    "memory.available<100Mi,nodefs.available<10%,imagefs.available<15%,nodefs.inodesFree<5%";
/// The grace a hard eviction gives the pod's containers (upstream's immediate eviction).
pub const EVICTION_GRACE_SECONDS: i64 = 1;

/// An eviction signal (upstream's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    /// `memory.available`.
    MemoryAvailable,
    /// `nodefs.available`.
    NodeFsAvailable,
    /// `nodefs.inodesFree`.
    NodeFsInodesFree,
    /// `imagefs.available`.
    ImageFsAvailable,
    /// `imagefs.inodesFree`.
    ImageFsInodesFree,
    /// `pid.available`.
    PidAvailable,
}

impl Signal {
    const ALL: [Signal; 6] = [
        Signal::MemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::PidAvailable,
    ];

    /// The signal's name in flags.
    pub fn name(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    /// The resource it starves (upstream's `signalToResource`), as eviction messages name it.
    pub fn resource(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory",
            Signal::NodeFsAvailable | Signal::ImageFsAvailable => "ephemeral-storage",
            Signal::NodeFsInodesFree | Signal::ImageFsInodesFree => "inodes",
            Signal::PidAvailable => "pids",
        }
    }

    /// The node condition it drives.
    pub fn condition(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "MemoryPressure",
            Signal::PidAvailable => "PIDPressure",
            _ => "DiskPressure",
        }
    }

    /// Whether an amount of it is bytes (printed as a quantity) rather than a count.
    fn bytes(self) -> bool {
        matches!(
            self,
            Signal::MemoryAvailable | Signal::NodeFsAvailable | Signal::ImageFsAvailable
        )
    }
}

/// A threshold's amount.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Amount {
    /// An absolute quantity (bytes, inodes or PIDs).
    Quantity(i64),
    /// A percentage of the capacity.
    Percent(f64),
}

/// A hard eviction threshold: `signal` below `amount` is pressure.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Threshold {
    /// The signal.
    pub signal: Signal,
    /// The amount.
    pub amount: Amount,
}

impl Threshold {
    /// The threshold in the signal's units for `capacity`.
    pub fn value(&self, capacity: i64) -> i64 {
        match self.amount {
            Amount::Quantity(q) => q,
            Amount::Percent(p) => (capacity as f64 * p / 100.0).round() as i64,
        }
    }
}

/// Parses `--eviction-hard` (`memory.available<100Mi,nodefs.available<10%`); an empty text
/// has no thresholds.
pub fn parse_thresholds(text: &str) -> Result<Vec<Threshold>, String> {
    let mut thresholds: Vec<Threshold> = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, amount) = item.split_once('<').ok_or_else(|| {
            format!("invalid eviction threshold {item:?}: expected signal<amount")
        })?;
        let signal = Signal::ALL
            .into_iter()
            .find(|s| s.name() == name.trim())
            .ok_or_else(|| format!("unknown eviction signal {:?}", name.trim()))?;
        let amount = amount.trim();
        let amount = match amount.strip_suffix('%') {
            Some(percent) => {
                let p: f64 = percent
                    .parse()
                    .map_err(|_| format!("invalid percentage {amount:?} for {name}"))?;
                if !(0.0..=100.0).contains(&p) {
                    return Err(format!(
                        "percentage {amount:?} for {name} is outside 0-100%"
                    ));
                }
                Amount::Percent(p)
            }
            None => Amount::Quantity(
                scaled(amount, 0)
                    .filter(|q| *q >= 0)
                    .ok_or_else(|| format!("invalid quantity {amount:?} for {name}"))?,
            ),
        };
        if thresholds.iter().any(|t| t.signal == signal) {
            return Err(format!("{name} has more than one threshold"));
        }
        thresholds.push(Threshold { signal, amount });
    }
    Ok(thresholds)
}

/// One observed signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// What is left.
    pub available: i64,
    /// The total.
    pub capacity: i64,
}

/// The thresholds `observations` meet (`available < threshold`), in the order given.
pub fn met(
    thresholds: &[Threshold],
    observations: &BTreeMap<Signal, Observation>,
) -> Vec<(Threshold, Observation)> {
    thresholds
        .iter()
        .filter_map(|t| {
            let seen = observations.get(&t.signal)?;
            (seen.available < t.value(seen.capacity)).then_some((*t, *seen))
        })
        .collect()
}

/// Node conditions held for the transition period after their signal was last met
/// (upstream `nodeConditionsObservedSince`), so a pod's own reclaim does not flap them.
#[derive(Debug, Default)]
pub struct ConditionMemory {
    last_met: HashMap<&'static str, Instant>,
}

impl ConditionMemory {
    /// Records the conditions met at `now`; returns those still held.
    pub fn update(
        &mut self,
        met: &[(Threshold, Observation)],
        now: Instant,
        transition: Duration,
    ) -> BTreeSet<&'static str> {
        for (threshold, _) in met {
            self.last_met.insert(threshold.signal.condition(), now);
        }
        self.last_met
            .retain(|_, at| now.saturating_duration_since(*at) < transition);
        self.last_met.keys().copied().collect()
    }
}

/// Whether a pod is critical: never evicted nor refused (upstream `IsCriticalPod`).
pub fn is_critical(pod: &Pod) -> bool {
    crate::static_pods::is_static(pod)
        || crate::static_pods::is_mirror(pod)
        || pod
            .spec
            .as_ref()
            .and_then(|s| s.priority)
            .is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY)
}

/// Upstream's admission under pressure: with MemoryPressure only BestEffort pods are refused
/// (unless they tolerate the memory-pressure taint); DiskPressure or PIDPressure refuse
/// every pod. Critical pods are always admitted. `Err` is the message of the `Evicted` status.
pub fn admit(conditions: &BTreeSet<&'static str>, pod: &Pod) -> Result<(), String> {
    if conditions.is_empty() || is_critical(pod) {
        return Ok(());
    }
    if conditions.iter().all(|c| *c == "MemoryPressure") {
        let tolerates = pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.as_ref())
            .is_some_and(|list| {
                list.iter().any(|t| {
                    let key_ok = t.key.as_deref() == Some("node.kubernetes.io/memory-pressure")
                        || (t.key.as_deref().unwrap_or_default().is_empty()
                            && t.operator.as_deref() == Some("Exists"));
                    let effect_ok = t
                        .effect
                        .as_deref()
                        .is_none_or(|e| e.is_empty() || e == "NoSchedule");
                    key_ok && effect_ok
                })
            });
        if qos_class(pod) != "BestEffort" || tolerates {
            return Ok(());
        }
    }
    let list: Vec<&str> = conditions.iter().copied().collect();
    Err(format!("The node had condition: [{}]. ", list.join(" ")))
}

/// What one pod uses, by container where it can be told.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// Working-set memory per container.
    pub memory: BTreeMap<String, i64>,
    /// Local storage: writable layers, logs and the pod's volumes on the node's disk.
    pub disk: i64,
    /// Inodes of the same.
    pub inodes: i64,
}

impl Usage {
    fn memory_total(&self) -> i64 {
        self.memory.values().sum()
    }
}

fn request(pod: &Pod, container: Option<&str>, resource: &str) -> i64 {
    pod.spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .filter(|c| container.is_none_or(|name| c.name == name))
        .filter_map(|c| c.resources.as_ref()?.requests.as_ref()?.get(resource))
        .filter_map(|q| scaled(&q.0, 0))
        .sum()
}

fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// Orders candidates for eviction under `signal`, first to go first (upstream
/// `rankMemoryPressure` / `rankDiskPressureFunc` / `rankPIDPressure`).
pub fn rank(candidates: &mut [(Pod, Usage)], signal: Signal) {
    let key = |(pod, usage): &(Pod, Usage)| -> (bool, i32, i64) {
        let (used, requested) = match signal.resource() {
            "memory" => (usage.memory_total(), request(pod, None, "memory")),
            "ephemeral-storage" => (usage.disk, request(pod, None, "ephemeral-storage")),
            "inodes" => (usage.inodes, 0),
            _ => (0, 0),
        };
        // Exceeding requests sorts first (false < true), then lower priority, then more use.
        (used <= requested, priority(pod), -(used - requested))
    };
    candidates.sort_by_key(key);
}

fn format_amount(signal: Signal, amount: i64) -> String {
    if !signal.bytes() {
        return amount.to_string();
    }
    const UNITS: [(&str, i64); 3] = [("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)];
    for (suffix, size) in UNITS {
        if amount.abs() >= size && amount % size == 0 {
            return format!("{}{suffix}", amount / size);
        }
    }
    if amount.abs() >= 1 << 10 {
        return format!("{}Ki", amount / 1024);
    }
    amount.to_string()
}

/// The `Evicted` status message (upstream `evictionMessage`).
pub fn eviction_message(
    threshold: &Threshold,
    observed: &Observation,
    pod: &Pod,
    usage: &Usage,
) -> String {
    let signal = threshold.signal;
    let mut message = format!(
        "The node was low on resource: {}. Threshold quantity: {}, available: {}. ",
        signal.resource(),
        format_amount(signal, threshold.value(observed.capacity)),
        format_amount(signal, observed.available),
    );
    if signal == Signal::MemoryAvailable {
        for (container, used) in &usage.memory {
            let requested = request(pod, Some(container), "memory");
            if *used > requested {
                message.push_str(&format!(
                    "Container {container} was using {}, request is {}, has larger consumption of memory. ",
                    format_amount(signal, *used),
                    format_amount(signal, requested),
                ));
            }
        }
    } else if signal.resource() == "ephemeral-storage" {
        message.push_str(&format!(
            "Pod {} was using {} of local storage. ",
            pod.metadata.name.as_deref().unwrap_or_default(),
            format_amount(signal, usage.disk)
        ));
    }
    message
}

/// Why and how a pod was evicted (or refused): what its status reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    /// The status message.
    pub message: String,
    /// Whether it was running (a kill, with the `DisruptionTarget` condition) rather than
    /// refused at admission.
    pub killed: bool,
}

/// The eviction manager's settings (flags).
#[derive(Debug, Clone)]
pub struct Config {
    /// `--eviction-hard`.
    pub thresholds: Vec<Threshold>,
    /// `--eviction-pressure-transition-period`.
    pub transition: Duration,
    /// The kubelet's root dir (the node filesystem, and the pods' volumes).
    pub root_dir: PathBuf,
    /// Where pod logs are.
    pub log_root: PathBuf,
}

/// The pressure the node is under, and the pods evicted or refused (by UID), shared with
/// the heartbeat (conditions) and the pod workers (who carry evictions out).
pub struct Pressure {
    /// The node's pressure conditions.
    pub conditions: watch::Sender<BTreeSet<&'static str>>,
    /// Evicted and refused pods: their workers kill them and report them Failed.
    pub evicted: watch::Sender<HashMap<String, Eviction>>,
    memory: Mutex<ConditionMemory>,
}

impl Default for Pressure {
    fn default() -> Self {
        Pressure {
            conditions: watch::Sender::new(BTreeSet::new()),
            evicted: watch::Sender::new(HashMap::new()),
            memory: Mutex::default(),
        }
    }
}

impl Pressure {
    /// The eviction of pod `uid`, if it was evicted or refused.
    pub fn eviction_of(&self, uid: &str) -> Option<Eviction> {
        self.evicted.borrow().get(uid).cloned()
    }

    /// Marks pod `uid` evicted (its worker wakes and carries it out).
    pub fn evict(&self, uid: &str, eviction: Eviction) {
        self.evicted.send_modify(|all| {
            all.insert(uid.to_string(), eviction);
        });
    }

    /// Forgets pod `uid` (it is gone).
    pub fn forget(&self, uid: &str) {
        self.evicted
            .send_if_modified(|all| all.remove(uid).is_some());
    }

    /// Upstream's admission of a new pod under the current conditions.
    pub fn admit(&self, pod: &Pod) -> Result<(), String> {
        admit(&self.conditions.borrow(), pod)
    }
}

/// statvfs of `path` as (available bytes, capacity bytes, free inodes, inodes).
fn filesystem(path: &Path) -> Option<(i64, i64, i64, i64)> {
    let stat = rustix::fs::statvfs(path).ok()?;
    let block = i64::try_from(stat.f_frsize).ok()?;
    let as_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    Some((
        as_i64(stat.f_bavail).saturating_mul(block),
        as_i64(stat.f_blocks).saturating_mul(block),
        as_i64(stat.f_ffree),
        as_i64(stat.f_files),
    ))
}

/// `/proc/meminfo` → memory.available (MemAvailable, of MemTotal).
pub fn memory_observation(meminfo: &str) -> Option<Observation> {
    let field = |name: &str| -> Option<i64> {
        let line = meminfo.lines().find(|l| l.starts_with(name))?;
        let kib: i64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    };
    Some(Observation {
        available: field("MemAvailable:")?,
        capacity: field("MemTotal:")?,
    })
}

/// Observes every signal it can (a signal that cannot be read is left out, so its threshold
/// is never met).
pub async fn observe(config: &Config, cri: &mut Cri) -> BTreeMap<Signal, Observation> {
    let mut seen = BTreeMap::new();
    if let Some(memory) = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| memory_observation(&text))
    {
        seen.insert(Signal::MemoryAvailable, memory);
    }
    let mut record = |space: Signal, inodes: Signal, path: &Path| {
        if let Some((available, capacity, free, files)) = filesystem(path) {
            seen.insert(
                space,
                Observation {
                    available,
                    capacity,
                },
            );
            seen.insert(
                inodes,
                Observation {
                    available: free,
                    capacity: files,
                },
            );
        }
    };
    record(
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        &config.root_dir,
    );
    let image_fs = cri
        .images
        .image_fs_info(cri::ImageFsInfoRequest {})
        .await
        .ok()
        .and_then(|r| {
            r.into_inner()
                .image_filesystems
                .into_iter()
                .find_map(|fs| fs.fs_id.map(|id| id.mountpoint))
        });
    let image_path = image_fs
        .map(PathBuf::from)
        .unwrap_or_else(|| config.root_dir.clone());
    record(
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        &image_path,
    );
    let pid_max: Option<i64> = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok());
    if let Some(pid_max) = pid_max {
        let running = std::fs::read_dir("/proc")
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
                    .count()
            })
            .unwrap_or(0);
        seen.insert(
            Signal::PidAvailable,
            Observation {
                available: pid_max - i64::try_from(running).unwrap_or(0),
                capacity: pid_max,
            },
        );
    }
    seen
}

/// Bytes and inodes under `dir`, staying on its filesystem (memory-backed emptyDirs are
/// not disk).
fn disk_usage(dir: &Path) -> (i64, i64) {
    use std::os::unix::fs::MetadataExt;
    let Ok(root) = std::fs::symlink_metadata(dir) else {
        return (0, 0);
    };
    let device = root.dev();
    let (mut bytes, mut inodes) = (0i64, 0i64);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.dev() != device {
            continue;
        }
        bytes += i64::try_from(meta.blocks() * 512).unwrap_or(0);
        inodes += 1;
        if meta.is_dir() {
            stack.extend(
                std::fs::read_dir(&path)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path()),
            );
        }
    }
    (bytes, inodes)
}

/// What each pod (by UID) uses: the runtime's per-container stats, plus logs and volumes.
async fn usage(config: &Config, cri: &mut Cri, uids: &[String]) -> HashMap<String, Usage> {
    let mut all: HashMap<String, Usage> = uids
        .iter()
        .map(|uid| (uid.clone(), Usage::default()))
        .collect();
    let stats = cri
        .runtime
        .list_container_stats(cri::ListContainerStatsRequest { filter: None })
        .await
        .map(|r| r.into_inner().stats)
        .unwrap_or_default();
    for stat in stats {
        let Some(attributes) = &stat.attributes else {
            continue;
        };
        let labels = &attributes.labels;
        let (Some(uid), Some(name)) = (labels.get(POD_UID_LABEL), labels.get(CONTAINER_NAME_LABEL))
        else {
            continue;
        };
        let Some(usage) = all.get_mut(uid) else {
            continue;
        };
        if let Some(bytes) = stat
            .memory
            .as_ref()
            .and_then(|m| m.working_set_bytes.as_ref())
        {
            *usage.memory.entry(name.clone()).or_default() +=
                i64::try_from(bytes.value).unwrap_or(i64::MAX);
        }
        if let Some(layer) = &stat.writable_layer {
            usage.disk += layer
                .used_bytes
                .as_ref()
                .map_or(0, |b| i64::try_from(b.value).unwrap_or(0));
            usage.inodes += layer
                .inodes_used
                .as_ref()
                .map_or(0, |b| i64::try_from(b.value).unwrap_or(0));
        }
    }
    let logs: Vec<PathBuf> = std::fs::read_dir(&config.log_root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    for (uid, usage) in &mut all {
        let suffix = format!("_{uid}");
        let dirs = logs
            .iter()
            .filter(|p| p.to_string_lossy().ends_with(&suffix))
            .cloned()
            .chain([config.root_dir.join("pods").join(uid)]);
        for dir in dirs {
            let (bytes, inodes) = disk_usage(&dir);
            usage.disk += bytes;
            usage.inodes += inodes;
        }
    }
    all
}

/// The eviction manager: observes every [`MONITORING_PERIOD`], keeps the node's pressure
/// conditions, and evicts at most one pod per pass while a threshold is met.
pub async fn run(
    client: kube::Client,
    node: String,
    mut cri: Cri,
    config: Config,
    pressure: std::sync::Arc<Pressure>,
    recorder: std::sync::Arc<crate::events::Recorder>,
) {
    loop {
        let observations = observe(&config, &mut cri).await;
        let met = met(&config.thresholds, &observations);
        let conditions = match pressure.memory.lock() {
            Ok(mut memory) => memory.update(&met, Instant::now(), config.transition),
            Err(_) => return,
        };
        pressure.conditions.send_if_modified(|current| {
            let changed = *current != conditions;
            if changed {
                tracing::info!(?conditions, "node pressure conditions changed");
                *current = conditions;
            }
            changed
        });
        // Upstream reclaims one resource at a time: the first threshold met.
        if let Some((threshold, observed)) = met.first() {
            tracing::warn!(
                signal = threshold.signal.name(),
                available = observed.available,
                threshold = threshold.value(observed.capacity),
                "eviction threshold met"
            );
            if let Err(err) = evict_one(
                &client, &node, &mut cri, &config, &pressure, &recorder, threshold, observed,
            )
            .await
            {
                tracing::warn!(%err, "evicting a pod failed");
            }
        }
        tokio::time::sleep(MONITORING_PERIOD).await;
    }
}

/// Picks the first pod to go under `threshold` and evicts it.
#[allow(clippy::too_many_arguments)]
async fn evict_one(
    client: &kube::Client,
    node: &str,
    cri: &mut Cri,
    config: &Config,
    pressure: &Pressure,
    recorder: &crate::events::Recorder,
    threshold: &Threshold,
    observed: &Observation,
) -> Result<(), kube::Error> {
    let pods: Api<Pod> = Api::all(client.clone());
    let list = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?;
    let evicted = pressure.evicted.borrow().clone();
    let active: Vec<Pod> = list
        .items
        .into_iter()
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            let uid = p.metadata.uid.as_deref().unwrap_or_default();
            !matches!(phase, Some("Succeeded" | "Failed"))
                && p.metadata.deletion_timestamp.is_none()
                && !is_critical(p)
                && !evicted.contains_key(uid)
        })
        .collect();
    let uids: Vec<String> = active
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    let mut usage = usage(config, cri, &uids).await;
    let mut candidates: Vec<(Pod, Usage)> = active
        .into_iter()
        .map(|p| {
            let used = usage
                .remove(p.metadata.uid.as_deref().unwrap_or_default())
                .unwrap_or_default();
            (p, used)
        })
        .collect();
    rank(&mut candidates, threshold.signal);
    let Some((pod, used)) = candidates.first() else {
        tracing::warn!("under pressure, but no pod can be evicted");
        return Ok(());
    };
    let message = eviction_message(threshold, observed, pod, used);
    tracing::warn!(pod = %crate::static_pods::full_name(pod), %message, "evicting a pod");
    recorder.pod_event(pod, "Warning", "Evicted", &message);
    pressure.evict(
        pod.metadata.uid.as_deref().unwrap_or_default(),
        Eviction {
            message,
            killed: true,
        },
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).expect("pod")
    }

    fn with(name: &str, priority: i32, memory_request: Option<&str>) -> Pod {
        let resources = match memory_request {
            Some(r) => json!({"requests": {"memory": r}}),
            None => json!({}),
        };
        pod(json!({"metadata": {"name": name, "uid": name},
            "spec": {"priority": priority, "containers": [{"name": "c", "image": "i", "resources": resources}]}}))
    }

    fn memory(bytes: i64) -> Usage {
        Usage {
            memory: BTreeMap::from([("c".to_string(), bytes)]),
            ..Default::default()
        }
    }

    #[test]
    fn thresholds_parse_as_upstream_flags() {
        let parsed = parse_thresholds(DEFAULT_HARD).expect("default");
        assert_eq!(parsed.len(), 4);
        assert_eq!(
            parsed[0],
            Threshold {
                signal: Signal::MemoryAvailable,
                amount: Amount::Quantity(100 << 20)
            }
        );
        assert_eq!(parsed[1].amount, Amount::Percent(10.0));
        assert_eq!(parsed[1].value(1000), 100);
        assert!(parse_thresholds("").expect("empty").is_empty());
        for (bad, want) in [
            ("memory.available>1Gi", "expected signal<amount"),
            ("cpu.available<1", "unknown eviction signal"),
            ("nodefs.available<110%", "outside 0-100%"),
            ("nodefs.available<lots", "invalid quantity"),
            (
                "memory.available<1Gi,memory.available<2Gi",
                "more than one threshold",
            ),
        ] {
            let err = parse_thresholds(bad).expect_err(bad);
            assert!(err.contains(want), "{bad}: {err}");
        }
    }

    #[test]
    fn thresholds_are_met_below_their_amount() {
        let thresholds =
            parse_thresholds("memory.available<100Mi,nodefs.available<10%").expect("t");
        let observations = BTreeMap::from([
            (
                Signal::MemoryAvailable,
                Observation {
                    available: 50 << 20,
                    capacity: 1 << 30,
                },
            ),
            (
                Signal::NodeFsAvailable,
                Observation {
                    available: 100,
                    capacity: 1000,
                },
            ),
        ]);
        let hit = met(&thresholds, &observations);
        assert_eq!(hit.len(), 1, "10% of 1000 is not below 100");
        assert_eq!(hit[0].0.signal, Signal::MemoryAvailable);
        // A signal that was not observed never meets its threshold.
        assert!(met(&thresholds, &BTreeMap::new()).is_empty());
    }

    #[test]
    fn conditions_hold_for_the_transition_period() {
        let threshold = parse_thresholds("nodefs.available<1Gi").expect("t")[0];
        let seen = Observation {
            available: 0,
            capacity: 1,
        };
        let mut memory = ConditionMemory::default();
        let start = Instant::now();
        let period = Duration::from_secs(30);
        assert_eq!(
            memory.update(&[(threshold, seen)], start, period),
            BTreeSet::from(["DiskPressure"])
        );
        assert_eq!(
            memory.update(&[], start + Duration::from_secs(29), period),
            BTreeSet::from(["DiskPressure"])
        );
        assert!(
            memory
                .update(&[], start + Duration::from_secs(31), period)
                .is_empty()
        );
    }

    #[test]
    fn memory_pressure_evicts_over_request_then_low_priority_then_biggest() {
        let mut candidates = vec![
            (with("within-request", 0, Some("1Gi")), memory(500 << 20)),
            (with("big", 0, None), memory(300 << 20)),
            (with("small", 0, None), memory(10 << 20)),
            (with("important", 1000, None), memory(900 << 20)),
        ];
        rank(&mut candidates, Signal::MemoryAvailable);
        let order: Vec<&str> = candidates
            .iter()
            .map(|(p, _)| p.metadata.name.as_deref().unwrap_or_default())
            .collect();
        assert_eq!(order, ["big", "small", "important", "within-request"]);
    }

    #[test]
    fn disk_pressure_evicts_the_biggest_local_storage_user() {
        let disk = |bytes: i64| Usage {
            disk: bytes,
            ..Default::default()
        };
        let mut candidates = vec![
            (with("quiet", 0, None), disk(1 << 20)),
            (with("writer", 0, None), disk(50 << 20)),
        ];
        rank(&mut candidates, Signal::NodeFsAvailable);
        assert_eq!(candidates[0].0.metadata.name.as_deref(), Some("writer"));
        let threshold = parse_thresholds("nodefs.available<20Mi").expect("t")[0];
        let observed = Observation {
            available: 8 << 20,
            capacity: 64 << 20,
        };
        assert_eq!(
            eviction_message(&threshold, &observed, &candidates[0].0, &candidates[0].1),
            "The node was low on resource: ephemeral-storage. Threshold quantity: 20Mi, available: 8Mi. Pod writer was using 50Mi of local storage. "
        );
    }

    #[test]
    fn the_memory_message_names_containers_over_their_request() {
        let threshold = parse_thresholds("memory.available<100Mi").expect("t")[0];
        let observed = Observation {
            available: 60 << 20,
            capacity: 1 << 30,
        };
        let message = eviction_message(
            &threshold,
            &observed,
            &with("p", 0, Some("10Mi")),
            &memory(30 << 20),
        );
        assert_eq!(
            message,
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 60Mi. Container c was using 30Mi, request is 10Mi, has larger consumption of memory. "
        );
    }

    #[test]
    fn admission_under_pressure_follows_upstream() {
        let best_effort = with("be", 0, None);
        let burstable = with("burst", 0, Some("10Mi"));
        let tolerant = pod(
            json!({"metadata": {"name": "t"}, "spec": {"containers": [{"name": "c", "image": "i"}],
            "tolerations": [{"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"}]}}),
        );
        let critical = with("crit", SYSTEM_CRITICAL_PRIORITY, None);
        let memory = BTreeSet::from(["MemoryPressure"]);
        assert_eq!(
            admit(&memory, &best_effort),
            Err("The node had condition: [MemoryPressure]. ".into())
        );
        assert_eq!(admit(&memory, &burstable), Ok(()));
        assert_eq!(admit(&memory, &tolerant), Ok(()));
        assert_eq!(admit(&memory, &critical), Ok(()));
        let disk = BTreeSet::from(["DiskPressure"]);
        assert!(admit(&disk, &burstable).is_err());
        assert_eq!(admit(&disk, &critical), Ok(()));
        assert_eq!(admit(&BTreeSet::new(), &best_effort), Ok(()));
    }

    #[test]
    fn meminfo_gives_memory_available() {
        let text = "MemTotal:       16384 kB\nMemFree:         1024 kB\nMemAvailable:    4096 kB\n";
        assert_eq!(
            memory_observation(text),
            Some(Observation {
                available: 4096 * 1024,
                capacity: 16384 * 1024
            })
        );
        assert_eq!(memory_observation("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn disk_usage_counts_files_and_directories() {
        let dir = std::env::temp_dir().join(format!("eviction-du-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).expect("dir");
        std::fs::write(dir.join("sub/file"), vec![1u8; 64 * 1024]).expect("file");
        let (bytes, inodes) = disk_usage(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(bytes >= 64 * 1024, "{bytes}");
        assert_eq!(inodes, 3);
        assert_eq!(disk_usage(Path::new("/nonexistent/x")), (0, 0));
    }
}
