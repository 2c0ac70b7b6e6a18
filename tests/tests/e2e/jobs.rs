//! Jobs and CronJobs seen through kubectl: a Job runs its completions within its parallelism
//! and completes (`kubectl wait --for=condition=Complete`), an Indexed Job's pods carry
//! indexes 0..n-1, failed pods exhaust backoffLimit, deadlines, suspend and TTLs act as
//! upstream, and a CronJob creates its Jobs on schedule (and by `kubectl create job --from`).
//! Pods run on `flotilla simulate-nodes`, which marks Job pods Succeeded at once; failures
//! are written by the test on pods no node can take.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, ensure};
use flotilla_e2e::{Backend, Flotilla, Kubectl, jsonpath, until};

/// A Job of `busybox` pods with `extra` spec lines (two-space indented under `spec:`).
fn job(name: &str, extra: &str, pod_extra: &str) -> String {
    format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata: {{name: {name}}}\nspec:\n{extra}  template:\n    spec:\n      restartPolicy: Never\n{pod_extra}      containers: [{{name: c, image: busybox}}]\n"
    )
}

/// Pod lines that keep a pod Pending forever: no node matches.
const NOWHERE: &str = "      nodeSelector: {zone: mars}\n";

/// Names of the pods of Job `name`.
fn pods_of(kubectl: &Kubectl, name: &str) -> anyhow::Result<Vec<String>> {
    let selector = format!("batch.kubernetes.io/job-name={name}");
    Ok(jsonpath(
        kubectl,
        &["get", "pods", "-l", &selector],
        "{.items[*].metadata.name}",
    )?
    .split_whitespace()
    .map(str::to_string)
    .collect())
}

/// Reasons of the events about `kind/name`.
fn event_reasons(kubectl: &Kubectl, kind: &str, name: &str) -> anyhow::Result<String> {
    let selector = format!("involvedObject.kind={kind},involvedObject.name={name}");
    jsonpath(
        kubectl,
        &["get", "events", "--field-selector", &selector],
        "{.items[*].reason}",
    )
}

/// Marks pod `name` Failed, as a kubelet would.
fn fail_pod(kubectl: &Kubectl, name: &str) -> anyhow::Result<()> {
    kubectl.ok(&[
        "patch",
        "pod",
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Failed","conditions":[{"type":"Ready","status":"False"}]}}"#,
    ])?;
    Ok(())
}

/// `flotilla simulate-nodes` against `f`'s cluster, killed on drop.
struct Simulator(Child);

impl Simulator {
    fn start(f: &Flotilla, count: usize) -> anyhow::Result<Self> {
        let kubectl = f.kubectl();
        let kubeconfig = kubectl.kubeconfig.to_str().context("kubeconfig path")?;
        let child = Command::new(flotilla_e2e::flotilla_bin()?)
            .args([
                "simulate-nodes",
                "--kubeconfig",
                kubeconfig,
                "--count",
                &count.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let simulator = Simulator(child);
        until(
            "the simulated nodes are Ready",
            Duration::from_secs(20),
            || {
                Ok(kubectl
                    .ok(&["get", "nodes", "--no-headers"])?
                    .matches(" Ready ")
                    .count()
                    >= count)
            },
        )?;
        Ok(simulator)
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn jobs_complete_within_their_parallelism() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    let _simulator = Simulator::start(&f, 2)?;

    // NonIndexed: five completions, two at a time.
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &job("five", "  completions: 5\n  parallelism: 2\n", ""),
    )?;
    let mut most_active = 0;
    until("job five completes", Duration::from_secs(60), || {
        let phases = jsonpath(
            &kubectl,
            &["get", "pods", "-l", "batch.kubernetes.io/job-name=five"],
            "{range .items[*]}{.status.phase}{\"/\"}{.metadata.deletionTimestamp}{\"\\n\"}{end}",
        )?;
        let running = phases
            .lines()
            .filter(|l| !l.starts_with("Succeeded") && !l.starts_with("Failed") && l.ends_with('/'))
            .count();
        let active: usize = jsonpath(&kubectl, &["get", "job", "five"], "{.status.active}")?
            .parse()
            .unwrap_or(0);
        most_active = most_active.max(running).max(active);
        let conditions = jsonpath(
            &kubectl,
            &["get", "job", "five"],
            "{.status.conditions[*].type}",
        )?;
        Ok(conditions.contains("Complete"))
    })?;
    ensure!(most_active <= 2, "{most_active} pods were active at once");
    kubectl.ok(&[
        "wait",
        "--for=condition=Complete",
        "job/five",
        "--timeout=30s",
    ])?;
    let status = jsonpath(
        &kubectl,
        &["get", "job", "five"],
        "{.status.succeeded} {.status.failed} {.status.active} {.status.conditions[*].type}",
    )?;
    ensure!(
        status == "5 0 0 SuccessCriteriaMet Complete",
        "unexpected status: {status}"
    );
    ensure!(
        !jsonpath(
            &kubectl,
            &["get", "job", "five"],
            "{.status.completionTime}"
        )?
        .is_empty(),
        "no completionTime"
    );
    ensure!(pods_of(&kubectl, "five")?.len() == 5, "not five pods");
    let finalizers = jsonpath(
        &kubectl,
        &["get", "pods", "-l", "batch.kubernetes.io/job-name=five"],
        "{.items[*].metadata.finalizers}",
    )?;
    ensure!(
        !finalizers.contains("job-tracking"),
        "pods still tracked: {finalizers}"
    );
    let reasons = event_reasons(&kubectl, "Job", "five")?;
    for reason in ["SuccessfulCreate", "Completed"] {
        ensure!(reasons.contains(reason), "no {reason} event in {reasons}");
    }
    let table = kubectl.ok(&["get", "job", "five"])?;
    ensure!(
        table.contains("Complete") && table.contains("5/5"),
        "{table}"
    );

    // Indexed: one pod per index 0..2, each with its index and hostname.
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &job(
            "indexed",
            "  completions: 3\n  parallelism: 3\n  completionMode: Indexed\n",
            "",
        ),
    )?;
    kubectl.ok(&[
        "wait",
        "--for=condition=Complete",
        "job/indexed",
        "--timeout=60s",
    ])?;
    let selector = "batch.kubernetes.io/job-name=indexed";
    let indexes = jsonpath(
        &kubectl,
        &["get", "pods", "-l", selector],
        "{range .items[*]}{.metadata.annotations.batch\\.kubernetes\\.io/job-completion-index}{\" \"}{.metadata.labels.batch\\.kubernetes\\.io/job-completion-index}{\" \"}{.spec.hostname}{\"\\n\"}{end}",
    )?;
    let mut lines: Vec<&str> = indexes.lines().collect();
    lines.sort();
    ensure!(
        lines == ["0 0 indexed-0", "1 1 indexed-1", "2 2 indexed-2"],
        "unexpected indexes: {indexes}"
    );
    let completed = jsonpath(
        &kubectl,
        &["get", "job", "indexed"],
        "{.status.completedIndexes}",
    )?;
    ensure!(completed == "0-2", "completedIndexes {completed}");
    Ok(())
}

#[test]
fn failures_deadlines_suspend_and_ttl() -> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();

    // backoffLimit 1: the second failure fails the Job, after the 10 s pod backoff.
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &job("flaky", "  backoffLimit: 1\n", NOWHERE),
    )?;
    let mut failed: Vec<String> = Vec::new();
    for attempt in 1..=2 {
        let mut fresh = None;
        until(
            &format!("attempt {attempt} has a pod"),
            Duration::from_secs(30),
            || {
                fresh = pods_of(&kubectl, "flaky")?
                    .into_iter()
                    .find(|p| !failed.contains(p));
                Ok(fresh.is_some())
            },
        )?;
        let pod = fresh.context("pod")?;
        fail_pod(&kubectl, &pod)?;
        failed.push(pod);
    }
    kubectl.ok(&[
        "wait",
        "--for=condition=Failed",
        "job/flaky",
        "--timeout=30s",
    ])?;
    let status = jsonpath(
        &kubectl,
        &["get", "job", "flaky"],
        "{.status.failed} {.status.conditions[?(@.type==\"Failed\")].reason} {.status.conditions[*].type}",
    )?;
    ensure!(
        status == "2 BackoffLimitExceeded FailureTarget Failed",
        "unexpected status: {status}"
    );
    ensure!(
        pods_of(&kubectl, "flaky")?.len() == 2,
        "a third pod was created"
    );
    let reasons = event_reasons(&kubectl, "Job", "flaky")?;
    ensure!(
        reasons.contains("BackoffLimitExceeded"),
        "events: {reasons}"
    );

    // activeDeadlineSeconds: the pending pod is deleted and the Job fails.
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &job("slow", "  activeDeadlineSeconds: 2\n", NOWHERE),
    )?;
    kubectl.ok(&[
        "wait",
        "--for=condition=Failed",
        "job/slow",
        "--timeout=30s",
    ])?;
    let reason = jsonpath(
        &kubectl,
        &["get", "job", "slow"],
        "{.status.conditions[?(@.type==\"Failed\")].reason}",
    )?;
    ensure!(reason == "DeadlineExceeded", "reason {reason}");
    until("slow's pod is gone", Duration::from_secs(20), || {
        Ok(pods_of(&kubectl, "slow")?.is_empty())
    })?;

    // suspend: no pods while suspended; resuming starts them.
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &job(
            "paused",
            "  suspend: true\n  parallelism: 2\n  completions: 2\n",
            NOWHERE,
        ),
    )?;
    kubectl.ok(&[
        "wait",
        "--for=condition=Suspended",
        "job/paused",
        "--timeout=30s",
    ])?;
    ensure!(
        pods_of(&kubectl, "paused")?.is_empty(),
        "a suspended job has pods"
    );
    kubectl.ok(&[
        "patch",
        "job",
        "paused",
        "--type=merge",
        "-p",
        r#"{"spec":{"suspend":false}}"#,
    ])?;
    kubectl.ok(&[
        "wait",
        "--for=condition=Suspended=False",
        "job/paused",
        "--timeout=30s",
    ])?;
    until("paused's pods start", Duration::from_secs(20), || {
        Ok(pods_of(&kubectl, "paused")?.len() == 2)
    })?;

    // ttlSecondsAfterFinished: the finished Job goes, and its pods with it.
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        &job(
            "brief",
            "  backoffLimit: 0\n  ttlSecondsAfterFinished: 1\n",
            NOWHERE,
        ),
    )?;
    let mut pod = None;
    until("brief has a pod", Duration::from_secs(30), || {
        pod = pods_of(&kubectl, "brief")?.into_iter().next();
        Ok(pod.is_some())
    })?;
    fail_pod(&kubectl, &pod.context("pod")?)?;
    until(
        "brief is deleted after its TTL",
        Duration::from_secs(30),
        || Ok(kubectl.fails(&["get", "job", "brief"]).is_ok()),
    )?;
    Ok(())
}

/// Sleeps past the next minute boundary when one is less than 15 s away, so that a Job
/// started now does not share its (whole-second) startTime with a scheduled one: upstream's
/// history cleanup then breaks the tie by name and could delete the scheduled Job.
fn keep_clear_of_the_minute_boundary() -> anyhow::Result<()> {
    let second_of_minute = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() % 60;
    if second_of_minute >= 45 {
        std::thread::sleep(Duration::from_secs(62 - second_of_minute));
    }
    Ok(())
}

#[test]
fn cronjobs_create_jobs_on_schedule() -> anyhow::Result<()> {
    keep_clear_of_the_minute_boundary()?;
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    let _simulator = Simulator::start(&f, 1)?;
    kubectl.ok_stdin(
        &["apply", "-f", "-"],
        "apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: tick}\nspec:\n  schedule: \"*/1 * * * *\"\n  successfulJobsHistoryLimit: 1\n  jobTemplate:\n    metadata: {labels: {app: tick}}\n    spec:\n      template:\n        spec:\n          restartPolicy: Never\n          containers: [{name: c, image: busybox}]\n",
    )?;

    // The manual path: kubectl builds the Job from the template; the Job controller runs it.
    kubectl.ok(&["create", "job", "tick-manual", "--from=cronjob/tick"])?;
    kubectl.ok(&[
        "wait",
        "--for=condition=Complete",
        "job/tick-manual",
        "--timeout=30s",
    ])?;

    // The schedule: a Job named after its minute appears within ~70 s.
    let mut scheduled = String::new();
    until(
        "the cronjob schedules a job",
        Duration::from_secs(75),
        || {
            scheduled = jsonpath(
            &kubectl,
            &["get", "jobs", "-l", "app=tick"],
            "{range .items[*]}{.metadata.name}{\" \"}{.metadata.annotations.batch\\.kubernetes\\.io/cronjob-scheduled-timestamp}{\"\\n\"}{end}",
        )?
        .lines()
        // The newest: under load the schedule may have fired twice already, and the
        // history limit then deletes the older one.
        .filter(|l| !l.starts_with("tick-manual"))
        .max()
        .unwrap_or("")
        .to_string();
            Ok(!scheduled.is_empty())
        },
    )?;
    let (name, timestamp) = scheduled.split_once(' ').context("name and timestamp")?;
    let at: k8s_openapi::jiff::Timestamp = timestamp
        .parse()
        .with_context(|| format!("scheduled timestamp {timestamp:?}"))?;
    ensure!(
        name == format!("tick-{}", at.as_second() / 60),
        "job {name} is not named after its time {timestamp}"
    );
    ensure!(
        timestamp.ends_with('Z') && timestamp.contains(":00Z"),
        "{timestamp}"
    );
    let owner = jsonpath(
        &kubectl,
        &["get", "job", name],
        "{.metadata.ownerReferences[0].kind}",
    )?;
    ensure!(owner == "CronJob", "owner {owner}");
    kubectl.ok(&[
        "wait",
        "--for=condition=Complete",
        &format!("job/{name}"),
        "--timeout=30s",
    ])?;

    // Status follows: the last schedule and success are recorded, the active list empties,
    // and only the newest successful Job is kept.
    let mut last = String::new();
    let caught_up = until(
        "the cronjob's status catches up",
        Duration::from_secs(30),
        || {
            last = jsonpath(
                &kubectl,
                &["get", "cronjob", "tick"],
                "{.status.lastScheduleTime}|{.status.lastSuccessfulTime}|{.status.active[*].name}",
            )?;
            let parts: Vec<&str> = last.split('|').collect();
            let scheduled_since = parts[0]
                .parse::<k8s_openapi::jiff::Timestamp>()
                .is_ok_and(|t| t >= at);
            Ok(parts.len() == 3
                && scheduled_since
                && !parts[1].is_empty()
                && !parts[2].contains(name))
        },
    );
    caught_up.with_context(|| format!("cronjob status: {last}"))?;
    until(
        "the older successful job is deleted",
        Duration::from_secs(30),
        || Ok(kubectl.fails(&["get", "job", "tick-manual"]).is_ok()),
    )?;
    let reasons = event_reasons(&kubectl, "CronJob", "tick")?;
    for reason in ["SuccessfulCreate", "SawCompletedJob", "SuccessfulDelete"] {
        ensure!(reasons.contains(reason), "no {reason} event in {reasons}");
    }
    Ok(())
}
