//! The checks a CRD write runs (upstream `validation_test.go` of `apis/apiextensions` and
//! `compilation_test.go`): compile errors with their paths, `oldSelf` placement and the
//! estimated cost tables.

use serde_json::{Value, json};

use super::{messages, props, spec_schema};
use crate::*;

fn compile_errors(schema: &JSONSchemaProps) -> Vec<String> {
    match Validator::compile(schema) {
        Ok(_) => Vec::new(),
        Err(errors) => messages(&errors),
    }
}

#[test]
fn crd_writes_report_compile_errors_like_upstream() {
    let fields = json!({
        "replicas": {"type": "integer"},
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
    });
    let at = "spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0]";
    let cases: Vec<(Value, String)> = vec![
        (
            json!({"rule": "self.replicas =="}),
            format!(
                "{at}.rule: Invalid value: apiextensions.ValidationRule{{Rule:\"self.replicas ==\", Message:\"\", MessageExpression:\"\", Reason:(*apiextensions.FieldValueErrorReason)(nil), FieldPath:\"\", OptionalOldSelf:(*bool)(nil)}}: compilation failed: ERROR: <input>:1:17: Syntax error: mismatched input '<EOF>'"
            ),
        ),
        (
            json!({"rule": "self.nope == 1"}),
            "compilation failed: ERROR: <input>:1:5: undefined field 'nope'".to_string(),
        ),
        (
            json!({"rule": "self.replicas + 1"}),
            "cel expression must evaluate to a bool".to_string(),
        ),
        (
            json!({"rule": "self.replicas == 'a'"}),
            "found no matching overload for '_==_' applied to '(int, string)'".to_string(),
        ),
        (
            json!({"rule": "nope.x == 1"}),
            "undeclared reference to 'nope' (in container '')".to_string(),
        ),
        (
            json!({"rule": "self.name.reverse() == 'x'"}),
            "undeclared reference to 'reverse' (in container '')".to_string(),
        ),
        (
            json!({"rule": "self.name.matches(')')"}),
            "invalid matches argument".to_string(),
        ),
        (
            json!({"rule": "duration('1d') > duration('1h')"}),
            "invalid duration argument".to_string(),
        ),
        (
            json!({"rule": "[1, 'a'].size() == 2"}),
            "expected type 'int' but found 'string'".to_string(),
        ),
        (
            json!({"rule": "self.all(k, k == 'x')"}),
            "cannot be the range of a comprehension".to_string(),
        ),
        (
            json!({"rule": "self.replicas > 0", "optionalOldSelf": true}),
            format!(
                "{at}.optionalOldSelf: Invalid value: true: may not be set if oldSelf is not used in rule"
            ),
        ),
        (
            json!({"rule": "self.replicas > 0", "reason": "Nope"}),
            format!(
                "{at}.reason: Unsupported value: \"Nope\": supported values: \"FieldValueDuplicate\", \"FieldValueForbidden\", \"FieldValueInvalid\", \"FieldValueRequired\""
            ),
        ),
        (
            json!({"rule": "self.replicas > 0", "fieldPath": ".nope"}),
            format!("{at}.fieldPath: Invalid value: \".nope\": fieldPath must be a valid path"),
        ),
        (
            json!({"rule": " "}),
            format!("{at}.rule: Required value: rule is not specified"),
        ),
        (
            json!({"rule": "self.replicas > 0", "messageExpression": "1"}),
            format!(
                "{at}.messageExpression: Invalid value: apiextensions.ValidationRule{{Rule:\"self.replicas > 0\", Message:\"\", MessageExpression:\"1\", Reason:(*apiextensions.FieldValueErrorReason)(nil), FieldPath:\"\", OptionalOldSelf:(*bool)(nil)}}: messageExpression must evaluate to a string"
            ),
        ),
    ];
    for (rule, want) in cases {
        let got = compile_errors(&spec_schema(fields.clone(), json!([rule.clone()])));
        assert!(got.len() == 1 && got[0].contains(&want), "{rule}: {got:#?}");
    }
}

#[test]
fn old_self_needs_a_correlatable_schema() {
    let schema = props(json!({
        "type": "object",
        "properties": {"spec": {"type": "object", "properties": {"items": {
            "type": "array",
            "maxItems": 10,
            "items": {"type": "string", "maxLength": 10, "x-kubernetes-validations": [{"rule": "self == oldSelf"}]},
        }}}}
    }));
    assert_eq!(
        compile_errors(&schema),
        [
            r#"spec.validation.openAPIV3Schema.properties[spec].properties[items].items.x-kubernetes-validations[0].rule: Invalid value: "self == oldSelf": oldSelf cannot be used on the uncorrelatable portion of the schema within spec.validation.openAPIV3Schema.properties[spec].properties[items]"#
        ]
    );
}

#[test]
fn crd_writes_limit_the_estimated_cost() {
    let nested = |list: Value| {
        spec_schema(
            json!({"a": list.clone(), "b": list}),
            json!([{"rule": "self.a.all(x, self.b.all(y, x.contains(y)))"}]),
        )
    };
    let errors = compile_errors(&nested(
        json!({"type": "array", "items": {"type": "string"}}),
    ));
    assert_eq!(errors.len(), 3, "{errors:#?}");
    assert!(errors[0].starts_with("spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds budget by factor of more than 100x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)"));
    assert!(errors[1].starts_with("spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: Forbidden: contributed to estimated rule cost total"));
    assert!(errors[2].starts_with("spec.validation.openAPIV3Schema: Forbidden: x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema exceeds budget by factor of more than 100x"));
    // upstream's example: concatenating conversions of unbounded size is refused
    let message = compile_errors(&spec_schema(
        json!({"replicas": {"type": "integer"}}),
        json!([{"rule": "self.replicas > 0", "messageExpression": "'replicas: ' + string(self.replicas)"}]),
    ));
    assert!(message[0].starts_with("spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].messageExpression: Forbidden: estimated messageExpression cost exceeds budget"), "{message:#?}");
    let bounded =
        json!({"type": "array", "maxItems": 10, "items": {"type": "string", "maxLength": 10}});
    assert_eq!(compile_errors(&nested(bounded)), Vec::<String>::new());
}

/// The estimated cost of the single rule on the root of `schema`, as upstream's
/// `TestCostEstimation` computes it (a schema that is not a resource root).
fn static_cost(schema: Value) -> u64 {
    let structural = Structural::from_props(&props(schema));
    let decl = schema_decl_type(&structural, false);
    let mut report = compilation::Report::new();
    let node = compilation::build(&structural, &structural, false, decl, None, &mut report)
        .unwrap_or_else(|| panic!("a rule"));
    let rule = &node.rules[0];
    assert!(rule.error.is_none(), "{:?}", rule.error);
    rule.max_cost
}

/// Upstream's `TestCostEstimation` table: (schema, rule, bound, cost without the bound, cost
/// with it).
#[test]
fn static_costs_match_upstream() {
    let array = |item: Value| move |max: Option<i64>| json!({"type": "array", "maxItems": max, "items": item.clone()});
    let map = |value: Value| move |max: Option<i64>| json!({"type": "object", "maxProperties": max, "additionalProperties": value.clone()});
    let string = |max: Option<i64>| json!({"type": "string", "maxLength": max});
    type Gen = Box<dyn Fn(Option<i64>) -> Value>;
    let cases: Vec<(&str, Gen, &str, i64, u64, u64)> = vec![
        (
            "number array with all",
            Box::new(array(json!({"type": "number"}))),
            "self.all(x, true)",
            10,
            4718591,
            32,
        ),
        (
            "string array with all",
            Box::new(array(json!({"type": "string"}))),
            "self.all(x, true)",
            20,
            3145727,
            62,
        ),
        (
            "boolean array with all",
            Box::new(array(json!({"type": "boolean"}))),
            "self.all(x, true)",
            5,
            1887437,
            17,
        ),
        (
            "array of number arrays with all",
            Box::new(array(json!({"type": "array", "items": {"type": "number"}}))),
            "self.all(x, true)",
            100,
            3145727,
            302,
        ),
        (
            "array of objects with all",
            Box::new(array(
                json!({"type": "object", "required": ["required"], "properties": {"required": {"type": "string"}, "optional": {"type": "string"}}}),
            )),
            "self.all(x, true)",
            50,
            555128,
            152,
        ),
        (
            "map of numbers with all",
            Box::new(map(json!({"type": "number"}))),
            "self.all(x, true)",
            10,
            1348169,
            32,
        ),
        (
            "map of strings with all",
            Box::new(map(json!({"type": "string"}))),
            "self.all(x, true)",
            3,
            1179647,
            11,
        ),
        (
            "string with contains",
            Box::new(string),
            "self.contains('test')",
            10,
            314574,
            5,
        ),
        (
            "string with startsWith",
            Box::new(string),
            "self.startsWith('test')",
            15,
            2,
            2,
        ),
        (
            "concat string",
            Box::new(string),
            r#"size(self + "hello") > size("hello")"#,
            4,
            314578,
            7,
        ),
        (
            "index of array with numbers",
            Box::new(array(json!({"type": "number"}))),
            "self[1] == 0.0",
            5000,
            2,
            2,
        ),
        (
            "index of array with strings",
            Box::new(array(json!({"type": "string"}))),
            "self[1] == self[1]",
            8,
            314577,
            314577,
        ),
        (
            "regex matches simple",
            Box::new(string),
            r#"self.matches("x")"#,
            50,
            314574,
            22,
        ),
        (
            "regex matches empty string",
            Box::new(string),
            r#""".matches("(((((((((())))))))))[0-9]")"#,
            10,
            7,
            7,
        ),
        (
            "regex matches empty regex",
            Box::new(string),
            r#"self.matches("")"#,
            100,
            1,
            1,
        ),
        (
            "set string maxLength to zero",
            Box::new(string),
            r#"self == "x""#,
            0,
            2,
            1,
        ),
        (
            "set maxLength greater than estimated",
            Box::new(array(json!({"type": "number"}))),
            "self.all(x, x == 0.0)",
            3 * 1024 * 2048,
            6291454,
            25165826,
        ),
        (
            "int-or-string array with all",
            Box::new(array(json!({"x-kubernetes-int-or-string": true}))),
            "self.all(x, true)",
            10,
            4718591,
            32,
        ),
        (
            "index of array with int-or-strings",
            Box::new(array(json!({"x-kubernetes-int-or-string": true}))),
            "self[0] == 5",
            10,
            3,
            3,
        ),
        (
            "index of array of objects",
            Box::new(array(
                json!({"type": "object", "required": ["required"], "properties": {"required": {"type": "string"}, "optional": {"type": "string"}}}),
            )),
            "self[0] == null",
            422,
            2,
            2,
        ),
        (
            "array of number maps with all",
            Box::new(array(
                json!({"type": "object", "additionalProperties": {"type": "number"}}),
            )),
            "self.all(x, x.y == 25.2)",
            12,
            6291452,
            74,
        ),
        (
            "index of array of number maps",
            Box::new(array(
                json!({"type": "object", "additionalProperties": {"type": "number"}}),
            )),
            "self[0].x > 2.0",
            3000,
            4,
            4,
        ),
        (
            "duration array with all",
            Box::new(array(json!({"type": "string", "format": "duration"}))),
            "self.all(x, true)",
            5,
            2359295,
            17,
        ),
        (
            "index of duration array",
            Box::new(array(json!({"type": "string", "format": "duration"}))),
            "self[0].getHours() == 2",
            525,
            4,
            4,
        ),
        (
            "date array with all",
            Box::new(array(json!({"type": "string", "format": "date"}))),
            "self.all(x, true)",
            15,
            725936,
            47,
        ),
        (
            "date-time array with all",
            Box::new(array(json!({"type": "string", "format": "date-time"}))),
            "self.all(x, true)",
            25,
            428963,
            77,
        ),
        (
            "map of date-times with all",
            Box::new(map(json!({"type": "string", "format": "date-time"}))),
            "self.all(x, true)",
            25,
            349526,
            77,
        ),
        (
            "extended library regex find",
            Box::new(string),
            "self.find('[0-9]+') == ''",
            10,
            629147,
            11,
        ),
        (
            "extended library lowerAscii",
            Box::new(string),
            "self.lowerAscii() == 'lower!'",
            10,
            314575,
            6,
        ),
        (
            "check cost of size call",
            Box::new(map(json!({"type": "integer"}))),
            "oldSelf.size() == self.size()",
            10,
            5,
            5,
        ),
        (
            "check cost of timestamp comparison",
            Box::new(map(json!({"type": "string", "format": "date-time"}))),
            r#"self["a"] == self["b"]"#,
            7,
            8,
            8,
        ),
    ];
    for (name, generate, rule, bound, unbounded_cost, bounded_cost) in cases {
        let with_rule = |mut schema: Value| {
            if let Some(object) = schema.as_object_mut() {
                object.retain(|_, v| !v.is_null());
                object.insert(
                    "x-kubernetes-validations".to_string(),
                    json!([{"rule": rule}]),
                );
            }
            schema
        };
        assert_eq!(
            static_cost(with_rule(generate(None))),
            unbounded_cost,
            "{name}: unbounded"
        );
        assert_eq!(
            static_cost(with_rule(generate(Some(bound)))),
            bounded_cost,
            "{name}: bounded"
        );
    }
}

#[test]
fn static_costs_of_library_calls_match_upstream() {
    let strings = |max: Option<i64>| json!({"type": "array", "maxItems": max, "items": {"type": "string", "maxLength": max}});
    let strip = |mut v: Value| {
        if let Some(o) = v.as_object_mut() {
            o.retain(|_, v| !v.is_null());
            if let Some(items) = o.get_mut("items").and_then(Value::as_object_mut) {
                items.retain(|_, v| !v.is_null());
            }
        }
        v
    };
    let with_rule = |schema: Value, rule: &str| {
        let mut schema = strip(schema);
        if let Some(o) = schema.as_object_mut() {
            o.insert(
                "x-kubernetes-validations".to_string(),
                json!([{"rule": rule}]),
            );
        }
        schema
    };
    assert_eq!(
        static_cost(with_rule(strings(None), "self.join(' ') == 'aa bb'")),
        329853068905
    );
    assert_eq!(
        static_cost(with_rule(strings(Some(10)), "self.join(' ') == 'aa bb'")),
        43
    );
    assert_eq!(
        static_cost(with_rule(strings(None), "self.isSorted() == true")),
        329854432052
    );
    assert_eq!(
        static_cost(with_rule(strings(Some(10)), "self.isSorted() == true")),
        52
    );
    let object = |max: Option<i64>, rule: &str, extra: Value| {
        let mut properties = json!({"str": {"type": "string", "maxLength": max}});
        if let (Some(p), Some(e)) = (properties.as_object_mut(), extra.as_object()) {
            p.extend(e.clone());
        }
        let mut schema = json!({"type": "object", "properties": properties, "x-kubernetes-validations": [{"rule": rule}]});
        if let Some(s) = schema["properties"]["str"].as_object_mut() {
            s.retain(|_, v| !v.is_null());
        }
        schema
    };
    let replace = json!({"before": {"type": "string", "maxLength": 2}, "after": {"type": "string", "maxLength": 4}});
    let replace_rule = "self.str.replace(self.before, self.after) == 'does not matter'";
    assert_eq!(
        static_cost(object(None, replace_rule, replace.clone())),
        629154
    );
    assert_eq!(static_cost(object(Some(4), replace_rule, replace)), 12);
    let split = |max: Option<i64>| {
        object(
            max,
            "self.str.split(self.separator) == []",
            json!({"separator": {"type": "string", "maxLength": max}}),
        )
    };
    let mut unbounded = split(None);
    if let Some(s) = unbounded["properties"]["separator"].as_object_mut() {
        s.retain(|_, v| !v.is_null());
    }
    assert_eq!(static_cost(unbounded), 629160);
    assert_eq!(static_cost(split(Some(10))), 22);
}
