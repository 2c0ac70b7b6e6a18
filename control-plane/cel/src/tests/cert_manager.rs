//! The cert-manager CRDs from `/work/shared/fixtures`: every rule compiles, and an Issuer
//! breaking its rule is refused with upstream's message.

use serde_json::{Value, json};

use super::{messages, props};
use crate::*;

/// The CRD schemas of one fixture file, with their paths.
fn fixture_schemas(file: &str) -> Vec<(Path, JSONSchemaProps)> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file}: {e}"));
    let crd: Value = serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
    let versions = crd["spec"]["versions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    versions
        .iter()
        .enumerate()
        .map(|(i, version)| {
            let path = Path::new("spec")
                .child("versions")
                .index(i)
                .child("schema")
                .child("openAPIV3Schema");
            (path, props(version["schema"]["openAPIV3Schema"].clone()))
        })
        .collect()
}

const CERT_MANAGER: &str = "/work/shared/fixtures/crds/cert-manager";

#[test]
fn cert_manager_rules_compile() {
    let mut files: Vec<_> = std::fs::read_dir(CERT_MANAGER)
        .unwrap_or_else(|e| panic!("{e}"))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .collect();
    files.sort();
    assert_eq!(files.len(), 6);
    let mut with_rules = 0;
    for file in files {
        for (path, schema) in fixture_schemas(&file.to_string_lossy()) {
            let v = Validator::compile_at(&schema, &path).unwrap_or_else(|e| {
                panic!(
                    "{}: {}",
                    file.display(),
                    flotilla_api_machinery::field::aggregate(&e)
                )
            });
            with_rules += usize::from(v.has_rules());
        }
    }
    // the Issuer and ClusterIssuer venafi rule
    assert_eq!(with_rules, 2);
}

#[test]
fn cert_manager_issuers_are_validated() {
    let (_, schema) = fixture_schemas(&format!("{CERT_MANAGER}/cert-manager.io_issuers.yaml"))
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("one version"));
    let v = Validator::new(&schema);
    let issuer = |venafi: Value| {
        json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Issuer",
            "metadata": {"name": "venafi", "namespace": "default"},
            "spec": {"venafi": venafi},
        })
    };
    let tpp =
        json!({"url": "https://tpp.example.com/vedsdk", "credentialsRef": {"name": "tpp-secret"}});
    assert!(
        v.validate(&issuer(json!({"zone": "z", "tpp": tpp})), None)
            .is_empty()
    );
    assert_eq!(
        messages(&v.validate(&issuer(json!({"zone": "z"})), None)),
        [
            r#"spec.venafi: Invalid value: "object": exactly one of tpp, cloud, or ngts must be configured"#
        ]
    );
    let both = json!({"zone": "z", "tpp": tpp, "cloud": {"apiTokenSecretRef": {"name": "t"}}});
    assert_eq!(v.validate(&issuer(both), None).len(), 1);
}
