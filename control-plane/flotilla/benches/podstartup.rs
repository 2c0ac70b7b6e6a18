//! Pod startup benchmark on a real node: `cargo build --release --workspace --bins && cargo
//! bench -p flotilla --bench podstartup` (root; containerd, runc, the CNI plugins,
//! busybox-static and nftables installed, as `tests/run` does).
//!
//! Runs `flotilla up --nodes 1` (one network-namespace node with its own containerd,
//! `flotilla kubelet` and `flotilla proxy`) and measures, through a pod watch, the time from
//! each pod's create request to the watch seeing it Running, for 100 pods of the local busybox
//! image (already on the node, so no pull: the Kubernetes SLO's definition), three times:
//! created one after another (each once the previous one runs, as upstream's sequential
//! kubelet density test does), then at 5 and at 10 per second — p50/p90/p99 against the SLO
//! (p99 ≤ 5 s) and the target (p99 ≤ 1.5 s). Each run starts on an empty node. For each run it also prints the CPU time per
//! pod of each process (API server, kubelet, proxy, runtime: containerd with its CNI calls,
//! shims and runc), which tells whether the node's cores were the limit.
//! First it prints the node's memory (RSS of the kubelet, proxy, containerd and shims) idle
//! and with 30 pods running, beside containerd's as the reference.
//! The reference, measured in the same run on the same containerd: `ctr run -d` of the same
//! image (a bare container: no sandbox, no network, no API), whose latency it prints beside
//! and divides by. It prints figures and ratios; it never asserts.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher::{self, Event};
use serde_json::json;

const PODS: usize = 100;
/// Pods running while the node's memory is measured (the node image issue's figure).
const MEMORY_PODS: usize = 30;
/// The creation rates measured after the one-by-one run (pods per second).
const RATES: [f64; 2] = [5.0, 10.0];
/// Bare containers started for the reference.
const RAW_CONTAINERS: usize = 20;
const GIVE_UP: Duration = Duration::from_secs(300);
const SLO_P99: Duration = Duration::from_secs(5);
const TARGET_P99: Duration = Duration::from_millis(1500);

/// `flotilla up`, stopped with SIGTERM (which stops its nodes) when dropped.
struct Service(Child);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        // Stopping a node with many pods left (a failed run) takes a while; a SIGKILL
        // before the end would leave its fabric namespace behind.
        let deadline = Instant::now() + Duration::from_secs(120);
        while matches!(self.0.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn flotilla_bin() -> PathBuf {
    std::env::var_os("FLOTILLA_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_flotilla")))
}

fn start_service(dir: &Path) -> anyhow::Result<(Service, String)> {
    let mut child = Command::new(flotilla_bin())
        .args(["up", "--listen", "127.0.0.1:0", "--nodes", "1"])
        .arg("--data-dir")
        .arg(dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting flotilla up --nodes 1")?;
    let stdout = child.stdout.take().context("no stdout")?;
    let service = Service(child);
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    // Keep reading, so the service never writes into a closed pipe.
    std::thread::spawn(move || for _ in reader.lines() {});
    let kubeconfig = line.trim().to_string();
    if kubeconfig.is_empty() {
        bail!("flotilla up --nodes 1 printed no kubeconfig path (see its log above)");
    }
    Ok((service, kubeconfig))
}

async fn client(kubeconfig: &str) -> anyhow::Result<kube::Client> {
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(kubeconfig)?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    Ok(kube::Client::try_from(config)?)
}

async fn wait_for_ready_node(client: &kube::Client) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ready = nodes
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .any(|node| {
                node.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            });
        if ready {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the node did not become Ready");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn pod(name: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"bench": "podstartup"}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "flotilla.local/busybox:1",
                "imagePullPolicy": "Never", "command": ["sleep", "3600"]}],
        },
    }))?)
}

/// The reference: `ctr run -d` of the same image in the node's containerd, one at a time.
/// Returns the start times and the runtime's CPU seconds for all of them (containerd and
/// the shims, counted before the containers are removed).
fn raw_container_starts(
    socket: &Path,
    service: u32,
    dir: &Path,
) -> anyhow::Result<(Vec<Duration>, f64)> {
    let runtime_cpu = || {
        cpu_by_role(service, dir)
            .get("runtime")
            .copied()
            .unwrap_or(0.0)
    };
    let before = runtime_cpu();
    let ctr = |args: &[&str]| {
        Command::new("ctr")
            .arg("--address")
            .arg(socket)
            .args(["-n", "k8s.io"])
            .args(args)
            .output()
    };
    let mut times = Vec::new();
    for index in 0..RAW_CONTAINERS {
        let id = format!("bench-raw-{index}");
        let start = Instant::now();
        let out = ctr(&[
            "run",
            "-d",
            "flotilla.local/busybox:1",
            &id,
            "sleep",
            "3600",
        ])?;
        let elapsed = start.elapsed();
        if !out.status.success() {
            bail!("ctr run: {}", String::from_utf8_lossy(&out.stderr));
        }
        times.push(elapsed);
    }
    let cpu = runtime_cpu() - before;
    for index in 0..RAW_CONTAINERS {
        let id = format!("bench-raw-{index}");
        let _ = ctr(&["tasks", "kill", "-s", "SIGKILL", &id]);
    }
    std::thread::sleep(Duration::from_millis(500));
    for index in 0..RAW_CONTAINERS {
        let id = format!("bench-raw-{index}");
        let _ = ctr(&["tasks", "delete", "-f", &id]);
        let _ = ctr(&["containers", "delete", &id]);
    }
    Ok((times, cpu))
}

/// The processes of this run: the service's pid, or a command line naming the run's
/// directory; each one's pid, `/proc` entry and command line (arguments joined by spaces).
fn run_processes(service: u32, dir: &Path) -> Vec<(u32, PathBuf, String)> {
    let needle = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_string_lossy().parse::<u32>().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline"))
                .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                .unwrap_or_default();
            (pid == service || cmdline.contains(&needle)).then(|| (pid, entry.path(), cmdline))
        })
        .collect()
}

/// CPU seconds used so far by the processes of this run (the service's pid, or a command
/// line naming the run's directory), by role. runc and the CNI plugins are counted in
/// their parents (shims, containerd) once they exit.
fn cpu_by_role(service: u32, dir: &Path) -> HashMap<&'static str, f64> {
    let mut roles: HashMap<&'static str, f64> = HashMap::new();
    for (pid, proc_dir, cmdline) in run_processes(service, dir) {
        let Ok(stat) = std::fs::read_to_string(proc_dir.join("stat")) else {
            continue;
        };
        // Fields after the parenthesised command: state is field 3; utime..cstime 14..17.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let comm = head.split_once('(').map(|(_, c)| c).unwrap_or_default();
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 = fields
            .get(11..15)
            .into_iter()
            .flatten()
            .filter_map(|f| f.parse::<f64>().ok())
            .sum();
        // The nodes' kubelets and proxies are `flotilla kubelet …` and `flotilla proxy …`.
        let component = cmdline.split(' ').nth(1).unwrap_or_default();
        let role = match comm {
            "flotilla" if pid == service => "API server and controllers",
            "flotilla" if component == "kubelet" => "kubelet",
            "flotilla" if component == "proxy" => "proxy",
            c if c.starts_with("containerd") || c == "runc" => "runtime",
            _ => "other",
        };
        // Linux reports CPU times in clock ticks of 1/100 s.
        *roles.entry(role).or_default() += ticks / 100.0;
    }
    roles
}

/// Resident memory (MiB) of this run's node daemons now, by role: the kubelet, the proxy,
/// containerd (the daemon) and the shims (one per pod).
fn node_memory(service: u32, dir: &Path) -> HashMap<&'static str, f64> {
    let mut roles: HashMap<&'static str, f64> = HashMap::new();
    for (pid, proc_dir, cmdline) in run_processes(service, dir) {
        if pid == service {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(proc_dir.join("status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .map(|rest| rest.trim().to_string())
                .unwrap_or_default()
        };
        let kib: f64 = field("VmRSS:")
            .trim_end_matches("kB")
            .trim()
            .parse()
            .unwrap_or(0.0);
        let component = cmdline.split(' ').nth(1).unwrap_or_default();
        let role = match field("Name:").as_str() {
            "flotilla" if component == "kubelet" => "kubelet",
            "flotilla" if component == "proxy" => "proxy",
            "containerd" => "containerd",
            name if name.starts_with("containerd-shim") => "shims",
            _ => continue,
        };
        *roles.entry(role).or_default() += kib / 1024.0;
    }
    roles
}

fn print_memory(title: &str, memory: &HashMap<&'static str, f64>) {
    let get = |role| memory.get(role).copied().unwrap_or(0.0);
    println!(
        "node memory (RSS), {title}: kubelet {:.1} MiB, proxy {:.1} MiB, containerd {:.1} MiB, shims {:.1} MiB; kubelet + proxy + containerd {:.1} MiB; kubelet / containerd (the reference, a Go daemon on the same node) {:.2}x; kubelet target ≤ 30 MiB",
        get("kubelet"),
        get("proxy"),
        get("containerd"),
        get("shims"),
        get("kubelet") + get("proxy") + get("containerd"),
        get("kubelet") / get("containerd").max(0.1),
    );
}

fn print_cpu(before: &HashMap<&'static str, f64>, after: &HashMap<&'static str, f64>, pods: usize) {
    let mut roles: Vec<&&str> = after.keys().collect();
    roles.sort();
    let per_pod: Vec<String> = roles
        .into_iter()
        .map(|role| {
            let used = after[*role] - before.get(*role).copied().unwrap_or(0.0);
            format!("{role} {:.0} ms", used * 1000.0 / pods as f64)
        })
        .collect();
    println!("  CPU per pod: {}", per_pod.join(", "));
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn is_running(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|phase| phase == "Running")
}

/// How the pods are created.
#[derive(Clone, Copy)]
enum Pace {
    /// Each once the previous one is Running.
    OneByOne,
    /// At this many per second.
    Rate(f64),
}

/// Creates `count` pods at `pace` and returns each one's create → Running latency, sorted.
async fn measure(
    pods: &Api<Pod>,
    count: usize,
    pace: Pace,
    prefix: &str,
) -> anyhow::Result<Vec<Duration>> {
    let mut events = watcher::watcher(pods.clone(), watcher::Config::default()).boxed();
    while let Some(event) = events.next().await {
        if matches!(event, Ok(Event::InitDone)) {
            break;
        }
    }
    let (running_tx, mut running_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    // Creates run beside the watch, which stamps each pod's Running.
    let creator = {
        let pods = pods.clone();
        let prefix = prefix.to_string();
        tokio::spawn(async move {
            let mut created = HashMap::new();
            let begin = tokio::time::Instant::now();
            for index in 0..count {
                if let Pace::Rate(rate) = pace {
                    let due = begin + Duration::from_secs_f64(index as f64 / rate);
                    tokio::time::sleep_until(due).await;
                }
                let name = format!("{prefix}-{index}");
                let at = Instant::now();
                pods.create(&PostParams::default(), &pod(&name)?).await?;
                created.insert(name.clone(), at);
                if let Pace::OneByOne = pace {
                    while let Some(running) = running_rx.recv().await {
                        if running == name {
                            break;
                        }
                    }
                }
            }
            anyhow::Ok(created)
        })
    };
    let deadline = Instant::now() + GIVE_UP;
    let mut running: HashMap<String, Instant> = HashMap::new();
    while running.len() < count {
        let next = tokio::time::timeout_at(deadline.into(), events.next()).await;
        let Ok(Some(event)) = next else {
            bail!(
                "gave up after {GIVE_UP:?}: {} of {count} Running",
                running.len()
            );
        };
        let seen = Instant::now();
        match event? {
            Event::Apply(pod) | Event::InitApply(pod) if is_running(&pod) => {
                if let Some(name) = pod.metadata.name.clone()
                    && name.starts_with(&format!("{prefix}-"))
                    && !running.contains_key(&name)
                {
                    running.insert(name.clone(), seen);
                    let _ = running_tx.send(name);
                }
            }
            _ => {}
        }
    }
    let created = creator.await??;
    let mut latencies: Vec<Duration> = running
        .iter()
        .filter_map(|(name, at)| Some(at.duration_since(*created.get(name)?)))
        .collect();
    latencies.sort();
    Ok(latencies)
}

/// Deletes the benchmark's pods and waits until none is left, in the API and in the node's
/// runtime (so the next run does not share the cores with tearing these down).
async fn delete_all(pods: &Api<Pod>, socket: &Path) -> anyhow::Result<()> {
    let selector = ListParams::default().labels("bench=podstartup");
    pods.delete_collection(&DeleteParams::default(), &selector)
        .await?;
    let deadline = Instant::now() + GIVE_UP;
    while !pods.list(&selector).await?.items.is_empty() {
        if Instant::now() > deadline {
            bail!("the benchmark's pods were not deleted within {GIVE_UP:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    loop {
        let out = Command::new("ctr")
            .arg("--address")
            .arg(socket)
            .args(["-n", "k8s.io", "containers", "list", "-q"])
            .output()?;
        if out.status.success() && out.stdout.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the node's runtime still has containers after {GIVE_UP:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn report(title: &str, latencies: &[Duration], raw: &[Duration]) -> anyhow::Result<()> {
    let p50 = percentile(latencies, 50.0);
    let p90 = percentile(latencies, 90.0);
    let p99 = percentile(latencies, 99.0);
    let raw_p50 = percentile(raw, 50.0);
    let raw_p99 = percentile(raw, 99.0);
    println!("pod startup, {PODS} pods of a local image {title} on one real node:");
    println!(
        "  create → Running: p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        ms(p50),
        ms(p90),
        ms(p99),
        ms(*latencies.last().context("no latencies")?)
    );
    println!(
        "  ratio pod / bare container (`ctr run -d`): p50 {:.1}×, p99 {:.1}×",
        p50.as_secs_f64() / raw_p50.as_secs_f64(),
        p99.as_secs_f64() / raw_p99.as_secs_f64()
    );
    println!(
        "  p99 vs the SLO (5 s): {:.2}× of it; vs the target (1.5 s): {}",
        p99.as_secs_f64() / SLO_P99.as_secs_f64(),
        if p99 <= TARGET_P99 { "met" } else { "not met" }
    );
    Ok(())
}

async fn run() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (service, kubeconfig) = start_service(dir.path())?;
    let service_pid = service.0.id();
    let client = client(&kubeconfig).await?;
    wait_for_ready_node(&client).await?;

    let socket = dir.path().join("nodes/node-1/containerd.sock");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // Per-node memory: idle (the node settled), then with 30 pods running.
    tokio::time::sleep(Duration::from_secs(5)).await;
    print_memory("idle", &node_memory(service_pid, dir.path()));
    measure(&pods, MEMORY_PODS, Pace::OneByOne, "mem").await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    print_memory(
        &format!("{MEMORY_PODS} pods running"),
        &node_memory(service_pid, dir.path()),
    );
    delete_all(&pods, &socket).await?;

    let (mut raw, raw_cpu) = raw_container_starts(&socket, service_pid, dir.path())?;
    raw.sort();
    println!(
        "reference, `ctr run -d` of the same image ({RAW_CONTAINERS} bare containers, one at a time): p50 {:.0} ms, p99 {:.0} ms; runtime CPU {:.0} ms per container",
        ms(percentile(&raw, 50.0)),
        ms(percentile(&raw, 99.0)),
        raw_cpu * 1000.0 / RAW_CONTAINERS as f64
    );

    let mut runs = vec![(
        Pace::OneByOne,
        "created one after another".to_string(),
        "seq".to_string(),
    )];
    for rate in RATES {
        runs.push((
            Pace::Rate(rate),
            format!("created at {rate}/s"),
            format!("rate{rate}"),
        ));
    }
    for (pace, title, prefix) in runs {
        let before = cpu_by_role(service_pid, dir.path());
        let latencies = measure(&pods, PODS, pace, &prefix).await?;
        let after = cpu_by_role(service_pid, dir.path());
        report(&title, &latencies, &raw)?;
        print_cpu(&before, &after, PODS);
        delete_all(&pods, &socket).await?;
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    tokio::runtime::Runtime::new()?.block_on(run())
}
