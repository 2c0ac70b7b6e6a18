//! Each cluster's share of a hosted service, end to end on `flotilla serve`: its request
//! budget and seats, its watches, its object and byte quotas, each refused with upstream's
//! status (429 with Retry-After, 403 exceeded quota) while other clusters go on being served.

use std::time::Duration;

use anyhow::{Context, ensure};
use flotilla_e2e::{Etcd, Serve};
use serde_json::Value;

use crate::contains;
use crate::tenancy::{create_cluster, eventually};

/// `body` is upstream's 429 Status: reason TooManyRequests with a one-second retry hint.
fn ensure_too_many_requests(body: &str) -> anyhow::Result<()> {
    let status: Value = serde_json::from_str(body)?;
    ensure!(
        status["reason"] == "TooManyRequests"
            && status["code"] == 429
            && status["details"]["retryAfterSeconds"] == 1,
        "{status}"
    );
    Ok(())
}

/// One cluster over its request budget gets 429 TooManyRequests with a retry hint; another
/// cluster of the same service is unaffected.
#[test]
fn a_cluster_over_its_request_limit_gets_429_and_others_do_not() -> anyhow::Result<()> {
    let etcd = Etcd::start()?;
    let service = Serve::start_with(
        &etcd.endpoint,
        &["--tenant-qps", "1", "--tenant-burst", "3"],
    )?;
    let x = service.account("x")?;
    let a = create_cluster(&service, &x, "noisy")?;
    let b = create_cluster(&service, &x, "quiet")?;
    // create_cluster listed nothing through the tenant APIs: each bucket is full (3).
    let mut statuses = Vec::new();
    let mut refusal = String::new();
    for _ in 0..6 {
        let (status, body) = a.kubectl.raw_get("/api/v1/namespaces")?;
        if status == 429 {
            refusal = body;
        }
        statuses.push(status);
    }
    ensure!(
        statuses.contains(&429) && statuses[0] == 200,
        "statuses of 6 quick requests: {statuses:?}"
    );
    ensure_too_many_requests(&refusal)?;
    let (status, body) = b.kubectl.raw_get("/api/v1/namespaces")?;
    ensure!(
        status == 200,
        "the quiet cluster was limited too: {status} {body}"
    );
    Ok(())
}

/// A cluster's requests hold one of its seats while they execute: a watch holds none, a
/// request that finds every seat taken and the queue full gets 429, and another cluster is
/// served meanwhile.
#[test]
fn a_cluster_with_every_seat_taken_gets_429_and_watches_take_no_seat() -> anyhow::Result<()> {
    let etcd = Etcd::start()?;
    let service = Serve::start_with(
        &etcd.endpoint,
        &["--tenant-max-in-flight", "1", "--tenant-max-queued", "0"],
    )?;
    let x = service.account("x")?;
    let a = create_cluster(&service, &x, "busy")?;
    let b = create_cluster(&service, &x, "other")?;
    std::thread::scope(|scope| -> anyhow::Result<()> {
        // A watch open for 3 s leaves the only seat free.
        let watch = scope.spawn(|| {
            a.kubectl
                .raw_get("/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=3")
        });
        std::thread::sleep(Duration::from_secs(1));
        let (status, body) = a.kubectl.raw_get("/api/v1/namespaces")?;
        ensure!(status == 200, "a watch took the seat: {status} {body}");
        let (status, _) = watch
            .join()
            .map_err(|_| anyhow::anyhow!("watch thread"))??;
        ensure!(status == 200, "the watch: {status}");

        // A list waiting for a resourceVersion the store has not reached holds the seat for
        // its 3 s (then 504): meanwhile a second request finds no seat and no queue room.
        let waiting = scope.spawn(|| {
            a.kubectl.raw_get(
                "/api/v1/namespaces/default/configmaps?resourceVersion=999999999&resourceVersionMatch=NotOlderThan",
            )
        });
        std::thread::sleep(Duration::from_secs(1));
        let (status, body) = a.kubectl.raw_get("/api/v1/namespaces")?;
        ensure!(
            status == 429,
            "a second request while the seat is held: {status} {body}"
        );
        ensure_too_many_requests(&body)?;
        let (status, body) = b.kubectl.raw_get("/api/v1/namespaces")?;
        ensure!(
            status == 200,
            "the other cluster waited too: {status} {body}"
        );
        let (status, body) = waiting
            .join()
            .map_err(|_| anyhow::anyhow!("list thread"))??;
        ensure!(status == 504, "the waiting list: {status} {body}");
        Ok(())
    })?;
    let (status, body) = a.kubectl.raw_get("/api/v1/namespaces")?;
    ensure!(
        status == 200,
        "the seat was not given back: {status} {body}"
    );
    Ok(())
}

/// A cluster at its object quota gets upstream's "exceeded quota" 403 on create and keeps
/// serving reads, updates and deletes; deleting objects makes room again.
#[test]
fn a_cluster_at_its_object_quota_refuses_creates_only() -> anyhow::Result<()> {
    let etcd = Etcd::start()?;
    let service = Serve::start_with(&etcd.endpoint, &["--tenant-max-objects", "120"])?;
    let x = service.account("x")?;
    let a = create_cluster(&service, &x, "full")?;
    let mut refused = None;
    for i in 0..120 {
        let out = a
            .kubectl
            .run(&["create", "configmap", &format!("fill-{i}")], None, &[])?;
        if !out.status.success() {
            refused = Some((i, String::from_utf8_lossy(&out.stderr).into_owned()));
            break;
        }
    }
    let (created, message) = refused.context("120 creates on top of the defaults all passed")?;
    ensure!(created > 0, "the first create was refused: {message}");
    contains(
        &message,
        "is forbidden: exceeded quota: flotilla-cluster-objects",
    )?;
    a.kubectl
        .ok(&["label", "configmap", "fill-0", "still=writable"])?;
    a.kubectl.ok(&["delete", "configmap", "fill-0", "fill-1"])?;
    // The count is re-read within seconds; after that, there is room again.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while a
        .kubectl
        .run(&["create", "configmap", "after-delete"], None, &[])?
        .status
        .code()
        != Some(0)
    {
        ensure!(
            std::time::Instant::now() < deadline,
            "no room after deletes"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    Ok(())
}

/// Security review, finding 4: a cluster may hold only `--tenant-max-watches` watches at once
/// (429 beyond, as upstream's other limits); its own hosted control loops are not counted,
/// and a watch that ends gives its place back.
#[test]
fn a_cluster_at_its_watch_limit_gets_429() -> anyhow::Result<()> {
    let etcd = Etcd::start()?;
    let service = Serve::start_with(&etcd.endpoint, &["--tenant-max-watches", "2"])?;
    let x = service.account("x")?;
    let a = create_cluster(&service, &x, "watched")?;
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let watches: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| {
                    a.kubectl.raw_get(
                        "/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=3",
                    )
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs(1));
        let (status, body) = a
            .kubectl
            .raw_get("/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=1")?;
        ensure!(status == 429, "a third watch: {status} {body}");
        ensure_too_many_requests(&body)?;
        // Other requests are served meanwhile.
        let (status, _) = a.kubectl.raw_get("/api/v1/namespaces")?;
        ensure!(status == 200, "a list beside the watches: {status}");
        for watch in watches {
            let (status, _) = watch
                .join()
                .map_err(|_| anyhow::anyhow!("watch thread"))??;
            ensure!(status == 200, "a watch: {status}");
        }
        Ok(())
    })?;
    let (status, body) = a
        .kubectl
        .raw_get("/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=1")?;
    ensure!(
        status == 200,
        "a watch after the others ended: {status} {body}"
    );
    // The cluster's own control loops kept working: a ReplicaSet still gets its pods.
    a.kubectl.ok(&[
        "create",
        "deployment",
        "web",
        "--image=flotilla.local/busybox:1",
    ])?;
    eventually(Duration::from_secs(20), || {
        contains(&a.kubectl.ok(&["get", "rs", "-o", "name"])?, "replicaset")
    })?;
    Ok(())
}

/// A ConfigMap named `name` holding `size` bytes of data, as a manifest.
fn sized_configmap(name: &str, size: usize) -> String {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": name },
        "data": { "payload": "x".repeat(size) },
    })
    .to_string()
}

/// What the cluster's `/metrics` says its objects hold.
fn stored_bytes(kubectl: &flotilla_e2e::Kubectl) -> anyhow::Result<u64> {
    let (status, body) = kubectl.raw_get("/metrics")?;
    ensure!(status == 200, "/metrics: {status} {body}");
    body.lines()
        .find_map(|line| line.strip_prefix("flotilla_cluster_stored_bytes "))
        .context("no flotilla_cluster_stored_bytes in /metrics")?
        .trim()
        .parse()
        .context("flotilla_cluster_stored_bytes")
}

/// Issue 27: a cluster may store only `--tenant-max-bytes` (its objects as they take in the
/// store). A create or an update that would grow it past that gets upstream's
/// "exceeded quota" 403; an update that shrinks an object and a delete are never refused, and
/// the room they free is there at once. Another cluster of the service is unaffected.
#[test]
fn a_cluster_at_its_byte_quota_refuses_growth_only() -> anyhow::Result<()> {
    const OBJECT: usize = 400 * 1024;
    let etcd = Etcd::start()?;
    let service = Serve::start_with(&etcd.endpoint, &["--tenant-max-bytes", "3Mi"])?;
    let x = service.account("x")?;
    let a = create_cluster(&service, &x, "heavy")?;
    let b = create_cluster(&service, &x, "light")?;
    let before = stored_bytes(&a.kubectl)?;
    ensure!(
        before > 0 && before < 3 << 20,
        "a new cluster's size: {before} bytes"
    );
    let mut refused = None;
    for i in 0..10 {
        let out = a.kubectl.run(
            &["create", "-f", "-"],
            Some(&sized_configmap(&format!("fill-{i}"), OBJECT)),
            &[],
        )?;
        if !out.status.success() {
            refused = Some((i, String::from_utf8_lossy(&out.stderr).into_owned()));
            break;
        }
    }
    let (created, message) = refused.context("4 MB of creates under a 3 MiB quota all passed")?;
    ensure!(created >= 2, "only {created} creates passed: {message}");
    contains(
        &message,
        "is forbidden: exceeded quota: flotilla-cluster-bytes, requested: bytes=",
    )?;
    contains(&message, "limited: bytes=3145728")?;
    let full = stored_bytes(&a.kubectl)?;
    ensure!(
        full <= 3 << 20 && full + OBJECT as u64 > 3 << 20,
        "at the quota the cluster holds {full} bytes"
    );
    // Growing an object is refused too; reads go on.
    let grown = a.kubectl.run(
        &["replace", "-f", "-"],
        Some(&sized_configmap("fill-0", 2 * OBJECT)),
        &[],
    )?;
    ensure!(
        !grown.status.success(),
        "an object grown past the quota was stored"
    );
    contains(
        &String::from_utf8_lossy(&grown.stderr),
        "exceeded quota: flotilla-cluster-bytes",
    )?;
    contains(&a.kubectl.ok(&["get", "configmaps"])?, "fill-0")?;
    // Shrinking one makes room at once, for a create of the same size.
    a.kubectl
        .ok_stdin(&["replace", "-f", "-"], &sized_configmap("fill-0", 10))?;
    a.kubectl.ok_stdin(
        &["create", "-f", "-"],
        &sized_configmap("after-shrink", OBJECT - 1024),
    )?;
    // So does a delete.
    a.kubectl.ok(&["delete", "configmap", "fill-1"])?;
    a.kubectl.ok_stdin(
        &["create", "-f", "-"],
        &sized_configmap("after-delete", OBJECT - 1024),
    )?;
    // The other cluster has its own quota.
    b.kubectl
        .ok_stdin(&["create", "-f", "-"], &sized_configmap("own", OBJECT))?;
    // Nothing stored was lost on the way.
    let listed = a.kubectl.ok(&["get", "configmaps", "-o", "name"])?;
    for name in ["fill-0", "after-shrink", "after-delete"] {
        contains(&listed, &format!("configmap/{name}\n"))?;
    }
    Ok(())
}
