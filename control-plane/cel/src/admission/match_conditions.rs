//! Webhook and policy `matchConditions` (upstream `webhook/matchconditions/matcher.go`, and
//! `validateMatchConditions` of `admissionregistration/validation`): boolean conditions that
//! must all hold for a webhook to be called or a policy to apply.

use std::collections::HashSet;
use std::sync::Arc;

use flotilla_api_machinery::field::{ErrorType, FieldError, Path, aggregate_messages};
use flotilla_api_machinery::names::is_qualified_name;
use serde_json::json;

use super::{AdmissionExpressions, AdmissionInputs, Composition, ExpressionKind, ExpressionValue};
use crate::limits::RUNTIME_CEL_COST_BUDGET_MATCH_CONDITIONS;

/// The most conditions one webhook or policy may have.
const MAX_MATCH_CONDITIONS: usize = 64;

/// Compiled `matchConditions` (upstream `matchconditions.Matcher`).
pub struct MatchConditions {
    names: Vec<String>,
    expressions: AdmissionExpressions,
}

/// What evaluating the conditions found (upstream `MatchResult`, before the failure policy
/// is applied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatchResult {
    /// Whether no condition was false and none failed.
    pub matches: bool,
    /// The first condition that was false.
    pub failed_condition: Option<String>,
    /// Why conditions could not be evaluated, when none was false: the caller's
    /// `failurePolicy` decides (`Fail` rejects the request, `Ignore` skips the webhook).
    pub error: Option<String>,
}

impl MatchConditions {
    /// Checks and compiles a webhook's `(name, expression)` conditions being written, errors at
    /// `base` (e.g. `webhooks[0].matchConditions`). Webhook conditions have no `params`.
    pub fn compile(
        conditions: &[(&str, &str)],
        base: &Path,
    ) -> Result<MatchConditions, Vec<FieldError>> {
        let errors = validate_match_conditions(conditions, false, base);
        if errors.is_empty() {
            Ok(MatchConditions::new(conditions))
        } else {
            Err(errors)
        }
    }

    /// Compiles stored conditions; one that does not compile fails when evaluated.
    pub fn new(conditions: &[(&str, &str)]) -> MatchConditions {
        MatchConditions::with(conditions, &Arc::new(Composition::new(false)))
    }

    /// Compiles conditions against a policy's declarations.
    pub(crate) fn with(
        conditions: &[(&str, &str)],
        composition: &Arc<Composition>,
    ) -> MatchConditions {
        let expressions: Vec<&str> = conditions.iter().map(|(_, e)| e.trim()).collect();
        MatchConditions {
            names: conditions.iter().map(|(n, _)| (*n).to_string()).collect(),
            expressions: composition.compile(&expressions, ExpressionKind::Condition),
        }
    }

    /// Whether there are no conditions, which always match.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Evaluates every condition (upstream `Match`): any false one means no match, even if
    /// others failed; otherwise a failed one is an error; otherwise a match.
    pub fn matches(&self, inputs: &AdmissionInputs<'_>) -> MatchResult {
        let evaluation = match self
            .expressions
            .evaluate(inputs, RUNTIME_CEL_COST_BUDGET_MATCH_CONDITIONS)
        {
            Ok(evaluation) => evaluation,
            Err(out_of_budget) => {
                return MatchResult {
                    matches: false,
                    failed_condition: None,
                    error: Some(out_of_budget.to_string()),
                };
            }
        };
        let mut errors: Vec<String> = Vec::new();
        for (name, result) in self.names.iter().zip(evaluation.results) {
            match result {
                Ok(ExpressionValue::Bool(false)) => {
                    return MatchResult {
                        matches: false,
                        failed_condition: Some(name.clone()),
                        error: None,
                    };
                }
                Ok(_) => {}
                Err(message) => {
                    // upstream's aggregate prints each distinct message once
                    if !errors.contains(&message) {
                        errors.push(message);
                    }
                }
            }
        }
        if errors.is_empty() {
            MatchResult {
                matches: true,
                failed_condition: None,
                error: None,
            }
        } else {
            MatchResult {
                matches: false,
                failed_condition: None,
                error: Some(aggregate_messages(&errors)),
            }
        }
    }

    /// [`MatchConditions::matches`] as whether to call the webhook, or the error its
    /// `failurePolicy` decides on.
    pub fn evaluate(&self, inputs: &AdmissionInputs<'_>) -> Result<bool, String> {
        let result = self.matches(inputs);
        match result.error {
            Some(error) => Err(error),
            None => Ok(result.matches),
        }
    }
}

/// Upstream `validateMatchConditions`: at most 64, each with a qualified, unique `name` and an
/// `expression` that compiles to a bool (with `params` for policies that have a `paramKind`).
pub fn validate_match_conditions(
    conditions: &[(&str, &str)],
    has_params: bool,
    base: &Path,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if conditions.len() > MAX_MATCH_CONDITIONS {
        errors.push(FieldError {
            error_type: ErrorType::TooMany,
            field: base.to_string(),
            bad_value: Some(json!(conditions.len())),
            detail: format!("must have at most {MAX_MATCH_CONDITIONS} items"),
        });
    }
    // upstream checks match conditions without variables, even in a policy that has some
    let composition = Arc::new(Composition::new(has_params));
    let mut names = HashSet::new();
    for (i, (name, expression)) in conditions.iter().enumerate() {
        let path = base.index(i);
        let trimmed = expression.trim();
        if trimmed.is_empty() {
            errors.push(FieldError::required(&path.child("expression"), ""));
        } else if let Some(error) = composition
            .compile_one(trimmed, ExpressionKind::Condition)
            .error
        {
            errors.push(FieldError::invalid(
                &path.child("expression"),
                trimmed,
                error.detail,
            ));
        }
        if name.is_empty() {
            errors.push(FieldError::required(&path.child("name"), ""));
        } else {
            for message in is_qualified_name(name) {
                errors.push(FieldError::invalid(&path.child("name"), *name, message));
            }
        }
        if !name.is_empty() && !names.insert(*name) {
            errors.push(FieldError::duplicate(&path.child("name"), *name));
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// `(name, expression)` pairs.
    type Conditions<'a> = Vec<(&'a str, &'a str)>;

    fn request() -> Value {
        json!({"operation": "CREATE", "userInfo": {"username": "alice", "groups": ["dev"]}})
    }

    #[test]
    fn any_false_condition_means_no_match() {
        let object = json!({"metadata": {"name": "web", "labels": {"tier": "frontend"}}});
        let request = request();
        let inputs = AdmissionInputs {
            object: Some(&object),
            old_object: None,
            request: &request,
            params: None,
            namespace_object: None,
            authorizer: None,
        };
        // (conditions, evaluate's result, failed condition)
        let cases: Vec<(Conditions<'_>, Result<bool, &str>, Option<&str>)> = vec![
            (vec![], Ok(true), None),
            (
                vec![
                    ("is-create", "request.operation == 'CREATE'"),
                    ("frontend", "object.metadata.labels.tier == 'frontend'"),
                ],
                Ok(true),
                None,
            ),
            (
                vec![
                    ("is-create", "request.operation == 'CREATE'"),
                    ("not-alice", "request.userInfo.username != 'alice'"),
                ],
                Ok(false),
                Some("not-alice"),
            ),
            // an error alone leaves the decision to the failure policy...
            (
                vec![("missing", "object.spec.replicas > 1")],
                Err("expression 'object.spec.replicas > 1' resulted in error: no such key: spec"),
                None,
            ),
            // ...but a false condition wins over errors
            (
                vec![
                    ("missing", "object.spec.replicas > 1"),
                    ("never", "request.operation == 'DELETE'"),
                ],
                Ok(false),
                Some("never"),
            ),
            (
                vec![
                    ("a", "object.spec.a"),
                    ("b", "object.spec.b == 1"),
                    ("c", "object.spec.b == 1"),
                ],
                Err(
                    "[compilation error: must evaluate to bool but got dyn, expression 'object.spec.b == 1' resulted in error: no such key: spec]",
                ),
                None,
            ),
        ];
        for (conditions, want, failed) in cases {
            let matcher = MatchConditions::new(&conditions);
            let got = matcher.evaluate(&inputs);
            assert_eq!(got, want.map_err(str::to_string), "{conditions:?}");
            assert_eq!(
                matcher.matches(&inputs).failed_condition.as_deref(),
                failed,
                "{conditions:?}"
            );
        }
    }

    #[test]
    fn webhook_writes_report_upstream_errors() {
        let base = Path::new("webhooks").index(0).child("matchConditions");
        let long = "x".repeat(64);
        let cases: Vec<(Conditions<'_>, Vec<String>)> = vec![
            (vec![("ok", "request.name == 'a'")], vec![]),
            (
                vec![("", "  ")],
                vec![
                    "webhooks[0].matchConditions[0].expression: Required value".to_string(),
                    "webhooks[0].matchConditions[0].name: Required value".to_string(),
                ],
            ),
            (
                vec![("a", "true"), ("a", "false")],
                vec![
                    "webhooks[0].matchConditions[1].name: Duplicate value: \"a\"".to_string(),
                ],
            ),
            (
                vec![(long.as_str(), "true")],
                vec![format!(
                    "webhooks[0].matchConditions[0].name: Invalid value: \"{long}\": name part must be no more than 63 characters"
                )],
            ),
            (
                vec![("p", "params.x == 1")],
                vec![
                    "webhooks[0].matchConditions[0].expression: Invalid value: \"params.x == 1\": compilation failed: ERROR: <input>:1:1: undeclared reference to 'params' (in container '')\n | params.x == 1\n | ^".to_string(),
                ],
            ),
            (
                vec![("s", "'yes'")],
                vec![
                    "webhooks[0].matchConditions[0].expression: Invalid value: \"'yes'\": must evaluate to bool but got string".to_string(),
                ],
            ),
            (
                vec![("authz", "authorizer.group('apps').check('get').allowed()")],
                vec![
                    "webhooks[0].matchConditions[0].expression: Invalid value: \"authorizer.group('apps').check('get').allowed()\": compilation failed: ERROR: <input>:1:31: found no matching overload for 'check' applied to 'kubernetes.authorization.GroupCheck.(string)'\n | authorizer.group('apps').check('get').allowed()\n | ..............................^".to_string(),
                ],
            ),
        ];
        for (conditions, want) in cases {
            let got: Vec<String> = match MatchConditions::compile(&conditions, &base) {
                Ok(_) => Vec::new(),
                Err(errors) => errors.iter().map(ToString::to_string).collect(),
            };
            assert_eq!(got, want, "{conditions:?}");
        }
        let many: Vec<(String, &str)> = (0..65).map(|i| (format!("c{i}"), "true")).collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(n, e)| (n.as_str(), *e)).collect();
        let errors = validate_match_conditions(&many, false, &base);
        assert_eq!(
            errors.first().map(ToString::to_string).as_deref(),
            Some("webhooks[0].matchConditions: Too many: 65: must have at most 64 items")
        );
    }
}
