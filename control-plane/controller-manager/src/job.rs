//! The Job controller (upstream `pkg/controller/job`, v1.33, a pure API client): runs each
//! Job's pods toward `completions` at most `parallelism` at a time (NonIndexed, or Indexed with
//! one pod per completion index), retries failures with upstream's exponential backoff up to
//! `backoffLimit`, enforces `activeDeadlineSeconds` and `suspend`, and tracks finished pods with
//! the `batch.kubernetes.io/job-tracking` finalizer through `status.uncountedTerminatedPods` so
//! none is counted twice or lost. Terminal conditions go as upstream with
//! JobPodReplacementPolicy on: `SuccessCriteriaMet` / `FailureTarget` first, then `Complete` /
//! `Failed` once no pod is terminating. Finished Jobs with `ttlSecondsAfterFinished` are deleted
//! (upstream's TTL-after-finished controller). Pods are not adopted by selector: a Job owns the
//! pods whose controller reference names it.
//!
//! A change to a Job or to a pod it controls queues the Job's key; a pod still carrying the
//! tracking finalizer that no live Job controls (or whose Job was deleted) queues the pod on a
//! second queue, upstream's orphan queue, whose worker releases it. Deadlines, pod-failure
//! backoffs and TTLs, which no event announces, requeue the Job after their time.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus, UncountedTerminatedPods};
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, Patch, PostParams, Preconditions, PropagationPolicy};
use serde_json::json;

use crate::expectations::Expectations;
use crate::informers::{Change, Index, Informer, Informers};
use crate::pods;
use crate::workqueue::{Requeue, WorkQueue, run_workers};

const MANAGER: &str = "job-controller";
/// The `spec.managedBy` value naming this controller (the default when unset).
const JOB_CONTROLLER: &str = "kubernetes.io/job-controller";
/// The finalizer that keeps a finished pod until its Job has counted it.
pub const TRACKING_FINALIZER: &str = "batch.kubernetes.io/job-tracking";
/// Annotation and label carrying an Indexed Job pod's completion index.
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// Upstream's DefaultJobPodFailureBackOff and MaxJobPodFailureBackOff.
const POD_FAILURE_BACKOFF: SignedDuration = SignedDuration::from_secs(10);
const MAX_POD_FAILURE_BACKOFF: SignedDuration = SignedDuration::from_secs(360);
/// Upstream's MaxPodCreateDeletePerSync.
const MAX_CREATES_PER_SYNC: usize = 500;
/// Upstream's MaxUncountedPods: finished pods recorded before the counters are flushed.
const MAX_UNCOUNTED_PODS: usize = 500;
/// Jobs synced at once (upstream's `--concurrent-job-syncs`).
const CONCURRENT_SYNCS: usize = 5;

/// Runs the controller until the task is aborted: handlers queue keys (Jobs on one queue,
/// orphaned tracked pods on another), workers sync one key at a time each.
pub async fn run(informers: Arc<Informers>) {
    let jobs = informers.get::<Job>();
    let pods = informers.get::<Pod>();
    let owned = pods.index(pods::BY_CONTROLLER_UID, pods::controller_uid::<Pod>);
    let controller = Arc::new(Controller {
        client: informers.client().clone(),
        expectations: Expectations::default(),
        finalizer_removals: Mutex::default(),
    });
    let queue = Arc::new(WorkQueue::new("job"));
    let orphans = Arc::new(WorkQueue::new("job_orphan_pod"));

    let on_job = queue.clone();
    let orphaned_by_delete = orphans.clone();
    let job_pods = owned.clone();
    let forgetful = controller.clone();
    jobs.on_change(move |change| {
        for job in change.objects() {
            on_job.add(pods::key(&job.metadata));
        }
        if let (Some(gone), None) = (change.old, change.new) {
            // Upstream's cleanupPodFinalizers: its pods still tracked have nobody to count
            // them now.
            let uid = gone.metadata.uid.as_deref().unwrap_or("");
            forgetful.forget_removals(uid);
            for pod in job_pods.get(uid) {
                if has_tracking_finalizer(&pod) {
                    orphaned_by_delete.add(pods::key(&pod.metadata));
                }
            }
        }
    });
    let on_pod = queue.clone();
    let on_orphan = orphans.clone();
    let seen = controller.clone();
    let live_jobs = jobs.clone();
    pods.on_change(move |change| {
        seen.expectations.observe_owned(change, "Job");
        let keys = pod_change_keys(change, |namespace, owner| {
            live_jobs
                .get(namespace, &owner.name)
                .is_some_and(|job| job.metadata.uid.as_deref() == Some(owner.uid.as_str()))
        });
        for job in keys.jobs {
            on_pod.add(job);
        }
        if let Some(pod) = keys.orphan {
            on_orphan.add(pod);
        }
    });

    // Only with both caches filled: an empty pod cache would mean "create every pod".
    jobs.ready().await;
    pods.ready().await;
    let client = controller.client.clone();
    futures::future::join(
        run_workers(&queue, CONCURRENT_SYNCS, |key: String| {
            controller.sync_key(&jobs, &pods, &owned, key)
        }),
        run_workers(&orphans, 1, |key: String| {
            sync_orphan_pod(&client, &jobs, &pods, key)
        }),
    )
    .await;
}

/// What a pod's change queues.
#[derive(Debug, Default, PartialEq)]
struct PodKeys {
    /// The Jobs controlling the pod before and after the change.
    jobs: Vec<String>,
    /// The pod itself, for the orphan queue.
    orphan: Option<String>,
}

/// Upstream's addPod/updatePod/deletePod as keys: the Job that controls the pod (before and
/// after, when its controller changed), and the pod for the orphan queue when it still
/// carries the tracking finalizer but no live Job controls it (`resolves` tells whether the
/// Job a controller reference names exists with that uid).
fn pod_change_keys(
    change: &Change<'_, Pod>,
    resolves: impl Fn(&str, &OwnerReference) -> bool,
) -> PodKeys {
    let mut keys = PodKeys {
        jobs: pods::controller_keys(change, "Job"),
        orphan: None,
    };
    if let Some(pod) = change.new.filter(|p| has_tracking_finalizer(p)) {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("");
        let controlled = pods::controller_of(&pod.metadata, "Job")
            .is_some_and(|owner| resolves(namespace, owner));
        if !controlled {
            keys.orphan = Some(pods::key(&pod.metadata));
        }
    }
    keys
}

/// Upstream's syncOrphanPod: releases the pod `key` from the tracking finalizer unless a live
/// Job still controls it (one another controller manages, or one not finished, which counts
/// it itself).
async fn sync_orphan_pod(
    client: &kube::Client,
    jobs: &Informer<Job>,
    pods: &Informer<Pod>,
    key: String,
) -> Result<Requeue, kube::Error> {
    let (namespace, name) = pods::split_key(&key);
    let Some(pod) = pods.get(namespace, name) else {
        return Ok(Requeue::No);
    };
    if !has_tracking_finalizer(&pod) {
        return Ok(Requeue::No);
    }
    let controller = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true));
    if let Some(owner) = controller {
        if owner.kind != "Job" || owner.api_version != "batch/v1" {
            return Ok(Requeue::No);
        }
        let job = jobs
            .get(namespace, &owner.name)
            .filter(|j| j.metadata.uid.as_deref() == Some(owner.uid.as_str()));
        if let Some(job) = job {
            let managed_by = job.spec.as_ref().and_then(|s| s.managed_by.as_deref());
            if managed_by.is_some_and(|m| m != JOB_CONTROLLER) || finish_time(&job).is_none() {
                return Ok(Requeue::No);
            }
        }
    }
    remove_tracking_finalizer(client, &pod).await?;
    Ok(Requeue::No)
}

struct Controller {
    client: kube::Client,
    /// Pod creates and deletes not yet seen in the cache, per Job key.
    expectations: Expectations,
    /// Pods (by uid) whose tracking finalizer this controller removed and whose removal the
    /// cache does not show yet, per Job uid: they must not be counted again.
    finalizer_removals: Mutex<HashMap<String, HashSet<String>>>,
}

impl Controller {
    /// Syncs the Job `key` from the caches; returns when it wants to be looked at again.
    async fn sync_key(
        &self,
        jobs: &Informer<Job>,
        pods: &Informer<Pod>,
        owned: &Index<Pod>,
        key: String,
    ) -> Result<Requeue, kube::Error> {
        let (namespace, name) = pods::split_key(&key);
        let Some(job) = jobs.get(namespace, name) else {
            self.expectations.forget(&key);
            return Ok(Requeue::No);
        };
        let uid = job.metadata.uid.as_deref().unwrap_or("");
        let mine = owned.get(uid);
        let mine: Vec<&Pod> = mine.iter().map(|p| &**p).collect();
        let caught_up = self.expectations.satisfied_by_pods(&key, pods, namespace);
        let after = self.sync(&job, &mine, caught_up).await?;
        // Unseen writes hold creates back; their pods' events queue the Job again, the
        // expectations' timeout is the backstop.
        let backstop = (!caught_up).then(|| self.expectations.remaining(&key));
        Ok(match after.into_iter().chain(backstop).min() {
            Some(after) => Requeue::After(after),
            None => Requeue::No,
        })
    }

    /// Forgets the finalizer removals recorded for the Job `uid` (it was deleted).
    fn forget_removals(&self, uid: &str) {
        self.finalizer_removals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
    }

    /// The pods of `job_uid` whose finalizer removal is not visible yet; prunes those seen.
    fn pending_removals(&self, job_uid: &str, owned: &[&Pod]) -> HashSet<String> {
        let mut removals = self
            .finalizer_removals
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let Some(pending) = removals.get_mut(job_uid) else {
            return HashSet::new();
        };
        pending.retain(|uid| {
            owned
                .iter()
                .any(|p| p.metadata.uid.as_deref() == Some(uid) && has_tracking_finalizer(p))
        });
        pending.clone()
    }

    fn record_removal(&self, job_uid: &str, pod_uid: &str) {
        self.finalizer_removals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(job_uid.to_string())
            .or_default()
            .insert(pod_uid.to_string());
    }

    /// One Job: plan from the caches, then create and delete pods, write status, and release
    /// the finished pods' finalizers — in that order, so a pod is never released before the
    /// status that counts it is stored.
    async fn sync(
        &self,
        job: &Job,
        owned: &[&Pod],
        caught_up: bool,
    ) -> Result<Option<Duration>, kube::Error> {
        let (Some(name), Some(namespace), Some(uid)) = (
            job.metadata.name.as_deref(),
            job.metadata.namespace.as_deref(),
            job.metadata.uid.as_deref(),
        ) else {
            return Ok(None);
        };
        // Upstream's JobManagedBy: a Job another controller manages is left to it.
        let managed_by = job.spec.as_ref().and_then(|s| s.managed_by.as_deref());
        if managed_by.is_some_and(|m| m != JOB_CONTROLLER) {
            return Ok(None);
        }
        let now = Timestamp::now();
        if let Some(finished_at) = finish_time(job) {
            // Finished: release stragglers, then honour ttlSecondsAfterFinished.
            for pod in owned.iter().filter(|p| has_tracking_finalizer(p)) {
                remove_tracking_finalizer(&self.client, pod).await?;
            }
            return self.expire(job, finished_at, now).await;
        }
        let pending = self.pending_removals(uid, owned);
        let plan = plan(job, owned, now, &pending, caught_up);
        let key = pods::key(&job.metadata);
        let job_ref = JobRef::of(job);
        let pod_api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);

        for victim in &plan.delete {
            self.expectations.deleted(&key, victim);
        }
        let deletes = futures::future::join_all(plan.delete.iter().map(|victim| {
            let api = pod_api.clone();
            async move {
                pods::delete(&api, victim, &DeleteParams::default())
                    .await
                    .map(|()| victim)
            }
        }))
        .await;
        for outcome in deletes {
            match outcome {
                Ok(victim) => {
                    job_ref
                        .event(
                            &self.client,
                            "Normal",
                            "SuccessfulDelete",
                            &format!("Deleted pod: {victim}"),
                        )
                        .await
                }
                Err(err) => return Err(err),
            }
        }
        self.create_pods(job, &plan.create, &key, &job_ref).await?;

        let current = normalized(job.status.clone().unwrap_or_default());
        if plan.status != current {
            let mut updated = job.clone();
            updated.status = Some(plan.status.clone());
            let jobs: Api<Job> = Api::namespaced(self.client.clone(), namespace);
            jobs.replace_status(name, &PostParams::default(), &updated)
                .await?;
            for (kind, reason, message) in &plan.events {
                job_ref.event(&self.client, kind, reason, message).await;
            }
        }
        for pod in owned.iter().filter(|p| {
            plan.release
                .contains(p.metadata.uid.as_deref().unwrap_or(""))
        }) {
            remove_tracking_finalizer(&self.client, pod).await?;
            self.record_removal(uid, pod.metadata.uid.as_deref().unwrap_or(""));
        }
        Ok(plan.requeue_after)
    }

    /// Creates the planned pods in upstream's slow-start batches (1, 2, 4, …), stopping at
    /// the first batch with a failure.
    async fn create_pods(
        &self,
        job: &Job,
        create: &[Option<i32>],
        key: &str,
        job_ref: &JobRef,
    ) -> Result<(), kube::Error> {
        let Some(namespace) = job.metadata.namespace.as_deref() else {
            return Ok(());
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let mut remaining = create;
        let mut batch = 1;
        while !remaining.is_empty() {
            let (now, later) = remaining.split_at(batch.min(remaining.len()));
            let pods: Vec<Pod> = now.iter().map(|index| pod_for(job, *index)).collect();
            let outcomes: Vec<Result<Pod, kube::Error>> =
                futures::future::join_all(pods.iter().map(|pod| {
                    let api = api.clone();
                    async move { api.create(&PostParams::default(), pod).await }
                }))
                .await;
            let mut failure = None;
            for outcome in outcomes {
                match outcome {
                    Ok(created) => {
                        let pod_name = created.metadata.name.unwrap_or_default();
                        self.expectations.created(key, &pod_name);
                        job_ref
                            .event(
                                &self.client,
                                "Normal",
                                "SuccessfulCreate",
                                &format!("Created pod: {pod_name}"),
                            )
                            .await;
                    }
                    Err(err) => {
                        job_ref
                            .event(
                                &self.client,
                                "Warning",
                                "FailedCreate",
                                &format!("Error creating: {err}"),
                            )
                            .await;
                        failure = Some(err);
                    }
                }
            }
            if let Some(err) = failure {
                return Err(err);
            }
            remaining = later;
            batch = (batch * 2).min(MAX_CREATES_PER_SYNC);
        }
        Ok(())
    }

    /// Upstream's TTL-after-finished controller: deletes the finished Job (background
    /// propagation) once `ttlSecondsAfterFinished` has passed.
    async fn expire(
        &self,
        job: &Job,
        finished_at: Timestamp,
        now: Timestamp,
    ) -> Result<Option<Duration>, kube::Error> {
        let Some(ttl) = job.spec.as_ref().and_then(|s| s.ttl_seconds_after_finished) else {
            return Ok(None);
        };
        if job.metadata.deletion_timestamp.is_some() {
            return Ok(None);
        }
        let expires_at = plus(finished_at, SignedDuration::from_secs(i64::from(ttl)));
        if now < expires_at {
            return Ok(Some(until(now, expires_at)));
        }
        let (Some(name), Some(namespace)) = (&job.metadata.name, &job.metadata.namespace) else {
            return Ok(None);
        };
        let api: Api<Job> = Api::namespaced(self.client.clone(), namespace);
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            preconditions: Some(Preconditions {
                uid: job.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        pods::delete(&api, name, &params).await?;
        Ok(None)
    }
}

/// `t + d`, clamped to the representable range.
fn plus(t: Timestamp, d: SignedDuration) -> Timestamp {
    t.checked_add(d).unwrap_or(if d.is_negative() {
        Timestamp::MIN
    } else {
        Timestamp::MAX
    })
}

/// The time until `then`, at least a moment.
fn until(now: Timestamp, then: Timestamp) -> Duration {
    let left = then.duration_since(now);
    Duration::from_millis(u64::try_from(left.as_millis()).unwrap_or(0).max(100))
}

/// What one sync of a Job decided, executed by [`Controller::sync`].
#[derive(Debug, Default, PartialEq)]
struct Plan {
    /// The status to store (already normalized).
    status: JobStatus,
    /// Pods to create: `None` for a NonIndexed Job, the completion index for an Indexed one.
    create: Vec<Option<i32>>,
    /// Names of pods to delete.
    delete: Vec<String>,
    /// Uids of pods whose tracking finalizer goes once `status` is stored.
    release: HashSet<String>,
    /// Events to record once `status` is stored: (type, reason, message).
    events: Vec<(&'static str, &'static str, String)>,
    /// When the Job wants to be looked at again (deadline, backoff).
    requeue_after: Option<Duration>,
}

/// Upstream's syncJob as a pure function of the Job, its pods (by controller reference), the
/// time, the pods whose finalizer removal is still in flight, and whether earlier creates
/// and deletes have been observed (only then may pods be created or deleted).
fn plan(
    job: &Job,
    owned: &[&Pod],
    now: Timestamp,
    pending_removals: &HashSet<String>,
    caught_up: bool,
) -> Plan {
    let spec = job.spec.clone().unwrap_or_default();
    let previous = normalized(job.status.clone().unwrap_or_default());
    let mut status = previous.clone();
    let mut out = Plan::default();
    let indexed = spec.completion_mode.as_deref() == Some("Indexed");
    let suspended = spec.suspend == Some(true);
    let backoff_limit = spec.backoff_limit.unwrap_or(6);
    let uid_of = |p: &Pod| p.metadata.uid.clone().unwrap_or_default();
    let tracked = |p: &Pod| has_tracking_finalizer(p) && !pending_removals.contains(&uid_of(p));

    let (uncounted_succeeded, uncounted_failed) = uncounted(&previous);
    let active: Vec<&Pod> = owned
        .iter()
        .copied()
        .filter(|p| pods::is_active(p))
        .collect();
    let mut terminating = owned.iter().filter(|p| is_terminating(p)).count();
    let mut ready = active.iter().filter(|p| pods::is_ready(p)).count();
    let mut active_count = active.len();

    // Counters as upstream's getStatus: stored counts, plus uncounted uids, plus finished
    // pods still carrying the finalizer.
    let is_new = |p: &Pod| {
        let uid = uid_of(p);
        !uncounted_succeeded.contains(&uid) && !uncounted_failed.contains(&uid)
    };
    let new_failed = owned
        .iter()
        .filter(|p| tracked(p))
        .filter(|p| is_pod_failed(p) && is_new(p))
        .count();
    let failed = previous.failed.unwrap_or(0) as usize + uncounted_failed.len() + new_failed;
    let previous_indexes = parse_indexes(previous.completed_indexes.as_deref().unwrap_or(""));
    let completions = spec.completions;
    let mut succeeded_indexes = previous_indexes.clone();
    if indexed {
        for pod in owned.iter().filter(|p| tracked(p)) {
            if pods::phase(pod) == "Succeeded"
                && let Some(index) = valid_index(pod, completions)
            {
                succeeded_indexes.insert(index);
            }
        }
    }
    let succeeded = if indexed {
        succeeded_indexes.len()
    } else {
        let new_succeeded = owned
            .iter()
            .filter(|p| tracked(p))
            .filter(|p| pods::phase(p) == "Succeeded" && is_new(p))
            .count();
        previous.succeeded.unwrap_or(0) as usize + uncounted_succeeded.len() + new_succeeded
    };

    if status.start_time.is_none() && !suspended {
        status.start_time = Some(Time(now));
    }

    // The terminal condition this sync works toward, as upstream.
    let mut finished: Option<JobCondition> = find_condition(&previous, "SuccessCriteriaMet");
    if finished.is_none() {
        if let Some(target) = find_condition(&previous, "FailureTarget") {
            finished = Some(condition("Failed", &target.reason, &target.message, now));
        } else if failed > backoff_limit.max(0) as usize
            || past_backoff_limit_on_failure(&spec, &active, backoff_limit)
        {
            finished = Some(condition(
                "FailureTarget",
                &Some("BackoffLimitExceeded".into()),
                &Some("Job has reached the specified backoff limit".into()),
                now,
            ));
        } else if let Some(deadline) = active_deadline(&spec, &status, suspended) {
            if now >= deadline {
                finished = Some(condition(
                    "FailureTarget",
                    &Some("DeadlineExceeded".into()),
                    &Some("Job was active longer than specified deadline".into()),
                    now,
                ));
            } else {
                out.requeue_after = Some(until(now, deadline));
            }
        }
    }

    let mut suspend_events = Vec::new();
    if finished.is_some() {
        // Every active pod goes; the Job is finished only once they have.
        out.delete = active
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        if !caught_up {
            finished = None;
        }
        terminating += active_count;
        active_count = 0;
        ready = 0;
    } else {
        let may_manage = caught_up && job.metadata.deletion_timestamp.is_none();
        if may_manage {
            let managed = manage(
                &spec,
                &active,
                succeeded,
                &succeeded_indexes,
                indexed,
                owned,
                now,
            );
            active_count = active_count + managed.create.len() - managed.delete.len();
            terminating += managed.delete.len();
            ready = ready.saturating_sub(managed.deleted_ready);
            out.create = managed.create;
            out.delete = managed.delete;
            if let Some(wait) = managed.backoff {
                out.requeue_after = Some(out.requeue_after.map_or(wait, |r| r.min(wait)));
            }
        }
        let complete = match completions {
            None => succeeded > 0 && active_count == 0,
            Some(c) => succeeded >= c.max(0) as usize && active_count == 0,
        };
        if complete {
            finished = Some(condition(
                "SuccessCriteriaMet",
                &Some("CompletionsReached".into()),
                &Some("Reached expected number of succeeded pods".into()),
                now,
            ));
        } else if may_manage {
            let (kind, reason, message, event) = if suspended {
                ("True", "JobSuspended", "Job suspended", "Suspended")
            } else {
                ("False", "JobResumed", "Job resumed", "Resumed")
            };
            if ensure_condition(&mut status, "Suspended", kind, reason, message, now) {
                suspend_events.push(("Normal", event, message.to_string()));
                if !suspended {
                    // activeDeadlineSeconds counts continuous activity: it restarts on resume.
                    status.start_time = Some(Time(now));
                }
            }
        }
    }

    // Finished pods still carrying the finalizer: record them, then release them.
    let mut new_uncounted_succeeded = uncounted_succeeded.clone();
    let mut new_uncounted_failed = uncounted_failed.clone();
    let failing = finished
        .as_ref()
        .is_some_and(|c| c.type_ != "SuccessCriteriaMet");
    for pod in owned.iter().filter(|p| tracked(p)) {
        let uid = uid_of(pod);
        let considered_failed = is_pod_failed(pod);
        let releasable = job.metadata.deletion_timestamp.is_some()
            || finished.is_some()
            || pods::phase(pod) == "Succeeded"
            || considered_failed;
        if !releasable {
            continue;
        }
        if new_uncounted_succeeded.len() + new_uncounted_failed.len() >= MAX_UNCOUNTED_PODS {
            break;
        }
        out.release.insert(uid.clone());
        if pods::phase(pod) == "Succeeded" && !uncounted_failed.contains(&uid) {
            if !indexed {
                new_uncounted_succeeded.insert(uid);
            }
        } else if (considered_failed || failing)
            && (!indexed || valid_index(pod, completions).is_some())
        {
            new_uncounted_failed.insert(uid);
        }
    }
    // Uids whose pods no longer carry the finalizer (or are gone) move into the counters.
    let still_tracked: HashSet<String> = owned
        .iter()
        .filter(|p| tracked(p))
        .map(|p| uid_of(p))
        .collect();
    let flushed_succeeded = new_uncounted_succeeded
        .iter()
        .filter(|uid| !still_tracked.contains(*uid))
        .count();
    let flushed_failed = new_uncounted_failed
        .iter()
        .filter(|uid| !still_tracked.contains(*uid))
        .count();
    new_uncounted_succeeded.retain(|uid| still_tracked.contains(uid));
    new_uncounted_failed.retain(|uid| still_tracked.contains(uid));
    status.failed = Some(previous.failed.unwrap_or(0) + flushed_failed as i32);
    if indexed {
        status.succeeded = Some(succeeded_indexes.len() as i32);
        status.completed_indexes = Some(format_indexes(&succeeded_indexes));
    } else {
        status.succeeded = Some(previous.succeeded.unwrap_or(0) + flushed_succeeded as i32);
    }
    status.uncounted_terminated_pods = Some(UncountedTerminatedPods {
        succeeded: Some(new_uncounted_succeeded.iter().cloned().collect()),
        failed: Some(new_uncounted_failed.iter().cloned().collect()),
    });
    status.active = Some(active_count as i32);
    status.ready = Some(ready as i32);
    status.terminating = Some(terminating as i32);

    // The interim condition is stored first; the terminal one once every pod is counted and
    // none is terminating.
    let mut terminal = None;
    if let Some(target) = finished {
        let final_condition = match target.type_.as_str() {
            "FailureTarget" => {
                push_condition(&mut status, target.clone());
                condition("Failed", &target.reason, &target.message, now)
            }
            "SuccessCriteriaMet" => {
                if find_condition(&status, "SuccessCriteriaMet").is_none() {
                    push_condition(&mut status, target.clone());
                }
                condition("Complete", &target.reason, &target.message, now)
            }
            _ => target,
        };
        let all_counted = new_uncounted_succeeded.is_empty() && new_uncounted_failed.is_empty();
        if all_counted && terminating == 0 {
            terminal = Some(final_condition);
        }
    }
    out.events = suspend_events;
    if let Some(done) = terminal {
        if done.type_ == "Complete" {
            status.completion_time = Some(done.last_transition_time.clone().unwrap_or(Time(now)));
            out.events
                .push(("Normal", "Completed", "Job completed".into()));
        } else {
            let reason = done.reason.clone().unwrap_or_default();
            let message = done.message.clone().unwrap_or_default();
            out.events
                .push(("Warning", failure_reason(&reason), message));
        }
        push_condition(&mut status, done);
    }
    out.status = normalized(status);
    out
}

/// Event reasons are static upstream constants; map the few a Job can fail with.
fn failure_reason(reason: &str) -> &'static str {
    match reason {
        "BackoffLimitExceeded" => "BackoffLimitExceeded",
        "DeadlineExceeded" => "DeadlineExceeded",
        "PodFailurePolicy" => "PodFailurePolicy",
        "MaxFailedIndexesExceeded" => "MaxFailedIndexesExceeded",
        _ => "JobFailed",
    }
}

/// What upstream's manageJob decided.
struct Managed {
    create: Vec<Option<i32>>,
    delete: Vec<String>,
    deleted_ready: usize,
    backoff: Option<Duration>,
}

/// Upstream's manageJob: toward `min(parallelism, completions - succeeded)` active pods (none
/// while suspended), deleting duplicates of an index first, and creating replacements only
/// once the pod-failure backoff has passed.
fn manage(
    spec: &k8s_openapi::api::batch::v1::JobSpec,
    active: &[&Pod],
    succeeded: usize,
    succeeded_indexes: &BTreeSet<i32>,
    indexed: bool,
    owned: &[&Pod],
    now: Timestamp,
) -> Managed {
    let parallelism = spec.parallelism.unwrap_or(1).max(0) as usize;
    let suspended = spec.suspend == Some(true);
    let mut managed = Managed {
        create: Vec::new(),
        delete: Vec::new(),
        deleted_ready: 0,
        backoff: None,
    };
    let want = if suspended {
        0
    } else {
        match spec.completions {
            // Without completions, once one pod has succeeded no new ones start.
            None if succeeded > 0 => active.len(),
            None => parallelism,
            Some(c) => (c.max(0) as usize)
                .saturating_sub(succeeded)
                .min(parallelism),
        }
    };
    let mut victims: Vec<&Pod> = Vec::new();
    let mut keep: Vec<&Pod> = active.to_vec();
    if indexed {
        // Pods of an index already done, out of range, or duplicated go first.
        let mut seen = HashSet::new();
        keep.sort_by_key(|p| std::cmp::Reverse(removal_order(p)));
        let (mut valid, mut extra) = (Vec::new(), Vec::new());
        for pod in keep {
            match valid_index(pod, spec.completions) {
                Some(i) if !succeeded_indexes.contains(&i) && seen.insert(i) => valid.push(pod),
                _ => extra.push(pod),
            }
        }
        victims.extend(extra);
        keep = valid;
    }
    if keep.len() > want {
        keep.sort_by_key(|p| removal_order(p));
        let surplus = keep.len() - want;
        victims.extend(keep.drain(..surplus));
    }
    managed.deleted_ready = victims.iter().filter(|p| pods::is_ready(p)).count();
    managed.delete = victims
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    if keep.len() < want {
        let backoff = pod_failure_backoff(owned, now);
        if !backoff.is_zero() {
            managed.backoff = Some(backoff);
            return managed;
        }
        let missing = (want - keep.len()).min(MAX_CREATES_PER_SYNC);
        managed.create = if indexed {
            let busy: HashSet<i32> = keep
                .iter()
                .filter_map(|p| valid_index(p, spec.completions))
                .collect();
            (0..spec.completions.unwrap_or(0))
                .filter(|i| !succeeded_indexes.contains(i) && !busy.contains(i))
                .take(missing)
                .map(Some)
                .collect()
        } else {
            vec![None; missing]
        };
    }
    managed
}

/// Upstream's ActivePods order for removal: unscheduled, pending, not ready, then newest first.
fn removal_order(pod: &Pod) -> (bool, u8, bool, std::cmp::Reverse<Option<Timestamp>>) {
    let phase_rank = match pods::phase(pod) {
        "Pending" | "" => 0,
        "Unknown" => 1,
        _ => 2,
    };
    (
        pods::is_scheduled(pod),
        phase_rank,
        pods::is_ready(pod),
        std::cmp::Reverse(pod.metadata.creation_timestamp.as_ref().map(|t| t.0)),
    )
}

/// Upstream's pod-failure backoff: 10 s doubled per failure since the last success, capped
/// at six minutes, counted from the last failure. Zero when no wait is due.
fn pod_failure_backoff(owned: &[&Pod], now: Timestamp) -> Duration {
    let last_success = owned
        .iter()
        .filter(|p| pods::phase(p) == "Succeeded")
        .map(|p| finished_time(p))
        .max();
    let failures: Vec<Timestamp> = owned
        .iter()
        .filter(|p| is_pod_failed(p))
        .map(|p| finished_time(p))
        .filter(|t| last_success.is_none_or(|s| *t > s))
        .collect();
    let Some(last_failure) = failures.iter().max().copied() else {
        return Duration::ZERO;
    };
    let mut wait = POD_FAILURE_BACKOFF;
    for _ in 1..failures.len() {
        wait = wait.saturating_mul(2);
        if wait >= MAX_POD_FAILURE_BACKOFF {
            wait = MAX_POD_FAILURE_BACKOFF;
            break;
        }
    }
    let ends = plus(last_failure, wait);
    if now >= ends {
        Duration::ZERO
    } else {
        until(now, ends)
    }
}

/// Upstream's getFinishedTime: the last container's finish, else the Ready=False transition,
/// else the deletion time less its grace, else the creation time.
fn finished_time(pod: &Pod) -> Timestamp {
    let status = pod.status.as_ref();
    let containers = status
        .and_then(|s| s.container_statuses.as_ref())
        .filter(|c| !c.is_empty());
    if let Some(containers) = containers {
        let finishes: Option<Vec<Timestamp>> = containers
            .iter()
            .map(|c| {
                c.state
                    .as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .and_then(|t| t.finished_at.as_ref())
                    .map(|t| t.0)
            })
            .collect();
        if let Some(latest) = finishes.and_then(|f| f.into_iter().max()) {
            return latest;
        }
    }
    let ready_false = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready" && c.status == "False"))
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0);
    if let Some(at) = ready_false {
        return at;
    }
    if let Some(deleted) = &pod.metadata.deletion_timestamp {
        let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(0);
        return plus(deleted.0, SignedDuration::from_secs(-grace));
    }
    pod.metadata
        .creation_timestamp
        .as_ref()
        .map_or(Timestamp::UNIX_EPOCH, |t| t.0)
}

/// Upstream's pastBackoffLimitOnFailure: with restartPolicy OnFailure, container restarts of
/// the active pods count against backoffLimit.
fn past_backoff_limit_on_failure(
    spec: &k8s_openapi::api::batch::v1::JobSpec,
    active: &[&Pod],
    backoff_limit: i32,
) -> bool {
    let on_failure = spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        == Some("OnFailure");
    if !on_failure {
        return false;
    }
    let restarts: i32 = active
        .iter()
        .filter_map(|p| p.status.as_ref())
        .flat_map(|s| {
            s.init_container_statuses
                .iter()
                .flatten()
                .chain(s.container_statuses.iter().flatten())
        })
        .map(|c| c.restart_count)
        .sum();
    if backoff_limit == 0 {
        return restarts > 0;
    }
    restarts >= backoff_limit
}

/// When an unsuspended, started Job's activeDeadlineSeconds runs out.
fn active_deadline(
    spec: &k8s_openapi::api::batch::v1::JobSpec,
    status: &JobStatus,
    suspended: bool,
) -> Option<Timestamp> {
    let seconds = spec.active_deadline_seconds?;
    if suspended {
        return None;
    }
    let start = status.start_time.as_ref()?.0;
    Some(plus(start, SignedDuration::from_secs(seconds)))
}

/// Upstream's isPodFailed under podReplacementPolicy TerminatingOrFailed: Failed, or deleted
/// before it succeeded (so orphaned pods count as failures).
fn is_pod_failed(pod: &Pod) -> bool {
    pods::phase(pod) == "Failed"
        || (pod.metadata.deletion_timestamp.is_some() && pods::phase(pod) != "Succeeded")
}

/// Deleted but not finished yet.
fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some() && !pods::is_finished(pod)
}

fn has_tracking_finalizer(pod: &Pod) -> bool {
    pod.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == TRACKING_FINALIZER)
}

/// The pod's completion index when it is a number below `completions`.
fn valid_index(pod: &Pod, completions: Option<i32>) -> Option<i32> {
    let index: i32 = pod
        .metadata
        .annotations
        .as_ref()?
        .get(COMPLETION_INDEX)?
        .parse()
        .ok()?;
    (index >= 0 && index < completions.unwrap_or(0)).then_some(index)
}

/// The uncounted succeeded and failed uids of `status`.
fn uncounted(status: &JobStatus) -> (BTreeSet<String>, BTreeSet<String>) {
    let lists = status.uncounted_terminated_pods.clone().unwrap_or_default();
    (
        lists.succeeded.unwrap_or_default().into_iter().collect(),
        lists.failed.unwrap_or_default().into_iter().collect(),
    )
}

/// `status` with empty lists and absent counters written one way, so a stored status and a
/// computed one compare equal when they mean the same.
fn normalized(mut status: JobStatus) -> JobStatus {
    let mut lists = status.uncounted_terminated_pods.take().unwrap_or_default();
    for list in [&mut lists.succeeded, &mut lists.failed] {
        if list.as_ref().is_some_and(Vec::is_empty) {
            *list = None;
        }
        if let Some(uids) = list {
            uids.sort();
        }
    }
    status.uncounted_terminated_pods = Some(lists);
    for counter in [
        &mut status.active,
        &mut status.succeeded,
        &mut status.failed,
        &mut status.ready,
        &mut status.terminating,
    ] {
        counter.get_or_insert(0);
    }
    if status.completed_indexes.as_deref() == Some("") {
        status.completed_indexes = None;
    }
    if status.conditions.as_ref().is_some_and(Vec::is_empty) {
        status.conditions = None;
    }
    status
}

/// Upstream's newCondition: status True, probe and transition now.
fn condition(
    type_: &str,
    reason: &Option<String>,
    message: &Option<String>,
    now: Timestamp,
) -> JobCondition {
    JobCondition {
        type_: type_.into(),
        status: "True".into(),
        reason: reason.clone(),
        message: message.clone(),
        last_probe_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

/// The condition of `type_` whose status is True.
fn find_condition(status: &JobStatus, type_: &str) -> Option<JobCondition> {
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == type_ && c.status == "True")
        .cloned()
}

fn push_condition(status: &mut JobStatus, condition: JobCondition) {
    status
        .conditions
        .get_or_insert_with(Vec::new)
        .push(condition);
}

/// Upstream's ensureJobConditionStatus: updates an existing condition whose status differs,
/// adds a missing one only when True. Returns whether anything changed.
fn ensure_condition(
    status: &mut JobStatus,
    type_: &str,
    value: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> bool {
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    if let Some(existing) = conditions.iter_mut().find(|c| c.type_ == type_) {
        if existing.status == value {
            return false;
        }
        existing.status = value.into();
        existing.reason = Some(reason.into());
        existing.message = Some(message.into());
        existing.last_probe_time = Some(Time(now));
        existing.last_transition_time = Some(Time(now));
        return true;
    }
    if value == "True" {
        conditions.push(condition(
            type_,
            &Some(reason.into()),
            &Some(message.into()),
            now,
        ));
        return true;
    }
    false
}

/// When a finished Job finished: its Complete or Failed condition's transition.
pub fn finish_time(job: &Job) -> Option<Timestamp> {
    job.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        .map(|c| {
            c.last_transition_time
                .as_ref()
                .map_or(Timestamp::UNIX_EPOCH, |t| t.0)
        })
}

/// Upstream's completedIndexes text: ascending, runs of three or more as `a-b`, e.g.
/// `0-2,4,6,7`.
fn format_indexes(indexes: &BTreeSet<i32>) -> String {
    let mut runs: Vec<(i32, i32)> = Vec::new();
    for &i in indexes {
        match runs.last_mut() {
            Some((_, last)) if *last + 1 == i => *last = i,
            _ => runs.push((i, i)),
        }
    }
    runs.iter()
        .map(|&(first, last)| match last - first {
            0 => first.to_string(),
            1 => format!("{first},{last}"),
            _ => format!("{first}-{last}"),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Parses [`format_indexes`]' text, skipping what does not parse.
fn parse_indexes(text: &str) -> BTreeSet<i32> {
    let mut indexes = BTreeSet::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((first, last)) => {
                if let (Ok(first), Ok(last)) = (first.parse::<i32>(), last.parse::<i32>()) {
                    indexes.extend(first..=last);
                }
            }
            None => {
                if let Ok(i) = part.parse() {
                    indexes.insert(i);
                }
            }
        }
    }
    indexes
}

/// A pod of `job` (for completion `index` when Indexed): its template, the tracking
/// finalizer, and for Indexed Jobs the index annotation, label, hostname and
/// `JOB_COMPLETION_INDEX` variable.
fn pod_for(job: &Job, index: Option<i32>) -> Pod {
    let spec = job.spec.clone().unwrap_or_default();
    let name = job.metadata.name.as_deref().unwrap_or("");
    let namespace = job.metadata.namespace.as_deref().unwrap_or("");
    let owner = pods::controller_reference("batch/v1", "Job", &job.metadata);
    let generate_name = match index {
        Some(i) => format!("{name}-{i}-"),
        None => format!("{name}-"),
    };
    let mut pod = pods::from_template(&spec.template, namespace, None, &generate_name, owner);
    pod.metadata
        .finalizers
        .get_or_insert_with(Vec::new)
        .push(TRACKING_FINALIZER.into());
    if let Some(i) = index {
        let text = i.to_string();
        pod.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(COMPLETION_INDEX.into(), text.clone());
        pod.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(COMPLETION_INDEX.into(), text);
        if let Some(pod_spec) = pod.spec.as_mut() {
            if pod_spec.hostname.as_deref().is_none_or(str::is_empty) {
                pod_spec.hostname = Some(format!("{name}-{i}"));
            }
            let containers = pod_spec.containers.iter_mut().chain(
                pod_spec
                    .init_containers
                    .iter_mut()
                    .flat_map(|c| c.iter_mut()),
            );
            for container in containers {
                let env = container.env.get_or_insert_with(Vec::new);
                if !env.iter().any(|e| e.name == "JOB_COMPLETION_INDEX") {
                    env.push(EnvVar {
                        name: "JOB_COMPLETION_INDEX".into(),
                        value: None,
                        value_from: Some(EnvVarSource {
                            field_ref: Some(ObjectFieldSelector {
                                api_version: None,
                                field_path: format!("metadata.annotations['{COMPLETION_INDEX}']"),
                            }),
                            ..Default::default()
                        }),
                    });
                }
            }
        }
    }
    pod
}

/// Releases `pod` from the tracking finalizer (strategic merge, as upstream).
async fn remove_tracking_finalizer(client: &kube::Client, pod: &Pod) -> Result<(), kube::Error> {
    let (Some(name), Some(namespace)) = (&pod.metadata.name, &pod.metadata.namespace) else {
        return Ok(());
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let patch = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [TRACKING_FINALIZER]}});
    match api
        .patch(name, &pods::manager(MANAGER), &Patch::Strategic(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(err) => Err(err),
    }
}

/// An object events are recorded about.
pub(crate) struct JobRef {
    api_version: &'static str,
    kind: &'static str,
    component: &'static str,
    metadata: ObjectMeta,
}

impl JobRef {
    fn of(job: &Job) -> Self {
        Self::new("batch/v1", "Job", MANAGER, &job.metadata)
    }

    /// `kind` in `api_version` with `metadata`, recorded by `component`.
    pub(crate) fn new(
        api_version: &'static str,
        kind: &'static str,
        component: &'static str,
        metadata: &ObjectMeta,
    ) -> Self {
        Self {
            api_version,
            kind,
            component,
            metadata: metadata.clone(),
        }
    }

    /// Records a core/v1 Event ([`crate::events::create`]).
    pub(crate) async fn event(
        &self,
        client: &kube::Client,
        type_: &str,
        reason: &str,
        message: &str,
    ) {
        let object = crate::events::EventRef {
            api_version: self.api_version,
            kind: self.kind,
            metadata: &self.metadata,
        };
        crate::events::create(client, self.component, object, type_, reason, message).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::batch::v1::JobSpec;
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus, PodTemplateSpec};

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn job(completions: Option<i32>, parallelism: i32, indexed: bool) -> Job {
        Job {
            metadata: ObjectMeta {
                name: Some("pi".into()),
                namespace: Some("default".into()),
                uid: Some("job-uid".into()),
                ..Default::default()
            },
            spec: Some(JobSpec {
                completions,
                parallelism: Some(parallelism),
                backoff_limit: Some(2),
                completion_mode: Some(if indexed { "Indexed" } else { "NonIndexed" }.into()),
                template: PodTemplateSpec {
                    metadata: None,
                    spec: Some(PodSpec {
                        restart_policy: Some("Never".into()),
                        ..Default::default()
                    }),
                },
                ..Default::default()
            }),
            status: None,
        }
    }

    /// A pod of the job: `phase`, tracked (finalizer) or not, terminating or not.
    fn pod(uid: &str, phase: &str, tracked: bool, index: Option<i32>) -> Pod {
        let mut pod = Pod {
            metadata: ObjectMeta {
                name: Some(format!("pi-{uid}")),
                namespace: Some("default".into()),
                uid: Some(uid.into()),
                creation_timestamp: Some(Time(at(0))),
                finalizers: tracked.then(|| vec![TRACKING_FINALIZER.into()]),
                ..Default::default()
            },
            spec: Some(PodSpec::default()),
            status: Some(PodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
        };
        if let Some(i) = index {
            pod.metadata.annotations = Some([(COMPLETION_INDEX.into(), i.to_string())].into());
        }
        pod
    }

    fn types(status: &JobStatus) -> Vec<String> {
        status
            .conditions
            .iter()
            .flatten()
            .map(|c| format!("{}={}", c.type_, c.reason.clone().unwrap_or_default()))
            .collect()
    }

    #[test]
    fn completed_indexes_print_as_upstream() {
        let cases: &[(&[i32], &str)] = &[
            (&[], ""),
            (&[0], "0"),
            (&[1, 2], "1,2"),
            (&[0, 1, 2, 4], "0-2,4"),
            (&[0, 2, 3, 4, 6, 7], "0,2-4,6,7"),
        ];
        for (indexes, text) in cases {
            let set: BTreeSet<i32> = indexes.iter().copied().collect();
            assert_eq!(format_indexes(&set), *text);
            assert_eq!(parse_indexes(text), set, "{text}");
        }
    }

    #[test]
    fn sync_steps_toward_completions_within_parallelism() {
        struct Case {
            name: &'static str,
            job: Job,
            pods: Vec<Pod>,
            caught_up: bool,
            creates: Vec<Option<i32>>,
            deletes: usize,
            conditions: Vec<&'static str>,
        }
        let mut counted_two = job(Some(3), 2, false);
        counted_two.status = Some(JobStatus {
            succeeded: Some(2),
            ..Default::default()
        });
        let mut indexed_done = job(Some(3), 3, true);
        indexed_done.status = Some(JobStatus {
            succeeded: Some(3),
            completed_indexes: Some("0-2".into()),
            ..Default::default()
        });
        let cases = vec![
            Case {
                name: "a new job starts parallelism pods",
                job: job(Some(5), 2, false),
                pods: vec![],
                caught_up: true,
                creates: vec![None, None],
                deletes: 0,
                conditions: vec![],
            },
            Case {
                name: "no creates while earlier ones are unseen",
                job: job(Some(5), 2, false),
                pods: vec![],
                caught_up: false,
                creates: vec![],
                deletes: 0,
                conditions: vec![],
            },
            Case {
                name: "never more than the completions left",
                job: counted_two,
                pods: vec![],
                caught_up: true,
                creates: vec![None],
                deletes: 0,
                conditions: vec![],
            },
            Case {
                name: "surplus active pods are deleted",
                job: job(Some(5), 1, false),
                pods: vec![
                    pod("a", "Running", true, None),
                    pod("b", "Pending", true, None),
                ],
                caught_up: true,
                creates: vec![],
                deletes: 1,
                conditions: vec![],
            },
            Case {
                name: "indexed jobs create the lowest free indexes",
                job: job(Some(4), 2, true),
                pods: vec![pod("a", "Running", true, Some(0))],
                caught_up: true,
                creates: vec![Some(1)],
                deletes: 0,
                conditions: vec![],
            },
            Case {
                name: "an index's duplicate is deleted",
                job: job(Some(4), 4, true),
                pods: vec![
                    pod("a", "Running", true, Some(0)),
                    pod("b", "Running", true, Some(0)),
                ],
                caught_up: true,
                creates: vec![Some(1), Some(2), Some(3)],
                deletes: 1,
                conditions: vec![],
            },
            Case {
                name: "all indexes done: success criteria met",
                job: indexed_done,
                pods: vec![],
                caught_up: true,
                creates: vec![],
                deletes: 0,
                conditions: vec![
                    "SuccessCriteriaMet=CompletionsReached",
                    "Complete=CompletionsReached",
                ],
            },
        ];
        for case in cases {
            let pods: Vec<&Pod> = case.pods.iter().collect();
            let plan = plan(&case.job, &pods, at(100), &HashSet::new(), case.caught_up);
            assert_eq!(plan.create, case.creates, "{}", case.name);
            assert_eq!(plan.delete.len(), case.deletes, "{}", case.name);
            assert_eq!(types(&plan.status), case.conditions, "{}", case.name);
        }
    }

    #[test]
    fn finished_pods_are_recorded_before_release_then_counted() {
        let job1 = job(Some(2), 2, false);
        let done = pod("a", "Succeeded", true, None);
        let running = pod("b", "Running", true, None);
        // Pass 1: the succeeded pod is recorded as uncounted and released.
        let plan1 = plan(&job1, &[&done, &running], at(1), &HashSet::new(), true);
        let uncounted1 = plan1
            .status
            .uncounted_terminated_pods
            .clone()
            .unwrap_or_default();
        assert_eq!(uncounted1.succeeded, Some(vec!["a".to_string()]));
        assert_eq!(plan1.status.succeeded, Some(0));
        assert!(plan1.release.contains("a"));
        assert_eq!(plan1.status.active, Some(1));
        assert!(
            plan1.create.is_empty(),
            "one active, one done: nothing to add"
        );

        // Pass 2: its finalizer is gone; it moves into the counter, once.
        let mut job2 = job1.clone();
        job2.status = Some(plan1.status.clone());
        let released = pod("a", "Succeeded", false, None);
        let plan2 = plan(&job2, &[&released, &running], at(2), &HashSet::new(), true);
        assert_eq!(plan2.status.succeeded, Some(1));
        assert_eq!(uncounted(&plan2.status), (BTreeSet::new(), BTreeSet::new()));

        // A removal still in flight (the cache shows the finalizer) is not counted again.
        let pending: HashSet<String> = ["a".to_string()].into();
        let mut job3 = job1.clone();
        job3.status = plan2.status.clone().into();
        let plan3 = plan(&job3, &[&done, &running], at(3), &pending, true);
        assert_eq!(plan3.status.succeeded, Some(1));
        assert_eq!(uncounted(&plan3.status).0, BTreeSet::new());
    }

    #[test]
    fn failures_past_the_backoff_limit_fail_the_job_in_two_steps() {
        let mut failing = job(Some(1), 1, false);
        if let Some(spec) = failing.spec.as_mut() {
            spec.backoff_limit = Some(1);
        }
        failing.status = Some(JobStatus {
            failed: Some(1),
            ..Default::default()
        });
        let second = pod("b", "Failed", true, None);
        let plan1 = plan(&failing, &[&second], at(50), &HashSet::new(), true);
        assert_eq!(
            types(&plan1.status),
            vec!["FailureTarget=BackoffLimitExceeded"]
        );
        assert!(plan1.create.is_empty());
        assert!(plan1.release.contains("b"));

        let mut counted = failing.clone();
        counted.status = Some(plan1.status.clone());
        let released = pod("b", "Failed", false, None);
        let plan2 = plan(&counted, &[&released], at(51), &HashSet::new(), true);
        assert_eq!(
            types(&plan2.status),
            vec![
                "FailureTarget=BackoffLimitExceeded",
                "Failed=BackoffLimitExceeded"
            ]
        );
        assert_eq!(plan2.status.failed, Some(2));
        assert_eq!(
            plan2.events,
            vec![(
                "Warning",
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit".to_string()
            )]
        );
    }

    #[test]
    fn a_failure_delays_the_replacement_by_the_backoff() {
        let mut failed = pod("a", "Failed", false, None);
        failed.status = Some(PodStatus {
            phase: Some("Failed".into()),
            conditions: Some(vec![k8s_openapi::api::core::v1::PodCondition {
                type_: "Ready".into(),
                status: "False".into(),
                last_transition_time: Some(Time(at(0))),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let cases = [
            (vec![&failed], at(3), Duration::from_secs(7)),
            (vec![&failed], at(10), Duration::ZERO),
            (vec![&failed, &failed], at(3), Duration::from_secs(17)),
        ];
        for (owned, now, wait) in cases {
            assert_eq!(pod_failure_backoff(&owned, now), wait);
        }
        let mut retried = job(Some(1), 1, false);
        retried.status = Some(JobStatus {
            failed: Some(1),
            ..Default::default()
        });
        let plan = plan(&retried, &[&failed], at(3), &HashSet::new(), true);
        assert!(plan.create.is_empty());
        assert_eq!(plan.requeue_after, Some(Duration::from_secs(7)));
    }

    #[test]
    fn an_expired_deadline_deletes_active_pods_and_fails_the_job() {
        let mut limited = job(Some(1), 1, false);
        if let Some(spec) = limited.spec.as_mut() {
            spec.active_deadline_seconds = Some(30);
        }
        limited.status = Some(JobStatus {
            start_time: Some(Time(at(0))),
            ..Default::default()
        });
        let running = pod("a", "Running", true, None);
        let early = plan(&limited, &[&running], at(10), &HashSet::new(), true);
        assert_eq!(early.requeue_after, Some(Duration::from_secs(20)));
        assert!(types(&early.status).is_empty());

        let late = plan(&limited, &[&running], at(31), &HashSet::new(), true);
        assert_eq!(late.delete, vec!["pi-a".to_string()]);
        assert_eq!(types(&late.status), vec!["FailureTarget=DeadlineExceeded"]);
        assert_eq!(late.status.terminating, Some(1));
        assert_eq!(late.status.active, Some(0));
        assert!(late.release.contains("a"));
    }

    #[test]
    fn suspending_deletes_pods_and_sets_the_condition() {
        let mut paused = job(Some(3), 2, false);
        if let Some(spec) = paused.spec.as_mut() {
            spec.suspend = Some(true);
        }
        let running = pod("a", "Running", true, None);
        let plan = plan(&paused, &[&running], at(5), &HashSet::new(), true);
        assert_eq!(plan.delete, vec!["pi-a".to_string()]);
        assert_eq!(types(&plan.status), vec!["Suspended=JobSuspended"]);
        assert_eq!(plan.status.start_time, None);
    }

    #[test]
    fn a_pod_change_queues_its_job_and_an_orphaned_tracked_pod_itself() {
        let mut owned = pod("a", "Running", true, None);
        owned.metadata.owner_references = Some(vec![pods::controller_reference(
            "batch/v1",
            "Job",
            &job(Some(1), 1, false).metadata,
        )]);
        let added = Change {
            old: None,
            new: Some(&owned),
        };
        assert_eq!(
            pod_change_keys(&added, |_, owner| owner.uid == "job-uid"),
            PodKeys {
                jobs: vec!["default/pi".into()],
                orphan: None,
            }
        );
        // Its Job is gone: the pod also goes on the orphan queue to lose the finalizer.
        let orphaned = pod_change_keys(&added, |_, _| false);
        assert_eq!(orphaned.jobs, vec!["default/pi".to_string()]);
        assert_eq!(orphaned.orphan.as_deref(), Some("default/pi-a"));
        // A deleted pod queues its Job; there is no pod left to release.
        let deleted = Change {
            old: Some(&owned),
            new: None,
        };
        assert_eq!(pod_change_keys(&deleted, |_, _| false).orphan, None);
        assert_eq!(
            pod_change_keys(&deleted, |_, _| false).jobs,
            vec!["default/pi".to_string()]
        );
        // A pod of no Job, without the finalizer, queues nothing.
        let stray = pod("b", "Running", false, None);
        let touched = Change {
            old: Some(&stray),
            new: Some(&stray),
        };
        assert_eq!(pod_change_keys(&touched, |_, _| true), PodKeys::default());
    }

    #[test]
    fn indexed_pods_carry_their_index() {
        let pod = pod_for(&job(Some(3), 3, true), Some(2));
        assert_eq!(pod.metadata.generate_name.as_deref(), Some("pi-2-"));
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations.get(COMPLETION_INDEX).map(String::as_str),
            Some("2")
        );
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get(COMPLETION_INDEX).map(String::as_str), Some("2"));
        assert_eq!(
            pod.spec.as_ref().and_then(|s| s.hostname.as_deref()),
            Some("pi-2")
        );
        assert_eq!(
            pod.metadata.finalizers,
            Some(vec![TRACKING_FINALIZER.to_string()])
        );
    }
}
