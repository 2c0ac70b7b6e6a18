//! ValidatingAdmissionPolicy tables: decisions with their messages, reasons and codes,
//! parameters, variables, audit annotations, match conditions, and the write checks' errors in
//! upstream's text.

use serde_json::{Value, json};

use super::{deployment, request};
use crate::admission::*;
use flotilla_api_machinery::field::Path;

fn policy(spec: Value) -> Policy {
    Policy::compile(&spec, &Path::new("spec"))
        .unwrap_or_else(|errors| panic!("{}", flotilla_api_machinery::field::aggregate(&errors)))
}

fn evaluate(policy: &Policy, object: &Value, params: Option<&Value>) -> Decision {
    let request = request();
    policy.evaluate(&AdmissionInputs {
        object: Some(object),
        old_object: None,
        request: &request,
        params,
        namespace_object: None,
        authorizer: None,
    })
}

/// A decision's action, evaluation, message and code.
type Row = (PolicyDecisionAction, PolicyDecisionEvaluation, String, u16);
/// The same, with a borrowed message, for tables.
type Expected<'a> = (PolicyDecisionAction, PolicyDecisionEvaluation, &'a str, u16);

fn summary(decision: &Decision) -> Vec<Row> {
    decision
        .decisions
        .iter()
        .map(|d| (d.action, d.evaluation, d.message.clone(), d.code()))
        .collect()
}

use PolicyDecisionAction::{Admit, Deny};
use PolicyDecisionEvaluation as Eval;

#[test]
fn denies_deployments_with_too_many_replicas() {
    let validation = |extra: Value| {
        let mut v = json!({"expression": "object.spec.replicas <= 5"});
        if let (Some(v), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
            v.extend(extra.clone());
        }
        policy(json!({"failurePolicy": "Fail", "validations": [v]}))
    };
    // (validation fields beyond the expression, replicas, decision)
    let cases: Vec<(Value, i64, Expected<'_>)> = vec![
        (json!({}), 3, (Admit, Eval::Admit, "", 422)),
        (
            json!({}),
            7,
            (
                Deny,
                Eval::Deny,
                "failed expression: object.spec.replicas <= 5",
                422,
            ),
        ),
        (
            json!({"message": " too many replicas "}),
            7,
            (Deny, Eval::Deny, "too many replicas", 422),
        ),
        (
            json!({"message": "too many replicas", "reason": "Forbidden"}),
            7,
            (Deny, Eval::Deny, "too many replicas", 403),
        ),
        (
            json!({"reason": "RequestEntityTooLarge"}),
            7,
            (
                Deny,
                Eval::Deny,
                "failed expression: object.spec.replicas <= 5",
                413,
            ),
        ),
        (
            json!({"message": "too many replicas", "messageExpression": "'replicas ' + string(object.spec.replicas) + ' exceeds 5'"}),
            7,
            (Deny, Eval::Deny, "replicas 7 exceeds 5", 422),
        ),
        // a message expression that fails, is blank or spans lines falls back to the message
        (
            json!({"message": "too many replicas", "messageExpression": "object.spec.nope + ''"}),
            7,
            (Deny, Eval::Deny, "too many replicas", 422),
        ),
        (
            json!({"messageExpression": "'  '"}),
            7,
            (
                Deny,
                Eval::Deny,
                "failed expression: object.spec.replicas <= 5",
                422,
            ),
        ),
        (
            json!({"message": "too many replicas", "messageExpression": "'a\\nb'"}),
            7,
            (Deny, Eval::Deny, "too many replicas", 422),
        ),
    ];
    for (extra, replicas, (action, evaluation, message, code)) in cases {
        let decision = evaluate(&validation(extra.clone()), &deployment(replicas), None);
        assert!(decision.matched);
        assert_eq!(
            summary(&decision),
            vec![(action, evaluation, message.to_string(), code)],
            "{extra} with {replicas} replicas"
        );
    }
}

#[test]
fn checks_replicas_against_a_config_map_param() {
    let spec = |failure_policy: &str| {
        json!({
            "failurePolicy": failure_policy,
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "validations": [{
                // ConfigMap data values are strings
                "expression": "object.spec.replicas <= int(params.data.maxReplicas)",
                "messageExpression": "'at most ' + params.data.maxReplicas + ' replicas, not ' + string(object.spec.replicas)",
            }],
        })
    };
    let fail = policy(spec("Fail"));
    assert!(fail.has_params());
    let params = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"maxReplicas": "5"}});
    let cases: Vec<(i64, Option<&Value>, Expected<'_>)> = vec![
        (4, Some(&params), (Admit, Eval::Admit, "", 422)),
        (
            6,
            Some(&params),
            (Deny, Eval::Deny, "at most 5 replicas, not 6", 422),
        ),
    ];
    for (replicas, params, (action, evaluation, message, code)) in cases {
        assert_eq!(
            summary(&evaluate(&fail, &deployment(replicas), params)),
            vec![(action, evaluation, message.to_string(), code)],
            "{replicas}"
        );
    }
    // a param that is not a number fails the expression: the failure policy decides
    let bad = json!({"data": {"maxReplicas": "lots"}});
    let decision = evaluate(&fail, &deployment(6), Some(&bad));
    let first = decision.decisions.first();
    assert_eq!(
        first.map(|d| (d.action, d.evaluation)),
        Some((Deny, Eval::Error))
    );
    // the conversion's own text is cel-rust's, where cel-go quotes Go's `strconv`
    assert!(first.is_some_and(|d| d.message.starts_with(
        "expression 'object.spec.replicas <= int(params.data.maxReplicas)' resulted in error: "
    )));
    let ignore = policy(spec("Ignore"));
    let decision = evaluate(&ignore, &deployment(6), Some(&bad));
    assert_eq!(
        decision.decisions.first().map(|d| (d.action, d.evaluation)),
        Some((Admit, Eval::Error))
    );
    assert_eq!(decision.denials().count(), 0);
}

#[test]
fn composes_variables_for_validations_and_messages() {
    let policy = policy(json!({
        "failurePolicy": "Fail",
        "variables": [
            {"name": "replicas", "expression": "object.spec.replicas"},
            {"name": "tooMany", "expression": "variables.replicas > 5"},
            {"name": "images", "expression": "object.spec.template.spec.containers.map(c, c.image)"},
        ],
        "validations": [
            {"expression": "!variables.tooMany", "messageExpression": "'replicas: ' + string(variables.replicas)"},
            {"expression": "variables.images.all(i, !i.endsWith(':latest'))", "message": "pin your images"},
        ],
    }));
    let decision = evaluate(&policy, &deployment(9), None);
    assert_eq!(
        summary(&decision),
        vec![
            (Deny, Eval::Deny, "replicas: 9".to_string(), 422),
            (Deny, Eval::Deny, "pin your images".to_string(), 422),
        ]
    );
    let decision = evaluate(&policy, &deployment(1), None);
    assert_eq!(
        decision
            .decisions
            .iter()
            .map(|d| d.evaluation)
            .collect::<Vec<_>>(),
        [Eval::Admit, Eval::Deny]
    );
}

#[test]
fn records_audit_annotations() {
    let spec = |failure_policy: &str| {
        json!({
            "failurePolicy": failure_policy,
            "auditAnnotations": [
                {
                    "key": "high-replica-count",
                    "valueExpression": "object.spec.replicas > 50 ? 'Deployment spec.replicas set to ' + string(object.spec.replicas) : null",
                },
                {"key": "blank", "valueExpression": "'  '"},
                {"key": "broken", "valueExpression": "object.spec.nope + '!'"},
            ],
        })
    };
    let annotations = |decision: &Decision| -> Vec<(String, AuditAnnotationAction, String)> {
        decision
            .audit_annotations
            .iter()
            .map(|a| (a.key.clone(), a.action, format!("{}{}", a.value, a.error)))
            .collect()
    };
    let broken = "expression 'object.spec.nope + '!'' resulted in error: no such key: nope";
    let fail = policy(spec("Fail"));
    assert_eq!(
        annotations(&evaluate(&fail, &deployment(60), None)),
        vec![
            (
                "high-replica-count".to_string(),
                AuditAnnotationAction::Publish,
                "Deployment spec.replicas set to 60".to_string()
            ),
            (
                "blank".to_string(),
                AuditAnnotationAction::Exclude,
                String::new()
            ),
            (
                "broken".to_string(),
                AuditAnnotationAction::Error,
                broken.to_string()
            ),
        ]
    );
    let ignore = policy(spec("Ignore"));
    let decision = evaluate(&ignore, &deployment(3), None);
    assert!(decision.decisions.is_empty());
    assert_eq!(
        decision
            .audit_annotations
            .iter()
            .map(|a| a.action)
            .collect::<Vec<_>>(),
        [AuditAnnotationAction::Exclude; 3]
    );
}

#[test]
fn applies_only_where_match_conditions_hold() {
    let spec = |condition: &str, failure_policy: &str| {
        json!({
            "failurePolicy": failure_policy,
            "matchConditions": [
                {"name": "is-create", "expression": "request.operation == 'CREATE'"},
                {"name": "the-condition", "expression": condition},
            ],
            "validations": [{"expression": "object.spec.replicas <= 5"}],
        })
    };
    // whether the policy applied, the false condition, the decisions
    type Applied<'a> = (bool, Option<&'a str>, Vec<Row>);
    // (condition, failure policy, outcome)
    let cases: Vec<(&str, &str, Applied<'_>)> = vec![
        (
            "object.metadata.labels.env == 'prod'",
            "Fail",
            (
                true,
                None,
                vec![(
                    Deny,
                    Eval::Deny,
                    "failed expression: object.spec.replicas <= 5".to_string(),
                    422,
                )],
            ),
        ),
        (
            "object.metadata.labels.env == 'dev'",
            "Fail",
            (false, Some("the-condition"), vec![]),
        ),
        (
            "object.metadata.annotations.skip == 'no'",
            "Fail",
            (
                true,
                None,
                vec![(
                    Deny,
                    Eval::Error,
                    "expression 'object.metadata.annotations.skip == 'no'' resulted in error: no such key: annotations".to_string(),
                    422,
                )],
            ),
        ),
        (
            "object.metadata.annotations.skip == 'no'",
            "Ignore",
            (false, None, vec![]),
        ),
    ];
    for (condition, failure_policy, (matched, failed, decisions)) in cases {
        let decision = evaluate(
            &policy(spec(condition, failure_policy)),
            &deployment(9),
            None,
        );
        assert_eq!(decision.matched, matched, "{condition}");
        assert_eq!(decision.failed_condition.as_deref(), failed, "{condition}");
        assert_eq!(summary(&decision), decisions, "{condition}");
    }
}

#[test]
fn stored_policies_report_compile_errors_when_evaluated() {
    let stored = Policy::new(&json!({
        "validations": [{"expression": "object.spec.replicas <"}, {"expression": "true"}],
    }));
    assert_eq!(stored.failure_policy(), FailurePolicy::Fail);
    assert_eq!(
        summary(&evaluate(&stored, &deployment(1), None)),
        vec![
            (
                Deny,
                Eval::Error,
                "compilation error: compilation failed: ERROR: <input>:1:23: Syntax error: mismatched input '<EOF>' expecting {'[', '{', '(', '.', '-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}\n | object.spec.replicas <\n | ......................^".to_string(),
                422
            ),
            (Admit, Eval::Admit, String::new(), 422),
        ]
    );
}

fn write_errors(spec: Value) -> Vec<String> {
    match Policy::compile_named("my-policy", &spec, &Path::new("spec")) {
        Ok(_) => Vec::new(),
        Err(errors) => errors.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn policy_writes_report_upstream_errors() {
    let ok = json!({"expression": "true"});
    let cases: Vec<(Value, Vec<&str>)> = vec![
        (
            json!({"failurePolicy": "Fail", "validations": [ok]}),
            vec![],
        ),
        (
            json!({"validations": [ok]}),
            vec!["spec.failurePolicy: Required value"],
        ),
        (
            json!({"failurePolicy": "Sometimes", "validations": [ok]}),
            vec![
                "spec.failurePolicy: Unsupported value: \"Sometimes\": supported values: \"Fail\", \"Ignore\"",
            ],
        ),
        (
            json!({"failurePolicy": "Fail"}),
            vec![
                "spec.validations: Required value: validations or auditAnnotations must contain at least one item",
                "spec.auditAnnotations: Required value: validations or auditAnnotations must contain at least one item",
            ],
        ),
        (
            json!({"failurePolicy": "Fail", "validations": [
                {"expression": " "},
                {"expression": "object.spec.replicas"},
                {"expression": "params.max > 1"},
            ]}),
            vec![
                "spec.validations[0].expression: Required value: expression is not specified",
                "spec.validations[1].expression: Invalid value: \"object.spec.replicas\": must evaluate to bool but got dyn",
                "spec.validations[2].expression: Invalid value: \"params.max > 1\": compilation failed: ERROR: <input>:1:1: undeclared reference to 'params' (in container '')\n | params.max > 1\n | ^",
            ],
        ),
        (
            json!({"failurePolicy": "Fail", "validations": [{
                "expression": "true",
                "messageExpression": "object.spec.replicas",
                "message": "two\nlines",
                "reason": "Teapot",
            }, {"expression": "true", "messageExpression": " ", "message": " "}]}),
            vec![
                "spec.validations[0].messageExpression: Invalid value: \"object.spec.replicas\": must evaluate to string but got dyn",
                "spec.validations[0].message: Invalid value: \"two\\nlines\": message must not contain line breaks",
                "spec.validations[0].reason: Unsupported value: \"Teapot\": supported values: \"Forbidden\", \"Invalid\", \"RequestEntityTooLarge\"",
                "spec.validations[1].messageExpression: Invalid value: \" \": must be non-empty if specified",
                "spec.validations[1].message: Invalid value: \" \": message must be non-empty if specified",
            ],
        ),
        (
            json!({"failurePolicy": "Fail", "variables": [
                {"name": "1x", "expression": "1"},
                {"name": "", "expression": ""},
                {"name": "bad", "expression": "1 + 'a'"},
            ], "matchConditions": [{"name": "uses-variables", "expression": "variables.bad == 1"}],
            "validations": [ok]}),
            vec![
                "spec.matchConditions[0].expression: Invalid value: \"variables.bad == 1\": compilation failed: ERROR: <input>:1:1: undeclared reference to 'variables' (in container '')\n | variables.bad == 1\n | ^",
                "spec.variables[0].name: Invalid value: \"1x\": name is not a valid CEL identifier",
                "spec.variables[1].name: Required value: name is not specified",
                "spec.variables[1].expression: Required value: expression is not specified",
                "spec.variables[2].expression: Invalid value: \"1 + 'a'\": compilation failed: ERROR: <input>:1:3: found no matching overload for '_+_' applied to '(int, string)'\n | 1 + 'a'\n | ..^",
            ],
        ),
        (
            json!({"failurePolicy": "Fail", "auditAnnotations": [
                {"key": "ok", "valueExpression": "'v'"},
                {"key": "ok", "valueExpression": " "},
                {"key": "bad key", "valueExpression": "object.spec.replicas"},
            ]}),
            vec![
                "spec.auditAnnotations[1].valueExpression: Required value: valueExpression is not specified",
                "spec.auditAnnotations[1].key: Duplicate value: \"ok\"",
                "spec.auditAnnotations[2].key: Invalid value: \"my-policy/bad key\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
                "spec.auditAnnotations[2].valueExpression: Invalid value: \"object.spec.replicas\": must evaluate to one of [string null_type] but got dyn",
            ],
        ),
    ];
    for (spec, want) in cases {
        assert_eq!(write_errors(spec.clone()), want, "{spec}");
    }
    // without the policy's name, keys are checked alone
    let errors = Policy::compile(
        &json!({"failurePolicy": "Fail", "auditAnnotations": [{"key": "a/b", "valueExpression": "'v'"}]}),
        &Path::new("spec"),
    )
    .err()
    .unwrap_or_default();
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].field, "spec.auditAnnotations[0].key");
}
