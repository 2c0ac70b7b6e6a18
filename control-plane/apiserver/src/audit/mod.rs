//! Audit logging (upstream `k8s.io/apiserver/pkg/audit` and its `WithAudit` filter): every
//! authenticated request to a tenant's API is recorded at the level the policies decide — the
//! service operator's (`--audit-policy-file`) and the cluster's own, from the management API,
//! whichever records more — as `audit.k8s.io/v1` events to the operator's backends: a log file
//! with rotation and a webhook. Each event names its cluster in the `flotilla.dev/cluster`
//! annotation. Secrets, tokens and token reviews are never recorded beyond `Metadata`,
//! whatever a policy says. Handlers add annotations to the request being served with
//! [`annotate`].

pub mod event;
pub mod log;
pub mod policy;
pub mod webhook;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use flotilla_api_machinery::rbac::{Attributes, UserInfo};
use futures::StreamExt;
use serde_json::Value;

use self::event::{Event, EventUser, ObjectReference, ResponseStatus, micro_time};
use self::log::{LogBackend, LogOptions};
pub use self::policy::{Decision, Level, Policy, Stage};
use self::webhook::{WebhookBackend, WebhookOptions};

/// The annotation naming the cluster an event is about.
pub const CLUSTER_ANNOTATION: &str = "flotilla.dev/cluster";

/// The header carrying a request's audit id, both ways (upstream's `Audit-ID`).
pub const AUDIT_ID_HEADER: &str = "audit-id";

/// The operator's audit configuration (upstream's `--audit-*` flags).
#[derive(Debug, Clone, Default)]
pub struct AuditOptions {
    /// The operator's policy; none records nothing of its own.
    pub policy: Option<Policy>,
    /// The log file.
    pub log: Option<LogOptions>,
    /// The webhook.
    pub webhook: Option<WebhookOptions>,
}

/// Where events go and the operator's policy.
#[derive(Debug, Default)]
pub struct Auditor {
    policy: Option<Policy>,
    log: Option<LogBackend>,
    webhook: Option<WebhookBackend>,
}

impl Auditor {
    /// Records nothing.
    pub fn disabled() -> Auditor {
        Auditor::default()
    }

    /// Opens the backends `options` name. A policy without a backend, or a backend without
    /// any way to be given events, is refused as upstream refuses it.
    pub async fn start(options: AuditOptions) -> Result<Auditor, String> {
        let log = match options.log {
            Some(log) => Some(
                LogBackend::start(log.clone())
                    .map_err(|err| format!("--audit-log-path {}: {err}", log.path.display()))?,
            ),
            None => None,
        };
        let webhook = match options.webhook {
            Some(webhook) => Some(
                WebhookBackend::start(webhook)
                    .await
                    .map_err(|err| format!("--audit-webhook-config-file {err}"))?,
            ),
            None => None,
        };
        if options.policy.is_some() && log.is_none() && webhook.is_none() {
            return Err(
                "--audit-policy-file needs a backend: --audit-log-path or --audit-webhook-config-file"
                    .to_string(),
            );
        }
        Ok(Auditor {
            policy: options.policy,
            log,
            webhook,
        })
    }

    /// Whether events have anywhere to go (a cluster's own policy needs it).
    pub fn has_backend(&self) -> bool {
        self.log.is_some() || self.webhook.is_some()
    }

    /// What is recorded of a request: the operator's and the cluster's policies together,
    /// never beyond `Metadata` for what carries secrets.
    pub fn decide(&self, cluster_policy: Option<&Policy>, attributes: &Attributes) -> Decision {
        if !self.has_backend() {
            return Decision::none();
        }
        let operator = self
            .policy
            .as_ref()
            .map_or_else(Decision::none, |p| p.decide(attributes));
        let cluster = cluster_policy.map_or_else(Decision::none, |p| p.decide(attributes));
        let mut decision = operator.union(cluster);
        if carries_secrets(attributes) {
            decision.level = decision.level.min(Level::Metadata);
        }
        decision
    }

    /// Starts the record of a request the policies decided to record; `None` when they
    /// record nothing of it.
    pub fn begin(
        &self,
        decision: Decision,
        request: RequestFacts,
        attributes: &Attributes,
    ) -> Option<Arc<RequestAudit>> {
        if decision.level == Level::None {
            return None;
        }
        let object_ref = attributes.resource_request.then(|| ObjectReference {
            resource: attributes.resource.clone(),
            namespace: attributes.namespace.clone(),
            name: attributes.name.clone(),
            api_group: attributes.api_group.clone(),
            api_version: attributes.api_version.clone(),
            subresource: attributes.subresource.clone(),
            ..Default::default()
        });
        Some(Arc::new(RequestAudit {
            decision,
            id: request.audit_id,
            received: chrono::Utc::now(),
            request_uri: request.request_uri,
            verb: attributes.verb.clone(),
            user: EventUser::from(&attributes.user),
            source_ips: request.source_ips,
            user_agent: request.user_agent,
            state: Mutex::new(RecordState {
                object_ref,
                impersonated: None,
                request_object: None,
                annotations: BTreeMap::from([(CLUSTER_ANNOTATION.to_string(), request.cluster)]),
            }),
        }))
    }

    /// Writes one event to every backend.
    async fn emit(&self, event: &Event) {
        let mut line = match serde_json::to_vec(event) {
            Ok(line) => line,
            Err(err) => {
                tracing::error!(%err, "an audit event could not be encoded");
                return;
            }
        };
        line.push(b'\n');
        let line = Bytes::from(line);
        if let Some(webhook) = &self.webhook {
            webhook.send(line.clone());
        }
        if let Some(log) = &self.log {
            log.send(line).await;
        }
    }
}

/// Secrets, and the requests whose bodies hold tokens: `Metadata` at most.
fn carries_secrets(attributes: &Attributes) -> bool {
    match (attributes.api_group.as_str(), attributes.resource.as_str()) {
        ("", "secrets") => true,
        ("", "serviceaccounts") => attributes.subresource == "token",
        ("authentication.k8s.io", "tokenreviews") => true,
        _ => false,
    }
}

/// What the server knows of a request before handling it.
#[derive(Debug, Clone, Default)]
pub struct RequestFacts {
    /// The request's id (the client's `Audit-ID` or a new one).
    pub audit_id: String,
    /// The cluster's id.
    pub cluster: String,
    /// The path and query as sent.
    pub request_uri: String,
    /// The client's address(es).
    pub source_ips: Vec<String>,
    /// The `User-Agent` header.
    pub user_agent: String,
}

/// One request being recorded.
#[derive(Debug)]
pub struct RequestAudit {
    decision: Decision,
    id: String,
    received: chrono::DateTime<chrono::Utc>,
    request_uri: String,
    verb: String,
    user: EventUser,
    source_ips: Vec<String>,
    user_agent: String,
    state: Mutex<RecordState>,
}

/// What the request's handling adds to its record.
#[derive(Debug, Default)]
struct RecordState {
    object_ref: Option<ObjectReference>,
    impersonated: Option<EventUser>,
    request_object: Option<Value>,
    annotations: BTreeMap<String, String>,
}

tokio::task_local! {
    /// The record of the request the current task serves.
    static CURRENT: Arc<RequestAudit>;
}

/// Adds an annotation to the record of the request being served (when it is recorded):
/// the authorizer's decision, an admission plugin's finding.
pub fn annotate(key: &str, value: impl Into<String>) {
    let _ = CURRENT.try_with(|record| {
        if let Ok(mut state) = record.state.lock() {
            state
                .annotations
                .entry(key.to_string())
                .or_insert_with(|| value.into());
        }
    });
}

/// [`annotate`], when the request is recorded at `level` or above (upstream's
/// `AddAnnotationWithLevel`: a webhook's patch only with the request's body).
pub fn annotate_at(level: Level, key: &str, value: impl Into<String>) {
    let recorded = CURRENT
        .try_with(|record| record.decision.level >= level)
        .unwrap_or(false);
    if recorded {
        annotate(key, value);
    }
}

/// Whether the request being served is recorded (so that annotations are worth computing).
pub fn recording() -> bool {
    CURRENT.try_with(|_| ()).is_ok()
}

/// Notes whom the request impersonates.
pub fn note_impersonation(user: &UserInfo) {
    let _ = CURRENT.try_with(|record| {
        if let Ok(mut state) = record.state.lock() {
            state.impersonated = Some(EventUser::from(user));
        }
    });
}

/// Notes the request's body, as `decode` reads it (only called when the request is
/// recorded): the object it names fills the reference's gaps (a create's name), and at
/// `Request` and above the body itself is recorded.
pub fn note_request_body(decode: impl FnOnce() -> Option<Value>) {
    let _ = CURRENT.try_with(|record| {
        let Some(mut object) = decode() else {
            return;
        };
        let Ok(mut state) = record.state.lock() else {
            return;
        };
        if let Some(reference) = state.object_ref.as_mut() {
            let metadata = &object["metadata"];
            let fill = |field: &mut String, key: &str| {
                if field.is_empty()
                    && let Some(value) = metadata[key].as_str()
                {
                    *field = value.to_string();
                }
            };
            fill(&mut reference.namespace, "namespace");
            fill(&mut reference.name, "name");
            fill(&mut reference.uid, "uid");
            fill(&mut reference.resource_version, "resourceVersion");
        }
        if record.decision.level >= Level::Request {
            if record.decision.omit_managed_fields {
                omit_managed_fields(&mut object);
            }
            state.request_object = Some(object);
        }
    });
}

fn omit_managed_fields(object: &mut Value) {
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("managedFields");
    }
    if let Some(items) = object.get_mut("items").and_then(Value::as_array_mut) {
        items.iter_mut().for_each(omit_managed_fields);
    }
}

impl RequestAudit {
    fn event(
        &self,
        stage: Stage,
        response_status: Option<ResponseStatus>,
        response_object: Option<Value>,
    ) -> Event {
        let state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Event {
            kind: "Event",
            api_version: "audit.k8s.io/v1",
            level: self.decision.level,
            audit_id: self.id.clone(),
            stage,
            request_uri: self.request_uri.clone(),
            verb: self.verb.clone(),
            user: self.user.clone(),
            impersonated_user: state.impersonated.clone(),
            source_ips: self.source_ips.clone(),
            user_agent: self.user_agent.clone(),
            object_ref: state.object_ref.clone(),
            response_status,
            request_object: state.request_object.clone(),
            response_object,
            request_received_timestamp: micro_time(self.received),
            stage_timestamp: micro_time(chrono::Utc::now()),
            annotations: state.annotations.clone(),
        }
    }

    fn writes(&self, stage: Stage) -> bool {
        !self.decision.omit_stages.contains(&stage)
    }
}

/// Largest answer recorded as a `responseObject` (upstream's request limit).
const MAX_RECORDED_RESPONSE: usize = 3 * 1024 * 1024;

/// Serves a request through `serve` with `record` as its audit record: `RequestReceived`
/// before, then `ResponseStarted` (long-running requests) and `ResponseComplete` once the
/// answer — for a stream, its last byte — has gone.
pub async fn audited(
    auditor: Arc<Auditor>,
    record: Arc<RequestAudit>,
    long_running: bool,
    serve: impl Future<Output = Response>,
) -> Response {
    if record.writes(Stage::RequestReceived) {
        auditor
            .emit(&record.event(Stage::RequestReceived, None, None))
            .await;
    }
    let response = CURRENT.scope(record.clone(), serve).await;
    let code = response.status().as_u16();
    let streams = long_running && code < 300;
    if streams {
        if record.writes(Stage::ResponseStarted) {
            auditor
                .emit(&record.event(
                    Stage::ResponseStarted,
                    Some(ResponseStatus::of(code, None)),
                    None,
                ))
                .await;
        }
        if !record.writes(Stage::ResponseComplete) {
            return response;
        }
        // The last stage is written when the stream ends, however it ends.
        let (parts, body) = response.into_parts();
        let complete = CompleteOnDrop {
            auditor,
            record,
            code,
        };
        let stream = body.into_data_stream().map(move |chunk| {
            let _ = &complete;
            chunk
        });
        return Response::from_parts(parts, Body::from_stream(stream));
    }
    // A failure's `Status` goes into the record, as does the whole answer at
    // `RequestResponse`: both are in memory already.
    let wants_body = code >= 400 || record.decision.level == Level::RequestResponse;
    let is_json = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    // Only an answer already whole in memory, and not too large, is read: reading it must
    // not cost the client its answer.
    let whole = {
        use hyper::body::Body as _;
        response
            .body()
            .size_hint()
            .exact()
            .is_some_and(|size| size <= MAX_RECORDED_RESPONSE as u64)
    };
    let (response, body) = if wants_body && is_json && whole {
        let (parts, body) = response.into_parts();
        match axum::body::to_bytes(body, MAX_RECORDED_RESPONSE).await {
            Ok(bytes) => {
                let parsed = serde_json::from_slice::<Value>(&bytes).ok();
                (Response::from_parts(parts, Body::from(bytes)), parsed)
            }
            Err(err) => {
                tracing::warn!(%err, "an answer could not be read for the audit log");
                (Response::from_parts(parts, Body::empty()), None)
            }
        }
    } else {
        (response, None)
    };
    if record.writes(Stage::ResponseComplete) {
        let status = ResponseStatus::of(code, body.as_ref().filter(|_| code >= 400));
        let mut object = body.filter(|_| record.decision.level == Level::RequestResponse);
        if record.decision.omit_managed_fields
            && let Some(object) = object.as_mut()
        {
            omit_managed_fields(object);
        }
        auditor
            .emit(&record.event(Stage::ResponseComplete, Some(status), object))
            .await;
    }
    response
}

/// Writes a stream's `ResponseComplete` when the stream is dropped (ended or cut).
struct CompleteOnDrop {
    auditor: Arc<Auditor>,
    record: Arc<RequestAudit>,
    code: u16,
}

impl Drop for CompleteOnDrop {
    fn drop(&mut self) {
        let event = self.record.event(
            Stage::ResponseComplete,
            Some(ResponseStatus::of(self.code, None)),
            None,
        );
        let auditor = self.auditor.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { auditor.emit(&event).await });
        }
    }
}

/// The event of a request refused at authentication (upstream's
/// `WithFailedAuthenticationAudit`): the policy decides on a request by nobody.
pub async fn failed_authentication(
    auditor: &Auditor,
    cluster_policy: Option<&Policy>,
    request: RequestFacts,
    attributes: &Attributes,
) {
    let decision = auditor.decide(cluster_policy, attributes);
    if let Some(record) = auditor.begin(decision, request, attributes) {
        let status = ResponseStatus {
            message: "Authentication failed".into(),
            ..ResponseStatus::of(401, None)
        };
        if record.writes(Stage::ResponseStarted) {
            auditor
                .emit(&record.event(Stage::ResponseStarted, Some(status), None))
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attributes(group: &str, resource: &str, sub: &str) -> Attributes {
        Attributes {
            user: UserInfo::new("alice", &["devs"]),
            verb: "get".into(),
            api_group: group.into(),
            api_version: "v1".into(),
            resource: resource.into(),
            subresource: sub.into(),
            resource_request: true,
            ..Default::default()
        }
    }

    fn everything(level: &str) -> Policy {
        Policy::parse(&format!(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{{level: {level}}}]"
        ))
        .expect("valid")
    }

    #[tokio::test]
    async fn secrets_and_tokens_are_never_recorded_beyond_metadata() {
        let dir = tempfile::tempdir().expect("temp dir");
        let auditor = Auditor::start(AuditOptions {
            policy: Some(everything("RequestResponse")),
            log: Some(LogOptions {
                path: dir.path().join("audit.log"),
                max_size_mb: 0,
                max_backups: 0,
                max_age_days: 0,
            }),
            webhook: None,
        })
        .await
        .expect("starts");
        let level = |a: &Attributes| auditor.decide(None, a).level;
        assert_eq!(level(&attributes("", "secrets", "")), Level::Metadata);
        assert_eq!(
            level(&attributes("", "serviceaccounts", "token")),
            Level::Metadata
        );
        assert_eq!(
            level(&attributes("authentication.k8s.io", "tokenreviews", "")),
            Level::Metadata
        );
        assert_eq!(
            level(&attributes("", "configmaps", "")),
            Level::RequestResponse
        );
        // The cluster's policy adds to the operator's.
        let quiet = Policy::parse(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None, resources: [{group: ''}]}, {level: Metadata}]",
        )
        .expect("valid");
        let auditor = Auditor {
            policy: Some(quiet),
            ..auditor
        };
        assert_eq!(
            auditor.decide(None, &attributes("", "pods", "")).level,
            Level::None
        );
        assert_eq!(
            auditor
                .decide(Some(&everything("Request")), &attributes("", "pods", ""))
                .level,
            Level::Request
        );
    }

    #[tokio::test]
    async fn a_policy_without_a_backend_is_refused() {
        let err = Auditor::start(AuditOptions {
            policy: Some(everything("Metadata")),
            ..Default::default()
        })
        .await
        .expect_err("refused");
        assert!(err.contains("--audit-log-path"), "{err}");
        let silent = Auditor::disabled();
        assert_eq!(
            silent
                .decide(Some(&everything("Metadata")), &attributes("", "pods", ""))
                .level,
            Level::None
        );
    }

    #[tokio::test]
    async fn a_recorded_request_writes_its_stages_with_annotations() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("audit.log");
        let auditor = Arc::new(
            Auditor::start(AuditOptions {
                policy: Some(everything("RequestResponse")),
                log: Some(LogOptions {
                    path: path.clone(),
                    max_size_mb: 0,
                    max_backups: 0,
                    max_age_days: 0,
                }),
                webhook: None,
            })
            .await
            .expect("starts"),
        );
        let mut create = attributes("", "configmaps", "");
        create.verb = "create".into();
        create.namespace = "default".into();
        let record = auditor
            .begin(
                auditor.decide(None, &create),
                RequestFacts {
                    audit_id: "id-1".into(),
                    cluster: "c1".into(),
                    request_uri: "/api/v1/namespaces/default/configmaps".into(),
                    source_ips: vec!["10.1.2.3".into()],
                    user_agent: "test".into(),
                },
                &create,
            )
            .expect("recorded");
        let response = audited(auditor.clone(), record, false, async {
            note_request_body(|| {
                serde_json::from_str(
                    r#"{"metadata":{"name":"cm","managedFields":[]},"data":{"a":"1"}}"#,
                )
                .ok()
            });
            annotate("example.com/decided", "yes");
            Response::builder()
                .status(201)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Body::from(
                    r#"{"kind":"ConfigMap","metadata":{"name":"cm"}}"#,
                ))
                .expect("a response")
        })
        .await;
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("the body is intact");
        assert_eq!(
            &body[..],
            br#"{"kind":"ConfigMap","metadata":{"name":"cm"}}"#
        );
        let mut lines = Vec::new();
        for _ in 0..100 {
            lines = std::fs::read_to_string(&path)
                .unwrap_or_default()
                .lines()
                .map(|line| serde_json::from_str::<Value>(line).expect("a JSON line"))
                .collect();
            if lines.len() == 2 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["stage"], "RequestReceived");
        let complete = &lines[1];
        assert_eq!(complete["stage"], "ResponseComplete");
        assert_eq!(complete["auditID"], "id-1");
        assert_eq!(complete["objectRef"]["name"], "cm");
        assert_eq!(complete["responseStatus"]["code"], 201);
        assert_eq!(complete["requestObject"]["data"]["a"], "1");
        assert_eq!(complete["responseObject"]["kind"], "ConfigMap");
        assert_eq!(complete["annotations"][CLUSTER_ANNOTATION], "c1");
        assert_eq!(complete["annotations"]["example.com/decided"], "yes");
    }
}
