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

    /// What an object's stored bytes must contain for it to match, worked out once per list:
    /// every `=`, `==` and `in` requirement needs its key and one of its values, and every
    /// `exists` its key, to appear as JSON strings (label keys and values are restricted to
    /// characters JSON never escapes; other text is not judged), and so does a `=` on a name
    /// field. Lists with a selector then decode only the objects that may match (a 1000-pod
    /// namespace listed for one app's pods decoded every pod: 17 ms of the server's CPU).
    pub fn raw_filter(&self) -> RawFilter {
        let mut needed: Vec<Vec<Vec<u8>>> = Vec::new();
        let mut require = |alternatives: Vec<&str>| {
            // Text with a character some JSON encoder escapes (Go's escapes `<`, `>` and
            // `&`) might be stored otherwise: not judged.
            let judged = alternatives.iter().all(|text| {
                text.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._:/@".contains(&b))
            });
            if judged && !alternatives.is_empty() {
                needed.push(
                    alternatives
                        .iter()
                        .map(|text| format!("\"{text}\"").into_bytes())
                        .collect(),
                );
            }
        };
        if let Some(labels) = &self.labels {
            use flotilla_api_machinery::selector::Operator;
            for requirement in labels.requirements() {
                match requirement.operator() {
                    Operator::Equals | Operator::DoubleEquals | Operator::In => {
                        require(vec![requirement.key()]);
                        require(requirement.values().iter().map(String::as_str).collect());
                    }
                    Operator::Exists => require(vec![requirement.key()]),
                    _ => {}
                }
            }
        }
        // The fields whose label value is the stored string itself (a name), as a kubelet's
        // `spec.nodeName=<node>` list asks; an empty value is an absent field, which the
        // bytes cannot show.
        if let Some(fields) = &self.fields {
            for requirement in fields.requirements() {
                if requirement.operator == flotilla_api_machinery::selector::FieldOperator::Equals
                    && !requirement.value.is_empty()
                    && matches!(
                        requirement.field.as_str(),
                        "metadata.name" | "spec.nodeName"
                    )
                {
                    require(vec![&requirement.value]);
                }
            }
        }
        RawFilter { needed }
    }

    /// Whether `obj` matches both selectors.
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

/// See [`Selection::raw_filter`]: for each requirement judged, the quoted strings one of
/// which the bytes must contain.
pub struct RawFilter {
    needed: Vec<Vec<Vec<u8>>>,
}

impl RawFilter {
    /// Whether an object stored as `raw` may match; `false` only when it cannot.
    pub fn may_match(&self, raw: &[u8]) -> bool {
        self.needed.iter().all(|alternatives| {
            alternatives
                .iter()
                .any(|needle| memchr::memmem::find(raw, needle).is_some())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_objects_that_cannot_match_are_told_apart_without_decoding() {
        let pods = crate::resources::Resources::builtin();
        let pods = pods.find("", "v1", "pods").expect("pods");
        let raw = br#"{"metadata":{"name":"p-5","labels":{"app":"app-5","tier":"web"}}}"#;
        let may = |labels: &str| {
            Selection::parse(Some(labels), None, pods)
                .expect("selector")
                .raw_filter()
                .may_match(raw)
        };
        assert!(may("app=app-5"));
        assert!(may("app in (app-4,app-5),tier"));
        assert!(!may("app=app-6"));
        assert!(!may("app in (app-4,app-6)"));
        assert!(!may("zone"));
        // What the bytes cannot rule out is left to the decoded match.
        assert!(may("app!=app-5"));
        assert!(may("!zone"));
        assert!(Selection::everything().raw_filter().may_match(raw));
        let on_node = |fields: &str| {
            Selection::parse(None, Some(fields), pods)
                .expect("selector")
                .raw_filter()
                .may_match(br#"{"metadata":{"name":"p-5"},"spec":{"nodeName":"node-1"}}"#)
        };
        assert!(on_node("spec.nodeName=node-1"));
        assert!(!on_node("spec.nodeName=node-2"));
        assert!(!on_node("metadata.name=p-6,spec.nodeName=node-1"));
        // Unscheduled (an absent field) and inequalities are left to the decoded match.
        assert!(on_node("spec.nodeName="));
        assert!(on_node("spec.nodeName!=node-1"));
        assert!(on_node("status.phase=Running"));
        assert!(on_node("metadata.name=a&b"));
    }
}
