//! Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`: the `k8s\0`
//! magic, `runtime.Unknown`, then the kind's message): no panic, and what decodes encodes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(value) = flotilla_protobuf::decode(data) {
        let _ = flotilla_protobuf::encode(&value);
    }
});
