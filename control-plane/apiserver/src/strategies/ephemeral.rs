//! The Pod `ephemeralcontainers` subresource's validation (upstream's
//! `ValidatePodEphemeralContainersUpdate`): existing ephemeral containers are neither
//! removed nor changed; a new one has a unique DNS-label name and an image, targets a
//! container that exists, and sets none of the fields an ephemeral container may not have.

use std::collections::{HashMap, HashSet};

use flotilla_api_machinery::field::ErrorType;
use serde_json::{Value, json};

use crate::error::{FieldError, Path};
use crate::meta::{at, str_at};

/// Fields a container may have and an ephemeral container may not.
const NOT_ALLOWED: [&str; 6] = [
    "ports",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
    "restartPolicy",
];

fn list<'a>(pod: &'a Value, name: &str) -> &'a [Value] {
    at(pod, &["spec", name])
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// Errors in an update of `old`'s ephemeral containers to `new`'s.
pub(super) fn validate_update(new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let path = Path::new("spec.ephemeralContainers");
    let new_list = list(new, "ephemeralContainers");
    let by_name: HashMap<&str, &Value> = new_list
        .iter()
        .map(|c| (str_at(c, &["name"]).unwrap_or(""), c))
        .collect();
    for previous in list(old, "ephemeralContainers") {
        let name = str_at(previous, &["name"]).unwrap_or("");
        match by_name.get(name) {
            None => errors.push(FieldError::forbidden(
                &path,
                format!("existing ephemeral containers {name:?} may not be removed"),
            )),
            Some(now) if *now != previous => errors.push(FieldError::forbidden(
                &path,
                format!("existing ephemeral containers {name:?} may not be changed"),
            )),
            Some(_) => {}
        }
    }
    let regular: HashSet<&str> = ["containers", "initContainers"]
        .iter()
        .flat_map(|l| list(new, l))
        .filter_map(|c| str_at(c, &["name"]))
        .collect();
    let mut seen = HashSet::new();
    for (index, container) in new_list.iter().enumerate() {
        let here = path.index(index);
        let name = str_at(container, &["name"]).unwrap_or("");
        if name.is_empty() {
            errors.push(FieldError::required(&here.child("name"), ""));
        } else {
            for problem in flotilla_api_machinery::names::is_dns1123_label(name) {
                errors.push(FieldError::invalid(
                    &here.child("name"),
                    json!(name),
                    &problem,
                ));
            }
            if regular.contains(name) || !seen.insert(name) {
                errors.push(FieldError::duplicate(&here.child("name"), json!(name)));
            }
        }
        if str_at(container, &["image"]).is_none_or(str::is_empty) {
            errors.push(FieldError::required(&here.child("image"), ""));
        }
        for field in NOT_ALLOWED {
            if container.get(field).is_some_and(|v| !v.is_null()) {
                errors.push(FieldError::forbidden(
                    &here.child(field),
                    "cannot be set for an Ephemeral Container",
                ));
            }
        }
        let has_resources = container
            .get("resources")
            .and_then(Value::as_object)
            .is_some_and(|r| {
                r.values()
                    .any(|v| v.as_object().is_none_or(|m| !m.is_empty()))
            });
        if has_resources {
            errors.push(FieldError::forbidden(
                &here.child("resources"),
                "cannot be set for an Ephemeral Container",
            ));
        }
        if let Some(target) = str_at(container, &["targetContainerName"])
            && !target.is_empty()
            && !regular.contains(target)
        {
            errors.push(FieldError {
                error_type: ErrorType::NotFound,
                field: here.child("targetContainerName").to_string(),
                bad_value: Some(json!(target)),
                detail: String::new(),
            });
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ephemeral: Value) -> Value {
        json!({"spec": {"containers": [{"name": "app", "image": "nginx"}], "ephemeralContainers": ephemeral}})
    }

    fn messages(errors: &[FieldError]) -> Vec<String> {
        errors.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_debugger_is_added_but_never_changed_or_removed() {
        let none = pod(json!([]));
        let debugger = json!({"name": "debugger", "image": "busybox", "targetContainerName": "app", "resources": {}});
        let with = pod(json!([debugger]));
        assert!(validate_update(&with, &none).is_empty());
        assert_eq!(
            messages(&validate_update(&none, &with)),
            [
                "spec.ephemeralContainers: Forbidden: existing ephemeral containers \"debugger\" may not be removed"
            ]
        );
        let changed = pod(json!([{"name": "debugger", "image": "alpine"}]));
        assert_eq!(
            messages(&validate_update(&changed, &with)),
            [
                "spec.ephemeralContainers: Forbidden: existing ephemeral containers \"debugger\" may not be changed"
            ]
        );
    }

    #[test]
    fn a_new_ephemeral_container_is_checked() {
        let bad = pod(json!([{"name": "app", "ports": [{"containerPort": 80}],
            "resources": {"limits": {"cpu": "1"}}, "targetContainerName": "nope"}]));
        assert_eq!(
            messages(&validate_update(&bad, &pod(json!([])))),
            [
                "spec.ephemeralContainers[0].name: Duplicate value: \"app\"",
                "spec.ephemeralContainers[0].image: Required value",
                "spec.ephemeralContainers[0].ports: Forbidden: cannot be set for an Ephemeral Container",
                "spec.ephemeralContainers[0].resources: Forbidden: cannot be set for an Ephemeral Container",
                "spec.ephemeralContainers[0].targetContainerName: Not found: \"nope\"",
            ]
        );
    }
}
