//! CPU-heavy request work (parsing a large body) off the async workers: on a few threads of
//! their own under `SCHED_IDLE`, at most one job per tenant at a time, so one tenant's worst
//! bodies run on cores nobody else wants and never hold up the workers that answer every other
//! tenant.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use crate::error::ApiError;

/// Bodies larger than this are parsed on the heavy-work threads; smaller ones where they are.
pub const HEAVY_BODY_BYTES: usize = 64 * 1024;
/// The heavy-work threads' nice value where `SCHED_IDLE` is refused.
const HEAVY_NICE: i32 = 19;

type Job = Box<dyn FnOnce() + Send>;

/// Puts the calling thread under `SCHED_IDLE`: a waking worker of normal policy preempts it at
/// once, where a nice-19 thread keeps its slice (at nice 19, another tenant's GET p99 still
/// rose 2.4× while one tenant sent the worst bodies; see the tenancy bench). Best effort: where
/// the policy is refused, nice 19; where that is refused too, the workers' priority.
fn lower_this_threads_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler reads `param` only for the call's duration; pid 0 is the
    // calling thread. rustix does not wrap this syscall.
    #[allow(unsafe_code)]
    let refused = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0;
    if refused {
        let _ = rustix::process::setpriority_process(Some(rustix::thread::gettid()), HEAVY_NICE);
    }
}

/// The heavy-work threads.
pub struct HeavyWork {
    jobs: Mutex<mpsc::Sender<Job>>,
}

impl std::fmt::Debug for HeavyWork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeavyWork").finish_non_exhaustive()
    }
}

impl Default for HeavyWork {
    fn default() -> Self {
        Self::new(
            std::thread::available_parallelism()
                .map(usize::from)
                .unwrap_or(2),
        )
    }
}

impl HeavyWork {
    /// `threads` threads taking jobs in order.
    pub fn new(threads: usize) -> Self {
        let (jobs, queue) = mpsc::channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for index in 0..threads.max(1) {
            let queue = queue.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("heavy-{index}"))
                .spawn(move || {
                    lower_this_threads_priority();
                    loop {
                        let job = match queue.lock() {
                            Ok(queue) => queue.recv(),
                            Err(_) => return,
                        };
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    }
                });
            if let Err(err) = spawned {
                tracing::warn!(%err, "starting a heavy-work thread");
            }
        }
        HeavyWork {
            jobs: Mutex::new(jobs),
        }
    }

    /// Runs `work` on a heavy-work thread and waits for its answer. `work` gets a flag that is
    /// set once nobody waits any more (the client went away): it should stop early.
    pub async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&AtomicBool) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let abandoned = Arc::new(AtomicBool::new(false));
        let flag = abandoned.clone();
        let job: Job = Box::new(move || {
            if flag.load(Ordering::Relaxed) {
                return;
            }
            let _ = answer.send(work(&flag));
        });
        self.jobs
            .lock()
            .map_err(|_| ApiError::internal("the heavy-work queue is poisoned"))?
            .send(job)
            .map_err(|_| ApiError::internal("the heavy-work threads are gone"))?;
        // Set the flag if this future is dropped before the answer (the request was dropped).
        struct Abandon(Arc<AtomicBool>);
        impl Drop for Abandon {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _abandon = Abandon(abandoned);
        answered
            .await
            .map_err(|_| ApiError::internal("a heavy-work job ended without an answer"))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_answer_and_abandoned_ones_are_told() {
        let heavy = HeavyWork::new(1);
        assert_eq!(heavy.run(|_| Ok(21 * 2)).await.ok(), Some(42));
        assert!(
            heavy
                .run(|_| Err::<(), _>(ApiError::bad_request("no")))
                .await
                .is_err()
        );
        // A job whose caller goes away sees its flag set.
        let (seen_tx, seen_rx) = std::sync::mpsc::channel();
        let waiting = heavy.run(move |abandoned| {
            for _ in 0..200 {
                if abandoned.load(Ordering::Relaxed) {
                    let _ = seen_tx.send(true);
                    return Ok(());
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            let _ = seen_tx.send(false);
            Ok(())
        });
        let _ = tokio::time::timeout(std::time::Duration::from_millis(50), waiting).await;
        assert_eq!(
            seen_rx.recv_timeout(std::time::Duration::from_secs(5)).ok(),
            Some(true)
        );
    }
}
