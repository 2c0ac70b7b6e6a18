//! Upstream's PodSecurity admission plugin: a pod is checked against the Pod Security
//! Standards level its namespace's `pod-security.kubernetes.io/{enforce,warn}` labels (and
//! their `-version` labels) name — `enforce` refuses it with upstream's 403, `warn` lets it
//! through with upstream's `Warning` header. Pod templates of the workload kinds are checked
//! for warnings only, as upstream does. A namespace's labels must name real levels and
//! versions, and a new `enforce` level is checked against the pods already there (warnings).
//! The checks themselves are `flotilla_api_machinery::pod_security`, run as a server of this
//! Kubernetes version.

use std::collections::BTreeMap;

use flotilla_api_machinery::pod_security::{self, Level, LevelVersion, Policy, Version};
use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use super::{Attributes, Context, Operation, Plugin, forbidden};
use crate::error::ApiError;
use crate::meta;

/// The PodSecurity plugin, with upstream's shipped defaults (`privileged` at every mode, no
/// exemptions) for namespaces without labels.
pub struct PodSecurity;

/// The audit annotation naming the exemption that let a pod through unchecked.
const EXEMPT_ANNOTATION: &str = "pod-security.kubernetes.io/exempt";
/// The audit annotation naming the enforced level and version a pod was checked at.
const ENFORCE_POLICY_ANNOTATION: &str = "pod-security.kubernetes.io/enforce-policy";

/// Where the pod template of each workload kind is.
fn template_path(group: &str, plural: &str) -> Option<&'static [&'static str]> {
    match (group, plural) {
        ("", "replicationcontrollers")
        | ("apps", "deployments" | "replicasets" | "statefulsets" | "daemonsets")
        | ("batch", "jobs") => Some(&["spec", "template"]),
        ("batch", "cronjobs") => Some(&["spec", "jobTemplate", "spec", "template"]),
        _ => None,
    }
}

#[async_trait::async_trait]
impl Plugin for PodSecurity {
    fn name(&self) -> &'static str {
        "PodSecurity"
    }

    fn handles(&self, attributes: &Attributes<'_>) -> bool {
        let kind = attributes.resource;
        let pods = kind.group.is_empty() && kind.plural == "pods";
        let namespaces = kind.group.is_empty() && kind.plural == "namespaces";
        match (attributes.operation, attributes.subresource) {
            (Operation::Create | Operation::Update, "") if namespaces => true,
            (Operation::Create, "") => pods || template_path(&kind.group, &kind.plural).is_some(),
            // A pod's spec changes only where upstream allows (images, and debuggers through
            // ephemeralcontainers); both are checked as upstream checks them.
            (Operation::Update, "" | "ephemeralcontainers") => pods,
            _ => false,
        }
    }

    async fn validate(
        &self,
        context: &Context<'_>,
        attributes: &Attributes<'_>,
        object: &Value,
        warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        if attributes.resource.plural == "namespaces" {
            return validate_namespace(context, attributes, object, warnings).await;
        }
        let exemptions = &context.pod_security.exemptions;
        let runtime_class = meta::str_at(object, &["spec", "runtimeClassName"]).unwrap_or("");
        let exemption = if exemptions
            .namespaces
            .iter()
            .any(|n| n == attributes.namespace)
        {
            Some("namespace")
        } else if attributes
            .user
            .is_some_and(|u| exemptions.usernames.contains(&u.name))
        {
            Some("user")
        } else if !runtime_class.is_empty()
            && exemptions
                .runtime_classes
                .iter()
                .any(|c| c == runtime_class)
        {
            Some("runtimeClass")
        } else {
            None
        };
        if let Some(exemption) = exemption {
            crate::audit::annotate(EXEMPT_ANNOTATION, exemption);
            return Ok(());
        }
        // An update that leaves the spec as it was (labels, annotations) is not checked.
        if let Some(old) = attributes.old
            && old.get("spec") == object.get("spec")
        {
            return Ok(());
        }
        let namespaces = context.resource("", "v1", "namespaces")?;
        let labels: BTreeMap<String, String> = context
            .get_cached(namespaces, attributes.namespace)
            .await?
            .and_then(|namespace| meta::at(&namespace, &["metadata", "labels"]).cloned())
            .and_then(|labels| serde_json::from_value(labels).ok())
            .unwrap_or_default();
        let (policy, label_errors) = pod_security::policy_to_evaluate(&labels, defaults(context));
        let is_pod = attributes.resource.group.is_empty() && attributes.resource.plural == "pods";
        let recording = crate::audit::recording();
        let audited = recording && policy.audit.level != Level::Privileged;
        if policy.enforce.level == Level::Privileged
            && policy.warn.level == Level::Privileged
            && !audited
        {
            // Upstream's short-circuit for fully privileged namespaces still names the policy.
            if is_pod && label_errors.is_empty() {
                crate::audit::annotate(
                    ENFORCE_POLICY_ANNOTATION,
                    LevelVersion::new(Level::Privileged, Version::Latest).to_string(),
                );
            }
            return Ok(());
        }
        if recording && !label_errors.is_empty() {
            crate::audit::annotate(
                "pod-security.kubernetes.io/error",
                format!(
                    "Failed to parse policy: {}",
                    flotilla_api_machinery::field::aggregate(&label_errors)
                ),
            );
        }
        let template = match template_path(&attributes.resource.group, &attributes.resource.plural)
        {
            Some(path) => match meta::at(object, path) {
                Some(template) => template,
                None => return Ok(()),
            },
            None => object,
        };
        let metadata: ObjectMeta = template
            .get("metadata")
            .cloned()
            .and_then(|m| serde_json::from_value(m).ok())
            .unwrap_or_default();
        let Some(spec) = template
            .get("spec")
            .cloned()
            .and_then(|s| serde_json::from_value::<PodSpec>(s).ok())
        else {
            return Ok(());
        };
        let check = |level_version: LevelVersion| {
            pod_security::check_pod_emulating(level_version, emulated(), &metadata, &spec)
        };
        if is_pod {
            crate::audit::annotate(ENFORCE_POLICY_ANNOTATION, policy.enforce.to_string());
        }
        let enforced = check(policy.enforce);
        if audited {
            let violations = if policy.audit == policy.enforce {
                enforced.clone()
            } else {
                check(policy.audit)
            };
            if !violations.is_empty() {
                crate::audit::annotate(
                    "pod-security.kubernetes.io/audit-violations",
                    pod_security::warning_message(policy.audit, &violations),
                );
            }
        }
        if !enforced.is_empty() {
            if is_pod {
                return Err(forbidden(
                    attributes,
                    object,
                    &pod_security::denial_message(policy.enforce, &enforced),
                ));
            }
            warnings.push(pod_security::warning_message(policy.enforce, &enforced));
        }
        // A pod already refused gets no warnings; a template gets both, once each.
        if is_pod || !policy.warn.equivalent(&policy.enforce) {
            let warned = check(policy.warn);
            if !warned.is_empty() {
                warnings.push(pod_security::warning_message(policy.warn, &warned));
            }
        }
        Ok(())
    }
}

fn labels_of(object: &Value) -> BTreeMap<String, String> {
    meta::at(object, &["metadata", "labels"])
        .and_then(|labels| serde_json::from_value(labels.clone()).ok())
        .unwrap_or_default()
}

/// Upstream's `ValidateNamespace`: labels naming no level or version are refused (on an
/// update, only when they changed); a new `enforce` policy is checked against the pods
/// already in the namespace, which stay, and each kind of violation comes back as a warning
/// naming the pods (`web-1 (and 2 other pods): privileged, …`).
async fn validate_namespace(
    context: &Context<'_>,
    attributes: &Attributes<'_>,
    namespace: &Value,
    warnings: &mut Vec<String>,
) -> Result<(), ApiError> {
    let labels = labels_of(namespace);
    let (policy, errors) = pod_security::policy_to_evaluate(&labels, defaults(context));
    let old = attributes.old.map(|old| {
        let old_labels = labels_of(old);
        let (old_policy, _) = pod_security::policy_to_evaluate(&old_labels, defaults(context));
        (old_labels, old_policy)
    });
    let labels_changed = old
        .as_ref()
        .is_none_or(|(old_labels, _)| *old_labels != labels);
    if !errors.is_empty() && labels_changed {
        return Err(ApiError::invalid(
            "",
            "namespaces",
            meta::name(namespace),
            errors,
        ));
    }
    let Some((_, old_policy)) = old else {
        return Ok(());
    };
    let name = meta::name(namespace);
    if policy.enforce.level == Level::Privileged
        || policy.enforce.equivalent(&old_policy.enforce)
        || context
            .pod_security
            .exemptions
            .namespaces
            .iter()
            .any(|n| n == name)
    {
        return Ok(());
    }
    let pods = context.resource("", "v1", "pods")?;
    let mut by_reasons: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pod in context.list(pods, Some(name)).await?.iter() {
        let Some(spec) = pod
            .get("spec")
            .cloned()
            .and_then(|s| serde_json::from_value::<PodSpec>(s).ok())
        else {
            continue;
        };
        let metadata: ObjectMeta = pod
            .get("metadata")
            .cloned()
            .and_then(|m| serde_json::from_value(m).ok())
            .unwrap_or_default();
        let violations =
            pod_security::check_pod_emulating(policy.enforce, emulated(), &metadata, &spec);
        if !violations.is_empty() {
            by_reasons
                .entry(pod_security::forbidden_reason(&violations))
                .or_default()
                .push(meta::name(pod).to_string());
        }
    }
    if by_reasons.is_empty() {
        return Ok(());
    }
    warnings.push(format!(
        "existing pods in namespace {name:?} violate the new PodSecurity enforce level {:?}",
        policy.enforce.to_string()
    ));
    let mut groups: Vec<(String, Vec<String>)> = by_reasons
        .into_iter()
        .map(|(reasons, mut names)| {
            names.sort();
            (reasons, names)
        })
        .collect();
    groups.sort_by(|a, b| a.1.first().cmp(&b.1.first()));
    for (reasons, names) in groups {
        let first = names.first().map(String::as_str).unwrap_or("");
        warnings.push(match names.len() {
            1 => format!("{first}: {reasons}"),
            2 => format!("{first} (and 1 other pod): {reasons}"),
            n => format!("{first} (and {} other pods): {reasons}", n - 1),
        });
    }
    Ok(())
}

/// The cluster's default policy (checked when it was set; upstream's if it cannot be read).
fn defaults(context: &Context<'_>) -> Policy {
    context.pod_security.policy().unwrap_or_default()
}

/// The Kubernetes version this server is: what `latest` means.
fn emulated() -> Version {
    crate::discovery::KUBERNETES_MINOR
        .parse()
        .map(Version::V1)
        .unwrap_or(Version::Latest)
}
