//! The fault suite's machines: a fabric bridge, one network namespace per etcd member and per
//! `flotilla serve` replica, their processes, and the primitives the nemeses are made of
//! (signals to one process, nftables rules that cut one machine off from others).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use flotilla_e2e::FlotillaCli;
use flotilla_e2e::nodes::Fabric;

use super::disks::LoopDisk;

/// The etcd client and peer ports and the service's port: each machine has its own address.
const ETCD_CLIENT_PORT: u16 = 2379;
const ETCD_PEER_PORT: u16 = 2380;
pub const SERVE_PORT: u16 = 6443;
/// libfaketime (Debian's `libfaketime`): preloaded into each replica so that the suite can
/// move that replica's wall clock alone.
const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// Runs `program ARGS` to completion, failing with its stderr.
pub fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    ensure!(
        out.status.success(),
        "{program} {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A network namespace on the fabric, with one address: a machine of its own.
pub struct Machine {
    /// The namespace's name (under /var/run/netns).
    pub netns: String,
    /// Its address on the fabric.
    pub ip: String,
}

impl Machine {
    fn attach(fabric: &Fabric, name: &str, ip: &str) -> anyhow::Result<Machine> {
        let fabric_netns = std::fs::read_to_string(fabric.dir().join("netns"))?
            .trim()
            .to_string();
        // Interface names are at most 15 bytes: named after the namespace's hash.
        let hash = format!("{:08x}", fnv32(name));
        let (outside, inside) = (format!("flfv{hash}"), format!("flfp{hash}"));
        run("ip", &["netns", "add", name])?;
        let machine = Machine {
            netns: name.to_string(),
            ip: ip.to_string(),
        };
        machine.exec("ip", &["link", "set", "lo", "up"])?;
        run(
            "ip",
            &[
                "link", "add", &outside, "type", "veth", "peer", "name", &inside,
            ],
        )?;
        run("ip", &["link", "set", &outside, "netns", &fabric_netns])?;
        run(
            "ip",
            &[
                "netns",
                "exec",
                &fabric_netns,
                "ip",
                "link",
                "set",
                &outside,
                "master",
                "fab0",
                "up",
            ],
        )?;
        run("ip", &["link", "set", &inside, "netns", name])?;
        machine.exec("ip", &["link", "set", &inside, "name", "eth0"])?;
        machine.exec("ip", &["addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
        machine.exec("ip", &["link", "set", "eth0", "up"])?;
        Ok(machine)
    }

    /// Runs a command inside the namespace to completion.
    fn exec(&self, program: &str, args: &[&str]) -> anyhow::Result<String> {
        let mut all = vec!["netns", "exec", &self.netns, program];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// Drops every packet between this machine and `peers` (both ways) until [`Machine::heal`].
    pub fn cut_off_from(&self, peers: &[&str]) -> anyhow::Result<()> {
        let set = peers.join(", ");
        let rules = format!(
            "table inet fault {{\n\
             chain input {{ type filter hook input priority -10; policy accept; ip saddr {{ {set} }} drop; }}\n\
             chain output {{ type filter hook output priority -10; policy accept; ip daddr {{ {set} }} drop; }}\n\
             }}\n"
        );
        let file = std::env::temp_dir().join(format!("{}-fault.nft", self.netns));
        std::fs::write(&file, rules)?;
        self.exec("nft", &["-f", &file.to_string_lossy()])?;
        Ok(())
    }

    /// Removes the rules of [`Machine::cut_off_from`].
    pub fn heal(&self) -> anyhow::Result<()> {
        let _ = self.exec("nft", &["delete", "table", "inet", "fault"]);
        Ok(())
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
    }
}

/// A command that runs inside network namespace `netns`. `nsenter` execs the program itself,
/// so the child's pid is the program's and signals reach it.
fn netns_command(netns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new("nsenter");
    command
        .arg(format!("--net=/var/run/netns/{netns}"))
        .arg("--")
        .arg(program);
    command
}

fn fnv32(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5_u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// A process on a machine that may be killed, paused, resumed and started again.
pub struct Daemon {
    child: Option<Child>,
    start: Box<dyn Fn() -> anyhow::Result<Child> + Send>,
}

impl Daemon {
    fn new(start: Box<dyn Fn() -> anyhow::Result<Child> + Send>) -> anyhow::Result<Self> {
        let child = start()?;
        Ok(Daemon {
            child: Some(child),
            start,
        })
    }

    pub fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let child = self.child.as_ref().context("the process is not running")?;
        run("kill", &["-s", signal, &child.id().to_string()])?;
        Ok(())
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A stopped process dies of SIGKILL as well.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.child = Some((self.start)()?);
        Ok(())
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One etcd member on its own machine.
pub struct EtcdMember {
    pub name: String,
    pub daemon: Daemon,
    pub machine: Machine,
    /// Its data directory's file system (unmounted after the process is gone).
    pub disk: Arc<LoopDisk>,
}

/// One `flotilla serve` replica on its own machine.
pub struct Replica {
    pub id: String,
    pub daemon: Daemon,
    pub machine: Machine,
    pub log: PathBuf,
    /// The offset of its wall clock (libfaketime's timestamp file).
    clock: PathBuf,
}

/// Everything the suite runs: the fabric, the etcd members, the replicas.
pub struct Topology {
    // Dropped in declaration order: processes, then their namespaces, then the fabric.
    pub replicas: Vec<Replica>,
    pub members: Vec<EtcdMember>,
    _fabric: Fabric,
    dir: PathBuf,
    /// The test's own address on the fabric (clients run in the host's namespace).
    pub host_ip: String,
}

impl Topology {
    /// A fabric with `members` etcd members and `replicas` replicas on it, each replica's
    /// control-loop lease lasting `lease`.
    pub fn start(
        dir: &Path,
        members: usize,
        replicas: usize,
        lease: Duration,
    ) -> anyhow::Result<Topology> {
        for tool in [
            "ip",
            "nsenter",
            "nft",
            "etcd",
            "etcdctl",
            "losetup",
            "lsblk",
            "mkfs.ext4",
        ] {
            ensure!(
                flotilla_e2e::nodes::on_path(tool),
                "the fault suite needs {tool} (apt-get install -y iproute2 util-linux nftables \
                 etcd-server etcd-client e2fsprogs; tests/run installs them)"
            );
        }
        ensure!(
            Path::new(FAKETIME).exists(),
            "the fault suite moves a replica's clock with {FAKETIME} (apt-get install -y \
             libfaketime; tests/run installs it)"
        );
        let uid = run("id", &["-u"])?;
        ensure!(
            uid.trim() == "0",
            "the fault suite makes network namespaces: it needs root"
        );
        let fabric = Fabric::start(&dir.join("fabric"))?;
        let host_ip = fabric.host_ip.clone();
        let tag = format!("{:04x}", fnv32(&dir.to_string_lossy()) & 0xffff);
        let mut topology = Topology {
            replicas: Vec::new(),
            members: Vec::new(),
            dir: dir.to_path_buf(),
            host_ip,
            _fabric: fabric,
        };
        let member_ips: Vec<String> = (0..members)
            .map(|i| topology._fabric.node_ip(1 + i as u8))
            .collect();
        let initial_cluster = member_ips
            .iter()
            .enumerate()
            .map(|(i, ip)| format!("e{i}=http://{ip}:{ETCD_PEER_PORT}"))
            .collect::<Vec<_>>()
            .join(",");
        for (i, ip) in member_ips.iter().enumerate() {
            let machine = Machine::attach(&topology._fabric, &format!("flt{tag}-e{i}"), ip)?;
            let name = format!("e{i}");
            // Each member's data on a disk of its own, so that one can be filled or slowed.
            // etcd preallocates 64 MB WAL segments: 320 MB holds a short run several times
            // over.
            let disk = Arc::new(LoopDisk::mount(&dir.join(format!("{name}-disk")), 320)?);
            let data = disk.path.join("data");
            let command = {
                let (netns, ip, name, initial_cluster, disk) = (
                    machine.netns.clone(),
                    ip.clone(),
                    name.clone(),
                    initial_cluster.clone(),
                    disk.clone(),
                );
                move || -> anyhow::Result<Child> {
                    let client = format!("http://{ip}:{ETCD_CLIENT_PORT}");
                    let peer = format!("http://{ip}:{ETCD_PEER_PORT}");
                    netns_command(&netns, "etcd")
                        .args(["--name", &name])
                        .arg("--data-dir")
                        .arg(&data)
                        .args(["--listen-client-urls", &client])
                        .args(["--advertise-client-urls", &client])
                        .args(["--listen-peer-urls", &peer])
                        .args(["--initial-advertise-peer-urls", &peer])
                        .args(["--initial-cluster", &initial_cluster])
                        .args(["--initial-cluster-state", "new"])
                        // Upstream's defaults, named: a leader is elected again about a
                        // second after the last one went silent.
                        .args(["--heartbeat-interval", "100", "--election-timeout", "1000"])
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .context("starting etcd")
                        .and_then(|child| {
                            disk.adopt(child.id())?;
                            Ok(child)
                        })
                }
            };
            topology.members.push(EtcdMember {
                name,
                daemon: Daemon::new(Box::new(command))?,
                machine,
                disk,
            });
        }
        topology.wait_for_etcd()?;

        let endpoints = topology.etcd_endpoints().join(",");
        let key_file = dir.join("key-encryption-key");
        for i in 0..replicas {
            let ip = topology._fabric.node_ip(50 + i as u8);
            let machine = Machine::attach(&topology._fabric, &format!("flt{tag}-r{i}"), &ip)?;
            let id = format!("r{i}");
            let replica_dir = dir.join(&id);
            std::fs::create_dir_all(&replica_dir)?;
            let log = replica_dir.join("serve.log");
            let clock = replica_dir.join("clock-offset");
            std::fs::write(&clock, "+0")?;
            let command = {
                let (netns, ip, endpoints, key_file, log, id, clock) = (
                    machine.netns.clone(),
                    ip.clone(),
                    endpoints.clone(),
                    key_file.clone(),
                    log.clone(),
                    id.clone(),
                    clock.clone(),
                );
                let lease_seconds = lease.as_secs().max(1).to_string();
                let operator = replica_dir.join("operator.json");
                move || -> anyhow::Result<Child> {
                    let stderr = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&log)?;
                    netns_command(&netns, flotilla_e2e::flotilla_bin()?)
                        .arg("serve")
                        .args(["--etcd", &endpoints])
                        .args(["--listen", &format!("{ip}:{SERVE_PORT}")])
                        .args(["--tls-san", &ip])
                        .arg("--operator-config")
                        .arg(&operator)
                        .arg("--key-encryption-key-file")
                        .arg(&key_file)
                        .args(["--replica-id", &id])
                        .args(["--lease-duration-seconds", &lease_seconds])
                        // The workload is many small requests from one host: the per-cluster
                        // request budget is not what is under test.
                        .args(["--tenant-qps", "0", "--tenant-max-in-flight", "0"])
                        .args(["--log-format", "json"])
                        // Where the control loops run and why, for a failure's post-mortem.
                        .env("RUST_LOG", "warn,flotilla::placement=debug")
                        // Its wall clock is offset by what the file says (read at most once a
                        // second); its monotonic clock is left alone, as an NTP step leaves it.
                        .env("LD_PRELOAD", FAKETIME)
                        .env("FAKETIME_TIMESTAMP_FILE", &clock)
                        .env("FAKETIME_CACHE_DURATION", "1")
                        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                        .stdout(Stdio::null())
                        .stderr(stderr)
                        .spawn()
                        .context("starting flotilla serve")
                }
            };
            let replica = Replica {
                id,
                daemon: Daemon::new(Box::new(command))?,
                machine,
                log,
                clock,
            };
            // The first replica writes the key-encryption key the others read.
            topology.wait_for_replica(&replica)?;
            topology.replicas.push(replica);
        }
        Ok(topology)
    }

    /// Every member's client URL.
    pub fn etcd_endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://{}:{ETCD_CLIENT_PORT}", m.machine.ip))
            .collect()
    }

    /// Every replica's `https://IP:PORT`.
    pub fn replica_urls(&self) -> Vec<String> {
        self.replicas.iter().map(|r| r.url()).collect()
    }

    fn wait_for_etcd(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.etcd_leader().is_err() {
            if Instant::now() > deadline {
                bail!("the etcd cluster elected no leader within 30 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    fn wait_for_replica(&self, replica: &Replica) -> anyhow::Result<()> {
        let operator = replica.operator_config();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !operator.exists()
            || std::net::TcpStream::connect((replica.machine.ip.as_str(), SERVE_PORT)).is_err()
        {
            if Instant::now() > deadline {
                bail!(
                    "replica {} did not serve within 60 s; its log: {}",
                    replica.id,
                    std::fs::read_to_string(&replica.log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// The index of the member etcd reports as leader (asked of every member that answers).
    pub fn etcd_leader(&self) -> anyhow::Result<usize> {
        let endpoints = self.etcd_endpoints().join(",");
        let out = Command::new("etcdctl")
            .args(["--endpoints", &endpoints, "--command-timeout=1s"])
            .args(["endpoint", "status", "-w", "json"])
            .output()?;
        let statuses: serde_json::Value = serde_json::from_slice(&out.stdout)
            .with_context(|| String::from_utf8_lossy(&out.stderr).into_owned())?;
        for status in statuses.as_array().into_iter().flatten() {
            let header = &status["Status"]["header"];
            if status["Status"]["leader"] == header["member_id"] && !header["member_id"].is_null() {
                let endpoint = status["Endpoint"].as_str().unwrap_or_default();
                if let Some(i) = self
                    .etcd_endpoints()
                    .iter()
                    .position(|e| e.as_str() == endpoint)
                {
                    return Ok(i);
                }
            }
        }
        bail!("no etcd member reports itself leader")
    }

    /// The addresses of every machine but `except`.
    pub fn other_ips(&self, except: &str) -> Vec<String> {
        self.members
            .iter()
            .map(|m| &m.machine.ip)
            .chain(self.replicas.iter().map(|r| &r.machine.ip))
            .chain(std::iter::once(&self.host_ip))
            .filter(|ip| ip.as_str() != except)
            .cloned()
            .collect()
    }

    /// The directory the suite's files live in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Replica {
    /// Steps its wall clock `seconds` away from the host's (0: back in step); it takes
    /// effect within a second.
    pub fn set_clock_offset(&self, seconds: i64) -> anyhow::Result<()> {
        std::fs::write(&self.clock, format!("{seconds:+}")).context("writing the clock offset")
    }

    pub fn url(&self) -> String {
        format!("https://{}:{SERVE_PORT}", self.machine.ip)
    }
    pub fn operator_config(&self) -> PathBuf {
        self.log.with_file_name("operator.json")
    }
    pub fn operator(&self) -> FlotillaCli {
        FlotillaCli {
            config: self.operator_config(),
        }
    }
}
