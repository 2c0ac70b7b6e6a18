//! The Node object: registration from the real machine (upstream `kubelet_node_status.go`
//! `registerWithAPIServer` / `initialNode` and the `nodestatus` setters), the Lease heartbeat
//! in `kube-node-lease` (`pkg/kubelet/nodelease`), the Ready condition, which follows
//! whether the container runtime answers, and the pressure conditions the eviction manager
//! holds.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::watch;

use crate::cri::Cri;
use crate::machine::Machine;

/// How often the Lease is renewed (upstream: every 10 s of a 40 s lease).
pub const LEASE_RENEW: Duration = Duration::from_secs(10);
const LEASE_SECONDS: i32 = 40;
/// How often the node's conditions are reported even when unchanged (upstream
/// `nodeStatusReportFrequency`, shortened: there is no status-change detection yet).
const STATUS_REFRESH: Duration = Duration::from_secs(60);
/// The kubelet version this node reports.
pub const KUBELET_VERSION: &str = "v1.33.0-flotilla";
/// The field manager of everything the kubelet writes.
pub const MANAGER: &str = "flotilla-kubelet";

/// What the node registers as.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// The Node's name.
    pub name: String,
    /// Its InternalIP (the hostIP of its pods).
    pub ip: String,
    /// `--node-labels` (and the node config's labels).
    pub labels: BTreeMap<String, String>,
    /// `--register-with-taints`.
    pub taints: Vec<Taint>,
    /// `--max-pods`.
    pub max_pods: u32,
    /// The machine.
    pub machine: Machine,
    /// `<runtime name>://<runtime version>` from CRI `Version`.
    pub runtime_version: String,
    /// The port of the kubelet's HTTPS server (`status.daemonEndpoints.kubeletEndpoint.Port`).
    pub kubelet_port: u16,
}

/// The field manager's patch parameters.
pub fn manager() -> PatchParams {
    PatchParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    }
}

/// Parses `--node-labels` (`k=v,k2=v2`).
pub fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .filter(|(k, _)| !k.is_empty())
                .ok_or_else(|| format!("invalid label {pair:?}: expected key=value"))
        })
        .collect()
}

/// Parses `--register-with-taints` (`key=value:Effect,key:Effect`), as upstream's
/// `ParseTaints`.
pub fn parse_taints(text: &str) -> Result<Vec<Taint>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|spec| {
            let (key_value, effect) = spec
                .rsplit_once(':')
                .ok_or_else(|| format!("invalid taint {spec:?}: expected key[=value]:Effect"))?;
            if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
                return Err(format!(
                    "invalid taint effect {effect:?}: must be NoSchedule, PreferNoSchedule or NoExecute"
                ));
            }
            let (key, value) = match key_value.split_once('=') {
                Some((k, v)) => (k, Some(v.to_string())),
                None => (key_value, None),
            };
            if key.is_empty() {
                return Err(format!("invalid taint {spec:?}: empty key"));
            }
            Ok(Taint {
                key: key.to_string(),
                value,
                effect: effect.to_string(),
                time_added: None,
            })
        })
        .collect()
}

/// The Node the kubelet creates: the well-known labels, then `--node-labels`, its taints.
pub fn initial_node(spec: &NodeSpec) -> Result<Node, serde_json::Error> {
    let mut labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_string(), spec.name.clone()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        (
            "kubernetes.io/arch".to_string(),
            spec.machine.architecture.to_string(),
        ),
        ("beta.kubernetes.io/os".to_string(), "linux".to_string()),
        (
            "beta.kubernetes.io/arch".to_string(),
            spec.machine.architecture.to_string(),
        ),
    ]);
    labels.extend(spec.labels.clone());
    let mut node = json!({"metadata": {"name": spec.name, "labels": labels}});
    if !spec.taints.is_empty() {
        node["spec"] = json!({"taints": spec.taints});
    }
    serde_json::from_value(node)
}

/// The node's conditions: Ready follows the runtime; MemoryPressure, DiskPressure and
/// PIDPressure are those the eviction manager holds (`pressure`).
pub fn conditions(
    runtime_ok: bool,
    pressure: &BTreeSet<&'static str>,
    now: &str,
) -> serde_json::Value {
    let condition = |kind: &str, status: &str, reason: &str, message: &str| {
        json!({"type": kind, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    let ready = if runtime_ok {
        condition(
            "Ready",
            "True",
            "KubeletReady",
            "kubelet is posting ready status",
        )
    } else {
        condition(
            "Ready",
            "False",
            "KubeletNotReady",
            "container runtime is down",
        )
    };
    // (type, reason and message without pressure, with pressure): upstream's wording.
    let kinds = [
        (
            "MemoryPressure",
            (
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            (
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available",
            ),
        ),
        (
            "DiskPressure",
            ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            ("KubeletHasDiskPressure", "kubelet has disk pressure"),
        ),
        (
            "PIDPressure",
            (
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
            (
                "KubeletHasInsufficientPID",
                "kubelet has insufficient PID available",
            ),
        ),
    ];
    let mut all: Vec<serde_json::Value> = kinds
        .into_iter()
        .map(|(kind, fine, under)| {
            if pressure.contains(kind) {
                condition(kind, "True", under.0, under.1)
            } else {
                condition(kind, "False", fine.0, fine.1)
            }
        })
        .collect();
    all.push(ready);
    serde_json::Value::Array(all)
}

/// The node's status: capacity, addresses, nodeInfo, conditions (no pressure yet).
pub fn node_status(spec: &NodeSpec, runtime_ok: bool, now: &str) -> serde_json::Value {
    let m = &spec.machine;
    let resources = json!({
        "cpu": m.cpus.to_string(),
        "memory": format!("{}Ki", m.memory_kib),
        "pods": spec.max_pods.to_string(),
    });
    json!({"status": {
        "capacity": resources,
        "allocatable": resources,
        "addresses": [
            {"type": "InternalIP", "address": spec.ip},
            {"type": "Hostname", "address": spec.name},
        ],
        "nodeInfo": {
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": "",
            "containerRuntimeVersion": spec.runtime_version,
            "operatingSystem": "linux",
            "architecture": m.architecture,
            "osImage": m.os_image,
            "kernelVersion": m.kernel_version,
            "machineID": m.machine_id,
            "systemUUID": m.machine_id,
            "bootID": m.boot_id,
        },
        "daemonEndpoints": {"kubeletEndpoint": {"Port": spec.kubelet_port}},
        "conditions": conditions(runtime_ok, &BTreeSet::new(), now),
    }})
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// Creates the Node (or adopts an existing one of that name, refreshing its labels) and
/// reports its status.
pub async fn register(client: &kube::Client, spec: &NodeSpec) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = initial_node(spec)?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => tracing::info!(node = %spec.name, "node registered"),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let labels = json!({"metadata": {"labels": node.metadata.labels}});
            nodes
                .patch(&spec.name, &manager(), &Patch::Merge(&labels))
                .await
                .with_context(|| format!("updating node {}'s labels", spec.name))?;
            tracing::info!(node = %spec.name, "node already registered");
        }
        Err(err) => return Err(err).with_context(|| format!("registering node {}", spec.name)),
    }
    nodes
        .patch_status(
            &spec.name,
            &manager(),
            &Patch::Merge(&node_status(spec, true, &now())),
        )
        .await
        .with_context(|| format!("reporting node {}'s status", spec.name))?;
    Ok(())
}

/// Renews the Lease every [`LEASE_RENEW`]; reports conditions when the runtime's health or
/// the node's pressure changes, and every [`STATUS_REFRESH`]. Runs until the process ends.
pub async fn heartbeat(
    client: kube::Client,
    spec: NodeSpec,
    mut cri: Cri,
    mut pressure: watch::Receiver<BTreeSet<&'static str>>,
) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let nodes: Api<Node> = Api::all(client);
    let mut last_status = Instant::now();
    let mut last_reported: Option<(bool, BTreeSet<&'static str>)> = None;
    let mut next_renewal = Instant::now();
    loop {
        if Instant::now() >= next_renewal {
            if let Err(err) = renew(&leases, &spec.name).await {
                tracing::warn!(%err, "lease renewal failed");
            }
            next_renewal = Instant::now() + LEASE_RENEW;
        }
        let ok = cri.version().await.is_ok();
        let current = (ok, pressure.borrow_and_update().clone());
        if last_reported.as_ref() != Some(&current) || last_status.elapsed() >= STATUS_REFRESH {
            let status = json!({"status": {"conditions": conditions(ok, &current.1, &now())}});
            match nodes
                .patch_status(&spec.name, &manager(), &Patch::Merge(&status))
                .await
            {
                Ok(_) => {
                    last_reported = Some(current);
                    last_status = Instant::now();
                }
                Err(err) => tracing::warn!(%err, "node status update failed"),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep_until(next_renewal.into()) => {}
            changed = pressure.changed() => if changed.is_err() {
                tokio::time::sleep_until(next_renewal.into()).await;
            },
        }
    }
}

async fn renew(leases: &Api<Lease>, name: &str) -> Result<(), kube::Error> {
    let spec = LeaseSpec {
        holder_identity: Some(name.to_string()),
        lease_duration_seconds: Some(LEASE_SECONDS),
        renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        ..Default::default()
    };
    match leases.get_opt(name).await? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    ..Default::default()
                },
                spec: Some(spec),
            };
            leases.create(&PostParams::default(), &lease).await?;
        }
        Some(mut current) => {
            current.spec = Some(spec);
            leases
                .replace(name, &PostParams::default(), &current)
                .await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_like_upstream() {
        let labels = parse_labels("team=infra, zone=a,").expect("labels");
        assert_eq!(labels["team"], "infra");
        assert_eq!(labels["zone"], "a");
        assert!(parse_labels("novalue").is_err());
        let taints = parse_taints("dedicated=gpu:NoSchedule,spot:PreferNoSchedule").expect("t");
        assert_eq!(
            (
                taints[0].key.as_str(),
                taints[0].value.as_deref(),
                taints[0].effect.as_str()
            ),
            ("dedicated", Some("gpu"), "NoSchedule")
        );
        assert_eq!(
            (taints[1].key.as_str(), taints[1].value.as_deref()),
            ("spot", None)
        );
        assert!(parse_taints("a=b:Sometimes").is_err());
        assert!(parse_taints("a=b").is_err());
        assert!(parse_taints("=b:NoSchedule").is_err());
    }

    #[test]
    fn the_node_carries_machine_facts() {
        let spec = NodeSpec {
            name: "n1".into(),
            ip: "10.0.0.1".into(),
            labels: BTreeMap::from([("team".into(), "infra".into())]),
            taints: parse_taints("a:NoSchedule").expect("taints"),
            max_pods: 110,
            machine: Machine {
                cpus: 2,
                memory_kib: 1024,
                architecture: "amd64",
                ..Default::default()
            },
            runtime_version: "containerd://1.6.20".into(),
            kubelet_port: 10250,
        };
        let node = initial_node(&spec).expect("node");
        let labels = node.metadata.labels.expect("labels");
        assert_eq!(labels["kubernetes.io/hostname"], "n1");
        assert_eq!(labels["kubernetes.io/os"], "linux");
        assert_eq!(labels["kubernetes.io/arch"], "amd64");
        assert_eq!(labels["team"], "infra");
        assert_eq!(node.spec.and_then(|s| s.taints).map(|t| t.len()), Some(1));
        let status = node_status(&spec, true, "2026-01-01T00:00:00Z");
        assert_eq!(status["status"]["capacity"]["cpu"], "2");
        assert_eq!(status["status"]["capacity"]["memory"], "1024Ki");
        assert_eq!(status["status"]["capacity"]["pods"], "110");
        assert_eq!(
            status["status"]["nodeInfo"]["containerRuntimeVersion"],
            "containerd://1.6.20"
        );
        assert_eq!(status["status"]["addresses"][0]["address"], "10.0.0.1");
        assert_eq!(
            status["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"],
            10250
        );
        let ready = &status["status"]["conditions"][3];
        assert_eq!(
            (ready["type"].as_str(), ready["status"].as_str()),
            (Some("Ready"), Some("True"))
        );
        let down = conditions(false, &BTreeSet::new(), "t");
        assert_eq!(down[3]["reason"], "KubeletNotReady");
        let pressed = conditions(true, &BTreeSet::from(["DiskPressure"]), "t");
        assert_eq!(
            (pressed[1]["status"].as_str(), pressed[1]["reason"].as_str()),
            (Some("True"), Some("KubeletHasDiskPressure"))
        );
        assert_eq!(pressed[0]["status"], "False");
    }
}
