//! The pod subresources served by a node's kubelet (upstream `pkg/registry/core/pod/rest`
//! `LogREST`, `ExecREST`, `AttachREST`, `PortForwardREST`): the pod and container are checked
//! here (`validateContainer`), the kubelet is found from the Node (`NodeConnectionInfoGetter`),
//! reached over HTTPS with a client certificate the tenant's client CA signs for the API
//! server (`kube-apiserver-kubelet-client`, `system:masters`), only at addresses inside the node
//! networks and only when the kubelet's serving certificate chains to that CA; `log` is
//! streamed back, and the
//! upgrade requests (`exec`, `attach`, `portforward`) are forwarded as they came and, once
//! the kubelet switched protocols, spliced byte for byte (upstream `UpgradeAwareHandler`), so
//! every streaming protocol the kubelet speaks passes through unchanged.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::Value;

use crate::ApiServer;
use crate::error::ApiError;
use crate::handler::Call;
use crate::meta;
use crate::store::ReadAt;
use crate::tenants::TenantState;

/// The user the API server is to kubelets (kubeadm's `apiserver-kubelet-client`).
pub const KUBELET_CLIENT_USER: &str = "kube-apiserver-kubelet-client";
/// Its group: the kubelet's SubjectAccessReview allows it everything.
pub const KUBELET_CLIENT_GROUP: &str = "system:masters";
/// The kubelet port when the Node reports none (upstream `ports.KubeletPort`).
pub const DEFAULT_KUBELET_PORT: u16 = 10250;
/// How long dialing a kubelet may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// How much of a kubelet's error answer is read (upstream `maxReadLength`).
const MAX_ERROR_BODY: usize = 50_000;
/// Node address types in the order they are tried.
const PREFERRED_ADDRESS_TYPES: [&str; 5] = [
    "InternalIP",
    "InternalDNS",
    "ExternalIP",
    "ExternalDNS",
    "Hostname",
];

/// The private ranges node networks are in unless the operator names them: RFC 1918, the
/// shared address space (RFC 6598) and IPv6 unique local addresses.
static DEFAULT_NODE_NETWORKS: std::sync::LazyLock<Vec<flotilla_api_machinery::cidr::Cidr>> =
    std::sync::LazyLock::new(|| {
        [
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "100.64.0.0/10",
            "fc00::/7",
        ]
        .iter()
        .filter_map(|cidr| cidr.parse().ok())
        .collect()
    });

/// Where the API server may dial a kubelet. A tenant writes its Nodes' addresses, so without
/// this a tenant could point `logs` at any port the control plane can reach (the management
/// port, etcd) and tell open from closed by the error.
#[derive(Debug, Clone, Default)]
pub struct KubeletNetworks {
    /// The node networks (VPC CIDRs, the local fabric); empty: [`DEFAULT_NODE_NETWORKS`].
    pub allowed: Vec<flotilla_api_machinery::cidr::Cidr>,
    /// This service's own addresses, never dialled whatever network they are in.
    pub own: Vec<std::net::IpAddr>,
}

impl KubeletNetworks {
    /// Whether a kubelet at `address` may be dialled: inside a node network, and not
    /// loopback, unspecified, link-local, multicast, broadcast or one of the service's own.
    pub fn permits(&self, address: std::net::IpAddr) -> bool {
        use std::net::IpAddr;
        let address = flotilla_api_machinery::cidr::canonical(address);
        let special = match address {
            IpAddr::V4(v4) => {
                v4.is_loopback()
                    || v4.is_unspecified()
                    || v4.is_link_local()
                    || v4.is_multicast()
                    || v4.is_broadcast()
            }
            IpAddr::V6(v6) => {
                v6.is_loopback()
                    || v6.is_unspecified()
                    || v6.is_multicast()
                    || v6.is_unicast_link_local()
            }
        };
        if special || self.own.contains(&address) {
            return false;
        }
        if self.allowed.is_empty() {
            DEFAULT_NODE_NETWORKS
                .iter()
                .any(|cidr| cidr.contains(address))
        } else {
            self.allowed.iter().any(|cidr| cidr.contains(address))
        }
    }
}

/// What a tenant is told of any failure to reach its kubelet: the same words whatever went
/// wrong (refused, filtered, timed out, a bad certificate), so the answer says nothing of the
/// network behind the address; the detail goes to the server's log.
fn kubelet_unreachable(state: &TenantState, node: &Value, detail: &str) -> ApiError {
    tracing::warn!(
        tenant = %state.record.id,
        node = meta::name(node),
        %detail,
        "kubelet unreachable"
    );
    ApiError::internal("error dialing backend: kubelet unreachable")
}

/// Each tenant's TLS client configuration towards kubelets, made once per client CA.
#[derive(Default)]
pub struct KubeletClients {
    configs: Mutex<HashMap<String, (String, Arc<rustls::ClientConfig>)>>,
}

impl KubeletClients {
    /// The configuration presenting tenant `state`'s kubelet client certificate.
    pub(crate) fn config(
        &self,
        state: &TenantState,
    ) -> Result<Arc<rustls::ClientConfig>, ApiError> {
        let id = &state.record.id;
        let ca = &state.record.client_ca;
        if let Ok(configs) = self.configs.lock()
            && let Some((cert, config)) = configs.get(id)
            && *cert == ca.cert_pem
        {
            return Ok(config.clone());
        }
        let issued = ca
            .issue_client(KUBELET_CLIENT_USER, &[KUBELET_CLIENT_GROUP])
            .map_err(ApiError::internal)?;
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(issued.cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(ApiError::internal)?;
        let key =
            PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).map_err(ApiError::internal)?;
        // The kubelet's serving certificate must chain to the cluster CA (upstream's
        // `--kubelet-certificate-authority`): kubelets get theirs through a kubelet-serving
        // CertificateSigningRequest, which that CA signs.
        let mut roots = rustls::RootCertStore::empty();
        for certificate in CertificateDer::pem_slice_iter(ca.cert_pem.as_bytes()) {
            roots
                .add(certificate.map_err(ApiError::internal)?)
                .map_err(ApiError::internal)?;
        }
        let provider = crate::serve::crypto_provider();
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(ApiError::internal)?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(ApiError::internal)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        if let Ok(mut configs) = self.configs.lock() {
            configs.insert(id.clone(), (ca.cert_pem.clone(), config.clone()));
        }
        Ok(config)
    }
}

/// Where a Node's kubelet listens: the first address of the preferred types and
/// `status.daemonEndpoints.kubeletEndpoint.Port` (upstream `NodeConnectionInfoGetter`).
pub fn kubelet_endpoint(node: &Value) -> Result<(String, u16), ApiError> {
    let addresses = meta::at(node, &["status", "addresses"])
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let host = PREFERRED_ADDRESS_TYPES
        .iter()
        .find_map(|kind| {
            addresses
                .iter()
                .find(|a| a["type"] == *kind)
                .and_then(|a| a["address"].as_str())
                .filter(|a| !a.is_empty())
        })
        .ok_or_else(|| {
            let known: Vec<String> = addresses
                .iter()
                .map(|a| {
                    format!(
                        "{{{} {}}}",
                        a["type"].as_str().unwrap_or(""),
                        a["address"].as_str().unwrap_or("")
                    )
                })
                .collect();
            ApiError::internal(format!(
                "no preferred addresses found; known addresses: [{}]",
                known.join(" ")
            ))
        })?;
    let port = meta::at(
        node,
        &["status", "daemonEndpoints", "kubeletEndpoint", "Port"],
    )
    .and_then(Value::as_u64)
    .and_then(|p| u16::try_from(p).ok())
    .filter(|p| *p > 0)
    .unwrap_or(DEFAULT_KUBELET_PORT);
    Ok((host.to_string(), port))
}

/// The container a request is about (upstream `validateContainer`): the given one, which must
/// exist, or the pod's only container.
pub fn validate_container(pod: &Value, container: Option<&str>) -> Result<String, ApiError> {
    let name = meta::name(pod);
    let names = |key: &str| -> Vec<String> {
        meta::at(pod, &["spec", key])
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c["name"].as_str().map(str::to_string))
            .collect()
    };
    let containers = names("containers");
    let all: Vec<String> = names("initContainers")
        .into_iter()
        .chain(containers.iter().cloned())
        .chain(names("ephemeralContainers"))
        .collect();
    match container.filter(|c| !c.is_empty()) {
        Some(container) if all.iter().any(|c| c == container) => Ok(container.to_string()),
        Some(container) => Err(ApiError::bad_request(format!(
            "container {container} is not valid for pod {name}"
        ))),
        None => match containers.as_slice() {
            [only] => Ok(only.clone()),
            [] => Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {name}"
            ))),
            _ => Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                all.join(" ")
            ))),
        },
    }
}

/// A `PodLogOptions` query as the kubelet gets it (upstream `LogLocation`'s parameters),
/// checked as upstream's validation does.
pub fn log_query(query: &HashMap<String, String>) -> Result<String, ApiError> {
    let flag = |name: &str| -> Result<bool, ApiError> {
        Ok(flotilla_api_machinery::query::query_bool(
            query.get(name).map(String::as_str),
        ))
    };
    let number = |name: &str| -> Result<Option<i64>, ApiError> {
        match query.get(name).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| ApiError::bad_request(format!("invalid value {v:?} for {name}"))),
        }
    };
    let mut out = form_urlencoded::Serializer::new(String::new());
    for name in ["follow", "previous", "timestamps"] {
        if flag(name)? {
            out.append_pair(name, "true");
        }
    }
    let invalid = |field: &str, value: i64, why: &str| {
        ApiError::invalid(
            "",
            "PodLogOptions",
            "",
            vec![crate::error::FieldError::invalid(
                &crate::error::Path::new(field),
                serde_json::json!(value),
                why,
            )],
        )
    };
    let since_seconds = number("sinceSeconds")?;
    let since_time = query.get("sinceTime").filter(|v| !v.is_empty());
    if since_seconds.is_some() && since_time.is_some() {
        return Err(ApiError::invalid(
            "",
            "PodLogOptions",
            "",
            vec![crate::error::FieldError::forbidden(
                &crate::error::Path::new(""),
                "at most one of `sinceTime` or `sinceSeconds` may be specified",
            )],
        ));
    }
    if let Some(seconds) = since_seconds {
        if seconds < 1 {
            return Err(invalid("sinceSeconds", seconds, "must be greater than 0"));
        }
        out.append_pair("sinceSeconds", &seconds.to_string());
    }
    if let Some(time) = since_time {
        chrono::DateTime::parse_from_rfc3339(time)
            .map_err(|_| ApiError::bad_request(format!("invalid value {time:?} for sinceTime")))?;
        out.append_pair("sinceTime", time);
    }
    if let Some(tail) = number("tailLines")? {
        if tail < 0 {
            return Err(invalid(
                "tailLines",
                tail,
                "must be greater than or equal to 0",
            ));
        }
        out.append_pair("tailLines", &tail.to_string());
    }
    if let Some(limit) = number("limitBytes")? {
        if limit < 1 {
            return Err(invalid("limitBytes", limit, "must be greater than 0"));
        }
        out.append_pair("limitBytes", &limit.to_string());
    }
    Ok(out.finish())
}

/// An exec/attach/portforward query as the kubelet gets it (upstream `streamParams`).
pub fn stream_query(subresource: &str, call: &Call) -> Result<String, ApiError> {
    let truthy = |name: &str| {
        flotilla_api_machinery::query::query_bool(call.query.get(name).map(String::as_str))
    };
    let mut out = form_urlencoded::Serializer::new(String::new());
    if subresource == "portforward" {
        let ports: Vec<&str> = call_values(call, "ports");
        if !ports.is_empty() {
            out.append_pair("port", &ports.join(","));
        }
        return Ok(out.finish());
    }
    let streams = ["stdin", "stdout", "stderr", "tty"];
    for name in streams {
        if truthy(name) {
            out.append_pair(name, "1");
        }
    }
    if !streams[..3].iter().any(|s| truthy(s)) {
        return Err(ApiError::bad_request(
            "you must specify at least one of stdin, stdout, stderr",
        ));
    }
    if subresource == "exec" {
        let commands = call_values(call, "command");
        if commands.is_empty() {
            return Err(ApiError::bad_request("you must specify at least 1 command"));
        }
        for command in commands {
            out.append_pair("command", command);
        }
    }
    Ok(out.finish())
}

/// The options object of a connect request, as upstream decodes it from the query
/// (`PodExecOptions`, `PodAttachOptions`, `PodPortForwardOptions`): what admission sees.
fn connect_options(subresource: &str, call: &Call) -> serde_json::Value {
    use serde_json::json;
    let truthy = |name: &str| {
        flotilla_api_machinery::query::query_bool(call.query.get(name).map(String::as_str))
    };
    if subresource == "portforward" {
        let ports: Vec<u64> = call_values(call, "ports")
            .iter()
            .flat_map(|p| p.split(','))
            .filter_map(|p| p.trim().parse().ok())
            .collect();
        return json!({"kind": "PodPortForwardOptions", "apiVersion": "v1", "ports": ports});
    }
    let kind = if subresource == "exec" {
        "PodExecOptions"
    } else {
        "PodAttachOptions"
    };
    let mut options = json!({"kind": kind, "apiVersion": "v1"});
    for stream in ["stdin", "stdout", "stderr", "tty"] {
        if truthy(stream) {
            options[stream] = json!(true);
        }
    }
    if let Some(container) = call.query.get("container") {
        options["container"] = json!(container);
    }
    if subresource == "exec" {
        options["command"] = json!(call_values(call, "command"));
    }
    options
}

/// Every value of a repeated query parameter (`command=a&command=b`), in order.
fn call_values<'a>(call: &'a Call, name: &str) -> Vec<&'a str> {
    call.raw_query
        .iter()
        .filter(|(key, _)| key == name)
        .map(|(_, value)| value.as_str())
        .collect()
}

/// A kubelet's non-2xx answer as the API's error (upstream `GenericHttpResponseChecker`).
pub fn kubelet_error(code: u16, body: &[u8], resource: &str, name: &str) -> ApiError {
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX_ERROR_BODY)]).into_owned();
    match code {
        500 => ApiError::internal(text),
        400 => ApiError::bad_request(text),
        _ => ApiError::generic_server_response(code, resource, name, text),
    }
}

/// The pod `name` and the Node it runs on, or why there is none.
async fn pod_and_node(
    server: &ApiServer,
    state: &TenantState,
    namespace: &str,
    name: &str,
) -> Result<(Value, Option<Value>), ApiError> {
    let pods = server
        .resources
        .find("", "v1", "pods")
        .ok_or_else(ApiError::no_such_path)?;
    let pod = server
        .store
        .get(&state.tenant, pods, namespace, name, ReadAt::Latest)
        .await?;
    let node_name = meta::str_at(&pod, &["spec", "nodeName"]).unwrap_or("");
    if node_name.is_empty() {
        return Ok((pod, None));
    }
    let nodes = server
        .resources
        .find("", "v1", "nodes")
        .ok_or_else(ApiError::no_such_path)?;
    let node = server
        .store
        .get(&state.tenant, nodes, "", node_name, ReadAt::Latest)
        .await?;
    Ok((pod, Some(node)))
}

/// An HTTP/1.1 connection to the kubelet of `node`, with the request sender.
async fn dial(
    server: &ApiServer,
    state: &TenantState,
    node: &Value,
) -> Result<
    (
        hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
        String,
    ),
    ApiError,
> {
    let (host, port) = kubelet_endpoint(node)?;
    let config = server.kubelet_clients.config(state)?;
    let unreachable = |detail: String| kubelet_unreachable(state, node, &detail);
    // A name is resolved here and the checked address dialled, so what is checked is what is
    // reached.
    let target = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => std::net::SocketAddr::new(ip, port),
        Err(_) => {
            tokio::time::timeout(DIAL_TIMEOUT, tokio::net::lookup_host((host.as_str(), port)))
                .await
                .map_err(|_| unreachable(format!("resolving {host}: timeout")))?
                .map_err(|err| unreachable(format!("resolving {host}: {err}")))?
                .find(|candidate| server.kubelet_networks.permits(candidate.ip()))
                .ok_or_else(|| unreachable(format!("{host} resolves to no node network address")))?
        }
    };
    if !server.kubelet_networks.permits(target.ip()) {
        return Err(unreachable(format!(
            "{target} is outside the node networks (or loopback, link-local or this service's own)"
        )));
    }
    let address = target.to_string();
    let tcp = tokio::time::timeout(DIAL_TIMEOUT, tokio::net::TcpStream::connect(target))
        .await
        .map_err(|_| unreachable(format!("dial tcp {address}: i/o timeout")))?
        .map_err(|err| unreachable(format!("dial tcp {address}: {err}")))?;
    let _ = tcp.set_nodelay(true);
    let server_name = ServerName::try_from(host.clone())
        .map_err(|err| unreachable(err.to_string()))?
        .to_owned();
    let tls = tokio::time::timeout(
        DIAL_TIMEOUT,
        tokio_rustls::TlsConnector::from(config).connect(server_name, tcp),
    )
    .await
    .map_err(|_| unreachable(format!("tls handshake with {address}: timeout")))?
    .map_err(|err| unreachable(format!("tls handshake with {address}: {err}")))?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|err| unreachable(err.to_string()))?;
    tokio::spawn(async move {
        if let Err(err) = connection.with_upgrades().await {
            tracing::debug!(%err, "kubelet connection ended with an error");
        }
    });
    Ok((sender, address))
}

/// `GET path` on the kubelet of `node`: its answer's head, the body still to read.
async fn get(
    server: &ApiServer,
    state: &TenantState,
    node: &Value,
    path: &str,
) -> Result<http::Response<hyper::body::Incoming>, ApiError> {
    let (mut sender, address) = dial(server, state, node).await?;
    let request = Request::get(path)
        .header(header::HOST, address)
        .body(Empty::new())
        .map_err(ApiError::internal)?;
    sender
        .send_request(request)
        .await
        .map_err(|err| ApiError::internal(format!("error reading from the kubelet: {err}")))
}

/// `GET path` on the kubelet of `node`, its whole answer (`/stats/summary` for
/// `metrics.k8s.io`), within `timeout`.
pub async fn kubelet_get(
    server: &ApiServer,
    state: &TenantState,
    node: &Value,
    path: &str,
    timeout: Duration,
) -> Result<Bytes, ApiError> {
    let name = meta::name(node).to_string();
    let fetch = async {
        let response = get(server, state, node, path).await?;
        let code = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .map_err(|err| ApiError::internal(format!("error reading from the kubelet: {err}")))?;
        if !code.is_success() {
            return Err(kubelet_error(code.as_u16(), &body, "nodes/stats", &name));
        }
        Ok(body)
    };
    tokio::time::timeout(timeout, fetch).await.map_err(|_| {
        kubelet_unreachable(
            state,
            node,
            &format!("no answer to {path} within {timeout:?}"),
        )
    })?
}

/// `GET pods/{name}/log`: the container's log from its kubelet, streamed.
pub async fn pod_log(
    server: &ApiServer,
    state: &TenantState,
    namespace: &str,
    name: &str,
    call: &Call,
) -> Result<Response, ApiError> {
    let query = log_query(&call.query)?;
    let (pod, node) = pod_and_node(server, state, namespace, name).await?;
    let container = validate_container(&pod, call.query.get("container").map(String::as_str))?;
    // A pod not yet placed has no log (upstream answers an empty stream).
    let Some(node) = node else {
        return Ok(text_response(StatusCode::OK, Body::empty()));
    };
    let path = format!("/containerLogs/{namespace}/{name}/{container}?{query}");
    let response = get(server, state, &node, &path).await?;
    let code = response.status();
    if !code.is_success() {
        let body = response
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        return Err(kubelet_error(code.as_u16(), &body, "pods/log", name));
    }
    Ok(text_response(
        StatusCode::OK,
        Body::new(response.into_body()),
    ))
}

fn text_response(code: StatusCode, body: Body) -> Response {
    let mut response = (code, body).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    response
}

/// Request headers that stay with the API server (credentials, and what names the hop).
fn forwarded(headers: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, value) in headers {
        let lower = name.as_str();
        if lower == "authorization"
            || lower == "host"
            || lower == "content-length"
            || lower.starts_with("impersonate-")
        {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

/// `pods/{name}/exec|attach|portforward`: forwards the upgrade request to the kubelet and,
/// when it switches protocols, answers 101 with its headers and splices the connections.
pub async fn connect_subresource(
    server: &ApiServer,
    state: &TenantState,
    namespace: &str,
    name: &str,
    subresource: &str,
    call: Call,
) -> Result<Response, ApiError> {
    // Refused before any work, as upstream's filters refuse; held by the splice below for as
    // long as the session lasts.
    let session = state.streams.open(server.limits.max_streams)?;
    let query = stream_query(subresource, &call)?;
    let (pod, node) = pod_and_node(server, state, namespace, name).await?;
    let pods = server
        .resources
        .find("", "v1", "pods")
        .ok_or_else(|| ApiError::internal("pods are not served"))?;
    let attributes = crate::admission::Attributes {
        operation: crate::admission::Operation::Connect,
        resource: pods,
        subresource,
        namespace,
        name,
        user: Some(&call.user),
        dry_run: false,
        old: Some(&pod),
    };
    crate::handler::admit_request(
        server,
        state,
        attributes,
        connect_options(subresource, &call),
    )
    .await?;
    let path = if subresource == "portforward" {
        format!("/portForward/{namespace}/{name}?{query}")
    } else {
        let container = validate_container(&pod, call.query.get("container").map(String::as_str))?;
        let kubelet_path = if subresource == "exec" {
            "exec"
        } else {
            "attach"
        };
        format!("/{kubelet_path}/{namespace}/{name}/{container}?{query}")
    };
    let Some(node) = node else {
        return Err(ApiError::bad_request(format!(
            "pod {name} does not have a host assigned"
        )));
    };
    let Some(client_upgrade) = call.upgrade else {
        return Err(ApiError::bad_request("Upgrade request required"));
    };
    let (mut sender, address) = dial(server, state, &node).await?;
    let mut request = Request::builder()
        .method(call.method.clone())
        .uri(path)
        .body(Empty::new())
        .map_err(ApiError::internal)?;
    *request.headers_mut() = forwarded(&call.headers);
    request.headers_mut().insert(
        header::HOST,
        HeaderValue::from_str(&address).map_err(ApiError::internal)?,
    );
    let mut response = sender
        .send_request(request)
        .await
        .map_err(|err| ApiError::internal(format!("error reading from the kubelet: {err}")))?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        // The kubelet's refusal goes back as it came, as upstream's proxy passes it.
        let code = response.status();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let mut answer = (code, body).into_response();
        if let Some(content_type) = headers.get(header::CONTENT_TYPE) {
            answer
                .headers_mut()
                .insert(header::CONTENT_TYPE, content_type.clone());
        }
        return Ok(answer);
    }
    let kubelet_upgrade = hyper::upgrade::on(&mut response);
    let mut answer = Response::new(Body::empty());
    *answer.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *answer.headers_mut() = response.headers().clone();
    tokio::spawn(async move {
        let _session = session;
        let (client, kubelet) = match tokio::join!(client_upgrade, kubelet_upgrade) {
            (Ok(client), Ok(kubelet)) => (client, kubelet),
            (client, kubelet) => {
                tracing::debug!(
                    client = client.is_ok(),
                    kubelet = kubelet.is_ok(),
                    "an upgrade did not complete"
                );
                return;
            }
        };
        let mut client = TokioIo::new(client);
        let mut kubelet = TokioIo::new(kubelet);
        if let Err(err) = tokio::io::copy_bidirectional(&mut client, &mut kubelet).await {
            tracing::debug!(%err, "streaming connection ended with an error");
        }
    });
    Ok(answer)
}

/// Whether `method` on pod `subresource` is a connect (upgrade) request.
pub fn is_connect(subresource: &str) -> bool {
    matches!(subresource, "exec" | "attach" | "portforward")
}

/// Whether an upgrade request asks for a WebSocket (a GET that also needs `create`).
pub fn is_websocket(method: &Method, headers: &HeaderMap) -> bool {
    *method == Method::GET
        && headers
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kubelet_address_prefers_internal_ip_and_reported_port() {
        let node = json!({"status": {
            "addresses": [{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "10.0.0.7"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 12345}},
        }});
        assert_eq!(
            kubelet_endpoint(&node).expect("endpoint"),
            ("10.0.0.7".into(), 12345)
        );
        let node = json!({"status": {"addresses": [{"type": "Hostname", "address": "n1"}]}});
        assert_eq!(
            kubelet_endpoint(&node).expect("endpoint"),
            ("n1".into(), 10250)
        );
        let err = kubelet_endpoint(&json!({"status": {}})).expect_err("no address");
        assert_eq!(err.code, 500);
        assert!(
            err.message.contains("no preferred addresses found"),
            "{}",
            err.message
        );
    }

    #[test]
    fn containers_are_chosen_as_upstream() {
        let pod = json!({"metadata": {"name": "web"}, "spec": {
            "initContainers": [{"name": "init"}],
            "containers": [{"name": "a"}, {"name": "b"}],
        }});
        let err = validate_container(&pod, None).expect_err("ambiguous");
        assert_eq!(
            (err.code, err.message.as_str()),
            (
                400,
                "a container name must be specified for pod web, choose one of: [init a b]"
            )
        );
        assert_eq!(validate_container(&pod, Some("b")).expect("b"), "b");
        assert_eq!(
            validate_container(&pod, Some("init")).expect("init"),
            "init"
        );
        assert_eq!(
            validate_container(&pod, Some("x")).expect_err("x").message,
            "container x is not valid for pod web"
        );
        let single = json!({"metadata": {"name": "one"}, "spec": {"containers": [{"name": "c"}]}});
        assert_eq!(validate_container(&single, None).expect("only"), "c");
    }

    #[test]
    fn log_options_reach_the_kubelet_checked() {
        let query = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            log_query(&query(&[
                ("follow", "true"),
                ("tailLines", "3"),
                ("container", "c")
            ]))
            .expect("query"),
            "follow=true&tailLines=3"
        );
        assert_eq!(
            log_query(&query(&[("tailLines", "-1")]))
                .expect_err("neg")
                .code,
            422
        );
        assert_eq!(
            log_query(&query(&[("limitBytes", "0")]))
                .expect_err("zero")
                .code,
            422
        );
        let both = log_query(&query(&[
            ("sinceSeconds", "5"),
            ("sinceTime", "2026-01-01T00:00:00Z"),
        ]))
        .expect_err("both");
        assert!(
            both.message
                .contains("at most one of `sinceTime` or `sinceSeconds`"),
            "{}",
            both.message
        );
        // Booleans read as upstream's query conversion reads them: anything but false/0 is true.
        let follow = log_query(&query(&[("follow", "perhaps")])).expect("a flag");
        assert!(follow.contains("follow=true"), "{follow}");
        let quiet = log_query(&query(&[("follow", "False")])).expect("a flag");
        assert!(!quiet.contains("follow"), "{quiet}");
    }

    /// A request of a test: method, path, headers.
    type TestRequest<'a> = (Method, &'a str, Vec<(&'a str, &'a str)>);

    /// A server with tenant `t` and a pod `two` (two containers, bound to `n1`, whose Node
    /// has no kubelet listening), asked through the router as `user` in `groups`.
    async fn ask(
        extra: Vec<(&str, Value)>,
        requests: Vec<TestRequest<'_>>,
        user: &str,
        groups: &[&str],
    ) -> Vec<(u16, Value)> {
        use tower::ServiceExt;
        let dir = tempfile::tempdir().expect("dir");
        let storage: Arc<dyn flotilla_storage::Storage> = Arc::new(
            flotilla_storage::EmbeddedStorage::open(dir.path().join("s.redb")).expect("store"),
        );
        let server = ApiServer::new(storage, "127.0.0.1:6443").expect("server");
        server.tenants.ensure(&server, "t").await.expect("tenant");
        let admin = crate::authn::InProcessIdentity(crate::authn::UserInfo {
            name: "admin".into(),
            groups: vec!["system:masters".into()],
            ..Default::default()
        });
        let seed = vec![
            (
                "/clusters/t/api/v1/nodes",
                json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "n1"}}),
            ),
            (
                "/clusters/t/api/v1/namespaces/default/pods",
                json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "two"}, "spec": {"nodeName": "n1", "containers": [
                    {"name": "a", "image": "i"}, {"name": "b", "image": "i"}]}}),
            ),
        ];
        for (path, body) in seed.into_iter().chain(extra) {
            let mut request = Request::post(path)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.to_string()))
                .expect("request");
            request.extensions_mut().insert(admin.clone());
            let response = server.router().oneshot(request).await.expect("answer");
            assert_eq!(response.status(), StatusCode::CREATED, "{path}");
        }
        let who = crate::authn::InProcessIdentity(crate::authn::UserInfo {
            name: user.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..Default::default()
        });
        let mut answers = Vec::new();
        for (method, path, headers) in requests {
            let mut request = Request::builder().method(method).uri(path);
            for (name, value) in headers {
                request = request.header(name, value);
            }
            let mut request = request.body(Body::empty()).expect("request");
            request.extensions_mut().insert(who.clone());
            let response = server.router().oneshot(request).await.expect("answer");
            let code = response.status().as_u16();
            let body = response
                .into_body()
                .collect()
                .await
                .expect("body")
                .to_bytes();
            answers.push((code, serde_json::from_slice(&body).unwrap_or(Value::Null)));
        }
        answers
    }

    #[tokio::test]
    async fn pod_subresources_through_the_router() {
        let pods = "/clusters/t/api/v1/namespaces/default/pods";
        let log = format!("{pods}/two/log");
        let log_a = format!("{pods}/two/log?container=a");
        let exec = format!("{pods}/two/exec?command=true&stdout=true");
        let no_command = format!("{pods}/two/exec?container=a&stdout=true");
        let answers = ask(
            vec![],
            vec![
                (Method::GET, &log, vec![]),
                (Method::GET, &log_a, vec![]),
                (Method::POST, &exec, vec![]),
                (Method::POST, &no_command, vec![]),
                (Method::GET, "/clusters/t/api/v1", vec![]),
            ],
            "admin",
            &["system:masters"],
        )
        .await;
        assert_eq!(answers[0].0, 400);
        assert_eq!(
            answers[0].1["message"],
            "a container name must be specified for pod two, choose one of: [a b]"
        );
        // The Node has no address: the kubelet cannot be found.
        assert_eq!(answers[1].0, 500, "{}", answers[1].1);
        assert!(
            answers[1].1["message"]
                .as_str()
                .is_some_and(|m| m.contains("no preferred addresses")),
            "{}",
            answers[1].1
        );
        assert_eq!(answers[2].0, 400);
        assert!(
            answers[2].1["message"]
                .as_str()
                .is_some_and(|m| m.contains("a container name must be specified"))
        );
        assert_eq!(
            (answers[3].0, answers[3].1["message"].as_str()),
            (400, Some("you must specify at least 1 command"))
        );
        let names: Vec<&str> = answers[4].1["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["name"].as_str())
            .collect();
        for want in ["pods/log", "pods/exec", "pods/attach", "pods/portforward"] {
            assert!(names.contains(&want), "{want} not discovered");
        }
    }

    /// Security review, finding 8: a tenant's Node pointing at the control plane's own
    /// network (loopback, link-local) is never dialled, and every failure reads the same.
    #[tokio::test]
    async fn node_addresses_outside_the_node_networks_are_not_dialled() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listener");
        let port = listener.local_addr().expect("address").port();
        let node = |name: &str, ip: &str| {
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                "status": {"addresses": [{"type": "InternalIP", "address": ip}],
                    "daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}})
        };
        let pod = |name: &str, node: &str| {
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}})
        };
        let nodes = "/clusters/t/api/v1/nodes";
        let pods = "/clusters/t/api/v1/namespaces/default/pods";
        let answers = ask(
            vec![
                (nodes, node("loop", "127.0.0.1")),
                (nodes, node("metadata", "169.254.169.254")),
                (pods, pod("on-loop", "loop")),
                (pods, pod("on-metadata", "metadata")),
            ],
            vec![
                (Method::GET, &format!("{pods}/on-loop/log"), vec![]),
                (Method::GET, &format!("{pods}/on-metadata/log"), vec![]),
            ],
            "admin",
            &["system:masters"],
        )
        .await;
        for (code, status) in &answers {
            assert_eq!(*code, 500, "{status}");
            assert_eq!(
                status["message"],
                "Internal error occurred: error dialing backend: kubelet unreachable"
            );
        }
        let accepted = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
        assert!(accepted.is_err(), "the loopback 'kubelet' was dialled");
    }

    /// Security review, finding 8: the API server talks only to a kubelet whose serving
    /// certificate the cluster CA signed (a self-signed one, or another CA's, is refused).
    #[tokio::test]
    async fn kubelet_serving_certificates_must_chain_to_the_cluster_ca() {
        let dir = tempfile::tempdir().expect("dir");
        let storage: Arc<dyn flotilla_storage::Storage> = Arc::new(
            flotilla_storage::EmbeddedStorage::open(dir.path().join("s.redb")).expect("store"),
        );
        let server = ApiServer::new(storage, "127.0.0.1:6443").expect("server");
        let state = server.tenants.ensure(&server, "t").await.expect("tenant");
        let client_config = server.kubelet_clients.config(&state).expect("config");
        let ip = "10.199.0.2";
        let handshake = |cert_pem: String, key_pem: String| {
            let client_config = client_config.clone();
            async move {
                let certs: Vec<CertificateDer<'static>> =
                    CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                        .collect::<Result<_, _>>()
                        .expect("certs");
                let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("key");
                let server_config =
                    rustls::ServerConfig::builder_with_provider(crate::serve::crypto_provider())
                        .with_safe_default_protocol_versions()
                        .expect("versions")
                        .with_no_client_auth()
                        .with_single_cert(certs, key)
                        .expect("server config");
                let (near, far) = tokio::io::duplex(64 * 1024);
                let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config));
                let accepting = tokio::spawn(async move { acceptor.accept(far).await.is_ok() });
                let name = ServerName::try_from(ip).expect("name").to_owned();
                let connected = tokio_rustls::TlsConnector::from(client_config)
                    .connect(name, near)
                    .await
                    .is_ok();
                let _ = accepting.await;
                connected
            }
        };
        // Signed by the cluster CA for the node's address: accepted.
        let issued = state
            .record
            .client_ca
            .issue_serving("system:node:n1", &[ip.to_string()])
            .expect("issued");
        assert!(handshake(issued.cert_pem, issued.key_pem).await);
        // Another CA's, or one for another address: refused.
        let other = crate::pki::CertificateAuthority::generate("other").expect("ca");
        let foreign = other
            .issue_serving("system:node:n1", &[ip.to_string()])
            .expect("foreign");
        assert!(!handshake(foreign.cert_pem, foreign.key_pem).await);
        let elsewhere = state
            .record
            .client_ca
            .issue_serving("system:node:n1", &["10.199.0.3".to_string()])
            .expect("elsewhere");
        assert!(!handshake(elsewhere.cert_pem, elsewhere.key_pem).await);
    }

    #[test]
    fn only_node_networks_are_dialled() {
        let default = KubeletNetworks {
            allowed: Vec::new(),
            own: vec!["10.0.0.1".parse().expect("ip")],
        };
        for (ip, permitted) in [
            ("10.1.2.3", true),
            ("192.168.4.5", true),
            ("fd00::5", true),
            ("10.0.0.1", false),
            ("127.0.0.1", false),
            ("::1", false),
            ("::ffff:127.0.0.1", false),
            ("169.254.169.254", false),
            ("fe80::1", false),
            ("0.0.0.0", false),
            ("224.0.0.1", false),
            ("8.8.8.8", false),
        ] {
            let address: std::net::IpAddr = ip.parse().expect("ip");
            assert_eq!(default.permits(address), permitted, "{ip}");
        }
        let fabric = KubeletNetworks {
            allowed: vec!["10.199.3.0/24".parse().expect("cidr")],
            own: vec!["10.199.3.1".parse().expect("ip")],
        };
        assert!(fabric.permits("10.199.3.7".parse().expect("ip")));
        assert!(!fabric.permits("10.199.3.1".parse().expect("ip")));
        assert!(!fabric.permits("10.1.0.1".parse().expect("ip")));
    }

    #[tokio::test]
    async fn a_websocket_exec_needs_create_too() {
        // May get pods/exec but not create it: the WebSocket GET is refused with the create
        // verb's 403, as upstream since AuthorizePodWebsocketUpgradeCreatePermission.
        let exec = "/clusters/t/api/v1/namespaces/default/pods/two/exec?container=a&command=true&stdout=true";
        let rbac = "/clusters/t/apis/rbac.authorization.k8s.io/v1/namespaces/default";
        let (roles, bindings) = (format!("{rbac}/roles"), format!("{rbac}/rolebindings"));
        let answers = ask(
            vec![
                (roles.as_str(), json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                    "metadata": {"name": "exec-get"},
                    "rules": [{"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["get"]}]})),
                (bindings.as_str(), json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                    "metadata": {"name": "exec-get"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "exec-get"},
                    "subjects": [{"kind": "User", "name": "mallory"}]})),
            ],
            vec![
                (
                    Method::GET,
                    exec,
                    vec![("connection", "Upgrade"), ("upgrade", "websocket")],
                ),
                (Method::GET, exec, vec![]),
                (Method::POST, exec, vec![]),
            ],
            "mallory",
            &["system:authenticated"],
        )
        .await;
        assert_eq!(answers[0].0, 403);
        assert_eq!(
            answers[0].1["message"],
            "pods \"two\" is forbidden: User \"mallory\" cannot create resource \"pods/exec\" in API group \"\" in the namespace \"default\""
        );
        // A plain GET is no WebSocket: allowed through, then refused for lacking an upgrade.
        assert_eq!(
            (answers[1].0, answers[1].1["message"].as_str()),
            (400, Some("Upgrade request required"))
        );
        assert_eq!(answers[2].0, 403);
    }

    #[test]
    fn kubelet_errors_become_api_errors() {
        let err = kubelet_error(
            400,
            b"container \"c\" in pod \"p\" is waiting to start: ContainerCreating",
            "pods/log",
            "p",
        );
        assert_eq!((err.code, err.reason), (400, "BadRequest"));
        assert_eq!(
            err.message,
            "container \"c\" in pod \"p\" is waiting to start: ContainerCreating"
        );
        let err = kubelet_error(500, b"boom", "pods/log", "p");
        assert_eq!(
            (err.code, err.message.as_str()),
            (500, "Internal error occurred: boom")
        );
        let err = kubelet_error(
            403,
            b"Forbidden (user=x, verb=get, resource=nodes, subresource=proxy)",
            "pods/log",
            "p",
        );
        assert_eq!((err.code, err.reason), (403, "Forbidden"));
    }
}
