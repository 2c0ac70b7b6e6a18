//! Admission webhooks (upstream `k8s.io/apiserver/pkg/admission/plugin/webhook`): the
//! tenant's MutatingWebhookConfigurations and ValidatingWebhookConfigurations, matched
//! against each write by their rules, scope and selectors, and called with an
//! `admission.k8s.io/v1` AdmissionReview over HTTPS whose server must present a certificate
//! chaining to the webhook's `caBundle`. Mutating webhooks answer JSON patches (and are called
//! again once when `reinvocationPolicy: IfNeeded` and a later webhook changed the object);
//! validating webhooks allow or deny. `failurePolicy` decides what a failed call means.

use std::sync::Arc;
use std::time::Duration;

use flotilla_api_machinery::selector::LabelSelector;
use serde_json::{Value, json};

use super::{Attributes, Context, Operation, Plugin};
use crate::error::ApiError;
use crate::meta;
use crate::outbound;

/// Upstream's default `timeoutSeconds`.
const DEFAULT_TIMEOUT_SECONDS: u64 = 10;

/// The MutatingAdmissionWebhook plugin.
pub struct MutatingWebhooks;

/// The ValidatingAdmissionWebhook plugin.
pub struct ValidatingWebhooks;

/// Which kind of configuration a plugin reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Mutating,
    Validating,
}

impl Phase {
    fn plural(self) -> &'static str {
        match self {
            Phase::Mutating => "mutatingwebhookconfigurations",
            Phase::Validating => "validatingwebhookconfigurations",
        }
    }
}

/// Writes to the webhook configurations themselves are never sent to webhooks (upstream's
/// `IsExemptAdmissionConfigurationResource`): a broken webhook must not lock itself in.
pub(super) fn exempt(attributes: &Attributes<'_>) -> bool {
    attributes.resource.group == "admissionregistration.k8s.io"
}

#[async_trait::async_trait]
impl Plugin for MutatingWebhooks {
    fn name(&self) -> &'static str {
        "MutatingAdmissionWebhook"
    }

    fn handles(&self, attributes: &Attributes<'_>) -> bool {
        !exempt(attributes)
    }

    async fn admit(
        &self,
        context: &Context<'_>,
        attributes: &Attributes<'_>,
        object: &mut Value,
        warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        let hooks = matching(context, attributes, object, Phase::Mutating).await?;
        let mut reinvoke = Vec::new();
        for hook in &hooks {
            call_and_apply(context, attributes, hook, object, warnings, 0).await?;
            if hook.definition["reinvocationPolicy"] == json!("IfNeeded") {
                reinvoke.push((hook, object.clone()));
            }
        }
        // Reinvoked once, when a webhook after it changed the object (upstream's
        // reinvocation: at most one more call each).
        for (hook, seen) in reinvoke {
            if *object != seen {
                call_and_apply(context, attributes, hook, object, warnings, 1).await?;
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Plugin for ValidatingWebhooks {
    fn name(&self) -> &'static str {
        "ValidatingAdmissionWebhook"
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
        let hooks = matching(context, attributes, object, Phase::Validating).await?;
        // Called together, as upstream's validating dispatcher does; the first refusal (in
        // configuration order) is the answer.
        let answers = futures::future::join_all(
            hooks
                .iter()
                .map(|hook| call(context, attributes, hook, object, Phase::Validating)),
        )
        .await;
        for (hook, answer) in hooks.iter().zip(answers) {
            match answer {
                Ok(review) => {
                    warnings.extend(review.warnings);
                    if !review.allowed {
                        return Err(denied(&hook.name, &review.status));
                    }
                }
                Err(failure) => failed(hook, failure, Phase::Validating, 0)?,
            }
        }
        Ok(())
    }
}

/// One webhook of a configuration, with where it came from.
struct Hook {
    /// `webhooks[i].name`.
    name: String,
    /// Its configuration's name.
    configuration: String,
    /// Its place among every webhook of its phase, matching or not (upstream's index in the
    /// audit annotations' keys).
    index: usize,
    /// The webhook as configured.
    definition: Value,
    /// Set when the webhook's rules name another version of the requested kind
    /// (`matchPolicy: Equivalent`): the version it is sent the object in.
    as_version: Option<String>,
}

/// The configured webhooks of `phase` whose rules and selectors match the request, in
/// upstream's order (configurations by name, then their webhooks in order).
async fn matching(
    context: &Context<'_>,
    attributes: &Attributes<'_>,
    object: &Value,
    phase: Phase,
) -> Result<Vec<Hook>, ApiError> {
    let configurations_resource =
        context.resource("admissionregistration.k8s.io", "v1", phase.plural())?;
    let configurations = context.list_cached(configurations_resource, None).await?;
    if configurations.is_empty() {
        return Ok(Vec::new());
    }
    let mut sorted: Vec<&Value> = configurations.iter().collect();
    sorted.sort_by(|a, b| meta::name(a).cmp(meta::name(b)));
    let mut hooks = Vec::new();
    let mut cel_authorizer = super::CelAuthorizer::default();
    let mut index = 0;
    for configuration in sorted {
        for definition in configuration["webhooks"].as_array().into_iter().flatten() {
            let this = index;
            index += 1;
            let as_version = if rules_match(definition, attributes) {
                None
            } else {
                match equivalent_version(context, definition, attributes) {
                    Some(version) => Some(version),
                    None => continue,
                }
            };
            if !object_selector_matches(definition, attributes, object)? {
                continue;
            }
            if !namespace_selector_matches(context, definition, attributes, object).await? {
                continue;
            }
            if definition["matchConditions"]
                .as_array()
                .is_some_and(|c| !c.is_empty())
            {
                let authorizer = cel_authorizer.get(context).await?;
                if !conditions_match(definition, attributes, object, authorizer.as_ref())? {
                    continue;
                }
            }
            hooks.push(Hook {
                name: definition["name"].as_str().unwrap_or("").to_string(),
                configuration: meta::name(configuration).to_string(),
                index: this,
                definition: definition.clone(),
                as_version,
            });
        }
    }
    Ok(hooks)
}

fn operation_name(operation: Operation) -> &'static str {
    match operation {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

/// `matchPolicy: Equivalent` (the default): a rule naming another served version of the
/// requested kind matches too, and the webhook gets the object in that version. The versions
/// of a custom resource are equivalent (one storage, converted as the definition says);
/// built-in kinds are served in one version each.
fn equivalent_version(
    context: &Context<'_>,
    definition: &Value,
    attributes: &Attributes<'_>,
) -> Option<String> {
    if definition["matchPolicy"] == json!("Exact") || !attributes.resource.is_custom() {
        return None;
    }
    let resource = &attributes.resource;
    context
        .resources
        .iter()
        .filter(|r| r.group == resource.group && r.plural == resource.plural)
        .filter(|r| r.version != resource.version)
        .find(|other| {
            let as_other = Attributes {
                resource: other,
                ..*attributes
            };
            rules_match(definition, &as_other)
        })
        .map(|other| other.version.to_string())
}

/// The request's object (and old object) as the webhook's version has them: converted as
/// the definition converts (a webhook's conversion being a call of its own).
async fn in_version(
    attributes: &Attributes<'_>,
    object: &Value,
    version: &str,
) -> Result<(Value, Option<Value>), String> {
    let api_version = format!("{}/{version}", attributes.resource.group);
    let mut objects = vec![object.clone()];
    objects.extend(attributes.old.cloned());
    // A delete's review has no object: only real objects are converted.
    let mut present: Vec<Value> = objects
        .iter()
        .filter(|o| o.get("apiVersion").is_some())
        .cloned()
        .collect();
    attributes
        .resource
        .convert_all(&mut present, &api_version)
        .await
        .map_err(|err| err.message)?;
    let mut present = present.into_iter();
    let mut converted = objects.into_iter().map(|o| match o.get("apiVersion") {
        Some(_) => present.next().unwrap_or(o),
        None => o,
    });
    let object = converted.next().unwrap_or(Value::Null);
    Ok((object, converted.next()))
}

fn rules_match(definition: &Value, attributes: &Attributes<'_>) -> bool {
    rule_list_matches(&definition["rules"], attributes, None)
}

/// Whether one of `rules` names the request (with the object's name checked against a
/// rule's `resourceNames`, as policies' rules have them).
pub(super) fn rule_list_matches(
    rules: &Value,
    attributes: &Attributes<'_>,
    name: Option<&str>,
) -> bool {
    let operation = operation_name(attributes.operation);
    let named = |list: &Value, value: &str| {
        list.as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .any(|item| item == "*" || item == value)
    };
    let resource = &attributes.resource;
    rules.as_array().into_iter().flatten().any(|rule| {
        named(&rule["operations"], operation)
            && named(&rule["apiGroups"], &resource.group)
            && named(&rule["apiVersions"], &resource.version)
            && resource_named(&rule["resources"], &resource.plural, attributes.subresource)
            && scope_matches(rule["scope"].as_str().unwrap_or("*"), attributes)
            && rule["resourceNames"]
                .as_array()
                .filter(|names| !names.is_empty())
                .is_none_or(|names| names.iter().any(|n| Some(n.as_str().unwrap_or("")) == name))
    })
}

fn resource_named(list: &Value, plural: &str, subresource: &str) -> bool {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(|entry| {
            let (resource, sub) = entry.split_once('/').unwrap_or((entry, ""));
            (resource == "*" || resource == plural) && (sub == "*" || sub == subresource)
        })
}

fn scope_matches(scope: &str, attributes: &Attributes<'_>) -> bool {
    match scope {
        "Cluster" => attributes.namespace.is_empty(),
        "Namespaced" => !attributes.namespace.is_empty(),
        _ => true,
    }
}

fn selector(definition: &Value, field: &str) -> Result<LabelSelector, ApiError> {
    match definition.get(field) {
        None | Some(Value::Null) => Ok(LabelSelector::everything()),
        Some(selector) => LabelSelector::from_json(selector).map_err(|err| {
            ApiError::internal(format!(
                "webhook {:?} has an invalid {field}: {err}",
                definition["name"].as_str().unwrap_or("")
            ))
        }),
    }
}

/// `objectSelector`: the object's labels, or the old object's (either matching is enough).
pub(super) fn object_selector_matches(
    definition: &Value,
    attributes: &Attributes<'_>,
    object: &Value,
) -> Result<bool, ApiError> {
    let selector = selector(definition, "objectSelector")?;
    // A connect's old object is only there for the pod's name: its options have no labels.
    let old = attributes
        .old
        .filter(|_| attributes.operation != Operation::Connect);
    Ok(selector.matches(&meta::labels(object))
        || old.is_some_and(|old| selector.matches(&meta::labels(old))))
}

/// `namespaceSelector`: the labels of the request's namespace (of the object itself for a
/// Namespace); cluster-scoped objects always match.
pub(super) async fn namespace_selector_matches(
    context: &Context<'_>,
    definition: &Value,
    attributes: &Attributes<'_>,
    object: &Value,
) -> Result<bool, ApiError> {
    let selector = selector(definition, "namespaceSelector")?;
    if attributes.resource.group.is_empty() && attributes.resource.plural == "namespaces" {
        return Ok(selector.matches(&meta::labels(object)));
    }
    if attributes.namespace.is_empty() {
        return Ok(true);
    }
    let namespaces = context.resource("", "v1", "namespaces")?;
    let namespace = context
        .get_cached(namespaces, attributes.namespace)
        .await?
        .unwrap_or_else(|| json!({}));
    Ok(selector.matches(&meta::labels(&namespace)))
}

/// Compiled `matchConditions` by their text: compiling type-checks, which costs more than a
/// call's evaluation, so each set is compiled once.
type CompiledConditions = Arc<flotilla_cel::admission::MatchConditions>;
type ConditionsCache =
    std::sync::Mutex<std::collections::HashMap<Vec<(String, String)>, CompiledConditions>>;
static CONDITIONS: std::sync::LazyLock<ConditionsCache> =
    std::sync::LazyLock::new(Default::default);

/// `matchConditions`: every condition true (none: a match), `authorizer` checks decided by
/// `authorizer`. A condition that cannot be evaluated fails the request under
/// `failurePolicy: Fail` and skips the webhook under `Ignore`, as upstream's matcher decides.
fn conditions_match(
    definition: &Value,
    attributes: &Attributes<'_>,
    object: &Value,
    authorizer: Option<&Arc<dyn flotilla_cel::admission::RequestAuthorizer>>,
) -> Result<bool, ApiError> {
    let conditions = crate::strategies::match_conditions(definition);
    if conditions.is_empty() {
        return Ok(true);
    }
    let compiled = {
        let mut cache = CONDITIONS
            .lock()
            .map_err(|_| ApiError::internal("the match conditions' cache was poisoned"))?;
        if cache.len() > 1024 {
            cache.clear();
        }
        cache
            .entry(conditions.clone())
            .or_insert_with(|| {
                let borrowed: Vec<(&str, &str)> = conditions
                    .iter()
                    .map(|(n, e)| (n.as_str(), e.as_str()))
                    .collect();
                Arc::new(flotilla_cel::admission::MatchConditions::new(&borrowed))
            })
            .clone()
    };
    let review = admission_review("", attributes, object);
    let request = &review["request"];
    let inputs = flotilla_cel::admission::AdmissionInputs {
        object: Some(&request["object"]).filter(|o| !o.is_null()),
        old_object: Some(&request["oldObject"]).filter(|o| !o.is_null()),
        request,
        params: None,
        namespace_object: None,
        authorizer,
    };
    match compiled.evaluate(&inputs) {
        Ok(matched) => Ok(matched),
        Err(_) if definition["failurePolicy"] == json!("Ignore") => Ok(false),
        Err(why) => Err(ApiError::internal(format!(
            "failed calling webhook {:?}: failed to evaluate match conditions: {why}",
            definition["name"].as_str().unwrap_or("")
        ))),
    }
}

/// What a webhook answered.
struct Review {
    allowed: bool,
    status: Value,
    patch: Option<Value>,
    warnings: Vec<String>,
}

/// Calls a mutating webhook and applies its patch, or decides by its failure policy.
async fn call_and_apply(
    context: &Context<'_>,
    attributes: &Attributes<'_>,
    hook: &Hook,
    object: &mut Value,
    warnings: &mut Vec<String>,
    round: usize,
) -> Result<(), ApiError> {
    // Upstream's record of every mutating call that answered (`mutation.webhook…`); one
    // that failed open has its own (`failed-open…`).
    let mutated = call_and_patch(context, attributes, hook, object, warnings, round).await?;
    if let Some(mutated) = mutated {
        crate::audit::annotate(
            &format!(
                "mutation.webhook.admission.k8s.io/round_{round}_index_{}",
                hook.index
            ),
            json!({"configuration": hook.configuration, "webhook": hook.name, "mutated": mutated})
                .to_string(),
        );
    }
    Ok(())
}

/// [`call_and_apply`]'s call and patch: whether the patch changed the object, `None` when
/// the call failed open.
async fn call_and_patch(
    context: &Context<'_>,
    attributes: &Attributes<'_>,
    hook: &Hook,
    object: &mut Value,
    warnings: &mut Vec<String>,
    round: usize,
) -> Result<Option<bool>, ApiError> {
    match call(context, attributes, hook, object, Phase::Mutating).await {
        Ok(review) => {
            warnings.extend(review.warnings);
            if !review.allowed {
                return Err(denied(&hook.name, &review.status));
            }
            if let Some(patch) = review.patch {
                // A delete has no object to patch (upstream refuses the attempt the same way).
                if attributes.operation == Operation::Delete {
                    if patch.as_array().is_none_or(Vec::is_empty) {
                        return Ok(Some(false));
                    }
                    return Err(ApiError::internal(format!(
                        "admission webhook {:?} attempted to modify the object, which is not supported for this operation",
                        hook.name
                    )));
                }
                // A patch is of the object as the webhook saw it; it comes back in the
                // request's version.
                let seen = match &hook.as_version {
                    Some(version) => {
                        let no_old = Attributes {
                            old: None,
                            ..*attributes
                        };
                        match in_version(&no_old, object, version).await {
                            Ok((seen, _)) => seen,
                            Err(failure) => {
                                return failed(hook, failure, Phase::Mutating, round)
                                    .map(|()| None);
                            }
                        }
                    }
                    None => object.clone(),
                };
                let mut patched = [flotilla_api_machinery::patch::apply_json_patch(&seen, &patch)
                    .map_err(|err| {
                        ApiError::internal(format!(
                            "JSON Patch from admission webhook {:?} could not be applied: {err}",
                            hook.name
                        ))
                    })?];
                if hook.as_version.is_some() {
                    attributes
                        .resource
                        .convert_all(&mut patched, &attributes.resource.api_version())
                        .await?;
                }
                let [patched] = patched;
                let mutated = *object != patched;
                if mutated {
                    crate::audit::annotate_at(
                        crate::audit::Level::Request,
                        &format!(
                            "patch.webhook.admission.k8s.io/round_{round}_index_{}",
                            hook.index
                        ),
                        json!({
                            "configuration": hook.configuration,
                            "webhook": hook.name,
                            "patch": patch,
                            "patchType": "JSONPatch",
                        })
                        .to_string(),
                    );
                }
                *object = patched;
                return Ok(Some(mutated));
            }
            Ok(Some(false))
        }
        Err(failure) => failed(hook, failure, Phase::Mutating, round).map(|()| None),
    }
}

/// Upstream's `ToStatusErr`: a refusal in the webhook's words.
fn denied(name: &str, status: &Value) -> ApiError {
    let denied_by = format!("admission webhook {name:?} denied the request");
    let message = status["message"].as_str().unwrap_or("");
    let reason = status["reason"].as_str().unwrap_or("");
    let text = if !message.is_empty() {
        format!("{denied_by}: {message}")
    } else if !reason.is_empty() {
        format!("{denied_by}: {reason}")
    } else {
        format!("{denied_by} without explanation")
    };
    let code = status["code"]
        .as_u64()
        .and_then(|c| u16::try_from(c).ok())
        .unwrap_or(0);
    ApiError::from_status(code, reason, text)
}

/// A call that failed: fatal under `failurePolicy: Fail` (the default), logged and passed
/// over under `Ignore`.
fn failed(hook: &Hook, failure: String, phase: Phase, round: usize) -> Result<(), ApiError> {
    let message = format!("failed calling webhook {:?}: {failure}", hook.name);
    if hook.definition["failurePolicy"] == json!("Ignore") {
        tracing::warn!(webhook = %hook.name, %message, "admission webhook failed open");
        let kind = match phase {
            Phase::Mutating => "mutation",
            Phase::Validating => "validating",
        };
        crate::audit::annotate(
            &format!(
                "failed-open.{kind}.webhook.admission.k8s.io/round_{round}_index_{}",
                hook.index
            ),
            hook.name.clone(),
        );
        return Ok(());
    }
    Err(ApiError::internal(message))
}

/// Sends the AdmissionReview and reads the answer; `Err` is a failed call (the text after
/// upstream's `failed calling webhook "x": `).
async fn call(
    context: &Context<'_>,
    attributes: &Attributes<'_>,
    hook: &Hook,
    object: &Value,
    phase: Phase,
) -> Result<Review, String> {
    let definition = &hook.definition;
    if attributes.dry_run
        && !matches!(
            definition["sideEffects"].as_str(),
            Some("None" | "NoneOnDryRun")
        )
    {
        return Err(format!(
            "admission webhook {:?} does not support dry run",
            hook.name
        ));
    }
    let uid = uuid::Uuid::new_v4().to_string();
    let review = match &hook.as_version {
        None => admission_review(&uid, attributes, object),
        Some(version) => {
            // The equivalent version's kind and resource; the request's stay as requestKind
            // and requestResource.
            let (object, old) = in_version(attributes, object, version).await?;
            let converted = Attributes {
                old: old.as_ref(),
                ..*attributes
            };
            let mut review = admission_review(&uid, &converted, &object);
            review["request"]["kind"]["version"] = json!(version);
            review["request"]["resource"]["version"] = json!(version);
            review
        }
    };
    let timeout = Duration::from_secs(
        definition["timeoutSeconds"]
            .as_u64()
            .unwrap_or(DEFAULT_TIMEOUT_SECONDS)
            .clamp(1, 30),
    );
    let endpoint = outbound::resolve(&context.dialer(), &definition["clientConfig"]).await?;
    let url = format!(
        "https://{}{}?timeout={}s",
        endpoint.authority,
        endpoint.path,
        timeout.as_secs()
    );
    let body = serde_json::to_vec(&review).map_err(|err| err.to_string())?;
    let answer = tokio::time::timeout(timeout, outbound::post(&endpoint, &url, body))
        .await
        .map_err(|_| format!("failed to call webhook: Post {url:?}: context deadline exceeded"))?
        .map_err(|err| format!("failed to call webhook: Post {url:?}: {err}"))?;
    let answer: Value = serde_json::from_slice(&answer)
        .map_err(|err| format!("received invalid webhook response: {err}"))?;
    let response = &answer["response"];
    if !response.is_object() {
        return Err("received invalid webhook response: response is missing".to_string());
    }
    let answered_uid = response["uid"].as_str().unwrap_or("");
    if answered_uid != uid {
        return Err(format!(
            "received invalid webhook response: expected response.uid={uid:?}, got {answered_uid:?}"
        ));
    }
    let patch = match (response["patch"].as_str(), response["patchType"].as_str()) {
        (None, _) => None,
        // A validating webhook never changes the object, whatever it answers.
        (Some(_), _) if phase == Phase::Validating => None,
        (Some(encoded), Some("JSONPatch")) => {
            use base64::Engine as _;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|err| format!("received invalid webhook response: patch: {err}"))?;
            Some(
                serde_json::from_slice(&bytes)
                    .map_err(|err| format!("received invalid webhook response: patch: {err}"))?,
            )
        }
        (Some(_), other) => {
            return Err(format!(
                "received invalid webhook response: unsupported patch type {:?}",
                other.unwrap_or("")
            ));
        }
    };
    // Upstream records a webhook's audit annotations as `<webhook name>/<key>`.
    if let Some(annotations) = response["auditAnnotations"].as_object() {
        for (key, value) in annotations {
            if let Some(value) = value.as_str() {
                crate::audit::annotate(&format!("{}/{key}", hook.name), value);
            }
        }
    }
    Ok(Review {
        allowed: response["allowed"] == json!(true),
        status: response["result"]
            .as_object()
            .or_else(|| response["status"].as_object())
            .map(|s| Value::Object(s.clone()))
            .unwrap_or_else(|| json!({})),
        patch,
        warnings: response["warnings"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
    })
}

/// The AdmissionReview of a request (upstream's `CreateV1AdmissionReview`).
pub(super) fn admission_review(uid: &str, attributes: &Attributes<'_>, object: &Value) -> Value {
    let resource = &attributes.resource;
    let operation = operation_name(attributes.operation);
    // A connect's kind is its options' (`PodExecOptions`), as upstream's attributes carry.
    let kind_name = match attributes.operation {
        Operation::Connect => object["kind"].as_str().unwrap_or(&resource.kind),
        _ => &resource.kind,
    };
    let kind = json!({"group": resource.group, "version": resource.version, "kind": kind_name});
    let gvr =
        json!({"group": resource.group, "version": resource.version, "resource": resource.plural});
    let user = attributes.user.map_or_else(
        || json!({}),
        |user| {
            json!({"username": user.name, "uid": user.uid, "groups": user.groups, "extra": user.extra})
        },
    );
    let options = match attributes.operation {
        Operation::Create => json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}),
        Operation::Update => json!({"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"}),
        Operation::Delete => json!({"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1"}),
        Operation::Connect => Value::Null,
    };
    // A delete's review carries the stored object as `oldObject` and no `object`; a
    // connect's, its options as `object` and the pod's name.
    let (object, old, name) = match attributes.operation {
        Operation::Delete => {
            let old = attributes.old.or(Some(object));
            (&Value::Null, old, meta::name(old.unwrap_or(object)))
        }
        Operation::Connect => (object, None, attributes.old.map(meta::name).unwrap_or("")),
        _ => (
            object,
            attributes.old,
            meta::name(attributes.old.unwrap_or(object)),
        ),
    };
    let mut request = json!({
        "uid": uid,
        "kind": kind, "resource": gvr,
        "requestKind": kind, "requestResource": gvr,
        "name": name,
        "namespace": attributes.namespace,
        "operation": operation,
        "userInfo": user,
        "object": object,
        "oldObject": old.cloned().unwrap_or(Value::Null),
        "dryRun": attributes.dry_run,
        "options": options,
    });
    if !attributes.subresource.is_empty() {
        request["subResource"] = json!(attributes.subresource);
        request["requestSubResource"] = json!(attributes.subresource);
    }
    json!({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": request})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_rules_name_subresources_as_upstream_matches_them() {
        let rules = json!(["pods", "deployments/scale"]);
        assert!(resource_named(&rules, "pods", ""));
        assert!(!resource_named(&rules, "pods", "status"));
        assert!(resource_named(&rules, "deployments", "scale"));
        assert!(!resource_named(&rules, "deployments", ""));
        // `*` is every resource but no subresource; `*/*` everything; `pods/*` pods and every
        // subresource of it (upstream's matcher compares the `*` with the empty subresource
        // too).
        assert!(resource_named(&json!(["*"]), "widgets", ""));
        assert!(!resource_named(&json!(["*"]), "pods", "status"));
        assert!(resource_named(&json!(["*/*"]), "pods", "status"));
        assert!(resource_named(&json!(["pods/*"]), "pods", "log"));
        assert!(resource_named(&json!(["pods/*"]), "pods", ""));
        assert!(resource_named(&json!(["*/status"]), "widgets", "status"));
    }

    #[test]
    fn refusals_read_as_upstreams_to_status_err() {
        let with_message = denied("deny.example.com", &json!({"code": 403, "message": "no"}));
        assert_eq!(with_message.code, 403);
        assert_eq!(
            with_message.message,
            "admission webhook \"deny.example.com\" denied the request: no"
        );
        let bare = denied("deny.example.com", &json!({}));
        assert_eq!(bare.code, 400);
        assert_eq!(
            bare.message,
            "admission webhook \"deny.example.com\" denied the request without explanation"
        );
    }
}
