//! The garbage collector seen through kubectl: `--cascade=background|foreground|orphan` on a
//! ReplicaSet and its pods behave as upstream.

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use flotilla_e2e::{Backend, Flotilla, Kubectl};

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

fn until(what: &str, mut done: impl FnMut() -> anyhow::Result<bool>) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done()? {
        ensure!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
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
