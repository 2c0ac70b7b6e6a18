//! Bodies kubectl 1.32 really sent, captured from the wire, against the JSON kubectl prints
//! for the same command with `--dry-run=client -o json`.
//!
//! Each `tests/fixtures/NAME.pb` is the request body of a `kubectl create ...` pointed at a
//! listener that recorded it; `NAME.json` is the same command's dry-run output (Go's
//! `json.Marshal` of the same object), except `tokenrequest.json`, written by hand because
//! `kubectl create token` has no dry run. The commands are listed in `tests/fixtures/README.md`.

use std::path::Path;

use serde_json::Value;

const FIXTURES: &[&str] = &[
    "clusterrolebinding",
    "configmap-binary",
    "configmap-simple",
    "cronjob",
    "deployment",
    "ingress",
    "job",
    "namespace",
    "pdb-max-unavailable",
    "pdb-min-available",
    "priorityclass",
    "resourcequota",
    "secret-docker-registry",
    "secret-generic",
    "service",
    "serviceaccount",
    "tokenrequest",
];

fn fixture(name: &str) -> (Vec<u8>, Value) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let body = std::fs::read(dir.join(format!("{name}.pb")))
        .unwrap_or_else(|err| panic!("{name}.pb: {err}"));
    let json = std::fs::read(dir.join(format!("{name}.json")))
        .unwrap_or_else(|err| panic!("{name}.json: {err}"));
    let json = serde_json::from_slice(&json).unwrap_or_else(|err| panic!("{name}.json: {err}"));
    (body, json)
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

/// Zero values Go's JSON writes because their struct fields lack `omitempty`, and the decoder
/// leaves out because protobuf cannot tell them from unset (which decodes to the same Go
/// struct): (fixture, JSON pointer).
const GO_ZERO_FIELDS: &[(&str, &str)] = &[
    ("pdb-max-unavailable", "/status/disruptionsAllowed"),
    ("pdb-max-unavailable", "/status/currentHealthy"),
    ("pdb-max-unavailable", "/status/desiredHealthy"),
    ("pdb-max-unavailable", "/status/expectedPods"),
    ("pdb-min-available", "/status/disruptionsAllowed"),
    ("pdb-min-available", "/status/currentHealthy"),
    ("pdb-min-available", "/status/desiredHealthy"),
    ("pdb-min-available", "/status/expectedPods"),
];

/// Removes the [`GO_ZERO_FIELDS`] of one fixture from kubectl's JSON, checking they are zero.
fn without_go_zero_fields(name: &str, mut json: Value) -> Value {
    for (_, pointer) in GO_ZERO_FIELDS.iter().filter(|(n, _)| *n == name) {
        let (parent, key) = pointer.rsplit_once('/').unwrap_or_default();
        let removed = json
            .pointer_mut(parent)
            .and_then(Value::as_object_mut)
            .and_then(|object| object.remove(key));
        assert_eq!(removed, Some(Value::from(0)), "{name}{pointer}");
    }
    json
}

/// Decoding kubectl's protobuf gives the JSON kubectl would have sent instead.
#[test]
fn decode_matches_kubectl_json() {
    for name in FIXTURES {
        let (body, want) = fixture(name);
        let want = without_go_zero_fields(name, want);
        match flotilla_protobuf::decode(&body) {
            Ok(got) => assert_eq!(got, want, "{name}: got {}", pretty(&got)),
            Err(err) => panic!("{name}: {err}"),
        }
    }
}

/// Encoding the decoded JSON, or kubectl's own JSON, gives back kubectl's bytes exactly.
#[test]
fn encode_reproduces_kubectl_bytes() {
    for name in FIXTURES {
        let (body, json) = fixture(name);
        let decoded =
            flotilla_protobuf::decode(&body).unwrap_or_else(|err| panic!("{name}: {err}"));
        for (what, value) in [("decoded", &decoded), ("kubectl json", &json)] {
            match flotilla_protobuf::encode(value) {
                Ok(got) => assert!(
                    got == body,
                    "{name} from {what}: bytes differ\n got {got:?}\nwant {body:?}"
                ),
                Err(err) => panic!("{name} from {what}: {err}"),
            }
        }
    }
}
