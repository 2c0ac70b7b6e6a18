//! The first hour, as a new user lives it: `flotilla up` with no flag on a machine that can host
//! a node prints where everything is (in order, on stdout), logs without ANSI escapes to a file,
//! runs one node, and `kubectl run` gets a busybox pod Running; on a machine that cannot, the
//! cluster's health and an Event say why `kubectl get nodes` is empty; with `--nodes 0`, a pod
//! gets upstream's FailedScheduling event.

use std::time::Duration;

use anyhow::{Context, ensure};
use flotilla_e2e::nodes::LocalCluster;
use flotilla_e2e::{Backend, Flotilla, FlotillaCli, Kubectl, until};

fn wait(what: &str, done: impl FnMut() -> anyhow::Result<bool>) -> anyhow::Result<()> {
    until(what, Duration::from_secs(120), done)
}

/// `flotilla up`'s stdout, once all of its six lines are there.
fn printed_lines(flotilla: &Flotilla) -> anyhow::Result<Vec<String>> {
    wait("flotilla up to print its six lines", || {
        Ok(flotilla.stdout_lines().len() >= 6)
    })?;
    Ok(flotilla.stdout_lines())
}

/// The lines name, in order: the kubeconfig, its export, the API, the management API, the
/// console, the client configuration, how to stop.
fn check_printed(flotilla: &Flotilla) -> anyhow::Result<()> {
    let lines = printed_lines(flotilla)?;
    let kubeconfig = flotilla.kubeconfig.canonicalize()?;
    let client_config = flotilla.data_dir().join("flotilla.json").canonicalize()?;
    ensure!(lines.len() == 7, "up printed {lines:#?}");
    ensure!(lines[0] == kubeconfig.display().to_string(), "{lines:#?}");
    ensure!(
        lines[1] == format!("export KUBECONFIG={}", kubeconfig.display()),
        "{lines:#?}"
    );
    ensure!(
        lines[2].starts_with("API endpoint: https://127.0.0.1:")
            && lines[2].ends_with("/clusters/demo"),
        "{lines:#?}"
    );
    ensure!(
        lines[3].starts_with("Management endpoint: https://127.0.0.1:")
            && lines[3].ends_with("/v1/"),
        "{lines:#?}"
    );
    ensure!(
        lines[4].starts_with("Console: https://127.0.0.1:")
            && lines[4].contains("/console/ (sign in with the apiKey of"),
        "{lines:#?}"
    );
    ensure!(
        lines[5].starts_with(&format!(
            "Client configuration: {}",
            client_config.display()
        )),
        "{lines:#?}"
    );
    ensure!(lines[6].starts_with("Stop with Ctrl-C"), "{lines:#?}");
    Ok(())
}

fn cli(flotilla: &Flotilla) -> FlotillaCli {
    FlotillaCli {
        config: flotilla.data_dir().join("flotilla.json"),
    }
}

fn health_issues(flotilla: &Flotilla) -> anyhow::Result<Vec<serde_json::Value>> {
    let cluster: serde_json::Value =
        serde_json::from_str(&cli(flotilla).ok(&["cluster", "get", "demo", "-o", "json"])?)?;
    Ok(cluster["health"]["issues"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

fn pod_phase(kubectl: &Kubectl, name: &str) -> anyhow::Result<String> {
    Ok(kubectl
        .ok(&["get", "pod", name, "-o", "jsonpath={.status.phase}"])?
        .trim()
        .to_string())
}

#[test]
fn up_with_no_flag_runs_a_node_and_a_busybox_pod() -> anyhow::Result<()> {
    let logs = tempfile::tempdir()?;
    let log_file = logs.path().join("up.log");
    let cluster = LocalCluster::start_as_typed(log_file.clone())?;
    let flotilla = &cluster.flotilla;
    check_printed(flotilla)?;
    let kubectl = flotilla.kubectl();
    wait("node-1 to be Ready", || {
        let ready = kubectl.ok(&[
            "get",
            "nodes",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type==\"Ready\")].status} {end}",
        ])?;
        Ok(ready.split_whitespace().any(|node| node == "node-1=True"))
    })
    .with_context(|| cluster.logs())?;
    kubectl.ok(&[
        "run",
        "busybox",
        "--image=flotilla.local/busybox:1",
        "--image-pull-policy=Never",
        "--restart=Never",
        "--",
        "sleep",
        "3600",
    ])?;
    wait("the busybox pod to be Running", || {
        Ok(pod_phase(&kubectl, "busybox")? == "Running")
    })
    .with_context(|| cluster.logs())?;
    ensure!(
        health_issues(flotilla)?.is_empty(),
        "a cluster with its node reports {:?}",
        health_issues(flotilla)?
    );
    // Everything `up` logged went to the file, with no colour escapes.
    let logged = std::fs::read(&log_file)?;
    ensure!(
        !logged.windows(2).any(|pair| pair == b"\x1b["),
        "the log file has ANSI escapes: {}",
        String::from_utf8_lossy(&logged)
    );
    Ok(())
}

#[test]
fn up_on_a_machine_without_a_runtime_says_why_and_pods_wait() -> anyhow::Result<()> {
    let logs = tempfile::tempdir()?;
    let log_file = logs.path().join("up.log");
    // No containerd, runc or anything else on PATH: the machine cannot host a node.
    let flotilla = Flotilla::up_as_typed(
        Backend::Embedded,
        &[],
        &[("PATH", "/nonexistent")],
        Some(log_file.clone()),
    )?;
    check_printed(&flotilla)?;
    let told = std::fs::read_to_string(&log_file)?;
    let notice: Vec<&str> = told
        .lines()
        .filter(|line| line.starts_with("flotilla up: no local node"))
        .collect();
    ensure!(notice.len() == 1, "one notice line on stderr, got: {told}");
    ensure!(
        notice[0].contains("containerd") && notice[0].contains("apt-get install"),
        "the notice names what is missing and how to install it: {}",
        notice[0]
    );
    let issues = health_issues(&flotilla)?;
    ensure!(
        issues.len() == 1 && issues[0]["code"] == "NoLocalNodes",
        "cluster get demo shows {issues:?}"
    );
    let kubectl = flotilla.kubectl();
    wait("the NoLocalNodes event", || {
        let events = kubectl.ok(&["get", "events", "-n", "default"])?;
        Ok(events.contains("NoLocalNodes") && events.contains("containerd"))
    })?;
    Ok(())
}

#[test]
fn up_with_no_nodes_gives_a_pod_upstreams_failed_scheduling_event() -> anyhow::Result<()> {
    let flotilla = Flotilla::up_with(Backend::Embedded, &["--nodes", "0"])?;
    check_printed(&flotilla)?;
    // --nodes 0 is the user's choice: no health issue.
    ensure!(health_issues(&flotilla)?.is_empty());
    let kubectl = flotilla.kubectl();
    kubectl.ok(&[
        "run",
        "waiting",
        "--image=flotilla.local/busybox:1",
        "--restart=Never",
    ])?;
    // Upstream's scheduler (schedule_one.go) answers an empty cluster with ErrNoNodesAvailable:
    // "no nodes available to schedule pods", as the pod's FailedScheduling event.
    wait("the FailedScheduling event", || {
        let events = kubectl.ok(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=waiting,reason=FailedScheduling",
            "-o",
            "jsonpath={.items[*].message}",
        ])?;
        Ok(events.contains("no nodes available to schedule pods"))
    })?;
    ensure!(pod_phase(&kubectl, "waiting")? == "Pending");
    Ok(())
}
