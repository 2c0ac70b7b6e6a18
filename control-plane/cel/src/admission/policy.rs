//! ValidatingAdmissionPolicy evaluation (upstream `policy/validating`: `validator.go`,
//! `policy_decision.go`): match conditions, then validations with their messages, then audit
//! annotations, each failure turned into a decision by the policy's `failurePolicy`.
//!
//! Bindings, parameter lookup and the final `Status` are the caller's: one [`Decision`] is the
//! result of one policy for one parameter object.

use flotilla_api_machinery::field::{FieldError, Path};
use serde_json::Value;

use super::match_conditions::MatchConditions;
use super::{AdmissionExpressions, AdmissionInputs, ExpressionValue, spec};
use crate::limits::{MAX_EVALUATED_MESSAGE_EXPRESSION_SIZE_BYTES, RUNTIME_CEL_COST_BUDGET};

/// What happens when an expression cannot be evaluated (`failurePolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicy {
    /// The request is denied (the default).
    Fail,
    /// The failure is ignored.
    Ignore,
}

impl FailurePolicy {
    /// Upstream `policyDecisionActionForError`.
    fn action(self) -> PolicyDecisionAction {
        match self {
            FailurePolicy::Ignore => PolicyDecisionAction::Admit,
            FailurePolicy::Fail => PolicyDecisionAction::Deny,
        }
    }

    /// Upstream `auditAnnotationEvaluationForError`.
    fn audit_action(self) -> AuditAnnotationAction {
        match self {
            FailurePolicy::Ignore => AuditAnnotationAction::Exclude,
            FailurePolicy::Fail => AuditAnnotationAction::Error,
        }
    }
}

/// Whether a decision admits or denies (upstream `PolicyDecisionAction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyDecisionAction {
    /// Let the request through.
    Admit,
    /// Reject the request (or warn or audit, as the binding's `validationActions` say).
    Deny,
}

/// How a decision came about (upstream `PolicyDecisionEvaluation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyDecisionEvaluation {
    /// The validation held.
    Admit,
    /// The validation was false.
    Deny,
    /// The validation could not be evaluated; the action is the failure policy's.
    Error,
}

/// The outcome of one validation (upstream `PolicyDecision`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyDecision {
    /// What to do.
    pub action: PolicyDecisionAction,
    /// Why.
    pub evaluation: PolicyDecisionEvaluation,
    /// Why it denied, or what failed.
    pub message: String,
    /// The validation's `reason` for a denial (`Invalid` unless given); `None` for errors, which
    /// upstream reports as `Invalid` too.
    pub reason: Option<String>,
}

impl PolicyDecision {
    /// The HTTP status code a denial by this decision carries.
    pub fn code(&self) -> u16 {
        reason_to_code(self.reason.as_deref().unwrap_or("Invalid"))
    }

    fn error(failure_policy: FailurePolicy, message: String) -> PolicyDecision {
        PolicyDecision {
            action: failure_policy.action(),
            evaluation: PolicyDecisionEvaluation::Error,
            message,
            reason: None,
        }
    }
}

/// Upstream `reasonToCode`: the HTTP status of a `Status` with this reason.
pub fn reason_to_code(reason: &str) -> u16 {
    match reason {
        "Forbidden" => 403,
        "Unauthorized" => 401,
        "RequestEntityTooLarge" => 413,
        // `Invalid`, and anything the API does not allow
        _ => 422,
    }
}

/// What to do with an audit annotation (upstream `PolicyAuditAnnotationAction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuditAnnotationAction {
    /// Record it with the audit event.
    Publish,
    /// The expression failed under `failurePolicy: Fail`: the request is denied.
    Error,
    /// Nothing to record: the value was null or empty, or the expression failed under `Ignore`.
    Exclude,
}

/// The outcome of one audit annotation (upstream `PolicyAuditAnnotation`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyAuditAnnotation {
    /// The annotation's key, which the caller publishes as `<policy name>/<key>`.
    pub key: String,
    /// The trimmed value, when published.
    pub value: String,
    /// What to do with it.
    pub action: AuditAnnotationAction,
    /// Why it failed, when it did.
    pub error: String,
}

/// One policy's verdict on one request (upstream `ValidateResult`, plus whether the match
/// conditions let the policy apply).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the policy applied: false when a match condition was false, or failed under
    /// `failurePolicy: Ignore`; nothing else ran then.
    pub matched: bool,
    /// The match condition that was false.
    pub failed_condition: Option<String>,
    /// One per validation in order, or a single error decision when evaluation could not go
    /// on (a failed match condition under `Fail`, an exhausted budget).
    pub decisions: Vec<PolicyDecision>,
    /// One per audit annotation in order.
    pub audit_annotations: Vec<PolicyAuditAnnotation>,
}

impl Decision {
    fn unmatched(failed_condition: Option<String>) -> Decision {
        Decision {
            matched: false,
            failed_condition,
            decisions: Vec::new(),
            audit_annotations: Vec::new(),
        }
    }

    fn error(failure_policy: FailurePolicy, message: String) -> Decision {
        Decision {
            matched: true,
            failed_condition: None,
            decisions: vec![PolicyDecision::error(failure_policy, message)],
            audit_annotations: Vec::new(),
        }
    }

    /// The decisions that deny the request, first one first (what upstream reports).
    pub fn denials(&self) -> impl Iterator<Item = &PolicyDecision> {
        self.decisions
            .iter()
            .filter(|d| d.action == PolicyDecisionAction::Deny)
    }
}

/// One validation as written.
pub(crate) struct Validation {
    pub expression: String,
    pub message: String,
    pub reason: Option<String>,
    /// Its `messageExpression` among the policy's message expressions.
    pub message_index: Option<usize>,
}

/// One audit annotation as written.
pub(crate) struct AuditAnnotation {
    pub key: String,
    pub value_expression: String,
}

/// A compiled ValidatingAdmissionPolicy (upstream `compilePolicy` and its `Validator`).
pub struct Policy {
    pub(super) failure_policy: FailurePolicy,
    pub(super) has_params: bool,
    pub(super) match_conditions: Option<MatchConditions>,
    pub(super) validations: Vec<Validation>,
    pub(super) validation_expressions: AdmissionExpressions,
    pub(super) message_expressions: AdmissionExpressions,
    pub(super) audit_annotations: Vec<AuditAnnotation>,
    pub(super) audit_expressions: AdmissionExpressions,
}

impl Policy {
    /// Checks and compiles a `ValidatingAdmissionPolicySpec` being written, errors at `base`
    /// (e.g. `spec`) as upstream reports them. Audit annotation keys are checked without the
    /// policy's name; [`Policy::compile_named`] checks them as upstream does.
    pub fn compile(spec: &Value, base: &Path) -> Result<Policy, Vec<FieldError>> {
        spec::compile(spec, None, base)
    }

    /// [`Policy::compile`] for the policy named `name`, which qualifies its audit annotation
    /// keys (`<name>/<key>`).
    pub fn compile_named(name: &str, spec: &Value, base: &Path) -> Result<Policy, Vec<FieldError>> {
        spec::compile(spec, Some(name), base)
    }

    /// Compiles a stored policy: expressions that do not compile fail when evaluated, as
    /// upstream runs a policy accepted under other rules.
    pub fn new(spec: &Value) -> Policy {
        spec::stored(spec)
    }

    /// The policy's `failurePolicy`.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.failure_policy
    }

    /// Whether the policy has a `paramKind`, so that bindings supply `params`.
    pub fn has_params(&self) -> bool {
        self.has_params
    }

    /// Evaluates the policy against one request and parameter object (upstream
    /// `validator.Validate`).
    pub fn evaluate(&self, inputs: &AdmissionInputs<'_>) -> Decision {
        let failure_policy = self.failure_policy;
        if let Some(conditions) = &self.match_conditions {
            let result = conditions.matches(inputs);
            if let Some(error) = result.error {
                return match failure_policy {
                    FailurePolicy::Fail => Decision::error(failure_policy, error),
                    FailurePolicy::Ignore => Decision::unmatched(None),
                };
            }
            if !result.matches {
                return Decision::unmatched(result.failed_condition);
            }
        }

        let validations = match self
            .validation_expressions
            .evaluate(inputs, RUNTIME_CEL_COST_BUDGET)
        {
            Ok(evaluation) => evaluation,
            Err(out_of_budget) => {
                return Decision::error(failure_policy, out_of_budget.to_string());
            }
        };
        // every message expression runs, with what the validations left of the budget
        let messages = self
            .message_expressions
            .evaluate(inputs, validations.remaining_budget);
        let mut decisions = Vec::with_capacity(self.validations.len());
        for (validation, result) in self.validations.iter().zip(&validations.results) {
            let decision = match result {
                Err(error) => PolicyDecision::error(failure_policy, error.clone()),
                Ok(_) if let Err(out_of_budget) = &messages => PolicyDecision::error(
                    failure_policy,
                    format!("failed messageExpression: {out_of_budget}"),
                ),
                Ok(ExpressionValue::Bool(true)) => PolicyDecision {
                    action: PolicyDecisionAction::Admit,
                    evaluation: PolicyDecisionEvaluation::Admit,
                    message: String::new(),
                    reason: None,
                },
                Ok(_) => {
                    let evaluated = validation
                        .message_index
                        .zip(messages.as_ref().ok())
                        .and_then(|(i, m)| m.results.get(i));
                    PolicyDecision {
                        action: PolicyDecisionAction::Deny,
                        evaluation: PolicyDecisionEvaluation::Deny,
                        message: failure_message(validation, evaluated),
                        reason: Some(
                            validation
                                .reason
                                .clone()
                                .unwrap_or_else(|| "Invalid".to_string()),
                        ),
                    }
                }
            };
            decisions.push(decision);
        }

        let audits = match self
            .audit_expressions
            .evaluate(inputs, RUNTIME_CEL_COST_BUDGET)
        {
            Ok(evaluation) => evaluation,
            Err(out_of_budget) => {
                return Decision::error(failure_policy, out_of_budget.to_string());
            }
        };
        let audit_annotations = self
            .audit_annotations
            .iter()
            .zip(audits.results)
            .map(|(audit, result)| audit_annotation(audit, result, failure_policy))
            .collect();
        Decision {
            matched: true,
            failed_condition: None,
            decisions,
            audit_annotations,
        }
    }
}

/// The message of a failed validation: the `messageExpression`'s value if it is a usable
/// string, else the `message`, else the expression itself.
fn failure_message(
    validation: &Validation,
    evaluated: Option<&Result<ExpressionValue, String>>,
) -> String {
    if let Some(Ok(ExpressionValue::String(message))) = evaluated {
        let message = message.trim();
        // upstream drops messages that are too long or span lines
        if !message.is_empty()
            && message.len() <= MAX_EVALUATED_MESSAGE_EXPRESSION_SIZE_BYTES
            && !message.contains('\n')
        {
            return message.to_string();
        }
    }
    let message = validation.message.trim();
    if !message.is_empty() {
        return message.to_string();
    }
    format!("failed expression: {}", validation.expression.trim())
}

fn audit_annotation(
    audit: &AuditAnnotation,
    result: Result<ExpressionValue, String>,
    failure_policy: FailurePolicy,
) -> PolicyAuditAnnotation {
    let annotation = |action, value: &str, error: String| PolicyAuditAnnotation {
        key: audit.key.clone(),
        value: value.to_string(),
        action,
        error,
    };
    match result {
        Err(error) => annotation(failure_policy.audit_action(), "", error),
        Ok(ExpressionValue::String(value)) if value.trim().is_empty() => {
            annotation(AuditAnnotationAction::Exclude, "", String::new())
        }
        Ok(ExpressionValue::String(value)) => {
            annotation(AuditAnnotationAction::Publish, value.trim(), String::new())
        }
        Ok(ExpressionValue::Null) => annotation(AuditAnnotationAction::Exclude, "", String::new()),
        Ok(other) => {
            let type_name = match other {
                ExpressionValue::Bool(_) => "bool".to_string(),
                ExpressionValue::Other(name) => name,
                ExpressionValue::String(_) | ExpressionValue::Null => String::new(),
            };
            annotation(
                AuditAnnotationAction::Error,
                "",
                format!(
                    "valueExpression '{}' resulted in unsupported return type: {type_name}. Return type must be either string or null.",
                    audit.value_expression
                ),
            )
        }
    }
}
