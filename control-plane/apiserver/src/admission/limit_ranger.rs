//! Upstream's LimitRanger admission plugin: the namespace's LimitRanges default a new pod's
//! container requests and limits (noting what they set in `kubernetes.io/limit-ranger`) and
//! refuse a pod or claim outside their min, max and maxLimitRequestRatio, with upstream's
//! messages. The rules are `flotilla_api_machinery::limit_range`.

use flotilla_api_machinery::limit_range;
use k8s_openapi::api::core::v1::{LimitRange, PersistentVolumeClaim, Pod};
use serde_json::Value;

use super::{Attributes, Context, Operation, Plugin, forbidden};
use crate::error::ApiError;

/// The LimitRanger plugin.
pub struct LimitRanger;

impl LimitRanger {
    async fn limit_ranges(
        context: &Context<'_>,
        namespace: &str,
    ) -> Result<Vec<LimitRange>, ApiError> {
        let resource = context.resource("", "v1", "limitranges")?;
        Ok(context
            .list_cached(resource, Some(namespace))
            .await?
            .iter()
            .filter_map(|range| serde_json::from_value(range.clone()).ok())
            .collect())
    }
}

#[async_trait::async_trait]
impl Plugin for LimitRanger {
    fn name(&self) -> &'static str {
        limit_range::PLUGIN_NAME
    }

    fn handles(&self, attributes: &Attributes<'_>) -> bool {
        let operation = match attributes.operation {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete | Operation::Connect => return false,
        };
        attributes.resource.group.is_empty()
            && !attributes.namespace.is_empty()
            && limit_range::applies(
                operation,
                &attributes.resource.plural,
                attributes.subresource,
            )
    }

    async fn admit(
        &self,
        context: &Context<'_>,
        attributes: &Attributes<'_>,
        object: &mut Value,
        _warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        if attributes.resource.plural != "pods" {
            // Upstream never defaults claims: their storage request is required.
            return Ok(());
        }
        let ranges = Self::limit_ranges(context, attributes.namespace).await?;
        if ranges.is_empty() {
            return Ok(());
        }
        let Ok(mut pod) = serde_json::from_value::<Pod>(object.clone()) else {
            // A body that is not a pod is refused, with the reason, by the registry.
            return Ok(());
        };
        limit_range::default_pod(&ranges, &mut pod);
        // Only what defaulting sets is written back, so the body keeps every field the
        // client sent (unknown ones included, for fieldValidation to judge).
        if let Some(spec) = &pod.spec {
            for (list, containers) in [
                ("containers", Some(&spec.containers)),
                ("initContainers", spec.init_containers.as_ref()),
            ] {
                for (index, container) in containers.into_iter().flatten().enumerate() {
                    if let (Some(resources), Some(target)) = (
                        &container.resources,
                        object.pointer_mut(&format!("/spec/{list}/{index}")),
                    ) {
                        target["resources"] =
                            serde_json::to_value(resources).map_err(ApiError::internal)?;
                    }
                }
            }
        }
        if let Some(note) = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(limit_range::LIMIT_RANGER_ANNOTATION))
        {
            crate::meta::set_at(
                object,
                &[
                    "metadata",
                    "annotations",
                    limit_range::LIMIT_RANGER_ANNOTATION,
                ],
                Value::String(note.clone()),
            );
        }
        Ok(())
    }

    async fn validate(
        &self,
        context: &Context<'_>,
        attributes: &Attributes<'_>,
        object: &Value,
        _warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        let ranges = Self::limit_ranges(context, attributes.namespace).await?;
        if ranges.is_empty() {
            return Ok(());
        }
        let outcome = match &*attributes.resource.plural {
            "pods" => match serde_json::from_value::<Pod>(object.clone()) {
                Ok(pod) => limit_range::validate_pod(&ranges, &pod),
                Err(_) => Ok(()),
            },
            _ => match serde_json::from_value::<PersistentVolumeClaim>(object.clone()) {
                Ok(claim) => limit_range::validate_claim(&ranges, &claim),
                Err(_) => Ok(()),
            },
        };
        outcome.map_err(|errors| forbidden(attributes, object, &limit_range::aggregate(&errors)))
    }
}
