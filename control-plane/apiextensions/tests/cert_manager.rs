//! The real cert-manager CRDs (`/work/shared/fixtures/crds/cert-manager`) through the whole
//! pipeline: every version's schema is structural and compiles, and Certificates and Issuers
//! are pruned, defaulted and validated as kube-apiserver would.

use std::path::Path as FsPath;

use flotilla_api_machinery::field::Path;
use flotilla_apiextensions::{CompiledSchema, validate_structural};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

const FIXTURES: &str = "/work/shared/fixtures/crds/cert-manager";

fn crds() -> Vec<CustomResourceDefinition> {
    let mut files: Vec<_> = std::fs::read_dir(FIXTURES)
        .expect("fixtures directory")
        .map(|entry| entry.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 6, "cert-manager ships six CRDs");
    files.iter().flat_map(|f| load(f)).collect()
}

fn load(file: &FsPath) -> Vec<CustomResourceDefinition> {
    let text = std::fs::read_to_string(file).expect("readable fixture");
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            let value: Value = serde::Deserialize::deserialize(doc).expect("YAML document");
            serde_json::from_value(value).expect("a CustomResourceDefinition")
        })
        .collect()
}

fn schema_of(name: &str, version: &str) -> CompiledSchema {
    let crd = crds()
        .into_iter()
        .find(|c| c.metadata.name.as_deref() == Some(name))
        .expect("CRD present");
    let v = crd
        .spec
        .versions
        .iter()
        .find(|v| v.name == version)
        .expect("version present");
    let props = v
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("schema");
    CompiledSchema::new(props).expect("compiles")
}

fn rendered(errors: &[flotilla_api_machinery::field::FieldError]) -> Vec<String> {
    errors.iter().map(ToString::to_string).collect()
}

#[test]
fn every_version_is_structural() {
    let mut versions = 0;
    for crd in crds() {
        for (i, version) in crd.spec.versions.iter().enumerate() {
            let props = version
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .expect("every version has a schema");
            let path = Path::new("spec")
                .child("versions")
                .index(i)
                .child("schema")
                .child("openAPIV3Schema");
            let errors = validate_structural(props, &path);
            assert!(
                errors.is_empty(),
                "{:?} {}: {:?}",
                crd.metadata.name,
                version.name,
                rendered(&errors)
            );
            CompiledSchema::new(props).expect("compiles");
            versions += 1;
        }
    }
    assert!(versions >= 6);
}

fn certificate() -> Value {
    json!({
        "apiVersion": "cert-manager.io/v1",
        "kind": "Certificate",
        "metadata": {"name": "example", "namespace": "default"},
        "spec": {
            "secretName": "example-tls",
            "dnsNames": ["example.com", "www.example.com"],
            "duration": "2160h",
            "renewBefore": "360h",
            "issuerRef": {"name": "letsencrypt", "kind": "ClusterIssuer", "group": "cert-manager.io"},
            "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
            "usages": ["digital signature", "key encipherment", "server auth"]
        }
    })
}

#[test]
fn validates_certificates() {
    let schema = schema_of("certificates.cert-manager.io", "v1");
    assert_eq!(
        rendered(&schema.validate(&certificate())),
        Vec::<String>::new()
    );

    let mut bad_enum = certificate();
    bad_enum["spec"]["privateKey"]["algorithm"] = json!("DSA");
    assert_eq!(
        rendered(&schema.validate(&bad_enum)),
        vec![
            r#"spec.privateKey.algorithm: Unsupported value: "DSA": supported values: "RSA", "ECDSA", "Ed25519""#
        ]
    );

    let mut missing = certificate();
    let spec = missing["spec"].as_object_mut().expect("spec");
    spec.remove("secretName");
    spec.remove("issuerRef");
    assert_eq!(
        rendered(&schema.validate(&missing)),
        vec![
            "spec.issuerRef: Required value",
            "spec.secretName: Required value"
        ]
    );

    let mut wrong_type = certificate();
    wrong_type["spec"]["dnsNames"] = json!("example.com");
    assert_eq!(
        rendered(&schema.validate(&wrong_type)),
        vec![
            r#"spec.dnsNames: Invalid value: "string": spec.dnsNames in body must be of type array: "string""#
        ]
    );
}

#[test]
fn prunes_certificates() {
    let schema = schema_of("certificates.cert-manager.io", "v1");
    let mut value = certificate();
    value["spec"]["bogus"] = json!(true);
    value["spec"]["privateKey"]["curve"] = json!("P-256");
    value["metadata"]["extra"] = json!("x");
    value["status"] = json!({"conditions": [{"type": "Ready", "status": "True", "junk": 1}]});
    let unknown = schema.prune(&mut value, true);
    assert_eq!(
        unknown,
        vec![
            "metadata.extra",
            "spec.bogus",
            "spec.privateKey.curve",
            "status.conditions[0].junk",
        ]
    );
    let mut want = certificate();
    want["status"] = json!({"conditions": [{"type": "Ready", "status": "True"}]});
    assert_eq!(value, want);
}

#[test]
fn defaults_issuers() {
    let schema = schema_of("issuers.cert-manager.io", "v1");
    let mut value = json!({
        "apiVersion": "cert-manager.io/v1",
        "kind": "Issuer",
        "metadata": {"name": "letsencrypt", "namespace": "default"},
        "spec": {"acme": {
            "server": "https://acme-v02.api.letsencrypt.org/directory",
            "privateKeySecretRef": {"name": "account-key"},
            "solvers": [{"http01": {"gatewayHTTPRoute": {"parentRefs": [{"name": "gw"}]}}}]
        }}
    });
    assert!(schema.prune(&mut value, true).is_empty());
    schema.apply_defaults(&mut value);
    assert_eq!(
        value["spec"]["acme"]["renewalInformationSource"],
        json!("ARI")
    );
    assert_eq!(
        value["spec"]["acme"]["solvers"][0]["http01"]["gatewayHTTPRoute"]["parentRefs"][0],
        json!({"name": "gw", "group": "gateway.networking.k8s.io", "kind": "Gateway"})
    );
    assert_eq!(rendered(&schema.validate(&value)), Vec::<String>::new());

    let mut missing = value.clone();
    missing["spec"]["acme"]
        .as_object_mut()
        .expect("acme")
        .remove("server");
    assert_eq!(
        rendered(&schema.validate(&missing)),
        vec!["spec.acme.server: Required value"]
    );
}
