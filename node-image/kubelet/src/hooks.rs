//! Container lifecycle hooks and killing a container (upstream `pkg/kubelet/lifecycle`
//! `handlerRunner.Run` and kuberuntime `killContainer` / `executePreStopHook`): postStart
//! after StartContainer, preStop before StopContainer within the grace period (the rest of
//! it goes to StopContainer, never less than 2 s), the `Killing`, `FailedPostStartHook` and
//! `FailedPreStopHook` events, and upstream's failure texts. Exec hooks go through CRI
//! `ExecSync`, httpGet hooks from the kubelet's network namespace to the pod IP.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};

use crate::cri::Cri;
use crate::events::Recorder;
use crate::probe::{self, Handler, ProbeError, ProbeKind};
use crate::prober;

/// Upstream's shortest stop window (`minimumGracePeriodInSeconds`).
pub const MINIMUM_GRACE_SECONDS: i64 = 2;

/// Upstream `format.Pod`: `name_namespace(uid)`.
pub fn format_pod(pod: &Pod) -> String {
    let meta = &pod.metadata;
    format!(
        "{}_{}({})",
        meta.name.as_deref().unwrap_or(""),
        meta.namespace.as_deref().unwrap_or(""),
        meta.uid.as_deref().unwrap_or("")
    )
}

/// What `handler` runs (`pod_ip`: the default host of httpGet).
pub fn hook_handler(
    handler: &LifecycleHandler,
    container: &Container,
    pod_ip: &str,
) -> Result<Handler, ProbeError> {
    if let Some(exec) = &handler.exec {
        return Ok(Handler::Exec(exec.command.clone().unwrap_or_default()));
    }
    if let Some(get) = &handler.http_get {
        return Ok(Handler::Http(probe::http_get(
            get,
            container,
            pod_ip,
            &probe::lifecycle_agent(),
        )?));
    }
    if let Some(sleep) = &handler.sleep {
        return Ok(Handler::Sleep(Duration::from_secs(
            u64::try_from(sleep.seconds).unwrap_or(0),
        )));
    }
    Err(ProbeError::NoHandler(container.name.clone()))
}

/// Upstream's message for a hook that failed with `error` (exec's output in `output`).
pub fn failure_message(
    handler: &Handler,
    spec: &LifecycleHandler,
    container: &str,
    pod: &Pod,
    error: &str,
    output: &str,
) -> String {
    let pod = format_pod(pod);
    match handler {
        Handler::Exec(command) => format!(
            "Exec lifecycle hook ([{}]) for Container {container:?} in Pod {pod:?} failed - error: {error}, message: {output:?}",
            command.join(" ")
        ),
        Handler::Http(_) => format!(
            "HTTP lifecycle hook ({}) for Container {container:?} in Pod {pod:?} failed - error: {error}",
            spec.http_get
                .as_ref()
                .and_then(|g| g.path.clone())
                .unwrap_or_default()
        ),
        Handler::Sleep(d) => format!(
            "Sleep lifecycle hook ({}) for Container {container:?} in Pod {pod:?} failed - error: {error}",
            d.as_secs()
        ),
        Handler::Tcp { .. } | Handler::Grpc { .. } => format!(
            "Lifecycle hook for Container {container:?} in Pod {pod:?} failed - error: {error}"
        ),
    }
}

/// The error text of an exec hook that exited non-zero (upstream's `CodeExitError`).
pub fn exit_error(command: &[String], code: i32, stderr: &str) -> String {
    format!(
        "command '{}' exited with {code}: {stderr}",
        command.join(" ")
    )
}

/// Why a container is being killed (upstream `containerKillReason`), for its grace period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    /// Deletion, a failed postStart, the pod finishing.
    Other,
    /// A failed probe: its own `terminationGracePeriodSeconds` may apply.
    Probe(ProbeKind),
}

/// Upstream `setTerminationGracePeriod`: the deletion's grace period, else the failed
/// probe's own, else the pod's `terminationGracePeriodSeconds`, else 2 s.
pub fn grace_period(pod: &Pod, container: Option<&Container>, reason: KillReason) -> i64 {
    if let Some(grace) = pod.metadata.deletion_grace_period_seconds {
        return grace;
    }
    let Some(pod_grace) = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
    else {
        return MINIMUM_GRACE_SECONDS;
    };
    let probe = match (reason, container) {
        (KillReason::Probe(ProbeKind::Liveness), Some(c)) => c.liveness_probe.as_ref(),
        (KillReason::Probe(ProbeKind::Startup), Some(c)) => c.startup_probe.as_ref(),
        _ => None,
    };
    probe
        .and_then(|p| p.termination_grace_period_seconds)
        .unwrap_or(pod_grace)
}

/// The grace StopContainer gets after a preStop hook that took `elapsed` of `grace`.
pub fn stop_grace(grace: i64, elapsed: Duration) -> i64 {
    let elapsed = i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX);
    grace.saturating_sub(elapsed).max(MINIMUM_GRACE_SECONDS)
}

/// The order containers stop in on deletion (upstream's termination ordering with
/// sidecars): every regular container at once, then the sidecars one by one in reverse
/// order of the spec. `running`: the names of the running containers.
pub fn termination_waves(pod: &Pod, running: &[String]) -> Vec<Vec<String>> {
    let sidecars: Vec<&str> = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| probe::is_restartable_init(c))
        .map(|c| c.name.as_str())
        .collect();
    let first: Vec<String> = running
        .iter()
        .filter(|n| !sidecars.contains(&n.as_str()))
        .cloned()
        .collect();
    let mut waves = Vec::new();
    if !first.is_empty() {
        waves.push(first);
    }
    for sidecar in sidecars.iter().rev() {
        if running.iter().any(|n| n == sidecar) {
            waves.push(vec![sidecar.to_string()]);
        }
    }
    waves
}

/// The `Killing` event's message for a probe failure (upstream `computePodActions`).
pub fn probe_kill_message(container: &str, kind: ProbeKind, restart: bool) -> String {
    let what = match kind {
        ProbeKind::Startup => "startup",
        _ => "liveness",
    };
    let message = format!("Container {container} failed {what} probe");
    if restart {
        format!("{message}, will be restarted")
    } else {
        message
    }
}

/// Runs `spec` for container `id`; `Err` carries upstream's failure message. Exec hooks
/// have no timeout of their own (upstream passes 0); the caller bounds them.
pub async fn run_hook(
    cri: &mut Cri,
    pod: &Pod,
    container: &Container,
    id: &str,
    spec: &LifecycleHandler,
    pod_ip: &str,
) -> Result<(), String> {
    let handler = hook_handler(spec, container, pod_ip).map_err(|err| err.to_string())?;
    let fail = |error: &str, output: &str| {
        failure_message(&handler, spec, &container.name, pod, error, output)
    };
    match &handler {
        Handler::Exec(command) => {
            let request = k8s_cri::v1::ExecSyncRequest {
                container_id: id.to_string(),
                cmd: command.clone(),
                timeout: 0,
            };
            let response = cri
                .runtime
                .exec_sync(request)
                .await
                .map_err(|status| fail(status.message(), ""))?
                .into_inner();
            if response.exit_code != 0 {
                let stderr = String::from_utf8_lossy(&response.stderr).into_owned();
                let mut output = response.stdout;
                output.extend_from_slice(&response.stderr);
                let output = String::from_utf8_lossy(&output).into_owned();
                return Err(fail(
                    &exit_error(command, response.exit_code, &stderr),
                    &output,
                ));
            }
            Ok(())
        }
        Handler::Http(get) => {
            // Upstream only fails an httpGet hook that gets no answer; any status passes.
            prober::http_get(get)
                .await
                .map(|_| ())
                .map_err(|e| fail(&e, ""))
        }
        Handler::Sleep(duration) => {
            tokio::time::sleep(*duration).await;
            Ok(())
        }
        Handler::Tcp { .. } => Err(fail("tcpSocket is not a lifecycle handler", "")),
        Handler::Grpc { .. } => Err(fail("grpc is not a lifecycle handler", "")),
    }
}

/// Upstream `killContainer`: the `Killing` event (`message`, else "Stopping container
/// NAME"), the preStop hook within `grace` seconds (`FailedPreStopHook` if it fails), then
/// StopContainer with what is left of the grace period (at least 2 s).
#[allow(clippy::too_many_arguments)]
pub async fn kill_container(
    cri: &mut Cri,
    recorder: &Recorder,
    pod: &Pod,
    name: &str,
    container: Option<&Container>,
    id: &str,
    grace: i64,
    message: Option<String>,
    pod_ip: &str,
) -> Result<(), crate::cri::CriError> {
    let message = message.unwrap_or_else(|| format!("Stopping container {name}"));
    recorder.container_event(pod, name, "Normal", "Killing", &message);
    let mut stop = grace.max(MINIMUM_GRACE_SECONDS);
    let pre_stop = container.and_then(|c| c.lifecycle.as_ref()?.pre_stop.as_ref().map(|h| (c, h)));
    if let Some((spec, hook)) = pre_stop
        && grace > 0
    {
        let started = Instant::now();
        let budget = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
        let mut hook_cri = cri.clone();
        match tokio::time::timeout(budget, run_hook(&mut hook_cri, pod, spec, id, hook, pod_ip))
            .await
        {
            Ok(Ok(())) => {}
            Ok(Err(msg)) => {
                tracing::info!(pod = ?pod.metadata.name, container = %name, %msg, "preStop hook failed");
                recorder.container_event(pod, name, "Warning", "FailedPreStopHook", &msg);
            }
            Err(_) => {
                tracing::info!(pod = ?pod.metadata.name, container = %name, grace, "preStop hook did not complete within the grace period");
            }
        }
        stop = stop_grace(grace, started.elapsed());
    }
    cri.stop_container(id, stop).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(extra: serde_json::Value) -> Pod {
        let mut pod = json!({
            "metadata": {"name": "web", "namespace": "prod", "uid": "u1"},
            "spec": {"terminationGracePeriodSeconds": 30, "containers": [{
                "name": "app",
                "ports": [{"name": "http", "containerPort": 8080}],
                "livenessProbe": {"exec": {"command": ["true"]}, "terminationGracePeriodSeconds": 5},
                "startupProbe": {"exec": {"command": ["true"]}},
                "lifecycle": {
                    "postStart": {"exec": {"command": ["sh", "-c", "exit 1"]}},
                    "preStop": {"httpGet": {"path": "/quit", "port": "http"}},
                },
            }]},
        });
        if let (Some(p), Some(e)) = (pod.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                if let Some(m) = p.get_mut(k).and_then(|m| m.as_object_mut()) {
                    for (k2, v2) in v.as_object().into_iter().flatten() {
                        m.insert(k2.clone(), v2.clone());
                    }
                }
            }
        }
        serde_json::from_value(pod).expect("pod")
    }

    fn app(pod: &Pod) -> Container {
        pod.spec.as_ref().expect("spec").containers[0].clone()
    }

    #[test]
    fn grace_periods_follow_set_termination_grace_period() {
        let p = pod(json!({}));
        let c = app(&p);
        let cases = [
            (KillReason::Other, 30),
            (KillReason::Probe(ProbeKind::Liveness), 5),
            // The startup probe sets none: the pod's applies.
            (KillReason::Probe(ProbeKind::Startup), 30),
        ];
        for (reason, want) in cases {
            assert_eq!(grace_period(&p, Some(&c), reason), want, "{reason:?}");
        }
        let deleting = pod(json!({"metadata": {"deletionGracePeriodSeconds": 10}}));
        assert_eq!(
            grace_period(&deleting, Some(&c), KillReason::Probe(ProbeKind::Liveness)),
            10
        );
        assert_eq!(stop_grace(10, Duration::from_millis(2500)), 8);
        assert_eq!(stop_grace(10, Duration::from_secs(9)), 2);
        assert_eq!(stop_grace(3, Duration::from_secs(30)), 2);
    }

    #[test]
    fn sidecars_stop_after_the_app_in_reverse_order() {
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {
            "initContainers": [
                {"name": "s1", "restartPolicy": "Always"},
                {"name": "init"},
                {"name": "s2", "restartPolicy": "Always"},
            ],
            "containers": [{"name": "a"}, {"name": "b"}],
        }}))
        .expect("pod");
        let names = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let cases: [(&[&str], Vec<Vec<String>>); 3] = [
            (
                &["a", "s1", "b", "s2"],
                vec![names(&["a", "b"]), names(&["s2"]), names(&["s1"])],
            ),
            (&["s1"], vec![names(&["s1"])]),
            (&["a"], vec![names(&["a"])]),
        ];
        for (running, want) in cases {
            assert_eq!(
                termination_waves(&pod, &names(running)),
                want,
                "{running:?}"
            );
        }
    }

    #[test]
    fn hooks_resolve_and_fail_with_upstream_texts() {
        let p = pod(json!({}));
        let c = app(&p);
        let lifecycle = c.lifecycle.clone().expect("lifecycle");
        let post = lifecycle.post_start.expect("postStart");
        let handler = hook_handler(&post, &c, "10.0.0.5").expect("handler");
        assert_eq!(
            handler,
            Handler::Exec(vec!["sh".into(), "-c".into(), "exit 1".into()])
        );
        let error = exit_error(&["sh".into(), "-c".into(), "exit 1".into()], 1, "");
        assert_eq!(error, "command 'sh -c exit 1' exited with 1: ");
        assert_eq!(
            failure_message(&handler, &post, "app", &p, &error, ""),
            "Exec lifecycle hook ([sh -c exit 1]) for Container \"app\" in Pod \"web_prod(u1)\" failed - error: command 'sh -c exit 1' exited with 1: , message: \"\""
        );
        let pre = lifecycle.pre_stop.expect("preStop");
        let Handler::Http(get) = hook_handler(&pre, &c, "10.0.0.5").expect("handler") else {
            panic!("not http");
        };
        assert_eq!(get.url(), "http://10.0.0.5:8080/quit");
        assert!(
            get.headers
                .iter()
                .any(|(k, v)| k == "User-Agent" && v.starts_with("kube-lifecycle/"))
        );
        assert_eq!(
            failure_message(&Handler::Http(get), &pre, "app", &p, "boom", ""),
            "HTTP lifecycle hook (/quit) for Container \"app\" in Pod \"web_prod(u1)\" failed - error: boom"
        );
        let sleep: LifecycleHandler =
            serde_json::from_value(json!({"sleep": {"seconds": 2}})).expect("sleep");
        assert_eq!(
            hook_handler(&sleep, &c, ""),
            Ok(Handler::Sleep(Duration::from_secs(2)))
        );
        assert_eq!(
            probe_kill_message("app", ProbeKind::Liveness, true),
            "Container app failed liveness probe, will be restarted"
        );
        assert_eq!(
            probe_kill_message("app", ProbeKind::Startup, false),
            "Container app failed startup probe"
        );
    }
}
