//! The node's and its containers' resource usage, as upstream's kubelet serves it from its
//! CRI stats provider: containers' CPU and memory from the runtime (`ListContainerStats`),
//! the node's from `/proc`, sampled once every housekeeping interval (cAdvisor's 10 s) so
//! that each sample carries the CPU rate over the interval before it. Served as the summary
//! API (`/stats/summary`, `stats/v1alpha1`, what metrics-server's summary source and the
//! control plane's `metrics.k8s.io` read) and as the resource metrics endpoint
//! (`/metrics/resource`, Prometheus text, what metrics-server reads today). A pod's usage is
//! the sum of its containers' (the kubelet sets no pod-level cgroups).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use k8s_cri::v1 as cri;
use serde_json::{Value, json};

use crate::cri::Cri;
use crate::translate::{CONTAINER_NAME_LABEL, POD_NAME_LABEL, POD_NAMESPACE_LABEL, POD_UID_LABEL};

/// How often usage is sampled (cAdvisor's housekeeping interval); the CPU rates are over it.
pub const HOUSEKEEPING_INTERVAL: Duration = Duration::from_secs(10);

/// `USER_HZ`: the unit of `/proc/stat`'s CPU times on every Linux architecture we build for.
const NANOS_PER_TICK: u64 = 10_000_000;

/// CPU at one instant: the cumulative time and, when an earlier sample exists, the rate since.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Cpu {
    /// When, in nanoseconds since the epoch.
    pub at_nanos: i64,
    /// Cumulative core-nanoseconds.
    pub usage_core_nano_seconds: u64,
    /// Core-nanoseconds per second over the interval before `at_nanos`.
    pub usage_nano_cores: Option<u64>,
}

/// Memory at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Memory {
    /// When, in nanoseconds since the epoch.
    pub at_nanos: i64,
    /// Everything in use, caches included.
    pub usage_bytes: u64,
    /// What cannot be reclaimed under pressure (usage less the inactive file cache): what
    /// `kubectl top` shows and eviction ranks by.
    pub working_set_bytes: u64,
    /// Anonymous memory.
    pub rss_bytes: u64,
    /// What is left under the limit (the node's capacity for the node).
    pub available_bytes: Option<u64>,
}

/// One container's sample.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerUsage {
    /// The runtime's ID.
    pub id: String,
    /// The container's name in its pod.
    pub name: String,
    /// Its pod's namespace, name and UID.
    pub pod: PodRef,
    /// When the runtime created it, in nanoseconds since the epoch.
    pub created_nanos: i64,
    /// CPU.
    pub cpu: Cpu,
    /// Memory.
    pub memory: Memory,
}

/// A pod, as the summary API names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

/// Everything one housekeeping pass saw.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// The node's own usage.
    pub node_cpu: Cpu,
    /// The node's memory.
    pub node_memory: Memory,
    /// Every running container's.
    pub containers: Vec<ContainerUsage>,
    /// Whether the runtime's stats could not be read (`resource_scrape_error`).
    pub runtime_error: bool,
}

/// The latest sample, shared by the sampler and the server.
#[derive(Debug, Default)]
pub struct Stats {
    latest: Mutex<Arc<Sample>>,
}

impl Stats {
    /// The latest sample (empty until the first pass).
    pub fn latest(&self) -> Arc<Sample> {
        self.latest
            .lock()
            .map(|latest| latest.clone())
            .unwrap_or_default()
    }

    fn store(&self, sample: Sample) {
        if let Ok(mut latest) = self.latest.lock() {
            *latest = Arc::new(sample);
        }
    }
}

/// Samples every [`HOUSEKEEPING_INTERVAL`] until the task is dropped.
pub async fn run(stats: Arc<Stats>, mut cri: Cri) {
    let mut ticker = tokio::time::interval(HOUSEKEEPING_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let previous = stats.latest();
        let sample = sample(&mut cri, &previous).await;
        stats.store(sample);
    }
}

/// One housekeeping pass, its rates against `previous`.
async fn sample(cri: &mut Cri, previous: &Sample) -> Sample {
    let now = now_nanos();
    let proc_stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let node_cpu = Cpu {
        at_nanos: now,
        usage_core_nano_seconds: node_cpu_nanos(&proc_stat).unwrap_or(0),
        usage_nano_cores: None,
    };
    let node_cpu = with_rate(node_cpu, Some(&previous.node_cpu));
    let node_memory = node_memory(&meminfo, now).unwrap_or_default();
    let (containers, runtime_error) = match container_usage(cri).await {
        Ok(containers) => (containers, false),
        Err(err) => {
            tracing::warn!(%err, "reading the containers' stats failed");
            (Vec::new(), true)
        }
    };
    let before: HashMap<&str, &Cpu> = previous
        .containers
        .iter()
        .map(|c| (c.id.as_str(), &c.cpu))
        .collect();
    let containers = containers
        .into_iter()
        .map(|mut container| {
            container.cpu = with_rate(container.cpu, before.get(container.id.as_str()).copied());
            container
        })
        .collect();
    Sample {
        node_cpu,
        node_memory,
        containers,
        runtime_error,
    }
}

/// `cpu` with its rate since `before`, when that is an earlier sample of the same counter
/// (a counter that went back is a restarted container: no rate until the next pass). A
/// rate the runtime computed itself is kept when there is no earlier sample.
fn with_rate(mut cpu: Cpu, before: Option<&Cpu>) -> Cpu {
    let Some(before) = before else {
        cpu.usage_nano_cores = cpu.usage_nano_cores.filter(|rate| *rate > 0);
        return cpu;
    };
    let elapsed = cpu.at_nanos.saturating_sub(before.at_nanos);
    cpu.usage_nano_cores = match (
        u64::try_from(elapsed),
        cpu.usage_core_nano_seconds
            .checked_sub(before.usage_core_nano_seconds),
    ) {
        (Ok(elapsed), Some(used)) if elapsed > 0 => {
            Some((u128::from(used) * 1_000_000_000 / u128::from(elapsed)) as u64)
        }
        _ => None,
    };
    cpu
}

/// Every running container's usage from the runtime, with its pod from its labels.
async fn container_usage(cri: &mut Cri) -> Result<Vec<ContainerUsage>, crate::cri::CriError> {
    let created: HashMap<String, i64> = cri
        .all_containers()
        .await?
        .into_iter()
        .filter(|c| c.state() == cri::ContainerState::ContainerRunning)
        .map(|c| (c.id, c.created_at))
        .collect();
    let stats = cri
        .runtime
        .list_container_stats(cri::ListContainerStatsRequest { filter: None })
        .await
        .map_err(crate::cri::call("ListContainerStats"))?
        .into_inner()
        .stats;
    Ok(stats
        .into_iter()
        .filter_map(|stats| container_from(stats, &created))
        .collect())
}

/// One container's stats, if it is a running container of a pod.
fn container_from(
    stats: cri::ContainerStats,
    created: &HashMap<String, i64>,
) -> Option<ContainerUsage> {
    let attributes = stats.attributes?;
    let created_nanos = *created.get(&attributes.id)?;
    let label = |name: &str| attributes.labels.get(name).cloned();
    let pod = PodRef {
        namespace: label(POD_NAMESPACE_LABEL)?,
        name: label(POD_NAME_LABEL)?,
        uid: label(POD_UID_LABEL)?,
    };
    let name = label(CONTAINER_NAME_LABEL).or_else(|| attributes.metadata.map(|m| m.name))?;
    let cpu = stats.cpu.map(|cpu| Cpu {
        at_nanos: cpu.timestamp,
        usage_core_nano_seconds: cpu.usage_core_nano_seconds.map_or(0, |v| v.value),
        usage_nano_cores: cpu.usage_nano_cores.map(|v| v.value),
    })?;
    let memory = stats.memory.map(|memory| Memory {
        at_nanos: memory.timestamp,
        usage_bytes: memory.usage_bytes.map_or(0, |v| v.value),
        working_set_bytes: memory.working_set_bytes.map_or(0, |v| v.value),
        rss_bytes: memory.rss_bytes.map_or(0, |v| v.value),
        available_bytes: memory.available_bytes.map(|v| v.value).filter(|v| *v > 0),
    })?;
    Some(ContainerUsage {
        id: attributes.id,
        name,
        pod,
        created_nanos,
        cpu,
        memory,
    })
}

/// The node's busy CPU time from `/proc/stat`'s first line, in core-nanoseconds: every field
/// but idle and iowait (guest time is already in user time).
pub fn node_cpu_nanos(proc_stat: &str) -> Option<u64> {
    let line = proc_stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let field = |index: usize| ticks.get(index).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal
    let busy = field(0) + field(1) + field(2) + field(5) + field(6) + field(7);
    Some(busy.saturating_mul(NANOS_PER_TICK))
}

/// The node's memory from `/proc/meminfo` as cAdvisor reads the root container: usage is
/// what is not free, the working set that less the inactive file cache.
pub fn node_memory(meminfo: &str, at_nanos: i64) -> Option<Memory> {
    let kib = |name: &str| -> Option<u64> {
        let line = meminfo.lines().find(|l| l.starts_with(name))?;
        line[name.len()..].split_whitespace().next()?.parse().ok()
    };
    let total = kib("MemTotal:")? * 1024;
    let free = kib("MemFree:")? * 1024;
    let inactive_file = kib("Inactive(file):").unwrap_or(0) * 1024;
    let anon = kib("AnonPages:").unwrap_or(0) * 1024;
    let usage = total.saturating_sub(free);
    let working_set = usage.saturating_sub(inactive_file);
    Some(Memory {
        at_nanos,
        usage_bytes: usage,
        working_set_bytes: working_set,
        rss_bytes: anon,
        available_bytes: Some(total.saturating_sub(working_set)),
    })
}

fn now_nanos() -> i64 {
    Utc::now().timestamp_nanos_opt().unwrap_or(0)
}

/// RFC 3339 as Go's `metav1.Time` writes it.
fn time(nanos: i64) -> String {
    DateTime::<Utc>::from_timestamp_nanos(nanos).to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn cpu_json(cpu: &Cpu) -> Value {
    let mut out = json!({"time": time(cpu.at_nanos)});
    if let Some(rate) = cpu.usage_nano_cores {
        out["usageNanoCores"] = json!(rate);
    }
    out["usageCoreNanoSeconds"] = json!(cpu.usage_core_nano_seconds);
    out
}

fn memory_json(memory: &Memory) -> Value {
    let mut out = json!({"time": time(memory.at_nanos)});
    if let Some(available) = memory.available_bytes {
        out["availableBytes"] = json!(available);
    }
    out["usageBytes"] = json!(memory.usage_bytes);
    out["workingSetBytes"] = json!(memory.working_set_bytes);
    out["rssBytes"] = json!(memory.rss_bytes);
    out
}

/// The containers of `sample` by pod, in a stable order.
fn by_pod(sample: &Sample) -> BTreeMap<&PodRef, Vec<&ContainerUsage>> {
    let mut pods: BTreeMap<&PodRef, Vec<&ContainerUsage>> = BTreeMap::new();
    for container in &sample.containers {
        pods.entry(&container.pod).or_default().push(container);
    }
    for containers in pods.values_mut() {
        containers.sort_by(|a, b| a.name.cmp(&b.name));
    }
    pods
}

/// A pod's usage: its containers' summed, at the latest of their times (a rate only when
/// every container has one).
fn pod_usage(containers: &[&ContainerUsage]) -> (Cpu, Memory) {
    let mut cpu = Cpu {
        usage_nano_cores: Some(0),
        ..Cpu::default()
    };
    let mut memory = Memory::default();
    for container in containers {
        cpu.at_nanos = cpu.at_nanos.max(container.cpu.at_nanos);
        cpu.usage_core_nano_seconds += container.cpu.usage_core_nano_seconds;
        cpu.usage_nano_cores = cpu
            .usage_nano_cores
            .zip(container.cpu.usage_nano_cores)
            .map(|(a, b)| a + b);
        memory.at_nanos = memory.at_nanos.max(container.memory.at_nanos);
        memory.usage_bytes += container.memory.usage_bytes;
        memory.working_set_bytes += container.memory.working_set_bytes;
        memory.rss_bytes += container.memory.rss_bytes;
    }
    (cpu, memory)
}

/// `GET /stats/summary` (`stats/v1alpha1` `Summary`).
pub fn summary(node_name: &str, boot_nanos: i64, sample: &Sample) -> Value {
    let pods: Vec<Value> = by_pod(sample)
        .into_iter()
        .map(|(pod, containers)| {
            let (cpu, memory) = pod_usage(&containers);
            let started = containers
                .iter()
                .map(|c| c.created_nanos)
                .min()
                .unwrap_or(0);
            json!({
                "podRef": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
                "startTime": time(started),
                "containers": containers.iter().map(|c| json!({
                    "name": c.name,
                    "startTime": time(c.created_nanos),
                    "cpu": cpu_json(&c.cpu),
                    "memory": memory_json(&c.memory),
                })).collect::<Vec<_>>(),
                "cpu": cpu_json(&cpu),
                "memory": memory_json(&memory),
            })
        })
        .collect();
    json!({
        "node": {
            "nodeName": node_name,
            "startTime": time(boot_nanos),
            "cpu": cpu_json(&sample.node_cpu),
            "memory": memory_json(&sample.node_memory),
        },
        "pods": pods,
    })
}

/// When the machine booted, from `/proc/stat`'s `btime` (the node's `startTime`).
pub fn boot_nanos(proc_stat: &str) -> i64 {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|seconds| seconds.trim().parse::<i64>().ok())
        .map_or(0, |seconds| seconds.saturating_mul(1_000_000_000))
}

/// One metric family's header, as the Prometheus client writes it.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} [STABLE] {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A label value escaped as the text format requires.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `GET /metrics/resource`: upstream's resource metrics, with each sample's time.
pub fn resource_metrics(sample: &Sample) -> String {
    let mut out = String::new();
    let seconds = |nanos: u64| nanos as f64 / 1e9;
    let millis = |nanos: i64| nanos / 1_000_000;
    let container_labels = |c: &ContainerUsage| {
        format!(
            "container=\"{}\",namespace=\"{}\",pod=\"{}\"",
            label(&c.name),
            label(&c.pod.namespace),
            label(&c.pod.name)
        )
    };
    let mut containers: Vec<&ContainerUsage> = sample.containers.iter().collect();
    containers.sort_by(|a, b| (&a.pod, &a.name).cmp(&(&b.pod, &b.name)));
    family(
        &mut out,
        "container_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the container in core-seconds",
    );
    for c in &containers {
        let _ = writeln!(
            out,
            "container_cpu_usage_seconds_total{{{}}} {} {}",
            container_labels(c),
            seconds(c.cpu.usage_core_nano_seconds),
            millis(c.cpu.at_nanos)
        );
    }
    family(
        &mut out,
        "container_memory_working_set_bytes",
        "gauge",
        "Current working set of the container in bytes",
    );
    for c in &containers {
        let _ = writeln!(
            out,
            "container_memory_working_set_bytes{{{}}} {} {}",
            container_labels(c),
            c.memory.working_set_bytes,
            millis(c.memory.at_nanos)
        );
    }
    family(
        &mut out,
        "container_start_time_seconds",
        "gauge",
        "Start time of the container since unix epoch in seconds",
    );
    for c in &containers {
        let _ = writeln!(
            out,
            "container_start_time_seconds{{{}}} {} {}",
            container_labels(c),
            c.created_nanos as f64 / 1e9,
            millis(c.created_nanos)
        );
    }
    family(
        &mut out,
        "node_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the node in core-seconds",
    );
    let _ = writeln!(
        out,
        "node_cpu_usage_seconds_total {} {}",
        seconds(sample.node_cpu.usage_core_nano_seconds),
        millis(sample.node_cpu.at_nanos)
    );
    family(
        &mut out,
        "node_memory_working_set_bytes",
        "gauge",
        "Current working set of the node in bytes",
    );
    let _ = writeln!(
        out,
        "node_memory_working_set_bytes {} {}",
        sample.node_memory.working_set_bytes,
        millis(sample.node_memory.at_nanos)
    );
    let pods = by_pod(sample);
    family(
        &mut out,
        "pod_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the pod in core-seconds",
    );
    for (pod, containers) in &pods {
        let (cpu, _) = pod_usage(containers);
        let _ = writeln!(
            out,
            "pod_cpu_usage_seconds_total{{namespace=\"{}\",pod=\"{}\"}} {} {}",
            label(&pod.namespace),
            label(&pod.name),
            seconds(cpu.usage_core_nano_seconds),
            millis(cpu.at_nanos)
        );
    }
    family(
        &mut out,
        "pod_memory_working_set_bytes",
        "gauge",
        "Current working set of the pod in bytes",
    );
    for (pod, containers) in &pods {
        let (_, memory) = pod_usage(containers);
        let _ = writeln!(
            out,
            "pod_memory_working_set_bytes{{namespace=\"{}\",pod=\"{}\"}} {} {}",
            label(&pod.namespace),
            label(&pod.name),
            memory.working_set_bytes,
            millis(memory.at_nanos)
        );
    }
    family(
        &mut out,
        "resource_scrape_error",
        "gauge",
        "1 if there was an error while getting container metrics, 0 otherwise",
    );
    let _ = writeln!(
        out,
        "resource_scrape_error {}",
        u8::from(sample.runtime_error)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(
        pod: &str,
        name: &str,
        cpu_nanos: u64,
        rate: Option<u64>,
        memory: u64,
    ) -> ContainerUsage {
        ContainerUsage {
            id: format!("{pod}-{name}"),
            name: name.into(),
            pod: PodRef {
                namespace: "shop".into(),
                name: pod.into(),
                uid: format!("uid-{pod}"),
            },
            created_nanos: 1_700_000_000_000_000_000,
            cpu: Cpu {
                at_nanos: 1_700_000_100_000_000_000,
                usage_core_nano_seconds: cpu_nanos,
                usage_nano_cores: rate,
            },
            memory: Memory {
                at_nanos: 1_700_000_100_000_000_000,
                usage_bytes: memory * 2,
                working_set_bytes: memory,
                rss_bytes: memory / 2,
                available_bytes: None,
            },
        }
    }

    #[test]
    fn the_node_cpu_is_every_busy_field_of_the_first_line_in_nanoseconds() {
        let stat =
            "cpu  100 5 50 9000 20 3 2 1 7 0\ncpu0 50 2 25 4500 10 1 1 0 3 0\nbtime 1700000000\n";
        assert_eq!(
            node_cpu_nanos(stat),
            Some((100 + 5 + 50 + 3 + 2 + 1) * NANOS_PER_TICK)
        );
        assert_eq!(boot_nanos(stat), 1_700_000_000_000_000_000);
        assert_eq!(node_cpu_nanos("intr 1 2"), None);
    }

    #[test]
    fn the_node_working_set_is_what_is_not_free_less_the_inactive_file_cache() {
        let meminfo = "MemTotal:       1000 kB\nMemFree:         200 kB\nMemAvailable:    600 kB\nAnonPages:       300 kB\nInactive(file):  100 kB\n";
        let memory = node_memory(meminfo, 5).expect("parsed");
        assert_eq!(memory.usage_bytes, 800 * 1024);
        assert_eq!(memory.working_set_bytes, 700 * 1024);
        assert_eq!(memory.rss_bytes, 300 * 1024);
        assert_eq!(memory.available_bytes, Some(300 * 1024));
    }

    #[test]
    fn a_rate_is_the_counter_over_the_interval_and_none_after_a_restart() {
        let before = Cpu {
            at_nanos: 0,
            usage_core_nano_seconds: 1_000_000_000,
            usage_nano_cores: None,
        };
        let now = Cpu {
            at_nanos: 10_000_000_000,
            usage_core_nano_seconds: 6_000_000_000,
            usage_nano_cores: None,
        };
        // 5 core-seconds in 10 s: half a core.
        assert_eq!(
            with_rate(now, Some(&before)).usage_nano_cores,
            Some(500_000_000)
        );
        let restarted = Cpu {
            usage_core_nano_seconds: 10,
            ..now
        };
        assert_eq!(with_rate(restarted, Some(&before)).usage_nano_cores, None);
        // No earlier sample: the runtime's own rate, when it has one.
        let own = Cpu {
            usage_nano_cores: Some(7),
            ..now
        };
        assert_eq!(with_rate(own, None).usage_nano_cores, Some(7));
        assert_eq!(with_rate(now, None).usage_nano_cores, None);
    }

    #[test]
    fn the_summary_groups_containers_by_pod_and_sums_them() {
        let sample = Sample {
            containers: vec![
                container("web-1", "web", 3_000, Some(200), 1000),
                container("web-1", "sidecar", 1_000, Some(100), 500),
                container("db-0", "db", 5_000, None, 4000),
            ],
            ..Sample::default()
        };
        let summary = summary("node-a", 0, &sample);
        assert_eq!(summary["node"]["nodeName"], "node-a");
        let pods = summary["pods"].as_array().expect("pods");
        assert_eq!(pods.len(), 2);
        let web = &pods[1];
        assert_eq!(web["podRef"]["name"], "web-1");
        assert_eq!(web["podRef"]["uid"], "uid-web-1");
        assert_eq!(web["containers"][0]["name"], "sidecar");
        assert_eq!(web["cpu"]["usageNanoCores"], 300);
        assert_eq!(web["cpu"]["usageCoreNanoSeconds"], 4_000);
        assert_eq!(web["memory"]["workingSetBytes"], 1500);
        assert_eq!(web["startTime"], "2023-11-14T22:13:20Z");
        // A container without a rate leaves its pod without one.
        assert!(pods[0]["cpu"].get("usageNanoCores").is_none());
    }

    #[test]
    fn resource_metrics_are_upstreams_families_with_escaped_labels() {
        let sample = Sample {
            containers: vec![container("web\"1", "web", 2_500_000_000, Some(1), 1024)],
            node_cpu: Cpu {
                at_nanos: 2_000_000,
                usage_core_nano_seconds: 1_500_000_000,
                usage_nano_cores: None,
            },
            ..Sample::default()
        };
        let text = resource_metrics(&sample);
        assert!(text.contains(
            "container_cpu_usage_seconds_total{container=\"web\",namespace=\"shop\",pod=\"web\\\"1\"} 2.5 1700000100000\n"
        ));
        assert!(text.contains(
            "# TYPE node_cpu_usage_seconds_total counter\nnode_cpu_usage_seconds_total 1.5 2\n"
        ));
        assert!(text.contains(
            "pod_memory_working_set_bytes{namespace=\"shop\",pod=\"web\\\"1\"} 1024 1700000100000\n"
        ));
        assert!(text.ends_with("resource_scrape_error 0\n"));
    }
}
