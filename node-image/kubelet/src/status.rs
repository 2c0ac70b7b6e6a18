//! Pod status from what the runtime shows, as pure functions (upstream `kubelet_pods.go`
//! `generateAPIPodStatus`, `getPhase`, `convertToAPIContainerStatuses` and the status
//! manager's condition rules), and the crash-loop back-off and restart policy decisions
//! (`pkg/kubelet/kuberuntime` `doBackOff`, `ShouldContainerBeRestarted`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, Pod, PodCondition, PodIP, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// One container as the runtime reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeContainer {
    /// The CRI container ID.
    pub id: String,
    /// Created (not started yet), running, exited or unknown.
    pub state: RuntimeState,
    /// The restart count it was created with.
    pub restart_count: i32,
    /// Start time (ns since the epoch; 0 when not started).
    pub started_at: i64,
    /// Finish time (ns since the epoch; 0 when not finished).
    pub finished_at: i64,
    /// Exit code, when exited.
    pub exit_code: i32,
    /// The runtime's reason (`Completed`, `Error`, `OOMKilled`).
    pub reason: String,
    /// The runtime's message.
    pub message: String,
    /// The image's ID (`imageID` in the status).
    pub image_ref: String,
}

/// A runtime container's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeState {
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Exited.
    Exited,
    /// The runtime does not know.
    Unknown,
}

/// One container of the pod spec, with what the runtime and the kubelet know about it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerView {
    /// The container's name.
    pub name: String,
    /// The image the spec names.
    pub image: String,
    /// The newest runtime container of this name.
    pub current: Option<RuntimeContainer>,
    /// The one before it (the status's `lastState`).
    pub previous: Option<RuntimeContainer>,
    /// Why the kubelet holds the container back (reason, message): image, config and
    /// create errors, crash-loop back-off. Shown instead of `current`'s state.
    pub waiting: Option<(String, String)>,
    /// What the probes say of a running `current`: (started, ready); `None` reports a
    /// running container started and ready (no probes).
    pub probed: Option<(bool, bool)>,
}

fn time(ns: i64) -> Option<Time> {
    (ns > 0)
        .then(|| Timestamp::from_nanosecond(i128::from(ns)).ok())
        .flatten()
        .map(Time)
}

fn terminated(c: &RuntimeContainer) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: c.exit_code,
            reason: (!c.reason.is_empty()).then(|| c.reason.clone()),
            message: (!c.message.is_empty()).then(|| c.message.clone()),
            started_at: time(c.started_at),
            finished_at: time(c.finished_at),
            container_id: Some(format!("containerd://{}", c.id)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn waiting(reason: &str, message: Option<&str>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_string()),
            message: message.filter(|m| !m.is_empty()).map(str::to_string),
        }),
        ..Default::default()
    }
}

/// The API status of one container (upstream `convertToAPIContainerStatuses`): the
/// kubelet's waiting reason wins; a container held back after exiting shows that exit as
/// `lastState`, otherwise `lastState` is the previous container's exit.
#[cfg(test)]
pub fn container_status(view: &ContainerView) -> ContainerStatus {
    container_status_with(view, "ContainerCreating")
}

/// [`container_status`] with the waiting reason of a container that has none yet
/// (`PodInitializing` in pods with init containers, as upstream).
pub fn container_status_with(view: &ContainerView, default_reason: &str) -> ContainerStatus {
    let current = view.current.as_ref();
    let last_exit = |c: Option<&RuntimeContainer>| {
        c.filter(|c| c.state == RuntimeState::Exited)
            .map(terminated)
    };
    let (state, last_state) = match (&view.waiting, current) {
        (Some((reason, message)), Some(c)) if c.state == RuntimeState::Exited => {
            (waiting(reason, Some(message)), Some(terminated(c)))
        }
        (Some((reason, message)), _) => (
            waiting(reason, Some(message)),
            last_exit(view.previous.as_ref()),
        ),
        (None, None) => (waiting(default_reason, None), None),
        (None, Some(c)) => {
            let state = match c.state {
                RuntimeState::Running => ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: time(c.started_at),
                    }),
                    ..Default::default()
                },
                RuntimeState::Exited => terminated(c),
                RuntimeState::Created | RuntimeState::Unknown => waiting(default_reason, None),
            };
            (state, last_exit(view.previous.as_ref()))
        }
    };
    let running = state.running.is_some();
    let (started, ready) = match view.probed {
        Some((started, ready)) if running => (started, started && ready),
        _ => (running, running),
    };
    ContainerStatus {
        name: view.name.clone(),
        image: view.image.clone(),
        image_id: current.map(|c| c.image_ref.clone()).unwrap_or_default(),
        container_id: current.map(|c| format!("containerd://{}", c.id)),
        restart_count: current.map_or(0, |c| c.restart_count),
        ready,
        started: Some(started),
        state: Some(state),
        last_state: last_state.map(|s| ContainerState { ..s }),
        ..Default::default()
    }
}

fn status_of<'a>(statuses: &'a [ContainerStatus], name: &str) -> Option<&'a ContainerStatus> {
    statuses.iter().find(|s| s.name == name)
}

fn state_of(status: &ContainerStatus) -> ContainerState {
    status.state.clone().unwrap_or_default()
}

fn last_terminated(status: &ContainerStatus) -> Option<&ContainerStateTerminated> {
    status
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
}

/// Whether init container `c` keeps running beside the app (a sidecar).
pub fn is_restartable_init(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// Upstream `HasAnyRegularContainerStarted`.
pub fn any_regular_started(spec: &PodSpec, statuses: &[ContainerStatus]) -> bool {
    spec.containers.iter().any(|c| {
        status_of(statuses, &c.name).is_some_and(|s| {
            let state = state_of(s);
            state.running.is_some() || state.terminated.is_some()
        })
    })
}

/// Upstream `getPhase` (for a pod not yet known to be terminal): init containers pending
/// or failed under restartPolicy Never, then the app containers' states.
pub fn phase(
    spec: &PodSpec,
    init_statuses: &[ContainerStatus],
    statuses: &[ContainerStatus],
) -> &'static str {
    let restart_policy = spec.restart_policy.as_deref().unwrap_or("Always");
    let init = spec.init_containers.as_deref().unwrap_or_default();
    let (mut pending_init, mut failed_init) = (0, 0);
    let (mut unknown, mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    for container in init {
        let Some(status) = status_of(init_statuses, &container.name) else {
            pending_init += 1;
            if is_restartable_init(container) {
                unknown += 1;
            }
            continue;
        };
        let state = state_of(status);
        if is_restartable_init(container) {
            if state.running.is_some() {
                if status.started != Some(true) {
                    pending_init += 1;
                }
                running += 1;
            } else if state.terminated.is_none() && last_terminated(status).is_none() {
                pending_init += 1;
                waiting += 1;
            }
            continue;
        }
        if state.running.is_some() {
            pending_init += 1;
        } else if let Some(t) = &state.terminated {
            if t.exit_code != 0 {
                failed_init += 1;
            }
        } else if let Some(t) = last_terminated(status) {
            if t.exit_code != 0 {
                failed_init += 1;
            }
        } else {
            pending_init += 1;
        }
    }
    for container in &spec.containers {
        let Some(status) = status_of(statuses, &container.name) else {
            unknown += 1;
            continue;
        };
        let state = state_of(status);
        if state.running.is_some() {
            running += 1;
        } else if let Some(t) = &state.terminated {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if last_terminated(status).is_some() {
            stopped += 1;
        } else {
            waiting += 1;
        }
    }
    if failed_init > 0 && restart_policy == "Never" {
        return "Failed";
    }
    if (pending_init > 0 && !any_regular_started(spec, statuses)) || waiting > 0 {
        return "Pending";
    }
    if running > 0 && unknown == 0 {
        return "Running";
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        return match restart_policy {
            "Always" => "Running",
            _ if stopped == succeeded => "Succeeded",
            "Never" => "Failed",
            _ => "Running",
        };
    }
    "Pending"
}

fn condition(
    old: &[PodCondition],
    kind: &str,
    ok: bool,
    reason: Option<&str>,
    message: Option<String>,
    now: &Time,
) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    // A condition keeps its transition time while its status stays.
    let since = old
        .iter()
        .find(|c| c.type_ == kind && c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    PodCondition {
        type_: kind.to_string(),
        status: status.to_string(),
        reason: reason.map(str::to_string),
        message,
        last_transition_time: Some(since),
        ..Default::default()
    }
}

/// Upstream `GeneratePodInitializedCondition`: (status, reason, message).
fn initialized(
    spec: &PodSpec,
    init_statuses: &[ContainerStatus],
    statuses: &[ContainerStatus],
    phase: &str,
) -> (bool, Option<&'static str>, Option<String>) {
    let (mut unknown, mut incomplete) = (Vec::new(), Vec::new());
    for container in spec.init_containers.iter().flatten() {
        let Some(status) = status_of(init_statuses, &container.name) else {
            unknown.push(container.name.as_str());
            continue;
        };
        let done = if is_restartable_init(container) {
            status.started == Some(true)
        } else {
            state_of(status)
                .terminated
                .is_some_and(|t| t.exit_code == 0)
        };
        if !done {
            incomplete.push(container.name.as_str());
        }
    }
    if phase == "Succeeded" && unknown.is_empty() {
        return (true, Some("PodCompleted"), None);
    }
    if any_regular_started(spec, statuses) {
        return (true, None, None);
    }
    let mut messages = Vec::new();
    if !unknown.is_empty() {
        messages.push(format!(
            "containers with unknown status: [{}]",
            unknown.join(" ")
        ));
    }
    if !incomplete.is_empty() {
        messages.push(format!(
            "containers with incomplete status: [{}]",
            incomplete.join(" ")
        ));
    }
    if messages.is_empty() {
        (true, None, None)
    } else {
        (
            false,
            Some("ContainersNotInitialized"),
            Some(messages.join(", ")),
        )
    }
}

/// Upstream `GenerateContainersReadyCondition` (sidecars count too): (status, reason,
/// message).
fn containers_ready(
    spec: &PodSpec,
    init_statuses: &[ContainerStatus],
    statuses: &[ContainerStatus],
    phase: &str,
) -> (bool, Option<&'static str>, Option<String>) {
    let (mut unknown, mut unready) = (Vec::new(), Vec::new());
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| is_restartable_init(c))
        .map(|c| (c, init_statuses));
    let apps = spec.containers.iter().map(|c| (c, statuses));
    for (container, list) in sidecars.chain(apps) {
        match status_of(list, &container.name) {
            None => unknown.push(container.name.as_str()),
            Some(s) if !s.ready => unready.push(container.name.as_str()),
            Some(_) => {}
        }
    }
    if phase == "Succeeded" && unknown.is_empty() {
        return (false, Some("PodCompleted"), None);
    }
    if phase == "Failed" {
        return (false, Some("PodFailed"), None);
    }
    let mut messages = Vec::new();
    if !unknown.is_empty() {
        messages.push(format!(
            "containers with unknown status: [{}]",
            unknown.join(" ")
        ));
    }
    if !unready.is_empty() {
        messages.push(format!(
            "containers with unready status: [{}]",
            unready.join(" ")
        ));
    }
    if messages.is_empty() {
        (true, None, None)
    } else {
        (false, Some("ContainersNotReady"), Some(messages.join(", ")))
    }
}

/// The whole status of `pod` from its init and app containers (upstream
/// `generateAPIPodStatus`): phase, the four kubelet conditions (others, such as
/// `DisruptionTarget`, are kept), IPs, startTime (kept once set), the QoS class.
pub fn pod_status(
    pod: &Pod,
    init_views: &[ContainerView],
    views: &[ContainerView],
    pod_ip: Option<&str>,
    host_ip: &str,
    now: Timestamp,
) -> PodStatus {
    let now = Time(now);
    let old = pod.status.clone().unwrap_or_default();
    let old_conditions = old.conditions.clone().unwrap_or_default();
    let spec = pod.spec.clone().unwrap_or_default();
    let has_init = !spec
        .init_containers
        .as_deref()
        .unwrap_or_default()
        .is_empty();
    let default_reason = if has_init {
        "PodInitializing"
    } else {
        "ContainerCreating"
    };
    let status = |v: &ContainerView| container_status_with(v, default_reason);
    let mut init_statuses: Vec<ContainerStatus> = init_views.iter().map(status).collect();
    // A finished init container is ready (upstream `UpdatePodStatus`).
    for (s, c) in init_statuses
        .iter_mut()
        .zip(spec.init_containers.iter().flatten())
    {
        if !is_restartable_init(c) {
            s.ready = state_of(s).terminated.is_some_and(|t| t.exit_code == 0);
        }
    }
    let statuses: Vec<ContainerStatus> = views.iter().map(status).collect();
    // A pod that reached Succeeded or Failed stays there (upstream never leaves a terminal
    // phase).
    let phase = match old.phase.as_deref() {
        Some("Succeeded") => "Succeeded",
        Some("Failed") => "Failed",
        _ => phase(&spec, &init_statuses, &statuses),
    };
    let (init_ok, init_reason, init_message) = initialized(&spec, &init_statuses, &statuses, phase);
    let (ready, reason, message) = containers_ready(&spec, &init_statuses, &statuses, phase);
    let mut conditions = vec![
        condition(&old_conditions, "PodScheduled", true, None, None, &now),
        condition(
            &old_conditions,
            "Initialized",
            init_ok,
            init_reason,
            init_message,
            &now,
        ),
        condition(
            &old_conditions,
            "ContainersReady",
            ready,
            reason,
            message.clone(),
            &now,
        ),
        condition(&old_conditions, "Ready", ready, reason, message, &now),
    ];
    let ours = ["PodScheduled", "Initialized", "ContainersReady", "Ready"];
    conditions.extend(
        old_conditions
            .into_iter()
            .filter(|c| !ours.contains(&c.type_.as_str())),
    );
    let pod_ips = pod_ip.map(|ip| vec![PodIP { ip: ip.to_string() }]);
    PodStatus {
        phase: Some(phase.to_string()),
        conditions: Some(conditions),
        host_ip: Some(host_ip.to_string()),
        host_ips: Some(vec![k8s_openapi::api::core::v1::HostIP {
            ip: host_ip.to_string(),
        }]),
        pod_ip: pod_ip.map(str::to_string),
        pod_ips,
        start_time: old.start_time.or(Some(now)),
        init_container_statuses: has_init.then_some(init_statuses),
        container_statuses: Some(statuses),
        qos_class: old
            .qos_class
            .or_else(|| Some(crate::resources::qos_class(pod).to_string())),
        ..Default::default()
    }
}

/// `status.ephemeralContainerStatuses`, when the pod has ephemeral containers (waiting with
/// `ContainerCreating` until each has started).
pub fn ephemeral_statuses(views: &[ContainerView]) -> Option<Vec<ContainerStatus>> {
    (!views.is_empty()).then(|| {
        views
            .iter()
            .map(|v| container_status_with(v, "ContainerCreating"))
            .collect()
    })
}

/// Reports an evicted (or, under pressure, refused) pod as upstream's eviction manager does:
/// Failed with reason `Evicted` and the message; a pod that was running gets the
/// `DisruptionTarget` condition (reason `TerminationByKubelet`).
pub fn mark_evicted(status: &mut PodStatus, eviction: &crate::eviction::Eviction, now: Timestamp) {
    status.phase = Some("Failed".into());
    status.reason = Some("Evicted".into());
    status.message = Some(eviction.message.clone());
    if !eviction.killed {
        return;
    }
    let conditions = status.conditions.get_or_insert_default();
    let old = conditions.clone();
    conditions.retain(|c| c.type_ != "DisruptionTarget");
    let target = condition(
        &old,
        "DisruptionTarget",
        true,
        Some("TerminationByKubelet"),
        Some(eviction.message.clone()),
        &Time(now),
    );
    conditions.push(target);
}

/// Upstream `ShouldContainerBeRestarted` for an exited container.
pub fn should_restart(restart_policy: &str, exit_code: i32) -> bool {
    match restart_policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

/// Crash-loop back-off per container (upstream `flowcontrol.Backoff` as the kubelet uses it:
/// 10 s doubling to 5 min, forgotten after 10 min without a restart).
#[derive(Debug, Default)]
pub struct Backoff {
    entries: HashMap<String, (Duration, Instant)>,
}

/// The first back-off.
pub const BACKOFF_INITIAL: Duration = Duration::from_secs(10);
/// The longest back-off.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);

impl Backoff {
    /// How long `key`, which exited at `exited`, must still wait before its restart; `None`
    /// when it may restart now.
    pub fn remaining(&mut self, key: &str, exited: Instant, now: Instant) -> Option<Duration> {
        let &(delay, updated) = self.entries.get(key)?;
        if now.duration_since(updated) > 2 * BACKOFF_MAX {
            self.entries.remove(key);
            return None;
        }
        let waited = now.saturating_duration_since(exited);
        (waited < delay).then(|| delay - waited)
    }

    /// The current back-off of `key` (for the CrashLoopBackOff message).
    pub fn current(&self, key: &str) -> Duration {
        self.entries.get(key).map_or(BACKOFF_INITIAL, |e| e.0)
    }

    /// Records a restart of `key` at `now`: the next exit waits twice as long.
    pub fn next(&mut self, key: &str, now: Instant) {
        let delay = match self.entries.get(key) {
            None => BACKOFF_INITIAL,
            Some(&(delay, _)) => (delay * 2).min(BACKOFF_MAX),
        };
        self.entries.insert(key.to_string(), (delay, now));
    }

    /// Forgets `key` (its pod is gone).
    pub fn forget_prefix(&mut self, prefix: &str) {
        self.entries.retain(|k, _| !k.starts_with(prefix));
    }
}

/// Upstream's CrashLoopBackOff message.
pub fn crash_loop_message(delay: Duration, container: &str, pod: &Pod) -> String {
    let meta = &pod.metadata;
    format!(
        "back-off {}s restarting failed container={container} pod={}_{}({})",
        delay.as_secs(),
        meta.name.as_deref().unwrap_or(""),
        meta.namespace.as_deref().unwrap_or(""),
        meta.uid.as_deref().unwrap_or("")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rc(state: RuntimeState, restart_count: i32, exit_code: i32) -> RuntimeContainer {
        RuntimeContainer {
            id: format!("id{restart_count}"),
            state,
            restart_count,
            started_at: 1_700_000_000_000_000_000,
            finished_at: if state == RuntimeState::Exited {
                1_700_000_001_000_000_000
            } else {
                0
            },
            exit_code,
            reason: if state == RuntimeState::Exited {
                if exit_code == 0 { "Completed" } else { "Error" }.into()
            } else {
                String::new()
            },
            message: String::new(),
            image_ref: "sha256:img".into(),
        }
    }

    fn view(current: Option<RuntimeContainer>, waiting: Option<(&str, &str)>) -> ContainerView {
        ContainerView {
            name: "c".into(),
            image: "flotilla.local/busybox:1".into(),
            current,
            previous: None,
            waiting: waiting.map(|(r, m)| (r.to_string(), m.to_string())),
            probed: None,
        }
    }

    fn pod(restart_policy: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"restartPolicy": restart_policy, "containers": [{"name": "c", "image": "i"}]},
            "status": {"conditions": [
                {"type": "Ready", "status": "False", "lastTransitionTime": "2020-01-01T00:00:00Z"},
                {"type": "DisruptionTarget", "status": "True"},
            ]},
        }))
        .expect("pod")
    }

    #[test]
    fn container_statuses_follow_upstream() {
        let running = container_status(&view(Some(rc(RuntimeState::Running, 2, 0)), None));
        let state = running.state.clone().expect("state");
        assert!(state.running.is_some());
        assert!(running.ready && running.started == Some(true));
        assert_eq!(running.restart_count, 2);
        assert_eq!(running.container_id.as_deref(), Some("containerd://id2"));
        assert_eq!(running.image_id, "sha256:img");

        let crash = container_status(&view(
            Some(rc(RuntimeState::Exited, 1, 1)),
            Some(("CrashLoopBackOff", "back-off 10s")),
        ));
        let state = crash.state.clone().expect("state");
        assert_eq!(
            state.waiting.and_then(|w| w.reason).as_deref(),
            Some("CrashLoopBackOff")
        );
        let last = crash.last_state.and_then(|s| s.terminated).expect("last");
        assert_eq!((last.exit_code, last.reason.as_deref()), (1, Some("Error")));
        assert_eq!(crash.restart_count, 1);
        assert!(!crash.ready);

        let never = container_status(&view(None, Some(("ErrImageNeverPull", "absent"))));
        let w = never.state.and_then(|s| s.waiting).expect("waiting");
        assert_eq!(
            (w.reason.as_deref(), w.message.as_deref()),
            (Some("ErrImageNeverPull"), Some("absent"))
        );
        assert!(never.last_state.is_none());

        let creating = container_status(&view(None, None));
        let w = creating.state.and_then(|s| s.waiting).expect("waiting");
        assert_eq!(w.reason.as_deref(), Some("ContainerCreating"));

        let mut restarted = view(Some(rc(RuntimeState::Running, 1, 0)), None);
        restarted.previous = Some(rc(RuntimeState::Exited, 0, 3));
        let status = container_status(&restarted);
        let last = status.last_state.and_then(|s| s.terminated).expect("last");
        assert_eq!(last.exit_code, 3);
    }

    #[test]
    fn phases_follow_get_phase() {
        let s = |v: ContainerView| container_status(&v);
        let running = s(view(Some(rc(RuntimeState::Running, 0, 0)), None));
        let ok = s(view(Some(rc(RuntimeState::Exited, 0, 0)), None));
        let failed = s(view(Some(rc(RuntimeState::Exited, 0, 1)), None));
        let backoff = s(view(
            Some(rc(RuntimeState::Exited, 0, 1)),
            Some(("CrashLoopBackOff", "")),
        ));
        let pending = s(view(None, Some(("ErrImageNeverPull", ""))));
        let cases: [(&str, Vec<ContainerStatus>, &str); 9] = [
            ("Always", vec![running.clone()], "Running"),
            ("Always", vec![backoff.clone()], "Running"),
            ("Always", vec![pending.clone()], "Pending"),
            ("Always", vec![pending.clone(), running.clone()], "Pending"),
            ("Never", vec![ok.clone()], "Succeeded"),
            ("Never", vec![failed.clone()], "Failed"),
            ("OnFailure", vec![failed.clone()], "Running"),
            ("OnFailure", vec![ok.clone()], "Succeeded"),
            // No status for the spec's container: unknown.
            ("Always", vec![], "Pending"),
        ];
        for (policy, statuses, want) in cases {
            let spec = pod(policy).spec.expect("spec");
            let statuses: Vec<ContainerStatus> = statuses
                .into_iter()
                .map(|mut s| {
                    s.name = "c".into();
                    s
                })
                .collect();
            assert_eq!(phase(&spec, &[], &statuses), want, "{policy} {statuses:?}");
        }
    }

    #[test]
    fn pod_status_sets_conditions_and_ips() {
        let now = Timestamp::from_second(1_800_000_000).expect("now");
        let pod = pod("Always");
        let views = [view(Some(rc(RuntimeState::Running, 0, 0)), None)];
        let status = pod_status(&pod, &[], &views, Some("10.244.0.7"), "10.0.0.1", now);
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(status.pod_ip.as_deref(), Some("10.244.0.7"));
        assert_eq!(status.pod_ips.expect("ips")[0].ip, "10.244.0.7");
        let conditions = status.conditions.expect("conditions");
        let kinds: Vec<(&str, &str)> = conditions
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("PodScheduled", "True"),
                ("Initialized", "True"),
                ("ContainersReady", "True"),
                ("Ready", "True"),
                ("DisruptionTarget", "True"),
            ]
        );
        // Ready flipped False → True: it transitions now.
        assert_eq!(
            conditions[3].last_transition_time.as_ref().map(|t| t.0),
            Some(now)
        );

        let waiting = [view(None, Some(("ErrImageNeverPull", "m")))];
        let status = pod_status(&pod, &[], &waiting, None, "10.0.0.1", now);
        assert_eq!(status.phase.as_deref(), Some("Pending"));
        let ready = &status.conditions.expect("conditions")[3];
        assert_eq!(ready.reason.as_deref(), Some("ContainersNotReady"));
        assert_eq!(
            ready.message.as_deref(),
            Some("containers with unready status: [c]")
        );
        // Ready stayed False: it keeps its transition time.
        assert_eq!(
            ready.last_transition_time.as_ref().map(|t| t.0.to_string()),
            Some("2020-01-01T00:00:00Z".to_string())
        );
    }

    #[test]
    fn restart_policy_and_backoff() {
        for (policy, code, want) in [
            ("Always", 0, true),
            ("Always", 1, true),
            ("OnFailure", 0, false),
            ("OnFailure", 2, true),
            ("Never", 1, false),
        ] {
            assert_eq!(should_restart(policy, code), want, "{policy} {code}");
        }
        let mut backoff = Backoff::default();
        let t0 = Instant::now();
        // The first exit restarts at once, later ones wait 10 s, 20 s, … up to 5 min.
        assert_eq!(backoff.remaining("k", t0, t0), None);
        backoff.next("k", t0);
        assert_eq!(
            backoff.remaining("k", t0, t0 + Duration::from_secs(4)),
            Some(Duration::from_secs(6))
        );
        assert_eq!(
            backoff.remaining("k", t0, t0 + Duration::from_secs(10)),
            None
        );
        for _ in 0..10 {
            backoff.next("k", t0);
        }
        assert_eq!(backoff.current("k"), BACKOFF_MAX);
        backoff.forget_prefix("k");
        assert_eq!(backoff.current("k"), BACKOFF_INITIAL);
        let msg = crash_loop_message(Duration::from_secs(20), "c", &pod("Always"));
        assert_eq!(
            msg,
            "back-off 20s restarting failed container=c pod=p_ns(u)"
        );
    }

    fn init_pod(restart_policy: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"restartPolicy": restart_policy,
                     "initContainers": [{"name": "i1", "image": "i"}, {"name": "i2", "image": "i"}],
                     "containers": [{"name": "c", "image": "i"}]},
        }))
        .expect("pod")
    }

    fn named(
        name: &str,
        current: Option<RuntimeContainer>,
        waiting: Option<(&str, &str)>,
    ) -> ContainerView {
        ContainerView {
            name: name.into(),
            ..view(current, waiting)
        }
    }

    fn condition_of(status: &PodStatus, kind: &str) -> (String, Option<String>, Option<String>) {
        let c = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == kind)
            .expect("condition");
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    /// (policy, init views, app views, phase, Initialized, its reason, its message).
    type InitCase<'a> = (
        &'a str,
        Vec<ContainerView>,
        &'a [ContainerView],
        &'a str,
        &'a str,
        Option<&'a str>,
        Option<&'a str>,
    );

    #[test]
    fn init_containers_gate_the_pod_as_upstream() {
        let now = Timestamp::from_second(1_800_000_000).expect("now");
        let done = || Some(rc(RuntimeState::Exited, 0, 0));
        let run = || Some(rc(RuntimeState::Running, 0, 0));
        let failed = || Some(rc(RuntimeState::Exited, 0, 1));
        let app_none = [named("c", None, None)];
        // (policy, init views, app views, phase, Initialized, its reason, message, the app's waiting reason)
        let cases: Vec<InitCase> = vec![
            (
                "Always",
                vec![named("i1", run(), None), named("i2", None, None)],
                &app_none,
                "Pending",
                "False",
                Some("ContainersNotInitialized"),
                Some("containers with incomplete status: [i1 i2]"),
            ),
            (
                "Always",
                vec![named("i1", done(), None), named("i2", None, None)],
                &app_none,
                "Pending",
                "False",
                Some("ContainersNotInitialized"),
                Some("containers with incomplete status: [i2]"),
            ),
            (
                "Always",
                vec![
                    named("i1", failed(), Some(("CrashLoopBackOff", "back-off"))),
                    named("i2", None, None),
                ],
                &app_none,
                "Pending",
                "False",
                Some("ContainersNotInitialized"),
                None,
            ),
            (
                "Never",
                vec![named("i1", failed(), None), named("i2", None, None)],
                &app_none,
                "Failed",
                "False",
                Some("ContainersNotInitialized"),
                None,
            ),
            (
                "Always",
                vec![named("i1", done(), None), named("i2", done(), None)],
                &app_none,
                "Pending",
                "True",
                None,
                None,
            ),
        ];
        for (n, (policy, inits, apps, want_phase, init_status, init_reason, init_message)) in
            cases.into_iter().enumerate()
        {
            let pod = init_pod(policy);
            let status = pod_status(&pod, &inits, apps, None, "10.0.0.1", now);
            assert_eq!(status.phase.as_deref(), Some(want_phase), "case {n}");
            let (s, r, m) = condition_of(&status, "Initialized");
            assert_eq!(
                (s.as_str(), r.as_deref()),
                (init_status, init_reason),
                "case {n}"
            );
            if let Some(want) = init_message {
                assert_eq!(m.as_deref(), Some(want), "case {n}");
            }
            let app = &status.container_statuses.as_ref().expect("statuses")[0];
            let reason = app
                .state
                .as_ref()
                .and_then(|s| s.waiting.as_ref())
                .and_then(|w| w.reason.clone());
            assert_eq!(reason.as_deref(), Some("PodInitializing"), "case {n}");
            let inits = status.init_container_statuses.expect("init statuses");
            assert_eq!(inits.len(), 2);
        }
        // All done and the app running: Running, initialized, and finished init containers
        // are ready but not started.
        let pod = init_pod("Always");
        let inits = [named("i1", done(), None), named("i2", done(), None)];
        let apps = [named("c", run(), None)];
        let status = pod_status(&pod, &inits, &apps, None, "10.0.0.1", now);
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(condition_of(&status, "Initialized").0, "True");
        assert_eq!(condition_of(&status, "Ready").0, "True");
        let i1 = &status.init_container_statuses.expect("inits")[0];
        assert!(i1.ready);
        assert_eq!(i1.started, Some(false));
        // Pending init containers wait with PodInitializing too.
        let inits = [named("i1", run(), None), named("i2", None, None)];
        let status = pod_status(&pod, &inits, &app_none, None, "10.0.0.1", now);
        let i2 = &status.init_container_statuses.expect("inits")[1];
        assert_eq!(
            i2.state
                .as_ref()
                .and_then(|s| s.waiting.as_ref())
                .and_then(|w| w.reason.as_deref()),
            Some("PodInitializing")
        );
    }

    #[test]
    fn probes_decide_started_and_ready() {
        let now = Timestamp::from_second(1_800_000_000).expect("now");
        let pod = pod("Always");
        let mut probed = view(Some(rc(RuntimeState::Running, 0, 0)), None);
        let cases = [
            (None, true, true, "True"),
            (Some((true, true)), true, true, "True"),
            (Some((true, false)), true, false, "False"),
            // Not started: not ready whatever readiness says.
            (Some((false, true)), false, false, "False"),
        ];
        for (gates, started, ready, condition) in cases {
            probed.probed = gates;
            let s = container_status(&probed);
            assert_eq!((s.started, s.ready), (Some(started), ready), "{gates:?}");
            let status = pod_status(&pod, &[], std::slice::from_ref(&probed), None, "h", now);
            let (got, reason, message) = condition_of(&status, "Ready");
            assert_eq!(got, condition, "{gates:?}");
            if !ready {
                assert_eq!(reason.as_deref(), Some("ContainersNotReady"));
                assert_eq!(
                    message.as_deref(),
                    Some("containers with unready status: [c]")
                );
            }
            // The QoS class is filled in when the API server left it out.
            assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
        }
        // An exited container is neither, probes or not.
        let mut exited = view(Some(rc(RuntimeState::Exited, 0, 1)), None);
        exited.probed = Some((true, true));
        let s = container_status(&exited);
        assert_eq!((s.started, s.ready), (Some(false), false));
    }
}
