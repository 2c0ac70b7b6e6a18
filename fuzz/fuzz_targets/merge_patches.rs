//! JSON merge patches (RFC 7386) and strategic merge patches of a Pod (its list merge keys,
//! `$patch` directives, `$setElementOrder`, `$retainKeys`): the input is a JSON array
//! `[document, patch]`; no panic.
#![no_main]

use flotilla_api_machinery::patch::{PatchMeta, apply_merge_patch, apply_strategic_merge_patch};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(Value::Array(parts)) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    if let [document, patch] = parts.as_slice() {
        let _ = apply_merge_patch(document, patch);
        for kind in ["Pod", "Deployment"] {
            if let Some(meta) = PatchMeta::for_kind(kind) {
                let _ = apply_strategic_merge_patch(document, patch, &meta);
            }
        }
    }
});
