//! Pod volumes on the real kubelet and containerd, driven by stock kubectl 1.32: configMap
//! and secret volumes whose new data shows inside the running container after `kubectl
//! apply`, an emptyDir two containers share (and a memory-backed one, a tmpfs unmounted when
//! the pod goes), a hostPath failing its type check, the `kube-api-access-*` projected volume the
//! API server injects, whose token authenticates to the API as the pod's service account, and a
//! missing configMap volume holding the pod in ContainerCreating with upstream's
//! `FailedMount` event until the configMap exists. Evidence from inside the containers is
//! read from their CRI log files under the kubelet's root dir.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, ensure};
use flotilla_e2e::nodes::SingleNode;
use flotilla_e2e::{Flotilla, Kubectl, jsonpath, until};

const NODE: &str = "kubelet-e2e";
const POD_CIDR: &str = "10.244.78.0/24";

const OBJECTS: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
data: {greeting: hello-1}
---
apiVersion: v1
kind: Secret
metadata: {name: creds}
stringData: {password: s3cret-1}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: robot}
"#;

const PODS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: watcher}
spec:
  nodeName: kubelet-e2e
  serviceAccountName: robot
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    command: [sh, -c]
    args:
    - |
      d=/var/run/secrets/kubernetes.io/serviceaccount
      echo "token=$(cat $d/token) namespace=$(cat $d/namespace) ca=$(grep -c 'BEGIN CERTIFICATE' $d/ca.crt)"
      echo "mode=$(stat -L -c %a /etc/sec/password)"
      while true; do echo "cfg=$(cat /etc/cfg/greeting) sec=$(cat /etc/sec/password)"; sleep 1; done
    volumeMounts:
    - {name: cfg, mountPath: /etc/cfg}
    - {name: sec, mountPath: /etc/sec}
  volumes:
  - name: cfg
    configMap: {name: settings}
  - name: sec
    secret: {secretName: creds, defaultMode: 0400}
---
apiVersion: v1
kind: Pod
metadata: {name: shared}
spec:
  nodeName: kubelet-e2e
  terminationGracePeriodSeconds: 1
  containers:
  - name: writer
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    command: [sh, -c, "echo from-writer > /scratch/note; sleep 3600"]
    volumeMounts: [{name: scratch, mountPath: /scratch}]
  - name: reader
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    command: [sh, -c, "while true; do echo \"read=$(cat /data/note 2>/dev/null) mem=$(grep ' /mem ' /proc/mounts | cut -d' ' -f3)\"; sleep 1; done"]
    volumeMounts: [{name: scratch, mountPath: /data}, {name: mem, mountPath: /mem}]
  volumes:
  - name: scratch
    emptyDir: {}
  - name: mem
    emptyDir: {medium: Memory, sizeLimit: 16Mi}
---
apiVersion: v1
kind: Pod
metadata: {name: nohost}
spec:
  nodeName: kubelet-e2e
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    command: [sleep, "3600"]
    volumeMounts: [{name: host, mountPath: /host}]
  volumes:
  - name: host
    hostPath: {path: /nonexistent/flotilla-e2e, type: Directory}
---
apiVersion: v1
kind: Pod
metadata: {name: late}
spec:
  nodeName: kubelet-e2e
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    command: [sh, -c, "cat /etc/late/value; echo; sleep 3600"]
    volumeMounts: [{name: late, mountPath: /etc/late}]
  volumes:
  - name: late
    configMap: {name: late}
"#;

/// Everything container `container` of pod `pod` printed so far, from its CRI log files
/// (`<root>/logs/<ns>_<pod>_<uid>/<container>/<n>.log`, one `<time> <stream> <tag> <text>`
/// line each).
fn container_output(
    kubectl: &Kubectl,
    root: &Path,
    pod: &str,
    container: &str,
) -> anyhow::Result<String> {
    let uid = jsonpath(kubectl, &["get", "pod", pod], "{.metadata.uid}")?;
    let dir = root
        .join("logs")
        .join(format!("default_{pod}_{uid}"))
        .join(container);
    let mut text = String::new();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(text);
    };
    let mut files: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    files.sort();
    for file in files {
        for line in std::fs::read_to_string(&file).unwrap_or_default().lines() {
            let text_part = line.splitn(4, ' ').nth(3).unwrap_or("");
            text.push_str(text_part);
            text.push('\n');
        }
    }
    Ok(text)
}

fn phase(kubectl: &Kubectl, pod: &str) -> anyhow::Result<String> {
    jsonpath(kubectl, &["get", "pod", pod], "{.status.phase}")
}

#[test]
fn kubelet_mounts_pod_volumes() -> anyhow::Result<()> {
    let node = SingleNode::start(NODE, POD_CIDR, &[])?;
    let (flotilla, kubectl, dir) = (&node.flotilla, node.flotilla.kubectl(), node.dir.path());
    let outcome = node
        .wait_ready(NODE)
        .and_then(|()| scenario(flotilla, &kubectl, &dir.join("kubelet")));
    outcome.with_context(|| format!("kubelet log:\n{}", node.kubelet.log()))
}

fn scenario(flotilla: &Flotilla, kubectl: &Kubectl, root: &Path) -> anyhow::Result<()> {
    until(
        "the root CA is published as kube-root-ca.crt",
        Duration::from_secs(30),
        || {
            Ok(kubectl
                .ok(&["get", "configmap", "kube-root-ca.crt"])
                .is_ok())
        },
    )?;
    until(
        "the default service account exists",
        Duration::from_secs(30),
        || Ok(kubectl.ok(&["get", "serviceaccount", "default"]).is_ok()),
    )?;
    flotilla.ok_stdin(&["apply", "-f", "-"], OBJECTS)?;
    flotilla.ok_stdin(&["apply", "-f", "-"], PODS)?;

    // configMap and secret volumes: the first data, then the applied change, seen from
    // inside the running container.
    until("watcher is Running", Duration::from_secs(60), || {
        Ok(phase(kubectl, "watcher")? == "Running")
    })?;
    until(
        "watcher prints the first data",
        Duration::from_secs(30),
        || {
            Ok(container_output(kubectl, root, "watcher", "main")?
                .contains("cfg=hello-1 sec=s3cret-1"))
        },
    )?;
    let output = container_output(kubectl, root, "watcher", "main")?;
    ensure!(output.contains("mode=400"), "secret defaultMode: {output}");
    let container_id = jsonpath(
        kubectl,
        &["get", "pod", "watcher"],
        "{.status.containerStatuses[0].containerID}",
    )?;
    let changed = OBJECTS
        .replace("hello-1", "hello-2")
        .replace("s3cret-1", "s3cret-2");
    let applied = std::time::Instant::now();
    flotilla.ok_stdin(&["apply", "-f", "-"], &changed)?;
    until(
        "watcher prints the applied data",
        Duration::from_secs(60),
        || {
            Ok(container_output(kubectl, root, "watcher", "main")?
                .contains("cfg=hello-2 sec=s3cret-2"))
        },
    )?;
    // Printed, not asserted: how long an applied change took to show in the container.
    println!(
        "kubelet_volumes: configMap+secret update visible in the container after {:?}",
        applied.elapsed()
    );
    ensure!(
        jsonpath(
            kubectl,
            &["get", "pod", "watcher"],
            "{.status.containerStatuses[0].containerID}",
        )? == container_id,
        "the update must reach the running container, not a restarted one"
    );
    // The files are upstream's AtomicWriter layout.
    let uid = jsonpath(kubectl, &["get", "pod", "watcher"], "{.metadata.uid}")?;
    let cfg_dir = root
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~configmap/cfg");
    let link = std::fs::read_link(cfg_dir.join("greeting")).context("greeting symlink")?;
    ensure!(link == Path::new("..data/greeting"), "greeting → {link:?}");
    ensure!(
        std::fs::read_link(cfg_dir.join("..data"))?
            .to_string_lossy()
            .starts_with("..20"),
        "..data must point at a timestamped directory"
    );

    // The API server injected the kube-api-access volume; its token authenticates as the
    // pod's service account.
    let injected = jsonpath(
        kubectl,
        &["get", "pod", "watcher"],
        "{.spec.volumes[*].name} {.spec.containers[0].volumeMounts[*].mountPath}",
    )?;
    ensure!(
        injected.contains("kube-api-access-")
            && injected.contains("/var/run/secrets/kubernetes.io/serviceaccount"),
        "injected volume: {injected}"
    );
    let output = container_output(kubectl, root, "watcher", "main")?;
    let line = output
        .lines()
        .find(|l| l.starts_with("token="))
        .with_context(|| format!("no token line in: {output}"))?;
    ensure!(
        line.contains(" namespace=default ca=") && !line.ends_with("ca=0"),
        "namespace and ca.crt: {line}"
    );
    let token = line
        .trim_start_matches("token=")
        .split(' ')
        .next()
        .unwrap_or("");
    ensure!(token.split('.').count() == 3, "not a JWT: {line}");
    let whoami = kubectl.with_token(token)?.ok(&["auth", "whoami"])?;
    ensure!(
        whoami.contains("system:serviceaccount:default:robot"),
        "{whoami}"
    );
    ensure!(
        whoami.contains("authentication.kubernetes.io/pod-name")
            || whoami.contains("system:serviceaccounts:default"),
        "{whoami}"
    );

    // An emptyDir shared by two containers.
    until("shared is Running", Duration::from_secs(60), || {
        Ok(phase(kubectl, "shared")? == "Running")
    })?;
    until(
        "the reader sees the writer's file",
        Duration::from_secs(30),
        || {
            Ok(container_output(kubectl, root, "shared", "reader")?
                .contains("read=from-writer mem=tmpfs"))
        },
    )?;

    // A hostPath that is not of its type.
    let has_event = |pod: &str, message: &str| -> anyhow::Result<bool> {
        let events = kubectl.ok(&["get", "events", "-o", "json"])?;
        let events: serde_json::Value = serde_json::from_str(&events)?;
        Ok(events["items"].as_array().into_iter().flatten().any(|e| {
            e["reason"] == "FailedMount"
                && e["type"] == "Warning"
                && e["involvedObject"]["name"] == pod
                && e["message"] == message
        }))
    };
    until(
        "nohost has a FailedMount event",
        Duration::from_secs(30),
        || {
            has_event(
                "nohost",
                r#"MountVolume.SetUp failed for volume "host" : hostPath type check failed: /nonexistent/flotilla-e2e is not a directory"#,
            )
        },
    )?;
    ensure!(phase(kubectl, "nohost")? == "Pending");

    // A missing configMap: ContainerCreating with upstream's FailedMount event, then Running
    // once it exists.
    let want = r#"MountVolume.SetUp failed for volume "late" : configmap "late" not found"#;
    until(
        "late has a FailedMount event",
        Duration::from_secs(30),
        || has_event("late", want),
    )?;
    let reason = jsonpath(
        kubectl,
        &["get", "pod", "late"],
        "{.status.containerStatuses[0].state.waiting.reason}",
    )?;
    ensure!(reason == "ContainerCreating", "late waits with {reason:?}");
    ensure!(phase(kubectl, "late")? == "Pending");
    let get = kubectl.ok(&["get", "pod", "late"])?;
    ensure!(get.contains("ContainerCreating"), "{get}");
    let described = kubectl.ok(&["describe", "pod", "late"])?;
    ensure!(
        described.contains("FailedMount") && described.contains(want),
        "{described}"
    );
    kubectl.ok(&[
        "create",
        "configmap",
        "late",
        "--from-literal=value=arrived",
    ])?;
    until("late is Running", Duration::from_secs(60), || {
        Ok(phase(kubectl, "late")? == "Running")
    })?;
    until("late reads its configMap", Duration::from_secs(30), || {
        Ok(container_output(kubectl, root, "late", "main")?.contains("arrived"))
    })?;

    // Deleting a pod unmounts its tmpfs and removes its volume directories.
    let shared_uid = jsonpath(kubectl, &["get", "pod", "shared"], "{.metadata.uid}")?;
    let shared_dir = root.join("pods").join(&shared_uid);
    let mounted = |dir: &Path| -> anyhow::Result<bool> {
        let info = std::fs::read_to_string("/proc/self/mountinfo")?;
        Ok(info.contains(&*dir.to_string_lossy()))
    };
    ensure!(mounted(&shared_dir)?, "shared's tmpfs is not mounted");
    kubectl.ok(&["delete", "pod", "shared", "--wait", "--timeout=60s"])?;
    until(
        "shared's tmpfs is unmounted and its directory removed",
        Duration::from_secs(30),
        || Ok(!mounted(&shared_dir)? && !shared_dir.exists()),
    )?;

    // Deleting a pod removes its volume directories.
    let pod_dir = root.join("pods").join(&uid);
    ensure!(pod_dir.exists(), "{} must exist", pod_dir.display());
    kubectl.ok(&["delete", "pod", "watcher", "--wait", "--timeout=60s"])?;
    until(
        "watcher's pod directory is removed",
        Duration::from_secs(30),
        || Ok(!pod_dir.exists()),
    )?;
    Ok(())
}
