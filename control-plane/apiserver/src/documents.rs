//! The documents a tenant's API serves for clients to cache: discovery (legacy and
//! aggregated, the tenant's remote APIServices' groups included) and OpenAPI v2/v3 (the
//! tenant's custom kinds in, remote group versions' v3 documents proxied to their servers),
//! answered with an `ETag` and `304 Not Modified`.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};

use crate::ApiServer;
use crate::discovery;
use crate::error::ApiError;
use crate::handler::{Call, json_bytes, plain_json};
use crate::tenants::TenantState;

/// Whether `rest` names a discovery or OpenAPI document (what clients cache).
pub(crate) fn is_document(rest: &[&str]) -> bool {
    matches!(
        rest,
        ["api"] | ["apis"] | ["api", _] | ["apis", _] | ["apis", _, _] | ["openapi", ..]
    )
}

/// A document's answer with an `ETag` (a hash of its bytes), or `304 Not Modified` when the
/// request's `If-None-Match` names it: kubectl's discovery and OpenAPI caches revalidate this
/// way, as with upstream.
pub(crate) async fn with_etag(response: Response, if_none_match: &str) -> Response {
    if response.status() != StatusCode::OK {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    // Documents are built in memory; the limit only guards against a programming error.
    let Ok(bytes) = axum::body::to_bytes(body, 64 << 20).await else {
        return ApiError::internal("a document could not be read back").into_response();
    };
    let etag = format!("\"{}\"", crate::openapi::content_hash(&bytes));
    if let Ok(value) = HeaderValue::from_str(&etag) {
        parts.headers.insert(header::ETAG, value);
    }
    let matched = if_none_match
        .split(',')
        .map(|tag| tag.trim().trim_start_matches("W/"))
        .any(|tag| tag == etag || tag == "*");
    if matched {
        parts.status = StatusCode::NOT_MODIFIED;
        parts.headers.remove(header::CONTENT_TYPE);
        return Response::from_parts(parts, axum::body::Body::empty());
    }
    Response::from_parts(parts, axum::body::Body::from(bytes))
}

/// `/api` (core) or `/apis`: aggregated discovery when the client asks for it, else the
/// legacy documents.
pub(crate) async fn discovery_root(
    server: &ApiServer,
    state: &TenantState,
    accept: &str,
    core: bool,
) -> Result<Response, ApiError> {
    if discovery::wants_aggregated(accept) {
        let table = state.kinds.table(server, &state.tenant).await?;
        let mut document = discovery::aggregated(&table, core);
        if !core && let Some(items) = document["items"].as_array_mut() {
            for (group, versions) in crate::aggregator::remote_groups(server, state, &table).await?
            {
                items.extend(crate::aggregator::remote_group_discovery(&group, &versions));
            }
        }
        let mut response = plain_json(&document);
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(discovery::AGGREGATED_CONTENT_TYPE),
        );
        return Ok(response);
    }
    if core {
        Ok(plain_json(&discovery::api_versions(
            &server.advertise_address,
        )))
    } else {
        let table = state.kinds.table(server, &state.tenant).await?;
        let mut document = discovery::api_group_list(&table);
        if let Some(groups) = document["groups"].as_array_mut() {
            for (group, versions) in crate::aggregator::remote_groups(server, state, &table).await?
            {
                groups.push(crate::aggregator::remote_group_entry(&group, &versions));
            }
        }
        Ok(plain_json(&document))
    }
}

/// `/openapi/{version}/{path…}`.
pub(crate) async fn openapi(
    server: &ApiServer,
    state: &TenantState,
    version: &str,
    path: &[&str],
    rest: &[&str],
    call: &Call,
    accept: &str,
) -> Result<Response, ApiError> {
    match (version, path) {
        // kubectl and client-go ask for gnostic's protobuf form only; browsers and curl get JSON.
        ("v2", []) => {
            let custom = state.kinds.documents(server, &state.tenant).await?;
            let (json, protobuf) = match &custom {
                Some(custom) => {
                    let documents = custom.v2(&server.openapi);
                    (&documents.0, &documents.1)
                }
                None => (server.openapi.v2(), server.openapi.v2_protobuf()),
            };
            if accept.contains(flotilla_protobuf::openapi_v2::OPENAPI_V2_PROTOBUF_TYPE) {
                let mut response = (StatusCode::OK, protobuf.clone()).into_response();
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(flotilla_protobuf::openapi_v2::OPENAPI_V2_PROTOBUF),
                );
                Ok(response)
            } else {
                Ok(json_bytes(json))
            }
        }
        ("v3", []) => {
            let index = match state.kinds.documents(server, &state.tenant).await? {
                Some(custom) => custom.v3_index().clone(),
                None => server.openapi.v3_index().clone(),
            };
            let table = state.kinds.table(server, &state.tenant).await?;
            let remote = crate::aggregator::remote_groups(server, state, &table).await?;
            if remote.is_empty() {
                return Ok(json_bytes(&index));
            }
            // Remote group versions' documents are their servers' (proxied below), listed
            // with a hash of what their server was last found to serve.
            let mut index: Value = serde_json::from_slice(&index).map_err(ApiError::internal)?;
            for (group, versions) in &remote {
                for (version, served) in versions {
                    let Some(served) = served else { continue };
                    let hash = crate::openapi::content_hash(served.to_string().as_bytes());
                    index["paths"][format!("apis/{group}/{version}")] = json!({
                        "serverRelativeURL": format!("/openapi/v3/apis/{group}/{version}?hash={hash}")
                    });
                }
            }
            Ok(plain_json(&index))
        }
        ("v3", path) => {
            // A remote group version's document is its server's.
            if let ["apis", group, version] = path {
                let table = state.kinds.table(server, &state.tenant).await?;
                if let Some(api) = state
                    .remote_apis
                    .serving(server, state, &table, group, version)
                    .await?
                {
                    return crate::aggregator::proxy::proxy(server, state, &api, rest, call).await;
                }
            }
            let path = path.join("/");
            match state.kinds.documents(server, &state.tenant).await? {
                Some(custom) => custom.v3_document(&path).map(json_bytes),
                None => server.openapi.v3_document(&path).map(json_bytes),
            }
            .ok_or_else(ApiError::no_such_path)
        }
        _ => Err(ApiError::no_such_path()),
    }
}
