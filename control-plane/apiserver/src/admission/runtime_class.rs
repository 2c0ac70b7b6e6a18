//! Upstream's RuntimeClass admission plugin: a pod naming `spec.runtimeClassName` gets that
//! class's `overhead.podFixed` as its `spec.overhead` and the class's scheduling constraints
//! (nodeSelector merged, tolerations added); an unknown class, an overhead that differs from
//! the class's, or a nodeSelector that conflicts is refused with upstream's texts.

use serde_json::{Value, json};

use super::{Attributes, Context, Operation, Plugin, forbidden};
use crate::error::ApiError;
use crate::meta;

/// The RuntimeClass plugin.
pub struct RuntimeClass;

#[async_trait::async_trait]
impl Plugin for RuntimeClass {
    fn name(&self) -> &'static str {
        "RuntimeClass"
    }

    fn handles(&self, attributes: &Attributes<'_>) -> bool {
        attributes.operation == Operation::Create && attributes.is_core("pods")
    }

    async fn admit(
        &self,
        context: &Context<'_>,
        attributes: &Attributes<'_>,
        pod: &mut Value,
        _warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        let Some(name) = meta::str_at(pod, &["spec", "runtimeClassName"])
            .filter(|n| !n.is_empty())
            .map(str::to_string)
        else {
            return Ok(());
        };
        let classes = context.resource("node.k8s.io", "v1", "runtimeclasses")?;
        let Some(class) = context.get_cached(classes, &name).await? else {
            return Err(forbidden(
                attributes,
                pod,
                &format!("pod rejected: RuntimeClass {name:?} not found"),
            ));
        };
        apply(&class, pod).map_err(|why| forbidden(attributes, pod, &why))
    }

    async fn validate(
        &self,
        _context: &Context<'_>,
        attributes: &Attributes<'_>,
        pod: &Value,
        _warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        // A pod may carry an overhead only as its class gave it (set above).
        let has_class =
            meta::str_at(pod, &["spec", "runtimeClassName"]).is_some_and(|n| !n.is_empty());
        if !has_class && meta::at(pod, &["spec", "overhead"]).is_some_and(|o| !o.is_null()) {
            return Err(forbidden(
                attributes,
                pod,
                "pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead",
            ));
        }
        Ok(())
    }
}

/// The class's overhead and scheduling onto `pod`, or upstream's refusal.
fn apply(class: &Value, pod: &mut Value) -> Result<(), String> {
    if let Some(fixed) = meta::at(class, &["overhead", "podFixed"]).filter(|o| !o.is_null()) {
        match meta::at(pod, &["spec", "overhead"]).filter(|o| !o.is_null()) {
            Some(given) if given != fixed => {
                return Err(
                    "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead"
                        .into(),
                );
            }
            _ => meta::set_at(pod, &["spec", "overhead"], fixed.clone()),
        }
    }
    if let Some(selector) =
        meta::at(class, &["scheduling", "nodeSelector"]).and_then(Value::as_object)
    {
        for (key, value) in selector {
            match meta::at(pod, &["spec", "nodeSelector", key]) {
                Some(existing) if existing != value => {
                    return Err(format!(
                        "conflict: runtimeClass.scheduling.nodeSelector[{key}] = {}; pod.spec.nodeSelector[{key}] = {}",
                        value.as_str().unwrap_or(""),
                        existing.as_str().unwrap_or("")
                    ));
                }
                _ => meta::set_at(pod, &["spec", "nodeSelector", key], value.clone()),
            }
        }
    }
    if let Some(tolerations) =
        meta::at(class, &["scheduling", "tolerations"]).and_then(Value::as_array)
    {
        let mut merged: Vec<Value> = meta::at(pod, &["spec", "tolerations"])
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for toleration in tolerations {
            if !merged.contains(toleration) {
                merged.push(toleration.clone());
            }
        }
        meta::set_at(pod, &["spec", "tolerations"], json!(merged));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_gives_its_overhead_and_scheduling_and_refuses_conflicts() {
        let class = json!({"handler": "kata",
            "overhead": {"podFixed": {"cpu": "250m", "memory": "120Mi"}},
            "scheduling": {"nodeSelector": {"sandbox": "kata"},
                "tolerations": [{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}]}});
        let mut pod = json!({"spec": {"runtimeClassName": "kata", "containers": [{"name": "c"}],
            "nodeSelector": {"zone": "a"}}});
        apply(&class, &mut pod).expect("applies");
        assert_eq!(pod["spec"]["overhead"]["cpu"], "250m");
        assert_eq!(
            pod["spec"]["nodeSelector"],
            json!({"zone": "a", "sandbox": "kata"})
        );
        assert_eq!(pod["spec"]["tolerations"].as_array().map(Vec::len), Some(1));
        // Applying twice changes nothing (the same toleration is not added again).
        let once = pod.clone();
        apply(&class, &mut pod).expect("applies");
        assert_eq!(pod, once);

        let mut conflicting = json!({"spec": {"nodeSelector": {"sandbox": "gvisor"}}});
        assert_eq!(
            apply(&class, &mut conflicting),
            Err("conflict: runtimeClass.scheduling.nodeSelector[sandbox] = kata; pod.spec.nodeSelector[sandbox] = gvisor".into())
        );
        let mut other_overhead = json!({"spec": {"overhead": {"cpu": "1"}}});
        assert!(apply(&class, &mut other_overhead).is_err());
    }
}
