//! The real kubelet on containerd (`node-image/kubelet`): a node's own containerd with the
//! locally built images (`node-image/image/`), `flotilla-kubelet` registering a Ready Node
//! against `flotilla up`, and pods driven by stock kubectl 1.32 — Running with a pod IP,
//! crash-looping with back-off, `ErrImageNeverPull`, `CreateContainerConfigError`, deletion
//! removing the sandbox, and a SIGKILLed kubelet adopting its running container on restart.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, ensure};
use flotilla_e2e::nodes::{Containerd, NodeDaemon, SingleNode};
use flotilla_e2e::{Flotilla, Kubectl, jsonpath, until};

const NODE: &str = "kubelet-e2e";
const POD_CIDR: &str = "10.244.77.0/24";
const KUBELET_ARGS: &[&str] = &["--node-labels", "flotilla.dev/pool=e2e"];

/// The kubelet, started inside the node's network namespace.
fn start_kubelet(
    flotilla: &Flotilla,
    containerd: &Containerd,
    dir: &Path,
) -> anyhow::Result<NodeDaemon> {
    NodeDaemon::kubelet(containerd, &flotilla.kubeconfig, NODE, dir, KUBELET_ARGS)
}

const RUNTIME_CLASSES: &str = r#"
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: runc}
handler: runc
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: nope}
handler: nope
---
apiVersion: v1
kind: Pod
metadata: {name: on-runc}
spec:
  nodeName: kubelet-e2e
  runtimeClassName: runc
  terminationGracePeriodSeconds: 1
  containers:
  - {name: main, image: flotilla.local/busybox:1, imagePullPolicy: Never, command: [sleep, "3600"]}
---
apiVersion: v1
kind: Pod
metadata: {name: on-nope}
spec:
  nodeName: kubelet-e2e
  runtimeClassName: nope
  terminationGracePeriodSeconds: 1
  containers:
  - {name: main, image: flotilla.local/busybox:1, imagePullPolicy: Never, command: [sleep, "3600"]}
"#;

const PODS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: busybox}
spec:
  nodeName: kubelet-e2e
  terminationGracePeriodSeconds: 3
  containers:
  - name: main
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    command: [sleep, "3600"]
    env:
    - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
---
apiVersion: v1
kind: Pod
metadata: {name: crash}
spec:
  nodeName: kubelet-e2e
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    command: [sh, -c, "exit 1"]
---
apiVersion: v1
kind: Pod
metadata: {name: noimage}
spec:
  nodeName: kubelet-e2e
  containers:
  - name: main
    image: flotilla.local/absent:1
    imagePullPolicy: Never
---
apiVersion: v1
kind: Pod
metadata: {name: noconfig}
spec:
  nodeName: kubelet-e2e
  containers:
  - name: main
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    command: [sleep, "3600"]
    env:
    - {name: X, valueFrom: {configMapKeyRef: {name: absent, key: k}}}
"#;

fn waiting_reason(kubectl: &Kubectl, pod: &str) -> anyhow::Result<String> {
    jsonpath(
        kubectl,
        &["get", "pod", pod],
        "{.status.containerStatuses[0].state.waiting.reason}",
    )
}

fn with_log<T>(kubelet: &NodeDaemon, outcome: anyhow::Result<T>) -> anyhow::Result<T> {
    outcome.with_context(|| format!("kubelet log:\n{}", kubelet.log()))
}

#[test]
fn kubelet_runs_pods_on_containerd() -> anyhow::Result<()> {
    // At most two exec, attach or port-forward sessions at once (`serve` allows 100 per
    // cluster; `up` none unless asked).
    let mut node =
        SingleNode::start_with(NODE, POD_CIDR, KUBELET_ARGS, &["--tenant-max-streams", "2"])?;
    let images = node.containerd.ctr(&["images", "ls", "-q"])?;
    ensure!(
        images.contains("flotilla.local/busybox:1") && images.contains("flotilla.local/pause:1"),
        "the local images are not in containerd: {images}"
    );
    let kubectl = node.flotilla.kubectl();
    let (flotilla, containerd, kubelet) = (&node.flotilla, &node.containerd, &mut node.kubelet);
    let outcome = scenario(flotilla, &kubectl, containerd, kubelet, node.dir.path());
    with_log(&node.kubelet, outcome)
}

/// Two sessions held open (`kubectl exec -i … cat`, its stdin kept open) fill the cluster's
/// `--tenant-max-streams 2`: a third is answered 429, and once one ends another is served.
fn streams_are_limited(kubectl: &Kubectl) -> anyhow::Result<()> {
    let hold = || -> anyhow::Result<std::process::Child> {
        Ok(std::process::Command::new(flotilla_e2e::kubectl_bin()?)
            .arg("--kubeconfig")
            .arg(&kubectl.kubeconfig)
            .args(["exec", "-i", "busybox", "-c", "main", "--", "cat"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?)
    };
    let mut held: Vec<std::process::Child> = Vec::new();
    let outcome = (|| -> anyhow::Result<String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            ensure!(
                std::time::Instant::now() < deadline,
                "two sessions held open did not fill the limit"
            );
            // A session that just ended (the debugger's above) frees its place moments
            // after its kubectl exits: a hold refused meanwhile is started again.
            held.retain_mut(|session| matches!(session.try_wait(), Ok(None)));
            while held.len() < 2 {
                held.push(hold()?);
            }
            std::thread::sleep(Duration::from_secs(1));
            if held.iter_mut().any(|s| !matches!(s.try_wait(), Ok(None))) {
                continue;
            }
            let out = kubectl.run(&["exec", "busybox", "-c", "main", "--", "true"], None, &[])?;
            if !out.status.success() {
                return Ok(String::from_utf8_lossy(&out.stderr).into_owned());
            }
        }
    })();
    // Ending one (its stdin closed, so `cat` exits) gives its place back.
    let ended = match held.first_mut() {
        Some(first) => {
            drop(first.stdin.take());
            Some(first.wait()?)
        }
        None => None,
    };
    for other in held.iter_mut() {
        let _ = other.kill();
        let _ = other.wait();
    }
    let stderr = outcome?;
    ensure!(
        stderr.contains("Too many requests"),
        "the third session's refusal: {stderr}"
    );
    ensure!(
        ended.is_some_and(|e| e.success()),
        "the held session ended with {ended:?}"
    );
    // The service notices a session's end when its connections close: moments after.
    until("a session is served again", Duration::from_secs(10), || {
        let out = kubectl.run(
            &["exec", "busybox", "-c", "main", "--", "echo", "again"],
            None,
            &[],
        )?;
        Ok(out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "again")
    })
}

fn scenario(
    flotilla: &Flotilla,
    kubectl: &Kubectl,
    containerd: &Containerd,
    kubelet: &mut NodeDaemon,
    dir: &Path,
) -> anyhow::Result<()> {
    let ready = r#"{.status.conditions[?(@.type=="Ready")].status}"#;
    until("the node is Ready", Duration::from_secs(60), || {
        Ok(jsonpath(kubectl, &["get", "node", NODE], ready).unwrap_or_default() == "True")
    })?;
    let node = kubectl.ok(&["get", "node", NODE, "-o", "json"])?;
    let node: serde_json::Value = serde_json::from_str(&node)?;
    let labels = &node["metadata"]["labels"];
    ensure!(labels["kubernetes.io/os"] == "linux", "labels: {labels}");
    ensure!(labels["kubernetes.io/hostname"] == NODE, "labels: {labels}");
    ensure!(labels["flotilla.dev/pool"] == "e2e", "labels: {labels}");
    let info = &node["status"]["nodeInfo"];
    ensure!(
        info["containerRuntimeVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("containerd://")),
        "nodeInfo: {info}"
    );
    ensure!(
        node["status"]["capacity"]["cpu"]
            .as_str()
            .is_some_and(|c| c.parse::<u32>().is_ok_and(|n| n >= 1)),
        "capacity: {}",
        node["status"]["capacity"]
    );
    let holder = jsonpath(
        kubectl,
        &["-n", "kube-node-lease", "get", "lease", NODE],
        "{.spec.holderIdentity}",
    )?;
    ensure!(holder == NODE, "lease holder {holder:?}");

    flotilla.ok_stdin(&["apply", "-f", "-"], PODS)?;

    // A pod with a local image runs, with an IP from the node's pod CIDR.
    until("busybox is Running", Duration::from_secs(60), || {
        Ok(jsonpath(kubectl, &["get", "pod", "busybox"], "{.status.phase}")? == "Running")
    })?;
    let ip = jsonpath(kubectl, &["get", "pod", "busybox"], "{.status.podIP}")?;
    ensure!(ip.starts_with("10.244.77."), "pod IP {ip:?}");
    let ips = jsonpath(
        kubectl,
        &["get", "pod", "busybox"],
        "{.status.podIPs[0].ip}",
    )?;
    ensure!(ips == ip, "podIPs {ips:?}");
    let conditions = jsonpath(
        kubectl,
        &["get", "pod", "busybox"],
        r#"{range .status.conditions[*]}{.type}={.status} {end}"#,
    )?;
    for want in [
        "PodScheduled=True",
        "Initialized=True",
        "ContainersReady=True",
        "Ready=True",
    ] {
        ensure!(conditions.contains(want), "conditions: {conditions}");
    }
    let wide = kubectl.ok(&["get", "pod", "busybox", "-o", "wide"])?;
    ensure!(wide.contains("1/1") && wide.contains(NODE), "{wide}");

    // A RuntimeClass's handler is the runtime the sandbox runs on: `runc` runs, a handler
    // containerd does not have fails the sandbox with upstream's event.
    flotilla.ok_stdin(&["apply", "-f", "-"], RUNTIME_CLASSES)?;
    until(
        "the runc-class pod is Running",
        Duration::from_secs(60),
        || Ok(jsonpath(kubectl, &["get", "pod", "on-runc"], "{.status.phase}")? == "Running"),
    )?;
    until(
        "the missing handler's sandbox failure is reported",
        Duration::from_secs(60),
        || {
            let events = kubectl.ok(&[
                "get",
                "events",
                "--field-selector=involvedObject.name=on-nope",
                "-o",
                "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}",
            ])?;
            Ok(
                events.contains("FailedCreatePodSandBox: Failed to create pod sandbox: rpc error:")
                    && events.contains(r#"no runtime for "nope" is configured"#),
            )
        },
    )?;
    kubectl.ok(&["delete", "pod", "on-runc", "on-nope", "--wait=false"])?;

    // `kubectl debug` adds an ephemeral container; the kubelet starts it (once) in the pod.
    kubectl.ok(&[
        "debug",
        "busybox",
        "--image=flotilla.local/busybox:1",
        "--container=debugger",
        "--target=main",
        "--",
        "sleep",
        "3600",
    ])?;
    until("the debugger runs", Duration::from_secs(60), || {
        Ok(!jsonpath(
            kubectl,
            &["get", "pod", "busybox"],
            "{.status.ephemeralContainerStatuses[0].state.running.startedAt}",
        )?
        .is_empty())
    })?;
    let echoed = kubectl.ok(&[
        "exec",
        "busybox",
        "-c",
        "debugger",
        "--",
        "echo",
        "debugging",
    ])?;
    ensure!(
        echoed.trim() == "debugging",
        "exec in the debugger: {echoed:?}"
    );
    // With `--target` it shares main's process namespace: it sees main's sleep beside its own.
    let processes = kubectl.ok(&["exec", "busybox", "-c", "debugger", "--", "ps"])?;
    ensure!(
        processes.matches("sleep 3600").count() == 2,
        "the debugger's processes: {processes}"
    );
    streams_are_limited(kubectl)?;

    // An absent image under pull policy Never.
    until(
        "noimage reports ErrImageNeverPull",
        Duration::from_secs(30),
        || Ok(waiting_reason(kubectl, "noimage")? == "ErrImageNeverPull"),
    )?;
    let message = jsonpath(
        kubectl,
        &["get", "pod", "noimage"],
        "{.status.containerStatuses[0].state.waiting.message}",
    )?;
    ensure!(
        message
            == "Container image \"flotilla.local/absent:1\" is not present with pull policy of Never",
        "message {message:?}"
    );
    let get = kubectl.ok(&["get", "pod", "noimage"])?;
    ensure!(get.contains("ErrImageNeverPull"), "{get}");

    // An env var from a ConfigMap that does not exist.
    until(
        "noconfig reports CreateContainerConfigError",
        Duration::from_secs(30),
        || Ok(waiting_reason(kubectl, "noconfig")? == "CreateContainerConfigError"),
    )?;
    let message = jsonpath(
        kubectl,
        &["get", "pod", "noconfig"],
        "{.status.containerStatuses[0].state.waiting.message}",
    )?;
    ensure!(
        message == "configmap \"absent\" not found",
        "message {message:?}"
    );

    // A container that exits 1 restarts with back-off.
    let mut saw_backoff = false;
    until(
        "crash restarts twice and shows CrashLoopBackOff",
        Duration::from_secs(60),
        || {
            saw_backoff |= waiting_reason(kubectl, "crash")? == "CrashLoopBackOff";
            let count: u32 = jsonpath(
                kubectl,
                &["get", "pod", "crash"],
                "{.status.containerStatuses[0].restartCount}",
            )?
            .parse()
            .unwrap_or(0);
            Ok(saw_backoff && count >= 2)
        },
    )?;
    let exit = jsonpath(
        kubectl,
        &["get", "pod", "crash"],
        "{.status.containerStatuses[0].lastState.terminated.exitCode}",
    )?;
    ensure!(exit == "1", "lastState exit code {exit:?}");

    // SIGKILL the kubelet and restart it: the running container is adopted.
    let uid = jsonpath(kubectl, &["get", "pod", "busybox"], "{.metadata.uid}")?;
    let id_path = "{.status.containerStatuses[0].containerID}";
    let count_path = "{.status.containerStatuses[0].restartCount}";
    let before_id = jsonpath(kubectl, &["get", "pod", "busybox"], id_path)?;
    let before_count = jsonpath(kubectl, &["get", "pod", "busybox"], count_path)?;
    let mut before_runtime = containerd.pod_containers(&uid)?;
    before_runtime.sort();
    // The sandbox, its container and the debugger, which the restarted kubelet must adopt
    // and not start again.
    ensure!(
        before_runtime.len() == 3,
        "busybox has a sandbox, a container and a debugger: {before_runtime:?}"
    );
    kubelet.kill();
    // Without heartbeats the node goes Unknown after the node lifecycle controller's 40 s
    // grace period, while its container keeps running.
    until(
        "the node is no longer Ready without its kubelet",
        Duration::from_secs(90),
        || Ok(jsonpath(kubectl, &["get", "node", NODE], ready)? == "Unknown"),
    )?;
    ensure!(
        containerd.pod_containers(&uid)?.len() == 3,
        "busybox's containers outlive the kubelet"
    );
    let get = kubectl.ok(&["get", "node", NODE])?;
    ensure!(get.contains("NotReady"), "{get}");
    *kubelet = start_kubelet(flotilla, containerd, dir)?;
    until("the node is Ready again", Duration::from_secs(60), || {
        Ok(jsonpath(kubectl, &["get", "node", NODE], ready).unwrap_or_default() == "True")
    })?;
    // Let the restarted kubelet sync the pod several times.
    until(
        "the restarted kubelet syncs",
        Duration::from_secs(30),
        || Ok(kubelet.log().matches("node already registered").count() >= 1),
    )?;
    std::thread::sleep(Duration::from_secs(8));
    let mut after_runtime = containerd.pod_containers(&uid)?;
    after_runtime.sort();
    ensure!(
        after_runtime == before_runtime,
        "runtime containers changed: {before_runtime:?} → {after_runtime:?}"
    );
    ensure!(jsonpath(kubectl, &["get", "pod", "busybox"], id_path)? == before_id);
    ensure!(jsonpath(kubectl, &["get", "pod", "busybox"], count_path)? == before_count);
    ensure!(jsonpath(kubectl, &["get", "pod", "busybox"], "{.status.phase}")? == "Running");

    // Deleting the pod stops its container within the grace period and removes its sandbox.
    kubectl.ok(&["delete", "pod", "busybox", "--wait", "--timeout=60s"])?;
    until(
        "busybox's sandbox is removed",
        Duration::from_secs(30),
        || Ok(containerd.pod_containers(&uid)?.is_empty()),
    )?;
    let gone = kubectl.fails(&["get", "pod", "busybox"])?;
    ensure!(gone.contains("NotFound"), "{gone}");
    Ok(())
}
