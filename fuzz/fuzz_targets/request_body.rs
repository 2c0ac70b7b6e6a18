//! Request bodies as the API server reads them (`application/json`, and `application/yaml`
//! with its depth and alias checks): no panic, no hang (libFuzzer's `-timeout`), and what a
//! body parses to, written as JSON, reads back as JSON to the same value.
#![no_main]

use std::sync::atomic::AtomicBool;

use flotilla_api_machinery::request_body::{parse_json, parse_yaml};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let never_abandoned = AtomicBool::new(false);
    for parsed in [parse_json(data), parse_yaml(data, &never_abandoned)] {
        if let Ok(value) = parsed {
            let written = serde_json::to_vec(&value).unwrap_or_default();
            assert_eq!(
                parse_json(&written).ok(),
                Some(value),
                "{:?}",
                String::from_utf8_lossy(data)
            );
        }
    }
});
