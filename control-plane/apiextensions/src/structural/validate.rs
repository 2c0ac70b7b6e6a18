//! Whether a CRD version's `openAPIV3Schema` is an acceptable structural schema: upstream
//! `ValidateStructural` (`schema/validation.go`, `complete.go`), `ValidateDefaults`, and the
//! schema checks of `ValidateCustomResourceDefinitionOpenAPISchema` in
//! `apis/apiextensions/validation` (CEL compilation and cost estimates excepted).

use flotilla_api_machinery::field::{FieldError, Path};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use serde_json::Value;

use super::{Structural, flag, str_of};
use crate::defaulting::validate_defaults;
use crate::goregex;

mod crd;

#[derive(Clone, Copy, PartialEq)]
enum Level {
    Root,
    Item,
    Field,
}

/// Validates a CRD version's `openAPIV3Schema` at `path` (e.g.
/// `spec.versions[0].schema.openAPIV3Schema`), in upstream's order: `nullable` at the root,
/// the structural invariants (sorted, as upstream sorts them) or else the defaults, then the
/// per-node OpenAPI checks; the conversion error of `NewStructural` only when nothing else
/// was found.
pub fn validate_structural(schema: &JSONSchemaProps, path: &Path) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if flag(schema.nullable) {
        errors.push(FieldError::forbidden(
            &path.child("nullable"),
            "nullable cannot be true at the root",
        ));
    }
    let mut init_error = None;
    match Structural::new(schema) {
        Err(e) => init_error = Some(FieldError::invalid(path, "", e.to_string())),
        Ok(structural) => {
            let mut structural_errors = Vec::new();
            invariants(schema, Level::Root, path, &mut structural_errors);
            completeness(schema, schema, path, path, &mut structural_errors);
            structural_errors.sort_by_key(ToString::to_string);
            if structural_errors.is_empty() {
                errors.extend(validate_defaults(path, &structural));
            } else {
                errors.extend(structural_errors);
            }
        }
    }
    crd::validate_openapi_schema(schema, path, &mut errors);
    if errors.is_empty()
        && let Some(e) = init_error
    {
        errors.push(e);
    }
    errors
}

fn items_schema(s: &JSONSchemaProps) -> Option<&JSONSchemaProps> {
    match &s.items {
        Some(JSONSchemaPropsOrArray::Schema(item)) => Some(item),
        _ => None,
    }
}

fn properties(s: &JSONSchemaProps) -> impl Iterator<Item = (&String, &JSONSchemaProps)> {
    s.properties.iter().flatten()
}

fn property<'a>(s: &'a JSONSchemaProps, name: &str) -> Option<&'a JSONSchemaProps> {
    s.properties.as_ref().and_then(|p| p.get(name))
}

/// The schema with Go's zero values folded in, so `false`/`""` compare like unset.
fn normalized(s: &JSONSchemaProps) -> JSONSchemaProps {
    let mut s = s.clone();
    for b in [
        &mut s.exclusive_maximum,
        &mut s.exclusive_minimum,
        &mut s.nullable,
        &mut s.unique_items,
        &mut s.x_kubernetes_embedded_resource,
        &mut s.x_kubernetes_int_or_string,
    ] {
        if *b == Some(false) {
            *b = None;
        }
    }
    for text in [
        &mut s.description,
        &mut s.format,
        &mut s.pattern,
        &mut s.title,
        &mut s.type_,
        &mut s.id,
        &mut s.schema,
    ] {
        if text.as_deref() == Some("") {
            *text = None;
        }
    }
    s
}

fn is_only_type(s: &JSONSchemaProps, type_: &str) -> bool {
    normalized(s)
        == JSONSchemaProps {
            type_: Some(type_.to_string()),
            ..JSONSchemaProps::default()
        }
}

/// `anyOf: [{type: integer}, {type: string}]`, the spelling of int-or-string that is allowed.
fn is_int_or_string_any_of(any_of: &Option<Vec<JSONSchemaProps>>) -> bool {
    matches!(any_of.as_deref(), Some([i, s]) if is_only_type(i, "integer") && is_only_type(s, "string"))
}

fn is_int_or_string_all_of(s: &JSONSchemaProps) -> bool {
    s.all_of
        .as_deref()
        .and_then(<[JSONSchemaProps]>::first)
        .is_some_and(|first| is_int_or_string_any_of(&first.any_of))
}

/// Upstream `validateStructuralInvariants`.
fn invariants(s: &JSONSchemaProps, level: Level, path: &Path, errors: &mut Vec<FieldError>) {
    let type_ = str_of(&s.type_);
    let embedded = flag(s.x_kubernetes_embedded_resource);
    let preserve = flag(s.x_kubernetes_preserve_unknown_fields);
    let int_or_string = flag(s.x_kubernetes_int_or_string);
    if type_ == "array" && s.items.is_none() {
        errors.push(FieldError::required(
            &path.child("items"),
            "must be specified",
        ));
    }
    if let Some(items) = items_schema(s) {
        invariants(items, Level::Item, &path.child("items"), errors);
    }
    for (key, prop) in properties(s) {
        invariants(
            prop,
            Level::Field,
            &path.child("properties").key(key),
            errors,
        );
    }
    if let Some(additional) = &s.additional_properties {
        if level == Level::Root {
            errors.push(FieldError::forbidden(
                &path.child("additionalProperties"),
                "must not be used at the root",
            ));
        }
        if let JSONSchemaPropsOrBool::Schema(sub) = additional {
            invariants(
                sub,
                Level::Field,
                &path.child("additionalProperties"),
                errors,
            );
        }
    }
    if int_or_string && preserve {
        errors.push(FieldError::invalid(
            &path.child("x-kubernetes-preserve-unknown-fields"),
            true,
            "must be false if x-kubernetes-int-or-string is true",
        ));
    }
    if int_or_string && embedded {
        errors.push(FieldError::invalid(
            &path.child("x-kubernetes-embedded-resource"),
            true,
            "must be false if x-kubernetes-int-or-string is true",
        ));
    }
    let skip_any_of = is_int_or_string_any_of(&s.any_of);
    let skip_first_all_of_any_of = is_int_or_string_all_of(s);
    value_validation(s, skip_any_of, skip_first_all_of_any_of, path, errors);

    let check_metadata = level == Level::Root || embedded;
    if embedded && type_ != "object" {
        let detail = "must be object if x-kubernetes-embedded-resource is true";
        errors.push(if type_.is_empty() {
            FieldError::required(&path.child("type"), detail)
        } else {
            FieldError::invalid(&path.child("type"), type_, detail)
        });
    } else if type_.is_empty() && !int_or_string && !preserve {
        let detail = match level {
            Level::Root => "must not be empty at the root",
            Level::Item => "must not be empty for specified array items",
            Level::Field => "must not be empty for specified object fields",
        };
        errors.push(FieldError::required(&path.child("type"), detail));
    }
    if embedded && s.additional_properties.is_some() {
        errors.push(FieldError::forbidden(
            &path.child("additionalProperties"),
            "must not be used if x-kubernetes-embedded-resource is set",
        ));
    }
    if level == Level::Root && !type_.is_empty() && type_ != "object" {
        errors.push(FieldError::invalid(
            &path.child("type"),
            type_,
            "must be object at the root",
        ));
    }
    if check_metadata {
        for key in ["kind", "apiVersion"] {
            if let Some(prop) = property(s, key)
                && str_of(&prop.type_) != "string"
            {
                let field = path.child("properties").key(key).child("type");
                errors.push(FieldError::invalid(
                    &field,
                    str_of(&prop.type_),
                    "must be string",
                ));
            }
        }
    }
    if let Some(metadata) = property(s, "metadata") {
        let meta_path = path.child("properties").key("metadata");
        metadata_invariants(metadata, check_metadata, level, &meta_path, errors);
    }
    if embedded && !preserve && s.properties.as_ref().is_none_or(|p| p.is_empty()) {
        errors.push(FieldError::required(
            &path.child("properties"),
            "must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields",
        ));
    }
}

/// Upstream `validateStructuralMetadataInvariants`: at the root, `metadata` may only restrict
/// `name` and `generateName`.
fn metadata_invariants(
    s: &JSONSchemaProps,
    check_metadata: bool,
    level: Level,
    path: &Path,
    errors: &mut Vec<FieldError>,
) {
    if check_metadata && str_of(&s.type_) != "object" {
        errors.push(FieldError::invalid(
            &path.child("type"),
            str_of(&s.type_),
            "must be object",
        ));
    }
    if level != Level::Root {
        return;
    }
    let mut rest = normalized(s);
    let names_only = rest.properties.as_ref().is_some_and(|p| {
        !p.is_empty() && p.len() <= 2 && p.keys().all(|k| k == "name" || k == "generateName")
    });
    if names_only {
        rest.properties = None;
    }
    rest.type_ = None;
    rest.default = None;
    if rest != JSONSchemaProps::default() {
        errors.push(FieldError::forbidden(
            path,
            "must not specify anything other than name and generateName, but metadata is implicitly specified",
        ));
    }
}

/// Upstream `validateValueValidation`.
fn value_validation(
    s: &JSONSchemaProps,
    skip_any_of: bool,
    skip_first_all_of_any_of: bool,
    path: &Path,
    errors: &mut Vec<FieldError>,
) {
    if !skip_any_of {
        for (i, clause) in s.any_of.iter().flatten().enumerate() {
            nested(clause, false, false, &path.child("anyOf").index(i), errors);
        }
    }
    for (i, clause) in s.all_of.iter().flatten().enumerate() {
        let skip = skip_first_all_of_any_of && i == 0;
        nested(clause, skip, false, &path.child("allOf").index(i), errors);
    }
    for (i, clause) in s.one_of.iter().flatten().enumerate() {
        nested(clause, false, false, &path.child("oneOf").index(i), errors);
    }
    if let Some(not) = &s.not {
        nested(not, false, false, &path.child("not"), errors);
    }
    let pattern = str_of(&s.pattern);
    if !pattern.is_empty()
        && let Err(e) = goregex::compile(pattern)
    {
        errors.push(FieldError::invalid(
            &path.child("pattern"),
            pattern,
            format!("must be a valid regular expression, but isn't: {e}"),
        ));
    }
}

/// Upstream `validateNestedValueValidation`: under a logical junctor only value validations
/// are allowed.
fn nested(
    s: &JSONSchemaProps,
    skip_any_of: bool,
    skip_all_of_any_of: bool,
    path: &Path,
    errors: &mut Vec<FieldError>,
) {
    value_validation(s, skip_any_of, skip_all_of_any_of, path, errors);
    if let Some(items) = items_schema(s) {
        nested(items, false, false, &path.child("items"), errors);
    }
    for (key, prop) in properties(s) {
        nested(
            prop,
            false,
            false,
            &path.child("properties").key(key),
            errors,
        );
    }
    let forbid = |errors: &mut Vec<FieldError>, field: &str, detail: &str| {
        errors.push(FieldError::forbidden(&path.child(field), detail));
    };
    if !str_of(&s.type_).is_empty() {
        forbid(errors, "type", "must be empty to be structural");
    }
    // Upstream drops `additionalProperties: false` when converting nested schemas.
    if matches!(
        s.additional_properties,
        Some(JSONSchemaPropsOrBool::Schema(_) | JSONSchemaPropsOrBool::Bool(true))
    ) {
        forbid(
            errors,
            "additionalProperties",
            "must be undefined to be structural",
        );
    }
    if s.default.as_ref().is_some_and(|d| !d.0.is_null()) {
        forbid(errors, "default", "must be undefined to be structural");
    }
    if !str_of(&s.title).is_empty() {
        forbid(errors, "title", "must be empty to be structural");
    }
    if !str_of(&s.description).is_empty() {
        forbid(errors, "description", "must be empty to be structural");
    }
    if flag(s.nullable) {
        forbid(errors, "nullable", "must be false to be structural");
    }
    let extensions: [(&str, bool, &str); 6] = [
        (
            "x-kubernetes-preserve-unknown-fields",
            flag(s.x_kubernetes_preserve_unknown_fields),
            "must be false to be structural",
        ),
        (
            "x-kubernetes-embedded-resource",
            flag(s.x_kubernetes_embedded_resource),
            "must be false to be structural",
        ),
        (
            "x-kubernetes-int-or-string",
            flag(s.x_kubernetes_int_or_string),
            "must be false to be structural",
        ),
        (
            "x-kubernetes-list-map-keys",
            s.x_kubernetes_list_map_keys
                .as_ref()
                .is_some_and(|k| !k.is_empty()),
            "must be empty to be structural",
        ),
        (
            "x-kubernetes-list-type",
            s.x_kubernetes_list_type.is_some(),
            "must be undefined to be structural",
        ),
        (
            "x-kubernetes-map-type",
            s.x_kubernetes_map_type.is_some(),
            "must be undefined to be structural",
        ),
    ];
    for (field, set, detail) in extensions {
        if set {
            forbid(errors, field, detail);
        }
    }
    if s.x_kubernetes_validations
        .as_ref()
        .is_some_and(|v| !v.is_empty())
    {
        forbid(
            errors,
            "x-kubernetes-validations",
            "must be empty to be structural",
        );
    }
    if property(s, "metadata").is_some() {
        errors.push(FieldError::forbidden(
            &path.child("properties").key("metadata"),
            "must not be specified in a nested context",
        ));
    }
}

fn not_structurally_defined(s_path: &Path, v_path: &Path) -> FieldError {
    FieldError::required(s_path, format!("because it is defined in {v_path}"))
}

/// Upstream `validateStructuralCompleteness`: every property, item or additional property a
/// value validation talks about is also specified structurally. `v` carries the junctors,
/// `s` the structural node they apply to.
fn completeness(
    v: &JSONSchemaProps,
    s: &JSONSchemaProps,
    s_path: &Path,
    v_path: &Path,
    errors: &mut Vec<FieldError>,
) {
    if let Some(not) = &v.not {
        nested_completeness(not, Some(s), s_path, &v_path.child("not"), errors);
    }
    let junctors = [
        ("allOf", &v.all_of),
        ("anyOf", &v.any_of),
        ("oneOf", &v.one_of),
    ];
    for (name, clauses) in junctors {
        for (i, clause) in clauses.iter().flatten().enumerate() {
            let clause_path = v_path.child(name).index(i);
            nested_completeness(clause, Some(s), s_path, &clause_path, errors);
        }
    }
}

fn nested_completeness(
    v: &JSONSchemaProps,
    s: Option<&JSONSchemaProps>,
    s_path: &Path,
    v_path: &Path,
    errors: &mut Vec<FieldError>,
) {
    let Some(s) = s else {
        errors.push(not_structurally_defined(s_path, v_path));
        return;
    };
    completeness(v, s, s_path, v_path, errors);
    if let Some(items) = items_schema(v) {
        nested_completeness(
            items,
            items_schema(s),
            &s_path.child("items"),
            &v_path.child("items"),
            errors,
        );
    }
    for (key, v_prop) in properties(v) {
        let s_prop_path = s_path.child("properties").key(key);
        let v_prop_path = v_path.child("properties").key(key);
        match property(s, key) {
            Some(s_prop) => {
                nested_completeness(v_prop, Some(s_prop), &s_prop_path, &v_prop_path, errors)
            }
            None => errors.push(not_structurally_defined(&s_prop_path, &v_prop_path)),
        }
    }
}

/// A JSON rendering of a schema fragment for `Invalid value` messages that upstream prints as
/// a Go struct.
fn as_json<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests;
