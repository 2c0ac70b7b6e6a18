//! The Deployment controller seen through kubectl, on simulated nodes: `rollout status`
//! completes, a rolling update stays within maxSurge/maxUnavailable at every observed step,
//! `rollout history|undo|pause|resume`, `scale` (proportional mid-rollout), the progress
//! deadline, history cleanup, Recreate, and cascading deletion.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, ensure};
use flotilla_e2e::{Backend, Flotilla, Kubectl};
use serde_json::Value;

use crate::contains;

const REVISION: &str = "deployment.kubernetes.io/revision";

/// A Deployment `NAME` with `REPLICAS` nginx pods and the given `strategy:` block.
fn manifest(name: &str, replicas: u32, strategy: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}}}\nspec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: {name}}}}}\n  strategy: {strategy}\n  template:\n    metadata: {{labels: {{app: {name}}}}}\n    spec: {{containers: [{{name: nginx, image: 'nginx:1.25'}}]}}\n"
    )
}

/// `flotilla simulate-nodes` with three nodes, killed when dropped.
struct Simulator(Child);

impl Simulator {
    fn start(kubectl: &Kubectl) -> anyhow::Result<Self> {
        let kubeconfig = kubectl.kubeconfig.to_str().context("kubeconfig path")?;
        let child = Command::new(flotilla_e2e::flotilla_bin()?)
            .args(["simulate-nodes", "--kubeconfig", kubeconfig, "--count", "3"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let simulator = Simulator(child);
        until("three nodes are Ready", || {
            Ok(kubectl
                .ok(&["get", "nodes", "--no-headers"])?
                .matches(" Ready ")
                .count()
                == 3)
        })?;
        Ok(simulator)
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn until(what: &str, done: impl FnMut() -> anyhow::Result<bool>) -> anyhow::Result<()> {
    flotilla_e2e::until(what, Duration::from_secs(60), done)
}

fn json(kubectl: &Kubectl, args: &[&str]) -> anyhow::Result<Value> {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    Ok(serde_json::from_str(&kubectl.ok(&all)?)?)
}

fn items(list: &Value) -> Vec<Value> {
    list["items"].as_array().cloned().unwrap_or_default()
}

fn annotation(obj: &Value, key: &str) -> String {
    obj["metadata"]["annotations"][key]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn hash_of(obj: &Value) -> String {
    obj["metadata"]["labels"]["pod-template-hash"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The ReplicaSet of deployment `app` whose revision annotation is `revision`.
fn replica_set_of_revision(kubectl: &Kubectl, app: &str, revision: &str) -> anyhow::Result<Value> {
    items(&json(kubectl, &["get", "rs", "-l", &format!("app={app}")])?)
        .into_iter()
        .find(|rs| annotation(rs, REVISION) == revision)
        .with_context(|| format!("no ReplicaSet of {app} at revision {revision}"))
}

fn rollout_status(kubectl: &Kubectl, app: &str) -> anyhow::Result<()> {
    let out = kubectl.ok(&[
        "rollout",
        "status",
        &format!("deployment/{app}"),
        "--timeout=60s",
    ])?;
    contains(
        &out,
        &format!("deployment \"{app}\" successfully rolled out"),
    )
}

fn is_terminating(pod: &Value) -> bool {
    !pod["metadata"]["deletionTimestamp"].is_null()
}

fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// A Deployment's pods after one watch event during a rollout.
#[derive(Debug, Clone)]
struct Snapshot {
    /// Pods not being deleted.
    active: usize,
    /// Of those, Ready ones (minReadySeconds is 0, so available).
    available: usize,
    /// The template hashes of every pod, terminating ones included.
    hashes: BTreeSet<String>,
}

/// `kubectl get KIND -l app=APP -w --output-watch-events -o json`: the state of the
/// selected objects after every event, so every step the server went through is seen,
/// not a sample of them.
struct Watch {
    child: Child,
    thread: std::thread::JoinHandle<Vec<Vec<Value>>>,
}

impl Watch {
    /// Starts watching and returns once the first `initial` objects have been listed.
    fn start(kubectl: &Kubectl, kind: &str, app: &str, initial: usize) -> anyhow::Result<Self> {
        let mut child = Command::new(flotilla_e2e::kubectl_bin()?)
            .arg("--kubeconfig")
            .arg(&kubectl.kubeconfig)
            .args(["get", kind, "-l", &format!("app={app}")])
            .args(["-w", "--output-watch-events", "-o", "json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdout = child.stdout.take().context("kubectl stdout")?;
        let (listed, ready) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let mut objects: BTreeMap<String, Value> = BTreeMap::new();
            let mut states = Vec::new();
            let events = serde_json::Deserializer::from_reader(std::io::BufReader::new(stdout))
                .into_iter::<Value>();
            for event in events.map_while(Result::ok) {
                let name = event["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                if event["type"] == "DELETED" {
                    objects.remove(&name);
                } else {
                    objects.insert(name, event["object"].clone());
                }
                if objects.len() >= initial {
                    let _ = listed.send(());
                }
                states.push(objects.values().cloned().collect());
            }
            states
        });
        let watch = Watch { child, thread };
        ready
            .recv_timeout(Duration::from_secs(30))
            .with_context(|| format!("the watch of {kind} never listed {initial}"))?;
        Ok(watch)
    }

    /// Stops the watch; the states seen since the initial list.
    fn finish(mut self, initial: usize) -> anyhow::Result<Vec<Vec<Value>>> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let states = self
            .thread
            .join()
            .map_err(|_| anyhow::anyhow!("the watch reader panicked"))?;
        Ok(states.into_iter().skip(initial.saturating_sub(1)).collect())
    }
}

/// Watches `app`'s pods (`pods` of them now) and ReplicaSets (`sets`) while `change` runs:
/// the pods after every pod event, and the ReplicaSets' summed `spec.replicas` after every
/// ReplicaSet event.
fn observe(
    kubectl: &Kubectl,
    app: &str,
    pods: usize,
    sets: usize,
    change: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<(Vec<Snapshot>, Vec<i64>)> {
    let pod_watch = Watch::start(kubectl, "pods", app, pods)?;
    let set_watch = Watch::start(kubectl, "replicasets", app, sets)?;
    change()?;
    let pod_states = pod_watch.finish(pods)?;
    let set_states = set_watch.finish(sets)?;
    let snapshots = pod_states
        .iter()
        .map(|pods| {
            let active: Vec<&Value> = pods.iter().filter(|p| !is_terminating(p)).collect();
            Snapshot {
                active: active.len(),
                available: active.iter().filter(|p| is_ready(p)).count(),
                hashes: pods.iter().map(hash_of).collect(),
            }
        })
        .collect();
    let desired = set_states
        .iter()
        .map(|sets| {
            sets.iter()
                .map(|rs| rs["spec"]["replicas"].as_i64().unwrap_or(0))
                .sum()
        })
        .collect();
    Ok((snapshots, desired))
}

#[test]
fn deployment_rolls_out_rolls_back_scales_and_recreates() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    let _simulator = Simulator::start(&kubectl)?;

    // Create: the rollout completes; the ReplicaSet is named and labelled by its template
    // hash and carries the revision and replicas annotations.
    let rolling = "{type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}";
    kubectl.ok_stdin(&["apply", "-f", "-"], &manifest("web", 3, rolling))?;
    rollout_status(&kubectl, "web")?;
    let first = replica_set_of_revision(&kubectl, "web", "1")?;
    let first_hash = hash_of(&first);
    ensure!(
        !first_hash.is_empty(),
        "no pod-template-hash label: {first}"
    );
    ensure!(
        first["metadata"]["name"] == format!("web-{first_hash}").as_str(),
        "ReplicaSet not named by its hash: {}",
        first["metadata"]["name"]
    );
    ensure!(first["spec"]["selector"]["matchLabels"]["pod-template-hash"] == first_hash.as_str());
    ensure!(
        annotation(&first, "deployment.kubernetes.io/desired-replicas") == "3"
            && annotation(&first, "deployment.kubernetes.io/max-replicas") == "4",
        "replicas annotations: {}",
        first["metadata"]["annotations"]
    );
    let owner = &first["metadata"]["ownerReferences"][0];
    ensure!(
        owner["kind"] == "Deployment" && owner["controller"] == true,
        "owner: {owner}"
    );
    let pods = items(&json(&kubectl, &["get", "pods", "-l", "app=web"])?);
    ensure!(
        pods.len() == 3 && pods.iter().all(|p| hash_of(p) == first_hash),
        "pods: {pods:?}"
    );
    let deployment = json(&kubectl, &["get", "deployment", "web"])?;
    ensure!(annotation(&deployment, REVISION) == "1");
    let conditions = deployment["status"]["conditions"].to_string();
    contains(&conditions, "MinimumReplicasAvailable")?;
    contains(&conditions, "NewReplicaSetAvailable")?;
    contains(
        &kubectl.ok(&["get", "deployment", "web"])?,
        "web    3/3     3            3",
    )?;

    // A rolling update with maxSurge 1, maxUnavailable 0: at every observed step at least 3
    // pods are available and at most 4 exist (terminating ones aside, as upstream counts).
    let (seen, desired) = observe(&kubectl, "web", 3, 1, || {
        kubectl.ok(&["set", "image", "deployment/web", "nginx=nginx:1.26"])?;
        rollout_status(&kubectl, "web")
    })?;
    ensure!(seen.len() >= 6, "too few observations: {seen:?}");
    for snapshot in &seen {
        ensure!(
            snapshot.available >= 3 && snapshot.active <= 4,
            "the rollout left its bounds: {snapshot:?} (all: {seen:?})"
        );
    }
    ensure!(
        desired.iter().all(|d| *d <= 4),
        "the ReplicaSets wanted more than 4 replicas: {desired:?}"
    );
    eprintln!(
        "rolling update: {} pod states and {} ReplicaSet states watched, fewest available {:?}, most active {:?}",
        seen.len(),
        desired.len(),
        seen.iter().map(|s| s.available).min(),
        seen.iter().map(|s| s.active).max()
    );
    let second = replica_set_of_revision(&kubectl, "web", "2")?;
    ensure!(hash_of(&second) != first_hash);
    ensure!(
        seen.iter().any(|s| s.hashes.len() == 2),
        "never saw old and new pods side by side: {seen:?}"
    );
    let history = kubectl.ok(&["rollout", "history", "deployment/web"])?;
    contains(&history, "REVISION  CHANGE-CAUSE")?;
    contains(&history, "1         <none>")?;
    contains(&history, "2         <none>")?;

    // Undo: back to the first ReplicaSet, now revision 3 with 1 in its history.
    contains(
        &kubectl.ok(&["rollout", "undo", "deployment/web"])?,
        "rolled back",
    )?;
    rollout_status(&kubectl, "web")?;
    let third = replica_set_of_revision(&kubectl, "web", "3")?;
    ensure!(
        hash_of(&third) == first_hash,
        "undo made a new template: {third}"
    );
    ensure!(annotation(&third, "deployment.kubernetes.io/revision-history") == "1");
    ensure!(annotation(&json(&kubectl, &["get", "deployment", "web"])?, REVISION) == "3");
    let history = kubectl.ok(&["rollout", "history", "deployment/web"])?;
    contains(&history, "3         <none>")?;
    ensure!(
        !history.contains("1         <none>"),
        "revision 1 still listed:\n{history}"
    );
    let pods = items(&json(&kubectl, &["get", "pods", "-l", "app=web"])?);
    ensure!(
        pods.iter()
            .filter(|p| !is_terminating(p))
            .all(|p| hash_of(p) == first_hash)
    );

    // Scale up and down.
    kubectl.ok(&["scale", "deployment/web", "--replicas=5"])?;
    rollout_status(&kubectl, "web")?;
    until("five pods are ready", || {
        let pods = items(&json(&kubectl, &["get", "pods", "-l", "app=web"])?);
        Ok(pods
            .iter()
            .filter(|p| !is_terminating(p) && is_ready(p))
            .count()
            == 5)
    })?;
    let current = replica_set_of_revision(&kubectl, "web", "3")?;
    ensure!(annotation(&current, "deployment.kubernetes.io/desired-replicas") == "5");
    kubectl.ok(&["scale", "deployment/web", "--replicas=2"])?;
    rollout_status(&kubectl, "web")?;
    until("two pods remain", || {
        let pods = items(&json(&kubectl, &["get", "pods", "-l", "app=web"])?);
        Ok(pods.iter().filter(|p| !is_terminating(p)).count() == 2)
    })?;

    // Paused: a template change is observed but rolls nothing out until resumed.
    kubectl.ok(&["rollout", "pause", "deployment/web"])?;
    kubectl.ok(&["set", "image", "deployment/web", "nginx=nginx:1.27"])?;
    until("the paused condition is reported", || {
        let d = json(&kubectl, &["get", "deployment", "web"])?;
        Ok(
            d["status"]["observedGeneration"] == d["metadata"]["generation"]
                && d["status"]["conditions"]
                    .to_string()
                    .contains("DeploymentPaused"),
        )
    })?;
    let sets = items(&json(&kubectl, &["get", "rs", "-l", "app=web"])?);
    ensure!(sets.len() == 2, "a paused deployment rolled out: {sets:?}");
    contains(
        &kubectl.fails(&["rollout", "undo", "deployment/web"])?,
        "you cannot rollback a paused deployment",
    )?;
    kubectl.ok(&["rollout", "resume", "deployment/web"])?;
    rollout_status(&kubectl, "web")?;
    ensure!(replica_set_of_revision(&kubectl, "web", "4").is_ok());

    // A rollout that cannot progress (its pods fit no node) exceeds its deadline; scaling
    // the Deployment meanwhile spreads the new replicas over both ReplicaSets.
    kubectl.ok(&[
        "patch",
        "deployment/web",
        "--type=merge",
        "-p",
        r#"{"spec":{"replicas":3,"progressDeadlineSeconds":6,"template":{"spec":{"nodeSelector":{"zone":"mars"}}}}}"#,
    ])?;
    until("the stuck rollout has 3 old and 1 new replica", || {
        let old = replica_set_of_revision(&kubectl, "web", "4")?;
        let new = replica_set_of_revision(&kubectl, "web", "5");
        Ok(old["spec"]["replicas"] == 3 && new.is_ok_and(|new| new["spec"]["replicas"] == 1))
    })?;
    kubectl.ok(&["scale", "deployment/web", "--replicas=6"])?;
    // 3 old + 1 new of at most 4 becomes at most 7: the old set's share is 5, the new one's 2.
    until("the scale is spread proportionally", || {
        let old = replica_set_of_revision(&kubectl, "web", "4")?;
        let new = replica_set_of_revision(&kubectl, "web", "5")?;
        Ok(old["spec"]["replicas"] == 5 && new["spec"]["replicas"] == 2)
    })?;
    let failed = kubectl.fails(&["rollout", "status", "deployment/web", "--timeout=60s"])?;
    contains(&failed, "deployment \"web\" exceeded its progress deadline")?;
    let d = json(&kubectl, &["get", "deployment", "web"])?;
    contains(
        &d["status"]["conditions"].to_string(),
        "ProgressDeadlineExceeded",
    )?;
    kubectl.ok(&["rollout", "undo", "deployment/web"])?;
    rollout_status(&kubectl, "web")?;

    // History beyond revisionHistoryLimit goes, oldest first, the current set stays.
    kubectl.ok(&[
        "patch",
        "deployment/web",
        "--type=merge",
        "-p",
        r#"{"spec":{"revisionHistoryLimit":1}}"#,
    ])?;
    until("old ReplicaSets are cleaned up", || {
        Ok(items(&json(&kubectl, &["get", "rs", "-l", "app=web"])?).len() == 2)
    })?;
    let revisions: BTreeSet<String> = items(&json(&kubectl, &["get", "rs", "-l", "app=web"])?)
        .iter()
        .map(|rs| annotation(rs, REVISION))
        .collect();
    ensure!(
        revisions == BTreeSet::from(["5".to_string(), "6".to_string()]),
        "kept revisions {revisions:?}"
    );

    // Recreate: every old pod is gone before any new one exists.
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &manifest("batch", 2, "{type: Recreate}"),
    )?;
    rollout_status(&kubectl, "batch")?;
    let (seen, _) = observe(&kubectl, "batch", 2, 1, || {
        kubectl.ok(&["set", "image", "deployment/batch", "nginx=nginx:1.26"])?;
        rollout_status(&kubectl, "batch")
    })?;
    ensure!(seen.len() >= 4, "too few observations: {seen:?}");
    for snapshot in &seen {
        ensure!(
            snapshot.hashes.len() <= 1,
            "old and new pods at once: {snapshot:?} (all: {seen:?})"
        );
    }
    let pods = items(&json(&kubectl, &["get", "pods", "-l", "app=batch"])?);
    let new_hash = hash_of(&replica_set_of_revision(&kubectl, "batch", "2")?);
    ensure!(pods.len() == 2 && pods.iter().all(|p| hash_of(p) == new_hash));
    Ok(())
}

#[test]
fn a_deployment_adopts_a_matching_orphan_replica_set() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    // An orphan with the Deployment's template: it becomes the Deployment's current set.
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {name: orphan, labels: {app: adopt}}\nspec:\n  replicas: 0\n  selector: {matchLabels: {app: adopt}}\n  template:\n    metadata: {labels: {app: adopt}}\n    spec: {containers: [{name: nginx, image: 'nginx:1.25'}]}\n",
    )?;
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &manifest("adopt", 0, "{type: Recreate}"),
    )?;
    until("the orphan is adopted", || {
        let rs = json(&kubectl, &["get", "rs", "orphan"])?;
        let owner = &rs["metadata"]["ownerReferences"][0];
        Ok(
            owner["kind"] == "Deployment"
                && owner["name"] == "adopt"
                && owner["controller"] == true,
        )
    })?;
    until("its revision is synced", || {
        let rs = json(&kubectl, &["get", "rs", "orphan"])?;
        Ok(annotation(&rs, REVISION) == "1")
    })?;
    ensure!(
        items(&json(&kubectl, &["get", "rs", "-l", "app=adopt"])?).len() == 1,
        "a second ReplicaSet was created"
    );
    Ok(())
}

/// Needs the garbage collector (gc.rs): deleting a Deployment takes its ReplicaSets and
/// pods (background, foreground) or leaves them ownerless (orphan).
#[test]
fn deleting_a_deployment_cascades_as_asked() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    let _simulator = Simulator::start(&kubectl)?;
    let rolling = "{type: RollingUpdate}";
    let pods_of = |app: &str| -> anyhow::Result<usize> {
        Ok(items(&json(
            &kubectl,
            &["get", "pods", "-l", &format!("app={app}")],
        )?)
        .len())
    };
    let sets_of = |app: &str| -> anyhow::Result<Vec<Value>> {
        Ok(items(&json(
            &kubectl,
            &["get", "rs", "-l", &format!("app={app}")],
        )?))
    };
    for app in ["bg", "fg", "orphan"] {
        kubectl.ok_stdin(&["apply", "-f", "-"], &manifest(app, 2, rolling))?;
        rollout_status(&kubectl, app)?;
    }
    kubectl.ok(&["delete", "deployment", "bg", "--cascade=background"])?;
    until("bg's ReplicaSet and pods are collected", || {
        Ok(sets_of("bg")?.is_empty() && pods_of("bg")? == 0)
    })?;
    kubectl.ok(&[
        "delete",
        "deployment",
        "fg",
        "--cascade=foreground",
        "--timeout=60s",
    ])?;
    until("fg's ReplicaSet and pods are collected", || {
        Ok(sets_of("fg")?.is_empty() && pods_of("fg")? == 0)
    })?;
    kubectl.ok(&[
        "delete",
        "deployment",
        "orphan",
        "--cascade=orphan",
        "--timeout=60s",
    ])?;
    until("the orphan Deployment is gone", || {
        Ok(kubectl.fails(&["get", "deployment", "orphan"]).is_ok())
    })?;
    let sets = sets_of("orphan")?;
    ensure!(
        sets.len() == 1 && sets[0]["metadata"]["ownerReferences"].is_null(),
        "orphaned ReplicaSets: {sets:?}"
    );
    ensure!(pods_of("orphan")? == 2);
    Ok(())
}
