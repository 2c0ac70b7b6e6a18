//! Reading pods' resource usage from `metrics.k8s.io/v1beta1` (upstream's REST metrics client,
//! `metrics/client.go`): one list of the selected pods' PodMetrics, reduced to a milli-value per
//! pod (the sum of its containers, or the one named container), with the sample's time and
//! window; and quantities as upstream's `MilliValue` reads them.

use std::collections::BTreeMap;
use std::time::Duration;

use flotilla_api_machinery::quantity::Quantity;
use k8s_metrics::v1beta1::PodMetrics;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};

/// One pod's usage of a resource (upstream's `PodMetric`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodMetric {
    /// When the sample was taken.
    pub timestamp: Timestamp,
    /// How long the sample was averaged over.
    pub window: Duration,
    /// The usage in milli-units (millicores, millibytes).
    pub value: i64,
}

/// Usage by pod name (upstream's `PodMetricsInfo`).
pub type PodMetricsInfo = BTreeMap<String, PodMetric>;

/// Why the metrics API gave nothing usable; the messages are upstream's.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The list call failed (the API is not served, or the request failed).
    #[error("unable to fetch metrics from resource metrics API: {0}")]
    Fetch(#[source] kube::Error),
    /// The list was empty.
    #[error("no metrics returned from resource metrics API")]
    Empty,
    /// A pod's metrics lack the container a ContainerResource metric names.
    #[error(
        "failed to get container metrics: container {container} not present in metrics for pod {namespace}/{pod}"
    )]
    MissingContainer {
        /// The container the metric names.
        container: String,
        /// The pod's namespace.
        namespace: String,
        /// The pod.
        pod: String,
    },
}

/// The PodMetrics of the pods `selector` (a label selector string) selects in `namespace`.
pub async fn list_pod_metrics(
    client: &kube::Client,
    namespace: &str,
    selector: &str,
) -> Result<Vec<PodMetrics>, MetricsError> {
    let api: Api<PodMetrics> = Api::namespaced(client.clone(), namespace);
    let list = api
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(MetricsError::Fetch)?;
    Ok(list.items)
}

/// Upstream's `GetResourceMetric` over listed `items`: each pod's usage of `resource` (`cpu` or
/// `memory`), summed over its containers or of `container` alone, and the first item's time.
/// A pod missing a container's usage is left out (its metric counts as missing).
pub fn resource_metric(
    items: &[PodMetrics],
    resource: &str,
    container: Option<&str>,
) -> Result<(PodMetricsInfo, Timestamp), MetricsError> {
    let first = items.first().ok_or(MetricsError::Empty)?;
    let mut info = PodMetricsInfo::new();
    for item in items {
        let name = item.metadata.name.clone().unwrap_or_default();
        let sample = |value| PodMetric {
            timestamp: item.timestamp.0,
            window: item.window,
            value,
        };
        match container {
            Some(wanted) => {
                let Some(found) = item.containers.iter().find(|c| c.name == wanted) else {
                    return Err(MetricsError::MissingContainer {
                        container: wanted.to_string(),
                        namespace: item.metadata.namespace.clone().unwrap_or_default(),
                        pod: name,
                    });
                };
                if let Some(value) = usage_of(&found.usage, resource) {
                    info.insert(name, sample(value));
                }
            }
            None => {
                if item.containers.is_empty() {
                    continue;
                }
                let sum = item
                    .containers
                    .iter()
                    .map(|c| usage_of(&c.usage, resource))
                    .try_fold(0i64, |sum, value| value.map(|v| sum.saturating_add(v)));
                if let Some(sum) = sum {
                    info.insert(name, sample(sum));
                }
            }
        }
    }
    Ok((info, first.timestamp.0))
}

/// A container's usage of `resource` in milli-units; `None` when not reported.
fn usage_of(usage: &k8s_metrics::metrics::Usage, resource: &str) -> Option<i64> {
    match resource {
        "cpu" => milli_value(&usage.cpu.0),
        "memory" => milli_value(&usage.memory.0),
        _ => None,
    }
}

/// Upstream's `Quantity.MilliValue`: the quantity in thousandths, rounded up; `None` when
/// `text` is not a quantity.
pub fn milli_value(text: &str) -> Option<i64> {
    let millis = Quantity::parse(text).ok()?.milli_value();
    Some(i64::try_from(millis).unwrap_or(if millis < 0 { i64::MIN } else { i64::MAX }))
}

/// Upstream's `resource.NewMilliQuantity(value, DecimalSI)` as its canonical string.
pub fn milli_quantity(value: i64) -> k8s_openapi::apimachinery::pkg::api::resource::Quantity {
    let text = Quantity::parse(&format!("{value}m"))
        .map_or_else(|_| format!("{value}m"), |q| q.to_string());
    k8s_openapi::apimachinery::pkg::api::resource::Quantity(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_metrics::metrics::{Container, Usage};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;

    fn pod_metrics(name: &str, containers: &[(&str, &str, &str)]) -> PodMetrics {
        let mut m = PodMetrics::default();
        m.metadata.name = Some(name.into());
        m.metadata.namespace = Some("ns".into());
        m.window = Duration::from_secs(30);
        m.containers = containers
            .iter()
            .map(|(n, cpu, mem)| Container {
                name: (*n).into(),
                usage: Usage {
                    cpu: Q((*cpu).into()),
                    memory: Q((*mem).into()),
                },
            })
            .collect();
        m
    }

    #[test]
    fn milli_values_round_up_like_upstream() {
        for (text, want) in [
            ("100m", Some(100)),
            ("1", Some(1000)),
            ("1.5", Some(1500)),
            ("250n", Some(1)),
            ("1Ki", Some(1_024_000)),
            ("1Mi", Some(1_048_576_000)),
            ("2k", Some(2_000_000)),
            ("0", Some(0)),
            ("bogus", None),
        ] {
            assert_eq!(milli_value(text), want, "{text}");
        }
        assert_eq!(milli_quantity(1500).0, "1500m");
        assert_eq!(milli_quantity(2000).0, "2");
        assert_eq!(milli_quantity(524_288_000_000).0, "524288k");
    }

    #[test]
    fn pods_sum_their_containers_and_a_container_metric_reads_one() {
        let items = [
            pod_metrics("a", &[("app", "100m", "1Mi"), ("side", "50m", "1Mi")]),
            pod_metrics("b", &[("app", "300m", "2Mi")]),
            pod_metrics("empty", &[]),
        ];
        let (info, _) = resource_metric(&items, "cpu", None).expect("metrics");
        let values: Vec<_> = info.iter().map(|(k, v)| (k.as_str(), v.value)).collect();
        assert_eq!(values, [("a", 150), ("b", 300)]);
        let err = resource_metric(&items, "cpu", Some("app")).expect_err("empty lacks app");
        assert_eq!(
            err.to_string(),
            "failed to get container metrics: container app not present in metrics for pod ns/empty"
        );
        let (info, _) = resource_metric(&items[..2], "cpu", Some("app")).expect("metrics");
        assert_eq!(info["a"].value, 100);
        assert!(matches!(
            resource_metric(&[], "cpu", None),
            Err(MetricsError::Empty)
        ));
    }
}
