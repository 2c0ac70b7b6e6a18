//! Pod status from what the runtime shows, as pure functions (upstream `kubelet_pods.go`
//! `generateAPIPodStatus`, `getPhase`, `convertToAPIContainerStatuses` and the status
//! manager's condition rules), and the crash-loop back-off and restart policy decisions
//! (`pkg/kubelet/kuberuntime` `doBackOff`, `ShouldContainerBeRestarted`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, Pod, PodCondition, PodIP, PodStatus,
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
pub fn container_status(view: &ContainerView) -> ContainerStatus {
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
        (None, None) => (waiting("ContainerCreating", None), None),
        (None, Some(c)) => {
            let state = match c.state {
                RuntimeState::Running => ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: time(c.started_at),
                    }),
                    ..Default::default()
                },
                RuntimeState::Exited => terminated(c),
                RuntimeState::Created | RuntimeState::Unknown => waiting("ContainerCreating", None),
            };
            (state, last_exit(view.previous.as_ref()))
        }
    };
    let running = state.running.is_some();
    ContainerStatus {
        name: view.name.clone(),
        image: view.image.clone(),
        image_id: current.map(|c| c.image_ref.clone()).unwrap_or_default(),
        container_id: current.map(|c| format!("containerd://{}", c.id)),
        restart_count: current.map_or(0, |c| c.restart_count),
        // No readiness probes yet: a running container is ready.
        ready: running,
        started: Some(running),
        state: Some(state),
        last_state: last_state.map(|s| ContainerState { ..s }),
        ..Default::default()
    }
}

/// Upstream `getPhase` for a pod without init containers.
pub fn phase(restart_policy: &str, statuses: &[ContainerStatus]) -> &'static str {
    let (mut running, mut stopped, mut succeeded, mut waiting) = (0, 0, 0, 0);
    for status in statuses {
        let state = status.state.clone().unwrap_or_default();
        if state.running.is_some() {
            running += 1;
        } else if let Some(t) = &state.terminated {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if status
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .is_some()
        {
            stopped += 1;
        } else {
            waiting += 1;
        }
    }
    if waiting > 0 {
        "Pending"
    } else if running > 0 {
        "Running"
    } else if stopped > 0 {
        match restart_policy {
            "Always" => "Running",
            _ if stopped == succeeded => "Succeeded",
            "Never" => "Failed",
            _ => "Running",
        }
    } else {
        "Pending"
    }
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

/// The whole status of `pod` from its containers (upstream `generateAPIPodStatus`): phase,
/// the four kubelet conditions (others, such as `DisruptionTarget`, are kept), IPs,
/// startTime (kept once set).
pub fn pod_status(
    pod: &Pod,
    views: &[ContainerView],
    pod_ip: Option<&str>,
    host_ip: &str,
    now: Timestamp,
) -> PodStatus {
    let now = Time(now);
    let old = pod.status.clone().unwrap_or_default();
    let old_conditions = old.conditions.clone().unwrap_or_default();
    let restart_policy = pod
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.clone())
        .unwrap_or_else(|| "Always".into());
    let statuses: Vec<ContainerStatus> = views.iter().map(container_status).collect();
    let phase = phase(&restart_policy, &statuses);
    let terminal = matches!(phase, "Succeeded" | "Failed");
    let unready: Vec<&str> = statuses
        .iter()
        .filter(|s| !s.ready)
        .map(|s| s.name.as_str())
        .collect();
    let ready = unready.is_empty();
    let (reason, message) = if ready {
        (None, None)
    } else if terminal {
        (Some("PodCompleted"), None)
    } else {
        (
            Some("ContainersNotReady"),
            Some(format!(
                "containers with unready status: [{}]",
                unready.join(" ")
            )),
        )
    };
    let mut conditions = vec![
        condition(&old_conditions, "PodScheduled", true, None, None, &now),
        condition(
            &old_conditions,
            "Initialized",
            true,
            terminal.then_some("PodCompleted"),
            None,
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
        container_statuses: Some(statuses),
        qos_class: old.qos_class,
        ..Default::default()
    }
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
            ("Always", vec![running.clone(), pending.clone()], "Pending"),
            ("Never", vec![ok.clone()], "Succeeded"),
            ("Never", vec![failed.clone()], "Failed"),
            ("OnFailure", vec![failed.clone()], "Running"),
            ("OnFailure", vec![ok.clone()], "Succeeded"),
            ("Always", vec![], "Pending"),
        ];
        for (policy, statuses, want) in cases {
            assert_eq!(phase(policy, &statuses), want, "{policy} {statuses:?}");
        }
    }

    #[test]
    fn pod_status_sets_conditions_and_ips() {
        let now = Timestamp::from_second(1_800_000_000).expect("now");
        let pod = pod("Always");
        let views = [view(Some(rc(RuntimeState::Running, 0, 0)), None)];
        let status = pod_status(&pod, &views, Some("10.244.0.7"), "10.0.0.1", now);
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
        let status = pod_status(&pod, &waiting, None, "10.0.0.1", now);
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
}
