//! Init containers as a pure decision (upstream kuberuntime `computeInitContainerActions`):
//! from the init containers' states in the current sandbox, which one to (re)start, whether
//! to wait, whether initialization failed for good (restartPolicy Never), or whether the app
//! containers may start. Sidecars (`restartPolicy: Always` on an init container) must be
//! running and started before the next init container, and are restarted whenever they exit.

/// One init container's state in the current sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitState {
    /// No container yet (or only in an older sandbox).
    None,
    /// Created, never started.
    Created,
    /// Running; `started`: its startup probe passed (or it has none).
    Running {
        /// Started.
        started: bool,
    },
    /// Exited with this code.
    Exited(i32),
}

/// What to do about the init containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InitPlan {
    /// Start (or restart) these init containers, by index; the app containers wait.
    Start(Vec<usize>),
    /// Wait for a running init container; the app containers wait.
    Wait,
    /// An init container failed under restartPolicy Never: the pod has failed.
    Failed,
    /// Initialized: the app containers may run; restart these exited sidecars.
    Done(Vec<usize>),
}

/// Upstream `computeInitContainerActions`. `sidecar[i]`: init container `i` is restartable;
/// `initialized_before`: an app container already ran in this sandbox (then only sidecars
/// are kept running).
pub fn plan(
    states: &[InitState],
    sidecar: &[bool],
    restart_policy: &str,
    initialized_before: bool,
) -> InitPlan {
    let is_sidecar = |i: usize| sidecar.get(i).copied().unwrap_or(false);
    let dead = |s: &InitState| {
        matches!(
            s,
            InitState::None | InitState::Created | InitState::Exited(_)
        )
    };
    if initialized_before {
        let restart = states
            .iter()
            .enumerate()
            .filter(|(i, s)| is_sidecar(*i) && dead(s))
            .map(|(i, _)| i)
            .collect();
        return InitPlan::Done(restart);
    }
    for (i, state) in states.iter().enumerate() {
        match (is_sidecar(i), state) {
            (_, InitState::None | InitState::Created) => return InitPlan::Start(vec![i]),
            (true, InitState::Exited(_)) => return InitPlan::Start(vec![i]),
            (true, InitState::Running { started: true }) => continue,
            (_, InitState::Running { .. }) => return InitPlan::Wait,
            (false, InitState::Exited(0)) => continue,
            (false, InitState::Exited(_)) if restart_policy == "Never" => return InitPlan::Failed,
            (false, InitState::Exited(_)) => return InitPlan::Start(vec![i]),
        }
    }
    InitPlan::Done(Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use InitState::*;

    /// (states, which are sidecars, restartPolicy, initialized before, the plan).
    type Case = (
        &'static [InitState],
        &'static [bool],
        &'static str,
        bool,
        InitPlan,
    );

    #[test]
    fn init_containers_run_in_order_to_completion() {
        let cases: Vec<Case> = vec![
            (
                &[None, None],
                &[false, false],
                "Always",
                false,
                InitPlan::Start(vec![0]),
            ),
            (
                &[Created, None],
                &[false, false],
                "Always",
                false,
                InitPlan::Start(vec![0]),
            ),
            (
                &[Running { started: true }, None],
                &[false, false],
                "Always",
                false,
                InitPlan::Wait,
            ),
            (
                &[Exited(0), None],
                &[false, false],
                "Always",
                false,
                InitPlan::Start(vec![1]),
            ),
            (
                &[Exited(0), Exited(0)],
                &[false, false],
                "Always",
                false,
                InitPlan::Done(vec![]),
            ),
            // A failure is retried (with back-off) unless the pod never restarts.
            (
                &[Exited(2), None],
                &[false, false],
                "OnFailure",
                false,
                InitPlan::Start(vec![0]),
            ),
            (
                &[Exited(0), Exited(1)],
                &[false, false],
                "Never",
                false,
                InitPlan::Failed,
            ),
            // A sidecar must be started before the next one runs, and keeps running.
            (
                &[Running { started: false }, None],
                &[true, false],
                "Always",
                false,
                InitPlan::Wait,
            ),
            (
                &[Running { started: true }, None],
                &[true, false],
                "Always",
                false,
                InitPlan::Start(vec![1]),
            ),
            (
                &[Running { started: true }, Exited(0)],
                &[true, false],
                "Never",
                false,
                InitPlan::Done(vec![]),
            ),
            (
                &[Exited(0), None],
                &[true, false],
                "Never",
                false,
                InitPlan::Start(vec![0]),
            ),
            // Once the app ran, init containers are not rerun; exited sidecars restart.
            (
                &[Exited(1), None],
                &[true, false],
                "Always",
                true,
                InitPlan::Done(vec![0]),
            ),
            (
                &[Running { started: true }, None],
                &[true, false],
                "Always",
                true,
                InitPlan::Done(vec![]),
            ),
            (&[], &[], "Always", false, InitPlan::Done(vec![])),
        ];
        for (n, (states, sidecar, policy, before, want)) in cases.into_iter().enumerate() {
            assert_eq!(
                plan(states, sidecar, policy, before),
                want,
                "case {n}: {states:?}"
            );
        }
    }
}
