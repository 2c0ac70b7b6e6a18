//! An HTTPS server for the suites that need the control plane to call out to a webhook
//! (admission and conversion webhooks): a handler of JSON bodies served on its own CA's
//! certificate for one IP address, on a thread of its own.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;

use crate::https_server::{ServerThread, ServingCertificate};

/// What the handler answers: a status code and a body.
pub type Answer = (u16, Vec<u8>);

/// A running server; stops when dropped. Its `url`, `ca_pem`, `port()` and `ca_bundle()`
/// are its [`ServerThread`]'s.
pub struct WebhookServer {
    server: ServerThread,
}

impl std::ops::Deref for WebhookServer {
    type Target = ServerThread;

    fn deref(&self) -> &ServerThread {
        &self.server
    }
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
        let serving = ServingCertificate::generate(ip, names, "webhook test CA")?;
        let ca_pem = serving.ca_pem.clone();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(serving.server_config()?));
        let handler = Arc::new(handler);
        let server =
            ServerThread::start(ip, "webhook server", ca_pem, move |listener| async move {
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
                        let service =
                            service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                                let handler = handler.clone();
                                async move {
                                    let path = request.uri().path().to_string();
                                    let body = request.into_body().collect().await?.to_bytes();
                                    let value: Value =
                                        serde_json::from_slice(&body).unwrap_or(Value::Null);
                                    // The handler may block (a slow webhook sleeps).
                                    let (code, answer) =
                                        tokio::task::spawn_blocking(move || handler(&path, value))
                                            .await
                                            .unwrap_or((500, b"handler panicked".to_vec()));
                                    let mut response =
                                        hyper::Response::new(Full::new(Bytes::from(answer)));
                                    *response.status_mut() = hyper::StatusCode::from_u16(code)
                                        .unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
                                    response.headers_mut().insert(
                                        hyper::header::CONTENT_TYPE,
                                        hyper::header::HeaderValue::from_static("application/json"),
                                    );
                                    Ok::<_, hyper::Error>(response)
                                }
                            });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(tls), service)
                            .await;
                    });
                }
            })?;
        Ok(WebhookServer { server })
    }
}
