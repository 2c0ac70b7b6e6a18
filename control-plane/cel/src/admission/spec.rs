//! Reading a `ValidatingAdmissionPolicySpec` and the checks a policy write runs on it
//! (upstream `validateValidatingAdmissionPolicySpec` of `admissionregistration/validation`),
//! compiling its expressions once for both the checks and evaluation (upstream
//! `compilePolicy`).
//!
//! `matchConstraints` is not checked here: it has no expressions.

use std::collections::HashSet;
use std::sync::Arc;

use flotilla_api_machinery::field::{FieldError, Path};
use flotilla_api_machinery::names::{is_dns1035_label, is_dns1123_subdomain, is_qualified_name};
use serde_json::Value;

use super::match_conditions::{MatchConditions, validate_match_conditions};
use super::policy::{AuditAnnotation, FailurePolicy, Policy, Validation};
use super::{AdmissionExpressions, CompileError, Composition, ExpressionKind};
use crate::limits::MAX_EVALUATED_MESSAGE_EXPRESSION_SIZE_BYTES;

const SUPPORTED_FAILURE_POLICIES: &[&str] = &["Fail", "Ignore"];
/// The reasons a validation may give (`supportedValidationPolicyReason`), sorted.
const SUPPORTED_REASONS: &[&str] = &["Forbidden", "Invalid", "RequestEntityTooLarge"];
const MAX_AUDIT_ANNOTATIONS: usize = 20;
/// Upstream `maxAuditAnnotationValueExpressionLength`: shorter than the 10KiB value limit, as
/// concatenating expressions produce longer values than themselves.
const MAX_AUDIT_ANNOTATION_VALUE_EXPRESSION_LENGTH: usize =
    MAX_EVALUATED_MESSAGE_EXPRESSION_SIZE_BYTES;

fn text<'a>(value: &'a Value, field: &str) -> &'a str {
    value.get(field).and_then(Value::as_str).unwrap_or("")
}

fn items<'a>(value: &'a Value, field: &str) -> &'a [Value] {
    value
        .get(field)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// Upstream `isCELIdentifier`.
fn is_cel_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    let starts_well = chars
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic());
    starts_well
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
        && !crate::escaping::RESERVED.contains(&name)
}

fn has_newlines(s: &str) -> bool {
    s.contains(['\n', '\r'])
}

/// Where to report what a policy write checks; `None` for a stored policy, compiled without
/// checks.
struct Checks<'p> {
    base: &'p Path,
    name: Option<&'p str>,
    errors: Vec<FieldError>,
}

impl Checks<'_> {
    fn path(&self, field: &str) -> Path {
        self.base.child(field)
    }
}

/// Compiles `spec`, running the write checks when `checks` is given.
fn build(spec: &Value, mut checks: Option<&mut Checks<'_>>) -> Policy {
    let failure_policy = spec.get("failurePolicy").and_then(Value::as_str);
    let param_kind = spec.get("paramKind").filter(|p| !p.is_null());
    let has_params = param_kind.is_some();
    if let Some(checks) = checks.as_deref_mut() {
        let at = checks.path("failurePolicy");
        match failure_policy {
            None => checks.errors.push(FieldError::required(&at, "")),
            Some(policy) if !SUPPORTED_FAILURE_POLICIES.contains(&policy) => checks.errors.push(
                FieldError::not_supported(&at, policy, SUPPORTED_FAILURE_POLICIES),
            ),
            Some(_) => {}
        }
        if let Some(param_kind) = param_kind {
            let at = checks.path("paramKind");
            checks.errors.extend(validate_param_kind(param_kind, &at));
        }
    }

    let conditions: Vec<(&str, &str)> = items(spec, "matchConditions")
        .iter()
        .map(|c| (text(c, "name"), text(c, "expression")))
        .collect();
    if let Some(checks) = checks.as_deref_mut() {
        let at = checks.path("matchConditions");
        checks
            .errors
            .extend(validate_match_conditions(&conditions, has_params, &at));
    }

    let variables = items(spec, "variables");
    let mut composition = if variables.is_empty() {
        Composition::new(has_params)
    } else {
        Composition::composited(has_params)
    };
    for (i, variable) in variables.iter().enumerate() {
        let (name, expression) = (text(variable, "name"), text(variable, "expression"));
        let at = checks.as_deref().map(|c| c.path("variables").index(i));
        if let (Some(checks), Some(at)) = (checks.as_deref_mut(), &at) {
            if name.trim().is_empty() {
                checks.errors.push(FieldError::required(
                    &at.child("name"),
                    "name is not specified",
                ));
            } else if !is_cel_identifier(name) {
                checks.errors.push(FieldError::invalid(
                    &at.child("name"),
                    name,
                    "name is not a valid CEL identifier",
                ));
            }
            if expression.trim().is_empty() {
                checks.errors.push(FieldError::required(
                    &at.child("expression"),
                    "expression is not specified",
                ));
            }
        }
        // upstream only composes the variables that have an expression
        if expression.trim().is_empty() {
            continue;
        }
        if let (Err(error), Some(checks), Some(at)) = (
            composition.add_variable(name, expression),
            checks.as_deref_mut(),
            &at,
        ) {
            checks.errors.push(FieldError::invalid(
                &at.child("expression"),
                expression,
                error.detail,
            ));
        }
    }
    let composition = Arc::new(composition);
    let match_conditions =
        (!conditions.is_empty()).then(|| MatchConditions::with(&conditions, &composition));

    let validations_json = items(spec, "validations");
    let audits_json = items(spec, "auditAnnotations");
    if let Some(checks) = checks.as_deref_mut()
        && validations_json.is_empty()
        && audits_json.is_empty()
    {
        for field in ["validations", "auditAnnotations"] {
            checks.errors.push(FieldError::required(
                &checks.path(field),
                "validations or auditAnnotations must contain at least one item",
            ));
        }
    }

    let mut validations = Vec::new();
    let mut messages = Vec::new();
    for v in validations_json {
        let message_expression = text(v, "messageExpression");
        validations.push(Validation {
            expression: text(v, "expression").to_string(),
            message: text(v, "message").to_string(),
            reason: v.get("reason").and_then(Value::as_str).map(str::to_string),
            message_index: (!message_expression.is_empty()).then(|| {
                messages.push(message_expression);
                messages.len() - 1
            }),
        });
    }
    let audit_annotations: Vec<AuditAnnotation> = audits_json
        .iter()
        .map(|a| AuditAnnotation {
            key: text(a, "key").to_string(),
            value_expression: text(a, "valueExpression").to_string(),
        })
        .collect();
    let sources: Vec<&str> = validations.iter().map(|v| v.expression.as_str()).collect();
    let audit_sources: Vec<&str> = audit_annotations
        .iter()
        .map(|a| a.value_expression.trim())
        .collect();
    let policy = Policy {
        failure_policy: match failure_policy {
            Some("Ignore") => FailurePolicy::Ignore,
            _ => FailurePolicy::Fail,
        },
        has_params,
        match_conditions,
        validation_expressions: composition.compile(&sources, ExpressionKind::Condition),
        message_expressions: composition.compile(&messages, ExpressionKind::Message),
        audit_expressions: composition.compile(&audit_sources, ExpressionKind::AuditValue),
        validations,
        audit_annotations,
    };
    let Some(checks) = checks else {
        return policy;
    };

    for (i, validation) in policy.validations.iter().enumerate() {
        let at = checks.path("validations").index(i);
        let error = |compiled: &AdmissionExpressions, index: usize| {
            compiled.compiled.get(index).and_then(|c| c.error.clone())
        };
        let message_error = validation
            .message_index
            .and_then(|m| error(&policy.message_expressions, m));
        let message_expression = validation
            .message_index
            .and_then(|m| messages.get(m).copied())
            .unwrap_or("");
        check_validation(
            validation,
            error(&policy.validation_expressions, i),
            message_expression,
            message_error,
            &at,
            checks,
        );
    }
    if audits_json.len() > MAX_AUDIT_ANNOTATIONS {
        checks.errors.push(FieldError::invalid(
            &checks.path("auditAnnotations"),
            Value::Array(audits_json.to_vec()),
            format!("must not have more than {MAX_AUDIT_ANNOTATIONS} auditAnnotations"),
        ));
    }
    let mut keys = HashSet::new();
    for (i, audit) in policy.audit_annotations.iter().enumerate() {
        let at = checks.path("auditAnnotations").index(i);
        let error = policy
            .audit_expressions
            .compiled
            .get(i)
            .and_then(|c| c.error.clone());
        check_audit_annotation(audit, error, &at, checks);
        if !keys.insert(audit.key.as_str()) {
            checks
                .errors
                .push(FieldError::duplicate(&at.child("key"), audit.key.clone()));
        }
    }
    policy
}

/// Upstream `validateValidation`, given the compile errors of its expressions.
fn check_validation(
    validation: &Validation,
    expression_error: Option<CompileError>,
    message_expression: &str,
    message_error: Option<CompileError>,
    at: &Path,
    checks: &mut Checks<'_>,
) {
    let expression = validation.expression.as_str();
    if expression.trim().is_empty() {
        checks.errors.push(FieldError::required(
            &at.child("expression"),
            "expression is not specified",
        ));
    } else if let Some(error) = expression_error {
        checks.errors.push(FieldError::invalid(
            &at.child("expression"),
            expression,
            error.detail,
        ));
    }
    if !message_expression.is_empty() && message_expression.trim().is_empty() {
        checks.errors.push(FieldError::invalid(
            &at.child("messageExpression"),
            message_expression,
            "must be non-empty if specified",
        ));
    } else if let Some(error) = message_error {
        // compiled untrimmed, so that columns point into what was written
        checks.errors.push(FieldError::invalid(
            &at.child("messageExpression"),
            message_expression,
            error.detail,
        ));
    }
    let message = validation.message.as_str();
    if !message.is_empty() && message.trim().is_empty() {
        checks.errors.push(FieldError::invalid(
            &at.child("message"),
            message,
            "message must be non-empty if specified",
        ));
    } else if has_newlines(message.trim()) {
        checks.errors.push(FieldError::invalid(
            &at.child("message"),
            message,
            "message must not contain line breaks",
        ));
    }
    if let Some(reason) = &validation.reason
        && !SUPPORTED_REASONS.contains(&reason.as_str())
    {
        checks.errors.push(FieldError::not_supported(
            &at.child("reason"),
            reason.clone(),
            SUPPORTED_REASONS,
        ));
    }
}

/// Upstream `validateAuditAnnotation`, given the compile error of its value expression.
fn check_audit_annotation(
    audit: &AuditAnnotation,
    value_error: Option<CompileError>,
    at: &Path,
    checks: &mut Checks<'_>,
) {
    let key = audit.key.as_str();
    match checks.name {
        Some("") => checks.errors.push(FieldError::invalid(
            &at.child("key"),
            key,
            "requires metadata.name be non-empty",
        )),
        Some(name) => {
            let qualified = format!("{name}/{key}");
            for message in is_qualified_name(&qualified) {
                checks.errors.push(FieldError::invalid(
                    &at.child("key"),
                    qualified.clone(),
                    message,
                ));
            }
        }
        // without the policy's name, the key is checked as the name part it becomes
        None => {
            for message in is_qualified_name(&format!("policy/{key}")) {
                checks
                    .errors
                    .push(FieldError::invalid(&at.child("key"), key, message));
            }
        }
    }
    let value_expression = audit.value_expression.as_str();
    let trimmed = value_expression.trim();
    if trimmed.is_empty() {
        checks.errors.push(FieldError::required(
            &at.child("valueExpression"),
            "valueExpression is not specified",
        ));
    } else if trimmed.len() > MAX_AUDIT_ANNOTATION_VALUE_EXPRESSION_LENGTH {
        checks.errors.push(FieldError::required(
            &at.child("valueExpression"),
            format!(
                "must not exceed {MAX_AUDIT_ANNOTATION_VALUE_EXPRESSION_LENGTH} bytes in length"
            ),
        ));
    } else if let Some(error) = value_error {
        checks.errors.push(FieldError::invalid(
            &at.child("valueExpression"),
            value_expression,
            error.detail,
        ));
    }
}

/// Upstream `validateParamKind`.
fn validate_param_kind(param_kind: &Value, at: &Path) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let api_version = text(param_kind, "apiVersion");
    let version_at = at.child("apiVersion");
    if api_version.is_empty() {
        errors.push(FieldError::required(&version_at, ""));
    } else {
        // upstream `parseGroupVersion`
        let parsed = match api_version.matches('/').count() {
            _ if api_version == "/" => Ok(("", "")),
            0 => Ok(("", api_version)),
            1 => Ok(api_version.split_once('/').unwrap_or(("", api_version))),
            _ => Err(format!("unexpected GroupVersion string: {api_version}")),
        };
        match parsed {
            Err(message) => errors.push(FieldError::invalid(&version_at, api_version, message)),
            Ok((group, version)) => {
                if !group.is_empty() {
                    let problems = is_dns1123_subdomain(group);
                    if !problems.is_empty() {
                        errors.push(FieldError::invalid(&version_at, group, problems.join(",")));
                    }
                }
                if version.is_empty() {
                    errors.push(FieldError::invalid(
                        &version_at,
                        api_version,
                        "version must be specified",
                    ));
                } else {
                    let problems = is_dns1035_label(version);
                    if !problems.is_empty() {
                        errors.push(FieldError::invalid(
                            &version_at,
                            version,
                            problems.join(","),
                        ));
                    }
                }
            }
        }
    }
    let kind = text(param_kind, "kind");
    if kind.is_empty() {
        errors.push(FieldError::required(&at.child("kind"), ""));
    } else {
        let problems = is_dns1035_label(&kind.to_lowercase());
        if !problems.is_empty() {
            errors.push(FieldError::invalid(
                &at.child("kind"),
                kind,
                format!(
                    "may have mixed case, but should otherwise match: {}",
                    problems.join(",")
                ),
            ));
        }
    }
    errors
}

/// Compiles a policy being written, with the write checks at `base` (e.g. `spec`); `name` is
/// the policy's `metadata.name`, which audit annotation keys are qualified with.
pub(super) fn compile(
    spec: &Value,
    name: Option<&str>,
    base: &Path,
) -> Result<Policy, Vec<FieldError>> {
    let mut checks = Checks {
        base,
        name,
        errors: Vec::new(),
    };
    let policy = build(spec, Some(&mut checks));
    if checks.errors.is_empty() {
        Ok(policy)
    } else {
        Err(checks.errors)
    }
}

/// Compiles a stored policy without checks.
pub(super) fn stored(spec: &Value) -> Policy {
    build(spec, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_cel_identifiers() {
        for (name, ok) in [
            ("replicas", true),
            ("_x1", true),
            ("1x", false),
            ("a-b", false),
            ("namespace", false),
            ("", false),
        ] {
            assert_eq!(is_cel_identifier(name), ok, "{name}");
        }
    }

    #[test]
    fn checks_param_kinds_like_upstream() {
        let at = Path::new("spec").child("paramKind");
        let cases = [
            (
                serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap"}),
                vec![],
            ),
            (
                serde_json::json!({"apiVersion": "a/b/c", "kind": ""}),
                vec![
                    "spec.paramKind.apiVersion: Invalid value: \"a/b/c\": unexpected GroupVersion string: a/b/c",
                    "spec.paramKind.kind: Required value",
                ],
            ),
            (
                serde_json::json!({"apiVersion": "example.com/", "kind": "Config_Map"}),
                vec![
                    "spec.paramKind.apiVersion: Invalid value: \"example.com/\": version must be specified",
                    "spec.paramKind.kind: Invalid value: \"Config_Map\": may have mixed case, but should otherwise match: a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')",
                ],
            ),
        ];
        for (param_kind, want) in cases {
            let got: Vec<String> = validate_param_kind(&param_kind, &at)
                .iter()
                .map(ToString::to_string)
                .collect();
            assert_eq!(got, want, "{param_kind}");
        }
    }
}
