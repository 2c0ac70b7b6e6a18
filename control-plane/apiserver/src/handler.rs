//! The HTTP surface of a tenant's Kubernetes API: path routing, verbs, query options and
//! response encoding. Every failure leaves through [`ApiError`]'s one `IntoResponse`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use serde_json::{Value, json};

use crate::ApiServer;
use crate::admission;
use crate::discovery;
use crate::error::{ApiError, Path};
use crate::meta;
use crate::negotiate::{self, BodyFormat, Representation};
use crate::resources::{ResourceInfo, ScaleSubresource};
use crate::selection::Selection;
use crate::store::{
    DeleteOptions, Deleted, FieldValidation, ListOptions, Propagation, ReadAt, Tenant,
    UpdateTarget, WriteOptions,
};
use crate::table::IncludeObject;
use crate::tenants::TenantState;
use crate::watch::{self, WatchOptions};

/// Largest request body accepted (upstream's 3 MiB JSON limit).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// Kinds whose registry returns the deleted object rather than a `Status` (`ReturnDeletedObject`).
fn returns_deleted_object(resource: &ResourceInfo) -> bool {
    resource.group.is_empty()
        && matches!(
            &*resource.kind,
            "Pod" | "Service" | "ServiceAccount" | "PersistentVolume" | "PersistentVolumeClaim"
        )
}

/// Default watch timeout when the client gives none (upstream picks 30–60 min).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// One decoded request to a tenant's API.
pub struct Call {
    /// The verb.
    pub method: Method,
    /// Query parameters (last value wins, as Go's `url.Values.Get`).
    pub query: HashMap<String, String>,
    /// Request headers.
    pub headers: HeaderMap,
    /// The raw body.
    pub body: Bytes,
    /// Who sent it.
    pub user: crate::authn::UserInfo,
    /// Every query pair in order (repeated parameters such as exec's `command`).
    pub raw_query: Vec<(String, String)>,
    /// The connection's upgrade, for the streaming subresources (`exec`, `attach`,
    /// `portforward`); absent on the in-memory transport.
    pub upgrade: Option<hyper::upgrade::OnUpgrade>,
    /// Sent by the tenant's own control loops hosted in this process: not counted against
    /// the tenant's limits (upstream gives system components their own priority levels).
    pub hosted_loop: bool,
    /// The body, parsed already (a large one, on the heavy-work threads) in the format its
    /// request's content type names; taken by the first reader.
    pub parsed: std::sync::Mutex<Option<Value>>,
}

impl Call {
    fn param(&self, name: &str) -> Option<&str> {
        self.query.get(name).map(String::as_str)
    }

    fn header(&self, name: header::HeaderName) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    fn flag(&self, name: &str) -> bool {
        flotilla_api_machinery::query::query_bool(self.param(name))
    }

    fn representation(&self) -> Result<Representation, ApiError> {
        negotiate::representation(self.header(header::ACCEPT))
    }

    fn include_object(&self) -> Result<IncludeObject, ApiError> {
        IncludeObject::parse(self.param("includeObject")).ok_or_else(|| {
            ApiError::bad_request("includeObject must be one of None, Metadata, Object")
        })
    }

    fn write_options(&self) -> Result<WriteOptions, ApiError> {
        let dry_run = match self.param("dryRun") {
            None | Some("") => false,
            Some("All") => true,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "Invalid value: {other:?}: supported values: \"All\""
                )));
            }
        };
        let field_validation = match self.param("fieldValidation") {
            None | Some("") | Some("Warn") => FieldValidation::Warn,
            Some("Strict") => FieldValidation::Strict,
            Some("Ignore") => FieldValidation::Ignore,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "Invalid value: {other:?}: fieldValidation must be one of \"Ignore\", \"Warn\", or \"Strict\""
                )));
            }
        };
        let field_manager = match self.param("fieldManager") {
            Some(m) if !m.is_empty() => m.to_string(),
            // Upstream derives the manager from the user agent's program name.
            _ => self
                .header(header::USER_AGENT)
                .split('/')
                .next()
                .unwrap_or("")
                .to_string(),
        };
        if field_manager.len() > 128 {
            return Err(ApiError::bad_request(
                "fieldManager: Too long: may not be more than 128 bytes",
            ));
        }
        Ok(WriteOptions {
            dry_run,
            field_validation,
            field_manager,
            apply: false,
            user: Some(self.user.clone()),
        })
    }

    fn body_json(&self) -> Result<Value, ApiError> {
        let format = negotiate::body_format(self.header(header::CONTENT_TYPE))?;
        self.body_in(format)
    }

    /// The body as `format`: the value parsed already, or a parse now.
    pub fn body_in(&self, format: negotiate::BodyFormat) -> Result<Value, ApiError> {
        if let Some(parsed) = self.parsed.lock().ok().and_then(|mut parsed| parsed.take()) {
            return Ok(parsed);
        }
        negotiate::parse_body(&self.body, format)
    }
}

/// Parses a query string into a map.
pub fn parse_query(query: Option<&str>) -> HashMap<String, String> {
    form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

fn json_response(
    code: StatusCode,
    content_type: &'static str,
    value: &Value,
    warnings: &[String],
) -> Response {
    let body = if content_type == "application/yaml" {
        serde_yaml::to_string(value)
            .map(String::into_bytes)
            .unwrap_or_default()
    } else {
        negotiate::to_json(value)
    };
    let mut response = (code, body).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    for warning in warnings {
        let text = format!("299 - {:?}", warning);
        if let Ok(value) = HeaderValue::from_str(&text) {
            response.headers_mut().append(header::WARNING, value);
        }
    }
    response
}

/// An already-serialized JSON document (the OpenAPI documents, built once at start-up).
pub(crate) fn json_bytes(body: &Bytes) -> Response {
    let mut response = (StatusCode::OK, body.clone()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// A plain JSON answer (discovery, version).
pub fn plain_json(value: &Value) -> Response {
    json_response(StatusCode::OK, "application/json", value, &[])
}

/// Upstream's Status for a completed delete (Go's field order, `omitempty`: the core group
/// is left out).
fn success_status(resource: &ResourceInfo, obj: &Value) -> Value {
    let mut details = serde_json::Map::new();
    details.insert("name".into(), json!(meta::name(obj)));
    if !resource.group.is_empty() {
        details.insert("group".into(), json!(resource.group));
    }
    details.insert("kind".into(), json!(resource.plural));
    details.insert("uid".into(), json!(meta::uid(obj)));
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
        "details": details,
    })
}

/// Routes a request below `/clusters/{id}/` (the part after the prefix is `rest`).
pub async fn tenant_request(
    server: Arc<ApiServer>,
    tenant: Arc<TenantState>,
    rest: &[&str],
    call: Call,
) -> Response {
    let started = std::time::Instant::now();
    let verb = call.method.as_str().to_string();
    let response = match route(&server, &tenant, rest, &call).await {
        Ok(response) if crate::documents::is_document(rest) => {
            crate::documents::with_etag(response, call.header(header::IF_NONE_MATCH)).await
        }
        Ok(response) => response,
        Err(err) => err.into_response(),
    };
    tenant
        .metrics
        .observe(&verb, response.status().as_u16(), started.elapsed());
    response
}

async fn route(
    server: &ApiServer,
    state: &TenantState,
    rest: &[&str],
    call: &Call,
) -> Result<Response, ApiError> {
    let accept = call.header(header::ACCEPT);
    // Everything but a resource path is a read-only document.
    let resource_path = matches!(rest, ["api", "v1", _, ..] | ["apis", _, _, _, ..]);
    if !resource_path && call.method != Method::GET {
        return Err(ApiError::method_not_allowed());
    }
    match rest {
        ["version"] => Ok(plain_json(&discovery::version())),
        // This cluster's own request metrics (authorized as `get` on the `/metrics`
        // non-resource URL); the whole service's are the operator's, on the management API.
        ["metrics"] => {
            let objects = state
                .object_count
                .current(server.store().storage().as_ref(), &state.tenant.key_prefix)
                .await?;
            let bytes = state
                .tenant
                .stored_bytes
                .current(server.store().storage(), &state.tenant.key_prefix)
                .await?;
            Ok((
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                format!(
                    "{}# HELP flotilla_cluster_objects Objects the cluster stores, of every kind (counted at most every 5 s).\n# TYPE flotilla_cluster_objects gauge\nflotilla_cluster_objects {objects}\n# HELP flotilla_cluster_stored_bytes Bytes the cluster's objects take in the store (summed at most every 60 s, moved by each write here).\n# TYPE flotilla_cluster_stored_bytes gauge\nflotilla_cluster_stored_bytes {bytes}\n",
                    state.metrics.render()
                ),
            )
                .into_response())
        }
        [endpoint @ ("healthz" | "livez" | "readyz")] => {
            Ok(crate::health::answer(server, endpoint, None, &call.query).await)
        }
        [endpoint @ ("healthz" | "livez" | "readyz"), check] => {
            Ok(crate::health::answer(server, endpoint, Some(check), &call.query).await)
        }
        [".well-known", "openid-configuration"] => Ok(plain_json(
            &crate::authn::openid_configuration(&state.issuer()),
        )),
        ["openid", "v1", "jwks"] => {
            let key = state.signing_key().ok_or_else(ApiError::no_such_path)?;
            let mut response = plain_json(&key.jwks());
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/jwk-set+json"),
            );
            Ok(response)
        }
        ["api"] => crate::documents::discovery_root(server, state, accept, true).await,
        ["apis"] => crate::documents::discovery_root(server, state, accept, false).await,
        ["api", "v1"] => discovery::api_resource_list(&server.resources, "", "v1")
            .map(|v| plain_json(&v))
            .ok_or_else(ApiError::no_such_path),
        ["apis", group] => {
            let table = state
                .kinds
                .table_for_group(server, &state.tenant, group)
                .await?;
            if let Some(found) = discovery::api_group(&table, group) {
                return Ok(plain_json(&found));
            }
            let mut remote = crate::aggregator::remote_groups(server, state, &table).await?;
            remote.retain(|(g, _)| g == group);
            match remote.first() {
                Some((group, versions)) => {
                    let mut entry = crate::aggregator::remote_group_entry(group, versions);
                    entry["kind"] = json!("APIGroup");
                    entry["apiVersion"] = json!("v1");
                    Ok(plain_json(&entry))
                }
                None => Err(ApiError::no_such_path()),
            }
        }
        ["apis", group, version, ..] => {
            let table = state
                .kinds
                .table_for_group(server, &state.tenant, group)
                .await?;
            // A group version a remote APIService serves: everything under it is its server's.
            if let Some(api) = state
                .remote_apis
                .serving(server, state, &table, group, version)
                .await?
            {
                return crate::aggregator::proxy::proxy(server, state, &api, rest, call).await;
            }
            match rest {
                ["apis", group, version] => discovery::api_resource_list(&table, group, version)
                    .map(|v| plain_json(&v))
                    .ok_or_else(ApiError::no_such_path),
                ["apis", group, version, tail @ ..] => {
                    resource_request(server, state, group, version, tail, call).await
                }
                _ => Err(ApiError::no_such_path()),
            }
        }
        ["openapi", version, path @ ..] => {
            crate::documents::openapi(server, state, version, path, rest, call, accept).await
        }
        ["api", "v1", rest @ ..] => resource_request(server, state, "", "v1", rest, call).await,
        _ => Err(ApiError::no_such_path()),
    }
}

/// A request-only kind: `POST` of the collection, answered without storing anything.
async fn create_only_request(
    server: &ApiServer,
    state: &TenantState,
    resource: &ResourceInfo,
    target: &Target<'_>,
    call: &Call,
) -> Result<Response, ApiError> {
    if call.method != Method::POST || target.name.is_some() {
        let verb = if call.method == Method::GET {
            "get"
        } else {
            "update"
        };
        return Err(ApiError::method_not_supported(
            &resource.group_resource(),
            verb,
        ));
    }
    let body = call.body_json()?;
    check_body_kind(&body, &resource.api_version(), &resource.kind)?;
    let answer = match &*resource.kind {
        "SelfSubjectReview" => crate::reviews::self_subject_review(&call.user),
        "TokenReview" => crate::reviews::token_review(server, state, body).await?,
        "SelfSubjectAccessReview" | "SubjectAccessReview" | "LocalSubjectAccessReview" => {
            crate::reviews::access_review(
                server,
                state,
                &resource.kind,
                &call.user,
                target.namespace,
                body,
            )
            .await?
        }
        "SelfSubjectRulesReview" => {
            crate::reviews::rules_review(server, state, &call.user, body).await?
        }
        _ => return Err(ApiError::no_such_path()),
    };
    plain_with(StatusCode::CREATED, &answer)
}

/// A request body's `apiVersion`/`kind`, when given, must be the endpoint's.
fn check_body_kind(body: &Value, api_version: &str, kind: &str) -> Result<(), ApiError> {
    let given_kind = body["kind"].as_str().unwrap_or(kind);
    let given_version = body["apiVersion"].as_str().unwrap_or(api_version);
    if given_kind != kind || given_version != api_version {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({given_version}) does not match the expected API version ({api_version})"
        )));
    }
    Ok(())
}

/// A resource path after `/api/v1` or `/apis/{g}/{v}`.
struct Target<'a> {
    namespace: Option<&'a str>,
    plural: &'a str,
    name: Option<&'a str>,
    subresource: Option<&'a str>,
    watch_path: bool,
}

fn parse_target<'a>(mut rest: &[&'a str]) -> Option<Target<'a>> {
    let mut watch_path = false;
    if let ["watch", tail @ ..] = rest {
        watch_path = true;
        rest = tail;
    }
    let mut namespace = None;
    if let ["namespaces", ns, tail @ ..] = rest
        && !tail.is_empty()
        && !(tail.len() == 1 && matches!(tail[0], "status" | "finalize"))
    {
        namespace = Some(*ns);
        rest = tail;
    }
    match rest {
        [plural] => Some(Target {
            namespace,
            plural,
            name: None,
            subresource: None,
            watch_path,
        }),
        [plural, name] => Some(Target {
            namespace,
            plural,
            name: Some(name),
            subresource: None,
            watch_path,
        }),
        [plural, name, sub] => Some(Target {
            namespace,
            plural,
            name: Some(name),
            subresource: Some(sub),
            watch_path,
        }),
        _ => None,
    }
}

async fn resource_request(
    server: &ApiServer,
    state: &TenantState,
    group: &str,
    version: &str,
    rest: &[&str],
    call: &Call,
) -> Result<Response, ApiError> {
    let answer = serve_resource(server, state, group, version, rest, call).await;
    // What admission plugins read of this kind is read again after any write to it.
    if call.method != Method::GET
        && let Some(target) = parse_target(rest)
    {
        server
            .admission
            .lookups()
            .forget(&state.tenant.id, target.plural);
        // A definition written: its names, conditions and the tenant's table follow before
        // the answer, so the kinds it adds are served when the client hears back.
        if group == crate::apiextensions::GROUP
            && target.plural == "customresourcedefinitions"
            && let Err(err) = crate::apiextensions::reconcile(server, state).await
        {
            tracing::warn!(tenant = %state.tenant.id, error = %err, "reconciling custom resource definitions");
        }
        // An APIService written is probed before the answer, so that the writer's next read
        // (and discovery) has its availability.
        if group == "apiregistration.k8s.io" && target.plural == "apiservices" {
            // One for a replaceable built-in group moves the group in or out of the table.
            if let Err(err) = state.kinds.reload(server, &state.tenant).await {
                tracing::warn!(tenant = %state.tenant.id, error = %err, "reloading the resource table");
            }
            match (answer.is_ok(), target.name) {
                (true, Some(name)) => state.remote_apis.refresh(server, state, name).await,
                _ => state.remote_apis.forget(),
            }
        }
    }
    answer
}

async fn serve_resource(
    server: &ApiServer,
    state: &TenantState,
    group: &str,
    version: &str,
    rest: &[&str],
    call: &Call,
) -> Result<Response, ApiError> {
    let tenant = &state.tenant;
    let target = parse_target(rest).ok_or_else(ApiError::no_such_path)?;
    let resource = state
        .kinds
        .find(server, tenant, group, version, target.plural)
        .await?
        .ok_or_else(ApiError::no_such_path)?;
    let answer = serve_kind(server, state, &resource, &target, call).await;
    // A deprecated custom resource version says so on every answer, as upstream's does.
    match (&resource.deprecation_warning, answer) {
        (Some(warning), Ok(mut response)) => {
            if let Ok(value) = HeaderValue::from_str(&format!("299 - {warning:?}")) {
                response.headers_mut().append(header::WARNING, value);
            }
            Ok(response)
        }
        (_, answer) => answer,
    }
}

async fn serve_kind(
    server: &ApiServer,
    state: &TenantState,
    resource: &Arc<ResourceInfo>,
    target: &Target<'_>,
    call: &Call,
) -> Result<Response, ApiError> {
    let tenant = &state.tenant;
    if resource.create_only {
        return create_only_request(server, state, resource, target, call).await;
    }
    if resource.computed {
        if call.method != Method::GET || target.subresource.is_some() || target.watch_path {
            return Err(ApiError::method_not_supported(
                &resource.group_resource(),
                call.method.as_str(),
            ));
        }
        let (answer, warnings) = if resource.group == "metrics.k8s.io" {
            let answer = crate::metrics_server::answer(
                server,
                state,
                resource,
                target.namespace,
                target.name,
                &call.query,
            )
            .await?;
            (answer, Vec::new())
        } else {
            let answer = crate::componentstatus::answer(
                &server.store,
                &state.components,
                server.tenants.loops_parked(&state.tenant.id),
                resource,
                target.name,
            )
            .await?;
            (
                answer,
                vec![crate::componentstatus::DEPRECATION_WARNING.to_string()],
            )
        };
        let (content_type, body) = negotiate::render(
            Some(resource),
            answer,
            call.representation()?,
            call.include_object()?,
        );
        return Ok(json_response(
            StatusCode::OK,
            content_type,
            &body,
            &warnings,
        ));
    }
    // APIServices read: this cluster's own group versions computed, the stored ones with
    // their availability (upstream's controllers write both into storage).
    if resource.kind == "APIService"
        && call.method == Method::GET
        && target.subresource.is_none()
        && !target.watch_path
        && !call.flag("watch")
    {
        let table = state.kinds.table(server, tenant).await?;
        let answer =
            crate::aggregator::answer(server, state, &table, resource, target.name).await?;
        let (content_type, body) = negotiate::render(
            Some(resource),
            answer,
            call.representation()?,
            call.include_object()?,
        );
        return Ok(json_response(StatusCode::OK, content_type, &body, &[]));
    }
    if resource.kind == "APIService"
        && (call.method == Method::PUT || call.method == Method::PATCH)
        && let Some(name) = target.name
    {
        let table = state.kinds.table(server, tenant).await?;
        crate::aggregator::store_replaceable_local(server, state, &table, resource, name).await?;
    }
    if resource.namespaced != target.namespace.is_some() && target.name.is_some() {
        return Err(ApiError::no_such_path());
    }
    if !resource.namespaced && target.namespace.is_some() {
        return Err(ApiError::no_such_path());
    }
    let namespace = target.namespace.unwrap_or("");
    let representation = call.representation()?;
    let include = call.include_object()?;
    let respond = |code: StatusCode, value: Value, warnings: &[String]| {
        let (content_type, body) =
            negotiate::render(Some(resource), value, representation, include);
        Ok(json_response(code, content_type, &body, warnings))
    };
    let store = &server.store;
    match (&call.method, target.name, target.subresource) {
        (&Method::GET, None, None) => {
            if call.flag("watch") || target.watch_path {
                let slot = match call.hosted_loop {
                    true => None,
                    false => Some(state.watches.open(server.limits.max_watches)?),
                };
                return watch_request(
                    server,
                    tenant,
                    slot,
                    resource,
                    target.namespace,
                    call,
                    representation,
                    include,
                )
                .await;
            }
            let options = list_options(call, resource)?;
            let page = store
                .list(tenant, resource, target.namespace, &options)
                .await?;
            let mut metadata = json!({"resourceVersion": page.revision.to_string()});
            if let Some(token) = &page.continue_token {
                metadata["continue"] = json!(token);
            }
            if let Some(remaining) = page.remaining_item_count {
                metadata["remainingItemCount"] = json!(remaining);
            }
            let list = json!({"kind": resource.list_kind, "apiVersion": resource.api_version(), "metadata": metadata, "items": page.items});
            respond(StatusCode::OK, list, &[])
        }
        (
            &Method::GET,
            Some(name),
            None | Some("status") | Some("approval") | Some("ephemeralcontainers") | Some("resize"),
        ) => {
            check_subresource(resource, target.subresource)?;
            let read_at = ReadAt::parse(call.param("resourceVersion"), None)?;
            let obj = store
                .get(tenant, resource, namespace, name, read_at)
                .await?;
            respond(StatusCode::OK, obj, &[])
        }
        (&Method::GET, Some(name), Some("scale")) => {
            let scale_spec = resource.scale.as_ref().ok_or_else(ApiError::no_such_path)?;
            let obj = store
                .get(tenant, resource, namespace, name, ReadAt::Latest)
                .await?;
            plain(crate::scale::scale_of(&obj, scale_spec))
        }
        (&Method::POST, None, None) => {
            let body = call.body_json()?;
            if resource.terminating {
                return Err(ApiError::forbidden(
                    &resource.group_resource(),
                    meta::name(&body),
                    "create not allowed while custom resource definition is terminating",
                ));
            }
            let options = call.write_options()?;
            if !options.dry_run {
                state
                    .object_count
                    .admit_create(
                        store.storage().as_ref(),
                        &tenant.key_prefix,
                        &server.limits,
                        &resource.group_resource(),
                        meta::name(&body),
                    )
                    .await?;
            }
            let written =
                admitted_create(server, state, resource, namespace, body, &options).await?;
            respond(StatusCode::CREATED, written.object, &written.warnings)
        }
        (&Method::POST, Some(name), Some("token")) if resource.kind == "ServiceAccount" => {
            let request = call.body_json()?;
            check_body_kind(&request, "authentication.k8s.io/v1", "TokenRequest")?;
            let attributes =
                create_attributes(resource, "token", namespace, name, &call.user, false);
            let (request, warnings) = admit_request(server, state, attributes, request).await?;
            let answer =
                crate::reviews::token_request(server, state, namespace, name, request).await?;
            Ok(json_response(
                StatusCode::CREATED,
                "application/json",
                &answer,
                &warnings,
            ))
        }
        (&Method::GET, Some(name), Some("log"))
            if resource.kind == "Pod" && resource.group.is_empty() =>
        {
            crate::kubelet::pod_log(server, state, namespace, name, call).await
        }
        (&Method::POST, Some(name), Some("binding")) if resource.kind == "Pod" => {
            bind_pod(server, tenant, resource, namespace, name, call).await
        }
        (&Method::POST, Some(name), Some("eviction")) if resource.kind == "Pod" => {
            let dry_run = call.write_options()?.dry_run;
            let attributes =
                create_attributes(resource, "eviction", namespace, name, &call.user, dry_run);
            let (eviction, warnings) =
                admit_request(server, state, attributes, call.body_json()?).await?;
            crate::eviction::evict(
                server, tenant, resource, namespace, name, &eviction, dry_run,
            )
            .await?;
            Ok(json_response(
                StatusCode::CREATED,
                "application/json",
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
                &warnings,
            ))
        }
        (&Method::POST, _, _) => Err(ApiError::method_not_supported(
            &resource.group_resource(),
            "create",
        )),
        (
            &Method::PUT,
            Some(name),
            sub @ (None
            | Some("status")
            | Some("finalize")
            | Some("approval")
            | Some("ephemeralcontainers")
            | Some("resize")),
        ) => {
            check_subresource(resource, sub)?;
            let body = call.body_json()?;
            let options = call.write_options()?;
            let target_part = match sub {
                Some("status") => UpdateTarget::Status,
                Some("approval") => UpdateTarget::Approval,
                Some("ephemeralcontainers") => UpdateTarget::EphemeralContainers,
                Some("resize") => UpdateTarget::Resize,
                _ => UpdateTarget::Main,
            };
            let mut warnings = Vec::new();
            let finalize = sub == Some("finalize");
            let authorizer = TenantAuthorizer { server, state };
            let context = admission_context(server, state, &authorizer);
            let validator = admission::UpdateValidator::new(
                &server.admission,
                &context,
                update_attributes(resource, sub, namespace, name, &options),
            );
            let updated = store
                .guaranteed_update_validated(
                    tenant,
                    resource,
                    namespace,
                    name,
                    options.dry_run,
                    |current| {
                        let body = if finalize {
                            // namespaces/finalize changes only spec.finalizers.
                            let mut next = current.clone();
                            let finalizers = meta::at(&body, &["spec", "finalizers"])
                                .cloned()
                                .unwrap_or(json!([]));
                            meta::set_at(&mut next, &["spec", "finalizers"], finalizers);
                            meta::set_at(
                                &mut next,
                                &["metadata", "resourceVersion"],
                                json!(meta::resource_version(&body)),
                            );
                            next
                        } else {
                            body.clone()
                        };
                        let mut local = Vec::new();
                        let next = store.prepare_update(
                            resource,
                            current,
                            body,
                            target_part,
                            &options,
                            &mut local,
                        )?;
                        warnings = local;
                        Ok(Some(next))
                    },
                    Some(&validator),
                )
                .await?;
            warnings.extend(validator.into_warnings());
            respond(StatusCode::OK, updated, &warnings)
        }
        (&Method::PUT, Some(name), Some("scale")) => {
            let scale_spec = resource.scale.as_ref().ok_or_else(ApiError::no_such_path)?;
            let body = call.body_json()?;
            update_scale_request(
                server,
                tenant,
                resource,
                scale_spec,
                namespace,
                name,
                call,
                |_| Ok(body.clone()),
            )
            .await
        }
        (
            &Method::PATCH,
            Some(name),
            sub @ (None
            | Some("status")
            | Some("approval")
            | Some("ephemeralcontainers")
            | Some("resize")),
        ) => {
            check_subresource(resource, sub)?;
            let target_part = match sub {
                Some("status") => UpdateTarget::Status,
                Some("approval") => UpdateTarget::Approval,
                Some("ephemeralcontainers") => UpdateTarget::EphemeralContainers,
                Some("resize") => UpdateTarget::Resize,
                _ => UpdateTarget::Main,
            };
            patch_request(
                server,
                state,
                resource,
                namespace,
                name,
                target_part,
                call,
                representation,
                include,
            )
            .await
        }
        (&Method::PATCH, Some(name), Some("scale")) => {
            let scale_spec = resource.scale.as_ref().ok_or_else(ApiError::no_such_path)?;
            let patch = crate::patching::PatchRequest::parse(call)?;
            update_scale_request(
                server,
                tenant,
                resource,
                scale_spec,
                namespace,
                name,
                call,
                |scale| {
                    patch.apply_to(
                        scale,
                        flotilla_api_machinery::schema::PatchMeta::for_kind("Scale"),
                    )
                },
            )
            .await
        }
        (&Method::DELETE, Some(name), None) => {
            let (options, dry_run) = delete_options(call)?;
            let authorizer = TenantAuthorizer { server, state };
            let context = admission_context(server, state, &authorizer);
            let admission =
                delete_admission(server, &context, resource, namespace, name, call, dry_run);
            match store
                .delete(
                    tenant,
                    resource,
                    namespace,
                    name,
                    &options,
                    dry_run,
                    &server.allocator,
                    Some(&admission),
                )
                .await?
            {
                Deleted::Gone(obj) if returns_deleted_object(resource) => {
                    respond(StatusCode::OK, obj, &[])
                }
                Deleted::Gone(obj) => plain(success_status(resource, &obj)),
                // Upstream answers 202 only for a pending delete that orphans nothing explicitly;
                // kubectl and client libraries treat 200 and 202 alike, so 200 as upstream mostly does.
                Deleted::Pending(obj) => respond(StatusCode::OK, obj, &[]),
            }
        }
        (&Method::DELETE, None, None) => {
            if resource.kind == "Namespace" {
                return Err(ApiError::method_not_supported(
                    &resource.group_resource(),
                    "deletecollection",
                ));
            }
            let (options, dry_run) = delete_options(call)?;
            let list_options = list_options(call, resource)?;
            let page = store
                .list(
                    tenant,
                    resource,
                    target.namespace,
                    &ListOptions {
                        limit: 0,
                        continue_token: None,
                        ..list_options
                    },
                )
                .await?;
            let mut items = Vec::new();
            let authorizer = TenantAuthorizer { server, state };
            let context = admission_context(server, state, &authorizer);
            for obj in page.items {
                let admission = delete_admission(
                    server,
                    &context,
                    resource,
                    meta::namespace(&obj),
                    meta::name(&obj),
                    call,
                    dry_run,
                );
                match store
                    .delete(
                        tenant,
                        resource,
                        meta::namespace(&obj),
                        meta::name(&obj),
                        &options,
                        dry_run,
                        &server.allocator,
                        Some(&admission),
                    )
                    .await
                {
                    Ok(Deleted::Gone(o)) | Ok(Deleted::Pending(o)) => items.push(o),
                    Err(err) if err.code == 404 => {}
                    Err(err) => return Err(err),
                }
            }
            let list = json!({"kind": resource.list_kind, "apiVersion": resource.api_version(), "metadata": {}, "items": items});
            respond(StatusCode::OK, list, &[])
        }
        _ => Err(ApiError::method_not_supported(
            &resource.group_resource(),
            call.method.as_str(),
        )),
    }
}

/// The validating half of the chain for a delete of an object of `resource` in `namespace`.
fn delete_admission<'a>(
    server: &'a ApiServer,
    context: &'a admission::Context<'a>,
    resource: &'a ResourceInfo,
    namespace: &'a str,
    name: &'a str,
    call: &'a Call,
    dry_run: bool,
) -> admission::UpdateValidator<'a> {
    admission::UpdateValidator::new(
        &server.admission,
        context,
        admission::Attributes {
            operation: admission::Operation::Delete,
            resource,
            subresource: "",
            namespace,
            name,
            user: Some(&call.user),
            dry_run,
            old: None,
        },
    )
}

/// A request the registry does not store — a connection to a pod (`exec`, `attach`,
/// `portforward`: its options are the object, the pod `old`), an eviction, a TokenRequest —
/// through the whole admission chain as upstream's handlers run it: mutating then
/// validating; a refusal ends the request first. Returns the object as admitted.
pub(crate) async fn admit_request(
    server: &ApiServer,
    state: &TenantState,
    attributes: admission::Attributes<'_>,
    mut object: Value,
) -> Result<(Value, Vec<String>), ApiError> {
    let authorizer = TenantAuthorizer { server, state };
    let context = admission_context(server, state, &authorizer);
    let mut warnings = Vec::new();
    server
        .admission
        .admit(&context, &attributes, &mut object, &mut warnings)
        .await?;
    server
        .admission
        .validate(&context, &attributes, &object, &mut warnings)
        .await?;
    Ok((object, warnings))
}

/// The admission attributes of a create of `resource` (of its `subresource` of `name`).
fn create_attributes<'a>(
    resource: &'a ResourceInfo,
    subresource: &'a str,
    namespace: &'a str,
    name: &'a str,
    user: &'a crate::authn::UserInfo,
    dry_run: bool,
) -> admission::Attributes<'a> {
    admission::Attributes {
        operation: admission::Operation::Create,
        resource,
        subresource,
        namespace,
        name,
        user: Some(user),
        dry_run,
        old: None,
    }
}

/// What admission plugins may read for a request of `tenant`.
fn admission_context<'a>(
    server: &'a ApiServer,
    state: &'a TenantState,
    authorizer: &'a TenantAuthorizer<'a>,
) -> admission::Context<'a> {
    admission::Context {
        store: &server.store,
        resources: state
            .kinds
            .loaded()
            .unwrap_or_else(|| server.resources.clone()),
        tenant: &state.tenant,
        lookups: server.admission.lookups(),
        pod_security: &state.record.pod_security,
        authorizer,
        networks: &server.kubelet_networks,
    }
}

/// The tenant's authorizer, for admission plugins.
struct TenantAuthorizer<'a> {
    server: &'a ApiServer,
    state: &'a TenantState,
}

#[async_trait::async_trait]
impl admission::Authorizer for TenantAuthorizer<'_> {
    async fn allowed(
        &self,
        attributes: &flotilla_api_machinery::rbac::Attributes,
    ) -> Result<bool, ApiError> {
        Ok(crate::authz::allowed(self.server, self.state, attributes)
            .await?
            .0)
    }

    async fn snapshot(
        &self,
    ) -> Result<Option<Arc<dyn flotilla_cel::admission::RequestAuthorizer>>, ApiError> {
        Ok(Some(crate::authz::snapshot(self.server, self.state).await?))
    }
}

/// The admission attributes of an update of `resource`'s `subresource`.
fn update_attributes<'a>(
    resource: &'a ResourceInfo,
    subresource: Option<&'a str>,
    namespace: &'a str,
    name: &'a str,
    options: &'a WriteOptions,
) -> admission::Attributes<'a> {
    admission::Attributes {
        operation: admission::Operation::Update,
        resource,
        subresource: subresource.unwrap_or(""),
        namespace,
        name,
        user: options.user.as_ref(),
        dry_run: options.dry_run,
        old: None,
    }
}

/// A create through the admission chain and the store.
async fn admitted_create(
    server: &ApiServer,
    state: &TenantState,
    resource: &ResourceInfo,
    namespace: &str,
    body: Value,
    options: &WriteOptions,
) -> Result<crate::store::Written, ApiError> {
    let authorizer = TenantAuthorizer { server, state };
    let context = admission_context(server, state, &authorizer);
    let attributes = admission::Attributes {
        operation: admission::Operation::Create,
        resource,
        subresource: "",
        namespace,
        name: "",
        user: options.user.as_ref(),
        dry_run: options.dry_run,
        old: None,
    };
    admission::create(
        &server.admission,
        &context,
        &attributes,
        server.namespaces(),
        body,
        options,
        &server.allocator,
    )
    .await
}

fn plain(value: Value) -> Result<Response, ApiError> {
    plain_with(StatusCode::OK, &value)
}

fn plain_with(code: StatusCode, value: &Value) -> Result<Response, ApiError> {
    Ok(json_response(code, "application/json", value, &[]))
}

fn check_subresource(resource: &ResourceInfo, sub: Option<&str>) -> Result<(), ApiError> {
    match sub {
        None => Ok(()),
        Some("status") if resource.status_subresource => Ok(()),
        Some("approval") if resource.kind == "CertificateSigningRequest" => Ok(()),
        Some("finalize") if resource.kind == "Namespace" => Ok(()),
        Some("ephemeralcontainers" | "resize")
            if resource.kind == "Pod" && resource.group.is_empty() =>
        {
            Ok(())
        }
        Some(_) => Err(ApiError::no_such_path()),
    }
}

fn list_options(call: &Call, resource: &ResourceInfo) -> Result<ListOptions, ApiError> {
    let read_at = ReadAt::parse(
        call.param("resourceVersion"),
        call.param("resourceVersionMatch"),
    )?;
    let selection = Selection::parse(
        call.param("labelSelector"),
        call.param("fieldSelector"),
        resource,
    )?;
    let limit = match call.param("limit") {
        None | Some("") => 0,
        Some(l) => l
            .parse::<i64>()
            .map_err(|_| ApiError::bad_request(format!("invalid limit: {l:?}")))?
            .max(0) as usize,
    };
    let continue_token = call
        .param("continue")
        .filter(|c| !c.is_empty())
        .map(str::to_string);
    // A list with a resourceVersion and a limit but no match is an Exact read (API concepts:
    // "once a limit is set, Exact semantics apply").
    let read_at = match (read_at, call.param("resourceVersionMatch"), &continue_token) {
        (ReadAt::NotOlderThan(revision), None | Some(""), None) if revision > 0 && limit > 0 => {
            ReadAt::Exact(revision)
        }
        (read_at, _, _) => read_at,
    };
    Ok(ListOptions {
        read_at,
        selection,
        limit,
        continue_token,
    })
}

fn delete_options(call: &Call) -> Result<(DeleteOptions, bool), ApiError> {
    let mut options = DeleteOptions::default();
    let mut dry_run = call.param("dryRun") == Some("All");
    let mut propagation = call.param("propagationPolicy").map(str::to_string);
    if let Some(grace) = call.param("gracePeriodSeconds").filter(|g| !g.is_empty()) {
        let grace = grace
            .parse::<i64>()
            .map_err(|_| ApiError::bad_request(format!("invalid gracePeriodSeconds: {grace:?}")))?;
        options.grace_period_seconds = Some(grace);
    }
    if call.flag("orphanDependents") {
        propagation.get_or_insert_with(|| "Orphan".into());
    }
    if !call.body.iter().all(u8::is_ascii_whitespace) {
        let body = negotiate::parse_body(&call.body, BodyFormat::Json)?;
        apply_delete_body(&body, &mut options, &mut propagation, &mut dry_run);
    }
    set_propagation(&mut options, propagation.as_deref())?;
    Ok((options, dry_run))
}

/// The DeleteOptions given as an object (a DELETE's body, an Eviction's `deleteOptions`)
/// over what the query already said: `propagation` is resolved by [`set_propagation`].
pub(crate) fn apply_delete_body(
    body: &Value,
    options: &mut DeleteOptions,
    propagation: &mut Option<String>,
    dry_run: &mut bool,
) {
    if let Some(p) = body.get("propagationPolicy").and_then(Value::as_str) {
        *propagation = Some(p.to_string());
    }
    if body.get("orphanDependents") == Some(&json!(true)) {
        propagation.get_or_insert_with(|| "Orphan".into());
    }
    if let Some(grace) = body.get("gracePeriodSeconds").and_then(Value::as_i64) {
        options.grace_period_seconds = Some(grace);
    }
    options.uid = meta::str_at(body, &["preconditions", "uid"]).map(str::to_string);
    options.resource_version =
        meta::str_at(body, &["preconditions", "resourceVersion"]).map(str::to_string);
    if let Some(runs) = body.get("dryRun").and_then(Value::as_array) {
        *dry_run |= runs.iter().any(|r| r == "All");
    }
}

/// `propagationPolicy` checked against upstream's values.
pub(crate) fn set_propagation(
    options: &mut DeleteOptions,
    propagation: Option<&str>,
) -> Result<(), ApiError> {
    options.propagation = match propagation {
        None | Some("") | Some("Background") => Propagation::Background,
        Some("Foreground") => Propagation::Foreground,
        Some("Orphan") => Propagation::Orphan,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "propagationPolicy: Unsupported value: {other:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
            )));
        }
    };
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn watch_request(
    server: &ApiServer,
    tenant: &Tenant,
    slot: Option<crate::limits::LongRunningSlot>,
    resource: &Arc<ResourceInfo>,
    namespace: Option<&str>,
    call: &Call,
    representation: Representation,
    include: IncludeObject,
) -> Result<Response, ApiError> {
    let selection = Selection::parse(
        call.param("labelSelector"),
        call.param("fieldSelector"),
        resource,
    )?;
    let from = match ReadAt::parse(call.param("resourceVersion"), None)? {
        ReadAt::Latest | ReadAt::NotOlderThan(0) => None,
        ReadAt::NotOlderThan(revision) | ReadAt::Exact(revision) => Some(revision),
    };
    let timeout = match call.param("timeoutSeconds") {
        Some(s) if !s.is_empty() => {
            let seconds = s
                .parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds: {s:?}")))?;
            // 0 means "the server's default", not "close at once".
            if seconds == 0 {
                DEFAULT_WATCH_TIMEOUT
            } else {
                Duration::from_secs(seconds)
            }
        }
        _ => DEFAULT_WATCH_TIMEOUT,
    };
    // `sendInitialEvents` (true or false) requires NotOlderThan; without it, a match is
    // forbidden on a watch (upstream's ValidateListOptions).
    let send_initial_events = call
        .param("sendInitialEvents")
        .map(|v| flotilla_api_machinery::query::query_bool(Some(v)));
    let matching = call.param("resourceVersionMatch").filter(|m| !m.is_empty());
    let invalid = |detail: &str| {
        ApiError::invalid(
            "meta.k8s.io",
            "ListOptions",
            "",
            vec![crate::error::FieldError::forbidden(
                &Path::new("resourceVersionMatch"),
                detail,
            )],
        )
    };
    match (send_initial_events, matching) {
        (Some(_), Some("NotOlderThan")) | (None, None) => {}
        (Some(_), _) => {
            return Err(invalid(
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        (None, Some(_)) => {
            return Err(invalid(
                "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            ));
        }
    }
    let options = WatchOptions {
        from,
        selection,
        allow_bookmarks: call.flag("allowWatchBookmarks"),
        send_initial_events,
        timeout,
        slot,
    };
    let body = watch::start(
        &server.store,
        &server.watch_snapshots,
        tenant,
        resource.clone(),
        namespace,
        options,
        representation,
        include,
    )
    .await?;
    let mut response = Response::new(Body::from_stream(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

#[allow(clippy::too_many_arguments)]
async fn patch_request(
    server: &ApiServer,
    state: &TenantState,
    resource: &ResourceInfo,
    namespace: &str,
    name: &str,
    target: UpdateTarget,
    call: &Call,
    representation: Representation,
    include: IncludeObject,
) -> Result<Response, ApiError> {
    let patch = crate::patching::PatchRequest::parse(call)?;
    let options = WriteOptions {
        apply: patch.is_apply(),
        ..call.write_options()?
    };
    let store = &server.store;
    let mut warnings = Vec::new();
    let tenant = &state.tenant;
    let authorizer = TenantAuthorizer { server, state };
    let context = admission_context(server, state, &authorizer);
    let subresource = target.subresource();
    let validator = admission::UpdateValidator::new(
        &server.admission,
        &context,
        update_attributes(resource, subresource, namespace, name, &options),
    );
    let result = store
        .guaranteed_update_validated(
            tenant,
            resource,
            namespace,
            name,
            options.dry_run,
            |current| {
                let patched = if patch.is_apply() {
                    crate::patching::server_side_apply(
                        current,
                        &patch,
                        &options.field_manager,
                        resource,
                        target,
                    )?
                } else {
                    patch.apply_to(current, resource.patch_meta())?
                };
                let mut local = Vec::new();
                let next = store
                    .prepare_update(resource, current, patched, target, &options, &mut local)?;
                warnings = local;
                Ok(Some(next))
            },
            Some(&validator),
        )
        .await;
    warnings.extend(validator.into_warnings());
    let updated = match result {
        Ok(obj) => obj,
        // Server-side apply creates what does not exist.
        Err(err) if err.code == 404 && patch.is_apply() && target == UpdateTarget::Main => {
            let obj = crate::patching::apply_create(
                &patch,
                name,
                namespace,
                &options.field_manager,
                resource,
            )?;
            let written =
                admitted_create(server, state, resource, namespace, obj, &options).await?;
            let (content_type, body) =
                negotiate::render(Some(resource), written.object, representation, include);
            return Ok(json_response(
                StatusCode::CREATED,
                content_type,
                &body,
                &written.warnings,
            ));
        }
        Err(err) => return Err(err),
    };
    let (content_type, body) = negotiate::render(Some(resource), updated, representation, include);
    Ok(json_response(
        StatusCode::OK,
        content_type,
        &body,
        &warnings,
    ))
}

/// A PUT or PATCH of `/scale`, answered with the Scale written.
#[allow(clippy::too_many_arguments)]
async fn update_scale_request<F>(
    server: &ApiServer,
    tenant: &Tenant,
    resource: &ResourceInfo,
    spec: &ScaleSubresource,
    namespace: &str,
    name: &str,
    call: &Call,
    next_scale: F,
) -> Result<Response, ApiError>
where
    F: Fn(&Value) -> Result<Value, ApiError>,
{
    let options = call.write_options()?;
    plain(
        crate::scale::update(
            &server.store,
            tenant,
            resource,
            spec,
            namespace,
            name,
            &options,
            next_scale,
        )
        .await?,
    )
}

async fn bind_pod(
    server: &ApiServer,
    tenant: &Tenant,
    resource: &ResourceInfo,
    namespace: &str,
    name: &str,
    call: &Call,
) -> Result<Response, ApiError> {
    let binding = call.body_json()?;
    let node = meta::str_at(&binding, &["target", "name"])
        .unwrap_or("")
        .to_string();
    if node.is_empty() {
        return Err(ApiError::invalid(
            "",
            "Binding",
            name,
            vec![crate::error::FieldError::required(
                &Path::new("target.name"),
                "",
            )],
        ));
    }
    let options = call.write_options()?;
    server
        .store
        .guaranteed_update(tenant, resource, namespace, name, options.dry_run, |current| {
            if meta::is_terminating(current) {
                return Err(ApiError::conflict(&resource.group_subresource("binding"), name, "pod is being deleted, cannot be assigned to a host"));
            }
            if let Some(existing) = meta::str_at(current, &["spec", "nodeName"]).filter(|n| !n.is_empty()) {
                return Err(ApiError::conflict(
                    &resource.group_subresource("binding"),
                    name,
                    &format!("pod {name} is already assigned to node \"{existing}\""),
                ));
            }
            let mut next = current.clone();
            meta::set_at(&mut next, &["spec", "nodeName"], json!(node));
            let mut conditions = meta::at(current, &["status", "conditions"]).and_then(Value::as_array).cloned().unwrap_or_default();
            conditions.retain(|c| c.get("type") != Some(&json!("PodScheduled")));
            conditions.push(json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": meta::now_rfc3339()}));
            meta::set_at(&mut next, &["status", "conditions"], json!(conditions));
            meta::remove_at(&mut next, &["metadata", "resourceVersion"]);
            Ok(Some(next))
        })
        .await?;
    Ok(json_response(
        StatusCode::CREATED,
        "application/json",
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
        &[],
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_paths_are_told_apart_from_namespaced_resources() {
        let t = parse_target(&["namespaces", "default"]).expect("namespace");
        assert_eq!(
            (t.plural, t.name, t.namespace),
            ("namespaces", Some("default"), None)
        );
        let t = parse_target(&["namespaces", "default", "status"]).expect("namespace status");
        assert_eq!((t.plural, t.subresource), ("namespaces", Some("status")));
        let t = parse_target(&["namespaces", "default", "pods"]).expect("pods");
        assert_eq!(
            (t.plural, t.namespace, t.name),
            ("pods", Some("default"), None)
        );
        let t =
            parse_target(&["namespaces", "default", "pods", "p", "status"]).expect("pod status");
        assert_eq!((t.name, t.subresource), (Some("p"), Some("status")));
        assert!(parse_target(&["a", "b", "c", "d"]).is_none());
    }
}
