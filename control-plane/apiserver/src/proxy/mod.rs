//! The `proxy` subresources of pods, services and nodes (upstream's `ProxyREST` of
//! `pkg/registry/core/{pod,service,node}/rest`, their `ResourceLocation`s, and apimachinery's
//! `UpgradeAwareHandler` with its URL-rewriting proxy `Transport`): `[scheme:]name[:port]` is
//! found to an address — a pod's IP, a ready endpoint of a Service through its EndpointSlices,
//! a Node's kubelet or another port on the node — that is dialled only inside the node
//! networks; the request goes on without the caller's credentials, its body streamed; the
//! answer streams back without hop-by-hop and CORS headers, a redirect to the backend moved
//! under the proxy's path; an upgrade request is spliced byte for byte once the backend
//! switched protocols. Links inside an HTML answer (plain or gzipped, up to
//! [`MAX_REWRITTEN_HTML`]) are moved under the proxy's path too (`html`).

mod html;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, header};
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use serde_json::{Value, json};

use crate::ApiServer;
use crate::error::ApiError;
use crate::meta;
use crate::outbound::{owned_slices, ready_endpoints};
use crate::store::{ListOptions, ReadAt};
use crate::tenants::TenantState;

/// How long reaching a backend (TCP, then TLS) may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// How much of an HTML answer (decompressed, too) is read to move its links: a larger one
/// passes as it came. Upstream reads any size; one tenant's page must not hold the memory
/// every tenant is served from.
pub const MAX_REWRITTEN_HTML: usize = 8 << 20;

/// Request and response headers that belong to one hop (Go's `httputil.ReverseProxy` list).
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The CORS headers upstream's `corsRemovingTransport` drops from answers: a backend must
/// not open the API server's origin to other sites.
const CORS: [&str; 4] = [
    "access-control-allow-credentials",
    "access-control-allow-headers",
    "access-control-allow-methods",
    "access-control-allow-origin",
];

/// Whose `proxy` subresource a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyKind {
    /// `pods/proxy`: the pod's IP.
    Pod,
    /// `services/proxy`: a ready endpoint of the Service.
    Service,
    /// `nodes/proxy`: the node's kubelet, or another port on the node.
    Node,
}

impl ProxyKind {
    fn plural(self) -> &'static str {
        match self {
            ProxyKind::Pod => "pods",
            ProxyKind::Service => "services",
            ProxyKind::Node => "nodes",
        }
    }

    fn singular(self) -> &'static str {
        match self {
            ProxyKind::Pod => "pod",
            ProxyKind::Service => "service",
            ProxyKind::Node => "node",
        }
    }

    /// The options kind admission sees (upstream's `NewConnectOptions`).
    fn options_kind(self) -> &'static str {
        match self {
            ProxyKind::Pod => "PodProxyOptions",
            ProxyKind::Service => "ServiceProxyOptions",
            ProxyKind::Node => "NodeProxyOptions",
        }
    }
}

/// A proxy request, read from its path.
#[derive(Debug, PartialEq, Eq)]
pub struct ProxyTarget<'a> {
    /// Whose proxy.
    pub kind: ProxyKind,
    /// The namespace (`""` for nodes).
    pub namespace: &'a str,
    /// `[scheme:]name[:port]` as the path gives it.
    pub id: &'a str,
    /// What follows `proxy`, with a leading slash when not empty and the request's trailing
    /// slash (upstream's `getRequestOptions` subpath: the options' `path`).
    pub subpath: String,
    /// The request's path up to and including `proxy`: where redirects are moved under.
    pub prefix: String,
}

/// The proxy request `rest` names (a tenant's path after `/clusters/{id}`, split), `path`
/// being the whole decoded request path `rest` is the tail of; `None` for any other request.
pub fn proxy_target<'a>(path: &str, rest: &[&'a str]) -> Option<ProxyTarget<'a>> {
    let (kind, namespace, id, tail) = match rest {
        [
            "api",
            "v1",
            "namespaces",
            namespace,
            plural @ ("pods" | "services"),
            id,
            "proxy",
            tail @ ..,
        ] => {
            let kind = if *plural == "pods" {
                ProxyKind::Pod
            } else {
                ProxyKind::Service
            };
            (kind, *namespace, *id, tail)
        }
        ["api", "v1", "nodes", id, "proxy", tail @ ..] => (ProxyKind::Node, "", *id, tail),
        _ => return None,
    };
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let kept = segments.len().checked_sub(tail.len())?;
    let prefix = escape_path(&format!("/{}", segments[..kept].join("/")));
    let mut subpath = if tail.is_empty() {
        String::new()
    } else {
        format!("/{}", tail.join("/"))
    };
    if path.ends_with('/') && !subpath.ends_with('/') {
        subpath.push('/');
    }
    Some(ProxyTarget {
        kind,
        namespace,
        id,
        subpath,
        prefix,
    })
}

/// `[scheme:]name[:port]`, split (upstream `SplitSchemeNamePort`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemeNamePort<'a> {
    /// `""`, `http` or `https`.
    pub scheme: &'a str,
    /// Never empty.
    pub name: &'a str,
    /// A number, a port name, or `""`.
    pub port: &'a str,
}

/// Splits `name`, `name:port` or `scheme:name:port`; `None` when the name is empty, the
/// scheme is neither `http` nor `https`, or there are more parts.
pub fn split_scheme_name_port(id: &str) -> Option<SchemeNamePort<'_>> {
    let parts: Vec<&str> = id.split(':').collect();
    let (scheme, name, port) = match parts.as_slice() {
        [name] => ("", *name, ""),
        [name, port] => ("", *name, *port),
        [scheme, name, port] => (*scheme, *name, *port),
        _ => return None,
    };
    (!name.is_empty() && matches!(scheme, "" | "http" | "https")).then_some(SchemeNamePort {
        scheme,
        name,
        port,
    })
}

/// What Go's dialer answers for a port that is no number (upstream passes names on to it).
fn unknown_port(port: &str) -> ApiError {
    ApiError::service_unavailable(format!(
        "error trying to reach service: dial tcp: lookup tcp/{port}: unknown port"
    ))
}

/// Upstream's refusal of an address the API server must not dial.
fn address_not_allowed() -> ApiError {
    ApiError::bad_request("address not allowed")
}

/// A pod's address (upstream `getPodIP`: the first of `status.podIPs`; `status.podIP` when a
/// writer set only that).
pub fn pod_ip(pod: &Value) -> Option<IpAddr> {
    meta::at(pod, &["status", "podIPs"])
        .and_then(Value::as_array)
        .and_then(|ips| ips.first())
        .and_then(|ip| ip["ip"].as_str())
        .or_else(|| meta::str_at(pod, &["status", "podIP"]))
        .and_then(|ip| ip.parse().ok())
}

/// The port a pod is proxied at (upstream `ResourceLocation`): the number given; a name
/// given, looked up among the pod's container ports (upstream leaves it to Go's resolver);
/// none given, the first port any container declares; `None` for the scheme's default.
pub fn pod_port(pod: &Value, port: &str) -> Result<Option<u16>, ApiError> {
    let declared = || {
        meta::at(pod, &["spec", "containers"])
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .flat_map(|c| c["ports"].as_array().into_iter().flatten())
    };
    let number = |p: &Value| {
        p["containerPort"]
            .as_u64()
            .and_then(|n| u16::try_from(n).ok())
    };
    if port.is_empty() {
        // Upstream takes the first container that declares ports, and its first port.
        return Ok(declared().next().and_then(number));
    }
    if let Ok(number) = port.parse::<u16>() {
        return Ok(Some(number));
    }
    declared()
        .find(|p| p["name"].as_str() == Some(port))
        .and_then(number)
        .map(Some)
        .ok_or_else(|| unknown_port(port))
}

/// The name of the Service port a request asks for (upstream: a number is looked up among
/// `spec.ports`, anything else is the name itself, `""` naming the unnamed port).
pub fn service_port_name(service: &Value, port: &str) -> Result<String, ApiError> {
    let Ok(number) = port.parse::<i64>() else {
        return Ok(port.to_string());
    };
    meta::at(service, &["spec", "ports"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|p| p["port"].as_i64() == Some(number))
        .map(|p| p["name"].as_str().unwrap_or("").to_string())
        .ok_or_else(|| {
            ApiError::service_unavailable(format!(
                "no service port {number} found for service {:?}",
                meta::name(service)
            ))
        })
}

/// `host:port` as Go's `net.JoinHostPort` writes it (IPv6 bracketed).
fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `path` with `.` and `..` resolved and empty segments dropped (Go's `path.Clean` of an
/// absolute path: nothing climbs above the root), always starting with `/`.
fn clean(path: &str) -> String {
    let mut kept: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                kept.pop();
            }
            other => kept.push(other),
        }
    }
    format!("/{}", kept.join("/"))
}

/// The path the backend is asked for (upstream: `path.Join` of the location and the subpath,
/// the request's trailing slash kept); `""` when the request named none.
pub fn backend_path(subpath: &str) -> String {
    if subpath.is_empty() {
        return String::new();
    }
    let mut path = clean(subpath);
    if subpath.ends_with('/') && !path.ends_with('/') {
        path.push('/');
    }
    path
}

/// A decoded path escaped as Go's `URL.EscapedPath` writes it: unreserved characters and
/// `$&+,/:;=@` as they are, every other byte percent-encoded.
pub fn escape_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for byte in path.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~$&+,/:;=@".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The scheme of a URL reference and what follows its colon, if it has one (RFC 3986: a
/// letter, then letters, digits, `+`, `-`, `.`).
fn split_scheme(reference: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = reference.split_once(':')?;
    let mut chars = scheme.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    valid.then_some((scheme, rest))
}

/// A backend's redirect as the caller is to follow it (upstream `Transport.rewriteURL`): an
/// absolute path, or a URL naming the backend (`backend_authority`) or the host the caller
/// asked (`request_host`), is moved under the proxy's `prefix` (unless already there);
/// anything else — another host, a relative reference — is left as it is.
pub fn rewrite_location(
    location: &str,
    prefix: &str,
    backend_authority: &str,
    request_host: &str,
) -> String {
    let (reference, fragment) = match location.find('#') {
        Some(at) => location.split_at(at),
        None => (location, ""),
    };
    let (reference, query) = match reference.find('?') {
        Some(at) => reference.split_at(at),
        None => (reference, ""),
    };
    let (scheme, rest) = match split_scheme(reference) {
        Some((scheme, rest)) => (scheme, rest),
        None => ("", reference),
    };
    let (host, path) = match rest.strip_prefix("//") {
        Some(authority_and_path) => {
            let end = authority_and_path
                .find('/')
                .unwrap_or(authority_and_path.len());
            authority_and_path.split_at(end)
        }
        None => ("", rest),
    };
    let other_host = !host.is_empty() && host != backend_authority && host != request_host;
    if other_host || !path.starts_with('/') {
        return location.to_string();
    }
    // The caller's own host stays (the link already leads back through the API server); the
    // backend's is dropped, leaving a path on the caller's host.
    let origin = if !host.is_empty() && host == request_host {
        if scheme.is_empty() {
            format!("//{host}")
        } else {
            format!("{scheme}://{host}")
        }
    } else {
        String::new()
    };
    let path = if path.starts_with(prefix) {
        path.to_string()
    } else {
        let mut joined = clean(&format!("{prefix}/{path}"));
        if path.ends_with('/') && !joined.ends_with('/') {
            joined.push('/');
        }
        joined
    };
    format!("{origin}{path}{query}{fragment}")
}

/// Removes hop-by-hop headers, and those the `Connection` header names.
fn remove_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Whether a request asks to switch protocols (upstream `httpstream.IsUpgradeRequest`).
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"))
}

/// The caller's headers as the backend gets them: without its credentials (upstream's
/// authentication and impersonation filters delete them once used), without hop-by-hop
/// headers unless it asks for an upgrade, and with the caller's address appended to
/// `X-Forwarded-For`.
pub fn backend_request_headers(
    incoming: &HeaderMap,
    upgrade: bool,
    client: Option<IpAddr>,
) -> HeaderMap {
    let mut headers = incoming.clone();
    headers.remove(header::AUTHORIZATION);
    let impersonation: Vec<HeaderName> = headers
        .keys()
        .filter(|name| name.as_str().starts_with("impersonate-"))
        .cloned()
        .collect();
    for name in impersonation {
        headers.remove(name);
    }
    if !upgrade {
        remove_hop_by_hop(&mut headers);
        // The API server's side of the connection already answered any `100-continue`.
        headers.remove(header::EXPECT);
    }
    if let Some(client) = client {
        let prior: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        let chain = if prior.is_empty() {
            client.to_string()
        } else {
            format!("{}, {client}", prior.join(", "))
        };
        if let Ok(value) = HeaderValue::from_str(&chain) {
            headers.insert("x-forwarded-for", value);
        }
    }
    headers
}

/// What a proxied answer's headers are checked against.
struct Rewrite<'a> {
    prefix: &'a str,
    backend_authority: &'a str,
    request_host: &'a str,
}

/// The backend's answer headers as the caller gets them.
fn answer_headers(headers: &mut HeaderMap, rewrite: &Rewrite<'_>) {
    remove_hop_by_hop(headers);
    for name in CORS {
        headers.remove(name);
    }
    let moved = headers
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(|location| {
            rewrite_location(
                location,
                rewrite.prefix,
                rewrite.backend_authority,
                rewrite.request_host,
            )
        });
    if let Some(value) = moved.and_then(|l| HeaderValue::from_str(&l).ok()) {
        headers.insert(header::LOCATION, value);
    }
}

/// Whether an answer is HTML whose links are moved (not a redirect, whose `Location` is the
/// one link upstream moves then), and whether it is gzipped; `None` for anything else,
/// including encodings this proxy does not read.
fn html_answer(headers: &HeaderMap) -> Option<bool> {
    if headers.contains_key(header::LOCATION) {
        return None;
    }
    let content_type = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    let media = content_type.split(';').next().unwrap_or("").trim();
    if !media.eq_ignore_ascii_case("text/html") {
        return None;
    }
    match headers
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("unreadable"))
    {
        None | Some("") | Some("identity") => Some(false),
        Some(encoding) if encoding.eq_ignore_ascii_case("gzip") => Some(true),
        Some(_) => None,
    }
}

/// `document` (gzipped when `gzip`) with its links moved, or `None` when it is not UTF-8
/// HTML this proxy can read within [`MAX_REWRITTEN_HTML`].
pub fn rewrite_document(
    document: &[u8],
    gzip: bool,
    rewrite: impl Fn(&str) -> String,
) -> Option<Vec<u8>> {
    use std::io::{Read, Write};
    let plain = if gzip {
        let mut plain = Vec::new();
        flate2::read::MultiGzDecoder::new(document)
            .take(MAX_REWRITTEN_HTML as u64 + 1)
            .read_to_end(&mut plain)
            .ok()?;
        if plain.len() > MAX_REWRITTEN_HTML {
            return None;
        }
        plain
    } else {
        document.to_vec()
    };
    let rewritten = html::rewrite_html(std::str::from_utf8(&plain).ok()?, rewrite);
    if !gzip {
        return Some(rewritten.into_bytes());
    }
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(rewritten.as_bytes()).ok()?;
    encoder.finish().ok()
}

/// The body of an HTML answer with its links moved (its `Content-Length` in `headers`
/// changed to match), or as it came when it cannot be.
async fn rewritten_html(
    server: &ApiServer,
    state: &TenantState,
    mut body: hyper::body::Incoming,
    gzip: bool,
    rewrite: &Rewrite<'_>,
    headers: &mut HeaderMap,
) -> Body {
    use futures::StreamExt;
    use http_body_util::BodyExt;
    let mut read = Vec::new();
    // What was read, then the rest of the answer unread (or how reading it failed).
    let as_it_came = |read: Vec<u8>, rest: futures::stream::BoxStream<'static, _>| {
        let head = futures::stream::once(async move {
            Ok::<_, hyper::Error>(hyper::body::Frame::data(bytes::Bytes::from(read)))
        });
        Body::new(http_body_util::StreamBody::new(head.chain(rest)))
    };
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    read.extend_from_slice(&data);
                }
            }
            Err(err) => return as_it_came(read, futures::stream::once(async { Err(err) }).boxed()),
        }
        if read.len() > MAX_REWRITTEN_HTML {
            return as_it_came(
                read,
                StreamExt::boxed(http_body_util::BodyStream::new(body)),
            );
        }
    }
    if read.is_empty() {
        return Body::empty();
    }
    let read = Arc::new(read);
    let move_links = {
        let (read, prefix, backend, host) = (
            read.clone(),
            rewrite.prefix.to_string(),
            rewrite.backend_authority.to_string(),
            rewrite.request_host.to_string(),
        );
        move || {
            rewrite_document(&read, gzip, |url| {
                rewrite_location(url, &prefix, &backend, &host)
            })
        }
    };
    let moved = if read.len() > crate::heavy::HEAVY_BODY_BYTES {
        // A large page is rewritten where large bodies are parsed: on the heavy-work threads,
        // one job at a time per tenant.
        match state.heavy_work.acquire().await {
            Ok(_turn) => server
                .heavy_work
                .run(move |_| Ok(move_links()))
                .await
                .ok()
                .flatten(),
            Err(_) => None,
        }
    } else {
        move_links()
    };
    match moved {
        Some(document) => {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(document.len()));
            Body::from(document)
        }
        None => Body::from(Arc::unwrap_or_clone(read)),
    }
}

/// Where a proxied request goes.
struct Backend {
    /// The checked address dialled.
    address: SocketAddr,
    /// `host[:port]` as upstream's location URL names it: a redirect naming it is the
    /// backend's own.
    authority: String,
    /// TLS, when the backend speaks it: the client settings and the name checked.
    tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
}

/// TLS that accepts any certificate (upstream's proxy transport sets `InsecureSkipVerify`
/// for `https:` pods, services and node ports: they present whatever they serve).
fn unverified(host: &str) -> Result<(Arc<rustls::ClientConfig>, ServerName<'static>), ApiError> {
    let config = crate::outbound::tls_config(&crate::outbound::Trust::Nothing, None)
        .map_err(ApiError::internal)?;
    let name = ServerName::try_from(host.to_string()).map_err(|_| address_not_allowed())?;
    Ok((config, name))
}

/// Pod `pod`'s address (upstream's pod `ResourceLocation`).
fn pod_backend(
    server: &ApiServer,
    pod: &Value,
    scheme: &str,
    port: &str,
) -> Result<Backend, ApiError> {
    let port = pod_port(pod, port)?;
    let ip = pod_ip(pod)
        .filter(|ip| server.kubelet_networks.permits(*ip))
        .ok_or_else(address_not_allowed)?;
    let https = scheme == "https";
    let host = ip.to_string();
    let authority = match port {
        Some(port) => join_host_port(&host, port),
        None if host.contains(':') => format!("[{host}]"),
        None => host.clone(),
    };
    Ok(Backend {
        address: SocketAddr::new(ip, port.unwrap_or(if https { 443 } else { 80 })),
        authority,
        tls: if https {
            Some(unverified(&host)?)
        } else {
            None
        },
    })
}

/// A ready endpoint of Service `service` (upstream's service `ResourceLocation`, through the
/// EndpointSlices, any of the ready endpoints inside the node networks).
async fn service_backend(
    server: &ApiServer,
    state: &TenantState,
    service: &Value,
    id: &str,
    scheme: &str,
    port: &str,
) -> Result<Backend, ApiError> {
    use rand::Rng;
    let name = meta::name(service);
    let port_name = service_port_name(service, port)?;
    let slices_resource = server
        .resources
        .find("discovery.k8s.io", "v1", "endpointslices")
        .ok_or_else(|| ApiError::internal("endpointslices are not served"))?;
    let slices = server
        .store
        .list(
            &state.tenant,
            slices_resource,
            Some(meta::namespace(service)),
            &ListOptions::default(),
        )
        .await?
        .items;
    let ready = ready_endpoints(&slices, name, &port_name);
    if ready.is_empty() {
        // Upstream names the Service when it has no endpoints at all, the request's id when
        // none serves the port asked for.
        let any = owned_slices(&slices, name).any(|slice| {
            slice["endpoints"]
                .as_array()
                .is_some_and(|endpoints| !endpoints.is_empty())
        });
        let named = if any { id } else { name };
        return Err(ApiError::service_unavailable(format!(
            "no endpoints available for service {named:?}"
        )));
    }
    let allowed: Vec<(IpAddr, u16)> = ready
        .into_iter()
        .filter(|(ip, _)| server.kubelet_networks.permits(*ip))
        .collect();
    if allowed.is_empty() {
        return Err(address_not_allowed());
    }
    let (ip, port) = allowed[rand::rng().random_range(0..allowed.len())];
    let host = ip.to_string();
    Ok(Backend {
        address: SocketAddr::new(ip, port),
        authority: join_host_port(&host, port),
        tls: if scheme == "https" {
            Some(unverified(&host)?)
        } else {
            None
        },
    })
}

/// Node `node`'s kubelet, or another port on it (upstream's node `ResourceLocation`): the
/// kubelet over HTTPS with the tenant's kubelet client certificate, its serving certificate
/// checked against the cluster CA; another port as the request's scheme says.
async fn node_backend(
    server: &ApiServer,
    state: &TenantState,
    node: &Value,
    scheme: &str,
    port: &str,
) -> Result<Backend, ApiError> {
    let (host, kubelet_port) = crate::kubelet::kubelet_endpoint(node)?;
    let kubelet = port.is_empty() || port == kubelet_port.to_string();
    let port = if kubelet {
        kubelet_port
    } else {
        port.parse::<u16>().map_err(|_| unknown_port(port))?
    };
    let unreachable = |why: String| {
        ApiError::service_unavailable(format!("error trying to reach service: {why}"))
    };
    // A name is resolved here and the checked address dialled, so what is checked is what is
    // reached.
    let ip = match host.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) => {
            let found: Vec<IpAddr> =
                tokio::time::timeout(DIAL_TIMEOUT, tokio::net::lookup_host((host.as_str(), port)))
                    .await
                    .map_err(|_| unreachable(format!("dial tcp: lookup {host}: i/o timeout")))?
                    .map_err(|err| unreachable(format!("dial tcp: lookup {host}: {err}")))?
                    .map(|address| address.ip())
                    .collect();
            found
                .into_iter()
                .find(|ip| server.kubelet_networks.permits(*ip))
                .ok_or_else(address_not_allowed)?
        }
    };
    if !server.kubelet_networks.permits(ip) {
        return Err(address_not_allowed());
    }
    let tls = if kubelet {
        let config = server.kubelet_clients.config(state)?;
        let name = ServerName::try_from(host.clone()).map_err(|_| address_not_allowed())?;
        Some((config, name))
    } else if scheme == "https" {
        Some(unverified(&host)?)
    } else {
        None
    };
    Ok(Backend {
        address: SocketAddr::new(ip, port),
        authority: join_host_port(&host, port),
        tls,
    })
}

/// An HTTP/1.1 connection to `backend` whose request body is the caller's, streamed.
async fn open(backend: &Backend) -> Result<hyper::client::conn::http1::SendRequest<Body>, String> {
    let address = backend.address;
    let tcp = tokio::time::timeout(DIAL_TIMEOUT, tokio::net::TcpStream::connect(address))
        .await
        .map_err(|_| format!("dial tcp {address}: i/o timeout"))?
        .map_err(|err| format!("dial tcp {address}: {err}"))?;
    let _ = tcp.set_nodelay(true);
    match &backend.tls {
        None => handshake(tcp).await,
        Some((config, name)) => {
            let tls = tokio::time::timeout(
                DIAL_TIMEOUT,
                tokio_rustls::TlsConnector::from(config.clone()).connect(name.clone(), tcp),
            )
            .await
            .map_err(|_| format!("tls handshake with {address}: timeout"))?
            .map_err(|err| format!("tls handshake with {address}: {err}"))?;
            handshake(tls).await
        }
    }
}

/// HTTP/1.1 over `io`, the connection driven on a task of its own (which may hand it over
/// to an upgrade).
async fn handshake<T>(io: T) -> Result<hyper::client::conn::http1::SendRequest<Body>, String>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|err| err.to_string())?;
    tokio::spawn(async move {
        if let Err(err) = connection.with_upgrades().await {
            tracing::debug!(%err, "proxied connection ended with an error");
        }
    });
    Ok(sender)
}

/// Upstream's answer to `…/proxy` without a path: 301 to the same path with a slash, so the
/// backend's relative links resolve under the proxy (kubernetes/kubernetes#4958).
fn redirect_to_root(uri: &http::Uri) -> Response {
    let location = match uri.query().filter(|q| !q.is_empty()) {
        Some(query) => format!("{}/?{query}", uri.path()),
        None => format!("{}/", uri.path()),
    };
    let mut answer = Response::new(Body::empty());
    *answer.status_mut() = StatusCode::MOVED_PERMANENTLY;
    if let Ok(value) = HeaderValue::from_str(&location) {
        answer.headers_mut().insert(header::LOCATION, value);
    }
    answer
}

/// Serves a proxy request: the object found, admitted as a connect, its backend found and
/// dialled, the request passed on and the answer (or the upgraded connection) passed back.
pub(crate) async fn serve(
    server: &ApiServer,
    state: &TenantState,
    target: &ProxyTarget<'_>,
    user: &crate::authn::UserInfo,
    mut parts: http::request::Parts,
    body: &mut Option<Body>,
) -> Result<Response, ApiError> {
    // Upstream's `ConnectMethods` of the proxy subresources.
    if !matches!(
        parts.method,
        Method::GET
            | Method::POST
            | Method::PUT
            | Method::PATCH
            | Method::DELETE
            | Method::HEAD
            | Method::OPTIONS
    ) {
        return Err(ApiError::method_not_allowed());
    }
    let kind = target.kind;
    let SchemeNamePort { scheme, name, port } =
        split_scheme_name_port(target.id).ok_or_else(|| {
            ApiError::bad_request(format!(
                "invalid {} request {:?}",
                kind.singular(),
                target.id
            ))
        })?;
    let resource = server
        .resources
        .find("", "v1", kind.plural())
        .ok_or_else(ApiError::no_such_path)?;
    let object = server
        .store
        .get(
            &state.tenant,
            resource,
            target.namespace,
            name,
            ReadAt::Latest,
        )
        .await?;
    let mut options = json!({"kind": kind.options_kind(), "apiVersion": "v1"});
    if !target.subpath.is_empty() {
        options["path"] = json!(target.subpath);
    }
    let attributes = crate::admission::Attributes {
        operation: crate::admission::Operation::Connect,
        resource,
        subresource: "proxy",
        namespace: target.namespace,
        name,
        user: Some(user),
        dry_run: false,
        old: Some(&object),
    };
    crate::handler::admit_request(server, state, attributes, options).await?;
    let backend = match kind {
        ProxyKind::Pod => pod_backend(server, &object, scheme, port)?,
        ProxyKind::Service => {
            service_backend(server, state, &object, target.id, scheme, port).await?
        }
        ProxyKind::Node => node_backend(server, state, &object, scheme, port).await?,
    };
    let upgrade = is_upgrade(&parts.headers);
    let path = backend_path(&target.subpath);
    if !upgrade && path.is_empty() && matches!(parts.method, Method::GET | Method::HEAD) {
        return Ok(redirect_to_root(&parts.uri));
    }
    let client_upgrade = if upgrade {
        // Over HTTP/2, or from inside the process, there is no connection to take over.
        Some(
            parts
                .extensions
                .remove::<hyper::upgrade::OnUpgrade>()
                .ok_or_else(|| ApiError::unknown("request connection cannot be hijacked"))?,
        )
    } else {
        None
    };
    let request_host = parts
        .headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| parts.uri.authority().map(|a| a.to_string()))
        .unwrap_or_default();
    let escaped = escape_path(if path.is_empty() { "/" } else { &path });
    let uri = match parts.uri.query() {
        Some(query) => format!("{escaped}?{query}"),
        None => escaped.clone(),
    };
    let client = parts
        .extensions
        .get::<crate::serve::ClientAddress>()
        .map(|address| address.0.ip());
    let mut headers = backend_request_headers(&parts.headers, upgrade, client);
    // Upstream passes the caller's `Host` on (its reverse proxy keeps `req.Host`).
    let host = if request_host.is_empty() {
        &backend.authority
    } else {
        &request_host
    };
    headers.insert(
        header::HOST,
        HeaderValue::from_str(host).map_err(ApiError::internal)?,
    );
    if !upgrade && let Ok(value) = HeaderValue::from_str(&format!("{}{escaped}", target.prefix)) {
        headers.insert("x-forwarded-uri", value);
    }
    let body = body
        .take()
        .ok_or_else(|| ApiError::internal("the request body was read twice"))?;
    let mut request = Request::builder()
        .method(parts.method.clone())
        .uri(uri)
        .body(body)
        .map_err(|err| ApiError::bad_request(err.to_string()))?;
    *request.headers_mut() = headers;
    let reached = async {
        let mut sender = open(&backend).await?;
        sender
            .send_request(request)
            .await
            .map_err(|err| err.to_string())
    };
    let mut response = match (reached.await, upgrade) {
        (Ok(response), _) => response,
        // Upstream's words for each path: its upgrade dialer's and its proxy transport's.
        (Err(err), true) => return Err(ApiError::unknown(format!("error dialing backend: {err}"))),
        (Err(err), false) => {
            return Err(ApiError::service_unavailable(format!(
                "error trying to reach service: {err}"
            )));
        }
    };
    let rewrite = Rewrite {
        prefix: &target.prefix,
        backend_authority: &backend.authority,
        request_host: &request_host,
    };
    let Some(client_upgrade) = client_upgrade else {
        let (mut answer, body) = response.into_parts();
        let html = html_answer(&answer.headers).filter(|_| parts.method != Method::HEAD);
        answer_headers(&mut answer.headers, &rewrite);
        let body = match html {
            Some(gzip) => {
                rewritten_html(server, state, body, gzip, &rewrite, &mut answer.headers).await
            }
            None => Body::new(body),
        };
        return Ok(Response::from_parts(answer, body));
    };
    let status = response.status();
    if status != StatusCode::SWITCHING_PROTOCOLS {
        // A refusal goes back as it came; anything else is no answer to an upgrade.
        if status.as_u16() < 400 {
            return Err(ApiError::unknown(format!(
                "invalid upgrade response: status code {}",
                status.as_u16()
            )));
        }
        let (answer, body) = response.into_parts();
        return Ok(Response::from_parts(answer, Body::new(body)));
    }
    let backend_upgrade = hyper::upgrade::on(&mut response);
    let mut answer = Response::new(Body::empty());
    *answer.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *answer.headers_mut() = response.headers().clone();
    tokio::spawn(async move {
        let (client, backend) = match tokio::join!(client_upgrade, backend_upgrade) {
            (Ok(client), Ok(backend)) => (client, backend),
            (client, backend) => {
                tracing::debug!(
                    client = client.is_ok(),
                    backend = backend.is_ok(),
                    "a proxied upgrade did not complete"
                );
                return;
            }
        };
        let mut client = TokioIo::new(client);
        let mut backend = TokioIo::new(backend);
        if let Err(err) = tokio::io::copy_bidirectional(&mut client, &mut backend).await {
            tracing::debug!(%err, "proxied connection ended with an error");
        }
    });
    Ok(answer)
}

#[cfg(test)]
mod tests;
