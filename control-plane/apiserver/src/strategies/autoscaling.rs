//! The HorizontalPodAutoscaler strategy (`autoscaling/v2`): upstream's defaults
//! (`SetDefaults_HorizontalPodAutoscaler`: one replica at least, 80 % CPU when no metric is
//! named, a `behavior`'s missing rules and fields filled) and its printer columns.

use super::*;

/// Upstream's utilization target when an HPA names no metric.
const DEFAULT_CPU_UTILIZATION: i64 = 80;

/// HorizontalPodAutoscalers: defaults, and Name, Reference, Targets, MinPods, MaxPods,
/// Replicas, Age.
pub struct HorizontalPodAutoscalerStrategy;
impl Strategy for HorizontalPodAutoscalerStrategy {
    fn default(&self, obj: &mut Value) {
        set_default(obj, &["spec", "minReplicas"], json!(1));
        if at(obj, &["spec", "metrics"])
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
        {
            meta::set_at(
                obj,
                &["spec", "metrics"],
                json!([{"type": "Resource", "resource": {"name": "cpu",
                    "target": {"type": "Utilization", "averageUtilization": DEFAULT_CPU_UTILIZATION}}}]),
            );
        }
        if at(obj, &["spec", "behavior"]).is_some_and(Value::is_object) {
            // Upstream's GenerateHPAScaleUpRules / GenerateHPAScaleDownRules: a missing rule
            // set is the default one, a present one gets each missing field from it.
            let scale_up = json!({"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15},
                             {"type": "Percent", "value": 100, "periodSeconds": 15}]});
            let scale_down = json!({"selectPolicy": "Max",
                "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}]});
            for (direction, defaults) in [("scaleUp", scale_up), ("scaleDown", scale_down)] {
                let Some(fields) = defaults.as_object() else {
                    continue;
                };
                for (field, value) in fields {
                    set_default(obj, &["spec", "behavior", direction, field], value.clone());
                }
            }
        }
    }
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new(
                "Reference",
                "string",
                "scaleTargetRef points to the target resource to scale, and is used to the pods for which metrics should be collected, as well as to actually change the replica count.",
                |o| {
                    json!(format!(
                        "{}/{}",
                        str_at(o, &["spec", "scaleTargetRef", "kind"]).unwrap_or(""),
                        str_at(o, &["spec", "scaleTargetRef", "name"]).unwrap_or("")
                    ))
                },
            ),
            Column::new(
                "Targets",
                "string",
                "metrics contains the specifications for which to use to calculate the desired replica count (the maximum replica count across all metrics will be used).",
                |o| json!(targets(o)),
            ),
            Column::new(
                "MinPods",
                "string",
                "minReplicas is the lower limit for the number of replicas to which the autoscaler can scale down.",
                |o| {
                    json!(
                        match at(o, &["spec", "minReplicas"]).and_then(Value::as_i64) {
                            Some(min) => min.to_string(),
                            None => "<unset>".to_string(),
                        }
                    )
                },
            ),
            Column::new(
                "MaxPods",
                "integer",
                "maxReplicas is the upper limit for the number of replicas to which the autoscaler can scale up.",
                |o| int_at(o, &["spec", "maxReplicas"]),
            ),
            Column::new(
                "Replicas",
                "integer",
                "currentReplicas is current number of replicas of pods managed by this autoscaler, as last seen by the autoscaler.",
                |o| int_at(o, &["status", "currentReplicas"]),
            ),
            age_column(),
        ]
    }
}

/// A quantity or utilization as the printer writes it: the value's own text, `N%`.
fn printed(value: Option<&Value>, percent: bool) -> Option<String> {
    match value? {
        Value::Number(n) if percent => Some(format!("{n}%")),
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(s.clone()),
        _ => None,
    }
}

/// Upstream's `formatHPAMetrics`: each metric's current value (or `<unknown>`) over its
/// target, the first two, then how many more.
fn targets(hpa: &Value) -> String {
    let specs = at(hpa, &["spec", "metrics"])
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if specs.is_empty() {
        return "<none>".into();
    }
    let statuses = at(hpa, &["status", "currentMetrics"])
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let unknown = || "<unknown>".to_string();
    let listed: Vec<String> = specs
        .iter()
        .enumerate()
        .map(|(index, spec)| {
            let status = statuses.get(index);
            let current = |source: &str, field: &str, percent: bool| {
                status
                    .and_then(|s| printed(s[source]["current"].get(field), percent))
                    .unwrap_or_else(unknown)
            };
            match spec["type"].as_str().unwrap_or("") {
                kind @ ("Resource" | "ContainerResource") => {
                    let source = if kind == "Resource" {
                        "resource"
                    } else {
                        "containerResource"
                    };
                    let name = spec[source]["name"].as_str().unwrap_or("");
                    let target = &spec[source]["target"];
                    match printed(target.get("averageValue"), false) {
                        Some(average) => format!(
                            "{name}: {}/{average}",
                            current(source, "averageValue", false)
                        ),
                        None => format!(
                            "{name}: {}/{}",
                            current(source, "averageUtilization", true),
                            printed(target.get("averageUtilization"), true)
                                .unwrap_or_else(|| "<auto>".into())
                        ),
                    }
                }
                "Pods" => format!(
                    "{}/{}",
                    current("pods", "averageValue", false),
                    printed(spec["pods"]["target"].get("averageValue"), false)
                        .unwrap_or_else(unknown)
                ),
                kind @ ("Object" | "External") => {
                    let source = if kind == "Object" {
                        "object"
                    } else {
                        "external"
                    };
                    let target = &spec[source]["target"];
                    match printed(target.get("averageValue"), false) {
                        Some(average) => {
                            format!("{}/{average} (avg)", current(source, "averageValue", false))
                        }
                        None => format!(
                            "{}/{}",
                            current(source, "value", false),
                            printed(target.get("value"), false).unwrap_or_else(unknown)
                        ),
                    }
                }
                _ => "<unknown type>".into(),
            }
        })
        .collect();
    const SHOWN: usize = 2;
    if listed.len() > SHOWN {
        format!(
            "{} + {} more...",
            listed[..SHOWN].join(", "),
            listed.len() - SHOWN
        )
    } else {
        listed.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fill_min_replicas_a_cpu_metric_and_the_behavior() {
        let mut hpa = json!({"spec": {"maxReplicas": 3, "behavior": {"scaleDown": {"stabilizationWindowSeconds": 20}}}});
        HorizontalPodAutoscalerStrategy.default(&mut hpa);
        assert_eq!(hpa["spec"]["minReplicas"], 1);
        assert_eq!(
            hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
            80
        );
        assert_eq!(
            hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"],
            20
        );
        assert_eq!(hpa["spec"]["behavior"]["scaleDown"]["selectPolicy"], "Max");
        assert_eq!(
            hpa["spec"]["behavior"]["scaleDown"]["policies"][0]["type"],
            "Percent"
        );
        assert_eq!(
            hpa["spec"]["behavior"]["scaleUp"]["stabilizationWindowSeconds"],
            0
        );
        assert_eq!(
            hpa["spec"]["behavior"]["scaleUp"]["policies"][0]["value"],
            4
        );
        // Without a behavior none is added.
        let mut plain = json!({"spec": {"maxReplicas": 3, "minReplicas": 2}});
        HorizontalPodAutoscalerStrategy.default(&mut plain);
        assert!(plain["spec"].get("behavior").is_none());
        assert_eq!(plain["spec"]["minReplicas"], 2);
    }

    #[test]
    fn targets_are_printed_as_upstreams_printer_writes_them() {
        let hpa = json!({"spec": {"metrics": [
            {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}},
            {"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "100Mi"}}},
            {"type": "Pods", "pods": {"metric": {"name": "qps"}, "target": {"type": "AverageValue", "averageValue": "10"}}},
        ]}, "status": {"currentMetrics": [
            {"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 200, "averageValue": "200m"}}},
        ]}});
        assert_eq!(
            targets(&hpa),
            "cpu: 200%/50%, memory: <unknown>/100Mi + 1 more..."
        );
        assert_eq!(targets(&json!({"spec": {}})), "<none>");
    }
}
