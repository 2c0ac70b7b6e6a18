//! Upstream's ResourceQuota admission plugin: a create in a namespace with quotas is charged
//! against each quota that counts it, by a compare-and-swap on the quota's `status.used`
//! before the object is written, so two creates racing for the last unit cannot both pass.
//! Refusals carry upstream's texts (`exceeded quota: …, requested: …, used: …, limited: …`,
//! `status unknown for quota: …`, `failed quota: …: must specify …`). A dry run is checked,
//! never charged. The quota controller later recounts `status.used` from what is stored.

use std::collections::BTreeMap;

use flotilla_api_machinery::quantity::Quantity;
use flotilla_api_machinery::quota::{self, Usage};
use k8s_openapi::api::core::v1::{Pod, ResourceQuotaSpec};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::{Attributes, Context, Operation, Plugin, forbidden};
use crate::error::ApiError;
use crate::meta;

/// The ResourceQuota plugin.
pub struct ResourceQuota;

#[async_trait::async_trait]
impl Plugin for ResourceQuota {
    fn name(&self) -> &'static str {
        "ResourceQuota"
    }

    fn handles(&self, attributes: &Attributes<'_>) -> bool {
        attributes.operation == Operation::Create
            && attributes.subresource.is_empty()
            && !attributes.namespace.is_empty()
    }

    async fn validate(
        &self,
        context: &Context<'_>,
        attributes: &Attributes<'_>,
        object: &Value,
        _warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        let quotas_resource = context.resource("", "v1", "resourcequotas")?;
        let quotas = context
            .list(quotas_resource, Some(attributes.namespace))
            .await?;
        if quotas.is_empty() {
            return Ok(());
        }
        let resource = attributes.resource;
        let usage = quota::usage_of(resource.group, resource.plural, object, now());
        let kind = (resource.group, resource.plural);
        let pod = (resource.group.is_empty() && resource.plural == "pods")
            .then(|| serde_json::from_value::<Pod>(object.clone()).ok())
            .flatten();
        // Every quota is checked before any is charged, so a refusal by one charges none.
        let mut charged = Vec::new();
        for quota in &quotas {
            if charge(quota, kind, &usage, pod.as_ref())
                .map_err(|why| forbidden(attributes, object, &why))?
                .is_some()
            {
                charged.push(meta::name(quota).to_string());
            }
        }
        if attributes.dry_run {
            return Ok(());
        }
        for name in charged {
            context
                .store
                .guaranteed_update(
                    context.tenant,
                    quotas_resource,
                    attributes.namespace,
                    &name,
                    false,
                    |current| {
                        charge(current, kind, &usage, pod.as_ref())
                            .map_err(|why| forbidden(attributes, object, &why))
                    },
                )
                .await?;
        }
        Ok(())
    }
}

fn now() -> Timestamp {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp::from_second(since_epoch.as_secs() as i64).unwrap_or(Timestamp::UNIX_EPOCH)
}

fn quantities(quota: &Value, field: &str) -> BTreeMap<String, Quantity> {
    meta::at(quota, &["status", field])
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(name, value)| {
            let parsed = Quantity::parse(value.as_str()?).ok()?;
            Some((name.clone(), parsed))
        })
        .collect()
}

/// `quota` with this object's usage added to `status.used`, or `None` when the quota does
/// not count the object; the refusal's text when the object does not fit (upstream's
/// `CheckRequest` for one quota).
fn charge(
    quota: &Value,
    (group, plural): (&str, &str),
    usage: &Usage,
    pod: Option<&Pod>,
) -> Result<Option<Value>, String> {
    let name = meta::name(quota);
    let hard = quantities(quota, "hard");
    let restricted: Vec<&str> = hard
        .keys()
        .map(String::as_str)
        .filter(|k| quota::counts(group, plural, k))
        .collect();
    if restricted.is_empty() {
        return Ok(None);
    }
    let spec: ResourceQuotaSpec = quota
        .get("spec")
        .cloned()
        .and_then(|s| serde_json::from_value(s).ok())
        .unwrap_or_default();
    let scoped = spec.scopes.as_ref().is_some_and(|s| !s.is_empty())
        || spec
            .scope_selector
            .as_ref()
            .is_some_and(|s| s.match_expressions.as_ref().is_some_and(|e| !e.is_empty()));
    match pod {
        // Only pods have scopes; a scoped quota counts no other kind.
        Some(pod) if !quota::pod_in_scope(pod, &spec) => return Ok(None),
        None if scoped => return Ok(None),
        _ => {}
    }
    if let Some(pod) = pod
        && let Some(missing) = quota::missing_pod_constraints(pod, &restricted)
    {
        return Err(format!("failed quota: {name}: {missing}"));
    }
    let used = quantities(quota, "used");
    if restricted.iter().any(|r| !used.contains_key(*r)) {
        return Err(format!(
            "status unknown for quota: {name}, resources: {}",
            restricted.join(",")
        ));
    }
    let requested: Usage = restricted
        .iter()
        .filter_map(|r| {
            usage
                .get(*r)
                .filter(|q| !q.is_zero())
                .map(|q| (r.to_string(), *q))
        })
        .collect();
    if requested.is_empty() {
        return Ok(None);
    }
    let mut next_used = used.clone();
    let mut exceeded = Vec::new();
    for (resource, amount) in &requested {
        let total = used.get(resource).copied().unwrap_or(Quantity::ZERO) + *amount;
        if hard.get(resource).is_some_and(|limit| total > *limit) {
            exceeded.push(resource.clone());
        }
        next_used.insert(resource.clone(), total);
    }
    if !exceeded.is_empty() {
        let mask = |of: &BTreeMap<String, Quantity>| -> Usage {
            exceeded
                .iter()
                .filter_map(|r| of.get(r).map(|q| (r.clone(), *q)))
                .collect()
        };
        return Err(format!(
            "exceeded quota: {name}, requested: {}, used: {}, limited: {}",
            quota::pretty_print(&mask(&requested)),
            quota::pretty_print(&mask(&used)),
            quota::pretty_print(&mask(&hard)),
        ));
    }
    let mut next = quota.clone();
    for (resource, total) in next_used {
        meta::set_at(
            &mut next,
            &["status", "used", &resource],
            json!(total.to_string()),
        );
    }
    Ok(Some(next))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(hard: Value, used: Value) -> Value {
        json!({"metadata": {"name": "q"}, "spec": {"hard": hard.clone()}, "status": {"hard": hard, "used": used}})
    }

    fn usage(object: Value, plural: &str) -> Usage {
        quota::usage_of("", plural, &object, now())
    }

    #[test]
    fn a_create_is_charged_until_the_quota_is_full() {
        let q = quota(json!({"configmaps": "2"}), json!({"configmaps": "1"}));
        let next = charge(
            &q,
            ("", "configmaps"),
            &usage(json!({}), "configmaps"),
            None,
        )
        .expect("fits")
        .expect("counted");
        assert_eq!(next["status"]["used"]["configmaps"], json!("2"));
        assert_eq!(
            charge(&next, ("", "configmaps"), &usage(json!({}), "configmaps"), None),
            Err("exceeded quota: q, requested: configmaps=1, used: configmaps=2, limited: configmaps=2".into())
        );
        // A quota that does not count the kind is not charged.
        assert_eq!(
            charge(&q, ("", "secrets"), &usage(json!({}), "secrets"), None),
            Ok(None)
        );
    }

    #[test]
    fn usage_must_be_known_before_anything_is_charged() {
        let q = json!({"metadata": {"name": "q"}, "status": {"hard": {"pods": "1"}}});
        let pod = json!({"spec": {"containers": [{"name": "c"}]}});
        let typed: Pod = serde_json::from_value(pod.clone()).expect("pod");
        assert_eq!(
            charge(&q, ("", "pods"), &usage(pod, "pods"), Some(&typed)),
            Err("status unknown for quota: q, resources: pods".into())
        );
    }

    #[test]
    fn compute_quotas_need_requests_and_count_them() {
        let q = quota(
            json!({"requests.cpu": "1", "pods": "5"}),
            json!({"requests.cpu": "800m", "pods": "1"}),
        );
        let bare = json!({"spec": {"containers": [{"name": "c"}]}});
        let typed: Pod = serde_json::from_value(bare.clone()).expect("pod");
        assert_eq!(
            charge(&q, ("", "pods"), &usage(bare, "pods"), Some(&typed)),
            Err("failed quota: q: must specify requests.cpu for: c".into())
        );
        let big = json!({"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "300m"}}}]}});
        let typed: Pod = serde_json::from_value(big.clone()).expect("pod");
        assert_eq!(
            charge(&q, ("", "pods"), &usage(big, "pods"), Some(&typed)),
            Err("exceeded quota: q, requested: requests.cpu=300m, used: requests.cpu=800m, limited: requests.cpu=1".into())
        );
    }

    #[test]
    fn scoped_quotas_count_only_pods_in_scope() {
        let mut q = quota(json!({"pods": "1"}), json!({"pods": "1"}));
        q["spec"]["scopes"] = json!(["NotBestEffort"]);
        let best_effort = json!({"spec": {"containers": [{"name": "c"}]}});
        let typed: Pod = serde_json::from_value(best_effort.clone()).expect("pod");
        assert_eq!(
            charge(&q, ("", "pods"), &usage(best_effort, "pods"), Some(&typed)),
            Ok(None)
        );
        let mut services = quota(json!({"services": "0"}), json!({"services": "0"}));
        services["spec"]["scopes"] = json!(["NotBestEffort"]);
        assert_eq!(
            charge(
                &services,
                ("", "services"),
                &usage(json!({}), "services"),
                None
            ),
            Ok(None)
        );
    }
}
