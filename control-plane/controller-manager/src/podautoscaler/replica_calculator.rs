//! Upstream's replica calculator (`replica_calculator.go` with `metrics/utilization.go`), sans
//! IO: from the target's pods, their usage and the target, the replica count a resource metric
//! asks for. Pods not ready (or still in their CPU initialization) and pods without metrics
//! are left out of the first estimate and then counted against the direction it points in.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use super::metrics::{PodMetric, PodMetricsInfo, milli_value};

/// The calculator's settings (upstream's `--horizontal-pod-autoscaler-*` flags).
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// The relative change of usage below which the replica count stays.
    pub tolerance: f64,
    /// How long after a pod starts its CPU samples may still be skewed by its start-up.
    pub cpu_initialization_period: Duration,
    /// How long after a pod starts an unready pod counts as never having been ready.
    pub delay_of_initial_readiness_status: Duration,
}

impl Default for Config {
    /// Upstream's defaults: 0.1, 5 minutes, 30 seconds.
    fn default() -> Self {
        Self {
            tolerance: 0.1,
            cpu_initialization_period: Duration::from_secs(5 * 60),
            delay_of_initial_readiness_status: Duration::from_secs(30),
        }
    }
}

/// Why no replica count came out; the messages are upstream's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CalculatorError {
    /// The selector selects no pod.
    #[error("no pods returned by selector while calculating replica count")]
    NoPods,
    /// Every pod with metrics was left out.
    #[error("did not receive metrics for targeted pods (pods might be unready)")]
    NoReadyMetrics,
    /// A pod's container requests nothing of the resource, so utilization has no base.
    #[error("missing request for {resource} in container {container} of Pod {pod}")]
    MissingRequest {
        /// The resource.
        resource: String,
        /// The container without the request.
        container: String,
        /// The pod.
        pod: String,
    },
    /// No metric belongs to a pod with requests.
    #[error("no metrics returned matched known pods")]
    NoMatchedMetrics,
}

/// What a utilization target yields (upstream's `GetResourceReplicas` results).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceReplicas {
    /// The replica count the metric asks for.
    pub replicas: i32,
    /// The pods' average utilization, in percent of their requests.
    pub utilization: i32,
    /// The pods' average usage in milli-units.
    pub raw_average: i64,
}

/// What the calculator reads of one metric: the target's pods and their usage.
#[derive(Debug, Clone)]
pub struct Sample<'a> {
    /// The target's replicas now (its scale's `spec.replicas`).
    pub current_replicas: i32,
    /// `cpu` or `memory`.
    pub resource: &'a str,
    /// The container a ContainerResource metric names; `None` for the whole pod.
    pub container: Option<&'a str>,
    /// The pods the target's selector selects.
    pub pods: &'a [&'a Pod],
    /// Their usage.
    pub metrics: PodMetricsInfo,
    /// The time the pods' readiness is judged at.
    pub now: Timestamp,
}

/// Upstream's `GetResourceReplicas`: the replicas that bring the resource's utilization
/// (percent of the requests of all containers, or of the one container) to
/// `target_utilization`.
pub fn resource_replicas(
    config: &Config,
    sample: Sample<'_>,
    target_utilization: i32,
) -> Result<ResourceReplicas, CalculatorError> {
    let Sample {
        current_replicas,
        resource,
        container,
        pods,
        mut metrics,
        now,
    } = sample;
    if pods.is_empty() {
        return Err(CalculatorError::NoPods);
    }
    let groups = group_pods(config, pods, &metrics, resource, now);
    remove_metrics_for_pods(&mut metrics, &groups.ignored);
    remove_metrics_for_pods(&mut metrics, &groups.unready);
    if metrics.is_empty() {
        return Err(CalculatorError::NoReadyMetrics);
    }
    let requests = pod_requests(pods, container, resource)?;
    let (usage_ratio, utilization, raw_average) =
        resource_utilization_ratio(&metrics, &requests, target_utilization)?;
    let result = |replicas| ResourceReplicas {
        replicas,
        utilization,
        raw_average,
    };

    let scale_up_with_unready = !groups.unready.is_empty() && usage_ratio > 1.0;
    if !scale_up_with_unready && groups.missing.is_empty() {
        if (1.0 - usage_ratio).abs() <= config.tolerance {
            return Ok(result(current_replicas));
        }
        return Ok(result(ceil(usage_ratio * groups.ready as f64)));
    }

    if !groups.missing.is_empty() {
        if usage_ratio < 1.0 {
            // On a scale-down a missing pod counts as using its whole request (or the target,
            // when that is above 100%).
            let fallback = i64::from(target_utilization.max(100));
            for pod in &groups.missing {
                let request = requests.get(pod).copied().unwrap_or(0);
                metrics.insert(pod.clone(), zero_metric(request * fallback / 100));
            }
        } else if usage_ratio > 1.0 {
            for pod in &groups.missing {
                metrics.insert(pod.clone(), zero_metric(0));
            }
        }
    }
    if scale_up_with_unready {
        for pod in &groups.unready {
            metrics.insert(pod.clone(), zero_metric(0));
        }
    }

    let (new_usage_ratio, _, _) =
        resource_utilization_ratio(&metrics, &requests, target_utilization)?;
    if (1.0 - new_usage_ratio).abs() <= config.tolerance
        || (usage_ratio < 1.0 && new_usage_ratio > 1.0)
        || (usage_ratio > 1.0 && new_usage_ratio < 1.0)
    {
        // Too small a change, or the filled-in pods reverse its direction.
        return Ok(result(current_replicas));
    }
    let new_replicas = ceil(new_usage_ratio * metrics.len() as f64);
    if (new_usage_ratio < 1.0 && new_replicas > current_replicas)
        || (new_usage_ratio > 1.0 && new_replicas < current_replicas)
    {
        return Ok(result(current_replicas));
    }
    Ok(result(new_replicas))
}

/// Upstream's `GetRawResourceReplicas` (`calcPlainMetricReplicas`): the replicas that bring
/// the pods' average usage to `target_usage` (milli-units). Returns the replica count and the
/// average usage.
pub fn raw_resource_replicas(
    config: &Config,
    sample: Sample<'_>,
    target_usage: i64,
) -> Result<(i32, i64), CalculatorError> {
    let Sample {
        current_replicas,
        resource,
        pods,
        mut metrics,
        now,
        ..
    } = sample;
    if pods.is_empty() {
        return Err(CalculatorError::NoPods);
    }
    let groups = group_pods(config, pods, &metrics, resource, now);
    remove_metrics_for_pods(&mut metrics, &groups.ignored);
    remove_metrics_for_pods(&mut metrics, &groups.unready);
    if metrics.is_empty() {
        return Err(CalculatorError::NoReadyMetrics);
    }
    let (usage_ratio, usage) = metric_usage_ratio(&metrics, target_usage);

    let scale_up_with_unready = !groups.unready.is_empty() && usage_ratio > 1.0;
    if !scale_up_with_unready && groups.missing.is_empty() {
        if (1.0 - usage_ratio).abs() <= config.tolerance {
            return Ok((current_replicas, usage));
        }
        return Ok((ceil(usage_ratio * groups.ready as f64), usage));
    }
    if !groups.missing.is_empty() {
        if usage_ratio < 1.0 {
            // On a scale-down a missing pod counts as using exactly the target.
            for pod in &groups.missing {
                metrics.insert(pod.clone(), zero_metric(target_usage));
            }
        } else if usage_ratio > 1.0 {
            for pod in &groups.missing {
                metrics.insert(pod.clone(), zero_metric(0));
            }
        }
    }
    if scale_up_with_unready {
        for pod in &groups.unready {
            metrics.insert(pod.clone(), zero_metric(0));
        }
    }
    let (new_usage_ratio, _) = metric_usage_ratio(&metrics, target_usage);
    if (1.0 - new_usage_ratio).abs() <= config.tolerance
        || (usage_ratio < 1.0 && new_usage_ratio > 1.0)
        || (usage_ratio > 1.0 && new_usage_ratio < 1.0)
    {
        return Ok((current_replicas, usage));
    }
    let new_replicas = ceil(new_usage_ratio * metrics.len() as f64);
    if (new_usage_ratio < 1.0 && new_replicas > current_replicas)
        || (new_usage_ratio > 1.0 && new_replicas < current_replicas)
    {
        return Ok((current_replicas, usage));
    }
    Ok((new_replicas, usage))
}

/// A filled-in sample: only its value is read.
fn zero_metric(value: i64) -> PodMetric {
    PodMetric {
        timestamp: Timestamp::UNIX_EPOCH,
        window: Duration::ZERO,
        value,
    }
}

/// Go's `int32(math.Ceil(x))`, saturating.
fn ceil(value: f64) -> i32 {
    value.ceil() as i32
}

/// The pods sorted the way upstream's `groupPods` sorts them.
#[derive(Debug, Default, PartialEq, Eq)]
struct PodGroups {
    /// Pods whose metrics count as they are.
    ready: usize,
    /// Pending pods, and (for CPU) pods unready or within their initialization.
    unready: BTreeSet<String>,
    /// Running pods without a metric.
    missing: BTreeSet<String>,
    /// Deleted and failed pods.
    ignored: BTreeSet<String>,
}

fn group_pods(
    config: &Config,
    pods: &[&Pod],
    metrics: &PodMetricsInfo,
    resource: &str,
    now: Timestamp,
) -> PodGroups {
    let mut groups = PodGroups::default();
    for pod in pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let status = pod.status.as_ref();
        let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("");
        if pod.metadata.deletion_timestamp.is_some() || phase == "Failed" {
            groups.ignored.insert(name);
            continue;
        }
        if phase == "Pending" {
            groups.unready.insert(name);
            continue;
        }
        let Some(metric) = metrics.get(&name) else {
            groups.missing.insert(name);
            continue;
        };
        if resource == "cpu" && cpu_sample_unready(config, pod, metric, now) {
            groups.unready.insert(name);
            continue;
        }
        groups.ready += 1;
    }
    groups
}

/// Whether a pod's CPU sample is left out: the pod is unready, or within its initialization
/// period and either unready or sampled less than one window after it became ready; past
/// it, only when it is unready and has never been ready.
fn cpu_sample_unready(config: &Config, pod: &Pod, metric: &PodMetric, now: Timestamp) -> bool {
    let status = pod.status.as_ref();
    let condition = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    let start = status.and_then(|s| s.start_time.as_ref()).map(|t| t.0);
    let (Some(condition), Some(start)) = (condition, start) else {
        return true;
    };
    let transition = condition
        .last_transition_time
        .as_ref()
        .map_or(Timestamp::UNIX_EPOCH, |t| t.0);
    let after = |t: Timestamp, d: Duration| t.checked_add(d).unwrap_or(Timestamp::MAX);
    if after(start, config.cpu_initialization_period) > now {
        condition.status == "False" || metric.timestamp < after(transition, metric.window)
    } else {
        condition.status == "False"
            && after(start, config.delay_of_initial_readiness_status) > transition
    }
}

/// Upstream's `calculatePodRequests`: each pod's request of `resource` in milli-units, over
/// its containers and restartable (sidecar) init containers, or of `container` alone.
fn pod_requests(
    pods: &[&Pod],
    container: Option<&str>,
    resource: &str,
) -> Result<BTreeMap<String, i64>, CalculatorError> {
    let mut requests = BTreeMap::new();
    for pod in pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let Some(spec) = pod.spec.as_ref() else {
            requests.insert(name, 0);
            continue;
        };
        let sidecars = spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"));
        let mut sum = 0i64;
        for c in spec.containers.iter().chain(sidecars) {
            if container.is_some_and(|wanted| wanted != c.name) {
                continue;
            }
            let request = c
                .resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get(resource))
                .and_then(|q| milli_value(&q.0));
            let Some(request) = request else {
                return Err(CalculatorError::MissingRequest {
                    resource: resource.to_string(),
                    container: c.name.clone(),
                    pod: name,
                });
            };
            sum = sum.saturating_add(request);
        }
        requests.insert(name, sum);
    }
    Ok(requests)
}

fn remove_metrics_for_pods(metrics: &mut PodMetricsInfo, pods: &BTreeSet<String>) {
    for pod in pods {
        metrics.remove(pod);
    }
}

/// Upstream's `GetResourceUtilizationRatio`: (usage ÷ target, utilization in percent of the
/// requests, average usage) over the pods that have both a metric and requests.
fn resource_utilization_ratio(
    metrics: &PodMetricsInfo,
    requests: &BTreeMap<String, i64>,
    target_utilization: i32,
) -> Result<(f64, i32, i64), CalculatorError> {
    let mut metrics_total = 0i64;
    let mut requests_total = 0i64;
    let mut entries = 0i64;
    for (pod, metric) in metrics {
        // A metric of a pod without requests is extraneous (missing requests fail earlier).
        let Some(request) = requests.get(pod) else {
            continue;
        };
        metrics_total = metrics_total.saturating_add(metric.value);
        requests_total = requests_total.saturating_add(*request);
        entries += 1;
    }
    if requests_total == 0 {
        return Err(CalculatorError::NoMatchedMetrics);
    }
    let utilization = (metrics_total.saturating_mul(100) / requests_total) as i32;
    Ok((
        f64::from(utilization) / f64::from(target_utilization),
        utilization,
        metrics_total / entries,
    ))
}

/// Upstream's `GetMetricUsageRatio`: (average ÷ target, average), `metrics` not empty.
fn metric_usage_ratio(metrics: &PodMetricsInfo, target_usage: i64) -> (f64, i64) {
    let total: i64 = metrics.values().map(|m| m.value).sum();
    let usage = total / (metrics.len().max(1) as i64);
    (usage as f64 / target_usage as f64, usage)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::jiff::SignedDuration;
    use serde_json::json;

    /// A running pod started an hour before `now`, ready or not since its start, with one
    /// container per `(name, cpu request)`.
    pub(crate) fn pod(
        name: &str,
        phase: &str,
        ready: bool,
        containers: &[(&str, &str)],
        now: Timestamp,
    ) -> Pod {
        let start = now - SignedDuration::from_hours(1);
        let containers: Vec<_> = containers
            .iter()
            .map(|(c, cpu)| {
                let requests = if cpu.is_empty() {
                    json!({})
                } else {
                    json!({"cpu": cpu, "memory": "1Gi"})
                };
                json!({"name": c, "image": "x", "resources": {"requests": requests}})
            })
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "labels": {"app": "web"}},
            "spec": {"containers": containers},
            "status": {
                "phase": phase,
                "startTime": start.to_string(),
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" },
                                "lastTransitionTime": start.to_string()}],
            },
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn metric(value: i64, now: Timestamp) -> PodMetric {
        PodMetric {
            timestamp: now,
            window: Duration::from_secs(30),
            value,
        }
    }

    fn metrics(values: &[(&str, i64)], now: Timestamp) -> PodMetricsInfo {
        values
            .iter()
            .map(|(n, v)| ((*n).to_string(), metric(*v, now)))
            .collect()
    }

    /// Pods `p0…` with a 1-CPU request each and the given readiness.
    fn ready_pods(readiness: &[bool], now: Timestamp) -> Vec<Pod> {
        readiness
            .iter()
            .enumerate()
            .map(|(i, ready)| pod(&format!("p{i}"), "Running", *ready, &[("app", "1")], now))
            .collect()
    }

    fn utilization(
        current: i32,
        pods: &[Pod],
        usage: &[(&str, i64)],
        target: i32,
        now: Timestamp,
    ) -> Result<ResourceReplicas, CalculatorError> {
        let refs: Vec<&Pod> = pods.iter().collect();
        let sample = Sample {
            current_replicas: current,
            resource: "cpu",
            container: None,
            pods: &refs,
            metrics: metrics(usage, now),
            now,
        };
        resource_replicas(&Config::default(), sample, target)
    }

    fn replicas(current: i32, utilization: i32, raw_average: i64) -> ResourceReplicas {
        ResourceReplicas {
            replicas: current,
            utilization,
            raw_average,
        }
    }

    #[test]
    fn scale_up_and_down_by_utilization() {
        let now = Timestamp::now();
        let pods = ready_pods(&[true; 3], now);
        let up = utilization(3, &pods, &[("p0", 300), ("p1", 500), ("p2", 700)], 30, now);
        assert_eq!(up, Ok(replicas(5, 50, 500)));
        let pods = ready_pods(&[true; 5], now);
        let usage = [
            ("p0", 100),
            ("p1", 300),
            ("p2", 500),
            ("p3", 250),
            ("p4", 250),
        ];
        let down = utilization(5, &pods, &usage, 50, now);
        assert_eq!(down, Ok(replicas(3, 28, 280)));
    }

    #[test]
    fn a_change_within_the_tolerance_keeps_the_count() {
        let now = Timestamp::now();
        let pods: Vec<Pod> = (0..3)
            .map(|i| pod(&format!("p{i}"), "Running", true, &[("app", "1150m")], now))
            .collect();
        let kept = utilization(
            3,
            &pods,
            &[("p0", 1010), ("p1", 1030), ("p2", 1020)],
            100,
            now,
        );
        assert_eq!(kept.map(|r| (r.replicas, r.utilization)), Ok((3, 88)));
        // 88% of a 100% target is outside the tolerance: a count of ceil(0.88 × 3) = 3.
        let pods = ready_pods(&[true; 3], now);
        let kept = utilization(
            3,
            &pods,
            &[("p0", 1050), ("p1", 1000), ("p2", 1000)],
            100,
            now,
        );
        assert_eq!(kept.map(|r| r.replicas), Ok(3));
    }

    #[test]
    fn unready_pods_count_as_idle_on_a_scale_up_only() {
        let now = Timestamp::now();
        let pods = ready_pods(&[false, true, true], now);
        let usage = [("p0", 300), ("p1", 500), ("p2", 700)];
        assert_eq!(
            utilization(3, &pods, &usage, 30, now),
            Ok(replicas(4, 60, 600))
        );
        // On a scale-down the unready pod is simply left out.
        let usage = [("p0", 100), ("p1", 100), ("p2", 100)];
        assert_eq!(
            utilization(3, &pods, &usage, 50, now),
            Ok(replicas(1, 10, 100))
        );
    }

    #[test]
    fn pending_failed_and_deleted_pods_are_left_out() {
        let now = Timestamp::now();
        let mut pods = ready_pods(&[true, true], now);
        pods.push(pod("pending", "Pending", false, &[("app", "1")], now));
        pods.push(pod("failed", "Failed", false, &[("app", "1")], now));
        let mut deleted = pod("deleted", "Running", true, &[("app", "1")], now);
        deleted.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now));
        pods.push(deleted);
        let usage = [
            ("p0", 900),
            ("p1", 900),
            ("failed", 5000),
            ("deleted", 5000),
        ];
        // 90% of a 50% target: ×1.8; the pending pod counts as idle: (1800 + 0) / 3000 = 60%.
        assert_eq!(
            utilization(2, &pods, &usage, 50, now),
            Ok(replicas(4, 90, 900))
        );
    }

    #[test]
    fn missing_metrics_count_as_the_request_down_and_as_nothing_up() {
        let now = Timestamp::now();
        let pods = ready_pods(&[true; 4], now);
        let down = utilization(4, &pods, &[("p0", 100), ("p1", 100), ("p2", 100)], 50, now);
        assert_eq!(down.map(|r| r.replicas), Ok(3));
        let pods = ready_pods(&[true; 3], now);
        let up = utilization(3, &pods, &[("p0", 900), ("p1", 900)], 50, now);
        assert_eq!(up.map(|r| r.replicas), Ok(4));
        // A filled-in pod that reverses the direction keeps the count.
        let pods = ready_pods(&[true; 4], now);
        let kept = utilization(4, &pods, &[("p0", 1500)], 100, now);
        assert_eq!(kept.map(|r| r.replicas), Ok(4));
    }

    #[test]
    fn a_cpu_sample_taken_too_soon_after_readiness_is_ignored() {
        let now = Timestamp::now();
        let mut young = pod("young", "Running", true, &[("app", "1")], now);
        let started = now - SignedDuration::from_secs(60);
        if let Some(status) = young.status.as_mut() {
            status.start_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                started,
            ));
            if let Some(c) = status.conditions.as_mut().and_then(|c| c.first_mut()) {
                c.last_transition_time =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        now - SignedDuration::from_secs(10),
                    ));
            }
        }
        let metrics = metrics(&[("young", 100)], now);
        let groups = group_pods(&Config::default(), &[&young], &metrics, "cpu", now);
        assert_eq!(
            groups.unready.len(),
            1,
            "sampled 10 s after readiness, window 30 s"
        );
        let groups = group_pods(&Config::default(), &[&young], &metrics, "memory", now);
        assert_eq!(groups.ready, 1, "only CPU samples wait for readiness");
    }

    #[test]
    fn missing_requests_fail_with_upstreams_message() {
        let now = Timestamp::now();
        let pods = vec![pod("p0", "Running", true, &[("container1", "")], now)];
        let err = utilization(1, &pods, &[("p0", 100)], 50, now);
        assert_eq!(
            err.map_err(|e| e.to_string()),
            Err("missing request for cpu in container container1 of Pod p0".into())
        );
        assert_eq!(
            utilization(1, &[], &[], 50, now),
            Err(CalculatorError::NoPods)
        );
        let pods = vec![pod("p0", "Pending", false, &[("app", "1")], now)];
        assert_eq!(
            utilization(1, &pods, &[("p0", 100)], 50, now),
            Err(CalculatorError::NoReadyMetrics)
        );
    }

    #[test]
    fn a_container_metric_reads_only_its_containers_request() {
        let now = Timestamp::now();
        let pods: Vec<Pod> = (0..2)
            .map(|i| {
                pod(
                    &format!("p{i}"),
                    "Running",
                    true,
                    &[("app", "500m"), ("side", "")],
                    now,
                )
            })
            .collect();
        let refs: Vec<&Pod> = pods.iter().collect();
        let sample = Sample {
            current_replicas: 2,
            resource: "cpu",
            container: Some("app"),
            pods: &refs,
            metrics: metrics(&[("p0", 500), ("p1", 500)], now),
            now,
        };
        assert_eq!(
            resource_replicas(&Config::default(), sample, 50),
            Ok(replicas(4, 100, 500))
        );
    }

    #[test]
    fn an_average_value_target_divides_the_average_usage() {
        let now = Timestamp::now();
        let pods = ready_pods(&[true; 3], now);
        let refs: Vec<&Pod> = pods.iter().collect();
        let sample = |usage: &[(&str, i64)]| Sample {
            current_replicas: 3,
            resource: "memory",
            container: None,
            pods: &refs,
            metrics: metrics(usage, now),
            now,
        };
        let config = Config::default();
        let up = raw_resource_replicas(
            &config,
            sample(&[("p0", 4000), ("p1", 4000), ("p2", 4000)]),
            2000,
        );
        assert_eq!(up, Ok((6, 4000)));
        let down = raw_resource_replicas(&config, sample(&[("p0", 1000), ("p1", 1000)]), 2000);
        // The missing pod counts as using the target: (1000 + 1000 + 2000) / 3 / 2000 = 0.67.
        assert_eq!(down, Ok((2, 1000)));
    }
}
