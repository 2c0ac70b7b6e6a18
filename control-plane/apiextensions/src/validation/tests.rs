//! Tests of custom resource validation. The first table is upstream's
//! `TestValidateCustomResource` (apiextensions `pkg/apiserver/validation`), compared as sets
//! like upstream does.

use std::collections::BTreeSet;

use flotilla_api_machinery::field::Path;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;
use serde_json::{Value, json};

use super::{validate, validate_custom_resource};
use crate::structural::Structural;

fn structural(schema: Value) -> Structural {
    let props: JSONSchemaProps = serde_json::from_value(schema).expect("schema");
    Structural::new(&props).expect("structural")
}

fn errors_of(schema: &Structural, value: &Value) -> BTreeSet<String> {
    validate_custom_resource(&Path::none(), value, schema)
        .iter()
        .map(ToString::to_string)
        .collect()
}

struct Case {
    name: &'static str,
    schema: Value,
    valid: Vec<Value>,
    invalid: Vec<(Value, Vec<&'static str>)>,
}

fn field(schema: Value) -> Value {
    json!({"type": "object", "properties": {"field": schema}})
}

fn type_errors(types: &str, kinds: &[(&str, Value)]) -> Vec<(Value, Vec<String>)> {
    kinds
        .iter()
        .map(|(kind, value)| {
            let message = format!(
                "field: Invalid value: \"{kind}\": field in body must be of type {types}: \"{kind}\""
            );
            (json!({"field": value}), vec![message])
        })
        .collect()
}

fn run(case: &Case) {
    let schema = structural(case.schema.clone());
    for value in &case.valid {
        assert_eq!(
            errors_of(&schema, value),
            BTreeSet::new(),
            "{}: {value}",
            case.name
        );
    }
    for (value, want) in &case.invalid {
        let want: BTreeSet<String> = want.iter().map(ToString::to_string).collect();
        assert_eq!(errors_of(&schema, value), want, "{}: {value}", case.name);
    }
}

#[test]
fn type_checks_match_upstream() {
    let all_kinds = [
        ("string", json!("foo")),
        ("integer", json!(42)),
        ("boolean", json!(true)),
        ("number", json!(1.2)),
        ("array", json!([])),
        ("object", json!({})),
        ("null", json!(null)),
    ];
    let except = |skip: &[&str]| -> Vec<(&str, Value)> {
        all_kinds
            .iter()
            .filter(|(k, _)| !skip.contains(k))
            .cloned()
            .collect()
    };
    let cases = [
        (
            "!nullable",
            json!({"type": "object"}),
            "object",
            except(&["object"]),
        ),
        (
            "nullable",
            json!({"type": "object", "nullable": true}),
            "object",
            except(&["object", "null"]),
        ),
        (
            "int-or-string",
            json!({"x-kubernetes-int-or-string": true}),
            "integer,string",
            except(&["integer", "string"]),
        ),
        (
            "nullable int-or-string",
            json!({"x-kubernetes-int-or-string": true, "nullable": true}),
            "integer,string",
            except(&["integer", "string", "null"]),
        ),
    ];
    for (name, schema, types, failing) in cases {
        let schema = structural(field(schema));
        for (value, want) in type_errors(types, &failing) {
            let want: BTreeSet<String> = want.into_iter().collect();
            assert_eq!(errors_of(&schema, &value), want, "{name}: {value}");
        }
    }
    let untyped = structural(field(json!({"nullable": true})));
    for (_, value) in &all_kinds {
        assert!(errors_of(&untyped, &json!({"field": value})).is_empty());
    }
}

#[test]
fn value_checks_match_upstream() {
    let any_of = json!({"nullable": true, "x-kubernetes-int-or-string": true,
                        "anyOf": [{"type": "integer"}, {"type": "string"}]});
    let all_of = json!({"nullable": true, "x-kubernetes-int-or-string": true,
                        "allOf": [{"anyOf": [{"type": "integer"}, {"type": "string"}]}]});
    let cases = vec![
        Case {
            name: "int-or-string and anyOf",
            schema: field(any_of),
            valid: vec![
                json!({}),
                json!({"field": null}),
                json!({"field": 42}),
                json!({"field": "foo"}),
            ],
            invalid: vec![
                (
                    json!({"field": true}),
                    vec![
                        r#"<nil>: Invalid value: "": "field" must validate at least one schema (anyOf)"#,
                        r#"field: Invalid value: "boolean": field in body must be of type integer,string: "boolean""#,
                        r#"field: Invalid value: "boolean": field in body must be of type integer: "boolean""#,
                    ],
                ),
                (
                    json!({"field": 1.2}),
                    vec![
                        r#"<nil>: Invalid value: "": "field" must validate at least one schema (anyOf)"#,
                        r#"field: Invalid value: "number": field in body must be of type integer,string: "number""#,
                        r#"field: Invalid value: "number": field in body must be of type integer: "number""#,
                        r#"<nil>: Invalid value: "": Checked value must be of type integer (default format) in field"#,
                    ],
                ),
            ],
        },
        Case {
            name: "int-or-string and allOf",
            schema: field(all_of),
            valid: vec![
                json!({"field": null}),
                json!({"field": 42}),
                json!({"field": "foo"}),
            ],
            invalid: vec![(
                json!({"field": []}),
                vec![
                    r#"<nil>: Invalid value: "": "field" must validate all the schemas (allOf). None validated"#,
                    r#"<nil>: Invalid value: "": "field" must validate at least one schema (anyOf)"#,
                    r#"field: Invalid value: "array": field in body must be of type integer,string: "array""#,
                    r#"field: Invalid value: "array": field in body must be of type integer: "array""#,
                ],
            )],
        },
        Case {
            name: "invalid regex",
            schema: field(json!({"type": "string", "pattern": "+"})),
            valid: vec![],
            invalid: vec![(
                json!({"field": "foo"}),
                vec![
                    "field: Invalid value: \"foo\": field in body should match '+, but pattern is invalid: error parsing regexp: missing argument to repetition operator: `+`'",
                ],
            )],
        },
        Case {
            name: "required field",
            schema: json!({"type": "object", "required": ["field"], "properties": {
                "field": {"type": "object", "required": ["nested"], "properties": {"nested": {}}}}}),
            valid: vec![json!({"field": {"nested": 1}})],
            invalid: vec![
                (json!({"test": "a"}), vec!["field: Required value"]),
                (json!({"field": {}}), vec!["field.nested: Required value"]),
            ],
        },
        Case {
            name: "enum",
            schema: field(
                json!({"type": "object", "required": ["nestedint", "nestedstring"],
                "properties": {"nestedint": {"type": "integer", "enum": [1, 2]},
                               "nestedstring": {"type": "string", "enum": ["a", "b"]}}}),
            ),
            valid: vec![json!({"field": {"nestedint": 2, "nestedstring": "a"}})],
            invalid: vec![
                (
                    json!({"field": {}}),
                    vec![
                        "field.nestedint: Required value",
                        "field.nestedstring: Required value",
                    ],
                ),
                (
                    json!({"field": {"nestedint": "x", "nestedstring": true}}),
                    vec![
                        r#"field.nestedint: Invalid value: "string": field.nestedint in body must be of type integer: "string""#,
                        r#"field.nestedint: Unsupported value: "x": supported values: "1", "2""#,
                        r#"field.nestedstring: Invalid value: "boolean": field.nestedstring in body must be of type string: "boolean""#,
                        r#"field.nestedstring: Unsupported value: true: supported values: "a", "b""#,
                    ],
                ),
            ],
        },
        Case {
            name: "maxProperties, maxItems, maxLength",
            schema: json!({"type": "object", "properties": {
                "fieldX": {"type": "object", "maxProperties": 2},
                "fieldY": {"type": "array", "maxItems": 2},
                "fieldZ": {"type": "string", "maxLength": 2}}}),
            valid: vec![json!({"fieldX": {"a": 1}, "fieldY": [1, 2], "fieldZ": "ab"})],
            invalid: vec![(
                json!({"fieldX": {"a": true, "b": true, "c": true},
                                  "fieldY": ["a", "b", "c"], "fieldZ": "abc"}),
                vec![
                    "fieldX: Too many: 3: must have at most 2 items",
                    "fieldY: Too many: 3: must have at most 2 items",
                    "fieldZ: Too long: may not be more than 2 bytes",
                ],
            )],
        },
        Case {
            name: "numeric formats",
            schema: json!({"type": "object", "properties": {
                "intThirtyTwo": {"type": "integer", "format": "int32"},
                "intSixtyFour": {"type": "integer", "format": "int64"},
                "floatThreeTwo": {"type": "number", "format": "float"},
                "floatSixFour": {"type": "number", "format": "double"}}}),
            valid: vec![
                json!({"intThirtyTwo": i32::MIN, "intSixtyFour": i64::MIN,
                       "floatThreeTwo": -(f32::MAX as f64), "floatSixFour": -f64::MAX}),
                json!({"intThirtyTwo": i32::MAX, "intSixtyFour": i64::MAX,
                       "floatThreeTwo": f32::MAX as f64, "floatSixFour": f64::MAX}),
            ],
            invalid: vec![
                (
                    json!({"intThirtyTwo": i32::MAX as i64 + 1}),
                    vec![
                        r#"<nil>: Invalid value: "": Checked value must be of type integer with format int32 in intThirtyTwo"#,
                    ],
                ),
                (
                    json!({"intSixtyFour": i64::MAX as f64 * 1.1}),
                    vec![
                        r#"intSixtyFour: Invalid value: "float64": intSixtyFour in body must be of type int64: "float64""#,
                        r#"<nil>: Invalid value: "": Checked value must be of type integer with format int64 in intSixtyFour"#,
                    ],
                ),
                (
                    json!({"floatThreeTwo": f32::MAX as f64 * 1.1}),
                    vec![
                        r#"<nil>: Invalid value: "": Checked value must be of type number with format float in floatThreeTwo"#,
                    ],
                ),
            ],
        },
    ];
    for case in &cases {
        run(case);
    }
}

#[test]
fn renders_brief_examples() {
    let schema = structural(json!({"type": "object", "properties": {"spec": {
        "type": "object",
        "required": ["name"],
        "properties": {
            "replicas": {"type": "integer", "minimum": 1, "maximum": 10},
            "ratio": {"type": "number", "exclusiveMaximum": true, "maximum": 1.5, "multipleOf": 0.5},
            "kind": {"type": "string", "enum": ["A", "B"]},
            "name": {"type": "string"},
            "x": {"type": "string", "pattern": "^[a-z]+$", "minLength": 2},
            "items": {"type": "array", "maxItems": 3, "minItems": 1, "items": {"type": "string"}},
            "labels": {"type": "object", "additionalProperties": {"type": "string", "format": "date"}},
            "closed": {"type": "object", "additionalProperties": false},
            "unique": {"type": "array", "uniqueItems": true, "items": {"type": "integer"}},
            "even": {"type": "integer", "multipleOf": 2},
            "port": {"x-kubernetes-int-or-string": true},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "not": {"type": "string", "not": {"enum": ["forbidden"]}},
            "one": {"type": "integer", "oneOf": [{"minimum": 0}, {"maximum": 10}]}
        }
    }}}));
    let cases = [
        (
            json!({"spec": {"name": "n", "replicas": 3, "kind": "A", "x": "ab", "items": ["a"],
                         "labels": {"d": "2024-01-01"}, "port": "http", "free": {"any": [1]},
                         "not": "ok", "one": 20}}),
            vec![],
        ),
        (
            json!({"spec": {"name": "n", "replicas": "string"}}),
            vec![
                r#"spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string""#,
            ],
        ),
        (
            json!({"spec": {"name": "n", "kind": "Foo"}}),
            vec![r#"spec.kind: Unsupported value: "Foo": supported values: "A", "B""#],
        ),
        (json!({"spec": {}}), vec!["spec.name: Required value"]),
        (
            json!({"spec": {"name": "n", "x": "abc1"}}),
            vec![r#"spec.x: Invalid value: "abc1": spec.x in body should match '^[a-z]+$'"#],
        ),
        (
            json!({"spec": {"name": "n", "x": "a"}}),
            vec![r#"spec.x: Invalid value: "a": spec.x in body should be at least 2 chars long"#],
        ),
        (
            json!({"spec": {"name": "n", "items": ["a", "b", "c", "d", "e"]}}),
            vec!["spec.items: Too many: 5: must have at most 3 items"],
        ),
        (
            json!({"spec": {"name": "n", "items": [], "replicas": 0}}),
            vec![
                "spec.items: Invalid value: 0: spec.items in body should have at least 1 items",
                "spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1",
            ],
        ),
        (
            json!({"spec": {"name": "n", "replicas": 11, "ratio": 1.5, "even": 3}}),
            vec![
                "spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10",
                "spec.ratio: Invalid value: 1.5: spec.ratio in body should be less than 1.5",
                "spec.even: Invalid value: 3: spec.even in body should be a multiple of 2",
            ],
        ),
        (
            json!({"spec": {"name": "n", "labels": {"a": "soon", "b": 1}}}),
            vec![
                r#"spec.labels.a: Invalid value: "soon": spec.labels.a in body must be of type date: "soon""#,
                // A non-string with a string format fails on the format first, like upstream.
                r#"spec.labels.b: Invalid value: "int64": spec.labels.b in body must be of type date: "int64""#,
            ],
        ),
        (
            json!({"spec": {"name": "n", "closed": {"k": 1}}}),
            vec![
                r#"spec.closed: Invalid value: "k": spec.closed.k in body is a forbidden property"#,
            ],
        ),
        (
            json!({"spec": {"name": "n", "unique": [1, 2, 1]}}),
            vec![
                r#"spec.unique: Invalid value: "": spec.unique in body shouldn't contain duplicates"#,
            ],
        ),
        (
            json!({"spec": {"name": "n", "not": "forbidden"}}),
            vec![r#"<nil>: Invalid value: "": "spec.not" must not validate the schema (not)"#],
        ),
        (
            json!({"spec": {"name": "n", "one": 5}}),
            vec![
                r#"<nil>: Invalid value: "": "spec.one" must validate one and only one schema (oneOf). Found 2 valid alternatives"#,
            ],
        ),
        (
            json!({"spec": {"name": "n", "port": 1.5}}),
            vec![
                r#"spec.port: Invalid value: "number": spec.port in body must be of type integer,string: "number""#,
            ],
        ),
        (
            json!({"spec": null}),
            vec![r#"spec: Invalid value: "null": spec in body must be of type object: "null""#],
        ),
    ];
    for (value, want) in cases {
        let want: BTreeSet<String> = want.into_iter().map(ToString::to_string).collect();
        assert_eq!(errors_of(&schema, &value), want, "{value}");
    }
}

#[test]
fn enum_matching_follows_go_conversions() {
    let schema = structural(field(json!({"enum": [1, 2.5, "A", {"k": [1]}]})));
    let cases = [
        (json!(1), true),
        (json!(1.0), true),
        // Go truncates a float converted to an enum's integer type.
        (json!(1.7), true),
        (json!(2.5), true),
        (json!(65), true),
        (json!("a"), false),
        (json!({"k": [1]}), true),
        (json!({"k": [1.0]}), false),
        (json!(null), false),
    ];
    for (value, ok) in cases {
        assert_eq!(
            errors_of(&schema, &json!({"field": value})).is_empty(),
            ok,
            "{value}"
        );
    }
}

#[test]
fn validate_adds_embedded_and_list_checks() {
    let schema = structural(json!({"type": "object", "properties": {"spec": {
        "type": "object",
        "properties": {
            "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                         "x-kubernetes-preserve-unknown-fields": true},
            "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}}
        }
    }}}));
    let value = json!({"spec": {"template": {"kind": "Pod", "metadata": {"name": "a/b"}},
                                "tags": ["x", 5, "x"]}});
    let errors: Vec<String> = validate(&schema, &value)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        errors,
        vec![
            r#"spec.tags[1]: Invalid value: "integer": spec.tags[1] in body must be of type string: "integer""#,
            "spec.template.apiVersion: Required value",
            r#"spec.template.metadata.name: Invalid value: "a/b": may not contain '/'"#,
            r#"spec.tags[2]: Duplicate value: "x""#,
        ]
    );
}

#[test]
fn validates_status_under_its_path() {
    let schema =
        structural(json!({"type": "object", "properties": {"ready": {"type": "boolean"}}}));
    let errors = validate_custom_resource(&Path::new("status"), &json!({"ready": "yes"}), &schema);
    assert_eq!(
        errors[0].to_string(),
        r#"status.ready: Invalid value: "string": ready in body must be of type boolean: "string""#
    );
}
