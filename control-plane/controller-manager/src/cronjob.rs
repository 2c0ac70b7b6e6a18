//! The CronJob controller (upstream `pkg/controller/cronjob`, ControllerV2, a pure API client):
//! creates a Job named `<cronjob>-<scheduled minutes since the epoch>` at each time its
//! schedule (5-field cron or a descriptor, in `spec.timeZone` or a `CRON_TZ=` prefix) comes
//! due, honouring `startingDeadlineSeconds`, `concurrencyPolicy` and `suspend`; keeps
//! `status.active`, `lastScheduleTime` and `lastSuccessfulTime`; deletes finished Jobs beyond
//! the history limits; and wakes at the next schedule time rather than on a coarse resync.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use k8s_openapi::api::batch::v1::{CronJob, CronJobStatus, Job};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams, PropagationPolicy};

use crate::handlers;
use crate::informers::{Index, Informer, Informers};
use crate::job::JobRef;
use crate::pods;
use crate::workqueue::{Requeue, WorkQueue, run_workers};

const MANAGER: &str = "cronjob-controller";
/// The annotation carrying a Job's scheduled time (RFC 3339 in the CronJob's time zone).
pub const SCHEDULED_TIMESTAMP: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";
/// Upstream's nextScheduleDelta: wake a moment after the schedule time, not just before.
const NEXT_SCHEDULE_DELTA: Duration = Duration::from_millis(100);

/// CronJobs synced at once (upstream's `--concurrent-cron-job-syncs`).
const CONCURRENT_SYNCS: usize = 5;

/// Runs the controller until the task is aborted: a change to a CronJob, or to a Job it
/// controls, queues the CronJob's key; a sync requeues it for just after its next schedule
/// time, which no event announces.
pub async fn run(informers: Arc<Informers>) {
    let cronjobs = informers.get::<CronJob>();
    let jobs = informers.get::<Job>();
    let children = jobs.index(pods::BY_CONTROLLER_UID, pods::controller_uid::<Job>);
    let controller = Arc::new(Controller {
        client: informers.client().clone(),
        recorded: Mutex::default(),
    });
    let queue = Arc::new(WorkQueue::new("cronjob"));
    let on_cronjob = queue.clone();
    let forgetful = controller.clone();
    cronjobs.on_change(move |change| {
        for cronjob in change.objects() {
            on_cronjob.add(pods::key(&cronjob.metadata));
        }
        if let (Some(gone), None) = (change.old, change.new) {
            forgetful
                .recorded
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(gone.metadata.uid.as_deref().unwrap_or(""));
        }
    });
    // Upstream's addJob/updateJob/deleteJob: the CronJobs controlling it before and after.
    handlers::queue_controller(&jobs, &queue, "CronJob");
    cronjobs.ready().await;
    jobs.ready().await;
    run_workers(&queue, CONCURRENT_SYNCS, |key: String| {
        controller.sync_key(&cronjobs, &children, key)
    })
    .await
}

struct Controller {
    client: kube::Client,
    /// Warning events already recorded per CronJob uid, so a condition that lasts (a bad
    /// schedule, a Forbid skip) is reported once per occurrence, not on every pass.
    recorded: Mutex<HashMap<String, HashSet<String>>>,
}

/// A CronJob's sync failed.
#[derive(Debug, thiserror::Error)]
enum SyncError {
    #[error("api request failed")]
    Api(#[from] kube::Error),
    #[error("job {name} could not be replaced")]
    Replace {
        name: String,
        #[source]
        source: kube::Error,
    },
}

impl Controller {
    /// Syncs the CronJob `key` from the caches.
    async fn sync_key(
        &self,
        cronjobs: &Informer<CronJob>,
        children: &Index<Job>,
        key: String,
    ) -> Result<Requeue, SyncError> {
        let (namespace, name) = pods::split_key(&key);
        let Some(cronjob) = cronjobs.get(namespace, name) else {
            return Ok(Requeue::No);
        };
        let mine = children.get(cronjob.metadata.uid.as_deref().unwrap_or(""));
        let mine: Vec<&Job> = mine.iter().map(|j| &**j).collect();
        Ok(match self.sync(&cronjob, &mine).await? {
            Some(after) => Requeue::After(after),
            None => Requeue::No,
        })
    }

    /// Records an event, once per CronJob for `once` events already recorded.
    async fn event(&self, cronjob: &CronJob, type_: &str, reason: &str, message: &str, once: bool) {
        if once {
            let uid = cronjob.metadata.uid.clone().unwrap_or_default();
            let fresh = self
                .recorded
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(uid)
                .or_default()
                .insert(format!("{reason}|{message}"));
            if !fresh {
                return;
            }
        }
        JobRef::new("batch/v1", "CronJob", MANAGER, &cronjob.metadata)
            .event(&self.client, type_, reason, message)
            .await;
    }

    /// Upstream's sync: history cleanup, then syncCronJob, then one status write.
    async fn sync(
        &self,
        cronjob: &CronJob,
        children: &[&Job],
    ) -> Result<Option<Duration>, SyncError> {
        let (Some(name), Some(namespace)) = (&cronjob.metadata.name, &cronjob.metadata.namespace)
        else {
            return Ok(None);
        };
        let mut status = cronjob.status.clone().unwrap_or_default();
        let mut changed = self
            .cleanup_finished_jobs(cronjob, children, &mut status)
            .await?;
        let (requeue, synced) = self.sync_cronjob(cronjob, children, &mut status).await?;
        changed |= synced;
        if changed {
            // An empty list is omitted, as upstream's omitempty does.
            if status.active.as_ref().is_some_and(Vec::is_empty) {
                status.active = None;
            }
            let mut updated = cronjob.clone();
            updated.status = Some(status);
            let api: Api<CronJob> = Api::namespaced(self.client.clone(), namespace);
            api.replace_status(name, &PostParams::default(), &updated)
                .await?;
        }
        Ok(requeue)
    }

    /// Upstream's cleanupFinishedJobs: deletes the oldest finished Jobs beyond
    /// successfulJobsHistoryLimit and failedJobsHistoryLimit.
    async fn cleanup_finished_jobs(
        &self,
        cronjob: &CronJob,
        children: &[&Job],
        status: &mut CronJobStatus,
    ) -> Result<bool, SyncError> {
        let Some(spec) = cronjob.spec.as_ref() else {
            return Ok(false);
        };
        let mut changed = false;
        for (condition, limit) in [
            ("Complete", spec.successful_jobs_history_limit),
            ("Failed", spec.failed_jobs_history_limit),
        ] {
            let Some(limit) = limit else { continue };
            let finished: Vec<&Job> = children
                .iter()
                .copied()
                .filter(|j| finished_condition(j) == Some(condition))
                .filter(|j| j.metadata.deletion_timestamp.is_none())
                .collect();
            for job in oldest_beyond(finished, limit.max(0) as usize) {
                self.delete_job(cronjob, job, status).await?;
                changed = true;
            }
        }
        Ok(changed)
    }

    /// Upstream's deleteJob: background deletion, out of the active list, an event.
    async fn delete_job(
        &self,
        cronjob: &CronJob,
        job: &Job,
        status: &mut CronJobStatus,
    ) -> Result<(), kube::Error> {
        let (Some(name), Some(namespace)) = (&job.metadata.name, &job.metadata.namespace) else {
            return Ok(());
        };
        let api: Api<Job> = Api::namespaced(self.client.clone(), namespace);
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        if let Err(err) = pods::delete(&api, name, &params).await {
            self.event(
                cronjob,
                "Warning",
                "FailedDelete",
                &format!("Deleted job: {err}"),
                false,
            )
            .await;
            return Err(err);
        }
        remove_active(status, job.metadata.uid.as_deref().unwrap_or(""));
        self.event(
            cronjob,
            "Normal",
            "SuccessfulDelete",
            &format!("Deleted job {name}"),
            false,
        )
        .await;
        Ok(())
    }

    /// Upstream's syncCronJob: reconcile the active list with the Jobs, then create the Job
    /// of the most recent unmet schedule time. Returns when to look again and whether the
    /// status changed.
    async fn sync_cronjob(
        &self,
        cronjob: &CronJob,
        children: &[&Job],
        status: &mut CronJobStatus,
    ) -> Result<(Option<Duration>, bool), SyncError> {
        let now = Utc::now();
        let mut changed = false;
        let namespace = cronjob.metadata.namespace.as_deref().unwrap_or("");
        let cronjobs: Api<CronJob> = Api::namespaced(self.client.clone(), namespace);
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), namespace);
        for job in children {
            let uid = job.metadata.uid.as_deref().unwrap_or("");
            let job_name = job.metadata.name.as_deref().unwrap_or("");
            let found = is_active(status, uid);
            let finished = finished_condition(job);
            if !found && finished.is_none() {
                // The cache may trail this controller's own status write: ask the server.
                let live = cronjobs
                    .get_opt(cronjob.metadata.name.as_deref().unwrap_or(""))
                    .await?;
                let live_status = live.and_then(|c| c.status).unwrap_or_default();
                if !is_active(&live_status, uid) {
                    let message = format!(
                        "Saw a job that the controller did not create or forgot: {job_name}"
                    );
                    self.event(cronjob, "Warning", "UnexpectedJob", &message, true)
                        .await;
                }
            } else if found && let Some(condition) = finished {
                remove_active(status, uid);
                let message = format!("Saw completed job: {job_name}, condition: {condition}");
                self.event(cronjob, "Normal", "SawCompletedJob", &message, false)
                    .await;
                changed = true;
            }
            if finished == Some("Complete")
                && let Some(completed) = job.status.as_ref().and_then(|s| s.completion_time.clone())
                && status
                    .last_successful_time
                    .as_ref()
                    .is_none_or(|t| t.0 < completed.0)
            {
                status.last_successful_time = Some(completed);
                changed = true;
            }
        }
        // Active Jobs that are gone (asked of the server, not the cache) leave the list.
        let known: HashSet<&str> = children
            .iter()
            .filter_map(|j| j.metadata.uid.as_deref())
            .collect();
        let missing: Vec<ObjectReference> = status
            .active
            .iter()
            .flatten()
            .filter(|r| !known.contains(r.uid.as_deref().unwrap_or("")))
            .cloned()
            .collect();
        for reference in missing {
            let job_name = reference.name.clone().unwrap_or_default();
            if jobs.get_opt(&job_name).await?.is_none() {
                let message = format!("Active job went missing: {job_name}");
                self.event(cronjob, "Normal", "MissingJob", &message, false)
                    .await;
                remove_active(status, reference.uid.as_deref().unwrap_or(""));
                changed = true;
            }
        }
        if cronjob.metadata.deletion_timestamp.is_some() {
            return Ok((None, changed));
        }
        let Some(spec) = cronjob.spec.as_ref() else {
            return Ok((None, changed));
        };
        if let Some(zone) = spec.time_zone.as_deref()
            && let Err(err) = load_location(zone)
        {
            let message = format!("invalid timeZone: {zone:?}: {err}");
            self.event(cronjob, "Warning", "UnknownTimeZone", &message, true)
                .await;
            return Ok((None, changed));
        }
        if spec.suspend == Some(true) {
            return Ok((None, changed));
        }
        let schedule =
            match Schedule::parse(&format_schedule(&spec.schedule, spec.time_zone.as_deref())) {
                Ok(schedule) => schedule,
                Err(err) => {
                    let message = format!("unparseable schedule: {:?} : {err}", spec.schedule);
                    self.event(cronjob, "Warning", "UnparseableSchedule", &message, true)
                        .await;
                    return Ok((None, changed));
                }
            };
        let times = ScheduleTimes {
            created: to_chrono(cronjob.metadata.creation_timestamp.as_ref()).unwrap_or(now),
            last_scheduled: to_chrono(status.last_schedule_time.as_ref()),
            starting_deadline_seconds: spec.starting_deadline_seconds,
        };
        let scheduled = match times.most_recent(&schedule, now, true) {
            Ok(recent) => {
                if recent.missed == Missed::Many {
                    self.event(
                        cronjob,
                        "Warning",
                        "TooManyMissedTimes",
                        "too many missed start times. Set or decrease .spec.startingDeadlineSeconds or check clock skew",
                        true,
                    )
                    .await;
                }
                recent.time
            }
            Err(err) => {
                let message = format!("invalid schedule: {} : {err}", spec.schedule);
                self.event(cronjob, "Warning", "InvalidSchedule", &message, true)
                    .await;
                return Ok((None, changed));
            }
        };
        // `times` with this pass's outcome, for the next wake-up.
        let requeue = |status: &CronJobStatus| {
            let after = ScheduleTimes {
                last_scheduled: to_chrono(status.last_schedule_time.as_ref()),
                ..times.clone()
            };
            Some(after.next_wake(&schedule, now))
        };
        let Some(scheduled) = scheduled else {
            return Ok((requeue(status), changed));
        };
        if let Some(deadline) = spec.starting_deadline_seconds
            && scheduled + chrono::Duration::seconds(deadline) < now
        {
            let message = format!(
                "Missed scheduled time to start a job: {}",
                scheduled.format("%a, %d %b %Y %H:%M:%S %z")
            );
            self.event(cronjob, "Warning", "MissSchedule", &message, true)
                .await;
            return Ok((requeue(status), changed));
        }
        let cronjob_name = cronjob.metadata.name.as_deref().unwrap_or("");
        let job_name = job_name(cronjob_name, scheduled);
        let already = status
            .active
            .iter()
            .flatten()
            .any(|r| r.name.as_deref() == Some(&job_name))
            || to_chrono(status.last_schedule_time.as_ref()) == Some(scheduled);
        if already {
            return Ok((requeue(status), changed));
        }
        let active_count = status.active.as_ref().map_or(0, Vec::len);
        match spec.concurrency_policy.as_deref() {
            Some("Forbid") if active_count > 0 => {
                let message = "Not starting job because prior execution is running and concurrency policy is Forbid";
                self.event(cronjob, "Normal", "JobAlreadyActive", message, true)
                    .await;
                return Ok((requeue(status), changed));
            }
            Some("Replace") => {
                for reference in status.active.clone().unwrap_or_default() {
                    let running_name = reference.name.clone().unwrap_or_default();
                    let running =
                        jobs.get(&running_name)
                            .await
                            .map_err(|source| SyncError::Replace {
                                name: running_name.clone(),
                                source,
                            })?;
                    self.delete_job(cronjob, &running, status)
                        .await
                        .map_err(|source| SyncError::Replace {
                            name: running_name,
                            source,
                        })?;
                    changed = true;
                }
            }
            _ => {}
        }
        let zone = spec
            .time_zone
            .as_deref()
            .map(load_location)
            .transpose()
            .ok()
            .flatten();
        let job = job_from_template(cronjob, scheduled, zone.unwrap_or(Tz::UTC));
        let created = match jobs.create(&PostParams::default(), &job).await {
            Ok(created) => {
                let message = format!("Created job {job_name}");
                self.event(cronjob, "Normal", "SuccessfulCreate", &message, false)
                    .await;
                created
            }
            Err(kube::Error::Api(response)) if response.code == 409 => {
                // Made by an earlier pass whose status write this cache has not seen.
                let existing = jobs.get(&job_name).await?;
                let ours = pods::controller_of(&existing.metadata, "CronJob")
                    .is_some_and(|o| Some(&o.uid) == cronjob.metadata.uid.as_ref());
                let uid = existing.metadata.uid.as_deref().unwrap_or("");
                if !ours || is_active(status, uid) {
                    // No resync comes back to it: the next schedule time is looked at.
                    return Ok((requeue(status), changed));
                }
                existing
            }
            Err(err) => {
                let message = format!("Error creating job: {err}");
                self.event(cronjob, "Warning", "FailedCreate", &message, false)
                    .await;
                return Err(err.into());
            }
        };
        status
            .active
            .get_or_insert_with(Vec::new)
            .push(ObjectReference {
                api_version: Some("batch/v1".into()),
                kind: Some("Job".into()),
                name: created.metadata.name.clone(),
                namespace: created.metadata.namespace.clone(),
                uid: created.metadata.uid.clone(),
                resource_version: created.metadata.resource_version.clone(),
                ..Default::default()
            });
        status.last_schedule_time = Some(Time(to_jiff(scheduled)));
        Ok((requeue(status), true))
    }
}

fn is_active(status: &CronJobStatus, uid: &str) -> bool {
    status
        .active
        .iter()
        .flatten()
        .any(|r| r.uid.as_deref() == Some(uid))
}

fn remove_active(status: &mut CronJobStatus, uid: &str) {
    if let Some(active) = status.active.as_mut() {
        active.retain(|r| r.uid.as_deref() != Some(uid));
    }
}

/// `Complete` or `Failed` when the Job has finished (upstream's getFinishedStatus).
fn finished_condition(job: &Job) -> Option<&'static str> {
    let conditions = job.status.as_ref()?.conditions.as_ref()?;
    conditions
        .iter()
        .filter(|c| c.status == "True")
        .find_map(|c| match c.type_.as_str() {
            "Complete" => Some("Complete"),
            "Failed" => Some("Failed"),
            _ => None,
        })
}

/// The Jobs to delete so that at most `limit` remain: oldest start first (never-started
/// last), then by name, as upstream's byJobStartTime.
fn oldest_beyond(mut jobs: Vec<&Job>, limit: usize) -> Vec<&Job> {
    if jobs.len() <= limit {
        return Vec::new();
    }
    jobs.sort_by_key(|j| {
        let start = j
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0);
        (start.is_none(), start, j.metadata.name.clone())
    });
    let surplus = jobs.len() - limit;
    jobs.truncate(surplus);
    jobs
}

/// Upstream's getJobName: the CronJob's name and the scheduled time in minutes since the
/// epoch, the same for every attempt at one schedule time.
pub fn job_name(cronjob: &str, scheduled: DateTime<Utc>) -> String {
    format!("{cronjob}-{}", scheduled.timestamp().div_euclid(60))
}

/// Upstream's getJobFromTemplate2: the template's labels, annotations (plus the scheduled
/// time) and spec, controlled by the CronJob.
fn job_from_template(cronjob: &CronJob, scheduled: DateTime<Utc>, zone: Tz) -> Job {
    let template = cronjob
        .spec
        .as_ref()
        .map(|s| s.job_template.clone())
        .unwrap_or_default();
    let template_meta = template.metadata.unwrap_or_default();
    let mut annotations = template_meta.annotations.unwrap_or_default();
    annotations.insert(
        SCHEDULED_TIMESTAMP.into(),
        scheduled
            .with_timezone(&zone)
            .to_rfc3339_opts(SecondsFormat::Secs, true),
    );
    Job {
        metadata: ObjectMeta {
            name: Some(job_name(
                cronjob.metadata.name.as_deref().unwrap_or(""),
                scheduled,
            )),
            namespace: cronjob.metadata.namespace.clone(),
            labels: template_meta.labels,
            annotations: Some(annotations),
            owner_references: Some(vec![pods::controller_reference(
                "batch/v1",
                "CronJob",
                &cronjob.metadata,
            )]),
            ..Default::default()
        },
        spec: template.spec,
        status: None,
    }
}

/// Upstream's formatSchedule: `spec.timeZone` becomes a `TZ=` prefix unless the schedule
/// names its own zone.
pub fn format_schedule(schedule: &str, time_zone: Option<&str>) -> String {
    match time_zone {
        Some(zone) if !schedule.contains("TZ") && load_location(zone).is_ok() => {
            format!("TZ={zone} {schedule}")
        }
        _ => schedule.to_string(),
    }
}

/// Go's time.LoadLocation: empty and `UTC` are UTC; `Local` is the controller's zone, UTC here.
fn load_location(zone: &str) -> Result<Tz, ScheduleError> {
    match zone {
        "" | "UTC" | "Local" => Ok(Tz::UTC),
        _ => Tz::from_str(zone).map_err(|_| ScheduleError::UnknownTimeZone(zone.to_string())),
    }
}

/// A schedule that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// The zone is not in the IANA database.
    #[error("unknown time zone {0}")]
    UnknownTimeZone(String),
    /// The text is not a standard schedule.
    #[error("{0}")]
    Syntax(String),
    /// Two consecutive times are less than a second apart (a schedule that never comes).
    #[error("time difference between two schedules is less than 1 second")]
    NeverDue,
}

/// A parsed schedule, as robfig/cron's ParseStandard accepts: an optional `CRON_TZ=` / `TZ=`
/// prefix, then five fields or a descriptor (`@yearly`, `@monthly`, `@weekly`, `@daily`,
/// `@midnight`, `@hourly`, `@every <duration>`).
#[derive(Debug, Clone)]
pub enum Schedule {
    /// A cron pattern evaluated in a time zone.
    Cron {
        /// The five fields.
        cron: Box<Cron>,
        /// The zone the fields are read in.
        zone: Tz,
    },
    /// `@every`: a fixed interval, whole seconds.
    Every(chrono::Duration),
}

impl Schedule {
    /// Parses `spec`.
    pub fn parse(spec: &str) -> Result<Self, ScheduleError> {
        let mut spec = spec.trim();
        let mut zone = Tz::UTC;
        if spec.starts_with("TZ=") || spec.starts_with("CRON_TZ=") {
            let (prefix, rest) = spec.split_once(' ').ok_or_else(|| {
                ScheduleError::Syntax("missing schedule after the time zone".into())
            })?;
            let name = prefix.split_once('=').map_or("", |(_, name)| name);
            zone = load_location(name)?;
            spec = rest.trim();
        }
        if let Some(every) = spec.strip_prefix("@every ") {
            let seconds = parse_go_duration(every.trim()).ok_or_else(|| {
                ScheduleError::Syntax(format!("failed to parse duration {every}"))
            })?;
            return Ok(Self::Every(chrono::Duration::seconds(seconds.max(1))));
        }
        let pattern = match spec {
            "@midnight" => "@daily",
            other => other,
        };
        if !pattern.starts_with('@') {
            check_standard_fields(pattern)?;
        } else if !matches!(
            pattern,
            "@yearly" | "@annually" | "@monthly" | "@weekly" | "@daily" | "@hourly"
        ) {
            return Err(ScheduleError::Syntax(format!(
                "unrecognized descriptor: {pattern}"
            )));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build()
            .parse(pattern)
            .map_err(|err| ScheduleError::Syntax(err.to_string()))?;
        Ok(Self::Cron {
            cron: Box::new(cron),
            zone,
        })
    }

    /// The first activation strictly after `after` (robfig's Next), None when there is none
    /// within croner's search horizon.
    pub fn next(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let whole = DateTime::from_timestamp(after.timestamp(), 0)?;
        match self {
            Self::Every(interval) => Some(whole + *interval),
            Self::Cron { cron, zone } => cron
                .find_next_occurrence(&whole.with_timezone(zone), false)
                .ok()
                .map(|t| t.with_timezone(&Utc)),
        }
    }
}

/// Rejects croner's extensions (`L`, `W`, `#`, `+`, seconds, years) that upstream's standard
/// parser does not know, so a schedule means the same here as there.
fn check_standard_fields(pattern: &str) -> Result<(), ScheduleError> {
    const MONTHS: [&str; 12] = [
        "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
    ];
    const DAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
    let fields: Vec<&str> = pattern.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(ScheduleError::Syntax(format!(
            "expected exactly 5 fields, found {}: {pattern}",
            fields.len()
        )));
    }
    for (position, field) in fields.iter().enumerate() {
        let mut rest = field.to_ascii_uppercase();
        let names: &[&str] = match position {
            3 => &MONTHS,
            4 => &DAYS,
            _ => &[],
        };
        for name in names {
            rest = rest.replace(name, "0");
        }
        if let Some(bad) = rest
            .chars()
            .find(|c| !(c.is_ascii_digit() || matches!(c, '*' | '?' | '/' | '-' | ',')))
        {
            return Err(ScheduleError::Syntax(format!(
                "unsupported character {bad:?} in {field:?}"
            )));
        }
    }
    Ok(())
}

/// Go's time.ParseDuration for what `@every` takes: a sequence of `<integer><h|m|s>`,
/// in whole seconds.
fn parse_go_duration(text: &str) -> Option<i64> {
    let mut total = 0i64;
    let mut digits = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let value: i64 = digits.parse().ok()?;
        digits.clear();
        total += value
            * match c {
                'h' => 3600,
                'm' => 60,
                's' => 1,
                _ => return None,
            };
    }
    (digits.is_empty() && !text.is_empty()).then_some(total)
}

/// How many schedule times passed unmet (upstream's missedSchedulesType).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missed {
    /// At most the one being started.
    None,
    /// More than one, at most a hundred.
    Few,
    /// More than a hundred: a clock or controller problem worth a warning.
    Many,
}

/// The most recent unmet schedule time and how many were missed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recent {
    /// Where the search started: the last schedule time, else creation, else the deadline.
    pub earliest: DateTime<Utc>,
    /// The latest schedule time not after now, if any came since `earliest`.
    pub time: Option<DateTime<Utc>>,
    /// How many passed unmet.
    pub missed: Missed,
}

/// What a CronJob's schedule times are computed from.
#[derive(Debug, Clone)]
pub struct ScheduleTimes {
    /// The CronJob's creation.
    pub created: DateTime<Utc>,
    /// `status.lastScheduleTime`.
    pub last_scheduled: Option<DateTime<Utc>>,
    /// `spec.startingDeadlineSeconds`.
    pub starting_deadline_seconds: Option<i64>,
}

impl ScheduleTimes {
    /// Upstream's mostRecentScheduleTime: the latest schedule time in (earliest, now], where
    /// earliest is the last schedule time or creation (raised to now − startingDeadlineSeconds
    /// when `with_deadline`), with a rough count of those missed.
    pub fn most_recent(
        &self,
        schedule: &Schedule,
        now: DateTime<Utc>,
        with_deadline: bool,
    ) -> Result<Recent, ScheduleError> {
        let mut earliest = self.last_scheduled.unwrap_or(self.created);
        if with_deadline && let Some(deadline) = self.starting_deadline_seconds {
            earliest = earliest.max(now - chrono::Duration::seconds(deadline));
        }
        let none = |missed| Recent {
            earliest,
            time: None,
            missed,
        };
        let Some(t1) = schedule.next(earliest) else {
            return Ok(none(Missed::None));
        };
        if now < t1 {
            return Ok(none(Missed::None));
        }
        let Some(t2) = schedule.next(t1) else {
            return Ok(Recent {
                earliest,
                time: Some(t1),
                missed: Missed::None,
            });
        };
        if now < t2 {
            return Ok(Recent {
                earliest,
                time: Some(t1),
                missed: Missed::None,
            });
        }
        let between = (t2 - t1).num_seconds();
        if between < 1 {
            return Err(ScheduleError::NeverDue);
        }
        let missed_count = (now - t1).num_seconds() / between + 1;
        // Start one interval early and let the schedule find the real times: intervals of
        // schedules like `30 6-16/4 * * 1-5` are uneven.
        let mut cursor = t1 + chrono::Duration::seconds((missed_count - 2) * between);
        let mut most_recent = None;
        while let Some(t) = schedule.next(cursor) {
            if t > now {
                break;
            }
            most_recent = Some(t);
            cursor = t;
        }
        let missed = match missed_count {
            n if n > 100 => Missed::Many,
            n if n > 1 => Missed::Few,
            _ => Missed::None,
        };
        Ok(Recent {
            earliest,
            time: most_recent,
            missed,
        })
    }

    /// Upstream's nextScheduleTimeDuration: how long until a moment after the next schedule
    /// time, counted from the most recent one (or from now when times were missed).
    pub fn next_wake(&self, schedule: &Schedule, now: DateTime<Utc>) -> Duration {
        let from = match self.most_recent(schedule, now, false) {
            Err(_) => now,
            Ok(Recent { time: Some(t), .. }) => t,
            Ok(Recent {
                earliest,
                time: None,
                missed: Missed::None,
            }) => earliest,
            Ok(Recent { time: None, .. }) => now,
        };
        let next = schedule
            .next(from)
            .unwrap_or(now + chrono::Duration::hours(1));
        (next - now).to_std().unwrap_or(Duration::ZERO) + NEXT_SCHEDULE_DELTA
    }
}

fn to_chrono(time: Option<&Time>) -> Option<DateTime<Utc>> {
    let t = time?.0;
    Utc.timestamp_opt(
        t.as_second(),
        u32::try_from(t.subsec_nanosecond()).unwrap_or(0),
    )
    .single()
}

fn to_jiff(time: DateTime<Utc>) -> Timestamp {
    Timestamp::new(time.timestamp(), 0).unwrap_or(Timestamp::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or_default()
    }

    fn parse(spec: &str) -> Schedule {
        match Schedule::parse(spec) {
            Ok(schedule) => schedule,
            Err(err) => panic!("{spec}: {err}"),
        }
    }

    #[test]
    fn schedules_parse_as_upstreams_standard_parser() {
        let valid = [
            "*/1 * * * *",
            "0 9 * * MON-FRI",
            "30 6-16/4 * * 1-5",
            "0 0 1 JAN,JUL ?",
            "@hourly",
            "@daily",
            "@midnight",
            "@weekly",
            "@monthly",
            "@yearly",
            "@annually",
            "@every 1h30m",
            "CRON_TZ=Europe/Berlin 0 9 * * *",
            "TZ=America/New_York @daily",
        ];
        for spec in valid {
            assert!(Schedule::parse(spec).is_ok(), "{spec}");
        }
        let invalid = [
            ("", "empty"),
            ("* * * *", "four fields"),
            ("0 * * * * *", "seconds"),
            ("0 0 L * *", "croner's last-day extension"),
            ("0 0 * * 5#2", "croner's nth-weekday extension"),
            ("@reboot", "unknown descriptor"),
            ("@every soon", "bad duration"),
            ("CRON_TZ=Mars/Olympus 0 * * * *", "unknown zone"),
            ("61 * * * *", "minute out of range"),
        ];
        for (spec, why) in invalid {
            assert!(Schedule::parse(spec).is_err(), "{spec} ({why})");
        }
    }

    #[test]
    fn next_times_follow_the_time_zone() {
        let cases = [
            (
                "*/1 * * * *",
                "2024-01-15T10:00:30Z",
                "2024-01-15T10:01:00Z",
            ),
            (
                "*/1 * * * *",
                "2024-01-15T10:01:00Z",
                "2024-01-15T10:02:00Z",
            ),
            ("@hourly", "2024-01-15T10:00:00Z", "2024-01-15T11:00:00Z"),
            ("0 0 * * *", "2024-01-15T10:00:00Z", "2024-01-16T00:00:00Z"),
            // 09:00 in New York: 14:00 UTC in winter, 13:00 in summer.
            (
                "TZ=America/New_York 0 9 * * *",
                "2024-01-15T10:00:00Z",
                "2024-01-15T14:00:00Z",
            ),
            (
                "TZ=America/New_York 0 9 * * *",
                "2024-07-15T10:00:00Z",
                "2024-07-15T13:00:00Z",
            ),
            (
                "CRON_TZ=Asia/Kolkata 0 0 * * *",
                "2024-01-15T10:00:00Z",
                "2024-01-15T18:30:00Z",
            ),
            // Day of month or day of week when both are restricted.
            (
                "0 0 13 * FRI",
                "2024-09-01T00:00:00Z",
                "2024-09-06T00:00:00Z",
            ),
            (
                "@every 90s",
                "2024-01-15T10:00:00.700Z",
                "2024-01-15T10:01:30Z",
            ),
        ];
        for (spec, after, want) in cases {
            assert_eq!(
                parse(spec).next(utc(after)),
                Some(utc(want)),
                "{spec} after {after}"
            );
        }
        assert_eq!(
            format_schedule("0 9 * * *", Some("Europe/Paris")),
            "TZ=Europe/Paris 0 9 * * *"
        );
        assert_eq!(
            format_schedule("CRON_TZ=UTC 0 9 * * *", Some("Europe/Paris")),
            "CRON_TZ=UTC 0 9 * * *"
        );
    }

    #[test]
    fn missed_runs_are_found_and_counted_as_upstream() {
        struct Case {
            name: &'static str,
            schedule: &'static str,
            created: &'static str,
            last: Option<&'static str>,
            deadline: Option<i64>,
            now: &'static str,
            want: Option<&'static str>,
            missed: Missed,
        }
        let cases = [
            Case {
                name: "not due yet",
                schedule: "0 * * * *",
                created: "2024-01-15T10:05:00Z",
                last: None,
                deadline: None,
                now: "2024-01-15T10:30:00Z",
                want: None,
                missed: Missed::None,
            },
            Case {
                name: "one time due",
                schedule: "0 * * * *",
                created: "2024-01-15T10:05:00Z",
                last: None,
                deadline: None,
                now: "2024-01-15T11:00:05Z",
                want: Some("2024-01-15T11:00:00Z"),
                missed: Missed::None,
            },
            Case {
                name: "the last schedule time counts, not creation",
                schedule: "0 * * * *",
                created: "2024-01-15T08:05:00Z",
                last: Some("2024-01-15T11:00:00Z"),
                deadline: None,
                now: "2024-01-15T11:30:00Z",
                want: None,
                missed: Missed::None,
            },
            Case {
                name: "a few missed: the most recent one runs",
                schedule: "0 * * * *",
                created: "2024-01-15T07:05:00Z",
                last: None,
                deadline: None,
                now: "2024-01-15T11:10:00Z",
                want: Some("2024-01-15T11:00:00Z"),
                missed: Missed::Few,
            },
            Case {
                name: "many missed",
                schedule: "*/1 * * * *",
                created: "2024-01-15T07:00:30Z",
                last: None,
                deadline: None,
                now: "2024-01-15T11:10:10Z",
                want: Some("2024-01-15T11:10:00Z"),
                missed: Missed::Many,
            },
            Case {
                name: "the starting deadline bounds the search",
                schedule: "*/1 * * * *",
                created: "2024-01-15T07:00:30Z",
                last: None,
                deadline: Some(30),
                now: "2024-01-15T11:10:10Z",
                want: Some("2024-01-15T11:10:00Z"),
                missed: Missed::None,
            },
            Case {
                name: "uneven intervals",
                schedule: "30 6-16/4 * * 1-5",
                created: "2024-01-15T00:00:00Z",
                last: None,
                deadline: None,
                now: "2024-01-16T09:00:00Z",
                want: Some("2024-01-16T06:30:00Z"),
                missed: Missed::Few,
            },
            Case {
                name: "in the cronjob's zone",
                schedule: "TZ=Europe/Berlin 0 9 * * *",
                created: "2024-01-15T00:00:00Z",
                last: None,
                deadline: None,
                now: "2024-01-15T08:00:01Z",
                want: Some("2024-01-15T08:00:00Z"),
                missed: Missed::None,
            },
        ];
        for case in cases {
            let times = ScheduleTimes {
                created: utc(case.created),
                last_scheduled: case.last.map(utc),
                starting_deadline_seconds: case.deadline,
            };
            let recent = times.most_recent(&parse(case.schedule), utc(case.now), true);
            let recent = recent.unwrap_or_else(|err| panic!("{}: {err}", case.name));
            assert_eq!(recent.time, case.want.map(utc), "{}", case.name);
            assert_eq!(recent.missed, case.missed, "{}", case.name);
        }
    }

    #[test]
    fn the_controller_wakes_just_after_the_next_time() {
        let times = ScheduleTimes {
            created: utc("2024-01-15T10:00:30Z"),
            last_scheduled: Some(utc("2024-01-15T10:01:00Z")),
            starting_deadline_seconds: None,
        };
        let wake = times.next_wake(&parse("*/1 * * * *"), utc("2024-01-15T10:01:20Z"));
        assert_eq!(wake, Duration::from_secs(40) + NEXT_SCHEDULE_DELTA);
        let never = parse("0 0 30 2 *");
        assert!(
            times
                .most_recent(&never, utc("2024-01-15T10:01:20Z"), true)
                .is_ok_and(|r| r.time.is_none())
        );
    }

    #[test]
    fn a_job_change_queues_the_cronjobs_controlling_it() {
        let owner = |name: &str| ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("{name}-uid")),
            ..Default::default()
        };
        let job =
            |owners: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>| Job {
                metadata: ObjectMeta {
                    name: Some("report-28421881".into()),
                    namespace: Some("ops".into()),
                    owner_references: Some(owners),
                    ..Default::default()
                },
                ..Default::default()
            };
        let before = job(vec![pods::controller_reference(
            "batch/v1",
            "CronJob",
            &owner("report"),
        )]);
        let after = job(vec![pods::controller_reference(
            "batch/v1",
            "CronJob",
            &owner("digest"),
        )]);
        let keys =
            |old, new| pods::controller_keys(&crate::informers::Change { old, new }, "CronJob");
        assert_eq!(keys(None, Some(&before)), vec!["ops/report"]);
        assert_eq!(keys(Some(&before), Some(&before)), vec!["ops/report"]);
        assert_eq!(keys(Some(&before), None), vec!["ops/report"]);
        assert_eq!(
            keys(Some(&before), Some(&after)),
            vec!["ops/report", "ops/digest"]
        );
        assert!(keys(None, Some(&job(vec![]))).is_empty());
    }

    #[test]
    fn jobs_are_named_and_annotated_by_their_scheduled_time() {
        let scheduled = utc("2024-01-15T10:01:00Z");
        assert_eq!(job_name("report", scheduled), "report-28421881");
        let cronjob = CronJob {
            metadata: ObjectMeta {
                name: Some("report".into()),
                namespace: Some("default".into()),
                uid: Some("cj-uid".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let paris = load_location("Europe/Paris").unwrap_or(Tz::UTC);
        for (zone, text) in [
            (Tz::UTC, "2024-01-15T10:01:00Z"),
            (paris, "2024-01-15T11:01:00+01:00"),
        ] {
            let job = job_from_template(&cronjob, scheduled, zone);
            assert_eq!(job.metadata.name.as_deref(), Some("report-28421881"));
            let annotations = job.metadata.annotations.unwrap_or_default();
            assert_eq!(
                annotations.get(SCHEDULED_TIMESTAMP).map(String::as_str),
                Some(text)
            );
            let owner = job.metadata.owner_references.unwrap_or_default();
            assert_eq!(owner[0].kind, "CronJob");
            assert_eq!(owner[0].controller, Some(true));
        }
    }

    #[test]
    fn history_keeps_the_newest_finished_jobs() {
        let job = |name: &str, start: Option<i64>| Job {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            status: Some(k8s_openapi::api::batch::v1::JobStatus {
                start_time: start
                    .map(|s| Time(Timestamp::new(s, 0).unwrap_or(Timestamp::UNIX_EPOCH))),
                ..Default::default()
            }),
            ..Default::default()
        };
        let (a, b, c, d) = (
            job("a", Some(30)),
            job("b", Some(10)),
            job("c", None),
            job("d", Some(20)),
        );
        let names = |jobs: Vec<&Job>| -> Vec<String> {
            jobs.iter()
                .filter_map(|j| j.metadata.name.clone())
                .collect()
        };
        assert_eq!(
            names(oldest_beyond(vec![&a, &b, &c, &d], 2)),
            vec!["b", "d"]
        );
        assert_eq!(
            names(oldest_beyond(vec![&a, &b, &c, &d], 0)),
            vec!["b", "d", "a", "c"]
        );
        assert!(oldest_beyond(vec![&a], 1).is_empty());
    }
}
