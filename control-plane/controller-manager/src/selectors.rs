//! Label selectors over typed k8s-openapi objects (upstream `metav1.LabelSelectorAsSelector`
//! then `Matches`), on top of kube's `Selector`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::SelectorExt;

/// Whether `labels` satisfy `selector` (kube's selector, as the Deployment controller uses it
/// too). An empty selector matches everything, as upstream's `LabelSelectorAsSelector`; an
/// invalid one (an unknown operator) matches nothing.
pub fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    compile(selector).is_some_and(|s| s.matches(labels))
}

/// `selector` parsed once, to match many label sets; `None` for an invalid one (which matches
/// nothing).
pub fn compile(selector: &LabelSelector) -> Option<kube::core::Selector> {
    kube::core::Selector::try_from(selector.clone()).ok()
}

/// Whether `selector` has no requirements at all (`selector.Empty()` upstream).
pub fn is_empty(selector: &LabelSelector) -> bool {
    selector
        .match_labels
        .as_ref()
        .is_none_or(BTreeMap::is_empty)
        && selector
            .match_expressions
            .as_ref()
            .is_none_or(Vec::is_empty)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selector(value: serde_json::Value) -> LabelSelector {
        serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn match_labels_and_expressions() {
        let labels: BTreeMap<String, String> = [("app", "web"), ("tier", "front")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        for (sel, want) in [
            (serde_json::json!({}), true),
            (serde_json::json!({"matchLabels": {"app": "web"}}), true),
            (serde_json::json!({"matchLabels": {"app": "db"}}), false),
            (
                serde_json::json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["front", "back"]}]}),
                true,
            ),
            (
                serde_json::json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["front"]}]}),
                false,
            ),
            (
                serde_json::json!({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}),
                true,
            ),
            (
                serde_json::json!({"matchExpressions": [{"key": "app", "operator": "Exists"}]}),
                true,
            ),
            (
                serde_json::json!({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}),
                false,
            ),
            (
                serde_json::json!({"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]}),
                false,
            ),
        ] {
            assert_eq!(matches(&selector(sel.clone()), &labels), want, "{sel}");
        }
        assert!(is_empty(&selector(serde_json::json!({}))));
        assert!(!is_empty(&selector(
            serde_json::json!({"matchLabels": {"a": "b"}})
        )));
    }
}
