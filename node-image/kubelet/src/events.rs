//! The kubelet's event recorder (upstream `record.EventRecorder` with the kubelet as
//! source): core/v1 Events about a pod or one of its containers, created through the API in
//! the background; a repeat of the same event (same object, type, reason and message)
//! raises the first one's `count` and `lastTimestamp` instead of making another, as
//! upstream's event correlator does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// The event source's component name.
pub const COMPONENT: &str = "kubelet";

/// What makes two events the same one (upstream `getEventKey` without the source).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EventKey {
    /// The pod's UID.
    pub uid: String,
    /// `spec.containers{name}`, `spec.initContainers{name}` or empty for the pod.
    pub field_path: String,
    /// Normal or Warning.
    pub type_: String,
    /// The reason.
    pub reason: String,
    /// The message.
    pub message: String,
}

/// What to do with an event given the ones already recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// Create a new Event of this name.
    Create(String),
    /// Raise the count of this Event to the value.
    Bump(String, i32),
}

/// The events recorded so far (their names and counts), keyed by [`EventKey`].
#[derive(Debug, Default)]
pub struct Correlator {
    seen: HashMap<EventKey, (String, i32)>,
}

impl Correlator {
    /// Decides for `key`, naming a new event `<pod>.<hex nanos>` as upstream.
    pub fn observe(&mut self, key: EventKey, pod_name: &str, now_nanos: i128) -> Record {
        if let Some((name, count)) = self.seen.get_mut(&key) {
            *count += 1;
            return Record::Bump(name.clone(), *count);
        }
        let name = format!("{pod_name}.{now_nanos:x}");
        self.seen.insert(key, (name.clone(), 1));
        Record::Create(name)
    }

    /// Forgets `key` (its Event is gone from the API).
    pub fn forget(&mut self, key: &EventKey) {
        self.seen.remove(key);
    }

    /// Forgets a pod's events.
    pub fn forget_pod(&mut self, uid: &str) {
        self.seen.retain(|k, _| k.uid != uid);
    }
}

/// The field path of container `name` in `pod` (upstream `GenerateContainerRef`).
pub fn field_path(pod: &Pod, name: &str) -> String {
    let is_init = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|l| l.iter().any(|c| c.name == name));
    if is_init {
        format!("spec.initContainers{{{name}}}")
    } else {
        format!("spec.containers{{{name}}}")
    }
}

/// The Event upstream's recorder writes for `pod`.
pub fn event_object(
    pod: &Pod,
    name: &str,
    key: &EventKey,
    node: &str,
    now: &str,
) -> Result<Event, serde_json::Error> {
    let meta = &pod.metadata;
    let mut involved = json!({
        "kind": "Pod",
        "apiVersion": "v1",
        "namespace": meta.namespace,
        "name": meta.name,
        "uid": meta.uid,
        "resourceVersion": meta.resource_version,
    });
    if !key.field_path.is_empty() {
        involved["fieldPath"] = json!(key.field_path);
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": meta.namespace},
        "involvedObject": involved,
        "reason": key.reason,
        "message": key.message,
        "type": key.type_,
        "source": {"component": COMPONENT, "host": node},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
        "reportingComponent": COMPONENT,
        "reportingInstance": node,
    }))
}

/// Records events for the node's pods through the API.
pub struct Recorder {
    client: kube::Client,
    node: String,
    correlator: Arc<Mutex<Correlator>>,
}

impl Recorder {
    /// A recorder writing as node `node`.
    pub fn new(client: kube::Client, node: String) -> Self {
        Recorder {
            client,
            node,
            correlator: Arc::default(),
        }
    }

    /// An event about container `container` of `pod`.
    pub fn container_event(
        &self,
        pod: &Pod,
        container: &str,
        type_: &str,
        reason: &str,
        message: &str,
    ) {
        self.record(pod, field_path(pod, container), type_, reason, message);
    }

    /// An event about `pod` itself.
    pub fn pod_event(&self, pod: &Pod, type_: &str, reason: &str, message: &str) {
        self.record(pod, String::new(), type_, reason, message);
    }

    /// Forgets a pod's events (it is gone).
    pub fn forget_pod(&self, uid: &str) {
        if let Ok(mut c) = self.correlator.lock() {
            c.forget_pod(uid);
        }
    }

    fn record(&self, pod: &Pod, field_path: String, type_: &str, reason: &str, message: &str) {
        let key = EventKey {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            field_path,
            type_: type_.to_string(),
            reason: reason.to_string(),
            message: message.to_string(),
        };
        let now = k8s_openapi::jiff::Timestamp::now();
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let Ok(decision) = self
            .correlator
            .lock()
            .map(|mut c| c.observe(key.clone(), &pod_name, now.as_nanosecond()))
        else {
            return;
        };
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        let event = match &decision {
            Record::Create(name) => event_object(pod, name, &key, &self.node, &stamp),
            Record::Bump(..) => Ok(Event::default()),
        };
        let correlator = self.correlator.clone();
        tokio::spawn(async move {
            let outcome = match (decision, event) {
                (Record::Create(_), Ok(event)) => {
                    api.create(&PostParams::default(), &event).await.map(|_| ())
                }
                (Record::Bump(name, count), _) => {
                    let patch = json!({"count": count, "lastTimestamp": stamp});
                    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .map(|_| ())
                }
                (Record::Create(_), Err(err)) => {
                    tracing::warn!(%err, "building an event failed");
                    Ok(())
                }
            };
            if let Err(err) = outcome {
                tracing::debug!(%err, reason = %key.reason, "recording an event failed");
                // Next time, make a fresh one.
                if let Ok(mut c) = correlator.lock() {
                    c.forget(&key);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "prod", "uid": "u1", "resourceVersion": "7"},
            "spec": {"initContainers": [{"name": "setup"}], "containers": [{"name": "app"}]},
        }))
        .expect("pod")
    }

    fn key(message: &str) -> EventKey {
        EventKey {
            uid: "u1".into(),
            field_path: field_path(&pod(), "app"),
            type_: "Warning".into(),
            reason: "Unhealthy".into(),
            message: message.into(),
        }
    }

    #[test]
    fn repeats_bump_the_first_event() {
        let mut c = Correlator::default();
        let cases = [
            (
                key("Liveness probe failed: "),
                Record::Create("web.ff".into()),
            ),
            (
                key("Liveness probe failed: "),
                Record::Bump("web.ff".into(), 2),
            ),
            (
                key("Readiness probe failed: "),
                Record::Create("web.ff".into()),
            ),
            (
                key("Liveness probe failed: "),
                Record::Bump("web.ff".into(), 3),
            ),
        ];
        for (key, want) in cases {
            assert_eq!(c.observe(key.clone(), "web", 255), want, "{key:?}");
        }
        c.forget_pod("u1");
        assert_eq!(
            c.observe(key("Liveness probe failed: "), "web", 16),
            Record::Create("web.10".into())
        );
    }

    #[test]
    fn events_name_the_container_and_the_kubelet() {
        assert_eq!(field_path(&pod(), "setup"), "spec.initContainers{setup}");
        assert_eq!(field_path(&pod(), "app"), "spec.containers{app}");
        let event = event_object(&pod(), "web.1", &key("m"), "node-1", "2026-01-01T00:00:00Z")
            .expect("event");
        let involved = &event.involved_object;
        assert_eq!(involved.kind.as_deref(), Some("Pod"));
        assert_eq!(involved.uid.as_deref(), Some("u1"));
        assert_eq!(involved.field_path.as_deref(), Some("spec.containers{app}"));
        assert_eq!(event.metadata.namespace.as_deref(), Some("prod"));
        let source = event.source.expect("source");
        assert_eq!(
            (source.component.as_deref(), source.host.as_deref()),
            (Some("kubelet"), Some("node-1"))
        );
        assert_eq!(event.count, Some(1));
        assert_eq!(event.type_.as_deref(), Some("Warning"));
    }
}
