//! Node-pressure eviction on a real node: the kubelet's root dir is a small tmpfs, so a pod
//! filling its emptyDir puts the node under DiskPressure. The kubelet reports the condition
//! (the node lifecycle controller then taints the node), evicts the biggest local-storage
//! user (Failed, reason `Evicted`, `DisruptionTarget`, an `Evicted` event) and leaves the
//! quiet pod running, refuses a new pod while the pressure lasts, and clears the condition
//! once the evicted pod's storage is given back.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, ensure};
use flotilla_e2e::nodes::SingleNode;
use flotilla_e2e::{Kubectl, jsonpath, until};

const NODE: &str = "eviction-e2e";
const POD_CIDR: &str = "10.244.79.0/24";

const PODS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: quiet}
spec:
  nodeName: eviction-e2e
  terminationGracePeriodSeconds: 1
  containers:
  - {name: main, image: flotilla.local/busybox:1, imagePullPolicy: Never, command: [sleep, "3600"]}
---
apiVersion: v1
kind: Pod
metadata: {name: writer}
spec:
  nodeName: eviction-e2e
  terminationGracePeriodSeconds: 1
  volumes: [{name: scratch, emptyDir: {}}]
  containers:
  - name: main
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    command: [sh, -c, "sleep 2; dd if=/dev/zero of=/scratch/fill bs=1M count=70; sleep 3600"]
    volumeMounts: [{name: scratch, mountPath: /scratch}]
"#;

const LATE: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: late}
spec:
  nodeName: eviction-e2e
  containers:
  - {name: main, image: flotilla.local/busybox:1, imagePullPolicy: Never, command: [sleep, "3600"]}
"#;

/// A tmpfs mounted for the test's life (lazily unmounted: containers may still hold it).
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(size: &str) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()?;
        ensure!(
            status.success(),
            "mounting a tmpfs at {}",
            dir.path().display()
        );
        Ok(Tmpfs(dir))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

fn node_condition(kubectl: &Kubectl, kind: &str) -> anyhow::Result<String> {
    jsonpath(
        kubectl,
        &["get", "node", NODE],
        &format!(r#"{{.status.conditions[?(@.type=="{kind}")].status}}"#),
    )
}

#[test]
fn disk_pressure_evicts_the_biggest_local_storage_user() -> anyhow::Result<()> {
    let root = Tmpfs::mount("96m")?;
    let root_dir = root.0.path().to_string_lossy().into_owned();
    let node = SingleNode::start(
        NODE,
        POD_CIDR,
        &[
            "--root-dir",
            &root_dir,
            "--eviction-hard",
            "nodefs.available<40Mi",
            "--eviction-pressure-transition-period",
            "30s",
        ],
    )?;
    let outcome = node.wait_ready(NODE).and_then(|()| scenario(&node));
    drop(node);
    drop(root);
    outcome
}

fn scenario(node: &SingleNode) -> anyhow::Result<()> {
    let kubectl = node.flotilla.kubectl();
    let outcome = (|| {
        ensure!(
            node_condition(&kubectl, "DiskPressure")? == "False",
            "pressure before any pod"
        );
        node.flotilla.ok_stdin(&["apply", "-f", "-"], PODS)?;
        let phase = |pod: &str| jsonpath(&kubectl, &["get", "pod", pod], "{.status.phase}");
        until("the writer is evicted", Duration::from_secs(90), || {
            Ok(phase("writer")? == "Failed")
        })?;
        let reason = jsonpath(&kubectl, &["get", "pod", "writer"], "{.status.reason}")?;
        ensure!(reason == "Evicted", "writer's reason {reason:?}");
        let message = jsonpath(&kubectl, &["get", "pod", "writer"], "{.status.message}")?;
        ensure!(
            message.starts_with(
                "The node was low on resource: ephemeral-storage. Threshold quantity: 40Mi"
            ),
            "writer's message {message:?}"
        );
        let target = jsonpath(
            &kubectl,
            &["get", "pod", "writer"],
            r#"{.status.conditions[?(@.type=="DisruptionTarget")].reason}"#,
        )?;
        ensure!(
            target == "TerminationByKubelet",
            "DisruptionTarget {target:?}"
        );
        let events = kubectl.ok(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=writer,reason=Evicted",
            "-o",
            "jsonpath={.items[*].message}",
        ])?;
        ensure!(
            events.contains("low on resource"),
            "Evicted event: {events:?}"
        );
        ensure!(
            phase("quiet")? == "Running",
            "the quiet pod was evicted too"
        );
        // The evicted pod's containers stopped and were not restarted.
        let running = jsonpath(
            &kubectl,
            &["get", "pod", "writer"],
            "{.status.containerStatuses[0].state.running}",
        )?;
        ensure!(running.is_empty(), "the evicted container runs: {running}");

        // The pressure holds for the transition period (30 s): a new pod is refused meanwhile.
        ensure!(
            node_condition(&kubectl, "DiskPressure")? == "True",
            "DiskPressure is not reported"
        );
        // The node lifecycle controller taints the node for the scheduler.
        until("the node is tainted", Duration::from_secs(30), || {
            let taints = jsonpath(&kubectl, &["get", "node", NODE], "{.spec.taints[*].key}")?;
            Ok(taints.contains("node.kubernetes.io/disk-pressure"))
        })?;
        node.flotilla.ok_stdin(&["apply", "-f", "-"], LATE)?;
        until("the late pod is refused", Duration::from_secs(30), || {
            Ok(phase("late")? == "Failed")
        })?;
        let late = jsonpath(
            &kubectl,
            &["get", "pod", "late"],
            "{.status.reason}/{.status.message}",
        )?;
        // (jsonpath output is trimmed: upstream's message ends with a space.)
        ensure!(
            late == "Evicted/The node had condition: [DiskPressure].",
            "late pod: {late:?}"
        );

        // The evicted pod's emptyDir is gone, so the pressure clears after the transition.
        until("DiskPressure clears", Duration::from_secs(60), || {
            Ok(node_condition(&kubectl, "DiskPressure")? == "False")
        })?;
        ensure!(
            phase("quiet")? == "Running",
            "the quiet pod did not survive"
        );
        Ok(())
    })();
    outcome.with_context(|| format!("kubelet log:\n{}", node.kubelet.log()))
}
