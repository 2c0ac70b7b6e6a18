//! A local hypervisor for LocalStack: its instances don't boot, so this watches LocalStack for
//! running instances whose user data is a Flotilla `NodeConfig` and, for each, starts a node
//! fed with that user data — `flotilla simulate-nodes --node-config` joining the cluster with
//! the bootstrap token, named after the instance's private DNS name, as a real node would
//! from instance metadata. A node stops when its instance leaves `running`. (When the real
//! kubelet exists, this is where it would be started in a network namespace instead.)

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use base64::Engine;

use crate::{Process, aws_call, flotilla_bin};

/// How often LocalStack is looked at.
const POLL: Duration = Duration::from_millis(750);

/// One booted instance.
struct Booted {
    _node: Process,
    /// When the node was started.
    started: Instant,
}

/// The watcher; dropping it stops every node it started.
pub struct Hypervisor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    booted: Arc<Mutex<HashMap<String, Booted>>>,
    _dir: tempfile::TempDir,
}

struct RunningInstance {
    id: String,
    private_dns_name: String,
    private_ip: String,
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
                private_dns_name: text("PrivateDnsName"),
                private_ip: text("PrivateIpAddress"),
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
    /// Starts watching the LocalStack on `port`.
    pub fn start(port: u16) -> anyhow::Result<Self> {
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
                            let mut nodes = booted.lock().unwrap_or_else(|e| e.into_inner());
                            nodes.retain(|id, _| running.iter().any(|i| &i.id == id));
                            for instance in &running {
                                if nodes.contains_key(&instance.id)
                                    || foreign.contains(&instance.id)
                                {
                                    continue;
                                }
                                match node_config(port, &instance.id) {
                                    Ok(Some(config)) => match boot(&root, instance, &config) {
                                        Ok(node) => {
                                            nodes.insert(
                                                instance.id.clone(),
                                                Booted {
                                                    _node: node,
                                                    started: Instant::now(),
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
            })
        };
        Ok(Hypervisor {
            stop,
            thread: Some(thread),
            booted,
            _dir: dir,
        })
    }

    /// Instances with a running node, and how long ago each node was started.
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
