//! The management API's errors and the one place they become wire responses (EKS-style JSON).

use axum::response::{IntoResponse, Response};
use http::StatusCode;

/// A failed management request: an EKS error code, an HTTP status and a message.
#[derive(Debug, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ManagementError {
    /// HTTP status of the response.
    pub status: StatusCode,
    /// EKS-style error code (`ResourceNotFoundException`, …).
    pub code: &'static str,
    /// What went wrong, for a person.
    pub message: String,
}

impl ManagementError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ManagementError {
            status,
            code,
            message: message.into(),
        }
    }

    /// 400: a parameter is malformed or out of range.
    pub fn invalid_parameter(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "InvalidParameterException",
            message,
        )
    }

    /// 400: the request is valid but not in this state of the resource.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "InvalidRequestException", message)
    }

    /// 401: no or an unknown credential.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "UnauthorizedException",
            "missing or invalid API key (send Authorization: Bearer <key>)",
        )
    }

    /// 403: a known credential that may not do this.
    pub fn access_denied(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "AccessDeniedException", message)
    }

    /// 404: the resource does not exist for this caller.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "ResourceNotFoundException", message)
    }

    /// 400: the request would take the caller past one of its limits (EKS's code).
    pub fn limit_exceeded(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "ResourceLimitExceededException",
            message,
        )
    }

    /// 413: the request body is larger than the operation takes.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLargeException",
            message,
        )
    }

    /// 409: the resource exists already, or is busy.
    pub fn in_use(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "ResourceInUseException", message)
    }

    /// 409: a client request token reused with different parameters.
    pub fn idempotency_mismatch(token: &str) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "IdempotentParameterMismatchException",
            format!("clientRequestToken {token:?} was already used with different parameters"),
        )
    }

    /// 405: the path exists but not with this method.
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowedException",
            "method not allowed on this path",
        )
    }

    /// 503: storage is unavailable.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailableException",
            message,
        )
    }

    /// 500: a fault of ours.
    pub fn internal(message: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "ServerException",
            message.to_string(),
        )
    }
}

impl From<flotilla_storage::StorageError> for ManagementError {
    fn from(err: flotilla_storage::StorageError) -> Self {
        match err {
            flotilla_storage::StorageError::Unavailable { .. } => {
                Self::unavailable(err.to_string())
            }
            _ => Self::internal(err),
        }
    }
}

impl From<crate::backup::format::FormatError> for ManagementError {
    fn from(err: crate::backup::format::FormatError) -> Self {
        Self::invalid_parameter(err.to_string())
    }
}

impl From<flotilla_apiserver::error::ApiError> for ManagementError {
    /// The store away stays a 503 a client retries; anything else from the cluster's API
    /// is the service's fault.
    fn from(err: flotilla_apiserver::error::ApiError) -> Self {
        if err.code == 503 {
            Self::unavailable(err.message)
        } else {
            Self::internal(err.message)
        }
    }
}

impl IntoResponse for ManagementError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.code, "message": self.message});
        (self.status, axum::Json(body)).into_response()
    }
}
