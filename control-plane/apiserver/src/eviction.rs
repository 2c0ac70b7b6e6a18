//! The `pods/eviction` subresource (upstream `pkg/registry/core/pod/storage/eviction.go`): a
//! pod is deleted only if the PodDisruptionBudget selecting it allows one more disruption,
//! which is taken from the budget (`disruptionsAllowed` down by one, the pod recorded in
//! `status.disruptedPods` for the disruption controller) before the pod gets the
//! DisruptionTarget condition and is deleted with the Eviction's DeleteOptions.

use flotilla_api_machinery::selector::LabelSelector;
use serde_json::{Value, json};

use crate::ApiServer;
use crate::error::ApiError;
use crate::meta;
use crate::resources::{GroupResource, ResourceInfo};
use crate::selection::Selection;
use crate::store::{DeleteOptions, ListOptions, ReadAt, Tenant};

/// Upstream's MaxDisruptedPodSize: more granted-but-unconfirmed evictions than this are refused.
const MAX_DISRUPTED_POD_SIZE: usize = 2000;
/// The refusal kubectl drain prints and retries on.
const WOULD_VIOLATE: &str = "Cannot evict pod as it would violate the pod's disruption budget.";

/// What the PodDisruptionBudget check decided for one eviction.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// No budget covers the pod, or it allowed (and was charged) one disruption.
    Allowed,
    /// The pod is not ready and the budget is satisfied without it: delete it, but only in
    /// the state it was checked in (its resourceVersion as precondition).
    AllowedIfUnchanged,
}

/// Evicts pod `namespace/name` as `eviction` (a policy/v1 or v1beta1 Eviction) asks.
pub async fn evict(
    server: &ApiServer,
    tenant: &Tenant,
    pods: &ResourceInfo,
    namespace: &str,
    name: &str,
    eviction: &Value,
    query_dry_run: bool,
) -> Result<(), ApiError> {
    let api_version = meta::str_at(eviction, &["apiVersion"]).unwrap_or("");
    if meta::str_at(eviction, &["kind"]).is_some_and(|k| k != "Eviction")
        || !matches!(api_version, "" | "policy/v1" | "policy/v1beta1")
    {
        return Err(ApiError::bad_request(format!(
            "not a Eviction object: {api_version} {}",
            meta::str_at(eviction, &["kind"]).unwrap_or("")
        )));
    }
    if meta::name(eviction) != name {
        return Err(ApiError::bad_request(
            "name in URL does not match name in Eviction object",
        ));
    }
    let mut options = DeleteOptions::default();
    let mut propagation = None;
    let mut dry_run = query_dry_run;
    if let Some(body) = eviction.get("deleteOptions").filter(|b| b.is_object()) {
        crate::handler::apply_delete_body(body, &mut options, &mut propagation, &mut dry_run);
    }
    crate::handler::set_propagation(&mut options, propagation.as_deref())?;
    let client_gave_version = options.resource_version.is_some();

    let pod = server
        .store
        .get(tenant, pods, namespace, name, ReadAt::Latest)
        .await?;
    if can_ignore_budget(&pod) {
        if should_enforce_resource_version(&pod) && !client_gave_version {
            options.resource_version = Some(meta::resource_version(&pod).to_string());
        }
        return delete(
            server, tenant, pods, namespace, name, &options, dry_run, false,
        )
        .await;
    }
    let verdict = check_budgets(server, tenant, namespace, name, &pod, dry_run).await?;
    let enforced = verdict == Verdict::AllowedIfUnchanged;
    if enforced {
        options.resource_version = Some(meta::resource_version(&pod).to_string());
    }
    match delete(
        server, tenant, pods, namespace, name, &options, dry_run, true,
    )
    .await
    {
        // The unready pod changed since it was checked: the client should come back.
        Err(err) if err.code == 409 && enforced && !client_gave_version => Err(still_processing(
            covering_budget_name(server, tenant, namespace, &pod).await,
        )),
        outcome => outcome,
    }
}

/// Upstream's canIgnorePDB: a pod that is finished, pending or already deleting disrupts
/// nothing more by going.
fn can_ignore_budget(pod: &Value) -> bool {
    matches!(
        meta::str_at(pod, &["status", "phase"]),
        Some("Succeeded" | "Failed" | "Pending")
    ) || meta::is_terminating(pod)
}

/// Upstream's shouldEnforceResourceVersion: a live pod is deleted only as it was checked.
fn should_enforce_resource_version(pod: &Value) -> bool {
    !matches!(
        meta::str_at(pod, &["status", "phase"]),
        Some("Succeeded" | "Failed")
    ) && !meta::is_terminating(pod)
}

fn is_ready(pod: &Value) -> bool {
    meta::at(pod, &["status", "conditions"])
        .and_then(Value::as_array)
        .is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

fn budgets_resource(server: &ApiServer) -> Result<&ResourceInfo, ApiError> {
    server
        .resources
        .find("policy", "v1", "poddisruptionbudgets")
        .map(|resource| &**resource)
        .ok_or_else(|| ApiError::internal("poddisruptionbudgets are not served"))
}

/// The budgets in `namespace` whose (non-empty) selector matches `pod`.
async fn matching_budgets(
    server: &ApiServer,
    tenant: &Tenant,
    namespace: &str,
    pod: &Value,
) -> Result<Vec<Value>, ApiError> {
    let budgets = budgets_resource(server)?;
    let page = server
        .store
        .list(
            tenant,
            budgets,
            Some(namespace),
            &ListOptions {
                read_at: ReadAt::Latest,
                selection: Selection::default(),
                limit: 0,
                continue_token: None,
            },
        )
        .await?;
    let labels = meta::at(pod, &["metadata", "labels"]);
    Ok(page
        .items
        .into_iter()
        .filter(|budget| {
            // A budget with an invalid, missing or empty selector matches nothing here.
            LabelSelector::from_optional_json(meta::at(budget, &["spec", "selector"]))
                .is_ok_and(|s| !s.is_empty() && s.matches_json(labels))
        })
        .collect())
}

async fn covering_budget_name(
    server: &ApiServer,
    tenant: &Tenant,
    namespace: &str,
    pod: &Value,
) -> String {
    matching_budgets(server, tenant, namespace, pod)
        .await
        .ok()
        .and_then(|b| b.first().map(|b| meta::name(b).to_string()))
        .unwrap_or_default()
}

/// The 429 of a budget whose status is behind its spec (or a pod that changed under us).
fn still_processing(budget: String) -> ApiError {
    too_many_requests(
        10,
        format!("The disruption budget {budget} is still being processed by the server."),
    )
}

/// Upstream's NewTooManyRequests with a DisruptionBudget cause; a zero retry-after is left
/// out of the Status and the headers, as upstream omits it.
fn too_many_requests(retry_after: i32, cause: String) -> ApiError {
    let mut err = ApiError::too_many_requests(WOULD_VIOLATE, retry_after);
    if let Some(details) = err.details.as_mut() {
        if retry_after == 0 {
            details.retry_after_seconds = None;
        }
        details.causes = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::StatusCause {
                reason: Some("DisruptionBudget".into()),
                message: Some(cause),
                field: None,
            },
        ]);
    }
    err
}

/// Finds the budget covering `pod` and, unless the pod may go without one, takes one
/// disruption from it (upstream's checkAndDecrement, retried on conflicts by the store).
async fn check_budgets(
    server: &ApiServer,
    tenant: &Tenant,
    namespace: &str,
    pod_name: &str,
    pod: &Value,
    dry_run: bool,
) -> Result<Verdict, ApiError> {
    let budgets = matching_budgets(server, tenant, namespace, pod).await?;
    let budget = match budgets.as_slice() {
        [] => return Ok(Verdict::Allowed),
        [one] => one,
        _ => {
            return Err(ApiError::unknown(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
    };
    let budget_name = meta::name(budget).to_string();
    let current_healthy = meta::at(budget, &["status", "currentHealthy"])
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let desired_healthy = meta::at(budget, &["status", "desiredHealthy"])
        .and_then(Value::as_i64)
        .unwrap_or(0);
    if !is_ready(pod) {
        // An unhealthy pod does not count toward the budget: it may go without a charge
        // when the budget is met anyway, or always under AlwaysAllow.
        let always =
            meta::str_at(budget, &["spec", "unhealthyPodEvictionPolicy"]) == Some("AlwaysAllow");
        if always || (current_healthy >= desired_healthy && desired_healthy > 0) {
            return Ok(Verdict::AllowedIfUnchanged);
        }
    }
    let resource = budgets_resource(server)?;
    let forbidden = |why: &str| {
        ApiError::forbidden(
            &GroupResource {
                group: "policy".into(),
                resource: "poddisruptionbudget".into(),
            },
            &budget_name,
            why,
        )
    };
    let now = meta::now_rfc3339();
    server
        .store
        .guaranteed_update(tenant, resource, namespace, &budget_name, dry_run, |current| {
            let next = take_disruption(current, pod_name, &now)
                .map_err(|refusal| match refusal {
                    Refusal::StillProcessing => still_processing(budget_name.clone()),
                    Refusal::Negative => forbidden("pdb disruptions allowed is negative"),
                    Refusal::TooManyAwaited => forbidden(
                        "DisruptedPods map too big - too many evictions not confirmed by PDB controller",
                    ),
                    Refusal::NoneAllowed { desired, current } => too_many_requests(
                        0,
                        format!(
                            "The disruption budget {budget_name} needs {desired} healthy pods and has {current} currently"
                        ),
                    ),
                })?;
            Ok(Some(next))
        })
        .await?;
    Ok(Verdict::Allowed)
}

/// Why a budget refuses a disruption.
#[derive(Debug, PartialEq)]
enum Refusal {
    StillProcessing,
    Negative,
    TooManyAwaited,
    NoneAllowed { desired: i64, current: i64 },
}

/// The budget with one disruption taken for `pod` (granted at `now`), or why not.
fn take_disruption(budget: &Value, pod: &str, now: &str) -> Result<Value, Refusal> {
    let int = |path: &[&str]| meta::at(budget, path).and_then(Value::as_i64).unwrap_or(0);
    let generation = int(&["metadata", "generation"]);
    if int(&["status", "observedGeneration"]) < generation {
        return Err(Refusal::StillProcessing);
    }
    let allowed = int(&["status", "disruptionsAllowed"]);
    if allowed < 0 {
        return Err(Refusal::Negative);
    }
    let awaited = meta::at(budget, &["status", "disruptedPods"])
        .and_then(Value::as_object)
        .map_or(0, |m| m.len());
    if awaited > MAX_DISRUPTED_POD_SIZE {
        return Err(Refusal::TooManyAwaited);
    }
    if allowed == 0 {
        return Err(Refusal::NoneAllowed {
            desired: int(&["status", "desiredHealthy"]),
            current: int(&["status", "currentHealthy"]),
        });
    }
    let mut next = budget.clone();
    meta::set_at(
        &mut next,
        &["status", "disruptionsAllowed"],
        json!(allowed - 1),
    );
    if allowed == 1 {
        // Upstream's UpdateDisruptionAllowedCondition for the budget now exhausted.
        let mut conditions = meta::at(budget, &["status", "conditions"])
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let observed = meta::at(budget, &["status", "observedGeneration"]).cloned();
        match conditions
            .iter_mut()
            .find(|c| c["type"] == "DisruptionAllowed")
        {
            Some(existing) => {
                if existing["status"] != "False" {
                    existing["status"] = json!("False");
                    existing["lastTransitionTime"] = json!(now);
                }
                existing["reason"] = json!("InsufficientPods");
                existing["message"] = json!("");
                existing["observedGeneration"] = observed.unwrap_or(Value::Null);
            }
            None => conditions.push(json!({
                "type": "DisruptionAllowed", "status": "False", "reason": "InsufficientPods",
                "message": "", "observedGeneration": observed, "lastTransitionTime": now,
            })),
        }
        meta::set_at(&mut next, &["status", "conditions"], json!(conditions));
    }
    meta::set_at(&mut next, &["status", "disruptedPods", pod], json!(now));
    meta::remove_at(&mut next, &["metadata", "resourceVersion"]);
    Ok(next)
}

/// Upstream's addConditionAndDeletePod: the DisruptionTarget condition (unless a dry run),
/// then the delete with the Eviction's options.
#[allow(clippy::too_many_arguments)]
async fn delete(
    server: &ApiServer,
    tenant: &Tenant,
    pods: &ResourceInfo,
    namespace: &str,
    name: &str,
    options: &DeleteOptions,
    dry_run: bool,
    mark: bool,
) -> Result<(), ApiError> {
    let mut options = options.clone();
    if mark && !dry_run {
        let precondition = options.resource_version.clone();
        let now = meta::now_rfc3339();
        let marked = server
            .store
            .guaranteed_update(tenant, pods, namespace, name, false, |current| {
                if let Some(rv) = &precondition
                    && rv != meta::resource_version(current)
                {
                    return Err(ApiError::conflict(
                        &pods.group_resource(),
                        name,
                        &format!(
                            "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                            meta::resource_version(current)
                        ),
                    ));
                }
                let mut next = current.clone();
                let mut conditions = meta::at(current, &["status", "conditions"])
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                conditions.retain(|c| c["type"] != "DisruptionTarget");
                conditions.push(json!({
                    "type": "DisruptionTarget", "status": "True",
                    "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting",
                    "lastProbeTime": null, "lastTransitionTime": now,
                }));
                meta::set_at(&mut next, &["status", "conditions"], json!(conditions));
                meta::remove_at(&mut next, &["metadata", "resourceVersion"]);
                Ok(Some(next))
            })
            .await?;
        // The condition is this request's own write: the precondition moves past it.
        if precondition.is_some() {
            options.resource_version = Some(meta::resource_version(&marked).to_string());
        }
    }
    server
        .store
        .delete(
            tenant,
            pods,
            namespace,
            name,
            &options,
            dry_run,
            &server.allocator,
            None,
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(status: Value) -> Value {
        json!({"metadata": {"name": "web", "generation": 1, "resourceVersion": "7"}, "status": status})
    }

    #[test]
    fn a_disruption_is_taken_only_when_allowed() {
        let now = "2026-01-01T00:00:00Z";
        let exhausted = budget(
            json!({"observedGeneration": 1, "disruptionsAllowed": 0, "desiredHealthy": 3, "currentHealthy": 3}),
        );
        assert_eq!(
            take_disruption(&exhausted, "p", now),
            Err(Refusal::NoneAllowed {
                desired: 3,
                current: 3
            })
        );
        let behind = budget(json!({"observedGeneration": 0, "disruptionsAllowed": 1}));
        assert_eq!(
            take_disruption(&behind, "p", now),
            Err(Refusal::StillProcessing)
        );
        let negative = budget(json!({"observedGeneration": 1, "disruptionsAllowed": -1}));
        assert_eq!(take_disruption(&negative, "p", now), Err(Refusal::Negative));

        let one = budget(json!({"observedGeneration": 1, "disruptionsAllowed": 1,
            "conditions": [{"type": "DisruptionAllowed", "status": "True", "reason": "SufficientPods", "message": "", "lastTransitionTime": "2025-01-01T00:00:00Z"}]}));
        let next = take_disruption(&one, "p", now).expect("allowed");
        assert_eq!(next["status"]["disruptionsAllowed"], 0);
        assert_eq!(next["status"]["disruptedPods"]["p"], now);
        let condition = &next["status"]["conditions"][0];
        assert_eq!(
            (
                &condition["status"],
                &condition["reason"],
                &condition["lastTransitionTime"]
            ),
            (&json!("False"), &json!("InsufficientPods"), &json!(now))
        );
        assert!(next["metadata"].get("resourceVersion").is_none());

        let two = budget(
            json!({"observedGeneration": 1, "disruptionsAllowed": 2, "disruptedPods": {"q": now}}),
        );
        let next = take_disruption(&two, "p", now).expect("allowed");
        assert_eq!(next["status"]["disruptionsAllowed"], 1);
        assert_eq!(
            next["status"]["disruptedPods"].as_object().map(|m| m.len()),
            Some(2)
        );
        assert!(next["status"].get("conditions").is_none());
    }

    #[test]
    fn the_refusal_is_upstreams_429() {
        let err = too_many_requests(
            0,
            "The disruption budget web needs 3 healthy pods and has 3 currently".into(),
        );
        let status = err.to_status();
        assert_eq!(status.code, Some(429));
        assert_eq!(status.reason.as_deref(), Some("TooManyRequests"));
        assert_eq!(
            status.message.as_deref(),
            Some("Cannot evict pod as it would violate the pod's disruption budget.")
        );
        let details = status.details.expect("details");
        assert_eq!(details.retry_after_seconds, None);
        let cause = &details.causes.expect("causes")[0];
        assert_eq!(cause.reason.as_deref(), Some("DisruptionBudget"));
    }

    #[test]
    fn which_pods_skip_the_budget() {
        let pod = |phase: &str, deleting: bool| {
            let mut pod = json!({"metadata": {"name": "p"}, "status": {"phase": phase}});
            if deleting {
                pod["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            pod
        };
        assert!(can_ignore_budget(&pod("Pending", false)));
        assert!(can_ignore_budget(&pod("Succeeded", false)));
        assert!(can_ignore_budget(&pod("Running", true)));
        assert!(!can_ignore_budget(&pod("Running", false)));
        assert!(should_enforce_resource_version(&pod("Pending", false)));
        assert!(!should_enforce_resource_version(&pod("Failed", false)));
    }
}
