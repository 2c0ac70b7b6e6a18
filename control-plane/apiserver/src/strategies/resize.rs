//! The Pod `resize` subresource (upstream 1.33's in-place resize, `podResizeStrategy` and
//! `ValidatePodResize`): only the containers' (and sidecars') `resources` and `resizePolicy`
//! change through it; CPU and memory may change, other resources may not, requests and limits
//! may not be removed, the QoS class stays, memory limits drop only for a container that
//! restarts to take them, and Windows pods are not resized.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::error::{FieldError, Path};
use crate::meta::{self, at, str_at};

/// The containers' lists a resize may touch.
const LISTS: [&str; 2] = ["containers", "initContainers"];

/// Upstream's `dropNonResizeUpdates`: `current` with the `resources` and `resizePolicy` of
/// `requested`'s containers of the same name, nothing else of `requested`.
pub(crate) fn resize_only(requested: &Value, current: &Value) -> Value {
    let mut next = current.clone();
    for list in LISTS {
        let wanted: BTreeMap<&str, &Value> = at(requested, &["spec", list])
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|c| (str_at(c, &["name"]).unwrap_or(""), c))
            .collect();
        let Some(containers) = next
            .get_mut("spec")
            .and_then(|spec| spec.get_mut(list))
            .and_then(Value::as_array_mut)
        else {
            continue;
        };
        for container in containers {
            let name = str_at(container, &["name"]).unwrap_or("").to_string();
            let Some(source) = wanted.get(name.as_str()) else {
                continue;
            };
            for field in ["resources", "resizePolicy"] {
                match source.get(field) {
                    Some(value) => meta::set_at(container, &[field], value.clone()),
                    None => {
                        meta::remove_at(container, &[field]);
                    }
                }
            }
        }
    }
    next
}

/// The quantities of `container`'s `resources.<kind>`.
fn quantities<'a>(container: &'a Value, kind: &str) -> BTreeMap<&'a str, &'a Value> {
    at(container, &["resources", kind])
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(name, value)| (name.as_str(), value))
        .collect()
}

/// A quantity, for comparing a limit's old and new.
fn amount(quantity: &Value) -> Option<flotilla_api_machinery::quantity::Quantity> {
    let text = match quantity {
        Value::String(text) => text.clone(),
        Value::Number(n) => n.to_string(),
        _ => return None,
    };
    flotilla_api_machinery::quantity::Quantity::parse(&text).ok()
}

/// The restart policy a container's `resizePolicy` gives `resource` (`NotRequired` unless it
/// says otherwise).
fn restart_policy<'a>(container: &'a Value, resource: &str) -> &'a str {
    at(container, &["resizePolicy"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|p| str_at(p, &["resourceName"]) == Some(resource))
        .and_then(|p| str_at(p, &["restartPolicy"]))
        .unwrap_or("NotRequired")
}

/// Errors in a resize of `old` to `new` (what [`resize_only`] made of the request).
pub(crate) fn validate(
    new: &Value,
    old: &Value,
    qos_class: fn(&Value) -> &'static str,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if str_at(new, &["spec", "os", "name"]) == Some("windows") {
        errors.push(FieldError::forbidden(
            &Path::new("spec.os.name"),
            "windows pods cannot be resized",
        ));
        return errors;
    }
    for list in LISTS {
        let old_containers = at(old, &["spec", list]).and_then(Value::as_array);
        let new_containers = at(new, &["spec", list]).and_then(Value::as_array);
        let (Some(old_containers), Some(new_containers)) = (old_containers, new_containers) else {
            continue;
        };
        for (index, (previous, next)) in old_containers.iter().zip(new_containers).enumerate() {
            let path = Path::new("spec").child(list).index(index);
            validate_container(&path, previous, next, &mut errors);
        }
    }
    if errors.is_empty() && qos_class(new) != qos_class(old) {
        errors.push(FieldError::invalid(
            &Path::new("spec"),
            Value::from(qos_class(new)),
            "Pod QOS Class may not change as a result of resizing",
        ));
    }
    errors
}

fn validate_container(path: &Path, old: &Value, new: &Value, errors: &mut Vec<FieldError>) {
    let resources = path.child("resources");
    for kind in ["requests", "limits"] {
        let before = quantities(old, kind);
        let after = quantities(new, kind);
        for (name, value) in &before {
            match after.get(name) {
                None if matches!(*name, "cpu" | "memory") => errors.push(FieldError::forbidden(
                    &resources.child(kind).key(*name),
                    format!("resource {kind} cannot be removed"),
                )),
                None => errors.push(FieldError::forbidden(
                    &resources.child(kind).key(*name),
                    "only cpu and memory resources are mutable",
                )),
                Some(now) if !matches!(*name, "cpu" | "memory") && now != value => {
                    errors.push(FieldError::forbidden(
                        &resources.child(kind).key(*name),
                        "only cpu and memory resources are mutable",
                    ))
                }
                Some(_) => {}
            }
        }
        for name in after.keys() {
            if !before.contains_key(name) && !matches!(*name, "cpu" | "memory") {
                errors.push(FieldError::forbidden(
                    &resources.child(kind).key(*name),
                    "only cpu and memory resources are mutable",
                ));
            }
        }
    }
    // A memory limit comes down only for a container that restarts to take it (the kernel
    // cannot take memory back from a running process).
    let old_limit = quantities(old, "limits")
        .get("memory")
        .and_then(|q| amount(q));
    let new_limit = quantities(new, "limits")
        .get("memory")
        .and_then(|q| amount(q));
    if let (Some(before), Some(after)) = (old_limit, new_limit)
        && after < before
        && restart_policy(new, "memory") != "RestartContainer"
    {
        errors.push(FieldError::forbidden(
            &resources.child("limits").key("memory"),
            "memory limits cannot be decreased unless resizePolicy is RestartContainer",
        ));
    }
    for (index, policy) in at(new, &["resizePolicy"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let entry = path.child("resizePolicy").index(index);
        let resource = str_at(policy, &["resourceName"]).unwrap_or("");
        if !matches!(resource, "cpu" | "memory") {
            errors.push(FieldError::not_supported(
                &entry.child("resourceName"),
                Value::from(resource),
                &["cpu", "memory"],
            ));
        }
        let restart = str_at(policy, &["restartPolicy"]).unwrap_or("");
        if !matches!(restart, "NotRequired" | "RestartContainer") {
            errors.push(FieldError::not_supported(
                &entry.child("restartPolicy"),
                Value::from(restart),
                &["NotRequired", "RestartContainer"],
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(requests: Value, limits: Value) -> Value {
        json!({"spec": {"containers": [{"name": "c", "image": "nginx",
            "resources": {"requests": requests, "limits": limits}}]}})
    }

    fn qos(pod: &Value) -> &'static str {
        let c = &pod["spec"]["containers"][0]["resources"];
        if c["limits"].as_object().is_some_and(|l| !l.is_empty()) && c["requests"] == c["limits"] {
            "Guaranteed"
        } else {
            "Burstable"
        }
    }

    #[test]
    fn only_resources_and_resize_policy_move() {
        let current = pod(json!({"cpu": "100m"}), json!({"memory": "128Mi"}));
        let mut requested = pod(json!({"cpu": "200m"}), json!({"memory": "128Mi"}));
        requested["spec"]["containers"][0]["image"] = json!("evil");
        requested["spec"]["containers"][0]["resizePolicy"] =
            json!([{"resourceName": "cpu", "restartPolicy": "NotRequired"}]);
        requested["spec"]["nodeName"] = json!("elsewhere");
        let next = resize_only(&requested, &current);
        assert_eq!(next["spec"]["containers"][0]["image"], "nginx");
        assert_eq!(next["spec"].get("nodeName"), None);
        assert_eq!(
            next["spec"]["containers"][0]["resources"]["requests"]["cpu"],
            "200m"
        );
        assert_eq!(
            next["spec"]["containers"][0]["resizePolicy"][0]["resourceName"],
            "cpu"
        );
        assert!(validate(&next, &current, qos).is_empty());
    }

    #[test]
    fn upstreams_refusals() {
        let message = |errors: Vec<FieldError>| {
            errors
                .iter()
                .map(|e| format!("{}: {}", e.field, e.detail))
                .collect::<Vec<_>>()
                .join("; ")
        };
        let old = pod(
            json!({"cpu": "100m", "memory": "128Mi"}),
            json!({"memory": "256Mi"}),
        );
        // A request removed.
        let removed = pod(json!({"memory": "128Mi"}), json!({"memory": "256Mi"}));
        assert!(message(validate(&removed, &old, qos)).contains("cannot be removed"));
        // Another resource changed.
        let gpu = pod(
            json!({"cpu": "100m", "memory": "128Mi", "example.com/gpu": "1"}),
            json!({"memory": "256Mi"}),
        );
        assert!(message(validate(&gpu, &old, qos)).contains("only cpu and memory"));
        // A memory limit lowered without a restart.
        let lower = pod(
            json!({"cpu": "100m", "memory": "128Mi"}),
            json!({"memory": "200Mi"}),
        );
        let refused = message(validate(&lower, &old, qos));
        assert!(
            refused.contains("spec.containers[0].resources.limits[memory]"),
            "{refused}"
        );
        let mut restarting = lower.clone();
        restarting["spec"]["containers"][0]["resizePolicy"] =
            json!([{"resourceName": "memory", "restartPolicy": "RestartContainer"}]);
        assert!(validate(&restarting, &old, qos).is_empty());
        // The QoS class changed.
        let guaranteed_old = pod(
            json!({"cpu": "1", "memory": "1Gi"}),
            json!({"cpu": "1", "memory": "1Gi"}),
        );
        let burstable = pod(
            json!({"cpu": "1", "memory": "1Gi"}),
            json!({"cpu": "2", "memory": "1Gi"}),
        );
        assert!(message(validate(&burstable, &guaranteed_old, qos)).contains("QOS Class"));
        // Windows.
        let mut windows = old.clone();
        windows["spec"]["os"] = json!({"name": "windows"});
        assert!(message(validate(&windows, &old, qos)).contains("windows"));
    }
}
