//! Upstream's TaintNodesByCondition admission plugin (`plugin/pkg/admission/nodetaint`): a new
//! Node carries the `node.kubernetes.io/not-ready:NoSchedule` taint, so nothing is scheduled
//! to it before the node lifecycle controller has seen it Ready and taken the taint off.

use serde_json::{Value, json};

use super::{Attributes, Context, Operation, Plugin};
use crate::error::ApiError;
use crate::meta;

/// The taint a new node is created with.
pub const NOT_READY: &str = "node.kubernetes.io/not-ready";

/// The TaintNodesByCondition plugin.
pub struct TaintNodesByCondition;

/// Adds the not-ready NoSchedule taint to `node` unless one of that key and effect is there
/// (upstream's `addNotReadyTaint`).
pub fn add_not_ready_taint(node: &mut Value) {
    let Some(object) = node.as_object_mut() else {
        return;
    };
    let spec = object.entry("spec").or_insert_with(|| json!({}));
    let Some(spec) = spec.as_object_mut() else {
        return;
    };
    let taints = spec.entry("taints").or_insert_with(|| json!([]));
    if taints.is_null() {
        *taints = json!([]);
    }
    let Some(taints) = taints.as_array_mut() else {
        return;
    };
    let tainted = taints.iter().any(|taint| {
        meta::str_at(taint, &["key"]) == Some(NOT_READY)
            && meta::str_at(taint, &["effect"]) == Some("NoSchedule")
    });
    if !tainted {
        taints.push(json!({"key": NOT_READY, "effect": "NoSchedule"}));
    }
}

#[async_trait::async_trait]
impl Plugin for TaintNodesByCondition {
    fn name(&self) -> &'static str {
        "TaintNodesByCondition"
    }

    fn handles(&self, attributes: &Attributes<'_>) -> bool {
        attributes.operation == Operation::Create && attributes.is_core("nodes")
    }

    async fn admit(
        &self,
        _context: &Context<'_>,
        _attributes: &Attributes<'_>,
        node: &mut Value,
        _warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        add_not_ready_taint(node);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_nodes_are_tainted_not_ready_once() {
        let mut bare = json!({"metadata": {"name": "n1"}});
        add_not_ready_taint(&mut bare);
        assert_eq!(
            bare["spec"]["taints"],
            json!([{"key": NOT_READY, "effect": "NoSchedule"}])
        );
        let mut own = json!({"metadata": {"name": "n1"}, "spec": {"taints": [
            {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
            {"key": NOT_READY, "effect": "NoExecute"},
        ]}});
        add_not_ready_taint(&mut own);
        assert_eq!(own["spec"]["taints"].as_array().map(Vec::len), Some(3));
        let before = own.clone();
        add_not_ready_taint(&mut own);
        assert_eq!(own, before);
    }

    #[test]
    fn only_node_creates_are_its_business() {
        use super::super::testing::attributes;
        let plugin = TaintNodesByCondition;
        assert!(plugin.handles(&attributes(Operation::Create, "", "nodes", "")));
        assert!(!plugin.handles(&attributes(Operation::Update, "", "nodes", "")));
        assert!(!plugin.handles(&attributes(Operation::Update, "", "nodes", "status")));
        assert!(!plugin.handles(&attributes(Operation::Create, "", "pods", "")));
    }
}
