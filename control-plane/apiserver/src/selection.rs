//! Label and field selection of objects for list, watch and deletecollection.

use flotilla_api_machinery::selector::{FieldSelector, LabelSelector};
use serde_json::Value;

use crate::error::ApiError;
use crate::meta;
use crate::resources::ResourceInfo;

/// The `labelSelector` and `fieldSelector` of one request.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    labels: Option<LabelSelector>,
    fields: Option<FieldSelector>,
}

impl Selection {
    /// Parses both selectors, rejecting field labels the kind does not support (upstream's
    /// `field label not supported` 400).
    pub fn parse(
        labels: Option<&str>,
        fields: Option<&str>,
        resource: &ResourceInfo,
    ) -> Result<Self, ApiError> {
        let labels = match labels.filter(|s| !s.trim().is_empty()) {
            Some(s) => {
                Some(LabelSelector::parse(s).map_err(|e| ApiError::bad_request(e.to_string()))?)
            }
            None => None,
        };
        let fields = match fields.filter(|s| !s.trim().is_empty()) {
            Some(s) => {
                let selector =
                    FieldSelector::parse(s).map_err(|e| ApiError::bad_request(e.to_string()))?;
                for field in selector.fields() {
                    let generic = field == "metadata.name"
                        || (resource.namespaced && field == "metadata.namespace");
                    if !generic && !resource.strategy.supports_field_label(&field) {
                        return Err(ApiError::bad_request(format!(
                            "field label not supported: {field}"
                        )));
                    }
                }
                Some(selector)
            }
            None => None,
        };
        Ok(Selection { labels, fields })
    }

    /// A selection that matches everything.
    pub fn everything() -> Self {
        Selection::default()
    }

    /// True when no selector narrows the result.
    pub fn is_everything(&self) -> bool {
        self.labels.as_ref().is_none_or(LabelSelector::is_empty)
            && self.fields.as_ref().is_none_or(FieldSelector::is_empty)
    }

    /// The single name a `metadata.name=x` field selector pins, if it does.
    pub fn matches(&self, obj: &Value, resource: &ResourceInfo) -> bool {
        if let Some(labels) = &self.labels
            && !labels.matches(&meta::labels(obj))
        {
            return false;
        }
        if let Some(fields) = &self.fields {
            let mut values = std::collections::BTreeMap::new();
            values.insert("metadata.name".to_string(), meta::name(obj).to_string());
            if resource.namespaced {
                values.insert(
                    "metadata.namespace".to_string(),
                    meta::namespace(obj).to_string(),
                );
            }
            values.extend(resource.strategy.field_label_values(obj));
            if !fields.matches(&values) {
                return false;
            }
        }
        true
    }
}
