//! `flotilla simulate-nodes`: fake kubelets for tests and benchmarks (kwok-style), a plain
//! kube-rs client of any cluster. It registers nodes with capacity, keeps their Leases and
//! Ready conditions fresh, runs pods bound to them (Running and Ready at once, Job pods
//! Succeeded), and finishes the graceful deletion of their pods as a kubelet would. It is not
//! the real kubelet (that lives in `node-image/`). With `--node-config` it joins one node the
//! kubelet's way first ([`crate::join`]) and then acts as that node's own identity.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use serde_json::json;

use crate::SimulateArgs;

/// How often each node's Lease is renewed (upstream kubelet: every 10 s of a 40 s lease).
const LEASE_RENEW: Duration = Duration::from_secs(10);
const LEASE_SECONDS: i32 = 40;
/// How often each node's Ready condition is refreshed.
const STATUS_REFRESH: Duration = Duration::from_secs(60);
/// The field manager of everything the simulator writes.
const MANAGER: &str = "flotilla-simulate-nodes";

/// One simulated node: what it registers as.
#[derive(Debug, Clone)]
pub struct SimNode {
    /// The Node's name.
    pub name: String,
    /// Its InternalIP (also the hostIP of its pods).
    pub ip: String,
    /// Labels beyond the simulator's own (kubelet `--node-labels`).
    pub labels: BTreeMap<String, String>,
    /// Taints it registers with (kubelet `--register-with-taints`).
    pub taints: Vec<k8s_openapi::api::core::v1::Taint>,
}

/// Runs the simulator until Ctrl-C.
pub async fn run(args: SimulateArgs) -> anyhow::Result<()> {
    let (client, nodes, own_node) = match (&args.kubeconfig, &args.node_config) {
        (_, Some(node_config)) => {
            let (client, node) = crate::join::join(node_config, &args).await?;
            let name = node.name.clone();
            (client, vec![node], Some(name))
        }
        (Some(kubeconfig), None) => (admin_client(kubeconfig).await?, count_nodes(&args), None),
        (None, None) => anyhow::bail!("either --kubeconfig or --node-config is required"),
    };
    for node in &nodes {
        register(&client, node, &args).await?;
    }
    eprintln!(
        "{} simulated nodes registered; running their pods",
        nodes.len()
    );
    let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
    let heartbeats = tokio::spawn(heartbeat(client.clone(), names));
    let pods = tokio::spawn(run_pods(client, nodes, own_node));
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        outcome = heartbeats => outcome.context("heartbeats stopped")?,
        outcome = pods => outcome.context("the pod loop stopped")??,
    }
    Ok(())
}

fn manager() -> PatchParams {
    PatchParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    }
}

fn node_ip(index: usize) -> String {
    format!("10.250.{}.{}", index / 250, index % 250 + 1)
}

async fn admin_client(kubeconfig: &std::path::Path) -> anyhow::Result<kube::Client> {
    let text = std::fs::read_to_string(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&text)?,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .context("the kubeconfig is not usable")?;
    Ok(kube::Client::try_from(config)?)
}

/// `--count` nodes named `PREFIX-i`.
fn count_nodes(args: &SimulateArgs) -> Vec<SimNode> {
    (0..args.count)
        .map(|i| SimNode {
            name: format!("{}-{i}", args.prefix),
            ip: node_ip(i),
            labels: BTreeMap::new(),
            taints: Vec::new(),
        })
        .collect()
}

/// Creates (or refreshes) `sim`'s Node with its capacity and a Ready condition.
async fn register(client: &kube::Client, sim: &SimNode, args: &SimulateArgs) -> anyhow::Result<()> {
    let name = sim.name.as_str();
    let nodes: Api<Node> = Api::all(client.clone());
    let mut labels = json!({
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "flotilla-simulated",
        "type": "simulated",
    });
    for (key, value) in &sim.labels {
        labels[key] = json!(value);
    }
    let mut metadata = json!({"metadata": {"name": name, "labels": labels}});
    if !sim.taints.is_empty() {
        metadata["spec"] = json!({"taints": sim.taints});
    }
    let node: Node = serde_json::from_value(metadata)?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(err) => return Err(err).with_context(|| format!("registering node {name}")),
    }
    let resources = json!({"cpu": args.cpu, "memory": args.memory, "pods": args.pods.to_string()});
    let status = json!({"status": {
        "capacity": resources,
        "allocatable": resources,
        "addresses": [{"type": "InternalIP", "address": sim.ip}, {"type": "Hostname", "address": name}],
        "nodeInfo": {
            "kubeletVersion": "v1.33.0-flotilla-simulated",
            "kubeProxyVersion": "v1.33.0-flotilla-simulated",
            "containerRuntimeVersion": "simulated://1.0",
            "operatingSystem": "linux", "architecture": "amd64",
            "osImage": "simulated", "kernelVersion": "simulated",
            "machineID": name, "systemUUID": name, "bootID": name,
        },
        "conditions": conditions(),
    }});
    nodes
        .patch_status(name, &manager(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("reporting node {name}'s status"))?;
    Ok(())
}

fn conditions() -> serde_json::Value {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let condition = |kind: &str, status: &str, reason: &str| {
        json!({"type": kind, "status": status, "reason": reason, "message": reason,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    json!([
        condition("Ready", "True", "KubeletReady"),
        condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        condition("PIDPressure", "False", "KubeletHasSufficientPID"),
    ])
}

/// Renews every node's Lease, and now and then its Ready condition.
async fn heartbeat(client: kube::Client, names: Vec<String>) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let nodes: Api<Node> = Api::all(client);
    let mut since_status = Duration::ZERO;
    loop {
        for name in &names {
            if let Err(err) = renew(&leases, name).await {
                tracing::warn!(node = %name, %err, "lease renewal failed");
            }
        }
        if since_status >= STATUS_REFRESH {
            since_status = Duration::ZERO;
            for name in &names {
                let status = json!({"status": {"conditions": conditions()}});
                if let Err(err) = nodes
                    .patch_status(name, &manager(), &Patch::Merge(&status))
                    .await
                {
                    tracing::warn!(node = %name, %err, "status refresh failed");
                }
            }
        }
        tokio::time::sleep(LEASE_RENEW).await;
        since_status += LEASE_RENEW;
    }
}

async fn renew(leases: &Api<Lease>, name: &str) -> Result<(), kube::Error> {
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.to_string()),
            lease_duration_seconds: Some(LEASE_SECONDS),
            renew_time: Some(now),
            ..Default::default()
        }),
    };
    match leases.get_opt(name).await? {
        None => leases
            .create(&PostParams::default(), &lease)
            .await
            .map(|_| ()),
        Some(mut current) => {
            current.spec = lease.spec;
            leases
                .replace(name, &PostParams::default(), &current)
                .await
                .map(|_| ())
        }
    }
}

/// Pods handled at once (a real node's kubelet works on its pods concurrently too).
const CONCURRENT_PODS: usize = 64;

/// Watches every pod (only its own, as the kubelet does, when running as one node's
/// identity); those bound to a simulated node are run (or finished deleting).
async fn run_pods(
    client: kube::Client,
    nodes: Vec<SimNode>,
    own_node: Option<String>,
) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::all(client.clone());
    let node_index: BTreeMap<String, String> = nodes.into_iter().map(|n| (n.name, n.ip)).collect();
    let pod_count = std::sync::atomic::AtomicUsize::new(0);
    let mut config = watcher::Config::default();
    if let Some(node) = own_node {
        config = config.fields(&format!("spec.nodeName={node}"));
    }
    watcher::watcher(pods, config)
        .filter_map(|event| async {
            match event {
                Ok(Event::Apply(pod) | Event::InitApply(pod)) => Some(pod),
                Ok(_) => None,
                Err(err) => {
                    tracing::debug!(%err, "pod watch failed; retrying");
                    None
                }
            }
        })
        .for_each_concurrent(CONCURRENT_PODS, |pod| {
            let (client, node_index, pod_count) = (&client, &node_index, &pod_count);
            async move {
                let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
                let Some(host_ip) = node.as_ref().and_then(|n| node_index.get(n)) else {
                    return;
                };
                let count = pod_count.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                if let Err(err) = step(client, &pod, host_ip, count).await {
                    tracing::info!(pod = ?pod.metadata.name, %err, "pod step failed; retried on its next event");
                }
            }
        })
        .await;
    Ok(())
}

/// What a kubelet would do next with `pod`: finish its deletion, start it, or complete it.
async fn step(
    client: &kube::Client,
    pod: &Pod,
    host_ip: &str,
    pod_count: usize,
) -> Result<(), kube::Error> {
    let (Some(name), Some(namespace)) = (&pod.metadata.name, &pod.metadata.namespace) else {
        return Ok(());
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    if pod.metadata.deletion_timestamp.is_some() {
        // The containers are "stopped": confirm the deletion, as the kubelet does.
        return match api
            .delete(name, &DeleteParams::default().grace_period(0))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(err) => Err(err),
        };
    }
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    let is_job = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|owner| owner.kind == "Job");
    let target = if is_job { "Succeeded" } else { "Running" };
    if phase == target || phase == "Failed" {
        return Ok(());
    }
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let ready = if is_job { "False" } else { "True" };
    let containers: Vec<serde_json::Value> = pod
        .spec
        .iter()
        .flat_map(|spec| spec.containers.iter())
        .map(|container| {
            let state = if is_job {
                json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}})
            } else {
                json!({"running": {"startedAt": now}})
            };
            json!({"name": container.name, "image": container.image, "imageID": "",
                   "ready": !is_job, "started": !is_job, "restartCount": 0, "state": state})
        })
        .collect();
    let condition = |kind: &str, status: &str| json!({"type": kind, "status": status, "lastTransitionTime": now});
    let status = json!({"status": {
        "phase": target,
        "hostIP": host_ip,
        "podIP": format!("10.244.{}.{}", pod_count / 250 % 250, pod_count % 250 + 1),
        "startTime": now,
        "conditions": [
            condition("PodScheduled", "True"),
            condition("Initialized", "True"),
            condition("ContainersReady", ready),
            condition("Ready", ready),
        ],
        "containerStatuses": containers,
    }});
    api.patch_status(name, &manager(), &Patch::Merge(&status))
        .await
        .map(|_| ())
}
