//! The kinds a tenant's CustomResourceDefinitions add: one resource-table entry per served
//! version, built from the definition, and the strategy its objects go through (upstream
//! `apiextensions-apiserver/pkg/registry/customresource`): the schema's defaults, pruning and
//! validation, `x-kubernetes-validations`, printer columns and selectable fields.

use std::borrow::Cow;
use std::sync::Arc;

use flotilla_api_machinery::field::FieldError;
use serde_json::{Value, json};

use super::columns;
use super::definition::simple_json_path;
use super::schemas::VersionSchema;
use crate::resources::{Name, ResourceInfo, ScaleSubresource, Shape, Strategy, version_priority};
use crate::store::UpdateTarget;
use crate::table::Column;

/// The strategy of one custom resource version.
pub struct CustomResourceStrategy {
    schema: Arc<VersionSchema>,
    columns: Vec<Column>,
    /// `selectableFields`: (field name as selectors write it, path in the object).
    selectable: Vec<(String, Vec<String>)>,
}

impl Strategy for CustomResourceStrategy {
    fn default(&self, obj: &mut Value) {
        self.schema.apply_defaults(obj);
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        self.schema.validate(obj, None)
    }

    fn validate_update_to(
        &self,
        _target: UpdateTarget,
        new: &Value,
        old: &Value,
    ) -> Vec<FieldError> {
        self.schema.validate(new, Some(old))
    }

    fn columns(&self) -> Vec<Column> {
        let mut columns = vec![crate::table::name_column()];
        columns.extend(self.columns.iter().cloned());
        columns
    }

    fn supports_field_label(&self, field: &str) -> bool {
        self.selectable.iter().any(|(name, _)| name == field)
    }

    fn field_label_values(&self, obj: &Value) -> Vec<(String, String)> {
        self.selectable
            .iter()
            .map(|(name, path)| {
                let value = match crate::meta::at(obj, path) {
                    Some(Value::String(s)) => s.clone(),
                    None | Some(Value::Null) => String::new(),
                    Some(other) => other.to_string(),
                };
                (name.clone(), value)
            })
            .collect()
    }
}

/// The schema side of a custom resource version, for the store and the OpenAPI documents.
impl crate::resources::ObjectSchema for VersionSchema {
    fn canonicalize(&self, obj: &Value) -> Result<Value, serde_json::Error> {
        let mut obj = obj.clone();
        self.prune(&mut obj);
        Ok(obj)
    }

    fn openapi_schema(&self) -> &Value {
        self.openapi()
    }
}

/// Upstream's `defaultDeprecationWarning`: the version is deprecated, and the newest served
/// version that is not (and is newer) is the one to use.
fn default_deprecation_warning(spec: &Value, deprecated: &str, kind: &str) -> String {
    let group = spec["group"].as_str().unwrap_or("");
    let message = format!("{group}/{deprecated} {kind} is deprecated");
    let newest = spec["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["served"] == json!(true) && v["deprecated"] != json!(true))
        .filter_map(|v| v["name"].as_str())
        .filter(|name| version_priority(name) > version_priority(deprecated))
        .max_by_key(|name| version_priority(name));
    match newest {
        Some(newest) => format!("{message}; use {group}/{newest} {kind}"),
        None => message,
    }
}

/// The resource-table entries of one definition: one per served version. A definition that
/// is not established yet, or is being deleted, serves nothing.
pub fn kinds_of(
    definition: &Value,
    schemas: &super::schemas::Interner,
    conversion: &crate::conversion::Conversion,
) -> Vec<Arc<ResourceInfo>> {
    let spec = &definition["spec"];
    let text = |v: &Value| -> Name { Cow::Owned(v.as_str().unwrap_or("").to_string()) };
    let names = &definition["status"]["acceptedNames"];
    let storage = spec["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["storage"] == json!(true))
        .and_then(|v| v["name"].as_str())
        .unwrap_or("")
        .to_string();
    let list = |field: &str| -> Vec<Name> {
        names[field]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|s| Cow::Owned(s.to_string()))
            .collect()
    };
    let mut kinds = Vec::new();
    for version in spec["versions"].as_array().into_iter().flatten() {
        if version["served"] != json!(true) {
            continue;
        }
        let version_name = version["name"].as_str().unwrap_or("").to_string();
        let schema = schemas.intern(&version["schema"]["openAPIV3Schema"]);
        let subresources = &version["subresources"];
        let scale = subresources["scale"].as_object().map(|scale| {
            let path = |field: &str| -> Vec<Name> {
                scale
                    .get(field)
                    .and_then(Value::as_str)
                    .and_then(simple_json_path)
                    .unwrap_or_default()
                    .into_iter()
                    .map(Cow::Owned)
                    .collect()
            };
            ScaleSubresource {
                spec_replicas: path("specReplicasPath"),
                status_replicas: path("statusReplicasPath"),
                label_selector: scale
                    .get("labelSelectorPath")
                    .and_then(Value::as_str)
                    .and_then(simple_json_path)
                    .map(|p| p.into_iter().map(Cow::Owned).collect()),
            }
        });
        let columns: Vec<Column> = match version["additionalPrinterColumns"].as_array() {
            Some(entries) => entries.iter().filter_map(columns::printer_column).collect(),
            // A version without columns prints its age (upstream's v1 defaulting adds it).
            None => vec![crate::table::age_column()],
        };
        let selectable = version["selectableFields"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| {
                let path = f["jsonPath"].as_str()?;
                Some((
                    path.trim_start_matches('.').to_string(),
                    simple_json_path(path)?,
                ))
            })
            .collect();
        let kind = text(&names["kind"]);
        kinds.push(Arc::new(ResourceInfo {
            group: text(&spec["group"]),
            version: Cow::Owned(version_name.clone()),
            singular: text(&names["singular"]),
            list_kind: text(&names["listKind"]),
            plural: text(&names["plural"]),
            namespaced: spec["scope"] == json!("Namespaced"),
            short_names: list("shortNames"),
            categories: list("categories"),
            status_subresource: subresources["status"].is_object(),
            scale,
            tracks_generation: true,
            create_only: false,
            computed: false,
            strategy: Box::new(CustomResourceStrategy {
                schema: schema.clone(),
                columns,
                selectable,
            }),
            shape: Shape::Custom(schema),
            storage_version: (version_name != storage).then(|| Cow::Owned(storage.clone())),
            deprecation_warning: (version["deprecated"] == json!(true)).then(|| {
                version["deprecationWarning"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| default_deprecation_warning(spec, &version_name, &kind))
            }),
            terminating: crate::meta::is_terminating(definition),
            conversion: conversion.clone(),
            kind,
        }));
    }
    kinds
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiextensions::schemas::Interner;

    #[test]
    fn a_custom_kind_named_like_a_built_in_has_none_of_its_merge_metadata() {
        let definition = json!({
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "deployments", "kind": "Deployment"},
                "versions": [
                    {"name": "v1beta1", "served": true, "storage": false,
                     "schema": {"openAPIV3Schema": {"type": "object"}}},
                    {"name": "v1", "served": true, "storage": true,
                     "schema": {"openAPIV3Schema": {"type": "object"}}},
                ]},
            "status": {"acceptedNames": {"plural": "deployments", "singular": "deployment",
                "kind": "Deployment", "listKind": "DeploymentList"}},
        });
        let interner = Interner::default();
        let kinds = kinds_of(&definition, &interner, &Default::default());
        assert_eq!(kinds.len(), 2);
        assert!(kinds.iter().all(|k| k.patch_meta().is_none()));
        // Both versions share one compiled schema; only the non-storage one converts.
        assert_eq!(interner.live(), 1);
        assert_eq!(kinds[0].storage_version.as_deref(), Some("v1"));
        assert_eq!(kinds[1].storage_version, None);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let served = runtime
            .block_on(kinds[0].served(json!({"apiVersion": "example.com/v1"})))
            .expect("converted");
        assert_eq!(served["apiVersion"], "example.com/v1beta1");
        let stored = runtime
            .block_on(kinds[0].to_stored(&served))
            .expect("converted")
            .into_owned();
        assert_eq!(stored["apiVersion"], "example.com/v1");
    }
}
