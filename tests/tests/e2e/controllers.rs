//! The controller-manager as a whole, seen through kubectl: the garbage collector's
//! `--cascade=background|foreground|orphan`, and separate controller-manager and scheduler
//! processes killed mid-rollout finishing it after a restart without duplicate pods.

use std::time::Duration;

use anyhow::{Context, ensure};
use flotilla_e2e::{Backend, Flotilla, Kubectl, flotilla_process};

const REPLICA_SET: &str = "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {name: NAME}\nspec:\n  replicas: 2\n  selector: {matchLabels: {app: NAME}}\n  template:\n    metadata: {labels: {app: NAME}}\n    spec: {containers: [{name: c, image: nginx}]}\n";

fn pods_of(kubectl: &Kubectl, app: &str) -> anyhow::Result<Vec<String>> {
    Ok(kubectl
        .ok(&[
            "get",
            "pods",
            "-l",
            &format!("app={app}"),
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])?
        .split_whitespace()
        .map(str::to_string)
        .collect())
}

fn until(what: &str, done: impl FnMut() -> anyhow::Result<bool>) -> anyhow::Result<()> {
    flotilla_e2e::until(what, Duration::from_secs(30), done)
}

fn create_set(kubectl: &Kubectl, name: &str) -> anyhow::Result<()> {
    kubectl.ok_stdin(&["apply", "-f", "-"], &REPLICA_SET.replace("NAME", name))?;
    until(&format!("{name} has two pods"), || {
        Ok(pods_of(kubectl, name)?.len() == 2)
    })
}

#[test]
fn cascading_deletion_background_foreground_and_orphan() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();

    // Background: the owner goes at once, its pods shortly after.
    create_set(&kubectl, "bg")?;
    kubectl.ok(&["delete", "rs", "bg", "--cascade=background"])?;
    until("bg's pods are collected", || {
        Ok(pods_of(&kubectl, "bg")?.is_empty())
    })?;

    // Foreground: the owner stays (deletionTimestamp, foregroundDeletion finalizer) until
    // its pods are gone; kubectl waits for it.
    create_set(&kubectl, "fg")?;
    kubectl.ok(&[
        "delete",
        "rs",
        "fg",
        "--cascade=foreground",
        "--timeout=30s",
    ])?;
    ensure!(pods_of(&kubectl, "fg")?.is_empty(), "fg's pods outlived it");
    let missing = kubectl.fails(&["get", "rs", "fg"])?;
    ensure!(missing.contains("NotFound"), "fg still exists: {missing}");

    // Orphan: the pods stay, without their owner reference.
    create_set(&kubectl, "orphan")?;
    let before = pods_of(&kubectl, "orphan")?;
    kubectl.ok(&[
        "delete",
        "rs",
        "orphan",
        "--cascade=orphan",
        "--timeout=30s",
    ])?;
    until("orphan's owner is gone", || {
        Ok(kubectl.fails(&["get", "rs", "orphan"]).is_ok())
    })?;
    std::thread::sleep(Duration::from_secs(1));
    let after = pods_of(&kubectl, "orphan")?;
    ensure!(
        before == after,
        "orphaned pods changed: {before:?} → {after:?}"
    );
    let owners = kubectl.ok(&[
        "get",
        "pods",
        "-l",
        "app=orphan",
        "-o",
        "jsonpath={.items[*].metadata.ownerReferences}",
    ])?;
    ensure!(
        owners.trim().is_empty(),
        "orphans still name an owner: {owners}"
    );
    let first = after.first().context("no orphan left")?;
    kubectl.ok(&["delete", "pod", first])?;
    Ok(())
}

const ROLLOUT: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  replicas: 12\n  minReadySeconds: 2\n  strategy: {rollingUpdate: {maxSurge: 3, maxUnavailable: 0}}\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec: {containers: [{name: c, image: nginx:1.25}]}\n";

/// `flotilla up --external-control-loops` with `flotilla controller-manager`, `flotilla
/// scheduler` and the node simulator as separate processes; both control-loop processes are
/// SIGKILLed mid-rollout and restarted (same identity, so they take their leases back at
/// once): the rollout completes and the Deployment ends with exactly its replicas.
#[test]
fn a_rollout_survives_its_controller_manager_and_scheduler_being_killed() -> anyhow::Result<()> {
    let f = Flotilla::up_with(Backend::Embedded, &["--external-control-loops"])?;
    let kubectl = f.kubectl();
    let kubeconfig = kubectl.kubeconfig.to_str().context("path")?.to_string();
    let controller_manager = |identity: &str| {
        flotilla_process(&[
            "controller-manager",
            "--kubeconfig",
            &kubeconfig,
            "--identity",
            identity,
        ])
    };
    let scheduler =
        || flotilla_process(&["scheduler", "--kubeconfig", &kubeconfig, "--identity", "s1"]);
    let _nodes = flotilla_process(&[
        "simulate-nodes",
        "--kubeconfig",
        &kubeconfig,
        "--count",
        "4",
    ])?;
    let mut controllers = controller_manager("cm1")?;
    let mut placer = scheduler()?;
    kubectl.ok_stdin(&["apply", "-f", "-"], ROLLOUT)?;
    kubectl.ok(&["rollout", "status", "deploy/web", "--timeout=60s"])?;

    kubectl.ok(&["set", "image", "deploy/web", "c=nginx:1.26"])?;
    // The status must be of the new template (observedGeneration caught up): until then
    // updatedReplicas still counts the first rollout's pods.
    until("the rollout has started", || {
        let status = kubectl.ok(&[
            "get",
            "deploy",
            "web",
            "-o",
            "jsonpath={.metadata.generation} {.status.observedGeneration} {.status.updatedReplicas}",
        ])?;
        let fields: Vec<u32> = status
            .split_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect();
        Ok(matches!(fields.as_slice(), [generation, observed, updated]
            if observed == generation && *updated >= 1))
    })?;
    controllers.kill();
    placer.kill();
    // minReadySeconds makes every step of the rollout take two seconds: it is surely
    // unfinished when the loops die.
    let available = kubectl.ok(&[
        "get",
        "deploy",
        "web",
        "-o",
        "jsonpath={.status.updatedReplicas}/{.status.availableReplicas}",
    ])?;
    ensure!(
        available != "12/12",
        "the rollout finished before the loops were killed"
    );
    let _controllers = controller_manager("cm1")?;
    let _placer = scheduler()?;
    kubectl.ok(&["rollout", "status", "deploy/web", "--timeout=60s"])?;

    let pod_images = || {
        kubectl.ok(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={range .items[*]}{.spec.containers[0].image}{\"\\n\"}{end}",
        ])
    };
    until("old pods are gone", || {
        Ok(!pod_images()?.contains("nginx:1.25"))
    })?;
    let final_images = pod_images()?;
    let count = final_images.lines().filter(|l| *l == "nginx:1.26").count();
    ensure!(count == 12, "expected 12 new pods, found:\n{final_images}");
    let sets = kubectl.ok(&[
        "get",
        "rs",
        "-l",
        "app=web",
        "-o",
        "jsonpath={.items[*].spec.replicas}",
    ])?;
    let mut replicas: Vec<&str> = sets.split_whitespace().collect();
    replicas.sort();
    ensure!(replicas == ["0", "12"], "ReplicaSet replicas: {sets}");
    Ok(())
}
