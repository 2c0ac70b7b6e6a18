//! The management API's HTTPS client: where the service is, who is calling, and one request
//! function that turns every failure into a one-line error. Shared by the `flotilla` CLI and
//! the Terraform provider.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use serde::{Deserialize, Serialize};

use flotilla_api_machinery::errors::error_chain;

/// The client configuration file (`flotilla up` writes one as `DIR/flotilla.json`).
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientConfig {
    /// `https://host:port` of the service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The bearer API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// The CA that signed the service's certificate (PEM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_pem: Option<String>,
}

/// A connected management API client.
pub struct ManagementClient {
    endpoint: String,
    api_key: String,
    http: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl ManagementClient {
    /// A client of the service at `endpoint` (trusting only `ca_pem`) calling with `api_key`.
    pub fn new(endpoint: &str, api_key: &str, ca_pem: Option<&str>) -> anyhow::Result<Self> {
        Ok(ManagementClient {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            api_key: api_key.to_string(),
            http: https_client(ca_pem)?,
        })
    }

    /// Resolves what was given explicitly (flags, environment, provider settings), then the
    /// configuration file at `config` for what was not: the endpoint, the API key and the CA
    /// (PEM text, or a file `ca_file` names).
    pub fn resolve(
        config: Option<&Path>,
        endpoint: Option<&str>,
        api_key: Option<&str>,
        ca_file: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let file = match config {
            Some(path) => read_config(path)?,
            None => ClientConfig::default(),
        };
        let endpoint = endpoint
            .map(str::to_string)
            .or(file.endpoint)
            .context("no endpoint: pass --endpoint, set FLOTILLA_ENDPOINT or --config")?;
        let api_key = api_key
            .map(str::to_string)
            .or(file.api_key)
            .context("no API key: pass --api-key, set FLOTILLA_API_KEY or --config")?;
        let ca_pem = match ca_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading the CA file {}", path.display()))?,
            ),
            None => file.ca_pem,
        };
        Self::new(&endpoint, &api_key, ca_pem.as_deref())
    }

    /// A client configured by the file at `path` alone (as `flotilla up` and `serve` write).
    pub fn from_config_file(path: &Path) -> anyhow::Result<Self> {
        Self::resolve(Some(path), None, None, None)
    }

    /// Sends one request; a 2xx answer's body is returned, anything else is an error carrying
    /// the service's code and message.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> anyhow::Result<Bytes> {
        let body = match body {
            Some(value) => Bytes::from(serde_json::to_vec(value)?),
            None => Bytes::new(),
        };
        self.call_bytes(method, path, "application/json", body)
            .await
    }

    /// [`ManagementClient::call`] with a body of `content_type` (a backup file is not JSON);
    /// a 2xx answer's body is returned as it came.
    pub async fn call_bytes(
        &self,
        method: Method,
        path: &str,
        content_type: &str,
        body: Bytes,
    ) -> anyhow::Result<Bytes> {
        let url = format!("{}{path}", self.endpoint);
        let request = Request::builder()
            .method(method.clone())
            .uri(&url)
            .header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", self.api_key),
            )
            .header(http::header::CONTENT_TYPE, content_type)
            .header(http::header::ACCEPT, "application/json")
            .body(Full::new(body))
            .with_context(|| format!("invalid endpoint URL {url:?}"))?;
        let response = self
            .http
            .request(request)
            .await
            .map_err(|err| anyhow!("cannot reach {}: {}", self.endpoint, error_chain(&err)))?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|err| anyhow!("reading the answer of {method} {path}: {err}"))?
            .to_bytes();
        if status.is_success() {
            return Ok(bytes);
        }
        Err(service_error(status, &bytes))
    }

    /// [`ManagementClient::call`], decoding the JSON answer.
    pub async fn call_json(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> anyhow::Result<serde_json::Value> {
        let bytes = self.call(method, path, body).await?;
        serde_json::from_slice(&bytes).context("the service answered with invalid JSON")
    }
}

/// Reads a client configuration file.
pub fn read_config(path: &Path) -> anyhow::Result<ClientConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the client configuration {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("the client configuration {} is invalid", path.display()))
}

/// An HTTPS client trusting only `ca_pem`: the service's CA is its own, so it is required.
fn https_client(
    ca_pem: Option<&str>,
) -> anyhow::Result<Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>> {
    let Some(ca_pem) = ca_pem else {
        bail!("no CA: pass --ca-file, set FLOTILLA_CA_FILE or --config");
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        let cert = cert.context("the CA is not valid PEM")?;
        roots
            .add(cert)
            .context("the CA certificate is not usable")?;
    }
    if roots.is_empty() {
        bail!("the CA file holds no certificate");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS setup")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .build();
    Ok(Client::builder(TokioExecutor::new()).build(connector))
}

/// A non-2xx answer of the service, printed as one line.
#[derive(Debug, thiserror::Error)]
#[error("{code} ({}): {message}", status.as_u16())]
pub struct ServiceError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The service's error code (e.g. `ResourceNotFoundException`).
    pub code: String,
    /// What went wrong.
    pub message: String,
}

/// The service's `{code, message}` error; anything else by its status.
fn service_error(status: StatusCode, body: &[u8]) -> anyhow::Error {
    #[derive(Deserialize)]
    struct Wire {
        code: String,
        message: String,
    }
    match serde_json::from_slice::<Wire>(body) {
        Ok(wire) => ServiceError {
            status,
            code: wire.code,
            message: wire.message,
        }
        .into(),
        Err(_) => anyhow!(
            "the service answered {status}: {}",
            String::from_utf8_lossy(body).trim()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_error_becomes_one_line_with_code_and_status() {
        let err = service_error(
            StatusCode::NOT_FOUND,
            br#"{"code":"ResourceNotFoundException","message":"no cluster named \"x\""}"#,
        );
        assert_eq!(
            err.to_string(),
            r#"ResourceNotFoundException (404): no cluster named "x""#
        );
        let err = service_error(StatusCode::BAD_GATEWAY, b"upstream down\n");
        assert_eq!(
            err.to_string(),
            "the service answered 502 Bad Gateway: upstream down"
        );
    }
}
