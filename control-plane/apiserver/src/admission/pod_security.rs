//! Upstream's PodSecurity admission plugin: a pod is checked against the Pod Security
//! Standards level its namespace's `pod-security.kubernetes.io/{enforce,warn}` labels (and
//! their `-version` labels) name — `enforce` refuses it with upstream's 403, `warn` lets it
//! through with upstream's `Warning` header. Pod templates of the workload kinds are checked
//! for warnings only, as upstream does. The checks themselves are
//! `flotilla_api_machinery::pod_security`, run as a server of this Kubernetes version.

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
        match (attributes.operation, attributes.subresource) {
            (Operation::Create, "") => pods || template_path(kind.group, kind.plural).is_some(),
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
        let (policy, _label_errors) = pod_security::policy_to_evaluate(&labels, Policy::default());
        if policy.enforce.level == Level::Privileged && policy.warn.level == Level::Privileged {
            return Ok(());
        }
        let template = match template_path(attributes.resource.group, attributes.resource.plural) {
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
        let is_pod = attributes.resource.group.is_empty() && attributes.resource.plural == "pods";
        let enforced = check(policy.enforce);
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

/// The Kubernetes version this server is: what `latest` means.
fn emulated() -> Version {
    crate::discovery::KUBERNETES_MINOR
        .parse()
        .map(Version::V1)
        .unwrap_or(Version::Latest)
}
