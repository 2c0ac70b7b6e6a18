//! The fault-injection suite (Jepsen's method): a three-member etcd cluster and two
//! `flotilla serve` replicas, each on a network namespace of its own, under a workload of
//! kube-rs clients across two tenants, while named nemeses kill, pause and cut off etcd
//! members and replicas. The checker ([`checker`]) then looks for lost acknowledged writes,
//! stale reads, updates applied on a stale `resourceVersion`, and watch gaps; the suite prints
//! a table per nemesis with the operations acknowledged, the anomalies, the outage clients saw
//! and the recovery time.
//!
//! `tests/run` runs the short schedule (each nemesis once, about two minutes). The long one —
//! faults every 30 s for `FLOTILLA_FAULTS_SECONDS` (600 for the soak), with the replicas' RSS,
//! open files and p99 latency at its start and end, the workload paced to 70 % of the rate it
//! reaches unpaced — runs with that variable set; `FLOTILLA_FAULTS_NEMESES=a,b` picks the
//! nemeses (by [`Nemesis::key`]). Each run prints its seed; `FLOTILLA_FAULTS_SEED=N` replays
//! the same choices.

#[path = "faults/checker.rs"]
mod checker;
#[path = "faults/disks.rs"]
mod disks;
#[path = "faults/topology.rs"]
mod topology;
#[path = "faults/workload.rs"]
mod workload;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use flotilla_e2e::FlotillaCli;
use k8s_openapi::api::coordination::v1::Lease;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use checker::{History, Kind};
use topology::Topology;
use workload::{Shared, Tenant};

/// How long each replica's hold on its clusters' control loops lasts (the default is 15 s;
/// shorter here so a failover fits the schedule).
const LEASE: Duration = Duration::from_secs(5);
/// How long each fault lasts before it is healed, and how long the service is then left alone.
const FAULT: Duration = Duration::from_secs(5);
const SETTLE: Duration = Duration::from_secs(4);
/// What the slow disk manages: a few writes a second, as a failing or starved disk does
/// (etcd warns at 10 ms per `fdatasync`; here one takes 50 ms or more).
const SLOW_DISK_IOPS: u32 = 20;
const TENANTS: [&str; 2] = ["a", "b"];
const CLIENTS_PER_TENANT: usize = 3;
const KEYS_PER_CLIENT: usize = 4;

/// The faults, each named as the report names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Nemesis {
    KillEtcdLeader,
    PauseEtcdLeader,
    KillEtcdFollower,
    PauseEtcdFollower,
    PartitionEtcdLeader,
    PartitionReplicaFromEtcd,
    KillLoopHolder,
    PauseReplica,
    FillEtcdFollowerDisk,
    JumpReplicaClock,
    SlowEtcdLeaderDisk,
}

const NEMESES: [Nemesis; 11] = [
    Nemesis::KillEtcdLeader,
    Nemesis::PauseEtcdLeader,
    Nemesis::KillEtcdFollower,
    Nemesis::PauseEtcdFollower,
    Nemesis::PartitionEtcdLeader,
    Nemesis::PartitionReplicaFromEtcd,
    Nemesis::KillLoopHolder,
    Nemesis::PauseReplica,
    Nemesis::FillEtcdFollowerDisk,
    Nemesis::JumpReplicaClock,
    Nemesis::SlowEtcdLeaderDisk,
];

impl Nemesis {
    /// What `FLOTILLA_FAULTS_NEMESES` calls it.
    fn key(self) -> &'static str {
        match self {
            Nemesis::KillEtcdLeader => "kill-etcd-leader",
            Nemesis::PauseEtcdLeader => "pause-etcd-leader",
            Nemesis::KillEtcdFollower => "kill-etcd-follower",
            Nemesis::PauseEtcdFollower => "pause-etcd-follower",
            Nemesis::PartitionEtcdLeader => "partition-etcd-leader",
            Nemesis::PartitionReplicaFromEtcd => "partition-replica",
            Nemesis::KillLoopHolder => "kill-loop-holder",
            Nemesis::PauseReplica => "pause-replica",
            Nemesis::FillEtcdFollowerDisk => "fill-etcd-disk",
            Nemesis::JumpReplicaClock => "jump-replica-clock",
            Nemesis::SlowEtcdLeaderDisk => "slow-etcd-disk",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Nemesis::KillEtcdLeader => "SIGKILL the etcd leader",
            Nemesis::PauseEtcdLeader => "SIGSTOP the etcd leader",
            Nemesis::KillEtcdFollower => "SIGKILL an etcd follower",
            Nemesis::PauseEtcdFollower => "SIGSTOP an etcd follower",
            Nemesis::PartitionEtcdLeader => "partition the etcd leader",
            Nemesis::PartitionReplicaFromEtcd => "partition a replica from etcd",
            Nemesis::KillLoopHolder => "SIGKILL the control loops' replica",
            Nemesis::PauseReplica => "SIGSTOP a replica",
            Nemesis::FillEtcdFollowerDisk => "fill an etcd follower's disk",
            Nemesis::JumpReplicaClock => "jump a replica's wall clock",
            Nemesis::SlowEtcdLeaderDisk => "slow the etcd leader's disk",
        }
    }
}

/// What one nemesis did and when (ms from the start of the workload).
struct Window {
    nemesis: &'static str,
    target: String,
    start: f64,
    healed: f64,
    end: f64,
    /// For the control loops' replica: when another replica held tenant a's Lease.
    failover: Option<f64>,
}

/// Injects `nemesis`, waits [`FAULT`], heals it; returns what it hit.
fn inject(
    nemesis: Nemesis,
    topology: &mut Topology,
    rng: &mut StdRng,
    runtime: &tokio::runtime::Runtime,
    lease_readers: &[kube::Client],
    shared: &Shared,
) -> anyhow::Result<(String, f64, Option<f64>)> {
    let mut failover = None;
    let target;
    match nemesis {
        Nemesis::KillEtcdLeader
        | Nemesis::PauseEtcdLeader
        | Nemesis::KillEtcdFollower
        | Nemesis::PauseEtcdFollower => {
            let leader = topology.etcd_leader()?;
            let victim = if matches!(
                nemesis,
                Nemesis::KillEtcdFollower | Nemesis::PauseEtcdFollower
            ) {
                let followers: Vec<usize> = (0..topology.members.len())
                    .filter(|i| *i != leader)
                    .collect();
                followers[rng.random_range(0..followers.len())]
            } else {
                leader
            };
            let member = &mut topology.members[victim];
            target = member.name.clone();
            if matches!(
                nemesis,
                Nemesis::PauseEtcdLeader | Nemesis::PauseEtcdFollower
            ) {
                member.daemon.signal("STOP")?;
                std::thread::sleep(FAULT);
                member.daemon.signal("CONT")?;
            } else {
                member.daemon.kill();
                std::thread::sleep(FAULT);
                member.daemon.restart()?;
            }
        }
        Nemesis::FillEtcdFollowerDisk => {
            let leader = topology.etcd_leader()?;
            let followers: Vec<usize> = (0..topology.members.len())
                .filter(|i| *i != leader)
                .collect();
            let member = &mut topology.members[followers[rng.random_range(0..followers.len())]];
            member.disk.fill()?;
            std::thread::sleep(FAULT);
            member.disk.free()?;
            // etcd stops on a failed WAL write, as it should; it is started again on the
            // freed disk, as a supervisor would.
            target = if member.daemon.running() {
                format!("{} (kept running)", member.name)
            } else {
                member.daemon.restart()?;
                format!("{} (stopped, restarted)", member.name)
            };
        }
        Nemesis::SlowEtcdLeaderDisk => {
            // A disk that takes SLOW_DISK_IOPS writes a second: each fdatasync of the
            // leader's WAL and database waits its turn.
            let leader = topology.etcd_leader()?;
            let member = &topology.members[leader];
            target = format!("{} ({SLOW_DISK_IOPS} writes/s)", member.name);
            member.disk.throttle(SLOW_DISK_IOPS)?;
            std::thread::sleep(FAULT);
            member.disk.throttle(0)?;
        }
        Nemesis::PartitionEtcdLeader => {
            let leader = topology.etcd_leader()?;
            let others = topology.other_ips(&topology.members[leader].machine.ip);
            let others: Vec<&str> = others.iter().map(String::as_str).collect();
            let member = &topology.members[leader];
            target = member.name.clone();
            member.machine.cut_off_from(&others)?;
            std::thread::sleep(FAULT);
            member.machine.heal()?;
        }
        Nemesis::PartitionReplicaFromEtcd => {
            let etcd: Vec<String> = topology
                .members
                .iter()
                .map(|m| m.machine.ip.clone())
                .collect();
            let etcd: Vec<&str> = etcd.iter().map(String::as_str).collect();
            let replica = &topology.replicas[rng.random_range(0..topology.replicas.len())];
            target = replica.id.clone();
            replica.machine.cut_off_from(&etcd)?;
            std::thread::sleep(FAULT);
            replica.machine.heal()?;
        }
        Nemesis::JumpReplicaClock => {
            // Forward or back by half a minute to ten minutes (an NTP step after a VM's
            // pause), then back in step: nothing may depend on two replicas' clocks agreeing.
            let index = rng.random_range(0..topology.replicas.len());
            let replica = &topology.replicas[index];
            let seconds = rng.random_range(30..=600) * if rng.random_bool(0.5) { 1 } else { -1 };
            target = format!("{} ({seconds:+} s)", replica.id);
            let moved = Instant::now();
            replica.set_clock_offset(seconds)?;
            // The nemesis checks that it took: the replica dates a new object by its clock.
            std::thread::sleep(Duration::from_millis(1500));
            let offset = runtime.block_on(wall_clock_offset(&lease_readers[index]))?;
            ensure!(
                (offset - seconds as f64).abs() < 5.0,
                "{}'s clock reads {offset:+.0} s from the host's, not {seconds:+} s",
                replica.id
            );
            std::thread::sleep(FAULT.saturating_sub(moved.elapsed()));
            replica.set_clock_offset(0)?;
        }
        Nemesis::PauseReplica => {
            let replica = &topology.replicas[rng.random_range(0..topology.replicas.len())];
            target = replica.id.clone();
            replica.daemon.signal("STOP")?;
            std::thread::sleep(FAULT);
            replica.daemon.signal("CONT")?;
        }
        Nemesis::KillLoopHolder => {
            // Between a release and the next take the Lease names nobody: wait for a holder.
            let deadline = Instant::now() + LEASE * 3;
            let holder = loop {
                let holder = runtime
                    .block_on(lease_holder(lease_readers))
                    .unwrap_or_default();
                if !holder.is_empty() || Instant::now() > deadline {
                    break holder;
                }
                std::thread::sleep(Duration::from_millis(100));
            };
            let victim = topology
                .replicas
                .iter()
                .position(|r| holder.starts_with(&format!("{}_", r.id)))
                .with_context(|| format!("tenant a's loops are held by {holder:?}"))?;
            target = topology.replicas[victim].id.clone();
            let killed = Instant::now();
            let killed_at = shared.now();
            topology.replicas[victim].daemon.kill();
            // The survivor takes the loops once the dead replica's lease runs out.
            let deadline = killed + LEASE * 4;
            while Instant::now() < deadline {
                let now = runtime
                    .block_on(lease_holder(lease_readers))
                    .unwrap_or_default();
                if !now.is_empty() && now != holder {
                    failover = Some(shared.now() - killed_at);
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let remaining = FAULT.saturating_sub(killed.elapsed());
            std::thread::sleep(remaining);
            topology.replicas[victim].daemon.restart()?;
        }
    }
    Ok((target, shared.now(), failover))
}

/// How far (s) the clock of the replica behind `client` is from the host's, by the
/// `creationTimestamp` it gives a new object.
async fn wall_clock_offset(client: &kube::Client) -> anyhow::Result<f64> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let probes: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), "kube-public");
    let probe = ConfigMap {
        metadata: kube::api::ObjectMeta {
            generate_name: Some("clock-probe-".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let before = time::OffsetDateTime::now_utc();
    let created = probes.create(&Default::default(), &probe).await?;
    let after = time::OffsetDateTime::now_utc();
    let stamped = created
        .metadata
        .creation_timestamp
        .context("the probe has no creationTimestamp")?
        .0
        .as_millisecond();
    let host = (before.unix_timestamp_nanos() + after.unix_timestamp_nanos()) / 2_000_000;
    if let Some(name) = created.metadata.name {
        probes.delete(&name, &Default::default()).await?;
    }
    Ok((stamped as f64 - host as f64) / 1000.0)
}

/// Who holds tenant a's control loops (its `kube-system/kube-controller-manager` Lease), as
/// the first replica that answers says.
async fn lease_holder(clients: &[kube::Client]) -> anyhow::Result<String> {
    let mut last_error = anyhow::anyhow!("no replica to ask");
    for client in clients {
        let leases: kube::Api<Lease> = kube::Api::namespaced(client.clone(), "kube-system");
        match tokio::time::timeout(
            Duration::from_millis(500),
            leases.get("kube-controller-manager"),
        )
        .await
        {
            Ok(Ok(lease)) => {
                return Ok(lease
                    .spec
                    .and_then(|s| s.holder_identity)
                    .unwrap_or_default());
            }
            Ok(Err(error)) => last_error = error.into(),
            Err(elapsed) => last_error = elapsed.into(),
        }
    }
    Err(last_error)
}

/// A process's resident set (KiB) and open file descriptors.
fn process_figures(pid: u32) -> (u64, usize) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0);
    (rss, fds)
}

fn p99(latencies: &mut [f64]) -> f64 {
    if latencies.is_empty() {
        return 0.0;
    }
    latencies.sort_by(f64::total_cmp);
    latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)]
}

/// `FLOTILLA_FAULTS_SEED`, or a new one; printed either way.
fn seed() -> anyhow::Result<u64> {
    let seed: u64 = match std::env::var("FLOTILLA_FAULTS_SEED") {
        Ok(seed) => seed.parse().context("FLOTILLA_FAULTS_SEED is a number")?,
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos() as u64,
    };
    println!("fault suite: seed {seed} (FLOTILLA_FAULTS_SEED={seed} replays it)");
    Ok(seed)
}

/// The variant on `flotilla up`'s embedded store, its data directory on a small disk of its
/// own: SIGKILLed while the workload's writes are in flight (mid-batch: the store commits
/// concurrent writes in one transaction), and its disk filled then freed.
#[test]
fn flotilla_up_killed_mid_batch_or_out_of_disk_loses_no_acknowledged_write() -> anyhow::Result<()> {
    let suite_started = Instant::now();
    let seed = seed()?;
    let dir = tempfile::tempdir()?;
    // Dropped after the service (declared first): unmounted once nothing writes to it.
    let disk = disks::Tmpfs::mount(dir.path(), "256m")?;
    let mut service = flotilla_e2e::Flotilla::up_in(flotilla_e2e::Backend::Embedded, dir)?;
    let config: serde_json::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&service.kubeconfig)?)?;
    let server = config["clusters"][0]["cluster"]["server"]
        .as_str()
        .context("the kubeconfig's server")?;
    // The clients are pointed at a replica's base URL; the cluster's path is kept from the
    // kubeconfig.
    let server = server[..server.find("/clusters/").unwrap_or(server.len())].to_string();
    let run = Run::start(&["demo"], &[service.kubeconfig.clone()], &[server], seed)?;
    let shared = run.shared.clone();
    std::thread::sleep(SETTLE);
    let figures = |service: &flotilla_e2e::Flotilla| -> Vec<(u64, usize)> {
        service.pid().into_iter().map(process_figures).collect()
    };
    let figures_at_start = figures(&service);
    let mut windows = Vec::new();
    for nemesis in [
        "SIGKILL flotilla up",
        "fill flotilla up's disk",
        "SIGKILL flotilla up",
    ] {
        let start = shared.now();
        let target = if nemesis.starts_with("SIGKILL") {
            service.restart(true)?;
            "up".to_string()
        } else {
            disk.fill()?;
            std::thread::sleep(FAULT);
            disk.free()?;
            if service.running() {
                "up's data directory (kept running)".to_string()
            } else {
                service.restart(true)?;
                "up's data directory (stopped, restarted)".to_string()
            }
        };
        let healed = shared.now();
        std::thread::sleep(SETTLE);
        windows.push(Window {
            nemesis,
            target,
            start,
            healed,
            end: shared.now(),
            failover: None,
        });
    }
    let figures_at_end = figures(&service);
    run.finish(
        windows,
        &figures_at_start,
        &figures_at_end,
        seed,
        suite_started,
    )
}

#[test]
fn faults_lose_no_acknowledged_write_and_every_tenant_recovers() -> anyhow::Result<()> {
    let suite_started = Instant::now();
    let soak_seconds: Option<u64> = std::env::var("FLOTILLA_FAULTS_SECONDS")
        .ok()
        .map(|s| s.parse())
        .transpose()
        .context("FLOTILLA_FAULTS_SECONDS is a number of seconds")?;
    let seed = seed()?;
    let mut rng = StdRng::seed_from_u64(seed);
    // FLOTILLA_FAULTS_NEMESES=a,b picks some (e.g. none that restarts a replica, so that the
    // soak's RSS figures are one process's).
    let nemeses: Vec<Nemesis> = match std::env::var("FLOTILLA_FAULTS_NEMESES") {
        Ok(keys) => keys
            .split(',')
            .map(|key| {
                NEMESES
                    .into_iter()
                    .find(|n| n.key() == key.trim())
                    .with_context(|| {
                        let known: Vec<&str> = NEMESES.iter().map(|n| n.key()).collect();
                        format!("FLOTILLA_FAULTS_NEMESES: no nemesis {key:?} (known: {known:?})")
                    })
            })
            .collect::<anyhow::Result<_>>()?,
        Err(_) => NEMESES.to_vec(),
    };

    let dir = tempfile::tempdir()?;
    // FLOTILLA_FAULTS_KEEP=1 keeps the replicas' logs and the members' data for a post-mortem.
    let path = dir.path().to_path_buf();
    let _dir = if std::env::var_os("FLOTILLA_FAULTS_KEEP").is_some() {
        println!("fault suite: keeping {}", dir.keep().display());
        None
    } else {
        Some(dir)
    };
    let mut topology = Topology::start(&path, 3, 2, LEASE)?;
    let operator = topology.replicas[0].operator();
    let key: serde_json::Value =
        serde_json::from_str(&operator.ok(&["account", "create", "faults", "-o", "json"])?)?;
    let mut settings = operator.settings()?;
    settings["apiKey"] = key["apiKey"].clone();
    let account = FlotillaCli {
        config: topology.dir().join("faults.json"),
    };
    std::fs::write(&account.config, serde_json::to_vec_pretty(&settings)?)?;
    let mut kubeconfigs = Vec::new();
    for tenant in TENANTS {
        account.ok(&["cluster", "create", tenant, "--wait"])?;
        let file = topology.dir().join(format!("{tenant}.kubeconfig"));
        account.ok(&[
            "cluster",
            "kubeconfig",
            tenant,
            "--file",
            file.to_str().context("path")?,
        ])?;
        kubeconfigs.push(file);
    }

    let urls = topology.replica_urls();
    let run = Run::start(&TENANTS, &kubeconfigs, &urls, seed)?;
    let lease_readers = run.tenants[0].clients.clone();
    let (runtime, shared) = (&run.runtime, run.shared.clone());

    let pids = |topology: &Topology| -> Vec<u32> {
        topology
            .replicas
            .iter()
            .filter_map(|r| r.daemon.pid())
            .collect()
    };
    let rounds_before = shared.rounds.load(Ordering::Relaxed);
    std::thread::sleep(SETTLE);
    if soak_seconds.is_some() {
        // The soak runs at 70 % of the rate the workload reaches unpaced and fault-free (the
        // settling time just gone): each client's rounds spaced to its share of that.
        let capacity =
            (shared.rounds.load(Ordering::Relaxed) - rounds_before) as f64 / SETTLE.as_secs_f64();
        let clients = (TENANTS.len() * CLIENTS_PER_TENANT) as f64;
        let paced = 0.7 * capacity;
        if paced > 0.0 {
            let micros = (clients / paced * 1e6) as u64;
            shared.pace_micros.store(micros, Ordering::Relaxed);
        }
        println!(
            "fault suite: the workload unpaced: {capacity:.1} rounds/s; the soak paced to 70 %: {paced:.1} rounds/s"
        );
        std::thread::sleep(SETTLE);
    }
    let figures_at_start: Vec<(u64, usize)> =
        pids(&topology).into_iter().map(process_figures).collect();

    // The schedule: each nemesis once, or (soak) one at random every 30 s until the time is up.
    let mut windows: Vec<Window> = Vec::new();
    let schedule_started = Instant::now();
    let mut round = 0;
    loop {
        let nemesis = match soak_seconds {
            None if round < nemeses.len() => nemeses[round],
            None => break,
            Some(seconds) if schedule_started.elapsed() < Duration::from_secs(seconds) => {
                nemeses[rng.random_range(0..nemeses.len())]
            }
            Some(_) => break,
        };
        round += 1;
        let start = shared.now();
        let (target, healed, failover) = inject(
            nemesis,
            &mut topology,
            &mut rng,
            runtime,
            &lease_readers,
            &shared,
        )
        .with_context(|| format!("injecting {}", nemesis.name()))?;
        let pause = if soak_seconds.is_some() {
            Duration::from_secs(30).saturating_sub(FAULT)
        } else {
            SETTLE
        };
        std::thread::sleep(pause);
        windows.push(Window {
            nemesis: nemesis.name(),
            target,
            start,
            healed,
            end: shared.now(),
            failover,
        });
    }
    let figures_at_end: Vec<(u64, usize)> =
        pids(&topology).into_iter().map(process_figures).collect();

    run.finish(
        windows,
        &figures_at_start,
        &figures_at_end,
        seed,
        suite_started,
    )
}

/// The workload running against a service: its clients, watchers and probes.
struct Run {
    runtime: tokio::runtime::Runtime,
    shared: Shared,
    tenants: Vec<Arc<Tenant>>,
    clients: Vec<tokio::task::JoinHandle<()>>,
    watchers: Vec<tokio::task::JoinHandle<()>>,
    watchers_stop: Arc<AtomicBool>,
}

impl Run {
    /// Connects to each tenant (`names[i]` with `kubeconfigs[i]`) through every one of `urls`
    /// and starts the clients, a watcher per tenant and replica, and the probes.
    fn start(
        names: &[&str],
        kubeconfigs: &[std::path::PathBuf],
        urls: &[String],
        seed: u64,
    ) -> anyhow::Result<Run> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let tenants: Vec<Arc<Tenant>> = runtime.block_on(async {
            let mut tenants = Vec::new();
            for (tenant, kubeconfig) in names.iter().zip(kubeconfigs) {
                tenants.push(Arc::new(Tenant::connect(tenant, kubeconfig, urls).await?));
            }
            anyhow::Ok(tenants)
        })?;
        let shared = Shared::new();
        let watchers_stop = Arc::new(AtomicBool::new(false));
        let mut clients = Vec::new();
        let mut watchers = Vec::new();
        for (t, tenant) in tenants.iter().enumerate() {
            for replica in 0..urls.len() {
                let watcher_shared = Shared {
                    stop: watchers_stop.clone(),
                    ..shared.clone()
                };
                watchers.push(runtime.spawn(workload::run_watcher(
                    watcher_shared,
                    tenant.clone(),
                    replica,
                )));
            }
            for client in 0..CLIENTS_PER_TENANT {
                let task = (t * CLIENTS_PER_TENANT + client) as u64;
                clients.push(runtime.spawn(workload::run_client(
                    shared.clone(),
                    tenant.clone(),
                    client,
                    KEYS_PER_CLIENT,
                    workload::task_seed(seed, task),
                )));
            }
        }
        clients.push(runtime.spawn(workload::run_probes(shared.clone(), tenants.clone())));
        Ok(Run {
            runtime,
            shared,
            tenants,
            clients,
            watchers,
            watchers_stop,
        })
    }

    /// Stops the workload, reads the final state, checks the history and prints the report:
    /// fails on any anomaly.
    fn finish(
        self,
        windows: Vec<Window>,
        figures_at_start: &[(u64, usize)],
        figures_at_end: &[(u64, usize)],
        seed: u64,
        suite_started: Instant,
    ) -> anyhow::Result<()> {
        let Run {
            runtime,
            shared,
            tenants,
            clients,
            watchers,
            watchers_stop,
        } = self;
        // Stop writing; let the watchers catch up with the store; then read everything back.
        shared.stop.store(true, Ordering::Relaxed);
        runtime.block_on(async {
            for client in clients {
                let _ = client.await;
            }
        });
        let mut history = History::default();
        runtime.block_on(async {
            for tenant in &tenants {
                workload::read_final(&shared, tenant).await?;
                let (state, _) = workload::final_state(tenant).await?;
                history.final_state.extend(state);
            }
            anyhow::Ok(())
        })?;
        std::thread::sleep(Duration::from_secs(10));
        watchers_stop.store(true, Ordering::Relaxed);
        runtime.block_on(async {
            for watcher in watchers {
                let _ = watcher.await;
            }
        });
        let record = std::mem::take(
            &mut *shared
                .record
                .lock()
                .map_err(|_| anyhow::anyhow!("the record's lock was poisoned"))?,
        );
        // Keys written but absent at the end: every watcher must have seen them go.
        for write in &record.writes {
            history.final_state.entry(write.key.clone()).or_insert(None);
        }
        history.writes = record.writes;
        history.reads = record.reads;
        history.watchers = record.watchers;
        history.counters = record.counters.into_iter().collect();
        let anomalies = history.check();

        // The report: one row per nemesis.
        let mut table = String::new();
        table.push_str(
            "| nemesis | target | writes acknowledged | lost | stale reads | stale updates | watch \
             gaps | longest outage of a tenant | recovered after healing | client errors during the fault | control-loop failover |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        let in_window = |at: f64, w: &Window| at >= w.start && at < w.end;
        for window in &windows {
            let acknowledged = history
                .writes
                .iter()
                .filter(|w| w.outcome == checker::Outcome::Ok && in_window(w.invoked, window))
                .count();
            let count = |kinds: &[Kind]| {
                anomalies
                    .iter()
                    .filter(|a| kinds.contains(&a.kind) && in_window(a.at, window))
                    .count()
            };
            let (outage, recovered) = availability(&record.probes, window);
            let during: Vec<&(f64, f64, bool)> = record
                .operations
                .iter()
                .filter(|(at, _, _)| *at >= window.start && *at < window.healed)
                .collect();
            let errors = during.iter().filter(|(_, _, ok)| !ok).count();
            table.push_str(&format!(
                "| {} | {} | {acknowledged} | {} | {} | {} | {} | {:.1} s | {:.1} s | {:.1} % of {} | {} |\n",
                window.nemesis,
                window.target,
                count(&[Kind::Lost]),
                count(&[Kind::StaleRead]),
                count(&[Kind::StaleUpdate]),
                count(&[Kind::WatchGap, Kind::WatchOrder]),
                outage / 1000.0,
                recovered / 1000.0,
                100.0 * errors as f64 / during.len().max(1) as f64,
                during.len(),
                window
                    .failover
                    .map(|f| format!("{:.1} s (lease {} s)", f / 1000.0, LEASE.as_secs()))
                    .unwrap_or_else(|| "–".to_string()),
            ));
        }
        let total = |kind: Kind| anomalies.iter().filter(|a| a.kind == kind).count();
        table.push_str(&format!(
            "| **all** | | {} | {} | {} | {} | {} | | | | |\n",
            history
                .writes
                .iter()
                .filter(|w| w.outcome == checker::Outcome::Ok)
                .count(),
            total(Kind::Lost),
            total(Kind::StaleRead),
            total(Kind::StaleUpdate),
            total(Kind::WatchGap) + total(Kind::WatchOrder),
        ));
        println!("{table}");
        let reads = history.reads.len();
        let events: usize = history
            .watchers
            .iter()
            .flat_map(|w| &w.epochs)
            .map(|e| e.events.len())
            .sum();
        let relists: usize = history
            .watchers
            .iter()
            .map(|w| w.epochs.len().saturating_sub(1))
            .sum();
        println!(
            "fault suite: {} writes ({} unanswered), {reads} reads, {events} watch events over {} \
             watchers ({relists} relists after 410), {} lists listed again at their revision \
             ({} unanswered), counters {:?}",
            history.writes.len(),
            history
                .writes
                .iter()
                .filter(|w| w.outcome == checker::Outcome::Unknown)
                .count(),
            history.watchers.len(),
            record.exact_lists.0,
            record.exact_lists.1,
            history
                .counters
                .iter()
                .map(|(name, c)| format!(
                    "{name}: {} (acknowledged {}, unanswered {})",
                    c.final_value, c.acknowledged, c.unknown
                ))
                .collect::<Vec<_>>(),
        );
        let latencies = |from: f64, to: f64| -> Vec<f64> {
            record
                .operations
                .iter()
                .filter(|(at, _, ok)| *ok && *at >= from && *at < to)
                .map(|(_, latency, _)| *latency)
                .collect()
        };
        let last = windows.last().map_or(0.0, |w| w.end);
        let span = 60_000.0_f64.min(last / 4.0);
        for (i, ((rss0, fds0), (rss1, fds1))) in
            figures_at_start.iter().zip(figures_at_end).enumerate()
        {
            println!(
                "fault suite: replica r{i}: RSS {:.1} → {:.1} MiB, open files {fds0} → {fds1}",
                *rss0 as f64 / 1024.0,
                *rss1 as f64 / 1024.0
            );
        }
        println!(
            "fault suite: p99 latency of answered operations {:.1} ms in the first {:.0} s, {:.1} ms \
             in the last; wall time {:.0} s",
            p99(&mut latencies(0.0, span)),
            span / 1000.0,
            p99(&mut latencies(last - span, last)),
            suite_started.elapsed().as_secs_f64()
        );
        // The first few of each kind.
        let mut shown: HashMap<Kind, usize> = HashMap::new();
        for anomaly in &anomalies {
            let count = shown.entry(anomaly.kind).or_default();
            *count += 1;
            if *count <= 5 {
                println!(
                    "fault suite: {:?} at {:.0} ms: {}",
                    anomaly.kind, anomaly.at, anomaly.detail
                );
            }
        }
        ensure!(
            anomalies.is_empty(),
            "the checker found {} anomalies (seed {seed}); the first: {}",
            anomalies.len(),
            anomalies[0].detail
        );
        // A cluster that exists must never be "not found", fault or none: a client (kubectl,
        // a controller) would take it as deleted.
        ensure!(
            record.stray_not_found.is_empty(),
            "{} GETs were answered 404 about something other than their object (seed {seed}); \
             the first, at {:.0} ms: {}",
            record.stray_not_found.len(),
            record.stray_not_found[0].0,
            record.stray_not_found[0].1
        );
        ensure!(
            history
                .writes
                .iter()
                .any(|w| w.outcome == checker::Outcome::Ok)
                && events > 0,
            "the workload did nothing: no write was acknowledged or no event watched"
        );
        Ok(())
    }
}

/// For one nemesis: the longest time a tenant had no replica answering (ms), and how long
/// after healing until every tenant answered through every replica for good (ms).
fn availability(probes: &[(f64, String, usize, bool)], window: &Window) -> (f64, f64) {
    let mut rounds: BTreeMap<&str, Vec<(f64, bool)>> = BTreeMap::new();
    // One probe round per tenant: answered when any replica answered.
    let mut by_round: HashMap<(&str, u64), bool> = HashMap::new();
    for (at, tenant, _, answered) in probes {
        if *at >= window.start && *at < window.end {
            let slot = (tenant.as_str(), (*at / 100.0) as u64);
            *by_round.entry(slot).or_default() |= *answered;
        }
    }
    for ((tenant, slot), answered) in by_round {
        rounds
            .entry(tenant)
            .or_default()
            .push((slot as f64 * 100.0, answered));
    }
    let mut outage: f64 = 0.0;
    for samples in rounds.values_mut() {
        samples.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut down_since: Option<f64> = None;
        for (at, answered) in samples.iter() {
            match (answered, down_since) {
                (false, None) => down_since = Some(*at),
                (true, Some(since)) => {
                    outage = outage.max(at - since);
                    down_since = None;
                }
                _ => {}
            }
        }
        if let Some(since) = down_since {
            outage = outage.max(window.end - since);
        }
    }
    let last_failure = probes
        .iter()
        .filter(|(at, _, _, answered)| !answered && *at >= window.healed && *at < window.end)
        .map(|(at, _, _, _)| *at)
        .fold(None, |latest: Option<f64>, at| {
            Some(latest.map_or(at, |l| l.max(at)))
        });
    let recovered = last_failure.map_or(0.0, |at| at - window.healed);
    (outage, recovered)
}
