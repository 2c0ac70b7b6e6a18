//! `componentstatuses` (deprecated since 1.19, still served by 1.32: `kubectl get cs`): a
//! read-only kind computed on each request. `etcd-0` is the cluster's store answering a
//! read; `scheduler` and `controller-manager` are healthy while their clients are seen —
//! upstream probes their `/healthz` ports, which a hosted control plane does not have, so
//! here a component counts as up when it has made a request within [`SEEN_WITHIN`] (its
//! informers re-watch every few minutes even on an idle cluster).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::error::ApiError;
use crate::resources::{ResourceInfo, Strategy};
use crate::store::Store;
use crate::table::{Column, name_column};

/// How recently a component must have been seen to be reported healthy (twice the watch
/// timeout client-go and kube-rs use).
pub const SEEN_WITHIN: Duration = Duration::from_secs(600);
/// Upstream's deprecation warning for the kind.
pub const DEPRECATION_WARNING: &str = "v1 ComponentStatus is deprecated in v1.19+";

/// When each control-plane component of a cluster was last seen making a request.
#[derive(Default)]
pub struct ComponentActivity {
    seen: Mutex<HashMap<&'static str, Instant>>,
}

impl ComponentActivity {
    /// Notes a request by `username` (or by the hosted control loops, which run both the
    /// scheduler and the controller manager).
    pub fn saw(&self, username: &str, hosted_loop: bool) {
        let components: &[&'static str] = match (hosted_loop, username) {
            (true, _) => &["scheduler", "controller-manager"],
            (false, "system:kube-scheduler") => &["scheduler"],
            (false, "system:kube-controller-manager") => &["controller-manager"],
            _ => return,
        };
        if let Ok(mut seen) = self.seen.lock() {
            let now = Instant::now();
            for component in components {
                seen.insert(component, now);
            }
        }
    }

    fn last_seen(&self, component: &str) -> Option<Duration> {
        self.seen.lock().ok()?.get(component).map(Instant::elapsed)
    }
}

fn status(name: &str, healthy: Result<String, String>) -> Value {
    let condition = match healthy {
        Ok(message) => json!({"type": "Healthy", "status": "True", "message": message}),
        Err(error) => json!({"type": "Healthy", "status": "False", "error": error}),
    };
    json!({"kind": "ComponentStatus", "apiVersion": "v1",
        "metadata": {"name": name}, "conditions": [condition]})
}

/// Every component's status, in upstream's order. `parked`: the hosted loops are stopped
/// while the cluster is idle, and start again on its next write — healthy, not seen.
pub async fn statuses(store: &Store, activity: &ComponentActivity, parked: bool) -> Vec<Value> {
    let mut out = Vec::new();
    for component in ["scheduler", "controller-manager"] {
        let health = match activity.last_seen(component) {
            _ if parked => Ok("ok (idle: starts on the next write)".to_string()),
            Some(ago) if ago <= SEEN_WITHIN => Ok("ok".to_string()),
            Some(ago) => Err(format!(
                "no request from the {component} for {}s",
                ago.as_secs()
            )),
            None => Err(format!("the {component} has not connected")),
        };
        out.push(status(component, health));
    }
    let store_health = match store.storage().current_revision().await {
        Ok(_) => Ok("ok".to_string()),
        Err(err) => Err(err.to_string()),
    };
    out.push(status("etcd-0", store_health));
    out
}

/// The list, or the one named `name`.
pub async fn answer(
    store: &Store,
    activity: &ComponentActivity,
    parked: bool,
    resource: &ResourceInfo,
    name: Option<&str>,
) -> Result<Value, ApiError> {
    let all = statuses(store, activity, parked).await;
    match name {
        None => Ok(json!({"kind": "ComponentStatusList", "apiVersion": "v1",
            "metadata": {}, "items": all})),
        Some(name) => all
            .into_iter()
            .find(|s| s["metadata"]["name"] == name)
            .ok_or_else(|| ApiError::not_found(&resource.group_resource(), name)),
    }
}

/// The kind's table (upstream's `printComponentStatus`): Status, Message, Error.
pub struct ComponentStatusStrategy;

fn healthy_condition(status: &Value) -> Option<&Value> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Healthy")
}

impl Strategy for ComponentStatusStrategy {
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new(
                "Status",
                "string",
                "Status of the component conditions",
                |status| {
                    json!(match healthy_condition(status).map(|c| &c["status"]) {
                        Some(s) if s == "True" => "Healthy",
                        Some(_) => "Unhealthy",
                        None => "Unknown",
                    })
                },
            ),
            Column::new(
                "Message",
                "string",
                "Message of the component conditions",
                |status| {
                    json!(
                        healthy_condition(status)
                            .and_then(|c| c["message"].as_str())
                            .unwrap_or("")
                    )
                },
            ),
            Column::new(
                "Error",
                "string",
                "Error of the component conditions",
                |status| {
                    json!(
                        healthy_condition(status)
                            .and_then(|c| c["error"].as_str())
                            .unwrap_or("")
                    )
                },
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_are_seen_by_their_identities() {
        let activity = ComponentActivity::default();
        activity.saw("alice", false);
        assert_eq!(activity.last_seen("scheduler"), None);
        activity.saw("system:kube-scheduler", false);
        assert!(activity.last_seen("scheduler").is_some());
        assert_eq!(activity.last_seen("controller-manager"), None);
        activity.saw("system:kube-controller-manager", true);
        assert!(activity.last_seen("controller-manager").is_some());
    }
}
