//! RFC 6902 JSON patches (`application/json-patch+json`): the input is a JSON array
//! `[document, patch]`; no panic, whatever either holds.
#![no_main]

use flotilla_api_machinery::patch::apply_json_patch;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(Value::Array(parts)) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    if let [document, patch] = parts.as_slice() {
        let _ = apply_json_patch(document, patch);
    }
});
