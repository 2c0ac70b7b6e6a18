//! A local hypervisor for LocalStack: its instances don't boot, so this watches LocalStack for
//! running instances whose user data is a Flotilla `NodeConfig` and, for each, starts a node
//! fed with that user data. Real nodes ([`Hypervisor::start_real`]) boot the node image's way:
//! a network namespace on a fabric with its own containerd, `flotilla-bootstrap` reading the
//! instance's metadata from an IMDSv2 emulator, then the kubelet and proxy from what it wrote.
//! An instance of the AMI given to [`Hypervisor::boot_image_as_vm`] boots that node image
//! in qemu instead (`crate::vm`), on the same fabric and metadata service.
//! Simulated nodes ([`Hypervisor::start`], for scale) are `flotilla simulate-nodes
//! --node-config` joining with the bootstrap token under the instance's private DNS name. A
//! node stops when its instance leaves `running`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use base64::Engine;

use crate::imds::{ImdsEmulator, InstanceMetadata};
use crate::nodes::{
    Containerd, Fabric, NodeDaemon, run_bootstrap, start_configured_kubelet,
    start_configured_proxy, wait_for_node_certificate,
};
use crate::vm::{VirtualMachine, VmNetwork};
use crate::{Process, aws_call, flotilla_bin};

/// How often LocalStack is looked at.
const POLL: Duration = Duration::from_millis(750);

/// A real node: dropped in field order, daemons before their containerd. A node whose first
/// boot failed runs no daemons, and one whose kubelet got no certificate no proxy (its
/// instance keeps running, as an EC2 instance would).
struct RealNode {
    _proxy: Option<NodeDaemon>,
    _kubelet: Option<NodeDaemon>,
    _containerd: Containerd,
}

/// What the instance's metadata serves as user data, given the instance's boot order (0, 1,
/// …) and the user data it was launched with: a test's way to launch with bad user data.
pub type UserDataOverride = Box<dyn Fn(usize, &str) -> String + Send>;

/// What runs for an instance.
enum Node {
    Simulated(#[allow(dead_code)] Process),
    Real(#[allow(dead_code)] RealNode),
    Vm(#[allow(dead_code)] VirtualMachine),
}

/// One booted instance.
struct Booted {
    _node: Node,
    /// When the hypervisor began booting it (it had just seen the instance running).
    started: Instant,
}

/// What real nodes share: the fabric they live on and the metadata service they read.
struct RealNodes {
    fabric: Fabric,
    imds: ImdsEmulator,
    /// The next node's index on the fabric (its address and its pod CIDR, 10.244.INDEX.0/24).
    next_index: u8,
    /// Replaces each instance's user data when set.
    user_data_override: Option<UserDataOverride>,
    /// Instances of this AMI boot this node image in a VM.
    vm_image: Option<VmImage>,
}

/// A node image booted in qemu for the instances of one AMI.
struct VmImage {
    image_id: String,
    disk: PathBuf,
    network: VmNetwork,
}

/// The watcher; dropping it stops every node it started.
pub struct Hypervisor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    booted: Arc<Mutex<HashMap<String, Booted>>>,
    dir: tempfile::TempDir,
}

struct RunningInstance {
    id: String,
    image_id: String,
    private_dns_name: String,
    private_ip: String,
    availability_zone: String,
}

fn running_instances(port: u16) -> anyhow::Result<Vec<RunningInstance>> {
    let answer = aws_call(
        port,
        "ec2",
        "describe_instances",
        serde_json::json!({"Filters": [{"Name": "instance-state-name", "Values": ["running"]}]}),
    )?
    .map_err(|(code, message)| anyhow::anyhow!("DescribeInstances: {code}: {message}"))?;
    let mut found = Vec::new();
    for reservation in answer["Reservations"].as_array().into_iter().flatten() {
        for instance in reservation["Instances"].as_array().into_iter().flatten() {
            let text = |field: &str| instance[field].as_str().unwrap_or_default().to_string();
            found.push(RunningInstance {
                id: text("InstanceId"),
                image_id: text("ImageId"),
                private_dns_name: text("PrivateDnsName"),
                private_ip: text("PrivateIpAddress"),
                availability_zone: instance["Placement"]["AvailabilityZone"]
                    .as_str()
                    .unwrap_or("us-east-1a")
                    .to_string(),
            });
        }
    }
    Ok(found)
}

/// The instance's user data, when it is a node bootstrap document.
fn node_config(port: u16, instance: &str) -> anyhow::Result<Option<String>> {
    let answer = aws_call(
        port,
        "ec2",
        "describe_instance_attribute",
        serde_json::json!({"InstanceId": instance, "Attribute": "userData"}),
    )?;
    let Ok(answer) = answer else {
        return Ok(None);
    };
    let Some(encoded) = answer["UserData"]["Value"].as_str() else {
        return Ok(None);
    };
    let text = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .context("user data is not base64")?,
    )?;
    Ok(text.contains("kind: NodeConfig").then_some(text))
}

/// Boots `instance` on `real`'s fabric from its metadata: a VM of the node image when it is
/// an instance of that image's AMI, else a real node in a network namespace.
fn boot_real(
    dir: &std::path::Path,
    real: &mut RealNodes,
    instance: &RunningInstance,
    config: &str,
) -> anyhow::Result<Node> {
    let index = real.next_index;
    real.next_index = real
        .next_index
        .checked_add(1)
        .context("the fabric has no address left")?;
    let home: PathBuf = dir.join(&instance.id);
    std::fs::create_dir_all(&home)?;
    let ip = real.fabric.node_ip(index);
    let config = match &real.user_data_override {
        Some(replace) => replace(usize::from(index - 1), config),
        None => config.to_string(),
    };
    if let Some(vm) = real
        .vm_image
        .as_ref()
        .filter(|vm| vm.image_id == instance.image_id)
    {
        real.imds.add(InstanceMetadata {
            instance_id: instance.id.clone(),
            local_ipv4: ip.clone(),
            local_hostname: instance.private_dns_name.clone(),
            availability_zone: instance.availability_zone.clone(),
            user_data: Some(config),
        })?;
        return Ok(Node::Vm(VirtualMachine::boot(
            &vm.network,
            &vm.disk,
            &ip,
            &home.join("vm"),
        )?));
    }
    let containerd = Containerd::start(
        &home.join("node"),
        &real.fabric,
        &ip,
        &format!("10.244.{index}.0/24"),
    )?;
    real.imds.add(InstanceMetadata {
        instance_id: instance.id.clone(),
        local_ipv4: ip,
        local_hostname: instance.private_dns_name.clone(),
        availability_zone: instance.availability_zone.clone(),
        user_data: Some(config),
    })?;
    // The first boot's failure line is on the instance's console (state.console).
    let state = home.join("state");
    let (configured, _) = run_bootstrap(&containerd, &real.imds.endpoint, &state)?;
    let (kubelet, proxy) = if configured {
        let mut kubelet = start_configured_kubelet(&containerd, &state)?;
        let proxy = if wait_for_node_certificate(&mut kubelet, &state, Duration::from_secs(60)) {
            Some(start_configured_proxy(&containerd, &state)?)
        } else {
            None
        };
        (Some(kubelet), proxy)
    } else {
        (None, None)
    };
    Ok(Node::Real(RealNode {
        _proxy: proxy,
        _kubelet: kubelet,
        _containerd: containerd,
    }))
}

fn boot(
    dir: &std::path::Path,
    instance: &RunningInstance,
    config: &str,
) -> anyhow::Result<Process> {
    let home: PathBuf = dir.join(&instance.id);
    std::fs::create_dir_all(&home)?;
    let config_path = home.join("user-data.yaml");
    std::fs::write(&config_path, config)?;
    let log = std::fs::File::create(home.join("node.log"))?;
    let child = std::process::Command::new(flotilla_bin()?)
        .arg("simulate-nodes")
        .arg("--node-config")
        .arg(&config_path)
        .arg("--node-name")
        .arg(&instance.private_dns_name)
        .arg("--node-ip")
        .arg(&instance.private_ip)
        .arg("--cert-dir")
        .arg(home.join("pki"))
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting a node")?;
    Ok(Process { child })
}

impl Hypervisor {
    /// Starts watching the LocalStack on `port`, simulating a node for each instance.
    pub fn start(port: u16) -> anyhow::Result<Self> {
        Self::watch(port, None)
    }

    /// Starts watching the LocalStack on `port`, booting each instance as a real node on
    /// `fabric` (the cluster's API must listen on the fabric's host address).
    pub fn start_real(port: u16, fabric: Fabric) -> anyhow::Result<Self> {
        Self::start_real_with(port, fabric, None)
    }

    /// [`Hypervisor::start_real`], the instances' metadata serving the user data
    /// `user_data_override` makes of theirs.
    pub fn start_real_with(
        port: u16,
        fabric: Fabric,
        user_data_override: Option<UserDataOverride>,
    ) -> anyhow::Result<Self> {
        Self::start_real_nodes(port, fabric, user_data_override, None)
    }

    /// Starts watching the LocalStack on `port` as [`Hypervisor::start_real`] does, except
    /// that instances of AMI `image_id` boot the node image `disk` in a qemu VM.
    pub fn boot_image_as_vm(
        port: u16,
        fabric: Fabric,
        image_id: &str,
        disk: &std::path::Path,
    ) -> anyhow::Result<Self> {
        crate::vm::require_qemu()?;
        Self::start_real_nodes(port, fabric, None, Some((image_id, disk)))
    }

    fn start_real_nodes(
        port: u16,
        fabric: Fabric,
        user_data_override: Option<UserDataOverride>,
        vm_image: Option<(&str, &std::path::Path)>,
    ) -> anyhow::Result<Self> {
        crate::nodes::require_runtime()?;
        let imds = ImdsEmulator::start(&fabric.host_ip)?;
        let vm_image = match vm_image {
            Some((image_id, disk)) => Some(VmImage {
                image_id: image_id.to_string(),
                disk: disk.to_path_buf(),
                network: VmNetwork::start(
                    &fabric,
                    &imds,
                    &[],
                    &fabric.dir().with_extension("vmnet"),
                )?,
            }),
            None => None,
        };
        Self::watch(
            port,
            Some(RealNodes {
                fabric,
                imds,
                next_index: 1,
                user_data_override,
                vm_image,
            }),
        )
    }

    fn watch(port: u16, mut real: Option<RealNodes>) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let root = dir.path().to_path_buf();
        let stop = Arc::new(AtomicBool::new(false));
        let booted: Arc<Mutex<HashMap<String, Booted>>> = Arc::default();
        let thread = {
            let (stop, booted) = (stop.clone(), booted.clone());
            std::thread::spawn(move || {
                // Instances whose user data is not ours, so they are not asked again.
                let mut foreign: Vec<String> = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    match running_instances(port) {
                        Ok(running) => {
                            // Nodes of instances that stopped running go, and new instances
                            // boot, outside the lock (either takes a while).
                            let (gone, new): (Vec<Booted>, Vec<&RunningInstance>) = {
                                let mut nodes = booted.lock().unwrap_or_else(|e| e.into_inner());
                                let stopped: Vec<String> = nodes
                                    .keys()
                                    .filter(|id| !running.iter().any(|i| &i.id == *id))
                                    .cloned()
                                    .collect();
                                let gone =
                                    stopped.iter().filter_map(|id| nodes.remove(id)).collect();
                                let new = running
                                    .iter()
                                    .filter(|i| {
                                        !nodes.contains_key(&i.id) && !foreign.contains(&i.id)
                                    })
                                    .collect();
                                (gone, new)
                            };
                            drop(gone);
                            for instance in new {
                                let began = Instant::now();
                                match node_config(port, &instance.id) {
                                    Ok(Some(config)) => match match real.as_mut() {
                                        Some(real) => boot_real(&root, real, instance, &config),
                                        None => boot(&root, instance, &config).map(Node::Simulated),
                                    } {
                                        Ok(node) => {
                                            booted
                                                .lock()
                                                .unwrap_or_else(|e| e.into_inner())
                                                .insert(
                                                    instance.id.clone(),
                                                    Booted {
                                                        _node: node,
                                                        started: began,
                                                    },
                                                );
                                        }
                                        Err(err) => {
                                            eprintln!("hypervisor: {}: {err:#}", instance.id)
                                        }
                                    },
                                    Ok(None) => foreign.push(instance.id.clone()),
                                    Err(err) => eprintln!("hypervisor: {}: {err:#}", instance.id),
                                }
                            }
                        }
                        // LocalStack paused by a fault test: keep the nodes, look again.
                        Err(err) => eprintln!("hypervisor: {err:#}"),
                    }
                    std::thread::sleep(POLL);
                }
                // The nodes go before the fabric and metadata service they live on.
                booted.lock().unwrap_or_else(|e| e.into_inner()).clear();
                drop(real);
            })
        };
        Ok(Hypervisor {
            stop,
            thread: Some(thread),
            booted,
            dir,
        })
    }

    /// A real node's console (what its first boot printed there) and journal (its kubelet's
    /// log), for instance `id`.
    pub fn console_and_journal(&self, id: &str) -> (String, String) {
        let state = self.dir.path().join(id).join("state");
        let read = |path: PathBuf| std::fs::read_to_string(path).unwrap_or_default();
        (
            read(state.with_extension("console")),
            read(state.with_extension("kubelet.log")),
        )
    }

    /// Instances with a running node, and how long ago each began booting (the instance was
    /// seen running within one poll, 0.75 s, before).
    pub fn nodes(&self) -> Vec<(String, Duration)> {
        let nodes = self.booted.lock().unwrap_or_else(|e| e.into_inner());
        nodes
            .iter()
            .map(|(id, booted)| (id.clone(), booted.started.elapsed()))
            .collect()
    }
}

impl Drop for Hypervisor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.booted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}
