//! Upstream's ResourceQuota admission plugin: a create in a namespace with quotas is charged
//! against each quota that counts it, by a compare-and-swap on the quota's `status.used`
//! before the object is written, so two creates racing for the last unit cannot both pass.
//! A claim's resize, a pod's resize and a Service's type change are charged what they add.
//! Refusals carry upstream's texts (`exceeded quota: …, requested: …, used: …, limited: …`,
//! `status unknown for quota: …`, `failed quota: …: must specify …`). A dry run is checked,
//! never charged. The quota controller later recounts `status.used` from what is stored.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use flotilla_api_machinery::quantity::Quantity;
use flotilla_api_machinery::quota::{self, Usage};
use k8s_openapi::api::core::v1::{Pod, ResourceQuotaSpec};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::{Attributes, Context, Operation, Plugin, forbidden};
use crate::error::ApiError;
use crate::meta;
use crate::resources::Name;
use crate::resources::ResourceInfo;

/// The ResourceQuota plugin. Creates into one namespace are charged in batches, as upstream's
/// quota evaluator does: while one batch's compare-and-swaps are in flight the next creates
/// queue, and the following batch decides all of them against one fresh read of the quotas
/// and writes each quota once. Without it, 100 writers into one namespace would retry their
/// compare-and-swaps on the same quota until they gave up.
#[derive(Default)]
pub struct ResourceQuota {
    namespaces: std::sync::Mutex<HashMap<String, Arc<NamespaceQueue>>>,
}

/// The creates waiting to be charged in one namespace of one tenant.
#[derive(Default)]
struct NamespaceQueue {
    waiting: std::sync::Mutex<Vec<Waiter>>,
    /// Held by the request charging a batch.
    charging: tokio::sync::Mutex<()>,
}

/// One create waiting for its decision.
struct Waiter {
    kind: (Name, Name),
    usage: Usage,
    pod: Option<Pod>,
    dry_run: bool,
    decided: tokio::sync::oneshot::Sender<Result<(), Refusal>>,
}

/// Why a create was not charged.
enum Refusal {
    /// A quota does not allow it: upstream's text.
    Quota(String),
    /// The quotas could not be read or written.
    Api(ApiError),
}

/// How often a batch re-reads quotas another writer changed under it.
const CHARGE_ATTEMPTS: usize = 5;

#[async_trait::async_trait]
impl Plugin for ResourceQuota {
    fn name(&self) -> &'static str {
        "ResourceQuota"
    }

    fn handles(&self, attributes: &Attributes<'_>) -> bool {
        let kind = attributes.resource;
        // Updates change usage only for claims (a bigger request), Services (a type with load
        // balancers or node ports) and a pod's `resize` subresource, as upstream's evaluators
        // see it.
        let counted_on_update =
            kind.group.is_empty() && matches!(&*kind.plural, "persistentvolumeclaims" | "services");
        let resize = kind.group.is_empty() && &*kind.plural == "pods";
        let charged = match (attributes.operation, attributes.subresource) {
            (Operation::Create, "") => true,
            (Operation::Update, "") => counted_on_update,
            (Operation::Update, "resize") => resize,
            _ => false,
        };
        charged && !attributes.namespace.is_empty()
    }

    async fn validate(
        &self,
        context: &Context<'_>,
        attributes: &Attributes<'_>,
        object: &Value,
        _warnings: &mut Vec<String>,
    ) -> Result<(), ApiError> {
        let quotas_resource = context.resource("", "v1", "resourcequotas")?;
        if context
            .list_cached(quotas_resource, Some(attributes.namespace))
            .await?
            .is_empty()
        {
            return Ok(());
        }
        let resource = attributes.resource;
        let kind = (resource.group.clone(), resource.plural.clone());
        let mut usage = quota::usage_of(&kind.0, &kind.1, object, now());
        if let Some(old) = attributes.old {
            // An update is charged what it adds (upstream's SubtractWithNonNegativeResult).
            let before = quota::usage_of(&kind.0, &kind.1, old, now());
            usage = quota::added(&usage, &before);
            if usage.is_empty() {
                return Ok(());
            }
        }
        let (decided, decision) = tokio::sync::oneshot::channel();
        let is_pod = kind.0.is_empty() && kind.1 == "pods";
        let waiter = Waiter {
            kind,
            usage,
            pod: is_pod
                .then(|| serde_json::from_value::<Pod>(object.clone()).ok())
                .flatten(),
            dry_run: attributes.dry_run,
            decided,
        };
        let queue = self.queue(&context.tenant.id, attributes.namespace);
        if let Ok(mut waiting) = queue.waiting.lock() {
            waiting.push(waiter);
        }
        let mut decision = decision;
        let decided = loop {
            // Whoever holds the lock charges everything queued by then; a create already
            // decided by another holder's batch stops waiting for the lock.
            tokio::select! {
                biased;
                decided = &mut decision => break decided,
                _charging = queue.charging.lock() => {
                    let batch = match queue.waiting.lock() {
                        Ok(mut waiting) => std::mem::take(&mut *waiting),
                        Err(_) => Vec::new(),
                    };
                    if !batch.is_empty() {
                        charge_batch(context, quotas_resource, attributes.namespace, batch).await;
                    }
                }
            }
        };
        match decided {
            Ok(Ok(())) => Ok(()),
            Ok(Err(Refusal::Quota(why))) => Err(forbidden(attributes, object, &why)),
            Ok(Err(Refusal::Api(err))) => Err(err),
            Err(_) => Err(ApiError::internal(
                "resource quota evaluation was abandoned",
            )),
        }
    }
}

impl ResourceQuota {
    fn queue(&self, tenant: &str, namespace: &str) -> Arc<NamespaceQueue> {
        let key = format!("{tenant}/{namespace}");
        match self.namespaces.lock() {
            Ok(mut queues) => queues.entry(key).or_default().clone(),
            Err(_) => Arc::default(),
        }
    }
}

/// Decides every waiter of `batch` against the namespace's quotas and writes each charged
/// quota once, by compare-and-swap on the revision read. A quota another writer changed in
/// between is read again and the still-undecided waiters decided against it again
/// (upstream's `checkQuotas` retry).
async fn charge_batch(
    context: &Context<'_>,
    quotas_resource: &ResourceInfo,
    namespace: &str,
    batch: Vec<Waiter>,
) {
    let mut waiters: Vec<Option<Waiter>> = batch.into_iter().map(Some).collect();
    let mut only: Option<Vec<String>> = None;
    for _ in 0..CHARGE_ATTEMPTS {
        let mut quotas = match context.list(quotas_resource, Some(namespace)).await {
            Ok(quotas) => quotas,
            Err(err) => return refuse_all(&mut waiters, || Refusal::Api(err.clone())),
        };
        if let Some(names) = &only {
            quotas.retain(|q| names.iter().any(|n| n == meta::name(q)));
        }
        let read = quotas.clone();
        for slot in waiters.iter_mut() {
            let Some(waiter) = slot.as_ref() else {
                continue;
            };
            let mut tentative = quotas.clone();
            let mut refusal = None;
            for quota in tentative.iter_mut() {
                match charge(
                    quota,
                    (&waiter.kind.0, &waiter.kind.1),
                    &waiter.usage,
                    waiter.pod.as_ref(),
                ) {
                    Ok(Some(next)) => *quota = next,
                    Ok(None) => {}
                    Err(why) => {
                        refusal = Some(why);
                        break;
                    }
                }
            }
            match refusal {
                Some(why) => {
                    if let Some(waiter) = slot.take() {
                        let _ = waiter.decided.send(Err(Refusal::Quota(why)));
                    }
                }
                None if !waiter.dry_run => quotas = tentative,
                None => {}
            }
        }
        let mut conflicted = Vec::new();
        for (next, before) in quotas.iter().zip(&read) {
            if next == before {
                continue;
            }
            let expected = meta::resource_version(before).to_string();
            let name = meta::name(next).to_string();
            let written = context
                .store
                .guaranteed_update(
                    context.tenant,
                    quotas_resource,
                    namespace,
                    &name,
                    false,
                    |current| {
                        if meta::resource_version(current) != expected {
                            return Err(ApiError::conflict(
                                &quotas_resource.group_resource(),
                                &name,
                                "changed",
                            ));
                        }
                        Ok(Some(next.clone()))
                    },
                )
                .await;
            if written.is_err() {
                conflicted.push(name);
            }
        }
        if conflicted.is_empty() {
            for waiter in waiters.iter_mut().filter_map(Option::take) {
                let _ = waiter.decided.send(Ok(()));
            }
            return;
        }
        only = Some(conflicted);
    }
    refuse_all(&mut waiters, || {
        Refusal::Api(ApiError::conflict(
            &quotas_resource.group_resource(),
            "",
            "too many concurrent updates to the namespace's resource quotas, please try again",
        ))
    });
}

fn refuse_all(waiters: &mut [Option<Waiter>], refusal: impl Fn() -> Refusal) {
    for waiter in waiters.iter_mut().filter_map(Option::take) {
        let _ = waiter.decided.send(Err(refusal()));
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
