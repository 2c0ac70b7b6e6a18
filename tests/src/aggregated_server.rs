//! An imitation of metrics-server for the API aggregation suites: an extension API server that
//! authenticates the control plane's front proxy the way upstream's requestheader authenticator
//! does (a client certificate from the `extension-apiserver-authentication` CA, the caller's
//! identity in `X-Remote-*` headers), serves `metrics.k8s.io/v1beta1` for the nodes and pods a
//! test sets, and records every request with the identity it authenticated.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use anyhow::{Context, bail};

use crate::https_server::{ServerThread, ServingCertificate};
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::HeaderMap;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use serde_json::{Value, json};

/// The group the server serves.
const GROUP: &str = "metrics.k8s.io";
/// The one version it serves, as discovery and objects name it.
const GROUP_VERSION: &str = "metrics.k8s.io/v1beta1";
/// Upstream's user for requests no authenticator accepted.
const ANONYMOUS_USER: &str = "system:anonymous";
/// Upstream's group for requests no authenticator accepted.
const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";
/// The sampling window metrics-server reports with each measurement.
const WINDOW: &str = "10s";

/// One request the server received, with the identity it authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenRequest {
    /// The HTTP method.
    pub method: String,
    /// The path and query string as sent.
    pub path_and_query: String,
    /// The authenticated user; `system:anonymous` when the request was not authenticated.
    pub user: String,
    /// The user's groups: every value of the group headers, or `system:unauthenticated`.
    pub groups: Vec<String>,
    /// The user's extra attributes from the extra headers (keys lower-cased and unescaped).
    pub extra: BTreeMap<String, Vec<String>>,
    /// The subject CN of the client certificate the peer presented, whether or not it chained
    /// to the requestheader CA (`user` tells whether the request was authenticated); `None`
    /// when it presented none or the certificate has no CN.
    pub client_cn: Option<String>,
    /// The `Authorization` header as received (a front proxy must not forward the caller's).
    pub authorization_header: Option<String>,
}

/// A running imitation of metrics-server on its own thread; stops when dropped.
pub struct AggregatedServer {
    server: ServerThread,
    shared: Arc<Shared>,
}

/// Its `url`, `ca_pem`, `port()` and `ca_bundle()` (an APIService's `caBundle`) are its
/// [`ServerThread`]'s.
impl std::ops::Deref for AggregatedServer {
    type Target = ServerThread;

    fn deref(&self) -> &ServerThread {
        &self.server
    }
}

impl AggregatedServer {
    /// Serves on `ip`, on a free port, with a certificate from a fresh CA valid for `ip` and
    /// `names` (a Service's `name.namespace.svc`). `authentication` is the `data` of the
    /// ConfigMap `kube-system/extension-apiserver-authentication`: its requestheader keys say
    /// which client certificates may assert an identity in which headers.
    pub fn start(ip: &str, names: &[&str], authentication: &Value) -> anyhow::Result<Self> {
        let config = RequestHeaderConfig::from_authentication_data(authentication)?;
        let requestheader_ca = requestheader_ca_verifier(&config.client_ca_pem)?;
        let serving = ServingCertificate::generate(ip, names, "aggregated API server test CA")?;
        let ca_pem = serving.ca_pem.clone();
        let tls = rustls::ServerConfig::builder_with_provider(crate::https_server::provider())
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(Arc::new(RequestClientCert {
                requestheader_ca: requestheader_ca.clone(),
            }))
            .with_single_cert(serving.chain, serving.key)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let shared = Arc::new(Shared::default());
        let handler = Arc::new(Handler {
            config,
            shared: shared.clone(),
        });
        let server = ServerThread::start(
            ip,
            "aggregated API server",
            ca_pem,
            move |listener| async move {
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        continue;
                    };
                    let _ = tcp.set_nodelay(true);
                    let acceptor = acceptor.clone();
                    let handler = handler.clone();
                    let requestheader_ca = requestheader_ca.clone();
                    tokio::spawn(async move {
                        let Ok(tls) = acceptor.accept(tcp).await else {
                            return;
                        };
                        // The certificate is fixed for the connection, so its chain is checked
                        // once here rather than on every request.
                        let peer = Arc::new(ClientCertificate::classify(
                            requestheader_ca.as_ref(),
                            tls.get_ref().1.peer_certificates(),
                        ));
                        let service =
                            service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                                let answer = handler.serve(&peer, &request);
                                async move { Ok::<_, Infallible>(answer) }
                            });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(tls), service)
                            .await;
                    });
                }
            },
        )?;
        Ok(AggregatedServer { server, shared })
    }

    /// Reports metrics for exactly these nodes from now on.
    pub fn set_nodes(&self, names: &[&str]) {
        lock(&self.shared.metrics).nodes = names.iter().map(|name| name.to_string()).collect();
    }

    /// Reports metrics for exactly these pods, `(namespace, name)`, from now on.
    pub fn set_pods(&self, pods: &[(&str, &str)]) {
        lock(&self.shared.metrics).pods = pods
            .iter()
            .map(|(namespace, name)| PodKey {
                namespace: namespace.to_string(),
                name: name.to_string(),
            })
            .collect();
    }

    /// Every request received so far, oldest first.
    pub fn requests(&self) -> Vec<SeenRequest> {
        lock(&self.shared.requests).clone()
    }
}

/// A pod the server reports metrics for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PodKey {
    namespace: String,
    name: String,
}

/// What the server reports metrics for.
#[derive(Debug, Default)]
struct Metrics {
    nodes: Vec<String>,
    pods: Vec<PodKey>,
}

/// State the test thread and the server's connections share.
#[derive(Debug, Default)]
struct Shared {
    metrics: Mutex<Metrics>,
    requests: Mutex<Vec<SeenRequest>>,
}

/// A lock that survives a panicked holder: the data are plain lists, never left half-written.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Upstream's `RequestHeaderConfig`, read from `extension-apiserver-authentication`. Header
/// names are kept lower-cased, as HTTP/1 header names compare without case.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RequestHeaderConfig {
    /// `requestheader-client-ca-file`: the CA a front proxy's client certificate chains to.
    client_ca_pem: String,
    /// `requestheader-allowed-names`: the CNs that may assert an identity (empty: any).
    allowed_names: Vec<String>,
    /// `requestheader-username-headers`.
    username_headers: Vec<String>,
    /// `requestheader-group-headers`.
    group_headers: Vec<String>,
    /// `requestheader-extra-headers-prefix`.
    extra_headers_prefixes: Vec<String>,
}

impl RequestHeaderConfig {
    /// Reads the ConfigMap's `data`; a list key that is missing is an empty list, as upstream.
    fn from_authentication_data(data: &Value) -> anyhow::Result<Self> {
        let client_ca_pem = data
            .get("requestheader-client-ca-file")
            .and_then(Value::as_str)
            .filter(|pem| !pem.trim().is_empty())
            .context("extension-apiserver-authentication has no requestheader-client-ca-file")?
            .to_string();
        let lower_case = |names: Vec<String>| -> Vec<String> {
            names.iter().map(|name| name.to_ascii_lowercase()).collect()
        };
        Ok(RequestHeaderConfig {
            client_ca_pem,
            allowed_names: string_list(data, "requestheader-allowed-names")?,
            username_headers: lower_case(string_list(data, "requestheader-username-headers")?),
            group_headers: lower_case(string_list(data, "requestheader-group-headers")?),
            extra_headers_prefixes: lower_case(string_list(
                data,
                "requestheader-extra-headers-prefix",
            )?),
        })
    }
}

/// A ConfigMap value holding a JSON array of strings, as `extension-apiserver-authentication`
/// stores its lists.
fn string_list(data: &Value, key: &str) -> anyhow::Result<Vec<String>> {
    match data.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(text)) if text.trim().is_empty() => Ok(Vec::new()),
        Some(Value::String(text)) => serde_json::from_str(text)
            .with_context(|| format!("{key} is not a JSON array of strings: {text}")),
        Some(other) => bail!("{key} is not a string: {other}"),
    }
}

/// The verifier of client certificates against the requestheader CA (every certificate in the
/// PEM is trusted, as upstream reads a bundle).
fn requestheader_ca_verifier(pem: &str) -> anyhow::Result<Arc<dyn ClientCertVerifier>> {
    let mut roots = RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let certificate = certificate.context("reading requestheader-client-ca-file")?;
        roots
            .add(certificate)
            .context("adding a requestheader-client-ca-file certificate")?;
    }
    anyhow::ensure!(
        !roots.is_empty(),
        "requestheader-client-ca-file holds no certificate"
    );
    Ok(WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .allow_unauthenticated()
    .build()?)
}

/// Go's `tls.RequestClientCert`, which upstream servers use: the handshake asks for a client
/// certificate and proves the peer holds its key, but leaves the chain to authentication, so
/// that a certificate from another CA makes the request anonymous instead of failing the
/// handshake. The proofs of possession are the requestheader verifier's own.
#[derive(Debug)]
struct RequestClientCert {
    requestheader_ca: Arc<dyn ClientCertVerifier>,
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Names the requestheader CA, so that a client holding several certificates picks the
        // one the server will trust.
        self.requestheader_ca.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.requestheader_ca
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.requestheader_ca
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.requestheader_ca.supported_verify_schemes()
    }
}

/// What a connection's peer presented as its client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ClientCertificate {
    /// No certificate.
    Absent,
    /// A certificate that does not chain to the requestheader CA.
    Untrusted { common_name: Option<String> },
    /// A certificate that chains to the requestheader CA.
    Trusted { common_name: Option<String> },
}

impl ClientCertificate {
    /// Checks the chain the peer presented (leaf first) against the requestheader CA.
    fn classify(
        requestheader_ca: &dyn ClientCertVerifier,
        chain: Option<&[CertificateDer<'static>]>,
    ) -> Self {
        let Some((end_entity, intermediates)) = chain.and_then(<[_]>::split_first) else {
            return ClientCertificate::Absent;
        };
        let common_name = common_name(end_entity);
        match requestheader_ca.verify_client_cert(end_entity, intermediates, UnixTime::now()) {
            Ok(_) => ClientCertificate::Trusted { common_name },
            Err(_) => ClientCertificate::Untrusted { common_name },
        }
    }

    fn common_name(&self) -> Option<&str> {
        match self {
            ClientCertificate::Absent => None,
            ClientCertificate::Untrusted { common_name }
            | ClientCertificate::Trusted { common_name } => common_name.as_deref(),
        }
    }
}

/// The first subject CN of a certificate, if it parses and has one.
fn common_name(certificate: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(certificate.as_ref()).ok()?;
    let name = parsed.subject().iter_common_name().next()?.as_str().ok()?;
    Some(name.to_string())
}

/// Upstream's `user.Info`: who a request is from.
#[derive(Debug, Clone, PartialEq, Eq)]
struct UserInfo {
    name: String,
    groups: Vec<String>,
    extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    fn anonymous() -> Self {
        UserInfo {
            name: ANONYMOUS_USER.to_string(),
            groups: vec![UNAUTHENTICATED_GROUP.to_string()],
            extra: BTreeMap::new(),
        }
    }

    fn is_anonymous(&self) -> bool {
        self.name == ANONYMOUS_USER
    }
}

/// Upstream's requestheader authentication behind its x509 verifier: the headers count only
/// when the peer's certificate chains to the requestheader CA and its CN is allowed, and name
/// a user. Anything else is anonymous, its `X-Remote-*` headers ignored.
fn authenticate(
    config: &RequestHeaderConfig,
    peer: &ClientCertificate,
    headers: &HeaderMap,
) -> UserInfo {
    let ClientCertificate::Trusted { common_name } = peer else {
        return UserInfo::anonymous();
    };
    let allowed = config.allowed_names.is_empty()
        || common_name
            .as_ref()
            .is_some_and(|name| config.allowed_names.contains(name));
    if !allowed {
        return UserInfo::anonymous();
    }
    user_from_headers(config, headers).unwrap_or_else(UserInfo::anonymous)
}

/// The identity the headers assert: the first non-blank value of the username headers, every
/// non-blank value of the group headers, and the extra headers; `None` without a user.
fn user_from_headers(config: &RequestHeaderConfig, headers: &HeaderMap) -> Option<UserInfo> {
    let values = |name: &String| {
        headers
            .get_all(name.as_str())
            .iter()
            .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
            .filter(|value| !value.trim().is_empty())
            .collect::<Vec<_>>()
    };
    let name = config.username_headers.iter().flat_map(values).next()?;
    let groups = config.group_headers.iter().flat_map(values).collect();
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // Prefixes first, as upstream, so that values keep their order within one prefix.
    for prefix in &config.extra_headers_prefixes {
        for (header, value) in headers {
            if let Some(key) = header.as_str().strip_prefix(prefix.as_str()) {
                extra
                    .entry(unescape_extra_key(key))
                    .or_default()
                    .push(String::from_utf8_lossy(value.as_bytes()).into_owned());
            }
        }
    }
    Some(UserInfo {
        name,
        groups,
        extra,
    })
}

/// Upstream's `unescapeExtraKey`: extra keys travel percent-encoded in header names (a key may
/// hold `/`); a key that does not decode is taken as it is.
fn unescape_extra_key(encoded: &str) -> String {
    let bytes = encoded.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = bytes
                .get(index + 1..index + 3)
                .and_then(|pair| std::str::from_utf8(pair).ok())
                .and_then(|pair| u8::from_str_radix(pair, 16).ok());
            let Some(byte) = hex else {
                return encoded.to_string();
            };
            decoded.push(byte);
            index += 3;
        } else {
            decoded.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(decoded).unwrap_or_else(|_| encoded.to_string())
}

/// What a request path names, as metrics-server routes it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    /// `/apis/metrics.k8s.io`: the APIGroup.
    GroupDiscovery,
    /// `/apis/metrics.k8s.io/v1beta1`: the APIResourceList.
    VersionDiscovery,
    /// `/openapi/v3/apis/metrics.k8s.io/v1beta1`: the group version's OpenAPI document.
    OpenApi,
    /// `…/nodes`.
    NodeList,
    /// `…/nodes/{name}`.
    Node(String),
    /// `…/pods` (every namespace) or `…/namespaces/{ns}/pods`.
    PodList(Option<String>),
    /// `…/namespaces/{ns}/pods/{name}`.
    Pod { namespace: String, name: String },
    /// Anything else.
    Unknown,
}

impl Route {
    fn parse(path: &str) -> Self {
        if path == "/openapi/v3/apis/metrics.k8s.io/v1beta1" {
            return Route::OpenApi;
        }
        let Some(rest) = path.strip_prefix("/apis/metrics.k8s.io") else {
            return Route::Unknown;
        };
        let segments: Vec<&str> = match rest.strip_prefix('/') {
            None if rest.is_empty() => return Route::GroupDiscovery,
            None => return Route::Unknown,
            Some(rest) => rest.split('/').collect(),
        };
        if segments.iter().any(|segment| segment.is_empty()) {
            return Route::Unknown;
        }
        let owned = |segment: &&str| segment.to_string();
        match segments.as_slice() {
            ["v1beta1"] => Route::VersionDiscovery,
            ["v1beta1", "nodes"] => Route::NodeList,
            ["v1beta1", "nodes", name] => Route::Node(owned(name)),
            ["v1beta1", "pods"] => Route::PodList(None),
            ["v1beta1", "namespaces", namespace, "pods"] => Route::PodList(Some(owned(namespace))),
            ["v1beta1", "namespaces", namespace, "pods", name] => Route::Pod {
                namespace: owned(namespace),
                name: owned(name),
            },
            _ => Route::Unknown,
        }
    }

    /// What the authorizer checks for a metrics route; `None` for discovery, which is open to
    /// everyone, and for unknown paths.
    fn resource_attributes(&self) -> Option<ResourceAttributes<'_>> {
        let attributes = |verb, resource, name, namespace| {
            Some(ResourceAttributes {
                verb,
                resource,
                name,
                namespace,
            })
        };
        match self {
            Route::GroupDiscovery | Route::VersionDiscovery | Route::OpenApi | Route::Unknown => {
                None
            }
            Route::NodeList => attributes("list", "nodes", None, None),
            Route::Node(name) => attributes("get", "nodes", Some(name.as_str()), None),
            Route::PodList(namespace) => attributes("list", "pods", None, namespace.as_deref()),
            Route::Pod { namespace, name } => {
                attributes("get", "pods", Some(name.as_str()), Some(namespace.as_str()))
            }
        }
    }
}

/// A Kubernetes `Status` answer.
fn status(code: u16, reason: &str, message: String, details: Option<Value>) -> (u16, Value) {
    let mut body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    });
    if let Some(details) = details {
        body["details"] = details;
    }
    (code, body)
}

/// What upstream's authorizer checks for a request on a metrics resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ResourceAttributes<'a> {
    verb: &'a str,
    resource: &'a str,
    name: Option<&'a str>,
    namespace: Option<&'a str>,
}

/// The 403 upstream's authorizer gives a user who may not do what `attributes` say.
fn forbidden(user: &UserInfo, attributes: ResourceAttributes<'_>) -> (u16, Value) {
    let ResourceAttributes {
        verb,
        resource,
        name,
        namespace,
    } = attributes;
    let object = match name {
        Some(name) => format!("{resource}.{GROUP} \"{name}\""),
        None => format!("{resource}.{GROUP}"),
    };
    let scope = match namespace {
        Some(namespace) => format!("in the namespace \"{namespace}\""),
        None => "at the cluster scope".to_string(),
    };
    status(
        403,
        "Forbidden",
        format!(
            "{object} is forbidden: User \"{}\" cannot {verb} resource \"{resource}\" in API group \"{GROUP}\" {scope}",
            user.name
        ),
        Some(json!({"name": name.unwrap_or_default(), "group": GROUP, "kind": resource})),
    )
}

/// The 404 for a path the server does not serve.
fn path_not_found() -> (u16, Value) {
    status(
        404,
        "NotFound",
        "the server could not find the requested resource".to_string(),
        None,
    )
}

/// The 404 metrics-server gives for a node or pod it has no metrics for.
fn not_found(kind: &str, name: &str) -> (u16, Value) {
    status(
        404,
        "NotFound",
        format!("{kind}.{GROUP} \"{name}\" not found"),
        Some(json!({"name": name, "group": GROUP, "kind": kind})),
    )
}

fn node_metrics(name: &str, now: &str) -> Value {
    json!({
        "metadata": {"name": name, "creationTimestamp": now},
        "timestamp": now,
        "window": WINDOW,
        "usage": {"cpu": "250m", "memory": "512Mi"},
    })
}

fn pod_metrics(pod: &PodKey, now: &str) -> Value {
    json!({
        "metadata": {"name": pod.name, "namespace": pod.namespace, "creationTimestamp": now},
        "timestamp": now,
        "window": WINDOW,
        "containers": [{"name": "main", "usage": {"cpu": "100m", "memory": "64Mi"}}],
    })
}

/// A single object of `kind`, with its type.
fn typed(kind: &str, mut object: Value) -> Value {
    object["kind"] = json!(kind);
    object["apiVersion"] = json!(GROUP_VERSION);
    object
}

fn list(kind: &str, items: Vec<Value>) -> Value {
    json!({"kind": kind, "apiVersion": GROUP_VERSION, "metadata": {}, "items": items})
}

/// metrics-server's answer to `method` on `route` from `user`, `now` being the RFC 3339 time
/// of the measurements. Discovery is open to everyone, as upstream's; metrics need a user.
fn answer(
    method: &hyper::Method,
    route: &Route,
    user: &UserInfo,
    metrics: &Metrics,
    now: &str,
) -> (u16, Value) {
    if *route == Route::Unknown {
        return path_not_found();
    }
    if let Some(attributes) = route.resource_attributes()
        && user.is_anonymous()
    {
        return forbidden(user, attributes);
    }
    if method != hyper::Method::GET {
        return status(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource".to_string(),
            None,
        );
    }
    let body = match route {
        Route::GroupDiscovery => {
            let version = json!({"groupVersion": GROUP_VERSION, "version": "v1beta1"});
            json!({
                "kind": "APIGroup",
                "apiVersion": "v1",
                "name": GROUP,
                "versions": [version],
                "preferredVersion": version,
            })
        }
        // A cut-down document of what metrics-server publishes: enough for `kubectl explain`.
        Route::OpenApi => {
            let usage = json!({"type": "object", "description": "The memory and CPU usage.",
                "additionalProperties": {"type": "string"}});
            json!({
                "openapi": "3.0.0",
                "info": {"title": "metrics-server", "version": "v0.7.2"},
                // kubectl explain finds the kind of a resource by its paths' operations.
                "paths": {"/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods": {"get": {
                    "x-kubernetes-action": "list",
                    "x-kubernetes-group-version-kind": {"group": GROUP, "version": "v1beta1", "kind": "PodMetrics"},
                    "responses": {"200": {"description": "OK"}},
                }}},
                "components": {"schemas": {
                    "io.k8s.metrics.pkg.apis.metrics.v1beta1.PodMetrics": {
                        "description": "PodMetrics sets resource usage metrics of a pod.",
                        "type": "object",
                        "required": ["timestamp", "window", "containers"],
                        "properties": {
                            "apiVersion": {"type": "string"},
                            "kind": {"type": "string"},
                            "timestamp": {"type": "string", "format": "date-time"},
                            "window": {"type": "string"},
                            "containers": {
                                "description": "Metrics for all containers are collected within the same time window.",
                                "type": "array",
                                "items": {"type": "object", "properties": {
                                    "name": {"type": "string", "description": "Container name corresponding to the one from pod.spec.containers."},
                                    "usage": usage,
                                }},
                            },
                        },
                        "x-kubernetes-group-version-kind": [
                            {"group": GROUP, "version": "v1beta1", "kind": "PodMetrics"},
                        ],
                    },
                }},
            })
        }
        Route::VersionDiscovery => json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": GROUP_VERSION,
            "resources": [
                {"name": "nodes", "singularName": "", "namespaced": false, "kind": "NodeMetrics",
                 "verbs": ["get", "list"]},
                {"name": "pods", "singularName": "", "namespaced": true, "kind": "PodMetrics",
                 "verbs": ["get", "list"]},
            ],
        }),
        Route::NodeList => list(
            "NodeMetricsList",
            metrics
                .nodes
                .iter()
                .map(|name| node_metrics(name, now))
                .collect(),
        ),
        Route::Node(name) => match metrics.nodes.iter().find(|node| *node == name) {
            Some(node) => typed("NodeMetrics", node_metrics(node, now)),
            None => return not_found("nodemetrics", name),
        },
        Route::PodList(namespace) => list(
            "PodMetricsList",
            metrics
                .pods
                .iter()
                .filter(|pod| namespace.as_ref().is_none_or(|ns| *ns == pod.namespace))
                .map(|pod| pod_metrics(pod, now))
                .collect(),
        ),
        Route::Pod { namespace, name } => match metrics
            .pods
            .iter()
            .find(|pod| pod.namespace == *namespace && pod.name == *name)
        {
            Some(pod) => typed("PodMetrics", pod_metrics(pod, now)),
            None => return not_found("podmetrics", name),
        },
        Route::Unknown => return path_not_found(),
    };
    (200, body)
}

/// RFC 3339 in UTC to the second, as metrics-server stamps its measurements.
fn rfc3339(at: time::OffsetDateTime) -> String {
    let at = at.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second()
    )
}

/// Authenticates, records and answers requests on behalf of every connection.
struct Handler {
    config: RequestHeaderConfig,
    shared: Arc<Shared>,
}

impl Handler {
    fn serve<B>(
        &self,
        peer: &ClientCertificate,
        request: &hyper::Request<B>,
    ) -> hyper::Response<Full<Bytes>> {
        let user = authenticate(&self.config, peer, request.headers());
        let path_and_query = request
            .uri()
            .path_and_query()
            .map_or_else(|| request.uri().path(), |p| p.as_str())
            .to_string();
        lock(&self.shared.requests).push(SeenRequest {
            method: request.method().to_string(),
            path_and_query,
            user: user.name.clone(),
            groups: user.groups.clone(),
            extra: user.extra.clone(),
            client_cn: peer.common_name().map(str::to_string),
            authorization_header: request
                .headers()
                .get(hyper::header::AUTHORIZATION)
                .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned()),
        });
        let route = Route::parse(request.uri().path());
        let now = rfc3339(time::OffsetDateTime::now_utc());
        let (code, body) = answer(
            request.method(),
            &route,
            &user,
            &lock(&self.shared.metrics),
            &now,
        );
        let mut response = hyper::Response::new(Full::new(Bytes::from(body.to_string())));
        *response.status_mut() =
            hyper::StatusCode::from_u16(code).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use http_body_util::{BodyExt, Empty};
    use rustls::pki_types::{PrivateKeyDer, ServerName};

    /// A CA for the tests' client certificates.
    struct TestCa {
        issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    }

    /// A client certificate and its key.
    struct ClientIdentity {
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    }

    impl TestCa {
        fn new(name: &str) -> anyhow::Result<Self> {
            let mut params = rcgen::CertificateParams::new(Vec::new())?;
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, name);
            let issuer = rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate()?)?;
            Ok(TestCa { issuer })
        }

        fn pem(&self) -> String {
            self.issuer.pem()
        }

        fn client(&self, common_name: &str) -> anyhow::Result<ClientIdentity> {
            let key = rcgen::KeyPair::generate()?;
            let mut params = rcgen::CertificateParams::new(Vec::new())?;
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, common_name);
            params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
            let cert = params.signed_by(&key, &self.issuer)?;
            Ok(ClientIdentity {
                chain: vec![cert.der().clone()],
                key: PrivateKeyDer::try_from(key.serialize_der())
                    .map_err(|e| anyhow::anyhow!("{e}"))?,
            })
        }
    }

    /// The ConfigMap data upstream's kube-apiserver publishes with its front-proxy flags.
    fn authentication(ca: &TestCa, allowed_names: &str) -> Value {
        json!({
            "client-ca-file": "unused by extension servers that only trust the front proxy",
            "requestheader-client-ca-file": ca.pem(),
            "requestheader-allowed-names": allowed_names,
            "requestheader-username-headers": "[\"X-Remote-User\"]",
            "requestheader-group-headers": "[\"X-Remote-Group\"]",
            "requestheader-extra-headers-prefix": "[\"X-Remote-Extra-\"]",
        })
    }

    /// Headers a front proxy sends for alice, with a caller's token it should have dropped.
    const ALICE: &[(&str, &str)] = &[
        ("X-Remote-User", "alice"),
        ("X-Remote-Group", "developers"),
        ("X-Remote-Group", "system:authenticated"),
        ("X-Remote-Extra-Scopes", "view"),
        ("X-Remote-Extra-Scopes", "edit"),
        ("X-Remote-Extra-Example.com%2fteam", "blue"),
        ("Authorization", "Bearer leaked"),
    ];

    /// GETs `path` over TLS (verifying the server's certificate for `server_name`), presenting
    /// `client` when given; the status and JSON body.
    fn get_as(
        server: &AggregatedServer,
        server_name: &str,
        client: Option<&ClientIdentity>,
        path: &str,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<(u16, Value)> {
        let mut roots = RootCertStore::empty();
        for certificate in CertificateDer::pem_slice_iter(server.ca_pem.as_bytes()) {
            roots.add(certificate?)?;
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
        let config = match client {
            Some(client) => {
                builder.with_client_auth_cert(client.chain.clone(), client.key.clone_key())?
            }
            None => builder.with_no_client_auth(),
        };
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let server_name = ServerName::try_from(server_name.to_string())?;
        let mut request = hyper::Request::get(path).header(hyper::header::HOST, "metrics-server");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Empty::<Bytes>::new())?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let tcp = tokio::net::TcpStream::connect(("127.0.0.1", server.port())).await?;
            let tls = connector.connect(server_name, tcp).await?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
            tokio::spawn(connection);
            let response = sender.send_request(request).await?;
            let code = response.status().as_u16();
            let content_type = response.headers().get(hyper::header::CONTENT_TYPE).cloned();
            anyhow::ensure!(
                content_type.as_ref().map(|v| v.as_bytes()) == Some(b"application/json".as_ref()),
                "content type {content_type:?}"
            );
            let body = response.into_body().collect().await?.to_bytes();
            Ok((code, serde_json::from_slice(&body)?))
        })
    }

    fn get(
        server: &AggregatedServer,
        client: Option<&ClientIdentity>,
        path: &str,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<(u16, Value)> {
        get_as(server, "127.0.0.1", client, path, headers)
    }

    fn only_request(server: &AggregatedServer) -> anyhow::Result<SeenRequest> {
        let mut requests = server.requests();
        anyhow::ensure!(requests.len() == 1, "requests: {requests:?}");
        requests.pop().context("no request")
    }

    fn assert_anonymous(seen: &SeenRequest) {
        assert_eq!(seen.user, "system:anonymous");
        assert_eq!(seen.groups, vec!["system:unauthenticated".to_string()]);
        assert!(seen.extra.is_empty(), "{seen:?}");
    }

    fn assert_forbidden(code: u16, body: &Value) {
        assert_eq!(code, 403, "{body}");
        assert_eq!(body["kind"], "Status");
        assert_eq!(body["apiVersion"], "v1");
        assert_eq!(body["status"], "Failure");
        assert_eq!(body["reason"], "Forbidden");
        assert_eq!(body["code"], 403);
    }

    const DEFAULT_PODS: &str = "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods?limit=5";

    fn server_with_pods(ca: &TestCa, allowed_names: &str) -> anyhow::Result<AggregatedServer> {
        let server = AggregatedServer::start(
            "127.0.0.1",
            &["metrics-server.kube-system.svc"],
            &authentication(ca, allowed_names),
        )?;
        server.set_pods(&[("default", "web"), ("default", "db"), ("other", "job")]);
        Ok(server)
    }

    #[test]
    fn the_front_proxy_asserts_the_callers_identity() -> anyhow::Result<()> {
        let front_proxy = TestCa::new("front-proxy-ca")?;
        let server = server_with_pods(&front_proxy, "[\"front-proxy-client\"]")?;
        let client = front_proxy.client("front-proxy-client")?;
        let (code, body) = get(&server, Some(&client), DEFAULT_PODS, ALICE)?;
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["kind"], "PodMetricsList");
        assert_eq!(body["apiVersion"], "metrics.k8s.io/v1beta1");
        let names: Vec<&str> = body["items"]
            .as_array()
            .context("items")?
            .iter()
            .filter_map(|item| item["metadata"]["name"].as_str())
            .collect();
        assert_eq!(names, ["web", "db"]);
        let web = &body["items"][0];
        assert_eq!(web["metadata"]["namespace"], "default");
        assert_eq!(web["window"], "10s");
        assert_eq!(web["containers"][0]["name"], "main");
        assert_eq!(web["containers"][0]["usage"]["cpu"], "100m");
        assert_eq!(web["containers"][0]["usage"]["memory"], "64Mi");
        assert!(web["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')));

        let seen = only_request(&server)?;
        assert_eq!(seen.method, "GET");
        assert_eq!(seen.path_and_query, DEFAULT_PODS);
        assert_eq!(seen.user, "alice");
        assert_eq!(seen.groups, ["developers", "system:authenticated"]);
        assert_eq!(
            seen.extra,
            BTreeMap::from([
                (
                    "scopes".to_string(),
                    vec!["view".to_string(), "edit".to_string()]
                ),
                ("example.com/team".to_string(), vec!["blue".to_string()]),
            ])
        );
        assert_eq!(seen.client_cn.as_deref(), Some("front-proxy-client"));
        assert_eq!(seen.authorization_header.as_deref(), Some("Bearer leaked"));
        Ok(())
    }

    #[test]
    fn without_a_client_certificate_the_headers_are_ignored() -> anyhow::Result<()> {
        let front_proxy = TestCa::new("front-proxy-ca")?;
        let server = server_with_pods(&front_proxy, "[\"front-proxy-client\"]")?;
        let (code, body) = get(&server, None, DEFAULT_PODS, ALICE)?;
        assert_forbidden(code, &body);
        assert_eq!(
            body["message"],
            "pods.metrics.k8s.io is forbidden: User \"system:anonymous\" cannot list resource \
             \"pods\" in API group \"metrics.k8s.io\" in the namespace \"default\""
        );
        let seen = only_request(&server)?;
        assert_anonymous(&seen);
        assert_eq!(seen.client_cn, None);
        Ok(())
    }

    #[test]
    fn a_certificate_from_another_ca_is_anonymous() -> anyhow::Result<()> {
        let front_proxy = TestCa::new("front-proxy-ca")?;
        let impostor = TestCa::new("front-proxy-ca")?;
        let server = server_with_pods(&front_proxy, "[\"front-proxy-client\"]")?;
        let client = impostor.client("front-proxy-client")?;
        let (code, body) = get(&server, Some(&client), DEFAULT_PODS, ALICE)?;
        assert_forbidden(code, &body);
        let seen = only_request(&server)?;
        assert_anonymous(&seen);
        // Presented, so recorded, but not trusted.
        assert_eq!(seen.client_cn.as_deref(), Some("front-proxy-client"));
        Ok(())
    }

    #[test]
    fn a_common_name_not_allowed_is_anonymous() -> anyhow::Result<()> {
        let front_proxy = TestCa::new("front-proxy-ca")?;
        let server = server_with_pods(&front_proxy, "[\"front-proxy-client\"]")?;
        let client = front_proxy.client("some-other-client")?;
        let (code, body) = get(&server, Some(&client), DEFAULT_PODS, ALICE)?;
        assert_forbidden(code, &body);
        let seen = only_request(&server)?;
        assert_anonymous(&seen);
        assert_eq!(seen.client_cn.as_deref(), Some("some-other-client"));
        Ok(())
    }

    #[test]
    fn no_allowed_names_allows_any_common_name() -> anyhow::Result<()> {
        let front_proxy = TestCa::new("front-proxy-ca")?;
        let server = server_with_pods(&front_proxy, "[]")?;
        let client = front_proxy.client("any-proxy")?;
        let (code, body) = get(&server, Some(&client), DEFAULT_PODS, ALICE)?;
        assert_eq!(code, 200, "{body}");
        assert_eq!(only_request(&server)?.user, "alice");
        Ok(())
    }

    #[test]
    fn a_trusted_proxy_without_a_user_header_is_anonymous() -> anyhow::Result<()> {
        let front_proxy = TestCa::new("front-proxy-ca")?;
        let server = server_with_pods(&front_proxy, "[\"front-proxy-client\"]")?;
        let client = front_proxy.client("front-proxy-client")?;
        let headers = [("X-Remote-User", " "), ("X-Remote-Group", "developers")];
        let (code, body) = get(&server, Some(&client), DEFAULT_PODS, &headers)?;
        assert_forbidden(code, &body);
        assert_anonymous(&only_request(&server)?);
        Ok(())
    }

    #[test]
    fn discovery_is_open_to_anonymous_callers() -> anyhow::Result<()> {
        let front_proxy = TestCa::new("front-proxy-ca")?;
        let server = server_with_pods(&front_proxy, "[\"front-proxy-client\"]")?;
        // The serving certificate is valid for the Service name too.
        let (code, body) = get_as(
            &server,
            "metrics-server.kube-system.svc",
            None,
            "/apis/metrics.k8s.io/v1beta1",
            &[],
        )?;
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["kind"], "APIResourceList");
        assert_eq!(body["groupVersion"], "metrics.k8s.io/v1beta1");
        assert_eq!(
            body["resources"],
            json!([
                {"name": "nodes", "singularName": "", "namespaced": false, "kind": "NodeMetrics",
                 "verbs": ["get", "list"]},
                {"name": "pods", "singularName": "", "namespaced": true, "kind": "PodMetrics",
                 "verbs": ["get", "list"]},
            ])
        );
        let (code, body) = get(&server, None, "/apis/metrics.k8s.io", &[])?;
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["preferredVersion"]["version"], "v1beta1");
        Ok(())
    }

    #[test]
    fn nodes_pods_and_unknown_paths() -> anyhow::Result<()> {
        let front_proxy = TestCa::new("front-proxy-ca")?;
        let server = server_with_pods(&front_proxy, "[\"front-proxy-client\"]")?;
        server.set_nodes(&["node-a", "node-b"]);
        let client = front_proxy.client("front-proxy-client")?;
        let alice = Some(&client);

        let (code, body) = get(&server, alice, "/apis/metrics.k8s.io/v1beta1/nodes", ALICE)?;
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["kind"], "NodeMetricsList");
        assert_eq!(body["items"][1]["metadata"]["name"], "node-b");
        assert_eq!(
            body["items"][1]["usage"],
            json!({"cpu": "250m", "memory": "512Mi"})
        );

        let (code, body) = get(
            &server,
            alice,
            "/apis/metrics.k8s.io/v1beta1/nodes/node-a",
            ALICE,
        )?;
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["kind"], "NodeMetrics");
        assert_eq!(body["apiVersion"], "metrics.k8s.io/v1beta1");

        let (code, body) = get(
            &server,
            alice,
            "/apis/metrics.k8s.io/v1beta1/nodes/node-z",
            ALICE,
        )?;
        assert_eq!(code, 404, "{body}");
        assert_eq!(body["reason"], "NotFound");

        let (code, body) = get(&server, alice, "/apis/metrics.k8s.io/v1beta1/pods", ALICE)?;
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["items"].as_array().map(Vec::len), Some(3));

        let (code, body) = get(
            &server,
            alice,
            "/apis/metrics.k8s.io/v1beta1/namespaces/other/pods/job",
            ALICE,
        )?;
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["kind"], "PodMetrics");
        assert_eq!(body["metadata"]["namespace"], "other");

        let (code, body) = get(
            &server,
            alice,
            "/apis/metrics.k8s.io/v1beta1/namespaces/other/pods/web",
            ALICE,
        )?;
        assert_eq!(code, 404, "{body}");

        let (code, body) = get(&server, alice, "/api/v1/pods", ALICE)?;
        assert_eq!(code, 404, "{body}");
        assert_eq!(body["kind"], "Status");

        let (code, body) = get(&server, None, "/apis/metrics.k8s.io/v1beta1/nodes/x", &[])?;
        assert_forbidden(code, &body);
        assert_eq!(server.requests().len(), 8);
        Ok(())
    }

    #[test]
    fn routes() {
        assert_eq!(Route::parse("/apis/metrics.k8s.io"), Route::GroupDiscovery);
        assert_eq!(
            Route::parse("/apis/metrics.k8s.io/v1beta1"),
            Route::VersionDiscovery
        );
        assert_eq!(
            Route::parse("/apis/metrics.k8s.io/v1beta1/namespaces/ns/pods"),
            Route::PodList(Some("ns".to_string()))
        );
        for unknown in [
            "/apis/metrics.k8s.iox",
            "/apis/metrics.k8s.io/v1beta1/",
            "/apis/metrics.k8s.io/v1/nodes",
            "/apis/metrics.k8s.io/v1beta1/nodes//",
            "/apis/metrics.k8s.io/v1beta1/namespaces/ns/pods/p/log",
        ] {
            assert_eq!(Route::parse(unknown), Route::Unknown, "{unknown}");
        }
    }

    #[test]
    fn timestamps_are_rfc3339_utc() -> anyhow::Result<()> {
        let at = time::OffsetDateTime::from_unix_timestamp(1_700_000_000)?;
        assert_eq!(rfc3339(at), "2023-11-14T22:13:20Z");
        Ok(())
    }

    #[test]
    fn extra_keys_are_unescaped() {
        assert_eq!(unescape_extra_key("example.com%2fteam"), "example.com/team");
        assert_eq!(unescape_extra_key("scopes"), "scopes");
        assert_eq!(unescape_extra_key("bad%2"), "bad%2");
        assert_eq!(unescape_extra_key("bad%zz"), "bad%zz");
    }

    #[test]
    fn malformed_authentication_data_is_refused() -> anyhow::Result<()> {
        let ca = TestCa::new("front-proxy-ca")?;
        let mut data = authentication(&ca, "[\"front-proxy-client\"]");
        data["requestheader-group-headers"] = json!("X-Remote-Group");
        assert!(AggregatedServer::start("127.0.0.1", &[], &data).is_err());
        let mut data = authentication(&ca, "[]");
        data["requestheader-client-ca-file"] = json!("not a certificate");
        assert!(AggregatedServer::start("127.0.0.1", &[], &data).is_err());
        assert!(AggregatedServer::start("127.0.0.1", &[], &json!({})).is_err());
        Ok(())
    }
}
