//! The pod lifecycle event generator (upstream `pkg/kubelet/pleg/generic.go`): one relist of
//! every sandbox and container each second, compared with the previous relist; the workers
//! of the pods whose runtime state changed (a container started, exited or vanished, a
//! sandbox stopped) are woken to re-sync at once. Workers otherwise re-sync only slowly, so
//! the runtime is asked about every pod twice a second in all rather than per pod.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_cri::v1 as cri;
use tokio::sync::Notify;

use crate::cri::Cri;
use crate::translate::POD_UID_LABEL;

/// How often the runtime is relisted (upstream's 1 s).
pub const RELIST_PERIOD: Duration = Duration::from_secs(1);

/// One pod's runtime state: each sandbox's and container's (ID, state), sorted.
pub type PodState = Vec<(String, i32)>;

/// The workers to wake, by pod UID.
#[derive(Default)]
pub struct Pleg {
    workers: Mutex<HashMap<String, Arc<Notify>>>,
}

impl Pleg {
    /// Registers pod `uid`'s worker; it waits on the returned signal.
    pub fn register(&self, uid: &str) -> Arc<Notify> {
        let signal = Arc::new(Notify::new());
        if let Ok(mut workers) = self.workers.lock() {
            workers.insert(uid.to_string(), signal.clone());
        }
        signal
    }

    /// Forgets pod `uid`'s worker.
    pub fn unregister(&self, uid: &str) {
        if let Ok(mut workers) = self.workers.lock() {
            workers.remove(uid);
        }
    }

    fn wake(&self, uids: &HashSet<String>) {
        if let Ok(workers) = self.workers.lock() {
            for uid in uids {
                if let Some(signal) = workers.get(uid) {
                    signal.notify_one();
                }
            }
        }
    }
}

/// Every pod's runtime state from one relist.
pub fn states(
    sandboxes: &[cri::PodSandbox],
    containers: &[cri::Container],
) -> HashMap<String, PodState> {
    let mut all: HashMap<String, PodState> = HashMap::new();
    let sandbox_items = sandboxes.iter().map(|s| (&s.labels, &s.id, s.state));
    let container_items = containers.iter().map(|c| (&c.labels, &c.id, c.state));
    for (labels, id, state) in sandbox_items.chain(container_items) {
        if let Some(uid) = labels.get(POD_UID_LABEL) {
            all.entry(uid.clone())
                .or_default()
                .push((id.clone(), state));
        }
    }
    for state in all.values_mut() {
        state.sort();
    }
    all
}

/// The pods whose state differs between two relists (appeared, changed or gone).
pub fn changed(
    before: &HashMap<String, PodState>,
    now: &HashMap<String, PodState>,
) -> HashSet<String> {
    let mut uids: HashSet<String> = now
        .iter()
        .filter(|(uid, state)| before.get(*uid) != Some(*state))
        .map(|(uid, _)| uid.clone())
        .collect();
    uids.extend(before.keys().filter(|uid| !now.contains_key(*uid)).cloned());
    uids
}

/// Relists every [`RELIST_PERIOD`] and wakes the workers of pods that changed.
pub async fn run(pleg: Arc<Pleg>, mut cri: Cri) {
    let mut before: HashMap<String, PodState> = HashMap::new();
    loop {
        tokio::time::sleep(RELIST_PERIOD).await;
        let (sandboxes, containers) = match (cri.sandboxes(None).await, cri.all_containers().await)
        {
            (Ok(sandboxes), Ok(containers)) => (sandboxes, containers),
            (Err(err), _) | (_, Err(err)) => {
                tracing::debug!(%err, "relisting the runtime failed");
                continue;
            }
        };
        let now = states(&sandboxes, &containers);
        pleg.wake(&changed(&before, &now));
        before = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(uid: &str, id: &str, state: cri::PodSandboxState) -> cri::PodSandbox {
        cri::PodSandbox {
            id: id.into(),
            state: state as i32,
            labels: [(POD_UID_LABEL.to_string(), uid.to_string())].into(),
            ..Default::default()
        }
    }

    fn container(uid: &str, id: &str, state: cri::ContainerState) -> cri::Container {
        cri::Container {
            id: id.into(),
            state: state as i32,
            labels: [(POD_UID_LABEL.to_string(), uid.to_string())].into(),
            ..Default::default()
        }
    }

    #[test]
    fn only_pods_whose_runtime_state_moved_are_woken() {
        use cri::ContainerState::{ContainerExited, ContainerRunning};
        use cri::PodSandboxState::SandboxReady;
        let before = states(
            &[
                sandbox("a", "sa", SandboxReady),
                sandbox("b", "sb", SandboxReady),
            ],
            &[
                container("a", "ca", ContainerRunning),
                container("b", "cb", ContainerRunning),
                container("gone", "cg", ContainerRunning),
            ],
        );
        let now = states(
            &[
                sandbox("a", "sa", SandboxReady),
                sandbox("b", "sb", SandboxReady),
                sandbox("new", "sn", SandboxReady),
            ],
            &[
                container("a", "ca", ContainerRunning),
                container("b", "cb", ContainerExited),
            ],
        );
        let woken = changed(&before, &now);
        assert_eq!(
            woken,
            HashSet::from(["b".to_string(), "new".to_string(), "gone".to_string()])
        );
        assert!(changed(&now, &now).is_empty());
    }

    #[test]
    fn registered_workers_get_a_wake_up_even_when_not_yet_waiting() {
        let pleg = Pleg::default();
        let signal = pleg.register("a");
        pleg.wake(&HashSet::from(["a".to_string(), "unknown".to_string()]));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(1), signal.notified())
                .await
                .expect("the stored wake-up");
        });
        pleg.unregister("a");
        assert!(pleg.workers.lock().expect("lock").is_empty());
    }
}
