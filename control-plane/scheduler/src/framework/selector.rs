//! Label selectors (`metav1.LabelSelector` and plain label sets) and node selector terms, parsed
//! once and matched many times.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Labels as the API carries them.
pub type Labels = BTreeMap<String, String>;

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `key In (values)` (matchLabels are `In` with one value).
    In(String, Vec<String>),
    /// `key NotIn (values)`: also true when the key is absent.
    NotIn(String, Vec<String>),
    /// `key` exists.
    Exists(String),
    /// `key` does not exist.
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: Option<&Labels>) -> bool {
        let get = |key: &str| labels.and_then(|l| l.get(key));
        match self {
            Requirement::In(key, values) => get(key).is_some_and(|v| values.contains(v)),
            Requirement::NotIn(key, values) => get(key).is_none_or(|v| !values.contains(v)),
            Requirement::Exists(key) => get(key).is_some(),
            Requirement::DoesNotExist(key) => get(key).is_none(),
        }
    }
}

/// A parsed label selector. A null `LabelSelector` selects nothing (upstream's
/// `LabelSelectorAsSelector(nil)`); an empty one selects everything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    nothing: bool,
    requirements: Vec<Requirement>,
}

impl Selector {
    /// Selects every object.
    pub fn everything() -> Self {
        Selector {
            nothing: false,
            requirements: Vec::new(),
        }
    }

    /// Selects no object.
    pub fn nothing() -> Self {
        Selector {
            nothing: true,
            requirements: Vec::new(),
        }
    }

    /// Parses a `LabelSelector`; an unknown operator selects nothing (upstream rejects it).
    pub fn from_label_selector(selector: Option<&LabelSelector>) -> Self {
        let Some(selector) = selector else {
            return Self::nothing();
        };
        let mut requirements: Vec<Requirement> = selector
            .match_labels
            .iter()
            .flatten()
            .map(|(k, v)| Requirement::In(k.clone(), vec![v.clone()]))
            .collect();
        for expression in selector.match_expressions.iter().flatten() {
            let values = expression.values.clone().unwrap_or_default();
            let key = expression.key.clone();
            requirements.push(match expression.operator.as_str() {
                "In" => Requirement::In(key, values),
                "NotIn" => Requirement::NotIn(key, values),
                "Exists" => Requirement::Exists(key),
                "DoesNotExist" => Requirement::DoesNotExist(key),
                _ => return Self::nothing(),
            });
        }
        Selector {
            nothing: false,
            requirements,
        }
    }

    /// A selector from a plain label set (Service and ReplicationController selectors): every
    /// pair must match; an empty set selects everything.
    pub fn from_set(set: &Labels) -> Self {
        Selector {
            nothing: false,
            requirements: set
                .iter()
                .map(|(k, v)| Requirement::In(k.clone(), vec![v.clone()]))
                .collect(),
        }
    }

    /// Adds requirements (ANDed).
    pub fn add(&mut self, other: &Selector) {
        self.nothing |= other.nothing;
        self.requirements.extend(other.requirements.iter().cloned());
    }

    /// Adds `key In (value)`.
    pub fn add_requirement(&mut self, requirement: Requirement) {
        self.requirements.push(requirement);
    }

    /// Whether this selects everything (no requirement).
    pub fn is_empty(&self) -> bool {
        !self.nothing && self.requirements.is_empty()
    }

    /// Whether `labels` are selected.
    pub fn matches(&self, labels: Option<&Labels>) -> bool {
        !self.nothing && self.requirements.iter().all(|r| r.matches(labels))
    }
}

/// `NodeSelectorRequirement` against one value (a label's or a field's).
pub fn node_requirement_matches(
    requirement: &NodeSelectorRequirement,
    value: Option<&str>,
) -> bool {
    let values = requirement.values.as_deref().unwrap_or(&[]);
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|w| w == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|w| w == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(actual), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|v| v.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if requirement.operator == "Gt" {
                actual > bound
            } else {
                actual < bound
            }
        }
        _ => false,
    }
}

/// One `NodeSelectorTerm`: its requirements are ANDed; an empty term matches nothing.
pub fn node_selector_term_matches(
    term: &NodeSelectorTerm,
    node_name: &str,
    labels: Option<&Labels>,
) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or(&[]);
    let fields = term.match_fields.as_deref().unwrap_or(&[]);
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    expressions.iter().all(|r| {
        node_requirement_matches(r, labels.and_then(|l| l.get(&r.key)).map(String::as_str))
    }) && fields.iter().all(|r| {
        let value = (r.key == "metadata.name").then_some(node_name);
        node_requirement_matches(r, value)
    })
}

/// A `NodeSelector`: its terms are ORed.
pub fn node_selector_matches(
    selector: &NodeSelector,
    node_name: &str,
    labels: Option<&Labels>,
) -> bool {
    selector
        .node_selector_terms
        .iter()
        .any(|term| node_selector_term_matches(term, node_name, labels))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn labels(value: serde_json::Value) -> Labels {
        serde_json::from_value(value).expect("labels")
    }

    #[test]
    fn label_selectors_follow_upstream() {
        let parse = |value: serde_json::Value| {
            let selector: LabelSelector = serde_json::from_value(value).expect("selector");
            Selector::from_label_selector(Some(&selector))
        };
        let web = labels(json!({"app": "web", "tier": "front"}));
        // (selector, labels, selected)
        let cases = [
            (parse(json!({})), &web, true),
            (parse(json!({"matchLabels": {"app": "web"}})), &web, true),
            (parse(json!({"matchLabels": {"app": "db"}})), &web, false),
            (
                parse(
                    json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["back"]}]}),
                ),
                &web,
                true,
            ),
            (
                parse(json!({"matchExpressions": [{"key": "zone", "operator": "Exists"}]})),
                &web,
                false,
            ),
            (
                parse(json!({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]})),
                &web,
                true,
            ),
            (
                parse(json!({"matchExpressions": [{"key": "x", "operator": "Bogus"}]})),
                &web,
                false,
            ),
        ];
        for (i, (selector, labels, want)) in cases.iter().enumerate() {
            assert_eq!(selector.matches(Some(labels)), *want, "case {i}");
        }
        assert!(!Selector::from_label_selector(None).matches(Some(&web)));
    }
}
