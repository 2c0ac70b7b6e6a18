//! Streaming through the API server to the real kubelet (`node-image/kubelet` `server`,
//! `streaming`; the apiserver's `kubelet` module) with stock kubectl 1.32 on a node in its own
//! network namespace: `kubectl logs` (`--tail`, `--timestamps`, `-f` seeing new lines,
//! `--previous` after a crash, upstream's errors), `kubectl exec` (the pod's hostname, a
//! non-zero exit code, stdin to its end, `-it` with a TTY sized by kubectl), `kubectl attach`,
//! `kubectl port-forward` to busybox httpd, and a `view`-bound ServiceAccount refused exec
//! with upstream's 403.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use flotilla_e2e::nodes::SingleNode;
use flotilla_e2e::{Flotilla, Kubectl, jsonpath, kubectl_bin, until};

const NODE: &str = "streaming-e2e";
const POD_CIDR: &str = "10.244.78.0/24";

const PODS: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: ticker}
spec:
  nodeName: streaming-e2e
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    command: [sh, -c, "echo line-1; echo line-2; echo oops >&2; i=0; while true; do i=$((i+1)); echo tick-$i; sleep 1; done"]
---
apiVersion: v1
kind: Pod
metadata: {name: crash}
spec:
  nodeName: streaming-e2e
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    command: [sh, -c, "echo bye-from-a-crash; exit 1"]
---
apiVersion: v1
kind: Pod
metadata: {name: two}
spec:
  nodeName: streaming-e2e
  terminationGracePeriodSeconds: 1
  containers:
  - {name: a, image: flotilla.local/busybox:1, imagePullPolicy: Never, command: [sleep, "3600"]}
  - {name: b, image: flotilla.local/busybox:1, imagePullPolicy: Never, command: [sleep, "3600"]}
---
apiVersion: v1
kind: Pod
metadata: {name: noimage}
spec:
  nodeName: streaming-e2e
  containers:
  - {name: main, image: flotilla.local/absent:1, imagePullPolicy: Never}
---
apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  nodeName: streaming-e2e
  terminationGracePeriodSeconds: 1
  containers:
  - name: httpd
    image: flotilla.local/busybox:1
    imagePullPolicy: Never
    command: [sh, -c, "mkdir -p /www && echo hello-through-port-forward > /www/index.html && exec httpd -f -p 8080 -h /www"]
"#;

#[test]
fn logs_exec_and_port_forward_through_the_api_server() -> anyhow::Result<()> {
    let node = SingleNode::start(NODE, POD_CIDR, &[])?;
    let (flotilla, kubectl, dir) = (&node.flotilla, node.flotilla.kubectl(), node.dir.path());
    let outcome = node
        .wait_ready(NODE)
        .and_then(|()| scenario(flotilla, &kubectl, dir));
    outcome.with_context(|| format!("kubelet log:\n{}", node.kubelet.log()))
}

fn running(kubectl: &Kubectl, pod: &str) -> anyhow::Result<()> {
    until(
        &format!("{pod} is Running"),
        Duration::from_secs(60),
        || Ok(jsonpath(kubectl, &["get", "pod", pod], "{.status.phase}")? == "Running"),
    )
}

fn scenario(flotilla: &Flotilla, kubectl: &Kubectl, dir: &Path) -> anyhow::Result<()> {
    let port = jsonpath(
        kubectl,
        &["get", "node", NODE],
        "{.status.daemonEndpoints.kubeletEndpoint.Port}",
    )?;
    ensure!(port == "10250", "kubelet port {port:?}");
    flotilla.ok_stdin(&["apply", "-f", "-"], PODS)?;
    for pod in ["ticker", "two", "web"] {
        running(kubectl, pod)?;
    }
    logs(kubectl)?;
    exec(kubectl)?;
    refused(kubectl)?;
    port_forward(kubectl, dir)?;
    Ok(())
}

fn logs(kubectl: &Kubectl) -> anyhow::Result<()> {
    until("ticker has ticked", Duration::from_secs(30), || {
        Ok(kubectl.ok(&["logs", "ticker"])?.contains("tick-3"))
    })?;
    // Both streams, each in order (containerd reads stdout and stderr separately, so how
    // they interleave is not fixed).
    let all = kubectl.ok(&["logs", "ticker"])?;
    let stdout: Vec<&str> = all.lines().filter(|l| *l != "oops").take(3).collect();
    ensure!(
        all.lines().any(|l| l == "oops") && stdout == ["line-1", "line-2", "tick-1"],
        "kubectl logs: {all:?}"
    );
    let tail = kubectl.ok(&["logs", "ticker", "--tail=1"])?;
    ensure!(
        tail.lines().count() == 1 && tail.starts_with("tick-"),
        "--tail=1: {tail:?}"
    );
    let stamped = kubectl.ok(&["logs", "ticker", "--timestamps", "--tail=2"])?;
    for line in stamped.lines() {
        let (time, text) = line.split_once(' ').context("a timestamp")?;
        ensure!(
            time.len() == "2026-01-01T00:00:00.000000000Z".len()
                && time.as_bytes()[10] == b'T'
                && time.ends_with('Z')
                && (text.starts_with("tick-") || text == "oops"),
            "--timestamps: {stamped:?}"
        );
    }
    let limited = kubectl.ok(&["logs", "ticker", "--tail=1", "--limit-bytes=4"])?;
    ensure!(limited == "tick", "--limit-bytes=4: {limited:?}");

    // -f sees lines written after it started.
    let last = tick_number(&kubectl.ok(&["logs", "ticker", "--tail=1"])?)?;
    let mut follow = Command::new(kubectl_bin()?)
        .arg("--kubeconfig")
        .arg(&kubectl.kubeconfig)
        .args(["logs", "-f", "ticker", "--tail=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdout = follow.stdout.take().context("stdout")?;
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    let mut newer = false;
    while Instant::now() < deadline && !newer {
        if let Ok(line) = receiver.recv_timeout(Duration::from_millis(500)) {
            newer = tick_number(&line).is_ok_and(|n| n >= last + 2);
            seen.push(line);
        }
    }
    let _ = follow.kill();
    let _ = follow.wait();
    ensure!(
        newer,
        "kubectl logs -f after tick-{last} printed only {seen:?}"
    );

    // --previous reads the log of the container that ran before.
    until("crash has restarted", Duration::from_secs(60), || {
        Ok(jsonpath(
            kubectl,
            &["get", "pod", "crash"],
            "{.status.containerStatuses[0].restartCount}",
        )?
        .parse::<u32>()
        .unwrap_or(0)
            >= 1)
    })?;
    let previous = kubectl.ok(&["logs", "crash", "--previous"])?;
    ensure!(previous == "bye-from-a-crash\n", "--previous: {previous:?}");
    let never = kubectl.fails(&["logs", "ticker", "--previous"])?;
    ensure!(
        never.contains("previous terminated container \"main\" in pod \"ticker\" not found"),
        "--previous without a restart: {never}"
    );

    // Upstream's errors (kubectl itself defaults to the first container, so ask directly).
    let choose = kubectl.fails(&["get", "--raw", "/api/v1/namespaces/default/pods/two/log"])?;
    ensure!(
        choose.contains("a container name must be specified for pod two, choose one of: [a b]"),
        "{choose}"
    );
    let b = kubectl.ok(&["logs", "two", "-c", "b"])?;
    ensure!(b.is_empty(), "logs of b: {b:?}");
    until("noimage is waiting", Duration::from_secs(30), || {
        Ok(jsonpath(
            kubectl,
            &["get", "pod", "noimage"],
            "{.status.containerStatuses[0].state.waiting.reason}",
        )? == "ErrImageNeverPull")
    })?;
    let waiting = kubectl.fails(&["logs", "noimage"])?;
    ensure!(
        waiting.contains(
            "container \"main\" in pod \"noimage\" is waiting to start: ErrImageNeverPull"
        ),
        "{waiting}"
    );
    Ok(())
}

fn tick_number(line: &str) -> anyhow::Result<u64> {
    line.trim()
        .strip_prefix("tick-")
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("not a tick line: {line:?}"))
}

fn exec(kubectl: &Kubectl) -> anyhow::Result<()> {
    let hostname = kubectl.ok(&["exec", "ticker", "--", "cat", "/etc/hostname"])?;
    ensure!(hostname.trim() == "ticker", "hostname {hostname:?}");
    let two = kubectl.ok(&[
        "exec",
        "two",
        "-c",
        "b",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2",
    ])?;
    ensure!(two == "out\n", "stdout of exec: {two:?}");
    let failed = kubectl.fails(&["exec", "ticker", "--", "sh", "-c", "exit 3"])?;
    ensure!(
        failed.contains("command terminated with exit code 3"),
        "exit code: {failed}"
    );
    let echoed = kubectl.run(
        &[
            "exec",
            "-i",
            "ticker",
            "--",
            "sh",
            "-c",
            "read line; echo got-$line",
        ],
        Some("hello\n"),
        &[],
    )?;
    let stdout = String::from_utf8_lossy(&echoed.stdout);
    ensure!(
        stdout == "got-hello\n",
        "exec -i: {stdout:?} {}",
        String::from_utf8_lossy(&echoed.stderr)
    );
    // The end of stdin reaches the command: cat ends, and its exit code comes back.
    let cat = kubectl.run(
        &["exec", "-i", "ticker", "--", "sh", "-c", "cat; exit 5"],
        Some("a\nb\n"),
        &[],
    )?;
    let (out, err) = (
        String::from_utf8_lossy(&cat.stdout),
        String::from_utf8_lossy(&cat.stderr),
    );
    ensure!(
        out == "a\nb\n" && err.contains("command terminated with exit code 5"),
        "exec -i cat: {out:?} {err}"
    );

    // -it: a TTY in the container, sized by kubectl's resize message (`script` gives kubectl
    // a terminal of 31 rows and 97 columns).
    let inside = format!(
        "stty cols 97 rows 31; {} --kubeconfig {} exec -it ticker -- sh -c 'sleep 1; stty size; tty'",
        kubectl_bin()?.display(),
        kubectl.kubeconfig.display()
    );
    let tty = Command::new("script")
        .args(["-qec", &inside, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .context("running kubectl under script(1) for a terminal")?;
    let shown = String::from_utf8_lossy(&tty.stdout);
    ensure!(
        tty.status.success() && shown.contains("31 97") && shown.contains("/dev/pts/"),
        "exec -it: {shown:?}"
    );

    // attach: the container's own output from now on.
    let mut attach = Command::new(kubectl_bin()?)
        .arg("--kubeconfig")
        .arg(&kubectl.kubeconfig)
        .args(["attach", "ticker"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = attach.stdout.take().context("stdout")?;
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let _ = sender.send(lines.next());
    });
    let first = receiver.recv_timeout(Duration::from_secs(20));
    let _ = attach.kill();
    let _ = attach.wait();
    let first = first
        .ok()
        .flatten()
        .transpose()?
        .context("kubectl attach printed nothing")?;
    ensure!(first.starts_with("tick-"), "attach: {first:?}");
    Ok(())
}

fn port_forward(kubectl: &Kubectl, _dir: &Path) -> anyhow::Result<()> {
    let mut forward = Command::new(kubectl_bin()?)
        .arg("--kubeconfig")
        .arg(&kubectl.kubeconfig)
        .args(["port-forward", "pod/web", ":8080"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let stdout = forward.stdout.take().context("stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let outcome = (|| -> anyhow::Result<()> {
        // "Forwarding from 127.0.0.1:PORT -> 8080"
        let first = lines.next().context("port-forward printed nothing")??;
        let local = first
            .strip_prefix("Forwarding from ")
            .and_then(|rest| rest.split(" -> ").next())
            .with_context(|| format!("port-forward said {first:?}"))?
            .to_string();
        let mut stream = std::net::TcpStream::connect(&local)?;
        stream.set_read_timeout(Some(Duration::from_secs(20)))?;
        stream.write_all(b"GET /index.html HTTP/1.0\r\nHost: web\r\n\r\n")?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer)?;
        ensure!(
            answer.starts_with("HTTP/1.") && answer.contains("hello-through-port-forward"),
            "through the forwarded port: {answer:?}"
        );
        Ok(())
    })();
    let _ = forward.kill();
    let mut stderr = String::new();
    if let Some(mut err) = forward.stderr.take() {
        let _ = err.read_to_string(&mut stderr);
    }
    let _ = forward.wait();
    outcome.with_context(|| format!("kubectl port-forward stderr: {stderr}"))
}

fn refused(kubectl: &Kubectl) -> anyhow::Result<()> {
    kubectl.ok(&["create", "serviceaccount", "viewer"])?;
    kubectl.ok(&[
        "create",
        "clusterrolebinding",
        "viewer-view",
        "--clusterrole=view",
        "--serviceaccount=default:viewer",
    ])?;
    let token = kubectl.ok(&["create", "token", "viewer"])?;
    let viewer = kubectl.with_token(token.trim())?;
    // The binding takes effect within the policy cache's second.
    until("the viewer can read logs", Duration::from_secs(10), || {
        Ok(viewer.ok(&["logs", "ticker", "--tail=1"]).is_ok())
    })?;
    let refused = viewer.fails(&["exec", "ticker", "--", "cat", "/etc/hostname"])?;
    ensure!(
        refused.contains(
            "pods \"ticker\" is forbidden: User \"system:serviceaccount:default:viewer\" cannot create resource \"pods/exec\" in API group \"\" in the namespace \"default\""
        ),
        "{refused}"
    );
    Ok(())
}
