//! End-to-end tables for [`Validator`]: rules from upstream's `validation_test.go` run against
//! objects, with upstream's messages. The CRD-write checks are in `crd`, the cert-manager
//! fixtures in `cert_manager`.

mod cert_manager;
mod crd;

use serde_json::{Value, json};

use super::*;

fn props(schema: Value) -> JSONSchemaProps {
    serde_json::from_value(schema).unwrap_or_else(|e| panic!("schema: {e}"))
}

/// A root object whose `spec` has `properties` and the `rules`.
fn spec_schema(properties: Value, rules: Value) -> JSONSchemaProps {
    props(json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": properties,
                "x-kubernetes-validations": rules,
            }
        }
    }))
}

fn compiled(schema: &JSONSchemaProps) -> Validator {
    Validator::compile(schema)
        .unwrap_or_else(|errors| panic!("{}", flotilla_api_machinery::field::aggregate(&errors)))
}

/// The validator of a stored schema, without the CRD-write checks: what upstream's runtime
/// tests build (their rules need not pass the static cost limit).
fn runtime(schema: &JSONSchemaProps) -> Validator {
    Validator::new(schema)
}

fn messages(errors: &[FieldError]) -> Vec<String> {
    errors.iter().map(ToString::to_string).collect()
}

fn spec_errors(v: &Validator, spec: Value, old: Option<Value>) -> Vec<String> {
    let old = old.map(|o| json!({"spec": o}));
    messages(&v.validate(&json!({"spec": spec}), old.as_ref()))
}

#[test]
fn rules_report_upstream_messages() {
    let replicas = json!({
        "replicas": {"type": "integer"},
        "minReplicas": {"type": "integer"},
        "name": {"type": "string"},
    });
    // (rule, spec, expected errors)
    let cases: Vec<(Value, Value, Vec<&str>)> = vec![
        (
            json!({"rule": "self.minReplicas <= self.replicas"}),
            json!({"replicas": 3, "minReplicas": 1}),
            vec![],
        ),
        (
            json!({"rule": "self.minReplicas <= self.replicas"}),
            json!({"replicas": 1, "minReplicas": 3}),
            vec![
                r#"spec: Invalid value: "object": failed rule: self.minReplicas <= self.replicas"#,
            ],
        ),
        (
            json!({"rule": "self.minReplicas <= self.replicas", "message": "replicas must be >= minReplicas"}),
            json!({"replicas": 1, "minReplicas": 3}),
            vec![r#"spec: Invalid value: "object": replicas must be >= minReplicas"#],
        ),
        (
            json!({"rule": "self.minReplicas <= self.replicas",
                   "messageExpression": "'replicas ' + string(self.replicas) + ' is less than ' + string(self.minReplicas)"}),
            json!({"replicas": 1, "minReplicas": 3}),
            vec![r#"spec: Invalid value: "object": replicas 1 is less than 3"#],
        ),
        (
            // a failing messageExpression falls back to the message
            json!({"rule": "self.minReplicas <= self.replicas", "message": "too few",
                   "messageExpression": "self.name + ' is wrong'"}),
            json!({"replicas": 1, "minReplicas": 3}),
            vec![r#"spec: Invalid value: "object": too few"#],
        ),
        (
            json!({"rule": "self.minReplicas <= self.replicas", "reason": "FieldValueForbidden", "message": "no"}),
            json!({"replicas": 1, "minReplicas": 3}),
            vec!["spec: Forbidden: no"],
        ),
        (
            json!({"rule": "self.minReplicas <= self.replicas", "reason": "FieldValueRequired", "message": "need"}),
            json!({"replicas": 1, "minReplicas": 3}),
            vec!["spec: Required value: need"],
        ),
        (
            json!({"rule": "self.minReplicas <= self.replicas", "reason": "FieldValueDuplicate"}),
            json!({"replicas": 1, "minReplicas": 3}),
            vec![r#"spec: Duplicate value: "object""#],
        ),
        (
            json!({"rule": "self.minReplicas <= self.replicas", "fieldPath": ".replicas", "message": "low"}),
            json!({"replicas": 1, "minReplicas": 3}),
            vec![r#"spec.replicas: Invalid value: "object": low"#],
        ),
        (
            json!({"rule": "self.replicas == 1"}),
            json!({"minReplicas": 3}),
            vec![
                r#"spec: Invalid value: "object": no such key: replicas evaluating rule: self.replicas == 1"#,
            ],
        ),
        (
            json!({"rule": "!has(self.replicas) || self.replicas > 0"}),
            json!({}),
            vec![],
        ),
        (
            json!({"rule": "self.name.matches('^[a-z]+$')"}),
            json!({"name": "abc"}),
            vec![],
        ),
        (
            json!({"rule": "self.name.matches('^[a-z]+$')"}),
            json!({"name": "Abc"}),
            vec![r#"spec: Invalid value: "object": failed rule: self.name.matches('^[a-z]+$')"#],
        ),
        (
            json!({"rule": "self.replicas / (self.minReplicas - 1) > 0"}),
            json!({"replicas": 1, "minReplicas": 1}),
            vec![
                r#"spec: Invalid value: "object": division by zero evaluating rule: self.replicas / (self.minReplicas - 1) > 0"#,
            ],
        ),
    ];
    for (rule, spec, want) in cases {
        let v = runtime(&spec_schema(replicas.clone(), json!([rule.clone()])));
        assert_eq!(spec_errors(&v, spec, None), want, "{rule}");
    }
}

#[test]
fn scalar_rules_report_their_type() {
    let schema = props(json!({
        "type": "object",
        "properties": {"name": {"type": "string", "x-kubernetes-validations": [{"rule": "self.size() < 4"}]}}
    }));
    let v = compiled(&schema);
    assert_eq!(
        messages(&v.validate(&json!({"name": "toolong"}), None)),
        [r#"name: Invalid value: "string": failed rule: self.size() < 4"#]
    );
    // null values are not validated
    assert!(v.validate(&json!({"name": null}), None).is_empty());
}

#[test]
fn transition_rules_compare_with_the_old_value() {
    let v = compiled(&spec_schema(
        json!({"x": {"type": "string"}}),
        json!([{"rule": "self.x == oldSelf.x", "message": "x is immutable"}]),
    ));
    assert!(
        spec_errors(&v, json!({"x": "a"}), None).is_empty(),
        "skipped on create"
    );
    assert!(spec_errors(&v, json!({"x": "a"}), Some(json!({"x": "a"}))).is_empty());
    assert_eq!(
        spec_errors(&v, json!({"x": "b"}), Some(json!({"x": "a"}))),
        [r#"spec: Invalid value: "object": x is immutable"#]
    );

    let optional = compiled(&spec_schema(
        json!({"x": {"type": "string"}}),
        json!([{"rule": "oldSelf.hasValue() || self.x == 'initial'", "optionalOldSelf": true}]),
    ));
    assert_eq!(
        spec_errors(&optional, json!({"x": "a"}), None).len(),
        1,
        "runs on create"
    );
    assert!(spec_errors(&optional, json!({"x": "a"}), Some(json!({"x": "b"}))).is_empty());
}

#[test]
fn map_lists_correlate_items_by_key() {
    let schema = props(json!({
        "type": "object",
        "properties": {"items": {
            "type": "array",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "value": {"type": "integer"}},
                "x-kubernetes-validations": [{"rule": "self.value >= oldSelf.value", "message": "may not decrease"}],
            }
        }}
    }));
    let v = compiled(&schema);
    let old = json!({"items": [{"name": "a", "value": 5}, {"name": "b", "value": 1}]});
    let new = json!({"items": [{"name": "b", "value": 0}, {"name": "a", "value": 6}, {"name": "c", "value": 0}]});
    assert_eq!(
        messages(&v.validate(&new, Some(&old))),
        [r#"items[0]: Invalid value: "object": may not decrease"#]
    );
}

#[test]
fn ratcheting_warns_about_unchanged_values() {
    let schema = props(json!({
        "type": "object",
        "properties": {
            "a": {"type": "string", "x-kubernetes-validations": [{"rule": "self.size() < 3"}]},
            "b": {"type": "string"},
        }
    }));
    let v = compiled(&schema);
    let old = json!({"a": "long", "b": "x"});
    let unchanged = v.validate_with(
        &Path::none(),
        &json!({"a": "long", "b": "y"}),
        Some(&old),
        1000,
    );
    assert!(unchanged.errors.is_empty());
    assert_eq!(
        unchanged.warnings,
        [r#"a: Invalid value: "string": failed rule: self.size() < 3"#]
    );
    let changed = v.validate(&json!({"a": "longer", "b": "y"}), Some(&old));
    assert_eq!(changed.len(), 1);
}

#[test]
fn values_follow_the_schema() {
    let schema = spec_schema(
        json!({
            "foo-bar": {"type": "string"},
            "namespace": {"type": "string"},
            "port": {"x-kubernetes-int-or-string": true},
            "when": {"type": "string", "format": "date-time"},
            "wait": {"type": "string", "format": "duration"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "q": {"type": "string"},
            "u": {"type": "string"},
        }),
        json!([
            {"rule": "self.foo__dash__bar == 'x'"},
            {"rule": "self.__namespace__ == 'ns'"},
            {"rule": "type(self.port) == string ? self.port.matches('^[a-z]+$') : self.port > 0"},
            {"rule": "self.when < timestamp('2030-01-01T00:00:00Z')"},
            {"rule": "self.wait > duration('1m')"},
            {"rule": "self.labels.all(k, k.startsWith('a'))"},
            {"rule": "quantity(self.q).isLessThan(quantity('1Gi'))"},
            {"rule": "isURL(self.u)"},
        ]),
    );
    let v = compiled(&schema);
    let good = json!({
        "foo-bar": "x", "namespace": "ns", "port": "http", "when": "2020-01-01T00:00:00Z",
        "wait": "2m", "labels": {"app": "x", "arch": "y"}, "q": "512Mi", "u": "https://example.com",
    });
    assert_eq!(spec_errors(&v, good, None), Vec::<String>::new());
    let bad = json!({
        "foo-bar": "y", "namespace": "other", "port": 0, "when": "2040-01-01T00:00:00Z",
        "wait": "30s", "labels": {"b": "x"}, "q": "2Gi", "u": "not a url",
    });
    assert_eq!(spec_errors(&v, bad, None).len(), 8);
}

#[test]
fn the_resource_root_exposes_type_and_object_meta() {
    let schema = props(json!({
        "type": "object",
        "x-kubernetes-validations": [{"rule": "self.metadata.name.startsWith('a') && self.kind == 'Widget'"}],
    }));
    let v = compiled(&schema);
    let object = |name: &str| json!({"kind": "Widget", "apiVersion": "x/v1", "metadata": {"name": name, "labels": {"a": "b"}}});
    assert!(v.validate(&object("abc"), None).is_empty());
    assert_eq!(
        messages(&v.validate(&object("xyz"), None)),
        [
            r#"<nil>: Invalid value: "object": failed rule: self.metadata.name.startsWith('a') && self.kind == 'Widget'"#
        ]
    );
}

/// Expressions over literals that must all hold: the libraries as upstream documents them.
#[test]
fn libraries_behave_like_upstream() {
    let cases = [
        // lists
        "[1, 2, 3].isSorted() && !['b', 'a'].isSorted()",
        "[1, 3].sum() == 4 && [1.0, 3.0].sum() == 4.0 && [].sum() == 0",
        "[1, 3].min() == 1 && [1, 3].max() == 3",
        "[1, 2, 2, 3].indexOf(2) == 1 && ['a', 'b', 'b', 'c'].lastIndexOf('b') == 2 && [].indexOf('x') == -1",
        // strings
        "'Rook takes 👑'.charAt(3) == 'k' && 'Rook takes 👑'.indexOf('o', 2) == 2",
        "'Rook takes 👑'.split(' ') == ['Rook', 'takes', '👑'] && 'a b'.replace(' ', 'x') == 'axb'",
        "'Rook'.lowerAscii() == 'rook' && 'Rook'.upperAscii() == 'ROOK' && '  x '.trim() == 'x'",
        "'abcdef'.substring(1, 3) == 'bc' && ['a', 'b'].join('-') == 'a-b'",
        "'%s-%d'.format(['a', 1]) == 'a-1'",
        // regex
        "'abc 123 def 456'.find('[0-9]+') == '123' && 'abc 123 def 456'.findAll('[0-9]+') == ['123', '456']",
        "'abc 123 def 456'.findAll('[0-9]+', 1) == ['123'] && 'abc'.find('[0-9]+') == ''",
        // urls
        "url('https://example.com:80/path?query=val').getScheme() == 'https'",
        "url('https://example.com:80/path').getHost() == 'example.com:80'",
        "url('https://[::1]:80/path').getHostname() == '::1' && url('https://[::1]:80/').getPort() == '80'",
        "url('https://example.com/with space').getEscapedPath() == '/with%20space'",
        "url('https://example.com/?k=a&k=b&j=c').getQuery() == {'k': ['a', 'b'], 'j': ['c']}",
        "isURL('/absolute-path') && !isURL('../relative-path')",
        // quantities
        "quantity('50k').add(quantity('20k')) == quantity('70k') && quantity('50k').sub(20000) == quantity('30k')",
        "quantity('200M').compareTo(quantity('0.2G')) == 0 && quantity('50M').compareTo(quantity('50Mi')) == -1",
        "quantity('150Mi').isGreaterThan(quantity('100Mi')) && quantity('50M').isLessThan(quantity('100M'))",
        "quantity('50k').asInteger() == 50000 && quantity('50k').sub(20000).asApproximateFloat() == 30000.0",
        "quantity('1.5').isInteger() == false && quantity('-1').sign() == -1 && isQuantity('1Gi') && !isQuantity('1x')",
        // ip and cidr
        "ip('127.0.0.1').family() == 4 && ip('::1').family() == 6 && isIP('::1') && !isIP('1.2.3')",
        "ip('0.0.0.0').isUnspecified() && ip('127.0.0.1').isLoopback() && ip('224.0.0.1').isLinkLocalMulticast()",
        "ip('169.254.169.254').isLinkLocalUnicast() && ip('192.168.0.1').isGlobalUnicast()",
        "ip.isCanonical('127.0.0.1') && !ip.isCanonical('2001:db8:0:0:0:0:0:abcd')",
        "cidr('192.168.0.0/24').containsIP(ip('192.168.0.1')) && cidr('192.168.0.0/24').containsIP('192.168.0.1')",
        "cidr('192.168.0.0/16').containsCIDR(cidr('192.168.10.0/24')) && !cidr('192.168.1.0/24').containsCIDR('192.168.2.0/24')",
        "cidr('192.168.0.1/24').ip() == ip('192.168.0.1') && cidr('192.168.0.1/24').masked() == cidr('192.168.0.0/24')",
        "cidr('::1/128').prefixLength() == 128 && isCIDR('10.0.0.0/8') && !isCIDR('10.0.0.0')",
        // format
        "!format.dns1123Label().validate('my-label-name').hasValue()",
        "format.dns1123Label().validate('My_Label').hasValue()",
        "format.named('uri').hasValue() && !format.named('url').hasValue()",
        "format.named('uuid').value().validate('123e4567-e89b-12d3-a456-426614174000') == optional.none()",
        "format.dns1123Label().validate('contains a space').value()[0].startsWith('a lowercase RFC 1123 label')",
        // sets
        "sets.contains([1, 2, 3], [2]) && sets.equivalent([1, 2], [2, 1]) && sets.intersects([1], [1, 2])",
        // optionals
        "optional.of(1).value() == 1 && optional.none().orValue(2) == 2",
    ];
    let schema = props(
        json!({"type": "object", "x-kubernetes-validations": cases.iter().map(|c| json!({"rule": c})).collect::<Vec<_>>()}),
    );
    let v = runtime(&schema);
    assert_eq!(
        messages(&v.validate(&json!({}), None)),
        Vec::<String>::new()
    );
}

#[test]
fn runtime_library_errors_read_like_upstream() {
    let cases = [
        (
            "url('../relative') == url('/x')",
            "URL parse error during conversion from string: parse \"../relative\": invalid URI for request evaluating rule",
        ),
        (
            "quantity('1x').sign() == 1",
            "quantities must match the regular expression",
        ),
        (
            "ip('::ffff:1.2.3.4').family() == 6",
            "IPv4-mapped IPv6 address \"::ffff:1.2.3.4\" is not allowed",
        ),
        ("[1].min() == [].min()", "min called on empty list"),
        (
            "quantity('1.5').asInteger() == 1",
            "cannot convert value to integer",
        ),
    ];
    for (rule, want) in cases {
        let v = runtime(&props(
            json!({"type": "object", "x-kubernetes-validations": [{"rule": rule}]}),
        ));
        let got = messages(&v.validate(&json!({}), None));
        assert!(got.len() == 1 && got[0].contains(want), "{rule}: {got:?}");
    }
}

#[test]
fn runtime_cost_is_guarded_per_call() {
    let schema = spec_schema(
        json!({"a": {"type": "array", "maxItems": 600, "items": {"type": "string", "maxLength": 2}}}),
        json!([{"rule": "self.a.all(x, self.a.all(y, x == y || x != y))"}]),
    );
    let v = compiled(&schema);
    let small = json!({"a": ["a", "b"]});
    assert!(spec_errors(&v, small, None).is_empty());
    let large = json!({"a": vec!["x"; 600]});
    let errors = spec_errors(&v, large, None);
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0]
            .contains("no further validation rules will be run due to call cost exceeds limit"),
        "{errors:?}"
    );
    let outcome = v.validate_with(&Path::none(), &json!({"spec": {"a": ["a"]}}), None, 1);
    assert!(
        outcome.errors[0]
            .to_string()
            .contains("running out of cost budget"),
        "{outcome:?}"
    );
}

#[test]
fn validators_are_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Validator>();
}

/// Upstream's two-variable comprehension rules (Kubernetes 1.32+), over a map, a map list and
/// a list.
#[test]
fn two_variable_comprehensions() {
    const RULES: &[&str] = &[
        "self.val.all(k, v, v > 0)",
        "self.val.exists(k, v, v == 2)",
        "self.val.existsOne(k, v, v == 2)",
        "self.val.transformMap(k, v, v > 1, v + 1).size() == 1",
        "self.val.transformMap(k, v, v + 1) == {'b': 2, 'd': 3}",
        "self.val.transformMapEntry(k, v, v > 1, {k + '2': v + 1}).size() == 1",
        "self.val.transformMapEntry(k, v, {k + '2': v + 1}) == {'b2': 2, 'd2': 3}",
        "!self.listMap.all(i, m, has(m.v2) && m.v2 != 'z')",
        "self.listMap.exists(i, m, has(m.v2) && m.v2 == 'z')",
        "self.listMap.existsOne(i, m, has(m.v2) && m.v2 == 'z')",
        "self.listMap.transformList(i, m, has(m.v2) && m.v2 == 'z', m.v2) == ['z']",
        "self.listMap.transformList(i, m, m.v).size() == 3",
        "self.array.all(i, e, e > 0) && self.array.exists(i, e, e > 2)",
        "self.array.existsOne(i, e, e > 4) && self.array.transformList(i, e, i * 10 + e) == [1, 12, 25]",
        "self.array.all(i, e, self.array.exists(i, x, i >= 0 && x > 0))",
    ];
    let schema = spec_schema(
        json!({
            "val": {"type": "object", "additionalProperties": {"type": "integer"}},
            "listMap": {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["k"],
                "items": {"type": "object", "properties": {
                    "k": {"type": "string"}, "v": {"type": "string"}, "v2": {"type": "string"},
                }},
            },
            "array": {"type": "array", "items": {"type": "integer"}},
        }),
        Value::Array(RULES.iter().map(|rule| json!({"rule": rule})).collect()),
    );
    let v = runtime(&schema);
    let spec = json!({
        "val": {"b": 1, "d": 2},
        "listMap": [{"k": "a1", "v": "b1"}, {"k": "a2", "v": "b2"}, {"k": "a3", "v": "b3", "v2": "z"}],
        "array": [1, 2, 5],
    });
    assert_eq!(spec_errors(&v, spec, None), Vec::<String>::new());

    // the pair's halves are typed: a field the items do not declare is a compile error
    let typed = spec_schema(
        json!({"array": {"type": "array", "maxItems": 10, "items": {
            "type": "object", "properties": {"k": {"type": "string", "maxLength": 10}},
        }}}),
        json!([{"rule": "self.array.all(i, e, e.nope == 'x')"}]),
    );
    let errors = Validator::compile(&typed)
        .err()
        .map(|e| messages(&e))
        .unwrap_or_default();
    assert!(
        errors.len() == 1 && errors[0].contains("undefined field 'nope'"),
        "{errors:?}"
    );
}
