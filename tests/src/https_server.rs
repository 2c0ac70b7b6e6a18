//! What the suites' HTTPS test servers (webhooks, aggregated APIs) share: a fresh CA's serving
//! certificate, and the thread and runtime a server accepts TLS connections on until it is
//! dropped.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A serving certificate, its key and the PEM of the CA that signed it.
pub(crate) struct ServingCertificate {
    pub(crate) chain: Vec<CertificateDer<'static>>,
    pub(crate) key: PrivateKeyDer<'static>,
    pub(crate) ca_pem: String,
}

impl ServingCertificate {
    /// A fresh CA named `ca_name` and a certificate from it valid for `ip` and `names`.
    pub(crate) fn generate(ip: &str, names: &[&str], ca_name: &str) -> anyhow::Result<Self> {
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, ca_name);
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key)?;
        let key = rcgen::KeyPair::generate()?;
        let mut subjects = vec![ip.to_string()];
        subjects.extend(names.iter().map(|name| name.to_string()));
        let cert = rcgen::CertificateParams::new(subjects)?.signed_by(&key, &ca)?;
        let key = PrivateKeyDer::try_from(key.serialize_der())
            .map_err(|e| anyhow::anyhow!("serving key: {e}"))?;
        Ok(ServingCertificate {
            chain: vec![cert.der().clone()],
            key,
            ca_pem: ca.pem(),
        })
    }

    /// A rustls server configuration of this certificate asking no client certificate.
    pub(crate) fn server_config(self) -> anyhow::Result<rustls::ServerConfig> {
        Ok(rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(self.chain, self.key)?)
    }
}

/// The crypto provider the test servers use.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server running on a thread of its own; stops when dropped.
pub struct ServerThread {
    /// `https://ip:port`.
    pub url: String,
    /// The PEM of the CA its serving certificate chains to (a webhook's or an APIService's
    /// `caBundle`, decoded).
    pub ca_pem: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServerThread {
    /// Binds `ip` on a free port and runs `serve` (the accept loop over the listener) on a
    /// two-thread runtime until the server is dropped. `what` names it in a bind error.
    pub(crate) fn start<F, S>(
        ip: &str,
        what: &str,
        ca_pem: String,
        serve: S,
    ) -> anyhow::Result<Self>
    where
        S: FnOnce(tokio::net::TcpListener) -> F + Send + 'static,
        F: Future<Output = ()>,
    {
        let listener = std::net::TcpListener::bind((ip, 0))
            .with_context(|| format!("binding the {what} to {ip}"))?;
        listener.set_nonblocking(true)?;
        let address: SocketAddr = listener.local_addr()?;
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
                tokio::select! {
                    _ = serve(listener) => {}
                    _ = stopped => {}
                }
            });
        });
        Ok(ServerThread {
            url: format!("https://{address}"),
            ca_pem,
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

    /// The CA bundle as a webhook configuration or an APIService carries it (base64 of the
    /// PEM).
    pub fn ca_bundle(&self) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(&self.ca_pem)
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
