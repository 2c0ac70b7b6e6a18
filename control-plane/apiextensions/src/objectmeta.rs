//! TypeMeta and ObjectMeta of custom resources and of `x-kubernetes-embedded-resource` values
//! (upstream `pkg/apiserver/schema/objectmeta`): decoding checks, dropping unknown metadata
//! fields the way a round trip through `metav1.ObjectMeta` does (`Coerce`), and validating
//! embedded `apiVersion`, `kind` and metadata names (`Validate`).

use flotilla_api_machinery::field::{FieldError, Path};
use flotilla_api_machinery::names;
use serde_json::{Map, Value};

use crate::structural::Structural;

/// The Go type a metadata field decodes into; decides both type checks and how an empty value
/// disappears on re-encoding (`omitempty`).
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Str,
    Int,
    /// `*int64`: zero survives re-encoding, only null disappears.
    IntPtr,
    Time,
    StrMap,
    StrList,
    OwnerRefs,
    ManagedFields,
}

const OBJECT_META: &[(&str, Kind)] = &[
    ("name", Kind::Str),
    ("generateName", Kind::Str),
    ("namespace", Kind::Str),
    ("selfLink", Kind::Str),
    ("uid", Kind::Str),
    ("resourceVersion", Kind::Str),
    ("generation", Kind::Int),
    ("creationTimestamp", Kind::Time),
    ("deletionTimestamp", Kind::Time),
    ("deletionGracePeriodSeconds", Kind::IntPtr),
    ("labels", Kind::StrMap),
    ("annotations", Kind::StrMap),
    ("ownerReferences", Kind::OwnerRefs),
    ("finalizers", Kind::StrList),
    ("managedFields", Kind::ManagedFields),
];

/// `metav1.OwnerReference`: the four strings are always encoded, the two bools only when set.
const OWNER_REFERENCE: &[(&str, bool)] = &[
    ("apiVersion", true),
    ("kind", true),
    ("name", true),
    ("uid", true),
    ("controller", false),
    ("blockOwnerDeletion", false),
];

const MANAGED_FIELDS_ENTRY: &[&str] = &[
    "manager",
    "operation",
    "apiVersion",
    "time",
    "fieldsType",
    "fieldsV1",
    "subresource",
];

/// The JSON type name Go's decoder reports in `cannot unmarshal` errors.
fn json_kind(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(_) => "bool".to_string(),
        Value::Number(n) if n.is_f64() => format!("number {n}"),
        Value::Number(_) => "number".to_string(),
        Value::String(_) => "string".to_string(),
        Value::Array(_) => "array".to_string(),
        Value::Object(_) => "object".to_string(),
    }
}

fn unmarshal_error(value: &Value, field: &str, go_type: &str) -> String {
    format!(
        "json: cannot unmarshal {} into Go struct field ObjectMeta.{field} of type {go_type}",
        json_kind(value)
    )
}

fn is_int(value: &Value) -> bool {
    value.is_i64() || value.is_u64()
}

/// Whether `value` decodes into the Go type of `kind`; the error is Go's decoder message.
fn check_field(field: &str, kind: Kind, value: &Value) -> Result<(), String> {
    if value.is_null() {
        return Ok(());
    }
    let all_strings = |items: &mut dyn Iterator<Item = &Value>| {
        for item in items {
            if !item.is_null() && !item.is_string() {
                return Err(unmarshal_error(item, field, "string"));
            }
        }
        Ok(())
    };
    match (kind, value) {
        (Kind::Str | Kind::Time, Value::String(_)) => Ok(()),
        (Kind::Str, other) => Err(unmarshal_error(other, field, "string")),
        (Kind::Time, other) => Err(unmarshal_error(other, field, "v1.Time")),
        (Kind::Int | Kind::IntPtr, v) if is_int(v) => Ok(()),
        (Kind::Int | Kind::IntPtr, other) => Err(unmarshal_error(other, field, "int64")),
        (Kind::StrMap, Value::Object(map)) => all_strings(&mut map.values()),
        (Kind::StrMap, other) => Err(unmarshal_error(other, field, "map[string]string")),
        (Kind::StrList, Value::Array(items)) => all_strings(&mut items.iter()),
        (Kind::StrList, other) => Err(unmarshal_error(other, field, "[]string")),
        (Kind::OwnerRefs | Kind::ManagedFields, Value::Array(items)) => {
            for item in items {
                match item {
                    Value::Object(entry) => check_entry(field, kind, entry)?,
                    Value::Null => {}
                    other => return Err(unmarshal_error(other, field, "object")),
                }
            }
            Ok(())
        }
        (Kind::OwnerRefs, other) => Err(unmarshal_error(other, field, "[]v1.OwnerReference")),
        (_, other) => Err(unmarshal_error(other, field, "[]v1.ManagedFieldsEntry")),
    }
}

fn check_entry(field: &str, kind: Kind, entry: &Map<String, Value>) -> Result<(), String> {
    for (key, value) in entry {
        if value.is_null() {
            continue;
        }
        // Unknown keys are dropped later, not decoded.
        let known = match kind {
            Kind::OwnerRefs => OWNER_REFERENCE.iter().any(|(name, _)| name == key),
            _ => MANAGED_FIELDS_ENTRY.contains(&key.as_str()),
        };
        let ok = !known
            || match (kind, key.as_str()) {
                (Kind::OwnerRefs, "controller" | "blockOwnerDeletion") => value.is_boolean(),
                (Kind::ManagedFields, "fieldsV1") => value.is_object(),
                _ => value.is_string(),
            };
        if !ok {
            return Err(unmarshal_error(value, &format!("{field}.{key}"), "string"));
        }
    }
    Ok(())
}

/// Upstream `GetObjectMeta`'s decoding: why `metadata` does not decode into ObjectMeta.
pub(crate) fn object_meta_problem(metadata: &Value) -> Option<String> {
    let Value::Object(map) = metadata else {
        if metadata.is_null() {
            return None;
        }
        return Some(format!(
            "json: cannot unmarshal {} into Go value of type v1.ObjectMeta",
            json_kind(metadata)
        ));
    };
    OBJECT_META.iter().find_map(|(field, kind)| {
        map.get(*field)
            .and_then(|value| check_field(field, *kind, value).err())
    })
}

/// Whether the field disappears when ObjectMeta is encoded again (`omitempty`, nil pointers).
fn vanishes(kind: Kind, value: &Value) -> bool {
    match (kind, value) {
        (_, Value::Null) => true,
        (Kind::Str, Value::String(s)) => s.is_empty(),
        (Kind::Int, v) => v.as_i64() == Some(0),
        (Kind::StrMap, Value::Object(m)) => m.is_empty(),
        (Kind::StrList | Kind::OwnerRefs | Kind::ManagedFields, Value::Array(a)) => a.is_empty(),
        _ => false,
    }
}

/// Drops unknown fields from decodable ObjectMeta and normalizes what a round trip through
/// `metav1.ObjectMeta` normalizes; returns the unknown paths under `prefix`
/// (`spec.template.metadata.foo`).
fn normalize_object_meta(map: &mut Map<String, Value>, prefix: &str) -> Vec<String> {
    let mut unknown = Vec::new();
    map.retain(|key, value| {
        let Some((_, kind)) = OBJECT_META.iter().find(|(name, _)| name == key) else {
            unknown.push(format!("{prefix}.{key}"));
            return false;
        };
        match (kind, &mut *value) {
            // A null entry decodes to Go's zero value.
            (Kind::StrMap, Value::Object(entries)) => entries
                .values_mut()
                .filter(|v| v.is_null())
                .for_each(|v| *v = Value::String(String::new())),
            (Kind::StrList, Value::Array(items)) => items
                .iter_mut()
                .filter(|v| v.is_null())
                .for_each(|v| *v = Value::String(String::new())),
            (Kind::OwnerRefs, Value::Array(items)) => {
                for (i, item) in items.iter_mut().enumerate() {
                    normalize_owner_reference(item, &format!("{prefix}.{key}[{i}]"), &mut unknown);
                }
            }
            (Kind::ManagedFields, Value::Array(items)) => {
                for (i, item) in items.iter_mut().enumerate() {
                    if let Value::Object(entry) = item {
                        entry.retain(|k, v| {
                            if !MANAGED_FIELDS_ENTRY.contains(&k.as_str()) {
                                unknown.push(format!("{prefix}.{key}[{i}].{k}"));
                                return false;
                            }
                            !(v.is_null() || v.as_str() == Some(""))
                        });
                    }
                }
            }
            _ => {}
        }
        !vanishes(*kind, value)
    });
    unknown
}

fn normalize_owner_reference(item: &mut Value, prefix: &str, unknown: &mut Vec<String>) {
    if item.is_null() {
        *item = Value::Object(Map::new());
    }
    let Value::Object(entry) = item else { return };
    entry.retain(
        |k, v| match OWNER_REFERENCE.iter().find(|(name, _)| name == k) {
            None => {
                unknown.push(format!("{prefix}.{k}"));
                false
            }
            Some((_, always)) => *always || !v.is_null(),
        },
    );
    for (name, always) in OWNER_REFERENCE {
        if *always {
            let slot = entry
                .entry(name.to_string())
                .or_insert_with(|| Value::String(String::new()));
            if slot.is_null() {
                *slot = Value::String(String::new());
            }
        }
    }
}

/// Upstream `GetObjectMetaWithOptions` + `SetObjectMeta` on `object["metadata"]`: the unknown
/// field paths, or Go's decoding error when the metadata is malformed and may not be dropped.
pub(crate) fn coerce_metadata(
    object: &mut Map<String, Value>,
    parent: &Path,
    drop_invalid: bool,
) -> Result<Vec<String>, String> {
    let Some(metadata) = object.get_mut("metadata") else {
        return Ok(Vec::new());
    };
    if let Some(problem) = object_meta_problem(metadata) {
        if !drop_invalid {
            return Err(problem);
        }
        match metadata {
            // Best effort, like upstream: keep the fields that decode on their own.
            Value::Object(map) => map.retain(|key, value| {
                OBJECT_META
                    .iter()
                    .find(|(name, _)| name == key)
                    .is_none_or(|(name, kind)| check_field(name, *kind, value).is_ok())
            }),
            _ => return Ok(Vec::new()),
        }
    }
    let prefix = parent.child("metadata").to_string();
    match metadata {
        Value::Object(map) => Ok(normalize_object_meta(map, &prefix)),
        _ => {
            // `metadata: null` decodes to an empty ObjectMeta, which encodes as `{}`.
            *metadata = Value::Object(Map::new());
            Ok(Vec::new())
        }
    }
}

/// Upstream `CoerceWithOptions`: checks the types of TypeMeta of embedded resources (and of
/// the root when `is_resource_root`) and prunes their ObjectMeta to the known fields. Returns
/// the unknown metadata paths, sorted.
pub(crate) fn coerce(
    path: &Path,
    value: &mut Value,
    schema: &Structural,
    is_resource_root: bool,
    drop_invalid: bool,
) -> Result<Vec<String>, Box<FieldError>> {
    let mut unknown = Vec::new();
    coerce_node(
        path,
        value,
        Some(schema),
        is_resource_root,
        drop_invalid,
        &mut unknown,
    )?;
    unknown.sort();
    Ok(unknown)
}

fn coerce_node(
    path: &Path,
    value: &mut Value,
    schema: Option<&Structural>,
    embedded_root: bool,
    drop_invalid: bool,
    unknown: &mut Vec<String>,
) -> Result<(), Box<FieldError>> {
    let Some(s) = schema else { return Ok(()) };
    match value {
        Value::Object(map) => {
            if embedded_root || s.extensions.embedded_resource {
                for key in ["apiVersion", "kind"] {
                    match map.get(key) {
                        Some(v) if !v.is_string() => {
                            if !drop_invalid {
                                return Err(Box::new(FieldError::invalid(
                                    &path.child(key),
                                    v.clone(),
                                    "must be a string",
                                )));
                            }
                            map.remove(key);
                        }
                        _ => {}
                    }
                }
                let original = map.get("metadata").cloned();
                match coerce_metadata(map, path, drop_invalid) {
                    Ok(paths) => unknown.extend(paths),
                    Err(problem) => {
                        return Err(Box::new(FieldError::invalid(
                            &path.child("metadata"),
                            original.unwrap_or(Value::Null),
                            problem,
                        )));
                    }
                }
            }
            for (key, child) in map.iter_mut() {
                if let Some(prop) = s.properties.get(key) {
                    coerce_node(
                        &path.child(key),
                        child,
                        Some(prop),
                        false,
                        drop_invalid,
                        unknown,
                    )?;
                } else if let Some(additional) = &s.additional_properties {
                    let sub = additional.schema();
                    coerce_node(&path.key(key), child, sub, false, drop_invalid, unknown)?;
                }
            }
        }
        Value::Array(items) => {
            let sub = s.items.as_deref();
            for (i, item) in items.iter_mut().enumerate() {
                coerce_node(&path.index(i), item, sub, false, drop_invalid, unknown)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Upstream `objectmeta.Validate`: validates TypeMeta and ObjectMeta of embedded resources
/// (and of the root when `is_resource_root`).
pub(crate) fn validate(
    path: &Path,
    value: &Value,
    schema: &Structural,
    is_resource_root: bool,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    validate_node(path, value, Some(schema), is_resource_root, &mut errors);
    errors
}

fn validate_node(
    path: &Path,
    value: &Value,
    schema: Option<&Structural>,
    embedded_root: bool,
    errors: &mut Vec<FieldError>,
) {
    let Some(s) = schema else { return };
    match value {
        Value::Object(map) => {
            if embedded_root || s.extensions.embedded_resource {
                validate_embedded_resource(path, map, errors);
            }
            for (key, child) in map {
                if let Some(prop) = s.properties.get(key) {
                    validate_node(&path.child(key), child, Some(prop), false, errors);
                } else if let Some(additional) = &s.additional_properties {
                    validate_node(&path.key(key), child, additional.schema(), false, errors);
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                validate_node(&path.index(i), item, s.items.as_deref(), false, errors);
            }
        }
        _ => {}
    }
}

/// `schema.ParseGroupVersion`'s complaint about an `apiVersion`.
fn group_version_problem(api_version: &str) -> Option<String> {
    (api_version.matches('/').count() > 1)
        .then(|| format!("unexpected GroupVersion string: {api_version}"))
}

fn validate_embedded_resource(
    path: &Path,
    object: &Map<String, Value>,
    errors: &mut Vec<FieldError>,
) {
    for key in ["apiVersion", "kind"] {
        if !object.contains_key(key) {
            errors.push(FieldError::required(&path.child(key), ""));
        }
    }
    for (key, value) in object {
        let field = path.child(key.as_str());
        match (key.as_str(), value) {
            ("apiVersion" | "kind", Value::String(s)) if s.is_empty() => {
                errors.push(FieldError::invalid(&field, "", "must not be empty"));
            }
            ("apiVersion", Value::String(s)) => {
                if let Some(problem) = group_version_problem(s) {
                    errors.push(FieldError::invalid(&field, s.as_str(), problem));
                }
            }
            ("kind", Value::String(s)) => {
                let problems = names::is_dns1035_label(&s.to_lowercase());
                if !problems.is_empty() {
                    errors.push(FieldError::invalid(
                        &field,
                        s.as_str(),
                        format!(
                            "may have mixed case, but should otherwise match: {}",
                            problems.join(",")
                        ),
                    ));
                }
            }
            ("apiVersion" | "kind", other) => {
                errors.push(FieldError::invalid(
                    &field,
                    other.clone(),
                    "must be a string",
                ));
            }
            ("metadata", metadata) => match object_meta_problem(metadata) {
                Some(problem) => {
                    errors.push(FieldError::invalid(&field, metadata.clone(), problem))
                }
                None => validate_object_meta(&field, metadata, errors),
            },
            _ => {}
        }
    }
}

/// `content.IsPathSegmentPrefix`: a `generateName` may end anywhere but must not contain a
/// path separator.
fn path_segment_prefix_problems(prefix: &str) -> Vec<String> {
    ["/", "%"]
        .into_iter()
        .filter(|illegal| prefix.contains(illegal))
        .map(|illegal| format!("may not contain '{illegal}'"))
        .collect()
}

/// The subset of `ValidateObjectMeta` that applies to an embedded resource's metadata: names
/// are path segments, a namespace a DNS label, plus generation, labels and annotations.
fn validate_object_meta(path: &Path, metadata: &Value, errors: &mut Vec<FieldError>) {
    let text = |key: &str| {
        metadata
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    let generate_name = text("generateName");
    if !generate_name.is_empty() {
        let field = path.child("generateName");
        for problem in path_segment_prefix_problems(generate_name) {
            errors.push(FieldError::invalid(&field, generate_name, problem));
        }
    }
    // Upstream substitutes a placeholder for an empty name: embedded objects need none.
    let name = text("name");
    let field = path.child("name");
    for problem in names::is_valid_path_segment_name(name) {
        errors.push(FieldError::invalid(&field, name, problem));
    }
    let namespace = text("namespace");
    if !namespace.is_empty() {
        let field = path.child("namespace");
        for problem in names::is_dns1123_label(namespace) {
            errors.push(FieldError::invalid(&field, namespace, problem));
        }
    }
    if let Some(generation) = metadata.get("generation").and_then(Value::as_i64)
        && generation < 0
    {
        errors.push(FieldError::invalid(
            &path.child("generation"),
            generation,
            "must be greater than or equal to 0",
        ));
    }
    let string_map = |key: &str| -> Vec<(&str, &str)> {
        metadata
            .get(key)
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.as_str(), v.as_str().unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default()
    };
    errors.extend(names::validate_labels(
        string_map("labels"),
        &path.child("labels"),
    ));
    errors.extend(names::validate_annotations(
        string_map("annotations"),
        &path.child("annotations"),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_api_machinery::field::aggregate;
    use serde_json::json;

    fn embedded() -> Structural {
        let mut template = Structural {
            type_: "object".into(),
            ..Structural::default()
        };
        template.extensions.embedded_resource = true;
        template.extensions.preserve_unknown_fields = true;
        let mut root = Structural {
            type_: "object".into(),
            ..Structural::default()
        };
        root.properties.insert("template".into(), template);
        root
    }

    #[test]
    fn coerce_prunes_embedded_metadata() {
        let mut value = json!({"template": {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "x", "creationTimestamp": null, "bogus": 1, "labels": {},
                         "ownerReferences": [{"name": "o", "extra": true}]}
        }});
        let unknown =
            coerce(&Path::none(), &mut value, &embedded(), false, false).expect("coerces");
        assert_eq!(
            unknown,
            vec![
                "template.metadata.bogus",
                "template.metadata.ownerReferences[0].extra"
            ]
        );
        assert_eq!(
            value["template"]["metadata"],
            json!({"name": "x", "ownerReferences": [
                {"name": "o", "apiVersion": "", "kind": "", "uid": ""}
            ]})
        );
    }

    #[test]
    fn coerce_reports_malformed_type_meta() {
        let mut value = json!({"template": {"apiVersion": 1, "kind": "Pod"}});
        let err = coerce(&Path::none(), &mut value, &embedded(), false, false)
            .expect_err("apiVersion is a number");
        assert_eq!(
            err.to_string(),
            "template.apiVersion: Invalid value: 1: must be a string"
        );
        let mut value = json!({"template": {"metadata": {"name": 5}}});
        let err = coerce(&Path::none(), &mut value, &embedded(), false, false)
            .expect_err("name is a number");
        assert_eq!(
            err.to_string(),
            "template.metadata: Invalid value: {\"name\":5}: json: cannot unmarshal number into Go struct field ObjectMeta.name of type string"
        );
        let mut value = json!({"template": {"apiVersion": 1, "metadata": {"name": 5, "uid": "u"}}});
        coerce(&Path::none(), &mut value, &embedded(), false, true).expect("drops");
        assert_eq!(value, json!({"template": {"metadata": {"uid": "u"}}}));
    }

    #[test]
    fn validates_embedded_resources() {
        let cases = [
            (json!({"template": {"apiVersion": "v1", "kind": "Pod"}}), ""),
            (
                json!({"template": {}}),
                "[template.apiVersion: Required value, template.kind: Required value]",
            ),
            (
                json!({"template": {"apiVersion": "a/b/c", "kind": "Pod_X"}}),
                "[template.apiVersion: Invalid value: \"a/b/c\": unexpected GroupVersion string: a/b/c, template.kind: Invalid value: \"Pod_X\": may have mixed case, but should otherwise match: a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')]",
            ),
            (
                json!({"template": {"apiVersion": "v1", "kind": "Pod",
                                    "metadata": {"name": "a/b", "namespace": "Bad"}}}),
                "[template.metadata.name: Invalid value: \"a/b\": may not contain '/', template.metadata.namespace: Invalid value: \"Bad\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')]",
            ),
        ];
        for (value, want) in cases {
            let errors = validate(&Path::none(), &value, &embedded(), false);
            assert_eq!(aggregate(&errors), want, "{value}");
        }
    }
}
