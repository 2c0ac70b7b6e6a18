//! Upstream's DefaultStorageClass and DefaultIngressClass admission plugins: a new
//! PersistentVolumeClaim (Ingress) that names no class — neither in its spec field, not even
//! `""`, nor in the legacy annotation — gets the cluster's default StorageClass
//! (IngressClass): the newest of those annotated as the default, ties by name, as upstream
//! picks. The two are one plugin over a table of where each kind keeps its class.

use serde_json::{Value, json};

use super::{Attributes, Context, Operation, Plugin};
use crate::error::ApiError;
use crate::meta;

/// Where one kind names its class, and where its classes are.
pub struct DefaultClass {
    name: &'static str,
    /// The kind given a class: (group, plural).
    kind: (&'static str, &'static str),
    /// Its class field.
    field: &'static [&'static str],
    /// The annotation that named the class before the field existed.
    legacy_annotation: &'static str,
    /// The classes: (group, version, plural).
    classes: (&'static str, &'static str, &'static str),
    /// The annotations that mark a class the default.
    default_annotations: &'static [&'static str],
}

/// Upstream's DefaultStorageClass.
pub const DEFAULT_STORAGE_CLASS: DefaultClass = DefaultClass {
    name: "DefaultStorageClass",
    kind: ("", "persistentvolumeclaims"),
    field: &["spec", "storageClassName"],
    legacy_annotation: "volume.beta.kubernetes.io/storage-class",
    classes: ("storage.k8s.io", "v1", "storageclasses"),
    default_annotations: &[
        "storageclass.kubernetes.io/is-default-class",
        "storageclass.beta.kubernetes.io/is-default-class",
    ],
};

/// Upstream's DefaultIngressClass.
pub const DEFAULT_INGRESS_CLASS: DefaultClass = DefaultClass {
    name: "DefaultIngressClass",
    kind: ("networking.k8s.io", "ingresses"),
    field: &["spec", "ingressClassName"],
    legacy_annotation: "kubernetes.io/ingress.class",
    classes: ("networking.k8s.io", "v1", "ingressclasses"),
    default_annotations: &["ingressclass.kubernetes.io/is-default-class"],
};

#[async_trait::async_trait]
impl Plugin for DefaultClass {
    fn name(&self) -> &'static str {
        self.name
    }

    fn handles(&self, attributes: &Attributes<'_>) -> bool {
        attributes.operation == Operation::Create
            && attributes.subresource.is_empty()
            && (&*attributes.resource.group, &*attributes.resource.plural) == self.kind
    }

    async fn admit(
        &self,
        context: &Context<'_>,
        _attributes: &Attributes<'_>,
        object: &mut Value,
        _warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        let has_class = meta::at(object, self.field).is_some_and(|c| !c.is_null())
            || meta::at(object, &["metadata", "annotations", self.legacy_annotation]).is_some();
        if has_class || !object.is_object() {
            return Ok(());
        }
        let (group, version, plural) = self.classes;
        let classes = context.resource(group, version, plural)?;
        let all = context.list_cached(classes, None).await?;
        if let Some(name) = default_class(&all, self.default_annotations) {
            meta::set_at(object, self.field, json!(name));
        }
        Ok(())
    }
}

/// The default among `classes`: the newest marked default, the first name among equals.
fn default_class(classes: &[Value], annotations: &[&str]) -> Option<String> {
    classes
        .iter()
        .filter(|c| {
            annotations.iter().any(|a| {
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
            default_class(
                &[class("a", "2026-01-01T00:00:00Z", false)],
                DEFAULT_STORAGE_CLASS.default_annotations
            ),
            None
        );
        let classes = [
            class("old", "2026-01-01T00:00:00Z", true),
            class("new-b", "2026-02-01T00:00:00Z", true),
            class("new-a", "2026-02-01T00:00:00Z", true),
            class("newest-plain", "2026-03-01T00:00:00Z", false),
        ];
        assert_eq!(
            default_class(&classes, DEFAULT_STORAGE_CLASS.default_annotations).as_deref(),
            Some("new-a")
        );
    }
}
