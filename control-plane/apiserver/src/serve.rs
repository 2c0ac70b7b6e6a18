//! The HTTPS listener: rustls with optional client certificates, HTTP/1.1 and HTTP/2, the
//! peer's certificate chain and address handed to the router, what a connection may cost
//! before it sends a request (handshake and header timeouts, a cap per client address), and
//! graceful, bounded shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
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

/// What a connection may cost before it has authenticated anything, as upstream's
/// `http.Server` bounds it: no connection holds a socket forever by saying nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// The TLS handshake must finish within this (Go's `tls` default, 10 s).
    pub handshake_timeout: Duration,
    /// An HTTP/1 request's headers must arrive within this after the connection is ready
    /// for a request; an idle keep-alive connection is closed after it too (upstream's
    /// `ReadHeaderTimeout`, 32 s).
    pub header_read_timeout: Duration,
    /// An HTTP/2 connection is pinged this often, and closed when a ping goes unanswered
    /// for as long.
    pub keep_alive_interval: Duration,
    /// Connections one client address may hold that have not yet sent a whole request
    /// head; more are closed at once.
    pub max_unauthenticated_per_address: usize,
    /// Concurrent streams one HTTP/2 connection may open (upstream's
    /// `--http2-max-streams-per-connection` default).
    pub max_streams_per_connection: u32,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(32),
            keep_alive_interval: Duration::from_secs(30),
            max_unauthenticated_per_address: 512,
            max_streams_per_connection: 1000,
        }
    }
}

/// Connections per client address that have not yet sent a request head.
#[derive(Debug, Default)]
struct Unauthenticated {
    counts: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

/// One connection's place in [`Unauthenticated`], given up on its first request or its end.
struct PendingConnection {
    registry: Arc<Unauthenticated>,
    address: std::net::IpAddr,
    released: std::sync::atomic::AtomicBool,
}

impl Unauthenticated {
    fn admit(
        self: &Arc<Self>,
        address: std::net::IpAddr,
        limit: usize,
    ) -> Option<Arc<PendingConnection>> {
        let mut counts = self.counts.lock().ok()?;
        let count = counts.entry(address).or_default();
        if *count >= limit {
            return None;
        }
        *count += 1;
        Some(Arc::new(PendingConnection {
            registry: self.clone(),
            address,
            released: false.into(),
        }))
    }
}

impl PendingConnection {
    fn release(&self) {
        if self
            .released
            .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            return;
        }
        if let Ok(mut counts) = self.registry.counts.lock()
            && let Some(count) = counts.get_mut(&self.address)
        {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.address);
            }
        }
    }
}

impl Drop for PendingConnection {
    fn drop(&mut self) {
        self.release();
    }
}

/// The address a request's connection came from (absent for in-process requests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddress(pub std::net::SocketAddr);

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

/// Serves `app` over TLS on `listener` until `shutdown` resolves, then drains for a bounded
/// time, with the default [`ConnectionLimits`].
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    shutdown: impl Future<Output = ()>,
) {
    serve_tls_with(listener, tls, app, shutdown, ConnectionLimits::default()).await
}

/// [`serve_tls`] with the given connection limits.
pub async fn serve_tls_with(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    shutdown: impl Future<Output = ()>,
    limits: ConnectionLimits,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let unauthenticated = Arc::new(Unauthenticated::default());
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
        let Some(pending) =
            unauthenticated.admit(peer.ip(), limits.max_unauthenticated_per_address)
        else {
            tracing::debug!(%peer, "too many unauthenticated connections from this address");
            continue;
        };
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let app = app.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream))
                .await
            {
                Ok(Ok(tls)) => tls,
                Ok(Err(err)) => {
                    tracing::debug!(%peer, %err, "tls handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "tls handshake timed out");
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
            let first_request = pending.clone();
            let service = hyper::service::service_fn(
                move |request: hyper::Request<hyper::body::Incoming>| {
                    // A whole request head arrived: the connection is past the pre-request
                    // cap (its credential is judged per request, by the router).
                    first_request.release();
                    let mut request = request.map(axum::body::Body::new);
                    request.extensions_mut().insert(peer_certs.clone());
                    request.extensions_mut().insert(ClientAddress(peer));
                    app.clone().oneshot(request)
                },
            );
            let mut builder = Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout);
            builder
                .http2()
                .timer(TokioTimer::new())
                .keep_alive_interval(limits.keep_alive_interval)
                .keep_alive_timeout(limits.keep_alive_interval)
                .max_concurrent_streams(limits.max_streams_per_connection);
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(tls), service);
            if let Err(err) = watcher.watch(connection.into_owned()).await {
                tracing::debug!(%peer, %err, "connection ended with an error");
            }
            drop(pending);
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
