//! Calls the control plane makes on a tenant's behalf, to servers the tenant runs (upstream
//! `k8s.io/apiserver/pkg/util/webhook`): admission and conversion webhooks. A client config's
//! URL or Service is resolved to an address inside the networks the tenant's nodes and pods
//! live in, dialled over TLS verified against the config's CA bundle, on kept-alive
//! connections.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls_pki_types::{CertificateDer, ServerName, pem::PemObject};
use serde_json::{Value, json};

use crate::kubelet::KubeletNetworks;
use crate::meta;
use crate::resources::Resources;
use crate::store::{ListOptions, ReadAt, Store, Tenant};

/// What resolving a client config needs: the tenant's Services and EndpointSlices, and the
/// networks it may dial.
pub struct Dialer<'a> {
    /// The registry.
    pub store: &'a Store,
    /// Whose Services are resolved.
    pub tenant: &'a Tenant,
    /// A table serving `services` and `endpointslices` (the built-in one will do).
    pub resources: &'a Resources,
    /// Where the control plane may dial on the tenant's behalf.
    pub networks: &'a KubeletNetworks,
}

/// Where a webhook is reached: the address dialled, the name its certificate must carry and
/// the path.
pub struct Endpoint {
    /// The address dialled.
    pub address: std::net::SocketAddr,
    /// The name the server's certificate must carry (a Service's `name.namespace.svc`).
    pub server_name: String,
    /// `host[:port]` as the URL names it, for the `Host` header.
    pub authority: String,
    /// The path the config names (`/` when none).
    pub path: String,
    /// How the server's certificate is checked.
    pub trust: Trust,
}

/// How a server's certificate is checked.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Trust {
    /// It must chain to one of these PEM certificates and name the endpoint.
    Bundle(Vec<u8>),
    /// Not at all: an APIService's `insecureSkipTLSVerify` (metrics-server's manifest sets it).
    Nothing,
}

/// A `clientConfig`'s URL, or its Service resolved through the Service's EndpointSlices to a
/// ready endpoint (the control plane dials pods directly, as upstream's aggregator routing
/// does); either way only to an address in the networks tenants' nodes and pods live in.
pub async fn resolve(dialer: &Dialer<'_>, config: &Value) -> Result<Endpoint, String> {
    use base64::Engine as _;
    let ca_bundle = match config["caBundle"].as_str() {
        Some(encoded) if !encoded.is_empty() => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|err| format!("invalid caBundle: {err}"))?,
        _ => return Err("the webhook's clientConfig has no caBundle to verify it by".to_string()),
    };
    let (host, port, path, server_name) = if let Some(url) = config["url"].as_str() {
        let rest = url
            .strip_prefix("https://")
            .ok_or_else(|| format!("webhook URL {url:?} is not https"))?;
        let (authority, path) = match rest.find('/') {
            Some(at) => (&rest[..at], &rest[at..]),
            None => (rest, "/"),
        };
        let (host, port) = split_host_port(authority)?;
        (host.clone(), port, path.to_string(), host)
    } else {
        let service = &config["service"];
        let namespace = service["namespace"].as_str().unwrap_or("");
        let name = service["name"].as_str().unwrap_or("");
        let port = service["port"].as_u64().unwrap_or(443);
        let path = service["path"].as_str().unwrap_or("/").to_string();
        let (ip, target_port) = service_endpoint(dialer, namespace, name, port)
            .await
            .map_err(|unreachable| unreachable.message)?;
        (
            ip.to_string(),
            target_port,
            path,
            format!("{name}.{namespace}.svc"),
        )
    };
    let ip: std::net::IpAddr = match host.parse() {
        Ok(ip) => ip,
        Err(_) => tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|err| format!("dial tcp: lookup {host}: {err}"))?
            .map(|address| address.ip())
            .find(|ip| dialer.networks.permits(*ip))
            .ok_or_else(|| {
                format!("dial tcp: lookup {host}: no address in the cluster networks")
            })?,
    };
    if !dialer.networks.permits(ip) {
        return Err(format!(
            "dial tcp {ip}:{port}: the address is outside the networks webhooks may be reached in"
        ));
    }
    Ok(Endpoint {
        address: std::net::SocketAddr::new(ip, port),
        authority: if port == 443 {
            host.clone()
        } else {
            format!("{host}:{port}")
        },
        server_name,
        path,
        trust: Trust::Bundle(ca_bundle),
    })
}

fn split_host_port(authority: &str) -> Result<(String, u16), String> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("malformed IPv6 address")?;
        let port = after
            .strip_prefix(':')
            .map_or(Ok(443), str::parse)
            .map_err(|_| "bad port")?;
        return Ok((host.to_string(), port));
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => Ok((host.to_string(), port.parse().map_err(|_| "bad port")?)),
        None => Ok((authority.to_string(), 443)),
    }
}

/// Why a Service could not be reached: upstream's APIService condition reasons.
#[derive(Debug)]
pub struct Unreachable {
    /// `ServiceNotFound`, `ServicePortError`, `MissingEndpoints` or `ServiceAccessError`.
    pub reason: &'static str,
    /// What went wrong.
    pub message: String,
}

impl Unreachable {
    fn new(reason: &'static str, message: String) -> Self {
        Unreachable { reason, message }
    }
}

/// Service `namespace/name`'s ready endpoint for its port `port`, inside the networks the
/// control plane may dial: the endpoint to reach it at, its certificate named
/// `name.namespace.svc`.
pub async fn service(
    dialer: &Dialer<'_>,
    namespace: &str,
    name: &str,
    port: u64,
    trust: Trust,
) -> Result<Endpoint, Unreachable> {
    let (address, target_port) = service_endpoint(dialer, namespace, name, port).await?;
    if !dialer.networks.permits(address) {
        return Err(Unreachable::new(
            "ServiceAccessError",
            format!(
                "dial tcp {address}:{target_port}: the address is outside the networks the cluster's services may be reached in"
            ),
        ));
    }
    let server_name = format!("{name}.{namespace}.svc");
    Ok(Endpoint {
        address: std::net::SocketAddr::new(address, target_port),
        authority: server_name.clone(),
        server_name,
        path: "/".to_string(),
        trust,
    })
}

/// A ready endpoint of Service `namespace/name` for its port `port`: (pod IP, target port).
async fn service_endpoint(
    dialer: &Dialer<'_>,
    namespace: &str,
    name: &str,
    port: u64,
) -> Result<(std::net::IpAddr, u16), Unreachable> {
    let served = |group: &str, plural: &str| {
        dialer.resources.find(group, "v1", plural).ok_or_else(|| {
            Unreachable::new("ServiceAccessError", format!("{plural} are not served"))
        })
    };
    let service = dialer
        .store
        .get(
            dialer.tenant,
            served("", "services")?,
            namespace,
            name,
            ReadAt::Latest,
        )
        .await
        .map_err(|_| {
            Unreachable::new(
                "ServiceNotFound",
                format!("service/{name} in {namespace:?} is not present"),
            )
        })?;
    let service_port = service["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["port"].as_u64() == Some(port))
        .cloned()
        .ok_or_else(|| {
            Unreachable::new(
                "ServicePortError",
                format!("service/{name} in {namespace:?} is not listening on port {port}"),
            )
        })?;
    let slices = dialer
        .store
        .list(
            dialer.tenant,
            served("discovery.k8s.io", "endpointslices")?,
            Some(namespace),
            &ListOptions::default(),
        )
        .await
        .map_err(|e| Unreachable::new("ServiceAccessError", e.message))?
        .items;
    let port_name = service_port["name"].as_str().unwrap_or("");
    if let Some(&found) = ready_endpoints(&slices, name, port_name).first() {
        return Ok(found);
    }
    Err(Unreachable::new(
        "MissingEndpoints",
        format!(
            "endpoints for service/{name} in {namespace:?} have no addresses with port name {port_name:?}"
        ),
    ))
}

/// Service `name`'s ready endpoints for its port named `port_name`, from `slices` (its
/// EndpointSlices and others): each endpoint's first address with the slice's port.
pub fn ready_endpoints(
    slices: &[Value],
    name: &str,
    port_name: &str,
) -> Vec<(std::net::IpAddr, u16)> {
    let mut found = Vec::new();
    for slice in owned_slices(slices, name) {
        let Some(port) = slice["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"].as_str().unwrap_or("") == port_name)
            .and_then(|p| p["port"].as_u64())
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        for endpoint in slice["endpoints"].as_array().into_iter().flatten() {
            // Unset readiness is ready, as upstream's consumers read it.
            if endpoint["conditions"]["ready"] == json!(false) {
                continue;
            }
            if let Some(ip) = endpoint["addresses"]
                .get(0)
                .and_then(Value::as_str)
                .and_then(|a| a.parse().ok())
            {
                found.push((ip, port));
            }
        }
    }
    found
}

/// The EndpointSlices of Service `name` among `slices`.
pub fn owned_slices<'a>(slices: &'a [Value], name: &'a str) -> impl Iterator<Item = &'a Value> {
    slices.iter().filter(move |slice| {
        meta::str_at(slice, &["metadata", "labels", "kubernetes.io/service-name"]) == Some(name)
    })
}

/// Kept-alive connections to webhooks, by address, certificate name and CA bundle (upstream
/// keeps its webhook clients' connections alive the same way; a handshake per call would
/// cost more than most webhooks' answers).
type Connection = hyper::client::conn::http1::SendRequest<Full<Bytes>>;
type ConnectionKey = (std::net::SocketAddr, String, Trust);
static IDLE: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<ConnectionKey, Vec<Connection>>>,
> = std::sync::LazyLock::new(Default::default);
/// Idle connections kept per webhook endpoint.
const IDLE_PER_ENDPOINT: usize = 16;

/// POSTs `body` over TLS verified against the webhook's CA bundle, on a kept-alive
/// connection when one is idle; the answer's body when the status is 200.
pub async fn post(endpoint: &Endpoint, url: &str, body: Vec<u8>) -> Result<Bytes, String> {
    let key: ConnectionKey = (
        endpoint.address,
        endpoint.server_name.clone(),
        endpoint.trust.clone(),
    );
    let path = url
        .strip_prefix("https://")
        .and_then(|rest| rest.find('/').map(|at| &rest[at..]))
        .unwrap_or("/");
    let request = || {
        http::Request::post(path)
            .header(http::header::HOST, &endpoint.authority)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(body.clone())))
            .map_err(|err| err.to_string())
    };
    let idle = IDLE
        .lock()
        .ok()
        .and_then(|mut idle| idle.get_mut(&key).and_then(Vec::pop));
    // A kept connection the webhook closed meanwhile is replaced by a new one, once.
    let mut kept = None;
    if let Some(mut sender) = idle
        && sender.ready().await.is_ok()
        && let Ok(response) = sender.send_request(request()?).await
    {
        kept = Some((sender, response));
    }
    let (sender, response) = match kept {
        Some(answered) => answered,
        None => {
            let mut sender = connect(endpoint).await?;
            let response = sender
                .send_request(request()?)
                .await
                .map_err(|err| err.to_string())?;
            (sender, response)
        }
    };
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|err| err.to_string())?
        .to_bytes();
    if let Ok(mut idle) = IDLE.lock() {
        let kept = idle.entry(key).or_default();
        if kept.len() < IDLE_PER_ENDPOINT {
            kept.push(sender);
        }
    }
    if status != http::StatusCode::OK {
        return Err(format!(
            "an error on the server ({:?}) has prevented the request from succeeding",
            String::from_utf8_lossy(&bytes[..bytes.len().min(256)])
        ));
    }
    Ok(bytes)
}

/// A new TLS connection to the webhook, its certificate checked against the CA bundle.
async fn connect(endpoint: &Endpoint) -> Result<Connection, String> {
    let config = tls_config(&endpoint.trust, None)?;
    dial(endpoint, config).await
}

/// The TLS settings of a connection to a tenant's server: its certificate checked as `trust`
/// says, and the control plane's client certificate when it presents one (the front proxy's,
/// to an aggregated API server).
pub fn tls_config(
    trust: &Trust,
    identity: Option<&crate::pki::IssuedCertificate>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    let builder = rustls::ClientConfig::builder_with_provider(crate::serve::crypto_provider())
        .with_safe_default_protocol_versions()
        .map_err(|err| err.to_string())?;
    let verified = match trust {
        Trust::Bundle(bundle) => {
            let mut roots = rustls::RootCertStore::empty();
            for certificate in CertificateDer::pem_slice_iter(bundle) {
                let certificate = certificate.map_err(|err| format!("invalid caBundle: {err}"))?;
                roots
                    .add(certificate)
                    .map_err(|err| format!("invalid caBundle: {err}"))?;
            }
            builder.with_root_certificates(roots)
        }
        Trust::Nothing => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification)),
    };
    let mut config = match identity {
        None => verified.with_no_client_auth(),
        Some(issued) => {
            let chain = CertificateDer::pem_slice_iter(issued.cert_pem.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|err| format!("client certificate: {err}"))?;
            let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes())
                .map_err(|err| format!("client key: {err}"))?;
            verified
                .with_client_auth_cert(chain, key)
                .map_err(|err| format!("client certificate: {err}"))?
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A new HTTP/1.1 connection over TLS to `endpoint`.
async fn dial(
    endpoint: &Endpoint,
    config: Arc<rustls::ClientConfig>,
) -> Result<Connection, String> {
    let server_name = ServerName::try_from(endpoint.server_name.clone())
        .map_err(|err| err.to_string())?
        .to_owned();
    let tcp = tokio::net::TcpStream::connect(endpoint.address)
        .await
        .map_err(|err| format!("dial tcp {}: {err}", endpoint.address))?;
    let _ = tcp.set_nodelay(true);
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(server_name, tcp)
        .await
        .map_err(|err| format!("tls: failed to verify certificate: {err}"))?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|err| err.to_string())?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// Sends `request` on a connection of its own (its answer may stream for as long as a watch
/// lasts) and hands back the answer as it arrives.
pub async fn forward(
    endpoint: &Endpoint,
    config: Arc<rustls::ClientConfig>,
    request: http::Request<Full<Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, String> {
    let mut sender = dial(endpoint, config).await?;
    sender
        .send_request(request)
        .await
        .map_err(|err| err.to_string())
}

/// `insecureSkipTLSVerify`: any certificate is accepted, signatures still checked so the
/// handshake is a real one.
#[derive(Debug)]
struct NoVerification;

impl rustls::client::danger::ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &crate::serve::crypto_provider().signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &crate::serve::crypto_provider().signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        crate::serve::crypto_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_split_into_host_and_port() {
        assert_eq!(
            split_host_port("10.0.0.1:8443"),
            Ok(("10.0.0.1".into(), 8443))
        );
        assert_eq!(
            split_host_port("hooks.example.com"),
            Ok(("hooks.example.com".into(), 443))
        );
        assert_eq!(
            split_host_port("[fd00::1]:9443"),
            Ok(("fd00::1".into(), 9443))
        );
    }
}
