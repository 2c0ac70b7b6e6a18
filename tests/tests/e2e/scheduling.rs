//! The scheduler seen through kubectl on simulated nodes: a pod of a higher PriorityClass
//! preempts a lower-priority pod (victim deleted, `Preempted` event, the pod runs on the freed
//! node), and a pod whose required anti-affinity no node satisfies reports upstream's message.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, ensure};
use flotilla_e2e::{Backend, Flotilla, Kubectl};

const PODS: &str = r#"
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: high}
value: 1000
---
apiVersion: v1
kind: Pod
metadata: {name: low-0, labels: {app: low}}
spec:
  containers: [{name: c, image: nginx, resources: {requests: {cpu: 700m}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: low-1, labels: {app: low}}
spec:
  containers: [{name: c, image: nginx, resources: {requests: {cpu: 700m}}}]
"#;

const URGENT: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: urgent, labels: {app: urgent}}
spec:
  priorityClassName: high
  containers: [{name: c, image: nginx, resources: {requests: {cpu: 700m}}}]
"#;

const LONELY: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: lonely}
spec:
  affinity:
    podAntiAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
      - labelSelector:
          matchExpressions: [{key: app, operator: In, values: [low, urgent]}]
        topologyKey: kubernetes.io/hostname
  containers: [{name: c, image: nginx}]
"#;

fn until(what: &str, done: impl FnMut() -> anyhow::Result<bool>) -> anyhow::Result<()> {
    flotilla_e2e::until(what, Duration::from_secs(60), done)
}

fn low_pods(kubectl: &Kubectl) -> anyhow::Result<usize> {
    Ok(kubectl
        .ok(&[
            "get",
            "pods",
            "-l",
            "app=low",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])?
        .split_whitespace()
        .count())
}

#[test]
fn higher_priority_pods_preempt_and_anti_affinity_is_reported() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    let kubeconfig = kubectl.kubeconfig.to_str().context("path")?.to_string();
    let mut simulator = Command::new(flotilla_e2e::flotilla_bin()?)
        .args([
            "simulate-nodes",
            "--kubeconfig",
            &kubeconfig,
            "--count",
            "2",
            "--cpu",
            "1",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let outcome = (|| -> anyhow::Result<()> {
        until("two Ready nodes", || {
            Ok(kubectl
                .ok(&["get", "nodes", "--no-headers"])?
                .matches(" Ready ")
                .count()
                == 2)
        })?;
        // Two 700m pods fill the two 1-CPU nodes, one each.
        kubectl.ok_stdin(&["apply", "-f", "-"], PODS)?;
        kubectl.ok(&[
            "wait",
            "--for=condition=Ready",
            "pod/low-0",
            "pod/low-1",
            "--timeout=30s",
        ])?;
        // The PriorityClass's value makes it more important: one low pod is evicted for it.
        kubectl.ok_stdin(&["apply", "-f", "-"], URGENT)?;
        kubectl.ok(&[
            "wait",
            "--for=condition=Ready",
            "pod/urgent",
            "--timeout=60s",
        ])?;
        until("one low pod is left", || Ok(low_pods(&kubectl)? == 1))?;
        // Priority admission resolved the class into the pod's spec; an unknown class is
        // refused.
        let priority = kubectl.ok(&[
            "get",
            "pod",
            "urgent",
            "-o",
            "jsonpath={.spec.priority}/{.spec.preemptionPolicy}",
        ])?;
        ensure!(
            priority == "1000/PreemptLowerPriority",
            "urgent's priority: {priority}"
        );
        let refused = kubectl.fails(&[
            "run",
            "nobody",
            "--image=nginx",
            "--overrides={\"spec\":{\"priorityClassName\":\"missing\"}}",
        ])?;
        ensure!(
            refused.contains(
                "pods \"nobody\" is forbidden: no PriorityClass with name missing was found"
            ),
            "{refused}"
        );
        let events = kubectl.ok(&["get", "events"])?;
        ensure!(
            events.contains("Preempted"),
            "no Preempted event in:\n{events}"
        );
        // Each node now runs a pod the anti-affinity excludes.
        kubectl.ok_stdin(&["apply", "-f", "-"], LONELY)?;
        kubectl.ok(&[
            "wait",
            "--for=condition=PodScheduled=False",
            "pod/lonely",
            "--timeout=30s",
        ])?;
        let message = kubectl.ok(&[
            "get",
            "pod",
            "lonely",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"PodScheduled\")].message}",
        ])?;
        ensure!(
            message.contains(
                "0/2 nodes are available: 2 node(s) didn't match pod anti-affinity rules. \
                 preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod."
            ),
            "unexpected message: {message}"
        );
        Ok(())
    })();
    let _ = simulator.kill();
    let _ = simulator.wait();
    outcome
}
