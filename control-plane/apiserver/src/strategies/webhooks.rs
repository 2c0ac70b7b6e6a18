//! MutatingWebhookConfiguration and ValidatingWebhookConfiguration (upstream
//! `pkg/apis/admissionregistration/validation` and `v1/defaults.go`): defaults, and the checks
//! that keep a configuration callable — names, one of `url` or `service`, https only,
//! side effects, review versions, timeouts, policies and rules.

use flotilla_api_machinery::field::{FieldError, Path};
use flotilla_api_machinery::names;
use serde_json::{Value, json};

use crate::resources::Strategy;

/// The strategy of both configuration kinds; `mutating` tells them apart.
pub struct WebhookConfigurationStrategy {
    /// MutatingWebhookConfiguration (has `reinvocationPolicy`).
    pub mutating: bool,
}

fn set_default(map: &mut serde_json::Map<String, Value>, key: &str, value: Value) {
    if map.get(key).is_none_or(Value::is_null) {
        map.insert(key.to_string(), value);
    }
}

/// Upstream's default `scope: "*"` on each of a list of rules.
fn default_scopes(rules: Option<&mut Value>) {
    for rule in rules.and_then(Value::as_array_mut).into_iter().flatten() {
        if let Some(rule) = rule.as_object_mut() {
            set_default(rule, "scope", json!("*"));
        }
    }
}

impl Strategy for WebhookConfigurationStrategy {
    fn default(&self, obj: &mut Value) {
        for webhook in obj["webhooks"].as_array_mut().into_iter().flatten() {
            let Some(map) = webhook.as_object_mut() else {
                continue;
            };
            set_default(map, "failurePolicy", json!("Fail"));
            set_default(map, "matchPolicy", json!("Equivalent"));
            set_default(map, "namespaceSelector", json!({}));
            set_default(map, "objectSelector", json!({}));
            set_default(map, "timeoutSeconds", json!(10));
            if self.mutating {
                set_default(map, "reinvocationPolicy", json!("Never"));
            }
            if let Some(service) = map
                .get_mut("clientConfig")
                .and_then(|c| c.get_mut("service"))
                .and_then(Value::as_object_mut)
            {
                set_default(service, "port", json!(443));
            }
            default_scopes(map.get_mut("rules"));
        }
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let mut seen = Vec::new();
        for (i, webhook) in obj["webhooks"].as_array().into_iter().flatten().enumerate() {
            let here = Path::new("webhooks").index(i);
            let name = webhook["name"].as_str().unwrap_or("");
            if name.is_empty() {
                errors.push(FieldError::required(&here.child("name"), ""));
            } else {
                for problem in names::is_dns1123_subdomain(name) {
                    errors.push(FieldError::invalid(
                        &here.child("name"),
                        json!(name),
                        problem,
                    ));
                }
                if name.split('.').count() < 3 {
                    errors.push(FieldError::invalid(
                        &here.child("name"),
                        json!(name),
                        "should be a domain with at least three segments separated by dots",
                    ));
                }
                if seen.contains(&name) {
                    errors.push(FieldError::duplicate(&here.child("name"), json!(name)));
                }
                seen.push(name);
            }
            errors.extend(validate_webhook(webhook, &here, self.mutating));
        }
        errors
    }
}

/// A webhook's or policy's `matchConditions` as (name, expression) pairs.
pub fn match_conditions(holder: &Value) -> Vec<(String, String)> {
    holder["matchConditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or("").to_string(),
                c["expression"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// The strategy of ValidatingAdmissionPolicies: their spec's expressions are compiled when
/// written, and refused in upstream's words when they do not compile or mistype.
pub struct ValidatingAdmissionPolicyStrategy;

impl Strategy for ValidatingAdmissionPolicyStrategy {
    fn default(&self, obj: &mut Value) {
        if let Some(spec) = obj["spec"].as_object_mut() {
            set_default(spec, "failurePolicy", json!("Fail"));
            if let Some(constraints) = spec
                .get_mut("matchConstraints")
                .and_then(Value::as_object_mut)
            {
                set_default(constraints, "matchPolicy", json!("Equivalent"));
                set_default(constraints, "namespaceSelector", json!({}));
                set_default(constraints, "objectSelector", json!({}));
                default_scopes(constraints.get_mut("resourceRules"));
            }
        }
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errors = match flotilla_cel::admission::Policy::compile_named(
            crate::meta::name(obj),
            &obj["spec"],
            &Path::new("spec"),
        ) {
            Ok(_) => Vec::new(),
            Err(errors) => errors,
        };
        if obj["spec"]["matchConstraints"]["resourceRules"]
            .as_array()
            .is_none_or(Vec::is_empty)
        {
            errors.push(FieldError::required(
                &Path::new("spec")
                    .child("matchConstraints")
                    .child("resourceRules"),
                "",
            ));
        }
        errors
    }
}

/// The strategy of ValidatingAdmissionPolicyBindings.
pub struct ValidatingAdmissionPolicyBindingStrategy;

impl Strategy for ValidatingAdmissionPolicyBindingStrategy {
    fn default(&self, obj: &mut Value) {
        if let Some(reference) = obj["spec"]["paramRef"].as_object_mut() {
            set_default(reference, "parameterNotFoundAction", json!("Deny"));
        }
    }

    fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let spec = Path::new("spec");
        if obj["spec"]["policyName"].as_str().is_none_or(str::is_empty) {
            errors.push(FieldError::required(&spec.child("policyName"), ""));
        }
        let actions: Vec<&str> = obj["spec"]["validationActions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let actions_path = spec.child("validationActions");
        if actions.is_empty() {
            errors.push(FieldError::required(
                &actions_path,
                "at least one validation action is required",
            ));
        }
        for (i, action) in actions.iter().enumerate() {
            if !matches!(*action, "Deny" | "Warn" | "Audit") {
                errors.push(FieldError::not_supported(
                    &actions_path.index(i),
                    json!(action),
                    &["Audit", "Deny", "Warn"],
                ));
            }
            if actions[..i].contains(action) {
                errors.push(FieldError::duplicate(&actions_path.index(i), json!(action)));
            }
        }
        if actions.contains(&"Deny") && actions.contains(&"Warn") {
            errors.push(FieldError::invalid(
                &actions_path,
                json!(actions),
                "must not contain both Deny and Warn (repeating the same validation failure information in the API response and headers serves no purpose)",
            ));
        }
        let reference = &obj["spec"]["paramRef"];
        if reference.is_object() {
            let has_name = reference["name"].as_str().is_some_and(|n| !n.is_empty());
            if has_name == reference["selector"].is_object() {
                errors.push(FieldError::forbidden(
                    &spec.child("paramRef"),
                    "one of name or selector must be specified",
                ));
            }
            if let Some(action) = reference["parameterNotFoundAction"].as_str()
                && !matches!(action, "Allow" | "Deny")
            {
                errors.push(FieldError::not_supported(
                    &spec.child("paramRef").child("parameterNotFoundAction"),
                    json!(action),
                    &["Allow", "Deny"],
                ));
            }
        }
        errors
    }
}

fn validate_webhook(webhook: &Value, here: &Path, mutating: bool) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let one_of =
        |field: &str, value: &Value, supported: &[&str], errors: &mut Vec<FieldError>| match value
            .as_str()
        {
            None => errors.push(FieldError::required(&here.child(field), "")),
            Some(v) if !supported.contains(&v) => errors.push(FieldError::not_supported(
                &here.child(field),
                json!(v),
                supported,
            )),
            Some(_) => {}
        };
    one_of(
        "sideEffects",
        &webhook["sideEffects"],
        &["None", "NoneOnDryRun"],
        &mut errors,
    );
    one_of(
        "failurePolicy",
        &webhook["failurePolicy"],
        &["Fail", "Ignore"],
        &mut errors,
    );
    one_of(
        "matchPolicy",
        &webhook["matchPolicy"],
        &["Equivalent", "Exact"],
        &mut errors,
    );
    if mutating {
        one_of(
            "reinvocationPolicy",
            &webhook["reinvocationPolicy"],
            &["IfNeeded", "Never"],
            &mut errors,
        );
    }
    let versions: Vec<&str> = webhook["admissionReviewVersions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if versions.is_empty() {
        errors.push(FieldError::required(
            &here.child("admissionReviewVersions"),
            "must specify one of v1, v1beta1",
        ));
    } else if !versions.iter().any(|v| matches!(*v, "v1" | "v1beta1")) {
        errors.push(FieldError::invalid(
            &here.child("admissionReviewVersions"),
            json!(versions),
            "must include at least one of v1, v1beta1",
        ));
    }
    if let Some(timeout) = webhook["timeoutSeconds"].as_i64()
        && !(1..=30).contains(&timeout)
    {
        errors.push(FieldError::invalid(
            &here.child("timeoutSeconds"),
            json!(timeout),
            "the timeout value must be between 1 and 30 seconds",
        ));
    }
    errors.extend(validate_client_config(
        &webhook["clientConfig"],
        &here.child("clientConfig"),
    ));
    let conditions = match_conditions(webhook);
    let borrowed: Vec<(&str, &str)> = conditions
        .iter()
        .map(|(n, e)| (n.as_str(), e.as_str()))
        .collect();
    errors.extend(flotilla_cel::admission::validate_match_conditions(
        &borrowed,
        false,
        &here.child("matchConditions"),
    ));
    const OPERATIONS: [&str; 5] = ["*", "CONNECT", "CREATE", "DELETE", "UPDATE"];
    for (i, rule) in webhook["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let rule_path = here.child("rules").index(i);
        for (j, operation) in rule["operations"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let operation = operation.as_str().unwrap_or("");
            if !OPERATIONS.contains(&operation) {
                errors.push(FieldError::not_supported(
                    &rule_path.child("operations").index(j),
                    json!(operation),
                    &OPERATIONS,
                ));
            }
        }
        for field in ["apiGroups", "apiVersions", "resources"] {
            if rule[field].as_array().is_none_or(Vec::is_empty) {
                errors.push(FieldError::required(&rule_path.child(field), ""));
            }
        }
        if let Some(scope) = rule["scope"].as_str()
            && !matches!(scope, "*" | "Cluster" | "Namespaced")
        {
            errors.push(FieldError::not_supported(
                &rule_path.child("scope"),
                json!(scope),
                &["*", "Cluster", "Namespaced"],
            ));
        }
    }
    errors
}

/// A webhook's `clientConfig` (upstream's `ValidateWebhookClientConfig`, shared by admission
/// and conversion webhooks): exactly one of an https URL without query or fragment, or a
/// Service with a name, namespace and valid port.
pub fn validate_client_config(config: &Value, config_path: &Path) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let url = config["url"].as_str();
    let service = &config["service"];
    match (url, service.is_object()) {
        (Some(_), true) | (None, false) => errors.push(FieldError::required(
            config_path,
            "exactly one of url or service is required",
        )),
        (Some(url), false) => {
            if !url.starts_with("https://") {
                errors.push(FieldError::invalid(
                    &config_path.child("url"),
                    json!(url),
                    "'https' is the only allowed URL scheme",
                ));
            }
            if url.contains('#') || url.contains('?') {
                errors.push(FieldError::invalid(
                    &config_path.child("url"),
                    json!(url),
                    "fragments and query parameters are not permitted",
                ));
            }
        }
        (None, true) => {
            let service_path = config_path.child("service");
            for field in ["name", "namespace"] {
                if service[field].as_str().is_none_or(str::is_empty) {
                    errors.push(FieldError::required(
                        &service_path.child(field),
                        "service name and namespace are required",
                    ));
                }
            }
            if let Some(port) = service["port"].as_i64()
                && !(1..=65535).contains(&port)
            {
                errors.push(FieldError::invalid(
                    &service_path.child("port"),
                    json!(port),
                    "port is not valid: must be between 1 and 65535, inclusive",
                ));
            }
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(webhook: Value) -> Vec<String> {
        let strategy = WebhookConfigurationStrategy { mutating: true };
        let mut obj = json!({"metadata": {"name": "c"}, "webhooks": [webhook]});
        strategy.default(&mut obj);
        strategy
            .validate(&obj)
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn a_complete_webhook_is_valid_and_defaulted() {
        let strategy = WebhookConfigurationStrategy { mutating: true };
        let mut obj = json!({"webhooks": [{
            "name": "label.example.com", "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "clientConfig": {"service": {"namespace": "hooks", "name": "labeler"}, "caBundle": "eA=="},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}],
        }]});
        strategy.default(&mut obj);
        assert_eq!(strategy.validate(&obj), vec![]);
        let hook = &obj["webhooks"][0];
        assert_eq!(hook["failurePolicy"], "Fail");
        assert_eq!(hook["timeoutSeconds"], 10);
        assert_eq!(hook["clientConfig"]["service"]["port"], 443);
        assert_eq!(hook["rules"][0]["scope"], "*");
        assert_eq!(hook["reinvocationPolicy"], "Never");
    }

    #[test]
    fn broken_webhooks_get_upstreams_messages() {
        let errors = checked(json!({
            "name": "short.name", "admissionReviewVersions": ["v2"], "timeoutSeconds": 31,
            "clientConfig": {"url": "http://example.com/hook"},
        }));
        for expected in [
            "webhooks[0].name: Invalid value: \"short.name\": should be a domain with at least three segments separated by dots",
            "webhooks[0].sideEffects: Required value",
            "webhooks[0].admissionReviewVersions: Invalid value: []string{\"v2\"}: must include at least one of v1, v1beta1",
            "webhooks[0].timeoutSeconds: Invalid value: 31: the timeout value must be between 1 and 30 seconds",
            "webhooks[0].clientConfig.url: Invalid value: \"http://example.com/hook\": 'https' is the only allowed URL scheme",
        ] {
            assert!(
                errors.contains(&expected.to_string()),
                "{expected} not in {errors:#?}"
            );
        }
    }
}
