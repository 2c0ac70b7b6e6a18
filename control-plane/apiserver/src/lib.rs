//! The Kubernetes API server of Flotilla's tenant clusters.
//!
//! One [`ApiServer`] serves every tenant at `/clusters/{id}/…` over one [`Storage`]: a generic
//! registry ([`store`]) runs per-kind [`resources::Strategy`]s, [`handler`] maps HTTP to it,
//! and [`error::ApiError`] is the one way failures reach the wire. This is the only crate that
//! links axum.

pub mod admission;
pub mod aggregator;
pub mod allocator;
pub mod apiextensions;
pub mod audit;
pub mod authn;
pub mod authz;
pub mod certificates;
pub mod componentstatus;
pub mod conversion;
pub mod discovery;
pub mod documents;
pub mod endpoint_access;
pub mod error;
pub mod eviction;
pub mod handler;
pub mod health;
pub mod heavy;
pub mod interning;
pub mod kubelet;
pub mod limits;
pub mod local;
pub mod managed;
pub mod meta;
pub mod metrics;
pub mod metrics_server;
pub mod negotiate;
pub mod node;
pub mod openapi;
pub mod outbound;
pub mod patching;
pub mod pki;
pub mod proxy;
pub mod resources;
pub mod reviews;
pub mod scale;
pub mod selection;
pub mod serve;
pub mod storage;
pub mod store;
pub mod strategies;
pub mod table;
pub mod tenants;
pub mod watch;

use std::sync::{Arc, LazyLock};
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use flotilla_storage::Storage;
use http::Request;
use tracing::Instrument;

use crate::allocator::{ServiceAllocator, ServiceNetwork};
use crate::authn::UserInfo;
use crate::error::ApiError;
use crate::handler::{Call, MAX_BODY_BYTES};
use crate::limits::TenantLimits;
use crate::metrics::Metrics;
use crate::openapi::OpenApi;
use crate::resources::{ResourceInfo, Resources};
use crate::serve::{ClientAddress, PeerCertificates};
use crate::storage::envelope::{EnvelopeError, KeyEncryptionKey};
use crate::store::Store;
use crate::tenants::Tenants;

static RESOURCES: LazyLock<Arc<Resources>> = LazyLock::new(|| Arc::new(Resources::builtin()));

/// How an [`ApiServer`] presents itself and what it allows each tenant.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// `host:port` advertised in discovery (the `kubernetes` endpoints).
    pub advertise_address: String,
    /// `https://host:port` clients reach the service at: each cluster's URL, service-account
    /// issuer and OIDC discovery documents are below it.
    pub public_url: String,
    /// Per-tenant request limits.
    pub limits: TenantLimits,
    /// The CA of the serving certificate (PEM), published to every cluster as the
    /// `kube-root-ca.crt` ConfigMaps; empty for none.
    pub serving_ca_pem: String,
    /// Seals every stored record that holds a private key.
    pub key_encryption: Arc<KeyEncryptionKey>,
    /// Where kubelets may be dialled for `logs`, `exec`, `attach` and `portforward`, and pods,
    /// Service endpoints and nodes for `proxy`.
    pub kubelet_networks: kubelet::KubeletNetworks,
    /// The networks a cluster's private endpoint answers (`endpointAccess.private`).
    pub private_networks: Vec<flotilla_api_machinery::cidr::Cidr>,
    /// Where requests are recorded, and the operator's audit policy.
    pub audit: Arc<audit::Auditor>,
    /// The encryption configuration's KMS providers: the `kms-providers` health check asks
    /// their plugins.
    pub kms_providers: Vec<Arc<storage::encryption::kms::KmsProvider>>,
}

/// The whole API surface of the process: every tenant's Kubernetes API.
pub struct ApiServer {
    pub(crate) store: Store,
    pub(crate) resources: Arc<Resources>,
    /// The custom resource schemas every tenant's definitions use, shared by content.
    pub(crate) schemas: apiextensions::schemas::Interner,
    pub(crate) allocator: ServiceAllocator,
    /// The admission plugins every write runs through.
    pub(crate) admission: admission::Chain,
    pub(crate) openapi: OpenApi,
    pub(crate) advertise_address: String,
    /// The tenant clusters this server knows.
    pub tenants: Tenants,
    pub(crate) limits: TenantLimits,
    pub(crate) serving_ca_pem: String,
    pub(crate) kubelet_clients: kubelet::KubeletClients,
    pub(crate) kubelet_networks: kubelet::KubeletNetworks,
    private_networks: Vec<flotilla_api_machinery::cidr::Cidr>,
    /// The initial states watches are sending, shared between watches.
    pub(crate) watch_snapshots: watch::Snapshots,
    /// Where large bodies are parsed.
    heavy_work: heavy::HeavyWork,
    metrics: Metrics,
    key_encryption: Arc<KeyEncryptionKey>,
    audit: Arc<audit::Auditor>,
    /// Asked by the `kms-providers` health check.
    pub(crate) kms_providers: Vec<Arc<storage::encryption::kms::KmsProvider>>,
}

impl ApiServer {
    /// A server over `storage`, advertising `advertise_address` (`host:port`) in discovery,
    /// whose private keys are sealed under a key that dies with the process: for a store
    /// thrown away with the server (tests, benchmarks).
    pub fn new(
        storage: Arc<dyn Storage>,
        advertise_address: &str,
    ) -> Result<Arc<Self>, EnvelopeError> {
        Ok(Self::with_options(
            storage,
            ServerOptions {
                advertise_address: advertise_address.to_string(),
                public_url: format!("https://{advertise_address}"),
                limits: TenantLimits::UNLIMITED,
                serving_ca_pem: String::new(),
                key_encryption: Arc::new(KeyEncryptionKey::ephemeral()?),
                kubelet_networks: Default::default(),
                private_networks: Vec::new(),
                audit: Arc::new(audit::Auditor::disabled()),
                kms_providers: Vec::new(),
            },
        ))
    }

    /// A server over `storage` configured by `options`.
    pub fn with_options(storage: Arc<dyn Storage>, options: ServerOptions) -> Arc<Self> {
        let ServerOptions {
            advertise_address,
            public_url,
            limits,
            serving_ca_pem,
            key_encryption,
            kubelet_networks,
            private_networks,
            audit,
            kms_providers,
        } = options;
        let advertise_address = advertise_address.as_str();
        let store = Store::new(storage);
        Arc::new(ApiServer {
            tenants: Tenants::new(
                store.clone(),
                &public_url,
                key_encryption.clone(),
                limits.max_bytes,
            ),
            key_encryption,
            store,
            resources: RESOURCES.clone(),
            schemas: Default::default(),
            allocator: ServiceAllocator::new(ServiceNetwork::default()),
            admission: admission::Chain::upstream_default(),
            openapi: OpenApi::build(&RESOURCES),
            advertise_address: advertise_address.to_string(),
            limits,
            serving_ca_pem,
            kubelet_clients: kubelet::KubeletClients::default(),
            kubelet_networks,
            private_networks,
            watch_snapshots: Default::default(),
            heavy_work: Default::default(),
            metrics: Metrics::default(),
            audit,
            kms_providers,
        })
    }

    /// Where requests are recorded.
    pub fn audit(&self) -> &audit::Auditor {
        &self.audit
    }

    /// What each tenant is allowed (request rates, seats, objects).
    pub fn limits(&self) -> &TenantLimits {
        &self.limits
    }

    /// The admission plugins every write runs through.
    pub fn admission(&self) -> &admission::Chain {
        &self.admission
    }

    /// The built-in resources (every tenant's table starts with them).
    pub fn resources(&self) -> &Resources {
        &self.resources
    }

    /// The key every stored private key is sealed under (the service's own records use it
    /// too: the serving CA, the management API's cloud credentials).
    pub fn key_encryption(&self) -> &Arc<KeyEncryptionKey> {
        &self.key_encryption
    }

    /// The request metrics of the whole process, in Prometheus' text format: every tenant's
    /// counts, so whoever serves them must allow only the operator.
    pub fn render_metrics(&self) -> String {
        let mut out = self.metrics.render();
        out.push_str(&self.store.caches().render_metrics());
        out
    }

    /// Adds another component's process-wide metrics to [`ApiServer::render_metrics`].
    pub fn add_metrics_source(&self, render: fn() -> String) {
        self.metrics.add_source(render);
    }

    /// How many initial states open watches are sending from (one per key prefix and
    /// second, however many watches share it).
    pub fn watch_snapshots_live(&self) -> usize {
        self.watch_snapshots.live()
    }

    /// The generic store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    pub(crate) fn namespaces(&self) -> &ResourceInfo {
        // The table always contains namespaces; this is a programming invariant.
        self.resources
            .find("", "v1", "namespaces")
            .map(|r| &**r)
            .unwrap_or_else(|| unreachable!("namespaces are always served"))
    }

    /// The axum router of the whole surface.
    pub fn router(self: &Arc<Self>) -> Router {
        let server = self.clone();
        Router::new().fallback(move |request: Request<Body>| {
            let server = server.clone();
            async move { server.dispatch(request).await }
        })
    }

    async fn dispatch(self: Arc<Self>, request: Request<Body>) -> Response {
        let started = Instant::now();
        let verb = request.method().as_str().to_string();
        let (parts, body) = request.into_parts();
        let mut body = Some(body);
        let response = self.dispatch_inner(parts, &mut body).await;
        // A request refused before its body was read (401, 403, 429, …): read and drop the
        // body first, up to a bound. Over HTTP/2 an answer sent with the request stream still
        // open may reach the client as a stream reset without its status, and clients that
        // refresh credentials on 401 never see the 401.
        if let Some(unread) = body
            && response.status().as_u16() >= 400
        {
            discard(unread).await;
        }
        self.metrics
            .observe(&verb, response.status().as_u16(), started.elapsed());
        response
    }

    async fn dispatch_inner(
        self: &Arc<Self>,
        parts: http::request::Parts,
        body: &mut Option<Body>,
    ) -> Response {
        // Upstream routes the decoded path (Go's `URL.Path`): `secret%2Da` names `secret-a`.
        let path = match decode_path(parts.uri.path()) {
            Ok(path) => path,
            Err(err) => return err.into_response(),
        };
        let segments: Vec<&str> = path
            .trim_matches('/')
            .split('/')
            .filter(|s| !s.is_empty())
            .collect();
        let implied;
        let (cluster, rest) = match segments.as_slice() {
            ["clusters", cluster, rest @ ..] => (*cluster, rest),
            // kubectl's `get --raw PATH` drops the server URL's `/clusters/{id}`: the credential
            // names the cluster, whose own authenticator then accepts or refuses it.
            rest => match implied_cluster(&parts) {
                Some(cluster) => {
                    implied = cluster;
                    (implied.as_str(), rest)
                }
                None => {
                    let query: std::collections::HashMap<String, String> =
                        form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes())
                            .into_owned()
                            .collect();
                    return match rest {
                        [endpoint @ ("healthz" | "livez" | "readyz")] => {
                            health::answer(self, endpoint, None, &query).await
                        }
                        [endpoint @ ("healthz" | "livez" | "readyz"), check] => {
                            health::answer(self, endpoint, Some(check), &query).await
                        }
                        ["version"] => handler::plain_json(&discovery::version()),
                        _ => ApiError::no_such_path().into_response(),
                    };
                }
            },
        };
        let tenant = match self.tenants.get(cluster).await {
            Ok(Some(tenant)) => tenant,
            Ok(None) => return ApiError::no_such_path().into_response(),
            Err(err) => return err.into_response(),
        };
        // The cluster's endpoint access, before any credential is looked at; requests from
        // inside the process (the hosted control loops) come over no network.
        if let Some(ClientAddress(client)) = parts.extensions.get::<ClientAddress>()
            && let Err(why) = tenant
                .record
                .endpoint_access
                .admits(client.ip(), &self.private_networks)
        {
            return ApiError::forbidden_message("", "", "", why).into_response();
        }
        // Health, version and the OIDC documents a cloud IAM reads are open to anyone.
        let public = matches!(
            rest,
            ["version"]
                | ["healthz" | "livez" | "readyz"]
                | ["healthz" | "livez" | "readyz", _]
                | [".well-known", "openid-configuration"]
                | ["openid", "v1", "jwks"]
        );
        let peer = parts
            .extensions
            .get::<PeerCertificates>()
            .cloned()
            .unwrap_or_default();
        let in_process = parts
            .extensions
            .get::<authn::InProcessIdentity>()
            .map(|identity| identity.0.clone());
        let hosted_loop = in_process.is_some();
        let user = match in_process
            .or_else(|| tenant.authenticate(&peer).map(authn::user_from_certificate))
        {
            Some(user) => user,
            None => match bearer_token(&parts.headers) {
                // A credential that fails is refused even where anonymous would be served.
                Some(token) => match authn::authenticate_token(self, &tenant, token, None).await {
                    Ok((user, _)) => user,
                    Err(err) => {
                        tracing::debug!(tenant = cluster, %err, "bearer token refused");
                        return self.unauthenticated(&tenant, &parts, rest).await;
                    }
                },
                None if public => UserInfo::anonymous(),
                None => return self.unauthenticated(&tenant, &parts, rest).await,
            },
        };
        let audit_id = audit_id(&parts.headers);
        let record = if self.audit.has_backend() {
            let query = handler::parse_query(parts.uri.query());
            let attributes = authz::request_attributes(&user, &parts.method, rest, &query);
            let decision = self
                .audit
                .decide(tenant.record.audit_policy.as_ref(), &attributes);
            self.audit
                .begin(
                    decision,
                    request_facts(&parts, cluster, &audit_id),
                    &attributes,
                )
                .map(|record| (record, is_long_running(&attributes)))
        } else {
            None
        };
        let serve = self.serve_authenticated(
            &tenant,
            cluster,
            &path,
            rest,
            parts,
            body,
            user,
            public,
            hosted_loop,
        );
        let mut response = match record {
            Some((record, long_running)) => {
                audit::audited(self.audit.clone(), record, long_running, serve).await
            }
            None => serve.await,
        };
        if let Ok(value) = http::HeaderValue::from_str(&audit_id) {
            response.headers_mut().insert(audit::AUDIT_ID_HEADER, value);
        }
        response
    }

    /// A 401, recorded as upstream's failed-authentication audit event.
    async fn unauthenticated(
        &self,
        tenant: &tenants::TenantState,
        parts: &http::request::Parts,
        rest: &[&str],
    ) -> Response {
        if self.audit.has_backend() {
            let query = handler::parse_query(parts.uri.query());
            let attributes =
                authz::request_attributes(&UserInfo::default(), &parts.method, rest, &query);
            audit::failed_authentication(
                &self.audit,
                tenant.record.audit_policy.as_ref(),
                request_facts(parts, &tenant.record.id, &audit_id(&parts.headers)),
                &attributes,
            )
            .await;
        }
        ApiError::unauthorized().into_response()
    }

    /// Everything after authentication: limits, impersonation, authorization, the body and
    /// the handler.
    #[allow(clippy::too_many_arguments)]
    async fn serve_authenticated(
        self: &Arc<Self>,
        tenant: &Arc<tenants::TenantState>,
        cluster: &str,
        path: &str,
        rest: &[&str],
        mut parts: http::request::Parts,
        body: &mut Option<Body>,
        user: UserInfo,
        public: bool,
        hosted_loop: bool,
    ) -> Response {
        // The tenant's own control loops, hosted here, spend none of its request budget: their
        // work follows from writes the budget already limited, and throttling them would slow
        // the cluster's reactions, not its users (as for seats below).
        if !hosted_loop && let Err(refused) = tenant.limiter.admit(&self.limits) {
            return refused.into_response();
        }
        // A cluster created before its default objects grew gets them on first use.
        if !tenant.bootstrapped()
            && let Err(err) = self.tenants.ensure(self, cluster).await
        {
            return err.into_response();
        }
        let impersonating = parts.headers.contains_key("impersonate-user");
        let user = match authz::impersonate(self, tenant, user, &parts.headers).await {
            Ok(user) => user,
            Err(err) => return err.into_response(),
        };
        if impersonating {
            audit::note_impersonation(&user);
        }
        let query = handler::parse_query(parts.uri.query());
        let attributes = authz::request_attributes(&user, &parts.method, rest, &query);
        // The tenant's own control loops, hosted here, do not queue behind its users (upstream
        // gives system components their own priority levels); long-running requests hold no
        // seat, as upstream's.
        let _seat = if !hosted_loop && !is_long_running(&attributes) {
            match tenant.seats.take(&self.limits).await {
                Ok(seat) => Some(seat),
                Err(refused) => return refused.into_response(),
            }
        } else {
            None
        };
        if !public {
            let (allowed, reason) = match authz::allowed(self, tenant, &attributes).await {
                Ok(decided) => decided,
                Err(err) => return err.into_response(),
            };
            // Upstream's audit annotations of the request's authorization (not of the checks
            // impersonation and admission make).
            audit::annotate(
                "authorization.k8s.io/decision",
                if allowed { "allow" } else { "forbid" },
            );
            if !reason.is_empty() {
                audit::annotate("authorization.k8s.io/reason", reason.clone());
            }
            if !allowed {
                return authz::forbidden(&attributes, &reason).into_response();
            }
        }
        // A WebSocket upgrade to exec/attach/portforward is a GET, yet opens what a POST
        // would create: it also needs `create` (upstream's
        // AuthorizePodWebsocketUpgradeCreatePermission).
        let connect = attributes.resource_request
            && attributes.api_group.is_empty()
            && attributes.resource == "pods"
            && !attributes.name.is_empty()
            && kubelet::is_connect(&attributes.subresource);
        if connect && kubelet::is_websocket(&parts.method, &parts.headers) {
            let create = rbac_create(&attributes);
            if let Err(err) = authz::authorize(self, tenant, &create).await {
                return err.into_response();
            }
        }
        let span = tracing::debug_span!("request", tenant = cluster, method = %parts.method, path = %path,
            user = %user.name);
        // The proxy subresources pass the body on as it arrives (upstream's proxy never reads
        // it), so they are served before it would be read here; a body they refuse before
        // taking it is drained as any refused request's.
        if let Some(target) = proxy::proxy_target(path, rest) {
            return proxy::serve(self, tenant, &target, &user, parts, body)
                .instrument(span)
                .await
                .unwrap_or_else(IntoResponse::into_response);
        }
        let Some(unread) = body.take() else {
            return ApiError::internal("the request body was read twice").into_response();
        };
        let body = match tokio::time::timeout(
            REQUEST_BODY_TIMEOUT,
            axum::body::to_bytes(unread, MAX_BODY_BYTES),
        )
        .await
        {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(_)) => {
                return ApiError::request_entity_too_large(MAX_BODY_BYTES).into_response();
            }
            Err(_) => return ApiError::request_timeout().into_response(),
        };
        let content_type = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !body.is_empty() {
            audit::note_request_body(|| {
                negotiate::request_body_format(&parts.method, content_type)
                    .and_then(|format| negotiate::parse_body(&body, format).ok())
            });
        }
        if let Err(err) =
            authz::check_rbac_write(self, tenant, &attributes, content_type, &body).await
        {
            return err.into_response();
        }
        // A large body is parsed on the heavy-work threads, one at a time per tenant, while
        // this request holds its seat: the worst bodies a tenant can send cost it a share of
        // one core, not the workers every tenant is answered on.
        let mut parsed = None;
        if body.len() > heavy::HEAVY_BODY_BYTES
            && let Some(format) = negotiate::request_body_format(&parts.method, content_type)
        {
            let _turn = match tenant.heavy_work.acquire().await {
                Ok(turn) => turn,
                Err(_) => {
                    return ApiError::internal("the tenant's heavy-work turn closed")
                        .into_response();
                }
            };
            let bytes = body.clone();
            match self
                .heavy_work
                .run(move |abandoned| {
                    negotiate::parse_body_unless_abandoned(&bytes, format, abandoned)
                })
                .await
            {
                Ok(value) => parsed = Some(value),
                Err(err) => return err.into_response(),
            }
        }
        let rbac_write =
            parts.method != http::Method::GET && rest.contains(&"rbac.authorization.k8s.io");
        let raw_query = form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes())
            .into_owned()
            .collect();
        tenant.components.saw(&user.name, hosted_loop);
        let call = Call {
            method: parts.method,
            query,
            headers: parts.headers,
            body,
            user,
            raw_query,
            upgrade: parts.extensions.remove::<hyper::upgrade::OnUpgrade>(),
            hosted_loop,
            parsed: std::sync::Mutex::new(parsed),
        };
        if connect {
            return kubelet::connect_subresource(
                self,
                tenant,
                &attributes.namespace,
                &attributes.name,
                &attributes.subresource,
                call,
            )
            .instrument(span)
            .await
            .unwrap_or_else(IntoResponse::into_response);
        }
        let response = handler::tenant_request(self.clone(), tenant.clone(), rest, call)
            .instrument(span)
            .await;
        if rbac_write {
            tenant.policy.invalidate();
        }
        response
    }
}

/// The request's audit id: the client's `Audit-ID` when it sent a usable one (upstream keeps
/// it), else a new UUID.
fn audit_id(headers: &http::HeaderMap) -> String {
    headers
        .get(audit::AUDIT_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|id| !id.is_empty() && id.len() <= 128)
        .map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_string)
}

/// What an audit event says of the request before it is served.
fn request_facts(
    parts: &http::request::Parts,
    cluster: &str,
    audit_id: &str,
) -> audit::RequestFacts {
    let header = |name: http::header::HeaderName| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    // Upstream's `SourceIPs`: the `X-Forwarded-For` chain, then `X-Real-Ip`, then the peer.
    let mut source_ips: Vec<String> =
        header(http::header::HeaderName::from_static("x-forwarded-for"))
            .split(',')
            .map(str::trim)
            .filter(|ip| ip.parse::<std::net::IpAddr>().is_ok())
            .map(str::to_string)
            .collect();
    if let Some(ClientAddress(client)) = parts.extensions.get::<ClientAddress>() {
        let peer = client.ip().to_string();
        if !source_ips.contains(&peer) {
            source_ips.push(peer);
        }
    }
    audit::RequestFacts {
        audit_id: audit_id.to_string(),
        cluster: cluster.to_string(),
        request_uri: parts
            .uri
            .path_and_query()
            .map_or_else(|| parts.uri.path().to_string(), |p| p.as_str().to_string()),
        source_ips,
        user_agent: header(http::header::USER_AGENT),
    }
}

/// How long a request body may take to arrive (upstream's 60 s request timeout): a client
/// trickling its body holds a seat and a connection no longer.
const REQUEST_BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// How long an unread body of a refused request is read before the answer goes anyway.
const DISCARD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Reads and drops a body, at most [`MAX_BODY_BYTES`] of it for at most [`DISCARD_TIMEOUT`].
async fn discard(body: Body) {
    use http_body_util::BodyExt;
    let read = async {
        let mut body = body;
        let mut seen = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, |data| data.len());
            if seen > MAX_BODY_BYTES {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(DISCARD_TIMEOUT, read).await;
}

/// A request path with its percent-escapes decoded, as Go's URL parser decodes `URL.Path`; a
/// malformed escape is refused as Go refuses it.
fn decode_path(raw: &str) -> Result<String, ApiError> {
    if !raw.contains('%') {
        return Ok(raw.to_string());
    }
    let bytes = raw.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'%' {
            decoded.push(bytes[i]);
            i += 1;
            continue;
        }
        let escape = bytes
            .get(i + 1..i + 3)
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escape {
            Some(byte) => decoded.push(byte),
            None => {
                let shown = &raw[i..raw.len().min(i + 3)];
                return Err(ApiError::bad_request(format!(
                    "invalid URL escape {shown:?}"
                )));
            }
        }
        i += 3;
    }
    String::from_utf8(decoded)
        .map_err(|_| ApiError::bad_request("the request path is not valid UTF-8 once decoded"))
}

/// Upstream's BasicLongRunningRequestCheck: watches, proxying, and the streaming subresources.
fn is_long_running(attributes: &flotilla_api_machinery::rbac::Attributes) -> bool {
    matches!(attributes.verb.as_str(), "watch" | "proxy")
        || kubelet::is_connect(&attributes.subresource)
        || matches!(attributes.subresource.as_str(), "proxy" | "log")
}

/// The same request asked with the verb `create`.
fn rbac_create(
    attributes: &flotilla_api_machinery::rbac::Attributes,
) -> flotilla_api_machinery::rbac::Attributes {
    flotilla_api_machinery::rbac::Attributes {
        verb: "create".into(),
        ..attributes.clone()
    }
}

/// The token of an `Authorization: Bearer …` header.
fn bearer_token(headers: &http::HeaderMap) -> Option<&str> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The cluster a request's credential belongs to, for paths without `/clusters/{id}`: the
/// issuer of its client certificate, or the issuer URL inside its service-account token.
/// Unverified: it only picks which cluster's authenticator looks at the credential.
fn implied_cluster(parts: &http::request::Parts) -> Option<String> {
    if let Some(leaf) = parts
        .extensions
        .get::<PeerCertificates>()
        .and_then(|peer| peer.chain.first().cloned())
    {
        let issuer = pki::issuer_common_name(&leaf)?;
        return pki::tenant_of_ca_name(&issuer).map(String::from);
    }
    let token = bearer_token(&parts.headers)?;
    let claims = token.split('.').nth(1)?;
    let claims: serde_json::Value = serde_json::from_slice(
        &base64::Engine::decode(&base64::engine::general_purpose::URL_SAFE_NO_PAD, claims).ok()?,
    )
    .ok()?;
    let issuer = claims["iss"].as_str()?;
    let (_, after) = issuer.split_once("/clusters/")?;
    Some(after.split('/').next()?.to_string())
}

#[cfg(test)]
mod tests {
    use flotilla_api_machinery::rbac::Attributes;

    use super::is_long_running;

    fn asking(verb: &str, subresource: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            subresource: subresource.into(),
            ..Attributes::default()
        }
    }

    #[test]
    fn paths_are_percent_decoded_as_go_decodes_them() {
        use super::decode_path;
        assert_eq!(
            decode_path("/api/v1/namespaces/default/secrets/secret%2Da%2D1").ok(),
            Some("/api/v1/namespaces/default/secrets/secret-a-1".to_string())
        );
        assert_eq!(decode_path("/plain/path").ok(), Some("/plain/path".into()));
        for bad in ["/a%zz", "/a%2", "/a%"] {
            assert_eq!(decode_path(bad).map_err(|e| e.code), Err(400), "{bad}");
        }
    }

    #[test]
    fn watches_proxies_and_streams_are_long_running() {
        for (verb, subresource) in [
            ("watch", ""),
            ("proxy", ""),
            ("get", "log"),
            ("get", "proxy"),
            ("create", "exec"),
            ("get", "attach"),
            ("create", "portforward"),
        ] {
            assert!(
                is_long_running(&asking(verb, subresource)),
                "{verb} {subresource}"
            );
        }
        for (verb, subresource) in [("list", ""), ("get", "status"), ("update", "scale")] {
            assert!(
                !is_long_running(&asking(verb, subresource)),
                "{verb} {subresource}"
            );
        }
    }
}
