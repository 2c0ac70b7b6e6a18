//! The kubelet's HTTPS server (upstream `pkg/kubelet/server`): TLS on `--port` with a
//! self-signed serving certificate unless one is given, client certificates verified against
//! the cluster's client CA, every request authorized by a SubjectAccessReview on
//! `nodes/<subresource>` (upstream's webhook authorizer; anonymous → 401), and the endpoints
//! the API server proxies to: `/containerLogs/{ns}/{pod}/{container}` here, `/exec`,
//! `/attach` and `/portForward` in [`crate::streaming`]; `/healthz` is open.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, PostParams};
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::net::TcpListener;
use tokio::sync::{Mutex, mpsc};

use crate::cri::Cri;
use crate::logs::{self, Flow, LogOptions, LogWriter};

/// Where the API server publishes a cluster's client CA (upstream's
/// `kube-system/extension-apiserver-authentication`, key `client-ca-file`).
pub const CLIENT_CA_CONFIGMAP: (&str, &str, &str) = (
    "kube-system",
    "extension-apiserver-authentication",
    "client-ca-file",
);

/// How long an allowed SubjectAccessReview is reused (upstream's webhook cache keeps
/// allowed answers 5 min, denied 30 s; shorter here, so RBAC changes show quickly).
const ALLOWED_TTL: Duration = Duration::from_secs(60);
const DENIED_TTL: Duration = Duration::from_secs(10);
/// How often a followed log is read again when nothing new was there.
const FOLLOW_POLL: Duration = Duration::from_millis(200);
/// How often a followed log checks whether its container still runs.
const FOLLOW_STATUS_EVERY: Duration = Duration::from_secs(1);

/// A response body: whole or streamed.
pub type Body = BoxBody<Bytes, std::io::Error>;

/// Failures setting the server up.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A certificate or key could not be read or made.
    #[error("kubelet serving certificate: {0}")]
    Certificate(String),
    /// The client CA could not be read.
    #[error("client CA: {0}")]
    ClientCa(String),
    /// rustls refused the configuration.
    #[error("tls configuration: {0}")]
    Tls(#[from] rustls::Error),
    /// The listener could not be bound.
    #[error("binding {address}: {source}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// How the server is set up (upstream flags).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// `--address`:`--port` (port 0 picks a free one).
    pub address: SocketAddr,
    /// `--tls-cert-file` and `--tls-private-key-file`.
    pub tls_files: Option<(PathBuf, PathBuf)>,
    /// A serving pair the cluster issued (certificate, key; PEM), used without files; a
    /// self-signed pair when neither is there (the API server then refuses to talk to it).
    pub issued: Option<(String, String)>,
    /// `--client-ca-file`; when absent the cluster's published client CA is read.
    pub client_ca_file: Option<PathBuf>,
    /// Names for the self-signed certificate (node name, node IP).
    pub hostnames: Vec<String>,
}

/// What the handlers share.
pub struct KubeletServer {
    /// The node's API client (pods, SubjectAccessReviews).
    pub client: kube::Client,
    /// The runtime.
    pub cri: Cri,
    /// The Node's name (the `name` of every SubjectAccessReview).
    pub node_name: String,
    /// The latest usage sample (`/stats/summary`, `/metrics/resource`).
    pub stats: Arc<crate::stats::Stats>,
    decisions: Mutex<HashMap<String, (bool, Instant)>>,
}

/// The user a client certificate names (CN → user, O → groups).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The user.
    pub user: String,
    /// The groups.
    pub groups: Vec<String>,
}

/// Upstream's kubelet request attributes: `nodes/<subresource>` with the verb of the method.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    /// `get`, `create`, …
    pub verb: &'static str,
    /// `proxy`, `log`, `stats`, `metrics`, …
    pub subresource: &'static str,
}

/// The attributes a request to `path` with `method` is authorized with (upstream
/// `GetRequestAttributes`: everything is `nodes/proxy` but a few prefixes).
pub fn request_attributes(method: &Method, path: &str) -> Attributes {
    let verb = match *method {
        Method::POST => "create",
        Method::GET | Method::HEAD => "get",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    };
    let under = |prefix: &str| path == prefix || path.starts_with(&format!("{prefix}/"));
    let subresource = if under("/stats") {
        "stats"
    } else if under("/metrics") {
        "metrics"
    } else if under("/logs") {
        "log"
    } else if under("/spec") {
        "spec"
    } else {
        "proxy"
    };
    Attributes { verb, subresource }
}

/// A plain-text answer (the kubelet answers errors as text; the API server wraps them).
pub fn text(code: StatusCode, message: impl Into<String>) -> Response<Body> {
    let mut response = Response::new(full(Bytes::from(message.into())));
    *response.status_mut() = code;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// A whole body.
pub fn full(bytes: Bytes) -> Body {
    Full::new(bytes).map_err(|never| match never {}).boxed()
}

/// The client CA bundle (PEM): `--client-ca-file`, else what the API server publishes.
pub async fn client_ca(
    client: &kube::Client,
    file: Option<&PathBuf>,
) -> Result<String, ServerError> {
    if let Some(file) = file {
        return std::fs::read_to_string(file)
            .map_err(|err| ServerError::ClientCa(format!("{}: {err}", file.display())));
    }
    let (namespace, name, key) = CLIENT_CA_CONFIGMAP;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let config_map = config_maps
        .get(name)
        .await
        .map_err(|err| ServerError::ClientCa(format!("reading {namespace}/{name}: {err}")))?;
    config_map
        .data
        .and_then(|mut data| data.remove(key))
        .ok_or_else(|| ServerError::ClientCa(format!("{namespace}/{name} has no {key}")))
}

/// The rustls configuration: the serving pair (given, issued or self-signed) and client
/// certificates verified against `client_ca_pem`, optional at the TLS level so that an
/// anonymous request gets its 401 from HTTP.
pub fn tls_config(
    config: &ServerConfig,
    client_ca_pem: &str,
) -> Result<Arc<rustls::ServerConfig>, ServerError> {
    let (cert_pem, key_pem) = match &config.tls_files {
        Some((cert, key)) => (
            std::fs::read_to_string(cert)
                .map_err(|e| ServerError::Certificate(format!("{}: {e}", cert.display())))?,
            std::fs::read_to_string(key)
                .map_err(|e| ServerError::Certificate(format!("{}: {e}", key.display())))?,
        ),
        None => match &config.issued {
            Some(pair) => pair.clone(),
            None => self_signed(&config.hostnames)?,
        },
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| ServerError::Certificate(e.to_string()))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| ServerError::Certificate(e.to_string()))?;
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(client_ca_pem.as_bytes()) {
        let ca = ca.map_err(|e| ServerError::ClientCa(e.to_string()))?;
        roots
            .add(ca)
            .map_err(|e| ServerError::ClientCa(e.to_string()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(|e| ServerError::ClientCa(e.to_string()))?;
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)?;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(tls))
}

/// A self-signed serving pair for `hostnames` (upstream writes `kubelet.crt` the same way
/// when no certificate is given).
fn self_signed(hostnames: &[String]) -> Result<(String, String), ServerError> {
    let bad = |e: rcgen::Error| ServerError::Certificate(e.to_string());
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        hostnames.first().cloned().unwrap_or_default(),
    );
    for host in hostnames {
        params.subject_alt_names.push(match host.parse::<IpAddr>() {
            Ok(ip) => rcgen::SanType::IpAddress(ip),
            Err(_) => rcgen::SanType::DnsName(host.clone().try_into().map_err(bad)?),
        });
    }
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = rcgen::KeyPair::generate().map_err(bad)?;
    let cert = params.self_signed(&key).map_err(bad)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// The identity of a verified client certificate.
fn identity(der: &[u8]) -> Option<Identity> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let user = subject
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Some(Identity { user, groups })
}

impl KubeletServer {
    /// A server for the node `node_name`.
    pub fn new(
        client: kube::Client,
        cri: Cri,
        node_name: String,
        stats: Arc<crate::stats::Stats>,
    ) -> Arc<Self> {
        Arc::new(KubeletServer {
            client,
            cri,
            node_name,
            stats,
            decisions: Mutex::new(HashMap::new()),
        })
    }

    /// Whether `identity` may do `attributes` on this node, by SubjectAccessReview.
    async fn authorize(&self, identity: &Identity, attributes: &Attributes) -> bool {
        let key = format!(
            "{}|{}|{}|{}",
            identity.user,
            identity.groups.join(","),
            attributes.verb,
            attributes.subresource
        );
        if let Some((allowed, at)) = self.decisions.lock().await.get(&key).copied() {
            let ttl = if allowed { ALLOWED_TTL } else { DENIED_TTL };
            if at.elapsed() < ttl {
                return allowed;
            }
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(identity.user.clone()),
                groups: Some(identity.groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(attributes.verb.to_string()),
                    version: Some("v1".into()),
                    resource: Some("nodes".into()),
                    subresource: Some(attributes.subresource.to_string()),
                    name: Some(self.node_name.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let reviews: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let allowed = match reviews.create(&PostParams::default(), &review).await {
            Ok(answer) => answer.status.is_some_and(|s| s.allowed),
            Err(err) => {
                // Not remembered: the next request asks again.
                tracing::warn!(%err, "SubjectAccessReview failed");
                return false;
            }
        };
        self.decisions
            .lock()
            .await
            .insert(key, (allowed, Instant::now()));
        allowed
    }

    /// One request, after TLS.
    pub async fn handle(
        self: Arc<Self>,
        peer: Option<Identity>,
        request: Request<Incoming>,
    ) -> Response<Body> {
        let path = request.uri().path().to_string();
        if path == "/healthz" {
            return text(StatusCode::OK, "ok");
        }
        let Some(identity) = peer else {
            return text(StatusCode::UNAUTHORIZED, "Unauthorized");
        };
        let attributes = request_attributes(request.method(), &path);
        if !self.authorize(&identity, &attributes).await {
            return text(
                StatusCode::FORBIDDEN,
                format!(
                    "Forbidden (user={}, verb={}, resource=nodes, subresource={})",
                    identity.user, attributes.verb, attributes.subresource
                ),
            );
        }
        let query: HashMap<String, String> =
            form_urlencoded::parse(request.uri().query().unwrap_or("").as_bytes())
                .into_owned()
                .collect();
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        match (request.method(), segments.as_slice()) {
            (&Method::GET, ["containerLogs", namespace, pod, container]) => {
                self.container_logs(namespace, pod, container, &query).await
            }
            (_, ["exec" | "attach", namespace, pod, container]) => {
                let attach = segments[0] == "attach";
                crate::streaming::exec_or_attach(
                    self.clone(),
                    namespace,
                    pod,
                    container,
                    attach,
                    request,
                )
                .await
            }
            (_, ["portForward", namespace, pod]) => {
                crate::streaming::port_forward(self.clone(), namespace, pod, request).await
            }
            (&Method::GET, ["stats", "summary"]) => {
                let proc_stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
                let summary = crate::stats::summary(
                    &self.node_name,
                    crate::stats::boot_nanos(&proc_stat),
                    &self.stats.latest(),
                );
                let mut response = text(StatusCode::OK, summary.to_string());
                response.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/json"),
                );
                response
            }
            (&Method::GET, ["metrics", "resource"]) => {
                let mut response = text(
                    StatusCode::OK,
                    crate::stats::resource_metrics(&self.stats.latest()),
                );
                response.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                );
                response
            }
            _ => text(StatusCode::NOT_FOUND, "404 page not found"),
        }
    }

    /// The pod `namespace/name` if it is bound to this node.
    pub async fn pod(&self, namespace: &str, name: &str) -> Result<Pod, Response<Body>> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        match pods.get_opt(name).await {
            Ok(Some(mut pod))
                if pod.spec.as_ref().and_then(|s| s.node_name.as_deref())
                    == Some(self.node_name.as_str()) =>
            {
                // A mirror pod's containers run under its static pod's UID.
                if let Some(uid) = crate::static_pods::mirrored_uid(&pod) {
                    pod.metadata.uid = Some(uid.to_string());
                }
                Ok(pod)
            }
            Ok(_) => Err(text(
                StatusCode::NOT_FOUND,
                format!("pod \"{namespace}/{name}\" does not exist\n"),
            )),
            Err(err) => Err(text(StatusCode::INTERNAL_SERVER_ERROR, err.to_string())),
        }
    }

    async fn container_logs(
        &self,
        namespace: &str,
        pod_name: &str,
        container: &str,
        query: &HashMap<String, String>,
    ) -> Response<Body> {
        let options = match LogOptions::from_query(query, chrono::Utc::now()) {
            Ok(options) => options,
            Err(err) => return text(StatusCode::BAD_REQUEST, err.to_string()),
        };
        let pod = match self.pod(namespace, pod_name).await {
            Ok(pod) => pod,
            Err(response) => return response,
        };
        let has_container = pod.spec.as_ref().is_some_and(|spec| {
            spec.containers
                .iter()
                .chain(spec.init_containers.iter().flatten())
                .any(|c| c.name == container)
                || spec
                    .ephemeral_containers
                    .iter()
                    .flatten()
                    .any(|c| c.name == container)
        });
        if !has_container {
            return text(
                StatusCode::NOT_FOUND,
                format!("container {container:?} not found in pod \"{namespace}/{pod_name}\"\n"),
            );
        }
        let id = match logs::container_for_logs(&pod, container, options.previous) {
            Ok(id) => id,
            Err(message) => return text(StatusCode::BAD_REQUEST, message),
        };
        let mut cri = self.cri.clone();
        let path = match cri.container_status(&id).await {
            Ok(Some(status)) if !status.log_path.is_empty() => status.log_path,
            Ok(_) => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("container {container:?} in pod {pod_name:?} has no log"),
                );
            }
            Err(err) => return text(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()),
        };
        let (sender, receiver) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(16);
        tokio::spawn(stream_log(cri, id, PathBuf::from(path), options, sender));
        let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(receiver));
        let mut response = Response::new(BodyExt::boxed(body));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain"),
        );
        response
    }
}

/// Sends the selected part of a CRI log file, then (when following) what is appended until
/// the container stops or the client goes away.
async fn stream_log(
    mut cri: Cri,
    id: String,
    path: PathBuf,
    options: LogOptions,
    sender: mpsc::Sender<Result<Frame<Bytes>, std::io::Error>>,
) {
    let send = |out: Vec<u8>| {
        let sender = sender.clone();
        async move {
            if out.is_empty() {
                return true;
            }
            sender.send(Ok(Frame::data(Bytes::from(out)))).await.is_ok()
        }
    };
    let mut file = match tokio::fs::File::open(&path).await {
        Ok(file) => file,
        Err(err) => {
            let _ = sender.send(Err(err)).await;
            return;
        }
    };
    let mut content = Vec::new();
    if let Err(err) = file.read_to_end(&mut content).await {
        let _ = sender.send(Err(err)).await;
        return;
    }
    let mut position = content.len() as u64;
    let start = logs::tail_start(&content, options.tail);
    let mut buffer = content.split_off(start);
    let mut writer = LogWriter::new(&options);
    let mut out = Vec::new();
    let flow = writer.lines(&mut buffer, &mut out);
    if !send(out).await || flow == Flow::Done || !options.follow {
        return;
    }
    let mut checked = Instant::now();
    loop {
        let mut chunk = Vec::new();
        let read = match file.seek(std::io::SeekFrom::Start(position)).await {
            Ok(_) => file.read_to_end(&mut chunk).await,
            Err(err) => Err(err),
        };
        let read = match read {
            Ok(read) => read,
            Err(err) => {
                let _ = sender.send(Err(err)).await;
                return;
            }
        };
        if read > 0 {
            position += read as u64;
            buffer.extend_from_slice(&chunk);
            let mut out = Vec::new();
            let flow = writer.lines(&mut buffer, &mut out);
            if !send(out).await || flow == Flow::Done {
                return;
            }
            continue;
        }
        if sender.is_closed() {
            return;
        }
        if checked.elapsed() >= FOLLOW_STATUS_EVERY {
            checked = Instant::now();
            let running = matches!(
                cri.container_status(&id).await,
                Ok(Some(status)) if status.state == k8s_cri::v1::ContainerState::ContainerRunning as i32
            );
            if !running {
                // One last read catches what was written just before it stopped.
                let mut rest = Vec::new();
                if file.seek(std::io::SeekFrom::Start(position)).await.is_ok()
                    && file.read_to_end(&mut rest).await.is_ok()
                {
                    buffer.extend_from_slice(&rest);
                    let mut out = Vec::new();
                    writer.lines(&mut buffer, &mut out);
                    send(out).await;
                }
                return;
            }
        }
        tokio::time::sleep(FOLLOW_POLL).await;
    }
}

/// Serves HTTPS on `listener` until the process ends.
pub async fn serve(
    server: Arc<KubeletServer>,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(pair) => pair,
            Err(err) => {
                tracing::warn!(%err, "kubelet server: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let server = server.clone();
        tokio::spawn(async move {
            let tls = match acceptor.accept(stream).await {
                Ok(tls) => tls,
                Err(err) => {
                    tracing::debug!(%peer, %err, "kubelet server: tls handshake failed");
                    return;
                }
            };
            let who = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(|leaf| identity(leaf));
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let server = server.clone();
                let who = who.clone();
                async move { Ok::<_, std::convert::Infallible>(server.handle(who, request).await) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .with_upgrades();
            if let Err(err) = connection.await {
                tracing::debug!(%peer, %err, "kubelet server: connection ended with an error");
            }
        });
    }
}

/// Binds `config.address`.
pub async fn bind(config: &ServerConfig) -> Result<TcpListener, ServerError> {
    TcpListener::bind(config.address)
        .await
        .map_err(|source| ServerError::Bind {
            address: config.address,
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_map_to_node_subresources_as_upstream() {
        let cases = [
            (Method::GET, "/containerLogs/ns/p/c", "get", "proxy"),
            (Method::POST, "/exec/ns/p/c", "create", "proxy"),
            (Method::GET, "/exec/ns/p/c", "get", "proxy"),
            (Method::POST, "/portForward/ns/p", "create", "proxy"),
            (Method::GET, "/logs/syslog", "get", "log"),
            (Method::GET, "/logs", "get", "log"),
            (Method::GET, "/logsx", "get", "proxy"),
            (Method::GET, "/stats/summary", "get", "stats"),
            (Method::GET, "/metrics", "get", "metrics"),
            (Method::GET, "/spec/", "get", "spec"),
        ];
        for (method, path, verb, subresource) in cases {
            assert_eq!(
                request_attributes(&method, path),
                Attributes { verb, subresource },
                "{method} {path}"
            );
        }
    }

    #[test]
    fn self_signed_certificates_name_the_node() {
        let (cert, key) = self_signed(&["n1".into(), "10.0.0.1".into()]).expect("self-signed pair");
        assert!(cert.contains("BEGIN CERTIFICATE") && key.contains("PRIVATE KEY"));
        let der = CertificateDer::from_pem_slice(cert.as_bytes()).expect("pem");
        let (_, parsed) = x509_parser::parse_x509_certificate(&der).expect("x509");
        let names = format!("{:?}", parsed.subject_alternative_name());
        assert!(
            names.contains("DNSName(\"n1\")") && names.contains("IPAddress([10, 0, 0, 1])"),
            "{names}"
        );
    }

    #[test]
    fn client_certificates_name_user_and_groups() {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::default();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kube-apiserver-kubelet-client");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:masters");
        let cert = params.self_signed(&key).expect("cert");
        assert_eq!(
            identity(cert.der()),
            Some(Identity {
                user: "kube-apiserver-kubelet-client".into(),
                groups: vec!["system:masters".into()],
            })
        );
    }
}
