//! The kubelet's container lifecycle on a real node (containerd in a node namespace on a
//! fabric, `flotilla-kubelet` inside it), driven by stock kubectl 1.32: init containers in
//! order before the app, a sidecar init container, a failed one failing a restartPolicy
//! Never pod, exec, httpGet and tcpSocket probes (readiness flipping Ready, liveness
//! restarting with `Unhealthy` and `Killing` events), a failing postStart hook, preStop on
//! deletion within the grace period, requests/limits in the container's own cgroup, and an
//! in-place resize (CPU in place, an infeasible one refused, memory by a restart).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use flotilla_e2e::nodes::SingleNode;
use flotilla_e2e::{Flotilla, Kubectl, jsonpath, until};

const NODE: &str = "lifecycle-e2e";
const POD_CIDR: &str = "10.244.78.0/24";

const PODS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: init}
spec:
  nodeName: lifecycle-e2e
  terminationGracePeriodSeconds: 1
  initContainers:
  - {name: first, image: flotilla.local/busybox:1, imagePullPolicy: Never, command: [sleep, "3"]}
  - {name: second, image: flotilla.local/busybox:1, imagePullPolicy: Never, command: [sleep, "1"]}
  containers:
  - {name: main, image: flotilla.local/busybox:1, imagePullPolicy: Never, command: [sleep, "3600"]}
---
apiVersion: v1
kind: Pod
metadata: {name: sidecar}
spec:
  nodeName: lifecycle-e2e
  terminationGracePeriodSeconds: 1
  initContainers:
  - name: side
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    restartPolicy: Always
    command: [sh, -c, "touch /tmp/up; sleep 3600"]
    startupProbe:
      exec: {command: [test, -f, /tmp/up]}
      periodSeconds: 1
  - {name: setup, image: flotilla.local/busybox:1, imagePullPolicy: Never, command: [sleep, "1"]}
  containers:
  - {name: main, image: flotilla.local/busybox:1, imagePullPolicy: Never, command: [sleep, "3600"]}
---
apiVersion: v1
kind: Pod
metadata: {name: initfail}
spec:
  nodeName: lifecycle-e2e
  restartPolicy: Never
  initContainers:
  - {name: broken, image: flotilla.local/busybox:1, imagePullPolicy: Never, command: [sh, -c, "exit 3"]}
  containers:
  - {name: main, image: flotilla.local/busybox:1, imagePullPolicy: Never, command: [sleep, "3600"]}
---
apiVersion: v1
kind: Pod
metadata: {name: ready}
spec:
  nodeName: lifecycle-e2e
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    command: [sh, -c, "while true; do sleep 5; touch /tmp/ready; sleep 5; rm /tmp/ready; done"]
    readinessProbe:
      exec: {command: [test, -f, /tmp/ready]}
      periodSeconds: 1
      failureThreshold: 1
---
apiVersion: v1
kind: Pod
metadata: {name: live}
spec:
  nodeName: lifecycle-e2e
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    command: [sh, -c, "touch /tmp/alive; sleep 4; rm /tmp/alive; sleep 3600"]
    livenessProbe:
      exec: {command: [test, -f, /tmp/alive]}
      periodSeconds: 1
      failureThreshold: 2
---
apiVersion: v1
kind: Pod
metadata: {name: poststart}
spec:
  nodeName: lifecycle-e2e
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    command: [sleep, "3600"]
    lifecycle:
      postStart:
        exec: {command: [sh, -c, "echo nope >&2; exit 1"]}
---
apiVersion: v1
kind: Pod
metadata: {name: prestop}
spec:
  nodeName: lifecycle-e2e
  terminationGracePeriodSeconds: 10
  containers:
  - name: main
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    command: [sh, -c, "trap 'echo TERM; exit 0' TERM; echo started; while true; do sleep 1; done"]
    lifecycle:
      preStop:
        exec: {command: [sh, -c, "echo prestop > /proc/1/fd/1; sleep 2"]}
---
apiVersion: v1
kind: Pod
metadata: {name: limits}
spec:
  nodeName: lifecycle-e2e
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    command: [sh, -c, "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.shares /proc/self/oom_score_adj; sleep 3600"]
    resources:
      limits: {cpu: 500m, memory: 64Mi}
    resizePolicy:
    - {resourceName: memory, restartPolicy: RestartContainer}
---
apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  nodeName: lifecycle-e2e
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    command: [sh, -c, "mkdir -p /www && echo ok > /www/healthz && exec httpd -f -p 8080 -h /www"]
    ports: [{name: http, containerPort: 8080}]
    readinessProbe:
      httpGet: {path: /healthz, port: http, httpHeaders: [{name: X-Probe, value: "1"}]}
      periodSeconds: 1
    livenessProbe:
      tcpSocket: {port: 8080}
      periodSeconds: 1
---
apiVersion: v1
kind: Pod
metadata: {name: webfail}
spec:
  nodeName: lifecycle-e2e
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    command: [sh, -c, "mkdir -p /www && exec httpd -f -p 8080 -h /www"]
    readinessProbe:
      tcpSocket: {port: 9999}
      periodSeconds: 1
    livenessProbe:
      httpGet: {path: /missing, port: 8080}
      periodSeconds: 1
      failureThreshold: 2
"#;

/// (type, reason, message) of the events about `pod` (and its containers).
fn events(kubectl: &Kubectl, pod: &str) -> anyhow::Result<Vec<(String, String, String)>> {
    let list: serde_json::Value =
        serde_json::from_str(&kubectl.ok(&["get", "events", "-o", "json"])?)?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["involvedObject"]["name"] == pod)
        .map(|e| {
            let text = |k: &str| e[k].as_str().unwrap_or("").to_string();
            (text("type"), text("reason"), text("message"))
        })
        .collect())
}

fn has_event(
    kubectl: &Kubectl,
    pod: &str,
    reason: &str,
    message: impl Fn(&str) -> bool,
) -> anyhow::Result<bool> {
    Ok(events(kubectl, pod)?
        .iter()
        .any(|(_, r, m)| r == reason && message(m)))
}

fn field(kubectl: &Kubectl, pod: &str, path: &str) -> anyhow::Result<String> {
    jsonpath(kubectl, &["get", "pod", pod], path)
}

fn condition(kubectl: &Kubectl, pod: &str, kind: &str) -> anyhow::Result<String> {
    field(
        kubectl,
        pod,
        &format!("{{.status.conditions[?(@.type==\"{kind}\")].status}}"),
    )
}

fn restarts(kubectl: &Kubectl, pod: &str) -> anyhow::Result<u32> {
    Ok(
        field(kubectl, pod, "{.status.containerStatuses[0].restartCount}")?
            .parse()
            .unwrap_or(0),
    )
}

/// The kubectl STATUS column of `pod`.
fn status_column(kubectl: &Kubectl, pod: &str) -> anyhow::Result<String> {
    let table = kubectl.ok(&["get", "pod", pod, "--no-headers"])?;
    Ok(table
        .split_whitespace()
        .nth(2)
        .unwrap_or_default()
        .to_string())
}

/// The lines a container wrote (CRI log format: `<time> <stream> <tag> <line>`), with
/// their times, from the kubelet's log directory.
fn container_log(root: &Path, pod: &str, uid: &str) -> anyhow::Result<Vec<(String, String)>> {
    let path = root.join(format!("logs/default_{pod}_{uid}/main/0.log"));
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(4, ' ');
            let time = parts.next()?.to_string();
            let line = parts.nth(2)?.to_string();
            Some((time, line))
        })
        .collect())
}

/// Seconds since midnight of an RFC 3339 time (`…THH:MM:SS.fffZ`), for ordering log lines
/// of one run.
fn day_seconds(time: &str) -> Option<f64> {
    let clock = time.split('T').nth(1)?.trim_end_matches('Z');
    let clock = clock.split(['+', '-']).next()?;
    let mut parts = clock.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

#[test]
fn kubelet_runs_container_lifecycle() -> anyhow::Result<()> {
    let node = SingleNode::start(NODE, POD_CIDR, &[])?;
    let (flotilla, kubectl, dir) = (&node.flotilla, node.flotilla.kubectl(), node.dir.path());
    let outcome = node
        .wait_ready(NODE)
        .and_then(|()| scenario(flotilla, &kubectl, &dir.join("kubelet")));
    outcome.with_context(|| format!("kubelet log:\n{}", node.kubelet.log()))
}

/// In-place resize of the `limits` pod (`kubectl patch --subresource resize`): CPU in place
/// (the cgroup changes, the container keeps running), more CPU than the node has refused as
/// `Infeasible`, and memory, whose resize policy restarts the container.
fn resize(kubectl: &Kubectl) -> anyhow::Result<()> {
    let patch = |cpu: &str, memory: &str| {
        let body = format!(
            r#"{{"spec":{{"containers":[{{"name":"main","resources":{{"requests":{{"cpu":"{cpu}","memory":"{memory}"}},"limits":{{"cpu":"{cpu}","memory":"{memory}"}}}}}}]}}}}"#
        );
        kubectl.ok(&[
            "patch",
            "pod",
            "limits",
            "--subresource",
            "resize",
            "-p",
            &body,
        ])
    };
    let reported = |path: &str| {
        field(
            kubectl,
            "limits",
            &format!("{{.status.containerStatuses[0].resources.{path}}}"),
        )
    };
    let cgroup = |file: &str| -> anyhow::Result<String> {
        Ok(kubectl
            .ok(&["exec", "limits", "--", "cat", file])?
            .trim()
            .to_string())
    };
    ensure!(
        reported("limits.cpu")? == "500m",
        "resources before: {}",
        field(
            kubectl,
            "limits",
            "{.status.containerStatuses[0].resources}"
        )?
    );
    patch("800m", "64Mi")?;
    until(
        "the CPU resize is actuated",
        Duration::from_secs(30),
        || {
            Ok(reported("limits.cpu")? == "800m"
                && condition(kubectl, "limits", "PodResizeInProgress")?.is_empty())
        },
    )?;
    let quota = cgroup("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")?;
    let shares = cgroup("/sys/fs/cgroup/cpu/cpu.shares")?;
    ensure!(
        (quota.as_str(), shares.as_str()) == ("80000", "819"),
        "after the resize: quota {quota}, shares {shares}"
    );
    ensure!(
        restarts(kubectl, "limits")? == 0,
        "a CPU resize restarted the container"
    );

    patch("1000", "64Mi")?;
    until("the resize is Infeasible", Duration::from_secs(30), || {
        Ok(field(
            kubectl,
            "limits",
            r#"{.status.conditions[?(@.type=="PodResizePending")].reason}"#,
        )? == "Infeasible")
    })?;
    let message = field(
        kubectl,
        "limits",
        r#"{.status.conditions[?(@.type=="PodResizePending")].message}"#,
    )?;
    ensure!(
        message
            .starts_with("Node didn't have enough capacity: cpu, requested: 1000000, capacity: "),
        "PodResizePending message {message:?}"
    );
    ensure!(
        reported("limits.cpu")? == "800m",
        "an infeasible resize changed the status"
    );

    patch("800m", "128Mi")?;
    until(
        "the memory resize restarts the container",
        Duration::from_secs(60),
        || {
            Ok(restarts(kubectl, "limits")? == 1
                && reported("limits.memory")? == "128Mi"
                && field(kubectl, "limits", "{.status.phase}")? == "Running")
        },
    )?;
    until(
        "the new container has 128Mi",
        Duration::from_secs(20),
        || {
            Ok(
                cgroup("/sys/fs/cgroup/memory/memory.limit_in_bytes").unwrap_or_default()
                    == "134217728",
            )
        },
    )?;
    ensure!(
        condition(kubectl, "limits", "PodResizePending")?.is_empty(),
        "conditions: {}",
        field(kubectl, "limits", "{.status.conditions}")?
    );
    ensure!(
        has_event(kubectl, "limits", "Killing", |m| m
            == "Container main resize requires restart")?,
        "limits events: {:?}",
        events(kubectl, "limits")?
    );
    Ok(())
}

fn scenario(flotilla: &Flotilla, kubectl: &Kubectl, root: &Path) -> anyhow::Result<()> {
    flotilla.ok_stdin(&["apply", "-f", "-"], PODS)?;

    // Init containers: the first runs while the pod shows Init:0/2 and is not initialized.
    until("init shows Init:0/2", Duration::from_secs(60), || {
        Ok(status_column(kubectl, "init")? == "Init:0/2")
    })?;
    let message = field(
        kubectl,
        "init",
        r#"{.status.conditions[?(@.type=="Initialized")].reason}"#,
    )?;
    ensure!(
        message == "ContainersNotInitialized",
        "Initialized reason {message:?}"
    );
    let app_waiting = field(
        kubectl,
        "init",
        "{.status.containerStatuses[0].state.waiting.reason}",
    )?;
    ensure!(
        app_waiting == "PodInitializing",
        "app waiting {app_waiting:?}"
    );
    until("init is Running", Duration::from_secs(60), || {
        Ok(field(kubectl, "init", "{.status.phase}")? == "Running")
    })?;
    let time = |path: &str| field(kubectl, "init", path);
    let first_done = time("{.status.initContainerStatuses[0].state.terminated.finishedAt}")?;
    let second_start = time("{.status.initContainerStatuses[1].state.terminated.startedAt}")?;
    let second_done = time("{.status.initContainerStatuses[1].state.terminated.finishedAt}")?;
    let app_start = time("{.status.containerStatuses[0].state.running.startedAt}")?;
    ensure!(
        !first_done.is_empty() && first_done <= second_start && second_done <= app_start,
        "init order: first done {first_done}, second {second_start}–{second_done}, app {app_start}"
    );
    ensure!(condition(kubectl, "init", "Initialized")? == "True");
    ensure!(status_column(kubectl, "init")? == "Running");

    // A sidecar (an init container with restartPolicy Always) starts first, passes its
    // startup probe, keeps running beside the app and counts in READY.
    until("sidecar is Running", Duration::from_secs(60), || {
        Ok(field(kubectl, "sidecar", "{.status.phase}")? == "Running")
    })?;
    let side = |path: &str| field(kubectl, "sidecar", path);
    ensure!(side("{.status.initContainerStatuses[0].started}")? == "true");
    let side_start = side("{.status.initContainerStatuses[0].state.running.startedAt}")?;
    let setup_start = side("{.status.initContainerStatuses[1].state.terminated.startedAt}")?;
    ensure!(
        !side_start.is_empty() && side_start <= setup_start,
        "sidecar started {side_start:?}, setup {setup_start:?}"
    );
    until("sidecar is 2/2 ready", Duration::from_secs(30), || {
        let row = kubectl.ok(&["get", "pod", "sidecar", "--no-headers"])?;
        Ok(row.split_whitespace().nth(1) == Some("2/2"))
    })?;

    // A failed init container fails a restartPolicy Never pod; the app never starts.
    until("initfail is Failed", Duration::from_secs(60), || {
        Ok(field(kubectl, "initfail", "{.status.phase}")? == "Failed")
    })?;
    let column = status_column(kubectl, "initfail")?;
    ensure!(column == "Init:Error", "initfail STATUS {column:?}");
    let exit = field(
        kubectl,
        "initfail",
        "{.status.initContainerStatuses[0].state.terminated.exitCode}",
    )?;
    ensure!(exit == "3", "init exit code {exit:?}");
    let app = field(
        kubectl,
        "initfail",
        "{.status.containerStatuses[0].state.waiting.reason}",
    )?;
    ensure!(app == "PodInitializing", "initfail app {app:?}");

    // An exec readiness probe: not ready, ready once the file exists, not ready once gone
    // (the container flips it every 5 s).
    let mut seen = Vec::new();
    until("ready goes Ready and back", Duration::from_secs(90), || {
        let now = condition(kubectl, "ready", "Ready")?;
        if seen.last() != Some(&now) {
            seen.push(now);
        }
        Ok(seen.ends_with(&["False".to_string(), "True".to_string(), "False".to_string()]))
    })?;
    let container_ready = field(kubectl, "ready", "{.status.containerStatuses[0].ready}")?;
    ensure!(
        container_ready == "false",
        "container ready {container_ready:?}"
    );
    ensure!(
        field(
            kubectl,
            "ready",
            "{.status.containerStatuses[0].restartCount}"
        )? == "0"
    );
    ensure!(has_event(kubectl, "ready", "Unhealthy", |m| m
        == "Readiness probe failed: ")?);

    // An exec liveness probe that starts failing restarts the container.
    until("live restarts", Duration::from_secs(90), || {
        Ok(restarts(kubectl, "live")? >= 1)
    })?;
    until("live's events arrive", Duration::from_secs(30), || {
        Ok(has_event(kubectl, "live", "Unhealthy", |m| {
            m == "Liveness probe failed: "
        })? && has_event(kubectl, "live", "Killing", |m| {
            m == "Container main failed liveness probe, will be restarted"
        })?)
    })?;
    let exit = field(
        kubectl,
        "live",
        "{.status.containerStatuses[0].lastState.terminated.exitCode}",
    )?;
    // sh as PID 1 ignores SIGTERM: the grace period ran out and SIGKILL ended it.
    ensure!(exit == "137", "live lastState exit code {exit:?}");

    // A failing postStart hook kills the container, with upstream's events.
    until("poststart's hook fails", Duration::from_secs(60), || {
        Ok(has_event(kubectl, "poststart", "FailedPostStartHook", |m| {
            m.starts_with(
                "Exec lifecycle hook ([sh -c echo nope >&2; exit 1]) for Container \"main\" in Pod \"poststart_default(",
            ) && m.contains("exited with 1: nope")
        })? && has_event(kubectl, "poststart", "Killing", |m| {
            m == "FailedPostStartHook"
        })?)
    })?;
    until("poststart is held back", Duration::from_secs(30), || {
        let reason = field(
            kubectl,
            "poststart",
            "{.status.containerStatuses[0].state.waiting.reason}",
        )?;
        Ok(matches!(
            reason.as_str(),
            "PostStartHookError" | "CrashLoopBackOff"
        ))
    })?;

    // Limits reach the container's cgroup: 64Mi memory, a 500m CFS quota, 512 shares.
    until("limits is Running", Duration::from_secs(60), || {
        Ok(field(kubectl, "limits", "{.status.phase}")? == "Running")
    })?;
    ensure!(field(kubectl, "limits", "{.status.qosClass}")? == "Guaranteed");
    ensure!(
        field(
            kubectl,
            "limits",
            "{.spec.containers[0].resources.requests.memory}"
        )? == "64Mi"
    );
    let uid = field(kubectl, "limits", "{.metadata.uid}")?;
    let mut lines = Vec::new();
    until("limits logs its cgroup", Duration::from_secs(20), || {
        lines = container_log(root, "limits", &uid).unwrap_or_default();
        Ok(lines.len() >= 4)
    })?;
    let values: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
    println!("limits: memory limit, cfs quota, shares, oom_score_adj = {values:?}");
    ensure!(
        values[..3] == ["67108864", "50000", "512"],
        "cgroup values {values:?}"
    );
    ensure!(
        has_event(kubectl, "limits", "Pulled", |m| {
            m == "Container image \"flotilla.local/busybox:1\" already present on machine"
        })? && has_event(kubectl, "limits", "Created", |m| m
            == "Created container: main")?
            && has_event(kubectl, "limits", "Started", |m| m
                == "Started container main")?,
        "limits events: {:?}",
        events(kubectl, "limits")?
    );
    resize(kubectl)?;

    // httpGet (named port, headers) and tcpSocket probes from the node to the pod IP.
    until("web is Ready", Duration::from_secs(60), || {
        Ok(condition(kubectl, "web", "Ready")? == "True")
    })?;
    until(
        "webfail restarts on its httpGet liveness probe",
        Duration::from_secs(90),
        || Ok(restarts(kubectl, "webfail")? >= 1),
    )?;
    let ip = field(kubectl, "webfail", "{.status.podIP}")?;
    let refused =
        format!("Readiness probe failed: dial tcp {ip}:9999: connect: connection refused");
    until(
        "webfail's probe events arrive",
        Duration::from_secs(30),
        || {
            Ok(has_event(kubectl, "webfail", "Unhealthy", |m| {
                m == "Liveness probe failed: HTTP probe failed with statuscode: 404"
            })? && has_event(kubectl, "webfail", "Unhealthy", |m| m == refused)?)
        },
    )?;
    ensure!(condition(kubectl, "webfail", "Ready")? == "False");
    ensure!(restarts(kubectl, "web")? == 0, "web restarted");

    // preStop runs on deletion before SIGTERM, within the grace period.
    until("prestop is Running", Duration::from_secs(60), || {
        Ok(field(kubectl, "prestop", "{.status.phase}")? == "Running")
    })?;
    let uid = field(kubectl, "prestop", "{.metadata.uid}")?;
    let started = Instant::now();
    kubectl.ok(&["delete", "pod", "prestop", "--wait", "--timeout=60s"])?;
    println!(
        "prestop: deletion took {:?} (preStop sleeps 2 s, grace 10 s)",
        started.elapsed()
    );
    let lines = container_log(root, "prestop", &uid)?;
    let at = |text: &str| {
        lines
            .iter()
            .find(|(_, l)| l == text)
            .and_then(|(t, _)| day_seconds(t))
    };
    let (Some(hook), Some(term)) = (at("prestop"), at("TERM")) else {
        anyhow::bail!("prestop log lacks the hook or SIGTERM: {lines:?}");
    };
    ensure!(
        term - hook >= 1.9 && term - hook < 10.0,
        "SIGTERM {:.1}s after the preStop hook began: {lines:?}",
        term - hook
    );
    Ok(())
}
