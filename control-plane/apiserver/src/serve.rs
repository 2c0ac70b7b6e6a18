//! The HTTPS listener: rustls with optional client certificates, HTTP/1.1 and HTTP/2, the
//! peer's certificate chain handed to the router, and graceful, bounded shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use rustls::DistinguishedName;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use tokio::net::TcpListener;
use tower::ServiceExt;

use crate::pki::CertificateIdentity;

/// The rustls server configuration type, re-exported for binaries that build one.
pub use rustls::ServerConfig;

/// How long in-flight requests get to finish after shutdown is asked for.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The client certificate chain a connection presented (leaf first), if any. Verifying it
/// against a tenant's CA happens per request, because which CA applies depends on the path;
/// the verdict per tenant is remembered for the connection's life, since the chain cannot
/// change within it (a signature check per request cost a quarter of the server's CPU).
#[derive(Debug, Clone, Default)]
pub struct PeerCertificates {
    /// The chain, leaf first.
    pub chain: Arc<Vec<CertificateDer<'static>>>,
    verdicts: Arc<std::sync::Mutex<Vec<Verdict>>>,
}

/// One tenant's authentication verdict on a connection's chain.
type Verdict = (String, Option<CertificateIdentity>);

impl PeerCertificates {
    /// A connection's chain with no verdicts yet.
    pub fn new(chain: Vec<CertificateDer<'static>>) -> Self {
        PeerCertificates {
            chain: Arc::new(chain),
            verdicts: Arc::default(),
        }
    }

    /// The verdict for `tenant`, computing it with `verify` the first time.
    pub fn verdict(
        &self,
        tenant: &str,
        verify: impl FnOnce(&[CertificateDer<'static>]) -> Option<CertificateIdentity>,
    ) -> Option<CertificateIdentity> {
        if let Ok(verdicts) = self.verdicts.lock()
            && let Some((_, verdict)) = verdicts.iter().find(|(t, _)| t == tenant)
        {
            return verdict.clone();
        }
        let verdict = verify(&self.chain);
        if let Ok(mut verdicts) = self.verdicts.lock() {
            verdicts.push((tenant.to_string(), verdict.clone()));
        }
        verdict
    }
}

/// Failures setting up the listener.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The certificate or key PEM could not be read.
    #[error("invalid serving certificate or key: {0}")]
    Pem(String),
    /// rustls rejected the configuration.
    #[error("tls configuration: {0}")]
    Tls(#[from] rustls::Error),
}

/// Requests a client certificate but lets the handshake finish without one, and checks only
/// that the client holds the certificate's key. Chain validation is per tenant, later.
#[derive(Debug)]
struct DeferredClientVerifier {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for DeferredClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
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
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// The crypto provider every TLS endpoint of the process uses.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A rustls server configuration for the serving certificate chain and key (PEM).
pub fn server_config(
    cert_chain_pem: &str,
    key_pem: &str,
) -> Result<Arc<rustls::ServerConfig>, ServeError> {
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert_chain_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| ServeError::Pem(e.to_string()))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| ServeError::Pem(e.to_string()))?;
    let provider = crypto_provider();
    let verifier = Arc::new(DeferredClientVerifier {
        algorithms: provider.signature_verification_algorithms,
    });
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Serves `app` over TLS on `listener` until `shutdown` resolves, then drains for a bounded time.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(err) => {
                    tracing::warn!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let app = app.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls = match acceptor.accept(stream).await {
                Ok(tls) => tls,
                Err(err) => {
                    tracing::debug!(%peer, %err, "tls handshake failed");
                    return;
                }
            };
            let peer_certs = PeerCertificates::new(
                tls.get_ref()
                    .1
                    .peer_certificates()
                    .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
                    .unwrap_or_default(),
            );
            let service = hyper::service::service_fn(
                move |request: hyper::Request<hyper::body::Incoming>| {
                    let mut request = request.map(axum::body::Body::new);
                    request.extensions_mut().insert(peer_certs.clone());
                    app.clone().oneshot(request)
                },
            );
            let builder = Builder::new(TokioExecutor::new());
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
            if let Err(err) = watcher.watch(connection.into_owned()).await {
                tracing::debug!(%peer, %err, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the shutdown grace period; closing them");
    }
}
