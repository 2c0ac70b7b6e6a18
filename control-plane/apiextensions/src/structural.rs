//! Structural schemas (upstream `k8s.io/apiextensions-apiserver/pkg/apiserver/schema`
//! `structural.go` and `convert.go`): the compiled tree a CRD version's `openAPIV3Schema` turns
//! into, which validation, pruning and defaulting walk. [`validate_structural`] (in
//! `structural/validate.rs`) checks that a schema may be compiled at all.

mod validate;

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool, ValidationRule,
};
use regex::Regex;
use serde_json::Value;

pub use validate::validate_structural;

use crate::goregex;

/// A structural schema node (upstream `schema.Structural`).
///
/// The same type describes the value validations nested under `allOf`/`anyOf`/`oneOf`/`not`
/// (upstream `NestedValueValidation`): there only the fields that constrain values are
/// meaningful, and [`validate_structural`] rejects schemas that set the others.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Structural {
    /// `type`: `object`, `array`, `string`, `integer`, `number`, `boolean`, or empty when
    /// `x-kubernetes-int-or-string` or `x-kubernetes-preserve-unknown-fields` allow none.
    pub type_: String,
    /// `nullable`: whether `null` is a valid value (otherwise nulls are pruned or defaulted).
    pub nullable: bool,
    /// `default`, applied to absent (and non-nullable null) fields.
    pub default: Option<Value>,
    /// `properties`, sorted by name.
    pub properties: BTreeMap<String, Structural>,
    /// `items`.
    pub items: Option<Box<Structural>>,
    /// `additionalProperties`.
    pub additional_properties: Option<AdditionalProperties>,
    /// The Kubernetes vendor extensions.
    pub extensions: Extensions,
    /// `x-kubernetes-validations`, kept verbatim for the CEL layer.
    pub x_validations: Vec<ValidationRule>,
    /// Everything that constrains values without shaping the structure.
    pub value_validation: ValueValidation,
}

/// `additionalProperties`: a schema for every other key, or a plain allow/deny (upstream
/// `StructuralOrBool`).
#[derive(Debug, Clone, PartialEq)]
pub enum AdditionalProperties {
    /// `additionalProperties: true` or `false`.
    Bool(bool),
    /// `additionalProperties: {...}`.
    Schema(Box<Structural>),
}

impl AdditionalProperties {
    /// The schema for additional properties, if one is given (upstream
    /// `AdditionalProperties.Structural`).
    pub fn schema(&self) -> Option<&Structural> {
        match self {
            AdditionalProperties::Schema(s) => Some(s),
            AdditionalProperties::Bool(_) => None,
        }
    }
}

/// The Kubernetes OpenAPI vendor extensions (upstream `schema.Extensions`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Extensions {
    /// `x-kubernetes-preserve-unknown-fields: true`.
    pub preserve_unknown_fields: bool,
    /// `x-kubernetes-embedded-resource: true`: the value is an object with TypeMeta and
    /// ObjectMeta.
    pub embedded_resource: bool,
    /// `x-kubernetes-int-or-string: true`.
    pub int_or_string: bool,
    /// `x-kubernetes-list-type`: `atomic`, `set` or `map`.
    pub list_type: Option<String>,
    /// `x-kubernetes-list-map-keys`.
    pub list_map_keys: Vec<String>,
    /// `x-kubernetes-map-type`: `atomic` or `granular`.
    pub map_type: Option<String>,
}

/// The schema fields that constrain values but not the structure (upstream
/// `schema.ValueValidation`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ValueValidation {
    /// `format`, as written (unsupported formats are ignored when validating).
    pub format: String,
    /// `maximum`.
    pub maximum: Option<f64>,
    /// `exclusiveMaximum`.
    pub exclusive_maximum: bool,
    /// `minimum`.
    pub minimum: Option<f64>,
    /// `exclusiveMinimum`.
    pub exclusive_minimum: bool,
    /// `maxLength`, in characters.
    pub max_length: Option<i64>,
    /// `minLength`, in characters.
    pub min_length: Option<i64>,
    /// `pattern`, compiled once.
    pub pattern: Option<Pattern>,
    /// `maxItems`.
    pub max_items: Option<i64>,
    /// `minItems`.
    pub min_items: Option<i64>,
    /// `uniqueItems`.
    pub unique_items: bool,
    /// `multipleOf`.
    pub multiple_of: Option<f64>,
    /// `enum`.
    pub enum_: Vec<Value>,
    /// `maxProperties`.
    pub max_properties: Option<i64>,
    /// `minProperties`.
    pub min_properties: Option<i64>,
    /// `required`.
    pub required: Vec<String>,
    /// `allOf`.
    pub all_of: Vec<Structural>,
    /// `oneOf`.
    pub one_of: Vec<Structural>,
    /// `anyOf`.
    pub any_of: Vec<Structural>,
    /// `not`.
    pub not: Option<Box<Structural>>,
}

/// A `pattern` with its compiled form. A pattern that does not compile is kept with Go's
/// error text: [`validate_structural`] rejects it, and validation reports it like upstream.
#[derive(Debug, Clone)]
pub struct Pattern {
    source: String,
    compiled: Result<Regex, String>,
}

impl Pattern {
    /// Compiles a Go (RE2) regular expression.
    pub fn new(source: &str) -> Self {
        Pattern {
            source: source.to_string(),
            compiled: goregex::compile(source),
        }
    }

    /// The pattern as written in the schema.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The compiled expression, or Go's compile error.
    pub fn regex(&self) -> Result<&Regex, &str> {
        self.compiled.as_ref().map_err(String::as_str)
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

/// Why a schema cannot be turned into a [`Structural`] (upstream `NewStructural` errors).
/// A schema that passed [`validate_structural`] never fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StructuralError {
    /// `id`, `$schema`, `$ref`, `patternProperties`, `dependencies`, `additionalItems` or
    /// `definitions` is set.
    Unsupported {
        /// The JSON name of the field.
        field: &'static str,
    },
    /// `items` is a list of schemas.
    ItemsArray,
    /// `x-kubernetes-preserve-unknown-fields: false`.
    PreserveUnknownFieldsFalse,
    /// A default value could not be pruned (upstream `PruneDefaults`).
    PruneDefaults {
        /// Why.
        reason: String,
    },
}

impl fmt::Display for StructuralError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StructuralError::Unsupported { field } => {
                write!(f, "OpenAPIV3Schema '{field}' is not supported")
            }
            StructuralError::ItemsArray => {
                f.write_str("OpenAPIV3Schema 'items' must be a schema, but is an array")
            }
            StructuralError::PreserveUnknownFieldsFalse => f.write_str(
                "internal error: 'x-kubernetes-preserve-unknown-fields' must be true or undefined",
            ),
            StructuralError::PruneDefaults { reason } => {
                write!(f, "failed to prune default value: {reason}")
            }
        }
    }
}

impl std::error::Error for StructuralError {}

/// Go's zero-value view of an optional string.
pub(crate) fn str_of(s: &Option<String>) -> &str {
    s.as_deref().unwrap_or_default()
}

/// Go's zero-value view of an optional bool.
pub(crate) fn flag(b: Option<bool>) -> bool {
    b.unwrap_or(false)
}

/// Upstream `validateUnsupportedFields`: fields CRD validation forbids must be unset.
fn check_unsupported(s: &JSONSchemaProps) -> Result<(), StructuralError> {
    let unsupported = |field| Err(StructuralError::Unsupported { field });
    if !str_of(&s.id).is_empty() {
        return unsupported("id");
    }
    if !str_of(&s.schema).is_empty() {
        return unsupported("schema");
    }
    if !str_of(&s.ref_path).is_empty() {
        return unsupported("$ref");
    }
    if s.pattern_properties.as_ref().is_some_and(|m| !m.is_empty()) {
        return unsupported("patternProperties");
    }
    if s.dependencies.as_ref().is_some_and(|m| !m.is_empty()) {
        return unsupported("dependencies");
    }
    if s.additional_items.is_some() {
        return unsupported("additionalItems");
    }
    if s.definitions.as_ref().is_some_and(|m| !m.is_empty()) {
        return unsupported("definitions");
    }
    Ok(())
}

fn convert_all(list: &Option<Vec<JSONSchemaProps>>) -> Result<Vec<Structural>, StructuralError> {
    list.iter().flatten().map(Structural::new).collect()
}

impl Structural {
    /// Converts an OpenAPI v3 schema into a structural schema (upstream `NewStructural`).
    pub fn new(s: &JSONSchemaProps) -> Result<Structural, StructuralError> {
        check_unsupported(s)?;
        if s.x_kubernetes_preserve_unknown_fields == Some(false) {
            return Err(StructuralError::PreserveUnknownFieldsFalse);
        }
        let value_validation = ValueValidation {
            format: str_of(&s.format).to_string(),
            maximum: s.maximum,
            exclusive_maximum: flag(s.exclusive_maximum),
            minimum: s.minimum,
            exclusive_minimum: flag(s.exclusive_minimum),
            max_length: s.max_length,
            min_length: s.min_length,
            pattern: s
                .pattern
                .as_deref()
                .filter(|p| !p.is_empty())
                .map(Pattern::new),
            max_items: s.max_items,
            min_items: s.min_items,
            unique_items: flag(s.unique_items),
            multiple_of: s.multiple_of,
            enum_: s.enum_.iter().flatten().map(|j| j.0.clone()).collect(),
            max_properties: s.max_properties,
            min_properties: s.min_properties,
            required: s.required.clone().unwrap_or_default(),
            all_of: convert_all(&s.all_of)?,
            one_of: convert_all(&s.one_of)?,
            any_of: convert_all(&s.any_of)?,
            not: s
                .not
                .as_deref()
                .map(Structural::new)
                .transpose()?
                .map(Box::new),
        };
        let items = match &s.items {
            None => None,
            Some(JSONSchemaPropsOrArray::Schemas(list)) if !list.is_empty() => {
                return Err(StructuralError::ItemsArray);
            }
            Some(JSONSchemaPropsOrArray::Schemas(_)) => None,
            Some(JSONSchemaPropsOrArray::Schema(item)) => Some(Box::new(Structural::new(item)?)),
        };
        let properties = s
            .properties
            .iter()
            .flatten()
            .map(|(k, v)| Ok((k.clone(), Structural::new(v)?)))
            .collect::<Result<BTreeMap<_, _>, StructuralError>>()?;
        let additional_properties = match &s.additional_properties {
            None => None,
            Some(JSONSchemaPropsOrBool::Bool(allows)) => Some(AdditionalProperties::Bool(*allows)),
            Some(JSONSchemaPropsOrBool::Schema(schema)) => Some(AdditionalProperties::Schema(
                Box::new(Structural::new(schema)?),
            )),
        };
        Ok(Structural {
            type_: str_of(&s.type_).to_string(),
            nullable: flag(s.nullable),
            // `default: null` decodes to no default, as upstream's conversion drops it.
            default: s
                .default
                .as_ref()
                .map(|d| d.0.clone())
                .filter(|d| !d.is_null()),
            properties,
            items,
            additional_properties,
            extensions: Extensions {
                preserve_unknown_fields: flag(s.x_kubernetes_preserve_unknown_fields),
                embedded_resource: flag(s.x_kubernetes_embedded_resource),
                int_or_string: flag(s.x_kubernetes_int_or_string),
                list_type: s.x_kubernetes_list_type.clone(),
                list_map_keys: s.x_kubernetes_list_map_keys.clone().unwrap_or_default(),
                map_type: s.x_kubernetes_map_type.clone(),
            },
            x_validations: s.x_kubernetes_validations.clone().unwrap_or_default(),
            value_validation,
        })
    }

    /// The schema of the additional properties, if a schema is given.
    pub fn additional_properties_schema(&self) -> Option<&Structural> {
        self.additional_properties
            .as_ref()
            .and_then(AdditionalProperties::schema)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn props(value: Value) -> JSONSchemaProps {
        serde_json::from_value(value).expect("schema")
    }

    #[test]
    fn converts_a_schema() {
        let s = Structural::new(&props(json!({
            "type": "object",
            "required": ["spec"],
            "properties": {
                "spec": {
                    "type": "object",
                    "properties": {
                        "replicas": {"type": "integer", "default": 1, "minimum": 0},
                        "name": {"type": "string", "pattern": "^[a-z]+$"},
                        "ports": {
                            "type": "array",
                            "x-kubernetes-list-type": "map",
                            "x-kubernetes-list-map-keys": ["name"],
                            "items": {"type": "object", "properties": {"name": {"type": "string"}}}
                        },
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "port": {"x-kubernetes-int-or-string": true,
                                 "anyOf": [{"type": "integer"}, {"type": "string"}]},
                        "raw": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                                "x-kubernetes-validations": [{"rule": "self.size() > 0"}]}
                    }
                }
            }
        })))
        .expect("structural");
        assert_eq!(s.value_validation.required, vec!["spec"]);
        let spec = &s.properties["spec"];
        assert_eq!(spec.properties["replicas"].default, Some(json!(1)));
        assert_eq!(
            spec.properties["replicas"].value_validation.minimum,
            Some(0.0)
        );
        let pattern = spec.properties["name"].value_validation.pattern.as_ref();
        assert!(pattern.is_some_and(|p| p.regex().is_ok_and(|r| r.is_match("abc"))));
        assert_eq!(
            spec.properties["ports"].extensions.list_map_keys,
            vec!["name"]
        );
        assert_eq!(
            spec.properties["labels"]
                .additional_properties_schema()
                .map(|s| s.type_.as_str()),
            Some("string")
        );
        let port = &spec.properties["port"];
        assert!(port.extensions.int_or_string);
        assert_eq!(port.value_validation.any_of[1].type_, "string");
        let raw = &spec.properties["raw"];
        assert!(raw.extensions.preserve_unknown_fields);
        assert_eq!(raw.x_validations[0].rule, "self.size() > 0");
    }

    #[test]
    fn rejects_unsupported_fields() {
        let cases = [
            (
                json!({"type": "object", "id": "x"}),
                "OpenAPIV3Schema 'id' is not supported",
            ),
            (
                json!({"$ref": "#/x"}),
                "OpenAPIV3Schema '$ref' is not supported",
            ),
            (
                json!({"properties": {"a": {"additionalItems": false}}}),
                "OpenAPIV3Schema 'additionalItems' is not supported",
            ),
            (
                json!({"items": [{"type": "string"}]}),
                "OpenAPIV3Schema 'items' must be a schema, but is an array",
            ),
            (
                json!({"allOf": [{"x-kubernetes-preserve-unknown-fields": false}]}),
                "internal error: 'x-kubernetes-preserve-unknown-fields' must be true or undefined",
            ),
        ];
        for (schema, want) in cases {
            let err = Structural::new(&props(schema)).expect_err(want);
            assert_eq!(err.to_string(), want);
        }
    }

    #[test]
    fn keeps_bad_patterns_with_go_errors() {
        let s = Structural::new(&props(json!({"type": "string", "pattern": "[a"})))
            .expect("structural");
        let pattern = s.value_validation.pattern.as_ref().expect("pattern");
        assert_eq!(pattern.source(), "[a");
        assert_eq!(
            pattern.regex().err(),
            Some("error parsing regexp: missing closing ]: `[a`")
        );
    }
}
