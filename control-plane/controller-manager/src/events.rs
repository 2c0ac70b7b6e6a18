//! The core/v1 Events controllers record (what `kubectl describe` shows), written as upstream's
//! recorder writes them, and [`Recorder`], which counts the same event about the same object
//! again on the Event it recorded before (upstream's `EventCorrelator`) rather than writing a
//! new one — for controllers that re-sync on a period, such as the autoscaler. A failure to
//! record is logged, never fails a sync.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// How many objects' last events a [`Recorder`] remembers before it starts over (upstream's
/// correlator keeps an LRU of 4096).
const REMEMBERED: usize = 4096;

/// The object an event is about.
#[derive(Clone, Copy)]
pub struct EventRef<'a> {
    /// Its `apiVersion`.
    pub api_version: &'a str,
    /// Its kind.
    pub kind: &'a str,
    /// Its metadata (namespace, name, uid, resourceVersion).
    pub metadata: &'a ObjectMeta,
}

/// Creates an Event about `object` from `component`; its name, when it was stored.
pub async fn create(
    client: &kube::Client,
    component: &str,
    object: EventRef<'_>,
    type_: &str,
    reason: &str,
    message: &str,
) -> Option<String> {
    let namespace = object.metadata.namespace.as_deref().unwrap_or("default");
    let name = object.metadata.name.as_deref().unwrap_or("");
    let now = Timestamp::now().to_string();
    let event = json!({
        "metadata": {"generateName": format!("{name}.")},
        "involvedObject": {"apiVersion": object.api_version, "kind": object.kind,
                           "namespace": namespace, "name": name,
                           "uid": object.metadata.uid,
                           "resourceVersion": object.metadata.resource_version},
        "reason": reason,
        "message": message,
        "type": type_,
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    });
    let outcome = match serde_json::from_value::<Event>(event) {
        Ok(event) => Api::<Event>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &event)
            .await
            .map(|created| created.metadata.name),
        Err(err) => Err(kube::Error::SerdeError(err)),
    };
    match outcome {
        Ok(created) => created,
        Err(err) => {
            tracing::debug!(kind = object.kind, object = %name, %reason, %err, "recording an event failed");
            None
        }
    }
}

/// The last event recorded per (object UID, reason): its message, its Event's name and its
/// count.
type Recent = HashMap<(String, String), (String, String, i32)>;

/// Records events, counting a repeat on the Event recorded before.
pub struct Recorder {
    client: kube::Client,
    component: &'static str,
    recent: Mutex<Recent>,
}

impl Recorder {
    /// A recorder writing as `component`.
    pub fn new(client: kube::Client, component: &'static str) -> Self {
        Self {
            client,
            component,
            recent: Mutex::default(),
        }
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the event; the same one as last time for this object and reason counts up
    /// that Event (or, when it is gone, is recorded anew).
    pub async fn record(&self, object: EventRef<'_>, type_: &str, reason: &str, message: &str) {
        let key = (
            object.metadata.uid.clone().unwrap_or_default(),
            reason.to_string(),
        );
        let repeated = self
            .recent()
            .get(&key)
            .filter(|(last, _, _)| last == message)
            .map(|(_, name, count)| (name.clone(), *count));
        if let Some((name, count)) = repeated {
            let namespace = object.metadata.namespace.as_deref().unwrap_or("default");
            let patch = json!({"count": count + 1, "lastTimestamp": Timestamp::now().to_string()});
            match Api::<Event>::namespaced(self.client.clone(), namespace)
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    if let Some(entry) = self.recent().get_mut(&key) {
                        entry.2 = count + 1;
                    }
                    return;
                }
                Err(err) => tracing::debug!(%err, "counting a repeated event failed"),
            }
        }
        if let Some(name) =
            create(&self.client, self.component, object, type_, reason, message).await
        {
            let mut recent = self.recent();
            if recent.len() >= REMEMBERED {
                recent.clear();
            }
            recent.insert(key, (message.to_string(), name, 1));
        }
    }

    /// Forgets an object's events (it is gone).
    pub fn forget(&self, uid: &str) {
        self.recent().retain(|(object, _), _| object != uid);
    }
}
