//! Tables for admission expressions: upstream's `compile_test.go` cases (declared variables,
//! request and namespace shapes, result types), variable composition and cost limits. The
//! ValidatingAdmissionPolicy tables are in `policy`.

mod authorizer;
mod policy;

use serde_json::{Value, json};

use super::*;

#[test]
fn compiled_expressions_can_be_shared_across_requests() {
    fn shared<T: Send + Sync>() {}
    shared::<AdmissionExpressions>();
    shared::<MatchConditions>();
    shared::<Policy>();
}

fn compile_error(expression: &str, kind: ExpressionKind, has_params: bool) -> Option<String> {
    let compiled = AdmissionExpressions::compile(&[expression], kind, &[], has_params);
    compiled
        .compile_errors()
        .first()
        .map(|(_, e)| e.detail.clone())
}

#[test]
fn compiles_what_upstream_compiles() {
    let expressions = [
        "object.foo < params.x",
        "namespaceObject.metadata.name.startsWith('test')",
        "object.foo == oldObject.foo",
        "object == null || oldObject == null || object.foo == oldObject.foo",
        "object.spec.string.matches('[0-9]+')",
        "object.spec.string.findAll('[0-9]+').size() > 0",
        "object.spec.list.isSorted()",
        "url(object.spec.endpoint).getHostname() in ['ok1', 'ok2']",
        "request.kind.group == 'example.com' && request.kind.version == 'v1' && request.kind.kind == 'Fake'",
        "request.resource.resource == 'fake' && request.subResource == 'scale'",
        "request.requestKind.kind == 'Fake' && request.requestResource.group == ''",
        "request.requestSubResource == 'scale' && request.name == 'fake-name'",
        "request.namespace == 'fake-namespace' && request.operation == 'CREATE'",
        "request.userInfo.username == 'admin' && request.userInfo.uid == '014fbff9a07c'",
        "request.userInfo.groups == ['system:authenticated', 'my-admin-group']",
        "request.userInfo.extra == {'some-key': ['some-value1', 'some-value2']}",
        "request.dryRun == false",
        "request.options == {'whatever': 'you want'}",
        "namespaceObject.metadata != null",
        "'test' in namespaceObject.metadata.labels",
        "namespaceObject.metadata.UID == '12345'",
        "type(namespaceObject.metadata.creationTimestamp) == google.protobuf.Timestamp",
        "namespaceObject.metadata.deletionGracePeriodSeconds == 5",
        "namespaceObject.spec.finalizers[0] == 'testEnv'",
        "namespaceObject.status.conditions[0].reason == 'Invalid'",
        "type(namespaceObject.status.conditions[0].lastTransitionTime) == google.protobuf.Timestamp",
    ];
    for expression in expressions {
        assert_eq!(
            compile_error(expression, ExpressionKind::Condition, true),
            None,
            "{expression}"
        );
        // as upstream's test does: the same, as an audit annotation value
        let value = format!("string({expression})");
        assert_eq!(
            compile_error(&value, ExpressionKind::AuditValue, true),
            None,
            "{value}"
        );
    }
}

#[test]
fn reports_compile_errors_in_upstream_text() {
    use ExpressionKind::*;
    // (expression, kind, has params, upstream's error)
    let cases: &[(&str, ExpressionKind, bool, &str)] = &[
        (
            "1 < 'asdf'",
            Condition,
            false,
            "compilation failed: ERROR: <input>:1:3: found no matching overload for '_<_' applied to '(int, string)'\n | 1 < 'asdf'\n | ..^",
        ),
        (
            "'asdf'.contains('x'",
            Condition,
            false,
            "compilation failed: ERROR: <input>:1:20: Syntax error: missing ')' at '<EOF>'\n | 'asdf'.contains('x'\n | ...................^",
        ),
        (
            "object.foo < params.x",
            Condition,
            false,
            "compilation failed: ERROR: <input>:1:14: undeclared reference to 'params' (in container '')\n | object.foo < params.x\n | .............^",
        ),
        (
            "object.foo < invalid.x",
            Condition,
            false,
            "compilation failed: ERROR: <input>:1:14: undeclared reference to 'invalid' (in container '')\n | object.foo < invalid.x\n | .............^",
        ),
        (
            "request.foo1 == 'nope'",
            Condition,
            false,
            "compilation failed: ERROR: <input>:1:8: undefined field 'foo1'\n | request.foo1 == 'nope'\n | .......^",
        ),
        (
            "request.userInfo.foo5 == 'nope'",
            Condition,
            false,
            "compilation failed: ERROR: <input>:1:17: undefined field 'foo5'\n | request.userInfo.foo5 == 'nope'\n | ................^",
        ),
        (
            "namespaceObject.status.conditions[0].foo5 == 'nope'",
            Condition,
            false,
            "compilation failed: ERROR: <input>:1:37: undefined field 'foo5'\n | namespaceObject.status.conditions[0].foo5 == 'nope'\n | ....................................^",
        ),
        (
            "authorizer.group('') != null",
            Message,
            false,
            "compilation failed: ERROR: <input>:1:1: undeclared reference to 'authorizer' (in container '')\n | authorizer.group('') != null\n | ^",
        ),
        (
            "variables.x",
            Condition,
            false,
            "compilation failed: ERROR: <input>:1:1: undeclared reference to 'variables' (in container '')\n | variables.x\n | ^",
        ),
        // upstream wants exactly the declared type: `dyn` is not a bool
        (
            "object.spec.enabled",
            Condition,
            false,
            "must evaluate to bool but got dyn",
        ),
        (
            "size(object.spec)",
            Message,
            false,
            "must evaluate to string but got int",
        ),
        (
            "object.spec.replicas > 5",
            AuditValue,
            false,
            "must evaluate to one of [string null_type] but got bool",
        ),
    ];
    for (expression, kind, has_params, want) in cases {
        assert_eq!(
            compile_error(expression, *kind, *has_params).as_deref(),
            Some(*want),
            "{expression}"
        );
    }
    // what a dyn operand becomes when only one overload fits it
    for (expression, kind) in [
        ("'replicas: ' + string(object.spec.replicas)", Message),
        ("object.metadata.name + ' is too big'", Message),
        ("object.spec.replicas > 5 ? 'big' : null", AuditValue),
        ("null", AuditValue),
    ] {
        assert_eq!(compile_error(expression, kind, false), None, "{expression}");
    }
}

fn request() -> Value {
    json!({
        "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "name": "web",
        "namespace": "default",
        "operation": "CREATE",
        "userInfo": {"username": "alice", "groups": ["dev"]},
        "dryRun": false,
    })
}

fn deployment(replicas: i64) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"env": "prod"}},
        "spec": {"replicas": replicas, "template": {"spec": {"containers": [
            {"name": "app", "image": "registry.example.com/app:1.2"},
            {"name": "sidecar", "image": "docker.io/proxy:latest"},
        ]}}},
    })
}

fn inputs<'a>(object: &'a Value, request: &'a Value) -> AdmissionInputs<'a> {
    AdmissionInputs {
        object: Some(object),
        old_object: None,
        request,
        params: None,
        namespace_object: None,
        authorizer: None,
    }
}

fn results(evaluation: Result<Evaluation, OutOfBudget>) -> Vec<Result<ExpressionValue, String>> {
    evaluation.map_or_else(|e| vec![Err(e.to_string())], |e| e.results)
}

#[test]
fn composes_variables_lazily_in_declaration_order() {
    let variables = [
        ("containers", "object.spec.template.spec.containers"),
        (
            "untrusted",
            "variables.containers.filter(c, !c.image.startsWith('registry.example.com/'))",
        ),
        ("count", "size(variables.untrusted)"),
        // fails when read, and only then
        ("broken", "object.spec.missing.field"),
        ("bad", "1 + 'a'"),
    ];
    let expressions = [
        "variables.count == 0",
        "variables.untrusted.map(c, c.name) == ['sidecar']",
        "request.operation == 'CREATE'",
        "variables.broken == 1",
        "variables.bad == 2",
        "has(variables.count)",
    ];
    let compiled =
        AdmissionExpressions::compile(&expressions, ExpressionKind::Condition, &variables, false);
    assert_eq!(compiled.compile_errors(), Vec::new());
    assert_eq!(
        compiled
            .variable_errors()
            .iter()
            .map(|(n, _)| *n)
            .collect::<Vec<_>>(),
        ["bad"]
    );
    let object = deployment(3);
    let request = request();
    assert_eq!(
        results(compiled.evaluate(&inputs(&object, &request), 1_000_000)),
        vec![
            Ok(ExpressionValue::Bool(false)),
            Ok(ExpressionValue::Bool(true)),
            Ok(ExpressionValue::Bool(true)),
            Err("expression 'variables.broken == 1' resulted in error: composited variable \"broken\" fails to evaluate: no such key: missing".to_string()),
            Err("expression 'variables.bad == 2' resulted in error: composited variable \"bad\" fails to compile: compilation failed: ERROR: <input>:1:3: found no matching overload for '_+_' applied to '(int, string)'\n | 1 + 'a'\n | ..^".to_string()),
            Ok(ExpressionValue::Bool(true)),
        ]
    );
    // a variable is typed by its expression: `count` is an int
    let typed = AdmissionExpressions::compile(
        &["variables.count == 'none'"],
        ExpressionKind::Condition,
        &variables,
        false,
    );
    assert_eq!(
        typed
            .compile_errors()
            .first()
            .map(|(_, e)| e.detail.as_str()),
        Some(
            "compilation failed: ERROR: <input>:1:17: found no matching overload for '_==_' applied to '(int, string)'\n | variables.count == 'none'\n | ................^"
        )
    );
    // and only earlier variables are visible to a variable
    let forward = AdmissionExpressions::compile(
        &["variables.a"],
        ExpressionKind::Variable,
        &[("a", "variables.b"), ("b", "1")],
        false,
    );
    assert_eq!(
        forward
            .variable_errors()
            .first()
            .map(|(_, e)| e.detail.as_str()),
        Some(
            "compilation failed: ERROR: <input>:1:10: undefined field 'b'\n | variables.b\n | .........^"
        )
    );
}

#[test]
fn binds_inputs_and_nulls() {
    let request = request();
    let params = json!({"data": {"maxReplicas": "5"}});
    let namespace = json!({"metadata": {"name": "default", "labels": {"team": "a"}}});
    let expressions = [
        "object == null",
        "oldObject.spec.replicas",
        "int(params.data.maxReplicas)",
        "namespaceObject.metadata.labels.team",
        "request.userInfo.groups[0]",
        "params == null",
    ];
    let compiled = AdmissionExpressions::compile(&expressions, ExpressionKind::Variable, &[], true);
    let old = deployment(2);
    let with_params = AdmissionInputs {
        object: None,
        old_object: Some(&old),
        request: &request,
        params: Some(&params),
        namespace_object: Some(&namespace),
        authorizer: None,
    };
    assert_eq!(
        results(compiled.evaluate(&with_params, 1_000_000)),
        vec![
            Ok(ExpressionValue::Bool(true)),
            Ok(ExpressionValue::Other("int".to_string())),
            Ok(ExpressionValue::Other("int".to_string())),
            Ok(ExpressionValue::String("a".to_string())),
            Ok(ExpressionValue::String("dev".to_string())),
            Ok(ExpressionValue::Bool(false)),
        ]
    );
    let without_params = AdmissionInputs {
        params: None,
        ..with_params
    };
    let last = results(compiled.evaluate(&without_params, 1_000_000)).pop();
    assert_eq!(last, Some(Ok(ExpressionValue::Bool(true))));
}

#[test]
fn charges_cost_against_the_budget() {
    let request = request();
    let items: Vec<i64> = (0..2000).collect();
    let object = json!({"spec": {"items": items}});
    // each element visits every element: 2000 * 2000 steps, over the per-call limit
    let quadratic = "object.spec.items.all(a, object.spec.items.exists(b, a == b))";
    let compiled = AdmissionExpressions::compile(
        &[quadratic, "object.spec.items.all(a, a >= 0)", "variables.v"],
        ExpressionKind::Condition,
        &[("v", quadratic)],
        false,
    );
    let evaluation = compiled.evaluate(&inputs(&object, &request), 10_000_000);
    let results = results(evaluation.clone());
    assert_eq!(
        results[0],
        Err(format!(
            "expression '{quadratic}' resulted in error: operation cancelled: actual cost limit exceeded"
        ))
    );
    assert_eq!(results[1], Ok(ExpressionValue::Bool(true)));
    assert_eq!(
        results[2],
        Err("expression 'variables.v' resulted in error: composited variable \"v\" fails to evaluate: operation cancelled: actual cost limit exceeded".to_string())
    );
    let spent = 10_000_000 - evaluation.map_or(0, |e| e.remaining_budget);
    assert!(spent > 2 * 1_000_000, "{spent}");
    // a budget smaller than what an expression costs stops everything
    assert_eq!(
        compiled.evaluate(&inputs(&object, &request), 100).err(),
        Some(OutOfBudget)
    );
}
