//! An HTTPS server for the suites that need the control plane to call out: admission webhooks
//! (and later conversion webhooks and aggregated APIs). It serves a handler of JSON bodies on
//! its own CA's certificate for one IP address, on a thread of its own.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// What the handler answers: a status code and a body.
pub type Answer = (u16, Vec<u8>);

/// A running server; stops when dropped.
pub struct WebhookServer {
    /// `https://ip:port`.
    pub url: String,
    /// The PEM of the CA its certificate chains to (a webhook's `caBundle`, decoded).
    pub ca_pem: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl WebhookServer {
    /// Serves `handler` (request path and JSON body in, answer out) on `ip`, on a free port.
    pub fn start<F>(ip: &str, handler: F) -> anyhow::Result<Self>
    where
        F: Fn(&str, Value) -> Answer + Send + Sync + 'static,
    {
        Self::start_named(ip, &[], handler)
    }

    /// [`WebhookServer::start`] with a certificate also valid for `names` (a Service's
    /// `name.namespace.svc`).
    pub fn start_named<F>(ip: &str, names: &[&str], handler: F) -> anyhow::Result<Self>
    where
        F: Fn(&str, Value) -> Answer + Send + Sync + 'static,
    {
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "webhook test CA");
        let ca = ca_params.self_signed(&ca_key)?;
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate()?;
        let mut subjects = vec![ip.to_string()];
        subjects.extend(names.iter().map(|n| n.to_string()));
        let params = rcgen::CertificateParams::new(subjects)?;
        let cert = params.signed_by(&key, &issuer)?;
        let chain = vec![cert.der().clone()];
        let private = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der())
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, private)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind((ip, 0))
            .with_context(|| format!("binding the webhook server to {ip}"))?;
        listener.set_nonblocking(true)?;
        let address: SocketAddr = listener.local_addr()?;
        let handler = Arc::new(handler);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                let serve = async {
                    loop {
                        let Ok((tcp, _)) = listener.accept().await else {
                            continue;
                        };
                        let _ = tcp.set_nodelay(true);
                        let acceptor = acceptor.clone();
                        let handler = handler.clone();
                        tokio::spawn(async move {
                            let Ok(tls) = acceptor.accept(tcp).await else {
                                return;
                            };
                            let service = service_fn(
                                move |request: hyper::Request<hyper::body::Incoming>| {
                                    let handler = handler.clone();
                                    async move {
                                        let path = request.uri().path().to_string();
                                        let body = request.into_body().collect().await?.to_bytes();
                                        let value: Value =
                                            serde_json::from_slice(&body).unwrap_or(Value::Null);
                                        // The handler may block (a slow webhook sleeps).
                                        let (code, answer) =
                                            tokio::task::spawn_blocking(move || {
                                                handler(&path, value)
                                            })
                                            .await
                                            .unwrap_or((500, b"handler panicked".to_vec()));
                                        let mut response =
                                            hyper::Response::new(Full::new(Bytes::from(answer)));
                                        *response.status_mut() = hyper::StatusCode::from_u16(code)
                                            .unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
                                        response.headers_mut().insert(
                                            hyper::header::CONTENT_TYPE,
                                            hyper::header::HeaderValue::from_static(
                                                "application/json",
                                            ),
                                        );
                                        Ok::<_, hyper::Error>(response)
                                    }
                                },
                            );
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(tls), service)
                                .await;
                        });
                    }
                };
                tokio::select! {
                    _ = serve => {}
                    _ = stopped => {}
                }
            });
        });
        Ok(WebhookServer {
            url: format!("https://{address}"),
            ca_pem: ca.pem(),
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0)
    }

    /// The CA bundle as a webhook configuration carries it (base64 of the PEM).
    pub fn ca_bundle(&self) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(&self.ca_pem)
    }
}

impl Drop for WebhookServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
