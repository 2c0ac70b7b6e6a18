//! `ApiError`: every failure the API can answer, and the one place it becomes a wire `Status`.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};
use serde_json::{Value, json};

use crate::resources::GroupResource;

/// A Kubernetes API failure: HTTP code, `reason` and message, exactly as kube-apiserver's
/// `k8s.io/apimachinery/pkg/api/errors` constructors build them. Constructors are named after
/// those (`NewNotFound` → [`ApiError::not_found`]).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{reason} ({code}): {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// The machine-readable `StatusReason`.
    pub reason: &'static str,
    /// The human-readable message.
    pub message: String,
    /// Structured details (name, group, kind, causes, retry-after).
    pub details: Option<Box<StatusDetails>>,
    /// `metadata.continue` of the Status: the token to resume an expired paginated list.
    pub continue_token: Option<String>,
}

/// One field problem inside an `Invalid` error (upstream `field.Error`), from api-machinery.
pub use flotilla_api_machinery::field::{FieldError, Path};

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            continue_token: None,
        }
    }

    fn with_details(mut self, resource: &GroupResource, name: &str) -> Self {
        self.details = Some(Box::new(StatusDetails {
            name: (!name.is_empty()).then(|| name.to_string()),
            group: (!resource.group.is_empty()).then(|| resource.group.clone()),
            kind: Some(resource.resource.clone()),
            ..Default::default()
        }));
        self
    }

    /// `NewNotFound`: 404 `pods "x" not found`.
    pub fn not_found(resource: &GroupResource, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{resource} \"{name}\" not found"))
            .with_details(resource, name)
    }

    /// `NewAlreadyExists`: 409 `pods "x" already exists`.
    pub fn already_exists(resource: &GroupResource, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{resource} \"{name}\" already exists"),
        )
        .with_details(resource, name)
    }

    /// `NewConflict`: 409 `Operation cannot be fulfilled on pods "x": <why>`.
    pub fn conflict(resource: &GroupResource, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {resource} \"{name}\": {why}"),
        )
        .with_details(resource, name)
    }

    /// The optimistic-concurrency conflict of a stale update.
    pub fn stale_update(resource: &GroupResource, name: &str) -> Self {
        Self::conflict(
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// `NewApplyConflict`: 409 with one cause per conflicting field.
    pub fn apply_conflict(causes: Vec<StatusCause>, message: String) -> Self {
        let mut err = Self::new(409, "Conflict", message);
        err.details = Some(Box::new(StatusDetails {
            causes: Some(causes),
            ..Default::default()
        }));
        err
    }

    /// `NewInvalid`: 422 `Deployment.apps "x" is invalid: [a: …, b: …]`.
    pub fn invalid(group: &str, kind: &str, name: &str, errors: Vec<FieldError>) -> Self {
        let qualified_kind = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let summary = flotilla_api_machinery::field::aggregate(&errors);
        let mut err = Self::new(
            422,
            "Invalid",
            format!("{qualified_kind} \"{name}\" is invalid: {summary}"),
        );
        err.details = Some(Box::new(StatusDetails {
            name: Some(name.to_string()),
            group: (!group.is_empty()).then(|| group.to_string()),
            kind: Some(kind.to_string()),
            causes: Some(
                errors
                    .iter()
                    .map(|e| StatusCause {
                        field: Some(e.field.clone()),
                        message: Some(e.body()),
                        reason: Some(e.error_type.reason().to_string()),
                    })
                    .collect(),
            ),
            ..Default::default()
        }));
        err
    }

    /// `NewBadRequest`: 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// `NewForbidden`: 403 `pods "x" is forbidden: <why>`.
    pub fn forbidden(resource: &GroupResource, name: &str, why: &str) -> Self {
        let message = if name.is_empty() {
            format!("{resource} is forbidden: {why}")
        } else {
            format!("{resource} \"{name}\" is forbidden: {why}")
        };
        Self::new(403, "Forbidden", message).with_details(resource, name)
    }

    /// `NewForbidden` with a prepared message (the authorizer's, see `authz::forbidden`).
    pub fn forbidden_message(group: &str, resource: &str, name: &str, message: String) -> Self {
        let mut err = Self::new(403, "Forbidden", message);
        if !resource.is_empty() {
            err.details = Some(Box::new(StatusDetails {
                name: (!name.is_empty()).then(|| name.to_string()),
                group: (!group.is_empty()).then(|| group.to_string()),
                kind: Some(resource.to_string()),
                ..Default::default()
            }));
        }
        err
    }

    /// `NewUnauthorized`: 401.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// `NewMethodNotSupported`: 405.
    pub fn method_not_supported(resource: &GroupResource, verb: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("{verb} is not supported on resources of kind \"{resource}\""),
        )
        .with_details(resource, "")
    }

    /// 405 on a non-resource path (discovery, OpenAPI, version) for anything but GET.
    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    /// A path that names no resource: upstream's plain 404 `the server could not find the requested resource`.
    pub fn no_such_path() -> Self {
        let mut err = Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
        err.details = Some(Box::default());
        err
    }

    /// 406 for an `Accept` header the server cannot satisfy.
    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }

    /// 415 for a body content type the verb does not take.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf (got {content_type})"
            ),
        )
    }

    /// `NewResourceExpired`: 410 `Expired`.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// `NewRequestEntityTooLargeError`: 413, for a body over `limit` bytes.
    pub fn request_entity_too_large(limit: usize) -> Self {
        Self::entity_too_large(format!("limit is {limit}"))
    }

    /// `NewRequestEntityTooLargeError(message)`: 413.
    pub fn entity_too_large(message: impl std::fmt::Display) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: {message}"),
        )
    }

    /// What upstream answers when a JSON patch does not apply: `NewGenericServerResponse`
    /// with 422, whose message is canned; the patch's own error is kept as the cause.
    pub fn patch_rejected(why: impl std::fmt::Display) -> Self {
        let mut err = Self::new(
            422,
            "Invalid",
            "the server rejected our request due to an error in our request",
        );
        err.details = Some(Box::new(StatusDetails {
            causes: Some(vec![StatusCause {
                reason: None,
                message: Some(why.to_string()),
                field: None,
            }]),
            ..Default::default()
        }));
        err
    }

    /// `NewTooManyRequests`: 429 with a retry-after hint.
    pub fn too_many_requests(message: impl Into<String>, retry_after_seconds: i32) -> Self {
        let mut err = Self::new(429, "TooManyRequests", message);
        err.details = Some(Box::new(StatusDetails {
            retry_after_seconds: Some(retry_after_seconds),
            ..Default::default()
        }));
        err
    }

    /// `NewTimeoutError` (504), used for "Too large resource version".
    pub fn too_large_resource_version(requested: i64, current: i64) -> Self {
        let mut err = Self::new(
            504,
            "Timeout",
            format!("Timeout: Too large resource version: {requested}, current: {current}"),
        );
        err.details = Some(Box::new(StatusDetails {
            causes: Some(vec![StatusCause {
                reason: Some("ResourceVersionTooLarge".into()),
                message: Some("Too large resource version".into()),
                field: None,
            }]),
            retry_after_seconds: Some(1),
            ..Default::default()
        }));
        err
    }

    /// `NewInternalError`: 500.
    pub fn internal(err: impl std::fmt::Display) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {err}"),
        )
    }

    /// A plain error with no API reason (upstream's `ErrorToAPIStatus` fallback): 500, reason "".
    pub fn unknown(message: impl Into<String>) -> Self {
        Self::new(500, "", message)
    }

    /// `NewGenericServerResponse`: what another server (a kubelet) answered with `code`; a
    /// 403 keeps its message, other codes get upstream's canned one, with the answer as the
    /// cause.
    pub fn generic_server_response(
        code: u16,
        resource: &str,
        name: &str,
        server_message: String,
    ) -> Self {
        let (reason, message) = match code {
            409 => ("Conflict", "the server reported a conflict".to_string()),
            404 => (
                "NotFound",
                "the server could not find the requested resource".to_string(),
            ),
            400 => (
                "BadRequest",
                "the server rejected our request for an unknown reason".to_string(),
            ),
            401 => (
                "Unauthorized",
                "the server has asked for the client to provide credentials".to_string(),
            ),
            403 => ("Forbidden", server_message.clone()),
            405 => (
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource".to_string(),
            ),
            429 => (
                "TooManyRequests",
                "the server has received too many requests and has asked us to try again later"
                    .to_string(),
            ),
            503 => (
                "ServiceUnavailable",
                "the server is currently unable to handle the request".to_string(),
            ),
            504 => (
                "Timeout",
                "the server was unable to return a response in the time allotted, but may still be processing the request".to_string(),
            ),
            _ => (
                "",
                format!("the server responded with the status code {code} but did not return more information"),
            ),
        };
        let mut err = Self::new(code, reason, message);
        err.details = Some(Box::new(StatusDetails {
            name: (!name.is_empty()).then(|| name.to_string()),
            kind: (!resource.is_empty()).then(|| resource.to_string()),
            causes: Some(vec![StatusCause {
                reason: Some("UnexpectedServerResponse".into()),
                message: Some(server_message),
                field: None,
            }]),
            ..Default::default()
        }));
        err
    }

    /// A Status another component chose (an admission webhook's refusal): its code when it is
    /// an error code (else 400, as upstream's `ToStatusErr`), its reason when it is one of
    /// the API's, its message as written.
    pub fn from_status(code: u16, reason: &str, message: String) -> Self {
        const REASONS: [&str; 16] = [
            "Unauthorized",
            "Forbidden",
            "NotFound",
            "AlreadyExists",
            "Conflict",
            "Gone",
            "Invalid",
            "ServerTimeout",
            "Timeout",
            "TooManyRequests",
            "BadRequest",
            "MethodNotAllowed",
            "NotAcceptable",
            "RequestEntityTooLarge",
            "UnsupportedMediaType",
            "InternalError",
        ];
        let code = if (400..600).contains(&code) {
            code
        } else {
            400
        };
        let reason = REASONS
            .iter()
            .copied()
            .find(|known| *known == reason)
            .unwrap_or("");
        Self::new(code, reason, message)
    }

    /// `NewTimeoutError` of upstream's request-timeout filter: 504.
    pub fn request_timeout() -> Self {
        Self::new(
            504,
            "Timeout",
            "Timeout: request did not complete within the allowed duration",
        )
    }

    /// `NewServiceUnavailable`: 503.
    pub fn service_unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// The `Status` object this error is on the wire.
    pub fn to_status(&self) -> Status {
        Status {
            code: Some(i32::from(self.code)),
            details: self.details.as_deref().cloned(),
            message: Some(self.message.clone()),
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta {
                continue_: self.continue_token.clone(),
                ..Default::default()
            },
            reason: Some(self.reason.to_string()),
            status: Some("Failure".to_string()),
        }
    }
}

impl From<flotilla_storage::StorageError> for ApiError {
    fn from(err: flotilla_storage::StorageError) -> Self {
        use flotilla_storage::StorageError;
        match &err {
            StorageError::Compacted { .. } => {
                ApiError::expired(format!("too old resource version: {err}"))
            }
            StorageError::FutureRevision { requested, current } => {
                ApiError::too_large_resource_version(*requested, *current)
            }
            StorageError::Unavailable { .. } => ApiError::service_unavailable(err.to_string()),
            StorageError::Corrupt { .. } => ApiError::internal(err),
        }
    }
}

impl ApiError {
    /// The `Status` as upstream writes it: Go's field order (`kind`, `apiVersion`, `metadata`,
    /// `status`, `message`, `reason`, `details`, `code`) and `omitempty` rules (empty strings,
    /// zero code and absent details left out; `metadata` always there).
    pub fn status_value(&self) -> Value {
        let mut status = serde_json::Map::new();
        status.insert("kind".into(), json!("Status"));
        status.insert("apiVersion".into(), json!("v1"));
        let mut list_meta = serde_json::Map::new();
        if let Some(token) = self.continue_token.as_ref().filter(|t| !t.is_empty()) {
            list_meta.insert("continue".into(), json!(token));
        }
        status.insert("metadata".into(), Value::Object(list_meta));
        status.insert("status".into(), json!("Failure"));
        if !self.message.is_empty() {
            status.insert("message".into(), json!(self.message));
        }
        if !self.reason.is_empty() {
            status.insert("reason".into(), json!(self.reason));
        }
        if let Some(details) = &self.details {
            let mut out = serde_json::Map::new();
            let mut put = |key: &str, value: &Option<String>| {
                if let Some(value) = value.as_ref().filter(|v| !v.is_empty()) {
                    out.insert(key.into(), json!(value));
                }
            };
            put("name", &details.name);
            put("group", &details.group);
            put("kind", &details.kind);
            put("uid", &details.uid);
            if let Some(causes) = details.causes.as_ref().filter(|c| !c.is_empty()) {
                let causes: Vec<Value> = causes
                    .iter()
                    .map(|cause| {
                        let mut c = serde_json::Map::new();
                        for (key, value) in [
                            ("reason", &cause.reason),
                            ("message", &cause.message),
                            ("field", &cause.field),
                        ] {
                            if let Some(value) = value.as_ref().filter(|v| !v.is_empty()) {
                                c.insert(key.into(), json!(value));
                            }
                        }
                        Value::Object(c)
                    })
                    .collect();
                out.insert("causes".into(), Value::Array(causes));
            }
            if let Some(seconds) = details.retry_after_seconds.filter(|s| *s != 0) {
                out.insert("retryAfterSeconds".into(), json!(seconds));
            }
            status.insert("details".into(), Value::Object(out));
        }
        if self.code != 0 {
            status.insert("code".into(), json!(self.code));
        }
        Value::Object(status)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = crate::negotiate::to_json(&self.status_value());
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (code, body).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(seconds) = self.details.as_ref().and_then(|d| d.retry_after_seconds) {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

impl ApiError {
    /// 415 for a PATCH whose `Content-Type` names no patch type the kind takes (a custom
    /// resource takes no strategic merge patch, and upstream's message then omits it).
    pub fn unsupported_media_type_for_patch(content_type: &str, strategic: bool) -> Self {
        let strategic = if strategic {
            ", application/strategic-merge-patch+json"
        } else {
            ""
        };
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml{strategic} (got {content_type})"
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_is_written_byte_for_byte_as_upstream_writes_it() {
        let resource = GroupResource {
            group: String::new(),
            resource: "configmaps".into(),
        };
        let body = flotilla_api_machinery::gojson::to_vec(
            &ApiError::not_found(&resource, "nope").status_value(),
        )
        .expect("json");
        assert_eq!(
            String::from_utf8(body).expect("utf-8"),
            "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"configmaps \\\"nope\\\" not found\",\"reason\":\"NotFound\",\"details\":{\"name\":\"nope\",\"kind\":\"configmaps\"},\"code\":404}\n"
        );
    }
}
