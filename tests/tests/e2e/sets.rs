//! StatefulSets and DaemonSets end to end: the embedded `flotilla up` with its controllers and
//! scheduler, `flotilla simulate-nodes` as the kubelets, stock kubectl watching and asserting
//! what a user sees — ordinal order, claims, scale-down order, one daemon pod per node as nodes
//! come and go, and rollouts that `kubectl rollout status` sees complete.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use flotilla_e2e::{Backend, Flotilla, Kubectl, flotilla_bin, kubectl_bin};

use crate::contains;

const STATEFUL_SET: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: nginx}
spec:
  clusterIP: None
  selector: {app: web}
  ports: [{port: 80}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: web}
spec:
  serviceName: nginx
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: nginx
        image: nginx:1.25
        volumeMounts: [{name: www, mountPath: /usr/share/nginx/html}]
  volumeClaimTemplates:
  - metadata: {name: www}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 1Gi}}
"#;

/// Volumes for the StatefulSet's claims: nothing provisions volumes dynamically yet, and the
/// scheduler (as upstream's) does not place a pod whose Immediate claim is unbound.
const VOLUMES: &str = r#"
apiVersion: v1
kind: PersistentVolume
metadata: {name: www-0}
spec: {capacity: {storage: 1Gi}, accessModes: [ReadWriteOnce], hostPath: {path: /tmp/www-0}}
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: www-1}
spec: {capacity: {storage: 1Gi}, accessModes: [ReadWriteOnce], hostPath: {path: /tmp/www-1}}
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: www-2}
spec: {capacity: {storage: 1Gi}, accessModes: [ReadWriteOnce], hostPath: {path: /tmp/www-2}}
"#;

const DAEMON_SET: &str = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector:
    matchLabels: {app: agent}
  template:
    metadata:
      labels: {app: agent}
    spec:
      containers:
      - name: agent
        image: busybox:1.36
"#;

/// A simulator process, killed when dropped.
struct Simulator(Child);

impl Simulator {
    fn start(kubectl: &Kubectl, prefix: &str, count: usize) -> anyhow::Result<Self> {
        let kubeconfig = kubectl.kubeconfig.to_str().context("kubeconfig path")?;
        let child = Command::new(flotilla_bin()?)
            .args(["simulate-nodes", "--kubeconfig", kubeconfig])
            .args(["--count", &count.to_string(), "--prefix", prefix])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        Ok(Simulator(child))
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `kubectl get -w` in the background, its lines collected in arrival order.
struct Watch {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Watch {
    fn start(kubectl: &Kubectl, args: &[&str]) -> anyhow::Result<Self> {
        let mut child = Command::new(kubectl_bin()?)
            .arg("--kubeconfig")
            .arg(&kubectl.kubeconfig)
            .args(args)
            .args(["-w", "--request-timeout=0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdout = child.stdout.take().context("watch stdout")?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        Ok(Watch { child, lines })
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The index of the first line `matches` accepts.
    fn first(&self, matches: impl Fn(&str) -> bool) -> Option<usize> {
        self.lines().iter().position(|l| matches(l))
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `check` until it holds, failing with `what` after `seconds`.
fn eventually(
    seconds: u64,
    what: &str,
    mut check: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        if check()? {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn ready_nodes(kubectl: &Kubectl, count: usize) -> anyhow::Result<()> {
    eventually(30, &format!("{count} Ready nodes"), || {
        Ok(kubectl
            .ok(&["get", "nodes", "--no-headers"])?
            .matches(" Ready ")
            .count()
            >= count)
    })
}

fn sorted_words(text: &str) -> Vec<String> {
    let mut words: Vec<String> = text.split_whitespace().map(String::from).collect();
    words.sort();
    words
}

#[test]
fn statefulset_orders_its_pods_claims_scale_down_and_rollout() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    let _simulator = Simulator::start(&kubectl, "sim", 3)?;
    ready_nodes(&kubectl, 3)?;

    // Each line: a pod's name, whether it is Ready, and whether it is being deleted.
    let watch = Watch::start(
        &kubectl,
        &[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            r#"jsonpath={.metadata.name} ready={.status.conditions[?(@.type=="Ready")].status} deleting={.metadata.deletionTimestamp} image={.spec.containers[0].image}{"\n"}"#,
        ],
    )?;
    kubectl.ok_stdin(&["apply", "-f", "-"], VOLUMES)?;
    contains(
        &kubectl.ok_stdin(&["apply", "-f", "-"], STATEFUL_SET)?,
        "statefulset.apps/web created",
    )?;
    kubectl.ok(&[
        "wait",
        "--for=jsonpath={.status.readyReplicas}=3",
        "sts/web",
        "--timeout=60s",
    ])?;

    // OrderedReady: web-1 appears only after web-0 was seen Ready, web-2 after web-1.
    for (before, after) in [("web-0", "web-1"), ("web-1", "web-2")] {
        let ready = watch
            .first(|l| l.starts_with(&format!("{before} ready=True")))
            .with_context(|| format!("{before} never seen Ready: {:?}", watch.lines()))?;
        let created = watch
            .first(|l| l.starts_with(&format!("{after} ")))
            .with_context(|| format!("{after} never seen: {:?}", watch.lines()))?;
        ensure!(
            ready < created,
            "{after} was created before {before} was Ready: {:?}",
            watch.lines()
        );
    }
    let stamps = kubectl.ok(&[
        "get",
        "pods",
        "web-0",
        "web-1",
        "web-2",
        "-o",
        "jsonpath={range .items[*]}{.metadata.creationTimestamp} {end}",
    ])?;
    let stamps: Vec<&str> = stamps.split_whitespace().collect();
    ensure!(
        stamps.len() == 3 && stamps[0] <= stamps[1] && stamps[1] <= stamps[2],
        "creationTimestamps out of order: {stamps:?}"
    );

    // Identity: labels, hostname and subdomain, the claim as a volume, the revision.
    let update_revision = kubectl.ok(&[
        "get",
        "sts",
        "web",
        "-o",
        "jsonpath={.status.updateRevision}",
    ])?;
    ensure!(
        update_revision.starts_with("web-"),
        "updateRevision {update_revision:?}"
    );
    let identity = kubectl.ok(&[
        "get", "pod", "web-1", "-o",
        r#"jsonpath={.metadata.labels.statefulset\.kubernetes\.io/pod-name} {.metadata.labels.apps\.kubernetes\.io/pod-index} {.metadata.labels.controller-revision-hash} {.spec.hostname} {.spec.subdomain} {.spec.volumes[?(@.name=="www")].persistentVolumeClaim.claimName}"#,
    ])?;
    ensure!(
        identity == format!("web-1 1 {update_revision} web-1 nginx www-web-1"),
        "web-1's identity: {identity}"
    );
    contains(
        &kubectl.ok(&["get", "controllerrevisions", "-o", "name"])?,
        &format!("controllerrevision.apps/{update_revision}"),
    )?;
    let claims = kubectl.ok(&[
        "get",
        "pvc",
        "-l",
        "app=web",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ])?;
    ensure!(
        sorted_words(&claims) == ["www-web-0", "www-web-1", "www-web-2"],
        "claims: {claims}"
    );
    let status = kubectl.ok(&[
        "get", "sts", "web", "-o",
        "jsonpath={.status.replicas} {.status.currentReplicas} {.status.updatedReplicas} {.status.availableReplicas} {.status.observedGeneration}",
    ])?;
    ensure!(status == "3 3 3 3 1", "status: {status}");
    let described = kubectl.ok(&["describe", "sts", "web"])?;
    contains(
        &described,
        "create Claim www-web-0 Pod web-0 in StatefulSet web success",
    )?;
    contains(&described, "create Pod web-2 in StatefulSet web successful")?;

    // Scale down: web-2 goes first, then web-1; the claims stay (Retain).
    kubectl.ok(&["scale", "sts", "web", "--replicas=1"])?;
    eventually(60, "scale down to web-0", || {
        Ok(kubectl
            .ok(&["get", "pods", "-l", "app=web", "-o", "name"])?
            .trim()
            == "pod/web-0")
    })?;
    let deleting = |name: &'static str| {
        move |l: &str| l.starts_with(&format!("{name} ")) && !l.contains("deleting= ")
    };
    let web2_going = watch
        .first(deleting("web-2"))
        .context("web-2 never deleted")?;
    let web1_going = watch
        .first(deleting("web-1"))
        .context("web-1 never deleted")?;
    ensure!(
        web2_going < web1_going,
        "web-1 was deleted before web-2: {:?}",
        watch.lines()
    );
    let claims = kubectl.ok(&["get", "pvc", "-o", "jsonpath={.items[*].metadata.name}"])?;
    ensure!(
        sorted_words(&claims) == ["www-web-0", "www-web-1", "www-web-2"],
        "claims after scale down: {claims}"
    );

    // Back to three, then an image change rolls from the highest ordinal down.
    kubectl.ok(&["scale", "sts", "web", "--replicas=3"])?;
    kubectl.ok(&["rollout", "status", "sts/web", "--timeout=60s"])?;
    let before_update = watch.lines().len();
    kubectl.ok(&["set", "image", "sts/web", "nginx=nginx:1.26"])?;
    let rolled = kubectl.ok(&["rollout", "status", "sts/web", "--timeout=90s"])?;
    contains(&rolled, "roll out complete")?;
    let images = kubectl.ok(&[
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        "jsonpath={.items[*].spec.containers[0].image}",
    ])?;
    ensure!(
        sorted_words(&images) == ["nginx:1.26", "nginx:1.26", "nginx:1.26"],
        "images after rollout: {images}"
    );
    let revisions = kubectl.ok(&[
        "get",
        "sts",
        "web",
        "-o",
        "jsonpath={.status.currentRevision} {.status.updateRevision}",
    ])?;
    let (current, update) = revisions.split_once(' ').context("revisions")?;
    ensure!(
        current == update && update != update_revision,
        "revisions after rollout: {revisions}"
    );
    let lines = watch.lines();
    let positions: Vec<Option<usize>> = ["web-2", "web-1", "web-0"]
        .iter()
        .map(|name| {
            lines[before_update..]
                .iter()
                .position(|l| l.starts_with(&format!("{name} ")) && !l.contains("deleting= "))
        })
        .collect();
    ensure!(
        positions.iter().all(Option::is_some) && positions.windows(2).all(|w| w[0] < w[1]),
        "the update did not go web-2, web-1, web-0: {:?}",
        &lines[before_update..]
    );

    // Deleting the set takes its pods (garbage collector, by owner reference); the claims
    // stay, as whenDeleted: Retain says.
    kubectl.ok(&["delete", "sts", "web"])?;
    eventually(60, "the StatefulSet's pods to go", || {
        Ok(kubectl
            .ok(&["get", "pods", "-l", "app=web", "-o", "name"])?
            .trim()
            .is_empty())
    })?;
    let claims = kubectl.ok(&["get", "pvc", "-o", "jsonpath={.items[*].metadata.name}"])?;
    ensure!(
        sorted_words(&claims) == ["www-web-0", "www-web-1", "www-web-2"],
        "claims after deleting the set: {claims}"
    );
    Ok(())
}

#[test]
fn daemonset_follows_nodes_and_rolls_out() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    let _simulator = Simulator::start(&kubectl, "sim", 3)?;
    ready_nodes(&kubectl, 3)?;
    contains(
        &kubectl.ok_stdin(&["apply", "-f", "-"], DAEMON_SET)?,
        "daemonset.apps/agent created",
    )?;
    let nodes_of_pods = |kubectl: &Kubectl| -> anyhow::Result<Vec<String>> {
        Ok(sorted_words(&kubectl.ok(&[
            "get",
            "pods",
            "-l",
            "app=agent",
            "-o",
            "jsonpath={.items[*].spec.nodeName}",
        ])?))
    };
    kubectl.ok(&[
        "wait",
        "--for=jsonpath={.status.numberReady}=3",
        "ds/agent",
        "--timeout=60s",
    ])?;
    ensure!(
        nodes_of_pods(&kubectl)? == ["sim-0", "sim-1", "sim-2"],
        "one pod per node: {:?}",
        nodes_of_pods(&kubectl)?
    );
    // Pinned the upstream way: a required affinity on the node's name, bound by the scheduler.
    let pinned = kubectl.ok(&[
        "get", "pods", "-l", "app=agent", "-o",
        r#"jsonpath={range .items[*]}{.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchFields[0].values[0]}={.spec.nodeName} {end}"#,
    ])?;
    for pair in pinned.split_whitespace() {
        let (wanted, bound) = pair.split_once('=').context("pair")?;
        ensure!(wanted == bound, "pod pinned to {wanted} bound to {bound}");
    }
    let tolerations = kubectl.ok(&[
        "get",
        "pods",
        "-l",
        "app=agent",
        "-o",
        "jsonpath={.items[0].spec.tolerations[*].key}",
    ])?;
    contains(&tolerations, "node.kubernetes.io/unreachable")?;
    contains(&tolerations, "node.kubernetes.io/unschedulable")?;
    contains(
        &kubectl.ok(&["describe", "ds", "agent"])?,
        "Created pod: agent-",
    )?;

    // A node joins from a second simulator: it gets a pod.
    let _second = Simulator::start(&kubectl, "extra", 1)?;
    ready_nodes(&kubectl, 4)?;
    kubectl.ok(&[
        "wait",
        "--for=jsonpath={.status.numberReady}=4",
        "ds/agent",
        "--timeout=60s",
    ])?;
    ensure!(
        nodes_of_pods(&kubectl)? == ["extra-0", "sim-0", "sim-1", "sim-2"],
        "after a node joined: {:?}",
        nodes_of_pods(&kubectl)?
    );

    // A node leaves: its pod goes.
    kubectl.ok(&["delete", "node", "sim-1"])?;
    eventually(60, "the deleted node's pod to go", || {
        Ok(nodes_of_pods(&kubectl)? == ["extra-0", "sim-0", "sim-2"])
    })?;
    kubectl.ok(&[
        "wait",
        "--for=jsonpath={.status.desiredNumberScheduled}=3",
        "ds/agent",
        "--timeout=30s",
    ])?;

    // An image change rolls out node by node; rollout status sees it through.
    kubectl.ok(&["set", "image", "ds/agent", "agent=busybox:1.37"])?;
    let rolled = kubectl.ok(&["rollout", "status", "ds/agent", "--timeout=90s"])?;
    contains(&rolled, "successfully rolled out")?;
    let images = kubectl.ok(&[
        "get",
        "pods",
        "-l",
        "app=agent",
        "-o",
        "jsonpath={.items[*].spec.containers[0].image}",
    ])?;
    ensure!(
        sorted_words(&images) == ["busybox:1.37", "busybox:1.37", "busybox:1.37"],
        "images after rollout: {images}"
    );
    let status = kubectl.ok(&[
        "get", "ds", "agent", "-o",
        "jsonpath={.status.desiredNumberScheduled} {.status.currentNumberScheduled} {.status.updatedNumberScheduled} {.status.numberAvailable} {.status.numberMisscheduled} {.status.observedGeneration}",
    ])?;
    ensure!(status == "3 3 3 3 0 2", "status: {status}");
    let hashes = kubectl.ok(&[
        "get",
        "pods",
        "-l",
        "app=agent",
        "-o",
        "jsonpath={.items[*].metadata.labels.controller-revision-hash}",
    ])?;
    let hashes = sorted_words(&hashes);
    ensure!(
        hashes.len() == 3 && hashes.iter().all(|h| *h == hashes[0]),
        "pods at one revision: {hashes:?}"
    );
    contains(
        &kubectl.ok(&["get", "controllerrevisions", "-o", "name"])?,
        &format!("controllerrevision.apps/agent-{}", hashes[0]),
    )?;

    kubectl.ok(&["delete", "ds", "agent"])?;
    eventually(60, "the DaemonSet's pods and revisions to go", || {
        Ok(kubectl
            .ok(&["get", "pods", "-l", "app=agent", "-o", "name"])?
            .trim()
            .is_empty()
            && kubectl
                .ok(&["get", "controllerrevisions", "-o", "name"])?
                .trim()
                .is_empty())
    })?;
    Ok(())
}
