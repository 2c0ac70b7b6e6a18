//! ValidatingAdmissionPolicy (upstream `k8s.io/apiserver/pkg/admission/plugin/policy/validating`):
//! each ValidatingAdmissionPolicyBinding names a policy; when the policy's `matchConstraints`
//! and the binding's `matchResources` select the request, the policy's CEL validations
//! (`flotilla_cel::admission::Policy`) run against the object, with the binding's parameter
//! object (a ConfigMap, a custom resource…) as `params`, and the binding's
//! `validationActions` decide what a failure does: `Deny` refuses with upstream's message and
//! the validation's reason, `Warn` adds a warning, `Audit` records the failure in the audit
//! annotation `validation.policy.admission.k8s.io/validation_failure`. The policy's
//! `auditAnnotations` are recorded as `<policy>/<key>`; one that fails under
//! `failurePolicy: Fail` denies. `authorizer` checks are decided by a snapshot of the tenant's
//! authorizer ([`super::Authorizer::snapshot`]), as the requesting user.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, LazyLock, Mutex};

use flotilla_cel::admission::{
    AdmissionInputs, AuditAnnotationAction, FailurePolicy, Policy, PolicyDecisionAction,
    reason_to_code,
};
use serde_json::{Value, json};

use super::webhook::{
    admission_review, exempt, namespace_selector_matches, object_selector_matches,
    rule_list_matches,
};
use super::{Attributes, Context, Plugin};
use crate::error::ApiError;
use crate::meta;

/// The ValidatingAdmissionPolicy plugin.
pub struct ValidatingAdmissionPolicies;

/// Compiled policies by (uid, resourceVersion): compiling type-checks every expression, far
/// more than evaluating them, so a policy is compiled once per version.
type CompiledPolicies = Mutex<HashMap<(String, String), Arc<Policy>>>;
static COMPILED: LazyLock<CompiledPolicies> = LazyLock::new(Default::default);
/// Compiled policies kept before the cache starts over.
const COMPILED_KEPT: usize = 1024;

fn compiled(policy: &Value) -> Arc<Policy> {
    let key = (
        meta::uid(policy).to_string(),
        meta::resource_version(policy).to_string(),
    );
    if let Ok(cache) = COMPILED.lock()
        && let Some(found) = cache.get(&key)
    {
        return found.clone();
    }
    let compiled = Arc::new(Policy::new(&policy["spec"]));
    if let Ok(mut cache) = COMPILED.lock() {
        if cache.len() >= COMPILED_KEPT {
            cache.clear();
        }
        cache.insert(key, compiled.clone());
    }
    compiled
}

#[async_trait::async_trait]
impl Plugin for ValidatingAdmissionPolicies {
    fn name(&self) -> &'static str {
        "ValidatingAdmissionPolicy"
    }

    fn handles(&self, attributes: &Attributes<'_>) -> bool {
        !exempt(attributes)
    }

    async fn validate(
        &self,
        context: &Context<'_>,
        attributes: &Attributes<'_>,
        object: &Value,
        warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        let group = "admissionregistration.k8s.io";
        let bindings_resource =
            context.resource(group, "v1", "validatingadmissionpolicybindings")?;
        let bindings = context.list_cached(bindings_resource, None).await?;
        if bindings.is_empty() {
            return Ok(());
        }
        let policies_resource = context.resource(group, "v1", "validatingadmissionpolicies")?;
        let policies = context.list_cached(policies_resource, None).await?;
        let name = match attributes.old {
            Some(old)
                if matches!(
                    attributes.operation,
                    super::Operation::Delete | super::Operation::Connect
                ) =>
            {
                meta::name(old)
            }
            _ => meta::name(object),
        };
        let request = admission_review("", attributes, object)["request"].clone();
        let mut denied: Option<ApiError> = None;
        let mut audit_failures: Vec<Value> = Vec::new();
        let mut cel_authorizer = super::CelAuthorizer::default();
        for binding in bindings.iter() {
            let policy_name = binding["spec"]["policyName"].as_str().unwrap_or("");
            let Some(policy) = policies.iter().find(|p| meta::name(p) == policy_name) else {
                continue;
            };
            if !selects(
                context,
                &policy["spec"]["matchConstraints"],
                attributes,
                object,
                name,
                true,
            )
            .await?
            {
                continue;
            }
            let binding_match = &binding["spec"]["matchResources"];
            if binding_match.is_object()
                && !selects(context, binding_match, attributes, object, name, false).await?
            {
                continue;
            }
            let compiled = compiled(policy);
            // the RBAC snapshot `authorizer` checks are decided by, once per request
            let authorizer = cel_authorizer.get(context).await?;
            let refuse = |message: String, reason: &str| {
                denial(
                    attributes,
                    name,
                    policy_name,
                    meta::name(binding),
                    &message,
                    reason,
                )
            };
            let params = match parameters(context, policy, binding, attributes).await {
                Ok(params) => params,
                Err(why) => {
                    if compiled.failure_policy() == FailurePolicy::Fail {
                        return Err(refuse(
                            format!("failed to configure binding: {why}"),
                            "Invalid",
                        ));
                    }
                    continue;
                }
            };
            let namespace_object = if attributes.namespace.is_empty()
                || (attributes.resource.group.is_empty()
                    && attributes.resource.plural == "namespaces")
            {
                None
            } else {
                let namespaces = context.resource("", "v1", "namespaces")?;
                context.get_cached(namespaces, attributes.namespace).await?
            };
            let (new_object, old_object) = match attributes.operation {
                super::Operation::Delete => (None, attributes.old.or(Some(object))),
                super::Operation::Connect => (Some(object), None),
                _ => (Some(object), attributes.old),
            };
            let actions: Vec<&str> = binding["spec"]["validationActions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            // Distinct values per key of this policy's audit annotations (upstream's
            // `auditAnnotationCollector`: several parameters may give several).
            let mut annotations: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for param in params {
                let inputs = AdmissionInputs {
                    object: new_object,
                    old_object,
                    request: &request,
                    params: param.as_ref(),
                    namespace_object: namespace_object.as_ref(),
                    authorizer: authorizer.as_ref(),
                };
                let decision = compiled.evaluate(&inputs);
                if !decision.matched {
                    continue;
                }
                for (index, failed) in decision
                    .decisions
                    .iter()
                    .enumerate()
                    .filter(|(_, d)| d.action == PolicyDecisionAction::Deny)
                {
                    if actions.contains(&"Audit") {
                        audit_failures.push(json!({
                            "message": failed.message,
                            "policy": policy_name,
                            "binding": meta::name(binding),
                            "expressionIndex": index,
                            "validationActions": actions,
                        }));
                    }
                    if actions.contains(&"Warn") {
                        warnings.push(format!(
                            "Validation failed for ValidatingAdmissionPolicy '{policy_name}' with binding '{}': {}",
                            meta::name(binding),
                            failed.message
                        ));
                    }
                    if actions.contains(&"Deny") && denied.is_none() {
                        denied = Some(refuse(
                            failed.message.clone(),
                            failed.reason.as_deref().unwrap_or(""),
                        ));
                    }
                }
                for annotation in decision.audit_annotations {
                    match annotation.action {
                        AuditAnnotationAction::Publish => {
                            let mut value = annotation.value;
                            if value.len() > MAX_AUDIT_ANNOTATION_VALUE {
                                let mut end = MAX_AUDIT_ANNOTATION_VALUE;
                                while !value.is_char_boundary(end) {
                                    end -= 1;
                                }
                                value.truncate(end);
                            }
                            annotations.entry(annotation.key).or_default().insert(value);
                        }
                        // An annotation that failed under `failurePolicy: Fail` denies.
                        AuditAnnotationAction::Error if denied.is_none() => {
                            denied = Some(refuse(annotation.error, "Invalid"));
                        }
                        AuditAnnotationAction::Error | AuditAnnotationAction::Exclude => {}
                    }
                }
            }
            for (key, values) in annotations {
                let values: Vec<String> = values.into_iter().collect();
                crate::audit::annotate(&format!("{policy_name}/{key}"), values.join(", "));
            }
        }
        if !audit_failures.is_empty() {
            crate::audit::annotate(
                VALIDATION_FAILURE_ANNOTATION,
                Value::Array(audit_failures).to_string(),
            );
        }
        match denied {
            Some(refusal) => Err(refusal),
            None => Ok(()),
        }
    }
}

/// The audit annotation listing the failures of bindings with the `Audit` action.
const VALIDATION_FAILURE_ANNOTATION: &str = "validation.policy.admission.k8s.io/validation_failure";
/// Longest audit annotation value a policy publishes (upstream cuts longer ones).
const MAX_AUDIT_ANNOTATION_VALUE: usize = 10 * 1024;

/// Upstream's refusal: `admission.NewForbidden` with the policy's words, its reason and the
/// code that reason maps to.
fn denial(
    attributes: &Attributes<'_>,
    name: &str,
    policy: &str,
    binding: &str,
    message: &str,
    reason: &str,
) -> ApiError {
    let message = format!(
        "ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request: {message}"
    );
    let reason = if reason.is_empty() { "Invalid" } else { reason };
    let mut err = ApiError::forbidden(&attributes.resource.group_resource(), name, &message);
    let refused = ApiError::from_status(reason_to_code(reason), reason, String::new());
    err.code = refused.code;
    err.reason = refused.reason;
    if let Some(details) = err.details.as_mut() {
        details.causes.get_or_insert_with(Vec::new).push(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::StatusCause {
                message: Some(message),
                ..Default::default()
            },
        );
    }
    err
}

/// Whether a `matchConstraints` / `matchResources` selects the request: its resource rules,
/// minus its exclusions, and its namespace and object selectors.
async fn selects(
    context: &Context<'_>,
    constraints: &Value,
    attributes: &Attributes<'_>,
    object: &Value,
    name: &str,
    for_policy: bool,
) -> Result<bool, ApiError> {
    if !constraints.is_object() {
        return Ok(false);
    }
    // A binding's `matchResources` without resource rules narrows nothing by resource (the
    // policy's constraints have chosen them); a policy's must name some.
    let rules = &constraints["resourceRules"];
    let unrestricted = !for_policy && rules.as_array().is_none_or(Vec::is_empty);
    if !unrestricted && !rule_list_matches(rules, attributes, Some(name)) {
        return Ok(false);
    }
    if rule_list_matches(&constraints["excludeResourceRules"], attributes, Some(name)) {
        return Ok(false);
    }
    Ok(object_selector_matches(constraints, attributes, object)?
        && namespace_selector_matches(context, constraints, attributes, object).await?)
}

/// The parameter objects a binding gives its policy (`[None]` when the policy takes none):
/// by name, or every object its selector matches; none found is an error under
/// `parameterNotFoundAction: Deny` (the default) and no evaluation under `Allow`.
async fn parameters(
    context: &Context<'_>,
    policy: &Value,
    binding: &Value,
    attributes: &Attributes<'_>,
) -> Result<Vec<Option<Value>>, String> {
    let kind = &policy["spec"]["paramKind"];
    if !kind.is_object() {
        return Ok(vec![None]);
    }
    let reference = &binding["spec"]["paramRef"];
    if !reference.is_object() {
        return Err("paramRef is required when the policy has a paramKind".to_string());
    }
    let api_version = kind["apiVersion"].as_str().unwrap_or("");
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let kind_name = kind["kind"].as_str().unwrap_or("");
    let resource = context
        .resources
        .find_kind(group, version, kind_name)
        .cloned()
        .ok_or_else(|| {
            format!(
                "failed to find resource referenced by paramKind: '{api_version}, Kind={kind_name}'"
            )
        })?;
    let namespace = match reference["namespace"].as_str().filter(|n| !n.is_empty()) {
        Some(namespace) => namespace.to_string(),
        None if resource.namespaced => {
            if attributes.namespace.is_empty() {
                return Err("cannot use namespaced paramRef in policy binding that matches cluster-scoped resources".to_string());
            }
            attributes.namespace.to_string()
        }
        None => String::new(),
    };
    let found: Vec<Value> =
        if let Some(param_name) = reference["name"].as_str().filter(|n| !n.is_empty()) {
            match context
                .store
                .get(
                    context.tenant,
                    &resource,
                    &namespace,
                    param_name,
                    crate::store::ReadAt::Latest,
                )
                .await
            {
                Ok(object) => vec![object],
                Err(err) if err.code == 404 => Vec::new(),
                Err(err) => return Err(err.message),
            }
        } else {
            let selector = flotilla_api_machinery::selector::LabelSelector::from_optional_json(
                reference.get("selector"),
            )
            .map_err(|err| err.to_string())?;
            let scope = (!namespace.is_empty()).then_some(namespace.as_str());
            context
                .list(&resource, scope)
                .await
                .map_err(|err| err.message)?
                .into_iter()
                .filter(|object| selector.matches(&meta::labels(object)))
                .collect()
        };
    if found.is_empty() {
        return match reference["parameterNotFoundAction"]
            .as_str()
            .unwrap_or("Deny")
        {
            "Allow" => Ok(Vec::new()),
            _ => Err(
                "no params found for policy binding with `Deny` parameterNotFoundAction"
                    .to_string(),
            ),
        };
    }
    Ok(found
        .into_iter()
        .map(|mut object| {
            if object.get("apiVersion").is_none() {
                object["apiVersion"] = json!(api_version);
                object["kind"] = json!(kind_name);
            }
            Some(object)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use flotilla_api_machinery::rbac::{self, UserInfo};
    use flotilla_cel::admission::RequestAuthorizer;
    use serde_json::json;

    use super::*;
    use crate::admission::tests::NoHooks;
    use crate::admission::{Authorizer, Lookups, Operation, PodSecurityConfiguration};
    use crate::resources::Resources;
    use crate::store::{Store, Tenant, WriteOptions};

    /// The tenant's authorizer as the handler gives it to plugins, over a fixed RBAC policy.
    struct Rbac(Arc<rbac::Policy>);

    #[async_trait::async_trait]
    impl Authorizer for Rbac {
        async fn allowed(&self, attributes: &rbac::Attributes) -> Result<bool, ApiError> {
            Ok(self.0.authorize(attributes).0 == rbac::Decision::Allow)
        }

        async fn snapshot(&self) -> Result<Option<Arc<dyn RequestAuthorizer>>, ApiError> {
            Ok(Some(Arc::new(crate::authz::PolicySnapshot::new(
                self.0.clone(),
            ))))
        }
    }

    /// A policy whose validation asks the authorizer denies a user RBAC does not let list
    /// secrets in the object's namespace, and admits one it does (and `system:masters`).
    /// Needs the embedded store only.
    #[tokio::test]
    async fn authorizer_checks_decide_by_the_tenants_rbac() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let storage = flotilla_storage::EmbeddedStorage::open(dir.path().join("store.redb"))?;
        let store = Store::new(Arc::new(storage));
        let tenant = Tenant::new("demo");
        let resources = Arc::new(Resources::builtin());
        let served = |group: &str, plural: &str| resources.find(group, "v1", plural).cloned();
        let group = "admissionregistration.k8s.io";
        let (Some(namespaces), Some(policies), Some(bindings)) = (
            served("", "namespaces"),
            served(group, "validatingadmissionpolicies"),
            served(group, "validatingadmissionpolicybindings"),
        ) else {
            anyhow::bail!("namespaces and policies are served");
        };
        let options = WriteOptions::default();
        let policy = json!({
            "metadata": {"name": "secret-listers-only"},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["configmaps"],
                }]},
                "validations": [{
                    "expression": "authorizer.group('').resource('secrets').namespace(request.namespace).check('list').allowed()",
                    "messageExpression": "request.userInfo.username + ' may not list secrets'",
                }],
            },
        });
        let binding = json!({
            "metadata": {"name": "everywhere"},
            "spec": {"policyName": "secret-listers-only", "validationActions": ["Deny"]},
        });
        for (resource, object) in [(&policies, policy), (&bindings, binding)] {
            store
                .create(
                    &tenant,
                    resource,
                    &namespaces,
                    "",
                    object,
                    &options,
                    &NoHooks,
                )
                .await?;
        }
        let rbac: rbac::Policy = rbac::Policy {
            roles: vec![serde_json::from_value(json!({
                "metadata": {"name": "secret-lister", "namespace": "apps"},
                "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}],
            }))?],
            role_bindings: vec![serde_json::from_value(json!({
                "metadata": {"name": "alice-lists", "namespace": "apps"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "secret-lister"},
                "subjects": [{"kind": "User", "name": "alice"}],
            }))?],
            ..rbac::Policy::default()
        };
        let authorizer = Rbac(Arc::new(rbac));
        let (lookups, pod_security) = (Lookups::default(), PodSecurityConfiguration::default());
        let networks = crate::kubelet::KubeletNetworks::default();
        let context = Context {
            store: &store,
            resources: resources.clone(),
            tenant: &tenant,
            lookups: &lookups,
            pod_security: &pod_security,
            authorizer: &authorizer,
            networks: &networks,
        };
        let config_map = json!({"metadata": {"name": "settings", "namespace": "apps"}});
        let decide = |user: UserInfo| {
            let (context, config_map) = (&context, &config_map);
            async move {
                let attributes = Attributes {
                    user: Some(&user),
                    ..crate::admission::testing::attributes(Operation::Create, "", "configmaps", "")
                };
                let mut warnings = Vec::new();
                ValidatingAdmissionPolicies
                    .validate(context, &attributes, config_map, &mut warnings)
                    .await
                    .map_err(|refusal| refusal.message)
            }
        };
        assert_eq!(
            decide(UserInfo::new("alice", &["system:authenticated"])).await,
            Ok(())
        );
        assert_eq!(
            decide(UserInfo::new("admin", &["system:masters"])).await,
            Ok(())
        );
        let refused = decide(UserInfo::new("bob", &["system:authenticated"])).await;
        assert_eq!(
            refused.err().as_deref(),
            Some(
                "configmaps \"settings\" is forbidden: ValidatingAdmissionPolicy 'secret-listers-only' with binding 'everywhere' denied request: bob may not list secrets"
            )
        );
        Ok(())
    }
}
