//! `metadata.managedFields` bookkeeping for non-apply writes.

use serde_json::{Value, json};

use crate::meta;

/// Records that `manager` wrote `new` with an `Update` (any write but an apply), moving
/// ownership of the fields it changed to it, as the structured-merge-diff field manager does.
pub fn record_update(new: &mut Value, old: Option<&Value>, manager: &str, api_version: &str) {
    if manager.is_empty() {
        return;
    }
    let entries = meta::at(new, &["metadata", "managedFields"])
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let updated = flotilla_api_machinery::managed_fields::update_ownership(
        &entries,
        old,
        new,
        manager,
        "Update",
        api_version,
        &meta::now_rfc3339(),
    );
    match updated {
        Ok(entries) if entries.is_empty() => {
            meta::remove_at(new, &["metadata", "managedFields"]);
        }
        Ok(entries) => meta::set_at(new, &["metadata", "managedFields"], json!(entries)),
        Err(err) => {
            tracing::warn!(%err, "could not update managedFields; leaving them as they were")
        }
    }
}
