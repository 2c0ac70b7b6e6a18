//! Which Ingresses are this controller's (upstream's class loader and class-annotation
//! matcher), and the `alb` IngressClass every cluster gets so that `ingressClassName: alb`
//! works out of the box.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::networking::v1::{Ingress, IngressClass, IngressClassSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};

/// The controller name an IngressClass names to be ours.
pub const CONTROLLER: &str = "ingress.k8s.aws/alb";
/// The IngressClass created in every cluster, and the legacy annotation value that is ours.
pub const CLASS_NAME: &str = "alb";
/// The legacy class annotation, which wins over `spec.ingressClassName` (as upstream).
pub const CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";
/// Marks the cluster's default IngressClass.
pub const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";

fn is_our_class(class: &IngressClass) -> bool {
    class.spec.as_ref().and_then(|s| s.controller.as_deref()) == Some(CONTROLLER)
}

/// Whether this controller reconciles the Ingress: the legacy annotation says `alb`; or else
/// `spec.ingressClassName` names an IngressClass of controller [`CONTROLLER`]; or else, with
/// neither, the one default IngressClass is ours. An unknown class is not ours.
pub fn is_ours(ingress: &Ingress, classes: &[Arc<IngressClass>]) -> bool {
    if let Some(value) = ingress
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CLASS_ANNOTATION))
    {
        return value == CLASS_NAME;
    }
    if let Some(name) = ingress
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.as_deref())
    {
        return classes
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))
            .is_some_and(|c| is_our_class(c));
    }
    let defaults: Vec<&Arc<IngressClass>> = classes
        .iter()
        .filter(|c| {
            c.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
                .is_some_and(|v| v == "true")
        })
        .collect();
    // Several defaults are ambiguous (upstream refuses them): not ours to guess.
    matches!(defaults.as_slice(), [only] if is_our_class(only))
}

/// The class `spec.ingressClassName` names when no IngressClass of that name exists (and no
/// legacy annotation decides): no controller of the cluster can serve the Ingress, which
/// deserves a word rather than silence. A class that exists but is another controller's is
/// that controller's business.
pub fn unknown_class<'a>(ingress: &'a Ingress, classes: &[Arc<IngressClass>]) -> Option<&'a str> {
    let annotated = ingress
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(CLASS_ANNOTATION));
    let name = ingress.spec.as_ref()?.ingress_class_name.as_deref()?;
    let exists = classes
        .iter()
        .any(|c| c.metadata.name.as_deref() == Some(name));
    (!annotated && !exists).then_some(name)
}

/// The IngressClass this controller creates.
pub fn alb_class() -> IngressClass {
    IngressClass {
        metadata: ObjectMeta {
            name: Some(CLASS_NAME.into()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "flotilla-cloud-controller".to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(IngressClassSpec {
            controller: Some(CONTROLLER.into()),
            parameters: None,
        }),
    }
}

/// Creates the `alb` IngressClass when absent (an existing one, whatever it says, is left
/// alone), retrying with back-off until the API answers.
pub async fn ensure_alb_class(client: kube::Client) {
    let api: Api<IngressClass> = Api::all(client);
    let mut delay = Duration::from_secs(1);
    loop {
        let outcome = match api.get_opt(CLASS_NAME).await {
            Ok(Some(_)) => Ok(false),
            Ok(None) => match api.create(&PostParams::default(), &alb_class()).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
                Err(err) => Err(err),
            },
            Err(err) => Err(err),
        };
        match outcome {
            Ok(created) => {
                if created {
                    tracing::info!(class = CLASS_NAME, "created the IngressClass");
                }
                return;
            }
            Err(err) => {
                tracing::warn!(%err, retry_in = ?delay, "ensuring the alb IngressClass failed");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(60));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn class(name: &str, controller: &str, default: bool) -> Arc<IngressClass> {
        let annotations = if default {
            json!({DEFAULT_CLASS_ANNOTATION: "true"})
        } else {
            json!({})
        };
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "annotations": annotations},
                "spec": {"controller": controller},
            }))
            .expect("a class"),
        )
    }

    fn ingress(annotations: serde_json::Value, class_name: Option<&str>) -> Ingress {
        serde_json::from_value(json!({
            "metadata": {"name": "i", "annotations": annotations},
            "spec": {"ingressClassName": class_name},
        }))
        .expect("an ingress")
    }

    #[test]
    fn only_a_class_that_exists_nowhere_is_unknown() {
        let classes = [
            class("alb", CONTROLLER, false),
            class("nginx", "k8s.io/ingress-nginx", false),
        ];
        assert_eq!(
            unknown_class(&ingress(json!({}), Some("traefik")), &classes),
            Some("traefik")
        );
        assert_eq!(
            unknown_class(&ingress(json!({}), Some("nginx")), &classes),
            None
        );
        assert_eq!(unknown_class(&ingress(json!({}), None), &classes), None);
        let annotated = ingress(json!({CLASS_ANNOTATION: "traefik"}), Some("traefik"));
        assert_eq!(unknown_class(&annotated, &classes), None);
    }

    #[test]
    fn classes_resolve_as_upstream() {
        let alb = class("alb", CONTROLLER, false);
        let nginx = class("nginx", "k8s.io/ingress-nginx", false);
        let default_alb = class("alb-default", CONTROLLER, true);
        let default_nginx = class("nginx-default", "k8s.io/ingress-nginx", true);
        let cases = [
            (ingress(json!({}), Some("alb")), vec![alb.clone()], true),
            (
                ingress(json!({}), Some("nginx")),
                vec![alb.clone(), nginx.clone()],
                false,
            ),
            // An unknown class is not ours.
            (
                ingress(json!({}), Some("missing")),
                vec![alb.clone()],
                false,
            ),
            // The annotation wins over the class name.
            (
                ingress(json!({CLASS_ANNOTATION: "alb"}), Some("nginx")),
                vec![nginx.clone()],
                true,
            ),
            (
                ingress(json!({CLASS_ANNOTATION: "nginx"}), Some("alb")),
                vec![alb.clone()],
                false,
            ),
            // No class at all: the default class decides.
            (ingress(json!({}), None), vec![alb.clone()], false),
            (ingress(json!({}), None), vec![default_alb.clone()], true),
            (ingress(json!({}), None), vec![default_nginx.clone()], false),
            (
                ingress(json!({}), None),
                vec![default_alb.clone(), default_nginx.clone()],
                false,
            ),
        ];
        for (index, (ing, classes, want)) in cases.into_iter().enumerate() {
            assert_eq!(is_ours(&ing, &classes), want, "case {index}");
        }
    }

    #[test]
    fn the_created_class_is_ours() {
        let class = alb_class();
        assert_eq!(class.metadata.name.as_deref(), Some(CLASS_NAME));
        assert!(is_our_class(&class));
    }
}
