//! Upstream's Priority admission plugin on pod create: `spec.priorityClassName` (or the
//! cluster's `globalDefault` PriorityClass) resolved into `spec.priority` and
//! `spec.preemptionPolicy`; an unknown class is refused with upstream's 403.

use serde_json::{Value, json};

use super::{Attributes, Context, Operation, Plugin};
use crate::error::ApiError;
use crate::meta;

/// The two classes every cluster has (upstream creates them at start-up; here they are known
/// by value even before anyone stores them).
const SYSTEM_CLASSES: [(&str, i64); 2] = [
    ("system-node-critical", 2_000_001_000),
    ("system-cluster-critical", 2_000_000_000),
];

/// The Priority plugin.
pub struct Priority;

#[async_trait::async_trait]
impl Plugin for Priority {
    fn name(&self) -> &'static str {
        "Priority"
    }

    fn handles(&self, attributes: &Attributes<'_>) -> bool {
        attributes.operation != Operation::Delete && attributes.is_core("pods")
    }

    async fn admit(
        &self,
        context: &Context<'_>,
        _attributes: &Attributes<'_>,
        pod: &mut Value,
        _warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        if pod.is_object() {
            resolve(context, pod).await?;
        }
        Ok(())
    }
}

/// Resolves the priority of `pod` (a create's body) in place.
async fn resolve(context: &Context<'_>, pod: &mut Value) -> Result<(), ApiError> {
    let classes = context.resource("scheduling.k8s.io", "v1", "priorityclasses")?;
    let name = meta::str_at(pod, &["spec", "priorityClassName"])
        .filter(|n| !n.is_empty())
        .map(str::to_string);
    let class: Option<Value> = match &name {
        Some(name) => match context.get_cached(classes, name).await? {
            Some(class) => Some(class),
            None => match SYSTEM_CLASSES.iter().find(|(n, _)| n == name) {
                Some((_, value)) => Some(json!({"metadata": {"name": name}, "value": value})),
                None => {
                    return Err(ApiError::forbidden(
                        &crate::resources::GroupResource {
                            group: String::new(),
                            resource: "pods".into(),
                        },
                        meta::name(pod),
                        &format!("no PriorityClass with name {name} was found"),
                    ));
                }
            },
        },
        None => {
            let all = context.list_cached(classes, None).await?;
            // Several global defaults: upstream takes the lowest value.
            all.iter()
                .filter(|c| c["globalDefault"] == json!(true))
                .min_by_key(|c| c["value"].as_i64().unwrap_or(0))
                .cloned()
        }
    };
    let Some(class) = class else {
        return Ok(());
    };
    let value = class["value"].as_i64().unwrap_or(0);
    let given = meta::at(pod, &["spec", "priority"]).and_then(Value::as_i64);
    if let Some(given) = given
        && given != value
    {
        return Err(ApiError::forbidden(
            &crate::resources::GroupResource {
                group: String::new(),
                resource: "pods".into(),
            },
            meta::name(pod),
            &format!(
                "the integer value of priority ({given}) must not be provided in pod spec; priority admission controller computed {value} from the given PriorityClass name"
            ),
        ));
    }
    meta::set_at(
        pod,
        &["spec", "priorityClassName"],
        json!(meta::name(&class)),
    );
    meta::set_at(pod, &["spec", "priority"], json!(value));
    let policy = class
        .get("preemptionPolicy")
        .cloned()
        .unwrap_or(json!("PreemptLowerPriority"));
    meta::set_at(pod, &["spec", "preemptionPolicy"], policy);
    Ok(())
}
