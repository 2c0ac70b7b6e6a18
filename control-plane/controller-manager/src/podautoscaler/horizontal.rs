//! One HPA's reconcile decision (upstream's `reconcileAutoscaler` and
//! `computeReplicasForMetrics`), sans IO: from the target's scale, its pods and their metrics,
//! the replica count to set, the status to write (conditions, current metrics, replicas) and
//! the events to record, with upstream's reasons and messages. The controller loop fetches
//! what this reads and carries out what it decides.

use std::collections::BTreeSet;

use flotilla_api_machinery::selector::LabelSelector;
use k8s_metrics::v1beta1::PodMetrics;
use k8s_openapi::api::autoscaling::v1::Scale;
use k8s_openapi::api::autoscaling::v2::{
    ContainerResourceMetricStatus, HorizontalPodAutoscaler, HorizontalPodAutoscalerCondition,
    HorizontalPodAutoscalerStatus, MetricSpec, MetricStatus, MetricTarget, MetricValueStatus,
    ResourceMetricStatus,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::behavior::{Behavior, Bounds, DOWNSCALE_STABILIZATION_WINDOW, History, Normalized};
use super::metrics::{milli_quantity, milli_value, resource_metric};
use super::replica_calculator::{self, Config, Sample};

/// Condition types of an HPA.
pub const ABLE_TO_SCALE: &str = "AbleToScale";
/// The metrics could be read and a count computed.
pub const SCALING_ACTIVE: &str = "ScalingActive";
/// The count was held back by min/max or a rate limit.
pub const SCALING_LIMITED: &str = "ScalingLimited";

/// An event to record about the HPA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// `Normal` or `Warning`.
    pub type_: &'static str,
    /// Upstream's reason.
    pub reason: &'static str,
    /// Upstream's message.
    pub message: String,
}

impl Event {
    fn warning(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            type_: "Warning",
            reason,
            message: message.into(),
        }
    }
}

/// Upstream's `setCondition`: sets `type_` on `status`, moving its transition time only when
/// its status changes.
pub fn set_condition(
    status: &mut HorizontalPodAutoscalerStatus,
    type_: &str,
    value: bool,
    reason: &str,
    message: impl Into<String>,
    now: Timestamp,
) {
    let value = if value { "True" } else { "False" };
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    let index = match conditions.iter().position(|c| c.type_ == type_) {
        Some(i) => i,
        None => {
            conditions.push(HorizontalPodAutoscalerCondition {
                type_: type_.to_string(),
                ..Default::default()
            });
            conditions.len() - 1
        }
    };
    let condition = &mut conditions[index];
    if condition.status != value {
        condition.last_transition_time = Some(Time(now));
    }
    condition.status = value.to_string();
    condition.reason = Some(reason.to_string());
    condition.message = Some(message.into());
}

/// Upstream's `setStatus`: the status rebuilt around its conditions and last scale time.
fn set_status(
    status: &mut HorizontalPodAutoscalerStatus,
    generation: Option<i64>,
    current: i32,
    desired: i32,
    metrics: Option<Vec<MetricStatus>>,
    rescaled_at: Option<Timestamp>,
) {
    *status = HorizontalPodAutoscalerStatus {
        current_replicas: Some(current),
        desired_replicas: desired,
        current_metrics: metrics,
        conditions: status.conditions.take(),
        last_scale_time: rescaled_at.map(Time).or(status.last_scale_time.take()),
        observed_generation: generation,
    };
}

/// The HPA's metrics, or the API's default (80% CPU) when it lists none.
pub fn metric_specs(hpa: &HorizontalPodAutoscaler) -> Vec<MetricSpec> {
    match hpa.spec.as_ref().and_then(|s| s.metrics.clone()) {
        Some(metrics) if !metrics.is_empty() => metrics,
        _ => vec![MetricSpec {
            type_: "Resource".into(),
            resource: Some(k8s_openapi::api::autoscaling::v2::ResourceMetricSource {
                name: "cpu".into(),
                target: MetricTarget {
                    type_: "Utilization".into(),
                    average_utilization: Some(80),
                    ..Default::default()
                },
            }),
            ..Default::default()
        }],
    }
}

/// `spec.minReplicas`, 1 when unset.
pub fn min_replicas(hpa: &HorizontalPodAutoscaler) -> i32 {
    hpa.spec.as_ref().and_then(|s| s.min_replicas).unwrap_or(1)
}

fn max_replicas(hpa: &HorizontalPodAutoscaler) -> i32 {
    hpa.spec.as_ref().map_or(0, |s| s.max_replicas)
}

/// Whether the HPA will read metrics this sync: the target's replicas are within bounds and
/// not zero. The controller lists the metrics only then.
pub fn computes_metrics(hpa: &HorizontalPodAutoscaler, scale: &Scale) -> bool {
    let current = scale_replicas(scale);
    let min = min_replicas(hpa);
    !(current == 0 && min != 0) && current <= max_replicas(hpa) && current >= min
}

/// Whether any metric is read from metrics.k8s.io.
pub fn uses_resource_metrics(hpa: &HorizontalPodAutoscaler) -> bool {
    metric_specs(hpa)
        .iter()
        .any(|m| matches!(m.type_.as_str(), "Resource" | "ContainerResource"))
}

/// The scale's `spec.replicas`.
pub fn scale_replicas(scale: &Scale) -> i32 {
    scale.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0)
}

/// Upstream's `validateAndParseSelector` without the pod lookup: the scale's selector
/// string, parsed. The error carries the event's reason and message and the condition's
/// message.
pub fn parse_selector(scale: &Scale) -> Result<LabelSelector, (&'static str, String, String)> {
    let text = scale
        .status
        .as_ref()
        .and_then(|s| s.selector.as_deref())
        .unwrap_or("");
    if text.is_empty() {
        return Err((
            "SelectorRequired",
            "selector is required".into(),
            "the HPA target's scale is missing a selector".into(),
        ));
    }
    LabelSelector::parse(text).map_err(|err| {
        let message = format!(
            "couldn't convert selector into a corresponding internal selector object: {err}"
        );
        ("InvalidSelector", message.clone(), message)
    })
}

/// What the controller observed for one reconcile.
#[derive(Debug)]
pub struct Observed<'a> {
    /// The HPA as cached.
    pub hpa: &'a HorizontalPodAutoscaler,
    /// Its key (`namespace/name`).
    pub key: &'a str,
    /// The target's scale.
    pub scale: &'a Scale,
    /// The pods of the HPA's namespace.
    pub pods: &'a [&'a Pod],
    /// The other HPAs of the namespace with the selectors their last reconcile found.
    pub other_selectors: &'a [(String, LabelSelector)],
    /// The listed PodMetrics, when [`computes_metrics`] and [`uses_resource_metrics`] and
    /// the selector is valid; the error is the list call's.
    pub pod_metrics: Option<Result<Vec<PodMetrics>, String>>,
    /// The reconcile's time.
    pub now: Timestamp,
}

/// The decision of one reconcile, before the scale is written.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The status as decided so far.
    pub status: HorizontalPodAutoscalerStatus,
    /// Events to record.
    pub events: Vec<Event>,
    /// The target's replicas now.
    pub current_replicas: i32,
    /// The replica count to set.
    pub desired_replicas: i32,
    /// Whether to write the scale.
    pub rescale: bool,
    /// Why (the events' `reason:` part).
    pub reason: String,
    /// The metric statuses computed.
    pub metric_statuses: Option<Vec<MetricStatus>>,
    /// An error to report after the reconcile (some metrics failed).
    pub error: Option<String>,
}

/// The outcome of a reconcile: the status to write when it differs, the events, and an
/// error to log.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The status the HPA should have.
    pub status: HorizontalPodAutoscalerStatus,
    /// Events to record.
    pub events: Vec<Event>,
    /// What went wrong, if anything.
    pub error: Option<String>,
}

/// The status after the target's scale could not be read (upstream's `FailedGetScale` path).
pub fn failed_get_scale(hpa: &HorizontalPodAutoscaler, error: &str, now: Timestamp) -> Outcome {
    let mut status = hpa.status.clone().unwrap_or_default();
    set_condition(
        &mut status,
        ABLE_TO_SCALE,
        false,
        "FailedGetScale",
        format!("the HPA controller was unable to get the target's current scale: {error}"),
        now,
    );
    Outcome {
        status,
        events: vec![Event::warning("FailedGetScale", error)],
        error: Some(error.to_string()),
    }
}

/// What [`plan`] decided.
#[derive(Debug, Clone)]
pub enum Decision {
    /// Write the scale if the plan says so, then [`finish`].
    Proceed(Plan),
    /// The metrics gave no count: the reconcile ends with this outcome.
    Stop(Outcome),
}

/// Upstream's `reconcileAutoscaler` up to the scale update.
pub fn plan(observed: &Observed<'_>, history: &mut History, config: &Config) -> Decision {
    let Observed {
        hpa, scale, now, ..
    } = *observed;
    let mut status = hpa.status.clone().unwrap_or_default();
    let mut events = Vec::new();
    set_condition(
        &mut status,
        ABLE_TO_SCALE,
        true,
        "SucceededGetScale",
        "the HPA controller was able to get the target's current scale",
        now,
    );
    let current = scale_replicas(scale);
    history.record_initial_recommendation(current, now);
    let min = min_replicas(hpa);
    let max = max_replicas(hpa);
    let mut plan = Plan {
        status: HorizontalPodAutoscalerStatus::default(),
        events: Vec::new(),
        current_replicas: current,
        desired_replicas: 0,
        rescale: true,
        reason: String::new(),
        metric_statuses: None,
        error: None,
    };
    if current == 0 && min != 0 {
        plan.rescale = false;
        set_condition(
            &mut status,
            SCALING_ACTIVE,
            false,
            "ScalingDisabled",
            "scaling is disabled since the replica count of the target is zero",
            now,
        );
    } else if current > max {
        plan.reason = "Current number of replicas above Spec.MaxReplicas".into();
        plan.desired_replicas = max;
    } else if current < min {
        plan.reason = "Current number of replicas below Spec.MinReplicas".into();
        plan.desired_replicas = min;
    } else {
        let computed = compute_replicas_for_metrics(observed, config, &mut status, &mut events);
        plan.metric_statuses = computed.statuses.clone();
        let (metric_replicas, metric_name) = match computed.replicas {
            Some(found) => found,
            None => {
                let error = computed.error.unwrap_or_default();
                let desired = status.desired_replicas;
                set_status(
                    &mut status,
                    hpa.metadata.generation,
                    current,
                    desired,
                    computed.statuses,
                    None,
                );
                events.push(Event::warning("FailedComputeMetricsReplicas", &error));
                return Decision::Stop(Outcome {
                    status,
                    events,
                    error: Some(format!(
                        "failed to compute desired number of replicas based on listed metrics for {}: {error}",
                        reference(hpa)
                    )),
                });
            }
        };
        plan.error = computed.error;
        let mut desired = 0;
        let mut rescale_metric = String::new();
        if metric_replicas > desired {
            desired = metric_replicas;
            rescale_metric = metric_name;
        }
        if desired > current {
            plan.reason = format!("{rescale_metric} above target");
        }
        if desired < current {
            plan.reason = "All metrics below target".into();
        }
        let bounds = Bounds {
            min_replicas: min,
            max_replicas: max,
            current_replicas: current,
            desired_replicas: desired,
        };
        let normalized: Normalized = match behavior_of(hpa) {
            None => history.normalize(bounds, DOWNSCALE_STABILIZATION_WINDOW, now),
            Some(behavior) => history.normalize_with_behavior(&behavior, bounds, now),
        };
        let able = &normalized.able_to_scale;
        set_condition(
            &mut status,
            ABLE_TO_SCALE,
            able.status,
            able.reason,
            able.message.clone(),
            now,
        );
        let limited = &normalized.scaling_limited;
        set_condition(
            &mut status,
            SCALING_LIMITED,
            limited.status,
            limited.reason,
            limited.message.clone(),
            now,
        );
        plan.desired_replicas = normalized.desired;
        plan.rescale = normalized.desired != current;
    }
    plan.status = status;
    plan.events = events;
    Decision::Proceed(plan)
}

/// The behavior with its defaults, when the HPA has one.
pub fn behavior_of(hpa: &HorizontalPodAutoscaler) -> Option<Behavior> {
    hpa.spec
        .as_ref()
        .and_then(|s| s.behavior.as_ref())
        .map(Behavior::from_spec)
}

fn reference(hpa: &HorizontalPodAutoscaler) -> String {
    let target = hpa.spec.as_ref().map(|s| &s.scale_target_ref);
    format!(
        "{}/{}/{}",
        target.map_or("", |t| t.kind.as_str()),
        hpa.metadata.namespace.as_deref().unwrap_or(""),
        target.map_or("", |t| t.name.as_str())
    )
}

/// Upstream's tail of `reconcileAutoscaler`: `scale_write` is the scale update's result when
/// the plan rescaled.
pub fn finish(
    hpa: &HorizontalPodAutoscaler,
    mut plan: Plan,
    scale_write: Option<Result<(), String>>,
    history: &mut History,
    now: Timestamp,
) -> Outcome {
    let generation = hpa.metadata.generation;
    let desired = plan.desired_replicas;
    match scale_write {
        Some(Err(err)) if plan.rescale => {
            plan.events.push(Event::warning(
                "FailedRescale",
                format!("New size: {desired}; reason: {}; error: {err}", plan.reason),
            ));
            set_condition(
                &mut plan.status,
                ABLE_TO_SCALE,
                false,
                "FailedUpdateScale",
                format!("the HPA controller was unable to update the target scale: {err}"),
                now,
            );
            let kept = plan.status.desired_replicas;
            set_status(
                &mut plan.status,
                generation,
                plan.current_replicas,
                kept,
                plan.metric_statuses,
                None,
            );
            return Outcome {
                status: plan.status,
                events: plan.events,
                error: Some(format!("failed to rescale {}: {err}", reference(hpa))),
            };
        }
        _ if plan.rescale => {
            set_condition(
                &mut plan.status,
                ABLE_TO_SCALE,
                true,
                "SucceededRescale",
                format!("the HPA controller was able to update the target scale to {desired}"),
                now,
            );
            plan.events.push(Event {
                type_: "Normal",
                reason: "SuccessfulRescale",
                message: format!("New size: {desired}; reason: {}", plan.reason),
            });
            history.store_scale_event(
                behavior_of(hpa).as_ref(),
                plan.current_replicas,
                desired,
                now,
            );
            set_status(
                &mut plan.status,
                generation,
                plan.current_replicas,
                desired,
                plan.metric_statuses,
                Some(now),
            );
        }
        _ => {
            set_status(
                &mut plan.status,
                generation,
                plan.current_replicas,
                plan.current_replicas,
                plan.metric_statuses,
                None,
            );
        }
    }
    Outcome {
        status: plan.status,
        events: plan.events,
        error: plan.error,
    }
}

/// What `computeReplicasForMetrics` returns.
struct Computed {
    /// The highest proposal and its metric's description; `None` when the metrics failed.
    replicas: Option<(i32, String)>,
    statuses: Option<Vec<MetricStatus>>,
    error: Option<String>,
}

/// A failed metric: the ScalingActive condition's reason and message, and the error.
struct MetricFailure {
    reason: &'static str,
    condition_message: String,
    error: String,
}

/// Upstream's `computeReplicasForMetrics`: every metric's proposal, the highest wins; when all
/// fail, or some fail and the rest would scale down, the first failure's condition is set.
fn compute_replicas_for_metrics(
    observed: &Observed<'_>,
    config: &Config,
    status: &mut HorizontalPodAutoscalerStatus,
    events: &mut Vec<Event>,
) -> Computed {
    let now = observed.now;
    let selector = match validate_selector(observed) {
        Ok(selector) => selector,
        Err((reason, event, condition_reason, condition)) => {
            events.push(Event::warning(reason, &event));
            set_condition(
                status,
                SCALING_ACTIVE,
                false,
                condition_reason,
                condition,
                now,
            );
            return Computed {
                replicas: None,
                statuses: None,
                error: Some(event),
            };
        }
    };
    let no_labels = Default::default();
    let selected: Vec<&Pod> = observed
        .pods
        .iter()
        .copied()
        .filter(|p| selector.matches(p.metadata.labels.as_ref().unwrap_or(&no_labels)))
        .collect();
    let specs = metric_specs(observed.hpa);
    let spec_replicas = scale_replicas(observed.scale);
    let mut statuses = vec![MetricStatus::default(); specs.len()];
    let mut replicas = 0;
    let mut metric = String::new();
    let mut invalid = 0;
    let mut first_failure: Option<MetricFailure> = None;
    for (spec, slot) in specs.iter().zip(statuses.iter_mut()) {
        match compute_replicas_for_metric(observed, config, spec, spec_replicas, &selected) {
            Ok((proposal, name, metric_status)) => {
                *slot = metric_status;
                if replicas == 0 || proposal > replicas {
                    replicas = proposal;
                    metric = name;
                }
            }
            Err(failure) => {
                events.push(Event::warning(failure.reason, &failure.condition_message));
                invalid += 1;
                first_failure.get_or_insert(failure);
            }
        }
    }
    let error = first_failure.as_ref().map(|f| {
        format!(
            "invalid metrics ({invalid} invalid out of {}), first error is: {}",
            specs.len(),
            f.error
        )
    });
    if let Some(failure) = &first_failure
        && (invalid >= specs.len() || replicas < spec_replicas)
    {
        set_condition(
            status,
            SCALING_ACTIVE,
            false,
            failure.reason,
            format!(
                "the HPA was unable to compute the replica count: {}",
                failure.condition_message
            ),
            now,
        );
        return Computed {
            replicas: None,
            statuses: Some(statuses),
            error,
        };
    }
    set_condition(
        status,
        SCALING_ACTIVE,
        true,
        "ValidMetricFound",
        format!("the HPA was able to successfully calculate a replica count from {metric}"),
        now,
    );
    Computed {
        replicas: Some((replicas, metric)),
        statuses: Some(statuses),
        error,
    }
}

/// The selector, or (event reason, event message, condition reason, condition message).
type SelectorFailure = (&'static str, String, &'static str, String);

/// Upstream's `validateAndParseSelector`: present, parsable, and no pod it selects selected
/// by another HPA of the namespace too.
fn validate_selector(observed: &Observed<'_>) -> Result<LabelSelector, SelectorFailure> {
    let selector = parse_selector(observed.scale)
        .map_err(|(reason, event, condition)| (reason, event, "InvalidSelector", condition))?;
    let no_labels = Default::default();
    let mut controlling: BTreeSet<&str> = BTreeSet::new();
    for pod in observed.pods {
        let labels = pod.metadata.labels.as_ref().unwrap_or(&no_labels);
        if !selector.matches(labels) {
            continue;
        }
        controlling.insert(observed.key);
        for (key, other) in observed.other_selectors {
            if other.matches(labels) {
                controlling.insert(key);
            }
        }
    }
    if controlling.len() > 1 {
        let text = observed
            .scale
            .status
            .as_ref()
            .and_then(|s| s.selector.as_deref())
            .unwrap_or("");
        let keys: Vec<&str> = controlling.into_iter().collect();
        let message = format!(
            "pods by selector {text} are controlled by multiple HPAs: [{}]",
            keys.join(" ")
        );
        return Err((
            "AmbiguousSelector",
            message.clone(),
            "AmbiguousSelector",
            message,
        ));
    }
    Ok(selector)
}

/// Upstream's `computeReplicasForMetric` for one metric: (proposal, description, status).
fn compute_replicas_for_metric(
    observed: &Observed<'_>,
    config: &Config,
    spec: &MetricSpec,
    spec_replicas: i32,
    pods: &[&Pod],
) -> Result<(i32, String, MetricStatus), MetricFailure> {
    let unserved = |reason: &'static str, error: String, wrap: String| MetricFailure {
        reason,
        condition_message: error.clone(),
        error: format!("{wrap}: {error}"),
    };
    match spec.type_.as_str() {
        "Resource" => {
            let Some(source) = &spec.resource else {
                return Err(invalid_source(spec));
            };
            let (replicas, name, current) = resource_metric_replicas(
                observed,
                config,
                &source.target,
                &source.name,
                None,
                spec_replicas,
                pods,
            )
            .map_err(|error| MetricFailure {
                reason: "FailedGetResourceMetric",
                condition_message: error.clone(),
                error: format!(
                    "failed to get {} resource metric value: {error}",
                    source.name
                ),
            })?;
            let status = MetricStatus {
                type_: "Resource".into(),
                resource: Some(ResourceMetricStatus {
                    name: source.name.clone(),
                    current,
                }),
                ..Default::default()
            };
            Ok((replicas, name, status))
        }
        "ContainerResource" => {
            let Some(source) = &spec.container_resource else {
                return Err(invalid_source(spec));
            };
            let (replicas, name, current) = resource_metric_replicas(
                observed,
                config,
                &source.target,
                &source.name,
                Some(&source.container),
                spec_replicas,
                pods,
            )
            .map_err(|error| MetricFailure {
                reason: "FailedGetContainerResourceMetric",
                condition_message: error.clone(),
                error: format!(
                    "failed to get {} container metric value: {error}",
                    source.container
                ),
            })?;
            let status = MetricStatus {
                type_: "ContainerResource".into(),
                container_resource: Some(ContainerResourceMetricStatus {
                    name: source.name.clone(),
                    container: source.container.clone(),
                    current,
                }),
                ..Default::default()
            };
            Ok((replicas, name, status))
        }
        // The custom and external metrics APIs are not served: these fail as upstream's
        // clients fail against a cluster without them.
        "Pods" => {
            let name = spec.pods.as_ref().map_or("", |p| p.metric.name.as_str());
            Err(unserved(
                "FailedGetPodsMetric",
                format!(
                    "unable to get metric {name}: unable to fetch metrics from custom metrics API: {NOT_SERVED}"
                ),
                "failed to get pods metric value".into(),
            ))
        }
        "Object" => {
            let (name, kind, object) = spec.object.as_ref().map_or(("", "", ""), |o| {
                (
                    o.metric.name.as_str(),
                    o.described_object.kind.as_str(),
                    o.described_object.name.as_str(),
                )
            });
            let namespace = observed.hpa.metadata.namespace.as_deref().unwrap_or("");
            Err(unserved(
                "FailedGetObjectMetric",
                format!(
                    "unable to get metric {name}: {kind} on {namespace} {object}/unable to fetch metrics from custom metrics API: {NOT_SERVED}"
                ),
                "failed to get object metric value".into(),
            ))
        }
        "External" => {
            let name = spec
                .external
                .as_ref()
                .map_or("", |e| e.metric.name.as_str());
            let namespace = observed.hpa.metadata.namespace.as_deref().unwrap_or("");
            Err(unserved(
                "FailedGetExternalMetric",
                format!(
                    "unable to get external metric {namespace}/{name}/nil: unable to fetch metrics from external metrics API: {NOT_SERVED}"
                ),
                format!("failed to get {name} external metric value"),
            ))
        }
        other => {
            let error = format!("unknown metric source type {other:?}");
            Err(MetricFailure {
                reason: "InvalidMetricSourceType",
                condition_message: error.clone(),
                error,
            })
        }
    }
}

/// What client-go reports for a group the server does not serve.
const NOT_SERVED: &str = "the server could not find the requested resource";

fn invalid_source(spec: &MetricSpec) -> MetricFailure {
    let error = format!("invalid metric source: {} source missing", spec.type_);
    MetricFailure {
        reason: "InvalidMetricSourceType",
        condition_message: error.clone(),
        error,
    }
}

/// Upstream's `computeStatusForResourceMetricGeneric`: (proposal, description, current
/// value) or the error message.
fn resource_metric_replicas(
    observed: &Observed<'_>,
    config: &Config,
    target: &MetricTarget,
    resource: &str,
    container: Option<&str>,
    current_replicas: i32,
    pods: &[&Pod],
) -> Result<(i32, String, MetricValueStatus), String> {
    let fetch = || -> Result<_, String> {
        let items = match &observed.pod_metrics {
            Some(Ok(items)) => items.as_slice(),
            Some(Err(err)) => return Err(err.clone()),
            None => &[],
        };
        resource_metric(items, resource, container).map_err(|e| e.to_string())
    };
    let sample = |metrics| Sample {
        current_replicas,
        resource,
        container,
        pods,
        metrics,
        now: observed.now,
    };
    if let Some(average) = &target.average_value {
        let target_usage = milli_value(&average.0).unwrap_or(0);
        let (metrics, _) = fetch().map_err(|err| {
            format!("failed to get {resource} usage: unable to get metrics for resource {resource}: {err}")
        })?;
        let (replicas, usage) =
            replica_calculator::raw_resource_replicas(config, sample(metrics), target_usage)
                .map_err(|err| format!("failed to get {resource} usage: {err}"))?;
        let current = MetricValueStatus {
            average_value: Some(milli_quantity(usage)),
            ..Default::default()
        };
        return Ok((replicas, format!("{resource} resource"), current));
    }
    let Some(target_utilization) = target.average_utilization else {
        return Err("invalid resource metric source: neither an average utilization target nor an average value (usage) target was set".into());
    };
    let (metrics, _) = fetch().map_err(|err| {
        format!("failed to get {resource} utilization: unable to get metrics for resource {resource}: {err}")
    })?;
    let result = replica_calculator::resource_replicas(config, sample(metrics), target_utilization)
        .map_err(|err| format!("failed to get {resource} utilization: {err}"))?;
    let name = if container.is_some() {
        format!("{resource} container resource utilization (percentage of request)")
    } else {
        format!("{resource} resource utilization (percentage of request)")
    };
    let current = MetricValueStatus {
        average_utilization: Some(result.utilization),
        average_value: Some(milli_quantity(result.raw_average)),
        ..Default::default()
    };
    Ok((result.replicas, name, current))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::podautoscaler::replica_calculator::tests::pod;
    use k8s_metrics::metrics::{Container, Usage};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use serde_json::json;

    fn hpa(metrics: serde_json::Value) -> HorizontalPodAutoscaler {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "generation": 2},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                "minReplicas": 1, "maxReplicas": 10, "metrics": metrics,
            },
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn cpu_utilization(target: i32) -> serde_json::Value {
        json!([{"type": "Resource", "resource": {"name": "cpu",
            "target": {"type": "Utilization", "averageUtilization": target}}}])
    }

    fn scale(replicas: i32, selector: &str) -> Scale {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"replicas": replicas},
            "status": {"replicas": replicas, "selector": selector},
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn usage(name: &str, cpu_milli: i64, now: Timestamp) -> PodMetrics {
        let mut m = PodMetrics::default();
        m.metadata.name = Some(name.into());
        m.metadata.namespace = Some("ns".into());
        m.timestamp = Time(now);
        m.window = std::time::Duration::from_secs(30);
        m.containers = vec![Container {
            name: "app".into(),
            usage: Usage {
                cpu: Quantity(format!("{cpu_milli}m")),
                memory: Quantity("1Mi".into()),
            },
        }];
        m
    }

    fn condition<'a>(status: &'a HorizontalPodAutoscalerStatus, type_: &str) -> (&'a str, &'a str) {
        status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == type_)
            .map_or(("", ""), |c| {
                (c.status.as_str(), c.reason.as_deref().unwrap_or(""))
            })
    }

    struct Case {
        hpa: HorizontalPodAutoscaler,
        scale: Scale,
        pods: Vec<Pod>,
        others: Vec<(String, LabelSelector)>,
        metrics: Option<Result<Vec<PodMetrics>, String>>,
        now: Timestamp,
    }

    impl Case {
        fn new(replicas: i32, usages: &[i64]) -> Self {
            let now = Timestamp::now();
            let pods = (0..usages.len())
                .map(|i| pod(&format!("p{i}"), "Running", true, &[("app", "1")], now))
                .collect();
            let metrics = usages
                .iter()
                .enumerate()
                .map(|(i, u)| usage(&format!("p{i}"), *u, now))
                .collect();
            Case {
                hpa: hpa(cpu_utilization(30)),
                scale: scale(replicas, "app=web"),
                pods,
                others: Vec::new(),
                metrics: Some(Ok(metrics)),
                now,
            }
        }

        fn run(&self, write: Option<Result<(), String>>) -> Outcome {
            let refs: Vec<&Pod> = self.pods.iter().collect();
            let observed = Observed {
                hpa: &self.hpa,
                key: "ns/web",
                scale: &self.scale,
                pods: &refs,
                other_selectors: &self.others,
                pod_metrics: self.metrics.clone(),
                now: self.now,
            };
            let mut history = History::default();
            match plan(&observed, &mut history, &Config::default()) {
                Decision::Proceed(plan) => {
                    let write = if plan.rescale { write } else { None };
                    finish(&self.hpa, plan, write, &mut history, self.now)
                }
                Decision::Stop(outcome) => outcome,
            }
        }
    }

    fn reasons(outcome: &Outcome) -> Vec<(&'static str, &str)> {
        outcome
            .events
            .iter()
            .map(|e| (e.reason, e.message.as_str()))
            .collect()
    }

    #[test]
    fn a_rescale_writes_upstreams_status_and_event() {
        let case = Case::new(3, &[300, 500, 700]);
        let outcome = case.run(Some(Ok(())));
        assert_eq!(
            reasons(&outcome),
            [(
                "SuccessfulRescale",
                "New size: 5; reason: cpu resource utilization (percentage of request) above target"
            )]
        );
        let status = &outcome.status;
        assert_eq!(
            (status.current_replicas, status.desired_replicas),
            (Some(3), 5)
        );
        assert_eq!(status.observed_generation, Some(2));
        assert!(status.last_scale_time.is_some());
        assert_eq!(
            condition(status, ABLE_TO_SCALE),
            ("True", "SucceededRescale")
        );
        assert_eq!(
            condition(status, SCALING_ACTIVE),
            ("True", "ValidMetricFound")
        );
        assert_eq!(
            condition(status, SCALING_LIMITED),
            ("False", "DesiredWithinRange")
        );
        let current = status
            .current_metrics
            .as_ref()
            .and_then(|m| m[0].resource.as_ref());
        let current = current.map(|r| {
            (
                r.current.average_utilization,
                r.current.average_value.clone(),
            )
        });
        assert_eq!(current, Some((Some(50), Some(Quantity("500m".into())))));
        assert!(outcome.error.is_none());
    }

    #[test]
    fn a_failed_scale_update_keeps_the_replicas() {
        let case = Case::new(3, &[300, 500, 700]);
        let outcome = case.run(Some(Err("conflict".into())));
        assert_eq!(
            reasons(&outcome),
            [(
                "FailedRescale",
                "New size: 5; reason: cpu resource utilization (percentage of request) above target; error: conflict"
            )]
        );
        assert_eq!(
            condition(&outcome.status, ABLE_TO_SCALE),
            ("False", "FailedUpdateScale")
        );
        assert_eq!(outcome.status.current_replicas, Some(3));
        assert!(outcome.status.last_scale_time.is_none());
    }

    #[test]
    fn zero_replicas_disable_scaling() {
        let case = Case::new(0, &[]);
        let outcome = case.run(None);
        assert!(outcome.events.is_empty());
        assert_eq!(
            condition(&outcome.status, SCALING_ACTIVE),
            ("False", "ScalingDisabled")
        );
        assert_eq!(
            condition(&outcome.status, ABLE_TO_SCALE),
            ("True", "SucceededGetScale")
        );
        assert_eq!(outcome.status.desired_replicas, 0);
    }

    #[test]
    fn replicas_outside_the_bounds_are_brought_in() {
        let case = Case::new(12, &[]);
        let outcome = case.run(Some(Ok(())));
        assert_eq!(
            reasons(&outcome),
            [(
                "SuccessfulRescale",
                "New size: 10; reason: Current number of replicas above Spec.MaxReplicas"
            )]
        );
    }

    #[test]
    fn selector_problems_stop_scaling() {
        let mut case = Case::new(3, &[300, 500, 700]);
        case.scale = scale(3, "");
        let outcome = case.run(None);
        assert_eq!(
            reasons(&outcome),
            [
                ("SelectorRequired", "selector is required"),
                ("FailedComputeMetricsReplicas", "selector is required")
            ]
        );
        assert_eq!(
            condition(&outcome.status, SCALING_ACTIVE),
            ("False", "InvalidSelector")
        );

        case.scale = scale(3, "app=web");
        case.others = vec![(
            "ns/other".into(),
            LabelSelector::parse("app").unwrap_or_else(|e| panic!("{e}")),
        )];
        let outcome = case.run(None);
        assert_eq!(
            condition(&outcome.status, SCALING_ACTIVE),
            ("False", "AmbiguousSelector")
        );
        assert_eq!(
            outcome.events[0].message,
            "pods by selector app=web are controlled by multiple HPAs: [ns/other ns/web]"
        );
    }

    #[test]
    fn unavailable_metrics_set_scaling_active_false() {
        let mut case = Case::new(3, &[300, 500, 700]);
        case.metrics = Some(Err(
            "unable to fetch metrics from resource metrics API: 404".into(),
        ));
        let outcome = case.run(None);
        let message = "failed to get cpu utilization: unable to get metrics for resource cpu: unable to fetch metrics from resource metrics API: 404";
        assert_eq!(outcome.events[0].reason, "FailedGetResourceMetric");
        assert_eq!(outcome.events[0].message, message);
        assert_eq!(outcome.events[1].reason, "FailedComputeMetricsReplicas");
        let active = outcome
            .status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == SCALING_ACTIVE);
        assert_eq!(
            active.and_then(|c| c.message.clone()),
            Some(format!(
                "the HPA was unable to compute the replica count: {message}"
            ))
        );
        assert_eq!(outcome.status.current_replicas, Some(3));

        case.hpa = hpa(
            json!([{"type": "External", "external": {"metric": {"name": "queue"},
            "target": {"type": "Value", "value": "10"}}}]),
        );
        let outcome = case.run(None);
        assert_eq!(
            condition(&outcome.status, SCALING_ACTIVE),
            ("False", "FailedGetExternalMetric")
        );
    }

    #[test]
    fn a_failing_metric_beside_a_working_one_still_scales_up() {
        let mut case = Case::new(3, &[300, 500, 700]);
        case.hpa = hpa(json!([
            {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 30}}},
            {"type": "Pods", "pods": {"metric": {"name": "qps"}, "target": {"type": "AverageValue", "averageValue": "1"}}},
        ]));
        let outcome = case.run(Some(Ok(())));
        assert_eq!(outcome.status.desired_replicas, 5);
        assert_eq!(
            condition(&outcome.status, SCALING_ACTIVE),
            ("True", "ValidMetricFound")
        );
        assert!(
            outcome
                .error
                .is_some_and(|e| e.starts_with("invalid metrics (1 invalid out of 2)"))
        );
    }

    #[test]
    fn a_failed_scale_read_sets_able_to_scale_false() {
        let outcome = failed_get_scale(
            &hpa(cpu_utilization(50)),
            "the server could not find the requested resource",
            Timestamp::now(),
        );
        assert_eq!(
            condition(&outcome.status, ABLE_TO_SCALE),
            ("False", "FailedGetScale")
        );
        assert_eq!(outcome.events[0].reason, "FailedGetScale");
    }

    #[test]
    fn conditions_move_their_transition_time_only_on_a_change() {
        let then = Timestamp::now();
        let later = then + k8s_openapi::jiff::SignedDuration::from_secs(60);
        let mut status = HorizontalPodAutoscalerStatus::default();
        set_condition(&mut status, ABLE_TO_SCALE, true, "A", "a", then);
        set_condition(&mut status, ABLE_TO_SCALE, true, "B", "b", later);
        let first = status
            .conditions
            .as_ref()
            .map(|c| c[0].clone())
            .unwrap_or_default();
        assert_eq!(
            (first.reason.as_deref(), first.last_transition_time),
            (Some("B"), Some(Time(then)))
        );
        set_condition(&mut status, ABLE_TO_SCALE, false, "C", "c", later);
        let first = status
            .conditions
            .as_ref()
            .map(|c| c[0].clone())
            .unwrap_or_default();
        assert_eq!(first.last_transition_time, Some(Time(later)));
    }
}
