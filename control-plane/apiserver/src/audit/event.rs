//! The audit `Event` (upstream `audit.k8s.io/v1`): one JSON object per stage of a request, in
//! upstream's field order, and the `EventList` a webhook backend posts.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::policy::{Level, Stage};

/// Who made (or was impersonated by) a request (upstream `authentication/v1` `UserInfo`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EventUser {
    /// The user name.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub username: String,
    /// The user's unique id.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// The groups.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// What the authenticator added.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Vec<String>>,
}

impl From<&flotilla_api_machinery::rbac::UserInfo> for EventUser {
    fn from(user: &flotilla_api_machinery::rbac::UserInfo) -> Self {
        EventUser {
            username: user.name.clone(),
            uid: user.uid.clone(),
            groups: user.groups.clone(),
            extra: user.extra.clone(),
        }
    }
}

/// The object a request is about (upstream `audit.ObjectReference`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    /// The resource (`pods`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resource: String,
    /// Its namespace.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Its name.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Its uid, when the request's body names it.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// The group (`""` for the core group, then left out).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_group: String,
    /// The version the request used.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// The version the request's body names.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
    /// The subresource (`status`, `log`…).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub subresource: String,
}

/// An answer's `Status`, in upstream's field order.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ResponseStatus {
    /// Always empty.
    pub metadata: BTreeMap<String, String>,
    /// `Success` or `Failure`, when the answer was a `Status`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub status: String,
    /// What went wrong.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Upstream's reason (`Forbidden`, `NotFound`…).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// The `Status`'s details.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
    /// The HTTP status code.
    pub code: u16,
}

impl ResponseStatus {
    /// The status of an answer with `code`, from its body when that is a `Status`.
    pub fn of(code: u16, body: Option<&Value>) -> Self {
        let text = |field: &str| {
            body.and_then(|b| b[field].as_str())
                .unwrap_or("")
                .to_string()
        };
        match body {
            Some(status) if status["kind"] == "Status" => ResponseStatus {
                metadata: BTreeMap::new(),
                status: text("status"),
                message: text("message"),
                reason: text("reason"),
                details: status.get("details").cloned(),
                code,
            },
            _ => ResponseStatus {
                code,
                ..Default::default()
            },
        }
    }
}

/// One audit event.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// `Event`.
    pub kind: &'static str,
    /// `audit.k8s.io/v1`.
    pub api_version: &'static str,
    /// The level it was recorded at.
    pub level: Level,
    /// The request's id, the same in every stage's event and in the `Audit-ID` header.
    #[serde(rename = "auditID")]
    pub audit_id: String,
    /// Which stage.
    pub stage: Stage,
    /// The path and query as sent.
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    /// The Kubernetes verb (`get`, `list`, `watch`, `create`, …) or, for a non-resource
    /// request, the lowercased method.
    pub verb: String,
    /// Who the request authenticated as.
    pub user: EventUser,
    /// Whom it impersonated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub impersonated_user: Option<EventUser>,
    /// The client's address (and any `X-Forwarded-For` before it).
    #[serde(rename = "sourceIPs", skip_serializing_if = "Vec::is_empty")]
    pub source_ips: Vec<String>,
    /// The client's `User-Agent`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub user_agent: String,
    /// The object, for resource requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object_ref: Option<ObjectReference>,
    /// The answer's status (its code; its message and reason too on a failure).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_status: Option<ResponseStatus>,
    /// The request's body (level `Request` and above).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_object: Option<Value>,
    /// The answer's body (level `RequestResponse`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_object: Option<Value>,
    /// When the request arrived (`MicroTime`).
    pub request_received_timestamp: String,
    /// When this stage was reached.
    pub stage_timestamp: String,
    /// What the request's handling noted: the authorizer's decision and reason, admission
    /// plugins' annotations.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Upstream's `MicroTime` form: RFC 3339 with microseconds, in UTC.
pub fn micro_time(at: chrono::DateTime<chrono::Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// The `EventList` a webhook receives, built from events already encoded.
pub fn event_list(encoded: &[bytes::Bytes]) -> Vec<u8> {
    let mut body =
        br#"{"kind":"EventList","apiVersion":"audit.k8s.io/v1","metadata":{},"items":["#.to_vec();
    for (i, event) in encoded.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        // Each encoded event ends with its line's newline.
        body.extend_from_slice(event.strip_suffix(b"\n").unwrap_or(event));
    }
    body.extend_from_slice(b"]}");
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_encode_in_upstreams_shape() {
        let event = Event {
            kind: "Event",
            api_version: "audit.k8s.io/v1",
            level: Level::Metadata,
            audit_id: "a1".into(),
            stage: Stage::ResponseComplete,
            request_uri: "/api/v1/namespaces/default/pods?limit=1".into(),
            verb: "list".into(),
            user: EventUser {
                username: "alice".into(),
                groups: vec!["devs".into()],
                ..Default::default()
            },
            impersonated_user: None,
            source_ips: vec!["10.0.0.1".into()],
            user_agent: "kubectl/v1.32.0".into(),
            object_ref: Some(ObjectReference {
                resource: "pods".into(),
                namespace: "default".into(),
                api_version: "v1".into(),
                ..Default::default()
            }),
            response_status: Some(ResponseStatus::of(200, None)),
            request_object: None,
            response_object: None,
            request_received_timestamp: "2026-12-06T10:00:00.000001Z".into(),
            stage_timestamp: "2026-12-06T10:00:00.000101Z".into(),
            annotations: BTreeMap::from([("authorization.k8s.io/decision".into(), "allow".into())]),
        };
        let encoded = serde_json::to_string(&event).expect("encodes");
        assert_eq!(
            encoded,
            r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a1","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/default/pods?limit=1","verb":"list","user":{"username":"alice","groups":["devs"]},"sourceIPs":["10.0.0.1"],"userAgent":"kubectl/v1.32.0","objectRef":{"resource":"pods","namespace":"default","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-12-06T10:00:00.000001Z","stageTimestamp":"2026-12-06T10:00:00.000101Z","annotations":{"authorization.k8s.io/decision":"allow"}}"#
        );
        let list = event_list(&[
            bytes::Bytes::from(format!("{encoded}\n")),
            bytes::Bytes::from(format!("{encoded}\n")),
        ]);
        let parsed: Value = serde_json::from_slice(&list).expect("a JSON list");
        assert_eq!(parsed["kind"], "EventList");
        assert_eq!(parsed["items"].as_array().map(Vec::len), Some(2));
    }

    #[test]
    fn micro_time_has_six_digits_and_z() {
        let at = chrono::DateTime::from_timestamp(1_765_000_000, 1_234_000).expect("a time");
        assert_eq!(micro_time(at), "2025-12-06T05:46:40.001234Z");
    }
}
