//! End-to-end suites: the `flotilla` binary on the embedded store and on real etcd, driven by
//! stock kubectl 1.32 and the `flotilla` CLI, asserting on what they print.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use flotilla_e2e::{Backend, Etcd, Flotilla, kubectl_bin};

#[path = "e2e/admission.rs"]
mod admission;
#[path = "e2e/aggregation.rs"]
mod aggregation;
#[path = "e2e/audit.rs"]
mod audit;
#[path = "e2e/autoscaling.rs"]
mod autoscaling;
#[path = "e2e/backup.rs"]
mod backup;
#[path = "e2e/bootstrap.rs"]
mod bootstrap;
#[path = "e2e/cluster.rs"]
mod cluster;
#[path = "e2e/console.rs"]
mod console;
#[path = "e2e/controllers.rs"]
mod controllers;
#[path = "e2e/conversion.rs"]
mod conversion;
#[path = "e2e/crds.rs"]
mod crds;
#[path = "e2e/deployment.rs"]
mod deployment;
#[path = "e2e/encryption.rs"]
mod encryption;
#[path = "e2e/eviction.rs"]
mod eviction;
#[path = "e2e/faults.rs"]
mod faults;
#[path = "e2e/firstboot.rs"]
mod firstboot;
#[path = "e2e/firsthour.rs"]
mod firsthour;
#[path = "e2e/ingress.rs"]
mod ingress;
#[path = "e2e/jobs.rs"]
mod jobs;
#[path = "e2e/kubelet.rs"]
mod kubelet;
#[path = "e2e/kubelet_lifecycle.rs"]
mod kubelet_lifecycle;
#[path = "e2e/kubelet_volumes.rs"]
mod kubelet_volumes;
#[path = "e2e/lifecycle.rs"]
mod lifecycle;
#[path = "e2e/limits.rs"]
mod limits;
#[path = "e2e/loadbalancer.rs"]
mod loadbalancer;
#[path = "e2e/nodeimage.rs"]
mod nodeimage;
#[path = "e2e/nodepools.rs"]
mod nodepools;
#[path = "e2e/proxy.rs"]
mod proxy;
#[path = "e2e/scheduling.rs"]
mod scheduling;
#[path = "e2e/schemathesis.rs"]
mod schemathesis;
#[path = "e2e/sets.rs"]
mod sets;
#[path = "e2e/streaming.rs"]
mod streaming;
#[path = "e2e/tenancy.rs"]
mod tenancy;
#[path = "e2e/tenant_dns.rs"]
mod tenant_dns;
#[path = "e2e/terraform.rs"]
mod terraform;
#[path = "e2e/volumes.rs"]
mod volumes;
#[path = "e2e/webhooks.rs"]
mod webhooks;
#[path = "e2e/wire.rs"]
mod wire;

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: nginx
        image: nginx:1.25
        ports: [{containerPort: 80}]
      - name: sidecar
        image: busybox:1.36
"#;

fn contains(haystack: &str, needle: &str) -> anyhow::Result<()> {
    ensure!(
        haystack.contains(needle),
        "expected {needle:?} in:\n{haystack}"
    );
    Ok(())
}

/// The kubectl workflow of the foundation issue, step by step, each asserting on output.
fn kubectl_workflow(f: &Flotilla) -> anyhow::Result<()> {
    // version, api-resources, api-versions
    contains(&f.ok(&["version"])?, "Server Version: v1.33")?;
    let resources = f.ok(&["api-resources"])?;
    for needle in [
        "deployments",
        "apps/v1",
        "pods",
        "leases",
        "coordination.k8s.io/v1",
    ] {
        contains(&resources, needle)?;
    }
    let versions = f.ok(&["api-versions"])?;
    contains(&versions, "apps/v1")?;
    contains(&versions, "rbac.authorization.k8s.io/v1")?;

    // apply: create, then an out-of-band container, then re-apply a changed image: the
    // strategic merge keeps the container the manifest never mentioned.
    contains(
        &f.ok_stdin(&["apply", "-f", "-"], DEPLOYMENT)?,
        "deployment.apps/web created",
    )?;
    f.ok(&[
        "patch", "deployment", "web", "--type=strategic",
        "-p", r#"{"spec":{"template":{"spec":{"containers":[{"name":"extra","image":"busybox:1.35"}]}}}}"#,
    ])?;
    let changed = DEPLOYMENT.replace("nginx:1.25", "nginx:1.26");
    contains(
        &f.ok_stdin(&["apply", "-f", "-"], &changed)?,
        "deployment.apps/web configured",
    )?;
    let images = f.ok(&[
        "get",
        "deploy",
        "web",
        "-o",
        "jsonpath={range .spec.template.spec.containers[*]}{.name}={.image} {end}",
    ])?;
    // Upstream's merge puts patch-added items first; what matters is that none is lost.
    let mut images: Vec<&str> = images.split_whitespace().collect();
    images.sort_unstable();
    ensure!(
        images
            == [
                "extra=busybox:1.35",
                "nginx=nginx:1.26",
                "sidecar=busybox:1.36"
            ],
        "containers after re-apply: {images:?}"
    );

    // server-side apply, a conflict with another manager, then --force-conflicts
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  mode: fast\n";
    contains(
        &f.ok_stdin(&["apply", "--server-side", "-f", "-"], cm)?,
        "configmap/settings serverside-applied",
    )?;
    let other = cm.replace("fast", "slow");
    let out = f.kubectl().run(
        &["apply", "--server-side", "--field-manager=other", "-f", "-"],
        Some(&other),
        &[],
    )?;
    ensure!(!out.status.success(), "conflicting apply must fail");
    contains(
        &String::from_utf8_lossy(&out.stderr),
        "conflict with \"kubectl\"",
    )?;
    contains(&String::from_utf8_lossy(&out.stderr), ".data.mode")?;
    f.ok_stdin(
        &[
            "apply",
            "--server-side",
            "--field-manager=other",
            "--force-conflicts",
            "-f",
            "-",
        ],
        &other,
    )?;
    ensure!(
        f.ok(&["get", "cm", "settings", "-o", "jsonpath={.data.mode}"])? == "slow",
        "forced apply must win"
    );
    let managers = f.ok(&[
        "get",
        "cm",
        "settings",
        "-o",
        "jsonpath={.metadata.managedFields[*].manager}",
        "--show-managed-fields",
    ])?;
    contains(&managers, "other")?;

    // get: table, yaml, jsonpath, labels, fields, chunks, all namespaces
    let table = f.ok(&["get", "deploy"])?;
    contains(&table, "NAME")?;
    contains(&table, "READY")?;
    contains(&table, "UP-TO-DATE")?;
    contains(&table, "web")?;
    let yaml = f.ok(&["get", "deploy", "web", "-o", "yaml"])?;
    contains(&yaml, "kind: Deployment")?;
    contains(&yaml, "resourceVersion:")?;
    contains(&yaml, "maxSurge: 25%")?;
    for i in 0..7 {
        let manifest = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: chunk-{i}\n  labels: {{batch: chunked}}\ndata:\n  i: \"{i}\"\n"
        );
        f.ok_stdin(&["create", "-f", "-"], &manifest)?;
    }
    let chunked = f.ok(&[
        "get",
        "cm",
        "-l",
        "batch=chunked",
        "--chunk-size=2",
        "-o",
        "name",
    ])?;
    ensure!(chunked.lines().count() == 7, "chunked list:\n{chunked}");
    let unlabelled = f.ok(&["get", "cm", "-l", "batch!=chunked", "-o", "name"])?;
    contains(&unlabelled, "configmap/settings")?;
    ensure!(
        !unlabelled.contains("chunk-"),
        "negative selector leaked: {unlabelled}"
    );
    let by_field = f.ok(&[
        "get",
        "cm",
        "--field-selector",
        "metadata.name=chunk-3",
        "-o",
        "name",
    ])?;
    ensure!(
        by_field.trim() == "configmap/chunk-3",
        "field selector: {by_field}"
    );
    let all = f.ok(&["get", "svc", "-A"])?;
    contains(&all, "NAMESPACE")?;
    contains(&all, "kubernetes")?;
    contains(
        &f.fails(&["get", "pods", "--field-selector", "bogus=1"])?,
        "field label not supported: bogus",
    )?;

    // get -w sees a live change
    watch_sees_change(f)?;

    // describe, label, annotate, patch (three types), scale
    contains(&f.ok(&["describe", "deploy", "web"])?, "Replicas:")?;
    f.ok(&["label", "deploy", "web", "tier=frontend"])?;
    f.ok(&["annotate", "deploy", "web", "owner=team-a"])?;
    let meta = f.ok(&[
        "get",
        "deploy",
        "web",
        "-o",
        "jsonpath={.metadata.labels.tier}/{.metadata.annotations.owner}",
    ])?;
    ensure!(meta == "frontend/team-a", "label/annotate: {meta}");
    f.ok(&[
        "patch",
        "deploy",
        "web",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/spec/replicas","value":3}]"#,
    ])?;
    f.ok(&[
        "patch",
        "deploy",
        "web",
        "--type=merge",
        "-p",
        r#"{"metadata":{"labels":{"merged":"yes"}}}"#,
    ])?;
    f.ok(&["patch", "deploy", "web", "--type=strategic", "-p", r#"{"spec":{"template":{"spec":{"containers":[{"name":"sidecar","image":"busybox:1.37"}]}}}}"#])?;
    let patched = f.ok(&["get", "deploy", "web", "-o", "jsonpath={.spec.replicas} {.metadata.labels.merged} {.spec.template.spec.containers[?(@.name==\"sidecar\")].image} {.spec.template.spec.containers[?(@.name==\"nginx\")].image}"])?;
    ensure!(
        patched == "3 yes busybox:1.37 nginx:1.26",
        "patches: {patched}"
    );
    contains(
        &f.ok(&["scale", "deploy", "web", "--replicas=4"])?,
        "scaled",
    )?;
    f.ok(&[
        "wait",
        "deploy/web",
        "--for=jsonpath={.spec.replicas}=4",
        "--timeout=10s",
    ])?;

    // edit through KUBE_EDITOR: a script standing in for the user's editor
    let editor = f.data_dir().join("editor.sh");
    std::fs::write(
        &editor,
        "#!/bin/sh\nsed -i -e 's/i: \"0\"/i: edited/' \"$1\"\n",
    )?;
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&editor)
        .status()?;
    let editor = editor.to_string_lossy().into_owned();
    let out = f.kubectl().run(
        &["edit", "cm", "chunk-0"],
        None,
        &[("KUBE_EDITOR", &editor)],
    )?;
    ensure!(
        out.status.success(),
        "edit failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        f.ok(&["get", "cm", "chunk-0", "-o", "jsonpath={.data.i}"])? == "edited",
        "edit did not change the object"
    );

    // delete with a finalizer: Terminating until the finalizer goes
    let held = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: held\n  finalizers: [example.com/hold]\n";
    f.ok_stdin(&["create", "-f", "-"], held)?;
    f.ok(&["delete", "cm", "held", "--wait=false"])?;
    let stamp = f.ok(&[
        "get",
        "cm",
        "held",
        "-o",
        "jsonpath={.metadata.deletionTimestamp}",
    ])?;
    ensure!(
        !stamp.is_empty(),
        "object with a finalizer must stay with a deletionTimestamp"
    );
    let waiter = Command::new(kubectl_bin()?)
        .arg("--kubeconfig")
        .arg(&f.kubeconfig)
        .args(["wait", "cm/held", "--for=delete", "--timeout=20s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    f.ok(&[
        "patch",
        "cm",
        "held",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ])?;
    let waited = waiter.wait_with_output()?;
    ensure!(
        waited.status.success(),
        "wait --for=delete: {}",
        String::from_utf8_lossy(&waited.stderr)
    );
    contains(&f.fails(&["get", "cm", "held"])?, "not found")?;

    // create --dry-run=server stores nothing
    let dry = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: dry\n";
    contains(
        &f.ok_stdin(&["create", "--dry-run=server", "-f", "-"], dry)?,
        "created (server dry run)",
    )?;
    contains(&f.fails(&["get", "cm", "dry"])?, "not found")?;

    // diff: exit 1 and the change shown
    let diffed = DEPLOYMENT.replace("nginx:1.25", "nginx:1.27");
    let out = f.kubectl().run(&["diff", "-f", "-"], Some(&diffed), &[])?;
    ensure!(
        out.status.code() == Some(1),
        "diff exit code {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    contains(
        &String::from_utf8_lossy(&out.stdout),
        "+      - image: nginx:1.27",
    )?;

    // explain
    let explained = f.ok(&["explain", "deployment.spec.template"])?;
    contains(&explained, "PodTemplateSpec")?;
    contains(&explained, "FIELDS:")?;
    // … and from the OpenAPI v2 document, which kubectl reads in gnostic's protobuf form.
    let out = f.kubectl().run(
        &["explain", "deployment.spec.template.spec.containers.env"],
        None,
        &[("KUBECTL_EXPLAIN_OPENAPIV3", "false")],
    )?;
    contains(
        &String::from_utf8_lossy(&out.stdout),
        "FIELD: env <[]EnvVar>",
    )?;

    // A kind the server does not serve: upstream's "no matches", not a protobuf parse error.
    let widget = "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\n";
    let out = f.kubectl().run(&["apply", "-f", "-"], Some(widget), &[])?;
    ensure!(!out.status.success(), "a Widget was applied");
    contains(
        &String::from_utf8_lossy(&out.stderr),
        r#"no matches for kind "Widget" in version "example.com/v1""#,
    )?;
    Ok(())
}

fn watch_sees_change(f: &Flotilla) -> anyhow::Result<()> {
    let mut child = Command::new(kubectl_bin()?)
        .arg("--kubeconfig")
        .arg(&f.kubeconfig)
        .args(["get", "cm", "-w", "--request-timeout=30s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().context("watch stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Wait for the initial listing, then make a change the watch must show.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.contains("settings")) {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .context("watch printed no initial list")?;
        seen.push(line);
    }
    f.ok(&["create", "configmap", "live-change", "--from-literal=a=b"])
        .or_else(|_| {
            f.ok_stdin(
                &["create", "-f", "-"],
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: live-change\n",
            )
        })?;
    let found = loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.contains("live-change") => break true,
            Ok(_) => {}
            Err(_) => break false,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    ensure!(found, "get -w did not show the new configmap");
    Ok(())
}

#[test]
fn kubectl_workflow_on_embedded_store() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    kubectl_workflow(&f)
}

#[test]
fn kubectl_workflow_on_etcd() -> anyhow::Result<()> {
    let etcd = Etcd::start()?;
    let f = Flotilla::up(Backend::Etcd(etcd.endpoint.clone()))?;
    kubectl_workflow(&f)
}

/// Restarting `flotilla up` on the same data directory keeps every object and its
/// resourceVersion, after a clean stop and after SIGKILL.
#[test]
fn restart_keeps_objects_and_resource_versions() -> anyhow::Result<()> {
    let mut f = Flotilla::up(Backend::Embedded)?;
    f.ok_stdin(&["apply", "-f", "-"], DEPLOYMENT)?;
    for i in 0..5 {
        f.ok_stdin(
            &["create", "-f", "-"],
            &format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: keep-{i}\n"),
        )?;
    }
    // The Deployment's status keeps moving (its controller runs), so it is compared by
    // identity; everything else by resourceVersion too.
    let listing = |f: &Flotilla| -> anyhow::Result<String> {
        Ok(f.ok(&["get", "cm,ns,svc", "-A", "-o", "jsonpath={range .items[*]}{.kind}/{.metadata.name}@{.metadata.resourceVersion}/{.metadata.uid} {end}"])?
            + &f.ok(&["get", "deploy", "-A", "-o", "jsonpath={range .items[*]}{.kind}/{.metadata.name}/{.metadata.uid}/{.metadata.generation} {end}"])?)
    };
    let before = listing(&f)?;
    f.restart(false)?;
    ensure!(
        listing(&f)? == before,
        "objects changed across a clean restart"
    );
    f.restart(true)?;
    let after = listing(&f)?;
    ensure!(
        after == before,
        "objects changed across SIGKILL:\nbefore {before}\nafter  {after}"
    );
    // And the store keeps working.
    f.ok(&["scale", "deploy", "web", "--replicas=5"])?;
    Ok(())
}

/// Security review, finding 1: `flotilla up`'s data directory is its user's alone, looser
/// modes are tightened on start, and no private key is in the store's bytes — the service
/// still opens its sealed keys after a restart.
#[test]
fn data_dir_is_private_and_its_store_holds_no_plain_key() -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut f = Flotilla::up(Backend::Embedded)?;
    let dir = f.data_dir().to_path_buf();
    let mode = |path: &std::path::Path| -> anyhow::Result<u32> {
        Ok(std::fs::metadata(path)?.permissions().mode() & 0o777)
    };
    ensure!(mode(&dir)? == 0o700, "data dir mode {:o}", mode(&dir)?);
    for file in [
        "store.redb",
        "kubeconfig",
        "flotilla.json",
        "operator.json",
        "key-encryption-key",
    ] {
        let path = dir.join(file);
        ensure!(mode(&path)? == 0o600, "{file} mode {:o}", mode(&path)?);
    }
    let store = std::fs::read(dir.join("store.redb"))?;
    ensure!(
        !store.windows(11).any(|w| w == b"PRIVATE KEY"),
        "a private key is in the store's bytes"
    );
    // A store left readable by an older version is tightened on the next start.
    std::fs::set_permissions(
        dir.join("store.redb"),
        std::fs::Permissions::from_mode(0o644),
    )?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    f.restart(false)?;
    ensure!(
        mode(&dir)? == 0o700 && mode(&dir.join("store.redb"))? == 0o600,
        "not tightened"
    );
    f.ok(&["get", "ns", "kube-system"])?;
    Ok(())
}
