//! Upstream's NamespaceLifecycle admission plugin (`k8s.io/apiserver/.../namespace/lifecycle`):
//! nothing is created in a namespace that does not exist or is being terminated, and
//! `default`, `kube-system` and `kube-public` are never deleted. The rule and its messages are
//! defined here only; the store's create applies [`check_create`] once more just before its
//! write, because a namespace may start terminating after the chain looked.

use serde_json::Value;

use super::{Attributes, Context, Operation, Plugin, forbidden};
use crate::error::ApiError;
use crate::meta;
use crate::resources::GroupResource;

/// Namespaces the plugin refuses to delete.
pub const IMMORTAL_NAMESPACES: [&str; 3] = ["default", "kube-system", "kube-public"];

/// The NamespaceLifecycle plugin.
pub struct NamespaceLifecycle;

/// A create of `resource` named `name` in `namespace`, given that namespace as stored
/// (`None` when there is none): refused when it is absent or being terminated.
pub fn check_create(
    namespaces: &GroupResource,
    resource: &GroupResource,
    namespace: &str,
    name: &str,
    stored: Option<&Value>,
) -> Result<(), ApiError> {
    let Some(stored) = stored else {
        return Err(ApiError::not_found(namespaces, namespace));
    };
    if !meta::is_terminating(stored) {
        return Ok(());
    }
    let mut err = ApiError::forbidden(
        resource,
        name,
        &format!(
            "unable to create new content in namespace {namespace} because it is being terminated"
        ),
    );
    if let Some(details) = err.details.as_mut() {
        details.causes = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::StatusCause {
                reason: Some("NamespaceTerminating".into()),
                message: Some(format!("namespace {namespace} is being terminated")),
                field: Some("metadata.namespace".into()),
            },
        ]);
    }
    Err(err)
}

#[async_trait::async_trait]
impl Plugin for NamespaceLifecycle {
    fn name(&self) -> &'static str {
        "NamespaceLifecycle"
    }

    fn handles(&self, attributes: &Attributes<'_>) -> bool {
        match attributes.operation {
            Operation::Create => {
                attributes.subresource.is_empty()
                    && attributes.resource.namespaced
                    && !attributes.namespace.is_empty()
            }
            Operation::Delete => attributes.is_core("namespaces"),
            Operation::Update | Operation::Connect => false,
        }
    }

    async fn admit(
        &self,
        context: &Context<'_>,
        attributes: &Attributes<'_>,
        object: &mut Value,
        _warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        if attributes.operation == Operation::Delete {
            if IMMORTAL_NAMESPACES.contains(&meta::name(object)) {
                return Err(forbidden(
                    attributes,
                    object,
                    "this namespace may not be deleted",
                ));
            }
            return Ok(());
        }
        let namespaces = context.resource("", "v1", "namespaces")?;
        context
            .store
            .check_namespace_open(
                context.tenant,
                namespaces,
                attributes.resource,
                attributes.namespace,
                meta::name(object),
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn resource(plural: &str) -> GroupResource {
        GroupResource {
            group: String::new(),
            resource: plural.into(),
        }
    }

    #[test]
    fn creates_need_a_namespace_that_is_not_terminating() {
        let (namespaces, pods) = (resource("namespaces"), resource("pods"));
        let active = json!({"metadata": {"name": "apps"}});
        assert!(check_create(&namespaces, &pods, "apps", "web", Some(&active)).is_ok());

        let absent = check_create(&namespaces, &pods, "apps", "web", None).expect_err("absent");
        assert_eq!(
            (absent.code, absent.message.as_str()),
            (404, "namespaces \"apps\" not found")
        );

        let terminating = json!({"metadata": {"name": "apps",
            "deletionTimestamp": "2024-01-01T00:00:00Z"}});
        let refused = check_create(&namespaces, &pods, "apps", "web", Some(&terminating))
            .expect_err("terminating");
        assert_eq!(refused.code, 403);
        assert_eq!(
            refused.message,
            "pods \"web\" is forbidden: unable to create new content in namespace apps because it is being terminated"
        );
        let causes = refused
            .details
            .and_then(|d| d.causes)
            .expect("the NamespaceTerminating cause");
        assert_eq!(causes[0].reason.as_deref(), Some("NamespaceTerminating"));
        assert_eq!(causes[0].field.as_deref(), Some("metadata.namespace"));
    }

    #[test]
    fn only_namespaced_creates_and_namespace_deletes_are_its_business() {
        let resources = crate::resources::Resources::builtin();
        let find = |plural: &str| resources.find("", "v1", plural).expect("served");
        let attributes = |operation, resource, namespace| Attributes {
            operation,
            resource,
            subresource: "",
            namespace,
            name: "",
            user: None,
            dry_run: false,
            old: None,
        };
        let plugin = NamespaceLifecycle;
        assert!(plugin.handles(&attributes(Operation::Create, find("pods"), "apps")));
        assert!(!plugin.handles(&attributes(Operation::Create, find("nodes"), "")));
        assert!(!plugin.handles(&attributes(Operation::Update, find("pods"), "apps")));
        assert!(plugin.handles(&attributes(Operation::Delete, find("namespaces"), "")));
        assert!(!plugin.handles(&attributes(Operation::Delete, find("pods"), "apps")));
    }
}
