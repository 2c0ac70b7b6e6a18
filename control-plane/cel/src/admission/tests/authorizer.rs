//! The `authorizer` library in admission expressions: where it is declared, which chains
//! type-check (with upstream's errors for those that do not), its fixed cost, and evaluation
//! against a fake authorizer that records what it was asked.

use std::sync::{Arc, Mutex};

use flotilla_api_machinery::rbac::{Attributes, UserInfo};
use serde_json::json;

use super::*;
use crate::library::authz::Listed;

#[test]
fn compiles_authorizer_chains_where_upstream_declares_them() {
    use ExpressionKind::*;
    let conditions = [
        "authorizer.group('apps').resource('deployments').check('create').allowed()",
        "authorizer.path('/healthz').check('get').allowed()",
        "authorizer.serviceAccount('ns', 'sa').group('').resource('pods').check('list').reason() == ''",
        "authorizer.group('').resource('pods').subresource('log').namespace('ns').name('web').check('get').errored()",
        "authorizer.group('').resource('pods').fieldSelector('spec.nodeName=n').labelSelector('a=b').check('list').allowed()",
        "authorizer.requestResource.check('update').allowed()",
        "authorizer.requestResource.subresource('status').check('get').error() == ''",
        "type(authorizer.path('/x').check('get')) == kubernetes.authorization.Decision",
    ];
    for expression in conditions {
        assert_eq!(
            compile_error(expression, Condition, false),
            None,
            "{expression}"
        );
    }
    for (expression, kind) in [
        (
            "authorizer.path('/healthz').check('get').reason()",
            AuditValue,
        ),
        (
            "authorizer.group('').resource('secrets').check('list')",
            Variable,
        ),
        ("authorizer.requestResource", Variable),
    ] {
        assert_eq!(compile_error(expression, kind, false), None, "{expression}");
    }
    // a variable's decision is `dyn` to what reads it, as upstream's composition makes it
    let composed = AdmissionExpressions::compile(
        &["variables.may.allowed()"],
        Condition,
        &[("may", "authorizer.group('').resource('pods').check('get')")],
        false,
    );
    assert!(composed.compile_errors().is_empty());
    assert!(composed.variable_errors().is_empty());
}

#[test]
fn refuses_bad_chains_with_upstreams_errors() {
    use ExpressionKind::*;
    let error = |expression: &str, message: &str, column: usize| {
        format!(
            "compilation failed: ERROR: <input>:1:{column}: {message}\n | {expression}\n | {}^",
            ".".repeat(column - 1)
        )
    };
    let cases: Vec<(&str, ExpressionKind, String)> = vec![
        (
            "authorizer.group('apps').check('get').allowed()",
            Condition,
            error(
                "authorizer.group('apps').check('get').allowed()",
                "found no matching overload for 'check' applied to 'kubernetes.authorization.GroupCheck.(string)'",
                31,
            ),
        ),
        (
            "authorizer.path('/x').allowed()",
            Condition,
            error(
                "authorizer.path('/x').allowed()",
                "found no matching overload for 'allowed' applied to 'kubernetes.authorization.PathCheck.()'",
                30,
            ),
        ),
        (
            "authorizer.group(1).resource('pods').check('get').allowed()",
            Condition,
            error(
                "authorizer.group(1).resource('pods').check('get').allowed()",
                "found no matching overload for 'group' applied to 'kubernetes.authorization.Authorizer.(int)'",
                17,
            ),
        ),
        (
            "authorizer.serviceAccount('ns').path('/x').check('get').allowed()",
            Condition,
            error(
                "authorizer.serviceAccount('ns').path('/x').check('get').allowed()",
                "found no matching overload for 'serviceAccount' applied to 'kubernetes.authorization.Authorizer.(string)'",
                26,
            ),
        ),
        (
            "authorizer.group('').resource('pods').check('get')",
            Condition,
            "must evaluate to bool but got kubernetes.authorization.Decision".to_string(),
        ),
        // a validation's messageExpression has no authorizer upstream
        (
            "authorizer.requestResource.check('get').reason()",
            Message,
            error(
                "authorizer.requestResource.check('get').reason()",
                "undeclared reference to 'authorizer' (in container '')",
                1,
            ),
        ),
    ];
    for (expression, kind, want) in cases {
        assert_eq!(
            compile_error(expression, kind, false).as_deref(),
            Some(want.as_str()),
            "{expression}"
        );
    }
}

#[test]
fn a_check_costs_what_upstream_charges() {
    let compiled = AdmissionExpressions::compile(
        &[
            "authorizer.group('').resource('pods').check('list').allowed()",
            "authorizer.path('/a').check('get').allowed() || authorizer.path('/b').check('get').allowed()",
            "authorizer.path('/a').check('get').allowed() || authorizer.path('/b').check('get').allowed() || authorizer.path('/c').check('get').allowed()",
        ],
        ExpressionKind::Condition,
        &[],
        false,
    );
    // the variable 1, three builders 1 each, the check 350000, `allowed` 1
    assert_eq!(compiled.estimated_cost(0), Some(350_004));
    // two checks fit in the per-call limit, a third does not
    let request = request();
    let object = json!({});
    let results = results(compiled.evaluate(&inputs(&object, &request), 10_000_000));
    assert_eq!(results[1], Ok(ExpressionValue::Bool(false)));
    assert!(
        results[2]
            .as_ref()
            .is_err_and(|e| e.ends_with("operation cancelled: actual cost limit exceeded")),
        "{results:?}"
    );
}

#[test]
fn checks_are_made_as_the_requesting_user() {
    let recording = Arc::new(Listed {
        allowed: vec!["get /logs", "update apps/deployments"],
        asked: Mutex::new(Vec::new()),
    });
    let authorizer: Arc<dyn RequestAuthorizer> = recording.clone();
    let mut request = request();
    request["userInfo"]["extra"] = json!({"scopes": ["a", "b"]});
    request["requestResource"] = request["resource"].clone();
    request["requestSubResource"] = json!("scale");
    let object = deployment(1);
    let compiled = AdmissionExpressions::compile(
        &[
            "authorizer.group('').resource('secrets').namespace(object.metadata.name).check('list').allowed()",
            "authorizer.requestResource.check('update').allowed()",
            "authorizer.path('/logs').check('get').reason()",
            "variables.sa.errored()",
        ],
        ExpressionKind::Variable,
        &[(
            "sa",
            "authorizer.serviceAccount('default', 'builder').group('apps').resource('deployments').check('update')",
        )],
        false,
    );
    let inputs = AdmissionInputs {
        authorizer: Some(&authorizer),
        ..inputs(&object, &request)
    };
    assert_eq!(
        results(compiled.evaluate(&inputs, 10_000_000)),
        vec![
            Ok(ExpressionValue::Bool(false)),
            Ok(ExpressionValue::Bool(true)),
            Ok(ExpressionValue::String("allowed to get /logs".to_string())),
            Ok(ExpressionValue::Bool(false)),
        ]
    );
    let asked = recording
        .asked
        .lock()
        .map(|asked| asked.clone())
        .unwrap_or_default();
    let alice = UserInfo {
        name: "alice".to_string(),
        groups: vec!["dev".to_string()],
        extra: [("scopes".to_string(), vec!["a".to_string(), "b".to_string()])].into(),
        ..UserInfo::default()
    };
    let resource =
        |verb: &str, group: &str, resource: &str, sub: &str, namespace: &str| Attributes {
            user: alice.clone(),
            verb: verb.to_string(),
            namespace: namespace.to_string(),
            api_group: group.to_string(),
            api_version: "*".to_string(),
            resource: resource.to_string(),
            subresource: sub.to_string(),
            name: String::new(),
            resource_request: true,
            path: String::new(),
        };
    assert_eq!(asked.len(), 4);
    assert_eq!(asked[0], resource("list", "", "secrets", "", "web"));
    // the request's own resource, as it was asked
    assert_eq!(
        asked[1],
        Attributes {
            name: "web".to_string(),
            ..resource("update", "apps", "deployments", "scale", "default")
        }
    );
    assert_eq!(
        asked[2],
        Attributes {
            user: alice.clone(),
            verb: "get".to_string(),
            path: "/logs".to_string(),
            ..Attributes::default()
        }
    );
    assert_eq!(
        asked[3],
        Attributes {
            user: UserInfo::service_account("default", "builder"),
            ..resource("update", "apps", "deployments", "", "")
        }
    );
}

#[test]
fn without_an_authorizer_checks_are_errored_denials() {
    let request = request();
    let object = json!({});
    let compiled = AdmissionExpressions::compile(
        &[
            "authorizer.requestResource.check('get').allowed()",
            "authorizer.requestResource.check('get').error()",
        ],
        ExpressionKind::Variable,
        &[],
        false,
    );
    assert_eq!(
        results(compiled.evaluate(&inputs(&object, &request), 10_000_000)),
        vec![
            Ok(ExpressionValue::Bool(false)),
            Ok(ExpressionValue::String(
                "no authorizer is available to check this request".to_string()
            )),
        ]
    );
}

#[test]
fn a_policy_denies_who_may_not_and_admits_who_may() {
    let spec = json!({
        "failurePolicy": "Fail",
        "matchConditions": [{"name": "may-get", "expression": "authorizer.requestResource.check('get').allowed()"}],
        "validations": [{
            "expression": "authorizer.group('').resource('secrets').namespace(object.metadata.name).check('list').allowed()",
            "messageExpression": "'no secrets for ' + request.userInfo.username",
        }],
        "auditAnnotations": [{"key": "decision", "valueExpression": "authorizer.path('/logs').check('get').reason()"}],
    });
    let policy = Policy::compile(&spec, &flotilla_api_machinery::field::Path::new("spec"))
        .unwrap_or_else(|errors| panic!("{}", flotilla_api_machinery::field::aggregate(&errors)));
    let request = request();
    let object = deployment(1);
    let decide = |allowed: Vec<&'static str>| {
        let authorizer: Arc<dyn RequestAuthorizer> = Arc::new(Listed {
            allowed,
            asked: Mutex::new(Vec::new()),
        });
        policy.evaluate(&AdmissionInputs {
            authorizer: Some(&authorizer),
            ..inputs(&object, &request)
        })
    };
    let skipped = decide(vec![]);
    assert!(!skipped.matched);
    let denied = decide(vec!["get apps/deployments"]);
    let messages: Vec<&str> = denied.denials().map(|d| d.message.as_str()).collect();
    assert_eq!(messages, ["no secrets for alice"]);
    let admitted = decide(vec!["get apps/deployments", "list /secrets", "get /logs"]);
    assert_eq!(admitted.denials().count(), 0);
    assert_eq!(admitted.audit_annotations[0].value, "allowed to get /logs");

    // a validation's messageExpression has no authorizer, upstream as here
    let mut bad = spec.clone();
    bad["validations"][0]["messageExpression"] =
        json!("authorizer.path('/x').check('get').reason()");
    let errors = Policy::compile(&bad, &flotilla_api_machinery::field::Path::new("spec"))
        .err()
        .unwrap_or_default();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0]
            .to_string()
            .starts_with("spec.validations[0].messageExpression: Invalid value"),
        "{}",
        errors[0]
    );
}
