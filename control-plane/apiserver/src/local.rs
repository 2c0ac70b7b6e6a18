//! A server on a loopback port with a throwaway serving CA and one tenant — what the
//! integration tests, the benchmark and other in-process embedders start.

use std::net::SocketAddr;
use std::sync::Arc;

use flotilla_storage::Storage;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::ApiServer;
use crate::error::ApiError;
use crate::pki::{CertificateAuthority, PkiError, kubeconfig};
use crate::serve::{ConnectionLimits, ServeError, serve_tls_with, server_config};

/// Failures starting a [`LocalServer`].
#[derive(Debug, thiserror::Error)]
pub enum LocalServerError {
    /// The loopback listener could not be bound.
    #[error("binding a loopback port: {0}")]
    Bind(#[from] std::io::Error),
    /// Certificates could not be made.
    #[error(transparent)]
    Pki(#[from] PkiError),
    /// TLS could not be configured.
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// The throwaway key-encryption key could not be made.
    #[error(transparent)]
    Envelope(#[from] crate::storage::envelope::EnvelopeError),
    /// The tenant could not be created.
    #[error("creating the tenant: {}", .0.message)]
    Tenant(ApiError),
}

/// A running server on `127.0.0.1`, serving one tenant, with its admin kubeconfig.
pub struct LocalServer {
    /// The server.
    pub server: Arc<ApiServer>,
    /// Where it listens.
    pub address: SocketAddr,
    /// An admin (`system:masters`) kubeconfig for the tenant, trusting the serving CA.
    pub kubeconfig: String,
    /// The serving task; it ends after [`LocalServer::stop`].
    pub serving: JoinHandle<()>,
    shutdown: oneshot::Sender<()>,
}

impl LocalServer {
    /// Starts serving `storage` on a free loopback port with tenant `cluster` created.
    pub async fn start(storage: Arc<dyn Storage>, cluster: &str) -> Result<Self, LocalServerError> {
        Self::start_with_limits(storage, cluster, ConnectionLimits::default()).await
    }

    /// [`LocalServer::start`] with the given connection limits (tests of the limits).
    pub async fn start_with_limits(
        storage: Arc<dyn Storage>,
        cluster: &str,
        limits: ConnectionLimits,
    ) -> Result<Self, LocalServerError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let server = ApiServer::new(storage, &address.to_string())?;
        let ca = CertificateAuthority::generate("flotilla-local-serving-ca")?;
        let serving = ca.issue_serving("flotilla", &[address.ip().to_string()])?;
        let tls = server_config(
            &format!("{}{}", serving.cert_pem, ca.cert_pem),
            &serving.key_pem,
        )?;
        let tenant = server
            .tenants
            .ensure(&server, cluster)
            .await
            .map_err(LocalServerError::Tenant)?;
        let admin = tenant.issue_admin().map_err(LocalServerError::Tenant)?;
        let url = format!("https://{address}/clusters/{cluster}");
        let kubeconfig = kubeconfig(cluster, &url, &ca.cert_pem, "kubernetes-admin", &admin);
        let (shutdown, stop) = oneshot::channel::<()>();
        let serving = tokio::spawn(serve_tls_with(
            listener,
            tls,
            server.router(),
            async move {
                let _ = stop.await;
            },
            limits,
        ));
        Ok(LocalServer {
            server,
            address,
            kubeconfig,
            serving,
            shutdown,
        })
    }

    /// Asks the server to stop (in-flight requests get the listener's grace period).
    pub fn stop(self) -> JoinHandle<()> {
        let _ = self.shutdown.send(());
        self.serving
    }
}
