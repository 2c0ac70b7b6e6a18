//! Tests of schema validation, with upstream's messages.

use flotilla_api_machinery::field::Path;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;
use serde_json::{Value, json};

use super::validate_structural;

fn errors(schema: Value) -> Vec<String> {
    let props: JSONSchemaProps = serde_json::from_value(schema).expect("schema");
    validate_structural(&props, &Path::new("schema"))
        .iter()
        .map(ToString::to_string)
        .collect()
}

fn object(properties: Value) -> Value {
    json!({"type": "object", "properties": properties})
}

#[test]
fn accepts_structural_schemas() {
    let cases = [
        json!({"type": "object"}),
        object(json!({
            "metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}}},
            "spec": {"type": "object", "properties": {
                "port": {"x-kubernetes-int-or-string": true,
                         "anyOf": [{"type": "integer"}, {"type": "string"}]},
                "wrapped": {"x-kubernetes-int-or-string": true,
                            "allOf": [{"anyOf": [{"type": "integer"}, {"type": "string"}]},
                                      {"pattern": "^[0-9]+%?$"}]},
                "free": {"x-kubernetes-preserve-unknown-fields": true},
                "choice": {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                           "oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
                "ports": {"type": "array", "x-kubernetes-list-type": "map",
                          "x-kubernetes-list-map-keys": ["name", "protocol"],
                          "items": {"type": "object", "required": ["name"], "properties": {
                              "name": {"type": "string"},
                              "protocol": {"type": "string", "default": "TCP"}}}},
                "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                             "x-kubernetes-preserve-unknown-fields": true},
                "replicas": {"type": "integer", "default": 1, "minimum": 0},
                "labels": {"type": "object", "additionalProperties": {"type": "string"},
                           "x-kubernetes-map-type": "atomic"},
                "rules": {"type": "string",
                          "x-kubernetes-validations": [{"rule": "self != ''", "reason": "FieldValueInvalid"}]}
            }}
        })),
    ];
    for schema in cases {
        assert_eq!(errors(schema.clone()), Vec::<String>::new(), "{schema}");
    }
}

#[test]
fn reports_structural_problems() {
    let cases = [
        (
            json!({}),
            vec!["schema.type: Required value: must not be empty at the root"],
        ),
        (
            json!({"type": "array", "items": {}}),
            vec![
                "schema.items.type: Required value: must not be empty for specified array items",
                r#"schema.type: Invalid value: "array": must be object at the root"#,
            ],
        ),
        (
            object(json!({"a": {}, "b": {"type": "array"}})),
            vec![
                "schema.properties[a].type: Required value: must not be empty for specified object fields",
                "schema.properties[b].items: Required value: must be specified",
            ],
        ),
        (
            json!({"type": "object", "nullable": true}),
            vec!["schema.nullable: Forbidden: nullable cannot be true at the root"],
        ),
        (
            json!({"type": "object", "additionalProperties": {"type": "string"}}),
            vec!["schema.additionalProperties: Forbidden: must not be used at the root"],
        ),
        (
            object(
                json!({"metadata": {"type": "object", "properties": {"labels": {"type": "object"}}}}),
            ),
            vec![
                "schema.properties[metadata]: Forbidden: must not specify anything other than name and generateName, but metadata is implicitly specified",
            ],
        ),
        (
            object(json!({"kind": {"type": "integer"}})),
            vec![r#"schema.properties[kind].type: Invalid value: "integer": must be string"#],
        ),
        (
            object(json!({"e": {"x-kubernetes-embedded-resource": true}})),
            vec![
                "schema.properties[e].properties: Required value: must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields",
                "schema.properties[e].type: Required value: must be object if x-kubernetes-embedded-resource is true",
            ],
        ),
        (
            object(
                json!({"a": {"type": "object", "properties": {"x": {"type": "string"}},
                                "anyOf": [{"type": "object", "description": "d", "nullable": true,
                                           "properties": {"y": {"minimum": 1}, "metadata": {}}}]}}),
            ),
            vec![
                "schema.properties[a].anyOf[0].description: Forbidden: must be empty to be structural",
                "schema.properties[a].anyOf[0].nullable: Forbidden: must be false to be structural",
                "schema.properties[a].anyOf[0].properties[metadata]: Forbidden: must not be specified in a nested context",
                "schema.properties[a].anyOf[0].type: Forbidden: must be empty to be structural",
            ],
        ),
        (
            // Only the root's junctors are checked for completeness, like upstream.
            json!({"type": "object", "properties": {"a": {"type": "string"}},
                   "anyOf": [{"properties": {"a": {"minLength": 1}, "b": {"minimum": 1}}}]}),
            vec![
                "schema.properties[b]: Required value: because it is defined in schema.anyOf[0].properties[b]",
            ],
        ),
        (
            object(json!({"s": {"type": "string", "pattern": "[a"}})),
            vec![
                "schema.properties[s].pattern: Invalid value: \"[a\": must be a valid regular expression, but isn't: error parsing regexp: missing closing ]: `[a`",
            ],
        ),
        (
            object(
                json!({"p": {"x-kubernetes-int-or-string": true, "x-kubernetes-preserve-unknown-fields": true}}),
            ),
            vec![
                "schema.properties[p].x-kubernetes-preserve-unknown-fields: Invalid value: true: must be false if x-kubernetes-int-or-string is true",
            ],
        ),
    ];
    for (schema, want) in cases {
        assert_eq!(errors(schema.clone()), want, "{schema}");
    }
}

#[test]
fn reports_crd_schema_problems() {
    let cases = [
        (
            object(json!({"a": {"type": "string", "$ref": "#/x"}})),
            vec!["schema.properties[a].$ref: Forbidden: $ref is not supported"],
        ),
        (
            object(json!({"a": {"type": "bogus"}})),
            vec![
                r#"schema.properties[a].type: Unsupported value: "bogus": supported values: "array", "boolean", "integer", "number", "object", "string""#,
            ],
        ),
        (
            object(
                json!({"a": {"type": "array", "uniqueItems": true, "items": {"type": "string"}}}),
            ),
            vec![
                "schema.properties[a].uniqueItems: Forbidden: uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
            ],
        ),
        (
            object(
                json!({"a": {"type": "object", "properties": {"x": {"type": "string"}},
                                "additionalProperties": {"type": "string"}}}),
            ),
            vec![
                "schema.properties[a].additionalProperties: Forbidden: additionalProperties and properties are mutual exclusive",
            ],
        ),
        (
            object(json!({"metadata": {"type": "object", "default": {}}})),
            vec![
                "schema.properties[metadata].default: Forbidden: must not be set in top-level metadata",
            ],
        ),
        (
            object(
                json!({"a": {"type": "array", "x-kubernetes-list-type": "map",
                                "items": {"type": "object", "properties": {"k": {"type": "string"}}}}}),
            ),
            vec![
                "schema.properties[a].x-kubernetes-list-map-keys: Required value: must not be empty if x-kubernetes-list-type is map",
            ],
        ),
        (
            object(
                json!({"a": {"type": "array", "x-kubernetes-list-type": "map",
                                "x-kubernetes-list-map-keys": ["k", "missing"],
                                "items": {"type": "object", "properties": {"k": {"type": "string"}}}}}),
            ),
            vec![
                r#"schema.properties[a].x-kubernetes-list-map-keys: Invalid value: []string{"k", "missing"}: entries must all be names of item properties"#,
                "schema.properties[a].items.properties[k].default: Required value: this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property",
            ],
        ),
        (
            object(
                json!({"a": {"type": "array", "x-kubernetes-list-type": "set",
                                "items": {"type": "object"}}}),
            ),
            vec![
                "schema.properties[a].items.x-kubernetes-map-type: Invalid value: null: must be atomic as item of a list with x-kubernetes-list-type=set",
            ],
        ),
        (
            object(json!({"a": {"type": "string", "x-kubernetes-list-type": "set"}})),
            vec![
                r#"schema.properties[a].type: Invalid value: "string": must be array if x-kubernetes-list-type is specified"#,
            ],
        ),
        (
            object(json!({"a": {"type": "object", "x-kubernetes-map-type": "weird"}})),
            vec![
                r#"schema.properties[a].x-kubernetes-map-type: Unsupported value: "weird": supported values: "atomic", "granular""#,
            ],
        ),
        (
            object(json!({"a": {"type": "string", "x-kubernetes-validations": [
                {"rule": " "}, {"rule": "a\nb"}, {"rule": "x", "reason": "Nope", "messageExpression": " "}]}})),
            vec![
                "schema.properties[a].x-kubernetes-validations[0].rule: Required value: rule is not specified",
                "schema.properties[a].x-kubernetes-validations[1].message: Required value: message must be specified if rule contains line breaks",
                "schema.properties[a].x-kubernetes-validations[2].messageExpression: Required value: messageExpression must be non-empty if specified",
                r#"schema.properties[a].x-kubernetes-validations[2].reason: Unsupported value: "Nope": supported values: "FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired""#,
            ],
        ),
        (
            object(json!({"a": {"type": "string", "x-kubernetes-preserve-unknown-fields": false}})),
            vec![
                "schema.properties[a].x-kubernetes-preserve-unknown-fields: Invalid value: false: must be true or undefined",
            ],
        ),
        (
            object(json!({"a": {"type": "array", "items": [{"type": "string"}]}})),
            vec![
                "schema.properties[a].items: Forbidden: items must be a schema object and not an array",
            ],
        ),
    ];
    for (schema, want) in cases {
        assert_eq!(errors(schema.clone()), want, "{schema}");
    }
}

#[test]
fn reports_bad_defaults() {
    let cases = [
        (
            object(json!({"spec": {"type": "object", "properties": {
                "replicas": {"type": "integer", "default": "one"}}}})),
            vec![
                r#"schema.properties[spec].properties[replicas].default: Invalid value: "string":  in body must be of type integer: "string""#,
            ],
        ),
        (
            object(json!({"spec": {"type": "object", "default": {"x": 1},
                                   "properties": {"y": {"type": "integer"}}}})),
            vec![
                r#"schema.properties[spec].default: Invalid value: {"x":1}: must not have unknown fields"#,
            ],
        ),
        (
            object(json!({"spec": {"type": "object", "properties": {
                "t": {"type": "object", "x-kubernetes-embedded-resource": true,
                      "x-kubernetes-preserve-unknown-fields": true,
                      "properties": {"metadata": {"type": "object", "properties": {
                          "name": {"type": "string", "default": "a/b"}}}}}}}})),
            vec![
                r#"schema.properties[spec].properties[t].properties[metadata].properties[name].default: Invalid value: "a/b": must result in valid metadata: metadata.name: Invalid value: "a/b": may not contain '/'"#,
            ],
        ),
    ];
    for (schema, want) in cases {
        assert_eq!(errors(schema.clone()), want, "{schema}");
    }
}
