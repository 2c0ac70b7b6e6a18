//! Upstream's DefaultTolerationSeconds admission plugin
//! (`plugin/pkg/admission/defaulttolerationseconds`): a pod that does not already tolerate
//! the `not-ready` / `unreachable` NoExecute taints tolerates each for 300 s, so the taint
//! eviction controller deletes it five minutes after its node fails.

use serde_json::{Value, json};

use super::{Attributes, Context, Operation, Plugin};
use crate::error::ApiError;
use crate::meta::{self, at, str_at};

/// Upstream's `--default-not-ready-toleration-seconds` and `--default-unreachable-…`.
pub const DEFAULT_TOLERATION_SECONDS: i64 = 300;

/// The DefaultTolerationSeconds plugin.
pub struct DefaultTolerationSeconds;

/// Adds to a pod's `spec` the tolerations it lacks (upstream handles creates and updates; the
/// Pod strategy applies this to an update's body, since this server runs the mutating half on
/// creates only).
pub fn add_default_tolerations(spec: &mut Value) {
    let mut tolerations = at(spec, &["tolerations"])
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        let tolerated = tolerations.iter().any(|t| {
            let key_matches = str_at(t, &["key"]).is_none_or(|k| k.is_empty() || k == key);
            let effect_matches =
                str_at(t, &["effect"]).is_none_or(|e| e.is_empty() || e == "NoExecute");
            key_matches && effect_matches
        });
        if !tolerated {
            tolerations.push(
                json!({"key": key, "operator": "Exists", "effect": "NoExecute",
                "tolerationSeconds": DEFAULT_TOLERATION_SECONDS}),
            );
        }
    }
    meta::set_at(spec, &["tolerations"], json!(tolerations));
}

#[async_trait::async_trait]
impl Plugin for DefaultTolerationSeconds {
    fn name(&self) -> &'static str {
        "DefaultTolerationSeconds"
    }

    fn handles(&self, attributes: &Attributes<'_>) -> bool {
        attributes.operation == Operation::Create && attributes.is_core("pods")
    }

    async fn admit(
        &self,
        _context: &Context<'_>,
        _attributes: &Attributes<'_>,
        pod: &mut Value,
        _warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        if let Some(spec) = pod.get_mut("spec") {
            add_default_tolerations(spec);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_only_what_is_not_tolerated() {
        let keys = |spec: &Value| -> Vec<(String, Option<i64>)> {
            spec["tolerations"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| {
                    (
                        t["key"].as_str().unwrap_or("").to_string(),
                        t["tolerationSeconds"].as_i64(),
                    )
                })
                .collect()
        };
        let mut none = json!({});
        add_default_tolerations(&mut none);
        assert_eq!(
            keys(&none),
            [
                ("node.kubernetes.io/not-ready".to_string(), Some(300)),
                ("node.kubernetes.io/unreachable".to_string(), Some(300))
            ]
        );
        // The pod's own unreachable toleration stays; not-ready is still added.
        let mut own = json!({"tolerations": [
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5},
        ]});
        add_default_tolerations(&mut own);
        assert_eq!(
            keys(&own),
            [
                ("node.kubernetes.io/unreachable".to_string(), Some(5)),
                ("node.kubernetes.io/not-ready".to_string(), Some(300))
            ]
        );
        // Tolerating everything needs nothing more.
        let mut all = json!({"tolerations": [{"operator": "Exists"}]});
        add_default_tolerations(&mut all);
        assert_eq!(keys(&all).len(), 1);
        // An unrelated toleration does not stop the defaults (the old behaviour did).
        let mut other = json!({"tolerations": [{"key": "gpu", "operator": "Exists"}]});
        add_default_tolerations(&mut other);
        assert_eq!(keys(&other).len(), 3);
    }

    #[test]
    fn only_pod_creates_are_its_business() {
        use super::super::testing::attributes;
        let plugin = DefaultTolerationSeconds;
        assert!(plugin.handles(&attributes(Operation::Create, "", "pods", "")));
        assert!(!plugin.handles(&attributes(Operation::Create, "", "pods", "binding")));
        assert!(!plugin.handles(&attributes(Operation::Update, "", "pods", "")));
        assert!(!plugin.handles(&attributes(Operation::Create, "", "configmaps", "")));
    }
}
