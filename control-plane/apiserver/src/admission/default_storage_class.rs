//! Upstream's DefaultStorageClass admission plugin: a new PersistentVolumeClaim that names no
//! class (neither `spec.storageClassName`, not even `""`, nor the beta annotation) gets the
//! cluster's default StorageClass — the newest of those annotated
//! `storageclass.kubernetes.io/is-default-class: "true"`, ties by name, as upstream picks.

use serde_json::{Value, json};

use super::{Attributes, Context, Operation, Plugin};
use crate::error::ApiError;
use crate::meta;

const DEFAULT_CLASS_ANNOTATIONS: [&str; 2] = [
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
];
const BETA_CLASS_ANNOTATION: &str = "volume.beta.kubernetes.io/storage-class";

/// The DefaultStorageClass plugin.
pub struct DefaultStorageClass;

#[async_trait::async_trait]
impl Plugin for DefaultStorageClass {
    fn name(&self) -> &'static str {
        "DefaultStorageClass"
    }

    fn handles(&self, attributes: &Attributes<'_>) -> bool {
        attributes.operation == Operation::Create && attributes.is_core("persistentvolumeclaims")
    }

    async fn admit(
        &self,
        context: &Context<'_>,
        _attributes: &Attributes<'_>,
        claim: &mut Value,
        _warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        let has_class = meta::at(claim, &["spec", "storageClassName"])
            .is_some_and(|c| !c.is_null())
            || meta::at(claim, &["metadata", "annotations", BETA_CLASS_ANNOTATION]).is_some();
        if has_class || !claim.is_object() {
            return Ok(());
        }
        let classes = context.resource("storage.k8s.io", "v1", "storageclasses")?;
        let all = context.list_cached(classes, None).await?;
        if let Some(name) = default_class(&all) {
            meta::set_at(claim, &["spec", "storageClassName"], json!(name));
        }
        Ok(())
    }
}

/// The default among `classes`: the newest marked default, the first name among equals.
fn default_class(classes: &[Value]) -> Option<String> {
    classes
        .iter()
        .filter(|c| {
            DEFAULT_CLASS_ANNOTATIONS.iter().any(|a| {
                meta::str_at(c, &["metadata", "annotations", a]).is_some_and(|v| v == "true")
            })
        })
        .max_by(|a, b| {
            let created = |c: &Value| {
                meta::str_at(c, &["metadata", "creationTimestamp"])
                    .unwrap_or("")
                    .to_string()
            };
            created(a)
                .cmp(&created(b))
                .then_with(|| meta::name(b).cmp(meta::name(a)))
        })
        .map(|c| meta::name(c).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(name: &str, created: &str, default: bool) -> Value {
        json!({"metadata": {"name": name, "creationTimestamp": created,
            "annotations": {"storageclass.kubernetes.io/is-default-class": default.to_string()}}})
    }

    #[test]
    fn the_newest_default_class_wins_and_ties_go_by_name() {
        assert_eq!(
            default_class(&[class("a", "2026-01-01T00:00:00Z", false)]),
            None
        );
        let classes = [
            class("old", "2026-01-01T00:00:00Z", true),
            class("new-b", "2026-02-01T00:00:00Z", true),
            class("new-a", "2026-02-01T00:00:00Z", true),
            class("newest-plain", "2026-03-01T00:00:00Z", false),
        ];
        assert_eq!(default_class(&classes).as_deref(), Some("new-a"));
    }
}
