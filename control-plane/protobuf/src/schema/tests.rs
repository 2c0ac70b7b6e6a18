//! Checks of the compiled-in schema: kind lookup, Go pointer/value and inline facts, and a
//! field-by-field comparison of every JSON name against k8s-openapi's schemas.

use std::collections::BTreeSet;

use k8s_openapi::Resource;
use schemars::SchemaGenerator;

use super::*;

fn loaded() -> &'static Schema {
    match schema() {
        Ok(schema) => schema,
        Err(err) => panic!("schema does not load: {err}"),
    }
}

fn field<'a>(schema: &'a Schema, message: &str, name: &str) -> &'a Field {
    let index = schema
        .message(message)
        .unwrap_or_else(|| panic!("no message {message}"));
    schema.messages[index]
        .fields
        .iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no field {message}.{name}"))
}

#[test]
fn kinds_resolve_to_their_messages() {
    let schema = loaded();
    let cases: &[(&str, &str, Option<&str>)] = &[
        ("v1", "ConfigMap", Some("k8s.io.api.core.v1.ConfigMap")),
        (
            "apps/v1",
            "Deployment",
            Some("k8s.io.api.apps.v1.Deployment"),
        ),
        (
            "authentication.k8s.io/v1",
            "TokenRequest",
            Some("k8s.io.api.authentication.v1.TokenRequest"),
        ),
        (
            "rbac.authorization.k8s.io/v1",
            "ClusterRoleBinding",
            Some("k8s.io.api.rbac.v1.ClusterRoleBinding"),
        ),
        (
            "autoscaling/v2",
            "HorizontalPodAutoscaler",
            Some("k8s.io.api.autoscaling.v2.HorizontalPodAutoscaler"),
        ),
        // Options and Status are registered in every group version.
        (
            "apps/v1",
            "DeleteOptions",
            Some("k8s.io.apimachinery.pkg.apis.meta.v1.DeleteOptions"),
        ),
        (
            "v1",
            "Status",
            Some("k8s.io.apimachinery.pkg.apis.meta.v1.Status"),
        ),
        (
            "meta.k8s.io/v1",
            "PartialObjectMetadata",
            Some("k8s.io.apimachinery.pkg.apis.meta.v1.PartialObjectMetadata"),
        ),
        ("apps/v1", "Foo", None),
        ("apps.example.com/v1", "Deployment", None),
        ("v2", "ConfigMap", None),
        ("", "ConfigMap", None),
        ("v1", "ConfigMap.DataEntry", None),
        ("meta.k8s.io/v1", "Time", None),
    ];
    for (api_version, kind, want) in cases {
        let got = schema
            .kind(api_version, kind)
            .map(|i| schema.messages[i].name.as_str());
        assert_eq!(got, *want, "{api_version} {kind}");
    }
}

#[test]
fn go_pointer_value_and_inline_facts() {
    let schema = loaded();
    let deployment_spec = "k8s.io.api.apps.v1.DeploymentSpec";
    let pod_spec = "k8s.io.api.core.v1.PodSpec";
    // (message, field, nullable, inline, shape)
    let cases: &[(&str, &str, bool, bool, &str)] = &[
        (deployment_spec, "replicas", true, false, "single"),
        (deployment_spec, "minReadySeconds", false, false, "single"),
        (
            pod_spec,
            "automountServiceAccountToken",
            true,
            false,
            "single",
        ),
        // Repeated fields are Go slices either way; gogo marks []T (not []*T) non-nullable.
        (pod_spec, "containers", false, false, "repeated"),
        (
            "k8s.io.api.core.v1.Volume",
            "volumeSource",
            false,
            true,
            "single",
        ),
        ("k8s.io.api.core.v1.Probe", "handler", false, true, "single"),
        (
            "k8s.io.api.core.v1.SecretKeySelector",
            "localObjectReference",
            false,
            true,
            "single",
        ),
        (
            "k8s.io.api.rbac.v1.RoleBinding",
            "roleRef",
            false,
            false,
            "single",
        ),
        // Maps likewise: gogo marks them non-nullable, and presence is the entry count.
        ("k8s.io.api.core.v1.ConfigMap", "data", false, false, "map"),
        ("k8s.io.api.core.v1.Secret", "data", false, false, "map"),
        (
            "k8s.io.api.core.v1.PersistentVolumeClaimSpec",
            "storageClassName",
            true,
            false,
            "single",
        ),
        (
            "k8s.io.api.authentication.v1.BoundObjectReference",
            "uid",
            false,
            false,
            "single",
        ),
        (
            "k8s.io.api.core.v1.DaemonEndpoint",
            "Port",
            false,
            false,
            "single",
        ),
    ];
    for (message, name, nullable, inline, shape) in cases {
        let f = field(schema, message, name);
        let got_shape = match f.shape {
            Shape::Single => "single",
            Shape::Repeated => "repeated",
            Shape::Map { .. } => "map",
        };
        assert_eq!(
            (f.nullable, f.inline, got_shape),
            (*nullable, *inline, *shape),
            "{message}.{name}"
        );
    }
    let secret_data = field(schema, "k8s.io.api.core.v1.Secret", "data");
    assert_eq!(
        secret_data.shape,
        Shape::Map {
            key: Type::String,
            value: Type::Bytes
        }
    );
}

/// Every Go struct embedded in another must be classified as inline or as keeping its JSON
/// name: the descriptors cannot tell, so a new one has to be looked at by a person.
#[test]
fn every_embedded_struct_is_classified() {
    let raw = match raw_messages(DESCRIPTORS) {
        Ok(raw) => raw,
        Err(err) => panic!("{err}"),
    };
    let mut unclassified = BTreeSet::new();
    for message in &raw {
        for field in &message.fields {
            let type_name = simple_name(&field.type_name);
            if field.ty == 11
                && !field.nullable
                && !field.repeated
                && field.go_name == type_name
                && !INLINE_TYPES.contains(&type_name)
                && !NAMED_EMBEDDED_TYPES.contains(&type_name)
            {
                unclassified.insert(format!("{}.{}", message.name, field.name));
            }
        }
    }
    assert!(unclassified.is_empty(), "unclassified: {unclassified:?}");
}

/// A protobuf name that does not look like a JSON name (capitalised, or an initialism
/// lowercased only in its first letter like `uID`) must be overridden or known to be right, so
/// that a regenerated descriptor set cannot slip in a new one unnoticed.
#[test]
fn odd_protobuf_names_are_all_accounted_for() {
    let raw = match raw_messages(DESCRIPTORS) {
        Ok(raw) => raw,
        Err(err) => panic!("{err}"),
    };
    // JSON names that really are capitalised, and a schema union's member, which has no JSON
    // name of its own (the union is written as the member).
    let genuine = [
        ("DaemonEndpoint", "Port"),
        ("FieldsV1", "Raw"),
        ("JSONSchemaPropsOrArray", "jSONSchemas"),
    ];
    let mut odd = BTreeSet::new();
    for message in &raw {
        let type_name = simple_name(&message.name);
        for field in &message.fields {
            let bytes = field.name.as_bytes();
            let looks_odd = bytes.first().is_some_and(u8::is_ascii_uppercase)
                || (bytes.len() > 2
                    && bytes[0].is_ascii_lowercase()
                    && bytes[1].is_ascii_uppercase()
                    && bytes[2].is_ascii_uppercase());
            let known = genuine.contains(&(type_name, field.name.as_str()))
                || json_name(&message.name, &field.name) != field.name;
            if looks_odd && !known {
                odd.insert(format!("{}.{}", message.name, field.name));
            }
        }
    }
    assert!(odd.is_empty(), "unexplained protobuf names: {odd:?}");
}

/// Registers the schema of each kind and returns its apiVersion and kind.
macro_rules! kinds {
    ($generator:ident; $($ty:ty),* $(,)?) => {
        vec![$({
            $generator.subschema_for::<$ty>();
            (<$ty as Resource>::API_VERSION, <$ty as Resource>::KIND)
        }),*]
    };
}

/// The JSON keys a message's fields produce, inline structs flattened.
fn json_names(schema: &Schema, index: usize, out: &mut BTreeSet<String>) {
    for field in &schema.messages[index].fields {
        match (field.inline, field.ty) {
            (true, Type::Message(inner)) => json_names(schema, inner, out),
            _ => {
                out.insert(field.name.clone());
            }
        }
    }
}

/// Compares every field name (after inline flattening) of every type reachable from the
/// built-in kinds with k8s-openapi's schema for the same Kubernetes version: a mismatch means
/// a JSON name, an inline classification or a kind mapping is wrong.
#[test]
fn json_names_match_k8s_openapi() {
    use k8s_openapi::api::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;

    let schema = loaded();
    let mut generator = SchemaGenerator::default();
    let kinds = kinds![generator;
        admissionregistration::v1::MutatingWebhookConfiguration,
        admissionregistration::v1::ValidatingAdmissionPolicy,
        admissionregistration::v1::ValidatingAdmissionPolicyBinding,
        admissionregistration::v1::ValidatingWebhookConfiguration,
        admissionregistration::v1alpha1::MutatingAdmissionPolicy,
        admissionregistration::v1alpha1::MutatingAdmissionPolicyBinding,
        admissionregistration::v1beta1::ValidatingAdmissionPolicy,
        admissionregistration::v1beta1::ValidatingAdmissionPolicyBinding,
        apiserverinternal::v1alpha1::StorageVersion,
        apps::v1::ControllerRevision,
        apps::v1::DaemonSet,
        apps::v1::Deployment,
        apps::v1::ReplicaSet,
        apps::v1::StatefulSet,
        authentication::v1::SelfSubjectReview,
        authentication::v1::TokenRequest,
        authentication::v1::TokenReview,
        authorization::v1::LocalSubjectAccessReview,
        authorization::v1::SelfSubjectAccessReview,
        authorization::v1::SelfSubjectRulesReview,
        authorization::v1::SubjectAccessReview,
        autoscaling::v1::HorizontalPodAutoscaler,
        autoscaling::v1::Scale,
        autoscaling::v2::HorizontalPodAutoscaler,
        batch::v1::CronJob,
        batch::v1::Job,
        certificates::v1::CertificateSigningRequest,
        certificates::v1alpha1::ClusterTrustBundle,
        certificates::v1beta1::ClusterTrustBundle,
        coordination::v1::Lease,
        coordination::v1alpha2::LeaseCandidate,
        coordination::v1beta1::LeaseCandidate,
        core::v1::Binding,
        core::v1::ComponentStatus,
        core::v1::ConfigMap,
        core::v1::Endpoints,
        core::v1::Event,
        core::v1::LimitRange,
        core::v1::Namespace,
        core::v1::Node,
        core::v1::PersistentVolume,
        core::v1::PersistentVolumeClaim,
        core::v1::Pod,
        core::v1::PodTemplate,
        core::v1::ReplicationController,
        core::v1::ResourceQuota,
        core::v1::Secret,
        core::v1::Service,
        core::v1::ServiceAccount,
        discovery::v1::EndpointSlice,
        events::v1::Event,
        flowcontrol::v1::FlowSchema,
        flowcontrol::v1::PriorityLevelConfiguration,
        networking::v1::IPAddress,
        networking::v1::Ingress,
        networking::v1::IngressClass,
        networking::v1::NetworkPolicy,
        networking::v1::ServiceCIDR,
        networking::v1beta1::IPAddress,
        networking::v1beta1::ServiceCIDR,
        node::v1::RuntimeClass,
        policy::v1::Eviction,
        policy::v1::PodDisruptionBudget,
        rbac::v1::ClusterRole,
        rbac::v1::ClusterRoleBinding,
        rbac::v1::Role,
        rbac::v1::RoleBinding,
        resource::v1alpha3::DeviceClass,
        resource::v1alpha3::DeviceTaintRule,
        resource::v1alpha3::ResourceClaim,
        resource::v1alpha3::ResourceClaimTemplate,
        resource::v1alpha3::ResourceSlice,
        resource::v1beta1::DeviceClass,
        resource::v1beta1::ResourceClaim,
        resource::v1beta1::ResourceClaimTemplate,
        resource::v1beta1::ResourceSlice,
        resource::v1beta2::DeviceClass,
        resource::v1beta2::ResourceClaim,
        resource::v1beta2::ResourceClaimTemplate,
        resource::v1beta2::ResourceSlice,
        scheduling::v1::PriorityClass,
        storage::v1::CSIDriver,
        storage::v1::CSINode,
        storage::v1::CSIStorageCapacity,
        storage::v1::StorageClass,
        storage::v1::VolumeAttachment,
        storage::v1alpha1::VolumeAttributesClass,
        storage::v1beta1::VolumeAttributesClass,
        storagemigration::v1alpha1::StorageVersionMigration,
        meta::APIGroup,
        meta::APIGroupList,
        meta::APIResourceList,
        meta::APIVersions,
        meta::Status,
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService,
    ];
    generator.subschema_for::<meta::DeleteOptions>();
    generator.subschema_for::<meta::WatchEvent<k8s_openapi::api::core::v1::Pod>>();

    let mut problems = Vec::new();
    for (api_version, kind) in kinds {
        if schema.kind(api_version, kind).is_none() {
            problems.push(format!("kind {api_version} {kind} does not resolve"));
        }
    }
    let mut compared = 0;
    for (definition, json_schema) in generator.definitions() {
        let Some(rest) = definition.strip_prefix("io.k8s.") else {
            continue;
        };
        // The proto packages spell the repositories' names with underscores.
        let rest = rest
            .replace("apiextensions-apiserver", "apiextensions_apiserver")
            .replace("kube-aggregator", "kube_aggregator");
        let proto_name = format!("k8s.io.{rest}");
        let Some(index) = schema.message(&proto_name) else {
            problems.push(format!("{definition}: no protobuf message"));
            continue;
        };
        let message = &schema.messages[index];
        let Some(properties) = json_schema.get("properties").and_then(|p| p.as_object()) else {
            // An empty Go struct (StorageVersionSpec) has no properties and no fields.
            if message.special.is_none() && !message.fields.is_empty() {
                problems.push(format!(
                    "{definition}: no properties but not a special type"
                ));
            }
            continue;
        };
        if message.special.is_some() {
            problems.push(format!(
                "{definition}: has properties but is a special type"
            ));
            continue;
        }
        let mut proto = BTreeSet::new();
        json_names(schema, index, &mut proto);
        // TypeMeta is not part of the protobuf message of a kind; it travels in the envelope.
        let openapi: BTreeSet<String> = properties
            .keys()
            .filter(|k| proto.contains(*k) || !matches!(k.as_str(), "apiVersion" | "kind"))
            .cloned()
            .collect();
        if proto != openapi {
            problems.push(format!(
                "{definition}: only in protobuf {:?}, only in openapi {:?}",
                proto.difference(&openapi).collect::<Vec<_>>(),
                openapi.difference(&proto).collect::<Vec<_>>()
            ));
        }
        compared += 1;
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(compared > 400, "only {compared} types compared");
}

/// Every field `json_zero_fields.py` listed is a field of the descriptor set (a regenerated
/// list or descriptor set that drifted apart would otherwise lose fields silently), and
/// none is a value struct, which is written as its zero struct.
#[test]
fn json_zero_fields_name_fields_of_the_schema() {
    let schema = schema().expect("schema");
    let listed = json_zero_fields();
    let mut found = 0;
    for message in &schema.messages {
        for field in &message.fields {
            if let Some(zero) = field.json_zero {
                found += 1;
                let value_struct = matches!(field.ty, Type::Message(_))
                    && !field.nullable
                    && field.shape == Shape::Single;
                assert!(
                    !value_struct || zero == JsonZero::Null,
                    "{}.{} is a value struct",
                    message.name,
                    field.name
                );
            }
        }
    }
    assert_eq!(found, listed.len(), "listed fields missing from the schema");
    let ready = schema
        .message("k8s.io.api.core.v1.ContainerStatus")
        .and_then(|m| schema.messages[m].fields.iter().find(|f| f.name == "ready"))
        .and_then(|f| f.json_zero);
    assert_eq!(ready, Some(JsonZero::False));
}
