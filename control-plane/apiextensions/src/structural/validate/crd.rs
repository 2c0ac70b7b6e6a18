//! The per-node schema checks of upstream `ValidateCustomResourceDefinitionOpenAPISchema`
//! (`apis/apiextensions/validation/validation.go`) for a new CRD: unsupported keywords,
//! defaults where they may not be, list and map types, and the static shape of
//! `x-kubernetes-validations` rules (compiling them is the CEL layer's job).

use flotilla_api_machinery::field::{FieldError, Path};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool, JSONSchemaPropsOrStringArray,
};
use serde_json::Value;

use super::{as_json, items_schema, properties, property};
use crate::structural::{flag, str_of};

const OPENAPI_V3_TYPES: [&str; 6] = ["array", "boolean", "integer", "number", "object", "string"];
const SUPPORTED_VALIDATION_REASONS: [&str; 4] = [
    "FieldValueDuplicate",
    "FieldValueForbidden",
    "FieldValueInvalid",
    "FieldValueRequired",
];
const META_FIELDS: [&str; 3] = ["metadata", "kind", "apiVersion"];

/// Upstream `specStandardValidatorV3`: what the position of a node forbids.
#[derive(Clone, Default)]
struct Context {
    /// Why defaults are forbidden here, if they are.
    forbidden_defaults: Option<String>,
    inside_resource_meta: bool,
}

impl Context {
    fn forbid_defaults(&self, reason: String) -> Context {
        Context {
            forbidden_defaults: Some(reason),
            ..self.clone()
        }
    }
}

pub(super) fn validate_openapi_schema(
    schema: &JSONSchemaProps,
    path: &Path,
    errors: &mut Vec<FieldError>,
) {
    validate_node(schema, path, &Context::default(), true, errors);
}

/// Upstream `specStandardValidatorV3.validate`.
fn standard(s: &JSONSchemaProps, path: &Path, ctx: &Context, errors: &mut Vec<FieldError>) {
    let type_ = str_of(&s.type_);
    if !type_.is_empty() && !OPENAPI_V3_TYPES.contains(&type_) {
        errors.push(FieldError::not_supported(
            &path.child("type"),
            type_,
            &OPENAPI_V3_TYPES,
        ));
    }
    if s.default.is_some()
        && let Some(reason) = &ctx.forbidden_defaults
    {
        errors.push(FieldError::forbidden(
            &path.child("default"),
            format!("must not be set {reason}"),
        ));
    }
    let forbid = |errors: &mut Vec<FieldError>, field: &str, detail: &str| {
        errors.push(FieldError::forbidden(&path.child(field), detail));
    };
    if !str_of(&s.id).is_empty() {
        forbid(errors, "id", "id is not supported");
    }
    if s.additional_items.is_some() {
        forbid(
            errors,
            "additionalItems",
            "additionalItems is not supported",
        );
    }
    if s.pattern_properties.as_ref().is_some_and(|p| !p.is_empty()) {
        forbid(
            errors,
            "patternProperties",
            "patternProperties is not supported",
        );
    }
    if s.definitions.as_ref().is_some_and(|d| !d.is_empty()) {
        forbid(errors, "definitions", "definitions is not supported");
    }
    if s.dependencies.is_some() {
        forbid(errors, "dependencies", "dependencies is not supported");
    }
    if s.ref_path.is_some() {
        forbid(errors, "$ref", "$ref is not supported");
    }
    if type_ == "null" {
        forbid(
            errors,
            "type",
            "type cannot be set to null, use nullable as an alternative",
        );
    }
    if matches!(&s.items, Some(JSONSchemaPropsOrArray::Schemas(list)) if !list.is_empty()) {
        forbid(
            errors,
            "items",
            "items must be a schema object and not an array",
        );
    }
    if ctx.inside_resource_meta && flag(s.x_kubernetes_embedded_resource) {
        forbid(
            errors,
            "x-kubernetes-embedded-resource",
            "must not be used inside of resource meta",
        );
    }
}

fn validate_node(
    s: &JSONSchemaProps,
    path: &Path,
    ctx: &Context,
    is_root: bool,
    errors: &mut Vec<FieldError>,
) {
    standard(s, path, ctx, errors);
    if flag(s.unique_items) {
        errors.push(FieldError::forbidden(
            &path.child("uniqueItems"),
            "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
        ));
    }
    let has_properties = s.properties.as_ref().is_some_and(|p| !p.is_empty());
    if let Some(additional) = &s.additional_properties {
        // `properties` describe structs, `additionalProperties` maps; only `true` is
        // harmless next to properties.
        if has_properties && !matches!(additional, JSONSchemaPropsOrBool::Bool(true)) {
            errors.push(FieldError::forbidden(
                &path.child("additionalProperties"),
                "additionalProperties and properties are mutual exclusive",
            ));
        }
        if let JSONSchemaPropsOrBool::Schema(sub) = additional {
            // Pruning a map entry without an actual value is ambiguous, so metadata maps get
            // no defaults.
            let sub_ctx = if ctx.inside_resource_meta {
                ctx.forbid_defaults(
                    "inside additionalProperties applying to object metadata".into(),
                )
            } else {
                ctx.clone()
            };
            validate_node(
                sub,
                &path.child("additionalProperties"),
                &sub_ctx,
                false,
                errors,
            );
        }
    }
    for (key, prop) in properties(s) {
        let mut sub_ctx = ctx.clone();
        if (is_root || flag(s.x_kubernetes_embedded_resource))
            && META_FIELDS.contains(&key.as_str())
        {
            sub_ctx.inside_resource_meta = true;
            if is_root {
                sub_ctx = sub_ctx.forbid_defaults(format!("in top-level {key}"));
            }
        }
        validate_node(
            prop,
            &path.child("properties").key(key),
            &sub_ctx,
            false,
            errors,
        );
    }
    if let Some(not) = &s.not {
        validate_node(not, &path.child("not"), ctx, false, errors);
    }
    let junctors = [
        ("allOf", &s.all_of),
        ("oneOf", &s.one_of),
        ("anyOf", &s.any_of),
    ];
    for (name, clauses) in junctors {
        for (i, clause) in clauses.iter().flatten().enumerate() {
            validate_node(clause, &path.child(name).index(i), ctx, false, errors);
        }
    }
    for (key, definition) in s.definitions.iter().flatten() {
        validate_node(
            definition,
            &path.child("definitions").key(key),
            ctx,
            false,
            errors,
        );
    }
    match &s.items {
        Some(JSONSchemaPropsOrArray::Schema(item)) => {
            validate_node(item, &path.child("items"), ctx, false, errors);
        }
        Some(JSONSchemaPropsOrArray::Schemas(list)) => {
            for (i, item) in list.iter().enumerate() {
                validate_node(item, &path.child("items").index(i), ctx, false, errors);
            }
        }
        None => {}
    }
    for (key, dependency) in s.dependencies.iter().flatten() {
        if let JSONSchemaPropsOrStringArray::Schema(sub) = dependency {
            validate_node(
                sub,
                &path.child("dependencies").key(key),
                ctx,
                false,
                errors,
            );
        }
    }
    if s.x_kubernetes_preserve_unknown_fields == Some(false) {
        errors.push(FieldError::invalid(
            &path.child("x-kubernetes-preserve-unknown-fields"),
            false,
            "must be true or undefined",
        ));
    }
    list_and_map_types(s, path, errors);
    validation_rules(s, path, errors);
}

fn require_type(
    s: &JSONSchemaProps,
    path: &Path,
    want: &str,
    detail: &str,
    errors: &mut Vec<FieldError>,
) {
    let type_ = str_of(&s.type_);
    if type_ != want {
        errors.push(if type_.is_empty() {
            FieldError::required(&path.child("type"), detail)
        } else {
            FieldError::invalid(&path.child("type"), type_, detail)
        });
    }
}

fn string_list(items: &[String]) -> Value {
    Value::Array(items.iter().cloned().map(Value::String).collect())
}

/// The `x-kubernetes-map-type`, `x-kubernetes-list-type` and `x-kubernetes-list-map-keys`
/// rules, including `validateMapListKeysMapSet`.
fn list_and_map_types(s: &JSONSchemaProps, path: &Path, errors: &mut Vec<FieldError>) {
    if let Some(map_type) = &s.x_kubernetes_map_type {
        require_type(
            s,
            path,
            "object",
            "must be object if x-kubernetes-map-type is specified",
            errors,
        );
        if map_type != "atomic" && map_type != "granular" {
            errors.push(FieldError::not_supported(
                &path.child("x-kubernetes-map-type"),
                map_type.as_str(),
                &["atomic", "granular"],
            ));
        }
    }
    let list_type = s.x_kubernetes_list_type.as_deref();
    let items = items_schema(s);
    if list_type.is_some() && str_of(&s.type_) != "array" {
        require_type(
            s,
            path,
            "array",
            "must be array if x-kubernetes-list-type is specified",
            errors,
        );
    } else if let (Some("set"), Some(item)) = (list_type, items) {
        let detail = "must be atomic as item of a list with x-kubernetes-list-type=set";
        match str_of(&item.type_) {
            "array"
                if item
                    .x_kubernetes_list_type
                    .as_deref()
                    .is_some_and(|t| t != "atomic") =>
            {
                errors.push(FieldError::invalid(
                    &path.child("items").child("x-kubernetes-list-type"),
                    str_of(&item.x_kubernetes_list_type),
                    detail,
                ));
            }
            "object" if item.x_kubernetes_map_type.as_deref() != Some("atomic") => {
                // Upstream reports the item's list type here.
                let shown = item
                    .x_kubernetes_list_type
                    .clone()
                    .map_or(Value::Null, Value::String);
                errors.push(FieldError::invalid(
                    &path.child("items").child("x-kubernetes-map-type"),
                    shown,
                    detail,
                ));
            }
            _ => {}
        }
    }
    if let Some(list_type) = list_type
        && !["atomic", "set", "map"].contains(&list_type)
    {
        errors.push(FieldError::not_supported(
            &path.child("x-kubernetes-list-type"),
            list_type,
            &["atomic", "set", "map"],
        ));
    }
    let keys = s.x_kubernetes_list_map_keys.as_deref().unwrap_or_default();
    if !keys.is_empty() {
        let detail = "must be map if x-kubernetes-list-map-keys is non-empty";
        match list_type {
            None => errors.push(FieldError::required(
                &path.child("x-kubernetes-list-type"),
                detail,
            )),
            Some("map") => {}
            Some(other) => {
                errors.push(FieldError::invalid(
                    &path.child("x-kubernetes-list-type"),
                    other,
                    detail,
                ));
            }
        }
    }
    if list_type == Some("map") {
        if keys.is_empty() {
            errors.push(FieldError::required(
                &path.child("x-kubernetes-list-map-keys"),
                "must not be empty if x-kubernetes-list-type is map",
            ));
        }
        match &s.items {
            None => errors.push(FieldError::required(
                &path.child("items"),
                "must have a schema if x-kubernetes-list-type is map",
            )),
            Some(JSONSchemaPropsOrArray::Schemas(_)) => errors.push(FieldError::invalid(
                &path.child("items"),
                as_json(&s.items),
                "must only have a single schema if x-kubernetes-list-type is map",
            )),
            Some(JSONSchemaPropsOrArray::Schema(item)) => map_list_keys(item, keys, path, errors),
        }
    }
    map_list_keys_map_set(s, path, errors);
}

fn map_list_keys(
    item: &JSONSchemaProps,
    keys: &[String],
    path: &Path,
    errors: &mut Vec<FieldError>,
) {
    let item_type = str_of(&item.type_);
    if item_type != "object" {
        errors.push(FieldError::invalid(
            &path.child("items").child("type"),
            item_type,
            "must be object if parent array's x-kubernetes-list-type is map",
        ));
        return;
    }
    for (i, key) in keys.iter().enumerate() {
        match property(item, key) {
            Some(prop) if matches!(str_of(&prop.type_), "array" | "object") => {
                // Upstream shows the item's type, not the key's.
                errors.push(FieldError::invalid(
                    &path
                        .child("items")
                        .child("properties")
                        .key(key)
                        .child("type"),
                    item_type,
                    "must be a scalar type if parent array's x-kubernetes-list-type is map",
                ));
            }
            Some(_) => {}
            None => errors.push(FieldError::invalid(
                &path.child("x-kubernetes-list-map-keys"),
                string_list(keys),
                "entries must all be names of item properties",
            )),
        }
        if keys[..i].contains(key) {
            errors.push(FieldError::invalid(
                &path.child("x-kubernetes-list-map-keys"),
                string_list(keys),
                "must not contain duplicate entries",
            ));
        }
    }
}

/// Upstream `validateMapListKeysMapSet`: set and map items are not nullable, and map keys are
/// required or defaulted.
fn map_list_keys_map_set(s: &JSONSchemaProps, path: &Path, errors: &mut Vec<FieldError>) {
    let (Some(item), Some(list_type)) = (items_schema(s), s.x_kubernetes_list_type.as_deref())
    else {
        return;
    };
    if list_type != "set" && list_type != "map" {
        return;
    }
    if flag(item.nullable) {
        errors.push(FieldError::forbidden(
            &path.child("items").child("nullable"),
            format!("cannot be nullable when x-kubernetes-list-type is {list_type}"),
        ));
    }
    if list_type != "map" {
        return;
    }
    let required = item.required.as_deref().unwrap_or_default();
    for key in s.x_kubernetes_list_map_keys.iter().flatten() {
        let Some(prop) = property(item, key) else {
            continue;
        };
        let prop_path = path.child("items").child("properties").key(key);
        if !required.contains(key) && prop.default.is_none() {
            errors.push(FieldError::required(
                &prop_path.child("default"),
                "this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property",
            ));
        }
        if flag(prop.nullable) {
            errors.push(FieldError::forbidden(
                &prop_path.child("nullable"),
                "this property is in x-kubernetes-list-map-keys, so it cannot be nullable",
            ));
        }
    }
}

fn has_newlines(s: &str) -> bool {
    s.contains(['\n', '\r'])
}

/// The static checks of `x-kubernetes-validations` rules.
fn validation_rules(s: &JSONSchemaProps, path: &Path, errors: &mut Vec<FieldError>) {
    for (i, rule) in s.x_kubernetes_validations.iter().flatten().enumerate() {
        let rule_path = path.child("x-kubernetes-validations").index(i);
        let message = rule.message.as_deref().unwrap_or_default();
        let trimmed_rule = rule.rule.trim();
        let trimmed_message = message.trim();
        if trimmed_rule.is_empty() {
            errors.push(FieldError::required(
                &rule_path.child("rule"),
                "rule is not specified",
            ));
        } else if !message.is_empty() && trimmed_message.is_empty() {
            errors.push(FieldError::invalid(
                &rule_path.child("message"),
                message,
                "must be non-empty if specified",
            ));
        } else if has_newlines(trimmed_message) {
            errors.push(FieldError::invalid(
                &rule_path.child("message"),
                message,
                "must not contain line breaks",
            ));
        } else if has_newlines(trimmed_rule) && trimmed_message.is_empty() {
            errors.push(FieldError::required(
                &rule_path.child("message"),
                "message must be specified if rule contains line breaks",
            ));
        }
        let message_expression = rule.message_expression.as_deref().unwrap_or_default();
        if !message_expression.is_empty() && message_expression.trim().is_empty() {
            errors.push(FieldError::required(
                &rule_path.child("messageExpression"),
                "messageExpression must be non-empty if specified",
            ));
        }
        if let Some(reason) = &rule.reason
            && !SUPPORTED_VALIDATION_REASONS.contains(&reason.as_str())
        {
            errors.push(FieldError::not_supported(
                &rule_path.child("reason"),
                reason.as_str(),
                &SUPPORTED_VALIDATION_REASONS,
            ));
        }
        let field_path = rule.field_path.as_deref().unwrap_or_default();
        if !field_path.is_empty() && field_path.trim().is_empty() {
            errors.push(FieldError::invalid(
                &rule_path.child("fieldPath"),
                field_path,
                "must be non-empty if specified",
            ));
        }
        if has_newlines(field_path) {
            errors.push(FieldError::invalid(
                &rule_path.child("fieldPath"),
                field_path,
                "must not contain line breaks",
            ));
        }
    }
}
