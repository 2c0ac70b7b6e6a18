//! Requests for a remote APIService's group version, proxied to the server behind its
//! Service (upstream kube-aggregator's `proxyHandler`): the caller authenticated and
//! authorized here, its identity passed on in the front proxy's request headers under the
//! front proxy's client certificate, its own credentials never. The answer streams back as
//! it arrives, so watches work.

use axum::response::{IntoResponse, Response};
use http::{HeaderName, HeaderValue, header};
use http_body_util::Full;

use super::remote::{RemoteApi, RemoteApis};
use crate::ApiServer;
use crate::error::ApiError;
use crate::handler::Call;
use crate::tenants::TenantState;

/// Headers never passed to the extension server: the caller's credentials, headers claiming
/// an identity, and hop-by-hop headers.
fn is_withheld(name: &HeaderName) -> bool {
    let name = name.as_str();
    name.starts_with("impersonate-")
        || name.starts_with("x-remote-")
        || matches!(
            name,
            "authorization"
                | "host"
                | "connection"
                | "keep-alive"
                | "proxy-authorization"
                | "te"
                | "trailer"
                | "transfer-encoding"
                | "upgrade"
                | "content-length"
        )
}

/// Proxies `call` for `/{rest}` to `api`'s server.
pub async fn proxy(
    server: &ApiServer,
    state: &TenantState,
    api: &RemoteApi,
    rest: &[&str],
    call: &Call,
) -> Result<Response, ApiError> {
    let (endpoint, config) =
        RemoteApis::connection(server, state, api)
            .await
            .map_err(|unreachable| {
                ApiError::service_unavailable(format!(
                    "error trying to reach service: {}",
                    unreachable.message
                ))
            })?;
    let mut path = format!("/{}", rest.join("/"));
    if !call.raw_query.is_empty() {
        let query = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(call.raw_query.iter())
            .finish();
        path = format!("{path}?{query}");
    }
    let mut request = http::Request::builder()
        .method(call.method.clone())
        .uri(&path)
        .header(header::HOST, &endpoint.authority);
    for (name, value) in &call.headers {
        if !is_withheld(name) {
            request = request.header(name, value);
        }
    }
    let user = &call.user;
    let remote = |value: &str| {
        HeaderValue::from_str(value).map_err(|_| {
            ApiError::bad_request(format!("{value:?} cannot be passed on in a header"))
        })
    };
    request = request.header("x-remote-user", remote(&user.name)?);
    for group in &user.groups {
        request = request.header("x-remote-group", remote(group)?);
    }
    for (key, values) in &user.extra {
        // Upstream escapes extra keys, which may hold characters headers cannot.
        let escaped: String = form_urlencoded::byte_serialize(key.as_bytes()).collect();
        let name = HeaderName::from_bytes(format!("x-remote-extra-{escaped}").as_bytes())
            .map_err(|_| ApiError::bad_request(format!("extra key {key:?} cannot be passed on")))?;
        for value in values {
            request = request.header(name.clone(), remote(value)?);
        }
    }
    let request = request
        .body(Full::new(call.body.clone()))
        .map_err(ApiError::internal)?;
    let answer = crate::outbound::forward(&endpoint, config, request)
        .await
        .map_err(|err| {
            ApiError::service_unavailable(format!("error trying to reach service: {err}"))
        })?;
    let (mut parts, body) = answer.into_parts();
    for hop_by_hop in ["connection", "keep-alive", "transfer-encoding", "upgrade"] {
        parts.headers.remove(hop_by_hop);
    }
    Ok(Response::from_parts(parts, axum::body::Body::new(body)).into_response())
}
