//! The console's only way to data: requests to the service's own router (the management API
//! and the tenant APIs) through an in-memory tower service, with the signed-in user's key and
//! the browser's connection facts (its address, for a cluster's endpoint access rules) — the
//! same authentication and rules as if the browser had called them itself.

use axum::Router;
use axum::body::Body;
use http::{Extensions, Method, Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;

/// What a failed call says, in one line for the page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamError {
    /// The answer's status (500 when the call itself failed).
    pub status: StatusCode,
    /// The API's own message.
    pub message: String,
}

impl std::fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl UpstreamError {
    fn internal(message: impl Into<String>) -> Self {
        UpstreamError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
        }
    }
}

/// The message in an error answer: the management API's `{code, message}` or a Kubernetes
/// `Status`'s `message`, else the status line.
fn error_message(status: StatusCode, body: &[u8]) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    parsed
        .as_ref()
        .and_then(|v| v["message"].as_str())
        .map(str::to_string)
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| {
            format!(
                "the service answered {} {}",
                status.as_u16(),
                status.canonical_reason().unwrap_or("")
            )
        })
}

/// A caller of the router as one browser user.
pub struct Upstream<'a> {
    router: &'a Router,
    bearer: &'a str,
    connection: &'a Extensions,
}

impl<'a> Upstream<'a> {
    /// Calls `router` with `bearer`, carrying the browser request's `connection` extensions.
    pub fn new(router: &'a Router, bearer: &'a str, connection: &'a Extensions) -> Self {
        Upstream {
            router,
            bearer,
            connection,
        }
    }

    /// The same caller with another bearer token (a cluster's short-lived admin token).
    pub fn with_bearer(&self, bearer: &'a str) -> Upstream<'a> {
        Upstream {
            router: self.router,
            bearer,
            connection: self.connection,
        }
    }

    /// `method path` with an optional JSON body; the answer's bytes, or its error.
    pub async fn call_bytes(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<bytes::Bytes, UpstreamError> {
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", self.bearer),
            )
            .header(http::header::ACCEPT, "application/json");
        if body.is_some() {
            request = request.header(http::header::CONTENT_TYPE, "application/json");
        }
        let body = match body {
            Some(value) => Body::from(serde_json::to_vec(value).unwrap_or_default()),
            None => Body::empty(),
        };
        let mut request = request
            .body(body)
            .map_err(|e| UpstreamError::internal(format!("building a request: {e}")))?;
        *request.extensions_mut() = self.connection.clone();
        let response = self
            .router
            .clone()
            .oneshot(request)
            .await
            .map_err(|e| UpstreamError::internal(format!("calling the service: {e}")))?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| UpstreamError::internal(format!("reading an answer: {e}")))?
            .to_bytes();
        if status.is_success() {
            Ok(bytes)
        } else {
            Err(UpstreamError {
                status,
                message: error_message(status, &bytes),
            })
        }
    }

    /// `method path` answered with JSON.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<serde_json::Value, UpstreamError> {
        let bytes = self.call_bytes(method, path, body).await?;
        if bytes.is_empty() {
            return Ok(serde_json::Value::Null);
        }
        serde_json::from_slice(&bytes).map_err(|e| {
            UpstreamError::internal(format!("the service answered unreadable JSON: {e}"))
        })
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Result<serde_json::Value, UpstreamError> {
        self.call(Method::GET, path, None).await
    }
}

/// Percent-encodes one path segment (names are DNS labels, but a URL typed by hand is not).
pub fn segment(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_read_as_the_apis_message() {
        assert_eq!(
            error_message(
                StatusCode::CONFLICT,
                br#"{"code":"ResourceInUseException","message":"cluster \"a\" already exists"}"#
            ),
            r#"cluster "a" already exists"#
        );
        assert_eq!(
            error_message(
                StatusCode::FORBIDDEN,
                br#"{"kind":"Status","message":"pods is forbidden"}"#
            ),
            "pods is forbidden"
        );
        assert_eq!(
            error_message(StatusCode::BAD_GATEWAY, b"<html>"),
            "the service answered 502 Bad Gateway"
        );
        assert_eq!(segment("a b/c"), "a%20b%2Fc");
    }
}
