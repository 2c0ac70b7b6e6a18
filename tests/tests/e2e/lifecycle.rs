//! Node lifecycle, taint eviction, volume binding, disruption budgets with `kubectl drain`,
//! and resource quota status, seen through kubectl against simulated nodes (needs the
//! `flotilla` binary and kubectl 1.32).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use flotilla_e2e::{Backend, Flotilla, Kubectl, jsonpath, until};

/// A `flotilla simulate-nodes` process, killed when dropped.
struct Simulator(Child);

impl Simulator {
    fn start(kubeconfig: &str, prefix: &str, count: &str) -> anyhow::Result<Self> {
        let child = Command::new(flotilla_e2e::flotilla_bin()?)
            .args([
                "simulate-nodes",
                "--kubeconfig",
                kubeconfig,
                "--count",
                count,
                "--prefix",
                prefix,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        Ok(Simulator(child))
    }

    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        self.kill();
    }
}

fn contains(haystack: &str, needle: &str) -> anyhow::Result<()> {
    ensure!(
        haystack.contains(needle),
        "expected {needle:?} in:\n{haystack}"
    );
    Ok(())
}

/// Polls `done` every 250 ms until it holds or `within` passes.
const NODE_READY: &str = "{.status.conditions[?(@.type==\"Ready\")].status}";

const POD_ON_LOST: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: NAME}
spec:
  nodeName: lost-0
  containers: [{name: c, image: nginx}]
"#;

const VOLUMES: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: late}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: pv-small, labels: {size: small}}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  storageClassName: manual
  hostPath: {path: /tmp/pv-small}
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: pv-big}
spec:
  capacity: {storage: 5Gi}
  accessModes: [ReadWriteOnce]
  storageClassName: manual
  persistentVolumeReclaimPolicy: Delete
  hostPath: {path: /tmp/pv-big}
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: pv-late}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce]
  storageClassName: late
  hostPath: {path: /tmp/pv-late}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: manual
  resources: {requests: {storage: 500Mi}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: late}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: late
  resources: {requests: {storage: 1Gi}}
"#;

const BIG_CLAIM: &str = r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: big}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: manual
  resources: {requests: {storage: 2Gi}}
"#;

const WEB: &str = r#"
apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      nodeSelector: {kubernetes.io/hostname: sim-0}
      containers: [{name: c, image: nginx}]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web}
spec:
  minAvailable: 2
  selector: {matchLabels: {app: web}}
"#;

const QUOTA: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: team}
---
apiVersion: v1
kind: ResourceQuota
metadata: {name: compute, namespace: team}
spec:
  hard: {pods: "10", requests.cpu: "2", limits.memory: 1Gi, configmaps: "5"}
"#;

const QUOTA_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: NAME, namespace: team}
spec:
  nodeName: sim-1
  containers:
  - name: c
    image: nginx
    resources:
      requests: {cpu: 250m}
      limits: {memory: 128Mi}
"#;

#[test]
fn node_lifecycle_volumes_budgets_and_quota() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    let kubeconfig = kubectl.kubeconfig.to_str().context("path")?.to_string();
    let _main = Simulator::start(&kubeconfig, "sim", "2")?;
    let mut lost = Simulator::start(&kubeconfig, "lost", "1")?;
    until("three nodes are Ready", Duration::from_secs(30), || {
        Ok(kubectl
            .ok(&["get", "nodes", "--no-headers"])?
            .matches(" Ready ")
            .count()
            == 3)
    })?;

    // Two pods on the node about to be lost: one tolerates `unreachable` for 5 s, the other
    // gets the API server's default 300 s (DefaultTolerationSeconds).
    let doomed = POD_ON_LOST.replace("NAME", "doomed").replace(
        "  containers:",
        "  tolerations: [{key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 5}]\n  containers:",
    );
    kubectl.ok_stdin(&["apply", "-f", "-"], &doomed)?;
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &POD_ON_LOST.replace("NAME", "patient"),
    )?;
    let defaults = jsonpath(&kubectl, &["get", "pod", "doomed"], "{.spec.tolerations}")?;
    contains(&defaults, "\"tolerationSeconds\":5")?;
    contains(&defaults, "node.kubernetes.io/not-ready")?;
    kubectl.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/doomed",
        "pod/patient",
        "--timeout=30s",
    ])?;
    lost.kill();
    let lost_at = Instant::now();

    // While lost-0's grace period runs: volumes, budgets and quota.
    volumes(&kubectl)?;
    drain(&kubectl)?;
    quota(&kubectl)?;

    // lost-0 goes Unknown after the 40 s grace period, tainted unreachable.
    until("lost-0 is Unknown", Duration::from_secs(90), || {
        Ok(jsonpath(&kubectl, &["get", "node", "lost-0"], NODE_READY)? == "Unknown")
    })?;
    // The 40 s run from the last heartbeat seen, which the simulator sent up to 10 s before
    // it was killed (the node monitor sees a renewal at once, as upstream's informer does).
    ensure!(
        lost_at.elapsed() >= Duration::from_secs(40 - 10),
        "lost-0 went Unknown before its grace period"
    );
    let reason = jsonpath(
        &kubectl,
        &["get", "node", "lost-0"],
        "{.status.conditions[?(@.type==\"Ready\")].reason}: {.status.conditions[?(@.type==\"Ready\")].message}",
    )?;
    ensure!(
        reason == "NodeStatusUnknown: Kubelet stopped posting node status.",
        "{reason}"
    );
    contains(
        &kubectl.ok(&["get", "node", "lost-0"])?,
        "lost-0   NotReady",
    )?;
    until(
        "lost-0 is tainted unreachable",
        Duration::from_secs(20),
        || {
            let taints = jsonpath(
                &kubectl,
                &["get", "node", "lost-0"],
                "{range .spec.taints[*]}{.key}:{.effect} {end}",
            )?;
            Ok(taints.contains("node.kubernetes.io/unreachable:NoExecute")
                && taints.contains("node.kubernetes.io/unreachable:NoSchedule"))
        },
    )?;

    // The 5 s toleration runs out: the taint manager deletes the pod (it stays Terminating,
    // as no kubelet confirms), with upstream's DisruptionTarget condition.
    until("doomed is being deleted", Duration::from_secs(30), || {
        Ok(!jsonpath(
            &kubectl,
            &["get", "pod", "doomed"],
            "{.metadata.deletionTimestamp}",
        )?
        .is_empty())
    })?;
    let target = jsonpath(
        &kubectl,
        &["get", "pod", "doomed"],
        "{.status.conditions[?(@.type==\"DisruptionTarget\")].reason}",
    )?;
    ensure!(target == "DeletionByTaintManager", "{target}");
    // The other pod keeps its 300 s, but it is not Ready any more.
    ensure!(
        jsonpath(
            &kubectl,
            &["get", "pod", "patient"],
            "{.metadata.deletionTimestamp}"
        )?
        .is_empty(),
        "patient was deleted before its 300 s toleration ran out"
    );
    until("patient is not Ready", Duration::from_secs(20), || {
        Ok(jsonpath(
            &kubectl,
            &["get", "pod", "patient"],
            "{.status.conditions[?(@.type==\"Ready\")].status}",
        )? == "False")
    })?;

    // The node comes back: Ready, untainted, and the doomed pod's deletion is confirmed.
    let _back = Simulator::start(&kubeconfig, "lost", "1")?;
    until(
        "lost-0 is Ready and untainted",
        Duration::from_secs(30),
        || {
            let ready = jsonpath(&kubectl, &["get", "node", "lost-0"], NODE_READY)?;
            let taints = jsonpath(&kubectl, &["get", "node", "lost-0"], "{.spec.taints}")?;
            Ok(ready == "True" && taints.is_empty())
        },
    )?;
    until("doomed is gone", Duration::from_secs(30), || {
        Ok(kubectl.fails(&["get", "pod", "doomed"]).is_ok())
    })?;
    Ok(())
}

/// A claim binds to the smallest matching volume; WaitForFirstConsumer waits for the
/// scheduler's node; released volumes are kept (Retain) or deleted (Delete).
fn volumes(kubectl: &Kubectl) -> anyhow::Result<()> {
    kubectl.ok_stdin(&["apply", "-f", "-"], VOLUMES)?;
    until("claim data is Bound", Duration::from_secs(30), || {
        Ok(jsonpath(kubectl, &["get", "pvc", "data"], "{.status.phase}")? == "Bound")
    })?;
    let claim = jsonpath(
        kubectl,
        &["get", "pvc", "data"],
        "{.spec.volumeName} {.status.capacity.storage} {.metadata.annotations}",
    )?;
    contains(&claim, "pv-small 1Gi")?;
    contains(&claim, "\"pv.kubernetes.io/bind-completed\":\"yes\"")?;
    contains(&claim, "\"pv.kubernetes.io/bound-by-controller\":\"yes\"")?;
    let volume = jsonpath(
        kubectl,
        &["get", "pv", "pv-small"],
        "{.status.phase} {.spec.claimRef.namespace}/{.spec.claimRef.name}",
    )?;
    ensure!(volume == "Bound default/data", "{volume}");
    contains(&kubectl.ok(&["get", "pv", "pv-big"])?, "Available")?;
    // The late claim was seen in the same passes, but waits for a consumer's node.
    ensure!(
        jsonpath(kubectl, &["get", "pvc", "late"], "{.status.phase}")? == "Pending",
        "a WaitForFirstConsumer claim bound without a selected node"
    );
    kubectl.ok(&[
        "annotate",
        "pvc",
        "late",
        "volume.kubernetes.io/selected-node=sim-1",
    ])?;
    until("claim late is Bound", Duration::from_secs(30), || {
        Ok(jsonpath(kubectl, &["get", "pvc", "late"], "{.spec.volumeName}")? == "pv-late")
    })?;

    // Reclaim: Retain → Released, Delete → the volume goes.
    kubectl.ok(&["delete", "pvc", "data"])?;
    until("pv-small is Released", Duration::from_secs(30), || {
        Ok(jsonpath(kubectl, &["get", "pv", "pv-small"], "{.status.phase}")? == "Released")
    })?;
    kubectl.ok_stdin(&["apply", "-f", "-"], BIG_CLAIM)?;
    until(
        "claim big is bound to pv-big",
        Duration::from_secs(30),
        || Ok(jsonpath(kubectl, &["get", "pvc", "big"], "{.spec.volumeName}")? == "pv-big"),
    )?;
    kubectl.ok(&["delete", "pvc", "big"])?;
    until("pv-big is deleted", Duration::from_secs(30), || {
        Ok(kubectl.fails(&["get", "pv", "pv-big"]).is_ok())
    })
}

/// `kubectl drain` is refused (429) while the budget allows no disruption, and drains once
/// it does.
fn drain(kubectl: &Kubectl) -> anyhow::Result<()> {
    kubectl.ok_stdin(&["apply", "-f", "-"], WEB)?;
    until(
        "the budget sees two healthy pods",
        Duration::from_secs(30),
        || {
            Ok(jsonpath(
                kubectl,
                &["get", "pdb", "web"],
                "{.status.currentHealthy}/{.status.desiredHealthy}/{.status.expectedPods}/{.status.disruptionsAllowed}",
            )? == "2/2/2/0")
        },
    )?;
    let condition = jsonpath(
        kubectl,
        &["get", "pdb", "web"],
        "{.status.conditions[?(@.type==\"DisruptionAllowed\")].status} {.status.conditions[?(@.type==\"DisruptionAllowed\")].reason}",
    )?;
    ensure!(condition == "False InsufficientPods", "{condition}");
    let refused = kubectl.fails(&["drain", "sim-0", "--timeout=12s", "--v=6"])?;
    contains(&refused, "429")?;
    contains(
        &refused,
        "Cannot evict pod as it would violate the pod's disruption budget.",
    )?;
    ensure!(
        jsonpath(
            kubectl,
            &["get", "pods", "-l", "app=web"],
            "{.items[*].metadata.deletionTimestamp}"
        )?
        .is_empty(),
        "a pod was evicted despite the budget"
    );
    contains(
        &jsonpath(kubectl, &["get", "node", "sim-0"], "{.spec.taints}")?,
        "node.kubernetes.io/unschedulable",
    )?;

    kubectl.ok(&[
        "patch",
        "pdb",
        "web",
        "--type=merge",
        "-p",
        "{\"spec\":{\"minAvailable\":0}}",
    ])?;
    let drained = kubectl.ok(&["drain", "sim-0", "--timeout=60s"])?;
    contains(&drained, "evicted")?;
    contains(&drained, "node/sim-0 drained")?;
    kubectl.ok(&["uncordon", "sim-0"])?;
    Ok(())
}

/// A ResourceQuota's status counts the namespace's pods, their requests and limits, and its
/// ConfigMaps.
fn quota(kubectl: &Kubectl) -> anyhow::Result<()> {
    kubectl.ok_stdin(&["apply", "-f", "-"], QUOTA)?;
    // Admission refuses creates against a quota whose usage is not yet counted (upstream's
    // "status unknown for quota").
    until("the quota is counted", Duration::from_secs(30), || {
        Ok(!jsonpath(
            kubectl,
            &["-n", "team", "get", "quota", "compute"],
            "{.status.used}",
        )?
        .is_empty())
    })?;
    for name in ["q1", "q2"] {
        kubectl.ok_stdin(&["apply", "-f", "-"], &QUOTA_POD.replace("NAME", name))?;
    }
    let used = || {
        jsonpath(
            kubectl,
            &["-n", "team", "get", "quota", "compute"],
            "{.status.used.pods} {.status.used.requests\\.cpu} {.status.used.limits\\.memory} {.status.used.configmaps} {.status.hard.requests\\.cpu}",
        )
    };
    until("the quota counts two pods", Duration::from_secs(30), || {
        Ok(used()? == "2 500m 256Mi 1 2")
    })?;
    kubectl.ok(&["-n", "team", "delete", "pod", "q1", "--timeout=30s"])?;
    until("the quota counts one pod", Duration::from_secs(30), || {
        Ok(used()? == "1 250m 128Mi 1 2")
    })?;
    contains(
        &kubectl.ok(&["-n", "team", "describe", "quota", "compute"])?,
        "requests.cpu",
    )
}
