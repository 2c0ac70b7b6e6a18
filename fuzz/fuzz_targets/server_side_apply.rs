//! Server-side apply's merge of an applied configuration into a live Deployment (field sets,
//! associative lists by their keys, atomic and granular maps): the input is a JSON array
//! `[live, applied]`; no panic.
#![no_main]

use flotilla_api_machinery::managed_fields;
use flotilla_api_machinery::schema::Schema;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(Value::Array(parts)) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    if let [live, applied] = parts.as_slice() {
        for kind in ["Deployment", "Pod", "ConfigMap"] {
            if let Some(schema) = Schema::for_kind(kind) {
                let _ = managed_fields::merge(live, applied, schema);
                let _ = managed_fields::compare(live, applied, schema);
                let _ = managed_fields::to_field_set(applied, schema);
            }
        }
    }
});
