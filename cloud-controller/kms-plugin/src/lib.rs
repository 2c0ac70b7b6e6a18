//! A Kubernetes KMS v2 plugin backed by AWS KMS (Flotilla's `aws-encryption-provider`): the
//! command line ([`Cli`]), the service over a KMS backend (`service`, `backend`), the AWS
//! backend (`aws`), the unix socket (`socket`), and [`run`], which serves until a signal.

pub mod aws;
pub mod backend;
pub mod service;
pub mod socket;

use std::future::Future;
use std::time::Duration;

use clap::Parser;

use crate::aws::{AwsError, AwsKms, AwsSettings};
use crate::backend::KmsBackend;
use crate::service::{KeyManagementService, ServiceConfig};
use crate::socket::{SocketError, SocketPath};

/// How long in-flight requests may finish after a signal before the plugin stops anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// What `--help` ends with.
const AFTER_HELP: &str = "\
Example:
  flotilla-kms-plugin --listen unix:///run/flotilla/kms.sock \\
    --key-id alias/flotilla-secrets --region eu-west-1

The API server's EncryptionConfiguration names the same socket:
  kms: {apiVersion: v2, name: aws, endpoint: unix:///run/flotilla/kms.sock, timeout: 3s}

Credentials come from the standard AWS chain (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY,
AWS_PROFILE, web identity, ECS, instance metadata); the region and endpoint also from
AWS_REGION and AWS_ENDPOINT_URL_KMS / AWS_ENDPOINT_URL.
Exit codes: 0 stopped by SIGTERM or SIGINT, 1 error (one line on standard error), 2 bad usage.
Logs go to standard error; RUST_LOG filters them (e.g. RUST_LOG=debug).";

/// Serves the Kubernetes KMS v2 API on a unix socket, encrypting with an AWS KMS key.
#[derive(Debug, Parser)]
#[command(name = "flotilla-kms-plugin", version, about, after_help = AFTER_HELP)]
pub struct Cli {
    /// The socket to serve on: unix:///absolute/path (or /absolute/path). A stale socket
    /// file there is replaced; the socket is created with mode 0600.
    #[arg(long, value_name = "unix:///PATH")]
    pub listen: SocketPath,
    /// The KMS key to encrypt with: a key id, key ARN, alias/NAME or alias ARN.
    #[arg(long, value_name = "KEY", value_parser = parse_key_id)]
    pub key_id: String,
    /// KMS's endpoint instead of the region's (e.g. LocalStack's http://127.0.0.1:4566);
    /// default: AWS_ENDPOINT_URL_KMS or AWS_ENDPOINT_URL, else AWS's.
    #[arg(long, value_name = "URL")]
    pub endpoint_url: Option<String>,
    /// The AWS region; default: AWS_REGION, AWS_DEFAULT_REGION or the profile's.
    #[arg(long)]
    pub region: Option<String>,
    /// How the process logs.
    #[command(flatten)]
    pub log: flotilla_logging::LogArgs,
}

/// Upstream's key id limits, checked when the flags are parsed.
fn parse_key_id(key_id: &str) -> Result<String, String> {
    flotilla_api_machinery::kms::validate_key_id(key_id)?;
    Ok(key_id.to_string())
}

/// Everything [`run`] needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Where to serve.
    pub socket: SocketPath,
    /// The key and the Status cache.
    pub service: ServiceConfig,
    /// Where AWS KMS is.
    pub aws: AwsSettings,
}

impl From<Cli> for Config {
    fn from(cli: Cli) -> Self {
        Config {
            socket: cli.listen,
            service: ServiceConfig::new(cli.key_id),
            aws: AwsSettings {
                region: cli.region,
                endpoint_url: cli.endpoint_url,
            },
        }
    }
}

/// Why the plugin stopped other than by a signal.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The KMS client could not be built.
    #[error(transparent)]
    Aws(#[from] AwsError),
    /// The socket could not be bound.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// The signal handlers could not be installed.
    #[error("installing the signal handlers")]
    Signals(#[source] std::io::Error),
    /// The gRPC server failed.
    #[error("serving gRPC")]
    Serve(#[source] tonic::transport::Error),
}

/// Runs the plugin: builds the KMS client, binds the socket and serves until SIGTERM or
/// SIGINT, then removes the socket.
pub async fn run(config: Config) -> Result<(), Error> {
    let shutdown = shutdown_signal().map_err(Error::Signals)?;
    let backend = AwsKms::connect(&config.aws).await?;
    let service = KeyManagementService::new(backend, config.service);
    serve(&config.socket, service, shutdown).await
}

/// Serves `service` on `socket` until `shutdown` completes, then lets in-flight requests
/// finish for a few seconds and removes the socket. Logs the key's health once at start.
pub async fn serve<B: KmsBackend>(
    socket: &SocketPath,
    service: KeyManagementService<B>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let (listener, _socket_file) = socket::bind(socket)?;
    tracing::info!(socket = %socket, "serving the KMS v2 API");
    let probe = service.clone();
    tokio::spawn(async move {
        let status = probe.status().await;
        if status.healthz == flotilla_api_machinery::kms::HEALTHY {
            tracing::info!(key_id = %status.key_id, "the KMS key is usable");
        } else {
            tracing::warn!(key_id = %status.key_id, "the KMS key is not usable yet: {}", status.healthz);
        }
    });

    let (signalled, on_signal) = tokio::sync::oneshot::channel();
    let serving = tonic::transport::Server::builder().serve_with_incoming_shutdown(
        service,
        tokio_stream::wrappers::UnixListenerStream::new(listener),
        async move {
            shutdown.await;
            tracing::info!("shutting down");
            let _ = signalled.send(());
        },
    );
    tokio::pin!(serving);
    tokio::select! {
        served = &mut serving => served.map_err(Error::Serve)?,
        Ok(()) = on_signal => {
            match tokio::time::timeout(SHUTDOWN_GRACE, &mut serving).await {
                Ok(served) => served.map_err(Error::Serve)?,
                Err(_) => tracing::warn!(
                    "requests still running {}s after the signal: stopping anyway",
                    SHUTDOWN_GRACE.as_secs()
                ),
            }
        }
    }
    Ok(())
}

/// Completes on the first SIGTERM or SIGINT; the handlers are installed at once, so a signal
/// that arrives while the plugin starts is not lost.
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
}

#[cfg(test)]
mod tests;
